//! The report as a table (`warden loadtest` without `--json`).

use super::{compare::format_value, LoadReport};
use std::io::{self, Write};

/// `d0=1 d1=2 …`, or `-` when empty.
fn by_depth(counts: &[u64]) -> String {
    if counts.is_empty() {
        return "-".to_owned();
    }
    counts
        .iter()
        .enumerate()
        .map(|(depth, n)| format!("d{depth}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `repeat` object ([`super::compare::summarize`]) as table rows: median and range per figure.
///
/// # Errors
///
/// The first error of writing to `out`.
pub fn write_repeat(out: &mut dyn Write, repeat: &serde_json::Value) -> io::Result<()> {
    writeln!(
        out,
        "  repeated      {} runs, same seed: median [min, max]",
        repeat["runs"]
    )?;
    if let Some(figures) = repeat["figures"].as_object() {
        let number = |v: &serde_json::Value| v.as_f64().map_or_else(String::new, format_value);
        for (name, f) in figures {
            writeln!(
                out,
                "    {name:<24} {} [{}, {}]",
                number(&f["median"]),
                number(&f["min"]),
                number(&f["max"])
            )?;
        }
    }
    Ok(())
}

/// Reasons listed under the table's `events` row.
const SHOWN_REASONS: usize = 5;

/// `10 settled: 0 answered, 10 failed, …` and, when some were not answered, a warning.
pub(super) fn describe_outcomes(o: &super::outcomes::Outcomes) -> String {
    let text = format!(
        "{} settled: {} answered, {} failed, {} refused, {} discarded, {} gone, {} timed out",
        o.total(),
        o.answered,
        o.failed,
        o.refused,
        o.discarded,
        o.gone,
        o.timed_out
    );
    match (o.total(), o.answered) {
        (0, _) => text,
        (_, 0) => format!("{text} — NONE ANSWERED"),
        (total, answered) if answered < total => format!(
            "{text} — {:.1} % unanswered",
            (total - answered) as f64 * 100.0 / total as f64
        ),
        _ => text,
    }
}

/// Finished turns by termination reason, per depth: `d0 answered=10 llm_error=2; d1 …`; per
/// agent for a team file. `None` when no turn finished.
fn describe_turns(r: &LoadReport) -> Option<String> {
    let reasons = |m: &super::outcomes::TurnReasons| {
        m.iter()
            .map(|(reason, n)| format!("{reason}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !r.turns_by_agent.is_empty() {
        return Some(
            r.turns_by_agent
                .iter()
                .map(|(agent, t)| {
                    format!("{agent} (d{} {}) {}", t.depth, t.role, reasons(&t.turns))
                })
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    if r.turns_by_depth.is_empty() {
        return None;
    }
    Some(
        r.turns_by_depth
            .iter()
            .enumerate()
            .map(|(depth, m)| format!("d{depth} {}", reasons(m)))
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// `2 (desk d0: budget_exceeded: …; …)`: the count and the first few with depth and cause.
fn describe_stopped(r: &LoadReport) -> String {
    if r.stopped_agents.is_empty() {
        return r.stopped.to_string();
    }
    let listed: Vec<String> = r
        .stopped_agents
        .iter()
        .take(3)
        .map(|s| format!("{} d{}: {}", s.agent, s.depth, s.cause))
        .collect();
    let more = if r.stopped > 3 {
        format!("; {} more", r.stopped - 3)
    } else {
        String::new()
    };
    format!("{} ({}{more})", r.stopped, listed.join("; "))
}

/// The human-readable table.
///
/// # Errors
///
/// The first error of writing to `out`.
pub fn write_report(out: &mut dyn Write, r: &LoadReport) -> io::Result<()> {
    writeln!(
        out,
        "warden loadtest — scenario {} (seed {})",
        r.scenario, r.seed
    )?;
    let mut rows = verdict_rows(r);
    rows.extend(run_rows(r));
    rows.extend(cluster_rows(r));
    rows.extend(recovery_rows(r));
    write_rows(out, r, rows)?;
    write_nodes(out, r)
}

/// The thresholds' verdicts (what a CI log shows first) and the team file's workload.
fn verdict_rows(r: &LoadReport) -> Vec<(&'static str, String)> {
    let mut rows: Vec<(&'static str, String)> = Vec::new();
    // The verdicts first: what a CI log shows.
    for v in &r.thresholds {
        rows.push((
            "threshold",
            format!(
                "{} {} (value {})",
                if v.pass { "pass" } else { "FAIL" },
                v.threshold,
                v.value
                    .map_or_else(|| "missing".to_owned(), super::compare::format_value)
            ),
        ));
    }
    if let Some(w) = &r.workload {
        let limits = match (w.duration_s, w.count) {
            (Some(d), Some(c)) => format!("{d} s or {c} events"),
            (Some(d), None) => format!("{d} s"),
            (None, Some(c)) => format!("{c} events"),
            (None, None) => "-".to_owned(),
        };
        rows.push((
            "workload",
            format!(
                "{} {}: {} {}, to {}",
                w.config,
                limits,
                w.mode,
                w.level,
                w.agents.join(", ")
            ),
        ));
    }
    rows
}

/// The run's own figures, one row each.
fn run_rows(r: &LoadReport) -> Vec<(&'static str, String)> {
    let d = &r.delegations;
    let mut rows: Vec<(&'static str, String)> = Vec::new();
    rows.extend([
        ("agents", r.agents.to_string()),
        ("spawn", format!("{} ns/agent", r.spawn_ns_per_agent)),
        (
            "tasks",
            format!("{} sent, {} refused", r.tasks_sent, r.tasks_refused),
        ),
        ("events", describe_outcomes(&r.outcomes)),
        ("duration", format!("{:.3} s", r.duration_s)),
        (
            "steps",
            format!("{} ({:.0}/s)", r.steps, r.steps_per_sec),
        ),
        ("tool calls", r.tool_calls.to_string()),
        (
            "delegations",
            format!(
                "{} requested: {} accepted, refused {} budget / {} hops / {} locked / {} cycle / {} other",
                d.requested,
                d.accepted,
                d.refused_budget,
                d.refused_hops,
                d.refused_locked,
                d.refused_cycle,
                r.refused_other
            ),
        ),
        (
            "lockouts",
            format!(
                "{} (by depth: {})",
                r.lockouts,
                by_depth(&r.lockouts_by_depth)
            ),
        ),
        (
            "refusals",
            format!(
                "{} delegations (by the delegate's depth: {})",
                r.refusals_by_depth.iter().sum::<u64>(),
                by_depth(&r.refusals_by_depth)
            ),
        ),
        (
            "retries",
            format!(
                "{} ({})",
                r.retries.values().sum::<u64>(),
                r.retries
                    .iter()
                    .map(|(class, n)| format!("{class}={n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ),
        ("stopped", describe_stopped(r)),
        ("restarts", r.restarts.to_string()),
        (
            "halt probe",
            format!(
                "backlog {}: p50 {} µs, p99 {} µs, max {} µs, {} processed after halt",
                r.halt.backlog,
                r.halt.latency_us_p50,
                r.halt.latency_us_p99,
                r.halt.latency_us_max,
                r.halt.processed_after_halt
            ),
        ),
        (
            "halt all",
            format!("{} agents in {:.3} ms", r.halt_all.agents, r.halt_all.ms),
        ),
        (
            "event latency",
            format!(
                "{} answered: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms (accepted → answered)",
                r.event_latency.answered,
                r.event_latency.p50_ms,
                r.event_latency.p90_ms,
                r.event_latency.p99_ms,
                r.event_latency.max_ms
            ),
        ),
        (
            "memory",
            format!(
                "peak RSS {:.1} MiB, {} bytes/agent",
                r.memory.rss_peak_bytes as f64 / (1024.0 * 1024.0),
                r.memory.bytes_per_agent
            ),
        ),
        (
            "soak",
            r.soak
                .as_ref()
                .map_or_else(|| "(run under 90 s)".to_owned(), super::soak::describe),
        ),
        ("lost events", r.lost_events.to_string()),
        ("leaked slots", r.leaked_slots.to_string()),
        (
            "timed out",
            if r.timed_out {
                format!("yes: {} tasks unfinished (--timeout-s)", r.unfinished_tasks)
            } else {
                "no".to_owned()
            },
        ),
    ]);
    rows
}

/// A cluster run's rows (none for one node).
fn cluster_rows(r: &LoadReport) -> Vec<(&'static str, String)> {
    let mut rows: Vec<(&'static str, String)> = Vec::new();
    if let Some(c) = &r.cluster {
        let ms =
            |v: Option<f64>| v.map_or_else(|| "not reached".to_owned(), |ms| format!("{ms:.3} ms"));
        rows.extend([
            (
                "cluster",
                format!("{} nodes on {} (namespace {})", c.nodes, c.url, c.namespace),
            ),
            (
                "cluster halt",
                format!(
                    "every agent of every node halted {} after the halt on the first node{}",
                    ms(c.halt_ms),
                    if c.halt_unreached.is_empty() {
                        String::new()
                    } else {
                        format!(" (not reached: {})", c.halt_unreached.join(", "))
                    }
                ),
            ),
            (
                "cross-node",
                format!(
                    "{} delegations sent, {} received, {} ran, {} refused as unknown ({} cancelled, {} of them never queued); request → end p50 {:.3} ms, p99 {:.3} ms",
                    c.delegations_sent,
                    c.delegations_received,
                    c.delegations_ran,
                    c.refused_unknown,
                    c.delegations_cancelled,
                    c.cancelled_unqueued,
                    c.delegation_ms_p50,
                    c.delegation_ms_p99
                ),
            ),
        ]);
    }
    rows
}

/// The recoveries of locked-out agents, and the interrupt that cut the run.
fn recovery_rows(r: &LoadReport) -> Vec<(&'static str, String)> {
    let mut rows: Vec<(&'static str, String)> = Vec::new();
    for rec in &r.recoveries {
        let at = |v: Option<f64>| v.map_or_else(|| "never".to_owned(), |s| format!("{s:.3} s"));
        let recover = match rec.recovered_s {
            Some(s) => format!(" — recovered in {:.3} s", s - rec.locked_s),
            None => String::new(),
        };
        rows.push((
            "recovery",
            format!(
                "{} d{}: locked out at {:.3} s, unlocked {}, answering again {}{recover}",
                rec.agent,
                rec.depth,
                rec.locked_s,
                at(rec.unlocked_s),
                at(rec.recovered_s)
            ),
        ));
    }
    if let Some(signal) = &r.interrupted {
        rows.push((
            "interrupted",
            format!("yes, by {signal}: the figures cover what was done before it"),
        ));
    }
    rows
}

/// Writes `rows`, the events row followed by the reasons' samples and the turns.
fn write_rows(
    out: &mut dyn Write,
    r: &LoadReport,
    rows: Vec<(&'static str, String)>,
) -> io::Result<()> {
    let reasons = r.outcomes.reasons.iter().take(SHOWN_REASONS);
    let turns = describe_turns(r);
    for (name, value) in rows {
        writeln!(out, "  {name:<13} {value}")?;
        if name == "events" {
            for reason in reasons.clone() {
                writeln!(
                    out,
                    "    {:<11} {} {}: {}",
                    reason.fate, reason.count, reason.reason, reason.sample
                )?;
            }
            if let Some(turns) = &turns {
                writeln!(out, "  {:<13} {turns}", "turns")?;
            }
        }
    }
    Ok(())
}

/// A cluster run's table, one line per node.
fn write_nodes(out: &mut dyn Write, r: &LoadReport) -> io::Result<()> {
    if !r.nodes.is_empty() {
        writeln!(
            out,
            "  {:<16} {:>7} {:>8} {:>9} {:>6} {:>6} {:>6} {:>8} {:>8} {:>10}",
            "node",
            "agents",
            "turns",
            "llm calls",
            "sent",
            "recv",
            "ran",
            "lockouts",
            "refusals",
            "halted ms"
        )?;
        for n in &r.nodes {
            let halted = n
                .halt_ack_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.3}"));
            writeln!(
                out,
                "  {:<16} {:>7} {:>8} {:>9} {:>6} {:>6} {:>6} {:>8} {:>8} {:>10}",
                n.node,
                n.agents,
                n.turns,
                n.llm_calls,
                n.delegations_sent,
                n.delegations_received,
                n.delegations_ran,
                n.lockouts,
                n.refusals,
                halted
            )?;
        }
    }
    Ok(())
}
