//! [`ApiError`]: every refusal as `{"error": …}` with its status, and the JSON, query and path
//! rejections turned into it.

use actix_web::{
    error::{JsonPayloadError, QueryPayloadError},
    http::{header, StatusCode},
    HttpRequest, HttpResponse, ResponseError,
};
use warden_actors::ControlError;

/// An API error: a status and a message, sent as `{"error": message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The response's status (a `401` also carries `WWW-Authenticate: Bearer`).
    pub status: StatusCode,
    /// The text of `{"error": …}`, and the error's `Display`.
    pub message: String,
    /// Seconds for a `Retry-After` header (a `429`).
    pub retry_after: Option<u64>,
    /// `Set-Cookie` values sent with the error (the removal of cookies another site tossed in).
    pub set_cookies: Vec<String>,
}

impl ApiError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
            set_cookies: Vec::new(),
        }
    }

    /// `429`: a wrong token from `addr` past `api.auth_failures_per_minute` (that address's, or
    /// the global one); wrong tokens are answered `401` again in `refused.seconds`. Only ever a
    /// wrong token's answer: a right token is never refused for a rate.
    pub(crate) fn too_many_failures(
        addr: Option<std::net::IpAddr>,
        refused: crate::server::auth_limit::Refused,
    ) -> Self {
        let who = match (refused.everyone, addr) {
            (true, _) => "from all addresses together".to_owned(),
            (false, Some(addr)) => format!("from {addr}"),
            (false, None) => "from this address".to_owned(),
        };
        let seconds = refused.seconds;
        ApiError {
            retry_after: Some(seconds),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "too many wrong tokens {who}: wrong tokens are refused for {seconds} s more \
                     (api.auth_failures_per_minute; the right token is always accepted)"
                ),
            )
        }
    }

    pub(crate) fn unknown_agent(key: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("unknown agent {key}"))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if self.status == StatusCode::UNAUTHORIZED {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        for cookie in &self.set_cookies {
            response.append_header((header::SET_COOKIE, cookie.as_str()));
        }
        response.json(serde_json::json!({ "error": self.message }))
    }
}

impl From<ControlError> for ApiError {
    fn from(err: ControlError) -> Self {
        let status = match err {
            ControlError::NotActive | ControlError::NotStopped | ControlError::LockedOut => {
                StatusCode::CONFLICT
            }
            ControlError::Closed | ControlError::NotDurable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, err.to_string())
    }
}

pub(crate) fn json_error(err: JsonPayloadError, _req: &HttpRequest) -> actix_web::Error {
    let api = match &err {
        JsonPayloadError::Overflow { limit }
        | JsonPayloadError::OverflowKnownLength { limit, .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {limit} bytes"),
        ),
        JsonPayloadError::ContentType => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type: application/json",
        ),
        JsonPayloadError::Deserialize(e) => {
            ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}"))
        }
        other => ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("bad request body: {other}"),
        ),
    };
    api.into()
}

pub(crate) fn query_error(err: QueryPayloadError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::new(StatusCode::BAD_REQUEST, format!("bad query string: {err}")).into()
}

pub(crate) fn path_error(err: actix_web::error::PathError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::new(StatusCode::BAD_REQUEST, format!("bad path: {err}")).into()
}
