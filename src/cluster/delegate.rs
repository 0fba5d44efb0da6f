//! Cross-node delegation: a delegation to an agent another node owns goes as a request on
//! `warden.cluster.delegate.NODE` ([`RemoteTask`], the reply a [`RemoteReply`]).
//!
//! * **Delegator's node.** The supervisor keeps every check of a local delegation (cycle, hops,
//!   slots, the shared lockout cache) and its chain wait; this module finds the owner (the agent's
//!   lease) and sends the task, again every [`RESEND`] while no reply came (at-least-once, one
//!   inbox for every copy), each copy to the node whose lease it reads then (an owner that died
//!   and whose agent was adopted gets no more copies: the adopter does). A halt of the delegator drops the wait and sends a [`RemoteCancel`]
//!   on `warden.cluster.delegate.NODE.cancel` (best effort, core NATS).
//! * **Owner's node.** Runs a task once per idempotency key (`instance/delegator/run id/call id`,
//!   the instance random per delegator process): a copy that arrives while the first runs, or
//!   after it ended, is answered with the same result. The last [`KEEP`] keys are remembered in
//!   memory, and every task has a [`TaskRecord`] in the bucket `warden_tasks` (written `running`
//!   before the run, then with its reply; aged out after [`TASK_TTL`]): a key the memory does not
//!   have (the owner restarted, or forgot it) is looked up there first, and a copy of a task that
//!   ended is answered from its record. A record left `running` by another process is a run a
//!   crash cut short: the task runs again (at-least-once). When JetStream does not answer within
//!   [`RECORD_WAIT`], the task runs (the memory still holds the key for this process). A reply
//!   leaves only after the delegate's turn is durable in the owner's journal and the record holds
//!   the reply (or its write's bound passed). A cancel
//!   for a task still running halts the delegate (cause `parent`); a cancel that comes before any
//!   copy of its task (NATS orders nothing across subjects) leaves the key answered `abandoned`,
//!   so a late copy does not start it. Every cancel is acknowledged.
//! * **Cancels are sent until acknowledged**, as requests, for at most [`CANCEL_FOR`]: a cancel
//!   lost to a partition or a reconnect is sent again.
//!
//! # Invariants
//! * A halted delegator's cancel reaches a live owner unless the two are cut off from each other
//!   for longer than [`CANCEL_FOR`].
//! * One run per key per process: the memory entry is made, synchronously, before anything
//!   awaits, so every copy that arrives meanwhile shares the first copy's answer.
//! * A task whose record holds a reply is never run again while the record lives.
//! * A reply that left the owner names a turn that is on the owner's disk, and (unless JetStream
//!   did not answer within [`RECORD_WAIT`]) in the task's record.

use super::{lockout::Lockouts, Cluster};
use async_nats::jetstream::kv;
use futures::{
    future::{BoxFuture, Shared},
    FutureExt, StreamExt,
};
use parking_lot::Mutex;
use std::{
    collections::{HashMap, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Weak,
    },
    time::Duration,
};
use warden_actors::RemoteAgents;
use warden_protocols::{
    cluster::{RemoteCancel, RemoteReply, RemoteTask, TaskRecord},
    AgentKey, AgentState, DelegationRefusal, HaltCause,
};

/// How often a delegator sends its task again while no reply came.
pub(super) const RESEND: Duration = Duration::from_secs(2);
/// How long a halted delegator sends its cancel until the owner acknowledges it.
pub(super) const CANCEL_FOR: Duration = Duration::from_secs(30);
/// How long one copy of a cancel waits for its acknowledgement.
const CANCEL_ACK_WAIT: Duration = Duration::from_secs(1);
/// How many tasks' results an owner remembers in memory for copies of their request.
pub(super) const KEEP: usize = 4096;
/// How long a task's record stays in `warden_tasks` (the bucket's `max_age`): far longer than a
/// delegator sends copies (its chain wait).
pub(super) const TASK_TTL: Duration = Duration::from_secs(3600);
/// How long a delegator waits for the delegate's lease when it looks its owner up again.
const OWNER_WAIT: Duration = Duration::from_secs(1);
/// How long the owner waits for a record lookup before it runs the task anyway.
pub(super) const RECORD_WAIT: Duration = Duration::from_secs(2);
/// A reply larger than this is not recorded (a NATS message is at most 1 MiB by default): copies
/// after a restart then run the task again.
const RECORD_MAX_BYTES: usize = 512 * 1024;

