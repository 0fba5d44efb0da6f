//! [`Live`]: one agent's live long-term-memory state — its rate windows, the trust of the
//! speakers it heard, the memory clock's anchor, what it knows of its turn (not journaled).

use std::collections::{HashMap, VecDeque};
use tokio::time::{Duration, Instant};
use warden_protocols::memory::MemoryStore;

/// The rate windows' length.
const MINUTE: Duration = Duration::from_secs(60);

/// The most speakers whose write windows an agent keeps (the quietest go first).
const MAX_SPEAKERS: usize = 1024;

/// The maps a host's delivery looks up (by agent, by speaker): foldhash, seeded per process,
/// instead of SipHash — hashing was most of a delivery's memory work (docs/memory.md, "Cost").
/// Bounded (`MAX_SPEAKERS`), so a crafted set of colliding names costs a bounded scan.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A sliding window of writes, each kept as the instant it leaves the window (its write + a
/// minute): counting compares instants, which costs a delivery less than a duration per write.
#[derive(Debug, Default)]
struct Window(VecDeque<Instant>);

impl Window {
    /// The writes of the last minute before `now`.
    fn count(&mut self, now: Instant) -> usize {
        while self.0.front().is_some_and(|expires| *expires <= now) {
            self.0.pop_front();
        }
        self.0.len()
    }

    /// A write at `at`.
    fn push(&mut self, at: Instant) {
        self.0.push_back(at + MINUTE);
    }
}

/// What an agent keeps of one speaker: its write window and the trust of its latest perceived
/// TRIGGER or CONTEXT. One map entry for both, so a delivery looks the speaker up once (and a new
/// speaker costs one key): in the MUD benchmark nearly every observation is the first
/// from its speaker to that NPC, and its cold lookups and allocations were most of a delivery's
/// memory work (docs/memory.md, "Cost").
#[derive(Debug, Default)]
struct Speaker {
    window: Window,
    trust: Option<f64>,
}

/// One agent's live memory state (not journaled): rate windows, the clock's anchor, what it
/// knows of its turn. In the agent's cell, under a leaf lock of its own taken under the record
/// lock ([`crate::agent::cell::AgentCell`]'s `live`): a host's delivery touches this agent's and
/// no other, and takes no lock the team shares.
#[derive(Debug, Default)]
pub(crate) struct Live {
    /// The windows were seeded from the record ([`Live::seed`]).
    seeded: bool,
    writes: Window,
    /// At most [`MAX_SPEAKERS`]; when full, the speakers with no write in the last minute go.
    speakers: FastMap<String, Speaker>,
    /// The memory clock's anchor: (real instant, memory time then).
    anchor: Option<(Instant, f64)>,
    /// The lowest trust of the CONTEXT events perceived since the last turn started (what a
    /// tick's turn sees).
    context_trust: Option<f64>,
    /// The current turn: who it answers (`None`: a tick or an operator's request) and the trust
    /// of that source.
    turn: Option<(Option<String>, f64)>,
}

impl Live {
    /// Memory time now (game seconds at `speed` game seconds a real second): on from the store's
    /// clock `clock` (its newest memory) when the agent first uses memory in this process.
    pub(crate) fn now(&mut self, clock: f64, speed: f64) -> f64 {
        self.now_at(Instant::now(), clock, speed)
    }

