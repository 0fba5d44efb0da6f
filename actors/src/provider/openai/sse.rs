//! Server-sent events of a streamed chat completion: decoding the byte stream into events exactly as
//! the WHATWG HTML standard's "event stream interpretation" says (§9.2.6), and folding each event's
//! data into a [`Draft`].
//!
//! The decoder follows the spec:
//! - Lines end with `\r\n`, `\n` or `\r` (a `\r` at the end of one network chunk and a `\n` at the
//!   start of the next are one line end). A chunk may end anywhere, even inside a UTF-8 character;
//!   bytes are decoded as UTF-8 (invalid sequences become U+FFFD), and a leading BOM is dropped.
//! - A blank line dispatches the event. A line starting with `:` is a comment. Otherwise the field
//!   name is what comes before the first `:` (the whole line if there is none) and the value what
//!   follows it, minus one leading space if there is one (`data:x` and `data: x` are the same).
//! - Every `data` line appends its value and a `\n` to the event's data; at dispatch the last `\n`
//!   is removed, so an event whose data spans several lines is joined with `\n`. An event with no
//!   `data` line is not dispatched. `event` sets the event's type; `id` and `retry` only matter for
//!   reconnecting, which this client never does (a stream is not retried once its headers arrived),
//!   so they are read and dropped; other fields are ignored.
//! - At the end of the stream, an event not yet ended by a blank line is discarded (the spec's
//!   rule: "if the file ends in the middle of an event, before the final empty line, the incomplete
//!   event is not dispatched").
//!
//! Each dispatched event's data is one JSON chunk (whatever the event type); data `[DONE]` ends the
//! stream.

use super::wire::{arguments_text, server_error_message, Draft, WireUsage};
use super::StreamEvent;
use crate::provider::ProviderError;
use serde::Deserialize;
use serde_json::Value;

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SseEvent {
    /// The `event` field, `message` when none was given.
    pub event: String,
    /// The `data` lines, joined with `\n`.
    pub data: String,
}

/// Decodes a byte stream into [`SseEvent`]s, keeping incomplete lines and events for the next chunk.
#[derive(Debug, Default)]
pub(super) struct EventDecoder {
    /// Bytes of the current, unfinished line.
    line: Vec<u8>,
    /// The previous chunk ended with `\r`: a `\n` starting this one belongs to that line end.
    after_cr: bool,
    /// No line has been completed yet (a BOM may start the first one).
    started: bool,
    /// The data buffer of the event being read (each `data` value followed by `\n`).
    data: String,
    /// The event type buffer.
    event: String,
    /// Any field seen since the last dispatch (for [`EventDecoder::finish`]'s report).
    pending: bool,
}

impl EventDecoder {
    /// Appends `chunk` and returns the events it completed.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut rest = chunk;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if let Some(tail) = rest.strip_prefix(b"\n") {
                rest = tail;
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&rest[..pos]);
            let ending = rest[pos];
            rest = &rest[pos + 1..];
            if ending == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.process_line(&line) {
                events.push(event);
            }
        }
        self.line.extend_from_slice(rest);
        events
    }

    /// Ends the stream. Per the spec, an event not ended by a blank line is discarded (and so is an
    /// unterminated last line); returns `true` when something was.
    pub(super) fn finish(&mut self) -> bool {
        let discarded = self.pending || !self.line.is_empty();
        *self = EventDecoder::default();
        discarded
    }

    fn process_line(&mut self, bytes: &[u8]) -> Option<SseEvent> {
        let decoded = String::from_utf8_lossy(bytes);
        let mut line: &str = &decoded;
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        self.pending = true;
        match field {
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "event" => self.event = value.to_owned(),
            // `id` and `retry` set the reconnection state, unused here; other names are ignored.
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        self.pending = false;
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        Some(SseEvent {
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            data,
        })
    }
}

/// What one event's data means.
#[derive(Debug, PartialEq)]
pub(super) enum SseData<'a> {
    /// A JSON chunk.
    Chunk(&'a str),
    /// `[DONE]`: the end of the stream.
    Done,
    /// Nothing but whitespace (some servers send `data:` keep-alives).
    Empty,
}

