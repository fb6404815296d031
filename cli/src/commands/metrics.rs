//! `relayq work --metrics ADDR`: the worker's counters as Prometheus text at
//! `http://ADDR/metrics`, on loopback only (the endpoint has no token).

use std::net::SocketAddr;

use axum::{Router, routing::get};

use crate::exit::usage;

/// Installs the process's Prometheus recorder and serves `/metrics` on `text` (an
/// `IP:PORT` on loopback); returns the address bound.
///
/// # Errors
/// A bad or non-loopback address, a port that cannot be bound, a recorder already set.
pub async fn serve(text: &str) -> anyhow::Result<SocketAddr> {
    let addr = crate::dashboard::parse_listen(text)?;
    if !addr.ip().is_loopback() {
        return Err(usage(format!(
            "--metrics {text}: not a loopback address; the endpoint has no token, so it \
             listens on loopback only (scrape through a local agent, or use `relayq dashboard --token`)"
        )));
    }
    let handle = relayq_dashboard::prometheus()
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?;
    relayq_dashboard::describe_metrics();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics {addr}: cannot listen: {e}"))?;
    let bound = listener.local_addr()?;
    let app = Router::new().route("/metrics", get(move || async move { handle.render() }));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok(bound)
}