/// The subject `node` receives delegations on (`warden.cluster.delegate.NODE` in the default
/// namespace).
pub(crate) fn subject(config: &super::ClusterConfig, node: &str) -> String {
    config.subject(&format!("delegate.{node}"))
}

type Answer = Shared<BoxFuture<'static, RemoteReply>>;

/// The owner's record of tasks received, by idempotency key: in memory (bounded, oldest forgotten
/// first) and in `warden_tasks`.
pub(super) struct Tasks {
    inner: Mutex<TasksInner>,
    records: kv::Store,
    /// Requests received (every copy).
    pub(super) received: AtomicU64,
    /// Tasks run (one per key).
    pub(super) ran: AtomicU64,
    /// Copies answered from a record another process of this node wrote (after a restart).
    pub(super) recovered: AtomicU64,
    /// Of those, the ones answered `refused` (never queued on the agent).
    pub(super) refused: AtomicU64,
}

#[derive(Default)]
struct TasksInner {
    by_key: HashMap<String, (AgentKey, Answer)>,
    order: VecDeque<String>,
}

impl TasksInner {
    /// Keeps `key`'s answer, forgetting the oldest key past [`KEEP`].
    fn remember(&mut self, key: String, to: AgentKey, answer: Answer) {
        self.by_key.insert(key.clone(), (to, answer));
        self.order.push_back(key);
        while self.order.len() > KEEP {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
            }
        }
    }
}

/// Who runs tasks here: the record's `node` and `instance`.
struct Runner {
    supervisor: warden_actors::Supervisor,
    node: String,
    instance: String,
}

