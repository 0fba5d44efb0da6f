//! The limits a provider's agents share (`ProviderLimiter`): the concurrency cap with 1,000
//! agents, the requests and tokens per minute on tokio's paused clock, a halt while waiting for a
//! permit, and a server's `Retry-After` / `x-ratelimit-*` pausing every agent of the provider
//! (against the test kit's HTTP server on 127.0.0.1).

use futures::future::join_all;
use parking_lot::Mutex;
use serde_json::json;
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::time::Instant;
use warden_actors::{
    AgentSpec, Limited, LlmRequest, LlmResponse, MemoryJournal, OpenAiCompatible, OpenAiConfig,
    Provider, ProviderError, ProviderLimiter, ProviderLimits, RetryPolicy, Supervisor,
};
use warden_protocols::{
    AgentKey, AgentState, ChatMessage, FinishReason, HaltCause, Usage, UserEvent, WardenConfig,
};
use warden_testkit::http::{ok_json, Server, Step};

/// What the recording model saw.
#[derive(Debug, Default)]
struct Seen {
    now: AtomicUsize,
    max: AtomicUsize,
    calls: AtomicUsize,
    starts: Mutex<Vec<Instant>>,
}

/// A model that answers `ok` after `latency` (on tokio's clock), reporting `tokens` of usage, and
/// records how many of its calls run at once.
#[derive(Debug, Clone)]
struct Recording {
    seen: Arc<Seen>,
    latency: Duration,
    tokens: u64,
}

impl Recording {
    fn new(latency: Duration, tokens: u64) -> Self {
        Recording {
            seen: Arc::default(),
            latency,
            tokens,
        }
    }

    fn calls(&self) -> usize {
        self.seen.calls.load(Ordering::SeqCst)
    }

    fn starts(&self) -> Vec<Instant> {
        self.seen.starts.lock().clone()
    }
}

/// Counts a running call down when dropped (answered or abandoned).
struct Running(Arc<Seen>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Provider for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    fn complete(
        &self,
        _request: LlmRequest,
    ) -> futures::future::BoxFuture<'static, Result<LlmResponse, ProviderError>> {
        let this = self.clone();
        Box::pin(async move {
            let seen = &this.seen;
            seen.calls.fetch_add(1, Ordering::SeqCst);
            seen.starts.lock().push(Instant::now());
            let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
            seen.max.fetch_max(now, Ordering::SeqCst);
            let _running = Running(seen.clone());
            tokio::time::sleep(this.latency).await;
            Ok(LlmResponse {
                message: ChatMessage::assistant("ok"),
                finish_reason: FinishReason::Stop,
                usage: Usage {
                    prompt_tokens: this.tokens,
                    completion_tokens: 0,
                    estimated: false,
                },
            })
        })
    }
}

fn limits(
    max_concurrency: u32,
    requests_per_minute: u32,
    tokens_per_minute: u64,
) -> ProviderLimits {
    ProviderLimits {
        max_concurrency,
        requests_per_minute,
        tokens_per_minute,
    }
}

fn request(agent: &str) -> LlmRequest {
    LlmRequest {
        agent: AgentKey::new(agent),
        messages: vec![ChatMessage::user("hello")],
        tools: vec![],
    }
}

/// Yields until `cond` holds (never sleeps: the paused clock does not move), failing after a
/// bounded number of rounds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held: {what}");
}

fn team() -> Supervisor {
    Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()))
}

