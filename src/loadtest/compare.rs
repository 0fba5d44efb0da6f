//! `warden loadtest --repeat N` (median and range per headline figure) and
//! `warden loadtest compare A.json B.json` (ratios, with the ranges as the noise band).
//!
//! Both work on the JSON report, so reports written by earlier runs (files) compare as well as
//! fresh ones. A report with a `repeat` object is compared by its medians. With every run's value
//! on both sides (`repeat.figures.PATH.values`, written since issue 34) the verdict is a
//! two-sided Mann-Whitney U test over the runs (exact, α = 0.05), with its p-value and Cliff's
//! delta as the effect size (`P(B > A) − P(B < A)`, −1 to 1): B is "slower" or "faster" only when
//! p < 0.05; "within noise" when not; "too few runs to tell" when even complete separation could
//! not reach p < 0.05 (3 runs a side: at best p = 0.1; 4 a side: 0.029). Reports with ranges only
//! (written before) keep the older rule: "beyond noise" when the `[min, max]` ranges do not
//! overlap. Without bands (a single run on either side) the verdict is the ratio's direction,
//! marked "no noise band".
//!
//! [`check_report`] refuses JSON that is not a report; [`differences`] lists what makes two
//! reports incomparable (another scenario, seed, fleet or workload, or different work done: events
//! sent, refused, answered, delegations, model calls), and figures an open loop's schedule fixes
//! (`duration_s`, `steps_per_sec`: the offered load, not a measure) are left out of its
//! comparison.

use serde::Serialize;
use serde_json::{json, Map, Value};
use std::io::{self, Write};

/// `warden loadtest compare --fail-on-regression`'s exit code when B is worse beyond noise.
pub const EXIT_REGRESSION: u8 = 13;

/// Which way is better for a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Less is better (times, latencies, memory).
    Lower,
    /// More is better (throughput).
    Higher,
}

/// The headline figures: their path in the report (`.`-separated) and which way is better.
pub const HEADLINES: [(&str, Better); 12] = [
    ("duration_s", Better::Lower),
    ("steps_per_sec", Better::Higher),
    ("event_latency.p50_ms", Better::Lower),
    ("event_latency.p90_ms", Better::Lower),
    ("event_latency.p99_ms", Better::Lower),
    ("event_latency.max_ms", Better::Lower),
    ("spawn_ns_per_agent", Better::Lower),
    ("halt.latency_us_p50", Better::Lower),
    ("halt.latency_us_p99", Better::Lower),
    ("halt_all.ms", Better::Lower),
    ("memory.rss_peak_bytes", Better::Lower),
    ("memory.bytes_per_agent", Better::Lower),
];

