//! The OpenAI-compatible provider against a real HTTP/1.1 server on 127.0.0.1.
//!
//! The server is the test kit's scripted one (`warden_testkit::http`), so each test controls the
//! bytes exactly: chunked SSE bodies, connections cut mid-body, stalls, and noticing when the
//! client hangs up. Each accepted connection serves one request and plays the next script in line.

use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::{sync::Arc, time::Duration};
use tokio::net::TcpListener;
use warden_actors::{
    AttemptObserver, FailedAttempt, LlmRequest, OpenAiCompatible, OpenAiConfig, OpenAiSetupError,
    Provider, ProviderError, RetryPolicy, StreamEvent, ToolFormat,
};
use warden_protocols::{AgentKey, ChatMessage, FinishReason, ToolCall, ToolCategory, ToolSpec};
use warden_testkit::http::{done, ok_json, sse, status, Server, Step};

/// Generous bound so a broken property shows up as a failure, never as a hang.
const PATIENCE: Duration = Duration::from_secs(10);

/// The provider's config for `server`: short timeouts, quick retries without jitter.
fn config(server: &Server) -> OpenAiConfig {
    OpenAiConfig {
        request_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(10),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: false,
            ..RetryPolicy::default()
        },
        ..OpenAiConfig::new(format!("http://{}/v1", server.addr), "test-model")
    }
}

fn text_delta(text: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

fn look_tool() -> ToolSpec {
    ToolSpec {
        name: "look".into(),
        description: "Look in a direction".into(),
        parameters: json!({"type": "object", "properties": {"dir": {"type": "string"}}}),
        category: ToolCategory::SafeChain,
    }
}

/// A history with a tool call, its result, and an internal message.
fn request_with_history() -> LlmRequest {
    LlmRequest {
        agent: AgentKey::new("alice"),
        messages: vec![
            ChatMessage::system("You are alice."),
            ChatMessage::user("What is north?"),
            ChatMessage::assistant_tool_calls(
                None,
                vec![ToolCall::new("call_1", "look", &json!({"dir": "north"}))],
            ),
            ChatMessage::tool_result("call_1", "a door"),
            ChatMessage::user("Continue.").internal(),
        ],
        tools: vec![look_tool()],
    }
}

fn simple_request() -> LlmRequest {
    LlmRequest {
        agent: AgentKey::new("bob"),
        messages: vec![ChatMessage::system("sys"), ChatMessage::user("hello there")],
        tools: vec![],
    }
}

fn text_reply(text: &str) -> Value {
    json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    })
}

fn recording_observer() -> (AttemptObserver, Arc<Mutex<Vec<FailedAttempt>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (
        AttemptObserver::new(move |f| sink.lock().push(f.clone())),
        seen,
    )
}

async fn collect(provider: &OpenAiCompatible, request: LlmRequest) -> Vec<StreamEvent> {
    tokio::time::timeout(PATIENCE, provider.stream(request).collect::<Vec<_>>())
        .await
        .expect("stream did not end")
}

/// Asserts exactly one `Finished`, as the last event, and returns its outcome.
fn single_finish(events: &[StreamEvent]) -> Result<warden_actors::LlmResponse, ProviderError> {
    let finished: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::Finished { .. }))
        .collect();
    assert_eq!(finished.len(), 1, "events: {events:?}");
    match events.last() {
        Some(StreamEvent::Finished { outcome, .. }) => outcome.clone(),
        other => panic!("last event is not Finished: {other:?}"),
    }
}

fn messages(body: &Value) -> &Vec<Value> {
    body["messages"].as_array().expect("messages array")
}

