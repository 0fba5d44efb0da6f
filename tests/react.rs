//! The ReAct loop end to end: termination reasons, max-tokens recovery, context fitting, the tool
//! pipeline (schema validation, result cache, circuit breaker, parallel SAFE_CHAIN calls), and the
//! OpenAI-compatible provider driven by a real agent over HTTP on 127.0.0.1.
//!
//! Everything but the HTTP tests runs on paused time. The HTTP tests use real sockets (and so real
//! time), bounded by generous timeouts; no test asserts a duration.
mod common;
use common::*;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use warden::protocols::{
    ChatRole, ContextStrategyConfig, FinishReason, FunctionCall, ToolCall, ToolRetryConfig,
    ToolSpec, TurnOutcome, Usage,
};
use warden::*;
use warden_actors::{
    context::{compaction_marker, estimate_message_tokens, estimate_tokens},
    tools::CachePolicy,
    OpenAiCompatible, OpenAiConfig, RetryPolicy, ToolFormat,
};
use warden_testkit::http::{ok_json, Server, Step, PATIENCE};

/// The text of `warden_actors`' `CONTINUE_PROMPT` (the constant is not exported).
const CONTINUE_PROMPT: &str = "Your previous reply was cut off by the length limit. Continue exactly where you left off, without repeating anything.";

// ---- helpers ---------------------------------------------------------------------------------------

/// Every `TurnFinished` outcome of `key`, in order.
fn outcomes(journal: &MemoryJournal, key: &str) -> Vec<TurnOutcome> {
    journal
        .events_of(key)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::TurnFinished { outcome } => Some(outcome),
            _ => None,
        })
        .collect()
}

/// The only `TurnFinished` outcome of `key`.
fn only_outcome(journal: &MemoryJournal, key: &str) -> TurnOutcome {
    let mut all = outcomes(journal, key);
    assert_eq!(all.len(), 1, "turns: {all:?}");
    all.remove(0)
}

/// `(consecutive_errors, error)` of every `ErrorCounted` event of `key`.
fn errors_counted(journal: &MemoryJournal, key: &str) -> Vec<(u32, String)> {
    journal
        .events_of(key)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::ErrorCounted {
                consecutive_errors,
                error,
            } => Some((consecutive_errors, error)),
            _ => None,
        })
        .collect()
}

fn tool_messages(history: &[ChatMessage]) -> Vec<&ChatMessage> {
    history
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .collect()
}

fn content(m: &ChatMessage) -> &str {
    m.content.as_deref().unwrap_or_default()
}

/// A response calling the given tools at once (`(id, name, raw argument text)`).
fn calls(list: &[(&str, &str, &str)]) -> ScriptStep {
    ScriptStep::Respond(LlmResponse {
        message: ChatMessage::assistant_tool_calls(
            None,
            list.iter()
                .map(|(id, name, args)| ToolCall {
                    id: (*id).into(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: (*name).into(),
                        arguments: (*args).into(),
                    },
                })
                .collect(),
        ),
        finish_reason: FinishReason::ToolCalls,
        usage: Usage::default(),
    })
}

/// A text answer cut by the length limit.
fn cut(text: &str) -> ScriptStep {
    ScriptStep::Respond(LlmResponse {
        message: ChatMessage::assistant(text),
        finish_reason: FinishReason::Length,
        usage: Usage::default(),
    })
}

fn malformed(message: &str) -> ScriptStep {
    ScriptStep::Fail(ProviderError::Malformed {
        message: message.into(),
    })
}

/// Sends one event and waits for its turn to end.
async fn one_turn(a: &AgentHandle, text: &str) {
    let before = a.status().turns;
    a.try_send_event(UserEvent::new(text)).unwrap();
    until("turn finished", || a.status().turns == before + 1).await;
}

/// A tool that returns `{"data": "x" * n}`.
fn data_tool(name: &str, n: usize) -> Arc<dyn Tool> {
    Arc::new(FnTool::new(
        name,
        "returns data",
        ToolCategory::SafeChain,
        move |_a, _c| std::future::ready(Ok(json!({"data": "x".repeat(n)}))),
    ))
}

// ---- 1. termination reasons --------------------------------------------------------------------------

#[actix_rt::test]
async fn an_answer_is_a_plain_reply_in_one_iteration() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = model([ScriptStep::reply("hello there")]);
    let stats = model.stats();
    let a = team.assistant("a", model);
    one_turn(&a, "hi").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::Answered);
    assert_eq!(serde_json::to_value(out.reason).unwrap(), json!("answered"));
    assert_eq!(
        (out.iterations, out.answer.as_deref(), out.limit_stopped),
        (1, Some("hello there"), false)
    );
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1);
}

#[actix_rt::test]
async fn terminal_tool_ends_the_turn_without_another_llm_call() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (say, say_calls) = counting_tool("say", ToolCategory::Terminal, false);
    let model = Arc::new(
        ScriptedProvider::new([ScriptStep::call("say", json!({"text": "hi"}))])
            .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(say))
        .unwrap();
    one_turn(&a, "greet").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(
        serde_json::to_value(out.reason).unwrap(),
        json!("terminal_tool")
    );
    assert_eq!((out.iterations, out.answer), (1, None));
    assert_eq!(count(&say_calls), 1);
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1);
}

#[actix_rt::test]
async fn dangerous_tool_ends_the_turn() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (rm, rm_calls) = counting_tool("rm", ToolCategory::Dangerous, false);
    let model = Arc::new(
        ScriptedProvider::new([ScriptStep::call("rm", json!({"path": "/tmp/x"}))])
            .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(rm))
        .unwrap();
    one_turn(&a, "clean up").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(
        serde_json::to_value(out.reason).unwrap(),
        json!("dangerous_tool")
    );
    assert_eq!(out.iterations, 1);
    assert_eq!(count(&rm_calls), 1);
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1);
}

#[actix_rt::test]
async fn only_one_dangerous_tool_runs_per_tick_even_if_asked_for_two_at_once() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (rm, rm_calls) = counting_tool("rm", ToolCategory::Dangerous, false);
    let model = Arc::new(
        ScriptedProvider::new([calls(&[
            ("call_a", "rm", r#"{"path":"/a"}"#),
            ("call_b", "rm", r#"{"path":"/b"}"#),
        ])])
        .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(rm))
        .unwrap();
    one_turn(&a, "clean up twice").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::DangerousTool);
    assert_eq!(out.iterations, 1);
    assert_eq!(count(&rm_calls), 1, "one DANGEROUS execution per tick");
}

