//! Passivation (issue 36): an idle agent's actor stops and its cell stays; the next message starts
//! a new actor; a passive agent's halt is a change of its record. Spawned agents start passive.
//!
//! Paused time and the test's arbiter, except where the race needs a second thread (the agent on
//! an arbiter of its own, held in the losing interleaving by a `test-hooks` pause point).
mod common;
use common::*;
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use warden::*;

/// `supervisor.passivate_after_seconds` in these tests.
const IDLE: Duration = Duration::from_secs(60);

fn config() -> WardenConfig {
    let mut config = WardenConfig::default();
    config.supervisor.passivate_after_seconds = IDLE.as_secs_f64();
    config
}

/// Advances paused time by `d`, letting every timer that falls due run.
async fn idle_for(d: Duration) {
    let step = Duration::from_secs(1);
    let mut left = d;
    while !left.is_zero() {
        tokio::time::advance(step.min(left)).await;
        left = left.saturating_sub(step);
        settle(4).await;
    }
}

fn crashes(journal: &MemoryJournal, agent: &str) -> usize {
    journal
        .events_of(agent)
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Crashed { .. }))
        .count()
}

#[actix_rt::test]
async fn a_spawned_agent_is_passive_until_its_first_message_and_again_when_idle() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let smith = team.assistant(
        "smith",
        model([ScriptStep::reply("Aye."), ScriptStep::reply("Again.")]),
    );
    assert!(smith.passive(), "spawned passive: no actor yet");
    team.started().await; // a passive agent counts as started
    assert_eq!(smith.state(), AgentState::WaitingForEvent);
    assert_eq!(smith.status().queued.ordinary, 0);

    let reply = smith.ask(UserEvent::new("who goes there?")).await.unwrap();
    assert_eq!(reply.answer, "Aye.");
    assert!(!smith.passive(), "the message started its actor");

    // Idle for less than the period: still active. Then past two periods: passive.
    idle_for(IDLE / 2).await;
    assert!(!smith.passive());
    idle_for(IDLE * 2).await;
    assert!(smith.passive(), "idle for two periods: passivated");
    assert_eq!(
        crashes(&journal, "smith"),
        0,
        "a passivation is not a crash"
    );

    // The record stayed: the next message starts a new actor that goes on from it.
    let reply = smith.ask(UserEvent::new("again?")).await.unwrap();
    assert_eq!(reply.answer, "Again.");
    let status = smith.status();
    assert_eq!((status.turns, status.restarts), (2, 0));
    assert_eq!(status.history_len, 4);
    replay_matches(&journal, &smith);
}

#[actix_rt::test]
async fn with_passivation_off_every_agent_keeps_its_actor() {
    tokio::time::pause();
    let mut off = WardenConfig::default();
    off.supervisor.passivate_after_seconds = 0.0;
    let (team, _journal) = team(off);
    let smith = team.assistant("smith", model([ScriptStep::reply("Aye.")]));
    team.started().await;
    assert!(!smith.passive());
    smith.ask(UserEvent::new("hello")).await.unwrap();
    idle_for(IDLE * 3).await;
    assert!(!smith.passive());
}

/// Passivation during an ask: a turn waiting on a slow model call keeps its actor however long
/// the call takes (the turn runs on the actor), and the ask gets its answer.
#[actix_rt::test]
async fn an_agent_is_not_passivated_while_its_turn_waits() {
    tokio::time::pause();
    let mut config = config();
    config.safety.timeout.llm_call_seconds = 3_600.0; // the call may take its five periods
    let (team, journal) = team(config);
    let slow = team.assistant(
        "slow",
        model([ScriptStep::reply("done at last").delayed(IDLE * 5)]),
    );
    let pending = slow.try_ask(UserEvent::new("think hard")).unwrap();
    until("the turn runs", || slow.state() == AgentState::Executing).await;
    idle_for(IDLE * 4).await;
    assert!(!slow.passive(), "passivated during a running turn");
    assert_eq!(slow.state(), AgentState::Executing);
    let reply = pending.await.unwrap();
    assert_eq!(reply.answer, "done at last");
    idle_for(IDLE * 2 + Duration::from_secs(1)).await;
    assert!(slow.passive());
    replay_matches(&journal, &slow);
}

