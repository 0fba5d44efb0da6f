//! The halt gate: an agent's halt flag, the cancellation token of its running turn, and the list of
//! its running delegations — the three things a halt and a starting turn or delegation race on.
//!
//! Invariants (each holds in every interleaving; `gate::loom` below checks them with loom):
//! * **A turn cannot miss a halt.** [`HaltGate::request`] raises the flag *before* it takes the
//!   gate's lock; [`HaltGate::token`] reads the flag *under* that lock. So either the turn's token is
//!   cancelled by the halt, or it is created already cancelled.
//! * **A halt reaches every running delegation.** [`HaltGate::request`] raises the flag, *then* lists
//!   the running delegations; [`HaltGate::enter`] lists a delegation, *then* reads the flag (the
//!   gate's lock orders the two). So either the halt's list has the delegation, or the delegation
//!   sees the flag and is refused before its task is sent.
//! * **One halt, one list.** Of concurrent requests only the first gets the list (the others get
//!   `None`: the first's caller halts those delegates).
//! * **Epochs.** Each halt (a request that raises the flag) moves the epoch on, and a resume does
//!   not move it back: a turn notes the epoch it started under, and a model or tool result that
//!   comes back under a later one is stale — dropped before any side effect, even when a resume
//!   cleared the flag meanwhile.
//!
//! The token and the list share one lock (a leaf: never held across a call out); one lock, not
//! two, because every idle agent carries the gate (8 bytes less a cell).
//! The primitives come from `crate::sync` (loom's under `--cfg warden_loom`).

use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};
use tokio_util::sync::CancellationToken;

/// See the module docs. `D` is what a running delegation is remembered by (the delegate's cell).
#[derive(Debug)]
pub(crate) struct HaltGate<D> {
    requested: AtomicBool,
    /// Halts so far (each request that raised the flag).
    epoch: AtomicU64,
    /// The running turn's token and the running delegations.
    inner: Mutex<Inner<D>>,
}

#[derive(Debug)]
struct Inner<D> {
    /// The running turn's token; created on first use, so an agent that never runs a turn never
    /// allocates one.
    token: Option<CancellationToken>,
    /// Running delegations by id.
    /// A short list (an agent runs a handful of delegations at most: `delegation.sub_agent_budget`);
    /// a hash map would cost an idle agent 24 bytes more.
    running: Vec<(u64, D)>,
}

impl<D: Clone> HaltGate<D> {
    /// A gate; `halted`: a halt is already requested (an agent restored as halted).
    pub(crate) fn new(halted: bool) -> Self {
        HaltGate {
            requested: AtomicBool::new(halted),
            epoch: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                token: None,
                running: Vec::new(),
            }),
        }
    }

    /// Requests a halt: raises the flag, lists the running delegations, cancels the turn — in that
    /// order (listing after the cancel could find none: a cancelled turn ends its delegations).
    /// Returns the delegations to halt too, or `None` if a halt was already requested.
    pub(crate) fn request(&self) -> Option<Vec<D>> {
        let already = self.requested.swap(true, Ordering::SeqCst);
        if !already {
            self.epoch.fetch_add(1, Ordering::SeqCst);
        }
        let inner = self.inner.lock();
        let delegates = (!already).then(|| inner.running.iter().map(|(_, d)| d.clone()).collect());
        if let Some(token) = inner.token.as_ref() {
            token.cancel();
        }
        delegates
    }

    /// The halt epoch: how many halts were requested (see the module docs).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether a halt is requested (and not cleared).
    pub(crate) fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// The running turn's token: cancelled when a halt is requested, already cancelled if one is.
    pub(crate) fn token(&self) -> CancellationToken {
        let mut inner = self.inner.lock();
        let token = inner.token.get_or_insert_with(CancellationToken::new);
        if self.requested.load(Ordering::SeqCst) {
            token.cancel();
        }
        token.clone()
    }

    /// Clears a past halt request (on resume); the next turn gets a fresh token.
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.token = None;
        self.requested.store(false, Ordering::SeqCst);
    }

    /// Lists delegation `id` as running, then checks the flag: `false` means a halt is requested
    /// and may not have seen it — the caller must refuse the delegation (and [`HaltGate::leave`]).
    pub(crate) fn enter(&self, id: u64, delegate: D) -> bool {
        let mut inner = self.inner.lock();
        match inner.running.iter_mut().find(|(i, _)| *i == id) {
            Some(entry) => entry.1 = delegate,
            None => inner.running.push((id, delegate)),
        }
        drop(inner);
        !self.requested()
    }

    /// Removes delegation `id` from the running list.
    pub(crate) fn leave(&self, id: u64) {
        let mut inner = self.inner.lock();
        if let Some(i) = inner.running.iter().position(|(i, _)| *i == id) {
            inner.running.swap_remove(i);
        }
    }

    /// The running delegations.
    pub(crate) fn running(&self) -> Vec<D> {
        self.inner
            .lock()
            .running
            .iter()
            .map(|(_, d)| d.clone())
            .collect()
    }
}

