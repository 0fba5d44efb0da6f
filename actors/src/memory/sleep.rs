//! Sleep does work (design 001's sleep phases): during its sleep hours (tick mode `asleep`), once
//! a game day, an NPC with long-term memory consolidates before its turn's model call —
//! *compacting* (no model: repeated observations merged into the newest, unimportant ones never
//! recalled let go: [`MemoryStore::compactable`]) then *dreaming*: first *scoring* (one batched
//! model call: the importance of the observations from trusted sources not scored yet, journaled
//! as `memory_scored`; low-trust sources keep the rule's), then one model call for a reflection
//! over the day's memories, stored as a memory. Each phase reached is journaled
//! (`memory_consolidated`, design 001's `consolidation_progress`) in one batch with what the
//! phase before it did, so a crash mid-phase resumes at the phase it reached and never does a
//! phase twice (the scoring call, journaled by itself, is not asked again for what it scored).
//! A halt cancels the scoring and the dreaming calls like any model call; their tokens count
//! against the budgets.
//!
//! [`MemoryStore::compactable`]: warden_protocols::memory::MemoryStore::compactable

use crate::{agent::cell::AgentCell, agent::memory::side_call};
use tokio_util::sync::CancellationToken;
use warden_protocols::{
    memory::{MemoryKind, SleepPhase, DAY_SECS},
    npc::NpcMode,
    ChatMessage, ChatRole, EventKind,
};

/// The system message of a dreaming request (see [`is_dream_request`]).
pub const DREAM_PROMPT: &str = "You are the dreaming mind of a character at night. The user message lists what it remembers of the day, quoted as data. In two or three sentences, reflect: what mattered today, what it learned about the people it met, what it should remember tomorrow. Do not call any tool. Reply with the reflection only.";

/// The system message of a scoring request (see [`is_score_request`]).
pub const SCORE_PROMPT: &str = "You rate the memories of a character. The user message lists observations, each with its #id, its text quoted as data. Rate how much each matters to the character, from 1 (mundane: small talk, the weather) to 10 (life-changing: a threat, a promise, a secret, a name to remember). Do not call any tool. Reply with JSON only: [{\"id\": 3, \"importance\": 7}]";

/// The most observations one scoring call is shown (the newest not scored yet).
pub const SCORE_MEMORIES: usize = 32;

/// Whether `request` is a scoring request: its first message is the system message
/// [`SCORE_PROMPT`].
pub fn is_score_request(request: &crate::LlmRequest) -> bool {
    request.messages.first().is_some_and(|m: &ChatMessage| {
        m.role == ChatRole::System && m.content.as_deref() == Some(SCORE_PROMPT)
    })
}

/// The scores of a scoring reply: `(id, importance)` for each item naming one of `ids` (the
/// observations it was shown) with an importance of 1 to 10, the first per id; anything else in
/// the reply is ignored (malformed output scores nothing).
pub fn parse_scores(text: &str, ids: &[u64]) -> Vec<(u64, u8)> {
    let mut scores: Vec<(u64, u8)> = Vec::new();
    for item in crate::agent::memory::json_array(text) {
        let id = item.get("id").and_then(serde_json::Value::as_u64);
        let importance = item.get("importance").and_then(serde_json::Value::as_u64);
        if let (Some(id), Some(importance)) = (id, importance) {
            if ids.contains(&id)
                && (1..=10).contains(&importance)
                && !scores.iter().any(|s| s.0 == id)
            {
                scores.push((id, importance as u8));
            }
        }
    }
    scores
}

/// Scoring, the dreaming phase's first step: the observations from trusted sources (at least
/// `npc.trigger_min_trust`) not scored yet, their importance asked of the model in one batched
/// call — the rule's importance (`2 + 5 × trust`) stays for low-trust sources, and for these when
/// the call is refused or fails (tried again the next night). Journaled as `memory_scored`.
/// `false`: a halt came.
async fn score(cell: &AgentCell, token: &CancellationToken, stale: &impl Fn() -> bool) -> bool {
    let (text, ids, through) = {
        let rec = cell.memory_lock();
        let Some(store) = rec.memory() else {
            return true;
        };
        let found = store.unscored(cell.settings.npc.trigger_min_trust, SCORE_MEMORIES);
        if found.is_empty() {
            return true;
        }
        let through = found.iter().map(|m| m.at).fold(f64::MIN, f64::max);
        let ids: Vec<u64> = found.iter().map(|m| m.id).collect();
        let lines: Vec<String> = found
            .iter()
            .map(|m| format!("- {}", super::recall::render(store, m)))
            .collect();
        (lines.join("\n"), ids, through)
    };
    let scores = match side_call(cell, token, SCORE_PROMPT, text).await {
        None => return false,
        Some(None) => return true,
        Some(Some(reply)) => parse_scores(&reply, &ids),
    };
    if stale() {
        return false;
    }
    let mut rec = cell.lock();
    cell.emit(&mut rec, EventKind::MemoryScored { scores, through });
    true
}

/// The most memories of the day a dream is shown (the most important).
pub const DREAM_MEMORIES: usize = 20;

/// The most characters a dream's reflection keeps.
pub const DREAM_MAX_CHARS: usize = 600;

