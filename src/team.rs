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
//! [api]                               # warden serve only; the environment wins over these
//! admin_token = "…"                   # WARDEN_ADMIN_TOKEN
//! read_token = "…"                    # WARDEN_READ_TOKEN
//! listen = "127.0.0.1:7878"           # unless --listen is given
//! max_body_bytes = 65536
//! ```

use crate::{
    api::{ApiConfig, ApiSection, ApiSectionError},
    AgentSpec, Provider, ScriptStep, ScriptedProvider, Supervisor, WardenConfig,
};
use serde::Deserialize;
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use warden_actors::{OpenAiCompatible, OpenAiConfig, RetryPolicy, ToolFormat};
use warden_protocols::{AgentRole, ConfigError};

/// One model endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProviderSpec {
    /// Any OpenAI-compatible chat-completions server (OpenAI, vLLM, llama.cpp, Ollama, LM Studio).
    OpenaiCompatible {
        base_url: String,
        model: String,
        /// Name of the environment variable holding the API key.
        #[serde(default)]
        api_key_env: Option<String>,
        #[serde(default)]
        tool_format: ToolFormat,
        #[serde(default)]
        stream: bool,
        #[serde(default)]
        max_tokens: Option<u32>,
        #[serde(default)]
        temperature: Option<f32>,
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
    },
    /// The built-in scripted model: answers with `replies` in turn, then with the last one (or, with
    /// `cycle`, from the first again). A reply is a text (a final answer) or a tool call
    /// `{ tool = "delegate", args = { agent = "researcher", task = "…" } }`.
    Scripted {
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

/// Checks the values of `[providers.*]` that have a range, before typed parsing (whose errors
/// inside the tagged provider table would not name the key): each error names
/// `providers.NAME.key`, the value as written and what is allowed.
fn validate_providers(providers: &toml::Value) -> Result<(), TeamError> {
    let Some(providers) = providers.as_table() else {
        return Ok(()); // the typed parse reports it
    };
    for (name, spec) in providers {
        let Some(spec) = spec.as_table() else {
            continue;
        };
        if spec.get("kind").and_then(toml::Value::as_str) != Some("openai_compatible") {
            continue;
        }
        let check = |key: &str, lo: i64, hi: i64, allowed: String| -> Result<(), TeamError> {
            match spec.get(key) {
                None => Ok(()),
                Some(toml::Value::Integer(v)) if (lo..=hi).contains(v) => Ok(()),
                Some(value) => Err(TeamError::ProviderValue {
                    key: format!("providers.{name}.{key}"),
                    value: value.to_string(),
                    allowed,
                }),
            }
        };
        check("retry_attempts", 1, 20, "1 to 20".into())?;
        check("retry_base_ms", 0, 600_000, "0 to 600000".into())?;
        let base = spec
            .get("retry_base_ms")
            .and_then(toml::Value::as_integer)
            .unwrap_or_else(|| i64::try_from(default_retry_base_ms()).unwrap_or(0));
        check(
            "retry_cap_ms",
            base,
            600_000,
            format!("the value of providers.{name}.retry_base_ms ({base}) to 600000"),
        )?;
        check("retry_after_cap_ms", 0, 3_600_000, "0 to 3600000".into())?;
    }
    Ok(())
}

/// The `[providers.NAME]` keys of the OpenAI-compatible kind with their defaults, as commented TOML
/// (for `warden config defaults`: providers belong to team files, not to the plain configuration).
pub fn provider_defaults_toml() -> String {
    let d = OpenAiConfig::default();
    format!(
        r#"
# Team files (`warden run`, `warden serve`) add one [providers.NAME] per model endpoint and the
# [[agents]] that use them. The OpenAI-compatible kind, with its defaults:
# [providers.NAME]
# kind = "openai_compatible"            # or "scripted" (replies = ["…"], no network)
# base_url = "{base_url}"  # required: the API root; requests go to {{base_url}}/chat/completions
# model = "{model}"                     # required: sent as `model`, and the price table's key
# api_key_env = "OPENAI_API_KEY"        # optional: the variable holding the key (never the key itself)
# tool_format = "native"                # or "json_fallback" (tools described in a system message)
# stream = {stream}                        # true: server-sent events (an idle timeout instead of a total one)
# max_tokens = 1024                     # optional; unset: not sent (the server's default)
# temperature = 0.2                     # optional; unset: not sent (the server's default)
# retry_attempts = {attempts}                    # attempts per call, the first included; 1 to 20
# retry_base_ms = {base}                  # backoff before the 2nd attempt, x2 per attempt, 50-100 % jitter; 0 to 600000
# retry_cap_ms = {cap}                  # upper bound of that backoff; retry_base_ms to 600000
# retry_after_cap_ms = {after_cap}            # upper bound of a server's Retry-After (seconds or HTTP date); 0 to 3600000
"#,
        base_url = d.base_url,
        model = d.model,
        stream = d.stream,
        attempts = d.retry.max_attempts,
        base = millis(d.retry.base),
        cap = millis(d.retry.max),
        after_cap = millis(d.retry.retry_after_cap),
    )
}

impl ProviderSpec {
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
        } = self
        else {
            return None;
        };
        Some(OpenAiConfig {
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
    Text(String),
    Tool {
        tool: String,
        args: serde_json::Value,
    },
}

impl ScriptedReply {
    fn step(&self) -> ScriptStep {
        match self {
            ScriptedReply::Text(text) => ScriptStep::reply(text.clone()),
            ScriptedReply::Tool { tool, args } => ScriptStep::call(tool.clone(), args.clone()),
        }
    }
}

/// The table form of [`ScriptedReply::Tool`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolReply {
    tool: String,
    #[serde(default = "no_args")]
    args: serde_json::Value,
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
                f.write_str("a text or a tool call `{ tool = \"…\", args = { … } }`")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ScriptedReply, E> {
                Ok(ScriptedReply::Text(text.to_owned()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ScriptedReply, A::Error> {
                let ToolReply { tool, args } =
                    ToolReply::deserialize(de::value::MapAccessDeserializer::new(map))?;
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
    pub key: String,
    #[serde(default)]
    pub role: AgentRole,
    #[serde(default)]
    pub parent: Option<String>,
    /// A key of `[providers]`.
    pub provider: String,
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Whether the agent gets the `delegate` tool. Default true.
    #[serde(default = "yes")]
    pub delegate: bool,
}

fn yes() -> bool {
    true
}

/// A parsed team file.
#[derive(Debug, Clone)]
pub struct TeamFile {
    pub config: WardenConfig,
    pub providers: BTreeMap<String, ProviderSpec>,
    pub agents: Vec<AgentFileSpec>,
    /// `[api]`: tokens and limits for `warden serve` (validated; see [`TeamFile::api_config`]).
    pub api: ApiSection,
}

/// Why a team could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TeamError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "agent `{agent}` names provider `{provider}`, which is not in [providers] (have: {have})"
    )]
    UnknownProvider {
        agent: String,
        provider: String,
        have: String,
    },
    #[error("provider `{provider}`: {message}")]
    Provider { provider: String, message: String },
    /// A `[providers.*]` value out of range (worded like [`ConfigError::Invalid`]).
    #[error("invalid value for `{key}`: {value} (allowed: {allowed})")]
    ProviderValue {
        key: String,
        value: String,
        allowed: String,
    },
    #[error("{0}")]
    Spawn(#[from] warden_actors::SpawnError),
    #[error(transparent)]
    Api(#[from] ApiSectionError),
}

/// Deserializes one section of a team file; an error names the section and the key inside it
/// (``[providers]: `local.modle`: unknown field `modle`, …``).
fn section<T: serde::de::DeserializeOwned>(
    value: toml::Value,
    name: &str,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().message().to_owned();
        if path.is_empty() || path == "." {
            ConfigError::Parse(format!("{name}: {message}"))
        } else {
            ConfigError::Parse(format!("{name}: `{path}`: {message}"))
        }
    })
}

impl TeamFile {
    /// Parses a team file: `[providers.*]`, `[[agents]]` and `[api]`, and everything else as
    /// [`WardenConfig`] (unknown keys are errors there too).
    pub fn from_toml(text: &str) -> Result<Self, TeamError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.message().to_owned()))?;
        let providers = match table.remove("providers") {
            None => BTreeMap::new(),
            Some(value) => {
                validate_providers(&value)?;
                section::<BTreeMap<String, ProviderSpec>>(value, "[providers]")?
            }
        };
        let agents = match table.remove("agents") {
            None => Vec::new(),
            Some(value) => section::<Vec<AgentFileSpec>>(value, "[[agents]]")?,
        };
        let api = match table.remove("api") {
            None => ApiSection::default(),
            Some(value) => section::<ApiSection>(value, "[api]")?,
        };
        api.validate()?;
        let rest = toml::to_string(&table).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let config = WardenConfig::from_toml(&rest)?;
        for agent in &agents {
            if !providers.contains_key(&agent.provider) {
                return Err(TeamError::UnknownProvider {
                    agent: agent.key.clone(),
                    provider: agent.provider.clone(),
                    have: providers.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
        }
        Ok(TeamFile {
            config,
            providers,
            agents,
            api,
        })
    }

    /// The API settings `warden serve` uses: `[api]`, with `WARDEN_ADMIN_TOKEN` and
    /// `WARDEN_READ_TOKEN` (when set and not empty) winning over the file's tokens.
    /// The environment's tokens are validated like the file's ([`ApiConfig::try_resolve`]).
    pub fn api_config(&self) -> Result<ApiConfig, ApiSectionError> {
        ApiConfig::try_resolve(&self.api, |name| std::env::var(name).ok())
    }

    /// Builds one provider.
    pub fn provider(&self, name: &str) -> Result<Arc<dyn Provider>, TeamError> {
        let spec = self
            .providers
            .get(name)
            .ok_or_else(|| TeamError::UnknownProvider {
                agent: String::new(),
                provider: name.to_owned(),
                have: self
                    .providers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        Ok(match spec {
            ProviderSpec::OpenaiCompatible { api_key_env, .. } => {
                let timeout = Duration::from_secs_f64(self.config.safety.timeout.llm_call_seconds);
                let config = spec
                    .openai_config(timeout)
                    .ok_or_else(|| TeamError::Provider {
                        provider: name.to_owned(),
                        message: "not an OpenAI-compatible provider".into(),
                    })?;
                let provider = match api_key_env {
                    Some(var) => OpenAiCompatible::from_env(config, var),
                    None => OpenAiCompatible::new(config),
                }
                .map_err(|e| TeamError::Provider {
                    provider: name.to_owned(),
                    message: e.to_string(),
                })?;
                Arc::new(provider)
            }
            ProviderSpec::Scripted {
                replies,
                cycle,
                latency_ms,
                jitter_ms,
                error,
            } => {
                let (latency_ms, jitter_ms, cycle) = (*latency_ms, *jitter_ms, *cycle);
                let script: Vec<ScriptStep> = match error {
                    Some(message) => vec![ScriptStep::fail(message.clone())],
                    None if replies.is_empty() => vec![ScriptStep::reply("(no reply scripted)")],
                    None => replies.iter().map(ScriptedReply::step).collect(),
                };
                let calls = std::sync::atomic::AtomicU64::new(0);
                Arc::new(ScriptedProvider::new([]).with_fallback(move |_| {
                    // Call `n` (from 0) answers after latency_ms + a deterministic 0..=jitter_ms.
                    let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let last = script.len() - 1;
                    let at = if cycle {
                        (n % script.len() as u64) as usize
                    } else {
                        usize::try_from(n).map_or(last, |n| n.min(last))
                    };
                    let step = script[at].clone();
                    let ms = latency_ms.saturating_add(jitter(n, jitter_ms));
                    if ms == 0 {
                        step
                    } else {
                        step.delayed(Duration::from_millis(ms))
                    }
                }))
            }
        })
    }

    /// Spawns every agent on `team`.
    pub fn spawn_agents(&self, team: &Supervisor) -> Result<(), TeamError> {
        self.spawn_agents_restored(team, &[])
    }

    /// Spawns every agent on `team`, each from its record in `records` when there is one (a restart
    /// on a journal: state, lockout, counters and history come back as they were).
    pub fn spawn_agents_restored(
        &self,
        team: &Supervisor,
        records: &[warden_protocols::AgentRecord],
    ) -> Result<(), TeamError> {
        for agent in &self.agents {
            let provider = self.provider(&agent.provider)?;
            let mut spec = match (agent.role, &agent.parent) {
                (AgentRole::SubAgent, Some(parent)) => {
                    AgentSpec::sub_agent(agent.key.as_str(), parent.as_str(), provider)
                }
                _ => AgentSpec::assistant(agent.key.as_str(), provider),
            };
            if let Some(prompt) = &agent.system_prompt {
                spec = spec.with_system_prompt(prompt.clone());
            }
            if !agent.delegate {
                spec = spec.without_delegation();
            }
            if let Some(record) = records.iter().find(|r| r.key.as_str() == agent.key) {
                spec = spec.restored_from(record.clone());
            }
            team.spawn(spec)?;
        }
        Ok(())
    }
}

/// A deterministic 0..=`max` for call `n` (splitmix64), for the scripted model's jitter.
fn jitter(n: u64, max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % (max + 1)
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
            "agent `b` names provider `nope`, which is not in [providers] (have: canned, local)"
        );
    }

    #[test]
    fn unknown_keys_in_each_part_are_errors() {
        let err =
            TeamFile::from_toml(&FILE.replace("model = \"qwen\"", "model = \"qwen\"\nmodle = 1"))
                .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid config: [providers]: `local`: unknown field `modle`"),
            "{err}"
        );
        let err = TeamFile::from_toml(&FILE.replace("delegate = false", "delegates = false"))
            .unwrap_err();
        assert!(
            err.to_string().starts_with(
                "invalid config: [[agents]]: `[1].delegates`: unknown field `delegates`"
            ),
            "{err}"
        );
        let err = TeamFile::from_toml(&format!("{FILE}\n[mailbox]\ncapacity = 3\n")).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `capacity`"),
            "{err}"
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
        let team = TeamFile::from_toml(text).unwrap();
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
        let team = TeamFile::from_toml(text).unwrap();
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
            TeamFile::from_toml(&format!(
                "[providers.m]\nkind = \"scripted\"\nreplies = {replies}\n"
            ))
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            with("[\"ok\", { tool = \"x\", arg = {} }]"),
            "invalid config: [providers]: `m`: replies[1]: unknown field `arg`, expected `tool` or `args`"
        );
        assert_eq!(
            with("[{ args = {} }]"),
            "invalid config: [providers]: `m`: replies[0]: missing field `tool`"
        );
        assert_eq!(
            with("[{ tool = \"x\", args = 3 }]"),
            "invalid config: [providers]: `m`: replies[0]: `args` must be a table"
        );
        assert_eq!(
            with("[{ tool = \" \" }]"),
            "invalid config: [providers]: `m`: replies[0]: `tool` must not be empty"
        );
        assert_eq!(
            with("[3]"),
            "invalid config: [providers]: `m`: replies[0]: invalid type: integer `3`, \
             expected a text or a tool call `{ tool = \"…\", args = { … } }`"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_scripted_model_with_an_error_fails_every_call() {
        let text = "[providers.down]\nkind = \"scripted\"\nreplies = [\"unused\"]\n\
                    error = \"model down\"\n";
        let team = TeamFile::from_toml(text).unwrap();
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
        ];
        for (api, expected) in cases {
            assert_eq!(with(api).unwrap_err().to_string(), expected, "{api}");
        }
        let err = with("admin_tokn = \"x\"").unwrap_err().to_string();
        assert!(
            err.starts_with("invalid config: [api]: `admin_tokn`: unknown field `admin_tokn`"),
            "{err}"
        );
        let err = with("listen = \"nowhere\"").unwrap_err().to_string();
        assert!(err.starts_with("invalid config: [api]: "), "{err}");
    }

    #[test]
    fn environment_tokens_win_over_the_file() {
        let section = ApiSection {
            admin_token: Some("file-admin".into()),
            read_token: Some("file-read".into()),
            listen: None,
            max_body_bytes: Some(100),
        };
        let env = |admin: Option<&'static str>| {
            move |name: &str| match name {
                "WARDEN_ADMIN_TOKEN" => admin.map(str::to_owned),
                _ => None,
            }
        };
        let config = ApiConfig::resolve(&section, env(Some("env-admin")));
        assert_eq!(config.admin_token.as_deref(), Some("env-admin"));
        assert_eq!(config.read_token.as_deref(), Some("file-read"));
        assert_eq!(config.body_limit, 100);
        // An empty variable counts as unset.
        let config = ApiConfig::resolve(&section, env(Some("")));
        assert_eq!(config.admin_token.as_deref(), Some("file-admin"));
        let config = ApiConfig::resolve(&ApiSection::default(), env(None));
        assert_eq!(config.admin_token, None);
        assert_eq!(config.body_limit, crate::api::DEFAULT_BODY_LIMIT);
    }

    #[test]
    fn environment_tokens_are_validated_like_the_files() {
        let section = |admin: Option<&str>, read: Option<&str>| ApiSection {
            admin_token: admin.map(str::to_owned),
            read_token: read.map(str::to_owned),
            ..ApiSection::default()
        };
        let env = |admin: Option<&'static str>, read: Option<&'static str>| {
            move |name: &str| match name {
                "WARDEN_ADMIN_TOKEN" => admin.map(str::to_owned),
                "WARDEN_READ_TOKEN" => read.map(str::to_owned),
                _ => None,
            }
        };
        let cases = [
            (
                section(None, None),
                env(Some(" adm"), None),
                "WARDEN_ADMIN_TOKEN: must not start or end with whitespace",
            ),
            (
                section(None, None),
                env(Some("adm"), Some("rd\n")),
                "WARDEN_READ_TOKEN: must not start or end with whitespace",
            ),
            (
                section(None, None),
                env(Some("   "), None),
                "WARDEN_ADMIN_TOKEN: must not be empty",
            ),
            (
                section(None, None),
                env(Some("x"), Some("x")),
                "WARDEN_READ_TOKEN: must differ from WARDEN_ADMIN_TOKEN",
            ),
            (
                section(None, Some("x")),
                env(Some("x"), None),
                "api.read_token: must differ from WARDEN_ADMIN_TOKEN",
            ),
            (
                section(Some("x"), None),
                env(None, Some("x")),
                "WARDEN_READ_TOKEN: must differ from api.admin_token",
            ),
        ];
        for (section, env, expected) in cases {
            let err = ApiConfig::try_resolve(&section, env).unwrap_err();
            assert_eq!(err.to_string(), expected);
        }
        let config = ApiConfig::try_resolve(&section(Some("f"), Some("r")), env(Some("e"), None));
        assert_eq!(config.unwrap().admin_token.as_deref(), Some("e"));
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
             temperature = 0.5",
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
        // Nothing given: the provider's own defaults.
        let team = TeamFile::from_toml(FILE).unwrap();
        assert_eq!(openai_config(&team, "local").retry, RetryPolicy::default());
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
        ];
        for (keys, expected) in cases {
            assert_eq!(with(keys), expected, "{keys}");
        }
        let err = with("retry_attempt = 3");
        assert!(err.contains("unknown field `retry_attempt`"), "{err}");
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
            "retry_attempts",
            "retry_base_ms",
            "retry_cap_ms",
            "retry_after_cap_ms",
        ] {
            assert!(block.contains(&format!("\n{key} = ")), "{key} undocumented");
        }
        let team = TeamFile::from_toml(&block).unwrap();
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
