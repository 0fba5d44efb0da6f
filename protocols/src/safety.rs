//! Shared safety vocabulary: limit kinds, limit-checkpoint decisions and reasons, operator
//! interventions, tool-call outcomes and the fleet view of the team budget.
//!
//! Plain serde data. The state machines that produce these values live in `warden_actors::safety`.
//!
//! # Invariants
//! * Every [`LimitKind`] names exactly one config key ([`LimitKind::config_key`]); the refusal message
//!   and the operator's question quote that key, so an operator always knows what to change.
//! * A [`LimitDecision`] with `allow == false` always has `extension == 0`.
//! * Only [`Answer::Yes`] allows; anything else an operator says refuses (fail closed).

use crate::AgentKey;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What `safety.on_limit.mode` does when a limit is hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnLimitMode {
    /// Ask an operator through the intervention bus; refuse on no, timeout or no bus. The default.
    #[default]
    Interactive,
    /// Extend automatically up to `safety.on_limit.auto_extend_times` per (run, limit kind).
    AutoExtend,
    /// Refuse at once; never ask.
    Unattended,
}

impl OnLimitMode {
    /// Every mode, in documentation order.
    pub const ALL: [OnLimitMode; 3] = [
        OnLimitMode::Interactive,
        OnLimitMode::AutoExtend,
        OnLimitMode::Unattended,
    ];

    /// The config spelling (`interactive`, `auto_extend`, `unattended`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnLimitMode::Interactive => "interactive",
            OnLimitMode::AutoExtend => "auto_extend",
            OnLimitMode::Unattended => "unattended",
        }
    }

    /// Parses the config spelling.
    pub fn parse(text: &str) -> Option<Self> {
        OnLimitMode::ALL.into_iter().find(|m| m.as_str() == text)
    }
}

impl fmt::Display for OnLimitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A bounded operation that flows through the limit checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Loop iterations within one task (`safety.loop.max_iterations_per_task`).
    IterationsPerTask,
    /// LLM iterations within one tick (`execution.max_iterations_per_tick`).
    IterationsPerTick,
    /// Loop iterations of the agent over its life (`safety.loop.max_steps`).
    Steps,
    /// Delegation chain length (`safety.loop.max_agent_hops`).
    AgentHops,
    /// Concurrent delegations of one agent (`delegation.sub_agent_budget`).
    SubAgentBudget,
    /// Wall clock of one task — the design's "phase wall clock" (`safety.timeout.task_seconds`).
    TaskWallClock,
    /// How long a delegator waits for its delegate (`safety.timeout.chain_seconds`).
    ChainWait,
    /// One LLM request (`safety.timeout.llm_call_seconds`).
    LlmCallTimeout,
}

impl LimitKind {
    /// Every kind.
    pub const ALL: [LimitKind; 8] = [
        LimitKind::IterationsPerTask,
        LimitKind::IterationsPerTick,
        LimitKind::Steps,
        LimitKind::AgentHops,
        LimitKind::SubAgentBudget,
        LimitKind::TaskWallClock,
        LimitKind::ChainWait,
        LimitKind::LlmCallTimeout,
    ];

    /// The wire name (`iterations_per_task`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::IterationsPerTask => "iterations_per_task",
            LimitKind::IterationsPerTick => "iterations_per_tick",
            LimitKind::Steps => "steps",
            LimitKind::AgentHops => "agent_hops",
            LimitKind::SubAgentBudget => "sub_agent_budget",
            LimitKind::TaskWallClock => "task_wall_clock",
            LimitKind::ChainWait => "chain_wait",
            LimitKind::LlmCallTimeout => "llm_call_timeout",
        }
    }

    /// The config key that sets this limit.
    pub fn config_key(self) -> &'static str {
        match self {
            LimitKind::IterationsPerTask => "safety.loop.max_iterations_per_task",
            LimitKind::IterationsPerTick => "execution.max_iterations_per_tick",
            LimitKind::Steps => "safety.loop.max_steps",
            LimitKind::AgentHops => "safety.loop.max_agent_hops",
            LimitKind::SubAgentBudget => "delegation.sub_agent_budget",
            LimitKind::TaskWallClock => "safety.timeout.task_seconds",
            LimitKind::ChainWait => "safety.timeout.chain_seconds",
            LimitKind::LlmCallTimeout => "safety.timeout.llm_call_seconds",
        }
    }

    /// A short human description ("iterations per task", …).
    pub fn describe(self) -> &'static str {
        match self {
            LimitKind::IterationsPerTask => "iterations per task",
            LimitKind::IterationsPerTick => "iterations per tick",
            LimitKind::Steps => "total loop steps",
            LimitKind::AgentHops => "delegation hops",
            LimitKind::SubAgentBudget => "concurrent sub-agents",
            LimitKind::TaskWallClock => "task wall-clock time",
            LimitKind::ChainWait => "delegation wait time",
            LimitKind::LlmCallTimeout => "LLM call time",
        }
    }

    /// The unit of `current` / `configured` values of this kind: `""` for counts, `"s"` for seconds.
    pub fn unit(self) -> &'static str {
        match self {
            LimitKind::TaskWallClock | LimitKind::ChainWait | LimitKind::LlmCallTimeout => "s",
            _ => "",
        }
    }
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the limit checkpoint decided as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitReason {
    /// `mode = unattended`: refused without asking.
    Unattended,
    /// `mode = auto_extend`, within `auto_extend_times`: allowed.
    AutoExtended,
    /// `mode = auto_extend`, `auto_extend_times` already granted for this (run, kind): refused.
    /// (The design doc reports this as `unattended`; warden names it so the operator knows that raising
    /// `safety.on_limit.auto_extend_times` would help.)
    AutoExtendExhausted,
    /// `mode = interactive`, the operator said yes.
    UserApproved,
    /// `mode = interactive`, the operator said no (or anything but yes), or the bus failed.
    UserRefused,
    /// `mode = interactive`, `ask_timeout_seconds` elapsed without an answer.
    AskTimeout,
    /// `mode = interactive` but no intervention bus is wired (headless run).
    NoBus,
}

