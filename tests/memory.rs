//! Bounded memory (docs/memory.md): emergency compaction of the history at 80 % of the window —
//! summarised by the model (scripted here: a summary request is told by
//! `memory::is_summary_request`), journaled so a replay equals the live record, never splitting a
//! tool-call unit; the deterministic fallback; a halt during the summary call.
mod common;

use common::*;
use parking_lot::Mutex;
use serde_json::json;
use std::{sync::Arc, time::Duration};
use warden::{
    memory::{is_summary_request, SUMMARY_HEADER},
    protocols::{ChatRole, TerminationReason},
    AgentHandle, AgentSpec, ChatMessage, EventKind, GoalsError, HaltCause, LlmRequest, LlmResponse,
    MemoryJournal, ScriptStep, ScriptedProvider, UserEvent, WardenConfig,
};

const WINDOW: u64 = 600;

/// A model that looks around once per event (one tool-call unit), then answers; a summary request
/// is answered with `summary` (or fails when `None`).
fn npc_model(summary: Option<&'static str>) -> (Arc<Capture>, Arc<Mutex<Vec<LlmRequest>>>) {
    slow_npc_model(summary, Duration::ZERO)
}

/// [`npc_model`] whose summaries take `delay`.
fn slow_npc_model(
    summary: Option<&'static str>,
    delay: Duration,
) -> (Arc<Capture>, Arc<Mutex<Vec<LlmRequest>>>) {
    let inner = ScriptedProvider::new([]).with_fallback(move |req| {
        if is_summary_request(req) {
            return match summary {
                Some(text) => ScriptStep::reply(text).delayed(delay),
                None => ScriptStep::fail("summaries are down"),
            };
        }
        match req.messages.last().map(|m| m.role) {
            Some(ChatRole::Tool) => ScriptStep::reply(format!(
                "The door is old and heavy, it creaks {}",
                req.messages.len()
            )),
            _ => ScriptStep::call("look", json!({"at": "door"})),
        }
    });
    Capture::new(inner)
}

fn config() -> WardenConfig {
    let mut config = WardenConfig::default();
    config.execution.max_context_tokens = WINDOW;
    config.safety.budget.tokens_per_agent = 0;
    config
}

async fn spawn(
    config: WardenConfig,
    model: Arc<Capture>,
) -> (warden::Supervisor, Arc<MemoryJournal>, AgentHandle) {
    let (team, journal) = team(config);
    let (look, _) = counting_tool("look", warden::ToolCategory::SafeChain, false);
    let a = team
        .spawn(
            AgentSpec::assistant("npc", model)
                .with_system_prompt("You are the innkeeper.")
                .without_delegation()
                .with_tool_arc(look),
        )
        .unwrap();
    (team, journal, a)
}

async fn turns(a: &AgentHandle, n: usize) {
    for i in 0..n {
        let before = a.status().turns;
        a.try_send_event(UserEvent::new(format!(
            "player question number {i}: what about the door over there?"
        )))
        .unwrap();
        until("turn finished", || a.status().turns == before + 1).await;
    }
}

/// What `pick` takes from the npc's journal events, in order.
fn journaled<T>(journal: &MemoryJournal, pick: impl FnMut(EventKind) -> Option<T>) -> Vec<T> {
    journal
        .events_of("npc")
        .into_iter()
        .map(|e| e.kind)
        .filter_map(pick)
        .collect()
}

fn compactions(journal: &MemoryJournal) -> Vec<(u64, ChatMessage, bool)> {
    journaled(journal, |kind| match kind {
        EventKind::HistoryCompacted {
            removed,
            summary,
            fallback,
        } => Some((removed, summary, fallback)),
        _ => None,
    })
}

/// Every tool result in `history` answers a call earlier in it, and every call has its result.
fn assert_units_whole(history: &[ChatMessage]) {
    for (i, m) in history.iter().enumerate() {
        if m.role == ChatRole::Tool {
            let id = m.tool_call_id.as_deref().unwrap();
            assert!(
                history[..i]
                    .iter()
                    .any(|c| c.tool_calls.iter().any(|t| t.id == id)),
                "tool result {id} at {i} lost its call"
            );
        }
        for call in &m.tool_calls {
            assert!(
                history[i + 1..]
                    .iter()
                    .any(|r| r.tool_call_id.as_deref() == Some(call.id.as_str())),
                "call {} at {i} lost its result",
                call.id
            );
        }
    }
}

