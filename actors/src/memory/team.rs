//! [`TeamMemory`]: the runtime state of long-term memory that a team's agents share.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use tokio::time::{Duration, Instant};
use warden_protocols::{memory::MemoryStore, AgentKey};

/// The rate windows' length.
const MINUTE: Duration = Duration::from_secs(60);

/// The most speakers whose write windows an agent keeps (the quietest go first).
const MAX_SPEAKERS: usize = 1024;

/// The maps a host's delivery looks up (by agent, by speaker): foldhash, seeded per process,
/// instead of SipHash — hashing was most of a delivery's memory work (docs/memory.md, "Cost").
/// Bounded (`MAX_SPEAKERS`), so a crafted set of colliding names costs a bounded scan.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A sliding window of writes, each kept as the instant it leaves the window (its write + a
/// minute): counting compares instants, which costs a delivery less than a duration per write.
#[derive(Debug, Default)]
struct Window(VecDeque<Instant>);

impl Window {
    /// The writes of the last minute before `now`.
    fn count(&mut self, now: Instant) -> usize {
        while self.0.front().is_some_and(|expires| *expires <= now) {
            self.0.pop_front();
        }
        self.0.len()
    }

    /// A write at `at`.
    fn push(&mut self, at: Instant) {
        self.0.push_back(at + MINUTE);
    }
}

/// What an agent keeps of one speaker: its write window and the trust of its latest perceived
/// TRIGGER or CONTEXT. One map entry for both, so a delivery looks the speaker up once (and a new
/// speaker costs one key): in the MUD benchmark nearly every admitted observation is the first
/// from its speaker to that NPC, and its cold lookups and allocations were most of a delivery's
/// memory work (docs/memory.md, "Cost").
#[derive(Debug, Default)]
struct Speaker {
    window: Window,
    trust: Option<f64>,
}

/// One agent's live memory state (not journaled): rate windows, the clock's anchor, what it
/// knows of its turn. Touched by a host's delivery, so never held across index work.
#[derive(Debug, Default)]
struct Live {
    /// The windows were seeded from the record ([`Live::seed`]).
    seeded: bool,
    writes: Window,
    /// At most [`MAX_SPEAKERS`]; when full, the speakers with no write in the last minute go.
    speakers: FastMap<String, Speaker>,
    /// The memory clock's anchor: (real instant, memory time then).
    anchor: Option<(Instant, f64)>,
    /// The lowest trust of the CONTEXT events perceived since the last turn started (what a
    /// tick's turn sees).
    context_trust: Option<f64>,
    /// The current turn: who it answers (`None`: a tick or an operator's request) and the trust
    /// of that source.
    turn: Option<(Option<String>, f64)>,
}

impl Live {
    /// See [`TeamMemory::now`].
    fn now(&mut self, clock: f64, speed: f64) -> f64 {
        self.now_at(Instant::now(), clock, speed)
    }

