//! The SafetyMonitor's overhead: the same cascade workload with the safety checks on and off, in one
//! run. Report the ratio `safety_on / safety_off` of throughput (target ≥ 0.9).
//!
//! Workload: `support::cascade_team` with `ROOTS` roots (each delegating every task to 2 sub-agents
//! that call a flaky tool). Everything runs on one arbiter with a null journal, so the difference is
//! the checks.
//! With `CI` set the sizes are smaller.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};
use warden::UserEvent;

mod support;

const ROOTS: usize = 8;

fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

async fn run_cascade(safety: bool, tasks: usize) -> (Duration, u64) {
    let (team, roots) = support::cascade_team(ROOTS, safety);
    let start = Instant::now();
    for root in &roots {
        for t in 0..tasks {
            root.try_send_event(UserEvent::new(format!("task {t}")))
                .expect("queued");
        }
    }
    while roots.iter().any(|r| r.status().turns < tasks as u64) {
        tokio::task::yield_now().await;
    }
    let elapsed = start.elapsed();
    let steps: u64 = team.statuses().iter().map(|s| s.history_len as u64).sum();
    team.shutdown().await;
    (elapsed, steps)
}

fn cascade(c: &mut Criterion) {
    let tasks = if ci() { 5 } else { 50 };
    let sys = actix_rt::System::new();
    let mut group = c.benchmark_group("cascade");
    group.sample_size(10);
    // Messages in all histories per run (a proxy for steps), measured once per configuration.
    let (_, steps) = sys.block_on(run_cascade(true, tasks));
    group.throughput(Throughput::Elements(steps));
    for safety in [true, false] {
        let name = if safety { "safety_on" } else { "safety_off" };
        group.bench_function(BenchmarkId::new(name, tasks), |b| {
            b.iter_custom(|iters| {
                sys.block_on(async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += run_cascade(safety, tasks).await.0;
                    }
                    total
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cascade);
criterion_main!(benches);
