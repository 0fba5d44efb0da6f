//! The authenticated HTTP admin API (actix-web).
//!
//! Every `/api` call needs `Authorization: Bearer TOKEN`: the read token or the admin token for `GET`,
//! the admin token for every mutating call (401 without a valid token, 403 for the read token on a
//! mutating call). Tokens are compared in constant time. With no token configured nothing under
//! `/api` is reachable. `GET /healthz` is open.
//!
//! Unlock, emergency clear and history reset come only from here (or the CLI / embedding code),
//! never from an agent's event content or model output: an event is data, delivered to the agent's
//! mailbox (or refused while it is locked out) and never interpreted.
//!
//! Errors are JSON `{"error": "..."}`: 400 malformed JSON (with serde's message), 401, 403, 404
//! unknown agent or intervention, 409 the agent refuses (locked out, stopped, not locked out), 413
//! body larger than [`ApiConfig::body_limit`], 429 mailbox full, 503 agent shut down.

use actix_web::{
    dev::Payload,
    error::JsonPayloadError,
    http::{header, StatusCode},
    web, FromRequest, HttpRequest, HttpResponse, ResponseError,
};
use serde::{Deserialize, Serialize};
use std::{future::Future, sync::Arc};
use warden_actors::{
    safety::{AnswerError, ChannelInterventionBus},
    ControlError, HaltAck, Supervisor,
};
use warden_protocols::{Answer, HaltCause, UserEvent, WorkRefusal};

/// Default request body limit (bytes).
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The operator name journaled for calls made with the admin token.
pub const API_OPERATOR: &str = "api:admin";

/// Tokens and limits.
#[derive(Clone, Default)]
pub struct ApiConfig {
    /// Full access (mutating calls). `WARDEN_ADMIN_TOKEN`.
    pub admin_token: Option<String>,
    /// Read-only access (`GET`).
    pub read_token: Option<String>,
    /// Largest accepted JSON body in bytes (0 = [`DEFAULT_BODY_LIMIT`]).
    pub body_limit: usize,
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("read_token", &self.read_token.as_ref().map(|_| "***"))
            .field("body_limit", &self.body_limit)
            .finish()
    }
}

impl ApiConfig {
    /// Admin token from `WARDEN_ADMIN_TOKEN`, read token from `WARDEN_READ_TOKEN` (empty = unset).
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        ApiConfig {
            admin_token: var("WARDEN_ADMIN_TOKEN"),
            read_token: var("WARDEN_READ_TOKEN"),
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }

    fn limit(&self) -> usize {
        if self.body_limit == 0 {
            DEFAULT_BODY_LIMIT
        } else {
            self.body_limit
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    pub supervisor: Supervisor,
    /// The intervention bus the supervisor's limit checkpoint asks (for `/api/interventions`).
    pub bus: Option<Arc<ChannelInterventionBus>>,
    pub config: ApiConfig,
}

/// `a == b` without an early exit on the first differing byte.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().map_or(0x100, usize::from);
        let y = b.get(i).copied().map_or(0x200, usize::from);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// An API error: a status and a message, sent as `{"error": message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
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
        response.json(serde_json::json!({ "error": self.message }))
    }
}

impl From<ControlError> for ApiError {
    fn from(err: ControlError) -> Self {
        let status = match err {
            ControlError::NotActive | ControlError::NotStopped => StatusCode::CONFLICT,
            ControlError::Closed => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, err.to_string())
    }
}

/// Which token a request carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Admin,
}

fn access_of(req: &HttpRequest) -> Result<Access, ApiError> {
    let state = req
        .app_data::<web::Data<ApiState>>()
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "api state missing"))?;
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "missing bearer token"))?;
    let matches = |configured: &Option<String>| {
        configured
            .as_deref()
            .is_some_and(|c| constant_time_eq(c.as_bytes(), token.as_bytes()))
    };
    // Both are compared, so the time taken does not tell which one matched.
    let admin = matches(&state.config.admin_token);
    let read = matches(&state.config.read_token);
    if admin {
        Ok(Access::Admin)
    } else if read {
        Ok(Access::Read)
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid bearer token",
        ))
    }
}

