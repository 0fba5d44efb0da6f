//! Team files: the configuration (`[safety]`, `[execution]`, …) plus the models (`[providers.NAME]`)
//! and the agents (`[[agents]]`) that `warden run` starts.
//!
//! ```toml
//! [providers.local]
//! kind = "openai_compatible"          # or "scripted"
//! base_url = "http://127.0.0.1:8080/v1"
//! model = "qwen2.5-7b-instruct"
//! api_key_env = "OPENAI_API_KEY"      # optional; the key itself never goes in the file
//! tool_format = "native"              # or "json_fallback"
//! stream = false                      # true: server-sent events
//! # max_tokens = 1024                 # unset: the server's default
//! # temperature = 0.2                 # unset: the server's default
//! retry_attempts = 4                  # attempts per call, the first included (1 to 20)
//! retry_base_ms = 1000                # backoff before the 2nd attempt, doubling (0 to 600000)
//! retry_cap_ms = 10000                # the backoff's upper bound (retry_base_ms to 600000)
//! retry_after_cap_ms = 60000          # upper bound of a server's Retry-After (0 to 3600000)
//! max_response_bytes = 16777216       # an answer's body past this fails as malformed (1024 to 1073741824)
//! max_concurrency = 8                 # calls in flight at once, shared by the provider's agents
//! requests_per_minute = 500           # shared (0 or unset: unlimited; so for tokens_per_minute)
//! tokens_per_minute = 200000          # shared; estimated before a call, corrected by its usage
//!
//! [[agents]]
//! key = "concierge"
//! provider = "local"
//! system_prompt = "You are a helpful concierge."
//!
//! [[agents]]
//! key = "researcher"
//! role = "sub_agent"
//! parent = "concierge"
//! provider = "local"
//!
//! [mcp_servers.everything]            # tools from an MCP server (see docs/mcp.md)
//! command = "npx"                     # a stdio child; or url = "http://…/mcp"
//! args = ["-y", "@modelcontextprotocol/server-everything"]
//!
//! [api]                               # warden serve only; the environment wins over these
//! admin_token = "…"                   # WARDEN_ADMIN_TOKEN
//! read_token = "…"                    # WARDEN_READ_TOKEN
//! host_tokens = ["…"]                 # a game server's: world events, replies, halts only
//! max_batch_events = 256              # most events in one POST /api/world/batch
//! listen = "127.0.0.1:7878"           # unless --listen is given
//! max_body_bytes = 65536
//! session_ttl_seconds = 28800         # a browser console session (docs/console.md)
//! auth_failures_per_minute = 10       # wrong tokens per address and minute, then 429 for wrong ones
//! allowed_origins = []                # browser origins besides its own that may call /mcp
//!
//! [telemetry]                         # OpenTelemetry (docs/telemetry.md); OTEL_* variables win
//! endpoint = "http://localhost:4318"  # OTLP/HTTP base URL; /v1/traces is appended
//! service_name = "warden"
//! capture_content = false             # prompts and completions stay out of spans
//! # enabled = true                    # default: on when an endpoint is set
//! ```

pub mod api;
mod build;
pub mod cluster;
pub mod cluster_error;
mod defaults;
mod parse;
mod validate;

pub use defaults::{defaults_toml, provider_defaults_toml};
pub use parse::check;
#[allow(unused_imports)] // for the sibling files (`use super::*`) and the tests
use {build::jitter, parse::place, validate::is_http_url, validate::validate_providers};

pub use api::{ApiSection, ApiSectionError};
pub use cluster::ClusterSection;
pub use cluster_error::ClusterError;

use crate::{AgentSpec, Provider, ScriptStep, ScriptedProvider, Supervisor, WardenConfig};
use serde::Deserialize;
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use warden_actors::tools::mcp::{ListedTool, McpError, McpHub};
use warden_actors::{
    Limited, OpenAiCompatible, OpenAiConfig, ProviderLimiter, ProviderLimits, RetryPolicy,
    ToolFormat,
};
use warden_protocols::{AgentRole, ConfigError, McpServerConfig, McpToolSelector};

/// One model endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProviderSpec {
    /// Any OpenAI-compatible chat-completions server (OpenAI, vLLM, llama.cpp, Ollama, LM Studio).
    OpenaiCompatible {
        /// The API root, such as `http://127.0.0.1:8080/v1`; requests go to
        /// `{base_url}/chat/completions`. Required; [`TeamFile::validate`] refuses anything but an
        /// `http://` or `https://` URL with a host.
        base_url: String,
        /// The model name sent as `model` in every request, and the key of the price table
        /// (`safety.budget.prices`). Required.
        model: String,
        /// Name of the environment variable holding the API key.
        #[serde(default)]
        api_key_env: Option<String>,
        /// How tools are offered to the model: `native` (the `tools` / `tool_calls` fields; the
        /// default) or `json_fallback` (described in a system message, calls read from the text).
        #[serde(default)]
        tool_format: ToolFormat,
        /// Whether calls use server-sent events (an idle timeout per chunk instead of a total
        /// one). Default false.
        #[serde(default)]
        stream: bool,
        /// `max_tokens` sent with every request; `None` (the default): not sent, the server's
        /// default applies.
        #[serde(default)]
        max_tokens: Option<u32>,
        /// `temperature` sent with every request; `None` (the default): not sent, the server's
        /// default applies.
        #[serde(default)]
        temperature: Option<f32>,
        /// The embedding model for long-term memory's relevance (`{base_url}/embeddings`);
        /// `None` (the default): recall ranks by BM25 (docs/memory.md).
        #[serde(default)]
        embedding_model: Option<String>,
        /// Attempts per call, the first included (1 = no retries), 1 to 20. Default 4.
        #[serde(default = "default_retry_attempts")]
        retry_attempts: u32,
        /// Backoff before the second attempt in ms, doubling per attempt (with jitter: 50–100 %
        /// of it), 0 to 600000. Default 1000.
        #[serde(default = "default_retry_base_ms")]
        retry_base_ms: u64,
        /// Upper bound of that backoff in ms, `retry_base_ms` to 600000. Default 10000.
        #[serde(default = "default_retry_cap_ms")]
        retry_cap_ms: u64,
        /// Upper bound in ms of the wait a server asks for with `Retry-After` (seconds or an HTTP
        /// date), 0 to 3600000. Default 60000.
        #[serde(default = "default_retry_after_cap_ms")]
        retry_after_cap_ms: u64,
        /// The ceiling in bytes of an answer's body (a completion, a stream's whole body,
        /// embeddings): past it the call fails as malformed and nothing more is read; 1024 to
        /// 1073741824. Default 16777216 (16 MiB).
        #[serde(default = "default_max_response_bytes")]
        max_response_bytes: u64,
        /// Calls in flight at once, shared by every agent of this provider (0: no cap), 0 to
        /// 10000. Default 0.
        #[serde(default)]
        max_concurrency: u32,
        /// Requests per minute, shared by every agent of this provider (0: no limit), 0 to
        /// 1000000. Default 0.
        #[serde(default)]
        requests_per_minute: u32,
        /// Tokens per minute, shared by every agent of this provider (0: no limit), 0 to
        /// 1000000000. Default 0.
        #[serde(default)]
        tokens_per_minute: u64,
    },
    /// The built-in scripted model: answers with `replies` in turn, then with the last one (or, with
    /// `cycle`, from the first again). A reply is a text (a final answer) or a tool call
    /// `{ tool = "delegate", args = { agent = "researcher", task = "…" } }`.
    Scripted {
        /// The answers, in order. Empty (the default): every call answers
        /// `(no reply scripted)`.
        #[serde(default, deserialize_with = "numbered_replies")]
        replies: Vec<ScriptedReply>,
        /// After the last reply, start over from the first (default false: repeat the last).
        #[serde(default)]
        cycle: bool,
        /// Each answer comes after this many milliseconds (default 0: at once).
        #[serde(default)]
        latency_ms: u64,
        /// … plus 0 to `jitter_ms` more, varying from call to call (deterministically).
        #[serde(default)]
        jitter_ms: u64,
        /// Every call fails with this message instead of answering (`replies` are not used): a model
        /// that is down, for trying the emergency stop.
        #[serde(default)]
        error: Option<String>,
        /// A deterministic fake embedding of this many dimensions (8 to 4096) for long-term
        /// memory's relevance (words hashed into dimensions: for tests, not a model of meaning);
        /// 0 (the default): none.
        #[serde(default)]
        embedding_dimensions: u32,
        // The shared limits again, as in `OpenaiCompatible`: serde's `flatten` would lose
        // `deny_unknown_fields` (an unknown key would pass silently).
        /// Calls in flight at once, shared by every agent of this provider (0: no cap), 0 to
        /// 10000. Default 0.
        #[serde(default)]
        max_concurrency: u32,
        /// Requests per minute, shared by every agent of this provider (0: no limit), 0 to
        /// 1000000. Default 0.
        #[serde(default)]
        requests_per_minute: u32,
        /// Tokens per minute, shared by every agent of this provider (0: no limit), 0 to
        /// 1000000000. Default 0.
        #[serde(default)]
        tokens_per_minute: u64,
    },
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn default_retry_attempts() -> u32 {
    RetryPolicy::default().max_attempts
}

