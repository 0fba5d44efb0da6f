//! `GET /api/replies?after=SEQ&wait=S`: the NPCs' replies, and the notices a game server shows
//! (a lockout, an unlock, a halt; an NPC falling silent or coming back), since a journal sequence number — one request per tick, or one
//! long-poll, instead of a poll per event.
//!
//! Guarantees:
//! * Read from the journal (flushed first), never from an in-memory counter: `after` is the
//!   journal's `seq` of the row that settled the event, so a host resumes after a restart (of
//!   warden or of itself) with the `next` it last got, and misses nothing, repeats nothing.
//! * `next` is the last journal row read (replies or not): the next call scans only what is new.
//! * The wait is bounded ([`MAX_REPLIES_WAIT_SECONDS`]) and ends as soon as a reply or notice is
//!   journaled: the request subscribes to the live feed before it reads, so a reply that lands
//!   between the read and the wait still wakes it.
//! * A turn's replies are never split between two answers (`max` may be exceeded by that turn).

use crate::server::{
    api::{fate_body, ApiError, ApiState, ReplyReader},
    events::{EventHub, EventLog},
};
use actix_web::{http::StatusCode, web, HttpResponse};
use serde::Deserialize;
use std::{collections::HashMap, sync::Arc, time::Duration};
use warden_protocols::{Event, EventFate, EventKind, WorkRefusal};

/// Longest `wait` of `GET /api/replies`, in seconds.
pub const MAX_REPLIES_WAIT_SECONDS: f64 = 30.0;

/// Replies (and notices) one answer carries unless `max` says fewer.
pub const DEFAULT_REPLIES_MAX: usize = 256;

/// Most replies one answer carries (`max` above it is a `400`).
pub const MAX_REPLIES_MAX: usize = 4096;

/// Journal rows read per page while looking for replies.
const PAGE: usize = 1024;

/// Rows one answer reads at most: a journal full of chatter is walked over several calls (each
/// answers an empty list and a `next` further on), never in one unbounded read.
const MAX_ROWS_PER_ANSWER: usize = 16 * PAGE;

/// `GET /api/replies` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RepliesQuery {
    /// Journal sequence number: replies journaled after it (0, the default: from the start).
    #[serde(default)]
    after: u64,
    /// Seconds to wait when nothing is there yet, fractions allowed, 0 (the default: answer at
    /// once) to [`MAX_REPLIES_WAIT_SECONDS`].
    #[serde(default)]
    wait: Option<String>,
    /// At most this many replies (default [`DEFAULT_REPLIES_MAX`], 1 to [`MAX_REPLIES_MAX`]).
    #[serde(default)]
    max: Option<usize>,
}

impl RepliesQuery {
    pub(crate) fn wait(&self) -> Result<Duration, ApiError> {
        let Some(text) = self.wait.as_deref() else {
            return Ok(Duration::ZERO);
        };
        match text.trim().parse::<f64>() {
            Ok(s) if (0.0..=MAX_REPLIES_WAIT_SECONDS).contains(&s) => {
                Ok(Duration::from_secs_f64(s))
            }
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "wait: {text:?} is not a number of seconds from 0 to \
                     {MAX_REPLIES_WAIT_SECONDS}"
                ),
            )),
        }
    }

    fn max(&self) -> Result<usize, ApiError> {
        match self.max {
            None => Ok(DEFAULT_REPLIES_MAX),
            Some(n) if (1..=MAX_REPLIES_MAX).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("max: {n} is not from 1 to {MAX_REPLIES_MAX}"),
            )),
        }
    }
}

