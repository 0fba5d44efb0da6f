//! Scale-out on NATS JetStream: `warden serve --cluster nats://HOST:PORT --node NAME`
//! (docs/cluster.md). No home-made consensus or membership: every shared fact is a JetStream
//! key-value entry, every fast path a core-NATS subject.
//!
//! Files (the `[cluster]` section, the flags and the join error are the team file's:
//! `src/team/cluster.rs`, `src/team/cluster_error.rs`): `lease.rs` (agent leases, node
//! heartbeats, the fleet listing), `halt.rs` (the halt as state, and its lift), `adopt.rs` (moving
//! a dead node's agents), `failsafe.rs` (no model call while cut off), `delegate.rs` (delegation to
//! another node's agent), `remote.rs` (one agent of another node: where it runs, its halt),
//! `budget.rs` (the team token and cost budgets in slices), `node.rs` (what the server asks of a
//! cluster: [`crate::server::cluster::ClusterNode`]; the routes are the server's). Wire types are in
//! [`warden_protocols::cluster`].
//!
//! # Invariants
//! * **A halt never waits on NATS.** The node that receives `POST /api/halt` raises every local
//!   agent's halt flag (priority 0) before it touches the network; the broadcast, the KV write and the
//!   acknowledgements come after, each bounded by a timeout, and the KV write retries in the
//!   background until it lands.
//! * **The halt epoch only grows.** It is written by compare-and-swap (`epoch + 1` over the revision
//!   read), and a node applies any epoch above its own, from the broadcast, the KV watch or the poll
//!   on every heartbeat, whichever comes first. A node that starts while the cluster is halted halts
//!   its agents before it serves (the model gate is closed until then).
//! * **A lift never overrides a halt it has not seen.** `POST /api/resume` writes `{epoch + 1,
//!   halted: false}` by one compare-and-swap over the revision read (never retried: a moved key is a
//!   `409`), and only a successful write resumes anything; a node applies a lift only above its own
//!   epoch, and a halt racing a lift wins (`halt.rs`).
//! * **An agent runs on one node.** A node starts only the agents whose lease (`agent.KEY` in
//!   `warden_leases`) it holds; a lease held by another node is not taken while it lives (the bucket's
//!   `max_age` is the lease TTL, renewals are revision-checked). A node that finds its lease taken
//!   halts that agent.
//!   An owned agent whose lease was not written for the TTL less a beat starts no model call (the
//!   lease fence, `lease.rs`), so a node that fails to renew stops calling the model for it before
//!   another node can adopt it. A lease that aged out is adopted by `create` (one node wins), with the
//!   agent's shared lockout and the cluster halt applied before it reads anything (`adopt.rs`).
//! * **Lockouts are shared.** A lockout is published to `warden_lockouts` within a beat; a delegation
//!   to an agent of another node that is locked out there is refused (`emergency_stop`); an unlock
//!   on a cluster node happens only after its `locked: false` write succeeded.
//! * **A delegation across nodes runs once per idempotency key.** The delegator's supervisor checks
//!   and waits as for a local delegate; the request is sent until answered; the owner answers every
//!   copy of a key with its first run's result; a halted delegator's cancel halts the delegate.
//! * **The team budgets are claimed before they are spent.** Slices (of tokens, of cost) are added
//!   to `claimed` by compare-and-swap, never past the budget; a node's budget check is against
//!   what it holds.
//! * **Fail safe.** A node whose heartbeats to JetStream have failed for longer than
//!   `cluster.fail_safe_seconds` closes the team's model gate: no model call starts until a
//!   heartbeat succeeds again (after the halt key was read again). It says so in the journal (a
//!   `safety_alert` on every local agent), `GET /api/cluster` and `/metrics`.

mod adopt;
mod budget;
mod delegate;
mod failsafe;
mod halt;
mod lease;
mod lockout;
mod node;
mod remote;

