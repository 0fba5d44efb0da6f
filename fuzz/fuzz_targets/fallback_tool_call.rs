//! The JSON-fallback tool-call extraction: `{"tool": …, "parameters": …}` in a model's plain text
//! (models without native tool calls), alone and as the provider finishes a response with it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_actors::fuzzing::{fallback_call, fallback_response};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let found = fallback_call(&text);
    if let Some((name, _, rest)) = &found {
        assert!(!name.is_empty(), "a call without a name was accepted");
        assert!(rest.len() <= text.len(), "the text around the call grew");
    }
    let (calls, _) = fallback_response(&text);
    assert_eq!(calls.len(), usize::from(found.is_some()));
});
