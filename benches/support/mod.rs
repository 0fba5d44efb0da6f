//! Workloads shared by the benches and `examples/workload.rs` (which includes this file with
//! `#[path]`), so a wall-clock bench and an instruction count measure the same thing.
//!
//! * [`LaneActor`] — warden's priority mailbox drained by an actix actor exactly as the agent drains
//!   it (coalesced `Wake`s, batches of 64), adding up [`Work`] in a [`Sum`];
//! * [`cascade_team`] — the cascade: `roots` assistants, each delegating every task to its own 2
//!   sub-agents in parallel (one response with two `delegate` calls); each sub-agent calls a tool
//!   (1 call in 7 fails, arguments vary so nothing is "repetition"), then answers; the root answers.
//!   Per task: 3 + 2×2 LLM calls and 2 + 2 tool calls.
#![allow(dead_code)] // each includer uses a part

use actix::{Actor, AsyncContext, Context, Handler, Message};
use serde_json::json;
use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};
use tokio::sync::oneshot;
use warden::{
    mailbox::{Envelope, Prioritized, PriorityMailbox, Wake},
    AgentHandle, AgentSpec, FnTool, NullJournal, Priority, ScriptStep, ScriptedProvider,
    Supervisor, ToolCategory, ToolError, WardenConfig,
};

/// One ordinary message: its payload is added to the sum.
pub struct Work(pub u64);

impl Message for Work {
    type Result = ();
}

impl Prioritized for Work {
    fn priority(&self) -> Priority {
        Priority::Ordinary
    }
}

/// Counts until `target`, then reports the sum.
pub struct Sum {
    sum: u64,
    seen: u64,
    target: u64,
    done: Option<oneshot::Sender<u64>>,
}

impl Sum {
    /// Reports on `done` after `target` messages.
    pub fn new(target: u64, done: oneshot::Sender<u64>) -> Self {
        Sum {
            sum: 0,
            seen: 0,
            target,
            done: Some(done),
        }
    }

    /// Adds one message.
    #[inline]
    pub fn work(&mut self, w: Work) {
        self.sum = self.sum.wrapping_add(w.0);
        self.seen += 1;
        if self.seen == self.target {
            if let Some(done) = self.done.take() {
                let _ = done.send(self.sum);
            }
        }
    }
}

/// warden's mailbox, drained the way `AgentActor::pump` drains it.
pub struct LaneActor {
    pub mailbox: Arc<PriorityMailbox<Work>>,
    pub sum: Sum,
}

impl Actor for LaneActor {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.mailbox.attach(ctx.address().recipient());
    }
}

impl Handler<Wake> for LaneActor {
    type Result = ();
    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        self.mailbox.begin_drain();
        for _ in 0..64 {
            match self.mailbox.pop() {
                Some(Envelope { msg, .. }) => self.sum.work(msg),
                None => return,
            }
        }
        self.mailbox.mark_wake_pending();
        ctx.notify(Wake);
    }
}

fn after_tool(req: &warden::LlmRequest) -> bool {
    req.messages
        .last()
        .is_some_and(|m| m.role == warden::protocols::ChatRole::Tool)
}

/// Root `root`'s model: delegate to both its sub-agents at once, then answer.
fn root_model(root: usize) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
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

/// A sub-agent's model: call `work` (new arguments each time), then answer.
fn sub_model() -> Arc<ScriptedProvider> {
    let n = AtomicU64::new(0);
    Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        if after_tool(req) {
            return ScriptStep::reply("result");
        }
        let i = n.fetch_add(1, Ordering::Relaxed);
        ScriptStep::call("work", json!({"item": i}))
    }))
}

/// The cascade's team on the current arbiter with a null journal (budgets and the per-task
/// iteration cap lifted), safety checks on or off; returns it and its roots.
pub fn cascade_team(roots: usize, safety: bool) -> (Supervisor, Vec<AgentHandle>) {
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.loop_.max_iterations_per_task = 1_000_000;
    let team = Supervisor::builder(config, Arc::new(NullJournal::default()))
        .current_arbiter()
        .safety_checks(safety)
        .build();
    let mut handles = Vec::new();
    for r in 0..roots {
        handles.push(
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
    (team, handles)
}
