//! Safety, end to end through real agents (design docs 002–004): the repetition alert and lockout, the
//! stuck stop, the error cascade, token/cost/team budgets, loop caps and the wall clock through the
//! limit checkpoint (every `safety.on_limit.mode`, the intervention bus, the forced wrap-up and its
//! decision-enabling fallback text), delegation limits through the checkpoint, the SafetyMonitor's
//! report, `safety_checks(false)`, and the journal replaying to the live record.
//!
//! Everything runs on the test's arbiter with paused time; nothing sleeps on the wall clock.
mod common;
use common::*;
use serde_json::json;
use std::{
    collections::BTreeMap,
    num::NonZeroU32,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use warden::protocols::{
    Answer, Breaker, ChatRole, DelegationOutcome, DelegationRefusal, FinishReason, Intervention,
    LimitDecision, LimitKind, LimitReason, Lockout, ModelPrice, OnLimitMode, ToolCall, TurnOutcome,
    Usage,
};
use warden::*;
use warden_actors::context::estimate_tokens;
use warden_actors::safety::{AnswerError, ChannelInterventionBus, REPETITION_ALERT};

// ---- helpers ------------------------------------------------------------------------------------

fn key(k: &str) -> AgentKey {
    AgentKey::from(k)
}

/// A tool call whose argument text is exactly `args` (so the key order is the test's, not serde's).
fn raw_call(id: impl Into<String>, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        kind: "function".into(),
        function: warden::protocols::FunctionCall {
            name: name.into(),
            arguments: args.into(),
        },
    }
}

/// One model response carrying `calls` (parallel tool calls when there are several), no usage.
fn respond(calls: Vec<ToolCall>) -> ScriptStep {
    ScriptStep::Respond(LlmResponse {
        message: ChatMessage::assistant_tool_calls(None, calls),
        finish_reason: FinishReason::ToolCalls,
        usage: Usage::default(),
    })
}

/// A final answer reporting exactly this usage.
fn reply_using(text: &str, prompt_tokens: u64, completion_tokens: u64) -> ScriptStep {
    ScriptStep::Respond(LlmResponse {
        message: ChatMessage::assistant(text),
        finish_reason: FinishReason::Stop,
        usage: Usage {
            prompt_tokens,
            completion_tokens,
            estimated: false,
        },
    })
}

fn calls_of(stats: &ScriptStats) -> u64 {
    stats.calls.load(Ordering::SeqCst)
}

async fn turns(agent: &AgentHandle, n: u64) {
    until(&format!("{} finished {n} turns", agent.key()), || {
        agent.status().turns == n
    })
    .await;
}

/// The agent's last turn outcome, without the correlation (its event ids and usage: tested in
/// tests/agent.rs), so that tests compare what they are about.
fn last_outcome(journal: &MemoryJournal, agent: &str) -> TurnOutcome {
    let mut outcome = outcomes(journal, agent)
        .pop()
        .expect("no TurnFinished journaled");
    outcome.events.clear();
    outcome.usage = Usage::default();
    outcome
}

type Decided = (LimitKind, f64, f64, LimitDecision);

fn decisions(journal: &MemoryJournal, agent: &str) -> Vec<Decided> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::LimitDecided {
                kind,
                current,
                configured,
                decision,
            } => Some((kind, current, configured, decision)),
            _ => None,
        })
        .collect()
}

fn denials(journal: &MemoryJournal, agent: &str) -> Vec<(LimitKind, f64, f64, LimitReason)> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::LimitDenied {
                kind,
                current,
                configured,
                reason,
            } => Some((kind, current, configured, reason)),
            _ => None,
        })
        .collect()
}

fn allowed(extension: u32, reason: LimitReason) -> LimitDecision {
    LimitDecision {
        allow: true,
        extension,
        reason,
        answered_by: None,
    }
}

fn refused(reason: LimitReason) -> LimitDecision {
    LimitDecision::refuse(reason)
}

/// The safety-relevant events of one agent, in journal order, as short tags.
fn safety_trace(journal: &MemoryJournal, agent: &str) -> Vec<String> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::ToolFinished { ok, .. } => Some(format!("tool {}", ok_or_failed(ok))),
            EventKind::ErrorCounted {
                consecutive_errors, ..
            } => Some(format!("errors {consecutive_errors}")),
            EventKind::SafetyAlert { .. } => Some("alert".into()),
            EventKind::LockedOut {
                breaker,
                consecutive_errors,
                ..
            } => Some(format!("locked out {breaker:?} at {consecutive_errors}")),
            _ => None,
        })
        .collect()
}

fn ok_or_failed(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "failed"
    }
}

/// A team whose limit checkpoint asks `bus`.
fn team_with_bus(
    config: WardenConfig,
    bus: Arc<ChannelInterventionBus>,
) -> (Supervisor, Arc<MemoryJournal>) {
    let journal = Arc::new(MemoryJournal::new());
    let team = Supervisor::builder(config, journal.clone())
        .intervention_bus(bus)
        .current_arbiter()
        .build();
    (team, journal)
}

/// `max_iterations_per_task = per_task` (with a larger per-tick cap, so the per-task one is hit) in
/// `mode`.
fn loop_config(mode: OnLimitMode, per_task: u32) -> WardenConfig {
    let mut config = WardenConfig::default();
    config.execution.max_iterations_per_tick = 10;
    config.safety.loop_.max_iterations_per_task = per_task;
    config.safety.on_limit.mode = mode;
    config
}

/// The wrap-up requests a looker received (the messages of each tool-less call).
type WrapUps = Arc<Mutex<Vec<Vec<ChatMessage>>>>;

/// A model that calls `look` with new arguments on every call that offers tools (never "stuck"), and
/// answers the tool-less wrap-up call with `wrap_up`.
fn looker(wrap_up: ScriptStep) -> (Arc<ScriptedProvider>, WrapUps) {
    let wrap_ups: WrapUps = Arc::default();
    let seen = wrap_ups.clone();
    let n = AtomicUsize::new(0);
    let model = ScriptedProvider::new([]).with_fallback(move |req| {
        if req.tools.is_empty() {
            seen.lock().unwrap().push(req.messages.clone());
            return wrap_up.clone();
        }
        let i = n.fetch_add(1, Ordering::SeqCst);
        ScriptStep::call("look", json!({ "at": i }))
    });
    (Arc::new(model), wrap_ups)
}

const SCOUT_PROMPT: &str = "You are a scout.";

/// The stop cause the wrap-up call carries in its system prompt.
fn wrap_up_cause(kind: &str, reason: &str) -> String {
    format!(
        "You must stop now: the limit on {kind} was reached and not extended ({reason}). Do not call any tool. In a few sentences, say what you have accomplished, where any outputs are, and what remains to be done."
    )
}

// ---- 1. repetition --------------------------------------------------------------------------------

/// Three identical failing calls (same tool, same arguments written in a different key order) inject
/// the design's alert as an internal system message and journal `SafetyAlert`; the fourth identical
/// failure locks the agent out with breaker `Repetition` — and not one call before.
#[actix_rt::test]
async fn three_identical_failures_alert_and_the_fourth_locks_out_as_repetition() {
    tokio::time::pause();
    assert_eq!(
        REPETITION_ALERT,
        "SYSTEM ALERT: You are repeating a failed action. STOP and analyze why."
    );
    let (team, journal) = team(WardenConfig::default());
    let (read, read_calls) = counting_tool("read", ToolCategory::SafeChain, true);
    let requests: Arc<Mutex<Vec<Vec<ChatMessage>>>> = Arc::default();
    let seen = requests.clone();
    let n = AtomicUsize::new(0);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        seen.lock().unwrap().push(req.messages.clone());
        let i = n.fetch_add(1, Ordering::SeqCst);
        let args = if i.is_multiple_of(2) {
            r#"{"a":1,"b":2}"#
        } else {
            r#"{"b":2,"a":1}"#
        };
        respond(vec![raw_call(format!("c{i}"), "read", args)])
    }));
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(read))
        .unwrap();
    a.try_send_event(UserEvent::new("read it")).unwrap();
    until("locked out", || a.state() == AgentState::SafetyLockout).await;
    settle(20).await;

    assert_eq!(count(&read_calls), 4, "four identical failing calls ran");
    assert_eq!(calls_of(&stats), 4, "no LLM call after the lockout");
    assert_eq!(
        safety_trace(&journal, "a"),
        [
            "tool failed",
            "errors 1",
            "tool failed",
            "errors 2",
            "tool failed",
            "errors 3",
            "alert",
            "tool failed",
            "errors 4",
            "locked out Repetition at 4",
        ]
    );
    let s = a.status();
    assert_eq!(
        s.lockout,
        Some(Lockout {
            breaker: Breaker::Repetition,
            reason:
                "repeated a failed action after the system alert (4 identical failures in a row)"
                    .into()
        })
    );
    assert!(s.emergency_stop);
    assert_eq!(s.consecutive_errors, 4);
    let alerts: Vec<String> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::SafetyAlert { message } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(alerts, [REPETITION_ALERT]);

    // The alert sits in the history right after the third failure's result, as an internal system
    // message, and the fourth LLM call (only that one) saw it as its last message.
    let alert = ChatMessage::system(REPETITION_ALERT).internal();
    let history = a.record().history;
    let at = history.iter().position(|m| *m == alert).expect("alert");
    assert_eq!(history[at - 1].role, ChatRole::Tool);
    assert_eq!(history[at - 1].tool_call_id.as_deref(), Some("c2"));
    assert_eq!(history.iter().filter(|m| **m == alert).count(), 1);
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 4);
    for r in &requests[..3] {
        assert!(!r.contains(&alert), "alert before the third failure");
    }
    assert_eq!(requests[3].last(), Some(&alert));
    assert_eq!(
        last_outcome(&journal, "a"),
        TurnOutcome {
            reason: TerminationReason::SafetyLockout,
            iterations: 4,
            answer: None,
            limit_stopped: false,
            limit_kind: None,
            error: None,
            events: Vec::new(),
            usage: Usage::default(),
            truncated: false,
        }
    );
    replay_matches(&journal, &a);
}

