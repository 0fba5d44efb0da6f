//! warden as an MCP server: the team's agents as tools any MCP client can call — `list_agents`,
//! `agent_status`, `ask_agent`, `event_status`, `list_asks`, and with admin access `halt`,
//! `halt_all` and `answer_ask` (an operator's yes or no to a pending limit or permission ask).
//!
//! One handler, [`WardenMcp`] (an `rmcp` [`ServerHandler`]), serves both transports:
//!
//! * **stdio** — `warden mcp --config team.toml` ([`crate::serve::serve_stdio`]): rmcp's service over standard
//!   input and output. Standard output carries the protocol only; every log line goes to standard
//!   error. The process owner runs the team, so the session has admin access (`--read-only` drops
//!   it).
//! * **streamable HTTP** — `POST /mcp` on `warden serve` ([`configure`]), with the API's bearer
//!   tokens: the admin token gets every tool, the read token only the read-only ones.
//!
//! # Why an rmcp service per HTTP session, over an in-memory transport
//!
//! rmcp's streamable-HTTP server is a tower service (axum/hyper) and does not plug into actix-web,
//! which serves everything else here. Rather than re-implement the protocol (the `initialize`
//! handshake and version negotiation, `ping`, cancellation, unknown methods, and what each protocol
//! revision adds or strips from a result), each HTTP session runs the same rmcp service that serves
//! stdio, fed through a channel (`SessionTransport`): a POST hands its JSON-RPC message to the
//! session's service and waits for the response with the same id. So both transports answer
//! exactly alike, and only the HTTP framing is ours: `Mcp-Session-Id` issued at `initialize` and
//! required after, `application/json` responses (this server never starts a stream of its own, so
//! `GET` is `405`), `DELETE` ends a session, sessions bounded in number ([`MAX_SESSIONS`]) and
//! ended when idle ([`SESSION_IDLE`]). A client that disconnects while its call waits cancels that
//! call (`notifications/cancelled` to the service), as the stdio transport would.
//!
//! # Errors
//!
//! Refusals are tool results with `isError: true` and a sentence saying why (unknown agent, locked
//! out, mailbox full, bad arguments, a halt asked with the read token); JSON-RPC errors are kept
//! for protocol faults (a body that is not JSON, not a JSON-RPC message, an unknown method or tool).

use crate::{
    journal::EventFates,
    server::api::{self, access_of, Access, ApiError, ApiState, IDEMPOTENCY_KEY, MAX_WAIT_SECONDS},
};
use actix_web::{
    http::{header, StatusCode},
    web, HttpRequest, HttpResponse, ResponseError,
};
use futures::StreamExt;
use parking_lot::Mutex;
use rmcp::{
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage,
        ClientRequest, ContentBlock, ErrorData, Implementation, JsonObject, JsonRpcMessage,
        ListToolsResult, PaginatedRequestParams, ProtocolVersion, RequestId, ServerCapabilities,
        ServerConfig, ServerJsonRpcMessage, Tool, ToolAnnotations,
    },
    service::{RequestContext, RoleServer},
    transport::Transport,
    ServerHandler, ServiceExt,
};
use serde::Deserialize;
use serde_json::{json, Value};
use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};
use warden_actors::{
    safety::{AnswerError, ChannelInterventionBus},
    Submit, SubmitError, Supervisor,
};
use warden_protocols::{Answer, EventFate, HaltCause, OperatorReply, UserEvent};

/// The operator name journaled for halts asked through `/mcp` with the admin token.
pub const MCP_HTTP_OPERATOR: &str = "mcp:admin";
/// The operator name journaled for halts asked through `warden mcp` (stdio).
pub const MCP_STDIO_OPERATOR: &str = "mcp:stdio";
/// The `source` and `sender` of the user events `ask_agent` queues.
pub const MCP_SENDER: &str = "mcp";
/// How long `ask_agent` waits for the answer when `wait_s` is not given, in seconds.
pub const DEFAULT_WAIT_SECONDS: f64 = 30.0;
/// The most HTTP sessions open at once per token class (admin, read). A read `initialize` beyond
/// it is answered `503` (after the idle ones are ended); an admin `initialize` beyond it ends the
/// admin session used least recently instead: the admin can always open a session, and read-token
/// sessions never count against it.
pub const MAX_SESSIONS: usize = 256;
/// An HTTP session with no request for this long is ended (its next request gets `404`: the
/// client initializes again).
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// The header that names an HTTP session.
pub const SESSION_HEADER: &str = "Mcp-Session-Id";
/// The header with the protocol version a client negotiated.
pub const PROTOCOL_VERSION_HEADER: &str = "MCP-Protocol-Version";

