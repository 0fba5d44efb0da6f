//! Thresholds (k6's idea): conditions on the report's figures that pass or fail a run, for CI.
//!
//! A threshold is `METRIC OP VALUE`, e.g. `event_latency.p99_ms<500`, `failed_rate<0.01`,
//! `lockouts.d2<=1`; `OP` is one of `<`, `<=`, `>`, `>=`, `==`. `METRIC` is a number of the JSON
//! report by its dotted path (`event_latency.p99_ms`, `outcomes.refused`, `halt.latency_us_p99`,
//! `delegations.refused_locked`, `steps_per_sec`, …), or one of the derived figures:
//!
//! * `failed_rate`, `refused_rate`, `unanswered_rate`, `answered_rate`: the share of the events
//!   sent (`tasks_sent`) that failed, were refused, were not answered (any fate but answered),
//!   were answered (0 when none was sent);
//! * `lockouts.dN`, `refusals.dN`: `lockouts_by_depth[N]`, `refusals_by_depth[N]` (0 past the end);
//! * `retries.CLASS`: `retries[CLASS]` (`429`, `5xx`, …).
//!
//! They come from `--threshold` (repeatable) and the team file's `[workload] thresholds` list, are
//! checked when given (an unknown metric or a malformed condition is refused before the run), are
//! evaluated on the report at the end of the run, are listed in the report (`thresholds`: each one's
//! value and verdict; the table's and the HTML page's top rows) and make the run exit 15 when one
//! fails.

use serde::{Deserialize, Serialize};

/// `warden loadtest`'s exit code when a threshold failed (and no invariant was violated and no
/// signal stopped the run).
pub const EXIT_THRESHOLD_FAILED: u8 = 15;

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
}

impl Op {
    fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            Op::Lt => value < limit,
            Op::Le => value <= limit,
            Op::Gt => value > limit,
            Op::Ge => value >= limit,
            Op::Eq => value == limit,
        }
    }
}

/// One threshold, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// As written (spaces removed).
    pub text: String,
    /// The metric (see the module docs).
    pub metric: String,
    /// The comparison.
    pub op: Op,
    /// The limit.
    pub limit: f64,
}

/// Why a threshold cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    /// Not `METRIC OP VALUE`.
    #[error(
        "`{0}` is not METRIC OP VALUE (OP: <, <=, >, >=, ==; e.g. `event_latency.p99_ms<500`)"
    )]
    Malformed(String),
    /// The value is not a finite number.
    #[error("`{text}`: `{value}` is not a number")]
    NotANumber {
        /// The threshold as written.
        text: String,
        /// The value part.
        value: String,
    },
    /// The metric is not a number of the report nor a derived figure.
    #[error(
        "`{text}`: unknown metric `{metric}` (a number of the JSON report by its dotted path, \
         e.g. event_latency.p99_ms, outcomes.failed, halt.latency_us_p99; or failed_rate, \
         refused_rate, unanswered_rate, answered_rate, lockouts.dN, refusals.dN, retries.CLASS)"
    )]
    UnknownMetric {
        /// The threshold as written.
        text: String,
        /// The metric part.
        metric: String,
    },
}

/// A threshold's verdict, in the report (`thresholds`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The threshold as written.
    pub threshold: String,
    /// The metric's value in this run (`null` when the report has no such figure, which fails).
    pub value: Option<f64>,
    /// Whether it held.
    pub pass: bool,
}

const RATES: [&str; 4] = [
    "failed_rate",
    "refused_rate",
    "unanswered_rate",
    "answered_rate",
];

