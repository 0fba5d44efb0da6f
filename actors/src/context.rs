//! Context-window management over a conversation (`Vec<ChatMessage>`): a token estimate, the token
//! advisory injected into tool results, and two trimming strategies.
//!
//! **Estimate.** [`estimate_message_tokens`] = [`MESSAGE_OVERHEAD_TOKENS`] + ⌈chars / 4⌉, where *chars*
//! counts the Unicode scalar values of the content, the `tool_call_id`, and every tool call's id, name
//! and argument text. [`estimate_tokens`] is the sum over the messages, so it is additive: removing a
//! message lowers the estimate by exactly that message's estimate. It is a heuristic (English text
//! averages ~4 characters per token; code and CJK text use more tokens per character), so give it
//! headroom: pass a budget below the real window (leave room for the reply).
//!
//! **Advisory** (design 001): at ≥ 60 % of the window a tool result gets "Consider concluding soon"
//! appended, at ≥ 80 % "Provide final response now" — and the ReAct loop should end the turn
//! (`TerminationReason::CriticalTokens`).
//!
//! **Trimming.** Messages are grouped into *units*: an assistant message with `tool_calls` together
//! with every later `role: tool` message answering one of its call ids (the nearest such assistant, if
//! ids repeat) is one unit; every other message is a unit of its own. Both strategies keep or drop whole
//! units, so they guarantee, for any input:
//! * every `tool` message in the output answers an assistant tool call that precedes it in the output,
//!   and a kept assistant tool-call message keeps all its results — a `tool` message answering no
//!   earlier call (an *orphan*, which providers reject) is always removed, even under budget;
//! * the first `system` message is kept ([`compact`] also keeps the first message);
//! * the newest unit is kept (the model must see what it is answering);
//! * otherwise the oldest units go first and the output is within the budget whenever keeping only
//!   the protected units, the newest unit (and, for [`compact`], the marker) fits in it;
//! * the relative order of kept messages never changes, and nothing is dropped when the conversation
//!   (orphans aside) already fits.

use std::collections::HashMap;
use warden_protocols::{ChatMessage, ChatRole};

pub use warden_protocols::{CHARS_PER_TOKEN, MESSAGE_OVERHEAD_TOKENS};
/// Percentage of the window at which the advisory becomes a warning.
pub const WARNING_PERCENT: u64 = 60;
/// Percentage of the window at which the advisory becomes critical.
pub const CRITICAL_PERCENT: u64 = 80;

/// Estimated tokens of one message (see the module docs).
/// ([`ChatMessage::estimated_tokens`], which the record's running total uses too.)
pub fn estimate_message_tokens(message: &ChatMessage) -> u64 {
    message.estimated_tokens()
}

/// Estimated tokens of a conversation: the sum of [`estimate_message_tokens`].
pub fn estimate_tokens(messages: &[ChatMessage]) -> u64 {
    messages.iter().map(estimate_message_tokens).sum()
}

/// How full the context window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Advisory {
    /// Below 60 %.
    #[default]
    None,
    /// At least 60 %: "Consider concluding soon"; the loop continues.
    Warning,
    /// At least 80 %: "Provide final response now"; the loop ends.
    Critical,
}

impl Advisory {
    /// The text shown to the model, if any.
    pub fn text(self) -> Option<&'static str> {
        match self {
            Advisory::None => None,
            Advisory::Warning => Some("Consider concluding soon"),
            Advisory::Critical => Some("Provide final response now"),
        }
    }

    /// Whether the ReAct loop should end the turn (`TerminationReason::CriticalTokens`).
    pub fn is_critical(self) -> bool {
        self == Advisory::Critical
    }
}

/// `estimated` as a whole percentage of `max_context_tokens` (rounded down; 0 when the max is 0).
fn percent(estimated: u64, max_context_tokens: u64) -> u64 {
    if max_context_tokens == 0 {
        return 0;
    }
    let p = u128::from(estimated) * 100 / u128::from(max_context_tokens);
    u64::try_from(p).unwrap_or(u64::MAX)
}

/// The advisory for `estimated` tokens out of `max_context_tokens` (`None` when the max is 0:
/// unknown window, no advisory).
pub fn advisory(estimated: u64, max_context_tokens: u64) -> Advisory {
    if max_context_tokens == 0 {
        return Advisory::None;
    }
    let scaled = u128::from(estimated) * 100;
    let max = u128::from(max_context_tokens);
    if scaled >= max * u128::from(CRITICAL_PERCENT) {
        Advisory::Critical
    } else if scaled >= max * u128::from(WARNING_PERCENT) {
        Advisory::Warning
    } else {
        Advisory::None
    }
}