/// `[api] go` (6 tokens) + the call `call_1`/`big`/`{}` (7 tokens) + the tool message: `call_1` plus
/// `{"data":"x…"}` (17 + n characters) → 4 + ⌈(17 + n)/4⌉ tokens.
fn advisory_turn_tokens(n: usize) -> u64 {
    let history = [
        ChatMessage::user("[api] go"),
        ChatMessage::assistant_tool_calls(None, vec![ToolCall::new("call_1", "big", &json!({}))]),
    ];
    let raw = json!({"data": "x".repeat(n)}).to_string();
    estimate_tokens(&history) + estimate_message_tokens(&ChatMessage::tool_result("call_1", raw))
}

#[actix_rt::test]
async fn critical_tokens_ends_the_turn_with_the_critical_advisory_in_the_tool_result() {
    tokio::time::pause();
    // 6 + 7 + 4 + ⌈260/4⌉ = 82 tokens of 100 → 82 %.
    assert_eq!(advisory_turn_tokens(243), 82);
    let mut config = WardenConfig::default();
    config.execution.max_context_tokens = 100;
    let (team, journal) = team(config);
    let model = Arc::new(
        ScriptedProvider::new([ScriptStep::call("big", json!({}))])
            .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let stats = model.stats();
    let a = team
        .spawn(
            AgentSpec::assistant("a", model)
                .without_delegation()
                .with_tool_arc(data_tool("big", 243)),
        )
        .unwrap();
    one_turn(&a, "go").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(
        serde_json::to_value(out.reason).unwrap(),
        json!("critical_tokens")
    );
    assert_eq!((out.iterations, out.answer), (1, None));
    assert_eq!(
        stats.calls.load(Ordering::SeqCst),
        1,
        "no LLM call after critical"
    );
    let history = a.record().history;
    let tools = tool_messages(&history);
    assert_eq!(tools.len(), 1);
    assert_eq!(
        content(tools[0]),
        format!(
            "{}\n\n[token advisory: context 82% full. Provide final response now]",
            json!({"data": "x".repeat(243)})
        )
    );
}

#[actix_rt::test]
async fn warning_advisory_at_60_percent_lets_the_loop_continue() {
    tokio::time::pause();
    // 6 + 7 + 4 + ⌈192/4⌉ = 65 tokens of 100 → 65 %.
    assert_eq!(advisory_turn_tokens(175), 65);
    let mut config = WardenConfig::default();
    config.execution.max_context_tokens = 100;
    let (team, journal) = team(config);
    let model = model([
        ScriptStep::call("big", json!({})),
        ScriptStep::reply("wrapping up"),
    ]);
    let a = team
        .spawn(
            AgentSpec::assistant("a", model)
                .without_delegation()
                .with_tool_arc(data_tool("big", 175)),
        )
        .unwrap();
    one_turn(&a, "go").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::Answered);
    assert_eq!(
        (out.iterations, out.answer.as_deref()),
        (2, Some("wrapping up"))
    );
    let history = a.record().history;
    let tools = tool_messages(&history);
    assert_eq!(
        content(tools[0]),
        format!(
            "{}\n\n[token advisory: context 65% full. Consider concluding soon]",
            json!({"data": "x".repeat(175)})
        )
    );
}

#[actix_rt::test]
async fn below_60_percent_no_advisory_is_added() {
    tokio::time::pause();
    // 6 + 7 + 4 + ⌈176/4⌉ = 61 tokens of 102 → 59 %.
    assert_eq!(advisory_turn_tokens(159), 61);
    let mut config = WardenConfig::default();
    config.execution.max_context_tokens = 102;
    let (team, _journal) = team(config);
    let model = model([ScriptStep::call("big", json!({})), ScriptStep::reply("ok")]);
    let a = team
        .spawn(
            AgentSpec::assistant("a", model)
                .without_delegation()
                .with_tool_arc(data_tool("big", 159)),
        )
        .unwrap();
    one_turn(&a, "go").await;
    let history = a.record().history;
    assert_eq!(
        content(tool_messages(&history)[0]),
        json!({"data": "x".repeat(159)}).to_string()
    );
}

#[actix_rt::test]
async fn max_iterations_ends_the_turn_with_a_wrap_up() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.execution.max_iterations_per_tick = 2;
    let (team, journal) = team(config);
    let (look, look_calls) = counting_tool("look", ToolCategory::SafeChain, false);
    let n = AtomicUsize::new(0);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        if req.tools.is_empty() {
            return ScriptStep::reply("summary: looked twice");
        }
        ScriptStep::call("look", json!({"at": n.fetch_add(1, Ordering::SeqCst)}))
    }));
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(look))
        .unwrap();
    one_turn(&a, "look around").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(
        serde_json::to_value(out.reason).unwrap(),
        json!("max_iterations")
    );
    assert_eq!(out.iterations, 2);
    assert_eq!(count(&look_calls), 2);
    assert!(out.limit_stopped);
    assert_eq!(out.answer.as_deref(), Some("summary: looked twice"));
}

#[actix_rt::test]
async fn llm_error_ends_the_turn_and_counts_one_error() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = model([ScriptStep::fail("model down")]);
    let a = team.assistant("a", model);
    one_turn(&a, "hi").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(
        serde_json::to_value(out.reason).unwrap(),
        json!("llm_error")
    );
    assert_eq!((out.iterations, out.answer), (1, None));
    assert_eq!(
        errors_counted(&journal, "a"),
        vec![(1, "llm call failed: model down".to_owned())]
    );
    assert_eq!(a.status().consecutive_errors, 1);
    assert_eq!(a.state(), AgentState::WaitingForEvent);
}

