//! Long-term memory per agent (issue 33; design 001's entity memory, A-MEM links): the journaled
//! types and their fold.
//!
//! A [`MemoryStore`] lives in the agent's [`crate::AgentRecord`] (`memory`) and changes only through
//! the `memory_*` events ([`crate::EventKind::MemoryStored`], `MemoryForgotten`, `MemoryRecalled`),
//! so a replay of the journal rebuilds it exactly. What needs a choice — which memories to evict,
//! what a new memory links to, whether an assertion is only a claim — is decided by the live agent
//! and carried in the event; what follows from the store alone — a fact confirming or contradicting
//! another, a speaker's profile and credibility — is decided here, in the fold, the same way live
//! and in a replay.
//!
//! Times are **memory time**: game seconds, counted on at the team clock's speed and continued
//! across restarts from the newest memory (`MemoryStore::clock`), so "a game day" means the same
//! before and after a restart.

use crate::npc::SpeakerKind;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Game seconds in a game day.
pub const DAY_SECS: f64 = 86_400.0;

/// The most links one memory keeps (the oldest go first).
pub const MAX_LINKS: usize = 8;

/// The most open promises an entity profile keeps (the oldest go first).
pub const MAX_PROMISES: usize = 5;

/// The credibility a speaker starts with (design 001's "sender history": 0 to 1).
pub const NEUTRAL_CREDIBILITY: f64 = 0.5;

/// How much a confirmed assertion raises its speaker's credibility.
pub const CONFIRMED_GAIN: f64 = 0.1;

/// How much a contradicted assertion lowers its speaker's credibility.
pub const CONTRADICTED_LOSS: f64 = 0.2;

/// One memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Unique over the agent's journal (never reused).
    pub id: u64,
    /// What kind of memory, with its own fields.
    pub kind: MemoryKind,
    /// The text: what was said (an observation), the assertion in words (a fact), the reflection,
    /// the summary.
    pub text: String,
    /// 1 (mundane) to 10 (poignant).
    pub importance: u8,
    /// The trust of its source, 0 to 1 (an observation's as classified; a fact's, its source's).
    pub trust: f64,
    /// When it was made, in memory time (game seconds).
    pub at: f64,
    /// When it was last recalled (or made), in memory time.
    pub accessed: f64,
    /// The most related memories (A-MEM): both ways, at most [`MAX_LINKS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<u64>,
}

/// The kinds of memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MemoryKind {
    /// Something the agent perceived (a TRIGGER or CONTEXT world event), or wrote down itself.
    Observation {
        /// Who spoke, as the server identified them (`speaker.id`).
        speaker: String,
        /// What kind of speaker, as the server said.
        speaker_kind: SpeakerKind,
        /// How it was said (`say`, `whisper`, …; `remember` for the agent's own note).
        source: String,
        /// Where, when the server said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        room: Option<String>,
    },
    /// An assertion about the world: `subject predicate object`.
    Fact {
        /// What it is about (an entity id, a name, a thing).
        subject: String,
        /// The relation (`name`, `lives in`, `is`, `promised`, …).
        predicate: String,
        /// The value.
        object: String,
        /// 0 to 1: how sure the agent is (raised by confirmations).
        confidence: f64,
        /// `true`: asserted only by low-trust sources — "X claims …", never a fact about the world
        /// until a source of enough trust confirms it.
        claim: bool,
        /// Who asserted it (speaker ids; `self` for the agent's own `remember`).
        asserted_by: Vec<String>,
        /// The observations it came from, when known.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        sources: Vec<u64>,
        /// The fact that contradicted it and won (then it is recalled as contradicted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        contradicted_by: Option<u64>,
    },
    /// A higher-level thought the model wrote over recent memories.
    Reflection,
    /// A summary of history removed by a compaction.
    Summary,
}

impl MemoryKind {
    /// The wire name: `observation`, `fact`, `reflection`, `summary`.
    pub fn name(&self) -> &'static str {
        match self {
            MemoryKind::Observation { .. } => "observation",
            MemoryKind::Fact { .. } => "fact",
            MemoryKind::Reflection => "reflection",
            MemoryKind::Summary => "summary",
        }
    }
}

impl Memory {
    /// What it costs in the store's byte bound: its strings plus a fixed 96 bytes.
    pub fn bytes(&self) -> u64 {
        let strings = match &self.kind {
            MemoryKind::Observation {
                speaker,
                source,
                room,
                ..
            } => speaker.len() + source.len() + room.as_ref().map_or(0, String::len),
            MemoryKind::Fact {
                subject,
                predicate,
                object,
                asserted_by,
                sources,
                ..
            } => {
                subject.len()
                    + predicate.len()
                    + object.len()
                    + asserted_by.iter().map(|a| a.len() + 8).sum::<usize>()
                    + sources.len() * 8
            }
            MemoryKind::Reflection | MemoryKind::Summary => 0,
        };
        (96 + self.text.len() + strings + self.links.len() * 8) as u64
    }

