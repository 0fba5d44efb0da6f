//! Journal events. Every state change, halt, lockout, unlock, refusal and discarded message is one.
//!
//! # Pending user events
//! A user event accepted into an agent's ordinary lane is journaled as [`EventKind::EventQueued`]
//! with an id unique over the agent's whole journal (across restarts). Invariant: an accepted event
//! is pending in the record ([`crate::AgentRecord::pending`]) until exactly one of taken
//! ([`EventKind::EventTaken`]), discarded by a halt ([`EventKind::Halted`], listed in
//! [`EventKind::MessagesDiscarded`]) or refused ([`EventKind::WorkRefused`] with `queued`) settles
//! it; a restart on the journal queues the pending ones again.

use crate::{
    AgentKey, AgentRole, AgentState, ChatMessage, DelegationRefusal, Priority, TerminationReason,
    Usage, UserEvent, WorkRefusal,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One journaled event about one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the journal, assigned by the journal (0 before it is appended).
    pub seq: u64,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The agent the event is about.
    pub agent: AgentKey,
    /// What happened.
    pub kind: EventKind,
}

/// Which breaker tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Breaker {
    /// `safety.breakers.max_consecutive_errors` failed tool/LLM calls in a row (the emergency stop).
    ConsecutiveErrors,
    /// A token or cost budget (`safety.budget.*`) would be exceeded; the agent is STOPPED.
    BudgetExceeded,
    /// The same failing tool call was repeated after the "repeating a failed action" alert.
    Repetition,
    /// The same successful tool call was repeated `safety.breakers.max_repeated_tool_steps` times.
    Stuck,
    /// `safety.breakers.error_window_threshold` failures within the last `error_window` operations.
    ErrorCascade,
    /// A loop limit was refused by the limit checkpoint.
    LoopCap,
    /// Two NPCs talked in circles: `npc.conversation.loop_round_trips` round trips with no new
    /// content and no tool call.
    PairLoop,
}

impl Breaker {
    /// The name used on the wire, in metrics and in messages (`consecutive_errors`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Breaker::ConsecutiveErrors => "consecutive_errors",
            Breaker::BudgetExceeded => "budget_exceeded",
            Breaker::Repetition => "repetition",
            Breaker::Stuck => "stuck",
            Breaker::ErrorCascade => "error_cascade",
            Breaker::LoopCap => "loop_cap",
            Breaker::PairLoop => "pair_loop",
        }
    }
}

impl std::fmt::Display for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Who or what halted an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum HaltCause {
    /// An operator (CLI, API, embedding code).
    Operator {
        /// The operator's name (the API token's name, `cli`, or what embedding code gave).
        operator: String,
    },
    /// The agent's delegator was halted; cancellation propagates down the delegation tree.
    Parent {
        /// The halted delegator.
        parent: AgentKey,
    },
    /// The supervisor halted every agent.
    HaltAll,
    /// The embedding host halted every agent through its handle (`WardenHandle::halt_all`), with
    /// the reason it gave.
    Host {
        /// The host's reason, as given (`"admin halt"`, `"shard draining"`, …).
        reason: String,
    },
    /// A cluster node gave the agent up: its lease went to another node, which runs it now. The
    /// node takes it back when that node's lease on it ages out.
    LeaseLost {
        /// The node the lease went to.
        node: String,
    },
    /// The supervisor gave up restarting a crashing agent.
    RestartIntensity {
        /// Restarts counted within the window.
        restarts: u32,
        /// The window (`supervisor.restart.within_seconds`), in milliseconds.
        within_ms: u64,
    },
}

impl HaltCause {
    /// Whether this is the cause of a halt of every agent (the supervisor's, an embedding host's),
    /// which a lift of that halt undoes — unlike an operator's halt of one agent, a delegator's
    /// halt passed down, or the restart intensity.
    pub fn is_fleet(&self) -> bool {
        matches!(self, HaltCause::HaltAll | HaltCause::Host { .. })
    }
}

/// `skip_serializing_if` for flags omitted while `false`.
fn is_false(flag: &bool) -> bool {
    !flag
}

/// A queued message cleared by a halt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscardedMessage {
    /// Mailbox-assigned message id.
    pub id: u64,
    /// The lane it was queued in.
    pub priority: Priority,
    /// What it was (`user_event`, `tick`, `delegated_task`, …).
    pub kind: String,
    /// The id of the pending user event it was (see [`EventKind::EventQueued`]); absent for other
    /// work and in journals written before pending events were journaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<u64>,
}

/// How a delegation ended. Every ending releases the delegator's slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DelegationOutcome {
    /// The delegate answered; its answer went back to the delegator as the tool's result.
    Completed,
    /// The delegate's turn ended without an answer.
    Failed {
        /// Why, as the delegator's `delegate` tool reported it.
        error: String,
    },
    /// The delegate did not answer within the delegation timeout.
    TimedOut {
        /// How long the delegator waited, in milliseconds.
        after_ms: u64,
    },
    /// The delegate dropped the task (halted, crashed, shut down) before answering.
    Abandoned,
    /// The delegator stopped waiting (it was halted or its turn was cancelled).
    Cancelled,
}