/// Three identical failures then an answer: the alert is given, but nothing locks out.
#[actix_rt::test]
async fn three_identical_failures_alert_but_do_not_lock_out() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (read, read_calls) = counting_tool("read", ToolCategory::SafeChain, true);
    let model = model([
        respond(vec![raw_call("c0", "read", r#"{"a":1,"b":2}"#)]),
        respond(vec![raw_call("c1", "read", r#"{"b":2,"a":1}"#)]),
        respond(vec![raw_call("c2", "read", r#"{ "a" : 1, "b" : 2 }"#)]),
        ScriptStep::reply("I will stop and think"),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(read))
        .unwrap();
    a.try_send_event(UserEvent::new("read it")).unwrap();
    turns(&a, 1).await;
    assert_eq!(count(&read_calls), 3);
    assert_eq!(
        safety_trace(&journal, "a"),
        [
            "tool failed",
            "errors 1",
            "tool failed",
            "errors 2",
            "tool failed",
            "errors 3",
            "alert",
        ]
    );
    let s = a.status();
    assert_eq!(
        (s.state, s.emergency_stop, s.consecutive_errors),
        (AgentState::WaitingForEvent, false, 0)
    );
    assert_eq!(
        last_outcome(&journal, "a").reason,
        TerminationReason::Answered
    );
    replay_matches(&journal, &a);
}

/// The same tool with different arguments is not repetition: no alert, and the consecutive-error
/// stop trips at exactly the fifth failure.
#[actix_rt::test]
async fn the_same_tool_with_different_arguments_is_not_repetition() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (read, read_calls) = counting_tool("read", ToolCategory::SafeChain, true);
    let n = AtomicUsize::new(0);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        respond(vec![raw_call(
            format!("c{i}"),
            "read",
            &format!(r#"{{"b":2,"a":{i}}}"#),
        )])
    }));
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(read))
        .unwrap();
    a.try_send_event(UserEvent::new("read them")).unwrap();
    until("locked out", || a.state() == AgentState::SafetyLockout).await;
    assert_eq!(count(&read_calls), 5);
    let mut expected = Vec::new();
    for i in 1..=5 {
        expected.push("tool failed".to_owned());
        expected.push(format!("errors {i}"));
    }
    expected.push("locked out ConsecutiveErrors at 5".into());
    assert_eq!(safety_trace(&journal, "a"), expected);
    assert_eq!(
        a.status().lockout,
        Some(Lockout {
            breaker: Breaker::ConsecutiveErrors,
            reason: "Maximum consecutive errors reached (5)".into()
        })
    );
    replay_matches(&journal, &a);
}

// ---- 2. stuck -------------------------------------------------------------------------------------

/// Identical successful steps: two are fine; the same two again in a new task are fine too (the run
/// restarts per task); three in a row within one task stop the agent as stuck (SAFETY_LOCKOUT).
#[actix_rt::test]
async fn identical_successful_steps_lock_out_as_stuck_only_within_one_task() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let same = || ScriptStep::call("look", json!({"at": "the door"}));
    let model = model([
        same(),
        same(),
        ScriptStep::reply("a door"),
        same(),
        same(),
        ScriptStep::reply("still a door"),
        same(),
        same(),
        same(),
        ScriptStep::reply("never asked"),
    ]);
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("what is there?")).unwrap();
    turns(&a, 1).await;
    a.try_send_event(UserEvent::new("what is there?")).unwrap();
    turns(&a, 2).await;
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    assert!(a.status().lockout.is_none(), "2 identical steps are fine");

    a.try_send_event(UserEvent::new("and now?")).unwrap();
    until("stuck", || a.state() == AgentState::SafetyLockout).await;
    assert_eq!(count(&looks), 7);
    assert_eq!(
        calls_of(&stats),
        9,
        "no LLM call after the third identical step"
    );
    assert_eq!(
        a.status().lockout,
        Some(Lockout {
            breaker: Breaker::Stuck,
            reason: "stuck: the same tool call repeated 3 times in a row (safety.breakers.max_repeated_tool_steps = 3)".into()
        })
    );
    let reasons: Vec<_> = outcomes(&journal, "a").iter().map(|o| o.reason).collect();
    assert_eq!(
        reasons,
        [
            TerminationReason::Answered,
            TerminationReason::Answered,
            TerminationReason::SafetyLockout
        ]
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::LockedOut {
                breaker: Breaker::Stuck,
                consecutive_errors: 0,
                ..
            }
        )),
        1
    );
    replay_matches(&journal, &a);
}

// ---- 3. error cascade -----------------------------------------------------------------------------

/// LLM calls and tool calls are both operations of the error window (10, threshold 8). Three
/// responses with two failing parallel calls each, then one with four:
///
/// ```text
/// op:   1 2 3 | 4 5 6 | 7 8 9 | 10 11 12 13 14
///       G B B | G B B | G B B | G  B  B  B  B      (G = LLM call asking for tools, B = failed tool)
/// ```
/// Any 10 consecutive operations of the `G B B` pattern hold at most 7 failures, so nothing trips
/// through op 13 (window 4..13 = G B B G B B G B B B: 7). Op 14 makes the window 5..14 =
/// B B G B B G B B B B: 8 failures in the last 10 — the cascade trips there, at the 10th failed tool
/// call. (If only tool calls counted, it would have tripped at the 8th failure, op 12.)
#[actix_rt::test]
async fn the_error_cascade_trips_when_8_of_the_last_10_operations_failed() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(50).unwrap();
    config.tools.circuit_failure_threshold = NonZeroU32::new(100).unwrap();
    let (team, journal) = team(config);
    let (probe, probes) = counting_tool("probe", ToolCategory::SafeChain, true);
    let mut n = 0;
    let mut response = |k: usize| {
        let calls = (0..k)
            .map(|_| {
                n += 1;
                raw_call(format!("c{n}"), "probe", &format!(r#"{{"n":{n}}}"#))
            })
            .collect();
        respond(calls)
    };
    let script = vec![response(2), response(2), response(2), response(4)];
    let model =
        Arc::new(ScriptedProvider::new(script).with_fallback(|_| ScriptStep::reply("never asked")));
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(probe))
        .unwrap();
    a.try_send_event(UserEvent::new("probe everything"))
        .unwrap();
    until("locked out", || a.state() == AgentState::SafetyLockout).await;
    settle(20).await;

    assert_eq!(calls_of(&stats), 4, "4 LLM operations");
    assert_eq!(count(&probes), 10, "10 tool operations");
    let trace = safety_trace(&journal, "a");
    assert_eq!(trace.last().unwrap(), "locked out ErrorCascade at 10");
    assert_eq!(
        trace.iter().filter(|t| t.starts_with("errors")).count(),
        10,
        "the lockout came with the 10th failure (op 14), not before"
    );
    assert_eq!(trace[trace.len() - 2], "errors 10");
    assert_eq!(
        a.status().lockout,
        Some(Lockout {
            breaker: Breaker::ErrorCascade,
            reason: "error cascade: 8 failed operations in the last 10 (safety.breakers.error_window_threshold = 8, error_window = 10)".into()
        })
    );
    assert_eq!(
        last_outcome(&journal, "a"),
        TurnOutcome {
            reason: TerminationReason::SafetyLockout,
            iterations: 4,
            answer: None,
            limit_stopped: false,
            limit_kind: None,
            error: None,
            events: Vec::new(),
            usage: Usage::default(),
            truncated: false,
        }
    );
    replay_matches(&journal, &a);
}

/// Issue 31 item 10: the error-cascade window survives a restart. Seven failed operations (with
/// `max_consecutive_errors` out of the way), a restart from the journal file, then the eighth
/// failure trips the cascade (8 of the last 10) — not eight more. The restored record equals the
/// replay, window included; an unlock clears the window in the file too.
#[actix_rt::test]
async fn the_error_cascade_window_survives_a_restart_from_the_journal_file() {
    tokio::time::pause();
    let db = TempDb::new("window-restart");
    let mut config = WardenConfig::default();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(50).unwrap();
    let failing =
        || Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("model down")));
    {
        let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
        let team = Supervisor::on_current_arbiter(config.clone(), journal.clone());
        let a = team.spawn(AgentSpec::assistant("a", failing())).unwrap();
        for i in 0..7 {
            a.try_send_event(UserEvent::new(format!("e{i}"))).unwrap();
            turns(&a, i + 1).await;
        }
        assert_eq!(a.state(), AgentState::WaitingForEvent);
        assert_eq!(a.status().consecutive_errors, 7);
        team.shutdown().await;
        journal.close();
    }

    let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
    let records = journal.recover_records().unwrap();
    let team = Supervisor::on_current_arbiter(config, journal.clone());
    let a = team
        .spawn(AgentSpec::assistant("a", failing()).restored_from(records[0].clone()))
        .unwrap();
    a.try_send_event(UserEvent::new("the eighth")).unwrap();
    until("locked out", || a.state() == AgentState::SafetyLockout).await;
    assert_eq!(
        a.status().lockout,
        Some(Lockout {
            breaker: Breaker::ErrorCascade,
            reason: "error cascade: 8 failed operations in the last 8 (safety.breakers.error_window_threshold = 8, error_window = 10)".into()
        })
    );
    a.unlock("test").await.unwrap();
    until("journal caught up", || {
        journal.restore_records().unwrap() == vec![a.record()]
    })
    .await;
    team.shutdown().await;
    journal.close();
}

// ---- 4. budgets -----------------------------------------------------------------------------------