    /// Whether it is about `entity`: said by it, a fact about it or asserted by it.
    pub fn is_about(&self, entity: &str) -> bool {
        match &self.kind {
            MemoryKind::Observation { speaker, .. } => speaker == entity,
            MemoryKind::Fact {
                subject,
                asserted_by,
                ..
            } => subject == entity || asserted_by.iter().any(|a| a == entity),
            MemoryKind::Reflection | MemoryKind::Summary => false,
        }
    }

    /// How much it is worth keeping at memory time `now`, 0 to about 1.2: half importance, half
    /// how recently it was recalled (0.98 per game hour), and 0.2 more for a standing fact. The
    /// lowest is evicted first.
    pub fn retention(&self, now: f64) -> f64 {
        let hours = ((now - self.accessed) / 3600.0).max(0.0);
        let standing = matches!(
            self.kind,
            MemoryKind::Fact {
                claim: false,
                contradicted_by: None,
                ..
            }
        );
        0.5 * f64::from(self.importance.clamp(1, 10)) / 10.0
            + 0.5 * 0.98f64.powf(hours)
            + if standing { 0.2 } else { 0.0 }
    }
}

/// What an agent knows of one speaker (design 001's entity memory), by the id the server gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntityProfile {
    /// Player, NPC, system, unknown (as the server said last).
    pub kind: SpeakerKind,
    /// Memory time of the first observation of it.
    pub first_seen: f64,
    /// Memory time of the latest.
    pub last_seen: f64,
    /// Where it was last heard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
    /// Observations of it stored.
    pub heard: u64,
    /// Its name, from a fact `ID name X` that is not a mere claim of someone else's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The agent's relationship to it (a fact `ID relationship X`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relationship: Option<String>,
    /// Open promises (facts `ID promised X`), the newest [`MAX_PROMISES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub promises: Vec<String>,
    /// Sender history, 0 to 1 (starts at [`NEUTRAL_CREDIBILITY`]): up when what it asserted was
    /// confirmed by a more trusted source, down when contradicted.
    pub credibility: f64,
    /// Its assertions confirmed.
    #[serde(default)]
    pub confirmed: u32,
    /// Its assertions contradicted.
    #[serde(default)]
    pub contradicted: u32,
}

impl EntityProfile {
    fn new(kind: SpeakerKind, at: f64) -> Self {
        EntityProfile {
            kind,
            first_seen: at,
            last_seen: at,
            room: None,
            heard: 0,
            name: None,
            relationship: None,
            promises: Vec::new(),
            credibility: NEUTRAL_CREDIBILITY,
            confirmed: 0,
            contradicted: 0,
        }
    }
}

/// Where a night's consolidation is (design 001's `sleep_phase`, `consolidation_progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepPhase {
    /// Merging duplicates and letting unimportant, never-recalled observations go (no model).
    Compacting,
    /// Reflecting over the day's memories (a model call).
    Dreaming,
    /// The night's work is done.
    Done,
}

/// The consolidation of one game day (journaled as `memory_consolidated`, so a crash mid-phase
/// resumes at the phase it reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consolidation {
    /// The game day consolidated (memory time / [`DAY_SECS`], from 0).
    pub day: u64,
    /// The phase reached: the next one to run (or `done`).
    pub phase: SleepPhase,
}

/// An observation of importance at most this that was never recalled decays at the first sleep
/// after it is a game day old.
pub const DECAY_IMPORTANCE: u8 = 3;

/// An agent's long-term memory: its memories by id and its entity profiles by speaker id.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MemoryStore {
    /// The memories, by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memories: BTreeMap<u64, Memory>,
    /// The profiles, by speaker id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, EntityProfile>,
    /// The next memory id.
    pub next_id: u64,
    /// The sum of [`Memory::bytes`] of the memories.
    pub bytes: u64,
    /// The newest memory time the store has seen: where memory time goes on after a restart.
    pub clock: f64,
    /// The latest night's consolidation, once one began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<Consolidation>,
    /// The wake the agent scheduled in its sleep hours, in memory time (design 001's
    /// `scheduled_wake_time`; the `wake_at` tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_wake: Option<f64>,
    /// Tool calls finished since the agent last woke (design 001's `activity_since_wake`): counted
    /// from `tool_finished`, back to 0 at each `npc_mode_changed` to `awake`.
    #[serde(default)]
    pub activity_since_wake: u64,
    /// Perceptions kept for memory at delivery (`perceived` with `observe`) and not settled yet,
    /// oldest first: the agent's actor admits them within the rate caps and writes them before
    /// its next recall, so a host's delivery never waits for either; a restart finds them here
    /// and settles them. Omitted while empty.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub unwritten: VecDeque<Unwritten>,
    /// The memory time up to which observations were shown to the model to score their
    /// importance (`memory_scored`); `None`: none yet. Omitted while none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scored_through: Option<f64>,
    /// The events of lines settled lately, their buffers reused by the next kept lines (at most
    /// [`SPARE`]): the copy a host's delivery keeps is then made on the thread that allocated
    /// it, seldom allocating. Not journaled, not compared, not cloned.
    #[serde(skip)]
    pub spare: Spare,
    /// How many perceptions were ever kept for memory (the next one's number). Omitted while
    /// zero. (Named `admitted` in records of versions whose delivery admitted them.)
    #[serde(default, skip_serializing_if = "is_zero", alias = "admitted")]
    pub kept: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a delivery kept of a perception for long-term memory (journaled in its `perceived`): the