/// The result of one turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnOutcome {
    /// Why the turn ended.
    pub reason: TerminationReason,
    /// Model calls made (ReAct iterations), including a wrap-up.
    pub iterations: u32,
    /// The final answer, when the model gave one (for a refused limit: the wrap-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// `true` when a refused limit ended the task (the answer, if any, is the forced wrap-up).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub limit_stopped: bool,
    /// Which limit ended the task, when `limit_stopped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_kind: Option<crate::LimitKind>,
    /// A decision-enabling error when the turn ended without an answer it could give (for a refused
    /// limit whose wrap-up failed: which limit, its value, the key to raise, the mode to set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The user events (their pending-event ids) this turn took and answers: what correlates an
    /// event with its reply. Empty for a tick or a delegated task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<u64>,
    /// Tokens of every model call of the turn.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
    /// `true` when the answer is incomplete: the model's last reply was still cut by its token limit
    /// (`finish_reason: length`) after the last max-tokens recovery
    /// (`execution.max_tokens_recoveries`). Absent (false) in journals written before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl TurnOutcome {
    /// An outcome with nothing but its reason, iteration count and answer.
    pub fn new(reason: TerminationReason, iterations: u32, answer: Option<String>) -> Self {
        TurnOutcome {
            reason,
            iterations,
            answer,
            limit_stopped: false,
            limit_kind: None,
            error: None,
            events: Vec::new(),
            usage: Usage::default(),
            truncated: false,
        }
    }
}

/// What became of one accepted user event, by its id: what `GET /api/agents/{key}/events/{id}`
/// answers (from the journal, so after a restart too) and what a waiter is told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum EventFate {
    /// Queued, not taken yet.
    Pending,
    /// Taken by a turn that has not finished.
    Running,
    /// The turn that took it gave an answer.
    Answered {
        /// The final answer.
        answer: String,
        /// Why the turn ended (`answered`, or a limit's wrap-up).
        reason: TerminationReason,
        /// Tokens of every model call of the turn.
        usage: Usage,
        /// The answer was still cut by the model's token limit after the last max-tokens recovery
        /// ([`TurnOutcome::truncated`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
    /// The agent refused it (locked out, stopped): when it was taken, or its turn ended in a lockout.
    Refused {
        /// Why.
        refusal: WorkRefusal,
    },
    /// A halt cleared it from the queue or stopped the turn that had taken it.
    Discarded,
    /// The turn that took it ended without an answer (model failure, limit, budget stop, crash).
    Failed {
        /// Why the turn ended.
        reason: TerminationReason,
        /// A decision-enabling message, when there is one ([`TurnOutcome::error`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// The cause journaled on the state changes with which a restart ends what a crash interrupted.
pub const RECOVERY_CAUSE: &str = "restart: turn interrupted by a crash";

impl EventFate {
    /// The fate of user event `id` from an agent's journal events (in order; other agents' are
    /// skipped): `None` if it was never queued. A turn stopped by a halt discards it; a turn that
    /// died with its actor or its process fails it (`crashed`).
    pub fn of_event<'a>(id: u64, events: impl IntoIterator<Item = &'a Event>) -> Option<EventFate> {
        let mut fate = None;
        let mut agent: Option<&AgentKey> = None;
        let mut lockout: Option<&str> = None;
        for event in events {
            if agent.is_some_and(|a| *a != event.agent) {
                continue;
            }
            let crashed = || EventFate::Failed {
                reason: TerminationReason::Crashed,
                error: Some("the agent's actor or process died during the turn".into()),
            };
            fate = match (&event.kind, fate) {
                (EventKind::EventQueued { id: queued, .. }, None) if *queued == id => {
                    agent = Some(&event.agent);
                    Some(EventFate::Pending)
                }
                (EventKind::LockedOut { reason, .. }, fate) => {
                    lockout = Some(reason);
                    fate
                }
                (_, None) => None,
                (EventKind::EventTaken { id: taken }, Some(EventFate::Pending)) if *taken == id => {
                    Some(EventFate::Running)
                }
                (
                    EventKind::WorkRefused {
                        queued: Some(refused),
                        refusal,
                        ..
                    },
                    Some(EventFate::Pending),
                ) if *refused == id => Some(EventFate::Refused {
                    refusal: refusal.clone(),
                }),
                (EventKind::Halted { .. }, Some(EventFate::Pending | EventFate::Running)) => {
                    Some(EventFate::Discarded)
                }
                (EventKind::MessagesDiscarded { messages }, Some(EventFate::Pending))
                    if messages.iter().any(|m| m.queued == Some(id)) =>
                {
                    Some(EventFate::Discarded)
                }
                (EventKind::TurnFinished { outcome }, Some(EventFate::Running))
                    if outcome.events.contains(&id) =>
                {
                    Some(EventFate::of_turn(outcome, lockout))
                }
                (
                    EventKind::Crashed { .. } | EventKind::Restarted { .. },
                    Some(EventFate::Running),
                ) => Some(crashed()),
                (EventKind::StateChanged { cause, .. }, Some(EventFate::Running))
                    if cause == RECOVERY_CAUSE =>
                {
                    Some(crashed())
                }
                (_, fate) => fate,
            };
            if fate.as_ref().is_some_and(EventFate::is_settled) {
                break;
            }
        }
        fate
    }

    /// `true` once nothing more will happen to the event.
    pub fn is_settled(&self) -> bool {
        !matches!(self, EventFate::Pending | EventFate::Running)
    }

    /// The wire name of the status (`pending`, `answered`, …).
    pub fn status(&self) -> &'static str {
        match self {
            EventFate::Pending => "pending",
            EventFate::Running => "running",
            EventFate::Answered { .. } => "answered",
            EventFate::Refused { .. } => "refused",
            EventFate::Discarded => "discarded",
            EventFate::Failed { .. } => "failed",
        }
    }

    /// What the turn's outcome means for the events it took: an answer, a lockout (refused), a halt
    /// (discarded), or a failure.
    pub fn of_turn(outcome: &TurnOutcome, lockout: Option<&str>) -> EventFate {
        match (&outcome.answer, outcome.reason) {
            (Some(answer), reason) => EventFate::Answered {
                answer: answer.clone(),
                reason,
                usage: outcome.usage,
                truncated: outcome.truncated,
            },
            (None, TerminationReason::SafetyLockout) => EventFate::Refused {
                refusal: WorkRefusal::LockedOut {
                    cause: lockout.unwrap_or_default().to_owned(),
                },
            },
            (None, TerminationReason::Halted) => EventFate::Discarded,
            (None, reason) => EventFate::Failed {
                reason,
                error: outcome.error.clone(),
            },
        }
    }
}

