//! [`probe`]: a server backend's first connection, bounded in time, so that a server
//! that cannot be reached is reported within seconds with the driver's own cause
//! (SPEC X4): a pool alone retries a refused connection until its acquire timeout and
//! then says only that it timed out.

use std::{future::Future, time::Duration};

use crate::{Error, Result};

/// How long a backend's first connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `connect` for at most [`CONNECT_TIMEOUT`]: its value, its error through `map`,
/// or a transient error saying that `server` (as in "the PostgreSQL server at
/// db:5432") gave no answer in time.
///
/// # Errors
/// As above.
pub async fn probe<T, E>(
    server: &str,
    connect: impl Future<Output = std::result::Result<T, E>>,
    map: impl FnOnce(E) -> Error,
) -> Result<T> {
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(done) => done.map_err(map),
        Err(_) => Err(Error::transient(format!(
            "no answer from {server} within {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_is_a_transient_error_naming_it() {
        let never = std::future::pending::<std::result::Result<(), String>>();
        let e = probe("the test server at h:1", never, Error::backend)
            .await
            .unwrap_err();
        assert!(e.is_transient());
        assert_eq!(
            e.to_string(),
            "backend error (transient): no answer from the test server at h:1 within 5 s"
        );
    }

    #[tokio::test]
    async fn the_drivers_own_error_is_mapped() {
        let refused = async { Err::<(), _>("refused") };
        let e = probe("x", refused, Error::transient).await.unwrap_err();
        assert_eq!(e.to_string(), "backend error (transient): refused");
    }
}