/// A figure of `report` by its `.`-separated path, as a number.
fn figure(report: &Value, path: &str) -> Option<f64> {
    path.split('.')
        .try_fold(report, |v, key| v.get(key))
        .and_then(Value::as_f64)
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The `repeat` object of `N` runs' reports: `{"runs": N, "figures": {PATH: {"median", "min",
/// "max"}}}` for every headline figure the reports have.
pub fn summarize(reports: &[Value]) -> Value {
    let mut figures = Map::new();
    for (path, _) in HEADLINES {
        let mut values: Vec<f64> = reports.iter().filter_map(|r| figure(r, path)).collect();
        if values.is_empty() {
            continue;
        }
        let runs = values.clone();
        values.sort_by(f64::total_cmp);
        figures.insert(
            path.to_owned(),
            json!({
                "median": median(&values),
                "min": values[0],
                "max": values[values.len() - 1],
                "values": runs,
            }),
        );
    }
    json!({ "runs": reports.len(), "figures": figures })
}

/// One side of a comparison: the value (the median of a repeated run), its band, and every
/// run's value when the report has them.
type Side = (f64, Option<(f64, f64)>, Option<Vec<f64>>);

fn side(report: &Value, path: &str) -> Option<Side> {
    let repeated = report
        .get("repeat")
        .and_then(|r| r.get("figures"))
        .and_then(|f| f.get(path));
    match repeated {
        Some(f) => {
            let get = |k: &str| f.get(k).and_then(Value::as_f64);
            let values = f
                .get("values")
                .and_then(Value::as_array)
                .and_then(|v| v.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>());
            Some((get("median")?, Some((get("min")?, get("max")?)), values))
        }
        None => Some((figure(report, path)?, None, None)),
    }
}

/// The significance level of the comparison's test.
pub const ALPHA: f64 = 0.05;

/// Mann-Whitney U over samples `a` and `b`: the two-sided p-value (exact for `n·m` ≤ 10000, a
/// normal approximation above; ties count one half and the exact distribution is then the
/// no-ties one, a slight approximation), the smallest p-value these sample sizes can give, and
/// Cliff's delta `P(B > A) − P(B < A)`.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return (1.0, 1.0, 0.0);
    }
    // U of B: pairs where B is larger, ties one half.
    let mut greater = 0.0;
    let mut less = 0.0;
    for x in a {
        for y in b {
            if y > x {
                greater += 1.0;
            } else if y < x {
                less += 1.0;
            }
        }
    }
    let pairs = (n * m) as f64;
    let u = greater + (pairs - greater - less) / 2.0;
    let delta = (greater - less) / pairs;
    if n * m > 10_000 {
        let mean = pairs / 2.0;
        let sd = (pairs * (n + m + 1) as f64 / 12.0).sqrt();
        let z = ((u - mean).abs() - 0.5).max(0.0) / sd;
        return ((2.0 * normal_tail(z)).min(1.0), 0.0, delta);
    }
    // The number of arrangements with each U (no ties): ways[n][m][u], built up by the
    // recurrence f(n, m, u) = f(n − 1, m, u − m) + f(n, m − 1, u).
    let max_u = n * m;
    let mut table = vec![vec![vec![0.0_f64; max_u + 1]; m + 1]; n + 1];
    for (i, row) in table.iter_mut().enumerate() {
        for (j, cell) in row.iter_mut().enumerate() {
            if i == 0 || j == 0 {
                cell[0] = 1.0;
            }
        }
    }
    for i in 1..=n {
        for j in 1..=m {
            for k in 0..=i * j {
                let take = if k >= j { table[i - 1][j][k - j] } else { 0.0 };
                let leave = table[i][j - 1][k];
                table[i][j][k] = take + leave;
            }
        }
    }
    let ways = &table[n][m];
    let total: f64 = ways.iter().sum();
    let low = u.floor() as usize;
    let high = u.ceil() as usize;
    let below: f64 = ways[..=low.min(max_u)].iter().sum::<f64>() / total;
    let above: f64 = ways[high.min(max_u)..].iter().sum::<f64>() / total;
    let p = (2.0 * below.min(above)).min(1.0);
    let best = (2.0 * ways[0] / total).min(1.0);
    (p, best, delta)
}

/// `P(Z > z)` for a standard normal `Z` (Abramowitz and Stegun 7.1.26, error < 1.5e-7).
fn normal_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    0.5 * poly * (-x * x).exp()
}

/// One figure compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The figure's path in the report.
    pub figure: String,
    /// A's value (its median when A was repeated).
    pub a: f64,
    /// B's value.
    pub b: f64,
    /// `b / a` (`None` when `a` is 0).
    pub ratio: Option<f64>,
    /// `faster beyond noise`, `slower beyond noise`, `within noise`, or without bands `faster
    /// (no noise band)`, `slower (no noise band)`, `same`. (For memory: `smaller`/`larger`.)
    pub verdict: String,
    /// B is worse than A beyond the noise band (the exit code of `--fail-on-regression`).
    pub regression: bool,
    /// The Mann-Whitney U test's two-sided p-value, when both sides have every run's value.
    pub p_value: Option<f64>,
    /// Cliff's delta, `P(B > A) − P(B < A)` over the runs (−1 to 1), with the p-value.
    pub effect: Option<f64>,
}