pub(super) fn classify(data: &str) -> SseData<'_> {
    let trimmed = data.trim();
    if trimmed == "[DONE]" {
        SseData::Done
    } else if trimmed.is_empty() {
        SseData::Empty
    } else {
        SseData::Chunk(data)
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

    fn ev(data: &str) -> SseEvent {
        SseEvent {
            event: "message".into(),
            data: data.into(),
        }
    }

    fn decode_all(text: &str) -> (Vec<SseEvent>, bool) {
        let mut decoder = EventDecoder::default();
        let events = decoder.push(text.as_bytes());
        (events, decoder.finish())
    }

    #[test]
    fn events_survive_any_split_point() {
        let text = "data: {\"a\":\"é\"}\r\n\r\n: comment\r\ndata: [DONE]\r\n\r\n";
        let bytes = text.as_bytes();
        for split in 0..=bytes.len() {
            let mut decoder = EventDecoder::default();
            let mut events = decoder.push(&bytes[..split]);
            events.extend(decoder.push(&bytes[split..]));
            assert!(!decoder.finish(), "split at {split}");
            assert_eq!(
                events,
                vec![ev("{\"a\":\"é\"}"), ev("[DONE]")],
                "split at {split}"
            );
        }
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let text = "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let (events, _) = decode_all(text);
        assert_eq!(
            events,
            vec![ev("{\"choices\":\n[{\"delta\":{\"content\":\"hi\"}}]}")]
        );
        // The joined data is one JSON document.
        let mut draft = Draft::default();
        apply_chunk(&mut draft, &events[0].data).unwrap();
        assert_eq!(draft.content, "hi");
        // Only the last newline is removed; empty data lines keep theirs.
        let (events, _) = decode_all("data: a\ndata:\ndata: b\n\ndata\n\n");
        assert_eq!(events, vec![ev("a\n\nb"), ev("")]);
    }

    #[test]
    fn cr_lf_and_crlf_all_end_lines_even_split_across_chunks() {
        for text in [
            "data: a\r\rdata: b\r\r",
            "data: a\n\ndata: b\n\n",
            "data: a\r\n\r\ndata: b\r\n\r\n",
            "data: a\r\n\rdata: b\n\r\n",
        ] {
            let bytes = text.as_bytes();
            for split in 0..=bytes.len() {
                let mut decoder = EventDecoder::default();
                let mut events = decoder.push(&bytes[..split]);
                events.extend(decoder.push(&bytes[split..]));
                assert_eq!(events, vec![ev("a"), ev("b")], "{text:?} split at {split}");
                assert!(!decoder.finish());
            }
        }
        // Byte by byte, a `\r` then a `\n` in the next chunk is one line end, not two.
        let mut decoder = EventDecoder::default();
        let mut events = Vec::new();
        for b in "data: a\r\ndata: b\r\n\r\n".bytes() {
            events.extend(decoder.push(&[b]));
        }
        assert_eq!(events, vec![ev("a\nb")]);
    }

    #[test]
    fn fields_comments_and_spaces_follow_the_spec() {
        let text = "\u{feff}: a comment\n:another\ndata:no-space\n\n\
                    data:  two spaces\n\n\
                    event: error\ndata: x\nid: 7\nretry: 100\nfoo: bar\n\n\
                    id: 8\n\n\
                    event: ignored-without-data\n\n\
                    data: y\n\n";
        let (events, discarded) = decode_all(text);
        assert_eq!(
            events,
            vec![
                ev("no-space"),
                ev(" two spaces"),
                SseEvent {
                    event: "error".into(),
                    data: "x".into()
                },
                // The type of an event without data does not leak into the next one.
                ev("y"),
            ]
        );
        assert!(!discarded);
        // A line without a colon is a field with an empty value; "data:" alone counts as data.
        let (events, _) = decode_all("data\ndata\n\n");
        assert_eq!(events, vec![ev("\n")]);
    }

    #[test]
    fn an_event_without_its_blank_line_is_discarded_at_the_end() {
        let (events, discarded) = decode_all("data: a\n\ndata: b\n");
        assert_eq!(events, vec![ev("a")]);
        assert!(discarded);
        let (events, discarded) = decode_all("data: a\n\ndata: b");
        assert_eq!(events, vec![ev("a")]);
        assert!(discarded);
        let (_, discarded) = decode_all("data: a\n\n: trailing comment\n");
        assert!(!discarded);
    }

    #[test]
    fn classify_data() {
        assert_eq!(classify("[DONE]"), SseData::Done);
        assert_eq!(classify(" [DONE] "), SseData::Done);
        assert_eq!(classify("{}"), SseData::Chunk("{}"));
        assert_eq!(classify(""), SseData::Empty);
        assert_eq!(classify("\n"), SseData::Empty);
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
