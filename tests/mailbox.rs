//! The priority mailbox's safety properties, numbered as in the foundation issue.
mod common;
use common::*;
use futures::future::BoxFuture;
use serde_json::json;
use std::{
    num::NonZeroUsize,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use warden::*;

fn config_with_capacity(capacity: usize) -> WardenConfig {
    let mut c = WardenConfig::default();
    c.mailbox.ordinary_capacity = NonZeroUsize::new(capacity).unwrap();
    c
}

fn operator() -> HaltCause {
    HaltCause::Operator {
        operator: "test".into(),
    }
}

/// Property 1 and 3: a halt sent behind N queued ordinary messages is acted on first; none of the N
/// starts an LLM call or a tool; each is counted and journaled.
async fn halt_before_backlog(n: usize) {
    let (team, journal) = team(config_with_capacity(n + 10));
    let model =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::call("work", json!({}))));
    let stats = model.stats();
    let (tool, tool_calls) = counting_tool("work", ToolCategory::SafeChain, false);
    let agent = team
        .spawn(AgentSpec::assistant("a", model).with_tool(tool))
        .unwrap();
    // No yield between these sends: the actor cannot run until the halt is queued too.
    for i in 0..n {
        agent
            .try_send_event(UserEvent::new(format!("event {i}")))
            .unwrap();
    }
    assert_eq!(agent.status().queued.ordinary, n);
    let ack = agent.halt(operator()).await;

    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(ack.discarded, n as u64);
    assert_eq!(
        stats.calls.load(Ordering::SeqCst),
        0,
        "an ordinary message started an LLM call"
    );
    assert_eq!(count(&tool_calls), 0, "an ordinary message started a tool");
    let status = agent.status();
    assert_eq!(status.state, AgentState::Stopped);
    assert_eq!(status.queued.ordinary, 0);
    assert_eq!(status.discarded_by_halt, n as u64);
    assert_eq!(status.turns, 0);

    // Each cleared message is journaled, by id and kind (the listing follows the ack shortly, in
    // chunks), exactly once.
    let listed = || -> Vec<u64> {
        journal
            .events_of("a")
            .iter()
            .flat_map(|e| match &e.kind {
                EventKind::MessagesDiscarded { messages } => {
                    assert!(messages
                        .iter()
                        .all(|m| m.kind == "user_event" && m.priority == Priority::Ordinary));
                    messages.iter().map(|m| m.id).collect()
                }
                _ => Vec::new(),
            })
            .collect()
    };
    let listed_count = || -> usize {
        journal.inspect(|events| {
            events
                .iter()
                .map(|e| match &e.kind {
                    EventKind::MessagesDiscarded { messages } if e.agent.as_str() == "a" => {
                        messages.len()
                    }
                    _ => 0,
                })
                .sum()
        })
    };
    until("every discarded message listed", || listed_count() >= n).await;
    let mut ids = listed();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        n,
        "a discarded message listed twice or not at all"
    );
    let events = journal.events_of("a");
    assert!(!events.iter().any(|e| matches!(
        e.kind,
        EventKind::StateChanged {
            to: AgentState::Executing,
            ..
        }
    )));

    // Nothing runs later either, and nothing is listed twice.
    tokio::time::advance(Duration::from_secs(3600)).await;
    settle(100).await;
    assert_eq!(stats.calls.load(Ordering::SeqCst), 0);
    assert_eq!(listed_count(), n);
    assert_eq!(
        AgentRecord::replay("a".into(), &journal.events()),
        agent.record()
    );
}

#[actix_rt::test]
async fn p1_halt_is_acted_on_before_a_backlog_of_1000() {
    tokio::time::pause();
    halt_before_backlog(1000).await;
}

#[actix_rt::test]
async fn p1_halt_is_acted_on_before_a_backlog_of_1_000_000() {
    tokio::time::pause();
    halt_before_backlog(1_000_000).await;
}