#[actix_rt::test]
async fn parse_errors_are_counted_corrected_and_end_the_tick_with_parse_error() {
    tokio::time::pause();
    // Fewer iterations than the consecutive-error threshold (5), so the tick ends before a lockout.
    let mut config = WardenConfig::default();
    config.execution.max_iterations_per_tick = 3;
    let (team, journal) = team(config);
    let (capture, seen) = Capture::new(
        ScriptedProvider::new([]).with_fallback(|_| malformed("expected value at line 1")),
    );
    let a = team.assistant("a", capture);
    one_turn(&a, "hi").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(
        serde_json::to_value(out.reason).unwrap(),
        json!("parse_error")
    );
    assert_eq!((out.iterations, out.answer), (3, None));
    let error = "unparsable model output: expected value at line 1".to_owned();
    assert_eq!(
        errors_counted(&journal, "a"),
        vec![(1, error.clone()), (2, error.clone()), (3, error)]
    );
    let s = a.status();
    assert_eq!(
        (s.consecutive_errors, s.state),
        (3, AgentState::WaitingForEvent)
    );

    let correction = "Your last reply could not be parsed (expected value at line 1). Reply with plain text, or call one of the tools with a JSON object of arguments.";
    let history = a.record().history;
    assert_eq!(history.len(), 4, "{history:#?}");
    assert_eq!(content(&history[0]), "[api] hi");
    for m in &history[1..] {
        assert_eq!(
            (m.role, m.internal, content(m)),
            (ChatRole::User, true, correction)
        );
    }
    // Each retry showed the model the correction(s) so far.
    let seen = seen.lock();
    assert_eq!(seen.len(), 3);
    for (i, request) in seen.iter().enumerate() {
        assert_eq!(request.messages.len(), 1 + i);
        assert!(request.messages[1..]
            .iter()
            .all(|m| content(m) == correction));
    }
}

#[actix_rt::test]
async fn a_malformed_reply_followed_by_a_good_one_recovers_in_the_same_tick() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = model([malformed("garbage"), ScriptStep::reply("all good")]);
    let a = team.assistant("a", model);
    one_turn(&a, "hi").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::Answered);
    assert_eq!(
        (out.iterations, out.answer.as_deref()),
        (2, Some("all good"))
    );
    assert_eq!(
        errors_counted(&journal, "a"),
        vec![(1, "unparsable model output: garbage".to_owned())]
    );
    assert_eq!(
        a.status().consecutive_errors,
        0,
        "the answer resets the count"
    );
    let history = a.record().history;
    let roles: Vec<_> = history.iter().map(|m| (m.role, m.internal)).collect();
    assert_eq!(
        roles,
        [
            (ChatRole::User, false),
            (ChatRole::User, true),
            (ChatRole::Assistant, false)
        ]
    );
}

// ---- 2. max-tokens recovery ----------------------------------------------------------------------------

#[actix_rt::test]
async fn a_cut_answer_is_continued_and_concatenated() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (capture, seen) = Capture::new(ScriptedProvider::new([
        cut("The quick brown "),
        cut("fox jumps over "),
        ScriptStep::reply("the lazy dog."),
    ]));
    let a = team.assistant("a", capture);
    one_turn(&a, "tell me").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::Answered);
    assert_eq!(out.iterations, 3);
    assert_eq!(
        out.answer.as_deref(),
        Some("The quick brown fox jumps over the lazy dog.")
    );
    assert!(!out.truncated, "the last reply was complete");
    let history = a.record().history;
    let shape: Vec<_> = history
        .iter()
        .map(|m| (m.role, m.internal, content(m)))
        .collect();
    assert_eq!(
        shape,
        [
            (ChatRole::User, false, "[api] tell me"),
            (ChatRole::Assistant, false, "The quick brown "),
            (ChatRole::User, true, CONTINUE_PROMPT),
            (ChatRole::Assistant, false, "fox jumps over "),
            (ChatRole::User, true, CONTINUE_PROMPT),
            (ChatRole::Assistant, false, "the lazy dog."),
        ]
    );
    // The continuation prompt is what the model was last shown on each retry.
    let seen = seen.lock();
    assert_eq!(seen.len(), 3);
    for request in &seen[1..] {
        let last = request.messages.last().unwrap();
        assert_eq!(
            (last.role, last.internal, content(last)),
            (ChatRole::User, true, CONTINUE_PROMPT)
        );
    }
}

#[actix_rt::test]
async fn with_recoveries_exhausted_the_partial_answer_is_returned() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = Arc::new(
        ScriptedProvider::new([cut("one "), cut("two "), cut("three ")])
            .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let stats = model.stats();
    let a = team.assistant("a", model);
    // The asker is told the answer is incomplete, and so is the journal (and the event's fate).
    let reply = a.ask(UserEvent::new("count")).await.unwrap();
    assert_eq!(reply.answer, "one two three ");
    assert!(reply.truncated, "{reply:?}");
    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::Answered);
    assert_eq!(out.iterations, 3);
    assert_eq!(out.answer.as_deref(), Some("one two three "));
    assert!(out.truncated);
    let events = journal.events_of("a");
    assert!(matches!(
        EventFate::of_event(reply.id, &events),
        Some(EventFate::Answered {
            truncated: true,
            ..
        })
    ));
    assert_eq!(
        stats.calls.load(Ordering::SeqCst),
        3,
        "2 recoveries, then stop"
    );
    let prompts = a
        .record()
        .history
        .iter()
        .filter(|m| content(m) == CONTINUE_PROMPT)
        .count();
    assert_eq!(prompts, 2);
}

#[actix_rt::test]
async fn zero_max_tokens_recoveries_disables_the_continuation() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.execution.max_tokens_recoveries = 0;
    let (team, journal) = team(config);
    let model = Arc::new(
        ScriptedProvider::new([cut("only half of it")])
            .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let stats = model.stats();
    let a = team.assistant("a", model);
    one_turn(&a, "go").await;
    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::Answered);
    assert_eq!(
        (out.iterations, out.answer.as_deref()),
        (1, Some("only half of it"))
    );
    assert!(out.truncated);
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1);
    assert!(a.record().history.iter().all(|m| !m.internal));
}

// ---- 3. context strategies -----------------------------------------------------------------------------

const SYSTEM: &str = "You are the test agent. Answer briefly.";

/// A long stored history: chat, two tool rounds with big results, more chat.
fn long_history() -> Vec<ChatMessage> {
    let big = |tag: &str| json!({"result": format!("{tag}{}", "r".repeat(300))}).to_string();
    vec![
        ChatMessage::user(format!("[api] first question {}", "q".repeat(120))),
        ChatMessage::assistant_tool_calls(
            None,
            vec![ToolCall::new("c1", "look", &json!({"dir": "north"}))],
        ),
        ChatMessage::tool_result("c1", big("north")),
        ChatMessage::assistant(format!("North is a door. {}", "a".repeat(100))),
        ChatMessage::user(format!("[api] second question {}", "q".repeat(120))),
        ChatMessage::assistant_tool_calls(
            None,
            vec![ToolCall::new("c2", "look", &json!({"dir": "south"}))],
        ),
        ChatMessage::tool_result("c2", big("south")),
        ChatMessage::assistant(format!("South is a wall. {}", "a".repeat(40))),
    ]
}

