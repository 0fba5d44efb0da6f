//! `warden loadtest --cluster nats://HOST:PORT --nodes N`: the synthetic fleet run by N cluster
//! nodes inside the loadtest process, each a full node — its own [`Supervisor`] (built as the
//! single-node run's, with its own view of the harness journal) joined to the cluster with
//! [`Cluster::join`] — so that every delegation crosses nodes through NATS.
//!
//! # Placement
//! An agent at depth `d` of its tree runs on node `d mod N`: the roots on the first node, their
//! children on the second, … Every delegation therefore goes to another node, on
//! `NS.cluster.delegate.NODE`, the path `warden serve` uses.
//!
//! # Isolation
//! Each run has a namespace of its own, `warden_lt_RUN` (`RUN`: 8 random hex digits): its buckets
//! are `warden_lt_RUN_halt`, `…_leases`, `…_lockouts`, `…_budget`, its subjects
//! `warden_lt_RUN.cluster.…`, its nodes `lt-RUN-a`, `lt-RUN-b`, …. A run never reads another
//! run's halt key (the final halt of a run leaves its key `halted: true`), and never meets the
//! buckets or the subjects of a cluster `warden serve` runs on the same NATS (a loadtest's halt
//! broadcast halts nothing but its own nodes). The run deletes its buckets at its end
//! ([`ClusterFigures::buckets_removed`]); a run killed before that leaves them (`nats stream rm
//! KV_warden_lt_RUN_halt`, …).
//!
//! # The harness's accounting across nodes
//! Every node's supervisor journals into one harness journal, which knows which node each event
//! came from (delegation ids are unique per supervisor: they are counted per node). A task
//! delegated from node a to node b is counted once: `+1` on the delegate when node a journals the
//! `DelegationRequested`, `−1` when node b's journal ends it (its turn finished, the task refused,
//! discarded or cut by a halt), so a delegation that never ran on b, or ran twice, leaves the
//! delegate's balance at `±1` and shows in `lost_events`. Two cases are told apart from a loss:
//! * a refusal by the owner after the request (the delegate was locked out or stopped meanwhile,
//!   its mailbox full): node a journals `DelegationEnded` `failed` with the refusal's text, then the
//!   `DelegationRefused` — recognised as a refusal after the request (the task was never queued);
//! * a delegation whose delegator was halted while it waited (`cancelled`) and whose task never
//!   reached the delegate's queue (not sent yet, or refused by the owner with nobody waiting for
//!   the refusal): explained by the owners' own counts (requests run, runs refused) — never more
//!   of them than delegations ended `cancelled`, so a loss in a run without halts is never
//!   explained away.
//!
//! The invariants of the cluster block: the halt issued on the first node reached every node
//! (every agent STOPPED, or left SAFETY_LOCKOUT), and without a halt during the run every
//! delegation sent was run exactly once by its owner (`delegations_sent == delegations_ran`).

use super::{
    depth_of, drive, finish_fleet, fleet_config, fleet_shape, proc_status_bytes, retries_since,
    state_index, FleetModels, HarnessJournal, LoadReport, LoadtestOptions, Progress, Scenario,
    Spawned, Tally,
};
use crate::cluster::{Cluster, ClusterConfig, ClusterError, ClusterSection};
use crate::{Journal, Supervisor};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};
use warden_protocols::{AgentKey, AgentState, DelegationOutcome, DelegationRefusal, EventKind};

/// Fewest nodes of a cluster run.
pub const MIN_NODES: usize = 2;
/// Most nodes of a cluster run (node names end in one letter).
pub const MAX_NODES: usize = 26;
/// The default of `--nodes`.
pub const DEFAULT_NODES: usize = 3;
/// How long a node waits for NATS at its start before the run gives up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait, before the drive, for every node to see every other one's heartbeat (they
/// beat every second).
const PEERS_WAIT: Duration = Duration::from_secs(5);
/// The longest wait, after the final halt, for every node's agents to be halted.
const HALT_WAIT: Duration = Duration::from_secs(10);

/// Where and on how many nodes to run.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The NATS server (JetStream on), as `--cluster`: `nats://HOST:PORT`.
    pub url: String,
    /// Nodes to run, [`MIN_NODES`] to [`MAX_NODES`].
    pub nodes: usize,
}

