//! Bounded memory: emergency compaction of the history (docs/memory.md).
//!
//! Before each model request of a turn, when the history (with the system message) is worth at
//! least [`COMPACT_AT_PERCENT`] % of `execution.max_context_tokens` (non-zero) and
//! `memory.compaction` is on, the older history — all but the newest tool-call units worth at most
//! `memory.keep_percent` % of the window — is summarised by the model in a call of its own (a
//! *summary request*, recognised by [`is_summary_request`]: its first message is the system message
//! [`SUMMARY_PROMPT`], and it offers no tools) and replaced by one internal `user` message, journaled
//! as `HistoryCompacted` so a replay of the journal equals the live record. The summary's tokens
//! count against the budgets like any call's. When the call fails, is refused by a budget, or
//! answers nothing usable, a deterministic marker takes the summary's place (`fallback: true`). A
//! halt cancels the call and drops its result; so does a history that changed under it.

use super::{cell::AgentCell, turn::call_provider};
use crate::{context, provider::LlmRequest, safety::Verdict};
use tokio_util::sync::CancellationToken;
use warden_protocols::{ChatMessage, ChatRole, EventKind};

/// Percentage of `execution.max_context_tokens` at which the history is compacted (design 001:
/// emergency compaction at ≥ 80 %; the same threshold as the critical advisory).
pub const COMPACT_AT_PERCENT: u64 = context::CRITICAL_PERCENT;

/// The system message of a summary request (see [`is_summary_request`]).
pub const SUMMARY_PROMPT: &str = "You maintain the long-term memory of an agent. The user message is a transcript of the oldest part of the agent's conversation, which is about to be removed from its context. Write a concise summary of it in the third person: the facts learned, the people and things involved, promises made, decisions taken, open tasks and goals. Keep anything the agent will need later; leave out small talk. Do not call any tool. Reply with the summary only.";

/// The system message of a reflection request (see [`is_reflection_request`]).
pub const REFLECTION_PROMPT: &str = "You are the inner voice of an agent. The user message is a transcript of its recent conversation, and its current goals. In two or three sentences, reflect: what matters most now, what the agent has learned, and what it should do next. Do not call any tool. Reply with the reflection only.";

/// The most characters a reflection keeps (longer ones are cut).
pub const REFLECTION_MAX_CHARS: usize = 600;

/// Whether `request` is a reflection request: its first message is the system message
/// [`REFLECTION_PROMPT`].
pub fn is_reflection_request(request: &LlmRequest) -> bool {
    request.messages.first().is_some_and(|m| {
        m.role == ChatRole::System && m.content.as_deref() == Some(REFLECTION_PROMPT)
    })
}

/// The system message of a pre-compaction extraction request (design 001's
/// `pre_compact_extraction`; see [`is_extraction_request`]): with long-term memory on, the facts in
/// the part of the history about to be summarised are stored before it leaves the window.
pub const EXTRACTION_PROMPT: &str = "You maintain the long-term memory of an agent. The user message is a transcript of the oldest part of its conversation, about to be removed from its context. List the facts worth remembering as a JSON array of objects {\"subject\", \"predicate\", \"object\", \"said_by\", \"importance\"}: subject, predicate and object short (e.g. \"p1\", \"name\", \"Aldric\"), said_by the id of the speaker who said it as shown in the transcript (\"self\" for the agent), importance 1 to 10. Use a speaker's id as the subject for facts about them. Do not call any tool. Reply with the JSON array only ([] when there is nothing).";

/// The most facts one extraction stores.
pub const MAX_EXTRACTED: usize = 20;

/// Whether `request` is an extraction request: its first message is the system message
/// [`EXTRACTION_PROMPT`].
pub fn is_extraction_request(request: &LlmRequest) -> bool {
    request.messages.first().is_some_and(|m| {
        m.role == ChatRole::System && m.content.as_deref() == Some(EXTRACTION_PROMPT)
    })
}

