//! [`DRIVER`] and [`CLUSTER_DRIVER`]: this backend as the rest of relayq sees it
//! (`redis://`, `rediss://` and `redis-cluster://` URLs).

use std::sync::Arc;

use relayq_core::{
    Backend, Driver, Error, Migrate, Result, TestServer,
    driver::{Image, Ready},
    kit::url_options,
};

use crate::{DEFAULT_PREFIX, RedisBackend};

/// Standalone Redis: `redis://HOST:PORT` (`rediss://` for TLS), with relayq's option
/// `?prefix=P`.
pub static DRIVER: Driver = Driver {
    name: "redis",
    schemes: &["redis", "rediss"],
    feature: "redis",
    example_url: "redis://HOST:PORT",
    open: |url, migrate| Box::pin(open(url, migrate)),
    server: Some(TestServer {
        name: "redis",
        env_var: "RELAYQ_REDIS_URL",
        // Redis 7: functions (FCALL) and the ACL the tests use.
        image: Some(Image {
            name: "redis",
            tag: "7.2",
            port: 6379,
            env: &[],
            ready: &[Ready::Stdout("Ready to accept connections")],
            url: "redis://127.0.0.1:{port}",
        }),
        to_url: None,
    }),
};

/// Redis Cluster: `redis-cluster://HOST:PORT,HOST:PORT`, the nodes to start from, with
/// relayq's option `?prefix=P`. Its tests take the node URLs, comma-separated.
pub static CLUSTER_DRIVER: Driver = Driver {
    name: "redis-cluster",
    schemes: &["redis-cluster"],
    feature: "redis",
    example_url: "redis-cluster://HOST:PORT,HOST:PORT",
    open: |url, migrate| Box::pin(open_cluster(url, migrate)),
    server: Some(TestServer {
        name: "redis-cluster",
        env_var: "RELAYQ_REDIS_CLUSTER_URLS",
        image: None,
        to_url: Some(cluster_url),
    }),
};

// Redis has no schema to migrate: its scripts are loaded on first use.
async fn open(url: String, _migrate: Migrate) -> Result<Arc<dyn Backend>> {
    let (url, o) = url_options::take(&url, &["prefix"])?;
    let prefix = o.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
    Ok(Arc::new(
        RedisBackend::connect_with_prefix(&url, prefix).await?,
    ))
}

async fn open_cluster(url: String, _migrate: Migrate) -> Result<Arc<dyn Backend>> {
    let (url, o) = url_options::take(&url, &["prefix"])?;
    let nodes = cluster_nodes(&url)?;
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let prefix = o.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
    Ok(Arc::new(RedisBackend::cluster(&nodes, prefix).await?))
}

/// The node URLs `redis://a:7000,redis://b:7001` (as its tests are given them) as one
/// `redis-cluster://a:7000,b:7001` URL; a user and password, given on the nodes, go
/// once before the hosts, as [`cluster_nodes`] reads them.
fn cluster_url(nodes: &str) -> String {
    let mut auth = "";
    let hosts: Vec<&str> = nodes
        .split(',')
        .map(|u| {
            u.trim()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
        })
        .filter(|h| !h.is_empty())
        .map(|h| match h.rsplit_once('@') {
            Some((a, host)) => {
                auth = a;
                host
            }
            None => h,
        })
        .collect();
    let auth = if auth.is_empty() {
        String::new()
    } else {
        format!("{auth}@")
    };
    format!("redis-cluster://{auth}{}", hosts.join(","))
}

/// `redis-cluster://a:7000,b:7001/?query` → `redis://a:7000/?query`, `redis://b:7001/?query`:
/// the nodes to start from, each with the URL's user, password and options.
fn cluster_nodes(url: &str) -> Result<Vec<String>> {
    let rest = url.strip_prefix("redis-cluster://").unwrap_or(url);
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (format!("{auth}@"), rest),
        None => (String::new(), rest),
    };
    let (hosts, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{tail}"))
        .collect();
    if nodes.is_empty() {
        return Err(Error::invalid(
            "url",
            "redis-cluster:// needs at least one node: redis-cluster://host:7000,host:7001",
        ));
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_each_node_with_the_shared_parts() {
        let nodes = cluster_nodes("redis-cluster://u:p@a:7000,b:7001/?x=1").unwrap();
        assert_eq!(
            nodes,
            ["redis://u:p@a:7000/?x=1", "redis://u:p@b:7001/?x=1"]
        );
        assert!(cluster_nodes("redis-cluster://").is_err());
        assert_eq!(
            cluster_url("redis://a:7000, redis://b:7001/"),
            "redis-cluster://a:7000,b:7001"
        );
        // The password survives the round trip to each node's URL.
        let url = cluster_url("redis://:pw@a:7000,redis://:pw@b:7001");
        assert_eq!(url, "redis-cluster://:pw@a:7000,b:7001");
        assert_eq!(
            cluster_nodes(&url).unwrap(),
            ["redis://:pw@a:7000", "redis://:pw@b:7001"]
        );
    }
}
