//! The `[api]` section of a team file ([`ApiSection`]) and its defaults: what `warden serve` reads,
//! checked here; the server turns it into its [`crate::server::api::ApiConfig`] (tokens from the
//! environment win).

use serde::Deserialize;
use std::net::SocketAddr;

/// Default request body limit (bytes).
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Default most events in one `POST /api/world/batch` (`api.max_batch_events`).
pub const DEFAULT_MAX_BATCH_EVENTS: usize = 256;

/// Where `warden serve` listens unless `--listen` or `api.listen` says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// How long a console session lasts by default (`api.session_ttl_seconds`): 8 hours, a shift.
pub const DEFAULT_SESSION_TTL_SECONDS: u64 = 8 * 60 * 60;

/// The default of `api.auth_failures_per_minute`.
pub const DEFAULT_AUTH_FAILURES_PER_MINUTE: u32 = 10;

/// The `[api]` section of a team file. Tokens from the environment win over these.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    /// Full access; `WARDEN_ADMIN_TOKEN` wins over it.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// Read-only access; `WARDEN_READ_TOKEN` wins over it.
    #[serde(default)]
    pub read_token: Option<String>,
    /// Host tokens: each may deliver world events (single and batch), read replies, report
    /// presence and the clock, and halt — never unlock, clear, resume, change goals or answer
    /// asks. For a game server, which should not hold the admin token.
    #[serde(default)]
    pub host_tokens: Vec<String>,
    /// Most events in one `POST /api/world/batch` (default [`DEFAULT_MAX_BATCH_EVENTS`]).
    #[serde(default)]
    pub max_batch_events: Option<usize>,
    /// Where `warden serve` listens unless `--listen` is given.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Largest accepted JSON body in bytes (default [`DEFAULT_BODY_LIMIT`]).
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// How long a browser console session lasts after its login, in seconds (default
    /// [`DEFAULT_SESSION_TTL_SECONDS`], 8 hours).
    #[serde(default)]
    pub session_ttl_seconds: Option<u64>,
    /// Wrong tokens allowed per client address and minute (10× that from all addresses) before
    /// further wrong tokens are refused `429` for the rest of the minute; a right token never is
    /// (default 10; 0 = no limit).
    #[serde(default)]
    pub auth_failures_per_minute: Option<u32>,
    /// Browser origins besides the server's own that may call `/mcp` (`["http://localhost:6274"]`);
    /// a request with any other `Origin` header is refused `403`.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

impl std::fmt::Debug for ApiSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiSection")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("read_token", &self.read_token.as_ref().map(|_| "***"))
            .field("host_tokens", &self.host_tokens.len())
            .field("max_batch_events", &self.max_batch_events)
            .field("listen", &self.listen)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("session_ttl_seconds", &self.session_ttl_seconds)
            .field("auth_failures_per_minute", &self.auth_failures_per_minute)
            .field("allowed_origins", &self.allowed_origins)
            .finish()
    }
}

/// A value of `[api]` that is refused: `key: problem`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ApiSectionError {
    /// The key refused, `api.admin_token` style, or the environment variable it came from
    /// (`WARDEN_ADMIN_TOKEN`).
    pub key: &'static str,
    /// What is wrong with it, such as `must not be empty`.
    pub problem: &'static str,
}

impl ApiSection {
    /// Refuses empty tokens, tokens with surrounding whitespace (a bearer token is trimmed, so they
    /// could never match), a read token equal to the admin token, and a zero body limit.
    ///
    /// # Errors
    ///
    /// [`ApiSectionError`] for the first such value, keyed `api.admin_token`, `api.read_token` or
    /// `api.max_body_bytes`, `api.session_ttl_seconds` or `api.allowed_origins`.
    pub fn validate(&self) -> Result<(), ApiSectionError> {
        let tokens = [
            ("api.admin_token", &self.admin_token),
            ("api.read_token", &self.read_token),
        ];
        for (key, token) in tokens {
            let Some(problem) = token.as_deref().and_then(token_problem) else {
                continue;
            };
            return Err(ApiSectionError { key, problem });
        }
        if self.admin_token.is_some() && self.admin_token == self.read_token {
            return Err(ApiSectionError {
                key: "api.read_token",
                problem: "must differ from api.admin_token",
            });
        }
        for (i, host) in self.host_tokens.iter().enumerate() {
            let problem = if let Some(problem) = token_problem(host) {
                problem
            } else if self.admin_token.as_ref() == Some(host) {
                "each must differ from api.admin_token"
            } else if self.read_token.as_ref() == Some(host) {
                "each must differ from api.read_token"
            } else if self.host_tokens[..i].contains(host) {
                "each must be listed once"
            } else {
                continue;
            };
            return Err(ApiSectionError {
                key: "api.host_tokens",
                problem,
            });
        }
        if self.max_batch_events == Some(0) {
            return Err(ApiSectionError {
                key: "api.max_batch_events",
                problem: "must be at least 1",
            });
        }
        if self.max_body_bytes == Some(0) {
            return Err(ApiSectionError {
                key: "api.max_body_bytes",
                problem: "must be at least 1",
            });
        }
        if self.session_ttl_seconds == Some(0) {
            return Err(ApiSectionError {
                key: "api.session_ttl_seconds",
                problem: "must be at least 1",
            });
        }
        let origin_ok = |o: &String| {
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(|host| !host.is_empty() && !host.contains('/'))
        };
        if !self.allowed_origins.iter().all(origin_ok) {
            return Err(ApiSectionError {
                key: "api.allowed_origins",
                problem: "each must be a browser origin: http:// or https://, a host and an \
                          optional port, no path (such as \"http://localhost:6274\")",
            });
        }
        Ok(())
    }
}

/// Why a token can never match a bearer token (which is trimmed), if it cannot.
pub(crate) fn token_problem(token: &str) -> Option<&'static str> {
    if token.trim().is_empty() {
        Some("must not be empty")
    } else if token.trim() != token {
        Some("must not start or end with whitespace")
    } else {
        None
    }
}
