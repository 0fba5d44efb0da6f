//! Cross-node delegation: a delegation to an agent another node owns goes as a request on
//! `warden.cluster.delegate.NODE` ([`RemoteTask`], the reply a [`RemoteReply`]).
//!
//! * **Delegator's node.** The supervisor keeps every check of a local delegation (cycle, hops,
//!   slots, the shared lockout cache) and its chain wait; this module finds the owner (the agent's
//!   lease) and sends the task, again every [`RESEND`] while no reply came (at-least-once, one
//!   inbox for every copy). A halt of the delegator drops the wait and sends a [`RemoteCancel`]
//!   on `warden.cluster.delegate.NODE.cancel` (best effort, core NATS).
//! * **Owner's node.** Runs a task once per idempotency key (`instance/delegator/run id/call id`,
//!   the instance random per delegator process): a copy
//!   that arrives while the first runs, or after it ended, is answered with the same result (the
//!   last [`KEEP`] keys are remembered, in memory: a restart of the owner forgets them). A cancel
//!   for a task still running halts the delegate (cause `parent`).

use super::{lockout::Lockouts, Cluster};
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
    cluster::{RemoteCancel, RemoteReply, RemoteTask},
    AgentKey, AgentState, DelegationRefusal, HaltCause,
};

/// How often a delegator sends its task again while no reply came.
pub(super) const RESEND: Duration = Duration::from_secs(2);
/// How many tasks' results an owner remembers for copies of their request.
pub(super) const KEEP: usize = 4096;

/// The subject `node` receives delegations on (`warden.cluster.delegate.NODE` in the default
/// namespace).
pub(crate) fn subject(config: &super::ClusterConfig, node: &str) -> String {
    config.subject(&format!("delegate.{node}"))
}

type Answer = Shared<BoxFuture<'static, RemoteReply>>;

/// The owner's record of tasks received, by idempotency key (bounded, oldest forgotten first).
#[derive(Default)]
pub(super) struct Tasks {
    inner: Mutex<TasksInner>,
    /// Requests received (every copy).
    pub(super) received: AtomicU64,
    /// Tasks run (one per key).
    pub(super) ran: AtomicU64,
    /// Of those, the ones answered `refused` (never queued on the agent).
    pub(super) refused: Arc<AtomicU64>,
}

#[derive(Default)]
struct TasksInner {
    by_key: HashMap<String, (AgentKey, Answer)>,
    order: VecDeque<String>,
}

impl Tasks {
    /// The answer to `task`: the running or finished one of its key, or a new run.
    fn answer(&self, supervisor: &warden_actors::Supervisor, task: RemoteTask) -> Answer {
        self.received.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.lock();
        if let Some((_, answer)) = inner.by_key.get(&task.key) {
            return answer.clone();
        }
        self.ran.fetch_add(1, Ordering::Relaxed);
        let key = task.key.clone();
        let to = task.to.clone();
        let supervisor = supervisor.clone();
        let refused = self.refused.clone();
        let answer = async move {
            let reply = supervisor.run_remote_task(task).await;
            if matches!(reply, RemoteReply::Refused { .. }) {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            reply
        }
        .boxed()
        .shared();
        // Runs to its end even if every copy's responder is gone.
        actix_rt::spawn(answer.clone().map(drop));
        inner.by_key.insert(key.clone(), (to, answer.clone()));
        inner.order.push_back(key);
        while inner.order.len() > KEEP {
            if let Some(old) = inner.order.pop_front() {
                inner.by_key.remove(&old);
            }
        }
        answer
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
        let cancel = RemoteCancel {
            key: cluster.task_key(key),
            from: from.clone(),
        };
        let subject = format!("{}.cancel", subject(&cluster.config, node));
        let body = serde_json::to_vec(&cancel).unwrap_or_default();
        actix_rt::spawn(async move {
            let _ = cluster.client.publish(subject, body.into()).await;
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

    /// Sends `task` to `node` every [`RESEND`] until a reply comes on the one inbox.
    async fn send_task(self: Arc<Self>, node: String, task: RemoteTask) -> RemoteReply {
        let subject = subject(&self.config, &node);
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
                match tokio::time::timeout(RESEND, replies.next()).await {
                    Ok(Some(message)) => {
                        if let Ok(reply) = serde_json::from_slice(&message.payload) {
                            return reply;
                        }
                    }
                    Ok(None) => break, // the subscription ended: subscribe again
                    Err(_) => {}       // no reply yet: send again (same key)
                }
            }
        }
    }

    /// Answers delegations sent to this node, each key run once.
    pub(super) async fn answer_delegations(self: Arc<Self>) {
        let mut requests = match self
            .client
            .subscribe(subject(&self.config, &self.config.node))
            .await
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("warden: cluster: cannot receive delegations: {e}");
                return;
            }
        };
        while let Some(message) = requests.next().await {
            let Some(reply_to) = message.reply else {
                continue;
            };
            let Ok(task) = serde_json::from_slice::<RemoteTask>(&message.payload) else {
                continue;
            };
            let answer = self.tasks.answer(&self.supervisor, task);
            let client = self.client.clone();
            actix_rt::spawn(async move {
                let reply = answer.await;
                let _ = client.publish(reply_to, bytes_of(&reply).into()).await;
            });
        }
    }

    /// Halts the delegate of a task still running whose delegator was halted.
    pub(super) async fn answer_cancels(self: Arc<Self>) {
        let subject = format!("{}.cancel", subject(&self.config, &self.config.node));
        let Ok(mut cancels) = self.client.subscribe(subject).await else {
            return;
        };
        while let Some(message) = cancels.next().await {
            let Ok(cancel) = serde_json::from_slice::<RemoteCancel>(&message.payload) else {
                continue;
            };
            if let Some(to) = self.tasks.running(&cancel.key) {
                let cause = HaltCause::Parent {
                    parent: cancel.from,
                };
                let _ = self.supervisor.halt(to.as_str(), cause).await;
            }
        }
    }

    /// Requests received and tasks run (`GET /api/cluster`'s `delegations`).
    pub fn delegation_counts(&self) -> (u64, u64) {
        (
            self.tasks.received.load(Ordering::Relaxed),
            self.tasks.ran.load(Ordering::Relaxed),
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
