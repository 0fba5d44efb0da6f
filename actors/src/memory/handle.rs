//! What operators and hosts can do with an agent's long-term memory through its
//! [`AgentHandle`]: read it, recall what the NPC would about someone, forget.

use crate::{agent::AgentHandle, NotDurable};
use warden_protocols::memory::{EntityProfile, Memory};

/// The most memories [`AgentHandle::memories`] returns.
pub const MAX_LISTED: usize = 200;

impl AgentHandle {
    /// The agent's memories: the `limit` (at most [`MAX_LISTED`]) most relevant to `query` by
    /// BM25 (none relevant: none), or the newest without one; only those about `about` (said by,
    /// about or asserted by that speaker id) when given. Reading does not count as recalling
    /// (nothing is journaled).
    pub fn memories(&self, query: Option<&str>, about: Option<&str>, limit: usize) -> Vec<Memory> {
        let limit = limit.min(MAX_LISTED);
        let cell = &self.cell;
        let rec = cell.memory_lock();
        let Some(store) = rec.memory() else {
            return Vec::new();
        };
        let keep = |m: &&Memory| about.is_none_or(|a| m.is_about(a));
        match query.map(str::trim).filter(|q| !q.is_empty()) {
            Some(q) => cell
                .safety
                .memory
                .search(&cell.key, Some(store), q, store.memories.len().max(1))
                .into_iter()
                .filter_map(|(id, _)| store.memories.get(&id))
                .filter(keep)
                .take(limit)
                .cloned()
                .collect(),
            None => store
                .memories
                .values()
                .rev()
                .filter(keep)
                .take(limit)
                .cloned()
                .collect(),
        }
    }

    /// What the agent knows of speaker `about` (its entity profile), if anything.
    pub fn profile(&self, about: &str) -> Option<EntityProfile> {
        self.cell
            .memory_lock()
            .memory()
            .and_then(|s| s.profiles.get(about).cloned())
    }

    /// What the agent would recall about speaker `about` (and `query`, when given) before a model
    /// call now, as the model would be shown it (`None`: nothing). For game logic; nothing is
    /// journaled.
    pub fn recall(&self, about: &str, query: Option<&str>) -> Option<String> {
        let cell = &self.cell;
        let k = usize::from(cell.settings.memory.recall_k.max(1));
        let rec = cell.memory_lock();
        cell.recall_for(&rec, query.unwrap_or(about), Some(about), k)
            .map(|r| r.text)
    }

    /// Forgets the memories `ids`, and everything about `about` with its profile (a player's
    /// right to be forgotten), journaled as `memory_forgotten` by `by`; resolves once that is on
    /// disk with the ids removed (empty: nothing to forget, nothing journaled).
    ///
    /// # Errors
    /// [`NotDurable`]: removed in memory, but the journal could not make it durable (after a crash
    /// the memories would be back).
    pub async fn forget_durable(
        &self,
        ids: &[u64],
        about: Option<&str>,
        by: &str,
    ) -> Result<Vec<u64>, NotDurable> {
        let (gone, seq) = self.cell.forget_memories(ids, about, by);
        if seq > 0 {
            self.cell.journal().durable(seq).await?;
        }
        Ok(gone)
    }
}