impl Tasks {
    pub(super) fn new(records: kv::Store) -> Tasks {
        Tasks {
            inner: Mutex::default(),
            records,
            received: AtomicU64::new(0),
            ran: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// The answer to `task`: the running or finished one of its key (in memory, else in its
    /// record), or a new run.
    fn answer(self: &Arc<Self>, runner: Runner, task: RemoteTask) -> Answer {
        self.received.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.lock();
        if let Some((_, answer)) = inner.by_key.get(&task.key) {
            return answer.clone();
        }
        let key = task.key.clone();
        let to = task.to.clone();
        let answer = self.clone().run_once(runner, task).boxed().shared();
        // Runs to its end even if every copy's responder is gone.
        actix_rt::spawn(answer.clone().map(drop));
        inner.remember(key, to, answer.clone());
        answer
    }

    /// The reply of the record of `task`'s key if the task ended; else runs it. The record is
    /// created `running` first — one JetStream round trip before the run, which is also the
    /// lookup: only a key that has a record already is read — and gets the reply before the reply
    /// is sent, which is after the delegate's turn is durable in this node's journal
    /// ([`warden_actors::Supervisor::run_remote_task`]): once a reply has left, neither a restart
    /// of this node nor a copy of the request runs the task again.
    async fn run_once(self: Arc<Self>, runner: Runner, task: RemoteTask) -> RemoteReply {
        let record_key = super::kv_key("task", &task.key);
        let mut record = TaskRecord {
            node: runner.node,
            instance: runner.instance,
            reply: None,
        };
        let create = self.records.create(&record_key, bytes_of(&record).into());
        let created = tokio::time::timeout(RECORD_WAIT, create).await;
        let exists =
            matches!(&created, Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists);
        if exists {
            let found = tokio::time::timeout(RECORD_WAIT, self.records.get(&record_key)).await;
            if let Ok(Ok(Some(bytes))) = found {
                if let Ok(TaskRecord {
                    reply: Some(reply), ..
                }) = serde_json::from_slice::<TaskRecord>(&bytes)
                {
                    self.recovered.fetch_add(1, Ordering::Relaxed);
                    return reply;
                }
            }
            // A run of another process that a crash cut short: this one runs it (at-least-once).
            self.put(&record_key, &record).await;
        } else if !matches!(created, Ok(Ok(_))) {
            eprintln!("warden: cluster: delegated task {record_key}: no record (JetStream did not answer): it runs");
        }
        self.ran.fetch_add(1, Ordering::Relaxed);
        let reply = runner.supervisor.run_remote_task(task).await;
        if matches!(reply, RemoteReply::Refused { .. }) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        // The record gets the reply before the reply leaves (bounded by `RECORD_WAIT`): an owner
        // killed right after it answered, whose answer was lost, answers a later copy from the
        // record instead of running the task again.
        record.reply = Some(reply.clone());
        self.put(&record_key, &record).await;
        reply
    }

    /// Writes a record, bounded by [`RECORD_WAIT`]; a failure is only said (the memory still
    /// answers copies for this process).
    async fn put(&self, key: &str, record: &TaskRecord) {
        let body = bytes_of(record);
        if body.len() > RECORD_MAX_BYTES {
            eprintln!(
                "warden: cluster: the reply to delegated task {key} is {} bytes (> {RECORD_MAX_BYTES}): not recorded",
                body.len()
            );
            return;
        }
        let written = tokio::time::timeout(RECORD_WAIT, self.records.put(key, body.into())).await;
        if !matches!(written, Ok(Ok(_))) {
            eprintln!("warden: cluster: delegated task {key}: its record was not written (JetStream did not answer)");
        }
    }

    /// A cancel for `key` that came before any copy of its task: the key is answered
    /// `abandoned` from now on (nothing runs). `false` when the key is known already.
    fn cancelled_before(&self, key: &str, from: &AgentKey) -> bool {
        let mut inner = self.inner.lock();
        if inner.by_key.contains_key(key) {
            return false;
        }
        let abandoned = futures::future::ready(RemoteReply::Abandoned)
            .boxed()
            .shared();
        // The delegate is not known (no copy came): the delegator stands in for it; the entry
        // is never `running`, so it is never halted.
        inner
            .by_key
            .insert(key.to_owned(), (from.clone(), abandoned));
        inner.order.push_back(key.to_owned());
        while inner.order.len() > KEEP {
            if let Some(old) = inner.order.pop_front() {
                inner.by_key.remove(&old);
            }
        }
        true
    }

    /// The delegate of task `key`, while it runs.
    fn running(&self, key: &str) -> Option<AgentKey> {
        let inner = self.inner.lock();
        let (to, answer) = inner.by_key.get(key)?;
        answer.peek().is_none().then(|| to.clone())
    }
}

/// What this node knows of agents other nodes run, as the supervisor's delegation asks it.
pub(super) struct Remote {
    pub(super) cluster: Weak<Cluster>,
    pub(super) lockouts: Lockouts,
}

impl RemoteAgents for Remote {
    fn refusal(&self, agent: &AgentKey) -> Option<DelegationRefusal> {
        let locked = self
            .lockouts
            .lock()
            .get(agent)
            .is_some_and(|(e, _)| e.locked);
        locked.then(|| DelegationRefusal::EmergencyStop {
            delegate: agent.clone(),
            state: AgentState::SafetyLockout,
        })
    }

    fn owner(&self, agent: &AgentKey) -> BoxFuture<'static, Option<String>> {
        let cluster = self.cluster.upgrade();
        let agent = agent.clone();
        Box::pin(async move {
            let cluster = cluster?;
            let read = cluster.owner_of(agent.as_str());
            let node = tokio::time::timeout(Duration::from_secs(2), read)
                .await
                .ok()??;
            (node != cluster.config.node).then_some(node)
        })
    }

    fn delegate(&self, node: &str, mut task: RemoteTask) -> BoxFuture<'static, RemoteReply> {
        let Some(cluster) = self.cluster.upgrade() else {
            return Box::pin(async { RemoteReply::Abandoned });
        };
        task.key = cluster.task_key(&task.key);
        Box::pin(cluster.send_task(node.to_owned(), task))
    }

