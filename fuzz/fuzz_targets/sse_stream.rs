//! The OpenAI provider's SSE stream: decoder, `[DONE]`/keep-alive classification, chunk folding.
//!
//! Input: the first byte is a seed for split points, the rest is the body. The body is fed once
//! whole and once cut into pieces; the outcome must be the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_actors::fuzzing::sse_stream;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let whole = sse_stream([body]);

    // Split points from the seed: a small xorshift walk, so every seed gives a different cut.
    let mut cuts = Vec::new();
    let mut state = u32::from(seed) | 0x100;
    let mut at = 0usize;
    while at < body.len() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        // Steps of 0..=7 bytes (0 gives an empty chunk, which must be harmless too).
        at = (at + (state % 8) as usize).min(body.len());
        cuts.push(at);
    }
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for cut in cuts {
        pieces.push(&body[from..cut]);
        from = cut;
    }
    pieces.push(&body[from..]);
    let split = sse_stream(pieces.iter().copied());
    assert_eq!(whole, split, "splitting the body changed the outcome");

    // Byte by byte, the hardest split.
    if body.len() <= 4096 {
        let bytes = sse_stream(body.chunks(1));
        assert_eq!(whole, bytes, "feeding byte by byte changed the outcome");
    }
});