fn default_retry_base_ms() -> u64 {
    millis(RetryPolicy::default().base)
}

fn default_retry_cap_ms() -> u64 {
    millis(RetryPolicy::default().max)
}

fn default_retry_after_cap_ms() -> u64 {
    millis(RetryPolicy::default().retry_after_cap)
}

fn default_max_response_bytes() -> u64 {
    warden_actors::DEFAULT_MAX_RESPONSE_BYTES as u64
}

impl ProviderSpec {
    /// The limits shared by every agent of this provider (`max_concurrency`,
    /// `requests_per_minute`, `tokens_per_minute`; 0: unlimited).
    pub fn limits(&self) -> ProviderLimits {
        let (ProviderSpec::OpenaiCompatible {
            max_concurrency,
            requests_per_minute,
            tokens_per_minute,
            ..
        }
        | ProviderSpec::Scripted {
            max_concurrency,
            requests_per_minute,
            tokens_per_minute,
            ..
        }) = self;
        ProviderLimits {
            max_concurrency: *max_concurrency,
            requests_per_minute: *requests_per_minute,
            tokens_per_minute: *tokens_per_minute,
        }
    }

    /// The OpenAI-compatible provider's settings (without its API key), each attempt bounded by
    /// `request_timeout`; `None` for another kind.
    pub fn openai_config(&self, request_timeout: Duration) -> Option<OpenAiConfig> {
        let ProviderSpec::OpenaiCompatible {
            base_url,
            model,
            api_key_env: _,
            tool_format,
            stream,
            max_tokens,
            temperature,
            retry_attempts,
            retry_base_ms,
            retry_cap_ms,
            retry_after_cap_ms,
            embedding_model,
            max_response_bytes,
            ..
        } = self
        else {
            return None;
        };
        Some(OpenAiConfig {
            embedding_model: embedding_model.clone(),
            max_response_bytes: usize::try_from(*max_response_bytes).unwrap_or(usize::MAX),
            tool_format: *tool_format,
            stream: *stream,
            max_tokens: *max_tokens,
            temperature: *temperature,
            request_timeout,
            retry: RetryPolicy {
                max_attempts: *retry_attempts,
                base: Duration::from_millis(*retry_base_ms),
                max: Duration::from_millis(*retry_cap_ms),
                retry_after_cap: Duration::from_millis(*retry_after_cap_ms),
                ..RetryPolicy::default()
            },
            ..OpenAiConfig::new(base_url.clone(), model.clone())
        })
    }
}

/// One answer of a team file's scripted model: a final text, or one tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptedReply {
    /// A final answer: the turn ends with this text (written as a plain string in the file).
    Text(String),
    /// One tool call (written `{ tool = "…", args = { … } }`); the turn goes on or ends as the
    /// tool's category says (the built-in `delegate` goes on with the delegate's answer).
    Tool {
        /// The tool's name, such as `delegate`; never empty.
        tool: String,
        /// The call's arguments: always a JSON object (`{}` when the file gives none).
        args: serde_json::Value,
    },
    /// A failed call (written `{ fail = "…" }`): the model's error, for faults now and then in a
    /// cycle (`error` fails every call).
    Fail(String),
}

impl ScriptedReply {
    fn step(&self) -> ScriptStep {
        match self {
            ScriptedReply::Text(text) => ScriptStep::reply(text.clone()),
            ScriptedReply::Tool { tool, args } => ScriptStep::call(tool.clone(), args.clone()),
            ScriptedReply::Fail(message) => ScriptStep::fail(message.clone()),
        }
    }
}

/// The table forms of [`ScriptedReply::Tool`] and [`ScriptedReply::Fail`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolReply {
    #[serde(default)]
    tool: Option<String>,
    #[serde(default = "no_args")]
    args: serde_json::Value,
    #[serde(default)]
    fail: Option<String>,
}

fn no_args() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

impl<'de> Deserialize<'de> for ScriptedReply {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor};
        struct Reply;
        impl<'de> Visitor<'de> for Reply {
            type Value = ScriptedReply;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a text, a tool call `{ tool = \"…\", args = { … } }` or a failure \
                     `{ fail = \"…\" }`",
                )
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ScriptedReply, E> {
                Ok(ScriptedReply::Text(text.to_owned()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ScriptedReply, A::Error> {
                let ToolReply { tool, args, fail } =
                    ToolReply::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let tool = match (tool, fail) {
                    (None, Some(message)) => return Ok(ScriptedReply::Fail(message)),
                    (Some(tool), None) => tool,
                    (Some(_), Some(_)) => {
                        return Err(de::Error::custom("a reply has `tool` or `fail`, not both"))
                    }
                    (None, None) => return Err(de::Error::missing_field("tool")),
                };
                if tool.trim().is_empty() {
                    return Err(de::Error::custom("`tool` must not be empty"));
                }
                if !args.is_object() {
                    return Err(de::Error::custom("`args` must be a table"));
                }
                Ok(ScriptedReply::Tool { tool, args })
            }
        }
        deserializer.deserialize_any(Reply)
    }
}

/// `replies`, each error naming the reply's index (the provider's tagged enum hides the path).
fn numbered_replies<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ScriptedReply>, D::Error> {
    use serde::de::{self, SeqAccess, Visitor};
    struct Replies;
    impl<'de> Visitor<'de> for Replies {
        type Value = Vec<ScriptedReply>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of replies")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut replies = Vec::new();
            loop {
                let at = replies.len();
                match seq.next_element::<ScriptedReply>() {
                    Ok(Some(reply)) => replies.push(reply),
                    Ok(None) => return Ok(replies),
                    Err(e) => {
                        let e = e.to_string();
                        return Err(de::Error::custom(format_args!(
                            "replies[{at}]: {}",
                            e.trim_end()
                        )));
                    }
                }
            }
        }
    }
    deserializer.deserialize_seq(Replies)
}

