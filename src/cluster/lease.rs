//! Agent leases and node heartbeats, both in the bucket `warden_leases`, whose `max_age` is the
//! lease TTL (nats-server 2.9 has no per-key TTL: an entry not rewritten within the bucket's
//! `max_age` ages out, and with it the lease).
//!
//! * `agent.KEY` — [`AgentLease`]: created by the node that starts the agent (`create` fails while
//!   another node's lease lives), renewed every beat by `update` over the revision last written (a
//!   renewal that finds another node's lease gives the agent up: it is halted here).
//! * `node.NAME` — [`NodeBeat`]: this node's heartbeat; every node lists the others from these.
//!
//! The renewal carries the agent's status, so that `GET /api/agents` on any node lists the whole
//! fleet (remote statuses are at most one beat old).
//!
//! # The lease fence
//! A lease ages out `lease_ttl_seconds` after its last write, and then another node may adopt the
//! agent. So an agent whose lease this node has not written for `lease_ttl_seconds` − one beat
//! (counted from when the last successful write was *sent*, which is before JetStream stored it)
//! starts no model call here, and a result that comes back meanwhile is held
//! ([`warden_actors::AgentFence`] on the team's model gate), until a renewal succeeds again — or
//! the renewal finds the lease taken and halts the agent, which drops the result. An owner whose
//! beats are starved (a saturated thread) therefore stops calling the model for its agents a beat
//! before an adopter can take them. Calls that started before stay running (a halt cuts them).
//! An agent whose lease this node does not hold (given up to another node, and halted here) is
//! fenced too, so that resuming its halted copy here starts no model call.

use super::{kv_key, Cluster, ClusterError};
use async_nats::jetstream::kv::{CreateErrorKind, Operation};
use futures::StreamExt;
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};
use warden_actors::{now_ms, AgentFence};
use warden_protocols::{
    cluster::{AgentLease, NodeBeat},
    AgentKey, HaltCause,
};

/// How many lease renewals a beat keeps in flight at once (each a revision-checked `update`, one
/// JetStream round trip): one after another, a node with thousands of agents on a busy thread did
/// not renew them all within a beat, and the same ones at the end lapsed every time.
pub(super) const RENEW_IN_FLIGHT: usize = 256;

/// The team's [`AgentFence`]: an owned agent whose lease was last written longer ago than the TTL
/// minus a beat is fenced (see the module docs).
pub(super) struct LeaseFence {
    pub(super) cluster: std::sync::Weak<Cluster>,
}

impl AgentFence for LeaseFence {
    fn fenced(&self, agent: &AgentKey) -> Option<String> {
        let cluster = self.cluster.upgrade()?;
        let Some(sent) = cluster.renewed.lock().get(agent).copied() else {
            // Not (or no longer) owned here: its lease is another node's, which runs it.
            let owner = cluster.elsewhere.lock().get(agent).cloned();
            return Some(format!(
                "cluster: this node does not hold the lease of {agent} (node {} does): no model \
                 call here",
                owner.as_deref().unwrap_or("another")
            ));
        };
        let limit = cluster
            .config
            .lease_ttl
            .saturating_sub(cluster.config.beat());
        let age = sent.elapsed();
        (age > limit).then(|| {
            format!(
                "cluster: the lease of {agent} was last written {:.1} s ago (> cluster.lease_ttl_seconds \
                 = {} less a beat): no model call until it is renewed",
                age.as_secs_f64(),
                cluster.config.lease_ttl.as_secs()
            )
        })
    }
}

impl Cluster {
    /// Notes that a write of `agent`'s lease sent at `sent` succeeded (the lease fence).
    pub(super) fn mark_renewed(&self, agent: &AgentKey, sent: Instant) {
        let mut renewed = self.renewed.lock();
        let at = renewed.entry(agent.clone()).or_insert(sent);
        *at = (*at).max(sent);
    }

    pub(super) fn lease(&self, agent: &AgentKey) -> AgentLease {
        AgentLease {
            node: self.config.node.clone(),
            instance: self.instance.clone(),
            renewed_ms: now_ms(),
            status: self.supervisor.get(agent.as_str()).map(|a| a.status()),
            fleet_halted: self.supervisor.in_fleet_halt(agent.as_str()),
        }
    }

