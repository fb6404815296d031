//! Errors as the API answers them: a status and `{"error": "...", "field": ...}`.

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use relayq_core::{Error, ErrorKind};
use serde_json::json;

/// An API error: what the client did wrong (4xx) or what failed (5xx).
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    field: Option<&'static str>,
}

impl ApiError {
    /// 400 on `field`.
    pub(crate) fn invalid(field: &'static str, reason: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid {field}: {reason}"),
            field: Some(field),
        }
    }

    pub(crate) fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            field: None,
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = match e.kind() {
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::StaleLease | ErrorKind::StageClosed => StatusCode::CONFLICT,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Transient => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            // The full chain goes to the log; the client gets the top line only.
            tracing::warn!(error = %e, "relayq-dashboard: backend call failed");
        }
        Self {
            status,
            field: e.invalid_field(),
            message: e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.message, "field": self.field });
        (self.status, Json(body)).into_response()
    }
}

/// What API handlers return.
pub(crate) type ApiResult<T> = Result<T, ApiError>;
