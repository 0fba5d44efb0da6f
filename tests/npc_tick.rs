//! The NPC tick loop end to end, on paused tokio time (a game day runs in milliseconds): the
//! collision guard, the sleep schedule in game time, the no-player rule, a TRIGGER waking a sleeping
//! NPC, halts and lockouts staying absolute, and one timer for a thousand NPCs.
mod common;
use common::*;
use std::time::Duration;
use warden::{
    protocols::{
        npc::{NpcConfig, NpcMode, Speaker, SpeakerKind, WorldEvent, WorldEventKind},
        TickStatus,
    },
    AgentHandle, AgentSpec, AgentState, EventKind, MemoryJournal, ScriptStep, Supervisor,
    WardenConfig,
};

/// `[npc]` with ticks on at `rate` seconds.
fn ticking(rate: f64) -> NpcConfig {
    let mut npc = NpcConfig::default();
    npc.tick.enabled = true;
    npc.tick.rate = rate;
    npc
}

fn spawn_npc(team: &Supervisor, key: &str, npc: NpcConfig) -> AgentHandle {
    team.spawn(AgentSpec::assistant(key, chatty()).with_npc(npc))
        .unwrap_or_else(|e| panic!("spawn {key}: {e}"))
}

fn tick_status(agent: &AgentHandle) -> TickStatus {
    agent
        .status()
        .npc
        .and_then(|npc| npc.tick)
        .expect("a ticking NPC shows its ticks")
}

/// Sleeps `secs` of paused tokio time (the runtime advances the clock timer by timer, and every
/// ready actor runs in between).
async fn pass(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

/// The game times (minutes since midnight) of the ticks `agent` took, read from the tick lines in
/// its history.
fn tick_times(agent: &AgentHandle) -> Vec<u32> {
    agent
        .record()
        .history
        .iter()
        .filter_map(|m| {
            let text = m.content.as_deref()?;
            let time = text.strip_prefix("[tick] game time ")?.get(..5)?;
            let (h, m) = time.split_once(':')?;
            Some(h.parse::<u32>().ok()? * 60 + m.parse::<u32>().ok()?)
        })
        .collect()
}

fn mode_changes(journal: &MemoryJournal, agent: &str) -> Vec<(NpcMode, NpcMode)> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::NpcModeChanged { from, to, .. } => Some((from, to)),
            _ => None,
        })
        .collect()
}

fn whisper(text: &str, room: &str) -> WorldEvent {
    WorldEvent {
        speaker: Speaker {
            id: "p1".into(),
            kind: SpeakerKind::Player,
        },
        kind: WorldEventKind::Whisper,
        room: Some(room.into()),
        text: text.into(),
        mentions: Some(Vec::new()),
        oob: Default::default(),
    }
}

#[actix_rt::test]
async fn ticks_are_opt_in() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let npc = team.assistant("innkeeper", chatty());
    pass(600.0).await;
    assert_eq!(
        npc.status().turns,
        0,
        "an agent without npc.tick.enabled never ticks"
    );
    assert_eq!(npc.status().npc, None);
    assert_eq!(team.tick_report().agents, 0);
}

