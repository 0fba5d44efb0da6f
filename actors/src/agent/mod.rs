//! The agent: one actor type for both roles (assistant and sub-agent).
//!
//! * [`cell`] — the shared state (record, mailbox, provider, tools), which outlives actor restarts.
//! * [`actor`] — the actix actor that drains the priority mailbox and spawns turns (never `ctx.wait`).
//! * [`turn`] — one turn: the ReAct loop against the [`crate::Provider`], tools, breakers.
//! * [`AgentHandle`] — what callers hold: send work, halt, unlock, read status.
//!
//! # Pending events
//! Invariant: an accepted user event is pending in the record until exactly one of taken, discarded
//! or refused settles it. A sender queues an event under the agent's record lock — refusal check,
//! mailbox push, `EventQueued` journaled — and a halt clears the ordinary lane and journals `Halted`
//! under that lock too, so the record's pending events are exactly the user events in the ordinary
//! lane whenever the lock is free. The actor settles one when it takes it: `EventTaken` with the
//! event's `HistoryAppended`, in one journal transaction (see [`turn::take`]), or `WorkRefused`
//! with its id. Ticks and delegated tasks are not pending events (a delegated task belongs to the
//! delegator's turn, which is itself journaled).

pub(crate) mod actor;
pub(crate) mod cell;
pub(crate) mod halt_batch;
pub(crate) mod memory;
pub(crate) mod reply;
pub(crate) mod turn;

use crate::{
    journal::NotDurable,
    mailbox::{Envelope, Prioritized, TrySendError},
};
use cell::AgentCell;
pub use reply::{AskError, Notice, PendingReply, Reply, Settled, Settlement};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use warden_protocols::EventKind;
use warden_protocols::{
    AgentKey, AgentRecord, AgentState, AgentStatus, HaltCause, Priority, TerminationReason,
    UserEvent, WorkRefusal,
};

/// Everything that travels through an agent's priority mailbox.
pub(crate) enum AgentMsg {
    /// Priority 0.
    Halt(HaltRequest),
    /// Priority 1.
    Control(ControlRequest),
    /// Priority 2.
    Signal(Signal),
    /// Priority 3.
    Work(Work),
}

impl Prioritized for AgentMsg {
    fn priority(&self) -> Priority {
        match self {
            AgentMsg::Halt(_) => Priority::SystemHalt,
            AgentMsg::Control(_) => Priority::Control,
            AgentMsg::Signal(_) => Priority::Supervision,
            AgentMsg::Work(_) => Priority::Ordinary,
        }
    }
}

pub(crate) struct HaltRequest {
    pub cause: HaltCause,
    pub ack: Option<HaltReply>,
}

/// Where a halt's acknowledgement goes.
pub(crate) enum HaltReply {
    /// One waiter (a single halt).
    One(oneshot::Sender<SentAck>),
    /// Many halts gathered on one channel (`halt_all`): no per-agent channel or future. `slot` is
    /// the agent's place in the caller's list.
    Gathered {
        slot: usize,
        to: mpsc::UnboundedSender<(usize, SentAck)>,
    },
}

impl HaltReply {
    pub(crate) fn send(self, ack: SentAck) {
        match self {
            HaltReply::One(tx) => {
                let _ = tx.send(ack);
            }
            HaltReply::Gathered { slot, to } => {
                let _ = to.send((slot, ack));
            }
        }
    }
}

/// The wait for a journal's durability ([`crate::Journal::durable`]).
pub(crate) type Durability = futures::future::BoxFuture<'static, Result<(), NotDurable>>;

/// A halt's acknowledgement as the actor sends it, the moment the halt is applied: the ack, and
/// — unless the journal had already answered — the wait for the halt to be on disk, which the
/// *receiver* awaits ([`SentAck::settle`]) on its own task.
///
/// Never awaited on the agent's arbiter: while a flooded agent runs turn after turn without an
/// await that is pending, its arbiter runs no other task (actix polls the actor's context until
/// it has nothing left to do), so an answer waiting there waited for the flood to end
/// (issue 31: a resume applied 108 ms after the halt got no HTTP answer in 60 s).
pub(crate) struct SentAck {
    pub(crate) ack: HaltAck,
    pub(crate) durable: Option<Durability>,
}

impl SentAck {
    /// An acknowledgement with nothing left to wait for.
    pub(crate) fn settled(ack: HaltAck) -> Self {
        SentAck { ack, durable: None }
    }

    /// The acknowledgement once the halt is durable, or with why it is not.
    pub(crate) async fn settle(self) -> HaltAck {
        let mut ack = self.ack;
        if let Some(durable) = self.durable {
            ack.not_durable = durable.await.err();
        }
        ack
    }
}

pub(crate) struct ControlRequest {
    pub op: ControlOp,
    /// Sent as soon as the control is applied (in memory), with the wait for its durability: the
    /// caller awaits that itself, off the agent's arbiter (see [`SentAck`] for why).
    pub reply: oneshot::Sender<Result<Durability, ControlError>>,
}

/// Supervision and safety signals.
pub(crate) enum Signal {
    /// A delegate this agent is waiting on tripped a breaker.
    DelegateLockedOut { delegate: AgentKey, reason: String },
    /// Perceptions were kept for memory at delivery (`memory.unwritten`): admit and write them
    /// (long-term memory's rate caps and write run on the agent's actor, never on the delivering
    /// thread). Sent when a CONTEXT makes `REMIND_EVERY` waiting (and every multiple), and at spawn
    /// when a restart finds some.
    Remember,
    /// A halt applied for this agent's idle actor on the halting thread
    /// (`halt_if_idle`) cleared these from the ordinary lane: settle their events, then list
    /// and free them, as the actor does after a halt it read.
    Cleared(VecDeque<Envelope<AgentMsg>>),
}

/// Ordinary work.
pub(crate) enum Work {
    /// A user event, pending in the record under `id` until the actor settles it; `accepted` is
    /// when it was queued (a reply's latency).
    Event {
        id: u64,
        event: Arc<UserEvent>,
        accepted: tokio::time::Instant,
        /// The trace context current when the event was queued (the API's request span, which
        /// continues a caller's `traceparent`): the turn that takes the event continues it. Kept
        /// here, beside the serde-only `UserEvent`, so the context crosses the mailbox without
        /// touching the wire types; a context, not the span, so the request's span ends with the
        /// request. Empty (and free) without telemetry.
        trace: crate::telemetry::TraceContext,
    },
    Tick,
    Delegated(DelegatedTask),
}

impl Work {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Work::Event { .. } => "user_event",
            Work::Tick => "tick",
            Work::Delegated(_) => "delegated_task",
        }
    }

    /// The pending-event id this work settles, if it is a user event.
    pub(crate) fn queued(&self) -> Option<u64> {
        match self {
            Work::Event { id, .. } => Some(*id),
            _ => None,
        }
    }
}