#[actix_rt::test]
async fn the_older_history_is_summarised_and_a_replay_equals_the_live_record() {
    tokio::time::pause();
    let (model, seen) = npc_model(Some("The player keeps asking about the door; it is old."));
    let (_team, journal, a) = spawn(config(), model).await;
    turns(&a, 40).await;

    let done = compactions(&journal);
    assert!(done.len() >= 2, "compacted {} times", done.len());
    let record = a.record();
    // The summary is one internal user message at the start of the history.
    let first = &record.history[0];
    assert!(first.internal && first.role == ChatRole::User);
    let text = first.content.as_deref().unwrap();
    assert!(text.starts_with(SUMMARY_HEADER), "{text}");
    assert!(text.ends_with("The player keeps asking about the door; it is old."));
    assert!(done.iter().all(|(_, _, fallback)| !fallback));
    // Bounded: below the 80 % threshold after the last turn's compaction and its own few messages.
    let system = ChatMessage::system("You are the innkeeper.").estimated_tokens();
    assert!(
        record.history_tokens + system < WINDOW,
        "history worth {} tokens",
        record.history_tokens
    );
    // The running estimate is exact.
    let counted: u64 = record.history.iter().map(|m| m.estimated_tokens()).sum();
    assert_eq!(record.history_tokens, counted);
    assert_units_whole(&record.history);
    replay_matches(&journal, &a);

    // The summary requests carried the removed messages and no tools; the turn's requests after a
    // compaction start with the system prompt and the summary.
    let seen = seen.lock();
    // Every call's tokens were recorded, the summaries' too (they count against the budgets).
    let recorded = journaled(&journal, |kind| {
        matches!(kind, EventKind::UsageRecorded { .. }).then_some(())
    });
    assert_eq!(recorded.len(), seen.len());
    let summaries: Vec<&LlmRequest> = seen.iter().filter(|r| is_summary_request(r)).collect();
    assert_eq!(summaries.len(), done.len());
    assert!(summaries.iter().all(|r| r.tools.is_empty()));
    assert!(summaries[0].messages[1]
        .content
        .as_deref()
        .unwrap()
        .contains("user: [api] player question number 0"));
    let last = seen.last().unwrap();
    assert!(!is_summary_request(last));
    assert_eq!(last.messages[0].role, ChatRole::System);
    assert!(last.messages[1]
        .content
        .as_deref()
        .unwrap()
        .starts_with(SUMMARY_HEADER));
}

