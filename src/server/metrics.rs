//! `GET /metrics`: the fleet in the Prometheus text exposition format (version 0.0.4).
//!
//! Guarantees:
//! * Every family has one `# HELP` and one `# TYPE` line before its samples, every name starts with
//!   `warden_`, counters end in `_total`, and every sample line is `name{labels} value`.
//! * Label sets do not depend on what happened: every agent state and every breaker is listed, with 0
//!   when nothing is there, so a dashboard's series never appear out of nowhere.
//! * Every number is read from the fleet, the SafetyMonitor, the journal or a measurement made where
//!   it happens (the halt latency is timed around the API's halt call, from the request to the last
//!   acknowledgement); nothing is estimated.
//! * Rendering is a pure function of a [`Snapshot`]; recording a latency is three relaxed atomic adds.

use std::{
    fmt::Write as _,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};
use warden_protocols::{npc::NpcMode, AgentState, AgentStatus, Breaker, FleetView};

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds of the halt latency buckets, in seconds (50 µs to 1 s; `+Inf` is implied).
pub const HALT_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Every breaker, so each is listed even when it never tripped.
pub const BREAKERS: [Breaker; 7] = [
    Breaker::ConsecutiveErrors,
    Breaker::BudgetExceeded,
    Breaker::Repetition,
    Breaker::Stuck,
    Breaker::ErrorCascade,
    Breaker::LoopCap,
    Breaker::PairLoop,
];

/// A lock-free latency histogram over [`HALT_BUCKETS`].
#[derive(Debug, Default)]
pub struct Histogram {
    /// Non-cumulative counts per bucket; the last one is `+Inf`.
    buckets: [AtomicU64; HALT_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

/// A copy of a [`Histogram`]: cumulative bucket counts, the sum in seconds and the count.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound, observations ≤ it)`, ending with `(+Inf, count)`.
    pub cumulative: Vec<(f64, u64)>,
    /// The sum of every observation, in seconds (`_sum`).
    pub sum_seconds: f64,
    /// How many observations (`_count`; equals the `+Inf` bucket's count).
    pub count: u64,
}

impl Histogram {
    /// Records one latency (three relaxed atomic adds; never blocks). Above the last bound it
    /// counts in `+Inf`.
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = HALT_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(HALT_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, cumulative as Prometheus wants them. Not atomic across buckets: an
    /// observation made meanwhile may be in the count and not yet in the sum.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0;
        let mut cumulative = Vec::with_capacity(HALT_BUCKETS.len() + 1);
        for (i, bucket) in self.buckets.iter().enumerate() {
            running += bucket.load(Ordering::Relaxed);
            cumulative.push((
                HALT_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY),
                running,
            ));
        }
        HistogramSnapshot {
            cumulative,
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            // The buckets' total, so `+Inf` and `_count` agree even mid-update.
            count: running,
        }
    }
}

/// What the API measures itself.
#[derive(Debug, Default)]
pub struct ApiMetrics {
    /// `POST /api/agents/{key}/halt`: request to the last acknowledgement.
    pub halt_agent: Histogram,
    /// `POST /api/halt`.
    pub halt_all: Histogram,
}

/// The journal's counters (`SqliteJournal::stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalNumbers {
    /// Highest sequence number committed ([`crate::journal::JournalStats::committed_seq`]).
    pub committed_seq: u64,
    /// Transactions committed by the writer.
    pub commits: u64,
    /// Appended events whose acknowledgement waits for durability.
    pub durable_waits: u64,
    /// Batches the writer failed to commit after its retries.
    pub failed_batches: u64,
    /// Whether a write has failed since the journal was opened
    /// ([`crate::SqliteJournal::last_error`] is set).
    pub write_error: bool,
}