pub(crate) type TaskReply = oneshot::Sender<Result<String, TaskError>>;

pub(crate) struct DelegatedTask {
    pub task: String,
    /// The chain including this delegate, root first.
    pub lineage: Arc<[AgentKey]>,
    pub reply: TaskReply,
    /// The delegator's `execute_tool delegate` span: the parent of the delegate's `invoke_agent`
    /// span, so one task is one trace across the delegation tree.
    pub parent: tracing::Span,
}

/// An operator action, read from the control lane (priority 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlOp {
    /// `SAFETY_LOCKOUT → WAITING_FOR_EVENT`, counters reset.
    Unlock {
        /// Who unlocked (authenticated by the caller); journaled.
        operator: String,
        /// Why (the operator's reason), journaled as the `Unlocked` event's note.
        note: Option<String>,
    },
    /// The design's `clear_emergency_stop`: same effect as unlock.
    ClearEmergency {
        /// Who cleared the emergency stop (authenticated by the caller); journaled.
        operator: String,
    },
    /// Clears the conversation history, the error count and any lockout.
    ResetHistory {
        /// Who reset the history (authenticated by the caller); journaled.
        operator: String,
    },
    /// Stops reading ordinary work (queued work stays queued).
    Pause {
        /// Who paused the agent; journaled.
        operator: String,
    },
    /// Undoes a pause, and brings a STOPPED agent back to `WAITING_FOR_EVENT`. Refused while the
    /// agent is locked out ([`ControlError::LockedOut`]): only an unlock lifts a lockout.
    Resume {
        /// Who resumed the agent; journaled.
        operator: String,
    },
}

/// Why an operator action did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// An unlock or emergency clear of an agent that is not locked out: nothing to lift.
    #[error("emergency stop is not active")]
    NotActive,
    /// A resume of an agent that is neither paused nor `STOPPED`: nothing to undo.
    #[error("agent is neither paused nor stopped")]
    NotStopped,
    /// A resume cannot lift a lockout: only an authenticated unlock can.
    #[error("locked out: unlock first")]
    LockedOut,
    /// Applied (in memory, at once) but the journal could not make it durable: after a crash the
    /// agent would come back as it was before.
    #[error("applied but not durable: {0}")]
    NotDurable(NotDurable),
    /// The agent's mailbox is closed (the team was shut down): the action was not applied.
    #[error("agent is shut down")]
    Closed,
}

/// Why [`AgentHandle::set_goals_durable`] did not acknowledge new goals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoalsError {
    /// The goals are invalid ([`warden_protocols::check_goals`]): what is wrong, in words. Nothing
    /// was changed.
    #[error("invalid goals: {0}")]
    Invalid(String),
    /// Applied (in memory, at once) but the journal could not make it durable: after a crash the
    /// agent would come back with its old goals.
    #[error("applied but not durable: {0}")]
    NotDurable(NotDurable),
}

/// A halt's acknowledgement: the agent is `STOPPED` (or stays `SAFETY_LOCKOUT`: a halt never lifts a
/// lockout) and its ordinary queue is cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaltAck {
    /// The halted agent.
    pub agent: AgentKey,
    /// Its state once the halt was applied: `STOPPED`, or `SAFETY_LOCKOUT` if it was locked out.
    pub state: AgentState,
    /// Ordinary messages this halt cleared (each journaled).
    pub discarded: u64,
    /// `Some` when the halt is applied (in memory, at once: fail safe) but the journal could not
    /// make it durable: after a crash the agent would come back as it was before the halt.
    pub not_durable: Option<NotDurable>,
}

/// Why a delegated task produced no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The delegate refused the task when it came to take it (locked out, stopped, closed).
    #[error("task refused: {0}")]
    Refused(WorkRefusal),
    /// The delegate's turn ended without an answer, for this reason (halted, a limit, …).
    #[error("turn ended without an answer ({0})")]
    NoAnswer(TerminationReason),
    /// The delegate tripped a breaker while working on the task; the text is the lockout's reason.
    #[error("delegate locked out: {0}")]
    LockedOut(String),
    /// The turn ended with an error it could explain (an LLM failure, a refused limit whose wrap-up
    /// failed: the decision-enabling text).
    #[error("{0}")]
    Failed(String),
}

/// A user event that could not be queued, handed back with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{refusal}")]
pub struct EventSendError {
    /// The user event, handed back unchanged (nothing was queued or journaled for it but the
    /// refusal).
    pub event: UserEvent,
    /// Why it was refused: locked out, stopped, ordinary lane full, journal unavailable, closed.
    pub refusal: WorkRefusal,
}

/// What [`AgentHandle::perceive`] did with a world event.
#[derive(Debug, Clone, PartialEq)]
pub struct Perceived {
    /// The classification: verdict, rule, trust (journaled as `perceived`).
    pub perception: warden_protocols::npc::Perception,
    /// For a TRIGGER: the id of the user event it was queued as.
    pub queued: Option<u64>,
    /// Kept for long-term memory (a TRIGGER or CONTEXT with text, not the agent's own), journaled
    /// in its `perceived`: the agent's own actor admits it within the rate caps and writes it,
    /// before its next recall. An acknowledgement that promises it waits for that row to be
    /// durable ([`AgentHandle::durable_so_far`]).
    pub observed: bool,
    /// The agent's actor was asked to write what waits (a `Remember` signal queued: a CONTEXT
    /// that made `REMIND_EVERY` waiting; a TRIGGER's own turn writes its observation, no signal): a host that
    /// defers wakes must wake the agent.
    pub(crate) reminded: bool,
}

/// Why [`AgentHandle::try_send_event_durable`] cannot acknowledge an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurableSendError {
    /// Not queued (handed back with the reason).
    #[error(transparent)]
    Refused(#[from] EventSendError),
    /// Queued under `id` (it runs, or ran) but its acceptance is not on disk: after a crash it
    /// would be gone. Sending it again would run it twice.
    #[error("event {id} was queued but is not durable: {cause}")]
    NotDurable {
        /// The id the event was queued under.
        id: u64,
        /// Why its acceptance will not be (or is not yet) on disk.
        cause: NotDurable,
    },
}

/// An event queued: its id, the journal seq of its `EventQueued`, and its reply if watched.
struct Accepted {
    id: u64,
    seq: u64,
    reply: Option<PendingReply>,
}

/// What [`AgentHandle::queue_keyed`] did.
enum Queued {
    New(Accepted),
    /// The key named event `id`, accepted earlier with the same content: nothing queued.
    Duplicate {
        id: u64,
        reply: Option<PendingReply>,
    },
}