#[actix_rt::test]
async fn history_stays_bounded_over_a_long_life() {
    tokio::time::pause();
    let (model, _) = npc_model(Some("summary"));
    let (_team, journal, a) = spawn(config(), model).await;
    turns(&a, 150).await;
    let record = a.record();
    assert!(
        record.history.len() < 60,
        "{} messages",
        record.history.len()
    );
    assert!(record.history_tokens < WINDOW);
    assert!(compactions(&journal).len() >= 10);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn a_failed_summary_falls_back_to_a_marker_journaled_the_same_way() {
    tokio::time::pause();
    let (model, _) = npc_model(None);
    let (_team, journal, a) = spawn(config(), model).await;
    turns(&a, 20).await;
    let done = compactions(&journal);
    assert!(!done.is_empty());
    let (removed, summary, fallback) = &done[0];
    assert!(fallback);
    assert_eq!(
        summary.content.as_deref(),
        Some(
            format!(
                "[memory: {removed} earlier messages removed without a summary (the summary call failed)]"
            )
            .as_str()
        )
    );
    // The agent kept answering.
    assert!(outcomes(&journal, "npc")
        .iter()
        .all(|o| o.reason == TerminationReason::Answered));
    assert_units_whole(&a.record().history);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn compaction_off_keeps_everything() {
    tokio::time::pause();
    let (model, seen) = npc_model(Some("summary"));
    let mut config = config();
    config.memory.compaction = false;
    let (_team, journal, a) = spawn(config, model).await;
    turns(&a, 20).await;
    assert!(compactions(&journal).is_empty());
    let history = a.record().history;
    let asked = history.iter().filter(|m| m.role == ChatRole::User).count();
    assert_eq!(asked, 20, "every event's message is still there");
    assert_eq!(
        history[0].content.as_deref(),
        Some("[api] player question number 0: what about the door over there?")
    );
    assert!(!seen.lock().iter().any(is_summary_request));
}

#[actix_rt::test]
async fn a_halt_during_the_summary_call_drops_it() {
    tokio::time::pause();
    let (model, seen) = slow_npc_model(Some("summary"), Duration::from_secs(10));
    let (_team, journal, a) = spawn(config(), model).await;
    // Up to just before the first compaction.
    let mut n = 0;
    loop {
        turns(&a, 1).await;
        n += 1;
        let record = a.record();
        let system = ChatMessage::system("You are the innkeeper.").estimated_tokens();
        // The next event's message and the look round would cross 80 %.
        if (record.history_tokens + system + 60) * 100 >= WINDOW * 80 {
            break;
        }
        assert!(n < 50);
    }
    assert!(compactions(&journal).is_empty());
    let before = a.record().history.len();
    // The summary takes 10 s: the halt comes while it is being written.
    let calls = seen.lock().len();
    a.try_send_event(UserEvent::new("one more question about the door"))
        .unwrap();
    until("a summary request", || {
        seen.lock()[calls..].iter().any(is_summary_request)
    })
    .await;
    let _ = a
        .halt(HaltCause::Operator {
            operator: "op".into(),
        })
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(compactions(&journal).is_empty(), "a stale summary applied");
    assert!(a.record().history.len() > before);
    replay_matches(&journal, &a);
}

/// A model whose every answer costs 60 tokens.
fn sixty_tokens() -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(|_| {
        ScriptStep::Respond(LlmResponse {
            message: ChatMessage::assistant("ok"),
            finish_reason: warden::protocols::FinishReason::Stop,
            usage: warden::protocols::Usage {
                prompt_tokens: 50,
                completion_tokens: 10,
                estimated: false,
            },
        })
    }))
}

fn waits(journal: &MemoryJournal) -> Vec<(u64, u64, u64)> {
    journaled(journal, |kind| match kind {
        EventKind::TokenBudgetWaiting {
            tokens,
            limit,
            wait_ms,
        } => Some((tokens, limit, wait_ms)),
        _ => None,
    })
}

#[actix_rt::test]
async fn a_spent_hourly_budget_waits_until_tokens_age_out_instead_of_stopping() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.budget.tokens_per_hour = 100;
    let (team, journal) = team(config);
    let a = team.assistant("npc", sixty_tokens());
    let start = tokio::time::Instant::now();
    a.try_send_event(UserEvent::new("one")).unwrap();
    until("turn 1", || a.status().turns == 1).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    a.try_send_event(UserEvent::new("two")).unwrap();
    until("turn 2", || a.status().turns == 2).await;
    // 120 tokens in the last hour ≥ 100: the third turn waits for the first call to age out.
    a.try_send_event(UserEvent::new("three")).unwrap();
    until("waiting", || a.status().budget_wait_until_ms.is_some()).await;
    let status = a.status();
    assert_eq!(status.state, warden::AgentState::Executing);
    assert_eq!(status.turns, 2);
    let w = waits(&journal);
    assert_eq!(w.len(), 1, "journaled once");
    let (tokens, limit, wait_ms) = w[0];
    assert_eq!((tokens, limit), (120, 100));
    let elapsed = u64::try_from(start.elapsed().as_millis()).unwrap();
    assert_eq!(wait_ms, 3_600_000 - elapsed);
    // The first call ages out 3000 s after the wait began (it was 600 s old then).
    tokio::time::sleep(Duration::from_millis(wait_ms - 1_000)).await;
    settle(100).await;
    assert_eq!(a.status().turns, 2, "still waiting");
    tokio::time::sleep(Duration::from_secs(2)).await;
    until("turn 3", || a.status().turns == 3).await;
    // It ran once the first call was an hour old, not before.
    assert!(start.elapsed() >= Duration::from_secs(3600));
    assert!(a.status().budget_wait_until_ms.is_none());
    assert_eq!(a.status().tokens_used, 180);
    assert!(outcomes(&journal, "npc")
        .iter()
        .all(|o| o.reason == TerminationReason::Answered));
    assert_eq!(waits(&journal).len(), 1);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn a_halt_ends_the_wait_for_the_hourly_budget() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.budget.tokens_per_hour = 50;
    let (team, journal) = team(config);
    let a = team.assistant("npc", sixty_tokens());
    a.try_send_event(UserEvent::new("one")).unwrap();
    until("turn 1", || a.status().turns == 1).await;
    a.try_send_event(UserEvent::new("two")).unwrap();
    until("waiting", || a.status().budget_wait_until_ms.is_some()).await;
    let _ = a
        .halt(HaltCause::Operator {
            operator: "op".into(),
        })
        .await;
    until("stopped", || a.state() == warden::AgentState::Stopped).await;
    until("the wait is over", || {
        a.status().budget_wait_until_ms.is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(7200)).await;
    assert_eq!(
        outcomes(&journal, "npc").len(),
        1,
        "the second turn never answered"
    );
    assert_eq!(a.status().tokens_used, 60, "no model call after the halt");
    replay_matches(&journal, &a);
}