/// Everything `/metrics` shows, read at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Every agent's status (counted per state, with every state listed).
    pub statuses: Vec<AgentStatus>,
    /// The team budget: tokens and cost spent, their limits, locked-out agents.
    pub fleet: FleetView,
    /// Trips per breaker (snake_case names) from the SafetyMonitor; `None` when it did not answer.
    pub trips: Option<std::collections::BTreeMap<String, u64>>,
    /// The journal's counters; `None` without a durable journal (those families are left out).
    pub journal: Option<JournalNumbers>,
    /// Intervention asks waiting for an operator; `None` without an intervention bus (left out).
    pub interventions_pending: Option<usize>,
    /// Open `GET /api/events` streams; `None` without an event stream (left out).
    pub stream_subscribers: Option<usize>,
    /// Latency of `POST /api/agents/{key}/halt`, request to acknowledgement.
    pub halt_agent: HistogramSnapshot,
    /// Latency of `POST /api/halt`, request to the last acknowledgement.
    pub halt_all: HistogramSnapshot,
    /// Retries of the OpenAI-compatible providers since the process started, by class
    /// (`warden_actors::retry_counts`: every class listed).
    pub provider_retries: Vec<(&'static str, u64)>,
    /// The shared limits of every provider alive (`warden_actors::provider_limit_stats`).
    pub provider_limits: Vec<warden_actors::ProviderLimitStats>,
    /// The OpenTelemetry exporter's counters (`warden::telemetry::stats`; zeros while it is off).
    pub otel: crate::telemetry::ExportStats,
}

/// The families of the providers' shared limits, one sample per provider name (limiters of one
/// name, say of two teams in one process, are added up: a series appears once).
fn provider_limits(e: &mut Exposition, limits: &[warden_actors::ProviderLimitStats]) {
    let mut by_name: std::collections::BTreeMap<&str, [f64; 5]> = Default::default();
    for l in limits {
        let sum = by_name.entry(l.provider.as_str()).or_default();
        for (total, n) in sum.iter_mut().zip([
            l.in_flight as f64,
            l.waiting as f64,
            l.throttled as f64,
            l.pauses as f64,
            l.paused_ms as f64 / 1000.0,
        ]) {
            *total += n;
        }
    }
    let families = [
        (
            "warden_provider_calls_in_flight",
            "gauge",
            "LLM calls holding a permit of their provider's shared limits.",
        ),
        (
            "warden_provider_calls_waiting",
            "gauge",
            "LLM calls waiting for their provider's shared limits (permit, pause or rate).",
        ),
        (
            "warden_provider_throttled_total",
            "counter",
            "Answers with status 429 from the provider.",
        ),
        (
            "warden_provider_pauses_total",
            "counter",
            "Pauses of every call of the provider asked for by Retry-After or x-ratelimit headers.",
        ),
        (
            "warden_provider_paused_seconds_total",
            "counter",
            "Time the provider's calls were paused by the server's headers, in seconds.",
        ),
    ];
    for (i, (name, kind, help)) in families.into_iter().enumerate() {
        e.family(name, kind, help);
        for (provider, values) in &by_name {
            e.sample(name, &[("provider", provider)], values[i]);
        }
    }
}

