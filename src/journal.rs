//! The durable journal: [`SqliteJournal`], an append-only event log in SQLite (WAL mode) with
//! per-agent snapshots, and the read-only inspection behind `warden journal tail|show|export`.
//!
//! Appends are cheap: [`Journal::append`] assigns the sequence number, queues the event and returns.
//! A writer thread drains the queue and commits everything queued so far in one transaction (group
//! commit), so a busy fleet is not bound by one fsync per event. `append` never waits for the disk:
//! callers hold the agent's record lock, which host threads take too (`try_send_event`, `status`).
//! What must be on disk before it is acknowledged — a halt, an unlock, a resume, the other operator
//! controls (the events of [`must_be_durable`]) — is waited for afterwards, off every lock, with
//! [`Journal::durable`], and the acknowledgement says whether it landed.
//!
//! # Waking the writer
//!
//! An append does not wake an active writer: after a batch the writer comes back by itself every
//! `LINGER` (2 ms) and writes what gathered, for `IDLE_AFTER` (50 ms); only then does it sleep
//! until an append wakes it. A wait for durability ([`Journal::durable`], [`SqliteJournal::flush`])
//! wakes it at once. So a host thread's `try_send_event` costs no futex wake-up and is not preempted
//! by the writer it would have woken (on 2 cores that took the p99 of `try_send_event` + `status`
//! from 89 µs to 22 µs, the in-memory journal's 20 µs: `benches/host_calls.rs`), an acknowledged
//! halt is written as soon as it is asked for, and an event nobody waits for is on disk within
//! 2 ms of a busy writer's last batch, at once otherwise.
//!
//! # Opening
//!
//! A file journal is opened by one writer at a time: [`SqliteJournal::open`] takes an exclusive
//! [`JournalLock`] on `<db>.lock` (holding the pid) before it touches the database, and keeps it
//! until the journal is dropped; a second writer gets [`JournalError::InUse`]. Readers
//! ([`JournalReader`]) take no lock. Then `PRAGMA quick_check` must answer `ok`, else the file is
//! refused with [`JournalError::Corrupt`], one line naming the file and how to recover.
//!
//! # Snapshots
//!
//! The `snapshots` table holds at most one row per agent: its [`AgentRecord`] as JSON at sequence
//! number `seq`. Invariants:
//!
//! * a snapshot at `seq` S reflects exactly the agent's events with `seq` ≤ S (S is the agent's
//!   last event folded into it): it is written in the same transaction as the events it covers, so it
//!   is never ahead of or behind them, and it is only replaced by a later one;
//! * the `events` table is never rewritten or pruned: a snapshot is derived data, the events stay the
//!   audit truth (`warden journal show` compares the two);
//! * a snapshot whose `format` is not [`SNAPSHOT_FORMAT`], or that cannot be decoded, is ignored: the
//!   agent is replayed from its first event (and the restore snapshots it again);
//! * every agent with an event has a row in `agents` (key, first seq), written with its first event,
//!   so a restore lists agents without scanning the log.
//!
//! The writer counts, per agent, the events since its last snapshot (one map entry per agent that
//! appended in this process; nothing else is kept in memory). When a batch brings an agent to
//! [`JournalOptions::snapshot_every`] (`journal.snapshot_every`, default 1000; 0 = never), the same
//! transaction folds the agent's latest snapshot and the events after it and writes the new snapshot.
//!
//! On start, [`SqliteJournal::restore_records`] rebuilds every agent from its latest snapshot and only
//! the events after it, so a restart reads fewer than `snapshot_every` events per agent (plus one
//! snapshot), however long the history. The result equals [`AgentRecord::replay`] of the full log
//! (tested on random event sequences). [`SqliteJournal::recover_records`] additionally ends what a
//! crash interrupted; hand each record to [`crate::AgentSpec::restored_from`]. A locked-out or stopped
//! agent comes back locked out or stopped.
//!
//! # Pending events
//!
//! An accepted user event is journaled (`event_queued`) and is pending in the record until exactly
//! one of taken (`event_taken`, committed in one batch with its `history_appended`: see
//! [`Journal::append_all`]), discarded (`halted`) or refused (`work_refused` with its id) settles it.
//! Restored records carry their pending events (snapshots included), and `restored_from` queues them
//! again. `event_queued` is not in [`must_be_durable`] — senders inside an actor must not wait on the
//! disk — but [`Journal::durable`] resolves once a given seq is committed, without blocking a thread:
//! the API waits on it before its `202`.
//!
//! # Write failures
//!
//! The writer retries a failed batch three times (40, 80, 160 ms apart); then the journal is
//! *degraded* ([`Journal::degraded`]): the error is logged, counted
//! ([`JournalStats::failed_batches`]) and kept ([`SqliteJournal::last_error`]); [`Journal::durable`]
//! answers [`NotDurable::WriteFailed`] at once for every event not yet committed (so no
//! acknowledgement claims a durability it does not have, and none hangs); agents accept no event
//! and start no turn. The batch is never dropped while the journal is open: the writer keeps trying it
//! every 250 ms, later events queued behind it in order, so when the disk comes back the file holds
//! every event in order (replay equals live, nothing to heal) and only then does the degraded mode
//! end. A journal closed while degraded tries a few more times, then drops what it could not write
//! (logged; [`NotDurable::WriteFailed`] for those, [`NotDurable::Closed`] for events appended after
//! [`SqliteJournal::close`]).

use futures::future::BoxFuture;
use parking_lot::{Condvar, Mutex};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};
use warden_actors::{now_ms, Journal, NotDurable};
use warden_protocols::{
    AgentKey, AgentRecord, AgentState, Event, EventFate, EventKind, JournalConfig,
};

/// The schema version this build writes. [`migrate`] brings older files up to it.
pub const SCHEMA_VERSION: u32 = 3;

/// The meaning of a snapshot's `record` JSON. Bump it whenever [`AgentRecord`] or
/// [`AgentRecord::apply`] changes meaning: older snapshots are then ignored and rebuilt from events.
///
/// Pending events (`pending`, `last_event_id`) did not bump it: both fields are omitted when empty
/// and default to empty, and a snapshot written before them covers only events of a build that never
/// journaled `event_queued`, whose fold has no pending events — so an old snapshot is still exactly
/// the fold of its events under the new `apply`. Spent budgets (`usage`, folded from `usage_recorded`)
/// did not bump it for the same reason: omitted while zero, absent = zero, and no older build
/// journaled `usage_recorded`.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// The default of [`JournalOptions::snapshot_every`] (`journal.snapshot_every`).
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 1000;

