//! Replies: an event's answer comes back to whoever asked (`AgentHandle::ask`, `try_ask`) and to
//! the team's reply stream (`Supervisor::take_replies`), correlated by the event's id, and the
//! journal's `turn_finished` names the events it answered. Every way an event can end is covered:
//! answered, failed, refused (when taken, or by a lockout), discarded by a halt (queued or running),
//! the actor crashing, the team shutting down.
//!
//! Everything runs on the test's arbiter with paused time.
mod common;
use common::*;
use futures::future::join_all;
use std::{sync::Arc, time::Duration};
use warden::protocols::WorkRefusal;
use warden::*;

#[actix_rt::test]
async fn ask_resolves_with_the_answer_its_id_usage_and_latency_and_the_journal_correlates_them() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let smith = team.assistant(
        "smith",
        model([ScriptStep::reply("Thirty gold.").delayed(Duration::from_millis(800))]),
    );
    let reply = smith.ask(UserEvent::new("A sword?")).await.unwrap();
    assert_eq!(reply.answer, "Thirty gold.");
    assert_eq!(reply.agent.as_str(), "smith");
    assert_eq!(reply.reason, TerminationReason::Answered);
    assert!(reply.usage.total() > 0, "{:?}", reply.usage);
    assert!(
        reply.latency >= Duration::from_millis(800),
        "{:?}",
        reply.latency
    );
    let outcomes = outcomes(&journal, "smith");
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].events, vec![reply.id]);
    assert_eq!(outcomes[0].answer.as_deref(), Some("Thirty gold."));
    assert_eq!(outcomes[0].usage, reply.usage);
    replay_matches(&journal, &smith);
}

#[actix_rt::test]
async fn try_ask_is_polled_without_blocking_and_each_reply_matches_its_event() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let echo = Arc::new(ScriptedProvider::new([]).with_fallback(|request| {
        let last = request
            .messages
            .last()
            .and_then(|m| m.content.clone())
            .unwrap_or_default();
        ScriptStep::reply(format!("echo {last}"))
    }));
    let a = team.assistant("a", echo);
    let mut pending: Vec<_> = (0..5)
        .map(|i| a.try_ask(UserEvent::new(format!("m{i}"))).unwrap())
        .collect();
    // Nothing has run yet: polling says so and does not block.
    for p in &mut pending {
        assert!(p.try_recv().is_none());
    }
    until("all answered", || a.status().turns == 5).await;
    for (i, p) in pending.iter_mut().enumerate() {
        let reply = p.try_recv().expect("settled").unwrap();
        assert_eq!(reply.id, p.id());
        assert!(reply.answer.ends_with(&format!("m{i}")), "{}", reply.answer);
    }
}

#[actix_rt::test]
async fn a_halt_answers_every_waiter_at_once_discarded_running_and_queued() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let slow = model([ScriptStep::reply("late").delayed(Duration::from_secs(10_000))]);
    let a = team.assistant("a", slow);
    let running = a.try_ask(UserEvent::new("think")).unwrap();
    until("turn running", || a.state() == AgentState::Executing).await;
    let queued = a.try_ask(UserEvent::new("queued")).unwrap();
    let (running_id, queued_id) = (running.id(), queued.id());
    within("halt", 1000, a.halt(HaltCause::HaltAll)).await;
    assert_eq!(
        within("running", 100, running).await,
        Err(AskError::Discarded { id: running_id })
    );
    assert_eq!(
        within("queued", 100, queued).await,
        Err(AskError::Discarded { id: queued_id })
    );
    // Stopped: refused at once, the event handed back.
    match a.ask(UserEvent::new("after")).await {
        Err(AskError::NotQueued(err)) => {
            assert_eq!(err.refusal, WorkRefusal::Stopped);
            assert_eq!(err.event.content, "after");
        }
        other => panic!("{other:?}"),
    }
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn failures_fail_the_lockout_refuses_and_work_queued_behind_it_is_refused_when_taken() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let a = team.assistant("a", failing());
    // Six at once: five failed turns (the fifth trips the lockout), the sixth refused when taken.
    let pending: Vec<_> = (0..6)
        .map(|i| a.try_ask(UserEvent::new(format!("e{i}"))).unwrap())
        .collect();
    let ids: Vec<u64> = pending.iter().map(|p| p.id()).collect();
    let results = within("all settled", 100_000, join_all(pending)).await;
    for (i, result) in results[..4].iter().enumerate() {
        match result {
            Err(AskError::Failed { id, reason, .. }) => {
                assert_eq!((*id, *reason), (ids[i], TerminationReason::LlmError));
            }
            other => panic!("event {i}: {other:?}"),
        }
    }
    for (i, result) in results[4..].iter().enumerate() {
        match result {
            Err(AskError::Refused {
                id,
                refusal: WorkRefusal::LockedOut { cause },
            }) => {
                assert_eq!(*id, ids[4 + i]);
                assert!(cause.contains("consecutive errors"), "{cause}");
            }
            other => panic!("event {}: {other:?}", 4 + i),
        }
    }
    assert_eq!(a.state(), AgentState::SafetyLockout);
    replay_matches(&journal, &a);
}