/// Why [`AgentHandle::queue_keyed`] queued nothing.
enum KeyedRejection {
    Refused(Rejected),
    /// The key names event `id`, whose content differs.
    KeyReused {
        id: u64,
        event: Arc<UserEvent>,
    },
}

/// How [`AgentHandle::submit`] sends an event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Submit {
    /// Names the event for retries: sent again with the same key (and the same content), it is
    /// not queued twice.
    pub idempotency_key: Option<String>,
    /// Return the event's [`PendingReply`].
    pub watch: bool,
}

/// What [`AgentHandle::submit`] did.
#[derive(Debug)]
pub struct Submitted {
    /// The event's id (for a duplicate: the first event's).
    pub id: u64,
    /// `true` when the key named an event accepted earlier: nothing was queued.
    pub duplicate: bool,
    /// With [`Submit::watch`]: the reply — for a duplicate only while the first event is still
    /// pending or running (a settled one's fate is in the journal).
    pub reply: Option<PendingReply>,
}

/// Why [`AgentHandle::submit`] did not acknowledge an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Not queued (handed back with the reason).
    #[error(transparent)]
    Refused(#[from] EventSendError),
    /// The idempotency key was given to event `id`, whose content differs; nothing was queued.
    #[error("idempotency key {key:?} was used for event {id} with a different body")]
    KeyReused {
        /// The idempotency key as given.
        key: String,
        /// The id of the earlier event the key names.
        id: u64,
        /// The new event, handed back unchanged.
        event: UserEvent,
    },
    /// Queued under `id` (it runs) but its acceptance is not on disk.
    #[error("event {id} was queued but is not durable: {cause}")]
    NotDurable {
        /// The id the event was queued under.
        id: u64,
        /// Why its acceptance will not be (or is not yet) on disk.
        cause: NotDurable,
    },
}

/// An event not queued, with the reason.
pub(crate) struct Rejected {
    event: Arc<UserEvent>,
    pub(crate) refusal: WorkRefusal,
    /// A TRIGGER not queued that was kept for memory: the agent's actor was asked to write
    /// it (a `Remember` signal) — a host that defers wakes must wake the agent.
    pub(crate) reminded: bool,
}

impl Rejected {
    fn into_error(self) -> EventSendError {
        EventSendError {
            // Nothing else holds the event when it was not queued: no copy is made.
            event: Arc::unwrap_or_clone(self.event),
            refusal: self.refusal,
        }
    }
}

/// A cheap, cloneable handle on one agent. Stays valid across restarts of its actor.
#[derive(Clone)]
pub struct AgentHandle {
    pub(crate) cell: Arc<AgentCell>,
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle")
            .field("key", &self.cell.key)
            .finish()
    }
}

impl AgentHandle {
    /// The agent's key, unique in its team.
    pub fn key(&self) -> &AgentKey {
        &self.cell.key
    }

    /// The status snapshot: state, lockout, counters, queue depths per lane, usage. Read from the
    /// live record (under its lock, briefly) and the mailbox's counters; never waits for the actor.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptedProvider, Supervisor};
    /// # use warden_protocols::{AgentState, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let model = Arc::new(ScriptedProvider::new([]));
    /// let guard = team.spawn(AgentSpec::assistant("guard", model)).unwrap();
    /// let status = guard.status();
    /// assert_eq!(status.key.as_str(), "guard");
    /// assert_eq!(status.state, AgentState::WaitingForEvent);
    /// assert!(!status.emergency_stop);
    /// assert_eq!(status.queued.ordinary, 0);
    /// # });
    /// ```
    pub fn status(&self) -> AgentStatus {
        self.cell.status()
    }

    /// How many halts were requested of the agent in this process (one that finds it halted
    /// already, not resumed since, does not count): a caller that noted it after a halt can tell
    /// later whether the agent was resumed and halted again since.
    pub fn halt_epoch(&self) -> u64 {
        self.cell.halt_epoch()
    }

    /// Whether the agent is `STOPPED` by its cluster node giving it up
    /// ([`HaltCause::LeaseLost`]; the record's `lease_lost`, restored across restarts).
    pub fn given_up(&self) -> bool {
        self.cell.lock().lease_lost
    }

    /// The current state, read without taking the record lock (cheaper than
    /// [`AgentHandle::status`]).
    pub fn state(&self) -> AgentState {
        self.cell.state()
    }

    /// Whether the agent is *passive*: no actor runs for it (it was idle for
    /// `supervisor.passivate_after_seconds`, or has had no work since it was spawned); the next
    /// message starts one. Nothing else an agent does or shows depends on it.
    pub fn passive(&self) -> bool {
        self.cell.mailbox.is_passive()
    }

    /// A copy of the durable record (state, counters, history).
    pub fn record(&self) -> AgentRecord {
        self.cell.record()
    }

    /// Replaces the agent's goals (carried in its system message from its next model call on),
    /// journaled as `goals_set` by `operator`. Any agent may be given goals this way, in any state.
    ///
    /// # Errors
    /// [`GoalsError::Invalid`] when the goals are invalid ([`warden_protocols::check_goals`]):
    /// what is wrong, in words (never [`GoalsError::NotDurable`]: this does not wait for the
    /// journal; [`AgentHandle::set_goals_durable`] does).
    pub fn set_goals(&self, goals: Vec<String>, operator: &str) -> Result<(), GoalsError> {
        warden_protocols::check_goals(&goals).map_err(GoalsError::Invalid)?;
        self.cell.note(EventKind::GoalsSet {
            goals,
            by: operator.to_owned(),
        });
        Ok(())
    }

    /// [`AgentHandle::set_goals`], acknowledged once the `goals_set` is on disk (awaited off every
    /// lock, without blocking a thread): what the operator's `PUT …/goals` answers with.
    ///
    /// # Errors
    /// [`GoalsError::Invalid`] (nothing changed), [`GoalsError::NotDurable`] (applied in memory,
    /// but the journal cannot make it durable: after a crash the agent would have its old goals).
    ///
    /// # Cancel safety
    /// The goals are set when the future is first polled; dropping it afterwards only loses the
    /// answer on their durability.
    pub async fn set_goals_durable(
        &self,
        goals: Vec<String>,
        operator: &str,
    ) -> Result<(), GoalsError> {
        warden_protocols::check_goals(&goals).map_err(GoalsError::Invalid)?;
        let seq = {
            let mut rec = self.cell.lock();
            self.cell.emit(
                &mut rec,
                EventKind::GoalsSet {
                    goals,
                    by: operator.to_owned(),
                },
            )
        };
        self.cell
            .journal()
            .durable(seq)
            .await
            .map_err(GoalsError::NotDurable)
    }