/// Whether `report` is an open loop's (`workload.mode` `rate`): its schedule fixes `duration_s`
/// (and with it `steps_per_sec`).
fn open_loop(report: &Value) -> bool {
    report
        .get("workload")
        .and_then(|w| w.get("mode"))
        .and_then(Value::as_str)
        == Some("rate")
}

/// The figures an open loop's schedule fixes: left out of its comparison.
pub const SCHEDULE_FIXED: [&str; 2] = ["duration_s", "steps_per_sec"];

/// Compares B to A, figure by figure (those both reports have; for open loops, not the ones
/// the schedule fixes).
pub fn compare(a: &Value, b: &Value) -> Vec<Row> {
    let fixed = open_loop(a) || open_loop(b);
    HEADLINES
        .iter()
        .filter(|(path, _)| !(fixed && SCHEDULE_FIXED.contains(path)))
        .filter_map(|&(path, better)| {
            let (va, band_a, runs_a) = side(a, path)?;
            let (vb, band_b, runs_b) = side(b, path)?;
            let (good, bad) = if path.starts_with("memory.") {
                ("smaller", "larger")
            } else {
                ("faster", "slower")
            };
            // Which way B moved, in "better" terms.
            let improved = match better {
                Better::Lower => vb < va,
                Better::Higher => vb > va,
            };
            let (mut p_value, mut effect) = (None, None);
            let (verdict, regression) = match (band_a, band_b) {
                _ if runs_a.is_some() && runs_b.is_some() => {
                    let (ra, rb) = (runs_a.unwrap_or_default(), runs_b.unwrap_or_default());
                    let (p, best, delta) = mann_whitney(&ra, &rb);
                    p_value = Some(p);
                    effect = Some(delta);
                    // B worse: larger when lower is better, smaller when higher is.
                    let worse = match better {
                        Better::Lower => delta > 0.0,
                        Better::Higher => delta < 0.0,
                    };
                    let stats = format!("p={p:.3}, effect {delta:+.2}");
                    if p < ALPHA && worse {
                        (format!("{bad} ({stats})"), true)
                    } else if p < ALPHA {
                        (format!("{good} ({stats})"), false)
                    } else if best >= ALPHA {
                        (
                            format!(
                                "too few runs to tell ({}+{} runs: p ≥ {best:.3} at best; 4 a side needed)",
                                ra.len(),
                                rb.len()
                            ),
                            false,
                        )
                    } else {
                        (format!("within noise ({stats})"), false)
                    }
                }
                (Some((a_lo, a_hi)), Some((b_lo, b_hi))) => {
                    if b_lo <= a_hi && a_lo <= b_hi {
                        ("within noise".to_owned(), false)
                    } else if improved {
                        (format!("{good} beyond noise"), false)
                    } else {
                        (format!("{bad} beyond noise"), true)
                    }
                }
                _ if va == vb => ("same".to_owned(), false),
                _ if improved => (format!("{good} (no noise band)"), false),
                _ => (format!("{bad} (no noise band)"), false),
            };
            Some(Row {
                figure: path.to_owned(),
                a: va,
                b: vb,
                ratio: (va != 0.0).then(|| vb / va),
                verdict,
                regression,
                p_value,
                effect,
            })
        })
        .collect()
}

/// The keys every `warden loadtest --json` report has.
const REPORT_KEYS: [&str; 8] = [
    "scenario",
    "seed",
    "agents",
    "duration_s",
    "steps",
    "tasks_sent",
    "event_latency",
    "lost_events",
];

