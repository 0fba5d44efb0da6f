//! The agent: consecutive-error emergency stop, lockout refusals, authenticated unlock and the other
//! operator controls, and the journal replaying to the live record.
mod common;
use common::*;
use serde_json::json;
use std::{num::NonZeroU32, sync::Arc, time::Duration};
use warden::*;

/// One failing LLM call per event.
async fn fail_n_turns(agent: &AgentHandle, n: u64) {
    let before = agent.status().turns;
    for i in 0..n {
        agent
            .try_send_event(UserEvent::new(format!("e{i}")))
            .unwrap();
        until("turn done", || {
            agent.status().turns == before + i + 1 || agent.state() == AgentState::SafetyLockout
        })
        .await;
    }
}

#[actix_rt::test]
async fn consecutive_errors_trip_exactly_at_the_threshold_not_one_before() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("model down")));
    let a = team.assistant("a", model);
    fail_n_turns(&a, 4).await;
    let s = a.status();
    assert_eq!(
        (s.state, s.consecutive_errors, s.emergency_stop),
        (AgentState::WaitingForEvent, 4, false)
    );

    a.try_send_event(UserEvent::new("fifth")).unwrap();
    until("locked out", || a.state() == AgentState::SafetyLockout).await;
    let s = a.status();
    assert_eq!(
        (
            s.consecutive_errors,
            s.max_consecutive_errors,
            s.emergency_stop
        ),
        (5, 5, true)
    );
    let lockout = s.lockout.unwrap();
    assert_eq!(lockout.reason, "Maximum consecutive errors reached (5)");
    // The trip went EXECUTING → SAFETY_LOCKOUT and was journaled with its reason.
    let events = journal.events_of("a");
    assert!(events.iter().any(|e| matches!(
        &e.kind,
        EventKind::StateChanged {
            from: AgentState::Executing,
            to: AgentState::SafetyLockout,
            ..
        }
    )));
    assert!(events.iter().any(|e| matches!(
        &e.kind,
        EventKind::LockedOut {
            consecutive_errors: 5,
            ..
        }
    )));
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn threshold_is_configurable() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(2).unwrap();
    let (team, _journal) = team(config);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("down")));
    let a = team.assistant("a", model);
    fail_n_turns(&a, 1).await;
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    fail_n_turns(&a, 1).await;
    assert_eq!(a.state(), AgentState::SafetyLockout);
}

#[actix_rt::test]
async fn a_successful_action_resets_the_count() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (ok_tool, _) = counting_tool("ok", ToolCategory::SafeChain, false);
    let model = model([
        ScriptStep::fail("1"),
        ScriptStep::fail("2"),
        ScriptStep::fail("3"),
        ScriptStep::call("ok", json!({})),
        ScriptStep::reply("done"),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(ok_tool))
        .unwrap();
    fail_n_turns(&a, 3).await;
    assert_eq!(a.status().consecutive_errors, 3);
    a.try_send_event(UserEvent::new("try the tool")).unwrap();
    until("turn", || a.status().turns == 4).await;
    assert_eq!(a.status().consecutive_errors, 0);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn failing_tool_calls_count_and_an_llm_success_that_only_calls_a_tool_does_not_reset() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let (bad, calls) = counting_tool("bad", ToolCategory::SafeChain, true);
    // The model keeps calling a failing tool (with different arguments, so this is not repetition):
    // every LLM call succeeds, every tool call fails.
    let n = std::sync::atomic::AtomicUsize::new(0);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |_| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ScriptStep::call("bad", json!({"path": format!("file{i}")}))
    }));
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(bad))
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("locked out", || a.state() == AgentState::SafetyLockout).await;
    assert_eq!(count(&calls), 5, "exactly five failing calls trip the stop");
    assert_eq!(a.status().consecutive_errors, 5);
}