/// `MIGRATIONS[i]` takes a database from version `i` to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 → 1: the event log.
    "CREATE TABLE events (
        seq   INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        agent TEXT    NOT NULL,
        kind  TEXT    NOT NULL,
        body  JSON    NOT NULL
    );
    CREATE INDEX events_agent ON events(agent, seq);",
    // 1 → 2: the agent list and one snapshot per agent. Existing events are kept as they are; the
    // agents get snapshots as they cross `snapshot_every` (or at the first restore).
    "CREATE TABLE agents (
        agent     TEXT    PRIMARY KEY,
        first_seq INTEGER NOT NULL
    );
    INSERT INTO agents (agent, first_seq) SELECT agent, min(seq) FROM events GROUP BY agent;
    CREATE INDEX agents_first ON agents(first_seq);
    CREATE TABLE snapshots (
        agent  TEXT    PRIMARY KEY,
        seq    INTEGER NOT NULL,
        format INTEGER NOT NULL,
        at_ms  INTEGER NOT NULL,
        record JSON    NOT NULL
    );",
    // 2 → 3: find a user event's `event_queued` by its id (what became of an event, by id).
    "CREATE INDEX events_queued ON events(agent, json_extract(body, '$.id'))
        WHERE kind = 'event_queued';",
];

/// The cause journaled when [`SqliteJournal::recover_records`] ends a turn a crash interrupted.
pub use warden_protocols::RECOVERY_CAUSE;

/// Where a journal is kept by default (`warden journal --db`).
pub const DEFAULT_DB: &str = "./warden.db";

/// Why the journal could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error(
        "journal {path}: schema version {found} is newer than this warden supports ({supported})"
    )]
    NewerSchema {
        path: String,
        found: u32,
        supported: u32,
    },
    #[error("journal {path} does not exist")]
    Missing { path: String },
    #[error("event {seq}: cannot decode {kind}: {error}")]
    Decode {
        seq: u64,
        kind: String,
        error: String,
    },
    #[error("cannot start the journal writer: {0}")]
    Thread(std::io::Error),
    /// Another process holds the journal's lock file (see [`JournalLock`]).
    #[error("journal {path} is in use by another warden (pid {pid})")]
    InUse { path: String, pid: String },
    #[error("journal {path}: cannot take the lock file {lock}: {error}")]
    Lock {
        path: String,
        lock: String,
        error: std::io::Error,
    },
    /// `PRAGMA quick_check` found damage, or SQLite says the file is not a database.
    #[error(
        "journal {path} is damaged ({detail}); warden will not serve on it. Restore a backup \
         (made with `sqlite3 {path} \"VACUUM INTO 'copy.db'\"`), or salvage what is readable: \
         `sqlite3 {path} .recover | sqlite3 recovered.db`, then `warden serve --db recovered.db`"
    )]
    Corrupt { path: String, detail: String },
}

/// The exclusive lock a writing [`SqliteJournal`] holds on its file for as long as it is open: an
/// advisory lock (`flock`) on `<db>.lock` beside the database, which holds the pid of its owner. A
/// second writer on the same file is refused ([`JournalError::InUse`]) before it touches the database;
/// readers ([`JournalReader`], `warden journal tail|show|export`) do not take it. The kernel drops
/// the lock when the process ends, however it ends (a SIGKILL included); the file itself stays.
#[derive(Debug)]
pub struct JournalLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl JournalLock {
    /// The lock file of the journal at `db`: `<db>.lock`.
    pub fn path_for(db: &Path) -> PathBuf {
        let mut name = db.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Takes the lock of the journal at `db`, without waiting, and writes this process's pid into it.
    pub fn acquire(db: &Path) -> Result<Self, JournalError> {
        let path = Self::path_for(db);
        let shown = db.display().to_string();
        let lock_error = |error| JournalError::Lock {
            path: shown.clone(),
            lock: path.display().to_string(),
            error,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(lock_error)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut file, &mut text);
                let pid = match text.trim().parse::<u32>() {
                    Ok(pid) => pid.to_string(),
                    Err(_) => "unknown".to_owned(),
                };
                return Err(JournalError::InUse { path: shown, pid });
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(lock_error(error)),
        }
        file.set_len(0).map_err(lock_error)?;
        write!(file, "{}", std::process::id()).map_err(lock_error)?;
        file.flush().map_err(lock_error)?;
        Ok(JournalLock { _file: file, path })
    }

    /// Where the lock file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `true` when SQLite says the file is damaged or is not a database at all.
fn is_corruption(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// `PRAGMA quick_check` (O(size), without the index-to-table cross checks of `integrity_check`):
/// `Ok` when it answers `ok`, else [`JournalError::Corrupt`] with its first findings.
fn quick_check(conn: &Connection, path: &str) -> Result<(), JournalError> {
    let corrupt = |detail: String| JournalError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    let findings: Vec<String> = (|| {
        let mut stmt = conn.prepare("PRAGMA quick_check(5)")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect::<Result<Vec<_>, _>>()
    })()
    .map_err(|e| {
        if is_corruption(&e) {
            corrupt(e.to_string())
        } else {
            JournalError::Sqlite(e)
        }
    })?;
    if findings.len() == 1 && findings[0] == "ok" {
        return Ok(());
    }
    let detail = findings.join("; ").replace('\n', " ");
    Err(corrupt(format!("PRAGMA quick_check: {detail}")))
}

/// How a [`SqliteJournal`] works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalOptions {
    /// Snapshot an agent when this many of its events followed its last snapshot; 0 = never.
    pub snapshot_every: u64,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
        }
    }
}

impl From<&JournalConfig> for JournalOptions {
    fn from(config: &JournalConfig) -> Self {
        JournalOptions {
            snapshot_every: config.snapshot_every,
        }
    }
}

/// `true` for events whose acknowledgement must wait until they are committed (with
/// [`Journal::durable`]; `append` itself never waits): the ones a safety decision rests on (a halt, a lockout and the state change into `SAFETY_LOCKOUT`/`STOPPED`, an unlock and a
/// resume with the state change out of `SAFETY_LOCKOUT`/`STOPPED`, a breaker stop, a limit decision).
pub fn must_be_durable(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Halted { .. }
            | EventKind::LockedOut { .. }
            | EventKind::Unlocked { .. }
            | EventKind::LimitDecided { .. }
            | EventKind::LimitDenied { .. }
            | EventKind::BreakerStopped { .. }
            | EventKind::StateChanged {
                to: AgentState::SafetyLockout | AgentState::Stopped,
                ..
            }
            | EventKind::StateChanged {
                from: AgentState::SafetyLockout | AgentState::Stopped,
                ..
            }
    )
}