#[actix_rt::test]
async fn p1_halt_preempts_a_backlog_behind_a_busy_agent() {
    tokio::time::pause();
    let (team, _journal) = team(config_with_capacity(20_000));
    let model = Arc::new(
        ScriptedProvider::new([ScriptStep::reply("slow").delayed(Duration::from_secs(30))])
            .with_fallback(|_| ScriptStep::reply("fast")),
    );
    let stats = model.stats();
    let agent = team.assistant("a", model);
    agent.try_send_event(UserEvent::new("first")).unwrap();
    until("first turn in flight", || {
        stats.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    for i in 0..10_000 {
        agent
            .try_send_event(UserEvent::new(format!("e{i}")))
            .unwrap();
    }
    let ack = agent.halt(operator()).await;
    assert_eq!(ack.discarded, 10_000);
    assert_eq!(
        stats.calls.load(Ordering::SeqCst),
        1,
        "no queued message reached the model"
    );
    assert_eq!(stats.dropped_in_flight.load(Ordering::SeqCst), 1);
    assert_eq!(agent.status().turns, 0);
}

/// A provider that requests a tool, and whose answer arrives together with a halt: the halt is
/// requested (synchronously, as an operator would) inside the provider's future right before it returns.
struct HaltingProvider {
    target: Mutex<Option<AgentHandle>>,
}

impl Provider for HaltingProvider {
    fn name(&self) -> &str {
        "halting"
    }
    fn complete(
        &self,
        _request: LlmRequest,
    ) -> BoxFuture<'static, Result<LlmResponse, ProviderError>> {
        let target = self.target.lock().unwrap().clone();
        Box::pin(async move {
            if let Some(agent) = target {
                drop(agent.halt(HaltCause::Operator {
                    operator: "race".into(),
                }));
            }
            Ok(LlmResponse {
                message: ChatMessage::assistant_tool_calls(
                    None,
                    vec![warden::protocols::ToolCall::new("c1", "work", &json!({}))],
                ),
                finish_reason: warden::protocols::FinishReason::ToolCalls,
                usage: warden::protocols::Usage {
                    prompt_tokens: 5,
                    completion_tokens: 2,
                    estimated: false,
                },
            })
        })
    }
}

#[actix_rt::test]
async fn p2_no_tool_starts_after_a_halt_even_before_the_actor_reads_it() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let provider = Arc::new(HaltingProvider {
        target: Mutex::new(None),
    });
    let (tool, tool_calls) = counting_tool("work", ToolCategory::SafeChain, false);
    let agent = team
        .spawn(AgentSpec::assistant("a", provider.clone()).with_tool(tool))
        .unwrap();
    *provider.target.lock().unwrap() = Some(agent.clone());
    agent.try_send_event(UserEvent::new("go")).unwrap();
    until("stopped", || agent.state() == AgentState::Stopped).await;
    settle(50).await;
    assert_eq!(count(&tool_calls), 0, "a tool started after the halt");
    let events = journal.events_of("a");
    assert!(!events
        .iter()
        .any(|e| matches!(e.kind, EventKind::ToolStarted { .. })));
}

/// A model reply that comes back in the very poll its halt landed in (the provider halts the agent,
/// then answers at once, so the turn's `select!` sees the reply before the cancellation) is stale:
/// it is not written to the history, nothing runs after it, and its tokens still count.
#[actix_rt::test]
async fn a_reply_that_races_its_halt_is_dropped_before_any_side_effect() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let provider = Arc::new(HaltingProvider {
        target: Mutex::new(None),
    });
    let (tool, tool_calls) = counting_tool("work", ToolCategory::SafeChain, false);
    let agent = team
        .spawn(AgentSpec::assistant("a", provider.clone()).with_tool(tool))
        .unwrap();
    *provider.target.lock().unwrap() = Some(agent.clone());
    agent.try_send_event(UserEvent::new("go")).unwrap();
    until("stopped", || agent.state() == AgentState::Stopped).await;
    settle(50).await;
    assert_eq!(count(&tool_calls), 0);
    let history = agent.record().history;
    assert!(
        history
            .iter()
            .all(|m| m.role != warden::protocols::ChatRole::Assistant),
        "the stale reply reached the history: {history:?}"
    );
    assert_eq!(
        agent.record().usage.tokens(),
        7,
        "the stale call's tokens count"
    );
    replay_matches(&journal, &agent);
}