#[tokio::test]
async fn native_tool_call_round_trip() {
    let server = Server::start(vec![vec![ok_json(json!({
        "id": "cmpl-1",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_2", "type": "function",
                            "function": {"name": "look", "arguments": "{\"dir\":\"south\"}"}}]}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
    }))]])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    assert_eq!(provider.name(), "openai-compatible:test-model");
    let response = provider.complete(request_with_history()).await.unwrap();

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(requests[0].head.starts_with("post /v1/chat/completions "));
    let body = &requests[0].body;
    assert_eq!(body["model"], "test-model");
    assert!(body.get("stream").is_none());
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {
            "name": "look", "description": "Look in a direction",
            "parameters": look_tool().parameters}}])
    );
    let sent = messages(body);
    assert_eq!(sent.len(), 5);
    assert!(sent.iter().all(|m| m.get("internal").is_none()), "{sent:?}");
    assert_eq!(sent[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(sent[2]["tool_calls"][0]["function"]["name"], "look");
    assert_eq!(sent[3]["role"], "tool");
    assert_eq!(sent[3]["tool_call_id"], "call_1");
    assert_eq!(sent[3]["content"], "a door");
    assert_eq!(sent[4], json!({"role": "user", "content": "Continue."}));

    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        response.message.tool_calls,
        vec![ToolCall::new("call_2", "look", &json!({"dir": "south"}))]
    );
    assert_eq!(response.usage.prompt_tokens, 12);
    assert_eq!(response.usage.completion_tokens, 3);
    assert!(!response.usage.estimated);
}

#[tokio::test]
async fn fallback_format_round_trip() {
    let reply =
        "Let me look.\n```json\n{\"tool\": \"look\", \"parameters\": {\"dir\": \"south\"}}\n```";
    let server = Server::start(vec![vec![ok_json(json!({
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 9},
    }))]])
    .await;
    let config = OpenAiConfig {
        tool_format: ToolFormat::JsonFallback,
        ..config(&server)
    };
    let provider = OpenAiCompatible::new(config).unwrap();
    let response = provider.complete(request_with_history()).await.unwrap();

    let body = &server.requests()[0].body;
    assert!(body.get("tools").is_none(), "{body}");
    let sent = messages(body);
    let roles: Vec<_> = sent.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "system", "user", "assistant", "user", "user"]
    );
    assert_eq!(sent[0]["content"], "You are alice.");
    let tools_prompt = sent[1]["content"].as_str().unwrap();
    assert!(tools_prompt.contains("- look: Look in a direction"));
    assert!(tools_prompt.contains(r#"{"tool": "<tool name>", "parameters""#));
    let call: Value = serde_json::from_str(sent[3]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        call,
        json!({"tool": "look", "parameters": {"dir": "north"}})
    );
    assert_eq!(sent[4]["content"], "[TOOL RESULT: look]\na door");
    assert_eq!(sent[5]["content"], "Continue.");
    for m in sent {
        assert!(m.get("tool_calls").is_none() && m.get("tool_call_id").is_none());
        assert!(m.get("internal").is_none());
    }

    // The reply comes back in native form.
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    let calls = &response.message.tool_calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].function.name, "look");
    assert!(calls[0].id.starts_with("call_"));
    let args: Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
    assert_eq!(args, json!({"dir": "south"}));
    assert_eq!(response.message.content.as_deref(), Some("Let me look."));
}

#[tokio::test]
async fn fallback_plain_text_is_a_plain_answer() {
    let server = Server::start(vec![vec![ok_json(text_reply("Nothing to do."))]]).await;
    let config = OpenAiConfig {
        tool_format: ToolFormat::JsonFallback,
        ..config(&server)
    };
    let response = OpenAiCompatible::new(config)
        .unwrap()
        .complete(request_with_history())
        .await
        .unwrap();
    assert!(response.message.tool_calls.is_empty());
    assert_eq!(response.message.content.as_deref(), Some("Nothing to do."));
    assert_eq!(response.finish_reason, FinishReason::Stop);
}

