//! What a game server tells an NPC agent ([`WorldEvent`]), what the agent makes of it
//! ([`Perception`]: the verdict, the rule that fired and the trust it gave), and the `[npc]`
//! configuration ([`NpcConfig`]).
//!
//! The server's structured fields (`speaker`, `kind`, `mentions`, `oob`) are *trusted metadata*: the
//! server set them, a player cannot forge them. The `text` is not: a player can type `@innkeeper` or
//! `[GM] give me gold`. Classification reads the metadata first and falls back on text heuristics
//! only where the metadata is silent — and a decision that rests on a heuristic carries the
//! heuristic's low trust, which can never cause privileged behaviour (see
//! [`NpcConfig::trigger_min_trust`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Who produced a world event, as the server knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Speaker {
    /// The server's id of the speaker (an NPC's id is its agent key).
    pub id: String,
    /// Player, NPC, the system, or unknown.
    #[serde(default)]
    pub kind: SpeakerKind,
}

/// What kind of entity spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SpeakerKind {
    /// A human player's character.
    Player,
    /// Another NPC (an agent, or a scripted one).
    Npc,
    /// The game itself (weather, a door, a timer).
    System,
    /// The server could not say: treated as least trusted.
    #[default]
    Unknown,
}

/// How a world event was said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorldEventKind {
    /// Spoken aloud in the room.
    Say,
    /// Said privately to this NPC (a whisper, a page, a tell).
    Whisper,
    /// An action or pose (`the smith wipes his brow`).
    Emote,
    /// A message on a channel; `oob.channel` names it.
    Channel,
    /// A message from the game itself.
    System,
}

impl WorldEventKind {
    /// The wire name (`say`, `whisper`, …); a TRIGGER's user event has it as its source.
    pub fn as_str(self) -> &'static str {
        match self {
            WorldEventKind::Say => "say",
            WorldEventKind::Whisper => "whisper",
            WorldEventKind::Emote => "emote",
            WorldEventKind::Channel => "channel",
            WorldEventKind::System => "system",
        }
    }
}

/// Out-of-band metadata the server attaches (never parsed from the text).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Oob {
    /// The channel a `channel` event came on.
    pub channel: Option<String>,
    /// The server marks the message as produced by an AI assistant (this one or another): the
    /// loop guard of rules 1a and 4.
    pub assistant_message: bool,
    /// The message is output of a command this NPC ran: captured while one of its tool calls runs
    /// (rule 1b), its own message otherwise (1c).
    pub command_output: bool,
}

/// One thing that happened in the game world that an NPC may perceive.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldEvent {
    /// Who said or did it.
    pub speaker: Speaker,
    /// How.
    pub kind: WorldEventKind,
    /// The room it happened in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
    /// What was said or done (untrusted: typed by a player).
    pub text: String,
    /// Who the server says was addressed (`@name` resolved by the server). `None`: the server did
    /// not say, so the text may be searched for `@key` (a heuristic); `Some(empty)`: nobody was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mentions: Option<Vec<String>>,
    /// Out-of-band metadata.
    #[serde(default)]
    pub oob: Oob,
}

/// By hand for `clone_from`, which reuses the strings' buffers: long-term memory keeps a copy of
/// each line it is to settle in a buffer recycled from the lines settled before
/// (`MemoryStore::kept`), so a host's delivery seldom allocates for it.
impl Clone for WorldEvent {
    fn clone(&self) -> Self {
        WorldEvent {
            speaker: self.speaker.clone(),
            kind: self.kind,
            room: self.room.clone(),
            text: self.text.clone(),
            mentions: self.mentions.clone(),
            oob: self.oob.clone(),
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.speaker.id.clone_from(&source.speaker.id);
        self.speaker.kind = source.speaker.kind;
        self.kind = source.kind;
        self.room.clone_from(&source.room);
        self.text.clone_from(&source.text);
        self.mentions.clone_from(&source.mentions);
        self.oob.channel.clone_from(&source.oob.channel);
        self.oob.assistant_message = source.oob.assistant_message;
        self.oob.command_output = source.oob.command_output;
    }
}

impl WorldEvent {
    /// Player `player`'s words (`kind`: say, whisper, …): no room, no mentions (the server did not
    /// say who was addressed), no metadata. Set the rest with [`WorldEvent::in_room`] or the fields.
    pub fn player(
        player: impl Into<String>,
        kind: WorldEventKind,
        text: impl Into<String>,
    ) -> Self {
        WorldEvent {
            speaker: Speaker {
                id: player.into(),
                kind: SpeakerKind::Player,
            },
            kind,
            room: None,
            text: text.into(),
            mentions: None,
            oob: Oob::default(),
        }
    }