/// `tokens_per_agent = 1000`: the call that would exceed it is never made; the agent is STOPPED by
/// `BudgetExceeded` (journaled, in its status, as the turn's reason); the near-budget warning comes
/// once; a resume works, but the next call is stopped again.
#[actix_rt::test]
async fn the_token_budget_stops_the_call_that_would_exceed_it() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 1000;
    let (team, journal) = team(config);
    let model = model([
        reply_using("one", 500, 100),
        reply_using("two", 300, 90),
        ScriptStep::reply("never asked"),
    ]);
    let stats = model.stats();
    let a = team.assistant("a", model);

    a.try_send_event(UserEvent::new("e1")).unwrap();
    turns(&a, 1).await;
    assert_eq!(a.status().tokens_used, 600);
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::BudgetWarning { .. }
        )),
        0,
        "1000 - (0 + estimate) > reserve 512: no warning yet"
    );

    // Second call: 600 used + its estimate leaves ≤ 512: warned (once), and made.
    a.try_send_event(UserEvent::new("e2")).unwrap();
    turns(&a, 2).await;
    let est2 = estimate_tokens(&a.record().history[..3]);
    let warnings: Vec<String> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::BudgetWarning { message } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(
        warnings,
        [format!(
            "agent a budget nearly exhausted: about {} of 1000 tokens, 0.0000 of 0 cost after this call",
            600 + est2
        )]
    );
    assert_eq!(a.status().tokens_used, 990);
    assert_eq!(calls_of(&stats), 2);

    // Third: 990 + estimate > 1000. Never made.
    a.try_send_event(UserEvent::new("e3")).unwrap();
    until("stopped", || a.state() == AgentState::Stopped).await;
    turns(&a, 3).await;
    assert_eq!(calls_of(&stats), 2, "the exceeding call was never made");
    let est3 = estimate_tokens(&a.record().history);
    let reason = format!(
        "token budget exhausted: 990 used + about {est3} for this call > 1000 (safety.budget.tokens_per_agent)"
    );
    let stopped_by = Lockout {
        breaker: Breaker::BudgetExceeded,
        reason: reason.clone(),
    };
    let s = a.status();
    assert_eq!(s.state, AgentState::Stopped);
    assert_eq!(s.stopped_by.as_ref(), Some(&stopped_by));
    assert!(
        !s.emergency_stop && s.lockout.is_none(),
        "a stop, not a lockout"
    );
    let stops = |j: &MemoryJournal| {
        count_events(
            j,
            "a",
            |k| matches!(k, EventKind::BreakerStopped { breaker: Breaker::BudgetExceeded, reason: r } if *r == reason),
        )
    };
    assert_eq!(stops(&journal), 1);
    assert_eq!(
        last_outcome(&journal, "a"),
        TurnOutcome {
            reason: TerminationReason::BudgetExceeded,
            iterations: 0,
            answer: None,
            limit_stopped: false,
            limit_kind: None,
            error: None,
            events: Vec::new(),
            usage: Usage::default(),
            truncated: false,
        }
    );
    assert_eq!(
        a.try_send_event(UserEvent::new("more"))
            .unwrap_err()
            .refusal,
        WorkRefusal::Stopped
    );

    // Resume works; the next call is stopped again (budgets survive a resume).
    a.resume("ops").await.unwrap();
    let s = a.status();
    assert_eq!((s.state, s.stopped_by), (AgentState::WaitingForEvent, None));
    a.try_send_event(UserEvent::new("e4")).unwrap();
    turns(&a, 4).await;
    assert_eq!(a.state(), AgentState::Stopped);
    assert_eq!(calls_of(&stats), 2);
    let est4 = estimate_tokens(&a.record().history);
    assert_eq!(
        a.status().stopped_by,
        Some(Lockout {
            breaker: Breaker::BudgetExceeded,
            reason: format!(
                "token budget exhausted: 990 used + about {est4} for this call > 1000 (safety.budget.tokens_per_agent)"
            ),
        })
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::BreakerStopped {
                breaker: Breaker::BudgetExceeded,
                ..
            }
        )),
        2
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::BudgetWarning { .. }
        )),
        1,
        "the near-budget warning is given once"
    );
    replay_matches(&journal, &a);
}

/// A cost budget priced by the price table, keyed by the provider's model name ("scripted").
#[actix_rt::test]
async fn the_cost_budget_uses_the_price_of_the_providers_model() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.budget.cost_per_agent = 1.0;
    let price = ModelPrice {
        prompt_per_1k: 0.5,
        completion_per_1k: 1.0,
    };
    config.safety.budget.prices.insert("scripted".into(), price);
    let (team, journal) = team(config);
    let model = model([
        reply_using("one", 1000, 250), // 0.5 + 0.25
        reply_using("two", 500, 0),    // 0.25
        ScriptStep::reply("never asked"),
    ]);
    assert_eq!(model.model(), "scripted");
    let stats = model.stats();
    let a = team.assistant("a", model);
    a.try_send_event(UserEvent::new("e1")).unwrap();
    turns(&a, 1).await;
    assert_eq!(a.status().cost_used, 0.75);
    a.try_send_event(UserEvent::new("e2")).unwrap();
    turns(&a, 2).await;
    assert_eq!(a.status().cost_used, 1.0);
    a.try_send_event(UserEvent::new("e3")).unwrap();
    turns(&a, 3).await;
    assert_eq!(calls_of(&stats), 2);
    let est3 = estimate_tokens(&a.record().history);
    let s = a.status();
    assert_eq!(s.state, AgentState::Stopped);
    assert_eq!(
        s.stopped_by,
        Some(Lockout {
            breaker: Breaker::BudgetExceeded,
            reason: format!(
                "cost budget exhausted: 1.0000 used + about {:.4} for this call > 1 (safety.budget.cost_per_agent)",
                price.cost(est3, 0)
            ),
        })
    );
    assert_eq!((s.tokens_used, s.cost_used), (1750, 1.0));
    let fleet = team.fleet_view();
    assert_eq!((fleet.tokens, fleet.cost), (1750, 1.0));
    assert_eq!(
        last_outcome(&journal, "a").reason,
        TerminationReason::BudgetExceeded
    );
    replay_matches(&journal, &a);
}

/// `tokens_per_team = 1000`: agent b's first call is made (and warned, once for the team); then the
/// team's 995 tokens stop both agents' next calls. The fleet view adds up.
#[actix_rt::test]
async fn the_team_budget_stops_every_agent_and_the_fleet_view_adds_up() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_team = 1000;
    let (team, journal) = team(config);
    let ma = model([
        reply_using("a one", 500, 100),
        ScriptStep::reply("never asked"),
    ]);
    let mb = model([
        reply_using("b one", 300, 95),
        ScriptStep::reply("never asked"),
    ]);
    let (sa, sb) = (ma.stats(), mb.stats());
    let a = team.assistant("a", ma);
    let b = team.assistant("b", mb);

    a.try_send_event(UserEvent::new("e1")).unwrap();
    turns(&a, 1).await;
    b.try_send_event(UserEvent::new("e1")).unwrap();
    turns(&b, 1).await;
    let est_b = estimate_tokens(&b.record().history[..1]);
    let warnings: Vec<(AgentKey, String)> = journal
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::BudgetWarning { message } => Some((e.agent, message)),
            _ => None,
        })
        .collect();
    assert_eq!(
        warnings,
        [(
            key("b"),
            format!(
                "team budget nearly exhausted: {} of 1000 tokens, 0.0000 of 0 cost",
                600 + est_b
            )
        )]
    );
    let fleet = team.fleet_view();
    assert_eq!(
        (fleet.tokens, fleet.token_limit, fleet.agents_total),
        (995, 1000, 2)
    );
    assert_eq!(
        fleet.tokens,
        a.status().tokens_used + b.status().tokens_used
    );
    assert_eq!((a.status().tokens_used, b.status().tokens_used), (600, 395));

    for (agent, turn_no) in [(&a, 2), (&b, 2)] {
        agent.try_send_event(UserEvent::new("e2")).unwrap();
        turns(agent, turn_no).await;
        let est = estimate_tokens(&agent.record().history);
        assert_eq!(agent.state(), AgentState::Stopped);
        assert_eq!(
            agent.status().stopped_by,
            Some(Lockout {
                breaker: Breaker::BudgetExceeded,
                reason: format!(
                    "team token budget exhausted: 995 used + about {est} for this call > 1000 (safety.budget.tokens_per_team)"
                ),
            })
        );
        assert_eq!(
            last_outcome(&journal, agent.key().as_str()).reason,
            TerminationReason::BudgetExceeded
        );
    }
    assert_eq!((calls_of(&sa), calls_of(&sb)), (1, 1));
    let fleet = team.fleet_view();
    assert_eq!((fleet.tokens, fleet.agents_locked_out), (995, 0));
    assert_eq!(
        journal
            .events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::BudgetWarning { .. }))
            .count(),
        1,
        "the team warning is given once"
    );
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

