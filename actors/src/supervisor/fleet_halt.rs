//! Lifting a fleet-wide halt: which agents a halt of every agent stopped, and resuming exactly
//! those.
//!
//! [`Supervisor::halt_all_with`] (every fleet halt: the API's, the MCP server's, an embedding host's,
//! a cluster's) notes each agent it stops together with the agent's halt epoch after the halt.
//! [`Supervisor::resume_fleet_halt`] takes that note and resumes an agent only when all of these
//! hold:
//! * the fleet halt is still the last halt it went through (its halt epoch has not moved: an agent
//!   resumed and halted again individually meanwhile stays stopped);
//! * it is `STOPPED`, not locked out (only an authenticated unlock lifts a lockout), not stopped by
//!   a breaker (a budget: `stopped_by`), and not paused (an operator's pause is kept: a resume would
//!   undo it).
//!
//! An agent spawned halted ([`super::AgentSpec::starting_halted`]: a cluster node adopting it while
//! the cluster is halted) is noted too.
//!
//! The note outlives the process: each agent's record keeps `fleet_halted` (set by the journaled
//! `Halted` of a fleet halt that stopped it, cleared when it leaves `STOPPED` or is paused), and an
//! agent restored from the journal with it is noted again at its spawn. So after a restart a lift
//! resumes what the fleet halt stopped before it, and a cluster node that comes back after the
//! cluster halt was lifted resumes them itself (`Cluster::run`).
//!
//! An agent already `STOPPED` or `SAFETY_LOCKOUT` when a fleet halt came is not noted by it: it
//! was stopped by something else (an individual halt, a breaker), and a lift leaves it so.
//!
//! [`Supervisor::take_back`] brings back an agent this team halted when it gave it up (a cluster
//! node whose lease on it went to another node, which then died): as a spawn with
//! [`super::AgentSpec::starting_locked_out`] or [`super::AgentSpec::starting_halted`] would bring
//! it up, and under the lift's rules otherwise.
//!
//! # Invariants
//! * The note is written on the halt's first poll, before its first await, like the halt flags
//!   (a halt polled once and dropped still counts).
//! * A lift takes the note: a second lift finds nothing until another fleet halt.
//! * A lift that comes before the halt is applied (the halt raised and queued, the actor not yet
//!   at it) resumes the agent all the same: the resume is queued behind the halt (the `SystemHalt`
//!   lane goes first) and applied after it. Without this, a lift right behind its halt — a cluster
//!   node that receives both at once after a pause — left agents stopped with no note.

use super::Supervisor;
use crate::agent::cell::AgentCell;
use std::{collections::HashMap, sync::Arc};
use warden_protocols::{AgentKey, AgentState, EventKind, Lockout};

/// The agents a standing fleet halt stopped (`None`: no fleet halt stands).
pub(super) type FleetHaltNote = Option<Note>;

/// The agents a fleet halt stopped, each with its halt epoch after it, in the order noted (a
/// fleet halt notes in spawn order).
///
/// A list, not a map: a fleet halt of a million agents appends a million entries in one pass, where
/// building a sorted map (a sort, then a tree) was a quarter of `halt_all`. What needs a lookup by
/// agent (a cluster's lease writes: [`Supervisor::in_fleet_halt`]) builds [`Note::index`] once.
#[derive(Default)]
pub(super) struct Note {
    /// In the order noted. An agent noted again while the halt stands (a later fleet halt that
    /// found it running again, a take-back) appears again, later: its last entry counts.
    stopped: Vec<(Arc<AgentCell>, u64)>,
    /// Whether an agent may appear more than once (something was noted after the first note).
    merged: bool,
    /// Each noted agent's last epoch by the address of its cell (cells are never dropped from the
    /// registry, and the note holds them): built at the first lookup, kept up to date after it.
    index: Option<HashMap<usize, u64>>,
}

impl Note {
    fn add(&mut self, stopped: Vec<(Arc<AgentCell>, u64)>) {
        if let Some(index) = &mut self.index {
            index.extend(stopped.iter().map(|(cell, epoch)| (address(cell), *epoch)));
        }
        if self.stopped.is_empty() {
            self.stopped = stopped;
        } else {
            self.merged = true;
            self.stopped.extend(stopped);
        }
    }

