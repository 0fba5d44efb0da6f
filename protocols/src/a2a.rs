//! The A2A protocol's data, version 1.0, as its JSON-RPC binding puts it on the wire (the proto
//! messages in proto3 JSON: camelCase fields, enums as their `TASK_STATE_…` / `ROLE_…` names), for
//! warden's A2A server (`warden::server::a2a`, docs/a2a.md).
//!
//! Written by hand, serde only: no Rust crate for A2A 1.0 was a fit when this was written (the
//! crates.io index was unreachable from the build machine, and the ones known then followed 0.2/0.3
//! with `kind` discriminators, not the 1.0 proto-JSON shapes that the official SDKs, Python
//! `a2a-sdk` 1.x included, send). Only what warden serves is here; unknown fields are ignored on
//! input (a client may send more than warden reads) and absent fields are left out on output.
//!
//! A2A 0.3 clients send `message/send` and the like with `{"kind": "text", "text": …}` parts and
//! lowercase states: input is read leniently here (a `kind` is ignored, `"user"` is `ROLE_USER`),
//! and the server turns its answers into 0.3 shapes for those method names (`to_v03`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The A2A version warden's server speaks (`supportedInterfaces[].protocolVersion`).
pub const PROTOCOL_VERSION: &str = "1.0";

/// The path of the agent card (A2A §8.2, RFC 8615).
pub const AGENT_CARD_PATH: &str = "/.well-known/agent-card.json";

/// An agent card: who the server is, where and how to call it, and its skills.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// The server's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Where it is called, by which binding and version.
    pub supported_interfaces: Vec<AgentInterface>,
    /// The server's own version.
    pub version: String,
    /// Streaming, push notifications.
    pub capabilities: AgentCapabilities,
    /// Named security schemes (`bearer`).
    #[serde(default)]
    pub security_schemes: std::collections::BTreeMap<String, SecurityScheme>,
    /// Which schemes a call needs.
    #[serde(default)]
    pub security_requirements: Vec<SecurityRequirement>,
    /// Media types accepted.
    #[serde(default)]
    pub default_input_modes: Vec<String>,
    /// Media types answered.
    #[serde(default)]
    pub default_output_modes: Vec<String>,
    /// One per exposed agent.
    #[serde(default)]
    pub skills: Vec<AgentSkill>,
    /// The 0.3 card's endpoint (`url`), for 0.3 clients; 1.0 clients read `supportedInterfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The 0.3 card's transport (`JSONRPC`), with `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_transport: Option<String>,
}

/// One endpoint of a card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    /// Its absolute URL.
    pub url: String,
    /// `JSONRPC`, `HTTP+JSON` or `GRPC`.
    pub protocol_binding: String,
    /// The A2A version it speaks.
    pub protocol_version: String,
}

/// What the server can do besides request/response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// `SendStreamingMessage` and `SubscribeToTask` are served.
    #[serde(default)]
    pub streaming: bool,
    /// The push-notification config methods are served.
    #[serde(default)]
    pub push_notifications: bool,
}

/// A security scheme; warden's is HTTP bearer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityScheme {
    /// `Authorization: <scheme> <token>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_auth_security_scheme: Option<HttpAuthSecurityScheme>,
}

/// An HTTP authentication scheme (RFC 7235).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpAuthSecurityScheme {
    /// `Bearer`.
    pub scheme: String,
    /// What the token is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// Scheme names, each with its scopes (none for a bearer token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityRequirement {
    /// Scheme name → scopes.
    pub schemes: std::collections::BTreeMap<String, StringList>,
}

/// A list of strings, as proto JSON wraps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StringList {
    /// The strings.
    #[serde(default)]
    pub list: Vec<String>,
}

/// One skill of the card: a warden agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// The agent's key (what `metadata.agent` names).
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it is.
    pub description: String,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(clippy::enum_variant_names)]
pub enum TaskState {
    /// Accepted, not started.
    #[serde(rename = "TASK_STATE_SUBMITTED", alias = "submitted")]
    Submitted,
    /// Being worked on.
    #[serde(rename = "TASK_STATE_WORKING", alias = "working")]
    Working,
    /// Waiting for the client's answer.
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED", alias = "input-required")]
    InputRequired,
    /// Done, with an answer.
    #[serde(rename = "TASK_STATE_COMPLETED", alias = "completed")]
    Completed,
    /// Ended without an answer.
    #[serde(rename = "TASK_STATE_FAILED", alias = "failed")]
    Failed,
    /// Canceled.
    #[serde(rename = "TASK_STATE_CANCELED", alias = "canceled")]
    Canceled,
    /// Refused by the agent.
    #[serde(rename = "TASK_STATE_REJECTED", alias = "rejected")]
    Rejected,
}

