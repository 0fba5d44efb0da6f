//! The configuration file (TOML). Every section and key has a documented default; unknown keys are
//! errors; invalid values are refused with the key, the value and what is allowed.

use crate::OnLimitMode;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroUsize};

/// A configuration that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid TOML, has an unknown key, or a value of the wrong type. Where the
    /// TOML parser knows the place, the text starts with `line L, column C: ` and ends with the
    /// offending line and a caret under the place (see [`parse_toml`]).
    #[error("invalid config: {0}")]
    Parse(String),
    /// A value is out of range.
    #[error("invalid value for `{key}`: {value} (allowed: {allowed})")]
    Invalid {
        /// The key's path, e.g. `execution.max_iterations_per_tick` or
        /// `safety.budget.prices."gpt-4o".prompt_per_1k`.
        key: Cow<'static, str>,
        /// The value as written (TOML), or as an environment variable gave it.
        value: String,
        /// What is allowed, in words (a range, a list of choices).
        allowed: &'static str,
    },
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WardenConfig {
    /// `[safety]`: breakers, budgets, loop limits and timeouts.
    pub safety: SafetyConfig,
    /// `[execution]`: the turn's model calls, context and retries.
    pub execution: ExecutionConfig,
    /// `[delegation]`: delegation budgets and timeouts.
    pub delegation: DelegationConfig,
    /// `[tools]`: tool timeouts and circuit breakers.
    pub tools: ToolsConfig,
    /// `[mailbox]`: lane capacities.
    pub mailbox: MailboxConfig,
    /// `[supervisor]`: arbiters and restart intensity.
    pub supervisor: SupervisorConfig,
    /// `[journal]`: where and how events are kept.
    pub journal: JournalConfig,
    /// `[npc]`: how NPC agents classify world events (`warden_protocols::npc`).
    pub npc: crate::npc::NpcConfig,
    /// `[memory]`: bounded memory — compaction of the history, reflection (docs/memory.md).
    pub memory: MemoryConfig,
    /// `[permissions]`: the permission gate before every tool call — allow, deny or ask an
    /// operator, by tier and by rule (docs/permissions.md).
    pub permissions: crate::PermissionsConfig,
}

/// `[memory]`: what keeps an agent's memory bounded (docs/memory.md). Compaction needs
/// `execution.max_context_tokens`; without it (0) the history is never compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Emergency compaction: when the history reaches 80 % of `execution.max_context_tokens`, the
    /// older history is replaced by a summary the model writes. Default true.
    pub compaction: bool,
    /// At a compaction, the newest history kept word for word, in percent of the window, 10 to 70.
    /// Default 40.
    pub keep_percent: u8,
    /// The most a summary may take, in percent of the window (longer ones are cut), 1 to 30.
    /// Default 10.
    pub summary_percent: u8,
    /// Every this many turns, before the next turn's first model call, the model writes a short
    /// reflection on the recent conversation; the latest 3 are carried in the system message.
    /// 0 = off, up to 10000. Default 0.
    pub reflection_interval: u32,
    /// Long-term memory (docs/memory.md): perceived TRIGGER and CONTEXT events are stored as
    /// observations, memories are recalled before each model call, and the agent gets the
    /// `remember`, `recall` and `forget` tools. Default false.
    pub long_term: bool,
    /// The most memories an agent keeps, 10 to 1,000,000; past it the least retained older than
    /// a game day is evicted. Default 2000.
    pub max_memories: u32,
    /// The most bytes of memories an agent keeps, 4096 to 1 GiB. Default 262144 (256 KiB).
    pub max_bytes: u64,
    /// The most memories recalled into one model call, 0 to 64 (0: recall off). Default 8.
    pub recall_k: u8,
    /// The most tokens the recalled memories take in a model call (~4 characters a token), 50 to
    /// 100000. Default 400.
    pub recall_tokens: u32,
    /// Observations stored per speaker per real minute, 1 to 10000: past it a
    /// speaker's chatter is not stored (a flood cannot flood memory). Default 6.
    pub speaker_writes_per_minute: u32,
    /// Memories written per agent per real minute (all speakers and tools), 1 to 100000. Default 30.
    pub writes_per_minute: u32,
}

impl MemoryConfig {
    /// Checks every value's range.
    ///
    /// # Errors
    ///
    /// The first value out of range, as [`ConfigError::Invalid`] (key under `memory.`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        range_u64(
            "memory.keep_percent",
            self.keep_percent.into(),
            10,
            70,
            "10 to 70",
        )?;
        range_u64(
            "memory.summary_percent",
            self.summary_percent.into(),
            1,
            30,
            "1 to 30",
        )?;
        range_u64(
            "memory.reflection_interval",
            self.reflection_interval.into(),
            0,
            10_000,
            "0 (off) to 10000",
        )?;
        range_u64(
            "memory.max_memories",
            self.max_memories.into(),
            10,
            1_000_000,
            "10 to 1000000",
        )?;
        range_u64(
            "memory.max_bytes",
            self.max_bytes,
            4096,
            1 << 30,
            "4096 to 1073741824",
        )?;
        range_u64(
            "memory.recall_k",
            self.recall_k.into(),
            0,
            64,
            "0 (off) to 64",
        )?;
        range_u64(
            "memory.recall_tokens",
            self.recall_tokens.into(),
            50,
            100_000,
            "50 to 100000",
        )?;
        range_u64(
            "memory.speaker_writes_per_minute",
            self.speaker_writes_per_minute.into(),
            1,
            10_000,
            "1 to 10000",
        )?;
        range_u64(
            "memory.writes_per_minute",
            self.writes_per_minute.into(),
            1,
            100_000,
            "1 to 100000",
        )
    }
}

/// An agent's own `memory` keys in a team file (`[[agents]] memory = { reflection_interval = 10 }`):
/// each key set replaces the team's `[memory]` value, the rest are the team's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryOverride {
    /// Replaces `memory.compaction`.
    pub compaction: Option<bool>,
    /// Replaces `memory.keep_percent`.
    pub keep_percent: Option<u8>,
    /// Replaces `memory.summary_percent`.
    pub summary_percent: Option<u8>,
    /// Replaces `memory.reflection_interval`.
    pub reflection_interval: Option<u32>,
    /// Replaces `memory.long_term`.
    pub long_term: Option<bool>,
    /// Replaces `memory.max_memories`.
    pub max_memories: Option<u32>,
    /// Replaces `memory.max_bytes`.
    pub max_bytes: Option<u64>,
    /// Replaces `memory.recall_k`.
    pub recall_k: Option<u8>,
    /// Replaces `memory.recall_tokens`.
    pub recall_tokens: Option<u32>,
    /// Replaces `memory.speaker_writes_per_minute`.
    pub speaker_writes_per_minute: Option<u32>,
    /// Replaces `memory.writes_per_minute`.
    pub writes_per_minute: Option<u32>,
}

