//! Test-only pause points (cargo feature `test-hooks`, enabled for the workspace's own tests and
//! never in a build users get): a test installs a hook that runs at a point where a race can
//! happen, and makes the other side of the race happen there, every time.
//!
//! Hooks are process-wide; tests running in parallel share them, so a hook should act only for the
//! agents of its own test (it is given the agent's key).

use parking_lot::RwLock;
use std::sync::Arc;
use warden_protocols::AgentKey;

/// A pause point's hook: called with the key of the agent concerned.
pub type Hook = Arc<dyn Fn(&AgentKey) + Send + Sync>;

static HALT_GAP: RwLock<Option<Hook>> = RwLock::new(None);
static DELEGATION_GAP: RwLock<Option<Hook>> = RwLock::new(None);

/// Installs (or with `None` removes) the hook run between raising a halt on an agent (its flag up,
/// its turn cancelled) and queueing the halt message: the gap in which the agent's own thread can
/// end the cancelled turn, and its delegations with it, before the halt message is read.
pub fn set_halt_gap(hook: Option<Hook>) {
    *HALT_GAP.write() = hook;
}

pub(crate) fn halt_gap(agent: &AgentKey) {
    let hook = HALT_GAP.read().clone();
    if let Some(hook) = hook {
        hook(agent);
    }
}

/// Installs (or with `None` removes) the hook run, on the delegator's thread, after a delegation
/// passed its checks and before it is listed on the delegator: a halt raised there does not see it
/// (called with the delegator's key).
pub fn set_delegation_gap(hook: Option<Hook>) {
    *DELEGATION_GAP.write() = hook;
}

pub(crate) fn delegation_gap(agent: &AgentKey) {
    let hook = DELEGATION_GAP.read().clone();
    if let Some(hook) = hook {
        hook(agent);
    }
}

/// Decides, for an agent, whether the `Remember` signal (write the observations admitted at
/// delivery) is withheld: `true` keeps it from being queued, so only a turn's start or a memory
/// reader writes them (the ordering a turn relies on, tested without the signal's help).
pub type Withhold = Arc<dyn Fn(&AgentKey) -> bool + Send + Sync>;

static REMEMBER_WITHHELD: RwLock<Option<Withhold>> = RwLock::new(None);

/// Installs (or with `None` removes) the decision whether an agent's `Remember` signal is
/// withheld.
pub fn set_remember_withheld(hook: Option<Withhold>) {
    *REMEMBER_WITHHELD.write() = hook;
}

pub(crate) fn remember_withheld(agent: &AgentKey) -> bool {
    let hook = REMEMBER_WITHHELD.read().clone();
    hook.is_some_and(|hook| hook(agent))
}