    fn cancel(&self, node: &str, key: &str, from: &AgentKey) {
        let Some(cluster) = self.cluster.upgrade() else {
            return;
        };
        // Sent while this node applies a cluster halt (its epoch is set before any agent is
        // halted, so before this slot is dropped) or is halted by one: the owner is told its
        // epoch. (The fleet halt's note is no test: the turn, on another arbiter, may end and
        // drop this slot between the halt flags and the note.)
        let halted_at = cluster.halted_at.load(Ordering::SeqCst);
        let halt_epoch = (halted_at > 0 && halted_at >= cluster.lifted.load(Ordering::SeqCst))
            .then_some(halted_at);
        let cancel = RemoteCancel {
            key: cluster.task_key(key),
            from: from.clone(),
            halt_epoch,
        };
        let subject = format!("{}.cancel", subject(&cluster.config, node));
        let body = bytes_of(&cancel);
        actix_rt::spawn(async move {
            let deadline = tokio::time::Instant::now() + CANCEL_FOR;
            while tokio::time::Instant::now() < deadline {
                let ask = cluster.client.request(subject.clone(), body.clone().into());
                match tokio::time::timeout(CANCEL_ACK_WAIT, ask).await {
                    Ok(Ok(_)) => return,
                    // No responder (the owner is not subscribed now) fails at once: not a spin.
                    Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(250)).await,
                    Err(_) => {}
                }
            }
            eprintln!(
                "warden: cluster: the cancel of delegated task {} was not acknowledged within {CANCEL_FOR:?}",
                cancel.key
            );
        });
    }
}

impl Cluster {
    /// The idempotency key on the wire: the supervisor's (`agent/run id/call id`) after this
    /// process's instance. Run ids count from 1 again in a restarted process: the instance keeps a
    /// key of this run from meeting one of an earlier process in the owner's memory.
    fn task_key(&self, key: &str) -> String {
        format!("{}/{key}", self.instance)
    }

    /// Sends `task` to `node` every [`RESEND`] until a reply comes on the one inbox. Before each
    /// copy after the first, the delegate's lease is read again: when another node holds it now
    /// (the owner died and another node adopted the agent), the copies go there — the same key, so
    /// the adopter runs the task once (or answers it from the record, if the dead owner finished
    /// it).
    async fn send_task(self: Arc<Self>, mut node: String, task: RemoteTask) -> RemoteReply {
        let mut subject = subject(&self.config, &node);
        let body = bytes_of(&task);
        let inbox = self.client.new_inbox();
        loop {
            let Ok(mut replies) = self.client.subscribe(inbox.clone()).await else {
                tokio::time::sleep(RESEND).await;
                continue;
            };
            loop {
                let sent = self
                    .client
                    .publish_with_reply(subject.clone(), inbox.clone(), body.clone().into())
                    .await;
                if sent.is_err() {
                    tokio::time::sleep(RESEND).await;
                    continue;
                }
                // Until the period ends: a reply, or something else on the inbox — NATS's "no
                // responders" status when nothing listens on the owner's subject (it is down),
                // which is waited out, not answered at once with another copy (a spin).
                let deadline = tokio::time::Instant::now() + RESEND;
                let ended = loop {
                    match tokio::time::timeout_at(deadline, replies.next()).await {
                        Ok(Some(message)) => {
                            if let Ok(reply) = serde_json::from_slice(&message.payload) {
                                return reply;
                            }
                        }
                        Ok(None) => break true,
                        Err(_) => break false,
                    }
                };
                if ended {
                    break; // the subscription ended: subscribe again
                }
                // No reply yet: send again (same key), to the owner the lease names now.
                let lookup = self.owner_of(task.to.as_str());
                if let Ok(Some(owner)) = tokio::time::timeout(OWNER_WAIT, lookup).await {
                    if owner != node {
                        eprintln!(
                            "warden: cluster: agent {} moved from node {node} to node {owner}: \
                             delegated task {} sent there",
                            task.to, task.key
                        );
                        subject = self::subject(&self.config, &owner);
                        node = owner;
                    }
                }
            }
        }
    }

    /// Subscribes to this node's delegations and their cancels, and flushes: once this returns,
    /// the NATS server has both subscriptions (a node that answers `/healthz` answers its
    /// delegations too: a request sent then finds a responder). `None` for one that failed (said).
    pub(super) async fn delegation_subscriptions(
        &self,
    ) -> (
        Option<async_nats::Subscriber>,
        Option<async_nats::Subscriber>,
    ) {
        let tasks = subject(&self.config, &self.config.node);
        let cancels = format!("{tasks}.cancel");
        let (tasks, cancels) = (
            self.client.subscribe(tasks).await,
            self.client.subscribe(cancels).await,
        );
        if let Err(e) = &tasks {
            eprintln!("warden: cluster: cannot receive delegations: {e}");
        }
        if let Err(e) = &cancels {
            eprintln!("warden: cluster: cannot receive the cancels of delegations: {e}");
        }
        let _ = tokio::time::timeout(RECORD_WAIT, self.client.flush()).await;
        (tasks.ok(), cancels.ok())
    }

