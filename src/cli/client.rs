//! The client behind `warden status|halt|unlock|clear|ask`: typed calls to a running server's admin
//! API, and their output.
//!
//! Guarantees:
//! * Every failure is one [`ClientError`] whose message is one line (the server's own `error` text
//!   for an HTTP error), and [`ClientError::exit_code`] tells the kinds apart: 3 the server cannot be
//!   reached, 4 unauthorized (401), 5 forbidden (403), 6 not found (404), 7 refused (409), 8 an event
//!   sent with `warden send` ended without an answer (refused, discarded or failed), 16 an event
//!   sent with `warden send --wait S` was still pending or running after S seconds
//!   ([`EXIT_STILL_PENDING`]), 1 anything else.
//! * The token travels only in the `Authorization` header; it is never put in a URL or printed.
//! * An agent key is percent-encoded as one path segment, whatever it contains.

use reqwest::{Method, Url};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::{io::Write, time::Duration};
use warden_protocols::{AgentStatus, Event, Intervention};

use crate::journal::EventLines;
use crate::server::api::{AnswerBody, AnswerReply, HaltAckBody};
use crate::server::events::RecentEvents;

/// Where the client looks by default (`--url`, `WARDEN_URL`).
pub const DEFAULT_URL: &str = "http://127.0.0.1:7878";

/// How long one call may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// How long connecting to the server may take (the event stream's connection).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the event stream may stay silent before it counts as broken and is reconnected: three
/// of the server's keep-alive periods (`events::DEFAULT_KEEP_ALIVE`, 15 s).
const STREAM_IDLE: Duration = Duration::from_secs(45);

/// The first and the longest wait before reconnecting a broken event stream (doubling between).
const RECONNECT_FIRST: Duration = Duration::from_millis(500);
const RECONNECT_MAX: Duration = Duration::from_secs(8);

/// `warden send --wait S`: the exit code when the event has no answer yet after S seconds (it
/// stays queued or running on the server).
pub const EXIT_STILL_PENDING: u8 = 16;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server URL is not `HOST:PORT` or an http(s) URL (exit code 1).
    #[error("invalid server url {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server could not be reached: refused, unknown host, connect timeout (exit code 3).
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The server's base URL.
        url: String,
        /// The innermost cause, on one line (`Connection refused (os error 111)`).
        reason: String,
    },
    /// The request failed after connecting: a timeout ([`TIMEOUT`]), a dropped connection
    /// (exit code 1).
    #[error("request to {url} failed: {reason}")]
    Request {
        /// The URL of the call.
        url: String,
        /// The innermost cause, on one line.
        reason: String,
    },
    /// The server answered with an error status; `message` is its `error` text.
    #[error("{status} {reason}: {message}")]
    Http {
        /// The status code: 401, 403, 404 and 409 have exit codes of their own (4 to 7).
        status: u16,
        /// Its reason phrase, lower-case (`not found`).
        reason: String,
        /// The server's `error` text, or the start of the body (200 characters) when it sent
        /// none, on one line.
        message: String,
    },
    /// A success status with a body that is not what the call expects (exit code 1).
    #[error("unexpected answer from {url}: {reason}")]
    Decode {
        /// The URL of the call.
        url: String,
        /// The decoder's message.
        reason: String,
    },
    /// Writing the command's output failed (exit code 1).
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// `warden send`: the event was accepted but ended without an answer.
    #[error("event {id} {status}: {detail}")]
    NotAnswered {
        /// The user event's id.
        id: u64,
        /// Its fate's status: `refused`, `discarded`, `failed` (or one a newer server names).
        status: String,
        /// Why, from the fate (`error`, `reason` or the refusal's reason); may be empty.
        detail: String,
    },
    /// `warden send --wait S`: the event was accepted and is still pending or running after S
    /// seconds (exit code [`EXIT_STILL_PENDING`]). The message says what it may be waiting for.
    #[error("{}", still_pending(.id, .status, .waited, .key, .asks, .other_asks))]
    StillPending {
        /// The user event's id.
        id: u64,
        /// Its fate's status: `pending` or `running`.
        status: String,
        /// The seconds waited (`--wait`).
        waited: f64,
        /// The agent it was sent to.
        key: String,
        /// The ids of the pending asks (limits, tool permissions) of that agent, oldest first.
        asks: Vec<u64>,
        /// How many asks of other agents (its delegates, say) are pending.
        other_asks: usize,
    },
}

