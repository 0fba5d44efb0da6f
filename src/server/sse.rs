//! The body of `GET /api/events`: the [`EventHub`]'s feed as Server-Sent Events.
//!
//! Messages:
//! * a journal event: `id: <seq>`, `event: <kind>` (`state_changed`, `halted`, `limit_decided`, …),
//!   `data: <the Event as JSON>` (`{"seq", "at_ms", "agent", "kind": {"type", …}}`);
//! * an intervention notice (`intervention_asked`, `intervention_answered`,
//!   `intervention_withdrawn`): `event:` and `data:` only. Notices are not journaled, so they carry no
//!   `id` and do not move a client's resume point;
//! * `event: lagged`, `data: {"skipped": N}`: the client fell behind and `N` feed items (counted before
//!   the agent filter) were skipped. It comes before any event it covers: when the hub has a log, the
//!   stream then reads the missed journal events back from it, in order, and goes on live (only
//!   notices are lost); without a log, events held for a gap are sent, and an event arriving later
//!   whose place has passed is dropped and announced by another `lagged` (`N` = such events);
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
//!   without a log the gap is given up on, and a late event is sent when it arrives, out of order
//!   (except after a lag: see `lagged`). After a lag ids never go backwards.
//! * A journal event's `data` is the same bytes live and replayed (the live copy carries the
//!   journal's `at_ms`). Each live item is rendered once and shared by every stream
//!   ([`crate::server::events::Published`]); what is ready is sent as one chunk.
//!   Events appended while the stream opens may likewise come late, or not at all when they were
//!   appended before the subscription took effect.
//! * Resuming with `Last-Event-ID: N` sends every event with `seq > N` from the hub's log, then the
//!   live feed, with no event twice.
//! * Asks already pending when the stream opens are sent first, as `intervention_asked`, once each.