    /// The memory time at `now`.
    fn now_at(&mut self, now: Instant, clock: f64, speed: f64) -> f64 {
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            1.0
        };
        let (at, base) = *self.anchor.get_or_insert((now, clock));
        base + now.duration_since(at).as_secs_f64() * speed
    }

    /// A restart (or the first delivery in this process): the rate windows start from the
    /// memories of the last minute of memory time (and the observations admitted, not written),
    /// so a restart does not hand every speaker its quota again. Memory time does not count the
    /// downtime, so this errs on the strict side.
    fn seed(&mut self, store: &MemoryStore, speed: f64) {
        self.seeded = true;
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            1.0
        };
        let now = Instant::now();
        let since = store.clock - MINUTE.as_secs_f64() * speed;
        let mut recent: Vec<(f64, Option<&str>)> = store
            .memories
            .values()
            .rev()
            .take_while(|m| m.at > since)
            .map(|m| {
                let speaker = match &m.kind {
                    warden_protocols::memory::MemoryKind::Observation { speaker, .. } => {
                        Some(speaker.as_str())
                    }
                    _ => None,
                };
                (m.at, speaker)
            })
            .collect();
        recent.extend(
            store
                .unwritten
                .iter()
                .filter(|u| u.observe.at > since)
                .map(|u| (u.observe.at, Some(u.event.speaker.id.as_str()))),
        );
        recent.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (at, speaker) in recent {
            let age = ((store.clock - at) / speed).max(0.0);
            let Some(instant) = now.checked_sub(Duration::from_secs_f64(age)) else {
                continue;
            };
            self.writes.push(instant);
            if let Some(speaker) = speaker {
                if self.speakers.len() < MAX_SPEAKERS || self.speakers.contains_key(speaker) {
                    self.speakers
                        .entry(speaker.to_owned())
                        .or_default()
                        .window
                        .push(instant);
                }
            }
        }
    }

    /// See [`TeamMemory::admit`].
    fn admit(&mut self, speaker: Option<&str>, per_agent: u32, per_speaker: u32) -> bool {
        self.admit_at(Instant::now(), speaker, per_agent, per_speaker)
    }

    /// [`Live::admit`] at `now`.
    fn admit_at(
        &mut self,
        now: Instant,
        speaker: Option<&str>,
        per_agent: u32,
        per_speaker: u32,
    ) -> bool {
        match speaker {
            Some(speaker) => self.admit_speaker(now, speaker, None, (per_agent, per_speaker)),
            None if self.writes.count(now) >= per_agent as usize => false,
            None => {
                self.writes.push(now);
                true
            }
        }
    }

    /// `f` on `speaker`'s entry, made when new — `None` (and `f` not run) when it is new and
    /// [`MAX_SPEAKERS`] spoke in the last minute.
    fn with_speaker<R>(
        &mut self,
        now: Instant,
        speaker: &str,
        f: impl FnOnce(&mut Speaker) -> R,
    ) -> Option<R> {
        if let Some(entry) = self.speakers.get_mut(speaker) {
            return Some(f(entry));
        }
        if self.speakers.len() >= MAX_SPEAKERS {
            self.speakers.retain(|_, s| s.window.count(now) > 0);
            if self.speakers.len() >= MAX_SPEAKERS {
                return None;
            }
        }
        Some(f(self.speakers.entry(speaker.to_owned()).or_default()))
    }

    /// One lookup of `speaker`: its `trust` noted (when given), then whether a write from it fits
    /// the caps (counted when it does).
    fn admit_speaker(
        &mut self,
        now: Instant,
        speaker: &str,
        trust: Option<f64>,
        (per_agent, per_speaker): (u32, u32),
    ) -> bool {
        let agent_full = self.writes.count(now) >= per_agent as usize;
        let admitted = self.with_speaker(now, speaker, |entry| {
            if trust.is_some() {
                entry.trust = trust;
            }
            if agent_full || entry.window.count(now) >= per_speaker as usize {
                return false;
            }
            entry.window.push(now);
            true
        });
        if admitted != Some(true) {
            return false;
        }
        self.writes.push(now);
        true
    }
}

/// One agent's part of the index (derived state).
#[derive(Debug)]
struct Indexed {
    /// Its rowid prefix in the index.
    slot: u32,
    /// Memories of its record now in the index (`usize::MAX`: not indexed yet).
    indexed: usize,
    /// The embedding of the latest query embedded (its text, its vector).
    query: Option<(String, Vec<f32>)>,
}

/// What the agents of one team share of long-term memory: each agent's [`Live`] state, and the
/// FTS5 index (one in-memory SQLite database, feature `fts`) with the embeddings. Two mutexes,
/// both leaves: `live` is held for a few instructions (a host's delivery takes it: rate caps,
/// trust, the clock), `index` for index work (a write's links, a recall's search), which no
/// delivery ever waits on.
#[derive(Debug, Default)]
pub(crate) struct TeamMemory {
    live: Mutex<FastMap<AgentKey, Live>>,
    index: Mutex<Index>,
}

#[derive(Debug, Default)]
struct Index {
    /// `None` until first used; `Some(None)` when SQLite could not open one.
    #[cfg(feature = "fts")]
    fts: Option<Option<super::index::FtsIndex>>,
    agents: HashMap<AgentKey, Indexed>,
    next_slot: u32,
    /// Embeddings of memories, by (slot, id): derived state (embedded again after a restart).
    vectors: HashMap<(u32, u64), Vec<f32>>,
}

impl Index {
    fn agent(&mut self, key: &AgentKey) -> &mut Indexed {
        let next = &mut self.next_slot;
        self.agents.entry(key.clone()).or_insert_with(|| {
            let slot = *next;
            *next = next.wrapping_add(1);
            Indexed {
                slot,
                indexed: usize::MAX,
                query: None,
            }
        })
    }