/// One agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFileSpec {
    /// The agent's key (its name in the API, the CLI and the journal): unique in the team, not
    /// empty, without leading or trailing whitespace.
    pub key: String,
    /// `assistant` (the default) or `sub_agent`.
    #[serde(default)]
    pub role: AgentRole,
    /// The key of the agent a sub-agent belongs to: required for a sub-agent, refused for an
    /// assistant; the chain of parents must end at an assistant.
    #[serde(default)]
    pub parent: Option<String>,
    /// A key of `[providers]`.
    pub provider: String,
    /// The system message that starts every model call; `None` (the default): no system
    /// message.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Whether the agent gets the `delegate` tool. Default true.
    #[serde(default = "yes")]
    pub delegate: bool,
    /// Tools from `[mcp_servers]`: `"NAME.TOOL"`, or `"NAME.*"` for all of a server's tools. The
    /// model sees them as `NAME__TOOL`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// This agent's own `[npc]` keys (`npc = { interaction_enabled = false }`): each key set
    /// replaces the team's; `None`: the team's `[npc]`.
    #[serde(default)]
    pub npc: Option<warden_protocols::npc::NpcOverride>,
    /// The agent's goals (`goals = ["keep the inn tidy"]`), carried in its system message; when
    /// set (even empty), the agent also gets the `set_goals` tool. Journaled at its first spawn: a
    /// restored agent keeps the goals its journal holds. `None` (the default): no goals, no tool.
    #[serde(default)]
    pub goals: Option<Vec<String>>,
    /// This agent's own `[memory]` keys (`memory = { reflection_interval = 10 }`): each key set
    /// replaces the team's; `None`: the team's `[memory]`.
    #[serde(default)]
    pub memory: Option<warden_protocols::MemoryOverride>,
    /// This agent's own `[permissions]` keys (`permissions = { dangerous = "deny" }`): each key
    /// set replaces the team's, and its `rules` are tried before the team's; `None`: the team's
    /// `[permissions]`.
    #[serde(default)]
    pub permissions: Option<warden_protocols::PermissionsOverride>,
    /// This agent's own `[execution]` keys (`execution = { multi_action_enabled = false }`):
    /// each key set replaces the team's; `None`: the team's `[execution]`.
    #[serde(default)]
    pub execution: Option<warden_protocols::ExecutionOverride>,
}

impl AgentFileSpec {
    /// The agent's permission policy: the team's `[permissions]` with this agent's keys (the
    /// `at`-th `[[agents]]`) over it.
    pub fn permission_policy(
        &self,
        team: &warden_protocols::PermissionsConfig,
        at: usize,
    ) -> warden_protocols::PermissionPolicy {
        match &self.permissions {
            None => warden_protocols::PermissionPolicy::team(team),
            Some(own) => warden_protocols::PermissionPolicy::agent(
                team,
                own,
                &format!("agents[{at}].permissions"),
            ),
        }
    }

    /// The agent's `[npc]` settings: the team's with this agent's keys over them, when it sets any.
    pub fn npc_config(
        &self,
        team: &warden_protocols::npc::NpcConfig,
    ) -> Option<warden_protocols::npc::NpcConfig> {
        self.npc.as_ref().map(|own| own.apply(team))
    }
}

fn yes() -> bool {
    true
}

/// A parsed team file.
#[derive(Debug, Clone)]
pub struct TeamFile {
    /// The configuration sections (`[safety]`, `[execution]`, …), defaults where absent.
    pub config: WardenConfig,
    /// `[providers.NAME]`, by name.
    pub providers: BTreeMap<String, ProviderSpec>,
    /// `[[agents]]`, in file order (the order [`TeamFile::spawn_agents`] spawns them in).
    pub agents: Vec<AgentFileSpec>,
    /// `[api]`: tokens and limits for `warden serve` (validated; see [`TeamFile::api_config`]).
    pub api: ApiSection,
    /// `[telemetry]`: OpenTelemetry export (validated; see [`crate::telemetry::TelemetryConfig`]).
    pub telemetry: crate::telemetry::TelemetrySection,
    /// `[mcp_servers.NAME]`: MCP servers whose tools agents name in `tools`.
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// `[a2a_agents.NAME]`: remote A2A agents warden's agents may delegate to (docs/a2a.md).
    pub a2a_agents: BTreeMap<String, crate::a2a_client::A2aAgentConfig>,
    /// `[cluster]`: scale-out on NATS JetStream for `warden serve` (docs/cluster.md).
    pub cluster: ClusterSection,
    /// One limiter per provider name, made by the first [`TeamFile::provider`] call for it and
    /// shared by every later one (and by clones of this file: one team).
    limiters: Arc<parking_lot::Mutex<BTreeMap<String, Arc<ProviderLimiter>>>>,
}