/// Spawns an agent over [`long_history`] with `max_context_tokens = budget` and `strategy`, sends
/// one event, and returns the messages of the single request the provider received, and the record.
async fn fitted_request(
    strategy: ContextStrategyConfig,
    budget: u64,
) -> (Vec<ChatMessage>, AgentRecord) {
    let mut config = WardenConfig::default();
    config.execution.max_context_tokens = budget;
    // The strategies' own fitting, not memory compaction (tests/memory.rs).
    config.memory.compaction = false;
    config.execution.context_strategy = strategy;
    let (team, _journal) = team(config);
    let (capture, seen) = Capture::new(ScriptedProvider::new([ScriptStep::reply("ok")]));
    let mut record = AgentRecord::new("a".into());
    record.history = long_history();
    let a = team
        .spawn(
            AgentSpec::assistant("a", capture)
                .with_system_prompt(SYSTEM)
                .restored_from(record),
        )
        .unwrap();
    one_turn(&a, "now").await;
    let seen = seen.lock();
    assert_eq!(seen.len(), 1);
    (seen[0].messages.clone(), a.record())
}

/// Every `tool` message answers an assistant tool call earlier in `messages`.
fn assert_no_orphan_tool_results(messages: &[ChatMessage]) {
    for (i, m) in messages.iter().enumerate() {
        if m.role == ChatRole::Tool {
            let id = m.tool_call_id.as_deref().unwrap();
            assert!(
                messages[..i]
                    .iter()
                    .any(|c| c.role == ChatRole::Assistant
                        && c.tool_calls.iter().any(|t| t.id == id)),
                "tool result {id} at {i} has no call before it: {messages:#?}"
            );
        }
    }
}

fn assert_history_untrimmed(record: &AgentRecord) {
    let h = long_history();
    assert_eq!(record.history.len(), h.len() + 2);
    assert_eq!(record.history[..h.len()], h[..]);
    assert_eq!(content(&record.history[h.len()]), "[api] now");
    assert_eq!(content(&record.history[h.len() + 1]), "ok");
}

#[actix_rt::test]
async fn sliding_window_drops_a_tool_round_whole_and_fits_the_budget() {
    tokio::time::pause();
    let h = long_history();
    let system = ChatMessage::system(SYSTEM);
    let event = ChatMessage::user("[api] now");
    let tokens = |ms: &[ChatMessage]| estimate_tokens(ms);
    // Room for the system prompt, the last answer, the event — and the c2 tool result, but not
    // its call: a message-by-message trim would keep the result as an orphan.
    let budget = tokens(&[system.clone(), h[7].clone(), event.clone()]) + tokens(&h[6..7]);
    assert!(tokens(&h[5..7]) > tokens(&h[6..7]));
    let (sent, record) = fitted_request(ContextStrategyConfig::SlidingWindow, budget).await;
    assert_eq!(sent, vec![system.clone(), h[7].clone(), event.clone()]);
    assert!(tokens(&sent) <= budget);
    assert_no_orphan_tool_results(&sent);
    assert_history_untrimmed(&record);

    // With room for the whole c2 round, the call and its result are both kept.
    let budget = tokens(&[system.clone(), event.clone()]) + tokens(&h[5..8]);
    let (sent, record) = fitted_request(ContextStrategyConfig::SlidingWindow, budget).await;
    let mut expected = vec![system];
    expected.extend_from_slice(&h[5..8]);
    expected.push(event);
    assert_eq!(sent, expected);
    assert!(tokens(&sent) <= budget);
    assert_eq!(sent[0].role, ChatRole::System);
    assert_no_orphan_tool_results(&sent);
    assert_history_untrimmed(&record);
}

#[actix_rt::test]
async fn compact_keeps_the_system_prompt_and_marks_what_was_dropped() {
    tokio::time::pause();
    let h = long_history();
    let system = ChatMessage::system(SYSTEM);
    let event = ChatMessage::user("[api] now");
    let marker = compaction_marker(7);
    assert_eq!(content(&marker), "[… 7 earlier messages compacted …]");
    let budget = estimate_tokens(&[system.clone(), marker.clone(), h[7].clone(), event.clone()]);
    let (sent, record) = fitted_request(ContextStrategyConfig::Compact, budget).await;
    let shape: Vec<_> = sent
        .iter()
        .map(|m| (m.role, m.internal, content(m)))
        .collect();
    assert_eq!(
        shape,
        [
            (ChatRole::System, false, SYSTEM),
            (ChatRole::User, true, "[… 7 earlier messages compacted …]"),
            (ChatRole::Assistant, false, content(&h[7])),
            (ChatRole::User, false, "[api] now"),
        ]
    );
    assert!(estimate_tokens(&sent) <= budget);
    assert_no_orphan_tool_results(&sent);
    assert_history_untrimmed(&record);
}

// ---- 4. tools -----------------------------------------------------------------------------------------

#[actix_rt::test]
async fn schema_violation_is_reported_to_the_model_and_the_tool_never_runs() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let greet = FnTool::new("greet", "greets", ToolCategory::SafeChain, move |_a, _c| {
        counter.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(json!({"greeted": true})))
    })
    .with_parameters(json!({
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
    }));
    let model = model([
        ScriptStep::call("greet", json!({"name": 42})),
        ScriptStep::reply("sorry"),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(greet))
        .unwrap();
    one_turn(&a, "greet bob").await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the tool never ran");
    let history = a.record().history;
    let tools = tool_messages(&history);
    assert_eq!(tools.len(), 1);
    let result: Value = serde_json::from_str(content(tools[0])).unwrap();
    assert_eq!(
        result,
        json!({"success": false, "error": "invalid arguments: $.name: expected string, got number"})
    );
    assert_eq!(
        errors_counted(&journal, "a"),
        vec![(
            1,
            "tool greet failed: invalid arguments: $.name: expected string, got number".to_owned()
        )]
    );
    assert!(!journal
        .events_of("a")
        .iter()
        .any(|e| matches!(&e.kind, EventKind::ToolStarted { .. })));
    assert_eq!(only_outcome(&journal, "a").answer.as_deref(), Some("sorry"));
}

/// A SAFE_CHAIN tool whose results are cached for the session.
struct Lookup {
    runs: Arc<AtomicUsize>,
}

