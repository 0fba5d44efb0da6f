//! World events: the classification journaled with its rule and trust, the context buffer, its
//! side of the tick arbiter, and what the status shows of them.

use super::*;
use crate::npc::{classify, tick::Ticking, ContextBuffer};
use warden_protocols::{
    npc::{Perception, Verdict, WorldEvent},
    NpcStatus,
};

/// An NPC's perception state (created by its first world event).
#[derive(Debug)]
pub(crate) struct NpcState {
    buffer: ContextBuffer,
    perceived: u64,
    last: Option<Perception>,
}

impl AgentCell {
    /// Classifies `event` (`[npc]` of this agent), journals the decision (`Perceived`) and keeps a
    /// CONTEXT or CAPTURE event in the context buffer. A TRIGGER is for the caller to queue.
    pub(crate) fn perceive(&self, event: &WorldEvent) -> Perception {
        let config = &self.settings.npc;
        let mut slot = self.npc.lock();
        let state = slot.get_or_insert_with(|| {
            Box::new(NpcState {
                buffer: ContextBuffer::new(config.context_max_events, config.context_max_tokens),
                perceived: 0,
                last: None,
            })
        });
        // Capturing a command's output is not modelled yet: rule 1b never fires (1c does).
        let perception = classify(self.key.as_str(), event, config, false);
        if matches!(perception.verdict, Verdict::Context | Verdict::Capture) {
            state.buffer.push(event);
        }
        state.perceived += 1;
        state.last = Some(perception.clone());
        drop(slot);
        self.note(EventKind::Perceived {
            event: event.clone(),
            perception: perception.clone(),
        });
        perception
    }

    /// The context buffer's events as one message for the turn that starts now (`None`: empty).
    pub(crate) fn take_context(&self) -> Option<ChatMessage> {
        self.npc.lock().as_mut()?.buffer.take_message()
    }

    /// Its side of the team's tick arbiter, while it ticks.
    pub(crate) fn ticking(&self) -> Option<Arc<Ticking>> {
        self.ticking.lock().clone()
    }

    /// Scheduled by the tick arbiter from now on (`None`: no longer).
    pub(crate) fn set_ticking(&self, ticking: Option<Arc<Ticking>>) -> Option<Arc<Ticking>> {
        std::mem::replace(&mut *self.ticking.lock(), ticking)
    }

    /// The arbiter's tick left the ordinary lane: taken by a turn, refused, or discarded.
    pub(crate) fn tick_left_lane(&self) {
        if let Some(ticking) = self.ticking() {
            ticking.left_lane();
        }
    }

    pub(super) fn npc_status(&self) -> Option<NpcStatus> {
        let tick = self.ticking().map(|t| t.status());
        let slot = self.npc.lock();
        let state = slot.as_deref();
        if state.is_none() && tick.is_none() {
            return None;
        }
        Some(NpcStatus {
            perceived: state.map_or(0, |s| s.perceived),
            last: state.and_then(|s| s.last.clone()),
            context_buffered: state.map_or(0, |s| s.buffer.len()),
            context_dropped: state.map_or(0, |s| s.buffer.dropped()),
            tick,
        })
    }
}
