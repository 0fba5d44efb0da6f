//! The durable journal: [`SqliteJournal`], an append-only event log in SQLite (WAL mode), and the
//! read-only inspection behind `warden journal tail|show|export`.
//!
//! Appends are cheap: [`Journal::append`] assigns the sequence number, queues the event and returns.
//! A writer thread drains the queue and commits everything queued so far in one transaction (group
//! commit), so a busy fleet is not bound by one fsync per event. Events a safety decision rests on
//! (see [`must_be_durable`]) make `append` wait until their batch is committed: a halt, lockout,
//! unlock, breaker stop or limit decision is on disk before the agent acts on it.
//!
//! On start, [`SqliteJournal::restore_records`] rebuilds every agent with
//! [`AgentRecord::replay`]; hand each record to [`crate::AgentSpec::restored_from`]. A locked-out or
//! stopped agent comes back locked out or stopped.

use parking_lot::{Condvar, Mutex};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};
use warden_actors::{now_ms, Journal};
use warden_protocols::{AgentKey, AgentRecord, AgentState, Event, EventKind};

/// The schema version this build writes. [`migrate`] brings older files up to it.
pub const SCHEMA_VERSION: u32 = 1;

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
];

/// The cause journaled when [`SqliteJournal::recover_records`] ends a turn a crash interrupted.
pub const RECOVERY_CAUSE: &str = "restart: turn interrupted by a crash";

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
}

/// `true` for events that must be committed before `append` returns: the ones a safety decision
/// rests on (a halt, a lockout and the state change into `SAFETY_LOCKOUT`/`STOPPED`, an unlock, a
/// breaker stop, a limit decision).
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

/// The last `n` events, oldest first.
fn read_tail(conn: &Connection, n: usize) -> Result<Vec<Event>, JournalError> {
    let rows: Vec<_> = conn
        .prepare_cached(
            "SELECT seq, at_ms, agent, kind, body FROM
               (SELECT * FROM events ORDER BY seq DESC LIMIT ?1) ORDER BY seq",
        )?
        .query_map(params![n as i64], event_row)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(decode).collect()
}

/// Agent keys in order of their first event.
fn read_agents(conn: &Connection) -> Result<Vec<AgentKey>, JournalError> {
    let keys: Vec<String> = conn
        .prepare_cached("SELECT agent FROM events GROUP BY agent ORDER BY min(seq)")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<_, _>>()?;
    Ok(keys.into_iter().map(AgentKey::new).collect())
}

fn records_from(events: &[Event], agents: Vec<AgentKey>) -> Vec<AgentRecord> {
    agents
        .into_iter()
        .map(|key| AgentRecord::replay(key, events))
        .collect()
}

/// The queue between `append` and the writer thread.
#[derive(Default)]
struct Queue {
    pending: Vec<Event>,
    /// Highest sequence number handed out.
    assigned: u64,
    /// Highest sequence number committed (or given up on after repeated write failures).
    committed: u64,
    closed: bool,
    /// The writer thread has stopped (after draining the queue).
    writer_exited: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The writer waits here for work.
    work: Condvar,
    /// Appenders waiting for durability wait here.
    done: Condvar,
    conn: Mutex<Connection>,
    commits: AtomicU64,
    durable_waits: AtomicU64,
    failed_batches: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// Counters of the journal's work (for tests and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalStats {
    /// Transactions committed by the writer (one per batch).
    pub commits: u64,
    /// Appends that waited for their batch to commit.
    pub durable_waits: u64,
    /// Batches dropped after repeated write failures (see [`SqliteJournal::last_error`]).
    pub failed_batches: u64,
    /// Highest sequence number committed.
    pub committed_seq: u64,
}

/// A durable [`Journal`] on SQLite. See the module docs.
pub struct SqliteJournal {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    path: String,
}

