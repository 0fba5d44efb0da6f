//! The configuration file (TOML). Every section and key has a documented default; unknown keys are
//! errors; invalid values are refused with the key, the value and what is allowed.

use serde::{Deserialize, Serialize};
use std::num::{NonZeroU32, NonZeroUsize};

/// A configuration that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("invalid config: {0}")]
    Parse(String),
    /// A value is out of range.
    #[error("invalid value for `{key}`: {value} (allowed: {allowed})")]
    Invalid {
        key: &'static str,
        value: String,
        allowed: &'static str,
    },
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WardenConfig {
    pub safety: SafetyConfig,
    pub execution: ExecutionConfig,
    pub delegation: DelegationConfig,
    pub tools: ToolsConfig,
    pub mailbox: MailboxConfig,
    pub supervisor: SupervisorConfig,
}

/// `[safety]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyConfig {
    #[serde(rename = "loop")]
    pub loop_: SafetyLoopConfig,
    pub timeout: SafetyTimeoutConfig,
    pub breakers: SafetyBreakersConfig,
}

/// `[safety.loop]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyLoopConfig {
    /// Longest delegation chain (assistant → sub-agent is hop 1). 0 forbids delegation. Default 3.
    pub max_agent_hops: u32,
}

impl Default for SafetyLoopConfig {
    fn default() -> Self {
        SafetyLoopConfig { max_agent_hops: 3 }
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
}

impl Default for SafetyTimeoutConfig {
    fn default() -> Self {
        SafetyTimeoutConfig {
            llm_call_seconds: 60.0,
            chain_seconds: 60.0,
        }
    }
}

/// `[safety.breakers]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyBreakersConfig {
    /// Failed tool/LLM calls in a row that trigger the emergency stop (SAFETY_LOCKOUT). Default 5.
    pub max_consecutive_errors: NonZeroU32,
}

impl Default for SafetyBreakersConfig {
    fn default() -> Self {
        SafetyBreakersConfig {
            max_consecutive_errors: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
        }
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
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            multi_action_enabled: true,
            max_iterations_per_tick: 5,
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
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig {
            timeout_seconds: 30.0,
        }
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
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorConfig {
    /// Actix arbiters (threads) agents are spread over. 0 = one per core. Default 0.
    pub arbiters: usize,
    pub restart: RestartConfig,
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

fn seconds(key: &'static str, value: f64) -> Result<(), ConfigError> {
    if (0.0..=31_536_000.0).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key,
            value: value.to_string(),
            allowed: "a number of seconds from 0 to 31536000",
        })
    }
}

impl WardenConfig {
    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: WardenConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.message().to_owned()))?;
        config.validate()?;
        Ok(config)
    }

    /// The full default configuration as TOML.
    pub fn defaults_toml() -> String {
        toml::to_string_pretty(&WardenConfig::default()).unwrap_or_default()
    }

    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let iterations = self.execution.max_iterations_per_tick;
        if !(1..=10).contains(&iterations) {
            return Err(ConfigError::Invalid {
                key: "execution.max_iterations_per_tick",
                value: iterations.to_string(),
                allowed: "1 to 10",
            });
        }
        seconds(
            "safety.timeout.llm_call_seconds",
            self.safety.timeout.llm_call_seconds,
        )?;
        if self.safety.timeout.llm_call_seconds == 0.0 {
            return Err(ConfigError::Invalid {
                key: "safety.timeout.llm_call_seconds",
                value: "0".into(),
                allowed: "a number of seconds greater than 0",
            });
        }
        seconds(
            "safety.timeout.chain_seconds",
            self.safety.timeout.chain_seconds,
        )?;
        seconds("tools.timeout_seconds", self.tools.timeout_seconds)?;
        seconds(
            "supervisor.restart.within_seconds",
            self.supervisor.restart.within_seconds,
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
    fn unknown_keys_are_errors() {
        let err = WardenConfig::from_toml("[execution]\nmax_iteration_per_tick = 3\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: unknown field `max_iteration_per_tick`, expected `multi_action_enabled` or `max_iterations_per_tick`"
        );
    }

    #[test]
    fn zero_where_zero_is_meaningless_is_refused() {
        let err =
            WardenConfig::from_toml("[safety.breakers]\nmax_consecutive_errors = 0\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: invalid value: integer `0`, expected a nonzero u32"
        );
    }
}