pub use budget::BUDGET_BUCKET;
// The `[cluster]` section, what it resolves to and the join error live with the team file
// (`crate::team`), which this module builds on.
pub use crate::team::cluster::{
    shown_url, ClusterConfig, ClusterSection, NatsSecurity, DEFAULT_NAMESPACE,
};
pub use crate::team::cluster_error::ClusterError;
// The types of its answers to the server (`crate::server::cluster`, where they are defined: the
// server compiles without this module).
pub use crate::server::cluster::{halt_body, ClusterHalt, ClusterLift, LiftError, RemoteHaltError};

use async_nats::jetstream::kv;
use parking_lot::Mutex;
use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use warden_actors::Supervisor;
use warden_protocols::{cluster::HaltState, AgentKey};

/// The bucket of the halt key (in the default namespace: [`ClusterConfig::bucket`]).
pub const HALT_BUCKET: &str = "warden_halt";
/// The halt key.
pub const HALT_KEY: &str = "halt";
/// The bucket of agent leases (`agent.KEY`) and node heartbeats (`node.NAME`).
pub const LEASE_BUCKET: &str = "warden_leases";
/// The bucket of shared lockouts (`agent.KEY`).
pub const LOCKOUT_BUCKET: &str = "warden_lockouts";
/// The bucket of delegated tasks' records by idempotency key (`task.KEY`; entries age out after
/// `TASK_TTL`, an hour).
pub const TASK_BUCKET: &str = "warden_tasks";
/// The core-NATS subject a halt is broadcast on (replies are the acknowledgements), in the default
/// namespace ([`ClusterConfig::subject`]).
/// (Delegations to a node's agents: `warden.cluster.delegate.NODE`, see `delegate.rs`.)
pub const HALT_SUBJECT: &str = "warden.cluster.halt";

