//! Trace spans on the OpenTelemetry GenAI semantic conventions, made with `tracing` only.
//!
//! This crate never depends on OpenTelemetry: it creates plain `tracing` spans under the target
//! [`TARGET`], with the field names a `tracing-opentelemetry` layer maps to OTLP (`otel.name` is
//! the span's name, `otel.kind` its kind, `otel.status_code` its status, every other field an
//! attribute). The `warden` crate installs that layer (feature `otel`, docs/telemetry.md); with no
//! layer interested in [`TARGET`], each span is a disabled [`tracing::Span`] and the field values are
//! never computed.
//!
//! ```text
//! invoke_agent {agent}        one per turn (root, or the child of whatever queued the work)
//! ├── chat {model}            one per model call
//! └── execute_tool {tool}     one per tool call
//!     └── invoke_agent {delegate}   for `delegate`: the delegate's turn, same trace
//! ```
//!
//! A delegated task carries the delegator's `execute_tool delegate` span, and the delegate's turn
//! makes it its parent: one task is one trace across the delegation tree. A user event carries the
//! trace context that was current when it was queued ([`TraceContext`], captured through the
//! [`ContextHooks`] the exporter installs), and the turn that takes it continues that trace: across
//! the mailbox, without holding the sender's span open until the turn ends.

use std::{
    any::Any,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
};
use tracing::{field::Empty, Span};
use warden_protocols::{
    AgentKey, ChatMessage, ChatRole, FinishReason, TerminationReason, TurnOutcome,
};

use crate::provider::{LlmRequest, LlmResponse, ProviderError};
use crate::tools::ToolRun;

/// The `tracing` target of every GenAI span and span event (`invoke_agent`, `chat`, `execute_tool`).
/// A subscriber layer filters on it (e.g. `Targets::new().with_target(TARGET, Level::INFO)`).
pub const TARGET: &str = "gen_ai";

/// The most bytes of message text one content attribute holds when content capture is on
/// ([`set_capture_content`]); longer content is cut on a char boundary and ends with `…`.
pub const CONTENT_CAP: usize = 16 * 1024;

static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Puts prompt and completion text in `chat` spans (`gen_ai.input.messages`,
/// `gen_ai.output.messages`, each capped at [`CONTENT_CAP`] bytes) and tool arguments and results in
/// `execute_tool` spans. Off by default: process-wide, like the subscriber the spans go to.
pub fn set_capture_content(on: bool) {
    CAPTURE_CONTENT.store(on, Ordering::Relaxed);
}

/// Whether content capture is on ([`set_capture_content`]).
pub fn capture_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// How queued work carries a trace context without this crate knowing OpenTelemetry: `capture`
/// reads the caller's current context (`None`: nothing worth carrying), `attach` makes it the parent
/// of a turn's span that has not started yet. The `warden` crate's exporter installs them
/// (`warden::telemetry::install_context_hooks`); with none installed, nothing is captured.
#[derive(Debug, Clone, Copy)]
pub struct ContextHooks {
    /// Reads the current trace context.
    pub capture: fn() -> Option<Arc<dyn Any + Send + Sync>>,
    /// Makes a captured context the parent of `span`.
    pub attach: fn(span: &Span, context: &(dyn Any + Send + Sync)),
}

static HOOKS: OnceLock<ContextHooks> = OnceLock::new();

/// Installs the process's [`ContextHooks`]. Only the first call counts (`false` after it).
pub fn set_context_hooks(hooks: ContextHooks) -> bool {
    HOOKS.set(hooks).is_ok()
}

/// A trace context carried with a queued user event (opaque here; empty when no hooks are
/// installed or the sender was in no trace).
#[derive(Clone, Default)]
pub struct TraceContext(Option<Arc<dyn Any + Send + Sync>>);

impl std::fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "TraceContext(..)"
        } else {
            "TraceContext(none)"
        })
    }
}

impl TraceContext {
    /// The caller's current context, through the installed hooks (an atomic load when there are
    /// none).
    pub fn current() -> Self {
        TraceContext(HOOKS.get().and_then(|hooks| (hooks.capture)()))
    }
}

