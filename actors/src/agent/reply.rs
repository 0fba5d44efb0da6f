//! Replies: what became of an accepted user event, delivered to whoever waits for it.
//!
//! An event accepted with a waiter ([`crate::AgentHandle::ask`], [`crate::AgentHandle::try_ask`])
//! gets its [`PendingReply`]; whatever settles the event settles the waiter, exactly once:
//!
//! * the turn that took it finishes: [`Reply`] with the answer, or [`AskError::Refused`] (the turn
//!   ended in a lockout), or [`AskError::Failed`] (no answer: model failure, limit, budget stop);
//! * the agent refuses it when it comes to take it (locked out, stopped): [`AskError::Refused`];
//! * a halt clears it from the queue, or stops the turn that took it: [`AskError::Discarded`];
//! * the actor crashes in the turn that took it: [`AskError::Failed`];
//! * the team shuts down first: [`AskError::AgentGone`].
//!
//! The same settlements go to the team's reply stream when a host took it
//! ([`crate::Supervisor::take_replies`]), for every event, waited for or not.
//!
//! # Lock order
//! `record` → `waiters` (a leaf). Senders are resolved after the lock is released.

use parking_lot::Mutex;
use std::{
    future::Future,
    pin::Pin,
    sync::OnceLock,
    task::{Context, Poll},
    time::Duration,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use warden_protocols::{AgentKey, EventFate, TerminationReason, Usage, WorkRefusal};

/// An agent's answer to one user event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The agent that answered.
    pub agent: AgentKey,
    /// The event's id (as returned when it was accepted).
    pub id: u64,
    /// The answer text (the model's final message, or the wrap-up of a forced stop).
    pub answer: String,
    /// How the turn ended (`noop`: the model answered; `limit_stopped`: a forced wrap-up, …).
    pub reason: TerminationReason,
    /// Tokens of the turn's model calls.
    pub usage: Usage,
    /// The answer is incomplete: still cut by the model's token limit after the last max-tokens
    /// recovery (`execution.max_tokens_recoveries`).
    pub truncated: bool,
    /// From the event's acceptance to its answer (on tokio's clock: paused time in tests).
    pub latency: Duration,
}

/// Why an event has no [`Reply`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// Not queued: refused at once (the event is handed back).
    #[error(transparent)]
    NotQueued(#[from] super::EventSendError),
    /// Queued under `id`, then refused: the agent was locked out or stopped when it came to take
    /// it, or its turn ended in a lockout.
    #[error("event {id} refused: {refusal}")]
    Refused {
        /// The event's id.
        id: u64,
        /// Why it was refused.
        refusal: WorkRefusal,
    },
    /// Queued under `id`, then discarded by a halt (cleared from the queue, or its turn stopped).
    #[error("event {id} discarded by a halt")]
    Discarded {
        /// The event's id.
        id: u64,
    },
    /// The turn that took event `id` ended without an answer.
    #[error("event {id} failed ({reason}){}", .error.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    Failed {
        /// The event's id.
        id: u64,
        /// How the turn ended (a model failure, a limit, a budget stop, a crash, …).
        reason: TerminationReason,
        /// The error text when the turn had one to give; `None` when the reason says it all.
        error: Option<String>,
    },
    /// The agent was shut down before it settled the event.
    #[error("agent is gone")]
    AgentGone,
}

/// What settled one event: its reply or why there is none.
pub type Settled = Result<Reply, AskError>;

/// The reply to one event, to poll without blocking ([`PendingReply::try_recv`]) or to await.
///
/// # Cancel safety
/// Dropping it (or a future awaiting it) does not withdraw the event: it stays queued and runs;
/// only its reply is no longer delivered here.
#[derive(Debug)]
pub struct PendingReply {
    id: u64,
    rx: oneshot::Receiver<Settled>,
}

impl PendingReply {
    /// The event's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The reply if the event is settled, `None` while it is not; never blocks (for a host's tick).
    pub fn try_recv(&mut self) -> Option<Settled> {
        match self.rx.try_recv() {
            Ok(settled) => Some(settled),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(AskError::AgentGone)),
        }
    }
}

impl Future for PendingReply {
    type Output = Settled;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Settled> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(AskError::AgentGone)))
    }
}

struct Waiter {
    id: u64,
    tx: oneshot::Sender<Settled>,
}

/// One agent's waiters, by event id (few at a time: a vector, not a map; boxed, so an agent nobody
/// asks anything carries 16 bytes for it, not 32).
#[derive(Default)]
// The box is the point: `None` is one word where an empty `Vec` is three.
#[allow(clippy::box_collection)]
pub(crate) struct Waiters(Mutex<Option<Box<Vec<Waiter>>>>);

