//! The live feed behind `GET /api/events`: an [`EventHub`] that journal events and intervention
//! notices are published to, a tee [`BroadcastJournal`] and a tee [`BroadcastBus`].
//!
//! Guarantees:
//! * [`BroadcastJournal::append`] is the inner journal's append plus, **only while someone listens**,
//!   one clock read, one clone of the event kind (in a one-element `Vec` for `append`: the tee calls
//!   [`Journal::append_all_at`]) and one `broadcast::Sender::send` of an `Arc`. With no subscriber it
//!   adds one atomic load of the hub's own listener count and nothing else: no lock, no allocation.
//!   (`broadcast::Sender::receiver_count` is not used on this path: it takes the channel's lock.)
//! * An event is published after the inner journal's `append` returned, so a durable event (a halt,
//!   a lockout, a limit decision) on the feed is already on disk.
//! * Publishing never blocks an appender: the channel is bounded, and a subscriber that falls behind
//!   loses the oldest items and is told how many (`RecvError::Lagged`), never silently.
//! * Every `intervention_asked` notice is followed by exactly one `intervention_answered` or
//!   `intervention_withdrawn` notice with the same id (when someone listens at both moments).
//! * Each published item is serialised for the event stream once, however many listen
//!   ([`Published::sse`]); an event's `at_ms` is the one the inner journal keeps (the tee stamps it
//!   and hands it over with [`Journal::append_all_at`]), so a live copy equals a replayed one.
//! * Sequence numbers are the inner journal's. Appends on different threads may publish out of
//!   sequence order (a durable append waits for its commit); the event stream puts them back in order.

use crate::journal::SqliteJournal;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::sync::broadcast::{self, error::RecvError};
use warden_actors::{
    now_ms,
    safety::{BusError, ChannelInterventionBus, InterventionBus},
    Journal, MemoryJournal, NotDurable,
};
use warden_protocols::{AgentKey, Event, EventKind, Intervention, OperatorReply};

/// Items a subscriber may fall behind by before it lags (the channel's capacity). A halt of a
/// large fleet publishes a few items per agent at once; with 1,024 a 10,000-agent halt made every
/// stream lag and read the rest back from the journal (the last `STOPPED` arrived 643–676 ms after
/// the halt, debug build; 419–421 ms with this capacity). The ring is allocated up front: one
/// pointer-sized item and its slot bookkeeping each, about 3 MB per server, not per subscriber.
pub const DEFAULT_CAPACITY: usize = 65_536;

/// How often an idle event stream sends a keep-alive comment.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How long the event stream holds events back waiting for a missing sequence number.
pub const DEFAULT_REORDER_WAIT: Duration = Duration::from_secs(1);

/// One published [`FeedItem`] and its Server-Sent Events message, rendered once (by the first
/// stream that sends it) and shared by every subscriber: fifty listeners cost one serialisation.
#[derive(Debug)]
pub struct Published {
    item: Arc<FeedItem>,
    sse: std::sync::OnceLock<actix_web::web::Bytes>,
}

impl Published {
    /// Wraps `item`; its SSE message is rendered later, on first use.
    pub fn new(item: FeedItem) -> Self {
        Published {
            item: Arc::new(item),
            sse: std::sync::OnceLock::new(),
        }
    }

    /// The published item.
    pub fn item(&self) -> &FeedItem {
        &self.item
    }

    /// The SSE message (`id:`/`event:`/`data:`), rendered on first use.
    pub fn sse(&self) -> &actix_web::web::Bytes {
        self.sse.get_or_init(|| render(&self.item))
    }
}

/// One thing on the feed.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedItem {
    /// A journaled event (its `seq` is the journal's).
    Journal(Event),
    /// Not journaled: an operator-facing notice about an intervention.
    Notice(Notice),
}

impl FeedItem {
    /// The agent the item is about.
    pub fn agent(&self) -> &AgentKey {
        match self {
            FeedItem::Journal(event) => &event.agent,
            FeedItem::Notice(notice) => &notice.agent,
        }
    }
}

