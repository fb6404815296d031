//! `--db URL` → a backend.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use relayq_core::{Backend, memory::MemoryBackend};
use relayq_sqlite::SqliteBackend;

use crate::exit::usage;

/// The default database: a SQLite file in the current folder.
pub const DEFAULT_DB: &str = "sqlite://relayq.db";

/// The backends this binary has, for error messages.
fn built_in() -> String {
    format!("this binary has {}", relayq::schemes().join(", "))
}

/// `--db`'s help: an example URL of every backend this binary has, with the other
/// schemes it takes (`rediss://` for Redis over TLS).
pub fn db_help() -> String {
    let examples: Vec<String> = relayq::drivers()
        .into_iter()
        .map(|d| {
            let mut notes: Vec<String> = d.schemes[1..]
                .iter()
                .map(|s| format!("also {s}://"))
                .collect();
            match d.name {
                "sqlite" => notes.push(format!("default {DEFAULT_DB}")),
                "memory" => notes.push("`run` only".to_owned()),
                _ => {}
            }
            if notes.is_empty() {
                d.example_url.to_owned()
            } else {
                format!("{} ({})", d.example_url, notes.join(", "))
            }
        })
        .collect();
    format!("The database: {}", examples.join(", "))
}

/// What the command needs of the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The command may create the database (`run`, `enqueue`, `work`, `batch open`).
    Create,
    /// The command only looks at or changes existing jobs: a SQLite file that does not
    /// exist is an error rather than a new empty database.
    Existing,
    /// As `Existing`, for a command that only reads: a SQL server's schema is not
    /// migrated (a missing or older one is an error saying so), which spares every
    /// `status` the migration's round trips and lock.
    Read,
    /// `run`: also the in-memory backend is fine (nothing needs to outlive the process).
    RunInProcess,
}

/// Opens the backend `url` names.
///
/// # Errors
/// A clear message for an unknown scheme, a backend not built into this binary, the
/// in-memory backend outside `run`, a missing SQLite file (for [`Use::Existing`]), or the
/// backend's own error.
pub async fn open(url: &str, need: Use) -> anyhow::Result<Arc<dyn Backend>> {
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(usage(format!(
            "--db {url:?}: not a database URL; write e.g. {DEFAULT_DB} (a SQLite file); {}",
            built_in()
        )));
    };
    match scheme {
        "sqlite" => {
            if matches!(need, Use::Existing | Use::Read)
                && let Some(path) = sqlite_file(rest)
                && !path.exists()
            {
                return Err(usage(format!(
                    "--db {url:?}: no database at {} (run `relayq run`, `relayq enqueue` or `relayq work` to create one)",
                    path.display()
                )));
            }
            let backend = SqliteBackend::open(url)
                .await
                .with_context(|| format!("cannot open the SQLite database {url:?}"))?;
            Ok(Arc::new(backend))
        }
        "memory" if need == Use::RunInProcess => Ok(Arc::new(MemoryBackend::new())),
        "memory" => Err(usage(format!(
            "--db {url:?}: the in-memory backend keeps nothing after this process ends, so it works with `relayq run` only"
        ))),
        // Every other scheme goes to the `relayq` facade, which opens each backend this
        // binary was built with. SQL servers get their schema created or brought up to
        // date on first use by any command that writes: migrating is idempotent and
        // safe from many processes at once.
        _ => relayq::connect_with(
            url,
            if need == Use::Read {
                relayq::Migrate::No
            } else {
                relayq::Migrate::Yes
            },
        )
        .await
        .map_err(|e| {
            if e.invalid_field() == Some("url") {
                usage(format!("--db {:?}: {e}", redacted(url)))
            } else {
                anyhow::Error::new(e).context(format!("cannot open {:?}", redacted(url)))
            }
        }),
    }
}

/// `url` with its password (if any) replaced by `***`, for error messages and logs.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // The last '@' ends the user info: a password may contain '@' unencoded.
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
        None => url.to_owned(),
    }
}

