//! Tool-call fingerprints: the tool name plus its canonicalised arguments, hashed.
//!
//! # Invariants
//! * Object keys are sorted recursively, so the order in which the model wrote them never matters.
//! * String values longer than `fingerprint_value_chars` characters (not bytes) are cut to that many,
//!   so two calls that differ only far into a long string look the same — a deliberate bound.
//! * Arguments that are not valid JSON are fingerprinted by their raw text (trimmed and cut the same
//!   way), so repeated malformed calls are still recognised as repeats.
//! * The hash is FNV-1a 64 over the canonical text: stable across processes and Rust versions.

use serde_json::Value;
use std::fmt;

/// A stable identity of one tool call (name + canonical arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub u64);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Fingerprint {
    /// The fingerprint of `tool` called with the JSON text `arguments` (as the model produced it).
    pub fn of(tool: &str, arguments: &str, max_value_chars: usize) -> Self {
        Fingerprint(fnv1a(
            canonical_call(tool, arguments, max_value_chars).as_bytes(),
        ))
    }

    /// The fingerprint of `tool` called with already-parsed `arguments`.
    pub fn of_value(tool: &str, arguments: &Value, max_value_chars: usize) -> Self {
        let mut text = String::with_capacity(tool.len() + 32);
        text.push_str(tool);
        text.push('\u{0}');
        write_canonical(&mut text, arguments, max_value_chars);
        Fingerprint(fnv1a(text.as_bytes()))
    }
}

/// The canonical text of a call: `tool`, a NUL, then the arguments as compact JSON with sorted keys
/// and cut strings (or, for invalid JSON, `!` and the cut raw text). Empty arguments mean `{}`.
pub fn canonical_call(tool: &str, arguments: &str, max_value_chars: usize) -> String {
    let mut text = String::with_capacity(tool.len() + arguments.len() + 2);
    text.push_str(tool);
    text.push('\u{0}');
    let raw = arguments.trim();
    let raw = if raw.is_empty() { "{}" } else { raw };
    match serde_json::from_str::<Value>(raw) {
        Ok(value) => write_canonical(&mut text, &value, max_value_chars),
        Err(_) => {
            text.push('!');
            text.push_str(cut(raw, max_value_chars));
        }
    }
    text
}

fn cut(s: &str, max_chars: usize) -> &str {
    match s.char_indices().nth(max_chars) {
        Some((byte, _)) => &s[..byte],
        None => s,
    }
}

fn write_json_string(out: &mut String, s: &str) {
    // serde_json's string encoding of a &str cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// `value` as compact JSON with every object's keys sorted (recursively) and strings cut at
/// `max_chars` characters (`usize::MAX`: not cut). Shared by fingerprints and the tool-result cache.
pub(crate) fn canonical_json_cut(value: &Value, max_chars: usize) -> String {
    let mut out = String::new();
    write_canonical(&mut out, value, max_chars);
    out
}

fn write_canonical(out: &mut String, value: &Value, max_chars: usize) {
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => out.push_str(&value.to_string()),
        Value::String(s) => write_json_string(out, cut(s, max_chars)),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item, max_chars);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(out, key);
                out.push(':');
                write_canonical(out, item, max_chars);
            }
            out.push('}');
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter_but_values_and_names_do() {
        let a = Fingerprint::of(
            "read",
            r#"{"path":"/a","opts":{"x":1,"y":[1,{"b":2,"a":1}]}}"#,
            200,
        );
        let b = Fingerprint::of(
            "read",
            r#"{ "opts": {"y":[1,{"a":1,"b":2}],"x":1}, "path": "/a" }"#,
            200,
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            Fingerprint::of(
                "read",
                r#"{"path":"/b","opts":{"x":1,"y":[1,{"b":2,"a":1}]}}"#,
                200
            )
        );
        assert_ne!(
            a,
            Fingerprint::of(
                "write",
                r#"{"path":"/a","opts":{"x":1,"y":[1,{"b":2,"a":1}]}}"#,
                200
            )
        );
        assert_eq!(
            canonical_call("read", r#"{"b":1,"a":"x"}"#, 200),
            "read\u{0}{\"a\":\"x\",\"b\":1}"
        );
    }

    #[test]
    fn the_text_form_and_the_value_form_agree() {
        let v = json!({"z": "é".repeat(300), "a": [true, null, 1.5]});
        assert_eq!(
            Fingerprint::of("t", &v.to_string(), 200),
            Fingerprint::of_value("t", &v, 200)
        );
    }

    #[test]
    fn long_strings_are_cut_at_the_configured_chars() {
        let long_a = format!("{}A", "é".repeat(200));
        let long_b = format!("{}B", "é".repeat(200));
        let a = Fingerprint::of_value("t", &json!({"s": long_a}), 200);
        let b = Fingerprint::of_value("t", &json!({"s": long_b}), 200);
        assert_eq!(a, b, "differences past 200 chars are ignored");
        let a = Fingerprint::of_value("t", &json!({"s": long_a}), 201);
        let b = Fingerprint::of_value("t", &json!({"s": long_b}), 201);
        assert_ne!(a, b);
    }

    #[test]
    fn invalid_json_and_empty_arguments_are_fingerprinted() {
        assert_eq!(
            Fingerprint::of("t", "", 200),
            Fingerprint::of("t", " {} ", 200)
        );
        assert_eq!(
            Fingerprint::of("t", "{oops", 200),
            Fingerprint::of("t", " {oops ", 200)
        );
        assert_ne!(
            Fingerprint::of("t", "{oops", 200),
            Fingerprint::of("t", "{oops!", 200)
        );
        assert_eq!(canonical_call("t", "{oops", 200), "t\u{0}!{oops");
    }

    #[test]
    fn the_hash_is_stable() {
        assert_eq!(Fingerprint(fnv1a(b"")).to_string(), "cbf29ce484222325");
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[a-z0-9 ]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec(("[a-e]{1,3}", inner), 0..6)
                    .prop_map(|entries| { Value::Object(entries.into_iter().collect()) }),
            ]
        })
    }

    /// Writes `value` as JSON with every object's keys in an order given by `seed`.
    fn write_permuted(value: &Value, seed: &mut u64, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                // Fisher–Yates driven by a xorshift seed.
                for i in (1..entries.len()).rev() {
                    *seed ^= *seed << 13;
                    *seed ^= *seed >> 7;
                    *seed ^= *seed << 17;
                    let j = (*seed % (i as u64 + 1)) as usize;
                    entries.swap(i, j);
                }
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push(':');
                    write_permuted(v, seed, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_permuted(v, seed, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }

    proptest! {
        #[test]
        fn permuting_object_keys_never_changes_the_fingerprint(
            args in arb_json(),
            seed in 1u64..u64::MAX,
            max in 1usize..20,
        ) {
            let mut seed = seed;
            let mut permuted = String::new();
            write_permuted(&args, &mut seed, &mut permuted);
            let plain = args.to_string();
            prop_assert_eq!(
                Fingerprint::of("tool", &plain, max),
                Fingerprint::of("tool", &permuted, max)
            );
            prop_assert_eq!(
                Fingerprint::of("tool", &permuted, max),
                Fingerprint::of_value("tool", &args, max)
            );
        }
    }
}
