//! The whole conformance suite, and the model check, against PostgreSQL
//! (`RELAYQ_POSTGRES_URL`, or a container when Docker answers; else reported as
//! ignored), opened through the backend's driver. Every case shares one schema (cases
//! isolate themselves by queue name) and migrates it first, so the concurrent `migrate`
//! path runs on every test run too. The schema is named after the schema version, so a
//! server shared with another version of this crate never hands either one a schema it
//! refuses.

use relayq_conformance::{Capability, Driven, DriverSubject, UNREACHABLE_PASSWORD, with_query};

struct Postgres;

impl Driven for Postgres {
    const NAME: &'static str = "postgres";
    const DRIVER: &'static relayq_core::Driver = &relayq_postgres::DRIVER;
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::Unreachable,
        Capability::ConnectionCut,
        Capability::Schema,
        Capability::LimitKeys,
        Capability::Rates,
        Capability::KeyRates,
        Capability::KeyBacklogs,
        Capability::Dependencies,
    ];

    fn url(server: Option<&str>) -> String {
        let schema = format!("relayq_conformance_v{}", relayq_postgres::SCHEMA_VERSION);
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
            "postgres://relayq:{UNREACHABLE_PASSWORD}@127.0.0.1:1/relayq"
        ))
    }
}

relayq_conformance::suite!(DriverSubject<Postgres>);