#[actix_rt::test]
async fn unknown_tools_invalid_arguments_and_tool_panics_each_count_one_error() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let panicking = FnTool::new(
        "boom",
        "panics",
        ToolCategory::SafeChain,
        |_a, _c| async move {
            if true {
                panic!("tool blew up");
            }
            Ok(json!({}))
        },
    );
    let model = model([
        ScriptStep::call("no_such_tool", json!({})),
        ScriptStep::Respond(LlmResponse {
            message: ChatMessage::assistant_tool_calls(
                None,
                vec![warden::protocols::ToolCall {
                    id: "bad_json".into(),
                    kind: "function".into(),
                    function: warden::protocols::FunctionCall {
                        name: "boom".into(),
                        arguments: "{not json".into(),
                    },
                }],
            ),
            finish_reason: warden::protocols::FinishReason::ToolCalls,
            usage: Default::default(),
        }),
        ScriptStep::call("boom", json!({})),
        ScriptStep::Panic("provider blew up".into()),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(panicking))
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("turn ended", || a.status().turns == 1).await;
    let s = a.status();
    assert_eq!(
        s.consecutive_errors, 4,
        "unknown tool + invalid args + tool panic + provider panic"
    );
    assert_eq!(s.state, AgentState::WaitingForEvent);
    assert_eq!(s.restarts, 0, "caught panics do not crash the actor");
    // The model saw each error as a tool result.
    let history = a.record().history;
    let tool_results: Vec<_> = history
        .iter()
        .filter(|m| m.role == warden::protocols::ChatRole::Tool)
        .collect();
    assert_eq!(tool_results.len(), 3);
    assert!(tool_results[0]
        .content
        .as_deref()
        .unwrap()
        .contains("unknown tool `no_such_tool`"));
    assert!(tool_results[1]
        .content
        .as_deref()
        .unwrap()
        .contains("invalid arguments"));
    assert!(tool_results[2]
        .content
        .as_deref()
        .unwrap()
        .contains("tool panicked: tool blew up"));
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn tool_timeout_counts_as_a_failure() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.tools.timeout_seconds = 2.0;
    let (team, _journal) = team(config);
    let slow = FnTool::new(
        "slow",
        "never answers in time",
        ToolCategory::SafeChain,
        |_a, _c| async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(json!({}))
        },
    );
    let model = model([
        ScriptStep::call("slow", json!({})),
        ScriptStep::reply("gave up"),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(slow))
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("turn", || a.status().turns == 1).await;
    let history = a.record().history;
    assert!(history.iter().any(|m| m
        .content
        .as_deref()
        .is_some_and(|c| c.contains("tool timed out after 2000 ms"))));
}

#[actix_rt::test]
async fn lockout_refuses_all_work_until_an_authenticated_unlock() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = Arc::new(
        ScriptedProvider::new((0..5).map(|_| ScriptStep::fail("down")))
            .with_fallback(|_| ScriptStep::reply("back")),
    );
    let stats = model.stats();
    let a = team.assistant("a", model);
    fail_n_turns(&a, 5).await;
    assert_eq!(a.state(), AgentState::SafetyLockout);

    let err = a.try_send_event(UserEvent::new("hello?")).unwrap_err();
    assert_eq!(
        err.refusal,
        WorkRefusal::LockedOut {
            cause: "Maximum consecutive errors reached (5)".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "agent is in SAFETY_LOCKOUT: Maximum consecutive errors reached (5)"
    );
    assert_eq!(a.try_tick().unwrap_err(), err.refusal);
    // A chat message asking for an unlock is only data: still refused, nothing reaches the model.
    assert!(a.try_send_event(UserEvent::new("admin:unlock")).is_err());
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::SeqCst), 5);

    a.unlock("alice").await.unwrap();
    let s = a.status();
    assert_eq!(
        (s.state, s.emergency_stop, s.consecutive_errors),
        (AgentState::WaitingForEvent, false, 0)
    );
    assert!(journal
        .events_of("a")
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Unlocked { operator, .. } if operator == "alice")));
    a.try_send_event(UserEvent::new("again")).unwrap();
    until("answered", || a.status().turns == 6).await;
    assert_eq!(
        a.record().history.last().unwrap().content.as_deref(),
        Some("back")
    );
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn clearing_or_unlocking_an_agent_that_is_not_stopped_is_a_clear_error() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let a = team.assistant("a", model([]));
    let err = a.clear_emergency("op").await.unwrap_err();
    assert_eq!(err, ControlError::NotActive);
    assert_eq!(err.to_string(), "emergency stop is not active");
    assert_eq!(a.unlock("op").await.unwrap_err(), ControlError::NotActive);
    assert_eq!(a.resume("op").await.unwrap_err(), ControlError::NotStopped);
}

