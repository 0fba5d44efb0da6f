//! Soak analysis: does the resident set grow over a long run? A least-squares line through the
//! series' `rss_bytes` after a warm-up, against time and against turns.
//!
//! * **Warm-up**: the first `max(60 s, 10 % of the run)` are left out (allocator arenas, caches
//!   and the fleet's first histories fill there), and the analysis needs [`MIN_SAMPLES`] samples
//!   after it — runs shorter than about 1.5 minutes get none.
//! * **Slopes**: bytes per hour (RSS against `t_s`) and bytes per turn (RSS against the cumulative
//!   turns), both by ordinary least squares.
//! * **Growth** is flagged when the line would add more than [`GROWTH_FRACTION`] of the mean
//!   post-warm-up RSS *and* more than [`GROWTH_FLOOR_BYTES`] per hour: a leak of a few hundred
//!   bytes a turn shows within an hour of a busy fleet, while allocator noise (a few MiB up and
//!   down) does not.
//!
//! Not an invariant: a flagged growth does not change the exit code (a cache that fills for an
//! hour is growth too); it is for a person to look at, with the RSS chart of the HTML report.

use super::Sample;
use serde::{Deserialize, Serialize};

/// Samples needed after the warm-up for a slope.
pub const MIN_SAMPLES: usize = 30;
/// Growth is flagged above this fraction of the mean RSS per hour …
pub const GROWTH_FRACTION: f64 = 0.10;
/// … and above this many bytes per hour.
pub const GROWTH_FLOOR_BYTES: f64 = 8.0 * 1024.0 * 1024.0;

/// The soak figures of a run (`soak` in the JSON; absent for short runs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Soak {
    /// Seconds left out at the start.
    pub warmup_s: f64,
    /// Samples the slopes are fitted to.
    pub samples: u64,
    /// Mean RSS after the warm-up.
    pub rss_mean_bytes: u64,
    /// RSS at the first and the last sample after the warm-up.
    pub rss_first_bytes: u64,
    /// …
    pub rss_last_bytes: u64,
    /// The fitted growth per hour (negative: shrinking).
    pub rss_slope_bytes_per_hour: f64,
    /// The fitted growth per turn (0 when no turn was taken after the warm-up).
    pub rss_slope_bytes_per_turn: f64,
    /// The growth is above both thresholds (see the module docs).
    pub growth: bool,
    /// Mean of the allocator's committed memory after the warm-up, when every sample has it
    /// (added by issue 34).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_mean_bytes: Option<u64>,
    /// Its fitted growth per hour: what `growth` is judged on when present, since RSS also
    /// counts freed pages the allocator keeps (added by issue 34).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_slope_bytes_per_hour: Option<f64>,
}

/// Least-squares slope of `y` over `x` (`None`: fewer than two distinct `x`).
fn slope(x: &[f64], y: &[f64]) -> Option<f64> {
    let n = x.len() as f64;
    if x.len() < 2 {
        return None;
    }
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
    }
    (sxx > 0.0).then(|| sxy / sxx)
}

