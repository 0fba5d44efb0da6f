//! Who a request is: bearer tokens (compared in constant time), the console's session cookie,
//! and the extractors that admit a class of token ([`Reader`], [`Admin`], [`Host`], [`ReplyReader`]).

use crate::server::api::*;
use actix_web::{
    dev::Payload,
    http::{header, StatusCode},
    web, FromRequest, HttpRequest,
};

/// Whether `given` is the `configured` token, compared in constant time (`subtle`: no early exit on
/// the first differing byte; only the length can show).
pub(crate) fn token_matches(configured: &str, given: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(configured.as_bytes().ct_eq(given.as_bytes()))
}

/// The credentials of an `Authorization: Bearer <token>` header; the scheme is case-insensitive
/// (RFC 7235 §2.1), surrounding whitespace is ignored.
pub(crate) fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Which token a request carried (or the console session was opened with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The read token: `GET` only.
    Read,
    /// The admin token: everything.
    Admin,
    /// A host token (`api.host_tokens`), a game server's: world events (single and batch),
    /// replies, presence, clock and halts ([`Host`], [`ReplyReader`]); no other route, no console
    /// login, no `/mcp`.
    Host,
}

/// What `token` opens: the admin token, the read token, a host token, or nothing. Every configured
/// token is compared (in constant time, none skipped), so the time taken does not tell which one
/// matched.
pub(crate) fn access_of_token(config: &ApiConfig, token: &str) -> Option<Access> {
    let matches = |configured: &Option<String>| {
        configured
            .as_deref()
            .is_some_and(|c| token_matches(c, token))
    };
    let admin = matches(&config.admin_token);
    let read = matches(&config.read_token);
    let host = config
        .host_tokens
        .iter()
        .fold(false, |found, c| token_matches(c, token) | found);
    if admin {
        Some(Access::Admin)
    } else if read {
        Some(Access::Read)
    } else if host {
        Some(Access::Host)
    } else {
        None
    }
}

/// Who a request is: its bearer token or, without an `Authorization` header, its console session
/// cookie ([`crate::server::console`]). A cookie-authenticated request other than `GET`/`HEAD`
/// must carry `X-CSRF-Token` equal to its session's token (403 otherwise).
pub(crate) fn access_of(req: &HttpRequest) -> Result<Access, ApiError> {
    let state = req
        .app_data::<web::Data<ApiState>>()
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "api state missing"))?;
    let Some(authorization) = req.headers().get(header::AUTHORIZATION) else {
        if let Some(access) = crate::server::console::cookie_access(state, req)? {
            return Ok(access);
        }
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing bearer token",
        ));
    };
    let token = authorization
        .to_str()
        .ok()
        .and_then(bearer_token)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "missing bearer token"))?;
    // The token is judged first: a right one is never refused for others' (or its own address's)
    // wrong ones. Only a wrong token is counted, and refused `429` past the limit.
    access_of_token(&state.config, token).ok_or_else(|| wrong_token(state, req))
}

/// The answer to a wrong token: counted (`api.auth_failures_per_minute`), `401`, or `429` past
/// the limit of this address or of all of them.
pub(crate) fn wrong_token(state: &ApiState, req: &HttpRequest) -> ApiError {
    let addr = req.peer_addr().map(|a| a.ip());
    match state.auth_failures.failed(addr) {
        None => ApiError::new(StatusCode::UNAUTHORIZED, "invalid bearer token"),
        Some(refused) => {
            if refused.first {
                tracing::warn!(
                    ?addr,
                    everyone = refused.everyone,
                    seconds = refused.seconds,
                    "wrong tokens past api.auth_failures_per_minute: refused 429 for the rest \
                     of the minute (right tokens are still accepted)"
                );
            }
            ApiError::too_many_failures(addr, refused)
        }
    }
}

/// Extractor: a request with the read or the admin token (403 for a host token).
#[derive(Debug)]
pub struct Reader;

/// Extractor: a request with the admin token (403 for the read token or a host token).
#[derive(Debug)]
pub struct Admin;

/// Extractor: a request with the admin token or a host token (403 for the read token): world
/// events, presence, clock, halts. Holds which of the two it was (a halt is journaled with who
/// made it).
#[derive(Debug)]
pub struct Host(pub Access);

impl Host {
    /// The operator name journaled for what this request does: [`API_OPERATOR`] for the admin
    /// token, [`HOST_OPERATOR`] for a host token.
    pub fn operator(&self) -> &'static str {
        match self.0 {
            Access::Host => HOST_OPERATOR,
            Access::Admin | Access::Read => API_OPERATOR,
        }
    }
}

/// Extractor: a request with any token (`GET /api/replies`: the host reads them, the read token
/// may watch them).
#[derive(Debug)]
pub struct ReplyReader;

/// The `403` of a host token on a route not open to it.
pub(crate) fn host_refused() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "a host token may only deliver world events, read replies, report presence and the \
         clock, and halt",
    )
}

impl FromRequest for Reader {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(match access_of(req) {
            Ok(Access::Admin | Access::Read) => Ok(Reader),
            Ok(Access::Host) => Err(host_refused()),
            Err(err) => Err(err),
        })
    }
}

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(match access_of(req) {
            Ok(Access::Admin) => Ok(Admin),
            Ok(Access::Read) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "this call needs the admin token",
            )),
            Ok(Access::Host) => Err(host_refused()),
            Err(err) => Err(err),
        })
    }
}

impl FromRequest for Host {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(match access_of(req) {
            Ok(access @ (Access::Admin | Access::Host)) => Ok(Host(access)),
            // The text the read token has always got here (the CLI shows it to an operator, who
            // needs the admin token; a host token is a game server's).
            Ok(Access::Read) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "this call needs the admin token",
            )),
            Err(err) => Err(err),
        })
    }
}

impl FromRequest for ReplyReader {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(access_of(req).map(|_| ReplyReader))
    }
}
