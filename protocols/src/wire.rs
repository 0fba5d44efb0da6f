//! Chat Completions wire types and small identity types.

use serde::{Deserialize, Serialize};
use std::{fmt, sync::Arc};

/// An agent's unique key. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AgentKey(Arc<str>);

impl AgentKey {
    /// An agent key from any string (no validation; the supervisor refuses duplicates).
    pub fn new(key: impl AsRef<str>) -> Self {
        AgentKey(Arc::from(key.as_ref()))
    }
    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, not `write_str`: widths and alignment (`{:<16}`) apply to keys in tables.
        f.pad(&self.0)
    }
}

impl From<&str> for AgentKey {
    fn from(s: &str) -> Self {
        AgentKey::new(s)
    }
}

impl From<String> for AgentKey {
    fn from(s: String) -> Self {
        AgentKey(Arc::from(s))
    }
}

impl std::borrow::Borrow<str> for AgentKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Which role an agent plays. One actor type serves both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AgentRole {
    /// Talks to users; may delegate.
    #[default]
    Assistant,
    /// Receives delegated tasks (and may delegate further, within the hop limit).
    SubAgent,
}

impl AgentRole {
    /// The name used on the wire and in team files (`assistant`, `sub_agent`).
    pub fn as_str(self) -> &'static str {
        match self {
            AgentRole::Assistant => "assistant",
            AgentRole::SubAgent => "sub_agent",
        }
    }
}

impl fmt::Display for AgentRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Chat Completions roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    /// Instructions from the system (system prompts, safety alerts).
    System,
    /// A user event, as text.
    User,
    /// The model's own reply.
    Assistant,
    /// A tool's result, answering one tool call.
    Tool,
}

/// One message of a conversation, in Chat Completions format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: ChatRole,
    /// Text content; `None` for an assistant message that only calls tools.
    pub content: Option<String>,
    /// The tool calls of an assistant message (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Internal messages (continuations, system alerts) are sent to the model but never shown to users.
    /// Not part of the Chat Completions format: providers strip it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub internal: bool,
}

impl ChatMessage {
    fn text(role: ChatRole, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            internal: false,
        }
    }
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::text(ChatRole::System, content)
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::text(ChatRole::User, content)
    }
    /// An assistant message with text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::text(ChatRole::Assistant, content)
    }
    /// An assistant message that calls tools.
    pub fn assistant_tool_calls(content: Option<String>, tool_calls: Vec<ToolCall>) -> Self {
        ChatMessage {
            role: ChatRole::Assistant,
            content,
            tool_calls,
            tool_call_id: None,
            internal: false,
        }
    }
    /// The result of tool call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: ChatRole::Tool,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            internal: false,
        }
    }
    /// Marks the message internal (sent to the model, never shown to users).
    pub fn internal(mut self) -> Self {
        self.internal = true;
        self
    }

    /// Estimated tokens of this message: [`MESSAGE_OVERHEAD_TOKENS`] + ⌈chars / [`CHARS_PER_TOKEN`]⌉,
    /// where *chars* counts the Unicode scalar values of the content, the `tool_call_id`, and every
    /// tool call's id, name and argument text (a heuristic: see `warden_actors::context`).
    pub fn estimated_tokens(&self) -> u64 {
        let count = |s: &str| s.chars().count() as u64;
        let mut chars = self.content.as_deref().map_or(0, count);
        chars += self.tool_call_id.as_deref().map_or(0, count);
        for call in &self.tool_calls {
            chars += count(&call.id) + count(&call.function.name) + count(&call.function.arguments);
        }
        MESSAGE_OVERHEAD_TOKENS + chars.div_ceil(CHARS_PER_TOKEN)
    }
}

/// Tokens added to every message for its role and framing (see [`ChatMessage::estimated_tokens`]).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 4;
/// Characters per token of [`ChatMessage::estimated_tokens`].
pub const CHARS_PER_TOKEN: u64 = 4;

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, unique within the reply; the tool message that answers it names it.
    pub id: String,
    /// Always `function` (the only kind Chat Completions has).
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The function's name and arguments.
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_owned()
}

impl ToolCall {
    /// A function call of `name` with `arguments` (serialised to JSON text).
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: &serde_json::Value,
    ) -> Self {
        ToolCall {
            id: id.into(),
            kind: function_type(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.to_string(),
            },
        }
    }
}

/// The function half of a tool call; `arguments` is the JSON text the model produced (maybe invalid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text, exactly as the model produced it (maybe not valid JSON).
    pub arguments: String,
}

/// Token usage of one LLM call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request (the prompt).
    pub prompt_tokens: u64,
    /// Tokens of the reply (the completion).
    pub completion_tokens: u64,
    /// `true` when the server sent no usage and warden estimated it.
    #[serde(default)]
    pub estimated: bool,
}

