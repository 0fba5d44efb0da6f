//! NPC↔NPC conversations and the game-world limits on them (`[npc.conversation]`): at most
//! `max_exchanges` exchanges per conversation, a cooldown for each NPC after a conversation ends
//! and a longer one for the pair, and the pair-loop breaker.
//!
//! Bots that reply to each other reply forever, and agents left to chat talk in circles (ai-town's
//! users saw both): an NPC addressing another is a TRIGGER (design 001's rules 2 and 3 come before
//! the cross-talk rule 4), so nothing in the classification alone ends such a conversation. These
//! limits do.
//!
//! * A **conversation** is the run of TRIGGERs between two NPCs with no gap longer than
//!   `idle_seconds`; each TRIGGER is an **exchange**; a **round trip** is an exchange each way.
//! * When it ends — its `max_exchanges`-th exchange, or the gap — both NPCs start no conversation
//!   for `cooldown_seconds` and the pair none for `pair_cooldown_seconds`. An exchange refused by a
//!   limit is kept as CONTEXT: the NPC still hears it, it just does not answer.
//! * **Pair loop**: a round trip brings *new content* when one of its two lines was never said by
//!   the pair before (lines are compared normalised: case, punctuation and spacing ignored); it
//!   *made progress* when either NPC finished a tool call during it. After `loop_round_trips`
//!   round trips in a row with neither, the exchange is queued anyway and the turn that takes it
//!   trips the `pair_loop` breaker (a trip is `EXECUTING → SAFETY_LOCKOUT`, so it happens in the
//!   turn, before any model call). What the pair said, and the count, outlive a conversation: two
//!   NPCs that repeat the same lines every time their cooldown ends are caught as well.
//!
//! # Invariants
//! * One [`Conversations`] per team, shared by every agent's cell; its state is in memory (a
//!   restart forgets conversations in progress and the cooldowns, as it forgets the context
//!   buffer).
//! * Time is tokio's clock, so paused-time tests control it.
//! * Bounded: a pair keeps at most [`SEEN_LINES`] line fingerprints; pairs quiet for longer than
//!   [`FORGET_AFTER`] (and past their cooldown) are forgotten.
//!
//! # Lock order
//! One mutex, a leaf: taken after an agent's `npc` lock, never held while calling out.

use parking_lot::Mutex;
use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::{Hash, Hasher},
    time::Duration,
};
use tokio::time::Instant;
use warden_protocols::npc::{ConversationConfig, ConversationLimit};

/// Line fingerprints kept per pair (the oldest go first).
pub(crate) const SEEN_LINES: usize = 256;
/// A pair with no exchange for this long (and no cooldown running) is forgotten.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(3_600);
/// Forgetting runs once every this many exchanges.
const SWEEP_EVERY: u64 = 1_024;

/// What the limits make of one exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exchange {
    /// Within the limits: the TRIGGER stands.
    Allowed,
    /// A cap or a cooldown: keep it as CONTEXT.
    Limited(ConversationLimit),
    /// The pair-loop breaker trips: queue it, and trip in the turn with this reason.
    Loop(String),
}

/// The team's NPC↔NPC conversations.
#[derive(Debug, Default)]
pub(crate) struct Conversations {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By the two keys, in order.
    pairs: HashMap<(String, String), Pair>,
    /// NPC → when its cooldown after a conversation ends.
    cooldown_until: HashMap<String, Instant>,
    /// NPC → tool calls it finished (a round trip made progress when a count moved).
    tool_runs: HashMap<String, u64>,
    exchanges: u64,
}

#[derive(Debug)]
struct Pair {
    /// The conversation going on, if one is.
    current: Option<Talk>,
    /// The pair starts no conversation before this.
    cooldown_until: Option<Instant>,
    /// The last conversation ended at its cap (a refusal during the pair's cooldown says so).
    capped: bool,
    last_at: Instant,
    /// Fingerprints of the lines said, in order, and as a set.
    seen_order: VecDeque<u64>,
    seen: HashSet<u64>,
    /// Round trips in a row with no new content and no progress.
    stale_round_trips: u32,
    /// The round trip under way: which ways had an exchange, whether a line was new, and the two
    /// NPCs' tool counts when the previous one completed.
    ways: [bool; 2],
    novel: bool,
    tools_at_start: u64,
    last_lines: [String; 2],
}

