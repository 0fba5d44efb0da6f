//! The body of `GET /api/events`: the [`EventHub`]'s feed as Server-Sent Events.
//!
//! Messages:
//! * a journal event: `id: <seq>`, `event: <kind>` (`state_changed`, `halted`, `limit_decided`, …),
//!   `data: <the Event as JSON>` (`{"seq", "at_ms", "agent", "kind": {"type", …}}`);
//! * an intervention notice (`intervention_asked`, `intervention_answered`,
//!   `intervention_withdrawn`): `event:` and `data:` only. Notices are not journaled, so they carry no
//!   `id` and do not move a client's resume point;
//! * `event: lagged`, `data: {"skipped": N}`: the client fell behind and `N` feed items (counted before
//!   the agent filter) were skipped. Reconnecting with `Last-Event-ID` replays them when the server
//!   keeps a durable journal;
//! * `event: replay_unavailable`, `data: {"last_event_id": N, "reason": …}`: the events after `N`
//!   could not be read back (a resume without a durable journal, or reading it failed, also while
//!   filling a gap); the stream goes on live;
//! * `: keep-alive` comment lines every [`EventHub::keep_alive`].
//!
//! The stream ends when the feed is gone or the hub is closed ([`EventHub::close`]: `warden serve`
//! closes it on SIGTERM/SIGINT, so a graceful shutdown does not wait for listening clients).
//!
//! Guarantees:
//! * Nothing is dropped silently: every skipped item is announced by `lagged` or `replay_unavailable`.
//! * Journal events come in sequence order. An event that arrives before a lower sequence number
//!   is held until the gap fills, for at most [`EventHub::reorder_wait`] (a durable append publishes
//!   only after its commit). Then the missing events are read from the hub's log when it has one;
//!   without a log the gap is given up on, and a late event is sent when it arrives, out of order.
//!   Events appended while the stream opens may likewise come late, or not at all when they were
//!   appended before the subscription took effect.
//! * Resuming with `Last-Event-ID: N` sends every event with `seq > N` from the hub's log, then the
//!   live feed, with no event twice.
//! * Asks already pending when the stream opens are sent first, as `intervention_asked`, once each.