    fn contains(&mut self, cell: &Arc<AgentCell>) -> bool {
        let stopped = &self.stopped;
        self.index
            .get_or_insert_with(|| {
                stopped
                    .iter()
                    .map(|(cell, epoch)| (address(cell), *epoch))
                    .collect()
            })
            .contains_key(&address(cell))
    }

    /// Each noted agent once, with its last epoch, in the order of its first note.
    fn into_agents(self) -> Vec<(Arc<AgentCell>, u64)> {
        if !self.merged {
            return self.stopped;
        }
        let mut at: HashMap<usize, usize> = HashMap::with_capacity(self.stopped.len());
        let mut agents: Vec<(Arc<AgentCell>, u64)> = Vec::with_capacity(self.stopped.len());
        for (cell, epoch) in self.stopped {
            match at.entry(address(&cell)) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    if let Some(agent) = agents.get_mut(*e.get()) {
                        agent.1 = epoch;
                    }
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(agents.len());
                    agents.push((cell, epoch));
                }
            }
        }
        agents
    }
}

/// A cell's identity in the note's index.
fn address(cell: &Arc<AgentCell>) -> usize {
    Arc::as_ptr(cell) as usize
}

/// What [`Supervisor::resume_fleet_halt`] did with one agent the fleet halt had stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiftOutcome {
    /// The agent.
    pub agent: AgentKey,
    /// `true`: resumed (`WAITING_FOR_EVENT` once it read the resume).
    pub resumed: bool,
    /// Why it was left as it is (empty when resumed; when resumed but not durable, the journal's
    /// error).
    pub kept: String,
}

impl Supervisor {
    /// Notes `cells` as stopped by a fleet halt; `running[i]`: whether `cells[i]` was neither
    /// `STOPPED` nor locked out before it (see the module docs).
    pub(super) fn note_fleet_halt(&self, cells: &[Arc<AgentCell>], running: &[bool]) {
        let stopped = cells
            .iter()
            .zip(running)
            .filter(|(_, running)| **running)
            .map(|(cell, _)| Self::noted(cell))
            .collect();
        self.note_stopped(stopped);
    }

    /// What the note keeps of `cell`: the cell and its halt epoch after the halt.
    pub(super) fn noted(cell: &Arc<AgentCell>) -> (Arc<AgentCell>, u64) {
        (cell.clone(), cell.halt_epoch())
    }

    /// Notes `stopped` ([`Supervisor::noted`] of each agent) as stopped by a fleet halt.
    pub(super) fn note_stopped(&self, stopped: Vec<(Arc<AgentCell>, u64)>) {
        self.shared
            .fleet_halt
            .lock()
            .get_or_insert_with(Note::default)
            .add(stopped);
    }

    /// Whether `state` counts as running for a fleet halt's note (not already stopped).
    pub(super) fn runs(state: AgentState) -> bool {
        !matches!(state, AgentState::Stopped | AgentState::SafetyLockout)
    }

    /// Forgets the standing fleet halt (every agent was resumed another way: the host's
    /// `resume_all`).
    pub(crate) fn forget_fleet_halt(&self) {
        *self.shared.fleet_halt.lock() = None;
    }

    /// Whether `key` is one of the agents the standing fleet halt stopped (a lift would resume
    /// it), rather than stopped by a halt of its own.
    pub fn in_fleet_halt(&self, key: &str) -> bool {
        let Some(handle) = self.get(key) else {
            return false;
        };
        self.shared
            .fleet_halt
            .lock()
            .as_mut()
            .is_some_and(|note| note.contains(&handle.cell))
    }

    /// Whether a fleet halt stands (one was made and not lifted by
    /// [`Supervisor::resume_fleet_halt`]).
    pub fn fleet_halted(&self) -> bool {
        self.shared.fleet_halt.lock().is_some()
    }