#[actix_rt::test]
async fn a_thousand_agents_never_exceed_the_shared_cap() {
    tokio::time::pause();
    let model = Recording::new(Duration::from_millis(20), 50);
    let limiter = ProviderLimiter::new("thousand", limits(8, 0, 0));
    let team = team();
    let agents: Vec<_> = (0..1000)
        .map(|i| {
            let provider = Arc::new(Limited::new(Arc::new(model.clone()), limiter.clone()));
            team.spawn(AgentSpec::assistant(format!("npc{i}").as_str(), provider))
                .unwrap_or_else(|e| panic!("spawn npc{i}: {e}"))
        })
        .collect();
    let replies = join_all(agents.iter().map(|a| a.ask(UserEvent::new("hail")))).await;
    for (i, reply) in replies.into_iter().enumerate() {
        let reply = reply.unwrap_or_else(|e| panic!("npc{i} got no answer: {e}"));
        assert_eq!(reply.answer, "ok", "npc{i}");
    }
    assert_eq!(model.calls(), 1000);
    let max = model.seen.max.load(Ordering::SeqCst);
    // Never more than the cap, and the cap was reached (the test did run calls side by side).
    assert_eq!(max, 8, "most calls at once");
    let stats = limiter.stats();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn requests_per_minute_are_honoured() {
    // 120 a minute: one every 500 ms.
    let model = Recording::new(Duration::from_millis(5), 1);
    let limiter = ProviderLimiter::new("rpm", limits(0, 120, 0));
    let provider = Limited::new(Arc::new(model.clone()), limiter);
    let start = Instant::now();
    let results = join_all((0..300).map(|i| provider.complete(request(&format!("a{i}"))))).await;
    assert!(results.iter().all(Result::is_ok));
    let starts = model.starts();
    assert_eq!(starts.len(), 300);
    // Any 60 s window holds at most 120 starts: the 121st after any start is 60 s later or more.
    for (i, w) in starts.windows(121).enumerate() {
        assert!(
            w[120] - w[0] >= Duration::from_secs(60),
            "starts {i}..={} within {:?}",
            i + 120,
            w[120] - w[0]
        );
    }
    // And no slower than the limit: the 300th starts at 149.5 s.
    let last = *starts.last().unwrap() - start;
    assert!(
        last >= Duration::from_millis(149_500) && last <= Duration::from_millis(149_510),
        "{last:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn tokens_per_minute_count_the_reported_usage() {
    // 6,000 tokens a minute (100 a second); each call really uses 1,000, far above its estimate.
    let model = Recording::new(Duration::ZERO, 1000);
    let limiter = ProviderLimiter::new("tpm", limits(0, 0, 6000));
    let provider = Limited::new(Arc::new(model.clone()), limiter);
    let start = Instant::now();
    for i in 0..13 {
        provider.complete(request(&format!("a{i}"))).await.unwrap();
    }
    let starts: Vec<Duration> = model.starts().iter().map(|s| *s - start).collect();
    // Six calls (6,000 tokens) fit in the first minute, the 7th waits out the debt: about 60 s
    // after the start, and the 13th about 120 s.
    assert_eq!(starts[0], Duration::ZERO);
    for (k, at) in [(6, 60), (12, 120)] {
        assert!(
            starts[k] >= Duration::from_secs(at - 2) && starts[k] <= Duration::from_secs(at),
            "call {k} started at {:?}",
            starts[k]
        );
    }
}

#[actix_rt::test]
async fn a_halt_while_waiting_for_a_permit_never_starts_the_call() {
    tokio::time::pause();
    let model = Recording::new(Duration::from_secs(10), 5);
    let limiter = ProviderLimiter::new("halt", limits(1, 0, 0));
    let provider = || Arc::new(Limited::new(Arc::new(model.clone()), limiter.clone())) as _;
    let team = team();
    let busy = team
        .spawn(AgentSpec::assistant("busy", provider()))
        .unwrap();
    let queued = team
        .spawn(AgentSpec::assistant("queued", provider()))
        .unwrap();

    busy.send_event(UserEvent::new("go")).await.unwrap();
    until("busy's call runs", || model.calls() == 1).await;
    queued.send_event(UserEvent::new("go")).await.unwrap();
    until("queued waits for the permit", || {
        limiter.stats().waiting == 1
    })
    .await;

    let ack = queued
        .halt(HaltCause::Operator {
            operator: "test".into(),
        })
        .await;
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(limiter.stats().waiting, 0, "the halt dropped the wait");

    // Busy's call ends (10 s on the paused clock) and frees the permit: the halted call must not
    // take it.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(busy.status().turns, 1);
    assert_eq!(model.calls(), 1, "a halted agent's call started");
    assert_eq!(limiter.stats().in_flight, 0);

    // A call dropped while it holds the permit gives it back too.
    let third = team
        .spawn(AgentSpec::assistant("third", provider()))
        .unwrap();
    busy.send_event(UserEvent::new("again")).await.unwrap();
    until("busy's second call runs", || model.calls() == 2).await;
    assert_eq!(limiter.stats().in_flight, 1);
    busy.halt(HaltCause::Operator {
        operator: "test".into(),
    })
    .await;
    until("the permit is back", || limiter.stats().in_flight == 0).await;
    let reply = third.ask(UserEvent::new("go")).await.unwrap();
    assert_eq!(reply.answer, "ok");
    assert_eq!(model.calls(), 3);
}

/// The OpenAI-compatible provider on `server` under `limiter`: quick retries without jitter.
fn openai(server: &Server, limiter: &Arc<ProviderLimiter>) -> OpenAiCompatible {
    let config = OpenAiConfig {
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(10),
            max: Duration::from_millis(50),
            jitter: false,
            ..RetryPolicy::default()
        },
        ..OpenAiConfig::new(format!("http://{}/v1", server.addr), "m")
    };
    OpenAiCompatible::new(config)
        .unwrap()
        .with_limiter(limiter.clone())
}

fn ok_reply() -> Step {
    ok_json(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }))
}