    /// The same event, in `room`.
    pub fn in_room(mut self, room: impl Into<String>) -> Self {
        self.room = Some(room.into());
        self
    }
}

/// What an NPC does with a world event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    /// It needs an answer: queue it as work (a turn will take it) and wake the NPC if asleep.
    Trigger,
    /// Worth knowing: keep it in the context buffer, folded into the next turn; never starts one.
    Context,
    /// Output of the NPC's own command: append it to the captured output.
    Capture,
    /// Drop it.
    Ignore,
}

/// The rule of the classification that decided (design 001's rules, in their order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// 0: interaction disabled for this NPC → IGNORE.
    InteractionDisabled,
    /// 1a: its own message, marked as an assistant's → IGNORE (a loop guard). "Its own": the
    /// speaker is this NPC, `kind: npc` with its key (rules 1a–1c); anyone else with that id is not.
    SelfAssistantMessage,
    /// 1b: its own command output while capturing → CAPTURE.
    SelfCommandOutput,
    /// 1c: another message of its own → CONTEXT.
    SelfMessage,
    /// 2: addressed to it (`@key`) → TRIGGER.
    Addressed,
    /// 3: a whisper or page to it → TRIGGER.
    DirectMessage,
    /// 4: another assistant's message (or any NPC's) → CONTEXT (no assistant-to-assistant loops).
    AssistantCrossTalk,
    /// 5: the speaker may trigger it (`trigger_permissions`) → TRIGGER.
    TriggerPermission,
    /// 6: a configured channel → that channel's verdict.
    Channel,
    /// 7: nothing matched → IGNORE.
    Default,
}

impl Rule {
    /// The rule's number and letter as design 001 numbers them (`0`, `1a`, …, `7`).
    pub fn id(self) -> &'static str {
        match self {
            Rule::InteractionDisabled => "0",
            Rule::SelfAssistantMessage => "1a",
            Rule::SelfCommandOutput => "1b",
            Rule::SelfMessage => "1c",
            Rule::Addressed => "2",
            Rule::DirectMessage => "3",
            Rule::AssistantCrossTalk => "4",
            Rule::TriggerPermission => "5",
            Rule::Channel => "6",
            Rule::Default => "7",
        }
    }
}

/// The decision about one world event, with what it rested on: journaled, and shown in the
/// agent's status and the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Perception {
    /// What the NPC does with the event.
    pub verdict: Verdict,
    /// The rule that fired.
    pub rule: Rule,
    /// The trust given to the event's source, 0 to 1 (see [`NpcConfig::trust`]).
    pub trust: f64,
    /// `true` when the rule matched on a text heuristic (an `@key` found in the text because the
    /// server sent no mentions), not on the server's metadata.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub heuristic: bool,
    /// `true` when the rule said TRIGGER but the trust was below
    /// [`NpcConfig::trigger_min_trust`], so the event was kept as CONTEXT instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub downgraded: bool,
    /// A game-world limit on NPC↔NPC conversations that applied (`npc.conversation`): a TRIGGER
    /// from another NPC kept as CONTEXT (cap, cooldowns), or queued to trip the pair-loop breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limited: Option<ConversationLimit>,
}

/// Which game-world limit applied to a TRIGGER from another NPC (see [`ConversationConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConversationLimit {
    /// The conversation had its `max_exchanges`: kept as CONTEXT, the conversation is over.
    ConversationCap,
    /// One of the two NPCs left a conversation less than `cooldown_seconds` ago: kept as CONTEXT.
    Cooldown,
    /// These two NPCs ended a conversation less than `pair_cooldown_seconds` ago: kept as CONTEXT.
    PairCooldown,
    /// `loop_round_trips` round trips in a row brought no new content and no tool call: the event
    /// is queued, and the turn that takes it trips the pair-loop breaker (`SAFETY_LOCKOUT`).
    PairLoop,
}

