//! The [`Journal`] every agent hands its events to, and an in-memory implementation.
//!
//! Agents journal an event *before* they act on its consequence (see `AgentCell::emit`), so a journal
//! that is durable on `append` gives crash-safe state: [`warden_protocols::AgentRecord::replay`] rebuilds
//! any agent from it.

use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};
use warden_protocols::{AgentKey, Event, EventKind};

/// Where events go. Implementations must be cheap to call from an actor (no blocking on I/O per event
/// unless the event must be durable before it is acknowledged).
///
/// Every method is required, on purpose: a journal that wraps another (a tee, a filter) must forward
/// [`Journal::append_all`] and [`Journal::durable`] itself. A forgotten forward compiles silently with
/// a default and breaks crash safety: the `202` of `POST /api/agents/{key}/events` was once sent
/// before the event was on disk because the event-stream tee resolved `durable` at once.
pub trait Journal: Send + Sync + 'static {
    /// Appends one event and returns its sequence number.
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64;

    /// Appends several events of one agent, in order, so that they become durable together: a crash
    /// keeps all of them or none (the SQLite journal commits them in one transaction). Their sequence
    /// numbers are consecutive; returns the last (for an empty `kinds`, the last number handed out).
    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64;

    /// Appends the events of several agents at once — `rows` in the order given, each agent's own
    /// in the order of its changes — so that they become durable together, as
    /// [`Journal::append_all`] does for one agent; `at_ms` is their time (milliseconds since the
    /// epoch; a journal that keeps no time ignores it). Their sequence numbers are consecutive in
    /// the order given (row `i` of `n` gets `last + 1 - n + i`); returns the last (for empty `rows`,
    /// the last number handed out). A fleet halt journals its passive agents' halts this way: one
    /// call and one durability wait per batch, not per agent (`Supervisor::halt_all`).
    ///
    /// Required (no default): one `append_all` per agent would neither number the rows
    /// consecutively nor make them durable together, and a journal that wraps another must forward
    /// it (and publish the rows, for a tee).
    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, at_ms: u64) -> u64;

    /// [`Journal::append_all`] with the events' time given by the caller (`at_ms`, milliseconds
    /// since the epoch) instead of read from the clock, so a tee that also publishes the events (the
    /// API's event stream) shows the very `at_ms` the journal keeps. A journal that keeps no time may
    /// ignore it (the default does, and appends one event with [`Journal::append`]).
    fn append_all_at(&self, agent: &AgentKey, mut kinds: Vec<EventKind>, at_ms: u64) -> u64 {
        let _ = at_ms;
        match (kinds.pop(), kinds.is_empty()) {
            (Some(kind), true) => self.append(agent, kind),
            (Some(kind), false) => {
                kinds.push(kind);
                self.append_all(agent, kinds)
            }
            (None, _) => self.append_all(agent, kinds),
        }
    }

    /// Resolves once the event with sequence number `seq` is durable, without blocking a thread
    /// (for an acknowledgement that leaves the process, e.g. the API's `202`), or with the reason it
    /// never will be (its write failed for good, the journal was closed first). A journal that keeps
    /// nothing across a crash has nothing to wait for and resolves at once ([`already_durable`]).
    ///
    /// # Errors
    /// [`NotDurable::WriteFailed`] when the batch holding `seq` cannot be written (the journal is
    /// degraded, or gave up at close); [`NotDurable::Closed`] when the journal closed first.
    ///
    /// # Cancel safety
    /// Cancel safe: the future only waits. Dropping it neither undoes the event nor delays its
    /// write; ask again with the same `seq` to wait again.
    fn durable(&self, seq: u64) -> BoxFuture<'static, Result<(), NotDurable>>;

    /// The tokens of `agent`'s model calls journaled at or after `since_ms` (its `usage_recorded`
    /// events, milliseconds since the epoch), oldest first, each with the time it was journaled:
    /// what a restored agent's rolling budget (`safety.budget.tokens_per_hour`) starts from, so a
    /// restart does not forget the last hour's spending. Read once per restored agent, never on a
    /// hot path. A journal that keeps nothing across a restart has nothing to give (the default);
    /// one that wraps another must forward it, or a restart forgets the window again.
    fn recent_usage(&self, agent: &AgentKey, since_ms: u64) -> Vec<(u64, u64)> {
        let _ = (agent, since_ms);
        Vec::new()
    }

    /// `Some(reason)` while the journal cannot write (a failing disk): nothing appended now would
    /// survive a crash. Agents start no turn and accept no event meanwhile (fail closed: work a
    /// restart would not know about is work it could not stop). Cheap: called on hot paths.
    fn degraded(&self) -> Option<String>;
}