use crate::server::events::{
    journal_message, message, notice_message, EventHub, EventLog, FeedItem, Notice, NoticeKind,
    Published, Subscription,
};
use actix_web::web::{self, Bytes};
use std::{
    collections::{BTreeMap, BTreeSet, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};
use tokio::{
    sync::broadcast::error::{RecvError, TryRecvError},
    time::Instant,
};
use warden_protocols::{AgentKey, Intervention};

/// Events read from the log per query while replaying.
pub(super) const REPLAY_PAGE: usize = 500;

/// Events held back for a gap at most (then the gap is given up on).
pub(super) const MAX_HELD: usize = 4096;

/// Puts journal events back in sequence order. See the module docs.
#[derive(Debug, Default)]
pub(super) struct Reorder {
    /// The sequence number to send next (`None` until the first event).
    next: Option<u64>,
    /// Events below this were sent by a replay: later copies are dropped.
    floor: u64,
    held: BTreeMap<u64, Arc<Published>>,
    /// When the current gap opened.
    held_since: Option<Instant>,
    /// Sequence numbers sent from the log to fill a gap: their live copies are dropped.
    filled: BTreeSet<u64>,
    /// After a lag without a log: events whose place has passed are dropped (and counted in
    /// `dropped_late`) instead of sent out of order.
    strict: bool,
    dropped_late: u64,
}

impl Reorder {
    /// Takes event `seq`; appends to `out` what can be sent now, in order.
    pub(super) fn push(
        &mut self,
        seq: u64,
        item: Arc<Published>,
        now: Instant,
        out: &mut Vec<Arc<Published>>,
    ) {
        if seq < self.floor {
            return;
        }
        let next = *self.next.get_or_insert(seq);
        if seq < next {
            // Its place has passed (a given-up gap, or appended while the stream opened), or it was
            // read from the log already.
            if self.filled.remove(&seq) {
                return;
            }
            if self.strict {
                self.dropped_late += 1;
            } else {
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
    pub(super) fn fill(
        &mut self,
        seq: u64,
        item: Arc<Published>,
        now: Instant,
        out: &mut Vec<Arc<Published>>,
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
    pub(super) fn deadline(&self, wait: Duration) -> Option<Instant> {
        self.held_since.map(|since| since + wait)
    }

    /// Sends everything held, in order, and stops waiting for the gap.
    pub(super) fn give_up(&mut self, out: &mut Vec<Arc<Published>>) {
        let held = std::mem::take(&mut self.held);
        if let Some(&last) = held.keys().next_back() {
            self.next = Some(last.saturating_add(1));
        }
        out.extend(held.into_values());
        self.held_since = None;
    }

    /// A replay sent every event up to `last`: continue after it, and drop live copies.
    pub(super) fn replayed_through(&mut self, last: u64) {
        self.floor = last.saturating_add(1);
        self.next = Some(self.floor);
    }

    /// The last sequence number sent in order, if any.
    pub(super) fn last_sent(&self) -> Option<u64> {
        self.next.map(|next| next.saturating_sub(1))
    }

    /// Forgets what is held (a replay from the log sends it).
    pub(super) fn drop_held(&mut self) {
        self.held.clear();
        self.held_since = None;
    }

    /// After a lag without a log ([`Reorder::give_up`] first): from now on an event whose place
    /// has passed is dropped and counted ([`Reorder::take_dropped_late`]), never sent out of order.
    pub(super) fn after_lag(&mut self) {
        self.strict = true;
    }

    /// Events dropped since the last call because their place had passed.
    pub(super) fn take_dropped_late(&mut self) -> u64 {
        std::mem::take(&mut self.dropped_late)
    }

    /// Events held now.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }

    /// The missing sequence numbers `[from, to)` while events are held.
    pub(super) fn gap(&self) -> Option<(u64, u64)> {
        let next = self.next?;
        let (&first, _) = self.held.first_key_value()?;
        Some((next, first))
    }
}

/// Items taken from the feed at once before they are sent (one wake-up, one chunk for a burst).
const BURST: usize = 64;

struct Replay {
    log: Arc<dyn EventLog>,
    after: u64,
}

/// One client's stream. Build it with [`EventStream::new`], send [`EventStream::into_body`].
pub(super) struct EventStream {
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
    pub(super) fn new(
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
    pub(super) fn into_body(
        self,
    ) -> impl futures::Stream<Item = Result<Bytes, actix_web::Error>> + 'static {
        futures::stream::unfold(self, |mut stream| async move {
            let chunk = stream.next_chunk().await?;
            Some((Ok(chunk), stream))
        })
    }

    fn wanted(&self, agent: &AgentKey) -> bool {
        self.filter.as_ref().is_none_or(|f| f == agent)
    }

    fn unavailable(&mut self, after: u64, reason: &str) {
        let data = serde_json::json!({ "last_event_id": after, "reason": reason });
        self.out
            .push_back(message(None, "replay_unavailable", &data.to_string()));
    }

    /// The next chunk to send; `None` when the feed is gone.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(first) = self.out.pop_front() {
                if self.out.is_empty() {
                    return Some(first);
                }
                // One chunk for everything ready: one write, one chunk header.
                let len = first.len() + self.out.iter().map(Bytes::len).sum::<usize>();
                let mut chunk = web::BytesMut::with_capacity(len);
                chunk.extend_from_slice(&first);
                for more in self.out.drain(..) {
                    chunk.extend_from_slice(&more);
                }
                return Some(chunk.freeze());
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
                received = self.rx.recv_published() => Woke::Received(received),
                _ = self.keep_alive.tick() => Woke::KeepAlive,
                _ = sleep_until(deadline) => Woke::GapTimedOut,
                _ = &mut self.shutdown => Woke::Shutdown,
            };
            match woke {
                Woke::Received(received) => {
                    self.received(received);
                    // Whatever else is waiting goes in the same chunk.
                    for _ in 1..BURST {
                        match self.rx.try_recv_published() {
                            Ok(item) => self.received(Ok(item)),
                            Err(TryRecvError::Lagged(n)) => {
                                self.received(Err(RecvError::Lagged(n)))
                            }
                            Err(TryRecvError::Closed) => self.received(Err(RecvError::Closed)),
                            Err(TryRecvError::Empty) => break,
                        }
                        if self.replay.is_some() {
                            break;
                        }
                    }
                }
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
                        let item = Arc::new(Published::new(FeedItem::Journal(event)));
                        self.reorder.fill(seq, item, now, &mut ready);
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

    fn received(&mut self, received: Result<Arc<Published>, RecvError>) {
        let mut ready = Vec::new();
        match received {
            Ok(item) => match item.item() {
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
                // The notice first: no event it covers may come before it.
                let data = serde_json::json!({ "skipped": skipped });
                self.out
                    .push_back(message(None, "lagged", &data.to_string()));
                match (self.log.clone(), self.reorder.last_sent()) {
                    // Read the missed events back, in order; what is held is in the log too.
                    (Some(log), Some(after)) => {
                        self.reorder.drop_held();
                        self.replay = Some(Replay { log, after });
                    }
                    // Send what is held, then only events after it: a late one is dropped and
                    // announced, never sent out of order.
                    _ => {
                        self.reorder.give_up(&mut ready);
                        self.reorder.after_lag();
                    }
                }
            }
            Err(RecvError::Closed) => {
                self.reorder.give_up(&mut ready);
                self.closed = true;
            }
        }
        self.send_all(ready);
    }

    fn send_all(&mut self, items: Vec<Arc<Published>>) {
        for item in items {
            if self.wanted(item.item().agent()) {
                self.out.push_back(item.sse().clone());
            }
        }
        let late = self.reorder.take_dropped_late();
        if late > 0 {
            let data = serde_json::json!({ "skipped": late });
            self.out
                .push_back(message(None, "lagged", &data.to_string()));
        }
    }
}

/// What woke a waiting stream.
enum Woke {
    Received(Result<Arc<Published>, RecvError>),
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
    use warden_protocols::{Event, EventKind};

    fn item(seq: u64) -> Arc<Published> {
        Arc::new(Published::new(FeedItem::Journal(Event {
            seq,
            at_ms: 0,
            agent: "a".into(),
            kind: EventKind::ErrorsReset,
        })))
    }

    fn seqs(items: &[Arc<Published>]) -> Vec<u64> {
        items
            .iter()
            .map(|i| match i.item() {
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

    /// Reads the stream until it idles (two keep-alives in a row; time is paused).
    async fn read_until_idle(stream: &mut EventStream) -> Vec<(Option<u64>, String, String)> {
        let mut messages = Vec::new();
        let mut idle = 0;
        while idle < 2 {
            let chunk = tokio::time::timeout(Duration::from_secs(120), stream.next_chunk())
                .await
                .expect("the stream answers")
                .expect("the stream goes on");
            let text = String::from_utf8(chunk.to_vec()).unwrap();
            if text == ": keep-alive\n\n" {
                idle += 1;
                continue;
            }
            idle = 0;
            for block in text
                .split("\n\n")
                .filter(|b| !b.is_empty() && !b.starts_with(':'))
            {
                let (mut id, mut event, mut data) = (None, String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = v.to_owned();
                    }
                }
                messages.push((id, event, data));
            }
        }
        messages
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_lag_the_notice_comes_first_and_ids_never_go_backwards() {
        use warden_actors::{Journal, MemoryJournal};
        for with_log in [true, false] {
            let log = Arc::new(MemoryJournal::new());
            for _ in 0..20 {
                log.append(&"a".into(), EventKind::ErrorsReset);
            }
            let events = log.events();
            // The gap is not given up on while the test reads.
            let mut hub = EventHub::new(4).with_reorder_wait(Duration::from_secs(3600));
            if with_log {
                hub = hub.with_log(log.clone());
            }
            let mut stream = EventStream::new(&hub, hub.subscribe(), None, None, vec![]);
            let publish = |seq: usize| hub.publish(FeedItem::Journal(events[seq - 1].clone()));
            // 1 goes out, 3 waits for 2; then the subscriber falls 8 behind (capacity 4), and 2
            // and 4 are published late.
            publish(1);
            publish(3);
            let mut got = read_until_idle(&mut stream).await;
            assert_eq!(got.iter().filter_map(|m| m.0).collect::<Vec<_>>(), [1]);
            for seq in 5..=12 {
                publish(seq);
            }
            publish(2);
            publish(4);
            got.extend(read_until_idle(&mut stream).await);
            let ids: Vec<u64> = got.iter().filter_map(|m| m.0).collect();
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "with_log {with_log}: ids in order: {ids:?}"
            );
            let lagged = got
                .iter()
                .position(|m| m.1 == "lagged")
                .expect("a lagged notice");
            assert!(
                got[..lagged].iter().all(|m| m.0.is_none_or(|id| id == 1)),
                "with_log {with_log}: only what was sent before the lag precedes the notice: {got:?}"
            );
            if with_log {
                // Nothing is lost: the missed events are read back from the log.
                assert_eq!(ids, (1..=20).collect::<Vec<_>>());
            }
        }
    }

    /// A journal whose own clock always says 1000 ms, unless it is told the time.
    #[derive(Default)]
    struct FixedClock {
        events: parking_lot::Mutex<Vec<Event>>,
    }

    impl warden_actors::Journal for FixedClock {
        fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
            self.append_all(agent, vec![kind])
        }

        fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
            self.append_all_at(agent, kinds, 1_000)
        }

        fn append_all_at(&self, agent: &AgentKey, kinds: Vec<EventKind>, at_ms: u64) -> u64 {
            let mut events = self.events.lock();
            for kind in kinds {
                let seq = events.len() as u64 + 1;
                events.push(Event {
                    seq,
                    at_ms,
                    agent: agent.clone(),
                    kind,
                });
            }
            events.len() as u64
        }

        fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, _: u64) -> u64 {
            for (agent, kind) in rows {
                self.append(&agent, kind);
            }
            self.events.lock().len() as u64
        }

        fn durable(
            &self,
            _seq: u64,
        ) -> futures::future::BoxFuture<'static, Result<(), warden_actors::NotDurable>> {
            warden_actors::already_durable()
        }

        fn degraded(&self) -> Option<String> {
            None
        }
    }

    impl EventLog for FixedClock {
        fn events_since(
            &self,
            after: u64,
            limit: usize,
        ) -> Result<Vec<Event>, crate::server::events::ReplayError> {
            let events = self.events.lock();
            Ok(events
                .iter()
                .filter(|e| e.seq > after)
                .take(limit)
                .cloned()
                .collect())
        }

        fn recent(
            &self,
            _agent: Option<&AgentKey>,
            _limit: usize,
        ) -> Result<crate::server::events::RecentEvents, crate::server::events::ReplayError>
        {
            unreachable!("streams never list recent events")
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_event_and_its_replayed_copy_are_the_same_bytes() {
        use warden_actors::Journal;
        let journal = Arc::new(FixedClock::default());
        let hub = EventHub::default().with_log(journal.clone());
        let tee = hub.journal(journal.clone());
        let mut live = EventStream::new(&hub, hub.subscribe(), None, None, vec![]);
        let agent: AgentKey = "a".into();
        tee.append(&agent, EventKind::ErrorsReset);
        tee.append_all(&agent, vec![EventKind::ErrorsReset, EventKind::ErrorsReset]);
        let live = read_until_idle(&mut live).await;
        let mut replayed = EventStream::new(&hub, hub.subscribe(), None, Some(0), vec![]);
        let replayed = read_until_idle(&mut replayed).await;
        assert_eq!(live.len(), 3, "{live:?}");
        assert_eq!(live, replayed);
    }
}