/// One fact of an extraction's answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Extracted {
    /// What it is about.
    pub subject: String,
    /// The relation.
    pub predicate: String,
    /// The value.
    pub object: String,
    /// Who said it (a speaker id of the transcript, `self`).
    #[serde(default)]
    pub said_by: Option<String>,
    /// 1 to 10 (absent: 5).
    #[serde(default)]
    pub importance: Option<u8>,
}

/// The facts of an extraction's answer: the first JSON array in `text` (a model may wrap it in
/// prose or a code fence); entries that are not facts are skipped, at most [`MAX_EXTRACTED`].
/// Malformed output gives no facts, never an error that stops the turn.
pub fn parse_extraction(text: &str) -> Vec<Extracted> {
    json_array(text)
        .into_iter()
        .filter_map(|v| serde_json::from_value::<Extracted>(v).ok())
        .filter(|f| {
            [&f.subject, &f.predicate, &f.object]
                .iter()
                .all(|s| !s.trim().is_empty() && s.chars().count() <= 200)
        })
        .take(MAX_EXTRACTED)
        .collect()
}

/// The JSON array in a model's reply (from its first `[` to its last `]`: prose or a code fence
/// around it is ignored); empty when there is none or it does not parse.
pub(crate) fn json_array(text: &str) -> Vec<serde_json::Value> {
    let (Some(start), Some(end)) = (text.find('['), text.rfind(']')) else {
        return Vec::new();
    };
    if end < start {
        return Vec::new();
    }
    serde_json::from_str(&text[start..=end]).unwrap_or_default()
}

/// How a summary starts in the history: `[memory: summary of N earlier messages]`.
pub const SUMMARY_HEADER: &str = "[memory: summary of";

/// Whether `request` is a summary request: its first message is the system message
/// [`SUMMARY_PROMPT`] (a scripted provider's fallback can answer it with this test).
pub fn is_summary_request(request: &LlmRequest) -> bool {
    request
        .messages
        .first()
        .is_some_and(|m| m.role == ChatRole::System && m.content.as_deref() == Some(SUMMARY_PROMPT))
}

/// What a compaction will do, planned under the record lock.
struct Plan {
    /// Messages removed from the front.
    removed: usize,
    /// The last of them, to tell whether the history changed while the summary was written.
    boundary: ChatMessage,
    /// The summary request's transcript of the removed messages (the newest of them that fit).
    transcript: String,
}

fn noun(n: usize) -> &'static str {
    if n == 1 {
        "message"
    } else {
        "messages"
    }
}

/// One line of a transcript.
fn line(m: &ChatMessage) -> String {
    let text = m.content.as_deref().unwrap_or_default();
    match m.role {
        ChatRole::Tool => format!("tool result: {text}"),
        ChatRole::Assistant if !m.tool_calls.is_empty() => {
            let calls: Vec<String> = m
                .tool_calls
                .iter()
                .map(|c| format!("{}({})", c.function.name, c.function.arguments))
                .collect();
            format!("assistant: {text} [calls {}]", calls.join(", "))
        }
        ChatRole::Assistant => format!("assistant: {text}"),
        ChatRole::User => format!("user: {text}"),
        ChatRole::System => format!("system: {text}"),
    }
}

/// A transcript of the newest of `messages` worth at most `tokens` (~4 characters a token), with
/// the number of older ones left out. Reads only what it shows.
fn transcript(messages: &[ChatMessage], tokens: u64) -> String {
    let mut room = tokens.saturating_mul(context::CHARS_PER_TOKEN);
    let mut lines = Vec::new();
    for m in messages.iter().rev() {
        let l = line(m);
        let chars = l.chars().count() as u64 + 1;
        if chars > room {
            break;
        }
        room -= chars;
        lines.push(l);
    }
    let left_out = messages.len() - lines.len();
    lines.reverse();
    let mut out = String::new();
    if left_out > 0 {
        out.push_str(&format!(
            "({left_out} older {} not shown)\n",
            noun(left_out)
        ));
    }
    out.push_str(&lines.join("\n"));
    out
}