/// Issue 10 item 6: budgets survive a restart. Usage is journaled (`usage_recorded`, one per model
/// call), so an agent restored from the SQLite file starts from the tokens and cost it had spent:
/// its status says so, the team is charged with them again, and the per-agent and team budgets
/// stop at the same point as without the restart. The restored record equals the live one.
#[actix_rt::test]
async fn spent_budgets_survive_a_restart_from_the_journal_file() {
    tokio::time::pause();
    let db = TempDb::new("budget-restart");
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 1000;
    config.safety.budget.tokens_per_team = 995;
    let price = ModelPrice {
        prompt_per_1k: 0.5,
        completion_per_1k: 1.0,
    };
    config.safety.budget.prices.insert("scripted".into(), price);

    let (tokens, cost) = {
        let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
        let team = Supervisor::on_current_arbiter(config.clone(), journal.clone());
        let model = model([reply_using("one", 500, 100), reply_using("two", 300, 90)]);
        let a = team.assistant("a", model);
        for (i, e) in ["e1", "e2"].into_iter().enumerate() {
            a.try_send_event(UserEvent::new(e)).unwrap();
            turns(&a, i as u64 + 1).await;
        }
        let s = a.status();
        assert_eq!(s.tokens_used, 990);
        assert!((s.cost_used - (0.4 + 0.19)).abs() < 1e-9, "{}", s.cost_used);
        let record = a.record();
        assert_eq!(record.usage.tokens(), 990);
        assert_eq!(record.usage.cost, s.cost_used);
        team.shutdown().await;
        journal.close();
        (s.tokens_used, s.cost_used)
    };

    let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
    let records = journal.recover_records().unwrap();
    assert_eq!(records[0].usage.tokens(), tokens);
    let team = Supervisor::on_current_arbiter(config, journal.clone());
    let ma = model([ScriptStep::reply("never asked")]);
    let mb = model([ScriptStep::reply("never asked")]);
    let (sa, sb) = (ma.stats(), mb.stats());
    let a = team
        .spawn(AgentSpec::assistant("a", ma).restored_from(records[0].clone()))
        .unwrap();
    let s = a.status();
    assert_eq!((s.tokens_used, s.cost_used), (tokens, cost));
    let fleet = team.fleet_view();
    assert_eq!((fleet.tokens, fleet.cost), (tokens, cost));

    // The per-agent budget stops a's next call exactly as it would have without the restart.
    a.try_send_event(UserEvent::new("e3")).unwrap();
    turns(&a, 3).await;
    let est = estimate_tokens(&a.record().history);
    assert_eq!(a.state(), AgentState::Stopped);
    assert_eq!(
        a.status().stopped_by,
        Some(Lockout {
            breaker: Breaker::BudgetExceeded,
            reason: format!(
                "token budget exhausted: 990 used + about {est} for this call > 1000 (safety.budget.tokens_per_agent)"
            ),
        })
    );
    // A new agent meets the team budget the restored one already spent.
    let b = team.assistant("b", mb);
    b.try_send_event(UserEvent::new("e1")).unwrap();
    turns(&b, 1).await;
    let est = estimate_tokens(&b.record().history);
    assert_eq!(
        b.status().stopped_by,
        Some(Lockout {
            breaker: Breaker::BudgetExceeded,
            reason: format!(
                "team token budget exhausted: 990 used + about {est} for this call > 995 (safety.budget.tokens_per_team)"
            ),
        })
    );
    assert_eq!((calls_of(&sa), calls_of(&sb)), (0, 0));
    // Replay (snapshot + events) equals live, usage included.
    until("journal caught up", || {
        journal.restore_records().unwrap() == vec![a.record(), b.record()]
    })
    .await;
    team.shutdown().await;
    journal.close();
}

// ---- 5. loop caps through the checkpoint ------------------------------------------------------------

/// `unattended`: the per-task cap is refused without asking, `limit_denied` is journaled, and one
/// tool-less wrap-up call (the stop cause in its system prompt) becomes the answer, marked
/// `limit_stopped`.
#[actix_rt::test]
async fn unattended_refuses_the_task_cap_and_the_wrap_up_becomes_the_answer() {
    tokio::time::pause();
    let (team, journal) = team(loop_config(OnLimitMode::Unattended, 2));
    let (model, wrap_ups) = looker(ScriptStep::reply("wrap-up: looked twice"));
    let stats = model.stats();
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(
            AgentSpec::assistant("a", model)
                .with_system_prompt(SCOUT_PROMPT)
                .with_tool(look),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    turns(&a, 1).await;

    assert_eq!(count(&looks), 2);
    assert_eq!(calls_of(&stats), 3, "two loop calls and the wrap-up");
    assert_eq!(
        decisions(&journal, "a"),
        [(
            LimitKind::IterationsPerTask,
            3.0,
            2.0,
            refused(LimitReason::Unattended)
        )]
    );
    assert_eq!(
        denials(&journal, "a"),
        [(
            LimitKind::IterationsPerTask,
            3.0,
            2.0,
            LimitReason::Unattended
        )]
    );
    assert_eq!(
        last_outcome(&journal, "a"),
        TurnOutcome {
            reason: TerminationReason::LimitStopped,
            iterations: 2,
            answer: Some("wrap-up: looked twice".into()),
            limit_stopped: true,
            limit_kind: Some(LimitKind::IterationsPerTask),
            error: None,
            events: Vec::new(),
            usage: Usage::default(),
            truncated: false,
        }
    );
    let wrap_ups = wrap_ups.lock().unwrap();
    assert_eq!(wrap_ups.len(), 1);
    assert_eq!(
        wrap_ups[0][0],
        ChatMessage::system(format!(
            "{SCOUT_PROMPT}\n\n{}",
            wrap_up_cause("iterations per task", "unattended")
        ))
    );
    assert_eq!(
        a.record().history.last(),
        Some(&ChatMessage::assistant("wrap-up: looked twice"))
    );
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::StateChanged {
                to: AgentState::WaitingForInput,
                ..
            }
        )),
        0,
        "unattended never asks"
    );
    replay_matches(&journal, &a);
}

