//! Delegation to remote A2A agents (`[a2a_agents.NAME]` in team files, docs/a2a.md): a delegation
//! whose delegate is a peer speaking A2A instead of an agent of this team.
//!
//! The transport (HTTP, JSON-RPC, the agent card, auth) is the embedder's, behind [`A2aPeers`]
//! (`warden`'s `a2a_client`); what makes it a delegation is here, next to the local one it mirrors:
//! the same hop check, sub-agent slot and chain-wait checkpoint, `DelegationRequested` /
//! `DelegationEnded` on the delegator, a failure returned as the `delegate` tool's error (so it
//! counts for the delegator's breakers as a local delegate's failure does).
//!
//! # Invariants
//! * The remote task's id is journaled (`a2a_task_started`) and durable before warden polls it or
//!   answers it; it stays outstanding in the delegator's record until `a2a_task_ended`.
//! * Every way the wait ends without the remote task ending — the delegator halted (its turn's
//!   future dropped), the chain wait refused, a question nobody may answer, a poll that keeps
//!   failing — sends one `CancelTask` and nothing else: the follow future is dropped and never
//!   polled again, and the cancel is the [`Following`] guard's `Drop`.
//! * `input-required` is an intervention on the team's bus, in the limit checkpoint's id space; only
//!   `safety.on_limit.mode = "interactive"` with a bus asks, every other case cancels the task and
//!   fails the delegation with the reason.

use super::*;
use warden_protocols::{A2aTaskRef, Answer, Intervention, OnLimitMode, OperatorReply};

/// A task on a peer, as the client read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTask {
    /// The task's id on the peer (empty for a peer that answered with a message and no task).
    pub id: String,
    /// Its context (empty when the peer gave none).
    pub context_id: String,
    /// Its state.
    pub state: PeerState,
    /// The text of its status message and artifacts (the answer, the question, why it failed).
    pub text: String,
}

/// A remote task's state (A2A's `TaskState`, both spellings read by the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Accepted, not started.
    Submitted,
    /// Being worked on.
    Working,
    /// Waits for the client's answer.
    InputRequired,
    /// Waits for credentials warden does not have.
    AuthRequired,
    /// Done, with an answer.
    Completed,
    /// Ended without an answer.
    Failed,
    /// Canceled.
    Canceled,
    /// Refused by the peer.
    Rejected,
}

impl PeerState {
    /// The 0.3 spelling (`input-required`), used in the journal and in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Submitted => "submitted",
            PeerState::Working => "working",
            PeerState::InputRequired => "input-required",
            PeerState::AuthRequired => "auth-required",
            PeerState::Completed => "completed",
            PeerState::Failed => "failed",
            PeerState::Canceled => "canceled",
            PeerState::Rejected => "rejected",
        }
    }

    /// No further change can come.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            PeerState::Completed | PeerState::Failed | PeerState::Canceled | PeerState::Rejected
        )
    }
}

/// A message to a peer: a new task (no `task_id`) or the answer to a task's question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerMessage {
    /// Unique per message: `warden:AGENT/RUN/CALL` for a delegation (a peer that deduplicates
    /// by it runs a resent delegation once), `…/answer/ID` for an answer.
    pub message_id: String,
    /// The text.
    pub text: String,
    /// The task it answers.
    pub task_id: Option<String>,
    /// The task's context.
    pub context_id: Option<String>,
}

/// Why a call to a peer gave no usable answer, in words for the delegator's model and the
/// operator (the client's error types are its own).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PeerError(pub String);

/// The remote A2A agents a team may delegate to, and how to reach them (set once, before the
/// agents are spawned: [`Supervisor::set_a2a_peers`](crate::Supervisor::set_a2a_peers)).
pub trait A2aPeers: Send + Sync + 'static {
    /// Whether `name` is a remote agent here.
    fn knows(&self, name: &AgentKey) -> bool;

    /// Every remote agent's name and what it does (from its agent card, or the team file), for
    /// the `delegate` tool's description.
    fn describe(&self) -> Vec<(AgentKey, String)>;

    /// `SendMessage` to `name` (without waiting for the task to end); resolves with the task as
    /// the peer answered it. Bounded by the peer's request timeout.
    fn send(
        &self,
        name: &AgentKey,
        message: PeerMessage,
    ) -> BoxFuture<'static, Result<PeerTask, PeerError>>;

    /// `GetTask`.
    fn get(
        &self,
        name: &AgentKey,
        task_id: &str,
    ) -> BoxFuture<'static, Result<PeerTask, PeerError>>;

    /// `CancelTask`: the task as the peer answered.
    fn cancel(
        &self,
        name: &AgentKey,
        task_id: &str,
    ) -> BoxFuture<'static, Result<PeerTask, PeerError>>;

    /// The longest wait between two `GetTask`s of a working task (polls start 20 ms apart and
    /// double up to it).
    fn poll_interval(&self, name: &AgentKey) -> Duration;
}