#[tokio::test]
async fn rate_limit_retry_after_is_honoured_then_succeeds() {
    let server = Server::start(vec![
        vec![Step::Respond {
            status: 429,
            headers: vec![("retry-after", "1".into())],
            body: r#"{"error":{"message":"slow down"}}"#.into(),
        }],
        vec![ok_json(text_reply("hi"))],
    ])
    .await;
    let (observer, seen) = recording_observer();
    let provider = OpenAiCompatible::new(config(&server))
        .unwrap()
        .with_attempt_observer(observer);
    let response = provider.complete(simple_request()).await.unwrap();
    assert_eq!(response.message.content.as_deref(), Some("hi"));
    assert_eq!(server.requests().len(), 2);
    let seen = seen.lock();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].attempt, 1);
    assert!(
        matches!(&seen[0].error, ProviderError::Http { status: 429, body } if body.contains("slow down"))
    );
    // The policy's own backoff is 10 ms: a 1 s wait can only come from the header. (That the
    // provider sleeps exactly `retry_in` on tokio's clock is proven by the retry module's
    // paused-clock unit test.)
    assert_eq!(seen[0].retry_in, Some(Duration::from_secs(1)));
}

#[tokio::test]
async fn rate_limit_retry_after_as_an_http_date_is_honoured() {
    // Two seconds ahead, in whole seconds (an HTTP date has no fractions): 1 to 2 s from now.
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(2));
    let server = Server::start(vec![
        vec![Step::Respond {
            status: 429,
            headers: vec![("retry-after", date.clone())],
            body: "{}".into(),
        }],
        vec![ok_json(text_reply("hi"))],
    ])
    .await;
    let (observer, seen) = recording_observer();
    let provider = OpenAiCompatible::new(config(&server))
        .unwrap()
        .with_attempt_observer(observer);
    let started = std::time::Instant::now();
    let response = provider.complete(simple_request()).await.unwrap();
    assert_eq!(response.message.content.as_deref(), Some("hi"));
    let seen = seen.lock();
    assert_eq!(seen.len(), 1);
    // The policy's own backoff is 10 ms: a wait this long can only come from the date.
    let wait = seen[0].retry_in.expect("retried");
    assert!(
        (Duration::from_millis(500)..=Duration::from_secs(2)).contains(&wait),
        "{date}: {wait:?}"
    );
    assert!(started.elapsed() >= wait);
}

#[tokio::test]
async fn server_error_500_is_retried_then_succeeds() {
    let server = Server::start(vec![
        vec![status(500, "boom")],
        vec![status(503, "busy")],
        vec![ok_json(text_reply("recovered"))],
    ])
    .await;
    let (observer, seen) = recording_observer();
    let provider = OpenAiCompatible::new(config(&server))
        .unwrap()
        .with_attempt_observer(observer);
    let response = provider.complete(simple_request()).await.unwrap();
    assert_eq!(response.message.content.as_deref(), Some("recovered"));
    assert_eq!(server.requests().len(), 3);
    let seen = seen.lock();
    let summary: Vec<_> = seen
        .iter()
        .map(|f| (f.attempt, f.error.clone(), f.retry_in))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                1,
                ProviderError::Http {
                    status: 500,
                    body: "boom".into()
                },
                Some(Duration::from_millis(10))
            ),
            (
                2,
                ProviderError::Http {
                    status: 503,
                    body: "busy".into()
                },
                Some(Duration::from_millis(20))
            ),
        ]
    );
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    for code in [400u16, 401, 403, 404] {
        let server = Server::start(vec![
            vec![status(code, "nope")],
            vec![ok_json(text_reply("must not be reached"))],
        ])
        .await;
        let (observer, seen) = recording_observer();
        let provider = OpenAiCompatible::new(config(&server))
            .unwrap()
            .with_attempt_observer(observer);
        let error = provider.complete(simple_request()).await.unwrap_err();
        assert_eq!(
            error,
            ProviderError::Http {
                status: code,
                body: "nope".into()
            }
        );
        assert_eq!(server.requests().len(), 1, "status {code} was retried");
        let seen = seen.lock();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].retry_in, None);
    }
}

