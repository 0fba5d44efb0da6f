//! [`JournalReader`]: a read-only view of a journal file, beside a running server or without one.

use super::*;

/// A read-only view of a journal file, for inspection while warden may be running on it.
pub struct JournalReader {
    conn: Connection,
    /// The file's schema version (a schema-1 file has no snapshots and no `agents` table).
    version: u32,
}

impl std::fmt::Debug for JournalReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalReader")
            .field("schema_version", &self.version)
            .finish_non_exhaustive()
    }
}

impl JournalReader {
    /// Opens an existing journal read-only (never creates one, never migrates). It takes no
    /// [`JournalLock`]: a server may be writing the file meanwhile (WAL mode lets both go on), and
    /// each read sees the events committed when it starts.
    ///
    /// # Errors
    ///
    /// * [`JournalError::IsDirectory`] — `path` is a directory.
    /// * [`JournalError::Missing`] — no file there.
    /// * [`JournalError::NotAJournal`] — an empty file, or a SQLite database with no journal in it.
    /// * [`JournalError::Open`] — SQLite cannot open it (no permission, not a database).
    /// * [`JournalError::NewerSchema`] — written by a newer warden.
    /// * [`JournalError::Sqlite`] — another SQLite failure.
    ///
    /// # Examples
    ///
    /// ```
    /// use warden::journal::JournalError;
    /// use warden::{AgentKey, AgentState, EventKind, Journal, JournalReader, SqliteJournal};
    ///
    /// let db = std::env::temp_dir().join(format!("warden-doc-reader-{}.db", std::process::id()));
    /// # let clean = |db: &std::path::Path| {
    /// #     for end in ["", "-wal", "-shm", ".lock"] {
    /// #         let _ = std::fs::remove_file(format!("{}{end}", db.display()));
    /// #     }
    /// # };
    /// # clean(&db);
    /// // A reader never creates a journal.
    /// assert!(matches!(JournalReader::open(&db), Err(JournalError::Missing { .. })));
    ///
    /// let writer = SqliteJournal::open(&db)?;
    /// let innkeeper = AgentKey::new("innkeeper");
    /// writer.append(
    ///     &innkeeper,
    ///     EventKind::StateChanged {
    ///         from: AgentState::WaitingForEvent,
    ///         to: AgentState::Executing,
    ///         cause: "doc example".into(),
    ///     },
    /// );
    /// writer.flush(); // committed: readers see it
    ///
    /// // Beside the writer, which keeps the file open.
    /// let reader = JournalReader::open(&db)?;
    /// assert_eq!(reader.agents()?, vec![innkeeper.clone()]);
    /// assert_eq!(reader.events_of("innkeeper")?.len(), 1);
    /// let records = reader.restore_records()?;
    /// assert_eq!(records[0].state, AgentState::Executing);
    /// # drop(writer);
    /// # clean(&db);
    /// # Ok::<(), JournalError>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path_ref = path.as_ref();
        let shown = path_ref.display().to_string();
        if path_ref.is_dir() {
            return Err(JournalError::IsDirectory { path: shown });
        }
        if !path_ref.exists() {
            return Err(JournalError::Missing { path: shown });
        }
        let opened = |error| JournalError::Open {
            path: shown.clone(),
            error,
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let first = Connection::open_with_flags(path_ref, flags)
            .map_err(JournalError::Sqlite)
            .and_then(|conn| {
                conn.busy_timeout(Duration::from_secs(5))?;
                let version = schema_version(&conn)?;
                Ok((conn, version))
            });
        let (conn, version) = match first {
            Ok(opened) => opened,
            // A WAL journal whose shared-memory file does not exist and cannot be created: a
            // read-only mount (or directory) of a journal closed cleanly. Nobody can be writing it
            // there, so it is read as the file on disk (`immutable`: no locks, no -shm).
            Err(JournalError::Sqlite(error)) if cannot_open(&error) => {
                let conn = Connection::open_with_flags(
                    immutable_uri(path_ref),
                    flags | OpenFlags::SQLITE_OPEN_URI,
                )
                .map_err(opened)?;
                let version = schema_version(&conn).map_err(|e| match e {
                    JournalError::Sqlite(error) => opened(error),
                    other => other,
                })?;
                (conn, version)
            }
            Err(JournalError::Sqlite(error)) => return Err(opened(error)),
            Err(other) => return Err(other),
        };
        if version > SCHEMA_VERSION {
            return Err(JournalError::NewerSchema {
                path: shown,
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version == 0 {
            let empty = std::fs::metadata(path_ref).is_ok_and(|m| m.len() == 0);
            return Err(JournalError::NotAJournal { path: shown, empty });
        }
        Ok(JournalReader { conn, version })
    }

    /// Every event, in order of `seq` (the whole file: for a large journal prefer
    /// [`JournalReader::tail`]).
    ///
    /// # Errors
    ///
    /// [`JournalError::Sqlite`] when the read fails, [`JournalError::Decode`] for an event this
    /// build cannot decode.
    pub fn events(&self) -> Result<Vec<Event>, JournalError> {
        read_events(&self.conn, None)
    }

    /// The events of agent `agent`, in order of `seq`; empty for a key with no event.
    ///
    /// # Errors
    ///
    /// As [`JournalReader::events`].
    pub fn events_of(&self, agent: &str) -> Result<Vec<Event>, JournalError> {
        read_events(&self.conn, Some(agent))
    }

    /// The last `n` events, oldest first.
    ///
    /// # Errors
    ///
    /// As [`JournalReader::events`].
    pub fn tail(&self, n: usize) -> Result<Vec<Event>, JournalError> {
        read_tail(&self.conn, n)
    }

    /// Every agent with an event, in order of its first event.
    ///
    /// # Errors
    ///
    /// [`JournalError::Sqlite`] when the read fails.
    pub fn agents(&self) -> Result<Vec<AgentKey>, JournalError> {
        read_agents(&self.conn, self.version >= 2)
    }

    /// Every agent's record from its snapshot and the events after it, read in one transaction (a
    /// consistent view while warden writes). Unlike [`SqliteJournal::restore_records`] it writes
    /// no snapshot.
    ///
    /// # Errors
    ///
    /// As [`JournalReader::events`].
    pub fn restore_records(&self) -> Result<Vec<AgentRecord>, JournalError> {
        let tx = self.conn.unchecked_transaction()?;
        let folded = fold_all(&tx, self.version)?;
        Ok(folded.into_iter().map(|f| f.record).collect())
    }

    /// The agent's usable snapshot (see the module docs), if any: its seq, and the record rebuilt
    /// from it and the events after it. `None` when the agent has none (or the file predates
    /// snapshots).
    ///
    /// # Errors
    ///
    /// As [`JournalReader::events`].
    pub fn snapshot_of(&self, agent: &str) -> Result<Option<(u64, AgentRecord)>, JournalError> {
        if self.version < 2 {
            return Ok(None);
        }
        let tx = self.conn.unchecked_transaction()?;
        let folded = fold_agent(&tx, &AgentKey::new(agent), true)?;
        Ok(folded.snapshot_seq.map(|seq| (seq, folded.record)))
    }
}

/// Whether SQLite could not open the file (`SQLITE_CANTOPEN`).
fn cannot_open(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::CannotOpen
    )
}

/// `file:PATH?immutable=1`, the path percent-encoded as SQLite's URI filenames want it.
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-_.~".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}
