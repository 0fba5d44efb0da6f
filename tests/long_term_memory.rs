//! Long-term memory (issue 33, docs/memory.md): observations of what an NPC perceives, facts and
//! claims by trust, recall into the model's request, pre-compaction extraction, forgetting, the
//! bounds — on the scripted provider and paused time, with replay = live and restarts.
mod common;
use common::*;
use parking_lot::Mutex;
use std::{sync::Arc, time::Duration};
use warden::{
    memory::{is_extraction_request, is_summary_request, MemoryKind},
    protocols::{
        npc::{NpcConfig, Speaker, SpeakerKind, WorldEvent, WorldEventKind},
        ChatRole, UserEvent,
    },
    AgentHandle, AgentRecord, AgentSpec, EventKind, LlmRequest, MemoryJournal, ScriptStep,
    ScriptedProvider, Submit, Supervisor, WardenConfig,
};

/// A game hour of real time at clock speed 60.
const GAME_HOUR: Duration = Duration::from_secs(60);

fn config() -> WardenConfig {
    let mut config = WardenConfig::default();
    config.memory.long_term = true;
    // A game hour a real minute (the team's clock: an agent's own `[npc]` cannot change it).
    config.npc.clock.speed = 60.0;
    config.safety.budget.tokens_per_agent = 0;
    config
}

fn npc_config() -> NpcConfig {
    NpcConfig::default()
}

fn world(kind: WorldEventKind, who: SpeakerKind, id: &str, text: &str) -> WorldEvent {
    WorldEvent {
        speaker: Speaker {
            id: id.into(),
            kind: who,
        },
        kind,
        room: Some("forge".into()),
        text: text.into(),
        mentions: Some(Vec::new()),
        oob: Default::default(),
    }
}

fn whisper(id: &str, text: &str) -> WorldEvent {
    world(WorldEventKind::Whisper, SpeakerKind::Player, id, text)
}

/// The requests of turns (not summaries, extractions or reflections).
fn turn_requests(seen: &Mutex<Vec<LlmRequest>>) -> Vec<LlmRequest> {
    seen.lock()
        .iter()
        .filter(|r| !is_summary_request(r) && !is_extraction_request(r))
        .cloned()
        .collect()
}

fn system_text(r: &LlmRequest) -> String {
    r.messages
        .first()
        .filter(|m| m.role == ChatRole::System)
        .and_then(|m| m.content.clone())
        .unwrap_or_default()
}

/// The model of these tests: extraction lists the name in a transcript that has it, summaries
/// are short, a request whose last line asks it to note something calls `remember`, a tool
/// result is acknowledged, anything else gets "Aye.".
fn brain() -> ScriptedProvider {
    ScriptedProvider::new([]).with_fallback(|r| {
        let all: String = r
            .messages
            .iter()
            .filter_map(|m| m.content.clone())
            .collect();
        if is_extraction_request(r) {
            return ScriptStep::reply(if all.contains("Aldric") {
                r#"Facts: [{"subject": "p1", "predicate": "name", "object": "Aldric", "said_by": "p1", "importance": 8}]"#
            } else {
                "[]"
            });
        }
        if is_summary_request(r) {
            return ScriptStep::reply("The smith talked with travellers.");
        }
        let last = r.messages.last().expect("a message");
        if last.role == ChatRole::Tool {
            return ScriptStep::reply("Noted.");
        }
        let text = last.content.clone().unwrap_or_default();
        for (needle, object) in [("vampire", "a vampire"), ("human", "human")] {
            if text.contains(&format!("the mayor is {needle}")) || text.contains(&format!("the mayor is a {needle}")) {
                return ScriptStep::call(
                    "remember",
                    serde_json::json!({"subject": "mayor", "predicate": "is", "object": object}),
                );
            }
        }
        ScriptStep::reply("Aye.")
    })
}

fn smith(
    team: &Supervisor,
    provider: Arc<dyn warden::Provider>,
    record: Option<AgentRecord>,
) -> AgentHandle {
    let mut spec = AgentSpec::assistant("smith", provider)
        .with_system_prompt("You are the blacksmith.")
        .with_npc(npc_config());
    if let Some(record) = record {
        spec = spec.restored_from(record);
    }
    team.spawn(spec).expect("spawn smith")
}

async fn turns(agent: &AgentHandle, n: u64) {
    until(&format!("{} finished {n} turns", agent.key()), || {
        agent.status().turns >= n
    })
    .await;
}

fn observations(record: &AgentRecord) -> usize {
    observation_times(record).len()
}

/// The memory times of the stored observations, in id order.
fn observation_times(record: &AgentRecord) -> Vec<f64> {
    record.memory().map_or(Vec::new(), |s| {
        s.memories
            .values()
            .filter(|m| matches!(m.kind, MemoryKind::Observation { .. }))
            .map(|m| m.at)
            .collect()
    })
}

