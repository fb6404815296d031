//! Connections: the connection string, the session settings, and a small bb8 manager
//! (bb8-tiberius targets tiberius 0.12).

use std::time::{Duration, Instant};

use relayq_core::{Error, Result};
use tiberius::{AuthMethod, Client, Config as TdsConfig, EncryptionLevel};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use crate::sql;

/// One pooled connection.
pub(crate) struct Conn {
    pub(crate) client: Client<Compat<TcpStream>>,
    /// Set while a request is in flight. A request that failed or was dropped midway
    /// (a timeout, a cancelled future) leaves it set, and the pool then discards the
    /// connection instead of handing out one that is mid-response or mid-transaction:
    /// closing it makes the server roll back whatever it had open.
    pub(crate) busy: bool,
    /// When the connection last finished a request (or opened).
    used: Instant,
}

impl Conn {
    /// Marks the request done: the connection can go back to the pool, and it counts
    /// as just used.
    pub(crate) fn done(&mut self) {
        self.busy = false;
        self.used = Instant::now();
    }
}

/// Whether a connection last used at `used` is checked with a round trip before it is
/// handed out, at `now`: only one idle at least `after` (`Config::check_after_idle`).
/// bb8 checks every one by default, a second round trip on each claim.
fn needs_check(used: Instant, now: Instant, after: Duration) -> bool {
    now.saturating_duration_since(used) >= after
}

/// Opens connections with the session settings every statement relies on.
pub(crate) struct Manager {
    pub(crate) config: TdsConfig,
    pub(crate) check_after_idle: Duration,
}

impl bb8::ManageConnection for Manager {
    type Connection = Conn;
    type Error = tiberius::error::Error;

    async fn connect(&self) -> std::result::Result<Conn, Self::Error> {
        let tcp = TcpStream::connect(self.config.get_addr()).await?;
        tcp.set_nodelay(true)?;
        let mut client = Client::connect(self.config.clone(), tcp.compat_write()).await?;
        client
            .simple_query(sql::SESSION)
            .await?
            .into_results()
            .await?;
        Ok(Conn {
            client,
            busy: false,
            used: Instant::now(),
        })
    }

    async fn is_valid(&self, conn: &mut Conn) -> std::result::Result<(), Self::Error> {
        if !needs_check(conn.used, Instant::now(), self.check_after_idle) {
            return Ok(());
        }
        conn.client
            .simple_query(sql::PING)
            .await?
            .into_results()
            .await?;
        Ok(())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.busy
    }
}

/// Parses `url` into a TDS configuration: an ADO.NET connection string
/// (`server=tcp:host,1433;user id=sa;password=...;TrustServerCertificate=true`), a JDBC
/// one (`jdbc:sqlserver://host:1433;...`), or a URL
/// `mssql://user:password@host:port/database?trust_cert=true` (also `sqlserver://`).
pub(crate) fn parse(url: &str, command_timeout: Duration) -> Result<TdsConfig> {
    let mut config = if url.starts_with("jdbc:sqlserver://") {
        TdsConfig::from_jdbc_string(url).map_err(|e| bad_url(&e))?
    } else if url.starts_with("mssql://") || url.starts_with("sqlserver://") {
        from_url(url)?
    } else if url.contains('=') {
        TdsConfig::from_ado_string(url).map_err(|e| bad_url(&e))?
    } else {
        return Err(Error::invalid(
            "url",
            "expected mssql://user:password@host:port/database, an ADO.NET connection \
             string or a jdbc:sqlserver:// string",
        ));
    };
    config.application_name("relayq");
    config.command_timeout(Some(command_timeout));
    Ok(config)
}

fn bad_url(e: &dyn std::fmt::Display) -> Error {
    Error::invalid("url", format!("not a SQL Server connection string: {e}"))
}

fn from_url(s: &str) -> Result<TdsConfig> {
    let u = url::Url::parse(s).map_err(|e| bad_url(&e))?;
    let mut c = TdsConfig::new();
    c.host(u.host_str().ok_or_else(|| bad_url(&"no host"))?);
    c.port(u.port().unwrap_or(1433));
    let db = u.path().trim_start_matches('/');
    if !db.is_empty() {
        c.database(decode(db)?);
    }
    if !u.username().is_empty() {
        let password = decode(u.password().unwrap_or_default())?;
        c.authentication(AuthMethod::sql_server(decode(u.username())?, password));
    }
    for (k, v) in u.query_pairs() {
        let on = matches!(v.as_ref(), "true" | "1" | "yes");
        match k.as_ref() {
            "trust_cert" | "trust_server_certificate" | "TrustServerCertificate" if on => {
                c.trust_cert();
            }
            "encrypt" => c.encryption(match v.as_ref() {
                "false" | "off" | "0" => EncryptionLevel::Off,
                "not_supported" => EncryptionLevel::NotSupported,
                _ => EncryptionLevel::Required,
            }),
            "trust_cert" | "trust_server_certificate" | "TrustServerCertificate" => {}
            other => {
                return Err(Error::invalid(
                    "url",
                    format!("unknown option {other:?} (known: trust_cert, encrypt)"),
                ));
            }
        }
    }
    Ok(c)
}

fn decode(s: &str) -> Result<String> {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| bad_url(&"undecodable user or password"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(7);

    #[test]
    fn only_connections_idle_long_enough_are_checked() {
        let used = Instant::now();
        let second = Duration::from_secs(1);
        assert!(!needs_check(used, used + second / 2, second));
        assert!(needs_check(used, used + second, second));
        assert!(
            needs_check(used, used, Duration::ZERO),
            "ZERO checks every one"
        );
        assert!(
            !needs_check(used + second, used, second),
            "a clock read before the last use is no idle time"
        );
    }

    #[test]
    fn urls_give_host_port_and_database() {
        let c = parse("mssql://sa:p%40ss@db.local:1444/app?trust_cert=true", T).unwrap();
        assert_eq!(c.get_addr(), "db.local:1444");
        let c = parse("sqlserver://sa:x@127.0.0.1/master", T).unwrap();
        assert_eq!(c.get_addr(), "127.0.0.1:1433");
        let c = parse(
            "server=tcp:10.0.0.5,1499;user id=sa;password=x;TrustServerCertificate=true",
            T,
        )
        .unwrap();
        assert_eq!(c.get_addr(), "10.0.0.5:1499");
        let c = parse("jdbc:sqlserver://host9:1401;user=sa;password=x", T).unwrap();
        assert_eq!(c.get_addr(), "host9:1401");
    }

    #[test]
    fn bad_urls_name_the_field() {
        for bad in [
            "postgres://x@y/z",
            "nonsense",
            "mssql://",
            "mssql://sa:x@h/db?color=blue",
        ] {
            let err = parse(bad, T).unwrap_err();
            assert!(
                matches!(err, Error::InvalidInput { field: "url", .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn percent_encoded_credentials_are_decoded() {
        assert_eq!(decode("p%40ss%3Bw").unwrap(), "p@ss;w");
        assert_eq!(decode("plain").unwrap(), "plain");
    }
}