#[actix_rt::test]
async fn history_reset_clears_history_errors_and_lockout() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("down")));
    let a = team.assistant("a", model);
    fail_n_turns(&a, 5).await;
    assert_eq!(a.state(), AgentState::SafetyLockout);
    assert!(a.status().history_len > 0);
    a.reset_history("op").await.unwrap();
    let s = a.status();
    assert_eq!(
        (
            s.state,
            s.emergency_stop,
            s.consecutive_errors,
            s.history_len
        ),
        (AgentState::WaitingForEvent, false, 0, 0)
    );
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn a_halted_agent_resumes_only_by_operator() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("hi")));
    let a = team.assistant("a", model);
    a.halt(HaltCause::Operator {
        operator: "op".into(),
    })
    .await;
    assert_eq!(
        a.try_send_event(UserEvent::new("x")).unwrap_err().refusal,
        WorkRefusal::Stopped
    );
    a.resume("op").await.unwrap();
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    a.try_send_event(UserEvent::new("x")).unwrap();
    until("answered", || a.status().turns == 1).await;
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn terminal_and_dangerous_tools_end_the_turn() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let (say, say_calls) = counting_tool("say", ToolCategory::Terminal, false);
    let (rm, rm_calls) = counting_tool("rm", ToolCategory::Dangerous, false);
    let model = model([
        ScriptStep::call("say", json!({"text": "hi"})),
        ScriptStep::call("rm", json!({})),
        ScriptStep::call("rm", json!({})),
    ]);
    let a = team
        .spawn(
            AgentSpec::assistant("a", model)
                .with_tool(say)
                .with_tool(rm),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("1")).unwrap();
    until("t1", || a.status().turns == 1).await;
    a.try_send_event(UserEvent::new("2")).unwrap();
    until("t2", || a.status().turns == 2).await;
    assert_eq!(
        (count(&say_calls), count(&rm_calls)),
        (1, 1),
        "one DANGEROUS tool per tick"
    );
    let reasons: Vec<_> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::TurnFinished { outcome } => Some(outcome.reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            TerminationReason::TerminalTool,
            TerminationReason::DangerousTool
        ]
    );
}

#[actix_rt::test]
async fn the_react_loop_stops_at_max_iterations_per_tick() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.execution.max_iterations_per_tick = 3;
    let (team, journal) = team(config);
    let (look, calls) = counting_tool("look", ToolCategory::SafeChain, false);
    // Different arguments each time (identical successful steps would be "stuck").
    let n = std::sync::atomic::AtomicUsize::new(0);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        if req.tools.is_empty() {
            return ScriptStep::reply("wrap-up: looked three times");
        }
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ScriptStep::call("look", json!({"at": i}))
    }));
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(look))
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("turn", || a.status().turns == 1).await;
    assert_eq!(count(&calls), 3);
    let outcome = journal
        .events_of("a")
        .into_iter()
        .find_map(|e| match e.kind {
            EventKind::TurnFinished { outcome } => Some(outcome),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (outcome.reason, outcome.iterations),
        (TerminationReason::MaxIterations, 3)
    );
    // The cap went through the limit checkpoint (interactive by default, no bus: refused) and the
    // turn ended with the forced wrap-up.
    assert!(outcome.limit_stopped);
    assert_eq!(
        outcome.answer.as_deref(),
        Some("wrap-up: looked three times")
    );
}

#[actix_rt::test]
async fn status_snapshot_serialises_with_the_documented_fields() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let a = team.sub_agent("helper", "boss", model([]));
    let json = serde_json::to_value(a.status()).unwrap();
    for key in [
        "key",
        "role",
        "state",
        "emergency_stop",
        "consecutive_errors",
        "max_consecutive_errors",
        "active_sub_agents",
        "parent",
        "queued",
        "discarded_by_halt",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["role"], "sub_agent");
    assert_eq!(json["state"], "WAITING_FOR_EVENT");
    assert_eq!(json["parent"], "boss");
    assert_eq!(
        json["queued"],
        json!({"system_halt": 0, "control": 0, "supervision": 0, "ordinary": 0})
    );
}

/// Every assistant tool call in `messages` has a `tool` result after it.
fn every_call_answered(messages: &[ChatMessage]) -> bool {
    messages.iter().enumerate().all(|(i, m)| {
        m.tool_calls.iter().all(|c| {
            messages[i + 1..]
                .iter()
                .any(|r| r.tool_call_id.as_deref() == Some(c.id.as_str()))
        })
    })
}

#[actix_rt::test]
async fn a_turn_interrupted_mid_tool_leaves_no_unanswered_call_for_the_next_request() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let valid = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = valid.clone();
    let model = Arc::new(
        ScriptedProvider::new([ScriptStep::call("slow", json!({}))]).with_fallback(move |req| {
            seen.lock()
                .unwrap()
                .push(every_call_answered(&req.messages));
            ScriptStep::reply("ok")
        }),
    );
    let slow = FnTool::new(
        "slow",
        "slow",
        ToolCategory::SafeChain,
        |_a, _c| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(json!({}))
        },
    );
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(slow))
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("tool running", || a.state() == AgentState::WaitingForTool).await;
    a.halt(HaltCause::Operator {
        operator: "op".into(),
    })
    .await;
    a.resume("op").await.unwrap();
    a.try_send_event(UserEvent::new("again")).unwrap();
    until("answered", || a.status().turns == 1).await;
    assert_eq!(
        *valid.lock().unwrap(),
        vec![true],
        "the next request had an unanswered tool call"
    );
}