/// The message of [`ClientError::StillPending`]: what the event may wait for and what to do.
fn still_pending(
    id: &u64,
    status: &str,
    waited: &f64,
    key: &str,
    asks: &[u64],
    other_asks: &usize,
) -> String {
    let mut text = format!(
        "event {id} still {status} after {waited} s (no answer yet; it stays on the server)"
    );
    match asks {
        [] => text.push_str(&format!(
            "; if an operator ask holds it, `warden ask` lists the pending asks{}",
            if *other_asks > 0 {
                format!(" ({other_asks} pending for other agents)")
            } else {
                String::new()
            }
        )),
        [ask] => text.push_str(&format!(
            "; {key} waits for an operator: ask {ask} is pending, answer it with `warden ask {ask} yes|no`"
        )),
        many => {
            let ids: Vec<String> = many.iter().map(u64::to_string).collect();
            text.push_str(&format!(
                "; {key} waits for an operator: asks {} are pending, answer each with `warden ask ID yes|no`",
                ids.join(", ")
            ));
        }
    }
    text.push_str(&format!(
        "; follow it with `warden events --agent {key} --follow`, or send again with a longer --wait (up to 300)"
    ));
    text
}

impl ClientError {
    /// The process exit code for this error (see the module docs).
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Connect { .. } => 3,
            ClientError::Http { status: 401, .. } => 4,
            ClientError::Http { status: 403, .. } => 5,
            ClientError::Http { status: 404, .. } => 6,
            ClientError::Http { status: 409, .. } => 7,
            ClientError::NotAnswered { .. } => 8,
            ClientError::StillPending { .. } => EXIT_STILL_PENDING,
            _ => 1,
        }
    }
}

/// The innermost cause of an error, on one line (e.g. `Connection refused (os error 111)`).
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    one_line(&cause.to_string())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The error of a response with an error status: the server's `error` text when it sent one.
async fn http_error(response: reqwest::Response) -> ClientError {
    let status = response.status();
    let bytes = response.bytes().await.unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(200).collect());
    ClientError::Http {
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or("error").to_lowercase(),
        message: one_line(&message),
    }
}

/// One message of the event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// A journal event (the SSE message has an `id`: its `seq`).
    Event(Event),
    /// A message without an id: an intervention notice (`intervention_asked`, `…_answered`,
    /// `…_withdrawn`), `lagged`, `replay_unavailable`, or anything a newer server sends.
    Notice {
        /// The SSE event name (`message` when the server sent none).
        kind: String,
        /// The SSE data as JSON (a JSON string when it is not JSON).
        data: Value,
    },
}

impl StreamItem {
    fn from_sse(id: &str, kind: &str, data: &str) -> Self {
        let value = serde_json::from_str::<Value>(data).unwrap_or_else(|_| Value::from(data));
        if !id.is_empty() {
            if let Ok(event) = serde_json::from_value::<Event>(value.clone()) {
                return StreamItem::Event(event);
            }
        }
        StreamItem::Notice {
            kind: if kind.is_empty() { "message" } else { kind }.to_owned(),
            data: value,
        }
    }
}

/// What [`Client::follow_events`] gives its callback.
#[derive(Debug, Clone, PartialEq)]
pub enum Followed {
    /// The next message of the stream.
    Item(StreamItem),
    /// The stream broke; it is reconnected after `wait`, resuming after event `after`.
    Reconnecting {
        /// The last journal `seq` seen (the `Last-Event-ID` of the next connection).
        after: u64,
        /// Why it broke, on one line.
        reason: String,
        /// How long before the next attempt: 0.5 s, doubling to at most 8 s, back to 0.5 s once
        /// a message comes through.
        wait: Duration,
    },
}

/// The token a command uses: `--token` when given, else `WARDEN_ADMIN_TOKEN`, else (for a read-only
/// command) `WARDEN_READ_TOKEN`. Empty values count as unset. `env` looks a variable up.
pub fn token_for(
    flag: Option<String>,
    read_only: bool,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    flag.filter(|t| !t.is_empty())
        .or_else(|| var("WARDEN_ADMIN_TOKEN"))
        .or_else(|| read_only.then(|| var("WARDEN_READ_TOKEN")).flatten())
}