    /// The memory time at `now`.
    fn now_at(&mut self, now: Instant, clock: f64, speed: f64) -> f64 {
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            1.0
        };
        let (at, base) = *self.anchor.get_or_insert((now, clock));
        base + now.duration_since(at).as_secs_f64() * speed
    }

    /// A restart (or the first admission in this process): the rate windows start from the
    /// memories of the last minute of memory time (and the observations admitted at delivery by
    /// an older version, not written yet),
    /// so a restart does not hand every speaker its quota again. Memory time does not count the
    /// downtime, so this errs on the strict side.
    fn seed(&mut self, store: &MemoryStore, speed: f64) {
        self.seeded = true;
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            1.0
        };
        let now = Instant::now();
        let since = store.clock - MINUTE.as_secs_f64() * speed;
        let mut recent: Vec<(f64, Option<&str>)> = store
            .memories
            .values()
            .rev()
            .take_while(|m| m.at > since)
            .map(|m| {
                let speaker = match &m.kind {
                    warden_protocols::memory::MemoryKind::Observation { speaker, .. } => {
                        Some(speaker.as_str())
                    }
                    _ => None,
                };
                (m.at, speaker)
            })
            .collect();
        recent.extend(
            store
                .unwritten
                .iter()
                .filter_map(|u| Some((u.observe.at.filter(|at| *at > since)?, u)))
                .map(|(at, u)| (at, Some(u.event.speaker.id.as_str()))),
        );
        recent.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (at, speaker) in recent {
            let age = ((store.clock - at) / speed).max(0.0);
            let Some(instant) = now.checked_sub(Duration::from_secs_f64(age)) else {
                continue;
            };
            self.writes.push(instant);
            if let Some(speaker) = speaker {
                if self.speakers.len() < MAX_SPEAKERS || self.speakers.contains_key(speaker) {
                    self.speakers
                        .entry(speaker.to_owned())
                        .or_default()
                        .window
                        .push(instant);
                }
            }
        }
    }

    /// Whether one more write (from `speaker`, when an observation) fits the rate caps per agent
    /// (`per_agent`) and per speaker (`per_speaker`) per minute; counted when it does.
    pub(crate) fn admit(
        &mut self,
        speaker: Option<&str>,
        per_agent: u32,
        per_speaker: u32,
    ) -> bool {
        self.admit_at(Instant::now(), speaker, per_agent, per_speaker)
    }

    /// [`Live::admit`] at `now`.
    fn admit_at(
        &mut self,
        now: Instant,
        speaker: Option<&str>,
        per_agent: u32,
        per_speaker: u32,
    ) -> bool {
        match speaker {
            Some(speaker) => self.admit_speaker(now, speaker, None, (per_agent, per_speaker)),
            None if self.writes.count(now) >= per_agent as usize => false,
            None => {
                self.writes.push(now);
                true
            }
        }
    }

    /// `f` on `speaker`'s entry, made when new — `None` (and `f` not run) when it is new and
    /// [`MAX_SPEAKERS`] spoke in the last minute.
    fn with_speaker<R>(
        &mut self,
        now: Instant,
        speaker: &str,
        f: impl FnOnce(&mut Speaker) -> R,
    ) -> Option<R> {
        if let Some(entry) = self.speakers.get_mut(speaker) {
            return Some(f(entry));
        }
        if self.speakers.len() >= MAX_SPEAKERS {
            self.speakers.retain(|_, s| s.window.count(now) > 0);
            if self.speakers.len() >= MAX_SPEAKERS {
                return None;
            }
        }
        Some(f(self.speakers.entry(speaker.to_owned()).or_default()))
    }

    /// One lookup of `speaker`: its `trust` noted (when given), then whether a write from it fits
    /// the caps (counted when it does).
    fn admit_speaker(
        &mut self,
        now: Instant,
        speaker: &str,
        trust: Option<f64>,
        (per_agent, per_speaker): (u32, u32),
    ) -> bool {
        let agent_full = self.writes.count(now) >= per_agent as usize;
        let admitted = self.with_speaker(now, speaker, |entry| {
            if trust.is_some() {
                entry.trust = trust;
            }
            if agent_full || entry.window.count(now) >= per_speaker as usize {
                return false;
            }
            entry.window.push(now);
            true
        });
        if admitted != Some(true) {
            return false;
        }
        self.writes.push(now);
        true
    }

    /// Whether an observation of `speaker` heard at `heard` (`None`: now) would be admitted
    /// (nothing counted, nothing noted).
    pub(crate) fn would_admit(
        &mut self,
        speaker: &str,
        heard: Option<Instant>,
        (per_agent, per_speaker): (u32, u32),
    ) -> bool {
        let now = heard.unwrap_or_else(Instant::now);
        if self.writes.count(now) >= per_agent as usize {
            return false;
        }
        match self.speakers.get_mut(speaker) {
            Some(entry) => entry.window.count(now) < per_speaker as usize,
            None => per_speaker > 0,
        }
    }

    /// A perception of a TRIGGER or CONTEXT (`context`) event of `speaker` at `trust`, kept for
    /// memory, is settled by the agent's actor, in the order perceived: noted as the speaker's
    /// latest trust (and the lowest CONTEXT trust of the next turn), then the rate caps decide
    /// whether it is admitted as an observation — at the memory time returned. Both as of
    /// `heard`, when it was heard in this process (`None`: now).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn perceived(
        &mut self,
        speaker: &str,
        trust: f64,
        context: bool,
        heard: Option<Instant>,
        (per_agent, per_speaker): (u32, u32),
        store: Option<&MemoryStore>,
        speed: f64,
    ) -> Option<f64> {
        if !self.seeded {
            match store {
                Some(store) => self.seed(store, speed),
                None => self.seeded = true,
            }
        }
        let clock = store.map_or(0.0, |s| s.clock);
        if context {
            self.context_trust = Some(self.context_trust.map_or(trust, |t| t.min(trust)));
        }
        // One instant for the caps and the memory time.
        let now = heard.unwrap_or_else(Instant::now);
        self.admit_speaker(now, speaker, Some(trust), (per_agent, per_speaker))
            .then(|| self.now_at(now, clock, speed))
    }

    /// The lowest trust of the CONTEXT events perceived since the last call (a turn starts).
    pub(crate) fn take_context_trust(&mut self) -> Option<f64> {
        self.context_trust.take()
    }

    /// The trust of `speaker`'s latest perceived event, if any.
    pub(crate) fn trust_of(&self, speaker: &str) -> Option<f64> {
        self.speakers.get(speaker).and_then(|s| s.trust)
    }

    /// A turn starts: it answers `speaker` (`None`: a tick or an operator) whose source has
    /// `trust`.
    pub(crate) fn set_turn(&mut self, speaker: Option<String>, trust: f64) {
        self.turn = Some((speaker, trust));
    }

    /// Who the current turn answers and the trust of that source.
    pub(crate) fn turn(&self) -> Option<(Option<String>, f64)> {
        self.turn.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_rate_caps_hold_per_speaker_and_per_agent_over_a_sliding_minute() {
        let mut live = Live::default();
        let mut admitted = |speaker| (0..100).filter(|_| live.admit(Some(speaker), 5, 2)).count();
        assert_eq!(admitted("p1"), 2);
        assert_eq!(admitted("p2"), 2);
        assert_eq!(admitted("p3"), 1, "the agent's cap of 5 a minute");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(admitted("p1"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_speakers_trust_and_window_are_kept_within_the_bound_of_recent_speakers() {
        let mut live = Live::default();
        let perceive = |live: &mut Live, speaker: &str, trust| {
            live.perceived(speaker, trust, false, None, (u32::MAX, 1), None, 1.0)
                .is_some()
        };
        assert!(perceive(&mut live, "p0", 0.9));
        assert!(!perceive(&mut live, "p0", 0.4), "one a minute from p0");
        assert_eq!(live.trust_of("p0"), Some(0.4), "noted even when capped");
        for i in 1..MAX_SPEAKERS {
            assert!(perceive(&mut live, &format!("p{i}"), 0.5));
        }
        // Every speaker kept wrote in the last minute: a new one is neither admitted nor kept.
        assert!(!perceive(&mut live, "late", 0.7));
        assert_eq!(live.trust_of("late"), None);
        assert_eq!(live.trust_of("p1"), Some(0.5));
        tokio::time::advance(Duration::from_secs(61)).await;
        // A minute later the quiet ones make room.
        assert!(perceive(&mut live, "late", 0.7));
        assert_eq!(live.trust_of("late"), Some(0.7));
        assert_eq!(live.trust_of("p0"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_time_runs_at_the_clock_speed_from_the_store_clock() {
        let mut live = Live::default();
        let store = MemoryStore {
            clock: 1000.0,
            ..MemoryStore::default()
        };
        assert_eq!(live.now(store.clock, 60.0), 1000.0);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(live.now(store.clock, 60.0), 1600.0);
    }
}