/// `content` with the advisory for `estimated`/`max_context_tokens` appended, e.g.
/// `…\n\n[token advisory: context 65% full. Consider concluding soon]`; unchanged below 60 %.
pub fn append_advisory(content: &str, estimated: u64, max_context_tokens: u64) -> String {
    match advisory(estimated, max_context_tokens).text() {
        None => content.to_owned(),
        Some(text) => format!(
            "{content}\n\n[token advisory: context {}% full. {text}]",
            percent(estimated, max_context_tokens)
        ),
    }
}

/// Which trimming strategy to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ContextStrategy {
    /// [`sliding_window`].
    #[default]
    SlidingWindow,
    /// [`compact`].
    Compact,
}

/// What a trim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trimmed {
    /// Messages removed (orphan tool results included; the compaction marker not counted).
    pub removed: usize,
    /// [`estimate_tokens`] of the result.
    pub estimated_tokens: u64,
    /// Whether the result fits the budget (false only when the kept minimum does not).
    pub within_budget: bool,
}

/// Applies `strategy` (see [`sliding_window`] and [`compact`]).
pub fn fit(messages: &mut Vec<ChatMessage>, budget: u64, strategy: ContextStrategy) -> Trimmed {
    match strategy {
        ContextStrategy::SlidingWindow => sliding_window(messages, budget),
        ContextStrategy::Compact => compact(messages, budget),
    }
}

/// The message [`compact`] inserts in place of `dropped` messages: an internal `user` message (a
/// mid-conversation `system` message is rejected by some chat templates).
pub fn compaction_marker(dropped: usize) -> ChatMessage {
    let noun = if dropped == 1 { "message" } else { "messages" };
    ChatMessage::user(format!("[… {dropped} earlier {noun} compacted …]")).internal()
}

/// Drops the oldest units (never the first system message, never the newest unit) until the
/// conversation fits `budget` tokens.
pub fn sliding_window(messages: &mut Vec<ChatMessage>, budget: u64) -> Trimmed {
    trim(messages, budget, false)
}

/// Keeps the first message, the first system message and the newest units that fit `budget`, and
/// puts a [`compaction_marker`] where the dropped messages were.
pub fn compact(messages: &mut Vec<ChatMessage>, budget: u64) -> Trimmed {
    trim(messages, budget, true)
}

/// Units of `messages` in order of their first message, and the orphan tool messages.
fn units(messages: &[ChatMessage]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut orphans = Vec::new();
    let mut call_unit: HashMap<&str, usize> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            ChatRole::Tool => {
                let owner = m
                    .tool_call_id
                    .as_deref()
                    .and_then(|id| call_unit.get(id).copied());
                match owner {
                    Some(u) => units[u].push(i),
                    None => orphans.push(i),
                }
            }
            ChatRole::Assistant if !m.tool_calls.is_empty() => {
                let u = units.len();
                units.push(vec![i]);
                for call in &m.tool_calls {
                    call_unit.insert(call.id.as_str(), u);
                }
            }
            _ => units.push(vec![i]),
        }
    }
    (units, orphans)
}

fn trim(messages: &mut Vec<ChatMessage>, budget: u64, with_marker: bool) -> Trimmed {
    trim_hidden(messages, budget, with_marker, 0)
}

/// The index where a unit that contains `history[j]` starts, read backwards from `j` only: a tool
/// result's unit starts at the assistant tool-call message right before its run of tool results
/// (results are appended right after their call); a run with no such message is orphans, each its
/// own start.
fn unit_start(history: &[ChatMessage], j: usize) -> usize {
    if history[j].role != ChatRole::Tool {
        return j;
    }
    let mut k = j;
    while k > 0 && history[k - 1].role == ChatRole::Tool {
        k -= 1;
    }
    match k.checked_sub(1).map(|a| &history[a]) {
        Some(a) if a.role == ChatRole::Assistant && !a.tool_calls.is_empty() => k - 1,
        _ => j,
    }
}

