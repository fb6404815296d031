//! This crate's unit tests that need a server compile as ignored, with the reason, when
//! `RELAYQ_MYSQL_URL` is unset (see `relayq-testenv`).

fn main() {
    relayq_testenv::build::server_cfg("mysql", "RELAYQ_MYSQL_URL");
}
