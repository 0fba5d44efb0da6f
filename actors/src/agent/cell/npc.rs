//! World events: the classification journaled with its rule and trust, the context buffer, its
//! side of the tick arbiter, and what the status shows of them.

use super::*;
use crate::npc::{classify, conversation::Exchange, tick::Ticking, ContextBuffer};
use warden_protocols::{
    npc::{ConversationLimit, Perception, SpeakerKind, Verdict, WorldEvent},
    NpcStatus,
};

/// An NPC's perception state (created by its first world event).
#[derive(Debug)]
pub(crate) struct NpcState {
    buffer: ContextBuffer,
    /// The output of its own commands while a tool call runs (rule 1b), for that call's turn.
    captured: ContextBuffer,
    perceived: u64,
    last: Option<Perception>,
    /// TRIGGERs from other NPCs that a conversation limit kept as CONTEXT.
    limited: u64,
    /// IGNOREs not journaled (`npc.journal_ignored = false`).
    ignored_unjournaled: u64,
    /// The pair-loop breaker tripped on a perceived exchange: the reason, for the turn that takes
    /// it (a trip is `EXECUTING → SAFETY_LOCKOUT`).
    pair_loop: Option<String>,
}

/// A CONTEXT kept for memory sends a `Remember` signal when it makes this many waiting (and every
/// multiple): fewer wait for the next turn or memory reader, settled as of when they were heard.
pub(crate) const REMIND_EVERY: usize = 16;

/// How many perceptions may wait for the actor, per write `memory.writes_per_minute` allows (see
/// `AgentCell::perceive`): two minutes' admissions, so that the lines a speaker's cap refuses do
/// not crowd out the others while the actor catches up.
pub(crate) const MAX_WAITING_PER_WRITE: usize = 2;

/// An agent's side of the world: its perception state from its first world event on (boxed: most
/// agents never perceive one, and an idle agent's size counts), and its side of the team's tick
/// arbiter while it is scheduled (`npc.tick.enabled`). One lock for both (a leaf).
#[derive(Default)]
pub(crate) struct NpcSlot {
    state: Option<Box<NpcState>>,
    ticking: Option<Arc<Ticking>>,
}

impl AgentCell {
    /// Classifies `event` (`[npc]` of this agent), journals the decision (`Perceived`) and keeps a
    /// CONTEXT or CAPTURE event in the context buffer. A TRIGGER is for the caller to queue.
    /// With long-term memory, a TRIGGER or CONTEXT is kept for memory in the same `perceived`
    /// (the second value), and admitted within the rate caps and written by the agent's actor —
    /// never here, on the caller's thread, which a game host's tick waits on — as of when it was
    /// heard (the instant noted in the record). A CONTEXT waits for the next turn, a memory
    /// reader, or the line that makes [`REMIND_EVERY`] waiting, which sends a `Remember` signal
    /// (the third value). A TRIGGER sends none, its own turn writes first
    /// (`turn::take`), and whatever keeps that turn from starting writes or reminds instead —
    /// the caller when it cannot queue the TRIGGER ([`super::super::AgentHandle`]'s
    /// `perceive_cow`), a halt that clears it ([`AgentCell::remind_after_clearing`]), a refusal
    /// when the actor takes it (`on_work`). docs/design-decisions.md, "Who writes an observation".
    pub(crate) fn perceive(&self, event: &WorldEvent) -> (Perception, bool, bool) {
        let config = &self.settings.npc;
        let mut slot = self.npc.lock();
        let state = slot.state.get_or_insert_with(|| {
            Box::new(NpcState {
                buffer: ContextBuffer::new(config.context_max_events, config.context_max_tokens),
                captured: ContextBuffer::new(config.context_max_events, config.context_max_tokens),
                perceived: 0,
                last: None,
                limited: 0,
                ignored_unjournaled: 0,
                pair_loop: None,
            })
        });
        // Rule 1b: while one of its tool calls runs (the command a game-command tool asked the
        // server to run), its own command output is captured for the turn.
        let capturing = self.tools_in_flight() > 0;
        let mut perception = classify(self.key.as_str(), event, config, capturing);
        // Another NPC's TRIGGER is an exchange of a conversation: the game-world limits apply.
        if perception.verdict == Verdict::Trigger
            && event.speaker.kind == SpeakerKind::Npc
            && event.speaker.id != self.key.as_str()
        {
            let exchange = self.safety.conversations.exchange(
                self.key.as_str(),
                &event.speaker.id,
                &event.text,
                &config.conversation,
                tokio::time::Instant::now(),
            );
            match exchange {
                Exchange::Allowed => {}
                Exchange::Limited(limit) => {
                    perception.verdict = Verdict::Context;
                    perception.limited = Some(limit);
                    state.limited += 1;
                }
                Exchange::Loop(reason) => {
                    perception.limited = Some(ConversationLimit::PairLoop);
                    if self.safety.checks {
                        tracing::warn!(agent = %self.key, %reason, "pair loop");
                        state.pair_loop = Some(reason);
                    }
                }
            }
        }
        match perception.verdict {
            Verdict::Context => state.buffer.push(event),
            Verdict::Capture => state.captured.push_output(event),
            Verdict::Trigger | Verdict::Ignore => {}
        }
        state.perceived += 1;
        state.last = Some(perception.clone());
        // `npc.journal_ignored = false`: an IGNORE is counted, not journaled (room chatter would
        // cost a row per listener). Every other verdict is journaled.
        if perception.verdict == Verdict::Ignore && !config.journal_ignored {
            state.ignored_unjournaled += 1;
            return (perception, false, false);
        }
        drop(slot);
        // Long-term memory: a TRIGGER or CONTEXT is kept for memory in its `perceived` row (so a
        // crash before the write loses nothing acknowledged); the agent's actor decides the rest.
        let mut observe = self.observe(event, &perception);
        let mut rec = self.lock();
        let waiting = match observe {
            Some(_) => rec.memory().map_or(0, |s| s.unwritten.len()),
            None => 0,
        };
        // An actor that lags behind a flood: past `MAX_WAITING_PER_WRITE ×
        // memory.writes_per_minute` waiting (two minutes' admissions), a line is heard,
        // not kept — as a line past a rate cap — so the record and the host's thread pay
        // nothing more for it.
        let most =
            (self.settings.memory.writes_per_minute as usize).saturating_mul(MAX_WAITING_PER_WRITE);
        if waiting >= most.max(REMIND_EVERY) {
            observe = None;
        }
        let perceived = EventKind::Perceived {
            event: event.clone(),
            perception: perception.clone(),
            observe,
        };
        self.emit(&mut rec, perceived);
        if observe.is_some() {
            // When it was heard: the actor applies the caps and the memory time as of then,
            // however late it settles it (one clock reading, no lock but the record's).
            rec.heard(tokio::time::Instant::now().into_std());
        }
        // Queued under the record lock, after the perception is in `unwritten`: the actor's
        // write drains under it too, so a waiting perception always has a writer on its way.
        // A TRIGGER's writer is its own turn (see above): a second wake of the actor for the
        // same delivery would cost the host's thread a mailbox push and buy nothing. A CONTEXT
        // asks only when it makes `REMIND_EVERY` waiting (and every multiple): until then its
        // lines wait for the next turn, memory reader or reminder — settled as of when they
        // were heard — so a room's chatter does not wake the NPC's actor line by line.
        let reminded = observe.is_some()
            && perception.verdict != Verdict::Trigger
            && (waiting + 1) % REMIND_EVERY == 0
            && self.remind();
        drop(rec);
        (perception, observe.is_some(), reminded)
    }

