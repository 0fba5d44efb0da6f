//! The authenticated HTTP admin API (actix-web).
//!
//! Every `/api` call and `/metrics` need `Authorization: Bearer TOKEN`: the read token or the admin
//! token for `GET`, the admin token for every mutating call (401 without a valid token, 403 for the
//! read token on a mutating call). Tokens are compared in constant time. With no token configured
//! nothing under `/api` (nor `/metrics`) is reachable. `GET /healthz` is open. A request without an
//! `Authorization` header may instead carry the browser console's session cookie
//! ([`crate::server::console`]): the same roles, and `X-CSRF-Token` on every call but `GET`.
//!
//! Unlock, emergency clear and history reset come only from here (or the CLI / embedding code),
//! never from an agent's event content or model output: an event is data, delivered to the agent's
//! mailbox (or refused while it is locked out) and never interpreted.
//!
//! Errors are JSON `{"error": "..."}`: 400 malformed JSON (with serde's message), query or path, or
//! ambiguous console cookies, 401, 403, 404 unknown agent or intervention or no such route, 405
//! (with `Allow`) a served path asked with another method, 409 the agent refuses (locked out,
//! stopped, not locked out), 413 body larger than [`ApiConfig::body_limit`], 429 mailbox full or a
//! wrong token past `api.auth_failures_per_minute` (a right token is never refused for a rate:
//! [`crate::server::auth_limit`]), 503 agent shut down (or no event stream configured).
//!
//! [`ROUTES`] is the one list of what is served: [`configure`] registers exactly it, and the
//! OpenAPI document ([`OPENAPI`], `GET /api/openapi.json`) is tested against it.

mod auth;
mod config;
mod error;
mod listen;
mod state;
mod table;

pub(crate) use auth::*;
pub use auth::{Access, Admin, Host, Reader, ReplyReader};
pub use config::ApiConfig;
pub use error::ApiError;
pub(crate) use error::*;
pub use listen::{api_workers, bind, check_listen, listen_on, serve, ServeError};
pub use state::ApiState;
pub use table::{allowed_methods, configure, OPENAPI, ROUTES};

pub use crate::server::routes::{
    agents::GoalsBody,
    controls::UnlockBody,
    events::{
        EventsQuery, PostEventQuery, Queued, RecentQuery, IDEMPOTENCY_KEY, MAX_WAIT_SECONDS,
        RECENT_DEFAULT, RECENT_MAX,
    },
    halts::{HaltAckBody, LiftBody},
    interventions::{AnswerBody, AnswerReply},
    memories::{AboutQuery, Forgotten, MemoriesAnswer, MemoriesQuery},
};
// The handlers and their helpers, for the route table and for one another.
pub(crate) use crate::server::routes::{
    agents::*, controls::*, events::*, fleet::*, halts::*, interventions::*, memories::*, meta::*,
    world::*,
};
pub(crate) use crate::team::api::token_problem;
pub use crate::team::api::{
    ApiSection, ApiSectionError, DEFAULT_BODY_LIMIT, DEFAULT_LISTEN, DEFAULT_MAX_BATCH_EVENTS,
};

/// The operator name journaled for calls made with the admin token.
pub const API_OPERATOR: &str = "api:admin";
/// The operator name journaled for what a host token (`api.host_tokens`) does over the API: a
/// halt by the game server is told from the operator's.
pub const HOST_OPERATOR: &str = "api:host";

/// What a handler answers.
pub(crate) type Handled = Result<actix_web::HttpResponse, ApiError>;

#[cfg(test)]
mod tests {
    use super::{auth::bearer_token, token_matches, ApiConfig, ApiSection, DEFAULT_BODY_LIMIT};

