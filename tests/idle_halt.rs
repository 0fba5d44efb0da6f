//! The halt of an active agent whose actor is idle (issue 36, item 3): applied on the halting
//! thread, as a passive agent's is — acknowledged with no wake-up of the agent's thread, so neither
//! a cross-thread round trip nor a busy arbiter stands between an operator and the ack.
//!
//! Paused time and the test's arbiter where one thread is enough; the agent on an arbiter of its
//! own where the point is another thread (held there by the model, or by a `test-hooks` pause
//! point in the losing interleaving).
mod common;
use common::*;
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc,
    },
    time::Duration,
};
use warden::*;

/// Passivation off: the agents here keep their actors (a passive agent's halt is tested in
/// tests/passivation.rs).
fn config() -> WardenConfig {
    let mut config = WardenConfig::default();
    config.supervisor.passivate_after_seconds = 0.0;
    config
}

fn discarded_listed(journal: &MemoryJournal, agent: &str) -> usize {
    journal
        .events_of(agent)
        .iter()
        .map(|e| match &e.kind {
            EventKind::MessagesDiscarded { messages } => messages.len(),
            _ => 0,
        })
        .sum()
}

/// What `fut` gives at its first poll (`None`: it was pending — it waited for another thread).
async fn first_poll<F: std::future::Future>(fut: F) -> Option<F::Output> {
    futures::pin_mut!(fut);
    match futures::poll!(fut.as_mut()) {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}

/// Spawns agent `key` and has it hold its arbiter's thread: its model call blocks the thread
/// until the returned sender is used (or 30 s pass). Returns once the call has begun, with the
/// pending ask.
fn hold_the_arbiter(team: &Supervisor, key: &str) -> (PendingReply, mpsc::Sender<()>) {
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let entered_tx = parking_lot::Mutex::new(entered_tx);
    let release_rx = parking_lot::Mutex::new(release_rx);
    let hog_model = Arc::new(ScriptedProvider::new([]).with_fallback(move |_| {
        // Called on the arbiter's thread: block it until the test lets go.
        let _ = entered_tx.lock().send(());
        let _ = release_rx.lock().recv_timeout(Duration::from_secs(30));
        ScriptStep::reply("done")
    }));
    let hog = team.assistant(key, hog_model);
    let hogged = hog.try_ask(UserEvent::new("block")).unwrap();
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the hog's model call began");
    (hogged, release)
}

/// A paused agent behind a backlog (the halt probe's case): its actor is started and idle. The
/// halt is applied by the caller: the first poll of `halt` has the ack, `STOPPED`, with the whole
/// backlog cleared; the cleared events are then settled (`Discarded`) and listed by the actor;
/// nothing ran; the resume lets work run again; replay = live.
#[actix_rt::test]
async fn an_idle_agents_halt_is_acknowledged_on_the_halting_thread() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let model = model([ScriptStep::reply("first"), ScriptStep::reply("after")]);
    let stats = model.stats();
    let clerk = team.assistant("clerk", model);
    clerk.ask(UserEvent::new("one")).await.unwrap();
    assert!(!clerk.passive(), "the actor runs");
    clerk.pause("op").await.unwrap();
    let pending: Vec<_> = (0..100)
        .map(|i| {
            clerk
                .try_ask(UserEvent::new(format!("queued {i}")))
                .unwrap()
        })
        .collect();
    settle(8).await; // the actor looks, finds the agent paused, waits
    assert_eq!(clerk.status().queued.ordinary, 100);

    let ack = first_poll(clerk.halt(op()))
        .await
        .expect("an idle agent's halt waited for its actor");
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(ack.discarded, 100);
    assert!(ack.not_durable.is_none());
    assert_eq!(clerk.status().queued.ordinary, 0);
    for reply in pending {
        assert!(matches!(reply.await, Err(AskError::Discarded { .. })));
    }
    until("the cleared backlog is listed", || {
        discarded_listed(&journal, "clerk") == 100
    })
    .await;
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1, "queued work ran");
    assert_eq!(clerk.status().turns, 1);

    clerk.resume("op").await.unwrap();
    assert_eq!(clerk.state(), AgentState::WaitingForEvent);
    assert_eq!(
        clerk.ask(UserEvent::new("again")).await.unwrap().answer,
        "after"
    );
    replay_matches(&journal, &clerk);
}

