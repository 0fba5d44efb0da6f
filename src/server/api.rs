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

use crate::{
    journal::{EventFates, SqliteJournal},
    server::events::EventHub,
    server::metrics::{self, ApiMetrics},
};
use actix_web::{
    dev::Payload,
    error::{JsonPayloadError, QueryPayloadError},
    http::{header, Method, StatusCode},
    web, FromRequest, HttpRequest, HttpResponse, ResponseError,
};
use serde::{Deserialize, Serialize};
use std::{future::Future, net::SocketAddr, sync::Arc};
use warden_actors::{
    safety::{AnswerError, ChannelInterventionBus},
    AskError, ControlError, HaltAck, Submit, SubmitError, Supervisor,
};
use warden_protocols::{
    AgentKey, Answer, EventFate, HaltCause, OperatorReply, UserEvent, WorkRefusal,
};

/// Default request body limit (bytes).
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Default most events in one `POST /api/world/batch` (`api.max_batch_events`).
pub const DEFAULT_MAX_BATCH_EVENTS: usize = 256;

/// Where `warden serve` listens unless `--listen` or `api.listen` says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// The operator name journaled for calls made with the admin token.
pub const API_OPERATOR: &str = "api:admin";
/// The operator name journaled for what a host token (`api.host_tokens`) does over the API: a
/// halt by the game server is told from the operator's.
pub const HOST_OPERATOR: &str = "api:host";

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
            .unwrap_or(super::auth_limit::DEFAULT_AUTH_FAILURES_PER_MINUTE)
    }

    /// How long a console session lasts.
    pub(crate) fn session_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_secs(match self.session_ttl_seconds {
            0 => crate::server::console::DEFAULT_SESSION_TTL_SECONDS,
            n => n,
        })
    }
}

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
    /// [`crate::server::console::DEFAULT_SESSION_TTL_SECONDS`], 8 hours).
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
fn token_problem(token: &str) -> Option<&'static str> {
    if token.trim().is_empty() {
        Some("must not be empty")
    } else if token.trim() != token {
        Some("must not start or end with whitespace")
    } else {
        None
    }
}

/// What the handlers share. Build it with [`ApiState::new`] and the `with_*` methods.
#[derive(Clone)]
pub struct ApiState {
    /// The team the API controls and reports on.
    pub supervisor: Supervisor,
    /// The intervention bus the supervisor's limit checkpoint asks (for `/api/interventions`).
    pub bus: Option<Arc<ChannelInterventionBus>>,
    /// Tokens and the body limit.
    pub config: ApiConfig,
    /// The feed `GET /api/events` streams (503 without one).
    pub events: Option<EventHub>,
    /// The durable journal, for its counters on `/metrics`.
    pub journal: Option<Arc<SqliteJournal>>,
    /// Where `GET /api/agents/{key}/events/{id}` reads what became of an event (503 without).
    pub fates: Option<Arc<dyn EventFates>>,
    /// What the API measures itself (halt latency).
    pub metrics: Arc<ApiMetrics>,
    /// The open sessions of `/mcp` (the MCP server, [`crate::server::mcp`]).
    pub mcp: Arc<crate::server::mcp::McpSessions>,
    /// The browser console's logged-in sessions ([`crate::server::console`]).
    pub console: Arc<crate::server::console::Sessions>,
    /// Wrong tokens by client address (`api.auth_failures_per_minute`).
    pub auth_failures: Arc<super::auth_limit::AuthFailures>,
    /// This node's cluster (`warden serve --cluster`): its routes shadow `POST /api/halt` and
    /// `GET /api/agents` (see [`crate::cluster`]).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// A2A push-notification configs and their webhook deliveries ([`crate::server::a2a`]).
    pub a2a_push: Arc<crate::server::a2a::push::Pushes>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("supervisor", &self.supervisor)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// The API over `supervisor` with these tokens and no bus, feed, journal or fates, until the
    /// `with_*` methods add them: meanwhile `GET /api/events`, `GET /api/events/recent` and the
    /// fate reads answer `503`, `/api/interventions` lists no ask, and `/metrics` leaves out the
    /// journal's families.
    pub fn new(supervisor: Supervisor, config: ApiConfig) -> Self {
        ApiState {
            supervisor,
            bus: None,
            events: None,
            journal: None,
            fates: None,
            metrics: Arc::default(),
            mcp: Arc::default(),
            console: Arc::new(crate::server::console::Sessions::new(config.session_ttl())),
            auth_failures: Arc::new(super::auth_limit::AuthFailures::new(
                config.auth_failure_limit(),
            )),
            config,
            cluster: None,
            a2a_push: Arc::default(),
        }
    }

    /// `404 unknown agent KEY` — or, on a cluster node whose team file lists `KEY` as another
    /// node's agent, `409 agent KEY runs on node N: ask node N`.
    fn unknown_agent(&self, key: &str) -> ApiError {
        match self.runs_elsewhere(key) {
            Some(node) => ApiError::new(
                StatusCode::CONFLICT,
                format!("agent {key} runs on node {node}: ask node {node}"),
            ),
            None => ApiError::unknown_agent(key),
        }
    }

    /// On a cluster node, the node that runs `key` when this one does not (its team file lists it
    /// as another node's, or this node gave it up: the copy here is halted).
    pub(crate) fn runs_elsewhere(&self, key: &str) -> Option<String> {
        let cluster = self.cluster.as_ref()?;
        (!cluster.owns(key)).then(|| cluster.runs_on(key)).flatten()
    }

    /// The agent `key` to act on: this node's — [`ApiState::unknown_agent`] when there is none, or
    /// when it runs on another node (a copy given up here included).
    pub(crate) fn agent(&self, key: &str) -> Result<warden_actors::AgentHandle, ApiError> {
        if self.runs_elsewhere(key).is_some() {
            return Err(self.unknown_agent(key));
        }
        self.supervisor
            .get(key)
            .ok_or_else(|| self.unknown_agent(key))
    }