    #[test]
    fn tokens_match_whole_values_only() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abc", "abd"));
        assert!(!token_matches("abc", "ab"));
        assert!(!token_matches("abc", "abc\0"));
        assert!(!token_matches("", "a"));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for header in ["Bearer t0k", "bearer t0k", "BEARER  t0k ", " BeArEr t0k"] {
            assert_eq!(bearer_token(header), Some("t0k"), "{header:?}");
        }
        for header in ["Basic t0k", "Bearer", "Bearer   ", "Bearert0k", "t0k"] {
            assert_eq!(bearer_token(header), None, "{header:?}");
        }
    }

    #[test]
    fn environment_tokens_win_over_the_file() {
        let section = ApiSection {
            admin_token: Some("file-admin".into()),
            read_token: Some("file-read".into()),
            host_tokens: vec!["file-host".into()],
            max_batch_events: None,
            listen: None,
            max_body_bytes: Some(100),
            session_ttl_seconds: None,
            auth_failures_per_minute: None,
            allowed_origins: Vec::new(),
        };
        let env = |admin: Option<&'static str>| {
            move |name: &str| match name {
                "WARDEN_ADMIN_TOKEN" => admin.map(str::to_owned),
                _ => None,
            }
        };
        let config = ApiConfig::resolve(&section, env(Some("env-admin")));
        assert_eq!(config.admin_token.as_deref(), Some("env-admin"));
        assert_eq!(config.read_token.as_deref(), Some("file-read"));
        assert_eq!(config.body_limit, 100);
        // An empty variable counts as unset.
        let config = ApiConfig::resolve(&section, env(Some("")));
        assert_eq!(config.admin_token.as_deref(), Some("file-admin"));
        let config = ApiConfig::resolve(&ApiSection::default(), env(None));
        assert_eq!(config.admin_token, None);
        assert_eq!(config.body_limit, DEFAULT_BODY_LIMIT);
    }

    #[test]
    fn environment_tokens_are_validated_like_the_files() {
        let section = |admin: Option<&str>, read: Option<&str>| ApiSection {
            admin_token: admin.map(str::to_owned),
            read_token: read.map(str::to_owned),
            ..ApiSection::default()
        };
        let env = |admin: Option<&'static str>, read: Option<&'static str>| {
            move |name: &str| match name {
                "WARDEN_ADMIN_TOKEN" => admin.map(str::to_owned),
                "WARDEN_READ_TOKEN" => read.map(str::to_owned),
                _ => None,
            }
        };
        let cases = [
            (
                section(None, None),
                env(Some(" adm"), None),
                "WARDEN_ADMIN_TOKEN: must not start or end with whitespace",
            ),
            (
                section(None, None),
                env(Some("adm"), Some("rd\n")),
                "WARDEN_READ_TOKEN: must not start or end with whitespace",
            ),
            (
                section(None, None),
                env(Some("   "), None),
                "WARDEN_ADMIN_TOKEN: must not be empty",
            ),
            (
                section(None, None),
                env(Some("x"), Some("x")),
                "WARDEN_READ_TOKEN: must differ from WARDEN_ADMIN_TOKEN",
            ),
            (
                section(None, Some("x")),
                env(Some("x"), None),
                "api.read_token: must differ from WARDEN_ADMIN_TOKEN",
            ),
            (
                section(Some("x"), None),
                env(None, Some("x")),
                "WARDEN_READ_TOKEN: must differ from api.admin_token",
            ),
            (
                ApiSection {
                    host_tokens: vec!["h".into()],
                    ..ApiSection::default()
                },
                env(Some("h"), None),
                "api.host_tokens: each must differ from WARDEN_ADMIN_TOKEN",
            ),
            (
                ApiSection {
                    host_tokens: vec!["h".into()],
                    ..ApiSection::default()
                },
                env(Some("a"), Some("h")),
                "api.host_tokens: each must differ from WARDEN_READ_TOKEN",
            ),
        ];
        for (section, env, expected) in cases {
            let err = ApiConfig::try_resolve(&section, env).unwrap_err();
            assert_eq!(err.to_string(), expected);
        }
        let config = ApiConfig::try_resolve(&section(Some("f"), Some("r")), env(Some("e"), None));
        assert_eq!(config.unwrap().admin_token.as_deref(), Some("e"));
    }
}