    /// Resolves once everything this agent has journaled so far is on disk (without blocking a
    /// thread), or with why it is not: for an acknowledgement that leaves the process after a call
    /// that does not wait itself (a queued [`AgentHandle::perceive`], an answer heard on a
    /// [`PendingReply`]: its turn's events).
    ///
    /// # Errors
    /// As [`Journal::durable`](crate::Journal::durable).
    pub async fn durable_so_far(&self) -> Result<(), NotDurable> {
        self.cell.durable_so_far().await
    }

    fn refusal_now(&self) -> Option<WorkRefusal> {
        // Lock-free fast path: only a refusing state needs the record.
        if self.cell.state().refuses_work() {
            refusal_for(&self.cell.lock())
        } else {
            None
        }
    }

    /// Queues a user event: under the record lock, the refusal check, the mailbox push and the
    /// `EventQueued` (so the actor, which settles under the same lock, never sees the event before
    /// its acceptance is journaled, and a halt's clear takes it whole or not at all). One lock, one
    /// journal append, one `Arc` shared by the mailbox, the record and the journal.
    fn queue(&self, event: Arc<UserEvent>, watch: bool) -> Result<Accepted, Rejected> {
        match self.queue_keyed(event, watch, None) {
            Ok(Queued::New(accepted)) => Ok(accepted),
            // Without a key there are no duplicates.
            Ok(Queued::Duplicate { .. }) | Err(KeyedRejection::KeyReused { .. }) => {
                unreachable!("no idempotency key")
            }
            Err(KeyedRejection::Refused(rejected)) => Err(rejected),
        }
    }

    /// [`AgentHandle::queue`] with an optional idempotency key, checked under the same lock: a key
    /// the agent remembers is answered with its event's id (and nothing is queued) when the event is
    /// the same, refused when it is not. A keyed event journals its key in the same batch.
    fn queue_keyed(
        &self,
        event: Arc<UserEvent>,
        watch: bool,
        key: Option<&str>,
    ) -> Result<Queued, KeyedRejection> {
        // Fail closed on a journal that cannot write: an event accepted now would not survive a
        // crash, and it could not be stopped after one.
        if let Some(cause) = self.cell.journal().degraded() {
            return Err(KeyedRejection::Refused(Rejected {
                event,
                refusal: WorkRefusal::JournalUnavailable { cause },
                reminded: false,
            }));
        }
        let mut rec = self.cell.lock();
        if let Some(earlier) = key.and_then(|k| rec.keyed(k)) {
            let id = earlier.id;
            if *earlier.event != *event {
                return Err(KeyedRejection::KeyReused { id, event });
            }
            let reply =
                (watch && self.cell.unsettled(&rec, id)).then(|| self.cell.busy().waiters.add(id));
            return Ok(Queued::Duplicate { id, reply });
        }
        if let Some(refusal) = refusal_for(&rec) {
            self.cell.emit(
                &mut rec,
                EventKind::WorkRefused {
                    work: "user_event".into(),
                    refusal: refusal.clone(),
                    queued: None,
                },
            );
            return Err(KeyedRejection::Refused(Rejected {
                event,
                refusal,
                reminded: false,
            }));
        }
        let id = rec.next_event_id();
        let work = Work::Event {
            id,
            event: event.clone(),
            accepted: tokio::time::Instant::now(),
            trace: crate::telemetry::TraceContext::current(),
        };
        if let Err(err) = self.cell.mailbox.try_send(AgentMsg::Work(work)) {
            let refusal = match &err {
                TrySendError::Full(_) => WorkRefusal::MailboxFull {
                    capacity: self.cell.mailbox.capacity(),
                },
                TrySendError::Closed(_) => WorkRefusal::Closed,
            };
            drop(err);
            return Err(KeyedRejection::Refused(Rejected {
                event,
                refusal,
                reminded: false,
            }));
        }
        // Before the event is journaled and the lock released: nothing can settle it yet.
        let reply = watch.then(|| self.cell.busy().waiters.add(id));
        let queued = EventKind::EventQueued { id, event };
        let seq = match key {
            None => self.cell.emit(&mut rec, queued),
            Some(key) => {
                let key = key.to_owned();
                self.cell
                    .emit_all(&mut rec, vec![queued, EventKind::EventKeyed { id, key }])
            }
        };
        Ok(Queued::New(Accepted { id, seq, reply }))
    }

    /// Sends `event` as `options` say, and resolves once its acceptance is durable (as
    /// [`AgentHandle::try_send_event_durable`]): the entry point of senders that acknowledge to
    /// someone else and may send again (the HTTP API).
    ///
    /// With an idempotency key the agent remembers (its last
    /// [`AgentRecord::KEYS_KEPT`] keyed events, kept in the journal), the same event again queues
    /// nothing and answers the first one's id (`duplicate`); that first event's own durability is
    /// its sender's to wait for.
    ///
    /// # Errors
    /// [`SubmitError::Refused`] (the event handed back), [`SubmitError::KeyReused`] (the key names
    /// another event), [`SubmitError::NotDurable`] (queued, but its acceptance is not on disk).
    ///
    /// # Cancel safety
    /// The event is queued when this is first polled; dropping the future after that does not
    /// withdraw it.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, Submit, Supervisor};
    /// # use warden_protocols::{UserEvent, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("Room 3 is free.")]));
    /// let innkeeper = team.spawn(AgentSpec::assistant("innkeeper", model)).unwrap();
    ///
    /// let options = Submit { idempotency_key: Some("req-1".into()), watch: true };
    /// let first = innkeeper.submit(UserEvent::new("a room?"), options.clone()).await.unwrap();
    /// assert!(!first.duplicate);
    /// // A retry with the same key and body queues nothing and names the first event.
    /// let again = innkeeper.submit(UserEvent::new("a room?"), options).await.unwrap();
    /// assert!(again.duplicate);
    /// assert_eq!(again.id, first.id);
    ///
    /// let reply = first.reply.unwrap().await.unwrap();
    /// assert_eq!(reply.answer, "Room 3 is free.");
    /// # });
    /// ```
    pub async fn submit(
        &self,
        event: UserEvent,
        options: Submit,
    ) -> Result<Submitted, SubmitError> {
        let queued = self
            .queue_keyed(
                Arc::new(event),
                options.watch,
                options.idempotency_key.as_deref(),
            )
            .map_err(|rejection| match rejection {
                KeyedRejection::Refused(rejected) => SubmitError::Refused(rejected.into_error()),
                KeyedRejection::KeyReused { id, event } => SubmitError::KeyReused {
                    key: options.idempotency_key.clone().unwrap_or_default(),
                    id,
                    event: Arc::unwrap_or_clone(event),
                },
            })?;
        match queued {
            Queued::Duplicate { id, reply } => Ok(Submitted {
                id,
                duplicate: true,
                reply,
            }),
            Queued::New(accepted) => match self.cell.journal().durable(accepted.seq).await {
                Ok(()) => Ok(Submitted {
                    id: accepted.id,
                    duplicate: false,
                    reply: accepted.reply,
                }),
                Err(cause) => Err(SubmitError::NotDurable {
                    id: accepted.id,
                    cause,
                }),
            },
        }
    }