/// Extractor: a request with the read or the admin token.
pub struct Reader;

/// Extractor: a request with the admin token (403 for the read token).
pub struct Admin;

impl FromRequest for Reader {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(access_of(req).map(|_| Reader))
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
            Err(err) => Err(err),
        })
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

/// Registers the routes with `state`: `App::new().configure(api::configure(state))`.
pub fn configure(state: ApiState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        let limit = state.config.limit();
        cfg.app_data(web::Data::new(state))
            .app_data(
                web::JsonConfig::default()
                    .limit(limit)
                    .error_handler(json_error),
            )
            .route("/healthz", web::get().to(healthz))
            .service(
                web::scope("/api")
                    .route("/agents", web::get().to(list_agents))
                    .route("/agents/{key}", web::get().to(get_agent))
                    .route("/agents/{key}/events", web::post().to(post_event))
                    .route("/halt", web::post().to(halt_all))
                    .route("/agents/{key}/halt", web::post().to(halt_agent))
                    .route("/agents/{key}/unlock", web::post().to(unlock))
                    .route("/agents/{key}/emergency/clear", web::post().to(clear))
                    .route("/agents/{key}/history/reset", web::post().to(reset_history))
                    .route("/interventions", web::get().to(list_interventions))
                    .route("/interventions/{id}", web::post().to(answer_intervention)),
            );
    }
}

type Handled = Result<HttpResponse, ApiError>;

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

async fn list_agents(_: Reader, state: web::Data<ApiState>) -> Handled {
    Ok(HttpResponse::Ok().json(state.supervisor.statuses()))
}

async fn get_agent(_: Reader, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    let agent = state
        .supervisor
        .get(&key)
        .ok_or_else(|| ApiError::unknown_agent(&key))?;
    Ok(HttpResponse::Ok().json(agent.status()))
}

/// `POST /api/agents/{key}/events` answers `202 {"id": N}` (the event's id, unique in the agent's
/// journal) once the event is queued and its acceptance is durable: after a crash it is queued again
/// or already in the history.
#[derive(Serialize, Deserialize)]
pub struct Queued {
    pub id: u64,
}

async fn post_event(
    _: Admin,
    state: web::Data<ApiState>,
    key: web::Path<String>,
    event: web::Json<UserEvent>,
) -> Handled {
    let agent = state
        .supervisor
        .get(&key)
        .ok_or_else(|| ApiError::unknown_agent(&key))?;
    match agent.try_send_event_durable(event.into_inner()).await {
        Ok(id) => Ok(HttpResponse::Accepted().json(Queued { id })),
        Err(err) => {
            let status = match err.refusal {
                WorkRefusal::LockedOut { .. } | WorkRefusal::Stopped => StatusCode::CONFLICT,
                WorkRefusal::MailboxFull { .. } => StatusCode::TOO_MANY_REQUESTS,
                WorkRefusal::Closed => StatusCode::SERVICE_UNAVAILABLE,
            };
            Ok(HttpResponse::build(status).json(serde_json::json!({
                "error": err.refusal.to_string(),
                "refusal": err.refusal,
            })))
        }
    }
}

/// One halt acknowledgement, as JSON.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct HaltAckBody {
    pub agent: String,
    pub state: warden_protocols::AgentState,
    pub discarded: u64,
}

fn acks(acks: Vec<HaltAck>) -> HttpResponse {
    let halted: Vec<HaltAckBody> = acks
        .into_iter()
        .map(|a| HaltAckBody {
            agent: a.agent.to_string(),
            state: a.state,
            discarded: a.discarded,
        })
        .collect();
    HttpResponse::Ok().json(serde_json::json!({ "halted": halted }))
}

async fn halt_all(_: Admin, state: web::Data<ApiState>) -> Handled {
    Ok(acks(state.supervisor.halt_all().await))
}

async fn halt_agent(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    let cause = HaltCause::Operator {
        operator: API_OPERATOR.into(),
    };
    let result = state
        .supervisor
        .halt(&key, cause)
        .await
        .map_err(|_| ApiError::unknown_agent(&key))?;
    Ok(acks(result))
}

