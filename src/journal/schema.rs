//! The file: its schema and migrations, the exclusive [`JournalLock`] a writer holds, and the
//! integrity check at open.

use super::*;

/// `MIGRATIONS[i]` takes a database from version `i` to version `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
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
    ///
    /// # Errors
    ///
    /// [`JournalError::InUse`] (with the holder's pid) when another open file handle holds the
    /// lock, in this process or another; [`JournalError::Lock`] when the lock file cannot be
    /// created, locked or written.
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
pub(super) fn is_corruption(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// `PRAGMA quick_check` (O(size), without the index-to-table cross checks of `integrity_check`):
/// `Ok` when it answers `ok`, else [`JournalError::Corrupt`] with its first findings.
pub(super) fn quick_check(conn: &Connection, path: &str) -> Result<(), JournalError> {
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

/// Brings `conn` to [`SCHEMA_VERSION`], one transaction per step (a failed step leaves the file
/// at the previous version). Refuses a newer file. Returns the version reached.
///
/// # Errors
///
/// [`JournalError::NewerSchema`] for a file newer than this build (labelled with `path`);
/// [`JournalError::Sqlite`] when a statement fails.
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
///
/// # Errors
///
/// [`JournalError::Sqlite`] when the query fails (for one, when the file is not a database).
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
