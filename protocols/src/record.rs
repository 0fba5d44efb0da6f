//! [`AgentRecord`]: an agent's durable state, rebuilt by folding its events.
//!
//! Pending events: an accepted user event is pending in the record from its `EventQueued` until
//! exactly one of taken (`EventTaken`), discarded (`Halted` / `MessagesDiscarded`) or refused
//! (`WorkRefused` with `queued`) settles it. Settling an id that is not pending changes nothing.

use crate::{
    AgentKey, AgentRole, AgentState, Breaker, ChatMessage, Event, EventKind, HaltCause, Usage,
    UserEvent,
};
use serde::{Deserialize, Serialize};
use std::{collections::VecDeque, sync::Arc};

/// Why an agent is locked out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lockout {
    /// The breaker that tripped.
    pub breaker: Breaker,
    /// Its message: what tripped it and the values involved.
    pub reason: String,
}

/// A user event accepted into the ordinary lane and not settled yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEvent {
    /// Unique over the agent's journal (see [`AgentRecord::next_event_id`]).
    pub id: u64,
    /// The user event as it was sent.
    pub event: Arc<UserEvent>,
}

/// An accepted event that its sender named with an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedEvent {
    /// The sender's `Idempotency-Key`.
    pub key: String,
    /// The pending-event id the key was given to.
    pub id: u64,
    /// The user event, to tell a retry (same event) from a conflicting reuse of the key.
    pub event: Arc<UserEvent>,
}

/// Token and cost totals of an agent's model calls (over its whole journal: a restart keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Prompt (input) tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Completion (output) tokens.
    #[serde(default)]
    pub completion_tokens: u64,
    /// In the price currency (`safety.budget.prices`), as priced when each call was made.
    #[serde(default)]
    pub cost: f64,
    /// Tokens of models that have no price (they cost nothing in `cost`).
    #[serde(default)]
    pub unpriced_tokens: u64,
}

impl UsageTotals {
    /// Prompt and completion tokens together (saturating).
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// `true` before any model call.
    pub fn is_zero(&self) -> bool {
        *self == UsageTotals::default()
    }

    /// Adds one call: its tokens, its `cost`, and its tokens as unpriced when `unpriced`. The one
    /// place totals grow, so the live breakers and a replayed record add up exactly alike.
    pub fn add(&mut self, usage: Usage, cost: f64, unpriced: bool) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(usage.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(usage.completion_tokens);
        self.cost += cost;
        if unpriced {
            self.unpriced_tokens = self.unpriced_tokens.saturating_add(usage.total());
        }
    }
}

/// The durable state of one agent.
///
/// Invariant: the live agent mutates its record only through [`AgentRecord::apply`] on the events it
/// journals, so `AgentRecord::replay(journal)` equals the live record (tests hold it to that).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// The agent's key.
    pub key: AgentKey,
    /// Assistant or sub-agent.
    pub role: AgentRole,
    /// The delegator a sub-agent reports to; `None` for an assistant.
    pub parent: Option<AgentKey>,
    /// The lifecycle state (changed only through [`AgentRecord::apply`] on `StateChanged`).
    pub state: AgentState,
    /// Why the agent is locked out; `Some` from its `LockedOut` until its `Unlocked`. The one source
    /// of truth for the emergency stop ([`AgentRecord::emergency_stop`]). A lockout and the state
    /// change into `SAFETY_LOCKOUT` are journaled in one batch (as are an unlock and the state change
    /// out of it), so `lockout.is_some() == (state == SAFETY_LOCKOUT)` in every journal this version
    /// writes ([`AgentRecord::lockout_consistent`]).
    /// (Boxed: most agents are never locked out, and an idle agent's size counts.)
    pub lockout: Option<Box<Lockout>>,
    /// Why a breaker (not an operator) stopped the agent; cleared when it is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<Box<Lockout>>,
    /// Failed calls in a row; the consecutive-errors breaker trips at `max_consecutive_errors`.
    pub consecutive_errors: u32,
    /// The consecutive-errors breaker's threshold.
    pub max_consecutive_errors: u32,
    /// `true` while paused: the ordinary lane is not read.
    pub paused: bool,
    /// `true` while the agent is `STOPPED` by a halt of every agent ([`crate::HaltCause::is_fleet`]) that
    /// found it running: the agents a lift of that halt resumes, kept across restarts. Set by such
    /// a `Halted` (one that `stopped` it); cleared by a halt of another cause that stopped it, by
    /// any state change out of `STOPPED` (a resume, a lockout), and by a pause (an operator took
    /// it in hand: a lift leaves a paused agent anyway). Omitted while `false`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fleet_halted: bool,
    /// `true` while the agent is `STOPPED` by its cluster node giving it up
    /// ([`crate::HaltCause::LeaseLost`]): the node takes it back — across a restart too — when the
    /// lease comes back to it. Set and cleared as `fleet_halted` is (a pause does not clear it: a
    /// take-back leaves a paused agent anyway). Omitted while `false`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub lease_lost: bool,
    /// Halts so far.
    pub halts: u64,
    /// Ordinary messages cleared by halts, in total.
    pub discarded_by_halt: u64,
    /// Turns finished.
    pub turns: u64,
    /// Restarts after crashes.
    pub restarts: u32,
    /// The conversation, as the model sees it (before context trimming).
    pub history: Vec<ChatMessage>,
    /// The running token estimate of `history`: the sum of [`ChatMessage::estimated_tokens`],
    /// maintained by [`AgentRecord::apply`] (never recomputed per turn). Omitted while zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_tokens: u64,
    /// The agent's goals, carried in its system message (set by `GoalsSet`: the team file, the
    /// `set_goals` tool, an operator). Omitted while empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub goals: Vec<String>,
    /// The latest reflections (at most [`AgentRecord::REFLECTIONS_KEPT`], oldest first), carried in
    /// the system message. Omitted while empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reflections: Vec<String>,
    /// `turns` when the agent last reflected (`memory.reflection_interval`). Omitted while zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reflected_at: u64,
    /// Accepted user events not yet taken, discarded or refused, in the order accepted (= id order).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub pending: VecDeque<PendingEvent>,
    /// The highest pending-event id ever handed out (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub last_event_id: u64,
    /// The last [`AgentRecord::KEYS_KEPT`] events accepted with an idempotency key, oldest first:
    /// the same key again is answered with the first event's id instead of being queued.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub keyed: VecDeque<KeyedEvent>,
    /// Tokens and cost of every model call journaled (`UsageRecorded`): the budgets a restart
    /// starts from. Omitted while zero (and absent = zero), so records and snapshots from before it
    /// decode and mean the same.
    #[serde(default, skip_serializing_if = "UsageTotals::is_zero")]
    pub usage: UsageTotals,
    /// What is rarely set and must survive a crash: a halt's listing not written yet, the
    /// error-cascade window while it holds a failure. Boxed (and `None` while all of it is empty):
    /// an idle agent's record is part of its cell, whose size every agent of a fleet pays.
    /// Omitted while `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outstanding: Option<Box<Outstanding>>,
}