impl SqliteJournal {
    /// Opens (creating if needed) the journal at `path`; `":memory:"` keeps it in memory. Runs the
    /// schema migrations and starts the writer thread.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path_str = path.as_ref().to_string_lossy().into_owned();
        let mut conn = if path_str == ":memory:" {
            Connection::open_in_memory()?
        } else {
            Connection::open(path.as_ref())?
        };
        // WAL: readers do not block the writer; FULL: a committed batch survives a power loss.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        migrate(&mut conn, &path_str)?;
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
            conn: Mutex::new(conn),
            commits: AtomicU64::new(0),
            durable_waits: AtomicU64::new(0),
            failed_batches: AtomicU64::new(0),
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
        while queue.committed < target && !queue.writer_exited {
            self.shared.work.notify_one();
            self.shared.done.wait(&mut queue);
        }
    }

    /// Flushes and stops the writer. Later appends are dropped (and logged). Also done on drop.
    pub fn close(&self) {
        {
            let mut queue = self.shared.queue.lock();
            queue.closed = true;
            self.shared.work.notify_all();
        }
        if let Some(writer) = self.writer.lock().take() {
            let _ = writer.join();
        }
    }

    /// Counters: commits, durability waits, the committed position.
    pub fn stats(&self) -> JournalStats {
        JournalStats {
            commits: self.shared.commits.load(Ordering::SeqCst),
            durable_waits: self.shared.durable_waits.load(Ordering::SeqCst),
            failed_batches: self.shared.failed_batches.load(Ordering::SeqCst),
            committed_seq: self.shared.queue.lock().committed,
        }
    }

    /// The last write error, if a batch could not be committed.
    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error.lock().clone()
    }

    /// Every event, in order (flushes first).
    pub fn events(&self) -> Result<Vec<Event>, JournalError> {
        self.flush();
        read_events(&self.shared.conn.lock(), None)
    }

    /// The events of one agent, in order (flushes first).
    pub fn events_of(&self, agent: &str) -> Result<Vec<Event>, JournalError> {
        self.flush();
        read_events(&self.shared.conn.lock(), Some(agent))
    }

    /// At most `limit` events with `seq > after`, in order (flushes first): resuming an event stream.
    pub fn since(&self, after: u64, limit: usize) -> Result<Vec<Event>, JournalError> {
        self.flush();
        let rows: Vec<_> = self
            .shared
            .conn
            .lock()
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

    /// Every agent with an event, in order of its first one.
    pub fn agents(&self) -> Result<Vec<AgentKey>, JournalError> {
        self.flush();
        read_agents(&self.shared.conn.lock())
    }

    /// Every agent's record, rebuilt from its events ([`AgentRecord::replay`]).
    pub fn restore_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        self.flush();
        let conn = self.shared.conn.lock();
        let events = read_events(&conn, None)?;
        Ok(records_from(&events, read_agents(&conn)?))
    }

    /// The records to restart a fleet from: [`SqliteJournal::restore_records`], with every agent a
    /// crash caught mid-turn (`EXECUTING`, `WAITING_FOR_TOOL`, `WAITING_FOR_INPUT`) brought back to
    /// `WAITING_FOR_EVENT` along legal transitions, each journaled (cause [`RECOVERY_CAUSE`]) so the
    /// records still equal the replay. The interrupted turn is not resumed. Locked-out and stopped
    /// agents are left as they are.
    pub fn recover_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        let mut records = self.restore_records()?;
        for record in &mut records {
            let path: &[AgentState] = match record.state {
                AgentState::Executing => &[AgentState::WaitingForEvent],
                AgentState::WaitingForTool | AgentState::WaitingForInput => {
                    &[AgentState::Executing, AgentState::WaitingForEvent]
                }
                AgentState::WaitingForEvent | AgentState::SafetyLockout | AgentState::Stopped => {
                    &[]
                }
            };
            for &to in path {
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

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        self.close();
    }
}

impl Journal for SqliteJournal {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        let durable = must_be_durable(&kind);
        let mut queue = self.shared.queue.lock();
        if queue.closed {
            tracing::error!(agent = %agent, "journal is closed; event dropped: {kind:?}");
            queue.assigned += 1;
            return queue.assigned;
        }
        queue.assigned += 1;
        let seq = queue.assigned;
        queue.pending.push(Event {
            seq,
            at_ms: now_ms(),
            agent: agent.clone(),
            kind,
        });
        self.shared.work.notify_one();
        if durable {
            self.shared.durable_waits.fetch_add(1, Ordering::SeqCst);
            while queue.committed < seq {
                self.shared.done.wait(&mut queue);
            }
        }
        seq
    }
}