/// Whether `value` is a `warden loadtest --json` report.
///
/// # Errors
///
/// What is missing: the report's keys (`scenario`, `seed`, `agents`, …), or it is not an
/// object.
pub fn check_report(value: &Value) -> Result<(), String> {
    let Some(object) = value.as_object() else {
        return Err("not a JSON object".to_owned());
    };
    let missing: Vec<&str> = REPORT_KEYS
        .iter()
        .copied()
        .filter(|k| !object.contains_key(*k))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("no {}", missing.join(", ")))
    }
}

/// What makes `a` and `b` incomparable: another configuration (scenario, seed, agents,
/// workload), or different work done (events sent, refused, answered, delegations accepted, model
/// calls, lockouts) — each as `KEY: A vs B`. Empty: comparable.
pub fn differences(a: &Value, b: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let workload = |r: &Value| {
        let mut w = r.get("workload").cloned().unwrap_or(Value::Null);
        // The file's path may differ between checkouts; what it drives may not.
        if let Some(o) = w.as_object_mut() {
            o.remove("config");
        }
        w
    };
    for key in ["scenario", "seed", "agents"] {
        if a.get(key) != b.get(key) {
            out.push(format!(
                "{key}: {} vs {}",
                a.get(key).unwrap_or(&Value::Null),
                b.get(key).unwrap_or(&Value::Null)
            ));
        }
    }
    if workload(a) != workload(b) {
        out.push(format!("workload: {} vs {}", workload(a), workload(b)));
    }
    for path in [
        "tasks_sent",
        "tasks_refused",
        "outcomes.answered",
        "delegations.accepted",
        "steps",
        "lockouts",
    ] {
        let (x, y) = (figure(a, path), figure(b, path));
        if x != y {
            let show = |v: Option<f64>| v.map_or_else(|| "none".to_owned(), format_value);
            out.push(format!("{path}: {} vs {}", show(x), show(y)));
        }
    }
    out
}

/// What describes a run, for the comparison's header: scenario, seed, agents, runs.
fn describe(r: &Value) -> String {
    let runs = r
        .get("repeat")
        .and_then(|x| x.get("runs"))
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let scenario = r.get("scenario").and_then(Value::as_str).unwrap_or("?");
    let config = r
        .get("workload")
        .and_then(|w| w.get("config"))
        .and_then(Value::as_str)
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    format!(
        "scenario {scenario}{config}, seed {}, {} agents, {runs} run{}",
        r.get("seed").unwrap_or(&Value::Null),
        r.get("agents").unwrap_or(&Value::Null),
        if runs == 1 { "" } else { "s" }
    )
}

/// The comparison as a table: a header per side, then one row per figure.
///
/// # Errors
///
/// The first error of writing to `out`.
pub fn write_comparison(out: &mut dyn Write, a: &Value, b: &Value, rows: &[Row]) -> io::Result<()> {
    writeln!(out, "A: {}", describe(a))?;
    writeln!(out, "B: {}", describe(b))?;
    let differ = differences(a, b);
    if !differ.is_empty() {
        writeln!(
            out,
            "note: A and B are not the same run, timings may not be comparable: {}",
            differ.join("; ")
        )?;
    }
    if open_loop(a) || open_loop(b) {
        writeln!(
            out,
            "note: open loop: {} are fixed by the schedule, not compared",
            SCHEDULE_FIXED.join(", ")
        )?;
    }
    writeln!(
        out,
        "  {:<24} {:>14} {:>14} {:>8}  verdict",
        "figure", "A", "B", "B/A"
    )?;
    for row in rows {
        let ratio = row
            .ratio
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}"));
        writeln!(
            out,
            "  {:<24} {:>14} {:>14} {:>8}  {}",
            row.figure,
            format_value(row.a),
            format_value(row.b),
            ratio,
            row.verdict
        )?;
    }
    Ok(())
}