/// The serde tag of an event kind (`halted`, `locked_out`, …): the `kind` column.
pub fn kind_name(body: &serde_json::Value) -> String {
    body.get("type")
        .and_then(|t| t.as_str())
        .unwrap_or("unknown")
        .to_owned()
}

/// Brings `conn` to [`SCHEMA_VERSION`], one transaction per step. Refuses a newer file.
pub fn migrate(conn: &mut Connection, path: &str) -> Result<u32, JournalError> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);")?;
    let mut version = schema_version(conn)?;
    if version > SCHEMA_VERSION {
        return Err(JournalError::NewerSchema {
            path: path.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    while version < SCHEMA_VERSION {
        let tx = conn.transaction()?;
        tx.execute_batch(MIGRATIONS[version as usize])?;
        tx.execute("DELETE FROM schema_version", [])?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            params![version + 1],
        )?;
        tx.commit()?;
        version += 1;
    }
    Ok(version)
}

/// The schema version recorded in `conn` (0 for a new file).
pub fn schema_version(conn: &Connection) -> Result<u32, JournalError> {
    let has_table: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)?;
    if !has_table {
        return Ok(0);
    }
    Ok(conn
        .query_row("SELECT max(version) FROM schema_version", [], |r| {
            r.get::<_, Option<u32>>(0)
        })
        .optional()?
        .flatten()
        .unwrap_or(0))
}

fn decode(row: (u64, u64, String, String, String)) -> Result<Event, JournalError> {
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
type EventRow = (u64, u64, String, String, String);

fn event_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
    Ok((
        r.get::<_, i64>(0)? as u64,
        r.get::<_, i64>(1)? as u64,
        r.get::<_, String>(2)?,
        r.get::<_, String>(3)?,
        r.get::<_, String>(4)?,
    ))
}

