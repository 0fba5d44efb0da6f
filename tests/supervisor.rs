//! The supervisor: every delegation refusal (typed, journaled on the delegator, counted as a failed
//! tool call), slot release on every way a delegation can end, halt propagation down delegation
//! trees, restarts (strategies, kept safety state, restart intensity) and halt-all on a mixed team.
//!
//! Everything runs on the test's arbiter with paused time; nothing sleeps on the wall clock.
mod common;
use common::*;
use serde_json::json;
use std::{
    num::{NonZeroU32, NonZeroUsize},
    sync::Arc,
    time::Duration,
};
use warden::protocols::{
    DelegationOutcome, DelegationRefusal, FinishReason, Lockout, RestartStrategy, ToolCall, Usage,
};
use warden::*;

/// An LLM call that never finishes within a test (the tests halt or time out long before).
const SLOW: Duration = Duration::from_secs(10_000);

// ---- helpers ------------------------------------------------------------------------------------

fn parent(key: &str) -> HaltCause {
    HaltCause::Parent { parent: key.into() }
}

fn key(k: &str) -> AgentKey {
    AgentKey::from(k)
}

/// A config whose turns are one LLM call (and its tool calls) long, so a failed delegation leaves the
/// delegator's error count where the refusal put it.
fn one_step_config() -> WardenConfig {
    let mut config = WardenConfig::default();
    config.execution.max_iterations_per_tick = 1;
    config
}

fn requested(journal: &MemoryJournal, agent: &str) -> Vec<(u64, AgentKey, u32)> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::DelegationRequested { id, to, hops, .. } => Some((id, to, hops)),
            _ => None,
        })
        .collect()
}

fn halt_causes(journal: &MemoryJournal, agent: &str) -> Vec<HaltCause> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Halted { cause, .. } => Some(cause),
            _ => None,
        })
        .collect()
}

/// The refused delegation was a failed `delegate` tool call: right after the `DelegationRefused`, the
/// tool finished with the refusal as its error and the error count went to `errors_after`.
fn assert_refusal_counted(
    journal: &MemoryJournal,
    delegator: &str,
    refusal: &DelegationRefusal,
    errors_after: u32,
) {
    let events = journal.events_of(delegator);
    let at = events
        .iter()
        .position(
            |e| matches!(&e.kind, EventKind::DelegationRefused { refusal: r, .. } if r == refusal),
        )
        .unwrap_or_else(|| panic!("no DelegationRefused {refusal:?} on {delegator}"));
    let message = format!("delegation refused: {refusal}");
    let finished = events[at..]
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolFinished {
                tool, ok, error, ..
            } if tool == "delegate" => Some((*ok, error.clone())),
            _ => None,
        })
        .expect("the delegate tool call finished");
    assert_eq!(finished, (false, Some(message.clone())));
    let counted = events[at..]
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ErrorCounted {
                consecutive_errors,
                error,
            } => Some((*consecutive_errors, error.clone())),
            _ => None,
        })
        .expect("the refusal was counted as an error");
    assert_eq!(
        counted,
        (errors_after, format!("tool delegate failed: {message}"))
    );
}

/// Sends one event and waits for the turn it starts to finish.
async fn turn(agent: &AgentHandle, text: &str) {
    let before = agent.status().turns;
    agent.try_send_event(UserEvent::new(text)).unwrap();
    until("turn finished", || agent.status().turns == before + 1).await;
}

/// One failing LLM call per event until the agent is locked out.
async fn lock_out(agent: &AgentHandle) {
    while agent.state() != AgentState::SafetyLockout {
        let before = agent.status().turns;
        agent.try_send_event(UserEvent::new("fail")).unwrap();
        until("failing turn finished", || {
            agent.status().turns == before + 1
        })
        .await;
    }
}

// ---- 1. refusals ----------------------------------------------------------------------------------

#[actix_rt::test]
async fn delegating_to_a_locked_out_agent_is_refused_as_emergency_stop() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(2).unwrap();
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "help")]));
    let pb = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("down")));
    let b_stats = pb.stats();
    let b = team.sub_agent("b", "a", pb);
    lock_out(&b).await;
    assert_eq!(b_stats.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    let b_events = journal.events_of("b").len();

    turn(&a, "ask b").await;

    let refusal = DelegationRefusal::EmergencyStop {
        delegate: key("b"),
        state: AgentState::SafetyLockout,
    };
    assert_eq!(refusals(&journal, "a"), vec![(key("b"), refusal.clone())]);
    assert_refusal_counted(&journal, "a", &refusal, 1);
    assert!(requested(&journal, "a").is_empty(), "no slot was taken");
    assert!(endings(&journal, "a").is_empty());
    let s = a.status();
    assert_eq!((s.consecutive_errors, s.active_sub_agents), (1, 0));
    assert_eq!(s.state, AgentState::WaitingForEvent);
    // Nothing reached b: no model call, no event at all.
    assert_eq!(b_stats.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(journal.events_of("b").len(), b_events);
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn delegating_to_a_halted_agent_is_refused_with_state_stopped() {
    tokio::time::pause();
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("b", "help")]));
    let b = team.sub_agent("b", "a", model([]));
    let ack = within("halt b", 1000, b.halt(op())).await;
    assert_eq!(ack.state, AgentState::Stopped);

    turn(&a, "ask b").await;

    // Halted, not locked out: stopped, not emergency-stopped (a resume brings it back).
    let refusal = DelegationRefusal::Stopped {
        delegate: key("b"),
        state: AgentState::Stopped,
    };
    assert_eq!(refusals(&journal, "a"), vec![(key("b"), refusal.clone())]);
    assert_refusal_counted(&journal, "a", &refusal, 1);
    assert_eq!(a.status().consecutive_errors, 1);
    assert_eq!(a.status().active_sub_agents, 0);
    assert_eq!(b.state(), AgentState::Stopped);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn delegating_to_an_unknown_agent_is_refused() {
    tokio::time::pause();
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("ghost", "boo")]));
    turn(&a, "ask ghost").await;
    let refusal = DelegationRefusal::UnknownDelegate {
        delegate: key("ghost"),
    };
    assert_eq!(
        refusals(&journal, "a"),
        vec![(key("ghost"), refusal.clone())]
    );
    assert_refusal_counted(&journal, "a", &refusal, 1);
    assert_eq!(a.status().consecutive_errors, 1);
    assert_eq!(a.status().active_sub_agents, 0);
    // The model saw the refusal as the tool's result.
    let history = a.record().history;
    let last = history.last().unwrap();
    assert_eq!(last.role, warden::protocols::ChatRole::Tool);
    assert_eq!(
        last.content.as_deref(),
        Some(
            json!({"success": false, "error": "delegation refused: unknown delegate ghost"})
                .to_string()
                .as_str()
        )
    );
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn the_hop_limit_allows_a_to_b_and_refuses_b_to_c() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.loop_.max_agent_hops = 1;
    let (team, journal) = team(config);
    let a = team.assistant(
        "a",
        model([delegate("b", "go deeper"), ScriptStep::reply("a done")]),
    );
    let b = team.sub_agent(
        "b",
        "a",
        model([delegate("c", "deeper"), ScriptStep::reply("c unreachable")]),
    );
    let pc = model([ScriptStep::reply("never")]);
    let c_stats = pc.stats();
    let c = team.sub_agent("c", "b", pc);

    turn(&a, "start").await;

    // a → b is hop 1: allowed, and it completed.
    assert_eq!(
        requested(&journal, "a")
            .into_iter()
            .map(|(_, to, hops)| (to, hops))
            .collect::<Vec<_>>(),
        vec![(key("b"), 1)]
    );
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Completed)]
    );
    assert!(refusals(&journal, "a").is_empty());
    // b → c would be hop 2: refused on b, counted as b's failed tool call.
    let refusal = DelegationRefusal::HopLimit { hops: 2, max: 1 };
    assert_eq!(refusals(&journal, "b"), vec![(key("c"), refusal.clone())]);
    assert_refusal_counted(&journal, "b", &refusal, 1);
    assert!(requested(&journal, "b").is_empty());
    assert_eq!(c_stats.calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(c.status().turns, 0);
    for h in [&a, &b] {
        assert_eq!(h.status().active_sub_agents, 0);
        replay_matches(&journal, h);
    }
}