/// Why a cluster run could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterRunError {
    /// `--nodes` out of range.
    #[error("invalid value {0} for `--nodes` (allowed: {MIN_NODES} to {MAX_NODES})")]
    Nodes(usize),
    /// The URL was refused, NATS could not be reached or JetStream refused.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// One node's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFigures {
    /// The node's name (`lt-RUN-a`, …).
    pub node: String,
    /// Agents it ran (those at depths `i`, `i + N`, … of their trees).
    pub agents: u64,
    /// Turns its agents finished.
    pub turns: u64,
    /// Model calls its agents made.
    pub llm_calls: u64,
    /// Tool calls its agents started (delegations not included).
    pub tool_calls: u64,
    /// Delegations its agents sent to another node's agents (`DelegationRequested`).
    pub delegations_sent: u64,
    /// Delegation requests it received (every copy: a resent request counts again).
    pub delegations_received: u64,
    /// Delegations it ran (one per idempotency key).
    pub delegations_ran: u64,
    /// Of those, the ones it refused (agent locked out, stopped, mailbox full): never queued.
    pub delegations_refused: u64,
    /// Its agents locked out by a breaker.
    pub lockouts: u64,
    /// Delegation refusals journaled by its agents (as delegators).
    pub refusals: u64,
    /// Of those, `unknown_delegate`: the delegate is an agent of the fleet, but its owner was not
    /// found (its lease not found, or not read within 2 s).
    pub refused_unknown: u64,
    /// It answered the cluster halt's broadcast with its acknowledgements (the first node: its own
    /// agents, halted before any network).
    pub halt_answered: bool,
    /// From the cluster halt issued on the first node until every agent of this node was halted
    /// (STOPPED; a SAFETY_LOCKOUT agent is left as it is), as its journal says, in ms (0 when they
    /// all were already); `None` when that did not happen within 10 s.
    pub halt_ack_ms: Option<f64>,
}

/// The cluster-wide figures of a cluster run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterFigures {
    /// The NATS server.
    pub url: String,
    /// The run's namespace (its buckets' and subjects' prefix).
    pub namespace: String,
    /// Nodes run.
    pub nodes: u64,
    /// From the cluster halt issued on the first node until every agent on every node was halted,
    /// in ms (the slowest node's `halt_ack_ms`); `None` when a node was not halted within 10 s.
    pub halt_ms: Option<f64>,
    /// Nodes whose agents were not all halted within 10 s of the cluster halt: must be empty.
    pub halt_unreached: Vec<String>,
    /// Delegations sent across nodes, summed over the nodes.
    pub delegations_sent: u64,
    /// Delegation requests received, every copy.
    pub delegations_received: u64,
    /// Delegations run by their owners, one per idempotency key.
    pub delegations_ran: u64,
    /// Delegations refused as `unknown_delegate` although the delegate is an agent of the fleet:
    /// its lease was not found (it lapsed: not renewed within `lease_ttl_seconds`) or not read
    /// within 2 s. Not an accounting error (each is a refusal, counted once), but a sign that the
    /// nodes' leases or JetStream did not keep up.
    pub refused_unknown: u64,
    /// Delegations whose delegator was halted while it waited.
    pub delegations_cancelled: u64,
    /// Of those, the ones whose task never reached the delegate's queue (not sent yet, or refused
    /// with nobody waiting): not counted as lost (see the module docs).
    pub cancelled_unqueued: u64,
    /// Without a halt during the run: `|delegations_sent − delegations_ran|` (every delegation
    /// sent runs once on its owner); 0 for `halt-storm`. Must be 0.
    pub delegations_unmatched: u64,
    /// Median time from a cross-node delegation's request to its end on the delegator, in ms (the
    /// delegate's whole subtree included).
    pub delegation_ms_p50: f64,
    /// 99th percentile of the same, in ms.
    pub delegation_ms_p99: f64,
    /// The run's buckets were deleted at its end.
    pub buckets_removed: bool,
}

impl ClusterFigures {
    /// What this block says is wrong (empty: nothing).
    pub fn violations(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        if !self.halt_unreached.is_empty() {
            wrong.push(format!(
                "the cluster halt did not reach {}",
                self.halt_unreached.join(", ")
            ));
        }
        if self.delegations_unmatched > 0 {
            wrong.push(format!(
                "{} delegations sent {} ran",
                self.delegations_sent, self.delegations_ran
            ));
        }
        wrong
    }
}

// ---- the harness's per-node counts --------------------------------------------------------------

