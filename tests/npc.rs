//! NPC perception end to end: world events classified, journaled with their rule and trust, queued
//! (TRIGGER) or kept for the next turn (CONTEXT), and shown in the status.
mod common;
use common::*;
use warden::{
    protocols::{
        npc::{NpcConfig, Rule, Speaker, SpeakerKind, Verdict, WorldEvent, WorldEventKind},
        ChatRole,
    },
    AgentHandle, AgentSpec, EventKind, MemoryJournal, ScriptStep, WardenConfig,
};

fn world(kind: WorldEventKind, speaker: SpeakerKind, id: &str, text: &str) -> WorldEvent {
    WorldEvent {
        speaker: Speaker {
            id: id.into(),
            kind: speaker,
        },
        kind,
        room: Some("tavern".into()),
        text: text.into(),
        mentions: Some(Vec::new()),
        oob: Default::default(),
    }
}

/// The `perceived` journal events of `agent`: (rule, verdict, trust).
fn perceived(journal: &MemoryJournal, agent: &str) -> Vec<(Rule, Verdict, f64)> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Perceived { perception, .. } => {
                Some((perception.rule, perception.verdict, perception.trust))
            }
            _ => None,
        })
        .collect()
}

async fn turns(agent: &AgentHandle, n: u64) {
    until(&format!("{} finished {n} turns", agent.key()), || {
        agent.status().turns == n
    })
    .await;
}

#[actix_rt::test]
async fn context_waits_for_the_next_turn_and_a_trigger_starts_it() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let npc = team.assistant(
        "innkeeper",
        model([ScriptStep::reply("Welcome, traveller.")]),
    );

    // Another NPC's remark and an emote: context. They never start a turn.
    for event in [
        world(WorldEventKind::Say, SpeakerKind::Npc, "smith", "hot today"),
        world(
            WorldEventKind::Emote,
            SpeakerKind::Player,
            "p1",
            "shakes off the rain",
        ),
    ] {
        let seen = npc.perceive(event).unwrap();
        assert_eq!(seen.queued, None);
    }
    settle(50).await;
    assert_eq!(npc.status().turns, 0);
    let status = npc.status().npc.expect("an NPC status after perceiving");
    assert_eq!(
        (status.perceived, status.context_buffered),
        (2, 1),
        "{status:?}"
    );

    // A whisper triggers; the turn takes the buffered context before the whisper.
    let seen = npc
        .perceive(world(
            WorldEventKind::Whisper,
            SpeakerKind::Player,
            "p1",
            "a room?",
        ))
        .unwrap();
    assert_eq!(seen.perception.verdict, Verdict::Trigger);
    assert!(seen.queued.is_some());
    turns(&npc, 1).await;
    let history = npc.record().history;
    let texts: Vec<(ChatRole, String)> = history
        .iter()
        .map(|m| (m.role, m.content.clone().unwrap_or_default()))
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(
        texts[0].1.contains(r#"smith (npc) says: "hot today""#),
        "{texts:?}"
    );
    assert_eq!(
        texts[1],
        (ChatRole::User, "[whisper] p1: a room?".to_owned())
    );
    assert_eq!(
        texts[2],
        (ChatRole::Assistant, "Welcome, traveller.".to_owned())
    );
    assert_eq!(npc.status().npc.unwrap().context_buffered, 0);

    assert_eq!(
        perceived(&journal, "innkeeper"),
        [
            (Rule::AssistantCrossTalk, Verdict::Context, 0.4),
            (Rule::Default, Verdict::Ignore, 0.3),
            (Rule::DirectMessage, Verdict::Trigger, 0.9),
        ]
    );
    replay_matches(&journal, &npc);
}

#[actix_rt::test]
async fn a_low_trust_trigger_is_kept_as_context_and_starts_nothing() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let npc = team.assistant("innkeeper", model([]));
    let seen = npc
        .perceive(world(
            WorldEventKind::Whisper,
            SpeakerKind::Unknown,
            "?",
            "give me gold",
        ))
        .unwrap();
    assert_eq!(seen.perception.verdict, Verdict::Context);
    assert!(seen.perception.downgraded);
    assert_eq!(seen.queued, None);
    settle(50).await;
    assert_eq!(npc.status().turns, 0);
    assert_eq!(npc.status().npc.unwrap().last, Some(seen.perception));
    replay_matches(&journal, &npc);
}

#[actix_rt::test]
async fn an_agent_can_have_its_own_npc_settings() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let mute = NpcConfig {
        interaction_enabled: false,
        ..NpcConfig::default()
    };
    let npc = team
        .spawn(AgentSpec::assistant("statue", model([])).with_npc(mute))
        .unwrap();
    let seen = npc
        .perceive(world(
            WorldEventKind::Whisper,
            SpeakerKind::Player,
            "p1",
            "hello?",
        ))
        .unwrap();
    assert_eq!(
        (seen.perception.rule, seen.perception.verdict),
        (Rule::InteractionDisabled, Verdict::Ignore)
    );
    // The team's settings are untouched.
    let other = team.assistant("innkeeper", model([ScriptStep::reply("yes?")]));
    let seen = other
        .perceive(world(
            WorldEventKind::Whisper,
            SpeakerKind::Player,
            "p1",
            "hello?",
        ))
        .unwrap();
    assert_eq!(seen.perception.verdict, Verdict::Trigger);
}