    /// Queues an event without waiting. Refused while locked out or stopped, or when the ordinary lane
    /// is full; the event is handed back. Returns the event's id (unique over the agent's journal,
    /// across restarts). The acceptance is journaled (`EventQueued`) but not waited for: use
    /// [`AgentHandle::try_send_event_durable`] when the caller acknowledges the event to someone else.
    ///
    /// # Errors
    /// [`EventSendError`], with the event handed back and the [`WorkRefusal`]: `LockedOut`,
    /// `Stopped`, `MailboxFull` (the ordinary lane holds `mailbox.ordinary_capacity` events),
    /// `JournalUnavailable` (the journal is degraded), `Closed` (the team was shut down). The
    /// `LockedOut` and `Stopped` refusals are journaled (`WorkRefused`).
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
    /// # use warden_protocols::{UserEvent, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("Welcome!")]));
    /// let npc = team.spawn(AgentSpec::assistant("innkeeper", model)).unwrap();
    /// let first = npc.try_send_event(UserEvent::new("hi there")).unwrap();
    /// let second = npc.try_send_event(UserEvent::new("anyone here?")).unwrap();
    /// assert!(second > first, "ids grow per agent");
    /// # });
    /// ```
    pub fn try_send_event(&self, event: UserEvent) -> Result<u64, EventSendError> {
        self.queue(Arc::new(event), false)
            .map(|accepted| accepted.id)
            .map_err(Rejected::into_error)
    }

    /// An NPC perceives a world event: it is classified by design 001's rules (`[npc]` of this
    /// agent; see `warden_actors::npc::classify`) and the decision journaled (`perceived`, with the
    /// rule and the trust). A TRIGGER is queued as a user event (source: the event's kind, sender:
    /// the speaker's id), as [`AgentHandle::try_send_event`] queues one; a CONTEXT (or CAPTURE) is
    /// kept in the context buffer and folded into the next turn, never starting one; an IGNORE is
    /// dropped.
    ///
    /// # Errors
    /// [`EventSendError`] when a TRIGGER's user event is refused (locked out, stopped, full lane):
    /// the perception is journaled all the same.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
    /// # use warden_protocols::{npc::{Speaker, SpeakerKind, Verdict, WorldEvent, WorldEventKind}, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("Welcome!")]));
    /// let npc = team.spawn(AgentSpec::assistant("innkeeper", model)).unwrap();
    /// let whisper = WorldEvent {
    ///     speaker: Speaker { id: "p1".into(), kind: SpeakerKind::Player },
    ///     kind: WorldEventKind::Whisper,
    ///     room: Some("tavern".into()),
    ///     text: "a room for the night?".into(),
    ///     mentions: None,
    ///     oob: Default::default(),
    /// };
    /// let seen = npc.perceive(whisper).unwrap();
    /// assert_eq!(seen.perception.verdict, Verdict::Trigger);
    /// assert!(seen.queued.is_some());
    /// # });
    /// ```
    pub fn perceive(
        &self,
        event: warden_protocols::npc::WorldEvent,
    ) -> Result<Perceived, EventSendError> {
        self.perceive_cow(std::borrow::Cow::Owned(event))
            .map_err(Rejected::into_error)
    }

    /// [`AgentHandle::perceive`] of an owned event (its text moves into the queued user event) or a
    /// borrowed one (copied: the host handle keeps the world event to give it back on a refusal).
    pub(crate) fn perceive_cow(
        &self,
        event: std::borrow::Cow<'_, warden_protocols::npc::WorldEvent>,
    ) -> Result<Perceived, Rejected> {
        let (perception, observed, reminded) = self.cell.perceive(&event);
        let ticking = self.cell.ticking();
        if perception.verdict != warden_protocols::npc::Verdict::Trigger {
            if let Some(ticking) = ticking {
                ticking.perceived(event.room.as_deref(), false);
            }
            return Ok(Perceived {
                perception,
                queued: None,
                observed,
                reminded,
            });
        }
        let source = event.kind.as_str().to_owned();
        let (room, sender, content) = match event {
            std::borrow::Cow::Owned(e) => (e.room, e.speaker.id, e.text),
            std::borrow::Cow::Borrowed(e) => (e.room.clone(), e.speaker.id.clone(), e.text.clone()),
        };
        let user = UserEvent {
            source,
            sender: Some(sender),
            content,
        };
        let id = match self.queue(Arc::new(user), false) {
            Ok(accepted) => accepted.id,
            // Its turn was to write the perception its delivery kept (no `Remember` was
            // sent for it): the actor writes it instead.
            Err(rejected) => {
                return Err(Rejected {
                    reminded: observed && self.cell.remind(),
                    ..rejected
                })
            }
        };
        // A queued TRIGGER wakes a sleeping (or idle) NPC: see `npc.tick.wake_seconds`.
        if let Some(ticking) = ticking {
            ticking.perceived(room.as_deref(), true);
        }
        Ok(Perceived {
            perception,
            queued: Some(id),
            observed,
            reminded,
        })
    }

    /// [`AgentHandle::try_send_event`], returning the event's [`PendingReply`]: its id, and its
    /// reply to poll without blocking ([`PendingReply::try_recv`], for a host's tick) or to await.
    ///
    /// # Errors
    /// [`EventSendError`] (the event handed back) when it is refused at once: locked out, stopped,
    /// or the ordinary lane is full.
    ///
    /// # Cancel safety
    /// Dropping the [`PendingReply`] does not withdraw the event.
    pub fn try_ask(&self, event: UserEvent) -> Result<PendingReply, EventSendError> {
        self.queue(Arc::new(event), true)
            .map(|accepted| accepted.reply.expect("a watched event has a reply"))
            .map_err(Rejected::into_error)
    }

    /// Sends `event` (waiting for room in the ordinary lane, as [`AgentHandle::send_event`]) and
    /// resolves with the agent's answer to it.
    ///
    /// # Errors
    /// [`AskError`]: refused at once (the event handed back) or when the agent came to take it,
    /// discarded by a halt, failed (the turn gave no answer), or the agent was shut down.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the event once it is queued: it runs, and its reply is
    /// lost to this caller (the team's reply stream still gets it).
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
    /// # use warden_protocols::{UserEvent, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("Aye, swords are 30 gold.")]));
    /// let smith = team.spawn(AgentSpec::assistant("smith", model)).unwrap();
    /// let reply = smith.ask(UserEvent::new("How much for a sword?")).await.unwrap();
    /// assert_eq!(reply.answer, "Aye, swords are 30 gold.");
    /// # });
    /// ```
    pub async fn ask(&self, event: UserEvent) -> Result<Reply, AskError> {
        let pending = self.send(event, true).await?;
        match pending.reply {
            Some(reply) => reply.await,
            None => Err(AskError::AgentGone),
        }
    }

