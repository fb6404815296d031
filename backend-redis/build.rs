//! One build-time fact, for this crate's own unit tests only: when `RELAYQ_REDIS_URL` is
//! unset and `RELAYQ_REQUIRE` does not name redis, the unit tests that need the server
//! are compiled as ignored, with the reason (`cfg(relayq_no_redis)`). libtest cannot
//! mark a test ignored once it runs, and a test that returned early would count as
//! passed. Library code does not read the cfg.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(relayq_no_redis)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=RELAYQ_REDIS_URL");
    println!("cargo::rerun-if-env-changed=RELAYQ_REQUIRE");
    let set = std::env::var("RELAYQ_REDIS_URL").is_ok_and(|url| !url.trim().is_empty());
    let required = std::env::var("RELAYQ_REQUIRE")
        .unwrap_or_default()
        .split(',')
        .any(|s| s.trim() == "redis");
    if !set && !required {
        println!("cargo::rustc-cfg=relayq_no_redis");
    }
}
