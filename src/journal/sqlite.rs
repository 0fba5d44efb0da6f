//! [`SqliteJournal`]: the queue between appends and the writer thread, group commit, durability
//! waits, degraded mode, snapshots on write, restore and crash recovery.

use super::*;

/// The queue between `append` and the writer thread.
#[derive(Default)]
pub(super) struct Queue {
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
pub(super) const LINGER: Duration = Duration::from_millis(2);

/// After this long without anything to write the writer sleeps until an append wakes it (an idle
/// journal costs no timer wake-ups).
pub(super) const IDLE_AFTER: Duration = Duration::from_millis(50);

/// Quick retries of a failed batch before the journal reports itself degraded (40, 80, 160 ms).
pub(super) const RETRIES: u32 = 3;

/// While degraded, the writer tries the failed batch again this often, for as long as it takes.
pub(super) const DEGRADED_RETRY: Duration = Duration::from_millis(250);

/// After `close()`, a degraded writer tries this many more times before it drops what it has.
pub(super) const CLOSE_RETRIES: u32 = 8;

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
pub(super) struct Progress {
    committed: u64,
    degraded: bool,
    stopped: bool,
}

/// The connection and what the writer keeps about snapshots (one lock for both).
pub(super) struct Store {
    conn: Connection,
    snapshot_every: u64,
    /// Events of each agent since its last snapshot, for the agents seen by the writer in this
    /// process (an absent agent is counted from the database when it next appends).
    since_snapshot: HashMap<AgentKey, u64>,
}

pub(super) struct Shared {
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
    /// Batches whose write still failed after the retries: the journal went degraded and retries
    /// them until it can write (see [`SqliteJournal::last_error`]); not dropped.
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

impl std::fmt::Debug for SqliteJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteJournal")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl SqliteJournal {
    /// Opens (creating if needed) the journal at `path` with the default options; `":memory:"` keeps
    /// it in memory. Takes the file's [`JournalLock`] first (refused with [`JournalError::InUse`]
    /// while another process or journal holds it), checks the file with `PRAGMA quick_check`
    /// (refused with [`JournalError::Corrupt`]), runs the schema migrations and starts the writer
    /// thread. A zero-length file is a new journal (logged at warn level).
    ///
    /// # Errors
    ///
    /// * [`JournalError::IsDirectory`] — `path` is a directory.
    /// * [`JournalError::InUse`] — another journal (in this process or another) has it open.
    /// * [`JournalError::Lock`] — the lock file `<path>.lock` cannot be created or locked.
    /// * [`JournalError::Open`] — SQLite cannot open the file (no permission, …).
    /// * [`JournalError::Corrupt`] — the integrity check failed, or the file is not a database.
    /// * [`JournalError::NewerSchema`] — written by a newer warden.
    /// * [`JournalError::Sqlite`] — another SQLite failure.
    /// * [`JournalError::Thread`] — the writer thread could not be spawned.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use warden::journal::JournalError;
    /// use warden::{AgentKey, AgentState, EventKind, Journal, SqliteJournal};
    ///
    /// let db = std::env::temp_dir().join(format!("warden-doc-open-{}.db", std::process::id()));
    /// # let clean = |db: &std::path::Path| {
    /// #     for end in ["", "-wal", "-shm", ".lock"] {
    /// #         let _ = std::fs::remove_file(format!("{}{end}", db.display()));
    /// #     }
    /// # };
    /// # clean(&db);
    /// let journal = Arc::new(SqliteJournal::open(&db)?);
    /// // One writer at a time.
    /// assert!(matches!(SqliteJournal::open(&db), Err(JournalError::InUse { .. })));
    ///
    /// // `append` returns at once with the event's seq; the writer thread commits it.
    /// let seq = journal.append(
    ///     &AgentKey::new("innkeeper"),
    ///     EventKind::StateChanged {
    ///         from: AgentState::WaitingForEvent,
    ///         to: AgentState::Executing,
    ///         cause: "doc example".into(),
    ///     },
    /// );
    /// journal.flush();
    /// assert_eq!(journal.stats().committed_seq, seq);
    ///
    /// // Closed (also on drop): the lock is released and the file reopens with its events.
    /// journal.close();
    /// let again = SqliteJournal::open(&db)?;
    /// assert_eq!(again.events()?.len(), 1);
    /// # drop(again);
    /// # clean(&db);
    /// # Ok::<(), JournalError>(())
    /// ```
    ///
    /// A journal is usually handed to a [`Supervisor`](crate::Supervisor) as its
    /// `Arc<dyn Journal>`, then its records to `warden::team::TeamFile::spawn_agents_restored`
    /// (feature `server`) after a restart (see [`SqliteJournal::recover_records`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Self::open_with(path, JournalOptions::default())
    }

