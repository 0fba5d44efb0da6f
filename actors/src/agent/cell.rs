//! [`AgentCell`]: everything an agent is, shared by its handle, its actor (across restarts) and the
//! supervisor. The actor is a thin driver; the cell holds the state.
//!
//! # Invariants
//! * The [`AgentRecord`] changes only through [`AgentCell::emit`], which applies the event and journals
//!   it under the record lock — the journal order is the order of changes, and a replay rebuilds it.
//! * The state changes only through [`AgentCell::transition`], checked against
//!   [`warden_protocols::TRANSITIONS`]; an illegal request is journaled as `TransitionRefused` and logged.
//! * A halt is visible before the actor reads it: [`AgentCell::request_halt`] sets `halt_requested` and
//!   cancels `halt_token` synchronously, so a running turn stops at its next await point and
//!   [`AgentCell::begin_tool`] refuses to start a tool.
//!
//! # Lock order
//! `record` → journal's internal lock. `delegations` is a leaf. No lock is held across an await.

use crate::{
    agent::{AgentMsg, Signal},
    journal::Journal,
    mailbox::PriorityMailbox,
    provider::Provider,
    tools::ToolRegistry,
};
use parking_lot::{Mutex, MutexGuard};
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering},
        Arc, Weak,
    },
    time::Duration,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use warden_protocols::{
    AgentKey, AgentRecord, AgentState, AgentStatus, Breaker, ChatMessage, EventKind,
    IllegalTransition,
};

/// Per-agent settings taken from the config at spawn.
#[derive(Debug, Clone)]
pub(crate) struct AgentSettings {
    pub max_iterations_per_tick: u32,
    pub multi_action: bool,
    pub tool_timeout: Duration,
    pub sub_agent_budget: u32,
}

/// Whether a failure tripped the consecutive-error breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    Below,
    Tripped,
}

pub(crate) struct AgentCell {
    pub key: AgentKey,
    pub mailbox: PriorityMailbox<AgentMsg>,
    pub provider: Arc<dyn Provider>,
    pub tools: ToolRegistry,
    pub system_prompt: Option<String>,
    pub settings: AgentSettings,
    record: Mutex<AgentRecord>,
    state_mirror: AtomicU8,
    halt_requested: AtomicBool,
    halt_token: Mutex<CancellationToken>,
    journal: Arc<dyn Journal>,
    /// Delegations this agent runs now: id → the delegate's cell.
    delegations: Mutex<HashMap<u64, Arc<AgentCell>>>,
    /// Agents running a delegation to this one now: id → the delegator (notified when this one trips).
    delegators: Mutex<HashMap<u64, Weak<AgentCell>>>,
    active_delegations: AtomicU32,
    /// Tool calls running now (several when a response's calls run in parallel). Changed under the
    /// record lock.
    tools_in_flight: AtomicU32,
    crash_tx: Option<UnboundedSender<(AgentKey, u64)>>,
    /// Incremented for each actor started on this cell; crash reports carry it, so a report from an
    /// actor that was already replaced is recognised as stale.
    generation: AtomicU64,
}

fn state_index(s: AgentState) -> u8 {
    AgentState::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8
}

