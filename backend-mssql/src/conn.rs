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

    /// After a request failed with `e`: gives the connection back to the pool when the
    /// server reported the error and, asked with one more round trip, has no
    /// transaction open. Otherwise `busy` stays set and the pool discards it. Every
    /// batch runs with `XACT_ABORT` on, so a run-time error (a deadlock victim, 1205,
    /// included) has already rolled its transaction back and the connection is kept,
    /// saving a new login; an error that aborts the batch but not the transaction (a
    /// compile error in a statement after `BEGIN TRANSACTION`) leaves one open, and
    /// closing the connection is what rolls it back. tiberius drains the rest of the
    /// failed response before sending the question.
    pub(crate) async fn recover(&mut self, e: &tiberius::error::Error) {
        if !probe_worthy(e) {
            return;
        }
        let open = match self.client.simple_query(sql::TRANCOUNT).await {
            Ok(stream) => stream.into_row().await.ok().flatten(),
            Err(_) => None,
        };
        if reusable(open.and_then(|r| r.try_get::<i32, _>(0).ok().flatten())) {
            self.done();
        }
    }
}

/// Whether a request that failed with `e` may have left its connection usable: only
/// an error the server reported, which comes in a complete response. An I/O error, a
/// command timeout (tiberius marks that connection unusable), a protocol or TLS error
/// leaves the connection mid-response or broken.
fn probe_worthy(e: &tiberius::error::Error) -> bool {
    e.code().is_some()
}

/// Whether the answer to [`sql::TRANCOUNT`] (`None`: no answer) lets the connection
/// back into the pool: only "no transaction open".
fn reusable(trancount: Option<i32>) -> bool {
    trancount == Some(0)
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

/// Parses `url` into a TDS configuration: a URL
/// `mssql://user:password@host:port/database?trust_cert_ca=/path/to/ca.pem` (also
/// `sqlserver://`), an ADO.NET connection string
/// (`server=tcp:host,1433;user id=app;password=...;TrustServerCertificateCA=/path/ca.pem`)
/// or a JDBC one (`jdbc:sqlserver://host:1433;...`).
///
/// The connection is encrypted and the server's certificate validated against the
/// system's roots, plus the CA given by `trust_cert_ca` (the production setting for a
/// server whose certificate a private CA signed). `trust_cert=true` turns validation
/// off (any certificate, any host name): for a local container or CI only. The two
/// exclude each other.
///
/// In the URL form, user, password, database and option values are percent-decoded
/// (`%40` is `@`) and nothing else: `+` stays `+`. A password with `@ : / ? # %` must
/// have them percent-encoded. Errors never quote the string, which holds the password.
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

/// The options of the URL form, decoded.
#[derive(Debug, Default)]
struct Options {
    trust_cert: bool,
    trust_cert_ca: Option<String>,
    encryption: Option<EncryptionLevel>,
}

fn options(query: Option<&str>) -> Result<Options> {
    let mut o = Options::default();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v)?;
        match decode(k)?.as_str() {
            "trust_cert" | "trust_server_certificate" | "TrustServerCertificate" => {
                o.trust_cert = matches!(v.as_str(), "true" | "1" | "yes");
            }
            "trust_cert_ca" | "TrustServerCertificateCA" => o.trust_cert_ca = Some(v),
            "encrypt" => {
                o.encryption = Some(match v.as_str() {
                    "false" | "off" | "0" => EncryptionLevel::Off,
                    "not_supported" => EncryptionLevel::NotSupported,
                    _ => EncryptionLevel::Required,
                });
            }
            other => {
                return Err(Error::invalid(
                    "url",
                    format!("unknown option {other:?} (known: trust_cert_ca, trust_cert, encrypt)"),
                ));
            }
        }
    }
    if o.trust_cert && o.trust_cert_ca.is_some() {
        // tiberius panics on both; either one alone is a complete trust setting.
        return Err(Error::invalid(
            "url",
            "trust_cert and trust_cert_ca exclude each other: give one",
        ));
    }
    Ok(o)
}

/// The user and password of `u`, decoded; `None` without a user.
fn credentials(u: &url::Url) -> Result<Option<(String, String)>> {
    if u.username().is_empty() {
        return Ok(None);
    }
    Ok(Some((
        decode(u.username())?,
        decode(u.password().unwrap_or_default())?,
    )))
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
    if let Some((user, password)) = credentials(&u)? {
        c.authentication(AuthMethod::sql_server(user, password));
    }
    let o = options(u.query())?;
    if o.trust_cert {
        c.trust_cert();
    }
    if let Some(ca) = o.trust_cert_ca {
        c.trust_cert_ca(ca);
    }
    if let Some(level) = o.encryption {
        c.encryption(level);
    }
    Ok(c)
}

