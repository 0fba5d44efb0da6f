//! warden's protocol: the typed vocabulary that the actors, the journal, the CLI and the HTTP API share.
//!
//! Everything here is plain data with serde derives — no actor runtime, no I/O — so that a journal written
//! by one process can be replayed by another, and so that the wire format is reviewed in one place.
//!
//! * [`Priority`] — the four mailbox lanes, ordered (`SystemHalt` < `Control` < `Supervision` < `Ordinary`).
//! * [`AgentState`] — the lifecycle, with every legal transition in one table ([`TRANSITIONS`]).
//! * [`Event`] / [`EventKind`] — everything that happens to an agent. [`AgentRecord::apply`] folds events
//!   into state; the live agent changes its record *only* by applying the events it journals, so a record
//!   rebuilt from the journal is the record the agent had.
//! * [`AgentStatus`] — the JSON status snapshot.
//! * [`ChatMessage`], [`ToolCall`], [`ToolSpec`] — Chat Completions wire types.
//! * [`WardenConfig`] — the configuration file, with defaults and validation.

#![deny(clippy::unwrap_used)]
#![deny(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]
#![warn(missing_debug_implementations, missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod a2a;
pub mod cluster;
mod config;
mod event;
mod mcp;
pub mod memory;
pub mod npc;
mod permissions;
mod priority;
mod record;
mod refusal;
mod safety;
mod state;
mod status;
mod wire;

pub use config::{
    located, parse_toml, precheck, ConfigError, ContextStrategyConfig, DelegationConfig,
    ExecutionConfig, ExecutionOverride, JournalConfig, MailboxConfig, MemoryConfig, MemoryOverride,
    ModelPrice, RestartConfig, RestartStrategy, SafetyBreakersConfig, SafetyBudgetConfig,
    SafetyConfig, SafetyLoopConfig, SafetyOnLimitConfig, SafetyTimeoutConfig, SupervisorConfig,
    ToolRetryConfig, ToolsConfig, WardenConfig,
};
pub use event::{
    Breaker, DelegationOutcome, DiscardedMessage, Event, EventFate, EventKind, HaltCause,
    TurnOutcome, RECOVERY_CAUSE,
};
pub use mcp::{valid_server_name, McpServerConfig, McpToolSelector, MCP_NAME_SEPARATOR};
pub use permissions::{
    glob_match, permission_refusal, PermissionAsk, PermissionDecision, PermissionPolicy,
    PermissionReason, PermissionRule, PermissionVerdict, PermissionsConfig, PermissionsOverride,
    RuleError, Ruling,
};
pub use priority::Priority;
pub use record::{
    check_goals, A2aTaskRef, AgentRecord, KeyedEvent, Lockout, Outstanding, PendingEvent,
    UsageTotals, MAX_GOALS, MAX_GOAL_CHARS,
};
pub use refusal::{DelegationRefusal, WorkRefusal};
pub use safety::{
    AnomalyKind, Answer, AnsweredBy, FleetView, Intervention, LimitDecision, LimitKind,
    LimitReason, LlmOutcome, OnLimitMode, OperatorReply, ToolOutcome,
};
pub use state::{AgentState, IllegalTransition, Presence, TRANSITIONS};
pub use status::{AgentStatus, NpcStatus, QueueDepths, TickStatus};
pub use wire::{
    AgentKey, AgentRole, ChatMessage, ChatRole, FinishReason, FunctionCall, TerminationReason,
    ToolCall, ToolCategory, ToolSpec, Usage, UserEvent, CHARS_PER_TOKEN, MESSAGE_OVERHEAD_TOKENS,
};