/// The end (exclusive) of the unit that starts at `history[start]`: its tool results right after it.
fn unit_end(history: &[ChatMessage], start: usize) -> usize {
    let mut end = start + 1;
    if history[start].role == ChatRole::Assistant && !history[start].tool_calls.is_empty() {
        while end < history.len() && history[end].role == ChatRole::Tool {
            end += 1;
        }
    }
    end
}

/// Where the newest units of `history` worth at least `budget` tokens start (0 if the whole history
/// is worth less): walked from the newest message back, whole units at a time, so the cost is the
/// size of the tail, not of the history, and the tail never starts inside a tool-call unit.
pub fn tail_start(history: &[ChatMessage], budget: u64) -> usize {
    let mut cost = 0u64;
    let mut i = history.len();
    while i > 0 && cost <= budget {
        let s = unit_start(history, i - 1);
        cost = cost.saturating_add(history[s..i].iter().map(estimate_message_tokens).sum());
        i = s;
    }
    i
}

/// Where the newest whole units of `history` worth at most `budget` tokens start (the newest unit
/// counts even when it alone is worth more; 0 for an empty history). What comes before is what a
/// memory compaction removes: it never starts inside a tool-call unit. O(kept units).
pub fn newest_units_within(history: &[ChatMessage], budget: u64) -> usize {
    let mut cost = 0u64;
    let mut i = history.len();
    while i > 0 {
        let s = unit_start(history, i - 1);
        let with = cost.saturating_add(history[s..i].iter().map(estimate_message_tokens).sum());
        if with > budget && i < history.len() {
            break;
        }
        cost = with;
        i = s;
    }
    i
}

/// The conversation sent to the model — `system` (if any) then `history` — fitted into `budget`
/// tokens by `strategy`, cloning only what the window needs: the newest units of the history worth
/// just over `budget` ([`tail_start`]), plus the first unit for [`compact`] without a system message.
/// The result equals [`fit`] of the whole conversation whenever the tool results of the history
/// follow their call (as the agent appends them) and, without `system`, the history has no system
/// message before the tail; the compaction marker counts the messages left out before the tail.
/// Cost: O(window), whatever the length of the history.
pub fn fit_history(
    system: Option<&ChatMessage>,
    history: &[ChatMessage],
    budget: u64,
    strategy: ContextStrategy,
) -> (Vec<ChatMessage>, Trimmed) {
    let compact = strategy == ContextStrategy::Compact;
    let first_end = if compact && system.is_none() && !history.is_empty() {
        unit_end(history, 0)
    } else {
        0
    };
    let start = tail_start(history, budget).max(first_end);
    let mut messages = Vec::with_capacity(1 + first_end + history.len() - start);
    messages.extend(system.cloned());
    messages.extend(history[..first_end].iter().cloned());
    messages.extend(history[start..].iter().cloned());
    let trimmed = trim_hidden(&mut messages, budget, compact, start - first_end);
    (messages, trimmed)
}

