//! Server-sent events of a streamed chat completion: splitting bytes into lines (a network chunk
//! may end anywhere, even inside a UTF-8 character) and folding `data:` chunks into a [`Draft`].
//!
//! Each `data:` line is one event (OpenAI-compatible servers send one JSON object per line);
//! comments and `event:`/`id:`/`retry:` fields are ignored; `data: [DONE]` ends the stream.

use super::wire::{arguments_text, server_error_message, Draft, WireUsage};
use super::StreamEvent;
use crate::provider::ProviderError;
use serde::Deserialize;
use serde_json::Value;

/// Splits a byte stream into lines (`\n` or `\r\n`), keeping incomplete tails for the next chunk.
#[derive(Debug, Default)]
pub(super) struct LineDecoder {
    buf: Vec<u8>,
}

impl LineDecoder {
    /// Appends `chunk` and returns the lines it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(chunk);
        let mut lines = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            lines.push(Self::decode(&self.buf[start..start + pos]));
            start += pos + 1;
        }
        self.buf.drain(..start);
        lines
    }

    /// The last line if the stream ended without a final newline.
    pub fn finish(&mut self) -> Option<String> {
        if self.buf.is_empty() {
            return None;
        }
        let line = Self::decode(&self.buf);
        self.buf.clear();
        Some(line)
    }

    fn decode(line: &[u8]) -> String {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        String::from_utf8_lossy(line).into_owned()
    }
}

/// What one SSE line means.
#[derive(Debug, PartialEq)]
pub(super) enum SseLine<'a> {
    Data(&'a str),
    Done,
    Ignore,
}

pub(super) fn classify(line: &str) -> SseLine<'_> {
    let Some(data) = line.strip_prefix("data:") else {
        return SseLine::Ignore;
    };
    let data = data.strip_prefix(' ').unwrap_or(data).trim_end();
    if data == "[DONE]" {
        SseLine::Done
    } else if data.is_empty() {
        SseLine::Ignore
    } else {
        SseLine::Data(data)
    }
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    delta: Option<ChunkDelta>,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkDelta {
    content: Option<String>,
    tool_calls: Option<Vec<ToolCallChunk>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallChunk {
    index: Option<u32>,
    id: Option<String>,
    function: Option<FunctionChunk>,
}

#[derive(Debug, Deserialize)]
struct FunctionChunk {
    name: Option<String>,
    arguments: Option<Value>,
}

/// Folds one `data:` payload into `draft`, returning the events it produced.
pub(super) fn apply_chunk(
    draft: &mut Draft,
    data: &str,
) -> Result<Vec<StreamEvent>, ProviderError> {
    let chunk: Chunk = serde_json::from_str(data).map_err(|e| ProviderError::Malformed {
        message: format!("stream chunk is not valid json: {e}"),
    })?;
    if let Some(error) = &chunk.error {
        return Err(ProviderError::Other {
            message: format!(
                "server reported an error mid-stream: {}",
                server_error_message(error)
            ),
        });
    }
    if chunk.usage.is_some() {
        draft.usage = chunk.usage;
    }
    let mut events = Vec::new();
    let Some(choice) = chunk.choices.into_iter().next() else {
        return Ok(events);
    };
    if let Some(reason) = choice.finish_reason {
        draft.finish_reason = Some(reason);
    }
    let Some(delta) = choice.delta else {
        return Ok(events);
    };
    if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
        draft.content.push_str(&text);
        events.push(StreamEvent::Delta(text));
    }
    for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
        let index = call
            .index
            .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX));
        let (name, arguments) = match call.function {
            Some(f) => (f.name, arguments_text(f.arguments)),
            None => (None, String::new()),
        };
        let partial = draft.tool_calls.entry(index).or_default();
        if let Some(id) = call.id.as_ref().filter(|id| !id.is_empty()) {
            partial.id = Some(id.clone());
        }
        if let Some(name) = name.as_ref().filter(|n| !n.is_empty()) {
            partial.name = Some(name.clone());
        }
        partial.arguments.push_str(&arguments);
        events.push(StreamEvent::ToolCallDelta {
            index,
            id: call.id,
            name,
            arguments,
        });
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_survive_any_split_point() {
        let text = "data: {\"a\":\"é\"}\r\n\r\n: comment\ndata: [DONE]\n";
        let bytes = text.as_bytes();
        for split in 0..=bytes.len() {
            let mut decoder = LineDecoder::default();
            let mut lines = decoder.push(&bytes[..split]);
            lines.extend(decoder.push(&bytes[split..]));
            assert_eq!(decoder.finish(), None);
            assert_eq!(
                lines,
                vec!["data: {\"a\":\"é\"}", "", ": comment", "data: [DONE]"],
                "split at {split}"
            );
        }
    }

    #[test]
    fn unterminated_last_line_is_kept() {
        let mut decoder = LineDecoder::default();
        assert!(decoder.push(b"data: x").is_empty());
        assert_eq!(decoder.finish().as_deref(), Some("data: x"));
    }

    #[test]
    fn classify_lines() {
        assert_eq!(classify("data: [DONE]"), SseLine::Done);
        assert_eq!(classify("data:[DONE]"), SseLine::Done);
        assert_eq!(classify("data: {}"), SseLine::Data("{}"));
        assert_eq!(classify("event: message"), SseLine::Ignore);
        assert_eq!(classify(": keep-alive"), SseLine::Ignore);
        assert_eq!(classify(""), SseLine::Ignore);
    }

    #[test]
    fn tool_call_arguments_are_concatenated_by_index() {
        let mut draft = Draft::default();
        let chunks = [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"look","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"say","arguments":"{\"t\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"d\":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"hi\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#,
        ];
        for c in chunks {
            apply_chunk(&mut draft, c).unwrap();
        }
        assert_eq!(draft.tool_calls[&0].arguments, r#"{"d":1}"#);
        assert_eq!(draft.tool_calls[&1].arguments, r#"{"t":"hi"}"#);
        assert_eq!(draft.tool_calls[&1].name.as_deref(), Some("say"));
        assert_eq!(draft.finish_reason.as_deref(), Some("tool_calls"));
        assert!(draft.usage.is_some());
    }

    #[test]
    fn bad_chunk_is_malformed() {
        let mut draft = Draft::default();
        assert!(matches!(
            apply_chunk(&mut draft, "{not json"),
            Err(ProviderError::Malformed { .. })
        ));
    }
}