    #[cfg(feature = "fts")]
    fn fts(&mut self) -> Option<&super::index::FtsIndex> {
        self.fts
            .get_or_insert_with(super::index::FtsIndex::open)
            .as_ref()
    }

    /// Brings `key`'s part of the index level with `store` when it is not (a restart, a fresh
    /// agent under a key used before): everything again.
    #[cfg(feature = "fts")]
    fn sync(&mut self, key: &AgentKey, store: Option<&MemoryStore>) -> Option<u32> {
        let len = store.map_or(0, |s| s.memories.len());
        let (slot, indexed) = {
            let agent = self.agent(key);
            (agent.slot, agent.indexed)
        };
        if indexed != len {
            let fts = self.fts()?;
            fts.clear(slot);
            for m in store.into_iter().flat_map(|s| s.memories.values()) {
                fts.insert(slot, m.id, &m.text);
            }
            self.agent(key).indexed = len;
        }
        Some(slot)
    }
}

impl TeamMemory {
    /// Memory time now for `key` (game seconds at `speed` game seconds a real second): on from
    /// the store's clock (its newest memory) when the agent first uses memory in this process.
    pub(crate) fn now(&self, key: &AgentKey, store: Option<&MemoryStore>, speed: f64) -> f64 {
        let clock = store.map_or(0.0, |s| s.clock);
        self.live
            .lock()
            .entry(key.clone())
            .or_default()
            .now(clock, speed)
    }

    /// Whether one more write for `key` (from `speaker`, when an observation) fits the rate caps
    /// per agent (`per_agent`) and per speaker (`per_speaker`) per minute; counted when it does.
    pub(crate) fn admit(
        &self,
        key: &AgentKey,
        speaker: Option<&str>,
        per_agent: u32,
        per_speaker: u32,
    ) -> bool {
        self.live
            .lock()
            .entry(key.clone())
            .or_default()
            .admit(speaker, per_agent, per_speaker)
    }