    /// [`AgentHandle::try_send_event`], resolving once the acceptance is durable in the journal (with
    /// the SQLite journal: committed), so an acknowledgement sent after it (the API's `202`) survives a
    /// crash: the event is then either queued again on restart or already in the history. The wait
    /// blocks no thread. When the journal cannot make it durable the event stays queued and the
    /// error says so ([`DurableSendError::NotDurable`]).
    ///
    /// # Errors
    /// [`DurableSendError::Refused`] as [`AgentHandle::try_send_event`];
    /// [`DurableSendError::NotDurable`] when the event was queued but the journal cannot make its
    /// acceptance durable (do not send it again: it would run twice).
    ///
    /// # Cancel safety
    /// The event is queued when this is first polled; dropping the future afterwards only gives up
    /// waiting for durability.
    pub async fn try_send_event_durable(&self, event: UserEvent) -> Result<u64, DurableSendError> {
        let accepted = self
            .queue(Arc::new(event), false)
            .map_err(Rejected::into_error)?;
        match self.cell.journal().durable(accepted.seq).await {
            Ok(()) => Ok(accepted.id),
            Err(cause) => Err(DurableSendError::NotDurable {
                id: accepted.id,
                cause,
            }),
        }
    }

    /// Queues an event, waiting for room in the ordinary lane (backpressure). Returns the event's id.
    ///
    /// # Errors
    /// [`EventSendError`] for any refusal but a full lane (locked out, stopped, journal
    /// unavailable, closed), with the event handed back.
    ///
    /// # Cancel safety
    /// Cancel safe: while the future waits for room nothing is queued, and dropping it drops the
    /// event; once it resolves the event is queued.
    pub async fn send_event(&self, event: UserEvent) -> Result<u64, EventSendError> {
        self.send(event, false).await.map(|accepted| accepted.id)
    }

    async fn send(&self, event: UserEvent, watch: bool) -> Result<Accepted, EventSendError> {
        let mut event = Some(Arc::new(event));
        self.cell
            .mailbox
            .retry_while_full(|| match self.queue(event.take()?, watch) {
                Ok(accepted) => Some(Ok(accepted)),
                Err(Rejected {
                    event: back,
                    refusal: WorkRefusal::MailboxFull { .. },
                    ..
                }) => {
                    event = Some(back);
                    None
                }
                Err(rejected) => Some(Err(rejected.into_error())),
            })
            .await
    }

    /// Queues an autonomous tick (a turn with no new user event) in the ordinary lane. Returns the
    /// mailbox id of the tick message (not a user-event id: a tick is not a pending event).
    ///
    /// The team's tick arbiter queues ticks by itself for an agent with `npc.tick.enabled`, at
    /// most one at a time; a tick queued here is the caller's own and bypasses that guard.
    ///
    /// # Errors
    /// The [`WorkRefusal`]: `LockedOut`, `Stopped`, `MailboxFull`, `Closed`.
    pub fn try_tick(&self) -> Result<u64, WorkRefusal> {
        if let Some(refusal) = self.refusal_now() {
            return Err(refusal);
        }
        self.cell
            .mailbox
            .try_send(AgentMsg::Work(Work::Tick))
            .map_err(|err| match err {
                TrySendError::Full(_) => WorkRefusal::MailboxFull {
                    capacity: self.cell.mailbox.capacity(),
                },
                TrySendError::Closed(_) => WorkRefusal::Closed,
            })
    }