/// rest — the speaker, the source, the room, the text, the trust — is the perceived event's.
/// Whether it becomes a memory (the rate caps) and its memory time are decided by the agent's
/// actor when it writes it ([`MemoryStore::unwritten`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Observe {
    /// Memory time when it was admitted — set only in rows of warden versions whose delivery
    /// admitted it within the rate caps itself (such an observation is written as admitted, at
    /// this time); `None`: the actor decides both when it writes. Omitted while `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<f64>,
    /// Its importance, 1–10.
    pub importance: u8,
}

/// A perception kept for long-term memory and not settled yet ([`MemoryStore::unwritten`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unwritten {
    /// Its number (`observed` of the `memory_stored` or `observation_not_stored` that settles it).
    pub n: u64,
    /// The world event perceived.
    pub event: crate::npc::WorldEvent,
    /// The trust its perception gave the source.
    pub trust: f64,
    /// Its perception was a CONTEXT (not a TRIGGER): the lowest CONTEXT trust heard before a
    /// tick's turn bounds what that turn may assert. Omitted while false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub context: bool,
    /// Its importance (and, from older rows, its memory time).
    pub observe: Observe,
    /// When this process heard it, for the actor to apply the rate caps and the memory time as
    /// of then, however late it settles it. Not journaled: a replay, a snapshot and a restart
    /// have none, and the actor settles it at its own time.
    #[serde(skip)]
    pub heard: Heard,
}

/// How many settled lines' events a store keeps for reuse ([`MemoryStore::spare`]).
pub const SPARE: usize = 4;

/// Settled lines' events kept for their buffers ([`MemoryStore::spare`]). Equal to any other and
/// cloned empty: not part of what the record is.
#[derive(Debug, Default)]
pub struct Spare(Vec<crate::npc::WorldEvent>);

impl PartialEq for Spare {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Clone for Spare {
    fn clone(&self) -> Self {
        Spare::default()
    }
}

/// The instant a kept perception was heard in this process ([`Unwritten::heard`]). Equal to any
/// other: a record's equality is what the journal holds (replay = live).
#[derive(Debug, Clone, Copy, Default)]
pub struct Heard(pub Option<std::time::Instant>);

impl PartialEq for Heard {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `subject predicate` compared as the fold compares them: trimmed, lower case.
fn norm(s: &str) -> String {
    s.trim().to_lowercase()
}

/// Why a memory cannot be stored within the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreFull;

impl MemoryStore {
    /// Folds a `perceived` kept for memory: it waits in `unwritten`.
    pub fn kept(
        &mut self,
        event: &crate::npc::WorldEvent,
        perception: &crate::npc::Perception,
        observe: Observe,
    ) {
        let n = self.kept;
        self.kept = n.saturating_add(1);
        if let Some(at) = observe.at {
            self.clock = self.clock.max(at);
        }
        let event = match self.spare.0.pop() {
            Some(mut spare) => {
                spare.clone_from(event);
                spare
            }
            None => event.clone(),
        };
        self.unwritten.push_back(Unwritten {
            n,
            event,
            trust: perception.trust,
            context: perception.verdict == crate::npc::Verdict::Context,
            observe,
            heard: Heard::default(),
        });
    }

    /// Folds `MemoryScored`: each memory still stored takes its score (1–10); the observations up
    /// to memory time `through` count as scored.
    pub fn scored(&mut self, scores: &[(u64, u8)], through: f64) {
        for (id, importance) in scores {
            if let Some(m) = self.memories.get_mut(id) {
                m.importance = (*importance).clamp(1, 10);
            }
        }
        self.scored_through = Some(self.scored_through.map_or(through, |t| t.max(through)));
    }

    /// The observations the model may score now: from sources of at least `min_trust` (a
    /// low-trust source keeps the rule's importance), made after `scored_through`, the newest
    /// `limit`, in id order.
    pub fn unscored(&self, min_trust: f64, limit: usize) -> Vec<&Memory> {
        let mut found: Vec<&Memory> = self
            .memories
            .values()
            .rev()
            .filter(|m| {
                matches!(m.kind, MemoryKind::Observation { .. })
                    && m.trust >= min_trust
                    && self.scored_through.is_none_or(|t| m.at > t)
            })
            .take(limit)
            .collect();
        found.reverse();
        found
    }

