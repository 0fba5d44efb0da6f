//! `warden loadtest --report FILE.html`: the run as one self-contained HTML file — inline SVG and
//! CSS, no script, no network reference — to look at in any browser or attach to a ticket.
//!
//! It shows the invariants as a pass/fail header, the run's configuration, throughput (model
//! calls, turns, events accepted per second) and latency (p50/p99 of the events answered in each
//! second) over time, the latency histogram, agents by state over time and lockouts and refusals
//! by depth. The document is well-formed XML (XHTML syntax), so a test can check it with a plain
//! tag-balance check.

use super::{compare::format_value, LoadReport};
use std::{
    fmt::Write as _,
    io::{self, Write},
};

/// Colours of the series, in order.
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 220.0;
const PAD: f64 = 40.0;

/// `text` with `&`, `<`, `>` and `"` escaped.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" step for about `ticks` ticks up to `max`: 1, 2 or 5 times a power of ten.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(1e-12);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

/// A line chart of `lines` (name, y values) over `x`, with its title, axes (ticks at round
/// values, grid lines) and legend. A value that is not a number (NaN: a second with nothing to
/// measure) is a gap in its line, not a zero.
fn line_chart(title: &str, unit: &str, x: &[f64], lines: &[(String, Vec<f64>)]) -> String {
    let mut svg = String::new();
    let x_data = x.iter().copied().fold(0.0_f64, f64::max).max(1e-9);
    let y_data = lines
        .iter()
        .flat_map(|(_, ys)| ys.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    // Nothing above 0 (or nothing at all): an axis of 0 to 1.
    let y_data = if y_data > 0.0 { y_data } else { 1.0 };
    // The axes end at the first tick at or above the data.
    let (x_step, y_step) = (nice_step(x_data, 5.0), nice_step(y_data, 4.0));
    let x_max = (x_data / x_step).ceil() * x_step;
    let y_max = (y_data / y_step).ceil() * y_step;
    let px = |v: f64| PAD + v / x_max * (WIDTH - 2.0 * PAD);
    let py = |v: f64| HEIGHT - PAD - v / y_max * (HEIGHT - 2.0 * PAD);
    let _ = write!(
        svg,
        "<svg width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\">\
         <title>{}</title>\
         <text x=\"{PAD}\" y=\"16\" class=\"t\">{} ({})</text>\
         <line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" class=\"axis\"/>\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\" class=\"axis\"/>",
        esc(title),
        esc(title),
        esc(unit),
        b = HEIGHT - PAD,
        r = WIDTH - PAD,
    );
    let mut tick = 0.0;
    while tick <= y_max * (1.0 + 1e-9) {
        let _ = write!(
            svg,
            "<line x1=\"{PAD}\" y1=\"{y:.1}\" x2=\"{r}\" y2=\"{y:.1}\" class=\"grid\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"l\" text-anchor=\"end\">{}</text>",
            PAD - 3.0,
            py(tick) + 4.0,
            format_tick(tick),
            y = py(tick),
            r = WIDTH - PAD,
        );
        tick += y_step;
    }
    let mut tick = 0.0;
    while tick <= x_max * (1.0 + 1e-9) {
        let _ = write!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{b}\" x2=\"{x:.1}\" y2=\"{:.1}\" class=\"axis\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" class=\"l\" text-anchor=\"middle\">{} s</text>",
            HEIGHT - PAD + 4.0,
            HEIGHT - PAD + 15.0,
            format_tick(tick),
            x = px(tick),
            b = HEIGHT - PAD,
        );
        tick += x_step;
    }
    if lines
        .iter()
        .all(|(_, ys)| ys.iter().all(|v| !v.is_finite()))
    {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"l\" text-anchor=\"middle\">nothing to show</text>",
            WIDTH / 2.0,
            HEIGHT / 2.0
        );
    }
    // Legend entries side by side, each as wide as its label (about 6.5 px a character).
    let mut legend_x = PAD + 8.0;
    for (i, (name, ys)) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let label_x = legend_x;
        legend_x += name.chars().count() as f64 * 6.5 + 24.0;
        // One polyline per run of numbers: a NaN ends it (a gap).
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (x, y) in x.iter().zip(ys) {
            if y.is_finite() {
                if let Some(run) = runs.last_mut() {
                    run.push((*x, *y));
                }
            } else if runs.last().is_some_and(|r| !r.is_empty()) {
                runs.push(Vec::new());
            }
        }
        for run in runs.iter().filter(|r| !r.is_empty()) {
            if let [(x, y)] = run.as_slice() {
                // One point alone (a short run, or a second between gaps): a dot.
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                    px(*x),
                    py(*y)
                );
                continue;
            }
            let points: Vec<String> = run
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
                .collect();
            let _ = write!(
                svg,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
                points.join(" "),
            );
        }
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"l\" fill=\"{colour}\">{}</text>",
            label_x,
            HEIGHT - 6.0,
            esc(name),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A tick's label: whole numbers bare, else up to 3 significant decimals.
