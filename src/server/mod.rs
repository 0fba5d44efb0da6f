//! The HTTP server: the admin API ([`api`]), the event feed ([`events`]) and its Server-Sent Events
//! stream (`sse`), the operator console in the browser ([`console`]), Prometheus metrics
//! ([`metrics`]), the MCP server ([`mcp`]: `/mcp` and `warden mcp`), and what it asks of a cluster
//! node ([`cluster`]). [`crate::serve::serve_team`] puts a team file, the SQLite journal, the
//! cluster and the API together for `warden serve`.

pub mod a2a;
pub mod api;
pub mod auth_limit;
pub mod cluster;
pub mod console;
pub mod events;
#[cfg(feature = "mcp-server")]
pub mod mcp;
pub mod metrics;
pub(crate) mod routes;
mod sse;

pub use routes::replies;
