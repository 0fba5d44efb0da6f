//! The NPCs' model: the scripted provider with a seeded log-normal latency (median 0.8 s, p99
//! 5 s) and token counts estimated from the prompts and answers, behind a [`Meter`] that counts
//! the calls started, in flight and ended and the tokens they spent (the halt's figures).
//!
//! The fault scenarios switch the model's behaviour while [`Fault::on`] is set. They use the
//! scripted model's own failure modes rather than an HTTP mock: the benchmark measures the host's
//! tick and the handle while the model misbehaves, not the HTTP client (whose 429 and Retry-After
//! handling `tests/` exercises against the scripted HTTP server of `tests/kit`), and 100 NPCs
//! on one mock server would measure the mock.

use futures::future::BoxFuture;
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use warden::{
    protocols::{ChatMessage, FinishReason, ToolCall, Usage},
    Latency, LlmRequest, LlmResponse, Provider, ProviderError, ScriptStep, ScriptedProvider,
};

/// What goes wrong with the model, while [`Fault::on`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Nothing.
    None,
    /// Every call started hangs for 60 s.
    Stall,
    /// Every call fails at once with `429 Too Many Requests` (Retry-After: 2).
    Storm,
    /// Every NPC answers by addressing the other NPC of its room, with the same line each time.
    PingPong,
    /// Every answer is a tool call to a tool that does not exist, with arguments that are not JSON.
    Malformed,
}

/// The switch the benchmark flips.
#[derive(Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub on: AtomicBool,
}

/// Counts the model's calls and tokens.
#[derive(Debug, Default)]
pub struct Meter {
    started: AtomicU64,
    ended: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    tokens: AtomicU64,
    me: std::sync::OnceLock<std::sync::Weak<Meter>>,
}

impl Meter {
    pub fn new() -> Arc<Meter> {
        let meter = Arc::new(Meter::default());
        let _ = meter.me.set(Arc::downgrade(&meter));
        meter
    }

    pub fn clone_arc(&self) -> Arc<Meter> {
        self.me
            .get()
            .and_then(std::sync::Weak::upgrade)
            .expect("built by Meter::new")
    }

    /// `(calls started, tokens spent, calls completed, calls in flight)`.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.started.load(Ordering::SeqCst),
            self.tokens.load(Ordering::SeqCst),
            self.completed.load(Ordering::SeqCst),
            self.in_flight(),
        )
    }

    pub fn in_flight(&self) -> u64 {
        let ended = self.ended.load(Ordering::SeqCst);
        self.started.load(Ordering::SeqCst).saturating_sub(ended)
    }

    pub fn calls(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Calls dropped before their end (a halt aborted them).
    pub fn dropped(&self) -> u64 {
        let done = self.completed.load(Ordering::SeqCst) + self.failed.load(Ordering::SeqCst);
        self.ended.load(Ordering::SeqCst).saturating_sub(done)
    }

    /// Calls that ended with an error (the storm's 429s).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }

    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::SeqCst)
    }
}

/// Ends a call on drop (completed or not).
struct Ending(Arc<Meter>);

impl Drop for Ending {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

/// The NPCs' model, metered.
pub struct Metered {
    inner: ScriptedProvider,
    meter: Arc<Meter>,
}

impl Provider for Metered {
    fn name(&self) -> &str {
        self.inner.name() // the scripted model's, metered
    }

    fn complete(
        &self,
        request: LlmRequest,
    ) -> BoxFuture<'static, Result<LlmResponse, ProviderError>> {
        self.meter.started.fetch_add(1, Ordering::SeqCst);
        let ending = Ending(self.meter.clone());
        let call = self.inner.complete(request);
        Box::pin(async move {
            let result = call.await;
            let meter = &ending.0;
            match &result {
                Ok(response) => {
                    meter
                        .tokens
                        .fetch_add(response.usage.total(), Ordering::SeqCst);
                    meter.completed.fetch_add(1, Ordering::SeqCst);
                }
                Err(_) => {
                    meter.failed.fetch_add(1, Ordering::SeqCst);
                }
            }
            drop(ending);
            result
        })
    }
}

const LINES: [&str; 8] = [
    "Welcome, traveller. The road north is muddy this time of year.",
    "Aye, I have heard of it. Ask the smith, he knows more.",
    "Hm. Not today, friend.",
    "The innkeeper pours a good ale, if you have the coin.",
    "Wolves in the east woods. Keep to the path.",
    "I remember when this square had a fountain.",
    "Two silver, and not a copper less.",
    "You look like you have walked a long way.",
];

/// The NPCs' shared model: `npcs` NPCs (for the ping-pong's partners), the latency seeded by
/// `seed`.
pub fn npc_model(npcs: usize, seed: u64, fault: Arc<Fault>, meter: Arc<Meter>) -> Arc<Metered> {
    let latency = Latency::lognormal(Duration::from_millis(800), Duration::from_secs(5), seed);
    let scripted = ScriptedProvider::new([])
        .with_fallback(move |request| answer(request, npcs, &fault))
        .with_latency(latency);
    Arc::new(Metered {
        inner: scripted,
        meter,
    })
}

fn answer(request: &LlmRequest, npcs: usize, fault: &Fault) -> ScriptStep {
    let on = fault.on.load(Ordering::Relaxed);
    let heard: usize = request
        .messages
        .iter()
        .map(|m| m.content.as_deref().map_or(0, str::len))
        .sum();
    let line = LINES[heard % LINES.len()];
    match fault.kind {
        FaultKind::Stall if on => ScriptStep::reply(line).delayed(Duration::from_secs(60)),
        FaultKind::Storm if on => ScriptStep::Fail(ProviderError::Http {
            status: 429,
            body: r#"{"error":{"message":"rate limited","type":"requests"}} (Retry-After: 2)"#
                .into(),
        }),
        FaultKind::PingPong if on => {
            // The other NPC of the room (NPC i stands in room i % 50: its partner is i ± 50).
            let me: usize = request
                .agent
                .as_str()
                .trim_start_matches("npc")
                .parse()
                .unwrap_or(0);
            let partner = if me + crate::world::ROOMS < npcs {
                me + crate::world::ROOMS
            } else {
                me % crate::world::ROOMS
            };
            ScriptStep::reply(format!(
                "@{} and what do you say to that?",
                crate::world::npc_key(partner)
            ))
        }
        FaultKind::Malformed if on => {
            let mut call = ToolCall::new("call_bad", "no_such_tool", &serde_json::json!({}));
            call.function.arguments = "{not json".into();
            ScriptStep::Respond(LlmResponse {
                message: ChatMessage::assistant_tool_calls(None, vec![call]),
                finish_reason: FinishReason::ToolCalls,
                usage: Usage {
                    prompt_tokens: (heard / 4 + 1) as u64,
                    completion_tokens: 8,
                    estimated: true,
                },
            })
        }
        _ => ScriptStep::reply(line),
    }
}
