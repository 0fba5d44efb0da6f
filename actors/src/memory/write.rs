//! Storing memories: an observation of a perceived event, a fact, the agent's own note, a
//! summary or reflection — each within the rate caps and the store's bounds, linked to the most
//! related memories (A-MEM), and journaled (`memory_stored`) with the memories it evicted.

use crate::agent::cell::AgentCell;
use parking_lot::MappedMutexGuard;
use warden_protocols::{
    memory::{Memory, MemoryKind, Observe, StoreFull, Unwritten},
    npc::{Perception, Rule, Verdict, WorldEvent},
    AgentRecord, EventKind,
};

/// How many existing memories a new one is linked to (the most related by relevance).
pub const LINK_K: usize = 3;

/// Memory ids with their relevance, most related first (a search's hits).
type Hits = Vec<(u64, f64)>;

/// The most characters a memory's text keeps (longer ones are cut).
pub const MAX_TEXT_CHARS: usize = 1000;

/// Why a memory was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotStored {
    /// `memory.long_term` is off for this agent.
    #[error("long-term memory is off (`memory.long_term = false`)")]
    Off,
    /// A rate cap (`memory.writes_per_minute`, `memory.speaker_writes_per_minute`) was reached.
    #[error("too many memories written in the last minute (`memory.writes_per_minute`)")]
    RateCapped,
    /// Only memories younger than a game day are left to evict.
    #[error("memory is full of memories younger than a game day (`memory.max_memories`, `memory.max_bytes`)")]
    Full,
}

impl From<StoreFull> for NotStored {
    fn from(_: StoreFull) -> Self {
        NotStored::Full
    }
}

/// A cheap importance (1–10) for an observation, by how much the source is trusted and whether
/// it was addressed to the agent: `2 + 5 × trust`, one more for a TRIGGER. (No model call: an
/// NPC hears far more than it should pay to score.)
pub fn importance_rule(verdict: Verdict, trust: f64) -> u8 {
    let base = 2.0 + 5.0 * unit(trust);
    let bonus = if verdict == Verdict::Trigger {
        1.0
    } else {
        0.0
    };
    (base + bonus).round().clamp(1.0, 10.0) as u8
}

