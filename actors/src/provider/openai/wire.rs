//! Chat Completions JSON: building request bodies, reading responses, the JSON fallback tool format.
//!
//! The conversation warden keeps is always in native Chat Completions form; the fallback form
//! exists only in the bytes sent to (and received from) a model without native tool calling.

use super::{OpenAiConfig, ToolFormat};
use crate::provider::{LlmRequest, LlmResponse, ProviderError};
use rand::Rng;
use serde::{de::IgnoredAny, Deserialize};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use warden_protocols::{ChatMessage, ChatRole, FinishReason, ToolCall, ToolSpec, Usage};

/// Longest error body kept in a [`ProviderError::Http`].
const MAX_ERROR_BODY_CHARS: usize = 2000;

fn role_name(role: ChatRole) -> &'static str {
    match role {
        ChatRole::System => "system",
        ChatRole::User => "user",
        ChatRole::Assistant => "assistant",
        ChatRole::Tool => "tool",
    }
}

fn tool_call_json(call: &ToolCall) -> Value {
    json!({
        "id": call.id,
        "type": call.kind,
        "function": { "name": call.function.name, "arguments": call.function.arguments },
    })
}

/// A message in native form. Only Chat Completions fields are copied: `internal` never leaves.
fn native_message(message: &ChatMessage) -> Value {
    let mut obj = Map::new();
    obj.insert("role".into(), role_name(message.role).into());
    obj.insert(
        "content".into(),
        message.content.clone().map_or(Value::Null, Value::String),
    );
    if !message.tool_calls.is_empty() {
        obj.insert(
            "tool_calls".into(),
            message.tool_calls.iter().map(tool_call_json).collect(),
        );
    }
    if let Some(id) = &message.tool_call_id {
        obj.insert("tool_call_id".into(), id.clone().into());
    }
    Value::Object(obj)
}

/// The fallback text of one tool call: `{"tool": name, "parameters": {...}}`.
pub(super) fn fallback_call_text(call: &ToolCall) -> String {
    let parameters = serde_json::from_str::<Value>(&call.function.arguments)
        .unwrap_or_else(|_| Value::String(call.function.arguments.clone()));
    json!({ "tool": call.function.name, "parameters": parameters }).to_string()
}

/// The system message that describes the tools in fallback mode.
pub(super) fn fallback_tools_prompt(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "You can use tools. To call a tool, reply with a single JSON object and nothing else, \
         in exactly this form:\n{\"tool\": \"<tool name>\", \"parameters\": {<arguments>}}\n\
         Call at most one tool per reply. The result will come back in a user message starting \
         with [TOOL RESULT: <tool name>]. To answer without a tool, reply in plain text.\n\n\
         Available tools:",
    );
    for tool in tools {
        text.push_str(&format!(
            "\n- {}: {}\n  parameters (JSON schema): {}",
            tool.name, tool.description, tool.parameters
        ));
    }
    text
}

/// The messages as sent in fallback mode: tool results become `[TOOL RESULT: name]` user messages,
/// assistant tool calls become their JSON text, and the tools are described in a system message
/// placed after the leading system prompt.
fn fallback_messages(request: &LlmRequest) -> Vec<Value> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut out = Vec::with_capacity(request.messages.len() + 1);
    for message in &request.messages {
        match message.role {
            ChatRole::Assistant if !message.tool_calls.is_empty() => {
                let mut parts: Vec<String> = Vec::new();
                if let Some(text) = message.content.as_deref().filter(|t| !t.trim().is_empty()) {
                    parts.push(text.to_owned());
                }
                for call in &message.tool_calls {
                    names.insert(&call.id, &call.function.name);
                    parts.push(fallback_call_text(call));
                }
                out.push(json!({ "role": "assistant", "content": parts.join("\n") }));
            }
            ChatRole::Tool => {
                let name = message
                    .tool_call_id
                    .as_deref()
                    .and_then(|id| names.get(id).copied())
                    .or(message.tool_call_id.as_deref())
                    .unwrap_or("unknown");
                let content = message.content.as_deref().unwrap_or("");
                out.push(json!({
                    "role": "user",
                    "content": format!("[TOOL RESULT: {name}]\n{content}"),
                }));
            }
            role => out.push(json!({
                "role": role_name(role),
                "content": message.content.clone().unwrap_or_default(),
            })),
        }
    }
    if !request.tools.is_empty() {
        let at = usize::from(
            request
                .messages
                .first()
                .is_some_and(|m| m.role == ChatRole::System),
        );
        out.insert(
            at,
            json!({ "role": "system", "content": fallback_tools_prompt(&request.tools) }),
        );
    }
    out
}