#[derive(Debug)]
struct Talk {
    exchanges: u32,
}

/// Normalised line: lower case, letters and digits, single spaces.
fn fingerprint(text: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut space = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if space {
                ' '.hash(&mut hasher);
                space = false;
            }
            for l in c.to_lowercase() {
                l.hash(&mut hasher);
            }
        } else {
            space = true;
        }
    }
    hasher.finish()
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

impl Conversations {
    /// `me` perceived a TRIGGER from the NPC `other` saying `text`, at `now`: what `me`'s
    /// `limits` make of it. Counts the exchange when it is allowed (or trips the loop breaker).
    pub(crate) fn exchange(
        &self,
        me: &str,
        other: &str,
        text: &str,
        limits: &ConversationConfig,
        now: Instant,
    ) -> Exchange {
        let mut inner = self.inner.lock();
        inner.exchanges += 1;
        if inner.exchanges.is_multiple_of(SWEEP_EVERY) {
            inner.sweep(now);
        }
        let key = if me < other {
            (me.to_owned(), other.to_owned())
        } else {
            (other.to_owned(), me.to_owned())
        };
        // The way this exchange goes: 0 from the first key to the second.
        let way = usize::from(other != key.0);
        let tools = inner.tool_count(me) + inner.tool_count(other);
        // Out of the map while it is decided (put back below), so the cooldowns can change too.
        let mut pair = inner
            .pairs
            .remove(&key)
            .unwrap_or_else(|| Pair::new(now, tools));
        let decided = inner.decide(&mut pair, [me, other], way, text, tools, limits, now);
        inner.pairs.insert(key, pair);
        decided
    }

    /// `agent` finished a tool call: the round trips it takes part in made progress.
    pub(crate) fn tool_finished(&self, agent: &str) {
        let mut inner = self.inner.lock();
        match inner.tool_runs.get_mut(agent) {
            Some(n) => *n += 1,
            None => {
                inner.tool_runs.insert(agent.to_owned(), 1);
            }
        }
    }
}

impl Pair {
    fn new(now: Instant, tools: u64) -> Self {
        Pair {
            current: None,
            cooldown_until: None,
            capped: false,
            last_at: now,
            seen_order: VecDeque::new(),
            seen: HashSet::new(),
            stale_round_trips: 0,
            ways: [false; 2],
            novel: false,
            tools_at_start: tools,
            last_lines: Default::default(),
        }
    }

