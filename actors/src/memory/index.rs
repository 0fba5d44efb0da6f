//! Relevance by BM25 over an SQLite FTS5 index (feature `fts`), one in-memory database per team.
//!
//! The index is derived state: it mirrors the memories of the team's agents' records (rebuilt
//! from them after a restart, whatever journal the team runs on, the in-memory one included) and
//! is never journaled. Each agent's rows have rowids `slot << 32 | memory id`, so a query is
//! limited to one agent by a rowid range, which FTS5 applies while it walks the index.
//! docs/design-decisions.md says why it lives here and not in the journal's database.

use rusqlite::{params, Connection};

/// An FTS5 table in a private in-memory SQLite database.
pub(crate) struct FtsIndex {
    conn: Connection,
}

impl std::fmt::Debug for FtsIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FtsIndex")
    }
}

/// The rowid of memory `id` of the agent in `slot` (`None`: an id past 2^32, not indexed).
fn rowid(slot: u32, id: u64) -> Option<i64> {
    (id <= u64::from(u32::MAX)).then(|| (i64::from(slot) << 32) | id as i64)
}

/// The words of `text` as an FTS5 query: each a quoted term, any of them (`"a" OR "b"`), at most
/// 32. Quoting makes every word a plain term, so no text (a player's included) is FTS5 syntax.
pub(crate) fn match_query(text: &str) -> Option<String> {
    let mut seen = Vec::new();
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 2)
        .map(str::to_lowercase)
    {
        if !seen.contains(&word) {
            seen.push(word);
        }
        if seen.len() == 32 {
            break;
        }
    }
    if seen.is_empty() {
        return None;
    }
    let terms: Vec<String> = seen.iter().map(|w| format!("\"{w}\"")).collect();
    Some(terms.join(" OR "))
}

impl FtsIndex {
    /// Opens the in-memory database with its table (`None`, logged, when SQLite cannot).
    pub(crate) fn open() -> Option<Self> {
        let open = || -> rusqlite::Result<Connection> {
            let conn = Connection::open_in_memory()?;
            conn.execute_batch(
                "CREATE VIRTUAL TABLE memories USING fts5(text, tokenize = 'porter unicode61');",
            )?;
            Ok(conn)
        };
        match open() {
            Ok(conn) => Some(FtsIndex { conn }),
            Err(error) => {
                tracing::warn!(%error, "memory index unavailable: recall ranks without relevance");
                None
            }
        }
    }

    /// Adds (or replaces) memory `id` of `slot`.
    pub(crate) fn insert(&self, slot: u32, id: u64, text: &str) {
        let Some(row) = rowid(slot, id) else { return };
        let result = self
            .conn
            .prepare_cached("DELETE FROM memories WHERE rowid = ?1")
            .and_then(|mut s| s.execute(params![row]))
            .and_then(|_| {
                self.conn
                    .prepare_cached("INSERT INTO memories(rowid, text) VALUES (?1, ?2)")
            })
            .and_then(|mut s| s.execute(params![row, text]));
        if let Err(error) = result {
            tracing::warn!(%error, "memory index insert failed");
        }
    }

    /// Removes memory `id` of `slot`.
    pub(crate) fn delete(&self, slot: u32, id: u64) {
        let Some(row) = rowid(slot, id) else { return };
        let result = self
            .conn
            .prepare_cached("DELETE FROM memories WHERE rowid = ?1")
            .and_then(|mut s| s.execute(params![row]));
        if let Err(error) = result {
            tracing::warn!(%error, "memory index delete failed");
        }
    }

    /// Removes every memory of `slot`.
    pub(crate) fn clear(&self, slot: u32) {
        let lo = i64::from(slot) << 32;
        let result = self
            .conn
            .prepare_cached("DELETE FROM memories WHERE rowid BETWEEN ?1 AND ?2")
            .and_then(|mut s| s.execute(params![lo, lo | i64::from(u32::MAX)]));
        if let Err(error) = result {
            tracing::warn!(%error, "memory index clear failed");
        }
    }

    /// The `limit` memories of `slot` most relevant to `text` by BM25, best first, with a score
    /// (higher is better: the negated `bm25()`).
    pub(crate) fn search(&self, slot: u32, text: &str, limit: usize) -> Vec<(u64, f64)> {
        let Some(query) = match_query(text) else {
            return Vec::new();
        };
        let lo = i64::from(slot) << 32;
        let run = || -> rusqlite::Result<Vec<(u64, f64)>> {
            let mut stmt = self.conn.prepare_cached(
                "SELECT rowid, bm25(memories) FROM memories WHERE memories MATCH ?1 \
                 AND rowid BETWEEN ?2 AND ?3 ORDER BY bm25(memories) LIMIT ?4",
            )?;
            let rows = stmt.query_map(
                params![query, lo, lo | i64::from(u32::MAX), limit as i64],
                |row| {
                    let rowid: i64 = row.get(0)?;
                    let score: f64 = row.get(1)?;
                    Ok(((rowid & i64::from(u32::MAX)) as u64, -score))
                },
            )?;
            rows.collect()
        };
        run().unwrap_or_else(|error| {
            tracing::warn!(%error, "memory search failed");
            Vec::new()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_plain_terms_whatever_the_text() {
        assert_eq!(
            match_query("Do you REMEMBER me? \"x\" OR NEAR(a b) *"),
            Some("\"do\" OR \"you\" OR \"remember\" OR \"me\" OR \"or\" OR \"near\"".into())
        );
        assert_eq!(match_query("? ! a"), None);
    }

    #[test]
    fn search_ranks_by_bm25_within_one_agent_only() {
        let index = FtsIndex::open().expect("fts5");
        index.insert(1, 0, "the blacksmith forged a sword for Aldric");
        index.insert(1, 1, "it rained all day in the village");
        index.insert(1, 2, "Aldric said his name twice: Aldric the bold");
        index.insert(2, 0, "Aldric is also known to another agent");
        let found = index.search(1, "who is aldric?", 10);
        let ids: Vec<u64> = found.iter().map(|f| f.0).collect();
        assert_eq!(ids, vec![2, 0]);
        assert!(found[0].1 > found[1].1);
        index.delete(1, 2);
        assert_eq!(index.search(1, "aldric", 10).len(), 1);
        index.clear(1);
        assert!(index.search(1, "aldric", 10).is_empty());
        assert_eq!(index.search(2, "aldric", 10).len(), 1);
    }
}
