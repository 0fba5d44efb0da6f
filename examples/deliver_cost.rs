//! What one world event's delivery costs the host's thread, with long-term memory off or on
//! (docs/memory.md, "Cost"): a fixed, deterministic stream of events and nothing else, for
//! callgrind's instruction counts (the shared machine's wall clock is too noisy for a 1 µs delta).
//!
//! `--npcs` NPCs in one room (scripted: "Aye." at once); `--frames` frames, each one
//! `deliver_batch` of one event per NPC — a player's `say` to the room (CONTEXT), every
//! `--whisper-every`th frame a whisper instead (TRIGGER: a turn) — then a `drain_replies`. The
//! speakers rotate over `--players` players, as in the MUD. `WARDEN_BENCH_MEMORY=1`: every NPC
//! with `memory.long_term` (each CONTEXT and TRIGGER an observation, within the rate caps).
//!
//! ```text
//! cargo build --release --example deliver_cost
//! valgrind --tool=callgrind --toggle-collect='*WardenHandle*deliver_batch*' \
//!     target/release/examples/deliver_cost --frames 500
//! WARDEN_BENCH_MEMORY=1 valgrind … (the same)
//! callgrind_annotate --inclusive=yes callgrind.out.PID
//! ```
//!
//! Also prints the wall-clock p50 / p99 of `deliver_batch` per event (without valgrind).
use std::{sync::Arc, time::Instant};
use warden::{
    host::Warden,
    protocols::{
        npc::{WorldEvent, WorldEventKind},
        AgentKey,
    },
    AgentSpec, NullJournal, ScriptStep, ScriptedProvider, WardenConfig,
};

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let npcs = arg(&args, "--npcs", 16);
    let frames = arg(&args, "--frames", 500);
    let players = arg(&args, "--players", 50);
    let whisper_every = arg(&args, "--whisper-every", 8).max(1);
    let memory = std::env::var_os("WARDEN_BENCH_MEMORY").is_some_and(|v| v == "1");

    let keys: Vec<AgentKey> = (0..npcs)
        .map(|i| AgentKey::new(format!("npc{i}")))
        .collect();
    let specs = keys.iter().map(|key| {
        let model = ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("Aye."));
        AgentSpec::assistant(key.as_str(), Arc::new(model))
    });
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.memory.long_term = memory;
    let warden = Warden::start(config, Arc::new(NullJournal::default()), specs)?;

    let mut batch: Vec<(AgentKey, WorldEvent)> = Vec::with_capacity(npcs);
    let mut results = Vec::with_capacity(npcs);
    let mut replies = Vec::with_capacity(1024);
    let mut per_event_ns: Vec<u64> = Vec::with_capacity(frames);
    let (mut delivered, mut refused) = (0usize, 0usize);
    let mut speaker = 0usize;
    for frame in 0..frames {
        for key in &keys {
            let player = format!("p{}", speaker % players.max(1));
            speaker += 1;
            let event = if frame % whisper_every == whisper_every - 1 {
                WorldEvent::player(&player, WorldEventKind::Whisper, "what news of the road?")
            } else {
                let mut e = WorldEvent::player(
                    &player,
                    WorldEventKind::Say,
                    format!("the caravan from the north is late again, day {frame}"),
                );
                e.mentions = Some(Vec::new());
                e
            };
            batch.push((key.clone(), event.in_room("tavern")));
        }
        let n = batch.len();
        let t = Instant::now();
        warden.deliver_batch(&mut batch, &mut results);
        let took = t.elapsed();
        per_event_ns.push(took.as_nanos() as u64 / n.max(1) as u64);
        for r in results.drain(..) {
            match r {
                Ok(_) => delivered += 1,
                Err(_) => refused += 1,
            }
        }
        warden.drain_replies(&mut replies, usize::MAX);
        replies.clear();
        // Let the NPCs' turns run (untimed), so the mailboxes do not fill up.
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    per_event_ns.sort_unstable();
    let at = |q: f64| {
        let i = ((per_event_ns.len() as f64 - 1.0) * q).round() as usize;
        per_event_ns.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    println!(
        "memory {}: {delivered} delivered, {refused} refused; deliver_batch per event p50 {:.2} µs, p99 {:.2} µs",
        if memory { "on" } else { "off" },
        at(0.5),
        at(0.99)
    );
    warden.shutdown();
    Ok(())
}
