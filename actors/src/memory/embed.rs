//! Relevance by embeddings, when the agent's provider has an embedding model
//! (`[providers.NAME] embedding_model`; the scripted provider's `with_embeddings` for tests):
//! before each model call of a turn, one embedding call embeds the query (the newest user message)
//! and up to [`EMBED_BATCH`] memories that have no embedding yet; recall then ranks by cosine
//! similarity instead of BM25. The vectors are derived state kept in `TeamMemory` (a restart
//! embeds the memories again, a batch a call); the call's tokens count against the budgets, a
//! budget that would stop the agent refuses it, a halt cancels it, and a failed call leaves that
//! model call's recall on BM25.

use crate::agent::{cell::AgentCell, memory::budgets_allow_tokens};
use tokio_util::sync::CancellationToken;
use warden_protocols::{ChatRole, CHARS_PER_TOKEN};

/// The most memories embedded in one call (besides the query).
pub const EMBED_BATCH: usize = 64;

/// Embeds the query and a batch of memories if the provider can (see the module docs). `false`:
/// a halt came (the turn ends).
pub(crate) async fn prepare(cell: &AgentCell, token: &CancellationToken) -> bool {
    let config = &cell.settings.memory;
    if !config.long_term || config.recall_k == 0 {
        return true;
    }
    let (query, missing) = {
        let rec = cell.memory_lock();
        let Some(store) = rec.memory() else {
            return true;
        };
        let query = rec
            .history
            .iter()
            .rev()
            .find(|m| m.role == ChatRole::User)
            .and_then(|m| m.content.clone())
            .unwrap_or_default();
        let missing = cell.safety.memory.unembedded(&cell.key, store, EMBED_BATCH);
        (query, missing)
    };
    // Another iteration of the same turn: nothing new to embed.
    if missing.is_empty() && cell.safety.memory.has_query(&cell.key, &query) {
        return true;
    }
    let mut texts = Vec::with_capacity(missing.len() + 1);
    texts.push(query.clone());
    texts.extend(missing.iter().map(|(_, t)| t.clone()));
    let estimate = texts
        .iter()
        .map(|t| t.len() as u64 / CHARS_PER_TOKEN + 1)
        .sum();
    if !budgets_allow_tokens(cell, estimate) {
        return true;
    }
    let Some(call) = cell.provider.embed(texts) else {
        return true;
    };
    let result = tokio::select! {
        biased;
        _ = token.cancelled() => return false,
        result = call => result,
    };
    match result {
        Ok(embedded) if embedded.vectors.len() == missing.len() + 1 => {
            cell.record_usage(embedded.usage);
            let mut vectors = embedded.vectors.into_iter();
            let query_vector = vectors.next().map(|v| (query, v));
            let memories = missing.into_iter().map(|(id, _)| id).zip(vectors).collect();
            cell.safety
                .memory
                .embedded(&cell.key, memories, query_vector);
        }
        Ok(embedded) => {
            cell.record_usage(embedded.usage);
            tracing::warn!(agent = %cell.key, "embedding call answered the wrong number of vectors");
        }
        Err(error) => {
            tracing::warn!(agent = %cell.key, %error, "embedding call failed; recall uses BM25");
        }
    }
    true
}
