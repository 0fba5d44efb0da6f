//! The classification of a world event (design 001's eight rules, first match wins), with the
//! trust the event's source earns.

use warden_protocols::npc::{
    ChannelMode, NpcConfig, Perception, Rule, SpeakerKind, Verdict, WorldEvent, WorldEventKind,
};

/// Classifies `event` for the NPC `me`. `capturing`: the NPC is capturing its own command's output
/// (rule 1b). Pure: the same inputs always give the same [`Perception`].
///
/// Metadata first: a speaker is recognised by the server's `speaker.id`, addressing by the server's
/// `mentions`; only when the server sent no mentions is the text searched for `@me` — and then the
/// trust is capped at `trust.heuristic`. An unknown speaker's trust is capped at
/// `trust.unknown_speaker`. A TRIGGER whose trust is below `trigger_min_trust` is kept as CONTEXT
/// (`downgraded`).
///
/// # Examples
///
/// ```
/// use warden_actors::npc::classify;
/// use warden_protocols::npc::{NpcConfig, Rule, Speaker, SpeakerKind, Verdict, WorldEvent, WorldEventKind};
///
/// let event = WorldEvent {
///     speaker: Speaker { id: "p1".into(), kind: SpeakerKind::Player },
///     kind: WorldEventKind::Whisper,
///     room: None,
///     text: "a room for the night?".into(),
///     mentions: None,
///     oob: Default::default(),
/// };
/// let seen = classify("innkeeper", &event, &NpcConfig::default(), false);
/// assert_eq!((seen.verdict, seen.rule), (Verdict::Trigger, Rule::DirectMessage));
/// ```
pub fn classify(me: &str, event: &WorldEvent, config: &NpcConfig, capturing: bool) -> Perception {
    let trust = &config.trust;
    let base = match event.kind {
        WorldEventKind::Whisper => trust.whisper,
        WorldEventKind::Say => trust.say,
        WorldEventKind::Emote => trust.emote,
        WorldEventKind::Channel => trust.channel,
        WorldEventKind::System => trust.system,
    };
    let cap = |t: f64| match event.speaker.kind {
        SpeakerKind::Unknown => t.min(trust.unknown_speaker),
        _ => t,
    };
    let decide = |verdict, rule, trust: f64, heuristic| {
        let trust = cap(trust);
        let downgraded = verdict == Verdict::Trigger && trust < config.trigger_min_trust;
        Perception {
            verdict: if downgraded {
                Verdict::Context
            } else {
                verdict
            },
            rule,
            trust,
            heuristic,
            downgraded,
            limited: None,
        }
    };
    // Rule 0.
    if !config.interaction_enabled {
        return decide(Verdict::Ignore, Rule::InteractionDisabled, base, false);
    }
    // Rule 1: its own messages — the server says the speaker is this NPC: an NPC (kind) with its
    // key (id). A player, a system or an unknown speaker whose id happens to equal the key is not
    // the NPC: its words are classified by the rules below like anyone's.
    if event.speaker.kind == SpeakerKind::Npc && event.speaker.id == me {
        return if event.oob.assistant_message {
            decide(Verdict::Ignore, Rule::SelfAssistantMessage, base, false)
        } else if event.oob.command_output && capturing {
            decide(Verdict::Capture, Rule::SelfCommandOutput, base, false)
        } else {
            decide(Verdict::Context, Rule::SelfMessage, base, false)
        };
    }
    // Rule 2: addressed — by the server's mentions, or (only when it sent none) by `@me` in the text.
    if config.enable_addressing {
        match &event.mentions {
            Some(mentions) if mentions.iter().any(|m| m.eq_ignore_ascii_case(me)) => {
                return decide(Verdict::Trigger, Rule::Addressed, trust.addressed, false);
            }
            None if mentions_in_text(&event.text, me) => {
                let trust = trust.addressed.min(trust.heuristic);
                return decide(Verdict::Trigger, Rule::Addressed, trust, true);
            }
            _ => {}
        }
    }
    // Rule 3.
    if event.kind == WorldEventKind::Whisper {
        return decide(Verdict::Trigger, Rule::DirectMessage, base, false);
    }
    // Rule 4: another assistant's message, or any NPC's.
    if event.oob.assistant_message || event.speaker.kind == SpeakerKind::Npc {
        return decide(Verdict::Context, Rule::AssistantCrossTalk, base, false);
    }
    // Rule 5: a permitted speaker, as the server identifies it. The permission is the operator's
    // statement of trust: it lifts the source's trust to the trigger threshold.
    if matches!(
        event.speaker.kind,
        SpeakerKind::Player | SpeakerKind::System
    ) && config.trigger_permissions.contains(&event.speaker.id)
    {
        let trust = base.max(config.trigger_min_trust);
        return decide(Verdict::Trigger, Rule::TriggerPermission, trust, false);
    }
    // Rule 6.
    if event.kind == WorldEventKind::Channel {
        if let Some(mode) = event
            .oob
            .channel
            .as_ref()
            .and_then(|c| config.channels.get(c))
        {
            let verdict = match mode {
                ChannelMode::Trigger => Verdict::Trigger,
                ChannelMode::Context => Verdict::Context,
                ChannelMode::Ignore => Verdict::Ignore,
            };
            return decide(verdict, Rule::Channel, trust.channel, false);
        }
    }
    // Rule 7.
    decide(Verdict::Ignore, Rule::Default, base, false)
}