#[actix_rt::test]
async fn p2_halt_drops_the_in_flight_llm_request_and_no_tool_starts() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let model = model([ScriptStep::call("work", json!({})).delayed(Duration::from_secs(10))]);
    let stats = model.stats();
    let (tool, tool_calls) = counting_tool("work", ToolCategory::SafeChain, false);
    let agent = team
        .spawn(AgentSpec::assistant("a", model).with_tool(tool))
        .unwrap();
    agent.try_send_event(UserEvent::new("go")).unwrap();
    until("llm call in flight", || {
        stats.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(agent.state(), AgentState::Executing);

    let ack = agent.halt(operator()).await;
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(
        stats.dropped_in_flight.load(Ordering::SeqCst),
        1,
        "the LLM future was not dropped"
    );
    assert_eq!(stats.completed.load(Ordering::SeqCst), 0);
    // Long after the call would have answered, still no tool.
    tokio::time::advance(Duration::from_secs(60)).await;
    settle(100).await;
    assert_eq!(count(&tool_calls), 0);
}

#[actix_rt::test]
async fn p2_halt_during_a_tool_drops_it_and_starts_no_further_tool() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let started = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let (s, f) = (started.clone(), finished.clone());
    let slow = FnTool::new(
        "slow",
        "slow tool",
        ToolCategory::SafeChain,
        move |_a, _c| {
            s.fetch_add(1, Ordering::SeqCst);
            let f = f.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(20)).await;
                f.fetch_add(1, Ordering::SeqCst);
                Ok(json!({}))
            }
        },
    );
    let model =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::call("slow", json!({}))));
    let agent = team
        .spawn(AgentSpec::assistant("a", model).with_tool(slow))
        .unwrap();
    agent.try_send_event(UserEvent::new("go")).unwrap();
    until("tool running", || {
        agent.state() == AgentState::WaitingForTool
    })
    .await;
    let ack = agent.halt(operator()).await;
    assert_eq!(ack.state, AgentState::Stopped);
    tokio::time::advance(Duration::from_secs(120)).await;
    settle(100).await;
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the running tool was not dropped"
    );
    let stop = journal
        .events_of("a")
        .into_iter()
        .find_map(|e| match e.kind {
            EventKind::StateChanged {
                from,
                to: AgentState::Stopped,
                ..
            } => Some(from),
            _ => None,
        });
    assert_eq!(stop, Some(AgentState::WaitingForTool));
}

#[actix_rt::test]
async fn p4_full_ordinary_lane_hands_the_event_back_and_never_blocks_halt_or_control() {
    tokio::time::pause();
    let (team, _journal) = team(config_with_capacity(3));
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    let agent = team.assistant("a", model);
    agent.pause("op").await.unwrap();
    for i in 0..3 {
        agent
            .try_send_event(UserEvent::new(format!("{i}")))
            .unwrap();
    }
    let err = agent
        .try_send_event(UserEvent::new("overflow"))
        .unwrap_err();
    assert_eq!(err.refusal, WorkRefusal::MailboxFull { capacity: 3 });
    assert_eq!(
        err.event.content, "overflow",
        "the refused event is handed back"
    );
    assert_eq!(err.to_string(), "ordinary mailbox is full (3 messages)");

    // Control still gets through a full lane (resume is read from lane 1) …
    assert_eq!(agent.status().queued.ordinary, 3);
    // … and a waiting sender completes once the agent drains.
    let waiter = {
        let agent = agent.clone();
        actix_rt::spawn(async move { agent.send_event(UserEvent::new("patient")).await })
    };
    settle(20).await;
    assert!(
        !waiter.is_finished(),
        "send_event must wait while the lane is full"
    );
    agent.resume("op").await.unwrap();
    let id = within("waiting send", 10_000, waiter).await.unwrap();
    assert!(id.is_ok());
    until("all four answered", || agent.status().turns == 4).await;
}