impl TaskState {
    /// Whether no further change can come.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// Whether the task waits for the client (terminal or input-required): where a blocking send
    /// returns.
    pub fn is_interrupted(self) -> bool {
        self.is_terminal() || self == TaskState::InputRequired
    }

    /// The 0.3 spelling (`input-required`).
    pub fn v03(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input-required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::Rejected => "rejected",
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// The client.
    #[serde(rename = "ROLE_USER", alias = "user")]
    User,
    /// The agent.
    #[serde(rename = "ROLE_AGENT", alias = "agent")]
    Agent,
}

/// A piece of a message or artifact. warden reads and writes text; other kinds are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// The text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Raw bytes (base64): not read by warden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Value>,
    /// A URL: not read by warden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Value>,
    /// Structured data: not read by warden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// A 0.3 file part: not read by warden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<Value>,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Part {
            text: Some(text.into()),
            ..Part::default()
        }
    }
}

/// A message between client and agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Unique per message, chosen by its writer.
    #[serde(default)]
    pub message_id: String,
    /// The conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task it continues (answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Who wrote it.
    pub role: Role,
    /// Its content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Free data: warden reads `agent` (which agent to send it to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A task's state now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// The agent's word on it: the answer, the question asked, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
}

/// An output of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Unique within the task.
    pub artifact_id: String,
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its content.
    pub parts: Vec<Part>,
}

/// A task: in warden, a user event of one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// `AGENT/EVENT_ID`.
    pub id: String,
    /// The agent's key: an agent keeps one conversation.
    pub context_id: String,
    /// Its state now.
    pub status: TaskStatus,
    /// The answer, once there is one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// Free data: warden puts `agent` and `eventId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A change of a task's state, streamed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its context.
    pub context_id: String,
    /// The new status.
    pub status: TaskStatus,
}

/// An artifact of a task, streamed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its context.
    pub context_id: String,
    /// The artifact.
    pub artifact: Artifact,
    /// Whether it is the artifact's last piece.
    pub last_chunk: bool,
}

/// One item of a stream (exactly one field set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamResponse {
    /// The task, first.
    Task(Task),
    /// A status change.
    StatusUpdate(TaskStatusUpdateEvent),
    /// An artifact.
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

/// `SendMessage`'s params.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    /// The message.
    pub message: Message,
    /// How to answer.
    #[serde(default)]
    pub configuration: Option<SendMessageConfiguration>,
    /// Free data: warden reads `agent` here too.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// How `SendMessage` answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    /// 1.0: answer at once with the task as it is, without waiting.
    #[serde(default)]
    pub return_immediately: bool,
    /// 0.3: `false` answers at once (the opposite of `returnImmediately`).
    #[serde(default)]
    pub blocking: Option<bool>,
    /// Where to POST the new task's updates.
    #[serde(default)]
    pub task_push_notification_config: Option<TaskPushNotificationConfig>,
}

/// Where and how to POST a task's updates (`CreateTaskPushNotificationConfig`, or
/// `SendMessage`'s `configuration.taskPushNotificationConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskPushNotificationConfig {
    /// The config's id within the task (given by the server when empty).
    #[serde(default)]
    pub id: String,
    /// The task (empty in `SendMessage`: the task being created).
    #[serde(default)]
    pub task_id: String,
    /// The webhook (`http` or `https`).
    pub url: String,
    /// Sent back as `X-A2A-Notification-Token`, for the client to check.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// Sent as `Authorization: SCHEME CREDENTIALS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<AuthenticationInfo>,
}

/// Credentials for a webhook.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthenticationInfo {
    /// `Bearer`, `Basic`, …
    pub scheme: String,
    /// The credentials.
    #[serde(default)]
    pub credentials: String,
}

/// `Get…` and `Delete…PushNotificationConfig`'s params; `List…`'s (without `id`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfigParams {
    /// The task.
    pub task_id: String,
    /// The config.
    #[serde(default)]
    pub id: String,
}

/// `GetTask`'s, `CancelTask`'s and `SubscribeToTask`'s params.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TaskIdParams {
    /// The task's id.
    pub id: String,
}