#[actix_rt::test]
async fn zero_hops_forbids_delegation() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.safety.loop_.max_agent_hops = 0;
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "x")]));
    team.sub_agent("b", "a", model([]));
    turn(&a, "start").await;
    let refusal = DelegationRefusal::HopLimit { hops: 1, max: 0 };
    assert_eq!(refusals(&journal, "a"), vec![(key("b"), refusal.clone())]);
    assert_refusal_counted(&journal, "a", &refusal, 1);
    assert_eq!(a.status().consecutive_errors, 1);
}

#[actix_rt::test]
async fn a_delegation_back_to_the_root_is_refused_as_a_cycle() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let a = team.assistant(
        "a",
        model([delegate("b", "help"), ScriptStep::reply("a done")]),
    );
    let b = team.sub_agent(
        "b",
        "a",
        model([delegate("a", "help me back"), ScriptStep::reply("b done")]),
    );
    turn(&a, "start").await;
    let refusal = DelegationRefusal::Cycle {
        chain: vec![key("a"), key("b"), key("a")],
    };
    assert_eq!(refusals(&journal, "b"), vec![(key("a"), refusal.clone())]);
    assert_refusal_counted(&journal, "b", &refusal, 1);
    assert_eq!(
        refusal.to_string(),
        "delegation cycle: a -> b -> a",
        "the chain is named in order"
    );
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Completed)]
    );
    assert_eq!(a.status().turns, 1, "a was not re-entered");
    for h in [&a, &b] {
        assert_eq!(h.status().active_sub_agents, 0);
        replay_matches(&journal, h);
    }
}

#[actix_rt::test]
async fn delegating_to_oneself_is_a_cycle() {
    tokio::time::pause();
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("a", "me")]));
    turn(&a, "start").await;
    let refusal = DelegationRefusal::Cycle {
        chain: vec![key("a"), key("a")],
    };
    assert_eq!(refusals(&journal, "a"), vec![(key("a"), refusal.clone())]);
    assert_refusal_counted(&journal, "a", &refusal, 1);
    assert_eq!(a.status().consecutive_errors, 1);
}

#[actix_rt::test]
async fn a_zero_budget_refuses_every_delegation() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.delegation.sub_agent_budget = 0;
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "x")]));
    let b = team.sub_agent("b", "a", model([]));
    turn(&a, "start").await;
    let refusal = DelegationRefusal::SubAgentBudget {
        active: 0,
        budget: 0,
    };
    assert_eq!(refusals(&journal, "a"), vec![(key("b"), refusal.clone())]);
    assert_refusal_counted(&journal, "a", &refusal, 1);
    assert_eq!(a.status().active_sub_agents, 0);
    assert_eq!(a.status().sub_agent_budget, 0);
    assert_eq!(b.status().turns, 0);
}

#[actix_rt::test]
async fn a_budget_of_one_holds_one_slot_while_running_and_frees_it_for_the_next() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.delegation.sub_agent_budget = 1;
    let (team, journal) = team(config);
    let a = team.assistant(
        "a",
        model([
            delegate("b", "one"),
            delegate("c", "two"),
            ScriptStep::reply("both done"),
        ]),
    );
    let b = team.sub_agent(
        "b",
        "a",
        model([ScriptStep::reply("b").delayed(Duration::from_secs(10))]),
    );
    let c = team.sub_agent(
        "c",
        "a",
        model([ScriptStep::reply("c").delayed(Duration::from_secs(10))]),
    );
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("b working", || b.state() == AgentState::Executing).await;
    let s = a.status();
    assert_eq!((s.active_sub_agents, s.sub_agent_budget), (1, 1));
    assert_eq!(s.state, AgentState::WaitingForTool);
    until("c working", || c.state() == AgentState::Executing).await;
    assert_eq!(a.status().active_sub_agents, 1, "b's slot was released");
    until("a done", || a.status().turns == 1).await;
    assert!(refusals(&journal, "a").is_empty());
    assert_eq!(
        endings(&journal, "a"),
        vec![
            (key("b"), DelegationOutcome::Completed),
            (key("c"), DelegationOutcome::Completed)
        ]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    replay_matches(&journal, &a);
}

/// One model response carrying `n` `delegate` calls (parallel tool calls, as Chat Completions allows).
fn parallel_delegations(n: usize) -> ScriptStep {
    let calls = (0..n)
        .map(|i| {
            ToolCall::new(
                format!("call_{i}"),
                "delegate",
                &json!({"agent": format!("d{i}"), "task": "work"}),
            )
        })
        .collect();
    ScriptStep::Respond(LlmResponse {
        message: ChatMessage::assistant_tool_calls(None, calls),
        finish_reason: FinishReason::ToolCalls,
        usage: Usage::default(),
    })
}

/// `n` delegations asked for at once with `budget` slots: `budget` run together, the rest are refused.
async fn budget_is_reached_by_concurrent_delegations(budget: u32, n: usize) {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.delegation.sub_agent_budget = budget;
    config.safety.timeout.chain_seconds = 0.0;
    let (team, journal) = team(config);
    let a = team.assistant(
        "a",
        model([parallel_delegations(n), ScriptStep::reply("done")]),
    );
    for i in 0..n {
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
    assert_eq!(peak, budget, "delegations running at once");
    let refused: Vec<_> = refusals(&journal, "a");
    assert_eq!(
        refused.len(),
        n - budget as usize,
        "refused beyond the budget"
    );
    for (_, refusal) in refused {
        assert_eq!(
            refusal,
            DelegationRefusal::SubAgentBudget {
                active: budget,
                budget
            }
        );
    }
    assert_eq!(a.status().active_sub_agents, 0);
}

#[actix_rt::test]
async fn budget_one_refuses_a_second_delegation_while_the_first_runs() {
    budget_is_reached_by_concurrent_delegations(1, 2).await;
}

#[actix_rt::test]
async fn budget_two_runs_exactly_two_at_once_and_refuses_the_third() {
    budget_is_reached_by_concurrent_delegations(2, 3).await;
}

#[actix_rt::test]
async fn a_delegate_with_a_full_mailbox_refuses_the_task_and_the_slot_is_released() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.mailbox.ordinary_capacity = NonZeroUsize::new(1).unwrap();
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "x")]));
    let b = team.sub_agent("b", "a", model([ScriptStep::reply("slow").delayed(SLOW)]));
    b.try_send_event(UserEvent::new("busy")).unwrap();
    until("b busy", || b.state() == AgentState::Executing).await;
    b.try_send_event(UserEvent::new("queued")).unwrap();
    assert_eq!(b.status().queued.ordinary, 1);

    turn(&a, "ask b").await;

    let refusal = DelegationRefusal::DelegateRefused {
        delegate: key("b"),
        refusal: WorkRefusal::MailboxFull { capacity: 1 },
    };
    assert_eq!(refusals(&journal, "a"), vec![(key("b"), refusal.clone())]);
    assert_refusal_counted(&journal, "a", &refusal, 1);
    // The slot had been taken, so its ending is journaled too.
    assert_eq!(requested(&journal, "a").len(), 1);
    assert_eq!(
        endings(&journal, "a"),
        vec![(
            key("b"),
            DelegationOutcome::Failed {
                error: "ordinary mailbox is full (1 messages)".into()
            }
        )]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    assert_eq!(a.status().consecutive_errors, 1);
    assert_eq!(b.status().queued.ordinary, 1, "b's queue untouched");
    replay_matches(&journal, &a);
}

// ---- 2. every ending releases the slot -------------------------------------------------------------

/// a delegates to b once (one-step turns); returns after a's turn.
async fn one_delegation(
    b_steps: Vec<ScriptStep>,
) -> (Supervisor, Arc<MemoryJournal>, AgentHandle, AgentHandle) {
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent("b", "a", model(b_steps));
    turn(&a, "go").await;
    (team, journal, a, b)
}

/// The delegator's `delegation_requested` names the task (the console's timeline shows it): the
/// whole of a short one, the first 200 characters and `…` of a long one.
#[actix_rt::test]
async fn the_delegation_requested_entry_carries_the_task_cut_at_200_characters() {
    tokio::time::pause();
    let long = "é".repeat(250);
    let (team, journal) = team(WardenConfig::default());
    let a = team.assistant(
        "a",
        model([
            delegate("b", "When does the library open?"),
            ScriptStep::reply("at 9"),
            delegate("b", &long),
            ScriptStep::reply("done"),
        ]),
    );
    let _b = team.sub_agent(
        "b",
        "a",
        model([ScriptStep::reply("9"), ScriptStep::reply("ok")]),
    );
    turn(&a, "go").await;
    turn(&a, "again").await;
    let tasks: Vec<String> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::DelegationRequested { task, .. } => Some(task),
            _ => None,
        })
        .collect();
    assert_eq!(
        tasks,
        vec![
            "When does the library open?".to_owned(),
            format!("{}…", "é".repeat(200))
        ]
    );
}

