//! Delegations: the sub-agent slots this agent holds and who waits on it.

use super::*;

impl AgentCell {
    /// Takes a delegation slot if fewer than `budget` are in use; returns the count before on refusal.
    pub(crate) fn try_acquire_slot(&self, budget: u32) -> Result<(), u32> {
        self.active_delegations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < budget).then_some(n + 1)
            })
            .map(|_| ())
    }

    pub(crate) fn release_slot(&self) {
        let _ = self
            .active_delegations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    pub(crate) fn active_delegations(&self) -> u32 {
        self.active_delegations.load(Ordering::Acquire)
    }

    /// Lists delegation `id` as running, then checks for a halt: `false` means a halt is requested
    /// and may not have seen it — the delegation must be refused before its task is sent (and
    /// removed, which dropping its `Slot` does). See [`HaltGate::enter`].
    pub(crate) fn add_delegation(&self, id: u64, delegate: Arc<AgentCell>) -> bool {
        self.halt.enter(id, delegate)
    }

    pub(crate) fn remove_delegation(&self, id: u64) {
        self.halt.leave(id);
    }

    pub(crate) fn add_delegator(&self, id: u64, delegator: &Arc<AgentCell>) {
        self.busy()
            .delegators
            .lock()
            .insert(id, Arc::downgrade(delegator));
    }

    pub(crate) fn remove_delegator(&self, id: u64) {
        if let Some(busy) = self.busy_now() {
            busy.delegators.lock().remove(&id);
        }
    }

    /// The delegates of the delegations running now.
    pub(crate) fn running_delegates(&self) -> Vec<Arc<AgentCell>> {
        self.halt.running()
    }
}
