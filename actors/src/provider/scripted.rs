//! A provider whose answers are given in advance: for tests, the demo and the load tests.

use super::{LlmRequest, LlmResponse, Provider, ProviderError};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;
use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use warden_protocols::{ChatMessage, FinishReason, ToolCall, Usage};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum ScriptStep {
    /// A final text answer (no tool call).
    Reply(String),
    /// One tool call (its call id is `call_{n}`, `n` the provider's call number).
    CallTool {
        /// The tool's name.
        name: String,
        /// The arguments object.
        args: Value,
    },
    /// A raw response, for anything the shorthands do not cover.
    Respond(LlmResponse),
    /// The call fails.
    Fail(ProviderError),
    /// Waits (on tokio's clock: pausable in tests), then does `then`.
    Delay {
        /// How long to wait before `then`.
        after: Duration,
        /// The step played after the wait.
        then: Box<ScriptStep>,
    },
    /// Panics inside the returned future (the agent catches it and counts an error).
    Panic(String),
    /// Panics in `complete` itself, before any future exists: a crash of the agent's own handler,
    /// which the supervisor's restart policy handles.
    Crash(String),
}

impl ScriptStep {
    /// [`ScriptStep::Reply`]: a final text answer (finish reason `stop`).
    pub fn reply(text: impl Into<String>) -> Self {
        ScriptStep::Reply(text.into())
    }
    /// [`ScriptStep::CallTool`]: one call of tool `name` with `args` (finish reason `tool_calls`).
    pub fn call(name: impl Into<String>, args: Value) -> Self {
        ScriptStep::CallTool {
            name: name.into(),
            args,
        }
    }
    /// [`ScriptStep::Fail`] with [`ProviderError::Other`] carrying `message` (not retryable).
    pub fn fail(message: impl Into<String>) -> Self {
        ScriptStep::Fail(ProviderError::Other {
            message: message.into(),
        })
    }
    /// This step, played after `after` on tokio's clock ([`ScriptStep::Delay`]).
    pub fn delayed(self, after: Duration) -> Self {
        ScriptStep::Delay {
            after,
            then: Box::new(self),
        }
    }
}

type Fallback = Arc<dyn Fn(&LlmRequest) -> ScriptStep + Send + Sync>;

/// A seeded latency for every call of a [`ScriptedProvider`] ([`ScriptedProvider::with_latency`]):
/// log-normal, the shape of real model latencies (most answers near the median, a long tail), set
/// by its median and 99th percentile. The same seed gives the same sequence of latencies, call by
/// call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// The median latency.
    pub median: Duration,
    /// The 99th percentile (at least the median).
    pub p99: Duration,
    /// The seed of the provider's generator.
    pub seed: u64,
}

impl Latency {
    /// A log-normal latency with this median and 99th percentile (σ = ln(p99 / median) / 2.326:
    /// median 0.8 s and p99 5 s give σ ≈ 0.79).
    pub fn lognormal(median: Duration, p99: Duration, seed: u64) -> Self {
        Latency { median, p99, seed }
    }

    fn sigma(&self) -> f64 {
        let median = self.median.as_secs_f64().max(1e-9);
        (self.p99.as_secs_f64() / median).max(1.0).ln() / 2.326_347_874
    }

    /// One latency from `rng` (Box–Muller on two uniforms).
    fn sample(&self, rng: &mut rand::rngs::SmallRng) -> Duration {
        use rand::Rng;
        let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
        let u2: f64 = rng.gen();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let secs = self.median.as_secs_f64() * (self.sigma() * z).exp();
        // Capped at 100× the median: a sample far out in the tail is a stall, not a latency.
        Duration::from_secs_f64(secs.min(self.median.as_secs_f64() * 100.0))
    }
}

/// Plays [`ScriptStep`]s in order; when they run out, asks the fallback, or fails with
/// [`ProviderError::ScriptExhausted`].
pub struct ScriptedProvider {
    /// `with_embeddings`: the dimension of its deterministic fake embedding.
    embeddings: Option<usize>,
    steps: Mutex<VecDeque<ScriptStep>>,
    fallback: Option<Fallback>,
    stats: Arc<ScriptStats>,
    latency: Option<(Latency, Mutex<rand::rngs::SmallRng>)>,
}

impl std::fmt::Debug for ScriptedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedProvider").finish_non_exhaustive()
    }
}

/// What happened to the calls (shared, so a test can keep it after handing the provider away).
#[derive(Debug, Default)]
pub struct ScriptStats {
    /// `complete` was called.
    pub calls: AtomicU64,
    /// A call's future ran to its end.
    pub completed: AtomicU64,
    /// A call's future was dropped before its end (a halt aborted it).
    pub dropped_in_flight: AtomicU64,
    /// `embed` was called (with [`ScriptedProvider::with_embeddings`]).
    pub embeddings: AtomicU64,
}