#[actix_rt::test]
async fn a_completed_delegation_releases_its_slot() {
    tokio::time::pause();
    let (_team, journal, a, b) = one_delegation(vec![ScriptStep::reply("42")]).await;
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Completed)]
    );
    let s = a.status();
    assert_eq!((s.active_sub_agents, s.consecutive_errors), (0, 0));
    let last = a.record().history.pop().unwrap();
    assert_eq!(
        last.content.as_deref(),
        Some(json!({"agent": "b", "answer": "42"}).to_string().as_str())
    );
    // b's task arrived as a user message and was answered.
    let bh = b.record().history;
    assert_eq!(bh[0].content.as_deref(), Some("task"));
    assert_eq!(bh[1].content.as_deref(), Some("42"));
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn a_failed_delegate_turn_ends_the_delegation_failed() {
    tokio::time::pause();
    let (_team, journal, a, b) = one_delegation(vec![ScriptStep::fail("model down")]).await;
    assert_eq!(
        endings(&journal, "a"),
        vec![(
            key("b"),
            DelegationOutcome::Failed {
                error: "llm call failed: model down".into()
            }
        )]
    );
    let s = a.status();
    assert_eq!((s.active_sub_agents, s.consecutive_errors), (0, 1));
    assert_eq!(b.status().consecutive_errors, 1);
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn a_delegate_that_locks_out_mid_task_fails_the_delegation_and_notifies_the_delegator() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(1).unwrap();
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent("b", "a", model([ScriptStep::fail("down")]));
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("a's turn over", || {
        a.status().turns == 1 || a.state() == AgentState::SafetyLockout
    })
    .await;
    let reason = "Maximum consecutive errors reached (1)".to_string();
    assert_eq!(b.state(), AgentState::SafetyLockout);
    assert_eq!(
        endings(&journal, "a"),
        vec![(
            key("b"),
            DelegationOutcome::Failed {
                error: format!("delegate locked out: {reason}")
            }
        )]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    // The failed delegation tripped a too (threshold 1).
    assert_eq!(a.state(), AgentState::SafetyLockout);
    settle(100).await;
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::DelegateLockedOut { delegate, reason: r } if delegate.as_str() == "b" && *r == reason
        )),
        1,
        "the delegator was told its delegate locked out"
    );
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn a_task_queued_behind_a_lockout_is_refused_and_the_delegation_fails() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(2).unwrap();
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent(
        "b",
        "a",
        model([
            ScriptStep::fail("one"),
            ScriptStep::fail("two").delayed(Duration::from_secs(5)),
        ]),
    );
    turn(&b, "first failure").await;
    b.try_send_event(UserEvent::new("second failure, slow"))
        .unwrap();
    until("b busy", || b.state() == AgentState::Executing).await;
    // b is busy but not locked out: the task is accepted and queued; then b trips.
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("a done", || a.status().turns == 1).await;
    let reason = "Maximum consecutive errors reached (2)";
    assert_eq!(b.state(), AgentState::SafetyLockout);
    assert_eq!(
        endings(&journal, "a"),
        vec![(
            key("b"),
            DelegationOutcome::Failed {
                error: format!("task refused: agent is in SAFETY_LOCKOUT: {reason}")
            }
        )]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    assert_eq!(
        count_events(&journal, "b", |k| matches!(
            k,
            EventKind::WorkRefused { work, refusal: WorkRefusal::LockedOut { .. }, .. } if work == "delegated_task"
        )),
        1
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::DelegateLockedOut { .. }
        )),
        1
    );
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn a_chain_timeout_ends_the_delegation_timed_out() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.safety.timeout.chain_seconds = 2.0;
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent(
        "b",
        "a",
        model([ScriptStep::reply("too late").delayed(Duration::from_secs(30))]),
    );
    let started = tokio::time::Instant::now();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("b busy", || b.state() == AgentState::Executing).await;
    assert_eq!(a.status().active_sub_agents, 1);
    until("a done", || a.status().turns == 1).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "timed out after {waited:?}"
    );
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::TimedOut { after_ms: 2000 })]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    assert_eq!(a.status().consecutive_errors, 1);
    // b finishes later; its answer goes nowhere and changes nothing on a.
    until("b done", || b.status().turns == 1).await;
    assert_eq!(endings(&journal, "a").len(), 1);
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn halting_the_delegator_mid_delegation_cancels_it() {
    tokio::time::pause();
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent("b", "a", model([ScriptStep::reply("never").delayed(SLOW)]));
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("b busy", || b.state() == AgentState::Executing).await;
    assert_eq!(a.status().active_sub_agents, 1);
    let ack = within("halt a", 1000, a.halt(op())).await;
    assert_eq!(ack.state, AgentState::Stopped);
    until("slot released", || a.status().active_sub_agents == 0).await;
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Cancelled)]
    );
    until("b halted too", || b.state() == AgentState::Stopped).await;
    assert_eq!(halt_causes(&journal, "b"), vec![parent("a")]);
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn halting_the_delegate_mid_task_abandons_the_delegation() {
    tokio::time::pause();
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent("b", "a", model([ScriptStep::reply("never").delayed(SLOW)]));
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("b busy", || b.state() == AgentState::Executing).await;
    let ack = within("halt b", 1000, b.halt(op())).await;
    assert_eq!(ack.state, AgentState::Stopped);
    until("a done", || a.status().turns == 1).await;
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Abandoned)]
    );
    let s = a.status();
    assert_eq!(
        (s.active_sub_agents, s.consecutive_errors, s.state),
        (0, 1, AgentState::WaitingForEvent),
        "the delegator is not halted by its delegate's halt"
    );
    assert!(halt_causes(&journal, "a").is_empty());
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn halting_a_delegate_that_has_the_task_still_queued_abandons_it() {
    tokio::time::pause();
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent(
        "b",
        "a",
        model([ScriptStep::reply("own work").delayed(SLOW)]),
    );
    b.try_send_event(UserEvent::new("own work")).unwrap();
    until("b busy", || b.state() == AgentState::Executing).await;
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("task queued", || b.status().queued.ordinary == 1).await;
    let ack = within("halt b", 1000, b.halt(op())).await;
    assert_eq!((ack.state, ack.discarded), (AgentState::Stopped, 1));
    until("a done", || a.status().turns == 1).await;
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Abandoned)]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn a_delegate_crash_mid_task_abandons_the_delegation() {
    tokio::time::pause();
    let (team, journal) = team(one_step_config());
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent("b", "a", model([ScriptStep::Crash("boom".into())]));
    turn(&a, "go").await;
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Abandoned)]
    );
    assert_eq!(a.status().active_sub_agents, 0);
    until("b restarted", || b.status().restarts == 1).await;
    let s = b.status();
    assert_eq!(
        (s.state, s.consecutive_errors),
        (AgentState::WaitingForEvent, 1)
    );
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

#[actix_rt::test]
async fn a_waiting_delegator_restarted_by_one_for_all_cancels_its_delegation() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.supervisor.restart.strategy = RestartStrategy::OneForAll;
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "task")]));
    let b = team.sub_agent("b", "a", model([ScriptStep::reply("never").delayed(SLOW)]));
    let x = team.assistant("x", model([ScriptStep::Crash("boom".into())]));
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("b busy", || b.state() == AgentState::Executing).await;
    assert_eq!(a.status().active_sub_agents, 1);
    x.try_send_event(UserEvent::new("crash")).unwrap();
    until("all restarted", || {
        [&a, &b, &x].iter().all(|h| h.status().restarts == 1)
    })
    .await;
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Cancelled)]
    );
    for h in [&a, &b, &x] {
        let s = h.status();
        assert_eq!(s.active_sub_agents, 0);
        assert_eq!(s.state, AgentState::WaitingForEvent, "{}", h.key());
        replay_matches(&journal, h);
    }
    // Only the crashed one counts an error.
    assert_eq!(a.status().consecutive_errors, 0);
    assert_eq!(b.status().consecutive_errors, 0);
    assert_eq!(x.status().consecutive_errors, 1);
}