impl MemoryOverride {
    /// `team` with the keys this override sets replaced.
    pub fn apply(&self, team: &MemoryConfig) -> MemoryConfig {
        MemoryConfig {
            compaction: self.compaction.unwrap_or(team.compaction),
            keep_percent: self.keep_percent.unwrap_or(team.keep_percent),
            summary_percent: self.summary_percent.unwrap_or(team.summary_percent),
            reflection_interval: self.reflection_interval.unwrap_or(team.reflection_interval),
            long_term: self.long_term.unwrap_or(team.long_term),
            max_memories: self.max_memories.unwrap_or(team.max_memories),
            max_bytes: self.max_bytes.unwrap_or(team.max_bytes),
            recall_k: self.recall_k.unwrap_or(team.recall_k),
            recall_tokens: self.recall_tokens.unwrap_or(team.recall_tokens),
            speaker_writes_per_minute: self
                .speaker_writes_per_minute
                .unwrap_or(team.speaker_writes_per_minute),
            writes_per_minute: self.writes_per_minute.unwrap_or(team.writes_per_minute),
        }
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            compaction: true,
            keep_percent: 40,
            summary_percent: 10,
            reflection_interval: 0,
            long_term: false,
            max_memories: 2000,
            max_bytes: 256 * 1024,
            recall_k: 8,
            recall_tokens: 400,
            speaker_writes_per_minute: 6,
            writes_per_minute: 30,
        }
    }
}

/// `[safety]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyConfig {
    /// `[safety.on_limit]`: what happens when a loop limit is reached (ask, refuse, extend).
    pub on_limit: SafetyOnLimitConfig,
    /// `[safety.loop]`: loop limits per task (iterations, agent hops, …).
    #[serde(rename = "loop")]
    pub loop_: SafetyLoopConfig,
    /// `[safety.timeout]`: wall-clock limits.
    pub timeout: SafetyTimeoutConfig,
    /// `[safety.breakers]`: the per-agent breakers' thresholds.
    pub breakers: SafetyBreakersConfig,
    /// `[safety.budget]`: token and cost budgets, and the price table.
    pub budget: SafetyBudgetConfig,
}

/// `[safety.on_limit]`: what happens when a checkpointed limit (iterations, steps, hops, sub-agents,
/// wall clock, chain wait, LLM call time) is hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyOnLimitConfig {
    /// `interactive` (ask an operator), `auto_extend` or `unattended` (refuse). Default `interactive`.
    pub mode: OnLimitMode,
    /// Extensions granted per (run, limit kind) in `auto_extend` mode, 0 to 1000. Default 1.
    pub auto_extend_times: u32,
    /// How long an interactive ask waits for an answer before refusing. 0 = forever. Default 0.
    pub ask_timeout_seconds: f64,
}

impl Default for SafetyOnLimitConfig {
    fn default() -> Self {
        SafetyOnLimitConfig {
            mode: OnLimitMode::Interactive,
            auto_extend_times: 1,
            ask_timeout_seconds: 0.0,
        }
    }
}

/// `[safety.loop]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyLoopConfig {
    /// Loop iterations within one task before the limit checkpoint, 1 to 1000000. Default 50.
    pub max_iterations_per_task: u32,
    /// Loop iterations of one agent over its life before the limit checkpoint. 0 = off. Default 0.
    pub max_steps: u64,
    /// Longest delegation chain (assistant → sub-agent is hop 1). 0 forbids delegation. Default 3.
    pub max_agent_hops: u32,
}

impl Default for SafetyLoopConfig {
    fn default() -> Self {
        SafetyLoopConfig {
            max_iterations_per_task: 50,
            max_steps: 0,
            max_agent_hops: 3,
        }
    }
}

/// `[safety.timeout]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyTimeoutConfig {
    /// One LLM request (each attempt). Default 60.
    pub llm_call_seconds: f64,
    /// How long a delegator waits for its delegate's answer. 0 = forever. Default 60.
    pub chain_seconds: f64,
    /// Wall clock of one task (checked at the start of each loop iteration). 0 = off. Default 0.
    pub task_seconds: f64,
}

impl Default for SafetyTimeoutConfig {
    fn default() -> Self {
        SafetyTimeoutConfig {
            llm_call_seconds: 60.0,
            chain_seconds: 60.0,
            task_seconds: 0.0,
        }
    }
}

/// `[safety.breakers]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyBreakersConfig {
    /// Failed tool/LLM calls in a row that trigger the emergency stop (SAFETY_LOCKOUT). Default 5.
    pub max_consecutive_errors: NonZeroU32,
    /// Identical failing tool calls in a row that inject the "repeating a failed action" alert; the
    /// next identical failure locks the agent out. 1 to 1000. Default 3.
    pub repeated_failure_threshold: u32,
    /// Identical successful tool calls in a row that stop the agent as stuck. 1 to 1000. Default 3.
    pub max_repeated_tool_steps: u32,
    /// Operations (LLM calls and tool calls) in the error-cascade sliding window, 1 to 1000.
    /// Default 10.
    pub error_window: u32,
    /// Failures/anomalies within the window that lock the agent out, 1 to `error_window`. Default 8.
    pub error_window_threshold: u32,
    /// String argument values longer than this are truncated in tool-call fingerprints, 1 to
    /// 1000000. Default 200.
    pub fingerprint_value_chars: u32,
}

impl Default for SafetyBreakersConfig {
    fn default() -> Self {
        SafetyBreakersConfig {
            max_consecutive_errors: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
            repeated_failure_threshold: 3,
            max_repeated_tool_steps: 3,
            error_window: 10,
            error_window_threshold: 8,
            fingerprint_value_chars: 200,
        }
    }
}

/// Price of one model, per 1000 tokens (any currency; budgets use the same one).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Price of 1000 prompt (input) tokens, ≥ 0.
    pub prompt_per_1k: f64,
    /// Price of 1000 completion (output) tokens, ≥ 0.
    pub completion_per_1k: f64,
}

impl ModelPrice {
    /// The cost of `prompt` and `completion` tokens.
    pub fn cost(&self, prompt: u64, completion: u64) -> f64 {
        (prompt as f64 * self.prompt_per_1k + completion as f64 * self.completion_per_1k) / 1000.0
    }
}