/// `ListTasks`'s params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksRequest {
    /// Only this context (agent).
    #[serde(default)]
    pub context_id: Option<String>,
    /// At most this many (1–100, default 50).
    #[serde(default)]
    pub page_size: Option<u32>,
    /// Where the previous page ended.
    #[serde(default)]
    pub page_token: Option<String>,
}

/// `ListTasks`'s result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksResponse {
    /// The page, newest first per agent.
    pub tasks: Vec<Task>,
    /// The next page's token (empty: no more).
    pub next_page_token: String,
    /// The page size used.
    pub page_size: u32,
}

/// A JSON-RPC 2.0 error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    /// The code (A2A's are -32001 to -32009).
    pub code: i64,
    /// What went wrong.
    pub message: String,
}

/// JSON-RPC and A2A error codes.
pub mod codes {
    /// Not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a JSON-RPC request.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Bad params.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The server failed.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// No such task.
    pub const TASK_NOT_FOUND: i64 = -32001;
    /// The task is already in a terminal state.
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    /// Push notifications are not served.
    pub const PUSH_NOTIFICATION_NOT_SUPPORTED: i64 = -32003;
    /// The operation is not served.
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    /// A part's kind is not accepted.
    pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
}

/// A 1.0 result as an A2A 0.3 client expects it: `kind` on tasks, messages, parts and stream
/// events, lowercase states and roles, a task or message in place of `{"task": …}`.
pub fn to_v03(value: Value) -> Value {
    fn fix(value: Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut out = serde_json::Map::new();
                for (k, v) in map {
                    let v = match (k.as_str(), &v) {
                        ("state", Value::String(s)) => {
                            match serde_json::from_value::<TaskState>(Value::String(s.clone())) {
                                Ok(state) => Value::String(state.v03().into()),
                                Err(_) => v,
                            }
                        }
                        ("role", Value::String(s)) if s == "ROLE_USER" => "user".into(),
                        ("role", Value::String(s)) if s == "ROLE_AGENT" => "agent".into(),
                        _ => fix(v),
                    };
                    out.insert(k, v);
                }
                if out.contains_key("text") && !out.contains_key("kind") {
                    out.insert("kind".into(), "text".into());
                }
                if out.contains_key("messageId") && out.contains_key("role") {
                    out.insert("kind".into(), "message".into());
                }
                if out.contains_key("contextId") && out.contains_key("status") {
                    if out.contains_key("taskId") {
                        out.insert("kind".into(), "status-update".into());
                        let last = out
                            .get("status")
                            .and_then(|s| s.get("state"))
                            .and_then(Value::as_str)
                            .is_some_and(|s| {
                                matches!(
                                    s,
                                    "completed"
                                        | "failed"
                                        | "canceled"
                                        | "rejected"
                                        | "input-required"
                                )
                            });
                        out.insert("final".into(), last.into());
                    } else {
                        out.insert("kind".into(), "task".into());
                    }
                }
                if out.contains_key("artifact") && out.contains_key("taskId") {
                    out.insert("kind".into(), "artifact-update".into());
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.into_iter().map(fix).collect()),
            other => other,
        }
    }
    // `{"task": T}` / `{"message": M}` / `{"statusUpdate": E}` … → the inner object.
    let inner = match value {
        Value::Object(map) if map.len() == 1 => {
            let (key, inner) = map.into_iter().next().unwrap_or_default();
            match key.as_str() {
                "task" | "message" | "statusUpdate" | "artifactUpdate" => inner,
                _ => Value::Object(std::iter::once((key, inner)).collect()),
            }
        }
        other => other,
    };
    fix(inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_0_3_message_and_a_1_0_message_read_alike() {
        let v03: Message = serde_json::from_value(json!({
            "kind": "message", "messageId": "m1", "role": "user",
            "parts": [{"kind": "text", "text": "hi"}]
        }))
        .unwrap();
        let v10: Message = serde_json::from_value(json!({
            "messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]
        }))
        .unwrap();
        assert_eq!(v03, v10);
    }

    #[test]
    fn results_turn_into_0_3_shapes() {
        let task = json!({"task": {"id": "a/1", "contextId": "a",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED",
                "message": {"messageId": "q", "role": "ROLE_AGENT", "parts": [{"text": "go on?"}]}}}});
        assert_eq!(
            to_v03(task),
            json!({"kind": "task", "id": "a/1", "contextId": "a",
                "status": {"state": "input-required",
                    "message": {"kind": "message", "messageId": "q", "role": "agent",
                        "parts": [{"kind": "text", "text": "go on?"}]}}})
        );
    }
}
