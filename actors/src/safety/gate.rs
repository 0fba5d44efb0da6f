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
//! * The open path is one atomic read of a `watch` value: no lock, no await — plus, when an outside
//!   layer installed a per-agent [`AgentFence`] (the cluster: an agent whose lease was not renewed
//!   in time), one call to it. A fenced agent's call waits as for a closed gate, polling the fence
//!   every [`FENCE_POLL`]; a result that comes back while its agent is fenced is held the same way.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warden_protocols::AgentKey;

/// How often a fenced agent's waiting call asks its fence again.
pub const FENCE_POLL: Duration = Duration::from_millis(100);

/// A per-agent condition for model calls, installed once by an outside layer
/// ([`ModelGate::set_fence`]): the cluster fences an agent whose lease this node has not renewed
/// recently enough to be sure it still holds it.
pub trait AgentFence: Send + Sync + 'static {
    /// Why `agent` may not start a model call now (`None`: it may). Called before every model
    /// call and when its result comes back: cheap, no await.
    fn fenced(&self, agent: &AgentKey) -> Option<String>;
}

/// A team-wide gate before model calls: `None` open, `Some(reason)` closed. Cheap to clone (all
/// clones are the same gate). See the module docs.
#[derive(Clone, Debug)]
pub struct ModelGate {
    state: Arc<watch::Sender<Option<Arc<str>>>>,
    fence: Arc<OnceLock<Arc<dyn AgentFence>>>,
}

impl std::fmt::Debug for dyn AgentFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentFence")
    }
}

impl Default for ModelGate {
    fn default() -> Self {
        ModelGate {
            state: Arc::new(watch::Sender::new(None)),
            fence: Arc::default(),
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

    /// Installs the per-agent fence (once; `false` when one is installed already).
    pub fn set_fence(&self, fence: Arc<dyn AgentFence>) -> bool {
        self.fence.set(fence).is_ok()
    }

    /// Why `agent` may not start a model call now: the gate closed, or its fence.
    pub fn closed_for(&self, agent: &AgentKey) -> Option<String> {
        if let Some(reason) = self.closed() {
            return Some(reason.to_string());
        }
        self.fence.get().and_then(|f| f.fenced(agent))
    }

    /// Waits until the gate is open and `agent` is not fenced (at once when both hold). `false`:
    /// `token` was cancelled first (a halt).
    pub(crate) async fn wait_open_for(&self, agent: &AgentKey, token: &CancellationToken) -> bool {
        loop {
            if !self.wait_open(token).await {
                return false;
            }
            let Some(fence) = self.fence.get() else {
                return true;
            };
            if fence.fenced(agent).is_none() {
                return true;
            }
            tokio::select! {
                biased;
                _ = token.cancelled() => return false,
                _ = tokio::time::sleep(FENCE_POLL) => {}
            }
        }
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

    /// Fences the agents listed in it.
    struct Listed(parking_lot::Mutex<Vec<AgentKey>>);

    impl AgentFence for Listed {
        fn fenced(&self, agent: &AgentKey) -> Option<String> {
            self.0
                .lock()
                .contains(agent)
                .then(|| format!("{agent}: lease not renewed"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_agent_waits_until_its_fence_lifts_and_others_do_not() {
        let gate = ModelGate::default();
        let fence = Arc::new(Listed(parking_lot::Mutex::new(vec!["x".into()])));
        assert!(gate.set_fence(fence.clone()));
        assert!(!gate.set_fence(fence.clone()), "once");
        let token = CancellationToken::new();
        assert!(gate.wait_open_for(&"y".into(), &token).await, "not fenced");
        assert_eq!(
            gate.closed_for(&"x".into()).as_deref(),
            Some("x: lease not renewed")
        );
        let waiting = tokio::spawn({
            let (gate, token) = (gate.clone(), token.clone());
            async move { gate.wait_open_for(&"x".into(), &token).await }
        });
        tokio::time::sleep(FENCE_POLL * 5).await;
        assert!(!waiting.is_finished(), "held while fenced");
        fence.0.lock().clear();
        tokio::time::sleep(FENCE_POLL * 2).await;
        assert!(waiting.is_finished());
        assert!(waiting.await.unwrap());
        // A halt ends a fenced wait at once.
        fence.0.lock().push("x".into());
        let halted = tokio::spawn({
            let (gate, token) = (gate.clone(), token.clone());
            async move { gate.wait_open_for(&"x".into(), &token).await }
        });
        tokio::task::yield_now().await;
        token.cancel();
        assert!(!halted.await.unwrap());
    }
}
