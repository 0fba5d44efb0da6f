//! `[mcp_servers.NAME]` of a team file: the MCP servers whose tools agents may call (see
//! `docs/mcp.md`). Plain data; the connections live in `warden_actors::tools::mcp`.

use crate::ToolCategory;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The separator between a server's name and a tool's name in the name the model sees
/// (`everything__echo`). A dot, as team files write it (`everything.echo`), is not allowed in
/// OpenAI function names (`^[a-zA-Z0-9_-]{1,64}$`).
pub const MCP_NAME_SEPARATOR: &str = "__";

/// One MCP server: a child process spoken to over stdio (`command`) or a streamable-HTTP endpoint
/// (`url`). Exactly one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program to start (looked up on warden's `PATH`).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The child's whole environment, besides `PATH` (passed on from warden unless set here, so
    /// that `#!/usr/bin/env node` scripts and `npx` work; it is not a secret). Nothing else of
    /// warden's environment reaches the child.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A streamable-HTTP endpoint (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// Extra HTTP headers with literal values (not for secrets).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Extra HTTP headers whose values are read from environment variables: header → variable.
    #[serde(default)]
    pub headers_env: BTreeMap<String, String>,
    /// The environment variable holding a bearer token, sent as `Authorization: Bearer …`.
    /// The token is never logged nor journaled.
    #[serde(default)]
    pub bearer_env: Option<String>,
    /// Per-call timeout of this server's tools (a timed-out call is cancelled on the server).
    /// Unset: `tools.timeout_seconds`.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// How long starting (spawn or connect, handshake, `tools/list`) may take. Default 30.
    #[serde(default = "default_startup_timeout")]
    pub startup_timeout_seconds: f64,
    /// Accept a tool description or schema that changes after start (`list_changed`). Default
    /// false: the tool keeps the definition it had at start and the change is journaled as refused.
    #[serde(default)]
    pub allow_changes: bool,
    /// Cache results of tools the server marks `readOnlyHint` or `idempotentHint` (per tick).
    /// Default false.
    #[serde(default)]
    pub cache: bool,
    /// The largest result accepted, in bytes; a larger one is a failed call. Default 1 MiB.
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// Descriptions longer than this many characters are cut. Default 2048.
    #[serde(default = "default_max_description_chars")]
    pub max_description_chars: usize,
    /// A tool whose input schema is larger than this (as JSON, bytes) is refused. Default 65536.
    #[serde(default = "default_max_schema_bytes")]
    pub max_schema_bytes: usize,
    /// The category (tier) of this server's tools, for the ReAct loop and the permission gate.
    /// Unset: each tool's own annotations decide — `destructiveHint: true` → `DANGEROUS`,
    /// `readOnlyHint: true` → `SAFE_CHAIN` — and a tool with neither is `SAFE_CHAIN`.
    #[serde(default)]
    pub category: Option<ToolCategory>,
    /// How this server's tools retry a call whose error is retryable (a timeout, "connection",
    /// "temporarily unavailable", a rate limit…: docs/mcp.md). Unset: `[tools.retry]`.
    #[serde(default)]
    pub retry: Option<crate::ToolRetryConfig>,
    /// Whether this server's tools may be called twice for once (a DANGEROUS tool is retried only
    /// then). Unset: each tool's `idempotentHint` annotation.
    #[serde(default)]
    pub idempotent: Option<bool>,
}

fn default_startup_timeout() -> f64 {
    30.0
}

fn default_max_result_bytes() -> usize {
    1 << 20
}

fn default_max_description_chars() -> usize {
    2048
}

fn default_max_schema_bytes() -> usize {
    64 << 10
}

impl McpServerConfig {
    /// A stdio server running `command` with `args`, other keys at their defaults.
    pub fn stdio(command: impl Into<String>, args: impl IntoIterator<Item = String>) -> Self {
        McpServerConfig {
            command: Some(command.into()),
            args: args.into_iter().collect(),
            ..Self::empty()
        }
    }

    /// A streamable-HTTP server at `url`, other keys at their defaults.
    pub fn http(url: impl Into<String>) -> Self {
        McpServerConfig {
            url: Some(url.into()),
            ..Self::empty()
        }
    }

    fn empty() -> Self {
        McpServerConfig {
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            url: None,
            headers: BTreeMap::new(),
            headers_env: BTreeMap::new(),
            bearer_env: None,
            timeout_seconds: None,
            startup_timeout_seconds: default_startup_timeout(),
            allow_changes: false,
            cache: false,
            max_result_bytes: default_max_result_bytes(),
            max_description_chars: default_max_description_chars(),
            max_schema_bytes: default_max_schema_bytes(),
            category: None,
            retry: None,
            idempotent: None,
        }
    }