#[actix_rt::test]
async fn the_blacksmith_remembers_a_name_on_day_three_after_compaction_and_a_restart() {
    tokio::time::pause();
    let mut config = config();
    config.execution.max_context_tokens = 1200;
    let (team, journal) = team(config.clone());
    let (provider, seen) = Capture::new(brain());
    let npc = smith(&team, provider, None);

    // Day 1: p1 says who they are.
    npc.perceive(whisper(
        "p1",
        "Good morning, smith. My name is Aldric, I come from the coast.",
    ))
    .unwrap();
    turns(&npc, 1).await;
    // The rest of the day: other customers, enough talk to compact the history away.
    for i in 0..24u64 {
        tokio::time::advance(GAME_HOUR / 2).await;
        npc.perceive(whisper(
            &format!("c{i}"),
            &format!("Customer {i} here. I need {i} horseshoes and a long story about the weather, the roads and the price of iron in the capital, which keeps rising."),
        ))
        .unwrap();
        turns(&npc, 2 + i).await;
    }
    let compacted = journal
        .events_of("smith")
        .iter()
        .filter(|e| matches!(e.kind, EventKind::HistoryCompacted { .. }))
        .count();
    assert!(compacted > 0, "the history was compacted");
    assert!(
        !npc.record().history.iter().any(|m| m
            .content
            .as_deref()
            .unwrap_or_default()
            .contains("Aldric")),
        "the name left the history"
    );
    // Every model call counted against the budgets, the extractions and summaries included.
    let usage = journal
        .events_of("smith")
        .iter()
        .filter(|e| matches!(e.kind, EventKind::UsageRecorded { .. }))
        .count();
    let extractions = seen
        .lock()
        .iter()
        .filter(|r| is_extraction_request(r))
        .count();
    assert!(extractions > 0);
    assert_eq!(
        usage,
        seen.lock().len(),
        "one usage_recorded per model call"
    );
    // The extraction stored the name as p1's: the profile has it.
    assert_eq!(
        npc.profile("p1").and_then(|p| p.name).as_deref(),
        Some("Aldric")
    );

    // Day 3.
    tokio::time::advance(GAME_HOUR * 36).await;
    npc.perceive(whisper("p1", "Do you remember me?")).unwrap();
    turns(&npc, 26).await;
    let last = turn_requests(&seen).pop().expect("a turn request");
    let system = system_text(&last);
    assert!(
        system.starts_with("You are the blacksmith.\n\nWhat you remember"),
        "{system}"
    );
    assert!(
        system.contains("about p1 (player); name \"Aldric\""),
        "{system}"
    );
    assert!(system.contains("My name is Aldric"), "{system}");
    assert!(
        system.contains("day 3") || system.contains("day 1"),
        "{system}"
    );
    replay_matches(&journal, &npc);

    // A restart (the record from the journal): it still remembers.
    let record = AgentRecord::replay("smith".into(), &journal.events());
    let (team2, journal2) = common::team(config);
    let (provider2, seen2) = Capture::new(brain());
    let again = smith(&team2, provider2, Some(record));
    again.perceive(whisper("p1", "Still remember me?")).unwrap();
    until("a turn after the restart", || {
        !turn_requests(&seen2).is_empty()
    })
    .await;
    let system = system_text(&turn_requests(&seen2)[0]);
    assert!(system.contains("name \"Aldric\""), "{system}");
    let _ = journal2;
}

#[actix_rt::test]
async fn a_rumour_is_recalled_as_a_claim_and_a_trusted_whisper_contradicting_it_wins() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let (provider, seen) = Capture::new(brain());
    let npc = smith(&team, provider, None);

    // p3 says it aloud in the room (a say: trust 0.4, which never starts a turn), and the host
    // relays the line to the smith as p3's: the smith writes it down — as p3's claim.
    let relayed = UserEvent {
        source: "say".into(),
        sender: Some("p3".into()),
        content: "psst, the mayor is a vampire".into(),
    };
    npc.submit(relayed, Submit::default()).await.unwrap();
    turns(&npc, 1).await;
    let store = npc.record().memory().cloned().expect("memories");
    let claim = store
        .memories
        .values()
        .find(|m| matches!(m.kind, MemoryKind::Fact { .. }))
        .expect("a fact memory");
    assert!(
        matches!(&claim.kind, MemoryKind::Fact { claim: true, asserted_by, .. } if asserted_by == &["p3"])
    );

    npc.perceive(whisper("p1", "anything new about the mayor?"))
        .unwrap();
    turns(&npc, 2).await;
    let system = system_text(&turn_requests(&seen).pop().unwrap());
    assert!(
        system.contains("p3 claims \"mayor is a vampire\" (trust 0.40; unconfirmed, not a fact)"),
        "{system}"
    );

    // The guard captain, trusted, whispers the truth: it wins.
    npc.perceive(world(
        WorldEventKind::Whisper,
        SpeakerKind::Npc,
        "captain",
        "the mayor is human, I checked",
    ))
    .unwrap();
    turns(&npc, 3).await;
    npc.perceive(whisper("p1", "so is the mayor a vampire?"))
        .unwrap();
    turns(&npc, 4).await;
    let system = system_text(&turn_requests(&seen).pop().unwrap());
    assert!(
        system.contains("fact: \"mayor is human\" (from captain, trust 0.90"),
        "{system}"
    );
    assert!(
        system.contains("p3 claimed \"mayor is a vampire\" (trust 0.40) — contradicted by \"mayor is human\", not true"),
        "{system}"
    );
    // p3's word counts for less from now on.
    let p3 = npc.profile("p3").unwrap();
    assert!(p3.credibility < 0.5 && p3.contradicted == 1, "{p3:?}");
    replay_matches(&journal, &npc);
}

#[actix_rt::test]
async fn forget_and_the_operators_delete_hold_across_a_restart() {
    tokio::time::pause();
    let (team, journal) = team(config());
    // The model forgets memory #0 when asked to.
    let provider = ScriptedProvider::new([]).with_fallback(|r| {
        let last = r.messages.last().unwrap();
        if last.role == ChatRole::Tool {
            ScriptStep::reply("Forgotten.")
        } else if last
            .content
            .as_deref()
            .unwrap_or_default()
            .contains("forget what I said")
        {
            ScriptStep::call("forget", serde_json::json!({"id": 0}))
        } else {
            ScriptStep::reply("Aye.")
        }
    });
    let npc = smith(&team, Arc::new(provider), None);
    npc.perceive(whisper("p1", "my secret: I hid gold under the bridge"))
        .unwrap();
    turns(&npc, 1).await;
    npc.perceive(whisper("p2", "I am p2 and I like swords"))
        .unwrap();
    turns(&npc, 2).await;
    npc.perceive(whisper("p1", "please forget what I said"))
        .unwrap();
    turns(&npc, 3).await;
    let texts = |a: &AgentHandle| -> Vec<String> {
        a.memories(None, None, 100)
            .into_iter()
            .map(|m| m.text)
            .collect()
    };
    assert!(
        !texts(&npc).iter().any(|t| t.contains("gold")),
        "{:?}",
        texts(&npc)
    );
    // The operator: everything about p2 (the right to be forgotten).
    let gone = npc.forget_durable(&[], Some("p2"), "op").await.unwrap();
    assert_eq!(gone.len(), 1);
    assert!(npc.profile("p2").is_none());
    assert!(npc.memories(Some("swords"), None, 10).is_empty());
    assert!(npc.recall("p2", None).is_none_or(|r| !r.contains("swords")));
    let forgotten: Vec<(Vec<u64>, Option<String>, String)> = journal
        .events_of("smith")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::MemoryForgotten { ids, about, by } => Some((ids, about, by)),
            _ => None,
        })
        .collect();
    assert_eq!(forgotten.len(), 2);
    assert_eq!(forgotten[0], (vec![0], None, "model".to_owned()));
    assert_eq!(forgotten[1].1.as_deref(), Some("p2"));
    assert_eq!(forgotten[1].2, "op");
    replay_matches(&journal, &npc);
    // A restart: still forgotten; what is left is still found.
    let record = AgentRecord::replay("smith".into(), &journal.events());
    let (team2, _) = common::team(config());
    let again = smith(&team2, chatty(), Some(record));
    let left = texts(&again);
    assert!(
        !left
            .iter()
            .any(|t| t.contains("gold") || t.contains("swords")),
        "{left:?}"
    );
    assert_eq!(again.memories(Some("forget"), Some("p1"), 10).len(), 1);
}

