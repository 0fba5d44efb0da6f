//! A real MUD on warden: a tokio TCP server with a line protocol, 50 rooms, 100 NPCs on the
//! scripted model (seeded latency: median 0.8 s, p99 5 s), and a 20 Hz world tick on a thread of
//! its own that talks to warden only through the host handle.
//!
//! ```text
//! cargo run --release --example mud                       # serve on 127.0.0.1:4000; nc 127.0.0.1 4000
//! cargo run --release --example mud -- serve --port 4000 --npcs 100 --admin-port 8080 [--line-rate 10]
//! cargo run --release --example mud -- bench --players 200 --npcs 100 --seconds 30 --seed 7 \
//!     [--scenario compare|stall|storm|pingpong|halt|malformed|flood] [--flooders N] \
//!     [--line-rate 10] [--passivate-after-s 120] [--zone-rooms 50] [--json]
//! ```
//!
//! `--line-rate`: lines a second each connection is read at (a burst of twice that; 0: no
//! limit), see `net.rs`. `--passivate-after-s`: `supervisor.passivate_after_seconds` for the
//! NPCs (default: warden's, 120; 0: an actor each for the whole run — docs/performance.md
//! compares the two with 1,000 mostly idle NPCs). `--zone-rooms K`: the bench's players join and
//! move in the first K rooms only (a town among the wilds), so the NPCs elsewhere stay idle.
//!
//! Measuring aids (environment): `WARDEN_MUD_MEMORY=1` (every NPC with long-term memory),
//! `WARDEN_MUD_PIN=1` (the world thread alone on CPU 0, the rest of the process on CPU 1),
//! `WARDEN_MUD_BATCH_LOG=FILE` (a line per `deliver_batch`: events, TRIGGER/CONTEXT events, wall
//! ns, the world thread's CPU ns, its minor page faults), `WARDEN_MUD_SKIP_MEMORY_PHASE=1`,
//! `WARDEN_MUD_RECALL_K`, `WARDEN_MUD_WRITES` (see `start_warden`).
//!
//! Threads: `world` (the tick: owns the world, calls the handle), `warden` (every NPC, their
//! model calls), the network's runtime (one worker), and in `bench` the clients' runtime.
//! See docs/embedding.md for the measured figures.

mod bench;
mod model;
mod net;
mod protocol;
mod tick;
mod world;

use std::{
    net::SocketAddr,
    sync::{atomic::AtomicBool, Arc},
    thread::JoinHandle,
};
use warden::{
    host::{StartError, Warden, WardenHandle},
    AgentSpec, NullJournal, Provider, WardenConfig,
};

/// The NPCs' context window (`execution.max_context_tokens`): what bounds each one's history.
pub const HISTORY_TOKENS: u64 = 4_096;

const SYSTEM_PROMPT: &str = "You are a townsperson in a small fantasy village. Answer players in \
one or two short sentences, in character.";

/// Starts warden with `npcs` NPCs on `model` (and the admin API on `admin`, if given); with
/// `passivate_after_s`, that `supervisor.passivate_after_seconds` (else warden's default).
pub fn start_warden(
    npcs: usize,
    model: Arc<dyn Provider>,
    admin: Option<SocketAddr>,
    passivate_after_s: Option<f64>,
) -> Result<WardenHandle, StartError> {
    let mut config = WardenConfig::default();
    if let Some(seconds) = passivate_after_s {
        config.supervisor.passivate_after_seconds = seconds;
    }
    // Each NPC answers one player at a time; a few more wait in its lane, the rest are `Busy`.
    config.mailbox.ordinary_capacity = std::num::NonZeroUsize::new(8).expect("not zero");
    // A bounded history: at 80 % of 4,096 tokens the older turns are compacted into a summary
    // (the default, 0, never compacts: a long-lived NPC's history would grow without end).
    config.execution.max_context_tokens = HISTORY_TOKENS;
    // `WARDEN_MUD_MEMORY=1`: every NPC keeps long-term memory (docs/memory.md), to measure its
    // cost on the tick and per NPC against the same run without it.
    config.memory.long_term = std::env::var_os("WARDEN_MUD_MEMORY").is_some_and(|v| v == "1");
    // To take memory's work apart (docs/memory.md, "Cost"): `WARDEN_MUD_RECALL_K=0` (no recall),
    // `WARDEN_MUD_WRITES=0` (the rate cap admits nothing).
    if let Some(k) = std::env::var("WARDEN_MUD_RECALL_K")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.memory.recall_k = k;
    }
    if let Some(w) = std::env::var("WARDEN_MUD_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.memory.writes_per_minute = w;
    }
    // The journal: none. The benchmark measures the host and the NPCs, not a journal's growth (a
    // real server passes a `SqliteJournal`; `MemoryJournal` keeps every event in memory).
    Warden::start_with(config, Arc::new(NullJournal::default()), move |team| {
        for i in 0..npcs {
            let spec = AgentSpec::assistant(world::npc_key(i), model.clone())
                .with_system_prompt(SYSTEM_PROMPT)
                .without_delegation();
            team.spawn(spec)?;
        }
        if let Some(addr) = admin {
            use warden::server::api::{serve, ApiConfig, ApiState};
            let state = ApiState::new(team.clone(), ApiConfig::from_env());
            actix_rt::spawn(async move {
                if let Err(err) = serve(state, addr).await {
                    eprintln!("admin API on {addr}: {err}");
                }
            });
        }
        Ok(())
    })
}

/// The server: the network's runtime and the world thread.
pub struct Server {
    pub addr: SocketAddr,
    pub net: Arc<net::NetStats>,
    stop: Arc<AtomicBool>,
    world: JoinHandle<tick::Report>,
    runtime: tokio::runtime::Runtime,
}

