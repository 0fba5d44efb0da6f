//! Halts: the flag raised and the turn's token cancelled synchronously, before the actor reads the
//! halt; the acknowledgement.

use super::*;

impl AgentCell {
    /// Makes a halt visible at once to the running turn (before the actor reads the halt message).
    /// Returns the delegates of the delegations running when the halt was raised, which the caller
    /// must halt too; empty if a halt was already requested (its caller has them).
    ///
    /// The flag goes up, the running delegations are listed, then the turn is cancelled — the order
    /// that makes a halt reach every running delegate in every interleaving ([`HaltGate::request`];
    /// `Supervisor::delegate` lists a delegation before it checks the flag, [`HaltGate::enter`]).
    pub(crate) fn request_halt(&self) -> Vec<Arc<AgentCell>> {
        self.halt.request().unwrap_or_default()
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

    /// The halt epoch ([`HaltGate::epoch`]): a result from a turn that started under an earlier one
    /// is stale.
    pub(crate) fn halt_epoch(&self) -> u64 {
        self.halt.epoch()
    }

    pub(crate) fn halt_requested(&self) -> bool {
        self.halt.requested()
    }

    /// The running turn's token: cancelled when a halt is requested, already cancelled if one is
    /// pending (see [`HaltGate::token`] for why the two cannot miss each other).
    pub(crate) fn halt_token(&self) -> CancellationToken {
        self.halt.token()
    }

    /// Clears a past halt request (on resume).
    pub(crate) fn clear_halt(&self) {
        self.halt.clear();
    }
}
