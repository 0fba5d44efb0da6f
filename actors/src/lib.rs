//! warden's actors: the priority mailbox, the agent, the supervisor, providers and tools.
//!
//! Where to look:
//! * [`mailbox`] — four priority lanes on top of actix (halt › control › supervision › ordinary).
//! * `agent` — the agent actor, its shared cell and its turn (the ReAct loop); [`AgentHandle`].
//! * `supervisor` — [`Supervisor`]: registry, delegation budgets, halt propagation, restarts.
//! * `provider` — the [`Provider`] trait and the [`ScriptedProvider`].
//! * [`tools`] — the [`Tool`] trait, [`ToolRegistry`] and the call pipeline [`ToolRunner`].
//! * `journal` — the [`Journal`] trait and [`MemoryJournal`].
//! * [`host`] — [`host::Warden::start`]: warden on a thread of its own, and the [`host::WardenHandle`]
//!   a host drives it with from any thread (deliver world events, drain replies, halt).
//! * [`telemetry`] — the GenAI trace spans (`invoke_agent`, `chat`, `execute_tool`), `tracing` only.
//! * [`safety`] — breakers, budgets, fingerprints and the limit checkpoint ([`AgentBreakers`],
//!   [`LimitCheckpoint`]).
//!
//! Words are used as `docs/glossary.md` defines them (a *user event* is work sent to an agent, a
//! *journal event* an entry of the log, a *turn* the handling of one piece of work).
//!
//! # Examples
//! A team of one agent on a scripted model, in memory: no network, no disk.
//! ```
//! use std::sync::Arc;
//! use warden_actors::{AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
//! use warden_protocols::{HaltCause, UserEvent, WardenConfig};
//!
//! #[actix::main]
//! async fn main() {
//!     let journal = Arc::new(MemoryJournal::new());
//!     let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
//!     let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("A room is 5 silver.")]));
//!     let innkeeper = team.spawn(AgentSpec::assistant("innkeeper", model)).unwrap();
//!
//!     let reply = innkeeper.ask(UserEvent::new("a room?")).await.unwrap();
//!     assert_eq!(reply.answer, "A room is 5 silver.");
//!
//!     innkeeper.halt(HaltCause::Operator { operator: "ops".into() }).await;
//!     assert!(innkeeper.try_send_event(UserEvent::new("hello?")).is_err(), "stopped");
//!     team.shutdown().await;
//!     assert!(!journal.is_empty());
//! }
//! ```

#![deny(clippy::unwrap_used)]
#![deny(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
// One module may use unsafe: tools::mcp::group (process groups for MCP servers: pre_exec, killpg).
#![deny(unsafe_code)]

mod agent;
#[cfg(all(feature = "fuzzing", feature = "openai"))]
#[doc(hidden)]
/// Entry points to private parsers for `fuzz/` only (feature `fuzzing`). Not a public API.
pub mod fuzzing {
    pub use crate::provider::fuzzing::*;
}
pub mod context;
pub mod host;
mod journal;
pub mod mailbox;
pub mod memory;
pub mod npc;
mod provider;
pub mod safety;
mod supervisor;
mod sync;
pub mod telemetry;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
pub mod tools;

pub use agent::{
    AgentHandle, AskError, ControlError, ControlOp, DurableSendError, EventSendError, GoalsError,
    HaltAck, Notice, PendingReply, Perceived, Reply, Settled, Settlement, Submit, SubmitError,
    Submitted, TaskError,
};
pub use context::{Advisory, ContextStrategy, Trimmed};
pub use journal::{already_durable, now_ms, Journal, MemoryJournal, NotDurable, NullJournal};
pub use provider::{
    provider_limit_stats, CallPermit, Embedded, Latency, Limited, LlmRequest, LlmResponse,
    Provider, ProviderError, ProviderLimitStats, ProviderLimiter, ProviderLimits, ScriptStats,
    ScriptStep, ScriptedProvider,
};
#[cfg(feature = "openai")]
pub use provider::{
    retry_class, retry_counts, AttemptObserver, FailedAttempt, OpenAiCompatible, OpenAiConfig,
    OpenAiSetupError, RetryPolicy, StreamEvent, ToolFormat, DEFAULT_MAX_RESPONSE_BYTES,
    RETRY_CLASSES,
};
pub use safety::{
    AgentBreakers, AgentFence, BudgetSlices, ChannelInterventionBus, Fingerprint, InterventionBus,
    LimitCheckpoint, LimitContext, SliceOf, TeamBudget, Verdict,
};
pub use supervisor::{
    A2aPeers, AgentSpec, DelegationError, LiftOutcome, PeerError, PeerMessage, PeerState, PeerTask,
    RemoteAgents, SpawnError, Supervisor, SupervisorBuilder, TickConfigError, UnknownAgent,
};
pub use tools::{
    Admission, CachePolicy, CacheScope, CircuitConfig, CircuitStep, FnTool, PendingCall, Tool,
    ToolContext, ToolError, ToolPolicy, ToolRegistry, ToolResultCache, ToolRun, ToolRunner,
};
