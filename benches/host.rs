//! Host call latency (issue 15.4): what a game server's tick thread pays for the host handle's calls.
//!
//! warden runs on its own thread ([`warden::host::Warden::start`]) with 16 NPCs on a scripted model
//! that answers at once (so the turns, and the replies, really happen meanwhile, on the other
//! core); a plain std thread (no runtime on it) calls the handle.
//!
//! * criterion: `host/try_deliver` (one TRIGGER to the next NPC in turn, a drain every 32
//!   deliveries outside the timing), `host/drain_replies_empty`, `host/deliver_batch_16`
//!   (16 events to 16 NPCs, one wake).
//! * then a percentile loop, each call timed on its own: p50 / p99 / p99.9 / max of `try_deliver`
//!   (accepted; a refusal is timed apart and followed by an untimed pause), `drain_replies` (up to 64 replies moved) and `deliver_batch` of 16 (target: host call p50 ≤
//!   1 µs, p99 ≤ 10 µs).
//!
//! The runtime is built before anything is measured. Fewer samples under `CI`.
//! `WARDEN_BENCH_MEMORY=1` runs it with long-term memory on (docs/memory.md).
//! `cargo bench --no-default-features --bench host` (the lean build is enough).
use criterion::Criterion;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use warden::{
    host::{Warden, WardenHandle},
    protocols::{
        npc::{WorldEvent, WorldEventKind},
        AgentKey,
    },
    AgentSpec, NullJournal, ScriptStep, ScriptedProvider, WardenConfig,
};

const NPCS: usize = 16;

fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

fn whisper() -> WorldEvent {
    WorldEvent::player("p1", WorldEventKind::Whisper, "what news?").in_room("tavern")
}

fn start() -> (WardenHandle, Vec<AgentKey>) {
    let keys: Vec<AgentKey> = (0..NPCS)
        .map(|i| AgentKey::new(format!("npc{i}")))
        .collect();
    let specs = keys.iter().map(|key| {
        let model = ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("Aye."));
        AgentSpec::assistant(key.as_str(), Arc::new(model))
    });
    // Hundreds of thousands of turns: no token budget (it would stop the NPCs), and the null
    // journal (a long run would otherwise keep every event in memory).
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    // A small lane: the host outpaces the NPCs, and a bounded backlog keeps their turns (and the
    // run) short; deliveries to a full lane are refused as `Busy` (counted below).
    config.mailbox.ordinary_capacity =
        std::num::NonZeroUsize::new(256).unwrap_or(std::num::NonZeroUsize::MIN);
    // `WARDEN_BENCH_MEMORY=1`: the NPCs with long-term memory (each TRIGGER also stored as an
    // observation, within the default rate caps; a recall before each model call).
    config.memory.long_term = std::env::var_os("WARDEN_BENCH_MEMORY").is_some_and(|v| v == "1");
    let warden =
        Warden::start(config, Arc::new(NullJournal::default()), specs).expect("warden starts");
    (warden, keys)
}

fn criterion_benches(c: &mut Criterion, warden: &WardenHandle, keys: &[AgentKey]) {
    let mut group = c.benchmark_group("host");
    let mut replies = Vec::with_capacity(1024);
    group.bench_function("try_deliver", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for i in 0..iters {
                let key = &keys[i as usize % keys.len()];
                let event = whisper();
                let t = Instant::now();
                let result = std::hint::black_box(warden.try_deliver(key.as_str(), event));
                spent += t.elapsed();
                if result.is_err() {
                    // A full lane: let the NPCs catch up (untimed), so that accepted deliveries
                    // are what is measured.
                    std::thread::sleep(Duration::from_millis(1));
                }
                if i % 32 == 31 {
                    warden.drain_replies(&mut replies, usize::MAX);
                    replies.clear();
                }
            }
            spent
        })
    });
    group.bench_function("drain_replies_empty", |b| {
        let mut none = Vec::new();
        b.iter(|| warden.drain_replies(&mut none, 64))
    });
    let mut batch = Vec::with_capacity(NPCS);
    let mut results = Vec::with_capacity(NPCS);
    group.bench_function("deliver_batch_16", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                batch.extend(keys.iter().map(|k| (k.clone(), whisper())));
                let t = Instant::now();
                std::hint::black_box(warden.deliver_batch(&mut batch, &mut results));
                spent += t.elapsed();
                results.clear();
                warden.drain_replies(&mut replies, usize::MAX);
                replies.clear();
            }
            spent
        })
    });
    group.finish();
}

/// p50, p99, p99.9 and max of `samples`, in microseconds.
fn report(name: &str, samples: &mut [Duration]) {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q) as usize).min(samples.len() - 1);
        samples[i].as_secs_f64() * 1e6
    };
    println!(
        "{name:<24} n={:<7} p50 {:>7.2} µs  p99 {:>7.2} µs  p99.9 {:>8.2} µs  max {:>9.2} µs",
        samples.len(),
        at(0.50),
        at(0.99),
        at(0.999),
        at(1.0)
    );
}

fn percentiles(warden: &WardenHandle, keys: &[AgentKey]) {
    let n = if ci() { 2_000 } else { 20_000 };
    let mut deliver = Vec::with_capacity(n);
    let mut busy = Vec::new();
    let mut drain = Vec::with_capacity(n / 32 + 1);
    let mut replies = Vec::with_capacity(1024);
    let mut first_refusal = None;
    let mut i = 0;
    while deliver.len() < n {
        let event = whisper();
        let t = Instant::now();
        let r = warden.try_deliver(keys[i % keys.len()].as_str(), event);
        let took = t.elapsed();
        i += 1;
        match r {
            Ok(_) => deliver.push(took),
            Err(err) => {
                busy.push(took);
                first_refusal.get_or_insert(err.to_string());
                // Let the NPCs catch up (untimed).
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if i % 32 == 31 {
            let t = Instant::now();
            warden.drain_replies(&mut replies, 64);
            drain.push(t.elapsed());
            replies.clear();
        }
    }
    let mut batches = Vec::with_capacity(n / NPCS);
    let mut batch = Vec::with_capacity(NPCS);
    let mut results = Vec::with_capacity(NPCS);
    for _ in 0..n / NPCS {
        batch.extend(keys.iter().map(|k| (k.clone(), whisper())));
        let t = Instant::now();
        warden.deliver_batch(&mut batch, &mut results);
        batches.push(t.elapsed());
        results.clear();
        warden.drain_replies(&mut replies, usize::MAX);
        replies.clear();
    }
    println!("\nhost call latency from a plain std thread ({NPCS} NPCs answering at once):");
    report("try_deliver (accepted)", &mut deliver);
    if !busy.is_empty() {
        report("try_deliver (refused)", &mut busy);
    }
    report("drain_replies (≤64)", &mut drain);
    report("deliver_batch (16)", &mut batches);
    let stats = warden.stats();
    println!(
        "refusals: {} (first: {}); {} wakes for {} deliveries in {} batches",
        busy.len(),
        first_refusal.as_deref().unwrap_or("none"),
        stats.wakes,
        stats.delivered,
        stats.batches
    );
}

fn main() {
    let (warden, keys) = start();
    let mut c = Criterion::default().configure_from_args();
    if ci() {
        c = c
            .sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_secs(1));
    }
    criterion_benches(&mut c, &warden, &keys);
    percentiles(&warden, &keys);
    c.final_summary();
    warden.shutdown();
}