/// A figure for a table: whole numbers bare, others with 3 decimals.
pub(crate) fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(duration: f64, p50: f64) -> Value {
        json!({"scenario": "steady", "seed": 1, "agents": 10, "duration_s": duration,
               "event_latency": {"p50_ms": p50}})
    }

    #[test]
    fn median_and_range_of_repeated_runs() {
        let s = summarize(&[run(3.0, 1.0), run(1.0, 2.0), run(2.0, 4.0), run(10.0, 3.0)]);
        assert_eq!(s["runs"], 4);
        assert_eq!(
            s["figures"]["duration_s"],
            json!({"median": 2.5, "min": 1.0, "max": 10.0, "values": [3.0, 1.0, 2.0, 10.0]})
        );
        assert_eq!(s["figures"]["event_latency.p50_ms"]["median"], 2.5);
        // Figures the reports do not have are left out.
        assert!(s["figures"].get("halt_all.ms").is_none());
    }

    /// `summarize` as reports written before issue 34 had it: ranges, no values.
    fn ranges_only(reports: &[Value]) -> Value {
        let mut s = summarize(reports);
        if let Some(figures) = s["figures"].as_object_mut() {
            for f in figures.values_mut() {
                if let Some(f) = f.as_object_mut() {
                    f.remove("values");
                }
            }
        }
        s
    }

    #[test]
    fn bands_decide_within_or_beyond_noise_for_reports_without_values() {
        let mut a = run(2.0, 1.0);
        a["repeat"] = ranges_only(&[run(1.0, 1.0), run(2.0, 1.0), run(3.0, 1.0)]);
        // Overlapping bands: within noise, whatever the medians.
        let mut b = run(0.0, 0.0);
        b["repeat"] = ranges_only(&[run(2.5, 1.0), run(3.5, 1.0), run(4.0, 1.0)]);
        let rows = compare(&a, &b);
        let duration = rows.iter().find(|r| r.figure == "duration_s").unwrap();
        assert_eq!(duration.verdict, "within noise");
        assert_eq!((duration.a, duration.b), (2.0, 3.5));
        assert!(!duration.regression);
        // Disjoint, B worse: slower beyond noise.
        b["repeat"] = ranges_only(&[run(4.0, 1.0), run(5.0, 1.0), run(6.0, 1.0)]);
        let rows = compare(&a, &b);
        let duration = rows.iter().find(|r| r.figure == "duration_s").unwrap();
        assert_eq!(duration.verdict, "slower beyond noise");
        assert!(duration.regression);
        assert_eq!(duration.ratio, Some(2.5));
        // Disjoint, B better.
        let rows = compare(&b, &a);
        let duration = rows.iter().find(|r| r.figure == "duration_s").unwrap();
        assert_eq!(duration.verdict, "faster beyond noise");
        assert!(!duration.regression);
    }

    #[test]
    fn mann_whitney_matches_its_tables() {
        // 5 + 5 runs, complete separation: p = 2 / C(10, 5) = 2 / 252; delta 1.
        let (p, best, delta) =
            mann_whitney(&[1.0, 2.0, 3.0, 4.0, 5.0], &[6.0, 7.0, 8.0, 9.0, 10.0]);
        assert!((p - 2.0 / 252.0).abs() < 1e-12);
        assert!((best - 2.0 / 252.0).abs() < 1e-12);
        assert_eq!(delta, 1.0);
        // Identical samples: p = 1, delta 0.
        let (p, _, delta) = mann_whitney(&[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0]);
        assert_eq!((p, delta), (1.0, 0.0));
        // 3 + 3: at best 2 / 20.
        let (_, best, _) = mann_whitney(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        assert!((best - 0.1).abs() < 1e-12);
    }

    #[test]
    fn single_runs_have_no_band() {
        let rows = compare(&run(1.0, 1.0), &run(2.0, 1.0));
        assert_eq!(rows[0].verdict, "slower (no noise band)");
        assert!(!rows[0].regression);
        assert_eq!(rows[1].verdict, "same");
    }
}