/// An intervention notice: `kind` is the SSE event name, `data` its JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice {
    /// What it says; also its SSE event name ([`NoticeKind::as_str`]).
    pub kind: NoticeKind,
    /// The agent whose intervention it is (what `?agent=KEY` filters on).
    pub agent: AgentKey,
    /// The JSON sent as the SSE `data:` (see [`NoticeKind`] for each kind's fields).
    pub data: serde_json::Value,
}

/// What a [`Notice`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// An ask is pending; `data` is the [`Intervention`] (answer it by its `id`).
    InterventionAsked,
    /// The ask was answered: `{"id", "agent", "answer"}`, and `"answered_by": {"operator", "note"}`
    /// when the bus said who.
    InterventionAnswered,
    /// The ask ended without an answer (timed out, halted, bus closed): `{"id", "agent", "reason"}`.
    InterventionWithdrawn,
}

impl NoticeKind {
    /// The SSE event name.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::InterventionAsked => "intervention_asked",
            NoticeKind::InterventionAnswered => "intervention_answered",
            NoticeKind::InterventionWithdrawn => "intervention_withdrawn",
        }
    }
}

impl Notice {
    /// `intervention_asked` for `intervention`.
    pub fn asked(intervention: &Intervention) -> Self {
        Notice {
            kind: NoticeKind::InterventionAsked,
            agent: intervention.agent.clone(),
            data: serde_json::to_value(intervention).unwrap_or_default(),
        }
    }

    fn answered(id: u64, agent: &AgentKey, reply: &OperatorReply) -> Self {
        let mut data = serde_json::json!({ "id": id, "agent": agent, "answer": reply.answer });
        if let Some(by) = &reply.by {
            data["answered_by"] = serde_json::to_value(by).unwrap_or_default();
        }
        Notice {
            kind: NoticeKind::InterventionAnswered,
            agent: agent.clone(),
            data,
        }
    }

    fn withdrawn(id: u64, agent: &AgentKey, reason: &str) -> Self {
        Notice {
            kind: NoticeKind::InterventionWithdrawn,
            agent: agent.clone(),
            data: serde_json::json!({ "id": id, "agent": agent, "reason": reason }),
        }
    }
}

/// Why past events could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot replay the journal: {0}")]
pub struct ReplayError(pub String);

/// A journal that can read its events back, for resuming a stream with `Last-Event-ID`.
pub trait EventLog: Send + Sync + 'static {
    /// Events with `seq > after`, in `seq` order, at most `limit`.
    fn events_since(&self, after: u64, limit: usize) -> Result<Vec<Event>, ReplayError>;

    /// The last `limit` events (of `agent` only, when given), oldest first, with the journal's
    /// highest `seq` read at the same moment.
    fn recent(&self, agent: Option<&AgentKey>, limit: usize) -> Result<RecentEvents, ReplayError>;
}

/// The newest events of a journal: the body of `GET /api/events/recent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecentEvents {
    /// Oldest first.
    pub events: Vec<Event>,
    /// The journal's highest `seq` when they were read: a stream resumed after it
    /// (`Last-Event-ID: head`) continues exactly where the list ends, with no gap and no repeat.
    pub head: u64,
}

impl EventLog for SqliteJournal {
    fn events_since(&self, after: u64, limit: usize) -> Result<Vec<Event>, ReplayError> {
        self.since(after, limit)
            .map_err(|e| ReplayError(e.to_string()))
    }

    fn recent(&self, agent: Option<&AgentKey>, limit: usize) -> Result<RecentEvents, ReplayError> {
        let (events, head) = SqliteJournal::recent(self, agent.map(AgentKey::as_str), limit)
            .map_err(|e| ReplayError(e.to_string()))?;
        Ok(RecentEvents { events, head })
    }
}

impl EventLog for MemoryJournal {
    fn events_since(&self, after: u64, limit: usize) -> Result<Vec<Event>, ReplayError> {
        Ok(self
            .events()
            .into_iter()
            .filter(|e| e.seq > after)
            .take(limit)
            .collect())
    }

    fn recent(&self, agent: Option<&AgentKey>, limit: usize) -> Result<RecentEvents, ReplayError> {
        Ok(self.inspect(|all| {
            let head = all.last().map_or(0, |e| e.seq);
            let mut events: Vec<Event> = all
                .iter()
                .rev()
                .filter(|e| agent.is_none_or(|a| &e.agent == a))
                .take(limit)
                .cloned()
                .collect();
            events.reverse();
            RecentEvents { events, head }
        }))
    }
}

