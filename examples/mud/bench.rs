//! `mud bench`: seeded TCP clients against the real port, the world thread's histograms, and the
//! report (JSON with `--json`, a table otherwise).
//!
//! Each client connects, then once a second acts with probability 0.5: 7.5 % of its commands
//! address an NPC of its room (`@npc…` or `whisper npc…`), the rest are `say`, `emote`, `look`
//! and `go`. The same seed gives the same clients, command for command, in both phases of
//! `compare` (and of `flood`, where `--flooders` more clients send `say` lines as fast as their
//! sockets take them).

use crate::{
    model::{Fault, FaultKind, Meter},
    tick::{HaltPlan, Report},
    Server,
};
use hdrhistogram::Histogram;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::{json, Value};
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Compare,
    Stall,
    Storm,
    PingPong,
    Halt,
    Malformed,
    Flood,
}

impl Scenario {
    pub fn parse(s: &str) -> Option<Scenario> {
        Some(match s {
            "compare" => Scenario::Compare,
            "stall" => Scenario::Stall,
            "storm" => Scenario::Storm,
            "pingpong" => Scenario::PingPong,
            "halt" => Scenario::Halt,
            "malformed" => Scenario::Malformed,
            "flood" => Scenario::Flood,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Scenario::Compare => "compare",
            Scenario::Stall => "stall",
            Scenario::Storm => "storm",
            Scenario::PingPong => "pingpong",
            Scenario::Halt => "halt",
            Scenario::Malformed => "malformed",
            Scenario::Flood => "flood",
        }
    }

    fn fault(self) -> FaultKind {
        match self {
            Scenario::Stall => FaultKind::Stall,
            Scenario::Storm => FaultKind::Storm,
            Scenario::PingPong => FaultKind::PingPong,
            Scenario::Malformed => FaultKind::Malformed,
            Scenario::Compare | Scenario::Halt | Scenario::Flood => FaultKind::None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Args {
    pub players: usize,
    /// Clients that flood (`flood` only): `say` lines as fast as the socket takes them.
    pub flooders: usize,
    /// Lines a second the server reads from each connection (0: no limit).
    pub line_rate: u32,
    pub npcs: usize,
    pub seconds: f64,
    pub seed: u64,
    pub scenario: Scenario,
    pub json: bool,
    /// `supervisor.passivate_after_seconds` for the NPCs (`None`: warden's default).
    pub passivate_after_s: Option<f64>,
    /// Players join and move in the first `zone_rooms` rooms only.
    pub zone_rooms: usize,
}

/// Share of commands that address an NPC.
const NPC_SHARE: f64 = 0.075;

#[derive(Debug, Default)]
struct ClientStats {
    commands: AtomicU64,
    npc_commands: AtomicU64,
    lines: AtomicU64,
    npc_lines: AtomicU64,
    connect_failures: AtomicU64,
    /// Lines the flooders wrote (in whole chunks).
    flood_lines: AtomicU64,
}

/// Runs the scenario and prints its report.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let secs = Duration::from_secs_f64(args.seconds);
    let mut out = serde_json::Map::new();
    out.insert("scenario".into(), json!(args.scenario.name()));
    out.insert(
        "params".into(),
        json!({"players": args.players, "npcs": args.npcs, "seconds": args.seconds, "seed": args.seed,
            "line_rate": args.line_rate, "zone_rooms": args.zone_rooms,
            "passivate_after_s": args.passivate_after_s,
            "flooders": if args.scenario == Scenario::Flood { args.flooders } else { 0 }}),
    );
    // First, in a process that has not allocated much yet: what an NPC costs with a full history.
    let memory = if std::env::var_os("WARDEN_MUD_SKIP_MEMORY_PHASE").is_some() {
        json!({})
    } else {
        memory_phase(args.npcs, args.passivate_after_s)?
    };
    if args.scenario == Scenario::Compare {
        let (report, clients) = phase(&args, None, HaltPlan::default(), 0)?;
        out.insert("baseline".into(), ticks_json(&report));
        out.insert("baseline_clients".into(), clients);
    }
    // `flood`: first the same players with agents on and no flooder, side by side.
    let flooders = if args.scenario == Scenario::Flood {
        let meter = Meter::new();
        let fault = Arc::new(Fault {
            kind: FaultKind::None,
            on: AtomicBool::new(false),
        });
        let model = crate::model::npc_model(args.npcs, args.seed, fault, meter.clone());
        let warden = crate::start_warden(args.npcs, model, None, args.passivate_after_s)?;
        let (report, clients) =
            phase(&args, Some((warden.clone(), meter)), HaltPlan::default(), 0)?;
        warden.shutdown();
        let mut quiet = ticks_json(&report);
        merge(&mut quiet, host_json(&report));
        out.insert("no_flood".into(), quiet);
        out.insert("no_flood_clients".into(), clients);
        args.flooders
    } else {
        0
    };
    // The fault is on from a quarter of the run to three quarters (the ping-pong all along).
    let fault = Arc::new(Fault {
        kind: args.scenario.fault(),
        on: AtomicBool::new(false),
    });
    let halt = match args.scenario {
        Scenario::Compare | Scenario::Halt => {
            let pause = (secs / 10).clamp(Duration::from_secs(1), Duration::from_secs(5));
            HaltPlan {
                halt_at: Some(secs / 2),
                resume_at: Some(secs / 2 + pause),
            }
        }
        _ => HaltPlan::default(),
    };
    let meter = Meter::new();
    let model = crate::model::npc_model(args.npcs, args.seed, fault.clone(), meter.clone());
    let rss_before = rss_bytes();
    let warden = crate::start_warden(args.npcs, model, None, args.passivate_after_s)?;
    let switch = {
        let fault = fault.clone();
        let kind = args.scenario.fault();
        std::thread::spawn(move || {
            if kind == FaultKind::PingPong {
                fault.on.store(true, Ordering::SeqCst);
                return;
            }
            if kind == FaultKind::None {
                return;
            }
            std::thread::sleep(secs / 4);
            fault.on.store(true, Ordering::SeqCst);
            std::thread::sleep(secs / 2);
            fault.on.store(false, Ordering::SeqCst);
        })
    };
    let (report, clients) = phase(&args, Some((warden.clone(), meter.clone())), halt, flooders)?;
    let _ = switch.join();
    let stats = warden.stats();
    // What the NPCs hold at the end of the run (most never addressed: passive unless
    // `--passivate-after-s 0`), and the resident memory the phase's warden added, per NPC.
    let passive = (0..args.npcs)
        .filter_map(|i| warden.agent(&crate::world::npc_key(i)))
        .filter(|a| a.passive())
        .count();
    let rss_per_npc = rss_bytes().saturating_sub(rss_before) / args.npcs.max(1) as u64;
    let mut agents = ticks_json(&report);
    let extra = json!({
        "npc_replies": report.npc_replies,
        "reply_ms": {"p50": q(&report.reply_ms, 0.5), "p99": q(&report.reply_ms, 0.99)},
        "llm_calls": meter.calls(),
        "llm_calls_dropped": meter.dropped(),
        "llm_calls_failed": meter.failed(),
        "tokens": meter.tokens(),
        "classified": {
            "trigger": report.classified[0], "context": report.classified[1],
            "capture": report.classified[2], "ignore": report.classified[3],
        },
        "delivered": report.delivered,
        "refused": {
            "busy": report.refused_busy, "halted": report.refused_halted,
            "locked_out": report.refused_locked, "other": report.refused_other,
        },
        "reply_failures": report.reply_failures,
        "reply_discarded": report.reply_discarded,
        "reply_refused": report.reply_refused,
        "npc_to_npc_triggers": report.npc_triggers,
        "handle_wakes": stats.wakes,
        "handle_batches": stats.batches,
        "npcs_passive_at_end": passive,
        "rss_growth_per_npc": rss_per_npc,
    });
    merge(&mut agents, extra);
    merge(&mut agents, host_json(&report));
    out.insert("agents".into(), agents);
    out.insert("agents_clients".into(), clients);
    let halt = report.halt.unwrap_or_default();
    let measured = report.halt.is_some();
    out.insert(
        "halt".into(),
        json!({
            "measured": measured,
            "llm_calls_started_after_halt": halt.llm_calls_started_after_halt,
            "inflight_aborted_ms_max": halt.inflight_aborted_ms_max,
            "tokens_after_halt": halt.tokens_after_halt,
            "quiet_ms": halt.quiet_ms,
            "inflight_at_halt": halt.inflight_at_halt,
            "llm_calls_completed_after_halt": halt.llm_calls_completed_after_halt,
            "halt_call_us": halt.halt_call_us,
            "stale_replies_dropped": halt.stale_dropped,
            "npc_lines_during_halt": halt.npc_lines_during_halt,
        }),
    );
    out.insert("memory".into(), memory);
    warden.shutdown();
    let out = Value::Object(out);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&out);
    }
    Ok(())
}

/// Turns each NPC goes through in the memory phase: enough to fill its history to the compaction
/// bound (each turn adds a ~100-token question and its answer).
const FILL_TURNS: usize = 48;

/// The resident memory an NPC costs: warden started with `npcs` NPCs on a model that answers at
/// once, every NPC taken through [`FILL_TURNS`] turns (its history compacted at its bound, the
/// context buffer full), the growth of the process's RSS divided by `npcs`.
fn memory_phase(
    npcs: usize,
    passivate_after_s: Option<f64>,
) -> Result<Value, Box<dyn std::error::Error>> {
    use warden::{host::NpcReply, protocols::npc::WorldEventKind, ScriptStep, ScriptedProvider};
    let before = rss_bytes();
    let model = ScriptedProvider::new([]).with_fallback(|_| {
        ScriptStep::reply(
            "Aye, I have heard of it. Ask the smith, he knows more, and mind the wolves.",
        )
    });
    let warden = crate::start_warden(npcs, Arc::new(model), None, passivate_after_s)?;
    let spawned = rss_bytes();
    let question =
        "Tell me about the road north, the wolves, the smith and the old fountain. ".repeat(5);
    let (mut batch, mut results, mut replies) = (Vec::new(), Vec::new(), Vec::<NpcReply>::new());
    let mut answered = 0;
    for turn in 0..FILL_TURNS {
        for i in 0..npcs {
            let text = format!("{turn}: {question}");
            let event =
                warden::protocols::npc::WorldEvent::player("p1", WorldEventKind::Whisper, text)
                    .in_room(crate::world::room_name(crate::world::npc_room(i)));
            batch.push((crate::world::npc_key(i).into(), event));
        }
        let delivered = warden.deliver_batch(&mut batch, &mut results);
        results.clear();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut got = 0;
        while got < delivered && std::time::Instant::now() < deadline {
            got += warden.drain_replies(&mut replies, usize::MAX);
            std::thread::sleep(Duration::from_millis(1));
        }
        answered += replies.iter().filter(|r| r.result.is_ok()).count();
        replies.clear();
    }
    let full = rss_bytes();
    let history: Vec<usize> = (0..npcs)
        .filter_map(|i| warden.agent(&crate::world::npc_key(i)))
        .map(|a| a.record().history.len())
        .collect();
    warden.shutdown();
    let per = |rss: u64| rss.saturating_sub(before) / npcs.max(1) as u64;
    Ok(json!({
        "bytes_per_npc": per(full),
        "bytes_per_npc_spawned": per(spawned),
        "turns_per_npc": FILL_TURNS,
        "answered": answered,
        "history_messages_max": history.iter().max(),
        "history_tokens_bound": crate::HISTORY_TOKENS,
        "rss_before": before, "rss_spawned": spawned, "rss_full": full,
    }))
}

/// The host calls' figures: all of them, `deliver_batch` a call and per event, `drain_replies`.
fn host_json(report: &Report) -> Value {
    json!({
        "host_call_us": us(&report.host_call_ns),
        "deliver_batch_us": us(&report.deliver_ns),
        "deliver_per_event_us": us(&report.deliver_per_event_ns),
        "deliver_cpu_per_event_us": us(&report.deliver_cpu_per_event_ns),
        "deliver_unswitched_per_event_us": us(&report.deliver_unswitched_per_event_ns),
        "deliver_batches_switched": {
            "voluntary": report.deliver_switched[0], "preempted": report.deliver_switched[1],
        },
        "drain_replies_us": us(&report.drain_ns),
    })
}

/// One phase: the server with (or without) warden, the clients (and `flooders`) for the run's
/// length.
fn phase(
    args: &Args,
    agents: Option<(warden::host::WardenHandle, Arc<Meter>)>,
    halt: HaltPlan,
    flooders: usize,
) -> Result<(Report, Value), Box<dyn std::error::Error>> {
    let server = Server::start(0, args.npcs, args.zone_rooms, agents, halt, args.line_rate)?;
    let stats = Arc::new(ClientStats::default());
    let addr = server.addr;
    let (players, seconds, seed) = (args.players, args.seconds, args.seed);
    let client_stats = stats.clone();
    // The clients on a runtime of their own, on their own thread.
    let clients = std::thread::Builder::new()
        .name("clients".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let stop = Arc::new(AtomicBool::new(false));
                let mut tasks: Vec<_> = (0..players)
                    .map(|i| {
                        let rng = SmallRng::seed_from_u64(
                            seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
                        );
                        tokio::spawn(client(addr, rng, stop.clone(), client_stats.clone()))
                    })
                    .collect();
                tasks.extend(
                    (0..flooders)
                        .map(|_| tokio::spawn(flooder(addr, stop.clone(), client_stats.clone()))),
                );
                tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                stop.store(true, Ordering::SeqCst);
                for task in tasks {
                    let _ = task.await;
                }
            });
            Ok::<(), std::io::Error>(())
        })?;
    clients
        .join()
        .map_err(|_| "the clients' thread panicked")??;
    let net = server.net.clone();
    let report = server.stop();
    let clients = json!({
        "commands": stats.commands.load(Ordering::Relaxed),
        "npc_commands": stats.npc_commands.load(Ordering::Relaxed),
        "lines_received": stats.lines.load(Ordering::Relaxed),
        "npc_lines_received": stats.npc_lines.load(Ordering::Relaxed),
        "connect_failures": stats.connect_failures.load(Ordering::Relaxed),
        "flooders": flooders,
        "flood_lines_written": stats.flood_lines.load(Ordering::Relaxed),
        "server_lines_in": net.lines_in.load(Ordering::Relaxed),
        "server_lines_throttled": net.lines_throttled.load(Ordering::Relaxed),
        "server_lines_cut": net.lines_cut.load(Ordering::Relaxed),
        "server_lines_latin1": net.lines_latin1.load(Ordering::Relaxed),
        "server_lines_dropped": net.lines_dropped.load(Ordering::Relaxed),
        "world_commands": report.commands,
        "world_lines_sent": report.lines_sent,
        "world_lines_dropped": report.lines_dropped,
    });
    Ok((report, clients))
}