#[actix_rt::test]
async fn many_mixed_endings_always_bring_active_sub_agents_back_to_zero() {
    tokio::time::pause();
    let mut config = one_step_config();
    config.safety.timeout.chain_seconds = 5.0;
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(1000).unwrap();
    config.supervisor.restart.max_restarts = 1000;
    let (team, journal) = team(config);
    let pa = model([]);
    let pb = model([]);
    let a = team.assistant("a", pa.clone());
    let b = team
        .spawn(AgentSpec::sub_agent("b", "a", pb.clone()).without_delegation())
        .unwrap();
    let mut expected = Vec::new();
    for round in 0..3 {
        for kind in 0..7 {
            let what = format!("round {round} kind {kind}");
            let a_turns = a.status().turns;
            let b_turns = b.status().turns;
            let b_restarts = b.status().restarts;
            match kind {
                0 => {
                    pa.push([delegate("b", "ok")]);
                    pb.push([ScriptStep::reply("fine")]);
                    turn(&a, &what).await;
                    expected.push(DelegationOutcome::Completed);
                }
                1 => {
                    pa.push([delegate("b", "fail")]);
                    pb.push([ScriptStep::fail("down")]);
                    turn(&a, &what).await;
                    expected.push(DelegationOutcome::Failed {
                        error: "llm call failed: down".into(),
                    });
                }
                2 => {
                    pa.push([delegate("b", "slow")]);
                    pb.push([ScriptStep::reply("late").delayed(Duration::from_secs(20))]);
                    turn(&a, &what).await;
                    expected.push(DelegationOutcome::TimedOut { after_ms: 5000 });
                    until("b's late turn", || b.status().turns == b_turns + 1).await;
                }
                3 => {
                    pa.push([delegate("b", "crash")]);
                    pb.push([ScriptStep::Crash("boom".into())]);
                    turn(&a, &what).await;
                    expected.push(DelegationOutcome::Abandoned);
                    until("b restarted", || b.status().restarts == b_restarts + 1).await;
                }
                4 => {
                    pa.push([delegate("nobody", "x")]);
                    turn(&a, &what).await;
                }
                5 => {
                    pa.push([delegate("b", "halt me")]);
                    pb.push([ScriptStep::reply("never").delayed(SLOW)]);
                    a.try_send_event(UserEvent::new(what.clone())).unwrap();
                    until("b busy", || b.state() == AgentState::Executing).await;
                    within("halt b", 1000, b.halt(op())).await;
                    until("a done", || a.status().turns == a_turns + 1).await;
                    expected.push(DelegationOutcome::Abandoned);
                    b.resume("ops").await.unwrap();
                }
                _ => {
                    pa.push([delegate("b", "halt my delegator")]);
                    pb.push([ScriptStep::reply("never").delayed(SLOW)]);
                    a.try_send_event(UserEvent::new(what.clone())).unwrap();
                    until("b busy", || b.state() == AgentState::Executing).await;
                    within("halt a", 1000, a.halt(op())).await;
                    until("b halted", || b.state() == AgentState::Stopped).await;
                    expected.push(DelegationOutcome::Cancelled);
                    a.resume("ops").await.unwrap();
                    b.resume("ops").await.unwrap();
                }
            }
            until(&what, || a.status().active_sub_agents == 0).await;
            let got: Vec<_> = endings(&journal, "a").into_iter().map(|(_, o)| o).collect();
            assert_eq!(got, expected, "{what}");
            assert_eq!(a.status().active_sub_agents, 0, "{what}");
            assert_eq!(a.state(), AgentState::WaitingForEvent, "{what}");
            assert_eq!(b.state(), AgentState::WaitingForEvent, "{what}");
        }
    }
    // Every started delegation ended exactly once.
    let mut started: Vec<u64> = requested(&journal, "a").iter().map(|r| r.0).collect();
    let mut ended: Vec<u64> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::DelegationEnded { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    started.sort_unstable();
    ended.sort_unstable();
    assert_eq!(started.len(), 18);
    assert_eq!(started, ended);
    assert_eq!(refusals(&journal, "a").len(), 3);
    replay_matches(&journal, &a);
    replay_matches(&journal, &b);
}

// ---- 3. halting a parent halts its running sub-agents ----------------------------------------------

/// a → b → c, all waiting; d idle and e busy, both unrelated.
async fn chain_of_three(
    config: WardenConfig,
) -> (Supervisor, Arc<MemoryJournal>, Vec<AgentHandle>) {
    let (team, journal) = team(config);
    let a = team.assistant("a", model([delegate("b", "1")]));
    let b = team.sub_agent("b", "a", model([delegate("c", "2")]));
    let c = team.sub_agent("c", "b", model([ScriptStep::reply("never").delayed(SLOW)]));
    let d = team.assistant("d", model([]));
    let e = team.assistant("e", model([ScriptStep::reply("slow").delayed(SLOW)]));
    e.try_send_event(UserEvent::new("busy")).unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("chain running", || {
        c.state() == AgentState::Executing
            && b.state() == AgentState::WaitingForTool
            && a.state() == AgentState::WaitingForTool
            && e.state() == AgentState::Executing
    })
    .await;
    (team, journal, vec![a, b, c, d, e])
}

#[actix_rt::test]
async fn supervisor_halt_stops_the_running_subtree_transitively() {
    tokio::time::pause();
    let (team, journal, h) = chain_of_three(WardenConfig::default()).await;
    let (a, b, c, d, e) = (&h[0], &h[1], &h[2], &h[3], &h[4]);
    let acks = within("halt a", 10_000, team.halt("a", op()))
        .await
        .unwrap();
    assert_eq!(
        acks,
        ["a", "b", "c"]
            .iter()
            .map(|k| HaltAck {
                agent: key(k),
                state: AgentState::Stopped,
                discarded: 0,
                not_durable: None,
            })
            .collect::<Vec<_>>(),
        "one ack per agent of the subtree, a first"
    );
    for x in [a, b, c] {
        assert_eq!(x.state(), AgentState::Stopped, "{}", x.key());
    }
    settle(200).await;
    assert_eq!(halt_causes(&journal, "a"), vec![op()]);
    for k in ["b", "c"] {
        let causes = halt_causes(&journal, k);
        assert!(!causes.is_empty(), "{k} journaled its halt");
        assert!(
            causes.iter().all(|c| matches!(c, HaltCause::Parent { .. })),
            "{k} halted by its parent: {causes:?}"
        );
    }
    // Slots released along the chain.
    for x in [a, b] {
        assert_eq!(x.status().active_sub_agents, 0, "{}", x.key());
    }
    assert_eq!(
        endings(&journal, "a"),
        vec![(key("b"), DelegationOutcome::Cancelled)]
    );
    assert_eq!(
        endings(&journal, "b"),
        vec![(key("c"), DelegationOutcome::Cancelled)]
    );
    // Unrelated agents are untouched.
    assert_eq!(d.state(), AgentState::WaitingForEvent);
    assert_eq!(e.state(), AgentState::Executing);
    assert!(halt_causes(&journal, "d").is_empty());
    assert!(halt_causes(&journal, "e").is_empty());
    assert_eq!(d.status().halts, 0);
    for x in &h {
        replay_matches(&journal, x);
    }
}

#[actix_rt::test]
async fn one_halt_is_journaled_once_per_agent() {
    tokio::time::pause();
    let (team, journal, h) = chain_of_three(WardenConfig::default()).await;
    within("halt a", 10_000, team.halt("a", op()))
        .await
        .unwrap();
    settle(200).await;
    assert_eq!(halt_causes(&journal, "a"), vec![op()]);
    assert_eq!(halt_causes(&journal, "b"), vec![parent("a")]);
    assert_eq!(halt_causes(&journal, "c").len(), 1);
    for x in &h[..3] {
        assert_eq!(x.status().halts, 1, "{}", x.key());
    }
}

#[actix_rt::test]
async fn halting_a_parent_through_its_handle_halts_the_chain_below_it() {
    tokio::time::pause();
    let (_team, journal, h) = chain_of_three(WardenConfig::default()).await;
    let (a, b, c, d, e) = (&h[0], &h[1], &h[2], &h[3], &h[4]);
    let ack = within("halt a", 1000, a.halt(op())).await;
    assert_eq!(
        ack,
        HaltAck {
            agent: key("a"),
            state: AgentState::Stopped,
            discarded: 0,
            not_durable: None,
        }
    );
    until("b and c stopped", || {
        b.state() == AgentState::Stopped && c.state() == AgentState::Stopped
    })
    .await;
    settle(200).await;
    assert_eq!(halt_causes(&journal, "b"), vec![parent("a")]);
    assert_eq!(halt_causes(&journal, "c"), vec![parent("b")]);
    for x in [a, b, c] {
        assert_eq!(x.status().active_sub_agents, 0);
    }
    assert_eq!(d.state(), AgentState::WaitingForEvent);
    assert_eq!(e.state(), AgentState::Executing);
    for x in &h {
        replay_matches(&journal, x);
    }
}

#[actix_rt::test]
async fn halting_an_idle_agent_through_the_supervisor_acks_only_it() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    team.assistant("a", model([]));
    let b = team.assistant("b", model([]));
    let acks = within("halt", 1000, team.halt("a", op())).await.unwrap();
    assert_eq!(
        acks,
        vec![HaltAck {
            agent: key("a"),
            state: AgentState::Stopped,
            discarded: 0,
            not_durable: None,
        }]
    );
    assert_eq!(b.state(), AgentState::WaitingForEvent);
    assert!(halt_causes(&journal, "b").is_empty());
    assert_eq!(
        within("halt ghost", 10, team.halt("ghost", op())).await,
        Err(UnknownAgent(key("ghost")))
    );
}

