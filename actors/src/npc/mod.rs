//! NPC agents for game worlds: how an NPC perceives [`WorldEvent`]s.
//!
//! * [`classify`] — design 001's eight rules, in order, first match wins: TRIGGER (queue it as
//!   work), CONTEXT (keep it in the [`ContextBuffer`]), CAPTURE (its own command's output), IGNORE.
//!   Server metadata first, text heuristics only as a fallback, and every decision carries its rule
//!   and the trust its source earned ([`Perception`]).
//! * [`ContextBuffer`] — CONTEXT events, bounded in events and tokens, folded into the next turn as
//!   one message; never starts a turn.
//! * `conversation` — the game-world limits on NPC↔NPC conversations (exchanges per conversation,
//!   cooldowns, the pair-loop breaker), applied to a TRIGGER from another NPC after classification.
//! * `tick` — the team's tick arbiter: autonomous ticks of every ticking NPC from one timer task,
//!   the collision guard, the game clock, the sleep schedule and the no-player rule ([`TickReport`]).
//!
//! The types that cross boundaries (the event, the verdict, `[npc]`) are in
//! `warden_protocols::npc`.
//!
//! [`WorldEvent`]: warden_protocols::npc::WorldEvent
//! [`Perception`]: warden_protocols::npc::Perception

mod classify;
mod context;
pub(crate) mod conversation;
pub(crate) mod tick;

pub use classify::classify;
pub use context::ContextBuffer;
pub(crate) use context::{name, quote};
pub use tick::TickReport;