/// A halt of a passive agent is applied to its cell: acknowledged `STOPPED` at once (no actor
/// started for it, none needed), journaled as a halt read by the actor is; so is its resume (the
/// agent stays passive); the next event starts the actor, and work runs again.
#[actix_rt::test]
async fn a_passive_agents_halt_is_a_change_of_its_record() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let guard = team.assistant("guard", model([ScriptStep::reply("back on watch")]));
    assert!(guard.passive());
    let ack = {
        let halting = guard.halt(op());
        futures::pin_mut!(halting);
        // Applied when called: the first poll has the ack.
        match futures::poll!(halting.as_mut()) {
            std::task::Poll::Ready(ack) => ack,
            std::task::Poll::Pending => panic!("a passive agent's halt waited for an actor"),
        }
    };
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(ack.discarded, 0);
    assert!(ack.not_durable.is_none());
    assert!(guard.passive(), "the halt started no actor");
    assert_eq!(guard.status().halts, 1);
    assert!(matches!(
        guard.try_send_event(UserEvent::new("hello")),
        Err(EventSendError {
            refusal: protocols::WorkRefusal::Stopped,
            ..
        })
    ));
    // A second halt is acknowledged and, clearing nothing, not journaled again.
    let again = guard.halt(op()).await;
    assert_eq!(again.state, AgentState::Stopped);
    assert_eq!(guard.status().halts, 1);

    guard.resume("op").await.unwrap();
    assert_eq!(guard.state(), AgentState::WaitingForEvent);
    assert!(guard.passive(), "the resume started an actor");
    let reply = guard.ask(UserEvent::new("report")).await.unwrap();
    assert_eq!(reply.answer, "back on watch");
    replay_matches(&journal, &guard);
}

/// `halt_all` over passive and active agents: one ack per agent in spawn order, every one
/// `STOPPED`; the passive ones stay passive, through the lift too (a lift of a million passive
/// agents starts no actor).
#[actix_rt::test]
async fn halt_all_stops_passive_and_active_agents_alike() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let agents: Vec<AgentHandle> = (0..50)
        .map(|i| team.assistant(&format!("a{i}"), model([ScriptStep::reply("ok")])))
        .collect();
    for a in agents.iter().step_by(5) {
        a.ask(UserEvent::new("wake up")).await.unwrap();
    }
    let active = agents.iter().filter(|a| !a.passive()).count();
    assert_eq!(active, 10);
    let acks = team.halt_all().await;
    assert_eq!(acks.len(), 50);
    for (ack, agent) in acks.iter().zip(&agents) {
        assert_eq!(&ack.agent, agent.key());
        assert_eq!(ack.state, AgentState::Stopped);
    }
    assert_eq!(agents.iter().filter(|a| !a.passive()).count(), active);
    for agent in &agents {
        replay_matches(&journal, agent);
    }
    let lifted = team.resume_fleet_halt("op").await.unwrap();
    assert_eq!(lifted.len(), 50);
    assert!(lifted.iter().all(|l| l.resumed), "{lifted:?}");
    assert!(agents
        .iter()
        .all(|a| a.state() == AgentState::WaitingForEvent));
    assert_eq!(
        agents.iter().filter(|a| !a.passive()).count(),
        active,
        "the lift started the passive agents' actors"
    );
    for agent in &agents {
        replay_matches(&journal, agent);
    }
}