fn respond(status: u16, headers: Vec<(&'static str, String)>) -> Step {
    Step::Respond {
        status,
        headers,
        body: r#"{"error":{"message":"slow down"}}"#.into(),
    }
}

#[tokio::test]
async fn a_retry_after_pauses_every_agent_of_the_provider() {
    let server = Server::start(vec![
        vec![respond(429, vec![("retry-after", "1".into())])],
        vec![ok_reply()],
        vec![ok_reply()],
        vec![ok_reply()],
    ])
    .await;
    let limiter = ProviderLimiter::new("storm", ProviderLimits::default());
    // One provider per agent, as a team file builds them, sharing the limiter.
    let first = tokio::spawn(openai(&server, &limiter).complete(request("a")));
    let deadline = Instant::now() + Duration::from_secs(5);
    while limiter.stats().pauses == 0 {
        assert!(Instant::now() < deadline, "the 429 paused nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let until = limiter.paused_until().expect("paused");
    assert_eq!(limiter.stats().throttled, 1);
    let others: Vec<_> = ["b", "c"]
        .map(|agent| tokio::spawn(openai(&server, &limiter).complete(request(agent))))
        .into();
    // Up to the end of the pause, nothing reaches the server: not the others, not the retry.
    tokio::time::sleep_until(until - Duration::from_millis(50)).await;
    assert_eq!(
        server.requests().len(),
        1,
        "a request went out during the pause"
    );
    for call in std::iter::once(first).chain(others) {
        let reply = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call did not end")
            .unwrap();
        assert_eq!(reply.unwrap().message.content.as_deref(), Some("ok"));
    }
    assert!(Instant::now() >= until);
    assert_eq!(server.requests().len(), 4);
    let stats = limiter.stats();
    assert_eq!((stats.pauses, stats.in_flight), (1, 0), "{stats:?}");
    assert!(stats.paused_ms >= 900, "{stats:?}");
}

#[tokio::test]
async fn an_exhausted_rate_limit_budget_pauses_the_next_calls() {
    let body = json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "last one"},
                     "finish_reason": "stop"}],
    })
    .to_string();
    let server = Server::start(vec![
        vec![Step::Respond {
            status: 200,
            headers: vec![
                ("x-ratelimit-remaining-requests", "0".into()),
                ("x-ratelimit-reset-requests", "600ms".into()),
                ("x-ratelimit-remaining-tokens", "1000".into()),
                ("x-ratelimit-reset-tokens", "bogus".into()),
            ],
            body,
        }],
        vec![ok_reply()],
    ])
    .await;
    let limiter = ProviderLimiter::new("budget", ProviderLimits::default());
    let start = Instant::now();
    let reply = openai(&server, &limiter)
        .complete(request("a"))
        .await
        .unwrap();
    assert_eq!(reply.message.content.as_deref(), Some("last one"));
    assert_eq!(limiter.stats().pauses, 1);
    openai(&server, &limiter)
        .complete(request("b"))
        .await
        .unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(limiter.stats().throttled, 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_timeout_bounds_the_call_not_the_wait_for_the_permit() {
    let limiter = ProviderLimiter::new("timeout", limits(1, 0, 0));
    let slow = Arc::new(Recording::new(Duration::from_secs(5), 1));
    let provider = Limited::new(slow.clone(), limiter).with_call_timeout(Duration::from_secs(8));
    assert!(provider.bounds_its_own_calls());
    let start = Instant::now();
    // The second call waits 5 s for the permit, then runs its own 5 s: within its 8 s.
    let (a, b) = tokio::join!(
        provider.complete(request("a")),
        provider.complete(request("b"))
    );
    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    // A call longer than the timeout fails as a timeout once it has its permit.
    let slower = Arc::new(Recording::new(Duration::from_secs(9), 1));
    let limiter = ProviderLimiter::new("timeout-2", limits(1, 0, 0));
    let provider = Limited::new(slower, limiter).with_call_timeout(Duration::from_secs(8));
    let start = Instant::now();
    assert_eq!(
        provider.complete(request("c")).await,
        Err(ProviderError::Timeout { after_ms: 8000 })
    );
    assert_eq!(start.elapsed(), Duration::from_secs(8));
}

#[tokio::test]
async fn a_stream_holds_its_permit_until_its_last_event() {
    use futures::StreamExt;
    use warden_actors::StreamEvent;
    use warden_testkit::http::{done, sse};
    let delta = |text: &str| {
        sse(json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}))
    };
    let server = Server::start(vec![
        vec![
            Step::SseHead,
            delta("first "),
            Step::Pause(Duration::from_millis(300)),
            delta("stream"),
            done(),
            Step::EndChunks,
        ],
        vec![ok_reply()],
    ])
    .await;
    let limiter = ProviderLimiter::new("stream", limits(1, 0, 0));
    let mut stream = openai(&server, &limiter).stream(request("a"));
    match stream.next().await {
        Some(StreamEvent::Delta(text)) => assert_eq!(text, "first "),
        other => panic!("expected the first delta, got {other:?}"),
    }
    let other = tokio::spawn(openai(&server, &limiter).complete(request("b")));
    let deadline = Instant::now() + Duration::from_secs(5);
    while limiter.stats().waiting == 0 {
        assert!(Instant::now() < deadline, "the second call never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The stream is between two pieces of its body: it still holds the only permit.
    assert_eq!(server.requests().len(), 1);
    let rest: Vec<_> = stream.collect().await;
    assert!(
        matches!(
            rest.last(),
            Some(StreamEvent::Finished { outcome: Ok(_), .. })
        ),
        "{rest:?}"
    );
    let reply = tokio::time::timeout(Duration::from_secs(10), other)
        .await
        .expect("the second call did not end")
        .unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    assert_eq!(server.requests().len(), 2);
    assert_eq!(limiter.stats().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn calls_queued_through_a_pause_are_spaced_again_after_it() {
    // 60 a minute: one a second. Five calls queue at once; a pause of 10 s begins at 0.5 s.
    let model = Recording::new(Duration::ZERO, 1);
    let limiter = ProviderLimiter::new("pause-spacing", limits(0, 60, 0));
    let provider = Limited::new(Arc::new(model.clone()), limiter.clone());
    let start = Instant::now();
    let pauser = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        limiter.pause(Duration::from_secs(10), "test");
    };
    let calls = join_all((0..5).map(|i| provider.complete(request(&format!("a{i}")))));
    let (results, ()) = tokio::join!(calls, pauser);
    assert!(results.iter().all(Result::is_ok));
    let starts: Vec<Duration> = model.starts().iter().map(|s| *s - start).collect();
    assert_eq!(starts[0], Duration::ZERO);
    // Nothing during the pause, and one a second after it, not four at its end.
    assert!(starts[1] >= Duration::from_millis(10_500), "{starts:?}");
    for pair in starts.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_secs(1), "{starts:?}");
    }
}

