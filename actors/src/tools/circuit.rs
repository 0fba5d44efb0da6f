//! Per-tool circuit breakers: [`ToolCircuits`], keyed by tool name.
//!
//! ```text
//!            failure_threshold consecutive failures
//!   CLOSED ─────────────────────────────────────────▶ OPEN ◀──────────┐
//!     ▲                                                │ cool_down     │ probe fails
//!     │ probe succeeds                                 ▼ elapsed       │ (fresh cool_down)
//!     └──────────────────────────────────────────── HALF-OPEN ─────────┘
//! ```
//!
//! Invariants:
//! * A call may run only with a [`CircuitPermit`] from [`ToolCircuits::try_acquire`]. While the circuit
//!   is open every acquisition is refused with a [`CircuitRejection`] whose text is meant for the model.
//! * In half-open exactly one permit — the *probe* — is handed out (acquisition is serialised by a
//!   mutex, so this holds under any concurrency); every other attempt is refused until the probe's
//!   outcome is recorded. Probe success closes the circuit; probe failure reopens it with a fresh
//!   cool-down.
//! * A permit that is dropped without an outcome (the call was cancelled by a halt, its arguments were
//!   invalid, the result came from the cache) counts as nothing: a dropped probe frees the half-open
//!   slot so the next call probes instead.
//! * Outcomes of permits issued before the circuit last changed state are ignored (a slow call that
//!   started while closed cannot close or re-trip a circuit that has since opened).
//! * Time is `tokio::time::Instant`, so tests run with paused time.

use parking_lot::Mutex;
use std::{collections::HashMap, time::Duration};
use tokio::time::Instant;

/// When a tool's circuit opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitConfig {
    /// Consecutive failures that open a closed circuit (at least 1; default 5).
    pub failure_threshold: u32,
    /// How long an open circuit refuses calls before allowing one probe (default 30 s).
    pub cool_down: Duration,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        CircuitConfig {
            failure_threshold: 5,
            cool_down: Duration::from_secs(30),
        }
    }
}

/// A snapshot of one tool's circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Calls go through.
    Closed {
        /// Failures in a row so far (below the threshold).
        consecutive_failures: u32,
    },
    /// Calls are refused until the cool-down ends.
    Open {
        /// Failures in a row that opened (or reopened) it.
        failures: u32,
        /// Time left of the cool-down.
        retry_in: Duration,
    },
    /// The cool-down is over: one probe call may go through; its outcome closes or reopens it.
    HalfOpen {
        /// Whether the probe is running (other calls are refused meanwhile).
        probe_in_flight: bool,
    },
}

/// A state change caused by recording an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitTransition {
    /// Closed → open after `failures` consecutive failures.
    Opened {
        /// Failures in a row.
        failures: u32,
    },
    /// Half-open → open: the probe failed (`failures` consecutive failures so far).
    Reopened {
        /// Failures in a row, the probe's included.
        failures: u32,
    },
    /// Half-open → closed: the probe succeeded.
    Closed,
}

fn failures_text(n: u32) -> String {
    if n == 1 {
        "1 failure".to_owned()
    } else {
        format!("{n} failures")
    }
}

/// Why a call was refused without running. The model sees the message as the tool's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CircuitRejection {
    /// The circuit is open: the cool-down is still running.
    #[error(
        "tool `{tool}` is unavailable: circuit open after {}, retry in {retry_in_secs} s",
        failures_text(*failures)
    )]
    Open {
        /// The tool's name.
        tool: String,
        /// Failures in a row that opened it.
        failures: u32,
        /// Remaining cool-down, rounded up to whole seconds (at least 1).
        retry_in_secs: u64,
    },
    /// The circuit is half-open and its one probe call is running.
    #[error("tool `{tool}` is unavailable: circuit half-open, a probe call is already running")]
    ProbeInFlight {
        /// The tool's name.
        tool: String,
    },
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { probing: bool },
}

#[derive(Debug)]
struct Circuit {
    state: State,
    failures: u32,
    /// Bumped on every state change; permits from an older generation are ignored.
    generation: u64,
}

impl Circuit {
    fn new() -> Self {
        Circuit {
            state: State::Closed,
            failures: 0,
            generation: 0,
        }
    }

    fn set(&mut self, state: State) {
        self.state = state;
        self.generation += 1;
    }
}