/// What a turn's `invoke_agent` span descends from.
#[derive(Debug, Default)]
pub(crate) enum Parent {
    /// A root span (a tick, an event queued again after a restart, no trace).
    #[default]
    None,
    /// A span of this process: the delegator's `execute_tool delegate`.
    Span(Span),
    /// A context carried across the mailbox with a user event.
    Context(TraceContext),
}

/// The `invoke_agent {agent}` span of one turn, descending from `parent`.
pub(crate) fn invoke_agent(parent: &Parent, agent: &AgentKey) -> Span {
    let span = invoke_agent_span(
        match parent {
            Parent::Span(span) => span.id(),
            Parent::None | Parent::Context(_) => None,
        },
        agent,
    );
    if let (Parent::Context(TraceContext(Some(context))), Some(hooks)) = (parent, HOOKS.get()) {
        if !span.is_disabled() {
            (hooks.attach)(&span, context.as_ref());
        }
    }
    span
}

fn invoke_agent_span(parent: Option<tracing::Id>, agent: &AgentKey) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {agent}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %agent,
        warden.termination = Empty,
        warden.iterations = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        error.type = Empty,
    )
}

/// Records how the turn ended on its `invoke_agent` span: halts, lockouts and budget stops are span
/// events with error status. `lockout` is the lockout's cause, read only when the span is enabled.
pub(crate) fn turn_ended(span: &Span, outcome: &TurnOutcome, lockout: impl FnOnce() -> String) {
    if span.is_disabled() {
        return;
    }
    let reason = outcome.reason;
    span.record("warden.termination", reason.as_str());
    span.record("warden.iterations", outcome.iterations);
    span.record("gen_ai.usage.input_tokens", outcome.usage.prompt_tokens);
    span.record(
        "gen_ai.usage.output_tokens",
        outcome.usage.completion_tokens,
    );
    let error = match reason {
        TerminationReason::Halted => {
            tracing::warn!(target: TARGET, parent: span, "warden.halt");
            true
        }
        TerminationReason::SafetyLockout => {
            let cause = lockout();
            tracing::warn!(target: TARGET, parent: span, reason = %cause, "warden.safety_lockout");
            true
        }
        TerminationReason::BudgetExceeded => {
            tracing::warn!(target: TARGET, parent: span, "warden.budget_exceeded");
            true
        }
        TerminationReason::LlmError
        | TerminationReason::ParseError
        | TerminationReason::Crashed => true,
        TerminationReason::LimitStopped => {
            tracing::warn!(target: TARGET, parent: span, "warden.limit_stopped");
            true
        }
        TerminationReason::Answered
        | TerminationReason::TerminalTool
        | TerminationReason::DangerousTool
        | TerminationReason::SingleAction
        | TerminationReason::CriticalTokens
        | TerminationReason::MaxIterations => false,
    };
    if error {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", reason.as_str());
        let description = outcome.error.as_deref().unwrap_or(reason.as_str());
        span.record("otel.status_description", description);
    }
}

/// The `chat {model}` span of one model call (a child of the current span: the turn's).
pub(crate) fn chat(provider: &str, model: &str, request: &LlmRequest) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider.split(':').next().unwrap_or(provider),
        gen_ai.request.model = model,
        gen_ai.agent.name = %request.agent,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        warden.usage.estimated = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        error.type = Empty,
    );
    if capture_content() && !span.is_disabled() {
        let input = capped(&messages_json(&request.messages));
        span.record("gen_ai.input.messages", input.as_str());
    }
    span
}

/// Records a model call's result on its `chat` span. `None`: a halt dropped the call (a span event
/// with error status).
pub(crate) fn chat_ended(span: &Span, result: Option<&Result<LlmResponse, ProviderError>>) {
    if span.is_disabled() {
        return;
    }
    match result {
        None => {
            tracing::warn!(target: TARGET, parent: span, "warden.halt");
            error(span, "halted", "halted during the model call");
        }
        Some(Ok(response)) => {
            span.record("gen_ai.usage.input_tokens", response.usage.prompt_tokens);
            span.record(
                "gen_ai.usage.output_tokens",
                response.usage.completion_tokens,
            );
            if response.usage.estimated {
                span.record("warden.usage.estimated", true);
            }
            span.record(
                "gen_ai.response.finish_reasons",
                format!("[\"{}\"]", finish_reason(response.finish_reason)).as_str(),
            );
            if capture_content() {
                span.record(
                    "gen_ai.output.messages",
                    capped(&messages_json(std::slice::from_ref(&response.message))).as_str(),
                );
            }
        }
        Some(Err(failure)) => {
            let kind = match failure.last_attempt() {
                ProviderError::Timeout { .. } => "timeout",
                ProviderError::Connection { .. } => "connection",
                ProviderError::Http { .. } => "http",
                ProviderError::Malformed { .. } => "malformed",
                _ => "_OTHER",
            };
            error(span, kind, &failure.to_string());
        }
    }
}

