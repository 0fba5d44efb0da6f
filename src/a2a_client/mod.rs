//! The A2A client: remote A2A agents (`[a2a_agents.NAME]`) as delegates of warden's agents
//! (docs/a2a.md, "Remote agents as delegates").
//!
//! This is the transport behind [`warden_actors::A2aPeers`]: the agent card, the JSON-RPC binding
//! (1.0 method names; the 0.3 names only when the card says the peer speaks 0.3), the bearer token,
//! timeouts and a cap on what is read. What makes a call a delegation (budget, hops, chain wait,
//! halts, questions to the operator, the journal) is the supervisor's
//! (`actors/src/supervisor/delegation/a2a.rs`).
//!
//! Written on reqwest and the JSON shapes of `warden_protocols::a2a` rather than on an A2A crate:
//! the Rust A2A crates found (a2a-rs, a2a-rust 0.1, a2a-client/a2a-types, ra2a) were either 0.2/0.3
//! only, or a first release bringing an axum server and its own reqwest, and none reads both 0.3
//! and 1.0 answers; the client needs three methods and must read whatever a peer sends leniently
//! (unknown states such as `auth-required`, a `Message` instead of a `Task`), so it reads JSON
//! values here (docs/design-decisions.md).

pub mod config;

pub use config::A2aAgentConfig;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use warden_actors::{A2aPeers, PeerError, PeerMessage, PeerState, PeerTask};
use warden_protocols::{a2a::AGENT_CARD_PATH, AgentKey};

/// Why the remote agents could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum A2aClientError {
    /// `token_env` names a variable that is not set (or empty).
    #[error("a2a_agents.{name}.token_env: the environment variable {var} is not set (or empty); set it to the bearer token of {name}, or remove `token_env` if the agent needs no token")]
    TokenUnset {
        /// The remote agent.
        name: String,
        /// The variable.
        var: String,
    },
    /// The HTTP client could not be built (TLS set-up).
    #[error("a2a_agents.{name}: cannot build the HTTP client: {source}")]
    Client {
        /// The remote agent.
        name: String,
        /// What reqwest said.
        #[source]
        source: reqwest::Error,
    },
}

/// Where and how a peer is called, from its card.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    url: String,
    /// The peer speaks A2A 0.3 (the card says so): `message/send`, `tasks/get`, `tasks/cancel`.
    v03: bool,
    description: String,
}

struct Peer {
    config: A2aAgentConfig,
    token: Option<String>,
    http: reqwest::Client,
    /// Read from the card at start, or at the first call when the peer was not reachable then.
    endpoint: Mutex<Option<Endpoint>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// The team's remote A2A agents: [`A2aPeers`] over HTTP.
pub struct A2aClients {
    peers: BTreeMap<AgentKey, Arc<Peer>>,
}

impl std::fmt::Debug for A2aClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aClients")
            .field("peers", &self.peers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl A2aClients {
    /// The clients of `agents`, each card read once now (a peer that cannot be reached is logged
    /// and read again at its first delegation: warden starts without it).
    ///
    /// # Errors
    /// [`A2aClientError::TokenUnset`] for a `token_env` that is not set; [`A2aClientError::Client`]
    /// when no HTTP client can be built.
    pub async fn connect(
        agents: &BTreeMap<String, A2aAgentConfig>,
    ) -> Result<Self, A2aClientError> {
        let mut peers = BTreeMap::new();
        for (name, config) in agents {
            let token = match &config.token_env {
                Some(var) => match std::env::var(var) {
                    Ok(token) if !token.is_empty() => Some(token),
                    _ => {
                        return Err(A2aClientError::TokenUnset {
                            name: name.clone(),
                            var: var.clone(),
                        })
                    }
                },
                None => None,
            };
            let timeout = Duration::from_secs_f64(config.timeout_seconds);
            let http = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout.min(Duration::from_secs(10)))
                // A redirect could carry the token elsewhere: none are followed.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|source| A2aClientError::Client {
                    name: name.clone(),
                    source,
                })?;
            let peer = Arc::new(Peer {
                config: config.clone(),
                token,
                http,
                endpoint: Mutex::new(None),
                next_id: std::sync::atomic::AtomicU64::new(1),
            });
            if let Err(e) = peer.endpoint().await {
                tracing::warn!(remote = %name, error = %e, "the remote A2A agent's card could not be read; it is read again at the first delegation");
                eprintln!(
                    "warden: warning: a2a_agents.{name}: {e} (read again at the first delegation)"
                );
            }
            peers.insert(AgentKey::from(name.clone()), peer);
        }
        Ok(A2aClients { peers })
    }

    fn peer(&self, name: &AgentKey) -> Result<Arc<Peer>, PeerError> {
        self.peers
            .get(name)
            .cloned()
            .ok_or_else(|| PeerError(format!("{name} is not an [a2a_agents] entry")))
    }
}