/// This node's membership of a cluster. Made by [`Cluster::join`] before the team is spawned,
/// started by [`Cluster::run`] after.
pub struct Cluster {
    config: ClusterConfig,
    /// Random per process: a restarted node takes its own leases back.
    instance: String,
    client: async_nats::Client,
    halt_kv: kv::Store,
    leases: kv::Store,
    lockouts_kv: kv::Store,
    budget_kv: kv::Store,
    /// Every agent's shared lockout as last seen (kept by the watch).
    lockouts: lockout::Lockouts,
    /// The other nodes whose heartbeat lived at the last beat (whose acks a halt waits for).
    peers: Mutex<Vec<String>>,
    /// Agents being unlocked through the cluster now (their lockout is not republished meanwhile).
    unlocking: Mutex<std::collections::BTreeSet<AgentKey>>,
    supervisor: Supervisor,
    /// The halt epoch this node has applied.
    epoch: AtomicU64,
    /// The highest epoch of a halt this node applied (set before its agents are halted).
    halted_at: AtomicU64,
    /// The highest epoch of a lift this node applied. Halted while `halted_at` is at or above it
    /// (a halt and a lift of one epoch: the halt wins).
    lifted: AtomicU64,
    /// The halt key as last read (and its revision).
    halt: Mutex<(HaltState, u64)>,
    /// Agents this node holds the lease of, with the lease's revision.
    owned: Mutex<BTreeMap<AgentKey, u64>>,
    /// Where the next beat's lease renewal starts (after the last one the previous beat renewed).
    renew_from: std::sync::atomic::AtomicUsize,
    /// When each owned lease's last successful write was sent (the lease fence, `lease.rs`).
    renewed: Mutex<std::collections::HashMap<AgentKey, std::time::Instant>>,
    /// Agents of the team file another node owns (not started here, or given up), with that node.
    elsewhere: Mutex<BTreeMap<AgentKey, String>>,
    /// Agents this node ran and gave up (their lease went to another node: halted here), with
    /// their halt epoch after that halt. Adopted back like the others (`adopt.rs`).
    given_up: Mutex<BTreeMap<AgentKey, u64>>,
    fail: failsafe::FailSafe,
    /// Delegations received from other nodes, by idempotency key.
    tasks: Arc<delegate::Tasks>,
    /// The tasks [`Cluster::run`] started (aborted by [`Cluster::stop`]).
    workers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Held while a lift of the cluster halt is written or applied (one at a time; a halt never
    /// takes it).
    lifting: tokio::sync::Mutex<()>,
    /// What adopting an agent of a dead node needs (set by `warden serve`; unset: no adoption).
    adopter: std::sync::OnceLock<adopt::Adopter>,
    /// The status each agent of `elsewhere` had in its owner's lease when last read, with the
    /// node and whether it was stopped by the fleet halt (an adopter brings it up halted or paused
    /// as it was there).
    last_seen: Mutex<BTreeMap<AgentKey, (String, warden_protocols::AgentStatus, bool)>>,
    /// Since when each agent of `elsewhere` was seen without a lease (adoption waits on it).
    gone_since: Mutex<BTreeMap<AgentKey, tokio::time::Instant>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.config.node)
            .field("url", &self.config.shown_url())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Joins the cluster for `supervisor`'s team: closes the team's model gate (until
    /// [`Cluster::run`]), connects, opens (or creates) the buckets, reads the halt key and claims the
    /// leases of `agents`. The agents whose lease another node holds are not this node's
    /// ([`Cluster::owns`]).
    ///
    /// # Errors
    /// [`ClusterError::Connect`] when NATS cannot be reached within the connect timeout,
    /// [`ClusterError::JetStream`] when JetStream refuses.
    pub async fn join(
        config: ClusterConfig,
        supervisor: Supervisor,
        agents: &[AgentKey],
    ) -> Result<Arc<Cluster>, ClusterError> {
        supervisor
            .model_gate()
            .close("cluster: joining (the halt key is not read yet)");
        let client = connect(&config).await?;
        let js = async_nats::jetstream::new(client.clone());
        let halt_kv = bucket(&js, &config, &config.bucket("halt"), 5, Duration::ZERO).await?;
        let leases = bucket(&js, &config, &config.bucket("leases"), 1, config.lease_ttl).await?;
        let lockouts_kv =
            bucket(&js, &config, &config.bucket("lockouts"), 5, Duration::ZERO).await?;
        let budget_kv = bucket(&js, &config, &config.bucket("budget"), 5, Duration::ZERO).await?;
        let tasks_kv = bucket(&js, &config, &config.bucket("tasks"), 1, delegate::TASK_TTL).await?;
        let cluster = Arc::new(Cluster {
            instance: format!("{:016x}", rand::random::<u64>()),
            fail: failsafe::FailSafe::new(),
            config,
            client,
            halt_kv,
            leases,
            lockouts_kv,
            budget_kv,
            lockouts: Arc::default(),
            unlocking: Mutex::default(),
            peers: Mutex::default(),
            supervisor,
            epoch: AtomicU64::new(0),
            halted_at: AtomicU64::new(0),
            lifted: AtomicU64::new(0),
            halt: Mutex::new((HaltState::default(), 0)),
            owned: Mutex::default(),
            renew_from: std::sync::atomic::AtomicUsize::new(0),
            renewed: Mutex::default(),
            elsewhere: Mutex::default(),
            given_up: Mutex::default(),
            tasks: Arc::new(delegate::Tasks::new(tasks_kv)),
            workers: Mutex::default(),
            lifting: tokio::sync::Mutex::new(()),
            adopter: std::sync::OnceLock::new(),
            gone_since: Mutex::default(),
            last_seen: Mutex::default(),
        });
        let (state, revision) = cluster
            .read_halt()
            .await
            .map_err(|e| ClusterError::js("reading the halt key", e))?;
        cluster.epoch.store(state.epoch, Ordering::SeqCst);
        match state.halted {
            true => cluster.halted_at.store(state.epoch, Ordering::SeqCst),
            false => cluster.lifted.store(state.epoch, Ordering::SeqCst),
        }
        *cluster.halt.lock() = (state, revision);
        for key in agents {
            cluster.claim(key).await?;
        }
        Ok(cluster)
    }

    /// Whether this node holds `agent`'s lease (and so starts it).
    pub fn owns(&self, agent: &str) -> bool {
        self.owned.lock().contains_key(agent)
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.config.node
    }

    /// Starts the node's part after the team is spawned: a halted cluster halts the team first (a
    /// lifted one resumes the agents a cluster halt had stopped before this node restarted), then
    /// the model gate opens and the subscriber, watch, heartbeat and fail-safe tasks start.
    pub async fn run(self: &Arc<Self>) {
        let state = self.halt.lock().0.clone();
        for (agent, node) in self.elsewhere.lock().iter() {
            eprintln!("warden: cluster: agent {agent} is owned by node {node}: not started here");
        }
        if state.halted {
            eprintln!(
                "warden: cluster is halted (epoch {}, by {} on node {}: {}): coming up halted",
                state.epoch, state.by, state.node, state.reason
            );
            self.supervisor.halt_all().await;
        } else if state.epoch > 0 && self.supervisor.fleet_halted() {
            // Agents a cluster halt stopped before this node went down (their journal says so),
            // lifted since: resumed as the lift would have resumed them. (Epoch 0: this cluster
            // never had a halt, so theirs was this node's own from before it joined: kept.)
            let operator = format!(
                "{} (lift of the cluster halt, epoch {}, read at the start of node {})",
                state.by, state.epoch, self.config.node
            );
            let outcomes = self
                .supervisor
                .resume_fleet_halt(&operator)
                .await
                .unwrap_or_default();
            let resumed = outcomes.iter().filter(|o| o.resumed).count();
            eprintln!(
                "warden: cluster halt was lifted while this node was down (epoch {}): {resumed} \
                 of the {} agents it had stopped resumed",
                state.epoch,
                outcomes.len()
            );
        }
        self.take_back_at_start(state.halted).await;
        self.share_budget().await;
        self.supervisor
            .model_gate()
            .set_fence(Arc::new(lease::LeaseFence {
                cluster: Arc::downgrade(self),
            }));
        self.supervisor
            .set_remote_agents(Arc::new(delegate::Remote {
                cluster: Arc::downgrade(self),
                lockouts: self.lockouts.clone(),
            }));
        let (delegations, cancels) = self.delegation_subscriptions().await;
        self.fail.beat_ok();
        self.supervisor.model_gate().open();
        let mut workers = self.workers.lock();
        if let Some(delegations) = delegations {
            workers.push(actix_rt::spawn(
                self.clone().answer_delegations(delegations),
            ));
        }
        if let Some(cancels) = cancels {
            workers.push(actix_rt::spawn(self.clone().answer_cancels(cancels)));
        }
        workers.extend([
            actix_rt::spawn(self.clone().answer_halts()),
            actix_rt::spawn(self.clone().answer_agent_halts()),
            actix_rt::spawn(self.clone().watch_halt()),
            actix_rt::spawn(self.clone().watch_lockouts()),
            actix_rt::spawn(self.clone().beat()),
            actix_rt::spawn(self.clone().guard()),
        ]);
        drop(workers);
        eprintln!(
            "warden: cluster node {} joined {} ({} agents owned, halt epoch {})",
            self.config.node,
            self.config.shown_url(),
            self.owned.lock().len(),
            state.epoch
        );
    }
}

impl Cluster {
    /// Stops this node's part of the cluster (for a process that runs several nodes and outlives
    /// them: `warden loadtest --cluster`): the tasks [`Cluster::run`] started are aborted (no more
    /// beats, watches, halt or delegation answers), then [`Cluster::leave`]. The team is left as
    /// it is (shut it down apart).
    pub async fn stop(&self) {
        for worker in self.workers.lock().drain(..) {
            worker.abort();
        }
        self.leave().await;
    }

