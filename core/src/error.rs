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
    #[error("backend error: {source}")]
    Backend {
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    /// An [`Error::InvalidInput`] for `field`.
    pub fn invalid(field: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        Self::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    /// An [`Error::Backend`] wrapping `source`.
    pub fn backend(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self::Backend {
            source: source.into(),
        }
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

    /// Whether this is [`Error::StaleLease`].
    #[must_use]
    pub fn is_stale_lease(&self) -> bool {
        matches!(self, Self::StaleLease)
    }
}