#[actix_rt::test]
async fn a_chatter_flood_stays_within_the_rate_caps_and_the_bounds() {
    tokio::time::pause();
    let mut config = config();
    config.memory.max_memories = 40;
    config.memory.speaker_writes_per_minute = 3;
    config.memory.writes_per_minute = 10;
    let team_config = config.clone();
    let (team, journal) = team(config);
    let mut npc_config = npc_config();
    npc_config
        .channels
        .insert("ooc".into(), warden::protocols::npc::ChannelMode::Context);
    let npc = team
        .spawn(AgentSpec::assistant("smith", chatty()).with_npc(npc_config.clone()))
        .unwrap();
    // The out-of-character channel is context for the smith: every line of it is an observation.
    let chatter = |i: u64| {
        let mut e = world(
            WorldEventKind::Channel,
            SpeakerKind::Player,
            &format!("p{}", i % 7),
            &format!("chatter line {i} about nothing in particular"),
        );
        e.oob.channel = Some("ooc".into());
        e
    };
    // One instant, 500 lines from 7 speakers: 10 stored (the agent's cap), at most 3 a speaker.
    for i in 0..500 {
        let seen = npc.perceive(chatter(i)).unwrap();
        assert_eq!(
            seen.perception.verdict,
            warden::protocols::npc::Verdict::Context,
            "{seen:?}"
        );
    }
    // The actor has not run: no more than two minutes' admissions wait in the record (2 × 10);
    // the lines past that were heard, not kept.
    assert_eq!(unwritten(&npc.record()), 20);
    let record = written(&npc);
    assert_eq!(observations(&record), 10);
    let store = record.memory().unwrap();
    assert!(
        store.profiles.values().all(|p| p.heard <= 3),
        "{:?}",
        store.profiles
    );
    // A restart in the same minute does not hand the caps out again: the windows start from
    // the record's memories of the last minute.
    {
        let record = AgentRecord::replay("smith".into(), &journal.events());
        let (team2, _journal2) = common::team(team_config.clone());
        let again = team2
            .spawn(
                AgentSpec::assistant("smith", chatty())
                    .with_npc(npc_config.clone())
                    .restored_from(record),
            )
            .unwrap();
        for i in 500..550 {
            again.perceive(chatter(i)).unwrap();
        }
        assert_eq!(
            observations(&written(&again)),
            10,
            "still 10 after a restart"
        );
    }
    // Three game days of it, a line every 3 real seconds: never more than 40 memories, and none
    // younger than a game day is evicted.
    for i in 0..3 * 24 * 20 {
        tokio::time::advance(Duration::from_secs(3)).await;
        npc.perceive(chatter(1000 + i)).unwrap();
        let record = written(&npc);
        let store = record.memory().unwrap();
        assert!(store.memories.len() <= 40, "{}", store.memories.len());
        assert!(store.bytes <= 256 * 1024);
    }
    let evicted: Vec<u64> = journal
        .events_of("smith")
        .into_iter()
        .flat_map(|e| match e.kind {
            EventKind::MemoryStored { evicted, .. } => evicted,
            _ => Vec::new(),
        })
        .collect();
    assert!(!evicted.is_empty(), "old memories were evicted");
    replay_matches(&journal, &npc);
    let _: &MemoryJournal = &journal;
}

/// A team whose NPCs tick rarely while awake and every game hour while asleep (2:00 to 6:00),
/// its clock starting at `hour` (a game hour a real minute).
fn sleepy(hour: f64) -> WardenConfig {
    let mut config = config();
    config.npc.clock.start_hour = hour;
    config.npc.tick.enabled = true;
    config.npc.tick.rate = 3600.0;
    config.npc.tick.wake_seconds = 1.0;
    config.npc.sleep.enabled = true;
    config.npc.sleep.tick_rate = 60.0;
    config
}

/// The model at night: a dream gets a reflection (after `delay`), anything else "Aye.".
fn dreamer(delay: Duration) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(move |r| {
        if warden::memory::sleep::is_dream_request(r) {
            ScriptStep::reply("Today I met Aldric, who greeted me twice.").delayed(delay)
        } else {
            ScriptStep::reply("Aye.")
        }
    }))
}

fn phases(journal: &MemoryJournal) -> Vec<warden::protocols::memory::SleepPhase> {
    journal
        .events_of("smith")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::MemoryConsolidated { phase, .. } => Some(phase),
            _ => None,
        })
        .collect()
}

fn slept_away(journal: &MemoryJournal) -> Vec<Vec<u64>> {
    journal
        .events_of("smith")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::MemoryForgotten { ids, by, .. } if by == "sleep" => Some(ids),
            _ => None,
        })
        .collect()
}

