//! Tools: the [`Tool`] trait and its [`ToolRegistry`] per agent, and the pipeline every call goes
//! through, [`ToolRunner`]: a circuit breaker, argument validation and a result cache in front of the
//! tool.
//!
//! A tool's future runs inside the agent's turn. The agent checks for a pending halt immediately
//! before starting it (so no tool starts after a halt), bounds it with a timeout, and catches a panic
//! inside it (counted as a failed call).
//!
//! Files: `tool.rs` (the trait, [`ToolContext`], [`ToolError`], [`FnTool`]), `registry.rs`,
//! `runner.rs` (the pipeline below), `circuit.rs`, `schema.rs` (argument validation), `cache.rs`.
//!
//! Order of one call ([`ToolRunner::run`], or [`ToolRunner::admit`] then [`PendingCall::execute`]):
//!
//! 1. look the tool up (unknown ⇒ [`ToolError::Unknown`]; the circuit is not consulted);
//! 2. **circuit check** — an open circuit (or a half-open one whose probe is running) refuses the call
//!    at once with a [`ToolError::Failed`] carrying the [`CircuitRejection`] text;
//! 3. **schema validation** of the arguments against the spec's `parameters` — a violation is a
//!    [`ToolError::InvalidArguments`] listing every problem; it is the model's mistake, so it does *not*
//!    count against the tool's circuit;
//! 4. **cache lookup** (cacheable tools only) — a hit returns the stored value, `cached: true`, without
//!    running the tool and without recording anything on the circuit;
//! 5. **execution** with a timeout (`Tool::timeout()` or the caller's default), catching a panic both in
//!    the synchronous `Tool::call` and inside its future ([`ToolError::Panicked`]); an attempt that
//!    failed with a retryable error is tried again after a backoff ([`retry`]: `Tool::retry()` or
//!    the runner's, never for a DANGEROUS tool that is not idempotent);
//! 6. **circuit record** of the call's final outcome, once — success closes/keeps closed; [`ToolError::Failed`], [`ToolError::Timeout`] and
//!    [`ToolError::Panicked`] count as failures; an [`ToolError::InvalidArguments`] or
//!    [`ToolError::Unknown`] returned *by the tool* is the model's mistake and records nothing;
//! 7. **cache store** of a successful result (cacheable tools only).
//!
//! Invariants: nothing here panics on model-influenced data; a call's future can be dropped at any
//! await (a halt) without leaving a circuit stuck — an unrecorded probe frees its slot; the runner
//! uses tokio's clock and timer only, no runtime handle.

pub mod cache;
pub mod circuit;
#[cfg(feature = "mcp")]
pub mod mcp;
mod registry;
pub mod retry;
mod runner;
pub mod schema;
mod tool;

pub use cache::{canonical_json, CachePolicy, CacheScope, ToolResultCache};
pub use circuit::{
    CircuitConfig, CircuitPermit, CircuitRejection, CircuitState, CircuitTransition, ToolCircuits,
};
pub use registry::ToolRegistry;
pub use retry::{is_retryable, RetryObserver, Unobserved};
pub(crate) use runner::panic_message;
pub use runner::{
    parse_arguments, Admission, CircuitStep, PendingCall, ToolPolicy, ToolRun, ToolRunner,
};
pub use schema::{validate, SchemaErrors, SchemaViolation};
pub use tool::{FnTool, Tool, ToolContext, ToolError};

#[cfg(test)]
mod tests;
