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
    #[error("{}backend error{}: {source}", place(*backend, *op), state(*transient, *retries_spent))]
    Backend {
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
        /// Whether the same call may succeed if made again: the connection was lost or
        /// refused, the server aborted the transaction to resolve a race (deadlock,
        /// serialization failure), it was busy, loading or shutting down, or a time
        /// limit ran out. Each backend decides from its driver's typed errors.
        transient: bool,
        /// The backend the error came from (`postgres`), when it said.
        backend: Option<&'static str>,
        /// The operation that failed (`claim`), when known: the public methods of the
        /// backend traits name themselves.
        op: Option<&'static str>,
        /// The error was transient, but the backend already ran the call again as
        /// often as its retry policy allows: callers should not retry it in a loop of
        /// their own ([`ErrorKind::Persistent`]).
        retries_spent: bool,
    },
    /// The backend's schema is missing, or at another version than this code's
    /// (SPEC X1): nothing was done. Migrating (`relayq::connect`, or the backend's
    /// `migrate`) creates or updates a missing or older one; a newer one needs the
    /// newer relayq that wrote it.
    #[error("{}", schema_message(schema, *state, *found, *wanted))]
    Schema {
        /// The schema (or key prefix) the backend looked in.
        schema: String,
        /// Missing, older or newer.
        state: SchemaState,
        /// The version found, when there is one.
        found: Option<usize>,
        /// The version this code reads and writes.
        wanted: usize,
    },
}

/// What is wrong with a backend's schema ([`Error::Schema`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaState {
    /// No relayq tables (or keys) there.
    Missing,
    /// An older version: migrate to bring it up to date.
    Older,
    /// A newer version, written by a newer relayq.
    Newer,
}

fn place(backend: Option<&str>, op: Option<&str>) -> String {
    match (backend, op) {
        (Some(b), Some(op)) => format!("{b} {op}: "),
        (Some(x), None) | (None, Some(x)) => format!("{x}: "),
        (None, None) => String::new(),
    }
}

fn state(transient: bool, retries_spent: bool) -> &'static str {
    match (transient, retries_spent) {
        (true, _) => " (transient)",
        (false, true) => " (transient, retries spent)",
        (false, false) => "",
    }
}

fn schema_message(schema: &str, state: SchemaState, found: Option<usize>, wanted: usize) -> String {
    match state {
        SchemaState::Missing => format!(
            "schema {schema} holds no relayq tables: nothing was ever queued here, or the \
             database is not the one meant (migrate() creates them; relayq::connect and the \
             CLI's commands that write migrate)"
        ),
        SchemaState::Older => format!(
            "schema {schema} is at {}, this relayq reads version {wanted}: run migrate() (or \
             a CLI command that writes) to bring it up to date",
            found.map_or("an older version".to_owned(), |v| format!("version {v}"))
        ),
        SchemaState::Newer => format!(
            "schema {schema} is at version {}, newer than this relayq ({wanted}): use the \
             newer relayq that wrote it",
            found.unwrap_or(0)
        ),
    }
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
    /// An [`Error::Backend`] that was transient, but the backend already retried it as
    /// often as its policy allows: retrying again at once is unlikely to help.
    Persistent,
    /// [`Error::Schema`].
    Schema,
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
            Self::Persistent => "persistent",
            Self::Schema => "schema",
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
            backend: None,
            op: None,
            retries_spent: false,
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
            backend: None,
            op: None,
            retries_spent: false,
        }
    }

    /// An [`Error::Schema`] for `schema`, at version `found` (`None`: no tables) where
    /// this code wants `wanted`.
    pub fn schema(schema: impl Into<String>, found: Option<usize>, wanted: usize) -> Self {
        let state = match found {
            None | Some(0) => SchemaState::Missing,
            Some(v) if v < wanted => SchemaState::Older,
            Some(_) => SchemaState::Newer,
        };
        Self::Schema {
            schema: schema.into(),
            state,
            found,
            wanted,
        }
    }

    /// The same error, saying which backend it came from (an [`Error::Backend`] that
    /// names none yet); other errors are returned as they are.
    #[must_use]
    pub fn from_backend(mut self, name: &'static str) -> Self {
        if let Self::Backend { backend, .. } = &mut self {
            backend.get_or_insert(name);
        }
        self
    }

    /// The same error, saying which operation failed (an [`Error::Backend`] that
    /// names none yet); other errors are returned as they are.
    #[must_use]
    pub fn during(mut self, operation: &'static str) -> Self {
        if let Self::Backend { op, .. } = &mut self {
            op.get_or_insert(operation);
        }
        self
    }

    /// The same error after the backend's own retries of it ran out: a transient
    /// [`Error::Backend`] becomes [`ErrorKind::Persistent`], so that the caller's own
    /// retry loop does not multiply the tries; other errors are returned as they are.
    #[must_use]
    pub fn retries_spent(mut self) -> Self {
        if let Self::Backend {
            transient,
            retries_spent,
            ..
        } = &mut self
            && *transient
        {
            *transient = false;
            *retries_spent = true;
        }
        self
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
            Self::Backend {
                retries_spent: true,
                ..
            } => ErrorKind::Persistent,
            Self::Backend { .. } => ErrorKind::Backend,
            Self::Schema { .. } => ErrorKind::Schema,
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

    #[test]
    fn backend_errors_name_the_backend_and_the_operation_once() {
        let e = Error::transient("connection reset")
            .from_backend("postgres")
            .during("claim")
            .from_backend("outer")
            .during("outer");
        assert_eq!(
            e.to_string(),
            "postgres claim: backend error (transient): connection reset"
        );
        assert_eq!(
            Error::backend("x").during("seal").to_string(),
            "seal: backend error: x"
        );
    }

    #[test]
    fn spent_retries_make_a_transient_error_persistent() {
        let e = Error::transient("deadlock").retries_spent();
        assert_eq!(e.kind(), ErrorKind::Persistent);
        assert!(!e.is_transient());
        assert_eq!(
            e.to_string(),
            "backend error (transient, retries spent): deadlock"
        );
        let e = Error::backend("syntax").retries_spent();
        assert_eq!(e.kind(), ErrorKind::Backend);
    }

    #[test]
    fn schema_errors_say_what_to_do() {
        let e = Error::schema("relayq", None, 6);
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert!(e.to_string().contains("holds no relayq tables"), "{e}");
        let e = Error::schema("relayq", Some(4), 6);
        assert!(matches!(
            e,
            Error::Schema {
                state: SchemaState::Older,
                ..
            }
        ));
        assert!(e.to_string().contains("run migrate()"), "{e}");
        let e = Error::schema("relayq", Some(7), 6);
        assert!(matches!(
            e,
            Error::Schema {
                state: SchemaState::Newer,
                ..
            }
        ));
        assert!(e.to_string().contains("newer relayq"), "{e}");
    }
}