impl AgentCell {
    /// The compaction due now, if any.
    fn compaction_plan(&self) -> Option<Plan> {
        let max = self.settings.max_context_tokens;
        if max == 0 || !self.settings.memory.compaction {
            return None;
        }
        let rec = self.lock();
        let system = self
            .system_message(&rec)
            .map_or(0, |m| m.estimated_tokens());
        let used = u128::from(rec.history_tokens.saturating_add(system));
        if used * 100 < u128::from(max) * u128::from(COMPACT_AT_PERCENT) {
            return None;
        }
        let keep = max.saturating_mul(u64::from(self.settings.memory.keep_percent)) / 100;
        let removed = context::newest_units_within(&rec.history, keep);
        // Only worth it when the part removed is worth more than the largest summary may be (this
        // also leaves alone a history whose newest unit alone fills the window, and an earlier
        // summary followed by that unit).
        let kept: u64 = rec.history[removed..]
            .iter()
            .map(ChatMessage::estimated_tokens)
            .sum();
        let gone = rec.history_tokens.saturating_sub(kept);
        if removed == 0 || gone <= self.summary_cap_tokens() + context::MESSAGE_OVERHEAD_TOKENS {
            return None;
        }
        Some(Plan {
            removed,
            boundary: rec.history[removed - 1].clone(),
            // The newest removed messages worth at most half the window (O(window)).
            transcript: transcript(&rec.history[..removed], max / 2),
        })
    }

    /// The most tokens a summary's text may take: `memory.summary_percent` % of the window.
    fn summary_cap_tokens(&self) -> u64 {
        self.settings
            .max_context_tokens
            .saturating_mul(u64::from(self.settings.memory.summary_percent))
            / 100
    }

    /// The summary message from the model's text, cut to `memory.summary_percent` % of the window.
    fn summary_message(&self, removed: usize, text: &str) -> ChatMessage {
        let cap = self
            .summary_cap_tokens()
            .saturating_mul(context::CHARS_PER_TOKEN);
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let text: String = text.trim().chars().take(cap).collect();
        ChatMessage::user(format!(
            "{SUMMARY_HEADER} {removed} earlier {}]\n{text}",
            noun(removed)
        ))
        .internal()
    }
}

/// The deterministic marker that replaces `removed` messages when no summary could be written.
pub fn fallback_summary(removed: usize, why: &str) -> ChatMessage {
    ChatMessage::user(format!(
        "[memory: {removed} earlier {} removed without a summary ({why})]",
        noun(removed)
    ))
    .internal()
}

/// A memory call of its own (summary, reflection): the system message `prompt`, the user message
/// `text`, no tools.
fn side_request(cell: &AgentCell, prompt: &str, text: String) -> LlmRequest {
    LlmRequest {
        agent: cell.key.clone(),
        messages: vec![ChatMessage::system(prompt), ChatMessage::user(text)],
        tools: Vec::new(),
    }
}

/// A long-term memory call of its own (extraction, dreaming): the system message `prompt`, the
/// user message `text`, no tools; its tokens count against the budgets, and a budget that would
/// stop the agent refuses it. `None`: a halt came. `Some(None)`: refused, failed or empty.
pub(crate) async fn side_call(
    cell: &AgentCell,
    token: &CancellationToken,
    prompt: &str,
    text: String,
) -> Option<Option<String>> {
    let request = side_request(cell, prompt, text);
    if !budgets_allow(cell, &request) {
        return Some(None);
    }
    match call_provider(cell, token, request).await {
        None => None,
        Some(Ok(response)) => {
            cell.record_usage(response.usage);
            Some(
                response
                    .message
                    .content
                    .filter(|t| !t.trim().is_empty() && response.message.tool_calls.is_empty()),
            )
        }
        Some(Err(error)) => {
            tracing::warn!(agent = %cell.key, %error, "memory call failed; skipped");
            Some(None)
        }
    }
}