/// A delegated task stopped by its cap: the delegator receives the wrap-up as the answer.
#[actix_rt::test]
async fn a_delegator_receives_the_wrap_up_of_a_limit_stopped_delegate() {
    tokio::time::pause();
    let (team, journal) = team(loop_config(OnLimitMode::Unattended, 2));
    let a = team.assistant(
        "a",
        model([
            delegate("b", "scout the caves"),
            ScriptStep::reply("a relays"),
        ]),
    );
    let (model, _) = looker(ScriptStep::reply("b: looked twice, caves half done"));
    let (look, _) = counting_tool("look", ToolCategory::SafeChain, false);
    let b = team
        .spawn(AgentSpec::sub_agent("b", "a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    turns(&a, 1).await;
    let b_outcome = last_outcome(&journal, "b");
    assert!(b_outcome.limit_stopped);
    assert_eq!(b_outcome.limit_kind, Some(LimitKind::IterationsPerTask));
    assert_eq!(
        endings(&journal, "a"),
        [(key("b"), DelegationOutcome::Completed)]
    );
    let result = a
        .record()
        .history
        .into_iter()
        .find(|m| m.role == ChatRole::Tool)
        .unwrap();
    assert_eq!(
        result.content.as_deref(),
        Some(
            json!({"agent": "b", "answer": "b: looked twice, caves half done"})
                .to_string()
                .as_str()
        )
    );
    assert_eq!(
        last_outcome(&journal, "a").answer.as_deref(),
        Some("a relays")
    );
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

const UNATTENDED_FALLBACK: &str = "Stopped: the limit on iterations per task was reached (3 against a configured 2) and not extended (unattended). To allow more, raise `safety.loop.max_iterations_per_task` above 2, or set `safety.on_limit.mode` to \"interactive\" (ask an operator) or \"auto_extend\" (extend automatically). Partial results are available.";

async fn wrap_up_that(wrap_up: ScriptStep) -> (TurnOutcome, AgentHandle, Arc<MemoryJournal>) {
    let (team, journal) = team(loop_config(OnLimitMode::Unattended, 2));
    let (model, wrap_ups) = looker(wrap_up);
    let (look, _) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    turns(&a, 1).await;
    assert_eq!(wrap_ups.lock().unwrap().len(), 1, "one wrap-up attempt");
    (last_outcome(&journal, "a"), a, journal)
}

/// A wrap-up cut by the model's token limit (it gets no max-tokens recovery) is delivered marked
/// `truncated`; a complete one is not.
#[actix_rt::test]
async fn a_wrap_up_cut_by_max_tokens_is_marked_truncated() {
    tokio::time::pause();
    for (finish_reason, truncated) in [(FinishReason::Length, true), (FinishReason::Stop, false)] {
        let step = ScriptStep::Respond(LlmResponse {
            message: ChatMessage::assistant("did two looks, then"),
            finish_reason,
            usage: Usage::default(),
        });
        let (outcome, _, _) = wrap_up_that(step).await;
        assert_eq!(outcome.answer.as_deref(), Some("did two looks, then"));
        assert!(outcome.limit_stopped);
        assert_eq!(outcome.truncated, truncated, "{finish_reason:?}");
    }
}

/// The wrap-up call fails, or answers nothing: the turn ends with the decision-enabling text (which
/// limit, its value, the key to raise, the mode to set, whether partial results exist).
#[actix_rt::test]
async fn a_failed_or_empty_wrap_up_ends_with_the_decision_enabling_text() {
    tokio::time::pause();
    for wrap_up in [
        ScriptStep::fail("model down"),
        ScriptStep::reply(""),
        ScriptStep::reply("  \n"),
    ] {
        let (outcome, a, journal) = wrap_up_that(wrap_up.clone()).await;
        assert_eq!(
            outcome,
            TurnOutcome {
                reason: TerminationReason::LimitStopped,
                iterations: 2,
                answer: None,
                limit_stopped: true,
                limit_kind: Some(LimitKind::IterationsPerTask),
                error: Some(UNATTENDED_FALLBACK.into()),
                events: Vec::new(),
                usage: Usage::default(),
                truncated: false,
            },
            "{wrap_up:?}"
        );
        assert_eq!(a.state(), AgentState::WaitingForEvent);
        assert_eq!(a.status().consecutive_errors, 0);
        replay_matches(&journal, &a);
    }
}

/// A delegated task whose wrap-up fails: the delegator should get the decision-enabling text (the
/// delegate's outbox is the delegation's reply).
#[actix_rt::test]
async fn a_delegator_receives_the_decision_enabling_text_when_the_wrap_up_fails() {
    tokio::time::pause();
    let (team, journal) = team(loop_config(OnLimitMode::Unattended, 2));
    let a = team.assistant(
        "a",
        model([
            delegate("b", "scout the caves"),
            ScriptStep::reply("a relays"),
        ]),
    );
    let (model, _) = looker(ScriptStep::fail("model down"));
    let (look, _) = counting_tool("look", ToolCategory::SafeChain, false);
    team.spawn(AgentSpec::sub_agent("b", "a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    turns(&a, 1).await;
    assert_eq!(
        last_outcome(&journal, "b").error.as_deref(),
        Some(UNATTENDED_FALLBACK)
    );
    let result = a
        .record()
        .history
        .into_iter()
        .find(|m| m.role == ChatRole::Tool)
        .unwrap();
    let content = result.content.unwrap_or_default();
    let error = serde_json::from_str::<serde_json::Value>(&content).unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        error,
        format!("delegation failed: {UNATTENDED_FALLBACK}"),
        "the delegator got: {content}"
    );
}

/// `auto_extend` with `auto_extend_times = 1`: one extension (the cap grows by its configured amount,
/// 2 → 4), then `auto_extend_exhausted`; the next task starts with fresh counts.
#[actix_rt::test]
async fn auto_extend_extends_the_task_cap_once_then_refuses() {
    tokio::time::pause();
    let mut config = loop_config(OnLimitMode::AutoExtend, 2);
    config.safety.on_limit.auto_extend_times = 1;
    let (team, journal) = team(config);
    let (model, _) = looker(ScriptStep::fail("wrap-up fails"));
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    turns(&a, 1).await;
    assert_eq!(count(&looks), 4, "2 + one extension of 2");
    assert_eq!(
        decisions(&journal, "a"),
        [
            (
                LimitKind::IterationsPerTask,
                3.0,
                2.0,
                allowed(1, LimitReason::AutoExtended)
            ),
            (
                LimitKind::IterationsPerTask,
                5.0,
                4.0,
                refused(LimitReason::AutoExtendExhausted)
            ),
        ]
    );
    assert_eq!(
        last_outcome(&journal, "a"),
        TurnOutcome {
            reason: TerminationReason::LimitStopped,
            iterations: 4,
            answer: None,
            limit_stopped: true,
            limit_kind: Some(LimitKind::IterationsPerTask),
            error: Some("Stopped: the limit on iterations per task was reached (5 against a configured 4) and not extended (auto_extend_exhausted). To allow more, raise `safety.loop.max_iterations_per_task` above 4, raise `safety.on_limit.auto_extend_times` (now 1), or set `safety.on_limit.mode = \"interactive\"` to be asked. Partial results are available.".into()),
            events: Vec::new(),
            usage: Usage::default(),
            truncated: false,
        }
    );

    // A new task: its own run, its own extension.
    a.try_send_event(UserEvent::new("scout again")).unwrap();
    turns(&a, 2).await;
    assert_eq!(count(&looks), 8);
    assert_eq!(
        decisions(&journal, "a")[2..],
        [
            (
                LimitKind::IterationsPerTask,
                3.0,
                2.0,
                allowed(1, LimitReason::AutoExtended)
            ),
            (
                LimitKind::IterationsPerTask,
                5.0,
                4.0,
                refused(LimitReason::AutoExtendExhausted)
            ),
        ]
    );
    replay_matches(&journal, &a);
}

fn question(current: u32, configured: u32) -> String {
    format!(
        "Agent a reached its limit on iterations per task: {current} against a configured {configured} (`safety.loop.max_iterations_per_task`). Allow it to continue for another {configured}? (yes/no)"
    )
}

fn intervention(id: u64, current: u32, configured: u32) -> Intervention {
    Intervention {
        id,
        agent: key("a"),
        run_id: "a#1".into(),
        kind: Some(LimitKind::IterationsPerTask),
        current: f64::from(current),
        configured: f64::from(configured),
        config_key: "safety.loop.max_iterations_per_task".into(),
        question: question(current, configured),
        permission: None,
    }
}

/// `interactive` with a bus: the agent waits in WAITING_FOR_INPUT (no LLM call) while the question is
/// pending; "yes" extends the cap and the loop goes on; "no" refuses and the wrap-up ends the task.
#[actix_rt::test]
async fn interactive_asks_the_operator_yes_continues_and_no_wraps_up() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let (team, journal) = team_with_bus(loop_config(OnLimitMode::Interactive, 2), bus.clone());
    let (model, _) = looker(ScriptStep::reply("wrap-up: four looks"));
    let stats = model.stats();
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();

    until("first ask", || !bus.pending().is_empty()).await;
    assert_eq!(bus.pending(), [intervention(1, 3, 2)]);
    assert_eq!(a.state(), AgentState::WaitingForInput);
    // Nothing moves while the operator thinks.
    tokio::time::advance(Duration::from_secs(3600)).await;
    settle(50).await;
    assert_eq!(a.state(), AgentState::WaitingForInput);
    assert_eq!((calls_of(&stats), count(&looks)), (2, 2));
    assert_eq!(bus.pending().len(), 1);

    bus.answer(1, Answer::Yes).unwrap();
    until("second ask", || {
        bus.pending().first().map(|p| p.id) == Some(2)
    })
    .await;
    // The second ask (after one extension): everything but the question's "another N" is pinned here;
    // that promise is checked by `the_operator_question_promises_the_extension_actually_granted`.
    let second = bus.pending();
    assert_eq!(second.len(), 1);
    assert_eq!(
        Intervention {
            question: String::new(),
            ..second[0].clone()
        },
        Intervention {
            question: String::new(),
            ..intervention(2, 5, 4)
        }
    );
    assert!(second[0].question.starts_with(
        "Agent a reached its limit on iterations per task: 5 against a configured 4 (`safety.loop.max_iterations_per_task`). Allow it to continue for another "
    ));
    assert_eq!(a.state(), AgentState::WaitingForInput);
    assert_eq!((calls_of(&stats), count(&looks)), (4, 4));

    bus.answer(2, Answer::No).unwrap();
    turns(&a, 1).await;
    assert!(bus.pending().is_empty());
    assert_eq!(calls_of(&stats), 5, "4 loop calls and the wrap-up");
    assert_eq!(
        decisions(&journal, "a"),
        [
            (
                LimitKind::IterationsPerTask,
                3.0,
                2.0,
                allowed(1, LimitReason::UserApproved)
            ),
            (
                LimitKind::IterationsPerTask,
                5.0,
                4.0,
                refused(LimitReason::UserRefused)
            ),
        ]
    );
    assert_eq!(
        denials(&journal, "a"),
        [(
            LimitKind::IterationsPerTask,
            5.0,
            4.0,
            LimitReason::UserRefused
        )]
    );
    let outcome = last_outcome(&journal, "a");
    assert_eq!(
        (
            outcome.reason,
            outcome.iterations,
            outcome.answer.as_deref(),
            outcome.limit_stopped
        ),
        (
            TerminationReason::LimitStopped,
            4,
            Some("wrap-up: four looks"),
            true
        )
    );
    let waits: Vec<(AgentState, AgentState, String)> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::StateChanged { from, to, cause }
                if from == AgentState::WaitingForInput || to == AgentState::WaitingForInput =>
            {
                Some((from, to, cause))
            }
            _ => None,
        })
        .collect();
    let ask = (
        AgentState::Executing,
        AgentState::WaitingForInput,
        "iterations_per_task".to_owned(),
    );
    let answered = (
        AgentState::WaitingForInput,
        AgentState::Executing,
        "operator answered".to_owned(),
    );
    assert_eq!(waits, [ask.clone(), answered.clone(), ask, answered]);
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    replay_matches(&journal, &a);
}

/// The operator is asked "Allow it to continue for another N?": a yes must grant exactly N more
/// iterations. Checked on the second ask, after one extension (cap 2 → 4).
#[actix_rt::test]
async fn the_operator_question_promises_the_extension_actually_granted() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let (team, _journal) = team_with_bus(loop_config(OnLimitMode::Interactive, 2), bus.clone());
    let (model, _) = looker(ScriptStep::reply("wrap-up"));
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    let promised = |iv: &Intervention| -> usize {
        let tail = iv.question.split("continue for another ").nth(1).unwrap();
        tail.split('?').next().unwrap().parse().unwrap()
    };
    until("first ask", || !bus.pending().is_empty()).await;
    let first = bus.pending().remove(0);
    assert_eq!(promised(&first), 2);
    bus.answer(first.id, Answer::Yes).unwrap();
    until("second ask", || {
        bus.pending().first().map(|p| p.id) == Some(2)
    })
    .await;
    assert_eq!(
        count(&looks),
        2 + 2,
        "the first yes granted what it promised"
    );
    let second = bus.pending().remove(0);
    let before = count(&looks);
    bus.answer(second.id, Answer::Yes).unwrap();
    until("third ask", || {
        bus.pending().first().map(|p| p.id) == Some(3)
    })
    .await;
    assert_eq!(
        count(&looks) - before,
        promised(&second),
        "question: {}",
        second.question
    );
    a.halt(op()).await;
}

/// `ask_timeout_seconds` elapsing (virtual time) refuses with `ask_timeout`; the ask is withdrawn, so
/// a late answer is an error.
#[actix_rt::test]
async fn an_unanswered_ask_times_out_and_is_withdrawn() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let mut config = loop_config(OnLimitMode::Interactive, 2);
    config.safety.on_limit.ask_timeout_seconds = 30.0;
    let (team, journal) = team_with_bus(config, bus.clone());
    let (model, _) = looker(ScriptStep::fail("wrap-up fails"));
    let (look, _) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    until("asked", || !bus.pending().is_empty()).await;
    let asked = tokio::time::Instant::now();
    assert_eq!(bus.pending(), [intervention(1, 3, 2)]);
    turns(&a, 1).await;
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited <= Duration::from_millis(30_100),
        "refused after {waited:?}"
    );
    assert!(bus.pending().is_empty(), "the timed-out ask is withdrawn");
    assert_eq!(bus.answer(1, Answer::Yes), Err(AnswerError::Unknown(1)));
    assert_eq!(
        decisions(&journal, "a"),
        [(
            LimitKind::IterationsPerTask,
            3.0,
            2.0,
            refused(LimitReason::AskTimeout)
        )]
    );
    assert_eq!(
        last_outcome(&journal, "a").error.as_deref(),
        Some("Stopped: the limit on iterations per task was reached (3 against a configured 2) and not extended (ask_timeout). To allow more, raise `safety.loop.max_iterations_per_task` above 2, raise `safety.on_limit.ask_timeout_seconds` (0 waits forever), or set `safety.on_limit.mode = \"auto_extend\"` to extend automatically. Partial results are available.")
    );
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    replay_matches(&journal, &a);
}