impl Peer {
    /// The JSON-RPC endpoint, from the card (read now if not yet).
    async fn endpoint(&self) -> Result<Endpoint, PeerError> {
        if let Some(endpoint) = self.endpoint.lock().clone() {
            return Ok(endpoint);
        }
        let card_url = if self.config.url.ends_with(".json") {
            self.config.url.clone()
        } else {
            format!("{}{AGENT_CARD_PATH}", self.config.url.trim_end_matches('/'))
        };
        let mut request = self.http.get(&card_url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let body = self.read(request, "reading its agent card").await?;
        let card: Value = serde_json::from_slice(&body).map_err(|e| {
            PeerError(format!(
                "its agent card at {card_url} is not JSON ({e}): {}",
                preview(&body)
            ))
        })?;
        let endpoint = card_endpoint(&card, &self.config.url)
            .map_err(|e| PeerError(format!("its agent card at {card_url}: {e}")))?;
        let endpoint = Endpoint {
            description: self
                .config
                .description
                .clone()
                .unwrap_or(endpoint.description),
            ..endpoint
        };
        *self.endpoint.lock() = Some(endpoint.clone());
        Ok(endpoint)
    }

    /// Sends `request` and reads at most `max_response_bytes` of a 2xx answer.
    async fn read(
        &self,
        request: reqwest::RequestBuilder,
        doing: &str,
    ) -> Result<Vec<u8>, PeerError> {
        let limit = self.config.max_response_bytes;
        let mut response = request.send().await.map_err(|e| {
            let what = if e.is_timeout() {
                format!("no answer within {} s", self.config.timeout_seconds)
            } else if e.is_connect() {
                "cannot connect (is it running?)".to_owned()
            } else {
                "the request failed".to_owned()
            };
            PeerError(format!(
                "{doing} at {}: {what}: {}",
                self.config.url,
                source_chain(&e)
            ))
        })?;
        let status = response.status();
        if response.content_length().is_some_and(|n| n > limit as u64) {
            return Err(too_large(doing, limit));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| PeerError(format!("{doing}: the answer was cut: {}", source_chain(&e))))?
        {
            if body.len() + chunk.len() > limit {
                return Err(too_large(doing, limit));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(PeerError(format!(
                "{doing}: HTTP {status}: {}",
                preview(&body)
            )));
        }
        Ok(body)
    }

    /// One JSON-RPC call; the `result`, or why there is none.
    async fn call(
        &self,
        method10: &str,
        method03: &str,
        params: Value,
    ) -> Result<(Value, bool), PeerError> {
        let endpoint = self.endpoint().await?;
        let method = if endpoint.v03 { method03 } else { method10 };
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut request = self
            .http
            .post(&endpoint.url)
            .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        if !endpoint.v03 {
            // A2A 1.0: a client names the version it speaks; without it a 1.0 server
            // (the Python SDK's) takes the call for 0.3 and refuses it.
            request = request.header("A2A-Version", warden_protocols::a2a::PROTOCOL_VERSION);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let doing = format!("{method} to {}", endpoint.url);
        let body = self.read(request, &doing).await?;
        let answer: Value = serde_json::from_slice(&body).map_err(|e| {
            PeerError(format!(
                "{doing}: the answer is not JSON-RPC (not JSON: {e}): {}",
                preview(&body)
            ))
        })?;
        if let Some(error) = answer.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
            let message = error.get("message").and_then(Value::as_str).unwrap_or("");
            return Err(PeerError(format!(
                "{doing}: JSON-RPC error {code}: {}",
                message.chars().take(500).collect::<String>()
            )));
        }
        if answer.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(PeerError(format!(
                "{doing}: the answer is not JSON-RPC 2.0 (no `\"jsonrpc\": \"2.0\"`): {}",
                preview(&body)
            )));
        }
        match answer.get("result") {
            Some(result) => Ok((result.clone(), endpoint.v03)),
            None => Err(PeerError(format!(
                "{doing}: the answer has neither `result` nor `error`: {}",
                preview(&body)
            ))),
        }
    }

    async fn send(&self, message: PeerMessage) -> Result<PeerTask, PeerError> {
        let endpoint = self.endpoint().await?;
        let mut m = if endpoint.v03 {
            json!({"kind": "message", "messageId": message.message_id, "role": "user",
                   "parts": [{"kind": "text", "text": message.text}]})
        } else {
            json!({"messageId": message.message_id, "role": "ROLE_USER",
                   "parts": [{"text": message.text}]})
        };
        if let Some(task_id) = message.task_id {
            m["taskId"] = Value::String(task_id);
        }
        if let Some(context_id) = message.context_id {
            m["contextId"] = Value::String(context_id);
        }
        let configuration = if endpoint.v03 {
            json!({"blocking": false})
        } else {
            json!({"returnImmediately": true})
        };
        let (result, _) = self
            .call(
                "SendMessage",
                "message/send",
                json!({"message": m, "configuration": configuration}),
            )
            .await?;
        read_task(&result).map_err(|e| PeerError(format!("SendMessage: {e}")))
    }

    async fn task_call(
        &self,
        method10: &str,
        method03: &str,
        task_id: &str,
    ) -> Result<PeerTask, PeerError> {
        let (result, _) = self
            .call(method10, method03, json!({"id": task_id}))
            .await?;
        read_task(&result).map_err(|e| PeerError(format!("{method10}: {e}")))
    }
}

fn too_large(doing: &str, limit: usize) -> PeerError {
    PeerError(format!(
        "{doing}: the answer is larger than max_response_bytes ({limit} bytes); it was not read"
    ))
}

/// An error and its sources, in words.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The first 200 characters of a body, for errors.
fn preview(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let cut: String = text.chars().take(200).collect();
    if cut.len() < text.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// The JSON-RPC endpoint a card names: a 1.0 `supportedInterfaces` entry with binding `JSONRPC`
/// (preferred), else a 0.3 card's `url` (with `preferredTransport` `JSONRPC`, or an
/// `additionalInterfaces` entry). It must be on `base`'s origin: the bearer token goes there.
fn card_endpoint(card: &Value, base: &str) -> Result<Endpoint, String> {
    let description = card
        .get("description")
        .and_then(Value::as_str)
        .or_else(|| card.get("name").and_then(Value::as_str))
        .unwrap_or("")
        .to_owned();
    let jsonrpc = |i: &&Value| {
        i.get("protocolBinding")
            .or_else(|| i.get("transport"))
            .and_then(Value::as_str)
            .is_some_and(|b| b.eq_ignore_ascii_case("JSONRPC"))
    };
    let v1 = |i: &&&Value| {
        i.get("protocolVersion")
            .and_then(Value::as_str)
            .is_none_or(|v| !v.starts_with("0."))
    };
    let interfaces: Vec<&Value> = card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter(jsonrpc).collect())
        .unwrap_or_default();
    let (url, v03) = if let Some(i) = interfaces.iter().find(v1) {
        (i.get("url").and_then(Value::as_str), false)
    } else if let Some(i) = interfaces.first() {
        (i.get("url").and_then(Value::as_str), true)
    } else {
        let preferred = card
            .get("preferredTransport")
            .and_then(Value::as_str)
            .unwrap_or("JSONRPC");
        let url = if preferred.eq_ignore_ascii_case("JSONRPC") {
            card.get("url").and_then(Value::as_str)
        } else {
            card.get("additionalInterfaces")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().find(jsonrpc))
                .and_then(|i| i.get("url"))
                .and_then(Value::as_str)
        };
        (url, true)
    };
    let url = url.ok_or(
        "it names no JSON-RPC interface (warden's client speaks the JSON-RPC binding only, not \
         HTTP+JSON or gRPC)",
    )?;
    let origin = |u: &str| {
        reqwest::Url::parse(u)
            .ok()
            .map(|u| u.origin().ascii_serialization())
    };
    match (origin(url), origin(base)) {
        (Some(a), Some(b)) if a == b => {}
        (Some(_), _) => {
            return Err(format!(
                "its JSON-RPC URL {url:?} is not on the origin of `url` ({base:?}); the token is \
                 sent only there: set `url` to the agent's own origin"
            ))
        }
        (None, _) => return Err(format!("its JSON-RPC URL {url:?} is not a URL")),
    }
    Ok(Endpoint {
        url: url.to_owned(),
        v03,
        description,
    })
}