impl ScriptedProvider {
    /// A provider that plays `steps` in order, one per call, and then fails every call with
    /// [`ProviderError::ScriptExhausted`] (unless [`ScriptedProvider::with_fallback`]). Usage is
    /// estimated at 4 characters per token.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::{atomic::Ordering, Arc};
    /// # use serde_json::json;
    /// use warden_actors::{LlmRequest, Provider, ProviderError, ScriptStep, ScriptedProvider};
    /// use warden_protocols::{AgentKey, ChatMessage};
    ///
    /// let model = ScriptedProvider::new([
    ///     ScriptStep::call("look", json!({"at": "door"})),
    ///     ScriptStep::reply("The door is locked."),
    /// ]);
    /// let stats = model.stats();
    /// let request = LlmRequest {
    ///     agent: AgentKey::new("rogue"),
    ///     messages: vec![ChatMessage::user("what do you see?")],
    ///     tools: vec![],
    /// };
    /// futures::executor::block_on(async {
    ///     let first = model.complete(request.clone()).await.unwrap();
    ///     assert_eq!(first.message.tool_calls[0].function.name, "look");
    ///     let second = model.complete(request.clone()).await.unwrap();
    ///     assert_eq!(second.message.content.as_deref(), Some("The door is locked."));
    ///     let third = model.complete(request).await;
    ///     assert_eq!(third, Err(ProviderError::ScriptExhausted { calls: 3 }));
    /// });
    /// assert_eq!(stats.calls.load(Ordering::SeqCst), 3);
    /// ```
    pub fn new(steps: impl IntoIterator<Item = ScriptStep>) -> Self {
        ScriptedProvider {
            embeddings: None,
            steps: Mutex::new(steps.into_iter().collect()),
            fallback: None,
            stats: Arc::default(),
            latency: None,
        }
    }

    /// Delays every call by a seeded log-normal latency ([`Latency`]) on tokio's clock (pausable
    /// in tests), before its step plays (a [`ScriptStep::Delay`] adds to it). Usage is estimated
    /// as always (4 characters a token), so token counts follow the prompts and the answers.
    ///
    /// # Examples
    /// ```
    /// # use std::time::Duration;
    /// use warden_actors::{Latency, ScriptStep, ScriptedProvider};
    /// let npc_model = ScriptedProvider::new([])
    ///     .with_fallback(|_| ScriptStep::reply("Hm."))
    ///     .with_latency(Latency::lognormal(Duration::from_millis(800), Duration::from_secs(5), 42));
    /// ```
    pub fn with_latency(mut self, latency: Latency) -> Self {
        use rand::SeedableRng;
        let rng = rand::rngs::SmallRng::seed_from_u64(latency.seed);
        self.latency = Some((latency, Mutex::new(rng)));
        self
    }

    /// Also answers embedding calls ([`Provider::embed`]) with a deterministic fake embedding of
    /// `dimensions` (at least 8): each word (lower case, letters and digits) hashed (FNV-1a) into
    /// one dimension, the vector normalised — texts that share words are near, others orthogonal.
    /// For tests of the embedding path; not a model of meaning.
    pub fn with_embeddings(mut self, dimensions: usize) -> Self {
        self.embeddings = Some(dimensions.max(8));
        self
    }

    /// The fake embedding of `text` in `dimensions` (see [`ScriptedProvider::with_embeddings`]).
    pub fn fake_embedding(text: &str, dimensions: usize) -> Vec<f32> {
        let mut v = vec![0f32; dimensions.max(8)];
        let n = v.len() as u64;
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in word.to_lowercase().bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            v[(h % n) as usize] += 1.0;
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v
    }

    /// Answers with `fallback` once the script is used up.
    pub fn with_fallback(
        mut self,
        fallback: impl Fn(&LlmRequest) -> ScriptStep + Send + Sync + 'static,
    ) -> Self {
        self.fallback = Some(Arc::new(fallback));
        self
    }

    /// Appends steps.
    pub fn push(&self, steps: impl IntoIterator<Item = ScriptStep>) {
        self.steps.lock().extend(steps);
    }

    /// The call counters, shared: keep them after handing the provider to an agent.
    pub fn stats(&self) -> Arc<ScriptStats> {
        self.stats.clone()
    }