fn goal_events(journal: &MemoryJournal) -> Vec<(Vec<String>, String)> {
    journaled(journal, |kind| match kind {
        EventKind::GoalsSet { goals, by } => Some((goals, by)),
        _ => None,
    })
}

#[actix_rt::test]
async fn goals_come_from_the_spawn_the_model_and_the_operator_and_the_system_message_carries_them()
{
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let inner = ScriptedProvider::new([
        ScriptStep::reply("hello"),
        ScriptStep::call("set_goals", json!({"goals": ["find the lost key"]})),
        ScriptStep::reply("I will look for the key."),
        ScriptStep::call("set_goals", json!({"goals": ["  "]})),
        ScriptStep::reply("fine"),
        ScriptStep::reply("ok"),
    ]);
    let (model, seen) = Capture::new(inner);
    let a = team
        .spawn(
            AgentSpec::assistant("npc", model)
                .with_system_prompt("You are the innkeeper.")
                .with_goals(vec!["keep the inn tidy".into()]),
        )
        .unwrap();
    let turn = |text: &'static str| {
        let a = a.clone();
        async move {
            let before = a.status().turns;
            a.try_send_event(UserEvent::new(text)).unwrap();
            until("turn", || a.status().turns == before + 1).await;
        }
    };
    turn("hi").await;
    let system = |i: usize| seen.lock()[i].messages[0].content.clone().unwrap();
    assert_eq!(
        system(0),
        "You are the innkeeper.\n\nYour current goals:\n- keep the inn tidy"
    );
    assert!(seen.lock()[0].tools.iter().any(|t| t.name == "set_goals"));
    turn("you lost a key").await;
    assert_eq!(
        system(2),
        "You are the innkeeper.\n\nYour current goals:\n- find the lost key"
    );
    // A blank goal is refused: the model sees the error, the goals stay.
    turn("forget it").await;
    assert_eq!(a.record().goals, vec!["find the lost key".to_owned()]);
    assert_eq!(
        a.status().goals,
        a.record().goals,
        "the status shows the goals"
    );
    let tool_result = a
        .record()
        .history
        .iter()
        .rev()
        .find(|m| m.role == ChatRole::Tool)
        .and_then(|m| m.content.clone())
        .unwrap();
    assert!(tool_result.contains("goal 1 is blank"), "{tool_result}");
    // The operator.
    a.set_goals(
        vec!["close at midnight".into(), "greet guests".into()],
        "op",
    )
    .unwrap();
    assert_eq!(
        a.set_goals(vec![String::new()], "op"),
        Err(GoalsError::Invalid("goal 1 is blank".into()))
    );
    assert_eq!(
        a.set_goals(vec!["g".into(); 17], "op"),
        Err(GoalsError::Invalid(
            "17 goals; at most 16 are allowed".into()
        ))
    );
    turn("closing time?").await;
    assert_eq!(
        seen.lock().last().unwrap().messages[0].content.as_deref(),
        Some("You are the innkeeper.\n\nYour current goals:\n- close at midnight\n- greet guests")
    );
    assert_eq!(
        goal_events(&journal),
        vec![
            (vec!["keep the inn tidy".to_owned()], "team".to_owned()),
            (vec!["find the lost key".to_owned()], "model".to_owned()),
            (
                vec!["close at midnight".to_owned(), "greet guests".to_owned()],
                "op".to_owned()
            ),
        ]
    );
    replay_matches(&journal, &a);
    // A restart keeps the journaled goals, not the spawn's.
    let record = warden::AgentRecord::replay("npc".into(), &journal.events());
    let (team2, journal2) = common::team(WardenConfig::default());
    let b = team2
        .spawn(
            AgentSpec::assistant("npc", chatty())
                .with_goals(vec!["keep the inn tidy".into()])
                .restored_from(record),
        )
        .unwrap();
    assert_eq!(b.record().goals.len(), 2);
    assert!(goal_events(&journal2).is_empty());
}

