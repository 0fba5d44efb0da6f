//! Reading rows back: decoding events, an event's fate, tails, agents, and folding an agent from its
//! latest snapshot and the events after it (restores and snapshots).

use super::*;

pub(super) fn decode(row: (u64, u64, String, String, String)) -> Result<Event, JournalError> {
    let (seq, at_ms, agent, kind, body) = row;
    let kind_value: EventKind = serde_json::from_str(&body).map_err(|e| JournalError::Decode {
        seq,
        kind,
        error: e.to_string(),
    })?;
    Ok(Event {
        seq,
        at_ms,
        agent: AgentKey::new(agent),
        kind: kind_value,
    })
}

/// One `events` row: seq, at_ms, agent, kind, body.
pub(super) type EventRow = (u64, u64, String, String, String);

pub(super) fn event_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
    Ok((
        r.get::<_, i64>(0)? as u64,
        r.get::<_, i64>(1)? as u64,
        r.get::<_, String>(2)?,
        r.get::<_, String>(3)?,
        r.get::<_, String>(4)?,
    ))
}

/// Events in `seq` order: all of them, or those of one agent.
pub(super) fn read_events(
    conn: &Connection,
    agent: Option<&str>,
) -> Result<Vec<Event>, JournalError> {
    let map = event_row;
    let rows: Vec<_> = match agent {
        Some(agent) => conn
            .prepare_cached(
                "SELECT seq, at_ms, agent, kind, body FROM events WHERE agent = ?1 ORDER BY seq",
            )?
            .query_map(params![agent], map)?
            .collect::<Result<_, _>>()?,
        None => conn
            .prepare_cached("SELECT seq, at_ms, agent, kind, body FROM events ORDER BY seq")?
            .query_map([], map)?
            .collect::<Result<_, _>>()?,
    };
    rows.into_iter().map(decode).collect()
}

/// What became of user event `id` of `agent` (`None`: never queued), read from its `event_queued`
/// on, a page at a time, until it is settled or the log ends.
pub(super) fn read_fate(
    conn: &Connection,
    agent: &str,
    id: u64,
) -> Result<Option<EventFate>, JournalError> {
    let queued: Option<i64> = conn
        .prepare_cached(
            "SELECT seq FROM events WHERE agent = ?1 AND kind = 'event_queued'
             AND json_extract(body, '$.id') = ?2 ORDER BY seq LIMIT 1",
        )?
        .query_row(params![agent, i64::try_from(id).unwrap_or(i64::MAX)], |r| {
            r.get(0)
        })
        .optional()?;
    let Some(mut from) = queued else {
        return Ok(None);
    };
    const PAGE: i64 = 512;
    let mut seen: Vec<Event> = Vec::new();
    loop {
        let rows: Vec<_> = conn
            .prepare_cached(
                "SELECT seq, at_ms, agent, kind, body FROM events WHERE agent = ?1 AND seq >= ?2
                 ORDER BY seq LIMIT ?3",
            )?
            .query_map(params![agent, from, PAGE], event_row)?
            .collect::<Result<_, _>>()?;
        let n = rows.len() as i64;
        let page = rows
            .into_iter()
            .map(decode)
            .collect::<Result<Vec<_>, _>>()?;
        from = page.last().map_or(from, |e| e.seq as i64 + 1);
        // The fold needs the events from the `event_queued` on (the lockout reason is read on the
        // way): keep what was read, it is bounded by how long the event stayed unsettled.
        seen.extend(page);
        let fate = EventFate::of_event(id, &seen);
        if n < PAGE || fate.as_ref().is_some_and(EventFate::is_settled) {
            return Ok(fate);
        }
    }
}

/// The last `n` events, oldest first.
pub(super) fn read_tail(conn: &Connection, n: usize) -> Result<Vec<Event>, JournalError> {
    let rows: Vec<_> = conn
        .prepare_cached(
            "SELECT seq, at_ms, agent, kind, body FROM
               (SELECT * FROM events ORDER BY seq DESC LIMIT ?1) ORDER BY seq",
        )?
        .query_map(params![i64::try_from(n).unwrap_or(i64::MAX)], event_row)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(decode).collect()
}

/// The last `n` events of `agent` (of all agents when `None`), oldest first.
pub(super) fn read_recent(
    conn: &Connection,
    agent: Option<&str>,
    n: usize,
) -> Result<Vec<Event>, JournalError> {
    let Some(agent) = agent else {
        return read_tail(conn, n);
    };
    let rows: Vec<_> = conn
        .prepare_cached(
            "SELECT seq, at_ms, agent, kind, body FROM
               (SELECT * FROM events WHERE agent = ?1 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
        )?
        .query_map(
            params![agent, i64::try_from(n).unwrap_or(i64::MAX)],
            event_row,
        )?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(decode).collect()
}

/// The `(at_ms, tokens)` of `agent`'s `usage_recorded` events at or after `since_ms`, oldest first
/// (see `Journal::recent_usage`): newest first along the `(agent, seq)` index until an older event.
pub(super) fn read_recent_usage(
    conn: &Connection,
    agent: &str,
    since_ms: u64,
) -> Result<Vec<(u64, u64)>, JournalError> {
    let mut stmt = conn.prepare_cached(
        "SELECT at_ms, kind, body FROM events WHERE agent = ?1 ORDER BY seq DESC",
    )?;
    let mut rows = stmt.query(params![agent])?;
    let mut calls = Vec::new();
    while let Some(row) = rows.next()? {
        let at_ms = u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0);
        if at_ms < since_ms {
            break;
        }
        if row.get_ref(1)?.as_str().ok() != Some("usage_recorded") {
            continue;
        }
        let body: String = row.get(2)?;
        if let Ok(EventKind::UsageRecorded { usage, .. }) = serde_json::from_str(&body) {
            calls.push((at_ms, usage.total()));
        }
    }
    calls.reverse();
    Ok(calls)
}