impl LimitReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitReason::Unattended => "unattended",
            LimitReason::AutoExtended => "auto_extended",
            LimitReason::AutoExtendExhausted => "auto_extend_exhausted",
            LimitReason::UserApproved => "user_approved",
            LimitReason::UserRefused => "user_refused",
            LimitReason::AskTimeout => "ask_timeout",
            LimitReason::NoBus => "no_bus",
        }
    }
}

impl fmt::Display for LimitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer of the limit checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitDecision {
    /// `true`: the limit is extended once by its configured amount and the operation continues.
    pub allow: bool,
    /// When allowed, how many extensions have now been granted for this (run, kind), this one
    /// included (1 for the first). 0 when refused.
    pub extension: u32,
    /// Who or what decided.
    pub reason: LimitReason,
    /// Who answered, when an operator decided (`user_approved`, `user_refused`) and the bus said
    /// who: the audit trail of `limit_decided`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<AnsweredBy>,
}

impl LimitDecision {
    /// A refusal for `reason` (no extension).
    pub fn refuse(reason: LimitReason) -> Self {
        LimitDecision {
            allow: false,
            extension: 0,
            reason,
            answered_by: None,
        }
    }

    /// The decision, recording who answered.
    pub fn answered_by(mut self, by: Option<AnsweredBy>) -> Self {
        self.answered_by = by;
        self
    }
}

/// Who answered an ask, and the note they gave (kept in the journal with the decision).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnsweredBy {
    /// E.g. `api:admin` (the HTTP API's admin token), `tty` (`warden run`'s terminal).
    pub operator: String,
    /// The note they gave with the answer, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// An operator's [`Answer`] to an intervention, with its author, as an intervention bus delivers it.
/// (Not an agent's reply to an event: that is `warden::Reply`.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorReply {
    /// Yes, no, or what else they said.
    pub answer: Answer,
    /// `None`: an anonymous answer (an embedder's bus that does not say who).
    pub by: Option<AnsweredBy>,
}

impl OperatorReply {
    /// `answer`, given by `operator` with an optional note.
    pub fn by(answer: Answer, operator: impl Into<String>, note: Option<String>) -> Self {
        OperatorReply {
            answer,
            by: Some(AnsweredBy {
                operator: operator.into(),
                note,
            }),
        }
    }
}

impl From<Answer> for OperatorReply {
    fn from(answer: Answer) -> Self {
        OperatorReply { answer, by: None }
    }
}

/// A yes/no question to an operator: about a limit (`kind` set), or about a tool call the
/// permission gate holds (`permission` set).
///
/// Asks written before the permission gate always have `kind`; a permission ask has no `kind`
/// (`current` and `configured` are 0, `config_key` is the key whose `ask` verdict asked).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intervention {
    /// Unique within the process; the operator answers by this id.
    pub id: u64,
    /// The agent that asks.
    pub agent: AgentKey,
    /// The run (task) the ask comes from.
    pub run_id: String,
    /// Which limit; `None` for a permission ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<LimitKind>,
    /// The value reached (count, or seconds); 0 for a permission ask.
    pub current: f64,
    /// The configured limit (count, or seconds), extensions included; 0 for a permission ask.
    pub configured: f64,
    /// The key to raise (`LimitKind::config_key`), or the key whose `ask` verdict asked.
    pub config_key: String,
    /// The question shown to the operator.
    pub question: String,
    /// The tool call a permission ask is about; `None` for a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<crate::PermissionAsk>,
}

/// An operator's answer. Only `Yes` allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Allow the extension.
    Yes,
    /// Refuse it.
    No,
    /// Anything else the operator said; treated as no.
    Other(String),
}

impl std::fmt::Display for Answer {
    /// `yes`, `no`, or what else was said.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Yes => f.write_str("yes"),
            Answer::No => f.write_str("no"),
            Answer::Other(text) => f.write_str(text),
        }
    }
}