fn format_tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round())
    } else {
        let text = format!("{v:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// A bar chart of `bars` (label, value).
fn bar_chart(title: &str, bars: &[(String, f64)]) -> String {
    let mut svg = String::new();
    let y_max = bars
        .iter()
        .map(|(_, v)| *v)
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let slot = (WIDTH - 2.0 * PAD) / bars.len().max(1) as f64;
    let _ = write!(
        svg,
        "<svg width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\">\
         <title>{}</title><text x=\"{PAD}\" y=\"16\" class=\"t\">{}</text>\
         <line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" class=\"axis\"/>",
        esc(title),
        esc(title),
        b = HEIGHT - PAD,
        r = WIDTH - PAD,
    );
    if bars.is_empty() {
        let _ = write!(
            svg,
            "<text x=\"{PAD}\" y=\"{}\" class=\"l\">none</text>",
            HEIGHT / 2.0
        );
    }
    // Labels at most every 36 px (a label is about 30 px wide), counts only on wide enough bars.
    let every = (36.0 / slot).ceil().max(1.0) as usize;
    for (i, (name, v)) in bars.iter().enumerate() {
        let h = v / y_max * (HEIGHT - 2.0 * PAD);
        let x = PAD + slot * i as f64;
        let name = if i % every == 0 { name.as_str() } else { "" };
        let count = if slot >= 30.0 || *v == y_max {
            format_value(*v)
        } else {
            String::new()
        };
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"l\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"l\" text-anchor=\"middle\">{}</text>",
            x + slot * 0.1,
            HEIGHT - PAD - h,
            slot * 0.8,
            COLOURS[0],
            x + slot / 2.0,
            HEIGHT - PAD + 14.0,
            esc(name),
            x + slot / 2.0,
            HEIGHT - PAD - h - 3.0,
            count,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// The latency histogram's bars on a log scale: 4 buckets a decade (edges at 10^(k/4) ms, each
/// labelled by its lower edge), from the fastest answer's bucket to the slowest's, so that a fast
/// bulk and a slow tail both show.
fn histogram(sorted_us: &[u64]) -> Vec<(String, f64)> {
    let (Some(&min), Some(&max)) = (sorted_us.first(), sorted_us.last()) else {
        return Vec::new();
    };
    // Bucket k holds latencies in [10^(k/4), 10^((k+1)/4)) ms; sub-µs ones go to the first.
    let bucket = |us: u64| ((us.max(1) as f64 / 1000.0).log10() * 4.0).floor() as i64;
    let (first, last) = (bucket(min), bucket(max));
    let mut counts = vec![0u64; (last - first + 1) as usize];
    for us in sorted_us {
        counts[(bucket(*us) - first) as usize] += 1;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let edge = 10f64.powf((first + i as i64) as f64 / 4.0);
            (significant(edge), *n as f64)
        })
        .collect()
}

/// `v` with 2 significant digits (`0.18`, `1.8`, `18`, `180`).
fn significant(v: f64) -> String {
    if v >= 10.0 {
        format!("{:.0}", v)
    } else {
        let digits = (1 - v.log10().floor() as i32).max(0) as usize;
        format!("{v:.digits$}")
    }
}

fn depth_bars(counts: &[u64]) -> Vec<(String, f64)> {
    counts
        .iter()
        .enumerate()
        .map(|(d, n)| (format!("d{d}"), *n as f64))
        .collect()
}

/// Writes `report` as one self-contained HTML document. `configuration` is the run's
/// configuration (the command line's options), shown as given.
///
/// # Errors
///
/// The first error of writing to `out`.
pub fn write_html(
    out: &mut dyn Write,
    report: &LoadReport,
    configuration: &serde_json::Value,
) -> io::Result<()> {
    let r = report;
    let checks = invariant_checks(r);
    let pass = checks.iter().all(|(_, ok, _)| *ok);
    let table = checks_table(&checks);
    let over_time = over_time_charts(r);
    let spread = spread_charts(r);
    let events_banner = events_banner(r);
    let figures = figures(r);
    let soak = r.soak.as_ref().map_or_else(
        || "soak: run under 90 s, no RSS slope".to_owned(),
        |s| format!("soak: {}", super::soak::describe(s)),
    );
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let title = format!(
        "warden loadtest — {} (seed {}, {} agents)",
        r.scenario, r.seed, r.agents
    );
    write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\
         <title>{title}</title><style>\
         body{{font-family:sans-serif;margin:2em;max-width:1400px}}\
         .banner{{padding:.6em 1em;color:#fff;font-weight:bold}}\
         .ok{{background:#2ca02c}}.bad{{background:#d62728}}.warn{{background:#e07b00}}\
         td.pass{{color:#2ca02c}}td.fail{{color:#d62728;font-weight:bold}}\
         td{{padding:2px 10px}}pre{{background:#f4f4f4;padding:1em;overflow:auto}}\
         .t{{font-size:13px;font-weight:bold}}.l{{font-size:11px}}\
         .axis{{stroke:#888}}.grid{{stroke:#eee}}svg{{margin:.5em;border:1px solid #ddd}}\
         </style></head><body>\n\
         <h1>{title}</h1>\n\
         <div class=\"banner {}\">invariants: {}</div>\n{events_banner}\
         <table>{table}</table>\n<p>{}</p>\n\
         <h2>Over time</h2>\n<div>{over_time}</div>\n\
         <h2>Distribution and spread</h2>\n<div>{spread}</div>\n\
         <h2>Figures</h2>\n<pre>{}</pre>\n\
         <h2>Configuration</h2>\n<pre>{}</pre>\n\
         </body></html>\n",
        if pass { "ok" } else { "bad" },
        if pass { "pass" } else { "FAIL" },
        esc(&soak),
        esc(&pretty(&figures)),
        esc(&pretty(configuration)),
        title = esc(&title),
    )
}

/// The run's invariants: (name, held, the value shown).
fn invariant_checks(r: &LoadReport) -> Vec<(&'static str, bool, String)> {
    let mut checks = vec![
        ("lost events", r.lost_events == 0, r.lost_events.to_string()),
        (
            "leaked slots",
            r.leaked_slots == 0,
            r.leaked_slots.to_string(),
        ),
        (
            "processed after halt",
            r.halt.processed_after_halt == 0,
            r.halt.processed_after_halt.to_string(),
        ),
        (
            "not timed out",
            !r.timed_out,
            format!("{} unfinished", r.unfinished_tasks),
        ),
    ];
    if let Some(c) = &r.cluster {
        let wrong = c.violations();
        checks.push(("cluster", wrong.is_empty(), wrong.join("; ")));
    }
    checks
}

/// The invariants as table rows.
fn checks_table(checks: &[(&'static str, bool, String)]) -> String {
    let mut table = String::new();
    for (name, ok, value) in checks {
        let _ = write!(
            table,
            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            esc(name),
            if *ok { "pass" } else { "fail" },
            if *ok { "pass" } else { "FAIL" },
            esc(value)
        );
    }
    table
}

/// The per-second charts: throughput, latency, events not answered, agents by state, RSS.
fn over_time_charts(r: &LoadReport) -> String {
    let x: Vec<f64> = r.series.iter().map(|s| s.t_s).collect();
    let per_s = |f: fn(&super::Sample) -> u64| -> Vec<f64> {
        let mut before = 0.0;
        r.series
            .iter()
            .map(|s| {
                let dt = (s.t_s - before).max(1e-9);
                before = s.t_s;
                f(s) as f64 / dt
            })
            .collect()
    };
    let throughput = line_chart(
        "Throughput",
        "/s",
        &x,
        &[
            ("model calls/s".into(), per_s(|s| s.llm_calls)),
            ("turns/s".into(), per_s(|s| s.turns)),
            ("events/s".into(), per_s(|s| s.events_accepted)),
        ],
    );
    // A second with no answer has no latency: a gap, not a zero.
    let latency_of = |f: fn(&super::Sample) -> f64| -> Vec<f64> {
        r.series
            .iter()
            .map(|s| if s.answered > 0 { f(s) } else { f64::NAN })
            .collect()
    };
    let latency = line_chart(
        "Event latency (accepted → answered), per second",
        "ms",
        &x,
        &[
            ("p50".into(), latency_of(|s| s.latency_p50_ms)),
            ("p90".into(), latency_of(|s| s.latency_p90_ms)),
            ("p95".into(), latency_of(|s| s.latency_p95_ms)),
            ("p99".into(), latency_of(|s| s.latency_p99_ms)),
        ],
    );
    let errors = line_chart(
        "Events not answered, by fate",
        "events/s",
        &x,
        &[
            ("failed/s".into(), per_s(|s| s.failed)),
            ("refused/s".into(), per_s(|s| s.refused)),
            ("discarded/s".into(), per_s(|s| s.discarded)),
        ],
    );
    let rss = line_chart(
        "Resident set (VmRSS)",
        "MiB",
        &x,
        &[(
            "RSS".into(),
            r.series
                .iter()
                .map(|s| s.rss_bytes as f64 / (1024.0 * 1024.0))
                .collect(),
        )],
    );
    let mut states: Vec<String> = r
        .series
        .iter()
        .flat_map(|s| s.agents_by_state.keys().cloned())
        .collect();
    states.sort();
    states.dedup();
    let by_state: Vec<(String, Vec<f64>)> = states
        .iter()
        .map(|state| {
            let ys = r
                .series
                .iter()
                .map(|s| s.agents_by_state.get(state).copied().unwrap_or(0) as f64)
                .collect();
            (state.clone(), ys)
        })
        .collect();
    let agents = line_chart("Agents by state", "agents", &x, &by_state);
    [throughput, latency, errors, agents, rss].concat()
}

/// The distributions: the latency histogram, lockouts and refusals by depth.
fn spread_charts(r: &LoadReport) -> String {
    let hist = bar_chart(
        "Event latency histogram (log scale: bucket start, ms)",
        &histogram(&r.event_latencies_us),
    );
    let lockouts = bar_chart("Lockouts by depth", &depth_bars(&r.lockouts_by_depth));
    let refusals = bar_chart(
        "Delegation refusals by the delegate's depth",
        &depth_bars(&r.refusals_by_depth),
    );
    [hist, lockouts, refusals].concat()
}

/// The thresholds' verdicts, the interrupt, and the events' fates (a run where nothing was
/// answered is not a green page) with the reasons' table.
fn events_banner(r: &LoadReport) -> String {
    // The events' fates: a run where nothing was answered is not a green page.
    let o = &r.outcomes;
    let events_class = match (o.total(), o.answered) {
        (0, _) => "ok",
        (_, 0) => "bad",
        (total, answered) if answered < total => "warn",
        _ => "ok",
    };
    let mut reasons = String::new();
    for reason in &o.reasons {
        let _ = write!(
            reasons,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&reason.fate),
            esc(&reason.reason),
            reason.count,
            esc(&reason.sample)
        );
    }
    if !reasons.is_empty() {
        reasons = format!(
            "<table><tr><th>fate</th><th>reason</th><th>events</th><th>sample</th></tr>{reasons}</table>"
        );
    }
    let interrupted = r.interrupted.as_ref().map_or_else(String::new, |signal| {
        format!(
            "<div class=\"banner warn\">interrupted by {}: the figures cover what was done before it</div>\n",
            esc(signal)
        )
    });
    let mut verdicts = String::new();
    for v in &r.thresholds {
        let _ = write!(
            verdicts,
            "<tr><td>threshold <code>{}</code></td><td class=\"{}\">{}</td><td>value {}</td></tr>",
            esc(&v.threshold),
            if v.pass { "pass" } else { "fail" },
            if v.pass { "pass" } else { "FAIL" },
            v.value.map_or_else(|| "missing".to_owned(), format_value)
        );
    }
    let thresholds_banner = if r.thresholds.is_empty() {
        String::new()
    } else {
        let failed = r.thresholds.iter().filter(|v| !v.pass).count();
        format!(
            "<div class=\"banner {}\">thresholds: {}</div>\n<table>{verdicts}</table>\n",
            if failed == 0 { "ok" } else { "bad" },
            if failed == 0 {
                format!("all {} pass", r.thresholds.len())
            } else {
                format!("{failed} of {} FAIL", r.thresholds.len())
            }
        )
    };
    format!(
        "{thresholds_banner}{interrupted}<div class=\"banner {events_class}\">events: {}</div>\n{reasons}\n",
        esc(&super::report::describe_outcomes(o))
    )
}

/// The figures shown as JSON.
fn figures(r: &LoadReport) -> serde_json::Value {
    serde_json::json!({
        "duration_s": r.duration_s,
        "steps": r.steps,
        "steps_per_sec": r.steps_per_sec,
        "event_latency": r.event_latency,
        "delegations": r.delegations,
        "lockouts": r.lockouts,
        "outcomes": r.outcomes,
        "thresholds": r.thresholds,
        "turns_by_depth": r.turns_by_depth,
        "turns_by_agent": r.turns_by_agent,
        "stopped_agents": r.stopped_agents,
        "retries": r.retries,
        "halt": r.halt,
        "memory": r.memory,
        "soak": r.soak,
        "nodes": r.nodes,
        "cluster": r.cluster,
    })
}
