//! Validation of a tool call's arguments against the tool's JSON-schema `parameters`.
//!
//! A small hand-written validator for the subset of JSON Schema that tool parameters use in practice.
//! Invariants:
//! * Validation never panics and never fails on a malformed *schema*: a keyword whose value has the
//!   wrong shape (say `"required": 3`) is ignored, as is every keyword this module does not know
//!   (`$ref`, `pattern`, `format`, …). Only the *arguments* can be rejected — the schema is trusted
//!   tool-author input, the arguments are model output.
//! * Every violation is reported (not just the first), each with the JSON path of the offending value
//!   (`$` is the arguments object, `$.a.b[2]`, `$["odd key"]`), in document order of the schema walk.
//!   The rendered list is capped at [`MAX_LISTED`] entries so a hostile argument cannot make the error
//!   (which is fed back to the model) arbitrarily long; values quoted in messages are truncated too.
//! * When a value has the wrong `type`, no other keyword is checked at that value (the other messages
//!   would only repeat the type error).
//!
//! Supported keywords: `type` (a name or a list of names; `integer` accepts `2.0`), `nullable`
//! (OpenAPI style), `enum`, `const`, `properties`, `required`, `additionalProperties` (boolean or
//! schema), `items` (schema or tuple list), `minItems`/`maxItems`, `minLength`/`maxLength` (in
//! characters), `minimum`/`maximum`, `exclusiveMinimum`/`exclusiveMaximum` (number or draft-4
//! boolean), `allOf`/`anyOf`/`oneOf`, and boolean schemas (`true`/`false`).

use serde_json::{Map, Value};
use std::fmt;

/// How many violations [`SchemaErrors`]' message lists before summarising the rest.
pub const MAX_LISTED: usize = 20;

/// Longest rendering of a quoted value in a message, in characters.
const MAX_VALUE_CHARS: usize = 60;