/// The circuits of one agent's tools. All methods take `&self`.
#[derive(Debug, Default)]
pub struct ToolCircuits {
    config: CircuitConfig,
    circuits: Mutex<HashMap<String, Circuit>>,
}

impl ToolCircuits {
    /// No circuit yet (each tool's is made closed on its first call); a `failure_threshold` of 0
    /// is taken as 1.
    pub fn new(config: CircuitConfig) -> Self {
        ToolCircuits {
            config: CircuitConfig {
                failure_threshold: config.failure_threshold.max(1),
                ..config
            },
            circuits: Mutex::new(HashMap::new()),
        }
    }

    /// The configuration in force (threshold at least 1).
    pub fn config(&self) -> CircuitConfig {
        self.config
    }

    /// Asks to call `tool`. `Ok` carries the permit (a probe in half-open); `Err` the refusal.
    /// A permit dropped without [`CircuitPermit::succeeded`] or [`CircuitPermit::failed`] records
    /// nothing (a half-open probe frees its slot).
    ///
    /// # Errors
    /// [`CircuitRejection::Open`] while the cool-down runs; [`CircuitRejection::ProbeInFlight`]
    /// while half-open with its probe running.
    pub fn try_acquire(&self, tool: &str) -> Result<CircuitPermit<'_>, CircuitRejection> {
        let now = Instant::now();
        let mut circuits = self.circuits.lock();
        let circuit = circuits.entry(tool.to_owned()).or_insert_with(Circuit::new);
        let probe = match circuit.state {
            State::Closed => false,
            State::Open { until } if now < until => {
                let left = until - now;
                let retry_in_secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                return Err(CircuitRejection::Open {
                    tool: tool.to_owned(),
                    failures: circuit.failures,
                    retry_in_secs,
                });
            }
            State::Open { .. } | State::HalfOpen { probing: false } => {
                circuit.set(State::HalfOpen { probing: true });
                true
            }
            State::HalfOpen { probing: true } => {
                return Err(CircuitRejection::ProbeInFlight {
                    tool: tool.to_owned(),
                })
            }
        };
        Ok(CircuitPermit {
            circuits: self,
            tool: tool.to_owned(),
            probe,
            generation: circuit.generation,
            settled: false,
        })
    }

    /// The current state of `tool`'s circuit (closed if it was never used).
    pub fn state(&self, tool: &str) -> CircuitState {
        let now = Instant::now();
        let circuits = self.circuits.lock();
        let Some(circuit) = circuits.get(tool) else {
            return CircuitState::Closed {
                consecutive_failures: 0,
            };
        };
        match circuit.state {
            State::Closed => CircuitState::Closed {
                consecutive_failures: circuit.failures,
            },
            State::Open { until } if now < until => CircuitState::Open {
                failures: circuit.failures,
                retry_in: until - now,
            },
            State::Open { .. } => CircuitState::HalfOpen {
                probe_in_flight: false,
            },
            State::HalfOpen { probing } => CircuitState::HalfOpen {
                probe_in_flight: probing,
            },
        }
    }

    /// Closes `tool`'s circuit and forgets its failures (an operator's manual reset).
    pub fn reset(&self, tool: &str) {
        if let Some(circuit) = self.circuits.lock().get_mut(tool) {
            circuit.failures = 0;
            circuit.set(State::Closed);
        }
    }

    fn settle(&self, permit: &CircuitPermit<'_>, success: bool) -> Option<CircuitTransition> {
        let now = Instant::now();
        let mut circuits = self.circuits.lock();
        let circuit = circuits.get_mut(&permit.tool)?;
        if circuit.generation != permit.generation {
            return None;
        }
        match (circuit.state, permit.probe, success) {
            (State::Closed, false, true) => {
                circuit.failures = 0;
                None
            }
            (State::Closed, false, false) => {
                circuit.failures = circuit.failures.saturating_add(1);
                (circuit.failures >= self.config.failure_threshold).then(|| {
                    circuit.set(State::Open {
                        until: now + self.config.cool_down,
                    });
                    CircuitTransition::Opened {
                        failures: circuit.failures,
                    }
                })
            }
            (State::HalfOpen { probing: true }, true, true) => {
                circuit.failures = 0;
                circuit.set(State::Closed);
                Some(CircuitTransition::Closed)
            }
            (State::HalfOpen { probing: true }, true, false) => {
                circuit.failures = circuit.failures.saturating_add(1);
                circuit.set(State::Open {
                    until: now + self.config.cool_down,
                });
                Some(CircuitTransition::Reopened {
                    failures: circuit.failures,
                })
            }
            _ => None,
        }
    }

    fn abandon(&self, permit: &CircuitPermit<'_>) {
        if !permit.probe {
            return;
        }
        let mut circuits = self.circuits.lock();
        if let Some(circuit) = circuits.get_mut(&permit.tool) {
            if circuit.generation == permit.generation
                && matches!(circuit.state, State::HalfOpen { probing: true })
            {
                circuit.set(State::HalfOpen { probing: false });
            }
        }
    }
}