/// One seeded player.
async fn client(
    addr: SocketAddr,
    mut rng: SmallRng,
    stop: Arc<AtomicBool>,
    stats: Arc<ClientStats>,
) {
    let Ok(socket) = tokio::net::TcpStream::connect(addr).await else {
        stats.connect_failures.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = socket.set_nodelay(true);
    let (read, mut write) = socket.into_split();
    let here: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
    let reader = {
        let (here, stats) = (here.clone(), stats.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                stats.lines.fetch_add(1, Ordering::Relaxed);
                if line.starts_with("npc") && line.contains(" says: ") {
                    stats.npc_lines.fetch_add(1, Ordering::Relaxed);
                }
                if let Some((_, npcs)) = line.split_once("NPCs here: ") {
                    let npcs = npcs.split(". Players here").next().unwrap_or("");
                    *here.lock() = npcs.split_whitespace().map(str::to_owned).collect();
                }
            }
        })
    };
    // A seeded phase within the second, then one chance a second.
    tokio::time::sleep(Duration::from_millis(rng.gen_range(0..1000))).await;
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        every.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if !rng.gen_bool(0.5) {
            continue;
        }
        let npc = {
            let here = here.lock();
            (!here.is_empty()).then(|| here[rng.gen_range(0..here.len())].clone())
        };
        let line = command(&mut rng, npc.as_deref());
        if line.starts_with('@') || line.starts_with("whisper") {
            stats.npc_commands.fetch_add(1, Ordering::Relaxed);
        }
        stats.commands.fetch_add(1, Ordering::Relaxed);
        if write
            .write_all(format!("{line}\n").as_bytes())
            .await
            .is_err()
        {
            break;
        }
    }
    let _ = write.write_all(b"quit\n").await;
    let _ = write.shutdown().await;
    reader.abort();
}

