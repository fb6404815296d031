//! SPEC X4: the driver's errors as relayq's, transient when the same call may succeed
//! if made again.

use relayq_core::Error;
use sqlx::mysql::MySqlDatabaseError;

/// InnoDB chose this transaction as a deadlock's victim and rolled it back.
const DEADLOCK: u16 = 1213;
/// A lock wait outlasted `innodb_lock_wait_timeout`.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// The server is shutting down, or closed the connection under a statement.
const SERVER_GONE: &[u16] = &[1053, 2006, 2013];

/// Maps a driver error, keeping it as the source: transient for a deadlock, a lock
/// wait timeout, a lost connection or a pool with no connection to give in time.
pub(crate) fn db(e: sqlx::Error) -> Error {
    if transient(&e) {
        Error::transient(e).from_backend("mysql")
    } else {
        Error::backend(e).from_backend("mysql")
    }
}

fn code(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

fn transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(_) => code(e)
            .is_some_and(|c| c == DEADLOCK || c == LOCK_WAIT_TIMEOUT || SERVER_GONE.contains(&c)),
        _ => false,
    }
}

/// Whether a whole transaction may simply run again: it was a deadlock's victim or
/// waited out a lock, and nothing of it was kept. (A lost connection is transient too,
/// but its commit may have happened: the caller decides.)
pub(crate) fn deadlocked(e: &Error) -> bool {
    e.backend_source()
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .and_then(code)
        .is_some_and(|c| c == DEADLOCK || c == LOCK_WAIT_TIMEOUT)
}