    /// The cluster this node belongs to.
    pub fn with_cluster(mut self, cluster: Arc<crate::cluster::Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// The bus behind `/api/interventions`.
    pub fn with_bus(mut self, bus: Arc<ChannelInterventionBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// The feed behind `/api/events`.
    pub fn with_events(mut self, hub: EventHub) -> Self {
        self.events = Some(hub);
        self
    }

    /// The durable journal, whose counters `/metrics` shows and from which events' fates are read.
    pub fn with_journal(mut self, journal: Arc<SqliteJournal>) -> Self {
        self.fates = Some(journal.clone());
        self.journal = Some(journal);
        self
    }

    /// Where events' fates are read (set by [`ApiState::with_journal`]; for an in-memory journal).
    pub fn with_fates(mut self, fates: Arc<dyn EventFates>) -> Self {
        self.fates = Some(fates);
        self
    }
}

/// Whether `given` is the `configured` token, compared in constant time (`subtle`: no early exit on
/// the first differing byte; only the length can show).
pub(crate) fn token_matches(configured: &str, given: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(configured.as_bytes().ct_eq(given.as_bytes()))
}

/// The credentials of an `Authorization: Bearer <token>` header; the scheme is case-insensitive
/// (RFC 7235 §2.1), surrounding whitespace is ignored.
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

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
        refused: super::auth_limit::Refused,
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

    fn unknown_agent(key: &str) -> Self {
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

fn json_error(err: JsonPayloadError, _req: &HttpRequest) -> actix_web::Error {
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

fn query_error(err: QueryPayloadError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::new(StatusCode::BAD_REQUEST, format!("bad query string: {err}")).into()
}

fn path_error(err: actix_web::error::PathError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::new(StatusCode::BAD_REQUEST, format!("bad path: {err}")).into()
}

/// Whether `path` fits the route pattern `pattern` (`{name}` matches one non-empty segment).
fn path_matches(pattern: &str, path: &str) -> bool {
    let mut want = pattern.split('/');
    let mut got = path.split('/');
    loop {
        match (want.next(), got.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) if w.starts_with('{') && w.ends_with('}') => {
                if g.is_empty() {
                    return false;
                }
            }
            (Some(w), Some(g)) if w == g => {}
            _ => return false,
        }
    }
}

/// The methods [`ROUTES`] serves on `path` (empty when no route has that path).
pub fn allowed_methods(path: &str) -> Vec<&'static str> {
    ROUTES
        .iter()
        .filter(|(_, pattern)| path_matches(pattern, path))
        .map(|(method, _)| *method)
        .collect()
}

/// What no route answers: `405 {"error"}` with `Allow` for a served path asked with another method,
/// else `404 {"error"}`.
async fn no_route(req: HttpRequest) -> HttpResponse {
    let path = req.path();
    let allowed = allowed_methods(path);
    if allowed.is_empty() {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no route {path} (GET /api/openapi.json lists the routes)"),
        )
        .error_response();
    }
    let allow = allowed.join(", ");
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} {path} is not served; allowed: {allow}", req.method()),
    )
    .error_response();
    if let Ok(value) = header::HeaderValue::from_str(&allow) {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

/// Declares [`ROUTES`] and `register` from one list, so they cannot differ.
macro_rules! routes {
    ($($method:ident $path:literal => $handler:path),* $(,)?) => {
        /// Every `(method, path)` the API serves, in OpenAPI spelling (`{key}` is a path parameter).
        /// One method per path: a second route on a served path would be answered 405 by the first.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn register(cfg: &mut web::ServiceConfig) {
            $(cfg.route($path, web::method(Method::$method).to($handler));)*
        }
    };
}

routes! {
    GET "/healthz" => healthz,
    GET "/metrics" => metrics_text,
    GET "/api/openapi.json" => openapi,
    GET "/api/agents" => list_agents,
    GET "/api/agents/{key}" => get_agent,
    POST "/api/agents/{key}/events" => post_event,
    GET "/api/agents/{key}/events/{id}" => get_event,
    POST "/api/agents/{key}/world" => post_world,
    POST "/api/world/batch" => post_world_batch,
    GET "/api/replies" => crate::server::replies::get_replies,
    POST "/api/world/presence" => post_presence,
    POST "/api/world/clock" => post_clock,
    POST "/api/halt" => halt_all,
    POST "/api/resume" => lift_halt,
    POST "/api/agents/{key}/halt" => halt_agent,
    POST "/api/agents/{key}/unlock" => unlock,
    POST "/api/agents/{key}/emergency/clear" => clear,
    POST "/api/agents/{key}/history/reset" => reset_history,
    PUT "/api/agents/{key}/goals" => set_goals,
    GET "/api/agents/{key}/memories" => get_memories,
    DELETE "/api/agents/{key}/memories/{id}" => delete_memory,
    DELETE "/api/memories" => forget_about,
    POST "/api/agents/{key}/pause" => pause,
    POST "/api/agents/{key}/resume" => resume,
    GET "/api/interventions" => list_interventions,
    POST "/api/interventions/{id}" => answer_intervention,
    GET "/api/events" => events,
    GET "/api/events/recent" => recent_events,
    GET "/api/fleet" => fleet,
    GET "/api/breakers/recent" => recent_trips,
}

/// The OpenAPI 3.1 description of [`ROUTES`], served at `GET /api/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Registers the routes with `state`: `App::new().configure(api::configure(state))`.
pub fn configure(state: ApiState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        let limit = state.config.limit();
        let cluster = state.cluster.is_some();
        cfg.app_data(web::Data::new(state))
            .app_data(
                web::JsonConfig::default()
                    .limit(limit)
                    .error_handler(json_error),
            )
            .app_data(web::QueryConfig::default().error_handler(query_error))
            .app_data(web::PathConfig::default().error_handler(path_error));
        if cluster {
            crate::cluster::http::configure(cfg); // first: they shadow their single-node routes
        }
        register(cfg);
        // `/mcp` is a protocol endpoint, not a REST route: it answers JSON-RPC, serves the read
        // token too on POST, and takes three methods; it is not in `ROUTES` nor `openapi.json`.
        crate::server::mcp::configure(cfg);
        // A2A (`/.well-known/agent-card.json`, `/a2a`): a protocol endpoint too, like `/mcp`.
        crate::server::a2a::configure(cfg);
        // The browser console (`/`, `/console/…`): pages, not REST routes, so not in `ROUTES`.
        crate::server::console::configure(cfg);
        cfg.default_service(web::to(no_route));
    }
}

type Handled = Result<HttpResponse, ApiError>;

/// `200 {"status": "ok"}`, or `503 {"status": "degraded", "journal": …}` while the journal cannot
/// write (no event is accepted and no turn starts meanwhile).
async fn healthz(state: web::Data<ApiState>) -> HttpResponse {
    // A cluster node cut off from JetStream starts no model call: degraded too.
    if let Some(reason) = state.cluster.as_ref().and_then(|c| c.fail_safe()) {
        return HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({ "status": "degraded", "cluster": reason }));
    }
    match state.supervisor.journal_degraded() {
        None => HttpResponse::Ok().json(serde_json::json!({ "status": "ok" })),
        Some(reason) => HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({ "status": "degraded", "journal": reason })),
    }
}

async fn openapi(_: Reader) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}