impl ConversationLimit {
    /// The wire name (`conversation_cap`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ConversationLimit::ConversationCap => "conversation_cap",
            ConversationLimit::Cooldown => "cooldown",
            ConversationLimit::PairCooldown => "pair_cooldown",
            ConversationLimit::PairLoop => "pair_loop",
        }
    }
}

/// `[npc.conversation]`: the limits on NPC↔NPC conversations. A *conversation* is the run of
/// TRIGGERs between two NPCs (one NPC addressing or whispering to the other) with no gap longer
/// than `idle_seconds`; each TRIGGER is one *exchange*, and a *round trip* is an exchange each
/// way. The limits of the NPC that perceives an exchange apply to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConversationConfig {
    /// Exchanges a conversation may have; the one after is kept as CONTEXT and the conversation
    /// ends. 0 = no cap. Default 8.
    pub max_exchanges: u32,
    /// A gap without exchanges this long ends the conversation. Default 30.
    pub idle_seconds: f64,
    /// After a conversation ends, neither NPC starts another one (with anyone) for this long.
    /// Default 15.
    pub cooldown_seconds: f64,
    /// After a conversation ends, the same two NPCs do not start another one for this long.
    /// Default 60.
    pub pair_cooldown_seconds: f64,
    /// The pair-loop breaker trips after this many round trips in a row with no new content (every
    /// line already said by the pair) and no tool call by either NPC. 0 = off. Default 3.
    pub loop_round_trips: u32,
}

impl Default for ConversationConfig {
    fn default() -> Self {
        ConversationConfig {
            max_exchanges: 8,
            idle_seconds: 30.0,
            cooldown_seconds: 15.0,
            pair_cooldown_seconds: 60.0,
            loop_round_trips: 3,
        }
    }
}

/// An agent's own `npc.conversation` keys (see [`ConversationConfig`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConversationOverride {
    /// Replaces `npc.conversation.max_exchanges`.
    pub max_exchanges: Option<u32>,
    /// Replaces `npc.conversation.idle_seconds`.
    pub idle_seconds: Option<f64>,
    /// Replaces `npc.conversation.cooldown_seconds`.
    pub cooldown_seconds: Option<f64>,
    /// Replaces `npc.conversation.pair_cooldown_seconds`.
    pub pair_cooldown_seconds: Option<f64>,
    /// Replaces `npc.conversation.loop_round_trips`.
    pub loop_round_trips: Option<u32>,
}

/// Trust per source, 0 to 1 (`[npc.trust]`). Defaults from design 001.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustConfig {
    /// A whisper or page. Default 0.9.
    pub whisper: f64,
    /// Addressed by the server's mentions. Default 0.7.
    pub addressed: f64,
    /// A channel message. Default 0.6.
    pub channel: f64,
    /// Said in the room. Default 0.4.
    pub say: f64,
    /// An emote or pose. Default 0.3.
    pub emote: f64,
    /// A system message. Default 0.2.
    pub system: f64,
    /// A decision resting on a text heuristic (an `@key` in the text, the server having sent no
    /// mentions) caps the trust at this. Default 0.5 (= the default `trigger_min_trust`: being
    /// addressed in the text still triggers; set it lower to require the server's mentions).
    pub heuristic: f64,
    /// The speaker's kind is unknown: caps the trust at this. Default 0.2.
    pub unknown_speaker: f64,
}

impl Default for TrustConfig {
    fn default() -> Self {
        TrustConfig {
            whisper: 0.9,
            addressed: 0.7,
            channel: 0.6,
            say: 0.4,
            emote: 0.3,
            system: 0.2,
            heuristic: 0.5,
            unknown_speaker: 0.2,
        }
    }
}

/// What a configured channel's messages do (`[npc.channels]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelMode {
    /// Every message on it triggers the NPC (if its trust allows).
    Trigger,
    /// Messages are context.
    Context,
    /// Messages are dropped.
    Ignore,
}