/// `[safety.budget]`: token and cost budgets, checked before every LLM call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyBudgetConfig {
    /// Tokens (prompt + completion) one agent may use. 0 = off. Default 100000.
    pub tokens_per_agent: u64,
    /// Tokens the whole team may use. 0 = off. Default 0.
    pub tokens_per_team: u64,
    /// Tokens (prompt + completion) one agent may use in any hour (a sliding window): when spent,
    /// the agent waits until enough age out instead of stopping. 0 = off. Default 0.
    pub tokens_per_hour: u64,
    /// Cost one agent may incur (priced by `prices`). 0 = off. Default 0.
    pub cost_per_agent: f64,
    /// Cost the whole team may incur. 0 = off. Default 0.
    pub cost_per_team: f64,
    /// Remaining tokens at or below which a one-time near-budget warning is given. Default 512.
    pub reserve_tokens: u64,
    /// Fraction of a cost budget at or below which (remaining) the warning is given, 0 to 1.
    /// Default 0.1.
    pub reserve_cost_fraction: f64,
    /// Model name → price. A model missing here costs nothing unless a `"*"` entry is present.
    /// Default empty.
    pub prices: BTreeMap<String, ModelPrice>,
}

impl Default for SafetyBudgetConfig {
    fn default() -> Self {
        SafetyBudgetConfig {
            tokens_per_agent: 100_000,
            tokens_per_team: 0,
            tokens_per_hour: 0,
            cost_per_agent: 0.0,
            cost_per_team: 0.0,
            reserve_tokens: 512,
            reserve_cost_fraction: 0.1,
            prices: BTreeMap::new(),
        }
    }
}

impl SafetyBudgetConfig {
    /// The price of `model`: its entry, else the `"*"` entry, else `None` (unpriced).
    pub fn price(&self, model: &str) -> Option<ModelPrice> {
        self.prices
            .get(model)
            .or_else(|| self.prices.get("*"))
            .copied()
    }
}

/// `[execution]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutionConfig {
    /// `true`: a turn is a ReAct loop; `false`: one action per tick. Default true.
    pub multi_action_enabled: bool,
    /// LLM iterations per tick in the ReAct loop, 1 to 10. Default 5.
    pub max_iterations_per_tick: u32,
    /// The model's context window in tokens, for trimming and the 60 % / 80 % advisories. 0 = no
    /// context management. Default 0.
    pub max_context_tokens: u64,
    /// How the history is fitted into `max_context_tokens`: `sliding_window` drops the oldest
    /// messages, `compact` keeps the first message and the newest ones with a marker. Default
    /// `sliding_window`.
    pub context_strategy: ContextStrategyConfig,
    /// Automatic continuations of an answer cut by `finish_reason: length`. 0 = off. Default 2.
    pub max_tokens_recoveries: u32,
}

/// `execution.context_strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ContextStrategyConfig {
    /// Drop the oldest messages that do not fit (default).
    #[default]
    SlidingWindow,
    /// Fold the oldest messages into a summary that fits.
    Compact,
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            multi_action_enabled: true,
            max_iterations_per_tick: 5,
            max_context_tokens: 0,
            context_strategy: ContextStrategyConfig::SlidingWindow,
            max_tokens_recoveries: 2,
        }
    }
}

impl ExecutionConfig {
    /// Checks every value's range.
    ///
    /// # Errors
    ///
    /// The first value out of range, as [`ConfigError::Invalid`] (key under `execution.`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        range_u64(
            "execution.max_iterations_per_tick",
            self.max_iterations_per_tick.into(),
            1,
            10,
            "1 to 10",
        )?;
        range_u64(
            "execution.max_tokens_recoveries",
            self.max_tokens_recoveries.into(),
            0,
            10,
            "0 to 10",
        )
    }
}

/// An agent's own `execution` keys in a team file (`[[agents]] execution = {
/// multi_action_enabled = false }`): each key set replaces the team's `[execution]` value, the
/// rest are the team's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutionOverride {
    /// Replaces `execution.multi_action_enabled`.
    pub multi_action_enabled: Option<bool>,
    /// Replaces `execution.max_iterations_per_tick` (1 to 10, refused with its line otherwise).
    #[serde(deserialize_with = "iterations_per_tick")]
    pub max_iterations_per_tick: Option<u32>,
    /// Replaces `execution.max_context_tokens`.
    pub max_context_tokens: Option<u64>,
    /// Replaces `execution.context_strategy`.
    pub context_strategy: Option<ContextStrategyConfig>,
    /// Replaces `execution.max_tokens_recoveries` (0 to 10, refused with its line otherwise).
    #[serde(deserialize_with = "tokens_recoveries")]
    pub max_tokens_recoveries: Option<u32>,
}

/// A whole number from `min` to `max`, refused while parsing (so the error has its line):
/// `invalid value 11 (allowed: 1 to 10)`.
fn whole_in<'de, D: serde::Deserializer<'de>>(
    d: D,
    min: u32,
    max: u32,
) -> Result<Option<u32>, D::Error> {
    let value = i64::deserialize(d)?;
    match u32::try_from(value) {
        Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
        _ => Err(serde::de::Error::custom(format!(
            "invalid value {value} (allowed: {min} to {max})"
        ))),
    }
}

fn iterations_per_tick<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    whole_in(d, 1, 10)
}

fn tokens_recoveries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    whole_in(d, 0, 10)
}

impl ExecutionOverride {
    /// `team` with the keys this override sets replaced.
    pub fn apply(&self, team: &ExecutionConfig) -> ExecutionConfig {
        ExecutionConfig {
            multi_action_enabled: self
                .multi_action_enabled
                .unwrap_or(team.multi_action_enabled),
            max_iterations_per_tick: self
                .max_iterations_per_tick
                .unwrap_or(team.max_iterations_per_tick),
            max_context_tokens: self.max_context_tokens.unwrap_or(team.max_context_tokens),
            context_strategy: self.context_strategy.unwrap_or(team.context_strategy),
            max_tokens_recoveries: self
                .max_tokens_recoveries
                .unwrap_or(team.max_tokens_recoveries),
        }
    }
}

/// `[delegation]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DelegationConfig {
    /// Delegations one agent may run at once. 0 forbids delegation. Default 3.
    pub sub_agent_budget: u32,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        DelegationConfig {
            sub_agent_budget: 3,
        }
    }
}

/// `[tools]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Per-call timeout of a tool, unless the tool sets its own. Default 30.
    pub timeout_seconds: f64,
    /// Consecutive failures of one tool that open its circuit (calls rejected at once). Default 5.
    pub circuit_failure_threshold: NonZeroU32,
    /// How long an open circuit rejects calls before one probe call is let through. Default 30.
    pub circuit_cool_down_seconds: f64,
    /// `[tools.retry]`: how a tool call whose error is retryable is tried again (design 001), for
    /// every tool that does not set its own. Default: 4 attempts, 1 s, ×2, 10 s cap, jitter.
    pub retry: ToolRetryConfig,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig {
            timeout_seconds: 30.0,
            circuit_failure_threshold: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
            circuit_cool_down_seconds: 30.0,
            retry: ToolRetryConfig::default(),
        }
    }
}