    /// The perceptions kept up to number `n` are settled: written, or never to be.
    pub fn written(&mut self, n: u64) {
        while self.unwritten.front().is_some_and(|u| u.n <= n) {
            if let Some(u) = self.unwritten.pop_front() {
                if self.spare.0.len() < SPARE {
                    self.spare.0.push(u.event);
                }
            }
        }
    }

    /// The memory ids about `entity` (see [`Memory::is_about`]), ascending.
    pub fn about(&self, entity: &str) -> Vec<u64> {
        self.memories
            .values()
            .filter(|m| m.is_about(entity))
            .map(|m| m.id)
            .collect()
    }

    /// What to evict so that one more memory of `incoming` bytes fits within `max_memories` and
    /// `max_bytes` at memory time `now`: the lowest [`Memory::retention`] first, never a memory
    /// made less than a game day before `now`.
    ///
    /// # Errors
    ///
    /// [`StoreFull`] when only memories younger than a game day are left to evict.
    pub fn evictions(
        &self,
        incoming: u64,
        now: f64,
        max_memories: usize,
        max_bytes: u64,
    ) -> Result<Vec<u64>, StoreFull> {
        let mut count = self.memories.len() + 1;
        let mut bytes = self.bytes.saturating_add(incoming);
        if count <= max_memories && bytes <= max_bytes {
            return Ok(Vec::new());
        }
        let mut old: Vec<(f64, u64, u64)> = self
            .memories
            .values()
            .filter(|m| now - m.at >= DAY_SECS)
            .map(|m| (m.retention(now), m.id, m.bytes()))
            .collect();
        old.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut evicted = Vec::new();
        for (_, id, size) in old {
            if count <= max_memories && bytes <= max_bytes {
                break;
            }
            evicted.push(id);
            count -= 1;
            bytes = bytes.saturating_sub(size);
        }
        if count <= max_memories && bytes <= max_bytes {
            Ok(evicted)
        } else {
            Err(StoreFull)
        }
    }

    /// The standing fact (not contradicted) with this subject and predicate, if any.
    pub fn standing_fact(&self, subject: &str, predicate: &str) -> Option<&Memory> {
        let (s, p) = (norm(subject), norm(predicate));
        self.memories.values().rev().find(|m| {
            matches!(&m.kind, MemoryKind::Fact { subject, predicate, contradicted_by: None, .. }
                if norm(subject) == s && norm(predicate) == p)
        })
    }

    fn profile(&mut self, id: &str, kind: SpeakerKind, at: f64) -> &mut EntityProfile {
        self.profiles
            .entry(id.to_owned())
            .or_insert_with(|| EntityProfile::new(kind, at))
    }

    fn credit(&mut self, who: &[String], delta: f64) {
        for id in who {
            if id == "self" {
                continue;
            }
            let p = self
                .profiles
                .entry(id.clone())
                .or_insert_with(|| EntityProfile::new(SpeakerKind::Unknown, 0.0));
            p.credibility = (p.credibility + delta).clamp(0.0, 1.0);
            if delta > 0.0 {
                p.confirmed += 1;
            } else {
                p.contradicted += 1;
            }
        }
    }

    /// Folds `MemoryStored`: removes `evicted`, then adds `memory` — a fact that repeats a standing
    /// one is merged into it (a confirmation), one that disagrees with it is resolved by trust (a
    /// claim loses to a fact, then the higher trust wins, then the newer) — links it both ways and
    /// updates the profiles.
    pub fn stored(&mut self, memory: &Memory, evicted: &[u64]) {
        self.remove(evicted);
        self.next_id = self.next_id.max(memory.id.saturating_add(1));
        self.clock = self.clock.max(memory.at);
        let mut memory = memory.clone();
        if let MemoryKind::Fact {
            subject,
            predicate,
            object,
            claim,
            asserted_by,
            sources,
            confidence,
            ..
        } = &memory.kind
        {
            if let Some(old) = self.standing_fact(subject, predicate).map(|m| m.id) {
                if self.resolve(
                    old,
                    &memory,
                    object,
                    *claim,
                    asserted_by,
                    sources,
                    *confidence,
                ) {
                    return;
                }
            }
            self.fact_profile(subject, predicate, object, *claim, asserted_by, memory.at);
        }
        if let Some(old) = self.memories.get(&memory.id) {
            // The same id twice (cannot happen live): the newer replaces it.
            self.bytes = self.bytes.saturating_sub(old.bytes());
        }
        memory.links.retain(|l| self.memories.contains_key(l));
        memory.links.truncate(MAX_LINKS);
        for link in &memory.links {
            if let Some(other) = self.memories.get_mut(link) {
                self.bytes = self.bytes.saturating_sub(other.bytes());
                other.links.push(memory.id);
                if other.links.len() > MAX_LINKS {
                    other.links.remove(0);
                }
                self.bytes = self.bytes.saturating_add(other.bytes());
            }
        }
        if let MemoryKind::Observation {
            speaker,
            speaker_kind,
            room,
            ..
        } = &memory.kind
        {
            let p = self.profile(speaker, *speaker_kind, memory.at);
            p.kind = *speaker_kind;
            p.heard += 1;
            p.last_seen = p.last_seen.max(memory.at);
            if room.is_some() {
                p.room = room.clone();
            }
        }
        self.bytes = self.bytes.saturating_add(memory.bytes());
        self.memories.insert(memory.id, memory);
    }