/// `x` within 0 to 1 (NaN: 0).
pub(crate) fn unit(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

fn cut(text: &str) -> String {
    text.trim().chars().take(MAX_TEXT_CHARS).collect()
}

impl AgentCell {
    /// Memory time now (game seconds; see [`crate::memory::live::Live::now`]).
    pub(crate) fn memory_now(&self, rec: &AgentRecord) -> f64 {
        let clock = rec.memory().map_or(0.0, |s| s.clock);
        self.live().now(clock, self.settings.npc.clock.speed)
    }

    /// The `memory_stored` event for a new memory made now — linked to the [`LINK_K`] most
    /// related, with what must be evicted for it — or why it cannot be stored within the bounds.
    pub(crate) fn new_memory(
        &self,
        rec: &AgentRecord,
        kind: MemoryKind,
        text: &str,
        importance: u8,
        trust: f64,
    ) -> Result<EventKind, NotStored> {
        let at = self.memory_now(rec);
        self.new_memory_at(rec, kind, text, (importance, trust, at), None, None)
    }

    /// [`AgentCell::new_memory`] for a memory of `(importance, trust)` made at memory time `at`;
    /// `observed`: it writes that admitted observation; `ahead`: its links searched before the
    /// record lock was taken ([`super::TeamMemory::search_ahead`]).
    fn new_memory_at(
        &self,
        rec: &AgentRecord,
        kind: MemoryKind,
        text: &str,
        (importance, trust, at): (u8, f64, f64),
        observed: Option<u64>,
        ahead: Option<Vec<(u64, f64)>>,
    ) -> Result<EventKind, NotStored> {
        let store = rec.memory();
        let text = cut(text);
        let id = store.map_or(0, |s| s.next_id);
        let hits = match store {
            Some(store) => self
                .safety
                .memory
                .hits(&self.key, store, &text, LINK_K, ahead),
            None => Vec::new(),
        };
        let links = hits.into_iter().map(|(id, _)| id).collect();
        let memory = Memory {
            id,
            kind,
            text,
            importance: importance.clamp(1, 10),
            trust: unit(trust),
            at,
            accessed: at,
            links,
        };
        let config = &self.settings.memory;
        let evicted = match store {
            Some(s) => s.evictions(
                memory.bytes(),
                at,
                config.max_memories as usize,
                config.max_bytes,
            )?,
            None => Vec::new(),
        };
        Ok(EventKind::MemoryStored {
            memory: Box::new(memory),
            evicted,
            observed,
        })
    }

    /// A turn starts: what it remembers is asserted by `sender` with the trust its source earned
    /// (its latest perceived event's; a line relayed with a sender that was never perceived,
    /// `npc.trust.say`); an operator's request (`event` without a sender) is trusted (1.0); a tick
    /// or a delegated task is the agent's own (`self`) at `npc.trigger_min_trust` — or at the
    /// lowest trust of the CONTEXT events it perceived since its last turn, when lower: what the
    /// model writes down on its own after hearing a rumour is no more trusted than the rumour.
    pub(crate) fn memory_turn(&self, sender: Option<&str>, event: bool) {
        if !self.settings.memory.long_term {
            return;
        }
        let npc = &self.settings.npc;
        let mut live = self.live();
        let context = live.take_context_trust();
        let (speaker, trust) = match (sender, event) {
            (Some(s), _) => (
                Some(s.to_owned()),
                live.trust_of(s).unwrap_or(npc.trust.say),
            ),
            (None, true) => (None, 1.0),
            (None, false) => (None, npc.trigger_min_trust),
        };
        let trust = match (speaker.is_none() && !event, context) {
            (true, Some(c)) => trust.min(c),
            _ => trust,
        };
        live.set_turn(speaker, trust);
    }

    /// Journals `kinds` (memory events among them) in one batch and keeps the index level.
    pub(crate) fn emit_memory(&self, rec: &mut AgentRecord, kinds: Vec<EventKind>) -> u64 {
        let mut changes: Vec<(Vec<u64>, Option<u64>)> = Vec::new();
        for kind in &kinds {
            match kind {
                EventKind::MemoryStored {
                    memory, evicted, ..
                } => {
                    changes.push((evicted.clone(), Some(memory.id)));
                }
                EventKind::MemoryForgotten { ids, .. } => changes.push((ids.clone(), None)),
                _ => {}
            }
        }
        let seq = self.emit_all(rec, kinds);
        for (removed, added) in changes {
            self.safety
                .memory
                .changed(&self.key, rec.memory(), &removed, added);
        }
        seq
    }

    /// Whether one more memory fits the rate caps (counted when it does).
    fn admit_memory(&self, speaker: Option<&str>) -> Result<(), NotStored> {
        let config = &self.settings.memory;
        if !config.long_term {
            return Err(NotStored::Off);
        }
        if self.live().admit(
            speaker,
            config.writes_per_minute,
            config.speaker_writes_per_minute,
        ) {
            Ok(())
        } else {
            Err(NotStored::RateCapped)
        }
    }

    /// Whether a perceived world event is kept for long-term memory — TRIGGER and CONTEXT only
    /// (not IGNORE, not its own command output or its own messages, not an empty line) — and if
    /// so with what importance, for `perceive` to journal in its `perceived`. Only this runs on
    /// the caller's thread (a host's delivery): no lock, no clock, no map. The rate caps, the
    /// speaker's trust, the memory time and the write (links, evictions, the index) are the
    /// agent's own actor's ([`AgentCell::write_observations`]).
    pub(crate) fn observe(&self, event: &WorldEvent, perception: &Perception) -> Option<Observe> {
        if !self.settings.memory.long_term
            || !matches!(perception.verdict, Verdict::Trigger | Verdict::Context)
            || matches!(perception.rule, Rule::SelfMessage)
            || event.text.trim().is_empty()
        {
            return None;
        }
        Some(Observe {
            at: None,
            importance: importance_rule(perception.verdict, perception.trust),
        })
    }

    /// Locks the record with every perception kept for memory settled first (see
    /// [`AgentCell::write_observations`]): what every reader and writer of long-term memory
    /// locks, so none sees the store without what was delivered before.
    pub(crate) fn memory_lock(&self) -> MappedMutexGuard<'_, warden_protocols::AgentRecord> {
        let mut rec = self.lock();
        self.write_observations(&mut rec);
        rec
    }

    /// Settles every perception kept at delivery and not settled yet (`memory.unwritten`), oldest
    /// first: admitted within the rate caps, linked, with its evictions, journaled as
    /// `memory_stored` with its number (`observed`) — or settled as `observation_not_stored` (a
    /// rate cap; the store full of memories younger than a game day; long-term memory turned off
    /// since). Run by the agent's actor (a `Remember` signal, the start of each turn) and by
    /// every memory reader.
    pub(crate) fn write_observations(&self, rec: &mut AgentRecord) {
        while self.settle_kept(rec, None) {}
    }

    /// [`AgentCell::write_observations`] by the agent's actor (its `Remember` signal, a turn's
    /// start), each observation's links searched before the record lock is taken, so a host's
    /// delivery to this agent never waits for a search.
    pub(crate) fn write_observations_ahead(&self) {
        loop {
            let (n, text) = {
                let rec = self.lock();
                match rec.memory().and_then(|s| s.unwritten.front()) {
                    Some(u) => (u.n, cut(&u.event.text)),
                    None => return,
                }
            };
            let ahead = self.safety.memory.search_ahead(&self.key, &text, LINK_K);
            let mut rec = self.lock();
            if !self.settle_kept(&mut rec, Some((n, ahead))) {
                return;
            }
        }
    }

    /// Settles kept perceptions from the front of `memory.unwritten`, in order, under the record
    /// lock: those the rate caps refuse, then the first one they admit, written. `searched`: the
    /// number whose links were searched ahead (and the hits) — another admitted one is left for
    /// the next round (its links to be searched ahead too), so this never searches under the
    /// lock; `None`: search under it. Journals one row: the `memory_stored` of the one written
    /// (its `observed` settles the refused ones before it), or an `observation_not_stored` for
    /// the last refused. Whether kept perceptions remain.
    fn settle_kept(
        &self,
        rec: &mut AgentRecord,
        mut searched: Option<(u64, Option<Hits>)>,
    ) -> bool {
        let config = &self.settings.memory;
        let caps = (config.writes_per_minute, config.speaker_writes_per_minute);
        let speed = self.settings.npc.clock.speed;
        let mut refused: Option<(u64, NotStored)> = None;
        let mut written = None;
        let mut rest = false;
        {
            let Some(store) = rec.memory() else {
                return false;
            };
            let mut live = self.live();
            for u in &store.unwritten {
                if !config.long_term {
                    refused = Some((u.n, NotStored::Off));
                    continue;
                }
                let speaker = u.event.speaker.id.as_str();
                let ours = match &searched {
                    None => true,
                    Some((n, _)) => *n == u.n,
                };
                // Admitted at delivery by an older version: written as decided then.
                if let Some(at) = u.observe.at {
                    if !ours {
                        rest = true;
                        break;
                    }
                    written = Some((u.clone(), at));
                    break;
                }
                // The caps and the memory time as of when it was heard (in this process).
                let heard = u.heard.0.map(tokio::time::Instant::from_std);
                if !ours && live.would_admit(speaker, heard, caps) {
                    rest = true;
                    break;
                }
                match live.perceived(speaker, u.trust, u.context, heard, caps, Some(store), speed) {
                    Some(at) => {
                        written = Some((u.clone(), at));
                        break;
                    }
                    None => {
                        tracing::debug!(agent = %self.key, %speaker, "observation not stored: rate cap");
                        refused = Some((u.n, NotStored::RateCapped));
                    }
                }
            }
        }
        let event = match written {
            Some((u, at)) => {
                let ahead = searched.take().and_then(|(_, hits)| hits);
                self.written_observation(rec, u, at, ahead)
            }
            None => match refused {
                Some((observed, why)) => EventKind::ObservationNotStored {
                    observed,
                    reason: why.to_string(),
                },
                None => return rest,
            },
        };
        self.emit_memory(rec, vec![event]);
        rec.memory().is_some_and(|s| !s.unwritten.is_empty())
    }

    /// The event that settles kept perception `u`, admitted at memory time `at` (`ahead`: its
    /// links searched already).
    fn written_observation(
        &self,
        rec: &AgentRecord,
        u: Unwritten,
        at: f64,
        ahead: Option<Vec<(u64, f64)>>,
    ) -> EventKind {
        let n = u.n;
        let event = u.event;
        let kind = MemoryKind::Observation {
            speaker: event.speaker.id,
            speaker_kind: event.speaker.kind,
            source: event.kind.as_str().to_owned(),
            room: event.room,
        };
        let made = self.new_memory_at(
            rec,
            kind,
            &event.text,
            (u.observe.importance, u.trust, at),
            Some(n),
            ahead,
        );
        match made {
            Ok(stored) => stored,
            Err(why) => {
                tracing::debug!(agent = %self.key, %why, "observation not stored");
                EventKind::ObservationNotStored {
                    observed: n,
                    reason: why.to_string(),
                }
            }
        }
    }

    /// Stores a fact `subject predicate object` asserted by `asserted_by` with `trust`: a claim
    /// when `trust` is below `npc.trigger_min_trust` (a low-trust source never asserts a fact
    /// about the world, as it never starts a turn). Journaled before it returns the id.
    ///
    /// # Errors
    ///
    /// Why it was not stored (memory off, a rate cap, full).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_fact(
        &self,
        subject: &str,
        predicate: &str,
        object: &str,
        trust: f64,
        asserted_by: &str,
        sources: Vec<u64>,
        importance: u8,
    ) -> Result<u64, NotStored> {
        let claim = trust < self.settings.npc.trigger_min_trust;
        let kind = MemoryKind::Fact {
            subject: cut(subject),
            predicate: cut(predicate),
            object: cut(object),
            confidence: unit(trust),
            claim,
            asserted_by: vec![asserted_by.to_owned()],
            sources,
            contradicted_by: None,
        };
        let text = format!("{} {} {}", subject.trim(), predicate.trim(), object.trim());
        self.store_memory(kind, &text, importance, trust)
    }

    /// Stores a memory of `kind` (a note, a fact, a reflection, a summary) with `importance` and `trust`.
    /// Journaled before it returns the id.
    ///
    /// # Errors
    ///
    /// Why it was not stored (memory off, a rate cap, full).
    pub(crate) fn store_memory(
        &self,
        kind: MemoryKind,
        text: &str,
        importance: u8,
        trust: f64,
    ) -> Result<u64, NotStored> {
        self.admit_memory(None)?;
        let mut rec = self.memory_lock();
        let event = self.new_memory(&rec, kind, text, importance, trust)?;
        let id = match &event {
            EventKind::MemoryStored { memory, .. } => memory.id,
            _ => 0,
        };
        self.emit_memory(&mut rec, vec![event]);
        Ok(id)
    }

    /// Forgets `ids` (those stored; all of `about`'s when given, with its profile), journaled
    /// as `memory_forgotten` by `by`. Returns the ids removed and the journal seq (0: nothing to
    /// forget, nothing journaled).
    pub(crate) fn forget_memories(
        &self,
        ids: &[u64],
        about: Option<&str>,
        by: &str,
    ) -> (Vec<u64>, u64) {
        let mut rec = self.memory_lock();
        let Some(store) = rec.memory() else {
            return (Vec::new(), 0);
        };
        let mut gone: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| store.memories.contains_key(id))
            .collect();
        let profile = about.is_some_and(|a| store.profiles.contains_key(a));
        if let Some(about) = about {
            gone.extend(store.about(about));
        }
        gone.sort_unstable();
        gone.dedup();
        if gone.is_empty() && !profile {
            return (gone, 0);
        }
        let seq = self.emit_memory(
            &mut rec,
            vec![EventKind::MemoryForgotten {
                ids: gone.clone(),
                about: about.map(str::to_owned),
                by: by.to_owned(),
            }],
        );
        (gone, seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn importance_follows_trust_and_addressing() {
        assert_eq!(importance_rule(Verdict::Trigger, 0.9), 8);
        assert_eq!(importance_rule(Verdict::Context, 0.4), 4);
        assert_eq!(importance_rule(Verdict::Context, 0.2), 3);
        assert_eq!(importance_rule(Verdict::Context, f64::NAN), 2);
    }
}
