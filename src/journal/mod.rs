//! The durable journal: [`SqliteJournal`], an append-only event log in SQLite (WAL mode) with
//! per-agent snapshots, and the read-only inspection behind `warden journal tail|show|export`.
//!
//! Files: this one (constants, errors, options, which events must be durable), `schema.rs` (the
//! schema, migrations, the writer's file lock, the integrity check), `sqlite.rs` ([`SqliteJournal`]:
//! the queue, the group-commit writer, durability waits, degraded mode, restore), `store.rs` (reading
//! rows and folding snapshots), `reader.rs` ([`JournalReader`]), `inspect.rs` (the CLI's views).
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

mod inspect;
mod reader;
mod schema;
mod sqlite;
mod store;

pub use inspect::*;
pub use reader::*;
pub use schema::*;
pub use sqlite::*;
use store::*;

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
///
/// 2: `history_tokens` (the running token estimate of the history, folded from `history_appended`
/// and `history_compacted`): a format-1 snapshot has a history but no estimate of it, so it is
/// ignored and the record rebuilt from its events.
///
/// 3: `outstanding` (a halt's cleared messages until its `messages_discarded` lists them, the
/// error-cascade window): a format-2 snapshot taken between a halt and its listing would lack them.
pub const SNAPSHOT_FORMAT: u32 = 3;

/// The default of [`JournalOptions::snapshot_every`] (`journal.snapshot_every`).
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 1000;

/// The cause journaled when [`SqliteJournal::recover_records`] ends a turn a crash interrupted.
pub use warden_protocols::RECOVERY_CAUSE;

/// Where a journal is kept by default (`warden journal --db`).
pub const DEFAULT_DB: &str = "./warden.db";

/// Why the journal could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// An SQLite call failed (a query, a pragma, the schema migration) on a file that did open.
    #[error("journal database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file was written by a newer warden; this one neither reads nor migrates it.
    #[error(
        "journal {path}: schema version {found} is newer than this warden supports ({supported})"
    )]
    NewerSchema {
        /// The journal's path, as given.
        path: String,
        /// The file's schema version.
        found: u32,
        /// The newest this build knows ([`SCHEMA_VERSION`]).
        supported: u32,
    },
    /// A reader ([`JournalReader::open`]) was pointed at a file that does not exist (readers never
    /// create one).
    #[error("journal {path} does not exist")]
    Missing {
        /// The journal's path, as given.
        path: String,
    },
    /// A reader ([`JournalReader::open`]) was pointed at a file that is empty, or a SQLite
    /// database without a journal in it.
    #[error(
        "{path} is {}not a warden journal (`warden serve --db {path}` creates one)",
        if *.empty { "empty: " } else { "a SQLite database but " }
    )]
    NotAJournal {
        /// The path, as given.
        path: String,
        /// Whether the file is empty (0 bytes).
        empty: bool,
    },
    /// `--db` names a directory.
    #[error(
        "journal {path} is a directory: --db takes the journal's file (such as {path}/warden.db)"
    )]
    IsDirectory {
        /// The path given.
        path: String,
    },
    /// SQLite could not open the file (not a database, no permission, …).
    #[error("journal {path}: {error}")]
    Open {
        /// The journal's path, as given.
        path: String,
        /// SQLite's error.
        error: rusqlite::Error,
    },
    /// A stored event's body is not an [`EventKind`] this build knows (written by a newer
    /// warden, or edited by hand).
    #[error("event {seq}: cannot decode {kind}: {error}")]
    Decode {
        /// The event's sequence number.
        seq: u64,
        /// Its `kind` column, such as `halted`.
        kind: String,
        /// The decoder's message.
        error: String,
    },
    /// The writer thread could not be spawned.
    #[error("cannot start the journal writer: {0}")]
    Thread(std::io::Error),
    /// Another process holds the journal's lock file (see [`JournalLock`]).
    #[error("journal {path} is in use by another warden (pid {pid})")]
    InUse {
        /// The journal's path, as given.
        path: String,
        /// The pid written in the lock file by its holder, or `unknown`.
        pid: String,
    },
    /// The lock file could not be created, locked or written (permissions, read-only
    /// directory).
    #[error("journal {path}: cannot take the lock file {lock}: {error}")]
    Lock {
        /// The journal's path, as given.
        path: String,
        /// The lock file's path (`<db>.lock`).
        lock: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// `PRAGMA quick_check` found damage, or SQLite says the file is not a database.
    #[error(
        "journal {path} is damaged ({detail}); warden will not serve on it. Restore a backup \
         (made with `sqlite3 {path} \"VACUUM INTO 'copy.db'\"`), or salvage what is readable: \
         `sqlite3 {path} .recover | sqlite3 recovered.db`, then `warden serve --db recovered.db`"
    )]
    Corrupt {
        /// The journal's path, as given.
        path: String,
        /// What SQLite reported.
        detail: String,
    },
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
