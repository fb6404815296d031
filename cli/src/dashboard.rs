//! `relayq dashboard`: the web dashboard of `relayq-dashboard`, served on the `--db`
//! backend, with Prometheus text at `/metrics`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use relayq_dashboard::Options;

use crate::{
    backend::{self, Use},
    exit::{self, usage},
};

/// Arguments of `relayq dashboard`.
#[derive(Debug, clap::Args)]
pub struct DashboardArgs {
    /// Where to listen, HOST:PORT. Any address but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// No actions: pause, resume, max_running, cancel and retry are gone from the
    /// pages and the API.
    #[arg(long)]
    pub read_only: bool,
    /// Require this token on every request (`Authorization: Bearer T`, or open the
    /// dashboard once with ?token=T). Prefer the environment variable: a command line
    /// is visible to every user of the machine.
    #[arg(long, env = "RELAYQ_DASHBOARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A queue the queue list shows (repeat for more; default: `default`). Others can be
    /// opened by name in the page.
    #[arg(short = 'q', long = "queue")]
    pub queues: Vec<String>,
}

/// Serves the dashboard until Ctrl-C or SIGTERM.
///
/// # Errors
/// A bad or non-loopback `--listen` without `--token`, a bad queue name, no database,
/// an address in use.
pub async fn run(db: &str, args: DashboardArgs) -> anyhow::Result<u8> {
    let listen = parse_listen(&args.listen)?;
    if !listen.ip().is_loopback() && args.token.is_none() {
        return Err(usage(format!(
            "--listen {}: not a loopback address, so anyone who reaches it could read every payload and pause queues; add --token T (or set RELAYQ_DASHBOARD_TOKEN), or listen on 127.0.0.1",
            args.listen
        )));
    }
    let queues = if args.queues.is_empty() {
        vec!["default".to_owned()]
    } else {
        args.queues
    };
    let mut options = Options {
        queues,
        read_only: args.read_only,
        token: args.token,
        ..Options::default()
    };
    options.validate().map_err(|e| match e.invalid_field() {
        Some("token") => usage("--token: must not be empty"),
        _ => usage(format!("-q/--queue: {e}")),
    })?;
    let backend = backend::open(db, Use::Existing).await?;
    // The process's recorder: the dashboard's gauges, and anything else this process
    // records through the `metrics` facade, render at /metrics.
    options.metrics = Some(
        relayq_dashboard::prometheus()
            .install_recorder()
            .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?,
    );
    relayq_dashboard::describe_metrics();
    let read_only = options.read_only;
    let guarded = options.token.is_some();
    let app = relayq_dashboard::router(backend, options);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {listen}: cannot listen: {e}"))?;
    let bound = listener.local_addr()?;
    outln!(
        "relayq dashboard on http://{bound}/{}{}",
        if read_only { " (read-only)" } else { "" },
        if guarded {
            " — open it once with ?token=<your token>"
        } else {
            ""
        }
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await?;
    Ok(exit::OK)
}

/// `HOST:PORT`, with `localhost` for the IPv4 loopback.
pub(crate) fn parse_listen(text: &str) -> anyhow::Result<SocketAddr> {
    if let Some(port) = text.strip_prefix("localhost:")
        && let Ok(port) = port.parse()
    {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse().map_err(|_| {
        usage(format!(
            "--listen {text:?}: expected IP:PORT, e.g. 127.0.0.1:8080 or [::1]:8080"
        ))
    })
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = ctrl_c.await;
            return;
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen("localhost:9").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert!(parse_listen("[::1]:8080").unwrap().ip().is_loopback());
        assert!(!parse_listen("0.0.0.0:8080").unwrap().ip().is_loopback());
        let e = parse_listen("nope").unwrap_err().to_string();
        assert!(e.contains("--listen"), "{e}");
    }
}