/// What [`ClusterTally::count`] made of an event.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// Counted here; the fleet-wide counts take it as usual.
    Counted,
    /// A `DelegationRefused` that came after its request (the owner refused the task): the
    /// fleet-wide counts take it as a refusal after the request.
    RefusedAfterRequest,
}

#[derive(Default)]
struct NodeTally {
    turns: u64,
    tool_calls: u64,
    lockouts: u64,
    refusals: u64,
    refused_unknown: u64,
    sent: u64,
    /// Agents in each state, by [`AgentState::ALL`] index.
    states: [i64; AgentState::ALL.len()],
    /// Agents placed on this node.
    agents: i64,
    /// When every agent of the node was halted, after the final halt was issued.
    halted_after: Option<Duration>,
}

impl NodeTally {
    fn halted(&self) -> bool {
        self.states[state_index(AgentState::Stopped)]
            + self.states[state_index(AgentState::SafetyLockout)]
            >= self.agents
    }
}

/// The harness journal's counts of a cluster run, per node.
pub(super) struct ClusterTally {
    nodes: Vec<NodeTally>,
    /// Cross-node delegations running, by (node, id): when they were requested.
    started: HashMap<(usize, u64), Instant>,
    /// Request → end of every cross-node delegation, in µs.
    round_trips_us: Vec<u64>,
    /// (delegator, delegate) of a cross-node delegation that just ended `failed`, with its error:
    /// a `DelegationRefused` with that text that follows is a refusal by the owner.
    ended_failed: HashMap<(AgentKey, AgentKey), String>,
    /// Refusals by an owner that reached their delegator.
    refusals_seen: u64,
    /// Cross-node delegations ended `cancelled`.
    cancelled: u64,
    /// When the final halt was issued.
    halt_issued: Option<Instant>,
}

impl ClusterTally {
    /// Counts for `agents[i]` agents on node `i`.
    pub(super) fn new(agents: &[u64]) -> Self {
        ClusterTally {
            nodes: agents
                .iter()
                .map(|n| NodeTally {
                    agents: i64::try_from(*n).unwrap_or(i64::MAX),
                    ..NodeTally::default()
                })
                .collect(),
            started: HashMap::new(),
            round_trips_us: Vec::new(),
            ended_failed: HashMap::new(),
            refusals_seen: 0,
            cancelled: 0,
            halt_issued: None,
        }
    }

    /// The node of `agent`: its depth modulo the nodes.
    fn node_of(&self, agent: &AgentKey) -> usize {
        depth_of(agent.as_str()) % self.nodes.len().max(1)
    }

    /// Counts one event `node`'s supervisor journaled for `agent`.
    pub(super) fn count(&mut self, node: usize, agent: &AgentKey, kind: &EventKind) -> Seen {
        let remote = |to: &AgentKey| self.node_of(to) != node;
        let cross = match kind {
            EventKind::DelegationRequested { to, .. }
            | EventKind::DelegationEnded { to, .. }
            | EventKind::DelegationRefused { to, .. } => remote(to),
            _ => false,
        };
        let Some(n) = self.nodes.get_mut(node) else {
            return Seen::Counted;
        };
        match kind {
            EventKind::Spawned { .. } => n.states[state_index(AgentState::WaitingForEvent)] += 1,
            EventKind::StateChanged { from, to, .. } => {
                n.states[state_index(*from)] -= 1;
                n.states[state_index(*to)] += 1;
                if let Some(issued) = self.halt_issued {
                    if n.halted_after.is_none() && n.halted() {
                        n.halted_after = Some(issued.elapsed());
                    }
                }
            }
            EventKind::TurnFinished { .. } => n.turns += 1,
            EventKind::ToolStarted { tool, .. } if tool != "delegate" => n.tool_calls += 1,
            EventKind::LockedOut { .. } => n.lockouts += 1,
            EventKind::DelegationRequested { id, to, .. } if cross => {
                n.sent += 1;
                self.started.insert((node, *id), Instant::now());
                self.ended_failed.remove(&(agent.clone(), to.clone()));
            }
            EventKind::DelegationEnded { id, to, outcome } if cross => {
                if let Some(at) = self.started.remove(&(node, *id)) {
                    self.round_trips_us.push(at.elapsed().as_micros() as u64);
                }
                match outcome {
                    DelegationOutcome::Failed { error } => {
                        self.ended_failed
                            .insert((agent.clone(), to.clone()), error.clone());
                    }
                    DelegationOutcome::Cancelled => self.cancelled += 1,
                    _ => {}
                }
            }
            EventKind::DelegationRefused { to, refusal } => {
                n.refusals += 1;
                if matches!(refusal, DelegationRefusal::UnknownDelegate { .. }) {
                    n.refused_unknown += 1;
                }
                let ended = cross
                    .then(|| self.ended_failed.remove(&(agent.clone(), to.clone())))
                    .flatten();
                if ended.is_some_and(|error| error == refusal.to_string()) {
                    self.refusals_seen += 1;
                    // A DelegateRefused is a refusal after the request on one node too.
                    if !matches!(refusal, DelegationRefusal::DelegateRefused { .. }) {
                        return Seen::RefusedAfterRequest;
                    }
                }
            }
            _ => {}
        }
        Seen::Counted
    }