/// Events in `seq` order: all of them, or those of one agent.
fn read_events(conn: &Connection, agent: Option<&str>) -> Result<Vec<Event>, JournalError> {
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
fn read_fate(conn: &Connection, agent: &str, id: u64) -> Result<Option<EventFate>, JournalError> {
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

/// What became of an accepted user event, by its id, from a journal (the HTTP API's
/// `GET /api/agents/{key}/events/{id}`): works after a restart, for any event still in the log.
pub trait EventFates: Send + Sync {
    /// `Ok(None)`: no event `id` was ever queued for `agent`.
    ///
    /// # Errors
    /// The journal could not be read.
    fn fate(&self, agent: &str, id: u64) -> Result<Option<EventFate>, JournalError>;
}

impl EventFates for SqliteJournal {
    /// Flushes first (an event accepted a moment ago is found), then reads from its
    /// `event_queued` on (an index finds it).
    fn fate(&self, agent: &str, id: u64) -> Result<Option<EventFate>, JournalError> {
        self.flush();
        read_fate(&self.shared.store.lock().conn, agent, id)
    }
}

impl EventFates for warden_actors::MemoryJournal {
    fn fate(&self, agent: &str, id: u64) -> Result<Option<EventFate>, JournalError> {
        Ok(self.inspect(|events| {
            EventFate::of_event(id, events.iter().filter(|e| e.agent.as_str() == agent))
        }))
    }
}

/// The last `n` events, oldest first.
fn read_tail(conn: &Connection, n: usize) -> Result<Vec<Event>, JournalError> {
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
fn read_recent(
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

/// Agent keys in order of their first event: from the `agents` table (schema 2), or by scanning the
/// log (a read-only view of a schema-1 file).
fn read_agents(conn: &Connection, has_agents_table: bool) -> Result<Vec<AgentKey>, JournalError> {
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
struct Folded {
    record: AgentRecord,
    /// Seq of the last event folded in (0 if none).
    last_seq: u64,
    /// The snapshot it started from, if one was used.
    snapshot_seq: Option<u64>,
    /// Events read after the snapshot (all of the agent's events without one).
    events_read: u64,
}

/// The agent's usable snapshot: its seq and record (`None` without one, or when it has another
/// format, cannot be decoded or is not this agent's: then the events are replayed from the start).
fn read_snapshot(
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
fn fold_agent(
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
fn fold_all(conn: &Connection, schema: u32) -> Result<Vec<Folded>, JournalError> {
    let snapshots = schema >= 2;
    read_agents(conn, snapshots)?
        .iter()
        .map(|agent| fold_agent(conn, agent, snapshots))
        .collect()
}

/// Writes (or replaces) the agent's snapshot at `seq`.
fn write_snapshot(
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
fn events_since_snapshot(conn: &Connection, agent: &AgentKey) -> Result<u64, rusqlite::Error> {
    conn.prepare_cached(
        "SELECT count(*) FROM events WHERE agent = ?1 AND seq >
           coalesce((SELECT seq FROM snapshots WHERE agent = ?1 AND format = ?2), 0)",
    )?
    .query_row(params![agent.as_str(), SNAPSHOT_FORMAT], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n as u64)
}

/// The queue between `append` and the writer thread.
#[derive(Default)]
struct Queue {
    pending: Vec<Event>,
    /// Highest sequence number handed out.
    assigned: u64,
    /// Highest sequence number committed.
    committed: u64,
    closed: bool,
    /// The last sequence number handed out before the journal was closed (later ones are dropped).
    closed_after: u64,
    /// Why the writer cannot commit now (`None`: healthy). Set after a batch failed
    /// [`RETRIES`] times; cleared when it commits.
    degraded: Option<String>,
    /// The writer thread has stopped (after draining the queue, or giving up at close).
    writer_exited: bool,
    /// The writer sleeps without a deadline (nothing written for [`IDLE_AFTER`]): an append must
    /// wake it. Otherwise it wakes by itself within [`LINGER`], and appends do not wake it.
    writer_idle: bool,
}

/// How long an event nobody waits for may sit in the queue while the writer is active: appends do
/// not wake the writer then (a host's tick thread calling `try_send_event` pays no wake-up, and is
/// not preempted by the writer it woke); the writer comes back by itself this often. An event
/// someone waits for ([`Journal::durable`], [`SqliteJournal::flush`]) wakes it at once.
const LINGER: Duration = Duration::from_millis(2);

/// After this long without anything to write the writer sleeps until an append wakes it (an idle
/// journal costs no timer wake-ups).
const IDLE_AFTER: Duration = Duration::from_millis(50);

/// Quick retries of a failed batch before the journal reports itself degraded (40, 80, 160 ms).
const RETRIES: u32 = 3;

/// While degraded, the writer tries the failed batch again this often, for as long as it takes.
const DEGRADED_RETRY: Duration = Duration::from_millis(250);

/// After `close()`, a degraded writer tries this many more times before it drops what it has.
const CLOSE_RETRIES: u32 = 8;

impl Queue {
    /// Whether the event `seq`, once the writer has settled it for now, is on disk.
    fn fate(&self, seq: u64) -> Result<(), NotDurable> {
        if self.closed && seq > self.closed_after {
            return Err(NotDurable::Closed);
        }
        if seq <= self.committed {
            return Ok(());
        }
        match &self.degraded {
            Some(reason) => Err(NotDurable::WriteFailed {
                reason: reason.clone(),
            }),
            // The writer stopped without reaching it.
            None => Err(NotDurable::Closed),
        }
    }

    fn progress(&self) -> Progress {
        Progress {
            committed: self.committed,
            degraded: self.degraded.is_some(),
            stopped: self.writer_exited,
        }
    }
}

/// What waiters on [`Journal::durable`] watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    committed: u64,
    degraded: bool,
    stopped: bool,
}

/// The connection and what the writer keeps about snapshots (one lock for both).
struct Store {
    conn: Connection,
    snapshot_every: u64,
    /// Events of each agent since its last snapshot, for the agents seen by the writer in this
    /// process (an absent agent is counted from the database when it next appends).
    since_snapshot: HashMap<AgentKey, u64>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The writer waits here for work.
    work: Condvar,
    /// Appenders waiting for durability wait here.
    done: Condvar,
    /// The writer's progress for async waiters ([`Journal::durable`]).
    progress: tokio::sync::watch::Sender<Progress>,
    /// Mirrors `queue.degraded.is_some()` (read on hot paths without the queue lock).
    degraded: AtomicBool,
    store: Mutex<Store>,
    commits: AtomicU64,
    durable_waits: AtomicU64,
    failed_batches: AtomicU64,
    snapshots_written: AtomicU64,
    restored_snapshots: AtomicU64,
    restored_events: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// Counters of the journal's work (for tests and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalStats {
    /// Transactions committed by the writer (one per batch).
    pub commits: u64,
    /// Events appended that a safety decision rests on ([`must_be_durable`]); their acknowledgements
    /// wait on [`Journal::durable`] (append itself never waits).
    pub durable_waits: u64,
    /// Batches dropped after repeated write failures (see [`SqliteJournal::last_error`]).
    pub failed_batches: u64,
    /// Highest sequence number committed.
    pub committed_seq: u64,
    /// Snapshots written (by the writer and by restores).
    pub snapshots_written: u64,
    /// Snapshots restores started from.
    pub restored_snapshots: u64,
    /// Event rows restores read (after the snapshots).
    pub restored_events: u64,
}

/// A durable [`Journal`] on SQLite. See the module docs.
pub struct SqliteJournal {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    path: String,
    /// Held while open (none for `:memory:`); released by [`SqliteJournal::close`], once the
    /// writer has stopped (nothing more is written).
    lock: Mutex<Option<JournalLock>>,
}

impl SqliteJournal {
    /// Opens (creating if needed) the journal at `path` with the default options; `":memory:"` keeps
    /// it in memory. Takes the file's [`JournalLock`] first (refused with [`JournalError::InUse`]
    /// while another process or journal holds it), checks the file with `PRAGMA quick_check`
    /// (refused with [`JournalError::Corrupt`]), runs the schema migrations and starts the writer
    /// thread. A zero-length file is a new journal (logged at warn level).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Self::open_with(path, JournalOptions::default())
    }

    /// [`SqliteJournal::open`] with `options` (e.g. `JournalOptions::from(&config.journal)`).
    pub fn open_with(
        path: impl AsRef<Path>,
        options: JournalOptions,
    ) -> Result<Self, JournalError> {
        let path_str = path.as_ref().to_string_lossy().into_owned();
        let shown = path.as_ref().display().to_string();
        let (mut conn, lock) = if path_str == ":memory:" {
            (Connection::open_in_memory()?, None)
        } else {
            // The lock first: a second writer must not touch the file at all.
            let lock = JournalLock::acquire(path.as_ref())?;
            if std::fs::metadata(path.as_ref()).is_ok_and(|m| m.len() == 0) {
                tracing::warn!(journal = %shown, "the journal file is empty (0 bytes): starting a fresh journal");
            }
            (Connection::open(path.as_ref())?, Some(lock))
        };
        let corrupt = |e: rusqlite::Error| {
            if is_corruption(&e) {
                JournalError::Corrupt {
                    path: shown.clone(),
                    detail: e.to_string(),
                }
            } else {
                JournalError::Sqlite(e)
            }
        };
        // WAL: readers do not block the writer; FULL: a committed batch survives a power loss.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(corrupt)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        if lock.is_some() {
            quick_check(&conn, &shown)?;
        }
        migrate(&mut conn, &path_str).map_err(|e| match e {
            JournalError::Sqlite(e) => corrupt(e),
            other => other,
        })?;
        let last: u64 = conn.query_row("SELECT coalesce(max(seq), 0) FROM events", [], |r| {
            r.get::<_, i64>(0)
        })? as u64;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                assigned: last,
                committed: last,
                ..Queue::default()
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            progress: tokio::sync::watch::Sender::new(Progress {
                committed: last,
                degraded: false,
                stopped: false,
            }),
            degraded: AtomicBool::new(false),
            store: Mutex::new(Store {
                conn,
                snapshot_every: options.snapshot_every,
                since_snapshot: HashMap::new(),
            }),
            commits: AtomicU64::new(0),
            durable_waits: AtomicU64::new(0),
            failed_batches: AtomicU64::new(0),
            snapshots_written: AtomicU64::new(0),
            restored_snapshots: AtomicU64::new(0),
            restored_events: AtomicU64::new(0),
            last_error: Mutex::new(None),
        });
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("warden-journal".into())
            .spawn(move || writer_loop(&writer_shared))
            .map_err(JournalError::Thread)?;
        Ok(SqliteJournal {
            shared,
            writer: Mutex::new(Some(writer)),
            path: path_str,
            lock: Mutex::new(lock),
        })
    }

    /// The path it was opened with.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Waits until every event appended so far is committed.
    pub fn flush(&self) {
        let mut queue = self.shared.queue.lock();
        let target = queue.assigned;
        // A degraded journal is not waited for: reads see what is on disk.
        while queue.committed < target && !queue.writer_exited && queue.degraded.is_none() {
            self.shared.work.notify_one();
            self.shared.done.wait(&mut queue);
        }
    }

    /// Flushes and stops the writer, then releases the file's [`JournalLock`]. Later appends are
    /// dropped (and logged). Also done on drop.
    pub fn close(&self) {
        {
            let mut queue = self.shared.queue.lock();
            if !queue.closed {
                queue.closed = true;
                queue.closed_after = queue.assigned;
            }
            self.shared.work.notify_all();
        }
        if let Some(writer) = self.writer.lock().take() {
            let _ = writer.join();
        }
        // The writer is gone: another journal may open the file now.
        self.lock.lock().take();
    }

    /// Counters: commits, durability waits, the committed position, snapshots and restore reads.
    pub fn stats(&self) -> JournalStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        JournalStats {
            commits: load(&self.shared.commits),
            durable_waits: load(&self.shared.durable_waits),
            failed_batches: load(&self.shared.failed_batches),
            committed_seq: self.shared.queue.lock().committed,
            snapshots_written: load(&self.shared.snapshots_written),
            restored_snapshots: load(&self.shared.restored_snapshots),
            restored_events: load(&self.shared.restored_events),
        }
    }

    /// The last write error, if a batch could not be committed.
    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error.lock().clone()
    }

    /// Every event, in order (flushes first).
    pub fn events(&self) -> Result<Vec<Event>, JournalError> {
        self.flush();
        read_events(&self.shared.store.lock().conn, None)
    }

    /// The events of one agent, in order (flushes first).
    pub fn events_of(&self, agent: &str) -> Result<Vec<Event>, JournalError> {
        self.flush();
        read_events(&self.shared.store.lock().conn, Some(agent))
    }

    /// At most `limit` events with `seq > after`, in order (flushes first): resuming an event stream.
    pub fn since(&self, after: u64, limit: usize) -> Result<Vec<Event>, JournalError> {
        self.flush();
        let rows: Vec<_> = self
            .shared
            .store
            .lock()
            .conn
            .prepare_cached(
                "SELECT seq, at_ms, agent, kind, body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?
            .query_map(
                params![
                    i64::try_from(after).unwrap_or(i64::MAX),
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                event_row,
            )?
            .collect::<Result<_, _>>()?;
        rows.into_iter().map(decode).collect()
    }

    /// The last `limit` events (of `agent` only, when given), oldest first, and the highest `seq`
    /// in the journal, read together (flushes first): `warden events`, `GET /api/events/recent`.
    pub fn recent(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Event>, u64), JournalError> {
        self.flush();
        let store = self.shared.store.lock();
        let tx = store.conn.unchecked_transaction()?;
        let events = read_recent(&tx, agent, limit)?;
        let head: i64 =
            tx.query_row("SELECT coalesce(max(seq), 0) FROM events", [], |r| r.get(0))?;
        tx.finish()?;
        Ok((events, u64::try_from(head).unwrap_or(0)))
    }

    /// Every agent with an event, in order of its first one.
    pub fn agents(&self) -> Result<Vec<AgentKey>, JournalError> {
        self.flush();
        read_agents(&self.shared.store.lock().conn, true)
    }

    /// Every agent's record (flushes first), each from its latest snapshot and the events after it;
    /// equal to [`AgentRecord::replay`] of the whole log. An agent that needed `snapshot_every` or
    /// more events (a file from before snapshots, a lowered `snapshot_every`, an ignored snapshot) is
    /// snapshotted now, so the next restore is short.
    pub fn restore_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        self.flush();
        let mut store = self.shared.store.lock();
        let folded = fold_all(&store.conn, SCHEMA_VERSION)?;
        let (snapshots, events) = folded.iter().fold((0, 0), |(s, e), f| {
            (s + u64::from(f.snapshot_seq.is_some()), e + f.events_read)
        });
        self.shared
            .restored_snapshots
            .fetch_add(snapshots, Ordering::SeqCst);
        self.shared
            .restored_events
            .fetch_add(events, Ordering::SeqCst);
        let every = store.snapshot_every;
        let long: Vec<&Folded> = folded
            .iter()
            .filter(|f| every > 0 && f.events_read >= every)
            .collect();
        if !long.is_empty() {
            // Best effort: a failure leaves the old snapshots, which are still correct.
            match snapshot_restored(&mut store, &long) {
                Ok(()) => {
                    self.shared
                        .snapshots_written
                        .fetch_add(long.len() as u64, Ordering::SeqCst);
                }
                Err(err) => tracing::warn!("journal: snapshots after restore not written: {err}"),
            }
        }
        drop(store);
        Ok(folded.into_iter().map(|f| f.record).collect())
    }

    /// The records to restart a fleet from: [`SqliteJournal::restore_records`], with whatever a crash
    /// interrupted completed along legal transitions, each journaled (cause [`RECOVERY_CAUSE`]) so the
    /// records still equal the replay:
    ///
    /// * a locked-out agent (`emergency_stop`) caught mid-turn before its state change into
    ///   `SAFETY_LOCKOUT` was committed (journals of older versions: the two are now one batch) is
    ///   brought into `SAFETY_LOCKOUT`; one locked out while `WAITING_FOR_EVENT` keeps its state and
    ///   refuses work through its lockout (no turn is invented to reach `SAFETY_LOCKOUT`);
    /// * an agent a breaker stopped (`stopped_by`) is brought into `STOPPED`;
    /// * an agent in `SAFETY_LOCKOUT` whose unlock is journaled (no `emergency_stop`) but whose state
    ///   change out of it is not goes to `WAITING_FOR_EVENT`, as the operator decided;
    /// * any other agent caught mid-turn (`EXECUTING`, `WAITING_FOR_TOOL`, `WAITING_FOR_INPUT`) goes
    ///   back to `WAITING_FOR_EVENT`. The interrupted turn is not resumed.
    ///
    /// Stopped agents, and locked-out agents in `SAFETY_LOCKOUT`, are left as they are. Call it before
    /// the agents are spawned.
    pub fn recover_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        let mut records = self.restore_records()?;
        for record in &mut records {
            for &to in recovery_path(record) {
                let kind = EventKind::StateChanged {
                    from: record.state,
                    to,
                    cause: RECOVERY_CAUSE.into(),
                };
                self.append(&record.key, kind.clone());
                record.apply(&kind);
            }
        }
        self.flush();
        Ok(records)
    }
}

/// The legal transitions that end what a crash interrupted (see
/// [`SqliteJournal::recover_records`]); empty for a consistent record.
///
/// Recovery never invents a turn: only an agent caught in one (`EXECUTING`, `WAITING_FOR_TOOL`,
/// `WAITING_FOR_INPUT`) passes through `EXECUTING`. A record locked out while `WAITING_FOR_EVENT`
/// (only in journals of versions that journaled a lockout and its state change apart, or let a
/// resume pass a lockout) is left as it is: its lockout refuses all work until an unlock.
pub fn recovery_path(record: &AgentRecord) -> &'static [AgentState] {
    use AgentState::*;
    match record.state {
        Stopped => &[],
        SafetyLockout if record.emergency_stop() => &[],
        SafetyLockout => &[WaitingForEvent],
        WaitingForEvent => &[],
        Executing if record.emergency_stop() => &[SafetyLockout],
        WaitingForTool | WaitingForInput if record.emergency_stop() => &[Executing, SafetyLockout],
        _ if record.stopped_by.is_some() => &[Stopped],
        Executing => &[WaitingForEvent],
        WaitingForTool | WaitingForInput => &[Executing, WaitingForEvent],
    }
}

