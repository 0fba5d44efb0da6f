//! The API's handlers, one file per resource (the route table that registers them:
//! `api/table.rs`). Each handler asks the cluster when this server is a cluster node
//! ([`cluster`]).

pub(crate) mod agents;
pub(crate) mod cluster;
pub(crate) mod controls;
pub(crate) mod events;
pub(crate) mod fleet;
pub(crate) mod halts;
pub(crate) mod interventions;
pub(crate) mod memories;
pub(crate) mod meta;
pub mod replies;
pub(crate) mod world;