/// The rarely set part of an [`AgentRecord`] ([`AgentRecord::outstanding`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Outstanding {
    /// Messages halts cleared that no `MessagesDiscarded` has listed yet (a halt is acknowledged
    /// before its listing is written): `Halted` adds its `discarded`, each listed message takes one
    /// off. Non-zero after a restart only when a crash cut a listing: the restart lists what the
    /// journal knows of them (`discarding`) and counts the rest. Omitted while zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted: u64,
    /// The user events among the `unlisted` messages (the pending events a halt cleared), in id
    /// order, until a `MessagesDiscarded` lists them. Omitted while empty.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub discarding: VecDeque<PendingEvent>,
    /// The error-cascade window while it holds a failure (`ErrorWindow`: `x` failed, `.` good,
    /// oldest first), cleared with the breakers (unlock, history reset, resume): what a restart
    /// restores the breakers' window from. Omitted while empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_window: String,
    /// The tool call a permission ask holds (`PermissionAsked`) until its decision
    /// (`PermissionDecided`) or a result for it in the history: a call the turn stopped at while
    /// asking certainly did not run, and is answered so (not "interrupted, may have run"). Omitted
    /// while none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asking: Option<String>,
    /// Long-term memory (docs/memory.md): memories and entity profiles, from the first
    /// `memory_stored` on (read it with [`AgentRecord::memory`]). Here, in the boxed part, because
    /// most agents have none and an idle agent's record is part of its cell. Omitted while `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Box<crate::memory::MemoryStore>>,
    /// Tasks on remote A2A agents that a delegation sent (`A2aTaskStarted`) and that are not
    /// settled yet (`A2aTaskEnded`): what a restart after a crash must settle. Omitted while empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub a2a_tasks: Vec<A2aTaskRef>,
}

/// A task on a remote A2A agent a delegation is following ([`Outstanding::a2a_tasks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct A2aTaskRef {
    /// The remote agent's name (`[a2a_agents.NAME]`).
    pub to: AgentKey,
    /// The task's id on the peer.
    pub task_id: String,
    /// The model's id of the `delegate` call that waited for it.
    pub call_id: String,
}

impl Outstanding {
    /// A halt's cleared event `id` is listed (O(1) for the oldest: a listing goes in lane order).
    fn listed(&mut self, id: u64) {
        if self.discarding.front().is_some_and(|p| p.id == id) {
            self.discarding.pop_front();
        } else if let Some(at) = self.discarding.iter().position(|p| p.id == id) {
            self.discarding.remove(at);
        }
    }

    fn is_empty(&self) -> bool {
        self.unlisted == 0
            && self.discarding.is_empty()
            && self.error_window.is_empty()
            && self.asking.is_none()
            && self.memory.is_none()
            && self.a2a_tasks.is_empty()
    }
}

/// The most goals an agent has.
pub const MAX_GOALS: usize = 16;
/// The most characters one goal has.
pub const MAX_GOAL_CHARS: usize = 500;

/// Checks goals as every way of setting them does (team file, `set_goals` tool, operator): at most
/// [`MAX_GOALS`], each not blank and at most [`MAX_GOAL_CHARS`] characters.
///
/// # Errors
/// What is wrong, in words (e.g. `goal 2 is blank`).
pub fn check_goals(goals: &[String]) -> Result<(), String> {
    if goals.len() > MAX_GOALS {
        return Err(format!(
            "{} goals; at most {MAX_GOALS} are allowed",
            goals.len()
        ));
    }
    for (i, goal) in goals.iter().enumerate() {
        let n = i + 1;
        if goal.trim().is_empty() {
            return Err(format!("goal {n} is blank"));
        }
        let chars = goal.chars().count();
        if chars > MAX_GOAL_CHARS {
            return Err(format!(
                "goal {n} has {chars} characters; at most {MAX_GOAL_CHARS} are allowed"
            ));
        }
    }
    Ok(())
}