/// Runs an operator control on an agent and answers with its new status.
async fn control<F, Fut>(state: &ApiState, key: &str, op: F) -> Handled
where
    F: FnOnce(warden_actors::AgentHandle) -> Fut,
    Fut: Future<Output = Result<(), ControlError>>,
{
    let agent = state
        .supervisor
        .get(key)
        .ok_or_else(|| ApiError::unknown_agent(key))?;
    op(agent.clone()).await?;
    Ok(HttpResponse::Ok().json(agent.status()))
}

async fn unlock(_: Admin, state: web::Data<ApiState>, key: web::Path<String>) -> Handled {
    control(
        &state,
        &key,
        |a| async move { a.unlock(API_OPERATOR).await },
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

async fn list_interventions(_: Reader, state: web::Data<ApiState>) -> Handled {
    let pending = state
        .bus
        .as_ref()
        .map(|bus| bus.pending())
        .unwrap_or_default();
    Ok(HttpResponse::Ok().json(pending))
}

/// `POST /api/interventions/{id}` body: `{"answer": "yes"}` (`yes`/`y`, `no`/`n`; anything else is
/// a no).
#[derive(Serialize, Deserialize)]
pub struct AnswerBody {
    pub answer: String,
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
    let bus = state.bus.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no pending intervention with id {id}"),
        )
    })?;
    let answer = Answer::parse(&body.answer);
    bus.answer(id, answer.clone())
        .map_err(|AnswerError::Unknown(id)| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no pending intervention with id {id}"),
            )
        })?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "id": id, "answer": answer })))
}

/// Why `serve` would not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("refusing to listen on non-loopback address {0} without an admin token (set WARDEN_ADMIN_TOKEN)")]
    NoTokenOnPublicAddress(std::net::SocketAddr),
    #[error("listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Refuses a non-loopback address when no admin token is configured.
pub fn check_listen(addr: std::net::SocketAddr, config: &ApiConfig) -> Result<(), ServeError> {
    if config.admin_token.is_none() && !addr.ip().is_loopback() {
        return Err(ServeError::NoTokenOnPublicAddress(addr));
    }
    Ok(())
}

/// Serves the API on `addr` until the server stops (must run inside an actix `System`).
pub async fn serve(state: ApiState, addr: std::net::SocketAddr) -> Result<(), ServeError> {
    check_listen(addr, &state.config)?;
    actix_web::HttpServer::new(move || actix_web::App::new().configure(configure(state.clone())))
        .workers(1)
        .bind(addr)?
        .run()
        .await?;
    Ok(())
}

/// The team `warden serve` runs when no `--config` is given: one assistant on the scripted model.
pub const DEFAULT_TEAM: &str = r#"
[providers.scripted]
kind = "scripted"
replies = ["Hello! I am a scripted assistant."]

[[agents]]
key = "assistant"
provider = "scripted"
"#;

/// `warden serve`: opens the journal at `db`, recovers every agent recorded there
/// ([`crate::journal::SqliteJournal::recover_records`]), spawns the team (restored agents keep their
/// state, lockout and history) and serves the API on `addr` until stopped.
pub async fn serve_team(
    file: crate::team::TeamFile,
    db: &std::path::Path,
    addr: std::net::SocketAddr,
    config: ApiConfig,
) -> Result<(), Box<dyn std::error::Error>> {
    check_listen(addr, &config)?;
    let journal = Arc::new(crate::journal::SqliteJournal::open_with(
        db,
        crate::journal::JournalOptions::from(&file.config.journal),
    )?);
    let records = journal.recover_records()?;
    let bus = Arc::new(ChannelInterventionBus::new());
    let supervisor = Supervisor::builder(file.config.clone(), journal.clone())
        .intervention_bus(bus.clone())
        .build();
    file.spawn_agents_restored(&supervisor, &records)?;
    eprintln!(
        "warden: serving {} agents on http://{addr} (journal {}, {} restored)",
        supervisor.len(),
        db.display(),
        records.len()
    );
    serve(
        ApiState {
            supervisor: supervisor.clone(),
            bus: Some(bus),
            config,
        },
        addr,
    )
    .await?;
    supervisor.shutdown().await;
    journal.close();
    Ok(())
}