async fn metrics_text(_: Reader, state: web::Data<ApiState>) -> HttpResponse {
    let journal = state.journal.as_ref().map(|j| {
        let stats = j.stats();
        metrics::JournalNumbers {
            committed_seq: stats.committed_seq,
            commits: stats.commits,
            durable_waits: stats.durable_waits,
            failed_batches: stats.failed_batches,
            write_error: j.last_error().is_some(),
        }
    });
    let snapshot = metrics::Snapshot {
        statuses: state.supervisor.statuses(),
        fleet: state.supervisor.fleet_view(),
        trips: state.supervisor.safety_report().await.map(|r| r.trips),
        journal,
        interventions_pending: state.bus.as_ref().map(|b| b.pending().len()),
        stream_subscribers: state.events.as_ref().map(EventHub::subscribers),
        halt_agent: state.metrics.halt_agent.snapshot(),
        halt_all: state.metrics.halt_all.snapshot(),
        provider_retries: warden_actors::retry_counts().to_vec(),
        provider_limits: warden_actors::provider_limit_stats(),
        otel: crate::telemetry::stats(),
    };
    let mut body = metrics::render(&snapshot);
    if let Some(cluster) = &state.cluster {
        body.push_str(&crate::cluster::http::metrics(cluster));
    }
    HttpResponse::Ok()
        .content_type(metrics::CONTENT_TYPE)
        .body(body)
}

/// `GET /api/events` query: `?agent=KEY` keeps one agent's events and notices.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// The agent's key (`404` if the team has no such agent); `None`: every agent's.
    #[serde(default)]
    pub agent: Option<String>,
}

async fn events(
    _: Reader,
    state: web::Data<ApiState>,
    query: web::Query<EventsQuery>,
    req: HttpRequest,
) -> Handled {
    let hub = state.events.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server has no event stream (see api::ApiState::with_events)",
        )
    })?;
    let filter = agent_filter(&state, query.into_inner().agent)?;
    let resume = match req.headers().get("last-event-id") {
        None => None,
        Some(value) => {
            let text = String::from_utf8_lossy(value.as_bytes());
            let text = text.trim();
            if text.is_empty() {
                None
            } else {
                Some(text.parse::<u64>().map_err(|_| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("Last-Event-ID must be a journal sequence number, not {text:?}"),
                    )
                })?)
            }
        }
    };
    // Subscribe before reading the pending asks, so none falls between the two.
    let rx = hub.subscribe();
    let pending = state
        .bus
        .as_ref()
        .map(|bus| bus.pending())
        .unwrap_or_default();
    let stream = crate::server::sse::EventStream::new(hub, rx, filter, resume, pending);
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(stream.into_body()))
}

/// The `?agent=KEY` of a feed query, checked: 404 for an agent the team does not have.
fn agent_filter(state: &ApiState, agent: Option<String>) -> Result<Option<AgentKey>, ApiError> {
    let Some(key) = agent else {
        return Ok(None);
    };
    state
        .supervisor
        .get(&key)
        .ok_or_else(|| state.unknown_agent(&key))?;
    Ok(Some(AgentKey::new(key)))
}

/// `GET /api/events/recent` query: `?limit=N` (0–1000, default 20) of `?agent=KEY`'s events.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecentQuery {
    /// The agent's key (`404` if the team has no such agent); `None`: every agent's.
    #[serde(default)]
    pub agent: Option<String>,
    /// How many events, the most recent ones: 0 to [`RECENT_MAX`] (more is a `400`); `None`:
    /// [`RECENT_DEFAULT`].
    #[serde(default)]
    pub limit: Option<usize>,
}

/// How many events `GET /api/events/recent` gives by default.
pub const RECENT_DEFAULT: usize = 20;
/// The most `GET /api/events/recent` gives (`?limit=` above it is a `400`).
pub const RECENT_MAX: usize = 1000;

/// `GET /api/events/recent`: the last events from the journal, oldest first, and the journal's head
/// `seq` — `GET /api/events` with `Last-Event-ID: head` continues from there with no gap.
async fn recent_events(
    _: Reader,
    state: web::Data<ApiState>,
    query: web::Query<RecentQuery>,
) -> Handled {
    let query = query.into_inner();
    let limit = query.limit.unwrap_or(RECENT_DEFAULT);
    if limit > RECENT_MAX {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("limit must be between 0 and {RECENT_MAX}, not {limit}"),
        ));
    }
    let agent = agent_filter(&state, query.agent)?;
    let log = state
        .events
        .as_ref()
        .and_then(|hub| hub.log())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "this server keeps no journal to read events from",
            )
        })?;
    let recent = log.recent(agent.as_ref(), limit).map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("journal read failed: {e}"),
        )
    })?;
    Ok(HttpResponse::Ok().json(recent))
}

/// `GET /api/fleet`: the console's header in one read — the team's tokens and cost against its
/// budgets, agents per state, model calls in flight, pending asks and the journal's health.
async fn fleet(_: Reader, state: web::Data<ApiState>) -> Handled {
    let statuses = state.supervisor.statuses();
    let mut states: std::collections::BTreeMap<String, usize> = Default::default();
    let mut turns_running = 0;
    for status in &statuses {
        let name = serde_json::to_value(status.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        *states.entry(name).or_default() += 1;
        if status.state == warden_protocols::AgentState::Executing {
            turns_running += 1;
        }
    }
    let llm_calls_in_flight: u64 = warden_actors::provider_limit_stats()
        .iter()
        .map(|l| l.in_flight)
        .sum();
    let degraded = state.supervisor.journal_degraded();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "fleet": state.supervisor.fleet_view(),
        "agents": statuses.len(),
        "states": states,
        "turns_running": turns_running,
        "llm_calls_in_flight": llm_calls_in_flight,
        "interventions_pending": state.bus.as_ref().map_or(0, |b| b.pending().len()),
        "journal": { "ok": degraded.is_none(), "degraded": degraded },
    })))
}

/// `GET /api/breakers/recent`: trips per breaker since start and the most recent trips and stops
/// (at most 64, newest first) with their messages; 503 when the team has no safety monitor.
async fn recent_trips(_: Reader, state: web::Data<ApiState>) -> Handled {
    let report = state.supervisor.safety_report().await.ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this team's safety monitor is not running",
        )
    })?;
    let mut recent = report.recent;
    recent.reverse();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "trips": report.trips,
        "recent": recent,
    })))
}

async fn list_agents(_: Reader, state: web::Data<ApiState>) -> Handled {
    Ok(HttpResponse::Ok().json(state.supervisor.statuses()))
}

