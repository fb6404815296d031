//! The whole conformance suite, and the model check, against SQLite, opened through the
//! backend's driver: one database file per test process, shared by every case (cases
//! isolate themselves by queue name), each extra handle opening its own pool on the
//! same file.

use relayq_conformance::{Capability, Driven, DriverSubject};

struct Sqlite;

impl Driven for Sqlite {
    const NAME: &'static str = "sqlite";
    const DRIVER: &'static relayq_core::Driver = &relayq_sqlite::DRIVER;
    // Handles on one file in one process share an event bus.
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::LimitKeys,
        Capability::Rates,
        Capability::KeyRates,
        Capability::KeyBacklogs,
        Capability::Dependencies,
    ];

    fn url(_: Option<&str>) -> String {
        let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("conformance-{}.db", uuid::Uuid::new_v4().simple()));
        format!("sqlite://{}", file.display())
    }
}

relayq_conformance::suite!(DriverSubject<Sqlite>);
