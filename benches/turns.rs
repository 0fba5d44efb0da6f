//! Turns per second of one agent whose history is already long (issue 14, bounded memory): the
//! per-turn cost must follow the context window (`execution.max_context_tokens = 8192`), not the
//! agent's lifetime. One assistant restored from a record with ~2k and ~40k history messages (200
//! and 4k with `CI` set), one scripted model answering `ok`, a null journal, budgets off and memory
//! compaction off (so the history keeps its size and the turn's own cost is what is measured).
//! Each measured iteration is one `ask` → answer; the team and its history are built outside the
//! timing, afresh for each sample (each measured turn adds 2 messages).
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use warden::{
    AgentRecord, AgentSpec, ChatMessage, NullJournal, ScriptStep, ScriptedProvider, Supervisor,
    UserEvent, WardenConfig,
};

fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// A history of `n` messages: user / assistant exchanges, every fifth one a tool-call unit.
fn history(n: usize) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(n + 3);
    let mut i = 0;
    while out.len() < n {
        out.push(ChatMessage::user(format!(
            "[api] message number {i} from the player"
        )));
        if i % 5 == 4 {
            let id = format!("h{i}");
            let call =
                warden::protocols::ToolCall::new(&id, "look", &serde_json::json!({"at": "door"}));
            out.push(ChatMessage::assistant_tool_calls(None, vec![call]));
            out.push(ChatMessage::tool_result(
                &id,
                r#"{"ok":true,"seen":"a door"}"#,
            ));
        }
        out.push(ChatMessage::assistant(format!("reply number {i}: ok")));
        i += 1;
    }
    out
}

fn team() -> Supervisor {
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.loop_.max_iterations_per_task = 1_000_000;
    config.execution.max_context_tokens = 8192;
    config.memory.compaction = false;
    Supervisor::builder(config, Arc::new(NullJournal::default()))
        .current_arbiter()
        .build()
}

fn turns(c: &mut Criterion) {
    let sizes: &[usize] = if ci() {
        &[200, 4_000]
    } else {
        &[2_000, 40_000]
    };
    let sys = actix_rt::System::new();
    let mut group = c.benchmark_group("turns");
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(1));
    for &n in sizes {
        let mut record = AgentRecord::new("npc".into());
        for m in history(n) {
            record.apply(&warden::EventKind::HistoryAppended { message: m });
        }
        let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
        group.bench_function(BenchmarkId::new("history", n), |b| {
            b.iter_custom(|iters| {
                sys.block_on(async {
                    // A fresh agent on the prepared history for each sample (outside the timing), so
                    // the history has its size (+ 2 messages a measured turn) in every sample.
                    let team = team();
                    let agent = team
                        .spawn(
                            AgentSpec::assistant("npc", model.clone())
                                .restored_from(record.clone()),
                        )
                        .expect("spawn");
                    team.started().await;
                    let start = Instant::now();
                    for _ in 0..iters {
                        let reply = agent.try_ask(UserEvent::new("hello")).expect("ask");
                        let _ = reply.await;
                    }
                    let took = start.elapsed();
                    team.shutdown().await;
                    took
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, turns);
criterion_main!(benches);