/// The JSON body of a `/chat/completions` request.
pub(super) fn request_body(config: &OpenAiConfig, request: &LlmRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), config.model.clone().into());
    match config.tool_format {
        ToolFormat::Native => {
            body.insert(
                "messages".into(),
                request.messages.iter().map(native_message).collect(),
            );
            if !request.tools.is_empty() {
                let tools: Vec<Value> = request
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "function",
                            "function": {
                                "name": t.name,
                                "description": t.description,
                                "parameters": t.parameters,
                            },
                        })
                    })
                    .collect();
                body.insert("tools".into(), tools.into());
            }
        }
        ToolFormat::JsonFallback => {
            body.insert("messages".into(), fallback_messages(request).into());
        }
    }
    if let Some(max_tokens) = config.max_tokens {
        body.insert("max_tokens".into(), max_tokens.into());
    }
    if let Some(temperature) = config.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if stream {
        body.insert("stream".into(), true.into());
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    Value::Object(body)
}

/// Characters of the prompt, for estimating usage when the server sends none.
pub(super) fn prompt_chars(request: &LlmRequest) -> usize {
    request
        .messages
        .iter()
        .map(|m| {
            m.content.as_deref().map_or(0, |c| c.chars().count())
                + m.tool_calls
                    .iter()
                    .map(|c| c.function.arguments.chars().count() + c.function.name.len())
                    .sum::<usize>()
        })
        .sum()
}

/// Truncates an error body for [`ProviderError::Http`].
pub(super) fn truncate_body(body: &str) -> String {
    match body.char_indices().nth(MAX_ERROR_BODY_CHARS) {
        Some((at, _)) => format!("{}…", &body[..at]),
        None => body.to_owned(),
    }
}

pub(super) fn new_call_id() -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("call_{n:016x}")
}

/// `usage` as servers send it; any field may be missing.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(super) struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// What a response (whole or streamed) amounts to before interpretation.
#[derive(Debug, Default)]
pub(super) struct Draft {
    pub content: String,
    /// By index, in order.
    pub tool_calls: BTreeMap<u32, PartialCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<WireUsage>,
}

