//! The host handle (`warden::host`): warden on a thread of its own, driven from plain std threads
//! (no runtime on the caller's thread): deliveries and their replies by event id, refusals that
//! hand the event back, halt epochs, one wake per batch, start and stop twice in one process.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use warden::{
    host::{AddError, DeliverError, NpcReply, StartError, Warden, WardenHandle},
    protocols::{
        npc::{Verdict, WorldEvent, WorldEventKind},
        AgentKey, HaltCause, Presence,
    },
    AgentSpec, AskError, MemoryJournal, ScriptStep, ScriptedProvider, WardenConfig,
};

fn whisper(text: &str) -> WorldEvent {
    WorldEvent::player("p1", WorldEventKind::Whisper, text).in_room("tavern")
}

/// A model that answers every turn with what it was last told, after `delay`.
fn echo(delay: Duration) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(move |request| {
        let heard = request
            .messages
            .iter()
            .rev()
            .find_map(|m| m.content.clone())
            .unwrap_or_default();
        ScriptStep::reply(format!("heard: {heard}")).delayed(delay)
    }))
}

fn start(config: WardenConfig, npcs: &[&str], delay: Duration) -> WardenHandle {
    let specs = npcs.iter().map(|k| AgentSpec::assistant(*k, echo(delay)));
    Warden::start(config, Arc::new(MemoryJournal::new()), specs).expect("warden starts")
}

/// Drains until `n` replies arrived (or panics after 10 s), polling as a frame loop would.
fn drain(warden: &WardenHandle, n: usize) -> Vec<NpcReply> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut replies = Vec::new();
    while replies.len() < n {
        assert!(Instant::now() < deadline, "only {replies:?} of {n} replies");
        warden.drain_replies(&mut replies, 64);
        std::thread::sleep(Duration::from_millis(1));
    }
    replies
}

#[test]
fn a_plain_thread_delivers_and_drains_replies_by_event_id() {
    let warden = start(WardenConfig::default(), &["smith", "guard"], Duration::ZERO);
    let host = warden.clone();
    // A thread of the host's own: no tokio, no actix on it.
    let (sent, replies) = std::thread::spawn(move || {
        let mut sent = Vec::new();
        for (npc, text) in [
            ("smith", "a sword?"),
            ("guard", "the gate?"),
            ("smith", "an axe?"),
        ] {
            let delivered = host.try_deliver(npc, whisper(text)).expect("delivered");
            assert_eq!(delivered.verdict, Verdict::Trigger);
            assert_eq!(delivered.halt_epoch, 0);
            sent.push((npc, delivered.event_id.expect("a trigger is queued"), text));
        }
        (sent, drain(&host, 3))
    })
    .join()
    .expect("the host thread");
    for (npc, id, text) in sent {
        let reply = replies
            .iter()
            .find(|r| r.agent.as_str() == npc && r.event_id == id)
            .unwrap_or_else(|| panic!("no reply to {npc}'s event {id} in {replies:?}"));
        assert!(reply.text().expect("answered").contains(text), "{reply:?}");
        assert_eq!((reply.halt_epoch, reply.stale), (0, false));
    }
    let stats = warden.stats();
    assert_eq!((stats.agents, stats.delivered, stats.replies), (2, 3, 3));
    assert_eq!(stats.refused, 0);
    warden.shutdown();
}

#[test]
fn refusals_hand_the_event_back() {
    let mut config = WardenConfig::default();
    config.mailbox.ordinary_capacity = std::num::NonZeroUsize::MIN;
    // The model never answers in this test: the first event stays in its turn, the lane fills.
    let warden = start(config, &["smith"], Duration::from_secs(3600));

    let err = warden.try_deliver("nobody", whisper("hello?")).unwrap_err();
    assert!(matches!(&err, DeliverError::Unknown(_)), "{err:?}");
    assert_eq!(err.into_event(), whisper("hello?"));

    let deadline = Instant::now() + Duration::from_secs(10);
    let busy = loop {
        assert!(Instant::now() < deadline, "the lane never filled");
        match warden.try_deliver("smith", whisper("one more")) {
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(err) => break err,
        }
    };
    assert!(matches!(&busy, DeliverError::Busy(_)), "{busy:?}");
    assert_eq!(busy.into_event(), whisper("one more"));

    warden.halt_all("test");
    let halted = warden
        .try_deliver("smith", whisper("after the halt"))
        .unwrap_err();
    assert!(matches!(&halted, DeliverError::Halted(_)), "{halted:?}");
    assert_eq!(halted.into_event(), whisper("after the halt"));
    assert!(warden.stats().refused >= 3);

    let other = warden.clone();
    warden.shutdown();
    let gone = other.try_deliver("smith", whisper("late")).unwrap_err();
    assert!(matches!(&gone, DeliverError::Shutdown(_)), "{gone:?}");
    assert_eq!(gone.into_event(), whisper("late"));
}

