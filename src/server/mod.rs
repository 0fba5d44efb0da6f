//! The HTTP server: the admin API ([`api`]), the event feed ([`events`]) and its Server-Sent Events
//! stream (`sse`), the operator console in the browser ([`console`]), Prometheus metrics ([`metrics`]), the MCP server ([`mcp`]: `/mcp` and `warden mcp`), and [`serve_team`], which puts a team file, the
//! SQLite journal and the API together for `warden serve`.

pub mod a2a;
pub mod api;
pub mod auth_limit;
pub mod cluster;
pub mod console;
pub mod events;
pub mod mcp;
pub mod metrics;
pub mod replies;
mod serve;
mod sse;

pub use serve::{serve_team, DEFAULT_TEAM};
