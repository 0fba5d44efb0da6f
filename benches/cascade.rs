//! The SafetyMonitor's overhead: the same cascade workload with the safety checks on and off, in one
//! run. Report the ratio `safety_on / safety_off` of throughput (target ≥ 0.9).
//!
//! Workload: `ROOTS` assistants, each delegating every task to its own 2 sub-agents in parallel (one
//! response with two `delegate` calls); each sub-agent calls a tool (1 call in 7 fails, arguments vary
//! so nothing is "repetition"), then answers; the root answers. Per task: 3 + 2×2 LLM calls and 2 + 2
//! tool calls. Everything runs on one arbiter with a null journal, so the difference is the checks.
//! With `CI` set the sizes are smaller.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use warden::{
    AgentSpec, FnTool, NullJournal, ScriptStep, ScriptedProvider, Supervisor, ToolCategory,
    ToolError, UserEvent, WardenConfig,
};

const ROOTS: usize = 8;

fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

fn root_model(root: usize) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        // After the delegation results come back, answer.
        if req
            .messages
            .last()
            .is_some_and(|m| m.role == warden::protocols::ChatRole::Tool)
        {
            return ScriptStep::reply("done");
        }
        ScriptStep::Respond(warden::LlmResponse {
            message: warden::ChatMessage::assistant_tool_calls(
                None,
                (0..2)
                    .map(|i| {
                        warden::protocols::ToolCall::new(
                            format!("d{i}"),
                            "delegate",
                            &json!({"agent": format!("r{root}s{i}"), "task": "work"}),
                        )
                    })
                    .collect(),
            ),
            finish_reason: warden::protocols::FinishReason::ToolCalls,
            usage: Default::default(),
        })
    }))
}

fn sub_model() -> Arc<ScriptedProvider> {
    let n = AtomicU64::new(0);
    Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        if req
            .messages
            .last()
            .is_some_and(|m| m.role == warden::protocols::ChatRole::Tool)
        {
            return ScriptStep::reply("result");
        }
        let i = n.fetch_add(1, Ordering::Relaxed);
        ScriptStep::call("work", json!({"item": i}))
    }))
}

async fn run_cascade(safety: bool, tasks: usize) -> (Duration, u64) {
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.loop_.max_iterations_per_task = 1_000_000;
    let team = Supervisor::builder(config, Arc::new(NullJournal::default()))
        .current_arbiter()
        .safety_checks(safety)
        .build();
    let mut roots = Vec::new();
    for r in 0..ROOTS {
        roots.push(
            team.spawn(AgentSpec::assistant(format!("r{r}"), root_model(r)))
                .expect("spawn"),
        );
        for s in 0..2 {
            let calls = AtomicU64::new(0);
            let work = FnTool::new("work", "work", ToolCategory::SafeChain, move |_a, _c| {
                let fail = calls.fetch_add(1, Ordering::Relaxed) % 7 == 6;
                std::future::ready(if fail {
                    Err(ToolError::Failed("flaky".into()))
                } else {
                    Ok(json!({"ok": true}))
                })
            });
            team.spawn(
                AgentSpec::sub_agent(format!("r{r}s{s}"), format!("r{r}"), sub_model())
                    .with_tool(work)
                    .without_delegation(),
            )
            .expect("spawn");
        }
    }
    let start = Instant::now();
    for root in &roots {
        for t in 0..tasks {
            root.try_send_event(UserEvent::new(format!("task {t}")))
                .expect("queued");
        }
    }
    while roots.iter().any(|r| r.status().turns < tasks as u64) {
        tokio::task::yield_now().await;
    }
    let elapsed = start.elapsed();
    let steps: u64 = team.statuses().iter().map(|s| s.history_len as u64).sum();
    team.shutdown().await;
    (elapsed, steps)
}

fn cascade(c: &mut Criterion) {
    let tasks = if ci() { 5 } else { 50 };
    let sys = actix_rt::System::new();
    let mut group = c.benchmark_group("cascade");
    group.sample_size(10);
    // Messages in all histories per run (a proxy for steps), measured once per configuration.
    let (_, steps) = sys.block_on(run_cascade(true, tasks));
    group.throughput(Throughput::Elements(steps));
    for safety in [true, false] {
        let name = if safety { "safety_on" } else { "safety_off" };
        group.bench_function(BenchmarkId::new(name, tasks), |b| {
            b.iter_custom(|iters| {
                sys.block_on(async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += run_cascade(safety, tasks).await.0;
                    }
                    total
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cascade);
criterion_main!(benches);