impl Tool for Lookup {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "lookup".into(),
            description: "looks something up".into(),
            parameters: json!({"type": "object"}),
            category: ToolCategory::SafeChain,
        }
    }

    fn call(
        &self,
        args: Value,
        _ctx: ToolContext,
    ) -> futures::future::BoxFuture<'static, Result<Value, ToolError>> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move { Ok(json!({"run": n, "args": args})) })
    }

    fn cache_policy(&self) -> CachePolicy {
        CachePolicy::session(Duration::from_secs(300))
    }
}

#[actix_rt::test]
async fn a_session_cached_tool_runs_once_for_two_identical_calls() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let model = model([
        calls(&[("call_1", "lookup", r#"{"a":1,"b":{"x":true,"y":"z"}}"#)]),
        calls(&[("call_2", "lookup", r#"{"b":{"y":"z","x":true},"a":1}"#)]),
        ScriptStep::reply("done"),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(Lookup { runs: runs.clone() }))
        .unwrap();
    one_turn(&a, "look twice").await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second call is a cache hit"
    );
    let history = a.record().history;
    let tools = tool_messages(&history);
    assert_eq!(tools.len(), 2);
    assert_eq!(content(tools[0]), content(tools[1]));
    let first: Value = serde_json::from_str(content(tools[0])).unwrap();
    assert_eq!(first["run"], 1);

    let events = journal.events_of("a");
    let started: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolStarted { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(started, ["call_1"]);
    let finished: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolFinished {
                call_id, ok, error, ..
            } => Some((call_id.as_str(), *ok, error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(finished, [("call_1", true, None), ("call_2", true, None)]);
    let out = only_outcome(&journal, "a");
    assert_eq!(
        (out.reason, out.iterations),
        (TerminationReason::Answered, 3)
    );
}

#[actix_rt::test]
async fn a_failing_tool_opens_its_circuit_and_one_probe_runs_after_the_cool_down() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.tools.circuit_failure_threshold = std::num::NonZeroU32::new(2).unwrap();
    config.tools.circuit_cool_down_seconds = 10.0;
    let (team, journal) = team(config);
    let runs = Arc::new(AtomicUsize::new(0));
    let healthy = Arc::new(AtomicBool::new(false));
    let flaky = {
        let (runs, healthy) = (runs.clone(), healthy.clone());
        FnTool::new(
            "flaky",
            "fails until fixed",
            ToolCategory::SafeChain,
            move |_a, _c| {
                runs.fetch_add(1, Ordering::SeqCst);
                std::future::ready(if healthy.load(Ordering::SeqCst) {
                    Ok(json!({"ok": true}))
                } else {
                    Err(ToolError::Failed("backend down".into()))
                })
            },
        )
    };
    // Different arguments each time: no repetition breaker involved.
    let model = model([
        ScriptStep::call("flaky", json!({"n": 1})),
        ScriptStep::call("flaky", json!({"n": 2})),
        ScriptStep::call("flaky", json!({"n": 3})),
        ScriptStep::reply("it is broken"),
        ScriptStep::call("flaky", json!({"n": 4})),
        ScriptStep::reply("it works again"),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(flaky))
        .unwrap();
    one_turn(&a, "try it").await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the third call was rejected"
    );
    let history = a.record().history;
    let results: Vec<Value> = tool_messages(&history)
        .iter()
        .map(|m| serde_json::from_str(content(m)).unwrap())
        .collect();
    assert_eq!(
        results,
        vec![
            json!({"success": false, "error": "backend down"}),
            json!({"success": false, "error": "backend down"}),
            json!({"success": false, "error":
                "tool `flaky` is unavailable: circuit open after 2 failures, retry in 10 s"}),
        ]
    );
    let changes = |journal: &MemoryJournal| -> Vec<(String, String)> {
        journal
            .events_of("a")
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::ToolCircuitChanged { tool, transition } => Some((tool, transition)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        changes(&journal),
        [("flaky".to_owned(), "opened after 2 failures".to_owned())]
    );
    // The rejection counted as an error (3 in a row), then the answer reset the count.
    let counted: Vec<u32> = errors_counted(&journal, "a").iter().map(|e| e.0).collect();
    assert_eq!(counted, [1, 2, 3]);

    // After the cool-down, one probe is let through; it succeeds and closes the circuit.
    tokio::time::sleep(Duration::from_secs(10)).await;
    healthy.store(true, Ordering::SeqCst);
    one_turn(&a, "try again").await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(
        changes(&journal),
        [
            ("flaky".to_owned(), "opened after 2 failures".to_owned()),
            ("flaky".to_owned(), "closed".to_owned())
        ]
    );
    let history = a.record().history;
    assert_eq!(
        content(tool_messages(&history)[3]),
        json!({"ok": true}).to_string()
    );
    assert_eq!(
        outcomes(&journal, "a")[1].answer.as_deref(),
        Some("it works again")
    );
}

#[actix_rt::test]
async fn parallel_safe_chain_calls_overlap() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    // Each tool waits for the other: only concurrent execution lets both finish (sequentially, the
    // first would hit the 30 s tool timeout).
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let side = |name: &'static str| {
        let barrier = barrier.clone();
        FnTool::new(
            name,
            "meets the other side",
            ToolCategory::SafeChain,
            move |_a, _c| {
                let barrier = barrier.clone();
                async move {
                    barrier.wait().await;
                    Ok(json!({"side": name}))
                }
            },
        )
    };
    let model = model([
        calls(&[("call_l", "left", "{}"), ("call_r", "right", "{}")]),
        ScriptStep::reply("met"),
    ]);
    let a = team
        .spawn(
            AgentSpec::assistant("a", model)
                .with_tool(side("left"))
                .with_tool(side("right")),
        )
        .unwrap();
    one_turn(&a, "meet").await;
    let history = a.record().history;
    let results: Vec<_> = tool_messages(&history)
        .iter()
        .map(|m| (m.tool_call_id.clone().unwrap(), content(m).to_owned()))
        .collect();
    assert_eq!(
        results,
        [
            ("call_l".to_owned(), json!({"side": "left"}).to_string()),
            ("call_r".to_owned(), json!({"side": "right"}).to_string())
        ]
    );
    let out = only_outcome(&journal, "a");
    assert_eq!(
        (out.reason, out.answer.as_deref()),
        (TerminationReason::Answered, Some("met"))
    );
    assert_eq!(a.status().consecutive_errors, 0);
}

#[actix_rt::test]
async fn a_response_with_a_dangerous_call_runs_its_calls_one_after_the_other() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let logged = |name: &'static str, category| {
        let log = log.clone();
        FnTool::new(name, "logs start and end", category, move |_a, _c| {
            let log = log.clone();
            async move {
                log.lock().push(format!("{name}:start"));
                tokio::time::sleep(Duration::from_secs(1)).await;
                log.lock().push(format!("{name}:end"));
                Ok(json!({}))
            }
        })
    };
    let model = Arc::new(
        ScriptedProvider::new([calls(&[("call_p", "peek", "{}"), ("call_w", "wipe", "{}")])])
            .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let a = team
        .spawn(
            AgentSpec::assistant("a", model)
                .with_tool(logged("peek", ToolCategory::SafeChain))
                .with_tool(logged("wipe", ToolCategory::Dangerous)),
        )
        .unwrap();
    one_turn(&a, "peek then wipe").await;
    assert_eq!(
        *log.lock(),
        ["peek:start", "peek:end", "wipe:start", "wipe:end"]
    );
    assert_eq!(
        only_outcome(&journal, "a").reason,
        TerminationReason::DangerousTool
    );
}

// ---- 5. the OpenAI-compatible provider over HTTP ---------------------------------------------------------

/// The provider's config for `server`: one attempt, no retries.
fn config(server: &Server, format: ToolFormat) -> OpenAiConfig {
    OpenAiConfig {
        request_timeout: Duration::from_secs(10),
        tool_format: format,
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..OpenAiConfig::new(server.url("/v1"), "test-model")
    }
}

/// A stream that starts (headers and one chunk with the beginning of a tool call), then stalls
/// until the client closes the connection.
fn stream_then_stall() -> Vec<Step> {
    let chunk = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
        "id": "call_s1", "type": "function",
        "function": {"name": "lookup", "arguments": "{\"key\":"}}]}}]});
    vec![
        Step::SseHead,
        Step::Chunk(format!("data: {chunk}\n\n")),
        Step::AwaitClose,
    ]
}

