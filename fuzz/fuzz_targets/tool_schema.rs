//! Tool-argument parsing and schema validation: an arbitrary schema and arbitrary arguments.
//!
//! Input: schema JSON, a 0xFF byte, then the argument text (the model's). Without a separator the
//! whole input is the argument text and is checked against itself as a schema too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_actors::tools::{parse_arguments, validate};

fuzz_target!(|data: &[u8]| {
    let (schema, args) = match data.iter().position(|&b| b == 0xFF) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, data),
    };
    let Ok(args) = std::str::from_utf8(args) else {
        return;
    };
    let Ok(args) = parse_arguments(args) else {
        return;
    };
    let schema: serde_json::Value = match serde_json::from_slice(schema) {
        Ok(schema) => schema,
        Err(_) => return,
    };
    if let Err(errors) = validate(&schema, &args) {
        assert!(!errors.violations.is_empty());
        let _ = errors.to_string();
    }
});