/// How a tool call is tried again when its error is retryable (a timeout, a connection or network
/// error, "temporarily", a rate limit, "try again": design 001's `_TOOL_RETRY_CONFIG`). A
/// DANGEROUS tool is tried once unless it declares itself idempotent. `[tools.retry]`, or a tool's
/// own (`[mcp_servers.NAME] retry = { … }`, `Tool::retry`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolRetryConfig {
    /// Attempts in all, the first included: 1 (never retried) to 10. Default 4.
    pub max_attempts: u32,
    /// The delay before the second attempt, in seconds (0 to 3600). Default 1.
    pub base_seconds: f64,
    /// The delay's growth per attempt, 1 to 10. Default 2.
    pub multiplier: f64,
    /// The longest delay, in seconds (0 to 3600). Default 10.
    pub max_seconds: f64,
    /// Draw each delay from 50 % to 100 % of its value, so that many agents do not retry in step.
    /// Default true.
    pub jitter: bool,
}

impl Default for ToolRetryConfig {
    fn default() -> Self {
        ToolRetryConfig {
            max_attempts: 4,
            base_seconds: 1.0,
            multiplier: 2.0,
            max_seconds: 10.0,
            jitter: true,
        }
    }
}

impl ToolRetryConfig {
    /// One attempt, never retried.
    pub fn none() -> Self {
        ToolRetryConfig {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Checks every value's range; `at` is where the settings are (`tools.retry`,
    /// `mcp_servers.NAME.retry`), for the key in the error.
    ///
    /// # Errors
    ///
    /// The first value out of range, as [`ConfigError::Invalid`] (key `AT.KEY`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let key = |name: &str| -> Cow<'static, str> { format!("{at}.{name}").into() };
        if !(1..=10).contains(&self.max_attempts) {
            return Err(ConfigError::Invalid {
                key: key("max_attempts"),
                value: self.max_attempts.to_string(),
                allowed: "1 (no retry) to 10",
            });
        }
        for (name, value) in [
            ("base_seconds", self.base_seconds),
            ("max_seconds", self.max_seconds),
        ] {
            if !(0.0..=3600.0).contains(&value) {
                return Err(ConfigError::Invalid {
                    key: key(name),
                    value: value.to_string(),
                    allowed: "a number of seconds from 0 to 3600",
                });
            }
        }
        if !(1.0..=10.0).contains(&self.multiplier) {
            return Err(ConfigError::Invalid {
                key: key("multiplier"),
                value: self.multiplier.to_string(),
                allowed: "a number from 1 to 10",
            });
        }
        Ok(())
    }
}

/// `[mailbox]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MailboxConfig {
    /// Capacity of each agent's ordinary lane; a full lane refuses (or makes the sender wait).
    /// Halt and control lanes are unbounded. Default 65536.
    pub ordinary_capacity: NonZeroUsize,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        MailboxConfig {
            ordinary_capacity: NonZeroUsize::new(65_536).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// `[supervisor]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorConfig {
    /// Actix arbiters (threads) agents are spread over. 0 = one per core. Default 0.
    pub arbiters: usize,
    /// `[supervisor.restart]`: how often a crashed agent is restarted before the supervisor gives up.
    pub restart: RestartConfig,
    /// An agent idle this long (empty mailbox, no turn, no delegation, no timer) is *passive*: its
    /// actor stops, its cell (record, mailbox, settings) stays, and the next message starts a new
    /// actor. Agents are spawned passive. 0 = never passive (every agent keeps a running actor from
    /// its spawn on). Default 120.
    pub passivate_after_seconds: f64,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            arbiters: 0,
            restart: RestartConfig::default(),
            passivate_after_seconds: 120.0,
        }
    }
}

/// OTP restart strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RestartStrategy {
    /// Restart only the crashed agent.
    #[default]
    OneForOne,
    /// Restart every agent of the supervisor.
    OneForAll,
    /// Restart the crashed agent and every agent spawned after it.
    RestForOne,
}

/// `[supervisor.restart]`: at most `max_restarts` restarts within `within_seconds`, then give up (the
/// agent is stopped and the give-up is journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RestartConfig {
    /// Default `one_for_one`.
    pub strategy: RestartStrategy,
    /// MaxR. Default 3.
    pub max_restarts: u32,
    /// MaxT. Default 5.
    pub within_seconds: f64,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            strategy: RestartStrategy::OneForOne,
            max_restarts: 3,
            within_seconds: 5.0,
        }
    }
}

/// `[journal]`: the durable SQLite journal of `warden serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JournalConfig {
    /// Snapshot an agent's record after this many of its events since its last snapshot, so a restart
    /// replays at most this many events per agent. 0 = never (a restart replays every event).
    /// Default 1000.
    pub snapshot_every: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            snapshot_every: 1000,
        }
    }
}

fn seconds(key: &'static str, value: f64) -> Result<(), ConfigError> {
    if (0.0..=31_536_000.0).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key: key.into(),
            value: value.to_string(),
            allowed: "a number of seconds from 0 to 31536000",
        })
    }
}

fn range_u64(
    key: &'static str,
    value: u64,
    lo: u64,
    hi: u64,
    allowed: &'static str,
) -> Result<(), ConfigError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key: key.into(),
            value: value.to_string(),
            allowed,
        })
    }
}

fn non_negative(key: impl Into<Cow<'static, str>>, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key: key.into(),
            value: value.to_string(),
            allowed: "a finite number of 0 or more",
        })
    }
}

/// String-valued enums are checked before typed parsing so that a bad spelling is reported with its
/// key (serde's own message would not name it). A document that is not TOML passes (the typed parse
/// reports where the syntax error is).
pub fn precheck(text: &str) -> Result<(), ConfigError> {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Ok(()); // the typed parse reports the syntax error
    };
    let mode = doc
        .get("safety")
        .and_then(|v| v.get("on_limit"))
        .and_then(|v| v.get("mode"));
    let bad = match mode {
        None => None,
        Some(toml::Value::String(mode)) if OnLimitMode::parse(mode).is_some() => None,
        Some(toml::Value::String(mode)) => Some(format!("{mode:?}")),
        Some(other) => Some(other.to_string()),
    };
    match bad {
        None => Ok(()),
        Some(value) => Err(ConfigError::Invalid {
            key: "safety.on_limit.mode".into(),
            value,
            allowed: "interactive, auto_extend, unattended",
        }),
    }
}