#[actix_rt::test]
async fn sleep_compacts_then_dreams_once_a_night_and_a_crash_resumes_the_phase_it_reached() {
    use warden::protocols::memory::SleepPhase::{Done, Dreaming};
    tokio::time::pause();
    let (team, journal) = team(sleepy(1.5));
    let npc = team
        .spawn(AgentSpec::assistant("smith", dreamer(Duration::ZERO)))
        .unwrap();
    // 1:30: p1 greets the smith twice, word for word.
    for n in 1..=2 {
        npc.perceive(whisper("p1", "Hello smith, I am Aldric."))
            .unwrap();
        turns(&npc, n).await;
    }
    assert_eq!(observations(&npc.record()), 2);
    // The night: every asleep tick; the work is done once.
    tokio::time::advance(GAME_HOUR * 3).await;
    until("the night's work", || phases(&journal).len() == 2).await;
    tokio::time::advance(GAME_HOUR * 2).await;
    settle(100).await;
    assert_eq!(phases(&journal), vec![Dreaming, Done]);
    assert_eq!(
        slept_away(&journal),
        vec![vec![0]],
        "the older greeting merged away"
    );
    let record = npc.record();
    assert_eq!(observations(&record), 1);
    assert!(record
        .memory()
        .unwrap()
        .memories
        .values()
        .any(|m| { matches!(m.kind, MemoryKind::Reflection) && m.text.contains("Aldric") }));
    replay_matches(&journal, &npc);

    // A crash right after compacting: the restart dreams, and does not compact again.
    let cut: Vec<_> = {
        let events = journal.events();
        let at = events
            .iter()
            .position(|e| {
                matches!(
                    e.kind,
                    EventKind::MemoryConsolidated {
                        phase: Dreaming,
                        ..
                    }
                )
            })
            .unwrap();
        events[..=at].to_vec()
    };
    let record = AgentRecord::replay("smith".into(), &cut);
    assert_eq!(
        record.memory().unwrap().consolidation.map(|c| c.phase),
        Some(Dreaming)
    );
    let (team2, journal2) = common::team(sleepy(2.5));
    // A halt during the dream: nothing is done; after a resume the next asleep tick dreams.
    let again = team2
        .spawn(
            AgentSpec::assistant("smith", dreamer(Duration::from_secs(30))).restored_from(record),
        )
        .unwrap();
    until("dreaming", || {
        again.status().state == warden::AgentState::Executing
    })
    .await;
    again.halt(op()).await;
    settle(50).await;
    assert!(
        phases(&journal2).is_empty(),
        "a halted dream finishes nothing"
    );
    again.resume("op").await.unwrap();
    tokio::time::advance(GAME_HOUR * 2).await;
    until("the dream after the restart", || {
        phases(&journal2) == vec![Done]
    })
    .await;
    assert!(
        slept_away(&journal2).is_empty(),
        "compacting is not done twice"
    );
    let events: Vec<_> = cut
        .iter()
        .chain(journal2.events().iter())
        .cloned()
        .collect();
    assert_eq!(AgentRecord::replay("smith".into(), &events), again.record());
}

/// docs/memory.md: every ```toml example is a team file (or a part of one) that parses.
#[test]
fn the_examples_in_docs_memory_md_parse() {
    let doc = include_str!("../docs/memory.md");
    let (mut examples, mut long_term) = (0, 0);
    for block in doc.split("```toml\n").skip(1) {
        let text = block.split("```").next().unwrap();
        if text.contains("[[agents]]") {
            let team =
                warden::team::TeamFile::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            if team.config.memory.long_term {
                assert_eq!(team.config.memory.max_bytes, 256 * 1024);
                assert_eq!(team.config.npc.clock.speed, 60.0);
                let own = team.agents[0].memory.expect("smith's own memory keys");
                assert_eq!(own.apply(&team.config.memory).recall_k, 6);
                long_term += 1;
            }
        } else {
            warden::team::TeamFile::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
        examples += 1;
    }
    assert!(examples >= 2 && long_term == 1, "{examples} {long_term}");
}

/// Design 001's `scheduled_wake_time` and `activity_since_wake`: asleep at 2:30, the smith's tick
/// turn schedules its wake for 4:00 (`wake_at`); the tick loop keeps it asleep until then and wakes
/// it at 4:00, inside its sleep hours (2:00 to 6:00). Tool calls since the last wake are counted.
#[actix_rt::test]
async fn an_npc_wakes_when_it_scheduled_and_counts_its_activity_since() {
    tokio::time::pause();
    let (team, journal) = team(sleepy(2.5));
    let provider = Arc::new(ScriptedProvider::new([]).with_fallback(|r| {
        if warden::memory::sleep::is_dream_request(r) {
            return ScriptStep::reply("A quiet night.");
        }
        let last = r.messages.last().unwrap();
        if last.role == ChatRole::Tool {
            ScriptStep::reply("Back to sleep.")
        } else if last
            .content
            .as_deref()
            .unwrap_or_default()
            .starts_with("[tick]")
        {
            ScriptStep::call("wake_at", serde_json::json!({"hour": 4}))
        } else {
            ScriptStep::reply("Aye.")
        }
    }));
    let npc = team.spawn(AgentSpec::assistant("smith", provider)).unwrap();
    // Something to remember, so the store exists (the wake is kept there).
    npc.perceive(whisper("p1", "good night, smith")).unwrap();
    turns(&npc, 1).await;
    let mode = |npc: &AgentHandle| npc.status().npc.and_then(|n| n.tick).map(|t| t.mode);
    use warden::protocols::npc::NpcMode::{Asleep, Awake};
    until("asleep", || mode(&npc) == Some(Asleep)).await;
    until("the wake scheduled", || {
        npc.record()
            .memory()
            .is_some_and(|s| s.scheduled_wake.is_some())
    })
    .await;
    assert_eq!(
        npc.record().memory().unwrap().activity_since_wake,
        1,
        "the wake_at call"
    );
    // Still asleep at 3:55; awake at 4:00.
    let hour = team.game_hour();
    assert!(hour < 3.9, "{hour}");
    tokio::time::advance(GAME_HOUR.mul_f64(3.92 - hour)).await;
    settle(50).await;
    assert_eq!(mode(&npc), Some(Asleep), "at {}", team.game_hour());
    tokio::time::advance(GAME_HOUR / 6).await;
    until("awake at 4:00", || mode(&npc) == Some(Awake)).await;
    let woke = journal.events_of("smith").into_iter().any(|e| matches!(
        &e.kind,
        EventKind::NpcModeChanged { to: Awake, cause, .. } if cause.starts_with("its scheduled wake")
    ));
    assert!(woke, "journaled as the scheduled wake");
    assert_eq!(npc.record().memory().unwrap().activity_since_wake, 0);
    replay_matches(&journal, &npc);
}

/// A provider whose embeddings know that blades are swords: `complete` is a scripted "Aye.", and
/// `embed` puts every text about swords or blades on one axis and everything else on another.
struct Semantic {
    inner: ScriptedProvider,
    /// `false`: no embedding model.
    on: bool,
    embeds: Arc<std::sync::atomic::AtomicUsize>,
    seen: Arc<Mutex<Vec<LlmRequest>>>,
}

impl warden::Provider for Semantic {
    fn name(&self) -> &str {
        "semantic"
    }

    fn complete(
        &self,
        request: LlmRequest,
    ) -> futures::future::BoxFuture<'static, Result<warden::LlmResponse, warden::ProviderError>>
    {
        self.seen.lock().push(request.clone());
        self.inner.complete(request)
    }

    fn embed(
        &self,
        texts: Vec<String>,
    ) -> Option<futures::future::BoxFuture<'static, Result<warden::Embedded, warden::ProviderError>>>
    {
        if !self.on {
            return None;
        }
        self.embeds
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let vectors = texts
            .iter()
            .map(|t| {
                let t = t.to_lowercase();
                if t.contains("sword") || t.contains("blade") {
                    vec![1.0, 0.0]
                } else {
                    vec![0.0, 1.0]
                }
            })
            .collect();
        Some(Box::pin(std::future::ready(Ok(warden::Embedded {
            vectors,
            usage: warden::protocols::Usage {
                prompt_tokens: 10,
                completion_tokens: 0,
                estimated: true,
            },
        }))))
    }
}

/// With an embedding model, recall ranks by cosine similarity: "who sells blades?" recalls the
/// old "the smith makes fine swords" that shares no word with it and that neither BM25 nor the
/// newest memories would bring; the embedding calls count against the budgets. Without one, the
/// same store and question do not recall it.
#[actix_rt::test]
async fn with_an_embedding_model_recall_finds_what_shares_no_word_with_the_question() {
    tokio::time::pause();
    for embeddings in [true, false] {
        let (team, journal) = team(config());
        let embeds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let provider = Arc::new(Semantic {
            inner: ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("Aye.")),
            on: embeddings,
            embeds: embeds.clone(),
            seen: seen.clone(),
        });
        let npc = smith(&team, provider, None);
        npc.perceive(whisper("p9", "the smith makes fine swords"))
            .unwrap();
        turns(&npc, 1).await;
        // 24 newer memories of other things, a minute apart (within the rate caps).
        for i in 0..24u64 {
            tokio::time::advance(Duration::from_secs(61)).await;
            npc.perceive(whisper(
                &format!("c{i}"),
                &format!("the weather on day {i} was grey"),
            ))
            .unwrap();
            turns(&npc, 2 + i).await;
        }
        npc.perceive(whisper("p1", "who sells blades?")).unwrap();
        turns(&npc, 26).await;
        let system = system_text(&turn_requests(&seen).pop().unwrap());
        assert_eq!(
            system.contains("the smith makes fine swords"),
            embeddings,
            "embeddings {embeddings}: {system}"
        );
        if embeddings {
            let calls = seen.lock().len();
            let usage = journal
                .events_of("smith")
                .iter()
                .filter(|e| matches!(e.kind, EventKind::UsageRecorded { .. }))
                .count();
            let embeds = embeds.load(std::sync::atomic::Ordering::SeqCst);
            assert!(embeds >= 26, "{embeds}");
            assert_eq!(usage, calls + embeds, "every embedding call counted");
        }
        replay_matches(&journal, &npc);
    }
}