/// A flooding player: `say` lines as fast as its socket takes them, in chunks of 64 (whatever it
/// is sent back is read and thrown away), until `stop`. A write the server holds back (its rate
/// limit) is given up after 100 ms to look at `stop` again.
async fn flooder(addr: SocketAddr, stop: Arc<AtomicBool>, stats: Arc<ClientStats>) {
    let Ok(socket) = tokio::net::TcpStream::connect(addr).await else {
        stats.connect_failures.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = socket.set_nodelay(true);
    let (mut read, mut write) = socket.into_split();
    let reader = tokio::spawn(async move {
        let mut sink = vec![0u8; 16 * 1024];
        while tokio::io::AsyncReadExt::read(&mut read, &mut sink)
            .await
            .is_ok_and(|n| n > 0)
        {}
    });
    const LINES: u64 = 64;
    let chunk: String = (0..LINES)
        .map(|i| format!("say flood {i}: anyone seen the smith today\n"))
        .collect();
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(
            Duration::from_millis(100),
            write.write_all(chunk.as_bytes()),
        )
        .await
        {
            Ok(Ok(())) => {
                stats.flood_lines.fetch_add(LINES, Ordering::Relaxed);
            }
            Ok(Err(_)) => break,
            Err(_) => {} // held back: look at `stop` again
        }
    }
    drop(write);
    reader.abort();
}