    /// Checks what serde cannot: exactly one of `command` and `url`, stdio keys only with
    /// `command`, HTTP keys only with `url`, positive timeouts, non-zero caps. Returns the key (under
    /// `mcp_servers.NAME.`), the value and what is allowed.
    pub fn check(&self) -> Result<(), (&'static str, String, &'static str)> {
        match (&self.command, &self.url) {
            (None, None) | (Some(_), Some(_)) => {
                return Err((
                    "command",
                    if self.url.is_some() {
                        "both command and url"
                    } else {
                        "neither command nor url"
                    }
                    .into(),
                    "exactly one of `command` (a stdio child) and `url` (streamable HTTP)",
                ))
            }
            (Some(command), None) => {
                if command.trim().is_empty() {
                    return Err(("command", format!("{command:?}"), "a program name or path"));
                }
                if !self.headers.is_empty()
                    || !self.headers_env.is_empty()
                    || self.bearer_env.is_some()
                {
                    return Err((
                        "headers",
                        "set".into(),
                        "headers, headers_env and bearer_env only with `url`",
                    ));
                }
            }
            (None, Some(_)) => {
                if !self.args.is_empty() || !self.env.is_empty() {
                    return Err(("args", "set".into(), "args and env only with `command`"));
                }
            }
        }
        if let Some(t) = self.timeout_seconds {
            if !(t.is_finite() && t > 0.0) {
                return Err((
                    "timeout_seconds",
                    t.to_string(),
                    "a number of seconds above 0",
                ));
            }
        }
        let t = self.startup_timeout_seconds;
        if !(t.is_finite() && t > 0.0) {
            return Err((
                "startup_timeout_seconds",
                t.to_string(),
                "a number of seconds above 0",
            ));
        }
        for (key, v) in [
            ("max_result_bytes", self.max_result_bytes),
            ("max_description_chars", self.max_description_chars),
            ("max_schema_bytes", self.max_schema_bytes),
        ] {
            if v == 0 {
                return Err((key, "0".into(), "1 or more"));
            }
        }
        Ok(())
    }
}

/// Whether `name` can name an MCP server: 1 to 32 of `A-Z a-z 0-9 - _`, without `__` (the
/// separator in model-facing names) and not starting or ending with `_`.
pub fn valid_server_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.contains(MCP_NAME_SEPARATOR)
        && !name.starts_with('_')
        && !name.ends_with('_')
}

/// One entry of an agent's `tools = [...]`: `SERVER.TOOL` or `SERVER.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpToolSelector {
    /// The server's name (a key of `[mcp_servers]`).
    pub server: String,
    /// The tool's name as the server lists it; `None` for `*` (all its tools).
    pub tool: Option<String>,
}

impl McpToolSelector {
    /// Parses `SERVER.TOOL` or `SERVER.*` (split at the first dot; tool names may contain dots).
    pub fn parse(entry: &str) -> Option<Self> {
        let (server, tool) = entry.split_once('.')?;
        if !valid_server_name(server) || tool.is_empty() {
            return None;
        }
        Some(McpToolSelector {
            server: server.to_owned(),
            tool: (tool != "*").then(|| tool.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_server_names() {
        assert_eq!(
            McpToolSelector::parse("everything.echo"),
            Some(McpToolSelector {
                server: "everything".into(),
                tool: Some("echo".into())
            })
        );
        assert_eq!(McpToolSelector::parse("fs.*").and_then(|s| s.tool), None);
        assert_eq!(
            McpToolSelector::parse("a.b.c")
                .and_then(|s| s.tool)
                .as_deref(),
            Some("b.c")
        );
        for bad in ["echo", ".echo", "x.", "a__b.echo", "_a.x", "sp ace.x"] {
            assert_eq!(McpToolSelector::parse(bad), None, "{bad}");
        }
        assert!(valid_server_name("git-hub_2"));
        assert!(!valid_server_name(&"a".repeat(33)));
    }

    #[test]
    fn exactly_one_transport() {
        assert!(McpServerConfig::stdio("npx", []).check().is_ok());
        assert!(McpServerConfig::http("http://x/mcp").check().is_ok());
        let mut both = McpServerConfig::stdio("npx", []);
        both.url = Some("http://x".into());
        assert_eq!(both.check().unwrap_err().0, "command");
        let mut t = McpServerConfig::stdio("npx", []);
        t.timeout_seconds = Some(0.0);
        assert_eq!(t.check().unwrap_err().0, "timeout_seconds");
    }
}