    /// A new fact against the standing fact `old` with the same subject and predicate. `true`: it
    /// was merged into `old` (nothing more to store).
    #[allow(clippy::too_many_arguments)]
    fn resolve(
        &mut self,
        old: u64,
        new: &Memory,
        object: &str,
        claim: bool,
        asserted_by: &[String],
        sources: &[u64],
        confidence: f64,
    ) -> bool {
        let Some(existing) = self.memories.get(&old) else {
            return false;
        };
        let MemoryKind::Fact {
            object: old_object,
            claim: old_claim,
            asserted_by: old_by,
            ..
        } = &existing.kind
        else {
            return false;
        };
        let (old_claim, old_by, old_trust) = (*old_claim, old_by.clone(), existing.trust);
        if norm(old_object) == norm(object) {
            // The same assertion again: a confirmation, merged.
            let before = existing.bytes();
            let Some(m) = self.memories.get_mut(&old) else {
                return false;
            };
            m.trust = m.trust.max(new.trust);
            m.accessed = m.accessed.max(new.at);
            m.importance = m.importance.max(new.importance);
            if let MemoryKind::Fact {
                confidence: c,
                claim: cl,
                asserted_by: by,
                sources: src,
                ..
            } = &mut m.kind
            {
                *c = (c.max(confidence) + 0.1).min(1.0);
                *cl = *cl && claim;
                for a in asserted_by {
                    if !by.contains(a) {
                        by.push(a.clone());
                    }
                }
                for s in sources {
                    if !src.contains(s) {
                        src.push(*s);
                    }
                }
            }
            let after = m.bytes();
            self.bytes = self.bytes.saturating_sub(before).saturating_add(after);
            if old_claim && !claim {
                let confirmed: Vec<String> = old_by
                    .into_iter()
                    .filter(|a| !asserted_by.contains(a))
                    .collect();
                self.credit(&confirmed, CONFIRMED_GAIN);
            }
            return true;
        }
        // A disagreement: a fact beats a claim; then the higher trust; then the newer.
        let new_wins = match (old_claim, claim) {
            (true, false) => true,
            (false, true) => false,
            _ => new.trust >= old_trust,
        };
        if new_wins {
            if let Some(m) = self.memories.get_mut(&old) {
                if let MemoryKind::Fact {
                    contradicted_by, ..
                } = &mut m.kind
                {
                    *contradicted_by = Some(new.id);
                }
            }
            if !claim {
                self.credit(&old_by, -CONTRADICTED_LOSS);
            }
            false
        } else {
            // Stored, but as contradicted by the standing fact.
            let mut loser = new.clone();
            if let MemoryKind::Fact {
                contradicted_by, ..
            } = &mut loser.kind
            {
                *contradicted_by = Some(old);
            }
            if !old_claim {
                self.credit(asserted_by, -CONTRADICTED_LOSS);
            }
            loser.links.retain(|l| self.memories.contains_key(l));
            loser.links.truncate(MAX_LINKS);
            self.bytes = self.bytes.saturating_add(loser.bytes());
            self.memories.insert(loser.id, loser);
            true
        }
    }

    /// A standing fact about an entity fills its profile: its name, the relationship, a promise.
    /// A claim does so only when the entity said it of itself.
    fn fact_profile(
        &mut self,
        subject: &str,
        predicate: &str,
        object: &str,
        claim: bool,
        asserted_by: &[String],
        at: f64,
    ) {
        if claim && !asserted_by.iter().any(|a| a == subject) {
            return;
        }
        let field = match norm(predicate).as_str() {
            "name" | "is named" | "is called" => 0,
            "relationship" => 1,
            "promised" | "promises" => 2,
            _ => return,
        };
        let Some(p) = self.profiles.get_mut(subject) else {
            if field == 0 {
                let mut p = EntityProfile::new(SpeakerKind::Unknown, at);
                p.name = Some(object.to_owned());
                self.profiles.insert(subject.to_owned(), p);
            }
            return;
        };
        match field {
            0 => p.name = Some(object.to_owned()),
            1 => p.relationship = Some(object.to_owned()),
            _ => {
                p.promises.push(object.to_owned());
                if p.promises.len() > MAX_PROMISES {
                    p.promises.remove(0);
                }
            }
        }
    }