/// Why a team could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TeamError {
    /// The file is not valid TOML, has an unknown key or a wrong type, or a configuration
    /// value is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A value of `[[agents]]` or `[providers]` that the team cannot use: the key's path
    /// (`agents[1].parent`), the agent it belongs to, the value and what is allowed.
    #[error("invalid value for `{key}`{}: {value} (allowed: {allowed})", for_agent(.agent))]
    Invalid {
        /// The key's path, such as `agents[1].parent` or `providers.local.base_url`.
        key: String,
        /// The key of the agent the value belongs to; `None` for a provider's value, the
        /// `agents` list as a whole, or a key too broken to name the agent by.
        agent: Option<String>,
        /// The value as the file spells it (`"zzz"`), or `none` when it is missing.
        value: String,
        /// What would be accepted.
        allowed: String,
    },
    /// [`TeamFile::provider`] was asked for a name that is not in `[providers]`.
    #[error(
        "agent `{agent}` names provider `{provider}`, which is not in [providers] (have: {have})"
    )]
    UnknownProvider {
        /// The agent that named it (empty when the provider was asked for directly).
        agent: String,
        /// The name asked for.
        provider: String,
        /// The names `[providers]` has, comma-separated.
        have: String,
    },
    /// A provider could not be built: its API key variable is unset or empty, or the HTTP
    /// client could not be created.
    #[error("provider `{provider}`: {message}")]
    Provider {
        /// The provider's name in `[providers]`.
        provider: String,
        /// What went wrong.
        message: String,
    },
    /// A `[providers.*]` value out of range (worded like [`ConfigError::Invalid`]).
    #[error("invalid value for `{key}`: {value} (allowed: {allowed})")]
    ProviderValue {
        /// The key's path, such as `providers.local.retry_attempts`.
        key: String,
        /// The value as the file writes it.
        value: String,
        /// The range allowed.
        allowed: String,
    },
    /// The supervisor refused an agent: its key is already taken on that supervisor, or a
    /// restored record belongs to another key.
    #[error("{0}")]
    Spawn(#[from] warden_actors::SpawnError),
    /// `[api]` is invalid: an empty token, one with surrounding whitespace, a read token equal
    /// to the admin token, or `max_body_bytes = 0`.
    #[error(transparent)]
    Api(#[from] ApiSectionError),
    /// A `[telemetry]` value that cannot be used.
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    /// An MCP server could not be started, or an agent names a tool it does not offer.
    #[error(transparent)]
    Mcp(#[from] McpError),
    /// An error of [`TeamFile::validate`] placed in the file: `line L: ` and the error.
    #[error("line {line}: {error}")]
    Located {
        /// The line of the file (from 1).
        line: usize,
        /// The error itself.
        error: Box<TeamError>,
    },
}

fn for_agent(agent: &Option<String>) -> String {
    match agent {
        Some(key) => format!(" (agent `{key}`)"),
        None => String::new(),
    }
}

/// What [`TeamFile::check_mcp`] found: per MCP server its tools or why it did not start, then
/// whether every agent's `tools` names a usable tool (checked only when all servers started).
#[derive(Debug)]
pub struct McpCheck {
    /// Per server (by name), its tools or why not.
    pub servers: Vec<(String, Result<Vec<ListedTool>, McpError>)>,
    /// Per agent that names tools, each tool's name and category (its permission tier); or the
    /// first agent entry naming no usable tool.
    pub tools: Result<BTreeMap<String, Vec<(String, warden_protocols::ToolCategory)>>, TeamError>,
}

/// What `warden config check` found in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// A team file (it has `[providers.*]` or `[[agents]]`): valid, with this many agents.
    Team {
        /// How many `[[agents]]` it has (at least one).
        agents: usize,
    },
    /// Configuration sections (and maybe `[api]`) only: valid, but `warden run` and `warden serve`
    /// need agents.
    ConfigOnly,
}

/// A value as the file spells it (`"a"`), for error messages.
fn quoted(value: &str) -> String {
    format!("{value:?}")
}

/// A list of keys for error messages: `a, b, c`, or `(none)`.
fn listed<'a>(keys: impl Iterator<Item = &'a str>) -> String {
    let keys: Vec<&str> = keys.collect();
    if keys.is_empty() {
        "(none)".to_owned()
    } else {
        keys.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[execution]
max_iterations_per_tick = 3

[providers.local]
kind = "openai_compatible"
base_url = "http://127.0.0.1:8080/v1"
model = "qwen"
tool_format = "json_fallback"

[providers.canned]
kind = "scripted"
replies = ["hello"]

[[agents]]
key = "a"
provider = "local"

[[agents]]
key = "b"
role = "sub_agent"
parent = "a"
provider = "canned"
delegate = false
"#;

    #[test]
    fn a_team_file_parses_config_providers_and_agents() {
        let team = TeamFile::from_toml(FILE).unwrap();
        assert_eq!(team.config.execution.max_iterations_per_tick, 3);
        assert_eq!(team.providers.len(), 2);
        assert_eq!(team.agents.len(), 2);
        assert_eq!(team.agents[1].role, AgentRole::SubAgent);
        assert!(!team.agents[1].delegate);
        assert_eq!(team.provider("local").unwrap().model(), "qwen");
    }

    #[test]
    fn an_unknown_provider_is_named() {
        let text = FILE.replace("provider = \"canned\"", "provider = \"nope\"");
        let err = TeamFile::from_toml(&text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value for `agents[1].provider` (agent `b`): \"nope\" (allowed: a provider \
             of [providers]: canned, local)"
        );
    }

    #[test]
    fn unknown_keys_in_each_part_are_errors() {
        let err =
            TeamFile::from_toml(&FILE.replace("model = \"qwen\"", "model = \"qwen\"\nmodle = 1"))
                .unwrap_err();
        // A provider's unknown key is placed at its table (the provider's kind decides its keys).
        assert_eq!(
            err.to_string(),
            "invalid config: line 5, column 1: `providers.local`: unknown field `modle`, expected \
             one of `base_url`, `model`, `api_key_env`, `tool_format`, `stream`, `max_tokens`, \
             `temperature`, `embedding_model`, `retry_attempts`, `retry_base_ms`, `retry_cap_ms`, \
             `retry_after_cap_ms`, `max_response_bytes`, `max_concurrency`, `requests_per_minute`, \
             `tokens_per_minute`\n\
             5 | [providers.local]\n  \
               | ^^^^^^^^^^^^^^^^^"
        );
        let err = TeamFile::from_toml(&FILE.replace("delegate = false", "delegates = false"))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: line 24, column 1: `agents[1].delegates`: unknown field `delegates`, \
             expected one of `key`, `role`, `parent`, `provider`, `system_prompt`, `delegate`, \
             `tools`, `npc`, `goals`, `memory`, `permissions`, `execution`\n\
             24 | delegates = false\n   \
                | ^^^^^^^^^"
        );
        let err = TeamFile::from_toml(&format!("{FILE}\n[mailbox]\ncapacity = 3\n")).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `capacity`"),
            "{err}"
        );
    }

    #[test]
    fn permissions_per_team_and_per_agent_with_exact_errors() {
        let base = "[permissions]\ndangerous = \"ask\"\n\n[providers.m]\nkind = \"scripted\"\n\n\
                    [[agents]]\nkey = \"a\"\nprovider = \"m\"\n";
        let team = TeamFile::from_toml(base).unwrap();
        assert_eq!(
            team.config.permissions.dangerous,
            warden_protocols::PermissionVerdict::Ask
        );
        let own = format!(
            "{base}permissions = {{ dangerous = \"deny\", rules = [{{ tool = \"delegate\", verdict = \"ask\" }}] }}\n"
        );
        let team = TeamFile::from_toml(&own).unwrap();
        let policy = team.agents[0].permission_policy(&team.config.permissions, 0);
        let ruling = policy.rule_for(
            "delegate",
            warden_protocols::ToolCategory::SafeChain,
            &serde_json::json!({}),
        );
        assert_eq!(ruling.key, "agents[0].permissions.rules[0]");
        assert_eq!(
            team.permission_table(&BTreeMap::new()),
            "permissions (the effective rule for each tool, first match first):\n  \
             a  delegate (SAFE_CHAIN): ask (agents[0].permissions.rules[0])\n"
        );
        // A bad rule in an agent's own keys: the key path and the line.
        let bad = format!(
            "{base}permissions = {{ rules = [{{ tool = \"x\", arg = \"/p\", regex = \"(\", verdict = \"ask\" }}] }}\n"
        );
        let e = TeamFile::from_toml(&bad).unwrap_err().to_string();
        assert!(
            e.starts_with("invalid config: line 10, column 25: `agents[0].permissions.rules[0]`: invalid value for `regex`: \"(\""),
            "{e}"
        );
        // A range error in an agent's own keys names the agent.
        let far = format!("{base}permissions = {{ remember_minutes = 20000 }}\n");
        assert_eq!(
            TeamFile::from_toml(&far).unwrap_err().to_string(),
            "invalid value for `agents[0].permissions.remember_minutes` (agent `a`): 20000 (allowed: 0 (until the task ends) to 10080 (a week))"
        );
        let typo = format!("{base}permissions = {{ dangerus = \"ask\" }}\n");
        let e = TeamFile::from_toml(&typo).unwrap_err().to_string();
        assert!(
            e.contains("`agents[0].permissions.dangerus`: unknown field `dangerus`"),
            "{e}"
        );
    }

    #[test]
    fn an_agent_can_have_goals_and_the_team_a_memory_section() {
        let text = "[memory]\nreflection_interval = 5\n\n[providers.m]\nkind = \"scripted\"\n\n\
                    [[agents]]\nkey = \"innkeeper\"\nprovider = \"m\"\ngoals = [\"keep the inn tidy\"]\n";
        let team = TeamFile::from_toml(text).unwrap();
        assert_eq!(team.config.memory.reflection_interval, 5);
        assert_eq!(
            team.agents[0].goals.as_deref(),
            Some(&["keep the inn tidy".to_owned()][..])
        );
        let bad = text.replace("\"keep the inn tidy\"", "\"ok\", \" \"");
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid value for `agents[0].goals` (agent `innkeeper`): goal 2 is blank (allowed: at \
             most 16 goals, each not blank and at most 500 characters)"
        );
        let bad = text.replace("reflection_interval = 5", "keep_percent = 80");
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid value for `memory.keep_percent`: 80 (allowed: 10 to 70)"
        );
        // An agent's own memory keys over the team's, validated with its key path.
        let own = text.replace("goals = [", "memory = { compaction = false }\ngoals = [");
        let team = TeamFile::from_toml(&own).unwrap();
        let memory = team.agents[0].memory.unwrap().apply(&team.config.memory);
        assert_eq!(
            (memory.compaction, memory.reflection_interval),
            (false, 5),
            "the team's other keys stay"
        );
        let bad = own.replace("compaction = false", "summary_percent = 0");
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid value for `agents[0].memory.summary_percent` (agent `innkeeper`): 0 (allowed: \
             1 to 30)"
        );
    }

    #[test]
    fn an_agent_can_set_its_own_execution_keys_over_the_teams() {
        let text =
            "[execution]\nmax_iterations_per_tick = 3\n\n[providers.m]\nkind = \"scripted\"\n\n\
                    [[agents]]\nkey = \"clerk\"\nprovider = \"m\"\n\
                    execution = { multi_action_enabled = false }\n";
        let team = TeamFile::from_toml(text).unwrap();
        let own = team.agents[0]
            .execution
            .unwrap()
            .apply(&team.config.execution);
        assert_eq!(
            (own.multi_action_enabled, own.max_iterations_per_tick),
            (false, 3),
            "the team's other keys stay"
        );
        let bad = text.replace(
            "multi_action_enabled = false",
            "max_iterations_per_tick = 11",
        );
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid config: line 10, column 41: `agents[0].execution.max_iterations_per_tick`: \
             invalid value 11 (allowed: 1 to 10)\n\
             10 | execution = { max_iterations_per_tick = 11 }\n   \
                |                                         ^^"
        );
        let bad = text.replace("multi_action_enabled = false", "max_tokens_recoveries = -1");
        assert!(TeamFile::from_toml(&bad).unwrap_err().to_string().contains(
            "`agents[0].execution.max_tokens_recoveries`: invalid value -1 (allowed: 0 to 10)"
        ),);
        let bad = text.replace("multi_action_enabled = false", "multi_action = false");
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid config: line 10, column 15: `agents[0].execution.multi_action`: unknown \
             field `multi_action`, expected one of `multi_action_enabled`, \
             `max_iterations_per_tick`, `max_context_tokens`, `context_strategy`, \
             `max_tokens_recoveries`\n\
             10 | execution = { multi_action = false }\n   \
                |               ^^^^^^^^^^^^"
        );
        let bad = text.replace(
            "multi_action_enabled = false",
            "multi_action_enabled = \"no\"",
        );
        assert!(TeamFile::from_toml(&bad)
            .unwrap_err()
            .to_string()
            .contains("`agents[0].execution.multi_action_enabled`: invalid type"),);
    }

    #[test]
    fn an_mcp_servers_retry_settings_are_read_and_range_checked() {
        let text = "[mcp_servers.files]\ncommand = \"files-server\"\n\
                    retry = { max_attempts = 2, jitter = false }\nidempotent = true\n\n\
                    [providers.m]\nkind = \"scripted\"\n\n[[agents]]\nkey = \"a\"\nprovider = \"m\"\n";
        let team = TeamFile::from_toml(text).unwrap();
        let files = &team.mcp_servers["files"];
        let retry = files.retry.unwrap();
        assert_eq!(
            (retry.max_attempts, retry.jitter, retry.base_seconds),
            (2, false, 1.0)
        );
        assert_eq!(files.idempotent, Some(true));
        let bad = text.replace("max_attempts = 2", "max_attempts = 0");
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid value for `mcp_servers.files.retry.max_attempts`: 0 (allowed: 1 (no retry) to \
             10)"
        );
    }

    /// Each team mistake `warden run` and `warden serve` would reject or misread, named exactly.
    #[test]
    fn an_agent_can_set_its_own_npc_keys_over_the_teams() {
        let text = "[npc]\ntrigger_permissions = [\"gm\"]\n\n[providers.m]\nkind = \"scripted\"\n\n\
                    [[agents]]\nkey = \"statue\"\nprovider = \"m\"\nnpc = { interaction_enabled = false }\n\n\
                    [[agents]]\nkey = \"innkeeper\"\nprovider = \"m\"\n";
        let team = TeamFile::from_toml(text).unwrap();
        let statue = team.agents[0].npc_config(&team.config.npc).unwrap();
        assert!(!statue.interaction_enabled);
        assert_eq!(
            statue.trigger_permissions,
            ["gm"],
            "the team's other keys stay"
        );
        assert_eq!(team.agents[1].npc_config(&team.config.npc), None);

        let bad = text.replace(
            "npc = { interaction_enabled = false }",
            "npc = { trust = { say = 2.0 } }",
        );
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid value for `agents[0].npc.trust.say` (agent `statue`): 2 (allowed: a number \
             from 0 to 1)"
        );
        let unknown = text.replace("interaction_enabled = false", "interaction = false");
        assert!(TeamFile::from_toml(&unknown)
            .unwrap_err()
            .to_string()
            .contains("unknown field `interaction`"));
    }

    #[test]
    fn tick_and_sleep_keys_are_set_per_team_and_per_agent() {
        let text = "[npc.tick]\nenabled = true\nrate = 10.0\n\n[npc.sleep]\nenabled = true\n\n\
                    [npc.clock]\nspeed = 60.0\n\n[providers.m]\nkind = \"scripted\"\n\n\
                    [[agents]]\nkey = \"smith\"\nprovider = \"m\"\n\
                    npc = { tick = { room = \"forge\" }, sleep = { tick_rate = 0.0 } }\n";
        let team = TeamFile::from_toml(text).unwrap();
        assert_eq!(team.config.npc.clock.speed, 60.0);
        let smith = team.agents[0].npc_config(&team.config.npc).unwrap();
        assert!(smith.tick.enabled && smith.sleep.enabled);
        assert_eq!(smith.tick.rate, 10.0, "the team's tick rate stays");
        assert_eq!(smith.tick.room.as_deref(), Some("forge"));
        assert_eq!(smith.sleep.tick_rate, 0.0);

        let bad = text.replace(
            "sleep = { tick_rate = 0.0 }",
            "sleep = { tick_rate = 0.01 }",
        );
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid value for `agents[0].npc.sleep.tick_rate` (agent `smith`): 0.01 (allowed: 0 \
             (no ticks), or a number of seconds from 0.1 to 86400)"
        );
        let bad = text.replace("rate = 10.0", "rate = 0.0");
        assert_eq!(
            TeamFile::from_toml(&bad).unwrap_err().to_string(),
            "invalid value for `npc.tick.rate`: 0 (allowed: a number of seconds from 0.1 to 86400)"
        );
        let unknown = text.replace("tick = { room", "tick = { rom");
        let err = TeamFile::from_toml(&unknown).unwrap_err().to_string();
        assert!(
            err.contains(
                "unknown field `rom`, expected one of `enabled`, `rate`, `idle_rate`, `room`, \
                 `wake_seconds`"
            ),
            "{err}"
        );
        let unknown = text.replace("[npc.clock]\nspeed", "[npc.clock]\nsped");
        let err = TeamFile::from_toml(&unknown).unwrap_err().to_string();
        assert!(
            err.contains("unknown field `sped`, expected `start_hour` or `speed`"),
            "{err}"
        );
    }

    #[test]
    fn team_mistakes_are_named_with_agent_key_value_and_what_is_allowed() {
        let err = |text: &str| TeamFile::from_toml(text).unwrap_err().to_string();
        let providers = "[providers.m]\nkind = \"scripted\"\n";
        let agent = |key: &str, extra: &str| {
            format!("[[agents]]\nkey = \"{key}\"\nprovider = \"m\"\n{extra}\n")
        };
        let team = |agents: &[String]| format!("{providers}\n{}", agents.concat());
        let cases = [
            (
                providers.to_owned(),
                "invalid value for `agents`: none (allowed: one or more [[agents]] entries, each \
                 with a `key` and a `provider`)",
            ),
            (
                team(&[agent("a", ""), agent("b", ""), agent("a", "")]),
                "invalid value for `agents[2].key` (agent `a`): \"a\" (allowed: a key no other \
                 agent has; agents[0] is \"a\" too)",
            ),
            (
                team(&[agent("", "")]),
                "invalid value for `agents[0].key`: \"\" (allowed: a key that is not empty and \
                 does not start or end with whitespace)",
            ),
            (
                team(&[
                    agent("a", ""),
                    agent("b", "role = \"sub_agent\"\nparent = \"zzz\""),
                ]),
                "invalid value for `agents[1].parent` (agent `b`): \"zzz\" (allowed: the key of \
                 another agent: a)",
            ),
            (
                team(&[
                    agent("a", ""),
                    agent("b", "role = \"sub_agent\"\nparent = \"b\""),
                ]),
                "invalid value for `agents[1].parent` (agent `b`): \"b\" (allowed: the key of \
                 another agent: a)",
            ),
            (
                team(&[agent("a", ""), agent("b", "role = \"sub_agent\"")]),
                "invalid value for `agents[1].parent` (agent `b`): none (allowed: the key of \
                 another agent, as role = \"sub_agent\" needs a parent: a)",
            ),
            (
                team(&[agent("a", ""), agent("b", "parent = \"a\"")]),
                "invalid value for `agents[1].parent` (agent `b`): \"a\" (allowed: none for an \
                 assistant; add role = \"sub_agent\" to make `b` a sub-agent of `a`)",
            ),
            (
                team(&[
                    agent("top", ""),
                    agent("x", "role = \"sub_agent\"\nparent = \"y\""),
                    agent("y", "role = \"sub_agent\"\nparent = \"z\""),
                    agent("z", "role = \"sub_agent\"\nparent = \"x\""),
                ]),
                "invalid value for `agents[1].parent` (agent `x`): \"y\" (allowed: a parent whose \
                 chain of parents ends at an assistant; this one loops: x -> y -> z -> x)",
            ),
            (
                "[providers.local]\nkind = \"openai_compatible\"\nbase_url = \"not a url\"\n\
                 model = \"q\"\n\n[[agents]]\nkey = \"a\"\nprovider = \"local\"\n"
                    .to_owned(),
                "invalid value for `providers.local.base_url`: \"not a url\" (allowed: an \
                 http:// or https:// URL with a host, such as \"http://127.0.0.1:8080/v1\")",
            ),
            (
                team(&[agent("a", "").replace("\"m\"", "\"nope\"")]),
                "invalid value for `agents[0].provider` (agent `a`): \"nope\" (allowed: a \
                 provider of [providers]: m)",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(err(&text), expected, "{text}");
        }
        for url in ["ftp://host/v1", "http://", "127.0.0.1:8080/v1", "/v1"] {
            let text = FILE.replace("http://127.0.0.1:8080/v1", url);
            assert!(
                err(&text).starts_with("invalid value for `providers.local.base_url`"),
                "{url}"
            );
        }
        // A chain into a loop is reported for an agent of the loop, not for the agent above it.
        let text = team(&[
            agent("top", ""),
            agent("w", "role = \"sub_agent\"\nparent = \"x\""),
            agent("x", "role = \"sub_agent\"\nparent = \"y\""),
            agent("y", "role = \"sub_agent\"\nparent = \"x\""),
        ]);
        assert_eq!(
            err(&text),
            "invalid value for `agents[2].parent` (agent `x`): \"y\" (allowed: a parent whose \
             chain of parents ends at an assistant; this one loops: x -> y -> x)"
        );
    }

    #[test]
    fn check_tells_a_team_file_from_configuration_only() {
        assert_eq!(check(FILE).unwrap(), Checked::Team { agents: 2 });
        assert_eq!(
            check("[execution]\nmax_iterations_per_tick = 3\n").unwrap(),
            Checked::ConfigOnly
        );
        // Providers without agents: a team file missing its agents.
        let err = check("[providers.m]\nkind = \"scripted\"\n").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid value for `agents`: none"),
            "{err}"
        );
        let err = check(&FILE.replace("key = \"b\"", "key = \"a\"")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid value for `agents[1].key` (agent `a`)"),
            "{err}"
        );
    }

    #[test]
    fn the_printed_defaults_are_the_whole_configuration_and_parse_back() {
        let text = defaults_toml();
        for section in [
            "[safety.on_limit]",
            "[execution]",
            "[delegation]",
            "[tools]",
            "[mailbox]",
            "[supervisor.restart]",
            "[journal]",
            "[api]",
        ] {
            assert!(text.lines().any(|l| l == section), "{section}:\n{text}");
        }
        assert_eq!(check(&text).unwrap(), Checked::ConfigOnly);
        let file = TeamFile::parse(&text).unwrap();
        assert_eq!(file.config, WardenConfig::default());
        // The generated values are the defaults (the server's resolution of them: api.rs's tests).
        assert_eq!(file.api.max_body_bytes, Some(api::DEFAULT_BODY_LIMIT));
        assert_eq!(file.api.admin_token, None);
        assert_eq!(
            file.api.listen.map(|a| a.to_string()).as_deref(),
            Some(api::DEFAULT_LISTEN)
        );
    }

    #[test]
    fn an_unknown_section_error_lists_every_section() {
        let err = TeamFile::from_toml(&format!("{FILE}\n[mailboxes]\ncapacity = 3\n"))
            .unwrap_err()
            .to_string();
        let line = FILE.lines().count() + 2;
        assert_eq!(
            err,
            format!(
                "invalid config: line {line}, column 2: `mailboxes`: unknown field `mailboxes`, \
                 expected one of `safety`, `execution`, `delegation`, `tools`, `mailbox`, \
                 `supervisor`, `journal`, `npc`, `memory`, `permissions`, `providers`, `agents`, `api`, `telemetry`, `mcp_servers`, `a2a_agents`, \
                 `cluster`, `workload`\n\
                 {line} | [mailboxes]\n\
                 {} |  ^^^^^^^^^",
                " ".repeat(line.to_string().len())
            )
        );
    }

    #[test]
    fn a_syntax_error_names_line_column_and_the_line() {
        let text = "[providers.m]\nkind = \"scripted\"\nreplies = [\"unterminated]\n";
        let err = TeamFile::from_toml(text).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid config: line 3, column 26: invalid basic string\n\
             3 | replies = [\"unterminated]\n  |                          ^"
        );
    }

    #[test]
    fn a_bad_price_is_named_by_its_model() {
        let text = format!(
            "{FILE}\n[safety.budget.prices.\"gpt-4o\"]\nprompt_per_1k = -1.0\ncompletion_per_1k = 0.5\n"
        );
        assert_eq!(
            TeamFile::from_toml(&text).unwrap_err().to_string(),
            "invalid value for `safety.budget.prices.\"gpt-4o\".prompt_per_1k`: -1 (allowed: a \
             finite number of 0 or more)"
        );
    }

    fn request() -> crate::LlmRequest {
        crate::LlmRequest {
            agent: warden_protocols::AgentKey::new("a"),
            messages: vec![warden_protocols::ChatMessage::user("hi")],
            tools: Vec::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_scripted_model_answers_after_its_latency_and_jitter() {
        let text = "[providers.slow]\nkind = \"scripted\"\nreplies = [\"one\", \"two\"]\n\
                    latency_ms = 200\njitter_ms = 50\n";
        let team = TeamFile::parse(text).unwrap();
        let model = team.provider("slow").unwrap();
        let mut answers = Vec::new();
        for _ in 0..4 {
            let start = tokio::time::Instant::now();
            let response = model.complete(request()).await.unwrap();
            let took = start.elapsed();
            assert!(
                (Duration::from_millis(200)..=Duration::from_millis(250)).contains(&took),
                "{took:?}"
            );
            answers.push(response.message.content.unwrap_or_default());
        }
        assert_eq!(answers, ["one", "two", "two", "two"]);
        let delays: Vec<u64> = (0..64).map(|n| jitter(n, 50)).collect();
        assert!(delays.iter().all(|&d| d <= 50));
        assert!(
            delays.iter().any(|&d| d != delays[0]),
            "no jitter: {delays:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn scripted_replies_can_be_tool_calls_and_can_cycle() {
        let text = r#"
[providers.lead]
kind = "scripted"
cycle = true
replies = [
  { tool = "delegate", args = { agent = "mid", task = "look" } },
  { tool = "ping" },
  "done",
]
"#;
        let team = TeamFile::parse(text).unwrap();
        let model = team.provider("lead").unwrap();
        let mut seen = Vec::new();
        for _ in 0..7 {
            let message = model.complete(request()).await.unwrap().message;
            seen.push(match message.tool_calls.first() {
                Some(call) => format!("{} {}", call.function.name, call.function.arguments),
                None => message.content.unwrap_or_default(),
            });
        }
        let delegate = r#"delegate {"agent":"mid","task":"look"}"#;
        assert_eq!(
            seen,
            [delegate, "ping {}", "done", delegate, "ping {}", "done", delegate]
        );
    }

    #[test]
    fn a_bad_scripted_reply_is_named_exactly() {
        let with = |replies: &str| {
            TeamFile::parse(&format!(
                "[providers.m]\nkind = \"scripted\"\nreplies = {replies}\n"
            ))
            .unwrap_err()
            .to_string()
        };
        // Placed at the provider's table: the provider's kind decides how its keys are read.
        let at = "invalid config: line 1, column 1: `providers.m`: ";
        let header = "\n1 | [providers.m]\n  | ^^^^^^^^^^^^^";
        assert_eq!(
            with("[\"ok\", { tool = \"x\", arg = {} }]"),
            format!(
                "{at}replies[1]: unknown field `arg`, expected one of `tool`, `args`, \
                 `fail`{header}"
            )
        );
        assert_eq!(
            with("[{ args = {} }]"),
            format!("{at}replies[0]: missing field `tool`{header}")
        );
        assert_eq!(
            with("[{ tool = \"x\", args = 3 }]"),
            format!("{at}replies[0]: `args` must be a table{header}")
        );
        assert_eq!(
            with("[{ tool = \" \" }]"),
            format!("{at}replies[0]: `tool` must not be empty{header}")
        );
        assert_eq!(
            with("[3]"),
            format!(
                "{at}replies[0]: invalid type: integer `3`, expected a text, a tool call \
                 `{{ tool = \"…\", args = {{ … }} }}` or a failure `{{ fail = \"…\" }}`{header}"
            )
        );
        assert_eq!(
            with("[{ tool = \"x\", fail = \"y\" }]"),
            format!("{at}replies[0]: a reply has `tool` or `fail`, not both{header}")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_scripted_reply_can_be_a_failure_in_a_cycle() {
        let text = "[providers.flaky]\nkind = \"scripted\"\ncycle = true\n\
                    replies = [\"ok\", { fail = \"archive offline\" }]\n";
        let team = TeamFile::parse(text).unwrap();
        let model = team.provider("flaky").unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(match model.complete(request()).await {
                Ok(r) => r.message.content.unwrap_or_default(),
                Err(e) => e.to_string(),
            });
        }
        assert_eq!(seen, ["ok", "archive offline", "ok", "archive offline"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_scripted_model_with_an_error_fails_every_call() {
        let text = "[providers.down]\nkind = \"scripted\"\nreplies = [\"unused\"]\n\
                    error = \"model down\"\n";
        let team = TeamFile::parse(text).unwrap();
        let model = team.provider("down").unwrap();
        for _ in 0..3 {
            let err = model.complete(request()).await.unwrap_err();
            assert!(err.to_string().contains("model down"), "{err}");
        }
    }

    #[test]
    fn the_api_section_is_parsed_and_its_bad_values_are_named_exactly() {
        let text = format!(
            "{FILE}\n[api]\nadmin_token = \"adm\"\nread_token = \"rd\"\nlisten = \"0.0.0.0:9000\"\nmax_body_bytes = 2048\n"
        );
        let team = TeamFile::from_toml(&text).unwrap();
        assert_eq!(team.api.admin_token.as_deref(), Some("adm"));
        assert_eq!(team.api.listen, Some("0.0.0.0:9000".parse().unwrap()));
        assert!(
            !format!("{team:?}").contains("adm\""),
            "tokens are not printed"
        );

        let with = |api: &str| TeamFile::from_toml(&format!("{FILE}\n[api]\n{api}\n"));
        let cases = [
            ("admin_token = \"\"", "api.admin_token: must not be empty"),
            ("read_token = \"  \"", "api.read_token: must not be empty"),
            (
                "admin_token = \" x\"",
                "api.admin_token: must not start or end with whitespace",
            ),
            (
                "admin_token = \"same\"\nread_token = \"same\"",
                "api.read_token: must differ from api.admin_token",
            ),
            (
                "max_body_bytes = 0",
                "api.max_body_bytes: must be at least 1",
            ),
            ("host_tokens = [\"\"]", "api.host_tokens: must not be empty"),
            (
                "host_tokens = [\"h \"]",
                "api.host_tokens: must not start or end with whitespace",
            ),
            (
                "admin_token = \"same\"\nhost_tokens = [\"h\", \"same\"]",
                "api.host_tokens: each must differ from api.admin_token",
            ),
            (
                "read_token = \"same\"\nhost_tokens = [\"same\"]",
                "api.host_tokens: each must differ from api.read_token",
            ),
            (
                "host_tokens = [\"h\", \"h\"]",
                "api.host_tokens: each must be listed once",
            ),
            (
                "max_batch_events = 0",
                "api.max_batch_events: must be at least 1",
            ),
            (
                "session_ttl_seconds = 0",
                "api.session_ttl_seconds: must be at least 1",
            ),
        ];
        for (api, expected) in cases {
            assert_eq!(with(api).unwrap_err().to_string(), expected, "{api}");
        }
        let err = with("admin_tokn = \"x\"").unwrap_err().to_string();
        let line = FILE.lines().count() + 3;
        assert_eq!(
            err,
            format!(
                "invalid config: line {line}, column 1: `api.admin_tokn`: unknown field \
                 `admin_tokn`, expected one of `admin_token`, `read_token`, `host_tokens`, \
                 `max_batch_events`, `listen`, `max_body_bytes`, `session_ttl_seconds`, \
                 `auth_failures_per_minute`, `allowed_origins`\n{line} | \
                 admin_tokn = \"x\"\n   | ^^^^^^^^^^"
            )
        );
        let err = with("listen = \"nowhere\"").unwrap_err().to_string();
        assert!(err.contains(": `api.listen`: "), "{err}");
    }

    /// The provider's settings as the team file gave them (the API key aside).
    fn openai_config(team: &TeamFile, name: &str) -> OpenAiConfig {
        team.providers[name]
            .openai_config(Duration::from_secs(60))
            .unwrap()
    }

    #[test]
    fn retry_settings_are_read_per_provider_with_defaults() {
        let text = FILE.replace(
            "tool_format = \"json_fallback\"",
            "tool_format = \"json_fallback\"\nretry_attempts = 2\nretry_base_ms = 250\n\
             retry_cap_ms = 4000\nretry_after_cap_ms = 5000\nstream = true\nmax_tokens = 512\n\
             temperature = 0.5\nmax_response_bytes = 65536",
        );
        let team = TeamFile::from_toml(&text).unwrap();
        let config = openai_config(&team, "local");
        assert_eq!(
            config.retry,
            RetryPolicy {
                max_attempts: 2,
                base: Duration::from_millis(250),
                max: Duration::from_secs(4),
                retry_after_cap: Duration::from_secs(5),
                ..RetryPolicy::default()
            }
        );
        assert!(config.stream);
        assert_eq!(
            (config.max_tokens, config.temperature),
            (Some(512), Some(0.5))
        );
        assert_eq!(config.max_response_bytes, 65536);
        // Nothing given: the provider's own defaults.
        let team = TeamFile::from_toml(FILE).unwrap();
        assert_eq!(openai_config(&team, "local").retry, RetryPolicy::default());
        assert_eq!(
            openai_config(&team, "local").max_response_bytes,
            warden_actors::DEFAULT_MAX_RESPONSE_BYTES
        );
    }

    #[test]
    fn bad_retry_settings_name_key_value_and_range() {
        let with = |keys: &str| {
            TeamFile::from_toml(&FILE.replace(
                "tool_format = \"json_fallback\"",
                &format!("tool_format = \"json_fallback\"\n{keys}"),
            ))
            .map(|_| ())
            .unwrap_err()
            .to_string()
        };
        let cases = [
            (
                "retry_attempts = 0",
                "invalid value for `providers.local.retry_attempts`: 0 (allowed: 1 to 20)",
            ),
            (
                "retry_attempts = 21",
                "invalid value for `providers.local.retry_attempts`: 21 (allowed: 1 to 20)",
            ),
            (
                "retry_base_ms = 600001",
                "invalid value for `providers.local.retry_base_ms`: 600001 (allowed: 0 to 600000)",
            ),
            (
                "retry_base_ms = 500\nretry_cap_ms = 499",
                "invalid value for `providers.local.retry_cap_ms`: 499 \
                 (allowed: the value of providers.local.retry_base_ms (500) to 600000)",
            ),
            (
                "retry_cap_ms = 999",
                "invalid value for `providers.local.retry_cap_ms`: 999 \
                 (allowed: the value of providers.local.retry_base_ms (1000) to 600000)",
            ),
            (
                "retry_base_ms = -1",
                "invalid value for `providers.local.retry_base_ms`: -1 (allowed: 0 to 600000)",
            ),
            (
                "retry_attempts = 2.5",
                "invalid value for `providers.local.retry_attempts`: 2.5 (allowed: 1 to 20)",
            ),
            (
                "retry_after_cap_ms = \"60s\"",
                "invalid value for `providers.local.retry_after_cap_ms`: \"60s\" (allowed: 0 to 3600000)",
            ),
            (
                "retry_after_cap_ms = 3600001",
                "invalid value for `providers.local.retry_after_cap_ms`: 3600001 (allowed: 0 to 3600000)",
            ),
            (
                "max_response_bytes = 1023",
                "invalid value for `providers.local.max_response_bytes`: 1023 (allowed: 1024 to 1073741824)",
            ),
            (
                "max_response_bytes = \"16MiB\"",
                "invalid value for `providers.local.max_response_bytes`: \"16MiB\" (allowed: 1024 to 1073741824)",
            ),
            (
                "max_concurrency = 10001",
                "invalid value for `providers.local.max_concurrency`: 10001 (allowed: 0 (no cap) to 10000)",
            ),
            (
                "max_concurrency = -1",
                "invalid value for `providers.local.max_concurrency`: -1 (allowed: 0 (no cap) to 10000)",
            ),
            (
                "requests_per_minute = 1000001",
                "invalid value for `providers.local.requests_per_minute`: 1000001 \
                 (allowed: 0 (no limit) to 1000000)",
            ),
            (
                "tokens_per_minute = 2.5",
                "invalid value for `providers.local.tokens_per_minute`: 2.5 \
                 (allowed: 0 (no limit) to 1000000000)",
            ),
        ];
        for (keys, expected) in cases {
            assert_eq!(with(keys), expected, "{keys}");
        }
        let err = with("retry_attempt = 3");
        assert!(err.contains("unknown field `retry_attempt`"), "{err}");
    }

    #[test]
    fn a_scripted_providers_limits_are_range_checked_too() {
        let text = FILE.replace(
            "replies = [\"hello\"]",
            "replies = [\"hello\"]\nmax_concurrency = 20000",
        );
        assert_eq!(
            TeamFile::from_toml(&text).map(|_| ()).unwrap_err().to_string(),
            "invalid value for `providers.canned.max_concurrency`: 20000 (allowed: 0 (no cap) to 10000)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn every_agent_of_a_provider_shares_one_limiter() {
        let text = FILE.replace(
            "replies = [\"hello\"]",
            "replies = [\"hello\"]\nlatency_ms = 1000\nmax_concurrency = 1\nrequests_per_minute = 600",
        );
        let team = TeamFile::from_toml(&text).unwrap();
        assert!(team.limiter("canned").is_none(), "made before any provider");
        let (a, b) = (
            team.provider("canned").unwrap(),
            team.provider("canned").unwrap(),
        );
        let limiter = team.limiter("canned").expect("made by provider()");
        assert_eq!(
            limiter.limits(),
            ProviderLimits {
                max_concurrency: 1,
                requests_per_minute: 600,
                tokens_per_minute: 0,
            }
        );
        let _c = team.provider("canned").unwrap();
        assert!(Arc::ptr_eq(&limiter, &team.limiter("canned").unwrap()));
        // Two agents' providers, one cap of 1: the calls run one after the other.
        let request = |agent: &str| crate::LlmRequest {
            agent: warden_protocols::AgentKey::new(agent),
            messages: vec![warden_protocols::ChatMessage::user("hi")],
            tools: vec![],
        };
        let start = tokio::time::Instant::now();
        let (x, y) = tokio::join!(a.complete(request("x")), b.complete(request("y")));
        assert!(x.is_ok() && y.is_ok());
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // The scripted call itself stays bounded by llm_call_seconds; the wait is not.
        assert!(a.bounds_its_own_calls());
        // Another provider name has its own limiter, unlimited by default.
        let _local = team.provider("local").unwrap();
        assert_eq!(
            team.limiter("local").unwrap().limits(),
            ProviderLimits::default()
        );
    }

    #[test]
    fn the_documented_provider_defaults_are_the_real_ones() {
        let defaults = provider_defaults_toml();
        // As printed (commented out), the output stays a valid plain configuration.
        let full = format!("{}{defaults}", WardenConfig::defaults_toml());
        assert_eq!(
            WardenConfig::from_toml(&full).unwrap(),
            WardenConfig::default()
        );
        // Uncommented, it is a valid provider whose values are the defaults.
        let block: String = defaults
            .lines()
            .skip_while(|l| !l.starts_with("# [providers.NAME]"))
            .map(|l| format!("{}\n", l.trim_start_matches("# ")))
            .collect();
        for key in [
            "kind",
            "base_url",
            "model",
            "api_key_env",
            "tool_format",
            "stream",
            "max_tokens",
            "temperature",
            "embedding_model",
            "retry_attempts",
            "retry_base_ms",
            "retry_cap_ms",
            "retry_after_cap_ms",
            "max_response_bytes",
            "max_concurrency",
            "requests_per_minute",
            "tokens_per_minute",
        ] {
            assert!(block.contains(&format!("\n{key} = ")), "{key} undocumented");
        }
        // A provider block alone is no team: parse it without the team check.
        let team = TeamFile::parse(&block).unwrap();
        let config = openai_config(&team, "NAME");
        let d = OpenAiConfig::default();
        assert_eq!(
            (config.stream, config.tool_format, &config.retry),
            (d.stream, d.tool_format, &d.retry)
        );
        assert_eq!((config.base_url, config.model), (d.base_url, d.model));
    }

    #[test]
    fn a_missing_api_key_variable_is_a_clear_error() {
        let text = FILE.replace(
            "tool_format = \"json_fallback\"",
            "tool_format = \"json_fallback\"\napi_key_env = \"WARDEN_TEST_NO_SUCH_VAR\"",
        );
        let team = TeamFile::from_toml(&text).unwrap();
        let err = team.provider("local").map(|_| ()).unwrap_err();
        assert!(err.to_string().starts_with("provider `local`:"), "{err}");
        assert!(err.to_string().contains("WARDEN_TEST_NO_SUCH_VAR"), "{err}");
    }
}