    /// Lifts the standing fleet halt: resumes every agent it stopped that may be resumed (see the
    /// module docs; each resume journaled with `operator`), and says what it did with each. `None`:
    /// no fleet halt stands (nothing done).
    pub async fn resume_fleet_halt(&self, operator: &str) -> Option<Vec<LiftOutcome>> {
        let noted = self.shared.fleet_halt.lock().take()?.into_agents();
        let mut outcomes = Vec::with_capacity(noted.len());
        let mut resuming = Vec::new();
        for (cell, epoch) in noted {
            let agent = cell.key.clone();
            let handle = crate::AgentHandle { cell };
            let kept = kept(&handle, epoch, "halted again since the fleet halt");
            if kept.is_empty() {
                resuming.push((outcomes.len(), handle));
            }
            outcomes.push(LiftOutcome {
                agent,
                resumed: kept.is_empty(),
                kept: kept.into(),
            });
        }
        // In order, a bounded number at once (`join_all` is quadratic over a large fleet: see
        // `Supervisor::shutdown`).
        // (The futures are collected first: a stream over a borrowing closure would make this
        // future's type too general for the callers that box it.)
        let resumes: Vec<_> = resuming.iter().map(|(_, h)| h.resume(operator)).collect();
        let results: Vec<_> = futures::StreamExt::collect(futures::StreamExt::buffered(
            futures::stream::iter(resumes),
            super::IN_FLIGHT,
        ))
        .await;
        for ((slot, _), result) in resuming.iter().zip(results) {
            let Some(outcome) = outcomes.get_mut(*slot) else {
                continue;
            };
            match result {
                Ok(()) => {}
                // Resumed, but the journal did not take it: said as such.
                Err(e @ crate::ControlError::NotDurable(_)) => outcome.kept = e.to_string(),
                // A lockout or breaker that came in between, or a team shut down.
                Err(e) => {
                    outcome.resumed = false;
                    outcome.kept = e.to_string();
                }
            }
        }
        Some(outcomes)
    }
}

impl Supervisor {
    /// Brings back `key`, an agent halted here when this node gave it up, `epoch` its
    /// [`crate::AgentHandle::halt_epoch`] after that halt:
    /// * `lockout` — locked out where it ran meanwhile: journaled here as at a spawn
    ///   (`locked_out`, then `SAFETY_LOCKOUT`); only an unlock lifts it;
    /// * else `halted` — the fleet is halted: it stays `STOPPED`, noted with the fleet halt (a
    ///   lift resumes it);
    /// * else it is resumed (journaled with `operator`).
    ///
    /// Each only while it is still as the give-up left it: `STOPPED`, not resumed since (its halt
    /// epoch is still `epoch`), and neither locked out, stopped by a breaker nor paused here. An
    /// agent in any other condition is left as it is, and the outcome says why.
    ///
    /// # Errors
    /// [`UnknownAgent`](super::UnknownAgent) when the team has no such agent.
    pub async fn take_back(
        &self,
        key: &str,
        epoch: u64,
        lockout: Option<Lockout>,
        halted: bool,
        operator: &str,
    ) -> Result<LiftOutcome, super::UnknownAgent> {
        let handle = self
            .get(key)
            .ok_or_else(|| super::UnknownAgent(key.into()))?;
        let kept = kept(
            &handle,
            epoch,
            "resumed or halted again since it was given up",
        );
        let mut outcome = LiftOutcome {
            agent: handle.key().clone(),
            resumed: false,
            kept: kept.into(),
        };
        if !kept.is_empty() {
            return Ok(outcome);
        }
        if let Some(lockout) = lockout {
            lock_out_at_start(&handle.cell, lockout);
            outcome.kept = "locked out where it ran meanwhile: only an unlock lifts it".into();
        } else if halted {
            self.note_fleet_halt(std::slice::from_ref(&handle.cell), &[true]);
            outcome.kept = "the fleet is halted: a lift resumes it".into();
        } else {
            match handle.resume(operator).await {
                Ok(()) => outcome.resumed = true,
                Err(e @ crate::ControlError::NotDurable(_)) => {
                    outcome.resumed = true;
                    outcome.kept = e.to_string();
                }
                Err(e) => outcome.kept = e.to_string(),
            }
        }
        Ok(outcome)
    }
}