/// Deserializes a TOML document. A syntax error, a value of the wrong type or an unknown key is
/// refused with where it is — line, column, the key's path — and the offending line, a caret under
/// the place:
///
/// ```text
/// invalid config: line 2, column 26: `safety.breakers.max_consecutive_errors`: invalid value: integer `0`, expected a nonzero u32
/// 2 | max_consecutive_errors = 0
///   |                          ^
/// ```
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner();
        // The parser's messages may take several lines ("unexpected …", "expected …"): one line.
        let message = inner
            .message()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        let message = if path.is_empty() || path == "." {
            message
        } else {
            format!("`{path}`: {message}")
        };
        ConfigError::Parse(match inner.span() {
            Some(span) => located(text, span, &message),
            None => message,
        })
    })
}

/// `message` placed at the byte range `span` of `text`: `line L, column C: message`, then the line
/// (numbered) and carets under the span (columns count characters, from 1).
pub fn located(text: &str, span: std::ops::Range<usize>, message: &str) -> String {
    let floor = |mut i: usize| {
        i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let mut start = floor(span.start);
    // Past the end of a file that ends with a newline: point after its last line instead.
    if start == text.len() && text.ends_with('\n') {
        start -= 1;
        // … and before the `\r` of a CRLF line end.
        if text[..start].ends_with('\r') {
            start -= 1;
        }
    }
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line_no = text[..start].matches('\n').count() + 1;
    let source = text[line_start..line_end].trim_end_matches('\r');
    let before = &text[line_start..start];
    let column = before.chars().count() + 1;
    // The place may be on a `\r` that `source` dropped (a CRLF line end): then it is past the
    // shown line's end, and the carets cover just the place.
    let end = floor(span.end).clamp(start, start.max(line_start + source.len()));
    let carets = "^".repeat(text[start..end].chars().count().max(1));
    // Tabs before the place stay tabs, so the caret lines up however they are shown.
    let pad: String = before
        .chars()
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    let gutter = " ".repeat(line_no.to_string().len());
    format!("line {line_no}, column {column}: {message}\n{line_no} | {source}\n{gutter} | {pad}{carets}")
}

impl WardenConfig {
    /// Parses and validates a TOML document. Missing sections and keys take their defaults.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] for a syntax error, an unknown section or key, or a value of the wrong
    /// type — with line, column, the key's path and the offending line (see [`parse_toml`]);
    /// [`ConfigError::Invalid`] for a value out of its range, naming the key, the value and what is
    /// allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use warden_protocols::{ConfigError, WardenConfig};
    ///
    /// let config = WardenConfig::from_toml("[safety.breakers]\nmax_consecutive_errors = 7\n").unwrap();
    /// assert_eq!(config.safety.breakers.max_consecutive_errors.get(), 7);
    /// assert_eq!(config.tools, WardenConfig::default().tools);
    ///
    /// let error = WardenConfig::from_toml("[safety]\nbrakers = {}\n").unwrap_err();
    /// assert!(matches!(error, ConfigError::Parse(_)));
    /// assert!(error.to_string().contains("line 2, column 1"), "{error}");
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        precheck(text)?;
        let config: WardenConfig = parse_toml(text)?;
        config.validate()?;
        Ok(config)
    }

    /// The full default configuration as TOML.
    pub fn defaults_toml() -> String {
        toml::to_string_pretty(&WardenConfig::default()).unwrap_or_default()
    }

    /// Checks every value's range.
    ///
    /// # Errors
    ///
    /// The first value out of range, as [`ConfigError::Invalid`] (key, value, what is allowed).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.npc.validate()?;
        self.execution.validate()?;
        seconds(
            "tools.circuit_cool_down_seconds",
            self.tools.circuit_cool_down_seconds,
        )?;
        self.tools.retry.validate("tools.retry")?;
        seconds(
            "safety.timeout.llm_call_seconds",
            self.safety.timeout.llm_call_seconds,
        )?;
        if self.safety.timeout.llm_call_seconds == 0.0 {
            return Err(ConfigError::Invalid {
                key: "safety.timeout.llm_call_seconds".into(),
                value: "0".into(),
                allowed: "a number of seconds greater than 0",
            });
        }
        seconds(
            "safety.timeout.chain_seconds",
            self.safety.timeout.chain_seconds,
        )?;
        seconds(
            "safety.timeout.task_seconds",
            self.safety.timeout.task_seconds,
        )?;
        seconds(
            "safety.on_limit.ask_timeout_seconds",
            self.safety.on_limit.ask_timeout_seconds,
        )?;
        range_u64(
            "safety.on_limit.auto_extend_times",
            self.safety.on_limit.auto_extend_times.into(),
            0,
            1000,
            "0 to 1000",
        )?;
        range_u64(
            "safety.loop.max_iterations_per_task",
            self.safety.loop_.max_iterations_per_task.into(),
            1,
            1_000_000,
            "1 to 1000000",
        )?;
        let b = &self.safety.breakers;
        range_u64(
            "safety.breakers.repeated_failure_threshold",
            b.repeated_failure_threshold.into(),
            1,
            1000,
            "1 to 1000",
        )?;
        range_u64(
            "safety.breakers.max_repeated_tool_steps",
            b.max_repeated_tool_steps.into(),
            1,
            1000,
            "1 to 1000",
        )?;
        range_u64(
            "safety.breakers.error_window",
            b.error_window.into(),
            1,
            1000,
            "1 to 1000",
        )?;
        range_u64(
            "safety.breakers.error_window_threshold",
            b.error_window_threshold.into(),
            1,
            b.error_window.into(),
            "1 to the value of safety.breakers.error_window",
        )?;
        range_u64(
            "safety.breakers.fingerprint_value_chars",
            b.fingerprint_value_chars.into(),
            1,
            1_000_000,
            "1 to 1000000",
        )?;
        let budget = &self.safety.budget;
        non_negative("safety.budget.cost_per_agent", budget.cost_per_agent)?;
        non_negative("safety.budget.cost_per_team", budget.cost_per_team)?;
        if !(0.0..=1.0).contains(&budget.reserve_cost_fraction) {
            return Err(ConfigError::Invalid {
                key: "safety.budget.reserve_cost_fraction".into(),
                value: budget.reserve_cost_fraction.to_string(),
                allowed: "a fraction from 0 to 1",
            });
        }
        for (model, price) in &budget.prices {
            // Named by its model, quoted as in the file: `safety.budget.prices."gpt-4o".…`.
            let key = |field: &str| format!("safety.budget.prices.{model:?}.{field}");
            non_negative(key("prompt_per_1k"), price.prompt_per_1k)?;
            non_negative(key("completion_per_1k"), price.completion_per_1k)?;
        }
        seconds("tools.timeout_seconds", self.tools.timeout_seconds)?;
        seconds(
            "supervisor.restart.within_seconds",
            self.supervisor.restart.within_seconds,
        )?;
        seconds(
            "supervisor.passivate_after_seconds",
            self.supervisor.passivate_after_seconds,
        )?;
        self.memory.validate()?;
        if let Err((key, value, allowed)) = self.permissions.check() {
            return Err(ConfigError::Invalid {
                key: format!("permissions.{key}").into(),
                value,
                allowed,
            });
        }
        range_u64(
            "journal.snapshot_every",
            self.journal.snapshot_every,
            0,
            100_000_000,
            "0 (never) to 100000000",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = WardenConfig::default();
        assert_eq!(c.safety.breakers.max_consecutive_errors.get(), 5);
        assert_eq!(c.execution.max_iterations_per_tick, 5);
        assert_eq!(c.delegation.sub_agent_budget, 3);
        assert_eq!(c.safety.loop_.max_agent_hops, 3);
        assert_eq!(c.safety.timeout.llm_call_seconds, 60.0);
        assert_eq!(c.safety.timeout.chain_seconds, 60.0);
        assert_eq!(c.tools.timeout_seconds, 30.0);
        assert_eq!(c.mailbox.ordinary_capacity.get(), 65_536);
        assert_eq!(c.supervisor.restart.strategy, RestartStrategy::OneForOne);
        assert_eq!(c.supervisor.restart.max_restarts, 3);
        assert_eq!(c.supervisor.passivate_after_seconds, 120.0);
        assert_eq!(c.journal.snapshot_every, 1000);
    }

    #[test]
    fn the_printed_defaults_parse_back_to_the_defaults() {
        let text = WardenConfig::defaults_toml();
        assert_eq!(WardenConfig::from_toml(&text), Ok(WardenConfig::default()));
    }

    #[test]
    fn a_partial_file_keeps_the_other_defaults() {
        let c = WardenConfig::from_toml("[delegation]\nsub_agent_budget = 7\n").unwrap();
        assert_eq!(c.delegation.sub_agent_budget, 7);
        assert_eq!(c.execution, ExecutionConfig::default());
    }

    #[test]
    fn out_of_range_value_names_key_value_and_range() {
        let err =
            WardenConfig::from_toml("[execution]\nmax_iterations_per_tick = 11\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value for `execution.max_iterations_per_tick`: 11 (allowed: 1 to 10)"
        );
        let err = WardenConfig::from_toml("[safety.timeout]\nchain_seconds = -1.0\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value for `safety.timeout.chain_seconds`: -1 (allowed: a number of seconds from 0 to 31536000)"
        );
    }

    #[test]
    fn memory_defaults_ranges_and_exact_errors() {
        let m = WardenConfig::default().memory;
        assert_eq!(
            (
                m.compaction,
                m.keep_percent,
                m.summary_percent,
                m.reflection_interval
            ),
            (true, 40, 10, 0)
        );
        assert_eq!(WardenConfig::default().safety.budget.tokens_per_hour, 0);
        let c = WardenConfig::from_toml(
            "[memory]\ncompaction = false\nkeep_percent = 70\nsummary_percent = 1\nreflection_interval = 10000\n[safety.budget]\ntokens_per_hour = 60000\n",
        )
        .unwrap();
        assert_eq!(
            (
                c.memory.compaction,
                c.memory.keep_percent,
                c.memory.summary_percent,
                c.memory.reflection_interval,
                c.safety.budget.tokens_per_hour
            ),
            (false, 70, 1, 10_000, 60_000)
        );
        assert_eq!(
            err("[memory]\nkeep_percent = 9\n"),
            "invalid value for `memory.keep_percent`: 9 (allowed: 10 to 70)"
        );
        assert_eq!(
            err("[memory]\nkeep_percent = 71\n"),
            "invalid value for `memory.keep_percent`: 71 (allowed: 10 to 70)"
        );
        assert_eq!(
            err("[memory]\nsummary_percent = 0\n"),
            "invalid value for `memory.summary_percent`: 0 (allowed: 1 to 30)"
        );
        assert_eq!(
            err("[memory]\nsummary_percent = 31\n"),
            "invalid value for `memory.summary_percent`: 31 (allowed: 1 to 30)"
        );
        assert_eq!(
            err("[memory]\nreflection_interval = 10001\n"),
            "invalid value for `memory.reflection_interval`: 10001 (allowed: 0 (off) to 10000)"
        );
        assert!(err("[memory]\nkeep = 3\n").contains(
            "unknown field `keep`, expected one of `compaction`, `keep_percent`, `summary_percent`, `reflection_interval`"
        ));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = WardenConfig::from_toml("[execution]\nmax_iteration_per_tick = 3\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: line 2, column 1: `execution.max_iteration_per_tick`: unknown field `max_iteration_per_tick`, expected one of `multi_action_enabled`, `max_iterations_per_tick`, `max_context_tokens`, `context_strategy`, `max_tokens_recoveries`\n\
             2 | max_iteration_per_tick = 3\n  \
               | ^^^^^^^^^^^^^^^^^^^^^^"
        );
    }

    #[test]
    fn zero_where_zero_is_meaningless_is_refused() {
        let err =
            WardenConfig::from_toml("[safety.breakers]\nmax_consecutive_errors = 0\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: line 2, column 26: `safety.breakers.max_consecutive_errors`: invalid value: integer `0`, expected a nonzero u32\n\
             2 | max_consecutive_errors = 0\n  \
               |                          ^"
        );
    }

    fn err(text: &str) -> String {
        WardenConfig::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn long_term_memory_keys_have_defaults_ranges_and_exact_errors() {
        let m = WardenConfig::default().memory;
        assert!(!m.long_term);
        assert_eq!(
            (
                m.max_memories,
                m.max_bytes,
                m.recall_k,
                m.recall_tokens,
                m.speaker_writes_per_minute,
                m.writes_per_minute
            ),
            (2000, 262_144, 8, 400, 6, 30)
        );
        let c = WardenConfig::from_toml(
            "[memory]\nlong_term = true\nmax_memories = 10\nmax_bytes = 4096\nrecall_k = 0\nrecall_tokens = 50\n",
        )
        .unwrap();
        assert!(c.memory.long_term && c.memory.recall_k == 0 && c.memory.max_bytes == 4096);
        for (text, message) in [
            (
                "max_memories = 9",
                "`memory.max_memories`: 9 (allowed: 10 to 1000000)",
            ),
            (
                "max_bytes = 4095",
                "`memory.max_bytes`: 4095 (allowed: 4096 to 1073741824)",
            ),
            (
                "recall_k = 65",
                "`memory.recall_k`: 65 (allowed: 0 (off) to 64)",
            ),
            (
                "recall_tokens = 49",
                "`memory.recall_tokens`: 49 (allowed: 50 to 100000)",
            ),
            (
                "speaker_writes_per_minute = 0",
                "`memory.speaker_writes_per_minute`: 0 (allowed: 1 to 10000)",
            ),
            (
                "writes_per_minute = 100001",
                "`memory.writes_per_minute`: 100001 (allowed: 1 to 100000)",
            ),
        ] {
            assert_eq!(
                err(&format!("[memory]\n{text}\n")),
                format!("invalid value for {message}")
            );
        }
    }

    #[test]
    fn tool_retries_default_to_the_designs_and_are_range_checked() {
        let retry = WardenConfig::default().tools.retry;
        assert_eq!(
            (
                retry.max_attempts,
                retry.base_seconds,
                retry.multiplier,
                retry.max_seconds,
                retry.jitter
            ),
            (4, 1.0, 2.0, 10.0, true)
        );
        let c = WardenConfig::from_toml("[tools.retry]\nmax_attempts = 1\n").unwrap();
        assert_eq!(c.tools.retry, ToolRetryConfig::none());
        assert_eq!(
            err("[tools.retry]\nmax_attempts = 0\n"),
            "invalid value for `tools.retry.max_attempts`: 0 (allowed: 1 (no retry) to 10)"
        );
        assert_eq!(
            err("[tools.retry]\nmultiplier = 0.5\n"),
            "invalid value for `tools.retry.multiplier`: 0.5 (allowed: a number from 1 to 10)"
        );
        assert_eq!(
            err("[tools.retry]\nmax_seconds = -1\n"),
            "invalid value for `tools.retry.max_seconds`: -1 (allowed: a number of seconds from 0 \
             to 3600)"
        );
        assert!(err("[tools.retry]\nattempts = 3\n").contains("unknown field `attempts`"));
    }

    #[test]
    fn safety_defaults_are_the_documented_ones() {
        let s = WardenConfig::default().safety;
        assert_eq!(s.on_limit.mode, OnLimitMode::Interactive);
        assert_eq!(s.on_limit.auto_extend_times, 1);
        assert_eq!(s.on_limit.ask_timeout_seconds, 0.0);
        assert_eq!(s.loop_.max_iterations_per_task, 50);
        assert_eq!(s.loop_.max_steps, 0);
        assert_eq!(s.timeout.task_seconds, 0.0);
        assert_eq!(s.breakers.repeated_failure_threshold, 3);
        assert_eq!(s.breakers.max_repeated_tool_steps, 3);
        assert_eq!(s.breakers.error_window, 10);
        assert_eq!(s.breakers.error_window_threshold, 8);
        assert_eq!(s.breakers.fingerprint_value_chars, 200);
        assert_eq!(s.budget.tokens_per_agent, 100_000);
        assert_eq!(s.budget.tokens_per_team, 0);
        assert_eq!(s.budget.cost_per_agent, 0.0);
        assert_eq!(s.budget.cost_per_team, 0.0);
        assert_eq!(s.budget.reserve_tokens, 512);
        assert_eq!(s.budget.reserve_cost_fraction, 0.1);
        assert!(s.budget.prices.is_empty());
    }

    #[test]
    fn a_full_safety_section_parses() {
        let c = WardenConfig::from_toml(
            r#"
[safety.on_limit]
mode = "auto_extend"
auto_extend_times = 2
ask_timeout_seconds = 30.0

[safety.loop]
max_iterations_per_task = 20
max_steps = 500

[safety.timeout]
task_seconds = 120.0

[safety.breakers]
error_window = 6
error_window_threshold = 6

[safety.budget]
tokens_per_team = 1000000
cost_per_agent = 2.5

[safety.budget.prices."gpt-4o-mini"]
prompt_per_1k = 0.00015
completion_per_1k = 0.0006
"#,
        )
        .unwrap();
        assert_eq!(c.safety.on_limit.mode, OnLimitMode::AutoExtend);
        assert_eq!(c.safety.on_limit.auto_extend_times, 2);
        assert_eq!(c.safety.loop_.max_steps, 500);
        assert_eq!(c.safety.loop_.max_agent_hops, 3);
        assert_eq!(c.safety.timeout.task_seconds, 120.0);
        assert_eq!(c.safety.breakers.error_window_threshold, 6);
        let price = c.safety.budget.price("gpt-4o-mini").unwrap();
        assert_eq!(price.completion_per_1k, 0.0006);
        assert_eq!(c.safety.budget.price("other"), None);
        let text = toml::to_string_pretty(&c).unwrap();
        assert_eq!(WardenConfig::from_toml(&text), Ok(c));
    }

    #[test]
    fn bad_safety_values_name_key_value_and_what_is_allowed() {
        assert_eq!(
            err("[safety.on_limit]\nmode = \"forever\"\n"),
            "invalid value for `safety.on_limit.mode`: \"forever\" (allowed: interactive, auto_extend, unattended)"
        );
        assert_eq!(
            err("[safety.breakers]\nerror_window = 10\nerror_window_threshold = 11\n"),
            "invalid value for `safety.breakers.error_window_threshold`: 11 (allowed: 1 to the value of safety.breakers.error_window)"
        );
        assert_eq!(
            err("[safety.breakers]\nerror_window = 4\n"),
            "invalid value for `safety.breakers.error_window_threshold`: 8 (allowed: 1 to the value of safety.breakers.error_window)"
        );
        assert_eq!(
            err("[safety.breakers]\nerror_window = 0\n"),
            "invalid value for `safety.breakers.error_window`: 0 (allowed: 1 to 1000)"
        );
        assert_eq!(
            err("[safety.breakers]\nrepeated_failure_threshold = 0\n"),
            "invalid value for `safety.breakers.repeated_failure_threshold`: 0 (allowed: 1 to 1000)"
        );
        assert_eq!(
            err("[safety.loop]\nmax_iterations_per_task = 0\n"),
            "invalid value for `safety.loop.max_iterations_per_task`: 0 (allowed: 1 to 1000000)"
        );
        assert_eq!(
            err("[safety.on_limit]\nask_timeout_seconds = -5.0\n"),
            "invalid value for `safety.on_limit.ask_timeout_seconds`: -5 (allowed: a number of seconds from 0 to 31536000)"
        );
        assert_eq!(
            err("[supervisor]\npassivate_after_seconds = -1.0\n"),
            "invalid value for `supervisor.passivate_after_seconds`: -1 (allowed: a number of seconds from 0 to 31536000)"
        );
        assert_eq!(
            err("[safety.timeout]\ntask_seconds = nan\n"),
            "invalid value for `safety.timeout.task_seconds`: NaN (allowed: a number of seconds from 0 to 31536000)"
        );
        assert_eq!(
            err("[safety.budget]\nreserve_cost_fraction = 1.5\n"),
            "invalid value for `safety.budget.reserve_cost_fraction`: 1.5 (allowed: a fraction from 0 to 1)"
        );
        assert_eq!(
            err("[safety.budget]\ncost_per_team = -1.0\n"),
            "invalid value for `safety.budget.cost_per_team`: -1 (allowed: a finite number of 0 or more)"
        );
        assert_eq!(
            err("[safety.budget.prices.m]\nprompt_per_1k = -0.5\ncompletion_per_1k = 1.0\n"),
            "invalid value for `safety.budget.prices.\"m\".prompt_per_1k`: -0.5 (allowed: a finite number of 0 or more)"
        );
        assert_eq!(
            err("[execution]\nmax_iterations_per_tick = 0\n"),
            "invalid value for `execution.max_iterations_per_tick`: 0 (allowed: 1 to 10)"
        );
    }

    #[test]
    fn unknown_safety_keys_are_errors() {
        assert_eq!(
            err("[safety.on_limit]\nmode = \"unattended\"\nauto_extend = 3\n"),
            "invalid config: line 3, column 1: `safety.on_limit.auto_extend`: unknown field `auto_extend`, expected one of `mode`, `auto_extend_times`, `ask_timeout_seconds`\n\
             3 | auto_extend = 3\n  \
               | ^^^^^^^^^^^"
        );
        assert_eq!(
            err("[safety.budget.prices.m]\nprompt_per_1k = 1.0\ncompletion_per_1k = 1.0\ncached_per_1k = 0.1\n"),
            "invalid config: line 4, column 1: `safety.budget.prices.m.cached_per_1k`: unknown field `cached_per_1k`, expected `prompt_per_1k` or `completion_per_1k`\n\
             4 | cached_per_1k = 0.1\n  \
               | ^^^^^^^^^^^^^"
        );
        assert_eq!(
            err("[safety.breakers]\nerror_windows = 3\n"),
            "invalid config: line 2, column 1: `safety.breakers.error_windows`: unknown field `error_windows`, expected one of `max_consecutive_errors`, `repeated_failure_threshold`, `max_repeated_tool_steps`, `error_window`, `error_window_threshold`, `fingerprint_value_chars`\n\
             2 | error_windows = 3\n  \
               | ^^^^^^^^^^^^^"
        );
    }

    #[test]
    fn a_syntax_error_gives_line_column_and_the_line() {
        assert_eq!(
            err("[execution]\nmax_iterations_per_tick = 3\n\n[tools]\ntimeout_seconds = \"30\nx = 1\n"),
            "invalid config: line 5, column 22: invalid basic string\n\
             5 | timeout_seconds = \"30\n  \
               |                      ^"
        );
        // A place past the end of the file is shown after its last line; columns count characters.
        assert_eq!(
            located("a = 1\nb = \"é\" x\n", 13..14, "m"),
            "line 2, column 7: m\n2 | b = \"é\" x\n  |       ^"
        );
        assert_eq!(
            located("a = [\n", 7..7, "m"),
            "line 1, column 6: m\n1 | a = [\n  |      ^"
        );
    }

    /// Found by `fuzz/` (config_toml): a place on the `\r` of a `\r\n` line end lies past the shown
    /// line (which drops its trailing `\r`s), and the caret range was then clamped with its lower
    /// bound above its upper one, which panics. A CRLF file that ends inside an array did that.
    #[test]
    fn a_place_on_a_carriage_return_does_not_panic() {
        assert_eq!(
            err("a = [\r\n"),
            "invalid config: line 1, column 6: invalid array; expected `]`\n1 | a = [\n  |      ^"
        );
        for text in ["x = \"\"\"\r\n", "a = [1,\r\n\r\n"] {
            assert!(err(text).starts_with("invalid config: line "), "{text:?}");
        }
        assert_eq!(
            located("a = 1\r\r\n", 6..7, "m"),
            "line 1, column 7: m\n1 | a = 1\n  |       ^"
        );
    }

    #[test]
    fn permissions_parse_and_bad_values_are_refused_with_key_and_line() {
        let c = WardenConfig::from_toml(
            "[permissions]\ndangerous = \"ask\"\nmode = \"auto_extend\"\nremember_minutes = 30\n\n[[permissions.rules]]\ntool = \"fs__*\"\narg = \"/path\"\nglob = \"notes/*\"\nverdict = \"allow\"\n",
        )
        .unwrap();
        assert_eq!(c.permissions.dangerous, crate::PermissionVerdict::Ask);
        assert_eq!(c.permissions.mode, OnLimitMode::AutoExtend);
        assert_eq!(c.permissions.rules.len(), 1);
        let text = toml::to_string_pretty(&c).unwrap();
        assert_eq!(WardenConfig::from_toml(&text), Ok(c));
        assert_eq!(
            err("[permissions]\ndangerous = \"maybe\"\n"),
            "invalid config: line 2, column 13: `permissions.dangerous`: unknown variant `maybe`, expected one of `allow`, `deny`, `ask`\n\
             2 | dangerous = \"maybe\"\n  \
               |             ^^^^^^^"
        );
        assert_eq!(
            err("[permissions]\nremember_minutes = 10081\n"),
            "invalid value for `permissions.remember_minutes`: 10081 (allowed: 0 (until the task ends) to 10080 (a week))"
        );
        assert_eq!(
            err("[permissions]\nask_timeout_seconds = -1.0\n"),
            "invalid value for `permissions.ask_timeout_seconds`: -1 (allowed: a number of seconds from 0 to 31536000)"
        );
        assert_eq!(
            err("[permissions]\n\n[[permissions.rules]]\ntool = \"x\"\narg = \"/p\"\nregex = \"[\"\nverdict = \"deny\"\n"),
            "invalid config: line 3, column 1: `permissions.rules[0]`: invalid value for `regex`: \"[\" (error: unclosed character class) (allowed: a regular expression in the syntax of the Rust `regex` crate)\n\
             3 | [[permissions.rules]]\n  \
               | ^^^^^^^^^^^^^^^^^^^^^"
        );
        assert!(err("[permissions]\ndangerus = \"ask\"\n").contains(
            "unknown field `dangerus`, expected one of `safe_chain`, `terminal`, `dangerous`, `mode`, `remember_minutes`, `ask_timeout_seconds`, `rules`"
        ));
    }

    #[test]
    fn a_mode_of_the_wrong_type_is_refused_with_its_key() {
        assert_eq!(
            err("[safety.on_limit]\nmode = 3\n"),
            "invalid value for `safety.on_limit.mode`: 3 (allowed: interactive, auto_extend, unattended)"
        );
    }
}
