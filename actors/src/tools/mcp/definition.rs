//! [`ToolDef`]: one tool as a server listed it, checked as untrusted input: the name the model
//! sees, the description cut to its cap, the schema refused over its cap, and their hashes.

use serde_json::Value;
use sha2::{Digest, Sha256};
use warden_protocols::{McpServerConfig, MCP_NAME_SEPARATOR};

/// The longest function name OpenAI-compatible APIs take.
const MAX_MODEL_NAME: usize = 64;

/// One tool of a server, as accepted by warden.
#[derive(Debug, Clone)]
pub(crate) struct ToolDef {
    /// The name the server knows it by.
    pub(crate) remote: String,
    /// The name the model sees: `SERVER__TOOL`.
    pub(crate) model_name: String,
    /// The description as the model sees it (cut to `max_description_chars`).
    pub(crate) description: String,
    /// The input schema (the model's `parameters`).
    pub(crate) schema: Value,
    pub(crate) description_sha256: String,
    pub(crate) schema_sha256: String,
    /// The server marks it read-only or idempotent (a hint; caching also needs `cache = true`).
    pub(crate) cache_hint: bool,
    /// The server marks it idempotent (`idempotentHint: true`): a DANGEROUS one may be retried,
    /// unless the team file's `idempotent` says otherwise.
    pub(crate) idempotent_hint: bool,
    /// The tier its annotations give: `destructiveHint: true` → DANGEROUS, `readOnlyHint: true` →
    /// SAFE_CHAIN; `None` without either (the server's `category`, else SAFE_CHAIN, decides).
    pub(crate) annotated: Option<warden_protocols::ToolCategory>,
    /// Set when the tool may no longer be called, with why.
    pub(crate) disabled: Option<String>,
}

/// `s` cut to at most `max` characters, with `…` when cut.
pub(crate) fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The name the model sees for `server`'s tool `tool`: `SERVER__TOOL`, each character outside
/// `A-Z a-z 0-9 _ -` replaced by `_`; `None` if longer than 64 characters.
pub fn model_tool_name(server: &str, tool: &str) -> Option<String> {
    let tool: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!("{server}{MCP_NAME_SEPARATOR}{tool}");
    (name.len() <= MAX_MODEL_NAME && !tool.is_empty()).then_some(name)
}

impl ToolDef {
    /// Checks one listed tool. `Err` (tool name, why) for a tool warden refuses: a name that maps to
    /// no usable model name, or a schema over `max_schema_bytes`.
    pub(crate) fn from_listed(
        server: &str,
        config: &McpServerConfig,
        tool: rmcp::model::Tool,
    ) -> Result<Self, (String, String)> {
        let remote = tool.name.to_string();
        let Some(model_name) = model_tool_name(server, &remote) else {
            return Err((
                remote,
                format!(
                    "its name as the model would see it (`{server}{MCP_NAME_SEPARATOR}…`) is \
                     longer than {MAX_MODEL_NAME} characters"
                ),
            ));
        };
        let schema = Value::Object((*tool.input_schema).clone());
        let schema_text = warden_canonical(&schema);
        if schema_text.len() > config.max_schema_bytes {
            return Err((
                remote,
                format!(
                    "its input schema is {} bytes, over max_schema_bytes ({})",
                    schema_text.len(),
                    config.max_schema_bytes
                ),
            ));
        }
        let description = truncate_chars(
            tool.description.as_deref().unwrap_or_default(),
            config.max_description_chars,
        );
        let cache_hint = tool
            .annotations
            .as_ref()
            .is_some_and(|a| a.read_only_hint == Some(true) || a.idempotent_hint == Some(true));
        let idempotent_hint = tool
            .annotations
            .as_ref()
            .is_some_and(|a| a.idempotent_hint == Some(true));
        let annotated = tool.annotations.as_ref().and_then(|a| {
            if a.destructive_hint == Some(true) && a.read_only_hint != Some(true) {
                Some(warden_protocols::ToolCategory::Dangerous)
            } else if a.read_only_hint == Some(true) {
                Some(warden_protocols::ToolCategory::SafeChain)
            } else {
                None
            }
        });
        Ok(ToolDef {
            annotated,
            description_sha256: sha256_hex(description.as_bytes()),
            schema_sha256: sha256_hex(schema_text.as_bytes()),
            remote,
            model_name,
            description,
            schema,
            cache_hint,
            idempotent_hint,
            disabled: None,
        })
    }

    /// Whether `self`'s description or schema differ from `other`'s.
    pub(crate) fn differs(&self, other: &ToolDef) -> bool {
        self.description_sha256 != other.description_sha256
            || self.schema_sha256 != other.schema_sha256
    }
}

fn warden_canonical(value: &Value) -> String {
    crate::tools::canonical_json(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_are_openai_function_names() {
        assert_eq!(
            model_tool_name("everything", "echo").as_deref(),
            Some("everything__echo")
        );
        assert_eq!(
            model_tool_name("fs", "read.file/x").as_deref(),
            Some("fs__read_file_x")
        );
        assert_eq!(model_tool_name("fs", &"x".repeat(61)), None);
        assert_eq!(model_tool_name("fs", ""), None);
    }

    #[test]
    fn an_idempotent_hint_is_read_for_retries() {
        let listed = |annotations: Value| -> ToolDef {
            let tool: rmcp::model::Tool = serde_json::from_value(serde_json::json!({
                "name": "put",
                "inputSchema": {"type": "object"},
                "annotations": annotations,
            }))
            .unwrap();
            ToolDef::from_listed("s", &McpServerConfig::stdio("x", []), tool).unwrap()
        };
        let put = listed(serde_json::json!({"destructiveHint": true, "idempotentHint": true}));
        assert_eq!(
            (put.annotated, put.idempotent_hint),
            (Some(warden_protocols::ToolCategory::Dangerous), true)
        );
        let rm = listed(serde_json::json!({"destructiveHint": true}));
        assert!(!rm.idempotent_hint);
    }

    #[test]
    fn descriptions_are_cut_at_a_char_boundary() {
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(truncate_chars("hi", 2), "hi");
    }
}