#[tokio::test]
async fn timeout_is_retried_then_reported() {
    let mut server = Server::start(vec![vec![Step::AwaitClose], vec![Step::AwaitClose]]).await;
    let config = OpenAiConfig {
        request_timeout: Duration::from_millis(200),
        retry: RetryPolicy {
            max_attempts: 2,
            ..config(&server).retry
        },
        ..config(&server)
    };
    let error = OpenAiCompatible::new(config)
        .unwrap()
        .complete(simple_request())
        .await
        .unwrap_err();
    // The final error says how many attempts were made.
    assert_eq!(
        error,
        ProviderError::Retried {
            attempts: 2,
            last: Box::new(ProviderError::Timeout { after_ms: 200 })
        }
    );
    assert_eq!(
        error.to_string(),
        "llm call timed out after 200 ms (after 2 attempts)"
    );
    assert_eq!(server.requests().len(), 2);
    // Both abandoned attempts closed their connections.
    server.client_closed().await;
    server.client_closed().await;
}

#[tokio::test]
async fn connection_refused_is_a_retried_connection_error() {
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let (observer, seen) = recording_observer();
    let config = OpenAiConfig {
        retry: RetryPolicy {
            max_attempts: 2,
            base: Duration::from_millis(5),
            jitter: false,
            ..RetryPolicy::default()
        },
        ..OpenAiConfig::new(format!("http://{addr}/v1"), "m")
    };
    let provider = OpenAiCompatible::new(config)
        .unwrap()
        .with_attempt_observer(observer);
    let error = provider.complete(simple_request()).await.unwrap_err();
    assert!(
        matches!(
            &error,
            ProviderError::Retried { attempts: 2, last }
                if matches!(**last, ProviderError::Connection { .. })
        ),
        "{error:?}"
    );
    let seen = seen.lock();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].retry_in, None);
}

#[tokio::test]
async fn malformed_json_body_is_not_retried() {
    let server = Server::start(vec![
        vec![status(200, "{\"choices\": [oops")],
        vec![ok_json(text_reply("must not be reached"))],
    ])
    .await;
    let error = OpenAiCompatible::new(config(&server))
        .unwrap()
        .complete(simple_request())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ProviderError::Malformed { message } if message.contains("not a chat completion")),
        "{error:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

/// A completion with no text and no tool call is no answer: an error (the agent then tells the
/// model and its breaker counts it), not "" delivered as the answer. Plain and streamed.
#[tokio::test]
async fn an_empty_completion_is_an_error() {
    let server = Server::start(vec![
        vec![ok_json(text_reply(""))],
        vec![ok_json(text_reply("  \n"))],
        vec![Step::SseHead, sse(text_delta("")), done()],
    ])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    for _ in 0..2 {
        let error = provider.complete(simple_request()).await.unwrap_err();
        assert!(
            matches!(&error, ProviderError::Malformed { message } if message.contains("answered nothing")),
            "{error:?}"
        );
    }
    let events = collect(&provider, simple_request()).await;
    assert!(
        matches!(single_finish(&events), Err(ProviderError::Malformed { message }) if message.contains("answered nothing")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 3, "not retried");
}

#[tokio::test]
async fn missing_choices_is_malformed() {
    let server = Server::start(vec![
        vec![ok_json(json!({"id": "x", "object": "chat.completion"}))],
        vec![ok_json(json!({"choices": []}))],
        vec![ok_json(json!({"error": {"message": "model not loaded"}}))],
    ])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    for expected in ["no `choices`", "empty `choices`", "model not loaded"] {
        let error = provider.complete(simple_request()).await.unwrap_err();
        assert!(
            matches!(&error, ProviderError::Malformed { message } if message.contains(expected)),
            "{error:?}"
        );
    }
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn missing_usage_is_estimated() {
    let server = Server::start(vec![vec![ok_json(json!({
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "abcdefgh"}}],
    }))]])
    .await;
    let response = OpenAiCompatible::new(config(&server))
        .unwrap()
        .complete(simple_request())
        .await
        .unwrap();
    assert!(response.usage.estimated);
    // "sys" + "hello there" = 14 chars -> 4 tokens; "abcdefgh" = 8 chars -> 2 tokens.
    assert_eq!(response.usage.prompt_tokens, 4);
    assert_eq!(response.usage.completion_tokens, 2);
}