// ---- 4. restarts -----------------------------------------------------------------------------------

#[actix_rt::test]
async fn a_crash_mid_turn_is_restarted_and_the_agent_works_again() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let a = team.assistant(
        "a",
        model([ScriptStep::Crash("boom".into()), ScriptStep::reply("back")]),
    );
    a.try_send_event(UserEvent::new("first")).unwrap();
    until("restarted", || a.status().restarts == 1).await;
    let s = a.status();
    assert_eq!(
        (s.state, s.consecutive_errors, s.restarts, s.turns),
        (AgentState::WaitingForEvent, 1, 1, 0)
    );
    let events = journal.events_of("a");
    let crashed = events
        .iter()
        .position(|e| {
            e.kind
                == EventKind::Crashed {
                    state: AgentState::Executing,
                }
        })
        .expect("Crashed journaled");
    let restarted = events
        .iter()
        .position(|e| e.kind == EventKind::Restarted { restarts: 1 })
        .expect("Restarted journaled");
    assert!(crashed < restarted);
    assert_eq!(
        count_events(&journal, "a", |k| matches!(k, EventKind::Crashed { .. })),
        1
    );
    assert!(events[crashed..restarted].iter().any(|e| e.kind
        == EventKind::ErrorCounted {
            consecutive_errors: 1,
            error: "agent crashed during a turn".into()
        }));

    turn(&a, "second").await;
    let s = a.status();
    assert_eq!(
        (s.state, s.consecutive_errors, s.restarts, s.turns),
        (AgentState::WaitingForEvent, 0, 1, 1)
    );
    let history: Vec<_> = a
        .record()
        .history
        .into_iter()
        .map(|m| m.content.unwrap_or_default())
        .collect();
    assert_eq!(history, vec!["[api] first", "[api] second", "back"]);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn a_crash_adds_to_the_error_count_and_keeps_the_history() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let a = team.assistant(
        "a",
        model([
            ScriptStep::fail("1"),
            ScriptStep::fail("2"),
            ScriptStep::Crash("boom".into()),
        ]),
    );
    turn(&a, "one").await;
    turn(&a, "two").await;
    assert_eq!(a.status().consecutive_errors, 2);
    let history_before = a.record().history;
    a.try_send_event(UserEvent::new("three")).unwrap();
    until("restarted", || a.status().restarts == 1).await;
    let s = a.status();
    assert_eq!(
        (s.state, s.consecutive_errors, s.restarts),
        (AgentState::WaitingForEvent, 3, 1)
    );
    let history = a.record().history;
    assert_eq!(history.len(), history_before.len() + 1);
    assert_eq!(history[..history_before.len()], history_before[..]);
    assert_eq!(
        history.last().unwrap().content.as_deref(),
        Some("[api] three")
    );
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn a_crash_at_one_below_the_threshold_comes_back_locked_out() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(3).unwrap();
    let (team, journal) = team(config);
    let a = team.assistant(
        "a",
        model([
            ScriptStep::fail("1"),
            ScriptStep::fail("2"),
            ScriptStep::Crash("boom".into()),
        ]),
    );
    turn(&a, "one").await;
    turn(&a, "two").await;
    a.try_send_event(UserEvent::new("three")).unwrap();
    until("restarted", || a.status().restarts == 1).await;
    let reason = "Critical error in tick loop after 3 failures".to_string();
    let s = a.status();
    assert_eq!(
        (s.state, s.consecutive_errors, s.emergency_stop),
        (AgentState::SafetyLockout, 3, true)
    );
    assert_eq!(
        s.lockout,
        Some(Lockout {
            breaker: warden::protocols::Breaker::ConsecutiveErrors,
            reason: reason.clone()
        })
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(
            k,
            EventKind::LockedOut { consecutive_errors: 3, reason: r, .. } if *r == reason
        )),
        1
    );
    let err = a.try_send_event(UserEvent::new("four")).unwrap_err();
    assert_eq!(err.refusal, WorkRefusal::LockedOut { cause: reason });
    // Still an operator can unlock it: the restarted actor reads its control lane.
    within("unlock", 1000, a.unlock("ops")).await.unwrap();
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn one_for_all_brings_a_locked_out_agent_back_locked_out() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.supervisor.restart.strategy = RestartStrategy::OneForAll;
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(2).unwrap();
    let (team, journal) = team(config);
    let l = team.assistant(
        "l",
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("down"))),
    );
    let x = team.assistant("x", model([ScriptStep::Crash("boom".into())]));
    lock_out(&l).await;
    let before = l.status();
    let reason = "Maximum consecutive errors reached (2)".to_string();
    assert_eq!(before.lockout.as_ref().unwrap().reason, reason);

    x.try_send_event(UserEvent::new("crash")).unwrap();
    until("both restarted", || {
        l.status().restarts == 1 && x.status().restarts == 1
    })
    .await;
    let after = l.status();
    assert_eq!(after.state, AgentState::SafetyLockout);
    assert!(after.emergency_stop);
    assert_eq!(after.lockout, before.lockout);
    assert_eq!(after.consecutive_errors, 2);
    assert_eq!(after.history_len, before.history_len);
    assert_eq!(after.turns, before.turns);
    assert_eq!(
        AgentStatus {
            restarts: 0,
            ..after.clone()
        },
        before,
        "nothing but the restart count changed"
    );
    assert_eq!(
        count_events(&journal, "l", |k| matches!(k, EventKind::Crashed { .. })),
        0,
        "l did not crash, it was restarted"
    );
    let err = l.try_send_event(UserEvent::new("work")).unwrap_err();
    assert_eq!(err.refusal, WorkRefusal::LockedOut { cause: reason });
    assert_eq!(x.state(), AgentState::WaitingForEvent);
    assert_eq!(x.status().consecutive_errors, 1);
    replay_matches(&journal, &l);
    replay_matches(&journal, &x);
}

async fn restart_counts_after_crash_of_q(strategy: RestartStrategy) -> Vec<u32> {
    let mut config = WardenConfig::default();
    config.supervisor.restart.strategy = strategy;
    let (team, journal) = team(config);
    let keys = ["p", "q", "r", "s"];
    let handles: Vec<AgentHandle> = keys
        .iter()
        .map(|k| {
            let steps = if *k == "q" {
                vec![ScriptStep::Crash("boom".into())]
            } else {
                vec![]
            };
            team.spawn(AgentSpec::assistant(*k, model(steps))).unwrap()
        })
        .collect();
    handles[1].try_send_event(UserEvent::new("crash")).unwrap();
    until("q restarted", || handles[1].status().restarts == 1).await;
    settle(500).await;
    for h in &handles {
        assert_eq!(h.state(), AgentState::WaitingForEvent, "{}", h.key());
        replay_matches(&journal, h);
    }
    assert_eq!(
        count_events(&journal, "q", |k| matches!(k, EventKind::Crashed { .. })),
        1
    );
    // Every restarted agent still works.
    for h in &handles {
        if h.key().as_str() != "q" {
            assert!(h.try_tick().is_ok());
        }
    }
    handles.iter().map(|h| h.status().restarts).collect()
}

#[actix_rt::test]
async fn rest_for_one_restarts_the_crashed_agent_and_those_spawned_after_it() {
    tokio::time::pause();
    assert_eq!(
        restart_counts_after_crash_of_q(RestartStrategy::RestForOne).await,
        vec![0, 1, 1, 1]
    );
}

#[actix_rt::test]
async fn one_for_one_restarts_only_the_crashed_agent() {
    tokio::time::pause();
    assert_eq!(
        restart_counts_after_crash_of_q(RestartStrategy::OneForOne).await,
        vec![0, 1, 0, 0]
    );
}

