//! `warden loadtest --repeat N` (median and range per headline figure) and
//! `warden loadtest compare A.json B.json` (ratios, with the ranges as the noise band).
//!
//! Both work on the JSON report, so reports written by earlier runs (files) compare as well as
//! fresh ones. A report with a `repeat` object is compared by its medians, and its `[min, max]` is
//! its noise band: B is "slower beyond noise" when its band lies wholly on the worse side of A's,
//! "within noise" when the bands overlap. Without bands (a single run on either side) the verdict
//! is the ratio's direction, marked "no noise band".

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
        values.sort_by(f64::total_cmp);
        figures.insert(
            path.to_owned(),
            json!({
                "median": median(&values),
                "min": values[0],
                "max": values[values.len() - 1],
            }),
        );
    }
    json!({ "runs": reports.len(), "figures": figures })
}

/// One side of a comparison: the value (the median of a repeated run) and its band.
fn side(report: &Value, path: &str) -> Option<(f64, Option<(f64, f64)>)> {
    let repeated = report
        .get("repeat")
        .and_then(|r| r.get("figures"))
        .and_then(|f| f.get(path));
    match repeated {
        Some(f) => {
            let get = |k: &str| f.get(k).and_then(Value::as_f64);
            Some((get("median")?, Some((get("min")?, get("max")?))))
        }
        None => Some((figure(report, path)?, None)),
    }
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
}

/// Compares B to A, figure by figure (those both reports have).
pub fn compare(a: &Value, b: &Value) -> Vec<Row> {
    HEADLINES
        .iter()
        .filter_map(|&(path, better)| {
            let (va, band_a) = side(a, path)?;
            let (vb, band_b) = side(b, path)?;
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
            let (verdict, regression) = match (band_a, band_b) {
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
            })
        })
        .collect()
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
    let same = |k: &str| a.get(k) == b.get(k);
    if !(same("scenario") && same("agents") && same("seed")) {
        writeln!(out, "note: A and B differ in scenario, agents or seed")?;
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
            json!({"median": 2.5, "min": 1.0, "max": 10.0})
        );
        assert_eq!(s["figures"]["event_latency.p50_ms"]["median"], 2.5);
        // Figures the reports do not have are left out.
        assert!(s["figures"].get("halt_all.ms").is_none());
    }

    #[test]
    fn bands_decide_within_or_beyond_noise() {
        let mut a = run(2.0, 1.0);
        a["repeat"] = summarize(&[run(1.0, 1.0), run(2.0, 1.0), run(3.0, 1.0)]);
        // Overlapping bands: within noise, whatever the medians.
        let mut b = run(0.0, 0.0);
        b["repeat"] = summarize(&[run(2.5, 1.0), run(3.5, 1.0), run(4.0, 1.0)]);
        let rows = compare(&a, &b);
        let duration = rows.iter().find(|r| r.figure == "duration_s").unwrap();
        assert_eq!(duration.verdict, "within noise");
        assert_eq!((duration.a, duration.b), (2.0, 3.5));
        assert!(!duration.regression);
        // Disjoint, B worse: slower beyond noise.
        b["repeat"] = summarize(&[run(4.0, 1.0), run(5.0, 1.0), run(6.0, 1.0)]);
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
    fn single_runs_have_no_band() {
        let rows = compare(&run(1.0, 1.0), &run(2.0, 1.0));
        assert_eq!(rows[0].verdict, "slower (no noise band)");
        assert!(!rows[0].regression);
        assert_eq!(rows[1].verdict, "same");
    }
}