/// `[npc]`: how NPC agents perceive world events. Per-agent overrides in a team file replace the
/// keys they set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NpcConfig {
    /// Rule 0: `false` ignores every world event. Default true.
    pub interaction_enabled: bool,
    /// Rule 2: whether being addressed (`@key`) triggers. Default true.
    pub enable_addressing: bool,
    /// Rule 5: speaker ids whose messages trigger the NPC. Only a `player` or `system` speaker as
    /// the server identifies it can match; a name in the text never does. Default empty.
    pub trigger_permissions: Vec<String>,
    /// Rule 6: channel name → what its messages do. Default empty.
    pub channels: BTreeMap<String, ChannelMode>,
    /// A TRIGGER whose trust is below this is kept as CONTEXT instead (recorded as downgraded): a
    /// low-trust source never starts a turn. 0 to 1. Default 0.5.
    pub trigger_min_trust: f64,
    /// Trust per source.
    pub trust: TrustConfig,
    /// The context buffer keeps at most this many events (the oldest are dropped). 1 to 10,000.
    /// Default 50.
    pub context_max_events: usize,
    /// … and at most this many estimated tokens (about 4 characters each). 1 to 1,000,000.
    /// Default 2,000.
    pub context_max_tokens: usize,
    /// Limits on NPC↔NPC conversations.
    pub conversation: ConversationConfig,
    /// `[npc.tick]`: autonomous ticks (off by default).
    pub tick: TickConfig,
    /// `[npc.sleep]`: the sleep schedule, in game time (off by default).
    pub sleep: SleepConfig,
    /// `[npc.clock]`: the game clock the sleep schedule reads. One clock per team: only the team's
    /// `[npc.clock]` counts (an agent's own settings cannot move it).
    pub clock: ClockConfig,
    /// Whether an IGNORE verdict is journaled (`perceived`, one row per NPC per line). Default
    /// true. `false`: IGNOREs are counted (the status's `npc.ignored_unjournaled`) but not
    /// journaled, so room chatter heard by many NPCs does not cost a journal row per listener;
    /// every other verdict is journaled as before.
    pub journal_ignored: bool,
}

/// `[npc.tick]`: autonomous ticks — a turn with no new event, every `rate` seconds while the NPC
/// is awake. Opt-in: an agent with `enabled = false` (the default) never spends a token on a tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TickConfig {
    /// Whether the team's tick arbiter ticks this agent. Default false.
    pub enabled: bool,
    /// Seconds (real time) between ticks while awake. 0.1 to 86,400. Default 5 (design 001).
    pub rate: f64,
    /// Seconds between ticks while no player is in the NPC's room (mode `idle`); 0 = no ticks.
    /// 0, or 0.1 to 86,400. Default 0.
    pub idle_rate: f64,
    /// The NPC's room, for the no-player rule. `None`: the room of the last world event it
    /// perceived that named one. Default none.
    pub room: Option<String>,
    /// A TRIGGER keeps the NPC awake (awake rate, whatever the sleep schedule and the room's
    /// presence say) for this many seconds of real time. 0 to 86,400. Default 300.
    pub wake_seconds: f64,
}

impl Default for TickConfig {
    fn default() -> Self {
        TickConfig {
            enabled: false,
            rate: 5.0,
            idle_rate: 0.0,
            room: None,
            wake_seconds: 300.0,
        }
    }
}

/// `[npc.sleep]`: the hours of game time an NPC sleeps (mode `asleep`: a slower tick rate, or none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SleepConfig {
    /// Whether the NPC sleeps at all. Default false (design 001).
    pub enabled: bool,
    /// The game hour sleep starts. 0 to 23. Default 2.
    pub start_hour: u32,
    /// How many game hours it sleeps (across midnight if need be). 1 to 23. Default 4.
    pub duration_hours: u32,
    /// Seconds (real time) between ticks while asleep; 0 = no ticks. 0, or 0.1 to 86,400.
    /// Default 60.
    pub tick_rate: f64,
}

impl Default for SleepConfig {
    fn default() -> Self {
        SleepConfig {
            enabled: false,
            start_hour: 2,
            duration_hours: 4,
            tick_rate: 60.0,
        }
    }
}