/// `interactive` with no bus (headless) refuses with `no_bus`, with its own decision-enabling text.
#[actix_rt::test]
async fn interactive_without_a_bus_refuses_with_no_bus() {
    tokio::time::pause();
    let (team, journal) = team(loop_config(OnLimitMode::Interactive, 2));
    let (model, _) = looker(ScriptStep::reply(""));
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    turns(&a, 1).await;
    assert_eq!(count(&looks), 2);
    assert_eq!(
        decisions(&journal, "a"),
        [(
            LimitKind::IterationsPerTask,
            3.0,
            2.0,
            refused(LimitReason::NoBus)
        )]
    );
    assert_eq!(
        last_outcome(&journal, "a").error.as_deref(),
        Some("Stopped: the limit on iterations per task was reached (3 against a configured 2) and not extended (no_bus). To allow more, raise `safety.loop.max_iterations_per_task` above 2, attach an operator (intervention bus) for `safety.on_limit.mode = \"interactive\"`, or set `safety.on_limit.mode = \"auto_extend\"` to extend automatically. Partial results are available.")
    );
    replay_matches(&journal, &a);
}

/// A SystemHalt while the question is pending: STOPPED at once, the question withdrawn (answering it
/// afterwards is an error), and no further LLM call.
#[actix_rt::test]
async fn a_halt_while_the_operator_is_asked_stops_at_once_and_withdraws_the_ask() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let (team, journal) = team_with_bus(loop_config(OnLimitMode::Interactive, 2), bus.clone());
    let (model, wrap_ups) = looker(ScriptStep::reply("never"));
    let stats = model.stats();
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    until("asked", || !bus.pending().is_empty()).await;
    assert_eq!(a.state(), AgentState::WaitingForInput);

    let ack = a.halt(op()).await;
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(a.state(), AgentState::Stopped);
    assert!(bus.pending().is_empty(), "the ask is withdrawn by the halt");
    assert_eq!(bus.answer(1, Answer::Yes), Err(AnswerError::Unknown(1)));

    tokio::time::advance(Duration::from_secs(3600)).await;
    settle(100).await;
    assert_eq!((calls_of(&stats), count(&looks)), (2, 2), "no further call");
    assert!(
        wrap_ups.lock().unwrap().is_empty(),
        "no wrap-up after a halt"
    );
    assert_eq!(a.state(), AgentState::Stopped);
    assert!(decisions(&journal, "a").is_empty(), "no decision was made");
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::StateChanged {
                from: AgentState::WaitingForInput,
                to: AgentState::Stopped,
                ..
            }
        )),
        1
    );
    replay_matches(&journal, &a);
}

// ---- 6. wall clock --------------------------------------------------------------------------------

/// `safety.timeout.task_seconds = 10` with a tool that takes 6 s (virtual): iteration 3 starts at
/// 12 s and goes through the checkpoint as `task_wall_clock`.
#[actix_rt::test]
async fn the_task_wall_clock_goes_through_the_checkpoint() {
    tokio::time::pause();
    let mut config = loop_config(OnLimitMode::Unattended, 50);
    config.safety.timeout.task_seconds = 10.0;
    let (team, journal) = team(config);
    let slow_calls = Arc::new(AtomicUsize::new(0));
    let counter = slow_calls.clone();
    let slow = FnTool::new("look", "slow", ToolCategory::SafeChain, move |_a, _c| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(6)).await;
            Ok(json!({"seen": "something"}))
        }
    });
    let (model, _) = looker(ScriptStep::reply("wrap-up: out of time"));
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(slow))
        .unwrap();
    let started = tokio::time::Instant::now();
    a.try_send_event(UserEvent::new("scout slowly")).unwrap();
    turns(&a, 1).await;
    assert!(started.elapsed() >= Duration::from_secs(12));
    assert_eq!(count(&slow_calls), 2);
    // tokio's timer has millisecond resolution and rounds a sleep's deadline up, so each 6 s sleep
    // ends at 6.001 s of paused time: the check sees 12.002 s.
    let decided = decisions(&journal, "a");
    assert_eq!(decided.len(), 1, "{decided:?}");
    let (kind, current, configured, decision) = decided[0].clone();
    assert_eq!(
        (kind, configured, decision),
        (
            LimitKind::TaskWallClock,
            10.0,
            refused(LimitReason::Unattended)
        )
    );
    assert!((12.0..12.01).contains(&current), "current = {current}");
    assert_eq!(
        denials(&journal, "a"),
        [(
            LimitKind::TaskWallClock,
            current,
            10.0,
            LimitReason::Unattended
        )]
    );
    assert_eq!(
        last_outcome(&journal, "a"),
        TurnOutcome {
            reason: TerminationReason::LimitStopped,
            iterations: 2,
            answer: Some("wrap-up: out of time".into()),
            limit_stopped: true,
            limit_kind: Some(LimitKind::TaskWallClock),
            error: None,
            events: Vec::new(),
            usage: Usage::default(),
            truncated: false,
        }
    );
    replay_matches(&journal, &a);
}

// ---- 7. delegation limits through the checkpoint --------------------------------------------------

fn auto_extend_once(mut config: WardenConfig) -> WardenConfig {
    config.safety.on_limit.mode = OnLimitMode::AutoExtend;
    config.safety.on_limit.auto_extend_times = 1;
    config
}

/// `max_agent_hops = 1`, auto_extend once: b's first delegation to c (hop 2) is allowed as
/// `auto_extended`; its second, in the same task, is refused (`HopLimit`).
#[actix_rt::test]
async fn auto_extend_allows_one_hop_overflow_per_task_then_refuses() {
    tokio::time::pause();
    let mut config = auto_extend_once(WardenConfig::default());
    config.safety.loop_.max_agent_hops = 1;
    let (team, journal) = team(config);
    let a = team.assistant(
        "a",
        model([delegate("b", "go deeper"), ScriptStep::reply("a done")]),
    );
    let b = team.sub_agent(
        "b",
        "a",
        model([
            delegate("c", "first"),
            delegate("c", "second"),
            ScriptStep::reply("b done"),
        ]),
    );
    let mc = model([ScriptStep::reply("c answers")]);
    let c_stats = mc.stats();
    let c = team.sub_agent("c", "b", mc);
    a.try_send_event(UserEvent::new("start")).unwrap();
    turns(&a, 1).await;

    assert!(decisions(&journal, "a").is_empty(), "a → b is hop 1");
    assert_eq!(
        decisions(&journal, "b"),
        [
            (
                LimitKind::AgentHops,
                2.0,
                1.0,
                allowed(1, LimitReason::AutoExtended)
            ),
            (
                LimitKind::AgentHops,
                2.0,
                1.0,
                refused(LimitReason::AutoExtendExhausted)
            ),
        ]
    );
    assert_eq!(
        refusals(&journal, "b"),
        [(key("c"), DelegationRefusal::HopLimit { hops: 2, max: 1 })]
    );
    assert_eq!(
        endings(&journal, "b"),
        [(key("c"), DelegationOutcome::Completed)]
    );
    assert_eq!((calls_of(&c_stats), c.status().turns), (1, 1));
    assert_eq!(
        last_outcome(&journal, "a").answer.as_deref(),
        Some("a done")
    );
    for h in [&a, &b, &c] {
        assert_eq!(h.status().active_sub_agents, 0);
        replay_matches(&journal, h);
    }
}

/// `sub_agent_budget = 1`, auto_extend once: of three parallel delegations, the second overflows and
/// is allowed (two run at once), the third is refused.
#[actix_rt::test]
async fn auto_extend_allows_one_sub_agent_overflow_then_refuses() {
    tokio::time::pause();
    let mut config = auto_extend_once(WardenConfig::default());
    config.delegation.sub_agent_budget = 1;
    config.safety.timeout.chain_seconds = 0.0;
    let (team, journal) = team(config);
    let calls = (0..3)
        .map(|i| {
            ToolCall::new(
                format!("call_{i}"),
                "delegate",
                &json!({"agent": format!("d{i}"), "task": "work"}),
            )
        })
        .collect();
    let a = team.assistant("a", model([respond(calls), ScriptStep::reply("done")]));
    for i in 0..3 {
        team.spawn(AgentSpec::sub_agent(
            format!("d{i}").as_str(),
            "a",
            model([ScriptStep::reply("ok").delayed(Duration::from_secs(10))]),
        ))
        .unwrap();
    }
    a.try_send_event(UserEvent::new("fan out")).unwrap();
    let mut peak = 0;
    until("a done", || {
        peak = peak.max(a.status().active_sub_agents);
        a.status().turns == 1
    })
    .await;
    assert_eq!(peak, 2, "the budget of 1 was extended once");
    assert_eq!(
        decisions(&journal, "a"),
        [
            (
                LimitKind::SubAgentBudget,
                2.0,
                1.0,
                allowed(1, LimitReason::AutoExtended)
            ),
            (
                LimitKind::SubAgentBudget,
                3.0,
                1.0,
                refused(LimitReason::AutoExtendExhausted)
            ),
        ]
    );
    assert_eq!(
        refusals(&journal, "a"),
        [(
            key("d2"),
            DelegationRefusal::SubAgentBudget {
                active: 2,
                budget: 1
            }
        )]
    );
    assert_eq!(
        endings(&journal, "a"),
        [
            (key("d0"), DelegationOutcome::Completed),
            (key("d1"), DelegationOutcome::Completed)
        ]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    replay_matches(&journal, &a);
}

/// `chain_seconds = 2`, auto_extend once: the wait is extended once (to 4 s), then the delegation
/// times out.
#[actix_rt::test]
async fn auto_extend_extends_the_chain_wait_once_then_times_out() {
    tokio::time::pause();
    let mut config = auto_extend_once(WardenConfig::default());
    config.safety.timeout.chain_seconds = 2.0;
    let (team, journal) = team(config);
    let a = team.assistant(
        "a",
        model([delegate("b", "slow task"), ScriptStep::reply("a gave up")]),
    );
    let b = team.sub_agent(
        "b",
        "a",
        model([ScriptStep::reply("too late").delayed(Duration::from_secs(30))]),
    );
    let started = tokio::time::Instant::now();
    a.try_send_event(UserEvent::new("go")).unwrap();
    turns(&a, 1).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_millis(4_200),
        "gave up after {waited:?}"
    );
    let decided: Vec<(LimitKind, f64, LimitDecision)> = decisions(&journal, "a")
        .into_iter()
        .map(|(k, current, _, d)| (k, current, d))
        .collect();
    assert_eq!(
        decided,
        [
            (
                LimitKind::ChainWait,
                2.0,
                allowed(1, LimitReason::AutoExtended)
            ),
            (
                LimitKind::ChainWait,
                4.0,
                refused(LimitReason::AutoExtendExhausted)
            ),
        ]
    );
    assert_eq!(
        endings(&journal, "a"),
        [(key("b"), DelegationOutcome::TimedOut { after_ms: 4000 })]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    until("b done", || b.status().turns == 1).await;
    replay_matches(&journal, &a);
}

/// Without an extension the chain wait refuses at `chain_seconds` through the checkpoint
/// (unattended), and the delegation ends timed out.
#[actix_rt::test]
async fn an_unattended_chain_wait_is_refused_at_chain_seconds() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.on_limit.mode = OnLimitMode::Unattended;
    config.safety.timeout.chain_seconds = 2.0;
    let (team, journal) = team(config);
    let a = team.assistant(
        "a",
        model([delegate("b", "slow task"), ScriptStep::reply("a gave up")]),
    );
    let b = team.sub_agent(
        "b",
        "a",
        model([ScriptStep::reply("too late").delayed(Duration::from_secs(30))]),
    );
    a.try_send_event(UserEvent::new("go")).unwrap();
    turns(&a, 1).await;
    assert_eq!(
        decisions(&journal, "a"),
        [(
            LimitKind::ChainWait,
            2.0,
            2.0,
            refused(LimitReason::Unattended)
        )]
    );
    assert_eq!(
        endings(&journal, "a"),
        [(key("b"), DelegationOutcome::TimedOut { after_ms: 2000 })]
    );
    until("b done", || b.status().turns == 1).await;
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

/// An agent that never worked is counted in the team budget's fleet view from its spawn (its
/// breakers are made only at its first use), and counted once when it then works.
#[actix_rt::test]
async fn idle_agents_are_counted_in_the_fleet_view_once_from_their_spawn() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_team = 1_000_000;
    let (team, _journal) = team(config);
    let idle = team.assistant("idle", model([]));
    let worker = team.assistant("worker", model([ScriptStep::reply("done")]));
    assert_eq!(team.fleet_view().agents_total, 2);
    assert_eq!(
        (idle.status().tokens_used, idle.status().cost_used),
        (0, 0.0)
    );
    worker.ask(UserEvent::new("go")).await.expect("answered");
    assert_eq!(
        team.fleet_view().agents_total,
        2,
        "counted once, not again at its first use"
    );
    assert!(worker.status().tokens_used > 0);
}