/// Loom models of the gate's invariants:
///
/// ```sh
/// RUSTFLAGS="--cfg warden_loom" cargo test -p warden-actors --lib --release gate::loom
/// ```
#[cfg(all(test, warden_loom))]
mod loom {
    use super::HaltGate;
    use loom::{sync::Arc, thread};

    /// A halt racing a turn that starts: the turn's token ends up cancelled, whichever goes first.
    #[test]
    fn a_turn_starting_during_a_halt_gets_a_cancelled_token() {
        loom::model(|| {
            let gate = Arc::new(HaltGate::<u32>::new(false));
            let halt = {
                let gate = gate.clone();
                thread::spawn(move || {
                    gate.request();
                })
            };
            let token = gate.token();
            halt.join().expect("halt thread");
            assert!(token.is_cancelled(), "the turn's token missed the halt");
        });
    }

    /// A halt racing a delegation that starts: the delegation is either on the halt's list or
    /// refused — never running unseen.
    #[test]
    fn a_delegation_starting_during_a_halt_is_listed_or_refused() {
        loom::model(|| {
            let gate = Arc::new(HaltGate::<u32>::new(false));
            let delegation = {
                let gate = gate.clone();
                thread::spawn(move || {
                    let admitted = gate.enter(7, 7);
                    if !admitted {
                        gate.leave(7);
                    }
                    admitted
                })
            };
            let listed = gate.request().expect("the first request gets the list");
            let admitted = delegation.join().expect("delegation thread");
            assert!(
                !admitted || listed.contains(&7),
                "a delegation ran that the halt did not see"
            );
        });
    }

    /// A halt moves the epoch on; a second request while it is pending does not; a resume does
    /// not move it back. (Plain test: no interleaving to explore.)
    #[test]
    fn each_halt_moves_the_epoch_on_and_a_resume_keeps_it() {
        loom::model(|| {
            let gate = HaltGate::<u32>::new(false);
            assert_eq!(gate.epoch(), 0);
            gate.request();
            gate.request();
            assert_eq!(gate.epoch(), 1);
            gate.clear();
            assert_eq!(gate.epoch(), 1);
            gate.request();
            assert_eq!(gate.epoch(), 2);
        });
    }

    /// Two halts at once: exactly one gets the list.
    #[test]
    fn of_two_concurrent_halts_exactly_one_lists_the_delegations() {
        loom::model(|| {
            let gate = Arc::new(HaltGate::<u32>::new(false));
            assert!(gate.enter(1, 1));
            let other = {
                let gate = gate.clone();
                thread::spawn(move || gate.request())
            };
            let mine = gate.request();
            let theirs = other.join().expect("halt thread");
            assert_eq!(
                usize::from(mine.is_some()) + usize::from(theirs.is_some()),
                1
            );
            assert_eq!(mine.or(theirs), Some(vec![1]));
        });
    }
}