#[actix_rt::test]
async fn one_for_all_restarts_every_agent() {
    tokio::time::pause();
    assert_eq!(
        restart_counts_after_crash_of_q(RestartStrategy::OneForAll).await,
        vec![1, 1, 1, 1]
    );
}

#[actix_rt::test]
async fn too_many_crashes_inside_the_window_give_up_and_stop_the_agent() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.supervisor.restart.max_restarts = 2;
    config.supervisor.restart.within_seconds = 5.0;
    let (team, journal) = team(config);
    let pa =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::Crash("again".into())));
    let a = team.assistant("a", pa);
    let other = team.assistant("other", model([ScriptStep::reply("hi")]));
    let started = tokio::time::Instant::now();
    for n in 1..=2 {
        a.try_send_event(UserEvent::new(format!("crash {n}")))
            .unwrap();
        until("restarted", || a.status().restarts == n).await;
        assert_eq!(a.state(), AgentState::WaitingForEvent);
    }
    a.try_send_event(UserEvent::new("crash 3")).unwrap();
    until("gave up", || a.state() == AgentState::Stopped).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "inside the window"
    );
    let s = a.status();
    assert_eq!((s.restarts, s.halts), (2, 1));
    assert_eq!(
        halt_causes(&journal, "a"),
        vec![HaltCause::RestartIntensity {
            restarts: 2,
            within_ms: 5000
        }]
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(k, EventKind::Crashed { .. })),
        3
    );
    assert_eq!(
        count_events(&journal, "a", |k| matches!(k, EventKind::Restarted { .. })),
        2
    );
    // Stopped for good: further work is refused as Stopped.
    let err = a.try_send_event(UserEvent::new("more")).unwrap_err();
    assert_eq!(err.refusal, WorkRefusal::Stopped);
    assert_eq!(a.try_tick(), Err(WorkRefusal::Stopped));
    // And a halt of the given-up agent is still acknowledged.
    let ack = within("halt", 1000, a.halt(op())).await;
    assert_eq!(ack.state, AgentState::Stopped);
    settle(200).await;
    assert_eq!(a.status().restarts, 2, "no restart after giving up");
    // The other agent is unaffected.
    turn(&other, "hello").await;
    assert_eq!(other.state(), AgentState::WaitingForEvent);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn crashes_spread_beyond_the_window_keep_being_restarted() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.supervisor.restart.max_restarts = 2;
    config.supervisor.restart.within_seconds = 5.0;
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(100).unwrap();
    let (team, journal) = team(config);
    let pa =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::Crash("again".into())));
    let a = team.assistant("a", pa);
    for n in 1..=6 {
        a.try_send_event(UserEvent::new(format!("crash {n}")))
            .unwrap();
        until("restarted", || a.status().restarts == n).await;
        assert_eq!(a.state(), AgentState::WaitingForEvent, "crash {n}");
        tokio::time::advance(Duration::from_secs(6)).await;
    }
    let s = a.status();
    assert_eq!((s.restarts, s.consecutive_errors, s.halts), (6, 6, 0));
    assert!(halt_causes(&journal, "a").is_empty());
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn two_crashes_in_the_window_then_a_pause_then_two_more_still_restart() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.supervisor.restart.max_restarts = 2;
    config.supervisor.restart.within_seconds = 5.0;
    let (team, journal) = team(config);
    let pa =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::Crash("again".into())));
    let a = team.assistant("a", pa);
    for n in 1..=4u32 {
        a.try_send_event(UserEvent::new(format!("crash {n}")))
            .unwrap();
        until("restarted", || a.status().restarts == n).await;
        if n == 2 {
            tokio::time::advance(Duration::from_secs(6)).await;
        }
    }
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    assert!(halt_causes(&journal, "a").is_empty());
    replay_matches(&journal, &a);
}

// ---- 5. halt-all -----------------------------------------------------------------------------------

#[actix_rt::test]
async fn halt_all_stops_a_mixed_team() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.safety.breakers.max_consecutive_errors = NonZeroU32::new(2).unwrap();
    let (team, journal) = team(config);
    let idle = team.assistant("idle", model([]));
    let busy_model = model([ScriptStep::reply("slow").delayed(SLOW)]);
    let busy_stats = busy_model.stats();
    let busy = team.assistant("busy", busy_model);
    let waiting = team.assistant("waiting", model([delegate("delegate", "work")]));
    let delegate_h = team.sub_agent(
        "delegate",
        "waiting",
        model([ScriptStep::reply("slow").delayed(SLOW)]),
    );
    let locked = team.assistant(
        "locked",
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("down"))),
    );
    lock_out(&locked).await;
    busy.try_send_event(UserEvent::new("think")).unwrap();
    waiting.try_send_event(UserEvent::new("delegate")).unwrap();
    until("mixed states", || {
        busy.state() == AgentState::Executing
            && waiting.state() == AgentState::WaitingForTool
            && delegate_h.state() == AgentState::Executing
    })
    .await;
    // Something queued behind the busy agent's turn is discarded by the halt.
    busy.try_send_event(UserEvent::new("queued")).unwrap();
    assert_eq!(idle.state(), AgentState::WaitingForEvent);
    assert_eq!(locked.state(), AgentState::SafetyLockout);

    let mut acks = within("halt all", 10_000, team.halt_all()).await;
    acks.sort_by(|x, y| x.agent.cmp(&y.agent));
    let expected: Vec<HaltAck> = [
        ("busy", 1),
        ("delegate", 0),
        ("idle", 0),
        ("locked", 0),
        ("waiting", 0),
    ]
    .iter()
    .map(|(k, discarded)| HaltAck {
        agent: key(k),
        // A halt never lifts a lockout: the locked-out agent stays SAFETY_LOCKOUT.
        state: if *k == "locked" {
            AgentState::SafetyLockout
        } else {
            AgentState::Stopped
        },
        discarded: *discarded,
        not_durable: None,
    })
    .collect();
    assert_eq!(
        acks, expected,
        "one ack per agent: STOPPED, the locked-out one locked out"
    );
    settle(200).await;
    for s in team.statuses() {
        let expected = if s.key.as_str() == "locked" {
            AgentState::SafetyLockout
        } else {
            AgentState::Stopped
        };
        assert_eq!(s.state, expected, "{}", s.key);
        assert_eq!(s.active_sub_agents, 0, "{}", s.key);
        assert_eq!(s.queued.ordinary, 0, "{}", s.key);
    }
    for h in team.agents() {
        assert!(
            halt_causes(&journal, h.key().as_str()).contains(&HaltCause::HaltAll),
            "{} journaled the halt-all",
            h.key()
        );
        replay_matches(&journal, &h);
    }
    // The busy agent's LLM call was aborted, not awaited.
    assert_eq!(
        busy_stats
            .dropped_in_flight
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(endings(&journal, "waiting").len(), 1);
    // The locked-out agent keeps its lockout.
    assert!(locked.status().emergency_stop);
}

#[actix_rt::test]
async fn giving_up_journals_the_messages_it_discards() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.supervisor.restart.max_restarts = 0;
    let (team, journal) = team(config);
    let pa =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::Crash("again".into())));
    let a = team.assistant("a", pa);
    a.try_send_event(UserEvent::new("crash")).unwrap();
    a.try_send_event(UserEvent::new("queued behind the crash"))
        .unwrap();
    until("gave up", || a.state() == AgentState::Stopped).await;
    settle(200).await;
    assert_eq!(
        halt_causes(&journal, "a"),
        vec![HaltCause::RestartIntensity {
            restarts: 0,
            within_ms: 5000
        }]
    );
    assert_eq!(a.status().discarded_by_halt, 1);
    let listed: Vec<Vec<String>> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::MessagesDiscarded { messages } => {
                Some(messages.into_iter().map(|m| m.kind).collect())
            }
            _ => None,
        })
        .collect();
    assert_eq!(listed, vec![vec!["user_event".to_string()]]);
}

async fn two_agents_crash_at_once(strategy: RestartStrategy) {
    let mut config = WardenConfig::default();
    config.supervisor.restart.strategy = strategy;
    config.supervisor.restart.max_restarts = 3;
    let (team, journal) = team(config);
    let x = team.assistant("x", model([ScriptStep::Crash("x".into())]));
    let y = team.assistant("y", model([ScriptStep::Crash("y".into())]));
    // Both crash in the same tick of the arbiter.
    x.try_send_event(UserEvent::new("crash")).unwrap();
    y.try_send_event(UserEvent::new("crash")).unwrap();
    until("both restarted", || {
        x.status().restarts >= 1 && y.status().restarts >= 1
    })
    .await;
    settle(500).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    settle(500).await;
    for (h, k) in [(&x, "x"), (&y, "y")] {
        let crashed: Vec<_> = journal
            .events_of(k)
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::Crashed { state } => Some(state),
                _ => None,
            })
            .collect();
        assert_eq!(
            crashed,
            vec![AgentState::Executing],
            "{k} crashed once, in its turn"
        );
        let s = h.status();
        assert_eq!(
            (s.state, s.consecutive_errors),
            (AgentState::WaitingForEvent, 1),
            "{k}: its crash is counted once and it is running"
        );
        replay_matches(&journal, h);
    }
}