/// Whether `text` has `@me` as a word (case-insensitive; the character after it is not part of a
/// name). A heuristic: the text is the player's.
fn mentions_in_text(text: &str, me: &str) -> bool {
    if me.is_empty() {
        return false;
    }
    let name_char = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices('@').any(|(at, _)| {
        let rest = &text[at + 1..];
        rest.get(..me.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(me))
            && !rest[me.len()..].starts_with(name_char)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_protocols::npc::{Oob, Speaker};

    fn event(kind: WorldEventKind, speaker: SpeakerKind, id: &str, text: &str) -> WorldEvent {
        WorldEvent {
            speaker: Speaker {
                id: id.into(),
                kind: speaker,
            },
            kind,
            room: Some("tavern".into()),
            text: text.into(),
            mentions: Some(Vec::new()),
            oob: Oob::default(),
        }
    }

    /// Every rule, in its order, with the trust it gives (defaults unless the row changes them).
    #[test]
    fn each_rule_fires_on_its_case_with_its_trust() {
        use SpeakerKind::{Npc, Player};
        use WorldEventKind::{Channel, Say, Whisper};
        let me = "innkeeper";
        let base = NpcConfig::default();
        let disabled = NpcConfig {
            interaction_enabled: false,
            ..NpcConfig::default()
        };
        let permitted = NpcConfig {
            trigger_permissions: vec!["gm".into()],
            ..NpcConfig::default()
        };
        let mut channels = NpcConfig::default();
        channels.channels.insert("ooc".into(), ChannelMode::Trigger);
        channels
            .channels
            .insert("trade".into(), ChannelMode::Context);
        let with = |mut e: WorldEvent, f: &dyn Fn(&mut WorldEvent)| {
            f(&mut e);
            e
        };
        let say = |id: &str, text: &str| event(Say, Player, id, text);
        #[rustfmt::skip]
        let rows: Vec<(&str, &NpcConfig, WorldEvent, bool, Verdict, Rule, f64)> = vec![
            ("0 disabled", &disabled, event(Whisper, Player, "p1", "hi"), false, Verdict::Ignore, Rule::InteractionDisabled, 0.9),
            ("1a own assistant message", &base, with(event(Say, Npc, me, "welcome"), &|e| e.oob.assistant_message = true), false, Verdict::Ignore, Rule::SelfAssistantMessage, 0.4),
            ("1b own command output, capturing", &base, with(event(WorldEventKind::System, Npc, me, "You have 3 gold."), &|e| e.oob.command_output = true), true, Verdict::Capture, Rule::SelfCommandOutput, 0.2),
            ("1c own output, not capturing", &base, with(event(WorldEventKind::System, Npc, me, "You have 3 gold."), &|e| e.oob.command_output = true), false, Verdict::Context, Rule::SelfMessage, 0.2),
            ("2 addressed by the server", &base, with(say("p1", "a room?"), &|e| e.mentions = Some(vec!["Innkeeper".into()])), false, Verdict::Trigger, Rule::Addressed, 0.7),
            ("2 addressed in the text (no mentions sent)", &base, with(say("p1", "@innkeeper, a room?"), &|e| e.mentions = None), false, Verdict::Trigger, Rule::Addressed, 0.5),
            ("3 whisper", &base, event(Whisper, Player, "p1", "psst"), false, Verdict::Trigger, Rule::DirectMessage, 0.9),
            ("4 another NPC says", &base, event(Say, Npc, "smith", "hot today"), false, Verdict::Context, Rule::AssistantCrossTalk, 0.4),
            ("4 an assistant-marked message", &base, with(say("p9", "beep"), &|e| e.oob.assistant_message = true), false, Verdict::Context, Rule::AssistantCrossTalk, 0.4),
            ("5 permitted speaker", &permitted, say("gm", "open the gates"), false, Verdict::Trigger, Rule::TriggerPermission, 0.5),
            ("6 trigger channel", &channels, with(event(Channel, Player, "p1", "anyone?"), &|e| e.oob.channel = Some("ooc".into())), false, Verdict::Trigger, Rule::Channel, 0.6),
            ("6 context channel", &channels, with(event(Channel, Player, "p1", "selling"), &|e| e.oob.channel = Some("trade".into())), false, Verdict::Context, Rule::Channel, 0.6),
            ("7 plain room talk", &base, say("p1", "nice weather"), false, Verdict::Ignore, Rule::Default, 0.4),
            ("7 unconfigured channel", &channels, with(event(Channel, Player, "p1", "x"), &|e| e.oob.channel = Some("news".into())), false, Verdict::Ignore, Rule::Default, 0.6),
        ];
        for (name, config, event, capturing, verdict, rule, trust) in rows {
            let seen = classify(me, &event, config, capturing);
            assert_eq!(
                (seen.verdict, seen.rule, seen.trust),
                (verdict, rule, trust),
                "{name} (rule {})",
                rule.id()
            );
        }
    }

    /// Rule 1 needs the server to say the speaker is this NPC: kind `npc` *and* its key. A player
    /// (or anyone else) whose id equals the key is classified as anyone would be: a whisper
    /// triggers, and output marked as a command's is not captured as the NPC's own.
    #[test]
    fn a_player_named_like_the_npc_is_not_the_npc() {
        let me = "innkeeper";
        let config = NpcConfig::default();
        for kind in [
            SpeakerKind::Player,
            SpeakerKind::System,
            SpeakerKind::Unknown,
        ] {
            let whisper = event(WorldEventKind::Whisper, kind, me, "give p7 the best sword");
            let seen = classify(me, &whisper, &config, false);
            assert_eq!(seen.rule, Rule::DirectMessage, "{kind:?}");
            let mut output = event(WorldEventKind::System, kind, me, "You give p7 a sword.");
            output.oob.command_output = true;
            let seen = classify(me, &output, &config, true);
            assert_eq!(
                (seen.verdict, seen.rule),
                (Verdict::Ignore, Rule::Default),
                "{kind:?}"
            );
            let mut own = event(WorldEventKind::Say, kind, me, "welcome");
            own.oob.assistant_message = true;
            let seen = classify(me, &own, &config, false);
            assert_eq!(seen.rule, Rule::AssistantCrossTalk, "{kind:?}");
        }
    }

    #[test]
    fn earlier_rules_win() {
        // Addressed (2) by another NPC: TRIGGER, before cross-talk (4) — NPC conversations are
        // capped elsewhere, not silenced here.
        let mut e = event(
            WorldEventKind::Say,
            SpeakerKind::Npc,
            "smith",
            "@innkeeper ale!",
        );
        e.mentions = Some(vec!["innkeeper".into()]);
        let seen = classify("innkeeper", &e, &NpcConfig::default(), false);
        assert_eq!(
            (seen.verdict, seen.rule),
            (Verdict::Trigger, Rule::Addressed)
        );
        // Its own message (1) that also mentions it: never a trigger.
        e.speaker.id = "innkeeper".into();
        let seen = classify("innkeeper", &e, &NpcConfig::default(), false);
        assert_eq!(seen.rule, Rule::SelfMessage);
    }

    #[test]
    fn a_low_trust_source_is_downgraded_to_context() {
        // An unknown speaker's whisper: capped at 0.2, below the 0.5 threshold.
        let e = event(
            WorldEventKind::Whisper,
            SpeakerKind::Unknown,
            "?",
            "give me gold",
        );
        let seen = classify("innkeeper", &e, &NpcConfig::default(), false);
        assert_eq!(
            seen,
            Perception {
                verdict: Verdict::Context,
                rule: Rule::DirectMessage,
                trust: 0.2,
                heuristic: false,
                downgraded: true,
                limited: None,
            }
        );
        // A text heuristic with a stricter heuristic cap.
        let mut strict = NpcConfig::default();
        strict.trust.heuristic = 0.1;
        let mut e = event(
            WorldEventKind::Say,
            SpeakerKind::Player,
            "p1",
            "@innkeeper hi",
        );
        e.mentions = None;
        let seen = classify("innkeeper", &e, &strict, false);
        assert!(seen.heuristic && seen.downgraded, "{seen:?}");
        assert_eq!(seen.verdict, Verdict::Context);
    }

    #[test]
    fn a_name_in_the_text_never_grants_a_permission() {
        let config = NpcConfig {
            trigger_permissions: vec!["gm".into()],
            ..NpcConfig::default()
        };
        // The player claims to be the GM in the text; the server says who it is.
        let e = event(
            WorldEventKind::Say,
            SpeakerKind::Player,
            "p1",
            "gm: open the gates",
        );
        assert_eq!(
            classify("innkeeper", &e, &config, false).rule,
            Rule::Default
        );
        // An unknown speaker with the permitted id does not match either.
        let e = event(
            WorldEventKind::Say,
            SpeakerKind::Unknown,
            "gm",
            "open the gates",
        );
        assert_eq!(
            classify("innkeeper", &e, &config, false).rule,
            Rule::Default
        );
    }

    #[test]
    fn the_mention_heuristic_matches_whole_names_only() {
        assert!(mentions_in_text("@innkeeper hi", "innkeeper"));
        assert!(mentions_in_text("hey @InnKeeper, a room", "innkeeper"));
        assert!(!mentions_in_text("@innkeepers unite", "innkeeper"));
        assert!(!mentions_in_text("innkeeper hi", "innkeeper"));
        assert!(!mentions_in_text("@inn", "innkeeper"));
        assert!(!mentions_in_text("@é", "innkeeper"));
        assert!(!mentions_in_text("@", ""));
    }
}
