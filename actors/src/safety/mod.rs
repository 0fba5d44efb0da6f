//! The safety core: budgets, behavioural breakers and the limit checkpoint (design docs 002–004).
//!
//! * [`AgentBreakers`] — one agent's synchronous breaker state machine. Hooks:
//!   [`AgentBreakers::on_loop_start`] (loop cap, steps, task wall clock),
//!   [`AgentBreakers::before_llm_call`] (token/cost budgets, agent and team),
//!   [`AgentBreakers::record_usage`], [`AgentBreakers::after_llm_call`] and
//!   [`AgentBreakers::after_tool_execution`] (repetition alert and lockout, stuck, consecutive errors,
//!   error cascade). Each returns a [`Verdict`]; the caller makes the state transition.
//! * [`TeamBudget`] — team-wide tokens and cost, and the [`FleetView`](warden_protocols::FleetView).
//! * [`Fingerprint`] — tool name + canonicalised arguments.
//! * [`LimitCheckpoint::handle_limit_exceeded`] — the one policy (`safety.on_limit`) for every
//!   checkpointed limit, asking through an [`InterventionBus`] in interactive mode.
//! * [`PermissionGate::decide`] — the permission gate before a tool call (`[permissions]`):
//!   allow, deny, or ask through the same bus.
//!
//! # Invariants
//! * Nothing here owns agent state: verdicts are advice the agent's turn must obey, and the breakers
//!   are fail-closed (a lockout repeats on every hook until unlocked; every unclear checkpoint path
//!   refuses).
//! * Nothing here holds a lock across an await.
//! * No panics on model- or user-influenced data (arguments, answers, usage numbers).

mod breakers;
mod budget;
mod fingerprint;
mod gate;
mod intervention;
mod limits;
mod monitor;
mod permission;

pub(crate) use breakers::BreakersShared;
pub use breakers::{AgentBreakers, Verdict, REPETITION_ALERT};
pub use budget::{BudgetSlices, SliceOf, TeamBudget, UsageTotals};
pub(crate) use fingerprint::canonical_json_cut;
pub use fingerprint::{canonical_call, Fingerprint};
pub use gate::{AgentFence, ModelGate, FENCE_POLL};
pub use intervention::{AnswerError, BusError, ChannelInterventionBus, InterventionBus};
pub use limits::{limit_question, limit_refusal_message, LimitCheckpoint, LimitContext};
pub(crate) use monitor::TeamSafety;
pub use monitor::{Cleared, GetSafetyReport, SafetyMonitor, SafetyReport, TripNotice};
pub use permission::{permission_question, PermissionGate, PermissionRequest};