pub(crate) async fn get_agent(
    _: Reader,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Handled {
    let agent = state.agent(&key)?;
    Ok(HttpResponse::Ok().json(agent.status()))
}

/// `POST /api/agents/{key}/events` answers `202 {"id": N}` (the event's id, unique in the agent's
/// journal) once the event is queued and its acceptance is durable: after a crash it is queued again
/// or already in the history.
#[derive(Debug, Serialize, Deserialize)]
pub struct Queued {
    /// The user event's id, unique among the agent's user events (counted from 1).
    pub id: u64,
}

/// The longest `?wait=` of `POST /api/agents/{key}/events`, in seconds.
pub const MAX_WAIT_SECONDS: f64 = 300.0;

/// `POST /api/agents/{key}/events` query: `?wait=S` waits up to S seconds (0–300) for the answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostEventQuery {
    /// Seconds to wait for the answer, fractions allowed, 0 to [`MAX_WAIT_SECONDS`] (anything else
    /// is a `400`); `None` or `0`: answer `202` at once, without waiting.
    #[serde(default)]
    pub wait: Option<String>,
}

impl PostEventQuery {
    fn wait(&self) -> Result<Option<std::time::Duration>, ApiError> {
        let Some(text) = self.wait.as_deref() else {
            return Ok(None);
        };
        match text.trim().parse::<f64>() {
            Ok(s) if (0.0..=MAX_WAIT_SECONDS).contains(&s) => {
                Ok((s > 0.0).then(|| std::time::Duration::from_secs_f64(s)))
            }
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("wait: {text:?} is not a number of seconds from 0 to {MAX_WAIT_SECONDS}"),
            )),
        }
    }
}

/// Entry points for `fuzz/` (feature `fuzzing` only) to the request parsing that is private here.
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing {
    /// `?wait=` of `POST /api/agents/{key}/events`, as the handler reads it: the seconds to wait,
    /// or `Err` with the 400 message.
    ///
    /// # Errors
    ///
    /// The message of the `400` for anything but a number of seconds from 0 to 300.
    pub fn post_event_wait(text: &str) -> Result<Option<std::time::Duration>, String> {
        super::PostEventQuery {
            wait: Some(text.to_owned()),
        }
        .wait()
        .map_err(|e| e.to_string())
    }
}

/// The header that names an event for retries.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// `{"id": …, "status": …, …}`: an event's id with its fate.
pub(crate) fn fate_body(id: u64, fate: &EventFate) -> serde_json::Value {
    let mut body = serde_json::to_value(fate).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(map) = body.as_object_mut() {
        map.insert("id".into(), id.into());
    }
    body
}

/// 200 for a settled event, 202 for one still pending or running.
fn fate_response(id: u64, fate: &EventFate, duplicate: bool) -> HttpResponse {
    let mut body = fate_body(id, fate);
    if duplicate {
        body["duplicate"] = true.into();
    }
    if fate.is_settled() {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::Accepted().json(body)
    }
}

/// What a waiter was told, as the event's fate.
pub(crate) fn settled_fate(settled: warden_actors::Settled) -> EventFate {
    match settled {
        Ok(reply) => EventFate::Answered {
            answer: reply.answer,
            reason: reply.reason,
            usage: reply.usage,
            truncated: reply.truncated,
        },
        Err(AskError::Refused { refusal, .. }) => EventFate::Refused { refusal },
        Err(AskError::Discarded { .. }) => EventFate::Discarded,
        Err(AskError::Failed { reason, error, .. }) => EventFate::Failed { reason, error },
        Err(AskError::NotQueued(err)) => EventFate::Refused {
            refusal: err.refusal,
        },
        Err(AskError::AgentGone) => EventFate::Refused {
            refusal: WorkRefusal::Closed,
        },
    }
}

/// The event's fate from the journal, on a blocking thread (a SQLite read flushes first).
pub(crate) async fn fate_from_journal(
    state: &ApiState,
    agent: &str,
    id: u64,
) -> Result<Option<EventFate>, ApiError> {
    let Some(fates) = state.fates.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server keeps no journal to read events from (see api::ApiState::with_fates)",
        ));
    };
    let agent = agent.to_owned();
    web::block(move || fates.fate(&agent, id))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// `POST /api/agents/{key}/events`, inside a server span that continues the caller's W3C
/// `traceparent` ([`crate::telemetry::request_span`]): the event is queued under that span, so the
/// turn that takes it later is its child.
async fn post_event(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    query: web::Query<PostEventQuery>,
    req: HttpRequest,
    event: web::Json<UserEvent>,
) -> Handled {
    use tracing::Instrument;
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let span = crate::telemetry::request_span(
        "POST",
        "/api/agents/{key}/events",
        &key,
        header("traceparent"),
        header("tracestate"),
    );
    let handled = post_event_in(state, key, query, &req, event)
        .instrument(span.clone())
        .await;
    let status = match &handled {
        Ok(response) => response.status(),
        Err(err) => err.status,
    };
    crate::telemetry::request_ended(&span, status.as_u16(), None);
    handled
}

async fn post_event_in(
    state: web::Data<ApiState>,
    key: web::Path<String>,
    query: web::Query<PostEventQuery>,
    req: &HttpRequest,
    event: web::Json<UserEvent>,
) -> Handled {
    let wait = query.wait()?;
    let idempotency_key = match req.headers().get(IDEMPOTENCY_KEY) {
        None => None,
        Some(value) => match value.to_str() {
            Ok(k) if !k.trim().is_empty() && k.len() <= 256 => Some(k.trim().to_owned()),
            _ => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "Idempotency-Key: must be 1 to 256 visible ASCII characters",
                ))
            }
        },
    };
    let agent = state.agent(&key)?;
    let options = Submit {
        idempotency_key,
        watch: wait.is_some(),
    };
    match agent.submit(event.into_inner(), options).await {
        Ok(submitted) => {
            let id = submitted.id;
            if let (Some(reply), Some(wait)) = (submitted.reply, wait) {
                if let Ok(settled) = tokio::time::timeout(wait, reply).await {
                    // The answer leaves once its turn is on disk: a crash right after it must not
                    // find the event pending and run it again.
                    if let Err(cause) = agent.durable_so_far().await {
                        return Ok(not_durable_event(&key, id, "settled", &cause));
                    }
                    return Ok(fate_response(
                        id,
                        &settled_fate(settled),
                        submitted.duplicate,
                    ));
                }
            }
            if submitted.duplicate {
                // The first event's fate (and with it its durability: the read flushes).
                let fate = fate_from_journal(&state, &key, id)
                    .await?
                    .unwrap_or(EventFate::Pending);
                return Ok(fate_response(id, &fate, true));
            }
            Ok(fate_response(id, &EventFate::Pending, false))
        }
        Err(err @ SubmitError::KeyReused { id, .. }) => Ok(HttpResponse::Conflict()
            .json(serde_json::json!({ "error": err.to_string(), "id": id }))),
        // Queued and running, but a crash would lose it: say so, with the id, instead of a 202.
        Err(err @ SubmitError::NotDurable { id, .. }) => {
            tracing::error!(agent = %key, id, "{err}");
            Ok(HttpResponse::InternalServerError().json(serde_json::json!({
                "error": err.to_string(),
                "id": id,
            })))
        }
        Err(SubmitError::Refused(err)) => Ok(refused(&err.refusal)),
    }
}

