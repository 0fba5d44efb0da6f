//! [`ApiConfig`]: the tokens and limits the API serves with, resolved from a team file's `[api]`
//! and the environment.

use crate::server::api::*;

/// Tokens and limits.
#[derive(Clone, Default)]
pub struct ApiConfig {
    /// Full access (mutating calls). `WARDEN_ADMIN_TOKEN`.
    pub admin_token: Option<String>,
    /// Read-only access (`GET`).
    pub read_token: Option<String>,
    /// Host tokens (`api.host_tokens`): a game server's access — world events (single and batch),
    /// replies, presence, clock and halts; nothing else (see [`Access::Host`]).
    pub host_tokens: Vec<String>,
    /// Largest accepted JSON body in bytes (0 = [`DEFAULT_BODY_LIMIT`]).
    pub body_limit: usize,
    /// Most events in one `POST /api/world/batch` (0 = [`DEFAULT_MAX_BATCH_EVENTS`]).
    pub max_batch_events: usize,
    /// How long a console session lasts after its login, in seconds (0 =
    /// [`crate::server::console::DEFAULT_SESSION_TTL_SECONDS`]).
    pub session_ttl_seconds: u64,
    /// Wrong tokens allowed per client address and minute (10× that from all addresses) before
    /// further wrong tokens are refused `429` for the rest of the minute; a right token never is
    /// (`None`: 10; `Some(0)`: no limit). See `api.auth_failures_per_minute`.
    pub auth_failures_per_minute: Option<u32>,
    /// Browser origins (`http://localhost:6274`) that may call `/mcp` besides the server's own
    /// (`api.allowed_origins`): a request with another `Origin` is refused `403`.
    pub allowed_origins: Vec<String>,
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("read_token", &self.read_token.as_ref().map(|_| "***"))
            .field("host_tokens", &self.host_tokens.len())
            .field("body_limit", &self.body_limit)
            .field("max_batch_events", &self.max_batch_events)
            .field("session_ttl_seconds", &self.session_ttl_seconds)
            .field("auth_failures_per_minute", &self.auth_failures_per_minute)
            .field("allowed_origins", &self.allowed_origins)
            .finish()
    }
}

impl ApiConfig {
    /// Admin token from `WARDEN_ADMIN_TOKEN`, read token from `WARDEN_READ_TOKEN` (empty = unset).
    pub fn from_env() -> Self {
        Self::resolve(&ApiSection::default(), |name| std::env::var(name).ok())
    }

    /// A team file's `[api]` section under the environment: `WARDEN_ADMIN_TOKEN` and
    /// `WARDEN_READ_TOKEN`, when set and not empty, win over `api.admin_token` and `api.read_token`.
    /// `env` looks a variable up (`|name| std::env::var(name).ok()`).
    /// Unvalidated: `warden serve` uses [`ApiConfig::try_resolve`].
    pub fn resolve(section: &ApiSection, env: impl Fn(&str) -> Option<String>) -> Self {
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        ApiConfig {
            admin_token: var("WARDEN_ADMIN_TOKEN").or_else(|| section.admin_token.clone()),
            read_token: var("WARDEN_READ_TOKEN").or_else(|| section.read_token.clone()),
            host_tokens: section.host_tokens.clone(),
            body_limit: section.max_body_bytes.unwrap_or(DEFAULT_BODY_LIMIT),
            max_batch_events: section.max_batch_events.unwrap_or(DEFAULT_MAX_BATCH_EVENTS),
            session_ttl_seconds: section.session_ttl_seconds.unwrap_or(0),
            auth_failures_per_minute: section.auth_failures_per_minute,
            allowed_origins: section.allowed_origins.clone(),
        }
    }

    /// [`ApiConfig::resolve`], and the tokens from the environment are checked with the rules of
    /// [`ApiSection::validate`] (not empty, no surrounding whitespace, read differs from admin), the
    /// error naming the variable (`WARDEN_ADMIN_TOKEN: must not start or end with whitespace`).
    ///
    /// # Errors
    ///
    /// [`ApiSectionError`] keyed by the variable (or by `api.read_token` when the file's read
    /// token equals the environment's admin token).
    pub fn try_resolve(
        section: &ApiSection,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ApiSectionError> {
        const ADMIN: &str = "WARDEN_ADMIN_TOKEN";
        const READ: &str = "WARDEN_READ_TOKEN";
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        let (admin_env, read_env) = (var(ADMIN), var(READ));
        for (key, token) in [(ADMIN, &admin_env), (READ, &read_env)] {
            if let Some(token) = token {
                token_problem(token)
                    .map_or(Ok(()), |problem| Err(ApiSectionError { key, problem }))?;
            }
        }
        let config = Self::resolve(section, |name| match name {
            ADMIN => admin_env.clone(),
            READ => read_env.clone(),
            _ => None,
        });
        if config.admin_token.is_some() && config.admin_token == config.read_token {
            let (key, problem) = match (admin_env.is_some(), read_env.is_some()) {
                (true, true) => (READ, "must differ from WARDEN_ADMIN_TOKEN"),
                (true, false) => ("api.read_token", "must differ from WARDEN_ADMIN_TOKEN"),
                (false, true) => (READ, "must differ from api.admin_token"),
                (false, false) => ("api.read_token", "must differ from api.admin_token"),
            };
            return Err(ApiSectionError { key, problem });
        }
        // A host token equal to an admin or read token from the environment would open two
        // classes at once: refused like the read token equal to the admin token.
        for host in &config.host_tokens {
            let problem = if admin_env.as_ref() == Some(host) {
                "each must differ from WARDEN_ADMIN_TOKEN"
            } else if read_env.as_ref() == Some(host) {
                "each must differ from WARDEN_READ_TOKEN"
            } else {
                // Equal to the file's tokens: refused by `ApiSection::validate`.
                continue;
            };
            return Err(ApiSectionError {
                key: "api.host_tokens",
                problem,
            });
        }
        Ok(config)
    }

    /// Most events one `POST /api/world/batch` may carry.
    pub(crate) fn batch_limit(&self) -> usize {
        match self.max_batch_events {
            0 => DEFAULT_MAX_BATCH_EVENTS,
            n => n,
        }
    }

    pub(crate) fn limit(&self) -> usize {
        if self.body_limit == 0 {
            DEFAULT_BODY_LIMIT
        } else {
            self.body_limit
        }
    }

    /// Wrong tokens allowed per address and minute (0: no limit).
    pub(crate) fn auth_failure_limit(&self) -> u32 {
        self.auth_failures_per_minute
            .unwrap_or(crate::team::api::DEFAULT_AUTH_FAILURES_PER_MINUTE)
    }

    /// How long a console session lasts.
    pub(crate) fn session_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_secs(match self.session_ttl_seconds {
            0 => crate::team::api::DEFAULT_SESSION_TTL_SECONDS,
            n => n,
        })
    }
}

impl crate::team::TeamFile {
    /// The API settings `warden serve` uses: `[api]`, with `WARDEN_ADMIN_TOKEN` and
    /// `WARDEN_READ_TOKEN` (when set and not empty) winning over the file's tokens.
    /// The environment's tokens are validated like the file's ([`ApiConfig::try_resolve`]).
    ///
    /// # Errors
    ///
    /// [`ApiSectionError`] when a token from the environment is unusable (blank, with
    /// surrounding whitespace, or a read token equal to the admin token).
    pub fn api_config(&self) -> Result<ApiConfig, ApiSectionError> {
        ApiConfig::try_resolve(&self.api, |name| std::env::var(name).ok())
    }
}