#[test]
fn replies_from_before_a_halt_carry_the_old_epoch() {
    let warden = start(
        WardenConfig::default(),
        &["smith"],
        Duration::from_millis(300),
    );
    // One event in its turn (the model call takes 300 ms), more queued behind it.
    let before: Vec<u64> = (0..3)
        .map(|i| {
            let delivered = warden
                .try_deliver("smith", whisper(&format!("before {i}")))
                .expect("delivered");
            delivered.event_id.expect("queued")
        })
        .collect();
    // The first turn has started (its model call is in flight): waited for, not slept on.
    let smith = warden.agent("smith").expect("smith");
    let deadline = Instant::now() + Duration::from_secs(10);
    while smith.state() != warden::AgentState::Executing {
        assert!(Instant::now() < deadline, "smith never started its turn");
        std::thread::sleep(Duration::from_millis(1));
    }
    warden.halt_all("test");
    assert_eq!(
        warden.halt_epoch("smith"),
        Some(1),
        "raised before halt_all returned"
    );

    let replies = drain(&warden, before.len());
    for reply in &replies {
        assert!(before.contains(&reply.event_id), "{reply:?}");
        // Never a reply from before the halt tagged as current.
        assert_eq!((reply.halt_epoch, reply.stale), (0, true), "{reply:?}");
        assert!(
            matches!(reply.result, Err(AskError::Discarded { .. })),
            "{reply:?}"
        );
    }
    // Nothing else comes, even after the model's delay has passed.
    std::thread::sleep(Duration::from_millis(400));
    let mut late = Vec::new();
    assert_eq!(warden.drain_replies(&mut late, 64), 0, "{late:?}");

    // Resumed, the NPC answers again, under the new epoch.
    futures::executor::block_on(smith.resume("ops")).expect("resumed");
    let after = warden
        .try_deliver("smith", whisper("after"))
        .expect("delivered");
    assert_eq!(after.halt_epoch, 1);
    let replies = drain(&warden, 1);
    assert_eq!(replies[0].event_id, after.event_id.expect("queued"));
    assert_eq!((replies[0].halt_epoch, replies[0].stale), (1, false));
    assert!(replies[0].text().expect("answered").contains("after"));
    warden.shutdown();
}

#[test]
fn a_batch_costs_one_wake() {
    let npcs = ["a", "b", "c", "d"];
    let warden = start(WardenConfig::default(), &npcs, Duration::ZERO);
    let mut batch: Vec<(AgentKey, WorldEvent)> = Vec::new();
    let mut results = Vec::new();
    for round in 0..3 {
        for npc in npcs {
            for i in 0..3 {
                batch.push((npc.into(), whisper(&format!("{npc} {round}.{i}"))));
            }
        }
        let wakes = warden.stats().wakes;
        assert_eq!(warden.deliver_batch(&mut batch, &mut results), 12);
        assert!(warden.stats().wakes - wakes <= 1, "round {round}");
        assert!(batch.is_empty());
        // Every event is answered: warden's thread woke the NPCs the batch filled.
        let replies = drain(&warden, 12);
        assert_eq!(replies.len(), 12);
        for (reply, result) in replies.iter().zip(&results) {
            assert!(reply.text().is_some(), "{reply:?}");
            let _ = result.as_ref().expect("delivered");
        }
        results.clear();
    }
    // A batch of refusals wakes nobody.
    batch.push(("nobody".into(), whisper("hello?")));
    let wakes = warden.stats().wakes;
    assert_eq!(warden.deliver_batch(&mut batch, &mut results), 0);
    assert!(matches!(results[0], Err(DeliverError::Unknown(_))));
    assert_eq!(warden.stats().wakes, wakes);
    assert_eq!(warden.stats().batches, 4);
    warden.shutdown();
}

#[test]
fn starts_and_stops_twice_in_one_process() {
    for round in 0..2 {
        let warden = start(WardenConfig::default(), &["smith"], Duration::ZERO);
        let id = warden
            .try_deliver("smith", whisper("a sword?"))
            .expect("delivered")
            .event_id;
        assert_eq!(
            drain(&warden, 1)[0].event_id,
            id.expect("queued"),
            "round {round}"
        );
        if round == 0 {
            warden.shutdown();
        } else {
            // Dropping the last handle (here, on another thread) stops it too.
            let other = warden.clone();
            drop(warden);
            std::thread::spawn(move || drop(other))
                .join()
                .expect("dropped");
        }
    }
}