/// Writes fresh snapshots of restored agents, in one transaction.
fn snapshot_restored(store: &mut Store, folded: &[&Folded]) -> Result<(), rusqlite::Error> {
    let tx = store.conn.transaction()?;
    for f in folded {
        write_snapshot(&tx, &f.record.key, f.last_seq, &f.record)?;
    }
    tx.commit()?;
    for f in folded {
        if let Some(count) = store.since_snapshot.get_mut(&f.record.key) {
            *count = 0;
        }
    }
    Ok(())
}

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        self.close();
    }
}

impl SqliteJournal {
    /// Queues `kinds` under one lock of the queue, so the writer takes them in one batch (one
    /// transaction). Never waits for the disk: whoever must know an event is durable before acting
    /// or acknowledging awaits [`Journal::durable`] (outside any lock). Returns the last seq.
    fn push(
        &self,
        agent: &AgentKey,
        kinds: impl IntoIterator<Item = EventKind>,
        at_ms: u64,
    ) -> u64 {
        let mut queue = self.shared.queue.lock();
        for kind in kinds {
            queue.assigned += 1;
            if queue.closed {
                tracing::error!(agent = %agent, "journal is closed; event dropped: {kind:?}");
                continue;
            }
            if must_be_durable(&kind) {
                self.shared.durable_waits.fetch_add(1, Ordering::Relaxed);
            }
            let seq = queue.assigned;
            queue.pending.push(Event {
                seq,
                at_ms,
                agent: agent.clone(),
                kind,
            });
        }
        let seq = queue.assigned;
        // An active writer comes back within `LINGER` by itself; only an idle one needs waking.
        if !queue.closed && queue.writer_idle {
            queue.writer_idle = false;
            self.shared.work.notify_one();
        }
        seq
    }
}