#[actix_rt::test]
async fn a_tick_due_while_a_turn_runs_is_skipped_and_counted_never_queued_twice() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    // The first model call takes 32 s: the turn of the first tick (queued at 5 s) runs to 37 s.
    let model = model([ScriptStep::reply("a long thought").delayed(Duration::from_secs(32))]);
    let model = std::sync::Arc::new(
        std::sync::Arc::try_unwrap(model)
            .unwrap_or_else(|_| unreachable!())
            .with_fallback(|_| ScriptStep::reply("hm")),
    );
    let npc = team
        .spawn(AgentSpec::assistant("smith", model).with_npc(ticking(5.0)))
        .unwrap();
    pass(6.0).await;
    assert_eq!(npc.state(), AgentState::Executing);
    let mut most_queued = 0;
    // Due at 10, 15, …, 35 s: six ticks while the turn runs.
    for _ in 0..30 {
        pass(1.0).await;
        most_queued = most_queued.max(npc.status().queued.ordinary);
    }
    assert_eq!(npc.state(), AgentState::Executing, "still in the long turn");
    let status = tick_status(&npc);
    assert_eq!((status.ticks, status.skipped), (1, 6), "{status:?}");
    assert_eq!(
        most_queued, 0,
        "a tick due during the turn is not queued behind it"
    );
    // The turn ends at 37 s; the next tick comes at 40 s, on the schedule, not as a backlog.
    pass(4.0).await;
    let status = tick_status(&npc);
    assert_eq!((status.ticks, status.skipped), (2, 6), "{status:?}");
    until("the second tick's turn", || npc.status().turns == 2).await;
    assert!(!tick_status(&npc).queued);
    // Ticks are not journaled one by one: the journal has no mode change for an awake NPC.
    assert!(mode_changes(&journal, "smith").is_empty());
    replay_matches(&journal, &npc);
}

#[actix_rt::test]
async fn the_sleep_schedule_runs_a_game_day_at_the_configured_rates() {
    tokio::time::pause();
    let mut config = WardenConfig::default();
    // A game hour is a real minute; the day starts at midnight.
    config.npc.clock.start_hour = 0.0;
    config.npc.clock.speed = 60.0;
    // ~240 turns on a growing history would use up the default token budget (nothing compacts
    // it yet): the schedule is what is measured here.
    config.safety.budget.tokens_per_agent = 0;
    let (team, journal) = team(config);
    let mut npc = ticking(5.0);
    npc.sleep.enabled = true; // 02:00 to 06:00, a tick a minute (real time)
    let watch = spawn_npc(&team, "watchman", npc);
    assert_eq!(tick_status(&watch).mode, NpcMode::Awake);

    pass(24.0 * 60.0).await; // 24 game hours
    let times = tick_times(&watch);
    let (asleep, awake): (Vec<u32>, Vec<u32>) =
        times.iter().partition(|&&t| (120..360).contains(&t));
    // Awake 20 game hours = 1,200 real seconds at one tick per 5 s; asleep 4 game hours = 240 s at
    // one tick per 60 s (a boundary costs at most one tick).
    assert!(
        (237..=240).contains(&awake.len()),
        "{} awake ticks: {:?} {:?} {:?}",
        awake.len(),
        watch.status(),
        awake,
        journal
            .events_of("watchman")
            .iter()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
    );
    assert!(
        (3..=4).contains(&asleep.len()),
        "{} asleep ticks: {asleep:?}",
        asleep.len()
    );
    assert_eq!(
        mode_changes(&journal, "watchman"),
        [
            (NpcMode::Awake, NpcMode::Asleep),
            (NpcMode::Asleep, NpcMode::Awake)
        ]
    );
    let status = tick_status(&watch);
    assert_eq!(status.ticks as usize, times.len());
    assert_eq!(status.skipped, 0);
    replay_matches(&journal, &watch);
}

#[actix_rt::test]
async fn the_host_sets_the_game_hour_and_an_npc_without_sleep_ticks_stays_silent() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default()); // real-time clock from 08:00
    let mut npc = ticking(5.0);
    npc.sleep.enabled = true;
    npc.sleep.tick_rate = 0.0;
    let watch = spawn_npc(&team, "watchman", npc);
    team.set_game_hour(3.0);
    assert!((team.game_hour() - 3.0).abs() < 1e-9);
    let status = tick_status(&watch);
    assert_eq!((status.mode, status.next_tick_ms), (NpcMode::Asleep, None));
    pass(3600.0).await;
    assert_eq!(watch.status().turns, 0, "asleep with no sleep ticks");
    team.set_game_hour(7.0);
    pass(32.0).await;
    assert_eq!(tick_status(&watch).mode, NpcMode::Awake);
    assert_eq!(tick_status(&watch).ticks, 6);
    assert_eq!(
        mode_changes(&journal, "watchman"),
        [
            (NpcMode::Awake, NpcMode::Asleep),
            (NpcMode::Asleep, NpcMode::Awake)
        ]
    );
}