/// Where feed items are published; cheap to clone. See the module docs.
#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<Arc<Published>>,
    /// Open [`Subscription`]s (read lock-free by every append).
    listeners: Arc<AtomicUsize>,
    log: Option<Arc<dyn EventLog>>,
    keep_alive: Duration,
    reorder_wait: Duration,
    /// `true` once [`EventHub::close`] was called: every stream ends.
    closed: Arc<tokio::sync::watch::Sender<bool>>,
}

impl std::fmt::Debug for EventHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHub")
            .field("subscribers", &self.subscribers())
            .field("replay", &self.log.is_some())
            .field("keep_alive", &self.keep_alive)
            .field("reorder_wait", &self.reorder_wait)
            .finish()
    }
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl EventHub {
    /// A hub whose subscribers may fall `capacity` items behind (at least 1) before they lag.
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        EventHub {
            tx,
            listeners: Arc::default(),
            log: None,
            keep_alive: DEFAULT_KEEP_ALIVE,
            reorder_wait: DEFAULT_REORDER_WAIT,
            closed: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Ends every event stream (open ones after what they already queued, new ones at once), so a
    /// graceful shutdown is not held up by clients that would listen forever. Publishing goes on.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Resolves once [`EventHub::close`] was called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closed.subscribe();
        async move {
            let _ = rx.wait_for(|closed| *closed).await;
        }
    }

    /// Streams resumed with `Last-Event-ID` replay the events they missed from `log`.
    pub fn with_log(mut self, log: Arc<dyn EventLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// How often an idle stream sends a keep-alive comment (default 15 s).
    pub fn with_keep_alive(mut self, every: Duration) -> Self {
        self.keep_alive = every;
        self
    }

    /// How long a stream holds events back for a missing sequence number (default 1 s).
    pub fn with_reorder_wait(mut self, wait: Duration) -> Self {
        self.reorder_wait = wait;
        self
    }

    /// `inner`, publishing every event it appends to this hub.
    pub fn journal(&self, inner: Arc<dyn Journal>) -> BroadcastJournal {
        BroadcastJournal {
            inner,
            tx: self.tx.clone(),
            listeners: self.listeners.clone(),
        }
    }

    /// `inner`, publishing every ask and its end to this hub. Answer asks on `inner`.
    pub fn intervention_bus(&self, inner: Arc<ChannelInterventionBus>) -> BroadcastBus {
        BroadcastBus {
            inner,
            hub: self.clone(),
        }
    }

    /// A new subscription: every item published from now on.
    pub fn subscribe(&self) -> Subscription {
        // Counted before subscribing: an append that sees the count early finds no receiver yet,
        // which is harmless; the other order could hide a receiver from an append.
        self.listeners.fetch_add(1, Ordering::SeqCst);
        Subscription {
            rx: self.tx.subscribe(),
            listeners: self.listeners.clone(),
        }
    }

    /// Open subscriptions.
    pub fn subscribers(&self) -> usize {
        self.listeners.load(Ordering::SeqCst)
    }

    fn listened(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    /// The log streams replay from, if any.
    pub fn log(&self) -> Option<&Arc<dyn EventLog>> {
        self.log.as_ref()
    }

    /// How often an idle stream sends a keep-alive comment (see [`EventHub::with_keep_alive`]).
    pub fn keep_alive(&self) -> Duration {
        self.keep_alive
    }

    /// How long a stream holds events back for a missing sequence number (see
    /// [`EventHub::with_reorder_wait`]).
    pub fn reorder_wait(&self) -> Duration {
        self.reorder_wait
    }

    /// Publishes `item` as it is (tests: any order of sequence numbers).
    #[cfg(test)]
    pub(crate) fn publish(&self, item: FeedItem) {
        let _ = self.tx.send(Arc::new(Published::new(item)));
    }

    /// Publishes a notice when someone listens.
    pub fn notify(&self, notice: Notice) {
        if self.listened() {
            let _ = self
                .tx
                .send(Arc::new(Published::new(FeedItem::Notice(notice))));
        }
    }
}

/// One subscriber's end of the feed; counted by its hub while it lives.
pub struct Subscription {
    rx: broadcast::Receiver<Arc<Published>>,
    listeners: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    /// The next item; `Lagged(n)` when `n` items were skipped because this subscriber fell behind.
    ///
    /// # Errors
    ///
    /// [`RecvError::Lagged`] as above (the next call goes on with the oldest item kept);
    /// [`RecvError::Closed`] once the hub and every publisher are gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future before it resolves loses no item (the next call gets
    /// it).
    pub async fn recv(&mut self) -> Result<Arc<FeedItem>, RecvError> {
        self.rx.recv().await.map(|p| p.item.clone())
    }

    /// [`Subscription::recv`] with the shared rendering of the item.
    ///
    /// # Errors
    ///
    /// As [`Subscription::recv`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Subscription::recv`].
    pub async fn recv_published(&mut self) -> Result<Arc<Published>, RecvError> {
        self.rx.recv().await
    }

    /// The next item if one is waiting (`Empty` if none, `Lagged(n)` as for `recv`).
    ///
    /// # Errors
    ///
    /// `TryRecvError::Empty` when nothing is waiting, `Lagged(n)` as for
    /// [`Subscription::recv`], `Closed` once every sender is gone.
    pub fn try_recv_published(&mut self) -> Result<Arc<Published>, broadcast::error::TryRecvError> {
        self.rx.try_recv()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.listeners.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A [`Journal`] that appends to `inner` and publishes each event to an [`EventHub`].
pub struct BroadcastJournal {
    inner: Arc<dyn Journal>,
    tx: broadcast::Sender<Arc<Published>>,
    listeners: Arc<AtomicUsize>,
}

impl std::fmt::Debug for BroadcastJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BroadcastJournal").finish_non_exhaustive()
    }
}

impl BroadcastJournal {
    /// Publishes the event as journaled: `at_ms` is the time the inner journal was given
    /// ([`Journal::append_all_at`]), so the live copy equals the one a replay reads back.
    fn publish(&self, agent: &AgentKey, seq: u64, at_ms: u64, kind: EventKind) {
        // `send` fails only when every subscriber left meanwhile: nobody to tell.
        let _ = self
            .tx
            .send(Arc::new(Published::new(FeedItem::Journal(Event {
                seq,
                at_ms,
                agent: agent.clone(),
                kind,
            }))));
    }
}

impl Journal for BroadcastJournal {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        if self.listeners.load(Ordering::Relaxed) == 0 {
            return self.inner.append(agent, kind);
        }
        let published = kind.clone();
        let at_ms = now_ms();
        let seq = self.inner.append_all_at(agent, vec![kind], at_ms);
        self.publish(agent, seq, at_ms, published);
        seq
    }

    /// The inner journal's `append_all` (one transaction), then each event published with its own
    /// sequence number (they are consecutive, ending at the returned one).
    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        if self.listeners.load(Ordering::Relaxed) == 0 {
            return self.inner.append_all(agent, kinds);
        }
        let published = kinds.clone();
        let at_ms = now_ms();
        let last = self.inner.append_all_at(agent, kinds, at_ms);
        let first = (last + 1).saturating_sub(published.len() as u64);
        for (kind, seq) in published.into_iter().zip(first..) {
            self.publish(agent, seq, at_ms, kind);
        }
        last
    }

    /// [`Journal::append_all`] at the caller's time.
    fn append_all_at(&self, agent: &AgentKey, kinds: Vec<EventKind>, at_ms: u64) -> u64 {
        if self.listeners.load(Ordering::Relaxed) == 0 {
            return self.inner.append_all_at(agent, kinds, at_ms);
        }
        let published = kinds.clone();
        let last = self.inner.append_all_at(agent, kinds, at_ms);
        let first = (last + 1).saturating_sub(published.len() as u64);
        for (kind, seq) in published.into_iter().zip(first..) {
            self.publish(agent, seq, at_ms, kind);
        }
        last
    }

    /// The inner journal's `append_rows` (durable together), then each row published with its own
    /// sequence number (consecutive, ending at the returned one).
    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, at_ms: u64) -> u64 {
        if self.listeners.load(Ordering::Relaxed) == 0 {
            return self.inner.append_rows(rows, at_ms);
        }
        let published = rows.clone();
        let last = self.inner.append_rows(rows, at_ms);
        let first = (last + 1).saturating_sub(published.len() as u64);
        for ((agent, kind), seq) in published.into_iter().zip(first..) {
            self.publish(&agent, seq, at_ms, kind);
        }
        last
    }

    /// The inner journal's: the tee adds nothing to wait for.
    fn durable(&self, seq: u64) -> BoxFuture<'static, Result<(), NotDurable>> {
        self.inner.durable(seq)
    }

    fn recent_usage(&self, agent: &AgentKey, since_ms: u64) -> Vec<(u64, u64)> {
        self.inner.recent_usage(agent, since_ms)
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }
}