/// Team files: `embedding_model` for the OpenAI-compatible kind, `embedding_dimensions` (the fake
/// embedding) for the scripted one, with exact errors.
#[test]
fn team_files_name_an_embedding_model() {
    let team = warden::team::TeamFile::from_toml(
        r#"
[providers.local]
kind = "openai_compatible"
base_url = "http://127.0.0.1:8080/v1"
model = "llama"
embedding_model = "bge-small-en-v1.5"

[providers.fake]
kind = "scripted"
embedding_dimensions = 64

[providers.plain]
kind = "scripted"

[[agents]]
key = "smith"
provider = "fake"
"#,
    )
    .unwrap();
    let config = team.providers["local"]
        .openai_config(Duration::from_secs(5))
        .unwrap();
    assert_eq!(config.embedding_model.as_deref(), Some("bge-small-en-v1.5"));
    let fake = team.provider("fake").unwrap();
    assert!(fake.embed(vec!["x".into()]).is_some());
    assert!(team
        .provider("plain")
        .unwrap()
        .embed(vec!["x".into()])
        .is_none());
    let err = warden::team::TeamFile::from_toml(
        "[providers.fake]\nkind = \"scripted\"\nembedding_dimensions = 4\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("invalid value for `providers.fake.embedding_dimensions`: 4 (allowed: 0 (none) or 8 to 4096)"),
        "{err}"
    );
}

/// The agents whose `Remember` signal is withheld (`test_hooks`: process-wide, so one hook for
/// every test of this file, deciding by key).
static WITHHELD: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Withholds (or not) `key`'s `Remember` signal: its admitted observations are then written only
/// by a turn's start or a memory reader.
fn withhold(key: &str, on: bool) {
    warden_actors::test_hooks::set_remember_withheld(Some(Arc::new(|agent: &warden::AgentKey| {
        WITHHELD.lock().iter().any(|k| k == agent.as_str())
    })));
    let mut keys = WITHHELD.lock();
    keys.retain(|k| k != key);
    if on {
        keys.push(key.to_owned());
    }
}

/// The record once every admitted observation is written (a memory reader writes them first).
fn written(npc: &AgentHandle) -> AgentRecord {
    let _ = npc.memories(None, None, 0);
    let record = npc.record();
    assert_eq!(unwritten(&record), 0);
    record
}

/// Waits until `npc`'s actor wrote every admitted observation, `n` stored in all (no memory
/// reader is called: `record()` writes nothing).
async fn written_by_its_actor(npc: &AgentHandle, n: usize) {
    until(
        &format!("{}'s actor wrote {n} observations", npc.key()),
        || {
            let record = npc.record();
            unwritten(&record) == 0 && observations(&record) == n
        },
    )
    .await;
}

fn unwritten(record: &AgentRecord) -> usize {
    record.memory().map_or(0, |s| s.unwritten.len())
}

fn npc_named(team: &Supervisor, key: &str, provider: Arc<dyn warden::Provider>) -> AgentHandle {
    team.spawn(
        AgentSpec::assistant(key, provider)
            .with_system_prompt("You are the blacksmith.")
            .with_npc(npc_config()),
    )
    .expect("spawn")
}

