//! The whole conformance suite, and the model check, against SQL Server
//! (`RELAYQ_MSSQL_URL`, or a container, `mcr.microsoft.com/mssql/server:2022-latest`,
//! when Docker answers; else reported as ignored), opened through the backend's driver.
//! Every case shares one schema (cases isolate themselves by queue name) and migrates
//! it first, so the concurrent `migrate` path runs on every run too. The schema is
//! named after the schema version, so a server shared with another version of this
//! crate never hands either one a schema it refuses.

use relayq_conformance::{Capability, Driven, DriverSubject, UNREACHABLE_PASSWORD, with_query};

struct Mssql;

impl Driven for Mssql {
    const NAME: &'static str = "mssql";
    const DRIVER: &'static relayq_core::Driver = &relayq_mssql::DRIVER;
    // Handles on one server and schema in one process share an event bus.
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::Unreachable,
        Capability::ConnectionCut,
        Capability::Schema,
    ];

    fn url(server: Option<&str>) -> String {
        let schema = format!("relayq_conformance_v{}", relayq_mssql::SCHEMA_VERSION);
        with_query(
            server.unwrap_or_default(),
            &format!("schema={schema}&max_connections=4"),
        )
    }

    fn unmigrated_url(server: Option<&str>) -> Option<String> {
        let schema = format!(
            "relayq_unmigrated_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Some(with_query(server?, &format!("schema={schema}")))
    }

    fn unreachable_url() -> Option<String> {
        Some(format!(
            "mssql://sa:{UNREACHABLE_PASSWORD}@127.0.0.1:1/master"
        ))
    }
}

relayq_conformance::suite!(DriverSubject<Mssql>);