    /// SystemHalt (priority 0). The halt is requested when this is *called* (not when the future is
    /// first polled); the future resolves when the agent has acknowledged `STOPPED`.
    ///
    /// The halt is visible to the running turn at once (its LLM call is dropped, no tool starts), even
    /// before the actor reads the halt message. Halting an agent also halts the delegates of the
    /// delegations it is running.
    ///
    /// An agent that runs no turn right now — passive, or active with its actor idle between two
    /// messages (a paused agent behind any backlog included) — is halted by this call itself, on
    /// the calling thread: the acknowledgement is there at the first poll (the durability wait
    /// aside), whatever the agent's thread is doing. Only a running turn, which the actor must
    /// end, makes the halt a message its actor reads.
    ///
    /// On halt the ordinary lane is cleared (each discarded user event is journaled and its waiter
    /// told [`AskError::Discarded`]); the agent stays `STOPPED` until [`AgentHandle::resume`]. A
    /// locked-out agent stays `SAFETY_LOCKOUT`. If the team was shut down the acknowledgement
    /// reports the record's state as it is.
    ///
    /// # Cancel safety
    /// Cancel safe: the halt is raised and queued before the future exists; dropping the future
    /// only loses the [`HaltAck`].
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptedProvider, Supervisor};
    /// # use warden_protocols::{AgentState, HaltCause, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let scout = team.spawn(AgentSpec::assistant("scout", Arc::new(ScriptedProvider::new([])))).unwrap();
    /// let ack = scout.halt(HaltCause::Operator { operator: "ops".into() }).await;
    /// assert_eq!(ack.state, AgentState::Stopped);
    /// assert!(ack.not_durable.is_none());
    /// // A stopped agent refuses work until it is resumed.
    /// scout.resume("ops").await.unwrap();
    /// assert_eq!(scout.state(), AgentState::WaitingForEvent);
    /// # });
    /// ```
    pub fn halt(&self, cause: HaltCause) -> impl std::future::Future<Output = HaltAck> + 'static {
        let rx = send_halt(&self.cell, cause);
        let cell = self.cell.clone();
        async move {
            match rx.await {
                Ok(sent) => sent.settle().await,
                // The actor is gone for good (shut down): report what the record says.
                Err(_) => cell.halt_ack_now(),
            }
        }
    }

    /// Sends `op` through the control lane; once the actor has applied it, waits here (on the
    /// caller's task) until it is durable.
    ///
    /// A passive agent's control is applied here, to its record, with no actor started (as a
    /// passive agent's halt is: a lift of a fleet halt resumes a million passive agents without
    /// starting a million actors). A message sent meanwhile may start the actor: the control and
    /// the actor's own steps are ordered by the record lock, and the actor is woken afterwards, so
    /// work that an unpause (or a resume) lets through is read.
    async fn control(&self, op: ControlOp) -> Result<(), ControlError> {
        let cell = &self.cell;
        if passive(cell) {
            #[cfg(feature = "test-hooks")]
            crate::test_hooks::passive_control_gap(&cell.key);
            let applied = actor::apply_control(cell, op);
            if !cell.mailbox.is_passive() {
                // Started meanwhile: its pump may have looked while the agent was still paused.
                cell.mailbox.schedule_wake();
            }
            applied?;
            return cell
                .durable_so_far()
                .await
                .map_err(ControlError::NotDurable);
        }
        let (reply, rx) = oneshot::channel();
        self.cell
            .mailbox
            .try_send(AgentMsg::Control(ControlRequest { op, reply }))
            .map_err(|_| ControlError::Closed)?;
        let durable = rx.await.unwrap_or(Err(ControlError::Closed))?;
        durable.await.map_err(ControlError::NotDurable)
    }

    /// Authenticated unlock: `SAFETY_LOCKOUT → WAITING_FOR_EVENT`. `operator` is journaled. Callers
    /// (the CLI, the admin API) authenticate the operator before calling this; nothing an agent or a
    /// model produces can reach it.
    ///
    /// The request goes through the control lane (priority 1), ahead of queued ordinary work.
    ///
    /// # Errors
    /// [`ControlError::NotActive`] (not locked out), [`ControlError::NotDurable`] (applied, not on
    /// disk), [`ControlError::Closed`] (shut down).
    ///
    /// # Cancel safety
    /// The request is queued when the future is first polled; dropping it afterwards does not
    /// withdraw it, only its outcome is lost.
    pub async fn unlock(&self, operator: &str) -> Result<(), ControlError> {
        self.unlock_with_note(operator, None).await
    }

    /// [`AgentHandle::unlock`] with the operator's reason, journaled as the `Unlocked` event's
    /// `note`.
    ///
    /// # Errors
    /// As [`AgentHandle::unlock`].
    ///
    /// # Cancel safety
    /// As [`AgentHandle::unlock`].
    pub async fn unlock_with_note(
        &self,
        operator: &str,
        note: Option<String>,
    ) -> Result<(), ControlError> {
        self.control(ControlOp::Unlock {
            operator: operator.into(),
            note,
        })
        .await
    }

    /// The design's emergency clear (same effect as [`AgentHandle::unlock`]).
    ///
    /// # Errors
    /// As [`AgentHandle::unlock`].
    pub async fn clear_emergency(&self, operator: &str) -> Result<(), ControlError> {
        self.control(ControlOp::ClearEmergency {
            operator: operator.into(),
        })
        .await
    }

    /// Clears history, the error count and any lockout (control lane, priority 1).
    ///
    /// # Errors
    /// [`ControlError::NotDurable`] (applied, not on disk), [`ControlError::Closed`] (shut down).
    pub async fn reset_history(&self, operator: &str) -> Result<(), ControlError> {
        self.control(ControlOp::ResetHistory {
            operator: operator.into(),
        })
        .await
    }

    /// Stops reading ordinary work: queued and newly sent work stays queued (and counts against
    /// the ordinary lane's capacity) until [`AgentHandle::resume`]. Halts, controls and supervision
    /// signals are still read (lanes 0–2). `operator` is journaled; pausing a paused agent does
    /// nothing and succeeds.
    ///
    /// # Errors
    /// [`ControlError::NotDurable`] (applied, not on disk), [`ControlError::Closed`] (shut down).
    pub async fn pause(&self, operator: &str) -> Result<(), ControlError> {
        self.control(ControlOp::Pause {
            operator: operator.into(),
        })
        .await
    }

    /// Undoes a pause, and brings a STOPPED agent back to `WAITING_FOR_EVENT`.
    ///
    /// # Errors
    /// [`ControlError::NotStopped`] (neither paused nor stopped), [`ControlError::LockedOut`] (only
    /// an unlock lifts a lockout), [`ControlError::NotDurable`], [`ControlError::Closed`].
    pub async fn resume(&self, operator: &str) -> Result<(), ControlError> {
        self.control(ControlOp::Resume {
            operator: operator.into(),
        })
        .await
    }
}

/// The typed refusal of a locked-out or stopped agent, `None` while it takes work.
///
/// The lockout is checked first and on its own, not through the state: a record that is locked out
/// refuses work whatever its state says (a journal written before lockouts and states were
/// journaled together can hold a locked-out agent in `WAITING_FOR_EVENT`).
pub(crate) fn refusal_for(rec: &AgentRecord) -> Option<WorkRefusal> {
    if let Some(lockout) = &rec.lockout {
        return Some(WorkRefusal::LockedOut {
            cause: lockout.reason.clone(),
        });
    }
    match rec.state {
        AgentState::SafetyLockout => Some(WorkRefusal::LockedOut {
            cause: String::new(),
        }),
        AgentState::Stopped => Some(WorkRefusal::Stopped),
        _ => None,
    }
}

/// Marks the halt visible and queues it in lane 0. The receiver resolves on the acknowledgement.
pub(crate) fn send_halt(cell: &Arc<AgentCell>, cause: HaltCause) -> oneshot::Receiver<SentAck> {
    let (ack, rx) = oneshot::channel();
    send_halt_to(cell, cause, Some(HaltReply::One(ack)));
    rx
}

/// [`send_halt`] with the acknowledgement sent to `reply` (none: nobody waits).
///
/// The halt reaches the delegates of every delegation running when it is raised, transitively, here
/// and now (see [`AgentCell::request_halt`] for why they are listed before the turn is cancelled):
/// not in the actor's halt handler, by which time a cancelled turn may have ended them.
pub(crate) fn send_halt_to(cell: &Arc<AgentCell>, cause: HaltCause, reply: Option<HaltReply>) {
    let delegates = cell.request_halt();
    queue_halt(cell, cause, reply);
    for delegate in delegates {
        let parent = HaltCause::Parent {
            parent: cell.key.clone(),
        };
        send_halt_to(&delegate, parent, None);
    }
}

/// Queues the halt message of a halt already raised ([`AgentCell::request_halt`]) in lane 0.
pub(crate) fn queue_halt(cell: &Arc<AgentCell>, cause: HaltCause, reply: Option<HaltReply>) {
    #[cfg(feature = "test-hooks")]
    crate::test_hooks::halt_gap(&cell.key);
    let Some(request) = halt_if_passive(cell, cause, reply) else {
        return;
    };
    if let Some(request) = halt_if_idle(cell, request) {
        send_queued_halt(cell, request);
    }
}