fn is_false(flag: &bool) -> bool {
    !flag
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl AgentRecord {
    /// A record before its `Spawned` event.
    pub fn new(key: AgentKey) -> Self {
        AgentRecord {
            key,
            role: AgentRole::Assistant,
            parent: None,
            state: AgentState::WaitingForEvent,
            lockout: None,
            stopped_by: None,
            consecutive_errors: 0,
            max_consecutive_errors: 5,
            paused: false,
            fleet_halted: false,
            lease_lost: false,
            halts: 0,
            discarded_by_halt: 0,
            turns: 0,
            restarts: 0,
            history: Vec::new(),
            history_tokens: 0,
            goals: Vec::new(),
            reflections: Vec::new(),
            reflected_at: 0,
            pending: VecDeque::new(),
            last_event_id: 0,
            keyed: VecDeque::new(),
            usage: UsageTotals::default(),
            outstanding: None,
        }
    }

    /// How many reflections the record (and the system message) keeps: the newest.
    pub const REFLECTIONS_KEPT: usize = 3;

    /// How many idempotency keys an agent remembers (its most recent keyed events).
    pub const KEYS_KEPT: usize = 1024;

    /// The event accepted earlier under idempotency key `key`, if it is still remembered.
    pub fn keyed(&self, key: &str) -> Option<&KeyedEvent> {
        self.keyed.iter().rev().find(|k| k.key == key)
    }

    /// `true` while locked out (any breaker): derived from [`AgentRecord::lockout`], never stored on
    /// its own, so it cannot disagree with it. A locked-out agent refuses all work, whatever its
    /// state says; delegation to it is refused.
    pub fn emergency_stop(&self) -> bool {
        self.lockout.is_some()
    }

    /// The lockout invariant: locked out exactly while in `SAFETY_LOCKOUT`. Holds for every record
    /// folded from a journal this version wrote; scenario tests assert it on their replays.
    pub fn lockout_consistent(&self) -> bool {
        self.emergency_stop() == (self.state == AgentState::SafetyLockout)
    }

    /// The id the next accepted event gets: above every id in the journal, so ids stay unique
    /// across restarts (a mailbox's own ids start again at 1).
    pub fn next_event_id(&self) -> u64 {
        self.last_event_id + 1
    }

    /// Settles pending event `id` (O(1) for the oldest, which is the one a turn takes).
    fn settle(&mut self, id: u64) {
        if self.pending.front().is_some_and(|p| p.id == id) {
            self.pending.pop_front();
        } else if let Some(at) = self.pending.iter().position(|p| p.id == id) {
            self.pending.remove(at);
        }
    }

    /// The perception kept last ([`crate::memory::MemoryStore::unwritten`]'s newest) was heard
    /// at `at` in this process (not journaled; see [`crate::memory::Unwritten::heard`]).
    pub fn heard(&mut self, at: std::time::Instant) {
        if let Some(u) = self.memory_mut().and_then(|s| s.unwritten.back_mut()) {
            u.heard = crate::memory::Heard(Some(at));
        }
    }

    fn memory_mut(&mut self) -> Option<&mut crate::memory::MemoryStore> {
        self.outstanding
            .as_deref_mut()
            .and_then(|o| o.memory.as_deref_mut())
    }

    fn outstanding_mut(&mut self) -> &mut Outstanding {
        self.outstanding.get_or_insert_with(Box::default)
    }

    /// The tool call a permission ask holds ([`Outstanding::asking`]), if any.
    pub fn asking_call(&self) -> Option<String> {
        self.outstanding.as_deref().and_then(|o| o.asking.clone())
    }

    /// Long-term memory (docs/memory.md), from the first `memory_stored` on.
    pub fn memory(&self) -> Option<&crate::memory::MemoryStore> {
        self.outstanding
            .as_deref()
            .and_then(|o| o.memory.as_deref())
    }

    fn stop_asking(&mut self) {
        if let Some(o) = self.outstanding.as_deref_mut() {
            o.asking = None;
        }
        self.tidy();
    }

    /// Back to `None` once nothing is outstanding (live and replayed records fold alike).
    fn tidy(&mut self) {
        if self
            .outstanding
            .as_deref()
            .is_some_and(Outstanding::is_empty)
        {
            self.outstanding = None;
        }
    }

    fn clear_error_window(&mut self) {
        if let Some(o) = self.outstanding.as_deref_mut() {
            o.error_window.clear();
        }
        self.tidy();
    }

    /// The remote A2A tasks not settled yet ([`Outstanding::a2a_tasks`]).
    pub fn a2a_tasks(&self) -> &[A2aTaskRef] {
        self.outstanding.as_deref().map_or(&[], |o| &o.a2a_tasks)
    }

    /// Messages halts cleared and not listed yet ([`Outstanding::unlisted`]).
    pub fn unlisted(&self) -> u64 {
        self.outstanding.as_deref().map_or(0, |o| o.unlisted)
    }

    /// The error-cascade window's marks while it holds a failure ([`Outstanding::error_window`];
    /// empty otherwise).
    pub fn error_window(&self) -> &str {
        self.outstanding
            .as_deref()
            .map_or("", |o| o.error_window.as_str())
    }

    /// What a restart lists for a halt whose listing a crash cut ([`AgentRecord::unlisted`]): each
    /// cleared user event the journal knows (kind `user_event`, its `queued` id; the mailbox id died
    /// with the process: 0), then one `unlisted` entry for each message the journal never knew
    /// (ticks, delegated tasks). Empty when nothing is outstanding.
    pub fn unlisted_discards(&self) -> Vec<crate::DiscardedMessage> {
        let Some(o) = self.outstanding.as_deref().filter(|o| o.unlisted > 0) else {
            return Vec::new();
        };
        let known = o.discarding.iter().map(|p| crate::DiscardedMessage {
            id: 0,
            priority: crate::Priority::Ordinary,
            kind: "user_event".into(),
            queued: Some(p.id),
        });
        let others = o.unlisted.saturating_sub(o.discarding.len() as u64);
        let unknown = (0..others).map(|_| crate::DiscardedMessage {
            id: 0,
            priority: crate::Priority::Ordinary,
            kind: "unlisted".into(),
            queued: None,
        });
        known.chain(unknown).collect()
    }

    /// Folds one event into the record.
    pub fn apply(&mut self, kind: &EventKind) {
        match kind {
            EventKind::Spawned {
                role,
                parent,
                max_consecutive_errors,
            } => {
                self.role = *role;
                self.parent = parent.clone();
                self.max_consecutive_errors = *max_consecutive_errors;
            }
            EventKind::StateChanged { to, .. } => {
                self.state = *to;
                if *to == AgentState::WaitingForEvent {
                    self.stopped_by = None;
                }
                if *to != AgentState::Stopped {
                    self.fleet_halted = false;
                    self.lease_lost = false;
                }
            }
            EventKind::BreakerStopped { breaker, reason } => {
                self.stopped_by = Some(Box::new(Lockout {
                    breaker: *breaker,
                    reason: reason.clone(),
                }));
            }
            EventKind::ErrorCounted {
                consecutive_errors, ..
            } => self.consecutive_errors = *consecutive_errors,
            EventKind::ErrorsReset => self.consecutive_errors = 0,
            EventKind::ErrorWindow { window } => {
                self.outstanding_mut().error_window.clone_from(window);
                self.tidy();
            }
            EventKind::LockedOut {
                breaker, reason, ..
            } => {
                self.lockout = Some(Box::new(Lockout {
                    breaker: *breaker,
                    reason: reason.clone(),
                }));
            }
            EventKind::Unlocked { .. } => {
                self.lockout = None;
                self.consecutive_errors = 0;
                self.clear_error_window();
            }
            EventKind::HistoryReset { .. } => {
                self.history.clear();
                self.history_tokens = 0;
                self.clear_error_window();
            }
            EventKind::Paused { .. } => {
                self.paused = true;
                self.fleet_halted = false;
            }
            EventKind::Unpaused { .. } => self.paused = false,
            EventKind::Halted {
                cause,
                discarded,
                stopped,
            } => {
                if *stopped {
                    self.fleet_halted = cause.is_fleet();
                    self.lease_lost = matches!(cause, HaltCause::LeaseLost { .. });
                }
                self.halts += 1;
                self.discarded_by_halt += discarded;
                if *discarded > 0 {
                    // The cleared pending events wait for their listing (moved, not copied: O(1)).
                    let mut pending = std::mem::take(&mut self.pending);
                    let o = self.outstanding_mut();
                    o.unlisted = o.unlisted.saturating_add(*discarded);
                    if o.discarding.is_empty() {
                        o.discarding = pending;
                    } else {
                        o.discarding.append(&mut pending);
                    }
                } else {
                    self.pending.clear();
                }
            }
            EventKind::EventQueued { id, event } => {
                self.pending.push_back(PendingEvent {
                    id: *id,
                    event: event.clone(),
                });
                self.last_event_id = self.last_event_id.max(*id);
            }
            EventKind::EventKeyed { id, key } => {
                // Journaled right after its `EventQueued`: the event is the newest pending one.
                if let Some(pending) = self.pending.iter().rev().find(|p| p.id == *id) {
                    if self.keyed.len() == Self::KEYS_KEPT {
                        self.keyed.pop_front();
                    }
                    self.keyed.push_back(KeyedEvent {
                        key: key.clone(),
                        id: *id,
                        event: pending.event.clone(),
                    });
                }
            }
            EventKind::EventTaken { id } => self.settle(*id),
            EventKind::WorkRefused {
                queued: Some(id), ..
            } => self.settle(*id),
            EventKind::MessagesDiscarded { messages } => {
                for id in messages.iter().filter_map(|m| m.queued) {
                    self.settle(id);
                }
                if let Some(o) = self.outstanding.as_deref_mut() {
                    for id in messages.iter().filter_map(|m| m.queued) {
                        o.listed(id);
                    }
                    o.unlisted = o.unlisted.saturating_sub(messages.len() as u64);
                    if o.unlisted == 0 {
                        o.discarding.clear();
                    }
                }
                self.tidy();
            }
            EventKind::HistoryAppended { message } => {
                self.history_tokens = self
                    .history_tokens
                    .saturating_add(message.estimated_tokens());
                self.history.push(message.clone());
                if message.tool_call_id.is_some() && message.tool_call_id == self.asking_call() {
                    self.stop_asking();
                }
            }
            EventKind::PermissionAsked { call_id, .. } => {
                self.outstanding_mut().asking = Some(call_id.clone());
            }
            EventKind::PermissionDecided { .. } => self.stop_asking(),
            EventKind::A2aTaskStarted {
                to,
                task_id,
                call_id,
                ..
            } => self.outstanding_mut().a2a_tasks.push(A2aTaskRef {
                to: to.clone(),
                task_id: task_id.clone(),
                call_id: call_id.clone(),
            }),
            EventKind::A2aTaskEnded { to, task_id, .. } => {
                if let Some(o) = self.outstanding.as_deref_mut() {
                    o.a2a_tasks
                        .retain(|t| !(t.to == *to && t.task_id == *task_id));
                }
                self.tidy();
            }
            EventKind::GoalsSet { goals, .. } => self.goals = goals.clone(),
            EventKind::Reflected { reflection } => {
                if self.reflections.len() == Self::REFLECTIONS_KEPT {
                    self.reflections.remove(0);
                }
                self.reflections.push(reflection.clone());
                self.reflected_at = self.turns;
            }
            EventKind::HistoryCompacted {
                removed, summary, ..
            } => {
                let removed = usize::try_from(*removed)
                    .unwrap_or(usize::MAX)
                    .min(self.history.len());
                let gone: u64 = self.history[..removed]
                    .iter()
                    .map(ChatMessage::estimated_tokens)
                    .sum();
                self.history.splice(..removed, [summary.clone()]);
                self.history_tokens = self
                    .history_tokens
                    .saturating_sub(gone)
                    .saturating_add(summary.estimated_tokens());
            }
            EventKind::TurnFinished { .. } => self.turns += 1,
            EventKind::UsageRecorded {
                usage,
                cost,
                unpriced,
            } => self.usage.add(*usage, *cost, *unpriced),
            EventKind::Restarted { restarts } => self.restarts = *restarts,
            EventKind::MemoryStored {
                memory,
                evicted,
                observed,
            } => {
                let store = self
                    .outstanding_mut()
                    .memory
                    .get_or_insert_with(Default::default);
                store.stored(memory, evicted);
                if let Some(n) = observed {
                    store.written(*n);
                }
            }
            EventKind::MemoryScored { scores, through } => {
                if let Some(store) = self.memory_mut() {
                    store.scored(scores, *through);
                }
            }
            EventKind::ObservationNotStored { observed, .. } => {
                if let Some(store) = self.memory_mut() {
                    store.written(*observed);
                }
            }
            EventKind::Perceived {
                event,
                perception,
                observe: Some(observe),
            } => {
                self.outstanding_mut()
                    .memory
                    .get_or_insert_with(Default::default)
                    .kept(event, perception, *observe);
            }
            EventKind::MemoryForgotten { ids, about, .. } => {
                if let Some(store) = self.memory_mut() {
                    store.forgotten(ids, about.as_deref());
                }
            }
            EventKind::MemoryConsolidated { day, phase } => {
                if let Some(store) = self.memory_mut() {
                    store.consolidated(*day, *phase);
                }
            }
            EventKind::WakeScheduled { at } => {
                if let Some(store) = self.memory_mut() {
                    store.scheduled_wake = Some(*at);
                }
            }
            EventKind::MemoryRecalled { ids, at } => {
                if let Some(store) = self.memory_mut() {
                    store.recalled(ids, *at);
                }
            }
            EventKind::TransitionRefused { .. }
            | EventKind::WorkRefused { queued: None, .. }
            | EventKind::ToolStarted { .. }
            | EventKind::ToolRetried { .. }
            | EventKind::ToolRefused { .. }
            | EventKind::DelegationRequested { .. }
            | EventKind::DelegationRefused { .. }
            | EventKind::DelegationEnded { .. }
            | EventKind::DelegateLockedOut { .. }
            | EventKind::SafetyAlert { .. }
            | EventKind::BudgetWarning { .. }
            | EventKind::LimitDecided { .. }
            | EventKind::LimitDenied { .. }
            | EventKind::ToolCircuitChanged { .. }
            | EventKind::ToolProgress { .. }
            | EventKind::ToolDefined { .. }
            | EventKind::ToolDefinitionChanged { .. }
            | EventKind::Crashed { .. }
            | EventKind::Perceived { observe: None, .. }
            | EventKind::TokenBudgetWaiting { .. }
            | EventKind::A2aAsked { .. }
            | EventKind::A2aAnswered { .. }
            | EventKind::NpcModeChanged {
                to: crate::npc::NpcMode::Asleep | crate::npc::NpcMode::Idle,
                ..
            } => {}
            // Design 001's `activity_since_wake`, for agents with long-term memory.
            EventKind::ToolFinished { .. } => {
                if let Some(store) = self.memory_mut() {
                    store.activity_since_wake = store.activity_since_wake.saturating_add(1);
                }
            }
            EventKind::NpcModeChanged {
                to: crate::npc::NpcMode::Awake,
                ..
            } => {
                if let Some(store) = self.memory_mut() {
                    store.activity_since_wake = 0;
                }
            }
        }
    }

    /// Rebuilds the record of `key` from a journal (events of other agents are skipped).
    ///
    /// # Examples
    ///
    /// ```
    /// use warden_protocols::{AgentKey, AgentRecord, AgentRole, AgentState, Event, EventKind};
    ///
    /// let npc = AgentKey::new("innkeeper");
    /// let event = |seq, kind| Event { seq, at_ms: 0, agent: npc.clone(), kind };
    /// let journal = [
    ///     event(1, EventKind::Spawned { role: AgentRole::Assistant, parent: None, max_consecutive_errors: 3 }),
    ///     event(2, EventKind::StateChanged {
    ///         from: AgentState::WaitingForEvent,
    ///         to: AgentState::Executing,
    ///         cause: "event".into(),
    ///     }),
    /// ];
    /// let record = AgentRecord::replay(npc, &journal);
    /// assert_eq!(record.state, AgentState::Executing);
    /// assert_eq!(record.max_consecutive_errors, 3);
    /// ```
    pub fn replay<'a>(key: AgentKey, events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut record = AgentRecord::new(key);
        for event in events {
            if event.agent == record.key {
                record.apply(&event.kind);
            }
        }
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DiscardedMessage, Priority, WorkRefusal};

    fn queued(id: u64, content: &str) -> EventKind {
        EventKind::EventQueued {
            id,
            event: Arc::new(UserEvent::new(content)),
        }
    }

    fn ids(record: &AgentRecord) -> Vec<u64> {
        record.pending.iter().map(|p| p.id).collect()
    }

    fn events(kinds: Vec<EventKind>) -> Vec<Event> {
        kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| Event {
                seq: i as u64 + 1,
                at_ms: 0,
                agent: "a".into(),
                kind,
            })
            .collect()
    }

    #[test]
    fn an_accepted_event_is_pending_until_taken_refused_or_discarded() {
        let mut record = AgentRecord::new("a".into());
        for id in 1..=5 {
            record.apply(&queued(id, &format!("e{id}")));
        }
        assert_eq!(ids(&record), [1, 2, 3, 4, 5]);
        assert_eq!(record.pending[2].event.content, "e3");

        record.apply(&EventKind::EventTaken { id: 1 });
        record.apply(&EventKind::WorkRefused {
            work: "user_event".into(),
            refusal: WorkRefusal::Stopped,
            queued: Some(3),
        });
        // A refusal before queueing settles nothing.
        record.apply(&EventKind::WorkRefused {
            work: "user_event".into(),
            refusal: WorkRefusal::Stopped,
            queued: None,
        });
        record.apply(&EventKind::MessagesDiscarded {
            messages: vec![DiscardedMessage {
                id: 77,
                priority: Priority::Ordinary,
                kind: "user_event".into(),
                queued: Some(4),
            }],
        });
        assert_eq!(ids(&record), [2, 5]);
        // Settling twice, or an id never queued, changes nothing.
        let before = record.clone();
        record.apply(&EventKind::EventTaken { id: 1 });
        record.apply(&EventKind::EventTaken { id: 99 });
        assert_eq!(record, before);

        record.apply(&EventKind::Halted {
            cause: HaltCause::HaltAll,
            discarded: 2,
            stopped: false,
        });
        assert!(record.pending.is_empty());
        // Ids keep growing after every event is settled.
        assert_eq!(record.last_event_id, 5);
        assert_eq!(record.next_event_id(), 6);
    }

    #[test]
    fn replay_of_queued_and_settled_events_equals_applying_them() {
        let kinds = vec![
            queued(1, "one"),
            queued(2, "two"),
            EventKind::EventTaken { id: 1 },
            queued(3, "three"),
            EventKind::Halted {
                cause: HaltCause::HaltAll,
                discarded: 2,
                stopped: true,
            },
            queued(4, "four"),
        ];
        let mut live = AgentRecord::new("a".into());
        for kind in &kinds {
            live.apply(kind);
        }
        let replayed = AgentRecord::replay("a".into(), &events(kinds));
        assert_eq!(replayed, live);
        assert_eq!(ids(&replayed), [4]);
        assert_eq!(replayed.next_event_id(), 5);
    }

    #[test]
    fn the_fleet_halt_flag_marks_exactly_the_agents_a_fleet_halt_stopped() {
        use crate::AgentState::{Executing, SafetyLockout, Stopped, WaitingForEvent};
        let halted = |cause: HaltCause, stopped| EventKind::Halted {
            cause,
            discarded: 0,
            stopped,
        };
        let to = |from, to| EventKind::StateChanged {
            from,
            to,
            cause: "test".into(),
        };
        let operator = || HaltCause::Operator {
            operator: "op".into(),
        };
        let host = || HaltCause::Host {
            reason: "drain".into(),
        };
        let after = |kinds: &[EventKind]| {
            let mut record = AgentRecord::new("a".into());
            for kind in kinds {
                record.apply(kind);
            }
            let replayed = AgentRecord::replay("a".into(), &events(kinds.to_vec()));
            assert_eq!(replayed, record, "replay equals applying");
            record.fleet_halted
        };
        let stop = to(WaitingForEvent, Stopped);
        // Stopped by a fleet halt (the supervisor's or a host's): set.
        assert!(after(&[stop.clone(), halted(HaltCause::HaltAll, true)]));
        assert!(after(&[stop.clone(), halted(host(), true)]));
        // A fleet halt that found it stopped (or locked out) already: not its halt.
        assert!(!after(&[stop.clone(), halted(HaltCause::HaltAll, false)]));
        // Stopped by an operator's halt of it, or a delegator's: not a fleet halt's.
        assert!(!after(&[stop.clone(), halted(operator(), true)]));
        // The fleet halt's agent halted again by an operator: still the fleet halt's (the halt
        // epoch does not move for a halt of a stopped agent, and a lift resumes it in memory too).
        assert!(after(&[
            stop.clone(),
            halted(HaltCause::HaltAll, true),
            halted(operator(), false),
        ]));
        // Resumed, locked out, or paused since: cleared.
        let fleet = [stop.clone(), halted(HaltCause::HaltAll, true)];
        assert!(!after(
            &[fleet.clone().as_slice(), &[to(Stopped, WaitingForEvent)]].concat()
        ));
        assert!(!after(
            &[fleet.clone().as_slice(), &[to(Stopped, SafetyLockout)]].concat()
        ));
        let pause = EventKind::Paused {
            operator: "op".into(),
        };
        assert!(!after(&[fleet.as_slice(), &[pause]].concat()));
        // Resumed, then stopped by an operator's halt: cleared.
        assert!(!after(&[
            stop.clone(),
            halted(HaltCause::HaltAll, true),
            to(Stopped, WaitingForEvent),
            to(WaitingForEvent, Executing),
            to(Executing, Stopped),
            halted(operator(), true),
        ]));
        // Journals written before the flag: a `Halted` without `stopped` decodes as `false`, and
        // a record without `fleet_halted` as not halted by the fleet; `false` is not written.
        let old: EventKind =
            serde_json::from_str(r#"{"type":"halted","cause":{"by":"halt_all"},"discarded":0}"#)
                .unwrap();
        assert_eq!(old, halted(HaltCause::HaltAll, false));
        let text = serde_json::to_string(&AgentRecord::new("a".into())).unwrap();
        assert!(!text.contains("fleet_halted"), "{text}");
        let mut record = AgentRecord::new("a".into());
        record.fleet_halted = true;
        let text = serde_json::to_string(&record).unwrap();
        let back: AgentRecord = serde_json::from_str(&text).unwrap();
        assert!(back.fleet_halted, "{text}");
    }

    #[test]
    fn the_lease_lost_flag_marks_an_agent_its_node_gave_up() {
        let given_up = || HaltCause::LeaseLost { node: "b".into() };
        let apply = |kinds: &[EventKind]| {
            let mut record = AgentRecord::new("a".into());
            for kind in kinds {
                record.apply(kind);
            }
            record
        };
        let stop = EventKind::StateChanged {
            from: AgentState::WaitingForEvent,
            to: AgentState::Stopped,
            cause: "system halt".into(),
        };
        let halted = |cause, stopped| EventKind::Halted {
            cause,
            discarded: 0,
            stopped,
        };
        let record = apply(&[stop.clone(), halted(given_up(), true)]);
        assert!(record.lease_lost && !record.fleet_halted);
        // Given up while stopped already (by an operator, or the fleet halt): not the give-up's.
        assert!(!apply(&[stop.clone(), halted(given_up(), false)]).lease_lost);
        // Taken back (resumed) or locked out: cleared; paused: kept.
        let resume = EventKind::StateChanged {
            from: AgentState::Stopped,
            to: AgentState::WaitingForEvent,
            cause: "resumed".into(),
        };
        assert!(!apply(&[stop.clone(), halted(given_up(), true), resume]).lease_lost);
        let pause = EventKind::Paused {
            operator: "op".into(),
        };
        assert!(apply(&[stop, halted(given_up(), true), pause]).lease_lost);
        let text = serde_json::to_string(&given_up()).unwrap();
        assert_eq!(text, r#"{"by":"lease_lost","node":"b"}"#);
    }

    #[test]
    fn journals_and_snapshots_from_before_pending_events_still_decode() {
        let refused: EventKind = serde_json::from_str(
            r#"{"type":"work_refused","work":"user_event","refusal":{"reason":"stopped"}}"#,
        )
        .unwrap();
        assert!(matches!(
            refused,
            EventKind::WorkRefused { queued: None, .. }
        ));
        let discarded: EventKind = serde_json::from_str(
            r#"{"type":"messages_discarded","messages":[{"id":3,"priority":"ordinary","kind":"tick"}]}"#,
        )
        .unwrap();
        assert!(
            matches!(&discarded, EventKind::MessagesDiscarded { messages } if messages[0].queued.is_none())
        );
        // A record without pending events serialises as before, and an old one decodes to it.
        let record = AgentRecord::new("a".into());
        let json = serde_json::to_value(&record).unwrap();
        assert!(json.get("pending").is_none() && json.get("last_event_id").is_none());
        let old: AgentRecord = serde_json::from_value(json).unwrap();
        assert_eq!(old, record);
    }

    #[test]
    fn usage_is_folded_into_the_record_and_old_records_decode_without_it() {
        let call = |p, c, cost, unpriced| EventKind::UsageRecorded {
            usage: Usage {
                prompt_tokens: p,
                completion_tokens: c,
                estimated: false,
            },
            cost,
            unpriced,
        };
        let kinds = vec![call(100, 20, 0.1, false), call(7, 3, 0.0, true)];
        let replayed = AgentRecord::replay("a".into(), &events(kinds.clone()));
        assert_eq!(
            replayed.usage,
            UsageTotals {
                prompt_tokens: 107,
                completion_tokens: 23,
                cost: 0.1,
                unpriced_tokens: 10,
            }
        );
        let json = serde_json::to_value(&kinds[1]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "usage_recorded",
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "estimated": false},
                "unpriced": true})
        );
        assert_eq!(serde_json::from_value::<EventKind>(json).unwrap(), kinds[1]);
        // A record that spent nothing has no `usage` field, and a record without one spent nothing.
        let fresh = serde_json::to_value(AgentRecord::new("a".into())).unwrap();
        assert!(fresh.get("usage").is_none());
        let back: AgentRecord =
            serde_json::from_str(&serde_json::to_string(&replayed).unwrap()).unwrap();
        assert_eq!(back, replayed);
    }

    #[test]
    fn new_events_round_trip_as_snake_case_json() {
        let kind = queued(7, "hello");
        let json = serde_json::to_value(&kind).unwrap();
        assert_eq!(json["type"], "event_queued");
        assert_eq!(json["event"]["content"], "hello");
        assert_eq!(serde_json::from_value::<EventKind>(json).unwrap(), kind);
        let taken = serde_json::to_value(EventKind::EventTaken { id: 7 }).unwrap();
        assert_eq!(taken, serde_json::json!({"type": "event_taken", "id": 7}));
        let mut record = AgentRecord::new("a".into());
        record.apply(&kind);
        let back: AgentRecord =
            serde_json::from_str(&serde_json::to_string(&record).unwrap()).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn idempotency_keys_name_their_events_and_only_the_newest_are_kept() {
        let mut record = AgentRecord::new("a".into());
        let n = AgentRecord::KEYS_KEPT as u64 + 2;
        for id in 1..=n {
            record.apply(&queued(id, &format!("e{id}")));
            record.apply(&EventKind::EventKeyed {
                id,
                key: format!("k{id}"),
            });
            record.apply(&EventKind::EventTaken { id });
        }
        assert_eq!(record.keyed.len(), AgentRecord::KEYS_KEPT);
        assert!(record.keyed("k1").is_none() && record.keyed("k2").is_none());
        let last = record.keyed(&format!("k{n}")).expect("kept");
        assert_eq!(
            (last.id, last.event.content.as_str()),
            (n, format!("e{n}").as_str())
        );
        // A key for an event that is not pending (never journaled so) names nothing.
        record.apply(&EventKind::EventKeyed {
            id: 999,
            key: "stray".into(),
        });
        assert!(record.keyed("stray").is_none());
    }

    #[test]
    fn a_halts_cleared_messages_wait_in_the_record_until_listed() {
        let listed = |queued: Option<u64>| DiscardedMessage {
            id: 9,
            priority: Priority::Ordinary,
            kind: if queued.is_some() {
                "user_event"
            } else {
                "tick"
            }
            .into(),
            queued,
        };
        let mut record = AgentRecord::new("a".into());
        for id in 1..=3 {
            record.apply(&queued(id, &format!("e{id}")));
        }
        // Three user events and a tick cleared: nothing listed yet.
        record.apply(&EventKind::Halted {
            cause: HaltCause::HaltAll,
            discarded: 4,
            stopped: true,
        });
        assert!(record.pending.is_empty());
        assert_eq!(record.unlisted(), 4);
        let waiting: Vec<u64> = record
            .outstanding
            .as_ref()
            .map(|o| o.discarding.iter().map(|p| p.id).collect())
            .unwrap_or_default();
        assert_eq!(waiting, [1, 2, 3]);
        // A listing cut after its first chunk: a restart lists the rest, the tick as `unlisted`.
        record.apply(&EventKind::MessagesDiscarded {
            messages: vec![listed(Some(1))],
        });
        let rest = record.unlisted_discards();
        let kinds: Vec<(&str, Option<u64>)> =
            rest.iter().map(|m| (m.kind.as_str(), m.queued)).collect();
        assert_eq!(
            kinds,
            [
                ("user_event", Some(2)),
                ("user_event", Some(3)),
                ("unlisted", None)
            ]
        );
        record.apply(&EventKind::MessagesDiscarded { messages: rest });
        assert_eq!(record.outstanding, None);
        assert!(record.unlisted_discards().is_empty());
        // A listing in full, as the live agent writes it, leaves nothing either.
        let mut live = AgentRecord::new("a".into());
        live.apply(&queued(1, "e1"));
        live.apply(&EventKind::Halted {
            cause: HaltCause::HaltAll,
            discarded: 2,
            stopped: true,
        });
        live.apply(&EventKind::MessagesDiscarded {
            messages: vec![listed(Some(1)), listed(None)],
        });
        assert_eq!(live.outstanding, None);
    }

    #[test]
    fn the_error_window_is_kept_until_unlock_or_reset() {
        let mut record = AgentRecord::new("a".into());
        record.apply(&EventKind::ErrorWindow {
            window: "x.xx".into(),
        });
        assert_eq!(record.error_window(), "x.xx");
        record.apply(&EventKind::Unlocked {
            operator: "op".into(),
            note: None,
        });
        assert_eq!(record.outstanding, None);
        record.apply(&EventKind::ErrorWindow { window: "x".into() });
        record.apply(&EventKind::HistoryReset {
            operator: "op".into(),
        });
        assert_eq!(record.outstanding, None);
    }

    #[test]
    fn a_remote_a2a_task_is_outstanding_from_its_start_to_its_end_and_survives_a_snapshot() {
        let mut rec = AgentRecord::new(AgentKey::from("boss"));
        let started = |task: &str| EventKind::A2aTaskStarted {
            to: AgentKey::from("peer"),
            task_id: task.into(),
            context_id: "c".into(),
            message_id: "warden:boss/r/1".into(),
            call_id: format!("call-{task}"),
        };
        rec.apply(&started("t1"));
        rec.apply(&started("t2"));
        let snapshot: AgentRecord =
            serde_json::from_str(&serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(snapshot, rec, "a snapshot keeps the outstanding tasks");
        assert_eq!(rec.a2a_tasks().len(), 2);
        rec.apply(&EventKind::A2aTaskEnded {
            to: AgentKey::from("peer"),
            task_id: "t1".into(),
            state: "completed".into(),
            detail: "42".into(),
        });
        assert_eq!(rec.a2a_tasks()[0].task_id, "t2");
        assert_eq!(rec.a2a_tasks()[0].call_id, "call-t2");
        rec.apply(&EventKind::A2aTaskEnded {
            to: AgentKey::from("peer"),
            task_id: "t2".into(),
            state: "canceled".into(),
            detail: "after a restart".into(),
        });
        assert!(
            rec.outstanding.is_none(),
            "nothing outstanding: {:?}",
            rec.outstanding
        );
    }

    #[test]
    fn a_call_held_by_a_permission_ask_is_known_until_its_result() {
        let mut record = AgentRecord::new("a".into());
        let asked = EventKind::PermissionAsked {
            id: 1,
            call_id: "c1".into(),
            tool: "rm".into(),
            arguments: "{}".into(),
            rule: "permissions.dangerous".into(),
        };
        record.apply(&asked);
        assert_eq!(record.asking_call().as_deref(), Some("c1"));
        // Another call's result leaves it held; its own result ends it.
        record.apply(&EventKind::HistoryAppended {
            message: ChatMessage::tool_result("c0", "{}"),
        });
        assert_eq!(record.asking_call().as_deref(), Some("c1"));
        record.apply(&EventKind::HistoryAppended {
            message: ChatMessage::tool_result("c1", "{}"),
        });
        assert_eq!(record.asking_call(), None);
        assert_eq!(record.outstanding, None, "tidied");
        // A decision ends it too.
        record.apply(&asked);
        record.apply(&EventKind::PermissionDecided {
            call_id: "c1".into(),
            tool: "rm".into(),
            decision: crate::PermissionDecision {
                allow: false,
                ruling: crate::Ruling {
                    verdict: crate::PermissionVerdict::Ask,
                    key: "permissions.dangerous".into(),
                },
                reason: crate::PermissionReason::Unattended,
                asked: None,
                answered_by: None,
            },
        });
        assert_eq!(record.outstanding, None);
    }
}
