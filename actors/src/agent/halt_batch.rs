//! Many passive agents' halts applied together ([`crate::Supervisor::halt_all`]): one journal
//! append and one durability wait for a batch of agents, not one each. An active agent whose
//! actor is idle is halted the same way, its reader borrowed while its record changes
//! (`mailbox/reader.rs`).
//!
//! A passive agent's halt is a change of its record, made on the halting thread
//! ([`super::actor::halt_record`]). Made one by one, a fleet of a million pays a million journal
//! appends (each its own batch, a `Vec` and, for the durable journal, a trip through its queue's
//! lock) and a million durability futures. Here each agent's halt is applied under its record lock
//! and its events are *staged*; the lock stays held until the batch's rows are journaled in one
//! [`Journal::append_rows`], then all are released and one wait covers the batch.
//!
//! # Invariants
//! * Per agent, the journal order is the order of its record changes: every change of a record is
//!   journaled under its lock ([`AgentCell::emit`]), and this batch keeps each agent's lock from
//!   the change until its rows are journaled — no other event of that agent can come between.
//! * No deadlock: the batch holds several record locks at once, but never *waits* for one while it
//!   holds any — a lock is tried ([`AgentCell::try_lock_slot`]); if someone holds it the batch is
//!   journaled and released first, then the lock is waited for with nothing held. With the
//!   `test-hooks` feature, a pause point with a hook installed also releases the batch first (the
//!   hook may make another thread take one of those locks and wait for it).
//! * Every halt of the batch is applied (in memory, journaled) before [`HaltBatch::flush`]
//!   returns: `halt_all` is cancel safe as before (all of it happens before its first await).
//! * A batch's acknowledgements wait for the durability of the batch's last row (its rows are
//!   durable together: [`Journal::append_rows`]), or of the last event of an agent that journaled
//!   nothing now (already stopped, nothing cleared), whichever is later: each ack says whether
//!   everything its agent journaled so far is durable, as [`AgentCell::durable_so_far`] does.

use super::{
    actor::{discard_backlog, halt_record, settle_halted, HALT},
    cell::{AgentCell, RecordGuard, StagedRows},
    AgentMsg, Durability, HaltAck,
};
use crate::{journal::now_ms, mailbox::Envelope, Journal};
use futures::FutureExt;
use std::{collections::VecDeque, sync::Arc};
use warden_protocols::{AgentKey, AgentState, EventKind, HaltCause};

/// Agents halted in one batch at most: the time the first one's record lock is held waiting for
/// the batch (~1 µs per agent) against the per-batch cost (an append, a durability future).
const BATCH: usize = 1024;

/// One agent halted in the batch, its record lock held until the batch is journaled.
struct Held<'a> {
    cell: &'a AgentCell,
    rec: RecordGuard<'a>,
    slot: usize,
    /// How many of the batch's rows are this agent's.
    rows: usize,
    discarded: VecDeque<Envelope<AgentMsg>>,
    ack: HaltAck,
    /// The state it left for `STOPPED` (announced once journaled).
    stopped: Option<AgentState>,
    /// Observations wait and the cleared lane had their writer: remind once the lock is gone.
    remind: bool,
}

/// Acknowledgements of a batch whose durability is not known yet: the wait, and whose acks.
pub(crate) struct Unsettled {
    pub slots: Vec<usize>,
    pub durable: Durability,
}

/// Passive agents' halts, applied as they are added and journaled together (see the module docs).
pub(crate) struct HaltBatch<'a> {
    cause: &'a HaltCause,
    journal: Option<&'a Arc<dyn Journal>>,
    held: Vec<Held<'a>>,
    rows: Vec<(AgentKey, EventKind)>,
    /// Batches journaled whose durability was not known when they were.
    unsettled: Vec<Unsettled>,
}

