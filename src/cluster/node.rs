//! [`ClusterNode`] for [`Cluster`]: what the server asks of this node's cluster (the routes
//! themselves are the server's, `crate::server::cluster`), the body of `GET /api/cluster` and the
//! cluster's `/metrics` lines.

use super::Cluster;
use crate::server::cluster::{ClusterHalt, ClusterLift, ClusterNode, LiftError, RemoteHaltError};
use futures::{future::BoxFuture, FutureExt};
use std::{fmt::Write as _, sync::atomic::Ordering, sync::Arc, time::Duration};
use warden_actors::{AgentHandle, ControlError};
use warden_protocols::{
    cluster::{AgentHaltAck, AgentLease},
    AgentKey, AgentStatus,
};

impl ClusterNode for Cluster {
    fn node(&self) -> &str {
        Cluster::node(self)
    }

    fn owns(&self, agent: &str) -> bool {
        Cluster::owns(self, agent)
    }

    fn runs_on(&self, agent: &str) -> Option<String> {
        Cluster::runs_on(self, agent)
    }

    fn fail_safe(&self) -> Option<String> {
        Cluster::fail_safe(self)
    }

    fn halt_ack_timeout(&self) -> Duration {
        self.config.halt_ack_timeout
    }

    fn owner<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Option<String>> {
        Cluster::owner(self, agent).boxed()
    }

    fn remote_status<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Option<(AgentStatus, String)>> {
        Cluster::remote_status(self, agent).boxed()
    }

    fn write_lease_now<'a>(self: Arc<Self>, agent: &'a str) -> BoxFuture<'a, ()> {
        async move { Cluster::write_lease_now(&self, agent).await }.boxed()
    }

    fn halt<'a>(self: Arc<Self>, reason: &'a str, by: &'a str) -> BoxFuture<'a, ClusterHalt> {
        async move { Cluster::halt(&self, reason, by).await }.boxed()
    }

    fn halt_remote<'a>(
        &'a self,
        node: &'a str,
        agent: &'a AgentKey,
        by: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AgentHaltAck>, RemoteHaltError>> {
        Cluster::halt_remote(self, node, agent, by).boxed()
    }

    fn lift<'a>(
        self: Arc<Self>,
        reason: &'a str,
        by: &'a str,
    ) -> BoxFuture<'a, Result<ClusterLift, LiftError>> {
        async move { Cluster::lift(&self, reason, by).await }.boxed()
    }

    fn unlock<'a>(
        &'a self,
        agent: &'a AgentHandle,
        by: &'a str,
        bound: Duration,
        local: BoxFuture<'a, Result<(), ControlError>>,
    ) -> BoxFuture<'a, Result<(), Option<ControlError>>> {
        Cluster::unlock(self, agent, by, bound, local).boxed()
    }

    fn leases(&self) -> BoxFuture<'_, Result<Vec<AgentLease>, String>> {
        self.fleet().boxed()
    }

    fn status(&self) -> BoxFuture<'_, serde_json::Value> {
        status(self).boxed()
    }

    fn metrics(&self) -> String {
        metrics(self)
    }
}

/// `GET /api/cluster`: this node, its fail safe, the halt key as last read, the live nodes.
async fn status(cluster: &Cluster) -> serde_json::Value {
    // Not while cut off (it would only wait for its timeout): `null` then.
    let nodes = match cluster.fail.reason() {
        Some(_) => None,
        None => tokio::time::timeout(Duration::from_millis(500), cluster.nodes())
            .await
            .ok()
            .and_then(Result::ok),
    };
    let budget = cluster.budget_status(cluster.fail.reason().is_none()).await;
    serde_json::json!({
        "node": cluster.node(),
        "url": cluster.config.shown_url(),
        "connected": cluster.connected(),
        "halt_epoch": cluster.epoch(),
        "halt": cluster.halt_state(),
        "fail_safe": cluster.fail.reason(),
        "fail_safe_since_ms": cluster.fail.since_ms(),
        "heartbeat_age_ms": u64::try_from(cluster.fail.silence().as_millis()).unwrap_or(u64::MAX),
        "owned": cluster.owned.lock().keys().collect::<Vec<_>>(),
        "elsewhere": *cluster.elsewhere.lock(),
        "lockouts": cluster.lockouts(),
        "peers": *cluster.peers.lock(),
        "nodes": nodes,
        "budget": budget,
        "delegations": {
            "received": cluster.delegation_counts().0,
            "ran": cluster.delegation_counts().1,
            "recovered": cluster.delegation_counts().2,
        },
    })
}

/// The cluster's `/metrics` families.
fn metrics(cluster: &Cluster) -> String {
    let node = cluster.node();
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{node=\"{node}\"}} {value}");
    };
    family(
        "warden_cluster_fail_safe",
        "gauge",
        "1 while this node starts no model call (cut off from JetStream).",
        u8::from(cluster.fail.reason().is_some()).to_string(),
    );
    family(
        "warden_cluster_fail_safe_entered_total",
        "counter",
        "How many times the fail safe came on.",
        cluster.fail.entered.load(Ordering::Relaxed).to_string(),
    );
    family(
        "warden_cluster_heartbeat_age_seconds",
        "gauge",
        "Seconds since the last successful heartbeat to JetStream.",
        format!("{:.3}", cluster.fail.silence().as_secs_f64()),
    );
    family(
        "warden_cluster_halt_epoch",
        "gauge",
        "The cluster halt epoch this node has applied.",
        cluster.epoch().to_string(),
    );
    family(
        "warden_cluster_connected",
        "gauge",
        "1 while the NATS connection is up.",
        u8::from(cluster.connected()).to_string(),
    );
    family(
        "warden_cluster_agents_owned",
        "gauge",
        "Agents whose lease this node holds.",
        cluster.owned.lock().len().to_string(),
    );
    out
}

impl Cluster {
    /// Whether the NATS connection is up now.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }
}