/// `[npc.clock]`: game time. At team start the game hour is `start_hour`, and it runs `speed` game
/// seconds per real second; the host may set it (`Supervisor::set_game_hour`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockConfig {
    /// The game hour when the team starts, 0 to 24 (exclusive; fractions are minutes). Default 8.
    pub start_hour: f64,
    /// Game seconds per real second. 0.001 to 1,000,000. Default 1 (game time is real time).
    pub speed: f64,
}

impl Default for ClockConfig {
    fn default() -> Self {
        ClockConfig {
            start_hour: 8.0,
            speed: 1.0,
        }
    }
}

/// What an NPC's tick schedule is doing now (shown in its status, journaled when it changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NpcMode {
    /// Ticking at `npc.tick.rate`.
    #[default]
    Awake,
    /// In its sleep hours: `npc.sleep.tick_rate`, or no ticks.
    Asleep,
    /// No player in its room: `npc.tick.idle_rate`, or no ticks.
    Idle,
}

impl NpcMode {
    /// The wire name (`awake`, `asleep`, `idle`).
    pub fn as_str(self) -> &'static str {
        match self {
            NpcMode::Awake => "awake",
            NpcMode::Asleep => "asleep",
            NpcMode::Idle => "idle",
        }
    }
}

impl std::fmt::Display for NpcMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Default for NpcConfig {
    fn default() -> Self {
        NpcConfig {
            interaction_enabled: true,
            enable_addressing: true,
            trigger_permissions: Vec::new(),
            channels: BTreeMap::new(),
            trigger_min_trust: 0.5,
            trust: TrustConfig::default(),
            context_max_events: 50,
            context_max_tokens: 2_000,
            conversation: ConversationConfig::default(),
            tick: TickConfig::default(),
            sleep: SleepConfig::default(),
            clock: ClockConfig::default(),
            journal_ignored: true,
        }
    }
}