/// A control racing an activation: an unpause finds the agent passive (paused, nothing queued)
/// and, before it applies the unpause to the cell, an event starts the agent's actor on its own
/// thread, which finds the agent paused, leaves the event queued and waits. The unpause must
/// wake it: the event is answered. (Without the wake the actor waits for a message that never
/// comes, and the event is never read.)
#[actix_rt::test]
async fn an_unpause_racing_an_activation_lets_the_queued_event_run() {
    let journal = Arc::new(MemoryJournal::new());
    let mut config = config();
    config.supervisor.arbiters = 1;
    let team = Supervisor::new(config, journal.clone());
    let agent = team
        .spawn(AgentSpec::assistant(
            "unpaused",
            model([ScriptStep::reply("ran")]),
        ))
        .unwrap();
    agent.pause("op").await.unwrap();
    assert!(agent.passive(), "a passive agent's pause started its actor");
    let asked = Arc::new(parking_lot::Mutex::new(None));
    let parked = Arc::new(AtomicUsize::new(0));
    let hook_parked = parked.clone();
    let parked_key = agent.key().clone();
    warden_actors::test_hooks::set_pump_parked(Some(Arc::new(move |key: &AgentKey| {
        if *key == parked_key {
            hook_parked.fetch_add(1, Ordering::SeqCst);
        }
    })));
    let (hook_agent, hook_asked, gap_parked) = (agent.clone(), asked.clone(), parked.clone());
    warden_actors::test_hooks::set_passive_control_gap(Some(Arc::new(move |key: &AgentKey| {
        if key != hook_agent.key() || hook_asked.lock().is_some() {
            return;
        }
        *hook_asked.lock() = Some(hook_agent.try_ask(UserEvent::new("go")).unwrap());
        assert!(!hook_agent.passive(), "the event started the actor");
        // The started actor (on its own thread) reads the event's lane only once unpaused: wait
        // until it has looked, found the agent paused and gone back to waiting.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while gap_parked.load(Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the actor never looked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(hook_agent.status().queued.ordinary, 1);
    })));
    agent.resume("op").await.unwrap();
    warden_actors::test_hooks::set_passive_control_gap(None);
    warden_actors::test_hooks::set_pump_parked(None);
    assert!(parked.load(Ordering::SeqCst) > 0);
    let pending = asked.lock().take().expect("the hook sent the event");
    let reply = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the unpause left the queued event unread")
        .unwrap();
    assert_eq!(reply.answer, "ran");
    assert!(!agent.status().paused);
    replay_matches(&journal, &agent);
    team.shutdown().await;
}

/// A send racing passivation, made to happen in the losing order: the idle actor has handed the
/// mailbox back (the agent is passive) and is about to stop when an event comes. The event starts
/// a new actor (the stopping one reads nothing more), is answered once, and nothing counts as a
/// crash.
#[actix_rt::test]
async fn an_event_sent_while_the_actor_passivates_starts_a_new_actor_and_is_answered_once() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let model = model([ScriptStep::reply("first"), ScriptStep::reply("second")]);
    let stats = model.stats();
    let npc = team.assistant("racer", model);
    npc.ask(UserEvent::new("one")).await.unwrap();
    let sent = Arc::new(parking_lot::Mutex::new(None));
    let (hook_npc, hook_sent) = (npc.clone(), sent.clone());
    warden_actors::test_hooks::set_passivated(Some(Arc::new(move |agent: &AgentKey| {
        if agent == hook_npc.key() && hook_sent.lock().is_none() {
            assert!(hook_npc.passive());
            *hook_sent.lock() = Some(hook_npc.try_ask(UserEvent::new("two")).unwrap());
        }
    })));
    until("the event was sent in the gap", || sent.lock().is_some()).await;
    warden_actors::test_hooks::set_passivated(None);
    let pending = sent.lock().take().unwrap();
    let reply = tokio::time::timeout(IDLE * 10, pending)
        .await
        .expect("the event sent in the gap was never read")
        .unwrap();
    assert_eq!(reply.answer, "second");
    settle(50).await;
    assert_eq!(stats.calls.load(Ordering::SeqCst), 2);
    assert_eq!(npc.status().turns, 2);
    assert_eq!(crashes(&journal, "racer"), 0);
    replay_matches(&journal, &npc);
}

