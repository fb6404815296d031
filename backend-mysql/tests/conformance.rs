//! The whole conformance suite, and the model check, against MariaDB or MySQL, opened
//! through the backend's driver: every case in one database, `relayq_conformance`
//! (cases isolate themselves by queue name).

use relayq_conformance::{Capability, Driven, DriverSubject, UNREACHABLE_PASSWORD, with_query};

struct Mysql;

impl Driven for Mysql {
    const NAME: &'static str = "mysql";
    const DRIVER: &'static relayq_core::Driver = &relayq_mysql::DRIVER;
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::Unreachable,
        Capability::ConnectionCut,
        Capability::Schema,
        Capability::Dependencies,
        Capability::Rates,
        Capability::LimitKeys,
        Capability::KeyRates,
        Capability::KeyBacklogs,
    ];

    fn url(server: Option<&str>) -> String {
        with_query(server.unwrap_or_default(), "schema=relayq_conformance")
    }

    fn unreachable_url() -> Option<String> {
        Some(format!("mysql://u:{UNREACHABLE_PASSWORD}@127.0.0.1:1/db"))
    }

    fn unmigrated_url(server: Option<&str>) -> Option<String> {
        let schema = format!("relayq_nm_{}", uuid::Uuid::new_v4().simple());
        Some(with_query(
            server.unwrap_or_default(),
            &format!("schema={schema}"),
        ))
    }
}

relayq_conformance::suite!(DriverSubject<Mysql>);