    /// The final halt is issued now: each node's time to halted is taken from here.
    fn halt_issued(&mut self, at: Instant) {
        self.halt_issued = Some(at);
        for n in &mut self.nodes {
            if n.halted() {
                n.halted_after = Some(Duration::ZERO);
            }
        }
    }

    fn all_halted(&self) -> bool {
        self.nodes.iter().all(|n| n.halted_after.is_some())
    }
}

/// Of the delegations cancelled by a halt, those whose task never reached the delegate's queue:
/// requests never run by their owner (`sent − ran`) plus owners' refusals no delegator journaled
/// (`refused − refusals_seen`), never more than the delegations ended `cancelled` (a delegation
/// lost without a halt is not explained away).
fn cancelled_unqueued(sent: u64, ran: u64, refused: u64, seen: u64, cancelled: u64) -> u64 {
    (sent.saturating_sub(ran) + refused.saturating_sub(seen)).min(cancelled)
}

/// `lost_events` of a cluster run: every agent's balance over every node (its `+1`s where the task
/// was sent, its `−1`s where it ended), less the delegations cancelled before they were queued
/// (each of which left `+1` on its delegate).
fn lost_events(t: &Tally, unqueued: u64) -> u64 {
    let all: u64 = t.balance.values().map(|b| b.unsigned_abs()).sum();
    let positive: u64 = t
        .balance
        .values()
        .filter(|b| **b > 0)
        .map(|b| b.unsigned_abs())
        .sum();
    all - unqueued.min(positive)
}

// ---- the nodes ------------------------------------------------------------------------------------

/// One node's journal: the harness journal, told which node journals.
struct NodeJournal {
    node: usize,
    harness: Arc<HarnessJournal>,
}

impl Journal for NodeJournal {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        self.harness.append_from(self.node, agent, vec![kind])
    }

    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        self.harness.append_from(self.node, agent, kinds)
    }

    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, _at_ms: u64) -> u64 {
        self.harness.rows_from(self.node, rows.into_iter())
    }

    fn durable(&self, _seq: u64) -> BoxFuture<'static, Result<(), crate::NotDurable>> {
        crate::already_durable()
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}

/// The run's nodes, joined to the cluster.
pub(super) struct Nodes {
    url: String,
    namespace: String,
    names: Vec<String>,
    clusters: Vec<Arc<Cluster>>,
    /// Which nodes answered the final halt.
    answered: Vec<bool>,
    buckets_removed: bool,
}