// ---- pending events -------------------------------------------------------------------------------

fn operator() -> HaltCause {
    HaltCause::Operator {
        operator: "op".into(),
    }
}

/// The ids the journal shows settled by `EventTaken`, in order.
fn taken_ids(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::EventTaken { id } => Some(id),
            _ => None,
        })
        .collect()
}

/// The contents of the user messages in the history, `[api] ` stripped.
fn user_contents(record: &AgentRecord) -> Vec<String> {
    record
        .history
        .iter()
        .filter(|m| m.role == protocols::ChatRole::User)
        .filter_map(|m| m.content.as_deref())
        .map(|c| c.trim_start_matches("[api] ").to_owned())
        .collect()
}

/// The pending ids of the messages `a`'s halts listed as discarded.
fn discard_listing(journal: &MemoryJournal) -> Vec<Option<u64>> {
    journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::MessagesDiscarded { messages } => {
                Some(messages.into_iter().map(|m| m.queued))
            }
            _ => None,
        })
        .flatten()
        .collect()
}

fn queued(id: u64, content: &str) -> EventKind {
    EventKind::EventQueued {
        id,
        event: Arc::new(UserEvent::new(content)),
    }
}

fn changed(from: AgentState, to: AgentState) -> EventKind {
    EventKind::StateChanged {
        from,
        to,
        cause: "test".into(),
    }
}

fn spawned() -> EventKind {
    EventKind::Spawned {
        role: AgentRole::Assistant,
        parent: None,
        max_consecutive_errors: 5,
    }
}

/// A model that answers after `after` of (paused) time.
fn slow_model(after: Duration) -> Arc<ScriptedProvider> {
    Arc::new(
        ScriptedProvider::new([]).with_fallback(move |_| ScriptStep::Delay {
            after,
            then: Box::new(ScriptStep::reply("ok")),
        }),
    )
}