/// Percent-decodes `s` (a part of a URL): `%XX` is the byte XX, everything else,
/// `+` included, is itself (`+` means a space only in HTML form data, which a
/// connection URL is not). A `%` without two hex digits after it is kept as it is,
/// as URL parsers do. The result must be UTF-8; the error does not quote `s`.
fn decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |j: usize| bytes.get(j).and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or_default());
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad_url(&"a percent-encoded part is not UTF-8"))
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

    /// Review item 7: `+` is a `+` (form decoding made it a space), `%2B` is a `+`
    /// too, and the URL's own separators come through when encoded.
    #[test]
    fn a_plus_in_a_password_stays_a_plus() {
        assert_eq!(decode("a+b").unwrap(), "a+b");
        assert_eq!(decode("a%2Bb%2bc").unwrap(), "a+b+c");
        assert_eq!(decode("%25%20%3A%2F%3F%23").unwrap(), "% :/?#");
        assert_eq!(decode("caf%C3%A9").unwrap(), "café");
        // A `%` that starts no escape is itself, as URL parsers treat it.
        assert_eq!(decode("100%").unwrap(), "100%");
        assert_eq!(decode("5%zz%4").unwrap(), "5%zz%4");
        assert!(decode("%FF").is_err(), "not UTF-8");
    }

    fn creds(url: &str) -> (String, String) {
        credentials(&url::Url::parse(url).unwrap())
            .unwrap()
            .expect("a user")
    }

    #[test]
    fn url_credentials_decode_percent_escapes_only() {
        assert_eq!(
            creds("mssql://app:a+b%2Bc%40d%3Ae@db:1433/x"),
            ("app".into(), "a+b+c@d:e".into())
        );
        assert_eq!(
            creds("mssql://dom%5Cuser:p%25w@db/x"),
            ("dom\\user".into(), "p%w".into())
        );
        // An unencoded `@` in the password: the host starts after the last one.
        let u = url::Url::parse("mssql://app:p@ss@db/x").unwrap();
        assert_eq!(u.host_str(), Some("db"));
        assert_eq!(creds("mssql://app:p@ss@db/x").1, "p@ss");
        assert_eq!(creds("mssql://app@db/x"), ("app".into(), String::new()));
        assert!(
            credentials(&url::Url::parse("mssql://db/x").unwrap())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn options_take_a_ca_file_and_keep_plus_signs() {
        let o = options(Some("trust_cert_ca=/etc/ssl/mssql+ca.pem&encrypt=true")).unwrap();
        assert_eq!(o.trust_cert_ca.as_deref(), Some("/etc/ssl/mssql+ca.pem"));
        assert!(!o.trust_cert);
        assert!(matches!(o.encryption, Some(EncryptionLevel::Required)));
        let o = options(Some("TrustServerCertificateCA=%2Fca%20dir%2Fca.pem")).unwrap();
        assert_eq!(o.trust_cert_ca.as_deref(), Some("/ca dir/ca.pem"));
        assert!(options(Some("trust_cert=true")).unwrap().trust_cert);
        assert!(!options(Some("trust_cert=false")).unwrap().trust_cert);
        assert!(!options(None).unwrap().trust_cert);
        let both = options(Some("trust_cert=true&trust_cert_ca=/ca.pem")).unwrap_err();
        assert!(
            matches!(both, Error::InvalidInput { field: "url", .. }),
            "{both}"
        );
    }

    #[test]
    fn every_documented_form_parses() {
        for url in [
            "mssql://app:pw@db.internal:1433/app?trust_cert_ca=/etc/ssl/certs/mssql-ca.pem",
            "mssql://sa:pw@127.0.0.1:1433/master?trust_cert=true",
            "server=tcp:db.internal,1433;user id=app;password=pw;\
             TrustServerCertificateCA=/etc/ssl/certs/mssql-ca.pem",
            "jdbc:sqlserver://db.internal:1433;user=app;password=pw",
        ] {
            let c = parse(url, T).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(c.get_command_timeout(), Some(T));
        }
    }

    /// Errors name the field and the problem, never the string, which holds the
    /// password.
    #[test]
    fn errors_never_show_the_password() {
        const SECRET: &str = "S3cr3t+pw";
        for bad in [
            "mssql://sa:S3cr3t+pw@db:99999/app",
            "mssql://sa:S3cr3t+pw@db/app?color=blue",
            "mssql://sa:S3cr3t+pw@db/app?trust_cert=true&trust_cert_ca=/ca.pem",
            "mssql://sa:S3cr3t+pw%FF@db/app",
            "mssql://sa:S3cr3t+pw@/app",
            "server=tcp:db,notaport;user id=sa;password=S3cr3t+pw",
            "server=tcp:db;password=S3cr3t+pw;TrustServerCertificate=true;\
             TrustServerCertificateCA=/ca.pem",
            "jdbc:sqlserver://db:notaport;user=sa;password=S3cr3t+pw",
            "S3cr3t+pw",
        ] {
            let err = parse(bad, T).expect_err(bad);
            assert!(
                matches!(err, Error::InvalidInput { field: "url", .. }),
                "{bad}: {err}"
            );
            assert!(!err.to_string().contains(SECRET), "{err}");
            assert!(!format!("{err:?}").contains(SECRET), "{err:?}");
        }
    }

    /// Review item 5: only a server-reported error leaves a connection worth asking
    /// about; only "no transaction open" puts it back.
    #[test]
    fn only_server_errors_without_an_open_transaction_keep_the_connection() {
        let io = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::TimedOut,
            message: "command timeout".into(),
        };
        assert!(!probe_worthy(&io));
        assert!(!probe_worthy(&tiberius::error::Error::Protocol(
            "desync".into()
        )));
        assert!(!probe_worthy(&tiberius::error::Error::Tls(
            "bad cert".into()
        )));
        // (tiberius gives no way to build a server error outside a connection; its
        // `code()` is `Some` exactly for those, which is what `probe_worthy` reads.)
        assert!(reusable(Some(0)));
        assert!(!reusable(Some(1)), "a transaction left open");
        assert!(!reusable(None), "no answer");
    }
}