    fn estimate(request: &LlmRequest, text_len: usize) -> Usage {
        let prompt_chars: usize = request
            .messages
            .iter()
            .map(|m| m.content.as_deref().map_or(0, str::len))
            .sum();
        Usage {
            prompt_tokens: (prompt_chars / 4 + 1) as u64,
            completion_tokens: (text_len / 4 + 1) as u64,
            estimated: true,
        }
    }

    fn respond(request: &LlmRequest, step: ScriptStep, call_no: u64) -> ScriptOutcome {
        match step {
            ScriptStep::Reply(text) => {
                let usage = Self::estimate(request, text.len());
                ScriptOutcome::Ready(Ok(LlmResponse {
                    message: ChatMessage::assistant(text),
                    finish_reason: FinishReason::Stop,
                    usage,
                }))
            }
            ScriptStep::CallTool { name, args } => {
                let call = ToolCall::new(format!("call_{call_no}"), name, &args);
                let usage = Self::estimate(request, call.function.arguments.len());
                ScriptOutcome::Ready(Ok(LlmResponse {
                    message: ChatMessage::assistant_tool_calls(None, vec![call]),
                    finish_reason: FinishReason::ToolCalls,
                    usage,
                }))
            }
            ScriptStep::Respond(response) => ScriptOutcome::Ready(Ok(response)),
            ScriptStep::Fail(error) => ScriptOutcome::Ready(Err(error)),
            ScriptStep::Delay { after, then } => ScriptOutcome::Delay(after, then),
            ScriptStep::Panic(message) => ScriptOutcome::Panic(message),
            ScriptStep::Crash(message) => panic!("scripted crash: {message}"),
        }
    }
}

enum ScriptOutcome {
    Ready(Result<LlmResponse, ProviderError>),
    Delay(Duration, Box<ScriptStep>),
    Panic(String),
}

/// Counts a future dropped before its end.
struct InFlight {
    stats: Arc<ScriptStats>,
    done: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let counter = if self.done {
            &self.stats.completed
        } else {
            &self.stats.dropped_in_flight
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    fn embed(
        &self,
        texts: Vec<String>,
    ) -> Option<BoxFuture<'static, Result<super::Embedded, ProviderError>>> {
        let dimensions = self.embeddings?;
        self.stats.embeddings.fetch_add(1, Ordering::SeqCst);
        let words: u64 = texts
            .iter()
            .map(|t| t.split_whitespace().count() as u64)
            .sum();
        let vectors = texts
            .iter()
            .map(|t| Self::fake_embedding(t, dimensions))
            .collect();
        Some(Box::pin(std::future::ready(Ok(super::Embedded {
            vectors,
            usage: warden_protocols::Usage {
                prompt_tokens: words,
                completion_tokens: 0,
                estimated: true,
            },
        }))))
    }

    fn complete(
        &self,
        request: LlmRequest,
    ) -> BoxFuture<'static, Result<LlmResponse, ProviderError>> {
        let call_no = self.stats.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let step = self.steps.lock().pop_front();
        let step = match (step, &self.fallback) {
            (Some(step), _) => step,
            (None, Some(fallback)) => fallback(&request),
            (None, None) => ScriptStep::Fail(ProviderError::ScriptExhausted { calls: call_no }),
        };
        let step = match &self.latency {
            Some((latency, rng)) => step.delayed(latency.sample(&mut rng.lock())),
            None => step,
        };
        let mut outcome = Self::respond(&request, step, call_no);
        let guard = InFlight {
            stats: self.stats.clone(),
            done: false,
        };
        Box::pin(async move {
            // Move the whole guard in (edition 2021 would otherwise capture only `guard.done`).
            let mut guard = guard;
            loop {
                match outcome {
                    ScriptOutcome::Ready(result) => {
                        guard.done = true;
                        return result;
                    }
                    ScriptOutcome::Delay(after, then) => {
                        tokio::time::sleep(after).await;
                        outcome = Self::respond(&request, *then, call_no);
                    }
                    ScriptOutcome::Panic(message) => {
                        guard.done = true;
                        panic!("scripted panic: {message}");
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_embedding_is_deterministic_normalised_and_near_for_shared_words() {
        let a = ScriptedProvider::fake_embedding("My name is Aldric", 64);
        assert_eq!(
            a,
            ScriptedProvider::fake_embedding("my NAME is aldric!", 64)
        );
        let norm: f32 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-5);
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        let near = ScriptedProvider::fake_embedding("Aldric is here", 64);
        let far = ScriptedProvider::fake_embedding("rain", 64);
        assert!(dot(&a, &near) > dot(&a, &far));
        assert_eq!(ScriptedProvider::fake_embedding("", 4).len(), 8);
    }
}