/// Polls that may fail in a row (a peer restarting, a dropped connection) before the delegation
/// fails.
const POLL_FAILURES: u32 = 3;

/// Why following a remote task ended without an answer.
enum Unanswered {
    /// The peer could not be reached or answered nonsense.
    Peer(PeerError),
    /// The task ended on the peer without an answer (failed, canceled, rejected).
    Ended(PeerState, String),
    /// It needs what warden cannot give (credentials, an operator that is not there).
    Stuck(String),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Peer(e) => write!(f, "{e}"),
            Unanswered::Ended(state, text) if text.is_empty() => {
                write!(f, "the remote task ended {}", state.as_str())
            }
            Unanswered::Ended(state, text) => {
                write!(f, "the remote task ended {}: {text}", state.as_str())
            }
            Unanswered::Stuck(why) => f.write_str(why),
        }
    }
}

/// The remote task a delegation follows. Dropped before the task ended (a halt of the delegator,
/// a refused chain wait, a question nobody may answer): one `CancelTask`, and `a2a_task_ended`.
struct Following {
    peers: Arc<dyn A2aPeers>,
    from: Arc<AgentCell>,
    to: AgentKey,
    task_id: Option<String>,
    /// Set once the task ended on the peer (nothing to cancel).
    ended: bool,
}

impl Following {
    /// Journals the task's end (the peer's `state`); nothing is canceled on drop afterwards.
    fn ended(&mut self, state: PeerState, detail: &str) {
        self.ended = true;
        if let Some(task_id) = self.task_id.clone() {
            self.from.note(EventKind::A2aTaskEnded {
                to: self.to.clone(),
                task_id,
                state: state.as_str().into(),
                detail: cut(detail),
            });
        }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let Some(task_id) = self.task_id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (dropped outside one): the task stays outstanding in the record, and
            // the next start settles it.
            return;
        };
        let (peers, from, to) = (self.peers.clone(), self.from.clone(), self.to.clone());
        // The one call after the wait ended; journaled with what the peer said.
        runtime.spawn(async move {
            cancel_remote(
                &*peers,
                &from,
                &to,
                task_id,
                "the delegation ended before the task",
            )
            .await;
        });
    }
}

/// Sends `CancelTask` for `task_id` and journals `a2a_task_ended` with the peer's answer.
pub(crate) async fn cancel_remote(
    peers: &dyn A2aPeers,
    from: &AgentCell,
    to: &AgentKey,
    task_id: String,
    why: &str,
) {
    let (state, detail) = match peers.cancel(to, &task_id).await {
        Ok(task) => (
            task.state.as_str().to_owned(),
            format!(
                "{why}: CancelTask sent, the peer answered {}",
                task.state.as_str()
            ),
        ),
        Err(e) => (
            "unknown".to_owned(),
            format!("{why}: CancelTask sent, no answer: {e}"),
        ),
    };
    tracing::info!(agent = %from.key, remote = %to, %task_id, %detail, "remote A2A task canceled");
    from.note(EventKind::A2aTaskEnded {
        to: to.clone(),
        task_id,
        state,
        detail: cut(&detail),
    });
}