    /// Asks the actor to settle the perceptions kept for memory (a `Remember` signal, lane 2, which
    /// never refuses but when the team is shut down: then nothing is lost, the journal has them).
    /// Whether it was queued.
    pub(crate) fn remind(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        if crate::test_hooks::remember_withheld(&self.key) {
            return false;
        }
        self.mailbox
            .try_send(AgentMsg::Signal(crate::agent::Signal::Remember))
            .is_ok()
    }

    /// A halt cleared the ordinary lane (`cleared` messages) under the record
    /// lock `rec`: a TRIGGER among them was the writer of the perceptions kept for memory
    /// (it sent no `Remember`), so the actor is asked to write what waits. Whether it was asked.
    pub(crate) fn remind_after_clearing(&self, rec: &AgentRecord, cleared: usize) -> bool {
        cleared > 0 && rec.memory().is_some_and(|s| !s.unwritten.is_empty()) && self.remind()
    }

    /// The output of its commands captured while its tool calls ran, as one message for the turn
    /// (`None`: nothing captured).
    pub(crate) fn take_captured(&self) -> Option<ChatMessage> {
        self.npc.lock().state.as_mut()?.captured.take_output()
    }

    /// The reason of a pair-loop trip perceived since the last turn took it (see
    /// `npc::conversation`).
    pub(crate) fn take_pair_loop(&self) -> Option<String> {
        self.npc.lock().state.as_mut()?.pair_loop.take()
    }

    /// A tool call of this agent finished: if it is an NPC, its conversations made progress.
    pub(crate) fn npc_tool_finished(&self) {
        if self.npc.lock().state.is_some() {
            self.safety.conversations.tool_finished(self.key.as_str());
        }
    }

    /// The context buffer's events as one message for the turn that starts now (`None`: empty).
    pub(crate) fn take_context(&self) -> Option<ChatMessage> {
        self.npc.lock().state.as_mut()?.buffer.take_message()
    }

    /// Its side of the team's tick arbiter, while it ticks.
    pub(crate) fn ticking(&self) -> Option<Arc<Ticking>> {
        self.npc.lock().ticking.clone()
    }

    /// Scheduled by the tick arbiter from now on (`None`: no longer).
    pub(crate) fn set_ticking(&self, ticking: Option<Arc<Ticking>>) -> Option<Arc<Ticking>> {
        std::mem::replace(&mut self.npc.lock().ticking, ticking)
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
        let state = slot.state.as_deref();
        if state.is_none() && tick.is_none() {
            return None;
        }
        Some(NpcStatus {
            perceived: state.map_or(0, |s| s.perceived),
            last: state.and_then(|s| s.last.clone()),
            context_buffered: state.map_or(0, |s| s.buffer.len()),
            context_dropped: state.map_or(0, |s| s.buffer.dropped()),
            conversation_limited: state.map_or(0, |s| s.limited),
            ignored_unjournaled: state.map_or(0, |s| s.ignored_unjournaled),
            tick,
        })
    }
}