impl Journal for SqliteJournal {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        self.push(agent, [kind], now_ms())
    }

    /// One batch, one transaction: all of `kinds` are committed, or none.
    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        self.push(agent, kinds, now_ms())
    }

    /// [`Journal::append_all`], the events stamped `at_ms`.
    fn append_all_at(&self, agent: &AgentKey, kinds: Vec<EventKind>, at_ms: u64) -> u64 {
        self.push(agent, kinds, at_ms)
    }

    /// Resolves when the writer has committed `seq`; with [`NotDurable::WriteFailed`] as soon as the
    /// journal is degraded with `seq` not committed (the writer keeps trying, and the event may
    /// still land: "not durable" is what holds when the answer is given), with
    /// [`NotDurable::Closed`] when the journal was closed before `seq` was handed to it.
    fn durable(&self, seq: u64) -> BoxFuture<'static, Result<(), NotDurable>> {
        let shared = self.shared.clone();
        let mut progress = shared.progress.subscribe();
        if progress.borrow().committed < seq {
            // Someone waits for `seq`: the writer takes it now, not after its linger.
            shared.work.notify_one();
        }
        Box::pin(async move {
            // The sender lives in `shared`, held here.
            let _ = progress
                .wait_for(|p| p.committed >= seq || p.degraded || p.stopped)
                .await;
            let fate = shared.queue.lock().fate(seq);
            fate
        })
    }

    fn degraded(&self) -> Option<String> {
        if !self.shared.degraded.load(Ordering::Acquire) {
            return None;
        }
        self.shared.queue.lock().degraded.clone()
    }
}