impl Nodes {
    /// Issues the cluster halt on the first node and waits until every node's agents are halted
    /// (at most [`HALT_WAIT`] or `timeout`): the agents acknowledged by the halt's answer, and when
    /// the answer came.
    pub(super) async fn halt(
        &mut self,
        journal: &HarnessJournal,
        timeout: Duration,
    ) -> (u64, Instant) {
        let Some(first) = self.clusters.first().cloned() else {
            return (0, Instant::now());
        };
        let issued = Instant::now();
        if let Some(c) = journal.tally.lock().cluster.as_mut() {
            c.halt_issued(issued);
        }
        let halt = first.halt("loadtest: final halt", "loadtest").await;
        let answered_at = Instant::now();
        let acked = halt.local.len() as u64
            + halt
                .remote
                .values()
                .filter(|a| !a.stale)
                .map(|a| a.halted.len() as u64)
                .sum::<u64>();
        self.answered = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| i == 0 || halt.remote.get(name).is_some_and(|a| !a.stale))
            .collect();
        let deadline = issued + HALT_WAIT.min(timeout.max(Duration::from_secs(1)));
        loop {
            let done = journal
                .tally
                .lock()
                .cluster
                .as_ref()
                .is_none_or(ClusterTally::all_halted);
            if done || Instant::now() >= deadline {
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(1)).await;
        }
        (acked, answered_at)
    }

    /// The owners' counts summed: (received, ran, refused).
    fn owner_counts(&self) -> (u64, u64, u64) {
        self.clusters.iter().fold((0, 0, 0), |(rc, ra, rf), c| {
            let (received, ran, _) = c.delegation_counts();
            (rc + received, ra + ran, rf + c.delegations_refused())
        })
    }

    /// See [`cancelled_unqueued`].
    fn unqueued(&self, t: &Tally) -> u64 {
        let Some(c) = &t.cluster else {
            return 0;
        };
        let sent = c.nodes.iter().map(|n| n.sent).sum();
        let (_, ran, refused) = self.owner_counts();
        cancelled_unqueued(sent, ran, refused, c.refusals_seen, c.cancelled)
    }

    /// Whether every work item and delegation has ended, the cancelled unqueued ones apart.
    pub(super) fn settled(&self, t: &Tally) -> bool {
        let unqueued = i64::try_from(self.unqueued(t)).unwrap_or(i64::MAX);
        t.outstanding == unqueued && t.open.values().all(|v| *v == 0)
    }

    /// Every node leaves the cluster (its tasks stopped, its leases deleted), then the run's
    /// buckets are deleted.
    pub(super) async fn leave(&mut self) {
        for cluster in &self.clusters {
            cluster.stop().await;
        }
        if let Some(first) = self.clusters.first() {
            match first.remove_buckets().await {
                Ok(()) => self.buckets_removed = true,
                Err(e) => eprintln!(
                    "warden: loadtest: the run's buckets ({}_*) were not deleted: {e}",
                    self.namespace
                ),
            }
        }
    }
}

/// The configuration of node `name` of the run's namespace.
fn node_config(url: &str, namespace: &str, name: &str) -> Result<ClusterConfig, ClusterError> {
    let section = ClusterSection {
        connect_timeout_seconds: CONNECT_TIMEOUT.as_secs(),
        ..ClusterSection::default()
    }
    .with_flags(Some(url.to_owned()), Some(name.to_owned()))?;
    let mut config = section.resolve()?.ok_or_else(|| ClusterError::Invalid {
        key: "--cluster",
        value: url.to_owned(),
        allowed: "nats://HOST:PORT",
    })?;
    config.namespace = namespace.to_owned();
    Ok(config)
}

/// [`run_cluster_async`] in its own actix `System` (blocks the calling thread).
///
/// # Errors
/// See [`run_cluster_async`].
///
/// # Panics
/// If called inside a running actix `System` or tokio runtime.
pub fn run_cluster(
    options: LoadtestOptions,
    cluster: &ClusterOptions,
) -> Result<LoadReport, ClusterRunError> {
    actix_rt::System::new().block_on(run_cluster_async(options, cluster))
}