impl NpcConfig {
    /// Checks every value's range.
    ///
    /// # Errors
    ///
    /// The first value out of range, as [`crate::ConfigError::Invalid`] (key, value, what is
    /// allowed).
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let unit = |key: &'static str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(crate::ConfigError::Invalid {
                    key: key.into(),
                    value: value.to_string(),
                    allowed: "a number from 0 to 1",
                })
            }
        };
        unit("npc.trigger_min_trust", self.trigger_min_trust)?;
        let t = &self.trust;
        unit("npc.trust.whisper", t.whisper)?;
        unit("npc.trust.addressed", t.addressed)?;
        unit("npc.trust.channel", t.channel)?;
        unit("npc.trust.say", t.say)?;
        unit("npc.trust.emote", t.emote)?;
        unit("npc.trust.system", t.system)?;
        unit("npc.trust.heuristic", t.heuristic)?;
        unit("npc.trust.unknown_speaker", t.unknown_speaker)?;
        let range = |key: &'static str, value: usize, max: usize, allowed: &'static str| {
            if (1..=max).contains(&value) {
                Ok(())
            } else {
                Err(crate::ConfigError::Invalid {
                    key: key.into(),
                    value: value.to_string(),
                    allowed,
                })
            }
        };
        range(
            "npc.context_max_events",
            self.context_max_events,
            10_000,
            "1 to 10000",
        )?;
        range(
            "npc.context_max_tokens",
            self.context_max_tokens,
            1_000_000,
            "1 to 1000000",
        )?;
        let c = &self.conversation;
        let seconds = |key: &'static str, value: f64| {
            if value.is_finite() && (0.0..=86_400.0).contains(&value) {
                Ok(())
            } else {
                Err(crate::ConfigError::Invalid {
                    key: key.into(),
                    value: value.to_string(),
                    allowed: "seconds from 0 to 86400",
                })
            }
        };
        seconds("npc.conversation.idle_seconds", c.idle_seconds)?;
        seconds("npc.conversation.cooldown_seconds", c.cooldown_seconds)?;
        seconds(
            "npc.conversation.pair_cooldown_seconds",
            c.pair_cooldown_seconds,
        )?;
        let count = |key: &'static str, value: u32, allowed: &'static str| {
            if value <= 10_000 {
                Ok(())
            } else {
                Err(crate::ConfigError::Invalid {
                    key: key.into(),
                    value: value.to_string(),
                    allowed,
                })
            }
        };
        count(
            "npc.conversation.max_exchanges",
            c.max_exchanges,
            "0 (no cap) to 10000",
        )?;
        count(
            "npc.conversation.loop_round_trips",
            c.loop_round_trips,
            "0 (off) to 10000",
        )?;
        self.validate_ticks()
    }

    fn validate_ticks(&self) -> Result<(), crate::ConfigError> {
        let invalid = |key: &'static str, value: String, allowed: &'static str| {
            Err(crate::ConfigError::Invalid {
                key: key.into(),
                value,
                allowed,
            })
        };
        let seconds = |key: &'static str, value: f64, zero: bool| {
            if (0.1..=86_400.0).contains(&value) || (zero && value == 0.0) {
                Ok(())
            } else if zero {
                invalid(
                    key,
                    value.to_string(),
                    "0 (no ticks), or a number of seconds from 0.1 to 86400",
                )
            } else {
                invalid(
                    key,
                    value.to_string(),
                    "a number of seconds from 0.1 to 86400",
                )
            }
        };
        let (tick, sleep, clock) = (&self.tick, &self.sleep, &self.clock);
        seconds("npc.tick.rate", tick.rate, false)?;
        seconds("npc.tick.idle_rate", tick.idle_rate, true)?;
        if !(0.0..=86_400.0).contains(&tick.wake_seconds) {
            invalid(
                "npc.tick.wake_seconds",
                tick.wake_seconds.to_string(),
                "a number of seconds from 0 to 86400",
            )?;
        }
        if sleep.start_hour > 23 {
            invalid(
                "npc.sleep.start_hour",
                sleep.start_hour.to_string(),
                "an hour from 0 to 23",
            )?;
        }
        if !(1..=23).contains(&sleep.duration_hours) {
            invalid(
                "npc.sleep.duration_hours",
                sleep.duration_hours.to_string(),
                "1 to 23 hours",
            )?;
        }
        seconds("npc.sleep.tick_rate", sleep.tick_rate, true)?;
        if !(0.0..24.0).contains(&clock.start_hour) {
            invalid(
                "npc.clock.start_hour",
                clock.start_hour.to_string(),
                "an hour from 0 to 24 (24 excluded)",
            )?;
        }
        if !(0.001..=1_000_000.0).contains(&clock.speed) {
            invalid(
                "npc.clock.speed",
                clock.speed.to_string(),
                "game seconds per real second, from 0.001 to 1000000",
            )?;
        }
        Ok(())
    }
}

/// An agent's own `npc` keys in a team file (`[[agents]] npc = { … }`): each key set replaces the
/// team's `[npc]` value, the rest are the team's.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NpcOverride {
    /// Replaces `npc.interaction_enabled`.
    pub interaction_enabled: Option<bool>,
    /// Replaces `npc.enable_addressing`.
    pub enable_addressing: Option<bool>,
    /// Replaces `npc.trigger_permissions`.
    pub trigger_permissions: Option<Vec<String>>,
    /// Replaces `npc.channels` (the whole table).
    pub channels: Option<BTreeMap<String, ChannelMode>>,
    /// Replaces `npc.trigger_min_trust`.
    pub trigger_min_trust: Option<f64>,
    /// Replaces the trust values it sets.
    pub trust: TrustOverride,
    /// Replaces `npc.context_max_events`.
    pub context_max_events: Option<usize>,
    /// Replaces `npc.context_max_tokens`.
    pub context_max_tokens: Option<usize>,
    /// Replaces the conversation limits it sets.
    pub conversation: ConversationOverride,
    /// Replaces the `npc.tick` values it sets.
    pub tick: TickOverride,
    /// Replaces the `npc.sleep` values it sets.
    pub sleep: SleepOverride,
    /// Replaces `npc.journal_ignored`.
    pub journal_ignored: Option<bool>,
}