/// Writes families: one HELP and TYPE, then its samples.
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{key}=\"{}\"", escape_label(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A family with one unlabelled sample.
    fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    fn histogram(&mut self, name: &str, label: (&str, &str), h: &HistogramSnapshot) {
        let bucket = format!("{name}_bucket");
        for &(bound, count) in &h.cumulative {
            let le = if bound.is_infinite() {
                "+Inf".to_owned()
            } else {
                bound.to_string()
            };
            self.sample(&bucket, &[label, ("le", &le)], count);
        }
        self.sample(&format!("{name}_sum"), &[label], h.sum_seconds);
        self.sample(&format!("{name}_count"), &[label], h.count);
    }
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A breaker's snake_case name, as the SafetyMonitor counts it.
pub fn breaker_name(breaker: Breaker) -> String {
    breaker.as_str().to_owned()
}

/// The exposition text of `s`.
pub fn render(s: &Snapshot) -> String {
    let mut e = Exposition {
        text: String::with_capacity(4096),
    };
    e.family(
        "warden_agents",
        "gauge",
        "Agents by lifecycle state (every state listed).",
    );
    for state in AgentState::ALL {
        let n = s.statuses.iter().filter(|a| a.state == state).count();
        e.sample("warden_agents", &[("state", state.as_str())], n);
    }
    e.single(
        "warden_agents_emergency_stopped",
        "gauge",
        "Agents with the emergency stop set (locked out until an operator unlocks them).",
        s.statuses.iter().filter(|a| a.emergency_stop).count(),
    );
    if let Some(trips) = &s.trips {
        e.family(
            "warden_safety_trips_total",
            "counter",
            "Breaker trips (lockouts and budget stops) since the server started, by breaker.",
        );
        let mut names: Vec<String> = BREAKERS.iter().map(|&b| breaker_name(b)).collect();
        names.extend(
            trips
                .keys()
                .filter(|k| !names.contains(k))
                .cloned()
                .collect::<Vec<_>>(),
        );
        for name in &names {
            let n = trips.get(name).copied().unwrap_or(0);
            e.sample("warden_safety_trips_total", &[("breaker", name)], n);
        }
    }
    e.single(
        "warden_tokens_used_total",
        "counter",
        "Tokens (prompt + completion) used by the team.",
        s.fleet.tokens,
    );
    e.single(
        "warden_cost_used_total",
        "counter",
        "Cost used by the team, per the price table (safety.budget.prices).",
        s.fleet.cost,
    );
    let sum = |f: fn(&AgentStatus) -> u64| s.statuses.iter().map(f).sum::<u64>();
    e.single(
        "warden_halts_total",
        "counter",
        "Halts acknowledged, summed over the agents' records.",
        sum(|a| a.halts),
    );
    e.single(
        "warden_halt_discarded_messages_total",
        "counter",
        "Queued ordinary messages cleared by halts, summed over the agents' records.",
        sum(|a| a.discarded_by_halt),
    );
    e.single(
        "warden_restarts_total",
        "counter",
        "Actor restarts after crashes, summed over the agents' records.",
        sum(|a| u64::from(a.restarts)),
    );
    e.single(
        "warden_turns_total",
        "counter",
        "Turns finished, summed over the agents' records.",
        sum(|a| a.turns),
    );
    let ticks = |f: fn(&warden_protocols::TickStatus) -> u64| {
        s.statuses
            .iter()
            .filter_map(|a| a.npc.as_ref()?.tick.as_ref())
            .map(f)
            .sum::<u64>()
    };
    e.single(
        "warden_npc_ticks_total",
        "counter",
        "Autonomous NPC ticks queued by the tick arbiter, summed over the agents.",
        ticks(|t| t.ticks),
    );
    e.single(
        "warden_npc_ticks_skipped_total",
        "counter",
        "NPC ticks skipped because a turn ran or a tick was still queued, summed over the agents.",
        ticks(|t| t.skipped),
    );
    e.single(
        "warden_npc_ignored_unjournaled_total",
        "counter",
        "IGNORE verdicts counted but not journaled (npc.journal_ignored = false), summed over the \
         agents.",
        s.statuses
            .iter()
            .filter_map(|a| a.npc.as_ref())
            .map(|n| n.ignored_unjournaled)
            .sum::<u64>(),
    );
    e.family(
        "warden_npcs",
        "gauge",
        "Ticking NPCs by mode (every mode listed).",
    );
    for mode in [NpcMode::Awake, NpcMode::Asleep, NpcMode::Idle] {
        let n = s
            .statuses
            .iter()
            .filter_map(|a| a.npc.as_ref()?.tick.as_ref())
            .filter(|t| t.mode == mode)
            .count();
        e.sample("warden_npcs", &[("mode", mode.as_str())], n);
    }
    if let Some(n) = s.interventions_pending {
        e.single(
            "warden_interventions_pending",
            "gauge",
            "Limit asks waiting for an operator's answer (interactive mode).",
            n,
        );
    }
    if let Some(n) = s.stream_subscribers {
        e.single(
            "warden_event_stream_subscribers",
            "gauge",
            "Open GET /api/events streams.",
            n,
        );
    }
    if let Some(j) = &s.journal {
        e.single(
            "warden_journal_committed_seq",
            "gauge",
            "Highest event sequence number committed to the journal file (events written).",
            j.committed_seq,
        );
        e.single(
            "warden_journal_batches_total",
            "counter",
            "Journal transactions committed (one per batch of events).",
            j.commits,
        );
        e.single(
            "warden_journal_durable_waits_total",
            "counter",
            "Appends that waited for their batch to commit (safety events).",
            j.durable_waits,
        );
        e.single(
            "warden_journal_failed_batches_total",
            "counter",
            "Batches whose write still failed after the retries: the journal is degraded and retries them until it can write (their events are lost only if it closes first).",
            j.failed_batches,
        );
        e.single(
            "warden_journal_write_error",
            "gauge",
            "1 when a journal write has failed since the server started, else 0.",
            u8::from(j.write_error),
        );
    }
    e.family(
        "warden_provider_retries_total",
        "counter",
        "LLM call attempts that failed and were retried, by class (408, 429, 5xx, timeout, connect, other).",
    );
    for (class, n) in &s.provider_retries {
        e.sample("warden_provider_retries_total", &[("class", class)], n);
    }
    provider_limits(&mut e, &s.provider_limits);
    e.family(
        "warden_otel_spans_exported_total",
        "counter",
        "Trace spans the OpenTelemetry exporter sent and the collector accepted.",
    );
    e.sample("warden_otel_spans_exported_total", &[], s.otel.exported);
    e.family(
        "warden_otel_spans_dropped_total",
        "counter",
        "Trace spans lost, by reason: queue_full (the export queue was full; a turn never waits for it) or export_failed (the collector was down or refused them).",
    );
    e.sample(
        "warden_otel_spans_dropped_total",
        &[("reason", "queue_full")],
        s.otel.dropped_queue_full,
    );
    e.sample(
        "warden_otel_spans_dropped_total",
        &[("reason", "export_failed")],
        s.otel.dropped_export_failed,
    );
    e.family(
        "warden_api_halt_duration_seconds",
        "histogram",
        "Halt calls through the API, from the request to the last acknowledgement (scope: agent or all).",
    );
    e.histogram(
        "warden_api_halt_duration_seconds",
        ("scope", "agent"),
        &s.halt_agent,
    );
    e.histogram(
        "warden_api_halt_duration_seconds",
        ("scope", "all"),
        &s.halt_all,
    );
    e.text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_cumulative_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(40));
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_secs(2));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.cumulative[0], (0.00005, 1));
        assert_eq!(s.cumulative[3], (0.0005, 2));
        assert_eq!(s.cumulative.last(), Some(&(f64::INFINITY, 3)));
        assert!((s.sum_seconds - 2.00034).abs() < 1e-9);
    }

    #[test]
    fn provider_limits_are_one_series_per_provider() {
        let stats = |provider: &str, in_flight, paused_ms| warden_actors::ProviderLimitStats {
            provider: provider.into(),
            limits: Default::default(),
            in_flight,
            waiting: 2,
            throttled: 1,
            pauses: 1,
            paused_ms,
        };
        let mut e = Exposition {
            text: String::new(),
        };
        // Two limiters of one name (two teams in one process) add up.
        provider_limits(
            &mut e,
            &[
                stats("local", 3, 1500),
                stats("cloud", 0, 0),
                stats("local", 1, 250),
            ],
        );
        for line in [
            "# TYPE warden_provider_calls_in_flight gauge",
            "warden_provider_calls_in_flight{provider=\"cloud\"} 0",
            "warden_provider_calls_in_flight{provider=\"local\"} 4",
            "warden_provider_calls_waiting{provider=\"local\"} 4",
            "# TYPE warden_provider_throttled_total counter",
            "warden_provider_throttled_total{provider=\"local\"} 2",
            "warden_provider_pauses_total{provider=\"local\"} 2",
            "warden_provider_paused_seconds_total{provider=\"local\"} 1.75",
        ] {
            assert!(e.text.lines().any(|l| l == line), "{line} in\n{}", e.text);
        }
        assert_eq!(e.text.matches("provider=\"local\"").count(), 5);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