/// Runs the scenario of `options` on `cluster.nodes` nodes joined to the NATS server at
/// `cluster.url` (see the module docs). Every node's agents run on the current arbiter.
///
/// # Errors
/// [`ClusterRunError::Nodes`] for a node count out of range; [`ClusterRunError::Cluster`] when a
/// node cannot join (`cluster: cannot connect to NATS at …`, JetStream refused). Nothing was
/// measured then.
pub async fn run_cluster_async(
    options: LoadtestOptions,
    cluster: &ClusterOptions,
) -> Result<LoadReport, ClusterRunError> {
    let n = cluster.nodes;
    if !(MIN_NODES..=MAX_NODES).contains(&n) {
        return Err(ClusterRunError::Nodes(n));
    }
    let progress = Progress::new(options.progress);
    let scenario = options.scenario;
    let run = format!("{:08x}", rand::random::<u32>());
    let namespace = format!("warden_lt_{run}");
    let names: Vec<String> = (0..n)
        .map(|i| format!("lt-{run}-{}", char::from(b'a' + i as u8)))
        .collect();
    let configs = names
        .iter()
        .map(|name| node_config(&cluster.url, &namespace, name))
        .collect::<Result<Vec<_>, _>>()?;

    // ---- placement: depth d on node d mod N
    let shape = fleet_shape(options.agents, options.fanout, options.depth);
    let node_of = |key: &AgentKey| depth_of(key.as_str()) % n;
    let mut keys: Vec<Vec<AgentKey>> = vec![Vec::new(); n];
    for agent in &shape {
        keys[node_of(&agent.key)].push(agent.key.clone());
    }
    let agents_on: Vec<u64> = keys.iter().map(|k| k.len() as u64).collect();

    let journal = Arc::new(HarnessJournal::default());
    journal.tally.lock().cluster = Some(ClusterTally::new(&agents_on));
    let config = fleet_config(&options);
    let teams: Vec<Supervisor> = (0..n)
        .map(|node| {
            let view = Arc::new(NodeJournal {
                node,
                harness: journal.clone(),
            });
            Supervisor::builder(config.clone(), view)
                .current_arbiter()
                .safety_checks(options.safety)
                .capacity(keys[node].len())
                .build()
        })
        .collect();
    let retries_before = warden_actors::retry_counts();

    // ---- join (before the agents are spawned, as `warden serve` does)
    progress.phase("join", n as u64);
    let mut clusters = Vec::with_capacity(n);
    for ((config, team), keys) in configs.into_iter().zip(&teams).zip(&keys) {
        clusters.push(Cluster::join(config, team.clone(), keys).await?);
        progress.at(clusters.len() as u64);
    }
    let mut nodes = Nodes {
        url: crate::cluster::shown_url(&cluster.url),
        namespace: namespace.clone(),
        names: names.clone(),
        clusters,
        answered: vec![false; n],
        buckets_removed: false,
    };

    // ---- spawn
    let fleet = FleetModels::new(&options);
    let rss_before = proc_status_bytes("VmRSS");
    let mut roots = Vec::new();
    let mut stats: Vec<Vec<Arc<crate::ScriptStats>>> = vec![Vec::new(); n];
    let spawn_start = Instant::now();
    progress.phase("spawn", shape.len() as u64);
    for (index, agent) in shape.into_iter().enumerate() {
        if index % 4096 == 0 {
            progress.at(index as u64);
        }
        let node = node_of(&agent.key);
        let is_root = agent.parent.is_none();
        let (spec, model_stats) = fleet.spec(agent, index);
        stats[node].extend(model_stats);
        match teams[node].spawn(spec) {
            Ok(handle) if is_root => roots.push(handle),
            _ => {}
        }
    }
    progress.note("starting actors".into());
    for team in &teams {
        team.started().await;
    }
    let spawned = Spawned {
        agents: teams.iter().map(|t| t.len() as u64).sum(),
        elapsed: spawn_start.elapsed(),
        rss_growth: proc_status_bytes("VmRSS").saturating_sub(rss_before),
    };
    for cluster in &nodes.clusters {
        cluster.run().await;
    }
    // A halt waits for the acknowledgements of the nodes seen at its node's last beat: before the
    // drive, every node has seen every other one (the first beats ran before the others joined).
    progress.note("waiting for every node's heartbeat".into());
    let deadline = Instant::now() + PEERS_WAIT;
    let everyone = |cluster: &Arc<Cluster>| {
        let peers = cluster.peers();
        names
            .iter()
            .all(|name| name == cluster.node() || peers.contains(name))
    };
    while !nodes.clusters.iter().all(everyone) {
        if Instant::now() >= deadline {
            eprintln!(
                "warden: loadtest: not every node saw every other one's heartbeat within {PEERS_WAIT:?}: \
                 the final halt may not wait for their acknowledgements"
            );
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    let calls_of = |node: &[Arc<crate::ScriptStats>]| -> u64 {
        node.iter()
            .map(|s| s.calls.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    };
    let llm_calls = || -> u64 { stats.iter().map(|s| calls_of(s)).sum() };

    // ---- drive (the roots are the first node's)
    let (driven, storm) = drive(
        &journal,
        &progress,
        &options,
        &teams[0],
        &roots,
        spawned.agents,
        &llm_calls,
    )
    .await;
    drop(roots);
    let mut report = finish_fleet(
        teams,
        Some(&mut nodes),
        &journal,
        &progress,
        &options,
        storm,
        driven,
        &llm_calls,
    )
    .await;
    report.scenario = scenario.as_str().to_owned();
    report.retries = retries_since(&retries_before);
    spawned.apply(&mut report);

    // ---- the nodes' figures
    let t = journal.tally.lock();
    let unqueued = nodes.unqueued(&t);
    report.lost_events = lost_events(&t, unqueued);
    let Some(c) = &t.cluster else {
        return Ok(report);
    };
    let mut figures = Vec::with_capacity(n);
    for (i, name) in names.iter().enumerate() {
        let tally = &c.nodes[i];
        let (received, ran, _) = nodes.clusters[i].delegation_counts();
        figures.push(NodeFigures {
            node: name.clone(),
            agents: agents_on[i],
            turns: tally.turns,
            llm_calls: calls_of(&stats[i]),
            tool_calls: tally.tool_calls,
            delegations_sent: tally.sent,
            delegations_received: received,
            delegations_ran: ran,
            delegations_refused: nodes.clusters[i].delegations_refused(),
            lockouts: tally.lockouts,
            refusals: tally.refusals,
            refused_unknown: tally.refused_unknown,
            halt_answered: nodes.answered.get(i).copied().unwrap_or(false),
            halt_ack_ms: tally.halted_after.map(|d| d.as_secs_f64() * 1000.0),
        });
    }
    let mut trips = c.round_trips_us.clone();
    trips.sort_unstable();
    let (received, ran, _) = nodes.owner_counts();
    let sent: u64 = figures.iter().map(|f| f.delegations_sent).sum();
    let halt_unreached: Vec<String> = figures
        .iter()
        .filter(|f| f.halt_ack_ms.is_none())
        .map(|f| f.node.clone())
        .collect();
    let halt_ms = if halt_unreached.is_empty() {
        figures
            .iter()
            .filter_map(|f| f.halt_ack_ms)
            .fold(None, |max: Option<f64>, ms| {
                Some(max.map_or(ms, |m| m.max(ms)))
            })
    } else {
        None
    };
    let refused_unknown: u64 = figures.iter().map(|f| f.refused_unknown).sum();
    if refused_unknown > 0 {
        eprintln!(
            "warden: loadtest: {refused_unknown} delegations refused as unknown_delegate: their \
             delegate's lease was not found or not read within 2 s (leases not renewed in time?)"
        );
    }
    report.cluster = Some(ClusterFigures {
        url: nodes.url.clone(),
        namespace,
        nodes: n as u64,
        halt_ms,
        halt_unreached,
        delegations_sent: sent,
        delegations_received: received,
        delegations_ran: ran,
        refused_unknown,
        delegations_cancelled: c.cancelled,
        cancelled_unqueued: unqueued,
        // A halt during the run may cancel a delegation before its request went out.
        delegations_unmatched: if scenario == Scenario::HaltStorm {
            0
        } else {
            sent.abs_diff(ran)
        },
        delegation_ms_p50: super::percentile(&trips, 0.50) as f64 / 1000.0,
        delegation_ms_p99: super::percentile(&trips, 0.99) as f64 / 1000.0,
        buckets_removed: nodes.buckets_removed,
    });
    report.nodes = figures;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_protocols::{TerminationReason, TurnOutcome};

    /// A tally of two nodes (roots on node 0, their children on node 1), with `root` sent one
    /// task by the harness.
    fn two_nodes(root: &AgentKey) -> Tally {
        let mut t = Tally {
            cluster: Some(ClusterTally::new(&[1, 1])),
            ..Tally::default()
        };
        t.add(root, 1);
        t
    }

    fn turn(t: &mut Tally, node: usize, agent: &AgentKey) {
        t.count(
            node,
            agent,
            EventKind::StateChanged {
                from: AgentState::WaitingForEvent,
                to: AgentState::Executing,
                cause: "task".into(),
            },
        );
        t.count(
            node,
            agent,
            EventKind::TurnFinished {
                outcome: TurnOutcome::new(TerminationReason::Answered, 1, Some("done".into())),
            },
        );
        t.count(
            node,
            agent,
            EventKind::StateChanged {
                from: AgentState::Executing,
                to: AgentState::WaitingForEvent,
                cause: "done".into(),
            },
        );
    }

    fn delegate(t: &mut Tally, root: &AgentKey, child: &AgentKey, outcome: DelegationOutcome) {
        t.count(
            0,
            root,
            EventKind::DelegationRequested {
                id: 1,
                to: child.clone(),
                hops: 1,
                task: String::new(),
            },
        );
        t.count(
            0,
            root,
            EventKind::DelegationEnded {
                id: 1,
                to: child.clone(),
                outcome,
            },
        );
    }

    fn lost(t: &Tally) -> u64 {
        lost_events(t, 0)
    }

    #[test]
    fn a_delegation_from_node_a_run_on_node_b_is_counted_once() {
        let (root, child) = (AgentKey::from("a0"), AgentKey::from("a0.0"));
        let mut t = two_nodes(&root);
        delegate(&mut t, &root, &child, DelegationOutcome::Completed);
        turn(&mut t, 1, &child);
        turn(&mut t, 0, &root);
        assert_eq!(lost(&t), 0);
        assert_eq!(t.outstanding, 0);
        let c = t.cluster.as_ref().unwrap();
        assert_eq!((c.nodes[0].sent, c.nodes[1].sent), (1, 0));
        assert_eq!((c.nodes[0].turns, c.nodes[1].turns), (1, 1));
        assert_eq!(c.round_trips_us.len(), 1);
    }

    #[test]
    fn a_dropped_or_duplicated_cross_node_delegation_is_lost() {
        let (root, child) = (AgentKey::from("a0"), AgentKey::from("a0.0"));
        // Never ran on node b (the delegator's wait ended without it).
        let mut dropped = two_nodes(&root);
        delegate(
            &mut dropped,
            &root,
            &child,
            DelegationOutcome::TimedOut { after_ms: 1 },
        );
        turn(&mut dropped, 0, &root);
        assert_eq!(lost(&dropped), 1);
        // Ran twice on node b.
        let mut twice = two_nodes(&root);
        delegate(&mut twice, &root, &child, DelegationOutcome::Completed);
        turn(&mut twice, 1, &child);
        turn(&mut twice, 1, &child);
        turn(&mut twice, 0, &root);
        assert_eq!(lost(&twice), 1);
        // A drop is not explained away without a cancelled delegation, whatever the owners say.
        let unqueued = cancelled_unqueued(1, 0, 0, 0, 0);
        assert_eq!(lost_events(&dropped, unqueued), 1);
    }

    #[test]
    fn a_refusal_by_the_owner_after_the_request_ends_the_task_once() {
        let (root, child) = (AgentKey::from("a0"), AgentKey::from("a0.0"));
        let mut t = two_nodes(&root);
        let refusal = DelegationRefusal::EmergencyStop {
            delegate: child.clone(),
            state: AgentState::SafetyLockout,
        };
        delegate(
            &mut t,
            &root,
            &child,
            DelegationOutcome::Failed {
                error: refusal.to_string(),
            },
        );
        t.count(
            0,
            &root,
            EventKind::DelegationRefused {
                to: child.clone(),
                refusal: refusal.clone(),
            },
        );
        turn(&mut t, 0, &root);
        assert_eq!(lost(&t), 0);
        let d = &t.delegations;
        assert_eq!((d.requested, d.accepted, d.refused_locked), (1, 0, 1));
        // The same refusal from the lockout cache, before any request: counted as one attempt.
        t.add(&root, 1);
        t.count(
            0,
            &root,
            EventKind::DelegationRefused {
                to: child.clone(),
                refusal,
            },
        );
        turn(&mut t, 0, &root);
        assert_eq!(lost(&t), 0);
        let d = &t.delegations;
        assert_eq!((d.requested, d.accepted, d.refused_locked), (2, 0, 2));
        // A delegate whose owner was not found: a refusal before the request, counted apart.
        t.add(&root, 1);
        t.count(
            0,
            &root,
            EventKind::DelegationRefused {
                to: child.clone(),
                refusal: DelegationRefusal::UnknownDelegate { delegate: child },
            },
        );
        turn(&mut t, 0, &root);
        assert_eq!(lost(&t), 0);
        let c = t.cluster.as_ref().unwrap();
        assert_eq!((c.nodes[0].refusals, c.nodes[0].refused_unknown), (3, 1));
        assert_eq!((t.delegations.requested, t.refused_other), (3, 1));
    }

    #[test]
    fn only_cancelled_delegations_may_be_unqueued() {
        // 3 sent, 2 ran, 1 of them refused with nobody waiting: 2 never queued, 2 cancelled.
        assert_eq!(cancelled_unqueued(3, 2, 1, 0, 2), 2);
        // More unqueued than cancelled: the rest stays lost.
        assert_eq!(cancelled_unqueued(3, 1, 0, 0, 1), 1);
        assert_eq!(cancelled_unqueued(5, 5, 2, 2, 4), 0);
    }
}