/// Why `handle`, halted with its halt epoch then at `epoch`, is left as it is rather than resumed
/// (`""`: it may be resumed): it moved since (`moved` says how), or it is locked out, stopped by a
/// breaker, paused, or not stopped.
fn kept(handle: &crate::AgentHandle, epoch: u64, moved: &'static str) -> &'static str {
    let status = handle.status();
    if handle.cell.halt_epoch() != epoch {
        moved
    } else if status.emergency_stop {
        "locked out: only an unlock lifts it"
    } else if status.stopped_by.is_some() {
        "stopped by a breaker"
    } else if status.paused {
        "paused by an operator: resume it by itself"
    } else if status.state != AgentState::Stopped && !handle.cell.halt_requested() {
        // Not stopped, and no halt pending: resumed already. (A halt raised and queued but not
        // yet applied — the actor is busy, or on another arbiter — is still this halt: the resume
        // is queued behind it, and applied after it.)
        "not stopped (resumed already)"
    } else {
        ""
    }
}

/// Journals `lockout` on a freshly made cell, before its actor starts, or on a `STOPPED` one taken
/// back ([`Supervisor::take_back`]: its actor reads nothing while stopped): `locked_out` and the
/// move to `SAFETY_LOCKOUT` in one batch (the record's lockout and state agree in every journal).
/// Not through the transition table, which allows `SAFETY_LOCKOUT` only from `EXECUTING` (a
/// breaker tripping mid-turn): this agent tripped where it ran before. Nothing when it is locked out
/// already.
pub(super) fn lock_out_at_start(cell: &AgentCell, lockout: Lockout) {
    let mut rec = cell.lock();
    if rec.lockout.is_some() {
        return;
    }
    let from = rec.state;
    let cause = format!("locked out where it ran before: {}", lockout.reason);
    let locked = EventKind::LockedOut {
        breaker: lockout.breaker,
        reason: lockout.reason,
        consecutive_errors: rec.consecutive_errors,
    };
    cell.announce(from, AgentState::SafetyLockout, &cause);
    let change = EventKind::StateChanged {
        from,
        to: AgentState::SafetyLockout,
        cause,
    };
    cell.emit_all(&mut rec, vec![locked, change]);
}

#[cfg(test)]
mod tests {
    use crate::{journal::NullJournal, provider::ScriptedProvider, AgentSpec, Supervisor};
    use std::sync::Arc;
    use warden_protocols::{AgentState, WardenConfig};

    /// An agent noted by two fleet halts (resumed by itself between them) is one entry of the
    /// note: looked up before and after a second note, and lifted once, by its last epoch.
    #[test]
    fn an_agent_noted_twice_is_lifted_once_by_its_last_note() {
        actix_rt::System::new().block_on(async {
            let team = Supervisor::on_current_arbiter(
                WardenConfig::default(),
                Arc::new(NullJournal::default()),
            );
            let model = Arc::new(ScriptedProvider::new([]));
            let agents: Vec<_> = ["a", "b", "c"]
                .into_iter()
                .map(|k| {
                    team.spawn(AgentSpec::assistant(k, model.clone()))
                        .expect("spawn")
                })
                .collect();
            assert_eq!(team.halt_all().await.len(), 3);
            // The index is built by this lookup, then kept up to date by the second note.
            assert!(team.in_fleet_halt("b") && !team.in_fleet_halt("nobody"));
            agents[1].resume("op").await.expect("resume b");
            assert_eq!(team.halt_all().await.len(), 3);
            assert!(team.in_fleet_halt("b"));
            let lifted = team
                .resume_fleet_halt("op")
                .await
                .expect("a fleet halt stands");
            let keys: Vec<_> = lifted.iter().map(|o| o.agent.as_str().to_owned()).collect();
            assert_eq!(
                keys,
                ["a", "b", "c"],
                "each agent once, in the order first noted"
            );
            assert!(lifted.iter().all(|o| o.resumed), "{lifted:?}");
            for agent in &agents {
                assert_eq!(agent.status().state, AgentState::WaitingForEvent);
            }
            assert!(!team.in_fleet_halt("b") && team.resume_fleet_halt("op").await.is_none());
        });
    }
}
