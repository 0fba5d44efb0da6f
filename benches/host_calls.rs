//! Host-facing calls while the disk is busy (issue 10.7): a game server calls `try_send_event` and
//! `status` from its own tick thread and must never wait on the journal's I/O. Agents on a
//! SQLite journal (a real file) trip lockouts and are unlocked in a loop — each lockout and unlock
//! is a batch the writer commits with an fsync — while a plain std thread times
//! `try_send_event` + `status` on those agents and on a quiet one, in turn (a round of lockouts
//! every 25 ms). Prints p50 / p99 / max of that pair (target: p99 ≤ 50 µs) and how many lockouts
//! happened meanwhile; `HOST_CALLS_JOURNAL=memory` runs the same load on the in-memory journal: the
//! baseline (what scheduling alone costs the probe on this machine). Fewer samples under `CI`.
//!
//! `cargo bench --bench host_calls`, `HOST_CALLS_JOURNAL=memory cargo bench --bench host_calls`
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use warden::{
    AgentSpec, Journal, MemoryJournal, ScriptStep, ScriptedProvider, SqliteJournal, Supervisor,
    UserEvent, WardenConfig,
};

fn main() {
    let samples: usize = if std::env::var_os("CI").is_some() {
        2_000
    } else {
        20_000
    };
    let dir = std::env::temp_dir().join(format!("warden-host-calls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sqlite = Arc::new(SqliteJournal::open(dir.join("warden.db")).expect("journal"));
    // `HOST_CALLS_JOURNAL=memory`: the same load on the in-memory journal (the baseline: what the
    // machine's scheduling alone costs the probe).
    let memory = std::env::var("HOST_CALLS_JOURNAL").is_ok_and(|j| j == "memory");
    let journal: Arc<dyn Journal> = if memory {
        Arc::new(MemoryJournal::new())
    } else {
        sqlite.clone()
    };
    let sys = actix_rt::System::new();
    let (lockouts, times) = sys.block_on(async {
        let team = Supervisor::new(WardenConfig::default(), journal.clone());
        let failing =
            Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("model down")));
        let tripping: Vec<_> = (0..4)
            .map(|i| {
                team.spawn(AgentSpec::assistant(format!("trip{i}"), failing.clone()))
                    .expect("spawn")
            })
            .collect();
        let quiet = Arc::new(
            ScriptedProvider::new([])
                .with_fallback(|_| ScriptStep::reply("ok").delayed(Duration::from_secs(3600))),
        );
        let host = team
            .spawn(AgentSpec::assistant("host", quiet))
            .expect("spawn");
        team.started().await;
        let done = Arc::new(AtomicBool::new(false));
        // The host's tick thread: the agents that trip (whose lockouts are being written) and a
        // quiet one, in turn.
        let probe = {
            let done = done.clone();
            let mut targets = tripping.clone();
            targets.push(host);
            std::thread::spawn(move || {
                let mut times = Vec::with_capacity(samples);
                for i in 0..samples {
                    let agent = &targets[i % targets.len()];
                    let before = switches();
                    let start = Instant::now();
                    let _ = agent.try_send_event(UserEvent::new(format!("tick {i}")));
                    std::hint::black_box(agent.status());
                    let elapsed = start.elapsed();
                    let after = switches();
                    times.push(Sample {
                        elapsed,
                        preempted: after.0 > before.0,
                        blocked: after.1 > before.1,
                    });
                    std::thread::sleep(Duration::from_micros(200));
                }
                done.store(true, Ordering::SeqCst);
                times
            })
        };
        // Lock out and unlock, over and over, until the probe is done.
        let mut lockouts = 0u64;
        while !done.load(Ordering::SeqCst) {
            for agent in &tripping {
                for n in 0..5 {
                    let _ = agent.try_send_event(UserEvent::new(format!("fail {n}")));
                }
            }
            actix_rt::time::sleep(Duration::from_millis(25)).await;
            for agent in &tripping {
                if agent.unlock("bench").await.is_ok() {
                    lockouts += 1;
                }
            }
        }
        let times = probe.join().expect("probe thread");
        team.shutdown().await;
        (lockouts, times)
    });
    // Why slow samples were slow: the kernel took the core away (an involuntary context switch:
    // other threads wanted the CPU) or the call itself slept (a voluntary one: a lock or I/O).
    let slow: Vec<&Sample> = times
        .iter()
        .filter(|s| s.elapsed > Duration::from_micros(50))
        .collect();
    let preempted = slow.iter().filter(|s| s.preempted).count();
    let blocked = slow.iter().filter(|s| s.blocked).count();
    let mut micros: Vec<f64> = times
        .iter()
        .map(|s| s.elapsed.as_secs_f64() * 1e6)
        .collect();
    micros.sort_by(|a, b| a.total_cmp(b));
    let at =
        |p: f64| micros[((p * micros.len() as f64).ceil() as usize).clamp(1, micros.len()) - 1];
    println!(
        "host_calls ({} journal): try_send_event + status from a std thread, {} samples, {lockouts} lockouts meanwhile: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        if memory { "memory" } else { "sqlite" },
        micros.len(),
        at(0.50),
        at(0.99),
        micros.last().copied().unwrap_or(0.0)
    );
    println!(
        "  {} samples over 50 µs: {preempted} preempted (involuntary switch), {blocked} slept (voluntary switch: a lock or I/O)",
        slow.len()
    );
    drop(journal);
    drop(sqlite);
    let _ = std::fs::remove_dir_all(&dir);
}

struct Sample {
    elapsed: Duration,
    preempted: bool,
    blocked: bool,
}

/// This thread's (involuntary, voluntary) context switches so far (`getrusage(RUSAGE_THREAD)`).
fn switches() -> (i64, i64) {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return (0, 0);
    }
    (usage.ru_nivcsw, usage.ru_nvcsw)
}