    /// [`SqliteJournal::open`] with `options` (e.g. `JournalOptions::from(&config.journal)`).
    ///
    /// # Errors
    ///
    /// As [`SqliteJournal::open`].
    pub fn open_with(
        path: impl AsRef<Path>,
        options: JournalOptions,
    ) -> Result<Self, JournalError> {
        let path_str = path.as_ref().to_string_lossy().into_owned();
        let shown = path.as_ref().display().to_string();
        let (mut conn, lock) = if path_str == ":memory:" {
            (Connection::open_in_memory()?, None)
        } else {
            if path.as_ref().is_dir() {
                return Err(JournalError::IsDirectory { path: shown });
            }
            // The lock first: a second writer must not touch the file at all.
            let lock = JournalLock::acquire(path.as_ref())?;
            if std::fs::metadata(path.as_ref()).is_ok_and(|m| m.len() == 0) {
                tracing::warn!(journal = %shown, "the journal file is empty (0 bytes): starting a fresh journal");
            }
            let conn = Connection::open(path.as_ref()).map_err(|error| JournalError::Open {
                path: shown.clone(),
                error,
            })?;
            (conn, Some(lock))
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

    /// Waits until every event appended so far is committed. Blocks the calling thread (use
    /// [`Journal::durable`] from async code); returns at once while the journal is degraded or
    /// once its writer has stopped.
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
    ///
    /// # Errors
    ///
    /// [`JournalError::Sqlite`] when the read fails, [`JournalError::Decode`] for an event this
    /// build cannot decode.
    pub fn events(&self) -> Result<Vec<Event>, JournalError> {
        self.flush();
        read_events(&self.shared.store.lock().conn, None)
    }

    /// The events of one agent, in order (flushes first).
    ///
    /// # Errors
    ///
    /// As [`SqliteJournal::events`].
    pub fn events_of(&self, agent: &str) -> Result<Vec<Event>, JournalError> {
        self.flush();
        read_events(&self.shared.store.lock().conn, Some(agent))
    }

    /// At most `limit` events with `seq > after`, in order (flushes first): resuming an event stream.
    ///
    /// # Errors
    ///
    /// As [`SqliteJournal::events`].
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
    ///
    /// # Errors
    ///
    /// As [`SqliteJournal::events`].
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
    ///
    /// # Errors
    ///
    /// [`JournalError::Sqlite`] when the read fails.
    pub fn agents(&self) -> Result<Vec<AgentKey>, JournalError> {
        self.flush();
        read_agents(&self.shared.store.lock().conn, true)
    }

    /// Every agent's record (flushes first), each from its latest snapshot and the events after it;
    /// equal to [`AgentRecord::replay`] of the whole log. An agent that needed `snapshot_every` or
    /// more events (a file from before snapshots, a lowered `snapshot_every`, an ignored snapshot) is
    /// snapshotted now, so the next restore is short (best effort: a failed snapshot is logged,
    /// not returned).
    ///
    /// # Errors
    ///
    /// As [`SqliteJournal::events`].
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
    ///   back to `WAITING_FOR_EVENT`. The interrupted turn is not resumed;
    /// * a halt whose `messages_discarded` listing the crash cut (it is written after the ack) is
    ///   listed: each cleared user event by its `queued` id, one `unlisted` entry for each other
    ///   message ([`AgentRecord::unlisted_discards`]).
    ///
    /// Stopped agents, and locked-out agents in `SAFETY_LOCKOUT`, are left as they are. Call it before
    /// the agents are spawned.
    ///
    /// # Errors
    ///
    /// As [`SqliteJournal::restore_records`]; nothing is appended then.
    pub fn recover_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        let mut records = self.restore_records()?;
        for record in &mut records {
            // A halt whose listing the crash cut (it is written after the ack): list what the
            // journal knows of the cleared messages now (see `AgentRecord::unlisted`).
            let listing = record.unlisted_discards();
            if !listing.is_empty() {
                tracing::info!(
                    agent = %record.key,
                    unlisted = record.unlisted(),
                    "listing the messages a halt cleared before the crash"
                );
                let kind = EventKind::MessagesDiscarded { messages: listing };
                self.append(&record.key, kind.clone());
                record.apply(&kind);
            }
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
pub(super) fn snapshot_restored(
    store: &mut Store,
    folded: &[&Folded],
) -> Result<(), rusqlite::Error> {
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
    fn push(&self, rows: impl IntoIterator<Item = (AgentKey, EventKind)>, at_ms: u64) -> u64 {
        let mut queue = self.shared.queue.lock();
        for (agent, kind) in rows {
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
                agent,
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
        self.push([(agent.clone(), kind)], now_ms())
    }

    /// One batch, one transaction: all of `kinds` are committed, or none.
    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        self.append_all_at(agent, kinds, now_ms())
    }

    /// [`Journal::append_all`], the events stamped `at_ms`.
    fn append_all_at(&self, agent: &AgentKey, kinds: Vec<EventKind>, at_ms: u64) -> u64 {
        self.push(kinds.into_iter().map(|kind| (agent.clone(), kind)), at_ms)
    }

    /// Under one lock of the queue, as [`Journal::append_all`]: one transaction.
    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, at_ms: u64) -> u64 {
        self.push(rows, at_ms)
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

    /// Read newest first along the `(agent, seq)` index, stopping at the first event older than
    /// `since_ms`: an hour of the agent's events at most. A failed read is logged and gives what
    /// was read (the window then starts emptier, as before restarts kept it).
    fn recent_usage(&self, agent: &AgentKey, since_ms: u64) -> Vec<(u64, u64)> {
        self.flush();
        let store = self.shared.store.lock();
        match read_recent_usage(&store.conn, agent.as_str(), since_ms) {
            Ok(calls) => calls,
            Err(err) => {
                tracing::error!(%agent, "journal: the last hour's usage not read: {err}");
                Vec::new()
            }
        }
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
pub(super) fn writer_loop(shared: &Shared) {
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
pub(super) fn write_batch(store: &mut Store, batch: &[Event]) -> Result<u64, rusqlite::Error> {
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