/// The soak figures of `series`, or `None` when too short (or RSS is not available).
pub fn analyse(series: &[Sample]) -> Option<Soak> {
    let end = series.last()?.t_s;
    let warmup_s = (end * 0.1).max(60.0);
    let mut turns = 0u64;
    let (mut t, mut by_turn, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    let mut committed = Vec::new();
    for s in series {
        turns += s.turns;
        if s.t_s > warmup_s && s.rss_bytes > 0 {
            t.push(s.t_s);
            by_turn.push(turns as f64);
            rss.push(s.rss_bytes as f64);
            committed.push(s.committed_bytes as f64);
        }
    }
    if rss.len() < MIN_SAMPLES {
        return None;
    }
    let per_hour = slope(&t, &rss)? * 3_600.0;
    let per_turn = slope(&by_turn, &rss).unwrap_or(0.0);
    let mean = rss.iter().sum::<f64>() / rss.len() as f64;
    // The allocator's committed memory, when every sample has it: growth is judged on it.
    let (committed_mean, committed_slope) = if committed.iter().all(|c| *c > 0.0) {
        (
            Some(committed.iter().sum::<f64>() / committed.len() as f64),
            slope(&t, &committed).map(|s| s * 3_600.0),
        )
    } else {
        (None, None)
    };
    let growth = match (committed_mean, committed_slope) {
        (Some(mean), Some(per_hour)) => {
            per_hour > GROWTH_FLOOR_BYTES && per_hour > GROWTH_FRACTION * mean
        }
        _ => per_hour > GROWTH_FLOOR_BYTES && per_hour > GROWTH_FRACTION * mean,
    };
    Some(Soak {
        warmup_s,
        samples: rss.len() as u64,
        rss_mean_bytes: mean as u64,
        rss_first_bytes: rss.first().copied().unwrap_or(0.0) as u64,
        rss_last_bytes: rss.last().copied().unwrap_or(0.0) as u64,
        rss_slope_bytes_per_hour: per_hour,
        rss_slope_bytes_per_turn: per_turn,
        growth,
        committed_mean_bytes: committed_mean.map(|m| m as u64),
        committed_slope_bytes_per_hour: committed_slope,
    })
}

/// One line for the table.
pub fn describe(soak: &Soak) -> String {
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let committed = match (
        soak.committed_slope_bytes_per_hour,
        soak.committed_mean_bytes,
    ) {
        (Some(per_hour), Some(mean)) => format!(
            "; allocator committed {:+.2} MiB/h (mean {:.1} MiB), judged on it",
            mib(per_hour),
            mib(mean as f64)
        ),
        _ => String::new(),
    };
    format!(
        "RSS {:+.2} MiB/h, {:+.1} bytes/turn after {:.0} s warm-up ({} samples, mean {:.1} MiB){committed}: {}",
        mib(soak.rss_slope_bytes_per_hour),
        soak.rss_slope_bytes_per_turn,
        soak.warmup_s,
        soak.samples,
        mib(soak.rss_mean_bytes as f64),
        if soak.growth { "GROWTH" } else { "flat" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(seconds: u64, rss: impl Fn(u64) -> u64) -> Vec<Sample> {
        (1..=seconds)
            .map(|t| Sample {
                t_s: t as f64,
                turns: 10,
                rss_bytes: rss(t),
                ..Sample::default()
            })
            .collect()
    }

    #[test]
    fn a_steady_leak_is_flagged_and_noise_is_not() {
        const MIB: u64 = 1024 * 1024;
        // 100 MiB, +1 KiB a second after a warm-up jump: 3.5 MiB/h — under the 8 MiB floor.
        let slow = analyse(&series(600, |t| 100 * MIB + t * 1024)).unwrap();
        assert!(!slow.growth, "{slow:?}");
        assert!((slow.rss_slope_bytes_per_hour - 3_686_400.0).abs() < 1.0);
        assert!((slow.rss_slope_bytes_per_turn - 102.4).abs() < 1e-6);
        // +64 KiB a second: 225 MiB/h on 100 MiB — a leak.
        let leak = analyse(&series(600, |t| 100 * MIB + t * 64 * 1024)).unwrap();
        assert!(leak.growth, "{leak:?}");
        // Flat with ±4 MiB noise, and the warm-up's growth left out.
        let noisy = analyse(&series(3_600, |t| {
            if t < 300 {
                t * MIB / 10
            } else {
                100 * MIB + (t * 7919 % 8) * MIB / 2
            }
        }))
        .unwrap();
        assert!(!noisy.growth, "{noisy:?}");
        assert_eq!(noisy.warmup_s, 360.0);
    }

    #[test]
    fn a_short_run_has_no_soak_figures() {
        assert_eq!(analyse(&series(80, |_| 1)), None);
        assert_eq!(analyse(&[]), None);
        assert!(analyse(&series(90, |_| 1)).is_some());
    }
}