/// The `execute_tool {tool}` span of one tool call (a child of the current span: the turn's).
pub(crate) fn execute_tool(tool: &str, call_id: &str, arguments: &str) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format_args!("execute_tool {tool}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = tool,
        gen_ai.tool.call.id = call_id,
        gen_ai.tool.type = "function",
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        warden.tool.cached = Empty,
        error.type = Empty,
    );
    if capture_content() && !span.is_disabled() {
        span.record("gen_ai.tool.call.arguments", capped(arguments).as_str());
    }
    span
}

/// Records a tool call's result on its `execute_tool` span: a refused or failed call gives error
/// status, and so does `None` (a halt stopped it), which is also a span event.
pub(crate) fn tool_ended(span: &Span, run: Option<&ToolRun>) {
    if span.is_disabled() {
        return;
    }
    let Some(run) = run else {
        tracing::warn!(target: TARGET, parent: span, "warden.halt");
        error(span, "halted", "halted before or during the tool call");
        return;
    };
    if run.cached {
        span.record("warden.tool.cached", true);
    }
    match &run.result {
        Ok(_) if capture_content() => {
            span.record("gen_ai.tool.call.result", capped(&run.content()).as_str());
        }
        Ok(_) => {}
        Err(failure) => error(span, "tool_error", &failure.to_string()),
    }
}

/// A refusal (a delegation the supervisor refused, …) as an event on the current span, with error
/// status.
pub(crate) fn refused(what: &'static str, cause: &dyn std::fmt::Display) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    tracing::warn!(target: TARGET, reason = %cause, "{what}");
    error(&span, what, &cause.to_string());
}

fn error(span: &Span, kind: &str, description: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", kind);
    span.record("otel.status_description", description);
}

fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool_call",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Other => "other",
    }
}

/// Messages in the GenAI conventions' JSON shape: `[{"role", "parts": [{"type", …}]}]`.
fn messages_json(messages: &[ChatMessage]) -> String {
    let list: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| {
            let role = match m.role {
                ChatRole::System => "system",
                ChatRole::User => "user",
                ChatRole::Assistant => "assistant",
                ChatRole::Tool => "tool",
            };
            let mut parts = Vec::new();
            match (&m.tool_call_id, &m.content) {
                (Some(id), content) => parts.push(serde_json::json!({
                    "type": "tool_call_response",
                    "id": id,
                    "response": content.as_deref().unwrap_or_default(),
                })),
                (None, Some(text)) => {
                    parts.push(serde_json::json!({"type": "text", "content": text}))
                }
                (None, None) => {}
            }
            for call in &m.tool_calls {
                parts.push(serde_json::json!({
                    "type": "tool_call",
                    "id": call.id,
                    "name": call.function.name,
                    "arguments": call.function.arguments,
                }));
            }
            serde_json::json!({"role": role, "parts": parts})
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// `text` cut to at most [`CONTENT_CAP`] bytes, on a char boundary.
fn capped(text: &str) -> String {
    if text.len() <= CONTENT_CAP {
        return text.to_owned();
    }
    let mut end = CONTENT_CAP - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_cuts_on_a_char_boundary() {
        let long = "é".repeat(CONTENT_CAP);
        let cut = capped(&long);
        assert!(cut.len() <= CONTENT_CAP);
        assert!(cut.ends_with('…'));
        assert_eq!(capped("short"), "short");
    }

    #[test]
    fn messages_follow_the_gen_ai_shape() {
        let json = messages_json(&[ChatMessage::user("hi")]);
        assert_eq!(
            json,
            r#"[{"parts":[{"content":"hi","type":"text"}],"role":"user"}]"#
        );
    }
}
