//! Logs and traces: the `RELAYQ_LOG` filter over stderr, and, in a build with the
//! `otel` feature and `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) set, every
//! span (`relayq.enqueue`, `relayq.claim`, `relayq.settle`, `relayq.job`; see
//! `relayq_core::traced`) exported over OTLP/HTTP, as the OpenTelemetry SDK reads its
//! usual variables (`OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_HEADERS`, ...).

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, Layer as _, layer::SubscriberExt, util::SubscriberInitExt};

/// Installs the subscriber; keep the guard until the command ends: dropping it sends
/// the spans still buffered.
pub fn init(default_filter: &str) -> Guard {
    let filter =
        EnvFilter::try_from_env("RELAYQ_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let registry = tracing_subscriber::registry().with(fmt);
    #[cfg(feature = "otel")]
    {
        let (layer, guard) = otel::layer();
        registry.with(layer).init();
        guard
    }
    #[cfg(not(feature = "otel"))]
    {
        registry.init();
        Guard
    }
}

#[cfg(not(feature = "otel"))]
/// Nothing to flush in a build without `otel`.
pub struct Guard;

#[cfg(feature = "otel")]
pub use otel::Guard;

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::{Layer, filter::Targets};

    /// Flushes and stops the exporter when dropped.
    pub struct Guard(Option<SdkTracerProvider>);

    impl Drop for Guard {
        fn drop(&mut self) {
            if let Some(provider) = self.0.take()
                && let Err(e) = provider.shutdown()
            {
                eprintln!("relayq: traces not all sent: {e}");
            }
        }
    }

    /// The spans of relayq's crates, at info and above, to the OTLP endpoint, when one
    /// is configured; else no layer.
    pub fn layer<S>() -> (Option<Box<dyn Layer<S> + Send + Sync>>, Guard)
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let configured = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|e| !e.trim().is_empty()));
        if !configured {
            return (None, Guard(None));
        }
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(e) => e,
            Err(e) => {
                eprintln!("relayq: OpenTelemetry export is off: {e}");
                return (None, Guard(None));
            }
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(
                        std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "relayq".into()),
                    )
                    .build(),
            )
            .build();
        let tracer = provider.tracer("relayq");
        // A target matches by prefix: `relayq` takes in relayq_core, relayq_cli and the rest.
        let targets = Targets::new().with_target("relayq", tracing::Level::INFO);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(targets)
            .boxed();
        (Some(layer), Guard(Some(provider)))
    }
}