const WORDS: [&str; 12] = [
    "hello", "anyone", "seen", "the", "smith", "today", "wolves", "north", "gold", "ale", "quiet",
    "here",
];

fn command(rng: &mut SmallRng, npc: Option<&str>) -> String {
    let words = |rng: &mut SmallRng| {
        let n = rng.gen_range(2..8);
        (0..n)
            .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let roll: f64 = rng.gen();
    match npc {
        Some(npc) if roll < NPC_SHARE / 2.0 => format!("@{npc} {}?", words(rng)),
        Some(npc) if roll < NPC_SHARE => format!("whisper {npc} {}", words(rng)),
        _ => match rng.gen_range(0..10) {
            0..=3 => format!("say {}", words(rng)),
            4 => format!("emote {}", words(rng)),
            5 | 6 => "look".into(),
            _ => format!(
                "go {}",
                ["north", "south", "east", "west"][rng.gen_range(0..4)]
            ),
        },
    }
}

fn ticks_json(report: &Report) -> Value {
    let h = &report.tick_us;
    json!({
        "ticks": report.ticks,
        "tick_samples": h.len(),
        "tick_us": {
            "p50": h.value_at_quantile(0.5), "p99": h.value_at_quantile(0.99),
            "p999": h.value_at_quantile(0.999), "max": h.max(),
        },
        "ticks_over_50ms": report.ticks_over_50ms,
        "inputs_max_per_tick": report.inputs_max_per_tick,
    })
}

fn q(h: &Histogram<u64>, quantile: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(quantile)
    }
}