/// An active agent whose actor is idle — between two messages, no turn running (a paused agent
/// behind any backlog, an agent waiting for its next event) — is halted here and now, on the
/// halting thread, as a passive one is: its reader is borrowed
/// ([`PriorityMailbox::borrow_idle_reader`]: it reads nothing until the halt is applied, and is
/// woken afterwards if it came meanwhile), the
/// halt is applied to the cell as the actor would apply it, and the acknowledgement goes out at
/// once — no wake-up of another thread before it, so the halt is as fast as the halting thread,
/// and a busy arbiter (another agent's long step on the same thread) cannot delay it.
///
/// The cleared backlog's events are settled, listed and freed after the acknowledgement, by the
/// actor (a [`Signal::Cleared`], see [`hand_over`]), as after a halt it read. Returns the request
/// when the actor is not idle (to be queued: a running turn is the actor's to end).
///
/// [`PriorityMailbox::borrow_idle_reader`]: crate::mailbox::PriorityMailbox::borrow_idle_reader
fn halt_if_idle(cell: &Arc<AgentCell>, request: HaltRequest) -> Option<HaltRequest> {
    let Some(borrow) = cell.mailbox.borrow_idle_reader() else {
        return Some(request);
    };
    #[cfg(feature = "test-hooks")]
    crate::test_hooks::idle_halt_gap(&cell.key);
    let HaltRequest { cause, ack: reply } = request;
    let (discarded, sent) = actor::halt_cell(cell, &cause, reply.is_some());
    drop(borrow);
    if let (Some(reply), Some(sent)) = (reply, sent) {
        reply.send(sent);
    }
    actor::settle_answering(cell);
    if !discarded.is_empty() {
        hand_over(cell, discarded);
    }
    None
}

/// [`queue_halt`] for a halt of many agents gathered by one caller (`halt_all`): a passive agent,
/// or an active one whose actor is idle, is halted here and now, in `batch` (no message, no
/// channel: a fleet of a million idle agents is halted by its caller's thread, its rows journaled
/// a batch at a time), its acknowledgement put in `acks[slot]` when the batch is journaled; an
/// agent whose turn runs gets a message, and its ack is sent to `slot` of `to` once its actor has
/// applied the halt.
pub(crate) fn queue_halt_gathered<'a>(
    cell: &'a AgentCell,
    cause: &HaltCause,
    slot: usize,
    to: &mpsc::UnboundedSender<(usize, SentAck)>,
    batch: &mut halt_batch::HaltBatch<'a>,
    acks: &mut [Option<HaltAck>],
) {
    #[cfg(feature = "test-hooks")]
    {
        if crate::test_hooks::halt_gap_set() {
            batch.flush(acks);
        }
        crate::test_hooks::halt_gap(&cell.key);
    }
    if passive(cell) {
        batch.halt(cell, slot, acks);
        return;
    }
    // An active agent whose actor is idle is halted here too, as in `halt_if_idle`: its reader
    // borrowed while its record changes. The batch keeps the record lock until its rows are
    // journaled; an actor woken after the borrow's end waits for that at its first lock, and finds
    // the agent stopped.
    if let Some(borrow) = cell.mailbox.borrow_idle_reader() {
        batch.halt(cell, slot, acks);
        drop(borrow);
        return;
    }
    // (Passive meanwhile — its actor stopped since the check — the message starts a new one, as
    // any message to a passive agent does, and it reads the halt.)
    let ack = Some(HaltReply::Gathered {
        slot,
        to: to.clone(),
    });
    send_queued_halt(
        cell,
        HaltRequest {
            cause: cause.clone(),
            ack,
        },
    );
}

/// Hands a halt's cleared backlog to the agent's actor ([`Signal::Cleared`]), after the halt's
/// acknowledgement: from a task on the halting thread's runtime when there is one (so the wake-up
/// of the agent's thread — microseconds of a system call and an inter-processor interrupt — is
/// not paid before the halting caller has its ack), or at once.
fn hand_over(cell: &Arc<AgentCell>, cleared: VecDeque<Envelope<AgentMsg>>) {
    let handover = Handover {
        cell: cell.clone(),
        cleared,
    };
    match tokio::runtime::Handle::try_current() {
        // Dropped by the task, or with it if the runtime ends before it runs: handed over either
        // way.
        Ok(runtime) => drop(runtime.spawn(async move { drop(handover) })),
        Err(_) => drop(handover),
    }
}

/// A halt's cleared backlog on its way to the agent's actor: handed over when dropped.
struct Handover {
    cell: Arc<AgentCell>,
    cleared: VecDeque<Envelope<AgentMsg>>,
}

impl Drop for Handover {
    fn drop(&mut self) {
        let cleared = std::mem::take(&mut self.cleared);
        let sent = self
            .cell
            .mailbox
            .try_send(AgentMsg::Signal(Signal::Cleared(cleared)));
        if let Err(refused) = sent {
            // Closed (the team shuts down): settle and list them here.
            if let AgentMsg::Signal(Signal::Cleared(cleared)) = refused.into_inner() {
                actor::settle_cleared(&self.cell, &cleared);
                actor::discard_backlog(&self.cell, cleared);
            }
        }
    }
}

/// Whether `cell` is passive (no actor runs: docs/architecture.md) and open.
fn passive(cell: &AgentCell) -> bool {
    cell.mailbox.is_passive() && !cell.mailbox.is_closed()
}

/// Applies the halt to a passive agent's cell (see [`halt_if_passive`]), returning its ack when
/// `ack` is asked for.
fn halt_passive(cell: &AgentCell, cause: &HaltCause, ack: bool) -> Option<SentAck> {
    #[cfg(feature = "test-hooks")]
    crate::test_hooks::passive_halt_gap(&cell.key);
    let (discarded, sent) = actor::halt_cell(cell, cause, ack);
    actor::settle_halted(cell, &discarded);
    actor::discard_backlog(cell, discarded);
    sent
}

/// A passive agent (no actor runs: docs/architecture.md) is halted here and now: the halt is a
/// change of its record, acknowledged at once, with no actor started for it. A message sent
/// meanwhile may start one: it finds the halt flag up (raised before this, SeqCst, and read by the
/// started actor after `is_passive` turned false: see there), so it reads no ordinary work, and
/// whatever reached the ordinary lane is cleared, under the record lock, as a halt read by the
/// actor clears it. Returns the request when the agent is not passive (to be queued).
fn halt_if_passive(
    cell: &AgentCell,
    cause: HaltCause,
    reply: Option<HaltReply>,
) -> Option<HaltRequest> {
    if !passive(cell) {
        return Some(HaltRequest { cause, ack: reply });
    }
    let sent = halt_passive(cell, &cause, reply.is_some());
    if let (Some(reply), Some(sent)) = (reply, sent) {
        reply.send(sent);
    }
    None
}

/// Queues a halt request in lane 0 (acknowledged with the state as it is if the mailbox is closed).
fn send_queued_halt(cell: &AgentCell, request: HaltRequest) {
    if let Err(err) = cell.mailbox.try_send(AgentMsg::Halt(request)) {
        // The mailbox is closed (the team is shutting down): acknowledge with the state as it is.
        if let AgentMsg::Halt(HaltRequest {
            ack: Some(reply), ..
        }) = err.into_inner()
        {
            reply.send(SentAck::settled(cell.halt_ack_now()));
        }
    }
}