#[actix_rt::test]
async fn a_crash_fails_the_waiter_and_a_shutdown_tells_the_rest_the_agent_is_gone() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let a = team.assistant(
        "a",
        model([
            ScriptStep::Crash("boom".into()),
            ScriptStep::reply("never").delayed(Duration::from_secs(10_000)),
        ]),
    );
    let crashed = a.try_ask(UserEvent::new("first")).unwrap();
    let id = crashed.id();
    match within("crash", 100_000, crashed).await {
        Err(AskError::Failed {
            id: failed,
            reason: TerminationReason::Crashed,
            ..
        }) => assert_eq!(failed, id),
        other => panic!("{other:?}"),
    }
    let waiting = a.try_ask(UserEvent::new("second")).unwrap();
    until("second running", || a.state() == AgentState::Executing).await;
    team.shutdown().await;
    assert_eq!(within("gone", 100, waiting).await, Err(AskError::AgentGone));
}

#[actix_rt::test]
async fn the_reply_stream_carries_every_settled_event_of_every_agent() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let mut stream = team.take_replies().expect("first taker");
    assert!(team.take_replies().is_none(), "one taker");
    let ok = team.assistant("ok", chatty());
    let bad = team.assistant("bad", failing());
    let a = ok.try_send_event(UserEvent::new("hi")).unwrap();
    let b = bad.try_send_event(UserEvent::new("hi")).unwrap();
    until("both turns", || {
        ok.status().turns == 1 && bad.status().turns == 1
    })
    .await;
    let mut got = Vec::new();
    while let Ok(s) = stream.try_recv() {
        got.push(s);
    }
    got.sort_by(|x, y| x.agent.cmp(&y.agent));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].agent.as_str(), got[0].id), ("bad", b));
    assert!(matches!(got[0].result, Err(AskError::Failed { .. })));
    assert_eq!((got[1].agent.as_str(), got[1].id), ("ok", a));
    assert_eq!(got[1].result.as_ref().unwrap().answer, "hello");
}

#[actix_rt::test]
async fn concurrent_waiters_on_many_agents_each_get_their_own_answer() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let agents: Vec<_> = (0..50)
        .map(|i| {
            let name = format!("npc{i}");
            let answer = name.clone();
            let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |request| {
                let asked = request
                    .messages
                    .last()
                    .and_then(|m| m.content.clone())
                    .unwrap_or_default();
                ScriptStep::reply(format!("{answer} re {asked}"))
                    .delayed(Duration::from_millis(10 + (asked.len() as u64 % 7) * 100))
            }));
            team.spawn(AgentSpec::assistant(name, model)).unwrap()
        })
        .collect();
    let asks = agents.iter().flat_map(|a| {
        (0..4).map(move |j| {
            let content = format!("q{j}");
            async move {
                (
                    a.key().clone(),
                    content.clone(),
                    a.ask(UserEvent::new(content)).await,
                )
            }
        })
    });
    // Paused time: the runtime jumps over the models' delays while every ask waits.
    let results = join_all(asks).await;
    assert_eq!(results.len(), 200);
    for (agent, content, result) in results {
        let reply = result.unwrap();
        assert_eq!(reply.agent, agent);
        assert!(
            reply.answer.starts_with(&format!("{agent} re ")),
            "{}",
            reply.answer
        );
        assert!(
            reply.answer.ends_with(&content),
            "{} for {content}",
            reply.answer
        );
    }
}
