//! A game server's frame loop driving warden from a plain thread: 20 frames a second, world
//! events delivered and replies drained every frame, and no call ever waits for a model.
//!
//! The tick decides, the model call runs on warden's thread, the line comes back tagged with its
//! event id. The scripted model takes 400 ms per answer (a slow LLM) and the frame still takes
//! microseconds of warden's time. After two seconds the kill switch halts every NPC; a reply from
//! before the halt comes back marked stale, and the loop drops it.
//!
//! `cargo run --no-default-features --example host_loop` (no network, no API key).
use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};
use warden::{
    host::{DeliverError, NpcReply, Warden},
    protocols::{
        npc::{WorldEvent, WorldEventKind},
        AgentKey,
    },
    AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, WardenConfig,
};

const FRAME: Duration = Duration::from_millis(50); // 20 Hz

fn say(player: &str, text: &str) -> WorldEvent {
    WorldEvent::player(player, WorldEventKind::Whisper, text).in_room("market")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A slow model: every answer takes 400 ms, like a real LLM on a bad day.
    let slow = |line: &'static str| {
        let model = ScriptedProvider::new([])
            .with_fallback(move |_| ScriptStep::reply(line).delayed(Duration::from_millis(400)));
        Arc::new(model)
    };
    let npcs = [
        AgentSpec::assistant("smith", slow("Swords are 40 gold.")),
        AgentSpec::assistant("baker", slow("Fresh bread, 2 silver.")),
    ];
    // warden runs on a thread of its own: this thread needs no runtime.
    let warden = Warden::start(
        WardenConfig::default(),
        Arc::new(MemoryJournal::new()),
        npcs,
    )?;

    let mut batch: Vec<(AgentKey, WorldEvent)> = Vec::new();
    let mut results = Vec::new();
    let mut replies: Vec<NpcReply> = Vec::new();
    let mut asked: HashSet<(AgentKey, u64)> = HashSet::new(); // awaiting a reply
    let mut slowest_call = Duration::ZERO;
    let mut retry = Vec::new();
    let start = Instant::now();
    for frame in 0u32..60 {
        let frame_start = Instant::now();

        // 1. The tick decides: this frame's world events (players speaking every few frames).
        batch.append(&mut retry);
        if frame % 8 == 0 && frame < 40 {
            batch.push(("smith".into(), say("p1", "how much is a sword?")));
            batch.push(("baker".into(), say("p2", "any bread left?")));
        }
        if frame == 41 {
            // Asked just before the halt: its answer will come back stale.
            batch.push(("smith".into(), say("p1", "and an axe?")));
        }

        // 2. Deliver them: synchronous, never waits, at most one cross-thread wake for the whole batch.
        let t = Instant::now();
        let keys: Vec<AgentKey> = batch.iter().map(|(key, _)| key.clone()).collect();
        warden.deliver_batch(&mut batch, &mut results);
        slowest_call = slowest_call.max(t.elapsed());
        for (key, result) in keys.into_iter().zip(results.drain(..)) {
            match result {
                Ok(delivered) => {
                    if let Some(id) = delivered.event_id {
                        asked.insert((key, id));
                    }
                }
                // A full lane: keep the event and try again next frame.
                Err(DeliverError::Busy(event)) => retry.push((key, event)),
                // Halted, locked out, unknown, shut down: the event comes back; this loop drops it.
                Err(err) => println!("[frame {frame:2}] not delivered to {key}: {err}"),
            }
        }

        // 3. The kill switch: raised before `halt_all` returns, no waiting for acks.
        if frame == 42 {
            warden.halt_all("the kill switch");
            println!("[frame {frame:2}] halt_all: every NPC halted");
        }

        // 4. Drain the replies that settled since the last frame, never blocking.
        let t = Instant::now();
        warden.drain_replies(&mut replies, 32);
        slowest_call = slowest_call.max(t.elapsed());
        for reply in replies.drain(..) {
            asked.remove(&(reply.agent.clone(), reply.event_id));
            if reply.stale {
                println!(
                    "[frame {frame:2}] {} event {}: from before the halt (epoch {}), dropped",
                    reply.agent, reply.event_id, reply.halt_epoch
                );
                continue;
            }
            match reply.text() {
                Some(line) => println!("[frame {frame:2}] {} says: {line}", reply.agent),
                None => println!(
                    "[frame {frame:2}] {}: no answer ({:?})",
                    reply.agent, reply.result
                ),
            }
        }

        // 5. The rest of the frame is the game's.
        if let Some(rest) = FRAME.checked_sub(frame_start.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    let stats = warden.stats();
    println!(
        "{:.1} s, 60 frames; slowest host call {:?}; {} delivered, {} refused, {} replies, {} wakes in {} batches; {} unanswered",
        start.elapsed().as_secs_f64(),
        slowest_call,
        stats.delivered,
        stats.refused,
        stats.replies,
        stats.wakes,
        stats.batches,
        asked.len(),
    );
    warden.shutdown();
    Ok(())
}