/// A halt of an agent whose turn runs is still the actor's to apply (the turn is cancelled and
/// ends through its token): not applied by the caller while the turn is held.
#[actix_rt::test]
async fn a_running_turn_keeps_the_halt_with_the_actor() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let model = model([ScriptStep::reply("never").delayed(Duration::from_secs(30))]);
    let agent = team.assistant("busy", model);
    let asked = agent.try_ask(UserEvent::new("work")).unwrap();
    until("the turn runs", || agent.state() == AgentState::Executing).await;
    let halting = agent.halt(op());
    futures::pin_mut!(halting);
    assert!(
        futures::poll!(halting.as_mut()).is_pending(),
        "a halt was applied past the actor while its turn ran"
    );
    let ack = halting.await;
    assert_eq!(ack.state, AgentState::Stopped);
    assert!(matches!(asked.await, Err(AskError::Discarded { .. })));
    assert_eq!(agent.state(), AgentState::Stopped);
    replay_matches(&journal, &agent);
}

/// Another agent's step holds the shared arbiter thread (its model call blocks the thread): the
/// halt of an idle agent on that thread is acknowledged at once all the same. (Before, the halt
/// waited in the idle agent's lane until the thread was free.)
#[actix_rt::test]
async fn a_held_arbiter_does_not_delay_an_idle_agents_halt() {
    let journal = Arc::new(MemoryJournal::new());
    let mut config = config();
    config.supervisor.arbiters = 1; // both agents on one arbiter, not the test's
    let team = Supervisor::new(config, journal.clone());
    let idle = team.assistant("idle", model([ScriptStep::reply("ready")]));
    assert_eq!(
        idle.ask(UserEvent::new("up?")).await.unwrap().answer,
        "ready"
    );

    let (hogged, release) = hold_the_arbiter(&team, "hog");

    let ack = first_poll(idle.halt(op())).await;
    if ack.is_none() {
        release.send(()).unwrap();
    }
    let ack = ack.expect("the idle agent's halt waited for the held arbiter");
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(idle.state(), AgentState::Stopped);
    release.send(()).unwrap();
    assert_eq!(hogged.await.unwrap().answer, "done");
    replay_matches(&journal, &idle);
    team.shutdown().await;
}

/// The losing interleaving: while the halt holds its borrow on the idle actor (before it applies
/// the halt), a pause comes over the control lane and wakes the actor on its own thread, which
/// must read nothing. Once the halt is applied the actor is woken again and reads the pause: the
/// pause is answered, after the halt. (Without the wake at the borrow's end the pause is never
/// read.)
#[actix_rt::test]
async fn a_message_that_wakes_the_actor_during_the_borrow_is_read_after_the_halt() {
    let journal = Arc::new(MemoryJournal::new());
    let mut config = config();
    config.supervisor.arbiters = 1;
    let team = Supervisor::new(config, journal.clone());
    let agent = team.assistant("borrowed", model([ScriptStep::reply("up")]));
    let parked = Arc::new(AtomicUsize::new(0));
    let idle_after_turn = Arc::new(AtomicUsize::new(0));
    let (hook_parked, hook_idle, parked_agent) =
        (parked.clone(), idle_after_turn.clone(), agent.clone());
    warden_actors::test_hooks::set_pump_parked(Some(Arc::new(move |key: &AgentKey| {
        if key == parked_agent.key() {
            hook_parked.fetch_add(1, Ordering::SeqCst);
            let status = parked_agent.status();
            if status.turns == 1 && status.state == AgentState::WaitingForEvent {
                hook_idle.fetch_add(1, Ordering::SeqCst);
            }
        }
    })));
    agent.ask(UserEvent::new("start")).await.unwrap();
    // The reply goes out just before the actor looks for more and parks: wait for that park, so
    // that the halt finds the actor idle (and borrows it).
    until("the actor parked after its turn", || {
        idle_after_turn.load(Ordering::SeqCst) > 0
    })
    .await;
    let (paused_tx, paused) = mpsc::channel();
    let paused_tx = parking_lot::Mutex::new(Some(paused_tx));
    let (hook_agent, gap_parked) = (agent.clone(), parked.clone());
    warden_actors::test_hooks::set_idle_halt_gap(Some(Arc::new(move |key: &AgentKey| {
        if key != hook_agent.key() {
            return;
        }
        let Some(tx) = paused_tx.lock().take() else {
            return;
        };
        let before = gap_parked.load(Ordering::SeqCst);
        let pausing = hook_agent.clone();
        std::thread::spawn(move || {
            let _ = tx.send(futures::executor::block_on(pausing.pause("op")));
        });
        // The pause wakes the actor on its own thread: wait until it has looked and backed off.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while gap_parked.load(Ordering::SeqCst) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "the actor never looked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(hook_agent.status().queued.control, 1, "it read the pause");
    })));
    let ack = agent.halt(op()).await;
    warden_actors::test_hooks::set_idle_halt_gap(None);
    warden_actors::test_hooks::set_pump_parked(None);
    assert_eq!(ack.state, AgentState::Stopped);
    paused
        .recv_timeout(Duration::from_secs(10))
        .expect("the pause sent during the borrow was never read")
        .unwrap();
    let status = agent.status();
    assert!(status.paused);
    assert_eq!(status.state, AgentState::Stopped);
    let kinds: Vec<_> = journal
        .events_of("borrowed")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Halted { .. } => Some("halted"),
            EventKind::Paused { .. } => Some("paused"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["halted", "paused"]);
    replay_matches(&journal, &agent);
    team.shutdown().await;
}

