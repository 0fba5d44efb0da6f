//! Halts: the flag raised and the turn's token cancelled synchronously, before the actor reads the
//! halt; the acknowledgement.

use super::*;

impl AgentCell {
    /// Makes a halt visible at once to the running turn (before the actor reads the halt message).
    /// Returns the delegates of the delegations running when the halt was raised, which the caller
    /// must halt too; empty if a halt was already requested (its caller has them).
    ///
    /// Order matters, and is what makes a halt reach every running delegate in every interleaving:
    /// 1. the flag goes up first: a delegation registered after the list below is read sees it and
    ///    is refused before its task is sent (see `Supervisor::delegate`; the `delegations` mutex
    ///    orders the two);
    /// 2. the running delegations are listed;
    /// 3. only then is the turn cancelled: a cancelled turn ends its delegations and drops them from
    ///    the list, so listing after the cancel (as the actor's halt handler once did) could find
    ///    none while a delegate still worked.
    pub(crate) fn request_halt(&self) -> Vec<Arc<AgentCell>> {
        let already = self.halt_requested.swap(true, Ordering::SeqCst);
        let delegates = if already {
            Vec::new()
        } else {
            self.running_delegates()
        };
        if let Some(token) = self.halt_token.lock().as_ref() {
            token.cancel();
        }
        delegates
    }

    /// The acknowledgement of a halt that was not (or could not be) handled by the actor: the state
    /// as it is, nothing discarded.
    pub(crate) fn halt_ack_now(&self) -> crate::agent::HaltAck {
        crate::agent::HaltAck {
            agent: self.key.clone(),
            state: self.state(),
            discarded: 0,
            not_durable: None,
        }
    }

    pub(crate) fn halt_requested(&self) -> bool {
        self.halt_requested.load(Ordering::SeqCst)
    }

    /// Cancelled when a halt is requested (already cancelled if one is pending). Created on first
    /// use: an agent that never runs a turn never allocates one.
    ///
    /// Race-free with [`AgentCell::request_halt`]: that raises the flag before it takes the lock,
    /// and this reads the flag under the lock, so either it sees the flag or the halt finds the token.
    pub(crate) fn halt_token(&self) -> CancellationToken {
        let mut slot = self.halt_token.lock();
        let token = slot.get_or_insert_with(CancellationToken::new);
        if self.halt_requested.load(Ordering::SeqCst) {
            token.cancel();
        }
        token.clone()
    }

    /// Clears a past halt request (on resume).
    pub(crate) fn clear_halt(&self) {
        let mut slot = self.halt_token.lock();
        *slot = None;
        self.halt_requested.store(false, Ordering::SeqCst);
    }
}