/// Leave to make one call. Record its outcome with [`CircuitPermit::succeeded`] or
/// [`CircuitPermit::failed`]; dropping it records nothing (and frees the probe slot).
#[derive(Debug)]
#[must_use = "record the call's outcome, or drop the permit to record nothing"]
pub struct CircuitPermit<'a> {
    circuits: &'a ToolCircuits,
    tool: String,
    probe: bool,
    generation: u64,
    settled: bool,
}

impl CircuitPermit<'_> {
    /// Whether this is the single half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The tool this permit is for.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The call succeeded.
    pub fn succeeded(mut self) -> Option<CircuitTransition> {
        self.settled = true;
        self.circuits.settle(&self, true)
    }

    /// The call failed.
    pub fn failed(mut self) -> Option<CircuitTransition> {
        self.settled = true;
        self.circuits.settle(&self, false)
    }
}

impl Drop for CircuitPermit<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.circuits.abandon(self);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Barrier,
    };

    fn fail(c: &ToolCircuits, tool: &str) -> Option<CircuitTransition> {
        c.try_acquire(tool).expect("admitted").failed()
    }

    fn circuits() -> ToolCircuits {
        ToolCircuits::new(CircuitConfig::default())
    }

    #[tokio::test]
    async fn opens_after_threshold_consecutive_failures() {
        tokio::time::pause();
        let c = circuits();
        for _ in 0..4 {
            assert_eq!(fail(&c, "x"), None);
        }
        assert_eq!(
            c.state("x"),
            CircuitState::Closed {
                consecutive_failures: 4
            }
        );
        assert_eq!(
            fail(&c, "x"),
            Some(CircuitTransition::Opened { failures: 5 })
        );
        tokio::time::advance(Duration::from_millis(18_500)).await;
        let refusal = c.try_acquire("x").expect_err("open");
        assert_eq!(
            refusal.to_string(),
            "tool `x` is unavailable: circuit open after 5 failures, retry in 12 s"
        );
        // Other tools are unaffected.
        assert!(c.try_acquire("y").is_ok());
    }

    #[tokio::test]
    async fn success_resets_the_failure_count() {
        let c = circuits();
        for _ in 0..4 {
            fail(&c, "x");
        }
        assert_eq!(c.try_acquire("x").expect("closed").succeeded(), None);
        for _ in 0..4 {
            assert_eq!(fail(&c, "x"), None);
        }
        assert!(matches!(c.state("x"), CircuitState::Closed { .. }));
    }

    #[tokio::test]
    async fn half_open_after_cool_down_and_probe_success_closes() {
        tokio::time::pause();
        let c = circuits();
        for _ in 0..5 {
            fail(&c, "x");
        }
        tokio::time::advance(Duration::from_millis(29_999)).await;
        assert!(c.try_acquire("x").is_err());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            c.state("x"),
            CircuitState::HalfOpen {
                probe_in_flight: false
            }
        );
        let probe = c.try_acquire("x").expect("probe");
        assert!(probe.is_probe());
        let refusal = c.try_acquire("x").expect_err("one probe only");
        assert_eq!(
            refusal.to_string(),
            "tool `x` is unavailable: circuit half-open, a probe call is already running"
        );
        assert_eq!(probe.succeeded(), Some(CircuitTransition::Closed));
        assert_eq!(
            c.state("x"),
            CircuitState::Closed {
                consecutive_failures: 0
            }
        );
        let next = c.try_acquire("x").expect("closed");
        assert!(!next.is_probe());
    }

    #[tokio::test]
    async fn probe_failure_reopens_with_fresh_cool_down() {
        tokio::time::pause();
        let c = circuits();
        for _ in 0..5 {
            fail(&c, "x");
        }
        tokio::time::advance(Duration::from_secs(45)).await;
        let probe = c.try_acquire("x").expect("probe");
        assert_eq!(
            probe.failed(),
            Some(CircuitTransition::Reopened { failures: 6 })
        );
        assert_eq!(
            c.try_acquire("x").expect_err("open").to_string(),
            "tool `x` is unavailable: circuit open after 6 failures, retry in 30 s"
        );
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(c.try_acquire("x").is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(c.try_acquire("x").expect("probe again").is_probe());
    }

    #[tokio::test]
    async fn dropped_probe_frees_the_slot() {
        tokio::time::pause();
        let c = circuits();
        for _ in 0..5 {
            fail(&c, "x");
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        drop(c.try_acquire("x").expect("probe"));
        assert_eq!(
            c.state("x"),
            CircuitState::HalfOpen {
                probe_in_flight: false
            }
        );
        assert!(c.try_acquire("x").expect("new probe").is_probe());
    }

    #[tokio::test]
    async fn concurrent_probe_attempts_admit_exactly_one() {
        tokio::time::pause();
        let c = Arc::new(circuits());
        for _ in 0..5 {
            fail(&c, "x");
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        let probes = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (c, probes, refused) = (c.clone(), probes.clone(), refused.clone());
            tasks.push(tokio::spawn(async move {
                match c.try_acquire("x") {
                    Ok(permit) => {
                        assert!(permit.is_probe());
                        probes.fetch_add(1, Ordering::SeqCst);
                        // Hold the probe while the others try.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        let _ = permit.succeeded();
                    }
                    Err(CircuitRejection::ProbeInFlight { .. }) => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => panic!("unexpected {other}"),
                }
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(probes.load(Ordering::SeqCst), 1);
        assert_eq!(refused.load(Ordering::SeqCst), 7);
        assert!(matches!(c.state("x"), CircuitState::Closed { .. }));
    }

    #[test]
    fn probe_is_exclusive_across_threads() {
        let c = Arc::new(ToolCircuits::new(CircuitConfig {
            failure_threshold: 1,
            cool_down: Duration::ZERO,
        }));
        fail(&c, "x");
        let barrier = Arc::new(Barrier::new(8));
        let probes = Arc::new(AtomicUsize::new(0));
        let holders: Vec<_> = (0..8)
            .map(|_| {
                let (c, barrier, probes) = (c.clone(), barrier.clone(), probes.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    if let Ok(permit) = c.try_acquire("x") {
                        probes.fetch_add(1, Ordering::SeqCst);
                        // Keep the probe until every thread has tried.
                        barrier.wait();
                        assert!(permit.is_probe());
                        drop(permit);
                    } else {
                        barrier.wait();
                    }
                })
            })
            .collect();
        for h in holders {
            h.join().expect("thread");
        }
        assert_eq!(probes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn stale_outcomes_are_ignored() {
        tokio::time::pause();
        let c = ToolCircuits::new(CircuitConfig {
            failure_threshold: 1,
            cool_down: Duration::from_secs(30),
        });
        let slow = c.try_acquire("x").expect("closed");
        assert_eq!(
            fail(&c, "x"),
            Some(CircuitTransition::Opened { failures: 1 })
        );
        // The slow call that started while closed succeeds late: the circuit stays open.
        assert_eq!(slow.succeeded(), None);
        assert!(matches!(c.state("x"), CircuitState::Open { .. }));
    }

    #[tokio::test]
    async fn reset_closes_and_singular_message() {
        tokio::time::pause();
        let c = ToolCircuits::new(CircuitConfig {
            failure_threshold: 1,
            cool_down: Duration::from_millis(500),
        });
        fail(&c, "x");
        assert_eq!(
            c.try_acquire("x").expect_err("open").to_string(),
            "tool `x` is unavailable: circuit open after 1 failure, retry in 1 s"
        );
        c.reset("x");
        assert_eq!(
            c.state("x"),
            CircuitState::Closed {
                consecutive_failures: 0
            }
        );
        assert!(!c.try_acquire("x").expect("closed").is_probe());
    }
}