    /// Answers delegations sent to this node (`requests`: [`Cluster::delegation_subscriptions`]),
    /// each key run once.
    pub(super) async fn answer_delegations(self: Arc<Self>, mut requests: async_nats::Subscriber) {
        while let Some(message) = requests.next().await {
            let Some(reply_to) = message.reply else {
                continue;
            };
            let Ok(task) = serde_json::from_slice::<RemoteTask>(&message.payload) else {
                continue;
            };
            let runner = Runner {
                supervisor: self.supervisor.clone(),
                node: self.config.node.clone(),
                instance: self.instance.clone(),
            };
            let answer = self.tasks.answer(runner, task);
            let client = self.client.clone();
            actix_rt::spawn(async move {
                let reply = answer.await;
                let _ = client.publish(reply_to, bytes_of(&reply).into()).await;
            });
        }
    }

    /// Halts the delegate of a task still running whose delegator was halted.
    pub(super) async fn answer_cancels(self: Arc<Self>, mut cancels: async_nats::Subscriber) {
        while let Some(message) = cancels.next().await {
            let Ok(cancel) = serde_json::from_slice::<RemoteCancel>(&message.payload) else {
                continue;
            };
            if let Some(to) = self.tasks.running(&cancel.key) {
                if self.cluster_halt_first(&cancel).await {
                    let cause = HaltCause::Parent {
                        parent: cancel.from,
                    };
                    let _ = self.supervisor.halt(to.as_str(), cause).await;
                }
            } else {
                self.tasks.cancelled_before(&cancel.key, &cancel.from);
            }
            if let Some(reply_to) = message.reply {
                let _ = self.client.publish(reply_to, "ack".into()).await;
            }
        }
    }

    /// For a cancel sent because a cluster halt stopped the delegator (`halt_epoch`): applies that
    /// halt here first when this node has not yet (NATS orders nothing across subjects: the cancel
    /// may come before the halt's broadcast), so the delegate is stopped as one of the agents the
    /// cluster halt stopped — noted with it, and resumed by its lift — not as a halt of its own
    /// that the lift would leave. `false`: that halt was lifted here already (its lift resumed
    /// the delegator), so the delegate is not halted for it.
    async fn cluster_halt_first(&self, cancel: &RemoteCancel) -> bool {
        let Some(epoch) = cancel.halt_epoch else {
            return true;
        };
        if self.epoch.fetch_max(epoch, Ordering::SeqCst) < epoch {
            self.halted_at.fetch_max(epoch, Ordering::SeqCst);
            tracing::warn!(
                epoch,
                from = %cancel.from,
                "cluster halt applied (from a delegator's cancel, before its broadcast)"
            );
            self.supervisor.halt_all().await;
            return true;
        }
        let (halted_at, lifted) = (
            self.halted_at.load(Ordering::SeqCst),
            self.lifted.load(Ordering::SeqCst),
        );
        if lifted > epoch && halted_at < lifted {
            eprintln!(
                "warden: cluster: a cancel of delegated task {} for the cluster halt of epoch {epoch} \
                 came after its lift (epoch {lifted}): the delegate is not halted for it",
                cancel.key
            );
            return false;
        }
        true
    }

    /// Requests received, tasks run, and copies answered from a record of an earlier process
    /// (`GET /api/cluster`'s `delegations`).
    pub fn delegation_counts(&self) -> (u64, u64, u64) {
        (
            self.tasks.received.load(Ordering::Relaxed),
            self.tasks.ran.load(Ordering::Relaxed),
            self.tasks.recovered.load(Ordering::Relaxed),
        )
    }

    /// Of the tasks run, those refused (unknown, locked out, stopped agent, full mailbox): never
    /// queued on the agent. Their delegator journals the refusal if it still waits.
    pub fn delegations_refused(&self) -> u64 {
        self.tasks.refused.load(Ordering::Relaxed)
    }
}

fn bytes_of<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}
