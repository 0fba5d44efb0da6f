//! warden's actors: the priority mailbox, the agent, the supervisor, providers and tools.
//!
//! Where to look:
//! * [`mailbox`] — four priority lanes on top of actix (halt › control › supervision › ordinary).
//! * `agent` — the agent actor, its shared cell and its turn (the ReAct loop); [`AgentHandle`].
//! * `supervisor` — [`Supervisor`]: registry, delegation budgets, halt propagation, restarts.
//! * `provider` — the [`Provider`] trait and the [`ScriptedProvider`].
//! * [`tools`] — the [`Tool`] trait, [`ToolRegistry`] and the call pipeline [`ToolRunner`].
//! * `journal` — the [`Journal`] trait and [`MemoryJournal`].
//! * [`telemetry`] — the GenAI trace spans (`invoke_agent`, `chat`, `execute_tool`), `tracing` only.
//! * [`safety`] — breakers, budgets, fingerprints and the limit checkpoint ([`AgentBreakers`],
//!   [`LimitCheckpoint`]).

#![warn(missing_debug_implementations)]

mod agent;
#[cfg(all(feature = "fuzzing", feature = "openai"))]
#[doc(hidden)]
/// Entry points to private parsers for `fuzz/` only (feature `fuzzing`). Not a public API.
pub mod fuzzing {
    pub use crate::provider::fuzzing::*;
}
pub mod context;
mod journal;
pub mod mailbox;
mod provider;
pub mod safety;
mod supervisor;
mod sync;
pub mod telemetry;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
pub mod tools;

pub use agent::{
    AgentHandle, AskError, ControlError, ControlOp, DurableSendError, EventSendError, HaltAck,
    PendingReply, Reply, Settled, Settlement, Submit, SubmitError, Submitted, TaskError,
};
pub use context::{Advisory, ContextStrategy, Trimmed};
pub use journal::{already_durable, now_ms, Journal, MemoryJournal, NotDurable, NullJournal};
#[cfg(feature = "openai")]
pub use provider::{
    retry_class, retry_counts, AttemptObserver, FailedAttempt, OpenAiCompatible, OpenAiConfig,
    OpenAiSetupError, RetryPolicy, StreamEvent, ToolFormat, RETRY_CLASSES,
};
pub use provider::{
    LlmRequest, LlmResponse, Provider, ProviderError, ScriptStats, ScriptStep, ScriptedProvider,
};
pub use safety::{
    AgentBreakers, ChannelInterventionBus, Fingerprint, InterventionBus, LimitCheckpoint,
    LimitContext, TeamBudget, Verdict,
};
pub use supervisor::{
    AgentSpec, DelegationError, SpawnError, Supervisor, SupervisorBuilder, UnknownAgent,
};
pub use tools::{
    Admission, CachePolicy, CacheScope, CircuitConfig, CircuitStep, FnTool, PendingCall, Tool,
    ToolContext, ToolError, ToolPolicy, ToolRegistry, ToolResultCache, ToolRun, ToolRunner,
};
