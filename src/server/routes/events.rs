//! Events: `POST /api/agents/{key}/events` (and its fate), `GET /api/agents/{key}/events/{id}`,
//! the stream `GET /api/events` and `GET /api/events/recent`.

use crate::server::api::*;
use actix_web::{
    http::{header, StatusCode},
    web, HttpRequest, HttpResponse,
};
use serde::{Deserialize, Serialize};
use warden_actors::{AskError, Submit, SubmitError};
use warden_protocols::{AgentKey, EventFate, UserEvent, WorkRefusal};

/// `GET /api/events` query: `?agent=KEY` keeps one agent's events and notices.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// The agent's key (`404` if the team has no such agent); `None`: every agent's.
    #[serde(default)]
    pub agent: Option<String>,
}

pub(crate) async fn events(
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
pub(crate) fn agent_filter(
    state: &ApiState,
    agent: Option<String>,
) -> Result<Option<AgentKey>, ApiError> {
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
pub(crate) async fn recent_events(
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
    pub(crate) fn wait(&self) -> Result<Option<std::time::Duration>, ApiError> {
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
pub(crate) fn fate_response(id: u64, fate: &EventFate, duplicate: bool) -> HttpResponse {
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
pub(crate) async fn post_event(
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

pub(crate) async fn post_event_in(
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
pub(crate) fn not_durable_event(
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
pub(crate) fn refused(refusal: &WorkRefusal) -> HttpResponse {
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

/// `GET /api/agents/{key}/events/{id}`: what became of an event, from the journal (so after a
/// restart too).
pub(crate) async fn get_event(
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