#[actix_rt::test]
async fn an_npc_idles_while_no_player_is_in_its_room() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let mut npc = ticking(5.0);
    npc.tick.room = Some("forge".into());
    let smith = spawn_npc(&team, "smith", npc);
    // The second NPC has no configured room: it is where it last heard something.
    let bard = spawn_npc(&team, "bard", ticking(5.0));
    bard.perceive(WorldEvent {
        kind: WorldEventKind::Say,
        ..whisper("lovely evening", "tavern")
    })
    .unwrap();
    assert_eq!(tick_status(&bard).room.as_deref(), Some("tavern"));

    team.set_presence("forge", 0);
    let before = tick_status(&smith).ticks;
    pass(60.0).await;
    let status = tick_status(&smith);
    assert_eq!(status.mode, NpcMode::Idle);
    assert_eq!(
        status.ticks, before,
        "no ticks while the forge is empty (idle_rate 0)"
    );
    assert!(
        tick_status(&bard).ticks >= 11,
        "the bard's room was not reported empty: {:?}",
        bard.status()
    );

    team.set_presence("forge", 1);
    team.set_presence("tavern", 0);
    pass(61.0).await; // ticks at 5 s, 10 s, … 60 s after the player came
    assert_eq!(tick_status(&smith).ticks, before + 12);
    assert_eq!(tick_status(&bard).mode, NpcMode::Idle);
    assert_eq!(
        mode_changes(&journal, "smith"),
        [
            (NpcMode::Awake, NpcMode::Idle),
            (NpcMode::Idle, NpcMode::Awake)
        ]
    );
}

#[actix_rt::test]
async fn an_idle_rate_ticks_slower_while_the_room_is_empty() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let mut npc = ticking(5.0);
    npc.tick.room = Some("forge".into());
    npc.tick.idle_rate = 30.0;
    let smith = spawn_npc(&team, "smith", npc);
    team.set_presence("forge", 0);
    pass(121.0).await;
    assert_eq!(tick_status(&smith).ticks, 4);
}

#[actix_rt::test]
async fn a_trigger_wakes_a_sleeping_npc_for_a_while() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let mut npc = ticking(5.0);
    npc.sleep.enabled = true;
    npc.sleep.tick_rate = 0.0;
    npc.tick.wake_seconds = 30.0;
    let inn = spawn_npc(&team, "innkeeper", npc);
    team.set_game_hour(3.0);
    pass(600.0).await;
    assert_eq!(inn.status().turns, 0);

    let seen = inn
        .perceive(whisper("wake up, a room please", "tavern"))
        .unwrap();
    assert!(seen.queued.is_some());
    assert_eq!(tick_status(&inn).mode, NpcMode::Awake);
    // Woken for 30 s: the whisper's turn and a tick every 5 s, then asleep again.
    pass(31.0).await;
    assert_eq!(tick_status(&inn).mode, NpcMode::Asleep);
    let ticks = tick_status(&inn).ticks;
    assert!((5..=6).contains(&ticks), "{ticks} ticks while woken");
    pass(600.0).await;
    assert_eq!(tick_status(&inn).ticks, ticks, "asleep again: no ticks");
    assert_eq!(
        mode_changes(&journal, "innkeeper"),
        [
            (NpcMode::Awake, NpcMode::Asleep),
            (NpcMode::Asleep, NpcMode::Awake),
            (NpcMode::Awake, NpcMode::Asleep)
        ]
    );
}

#[actix_rt::test]
async fn a_halted_or_paused_npc_gets_no_ticks_until_resumed() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let npc = spawn_npc(&team, "smith", ticking(5.0));
    pass(11.0).await;
    assert_eq!(npc.status().turns, 2);
    npc.halt(op()).await;
    pass(600.0).await;
    assert_eq!(npc.status().turns, 2, "a halted NPC gets no tick");
    assert_eq!(tick_status(&npc).ticks, 2);
    npc.resume("ops").await.unwrap();
    pass(10.0).await;
    assert_eq!(npc.status().turns, 4, "resumed: ticking again");
    npc.pause("ops").await.unwrap();
    pass(600.0).await;
    assert_eq!(npc.status().turns, 4, "a paused NPC gets no tick");
    assert_eq!(npc.status().queued.ordinary, 0);
    replay_matches(&journal, &npc);
}