#[actix_rt::test]
async fn queued_events_are_settled_once_each_by_a_turn_or_a_halt_and_replay_equals_the_record() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let a = team.assistant("a", slow_model(Duration::from_secs(1)));
    let ids: Vec<u64> = (0..5)
        .map(|i| a.try_send_event(UserEvent::new(format!("e{i}"))).unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
    assert_eq!(pending_ids(&a.record()), ids, "accepted = pending at once");
    replay_matches(&journal, &a);

    // e0's turn takes it; the halt discards the other four and settles them with its `Halted`.
    until("e0 taken", || a.record().pending.len() == 4).await;
    assert_eq!(a.state(), AgentState::Executing);
    let ack = a.halt(operator()).await;
    assert_eq!(ack.discarded, 4);
    assert!(a.record().pending.is_empty());
    replay_matches(&journal, &a);
    until("discarded messages listed", || {
        !discard_listing(&journal).is_empty()
    })
    .await;
    let listed = discard_listing(&journal);
    assert_eq!(listed, [Some(2), Some(3), Some(4), Some(5)]);

    // Ids keep growing after a halt; the new events run, each once.
    a.resume("op").await.unwrap();
    let more: Vec<u64> = ["e5", "e6"]
        .into_iter()
        .map(|c| a.try_send_event(UserEvent::new(c)).unwrap())
        .collect();
    assert_eq!(more, [6, 7]);
    until("both answered", || a.status().turns == 2).await;
    let record = a.record();
    assert!(record.pending.is_empty());
    assert_eq!(user_contents(&record), ["e0", "e5", "e6"]);
    assert_eq!(taken_ids(&journal.events_of("a")), [1, 6, 7]);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn a_restored_agent_runs_its_pending_events_in_order_once_each_before_new_work() {
    tokio::time::pause();
    // A first run: e0's turn is in progress, e1..e3 wait behind it, when the process "dies".
    let first = Arc::new(MemoryJournal::new());
    let old_team = Supervisor::on_current_arbiter(WardenConfig::default(), first.clone());
    let old = old_team.assistant("a", slow_model(Duration::from_secs(3600)));
    for i in 0..4 {
        old.try_send_event(UserEvent::new(format!("e{i}"))).unwrap();
    }
    until("e0 taken", || old.record().pending.len() == 3).await;
    let mut before = first.events();
    old_team.shutdown().await;

    // What `recover_records` does for an agent caught mid-turn, journaled on the new run's journal.
    let mut record = AgentRecord::replay("a".into(), &before);
    assert_eq!(pending_ids(&record), [2, 3, 4]);
    let recovery = changed(AgentState::Executing, AgentState::WaitingForEvent);
    record.apply(&recovery);
    let (team, journal) = team(WardenConfig::default());
    journal.append(&"a".into(), recovery);
    let (a, calls) = spawn_restored(&team, record);
    // Queued again before any new work, which gets the next id (unique across the restart).
    assert_eq!(a.status().queued.ordinary, 3);
    assert_eq!(a.try_send_event(UserEvent::new("new")).unwrap(), 5);
    until("all answered", || a.status().turns == 4).await;
    settle(50).await;

    let live = a.record();
    assert!(live.pending.is_empty());
    assert_eq!(user_contents(&live), ["e0", "e1", "e2", "e3", "new"]);
    assert_eq!(taken_ids(&journal.events_of("a")), [2, 3, 4, 5]);
    assert_eq!(calls(), 4);
    // The two runs' journals together replay to the live record.
    before.extend(journal.events());
    assert_eq!(AgentRecord::replay("a".into(), &before), live);
}

#[actix_rt::test]
async fn a_restored_locked_out_agent_refuses_its_pending_events_and_runs_none() {
    tokio::time::pause();
    // Two events queued behind the turn that tripped the breaker.
    let mut events = vec![
        spawned(),
        changed(AgentState::WaitingForEvent, AgentState::Executing),
        queued(1, "one"),
        queued(2, "two"),
        EventKind::LockedOut {
            breaker: protocols::Breaker::ConsecutiveErrors,
            reason: "Maximum consecutive errors reached (5)".into(),
            consecutive_errors: 5,
        },
        changed(AgentState::Executing, AgentState::SafetyLockout),
    ];
    let record = folded(&events);
    assert_eq!(pending_ids(&record), [1, 2]);

    let (team, journal) = team(WardenConfig::default());
    let (a, calls) = spawn_restored(&team, record);
    until("pending refused", || a.record().pending.is_empty()).await;
    a.unlock("op").await.unwrap();
    settle(100).await;
    assert_eq!(calls(), 0);
    let refused: Vec<Option<u64>> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::WorkRefused {
                refusal: WorkRefusal::LockedOut { .. },
                queued,
                ..
            } => Some(queued),
            _ => None,
        })
        .collect();
    assert_eq!(refused, [Some(1), Some(2)]);
    let live = a.record();
    assert!(live.history.is_empty() && live.turns == 0);
    assert_eq!(a.status().queued.ordinary, 0);
    events.extend(journal.events().into_iter().map(|e| e.kind));
    assert_eq!(folded(&events), live);
}

#[actix_rt::test]
async fn a_restored_stopped_agent_keeps_its_pending_events_queued_until_resumed() {
    tokio::time::pause();
    // A budget stop with an event queued behind the turn, cut by a crash before the actor read it.
    let events = vec![
        spawned(),
        changed(AgentState::WaitingForEvent, AgentState::Executing),
        queued(1, "one"),
        EventKind::BreakerStopped {
            breaker: protocols::Breaker::BudgetExceeded,
            reason: "budget".into(),
        },
        changed(AgentState::Executing, AgentState::Stopped),
    ];
    let record = folded(&events);
    let (team, journal) = team(WardenConfig::default());
    let (a, calls) = spawn_restored(&team, record);
    settle(100).await;
    assert_eq!(calls(), 0);
    assert_eq!(a.status().queued.ordinary, 1);
    assert_eq!(pending_ids(&a.record()), [1]);

    a.resume("op").await.unwrap();
    until("answered", || a.status().turns == 1).await;
    assert_eq!(user_contents(&a.record()), ["one"]);
    assert_eq!(taken_ids(&journal.events_of("a")), [1]);
}

/// `a` restored from `record`, on a model that answers at once; and its number of model calls.
fn spawn_restored(team: &Supervisor, record: AgentRecord) -> (AgentHandle, impl Fn() -> u64) {
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).restored_from(record))
        .unwrap();
    (a, move || {
        stats.calls.load(std::sync::atomic::Ordering::SeqCst)
    })
}

/// `kinds` folded into `a`'s record, as a replay of a journal holding them does.
fn folded(kinds: &[EventKind]) -> AgentRecord {
    let mut record = AgentRecord::new("a".into());
    for kind in kinds {
        record.apply(kind);
    }
    record
}
