//! warden in an async tokio server with no tick: each connection's task delivers its player's
//! words with `deliver(..).await` (waiting, without blocking a thread, while the NPC's lane is
//! full), and one dispatcher task routes every reply to the player who asked, by event id.
//!
//! The handle's calls need no particular runtime: warden runs on its own thread, this program's
//! runtime is the host's. A server with a world tick calls the synchronous ones from the tick's
//! thread instead (`examples/mud`, `examples/host_loop.rs`).
//!
//! `cargo run --no-default-features --example tokio_host`
use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc, time::Duration};
use tokio::sync::{mpsc, oneshot};
use warden::{
    host::Warden,
    protocols::npc::{WorldEvent, WorldEventKind},
    AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, WardenConfig,
};

/// A reply's place, by `(NPC, event id)`: whoever waits for it, or the line if it came first.
enum Slot {
    Waiting(oneshot::Sender<String>),
    Arrived(String),
}

/// Never locked across an `.await`.
type Slots = Arc<Mutex<HashMap<(String, u64), Slot>>>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = ScriptedProvider::new([]).with_fallback(|_| {
        ScriptStep::reply("Fresh bread, 2 silver.").delayed(Duration::from_millis(200))
    });
    let warden = Warden::start(
        WardenConfig::default(),
        Arc::new(MemoryJournal::new()),
        [AgentSpec::assistant("baker", Arc::new(model))],
    )?;
    let slots: Slots = Arc::default();

    // The dispatcher: every settled event, to whoever waits for it.
    let dispatcher = {
        let (warden, slots) = (warden.clone(), slots.clone());
        tokio::spawn(async move {
            while let Some(reply) = warden.next_reply().await {
                let key = (reply.agent.to_string(), reply.event_id);
                let line = reply
                    .text()
                    .map_or_else(|| "(no answer)".to_owned(), str::to_owned);
                let mut slots = slots.lock();
                match slots.remove(&key) {
                    Some(Slot::Waiting(to)) => drop(to.send(line)),
                    _ => drop(slots.insert(key, Slot::Arrived(line))),
                }
            }
        })
    };

    // Three connections, each asking the baker.
    let (done_tx, mut done) = mpsc::channel(3);
    for player in ["p1", "p2", "p3"] {
        let (warden, slots, done) = (warden.clone(), slots.clone(), done_tx.clone());
        tokio::spawn(async move {
            let event = WorldEvent::player(player, WorldEventKind::Whisper, "any bread left?")
                .in_room("market");
            // Waits (without blocking the thread) while the baker's lane is full.
            let delivered = warden.deliver("baker", event).await;
            let Some(id) = delivered.ok().and_then(|d| d.event_id) else {
                return;
            };
            let key = ("baker".to_owned(), id);
            let (tx, rx) = oneshot::channel();
            let arrived = {
                let mut slots = slots.lock();
                match slots.remove(&key) {
                    Some(Slot::Arrived(line)) => Some(line), // the reply beat us to it
                    _ => {
                        slots.insert(key, Slot::Waiting(tx));
                        None
                    }
                }
            };
            let line = match arrived {
                Some(line) => line,
                None => rx.await.unwrap_or_default(),
            };
            let _ = done
                .send(format!("{player} hears: baker says: {line}"))
                .await;
        });
    }
    drop(done_tx);
    while let Some(line) = done.recv().await {
        println!("{line}");
    }
    warden.halt_all("the server shuts down");
    dispatcher.abort();
    // `shutdown` joins warden's thread: off the runtime's thread.
    tokio::task::spawn_blocking(move || warden.shutdown()).await?;
    Ok(())
}