impl Threshold {
    /// Parses `METRIC OP VALUE` (spaces allowed) and checks that the metric exists.
    ///
    /// # Errors
    ///
    /// [`ThresholdError`]: no operator, no metric, a value that is not a finite number, or a
    /// metric that is neither a number of the report nor a derived figure.
    ///
    /// # Examples
    ///
    /// ```
    /// use warden::loadtest::thresholds::{Op, Threshold};
    ///
    /// let t = Threshold::parse("event_latency.p99_ms < 500")?;
    /// assert_eq!((t.metric.as_str(), t.op, t.limit), ("event_latency.p99_ms", Op::Lt, 500.0));
    /// assert!(Threshold::parse("lockouts.d2<=1").is_ok());
    /// assert!(Threshold::parse("latency<5").is_err());
    /// # Ok::<(), warden::loadtest::thresholds::ThresholdError>(())
    /// ```
    pub fn parse(text: &str) -> Result<Self, ThresholdError> {
        let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let at = text
            .find(['<', '>', '='])
            .ok_or_else(|| ThresholdError::Malformed(text.clone()))?;
        let (metric, rest) = text.split_at(at);
        let (op, value) = if let Some(v) = rest.strip_prefix("<=") {
            (Op::Le, v)
        } else if let Some(v) = rest.strip_prefix(">=") {
            (Op::Ge, v)
        } else if let Some(v) = rest.strip_prefix("==") {
            (Op::Eq, v)
        } else if let Some(v) = rest.strip_prefix('<') {
            (Op::Lt, v)
        } else if let Some(v) = rest.strip_prefix('>') {
            (Op::Gt, v)
        } else {
            return Err(ThresholdError::Malformed(text));
        };
        if metric.is_empty() || value.is_empty() {
            return Err(ThresholdError::Malformed(text));
        }
        let limit = match value.parse::<f64>() {
            Ok(v) if v.is_finite() => v,
            _ => {
                return Err(ThresholdError::NotANumber {
                    value: value.to_owned(),
                    text,
                })
            }
        };
        if !known(metric) {
            return Err(ThresholdError::UnknownMetric {
                metric: metric.to_owned(),
                text,
            });
        }
        Ok(Threshold {
            metric: metric.to_owned(),
            op,
            limit,
            text,
        })
    }

    /// This threshold's verdict on `report` (the JSON report).
    pub fn evaluate(&self, report: &serde_json::Value) -> Verdict {
        let value = value_of(&self.metric, report);
        Verdict {
            threshold: self.text.clone(),
            value,
            pass: value.is_some_and(|v| self.op.holds(v, self.limit)),
        }
    }
}

/// Whether `metric` names a figure (see the module docs).
fn known(metric: &str) -> bool {
    if RATES.contains(&metric) {
        return true;
    }
    if let Some(depth) = metric
        .strip_prefix("lockouts.d")
        .or_else(|| metric.strip_prefix("refusals.d"))
    {
        return depth.parse::<usize>().is_ok();
    }
    if let Some(class) = metric.strip_prefix("retries.") {
        return warden_actors::RETRY_CLASSES.contains(&class);
    }
    // A number of a report (every contract key is in the default report's JSON).
    let Ok(empty) = serde_json::to_value(super::LoadReport::default()) else {
        return false;
    };
    path(metric, &empty).is_some_and(serde_json::Value::is_number)
}

fn path<'a>(metric: &str, report: &'a serde_json::Value) -> Option<&'a serde_json::Value> {
    metric
        .split('.')
        .try_fold(report, |v, key| v.as_object()?.get(key))
}

/// The value of `metric` in `report` (`None`: not there).
fn value_of(metric: &str, report: &serde_json::Value) -> Option<f64> {
    let number = |v: &serde_json::Value| v.as_f64();
    if RATES.contains(&metric) {
        let sent = number(&report["tasks_sent"])?;
        let o = &report["outcomes"];
        let answered = number(&o["answered"])?;
        let part = match metric {
            "failed_rate" => number(&o["failed"])?,
            "refused_rate" => number(&o["refused"])?,
            "answered_rate" => answered,
            _ => sent - answered,
        };
        return Some(if sent > 0.0 { part / sent } else { 0.0 });
    }
    for (prefix, key) in [
        ("lockouts.d", "lockouts_by_depth"),
        ("refusals.d", "refusals_by_depth"),
    ] {
        if let Some(depth) = metric.strip_prefix(prefix) {
            let depth: usize = depth.parse().ok()?;
            let list = report[key].as_array()?;
            return Some(list.get(depth).and_then(number).unwrap_or(0.0));
        }
    }
    path(metric, report).and_then(number)
}

/// Every threshold's verdict on `report`.
pub fn evaluate(thresholds: &[Threshold], report: &serde_json::Value) -> Vec<Verdict> {
    thresholds.iter().map(|t| t.evaluate(report)).collect()
}