/// What a journal row tells a host, if anything: a reply per settled user event (the turn's
/// answer, or why there is none), or a notice.
fn host_items(
    event: &Event,
    lockouts: &mut HashMap<String, String>,
    out: &mut Vec<serde_json::Value>,
) {
    let agent = event.agent.as_str();
    let mut reply = |id: u64, fate: EventFate| {
        let mut body = fate_body(id, &fate);
        body["seq"] = event.seq.into();
        body["agent"] = agent.into();
        body["type"] = "reply".into();
        body["event_id"] = id.into();
        if let Some(map) = body.as_object_mut() {
            map.remove("id");
        }
        out.push(body);
    };
    match &event.kind {
        EventKind::TurnFinished { outcome } => {
            let lockout = lockouts.get(agent).map(String::as_str);
            for &id in &outcome.events {
                reply(id, EventFate::of_turn(outcome, lockout));
            }
        }
        EventKind::WorkRefused {
            queued: Some(id),
            refusal,
            ..
        } => reply(
            *id,
            EventFate::Refused {
                refusal: refusal.clone(),
            },
        ),
        EventKind::MessagesDiscarded { messages } => {
            for id in messages.iter().filter_map(|m| m.queued) {
                reply(id, EventFate::Discarded);
            }
        }
        EventKind::LockedOut {
            breaker, reason, ..
        } => {
            lockouts.insert(agent.to_owned(), reason.clone());
            out.push(serde_json::json!({
                "seq": event.seq,
                "agent": agent,
                "type": "locked_out",
                "breaker": breaker,
                "reason": reason,
                "refusal": WorkRefusal::LockedOut { cause: reason.clone() },
            }));
        }
        EventKind::Unlocked { operator, .. } => out.push(serde_json::json!({
            "seq": event.seq,
            "agent": agent,
            "type": "unlocked",
            "operator": operator,
        })),
        EventKind::Halted {
            cause,
            stopped: true,
            ..
        } => out.push(serde_json::json!({
            "seq": event.seq,
            "agent": agent,
            "type": "halted",
            "cause": cause,
        })),
        // The world-facing notice (design 000's "notify the character"): the NPC fell silent or
        // is back, read from the state change the journal holds.
        EventKind::StateChanged { from, to, cause } => {
            if let Some(presence) = from.presence_change(*to) {
                out.push(serde_json::json!({
                    "seq": event.seq,
                    "agent": agent,
                    "type": "notice",
                    "presence": presence,
                    "text": presence.notice(agent),
                    "cause": cause,
                }));
            }
        }
        _ => {}
    }
}

/// What one read of the journal found.
struct Read {
    /// Replies and notices, oldest first.
    items: Vec<serde_json::Value>,
    /// The last row read.
    next: u64,
    /// `true` when the read stopped before the journal's end (`max` items, or `max_rows` rows):
    /// an empty answer must not wait then, there is more to read.
    more: bool,
}

/// Replies and notices after `after` (at most about `max`), reading at most about `max_rows` rows.
fn read_replies(
    log: &dyn EventLog,
    mut after: u64,
    max: usize,
    max_rows: usize,
) -> Result<Read, ApiError> {
    let mut items = Vec::new();
    let mut lockouts = HashMap::new();
    let mut read = 0;
    let page_size = PAGE.min(max_rows.max(1));
    loop {
        let rows = log
            .events_since(after, page_size)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let page = rows.len();
        for event in &rows {
            host_items(event, &mut lockouts, &mut items);
            after = event.seq;
            if items.len() >= max {
                return Ok(Read {
                    items,
                    next: after,
                    more: true,
                });
            }
        }
        read += page;
        if page < page_size {
            return Ok(Read {
                items,
                next: after,
                more: false,
            });
        }
        if read >= max_rows {
            return Ok(Read {
                items,
                next: after,
                more: true,
            });
        }
    }
}

/// Whether a live item could be a reply or notice (the wait ends and the journal is read again).
fn wakes(item: &crate::server::events::FeedItem) -> bool {
    use crate::server::events::FeedItem;
    matches!(
        item,
        FeedItem::Journal(Event {
            kind: EventKind::TurnFinished { .. }
                | EventKind::WorkRefused {
                    queued: Some(_),
                    ..
                }
                | EventKind::MessagesDiscarded { .. }
                | EventKind::LockedOut { .. }
                | EventKind::Unlocked { .. }
                | EventKind::Halted { stopped: true, .. },
            ..
        })
    ) || matches!(
        item,
        FeedItem::Journal(Event {
            kind: EventKind::StateChanged { from, to, .. },
            ..
        }) if from.presence_change(*to).is_some()
    )
}