/// At most 2,000 characters of a peer's text in the journal.
fn cut(text: &str) -> String {
    match text.char_indices().nth(2000) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

impl Supervisor {
    /// A delegation from `from` to the remote A2A agent `ask.to`: the local checks (hops, slot),
    /// `DelegationRequested`, then the remote task followed to its end within the chain wait.
    pub(super) async fn delegate_a2a(
        &self,
        from: &Arc<AgentCell>,
        peers: Arc<dyn A2aPeers>,
        ask: Ask<'_>,
    ) -> Result<String, DelegationError> {
        let Ask {
            to,
            task,
            lineage,
            call_id,
        } = ask;
        let hops = self
            .admit(from, to, lineage)
            .await
            .map_err(|r| refused(from, to, r))?;
        self.acquire_slot(from)
            .await
            .map_err(|r| refused(from, to, r))?;
        let id = self.shared.next_delegation.fetch_add(1, Ordering::Relaxed);
        let slot = Slot::remote(from.clone(), to.clone(), id);
        let (mut slot, _chain) = slot.start(!from.halt_requested(), hops, lineage, &task)?;
        let message = PeerMessage {
            message_id: format!("warden:{}/{}/{}", from.key, from.current_run_id(), call_id),
            text: task,
            task_id: None,
            context_id: None,
        };
        let follow = Box::pin(self.follow(from.clone(), peers, to.clone(), message, call_id));
        match self.wait_chain(&mut slot, follow).await? {
            Ok(answer) => {
                slot.outcome = Some(DelegationOutcome::Completed);
                Ok(answer)
            }
            Err(why) => {
                let error = format!("remote A2A agent {to}: {why}");
                slot.outcome = Some(DelegationOutcome::Failed {
                    error: error.clone(),
                });
                Err(DelegationError::Failed(TaskError::Failed(error)))
            }
        }
    }

    /// Sends the task, journals its id (durable before anything else is sent), then follows it:
    /// polls while it works, asks warden's operator when it asks, ends with its answer.
    async fn follow(
        &self,
        from: Arc<AgentCell>,
        peers: Arc<dyn A2aPeers>,
        to: AgentKey,
        message: PeerMessage,
        call_id: &str,
    ) -> Result<String, Unanswered> {
        let message_id = message.message_id.clone();
        let mut task = peers.send(&to, message).await.map_err(Unanswered::Peer)?;
        let mut following = Following {
            peers: peers.clone(),
            from: from.clone(),
            to: to.clone(),
            task_id: None,
            ended: false,
        };
        if task.id.is_empty() {
            // A message, not a task: the peer answered at once; nothing to follow or cancel.
            return match task.state {
                PeerState::Completed => Ok(task.text),
                state => Err(Unanswered::Ended(state, task.text)),
            };
        }
        from.note(EventKind::A2aTaskStarted {
            to: to.clone(),
            task_id: task.id.clone(),
            context_id: task.context_id.clone(),
            message_id,
            call_id: call_id.to_owned(),
        });
        following.task_id = Some(task.id.clone());
        if let Err(e) = from.durable_so_far().await {
            // Not kept: a crash now would lose the task's id. Cancel it (the guard) and fail.
            return Err(Unanswered::Stuck(format!(
                "the remote task {} could not be journaled ({e}); it was canceled",
                task.id
            )));
        }
        let mut failures = 0;
        // Polls start 20 ms apart and double up to the peer's `poll_interval_ms`: a quick task is
        // seen done quickly, a long one is not polled more often than configured.
        let interval = peers.poll_interval(&to);
        let mut delay = interval.min(Duration::from_millis(20));
        loop {
            match task.state {
                PeerState::Completed => {
                    following.ended(task.state, &task.text);
                    return Ok(task.text);
                }
                state if state.is_terminal() => {
                    following.ended(state, &task.text);
                    return Err(Unanswered::Ended(state, task.text));
                }
                PeerState::AuthRequired => {
                    return Err(Unanswered::Stuck(format!(
                        "the remote task {} asks for credentials (auth-required), which warden \
                         cannot give; it was canceled",
                        task.id
                    )));
                }
                PeerState::InputRequired => {
                    let answer = self.ask_operator(&from, &to, &task).await?;
                    task = peers.send(&to, answer).await.map_err(Unanswered::Peer)?;
                }
                _ => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(interval);
                    match peers.get(&to, &task.id).await {
                        Ok(now) => {
                            failures = 0;
                            task = now;
                        }
                        Err(e) => {
                            failures += 1;
                            tracing::warn!(agent = %from.key, remote = %to, task_id = %task.id, error = %e, failures, "polling a remote A2A task failed");
                            if failures >= POLL_FAILURES {
                                return Err(Unanswered::Peer(PeerError(format!(
                                    "{e} ({failures} polls in a row failed; the task was canceled)"
                                ))));
                            }
                        }
                    }
                }
            }
        }
    }

    /// The remote task asks: its question goes to warden's operator (the team's intervention bus,
    /// `safety.on_limit.mode = "interactive"` only), the answer comes back as the message to send.
    async fn ask_operator(
        &self,
        from: &AgentCell,
        to: &AgentKey,
        task: &PeerTask,
    ) -> Result<PeerMessage, Unanswered> {
        let checkpoint = &self.shared.safety.checkpoint;
        let (bus, ids) = checkpoint.bus_and_ids();
        let question = if task.text.trim().is_empty() {
            "(no question text)".to_owned()
        } else {
            task.text.clone()
        };
        let bus = match (checkpoint.mode(), bus) {
            (OnLimitMode::Interactive, Some(bus)) => bus,
            (OnLimitMode::Interactive, None) => {
                return Err(Unanswered::Stuck(format!(
                    "the remote task {} asks {question:?}, and no operator can answer (no \
                     intervention bus: run under `warden serve` or `warden run`); it was canceled",
                    task.id
                )))
            }
            (mode, _) => {
                return Err(Unanswered::Stuck(format!(
                    "the remote task {} asks {question:?}, and no operator is asked with \
                     `safety.on_limit.mode = \"{}\"` (set it to \"interactive\" to answer remote \
                     questions); it was canceled",
                    task.id,
                    mode_name(mode)
                )))
            }
        };
        let id = ids.fetch_add(1, Ordering::Relaxed);
        let intervention = Intervention {
            id,
            agent: from.key.clone(),
            run_id: from.current_run_id(),
            kind: None,
            current: 0.0,
            configured: 0.0,
            config_key: format!("a2a_agents.{to}"),
            question: format!(
                "The remote A2A agent {to} (task {}) asks: {question}\nYour answer (and note) is \
                 sent to it as the next message on that task.",
                task.id
            ),
            permission: None,
        };
        from.note(EventKind::A2aAsked {
            id,
            to: to.clone(),
            task_id: task.id.clone(),
            question: cut(&question),
        });
        // The delegator stays WAITING_FOR_TOOL (its `delegate` call runs): the state table has no
        // WAITING_FOR_TOOL → WAITING_FOR_INPUT edge, as for the chain wait's own ask.
        let seconds = self.shared.config.safety.on_limit.ask_timeout_seconds;
        let asked = bus.ask(intervention);
        let reply = if seconds > 0.0 {
            tokio::time::timeout(Duration::from_secs_f64(seconds), asked)
                .await
                .ok()
        } else {
            Some(asked.await)
        };
        let reply: OperatorReply = match reply {
            Some(Ok(reply)) => reply,
            Some(Err(e)) => {
                return Err(Unanswered::Stuck(format!(
                    "the remote task {} asks {question:?}, and the intervention bus failed \
                     ({e}); it was canceled",
                    task.id
                )))
            }
            None => {
                return Err(Unanswered::Stuck(format!(
                    "the remote task {} asks {question:?}, and no operator answered within \
                     {seconds} s (`safety.on_limit.ask_timeout_seconds`); it was canceled",
                    task.id
                )))
            }
        };
        let mut text = match &reply.answer {
            Answer::Other(text) => text.clone(),
            answer => answer.to_string(),
        };
        if let Some(note) = reply.by.as_ref().and_then(|b| b.note.as_deref()) {
            if !note.trim().is_empty() {
                text.push_str("\n\n");
                text.push_str(note);
            }
        }
        from.note(EventKind::A2aAnswered {
            id,
            to: to.clone(),
            task_id: task.id.clone(),
            answer: cut(&text),
            by: reply.by.clone(),
        });
        Ok(PeerMessage {
            message_id: format!("warden:{}/{}/answer/{id}", from.key, from.current_run_id()),
            text,
            task_id: Some(task.id.clone()),
            context_id: (!task.context_id.is_empty()).then(|| task.context_id.clone()),
        })
    }

    /// After a restart: every remote task a delegation was following when the process stopped
    /// (`outstanding`: from the restored records, [`AgentRecord::a2a_tasks`], read before the
    /// agents were spawned, so no delegation of this run is among them) is settled. The turn that
    /// waited for it did not survive (turns are not re-run; the dangling `delegate` call is
    /// answered "interrupted"), so the task is never sent again: a task still running is canceled
    /// (`CancelTask`), one that ended is read (`GetTask`), and either way `a2a_task_ended`
    /// journals what the peer said, its answer included. Resolves once each is settled (or its
    /// peer failed to answer); returns how many.
    pub async fn settle_a2a_tasks(&self, outstanding: Vec<(AgentKey, A2aTaskRef)>) -> usize {
        let Some(peers) = self.shared.a2a.get().cloned() else {
            return 0;
        };
        let mut settled = 0;
        for (agent, t) in outstanding {
            let Some(cell) = self.shared.agents.get(&agent).map(|e| e.cell.clone()) else {
                continue;
            };
            settled += 1;
            if !peers.knows(&t.to) {
                cell.note(EventKind::A2aTaskEnded {
                    to: t.to.clone(),
                    task_id: t.task_id.clone(),
                    state: "unknown".into(),
                    detail: format!(
                        "after a restart: {} is no longer an `[a2a_agents]` entry; the task was \
                         left as it was on the peer",
                        t.to
                    ),
                });
                continue;
            }
            let why = "after a restart (the delegation's turn did not survive it)";
            match peers.get(&t.to, &t.task_id).await {
                Ok(task) if task.state.is_terminal() => {
                    cell.note(EventKind::A2aTaskEnded {
                        to: t.to.clone(),
                        task_id: t.task_id.clone(),
                        state: task.state.as_str().into(),
                        detail: cut(&format!("{why}: it had ended: {}", task.text)),
                    });
                }
                _ => cancel_remote(&*peers, &cell, &t.to, t.task_id.clone(), why).await,
            }
        }
        settled
    }
}

fn mode_name(mode: OnLimitMode) -> &'static str {
    match mode {
        OnLimitMode::Interactive => "interactive",
        OnLimitMode::AutoExtend => "auto_extend",
        OnLimitMode::Unattended => "unattended",
    }
}
