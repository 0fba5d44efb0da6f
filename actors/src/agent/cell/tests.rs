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
        arbiter: None,
        key: "a".into(),
        record: None,
        mailbox: PriorityMailbox::new(8),
        profile: Arc::new(Profile::new(
            Arc::new(ScriptedProvider::new([])),
            ToolRegistry::new(),
            None,
            Arc::new(AgentSettings {
                max_iterations_per_tick: 5,
                multi_action: true,
                tool_timeout: Duration::from_secs(30),
                sub_agent_budget: 3,
                max_context_tokens: 0,
                memory: Default::default(),
                context_strategy: ContextStrategy::SlidingWindow,
                max_tokens_recoveries: 2,
                npc: Arc::default(),
                circuit: Default::default(),
                tool_retry: Default::default(),
                permissions: Arc::default(),
                passivate_after: Duration::ZERO,
            }),
            Arc::new(TeamSafety {
                config: Arc::new(config.safety.clone()),
                checkpoint: Arc::new(crate::safety::LimitCheckpoint::new(
                    config.safety.on_limit.clone(),
                    None,
                )),
                permissions: Arc::new(crate::safety::PermissionGate::new(None, Arc::default())),
                team,
                monitor: None,
                checks: true,
                conversations: Default::default(),
                memory: Default::default(),
                model_gate: Default::default(),
            }),
            journal,
            None,
            Arc::default(),
        )),
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
    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, _: u64) -> u64 {
        let mut batches = self.0.lock();
        batches.push(rows.into_iter().map(|(_, kind)| kind).collect());
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

#[actix_rt::test]
async fn the_tick_arbiter_never_queues_a_second_tick_until_the_first_leaves_the_lane() {
    use crate::npc::tick::{fire, TickArbiter};
    let cell = Arc::new(cell(Arc::new(MemoryJournal::new())));
    let arbiter = TickArbiter::start(&Default::default());
    let mut npc = warden_protocols::npc::NpcConfig::default();
    npc.tick.enabled = true;
    let ticking = arbiter.register(&cell, Arc::new(npc));
    cell.set_ticking(Some(ticking.clone()));
    // Two due ticks before the actor takes the first: the second is skipped and counted.
    fire(&cell, &ticking);
    fire(&cell, &ticking);
    assert_eq!(cell.mailbox.depths().ordinary, 1);
    let status = ticking.status();
    assert_eq!((status.ticks, status.skipped, status.queued), (1, 1, true));
    // A halt discards it: its listing clears the flag, and the next due tick is queued.
    let discarded = cell.mailbox.take_ordinary();
    crate::agent::actor::discard_backlog(&cell, discarded);
    assert!(!ticking.status().queued);
    fire(&cell, &ticking);
    assert_eq!(cell.mailbox.depths().ordinary, 1);
    assert_eq!(ticking.status().ticks, 2);
    // Taken by a turn: cleared too.
    let taken = cell.mailbox.pop();
    assert!(matches!(
        taken.map(|e| e.msg),
        Some(AgentMsg::Work(Work::Tick))
    ));
    cell.tick_left_lane();
    assert!(!ticking.status().queued);
}

/// An idle agent's memory is mostly its cell (one allocation): it stays within mimalloc's
/// 256-byte size class with the `Arc`'s two counts (`docs/performance.md`, "Passive agents": bytes
/// per idle agent, goal ≤ 512 all in). A field that pushes it over costs every agent of a fleet 64
/// bytes: box what is cold (see `Busy`, `RecordSlot`), share what agents of a spec have in common
/// (see `Profile`), or raise this knowingly.
#[cfg(target_pointer_width = "64")]
#[test]
fn an_idle_cell_fits_in_256_bytes() {
    let arc_counts = 2 * std::mem::size_of::<usize>();
    let size = std::mem::size_of::<AgentCell>() + arc_counts;
    assert!(size <= 256, "AgentCell + Arc counts = {size} bytes");
}

/// A fresh agent's record is not built by its spawn nor by a reader that only looks; the first
/// lock builds it as a replay of its journal would.
#[test]
fn a_fresh_slot_stands_for_a_new_record() {
    let RecordSlot::Fresh {
        role,
        parent,
        max_consecutive_errors,
        fleet_halted,
    } = RecordSlot::fresh()
    else {
        panic!("not fresh");
    };
    let key: AgentKey = "a".into();
    assert_eq!(
        RecordSlot::build(&key, role, parent, max_consecutive_errors, fleet_halted),
        AgentRecord::new(key)
    );
}

/// Journals `cell`'s spawn as a sub-agent of `boss` (its fresh slot keeps the values).
fn spawned_sub_agent(cell: &AgentCell) {
    cell.note(EventKind::Spawned {
        role: warden_protocols::AgentRole::SubAgent,
        parent: Some("boss".into()),
        max_consecutive_errors: 3,
    });
}

#[test]
fn a_fresh_record_is_built_at_the_first_lock_as_a_replay_builds_it() {
    let journal = Arc::new(MemoryJournal::new());
    let cell = cell(journal.clone());
    spawned_sub_agent(&cell);
    let fresh = |cell: &AgentCell| matches!(&*cell.record.lock(), RecordSlot::Fresh { .. });
    assert!(fresh(&cell), "the spawn built the record");
    let status = cell.status();
    let copy = cell.record();
    assert!(fresh(&cell), "a reader built the record");
    assert_eq!(
        (status.role, status.parent.as_ref().map(AgentKey::as_str)),
        (warden_protocols::AgentRole::SubAgent, Some("boss"))
    );
    let replayed = AgentRecord::replay(cell.key.clone(), &journal.events());
    assert_eq!(copy, replayed);
    let locked = cell.lock().clone();
    assert!(!fresh(&cell));
    assert_eq!(locked, replayed);
    assert_eq!(cell.status(), status);
}

/// A fleet halt (the supervisor's or a host's) of a fresh agent with nothing to clear keeps its
/// slot fresh — no record built, a halted idle fleet as small as an idle one — and what readers
/// see, what the first lock builds and a replay of the journal are one record. A second fleet halt
/// journals nothing; another halt (an operator's) builds the record as before.
#[test]
fn a_fleet_halt_keeps_a_fresh_record_fresh_as_a_replay_builds_it() {
    use crate::agent::halt_batch::HaltBatch;
    use warden_protocols::HaltCause;
    let fresh = |cell: &AgentCell| matches!(&*cell.record.lock(), RecordSlot::Fresh { .. });
    let halt = |cell: &AgentCell, cause: &HaltCause| {
        let mut acks = vec![None];
        let mut batch = HaltBatch::new(cause, 1);
        batch.halt(cell, 0, &mut acks);
        assert!(batch.finish(&mut acks).is_empty(), "durable at once");
        acks[0].take().expect("acknowledged")
    };
    let host = HaltCause::Host {
        reason: "admin halt".into(),
    };
    for cause in [HaltCause::HaltAll, host] {
        let journal = Arc::new(MemoryJournal::new());
        let cell = cell(journal.clone());
        spawned_sub_agent(&cell);
        let ack = halt(&cell, &cause);
        assert_eq!((ack.state, ack.discarded), (AgentState::Stopped, 0));
        assert!(fresh(&cell), "the fleet halt built the record ({cause:?})");
        assert_eq!(cell.state(), AgentState::Stopped);
        let status = cell.status();
        assert_eq!((status.state, status.halts), (AgentState::Stopped, 1));
        let replayed = AgentRecord::replay(cell.key.clone(), &journal.events());
        assert!(replayed.fleet_halted);
        assert_eq!(cell.record(), replayed);
        let journaled = journal.len();
        assert_eq!(halt(&cell, &cause).state, AgentState::Stopped);
        assert_eq!(journal.len(), journaled, "a second fleet halt journaled");
        assert!(fresh(&cell), "a reader or a second halt built the record");
        let locked = cell.lock().clone();
        assert_eq!(locked, replayed);
        assert_eq!(cell.status(), status);
    }
    let journal = Arc::new(MemoryJournal::new());
    let cell = cell(journal.clone());
    let ack = halt(
        &cell,
        &HaltCause::Operator {
            operator: "ops".into(),
        },
    );
    assert_eq!(ack.state, AgentState::Stopped);
    assert!(!fresh(&cell), "an operator's halt is not a fleet's");
    let replayed = AgentRecord::replay(cell.key.clone(), &journal.events());
    assert_eq!(*cell.lock(), replayed);
}