/// `halt_all` over active agents whose actors are idle (passivation off): each is halted by the
/// halting call itself, batched as passive agents are — the first poll has every ack, none sent
/// through a message — and a paused one's backlog is cleared and answered as by any halt.
#[actix_rt::test]
async fn halt_all_halts_idle_active_agents_on_the_halting_thread() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let agents: Vec<AgentHandle> = (0..20)
        .map(|i| team.assistant(&format!("npc{i:02}"), chatty()))
        .collect();
    for agent in &agents {
        agent.ask(UserEvent::new("hi")).await.unwrap();
        assert!(!agent.passive());
    }
    agents[3].pause("op").await.unwrap();
    let pending: Vec<_> = (0..5)
        .map(|i| {
            agents[3]
                .try_ask(UserEvent::new(format!("queued {i}")))
                .unwrap()
        })
        .collect();
    settle(8).await;

    let acks = first_poll(team.halt_all())
        .await
        .expect("halt_all waited for idle agents' actors");
    assert_eq!(acks.len(), 20);
    assert!(acks.iter().all(|a| a.state == AgentState::Stopped));
    assert_eq!(acks.iter().map(|a| a.discarded).sum::<u64>(), 5);
    for reply in pending {
        assert!(matches!(reply.await, Err(AskError::Discarded { .. })));
    }
    let lifted = team.resume_fleet_halt("op").await.unwrap();
    assert_eq!(lifted.len(), 20);
    for agent in &agents {
        replay_matches(&journal, agent);
    }
    assert_eq!(
        agents[0].ask(UserEvent::new("again")).await.unwrap().answer,
        "hello"
    );
}

/// A halt from a thread with no runtime (a game's own thread, `futures::executor::block_on`) while
/// another agent's step holds the shared arbiter: acknowledged on the halting thread all the same;
/// the cleared backlog is handed to the agent's actor at once (no runtime to post it from), and
/// once the arbiter is free every cleared ask is answered and listed as after any halt.
#[actix_rt::test]
async fn a_halt_from_a_thread_without_a_runtime_still_settles_the_cleared_backlog() {
    let journal = Arc::new(MemoryJournal::new());
    let mut config = config();
    config.supervisor.arbiters = 1;
    let team = Supervisor::new(config, journal.clone());
    let agent = team.assistant("plain", model([ScriptStep::reply("up")]));
    agent.ask(UserEvent::new("start")).await.unwrap();
    agent.pause("op").await.unwrap();
    let pending: Vec<_> = (0..10)
        .map(|i| {
            agent
                .try_ask(UserEvent::new(format!("queued {i}")))
                .unwrap()
        })
        .collect();

    let (hogged, release) = hold_the_arbiter(&team, "hog2");

    let (acked_tx, acked) = mpsc::channel();
    let halting = agent.clone();
    std::thread::spawn(move || {
        let _ = acked_tx.send(futures::executor::block_on(halting.halt(op())));
    });
    let ack = acked.recv_timeout(Duration::from_secs(10));
    release.send(()).unwrap();
    let ack = ack.expect("the halt from a plain thread waited for the held arbiter");
    assert_eq!(ack.state, AgentState::Stopped);
    assert_eq!(ack.discarded, 10);
    assert_eq!(hogged.await.unwrap().answer, "done");
    for reply in pending {
        let settled = tokio::time::timeout(Duration::from_secs(10), reply)
            .await
            .expect("a cleared ask was never answered");
        assert!(matches!(settled, Err(AskError::Discarded { .. })));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while discarded_listed(&journal, "plain") < 10 {
        assert!(std::time::Instant::now() < deadline, "never listed");
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    replay_matches(&journal, &agent);
    team.shutdown().await;
}