    /// `key` perceived a TRIGGER or CONTEXT (`context`) event of `speaker` at `trust`: noted as
    /// the speaker's latest trust (and the lowest CONTEXT trust of the next turn), then the rate
    /// caps decide whether it is admitted as an observation — at the memory time returned. One
    /// short hold of the `live` lock: this runs on a host's delivery.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn perceived(
        &self,
        key: &AgentKey,
        speaker: &str,
        trust: f64,
        context: bool,
        (per_agent, per_speaker): (u32, u32),
        store: Option<&MemoryStore>,
        speed: f64,
    ) -> Option<f64> {
        let mut lives = self.live.lock();
        // No key clone (an `Arc` count both threads touch) unless the agent is new.
        let live = match lives.get_mut(key) {
            Some(live) => live,
            None => lives.entry(key.clone()).or_default(),
        };
        if !live.seeded {
            match store {
                Some(store) => live.seed(store, speed),
                None => live.seeded = true,
            }
        }
        let clock = store.map_or(0.0, |s| s.clock);
        if context {
            live.context_trust = Some(live.context_trust.map_or(trust, |t| t.min(trust)));
        }
        // One reading of the clock for the caps and the memory time.
        let now = Instant::now();
        live.admit_speaker(now, speaker, Some(trust), (per_agent, per_speaker))
            .then(|| live.now_at(now, clock, speed))
    }

    /// The lowest trust of the CONTEXT events perceived since the last call (a turn starts).
    pub(crate) fn take_context_trust(&self, key: &AgentKey) -> Option<f64> {
        self.live
            .lock()
            .get_mut(key)
            .and_then(|l| l.context_trust.take())
    }

    /// The trust of `speaker`'s latest perceived event, if any.
    pub(crate) fn trust_of(&self, key: &AgentKey, speaker: &str) -> Option<f64> {
        self.live
            .lock()
            .get(key)
            .and_then(|l| l.speakers.get(speaker).and_then(|s| s.trust))
    }

    /// A turn starts: it answers `speaker` (`None`: a tick or an operator) whose source has
    /// `trust`.
    pub(crate) fn set_turn(&self, key: &AgentKey, speaker: Option<String>, trust: f64) {
        self.live.lock().entry(key.clone()).or_default().turn = Some((speaker, trust));
    }

    /// Who the current turn answers and the trust of that source.
    pub(crate) fn turn(&self, key: &AgentKey) -> Option<(Option<String>, f64)> {
        self.live.lock().get(key).and_then(|l| l.turn.clone())
    }

    /// The `limit` memories of `key` most relevant to `text` (BM25, best first), with scores;
    /// empty without the `fts` feature or an index.
    pub(crate) fn search(
        &self,
        key: &AgentKey,
        store: Option<&MemoryStore>,
        text: &str,
        limit: usize,
    ) -> Vec<(u64, f64)> {
        #[cfg(feature = "fts")]
        {
            let mut inner = self.index.lock();
            let Some(slot) = inner.sync(key, store) else {
                return Vec::new();
            };
            inner
                .fts()
                .map(|f| f.search(slot, text, limit))
                .unwrap_or_default()
        }
        #[cfg(not(feature = "fts"))]
        {
            let _ = (key, store, text, limit);
            Vec::new()
        }
    }

    /// [`TeamMemory::search`] ahead of taking the agent's record lock (a search takes up to
    /// hundreds of microseconds, and a host's delivery to the agent waits for that lock): `None`
    /// when `key`'s part of the index was never built (then search under the lock). The hits may
    /// miss a memory written meanwhile or name one removed meanwhile: the caller checks, under
    /// the record lock, that the index is level with the record ([`TeamMemory::level`]) and drops
    /// ids the store no longer has.
    pub(crate) fn search_ahead(
        &self,
        key: &AgentKey,
        text: &str,
        limit: usize,
    ) -> Option<Vec<(u64, f64)>> {
        #[cfg(feature = "fts")]
        {
            let mut inner = self.index.lock();
            let agent = inner.agents.get(key)?;
            if agent.indexed == usize::MAX {
                return None;
            }
            let slot = agent.slot;
            inner.fts().map(|f| f.search(slot, text, limit))
        }
        #[cfg(not(feature = "fts"))]
        {
            let _ = (key, text, limit);
            None
        }
    }

    /// Whether `key`'s part of the index holds `len` memories (its record's count).
    pub(crate) fn level(&self, key: &AgentKey, len: usize) -> bool {
        self.index
            .lock()
            .agents
            .get(key)
            .is_some_and(|a| a.indexed == len)
    }

    /// The hits of a [`TeamMemory::search_ahead`] if they stand for `store` (the index level
    /// with it; ids it no longer has dropped), else a search under the caller's record lock.
    pub(crate) fn hits(
        &self,
        key: &AgentKey,
        store: &MemoryStore,
        text: &str,
        limit: usize,
        ahead: Option<Vec<(u64, f64)>>,
    ) -> Vec<(u64, f64)> {
        match ahead {
            Some(mut hits) if self.level(key, store.memories.len()) => {
                hits.retain(|(id, _)| store.memories.contains_key(id));
                hits
            }
            _ => self.search(key, Some(store), text, limit),
        }
    }

    /// Up to `limit` memories of `store` (newest first) with no embedding yet: (id, text).
    pub(crate) fn unembedded(
        &self,
        key: &AgentKey,
        store: &MemoryStore,
        limit: usize,
    ) -> Vec<(u64, String)> {
        let mut inner = self.index.lock();
        let slot = inner.agent(key).slot;
        store
            .memories
            .values()
            .rev()
            .filter(|m| !inner.vectors.contains_key(&(slot, m.id)))
            .take(limit)
            .map(|m| (m.id, m.text.clone()))
            .collect()
    }

    /// Whether `text` is the query embedded last.
    pub(crate) fn has_query(&self, key: &AgentKey, text: &str) -> bool {
        self.index
            .lock()
            .agent(key)
            .query
            .as_ref()
            .is_some_and(|(q, _)| q == text)
    }

    /// Keeps the embeddings of memories and of the query `text`.
    pub(crate) fn embedded(
        &self,
        key: &AgentKey,
        memories: Vec<(u64, Vec<f32>)>,
        query: Option<(String, Vec<f32>)>,
    ) {
        let mut inner = self.index.lock();
        let slot = inner.agent(key).slot;
        for (id, v) in memories {
            inner.vectors.insert((slot, id), v);
        }
        if query.is_some() {
            inner.agent(key).query = query;
        }
    }

    /// The `limit` memories of `store` nearest to the query `text` by cosine similarity, best
    /// first — `None` unless `text` is the query embedded last (then recall uses BM25).
    pub(crate) fn nearest(
        &self,
        key: &AgentKey,
        store: &MemoryStore,
        text: &str,
        limit: usize,
    ) -> Option<Vec<(u64, f64)>> {
        let mut inner = self.index.lock();
        let agent = inner.agent(key);
        let slot = agent.slot;
        let query = match &agent.query {
            Some((q, v)) if q == text => v.clone(),
            _ => return None,
        };
        let mut hits: Vec<(u64, f64)> = store
            .memories
            .keys()
            .filter_map(|id| {
                let v = inner.vectors.get(&(slot, *id))?;
                Some((*id, cosine(&query, v)))
            })
            .filter(|(_, c)| *c > 0.0)
            .collect();
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
        hits.truncate(limit);
        Some(hits)
    }

    /// The record of `key` changed its memories from `before` ids to `store`: the index follows
    /// (the ids removed are deleted, `added` indexed if the store kept it).
    pub(crate) fn changed(
        &self,
        key: &AgentKey,
        store: Option<&MemoryStore>,
        removed: &[u64],
        added: Option<u64>,
    ) {
        let mut inner = self.index.lock();
        let slot = inner.agent(key).slot;
        for id in removed {
            inner.vectors.remove(&(slot, *id));
        }
        #[cfg(feature = "fts")]
        {
            let indexed = inner.agent(key).indexed;
            if indexed == usize::MAX {
                // Not indexed yet: the first search indexes everything.
                return;
            }
            let Some(fts) = inner.fts() else { return };
            for id in removed {
                fts.delete(slot, *id);
            }
            if let Some(m) = added.and_then(|id| store.and_then(|s| s.memories.get(&id))) {
                fts.insert(slot, m.id, &m.text);
            }
            inner.agent(key).indexed = store.map_or(0, |s| s.memories.len());
        }
        #[cfg(not(feature = "fts"))]
        {
            let _ = (store, added);
        }
    }
}