use crate::events::{EventHub, EventLog, FeedItem, Notice, NoticeKind, Subscription};
use actix_web::web::{self, Bytes};
use std::{
    collections::{BTreeMap, BTreeSet, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};
use tokio::{sync::broadcast::error::RecvError, time::Instant};
use warden_protocols::{AgentKey, Event, Intervention};

/// Events read from the log per query while replaying.
pub const REPLAY_PAGE: usize = 500;

/// Events held back for a gap at most (then the gap is given up on).
pub const MAX_HELD: usize = 4096;

/// Puts journal events back in sequence order. See the module docs.
#[derive(Debug, Default)]
pub struct Reorder {
    /// The sequence number to send next (`None` until the first event).
    next: Option<u64>,
    /// Events below this were sent by a replay: later copies are dropped.
    floor: u64,
    held: BTreeMap<u64, Arc<FeedItem>>,
    /// When the current gap opened.
    held_since: Option<Instant>,
    /// Sequence numbers sent from the log to fill a gap: their live copies are dropped.
    filled: BTreeSet<u64>,
}

impl Reorder {
    /// Takes event `seq`; appends to `out` what can be sent now, in order.
    pub fn push(
        &mut self,
        seq: u64,
        item: Arc<FeedItem>,
        now: Instant,
        out: &mut Vec<Arc<FeedItem>>,
    ) {
        if seq < self.floor {
            return;
        }
        let next = *self.next.get_or_insert(seq);
        if seq < next {
            // Its place has passed (a given-up gap, or appended while the stream opened), or it was
            // read from the log already.
            if !self.filled.remove(&seq) {
                out.push(item);
            }
            return;
        }
        if seq > next {
            self.held.insert(seq, item);
            self.held_since.get_or_insert(now);
            if self.held.len() > MAX_HELD {
                self.give_up(out);
            }
            return;
        }
        out.push(item);
        let mut next = seq.saturating_add(1);
        while let Some(item) = self.held.remove(&next) {
            out.push(item);
            next = next.saturating_add(1);
        }
        self.next = Some(next);
        self.held_since = if self.held.is_empty() {
            None
        } else {
            Some(now)
        };
    }

    /// Takes event `seq` read from the log to fill a gap: like [`Reorder::push`], and a live copy
    /// arriving later is dropped.
    pub fn fill(
        &mut self,
        seq: u64,
        item: Arc<FeedItem>,
        now: Instant,
        out: &mut Vec<Arc<FeedItem>>,
    ) {
        let sent = out.len();
        self.push(seq, item, now, out);
        if out.len() > sent {
            self.filled.insert(seq);
            if self.filled.len() > MAX_HELD {
                self.filled.pop_first();
            }
        }
    }

    /// When the current gap is given up on.
    pub fn deadline(&self, wait: Duration) -> Option<Instant> {
        self.held_since.map(|since| since + wait)
    }

    /// Sends everything held, in order, and stops waiting for the gap.
    pub fn give_up(&mut self, out: &mut Vec<Arc<FeedItem>>) {
        let held = std::mem::take(&mut self.held);
        if let Some(&last) = held.keys().next_back() {
            self.next = Some(last.saturating_add(1));
        }
        out.extend(held.into_values());
        self.held_since = None;
    }

    /// A replay sent every event up to `last`: continue after it, and drop live copies.
    pub fn replayed_through(&mut self, last: u64) {
        self.floor = last.saturating_add(1);
        self.next = Some(self.floor);
    }

    /// After a lag: the next event received starts the order afresh.
    pub fn resync(&mut self) {
        self.next = None;
    }

    /// Events held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The missing sequence numbers `[from, to)` while events are held.
    pub fn gap(&self) -> Option<(u64, u64)> {
        let next = self.next?;
        let (&first, _) = self.held.first_key_value()?;
        Some((next, first))
    }
}

/// One SSE message. `data` is one line of JSON.
fn message(id: Option<u64>, event: &str, data: &str) -> Bytes {
    let mut text = String::with_capacity(data.len() + event.len() + 32);
    if let Some(id) = id {
        text.push_str(&format!("id: {id}\n"));
    }
    text.push_str(&format!("event: {event}\ndata: {data}\n\n"));
    Bytes::from(text)
}

fn journal_message(event: &Event) -> Bytes {
    let value = serde_json::to_value(event).unwrap_or_default();
    let kind = crate::journal::kind_name(&value["kind"]);
    message(Some(event.seq), &kind, &value.to_string())
}

fn notice_message(notice: &Notice) -> Bytes {
    message(None, notice.kind.as_str(), &notice.data.to_string())
}

struct Replay {
    log: Arc<dyn EventLog>,
    after: u64,
}

/// One client's stream. Build it with [`EventStream::new`], send [`EventStream::into_body`].
pub struct EventStream {
    rx: Subscription,
    out: VecDeque<Bytes>,
    /// Where past events are read from (resume, gaps).
    log: Option<Arc<dyn EventLog>>,
    replay: Option<Replay>,
    filter: Option<AgentKey>,
    reorder: Reorder,
    reorder_wait: Duration,
    keep_alive: tokio::time::Interval,
    /// Asks sent from the snapshot of pending ones: their live `intervention_asked` is not repeated.
    announced: HashSet<u64>,
    closed: bool,
    /// Resolves when the hub is closed (the server shuts down): the stream then ends.
    shutdown: futures::future::BoxFuture<'static, ()>,
}

impl EventStream {
    /// A stream of `hub`'s feed from `rx` (subscribed before `pending` was read), for one agent's
    /// items when `filter` is set, resuming after `resume` (a `Last-Event-ID`) when given.
    pub fn new(
        hub: &EventHub,
        rx: Subscription,
        filter: Option<AgentKey>,
        resume: Option<u64>,
        pending: Vec<Intervention>,
    ) -> Self {
        let period = hub.keep_alive().max(Duration::from_millis(1));
        let mut keep_alive = tokio::time::interval_at(Instant::now() + period, period);
        keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stream = EventStream {
            rx,
            out: VecDeque::from([Bytes::from_static(b": warden events\n\n")]),
            log: hub.log().cloned(),
            replay: None,
            filter,
            reorder: Reorder::default(),
            reorder_wait: hub.reorder_wait(),
            keep_alive,
            announced: HashSet::new(),
            closed: false,
            shutdown: Box::pin(hub.closed()),
        };
        if let Some(after) = resume {
            match hub.log() {
                Some(log) => {
                    stream.replay = Some(Replay {
                        log: log.clone(),
                        after,
                    })
                }
                None => stream.unavailable(after, "this server keeps no durable journal"),
            }
        }
        for intervention in pending {
            let notice = Notice::asked(&intervention);
            if stream.wanted(&notice.agent) {
                stream.announced.insert(intervention.id);
                stream.out.push_back(notice_message(&notice));
            }
        }
        stream
    }

    /// The response body.
    pub fn into_body(
        self,
    ) -> impl futures::Stream<Item = Result<Bytes, actix_web::Error>> + 'static {
        futures::stream::unfold(self, |mut stream| async move {
            let chunk = stream.next_chunk().await?;
            Some((Ok(chunk), stream))
        })
    }

    fn wanted(&self, agent: &AgentKey) -> bool {
        self.filter.as_ref().map_or(true, |f| f == agent)
    }

    fn unavailable(&mut self, after: u64, reason: &str) {
        let data = serde_json::json!({ "last_event_id": after, "reason": reason });
        self.out
            .push_back(message(None, "replay_unavailable", &data.to_string()));
    }

    /// The next chunk to send; `None` when the feed is gone.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.out.pop_front() {
                return Some(chunk);
            }
            if self.closed {
                return None;
            }
            if let Some(replay) = self.replay.take() {
                self.replay_page(replay).await;
                continue;
            }
            let deadline = self.reorder.deadline(self.reorder_wait);
            let woke = tokio::select! {
                received = self.rx.recv() => Woke::Received(received),
                _ = self.keep_alive.tick() => Woke::KeepAlive,
                _ = sleep_until(deadline) => Woke::GapTimedOut,
                _ = &mut self.shutdown => Woke::Shutdown,
            };
            match woke {
                Woke::Received(received) => self.received(received),
                Woke::KeepAlive => self.out.push_back(Bytes::from_static(b": keep-alive\n\n")),
                Woke::GapTimedOut => self.fill_gap().await,
                Woke::Shutdown => self.closed = true,
            }
        }
    }

    /// The reorder wait is over: reads the missing events from the log (if any), then sends
    /// everything held.
    async fn fill_gap(&mut self) {
        let mut ready = Vec::new();
        if let (Some(log), Some((from, to))) = (self.log.clone(), self.reorder.gap()) {
            let count = usize::try_from(to - from).map_or(MAX_HELD, |n| n.min(MAX_HELD));
            let after = from.saturating_sub(1);
            match web::block(move || log.events_since(after, count)).await {
                Ok(Ok(events)) => {
                    let now = Instant::now();
                    for event in events.into_iter().filter(|e| e.seq < to) {
                        let seq = event.seq;
                        self.reorder
                            .fill(seq, Arc::new(FeedItem::Journal(event)), now, &mut ready);
                    }
                }
                Ok(Err(err)) => self.unavailable(after, &err.to_string()),
                Err(err) => self.unavailable(after, &err.to_string()),
            }
        }
        self.reorder.give_up(&mut ready);
        self.send_all(ready);
    }

    async fn replay_page(&mut self, replay: Replay) {
        let Replay { log, after } = replay;
        let reader = log.clone();
        let page = web::block(move || reader.events_since(after, REPLAY_PAGE)).await;
        let events = match page {
            Ok(Ok(events)) => events,
            Ok(Err(err)) => return self.unavailable(after, &err.to_string()),
            Err(err) => return self.unavailable(after, &err.to_string()),
        };
        let last = events.last().map_or(after, |e| e.seq);
        let more = events.len() == REPLAY_PAGE;
        for event in &events {
            if self.wanted(&event.agent) {
                self.out.push_back(journal_message(event));
            }
        }
        self.reorder.replayed_through(last);
        if more {
            self.replay = Some(Replay { log, after: last });
        }
    }

    fn received(&mut self, received: Result<Arc<FeedItem>, RecvError>) {
        let mut ready = Vec::new();
        match received {
            Ok(item) => match &*item {
                FeedItem::Journal(event) => {
                    self.reorder
                        .push(event.seq, item.clone(), Instant::now(), &mut ready);
                }
                FeedItem::Notice(notice) => {
                    let repeated = notice.kind == NoticeKind::InterventionAsked
                        && notice.data["id"]
                            .as_u64()
                            .is_some_and(|id| self.announced.contains(&id));
                    if !repeated {
                        ready.push(item);
                    }
                }
            },
            Err(RecvError::Lagged(skipped)) => {
                self.reorder.give_up(&mut ready);
                self.send_all(std::mem::take(&mut ready));
                self.reorder.resync();
                let data = serde_json::json!({ "skipped": skipped });
                self.out
                    .push_back(message(None, "lagged", &data.to_string()));
            }
            Err(RecvError::Closed) => {
                self.reorder.give_up(&mut ready);
                self.closed = true;
            }
        }
        self.send_all(ready);
    }

    fn send_all(&mut self, items: Vec<Arc<FeedItem>>) {
        for item in items {
            if !self.wanted(item.agent()) {
                continue;
            }
            let chunk = match &*item {
                FeedItem::Journal(event) => journal_message(event),
                FeedItem::Notice(notice) => notice_message(notice),
            };
            self.out.push_back(chunk);
        }
    }
}