/// `500 {"error": "event N was <what> but is not durable: …", "id": N}`: the event is queued (or
/// ran) but a crash would lose that; sending it again would run it twice.
fn not_durable_event(
    key: &str,
    id: u64,
    what: &str,
    cause: &warden_actors::NotDurable,
) -> HttpResponse {
    let error = format!("event {id} was {what} but is not durable: {cause}");
    tracing::error!(agent = %key, id, "{error}");
    HttpResponse::InternalServerError().json(serde_json::json!({ "error": error, "id": id }))
}

/// A refused user event: 409 (locked out, stopped), 429 (full lane) or 503 (closed, journal
/// unavailable), with the refusal.
fn refused(refusal: &WorkRefusal) -> HttpResponse {
    let status = match refusal {
        WorkRefusal::LockedOut { .. } | WorkRefusal::Stopped => StatusCode::CONFLICT,
        WorkRefusal::MailboxFull { .. } => StatusCode::TOO_MANY_REQUESTS,
        WorkRefusal::Closed | WorkRefusal::JournalUnavailable { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    };
    // The refusal as the request span's error (a no-op outside one).
    crate::telemetry::request_ended(
        &tracing::Span::current(),
        status.as_u16(),
        Some(&refusal.to_string()),
    );
    HttpResponse::build(status).json(serde_json::json!({
        "error": refusal.to_string(),
        "refusal": refusal,
    }))
}

/// `POST /api/agents/{key}/world`: an NPC perceives a world event (`AgentHandle::perceive`): 200
/// with the perception (verdict, rule, trust) and, for a TRIGGER, the id of the user event it was
/// queued as; a TRIGGER the agent refuses is answered like a refused event. The 200 comes once the
/// queued TRIGGER, or an observation admitted for long-term memory, is on disk.
async fn post_world(
    _: Host,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    event: web::Json<warden_protocols::npc::WorldEvent>,
) -> Handled {
    let agent = state.agent(&key)?;
    match agent.perceive(event.into_inner()) {
        Ok(seen) => {
            // A TRIGGER is queued as a user event: its id is acknowledged once that is on disk,
            // as `POST …/events` acknowledges one.
            if let Some(id) = seen.queued {
                if let Err(cause) = agent.durable_so_far().await {
                    return Ok(not_durable_event(&key, id, "queued", &cause));
                }
            } else if seen.observed {
                // An observation admitted for long-term memory is acknowledged once on disk too.
                if let Err(cause) = agent.durable_so_far().await {
                    let error = format!("the observation was admitted but is not durable: {cause}");
                    tracing::error!(agent = %key.as_str(), "{error}");
                    return Ok(HttpResponse::InternalServerError()
                        .json(serde_json::json!({ "error": error })));
                }
            }
            Ok(HttpResponse::Ok().json(serde_json::json!({
                "perception": seen.perception,
                "id": seen.queued,
            })))
        }
        Err(err) => Ok(refused(&err.refusal)),
    }
}

/// One item of `POST /api/world/batch`: the NPC's key and the body of
/// `POST /api/agents/{key}/world`.
#[derive(Debug, Deserialize)]
struct BatchItem {
    /// The NPC that perceives the event.
    npc: String,
    #[serde(flatten)]
    event: warden_protocols::npc::WorldEvent,
}

/// The body of `POST /api/world/batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    events: Vec<BatchItem>,
}

/// `POST /api/world/batch`: many world events, for many NPCs, in one request — a game server's
/// tick. The whole batch is checked first (at most [`ApiConfig::max_batch_events`] events, `413`
/// beyond; every NPC known here, `404`/`409` naming the first that is not): a refused batch
/// delivers nothing. Then each event is perceived in order, as `POST /api/agents/{key}/world`
/// perceives one, and the answer waits for one durable commit covering every queued TRIGGER and
/// every observation admitted for long-term memory.
/// `200 {"results": [...]}`, one per event in order: `{"npc", "perception", "id"}` (the id of the
/// user event a TRIGGER was queued as, else null) or `{"npc", "error", "refusal"}` for a TRIGGER
/// the agent refused (locked out, stopped, mailbox full, …). `500` with the results when the
/// queued events could not be made durable.
async fn post_world_batch(
    _: Host,
    state: web::Data<ApiState>,
    body: web::Json<BatchBody>,
) -> Handled {
    let events = body.into_inner().events;
    let limit = state.config.batch_limit();
    if events.len() > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} events in one batch: at most {limit} (api.max_batch_events); send the rest \
                 in another batch",
                events.len()
            ),
        ));
    }
    // Every NPC first: an invalid batch queues nothing.
    let mut agents = Vec::with_capacity(events.len());
    for (i, item) in events.iter().enumerate() {
        let agent = state
            .agent(&item.npc)
            .map_err(|err| ApiError::new(err.status, format!("events[{i}]: {}", err.message)))?;
        agents.push(agent);
    }
    let mut results = Vec::with_capacity(events.len());
    // One agent per key whose TRIGGER was queued or whose observation was admitted: they are
    // acknowledged once on disk.
    let mut queued: Vec<(String, Option<u64>, warden_actors::AgentHandle)> = Vec::new();
    for (item, agent) in events.into_iter().zip(agents) {
        let npc = item.npc;
        match agent.perceive(item.event) {
            Ok(seen) => {
                if (seen.queued.is_some() || seen.observed)
                    && !queued.iter().any(|(key, _, _)| *key == npc)
                {
                    queued.push((npc.clone(), seen.queued, agent));
                }
                results.push(serde_json::json!({
                    "npc": npc,
                    "perception": seen.perception,
                    "id": seen.queued,
                }));
            }
            Err(err) => results.push(serde_json::json!({
                "npc": npc,
                "error": err.refusal.to_string(),
                "refusal": err.refusal,
            })),
        }
    }
    // The journal commits in groups: the first wait covers every row appended before it, the
    // others find their rows on disk already.
    for (key, id, agent) in &queued {
        if let Err(cause) = agent.durable_so_far().await {
            let error = format!("events of the batch were queued but are not durable: {cause}");
            tracing::error!(agent = %key, ?id, "{error}");
            return Ok(HttpResponse::InternalServerError()
                .json(serde_json::json!({ "error": error, "results": results })));
        }
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({ "results": results })))
}

