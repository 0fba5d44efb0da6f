//! The intervention bus: how the limit checkpoint asks an operator a yes/no question.
//!
//! # Invariants
//! * An ask is pending from the moment [`InterventionBus::ask`] is polled until it is answered or its
//!   future is dropped (e.g. by the checkpoint's `ask_timeout_seconds`); a dropped ask is removed, so a
//!   late answer to it is an error ([`AnswerError::Unknown`]) and can never leak into another ask.
//! * Each id is answered at most once.

use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use tokio::sync::{oneshot, Notify};
use warden_protocols::{Answer, Intervention, OperatorReply};

/// Why an ask got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The bus went away before an answer came.
    #[error("intervention bus closed")]
    Closed,
    /// An ask with this id is already pending.
    #[error("intervention {0} is already pending")]
    Duplicate(u64),
}

/// Why an answer was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No pending ask has this id (never asked, already answered, timed out or cancelled).
    #[error("no pending intervention with id {0}")]
    Unknown(u64),
}

/// Somewhere an operator can answer a yes/no question (TTY, HTTP, A2A peer, test).
pub trait InterventionBus: Send + Sync {
    /// Asks and waits for the answer (and who gave it). Dropping the future withdraws the question.
    fn ask(&self, intervention: Intervention) -> BoxFuture<'_, Result<OperatorReply, BusError>>;
}

struct Pending {
    intervention: Intervention,
    reply: oneshot::Sender<OperatorReply>,
}

/// An in-process bus: pending asks can be listed and answered by id from any task.
/// The HTTP bus wraps one of these.
#[derive(Default)]
pub struct ChannelInterventionBus {
    pending: Mutex<BTreeMap<u64, Pending>>,
    arrived: Notify,
}

impl std::fmt::Debug for ChannelInterventionBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelInterventionBus")
            .field("pending", &self.pending.lock().keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Removes its ask from the pending table when the ask future ends or is dropped.
struct Withdraw<'a> {
    bus: &'a ChannelInterventionBus,
    id: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.bus.pending.lock().remove(&self.id);
    }
}

impl ChannelInterventionBus {
    /// A bus with no pending asks.
    pub fn new() -> Self {
        Self::default()
    }

    /// The pending asks, oldest (lowest id) first.
    pub fn pending(&self) -> Vec<Intervention> {
        self.pending
            .lock()
            .values()
            .map(|p| p.intervention.clone())
            .collect()
    }

    /// Answers pending ask `id`, anonymously.
    ///
    /// # Errors
    /// [`AnswerError::Unknown`] when no ask `id` is pending (never asked, already answered, timed
    /// out, or withdrawn because its agent was halted).
    pub fn answer(&self, id: u64, answer: Answer) -> Result<(), AnswerError> {
        self.reply(id, answer.into())
    }

    /// Answers pending ask `id`, saying who answered (journaled with the decision).
    ///
    /// # Errors
    /// As [`ChannelInterventionBus::answer`].
    pub fn reply(&self, id: u64, reply: OperatorReply) -> Result<(), AnswerError> {
        let pending = self
            .pending
            .lock()
            .remove(&id)
            .ok_or(AnswerError::Unknown(id))?;
        // The asker may have gone between our removal and this send: then nobody waits for it.
        pending
            .reply
            .send(reply)
            .map_err(|_| AnswerError::Unknown(id))
    }

    /// Waits until an ask is pending and returns the oldest one (it stays pending until answered).
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches; nothing is taken from the bus.
    pub async fn next_pending(&self) -> Intervention {
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(p) = self.pending.lock().values().next() {
                return p.intervention.clone();
            }
            notified.await;
        }
    }
}

impl InterventionBus for ChannelInterventionBus {
    fn ask(&self, intervention: Intervention) -> BoxFuture<'_, Result<OperatorReply, BusError>> {
        Box::pin(async move {
            let id = intervention.id;
            let (tx, rx) = oneshot::channel();
            {
                let mut pending = self.pending.lock();
                if pending.contains_key(&id) {
                    return Err(BusError::Duplicate(id));
                }
                pending.insert(
                    id,
                    Pending {
                        intervention,
                        reply: tx,
                    },
                );
            }
            let _withdraw = Withdraw { bus: self, id };
            self.arrived.notify_waiters();
            rx.await.map_err(|_| BusError::Closed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use warden_protocols::LimitKind;

    fn iv(id: u64) -> Intervention {
        Intervention {
            id,
            agent: "a".into(),
            run_id: "r".into(),
            kind: Some(LimitKind::AgentHops),
            current: 4.0,
            configured: 3.0,
            config_key: LimitKind::AgentHops.config_key().into(),
            question: "continue?".into(),
            permission: None,
        }
    }

    #[tokio::test]
    async fn an_ask_is_answered_by_id_from_another_task() {
        let bus = Arc::new(ChannelInterventionBus::new());
        let answerer = {
            let bus = bus.clone();
            tokio::spawn(async move {
                let pending = bus.next_pending().await;
                assert_eq!(bus.pending(), vec![pending.clone()]);
                assert_eq!(bus.answer(99, Answer::Yes), Err(AnswerError::Unknown(99)));
                bus.answer(pending.id, Answer::Yes).unwrap();
                assert_eq!(
                    bus.answer(pending.id, Answer::No),
                    Err(AnswerError::Unknown(pending.id)),
                    "answered once only"
                );
            })
        };
        assert_eq!(bus.ask(iv(7)).await, Ok(Answer::Yes.into()));
        answerer.await.unwrap();
        assert!(bus.pending().is_empty());
    }

    #[tokio::test]
    async fn a_dropped_ask_is_withdrawn_and_a_duplicate_id_is_refused() {
        let bus = ChannelInterventionBus::new();
        {
            let mut first = bus.ask(iv(1));
            assert!(futures::poll!(&mut first).is_pending());
            assert_eq!(bus.pending().len(), 1);
            assert_eq!(bus.ask(iv(1)).await, Err(BusError::Duplicate(1)));
            assert_eq!(
                bus.pending().len(),
                1,
                "the refused duplicate left the first alone"
            );
        }
        assert!(bus.pending().is_empty());
        assert_eq!(bus.answer(1, Answer::Yes), Err(AnswerError::Unknown(1)));
    }
}