/// What a session may do: every tool, or only the ones that read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpAccess {
    /// `list_agents`, `agent_status`, `event_status`, `list_asks`.
    Read,
    /// Those, `ask_agent`, `halt`, `halt_all` and `answer_ask`.
    Admin,
}

impl From<Access> for McpAccess {
    fn from(access: Access) -> Self {
        match access {
            // A host token is refused before a session opens (`api::host_refused`); were it not,
            // it would read only.
            Access::Read | Access::Host => McpAccess::Read,
            Access::Admin => McpAccess::Admin,
        }
    }
}

/// The MCP server's handler: the team's tools, for one session's access. Both transports serve it.
#[derive(Clone)]
pub struct WardenMcp {
    supervisor: Supervisor,
    fates: Option<Arc<dyn EventFates>>,
    access: McpAccess,
    operator: &'static str,
    /// On a cluster node (`warden serve --cluster`): `halt_all` halts the cluster, and `halt` of
    /// another node's agent is sent to that node, as the API's routes do.
    cluster: Option<Arc<dyn crate::server::cluster::ClusterNode>>,
    /// The intervention bus the team's limit and permission asks wait on (`list_asks`,
    /// `answer_ask`); `None`: nobody can be asked, so nothing is pending.
    bus: Option<Arc<ChannelInterventionBus>>,
}

impl std::fmt::Debug for WardenMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WardenMcp")
            .field("access", &self.access)
            .field("operator", &self.operator)
            .finish_non_exhaustive()
    }
}

/// The tools a read session sees.
const READ_TOOLS: [&str; 4] = ["list_agents", "agent_status", "event_status", "list_asks"];
/// The tools only an admin session sees (and may call).
const ADMIN_TOOLS: [&str; 4] = ["ask_agent", "halt", "halt_all", "answer_ask"];

impl WardenMcp {
    /// The tools of `supervisor`'s team for a session with `access`; halts are journaled as asked by
    /// `operator`. `fates` is where `event_status` (and a duplicate `ask_agent`) reads what became
    /// of an event; without it they say the server keeps no journal.
    pub fn new(
        supervisor: Supervisor,
        fates: Option<Arc<dyn EventFates>>,
        access: McpAccess,
        operator: &'static str,
    ) -> Self {
        WardenMcp {
            supervisor,
            fates,
            access,
            operator,
            cluster: None,
            bus: None,
        }
    }

    /// The same, answering the asks on `bus` (`warden serve`'s, as `/api/interventions` does).
    pub fn with_bus(mut self, bus: Option<Arc<ChannelInterventionBus>>) -> Self {
        self.bus = bus;
        self
    }

    /// The same, on a cluster node: its halts are the cluster's (see [`crate::server::cluster`]).
    pub fn on_cluster(
        mut self,
        cluster: Option<Arc<dyn crate::server::cluster::ClusterNode>>,
    ) -> Self {
        self.cluster = cluster;
        self
    }