    /// What a night's compacting lets go at memory time `now`: an observation that repeats a newer
    /// one of the same speaker word for word (case and spacing aside), and an observation of
    /// importance at most [`DECAY_IMPORTANCE`] never recalled since it was made, a game day old
    /// or more. Ascending ids.
    pub fn compactable(&self, now: f64) -> Vec<u64> {
        let mut seen = std::collections::HashSet::new();
        let mut gone = Vec::new();
        for m in self.memories.values().rev() {
            let MemoryKind::Observation { speaker, .. } = &m.kind else {
                continue;
            };
            let words: Vec<String> = m.text.split_whitespace().map(str::to_lowercase).collect();
            let duplicate = !seen.insert((speaker.clone(), words.join(" ")));
            let decayed =
                m.importance <= DECAY_IMPORTANCE && m.accessed <= m.at && now - m.at >= DAY_SECS;
            if duplicate || decayed {
                gone.push(m.id);
            }
        }
        gone.reverse();
        gone
    }

    /// Folds `MemoryConsolidated`.
    pub fn consolidated(&mut self, day: u64, phase: SleepPhase) {
        self.consolidation = Some(Consolidation { day, phase });
    }

    /// Folds `MemoryForgotten`: removes `ids` (and their links), and the profile of `about`.
    pub fn forgotten(&mut self, ids: &[u64], about: Option<&str>) {
        self.remove(ids);
        if let Some(about) = about {
            self.profiles.remove(about);
            // What they said and was not written yet is forgotten too.
            self.unwritten.retain(|u| u.event.speaker.id != about);
        }
    }

    /// Folds `MemoryRecalled`: `accessed = at` for each id still stored.
    pub fn recalled(&mut self, ids: &[u64], at: f64) {
        self.clock = self.clock.max(at);
        for id in ids {
            if let Some(m) = self.memories.get_mut(id) {
                m.accessed = m.accessed.max(at);
            }
        }
    }

