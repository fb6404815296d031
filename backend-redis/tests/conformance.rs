//! The whole conformance suite, and the model check, against standalone Redis
//! (`RELAYQ_REDIS_URL`, or a container; else reported as ignored), opened through the
//! backend's driver. Cases isolate themselves by queue name.

use relayq_conformance::{Capability, Driven, DriverSubject, UNREACHABLE_PASSWORD, with_query};

struct Redis;

impl Driven for Redis {
    const NAME: &'static str = "redis";
    const DRIVER: &'static relayq_core::Driver = &relayq_redis::DRIVER;
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Notifications,
        Capability::Unreachable,
        Capability::ConnectionCut,
        Capability::LimitKeys,
        Capability::Rates,
        Capability::KeyRates,
        Capability::KeyBacklogs,
        Capability::Dependencies,
    ];

    fn url(server: Option<&str>) -> String {
        with_query(server.unwrap_or_default(), "prefix=relayq-conformance")
    }

    fn unreachable_url() -> Option<String> {
        Some(format!("redis://:{UNREACHABLE_PASSWORD}@127.0.0.1:1/0"))
    }
}

relayq_conformance::suite!(DriverSubject<Redis>);