    /// The tools this session may call, with their input schemas.
    pub fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![
            tool(
                "list_agents",
                "List the team's agents: key, role (assistant or sub_agent), state \
                 (WAITING_FOR_EVENT, EXECUTING, WAITING_FOR_TOOL, STOPPED, SAFETY_LOCKOUT, ...) and whether it is \
                 paused or emergency-stopped.",
                json!({}),
                &[],
                ToolAnnotations::new().read_only(true),
            ),
            tool(
                "agent_status",
                "One agent's full status: state, lockout, queue length, turns, usage, errors.",
                json!({ "agent": agent_property() }),
                &["agent"],
                ToolAnnotations::new().read_only(true),
            ),
            tool(
                "event_status",
                "What became of an event ask_agent queued: pending, running, answered (with the \
                 answer), refused, discarded (a halt) or failed. Use it after ask_agent returned \
                 without an answer.",
                json!({
                    "agent": agent_property(),
                    "id": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "The event id ask_agent returned."
                    }
                }),
                &["agent", "id"],
                ToolAnnotations::new().read_only(true),
            ),
            tool(
                "list_asks",
                "The pending asks an operator must answer (answer_ask, with the admin token): an \
                 agent waiting for a yes or no. A permission ask names the tool the agent wants to \
                 run, its arguments, its category, the rule that asked and what the agent said; a \
                 limit ask names the limit (kind), the value reached and the configured one.",
                json!({}),
                &[],
                ToolAnnotations::new().read_only(true),
            ),
        ];
        if self.access == McpAccess::Admin {
            tools.extend([
                tool(
                    "ask_agent",
                    "Send a message to an agent of the team and wait for its answer. The message is \
                     journaled and queued like any user event; if no answer comes within wait_s \
                     seconds, the result gives the event id and its status (pending or running): \
                     poll event_status with it.",
                    json!({
                        "agent": agent_property(),
                        "content": {
                            "type": "string",
                            "minLength": 1,
                            "description": "The message for the agent."
                        },
                        "wait_s": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": MAX_WAIT_SECONDS,
                            "default": DEFAULT_WAIT_SECONDS,
                            "description": "Seconds to wait for the answer (0 to 300; 0: do not \
                                            wait, just queue it)."
                        },
                        "idempotency_key": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 256,
                            "description": "Names the message for retries: sent again with the \
                                            same key and content, it is queued once and the \
                                            first event's status is returned."
                        }
                    }),
                    &["agent", "content"],
                    ToolAnnotations::new()
                        .read_only(false)
                        .destructive(false)
                        .idempotent(false)
                        .open_world(true),
                ),
                tool(
                    "halt",
                    "Stop one agent and every agent it delegated to, at once: its model call is \
                     aborted and its queued messages are discarded. It stays STOPPED until an \
                     operator resumes it.",
                    json!({ "agent": agent_property() }),
                    &["agent"],
                    ToolAnnotations::new()
                        .read_only(false)
                        .destructive(true)
                        .idempotent(true)
                        .open_world(false),
                ),
                tool(
                    "halt_all",
                    "Stop every agent of the team at once (SystemHalt): model calls aborted, queued \
                     messages discarded.",
                    json!({}),
                    &[],
                    ToolAnnotations::new()
                        .read_only(false)
                        .destructive(true)
                        .idempotent(true)
                        .open_world(false),
                ),
                tool(
                    "answer_ask",
                    "Answer a pending ask (list_asks lists them) as an operator: yes runs the \
                     tool (or grants the limit's extension), no refuses it. The note is journaled \
                     with the decision.",
                    json!({
                        "id": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "The ask's id (list_asks gives it)."
                        },
                        "answer": {
                            "type": "string",
                            "enum": ["yes", "no"],
                            "description": "yes allows, no refuses."
                        },
                        "note": {
                            "type": "string",
                            "description": "Why, journaled with the decision."
                        }
                    }),
                    &["id", "answer"],
                    ToolAnnotations::new()
                        .read_only(false)
                        .destructive(true)
                        .idempotent(false)
                        .open_world(false),
                ),
            ]);
        }
        tools
    }

    /// Calls tool `name` with `arguments`: `Ok` with the tool's result (`isError: true` for a
    /// refusal), `Err` only for a tool that does not exist.
    ///
    /// # Errors
    ///
    /// `invalid_params` (JSON-RPC `-32602`) for an unknown tool name.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, ErrorData> {
        let args = Value::Object(arguments.unwrap_or_default());
        if ADMIN_TOOLS.contains(&name) && self.access != McpAccess::Admin {
            return Ok(refusal(format!(
                "{name} needs the admin token: this session was opened with the read token \
                 (it may call {})",
                READ_TOOLS.join(", ")
            )));
        }
        Ok(match name {
            "list_agents" => match parse::<NoArgs>(name, args) {
                Ok(NoArgs {}) => self.list_agents(),
                Err(refused) => refused,
            },
            "agent_status" => match parse::<AgentArgs>(name, args) {
                Ok(AgentArgs { agent }) => self.agent_status(&agent),
                Err(refused) => refused,
            },
            "event_status" => match parse::<EventArgs>(name, args) {
                Ok(EventArgs { agent, id }) => self.event_status(&agent, id).await,
                Err(refused) => refused,
            },
            "ask_agent" => match parse::<AskArgs>(name, args) {
                Ok(ask) => self.ask_agent(ask).await,
                Err(refused) => refused,
            },
            "halt" => match parse::<AgentArgs>(name, args) {
                Ok(AgentArgs { agent }) => self.halt(&agent).await,
                Err(refused) => refused,
            },
            "halt_all" => match parse::<NoArgs>(name, args) {
                Ok(NoArgs {}) => self.halt_all().await,
                Err(refused) => refused,
            },
            "list_asks" => match parse::<NoArgs>(name, args) {
                Ok(NoArgs {}) => self.list_asks(),
                Err(refused) => refused,
            },
            "answer_ask" => match parse::<AnswerArgs>(name, args) {
                Ok(answer) => self.answer_ask(answer),
                Err(refused) => refused,
            },
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool {other:?} (tools/list lists them)"),
                    None,
                ))
            }
        })
    }

    fn list_agents(&self) -> CallToolResult {
        let agents: Vec<Value> = self
            .supervisor
            .statuses()
            .into_iter()
            .map(|s| {
                json!({
                    "key": s.key,
                    "role": s.role,
                    "state": s.state,
                    "paused": s.paused,
                    "emergency_stop": s.emergency_stop,
                })
            })
            .collect();
        structured(json!({ "agents": agents }), false)
    }

    fn agent_status(&self, agent: &str) -> CallToolResult {
        match self.supervisor.get(agent) {
            Some(handle) => match serde_json::to_value(handle.status()) {
                Ok(status) => structured(status, false),
                Err(err) => refusal(format!("cannot encode the status of {agent}: {err}")),
            },
            None => unknown_agent(agent),
        }
    }

    async fn event_status(&self, agent: &str, id: u64) -> CallToolResult {
        if self.supervisor.get(agent).is_none() {
            return unknown_agent(agent);
        }
        match self.fate(agent, id).await {
            Ok(Some(fate)) => {
                // A report, not a failure: whatever became of the event, the read succeeded.
                let mut result = fate_result(agent, id, &fate, false, None);
                result.is_error = Some(false);
                result
            }
            Ok(None) => refusal(format!("agent {agent} has no event {id}")),
            Err(why) => refusal(why),
        }
    }

    async fn ask_agent(&self, ask: AskArgs) -> CallToolResult {
        let AskArgs {
            agent,
            content,
            wait_s,
            idempotency_key,
        } = ask;
        let wait_s = wait_s.unwrap_or(DEFAULT_WAIT_SECONDS);
        if !(0.0..=MAX_WAIT_SECONDS).contains(&wait_s) {
            return refusal(format!(
                "wait_s must be a number of seconds from 0 to {MAX_WAIT_SECONDS}, not {wait_s}"
            ));
        }
        if content.trim().is_empty() {
            return refusal("content must not be empty".to_owned());
        }
        let idempotency_key = match idempotency_key {
            None => None,
            Some(k) if !k.trim().is_empty() && k.len() <= 256 => Some(k.trim().to_owned()),
            Some(_) => {
                return refusal(format!(
                    "idempotency_key must be 1 to 256 characters (like the API's {IDEMPOTENCY_KEY})"
                ))
            }
        };
        let Some(handle) = self.supervisor.get(&agent) else {
            return unknown_agent(&agent);
        };
        let event = UserEvent {
            source: MCP_SENDER.to_owned(),
            sender: Some(MCP_SENDER.to_owned()),
            content,
        };
        let options = Submit {
            idempotency_key,
            watch: wait_s > 0.0,
        };
        // The API's `POST /api/agents/{key}/events?wait=` path: journaled, durable before it is
        // acknowledged, idempotent under a key, its fate readable afterwards by id.
        let submitted = match handle.submit(event, options).await {
            Ok(submitted) => submitted,
            Err(err @ SubmitError::KeyReused { id, .. }) => {
                return refusal_with(
                    err.to_string(),
                    json!({ "error": err.to_string(), "id": id }),
                )
            }
            Err(err @ SubmitError::NotDurable { id, .. }) => {
                tracing::error!(%agent, id, "{err}");
                return refusal_with(
                    err.to_string(),
                    json!({ "error": err.to_string(), "id": id }),
                );
            }
            Err(SubmitError::Refused(err)) => {
                let text = format!("agent {agent} refused the message: {}", err.refusal);
                return refusal_with(
                    text,
                    json!({ "error": err.refusal.to_string(), "refusal": err.refusal }),
                );
            }
        };
        let id = submitted.id;
        if let Some(reply) = submitted.reply {
            // A halt settles the waiter at once (the event is discarded), so this returns then,
            // not at the end of the wait.
            let wait = Duration::from_secs_f64(wait_s);
            if let Ok(settled) = tokio::time::timeout(wait, reply).await {
                // The answer leaves once its turn is on disk (as `?wait=` does).
                if let Err(cause) = handle.durable_so_far().await {
                    let error = format!("event {id} was settled but is not durable: {cause}");
                    tracing::error!(%agent, id, "{error}");
                    return refusal_with(error.clone(), json!({ "error": error, "id": id }));
                }
                let fate = api::settled_fate(settled);
                return fate_result(&agent, id, &fate, submitted.duplicate, Some(wait_s));
            }
        }
        // Not settled in time: its status from the journal (pending or running), which also
        // holds the first event's fate for a duplicate.
        let fate = self
            .fate(&agent, id)
            .await
            .ok()
            .flatten()
            .unwrap_or(EventFate::Pending);
        fate_result(&agent, id, &fate, submitted.duplicate, Some(wait_s))
    }

    async fn halt(&self, agent: &str) -> CallToolResult {
        let cause = HaltCause::Operator {
            operator: self.operator.into(),
        };
        tracing::info!(agent, operator = self.operator, "halt asked over MCP");
        if let Some(cluster) = self.cluster.as_ref().filter(|c| !c.owns(agent)) {
            if let Some(node) = cluster.owner(agent).await {
                let key = warden_protocols::AgentKey::from(agent);
                return match cluster.halt_remote(&node, &key, self.operator).await {
                    Ok(acks) => structured(json!({ "node": node, "halted": acks }), false),
                    Err(e) => structured(json!({ "error": e.to_string(), "node": node }), true),
                };
            }
        }
        match self.supervisor.halt(agent, cause).await {
            Ok(acks) => {
                if let Some(cluster) = self.cluster.clone() {
                    // Its lease shows it halted now (see the API's halt).
                    cluster.write_lease_now(agent).await;
                }
                halted(acks)
            }
            Err(_) => unknown_agent(agent),
        }
    }

    async fn halt_all(&self) -> CallToolResult {
        tracing::info!(operator = self.operator, "halt_all asked over MCP");
        match &self.cluster {
            Some(cluster) => {
                let node = cluster.node().to_owned();
                let halt = cluster
                    .clone()
                    .halt("halt_all asked over MCP", self.operator)
                    .await;
                structured(crate::server::cluster::halt_body(&node, &halt), false)
            }
            None => halted(self.supervisor.halt_all().await),
        }
    }

    fn list_asks(&self) -> CallToolResult {
        let pending = self
            .bus
            .as_ref()
            .map(|bus| bus.pending())
            .unwrap_or_default();
        match serde_json::to_value(pending) {
            Ok(asks) => structured(json!({ "asks": asks }), false),
            Err(err) => refusal(format!("cannot encode the pending asks: {err}")),
        }
    }

    /// The API's `POST /api/interventions/{id}`: the answer, who gave it (`mcp:admin`, or
    /// `mcp:stdio`) and the note go to the waiting agent, which journals them with the decision.
    fn answer_ask(&self, args: AnswerArgs) -> CallToolResult {
        let AnswerArgs { id, answer, note } = args;
        let answer = match Answer::parse(&answer) {
            Answer::Other(other) => {
                return refusal(format!("answer must be \"yes\" or \"no\", not {other:?}"))
            }
            answer => answer,
        };
        let note = note.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty());
        let Some(bus) = &self.bus else {
            return refusal(format!(
                "no pending ask with id {id}: this server asks nobody (no intervention bus), so \
                 every ask is refused on its own"
            ));
        };
        match bus.reply(
            id,
            OperatorReply::by(answer.clone(), self.operator, note.clone()),
        ) {
            Ok(()) => {
                tracing::info!(id, operator = self.operator, answer = %answer, "ask answered over MCP");
                structured(json!({ "id": id, "answer": answer, "note": note }), false)
            }
            Err(AnswerError::Unknown(id)) => refusal(format!(
                "no pending ask with id {id} (answered, withdrawn by a halt, or never asked; \
                 list_asks lists the pending ones)"
            )),
        }
    }

    /// The event's fate from the journal, on a blocking thread (a SQLite read flushes first).
    async fn fate(&self, agent: &str, id: u64) -> Result<Option<EventFate>, String> {
        let Some(fates) = self.fates.clone() else {
            return Err("this server keeps no journal to read events from".to_owned());
        };
        let agent = agent.to_owned();
        tokio::task::spawn_blocking(move || fates.fate(&agent, id))
            .await
            .map_err(|e| format!("journal read failed: {e}"))?
            .map_err(|e| format!("journal read failed: {e}"))
    }
}