fn is_zero_cost(cost: &f64) -> bool {
    *cost == 0.0
}

/// What happened. Variants that change an agent's [`crate::AgentRecord`] say so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// Record: created (role, parent, thresholds).
    Spawned {
        /// Assistant or sub-agent.
        role: AgentRole,
        /// The delegator a sub-agent reports to; `None` for an assistant.
        parent: Option<AgentKey>,
        /// The threshold of the consecutive-errors breaker it was spawned with.
        max_consecutive_errors: u32,
    },
    /// Record: `state = to`.
    StateChanged {
        /// The state before.
        from: AgentState,
        /// The state after.
        to: AgentState,
        /// Why (free text: the operation, breaker or recovery that caused it).
        cause: String,
    },
    /// An illegal transition was asked for and refused. No change.
    TransitionRefused {
        /// The state the agent was in (and stays in).
        from: AgentState,
        /// The state that was asked for.
        to: AgentState,
        /// Who or what asked.
        cause: String,
    },
    /// Record: `consecutive_errors = consecutive_errors`.
    ErrorCounted {
        /// The count after this failure.
        consecutive_errors: u32,
        /// The failure (tool or model error text).
        error: String,
    },
    /// Record: `consecutive_errors = 0` (a success after failures).
    ErrorsReset,
    /// Record: `error_window = window`. The error-cascade window after an operation that moved it
    /// while it held a failure: `x` a failed or anomalous operation, `.` a good one, oldest first;
    /// empty once no failure is left in it. Journaled only then (a window of good operations is
    /// not), so a restart restores the window the breakers had.
    ErrorWindow {
        /// The window's marks, oldest first (`x` failed, `.` good); empty: no failure in it.
        window: String,
    },
    /// Record: `lockout` set (the emergency stop). Journaled in one batch with the state change into
    /// `SAFETY_LOCKOUT`.
    LockedOut {
        /// The breaker that tripped.
        breaker: Breaker,
        /// Its message: what tripped it and the values involved.
        reason: String,
        /// The consecutive-error count at the trip.
        consecutive_errors: u32,
    },
    /// Record: lockout cleared, `consecutive_errors = 0`.
    Unlocked {
        /// Who unlocked it (the authenticated operator's name).
        operator: String,
        /// Why, in the operator's words (the console asks for a reason); absent: none given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// Record: conversation history cleared.
    HistoryReset {
        /// Who reset it.
        operator: String,
    },
    /// Record: paused / unpaused (ordinary lane not read while paused).
    Paused {
        /// Who paused it.
        operator: String,
    },
    /// Record: unpaused; the ordinary lane is read again.
    Unpaused {
        /// Who unpaused it.
        operator: String,
    },
    /// Record: `halts += 1`, `discarded_by_halt += discarded`, `pending` cleared (a halt discards the
    /// whole ordinary lane); when `stopped`, `fleet_halted` set for a fleet halt's cause
    /// ([`HaltCause::is_fleet`]) and cleared for any other, and likewise `lease_lost` for
    /// [`HaltCause::LeaseLost`]. Durable before the halt is acknowledged.
    Halted {
        /// Who or what halted the agent.
        cause: HaltCause,
        /// How many queued messages the halt cleared.
        discarded: u64,
        /// `true`: this halt stopped the agent (it was neither `STOPPED` nor locked out before it).
        /// Omitted when `false`, and absent (= `false`) in journals written before it.
        #[serde(default, skip_serializing_if = "is_false")]
        stopped: bool,
    },
    /// The messages a halt cleared, each listed. Record: the listed `queued` ids are settled (the
    /// `Halted` before it already cleared them; the listing settles them on its own too).
    MessagesDiscarded {
        /// Each cleared message, in lane order.
        messages: Vec<DiscardedMessage>,
    },
    /// Work refused by a locked-out or stopped agent. Record: a refused pending event (`queued`) is
    /// settled; a refusal before queueing (`queued` absent) changes nothing.
    WorkRefused {
        /// What was refused (`user_event`, `tick`, `delegated_task`, …).
        work: String,
        /// Why.
        refusal: WorkRefusal,
        /// The pending-event id, when the refused work was an accepted user event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queued: Option<u64>,
    },
    /// Record: `pending` gains the event, `last_event_id = id`. A user event accepted into the
    /// ordinary lane, journaled before the sender is answered.
    EventQueued {
        /// The pending-event id: unique over the agent's whole journal, across restarts.
        id: u64,
        /// The user event as it was sent.
        event: Arc<UserEvent>,
    },
    /// Record: `keyed` gains (`key`, `id`, the event), the oldest dropped past
    /// [`crate::AgentRecord::KEYS_KEPT`]. The idempotency key a sender gave event `id`; journaled in
    /// one batch with its `EventQueued`, right after it.
    EventKeyed {
        /// The pending-event id of the `EventQueued` just before.
        id: u64,
        /// The sender's `Idempotency-Key`.
        key: String,
    },
    /// Record: pending event `id` settled — a turn took it. Journaled in the same transaction as the
    /// `HistoryAppended` of its message, so a crash keeps both or neither.
    EventTaken {
        /// The pending-event id.
        id: u64,
    },
    /// Record: history gains `message`.
    HistoryAppended {
        /// The message, as the model will see it in later turns.
        message: ChatMessage,
    },
    /// Record: the `removed` oldest history messages are replaced by `summary` (memory compaction:
    /// the history reached 80 % of `execution.max_context_tokens`). `removed` ends at a tool-call
    /// unit's boundary, so no kept tool result loses its call. `fallback`: the model's summary was
    /// not available (failed, refused, empty) and `summary` is a deterministic marker instead.
    HistoryCompacted {
        /// How many messages, from the oldest, were removed.
        removed: u64,
        /// The one message that takes their place (an internal `user` message).
        summary: ChatMessage,
        /// `true` when `summary` is the deterministic marker, not the model's summary.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        fallback: bool,
    },
    /// Record: `reflections` gains `reflection` (the oldest dropped past
    /// [`crate::AgentRecord::REFLECTIONS_KEPT`]), `reflected_at = turns`. Written by the model every
    /// `memory.reflection_interval` turns.
    Reflected {
        /// The reflection, as the system message will carry it.
        reflection: String,
    },
    /// Record: `goals` replaced (the system message carries them).
    GoalsSet {
        /// The new goals, in order (empty: none).
        goals: Vec<String>,
        /// Who set them: `team` (the team file, at the first spawn), `model` (the `set_goals`
        /// tool), or the operator's name.
        by: String,
    },
    /// The last hour's model-call tokens reached `safety.budget.tokens_per_hour`: the agent waits
    /// `wait_ms` (until enough of them age out) before its next model call. Journaled once a wait.
    TokenBudgetWaiting {
        /// Tokens of the last hour.
        tokens: u64,
        /// `safety.budget.tokens_per_hour`.
        limit: u64,
        /// How long the wait will be, in ms.
        wait_ms: u64,
    },
    /// Record: `turns += 1`.
    TurnFinished {
        /// How the turn ended.
        outcome: TurnOutcome,
    },
    /// Record: `usage` grows by one model call's tokens and `cost` (priced when the call was made;
    /// `unpriced`: the model has no price and its tokens count as unpriced). Journaled right after
    /// the call, committed with the turn's other events (no wait of its own), so a restart keeps
    /// the budgets spent.
    UsageRecorded {
        /// Prompt and completion tokens of the call.
        usage: Usage,
        /// Its cost in the price table's currency (absent: 0).
        #[serde(default, skip_serializing_if = "is_zero_cost")]
        cost: f64,
        /// `true` when the model has no price: its tokens count against `unpriced` budgets only.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unpriced: bool,
    },
    /// A tool call started (after the circuit, schema and halt checks passed). No change.
    ToolStarted {
        /// The model's tool-call id.
        call_id: String,
        /// The tool's name.
        tool: String,
    },
    /// A tool call ended (successfully, failed, timed out or panicked). No change.
    ToolFinished {
        /// The model's tool-call id.
        call_id: String,
        /// The tool's name.
        tool: String,
        /// `true` when the tool returned a result.
        ok: bool,
        /// The error the model was shown, when `ok` is false.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A tool call's attempt failed with a retryable error and the call is tried again after
    /// `delay_ms` (`[tools.retry]`, design 001). Only the call's final outcome is a
    /// `tool_finished` and counts for the breakers. No change.
    ToolRetried {
        /// The model's tool-call id.
        call_id: String,
        /// The tool's name.
        tool: String,
        /// The attempt that failed, from 1.
        attempt: u32,
        /// Attempts the call may make in all.
        max_attempts: u32,
        /// Why it failed.
        error: String,
        /// The wait before the next attempt, in milliseconds.
        delay_ms: u64,
    },
    /// A tool call refused because a halt was requested. No change.
    ToolRefused {
        /// The model's tool-call id.
        call_id: String,
        /// The tool's name.
        tool: String,
        /// Why (the halt that was pending).
        reason: String,
    },
    /// This agent sent a task to a delegate. No change.
    DelegationRequested {
        /// Delegation id, unique per supervisor; its `DelegationEnded` carries the same id.
        id: u64,
        /// The delegate.
        to: AgentKey,
        /// The length of the delegation chain the task carries (checked against `safety.loop.max_agent_hops`).
        hops: u32,
        /// The task, its first 200 characters (`…` appended when it was longer; the delegate's
        /// own event carries all of it): what the console's timeline shows. Empty in journals
        /// written before it was recorded.
        #[serde(default)]
        task: String,
    },
    /// The supervisor refused a delegation before the task was sent. No change.
    DelegationRefused {
        /// The delegate that was asked for.
        to: AgentKey,
        /// Why it was refused.
        refusal: DelegationRefusal,
    },
    /// A delegation ended, however it ended; the delegator's slot is released. No change.
    DelegationEnded {
        /// The id of its `DelegationRequested`.
        id: u64,
        /// The delegate.
        to: AgentKey,
        /// How it ended.
        outcome: DelegationOutcome,
    },
    /// A delegate this agent was waiting on tripped a breaker (the owner is notified). No change.
    DelegateLockedOut {
        /// The delegate.
        delegate: AgentKey,
        /// The delegate's lockout message.
        reason: String,
    },
    /// Record: `stopped_by = {breaker, reason}` — a breaker (budget) stopped the agent. The state change
    /// to STOPPED is its own event.
    BreakerStopped {
        /// The breaker.
        breaker: Breaker,
        /// Its message.
        reason: String,
    },
    /// The repetition alert (or another system-level message) was injected into the context. No change.
    SafetyAlert {
        /// The text injected.
        message: String,
    },
    /// The near-budget warning (given once). No change.
    BudgetWarning {
        /// The warning text (what was spent of which budget).
        message: String,
    },
    /// A limit went through the checkpoint. No change.
    LimitDecided {
        /// Which limit.
        kind: crate::LimitKind,
        /// The value the agent reached (or would reach).
        current: f64,
        /// The configured limit.
        configured: f64,
        /// Allowed, extended or refused, and by what.
        decision: crate::LimitDecision,
    },
    /// A refused limit ends the task (before the wrap-up turn). No change.
    LimitDenied {
        /// Which limit.
        kind: crate::LimitKind,
        /// The value the agent reached.
        current: f64,
        /// The configured limit.
        configured: f64,
        /// Why it was refused.
        reason: crate::LimitReason,
    },
    /// The permission gate asked an operator about a tool call (verdict `ask`). No change.
    PermissionAsked {
        /// The intervention id the operator answers by.
        id: u64,
        /// The model's id of the call.
        call_id: String,
        /// The tool.
        tool: String,
        /// The arguments (canonical JSON, cut at 2000 characters).
        arguments: String,
        /// The key whose `ask` verdict asked.
        rule: String,
    },
    /// The permission gate decided a tool call whose verdict was not a plain `allow`: refused, or
    /// allowed by an operator (or a remembered yes). Journaled before an allowed call starts. No
    /// change.
    PermissionDecided {
        /// The model's id of the call.
        call_id: String,
        /// The tool.
        tool: String,
        /// Allowed or refused, by what, who answered.
        decision: crate::PermissionDecision,
    },
    /// A tool's circuit breaker changed state (`opened`, `reopened`, `closed`). No change.
    ToolCircuitChanged {
        /// The tool.
        tool: String,
        /// `opened after N failures`, `reopened after N failures` or `closed`.
        transition: String,
    },
    /// A tool server reported progress on a running call (MCP `notifications/progress`). No change.
    ToolProgress {
        /// The model's tool-call id.
        call_id: String,
        /// The tool's name (as the model sees it).
        tool: String,
        /// Progress so far, in the server's unit.
        progress: f64,
        /// The total, when the server knows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
        /// The server's message, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// An external tool (from an MCP server, `source`) was given to the agent at start: its
    /// description as the model sees it (capped) and the SHA-256 (hex) of that description and of
    /// its input schema (canonical JSON), so a later change can be told. No change.
    ToolDefined {
        /// The tool's name (as the model sees it).
        tool: String,
        /// The MCP server it comes from (its `[mcp_servers.NAME]`).
        source: String,
        /// Its description, capped (untrusted: the server wrote it).
        description: String,
        /// SHA-256 (hex) of the description.
        description_sha256: String,
        /// SHA-256 (hex) of the input schema, as canonical JSON.
        schema_sha256: String,
    },
    /// An external tool's description or schema changed after start (MCP `list_changed`), or the
    /// tool disappeared (`removed`): `accepted` when the server's `allow_changes` let the new
    /// definition in; otherwise the tool is disabled (its calls fail) until the server offers the
    /// original definition again. No change.
    ToolDefinitionChanged {
        /// The tool's name (as the model sees it).
        tool: String,
        /// The MCP server it comes from (its `[mcp_servers.NAME]`).
        source: String,
        /// The new description, capped; absent when the tool was removed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// SHA-256 (hex) of the new description.
        description_sha256: String,
        /// SHA-256 (hex) of the new input schema.
        schema_sha256: String,
        /// `true` when `allow_changes` let the change in.
        accepted: bool,
        /// `true` when the tool is no longer offered.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        removed: bool,
    },
    /// The actor died outside a clean stop (a panic in its own code).
    Crashed {
        /// The state the agent was in when it died.
        state: AgentState,
    },
    /// An NPC perceived a world event and classified it (the rule that fired, the trust). A TRIGGER
    /// is queued next as a user event (its own `event_queued`). Record: nothing, unless `observe`
    /// is set — then the event was kept for long-term memory and is not settled yet:
    /// `memory.unwritten` gains it, until the agent's own actor writes it (`memory_stored` with
    /// `observed`) or does not (`observation_not_stored`: a rate cap, a full store).
    Perceived {
        /// The world event, as the server sent it.
        event: crate::npc::WorldEvent,
        /// What the agent made of it.
        perception: crate::npc::Perception,
        /// Kept for long-term memory (a TRIGGER or CONTEXT with text, not the agent's own), for
        /// the agent's actor to admit within the rate caps and write: its importance. Absent in
        /// journals from before it (their observation is in the same batch's `memory_stored`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        observe: Option<crate::memory::Observe>,
    },
    /// An NPC's tick mode changed (awake, asleep, idle): its sleep hours began or ended, the
    /// presence of players in its room changed, a TRIGGER woke it. Journaled on a change only,
    /// never per tick. No change to the record.
    NpcModeChanged {
        /// The mode before.
        from: crate::npc::NpcMode,
        /// The mode now.
        to: crate::npc::NpcMode,
        /// Why, in words (`sleep hours began at game hour 2.00`, `no player in tavern`, …).
        cause: String,
    },
    /// Record: `memory` gains `memory` (long-term memory, docs/memory.md) after the `evicted` ids
    /// are removed; a fact is merged into or resolved against a standing one by
    /// [`crate::memory::MemoryStore::stored`].
    MemoryStored {
        /// The new memory (its links chosen when it was stored). Boxed: every event's size is
        /// its largest variant's.
        memory: Box<crate::memory::Memory>,
        /// The memories evicted to keep the store within `memory.max_memories` and
        /// `memory.max_bytes` (the lowest retention first).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        evicted: Vec<u64>,
        /// It is the perception kept as number `observed` (see `Perceived::observe`): that one
        /// and any before it leave `memory.unwritten`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        observed: Option<u64>,
    },
    /// Record: the perception kept as number `observed` (and any before it) leaves
    /// `memory.unwritten` without being stored: `reason` says why (a rate cap, memory full of
    /// memories younger than a game day, long-term memory turned off since). One row settles a
    /// run of them: the actor journals it for the last of the run.
    ObservationNotStored {
        /// The number the perception was kept as.
        observed: u64,
        /// Why, in words.
        reason: String,
    },
    /// Record: the model scored the importance of observations (`scores`: id, 1–10) in one
    /// batched call while the agent slept; `memory.scored_through = through` (memory time: the
    /// observations up to it are scored, whether the model named them or not).
    MemoryScored {
        /// The new importance of each memory the model scored.
        scores: Vec<(u64, u8)>,
        /// The newest memory time of the observations the call was shown.
        through: f64,
    },
    /// Record: the `ids` are removed from `memory`, and the profile of `about` when given.
    MemoryForgotten {
        /// The memories removed.
        ids: Vec<u64>,
        /// The entity forgotten (`DELETE /api/memories?about=`), when it was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        about: Option<String>,
        /// Who: `model` (the `forget` tool) or the operator's name.
        by: String,
    },
    /// Record: `memory.consolidation = {day, phase}` — a night's consolidation reached `phase`
    /// (design 001's `consolidation_progress`): journaled in one batch with what the phase before
    /// it did, so a crash mid-phase resumes at the phase it reached.
    MemoryConsolidated {
        /// The game day consolidated.
        day: u64,
        /// The phase reached (the next to run, or `done`).
        phase: crate::memory::SleepPhase,
    },
    /// Record: `memory.scheduled_wake = at` — the agent scheduled its wake within its sleep
    /// hours (the `wake_at` tool; design 001's `scheduled_wake_time`).
    WakeScheduled {
        /// The wake, in memory time (game seconds).
        at: f64,
    },
    /// Record: the `ids` were recalled into a model call: `accessed = at` (memory time).
    MemoryRecalled {
        /// The memories recalled.
        ids: Vec<u64>,
        /// Memory time of the recall.
        at: f64,
    },
    /// A delegation to a remote A2A agent (`[a2a_agents.NAME]`) has its task on the peer: sent,
    /// and the peer answered with the task's id. Record: the task is outstanding
    /// ([`crate::Outstanding::a2a_tasks`]) until its `A2aTaskEnded`; a restart that finds it
    /// outstanding settles it (docs/a2a.md, "After a crash").
    A2aTaskStarted {
        /// The remote agent's name (`[a2a_agents.NAME]`).
        to: AgentKey,
        /// The task's id on the peer.
        task_id: String,
        /// The task's context on the peer (empty when the peer gave none).
        context_id: String,
        /// The `messageId` warden sent (`warden:AGENT/RUN/CALL`).
        message_id: String,
        /// The model's id of the `delegate` call waiting for it.
        call_id: String,
    },
    /// The remote task is `input-required`: its question went to warden's operator as an
    /// intervention (answered like every ask: `POST /api/interventions/{id}`, `warden ask`, the
    /// console). No change.
    A2aAsked {
        /// The intervention id the operator answers by.
        id: u64,
        /// The remote agent.
        to: AgentKey,
        /// The task on the peer.
        task_id: String,
        /// The peer's question (its status message's text).
        question: String,
    },
    /// The operator answered a remote task's question; the answer is sent to the peer as the next
    /// message on that task. No change.
    A2aAnswered {
        /// The intervention id.
        id: u64,
        /// The remote agent.
        to: AgentKey,
        /// The task on the peer.
        task_id: String,
        /// The text sent (the answer, then the note, if any).
        answer: String,
        /// Who answered, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::AnsweredBy>,
    },
    /// A remote task warden followed is settled: it ended on the peer, warden canceled it (a halt
    /// of the delegator, a question nobody answered), or a restart found it outstanding. Record:
    /// no longer outstanding.
    A2aTaskEnded {
        /// The remote agent.
        to: AgentKey,
        /// The task on the peer.
        task_id: String,
        /// The peer's last state as warden saw it (`completed`, `failed`, `canceled`,
        /// `rejected`, …), or `unknown` when the peer could not be asked.
        state: String,
        /// What happened, in words (the answer, why it failed, `cancel sent: …`).
        detail: String,
    },
    /// Record: `restarts += 1`. Safety state is kept.
    Restarted {
        /// The restart count after this restart.
        restarts: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_and_role_names_are_their_serde_names() {
        for b in [
            Breaker::ConsecutiveErrors,
            Breaker::BudgetExceeded,
            Breaker::Repetition,
            Breaker::Stuck,
            Breaker::ErrorCascade,
            Breaker::LoopCap,
            Breaker::PairLoop,
        ] {
            assert_eq!(serde_json::to_value(b).unwrap(), b.to_string());
        }
        for r in [AgentRole::Assistant, AgentRole::SubAgent] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.to_string());
        }
    }

    #[test]
    fn a_delegation_requested_from_before_the_task_was_recorded_reads_with_an_empty_task() {
        let old: EventKind =
            serde_json::from_str(r#"{"type":"delegation_requested","id":3,"to":"b","hops":1}"#)
                .unwrap();
        assert!(
            matches!(old, EventKind::DelegationRequested { id: 3, ref task, .. } if task.is_empty())
        );
    }

    #[test]
    fn truncated_is_absent_from_old_journals_and_only_written_when_true() {
        // An outcome and a fate as journaled before `truncated` existed.
        let old: TurnOutcome =
            serde_json::from_str(r#"{"reason":"noop","iterations":1,"answer":"hi"}"#).unwrap();
        assert!(!old.truncated);
        let fate: EventFate = serde_json::from_str(
            r#"{"status":"answered","answer":"hi","reason":"noop","usage":{"prompt_tokens":0,"completion_tokens":0}}"#,
        )
        .unwrap();
        assert!(matches!(
            fate,
            EventFate::Answered {
                truncated: false,
                ..
            }
        ));
        assert!(!serde_json::to_string(&old).unwrap().contains("truncated"));
        let mut cut = old;
        cut.truncated = true;
        let text = serde_json::to_string(&cut).unwrap();
        assert!(text.contains(r#""truncated":true"#), "{text}");
        let back: TurnOutcome = serde_json::from_str(&text).unwrap();
        assert!(back.truncated);
        assert!(matches!(
            EventFate::of_turn(&back, None),
            EventFate::Answered {
                truncated: true,
                ..
            }
        ));
    }

    fn ev(agent: &str, kind: EventKind) -> Event {
        Event {
            seq: 0,
            at_ms: 0,
            agent: agent.into(),
            kind,
        }
    }

    fn queued(id: u64) -> EventKind {
        EventKind::EventQueued {
            id,
            event: Arc::new(UserEvent::new("hi")),
        }
    }

    fn finished(ids: &[u64], answer: Option<&str>, reason: TerminationReason) -> EventKind {
        let mut outcome = TurnOutcome::new(reason, 1, answer.map(str::to_owned));
        outcome.events = ids.to_vec();
        EventKind::TurnFinished { outcome }
    }

    fn fate(kinds: Vec<EventKind>) -> Option<EventFate> {
        let events: Vec<Event> = kinds.into_iter().map(|k| ev("a", k)).collect();
        EventFate::of_event(7, &events)
    }

    #[test]
    fn every_way_an_event_ends_is_read_from_the_journal() {
        use TerminationReason::*;
        let taken = || EventKind::EventTaken { id: 7 };
        let halted = || EventKind::Halted {
            cause: HaltCause::HaltAll,
            discarded: 0,
            stopped: true,
        };
        assert_eq!(fate(vec![queued(6)]), None, "never queued");
        assert_eq!(fate(vec![queued(7)]), Some(EventFate::Pending));
        assert_eq!(fate(vec![queued(7), taken()]), Some(EventFate::Running));
        assert_eq!(
            fate(vec![
                queued(7),
                taken(),
                finished(&[7], Some("yes"), Answered)
            ]),
            Some(EventFate::Answered {
                answer: "yes".into(),
                reason: Answered,
                usage: Usage::default(),
                truncated: false,
            })
        );
        // Another turn's end does not settle it.
        assert_eq!(
            fate(vec![
                queued(7),
                taken(),
                finished(&[6], Some("no"), Answered)
            ]),
            Some(EventFate::Running)
        );
        assert_eq!(
            fate(vec![queued(7), taken(), finished(&[7], None, LlmError)]),
            Some(EventFate::Failed {
                reason: LlmError,
                error: None
            })
        );
        let lockout = EventKind::LockedOut {
            breaker: Breaker::ConsecutiveErrors,
            reason: "five in a row".into(),
            consecutive_errors: 5,
        };
        assert_eq!(
            fate(vec![
                queued(7),
                taken(),
                lockout,
                finished(&[7], None, SafetyLockout)
            ]),
            Some(EventFate::Refused {
                refusal: WorkRefusal::LockedOut {
                    cause: "five in a row".into()
                }
            })
        );
        let refused = EventKind::WorkRefused {
            work: "user_event".into(),
            refusal: WorkRefusal::Stopped,
            queued: Some(7),
        };
        assert_eq!(
            fate(vec![queued(7), refused]),
            Some(EventFate::Refused {
                refusal: WorkRefusal::Stopped
            })
        );
        assert_eq!(fate(vec![queued(7), halted()]), Some(EventFate::Discarded));
        assert_eq!(
            fate(vec![queued(7), taken(), halted()]),
            Some(EventFate::Discarded)
        );
        let listed = EventKind::MessagesDiscarded {
            messages: vec![DiscardedMessage {
                id: 1,
                priority: Priority::Ordinary,
                kind: "user_event".into(),
                queued: Some(7),
            }],
        };
        assert_eq!(fate(vec![queued(7), listed]), Some(EventFate::Discarded));
        for died in [
            EventKind::Crashed {
                state: AgentState::Executing,
            },
            EventKind::Restarted { restarts: 1 },
            EventKind::StateChanged {
                from: AgentState::Executing,
                to: AgentState::WaitingForEvent,
                cause: RECOVERY_CAUSE.into(),
            },
        ] {
            assert!(
                matches!(
                    fate(vec![queued(7), taken(), died.clone()]),
                    Some(EventFate::Failed {
                        reason: Crashed,
                        ..
                    })
                ),
                "{died:?}"
            );
        }
        // The first settlement stands; another agent's events are not read.
        let events = vec![
            ev("a", queued(7)),
            ev("b", EventKind::EventTaken { id: 7 }),
            ev("a", halted()),
            ev("a", EventKind::EventTaken { id: 7 }),
        ];
        assert_eq!(EventFate::of_event(7, &events), Some(EventFate::Discarded));
    }
}