    fn remove(&mut self, ids: &[u64]) {
        for id in ids {
            let Some(gone) = self.memories.remove(id) else {
                continue;
            };
            self.bytes = self.bytes.saturating_sub(gone.bytes());
            for link in &gone.links {
                if let Some(other) = self.memories.get_mut(link) {
                    let before = other.bytes();
                    other.links.retain(|l| l != id);
                    let after = other.bytes();
                    self.bytes = self.bytes.saturating_sub(before).saturating_add(after);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(id: u64, subject: &str, object: &str, trust: f64, claim: bool, by: &str) -> Memory {
        Memory {
            id,
            kind: MemoryKind::Fact {
                subject: subject.into(),
                predicate: "is".into(),
                object: object.into(),
                confidence: trust,
                claim,
                asserted_by: vec![by.into()],
                sources: Vec::new(),
                contradicted_by: None,
            },
            text: format!("{subject} is {object}"),
            importance: 5,
            trust,
            at: id as f64,
            accessed: id as f64,
            links: Vec::new(),
        }
    }

    fn observation(id: u64, speaker: &str, at: f64, importance: u8) -> Memory {
        Memory {
            id,
            kind: MemoryKind::Observation {
                speaker: speaker.into(),
                speaker_kind: SpeakerKind::Player,
                source: "say".into(),
                room: Some("forge".into()),
            },
            text: format!("hello from {speaker}"),
            importance,
            trust: 0.4,
            at,
            accessed: at,
            links: Vec::new(),
        }
    }

    fn contradicted(store: &MemoryStore, id: u64) -> Option<u64> {
        match &store.memories[&id].kind {
            MemoryKind::Fact {
                contradicted_by, ..
            } => *contradicted_by,
            _ => None,
        }
    }

    #[test]
    fn a_trusted_fact_beats_a_claim_and_the_claimant_loses_credibility() {
        let mut s = MemoryStore::default();
        s.stored(&fact(0, "mayor", "a vampire", 0.4, true, "p3"), &[]);
        s.stored(&fact(1, "mayor", "human", 0.9, false, "gm"), &[]);
        assert_eq!(contradicted(&s, 0), Some(1));
        assert_eq!(contradicted(&s, 1), None);
        assert_eq!(s.standing_fact("Mayor", "IS").map(|m| m.id), Some(1));
        assert!(s.profiles["p3"].credibility < NEUTRAL_CREDIBILITY);
        // A later claim does not overturn the fact: stored as contradicted.
        s.stored(&fact(2, "mayor", "a werewolf", 0.4, true, "p4"), &[]);
        assert_eq!(contradicted(&s, 2), Some(1));
        assert_eq!(s.standing_fact("mayor", "is").map(|m| m.id), Some(1));
    }

    #[test]
    fn a_claim_confirmed_by_a_trusted_source_becomes_a_fact() {
        let mut s = MemoryStore::default();
        s.stored(&fact(0, "well", "dry", 0.4, true, "p3"), &[]);
        s.stored(&fact(1, "well", "Dry ", 0.9, false, "gm"), &[]);
        assert_eq!(s.memories.len(), 1, "merged");
        assert!(matches!(
            s.memories[&0].kind,
            MemoryKind::Fact { claim: false, .. }
        ));
        assert!(s.profiles["p3"].credibility > NEUTRAL_CREDIBILITY);
        assert_eq!(s.next_id, 2);
    }

    #[test]
    fn eviction_takes_the_least_retained_and_never_a_memory_of_the_last_game_day() {
        let mut s = MemoryStore::default();
        s.stored(&observation(0, "p1", 0.0, 9), &[]);
        s.stored(&observation(1, "p2", 10.0, 1), &[]);
        s.stored(&observation(2, "p3", DAY_SECS, 1), &[]);
        let now = DAY_SECS + 20.0;
        // Three fit in three; a fourth evicts the least important old one (1), not 2 (young).
        assert_eq!(s.evictions(100, now, 3, u64::MAX), Ok(vec![1]));
        // Two would need 2 evictions, and only 0 and 1 are old enough.
        assert_eq!(s.evictions(100, now, 2, u64::MAX), Ok(vec![1, 0]));
        assert_eq!(s.evictions(100, now, 1, u64::MAX), Err(StoreFull));
        // Bytes too.
        let bytes = s.bytes;
        assert_eq!(s.evictions(0, now, 10, bytes - 1), Ok(vec![1]));
    }

    #[test]
    fn links_are_kept_both_ways_and_removed_with_their_memory_and_bytes_add_up() {
        let mut s = MemoryStore::default();
        s.stored(&observation(0, "p1", 0.0, 5), &[]);
        let mut m = observation(1, "p1", 1.0, 5);
        m.links = vec![0, 99];
        s.stored(&m, &[]);
        assert_eq!(s.memories[&1].links, vec![0]);
        assert_eq!(s.memories[&0].links, vec![1]);
        let sum = |s: &MemoryStore| s.memories.values().map(Memory::bytes).sum::<u64>();
        assert_eq!(s.bytes, sum(&s));
        s.forgotten(&[1], None);
        assert!(s.memories[&0].links.is_empty());
        assert_eq!(s.bytes, sum(&s));
        assert_eq!(s.profiles["p1"].heard, 2);
        s.forgotten(&s.about("p1"), Some("p1"));
        assert!(s.memories.is_empty() && s.profiles.is_empty() && s.bytes == 0);
    }

    #[test]
    fn compacting_drops_repeats_and_unimportant_unrecalled_old_observations() {
        let mut s = MemoryStore::default();
        s.stored(&observation(0, "p1", 0.0, 2), &[]); // old, unimportant, never recalled
        s.stored(&observation(1, "p2", 0.0, 2), &[]); // recalled: kept
        s.recalled(&[1], 10.0);
        s.stored(&observation(2, "p3", 0.0, 8), &[]); // important: kept
        s.stored(&observation(3, "p1", DAY_SECS, 5), &[]); // "hello from p1" again: 0 repeats it
        let mut m = observation(4, "p1", DAY_SECS + 1.0, 5);
        m.text = "HELLO   from p1".into();
        s.stored(&m, &[]);
        assert_eq!(s.compactable(DAY_SECS + 2.0), vec![0, 3]);
    }

    #[test]
    fn a_name_fills_the_profile_when_the_speaker_says_it_of_itself() {
        let mut s = MemoryStore::default();
        s.stored(&observation(0, "p1", 0.0, 5), &[]);
        let mut f = fact(1, "p1", "Aldric", 0.4, true, "p1");
        if let MemoryKind::Fact { predicate, .. } = &mut f.kind {
            *predicate = "name".into();
        }
        s.stored(&f, &[]);
        assert_eq!(s.profiles["p1"].name.as_deref(), Some("Aldric"));
        // Someone else's claim about p1's name does not.
        let mut g = fact(2, "p1", "Bob", 0.4, true, "p2");
        if let MemoryKind::Fact { predicate, .. } = &mut g.kind {
            *predicate = "name".into();
        }
        s.stored(&g, &[]);
        assert_eq!(s.profiles["p1"].name.as_deref(), Some("Aldric"));
    }

    /// A settled line's event is reused for the next kept one (its buffers: no allocation on the
    /// delivering thread), and a record is equal, cloned and serialized without its spares.
    #[test]
    fn settled_lines_lend_their_buffers_to_the_next_kept_ones() {
        use crate::{
            npc::{Perception, Rule, Verdict, WorldEvent, WorldEventKind},
            AgentRecord, EventKind,
        };
        let perceived = |text: &str| EventKind::Perceived {
            event: WorldEvent::player("p1", WorldEventKind::Say, text).in_room("forge"),
            perception: Perception {
                verdict: Verdict::Context,
                rule: Rule::Default,
                trust: 0.5,
                heuristic: false,
                downgraded: false,
                limited: None,
            },
            observe: Some(Observe {
                at: None,
                importance: 4,
            }),
        };
        let mut rec = AgentRecord::new("smith".into());
        rec.apply(&perceived("one line"));
        let buffer = rec.memory().unwrap().unwritten[0].event.text.as_ptr();
        rec.apply(&EventKind::ObservationNotStored {
            observed: 0,
            reason: "rate cap".into(),
        });
        assert!(rec.memory().unwrap().unwritten.is_empty());
        rec.apply(&perceived("two line"));
        let kept = &rec.memory().unwrap().unwritten[0].event;
        assert_eq!(kept.text, "two line");
        assert_eq!(kept.room.as_deref(), Some("forge"));
        assert_eq!(
            kept.text.as_ptr(),
            buffer,
            "the settled line's buffer, reused"
        );
        // Not part of what the record is.
        let mut fresh = AgentRecord::new("smith".into());
        for kind in [
            perceived("one line"),
            EventKind::ObservationNotStored {
                observed: 0,
                reason: "rate cap".into(),
            },
            perceived("two line"),
        ] {
            fresh.apply(&kind);
        }
        assert_eq!(rec, fresh);
        assert_eq!(rec.clone(), fresh);
        let json = serde_json::to_string(&rec).unwrap();
        assert!(!json.contains("spare"), "{json}");
    }

    /// A perception kept at delivery waits in `unwritten` (through a journal round trip, as
    /// JSON, the SQLite journal's format) until the `memory_stored` that writes it or an
    /// `observation_not_stored`; rows from before `observe`/`observed` existed still decode, and
    /// so do rows and records of versions whose delivery admitted the observation itself.
    #[test]
    fn a_kept_perception_waits_until_settled_and_survives_the_journal_format() {
        use crate::{
            npc::{Perception, Rule, Verdict, WorldEvent, WorldEventKind},
            AgentRecord, EventKind,
        };
        let perceived = |text: &str, at: Option<f64>| EventKind::Perceived {
            event: WorldEvent::player("p1", WorldEventKind::Whisper, text),
            perception: Perception {
                verdict: Verdict::Trigger,
                rule: Rule::DirectMessage,
                trust: 0.9,
                heuristic: false,
                downgraded: false,
                limited: None,
            },
            observe: Some(Observe { at, importance: 8 }),
        };
        let stored = |id: u64, observed: u64| EventKind::MemoryStored {
            memory: Box::new(observation(id, "p1", 10.0, 8)),
            evicted: Vec::new(),
            observed: Some(observed),
        };
        let round_trip = |kind: &EventKind| -> EventKind {
            serde_json::from_str(&serde_json::to_string(kind).unwrap()).unwrap()
        };
        let mut rec = AgentRecord::new("smith".into());
        for kind in [
            perceived("one", Some(10.0)),
            perceived("two", Some(20.0)),
            perceived("three", None),
        ] {
            rec.apply(&round_trip(&kind));
        }
        let store = rec.memory().unwrap();
        assert_eq!(store.unwritten.len(), 3);
        assert_eq!(store.kept, 3);
        assert_eq!(
            store.clock, 20.0,
            "memory time goes on from the newest admitted at delivery"
        );
        assert_eq!(store.unwritten[2].observe.at, None);
        assert_eq!(store.unwritten[1].event.text, "two");
        rec.apply(&round_trip(&stored(0, 0)));
        assert_eq!(rec.memory().unwrap().unwritten.len(), 2);
        rec.apply(&round_trip(&EventKind::ObservationNotStored {
            observed: 1,
            reason: "full".into(),
        }));
        assert_eq!(rec.memory().unwrap().unwritten.len(), 1);
        // The right to be forgotten reaches what was not written yet.
        rec.apply(&EventKind::MemoryForgotten {
            ids: Vec::new(),
            about: Some("p1".into()),
            by: "op".into(),
        });
        assert!(rec.memory().unwrap().unwritten.is_empty());
        // A snapshot of the record keeps them.
        let mut again = AgentRecord::new("smith".into());
        again.apply(&perceived("four", None));
        let json = serde_json::to_string(&again).unwrap();
        let snapshot: AgentRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(snapshot, again);
        // A record of a version that counted `admitted` observations reads as `kept`.
        let older: AgentRecord =
            serde_json::from_str(&json.replace("\"kept\"", "\"admitted\"")).unwrap();
        assert_eq!(older, again);
        // A row of such a version: admitted at memory time 5.
        let decided: EventKind = serde_json::from_str(
            r#"{"type":"perceived","event":{"speaker":{"id":"p1","kind":"player"},"kind":"whisper","text":"hi"},"perception":{"verdict":"TRIGGER","rule":"direct_message","trust":0.9},"observe":{"at":5.0,"importance":8}}"#,
        )
        .unwrap();
        assert!(matches!(
            decided,
            EventKind::Perceived {
                observe: Some(Observe {
                    at: Some(5.0),
                    importance: 8
                }),
                ..
            }
        ));
        // Rows from before: no `observe`, no `observed`.
        let old: EventKind = serde_json::from_str(
            r#"{"type":"perceived","event":{"speaker":{"id":"p1","kind":"player"},"kind":"whisper","text":"hi"},"perception":{"verdict":"TRIGGER","rule":"direct_message","trust":0.9}}"#,
        )
        .unwrap();
        assert!(matches!(old, EventKind::Perceived { observe: None, .. }));
    }
}