fn completion(message: Value, finish_reason: &str, prompt: u64, completion: u64) -> Vec<Step> {
    vec![ok_json(json!({
        "id": "cmpl-test",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }))]
}

/// A `lookup` tool answering `{"door": "open", "asked": <key>}` and recording its arguments.
fn lookup_tool(args_seen: Arc<Mutex<Vec<Value>>>) -> Arc<dyn Tool> {
    Arc::new(
        FnTool::new(
            "lookup",
            "Looks a key up",
            ToolCategory::SafeChain,
            move |args: Value, _c| {
                args_seen.lock().push(args.clone());
                std::future::ready(Ok(json!({"door": "open", "asked": args["key"]})))
            },
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        })),
    )
}

async fn bounded<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

fn messages(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .cloned()
        .expect("messages array")
}

#[actix_rt::test]
async fn openai_native_tool_calling_round_trip_through_an_agent() {
    let server = Server::start(vec![
        completion(
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_abc123", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"key\":\"door\"}"}}]}),
            "tool_calls",
            11,
            7,
        ),
        completion(
            json!({"role": "assistant", "content": "The door is open."}),
            "stop",
            20,
            5,
        ),
    ])
    .await;
    let (team, journal) = team(WardenConfig::default());
    let args_seen = Arc::new(Mutex::new(Vec::new()));
    let provider = Arc::new(OpenAiCompatible::new(config(&server, ToolFormat::Native)).unwrap());
    let a = team
        .spawn(
            AgentSpec::assistant("a", provider)
                .with_system_prompt("You are a doorman.")
                .with_tool_arc(lookup_tool(args_seen.clone())),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("is the door open?"))
        .unwrap();
    bounded("turn", until("turn finished", || a.status().turns == 1)).await;

    assert_eq!(*args_seen.lock(), [json!({"key": "door"})]);
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0]["model"], "test-model");
    let offered: Vec<_> = bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(offered.contains(&"lookup".to_owned()), "{offered:?}");
    let first = messages(&bodies[0]);
    assert_eq!(
        first,
        [
            json!({"role": "system", "content": "You are a doorman."}),
            json!({"role": "user", "content": "[api] is the door open?"}),
        ]
    );
    let second = messages(&bodies[1]);
    assert_eq!(second.len(), 4, "{second:#?}");
    assert_eq!(second[..2], first[..]);
    assert_eq!(second[2]["role"], "assistant");
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_abc123");
    assert_eq!(second[2]["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(
        second[3],
        json!({"role": "tool", "tool_call_id": "call_abc123",
               "content": json!({"door": "open", "asked": "door"}).to_string()})
    );

    let out = only_outcome(&journal, "a");
    assert_eq!(out.reason, TerminationReason::Answered);
    assert_eq!(
        (out.iterations, out.answer.as_deref()),
        (2, Some("The door is open."))
    );
    let s = a.status();
    assert_eq!(s.tokens_used, 11 + 7 + 20 + 5, "usage of both responses");
    assert_eq!(
        (s.state, s.consecutive_errors),
        (AgentState::WaitingForEvent, 0)
    );
}

#[actix_rt::test]
async fn openai_json_fallback_tool_calling_round_trip_through_an_agent() {
    let server = Server::start(vec![
        completion(
            json!({"role": "assistant",
                   "content": "{\"tool\": \"lookup\", \"parameters\": {\"key\": \"door\"}}"}),
            "stop",
            30,
            12,
        ),
        completion(
            json!({"role": "assistant", "content": "It is open."}),
            "stop",
            50,
            4,
        ),
    ])
    .await;
    let (team, journal) = team(WardenConfig::default());
    let args_seen = Arc::new(Mutex::new(Vec::new()));
    let provider =
        Arc::new(OpenAiCompatible::new(config(&server, ToolFormat::JsonFallback)).unwrap());
    let a = team
        .spawn(
            AgentSpec::assistant("a", provider)
                .with_system_prompt("You are a doorman.")
                .with_tool_arc(lookup_tool(args_seen.clone())),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("is the door open?"))
        .unwrap();
    bounded("turn", until("turn finished", || a.status().turns == 1)).await;

    assert_eq!(*args_seen.lock(), [json!({"key": "door"})]);
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2);
    for body in &bodies {
        assert!(body.get("tools").is_none(), "{body}");
    }
    let second = messages(&bodies[1]);
    let roles: Vec<_> = second.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "system", "user", "assistant", "user"]);
    assert_eq!(second[0]["content"], "You are a doorman.");
    assert!(second[1]["content"]
        .as_str()
        .unwrap()
        .contains("- lookup: Looks a key up"));
    let call: Value = serde_json::from_str(second[3]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        call,
        json!({"tool": "lookup", "parameters": {"key": "door"}})
    );
    assert_eq!(
        second[4]["content"],
        format!(
            "[TOOL RESULT: lookup]\n{}",
            json!({"door": "open", "asked": "door"})
        )
    );
    for m in &second {
        assert!(m.get("tool_calls").is_none() && m.get("tool_call_id").is_none());
    }

    // Warden's own history stays in native form.
    let history = a.record().history;
    let tools = tool_messages(&history);
    assert_eq!(tools.len(), 1);
    let call_id = tools[0].tool_call_id.clone().unwrap();
    assert!(history.iter().any(|m| m
        .tool_calls
        .iter()
        .any(|c| c.id == call_id && c.function.name == "lookup")));

    let out = only_outcome(&journal, "a");
    assert_eq!(
        (out.reason, out.answer.as_deref()),
        (TerminationReason::Answered, Some("It is open."))
    );
    assert_eq!(a.status().tokens_used, 30 + 12 + 50 + 4);
}