/// Whether the budgets let `request` go (a verdict that would stop or lock out the agent refuses
/// it; the turn's own request then obeys that verdict).
fn budgets_allow(cell: &AgentCell, request: &LlmRequest) -> bool {
    budgets_allow_tokens(cell, context::estimate_tokens(&request.messages))
}

/// Whether the budgets let a call of about `estimate` tokens go (see `budgets_allow`).
pub(crate) fn budgets_allow_tokens(cell: &AgentCell, estimate: u64) -> bool {
    cell.breakers(|b| b.before_llm_call(estimate))
        .is_none_or(|v| {
            matches!(
                v,
                Verdict::Continue | Verdict::Warn { .. } | Verdict::Alert { .. }
            )
        })
}

/// Compacts the history if it is due (see the module docs). `false`: a halt came (the turn ends).
pub(super) async fn compact_if_due(
    cell: &AgentCell,
    token: &CancellationToken,
    stale: impl Fn() -> bool,
) -> bool {
    let Some(plan) = cell.compaction_plan() else {
        return true;
    };
    if cell.settings.memory.long_term && !extract(cell, token, &plan.transcript, &stale).await {
        return false;
    }
    let request = side_request(cell, SUMMARY_PROMPT, plan.transcript);
    let allowed = budgets_allow(cell, &request);
    let (summary, fallback) = if allowed {
        match call_provider(cell, token, request).await {
            None => return false,
            Some(Ok(response)) => {
                cell.record_usage(response.usage);
                if stale() {
                    return false;
                }
                match response.message.content {
                    Some(text)
                        if !text.trim().is_empty() && response.message.tool_calls.is_empty() =>
                    {
                        (cell.summary_message(plan.removed, &text), false)
                    }
                    _ => (
                        fallback_summary(plan.removed, "the summary was empty"),
                        true,
                    ),
                }
            }
            Some(Err(error)) => {
                tracing::warn!(agent = %cell.key, %error, "memory summary failed; compacting without one");
                (
                    fallback_summary(plan.removed, "the summary call failed"),
                    true,
                )
            }
        }
    } else {
        (
            fallback_summary(plan.removed, "a budget refused the summary call"),
            true,
        )
    };
    if stale() {
        return false;
    }
    let mut rec = cell.lock();
    // Applied only to the history it was planned on (appends at the end do not matter).
    if rec.history.get(plan.removed - 1) != Some(&plan.boundary) {
        return true;
    }
    let text = (!fallback).then(|| summary.content.clone()).flatten();
    cell.emit(
        &mut rec,
        EventKind::HistoryCompacted {
            removed: plan.removed as u64,
            summary,
            fallback,
        },
    );
    drop(rec);
    // Long-term memory keeps the summary too (the history keeps only the latest).
    if let Some(text) = text.filter(|_| cell.settings.memory.long_term) {
        let text = text.split_once('\n').map_or(text.as_str(), |(_, t)| t);
        let _ = cell.store_memory(crate::memory::MemoryKind::Summary, text, 6, 1.0);
    }
    true
}

/// Pre-compaction extraction (design 001): the model lists the facts in the transcript about to
/// be summarised; each is stored (`store_fact`) with the trust of the speaker who said it (its
/// latest perceived event's; an id never perceived: `npc.trust.say`; `self`: the claim threshold),
/// so a rumour becomes a claim, never a fact. Its tokens count against the budgets; a budget that
/// refuses it, a failed call or malformed output skip it. `false`: a halt came.
async fn extract(
    cell: &AgentCell,
    token: &CancellationToken,
    transcript: &str,
    stale: &impl Fn() -> bool,
) -> bool {
    let Some(text) = side_call(cell, token, EXTRACTION_PROMPT, transcript.to_owned()).await else {
        return false;
    };
    let text = text.unwrap_or_default();
    if stale() {
        return false;
    }
    let npc = &cell.settings.npc;
    for fact in parse_extraction(&text) {
        let by = fact
            .said_by
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or("self")
            .to_owned();
        let trust = if by == "self" {
            npc.trigger_min_trust
        } else {
            cell.live().trust_of(&by).unwrap_or(npc.trust.say)
        };
        let importance = fact.importance.unwrap_or(5);
        if let Err(why) = cell.store_fact(
            &fact.subject,
            &fact.predicate,
            &fact.object,
            trust,
            &by,
            Vec::new(),
            importance,
        ) {
            tracing::debug!(agent = %cell.key, %why, "extracted fact not stored");
        }
    }
    true
}