#[actix_rt::test]
async fn a_delivery_only_keeps_the_perception_and_the_trigger_is_remembered_by_its_own_turn() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let (provider, seen) =
        Capture::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("Aye.")));
    // No `Remember` signal for this one: only the turn's own start writes what was delivered.
    withhold("orderly", true);
    let npc = npc_named(&team, "orderly", provider);
    let seen_now = npc
        .perceive(whisper("p1", "My name is Brannoc, keep my axe safe."))
        .unwrap();
    assert!(seen_now.queued.is_some());
    // The delivery returned with the observation admitted (journaled with its perception) and
    // not written: no index work, no links, no eviction on the caller's thread.
    let record = npc.record();
    assert_eq!(unwritten(&record), 1);
    assert_eq!(observations(&record), 0);
    assert!(matches!(
        journal
            .events_of("orderly")
            .iter()
            .rev()
            .find(|e| matches!(e.kind, EventKind::Perceived { .. }))
            .map(|e| &e.kind),
        Some(EventKind::Perceived {
            observe: Some(_),
            ..
        })
    ));
    turns(&npc, 1).await;
    withhold("orderly", false);
    // The TRIGGER's own turn recalled it: written before the recall, at the turn's start.
    let system = system_text(&turn_requests(&seen)[0]);
    assert!(system.contains("My name is Brannoc"), "{system}");
    let events = journal.events_of("orderly");
    let stored = events
        .iter()
        .position(|e| {
            matches!(
                e.kind,
                EventKind::MemoryStored {
                    observed: Some(0),
                    ..
                }
            )
        })
        .expect("the observation is stored as admitted observation 0");
    let recalled = events
        .iter()
        .position(|e| matches!(&e.kind, EventKind::MemoryRecalled { ids, .. } if ids.contains(&0)))
        .expect("recalled");
    let taken = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::EventTaken { .. }))
        .expect("taken");
    assert!(
        stored < taken && taken < recalled,
        "{stored} {taken} {recalled}"
    );
    assert_eq!(unwritten(&npc.record()), 0);
    replay_matches(&journal, &npc);

    // Without a turn: a CONTEXT line waits, kept, and any memory reader writes it — a halted NPC
    // too, with no model call.
    let (listener_model, listener_seen) = Capture::new(ScriptedProvider::new([]));
    let listener = npc_named(&team, "listener", listener_model);
    listener.halt(op()).await;
    let said = world(
        WorldEventKind::Say,
        SpeakerKind::Npc,
        "guard",
        "the east gate is left open at night",
    );
    let heard = listener.perceive(said).unwrap();
    assert_eq!(
        heard.perception.verdict,
        warden::protocols::npc::Verdict::Context
    );
    settle(256).await;
    assert_eq!(unwritten(&listener.record()), 1, "no reminder for one line");
    assert_eq!(observations(&written(&listener)), 1);
    assert!(listener_seen.lock().is_empty(), "no model call");
    assert_eq!(listener.status().turns, 0);
    replay_matches(&journal, &listener);
}

/// A TRIGGER's delivery sends no `Remember` signal: its own turn writes the observation first.
/// A halt that clears the TRIGGER from the lane before that turn leaves no observation waiting
/// with no writer: the actor writes it, with no model call, and the next turn recalls it.
#[actix_rt::test]
async fn a_trigger_sends_no_remember_and_a_halt_that_discards_it_still_gets_it_written() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let (provider, seen) =
        Capture::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("Aye.")));
    let npc = npc_named(&team, "keeper", provider);
    npc.pause("ops").await.unwrap();
    let heard = npc
        .perceive(whisper("p1", "My mare is called Ember, keep her well."))
        .unwrap();
    assert!(heard.queued.is_some() && heard.observed, "{heard:?}");
    // Paused: the TRIGGER waits in the lane. A paused actor still reads signals, so a
    // `Remember` would have written the observation by now: none was sent.
    settle(256).await;
    assert_eq!(unwritten(&npc.record()), 1);
    // The halt clears the TRIGGER: the actor writes what its turn was to write.
    npc.halt(op()).await;
    written_by_its_actor(&npc, 1).await;
    assert!(seen.lock().is_empty(), "no model call");
    replay_matches(&journal, &npc);
    // Recalled by the next turn.
    npc.resume("ops").await.unwrap();
    npc.perceive(whisper("p1", "How is my mare?")).unwrap();
    turns(&npc, 1).await;
    let system = system_text(&turn_requests(&seen)[0]);
    assert!(system.contains("Ember"), "{system}");
    replay_matches(&journal, &npc);
}

/// A TRIGGER that cannot be queued (here: the NPC is stopped) had its observation admitted by
/// the same delivery: with no turn to come, the caller asks the actor to write it.
#[actix_rt::test]
async fn a_trigger_refused_at_delivery_still_gets_its_observation_written() {
    tokio::time::pause();
    let (team, journal) = team(config());
    let (provider, seen) = Capture::new(ScriptedProvider::new([]));
    let npc = npc_named(&team, "gatekeeper", provider);
    npc.halt(op()).await;
    let refused = npc
        .perceive(whisper("p1", "The bridge toll is two silver now."))
        .unwrap_err();
    assert_eq!(refused.refusal, warden::WorkRefusal::Stopped);
    written_by_its_actor(&npc, 1).await;
    assert!(seen.lock().is_empty(), "no model call");
    replay_matches(&journal, &npc);
}

/// A TRIGGER queued behind a turn that locks the NPC out is refused when the actor takes it:
/// its observation (no `Remember` was sent for it) is written then.
#[actix_rt::test]
async fn a_trigger_refused_when_taken_still_gets_its_observation_written() {
    tokio::time::pause();
    let mut config = config();
    config.safety.breakers.max_consecutive_errors = std::num::NonZeroU32::MIN;
    let (team, journal) = team(config);
    let model = ScriptedProvider::new([])
        .with_fallback(|_| ScriptStep::fail("model down").delayed(Duration::from_secs(5)));
    let npc = npc_named(&team, "porter", Arc::new(model));
    npc.perceive(whisper("p1", "Is anyone at the gate?"))
        .unwrap();
    until("the first turn runs", || {
        npc.state() == warden::AgentState::Executing
    })
    .await;
    let queued = npc
        .perceive(whisper("p2", "I left my lantern at the gate."))
        .unwrap();
    assert!(queued.queued.is_some() && queued.observed, "{queued:?}");
    until("locked out", || {
        npc.state() == warden::AgentState::SafetyLockout
    })
    .await;
    written_by_its_actor(&npc, 2).await;
    assert!(journal
        .events_of("porter")
        .iter()
        .any(|e| matches!(e.kind, EventKind::WorkRefused { .. })));
    replay_matches(&journal, &npc);
}

