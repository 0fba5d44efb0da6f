//! [`ApiState`]: what the handlers share.

use crate::server::api::*;
use crate::{
    journal::{EventFates, SqliteJournal},
    server::events::EventHub,
    server::metrics::ApiMetrics,
};
use actix_web::http::StatusCode;
use std::sync::Arc;
use warden_actors::{safety::ChannelInterventionBus, Supervisor};

/// What the handlers share. Build it with [`ApiState::new`] and the `with_*` methods.
#[derive(Clone)]
pub struct ApiState {
    /// The team the API controls and reports on.
    pub supervisor: Supervisor,
    /// The intervention bus the supervisor's limit checkpoint asks (for `/api/interventions`).
    pub bus: Option<Arc<ChannelInterventionBus>>,
    /// Tokens and the body limit.
    pub config: ApiConfig,
    /// The feed `GET /api/events` streams (503 without one).
    pub events: Option<EventHub>,
    /// The durable journal, for its counters on `/metrics`.
    pub journal: Option<Arc<SqliteJournal>>,
    /// Where `GET /api/agents/{key}/events/{id}` reads what became of an event (503 without).
    pub fates: Option<Arc<dyn EventFates>>,
    /// What the API measures itself (halt latency).
    pub metrics: Arc<ApiMetrics>,
    /// The open sessions of `/mcp` (the MCP server, [`crate::server::mcp`]; feature `mcp-server`).
    #[cfg(feature = "mcp-server")]
    pub mcp: Arc<crate::server::mcp::McpSessions>,
    /// The browser console's logged-in sessions ([`crate::server::console`]).
    pub console: Arc<crate::server::console::Sessions>,
    /// Wrong tokens by client address (`api.auth_failures_per_minute`).
    pub auth_failures: Arc<crate::server::auth_limit::AuthFailures>,
    /// This node's cluster (`warden serve` with `[cluster]`): the routes that answer differently on
    /// a cluster node ask it (`POST /api/halt` halts every node, `GET /api/agents` lists the
    /// fleet, …: [`crate::server::cluster`]).
    pub cluster: Option<Arc<dyn crate::server::cluster::ClusterNode>>,
    /// A2A push-notification configs and their webhook deliveries ([`crate::server::a2a`]).
    pub a2a_push: Arc<crate::server::a2a::push::Pushes>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("supervisor", &self.supervisor)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// The API over `supervisor` with these tokens and no bus, feed, journal or fates, until the
    /// `with_*` methods add them: meanwhile `GET /api/events`, `GET /api/events/recent` and the
    /// fate reads answer `503`, `/api/interventions` lists no ask, and `/metrics` leaves out the
    /// journal's families.
    pub fn new(supervisor: Supervisor, config: ApiConfig) -> Self {
        ApiState {
            supervisor,
            bus: None,
            events: None,
            journal: None,
            fates: None,
            metrics: Arc::default(),
            #[cfg(feature = "mcp-server")]
            mcp: Arc::default(),
            console: Arc::new(crate::server::console::Sessions::new(config.session_ttl())),
            auth_failures: Arc::new(crate::server::auth_limit::AuthFailures::new(
                config.auth_failure_limit(),
            )),
            config,
            cluster: None,
            a2a_push: Arc::default(),
        }
    }

    /// `404 unknown agent KEY` — or, on a cluster node whose team file lists `KEY` as another
    /// node's agent, `409 agent KEY runs on node N: ask node N`.
    pub(crate) fn unknown_agent(&self, key: &str) -> ApiError {
        match self.runs_elsewhere(key) {
            Some(node) => ApiError::new(
                StatusCode::CONFLICT,
                format!("agent {key} runs on node {node}: ask node {node}"),
            ),
            None => ApiError::unknown_agent(key),
        }
    }

    /// On a cluster node, the node that runs `key` when this one does not (its team file lists it
    /// as another node's, or this node gave it up: the copy here is halted).
    pub(crate) fn runs_elsewhere(&self, key: &str) -> Option<String> {
        let cluster = self.cluster.as_ref()?;
        (!cluster.owns(key)).then(|| cluster.runs_on(key)).flatten()
    }

    /// The agent `key` to act on: this node's — [`ApiState::unknown_agent`] when there is none, or
    /// when it runs on another node (a copy given up here included).
    pub(crate) fn agent(&self, key: &str) -> Result<warden_actors::AgentHandle, ApiError> {
        if self.runs_elsewhere(key).is_some() {
            return Err(self.unknown_agent(key));
        }
        self.supervisor
            .get(key)
            .ok_or_else(|| self.unknown_agent(key))
    }

    /// The cluster this node belongs to.
    pub fn with_cluster(mut self, cluster: Arc<dyn crate::server::cluster::ClusterNode>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// The bus behind `/api/interventions`.
    pub fn with_bus(mut self, bus: Arc<ChannelInterventionBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// The feed behind `/api/events`.
    pub fn with_events(mut self, hub: EventHub) -> Self {
        self.events = Some(hub);
        self
    }

    /// The durable journal, whose counters `/metrics` shows and from which events' fates are read.
    pub fn with_journal(mut self, journal: Arc<SqliteJournal>) -> Self {
        self.fates = Some(journal.clone());
        self.journal = Some(journal);
        self
    }

    /// Where events' fates are read (set by [`ApiState::with_journal`]; for an in-memory journal).
    pub fn with_fates(mut self, fates: Arc<dyn EventFates>) -> Self {
        self.fates = Some(fates);
        self
    }
}