/// Activation racing a halt: the halt finds the agent passive and, before it applies the halt to
/// the cell, an event starts the agent's actor on its own thread and a pause is applied there.
/// The halt still clears the event (discarded, never run), the agent ends `STOPPED` (and paused),
/// and the journal's replay is the live record.
#[actix_rt::test]
async fn an_activation_racing_a_passive_agents_halt_runs_nothing() {
    let journal = Arc::new(MemoryJournal::new());
    let mut config = config();
    config.supervisor.arbiters = 1;
    let team = Supervisor::new(config, journal.clone());
    let model = model([ScriptStep::reply("should not run")]);
    let stats = model.stats();
    let agent = team.spawn(AgentSpec::assistant("raced", model)).unwrap();
    assert!(agent.passive());
    let asked = Arc::new(parking_lot::Mutex::new(None));
    let (hook_agent, hook_asked) = (agent.clone(), asked.clone());
    let activated = Arc::new(AtomicUsize::new(0));
    let hook_activated = activated.clone();
    warden_actors::test_hooks::set_passive_halt_gap(Some(Arc::new(move |key: &AgentKey| {
        if key != hook_agent.key() {
            return;
        }
        *hook_asked.lock() = Some(hook_agent.try_ask(UserEvent::new("run!")).unwrap());
        if !hook_agent.passive() {
            hook_activated.fetch_add(1, Ordering::SeqCst);
        }
        // The started actor runs on its own thread: wait (on this one) until it applied a pause.
        futures::executor::block_on(hook_agent.pause("op")).unwrap();
    })));
    let ack = agent.halt(op()).await;
    warden_actors::test_hooks::set_passive_halt_gap(None);
    assert_eq!(
        activated.load(Ordering::SeqCst),
        1,
        "the event started the actor"
    );
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(ack.discarded, 1, "the halt cleared the event");
    let pending = asked.lock().take().unwrap();
    assert!(matches!(pending.await, Err(AskError::Discarded { .. })));
    let status = agent.status();
    assert!(status.paused);
    assert_eq!((status.turns, status.queued.ordinary), (0, 0));
    assert_eq!(stats.calls.load(Ordering::SeqCst), 0, "the event ran");
    replay_matches(&journal, &agent);
    team.shutdown().await;
}

/// A fleet halt (`halt_all`) that finds an NPC passive and clears a TRIGGER queued meanwhile (the
/// delivery activated the actor, a pause keeps the TRIGGER in the lane) also clears the writer
/// of the observation that delivery admitted (long-term memory: a TRIGGER sends no `Remember`,
/// its turn writes first). The batch reminds the actor once its record locks are released: the
/// observation is written, with no model call.
#[actix_rt::test]
async fn a_fleet_halt_that_clears_a_trigger_leaves_its_observation_written() {
    let journal = Arc::new(MemoryJournal::new());
    let mut config = config();
    config.supervisor.arbiters = 1;
    config.memory.long_term = true;
    let team = Supervisor::new(config, journal.clone());
    let model = model([ScriptStep::reply("should not run")]);
    let stats = model.stats();
    let npc = team
        .spawn(AgentSpec::assistant("sentry", model).with_npc(protocols::npc::NpcConfig::default()))
        .unwrap();
    assert!(npc.passive());
    let hook_npc = npc.clone();
    warden_actors::test_hooks::set_passive_halt_gap(Some(Arc::new(move |key: &AgentKey| {
        if key != hook_npc.key() || hook_npc.status().queued.ordinary > 0 {
            return;
        }
        let whisper = protocols::npc::WorldEvent::player(
            "p1",
            protocols::npc::WorldEventKind::Whisper,
            "The north tower's key is under the third stone.",
        )
        .in_room("gate");
        let seen = hook_npc.perceive(whisper).unwrap();
        assert!(seen.queued.is_some() && seen.observed, "{seen:?}");
        futures::executor::block_on(hook_npc.pause("op")).unwrap();
    })));
    let acks = team.halt_all().await;
    warden_actors::test_hooks::set_passive_halt_gap(None);
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].discarded, 1, "the halt cleared the TRIGGER");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let record = npc.record();
        let store = record.memory().expect("memory");
        if store.unwritten.is_empty() && store.memories.len() == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not written: {} waiting, {} stored",
            store.unwritten.len(),
            store.memories.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(stats.calls.load(Ordering::SeqCst), 0, "no model call");
    replay_matches(&journal, &npc);
    team.shutdown().await;
}