#[derive(Debug, Default)]
pub(super) struct PartialCall {
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

fn map_finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" | "eos" | "end_turn" => FinishReason::Stop,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        "length" | "max_tokens" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

fn estimate_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

impl Draft {
    /// Interprets the draft: tool calls (native, or parsed from the text in fallback mode), the
    /// finish reason (inferred when the server sent none), and usage (estimated when missing).
    pub(super) fn finish(
        self,
        format: ToolFormat,
        prompt_chars: usize,
    ) -> Result<LlmResponse, ProviderError> {
        let mut calls = Vec::with_capacity(self.tool_calls.len());
        for (index, partial) in self.tool_calls {
            let name =
                partial
                    .name
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| ProviderError::Malformed {
                        message: format!("tool call {index} has no function name"),
                    })?;
            let id = partial
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(new_call_id);
            let mut call = ToolCall::new(id, name, &Value::Null);
            call.function.arguments = if partial.arguments.trim().is_empty() {
                "{}".to_owned()
            } else {
                partial.arguments
            };
            calls.push(call);
        }
        let mut content = Some(self.content);
        if calls.is_empty() && format == ToolFormat::JsonFallback {
            if let Some((call, rest)) = content.as_deref().and_then(parse_fallback_call) {
                calls.push(call);
                content = Some(rest);
            }
        }
        if !calls.is_empty() {
            content = content.filter(|c| !c.trim().is_empty());
        }
        let completion_chars = content.as_deref().map_or(0, |c| c.chars().count())
            + calls
                .iter()
                .map(|c| c.function.arguments.chars().count() + c.function.name.len())
                .sum::<usize>();
        // Nothing at all (no text, no tool call) is no answer: an error, so the agent tells the model
        // and the consecutive-error breaker counts it, instead of delivering "" as the answer. A
        // reply cut by the token limit is not this case (the agent asks the model to go on).
        if calls.is_empty()
            && content.as_deref().is_none_or(|c| c.trim().is_empty())
            && self.finish_reason.as_deref() != Some("length")
        {
            return Err(ProviderError::Malformed {
                message: format!(
                    "the model answered nothing (no text, no tool call; finish_reason {})",
                    self.finish_reason.as_deref().unwrap_or("absent")
                ),
            });
        }
        let finish_reason = match self.finish_reason.as_deref().map(map_finish_reason) {
            // A server that says "stop" while calling tools (some local servers do) still called them.
            Some(FinishReason::Stop) | None if !calls.is_empty() => FinishReason::ToolCalls,
            Some(reason) => reason,
            None => FinishReason::Stop,
        };
        let usage = match self.usage {
            Some(WireUsage {
                prompt_tokens: Some(prompt_tokens),
                completion_tokens: Some(completion_tokens),
            }) => Usage {
                prompt_tokens,
                completion_tokens,
                estimated: false,
            },
            _ => Usage {
                prompt_tokens: estimate_tokens(prompt_chars),
                completion_tokens: estimate_tokens(completion_chars),
                estimated: true,
            },
        };
        let message = if calls.is_empty() {
            ChatMessage::assistant(content.unwrap_or_default())
        } else {
            ChatMessage::assistant_tool_calls(content, calls)
        };
        Ok(LlmResponse {
            message,
            finish_reason,
            usage,
        })
    }
}

/// How much parsing [`parse_fallback_call`] may spend on attempts that find no call, in bytes read:
/// this many times the text's length, plus [`FALLBACK_SCAN_SLACK`]. Each `{` starts an attempt that
/// reads until its value ends or fails, so text built of many unclosed `{"a":{"a":…` makes every
/// attempt read to the end — quadratic time (fuzzing measured 41 ms for 154 KB, growing as n^1.7).
/// With the budget the work is linear in the text; ordinary replies (prose, code with braces, one
/// call) spend a small fraction of it. Past it the text is taken as an answer with no call.
const FALLBACK_SCAN_FACTOR: usize = 8;
/// See [`FALLBACK_SCAN_FACTOR`].
const FALLBACK_SCAN_SLACK: usize = 64 * 1024;