/// Drains the queue, one transaction per batch, until closed and empty.
///
/// A batch that fails is never dropped while the journal is open: after [`RETRIES`] quick retries
/// the journal is degraded (waiters told at once, agents fail closed) and the writer keeps trying
/// the same batch every [`DEGRADED_RETRY`]; later events queue behind it in order. When it commits,
/// the file holds every event in order again — nothing to heal — and the degraded mode ends.
fn writer_loop(shared: &Shared) {
    loop {
        let batch = {
            let mut queue = shared.queue.lock();
            let mut quiet_since = Instant::now();
            loop {
                if queue.closed {
                    break;
                }
                if !queue.pending.is_empty() {
                    // Woken, or its linger is over: write what has gathered.
                    break;
                }
                if quiet_since.elapsed() >= IDLE_AFTER {
                    queue.writer_idle = true;
                    shared.work.wait(&mut queue);
                    queue.writer_idle = false;
                    quiet_since = Instant::now();
                } else {
                    let _ = shared.work.wait_for(&mut queue, LINGER);
                }
            }
            if queue.pending.is_empty() && queue.closed {
                queue.writer_exited = true;
                shared.done.notify_all();
                shared.progress.send_replace(queue.progress());
                return;
            }
            std::mem::take(&mut queue.pending)
        };
        let last = batch.last().map(|e| e.seq).unwrap_or(0);
        let mut attempt = 0;
        let committed = loop {
            let error = match write_batch(&mut shared.store.lock(), &batch) {
                Ok(snapshots) => {
                    shared.commits.fetch_add(1, Ordering::SeqCst);
                    shared
                        .snapshots_written
                        .fetch_add(snapshots, Ordering::SeqCst);
                    break true;
                }
                Err(err) => err.to_string(),
            };
            attempt += 1;
            if attempt <= RETRIES {
                tracing::warn!("journal write failed (attempt {attempt}): {error}");
                std::thread::sleep(Duration::from_millis(20 << attempt));
                continue;
            }
            let mut queue = shared.queue.lock();
            if attempt == RETRIES + 1 {
                tracing::error!(
                    "journal degraded: cannot write ({error}); no turn starts and no event is \
                     accepted until it can; retrying every {DEGRADED_RETRY:?}"
                );
                shared.failed_batches.fetch_add(1, Ordering::SeqCst);
                shared.degraded.store(true, Ordering::Release);
                shared.done.notify_all();
            }
            *shared.last_error.lock() = Some(error.clone());
            queue.degraded = Some(error.clone());
            shared.progress.send_replace(queue.progress());
            if queue.closed && attempt > RETRIES + CLOSE_RETRIES {
                tracing::error!(
                    "journal closed while degraded: {} events not written: {error}",
                    batch.len()
                );
                break false;
            }
            drop(queue);
            std::thread::sleep(DEGRADED_RETRY);
        };
        let mut queue = shared.queue.lock();
        if committed {
            queue.committed = queue.committed.max(last);
            if queue.degraded.take().is_some() {
                tracing::info!("journal writes again; degraded mode over");
                shared.degraded.store(false, Ordering::Release);
            }
        }
        shared.done.notify_all();
        shared.progress.send_replace(queue.progress());
    }
}

/// Commits one batch, with the snapshots of the agents it brings to `snapshot_every`, in one
/// transaction. Returns how many snapshots it wrote. The in-memory counts change only on commit.
fn write_batch(store: &mut Store, batch: &[Event]) -> Result<u64, rusqlite::Error> {
    let Store {
        conn,
        snapshot_every,
        since_snapshot,
    } = store;
    let mut tx = conn.transaction()?;
    // This batch's counts, merged into `since_snapshot` once committed.
    let mut counts: HashMap<AgentKey, u64> = HashMap::new();
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (seq, at_ms, agent, kind, body) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for event in batch {
            let count = match counts.get_mut(&event.agent) {
                Some(count) => count,
                None => {
                    let known = match since_snapshot.get(&event.agent) {
                        Some(&known) => known,
                        None => {
                            tx.prepare_cached(
                                "INSERT OR IGNORE INTO agents (agent, first_seq) VALUES (?1, ?2)",
                            )?
                            .execute(params![event.agent.as_str(), event.seq as i64])?;
                            events_since_snapshot(&tx, &event.agent)?
                        }
                    };
                    counts.entry(event.agent.clone()).or_insert(known)
                }
            };
            let body = serde_json::to_value(&event.kind)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            insert.execute(params![
                event.seq as i64,
                event.at_ms as i64,
                event.agent.as_str(),
                kind_name(&body),
                body.to_string(),
            ])?;
            *count += 1;
        }
    }
    let mut written = 0;
    if *snapshot_every > 0 {
        for (agent, count) in counts.iter_mut() {
            if *count < *snapshot_every {
                continue;
            }
            // A snapshot that cannot be made must not cost the batch its events: it is tried in a
            // savepoint, and again with the agent's next batch.
            let savepoint = tx.savepoint()?;
            let snapshot = fold_agent(&savepoint, agent, true).and_then(|folded| {
                write_snapshot(&savepoint, agent, folded.last_seq, &folded.record)?;
                Ok(())
            });
            match snapshot {
                Ok(()) => {
                    savepoint.commit()?;
                    *count = 0;
                    written += 1;
                }
                Err(err) => {
                    tracing::warn!(agent = %agent, "journal: snapshot not written: {err}");
                    drop(savepoint);
                }
            }
        }
    }
    tx.commit()?;
    since_snapshot.extend(counts);
    Ok(written)
}

/// A read-only view of a journal file, for inspection while warden may be running on it.
pub struct JournalReader {
    conn: Connection,
    /// The file's schema version (a schema-1 file has no snapshots and no `agents` table).
    version: u32,
}

impl JournalReader {
    /// Opens an existing journal read-only (never creates one, never migrates).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path_ref = path.as_ref();
        let shown = path_ref.display().to_string();
        if !path_ref.exists() {
            return Err(JournalError::Missing { path: shown });
        }
        let conn = Connection::open_with_flags(
            path_ref,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let version = schema_version(&conn)?;
        if version > SCHEMA_VERSION {
            return Err(JournalError::NewerSchema {
                path: shown,
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version == 0 {
            return Err(JournalError::Missing { path: shown });
        }
        Ok(JournalReader { conn, version })
    }

    pub fn events(&self) -> Result<Vec<Event>, JournalError> {
        read_events(&self.conn, None)
    }

    pub fn events_of(&self, agent: &str) -> Result<Vec<Event>, JournalError> {
        read_events(&self.conn, Some(agent))
    }

    /// The last `n` events, oldest first.
    pub fn tail(&self, n: usize) -> Result<Vec<Event>, JournalError> {
        read_tail(&self.conn, n)
    }

    pub fn agents(&self) -> Result<Vec<AgentKey>, JournalError> {
        read_agents(&self.conn, self.version >= 2)
    }

    /// Every agent's record from its snapshot and the events after it, read in one transaction (a
    /// consistent view while warden writes).
    pub fn restore_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        let tx = self.conn.unchecked_transaction()?;
        let folded = fold_all(&tx, self.version)?;
        Ok(folded.into_iter().map(|f| f.record).collect())
    }

    /// The agent's usable snapshot (see the module docs), if any: its seq, and the record rebuilt
    /// from it and the events after it.
    pub fn snapshot_of(&self, agent: &str) -> Result<Option<(u64, AgentRecord)>, JournalError> {
        if self.version < 2 {
            return Ok(None);
        }
        let tx = self.conn.unchecked_transaction()?;
        let folded = fold_agent(&tx, &AgentKey::new(agent), true)?;
        Ok(folded.snapshot_seq.map(|seq| (seq, folded.record)))
    }
}

/// Why a `warden journal` command failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("no events for agent {0}")]
    UnknownAgent(String),
    #[error("write: {0}")]
    Io(#[from] std::io::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// One event as a line: `seq  time  agent  kind  body`, the time in UTC to the millisecond and the
/// agent padded to `agent_width` (the longest key of a batch; see [`EventLines`]).
pub fn format_event(event: &Event, agent_width: usize) -> String {
    let body = serde_json::to_value(&event.kind).unwrap_or_default();
    let kind = kind_name(&body);
    let mut rest = body;
    if let Some(map) = rest.as_object_mut() {
        map.remove("type");
    }
    let rest = if rest.as_object().is_some_and(|m| m.is_empty()) {
        String::new()
    } else {
        rest.to_string()
    };
    format!(
        "{:>8}  {}  {:<agent_width$}  {:<20}  {}",
        event.seq,
        clock(event.at_ms),
        event.agent.as_str(),
        kind,
        rest
    )
    .trim_end()
    .to_owned()
}

/// `at_ms` (milliseconds since the Unix epoch) as `2026-11-25 07:12:03.123` (UTC).
pub fn clock(at_ms: u64) -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second].[subsecond digits:3]"
    );
    i128::from(at_ms)
        .checked_mul(1_000_000)
        .and_then(|ns| time::OffsetDateTime::from_unix_timestamp_nanos(ns).ok())
        .and_then(|at| at.format(&format).ok())
        .unwrap_or_else(|| format!("@{at_ms}ms"))
}