// ---- 8. the SafetyMonitor -------------------------------------------------------------------------

/// The monitor counts trips by breaker, lists recent trips, and shows the locked-out share going up on
/// a lockout and back down after the unlock.
#[actix_rt::test]
async fn the_safety_report_counts_trips_and_tracks_lockouts() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let report = team.safety_report().await.unwrap();
    assert!(report.trips.is_empty() && report.recent.is_empty());
    assert_eq!(
        (report.fleet.agents_total, report.fleet.agents_locked_out),
        (0, 0)
    );

    // r repeats a failing call until it is locked out.
    let (read, _) = counting_tool("read", ToolCategory::SafeChain, true);
    let r = team
        .spawn(
            AgentSpec::assistant(
                "r",
                Arc::new(ScriptedProvider::new([]).with_fallback(|_| {
                    respond(vec![raw_call("c", "read", r#"{"path":"/nope"}"#)])
                })),
            )
            .with_tool(read),
        )
        .unwrap();
    // s spends far more than its 100000-token default budget in one call.
    let s = team.assistant("s", model([reply_using("huge", 150_000, 0)]));

    r.try_send_event(UserEvent::new("read")).unwrap();
    until("r locked out", || r.state() == AgentState::SafetyLockout).await;
    s.try_send_event(UserEvent::new("e1")).unwrap();
    turns(&s, 1).await;
    s.try_send_event(UserEvent::new("e2")).unwrap();
    until("s stopped", || s.state() == AgentState::Stopped).await;

    let report = team.safety_report().await.unwrap();
    assert_eq!(
        report.trips,
        BTreeMap::from([
            ("budget_exceeded".to_owned(), 1),
            ("repetition".to_owned(), 1)
        ])
    );
    let recent: Vec<(AgentKey, Breaker, bool, String)> = report
        .recent
        .iter()
        .map(|t| (t.agent.clone(), t.breaker, t.lockout, t.reason.clone()))
        .collect();
    let s_reason = s.status().stopped_by.unwrap().reason;
    assert!(
        s_reason.starts_with("token budget exhausted: 150000 used + about "),
        "{s_reason}"
    );
    assert_eq!(
        recent,
        [
            (
                key("r"),
                Breaker::Repetition,
                true,
                "repeated a failed action after the system alert (4 identical failures in a row)"
                    .to_owned()
            ),
            (key("s"), Breaker::BudgetExceeded, false, s_reason),
        ]
    );
    assert_eq!(
        (
            report.fleet.agents_total,
            report.fleet.agents_locked_out,
            report.fleet.locked_out.clone()
        ),
        (2, 1, vec![key("r")])
    );
    assert_eq!(team.fleet_view().agents_locked_out, 1);

    r.unlock("ops").await.unwrap();
    let report = team.safety_report().await.unwrap();
    assert_eq!(
        (report.fleet.agents_locked_out, report.fleet.locked_out),
        (0, vec![])
    );
    assert_eq!(team.fleet_view().agents_locked_out, 0);
    assert_eq!(
        report.trips.values().sum::<u64>(),
        2,
        "trips are counted since start"
    );
    replay_matches(&journal, &r);
    replay_matches(&journal, &s);
}

// ---- 9. safety checks off -------------------------------------------------------------------------

/// `safety_checks(false)`: repetition, stuck and budgets do not trip; the consecutive-error emergency
/// stop still does.
#[actix_rt::test]
async fn with_safety_checks_off_only_the_consecutive_error_stop_remains() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 50;
    let journal = Arc::new(MemoryJournal::new());
    let team = Supervisor::builder(config, journal.clone())
        .current_arbiter()
        .safety_checks(false)
        .build();

    // Repetition: identical failing calls never alert; the fifth trips the emergency stop.
    let (read, reads) = counting_tool("read", ToolCategory::SafeChain, true);
    let rep = team
        .spawn(
            AgentSpec::assistant(
                "rep",
                Arc::new(ScriptedProvider::new([]).with_fallback(|_| {
                    respond(vec![raw_call("c", "read", r#"{"path":"/nope"}"#)])
                })),
            )
            .with_tool(read),
        )
        .unwrap();
    rep.try_send_event(UserEvent::new("read")).unwrap();
    until("rep locked out", || {
        rep.state() == AgentState::SafetyLockout
    })
    .await;
    assert_eq!(count(&reads), 5);
    let mut expected = Vec::new();
    for i in 1..=5 {
        expected.push("tool failed".to_owned());
        expected.push(format!("errors {i}"));
    }
    expected.push("locked out ConsecutiveErrors at 5".into());
    assert_eq!(safety_trace(&journal, "rep"), expected, "no alert");
    assert_eq!(
        rep.status().lockout,
        Some(Lockout {
            breaker: Breaker::ConsecutiveErrors,
            reason: "Maximum consecutive errors reached (5)".into()
        })
    );

    // Stuck: four identical successful steps are not stopped.
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let same = || ScriptStep::call("look", json!({"at": "the door"}));
    let stuck = team
        .spawn(
            AgentSpec::assistant(
                "stuck",
                model([same(), same(), same(), same(), ScriptStep::reply("a door")]),
            )
            .with_tool(look),
        )
        .unwrap();
    stuck.try_send_event(UserEvent::new("look")).unwrap();
    turns(&stuck, 1).await;
    assert_eq!(count(&looks), 4);
    assert_eq!(stuck.state(), AgentState::WaitingForEvent);
    assert_eq!(
        last_outcome(&journal, "stuck").reason,
        TerminationReason::Answered
    );

    // Budget: 50 tokens per agent, 1000 spent, and the next call is still made.
    let mb = model([reply_using("big", 1000, 0), ScriptStep::reply("still here")]);
    let b_stats = mb.stats();
    let spender = team.assistant("spender", mb);
    spender.try_send_event(UserEvent::new("e1")).unwrap();
    turns(&spender, 1).await;
    spender.try_send_event(UserEvent::new("e2")).unwrap();
    turns(&spender, 2).await;
    assert_eq!(calls_of(&b_stats), 2);
    assert_eq!(spender.state(), AgentState::WaitingForEvent);
    assert!(
        spender.status().tokens_used > 1000,
        "usage is still accounted"
    );

    for agent in ["rep", "stuck", "spender"] {
        assert_eq!(
            count_events(&journal, agent, |k| matches!(
                k,
                EventKind::SafetyAlert { .. }
                    | EventKind::BudgetWarning { .. }
                    | EventKind::BreakerStopped { .. }
                    | EventKind::LimitDecided { .. }
            )),
            0,
            "{agent}"
        );
    }
    let report = team.safety_report().await.unwrap();
    assert_eq!(
        report.trips,
        BTreeMap::from([("consecutive_errors".to_owned(), 1)])
    );
    for h in [&rep, &stuck, &spender] {
        replay_matches(&journal, h);
    }
}

// ---- issue 10, item 9 ---------------------------------------------------------------------------

/// `safety.timeout.llm_call_seconds` bounds every provider's call, not only the OpenAI one's: a
/// scripted call that would take 3 s under a 1 s limit is dropped at the limit and ends the turn
/// as a failed LLM call (counted in `consecutive_errors`); its reply never reaches the history.
#[actix_rt::test]
async fn the_llm_call_timeout_bounds_a_scripted_provider_too() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.timeout.llm_call_seconds = 1.0;
    let (team, journal) = team(config);
    let model = model([
        ScriptStep::reply("too late").delayed(Duration::from_secs(3)),
        ScriptStep::reply("in time"),
    ]);
    let a = team.assistant("a", model);
    let started = tokio::time::Instant::now();
    a.try_send_event(UserEvent::new("slow")).unwrap();
    turns(&a, 1).await;
    // Virtual (paused) time: the turn ended at the 1 s limit, not after the 3 s call.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let outcome = outcomes(&journal, "a").pop().unwrap();
    assert_eq!(outcome.reason, TerminationReason::LlmError);
    assert_eq!(
        outcome.error.as_deref(),
        Some("llm call failed: llm call timed out after 1000 ms")
    );
    assert_eq!(a.status().consecutive_errors, 1, "counted as a failed call");
    assert!(a
        .record()
        .history
        .iter()
        .all(|m| m.content.as_deref() != Some("too late")));
    // The next call is in time and answers.
    a.try_send_event(UserEvent::new("again")).unwrap();
    turns(&a, 2).await;
    assert_eq!(
        outcomes(&journal, "a").pop().unwrap().answer.as_deref(),
        Some("in time")
    );
    replay_matches(&journal, &a);
}

/// The near-budget warning comes before any budget stop: one call whose cost jumps from below the
/// reserve band to over the cost budget skips the band, yet the stop at the next call is preceded
/// by exactly one `budget_warning` (and a second stop after a resume adds none).
#[actix_rt::test]
async fn a_call_that_jumps_past_the_reserve_band_still_warns_once_before_the_stop() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.budget.cost_per_agent = 1.0;
    config.safety.budget.reserve_cost_fraction = 0.1;
    config.safety.budget.prices.insert(
        "scripted".into(),
        ModelPrice {
            prompt_per_1k: 0.5,
            completion_per_1k: 1.0,
        },
    );
    let (team, journal) = team(config);
    let model = model([
        reply_using("cheap", 400, 100),   // 0.3: far below the band
        reply_using("costly", 1000, 500), // +1.0 = 1.3: past the band and the budget at once
        ScriptStep::reply("never asked"),
    ]);
    let stats = model.stats();
    let a = team.assistant("a", model);
    for (i, e) in ["e1", "e2", "e3"].into_iter().enumerate() {
        a.try_send_event(UserEvent::new(e)).unwrap();
        turns(&a, i as u64 + 1).await;
    }
    assert_eq!(calls_of(&stats), 2, "the third call is never made");
    assert_eq!(a.state(), AgentState::Stopped);
    let budget_events: Vec<&'static str> = journal
        .events_of("a")
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::BudgetWarning { .. } => Some("warning"),
            EventKind::BreakerStopped { .. } => Some("stop"),
            _ => None,
        })
        .collect();
    assert_eq!(budget_events, ["warning", "stop"]);
    let warning = journal
        .events_of("a")
        .into_iter()
        .find_map(|e| match e.kind {
            EventKind::BudgetWarning { message } => Some(message),
            _ => None,
        });
    assert_eq!(
        warning.as_deref(),
        Some("agent a budget nearly exhausted: 2000 of 0 tokens, 1.3000 of 1 cost used")
    );
    a.resume("ops").await.unwrap();
    a.try_send_event(UserEvent::new("e4")).unwrap();
    turns(&a, 4).await;
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::BudgetWarning { .. }
        )),
        1,
        "warned once"
    );
    replay_matches(&journal, &a);
}