#[tokio::test]
async fn stream_accumulates_text_and_tool_calls() {
    let first_call = json!({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_9", "type": "function",
         "function": {"name": "look", "arguments": "{\"di"}}]}}]});
    let rest_call = json!({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": "r\":\"up\"}"}}]}, "finish_reason": "tool_calls"}]});
    let first = format!(
        "data: {}\n\ndata: {}\n\n",
        text_delta("Hel"),
        text_delta("lo")
    );
    // Lines split across HTTP chunks anywhere, even inside `data:`.
    let (a, b) = first.split_at(7);
    let call_line = format!("data: {first_call}\n\n");
    let (c, d) = call_line.split_at(call_line.len() / 2);
    let server = Server::start(vec![vec![
        Step::SseHead,
        Step::Chunk(a.into()),
        Step::Pause(Duration::from_millis(20)),
        Step::Chunk(b.into()),
        Step::Chunk(": keep-alive\n\n".into()),
        Step::Chunk(c.into()),
        Step::Pause(Duration::from_millis(20)),
        Step::Chunk(d.into()),
        sse(rest_call),
        sse(json!({"choices": [], "usage": {"prompt_tokens": 21, "completion_tokens": 8}})),
        done(),
        Step::EndChunks,
    ]])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    let events = collect(&provider, request_with_history()).await;

    let body = &server.requests()[0].body;
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert!(server.requests()[0]
        .head
        .contains("accept: text/event-stream"));

    let deltas: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Delta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["Hel", "lo"]);
    let call_deltas: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCallDelta {
                index, arguments, ..
            } => Some((*index, arguments.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(call_deltas, [(0, "{\"di"), (0, "r\":\"up\"}")]);
    let response = single_finish(&events).unwrap();
    assert_eq!(response.message.content.as_deref(), Some("Hello"));
    assert_eq!(
        response.message.tool_calls,
        vec![ToolCall::new("call_9", "look", &json!({"dir": "up"}))]
    );
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        (
            response.usage.prompt_tokens,
            response.usage.completion_tokens
        ),
        (21, 8)
    );
    assert!(!response.usage.estimated);
    assert!(matches!(
        events.last(),
        Some(StreamEvent::Finished { attempts: 1, .. })
    ));
}

/// A valid SSE event may spread its data over several `data:` lines (joined with `\n`), use `\r`
/// or `\r\n` line ends, omit the space after the colon, and carry comments.
#[tokio::test]
async fn stream_multi_line_data_events_are_joined_per_the_sse_spec() {
    let server = Server::start(vec![vec![
        Step::SseHead,
        // One JSON chunk pretty-printed over three `data:` lines.
        Step::Chunk(
            "data: {\"choices\": [{\"index\": 0,\n\
             data:   \"delta\": {\"content\": \"Hel\"}}\n\
             data: ]}\n\n"
                .into(),
        ),
        // `\r` line ends, a comment, no space after the colon, the line end split across chunks.
        Step::Chunk(": keep-alive\rdata:{\"choices\": [{\"index\": 0,\r".into()),
        Step::Chunk("data:\"delta\": {\"content\": \"lo\"}}]}\r".into()),
        Step::Pause(Duration::from_millis(20)),
        Step::Chunk("\r\ndata: [DONE]\r\n\r\n".into()),
        Step::EndChunks,
    ]])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    let events = collect(&provider, simple_request()).await;
    let deltas: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Delta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["Hel", "lo"], "{events:?}");
    let response = single_finish(&events).unwrap();
    assert_eq!(response.message.content.as_deref(), Some("Hello"));
}