/// One rule the arguments break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaViolation {
    /// JSON path of the offending value, `$` being the whole arguments value.
    pub path: String,
    /// What is wrong, e.g. `expected string, got number`.
    pub message: String,
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every violation found; never empty. Displays as `path: message; path: message; …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaErrors {
    /// The violations, in the order found (document order of the arguments).
    pub violations: Vec<SchemaViolation>,
}

impl fmt::Display for SchemaErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.violations.iter().take(MAX_LISTED).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        if self.violations.len() > MAX_LISTED {
            write!(f, "; and {} more", self.violations.len() - MAX_LISTED)?;
        }
        Ok(())
    }
}

impl std::error::Error for SchemaErrors {}

/// Checks `args` against `schema`. `Err` lists every violation.
///
/// # Errors
/// [`SchemaErrors`], never empty, when `args` does not fit `schema`.
pub fn validate(schema: &Value, args: &Value) -> Result<(), SchemaErrors> {
    let mut violations = Vec::new();
    let mut path = String::from("$");
    check(schema, args, &mut path, &mut violations);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(SchemaErrors { violations })
    }
}

/// The JSON type name of a value as used in messages (`integer` values are reported as `number`).
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64()
                || n.is_u64()
                || n.as_f64()
                    .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
        }
        _ => false,
    }
}

fn matches_type(name: &str, v: &Value) -> bool {
    match name {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "number" => v.is_number(),
        "integer" => is_integer(v),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        // An unknown type name is a schema bug: do not blame the arguments.
        _ => true,
    }
}

/// A value rendered for a message, truncated to [`MAX_VALUE_CHARS`].
fn render(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() <= MAX_VALUE_CHARS {
        text
    } else {
        let mut short: String = text.chars().take(MAX_VALUE_CHARS).collect();
        short.push('…');
        short
    }
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Appends `.key` (identifier-like keys) or `["key"]` to `path`.
fn push_key(path: &mut String, key: &str) {
    let simple = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if simple {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&Value::String(key.to_owned()).to_string());
        path.push(']');
    }
}

fn violation(out: &mut Vec<SchemaViolation>, path: &str, message: String) {
    out.push(SchemaViolation {
        path: path.to_owned(),
        message,
    });
}

fn check(schema: &Value, value: &Value, path: &mut String, out: &mut Vec<SchemaViolation>) {
    let schema = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            violation(out, path, "no value is allowed here".to_owned());
            return;
        }
        Value::Object(schema) => schema,
        // A malformed schema accepts everything.
        _ => return,
    };
    if !check_type(schema, value, path, out) {
        return;
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.iter().any(|a| a == value) {
            let listed: Vec<String> = allowed.iter().map(render).collect();
            violation(
                out,
                path,
                format!(
                    "expected one of {}, got {}",
                    listed.join(", "),
                    render(value)
                ),
            );
        }
    }
    if let Some(expected) = schema.get("const") {
        if expected != value {
            violation(
                out,
                path,
                format!("expected {}, got {}", render(expected), render(value)),
            );
        }
    }
    match value {
        Value::Object(object) => check_object(schema, object, path, out),
        Value::Array(items) => check_array(schema, items, path, out),
        Value::String(s) => check_string(schema, s, path, out),
        Value::Number(_) => check_number(schema, value, path, out),
        _ => {}
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(subs)) = schema.get(key) {
            check_combinator(key, subs, value, path, out);
        }
    }
}

/// Returns `false` (after recording the violation) when `value` has none of the allowed types.
fn check_type(
    schema: &Map<String, Value>,
    value: &Value,
    path: &str,
    out: &mut Vec<SchemaViolation>,
) -> bool {
    let names: Vec<&str> = match schema.get("type") {
        Some(Value::String(name)) => vec![name.as_str()],
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
        _ => return true,
    };
    if names.is_empty() {
        return true;
    }
    let nullable = schema.get("nullable") == Some(&Value::Bool(true));
    if names.iter().any(|n| matches_type(n, value)) || (nullable && value.is_null()) {
        return true;
    }
    let mut expected = names.join(" or ");
    if nullable && !names.contains(&"null") {
        expected.push_str(" or null");
    }
    violation(
        out,
        path,
        format!("expected {expected}, got {}", type_name(value)),
    );
    false
}

fn check_object(
    schema: &Map<String, Value>,
    object: &Map<String, Value>,
    path: &mut String,
    out: &mut Vec<SchemaViolation>,
) {
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !object.contains_key(name) {
                violation(
                    out,
                    path,
                    format!(
                        "missing required property {}",
                        Value::String(name.to_owned())
                    ),
                );
            }
        }
    }
    let properties = match schema.get("properties") {
        Some(Value::Object(p)) => Some(p),
        _ => None,
    };
    let additional = schema.get("additionalProperties");
    let len = path.len();
    for (key, item) in object {
        let declared = properties.and_then(|p| p.get(key));
        push_key(path, key);
        match (declared, additional) {
            (Some(sub), _) => check(sub, item, path, out),
            (None, Some(Value::Bool(false))) => {
                violation(out, path, "unexpected property".to_owned());
            }
            (None, Some(sub @ Value::Object(_))) => check(sub, item, path, out),
            (None, _) => {}
        }
        path.truncate(len);
    }
}

fn check_array(
    schema: &Map<String, Value>,
    items: &[Value],
    path: &mut String,
    out: &mut Vec<SchemaViolation>,
) {
    let count = items.len() as u64;
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
        if count < min {
            violation(
                out,
                path,
                format!("expected at least {}, got {count}", plural(min, "item")),
            );
        }
    }
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
        if count > max {
            violation(
                out,
                path,
                format!("expected at most {}, got {count}", plural(max, "item")),
            );
        }
    }
    let len = path.len();
    match schema.get("items") {
        Some(Value::Array(tuple)) => {
            for (i, (sub, item)) in tuple.iter().zip(items).enumerate() {
                path.push_str(&format!("[{i}]"));
                check(sub, item, path, out);
                path.truncate(len);
            }
        }
        Some(sub) => {
            for (i, item) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                check(sub, item, path, out);
                path.truncate(len);
            }
        }
        None => {}
    }
}

fn check_string(schema: &Map<String, Value>, s: &str, path: &str, out: &mut Vec<SchemaViolation>) {
    let count = s.chars().count() as u64;
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
        if count < min {
            violation(
                out,
                path,
                format!(
                    "expected at least {}, got {count}",
                    plural(min, "character")
                ),
            );
        }
    }
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
        if count > max {
            violation(
                out,
                path,
                format!("expected at most {}, got {count}", plural(max, "character")),
            );
        }
    }
}

fn check_number(
    schema: &Map<String, Value>,
    value: &Value,
    path: &str,
    out: &mut Vec<SchemaViolation>,
) {
    let Some(x) = value.as_f64() else { return };
    let limit = |key: &str| schema.get(key).filter(|v| v.is_number());
    let draft4_exclusive = |key: &str| schema.get(key) == Some(&Value::Bool(true));
    if let Some(min) = limit("minimum") {
        let bound = min.as_f64().unwrap_or(f64::NEG_INFINITY);
        if draft4_exclusive("exclusiveMinimum") {
            if x <= bound {
                violation(out, path, format!("expected > {min}, got {value}"));
            }
        } else if x < bound {
            violation(out, path, format!("expected >= {min}, got {value}"));
        }
    }
    if let Some(max) = limit("maximum") {
        let bound = max.as_f64().unwrap_or(f64::INFINITY);
        if draft4_exclusive("exclusiveMaximum") {
            if x >= bound {
                violation(out, path, format!("expected < {max}, got {value}"));
            }
        } else if x > bound {
            violation(out, path, format!("expected <= {max}, got {value}"));
        }
    }
    if let Some(min) = limit("exclusiveMinimum") {
        if x <= min.as_f64().unwrap_or(f64::NEG_INFINITY) {
            violation(out, path, format!("expected > {min}, got {value}"));
        }
    }
    if let Some(max) = limit("exclusiveMaximum") {
        if x >= max.as_f64().unwrap_or(f64::INFINITY) {
            violation(out, path, format!("expected < {max}, got {value}"));
        }
    }
}

fn check_combinator(
    key: &str,
    subs: &[Value],
    value: &Value,
    path: &mut String,
    out: &mut Vec<SchemaViolation>,
) {
    if key == "allOf" {
        for sub in subs {
            check(sub, value, path, out);
        }
        return;
    }
    if subs.is_empty() {
        return;
    }
    let matching = subs
        .iter()
        .filter(|sub| {
            let mut scratch = Vec::new();
            let mut sub_path = path.clone();
            check(sub, value, &mut sub_path, &mut scratch);
            scratch.is_empty()
        })
        .count();
    match (key, matching) {
        (_, 0) => violation(
            out,
            path,
            format!("does not match any of the {} allowed schemas", subs.len()),
        ),
        ("oneOf", n) if n > 1 => violation(
            out,
            path,
            format!(
                "matches {n} of the {} allowed schemas, expected exactly one",
                subs.len()
            ),
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(schema: Value, args: Value) -> String {
        match validate(&schema, &args) {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn type_mismatch_names_path_and_types() {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        assert_eq!(
            errors(schema, json!({"path": 5})),
            "$.path: expected string, got number"
        );
    }

    #[test]
    fn root_type_mismatch() {
        assert_eq!(
            errors(json!({"type": "object"}), json!([1])),
            "$: expected object, got array"
        );
    }

    #[test]
    fn every_type_name_is_checked() {
        for (name, ok, bad, got) in [
            ("string", json!("x"), json!(1), "number"),
            ("number", json!(1.5), json!("1"), "string"),
            ("integer", json!(2), json!(2.5), "number"),
            ("boolean", json!(true), json!(null), "null"),
            ("null", json!(null), json!(false), "boolean"),
            ("array", json!([]), json!({}), "object"),
            ("object", json!({}), json!([]), "array"),
        ] {
            let schema = json!({ "type": name });
            assert!(validate(&schema, &ok).is_ok(), "{name} should accept {ok}");
            assert_eq!(
                errors(schema, bad),
                format!("$: expected {name}, got {got}")
            );
        }
    }

    #[test]
    fn integer_accepts_whole_floats() {
        assert!(validate(&json!({"type": "integer"}), &json!(2.0)).is_ok());
        assert!(validate(&json!({"type": "integer"}), &json!(-7)).is_ok());
    }

    #[test]
    fn type_lists_and_nullable() {
        let schema = json!({"type": ["string", "null"]});
        assert!(validate(&schema, &json!(null)).is_ok());
        assert_eq!(
            errors(schema, json!(3)),
            "$: expected string or null, got number"
        );
        let schema = json!({"type": "string", "nullable": true});
        assert!(validate(&schema, &json!(null)).is_ok());
        assert_eq!(
            errors(schema, json!(false)),
            "$: expected string or null, got boolean"
        );
    }

    #[test]
    fn missing_required_property() {
        let schema = json!({
            "type": "object",
            "properties": {"task": {"type": "string"}, "to": {"type": "string"}},
            "required": ["task", "to"]
        });
        assert_eq!(
            errors(schema.clone(), json!({})),
            "$: missing required property \"task\"; $: missing required property \"to\""
        );
        assert!(validate(&schema, &json!({"task": "a", "to": "b"})).is_ok());
    }

    #[test]
    fn enum_lists_allowed_values() {
        let schema = json!({"properties": {"mode": {"enum": ["fast", "slow"]}}});
        assert_eq!(
            errors(schema, json!({"mode": "medium"})),
            "$.mode: expected one of \"fast\", \"slow\", got \"medium\""
        );
    }

    #[test]
    fn const_value() {
        assert_eq!(
            errors(json!({"const": 1}), json!(2)),
            "$: expected 1, got 2"
        );
    }

    #[test]
    fn nested_items_paths() {
        let schema = json!({
            "type": "object",
            "properties": {
                "files": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"]
                }}
            }
        });
        assert_eq!(
            errors(schema, json!({"files": [{"name": "a"}, {"name": 1}, {}]})),
            "$.files[1].name: expected string, got number; \
             $.files[2]: missing required property \"name\""
        );
    }

    #[test]
    fn tuple_items() {
        let schema = json!({"items": [{"type": "string"}, {"type": "integer"}]});
        assert_eq!(
            errors(schema, json!(["a", "b", 3])),
            "$[1]: expected integer, got string"
        );
    }

    #[test]
    fn array_length_bounds() {
        let schema = json!({"type": "array", "minItems": 1, "maxItems": 2});
        assert_eq!(
            errors(schema.clone(), json!([])),
            "$: expected at least 1 item, got 0"
        );
        assert_eq!(
            errors(schema, json!([1, 2, 3])),
            "$: expected at most 2 items, got 3"
        );
    }

    #[test]
    fn string_length_bounds_count_characters() {
        let schema = json!({"type": "string", "minLength": 2, "maxLength": 3});
        assert!(validate(&schema, &json!("été")).is_ok());
        assert_eq!(
            errors(schema.clone(), json!("a")),
            "$: expected at least 2 characters, got 1"
        );
        assert_eq!(
            errors(schema, json!("abcd")),
            "$: expected at most 3 characters, got 4"
        );
    }

    #[test]
    fn numeric_bounds() {
        let schema = json!({"type": "number", "minimum": 1, "maximum": 10});
        assert!(validate(&schema, &json!(1)).is_ok());
        assert!(validate(&schema, &json!(10)).is_ok());
        assert_eq!(errors(schema.clone(), json!(0)), "$: expected >= 1, got 0");
        assert_eq!(errors(schema, json!(10.5)), "$: expected <= 10, got 10.5");
        let schema = json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1});
        assert_eq!(errors(schema.clone(), json!(0)), "$: expected > 0, got 0");
        assert_eq!(errors(schema, json!(1)), "$: expected < 1, got 1");
        let draft4 = json!({"minimum": 0, "exclusiveMinimum": true});
        assert_eq!(errors(draft4, json!(0)), "$: expected > 0, got 0");
    }

    #[test]
    fn additional_properties() {
        let closed = json!({"properties": {"a": {}}, "additionalProperties": false});
        assert_eq!(
            errors(closed, json!({"a": 1, "b": 2, "c d": 3})),
            "$.b: unexpected property; $[\"c d\"]: unexpected property"
        );
        let typed = json!({"additionalProperties": {"type": "integer"}});
        assert_eq!(
            errors(typed, json!({"n": "x"})),
            "$.n: expected integer, got string"
        );
        // Undeclared properties are allowed by default.
        assert!(validate(&json!({"properties": {}}), &json!({"x": 1})).is_ok());
    }

    #[test]
    fn combinators() {
        let any = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
        assert!(validate(&any, &json!(3)).is_ok());
        assert_eq!(
            errors(any, json!(1.5)),
            "$: does not match any of the 2 allowed schemas"
        );
        let one = json!({"oneOf": [{"type": "number"}, {"type": "integer"}]});
        assert_eq!(
            errors(one, json!(3)),
            "$: matches 2 of the 2 allowed schemas, expected exactly one"
        );
        let all = json!({"allOf": [{"minimum": 2}, {"maximum": 1}]});
        assert_eq!(errors(all, json!(5)), "$: expected <= 1, got 5");
    }

    #[test]
    fn boolean_schemas() {
        assert!(validate(&json!(true), &json!({"x": 1})).is_ok());
        let schema = json!({"properties": {"x": false}});
        assert_eq!(
            errors(schema, json!({"x": 1})),
            "$.x: no value is allowed here"
        );
    }

    #[test]
    fn type_error_stops_other_checks_at_that_value() {
        let schema = json!({"type": "string", "minLength": 3, "enum": ["abc"]});
        assert_eq!(errors(schema, json!(1)), "$: expected string, got number");
    }

    #[test]
    fn malformed_schema_and_unknown_keywords_accept() {
        for schema in [
            json!(3),
            json!({"required": 3, "type": 7, "pattern": "^a$", "$ref": "#/x"}),
            json!({"type": "strnig"}),
        ] {
            assert!(validate(&schema, &json!({"x": 1})).is_ok(), "{schema}");
        }
    }

    #[test]
    fn long_values_are_truncated_and_long_lists_capped() {
        let long = "x".repeat(100);
        let msg = errors(json!({"enum": ["a"]}), json!(long));
        assert_eq!(
            msg,
            format!("$: expected one of \"a\", got \"{}…", "x".repeat(59))
        );
        let mut args = serde_json::Map::new();
        for i in 0..25 {
            args.insert(format!("k{i:02}"), json!(i));
        }
        let msg = errors(json!({"additionalProperties": false}), Value::Object(args));
        assert!(msg.starts_with("$.k00: unexpected property; "), "{msg}");
        assert!(
            msg.ends_with("$.k19: unexpected property; and 5 more"),
            "{msg}"
        );
    }
}