/// A halt read by the actor ends the running turn through its token, however the actor was
/// started. Here the turn's model call has returned while the team's model gate is closed (the
/// cluster's fail safe: the reply is held until the gate opens) when the halt comes: the turn,
/// ending as halted, drops the reply unapplied but records its tokens (`usage_recorded`) — the
/// work a turn does on its way out, which a turn dropped without being polled again never does.
///
/// An actor started by its first message (passivation on) has its idle check's timer in its
/// context ahead of the turn; actix removes a cancelled future once an earlier one was polled, so
/// the halt's cancellation of the turn dropped it unpolled (tests/otel.rs and
/// tests/cluster_netns.rs under `warden serve`). Run with passivation on and off.
#[actix_rt::test]
async fn a_halted_turn_ends_through_its_token_whether_its_actor_was_activated_or_not() {
    tokio::time::pause();
    for passivate in [false, true] {
        let mut config = config();
        if !passivate {
            config.supervisor.passivate_after_seconds = 0.0;
        }
        let (team, journal) = team(config);
        let model = model([ScriptStep::reply("too late").delayed(Duration::from_secs(5))]);
        let stats = model.stats();
        let lead = team.assistant("lead", model);
        assert_eq!(lead.passive(), passivate);
        let pending = lead.try_ask(UserEvent::new("go")).unwrap();
        until("the model call started", || {
            stats.calls.load(Ordering::SeqCst) == 1
        })
        .await;
        team.model_gate().close("cut off");
        until("the model call returned", || {
            stats.completed.load(Ordering::SeqCst) == 1
        })
        .await;
        settle(10).await;
        let usage = || {
            journal
                .events_of("lead")
                .iter()
                .filter(|e| matches!(e.kind, EventKind::UsageRecorded { .. }))
                .count()
        };
        assert_eq!(usage(), 0, "the reply is held at the closed gate");
        assert_eq!(lead.state(), AgentState::Executing);
        let ack = lead.halt(op()).await;
        assert_eq!(ack.state, AgentState::Stopped);
        settle(10).await;
        assert_eq!(
            usage(),
            1,
            "the held reply's tokens were never recorded: the turn was dropped before it saw its \
             token (passivation {passivate})"
        );
        assert!(matches!(pending.await, Err(AskError::Discarded { .. })));
        assert_eq!(lead.status().history_len, 1, "the held reply was applied");
        replay_matches(&journal, &lead);
        team.model_gate().open();
    }
}

/// Shutdown of a team with passive agents: a waiter on a running turn is answered (the agent is
/// gone), a later send is refused as closed, and a halt of a passive agent is acknowledged with
/// its state as it is.
#[actix_rt::test]
async fn shutdown_with_passive_agents_answers_waiters_and_refuses_later_sends() {
    tokio::time::pause();
    let (team, _journal) = team(config());
    let idle = team.assistant("idle", model([]));
    let busy = team.assistant(
        "busy",
        model([ScriptStep::reply("late").delayed(IDLE * 10)]),
    );
    let waiting = busy.try_ask(UserEvent::new("slow")).unwrap();
    until("busy runs", || busy.state() == AgentState::Executing).await;
    assert!(idle.passive());
    team.shutdown().await;
    assert!(matches!(waiting.await, Err(AskError::AgentGone)));
    assert!(matches!(
        idle.try_send_event(UserEvent::new("hello")),
        Err(EventSendError {
            refusal: protocols::WorkRefusal::Closed,
            ..
        })
    ));
    // A halt of a shut-down passive agent is acknowledged with the state as it is.
    let ack = idle.halt(op()).await;
    assert_eq!(ack.state, AgentState::WaitingForEvent);
}