/// [`trim`] of a conversation of which `hidden` droppable messages, older than every droppable one
/// given, were already left out: they count as dropped (in `removed` and in the marker).
fn trim_hidden(
    messages: &mut Vec<ChatMessage>,
    budget: u64,
    with_marker: bool,
    hidden: usize,
) -> Trimmed {
    let (units, orphans) = units(messages);
    let cost: Vec<u64> = units
        .iter()
        .map(|u| {
            u.iter()
                .map(|&i| estimate_message_tokens(&messages[i]))
                .sum()
        })
        .collect();
    let first_system = messages.iter().position(|m| m.role == ChatRole::System);
    let protected: Vec<bool> = units
        .iter()
        .enumerate()
        .map(|(n, u)| u.first() == first_system.as_ref() || (with_marker && n == 0))
        .collect();
    let total: u64 = cost.iter().sum();

    let mut keep = vec![true; units.len()];
    let mut marker = None;
    if total > budget || hidden > 0 {
        let fixed: u64 = (0..units.len())
            .filter(|&n| protected[n])
            .map(|n| cost[n])
            .sum();
        let droppable: Vec<usize> = (0..units.len()).filter(|&n| !protected[n]).collect();
        let droppable_messages: usize =
            hidden + droppable.iter().map(|&n| units[n].len()).sum::<usize>();
        // Keep the longest suffix of droppable units that fits (at least the newest one).
        let mut kept_units = 0;
        let mut kept_cost = 0;
        let mut kept_messages = 0;
        for &n in droppable.iter().rev() {
            let cost_with = kept_cost + cost[n];
            let messages_with = kept_messages + units[n].len();
            let dropped = droppable_messages - messages_with + orphans.len();
            let marker_cost = if with_marker && droppable_messages > messages_with {
                estimate_message_tokens(&compaction_marker(dropped))
            } else {
                0
            };
            if kept_units > 0 && fixed + cost_with + marker_cost > budget {
                break;
            }
            kept_units += 1;
            kept_cost = cost_with;
            kept_messages = messages_with;
        }
        for &n in &droppable[..droppable.len() - kept_units] {
            keep[n] = false;
        }
        if with_marker && kept_messages < droppable_messages {
            let dropped = droppable_messages - kept_messages + orphans.len();
            // Before the first message of the kept suffix (or at the end if nothing droppable is kept).
            let at = droppable
                .get(droppable.len() - kept_units)
                .and_then(|&n| units[n].first().copied())
                .unwrap_or(messages.len());
            marker = Some((at, compaction_marker(dropped)));
        }
    }

    let mut keep_message = vec![false; messages.len()];
    for (n, unit) in units.iter().enumerate() {
        if keep[n] {
            for &i in unit {
                keep_message[i] = true;
            }
        }
    }
    let removed = hidden + keep_message.iter().filter(|k| !**k).count();
    let old = std::mem::take(messages);
    for (i, m) in old.into_iter().enumerate() {
        if marker.as_ref().is_some_and(|(at, _)| *at == i) {
            if let Some((_, mk)) = marker.take() {
                messages.push(mk);
            }
        }
        if keep_message[i] {
            messages.push(m);
        }
    }
    if let Some((_, mk)) = marker {
        messages.push(mk);
    }
    let estimated_tokens = estimate_tokens(messages);
    Trimmed {
        removed,
        estimated_tokens,
        within_budget: estimated_tokens <= budget,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use warden_protocols::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "read", &json!({}))
    }

    fn calls(ids: &[&str]) -> ChatMessage {
        ChatMessage::assistant_tool_calls(None, ids.iter().map(|id| call(id)).collect())
    }

    fn texts(messages: &[ChatMessage]) -> Vec<String> {
        messages
            .iter()
            .map(
                |m| match (&m.role, &m.tool_call_id, m.tool_calls.is_empty()) {
                    (ChatRole::Tool, Some(id), _) => format!("tool:{id}"),
                    (ChatRole::Assistant, _, false) => format!(
                        "calls:{}",
                        m.tool_calls
                            .iter()
                            .map(|c| c.id.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                    _ => m.content.clone().unwrap_or_default(),
                },
            )
            .collect()
    }

    #[test]
    fn estimate_counts_content_ids_and_arguments() {
        assert_eq!(estimate_message_tokens(&ChatMessage::user("")), 4);
        assert_eq!(estimate_message_tokens(&ChatMessage::user("abcd")), 5);
        assert_eq!(estimate_message_tokens(&ChatMessage::user("abcde")), 6);
        // "c1" + "read" + "{}" = 8 characters.
        assert_eq!(estimate_message_tokens(&calls(&["c1"])), 6);
        // "c1" + "abcde" = 7 characters.
        assert_eq!(
            estimate_message_tokens(&ChatMessage::tool_result("c1", "abcde")),
            6
        );
        // Characters, not bytes.
        assert_eq!(estimate_message_tokens(&ChatMessage::user("éééé")), 5);
        let conv = [ChatMessage::user("abcd"), calls(&["c1"])];
        assert_eq!(estimate_tokens(&conv), 11);
        assert_eq!(estimate_tokens(&[]), 0);
    }

    #[test]
    fn advisory_thresholds() {
        assert_eq!(advisory(59, 100), Advisory::None);
        assert_eq!(advisory(60, 100), Advisory::Warning);
        assert_eq!(advisory(79, 100), Advisory::Warning);
        assert_eq!(advisory(80, 100), Advisory::Critical);
        assert_eq!(advisory(500, 100), Advisory::Critical);
        assert_eq!(advisory(10, 0), Advisory::None);
        assert_eq!(advisory(u64::MAX, u64::MAX), Advisory::Critical);
        assert_eq!(Advisory::Warning.text(), Some("Consider concluding soon"));
        assert_eq!(
            Advisory::Critical.text(),
            Some("Provide final response now")
        );
        assert_eq!(Advisory::None.text(), None);
        assert!(Advisory::Critical.is_critical() && !Advisory::Warning.is_critical());
    }

    #[test]
    fn advisory_is_appended_to_tool_results() {
        assert_eq!(append_advisory("{\"ok\":1}", 10, 100), "{\"ok\":1}");
        assert_eq!(
            append_advisory("{\"ok\":1}", 655, 1000),
            "{\"ok\":1}\n\n[token advisory: context 65% full. Consider concluding soon]"
        );
        assert_eq!(
            append_advisory("done", 8000, 8000),
            "done\n\n[token advisory: context 100% full. Provide final response now]"
        );
    }

    fn sample() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("sys"),
            ChatMessage::user("u1"),
            calls(&["a", "b"]),
            ChatMessage::tool_result("a", "ra"),
            ChatMessage::tool_result("b", "rb"),
            ChatMessage::assistant("x1"),
            ChatMessage::user("u2"),
            calls(&["c"]),
            ChatMessage::tool_result("c", "rc"),
        ]
    }

    #[test]
    fn nothing_changes_under_budget() {
        let mut conv = sample();
        let t = sliding_window(&mut conv, 1_000);
        assert_eq!(conv, sample());
        assert_eq!(t.removed, 0);
        assert_eq!(t.estimated_tokens, estimate_tokens(&sample()));
        assert!(t.within_budget);
        let mut conv = sample();
        compact(&mut conv, 1_000);
        assert_eq!(conv, sample());
    }

    #[test]
    fn sliding_window_drops_oldest_units_whole() {
        let full = estimate_tokens(&sample());
        let mut conv = sample();
        // One token short: "u1" must go; then the a/b unit is the oldest.
        let t = sliding_window(&mut conv, full - 1);
        assert_eq!(
            texts(&conv),
            [
                "sys",
                "calls:a,b",
                "tool:a",
                "tool:b",
                "x1",
                "u2",
                "calls:c",
                "tool:c"
            ]
        );
        assert_eq!(t.removed, 1);
        let budget = estimate_tokens(&conv) - 1;
        let t = sliding_window(&mut conv, budget);
        assert_eq!(texts(&conv), ["sys", "x1", "u2", "calls:c", "tool:c"]);
        assert_eq!(t.removed, 3);
        assert!(t.within_budget);
    }

    #[test]
    fn sliding_window_keeps_system_and_newest_unit_even_over_budget() {
        let mut conv = sample();
        let t = sliding_window(&mut conv, 0);
        assert_eq!(texts(&conv), ["sys", "calls:c", "tool:c"]);
        assert_eq!(t.removed, 6);
        assert!(!t.within_budget);
    }

    #[test]
    fn compact_keeps_first_and_newest_with_marker() {
        let mut conv = sample();
        let kept = [
            &sample()[0],
            &sample()[5],
            &sample()[6],
            &sample()[7],
            &sample()[8],
        ]
        .iter()
        .map(|m| estimate_message_tokens(m))
        .sum::<u64>();
        let budget = kept + estimate_message_tokens(&compaction_marker(4));
        let t = compact(&mut conv, budget);
        assert_eq!(
            texts(&conv),
            [
                "sys",
                "[… 4 earlier messages compacted …]",
                "x1",
                "u2",
                "calls:c",
                "tool:c"
            ]
        );
        assert!(conv[1].internal && conv[1].role == ChatRole::User);
        assert_eq!(t.removed, 4);
        assert!(t.within_budget);
        assert_eq!(
            compaction_marker(1).content.as_deref(),
            Some("[… 1 earlier message compacted …]")
        );
    }

    #[test]
    fn compact_keeps_a_non_system_first_message() {
        let mut conv = vec![
            ChatMessage::user("task"),
            ChatMessage::assistant("a1"),
            ChatMessage::user("u2"),
            ChatMessage::assistant("a2"),
        ];
        compact(&mut conv, 0);
        assert_eq!(
            texts(&conv),
            ["task", "[… 2 earlier messages compacted …]", "a2"]
        );
    }

    #[test]
    fn orphan_tool_results_are_always_removed() {
        let mut conv = vec![
            ChatMessage::system("sys"),
            ChatMessage::tool_result("ghost", "boo"),
            ChatMessage::user("u"),
            calls(&["a"]),
            ChatMessage::tool_result("a", "ra"),
            ChatMessage::tool_result("b", "unknown id"),
        ];
        let t = sliding_window(&mut conv, 10_000);
        assert_eq!(texts(&conv), ["sys", "u", "calls:a", "tool:a"]);
        assert_eq!(t.removed, 2);
    }

    #[test]
    fn repeated_call_ids_bind_to_the_nearest_call() {
        let mut conv = vec![
            ChatMessage::system("sys"),
            calls(&["call_0"]),
            ChatMessage::tool_result("call_0", "first"),
            calls(&["call_0"]),
            ChatMessage::tool_result("call_0", "second"),
        ];
        sliding_window(&mut conv, 0);
        assert_eq!(texts(&conv), ["sys", "calls:call_0", "tool:call_0"]);
        assert_eq!(conv[2].content.as_deref(), Some("second"));
    }

    #[test]
    fn fit_dispatches() {
        let mut a = sample();
        let mut b = sample();
        assert_eq!(
            fit(&mut a, 0, ContextStrategy::SlidingWindow),
            sliding_window(&mut b, 0)
        );
        let mut a = sample();
        let mut b = sample();
        assert_eq!(fit(&mut a, 0, ContextStrategy::Compact), compact(&mut b, 0));
        assert_eq!(a, b);
    }

    /// One generated piece of conversation.
    #[derive(Debug, Clone)]
    enum Item {
        System(usize),
        User(usize),
        Assistant(usize),
        /// An assistant calling `calls` tools, answered by the results whose flag is true.
        Round {
            calls: Vec<(usize, bool)>,
            reuse_ids: bool,
        },
        Orphan(usize),
    }

    fn item() -> impl Strategy<Value = Item> {
        prop_oneof![
            1 => (0..200usize).prop_map(Item::System),
            4 => (0..400usize).prop_map(Item::User),
            3 => (0..400usize).prop_map(Item::Assistant),
            4 => (prop::collection::vec((0..400usize, prop::bool::weighted(0.9)), 1..4), any::<bool>())
                .prop_map(|(calls, reuse_ids)| Item::Round { calls, reuse_ids }),
            1 => (0..100usize).prop_map(Item::Orphan),
        ]
    }

    /// The messages of `items` (each unique: contents start with the item's index), and per item its
    /// messages (orphans dropped) for the lower bound.
    fn build(items: &[Item]) -> (Vec<ChatMessage>, Vec<Vec<ChatMessage>>) {
        let mut all = Vec::new();
        let mut groups = Vec::new();
        for (n, item) in items.iter().enumerate() {
            let mut group = Vec::new();
            match item {
                Item::System(len) => {
                    group.push(ChatMessage::system(format!("{n}{}", "s".repeat(*len))))
                }
                Item::User(len) => {
                    group.push(ChatMessage::user(format!("{n}{}", "u".repeat(*len))))
                }
                Item::Assistant(len) => {
                    group.push(ChatMessage::assistant(format!("{n}{}", "a".repeat(*len))))
                }
                Item::Round { calls, reuse_ids } => {
                    let id = |k: usize| {
                        if *reuse_ids {
                            format!("call_{k}")
                        } else {
                            format!("r{n}_c{k}")
                        }
                    };
                    group.push(ChatMessage::assistant_tool_calls(
                        Some(n.to_string()),
                        (0..calls.len())
                            .map(|k| ToolCall::new(id(k), "t", &json!({"k": k})))
                            .collect(),
                    ));
                    for (k, (len, answered)) in calls.iter().enumerate() {
                        if *answered {
                            group.push(ChatMessage::tool_result(
                                id(k),
                                format!("{n}{}", "r".repeat(*len)),
                            ));
                        }
                    }
                }
                Item::Orphan(len) => {
                    all.push(ChatMessage::tool_result(
                        format!("orphan_{n}"),
                        "o".repeat(*len),
                    ));
                    continue;
                }
            }
            all.extend(group.iter().cloned());
            groups.push(group);
        }
        (all, groups)
    }

    fn check_invariants(
        input: &[ChatMessage],
        output: &[ChatMessage],
    ) -> Result<(), TestCaseError> {
        // Every tool message answers an earlier assistant call in the output.
        for (i, m) in output.iter().enumerate() {
            if m.role == ChatRole::Tool {
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                prop_assert!(
                    output[..i].iter().any(|a| a.role == ChatRole::Assistant
                        && a.tool_calls.iter().any(|c| c.id == id)),
                    "tool result {id} at {i} has no call before it"
                );
            }
        }
        // A kept assistant call keeps all its results (the input's tool messages right after it).
        for (i, m) in input.iter().enumerate() {
            if m.role == ChatRole::Assistant && !m.tool_calls.is_empty() {
                let Some(at) = output.iter().position(|o| o == m) else {
                    continue;
                };
                let results = input[i + 1..].iter().take_while(|r| {
                    r.role == ChatRole::Tool
                        && !r
                            .tool_call_id
                            .as_deref()
                            .unwrap_or("")
                            .starts_with("orphan_")
                });
                for (k, r) in results.enumerate() {
                    prop_assert_eq!(output.get(at + 1 + k), Some(r));
                }
            }
        }
        // Apart from markers, the output is a subsequence of the input (messages are unique).
        let mut rest = input.iter();
        for m in output.iter().filter(|m| !m.internal) {
            prop_assert!(rest.any(|i| i == m), "{:?} is not in order", m);
        }
        // The first system message is kept.
        let first_system =
            |ms: &[ChatMessage]| ms.iter().find(|m| m.role == ChatRole::System).cloned();
        prop_assert_eq!(first_system(output), first_system(input));
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The request built from the tail of the history equals the fit of the whole conversation.
        #[test]
        fn fitting_the_tail_equals_fitting_everything(
            items in prop::collection::vec(item(), 0..60),
            budget in 0u64..1_500,
            use_compact in any::<bool>(),
            with_system in any::<bool>(),
        ) {
            let (_, groups) = build(&items);
            let history: Vec<ChatMessage> = groups
                .iter()
                .flatten()
                .filter(|m| m.role != ChatRole::System)
                .cloned()
                .collect();
            let system = with_system.then(|| ChatMessage::system("the system prompt"));
            let strategy = if use_compact { ContextStrategy::Compact } else { ContextStrategy::SlidingWindow };
            let mut whole: Vec<ChatMessage> = system.iter().chain(&history).cloned().collect();
            let expected = fit(&mut whole, budget, strategy);
            let (tail, trimmed) = fit_history(system.as_ref(), &history, budget, strategy);
            prop_assert_eq!(&tail, &whole);
            prop_assert_eq!(trimmed, expected);
        }

        #[test]
        fn trimming_keeps_the_invariants(
            items in prop::collection::vec(item(), 0..40),
            budget in 0u64..3_000,
            use_compact in any::<bool>(),
        ) {
            let (input, groups) = build(&items);
            let mut output = input.clone();
            let t = if use_compact {
                compact(&mut output, budget)
            } else {
                sliding_window(&mut output, budget)
            };
            check_invariants(&input, &output)?;
            prop_assert_eq!(t.estimated_tokens, estimate_tokens(&output));
            prop_assert_eq!(t.within_budget, t.estimated_tokens <= budget);
            let markers = output.iter().filter(|m| m.internal).count();
            prop_assert_eq!(t.removed + output.len(), input.len() + markers);

            // Lower bound: the protected groups and the newest group (plus a marker) must fit.
            let cost = |g: &Vec<ChatMessage>| estimate_tokens(g);
            let first_system = groups.iter().position(|g| g[0].role == ChatRole::System);
            let mut protected: Vec<usize> = first_system.into_iter().collect();
            if use_compact && !groups.is_empty() {
                protected.push(0);
            }
            let newest = (0..groups.len()).rev().find(|n| !protected.contains(n));
            let mut minimum: u64 = protected.iter().collect::<std::collections::BTreeSet<_>>()
                .into_iter().map(|&n| cost(&groups[n])).sum();
            if let Some(n) = newest {
                minimum += cost(&groups[n]);
            }
            if use_compact {
                minimum += estimate_message_tokens(&compaction_marker(input.len()));
            }
            if minimum <= budget {
                prop_assert!(t.within_budget, "minimum {} fits {} but got {}", minimum, budget, t.estimated_tokens);
            }
            // Under budget (orphans aside), nothing else changes.
            let clean: Vec<ChatMessage> = groups.iter().flatten().cloned().collect();
            if estimate_tokens(&clean) <= budget {
                prop_assert_eq!(&output, &clean);
            }
        }
    }
}