impl<'a> HaltBatch<'a> {
    /// A batch for halting up to `agents` agents with `cause` (the size of its buffers).
    pub(crate) fn new(cause: &'a HaltCause, agents: usize) -> Self {
        HaltBatch {
            cause,
            journal: None,
            held: Vec::with_capacity(agents.min(BATCH)),
            rows: Vec::new(),
            unsettled: Vec::new(),
        }
    }

    /// Applies the halt to `cell`, a passive agent or one whose idle reader the caller borrowed
    /// (`slot`: its place in the caller's list); its acknowledgement goes to `acks[slot]` when
    /// the batch is journaled.
    pub(crate) fn halt(&mut self, cell: &'a AgentCell, slot: usize, acks: &mut [Option<HaltAck>]) {
        #[cfg(feature = "test-hooks")]
        if crate::test_hooks::passive_halt_gap_set() {
            self.flush(acks);
            crate::test_hooks::passive_halt_gap(&cell.key);
        }
        if self.held.len() >= BATCH
            || self
                .journal
                .is_some_and(|journal| !Arc::ptr_eq(journal, cell.journal()))
        {
            self.flush(acks);
        }
        self.journal = Some(cell.journal());
        cell.reset_tools_in_flight();
        let mut rec = match cell.try_lock_slot() {
            Some(rec) => rec,
            None => {
                // Never wait for a lock while holding others.
                self.flush(acks);
                cell.lock_slot()
            }
        };
        // Cleared under the record lock, as by any halt (see `halt_cell`).
        let discarded = cell.mailbox.take_ordinary();
        // A cleared TRIGGER was the writer of the perceptions kept for memory: the actor is
        // asked to write them once the batch's record locks are released (a passive agent's
        // reminder starts its actor). Only looked at when something was cleared: a fresh slot's
        // record is not built for nothing.
        let remind = !discarded.is_empty()
            && rec
                .record()
                .memory()
                .is_some_and(|s| !s.unwritten.is_empty());
        let before = self.rows.len();
        if self.rows.capacity() == 0 {
            // Two rows an agent (the state change, `Halted`): no growth, no copy.
            self.rows.reserve(2 * self.held.capacity());
        }
        let mut staged = StagedRows {
            key: &cell.key,
            rows: &mut self.rows,
        };
        // A fresh agent with nothing cleared (most of an idle fleet) is halted in its fresh slot:
        // no record built.
        let fresh = match discarded.is_empty() {
            true => cell.halt_fresh(&mut rec, self.cause, &mut staged),
            false => None,
        };
        let (discarded, ack, stopped) = match fresh {
            Some((state, stopped)) => {
                let ack = HaltAck {
                    agent: cell.key.clone(),
                    state,
                    discarded: 0,
                    not_durable: None,
                };
                (discarded, ack, stopped)
            }
            None => halt_record(cell, rec.record(), self.cause, discarded, &mut staged),
        };
        let rows = self.rows.len() - before;
        self.held.push(Held {
            cell,
            rec,
            slot,
            rows,
            discarded,
            ack,
            stopped,
            remind,
        });
    }

    /// Journals what is left ([`HaltBatch::flush`]) and returns the waits for the durability of
    /// the batches that were not durable at once (the batch, which holds record locks, is gone
    /// before anyone awaits them).
    pub(crate) fn finish(mut self, acks: &mut [Option<HaltAck>]) -> Vec<Unsettled> {
        self.flush(acks);
        std::mem::take(&mut self.unsettled)
    }