    /// Deletes this namespace's buckets (their streams `KV_NAME`), bounded by the connect timeout.
    /// For namespaces made for one run (`warden loadtest --cluster`); refused for
    /// [`DEFAULT_NAMESPACE`], whose buckets are a served cluster's state.
    ///
    /// # Errors
    /// [`ClusterError::Invalid`] for the default namespace, [`ClusterError::JetStream`] when a
    /// stream could not be deleted.
    pub async fn remove_buckets(&self) -> Result<(), ClusterError> {
        if self.config.namespace == DEFAULT_NAMESPACE {
            return Err(ClusterError::Invalid {
                key: "namespace",
                value: DEFAULT_NAMESPACE.into(),
                allowed: "a namespace of its own (the default one's buckets are never deleted)",
            });
        }
        let js = async_nats::jetstream::new(self.client.clone());
        for base in ["halt", "leases", "lockouts", "budget", "tasks"] {
            let stream = format!("KV_{}", self.config.bucket(base));
            let deleting = js.delete_stream(&stream);
            match tokio::time::timeout(self.config.connect_timeout, deleting).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(ClusterError::js(&format!("deleting {stream}"), e)),
                Err(_) => {
                    return Err(ClusterError::JetStream(format!(
                        "deleting {stream}: no answer"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// `warden serve`'s hook: with a `[cluster]`, joins it for `file`'s agents and keeps in `file` only
/// those this node owns (`None`: no cluster, `file` untouched).
///
/// # Errors
/// Those of [`ClusterSection::resolve`] and [`Cluster::join`].
pub async fn join_for(
    file: &mut crate::team::TeamFile,
    supervisor: &Supervisor,
) -> Result<Option<Arc<Cluster>>, ClusterError> {
    let Some(config) = file.cluster.resolve()? else {
        return Ok(None);
    };
    let keys: Vec<AgentKey> = file.agents.iter().map(|a| a.key.as_str().into()).collect();
    let cluster = Cluster::join(config, supervisor.clone(), &keys).await?;
    file.agents.retain(|a| cluster.owns(&a.key));
    Ok(Some(cluster))
}

/// Connects with fast reconnects (a NATS restart is noticed within a second of its return).
async fn connect(config: &ClusterConfig) -> Result<async_nats::Client, ClusterError> {
    let options = async_nats::ConnectOptions::new()
        .name(format!("warden-{}", config.node))
        .connection_timeout(config.connect_timeout)
        .ping_interval(Duration::from_secs(1))
        .request_timeout(Some(config.beat().max(Duration::from_millis(500))))
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis(100 * u64::try_from(attempts.min(10)).unwrap_or(10))
        });
    let options = match config.credentials() {
        Some((user, Some(password))) => options.user_and_password(user, password),
        Some((token, None)) => options.token(token),
        None => options,
    };
    let options = secure(options, &config.security)?;
    let urls: Vec<&str> = config.url.split(',').map(str::trim).collect();
    let connecting = options.connect(urls.as_slice());
    match tokio::time::timeout(config.connect_timeout, connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(ClusterError::Connect {
            url: config.shown_url(),
            cause: e.to_string(),
        }),
        Err(_) => Err(ClusterError::Connect {
            url: config.shown_url(),
            cause: format!("no connection within {:?}", config.connect_timeout),
        }),
    }
}

/// `options` with the nkey and TLS of `security`. The files are checked here, so that a missing or
/// wrong one is said with its key rather than as the client's connect error.
fn secure(
    mut options: async_nats::ConnectOptions,
    security: &NatsSecurity,
) -> Result<async_nats::ConnectOptions, ClusterError> {
    let readable = |key: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| ClusterError::File {
            key,
            path: path.display().to_string(),
            cause: e.to_string(),
        })
    };
    if let Some(path) = &security.nkey_seed_file {
        let text = readable("cluster.nkey_seed_file", path)?;
        let seed = String::from_utf8(text).unwrap_or_default();
        let seed = seed.trim();
        // Checked before it is handed over: the client would only fail the handshake. The cause
        // never quotes the file (it is a secret).
        let user = nkeys::KeyPair::from_seed(seed)
            .is_ok_and(|pair| pair.key_pair_type() == nkeys::KeyPairType::User);
        if !user {
            return Err(ClusterError::File {
                key: "cluster.nkey_seed_file",
                path: path.display().to_string(),
                cause: "not a NATS user nkey seed (one line starting with SU)".into(),
            });
        }
        options = options.nkey(seed.to_owned());
    }
    if let Some(path) = &security.credentials_file {
        let text = readable("cluster.credentials_file", path)?;
        let text = String::from_utf8(text).unwrap_or_default();
        // The client's parse error names what is missing (the JWT, the seed), never the content.
        options = options.credentials(&text).map_err(|e| ClusterError::File {
            key: "cluster.credentials_file",
            path: path.display().to_string(),
            cause: format!("not a NATS credentials file: {e}"),
        })?;
    }
    if let Some(path) = &security.tls_ca_file {
        readable("cluster.tls_ca_file", path)?;
        options = options.add_root_certificates(path.clone());
    }
    if let Some((cert, key)) = &security.tls_client {
        readable("cluster.tls_cert_file", cert)?;
        readable("cluster.tls_key_file", key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options.require_tls(security.tls_required))
}

/// Opens the bucket, creating it when missing (`max_age` zero: entries never expire), retrying
/// until `config.connect_timeout` (a NATS cluster that just started may still be electing its
/// JetStream leader).
///
/// The bucket's stream is created here rather than by `create_key_value`: the client reads the
/// account's info first, in a shape nats-server 2.9 does not send. The stream is the one the
/// client would make (`KV_NAME` on `$KV.NAME.>`, rollups, direct gets, discard new).
async fn bucket(
    js: &async_nats::jetstream::Context,
    config: &ClusterConfig,
    name: &str,
    history: i64,
    max_age: Duration,
) -> Result<kv::Store, ClusterError> {
    use async_nats::jetstream::stream;
    let two_minutes = Duration::from_secs(120);
    let stream_config = stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: history,
        max_age,
        // The server refuses a duplicate window longer than max_age (its default is 2 minutes).
        duplicate_window: if max_age.is_zero() {
            two_minutes
        } else {
            max_age.min(two_minutes)
        },
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        num_replicas: config.replicas,
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + config.connect_timeout;
    loop {
        if let Ok(store) = js.get_key_value(name).await {
            return Ok(store);
        }
        let created = js.get_or_create_stream(stream_config.clone()).await;
        match js.get_key_value(name).await {
            Ok(store) => return Ok(store),
            Err(get) if tokio::time::Instant::now() >= deadline => {
                return Err(match created {
                    Err(create) => ClusterError::js(&format!("bucket {name}"), create),
                    Ok(_) => ClusterError::js(&format!("bucket {name}"), get),
                })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// A KV key for `prefix` and an agent key or node name: kept as is when it only has characters KV
/// keys allow, otherwise each other byte as `=XX`.
pub(crate) fn kv_key(prefix: &str, name: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + 1 + name.len());
    key.push_str(prefix);
    key.push('.');
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            key.push(char::from(b));
        } else {
            key.push_str(&format!("={b:02X}"));
        }
    }
    key
}

impl ClusterError {
    /// JetStream's errors, with what was being done.
    fn js(context: &str, err: impl std::fmt::Display) -> Self {
        ClusterError::JetStream(format!("{context}: {err}"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kv_keys_escape_what_kv_does_not_allow() {
        assert_eq!(super::kv_key("agent", "scribe-1"), "agent.scribe-1");
        assert_eq!(super::kv_key("agent", "a.b c"), "agent.a=2Eb=20c");
    }
}
