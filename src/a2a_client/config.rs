//! `[a2a_agents.NAME]` in team files: a remote A2A agent as a delegate (docs/a2a.md, "Remote
//! agents as delegates"; the keys in docs/configuration.md).

use serde::{Deserialize, Serialize};

/// One remote A2A agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aAgentConfig {
    /// Where its agent card is: the agent's base URL (the card is read at
    /// `URL/.well-known/agent-card.json`) or the card's own URL (ending in `.json`). Required.
    pub url: String,
    /// The environment variable holding the bearer token sent with every call
    /// (`Authorization: Bearer TOKEN`); unset key: no token. The variable must be set and not
    /// empty when the team starts.
    #[serde(default)]
    pub token_env: Option<String>,
    /// What the agent does, for the `delegate` tool's description; default: the card's
    /// `description`.
    #[serde(default)]
    pub description: Option<String>,
    /// Seconds one HTTP call (card, send, poll, cancel) may take. Default 30.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    /// The most milliseconds between two `GetTask` polls of a working task (polls start 20 ms
    /// apart and double up to it). Default 500.
    #[serde(default = "default_poll")]
    pub poll_interval_ms: u64,
    /// The largest answer read from the peer, in bytes (card or JSON-RPC response); a larger one
    /// fails the call. Default 1 MiB.
    #[serde(default = "default_max_bytes")]
    pub max_response_bytes: usize,
}

fn default_timeout() -> f64 {
    30.0
}

fn default_poll() -> u64 {
    500
}

fn default_max_bytes() -> usize {
    1 << 20
}

impl A2aAgentConfig {
    /// What is wrong with a value: `(key, value, what is allowed)`.
    ///
    /// # Errors
    /// The first invalid key.
    pub fn check(&self) -> Result<(), (&'static str, String, &'static str)> {
        let url = reqwest::Url::parse(&self.url).ok();
        if !url.is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some()) {
            return Err((
                "url",
                format!("{:?}", self.url),
                "an http:// or https:// URL with a host",
            ));
        }
        if let Some(var) = &self.token_env {
            if var.is_empty() || var.contains('=') || var.contains('\0') {
                return Err((
                    "token_env",
                    format!("{var:?}"),
                    "the name of an environment variable",
                ));
            }
        }
        if !(self.timeout_seconds.is_finite() && self.timeout_seconds > 0.0) {
            return Err((
                "timeout_seconds",
                self.timeout_seconds.to_string(),
                "a number of seconds above 0",
            ));
        }
        if self.poll_interval_ms == 0 || self.poll_interval_ms > 600_000 {
            return Err((
                "poll_interval_ms",
                self.poll_interval_ms.to_string(),
                "1 to 600000 milliseconds",
            ));
        }
        if self.max_response_bytes < 1024 {
            return Err((
                "max_response_bytes",
                self.max_response_bytes.to_string(),
                "at least 1024 bytes",
            ));
        }
        Ok(())
    }
}