/// `GET /api/replies?after=SEQ&wait=S&max=N`: `200 {"replies": [...], "next": SEQ}`, oldest first.
/// A reply: `{"type": "reply", "seq", "agent", "event_id", "status", …}` with the event's fate
/// (`answered` and its `answer`, `refused` and its `refusal`, `discarded`, `failed`); a notice:
/// `{"type": "locked_out" | "unlocked" | "halted", "seq", "agent", …}`, or a world-facing notice
/// `{"type": "notice", "seq", "agent", "presence": "silent" | "back", "text", "cause"}`. Call again with
/// `after=next`. With `wait`, an answer with no reply comes only when the wait is over. Admin,
/// read and host tokens. `503` without a durable journal.
pub(crate) async fn get_replies(
    _: ReplyReader,
    state: web::Data<ApiState>,
    query: web::Query<RepliesQuery>,
) -> Result<HttpResponse, ApiError> {
    let wait = query.wait()?;
    let max = query.max()?;
    let unavailable = || {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server keeps no durable journal to read replies from",
        )
    };
    let hub: EventHub = state.events.clone().ok_or_else(unavailable)?;
    let log: Arc<dyn EventLog> = hub.log().cloned().ok_or_else(unavailable)?;
    // Subscribed before the first read: a reply journaled after it wakes the wait below.
    let mut live = (!wait.is_zero()).then(|| hub.subscribe());
    let deadline = tokio::time::Instant::now() + wait;
    let mut after = query.after;
    loop {
        let reader = log.clone();
        let read =
            web::block(move || read_replies(reader.as_ref(), after, max, MAX_ROWS_PER_ANSWER))
                .await
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
        let Read { items, next, more } = read;
        after = next;
        // Wait only at the journal's end with nothing found: rows left unread are read now.
        let Some(sub) = live.as_mut().filter(|_| items.is_empty() && !more) else {
            return Ok(HttpResponse::Ok().json(serde_json::json!({
                "replies": items,
                "next": after,
            })));
        };
        let woken = tokio::time::timeout_at(deadline, async {
            loop {
                match sub.recv().await {
                    Ok(item) if wakes(&item) => return true,
                    Ok(_) => {}
                    // Behind: read the journal again. Closed: the server stops; answer.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
                }
            }
        })
        .await;
        if woken != Ok(true) {
            // Over (or closed): one last read, then the answer, replies or not.
            live = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_protocols::{AgentKey, TerminationReason, TurnOutcome};

    fn event(seq: u64, kind: EventKind) -> Event {
        Event {
            seq,
            at_ms: 0,
            agent: AgentKey::from("innkeeper"),
            kind,
        }
    }

    /// A journal in memory.
    struct Rows(Vec<Event>);

    impl EventLog for Rows {
        fn events_since(
            &self,
            after: u64,
            limit: usize,
        ) -> Result<Vec<Event>, crate::server::events::ReplayError> {
            Ok(self
                .0
                .iter()
                .filter(|e| e.seq > after)
                .take(limit)
                .cloned()
                .collect())
        }

        fn recent(
            &self,
            _: Option<&AgentKey>,
            _: usize,
        ) -> Result<crate::server::events::RecentEvents, crate::server::events::ReplayError>
        {
            unreachable!("not read here")
        }
    }

    #[test]
    fn a_read_cut_by_the_row_cap_says_there_is_more_and_the_end_says_there_is_not() {
        let rows = Rows(
            (1..=10)
                .map(|seq| event(seq, EventKind::ErrorsReset))
                .collect(),
        );
        // Ten rows of chatter, four read at most: nothing found, but the journal goes on.
        let read = read_replies(&rows, 0, 16, 4).unwrap();
        assert_eq!((read.items.len(), read.next, read.more), (0, 4, true));
        let read = read_replies(&rows, 8, 16, 4).unwrap();
        assert_eq!((read.items.len(), read.next, read.more), (0, 10, false));
    }

    #[test]
    fn a_turn_that_took_two_events_is_two_replies_and_a_tick_is_none() {
        let outcome = TurnOutcome {
            reason: TerminationReason::Answered,
            iterations: 1,
            answer: Some("Welcome, traveller.".into()),
            limit_stopped: false,
            limit_kind: None,
            error: None,
            events: vec![4, 5],
            usage: Default::default(),
            truncated: false,
        };
        let mut out = Vec::new();
        let mut lockouts = HashMap::new();
        host_items(
            &event(
                9,
                EventKind::TurnFinished {
                    outcome: outcome.clone(),
                },
            ),
            &mut lockouts,
            &mut out,
        );
        let tick = TurnOutcome {
            events: vec![],
            ..outcome
        };
        host_items(
            &event(10, EventKind::TurnFinished { outcome: tick }),
            &mut lockouts,
            &mut out,
        );
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0]["event_id"], 4);
        assert_eq!(out[1]["event_id"], 5);
        assert_eq!(out[1]["status"], "answered");
        assert_eq!(out[1]["answer"], "Welcome, traveller.");
        assert_eq!(out[1]["seq"], 9);
        assert!(out[1].get("id").is_none());
    }
}
