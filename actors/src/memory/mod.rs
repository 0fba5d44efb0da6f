//! Long-term memory per agent (issue 33, docs/memory.md): typed memories with importance, trust
//! and links, entity profiles, recall before each model call, and the `remember`, `recall` and
//! `forget` tools.
//!
//! The memories themselves are in the agent's record (`AgentRecord::memory`, folded from the
//! journal by `warden_protocols::memory`), so a restart restores them and a replay equals the live
//! agent. This module is the runtime around them, one small concept a file:
//!
//! * `team` — `TeamMemory`, what the team's agents share: the FTS5 index and the embeddings.
//! * `live` — `Live`, one agent's own live state, in its cell: its write rate windows, the trust
//!   of the speakers it heard, its memory clock and what it knows of its current turn.
//! * `index` — the FTS5 index (BM25 relevance), feature `fts`.
//! * `embed` — relevance by embeddings when the provider has an embedding model.
//! * `write` — storing an observation, a fact, a note: rate caps, importance, links, eviction.
//! * `recall` — choosing and quoting what a model call is shown.
//! * `tools` — the agent's own tools.
//! * `sleep` — consolidation while the NPC sleeps (compacting, then dreaming).
//!
//! Lock order: an agent's record → its `live` mutex or the team memory's mutex (each a leaf).
//!
//! The bounded history (emergency compaction, reflection: `agent/memory.rs`) is re-exported here
//! as it always was (`warden_actors::memory::SUMMARY_PROMPT`, …).

pub use crate::agent::memory::*;

pub mod embed;
mod handle;
#[cfg(feature = "fts")]
mod index;
pub(crate) mod live;
pub mod recall;
pub mod sleep;
mod team;
pub(crate) mod tools;
pub mod write;
pub use handle::MAX_LISTED;

pub(crate) use team::TeamMemory;
pub use warden_protocols::memory::{EntityProfile, Memory, MemoryKind, MemoryStore};