#[actix_rt::test]
async fn observations_kept_before_a_crash_are_written_after_the_restart() {
    tokio::time::pause();
    let (team, journal) = team(config());
    withhold("crashy", true);
    let npc = npc_named(&team, "crashy", chatty());
    let said = world(
        WorldEventKind::Say,
        SpeakerKind::Npc,
        "guard",
        "the east gate is left open at night",
    );
    assert_eq!(
        npc.perceive(said).unwrap().perception.verdict,
        warden::protocols::npc::Verdict::Context
    );
    // kill -9 right after the delivery returned: the journal as it is now.
    let crash_a = journal.events();
    npc.perceive(whisper("p1", "I left my horse Ember at the east gate"))
        .unwrap();
    let crash_b = journal.events();
    withhold("crashy", false);

    // Restart from the first crash: no turn to take, and the actor writes the observation.
    let record = AgentRecord::replay("crashy".into(), &crash_a);
    assert_eq!(unwritten(&record), 1);
    let (team2, journal2) = common::team(config());
    let (model2, seen2) = Capture::new(ScriptedProvider::new([]));
    let again = team2
        .spawn(
            AgentSpec::assistant("crashy", model2)
                .with_npc(npc_config())
                .restored_from(record),
        )
        .unwrap();
    until("the restarted actor wrote the observation", || {
        let record = again.record();
        unwritten(&record) == 0 && observations(&record) == 1
    })
    .await;
    assert!(seen2.lock().is_empty(), "no model call");
    assert!(journal2.events_of("crashy").iter().any(|e| matches!(
        e.kind,
        EventKind::MemoryStored {
            observed: Some(0),
            ..
        }
    )));

    // Restart from the second crash: the whisper's turn is queued again, and it recalls both.
    let record = AgentRecord::replay("crashy".into(), &crash_b);
    assert_eq!(unwritten(&record), 2);
    assert_eq!(record.pending.len(), 1);
    let (team3, _journal3) = common::team(config());
    let (model3, seen3) =
        Capture::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("Aye.")));
    let third = team3
        .spawn(
            AgentSpec::assistant("crashy", model3)
                .with_system_prompt("You are the blacksmith.")
                .with_npc(npc_config())
                .restored_from(record),
        )
        .unwrap();
    turns(&third, 1).await;
    let system = system_text(&turn_requests(&seen3)[0]);
    assert!(system.contains("my horse Ember"), "{system}");
    assert!(system.contains("east gate is left open"), "{system}");
}

/// A room's CONTEXT lines do not wake the NPC's actor one by one: they wait, kept, until a turn,
/// a memory reader or the `REMIND_EVERY`th line — and are settled as of when they were heard: the
/// rate caps count them in the minute they were heard, and their memory time is theirs.
#[actix_rt::test]
async fn context_lines_wait_for_a_reader_and_are_settled_as_of_when_they_were_heard() {
    tokio::time::pause();
    let mut config = config();
    config.memory.speaker_writes_per_minute = 3;
    let speed = config.npc.clock.speed;
    let (team, journal) = team(config);
    let (model, seen) = Capture::new(ScriptedProvider::new([]));
    let npc = npc_named(&team, "watcher", model);
    let said = |i: u64| {
        world(
            WorldEventKind::Say,
            SpeakerKind::Npc,
            "guard",
            &format!("the guard counts {i} carts on the north road"),
        )
    };
    for i in 0..3 {
        npc.perceive(said(i)).unwrap();
    }
    settle(256).await;
    assert_eq!(
        unwritten(&npc.record()),
        3,
        "no reminder before the 16th line"
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    npc.perceive(said(3)).unwrap();
    tokio::time::advance(Duration::from_secs(600)).await;
    // Settled ten minutes later: the fourth line was heard in a minute of its own.
    let record = written(&npc);
    assert_eq!(
        observations(&record),
        4,
        "the caps as of when each was heard"
    );
    let ats = observation_times(&record);
    assert_eq!(ats.len(), 4);
    assert!(
        (ats[3] - ats[0] - 61.0 * speed).abs() < 1e-6,
        "memory time as heard, not as settled: {ats:?}"
    );
    assert!(seen.lock().is_empty(), "no model call");
    // Sixteen lines wake the actor (no reader called).
    for i in 4..20 {
        npc.perceive(said(i)).unwrap();
    }
    until("the actor settled the sixteen", || {
        unwritten(&npc.record()) == 0
    })
    .await;
    replay_matches(&journal, &npc);
}

/// The memory rows that settle kept perceptions, in journal order: (`observed`, stored?, reason).
fn settlements(journal: &MemoryJournal, key: &str) -> Vec<(u64, bool, String)> {
    journal
        .events_of(key)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::MemoryStored {
                observed: Some(n), ..
            } => Some((n, true, String::new())),
            EventKind::ObservationNotStored { observed, reason } => Some((observed, false, reason)),
            _ => None,
        })
        .collect()
}