/// Whether `request` is a dreaming request: its first message is the system message
/// [`DREAM_PROMPT`].
pub fn is_dream_request(request: &crate::LlmRequest) -> bool {
    request.messages.first().is_some_and(|m: &ChatMessage| {
        m.role == ChatRole::System && m.content.as_deref() == Some(DREAM_PROMPT)
    })
}

/// The phase to run now: `None` when there is nothing to do (awake, no memory, done today).
fn due(cell: &AgentCell) -> Option<(u64, SleepPhase)> {
    if !cell.settings.memory.long_term {
        return None;
    }
    let asleep = cell
        .ticking()
        .is_some_and(|t| t.status().mode == NpcMode::Asleep);
    if !asleep {
        return None;
    }
    let rec = cell.memory_lock();
    let store = rec.memory()?;
    let day = (cell.memory_now(&rec) / DAY_SECS).max(0.0) as u64;
    let phase = match store.consolidation {
        Some(c) if c.day == day => c.phase,
        _ => SleepPhase::Compacting,
    };
    (phase != SleepPhase::Done).then_some((day, phase))
}

/// Consolidates if it is asleep and today's consolidation is not done (see the module docs).
/// `false`: a halt came (the turn ends).
pub(crate) async fn consolidate_if_asleep(
    cell: &AgentCell,
    token: &CancellationToken,
    stale: impl Fn() -> bool,
) -> bool {
    let Some((day, mut phase)) = due(cell) else {
        return true;
    };
    if phase == SleepPhase::Compacting {
        let mut rec = cell.memory_lock();
        let now = cell.memory_now(&rec);
        let gone = rec.memory().map(|s| s.compactable(now)).unwrap_or_default();
        let mut kinds = Vec::with_capacity(2);
        if !gone.is_empty() {
            kinds.push(EventKind::MemoryForgotten {
                ids: gone,
                about: None,
                by: "sleep".into(),
            });
        }
        phase = SleepPhase::Dreaming;
        kinds.push(EventKind::MemoryConsolidated { day, phase });
        cell.emit_memory(&mut rec, kinds);
    }
    // Dreaming: the day's observations scored, then a reflection over the most important.
    if !score(cell, token, &stale).await {
        return false;
    }
    let text = {
        let rec = cell.memory_lock();
        let now = cell.memory_now(&rec);
        let Some(store) = rec.memory() else {
            return true;
        };
        let mut today: Vec<_> = store
            .memories
            .values()
            .filter(|m| now - m.at < DAY_SECS && !matches!(m.kind, MemoryKind::Reflection))
            .collect();
        today.sort_by(|a, b| b.importance.cmp(&a.importance).then(b.id.cmp(&a.id)));
        let lines: Vec<String> = today
            .into_iter()
            .take(DREAM_MEMORIES)
            .map(|m| format!("- {}", super::recall::render(store, m)))
            .collect();
        lines.join("\n")
    };
    let reflection = if text.is_empty() {
        None
    } else {
        match side_call(cell, token, DREAM_PROMPT, text).await {
            None => return false,
            // Refused, failed or empty: the next asleep tick tries again.
            Some(None) => return true,
            Some(Some(reflection)) => Some(reflection),
        }
    };
    if stale() {
        return false;
    }
    let mut rec = cell.memory_lock();
    let mut kinds = Vec::with_capacity(2);
    if let Some(reflection) = reflection {
        let reflection: String = reflection.trim().chars().take(DREAM_MAX_CHARS).collect();
        match cell.new_memory(&rec, MemoryKind::Reflection, &reflection, 7, 1.0) {
            Ok(stored) => kinds.push(stored),
            Err(why) => tracing::debug!(agent = %cell.key, %why, "dream not stored"),
        }
    }
    kinds.push(EventKind::MemoryConsolidated {
        day,
        phase: SleepPhase::Done,
    });
    cell.emit_memory(&mut rec, kinds);
    true
}

impl AgentCell {
    /// A restored NPC's scheduled wake (journaled `wake_scheduled`, still ahead in memory time)
    /// handed to the tick arbiter again.
    pub(crate) fn restore_wake(&self) {
        let Some(ticking) = self.ticking() else {
            return;
        };
        let after = {
            let rec = self.lock();
            let Some(at) = rec.memory().and_then(|s| s.scheduled_wake) else {
                return;
            };
            let now = self.memory_now(&rec);
            let speed = self.settings.npc.clock.speed;
            if at <= now || !(speed.is_finite() && speed > 0.0) {
                return;
            }
            (at - now) / speed
        };
        if let Err(why) = ticking.schedule_wake(std::time::Duration::from_secs_f64(after)) {
            tracing::debug!(agent = %self.key, %why, "scheduled wake not restored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_count_only_for_the_ids_shown_within_1_to_10_and_malformed_output_scores_nothing() {
        let shown = [3, 4, 5];
        let reply =
            "Here:\n```json\n[{\"id\": 3, \"importance\": 9}, {\"id\": 4, \"importance\": 0}, \
                     {\"id\": 5, \"importance\": \"high\"}, {\"id\": 6, \"importance\": 7}, \
                     {\"id\": 3, \"importance\": 1}, {\"importance\": 5}]\n```";
        assert_eq!(parse_scores(reply, &shown), vec![(3, 9)]);
        assert!(parse_scores("all of them matter a lot", &shown).is_empty());
        assert!(parse_scores("[{\"id\": 3, \"importance\": 9}", &shown).is_empty());
        assert!(parse_scores("] nothing [", &shown).is_empty());
    }
}