#[test]
fn a_duplicate_key_fails_the_start() {
    let specs = ["smith", "smith"].map(|k| AgentSpec::assistant(k, echo(Duration::ZERO)));
    let err = Warden::start(
        WardenConfig::default(),
        Arc::new(MemoryJournal::new()),
        specs,
    )
    .expect_err("a duplicate key");
    assert!(err.to_string().contains("smith"), "{err}");
}

#[test]
fn async_hosts_deliver_and_await_replies() {
    let warden = start(WardenConfig::default(), &["smith"], Duration::ZERO);
    // A tokio runtime of the host's own, not warden's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let delivered = warden
            .deliver("smith", whisper("a sword?"))
            .await
            .expect("delivered");
        let reply = warden.next_reply().await.expect("a reply");
        assert_eq!(Some(reply.event_id), delivered.event_id);
        let acks = warden.halt_all_acked("test").await;
        assert_eq!(acks.len(), 1);
    });
    let waiter = warden.clone();
    let pending = std::thread::spawn(move || futures::executor::block_on(waiter.next_reply()));
    std::thread::sleep(Duration::from_millis(20));
    warden.shutdown();
    assert_eq!(
        pending.join().expect("the waiter"),
        None,
        "shutdown ends the wait"
    );
}

#[cfg(feature = "server")]
#[test]
fn a_team_file_starts_through_the_setup() {
    let file = warden::team::TeamFile::from_toml(
        r#"
[providers.canned]
kind = "scripted"
replies = ["Welcome!"]

[[agents]]
key = "innkeeper"
provider = "canned"
"#,
    )
    .expect("a valid team file");
    let warden = Warden::start_with(
        file.config.clone(),
        Arc::new(MemoryJournal::new()),
        move |team| file.spawn_agents(team).map_err(StartError::setup),
    )
    .expect("warden starts");
    let id = warden
        .try_deliver("innkeeper", whisper("a room?"))
        .expect("delivered")
        .event_id;
    let reply = &drain(&warden, 1)[0];
    assert_eq!(Some(reply.event_id), id);
    assert_eq!(reply.text(), Some("Welcome!"));
    warden.shutdown();
}

#[test]
fn a_failed_setup_stops_everything() {
    let err = Warden::start_with(
        WardenConfig::default(),
        Arc::new(MemoryJournal::new()),
        |_| Err(StartError::setup("no world today")),
    )
    .expect_err("the setup fails");
    assert!(err.to_string().contains("no world today"), "{err}");
}