/// An embedding call (long-term memory) takes a permit of the shared limits like a model call: with
/// `max_concurrency = 1` and a model call holding the permit, the embedding waits for it.
#[tokio::test(start_paused = true)]
async fn an_embedding_call_waits_for_the_shared_limits_like_a_model_call() {
    let limiter = ProviderLimiter::new(
        "p",
        ProviderLimits {
            max_concurrency: 1,
            ..ProviderLimits::default()
        },
    );
    let scripted = warden_actors::ScriptedProvider::new([]).with_fallback(|_| {
        warden_actors::ScriptStep::reply("slow").delayed(Duration::from_secs(10))
    });
    let provider = Arc::new(Limited::new(
        Arc::new(scripted.with_embeddings(16)),
        limiter.clone(),
    ));
    let chat = tokio::spawn({
        let provider = provider.clone();
        async move {
            provider
                .complete(warden_actors::LlmRequest {
                    agent: "a".into(),
                    messages: vec![warden_protocols::ChatMessage::user("hi")],
                    tools: Vec::new(),
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(limiter.stats().in_flight, 1);
    let embed = tokio::spawn({
        let provider = provider.clone();
        async move { provider.embed(vec!["x".into()]).unwrap().await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!embed.is_finished(), "the embedding waited for the permit");
    assert_eq!(limiter.stats().waiting, 1);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(chat.await.unwrap().is_ok());
    assert_eq!(embed.await.unwrap().unwrap().vectors.len(), 1);
}
