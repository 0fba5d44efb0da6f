//! Entry points for `fuzz/` (feature `fuzzing` only): the stream decoder, the chunk and response
//! parsers and the JSON-fallback tool-call extraction, which are otherwise private.

use super::sse::{self, EventDecoder, SseData};
use super::wire::{self, Draft};
use super::ToolFormat;

/// What a stream amounted to, in a form that does not depend on how its bytes were split.
/// Generated call ids are random, so the finished response is summarised without them.
#[derive(Debug, PartialEq)]
pub struct StreamSummary {
    /// Each dispatched event as `(type, data)`.
    pub events: Vec<(String, String)>,
    /// The [`super::StreamEvent`]s the chunks produced, rendered with `Debug`.
    pub stream_events: Vec<String>,
    /// The error that ended the stream early, if any, rendered with `Debug`.
    pub error: Option<String>,
    /// `[DONE]` was seen.
    pub done: bool,
    /// The decoder discarded an unfinished event at the end.
    pub discarded: bool,
    /// The draft before interpretation, rendered with `Debug`.
    pub draft: String,
}

/// Feeds `chunks` to the stream decoder one after the other, exactly as the provider reads a body:
/// each event's data is classified and folded into a draft until `[DONE]` or an error; then the
/// draft is finished in both tool formats (for panics; the result is not compared).
pub fn sse_stream<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> StreamSummary {
    let mut decoder = EventDecoder::default();
    let mut draft = Draft::default();
    let mut summary = StreamSummary {
        events: Vec::new(),
        stream_events: Vec::new(),
        error: None,
        done: false,
        discarded: false,
        draft: String::new(),
    };
    'chunks: for chunk in chunks {
        for event in decoder.push(chunk) {
            summary
                .events
                .push((event.event.clone(), event.data.clone()));
            match sse::classify(&event.data) {
                SseData::Empty => {}
                SseData::Done => {
                    summary.done = true;
                    break 'chunks;
                }
                SseData::Chunk(data) => match sse::apply_chunk(&mut draft, data) {
                    Ok(events) => summary
                        .stream_events
                        .extend(events.iter().map(|e| format!("{e:?}"))),
                    Err(error) => {
                        summary.error = Some(format!("{error:?}"));
                        break 'chunks;
                    }
                },
            }
        }
    }
    if !summary.done && summary.error.is_none() {
        summary.discarded = decoder.finish();
    }
    summary.draft = format!("{draft:?}");
    finish_both(draft);
    summary
}

/// Folds each of `chunks` (one SSE event's data each) into a draft, then finishes it.
pub fn stream_chunks<'a>(chunks: impl IntoIterator<Item = &'a str>) {
    let mut draft = Draft::default();
    for data in chunks {
        if sse::apply_chunk(&mut draft, data).is_err() {
            break;
        }
    }
    finish_both(draft);
}

/// Parses a non-streamed `/chat/completions` body and finishes it in both tool formats.
pub fn completion(body: &[u8]) {
    if let Ok(draft) = wire::parse_completion(body) {
        let fallback = Draft {
            content: draft.content.clone(),
            finish_reason: draft.finish_reason.clone(),
            usage: draft.usage,
            ..Draft::default()
        };
        let _ = draft.finish(ToolFormat::Native, body.len());
        let _ = fallback.finish(ToolFormat::JsonFallback, body.len());
    }
}

/// A tool call found in a model's plain text: `(name, arguments, the text around it)`.
pub fn fallback_call(text: &str) -> Option<(String, String, String)> {
    wire::parse_fallback_call(text)
        .map(|(call, rest)| (call.function.name, call.function.arguments, rest))
}

/// Finishes a text-only response in fallback mode, as the provider does for a model without native
/// tool calls; returns the tool calls it found as `(name, arguments)` and the remaining content.
pub fn fallback_response(text: &str) -> (Vec<(String, String)>, Option<String>) {
    let draft = Draft {
        content: text.to_owned(),
        ..Draft::default()
    };
    match draft.finish(ToolFormat::JsonFallback, 0) {
        Ok(response) => (
            response
                .message
                .tool_calls
                .into_iter()
                .map(|c| (c.function.name, c.function.arguments))
                .collect(),
            response.message.content,
        ),
        Err(_) => (Vec::new(), None),
    }
}

fn finish_both(draft: Draft) {
    let copy = Draft {
        content: draft.content.clone(),
        tool_calls: draft
            .tool_calls
            .iter()
            .map(|(i, c)| {
                (
                    *i,
                    wire::PartialCall {
                        id: c.id.clone(),
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                )
            })
            .collect(),
        finish_reason: draft.finish_reason.clone(),
        usage: draft.usage,
    };
    let _ = draft.finish(ToolFormat::Native, 0);
    let _ = copy.finish(ToolFormat::JsonFallback, 0);
}