/// What woke a waiting stream.
enum Woke {
    Received(Result<Arc<FeedItem>, RecvError>),
    KeepAlive,
    GapTimedOut,
    Shutdown,
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_protocols::EventKind;

    fn item(seq: u64) -> Arc<FeedItem> {
        Arc::new(FeedItem::Journal(Event {
            seq,
            at_ms: 0,
            agent: "a".into(),
            kind: EventKind::ErrorsReset,
        }))
    }

    fn seqs(items: &[Arc<FeedItem>]) -> Vec<u64> {
        items
            .iter()
            .map(|i| match &**i {
                FeedItem::Journal(e) => e.seq,
                FeedItem::Notice(_) => 0,
            })
            .collect()
    }

    fn push(r: &mut Reorder, seq: u64) -> Vec<u64> {
        let mut out = Vec::new();
        r.push(seq, item(seq), Instant::now(), &mut out);
        seqs(&out)
    }

    #[tokio::test]
    async fn events_after_a_gap_wait_for_it_then_go_in_order() {
        let mut r = Reorder::default();
        assert_eq!(push(&mut r, 5), [5]);
        assert_eq!(push(&mut r, 7), Vec::<u64>::new());
        assert_eq!(push(&mut r, 8), Vec::<u64>::new());
        assert!(r.deadline(Duration::from_secs(1)).is_some());
        assert_eq!(push(&mut r, 6), [6, 7, 8]);
        assert_eq!(r.held(), 0);
        assert!(r.deadline(Duration::from_secs(1)).is_none());
        assert_eq!(push(&mut r, 9), [9]);
    }