    /// Notes a line said; `true` if the pair never said it before.
    fn say(&mut self, text: &str) -> bool {
        let line = fingerprint(text);
        if !self.seen.insert(line) {
            return false;
        }
        self.seen_order.push_back(line);
        if self.seen_order.len() > SEEN_LINES {
            if let Some(old) = self.seen_order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}

impl Inner {
    fn tool_count(&self, agent: &str) -> u64 {
        self.tool_runs.get(agent).copied().unwrap_or(0)
    }

    /// [`Conversations::exchange`] on the pair's state. `who`: the perceiving NPC, the speaker.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &mut self,
        pair: &mut Pair,
        who: [&str; 2],
        way: usize,
        text: &str,
        tools: u64,
        limits: &ConversationConfig,
        now: Instant,
    ) -> Exchange {
        let [me, other] = who;
        // A gap ends the conversation (at the gap's end).
        let idle = secs(limits.idle_seconds);
        if pair.current.is_some() && now.duration_since(pair.last_at) > idle {
            let ended = pair.last_at + idle;
            pair.current = None;
            pair.capped = false;
            pair.cooldown_until = Some(ended + secs(limits.pair_cooldown_seconds));
            self.cool_down(who, ended + secs(limits.cooldown_seconds));
        }
        if pair.current.is_none() {
            if pair.cooldown_until.is_some_and(|t| now < t) {
                return Exchange::Limited(if pair.capped {
                    ConversationLimit::ConversationCap
                } else {
                    ConversationLimit::PairCooldown
                });
            }
            let cooling = who
                .iter()
                .any(|k| self.cooldown_until.get(*k).is_some_and(|t| now < *t));
            if cooling {
                return Exchange::Limited(ConversationLimit::Cooldown);
            }
        }
        let talk = pair.current.get_or_insert(Talk { exchanges: 0 });
        talk.exchanges += 1;
        let at_cap = limits.max_exchanges > 0 && talk.exchanges >= limits.max_exchanges;
        pair.last_at = now;
        // The pair-loop breaker's round trip.
        if pair.say(text) {
            pair.novel = true;
        }
        pair.ways[way] = true;
        pair.last_lines[way] = text.chars().take(200).collect();
        let mut tripped = None;
        if pair.ways == [true, true] {
            let progress = tools != pair.tools_at_start;
            if pair.novel || progress {
                pair.stale_round_trips = 0;
            } else {
                pair.stale_round_trips += 1;
            }
            // The next round trip counts tool calls from here: those of the turn answering this
            // exchange belong to it.
            pair.tools_at_start = tools;
            pair.ways = [false; 2];
            pair.novel = false;
            if limits.loop_round_trips > 0 && pair.stale_round_trips >= limits.loop_round_trips {
                tripped = Some(format!(
                    "NPC conversation between `{me}` and `{other}` went round in circles: {} round \
                     trips with no new content and no tool call (last lines: {:?} / {:?})",
                    pair.stale_round_trips, pair.last_lines[0], pair.last_lines[1],
                ));
                pair.stale_round_trips = 0;
            }
        }
        if at_cap || tripped.is_some() {
            pair.current = None;
            pair.capped = at_cap;
            pair.cooldown_until = Some(now + secs(limits.pair_cooldown_seconds));
            self.cool_down(who, now + secs(limits.cooldown_seconds));
        }
        match tripped {
            Some(reason) => Exchange::Loop(reason),
            None => Exchange::Allowed,
        }
    }

    fn cool_down(&mut self, agents: [&str; 2], until: Instant) {
        for agent in agents {
            let slot = self.cooldown_until.entry(agent.to_owned()).or_insert(until);
            *slot = (*slot).max(until);
        }
    }

    /// Forgets pairs quiet for [`FORGET_AFTER`] and cooldowns that are over.
    fn sweep(&mut self, now: Instant) {
        self.pairs.retain(|_, p| {
            now.duration_since(p.last_at) < FORGET_AFTER
                || p.cooldown_until.is_some_and(|t| now < t)
        });
        self.cooldown_until.retain(|_, until| now < *until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConversationConfig {
        ConversationConfig::default()
    }

    /// `a` and `b` alternate lines, from `a`: the exchanges each perceives.
    fn talk(c: &Conversations, lines: &[&str], limits: &ConversationConfig) -> Vec<Exchange> {
        let now = Instant::now();
        lines
            .iter()
            .enumerate()
            .map(|(i, line)| {
                let (from, to) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
                c.exchange(to, from, line, limits, now)
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_exchange_after_the_cap_is_refused_and_both_cool_down() {
        let c = Conversations::default();
        let lines: Vec<String> = (0..9).map(|i| format!("line {i}")).collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let seen = talk(&c, &lines, &limits());
        assert!(
            seen[..8].iter().all(|e| *e == Exchange::Allowed),
            "{seen:?}"
        );
        assert_eq!(
            seen[8],
            Exchange::Limited(ConversationLimit::ConversationCap)
        );
        // a with someone else: a's own cooldown (15 s), then free.
        let now = Instant::now();
        assert_eq!(
            c.exchange("c", "a", "hi", &limits(), now),
            Exchange::Limited(ConversationLimit::Cooldown)
        );
        tokio::time::advance(Duration::from_secs(16)).await;
        assert_eq!(
            c.exchange("c", "a", "hi", &limits(), Instant::now()),
            Exchange::Allowed
        );
        // The pair: 60 s.
        assert_eq!(
            c.exchange("b", "a", "again", &limits(), Instant::now()),
            Exchange::Limited(ConversationLimit::ConversationCap)
        );
        tokio::time::advance(Duration::from_secs(45)).await;
        assert_eq!(
            c.exchange("b", "a", "again", &limits(), Instant::now()),
            Exchange::Allowed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_gap_ends_the_conversation_and_starts_the_cooldowns_at_its_end() {
        let c = Conversations::default();
        assert_eq!(
            talk(&c, &["x", "y"], &limits()),
            vec![Exchange::Allowed, Exchange::Allowed]
        );
        // 31 s later: the conversation ended 30 s after its last exchange, 1 s ago; the pair's
        // cooldown (60 s) runs from then.
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(
            c.exchange("b", "a", "z", &limits(), Instant::now()),
            Exchange::Limited(ConversationLimit::PairCooldown)
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            c.exchange("b", "a", "z", &limits(), Instant::now()),
            Exchange::Allowed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn three_round_trips_with_nothing_new_trip_the_pair_loop() {
        let c = Conversations::default();
        let no_cap = ConversationConfig {
            max_exchanges: 0,
            ..limits()
        };
        // Round trip 1 is new; 2, 3 and 4 repeat it: the 8th exchange trips.
        let seen = talk(&c, &["Hello there!", "Hi."].repeat(4), &no_cap);
        assert!(
            seen[..7].iter().all(|e| *e == Exchange::Allowed),
            "{seen:?}"
        );
        let Exchange::Loop(reason) = &seen[7] else {
            panic!("{seen:?}")
        };
        assert!(reason.contains("3 round trips"), "{reason}");
        // Normalised: case, punctuation and spacing do not make a line new.
        let c = Conversations::default();
        let seen = talk(
            &c,
            &[
                "Hello there!",
                "Hi.",
                "hello  THERE",
                "hi",
                "Hello, there.",
                "HI!",
                "hello there",
                "Hi",
            ],
            &no_cap,
        );
        assert!(matches!(seen[7], Exchange::Loop(_)), "{seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn new_content_or_a_tool_call_resets_the_loop_count() {
        let no_cap = ConversationConfig {
            max_exchanges: 0,
            ..limits()
        };
        // A new line in round trip 3.
        let c = Conversations::default();
        let seen = talk(
            &c,
            &[
                "Hello",
                "Hi",
                "Hello",
                "Hi",
                "Hello",
                "What news?",
                "Hello",
                "Hi",
                "Hello",
                "Hi",
            ],
            &no_cap,
        );
        assert!(seen.iter().all(|e| *e == Exchange::Allowed), "{seen:?}");
        // A tool call in every round trip.
        let c = Conversations::default();
        for i in 0..10 {
            let (from, to) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
            if i % 2 == 1 {
                c.tool_finished(to);
            }
            let seen = c.exchange(to, from, "same", &no_cap, Instant::now());
            assert_eq!(seen, Exchange::Allowed, "exchange {i}");
        }
        // Off.
        let off = ConversationConfig {
            loop_round_trips: 0,
            ..no_cap
        };
        let c = Conversations::default();
        let seen = talk(&c, &["same"; 20], &off);
        assert!(seen.iter().all(|e| *e == Exchange::Allowed));
    }

    #[tokio::test(start_paused = true)]
    async fn forgotten_pairs_are_swept() {
        let c = Conversations::default();
        c.exchange("b", "a", "x", &limits(), Instant::now());
        tokio::time::advance(FORGET_AFTER + Duration::from_secs(1)).await;
        for i in 0..SWEEP_EVERY {
            let other = format!("n{}", i % 4);
            c.exchange(
                "z",
                &other,
                &format!("{i}"),
                &ConversationConfig {
                    max_exchanges: 0,
                    cooldown_seconds: 0.0,
                    pair_cooldown_seconds: 0.0,
                    ..limits()
                },
                Instant::now(),
            );
        }
        assert!(!c.inner.lock().pairs.contains_key(&("a".into(), "b".into())));
    }
}
