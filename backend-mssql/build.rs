//! One build-time fact, for this crate's own unit tests only: when `RELAYQ_MSSQL_URL` is
//! unset and `RELAYQ_REQUIRE` does not name mssql, the unit tests that need the server
//! are compiled as ignored, with the reason (`cfg(relayq_no_mssql)`). libtest cannot
//! mark a test ignored once it runs, and a test that returned early would count as
//! passed. Library code does not read the cfg.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(relayq_no_mssql)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=RELAYQ_MSSQL_URL");
    println!("cargo::rerun-if-env-changed=RELAYQ_REQUIRE");
    let set = std::env::var("RELAYQ_MSSQL_URL").is_ok_and(|url| !url.trim().is_empty());
    let required = std::env::var("RELAYQ_REQUIRE")
        .unwrap_or_default()
        .split(',')
        .any(|s| s.trim() == "mssql");
    if !set && !required {
        println!("cargo::rustc-cfg=relayq_no_mssql");
    }
}