/// The limit checkpoint forgets a task's extension counts when the agent begins its next task
/// (`LimitCheckpoint::forget_run` was never called: one entry per limited task, forever). After N
/// limited tasks only the current task's counts are kept, and every task still gets its own
/// extension.
#[actix_rt::test]
async fn the_checkpoint_keeps_no_counts_of_finished_tasks() {
    tokio::time::pause();
    let mut config = loop_config(OnLimitMode::AutoExtend, 2);
    config.safety.on_limit.auto_extend_times = 1;
    let (team, journal) = team(config);
    let (model, _) = looker(ScriptStep::fail("wrap-up fails"));
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    const N: u64 = 6;
    for i in 1..=N {
        a.try_send_event(UserEvent::new(format!("scout {i}")))
            .unwrap();
        turns(&a, i).await;
        assert_eq!(team.limit_runs_tracked(), 1, "after task {i}");
    }
    assert_eq!(
        count(&looks),
        4 * N as usize,
        "each task got its own extension"
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::LimitDecided { decision, .. } if decision.allow
        )),
        N as usize
    );
    replay_matches(&journal, &a);
}

// ---- single action (execution.multi_action_enabled = false) ------------------------------------

/// `multi_action_enabled = false` is a normal way to run (design 001's `single_action`): each turn
/// makes one model call and runs at most one tool call, then ends `single_action` — with an
/// operator's bus wired in `interactive` mode, nobody is asked and no wrap-up call is made. A tick
/// is the same. Before: the second iteration went through the per-tick cap's checkpoint, so every
/// tool-using turn waited for an operator.
#[actix_rt::test]
async fn single_action_runs_one_tool_per_turn_and_ends_without_an_ask_or_a_wrap_up() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let mut config = WardenConfig::default();
    config.execution.multi_action_enabled = false;
    config.safety.on_limit.mode = OnLimitMode::Interactive;
    let (team, journal) = team_with_bus(config, bus.clone());
    let (model, wrap_ups) = looker(ScriptStep::reply("must not be asked for a wrap-up"));
    let stats = model.stats();
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("scout")).unwrap();
    turns(&a, 1).await;
    a.try_tick().unwrap();
    turns(&a, 2).await;
    settle(50).await;
    assert!(bus.pending().is_empty(), "{:?}", bus.pending());
    assert_eq!((calls_of(&stats), count(&looks)), (2, 2));
    assert!(wrap_ups.lock().unwrap().is_empty());
    assert!(decisions(&journal, "a").is_empty());
    assert!(denials(&journal, "a").is_empty());
    let reasons: Vec<(TerminationReason, u32, bool)> = outcomes(&journal, "a")
        .into_iter()
        .map(|o| (o.reason, o.iterations, o.limit_stopped))
        .collect();
    assert_eq!(
        reasons,
        [
            (TerminationReason::SingleAction, 1, false),
            (TerminationReason::SingleAction, 1, false)
        ]
    );
    assert_eq!(
        serde_json::to_value(TerminationReason::SingleAction).unwrap(),
        json!("single_action")
    );
    // Never waited for input.
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::StateChanged {
                to: AgentState::WaitingForInput,
                ..
            }
        )),
        0
    );
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    replay_matches(&journal, &a);
}

/// One action per turn even when the model asks for several calls at once: the first runs, the
/// others are answered "not run" (so the history stays a valid conversation). An unusable reply is
/// the turn's action too (`parse_error`, counted, no second call), while the continuation of an
/// answer cut by the token limit is not an action and is still made.
#[actix_rt::test]
async fn single_action_runs_the_first_of_parallel_calls_and_ends_on_a_parse_error() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let mut config = WardenConfig::default();
    config.execution.multi_action_enabled = false;
    let (team, journal) = team_with_bus(config, bus.clone());
    let model = Arc::new(
        ScriptedProvider::new([
            respond(vec![
                raw_call("call_a", "look", r#"{"at":1}"#),
                raw_call("call_b", "look", r#"{"at":2}"#),
            ]),
            ScriptStep::Fail(ProviderError::Malformed {
                message: "not json".into(),
            }),
            ScriptStep::Respond(LlmResponse {
                message: ChatMessage::assistant("half an "),
                finish_reason: FinishReason::Length,
                usage: Usage::default(),
            }),
            ScriptStep::reply("answer"),
        ])
        .with_fallback(|_| ScriptStep::reply("must not be asked")),
    );
    let stats = model.stats();
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    for (i, text) in ["two at once", "garbled", "long answer"].iter().enumerate() {
        a.try_send_event(UserEvent::new(*text)).unwrap();
        turns(&a, i as u64 + 1).await;
    }
    assert_eq!(count(&looks), 1, "one action per turn");
    assert_eq!(
        calls_of(&stats),
        4,
        "1 + 1 + the cut answer and its continuation"
    );
    let history = a.record().history;
    let not_run = history
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("call_b"))
        .and_then(|m| m.content.clone())
        .unwrap_or_default();
    assert!(
        not_run.contains("not run: one action per tick"),
        "{not_run}"
    );
    let got: Vec<(TerminationReason, Option<String>)> = outcomes(&journal, "a")
        .into_iter()
        .map(|o| (o.reason, o.answer))
        .collect();
    assert_eq!(
        got,
        [
            (TerminationReason::SingleAction, None),
            (TerminationReason::ParseError, None),
            (TerminationReason::Answered, Some("half an answer".into())),
        ]
    );
    assert!(bus.pending().is_empty());
    assert!(decisions(&journal, "a").is_empty());
    replay_matches(&journal, &a);
}

/// `[[agents]] execution = { … }` in a team file: the agent's own keys replace the team's, for
/// that agent only. Here the team loops (`max_iterations_per_tick = 3`) and one agent runs single
/// action: on the same script the clerk's turn ends after its one tool call, the scout's goes on to
/// answer.
#[actix_rt::test]
async fn an_agents_own_execution_keys_from_a_team_file_replace_the_teams() {
    tokio::time::pause();
    let file = warden::team::TeamFile::parse(
        r#"
[execution]
max_iterations_per_tick = 3

[providers.m]
kind = "scripted"
replies = [{ tool = "set_goals", args = { goals = ["tidy the inn"] } }, "done"]

[[agents]]
key = "clerk"
provider = "m"
goals = []
execution = { multi_action_enabled = false }

[[agents]]
key = "scout"
provider = "m"
goals = []
"#,
    )
    .unwrap();
    file.validate().unwrap();
    let (team, journal) = team(file.config.clone());
    file.spawn_agents(&team).unwrap();
    for key in ["clerk", "scout"] {
        let agent = team.get(key).unwrap();
        agent.try_send_event(UserEvent::new("go")).unwrap();
        turns(&agent, 1).await;
    }
    let clerk = last_outcome(&journal, "clerk");
    let scout = last_outcome(&journal, "scout");
    assert_eq!(
        (clerk.reason, clerk.iterations, clerk.answer),
        (TerminationReason::SingleAction, 1, None)
    );
    assert_eq!(
        (scout.reason, scout.iterations, scout.answer.as_deref()),
        (TerminationReason::Answered, 2, Some("done"))
    );
}
