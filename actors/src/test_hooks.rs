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
static PASSIVE_HALT_GAP: RwLock<Option<Hook>> = RwLock::new(None);
static IDLE_HALT_GAP: RwLock<Option<Hook>> = RwLock::new(None);
static PASSIVE_CONTROL_GAP: RwLock<Option<Hook>> = RwLock::new(None);
static PASSIVATED: RwLock<Option<Hook>> = RwLock::new(None);
static PUMP_PARKED: RwLock<Option<Hook>> = RwLock::new(None);
static SPAWN_GAP: RwLock<Option<Hook>> = RwLock::new(None);

/// Runs the hook installed in `slot`, if any (outside the slot's lock: a hook may install hooks).
fn run(slot: &RwLock<Option<Hook>>, agent: &AgentKey) {
    let hook = slot.read().clone();
    if let Some(hook) = hook {
        hook(agent);
    }
}

/// Installs (or with `None` removes) the hook run when a spawn has built its agent's cell and
/// before it claims the key in the registry: another spawn of the same key made there wins the key
/// (called on the spawning thread, holding no lock, with the key).
pub fn set_spawn_gap(hook: Option<Hook>) {
    *SPAWN_GAP.write() = hook;
}

pub(crate) fn spawn_gap(agent: &AgentKey) {
    run(&SPAWN_GAP, agent);
}

/// Installs (or with `None` removes) the hook run between raising a halt on an agent (its flag up,
/// its turn cancelled) and queueing the halt message: the gap in which the agent's own thread can
/// end the cancelled turn, and its delegations with it, before the halt message is read.
pub fn set_halt_gap(hook: Option<Hook>) {
    *HALT_GAP.write() = hook;
}

pub(crate) fn halt_gap(agent: &AgentKey) {
    run(&HALT_GAP, agent);
}

/// Whether a halt-gap hook is installed (a fleet halt releases the record locks it holds first).
pub(crate) fn halt_gap_set() -> bool {
    HALT_GAP.read().is_some()
}

/// Installs (or with `None` removes) the hook run, on the delegator's thread, after a delegation
/// passed its checks and before it is listed on the delegator: a halt raised there does not see it
/// (called with the delegator's key).
pub fn set_delegation_gap(hook: Option<Hook>) {
    *DELEGATION_GAP.write() = hook;
}

pub(crate) fn delegation_gap(agent: &AgentKey) {
    run(&DELEGATION_GAP, agent);
}

/// Installs (or with `None` removes) the hook run when a halt has found its agent passive and
/// before it applies the halt to the cell itself: a message sent there starts the agent's actor
/// while the halt is being applied (called on the halting thread, with the agent's key).
pub fn set_passive_halt_gap(hook: Option<Hook>) {
    *PASSIVE_HALT_GAP.write() = hook;
}

pub(crate) fn passive_halt_gap(agent: &AgentKey) {
    run(&PASSIVE_HALT_GAP, agent);
}

/// Installs (or with `None` removes) the hook run when a halt has borrowed its agent's idle actor
/// and before it applies the halt to the cell itself: a message sent there wakes an actor that
/// must read nothing until the halt is applied (called on the halting thread, with the agent's
/// key).
pub fn set_idle_halt_gap(hook: Option<Hook>) {
    *IDLE_HALT_GAP.write() = hook;
}

pub(crate) fn idle_halt_gap(agent: &AgentKey) {
    run(&IDLE_HALT_GAP, agent);
}

/// Installs (or with `None` removes) the hook run when a control (resume, unlock, pause, reset)
/// has found its agent passive and before it applies the control to the cell itself: a message
/// sent there starts the agent's actor while the control is being applied (called on the
/// controlling thread, with the agent's key).
pub fn set_passive_control_gap(hook: Option<Hook>) {
    *PASSIVE_CONTROL_GAP.write() = hook;
}

pub(crate) fn passive_control_gap(agent: &AgentKey) {
    run(&PASSIVE_CONTROL_GAP, agent);
}

/// Installs (or with `None` removes) the hook run on an agent's arbiter when its actor found
/// nothing it may read now and waits for the next wake (a paused agent's queued work included,
/// and a wake that came while a halt had borrowed the idle actor).
pub fn set_pump_parked(hook: Option<Hook>) {
    *PUMP_PARKED.write() = hook;
}

pub(crate) fn pump_parked(agent: &AgentKey) {
    run(&PUMP_PARKED, agent);
}

/// Whether a passive-halt-gap hook is installed (a fleet halt releases the record locks it holds
/// first).
pub(crate) fn passive_halt_gap_set() -> bool {
    PASSIVE_HALT_GAP.read().is_some()
}

/// Installs (or with `None` removes) the hook run on an agent's arbiter right after its idle actor
/// handed the mailbox back (the agent is passive from here on) and before the actor stops.
pub fn set_passivated(hook: Option<Hook>) {
    *PASSIVATED.write() = hook;
}

pub(crate) fn passivated(agent: &AgentKey) {
    run(&PASSIVATED, agent);
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