/// Halts `a` while its one request is open on `server`: the connection is closed, the agent is
/// stopped, no tool ran and the request is not retried.
async fn halt_cuts_the_request(
    a: &AgentHandle,
    server: &mut Server,
    args_seen: &Mutex<Vec<serde_json::Value>>,
) {
    bounded(
        "halt",
        a.halt(HaltCause::Operator {
            operator: "op".into(),
        }),
    )
    .await;
    server.client_closed().await;
    assert_eq!(a.state(), AgentState::Stopped);
    assert!(args_seen.lock().is_empty(), "no tool ran");
    assert_eq!(server.bodies().len(), 1, "no retry after the halt");
}

#[actix_rt::test]
async fn openai_halt_while_the_server_stalls_closes_the_connection_and_runs_no_tool() {
    let mut server = Server::start(vec![vec![Step::AwaitClose]]).await;
    let (team, _journal) = team(WardenConfig::default());
    let args_seen = Arc::new(Mutex::new(Vec::new()));
    let provider = Arc::new(OpenAiCompatible::new(config(&server, ToolFormat::Native)).unwrap());
    let a = team
        .spawn(AgentSpec::assistant("a", provider).with_tool_arc(lookup_tool(args_seen.clone())))
        .unwrap();
    a.try_send_event(UserEvent::new("is the door open?"))
        .unwrap();
    bounded(
        "request reached the server",
        until("request seen", || server.bodies().len() == 1),
    )
    .await;
    assert_eq!(a.state(), AgentState::Executing);

    halt_cuts_the_request(&a, &mut server, &args_seen).await;
    let history = a.record().history;
    assert!(
        history.iter().all(|m| m.role == ChatRole::User),
        "nothing came back from the model: {history:#?}"
    );
    assert_eq!(a.status().tokens_used, 0);
}

/// Issue 4: a halt during a slow *stream* — the stream already delivered the start of a tool call —
/// closes the connection, and the half-received tool call never runs.
#[actix_rt::test]
async fn openai_halt_during_a_slow_stream_closes_the_connection_and_runs_no_tool() {
    let mut server = Server::start(vec![stream_then_stall()]).await;
    let (team, _journal) = team(WardenConfig::default());
    let args_seen = Arc::new(Mutex::new(Vec::new()));
    let config = OpenAiConfig {
        stream: true,
        ..config(&server, ToolFormat::Native)
    };
    let provider = Arc::new(OpenAiCompatible::new(config).unwrap());
    let a = team
        .spawn(AgentSpec::assistant("a", provider).with_tool_arc(lookup_tool(args_seen.clone())))
        .unwrap();
    a.try_send_event(UserEvent::new("is the door open?"))
        .unwrap();
    bounded(
        "request reached the server",
        until("request seen", || server.bodies().len() == 1),
    )
    .await;
    assert_eq!(server.bodies()[0]["stream"], json!(true));
    halt_cuts_the_request(&a, &mut server, &args_seen).await;
    assert!(a.record().history.iter().all(|m| m.tool_calls.is_empty()));
}

// ---- tool retries (design 001: 4 attempts, 1 s, ×2, 10 s cap, jitter; retryable errors only) ----

/// A tool that fails with `error` on its first `failures` calls, then succeeds; counts its calls.
/// `idempotent` and `own` (its own `max_attempts`) are its retry declarations.
fn flaky_with(
    name: &str,
    category: ToolCategory,
    error: &'static str,
    failures: usize,
    idempotent: bool,
    own: Option<u32>,
) -> (Arc<dyn Tool>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let mut tool = FnTool::new(name, "flaky", category, move |_args, _ctx| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if n < failures {
            Err(ToolError::Failed(error.into()))
        } else {
            Ok(json!({"success": true}))
        })
    });
    if idempotent {
        tool = tool.idempotent();
    }
    if let Some(max_attempts) = own {
        tool = tool.with_retry(ToolRetryConfig {
            max_attempts,
            ..ToolRetryConfig::default()
        });
    }
    (Arc::new(tool), calls)
}

/// [`flaky_with`] with the runner's retries.
fn flaky(
    name: &str,
    category: ToolCategory,
    error: &'static str,
    failures: usize,
) -> (Arc<dyn Tool>, Arc<AtomicUsize>) {
    flaky_with(name, category, error, failures, false, None)
}

/// `(attempt, max_attempts, delay_ms)` of every `ToolRetried` of `key`.
fn retried(journal: &MemoryJournal, key: &str) -> Vec<(u32, u32, u64)> {
    journal
        .events_of(key)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::ToolRetried {
                attempt,
                max_attempts,
                delay_ms,
                ..
            } => Some((attempt, max_attempts, delay_ms)),
            _ => None,
        })
        .collect()
}

/// The design's retry settings without jitter (so the waits can be compared), with breakers that
/// would lock the agent out and open the tool's circuit at the first failure counted.
fn strict_retry_config() -> WardenConfig {
    let mut config = WardenConfig::default();
    config.tools.retry.jitter = false;
    config.tools.circuit_failure_threshold = std::num::NonZeroU32::new(1).unwrap();
    config.safety.breakers.max_consecutive_errors = std::num::NonZeroU32::new(1).unwrap();
    config
}