    /// Claims `agent`'s lease at join: free or this node's (a restart) → owned; another node's →
    /// not started here.
    pub(super) async fn claim(&self, agent: &AgentKey) -> Result<(), ClusterError> {
        let key = kv_key("agent", agent.as_str());
        for _ in 0..3 {
            let sent = Instant::now();
            let body = serde_json::to_vec(&self.lease(agent)).unwrap_or_default();
            let current = self
                .leases
                .entry(key.clone())
                .await
                .map_err(|e| ClusterError::js("reading a lease", e))?
                .filter(|e| e.operation == Operation::Put);
            let written = match &current {
                None => match self.leases.create(&key, body.into()).await {
                    Ok(revision) => Ok(revision),
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                    Err(e) => Err(ClusterError::js("creating a lease", e)),
                },
                Some(entry) => {
                    let holder = serde_json::from_slice::<AgentLease>(&entry.value).ok();
                    match holder {
                        Some(lease) if lease.node != self.config.node => {
                            self.saw(agent, &lease);
                            self.elsewhere.lock().insert(agent.clone(), lease.node);
                            return Ok(());
                        }
                        _ => match self.leases.update(&key, body.into(), entry.revision).await {
                            Ok(revision) => Ok(revision),
                            Err(_) => continue,
                        },
                    }
                }
            };
            self.owned.lock().insert(agent.clone(), written?);
            self.mark_renewed(agent, sent);
            return Ok(());
        }
        Err(ClusterError::JetStream(format!(
            "the lease of {agent} changed under every claim"
        )))
    }

    /// Renews every owned lease (one beat), [`RENEW_IN_FLIGHT`] at a time, starting after the
    /// last lease the previous beat renewed (a beat cut short by its bound does not starve the
    /// same leases every time). A lease that expired meanwhile is created again; one another node
    /// took is given up, and the agent halted here.
    pub(super) async fn renew(self: &Arc<Self>) {
        let mut owned: Vec<(AgentKey, u64)> = self
            .owned
            .lock()
            .iter()
            .map(|(k, r)| (k.clone(), *r))
            .collect();
        if let Some(skip) = test_skip_renew() {
            owned.retain(|(agent, _)| !skip.iter().any(|s| s == agent.as_str()));
        }
        if owned.is_empty() {
            return;
        }
        let from = self.renew_from.load(Ordering::Relaxed) % owned.len();
        owned.rotate_left(from);
        let count = owned.len();
        let renewed = AtomicUsize::new(0);
        futures::stream::iter(owned)
            .for_each_concurrent(RENEW_IN_FLIGHT, |(agent, revision)| {
                let renewed = &renewed;
                async move {
                    self.renew_one(agent, revision).await;
                    let done = renewed.fetch_add(1, Ordering::Relaxed) + 1;
                    self.renew_from
                        .store((from + done) % count, Ordering::Relaxed);
                }
            })
            .await;
    }

    /// Notes the status another node's lease on `agent` carries (see `last_seen`).
    pub(super) fn saw(&self, agent: &AgentKey, lease: &AgentLease) {
        if let Some(status) = &lease.status {
            self.last_seen.lock().insert(
                agent.clone(),
                (lease.node.clone(), status.clone(), lease.fleet_halted),
            );
        }
    }

    /// Rewrites `agent`'s lease now (bounded by a beat), not at the next beat: after an operator
    /// halted, paused or resumed it here, so that the other nodes — and an adopter, if this node
    /// dies — read its status as it is. Nothing for an agent this node does not own.
    pub async fn write_lease_now(self: &Arc<Self>, agent: &str) {
        let revision = self.owned.lock().get(agent).copied();
        if let Some(revision) = revision {
            let renewing = self.renew_one(AgentKey::from(agent), revision);
            let _ = tokio::time::timeout(self.config.beat(), renewing).await;
        }
    }

    /// Renews one lease (see [`Cluster::renew`]).
    async fn renew_one(self: &Arc<Self>, agent: AgentKey, revision: u64) {
        let key = kv_key("agent", agent.as_str());
        let sent = Instant::now();
        let body = serde_json::to_vec(&self.lease(&agent)).unwrap_or_default();
        let renewed = match self
            .leases
            .update(&key, body.clone().into(), revision)
            .await
        {
            Ok(revision) => Some(revision),
            Err(_) => self.retake(&agent, &key, body).await,
        };
        if let Some(revision) = renewed {
            // Not while another path gave the agent up meanwhile (retake, leave).
            let still_owned = match self.owned.lock().get_mut(&agent) {
                Some(held) => {
                    *held = revision;
                    true
                }
                None => false,
            };
            if still_owned {
                self.mark_renewed(&agent, sent);
            }
        }
    }