#[actix_rt::test]
async fn two_simultaneous_crashes_under_one_for_one() {
    tokio::time::pause();
    two_agents_crash_at_once(RestartStrategy::OneForOne).await;
}

#[actix_rt::test]
async fn two_simultaneous_crashes_under_rest_for_one() {
    tokio::time::pause();
    two_agents_crash_at_once(RestartStrategy::RestForOne).await;
}

#[actix_rt::test]
async fn two_simultaneous_crashes_under_one_for_all() {
    tokio::time::pause();
    two_agents_crash_at_once(RestartStrategy::OneForAll).await;
}

/// `Supervisor::started` resolves for agents on real arbiters (and returns at once after
/// `shutdown`); agents are listed, and `halt_all` acknowledges them, in spawn order.
#[actix_rt::test]
async fn started_waits_for_every_actor_on_the_arbiters() {
    let mut config = WardenConfig::default();
    config.supervisor.arbiters = 2;
    let team = Supervisor::builder(config, Arc::new(MemoryJournal::new()))
        .capacity(64)
        .build();
    for i in 0..64 {
        team.spawn(AgentSpec::assistant(format!("a{i}"), chatty()))
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(30), team.started())
        .await
        .expect("every actor started");
    let order: Vec<String> = team.agents().iter().map(|a| a.key().to_string()).collect();
    let expected: Vec<String> = (0..64).map(|i| format!("a{i}")).collect();
    assert_eq!(order, expected, "agents are listed in spawn order");
    let acks = team.halt_all().await;
    assert_eq!(acks.len(), 64);
    assert!(acks.iter().all(|a| a.state == AgentState::Stopped));
    let acked: Vec<String> = acks.iter().map(|a| a.agent.to_string()).collect();
    assert_eq!(acked, expected, "one ack per agent, in spawn order");
    team.shutdown().await;
    tokio::time::timeout(Duration::from_secs(5), team.started())
        .await
        .expect("started() returns after shutdown");
}

// ---- 6. a halt reaches every running delegate, in every interleaving -------------------------------

/// Which entry point raises the halt.
#[derive(Debug, Clone, Copy)]
enum HaltVia {
    Handle,
    Supervisor,
    HaltAll,
}

