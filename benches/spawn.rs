//! Spawn time per agent, and `halt_all` time for a fleet of idle agents (10k and 100k; 1k and 10k
//! with `CI` set). Every agent on the current arbiter, one shared scripted model, a null journal — the
//! figures are the supervisor's and the agents' own cost (spawn time runs until every actor has started). Targets (issue 5): spawn ≤ 2 µs per agent,
//! halt-all of 100k agents ≤ 200 ms.
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use warden::{AgentSpec, NullJournal, ScriptStep, ScriptedProvider, Supervisor, WardenConfig};

/// The allocator the `warden` binary uses (see `src/main.rs`), so the figures match `warden loadtest`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

fn team() -> Supervisor {
    Supervisor::builder(WardenConfig::default(), Arc::new(NullJournal::default()))
        .current_arbiter()
        .build()
}

fn model() -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")))
}

/// Spawns `n` assistants and waits until every actor has started; returns the time that took.
async fn spawn_fleet(team: &Supervisor, model: &Arc<ScriptedProvider>, n: usize) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        team.spawn(AgentSpec::assistant(format!("a{i}"), model.clone()))
            .expect("spawn");
    }
    team.started().await;
    start.elapsed()
}

fn spawn(c: &mut Criterion) {
    let n = if ci() { 1_000 } else { 10_000 };
    let sys = actix_rt::System::new();
    let model = model();
    let mut group = c.benchmark_group("spawn");
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function(BenchmarkId::new("agents", n), |b| {
        b.iter_custom(|iters| {
            sys.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let team = team();
                    total += spawn_fleet(&team, &model, n).await;
                    team.shutdown().await;
                }
                total
            })
        })
    });
    group.finish();
}

fn halt_all(c: &mut Criterion) {
    let sizes: &[usize] = if ci() {
        &[1_000, 10_000]
    } else {
        &[10_000, 100_000]
    };
    let sys = actix_rt::System::new();
    let model = model();
    let mut group = c.benchmark_group("halt_all");
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.warm_up_time(Duration::from_millis(500));
    for &n in sizes {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new("agents", n), |b| {
            b.iter_custom(|iters| {
                sys.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let team = team();
                        spawn_fleet(&team, &model, n).await;
                        let start = Instant::now();
                        let acks = team.halt_all().await;
                        total += start.elapsed();
                        assert_eq!(acks.len(), n);
                        team.shutdown().await;
                    }
                    total
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, spawn, halt_all);
criterion_main!(benches);