impl Waiters {
    /// A waiter for event `id` (called under the record lock, before the event can be settled).
    pub(crate) fn add(&self, id: u64) -> PendingReply {
        let (tx, rx) = oneshot::channel();
        self.0
            .lock()
            .get_or_insert_with(Box::default)
            .push(Waiter { id, tx });
        PendingReply { id, rx }
    }

    fn take(&self, id: u64) -> Option<oneshot::Sender<Settled>> {
        let mut slot = self.0.lock();
        let waiters = slot.as_mut()?;
        let at = waiters.iter().position(|w| w.id == id)?;
        Some(waiters.swap_remove(at).tx)
    }

    /// Drops every waiter: each is told [`AskError::AgentGone`].
    pub(crate) fn clear(&self) {
        let waiters = self.0.lock().take();
        drop(waiters);
    }
}

/// One settled event of the team's stream ([`crate::Supervisor::take_replies`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The agent the event was sent to.
    pub agent: AgentKey,
    /// The event's id (per agent).
    pub id: u64,
    /// Its reply, or why there is none.
    pub result: Settled,
}

/// A world-facing notice of the team's stream ([`crate::Supervisor::take_notices`]): an agent fell
/// silent (locked out, halted) or is back (unlocked, resumed) — design 000's "notify the
/// character", for a host to show ("the innkeeper falls silent").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The agent.
    pub agent: AgentKey,
    /// Silent or back.
    pub presence: warden_protocols::Presence,
    /// The default words ([`warden_protocols::Presence::notice`]).
    pub text: String,
    /// Why: the cause of the state change (`safety lockout: …`, the halt, the resume).
    pub cause: String,
}

/// The team's stream of settlements, for a host that takes it ([`crate::Supervisor::take_replies`]),
/// and its stream of notices ([`crate::Supervisor::take_notices`]).
#[derive(Default)]
pub(crate) struct ReplyHub(
    OnceLock<mpsc::UnboundedSender<Settlement>>,
    OnceLock<mpsc::UnboundedSender<Notice>>,
);

impl ReplyHub {
    /// The receiving end, the first time; `None` after.
    pub(crate) fn take(&self) -> Option<mpsc::UnboundedReceiver<Settlement>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.0.set(tx).ok().map(|()| rx)
    }

    /// The receiving end of the notices, the first time; `None` after.
    pub(crate) fn take_notices(&self) -> Option<mpsc::UnboundedReceiver<Notice>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.1.set(tx).ok().map(|()| rx)
    }

    /// Sends `agent`'s notice for the state change `from → to`, if it is one and a host took the
    /// stream. Never blocks (a leaf: called under the agent's record lock).
    pub(crate) fn announce(
        &self,
        agent: &AgentKey,
        from: warden_protocols::AgentState,
        to: warden_protocols::AgentState,
        cause: &str,
    ) {
        let (Some(tx), Some(presence)) = (self.1.get(), from.presence_change(to)) else {
            return;
        };
        let _ = tx.send(Notice {
            agent: agent.clone(),
            presence,
            text: presence.notice(agent.as_str()),
            cause: cause.to_owned(),
        });
    }

    fn taken(&self) -> bool {
        self.0.get().is_some()
    }
}

/// Settles event `id` of `agent` as `fate` says: tells its waiter (if any) and the team's stream
/// (if taken). `accepted` is when the event was queued (for the latency), if known. Does nothing for
/// an unsettled fate.
pub(crate) fn settle(
    waiters: Option<&Waiters>,
    hub: &ReplyHub,
    agent: &AgentKey,
    id: u64,
    accepted: Option<Instant>,
    fate: EventFate,
) {
    if !fate.is_settled() {
        return;
    }
    let waiter = waiters.and_then(|w| w.take(id));
    if waiter.is_none() && !hub.taken() {
        return;
    }
    let settled = match fate {
        EventFate::Answered {
            answer,
            reason,
            usage,
            truncated,
        } => Ok(Reply {
            agent: agent.clone(),
            id,
            answer,
            reason,
            usage,
            truncated,
            latency: accepted.map(|t| t.elapsed()).unwrap_or_default(),
        }),
        EventFate::Refused { refusal } => Err(AskError::Refused { id, refusal }),
        EventFate::Discarded => Err(AskError::Discarded { id }),
        EventFate::Failed { reason, error } => Err(AskError::Failed { id, reason, error }),
        EventFate::Pending | EventFate::Running => return,
    };
    if let Some(tx) = hub.0.get() {
        let _ = tx.send(Settlement {
            agent: agent.clone(),
            id,
            result: settled.clone(),
        });
    }
    if let Some(waiter) = waiter {
        let _ = waiter.send(settled);
    }
}