/// The body of `POST /api/world/presence`: players per room, as the game server counts them.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PresenceBody {
    rooms: std::collections::BTreeMap<String, usize>,
}

/// `POST /api/world/presence`: the host reports how many players are in each room
/// (`Supervisor::set_presence`); an NPC whose room is reported empty goes idle. 200 with the
/// number of rooms reported and the game hour.
async fn post_presence(
    _: Host,
    state: web::Data<ApiState>,
    body: web::Json<PresenceBody>,
) -> Handled {
    let body = body.into_inner();
    for (room, players) in &body.rooms {
        state.supervisor.set_presence(room, *players);
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "rooms": body.rooms.len(),
        "game_hour": state.supervisor.game_hour(),
    })))
}

/// The body of `POST /api/world/clock`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ClockBody {
    hour: f64,
}

/// `POST /api/world/clock`: the host sets the game hour (`Supervisor::set_game_hour`); every
/// ticking NPC's sleep schedule is read again. 200 with the game hour; 400 outside 0 to 24.
async fn post_clock(_: Host, state: web::Data<ApiState>, body: web::Json<ClockBody>) -> Handled {
    let hour = body.hour;
    if !(0.0..24.0).contains(&hour) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("hour {hour} is not a game hour from 0 to 24 (24 excluded)"),
        ));
    }
    state.supervisor.set_game_hour(hour);
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "game_hour": state.supervisor.game_hour(),
    })))
}

/// `GET /api/agents/{key}/events/{id}`: what became of an event, from the journal (so after a
/// restart too).
async fn get_event(
    _: Reader,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
) -> Handled {
    let (key, id) = path.into_inner();
    if state.supervisor.get(&key).is_none() {
        return Err(state.unknown_agent(&key));
    }
    let id: u64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("event id {id:?} is not a number"),
        )
    })?;
    match fate_from_journal(&state, &key, id).await? {
        Some(fate) => Ok(HttpResponse::Ok().json(fate_body(id, &fate))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("agent {key} has no event {id}"),
        )),
    }
}

/// One halt acknowledgement, as JSON.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct HaltAckBody {
    /// The halted agent's key.
    pub agent: String,
    /// Its state after the halt: `STOPPED`, or `SAFETY_LOCKOUT` for a locked-out agent (a halt
    /// never lifts a lockout).
    pub state: warden_protocols::AgentState,
    /// How many ordinary messages the halt cleared from its mailbox (each journaled).
    pub discarded: u64,
}

/// `200 {"halted": […]}`; `503 {"error": "halt applied but not durable: …", "halted": […]}` when
/// the journal could not make a halt durable (it is applied all the same: fail safe).
fn acks(acks: Vec<HaltAck>) -> HttpResponse {
    let not_durable = acks.iter().find_map(|a| {
        a.not_durable
            .as_ref()
            .map(|cause| (a.agent.clone(), cause.clone()))
    });
    let halted: Vec<HaltAckBody> = acks
        .into_iter()
        .map(|a| HaltAckBody {
            agent: a.agent.to_string(),
            state: a.state,
            discarded: a.discarded,
        })
        .collect();
    match not_durable {
        None => HttpResponse::Ok().json(serde_json::json!({ "halted": halted })),
        Some((agent, cause)) => {
            tracing::error!(%agent, "halt applied but not durable: {cause}");
            HttpResponse::ServiceUnavailable().json(serde_json::json!({
                "error": format!("halt applied but not durable: {cause}"),
                "halted": halted,
            }))
        }
    }
}

async fn halt_all(_: Host, state: web::Data<ApiState>) -> Handled {
    let started = tokio::time::Instant::now();
    let result = state.supervisor.halt_all().await;
    state.metrics.halt_all.observe(started.elapsed());
    Ok(acks(result))
}

/// `POST /api/resume` body (optional): `{"reason": "…"}`, journaled with every resume the lift
/// makes. Other fields are ignored.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct LiftBody {
    /// Why the operator lifts the fleet halt (free text; blank counts as none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl LiftBody {
    /// Reads an optional body (empty or whitespace: none).
    pub(crate) fn read(body: &[u8]) -> Result<LiftBody, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(LiftBody::default());
        }
        serde_json::from_slice(body)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))
    }

    /// The operator journaled with each resume: `api:admin (lift of the fleet halt: REASON)`.
    pub(crate) fn operator(&self, what: &str) -> String {
        match self
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
        {
            Some(reason) => format!("{API_OPERATOR} ({what}: {reason})"),
            None => format!("{API_OPERATOR} ({what})"),
        }
    }
}

/// The outcomes of a lift as JSON lists: `resumed` (keys), `kept` (`{agent, why}`).
pub(crate) fn lift_lists(
    outcomes: &[warden_actors::LiftOutcome],
    node: Option<&str>,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let mut resumed = Vec::new();
    let mut kept = Vec::new();
    for o in outcomes {
        let mut item = serde_json::json!({ "agent": o.agent });
        if let (Some(node), Some(map)) = (node, item.as_object_mut()) {
            map.insert("node".into(), node.into());
        }
        if o.resumed {
            if !o.kept.is_empty() {
                item["warning"] = o.kept.clone().into();
            }
            resumed.push(item);
        } else {
            item["why"] = o.kept.clone().into();
            kept.push(item);
        }
    }
    (resumed, kept)
}

/// `POST /api/resume`: lifts the standing fleet halt (`POST /api/halt`'s): resumes the agents it
/// stopped, except those locked out, stopped by a breaker, paused, or halted again since. `409`
/// when no fleet halt stands.
async fn lift_halt(_: Admin, state: web::Data<ApiState>, body: web::Bytes) -> Handled {
    let body = LiftBody::read(&body)?;
    let operator = body.operator("lift of the fleet halt");
    let Some(outcomes) = state.supervisor.resume_fleet_halt(&operator).await else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no fleet halt stands (POST /api/halt makes one): nothing to lift",
        ));
    };
    let (resumed, kept) = lift_lists(&outcomes, None);
    Ok(HttpResponse::Ok().json(serde_json::json!({ "resumed": resumed, "kept": kept })))
}