impl AgentCell {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        record: AgentRecord,
        mailbox: PriorityMailbox<AgentMsg>,
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        system_prompt: Option<String>,
        settings: AgentSettings,
        journal: Arc<dyn Journal>,
        crash_tx: Option<UnboundedSender<(AgentKey, u64)>>,
    ) -> Self {
        let halted = record.state == AgentState::Stopped;
        AgentCell {
            key: record.key.clone(),
            state_mirror: AtomicU8::new(state_index(record.state)),
            record: Mutex::new(record),
            mailbox,
            provider,
            tools,
            system_prompt,
            settings,
            halt_requested: AtomicBool::new(halted),
            halt_token: Mutex::new(CancellationToken::new()),
            journal,
            delegations: Mutex::new(HashMap::new()),
            delegators: Mutex::new(HashMap::new()),
            active_delegations: AtomicU32::new(0),
            tools_in_flight: AtomicU32::new(0),
            crash_tx,
            generation: AtomicU64::new(0),
        }
    }

    /// Locks the record for a sequence of changes.
    pub fn lock(&self) -> MutexGuard<'_, AgentRecord> {
        self.record.lock()
    }

    /// Applies `kind` to the record and journals it.
    pub fn emit(&self, rec: &mut AgentRecord, kind: EventKind) {
        rec.apply(&kind);
        if let EventKind::StateChanged { to, .. } = &kind {
            self.state_mirror.store(state_index(*to), Ordering::Release);
        }
        self.journal.append(&self.key, kind);
    }

    /// Journals an event that changes nothing in the record.
    pub fn note(&self, kind: EventKind) {
        let mut rec = self.lock();
        self.emit(&mut rec, kind);
    }

    /// Moves to `to` if the table allows it; otherwise journals the refusal and returns the error.
    pub fn transition(
        &self,
        rec: &mut AgentRecord,
        to: AgentState,
        cause: &str,
    ) -> Result<(), IllegalTransition> {
        let from = rec.state;
        match from.check_transition(to) {
            Ok(()) => {
                self.emit(
                    rec,
                    EventKind::StateChanged {
                        from,
                        to,
                        cause: cause.to_owned(),
                    },
                );
                Ok(())
            }
            Err(err) => {
                tracing::warn!(agent = %self.key, %from, %to, cause, "illegal transition refused");
                self.emit(
                    rec,
                    EventKind::TransitionRefused {
                        from,
                        to,
                        cause: cause.to_owned(),
                    },
                );
                Err(err)
            }
        }
    }

    /// The current state, without taking the record lock.
    pub fn state(&self) -> AgentState {
        AgentState::ALL[self.state_mirror.load(Ordering::Acquire) as usize]
    }

    // ---- halt -------------------------------------------------------------------------------------

    /// Makes a halt visible at once to the running turn (before the actor reads the halt message).
    pub fn request_halt(&self) {
        self.halt_requested.store(true, Ordering::SeqCst);
        self.halt_token.lock().cancel();
    }

    pub fn halt_requested(&self) -> bool {
        self.halt_requested.load(Ordering::SeqCst)
    }

    /// Cancelled when a halt is requested.
    pub fn halt_token(&self) -> CancellationToken {
        self.halt_token.lock().clone()
    }

    /// Clears a past halt request (on resume).
    pub fn clear_halt(&self) {
        *self.halt_token.lock() = CancellationToken::new();
        self.halt_requested.store(false, Ordering::SeqCst);
    }

    // ---- errors and breakers ----------------------------------------------------------------------

    /// A failed tool or LLM call (or a panic in one): `consecutive_errors += 1`; at the threshold the
    /// emergency stop trips, `EXECUTING → SAFETY_LOCKOUT`.
    pub fn record_failure(&self, error: &str) -> Counted {
        let mut rec = self.lock();
        let n = rec.consecutive_errors.saturating_add(1);
        self.emit(
            &mut rec,
            EventKind::ErrorCounted {
                consecutive_errors: n,
                error: error.to_owned(),
            },
        );
        if n >= rec.max_consecutive_errors && rec.state == AgentState::Executing {
            self.trip(
                &mut rec,
                Breaker::ConsecutiveErrors,
                format!("Maximum consecutive errors reached ({n})"),
            );
            return Counted::Tripped;
        }
        Counted::Below
    }

    /// Locks the agent out: journals the lockout, then `EXECUTING → SAFETY_LOCKOUT`.
    pub fn trip(&self, rec: &mut AgentRecord, breaker: Breaker, reason: String) {
        tracing::warn!(agent = %self.key, ?breaker, %reason, "breaker tripped");
        let consecutive_errors = rec.consecutive_errors;
        self.emit(
            rec,
            EventKind::LockedOut {
                breaker,
                reason: reason.clone(),
                consecutive_errors,
            },
        );
        let _ = self.transition(rec, AgentState::SafetyLockout, &reason);
        for delegator in self.delegators.lock().values().filter_map(Weak::upgrade) {
            let _ = delegator
                .mailbox
                .try_send(AgentMsg::Signal(Signal::DelegateLockedOut {
                    delegate: self.key.clone(),
                    reason: reason.clone(),
                }));
        }
    }

    /// A successful action resets the consecutive-error count.
    pub fn record_success(&self) {
        let mut rec = self.lock();
        if rec.consecutive_errors > 0 {
            self.emit(&mut rec, EventKind::ErrorsReset);
        }
    }

    // ---- history ----------------------------------------------------------------------------------

    pub fn append_history(&self, message: ChatMessage) {
        let mut rec = self.lock();
        self.emit(&mut rec, EventKind::HistoryAppended { message });
    }

    /// System prompt + history, as sent to the model.
    pub fn conversation(&self) -> Vec<ChatMessage> {
        let rec = self.lock();
        let mut messages = Vec::with_capacity(rec.history.len() + 1);
        if let Some(prompt) = &self.system_prompt {
            messages.push(ChatMessage::system(prompt.clone()));
        }
        messages.extend(rec.history.iter().cloned());
        messages
    }

    // ---- delegations ------------------------------------------------------------------------------

    /// Takes a delegation slot if fewer than `budget` are in use; returns the count before on refusal.
    pub fn try_acquire_slot(&self, budget: u32) -> Result<(), u32> {
        self.active_delegations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < budget).then_some(n + 1)
            })
            .map(|_| ())
    }

    pub fn release_slot(&self) {
        let _ = self
            .active_delegations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    pub fn active_delegations(&self) -> u32 {
        self.active_delegations.load(Ordering::Acquire)
    }

    pub fn add_delegation(&self, id: u64, delegate: Arc<AgentCell>) {
        self.delegations.lock().insert(id, delegate);
    }

    pub fn remove_delegation(&self, id: u64) {
        self.delegations.lock().remove(&id);
    }

    pub fn add_delegator(&self, id: u64, delegator: &Arc<AgentCell>) {
        self.delegators.lock().insert(id, Arc::downgrade(delegator));
    }

    pub fn remove_delegator(&self, id: u64) {
        self.delegators.lock().remove(&id);
    }

    /// The delegates of the delegations running now.
    pub fn running_delegates(&self) -> Vec<Arc<AgentCell>> {
        self.delegations.lock().values().cloned().collect()
    }

    // ---- tools in flight --------------------------------------------------------------------------

    pub fn tools_in_flight(&self) -> u32 {
        self.tools_in_flight.load(Ordering::Acquire)
    }

    /// No tool runs now: a turn starts, or its calls were dropped (halt, crash).
    pub fn reset_tools_in_flight(&self) {
        self.tools_in_flight.store(0, Ordering::Release);
    }

    pub fn tool_started(&self) {
        self.tools_in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// Returns how many are still running.
    pub fn tool_finished(&self) -> u32 {
        self.tools_in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map_or(0, |n| n - 1)
    }

    // ---- crash ------------------------------------------------------------------------------------

    /// The generation of the next actor to start on this cell.
    pub fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The generation of the actor started last.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn report_crash(&self, generation: u64) {
        if let Some(tx) = &self.crash_tx {
            let _ = tx.send((self.key.clone(), generation));
        }
    }

    // ---- status -----------------------------------------------------------------------------------

    pub fn status(&self) -> AgentStatus {
        let rec = self.lock();
        AgentStatus {
            key: rec.key.clone(),
            role: rec.role,
            state: rec.state,
            emergency_stop: rec.emergency_stop,
            lockout: rec.lockout.clone(),
            consecutive_errors: rec.consecutive_errors,
            max_consecutive_errors: rec.max_consecutive_errors,
            active_sub_agents: self.active_delegations(),
            sub_agent_budget: self.settings.sub_agent_budget,
            parent: rec.parent.clone(),
            queued: self.mailbox.depths(),
            ordinary_capacity: self.mailbox.capacity(),
            discarded_by_halt: rec.discarded_by_halt,
            paused: rec.paused,
            halts: rec.halts,
            turns: rec.turns,
            restarts: rec.restarts,
            history_len: rec.history.len(),
        }
    }

    /// A copy of the record.
    pub fn record(&self) -> AgentRecord {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{journal::MemoryJournal, provider::ScriptedProvider};

    fn cell(journal: Arc<MemoryJournal>) -> AgentCell {
        AgentCell::new(
            AgentRecord::new("a".into()),
            PriorityMailbox::new(8),
            Arc::new(ScriptedProvider::new([])),
            ToolRegistry::new(),
            None,
            AgentSettings {
                max_iterations_per_tick: 5,
                multi_action: true,
                tool_timeout: Duration::from_secs(30),
                sub_agent_budget: 3,
            },
            journal,
            None,
        )
    }

    #[test]
    fn an_illegal_transition_is_refused_journaled_and_not_applied() {
        let journal = Arc::new(MemoryJournal::new());
        let cell = cell(journal.clone());
        let mut rec = cell.lock();
        let err = cell
            .transition(&mut rec, AgentState::SafetyLockout, "test")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "illegal transition WAITING_FOR_EVENT -> SAFETY_LOCKOUT"
        );
        assert_eq!(rec.state, AgentState::WaitingForEvent);
        drop(rec);
        assert_eq!(cell.state(), AgentState::WaitingForEvent);
        let events = journal.events();
        assert!(matches!(
            events.last().map(|e| &e.kind),
            Some(EventKind::TransitionRefused {
                from: AgentState::WaitingForEvent,
                to: AgentState::SafetyLockout,
                ..
            })
        ));
    }

    #[test]
    fn a_failure_outside_a_turn_counts_but_cannot_trip_into_lockout() {
        let journal = Arc::new(MemoryJournal::new());
        let cell = cell(journal);
        for _ in 0..10 {
            assert_eq!(cell.record_failure("x"), Counted::Below);
        }
        assert_eq!(cell.state(), AgentState::WaitingForEvent);
    }

    #[test]
    fn slots_are_counted_exactly_against_the_budget() {
        let cell = cell(Arc::new(MemoryJournal::new()));
        assert!(cell.try_acquire_slot(2).is_ok());
        assert!(cell.try_acquire_slot(2).is_ok());
        assert_eq!(cell.try_acquire_slot(2), Err(2));
        cell.release_slot();
        assert_eq!(cell.active_delegations(), 1);
        cell.release_slot();
        cell.release_slot();
        assert_eq!(cell.active_delegations(), 0, "release never underflows");
    }
}