impl Usage {
    /// Prompt and completion tokens together.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// `true` for no tokens at all.
    pub fn is_zero(&self) -> bool {
        self.prompt_tokens == 0 && self.completion_tokens == 0
    }

    /// Adds `other` (estimated if either is).
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.estimated |= other.estimated;
    }
}

/// Why the model stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model finished its reply.
    #[default]
    Stop,
    /// The model asked for tool calls.
    ToolCalls,
    /// The reply was cut by the token limit (`max_tokens`).
    Length,
    /// The provider's content filter removed the reply.
    ContentFilter,
    /// Any other reason the provider gave.
    Other,
}

/// What a tool does to the world, which decides what the ReAct loop does after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ToolCategory {
    /// Read-only or cheap: the loop may chain another iteration after it.
    #[default]
    SafeChain,
    /// Communication (say, page): the turn ends and the agent waits for a response.
    Terminal,
    /// Changes state: at most one per turn, the turn ends after it.
    Dangerous,
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: serde_json::Value,
    /// What it does to the world; decides what the loop does after it.
    pub category: ToolCategory,
}

/// Why a turn's ReAct loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminationReason {
    /// The model answered without calling a tool. (`noop` in journals written before 0.1: still
    /// read.)
    #[serde(alias = "noop")]
    Answered,
    /// A TERMINAL tool ran.
    TerminalTool,
    /// A DANGEROUS tool ran (one per tick).
    DangerousTool,
    /// `execution.multi_action_enabled = false`: the turn's one action ran (design 001's
    /// `single_action` pattern); the next tick or event goes on from its result.
    SingleAction,
    /// The context is at or above the critical threshold.
    CriticalTokens,
    /// `execution.max_iterations_per_tick` reached.
    MaxIterations,
    /// The model call failed.
    LlmError,
    /// The model's output could not be parsed.
    ParseError,
    /// A breaker tripped; the agent is in SAFETY_LOCKOUT.
    SafetyLockout,
    /// A SystemHalt stopped the turn.
    Halted,
    /// A token or cost budget stopped the agent (STOPPED) before the call.
    BudgetExceeded,
    /// A limit (iterations per task or per tick, wall clock) was refused; the turn ended with a
    /// wrap-up.
    LimitStopped,
    /// The agent's actor crashed during the turn; it was restarted without finishing it.
    Crashed,
}

impl TerminationReason {
    /// The name used on the wire and in messages (`answered`, `terminal_tool`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            TerminationReason::Answered => "answered",
            TerminationReason::TerminalTool => "terminal_tool",
            TerminationReason::DangerousTool => "dangerous_tool",
            TerminationReason::SingleAction => "single_action",
            TerminationReason::CriticalTokens => "critical_tokens",
            TerminationReason::MaxIterations => "max_iterations",
            TerminationReason::LlmError => "llm_error",
            TerminationReason::ParseError => "parse_error",
            TerminationReason::SafetyLockout => "safety_lockout",
            TerminationReason::Halted => "halted",
            TerminationReason::BudgetExceeded => "budget_exceeded",
            TerminationReason::LimitStopped => "limit_stopped",
            TerminationReason::Crashed => "crashed",
        }
    }
}

impl fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Something that happened that an agent should react to: a chat line, a game event, a user request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEvent {
    /// Where it came from (`say`, `whisper`, `channel:ooc`, `api`, …).
    #[serde(default = "default_source")]
    pub source: String,
    /// Who sent it (a player, a user name), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// The text.
    pub content: String,
}

fn default_source() -> String {
    "api".to_owned()
}

impl UserEvent {
    /// An event from `api` with this content and no sender.
    pub fn new(content: impl Into<String>) -> Self {
        UserEvent {
            source: default_source(),
            sender: None,
            content: content.into(),
        }
    }
}

#[cfg(test)]
mod termination_tests {
    use super::TerminationReason;

    #[test]
    fn the_wire_name_is_the_serde_name_and_old_noop_still_reads() {
        for reason in [
            TerminationReason::Answered,
            TerminationReason::TerminalTool,
            TerminationReason::DangerousTool,
            TerminationReason::CriticalTokens,
            TerminationReason::MaxIterations,
            TerminationReason::LlmError,
            TerminationReason::ParseError,
            TerminationReason::SafetyLockout,
            TerminationReason::Halted,
            TerminationReason::BudgetExceeded,
            TerminationReason::LimitStopped,
            TerminationReason::Crashed,
        ] {
            let json = serde_json::to_string(&reason).unwrap();
            assert_eq!(json, format!("\"{reason}\""));
        }
        let old: TerminationReason = serde_json::from_str("\"noop\"").unwrap();
        assert_eq!(old, TerminationReason::Answered);
    }
}