/// Finds a fallback tool call `{"tool": name, "parameters": {...}}` in the model's text: the whole
/// text, inside a ```json fence, or after leading prose. Returns the call and the text around it.
/// Work is bounded by [`FALLBACK_SCAN_FACTOR`] (linear in the text).
pub(super) fn parse_fallback_call(text: &str) -> Option<(ToolCall, String)> {
    let mut budget = text
        .len()
        .saturating_mul(FALLBACK_SCAN_FACTOR)
        .saturating_add(FALLBACK_SCAN_SLACK);
    for (start, _) in text.match_indices('{') {
        let rest = &text[start..];
        // Find the value's extent without building it (most attempts fail or are not calls).
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<IgnoredAny>();
        let (read, complete) = match values.next() {
            Some(Err(error)) => (bytes_read_until(rest, &error), false),
            next => (values.byte_offset(), next.is_some()),
        };
        budget = budget.checked_sub(read)?;
        if !complete {
            continue;
        }
        let Ok(Value::Object(obj)) = serde_json::from_str(&rest[..read]) else {
            continue;
        };
        let end = start + read;
        let Some(Value::String(name)) = obj.get("tool") else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        let arguments = match obj.get("parameters").or_else(|| obj.get("arguments")) {
            None | Some(Value::Null) => "{}".to_owned(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        let mut call = ToolCall::new(new_call_id(), name.clone(), &Value::Null);
        call.function.arguments = arguments;
        let rest = strip_fence_markers(&text[..start], &text[end..]);
        return Some((call, rest));
    }
    None
}

/// How far into `text` a parse that failed with `error` read: serde_json reports a line and a byte
/// column (both from 1), not an offset.
fn bytes_read_until(text: &str, error: &serde_json::Error) -> usize {
    let line_start = match error.line() {
        0 | 1 => 0,
        line => text
            .match_indices('\n')
            .nth(line - 2)
            .map_or(text.len(), |(at, _)| at + 1),
    };
    line_start.saturating_add(error.column()).min(text.len())
}

/// The prose around a fallback call, without the code fence that held it.
fn strip_fence_markers(before: &str, after: &str) -> String {
    let before = before.trim_end();
    let before = before
        .strip_suffix("```json")
        .or_else(|| before.strip_suffix("```JSON"))
        .or_else(|| before.strip_suffix("```"))
        .unwrap_or(before);
    let after = after.trim_start();
    let after = after.strip_prefix("```").unwrap_or(after);
    let joined = format!("{} {}", before.trim(), after.trim());
    joined.trim().to_owned()
}

/// A non-streaming response body.
#[derive(Debug, Deserialize)]
struct CompletionBody {
    choices: Option<Vec<CompletionChoice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct CompletionChoice {
    message: Option<ResponseMessage>,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ResponseMessage {
    content: Option<Value>,
    tool_calls: Option<Vec<ResponseToolCall>>,
}

#[derive(Debug, Deserialize)]
struct ResponseToolCall {
    id: Option<String>,
    function: Option<ResponseFunction>,
}

#[derive(Debug, Deserialize)]
struct ResponseFunction {
    name: Option<String>,
    arguments: Option<Value>,
}

/// Text content: a string, or an array of `{type: "text", text}` parts.
fn content_text(content: Option<Value>) -> String {
    match content {
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Arguments as JSON text: servers send a string (the standard) or, sometimes, an object.
pub(super) fn arguments_text(arguments: Option<Value>) -> String {
    match arguments {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
    }
}

pub(super) fn server_error_message(error: &Value) -> String {
    error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned)
}

/// Reads a non-streaming response body into a [`Draft`].
pub(super) fn parse_completion(bytes: &[u8]) -> Result<Draft, ProviderError> {
    let body: CompletionBody =
        serde_json::from_slice(bytes).map_err(|e| ProviderError::Malformed {
            message: format!("response body is not a chat completion: {e}"),
        })?;
    if let Some(error) = &body.error {
        return Err(ProviderError::Malformed {
            message: format!(
                "server returned an error object: {}",
                server_error_message(error)
            ),
        });
    }
    let choice = body
        .choices
        .ok_or_else(|| ProviderError::Malformed {
            message: "response has no `choices`".into(),
        })?
        .into_iter()
        .next()
        .ok_or_else(|| ProviderError::Malformed {
            message: "response has an empty `choices` array".into(),
        })?;
    let message = choice.message.ok_or_else(|| ProviderError::Malformed {
        message: "`choices[0]` has no `message`".into(),
    })?;
    let mut draft = Draft {
        content: content_text(message.content),
        finish_reason: choice.finish_reason,
        usage: body.usage,
        ..Draft::default()
    };
    for (index, call) in message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let function = call.function.ok_or_else(|| ProviderError::Malformed {
            message: format!("tool call {index} has no `function`"),
        })?;
        draft.tool_calls.insert(
            u32::try_from(index).unwrap_or(u32::MAX),
            PartialCall {
                id: call.id,
                name: function.name,
                arguments: arguments_text(function.arguments),
            },
        );
    }
    Ok(draft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_call_is_found_plain_fenced_and_after_prose() {
        let texts = [
            r#"{"tool": "look", "parameters": {"dir": "north"}}"#,
            "```json\n{\"tool\": \"look\", \"parameters\": {\"dir\": \"north\"}}\n```",
            "I will look around.\n{\"tool\":\"look\",\"parameters\":{\"dir\":\"north\"}} ",
            "Sure {not json} then {\"tool\": \"look\", \"parameters\": {\"dir\": \"north\"}}",
        ];
        for text in texts {
            let (call, _) = parse_fallback_call(text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(call.function.name, "look");
            let args: Value = serde_json::from_str(&call.function.arguments).unwrap();
            assert_eq!(args, json!({"dir": "north"}));
            assert!(call.id.starts_with("call_"));
        }
        let (_, rest) = parse_fallback_call(texts[2]).unwrap();
        assert_eq!(rest, "I will look around.");
        let (_, rest) = parse_fallback_call(texts[1]).unwrap();
        assert_eq!(rest, "");
    }

    #[test]
    fn plain_text_and_other_json_are_not_calls() {
        assert!(parse_fallback_call("hello there").is_none());
        assert!(parse_fallback_call(r#"{"answer": 42}"#).is_none());
        assert!(parse_fallback_call(r#"{"tool": "x", "parameters": {"#).is_none());
    }

    #[test]
    fn a_failed_parse_is_charged_for_the_bytes_it_read() {
        for text in ["{\"a\": [1, 2", "{\"a\":\n  {\"b\":\n  [1,\n x", "{\n\n"] {
            let error = serde_json::from_str::<Value>(text).expect_err(text);
            let read = bytes_read_until(text, &error);
            assert!(read <= text.len(), "{text:?}: {read}");
            assert!(
                read + 2 >= text.len(),
                "{text:?}: read {read} of {}",
                text.len()
            );
        }
    }

    #[test]
    fn crafted_text_of_unclosed_objects_costs_linear_work_and_finds_no_call() {
        // Each `{` starts a value that runs to the end of the text (finding a value's extent has no
        // depth limit): without the budget the attempts read n²/2 bytes in all. The budget makes the
        // scan give up; the call after the bait is then not looked for (the text is an answer), which
        // is the documented trade. (Release build, this bait repeated to 2.5 MB: 49 ms with the budget;
        // without it 40 KB already took seconds.)
        let bait = "{\"a\":".repeat(5_000);
        let text = format!("{bait} {{\"tool\": \"x\"}}");
        assert!(parse_fallback_call(&text).is_none());
        // A reply with a realistic amount of braces before its call is unaffected.
        let prose = "Use {braces} like {this} in code: fn f() { g() }\n".repeat(200);
        let text = format!("{prose}```json\n{{\"tool\": \"look\", \"parameters\": {{}}}}\n```");
        let (call, _) = parse_fallback_call(&text).expect("the call after ordinary prose");
        assert_eq!(call.function.name, "look");
    }

    #[test]
    fn finish_reason_is_mapped_and_inferred() {
        let d = Draft {
            content: "partial".into(),
            finish_reason: Some("length".into()),
            ..Draft::default()
        };
        let r = d.finish(ToolFormat::Native, 0).unwrap();
        assert_eq!(r.finish_reason, FinishReason::Length);
        let mut d = Draft::default();
        d.tool_calls.insert(
            0,
            PartialCall {
                id: Some("a".into()),
                name: Some("t".into()),
                arguments: String::new(),
            },
        );
        let r = d.finish(ToolFormat::Native, 0).unwrap();
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.message.tool_calls[0].function.arguments, "{}");
        assert_eq!(r.message.content, None);
    }

    #[test]
    fn tool_call_without_name_is_malformed() {
        let mut d = Draft::default();
        d.tool_calls.insert(0, PartialCall::default());
        assert!(matches!(
            d.finish(ToolFormat::Native, 0),
            Err(ProviderError::Malformed { .. })
        ));
    }

    #[test]
    fn truncate_body_is_char_safe() {
        let long = "é".repeat(MAX_ERROR_BODY_CHARS + 5);
        let t = truncate_body(&long);
        assert_eq!(t.chars().count(), MAX_ERROR_BODY_CHARS + 1);
    }
}
