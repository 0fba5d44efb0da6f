//! A fixed, deterministic workload per phase, for instruction counts with callgrind: repeatable on a
//! noisy machine (the same binary, input and environment give the same count), so two commits can be
//! compared where wall-clock benches on a shared 2-core machine cannot tell a few per cent apart.
//!
//! ```sh
//! cargo build --release --example workload
//! for phase in mailbox spawn halt_all cascade; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/workload $phase 2>&1 \
//!     | grep -E 'Collected'
//! done
//! ```
//!
//! Phases (sizes fixed; everything on one arbiter, the current thread):
//! * `mailbox` — 200,000 ordinary messages through `benches/support`'s `LaneActor` (a
//!   `PriorityMailbox` drained the way the agent drains it: coalesced wakes, batches of 64);
//! * `spawn` — 2,000 assistants spawned and started;
//! * `halt_all` — 2,000 idle assistants halted at once, every acknowledgement awaited;
//! * `cascade` — `benches/support`'s cascade with 4 roots, 50 tasks each, safety checks on (the
//!   `cascade` bench's workload).
//!
//! The count includes starting the process and the actix system (the same for both commits); with
//! `none` as the phase, only that is counted — subtract it.
//!
//! `spawn` and `halt_all` take two optional arguments: `passive` (the default: agents spawned
//! passive, `supervisor.passivate_after_seconds` at its default) or `active` (passivation off: an
//! actor per agent, as before issue 36), and the number of agents (default 2,000):
//! `workload spawn active 20000`.

use actix::Actor;
use std::sync::Arc;
use support::{LaneActor, Sum, Work};
use tokio::sync::oneshot;
use warden::{
    mailbox::PriorityMailbox, AgentSpec, NullJournal, ScriptStep, ScriptedProvider, Supervisor,
    UserEvent, WardenConfig,
};

#[path = "../benches/support/mod.rs"]
mod support;

const MESSAGES: u64 = 200_000;
const AGENTS: usize = 2_000;
const ROOTS: usize = 4;
const TASKS: usize = 50;

async fn mailbox() {
    let (tx, rx) = oneshot::channel();
    let mailbox = Arc::new(PriorityMailbox::new(MESSAGES as usize + 1));
    let _addr = LaneActor {
        mailbox: mailbox.clone(),
        sum: Sum::new(MESSAGES, tx),
    }
    .start();
    for i in 0..MESSAGES {
        let _ = mailbox.try_send(Work(i));
    }
    let _ = rx.await;
}

async fn fleet(active: bool, agents: usize) -> Supervisor {
    let mut config = WardenConfig::default();
    if active {
        config.supervisor.passivate_after_seconds = 0.0;
    }
    let team = Supervisor::builder(config, Arc::new(NullJournal::default()))
        .current_arbiter()
        .build();
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    for i in 0..agents {
        team.spawn(AgentSpec::assistant(format!("a{i}"), model.clone()))
            .expect("spawn");
    }
    team.started().await;
    team
}

async fn cascade() {
    let (team, roots) = support::cascade_team(ROOTS, true);
    for root in &roots {
        for t in 0..TASKS {
            root.try_send_event(UserEvent::new(format!("task {t}")))
                .expect("queued");
        }
    }
    while roots.iter().any(|r| r.status().turns < TASKS as u64) {
        tokio::task::yield_now().await;
    }
    team.shutdown().await;
}

/// `deliver`: `n` world events (a player's whisper: a TRIGGER; with long-term memory on it is also
/// admitted as an observation) delivered through the host handle to 16 NPCs on warden's own
/// thread, replies drained every 32. Count only the delivering calls with callgrind's
/// `--toggle-collect='*WardenHandle*try_deliver*'`: `workload deliver memory|plain N`.
fn deliver(memory: bool, n: usize) {
    use warden::host::{DeliverError, Warden};
    use warden::protocols::npc::{WorldEvent, WorldEventKind};
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.memory.long_term = memory;
    let keys: Vec<String> = (0..16).map(|i| format!("npc{i}")).collect();
    let specs = keys.iter().map(|key| {
        let model = ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("Aye."));
        AgentSpec::assistant(key.as_str(), Arc::new(model))
    });
    let warden =
        Warden::start(config, Arc::new(NullJournal::default()), specs).expect("warden starts");
    let mut replies = Vec::new();
    let mut delivered = 0;
    while delivered < n {
        let key = &keys[delivered % keys.len()];
        let event =
            WorldEvent::player("p1", WorldEventKind::Whisper, "what news?").in_room("tavern");
        match warden.try_deliver(key, event) {
            Ok(_) => delivered += 1,
            Err(DeliverError::Busy(_)) => std::thread::yield_now(),
            Err(err) => panic!("delivery refused: {err}"),
        }
        if delivered % 32 == 0 {
            warden.drain_replies(&mut replies, 1024);
            replies.clear();
        }
    }
    warden.shutdown();
}

fn main() {
    let phase = std::env::args().nth(1).unwrap_or_default();
    if phase == "deliver" {
        let memory = std::env::args().nth(2).as_deref() == Some("memory");
        let n = std::env::args()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or(20_000);
        deliver(memory, n);
        return;
    }
    let active = match std::env::args().nth(2).as_deref() {
        None | Some("passive") => false,
        Some("active") => true,
        Some(other) => {
            eprintln!("unknown mode {other:?}: passive or active");
            std::process::exit(2);
        }
    };
    let agents = match std::env::args().nth(3).map(|n| n.parse::<usize>()) {
        None => AGENTS,
        Some(Ok(n)) => n,
        Some(Err(err)) => {
            eprintln!("the number of agents: {err}");
            std::process::exit(2);
        }
    };
    let sys = actix_rt::System::new();
    sys.block_on(async move {
        match phase.as_str() {
            "none" => {}
            "mailbox" => mailbox().await,
            "spawn" => {
                fleet(active, agents).await;
            }
            "halt_all" => {
                let team = fleet(active, agents).await;
                team.halt_all().await;
            }
            "cascade" => cascade().await,
            other => {
                eprintln!("unknown phase {other:?}: none, mailbox, spawn, halt_all or cascade");
                std::process::exit(2);
            }
        }
    });
}
