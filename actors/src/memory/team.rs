//! [`TeamMemory`]: the runtime state of long-term memory that a team's agents share.

use parking_lot::Mutex;
use std::collections::HashMap;
use warden_protocols::{memory::MemoryStore, AgentKey};

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

/// What the agents of one team share of long-term memory: the FTS5 index (one in-memory SQLite
/// database, feature `fts`) with the embeddings, under one leaf mutex held for index work (a
/// write's links, a recall's search), which no delivery ever waits on. Each agent's live state
/// (rate windows, trust, the clock) is its own, in its cell ([`super::live::Live`]): a host's
/// delivery takes no lock the team shares.
#[derive(Debug, Default)]
pub(crate) struct TeamMemory {
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
}