/// A task (or a message) from a `SendMessage`, `GetTask` or `CancelTask` result, 1.0 or 0.3.
fn read_task(result: &Value) -> Result<PeerTask, String> {
    if let Some(task) = result.get("task") {
        return read_task(task);
    }
    let kind = result.get("kind").and_then(Value::as_str);
    if kind == Some("message")
        || (result.get("message").is_some() && result.get("status").is_none())
    {
        // A message, not a task: the peer's whole answer.
        let message = result.get("message").unwrap_or(result);
        return Ok(PeerTask {
            id: String::new(),
            context_id: String::new(),
            state: PeerState::Completed,
            text: parts_text(message.get("parts")),
        });
    }
    let id = result
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            format!(
                "the result is neither a task (with an `id`) nor a message: {}",
                cut_json(result)
            )
        })?;
    let status = result.get("status");
    let state_name = status
        .and_then(|s| s.get("state"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let state = parse_state(state_name)
        .ok_or_else(|| format!("task {id} has an unknown state {state_name:?}"))?;
    let status_text = parts_text(
        status
            .and_then(|s| s.get("message"))
            .and_then(|m| m.get("parts")),
    );
    let artifacts_text = result
        .get("artifacts")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|artifact| parts_text(artifact.get("parts")))
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    let text = match (state, artifacts_text.is_empty()) {
        (PeerState::Completed, false) => artifacts_text,
        (_, _) if !status_text.is_empty() => status_text,
        _ => artifacts_text,
    };
    Ok(PeerTask {
        id: id.to_owned(),
        context_id: result
            .get("contextId")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        state,
        text,
    })
}

