//! Where relayq's tests find their servers (see the README): `RELAYQ_REQUIRE` and the
//! servers' URL variables, read here and nowhere else. No dependencies, so that build
//! scripts can use it as well as tests.

/// The server URL in the environment variable `env_var`, when set and not blank.
#[must_use]
pub fn url(env_var: &str) -> Option<String> {
    std::env::var(env_var)
        .ok()
        .filter(|url| !url.trim().is_empty())
}

/// Whether `RELAYQ_REQUIRE` (comma-separated server names) names `name`: that server's
/// tests then fail without it instead of being reported as ignored.
#[must_use]
pub fn required(name: &str) -> bool {
    names(&std::env::var("RELAYQ_REQUIRE").unwrap_or_default(), name)
}

/// Whether the comma-separated `list` names `name`.
#[must_use]
pub fn names(list: &str, name: &str) -> bool {
    list.split(',').any(|s| s.trim() == name)
}

/// For build scripts.
pub mod build {
    /// Sets `cfg(relayq_no_NAME)` (dashes become underscores) when `env_var` is unset
    /// or blank and `RELAYQ_REQUIRE` does not name `name`, so that a crate's unit tests
    /// that need the server compile as ignored, with the reason. Library code must not
    /// read the cfg.
    #[allow(
        clippy::print_stdout,
        reason = "a build script speaks to cargo on stdout"
    )]
    pub fn server_cfg(name: &str, env_var: &str) {
        let cfg = format!("relayq_no_{}", name.replace('-', "_"));
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-changed=build.rs");
        println!("cargo::rerun-if-env-changed={env_var}");
        println!("cargo::rerun-if-env-changed=RELAYQ_REQUIRE");
        if super::url(env_var).is_none() && !super::required(name) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn names_are_matched_whole() {
        assert!(names("postgres, redis", "redis"));
        assert!(!names("redis-cluster", "redis"));
        assert!(!names("", "redis"));
    }
}