/// Set while a tool future is alive; cleared when it is dropped (a halt dropped the turn).
struct Alive(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits on the wall clock (the agents run on arbiter threads of their own), at most 5 s.
fn wait_real(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Issue 10.5: the halt used to cancel the delegator's turn before the halt message was queued, and
/// the actor listed the running delegates only when it read that message. If the delegator's thread
/// ended the cancelled turn in that gap, the delegation (and its listing) was gone and the delegate
/// worked on. The test hook holds the gap open until the delegator's delegations have ended — the
/// losing interleaving, every time — on a chain lead → mid → leaf where leaf runs a tool that never
/// ends by itself, through every entry point.
#[actix_rt::test]
async fn a_halt_reaches_every_running_delegate_even_when_the_delegations_end_first() {
    for (round, via) in [HaltVia::Handle, HaltVia::Supervisor, HaltVia::HaltAll]
        .into_iter()
        .enumerate()
    {
        let k = |name: &str| format!("race{round}-{name}");
        let journal = Arc::new(MemoryJournal::new());
        let team = Supervisor::new(WardenConfig::default(), journal.clone());
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = alive.clone();
        let forever = FnTool::new(
            "forever",
            "never ends",
            ToolCategory::SafeChain,
            move |_, _| {
                let guard = Alive(flag.clone());
                guard.0.store(true, std::sync::atomic::Ordering::SeqCst);
                async move {
                    let _guard = guard;
                    std::future::pending::<Result<serde_json::Value, ToolError>>().await
                }
            },
        );
        let lead = team
            .spawn(AgentSpec::assistant(
                k("lead"),
                model([delegate(&k("mid"), "go on")]),
            ))
            .unwrap();
        let mid = team
            .spawn(AgentSpec::sub_agent(
                k("mid"),
                k("lead"),
                model([delegate(&k("leaf"), "work")]),
            ))
            .unwrap();
        let leaf = team
            .spawn(
                AgentSpec::sub_agent(
                    k("leaf"),
                    k("mid"),
                    model([ScriptStep::call("forever", json!({}))]),
                )
                .with_tool(forever),
            )
            .unwrap();
        team.started().await;
        lead.try_send_event(UserEvent::new("start")).unwrap();
        let running = (lead.clone(), mid.clone(), alive.clone());
        tokio::task::spawn_blocking(move || {
            wait_real("leaf's tool runs", || {
                running.2.load(std::sync::atomic::Ordering::SeqCst)
                    && running.0.status().active_sub_agents == 1
                    && running.1.status().active_sub_agents == 1
            })
        })
        .await
        .unwrap();

        // The gap: wait there until the halted agent's own thread has ended its delegations.
        let (gap_lead, gap_mid) = (lead.clone(), mid.clone());
        warden_actors::test_hooks::set_halt_gap(Some(Arc::new(move |agent: &AgentKey| {
            for h in [&gap_lead, &gap_mid] {
                if h.key() == agent {
                    wait_real("the cancelled turn ends its delegation", || {
                        h.status().active_sub_agents == 0
                    });
                }
            }
        })));
        // Every entry point raises its halts before its first await (the hook runs there).
        match via {
            HaltVia::Handle => drop(lead.halt(op()).await),
            HaltVia::Supervisor => drop(team.halt(lead.key().as_str(), op()).await),
            HaltVia::HaltAll => drop(team.halt_all().await),
        }
        warden_actors::test_hooks::set_halt_gap(None);

        let (leaf2, alive2) = (leaf.clone(), alive.clone());
        tokio::task::spawn_blocking(move || {
            wait_real(
                &format!("{via:?}: leaf halted and its tool dropped"),
                || {
                    leaf2.state() == AgentState::Stopped
                        && !alive2.load(std::sync::atomic::Ordering::SeqCst)
                },
            )
        })
        .await
        .unwrap();
        // Each reads its halt message on its own thread: wait for all three to be STOPPED.
        let all = [lead.clone(), mid.clone(), leaf.clone()];
        tokio::task::spawn_blocking(move || {
            wait_real(&format!("{via:?}: the whole chain STOPPED"), || {
                all.iter().all(|h| h.state() == AgentState::Stopped)
            })
        })
        .await
        .unwrap();
        team.shutdown().await;
    }
}

/// The other side of the same race: a halt raised after a delegation passed its checks but before
/// it was listed on the delegator cannot see it; the delegation must then see the halt and send no
/// task (it used to send it, and the delegate ran it for a delegator that was already halted).
#[actix_rt::test]
async fn a_delegation_that_the_halt_could_not_see_is_refused_before_its_task_is_sent() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let lead = team.assistant("gap-lead", model([delegate("gap-sub", "work")]));
    let (tool, calls) = counting_tool("work", ToolCategory::SafeChain, false);
    let sub = team
        .spawn(
            AgentSpec::sub_agent(
                "gap-sub",
                "gap-lead",
                model([
                    ScriptStep::call("work", json!({})),
                    ScriptStep::reply("done"),
                ]),
            )
            .with_tool_arc(tool),
        )
        .unwrap();
    let halting = lead.clone();
    warden_actors::test_hooks::set_delegation_gap(Some(Arc::new(move |agent: &AgentKey| {
        if agent == halting.key() {
            // Raised now (not when polled): the future only waits for the ack.
            drop(halting.halt(op()));
        }
    })));
    lead.try_send_event(UserEvent::new("start")).unwrap();
    until("lead halted", || lead.state() == AgentState::Stopped).await;
    warden_actors::test_hooks::set_delegation_gap(None);
    settle(200).await;
    assert_eq!(
        count(&calls),
        0,
        "the delegate ran a task of a halted delegator"
    );
    assert_eq!(sub.status().turns, 0);
    assert_eq!(sub.state(), AgentState::WaitingForEvent);
    assert!(matches!(
        refusals(&journal, "gap-lead").as_slice(),
        [(_, DelegationRefusal::DelegatorNotRunning { .. })]
    ));
    // Refused before it started: no delegation was requested, so none ends (it used to journal a
    // `delegation_ended` with no `delegation_requested`, which `warden loadtest` counted as a
    // leaked slot).
    assert!(requested(&journal, "gap-lead").is_empty());
    assert!(endings(&journal, "gap-lead").is_empty());
    assert_eq!(lead.status().active_sub_agents, 0);
    replay_matches(&journal, &lead);
    replay_matches(&journal, &sub);
}

/// A lift that comes right behind its fleet halt — the halt raised and queued, but no actor has
/// applied it yet (a cluster node that receives both at once after a pause) — resumes every agent
/// the halt stopped: the resume is queued behind the halt and applied after it. It used to skip
/// them as "not stopped", and they stopped a moment later with nothing left to resume them.
#[actix_rt::test]
async fn a_lift_right_behind_its_fleet_halt_resumes_the_agents_that_had_not_applied_it_yet() {
    // Agents whose turns run, whose actors apply a halt when they read it: a passive agent's halt,
    // and an idle actor's, are applied when called (tests/passivation.rs, tests/idle_halt.rs), so
    // there is no gap to lift into.
    tokio::time::pause();
    let mut config = WardenConfig::default();
    config.supervisor.passivate_after_seconds = 0.0;
    let (team, journal) = team(config);
    let agents: Vec<AgentHandle> = (0..4)
        .map(|i| {
            let model = model([ScriptStep::reply("late").delayed(Duration::from_secs(60))]);
            team.assistant(&format!("a{i}"), model)
        })
        .collect();
    let asked: Vec<_> = agents
        .iter()
        .map(|a| a.try_ask(UserEvent::new("work")).unwrap())
        .collect();
    until("every turn runs", || {
        agents.iter().all(|a| a.state() == AgentState::Executing)
    })
    .await;
    {
        // Polled once: every halt raised and queued (cancel safe), none applied yet.
        let halting = team.halt_all();
        futures::pin_mut!(halting);
        assert!(futures::poll!(halting.as_mut()).is_pending());
    }
    assert!(
        agents.iter().all(|a| a.state() == AgentState::Executing),
        "the actors have not run since"
    );
    let outcomes = team
        .resume_fleet_halt("operator")
        .await
        .expect("a fleet halt stands");
    assert_eq!(outcomes.len(), 4);
    assert!(outcomes.iter().all(|o| o.resumed), "{outcomes:?}");
    for reply in asked {
        assert!(matches!(reply.await, Err(AskError::Discarded { .. })));
    }
    for a in &agents {
        let s = a.status();
        assert_eq!(
            (s.state, s.halts),
            (AgentState::WaitingForEvent, 1),
            "{}",
            a.key()
        );
        replay_matches(&journal, a);
    }
}

/// The owning node's side of a cross-node delegation (`Supervisor::run_remote_task`, what a NATS
/// cluster node runs for another node's delegator) answers only once the delegate's turn is on
/// disk: a node SIGKILLed right after it replied still knows on restart that the task ran, so a
/// copy of the request is answered from the record instead of being run twice. (tests/cluster.rs
/// checks this over real processes, but its kill comes long after the journal's linger; here the
/// journal's durability is held by the test, so the check cannot pass by timing.)
#[actix_rt::test]
async fn a_remote_task_is_answered_only_once_the_delegates_turn_is_durable() {
    tokio::time::pause();
    let gated = Arc::new(Gated::new());
    let team = Supervisor::on_current_arbiter(one_step_config(), gated.clone());
    let worker = team.assistant("worker", chatty());
    let task = protocols::cluster::RemoteTask {
        key: "i1/boss/1/call-1".into(),
        from: key("boss"),
        to: key("worker"),
        task: "x".into(),
        lineage: vec![key("boss"), key("worker")],
    };
    let call = team.run_remote_task(task);
    futures::pin_mut!(call);
    // Each wait runs the team until the runtime is idle (the paused clock then jumps a minute).
    let idle = || tokio::time::sleep(Duration::from_secs(60));
    tokio::select! {
        biased;
        reply = call.as_mut() => panic!("answered before anything was durable: {reply:?}"),
        () = idle() => {}
    }
    let finished = gated.last("turn_finished", |k| {
        matches!(k, EventKind::TurnFinished { .. })
    });
    assert_eq!(worker.status().turns, 1, "the task ran");
    gated.durable_up_to.send_replace(finished - 1);
    tokio::select! {
        biased;
        reply = call.as_mut() => panic!("answered before the turn's end was durable: {reply:?}"),
        () = idle() => {}
    }
    gated.durable_up_to.send_replace(finished);
    assert_eq!(
        call.await,
        protocols::cluster::RemoteReply::Answer {
            answer: "hello".into()
        }
    );
}

/// A delegate halted after the delegation's early checks but before its task is queued (a halt
/// applied on another arbiter meanwhile; here: the delegate is passive, so its halt is applied to
/// its record at once, inside the gap) gets no task: the push checks the delegate's state under
/// its record lock, as a user event's does. The task used to be queued on the stopped agent —
/// `warden loadtest --threads 2` counted it lost — and it ran for a dead delegator once the
/// delegate was resumed.
#[actix_rt::test]
async fn a_delegate_halted_after_the_early_checks_is_sent_no_task() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let lead = team.assistant(
        "late-lead",
        model([delegate("late-sub", "work"), ScriptStep::reply("ok")]),
    );
    let (tool, calls) = counting_tool("work", ToolCategory::SafeChain, false);
    let sub = team
        .spawn(
            AgentSpec::sub_agent(
                "late-sub",
                "late-lead",
                model([
                    ScriptStep::call("work", json!({})),
                    ScriptStep::reply("done"),
                ]),
            )
            .with_tool_arc(tool),
        )
        .unwrap();
    let (delegator, halting) = (lead.key().clone(), sub.clone());
    warden_actors::test_hooks::set_delegation_gap(Some(Arc::new(move |agent: &AgentKey| {
        if *agent == delegator {
            drop(halting.halt(op()));
        }
    })));
    lead.try_send_event(UserEvent::new("start")).unwrap();
    until("the lead's turn ended", || {
        !outcomes(&journal, "late-lead").is_empty()
    })
    .await;
    warden_actors::test_hooks::set_delegation_gap(None);
    assert_eq!(sub.state(), AgentState::Stopped, "halted in the gap");
    assert_eq!(
        refusals(&journal, "late-lead"),
        vec![(
            key("late-sub"),
            DelegationRefusal::DelegateRefused {
                delegate: key("late-sub"),
                refusal: protocols::WorkRefusal::Stopped,
            }
        )]
    );
    assert_eq!(lead.status().active_sub_agents, 0);
    // Resumed, the delegate has nothing of the dead delegation to run.
    sub.resume("operator").await.unwrap();
    settle(200).await;
    assert_eq!(
        count(&calls),
        0,
        "the task was queued on the stopped delegate"
    );
    assert_eq!(sub.status().turns, 0);
    replay_matches(&journal, &lead);
    replay_matches(&journal, &sub);
}

/// Of two spawns of one key, the one that loses the key journals nothing: the key is claimed
/// before the agent's `Spawned` is journaled (the loser's, a sub-agent's, would be replayed onto
/// the winner, an assistant). The other spawn is made in the gap between the loser building its
/// cell and claiming the key.
#[actix_rt::test]
async fn a_spawn_that_loses_its_key_to_another_journals_nothing() {
    let (team, journal) = team(WardenConfig::default());
    team.assistant("boss", model([]));
    let (winner, once) = (
        team.clone(),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    warden_actors::test_hooks::set_spawn_gap(Some(Arc::new(move |agent: &AgentKey| {
        if agent.as_str() == "contested" && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            winner
                .spawn(AgentSpec::assistant("contested", model([])))
                .expect("the spawn in the gap wins the key");
        }
    })));
    let lost = team.spawn(AgentSpec::sub_agent("contested", "boss", model([])));
    warden_actors::test_hooks::set_spawn_gap(None);
    assert!(matches!(lost, Err(SpawnError::DuplicateKey(_))), "{lost:?}");
    let spawned = count_events(&journal, "contested", |k| {
        matches!(k, EventKind::Spawned { .. })
    });
    assert_eq!(spawned, 1, "the losing spawn journaled a Spawned");
    let contested = team.get("contested").expect("the winner");
    assert_eq!(contested.record().role, AgentRole::Assistant);
    replay_matches(&journal, &contested);
}