/// Formats events one a line with the agent column as wide as the longest key seen so far (at least
/// [`EventLines::MIN_WIDTH`]): a batch is aligned when [`EventLines::fit`] saw it first; a stream
/// widens when a longer key comes.
#[derive(Debug, Clone)]
pub struct EventLines {
    width: usize,
}

impl Default for EventLines {
    fn default() -> Self {
        EventLines {
            width: Self::MIN_WIDTH,
        }
    }
}

impl EventLines {
    pub const MIN_WIDTH: usize = 12;

    /// Widens the agent column for `events`.
    pub fn fit<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) -> &mut Self {
        for event in events {
            self.width = self.width.max(event.agent.as_str().chars().count());
        }
        self
    }

    /// The column's width after widening it for `agent`.
    pub fn width_for(&mut self, agent: &str) -> usize {
        self.width = self.width.max(agent.chars().count());
        self.width
    }

    /// `event` as one line (widening the column for it first).
    pub fn line(&mut self, event: &Event) -> String {
        self.fit([event]);
        format_event(event, self.width)
    }
}

/// `warden journal tail`: the last `n` events, one a line (JSON lines with `json`).
pub fn tail(db: &Path, n: usize, json: bool, out: &mut dyn Write) -> Result<(), InspectError> {
    let reader = JournalReader::open(db)?;
    let events = reader.tail(n)?;
    let mut lines = EventLines::default();
    lines.fit(&events);
    for event in &events {
        if json {
            writeln!(out, "{}", serde_json::to_string(event)?)?;
        } else {
            writeln!(out, "{}", lines.line(event))?;
        }
    }
    Ok(())
}

/// `warden journal show AGENT`: the agent's record replayed from all its events, whether its snapshot
/// agrees, and its events (one JSON object with `json`: `{"record": …, "snapshot": {"seq": …,
/// "matches_replay": …} or null, "events": […]}`).
pub fn show(db: &Path, agent: &str, json: bool, out: &mut dyn Write) -> Result<(), InspectError> {
    let reader = JournalReader::open(db)?;
    let events = reader.events_of(agent)?;
    if events.is_empty() {
        return Err(InspectError::UnknownAgent(agent.to_owned()));
    }
    let record = AgentRecord::replay(AgentKey::new(agent), &events);
    // The snapshot is derived data: shown with whether it agrees with the full replay.
    let snapshot = reader
        .snapshot_of(agent)?
        .map(|(seq, restored)| (seq, restored == record));
    if json {
        let snapshot = snapshot
            .map(|(seq, matches)| serde_json::json!({ "seq": seq, "matches_replay": matches }));
        let doc = serde_json::json!({ "record": record, "snapshot": snapshot, "events": events });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    writeln!(out, "agent {}", record.key)?;
    writeln!(out, "  role                 {:?}", record.role)?;
    if let Some(parent) = &record.parent {
        writeln!(out, "  parent               {parent}")?;
    }
    writeln!(out, "  state                {:?}", record.state)?;
    writeln!(out, "  emergency_stop       {}", record.emergency_stop())?;
    if let Some(lockout) = &record.lockout {
        writeln!(
            out,
            "  lockout              {:?}: {}",
            lockout.breaker, lockout.reason
        )?;
    }
    if let Some(stopped) = &record.stopped_by {
        writeln!(
            out,
            "  stopped_by           {:?}: {}",
            stopped.breaker, stopped.reason
        )?;
    }
    writeln!(
        out,
        "  consecutive_errors   {}/{}",
        record.consecutive_errors, record.max_consecutive_errors
    )?;
    writeln!(out, "  paused               {}", record.paused)?;
    writeln!(
        out,
        "  halts                {} ({} messages discarded)",
        record.halts, record.discarded_by_halt
    )?;
    writeln!(out, "  turns                {}", record.turns)?;
    writeln!(out, "  restarts             {}", record.restarts)?;
    writeln!(
        out,
        "  history              {} messages",
        record.history.len()
    )?;
    if record.last_event_id > 0 {
        writeln!(
            out,
            "  pending events       {} (last id {})",
            record.pending.len(),
            record.last_event_id
        )?;
    }
    match snapshot {
        None => writeln!(out, "  snapshot             none")?,
        Some((seq, true)) => writeln!(out, "  snapshot             seq {seq}, matches the replay")?,
        Some((seq, false)) => writeln!(
            out,
            "  snapshot             seq {seq}, DIFFERS from the replay (the events are authoritative)"
        )?,
    }
    writeln!(out, "events ({}):", events.len())?;
    let mut lines = EventLines::default();
    lines.fit(&events);
    for event in &events {
        writeln!(out, "{}", lines.line(event))?;
    }
    Ok(())
}

/// `warden journal export --json`: every event, as one JSON array. Snapshots are not exported: they
/// are derived from the events.
pub fn export_json(db: &Path, out: &mut dyn Write) -> Result<(), InspectError> {
    let reader = JournalReader::open(db)?;
    let events = reader.events()?;
    serde_json::to_writer_pretty(&mut *out, &events)?;
    writeln!(out)?;
    Ok(())
}

/// The default journal path as a `PathBuf`.
pub fn default_db() -> PathBuf {
    PathBuf::from(DEFAULT_DB)
}