    /// After a failed renewal: the lease expired (create it again), is still ours under another
    /// revision (update over it), or another node holds it (give the agent up). `None`: not renewed.
    async fn retake(self: &Arc<Self>, agent: &AgentKey, key: &str, body: Vec<u8>) -> Option<u64> {
        let entry = self.leases.entry(key).await.ok()?;
        match entry.filter(|e| e.operation == Operation::Put) {
            None => self.leases.create(key, body.into()).await.ok(),
            Some(entry) => {
                let lease = serde_json::from_slice::<AgentLease>(&entry.value).ok()?;
                if lease.node == self.config.node {
                    return self
                        .leases
                        .update(key, body.into(), entry.revision)
                        .await
                        .ok();
                }
                eprintln!(
                    "warden: cluster: the lease of {agent} is now node {}'s: halting it here",
                    lease.node
                );
                self.owned.lock().remove(agent);
                self.renewed.lock().remove(agent);
                let cause = HaltCause::LeaseLost {
                    node: lease.node.clone(),
                };
                self.elsewhere.lock().insert(agent.clone(), lease.node);
                let _ = self.supervisor.halt(agent.as_str(), cause).await;
                if let Some(handle) = self.supervisor.get(agent.as_str()) {
                    self.given_up
                        .lock()
                        .insert(agent.clone(), handle.halt_epoch());
                }
                None
            }
        }
    }

    /// Leaves the cluster at a clean stop: this node's leases and heartbeat are deleted, so other
    /// nodes see it gone at once instead of after the TTL. Bounded by one beat; a failure leaves
    /// them to expire.
    pub async fn leave(&self) {
        let owned: Vec<AgentKey> = self.owned.lock().keys().cloned().collect();
        let bound = self
            .config
            .beat()
            .max(std::time::Duration::from_millis(500));
        let deleting = async {
            for agent in &owned {
                let _ = self.leases.delete(kv_key("agent", agent.as_str())).await;
            }
            let _ = self.leases.delete(kv_key("node", &self.config.node)).await;
        };
        let _ = tokio::time::timeout(bound, deleting).await;
        let _ = self.client.flush().await;
    }

    /// The node whose lease on `agent` lives, if any (`None` too when JetStream does not answer).
    pub async fn owner_of(&self, agent: &str) -> Option<String> {
        let value = self.leases.get(kv_key("agent", agent)).await.ok()??;
        serde_json::from_slice::<AgentLease>(&value)
            .ok()
            .map(|l| l.node)
    }

    /// Writes this node's heartbeat. `Ok` means JetStream answered.
    pub(super) async fn write_beat(&self) -> Result<(), String> {
        let beat = NodeBeat {
            node: self.config.node.clone(),
            instance: self.instance.clone(),
            renewed_ms: now_ms(),
            halt_epoch: self.epoch(),
            fail_safe: self.fail.reason(),
            agents: self.owned.lock().keys().cloned().collect(),
        };
        let body = serde_json::to_vec(&beat).unwrap_or_default();
        self.leases
            .put(kv_key("node", &self.config.node), body.into())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Every live entry of the lease bucket with the given prefix (`agent` or `node`), decoded.
    async fn listed<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Result<Vec<T>, String> {
        use futures::StreamExt;
        let mut keys = self.leases.keys().await.map_err(|e| e.to_string())?;
        let mut wanted = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| e.to_string())?;
            if key.starts_with(prefix) && key[prefix.len()..].starts_with('.') {
                wanted.push(key);
            }
        }
        let mut out = Vec::with_capacity(wanted.len());
        for key in wanted {
            if let Ok(Some(value)) = self.leases.get(key).await {
                if let Ok(item) = serde_json::from_slice(&value) {
                    out.push(item);
                }
            }
        }
        Ok(out)
    }

    /// The nodes whose heartbeat lives (this one included).
    pub async fn nodes(&self) -> Result<Vec<NodeBeat>, String> {
        self.listed("node").await
    }

    /// Every agent lease that lives (the whole fleet, with each agent's node).
    pub async fn fleet(&self) -> Result<Vec<AgentLease>, String> {
        self.listed("agent").await
    }
}

/// Test hook (not a setting): `WARDEN_TEST_SKIP_RENEW=KEY[,KEY…]` makes this node never renew
/// those agents' leases, so that a test can watch the lease fence and an adoption of a live
/// owner's agent.
fn test_skip_renew() -> Option<Vec<String>> {
    let keys = std::env::var("WARDEN_TEST_SKIP_RENEW").ok()?;
    Some(keys.split(',').map(|k| k.trim().to_owned()).collect())
}
