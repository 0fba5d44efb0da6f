//! **warden** — an actor-model supervisor for teams of LLM agents.
//!
//! Every agent (assistant or sub-agent) is an actix actor with a priority mailbox: a `SystemHalt` is
//! acted on before any queued work and aborts the in-flight LLM call. A [`Supervisor`] owns the agents,
//! enforces delegation budgets, propagates halts down delegation trees and restarts crashed actors
//! without losing their safety state.
//!
//! This crate is the facade: the types below are all a user needs. The pieces live in
//! `warden-protocols` (typed messages, states, events, config; no runtime) and `warden-actors`.
//! `docs/architecture.md` maps the code; `docs/glossary.md` fixes the words (a *user event* is
//! work sent to an agent, a *journal event* is an entry of the log, a *turn* handles one piece of
//! work, a *tick* is an autonomous wake-up).
//!
//! A host that must never wait (a game server's tick) starts warden on a thread of its own with
//! [`host::Warden::start`] and drives it from any thread through the [`host::WardenHandle`]
//! (docs/embedding.md).
//!
//! Features: without the defaults this is the runtime alone (supervisor, agents, safety, the
//! scripted provider, `MemoryJournal`); `openai`, `sqlite`, `server` and `cli` (the default) add
//! the OpenAI-compatible provider, `SqliteJournal`, the HTTP server and the binary's pieces;
//! `mcp-server` the MCP server (`/mcp`, `warden mcp`), `cluster` the NATS cluster ([`cluster`]);
//! `otel` adds the OpenTelemetry export ([`telemetry`], docs/telemetry.md).
//!
//! ```no_run
//! use std::sync::Arc;
//! use warden::{AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor, UserEvent, WardenConfig};
//!
//! # async fn run() {
//! let journal = Arc::new(MemoryJournal::new());
//! let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal);
//! let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("hello!")]));
//! let npc = team.spawn(AgentSpec::assistant("innkeeper", model)).unwrap();
//! npc.try_send_event(UserEvent::new("hi there")).unwrap();
//! # }
//! ```

#![deny(clippy::unwrap_used)]
#![deny(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]
#![warn(missing_debug_implementations, missing_docs, unreachable_pub)]
// The library has no unsafe code; the binary (src/cmd/loadtest.rs) has its few libc calls.
#![forbid(unsafe_code)]

/// The README's Rust example, compiled and run by `cargo test --doc` (its other blocks are `sh`,
/// `text`, `toml` and `python`, which rustdoc leaves alone).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust examples of docs/embedding.md, compiled (and run, but for the frame loop) by
/// `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../docs/embedding.md")]
pub struct EmbeddingDoctests;

/// The Rust example of docs/models.md (a provider limiter shared by two providers).
#[cfg(doctest)]
#[doc = include_str!("../docs/models.md")]
pub struct ModelsDoctests;

/// The Rust example of docs/telemetry.md (the OpenTelemetry layer in a host's subscriber).
#[cfg(all(doctest, feature = "otel"))]
#[doc = include_str!("../docs/telemetry.md")]
pub struct TelemetryDoctests;

#[cfg(feature = "server")]
pub mod a2a_client;
// The binary's internals (its commands, client and load tester), public only because `main.rs`
// is another crate: not part of the library's semver surface, hence hidden from its docs.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "sqlite")]
pub mod journal;
// The binary's `warden loadtest` (see `cli` above): hidden, not semver surface.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod loadtest;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod server;

/// Entry points to private parsers for `fuzz/` only (feature `fuzzing`). Not a public API.
#[cfg(all(feature = "fuzzing", feature = "server"))]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::server::api::fuzzing::*;
}
#[cfg(feature = "server")]
pub mod team;
// The `[telemetry]` settings, the export counters and the request spans are read by the server
// with or without `otel`; the exporter itself is behind `otel`.
#[cfg(any(feature = "otel", feature = "server"))]
pub mod telemetry;

#[cfg(feature = "sqlite")]
pub use journal::{JournalReader, SqliteJournal};
pub use warden_actors::{
    already_durable, context, host, mailbox, memory, now_ms, npc, safety, tools, AgentHandle,
    AgentSpec, AskError, ChannelInterventionBus, ControlError, ControlOp, DelegationError,
    DurableSendError, Embedded, EventSendError, FnTool, GoalsError, HaltAck, InterventionBus,
    Journal, Latency, Limited, LlmRequest, LlmResponse, MemoryJournal, NotDurable, Notice,
    NullJournal, PendingReply, Perceived, Provider, ProviderError, ProviderLimitStats,
    ProviderLimiter, ProviderLimits, Reply, ScriptStats, ScriptStep, ScriptedProvider, Settled,
    Settlement, SpawnError, Submit, SubmitError, Submitted, Supervisor, SupervisorBuilder,
    TaskError, TickConfigError, Tool, ToolContext, ToolError, ToolRegistry, UnknownAgent,
};
#[cfg(feature = "openai")]
pub use warden_actors::{OpenAiCompatible, OpenAiConfig, RetryPolicy, ToolFormat};
pub use warden_protocols as protocols;
pub use warden_protocols::{
    AgentKey, AgentRecord, AgentRole, AgentState, AgentStatus, ChatMessage, ConfigError, Event,
    EventFate, EventKind, HaltCause, Priority, TerminationReason, ToolCategory, UserEvent,
    WardenConfig, WorkRefusal,
};