    /// Journals the batch's rows in one append, releases its record locks, then settles what
    /// the halts cleared and hands out the acknowledgements (to `acks`; their durability, when not
    /// known at once, to [`HaltBatch::unsettled`]).
    pub(crate) fn flush(&mut self, acks: &mut [Option<HaltAck>]) {
        let Some(journal) = self.journal else {
            return;
        };
        if self.held.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.rows);
        if !rows.is_empty() {
            let n = rows.len() as u64;
            let last = journal.append_rows(rows, now_ms());
            // Row `i` of the batch is `last + 1 - n + i`: each agent's last is its rows' end.
            let mut seq = (last + 1).saturating_sub(n);
            for held in self.held.iter_mut().filter(|h| h.rows > 0) {
                seq += held.rows as u64;
                held.cell.journaled(seq - 1);
            }
        }
        let mut upto = 0;
        let mut slots = Vec::with_capacity(self.held.len());
        let mut settle: Vec<(&AgentCell, VecDeque<Envelope<AgentMsg>>, bool)> =
            Vec::with_capacity(self.held.len());
        for held in self.held.drain(..) {
            let Held {
                cell,
                rec,
                slot,
                discarded,
                ack,
                stopped,
                remind,
                ..
            } = held;
            upto = upto.max(cell.last_seq());
            if let Some(from) = stopped {
                cell.announce(from, AgentState::Stopped, HALT);
            }
            drop(rec);
            if let Some(place) = acks.get_mut(slot) {
                *place = Some(ack);
            }
            slots.push(slot);
            settle.push((cell, discarded, remind));
        }
        // Off every lock, as for one halt: whoever waited on a cleared event is answered.
        for (cell, discarded, remind) in settle {
            settle_halted(cell, &discarded);
            discard_backlog(cell, discarded);
            if remind {
                let _ = cell.remind();
            }
        }
        let mut durable = journal.durable(upto);
        match (&mut durable).now_or_never() {
            Some(Ok(())) => {}
            Some(Err(not_durable)) => {
                for slot in slots {
                    if let Some(Some(ack)) = acks.get_mut(slot) {
                        ack.not_durable = Some(not_durable.clone());
                    }
                }
            }
            None => self.unsettled.push(Unsettled { slots, durable }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BATCH;
    use crate::{
        agent::cell::AgentCell, journal::NotDurable, provider::ScriptedProvider, AgentSpec,
        Journal, MemoryJournal, Supervisor,
    };
    use futures::future::BoxFuture;
    use parking_lot::Mutex;
    use std::{
        collections::HashMap,
        sync::{
            atomic::{AtomicUsize, Ordering},
            Arc,
        },
        time::Duration,
    };
    use warden_protocols::{AgentKey, AgentRecord, AgentState, EventKind, WardenConfig};

    /// A journal in memory that checks, for each row a fleet halt appends, that the row's agent's
    /// record lock is held while it is journaled (no other event of that agent can come first).
    #[derive(Default)]
    struct Witness {
        inner: MemoryJournal,
        cells: Mutex<HashMap<AgentKey, Arc<AgentCell>>>,
        /// Rows appended by `append_rows`, and those whose agent's lock was free meanwhile.
        rows: AtomicUsize,
        unlocked: AtomicUsize,
        calls: AtomicUsize,
    }

    impl Journal for Witness {
        fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
            self.inner.append(agent, kind)
        }
        fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
            self.inner.append_all(agent, kinds)
        }
        fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, at_ms: u64) -> u64 {
            let cells = self.cells.lock();
            let unlocked = rows
                .iter()
                .filter(|(agent, _)| cells.get(agent).is_some_and(|c| !c.record_locked()))
                .count();
            self.unlocked.fetch_add(unlocked, Ordering::SeqCst);
            self.rows.fetch_add(rows.len(), Ordering::SeqCst);
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.append_rows(rows, at_ms)
        }
        fn durable(&self, seq: u64) -> BoxFuture<'static, Result<(), NotDurable>> {
            self.inner.durable(seq)
        }
        fn degraded(&self) -> Option<String> {
            None
        }
    }

    fn fleet(journal: &Arc<Witness>, n: usize) -> (Supervisor, Vec<crate::AgentHandle>) {
        let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
        let model = Arc::new(ScriptedProvider::new([]));
        let agents: Vec<_> = (0..n)
            .map(|i| {
                team.spawn(AgentSpec::assistant(format!("a{i}"), model.clone()))
                    .expect("spawn")
            })
            .collect();
        let mut cells = journal.cells.lock();
        for a in &agents {
            assert!(a.passive());
            cells.insert(a.key().clone(), a.cell.clone());
        }
        drop(cells);
        (team, agents)
    }

    fn replay_is_live(journal: &MemoryJournal, agents: &[crate::AgentHandle]) {
        let mut by_agent: HashMap<AgentKey, Vec<warden_protocols::Event>> = HashMap::new();
        for e in journal.events() {
            by_agent.entry(e.agent.clone()).or_default().push(e);
        }
        for a in agents {
            let events = by_agent.remove(a.key()).unwrap_or_default();
            assert_eq!(
                AgentRecord::replay(a.key().clone(), &events),
                a.record(),
                "replay of {} differs from its live record",
                a.key()
            );
        }
    }

    /// A fleet halt of passive agents journals them a batch at a time (one `append_rows` per
    /// batch, not one append per agent), each row while its agent's record lock is held; the
    /// replay of the journal is every agent's live record.
    #[test]
    fn a_fleet_halt_journals_each_batch_under_its_agents_record_locks() {
        actix_rt::System::new().block_on(async {
            let journal = Arc::new(Witness::default());
            let n = 2 * BATCH + 100;
            let (team, agents) = fleet(&journal, n);
            let acks = team.halt_all().await;
            assert_eq!(acks.len(), n);
            for (ack, agent) in acks.iter().zip(&agents) {
                assert_eq!(&ack.agent, agent.key());
                assert_eq!(ack.state, AgentState::Stopped);
                assert!(ack.not_durable.is_none());
                assert_eq!(agent.state(), AgentState::Stopped);
                assert!(agent.passive(), "halted without an actor");
            }
            assert_eq!(journal.calls.load(Ordering::SeqCst), 3, "three batches");
            assert_eq!(journal.rows.load(Ordering::SeqCst), 2 * n);
            assert_eq!(
                journal.unlocked.load(Ordering::SeqCst),
                0,
                "rows journaled after their agent's record lock was released"
            );
            replay_is_live(&journal.inner, &agents);
            assert_eq!(team.resume_fleet_halt("op").await.map(|o| o.len()), Some(n));
        });
    }

    /// A record lock held by another thread when the batch reaches its agent: the batch is
    /// journaled and released before the lock is waited for, so a holder that wants a lock of the
    /// batch (here: the first agent's) gets it. Waiting with the batch held would deadlock: the
    /// holder gives up after 10 s and the test fails.
    #[test]
    fn a_fleet_halt_never_waits_for_a_record_lock_while_it_holds_others() {
        actix_rt::System::new().block_on(async {
            let journal = Arc::new(Witness::default());
            let (team, agents) = fleet(&journal, 20);
            let (first, held) = (agents[0].cell.clone(), agents[10].cell.clone());
            let (locked_tx, locked_rx) = std::sync::mpsc::channel();
            let witness = journal.clone();
            let holder = std::thread::spawn(move || {
                let guard = held.hold_record_for(Duration::ZERO).expect("free");
                locked_tx.send(()).expect("sent");
                // Wait for the halt to hold the first agent's lock (or to have journaled and
                // released it already), then want it too.
                while !first.record_locked() && witness.calls.load(Ordering::SeqCst) == 0 {
                    std::thread::yield_now();
                }
                let got = first.hold_record_for(Duration::from_secs(10)).is_some();
                drop(guard);
                got
            });
            locked_rx.recv().expect("the holder locked agent 10");
            let acks = team.halt_all().await;
            assert!(
                holder.join().expect("holder"),
                "the halt waited for agent 10's lock holding agent 0's"
            );
            assert!(acks.iter().all(|a| a.state == AgentState::Stopped));
            assert_eq!(
                journal.calls.load(Ordering::SeqCst),
                2,
                "flushed at agent 10"
            );
            assert_eq!(journal.unlocked.load(Ordering::SeqCst), 0);
            replay_is_live(&journal.inner, &agents);
        });
    }
}