/// A call that fails twice with a retryable error ("connection reset") and then succeeds is tried
/// three times, 1 s then 2 s apart, each retry journaled; the breakers see only its final outcome,
/// a success: with one failure enough to lock the agent out and open the circuit, neither happens.
#[actix_rt::test]
async fn a_retryable_tool_error_is_retried_with_backoff_and_the_breakers_see_only_the_success() {
    tokio::time::pause();
    let (team, journal) = team(strict_retry_config());
    let (tool, calls) = flaky(
        "fetch",
        ToolCategory::SafeChain,
        "connection reset by peer",
        2,
    );
    let model = Arc::new(
        ScriptedProvider::new([
            ScriptStep::call("fetch", json!({})),
            ScriptStep::reply("done"),
        ])
        .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(tool))
        .unwrap();
    let started = tokio::time::Instant::now();
    one_turn(&a, "fetch it").await;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "waited 1 s + 2 s"
    );
    assert_eq!(count(&calls), 3);
    assert_eq!(retried(&journal, "a"), [(1, 4, 1000), (2, 4, 2000)]);
    assert!(errors_counted(&journal, "a").is_empty());
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::ToolCircuitChanged { .. }
        )),
        0
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::ToolFinished { ok: true, .. }
        )),
        1
    );
    let out = only_outcome(&journal, "a");
    assert_eq!(
        (out.reason, out.answer.as_deref()),
        (TerminationReason::Answered, Some("done"))
    );
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    replay_matches(&journal, &a);
}

/// A call that keeps failing with a retryable error is made 4 times (waits 1, 2, 4 s) and then
/// counted once: one error (`consecutive_errors` 1), one circuit failure (opened after 1).
#[actix_rt::test]
async fn a_call_that_keeps_failing_is_made_four_times_and_counted_once() {
    tokio::time::pause();
    let mut config = strict_retry_config();
    config.safety.breakers.max_consecutive_errors = std::num::NonZeroU32::new(2).unwrap();
    let (team, journal) = team(config);
    let (tool, calls) = flaky(
        "fetch",
        ToolCategory::SafeChain,
        "503: service temporarily unavailable",
        usize::MAX,
    );
    let model = Arc::new(
        ScriptedProvider::new([
            ScriptStep::call("fetch", json!({})),
            ScriptStep::reply("gave up"),
        ])
        .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(tool))
        .unwrap();
    one_turn(&a, "fetch it").await;
    assert_eq!(count(&calls), 4);
    assert_eq!(
        retried(&journal, "a"),
        [(1, 4, 1000), (2, 4, 2000), (3, 4, 4000)]
    );
    assert_eq!(
        errors_counted(&journal, "a"),
        [(
            1,
            "tool fetch failed: 503: service temporarily unavailable".to_owned()
        )]
    );
    let circuit: Vec<String> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::ToolCircuitChanged { transition, .. } => Some(transition),
            _ => None,
        })
        .collect();
    assert_eq!(circuit, ["opened after 1 failures"]);
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::ToolFinished { .. }
        )),
        1
    );
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    replay_matches(&journal, &a);
}

/// Which calls are retried: a DANGEROUS tool only when it declares itself idempotent; an error
/// that is not retryable never; a tool's own settings over the team's.
#[actix_rt::test]
async fn dangerous_tools_are_retried_only_when_idempotent_and_only_retryable_errors_are() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.tools.circuit_failure_threshold = std::num::NonZeroU32::new(100).unwrap();
    config.safety.breakers.max_consecutive_errors = std::num::NonZeroU32::new(100).unwrap();
    config.safety.breakers.repeated_failure_threshold = 100;
    let (team, journal) = team(config);
    // name, category, error, idempotent, own max_attempts, calls expected
    type Case = (
        &'static str,
        ToolCategory,
        &'static str,
        bool,
        Option<u32>,
        usize,
    );
    let cases: [Case; 5] = [
        (
            "rm",
            ToolCategory::Dangerous,
            "connection reset",
            false,
            None,
            1,
        ),
        (
            "put",
            ToolCategory::Dangerous,
            "connection reset",
            true,
            None,
            4,
        ),
        (
            "read",
            ToolCategory::SafeChain,
            "no such file",
            false,
            None,
            1,
        ),
        (
            "say",
            ToolCategory::Terminal,
            "rate limit exceeded",
            false,
            None,
            4,
        ),
        (
            "poll",
            ToolCategory::SafeChain,
            "try again later",
            false,
            Some(2),
            2,
        ),
    ];
    for (i, (name, category, error, idempotent, own, expected)) in cases.into_iter().enumerate() {
        let (tool, calls) = flaky_with(name, category, error, usize::MAX, idempotent, own);
        let key = format!("a{i}");
        let model = Arc::new(
            ScriptedProvider::new([ScriptStep::call(name, json!({})), ScriptStep::reply("ok")])
                .with_fallback(|_| ScriptStep::reply("ok")),
        );
        let a = team
            .spawn(AgentSpec::assistant(key.as_str(), model).with_tool_arc(tool))
            .unwrap();
        one_turn(&a, "go").await;
        assert_eq!(count(&calls), expected, "{name}");
        assert_eq!(retried(&journal, &key).len(), expected - 1, "{name}");
    }
}

/// A halt while a call waits for its next attempt ends the wait at once: the tool is not called
/// again, however long the clock runs on, and the call has no result.
#[actix_rt::test]
async fn a_halt_during_the_backoff_ends_it_at_once_and_the_tool_is_not_called_again() {
    tokio::time::pause();
    let (team, journal) = team(strict_retry_config());
    let (tool, calls) = flaky(
        "fetch",
        ToolCategory::SafeChain,
        "connection refused",
        usize::MAX,
    );
    let model = Arc::new(
        ScriptedProvider::new([ScriptStep::call("fetch", json!({}))])
            .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(tool))
        .unwrap();
    a.try_send_event(UserEvent::new("fetch it")).unwrap();
    // The first retry is journaled right before its 1 s wait starts.
    until("first retry", || !retried(&journal, "a").is_empty()).await;
    assert_eq!(count(&calls), 1);
    let ack = a.halt(op());
    tokio::time::advance(Duration::from_secs(60)).await;
    let ack = ack.await;
    assert_eq!(ack.state, AgentState::Stopped);
    settle(50).await;
    tokio::time::advance(Duration::from_secs(60)).await;
    settle(50).await;
    assert_eq!(count(&calls), 1, "no attempt after the halt");
    assert_eq!(retried(&journal, "a"), [(1, 4, 1000)]);
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::ToolFinished { .. }
        )),
        0
    );
    assert!(errors_counted(&journal, "a").is_empty());
    // The halt settled the event (discarded) and journaled no turn's end.
    assert!(outcomes(&journal, "a").is_empty());
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1);
    replay_matches(&journal, &a);
}