pub(crate) async fn halt_agent(
    who: Host,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Handled {
    let cause = HaltCause::Operator {
        operator: who.operator().into(),
    };
    let started = tokio::time::Instant::now();
    let result = state
        .supervisor
        .halt(&key, cause)
        .await
        .map_err(|_| state.unknown_agent(&key))?;
    state.metrics.halt_agent.observe(started.elapsed());
    Ok(acks(result))
}

/// Runs an operator control on an agent and answers with its new status.
async fn control<F, Fut>(state: &ApiState, key: &str, op: F) -> Handled
where
    F: FnOnce(warden_actors::AgentHandle) -> Fut,
    Fut: Future<Output = Result<(), ControlError>>,
{
    let agent = state.agent(key)?;
    op(agent.clone()).await?;
    Ok(HttpResponse::Ok().json(agent.status()))
}

/// `POST /api/agents/{key}/unlock` body (optional): `{"reason": "…"}`, journaled as the
/// `unlocked` event's `note`. Other fields are ignored (the route took no body before it had this
/// one, and ignored whatever was sent).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct UnlockBody {
    /// Why the operator unlocks (free text; blank counts as none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl UnlockBody {
    /// The note a request's body gives (`None`: no body, no reason, or a blank one).
    ///
    /// # Errors
    /// `400` when the body is not such JSON.
    pub(crate) fn note(body: &[u8]) -> Result<Option<String>, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let body: UnlockBody = serde_json::from_slice(body)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))?;
        Ok(body
            .reason
            .map(|r| r.trim().to_owned())
            .filter(|r| !r.is_empty()))
    }
}

async fn unlock(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    body: web::Bytes,
) -> Handled {
    if state.supervisor.get(&key).is_none() {
        return Err(state.unknown_agent(&key));
    }
    let note = UnlockBody::note(&body)?;
    control(&state, &key, |a| async move {
        a.unlock_with_note(API_OPERATOR, note).await
    })
    .await
}

pub(crate) async fn pause(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    control(&state, &key, |a| async move { a.pause(API_OPERATOR).await }).await
}

pub(crate) async fn resume(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
) -> Handled {
    control(
        &state,
        &key,
        |a| async move { a.resume(API_OPERATOR).await },
    )
    .await
}

async fn clear(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    control(&state, &key, |a| async move {
        a.clear_emergency(API_OPERATOR).await
    })
    .await
}

async fn reset_history(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    control(&state, &key, |a| async move {
        a.reset_history(API_OPERATOR).await
    })
    .await
}

/// `PUT /api/agents/{key}/goals` body: `{"goals": ["…", …]}`, the whole new list (empty clears it).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoalsBody {
    /// The new goals, most important first: at most [`warden_protocols::MAX_GOALS`], each not
    /// blank and at most [`warden_protocols::MAX_GOAL_CHARS`] characters.
    pub goals: Vec<String>,
}