/// Cosine similarity (0 when either vector is zero or they differ in length).
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_is_one_for_the_same_direction_and_zero_for_orthogonal_or_mismatched() {
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-9);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 3.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_caps_hold_per_speaker_and_per_agent_over_a_sliding_minute() {
        let team = TeamMemory::default();
        let npc = AgentKey::new("smith");
        let admitted = |speaker| {
            (0..100)
                .filter(|_| team.admit(&npc, Some(speaker), 5, 2))
                .count()
        };
        assert_eq!(admitted("p1"), 2);
        assert_eq!(admitted("p2"), 2);
        assert_eq!(admitted("p3"), 1, "the agent's cap of 5 a minute");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(admitted("p1"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_speakers_trust_and_window_are_kept_within_the_bound_of_recent_speakers() {
        let team = TeamMemory::default();
        let npc = AgentKey::new("smith");
        let perceive = |speaker: &str, trust| {
            team.perceived(&npc, speaker, trust, false, (u32::MAX, 1), None, 1.0)
                .is_some()
        };
        assert!(perceive("p0", 0.9));
        assert!(!perceive("p0", 0.4), "one a minute from p0");
        assert_eq!(
            team.trust_of(&npc, "p0"),
            Some(0.4),
            "noted even when capped"
        );
        for i in 1..MAX_SPEAKERS {
            assert!(perceive(&format!("p{i}"), 0.5));
        }
        // Every speaker kept wrote in the last minute: a new one is neither admitted nor kept.
        assert!(!perceive("late", 0.7));
        assert_eq!(team.trust_of(&npc, "late"), None);
        assert_eq!(team.trust_of(&npc, "p1"), Some(0.5));
        tokio::time::advance(Duration::from_secs(61)).await;
        // A minute later the quiet ones make room.
        assert!(perceive("late", 0.7));
        assert_eq!(team.trust_of(&npc, "late"), Some(0.7));
        assert_eq!(team.trust_of(&npc, "p0"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_time_runs_at_the_clock_speed_from_the_store_clock() {
        let team = TeamMemory::default();
        let npc = AgentKey::new("smith");
        let store = MemoryStore {
            clock: 1000.0,
            ..MemoryStore::default()
        };
        assert_eq!(team.now(&npc, Some(&store), 60.0), 1000.0);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(team.now(&npc, Some(&store), 60.0), 1600.0);
    }
}