/// p50, p99, p99.9, max and count of a histogram of ns, in µs.
fn us(h: &Histogram<u64>) -> Value {
    let at = |quantile| q(h, quantile) as f64 / 1e3;
    json!({
        "p50": at(0.5), "p99": at(0.99), "p999": at(0.999),
        "max": h.max() as f64 / 1e3, "calls": h.len(),
    })
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// The process's resident set, from `/proc/self/statm` (0 where there is none).
fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .unwrap_or(0);
    pages * 4096
}

fn print_table(out: &Value) {
    let g = |path: &str| -> String {
        let v = path.split('.').try_fold(out, |v, k| v.get(k));
        match v {
            Some(Value::Number(n)) if n.is_f64() => format!("{:.2}", n.as_f64().unwrap_or(0.0)),
            Some(v) => v.to_string(),
            None => "-".into(),
        }
    };
    println!("mud bench — scenario {} {}", g("scenario"), out["params"]);
    println!("{:<28} {:>12} {:>12}", "", "agents off", "agents on");
    for (label, key) in [
        ("ticks", "ticks"),
        ("tick p50 (µs)", "tick_us.p50"),
        ("tick p99 (µs)", "tick_us.p99"),
        ("tick p99.9 (µs)", "tick_us.p999"),
        ("tick max (µs)", "tick_us.max"),
        ("ticks over 50 ms", "ticks_over_50ms"),
    ] {
        println!(
            "{label:<28} {:>12} {:>12}",
            g(&format!("baseline.{key}")),
            g(&format!("agents.{key}"))
        );
    }
    for (label, key) in [
        ("host call p50 / p99 / max (µs)", "agents.host_call_us"),
        ("  delivery, per event (µs)", "agents.deliver_per_event_us"),
        (
            "  its CPU time, per event (µs)",
            "agents.deliver_cpu_per_event_us",
        ),
        (
            "  unswitched batches, per event",
            "agents.deliver_unswitched_per_event_us",
        ),
        ("  drain_replies (µs)", "agents.drain_replies_us"),
        ("reply p50 / p99 (ms)", "agents.reply_ms"),
    ] {
        let parts: Vec<String> = ["p50", "p99", "max"]
            .iter()
            .filter(|p| {
                out.pointer(&format!("/{}/{p}", key.replace('.', "/")))
                    .is_some()
            })
            .map(|p| g(&format!("{key}.{p}")))
            .collect();
        println!("{label:<34} {}", parts.join(" / "));
    }
    if out.get("no_flood").is_some() {
        for (label, key) in [
            ("no flood: tick p50 / p99 / max (µs)", "no_flood.tick_us"),
            ("no flood: host call (µs)", "no_flood.host_call_us"),
            ("no flood: per event (µs)", "no_flood.deliver_per_event_us"),
        ] {
            let parts: Vec<String> = ["p50", "p99", "max"]
                .iter()
                .map(|p| g(&format!("{key}.{p}")))
                .collect();
            println!("{label:<34} {}", parts.join(" / "));
        }
        for key in [
            "agents_clients.flood_lines_written",
            "agents_clients.server_lines_in",
            "agents_clients.server_lines_throttled",
        ] {
            println!("{key:<34} {}", g(key));
        }
    }
    for key in [
        "agents.deliver_batches_switched",
        "agents.npc_replies",
        "agents.llm_calls",
        "agents.llm_calls_dropped",
        "agents.tokens",
        "agents.classified",
        "agents.refused",
        "agents.reply_failures",
        "agents.npc_to_npc_triggers",
        "halt.llm_calls_started_after_halt",
        "halt.inflight_at_halt",
        "halt.inflight_aborted_ms_max",
        "halt.tokens_after_halt",
        "halt.quiet_ms",
        "halt.npc_lines_during_halt",
        "memory.bytes_per_npc",
        "memory.bytes_per_npc_spawned",
        "agents.npcs_passive_at_end",
        "agents.rss_growth_per_npc",
    ] {
        println!("{key:<34} {}", g(key));
    }
}