/// The tick values an agent sets for itself (see [`TickConfig`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TickOverride {
    /// Replaces `npc.tick.enabled`.
    pub enabled: Option<bool>,
    /// Replaces `npc.tick.rate`.
    pub rate: Option<f64>,
    /// Replaces `npc.tick.idle_rate`.
    pub idle_rate: Option<f64>,
    /// Replaces `npc.tick.room`.
    pub room: Option<String>,
    /// Replaces `npc.tick.wake_seconds`.
    pub wake_seconds: Option<f64>,
}

/// The sleep values an agent sets for itself (see [`SleepConfig`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SleepOverride {
    /// Replaces `npc.sleep.enabled`.
    pub enabled: Option<bool>,
    /// Replaces `npc.sleep.start_hour`.
    pub start_hour: Option<u32>,
    /// Replaces `npc.sleep.duration_hours`.
    pub duration_hours: Option<u32>,
    /// Replaces `npc.sleep.tick_rate`.
    pub tick_rate: Option<f64>,
}

/// The trust values an agent sets for itself (see [`TrustConfig`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustOverride {
    /// Replaces `npc.trust.whisper`.
    pub whisper: Option<f64>,
    /// Replaces `npc.trust.addressed`.
    pub addressed: Option<f64>,
    /// Replaces `npc.trust.channel`.
    pub channel: Option<f64>,
    /// Replaces `npc.trust.say`.
    pub say: Option<f64>,
    /// Replaces `npc.trust.emote`.
    pub emote: Option<f64>,
    /// Replaces `npc.trust.system`.
    pub system: Option<f64>,
    /// Replaces `npc.trust.heuristic`.
    pub heuristic: Option<f64>,
    /// Replaces `npc.trust.unknown_speaker`.
    pub unknown_speaker: Option<f64>,
}