#[test]
fn halt_all_journals_the_reason_and_resume_all_brings_the_npcs_back() {
    let journal = Arc::new(MemoryJournal::new());
    let specs = ["smith", "guard"].map(|k| AgentSpec::assistant(k, echo(Duration::ZERO)));
    let warden = Warden::start(WardenConfig::default(), journal.clone(), specs).expect("starts");
    warden.halt_all("shard draining");
    let halted = warden.try_deliver("smith", whisper("hello?")).unwrap_err();
    assert!(matches!(halted, DeliverError::Halted(_)), "{halted:?}");
    let cause = |agent: &str| {
        journal
            .events_of(agent)
            .into_iter()
            .find_map(|e| match e.kind {
                warden::protocols::EventKind::Halted { cause, .. } => Some(cause),
                _ => None,
            })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while cause("guard").is_none() {
        assert!(Instant::now() < deadline, "the halt was never journaled");
        std::thread::sleep(Duration::from_millis(1));
    }
    for npc in ["smith", "guard"] {
        assert_eq!(
            cause(npc),
            Some(HaltCause::Host {
                reason: "shard draining".into()
            }),
            "{npc}"
        );
    }

    // Sync and non-blocking: the resumes are queued; deliveries are taken once they are read.
    assert_eq!(warden.resume_all("ops"), 2);
    assert_eq!(warden.stats().resumes, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let delivered = loop {
        match warden.try_deliver("smith", whisper("back?")) {
            Ok(delivered) => break delivered,
            Err(DeliverError::Halted(_)) => {
                assert!(Instant::now() < deadline, "never resumed");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(err) => panic!("{err:?}"),
        }
    };
    let reply = &drain(&warden, 1)[0];
    assert_eq!(Some(reply.event_id), delivered.event_id);
    assert_eq!((reply.halt_epoch, reply.stale), (1, false));
    warden.shutdown();
}

#[test]
fn an_npc_spawned_after_start_is_reachable() {
    let warden = start(WardenConfig::default(), &["smith"], Duration::ZERO);
    let err = warden.try_deliver("baker", whisper("bread?")).unwrap_err();
    assert!(matches!(err, DeliverError::Unknown(_)), "{err:?}");
    let baker = AgentSpec::assistant("baker", echo(Duration::ZERO));
    futures::executor::block_on(warden.spawn(baker)).expect("spawned");
    let again = AgentSpec::assistant("baker", echo(Duration::ZERO));
    let duplicate = futures::executor::block_on(warden.spawn(again)).unwrap_err();
    assert!(matches!(duplicate, AddError::Spawn(_)), "{duplicate:?}");
    assert_eq!(warden.stats().agents, 2);
    // Every clone reaches it, and its replies are tagged like the others'.
    let other = warden.clone();
    let delivered = other
        .try_deliver("baker", whisper("bread?"))
        .expect("delivered");
    let reply = &drain(&warden, 1)[0];
    assert_eq!(reply.agent.as_str(), "baker");
    assert_eq!(Some(reply.event_id), delivered.event_id);
    assert!(reply.text().expect("answered").contains("bread?"));
    warden.halt_all("test");
    assert_eq!(warden.halt_epoch("baker"), Some(1));
    warden.shutdown();
    let gone = AgentSpec::assistant("late", echo(Duration::ZERO));
    let err = futures::executor::block_on(other.spawn(gone)).unwrap_err();
    assert!(matches!(err, AddError::Shutdown), "{err:?}");
}

/// A host's test against slow NPCs without the wait: warden on tokio's paused clock
/// (`Warden::start_paused`, feature `test-util`). The model takes 30 s per answer; the three
/// replies come in delivery order, each 30 s after the last on warden's clock, in milliseconds of
/// wall time.
#[test]
fn a_paused_clock_answers_a_slow_model_at_once() {
    let slow = echo(Duration::from_secs(30));
    let warden = Warden::start_paused(
        WardenConfig::default(),
        Arc::new(MemoryJournal::new()),
        move |team| {
            team.spawn(AgentSpec::assistant("smith", slow))?;
            Ok(())
        },
    )
    .expect("warden starts");
    let started = Instant::now();
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            let delivered = warden.try_deliver("smith", whisper(&format!("question {i}")));
            delivered.expect("delivered").event_id.expect("queued")
        })
        .collect();
    let replies = drain(&warden, 3);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let answered: Vec<u64> = replies.iter().map(|r| r.event_id).collect();
    assert_eq!(answered, ids, "in delivery order");
    for (i, reply) in replies.iter().enumerate() {
        let answer = reply.result.as_ref().expect("answered");
        assert!(
            answer.answer.contains(&format!("question {i}")),
            "{reply:?}"
        );
        // Accepted together, answered one after the other: 30 s, 60 s, 90 s on warden's clock
        // (within a second: the acceptance is stamped on the host's thread, in real time).
        let waited = answer.latency.as_secs_f64();
        let expected = 30.0 * (i as f64 + 1.0);
        assert!(
            (expected - 1.0..expected + 5.0).contains(&waited),
            "{reply:?}"
        );
    }
    warden.shutdown();
}

/// The host's `recall(npc, about)`: what the NPC remembers of a player, for game logic
/// (long-term memory, docs/memory.md).
#[test]
fn the_host_recalls_what_an_npc_remembers_about_a_player() {
    let mut config = WardenConfig::default();
    config.memory.long_term = true;
    let warden = start(config, &["smith"], Duration::ZERO);
    assert_eq!(warden.recall("smith", "p1"), None);
    let whisper = WorldEvent::player(
        "p1",
        WorldEventKind::Whisper,
        "I am Aldric, and I owe you ten gold",
    )
    .in_room("forge");
    warden.try_deliver("smith", whisper).unwrap();
    drain(&warden, 1);
    let recalled = warden.recall("smith", "p1").expect("something about p1");
    assert!(recalled.contains("about p1 (player)"), "{recalled}");
    assert!(
        recalled.contains("\"I am Aldric, and I owe you ten gold\""),
        "{recalled}"
    );
    assert_eq!(warden.recall("nobody", "p1"), None);
    warden.shutdown();
}

/// A TRIGGER the NPC's full lane refuses had its observation admitted (long-term memory) by the
/// same delivery, and no turn of its own will write it: the NPC's actor is asked to, and the
/// host's pump wakes it (a host call defers wakes), though the delivery failed. Here the NPC is
/// paused, so no turn writes anything: only that wake does (both observations).
#[test]
fn a_refused_triggers_observation_is_written_though_the_delivery_failed() {
    let mut config = WardenConfig::default();
    config.memory.long_term = true;
    config.mailbox.ordinary_capacity = std::num::NonZeroUsize::MIN;
    let warden = start(config, &["farrier"], Duration::ZERO);
    let farrier = warden.agent("farrier").expect("farrier");
    futures::executor::block_on(farrier.pause("ops")).expect("paused");
    // Passive (no actor yet): the first delivery starts its actor, so the actor's first park
    // comes after it looked at what that delivery queued.
    assert!(
        farrier.passive(),
        "spawned passive, paused without an actor"
    );
    let parked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook_parked = parked.clone();
    warden_actors::test_hooks::set_pump_parked(Some(Arc::new(move |key: &AgentKey| {
        if key.as_str() == "farrier" {
            hook_parked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    })));
    let from = |player: &str, text: &str| {
        WorldEvent::player(player, WorldEventKind::Whisper, text).in_room("forge")
    };
    // The first fills the lane (paused: it stays there); its turn is to write its observation.
    warden
        .try_deliver("farrier", from("p1", "I am Aldric and I need a blade."))
        .expect("queued");
    // The first delivery's one wake (the pump's hand-over) started the actor; it looked, found
    // nothing it may read while paused, and parked: no wake is left to read the next one's
    // signal but the hand-over this test is about.
    let deadline = Instant::now() + Duration::from_secs(10);
    while parked.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the NPC's actor never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
    warden_actors::test_hooks::set_pump_parked(None);
    // The next is refused: no turn of its own, and no other delivery wakes the actor for it.
    let refused = warden.try_deliver("farrier", from("p2", "I am Brida; my axe is chipped."));
    assert!(matches!(refused, Err(DeliverError::Busy(_))), "{refused:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let record = farrier.record();
        let store = record.memory().expect("memory");
        if store.unwritten.is_empty() && store.memories.len() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not written: {} waiting, {} stored",
            store.unwritten.len(),
            store.memories.len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(farrier.status().turns, 0, "paused: no turn wrote them");
    warden.shutdown();
}

/// Design 000's "notify the character" through the Rust host handle: an NPC that locks out or is
/// halted gives a world-facing notice (`drain_notices`), and one that is resumed gives the opposite,
/// in order. Before: nothing but the refusal of the next delivery.
#[test]
fn an_npc_that_locks_out_or_is_halted_gives_a_notice_and_one_that_is_back_another() {
    let mut config = WardenConfig::default();
    config.safety.breakers.max_consecutive_errors = std::num::NonZeroU32::MIN;
    let specs = [
        AgentSpec::assistant("smith", echo(Duration::ZERO)),
        AgentSpec::assistant(
            "guard",
            Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("model down"))),
        ),
    ];
    let warden =
        Warden::start(config, Arc::new(MemoryJournal::new()), specs).expect("warden starts");
    let notices = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < n {
            assert!(Instant::now() < deadline, "only {got:?} of {n} notices");
            warden.drain_notices(&mut got, 64);
            std::thread::sleep(Duration::from_millis(1));
        }
        got.into_iter()
            .map(|n| (n.agent.to_string(), n.presence, n.text))
            .collect::<Vec<_>>()
    };
    // The guard's model fails: one error locks it out.
    warden
        .try_deliver("guard", whisper("halt, who goes there?"))
        .unwrap();
    assert_eq!(
        notices(1),
        [(
            "guard".to_owned(),
            Presence::Silent,
            "guard falls silent.".to_owned()
        )]
    );
    warden.halt_all("shard draining");
    // The guard is locked out already: only the smith falls silent.
    assert_eq!(
        notices(1),
        [(
            "smith".to_owned(),
            Presence::Silent,
            "smith falls silent.".to_owned()
        )]
    );
    // A resume is sent to both; the locked-out guard stays silent (only an unlock lifts it).
    assert_eq!(warden.resume_all("ops"), 2);
    assert_eq!(
        notices(1),
        [(
            "smith".to_owned(),
            Presence::Back,
            "smith stirs again.".to_owned()
        )]
    );
    let mut more = Vec::new();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(warden.drain_notices(&mut more, 64), 0, "{more:?}");
    warden.shutdown();
}