impl Server {
    /// Listens on 127.0.0.1:`port` (0: any free port) and starts the world thread; with
    /// `agents`, the NPCs are warden's. Each connection is read at most `line_rate` lines a second
    /// (0: no limit); players are kept to the first `zone` rooms.
    pub fn start(
        port: u16,
        npcs: usize,
        zone: usize,
        agents: Option<(WardenHandle, Arc<model::Meter>)>,
        halt: tick::HaltPlan,
        line_rate: u32,
    ) -> std::io::Result<Server> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("net")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (control_tx, control) = std::sync::mpsc::channel();
        let (inputs_tx, inputs) = std::sync::mpsc::sync_channel(65_536);
        let net = Arc::new(net::NetStats::default());
        {
            let _in_runtime = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener)?;
            runtime.spawn(net::serve(
                listener,
                control_tx,
                inputs_tx,
                net.clone(),
                line_rate,
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (warden, meter) = agents.map_or((None, None), |(w, m)| (Some(w), Some(m)));
        let setup = tick::Setup {
            warden,
            meter,
            control,
            inputs,
            stop: stop.clone(),
            halt,
            npcs,
            zone,
        };
        let world = std::thread::Builder::new()
            .name("world".into())
            .spawn(move || tick::run(setup))?;
        Ok(Server {
            addr,
            net,
            stop,
            world,
            runtime,
        })
    }

    /// Stops the world thread and the network; the world's measurements.
    pub fn stop(self) -> tick::Report {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.wait()
    }

    /// Waits for the world thread to end (once `stop` is set), then stops the network.
    fn wait(self) -> tick::Report {
        let report = self.world.join().expect("the world thread panicked");
        self.runtime.shutdown_background();
        report
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every thread started from here (warden's, the network's, the clients') inherits CPU 1; the
    // world thread moves itself to CPU 0.
    tick::pin_to(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let num = |name: &str, default: u64| -> Result<u64, String> {
        flag(name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name}: not a number: {v}"))
        })
    };
    let line_rate = u32::try_from(num("--line-rate", u64::from(net::LINE_RATE))?)
        .map_err(|_| "--line-rate: too large")?;
    let passivate_after_s = flag("--passivate-after-s")
        .map(|v| match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
            _ => Err(format!(
                "--passivate-after-s: {v}: expected seconds, 0 or more (0: never passivate)"
            )),
        })
        .transpose()?;
    match args.first().map(String::as_str) {
        Some("bench") => {
            let scenario = flag("--scenario").map_or("compare", String::as_str);
            let players = num("--players", 100)? as usize;
            let args = bench::Args {
                players,
                flooders: num("--flooders", (players as u64 / 20).max(1))? as usize,
                line_rate,
                npcs: num("--npcs", 100)?.max(1) as usize,
                seconds: flag("--seconds").map_or(Ok(20.0), |v| v.parse::<f64>())?,
                seed: num("--seed", 1)?,
                scenario: bench::Scenario::parse(scenario)
                    .ok_or_else(|| format!("unknown scenario {scenario}"))?,
                json: args.iter().any(|a| a == "--json"),
                passivate_after_s,
                zone_rooms: match num("--zone-rooms", world::ROOMS as u64)? {
                    k @ 1.. if k <= world::ROOMS as u64 => k as usize,
                    k => {
                        return Err(
                            format!("--zone-rooms: {k}: expected 1 to {}", world::ROOMS).into()
                        )
                    }
                },
            };
            bench::run(args)
        }
        None
        | Some("serve")
        | Some("--port" | "--npcs" | "--admin-port" | "--line-rate" | "--passivate-after-s") => {
            serve(
                num("--port", 4000)? as u16,
                num("--npcs", 100)?.max(1) as usize,
                flag("--admin-port").map(|p| p.parse::<u16>()).transpose()?,
                num("--seed", 1)?,
                line_rate,
                passivate_after_s,
            )
        }
        Some(other) => Err(format!("unknown command {other} (serve or bench)").into()),
    }
}

/// Runs the MUD until Ctrl-C.
fn serve(
    port: u16,
    npcs: usize,
    admin_port: Option<u16>,
    seed: u64,
    line_rate: u32,
    passivate_after_s: Option<f64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let meter = model::Meter::new();
    let fault = Arc::new(model::Fault {
        kind: model::FaultKind::None,
        on: AtomicBool::new(false),
    });
    let model = model::npc_model(npcs, seed, fault, meter.clone());
    let admin = admin_port.map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
    let warden = start_warden(npcs, model, admin, passivate_after_s)?;
    let server = Server::start(
        port,
        npcs,
        world::ROOMS,
        Some((warden.clone(), meter)),
        tick::HaltPlan::default(),
        line_rate,
    )?;
    println!(
        "mud: {npcs} NPCs in {} rooms; join with:  nc {} {}",
        world::ROOMS,
        server.addr.ip(),
        server.addr.port()
    );
    if let Some(admin) = admin {
        println!(
            "admin API on http://{admin} (tokens from WARDEN_ADMIN_TOKEN / WARDEN_READ_TOKEN)"
        );
    }
    println!("{}", protocol::HELP);
    // Until Ctrl-C or SIGTERM (the admin API's actix server takes those signals for itself: the
    // MUD listens for them too, and stops the world, then warden).
    let stop = server.stop.clone();
    server.runtime.spawn(async move {
        stopped_by_signal().await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    drop(server.wait());
    warden.shutdown();
    println!("mud: stopped");
    Ok(())
}

/// Resolves on Ctrl-C, or on SIGTERM where there is one.
async fn stopped_by_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