impl Answer {
    /// `yes`/`y` → `Yes`, `no`/`n` → `No` (trimmed, case-insensitive), anything else → `Other`.
    pub fn parse(text: &str) -> Self {
        match text.trim().to_ascii_lowercase().as_str() {
            "yes" | "y" => Answer::Yes,
            "no" | "n" => Answer::No,
            _ => Answer::Other(text.to_owned()),
        }
    }
}

/// Why a tool call or a model output was malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    /// The model's output or tool arguments were not valid JSON.
    InvalidJson,
    /// The model called a tool that does not exist.
    UnknownTool,
    /// The arguments did not fit the tool.
    BadArguments,
}

/// How one tool call ended, as the breakers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "kind", rename_all = "snake_case")]
pub enum ToolOutcome {
    /// The tool returned a result.
    Ok,
    /// The tool ran and failed (error, timeout, panic).
    Failed,
    /// The call could not be made.
    Anomaly(AnomalyKind),
}

/// How one LLM call ended, as the breakers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "kind", rename_all = "snake_case")]
pub enum LlmOutcome {
    /// A final answer (no tool calls): a productive success.
    Answer,
    /// The model asked for tools: neither a failure nor a productive success.
    ToolCalls,
    /// The call failed (provider error, timeout, panic).
    Failed,
    /// The output could not be used (e.g. invalid JSON).
    Anomaly(AnomalyKind),
}

/// The team budget as the monitor shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    /// Tokens used by the whole team (prompt + completion).
    pub tokens: u64,
    /// Cost of the whole team, in the price currency.
    pub cost: f64,
    /// `safety.budget.tokens_per_team` (0 = off).
    pub token_limit: u64,
    /// `safety.budget.cost_per_team` (0 = off).
    pub cost_limit: f64,
    /// Agents in the team.
    pub agents_total: usize,
    /// Agents in `SAFETY_LOCKOUT` now.
    pub agents_locked_out: usize,
    /// Keys of the locked-out agents, sorted.
    pub locked_out: Vec<AgentKey>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_their_spelling() {
        for m in OnLimitMode::ALL {
            assert_eq!(OnLimitMode::parse(m.as_str()), Some(m));
            assert_eq!(
                serde_json::to_string(&m).unwrap(),
                format!("\"{}\"", m.as_str())
            );
        }
        assert_eq!(OnLimitMode::parse("Interactive"), None);
    }

    #[test]
    fn kinds_serialize_as_their_wire_name() {
        for k in LimitKind::ALL {
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.as_str())
            );
        }
        for r in [
            LimitReason::Unattended,
            LimitReason::AutoExtended,
            LimitReason::AutoExtendExhausted,
            LimitReason::UserApproved,
            LimitReason::UserRefused,
            LimitReason::AskTimeout,
            LimitReason::NoBus,
        ] {
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", r.as_str())
            );
        }
    }

    #[test]
    fn an_ask_written_before_the_permission_gate_still_reads_and_a_limit_ask_writes_as_before() {
        let old = r#"{"id":3,"agent":"a","run_id":"a#1","kind":"agent_hops","current":4.0,"configured":3.0,"config_key":"safety.loop.max_agent_hops","question":"continue?"}"#;
        let iv: Intervention = serde_json::from_str(old).unwrap();
        assert_eq!(
            (iv.kind, iv.permission.as_ref()),
            (Some(LimitKind::AgentHops), None)
        );
        assert_eq!(serde_json::to_string(&iv).unwrap(), old);
        let permission = Intervention {
            kind: None,
            permission: Some(crate::PermissionAsk {
                call_id: "call_1".into(),
                tool: "rm".into(),
                category: crate::ToolCategory::Dangerous,
                arguments: serde_json::json!({"path": "x"}),
                rule: "permissions.dangerous".into(),
                last_message: None,
            }),
            ..iv
        };
        let text = serde_json::to_string(&permission).unwrap();
        assert!(!text.contains("\"kind\""), "{text}");
        assert!(text.contains(r#""permission":{"call_id":"call_1","tool":"rm","category":"DANGEROUS","arguments":{"path":"x"},"rule":"permissions.dangerous"}"#), "{text}");
        assert_eq!(
            serde_json::from_str::<Intervention>(&text).unwrap(),
            permission
        );
    }

    #[test]
    fn only_yes_allows() {
        assert_eq!(Answer::parse(" YES "), Answer::Yes);
        assert_eq!(Answer::parse("y"), Answer::Yes);
        assert_eq!(Answer::parse("No"), Answer::No);
        assert_eq!(Answer::parse("sure"), Answer::Other("sure".into()));
    }

    #[test]
    fn outcomes_have_a_tagged_wire_form() {
        assert_eq!(
            serde_json::to_string(&ToolOutcome::Anomaly(AnomalyKind::UnknownTool)).unwrap(),
            r#"{"outcome":"anomaly","kind":"unknown_tool"}"#
        );
        assert_eq!(
            serde_json::to_string(&ToolOutcome::Ok).unwrap(),
            r#"{"outcome":"ok"}"#
        );
    }
}