fn agent_property() -> Value {
    json!({ "type": "string", "minLength": 1, "description": "The agent's key (list_agents lists them)." })
}

/// A tool whose input is an object with exactly `properties`, `required` of them required.
fn tool(
    name: &'static str,
    description: &'static str,
    properties: Value,
    required: &[&str],
    annotations: ToolAnnotations,
) -> Tool {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), properties);
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema.insert("additionalProperties".into(), json!(false));
    let mut tool = Tool::new(name, description, schema);
    tool.annotations = Some(annotations);
    tool
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentArgs {
    agent: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventArgs {
    agent: String,
    id: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerArgs {
    id: u64,
    answer: String,
    note: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AskArgs {
    agent: String,
    content: String,
    #[serde(default)]
    wait_s: Option<f64>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// The arguments of tool `name`, or the refusal that says what is wrong with them (a tool error,
/// so a model can correct its call).
fn parse<T: serde::de::DeserializeOwned>(name: &str, args: Value) -> Result<T, CallToolResult> {
    serde_json::from_value(args)
        .map_err(|err| refusal(format!("invalid arguments for {name}: {err}")))
}

/// A result carrying `value` as structured content and as its JSON text.
fn structured(value: Value, is_error: bool) -> CallToolResult {
    let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    if value.is_object() {
        result.structured_content = Some(value);
    }
    result
}

/// A tool error saying why.
fn refusal(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// A tool error saying why, with the details as structured content.
fn refusal_with(text: String, details: Value) -> CallToolResult {
    let mut result = refusal(text);
    result.structured_content = Some(details);
    result
}

fn unknown_agent(agent: &str) -> CallToolResult {
    refusal(format!(
        "unknown agent {agent} (list_agents lists the team)"
    ))
}

/// An event's fate as a tool result: the answer as text when answered; an error for refused,
/// discarded and failed; for pending and running, how to poll.
fn fate_result(
    agent: &str,
    id: u64,
    fate: &EventFate,
    duplicate: bool,
    waited: Option<f64>,
) -> CallToolResult {
    let mut body = serde_json::to_value(fate).unwrap_or_else(|_| json!({}));
    if let Some(map) = body.as_object_mut() {
        map.insert("id".into(), id.into());
        map.insert("agent".into(), agent.into());
        if duplicate {
            map.insert("duplicate".into(), true.into());
        }
    }
    let text = match fate {
        EventFate::Answered { answer, .. } => answer.clone(),
        EventFate::Pending | EventFate::Running => {
            let status = if matches!(fate, EventFate::Pending) {
                "pending"
            } else {
                "running"
            };
            match waited {
                Some(s) if s > 0.0 => format!(
                    "no answer from {agent} within {s} s: event {id} is {status}; call \
                     event_status {{\"agent\": \"{agent}\", \"id\": {id}}} later"
                ),
                _ => format!(
                    "event {id} for {agent} is {status}; call event_status {{\"agent\": \
                     \"{agent}\", \"id\": {id}}} for its answer"
                ),
            }
        }
        EventFate::Discarded => {
            format!("event {id} for {agent} was discarded: the agent was halted")
        }
        EventFate::Refused { refusal } => {
            format!("event {id} for {agent} was refused: {refusal}")
        }
        EventFate::Failed { reason, error } => match error {
            Some(error) => format!("event {id} for {agent} failed ({reason:?}): {error}"),
            None => format!("event {id} for {agent} failed ({reason:?})"),
        },
    };
    let is_error = matches!(
        fate,
        EventFate::Discarded | EventFate::Refused { .. } | EventFate::Failed { .. }
    );
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(body);
    result
}

/// Halt acknowledgements as a result: an error when a halt could not be made durable (it is applied
/// all the same).
fn halted(acks: Vec<warden_actors::HaltAck>) -> CallToolResult {
    let not_durable = acks.iter().find_map(|a| {
        a.not_durable
            .as_ref()
            .map(|c| (a.agent.to_string(), c.to_string()))
    });
    let halted: Vec<api::HaltAckBody> = acks
        .into_iter()
        .map(|a| api::HaltAckBody {
            agent: a.agent.to_string(),
            state: a.state,
            discarded: a.discarded,
        })
        .collect();
    match not_durable {
        None => structured(json!({ "halted": halted }), false),
        Some((agent, cause)) => {
            tracing::error!(%agent, "halt applied but not durable: {cause}");
            structured(
                json!({ "error": format!("halt applied but not durable: {cause}"), "halted": halted }),
                true,
            )
        }
    }
}

/// The protocol versions served: those with the `initialize` handshake (sessions are made there).
fn versions() -> &'static [ProtocolVersion] {
    ProtocolVersion::known_up_to(&ProtocolVersion::LATEST_WITH_INITIALIZE)
}

impl ServerHandler for WardenMcp {
    fn get_info(&self) -> ServerConfig {
        let instructions = match self.access {
            McpAccess::Admin => {
                "A team of LLM agents run by warden. list_agents shows the team; ask_agent sends \
                 one of them a message and returns its answer (or an event id to poll with \
                 event_status); halt and halt_all stop agents at once."
            }
            McpAccess::Read => {
                "A team of LLM agents run by warden, read-only: list_agents, agent_status and \
                 event_status."
            }
        };
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("warden", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
            .with_instructions(instructions)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(versions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // rmcp cancels the context on `notifications/cancelled` (and when an HTTP client goes
        // away, see `InFlight`) but lets the handler run: stop waiting then. A queued event stays
        // queued; only the wait for its answer ends.
        tokio::select! {
            result = self.call(&request.name, request.arguments) => result.map(CallToolResponse::from),
            () = context.ct.cancelled() => Err(ErrorData::internal_error("the call was cancelled", None)),
        }
    }
}

/// Why `warden mcp` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum McpServeError {
    /// The MCP handshake on standard input failed (not an MCP client, or it went away first).
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// The service ended with an error.
    #[error("MCP service failed: {0}")]
    Service(String),
}

/// Serves `handler` over standard input and output until the client closes standard input
/// ([`crate::serve::serve_stdio`] starts the team it serves).
pub(crate) async fn serve_on_stdio(handler: WardenMcp) -> Result<(), McpServeError> {
    match handler.serve(rmcp::transport::stdio()).await {
        Ok(service) => service
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| McpServeError::Service(e.to_string())),
        Err(err) => Err(McpServeError::Handshake(err.to_string())),
    }
}

mod http;
pub use http::*;

#[cfg(test)]
mod tests {
    use super::*;
    use warden_actors::MemoryJournal;
    use warden_protocols::WardenConfig;

    #[actix_rt::test]
    async fn sessions_are_bounded_and_idle_ones_end_unless_busy() {
        tokio::time::pause();
        let journal = Arc::new(MemoryJournal::new());
        let supervisor = Supervisor::on_current_arbiter(WardenConfig::default(), journal);
        let handler = || WardenMcp::new(supervisor.clone(), None, McpAccess::Read, "test");
        let sessions = McpSessions::default();
        let (busy, busy_session) = sessions.open(handler()).unwrap();
        let (idle, _) = sessions.open(handler()).unwrap();
        for _ in 2..MAX_SESSIONS {
            assert!(sessions.open(handler()).is_some());
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(sessions.open(handler()).is_none(), "bounded");

        // A request in flight keeps its session past the idle limit; the others end.
        busy_session.in_flight.fetch_add(1, Ordering::AcqRel);
        tokio::time::advance(SESSION_IDLE + Duration::from_secs(1)).await;
        assert!(sessions.get(&idle).is_none(), "idle session ended");
        assert!(
            sessions.open(handler()).is_some(),
            "room again after the sweep"
        );
        assert_eq!(sessions.len(), 2);
        assert!(sessions.get(&busy).is_some(), "busy session kept");
        assert!(sessions.close(&busy));
        assert!(sessions.get(&busy).is_none());
    }

    #[test]
    fn origins_are_this_servers_own_by_address_or_listed() {
        let req = |host: &str| {
            actix_web::test::TestRequest::default()
                .insert_header((header::HOST, host))
                .to_http_request()
        };
        let listed = vec!["http://localhost:6274".to_owned()];
        let cases = [
            ("127.0.0.1:7878", "http://127.0.0.1:7878", true),
            ("localhost:7878", "http://localhost:7878", true),
            ("[::1]:7878", "http://[::1]:7878", true),
            ("127.0.0.1:7878", "https://127.0.0.1:7878/", true),
            ("127.0.0.1:7878", "http://localhost:6274", true),
            ("127.0.0.1:7878", "http://127.0.0.1:8000", false),
            ("127.0.0.1:7878", "http://evil.example", false),
            ("127.0.0.1:7878", "null", false),
            // DNS rebinding: a name that resolved to this address, Host and Origin agreeing.
            ("evil.example:7878", "http://evil.example:7878", false),
        ];
        for (host, origin, ok) in cases {
            assert_eq!(
                allowed_origin(&listed, &req(host), origin),
                ok,
                "{host} {origin}"
            );
        }
        let section = |origins: &[&str]| api::ApiSection {
            allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            ..api::ApiSection::default()
        };
        assert!(section(&["http://localhost:6274", "https://ops.example"])
            .validate()
            .is_ok());
        for bad in ["localhost:6274", "http://", "http://x/path", "*"] {
            let err = section(&[bad]).validate().unwrap_err();
            assert_eq!(err.key, "api.allowed_origins", "{bad}");
        }
    }

    #[actix_rt::test]
    async fn a_read_session_lists_and_may_call_only_the_reading_tools() {
        let journal = Arc::new(MemoryJournal::new());
        let supervisor = Supervisor::on_current_arbiter(WardenConfig::default(), journal);
        let read = WardenMcp::new(supervisor.clone(), None, McpAccess::Read, "test");
        let names: Vec<_> = read.tools().iter().map(|t| t.name.to_string()).collect();
        assert_eq!(names, READ_TOOLS);
        for tool in ADMIN_TOOLS {
            let refused = read.call(tool, None).await.unwrap();
            assert_eq!(refused.is_error, Some(true), "{tool}");
        }
        let admin = WardenMcp::new(supervisor, None, McpAccess::Admin, "test");
        assert_eq!(admin.tools().len(), READ_TOOLS.len() + ADMIN_TOOLS.len());
        for tool in admin.tools() {
            assert_eq!(tool.input_schema["additionalProperties"], json!(false));
        }
        assert!(admin.call("nope", None).await.is_err(), "a protocol error");
    }
}