#[actix_rt::test]
async fn a_locked_out_npc_gets_no_ticks() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    // Every tick's turn fails: five failures lock it out, and then no tick reaches it.
    let npc = team
        .spawn(AgentSpec::assistant("golem", failing()).with_npc(ticking(5.0)))
        .unwrap();
    until("locked out by failing ticks", || {
        npc.state() == AgentState::SafetyLockout
    })
    .await;
    let turns = npc.status().turns;
    let ticks = tick_status(&npc).ticks;
    pass(3600.0).await;
    assert_eq!(npc.status().turns, turns);
    assert_eq!(
        tick_status(&npc).ticks,
        ticks,
        "no tick is queued for a locked-out NPC"
    );
    assert_eq!(npc.status().queued.ordinary, 0);
}

#[actix_rt::test]
async fn a_thousand_npcs_share_one_timer_and_all_get_their_ticks() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let npcs: Vec<_> = (0..1000)
        .map(|i| spawn_npc(&team, &format!("npc{i}"), ticking(5.0)))
        .collect();
    let report = team.tick_report();
    assert_eq!((report.agents, report.timers), (1000, 1));
    pass(11.0).await;
    for npc in &npcs {
        assert_eq!(tick_status(npc).ticks, 2, "{}", npc.key());
    }
    until("every tick's turn", || {
        npcs.iter().all(|npc| npc.status().turns == 2)
    })
    .await;
    // Stopping one NPC's ticks leaves the rest on the one timer.
    let mut off = NpcConfig::default();
    off.tick.enabled = false;
    team.set_ticks("npc0", off).unwrap();
    assert_eq!(
        team.tick_report(),
        warden::npc::TickReport {
            agents: 999,
            timers: 1
        }
    );
    pass(5.0).await;
    assert_eq!(npcs[0].status().turns, 2);
    assert_eq!(tick_status(&npcs[1]).ticks, 3);
}

#[actix_rt::test]
async fn a_tick_comes_after_the_user_events_queued_before_it_and_shows_a_tick_line() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let npc = spawn_npc(&team, "smith", ticking(5.0));
    pass(4.9).await;
    npc.try_send_event(warden::UserEvent::new("first")).unwrap();
    npc.try_send_event(warden::UserEvent::new("second"))
        .unwrap();
    pass(0.2).await;
    until("three turns", || npc.status().turns == 3).await;
    let users: Vec<String> = npc
        .record()
        .history
        .iter()
        .filter(|m| m.role == warden::protocols::ChatRole::User)
        .filter_map(|m| m.content.clone())
        .collect();
    assert_eq!(users.len(), 3, "{users:?}");
    assert!(
        users[0].ends_with("first") && users[1].ends_with("second"),
        "{users:?}"
    );
    assert_eq!(
        users[2],
        "[tick] game time 08:00; nothing new was addressed to you since your last turn."
    );
}

#[actix_rt::test]
async fn each_tick_is_a_task_of_its_own_so_per_task_limits_never_add_up() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let npc = spawn_npc(&team, "smith", ticking(5.0));
    // 60 ticks: more than `safety.loop.max_iterations_per_task` (50) iterations in all.
    pass(301.0).await;
    assert_eq!(npc.status().turns, 60);
    let limits = count_events(&journal, "smith", |e| {
        matches!(
            e,
            EventKind::LimitDecided { .. } | EventKind::LimitDenied { .. }
        )
    });
    assert_eq!(limits, 0, "a per-task limit was reached across ticks");
    assert!(outcomes(&journal, "smith")
        .iter()
        .all(|o| o.limit_kind.is_none()));
}
