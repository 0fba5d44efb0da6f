//! Embedding warden: an innkeeper that delegates to a smith, asked a player's question; the
//! answer comes back to the caller, then the kill switch stops the team.
//!
//! `cargo run --example embed` (the scripted model: no network, no API key).
use serde_json::json;
use std::sync::Arc;
use warden::*;

#[actix_rt::main]
async fn main() {
    let journal = Arc::new(MemoryJournal::new());
    let team = Supervisor::new(WardenConfig::default(), journal);

    // Any `Provider` works; the scripted one needs no network.
    let model = Arc::new(ScriptedProvider::new([
        ScriptStep::call(
            "delegate",
            json!({"agent": "smith", "task": "price of a sword?"}),
        ),
        ScriptStep::reply("The smith says 40 gold."),
    ]));
    let innkeeper = team
        .spawn(AgentSpec::assistant("innkeeper", model))
        .expect("a new key");
    let smith_model = Arc::new(ScriptedProvider::new([ScriptStep::reply("40 gold")]));
    team.spawn(AgentSpec::sub_agent("smith", "innkeeper", smith_model))
        .expect("a new key");

    // A player's chat line (an ordinary, priority-3 message), and its answer once the turn ends.
    match innkeeper.ask(UserEvent::new("how much is a sword?")).await {
        Ok(reply) => println!(
            "innkeeper (event {}, {} tokens, {:?}): {}",
            reply.id,
            reply.usage.total(),
            reply.latency,
            reply.answer
        ),
        Err(err) => println!("no answer: {err}"),
    }

    // The kill switch (priority 0): resolves once every agent has acknowledged.
    for ack in team.halt_all().await {
        println!("{}: {}", ack.agent, ack.state);
    }
}