    #[tokio::test]
    async fn a_gap_given_up_on_sends_what_is_held_and_a_late_event_still_goes_out() {
        let mut r = Reorder::default();
        assert_eq!(push(&mut r, 1), [1]);
        assert_eq!(push(&mut r, 3), Vec::<u64>::new());
        let mut out = Vec::new();
        r.give_up(&mut out);
        assert_eq!(seqs(&out), [3]);
        assert_eq!(push(&mut r, 2), [2], "late, but not dropped");
        assert_eq!(push(&mut r, 4), [4]);
    }

    #[tokio::test]
    async fn a_replay_floor_drops_live_copies_of_replayed_events() {
        let mut r = Reorder::default();
        r.replayed_through(10);
        assert_eq!(push(&mut r, 9), Vec::<u64>::new());
        assert_eq!(push(&mut r, 10), Vec::<u64>::new());
        assert_eq!(push(&mut r, 12), Vec::<u64>::new());
        assert_eq!(push(&mut r, 11), [11, 12]);
    }

    #[tokio::test]
    async fn an_event_filled_from_the_log_is_not_sent_again_when_its_live_copy_comes() {
        let mut r = Reorder::default();
        assert_eq!(push(&mut r, 1), [1]);
        assert_eq!(push(&mut r, 3), Vec::<u64>::new());
        assert_eq!(r.gap(), Some((2, 3)));
        let mut out = Vec::new();
        r.fill(2, item(2), Instant::now(), &mut out);
        assert_eq!(seqs(&out), [2, 3]);
        assert_eq!(r.gap(), None);
        assert_eq!(push(&mut r, 2), Vec::<u64>::new(), "the live copy");
        assert_eq!(push(&mut r, 4), [4]);
    }

    #[tokio::test]
    async fn too_many_held_events_give_the_gap_up() {
        let mut r = Reorder::default();
        assert_eq!(push(&mut r, 1), [1]);
        let mut sent = 0;
        for seq in 3..(3 + MAX_HELD as u64 + 1) {
            sent += push(&mut r, seq).len();
        }
        assert_eq!(sent, MAX_HELD + 1);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn a_message_is_id_event_data_and_a_blank_line() {
        assert_eq!(
            message(Some(7), "halted", "{\"a\":1}"),
            Bytes::from_static(b"id: 7\nevent: halted\ndata: {\"a\":1}\n\n")
        );
        assert_eq!(
            message(None, "lagged", "{}"),
            Bytes::from_static(b"event: lagged\ndata: {}\n\n")
        );
    }
}