/// The file a `sqlite:` URL names (after the scheme's colon), or `None` for an
/// in-memory SQLite database.
fn sqlite_file(rest: &str) -> Option<PathBuf> {
    let path = rest.strip_prefix("//").unwrap_or(rest);
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if path.is_empty() || path == ":memory:" {
        return None;
    }
    Some(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_help_names_every_scheme_of_every_backend() {
        let help = db_help();
        for d in relayq::drivers() {
            for s in d.schemes {
                assert!(help.contains(&format!("{s}://")), "{s}:// missing: {help}");
            }
        }
    }

    async fn open_err(url: &str, usage: Use) -> String {
        match open(url, usage).await {
            Ok(_) => panic!("{url} opened"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// `mssql://` reaches the SQL Server backend: with nothing listening, the error is
    /// the connection's, without the password.
    #[tokio::test]
    async fn mssql_urls_reach_the_sql_server_backend() {
        let e = open_err("mssql://sa:s3cretpw@127.0.0.1:1/master", Use::Create).await;
        assert!(
            e.contains("cannot open \"mssql://sa:***@127.0.0.1:1/master\""),
            "{e}"
        );
        assert!(!e.contains("s3cretpw"), "{e}");
    }

    /// `mysql://` and `mariadb://` reach the MySQL backend: with nothing listening, the
    /// error is the connection's, without the password.
    #[tokio::test]
    async fn mysql_urls_reach_the_mysql_backend() {
        for scheme in ["mysql", "mariadb"] {
            let url = format!("{scheme}://root:s3cretpw@127.0.0.1:1/test");
            let e = open_err(&url, Use::Create).await;
            assert!(
                e.contains(&format!(
                    "cannot open \"{scheme}://root:***@127.0.0.1:1/test\""
                )),
                "{e}"
            );
            assert!(!e.contains("s3cretpw"), "{e}");
        }
    }

    #[tokio::test]
    async fn unknown_schemes_and_plain_paths_are_clear_errors() {
        let e = open_err("oracle://x", Use::Create).await;
        assert!(e.contains("unknown scheme oracle://"), "{e}");
        let e = open_err("relayq.db", Use::Create).await;
        assert!(e.contains("not a database URL"), "{e}");
    }

    #[tokio::test]
    async fn memory_is_for_run_only() {
        assert!(open("memory://", Use::RunInProcess).await.is_ok());
        let e = open_err("memory://", Use::Existing).await;
        assert!(e.contains("works with `relayq run` only"), "{e}");
    }

    #[tokio::test]
    async fn a_missing_sqlite_file_is_not_created_by_read_commands() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.db");
        let url = format!("sqlite://{}", path.display());
        let e = open_err(&url, Use::Existing).await;
        assert!(e.contains("no database at"), "{e}");
        assert!(!path.exists());
        assert!(open(&url, Use::Create).await.is_ok());
        assert!(path.exists());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redacted("postgres://app:s3cr@t@db:5432/x?sslmode=require"),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(
            redacted("redis://:pw@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(redacted("redis://host:6379"), "redis://host:6379");
        assert_eq!(redacted("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(redacted("sqlite://a.db"), "sqlite://a.db");
    }

    #[tokio::test]
    async fn connection_errors_do_not_show_the_password() {
        // A port nobody listens on: the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        for scheme in ["postgres", "redis"] {
            let url = format!("{scheme}://user:hunter2@127.0.0.1:{port}/0");
            if let Err(e) = open(&url, Use::Create).await {
                let text = format!("{e:#}");
                assert!(!text.contains("hunter2"), "{text}");
            }
        }
    }

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(sqlite_file("//relayq.db"), Some(PathBuf::from("relayq.db")));
        assert_eq!(
            sqlite_file("///tmp/x.db?mode=rwc"),
            Some(PathBuf::from("/tmp/x.db"))
        );
        assert_eq!(sqlite_file("x.db"), Some(PathBuf::from("x.db")));
        assert_eq!(sqlite_file(":memory:"), None);
    }
}
