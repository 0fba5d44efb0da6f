//! Tests of the cell: transitions, lockout batches, slots.

use super::*;
use crate::{journal::MemoryJournal, provider::ScriptedProvider};

fn cell(journal: Arc<MemoryJournal>) -> AgentCell {
    cell_on(journal)
}

fn cell_on(journal: Arc<dyn Journal>) -> AgentCell {
    let config = warden_protocols::WardenConfig::default();
    let team = Arc::new(crate::safety::TeamBudget::new(&config.safety.budget));
    AgentCell::new(CellParts {
        record: AgentRecord::new("a".into()),
        mailbox: PriorityMailbox::new(8),
        provider: Arc::new(ScriptedProvider::new([])),
        tools: ToolRegistry::new(),
        runner: ToolRunner::default(),
        system_prompt: None,
        settings: AgentSettings {
            max_iterations_per_tick: 5,
            multi_action: true,
            tool_timeout: Duration::from_secs(30),
            sub_agent_budget: 3,
            max_context_tokens: 0,
            context_strategy: ContextStrategy::SlidingWindow,
            max_tokens_recoveries: 2,
            npc: Arc::default(),
        },
        journal,
        crash_tx: None,
        replies: Arc::default(),
        safety: Arc::new(TeamSafety {
            config: Arc::new(config.safety.clone()),
            checkpoint: Arc::new(crate::safety::LimitCheckpoint::new(
                config.safety.on_limit.clone(),
                None,
            )),
            team,
            monitor: None,
            checks: true,
            conversations: Default::default(),
        }),
    })
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

/// Records each `append`/`append_all` call as one batch.
#[derive(Default)]
struct Batches(Mutex<Vec<Vec<EventKind>>>);

impl Journal for Batches {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        self.append_all(agent, vec![kind])
    }
    fn append_all(&self, _: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        let mut batches = self.0.lock();
        batches.push(kinds);
        batches.len() as u64
    }
    fn durable(
        &self,
        _: u64,
    ) -> futures::future::BoxFuture<'static, Result<(), crate::journal::NotDurable>> {
        crate::journal::already_durable()
    }
    fn degraded(&self) -> Option<String> {
        None
    }
}

#[test]
fn a_lockout_and_its_state_change_are_one_batch_and_only_from_executing() {
    let journal = Arc::new(Batches::default());
    let cell = cell_on(journal.clone());
    let mut rec = cell.lock();
    // Not in a turn: refused, and nothing is locked out.
    cell.trip(&mut rec, Breaker::Stuck, "stuck".into());
    assert!(!rec.emergency_stop());
    cell.transition(&mut rec, AgentState::Executing, "turn")
        .unwrap();
    journal.0.lock().clear();
    cell.trip(&mut rec, Breaker::Stuck, "stuck".into());
    assert!(rec.emergency_stop() && rec.lockout_consistent());
    let batches = journal.0.lock();
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert!(matches!(
        batches[0].as_slice(),
        [
            EventKind::LockedOut { .. },
            EventKind::StateChanged {
                from: AgentState::Executing,
                to: AgentState::SafetyLockout,
                ..
            }
        ]
    ));
}

#[test]
fn a_failure_outside_a_turn_counts_but_cannot_trip_into_lockout() {
    let journal = Arc::new(MemoryJournal::new());
    let cell = cell(journal);
    for _ in 0..10 {
        assert_eq!(cell.fail("x", Verdict::Continue), Counted::Below);
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