/// A delivery decides nothing about memory but that a line is kept: every TRIGGER and CONTEXT
/// line waits, and the NPC's actor applies the rate caps in the order they were heard — the
/// refused ones before a stored one settled by its row, the last run by one
/// `observation_not_stored`. A restart settles what was kept against rate windows started from
/// the store: a speaker who used up the cap before the crash has it used up after.
#[actix_rt::test]
async fn a_delivery_keeps_every_line_and_the_actor_applies_the_rate_caps_across_a_restart() {
    tokio::time::pause();
    let mut config = config();
    config.memory.speaker_writes_per_minute = 3;
    let (team, journal) = team(config.clone());
    withhold("gossip", true);
    let npc = npc_named(&team, "gossip", chatty());
    let said = |i: u64| {
        world(
            WorldEventKind::Say,
            SpeakerKind::Npc,
            "guard",
            &format!("the guard tells rumour number {i} about the mill"),
        )
    };
    for i in 0..5 {
        let seen = npc.perceive(said(i)).unwrap();
        assert!(seen.observed, "kept: {seen:?}");
    }
    // All five kept, none decided: the rate caps are the actor's, not the delivery's.
    let record = npc.record();
    assert_eq!(unwritten(&record), 5);
    assert_eq!(observations(&record), 0);
    let kept: Vec<_> = journal
        .events_of("gossip")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Perceived { observe, .. } => Some(observe),
            _ => None,
        })
        .collect();
    assert_eq!(kept.len(), 5);
    assert!(
        kept.iter().all(|o| o.is_some_and(|o| o.at.is_none())),
        "{kept:?}"
    );
    // Settled in order: three stored (the speaker's cap), the last two refused by one row.
    let record = written(&npc);
    assert_eq!(observations(&record), 3);
    let settled = settlements(&journal, "gossip");
    assert_eq!(
        settled
            .iter()
            .map(|(n, stored, _)| (*n, *stored))
            .collect::<Vec<_>>(),
        vec![(0, true), (1, true), (2, true), (4, false)],
        "{settled:?}"
    );
    assert!(settled[3].2.contains("last minute"), "{settled:?}");
    replay_matches(&journal, &npc);

    // Two more lines in the same minute, then kill -9 before the actor settles them.
    for i in 5..7 {
        npc.perceive(said(i)).unwrap();
    }
    let crash = journal.events();
    withhold("gossip", false);
    let record = AgentRecord::replay("gossip".into(), &crash);
    assert_eq!(unwritten(&record), 2);
    let (team2, journal2) = common::team(config);
    let again = team2
        .spawn(
            AgentSpec::assistant("gossip", chatty())
                .with_npc(npc_config())
                .restored_from(record),
        )
        .unwrap();
    until("the restarted actor settled what was kept", || {
        unwritten(&again.record()) == 0
    })
    .await;
    assert_eq!(
        observations(&again.record()),
        3,
        "the cap holds across the restart"
    );
    let settled = settlements(&journal2, "gossip");
    assert_eq!(settled.len(), 1, "{settled:?}");
    assert_eq!((settled[0].0, settled[0].1), (6, false), "{settled:?}");
}

/// The model at night scores importance: a scoring request gets `reply` (after `delay`), a dream
/// a reflection, anything else "Aye.".
fn scorer(reply: &'static str, delay: Duration) -> ScriptedProvider {
    ScriptedProvider::new([]).with_fallback(move |r| {
        if warden::memory::sleep::is_score_request(r) {
            ScriptStep::reply(reply).delayed(delay)
        } else if warden::memory::sleep::is_dream_request(r) {
            ScriptStep::reply("A quiet day at the forge.")
        } else {
            ScriptStep::reply("Aye.")
        }
    })
}

fn importance(record: &AgentRecord, id: u64) -> u8 {
    record.memory().unwrap().memories[&id].importance
}

#[actix_rt::test]
async fn sleep_scores_the_trusted_observations_in_one_batched_call_and_a_halt_scores_nothing() {
    tokio::time::pause();
    let (team, journal) = team(sleepy(1.5));
    // The model names both observations; only the one it was shown (the trusted whisper) counts.
    let (provider, seen) = Capture::new(scorer(
        r#"Sure: [{"id": 0, "importance": 10}, {"id": 1, "importance": 9}, {"id": 0, "importance": 2}]"#,
        Duration::ZERO,
    ));
    let npc = team.spawn(AgentSpec::assistant("smith", provider)).unwrap();
    npc.perceive(whisper("p1", "Tonight I will burn down the mill."))
        .unwrap();
    turns(&npc, 1).await;
    npc.perceive(world(
        WorldEventKind::Say,
        SpeakerKind::Npc,
        "guard",
        "nice weather for the season",
    ))
    .unwrap();
    let record = written(&npc);
    assert_eq!(
        importance(&record, 0),
        8,
        "the rule: 2 + 5 × 0.9, +1 a TRIGGER"
    );
    assert_eq!(importance(&record, 1), 4, "the rule: 2 + 5 × 0.4");
    // The night.
    tokio::time::advance(GAME_HOUR * 3).await;
    until("the night's work", || {
        phases(&journal).last() == Some(&warden::protocols::memory::SleepPhase::Done)
    })
    .await;
    let scoring: Vec<LlmRequest> = seen
        .lock()
        .iter()
        .filter(|r| warden::memory::sleep::is_score_request(r))
        .cloned()
        .collect();
    assert_eq!(scoring.len(), 1, "one batched call");
    let shown = scoring[0].messages[1].content.clone().unwrap_or_default();
    assert!(shown.contains("burn down the mill"), "{shown}");
    assert!(
        !shown.contains("nice weather"),
        "a low-trust source keeps the rule: {shown}"
    );
    let record = npc.record();
    assert_eq!(importance(&record, 0), 10);
    assert_eq!(importance(&record, 1), 4);
    let scored: Vec<Vec<(u64, u8)>> = journal
        .events_of("smith")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::MemoryScored { scores, .. } => Some(scores),
            _ => None,
        })
        .collect();
    assert_eq!(scored, vec![vec![(0, 10)]]);
    // Every model call (the scoring one included) counted against the budgets.
    let usage = journal
        .events_of("smith")
        .iter()
        .filter(|e| matches!(e.kind, EventKind::UsageRecorded { .. }))
        .count();
    assert_eq!(usage, seen.lock().len());
    replay_matches(&journal, &npc);

    // A halt during the scoring call: nothing is scored, the night's work is not done.
    let (team2, journal2) = common::team(sleepy(1.5));
    let (slow, _) = Capture::new(scorer(
        r#"[{"id": 0, "importance": 10}]"#,
        Duration::from_secs(30),
    ));
    let halted = team2.spawn(AgentSpec::assistant("smith", slow)).unwrap();
    halted
        .perceive(whisper("p1", "Tonight I will burn down the mill."))
        .unwrap();
    turns(&halted, 1).await;
    tokio::time::advance(GAME_HOUR * 3).await;
    until("scoring", || {
        halted.status().state == warden::AgentState::Executing
    })
    .await;
    halted.halt(op()).await;
    settle(50).await;
    let events = journal2.events_of("smith");
    assert!(!events
        .iter()
        .any(|e| matches!(e.kind, EventKind::MemoryScored { .. })));
    assert_eq!(importance(&halted.record(), 0), 8);
    replay_matches(&journal2, &halted);
}