/// Why an event will never be durable. The event itself is not undone: it was appended (and acted
/// on) in memory, it is only not on disk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotDurable {
    /// The journal cannot write the batch holding the event (degraded: it keeps trying, so the event
    /// may still land later; "not durable" is what held when this was answered), or gave up on it at
    /// close.
    #[error("journal write failed: {reason}")]
    WriteFailed {
        /// The write error as the journal reported it.
        reason: String,
    },
    /// The journal was closed before the event was handed to it.
    #[error("journal is closed")]
    Closed,
}

/// A [`Journal::durable`] future that is already resolved, for journals that do not survive a
/// crash (or are durable on `append`).
pub fn already_durable() -> BoxFuture<'static, Result<(), NotDurable>> {
    Box::pin(std::future::ready(Ok(())))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Keeps every event in memory.
#[derive(Default)]
pub struct MemoryJournal {
    events: Mutex<Vec<Event>>,
    seq: AtomicU64,
}

impl std::fmt::Debug for MemoryJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryJournal")
            .field("events", &self.len())
            .finish_non_exhaustive()
    }
}

impl MemoryJournal {
    /// An empty journal; sequence numbers start at 1.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, Journal, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
    /// # use warden_protocols::{AgentRecord, EventKind, UserEvent, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let journal = Arc::new(MemoryJournal::new());
    /// assert!(journal.is_empty());
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    /// let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("hello")]));
    /// let bard = team.spawn(AgentSpec::assistant("bard", model)).unwrap();
    /// bard.ask(UserEvent::new("sing")).await.unwrap();
    ///
    /// let events = journal.events_of("bard");
    /// assert!(matches!(events[0].kind, EventKind::Spawned { .. }));
    /// assert!(events.iter().any(|e| matches!(e.kind, EventKind::TurnFinished { .. })));
    /// // Nothing to wait for: memory is as durable as it gets.
    /// journal.durable(events.last().unwrap().seq).await.unwrap();
    /// # });
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of every event, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// Runs `f` on the events, in order, without copying them (the journal is locked meanwhile).
    pub fn inspect<R>(&self, f: impl FnOnce(&[Event]) -> R) -> R {
        f(&self.events.lock())
    }

    /// A copy of the events of one agent, in order.
    pub fn events_of(&self, agent: &str) -> Vec<Event> {
        self.events
            .lock()
            .iter()
            .filter(|e| e.agent.as_str() == agent)
            .cloned()
            .collect()
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.events.lock().len()
    }

    /// Whether no event was appended yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Journal for MemoryJournal {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        self.append_all(agent, vec![kind])
    }

    /// Under one lock of the journal: the events are consecutive, in the journal and in numbering.
    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        self.append_all_at(agent, kinds, now_ms())
    }

    fn append_all_at(&self, agent: &AgentKey, kinds: Vec<EventKind>, at_ms: u64) -> u64 {
        let mut events = self.events.lock();
        let n = kinds.len() as u64;
        let first = self.seq.fetch_add(n, Ordering::Relaxed) + 1;
        events.extend(kinds.into_iter().zip(first..).map(|(kind, seq)| Event {
            seq,
            at_ms,
            agent: agent.clone(),
            kind,
        }));
        first + n - 1
    }

    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, at_ms: u64) -> u64 {
        let mut events = self.events.lock();
        let n = rows.len() as u64;
        let first = self.seq.fetch_add(n, Ordering::Relaxed) + 1;
        events.extend(
            rows.into_iter()
                .zip(first..)
                .map(|((agent, kind), seq)| Event {
                    seq,
                    at_ms,
                    agent,
                    kind,
                }),
        );
        first + n - 1
    }

    fn durable(&self, _seq: u64) -> BoxFuture<'static, Result<(), NotDurable>> {
        already_durable()
    }

    fn recent_usage(&self, agent: &AgentKey, since_ms: u64) -> Vec<(u64, u64)> {
        self.events
            .lock()
            .iter()
            .filter(|e| e.agent == *agent && e.at_ms >= since_ms)
            .filter_map(|e| match &e.kind {
                EventKind::UsageRecorded { usage, .. } => Some((e.at_ms, usage.total())),
                _ => None,
            })
            .collect()
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}

/// Drops every event (for benchmarks that measure the mailbox alone).
#[derive(Debug, Default)]
pub struct NullJournal {
    seq: AtomicU64,
}

impl Journal for NullJournal {
    fn append(&self, _agent: &AgentKey, _kind: EventKind) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn append_all(&self, _agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        let n = kinds.len() as u64;
        self.seq.fetch_add(n, Ordering::Relaxed) + n
    }

    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, _at_ms: u64) -> u64 {
        let n = rows.len() as u64;
        self.seq.fetch_add(n, Ordering::Relaxed) + n
    }

    fn durable(&self, _seq: u64) -> BoxFuture<'static, Result<(), NotDurable>> {
        already_durable()
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}