fn cut_json(v: &Value) -> String {
    let text = v.to_string();
    text.chars().take(200).collect()
}

/// Both spellings: `TASK_STATE_WORKING` (1.0) and `working` (0.3).
fn parse_state(name: &str) -> Option<PeerState> {
    let name = name.trim_start_matches("TASK_STATE_").to_ascii_lowercase();
    Some(match name.replace('_', "-").as_str() {
        "submitted" => PeerState::Submitted,
        "working" => PeerState::Working,
        "input-required" => PeerState::InputRequired,
        "auth-required" => PeerState::AuthRequired,
        "completed" => PeerState::Completed,
        "failed" => PeerState::Failed,
        "canceled" | "cancelled" => PeerState::Canceled,
        "rejected" => PeerState::Rejected,
        _ => return None,
    })
}

/// The text parts of a message or artifact, joined; other parts are named, not read.
fn parts_text(parts: Option<&Value>) -> String {
    let Some(parts) = parts.and_then(Value::as_array) else {
        return String::new();
    };
    parts
        .iter()
        .map(|p| match p.get("text").and_then(Value::as_str) {
            Some(text) => text.to_owned(),
            None => "[a part that is not text, not read by warden]".to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl A2aPeers for A2aClients {
    fn knows(&self, name: &AgentKey) -> bool {
        self.peers.contains_key(name)
    }

    fn describe(&self) -> Vec<(AgentKey, String)> {
        self.peers
            .iter()
            .map(|(name, peer)| {
                let described = peer
                    .config
                    .description
                    .clone()
                    .or_else(|| peer.endpoint.lock().as_ref().map(|e| e.description.clone()));
                (
                    name.clone(),
                    described.unwrap_or_else(|| "(its agent card was not read yet)".into()),
                )
            })
            .collect()
    }

    fn send(
        &self,
        name: &AgentKey,
        message: PeerMessage,
    ) -> BoxFuture<'static, Result<PeerTask, PeerError>> {
        let peer = self.peer(name);
        Box::pin(async move { peer?.send(message).await })
    }

    fn get(
        &self,
        name: &AgentKey,
        task_id: &str,
    ) -> BoxFuture<'static, Result<PeerTask, PeerError>> {
        let (peer, task_id) = (self.peer(name), task_id.to_owned());
        Box::pin(async move { peer?.task_call("GetTask", "tasks/get", &task_id).await })
    }

    fn cancel(
        &self,
        name: &AgentKey,
        task_id: &str,
    ) -> BoxFuture<'static, Result<PeerTask, PeerError>> {
        let (peer, task_id) = (self.peer(name), task_id.to_owned());
        Box::pin(async move {
            peer?
                .task_call("CancelTask", "tasks/cancel", &task_id)
                .await
        })
    }

    fn poll_interval(&self, name: &AgentKey) -> Duration {
        self.peers
            .get(name)
            .map_or(Duration::from_millis(500), |p| {
                Duration::from_millis(p.config.poll_interval_ms)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_1_0_card_is_preferred_and_a_0_3_card_is_read_as_0_3() {
        let card = json!({"name": "n", "description": "d", "supportedInterfaces": [
            {"url": "http://h:1/rpc03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            {"url": "http://h:1/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": "http://h:1/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        let e = card_endpoint(&card, "http://h:1").unwrap();
        assert_eq!(
            (e.url.as_str(), e.v03, e.description.as_str()),
            ("http://h:1/rpc", false, "d")
        );
        let old = json!({"name": "n", "url": "http://h:1/a2a", "protocolVersion": "0.3.0"});
        let e = card_endpoint(&old, "http://h:1/").unwrap();
        assert_eq!((e.url.as_str(), e.v03), ("http://h:1/a2a", true));
        let rest = json!({"name": "n", "supportedInterfaces": [
            {"url": "http://h:1/v1", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}]});
        assert!(card_endpoint(&rest, "http://h:1")
            .unwrap_err()
            .contains("no JSON-RPC"));
        let elsewhere = json!({"supportedInterfaces": [
            {"url": "http://evil:1/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        assert!(card_endpoint(&elsewhere, "http://h:1")
            .unwrap_err()
            .contains("origin"));
    }

    #[test]
    fn tasks_messages_and_both_state_spellings_are_read() {
        let t = read_task(&json!({"task": {"id": "t1", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
            "message": {"parts": [{"text": "which one?"}]}}}}))
        .unwrap();
        assert_eq!(
            (t.state, t.text.as_str(), t.context_id.as_str()),
            (PeerState::InputRequired, "which one?", "c")
        );
        let t = read_task(&json!({"kind": "task", "id": "t1", "status": {"state": "completed"},
            "artifacts": [{"parts": [{"kind": "text", "text": "42"}, {"kind": "file", "file": {}}]}]}))
        .unwrap();
        assert_eq!(
            (t.state, t.text.as_str()),
            (
                PeerState::Completed,
                "42\n[a part that is not text, not read by warden]"
            )
        );
        let m = read_task(&json!({"message": {"role": "ROLE_AGENT", "parts": [{"text": "hi"}]}}))
            .unwrap();
        assert_eq!(
            (m.id.as_str(), m.state, m.text.as_str()),
            ("", PeerState::Completed, "hi")
        );
        assert!(
            read_task(&json!({"id": "t", "status": {"state": "TASK_STATE_BOGUS"}}))
                .unwrap_err()
                .contains("unknown state")
        );
        assert!(read_task(&json!({"nothing": 1})).is_err());
        assert_eq!(
            parse_state("TASK_STATE_AUTH_REQUIRED"),
            Some(PeerState::AuthRequired)
        );
    }
}