/// `halt_all` acknowledges a passive agent's halt on the halting thread (no message to it): it
/// still returns only once every halt is durable — not before the last `Halted` is.
#[actix_rt::test]
async fn halt_all_of_passive_agents_returns_only_once_every_halt_is_durable() {
    tokio::time::pause();
    // Durable up to what the test says (`durable_up_to`): everything, to begin with.
    let journal = Arc::new(Gated::new());
    journal.durable_up_to.send_replace(u64::MAX);
    let team = Supervisor::on_current_arbiter(config(), journal.clone());
    let agents: Vec<AgentHandle> = (0..20)
        .map(|i| team.assistant(&format!("a{i}"), model([ScriptStep::reply("ok")])))
        .collect();
    assert!(agents.iter().all(|a| a.passive()));
    let before = journal.inner.len() as u64;
    journal.durable_up_to.send_replace(before);
    let mut halt = Box::pin(team.halt_all());
    tokio::select! {
        biased;
        _ = &mut halt => panic!("halt_all returned before any halt was durable"),
        () = tokio::time::sleep(Duration::from_secs(60)) => {}
    }
    // Every agent is stopped in memory already (fail safe), and journaled.
    assert!(agents.iter().all(|a| a.state() == AgentState::Stopped));
    let last = journal.inner.len() as u64;
    journal.durable_up_to.send_replace(last - 1);
    tokio::select! {
        biased;
        _ = &mut halt => panic!("halt_all returned before the last halt was durable"),
        () = tokio::time::sleep(Duration::from_secs(60)) => {}
    }
    journal.durable_up_to.send_replace(last);
    let acks = halt.await;
    assert_eq!(acks.len(), 20);
    assert!(acks
        .iter()
        .all(|a| a.state == AgentState::Stopped && a.not_durable.is_none()));
    assert!(agents.iter().all(|a| a.passive()));
}

/// A fleet halt of more passive agents than one batch (`halt_all` journals them a batch at a
/// time, each batch's rows durable together), then a crash that keeps only the first batch:
/// every agent restored from what was kept is halted by the fleet halt (both its rows kept) or as
/// it was before it — never half halted — and a lift on the restored team resumes exactly the
/// first batch's agents. The live team's replay is its record.
#[actix_rt::test]
async fn a_crash_between_the_batches_of_a_fleet_halt_restores_each_agent_whole() {
    tokio::time::pause();
    let journal = Arc::new(Gated::new());
    journal.durable_up_to.send_replace(u64::MAX);
    let team = Supervisor::on_current_arbiter(config(), journal.clone());
    let model = model([]);
    let agents: Vec<AgentHandle> = (0..2500)
        .map(|i| team.assistant(&format!("a{i}"), model.clone()))
        .collect();
    let acks = team.halt_all().await;
    assert!(acks
        .iter()
        .all(|a| a.state == AgentState::Stopped && a.not_durable.is_none()));
    let calls = journal.calls();
    let batches: Vec<usize> = (0..calls.len()).filter(|&i| calls[i].len() > 2).collect();
    assert!(
        (2..10).contains(&batches.len()),
        "2,500 halts in {} journal calls",
        batches.len()
    );
    // The crash: what the first batch's call and every call before it brought is kept.
    let kept: usize = calls[..=batches[0]].iter().map(Vec::len).sum();
    let mut by_agent: std::collections::HashMap<AgentKey, Vec<Event>> = Default::default();
    for e in journal.inner.events().into_iter().take(kept) {
        by_agent.entry(e.agent.clone()).or_default().push(e);
    }
    let restored = Supervisor::on_current_arbiter(config(), Arc::new(MemoryJournal::new()));
    let mut halted = 0;
    for a in &agents {
        let events = by_agent.remove(a.key()).unwrap_or_default();
        let record = AgentRecord::replay(a.key().clone(), &events);
        match record.state {
            AgentState::Stopped => {
                assert!(record.fleet_halted && record.halts == 1, "{record:?}");
                halted += 1;
            }
            AgentState::WaitingForEvent => assert_eq!(record.halts, 0, "{record:?}"),
            other => panic!("{} restored {other:?}", a.key()),
        }
        restored
            .spawn(AgentSpec::assistant(a.key().as_str(), model.clone()).restored_from(record))
            .unwrap();
    }
    assert_eq!(2 * halted, calls[batches[0]].len(), "an agent half halted");
    let lifted = restored.resume_fleet_halt("ops").await.expect("noted");
    assert_eq!(lifted.len(), halted);
    assert!(lifted.iter().all(|o| o.resumed), "{lifted:?}");
    for a in agents.iter().step_by(101) {
        replay_matches(&journal.inner, a);
    }
}