/// Drains the queue, one transaction per batch, until closed and empty.
fn writer_loop(shared: &Shared) {
    loop {
        let batch = {
            let mut queue = shared.queue.lock();
            while queue.pending.is_empty() && !queue.closed {
                shared.work.wait(&mut queue);
            }
            if queue.pending.is_empty() && queue.closed {
                queue.writer_exited = true;
                shared.done.notify_all();
                return;
            }
            std::mem::take(&mut queue.pending)
        };
        let last = batch.last().map(|e| e.seq).unwrap_or(0);
        let mut attempt = 0;
        loop {
            match write_batch(&mut shared.conn.lock(), &batch) {
                Ok(()) => {
                    shared.commits.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Err(err) if attempt < 3 => {
                    attempt += 1;
                    tracing::warn!("journal write failed (attempt {attempt}): {err}");
                    std::thread::sleep(Duration::from_millis(20 << attempt));
                }
                Err(err) => {
                    // Giving up keeps the fleet able to halt: waiters are released, the error is
                    // kept for `last_error` and logged.
                    tracing::error!("journal write failed; {} events lost: {err}", batch.len());
                    shared.failed_batches.fetch_add(1, Ordering::SeqCst);
                    *shared.last_error.lock() = Some(err.to_string());
                    break;
                }
            }
        }
        let mut queue = shared.queue.lock();
        queue.committed = queue.committed.max(last);
        shared.done.notify_all();
    }
}

fn write_batch(conn: &mut Connection, batch: &[Event]) -> Result<(), rusqlite::Error> {
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (seq, at_ms, agent, kind, body) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for event in batch {
            let body = serde_json::to_value(&event.kind)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            insert.execute(params![
                event.seq as i64,
                event.at_ms as i64,
                event.agent.as_str(),
                kind_name(&body),
                body.to_string(),
            ])?;
        }
    }
    tx.commit()
}

/// A read-only view of a journal file, for inspection while warden may be running on it.
pub struct JournalReader {
    conn: Connection,
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
        Ok(JournalReader { conn })
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
        read_agents(&self.conn)
    }

    pub fn restore_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        Ok(records_from(&self.events()?, self.agents()?))
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

/// One event as a line: `seq  time  agent  kind  body`.
pub fn format_event(event: &Event) -> String {
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
        "{:>8}  {:>13}  {:<16}  {:<20}  {}",
        event.seq, event.at_ms, event.agent, kind, rest
    )
    .trim_end()
    .to_owned()
}

/// `warden journal tail`: the last `n` events, one a line (JSON lines with `json`).
pub fn tail(db: &Path, n: usize, json: bool, out: &mut dyn Write) -> Result<(), InspectError> {
    let reader = JournalReader::open(db)?;
    for event in reader.tail(n)? {
        if json {
            writeln!(out, "{}", serde_json::to_string(&event)?)?;
        } else {
            writeln!(out, "{}", format_event(&event))?;
        }
    }
    Ok(())
}

/// `warden journal show AGENT`: the agent's restored record and its events (one JSON object with
/// `json`: `{"record": …, "events": […]}`).
pub fn show(db: &Path, agent: &str, json: bool, out: &mut dyn Write) -> Result<(), InspectError> {
    let reader = JournalReader::open(db)?;
    let events = reader.events_of(agent)?;
    if events.is_empty() {
        return Err(InspectError::UnknownAgent(agent.to_owned()));
    }
    let record = AgentRecord::replay(AgentKey::new(agent), &events);
    if json {
        let doc = serde_json::json!({ "record": record, "events": events });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    writeln!(out, "agent {}", record.key)?;
    writeln!(out, "  role                 {:?}", record.role)?;
    if let Some(parent) = &record.parent {
        writeln!(out, "  parent               {parent}")?;
    }
    writeln!(out, "  state                {:?}", record.state)?;
    writeln!(out, "  emergency_stop       {}", record.emergency_stop)?;
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
    writeln!(out, "events ({}):", events.len())?;
    for event in &events {
        writeln!(out, "{}", format_event(event))?;
    }
    Ok(())
}

/// `warden journal export --json`: every event, as one JSON array.
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