/// A connection to one server.
pub struct Client {
    http: reqwest::Client,
    /// For the event stream: no overall timeout, but an idle one (the server sends keep-alives).
    stream_http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Client {
    /// A client of the server at `url` (`http://host:port`, optionally with a path prefix; without a
    /// scheme, `host:port` is taken as `http://host:port`). `token` is sent as
    /// `Authorization: Bearer` with every call; `None`: no header (only `/healthz` answers then).
    /// Nothing is sent until a call is made.
    ///
    /// # Errors
    ///
    /// [`ClientError::Url`] for a URL that is not http(s) with a host, or when the HTTP client
    /// cannot be built.
    ///
    /// # Examples
    ///
    /// ```
    /// use warden::cli::client::{Client, ClientError};
    ///
    /// let client = Client::new("127.0.0.1:7878", Some("s3cret".into()))?; // http:// implied
    /// assert!(matches!(Client::new("ftp://host", None), Err(ClientError::Url { .. })));
    /// # drop(client);
    /// # Ok::<(), ClientError>(())
    /// ```
    pub fn new(url: &str, token: Option<String>) -> Result<Self, ClientError> {
        let invalid = |reason: &str| ClientError::Url {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        // `HOST:PORT` without a scheme (`127.0.0.1:7878`, `localhost:7878`) means http.
        let with_scheme;
        let parsed = if url.contains("://") || url.contains('@') || url.trim().is_empty() {
            url
        } else {
            with_scheme = format!("http://{url}");
            &with_scheme
        };
        let base = Url::parse(parsed).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(invalid(
                "expected HOST:PORT, http://HOST:PORT or https://HOST:PORT",
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| invalid(&root_cause(&e)))?;
        let stream_http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(STREAM_IDLE)
            .build()
            .map_err(|e| invalid(&root_cause(&e)))?;
        Ok(Client {
            http,
            stream_http,
            base,
            token,
        })
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        // `new` refused URLs that cannot be a base, so the segments are always added.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<Value>,
    ) -> Result<T, ClientError> {
        self.call_url(method, self.url(segments), body, None).await
    }

    async fn call_url<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<Value>,
        timeout: Option<Duration>,
    ) -> Result<T, ClientError> {
        let shown = url.to_string();
        let mut request = self.http.request(method, url);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.send_error(&e, &shown))?;
        let status = response.status();
        if !status.is_success() {
            return Err(http_error(response).await);
        }
        let bytes = response.bytes().await.map_err(|e| ClientError::Request {
            url: shown.clone(),
            reason: root_cause(&e),
        })?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
            url: shown,
            reason: e.to_string(),
        })
    }

    fn send_error(&self, e: &reqwest::Error, shown: &str) -> ClientError {
        let reason = root_cause(e);
        if e.is_connect() {
            ClientError::Connect {
                url: self.base.to_string(),
                reason,
            }
        } else {
            ClientError::Request {
                url: shown.to_owned(),
                reason,
            }
        }
    }

    /// The last `limit` journal events (of `agent` only, when given), oldest first, and the
    /// journal's head `seq` (`GET /api/events/recent`). `limit` is 0 to 1000 (more is refused
    /// with a 400).
    ///
    /// # Errors
    ///
    /// As every call: [`ClientError::Connect`], [`ClientError::Request`], [`ClientError::Http`]
    /// for an error status (404 for an unknown agent, 503 for a server without a journal),
    /// [`ClientError::Decode`] for an unexpected body.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future of any call of the client drops its request. A reading call loses
    /// nothing; a mutating one (halt, send, …) may or may not have reached the server, which then
    /// completes it all the same (read the agent's status, or the event's fate, to know).
    pub async fn recent_events(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<RecentEvents, ClientError> {
        let mut url = self.url(&["api", "events", "recent"]);
        url.query_pairs_mut()
            .append_pair("limit", &limit.to_string());
        if let Some(agent) = agent {
            url.query_pairs_mut().append_pair("agent", agent);
        }
        self.call_url(Method::GET, url, None, None).await
    }

    /// Follows the event stream (`GET /api/events`) from just after `after` (take it from
    /// [`Client::recent_events`]'s `head`, which also tells the server is there), giving each item
    /// to `each` in order, until `each` fails or the server refuses the stream. A connection that
    /// fails or breaks (the server restarts, the network drops, 45 s of silence) is retried with
    /// `Last-Event-ID` set to the last event seen, so no event is missed or repeated, for as long as
    /// it takes (as `tail -F` does); `each` hears of each retry first ([`Followed::Reconnecting`]),
    /// and waits grow from 0.5 s to 8 s.
    ///
    /// # Errors
    ///
    /// An HTTP error status other than 503 at any (re)connection ends the stream with
    /// [`ClientError::Http`] (401, 403, 404 for an agent the server no longer has); an error from
    /// `each` is returned as it is.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the stream; nothing is lost on the server (a later call with the
    /// last seen `seq` as `after` resumes it).
    pub async fn follow_events(
        &self,
        agent: Option<&str>,
        mut after: u64,
        each: &mut dyn FnMut(Followed) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        use eventsource_stream::Eventsource;
        use futures::StreamExt;

        let mut url = self.url(&["api", "events"]);
        if let Some(agent) = agent {
            url.query_pairs_mut().append_pair("agent", agent);
        }
        let mut wait = RECONNECT_FIRST;
        loop {
            let mut request = self
                .stream_http
                .get(url.clone())
                .header("Accept", "text/event-stream")
                .header("Last-Event-ID", after.to_string());
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let broken = match request.send().await {
                Err(e) => root_cause(&e),
                Ok(response) if response.status().is_success() => {
                    let mut stream = response.bytes_stream().eventsource();
                    loop {
                        match stream.next().await {
                            None => break "the server closed the stream".to_owned(),
                            Some(Err(e)) => break one_line(&e.to_string()),
                            Some(Ok(message)) => {
                                let item = StreamItem::from_sse(
                                    &message.id,
                                    &message.event,
                                    &message.data,
                                );
                                if let StreamItem::Event(event) = &item {
                                    after = after.max(event.seq);
                                }
                                wait = RECONNECT_FIRST;
                                each(Followed::Item(item))?;
                            }
                        }
                    }
                }
                Ok(response) if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                    http_error(response).await.to_string()
                }
                Ok(response) => return Err(http_error(response).await),
            };
            each(Followed::Reconnecting {
                after,
                reason: broken,
                wait,
            })?;
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RECONNECT_MAX);
        }
    }

    /// Every agent's status, in spawn order.
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the request; nothing changes on the server.
    pub async fn statuses(&self) -> Result<Vec<AgentStatus>, ClientError> {
        self.call(Method::GET, &["api", "agents"], None).await
    }

    /// One agent's status.
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`] (404 for an unknown agent).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the request; nothing changes on the server.
    pub async fn status(&self, key: &str) -> Result<AgentStatus, ClientError> {
        self.call(Method::GET, &["api", "agents", key], None).await
    }

    /// Halts one agent (and its delegates), or every agent when `key` is `None`.
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`]: 403 with the read token, 404 for an unknown agent, 503 when
    /// the halt was applied but could not be made durable.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn halt(&self, key: Option<&str>) -> Result<Vec<HaltAckBody>, ClientError> {
        #[derive(serde::Deserialize)]
        struct Halted {
            halted: Vec<HaltAckBody>,
        }
        let halted: Halted = match key {
            Some(key) => {
                self.call(Method::POST, &["api", "agents", key, "halt"], None)
                    .await?
            }
            None => self.call(Method::POST, &["api", "halt"], None).await?,
        };
        Ok(halted.halted)
    }

    /// Unlocks a locked-out agent; its new status.
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`]: 403 with the read token, 404 for an unknown agent, 409 when
    /// the agent's state does not allow it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn unlock(&self, key: &str) -> Result<AgentStatus, ClientError> {
        self.unlock_with_reason(key, None).await
    }

    /// [`Client::unlock`] with why, journaled with the unlock (`Unlocked.note`).
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Client::unlock`].
    pub async fn unlock_with_reason(
        &self,
        key: &str,
        reason: Option<&str>,
    ) -> Result<AgentStatus, ClientError> {
        let body = reason.map(|reason| serde_json::json!({ "reason": reason }));
        self.call(Method::POST, &["api", "agents", key, "unlock"], body)
            .await
    }

    /// Pauses an agent (ordinary work stays queued); its new status.
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn pause(&self, key: &str) -> Result<AgentStatus, ClientError> {
        self.call(Method::POST, &["api", "agents", key, "pause"], None)
            .await
    }

    /// Resumes a paused or stopped agent; its new status.
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`] (409 for a locked-out agent: a resume never lifts a lockout).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn resume(&self, key: &str) -> Result<AgentStatus, ClientError> {
        self.call(Method::POST, &["api", "agents", key, "resume"], None)
            .await
    }

    /// Lifts the fleet halt (`POST /api/resume`, with `reason` journaled): the server's answer,
    /// `{"resumed": [{agent, node?}], "kept": [{agent, node?, why}]}` (and `epoch` on a cluster
    /// node).
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`]: 403 with the read token, 409 when no fleet halt stands (or,
    /// on a cluster node, a halt came since the lift read the halt key), 503 when a cluster node
    /// cannot write the lift.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn resume_all(&self, reason: Option<&str>) -> Result<Value, ClientError> {
        let body = match reason {
            Some(reason) => serde_json::json!({ "reason": reason }),
            None => serde_json::json!({}),
        };
        self.call(Method::POST, &["api", "resume"], Some(body))
            .await
    }

    /// Clears an agent's emergency stop; its new status.
    ///
    /// # Errors
    ///
    /// As [`Client::unlock`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn clear(&self, key: &str) -> Result<AgentStatus, ClientError> {
        self.call(
            Method::POST,
            &["api", "agents", key, "emergency", "clear"],
            None,
        )
        .await
    }

    /// Sends a user event to `key`; with `wait` (seconds, 0–300) waits that long for its answer.
    /// The body is the event's fate: `{"id", "status", "answer"?, …}` (see the API). Without
    /// `wait` the call returns once the event's acceptance is durable (status `pending`).
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`], with [`ClientError::Http`] for: 400, a `wait` out of range;
    /// 403, the read token; 404, an unknown agent; 409, the agent is locked out or stopped; 429,
    /// its mailbox is full; 503, its journal is degraded or it is shut down; 500, the event was
    /// queued but its acceptance could not be made durable. A fate that is not an answer is not
    /// an error here ([`run`] makes it [`ClientError::NotAnswered`]).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn send(
        &self,
        key: &str,
        content: &str,
        wait: Option<f64>,
    ) -> Result<Value, ClientError> {
        let mut url = self.url(&["api", "agents", key, "events"]);
        if let Some(wait) = wait {
            url.query_pairs_mut().append_pair("wait", &wait.to_string());
        }
        // The server holds the request up to `wait`: the call may take that long and more.
        let timeout = wait.map(|w| TIMEOUT + Duration::from_secs_f64(w.clamp(0.0, 300.0)));
        self.call_url(
            Method::POST,
            url,
            Some(serde_json::json!({ "content": content, "source": "cli" })),
            timeout,
        )
        .await
    }

    /// The pending asks (limits and tool permissions), oldest first.
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the request; nothing changes on the server.
    pub async fn interventions(&self) -> Result<Vec<Intervention>, ClientError> {
        self.call(Method::GET, &["api", "interventions"], None)
            .await
    }

    /// Answers pending ask `id` (`yes` allows; anything else refuses).
    ///
    /// # Errors
    ///
    /// As [`Client::recent_events`]: 403 with the read token, 404 when no ask `id` is pending.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the request, which may or may not have reached the server
    /// (see [`Client::recent_events`]).
    pub async fn answer(
        &self,
        id: u64,
        answer: &str,
        note: Option<&str>,
    ) -> Result<AnswerReply, ClientError> {
        let body = AnswerBody {
            answer: answer.to_owned(),
            note: note.map(str::to_owned),
        };
        let body = serde_json::to_value(body).map_err(|e| ClientError::Decode {
            url: self.base.to_string(),
            reason: e.to_string(),
        })?;
        let id_text = id.to_string();
        self.call(
            Method::POST,
            &["api", "interventions", &id_text],
            Some(body),
        )
        .await
    }
}

/// One CLI command.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `warden status [KEY] [--json]`.
    Status {
        /// One agent; `None`: every agent.
        key: Option<String>,
        /// JSON instead of the table.
        json: bool,
    },
    /// `warden halt [KEY]`.
    Halt {
        /// One agent (and its delegates); `None`: every agent.
        key: Option<String>,
    },
    /// `warden unlock KEY [--reason TEXT]`.
    Unlock {
        /// The agent.
        key: String,
        /// Why (journaled with the unlock).
        reason: Option<String>,
    },
    /// `warden clear KEY`.
    Clear {
        /// The agent.
        key: String,
    },
    /// `warden pause KEY`.
    Pause {
        /// The agent.
        key: String,
    },
    /// `warden resume KEY`.
    Resume {
        /// The agent.
        key: String,
    },
    /// `warden resume --all [--reason TEXT]`: lift the fleet halt.
    ResumeAll {
        /// Why (journaled); `None`: no reason.
        reason: Option<String>,
    },
    /// `warden ask [--json]`: the pending asks.
    Asks {
        /// JSON instead of the list.
        json: bool,
    },
    /// `warden ask ID yes|no [--note TEXT]`.
    Answer {
        /// The intervention's id.
        id: u64,
        /// `yes`/`y` allows; anything else refuses.
        answer: String,
        /// Journaled with the decision; `None`: no note.
        note: Option<String>,
    },
    /// `warden events [--agent KEY] [--last N] [--follow] [--json]`.
    Events {
        /// One agent's events and notices; `None`: every agent's.
        agent: Option<String>,
        /// How many of the latest events to print first (0 to 1000).
        last: usize,
        /// Then keep printing new ones as they come, reconnecting when the stream breaks.
        follow: bool,
        /// JSON lines instead of the table's lines.
        json: bool,
    },
    /// `warden send KEY TEXT [--wait S] [--json]`.
    Send {
        /// The agent.
        key: String,
        /// The user event's text.
        content: String,
        /// Seconds to wait for the answer (0 to 300); `None` or 0: return once it is queued. Still
        /// pending after a wait above 0: [`ClientError::StillPending`].
        wait: Option<f64>,
        /// The fate as JSON instead of the answer's text.
        json: bool,
    },
}

impl Call {
    /// Whether the read-only token is enough.
    pub fn read_only(&self) -> bool {
        matches!(
            self,
            Call::Status { .. } | Call::Asks { .. } | Call::Events { .. }
        )
    }
}

/// Runs `call` against `client` and writes its output to `out`: the entry point of every
/// `warden` command that talks to a server. The caller turns an error into the process's exit
/// code with [`ClientError::exit_code`].
///
/// # Errors
///
/// Those of the [`Client`] call it makes ([`ClientError::Connect`] when no server is there,
/// [`ClientError::Http`] when it refuses), [`ClientError::Output`] when `out` fails, and for
/// [`Call::Send`] [`ClientError::NotAnswered`] when the event was refused, discarded or failed, and
/// [`ClientError::StillPending`] when it has no answer after a `wait` above 0.
/// [`Call::Events`] with `follow` ends only with an error.
///
/// # Cancel safety
///
/// Dropping the future drops the request in flight: a halt, unlock or send may or may not have
/// reached the server (its status or fate tells), and output already written stays written.
/// Dropping a followed stream loses nothing on the server.
///
/// # Examples
///
/// ```
/// use warden::cli::client::{run, Call, Client, ClientError};
///
/// // A loopback port nobody listens on.
/// let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
/// let client = Client::new(&format!("127.0.0.1:{port}"), None)?;
/// let mut out = Vec::new();
/// let err = actix_rt::System::new()
///     .block_on(run(&client, Call::Status { key: None, json: true }, &mut out))
///     .unwrap_err();
/// assert!(matches!(err, ClientError::Connect { .. }));
/// assert_eq!(err.exit_code(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn run(client: &Client, call: Call, out: &mut dyn Write) -> Result<(), ClientError> {
    match call {
        Call::Status { key: None, json } => {
            let statuses = client.statuses().await?;
            if json {
                writeln!(out, "{}", to_json(&statuses)?)?;
            } else {
                out.write_all(status_table(&statuses).as_bytes())?;
            }
        }
        Call::Status {
            key: Some(key),
            json,
        } => {
            let status = client.status(&key).await?;
            if json {
                writeln!(out, "{}", to_json(&status)?)?;
            } else {
                out.write_all(status_table(std::slice::from_ref(&status)).as_bytes())?;
            }
        }
        Call::Halt { key } => {
            for ack in client.halt(key.as_deref()).await? {
                writeln!(
                    out,
                    "halted {}: {} ({} queued messages discarded)",
                    ack.agent, ack.state, ack.discarded
                )?;
            }
        }
        Call::Unlock { key, reason } => {
            let status = client.unlock_with_reason(&key, reason.as_deref()).await?;
            writeln!(out, "unlocked {}: {}", status.key, status.state)?;
        }
        Call::Clear { key } => {
            let status = client.clear(&key).await?;
            writeln!(out, "cleared {}: {}", status.key, status.state)?;
        }
        Call::Pause { key } => {
            let status = client.pause(&key).await?;
            writeln!(out, "paused {}: {}", status.key, status.state)?;
        }
        Call::Resume { key } => {
            let status = client.resume(&key).await?;
            writeln!(out, "resumed {}: {}", status.key, status.state)?;
        }
        Call::ResumeAll { reason } => {
            let lifted = client.resume_all(reason.as_deref()).await?;
            let at = |item: &Value| match item["node"].as_str() {
                Some(node) => format!(" (node {node})"),
                None => String::new(),
            };
            if let Some(epoch) = lifted["epoch"].as_u64() {
                writeln!(
                    out,
                    "cluster halt lifted (epoch {epoch}): every node resumes the agents it stopped"
                )?;
            }
            let none = Vec::new();
            for item in lifted["resumed"].as_array().unwrap_or(&none) {
                let agent = item["agent"].as_str().unwrap_or_default();
                writeln!(out, "resumed {agent}{}", at(item))?;
            }
            for item in lifted["kept"].as_array().unwrap_or(&none) {
                let agent = item["agent"].as_str().unwrap_or_default();
                let why = item["why"].as_str().unwrap_or_default();
                writeln!(out, "kept {agent}{}: {why}", at(item))?;
            }
        }
        Call::Asks { json } => {
            let pending = client.interventions().await?;
            if json {
                writeln!(out, "{}", to_json(&pending)?)?;
            } else {
                out.write_all(interventions_list(&pending).as_bytes())?;
            }
        }
        Call::Send {
            key,
            content,
            wait,
            json,
        } => {
            let fate = client.send(&key, &content, wait).await?;
            let status = fate["status"].as_str().unwrap_or("unknown").to_owned();
            let id = fate["id"].as_u64().unwrap_or(0);
            if json {
                writeln!(out, "{}", to_json(&fate)?)?;
            } else {
                match status.as_str() {
                    "answered" => writeln!(
                        out,
                        "{key}: {}{}",
                        fate["answer"].as_str().unwrap_or_default(),
                        if fate["truncated"].as_bool() == Some(true) {
                            crate::cli::run::TRUNCATED_MARK
                        } else {
                            ""
                        }
                    )?,
                    "pending" | "running" if !waited(wait) => writeln!(
                        out,
                        "event {id} queued ({status}); `warden events --agent {key}` shows its answer"
                    )?,
                    _ => {}
                }
            }
            if matches!(status.as_str(), "pending" | "running") {
                if let Some(waited) = wait.filter(|w| *w > 0.0) {
                    out.flush()?;
                    // What it may wait for: an operator's answer to an ask. A server that will not
                    // list them (an older one, a token without the right) leaves the generic hint.
                    let pending = client.interventions().await.unwrap_or_default();
                    let (asks, others): (Vec<_>, Vec<_>) =
                        pending.iter().partition(|i| i.agent.as_str() == key);
                    return Err(ClientError::StillPending {
                        id,
                        status,
                        waited,
                        key,
                        asks: asks.iter().map(|i| i.id).collect(),
                        other_asks: others.len(),
                    });
                }
            }
            if !matches!(status.as_str(), "answered" | "pending" | "running") {
                let detail = fate["error"]
                    .as_str()
                    .or_else(|| fate["reason"].as_str())
                    .or_else(|| fate["refusal"]["reason"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                return Err(ClientError::NotAnswered { id, status, detail });
            }
        }
        Call::Events {
            agent,
            last,
            follow,
            json,
        } => {
            let recent = client.recent_events(agent.as_deref(), last).await?;
            let mut lines = EventLines::default();
            lines.fit(&recent.events);
            for event in recent.events {
                write_item(out, &mut lines, json, &StreamItem::Event(event))?;
            }
            out.flush()?;
            if follow {
                client
                    .follow_events(agent.as_deref(), recent.head, &mut |followed| {
                        match followed {
                            Followed::Item(item) => {
                                write_item(out, &mut lines, json, &item)?;
                                out.flush()?;
                            }
                            Followed::Reconnecting {
                                after,
                                reason,
                                wait,
                            } => eprintln!(
                                "warden events: stream broken ({reason}); reconnecting in {:.1} s, \
                                 resuming after event {after}",
                                wait.as_secs_f64()
                            ),
                        }
                        Ok(())
                    })
                    .await?;
            }
        }
        Call::Answer { id, answer, note } => {
            let reply = client.answer(id, &answer, note.as_deref()).await?;
            let said = match &reply.answer {
                warden_protocols::Answer::Yes => "yes",
                _ => "no",
            };
            writeln!(out, "answered intervention {}: {said}", reply.id)?;
        }
    }
    Ok(())
}

/// One stream item as a line: an event as `warden journal tail` shows it; a notice with `-` for its
/// seq, the time it arrived, its agent and kind, then its data. With `json`, an event's JSON (as
/// `warden journal tail --json`) or `{"notice": KIND, "data": …}`.
fn write_item(
    out: &mut dyn Write,
    lines: &mut EventLines,
    json: bool,
    item: &StreamItem,
) -> Result<(), ClientError> {
    match (item, json) {
        (StreamItem::Event(event), false) => writeln!(out, "{}", lines.line(event))?,
        (StreamItem::Event(event), true) => writeln!(
            out,
            "{}",
            serde_json::to_string(event).map_err(std::io::Error::other)?
        )?,
        (StreamItem::Notice { kind, data }, false) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let agent = data["agent"].as_str().unwrap_or("-");
            let mut rest = data.clone();
            if let Some(map) = rest.as_object_mut() {
                map.remove("agent");
            }
            let line = format_notice(lines, now, agent, kind, &rest);
            writeln!(out, "{line}")?
        }
        (StreamItem::Notice { kind, data }, true) => writeln!(
            out,
            "{}",
            serde_json::json!({ "notice": kind, "data": data })
        )?,
    }
    Ok(())
}

