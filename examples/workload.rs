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
//! * `mailbox` — 200,000 ordinary messages through a `PriorityMailbox` drained by an actix actor the
//!   way the agent drains it (coalesced wakes, batches of 64);
//! * `spawn` — 2,000 assistants spawned and started;
//! * `halt_all` — 2,000 idle assistants halted at once, every acknowledgement awaited;
//! * `cascade` — 4 assistants each delegating every task to 2 sub-agents that call a flaky tool, 50
//!   tasks each, safety checks on (the `cascade` bench's workload).
//!
//! The count includes starting the process and the actix system (the same for both commits); with
//! `none` as the phase, only that is counted — subtract it.

use actix::{Actor, AsyncContext, Context, Handler, Message};
use serde_json::json;
use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};
use tokio::sync::oneshot;
use warden::{
    mailbox::{Envelope, Prioritized, PriorityMailbox, Wake},
    AgentSpec, FnTool, NullJournal, Priority, ScriptStep, ScriptedProvider, Supervisor,
    ToolCategory, ToolError, UserEvent, WardenConfig,
};

const MESSAGES: u64 = 200_000;
const AGENTS: usize = 2_000;
const ROOTS: usize = 4;
const TASKS: usize = 50;

struct Work(u64);

impl Message for Work {
    type Result = ();
}

impl Prioritized for Work {
    fn priority(&self) -> Priority {
        Priority::Ordinary
    }
}

struct Drain {
    mailbox: Arc<PriorityMailbox<Work>>,
    sum: u64,
    seen: u64,
    done: Option<oneshot::Sender<u64>>,
}

impl Actor for Drain {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.mailbox.attach(ctx.address().recipient());
    }
}

impl Handler<Wake> for Drain {
    type Result = ();
    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        self.mailbox.begin_drain();
        for _ in 0..64 {
            let Some(Envelope { msg, .. }) = self.mailbox.pop() else {
                return;
            };
            self.sum = self.sum.wrapping_add(msg.0);
            self.seen += 1;
            if self.seen == MESSAGES {
                if let Some(done) = self.done.take() {
                    let _ = done.send(self.sum);
                }
            }
        }
        self.mailbox.mark_wake_pending();
        ctx.notify(Wake);
    }
}

async fn mailbox() {
    let (tx, rx) = oneshot::channel();
    let mailbox = Arc::new(PriorityMailbox::new(MESSAGES as usize + 1));
    let _addr = Drain {
        mailbox: mailbox.clone(),
        sum: 0,
        seen: 0,
        done: Some(tx),
    }
    .start();
    for i in 0..MESSAGES {
        let _ = mailbox.try_send(Work(i));
    }
    let _ = rx.await;
}

fn team(config: WardenConfig) -> Supervisor {
    Supervisor::builder(config, Arc::new(NullJournal::default()))
        .current_arbiter()
        .build()
}

fn answering() -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")))
}

async fn fleet() -> Supervisor {
    let team = team(WardenConfig::default());
    let model = answering();
    for i in 0..AGENTS {
        team.spawn(AgentSpec::assistant(format!("a{i}"), model.clone()))
            .expect("spawn");
    }
    team.started().await;
    team
}

fn after_tool(req: &warden::LlmRequest) -> bool {
    req.messages
        .last()
        .is_some_and(|m| m.role == warden::protocols::ChatRole::Tool)
}

async fn cascade() {
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.loop_.max_iterations_per_task = 1_000_000;
    let team = team(config);
    let mut roots = Vec::new();
    for r in 0..ROOTS {
        let root = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
            if after_tool(req) {
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
                                &json!({"agent": format!("r{r}s{i}"), "task": "work"}),
                            )
                        })
                        .collect(),
                ),
                finish_reason: warden::protocols::FinishReason::ToolCalls,
                usage: Default::default(),
            })
        }));
        roots.push(
            team.spawn(AgentSpec::assistant(format!("r{r}"), root))
                .expect("spawn"),
        );
        for s in 0..2 {
            let calls = AtomicU64::new(0);
            let work = FnTool::new("work", "work", ToolCategory::SafeChain, move |_, _| {
                let fail = calls.fetch_add(1, Ordering::Relaxed) % 7 == 6;
                std::future::ready(if fail {
                    Err(ToolError::Failed("flaky".into()))
                } else {
                    Ok(json!({"ok": true}))
                })
            });
            let n = AtomicU64::new(0);
            let sub = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
                if after_tool(req) {
                    return ScriptStep::reply("result");
                }
                ScriptStep::call("work", json!({"item": n.fetch_add(1, Ordering::Relaxed)}))
            }));
            team.spawn(
                AgentSpec::sub_agent(format!("r{r}s{s}"), format!("r{r}"), sub)
                    .with_tool(work)
                    .without_delegation(),
            )
            .expect("spawn");
        }
    }
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

fn main() {
    let phase = std::env::args().nth(1).unwrap_or_default();
    let sys = actix_rt::System::new();
    sys.block_on(async move {
        match phase.as_str() {
            "none" => {}
            "mailbox" => mailbox().await,
            "spawn" => {
                fleet().await;
            }
            "halt_all" => {
                let team = fleet().await;
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
