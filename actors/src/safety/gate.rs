//! The model gate: a team-wide switch that an outside layer (the cluster's fail safe,
//! `warden::cluster`) closes so that no model call starts until it opens again.
//!
//! # Invariants
//! * Open by default; only [`ModelGate::close`] closes it. Nothing in the runtime closes it itself.
//! * Checked before every model call (a turn's request, its wrap-up, a memory summary): a call that
//!   already started is not cut (a halt does that), a call not yet started waits while it is closed.
//! * Checked again when a call's result comes back: a result is held while the gate is closed, and
//!   dropped if the agent is halted before it opens (the cluster reads the halt key before it
//!   opens the gate, so a halt the node missed while cut off makes the result stale).
//! * The wait ends at once when the agent is halted (its token cancelled), like the budget wait.
//! * The open path is one atomic read of a `watch` value: no lock, no await.

use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A team-wide gate before model calls: `None` open, `Some(reason)` closed. Cheap to clone (all
/// clones are the same gate). See the module docs.
#[derive(Clone, Debug)]
pub struct ModelGate {
    state: Arc<watch::Sender<Option<Arc<str>>>>,
}

impl Default for ModelGate {
    fn default() -> Self {
        ModelGate {
            state: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl ModelGate {
    /// Closes the gate: no model call starts until [`ModelGate::open`]. `reason` is what
    /// [`ModelGate::closed`] tells meanwhile.
    pub fn close(&self, reason: impl Into<Arc<str>>) {
        let reason = reason.into();
        self.state.send_replace(Some(reason));
    }

    /// Opens the gate: waiting model calls start.
    pub fn open(&self) {
        self.state.send_if_modified(|s| s.take().is_some());
    }

    /// Why the gate is closed, while it is.
    pub fn closed(&self) -> Option<Arc<str>> {
        self.state.borrow().clone()
    }

    /// Waits until the gate is open (at once when it is). `false`: `token` was cancelled first (a
    /// halt).
    pub(crate) async fn wait_open(&self, token: &CancellationToken) -> bool {
        if self.state.borrow().is_none() {
            return true;
        }
        let mut rx = self.state.subscribe();
        tokio::select! {
            biased;
            _ = token.cancelled() => false,
            open = rx.wait_for(Option::is_none) => open.is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_gate_holds_until_opened_and_a_halt_ends_the_wait() {
        let gate = ModelGate::default();
        let token = CancellationToken::new();
        assert!(gate.wait_open(&token).await);
        gate.close("partitioned");
        assert_eq!(gate.closed().as_deref(), Some("partitioned"));
        let waiting = tokio::spawn({
            let (gate, token) = (gate.clone(), token.clone());
            async move { gate.wait_open(&token).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        gate.open();
        assert!(waiting.await.unwrap());
        gate.close("again");
        token.cancel();
        assert!(!gate.wait_open(&token).await);
    }
}
