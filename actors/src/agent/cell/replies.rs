//! Replies: settling accepted user events and waking whoever waits for their answers.

use super::*;

impl AgentCell {
    /// Settles event `id` (see [`super::reply`]): its waiter and the team's reply stream hear of it.
    pub(crate) fn settle(&self, id: u64, accepted: Option<tokio::time::Instant>, fate: EventFate) {
        crate::agent::reply::settle(
            self.waiters_now(),
            &self.replies,
            &self.key,
            id,
            accepted,
            fate,
        );
    }

    /// The running turn answers event `id` (called under the record lock, as it is taken).
    pub(crate) fn set_answering(&self, id: u64, accepted: tokio::time::Instant) {
        *self.busy().answering.lock() = Some((id, accepted));
    }

    /// The event the running turn answers, if any, no longer marked (its settler takes it).
    pub(crate) fn take_answering(&self) -> Option<(u64, tokio::time::Instant)> {
        self.busy_now().and_then(|b| b.answering.lock().take())
    }

    /// `true` while event `id` is pending or its turn runs (not settled yet). Under the record lock.
    pub(crate) fn unsettled(&self, rec: &AgentRecord, id: u64) -> bool {
        rec.pending.iter().any(|p| p.id == id)
            || self
                .busy_now()
                .is_some_and(|b| b.answering.lock().is_some_and(|(running, _)| running == id))
    }

    /// Settles the event of a turn that will never finish (the actor crashed or was restarted).
    pub(crate) fn settle_taken(&self, fate: EventFate) {
        if let Some((id, accepted)) = self.take_answering() {
            self.settle(id, Some(accepted), fate);
        }
    }
}