#[actix_rt::test]
async fn p4_halt_gets_through_a_full_lane() {
    tokio::time::pause();
    let (team, _journal) = team(config_with_capacity(2));
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    let agent = team.assistant("a", model);
    agent.pause("op").await.unwrap();
    agent.try_send_event(UserEvent::new("1")).unwrap();
    agent.try_send_event(UserEvent::new("2")).unwrap();
    assert!(agent.try_send_event(UserEvent::new("3")).is_err());
    let ack = agent.halt(operator()).await;
    assert_eq!((ack.state, ack.discarded), (AgentState::Stopped, 2));
    // A stopped agent refuses new work with a typed refusal.
    let err = agent.try_send_event(UserEvent::new("late")).unwrap_err();
    assert_eq!(err.refusal, WorkRefusal::Stopped);
}

#[actix_rt::test]
async fn p5_halt_all_returns_once_every_agent_acknowledged_stopped() {
    tokio::time::pause();
    let (team, _journal) = team(config_with_capacity(1000));
    let mut agents = Vec::new();
    for i in 0..50 {
        // Half are busy in a slow LLM call with a backlog, half idle.
        let model = Arc::new(
            ScriptedProvider::new([])
                .with_fallback(|_| ScriptStep::reply("x").delayed(Duration::from_secs(100))),
        );
        let a = team
            .spawn(AgentSpec::assistant(format!("a{i}"), model))
            .unwrap();
        if i % 2 == 0 {
            for j in 0..10 {
                a.try_send_event(UserEvent::new(format!("{j}"))).unwrap();
            }
        }
        agents.push(a);
    }
    until("busy agents executing", || {
        agents
            .iter()
            .step_by(2)
            .all(|a| a.state() == AgentState::Executing)
    })
    .await;
    let acks = team.halt_all().await;
    assert_eq!(acks.len(), 50);
    assert!(acks.iter().all(|a| a.state == AgentState::Stopped));
    assert_eq!(acks.iter().map(|a| a.discarded).sum::<u64>(), 25 * 9);
    assert!(team
        .statuses()
        .iter()
        .all(|s| s.state == AgentState::Stopped));
}

#[actix_rt::test]
async fn control_lane_is_read_while_a_turn_runs_and_before_queued_work() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = Arc::new(
        ScriptedProvider::new([])
            .with_fallback(|_| ScriptStep::reply("x").delayed(Duration::from_secs(5))),
    );
    let agent = team.assistant("a", model);
    agent.try_send_event(UserEvent::new("1")).unwrap();
    agent.try_send_event(UserEvent::new("2")).unwrap();
    until("executing", || agent.state() == AgentState::Executing).await;
    // Pause is answered while the first turn is still running.
    within("pause answered during a turn", 10_000, agent.pause("op"))
        .await
        .unwrap();
    assert_eq!(agent.state(), AgentState::Executing);
    until("first turn done", || agent.status().turns == 1).await;
    settle(100).await;
    tokio::time::advance(Duration::from_secs(60)).await;
    settle(100).await;
    assert_eq!(
        agent.status().turns,
        1,
        "paused: the queued event must wait"
    );
    assert_eq!(agent.status().queued.ordinary, 1);
    agent.resume("op").await.unwrap();
    until("second turn", || agent.status().turns == 2).await;
    assert_eq!(
        AgentRecord::replay("a".into(), &journal.events()),
        agent.record()
    );
}