#[actix_rt::test]
async fn invalid_goals_fail_the_spawn() {
    let (team, _) = team(WardenConfig::default());
    let err = team
        .spawn(AgentSpec::assistant("npc", chatty()).with_goals(vec!["x".repeat(501)]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid goals: goal 1 has 501 characters; at most 500 are allowed"
    );
}

#[actix_rt::test]
async fn the_agent_reflects_every_interval_and_keeps_the_latest_three() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.memory.reflection_interval = 2;
    let (team, journal) = team(config);
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = n.clone();
    let inner = ScriptedProvider::new([]).with_fallback(move |req| {
        if warden::memory::is_reflection_request(req) {
            let k = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            ScriptStep::reply(format!("reflection {k}"))
        } else {
            ScriptStep::reply("ok")
        }
    });
    let (model, seen) = Capture::new(inner);
    let a = team
        .spawn(AgentSpec::assistant("npc", model).with_system_prompt("You are the innkeeper."))
        .unwrap();
    for i in 0..10 {
        let before = a.status().turns;
        a.try_send_event(UserEvent::new(format!("question {i}")))
            .unwrap();
        until("turn", || a.status().turns == before + 1).await;
    }
    // Before turns 3, 5, 7 and 9 (after 2, 4, 6 and 8 finished).
    let reflections = journaled(&journal, |kind| match kind {
        EventKind::Reflected { reflection } => Some(reflection),
        _ => None,
    });
    assert_eq!(
        reflections,
        [
            "reflection 1",
            "reflection 2",
            "reflection 3",
            "reflection 4"
        ]
    );
    let record = a.record();
    assert_eq!(
        record.reflections,
        ["reflection 2", "reflection 3", "reflection 4"]
    );
    assert_eq!(record.reflected_at, 8);
    let seen = seen.lock();
    let reflection_request = seen
        .iter()
        .find(|r| warden::memory::is_reflection_request(r))
        .unwrap();
    assert!(reflection_request.tools.is_empty());
    assert!(reflection_request.messages[1]
        .content
        .as_deref()
        .unwrap()
        .contains("user: [api] question 1"));
    assert_eq!(
        seen.last().unwrap().messages[0].content.as_deref(),
        Some("You are the innkeeper.\n\nYour recent reflections:\n- reflection 2\n- reflection 3\n- reflection 4")
    );
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn an_agent_can_have_its_own_memory_settings() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let reflective = warden::protocols::MemoryConfig {
        reflection_interval: 1,
        ..Default::default()
    };
    let model = || {
        Arc::new(ScriptedProvider::new([]).with_fallback(|req| {
            if warden::memory::is_reflection_request(req) {
                ScriptStep::reply("thinking")
            } else {
                ScriptStep::reply("ok")
            }
        }))
    };
    let npc = team
        .spawn(AgentSpec::assistant("npc", model()).with_memory(reflective))
        .unwrap();
    let other = team.assistant("other", model());
    for a in [&npc, &other] {
        for _ in 0..2 {
            let before = a.status().turns;
            a.try_send_event(UserEvent::new("hi")).unwrap();
            until("turn", || a.status().turns == before + 1).await;
        }
    }
    assert_eq!(npc.record().reflections, ["thinking"]);
    assert!(other.record().reflections.is_empty());
    replay_matches(&journal, &npc);
    let bad = warden::protocols::MemoryConfig {
        keep_percent: 90,
        ..Default::default()
    };
    let err = team
        .spawn(AgentSpec::assistant("bad", chatty()).with_memory(bad))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid value for `memory.keep_percent`: 90 (allowed: 10 to 70)"
    );
}