/// An [`InterventionBus`] that asks through a [`ChannelInterventionBus`] and publishes
/// `intervention_asked` once the ask can be answered, then `intervention_answered` or
/// `intervention_withdrawn`.
pub struct BroadcastBus {
    inner: Arc<ChannelInterventionBus>,
    hub: EventHub,
}

impl std::fmt::Debug for BroadcastBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BroadcastBus").finish_non_exhaustive()
    }
}

impl BroadcastBus {
    /// The bus asks are answered on (`pending`, `answer`).
    pub fn inner(&self) -> &Arc<ChannelInterventionBus> {
        &self.inner
    }
}

/// Publishes `intervention_withdrawn` when an ask ends (or is dropped) without an answer.
struct WithdrawNotice<'a> {
    hub: &'a EventHub,
    id: u64,
    agent: AgentKey,
    reason: Option<String>,
}

impl Drop for WithdrawNotice<'_> {
    fn drop(&mut self) {
        if let Some(reason) = self.reason.take() {
            self.hub
                .notify(Notice::withdrawn(self.id, &self.agent, &reason));
        }
    }
}

impl InterventionBus for BroadcastBus {
    fn ask(&self, intervention: Intervention) -> BoxFuture<'_, Result<OperatorReply, BusError>> {
        Box::pin(async move {
            let notice = Notice::asked(&intervention);
            let (id, agent) = (intervention.id, intervention.agent.clone());
            let mut asked = self.inner.ask(intervention);
            // The first poll makes the ask pending; only then can an operator answer it.
            if let std::task::Poll::Ready(result) = futures::poll!(&mut asked) {
                return result;
            }
            self.hub.notify(notice);
            let mut withdraw = WithdrawNotice {
                hub: &self.hub,
                id,
                agent,
                reason: Some("withdrawn (timed out or halted)".into()),
            };
            let result = asked.await;
            match &result {
                Ok(answer) => {
                    withdraw.reason = None;
                    self.hub
                        .notify(Notice::answered(id, &withdraw.agent, answer));
                }
                Err(err) => withdraw.reason = Some(err.to_string()),
            }
            result
        })
    }
}

/// One SSE message. `data` is one line of JSON.
pub(crate) fn message(id: Option<u64>, event: &str, data: &str) -> actix_web::web::Bytes {
    let mut text = String::with_capacity(data.len() + event.len() + 32);
    if let Some(id) = id {
        text.push_str(&format!("id: {id}\n"));
    }
    text.push_str(&format!("event: {event}\ndata: {data}\n\n"));
    actix_web::web::Bytes::from(text)
}

pub(crate) fn journal_message(event: &Event) -> actix_web::web::Bytes {
    let value = serde_json::to_value(event).unwrap_or_default();
    let kind = crate::journal::kind_name(&value["kind"]);
    message(Some(event.seq), &kind, &value.to_string())
}

pub(crate) fn notice_message(notice: &Notice) -> actix_web::web::Bytes {
    message(None, notice.kind.as_str(), &notice.data.to_string())
}

/// The SSE message of a feed item (see [`Published::sse`], which renders each item once).
pub(crate) fn render(item: &FeedItem) -> actix_web::web::Bytes {
    match item {
        FeedItem::Journal(event) => journal_message(event),
        FeedItem::Notice(notice) => notice_message(notice),
    }
}