fn format_notice(
    lines: &mut EventLines,
    at_ms: u64,
    agent: &str,
    kind: &str,
    rest: &Value,
) -> String {
    let width = lines.width_for(agent);
    format!(
        "{:>8}  {}  {:<width$}  {:<20}  {}",
        "-",
        crate::journal::clock(at_ms),
        agent,
        kind,
        rest
    )
    .trim_end()
    .to_owned()
}

fn to_json(value: &impl serde::Serialize) -> Result<String, ClientError> {
    serde_json::to_string_pretty(value).map_err(|e| ClientError::Output(std::io::Error::other(e)))
}

pub use crate::cli::table::status_table;

/// Whether `warden send` waited for the answer (`--wait` above 0); `--wait 0` only queues.
fn waited(wait: Option<f64>) -> bool {
    wait.is_some_and(|w| w > 0.0)
}

/// Pending asks, one a line: `ID  AGENT  QUESTION`, or a line saying there are none.
pub fn interventions_list(pending: &[Intervention]) -> String {
    if pending.is_empty() {
        return "no pending interventions\n".to_owned();
    }
    pending
        .iter()
        .map(|i| format!("{}  {}  {}\n", i.id, i.agent, one_line(&i.question)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_flag_then_the_admin_then_the_read_variable() {
        let env = |name: &str| match name {
            "WARDEN_ADMIN_TOKEN" => Some(String::new()),
            "WARDEN_READ_TOKEN" => Some("reader".to_owned()),
            _ => None,
        };
        assert_eq!(
            token_for(Some("flag".into()), true, env).as_deref(),
            Some("flag")
        );
        assert_eq!(token_for(None, true, env).as_deref(), Some("reader"));
        assert_eq!(token_for(None, false, env), None, "reads only");
        let admin = |name: &str| (name == "WARDEN_ADMIN_TOKEN").then(|| "adm".to_owned());
        assert_eq!(
            token_for(Some(String::new()), false, admin).as_deref(),
            Some("adm")
        );
    }

    #[test]
    fn a_bad_url_is_refused_and_keys_are_one_encoded_segment() {
        for url in ["", "ftp://x", "mailto:a@b", "http://", "127.0.0.1:port"] {
            assert!(Client::new(url, None).is_err(), "{url}");
        }
        // Without a scheme, HOST:PORT is http.
        for (url, base) in [
            ("127.0.0.1:7878", "http://127.0.0.1:7878/"),
            ("localhost:7878", "http://localhost:7878/"),
            ("[::1]:7878/prefix", "http://[::1]:7878/prefix"),
        ] {
            let client = Client::new(url, None).unwrap();
            assert_eq!(client.base.as_str(), base, "{url}");
        }
        let client = Client::new("http://127.0.0.1:1/prefix/", None).unwrap();
        assert_eq!(
            client.url(&["api", "agents", "a/b c"]).as_str(),
            "http://127.0.0.1:1/prefix/api/agents/a%2Fb%20c"
        );
    }

    #[test]
    fn exit_codes_tell_the_failures_apart() {
        let http = |status| ClientError::Http {
            status,
            reason: String::new(),
            message: String::new(),
        };
        let connect = ClientError::Connect {
            url: String::new(),
            reason: String::new(),
        };
        let codes: Vec<u8> = [
            connect,
            http(401),
            http(403),
            http(404),
            http(409),
            http(500),
            ClientError::StillPending {
                id: 1,
                status: "pending".into(),
                waited: 1.0,
                key: "a".into(),
                asks: vec![],
                other_asks: 0,
            },
        ]
        .iter()
        .map(ClientError::exit_code)
        .collect();
        assert_eq!(codes, [3, 4, 5, 6, 7, 1, EXIT_STILL_PENDING]);
    }
}