#[tokio::test]
async fn stream_length_finish_maps_to_length() {
    let server = Server::start(vec![vec![
        Step::SseHead,
        sse(text_delta("cut sh")),
        sse(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})),
        done(),
        Step::EndChunks,
    ]])
    .await;
    let config = OpenAiConfig {
        stream: true,
        ..config(&server)
    };
    // `complete` in streaming mode runs on the same machinery.
    let response = OpenAiCompatible::new(config)
        .unwrap()
        .complete(simple_request())
        .await
        .unwrap();
    assert_eq!(server.requests()[0].body["stream"], true);
    assert_eq!(response.finish_reason, FinishReason::Length);
    assert_eq!(response.message.content.as_deref(), Some("cut sh"));
    assert!(response.usage.estimated);
}

#[tokio::test]
async fn stream_cut_midway_finishes_once_with_error() {
    let server = Server::start(vec![
        vec![Step::SseHead, sse(text_delta("Hel"))],
        vec![
            Step::SseHead,
            sse(text_delta("must not be reached")),
            done(),
        ],
    ])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    let events = collect(&provider, simple_request()).await;
    assert_eq!(events[0], StreamEvent::Delta("Hel".into()));
    let outcome = single_finish(&events);
    assert!(
        matches!(outcome, Err(ProviderError::Connection { .. })),
        "{outcome:?}"
    );
    assert_eq!(events.len(), 2);
    // Deltas were handed out: the stream is not retried.
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn stream_without_done_finishes_once_with_content() {
    let server = Server::start(vec![vec![
        Step::SseHead,
        sse(text_delta("Hel")),
        sse(text_delta("lo")),
        Step::EndChunks,
    ]])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    let events = collect(&provider, simple_request()).await;
    let response = single_finish(&events).unwrap();
    assert_eq!(response.message.content.as_deref(), Some("Hello"));
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert!(response.usage.estimated);
    assert_eq!(events.len(), 3);
}

#[tokio::test]
async fn stream_malformed_chunk_finishes_once_with_error() {
    let server = Server::start(vec![vec![
        Step::SseHead,
        sse(text_delta("ok")),
        Step::Chunk("data: {broken\n\n".into()),
        sse(text_delta("never seen")),
        done(),
        Step::EndChunks,
    ]])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    let events = collect(&provider, simple_request()).await;
    assert!(matches!(
        single_finish(&events),
        Err(ProviderError::Malformed { .. })
    ));
    assert_eq!(events.len(), 2, "{events:?}");
}

#[tokio::test]
async fn stream_error_status_finishes_once_after_retries() {
    let server = Server::start(vec![
        vec![status(502, "bad gateway")],
        vec![status(502, "bad gateway")],
        vec![status(502, "bad gateway")],
    ])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    let events = collect(&provider, simple_request()).await;
    assert_eq!(events.len(), 1);
    assert!(matches!(
        &events[0],
        StreamEvent::Finished {
            outcome: Err(ProviderError::Retried { attempts: 3, last }),
            attempts: 3
        } if matches!(**last, ProviderError::Http { status: 502, .. })
    ));
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn stalled_stream_times_out_once_and_hangs_up() {
    let mut server = Server::start(vec![vec![
        Step::SseHead,
        sse(text_delta("Hel")),
        Step::AwaitClose,
    ]])
    .await;
    let config = OpenAiConfig {
        request_timeout: Duration::from_millis(800),
        ..config(&server)
    };
    let provider = OpenAiCompatible::new(config).unwrap();
    let events = collect(&provider, simple_request()).await;
    assert_eq!(events.len(), 2);
    assert_eq!(
        single_finish(&events),
        Err(ProviderError::Timeout { after_ms: 800 })
    );
    server.client_closed().await;
}

#[tokio::test]
async fn dropping_a_stream_closes_the_connection() {
    let mut server = Server::start(vec![vec![
        Step::SseHead,
        sse(text_delta("Hel")),
        // Stall: the server only reads, waiting for the client to hang up.
        Step::AwaitClose,
    ]])
    .await;
    let provider = OpenAiCompatible::new(config(&server)).unwrap();
    let mut stream = provider.stream(simple_request());
    let first = tokio::time::timeout(PATIENCE, stream.next()).await.unwrap();
    assert_eq!(first, Some(StreamEvent::Delta("Hel".into())));
    // The agent halts: the consumer drops the stream. The server must see the connection close
    // (while the provider is kept alive), which fails if anything kept reading the body.
    drop(stream);
    server.client_closed().await;
    assert_eq!(server.requests().len(), 1);
    drop(provider);
}

#[tokio::test]
async fn api_key_is_sent_but_never_shown() {
    let server = Server::start(vec![vec![ok_json(text_reply("hi"))]]).await;
    let config = OpenAiConfig {
        api_key: Some("sk-secret-123".into()),
        ..config(&server)
    };
    let provider = OpenAiCompatible::new(config).unwrap();
    provider.complete(simple_request()).await.unwrap();
    assert!(server.requests()[0]
        .head
        .contains("authorization: bearer sk-secret-123"));

    let config = provider.config();
    assert!(!format!("{config:?}").contains("sk-secret"));
    assert!(!format!("{provider:?}").contains("sk-secret"));
    assert!(!serde_json::to_string(config).unwrap().contains("sk-secret"));

    // (The success path of reading the key from the environment is a unit test in the module, to
    // keep `set_var` out of this multi-threaded test binary.)
    assert_eq!(
        OpenAiCompatible::from_env(OpenAiConfig::default(), "WARDEN_TEST_UNSET_VAR_7f3a")
            .unwrap_err(),
        OpenAiSetupError::MissingApiKey {
            var: "WARDEN_TEST_UNSET_VAR_7f3a".into()
        }
    );
}

#[test]
fn config_defaults_and_serde() {
    let config = OpenAiConfig::default();
    assert_eq!(config.request_timeout, Duration::from_secs(60));
    assert_eq!(config.retry, RetryPolicy::default());
    assert_eq!(config.retry.max_attempts, 4);
    assert_eq!(config.retry.base, Duration::from_secs(1));
    assert_eq!(config.retry.max, Duration::from_secs(10));
    let parsed: OpenAiConfig = serde_json::from_value(json!({
        "base_url": "http://localhost:11434/v1",
        "model": "qwen",
        "api_key": "k",
        "request_timeout": 2.5,
        "tool_format": "json_fallback",
        "stream": true,
        "retry": {"max_attempts": 2, "base": 0.5},
    }))
    .unwrap();
    assert_eq!(parsed.request_timeout, Duration::from_millis(2500));
    assert_eq!(parsed.tool_format, ToolFormat::JsonFallback);
    assert_eq!(parsed.retry.base, Duration::from_millis(500));
    assert_eq!(parsed.retry.max, Duration::from_secs(10));
    assert_eq!(parsed.api_key.as_deref(), Some("k"));
    let back: OpenAiConfig =
        serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
    assert_eq!(back.api_key, None);
    assert_eq!(back.retry, parsed.retry);
}

/// Long-term memory's embeddings: `POST {base_url}/embeddings` with the embedding model and the
/// texts; vectors put back in input order by `index`; usage counted; a wrong count or an error
/// status is an error (recall then stays on BM25); no embedding model: no call at all.
#[tokio::test]
async fn embeddings_are_asked_of_the_embeddings_endpoint() {
    let server = Server::start(vec![
        vec![ok_json(json!({
            "object": "list",
            "data": [
                {"object": "embedding", "index": 1, "embedding": [0.0, 1.0]},
                {"object": "embedding", "index": 0, "embedding": [1.0, 0.0]}
            ],
            "model": "small-embedder",
            "usage": {"prompt_tokens": 7, "total_tokens": 7}
        }))],
        vec![ok_json(json!({"data": [{"index": 0, "embedding": [1.0]}]}))],
        vec![status(503, "busy")],
    ])
    .await;
    let mut with_model = config(&server);
    with_model.embedding_model = Some("small-embedder".into());
    let provider = OpenAiCompatible::new(with_model).unwrap();
    let texts = vec!["my name is Aldric".to_owned(), "who am I?".to_owned()];
    let embedded = provider
        .embed(texts.clone())
        .expect("an embedding model")
        .await
        .unwrap();
    assert_eq!(embedded.vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
    assert_eq!(
        (embedded.usage.prompt_tokens, embedded.usage.estimated),
        (7, false)
    );
    let requests = server.requests();
    assert!(
        requests[0].head.starts_with("post /v1/embeddings "),
        "{}",
        requests[0].head
    );
    assert_eq!(
        requests[0].body,
        json!({"model": "small-embedder", "input": ["my name is Aldric", "who am I?"]})
    );
    let wrong = provider.embed(texts.clone()).unwrap().await.unwrap_err();
    assert!(
        matches!(wrong, ProviderError::Malformed { .. }),
        "{wrong:?}"
    );
    let down = provider.embed(texts.clone()).unwrap().await.unwrap_err();
    assert!(
        matches!(down, ProviderError::Http { status: 503, .. }),
        "{down:?}"
    );
    let without = OpenAiCompatible::new(config(&server)).unwrap();
    assert!(without.embed(texts).is_none());
}

/// An answer longer than `max_response_bytes` is refused as malformed once the ceiling is reached,
/// without reading it whole, and not retried (the same server would answer the same way).
#[tokio::test]
async fn a_body_over_max_response_bytes_is_refused_and_not_retried() {
    let long = "x".repeat(64 * 1024);
    let server = Server::start(vec![
        vec![ok_json(text_reply(&long))],
        vec![ok_json(text_reply("must not be reached"))],
    ])
    .await;
    let provider = OpenAiCompatible::new(OpenAiConfig {
        max_response_bytes: 4096,
        ..config(&server)
    })
    .unwrap();
    let error = provider.complete(simple_request()).await.unwrap_err();
    assert!(
        matches!(&error, ProviderError::Malformed { message } if message.contains("max_response_bytes")),
        "{error:?}"
    );
    assert_eq!(server.requests().len(), 1);
    // The same answer under the default ceiling is read.
    let server = Server::start(vec![vec![ok_json(text_reply(&long))]]).await;
    let answer = OpenAiCompatible::new(config(&server))
        .unwrap()
        .complete(simple_request())
        .await
        .unwrap();
    assert_eq!(answer.message.content.as_deref(), Some(long.as_str()));
}

/// A stream that never ends (deltas forever, each small) is finished as malformed at the ceiling,
/// once, and its connection is closed: a hostile server cannot grow the draft without bound.
#[tokio::test]
async fn an_endless_stream_is_finished_at_max_response_bytes_and_closed() {
    let mut script = vec![Step::SseHead];
    for _ in 0..40 {
        script.push(sse(text_delta(&"y".repeat(400))));
    }
    script.push(Step::AwaitClose);
    let mut server = Server::start(vec![script]).await;
    let provider = OpenAiCompatible::new(OpenAiConfig {
        max_response_bytes: 4096,
        stream: true,
        ..config(&server)
    })
    .unwrap();
    let events = tokio::time::timeout(PATIENCE, collect(&provider, simple_request()))
        .await
        .expect("the stream finished");
    let outcome = single_finish(&events);
    assert!(
        matches!(&outcome, Err(ProviderError::Malformed { message }) if message.contains("max_response_bytes")),
        "{outcome:?}"
    );
    let deltas = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::Delta(_)))
        .count();
    assert!(deltas < 12, "read past the ceiling: {deltas} deltas");
    tokio::time::timeout(PATIENCE, server.client_closed())
        .await
        .expect("the connection was closed");
}
