//! `warden init [PATH]`: a commented team file to start from.
//!
//! Guarantees:
//! * The file written is [`template`]: a team that runs offline (the scripted model), one assistant
//!   that delegates to one sub-agent, the `[safety.*]` keys with their defaults (commented, from the
//!   same defaults `warden config defaults` prints), an `[api]` section whose tokens come from the
//!   environment, and a commented `[permissions]` example. It passes `warden config check` and
//!   starts with `warden run` and `warden serve`.
//! * An existing file is never overwritten without `force` ([`InitError::Exists`]); the check and
//!   the creation are one step (`create_new`), so a file made meanwhile is not overwritten either.

use crate::WardenConfig;
use std::{io::Write, path::Path};

/// Where `warden init` writes when no path is given.
pub const DEFAULT_PATH: &str = "warden.toml";

/// Why `warden init` wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A file (or anything else) is already at the path and `force` was not given.
    #[error("{path} already exists; not overwritten (--force replaces it)")]
    Exists {
        /// The path, as given.
        path: String,
    },
    /// Creating or writing the file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The path, as given.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// The team file `warden init` writes.
pub fn template() -> String {
    format!(
        r#"# A team file to start from (`warden init`). Check it with `warden config check FILE`, talk to it
# with `warden run --config FILE`, serve it with `warden serve --config FILE` (docs/configuration.md).
# It runs offline on the built-in scripted model; for a real model see [providers.assistant] below.

# The model the assistant uses. `scripted` plays the replies in order (`cycle`: then again): no
# network, no API key. The first reply delegates to the helper, the second answers.
[providers.assistant]
kind = "scripted"
cycle = true
replies = [
  {{ tool = "delegate", args = {{ agent = "helper", task = "Look into what was asked." }} }},
  "Done: the helper looked into it.",
]
# For an OpenAI-compatible server (llama.cpp, vLLM, Ollama's /v1, OpenAI), replace the keys above:
# kind = "openai_compatible"
# base_url = "http://127.0.0.1:8080/v1"
# model = "qwen2.5-7b-instruct"
# api_key_env = "OPENAI_API_KEY"       # the variable holding the key (never the key itself)
# (`warden config defaults` lists every provider key with its default.)

[providers.helper]
kind = "scripted"
cycle = true
replies = ["Looked into it: nothing to worry about."]

# The assistant takes your events; it may delegate to its sub-agents.
[[agents]]
key = "assistant"
provider = "assistant"
system_prompt = "You are a helpful assistant. Delegate research to `helper` with the delegate tool."

# A sub-agent: works on the tasks its parent delegates, and delegates no further.
[[agents]]
key = "helper"
role = "sub_agent"
parent = "assistant"
provider = "helper"
system_prompt = "You look things up and answer briefly."
delegate = false

# The safety settings, with their defaults: uncomment a key to change it (docs/configuration.md).
{safety}
# Tool permissions (docs/permissions.md): every tool call passes this gate. By default every tier
# is allowed; this asks an operator (`warden ask`, the console) before any DANGEROUS tool runs, and
# refuses one tool outright:
# [permissions]
# dangerous = "ask"
#
# [[permissions.rules]]
# tool = "shell__run"
# verdict = "deny"

# warden serve only: the HTTP admin API and the browser console. Every route but GET /healthz
# needs a token: set WARDEN_ADMIN_TOKEN (and WARDEN_READ_TOKEN for read-only clients) in the
# environment rather than writing them here; set, they win over admin_token / read_token.
[api]
listen = "127.0.0.1:7878"
# admin_token = "…"
# read_token = "…"
"#,
        safety = commented_safety(),
    )
}

/// The `[safety.*]` sections of the default configuration, every line commented out.
fn commented_safety() -> String {
    let defaults = WardenConfig::defaults_toml();
    let mut text = String::new();
    let mut in_safety = false;
    for line in defaults.lines() {
        if line.starts_with('[') {
            in_safety = line.starts_with("[safety");
        }
        if !in_safety {
            continue;
        }
        if line.trim().is_empty() {
            text.push_str("#\n");
        } else {
            text.push_str("# ");
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// Writes [`template`] to `path`; with `force`, over whatever file is there.
///
/// # Errors
///
/// * [`InitError::Exists`] — something is at `path` and `force` is false (nothing is written).
/// * [`InitError::Write`] — the file cannot be created or written (no such directory, no
///   permission, a directory at `path` with `force`).
pub fn write(path: &Path, force: bool) -> Result<(), InitError> {
    let shown = path.display().to_string();
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            InitError::Exists {
                path: shown.clone(),
            }
        } else {
            InitError::Write {
                path: shown.clone(),
                source,
            }
        }
    })?;
    file.write_all(template().as_bytes())
        .and_then(|()| file.flush())
        .map_err(|source| InitError::Write {
            path: shown,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_is_a_valid_team_with_the_safety_defaults_commented() {
        let text = template();
        let team = crate::team::TeamFile::from_toml(&text).expect("the template is valid");
        assert_eq!(team.agents.len(), 2);
        assert!(text.contains("# [safety.loop]"), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("[safety")), "{text}");
        assert!(text.contains("# [permissions]"), "{text}");
    }
}
