//! Measures single halts (time from `halt()` to the observed acknowledgement) for several backlogs,
//! with the agent on its own arbiter and idle before each halt. Used to find out why a halt's clean-up
//! must be deferred (see `discard_backlog_gently` in actors/src/agent/actor.rs).
//!
//! `cargo run --release --example halt_probe`
use std::{
    num::NonZeroUsize,
    sync::Arc,
    time::{Duration, Instant},
};
use warden::*;

fn main() {
    actix_rt::System::new().block_on(async {
        let mut config = WardenConfig::default();
        config.mailbox.ordinary_capacity =
            NonZeroUsize::new(2_000_001).unwrap_or(NonZeroUsize::MIN);
        config.supervisor.arbiters = 1;
        let team = Supervisor::new(config, Arc::new(NullJournal::default()));
        let backlogs = [
            0usize, 10_000, 0, 10_000, 100_000, 10_000, 1_000_000, 10_000, 0,
        ];
        for (i, &backlog) in backlogs.iter().enumerate() {
            let model =
                Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
            let Ok(agent) = team.spawn(AgentSpec::assistant(format!("a{i}"), model)) else {
                return;
            };
            let _ = agent.pause("probe").await;
            for j in 0..backlog {
                let _ = agent.try_send_event(UserEvent::new(format!("e{j}")));
            }
            actix_rt::time::sleep(Duration::from_millis(50)).await;
            let start = Instant::now();
            let ack = agent.halt(HaltCause::HaltAll).await;
            println!(
                "backlog {backlog:>8}: halt acknowledged after {:>10?} ({} discarded)",
                start.elapsed(),
                ack.discarded
            );
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
    });
}