/// Agent keys in order of their first event: from the `agents` table (schema 2), or by scanning the
/// log (a read-only view of a schema-1 file).
pub(super) fn read_agents(
    conn: &Connection,
    has_agents_table: bool,
) -> Result<Vec<AgentKey>, JournalError> {
    let sql = if has_agents_table {
        "SELECT agent FROM agents ORDER BY first_seq"
    } else {
        "SELECT agent FROM events GROUP BY agent ORDER BY min(seq)"
    };
    let keys: Vec<String> = conn
        .prepare_cached(sql)?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<_, _>>()?;
    Ok(keys.into_iter().map(AgentKey::new).collect())
}

/// One agent rebuilt by [`fold_agent`].
pub(super) struct Folded {
    pub(super) record: AgentRecord,
    /// Seq of the last event folded in (0 if none).
    pub(super) last_seq: u64,
    /// The snapshot it started from, if one was used.
    pub(super) snapshot_seq: Option<u64>,
    /// Events read after the snapshot (all of the agent's events without one).
    pub(super) events_read: u64,
}

/// The agent's usable snapshot: its seq and record (`None` without one, or when it has another
/// format, cannot be decoded or is not this agent's: then the events are replayed from the start).
pub(super) fn read_snapshot(
    conn: &Connection,
    agent: &AgentKey,
) -> Result<Option<(u64, AgentRecord)>, JournalError> {
    let row: Option<(i64, u32, String)> = conn
        .prepare_cached("SELECT seq, format, record FROM snapshots WHERE agent = ?1")?
        .query_row(params![agent.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let Some((seq, format, json)) = row else {
        return Ok(None);
    };
    if format != SNAPSHOT_FORMAT {
        tracing::info!(agent = %agent, format, "snapshot of an older format ignored");
        return Ok(None);
    }
    match serde_json::from_str::<AgentRecord>(&json) {
        Ok(record) if record.key == *agent => Ok(Some((seq as u64, record))),
        Ok(record) => {
            tracing::warn!(agent = %agent, found = %record.key, "snapshot of another agent ignored");
            Ok(None)
        }
        Err(error) => {
            tracing::warn!(agent = %agent, seq, %error, "unreadable snapshot ignored");
            Ok(None)
        }
    }
}

/// Rebuilds one agent: its snapshot (when `snapshots`) and the events after it, folded one row at a
/// time.
pub(super) fn fold_agent(
    conn: &Connection,
    agent: &AgentKey,
    snapshots: bool,
) -> Result<Folded, JournalError> {
    let snapshot = if snapshots {
        read_snapshot(conn, agent)?
    } else {
        None
    };
    let snapshot_seq = snapshot.as_ref().map(|(seq, _)| *seq);
    let (mut record, after) = match snapshot {
        Some((seq, record)) => (record, seq),
        None => (AgentRecord::new(agent.clone()), 0),
    };
    let mut statement = conn.prepare_cached(
        "SELECT seq, at_ms, agent, kind, body FROM events
         WHERE agent = ?1 AND seq > ?2 ORDER BY seq",
    )?;
    let mut rows = statement.query(params![agent.as_str(), after as i64])?;
    let mut last_seq = after;
    let mut events_read = 0;
    while let Some(row) = rows.next()? {
        let event = decode(event_row(row)?)?;
        record.apply(&event.kind);
        last_seq = event.seq;
        events_read += 1;
    }
    Ok(Folded {
        record,
        last_seq,
        snapshot_seq,
        events_read,
    })
}

/// Every agent, in order of its first event, from its snapshot and the events after it.
pub(super) fn fold_all(conn: &Connection, schema: u32) -> Result<Vec<Folded>, JournalError> {
    let snapshots = schema >= 2;
    read_agents(conn, snapshots)?
        .iter()
        .map(|agent| fold_agent(conn, agent, snapshots))
        .collect()
}

/// Writes (or replaces) the agent's snapshot at `seq`.
pub(super) fn write_snapshot(
    conn: &Connection,
    agent: &AgentKey,
    seq: u64,
    record: &AgentRecord,
) -> Result<(), rusqlite::Error> {
    let json = serde_json::to_string(record)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO snapshots (agent, seq, format, at_ms, record)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        agent.as_str(),
        seq as i64,
        SNAPSHOT_FORMAT,
        now_ms() as i64,
        json
    ])?;
    Ok(())
}

/// How many of the agent's events follow its usable snapshot (all of them without one).
pub(super) fn events_since_snapshot(
    conn: &Connection,
    agent: &AgentKey,
) -> Result<u64, rusqlite::Error> {
    conn.prepare_cached(
        "SELECT count(*) FROM events WHERE agent = ?1 AND seq >
           coalesce((SELECT seq FROM snapshots WHERE agent = ?1 AND format = ?2), 0)",
    )?
    .query_row(params![agent.as_str(), SNAPSHOT_FORMAT], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n as u64)
}
