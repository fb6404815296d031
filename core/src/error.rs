//! The one error type of relayq (SPEC X1).

use std::borrow::Cow;

/// The result type used throughout relayq.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a relayq call.
///
/// Each variant is a kind the conformance suite asserts on; backends map their own
/// errors into [`Error::Backend`], keeping the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before anything was stored (SPEC E4, C1, X2).
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The name of the offending field, e.g. `queue`, `payload`, `limit`.
        field: &'static str,
        /// Why it was rejected.
        reason: Cow<'static, str>,
    },
    /// The lease token no longer holds the job: it expired and was taken over, it was
    /// already settled, or the job was cancelled (SPEC L1).
    #[error("stale lease: the job is no longer held by this token")]
    StaleLease,
    /// A job was added to a batch stage lower than the highest stage already released
    /// (SPEC B3).
    #[error("stage {stage} is closed: stage {released} of the batch is already released")]
    StageClosed {
        /// The stage that was asked for.
        stage: i32,
        /// The highest stage already released.
        released: i32,
    },
    /// The job or batch does not exist (or belongs to another queue).
    #[error("{what} not found")]
    NotFound {
        /// What was looked for, e.g. `job 42 in queue "mail"`.
        what: String,
    },
    /// A wait ran out of time (SPEC B5).
    #[error("timed out: {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
    },
    /// The backend failed: connection, server or protocol error (SPEC X1, X3).
    #[error("backend error{}: {source}", if *transient { " (transient)" } else { "" })]
    Backend {
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
        /// Whether the same call may succeed if made again: the connection was lost or
        /// refused, the server aborted the transaction to resolve a race (deadlock,
        /// serialization failure), it was busy, loading or shutting down, or a time
        /// limit ran out. Each backend decides from its driver's typed errors.
        transient: bool,
    },
}

/// What kind of failure an [`Error`] is, the same on every backend: for matching
/// without caring which backend or driver produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidInput`].
    InvalidInput,
    /// [`Error::StaleLease`].
    StaleLease,
    /// [`Error::StageClosed`].
    StageClosed,
    /// [`Error::NotFound`].
    NotFound,
    /// [`Error::Timeout`].
    Timeout,
    /// An [`Error::Backend`] that may pass if the call is made again.
    Transient,
    /// An [`Error::Backend`] that will not pass by itself.
    Backend,
}

impl ErrorKind {
    /// The kind in `snake_case`, as metrics label it: `transient`, `stale_lease`, ...
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "invalid_input",
            Self::StaleLease => "stale_lease",
            Self::StageClosed => "stage_closed",
            Self::NotFound => "not_found",
            Self::Timeout => "timeout",
            Self::Transient => "transient",
            Self::Backend => "backend",
        }
    }
}

impl Error {
    /// An [`Error::InvalidInput`] for `field`.
    pub fn invalid(field: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        Self::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    /// An [`Error::Backend`] wrapping `source`, not transient.
    pub fn backend(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self::Backend {
            source: source.into(),
            transient: false,
        }
    }

    /// A transient [`Error::Backend`] wrapping `source`: the same call may succeed if
    /// made again.
    pub fn transient(
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::Backend {
            source: source.into(),
            transient: true,
        }
    }

    /// What kind of failure this is.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidInput { .. } => ErrorKind::InvalidInput,
            Self::StaleLease => ErrorKind::StaleLease,
            Self::StageClosed { .. } => ErrorKind::StageClosed,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::Backend {
                transient: true, ..
            } => ErrorKind::Transient,
            Self::Backend { .. } => ErrorKind::Backend,
        }
    }

    /// Whether this is a backend failure that may pass if the call is made again.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        self.kind() == ErrorKind::Transient
    }

    /// An [`Error::NotFound`] describing `what`.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::NotFound { what: what.into() }
    }

    /// The field named by an [`Error::InvalidInput`], if this is one.
    #[must_use]
    pub fn invalid_field(&self) -> Option<&'static str> {
        match self {
            Self::InvalidInput { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The driver's error inside an [`Error::Backend`], for a backend's own
    /// classification (`downcast_ref` to its driver's type).
    #[must_use]
    pub fn backend_source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Self::Backend { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }

    /// Whether this is [`Error::StaleLease`].
    #[must_use]
    pub fn is_stale_lease(&self) -> bool {
        matches!(self, Self::StaleLease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_say_whether_they_are_transient() {
        let e = Error::transient("connection refused");
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(e.is_transient());
        assert_eq!(
            e.to_string(),
            "backend error (transient): connection refused"
        );
        let e = Error::backend("syntax error");
        assert_eq!(e.kind(), ErrorKind::Backend);
        assert!(!e.is_transient());
        assert_eq!(e.to_string(), "backend error: syntax error");
        assert_eq!(Error::StaleLease.kind(), ErrorKind::StaleLease);
        assert!(!Error::invalid("queue", "empty").is_transient());
    }
}
