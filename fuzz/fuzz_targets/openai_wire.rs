//! OpenAI response parsing (non-streamed bodies) and stream-chunk parsing.
//!
//! Input: the first byte picks the parser; the rest is a response body, or stream chunks (one SSE
//! event's data each) separated by newlines.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_actors::fuzzing::{completion, stream_chunks};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which & 1 == 0 {
        completion(rest);
    } else if let Ok(text) = std::str::from_utf8(rest) {
        stream_chunks(text.split('\n'));
    }
});