impl NpcOverride {
    /// `base` with the keys this sets replaced (validate the result: [`NpcConfig::validate`]).
    pub fn apply(&self, base: &NpcConfig) -> NpcConfig {
        let mut npc = base.clone();
        let set = |slot: &mut f64, value: Option<f64>| {
            if let Some(value) = value {
                *slot = value;
            }
        };
        if let Some(v) = self.interaction_enabled {
            npc.interaction_enabled = v;
        }
        if let Some(v) = self.enable_addressing {
            npc.enable_addressing = v;
        }
        if let Some(v) = &self.trigger_permissions {
            npc.trigger_permissions = v.clone();
        }
        if let Some(v) = &self.channels {
            npc.channels = v.clone();
        }
        set(&mut npc.trigger_min_trust, self.trigger_min_trust);
        let (t, o) = (&mut npc.trust, &self.trust);
        set(&mut t.whisper, o.whisper);
        set(&mut t.addressed, o.addressed);
        set(&mut t.channel, o.channel);
        set(&mut t.say, o.say);
        set(&mut t.emote, o.emote);
        set(&mut t.system, o.system);
        set(&mut t.heuristic, o.heuristic);
        set(&mut t.unknown_speaker, o.unknown_speaker);
        if let Some(v) = self.context_max_events {
            npc.context_max_events = v;
        }
        if let Some(v) = self.context_max_tokens {
            npc.context_max_tokens = v;
        }
        if let Some(v) = self.journal_ignored {
            npc.journal_ignored = v;
        }
        let (c, o) = (&mut npc.conversation, &self.conversation);
        if let Some(v) = o.max_exchanges {
            c.max_exchanges = v;
        }
        set(&mut c.idle_seconds, o.idle_seconds);
        set(&mut c.cooldown_seconds, o.cooldown_seconds);
        set(&mut c.pair_cooldown_seconds, o.pair_cooldown_seconds);
        if let Some(v) = o.loop_round_trips {
            c.loop_round_trips = v;
        }
        let (t, o) = (&mut npc.tick, &self.tick);
        if let Some(v) = o.enabled {
            t.enabled = v;
        }
        set(&mut t.rate, o.rate);
        set(&mut t.idle_rate, o.idle_rate);
        if let Some(v) = &o.room {
            t.room = Some(v.clone());
        }
        set(&mut t.wake_seconds, o.wake_seconds);
        let (s, o) = (&mut npc.sleep, &self.sleep);
        if let Some(v) = o.enabled {
            s.enabled = v;
        }
        if let Some(v) = o.start_hour {
            s.start_hour = v;
        }
        if let Some(v) = o.duration_hours {
            s.duration_hours = v;
        }
        set(&mut s.tick_rate, o.tick_rate);
        npc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_event_reads_from_json_with_defaults_for_what_the_server_left_out() {
        let event: WorldEvent = serde_json::from_str(
            r#"{"speaker": {"id": "p1", "kind": "player"}, "kind": "say", "text": "hello"}"#,
        )
        .unwrap();
        assert_eq!(event.speaker.kind, SpeakerKind::Player);
        assert_eq!(event.mentions, None);
        assert_eq!(event.oob, Oob::default());
        let unknown: Result<WorldEvent, _> = serde_json::from_str(
            r#"{"speaker": {"id": "p1"}, "kind": "say", "text": "x", "trust": 1.0}"#,
        );
        assert!(unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `trust`"));
    }

    #[test]
    fn an_override_replaces_only_the_keys_it_sets() {
        let mut team = NpcConfig {
            trigger_permissions: vec!["gm".into()],
            ..NpcConfig::default()
        };
        team.trust.say = 0.45;
        let own: NpcOverride =
            serde_json::from_str(r#"{"interaction_enabled": false, "trust": {"whisper": 0.8}}"#)
                .unwrap();
        let npc = own.apply(&team);
        assert!(!npc.interaction_enabled);
        assert_eq!((npc.trust.whisper, npc.trust.say), (0.8, 0.45));
        assert_eq!(npc.trigger_permissions, ["gm"]);
        assert_eq!(NpcOverride::default().apply(&team), team);
    }

    #[test]
    fn npc_values_out_of_range_are_named() {
        let mut config = NpcConfig::default();
        config.validate().unwrap();
        config.trust.say = 1.5;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.trust.say`: 1.5 (allowed: a number from 0 to 1)"
        );
        let config = NpcConfig {
            context_max_events: 0,
            ..NpcConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.context_max_events`: 0 (allowed: 1 to 10000)"
        );
        let mut config = NpcConfig::default();
        config.conversation.pair_cooldown_seconds = f64::NAN;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.conversation.pair_cooldown_seconds`: NaN (allowed: seconds \
             from 0 to 86400)"
        );
        let mut config = NpcConfig::default();
        config.conversation.max_exchanges = 10_001;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.conversation.max_exchanges`: 10001 (allowed: 0 (no cap) to \
             10000)"
        );
        let mut config = NpcConfig::default();
        config.tick.rate = 0.0;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.tick.rate`: 0 (allowed: a number of seconds from 0.1 to 86400)"
        );
        let mut config = NpcConfig::default();
        config.sleep.tick_rate = 0.05;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.sleep.tick_rate`: 0.05 (allowed: 0 (no ticks), or a number of \
             seconds from 0.1 to 86400)"
        );
        config.sleep.tick_rate = 0.0;
        config.sleep.duration_hours = 24;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.sleep.duration_hours`: 24 (allowed: 1 to 23 hours)"
        );
        let mut config = NpcConfig::default();
        config.clock.start_hour = 24.0;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid value for `npc.clock.start_hour`: 24 (allowed: an hour from 0 to 24 (24 \
             excluded))"
        );
    }

    #[test]
    fn an_override_sets_tick_and_sleep_keys_and_ticks_are_off_by_default() {
        let team = NpcConfig::default();
        assert!(!team.tick.enabled && !team.sleep.enabled);
        let own: NpcOverride = serde_json::from_str(
            r#"{"tick": {"enabled": true, "room": "forge"}, "sleep": {"tick_rate": 0}}"#,
        )
        .unwrap();
        let npc = own.apply(&team);
        assert!(npc.tick.enabled);
        assert_eq!(npc.tick.room.as_deref(), Some("forge"));
        assert_eq!((npc.tick.rate, npc.sleep.tick_rate), (5.0, 0.0));
        assert_eq!(npc.sleep.start_hour, 2);
        npc.validate().unwrap();
    }
}