/// Reflects if it is due: `memory.reflection_interval` turns (non-zero) since the last reflection
/// (`AgentRecord::reflected_at`). The model writes a short reflection on the newest history (worth
/// at most half the window, or 2000 tokens without one) and the goals; it is journaled
/// (`Reflected`) and carried in the system message. A failed or empty reflection is skipped (the
/// next turn tries again). `false`: a halt came (the turn ends).
pub(super) async fn reflect_if_due(
    cell: &AgentCell,
    token: &CancellationToken,
    stale: impl Fn() -> bool,
) -> bool {
    let interval = u64::from(cell.settings.memory.reflection_interval);
    let request = {
        let rec = cell.lock();
        if interval == 0 || rec.turns < rec.reflected_at.saturating_add(interval) {
            return true;
        }
        let window = match cell.settings.max_context_tokens {
            0 => 4000,
            max => max,
        };
        let mut text = transcript(&rec.history, window / 2);
        if !rec.goals.is_empty() {
            text.push_str("\n\nCurrent goals:");
            for goal in &rec.goals {
                text.push_str("\n- ");
                text.push_str(goal);
            }
        }
        side_request(cell, REFLECTION_PROMPT, text)
    };
    if !budgets_allow(cell, &request) {
        return true;
    }
    let text = match call_provider(cell, token, request).await {
        None => return false,
        Some(Ok(response)) => {
            cell.record_usage(response.usage);
            response
                .message
                .content
                .filter(|t| !t.trim().is_empty() && response.message.tool_calls.is_empty())
        }
        Some(Err(error)) => {
            tracing::warn!(agent = %cell.key, %error, "reflection failed; skipped");
            None
        }
    };
    if stale() {
        return false;
    }
    if let Some(text) = text {
        let reflection: String = text.trim().chars().take(REFLECTION_MAX_CHARS).collect();
        if cell.settings.memory.long_term {
            let _ = cell.store_memory(crate::memory::MemoryKind::Reflection, &reflection, 7, 1.0);
        }
        cell.note(EventKind::Reflected { reflection });
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extraction_is_read_from_prose_or_a_fence_and_malformed_output_gives_nothing() {
        let facts = parse_extraction(
            "Sure! ```json\n[{\"subject\": \"p1\", \"predicate\": \"name\", \"object\": \"Aldric\", \"said_by\": \"p1\"},\n {\"subject\": \"\", \"predicate\": \"x\", \"object\": \"y\"},\n {\"note\": \"not a fact\"},\n 42]\n```",
        );
        assert_eq!(facts.len(), 1);
        assert_eq!(
            (
                facts[0].subject.as_str(),
                facts[0].said_by.as_deref(),
                facts[0].importance
            ),
            ("p1", Some("p1"), None)
        );
        for bad in [
            "",
            "no facts",
            "[{\"subject\": ",
            "] [",
            "{\"subject\": \"a\"}",
        ] {
            assert!(parse_extraction(bad).is_empty(), "{bad}");
        }
        let many: Vec<String> = (0..50)
            .map(|i| format!("{{\"subject\":\"s{i}\",\"predicate\":\"p\",\"object\":\"o\"}}"))
            .collect();
        assert_eq!(
            parse_extraction(&format!("[{}]", many.join(","))).len(),
            MAX_EXTRACTED
        );
        let long = "x".repeat(201);
        assert!(parse_extraction(&format!(
            "[{{\"subject\":\"{long}\",\"predicate\":\"p\",\"object\":\"o\"}}]"
        ))
        .is_empty());
    }
}