async fn set_goals(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    body: web::Json<GoalsBody>,
) -> Handled {
    let agent = state.agent(&key)?;
    // Answered once the change is on disk, like the other controls (a 200 is never lost).
    agent
        .set_goals_durable(body.into_inner().goals, API_OPERATOR)
        .await
        .map_err(|err| {
            let status = match err {
                warden_actors::GoalsError::Invalid(_) => StatusCode::BAD_REQUEST,
                warden_actors::GoalsError::NotDurable(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            ApiError::new(status, err.to_string())
        })?;
    Ok(HttpResponse::Ok().json(agent.status()))
}

/// `GET /api/agents/{key}/memories` query: `q` (BM25 over the memories' text), `about` (a speaker
/// id: what was said by, is about or was asserted by it), `limit` (default 50, at most
/// [`warden_actors::memory::MAX_LISTED`]).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoriesQuery {
    /// Words to rank by relevance (BM25); without it the newest come first.
    #[serde(default)]
    pub q: Option<String>,
    /// A speaker id: only memories about it, and its profile.
    #[serde(default)]
    pub about: Option<String>,
    /// The most memories answered.
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `GET /api/agents/{key}/memories` answers `{"memories": [...], "profile": {...} | null}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct MemoriesAnswer {
    /// The memories, most relevant (or newest) first.
    pub memories: Vec<warden_actors::memory::Memory>,
    /// The profile of `about`, when asked and known.
    pub profile: Option<warden_actors::memory::EntityProfile>,
}

async fn get_memories(
    _: Reader,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    query: web::Query<MemoriesQuery>,
) -> Handled {
    let agent = state.agent(&key)?;
    let query = query.into_inner();
    let limit = query.limit.unwrap_or(50);
    let about = query.about.as_deref();
    Ok(HttpResponse::Ok().json(MemoriesAnswer {
        memories: agent.memories(query.q.as_deref(), about, limit),
        profile: about.and_then(|a| agent.profile(a)),
    }))
}

/// What a forget answers: the memories removed, by agent (`200` once journaled on disk).
#[derive(Debug, Serialize, Deserialize)]
pub struct Forgotten {
    /// Agent key → the ids removed from its memory.
    pub forgotten: std::collections::BTreeMap<String, Vec<u64>>,
}

fn not_durable(err: warden_actors::NotDurable) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("applied but not durable: {err}"),
    )
}

async fn delete_memory(
    _: Admin,
    state: web::Data<ApiState>,
    path: web::Path<(String, String)>,
) -> Handled {
    let (key, id) = path.into_inner();
    let agent = state.agent(&key)?;
    let id: u64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid memory id `{id}`: a memory id is a number"),
        )
    })?;
    // Answered once the `memory_forgotten` is on disk (a 200 is never lost).
    let gone = agent
        .forget_durable(&[id], None, API_OPERATOR)
        .await
        .map_err(not_durable)?;
    if gone.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("agent {key} has no memory {id}"),
        ));
    }
    let forgotten = std::iter::once((key, gone)).collect();
    Ok(HttpResponse::Ok().json(Forgotten { forgotten }))
}

/// `DELETE /api/memories?about=PLAYER_ID` query.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AboutQuery {
    /// The speaker id to forget everywhere.
    pub about: String,
}

/// A player's right to be forgotten: every agent of this node forgets what it remembers about
/// `about` (said by it, about it, asserted by it) and its profile, each journaled as
/// `memory_forgotten` by the operator; answered once all of it is on disk.
async fn forget_about(
    _: Admin,
    state: web::Data<ApiState>,
    query: web::Query<AboutQuery>,
) -> Handled {
    let about = query.into_inner().about;
    if about.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "`about` must name a speaker id",
        ));
    }
    let mut forgotten = std::collections::BTreeMap::new();
    for agent in state.supervisor.agents() {
        let gone = agent
            .forget_durable(&[], Some(&about), API_OPERATOR)
            .await
            .map_err(not_durable)?;
        if !gone.is_empty() {
            forgotten.insert(agent.key().to_string(), gone);
        }
    }
    Ok(HttpResponse::Ok().json(Forgotten { forgotten }))
}

async fn list_interventions(_: Reader, state: web::Data<ApiState>) -> Handled {
    let pending = state
        .bus
        .as_ref()
        .map(|bus| bus.pending())
        .unwrap_or_default();
    Ok(HttpResponse::Ok().json(pending))
}

/// `POST /api/interventions/{id}` body: `{"answer": "yes"}` (`yes`/`y`, `no`/`n`; anything else is
/// a no), with an optional `note`, journaled with the decision (`limit_decided.decision.answered_by`,
/// or `permission_decided.decision.answered_by` for a permission ask: yes runs the tool).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    /// `yes`/`y` or `no`/`n` (trimmed, any case); anything else counts as no.
    pub answer: String,
    /// Free text journaled with the decision; `None`: no note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What `POST /api/interventions/{id}` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerReply {
    /// The intervention answered.
    pub id: u64,
    /// The answer as it was understood.
    pub answer: Answer,
    /// The note given with it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

async fn answer_intervention(
    _: Admin,
    state: web::Data<ApiState>,
    id: web::Path<String>,
    body: web::Json<AnswerBody>,
) -> Handled {
    let id: u64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("intervention id must be a number, not {:?}", id.as_str()),
        )
    })?;
    let not_pending = |id: u64| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no pending intervention with id {id}"),
        )
    };
    let bus = state.bus.as_ref().ok_or_else(|| not_pending(id))?;
    let AnswerBody { answer, note } = body.into_inner();
    let answer = Answer::parse(&answer);
    // Who answered and the note go with the answer: the agent journals them in `limit_decided`
    // (a limit ask) or `permission_decided` (a permission ask).
    bus.reply(
        id,
        OperatorReply::by(answer.clone(), API_OPERATOR, note.clone()),
    )
    .map_err(|AnswerError::Unknown(id)| not_pending(id))?;
    tracing::info!(
        id,
        operator = API_OPERATOR,
        answer = %answer,
        note = note.as_deref().unwrap_or(""),
        "intervention answered"
    );
    Ok(HttpResponse::Ok().json(AnswerReply { id, answer, note }))
}

/// Why `serve` would not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No admin token is configured and the address is not loopback: the API would be open to
    /// the network.
    #[error("refusing to listen on non-loopback address {0} without an admin token (set WARDEN_ADMIN_TOKEN)")]
    NoTokenOnPublicAddress(std::net::SocketAddr),
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen on {0}: {1}")]
    Bind(std::net::SocketAddr, std::io::Error),
    /// Another I/O error: reading the bound socket's address, starting the HTTP server, or the
    /// server failing while it runs.
    #[error("listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Refuses a non-loopback address when no admin token is configured.
///
/// # Errors
///
/// [`ServeError::NoTokenOnPublicAddress`] for a non-loopback `addr` without an admin token.
pub fn check_listen(addr: std::net::SocketAddr, config: &ApiConfig) -> Result<(), ServeError> {
    if config.admin_token.is_none() && !addr.ip().is_loopback() {
        return Err(ServeError::NoTokenOnPublicAddress(addr));
    }
    Ok(())
}

/// HTTP workers: one per core, at least two and at most eight (`WARDEN_API_WORKERS` overrides). A
/// worker serves every connection it accepts — event streams, event ingest, halts — so with one
/// worker a halt waited behind every stream and every flood request on it; with several, the kernel
/// spreads the connections and schedules the workers' threads, so a halt lands on a worker that is
/// not the only one carrying the load.
pub fn api_workers() -> usize {
    std::env::var("WARDEN_API_WORKERS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 8)
        })
}

/// Binds the API to `addr` (port 0 picks a free one) and returns the server, to be awaited or
/// spawned, and the addresses it listens on. Must run inside an actix `System`.
///
/// # Errors
///
/// [`ServeError::NoTokenOnPublicAddress`] (see [`check_listen`]), [`ServeError::Bind`] when the
/// address cannot be bound, [`ServeError::Io`] when the server cannot start on it.
pub fn bind(
    state: ApiState,
    addr: SocketAddr,
) -> Result<(actix_web::dev::Server, Vec<SocketAddr>), ServeError> {
    check_listen(addr, &state.config)?;
    let listener = std::net::TcpListener::bind(addr).map_err(|e| ServeError::Bind(addr, e))?;
    http_server(state, listener, true)
}

/// Serves the API on a socket already bound (`warden serve` binds before it opens the journal, so
/// a port in use fails before the journal is touched). Must run inside an actix `System`.
///
/// The server does not act on SIGTERM or SIGINT: the caller stops it (with its
/// [`actix_web::dev::Server::handle`]). actix's own handling stops the whole actix `System` after a
/// signal, and with it the supervisor's arbiters — every agent's actor dropped before the team was
/// shut down, which read as a crash of each (`warden serve` stops the server, then the team).
///
/// # Errors
///
/// [`ServeError::NoTokenOnPublicAddress`] (see [`check_listen`]) and [`ServeError::Io`] when the
/// socket's address cannot be read or the server cannot start on it.
pub fn listen_on(
    state: ApiState,
    listener: std::net::TcpListener,
) -> Result<(actix_web::dev::Server, Vec<SocketAddr>), ServeError> {
    http_server(state, listener, false)
}

/// The API's server on `listener`; `signals`: actix stops it (and the `System`) on SIGTERM/SIGINT.
fn http_server(
    state: ApiState,
    listener: std::net::TcpListener,
    signals: bool,
) -> Result<(actix_web::dev::Server, Vec<SocketAddr>), ServeError> {
    let addr = listener.local_addr()?;
    check_listen(addr, &state.config)?;
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new().configure(configure(state.clone()))
    })
    .workers(api_workers());
    let server = if signals {
        server
    } else {
        server.disable_signals()
    };
    let server = server.listen(listener)?;
    let addrs = server.addrs();
    Ok((server.run(), addrs))
}

/// Serves the API on `addr` until the server stops (must run inside an actix `System`).
///
/// # Errors
///
/// Those of [`bind`], and [`ServeError::Io`] if the server fails while it runs.
///
/// # Cancel safety
///
/// Dropping the future stops serving: the listener closes and the workers are shut down without
/// grace (requests in flight and open event streams are cut). The team is not touched: a halt
/// already applied stays applied.
pub async fn serve(state: ApiState, addr: SocketAddr) -> Result<(), ServeError> {
    let (server, _) = bind(state, addr)?;
    server.await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, token_matches};

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
}
