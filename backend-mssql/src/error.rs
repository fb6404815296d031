//! Mapping driver and server errors into relayq's, and telling which ones running the
//! batch again resolves.

use relayq_core::Error;

/// A driver or server error, kept as the source of [`Error::Backend`]; transient when
/// the same call may succeed if made again ([`transient`]).
pub(crate) fn db(e: tiberius::error::Error) -> Error {
    if transient(&e) {
        Error::transient(e).from_backend("mssql")
    } else {
        Error::backend(e).from_backend("mssql")
    }
}

/// The connection failed or was lost (I/O), or the server answered with an error in
/// [`transient_code`].
pub(crate) fn transient(e: &tiberius::error::Error) -> bool {
    match e {
        tiberius::error::Error::Io { .. } => true,
        e => e.code().is_some_and(transient_code),
    }
}

/// Server errors that pass: a deadlock victim (1205), a lock time limit (1222), and the
/// errors Azure SQL and failovers give while a database moves or is busy (40197, 40501,
/// 40613, 49918-49920, 4060, and the connection-level 233, 10053, 10054, 10060, 64).
pub(crate) fn transient_code(code: u32) -> bool {
    matches!(
        code,
        1205 | 1222
            | 40197
            | 40501
            | 40613
            | 49918
            | 49919
            | 49920
            | 4060
            | 233
            | 10053
            | 10054
            | 10060
            | 64
    )
}

/// A pool error: the pool timed out, or opening a connection failed.
pub(crate) fn pool(e: bb8::RunError<tiberius::error::Error>) -> Error {
    match e {
        bb8::RunError::User(e) => db(e),
        bb8::RunError::TimedOut => {
            Error::transient("timed out waiting for a SQL Server connection from the pool")
        }
    }
}

/// Server errors after which the whole batch can simply run again: nothing of it was
/// kept (`XACT_ABORT` rolled it back).
///
/// - 1205: chosen as deadlock victim;
/// - 2601, 2627: a duplicate key, when two enqueues of one dedupe key raced past each
///   other's check (the next run finds the holder);
/// - 3960: a snapshot update conflict (only with SNAPSHOT isolation forced on us);
/// - 51205: relayq's own "group lock not granted".
pub(crate) fn retryable_code(code: u32) -> bool {
    matches!(code, 1205 | 2601 | 2627 | 3960 | 51205)
}

/// Whether `e` is a server error in [`retryable_code`].
pub(crate) fn retryable(e: &Error) -> bool {
    e.backend_source()
        .and_then(|s| s.downcast_ref::<tiberius::error::Error>())
        .and_then(tiberius::error::Error::code)
        .is_some_and(retryable_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlocks_lock_timeouts_and_failovers_are_transient() {
        for code in [1205, 1222, 40197, 40501, 40613, 49918, 4060, 233, 10054] {
            assert!(transient_code(code), "{code}");
        }
        // A duplicate key is retried inside the batch (a race), but not by callers; a
        // syntax or permission error never passes.
        for code in [102, 208, 229, 547, 2627, 8152, 50000] {
            assert!(!transient_code(code), "{code}");
        }
    }

    #[test]
    fn deadlocks_and_key_races_are_retried() {
        for code in [1205, 2601, 2627, 3960, 51205] {
            assert!(retryable_code(code), "{code}");
        }
        // Syntax errors, permission errors, lock timeouts, constraint violations:
        // running again would fail again.
        for code in [102, 208, 229, 547, 1222, 8152, 50000] {
            assert!(!retryable_code(code), "{code}");
        }
    }

    #[test]
    fn driver_errors_are_backend_errors_and_not_retried() {
        let io = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::TimedOut,
            message: "server silent".into(),
        };
        let e = db(io);
        assert!(matches!(e, Error::Backend { .. }), "{e}");
        assert!(e.to_string().contains("server silent"), "{e}");
        assert!(!retryable(&e));
        assert!(!retryable(&Error::StaleLease));
        let timeout = pool(bb8::RunError::TimedOut);
        assert!(timeout.to_string().contains("pool"), "{timeout}");
    }
}
