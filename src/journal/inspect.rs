//! `warden journal tail|show|export` and the event lines `warden events` prints too.

use super::*;

/// Why a `warden journal` command failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The journal could not be opened or read (see [`JournalReader::open`]).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// `warden journal show` was given an agent with no event in the journal.
    #[error("no events for agent {0}")]
    UnknownAgent(String),
    /// Writing the output failed (a closed pipe, a full disk).
    #[error("write: {0}")]
    Io(#[from] std::io::Error),
    /// An event or record could not be encoded as JSON.
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
    /// The narrowest the agent column gets, in characters.
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
///
/// Reads with a [`JournalReader`]: safe beside a running server, which it neither blocks nor
/// locks out.
///
/// # Errors
///
/// [`InspectError::Journal`] when the file cannot be opened (missing, a directory, a newer
/// schema, not a database) or read; [`InspectError::Io`] when `out` fails.
///
/// # Examples
///
/// ```
/// use warden::{journal, Journal, SqliteJournal};
/// use warden::{AgentKey, AgentState, EventKind};
///
/// let db = std::env::temp_dir().join(format!("warden-doc-tail-{}.db", std::process::id()));
/// # let clean = |db: &std::path::Path| {
/// #     for end in ["", "-wal", "-shm", ".lock"] {
/// #         let _ = std::fs::remove_file(format!("{}{end}", db.display()));
/// #     }
/// # };
/// # clean(&db);
/// let writer = SqliteJournal::open(&db)?;
/// writer.append(
///     &AgentKey::new("innkeeper"),
///     EventKind::StateChanged {
///         from: AgentState::WaitingForEvent,
///         to: AgentState::Executing,
///         cause: "doc example".into(),
///     },
/// );
/// writer.flush();
///
/// let mut out = Vec::new();
/// journal::tail(&db, 10, true, &mut out)?;
/// let line = String::from_utf8(out).unwrap();
/// assert!(line.contains("\"state_changed\""));
/// # drop(writer);
/// # clean(&db);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
///
/// # Errors
///
/// [`InspectError::Journal`] when the file cannot be opened or read,
/// [`InspectError::UnknownAgent`] when `agent` has no event, [`InspectError::Io`] when `out`
/// fails, [`InspectError::Json`] when the record cannot be encoded.
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
    writeln!(out, "  role                 {}", record.role)?;
    if let Some(parent) = &record.parent {
        writeln!(out, "  parent               {parent}")?;
    }
    writeln!(out, "  state                {}", record.state)?;
    writeln!(out, "  emergency_stop       {}", record.emergency_stop())?;
    if let Some(lockout) = &record.lockout {
        writeln!(
            out,
            "  lockout              {}: {}",
            lockout.breaker, lockout.reason
        )?;
    }
    if let Some(stopped) = &record.stopped_by {
        writeln!(
            out,
            "  stopped_by           {}: {}",
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

/// `warden journal export`: every event, oldest first, one JSON object a line (as `tail --json`).
/// Snapshots are not exported: they are derived from the events.
///
/// # Errors
///
/// [`InspectError::Journal`] when the file cannot be opened or read, [`InspectError::Io`] when
/// `out` fails.
pub fn export_json(db: &Path, out: &mut dyn Write) -> Result<(), InspectError> {
    let reader = JournalReader::open(db)?;
    for event in reader.events()? {
        writeln!(out, "{}", serde_json::to_string(&event)?)?;
    }
    Ok(())
}

/// The default journal path as a `PathBuf`.
pub fn default_db() -> PathBuf {
    PathBuf::from(DEFAULT_DB)
}
