//! [`AgentCell`]: everything an agent is, shared by its handle, its actor (across restarts) and the
//! supervisor. The actor is a thin driver; the cell holds the state.
//!
//! # Invariants
//! * The [`AgentRecord`] changes only through [`AgentCell::emit`], which applies the event and journals
//!   it under the record lock — the journal order is the order of changes, and a replay rebuilds it.
//! * The state changes only through [`AgentCell::transition`], checked against
//!   [`warden_protocols::TRANSITIONS`]; an illegal request is journaled as `TransitionRefused` and logged.
//! * A halt is visible before the actor reads it: [`AgentCell::request_halt`] sets `halt_requested` and
//!   cancels `halt_token` synchronously, so a running turn stops at its next await point and
//!   [`AgentCell::begin_tool`] refuses to start a tool.
//!
//! * A user event is queued (mailbox push and `EventQueued`) under the record lock, and the actor
//!   settles it under the record lock, so the record's pending events are the user events in the
//!   ordinary lane (see the `agent` module docs).
//!
//! # Lock order
//! `record` → journal's internal lock; `record` → a mailbox lane (a leaf); `record` → `waiters`,
//! `record` → `answering` (leaves). `delegations` is a leaf.
//! No lock is held across an await.

use crate::{
    agent::{
        reply::{ReplyHub, Waiters},
        AgentMsg, Signal, Work,
    },
    context::ContextStrategy,
    journal::{now_ms, Journal},
    mailbox::PriorityMailbox,
    provider::Provider,
    safety::{AgentBreakers, TeamSafety, TripNotice, Verdict},
    tools::ToolRegistry,
    tools::ToolRunner,
};
use parking_lot::{Mutex, MutexGuard};
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering},
        Arc, Weak,
    },
    time::Duration,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use warden_protocols::{
    AgentKey, AgentRecord, AgentState, AgentStatus, Breaker, ChatMessage, EventFate, EventKind,
    IllegalTransition, Usage,
};

/// Per-agent settings taken from the config at spawn.
#[derive(Debug, Clone)]
pub(crate) struct AgentSettings {
    pub max_iterations_per_tick: u32,
    pub multi_action: bool,
    pub tool_timeout: Duration,
    pub sub_agent_budget: u32,
    /// 0 = no context management.
    pub max_context_tokens: u64,
    pub context_strategy: ContextStrategy,
    pub max_tokens_recoveries: u32,
}

/// The task (event or delegated task) the agent is working on: loop caps and the wall clock count
/// across the ticks of one task.
#[derive(Debug)]
pub(crate) struct TaskProgress {
    pub run_id: String,
    pub iterations: u32,
    pub started: tokio::time::Instant,
    seq: u64,
}

/// Everything a cell is made of.
pub(crate) struct CellParts {
    pub record: AgentRecord,
    pub mailbox: PriorityMailbox<AgentMsg>,
    pub provider: Arc<dyn Provider>,
    pub tools: ToolRegistry,
    pub runner: ToolRunner,
    pub system_prompt: Option<String>,
    pub settings: AgentSettings,
    pub journal: Arc<dyn Journal>,
    pub crash_tx: Option<UnboundedSender<(AgentKey, u64)>>,
    pub safety: Arc<TeamSafety>,
    pub replies: Arc<ReplyHub>,
}

/// What a hook's verdict did to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// Nothing stops the turn.
    Below,
    /// A breaker tripped: `EXECUTING → SAFETY_LOCKOUT`.
    Tripped,
    /// A budget stopped the agent: `EXECUTING → STOPPED`.
    Stopped,
}

pub(crate) struct AgentCell {
    pub key: AgentKey,
    pub mailbox: PriorityMailbox<AgentMsg>,
    pub provider: Arc<dyn Provider>,
    pub tools: ToolRegistry,
    pub runner: ToolRunner,
    pub system_prompt: Option<String>,
    pub settings: AgentSettings,
    pub safety: Arc<TeamSafety>,
    /// The synchronous breakers (lock order: `record` → `breakers`; never held across an await).
    breakers: Mutex<AgentBreakers>,
    task: Mutex<TaskProgress>,
    record: Mutex<AgentRecord>,
    state_mirror: AtomicU8,
    /// Mirrors `record.paused` (read by the mailbox pump without the record lock).
    paused_mirror: AtomicBool,
    halt_requested: AtomicBool,
    halt_token: Mutex<Option<CancellationToken>>,
    journal: Arc<dyn Journal>,
    /// Delegations this agent runs now: id → the delegate's cell.
    delegations: Mutex<HashMap<u64, Arc<AgentCell>>>,
    /// Agents running a delegation to this one now: id → the delegator (notified when this one trips).
    delegators: Mutex<HashMap<u64, Weak<AgentCell>>>,
    active_delegations: AtomicU32,
    /// Tool calls running now (several when a response's calls run in parallel). Changed under the
    /// record lock.
    tools_in_flight: AtomicU32,
    crash_tx: Option<UnboundedSender<(AgentKey, u64)>>,
    /// Incremented for each actor started on this cell; crash reports carry it, so a report from an
    /// actor that was already replaced is recognised as stale.
    generation: AtomicU64,
    /// The journal seq of the last event this agent journaled.
    last_seq: AtomicU64,
    /// Who waits for the reply to which event.
    pub(crate) waiters: Waiters,
    /// The team's reply stream.
    replies: Arc<ReplyHub>,
    /// Tokens of the running turn's model calls (reset when a turn starts).
    turn_usage: Mutex<Usage>,
    /// The user event the running turn answers (id, accepted): settled when the turn finishes, as
    /// discarded when a halt stops it, as failed when the actor crashes. Set under the record lock.
    answering: Mutex<Option<(u64, tokio::time::Instant)>>,
}

fn state_index(s: AgentState) -> u8 {
    AgentState::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8
}

impl AgentCell {
    pub fn new(parts: CellParts) -> Self {
        let CellParts {
            record,
            mailbox,
            provider,
            tools,
            runner,
            system_prompt,
            settings,
            journal,
            crash_tx,
            safety,
            replies,
        } = parts;
        let halted = record.state == AgentState::Stopped;
        let mut breakers = AgentBreakers::new(
            record.key.clone(),
            safety.config.clone(),
            provider.model().to_owned(),
            Some(safety.team.clone()),
        );
        breakers.restore_consecutive_errors(record.consecutive_errors);
        // Budgets spent before a restart stay spent (a fresh record has spent nothing).
        breakers.restore_usage(record.usage);
        if record.emergency_stop() {
            safety.team.set_locked_out(&record.key, true);
        }
        AgentCell {
            key: record.key.clone(),
            state_mirror: AtomicU8::new(state_index(record.state)),
            paused_mirror: AtomicBool::new(record.paused),
            record: Mutex::new(record),
            mailbox,
            provider,
            tools,
            runner,
            system_prompt,
            settings,
            safety,
            breakers: Mutex::new(breakers),
            task: Mutex::new(TaskProgress {
                run_id: String::new(),
                iterations: 0,
                started: tokio::time::Instant::now(),
                seq: 0,
            }),
            halt_requested: AtomicBool::new(halted),
            halt_token: Mutex::new(None),
            journal,
            delegations: Mutex::new(HashMap::new()),
            delegators: Mutex::new(HashMap::new()),
            active_delegations: AtomicU32::new(0),
            tools_in_flight: AtomicU32::new(0),
            crash_tx,
            generation: AtomicU64::new(0),
            last_seq: AtomicU64::new(0),
            waiters: Waiters::default(),
            replies,
            turn_usage: Mutex::new(Usage::default()),
            answering: Mutex::new(None),
        }
    }

    /// Locks the record for a sequence of changes.
    pub fn lock(&self) -> MutexGuard<'_, AgentRecord> {
        self.record.lock()
    }

    /// Applies `kind` to the record and journals it. Returns its journal seq.
    pub fn emit(&self, rec: &mut AgentRecord, kind: EventKind) -> u64 {
        self.apply(rec, &kind);
        let seq = self.journal.append(&self.key, kind);
        self.last_seq.store(seq, Ordering::Release);
        seq
    }

    /// [`AgentCell::emit`] for several events that must be durable together (a crash keeps all or
    /// none of them; see [`Journal::append_all`]).
    pub fn emit_all(&self, rec: &mut AgentRecord, kinds: Vec<EventKind>) -> u64 {
        for kind in &kinds {
            self.apply(rec, kind);
        }
        let seq = self.journal.append_all(&self.key, kinds);
        self.last_seq.store(seq, Ordering::Release);
        seq
    }

    /// Resolves once everything this agent has journaled so far is durable (an acknowledgement
    /// that promises durability waits on it, outside every lock), or with why it is not.
    pub fn durable_so_far(
        &self,
    ) -> futures::future::BoxFuture<'static, Result<(), crate::journal::NotDurable>> {
        self.journal.durable(self.last_seq.load(Ordering::Acquire))
    }

    fn apply(&self, rec: &mut AgentRecord, kind: &EventKind) {
        rec.apply(kind);
        match kind {
            EventKind::StateChanged { to, .. } => {
                self.state_mirror.store(state_index(*to), Ordering::Release)
            }
            EventKind::Paused { .. } | EventKind::Unpaused { .. } => {
                self.paused_mirror.store(rec.paused, Ordering::Release)
            }
            _ => {}
        }
    }

    /// The journal this agent writes to.
    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.journal
    }

    /// Puts the record's pending events back in the ordinary lane, in id order, before the actor
    /// starts (a restart on a journal): they keep their ids and are not journaled again. They may
    /// exceed the lane's capacity (see [`PriorityMailbox::requeue`]). Returns how many.
    pub fn requeue_pending(&self) -> usize {
        let rec = self.lock();
        let mut pending: Vec<_> = rec.pending.iter().collect();
        pending.sort_by_key(|p| p.id);
        let mut requeued = 0;
        for p in pending {
            let work = Work::Event {
                id: p.id,
                event: p.event.clone(),
                accepted: tokio::time::Instant::now(),
            };
            if self.mailbox.requeue(AgentMsg::Work(work)).is_ok() {
                requeued += 1;
            }
        }
        requeued
    }

    /// Journals an event that changes nothing in the record.
    pub fn note(&self, kind: EventKind) {
        let mut rec = self.lock();
        self.emit(&mut rec, kind);
    }

    /// Moves to `to` if the table allows it; otherwise journals the refusal and returns the error.
    pub fn transition(
        &self,
        rec: &mut AgentRecord,
        to: AgentState,
        cause: &str,
    ) -> Result<(), IllegalTransition> {
        self.transition_with(rec, Vec::new(), to, cause)
    }

    /// [`AgentCell::transition`], journaling `with` first in the same batch: the events the state
    /// change rests on (a lockout, an unlock, a breaker stop), so that a crash keeps both or neither
    /// and a replay never sees one without the other. On an illegal transition nothing of `with` is
    /// journaled: the refusal is.
    pub fn transition_with(
        &self,
        rec: &mut AgentRecord,
        with: Vec<EventKind>,
        to: AgentState,
        cause: &str,
    ) -> Result<(), IllegalTransition> {
        let from = rec.state;
        if let Err(err) = from.check_transition(to) {
            tracing::warn!(agent = %self.key, %from, %to, cause, "illegal transition refused");
            self.emit(
                rec,
                EventKind::TransitionRefused {
                    from,
                    to,
                    cause: cause.to_owned(),
                },
            );
            return Err(err);
        }
        let change = EventKind::StateChanged {
            from,
            to,
            cause: cause.to_owned(),
        };
        if with.is_empty() {
            self.emit(rec, change);
        } else {
            let mut kinds = with;
            kinds.push(change);
            self.emit_all(rec, kinds);
        }
        Ok(())
    }

    /// Whether ordinary work is paused, without taking the record lock.
    pub fn paused(&self) -> bool {
        self.paused_mirror.load(Ordering::Acquire)
    }

    /// The current state, without taking the record lock.
    pub fn state(&self) -> AgentState {
        AgentState::ALL[self.state_mirror.load(Ordering::Acquire) as usize]
    }

    // ---- halt -------------------------------------------------------------------------------------

    /// Makes a halt visible at once to the running turn (before the actor reads the halt message).
    /// Returns the delegates of the delegations running when the halt was raised, which the caller
    /// must halt too; empty if a halt was already requested (its caller has them).
    ///
    /// Order matters, and is what makes a halt reach every running delegate in every interleaving:
    /// 1. the flag goes up first: a delegation registered after the list below is read sees it and
    ///    is refused before its task is sent (see `Supervisor::delegate`; the `delegations` mutex
    ///    orders the two);
    /// 2. the running delegations are listed;
    /// 3. only then is the turn cancelled: a cancelled turn ends its delegations and drops them from
    ///    the list, so listing after the cancel (as the actor's halt handler once did) could find
    ///    none while a delegate still worked.
    pub fn request_halt(&self) -> Vec<Arc<AgentCell>> {
        let already = self.halt_requested.swap(true, Ordering::SeqCst);
        let delegates = if already {
            Vec::new()
        } else {
            self.running_delegates()
        };
        if let Some(token) = self.halt_token.lock().as_ref() {
            token.cancel();
        }
        delegates
    }

    /// The acknowledgement of a halt that was not (or could not be) handled by the actor: the state
    /// as it is, nothing discarded.
    pub fn halt_ack_now(&self) -> super::HaltAck {
        super::HaltAck {
            agent: self.key.clone(),
            state: self.state(),
            discarded: 0,
            not_durable: None,
        }
    }

    pub fn halt_requested(&self) -> bool {
        self.halt_requested.load(Ordering::SeqCst)
    }

    /// Cancelled when a halt is requested (already cancelled if one is pending). Created on first
    /// use: an agent that never runs a turn never allocates one.
    ///
    /// Race-free with [`AgentCell::request_halt`]: that raises the flag before it takes the lock,
    /// and this reads the flag under the lock, so either it sees the flag or the halt finds the token.
    pub fn halt_token(&self) -> CancellationToken {
        let mut slot = self.halt_token.lock();
        let token = slot.get_or_insert_with(CancellationToken::new);
        if self.halt_requested.load(Ordering::SeqCst) {
            token.cancel();
        }
        token.clone()
    }

    /// Clears a past halt request (on resume).
    pub fn clear_halt(&self) {
        let mut slot = self.halt_token.lock();
        *slot = None;
        self.halt_requested.store(false, Ordering::SeqCst);
    }

    // ---- errors and breakers ----------------------------------------------------------------------

    /// A failed operation with the breakers' verdict on it: counts it, obeys the verdict (a breaker's
    /// lockout or stop wins over the consecutive-error stop, whose reason would be less specific), and
    /// trips the emergency stop at `max_consecutive_errors`.
    pub fn fail(&self, error: &str, verdict: Verdict) -> Counted {
        let mut rec = self.lock();
        let n = rec.consecutive_errors.saturating_add(1);
        self.emit(
            &mut rec,
            EventKind::ErrorCounted {
                consecutive_errors: n,
                error: error.to_owned(),
            },
        );
        if rec.state != AgentState::Executing {
            return Counted::Below;
        }
        let counted = self.obey_locked(&mut rec, verdict);
        if counted != Counted::Below {
            return counted;
        }
        if n >= rec.max_consecutive_errors {
            self.trip(
                &mut rec,
                Breaker::ConsecutiveErrors,
                format!("Maximum consecutive errors reached ({n})"),
            );
            return Counted::Tripped;
        }
        Counted::Below
    }

    /// A successful action: resets the count, then obeys the breakers' verdict (e.g. stuck).
    pub fn succeed(&self, verdict: Verdict) -> Counted {
        let mut rec = self.lock();
        if rec.consecutive_errors > 0 {
            self.emit(&mut rec, EventKind::ErrorsReset);
        }
        self.obey_locked(&mut rec, verdict)
    }

    /// Obeys a verdict that is neither a success nor a failure (budget check, loop start).
    pub fn obey(&self, verdict: Verdict) -> Counted {
        if matches!(verdict, Verdict::Continue) {
            return Counted::Below;
        }
        let mut rec = self.lock();
        self.obey_locked(&mut rec, verdict)
    }

    fn obey_locked(&self, rec: &mut AgentRecord, verdict: Verdict) -> Counted {
        match verdict {
            Verdict::Continue | Verdict::Limit { .. } => Counted::Below,
            Verdict::Warn { message } => {
                tracing::warn!(agent = %self.key, %message, "near budget");
                self.emit(rec, EventKind::BudgetWarning { message });
                Counted::Below
            }
            Verdict::Alert { message } => {
                self.emit(
                    rec,
                    EventKind::SafetyAlert {
                        message: message.clone(),
                    },
                );
                self.emit(
                    rec,
                    EventKind::HistoryAppended {
                        message: ChatMessage::system(message).internal(),
                    },
                );
                Counted::Below
            }
            Verdict::Stop {
                breaker: Breaker::BudgetExceeded,
                reason,
            } => {
                // The near-budget warning before any budget stop, if this stop came first.
                let owed = self.breakers.lock().take_budget_warning();
                if let Some(message) = owed {
                    tracing::warn!(agent = %self.key, %message, "near budget");
                    self.emit(rec, EventKind::BudgetWarning { message });
                }
                if rec.state != AgentState::Executing {
                    return Counted::Below;
                }
                tracing::warn!(agent = %self.key, %reason, "budget exceeded");
                let stopped = EventKind::BreakerStopped {
                    breaker: Breaker::BudgetExceeded,
                    reason: reason.clone(),
                };
                let _ = self.transition_with(rec, vec![stopped], AgentState::Stopped, &reason);
                self.safety.notify(TripNotice {
                    agent: self.key.clone(),
                    breaker: Breaker::BudgetExceeded,
                    reason,
                    lockout: false,
                    at_ms: now_ms(),
                });
                Counted::Stopped
            }
            // Every other stop (stuck) and every lockout is a trip into SAFETY_LOCKOUT.
            Verdict::Stop { breaker, reason } | Verdict::Lockout { breaker, reason } => {
                if rec.state != AgentState::Executing {
                    return Counted::Below;
                }
                self.trip(rec, breaker, reason);
                Counted::Tripped
            }
        }
    }

    /// Locks the agent out: journals the lockout and `EXECUTING → SAFETY_LOCKOUT` in one batch; tells
    /// the monitor and every agent waiting on a delegation to this one. Only from `EXECUTING` (a
    /// breaker trips while a turn runs): anywhere else the transition is refused and nothing is
    /// locked out.
    pub fn trip(&self, rec: &mut AgentRecord, breaker: Breaker, reason: String) {
        tracing::warn!(agent = %self.key, ?breaker, %reason, "breaker tripped");
        let locked = EventKind::LockedOut {
            breaker,
            reason: reason.clone(),
            consecutive_errors: rec.consecutive_errors,
        };
        if self
            .transition_with(rec, vec![locked], AgentState::SafetyLockout, &reason)
            .is_err()
        {
            return;
        }
        self.safety.notify(TripNotice {
            agent: self.key.clone(),
            breaker,
            reason: reason.clone(),
            lockout: true,
            at_ms: now_ms(),
        });
        for delegator in self.delegators.lock().values().filter_map(Weak::upgrade) {
            let _ = delegator
                .mailbox
                .try_send(AgentMsg::Signal(Signal::DelegateLockedOut {
                    delegate: self.key.clone(),
                    reason: reason.clone(),
                }));
        }
    }

    /// Runs `f` on the breakers (only when the team's safety checks are on).
    pub fn breakers<R>(&self, f: impl FnOnce(&mut AgentBreakers) -> R) -> Option<R> {
        self.safety.checks.then(|| f(&mut self.breakers.lock()))
    }

    /// Usage is always accounted (status, team totals), even with the checks off, and journaled
    /// (`UsageRecorded`, not waited for: it is committed with the turn's other events), so the
    /// record's `usage` always equals the breakers' totals and a restart keeps the budgets spent.
    pub fn record_usage(&self, usage: warden_protocols::Usage) {
        self.turn_usage.lock().add(usage);
        let mut rec = self.lock();
        let (cost, unpriced) = self
            .breakers
            .lock()
            .record_usage(usage, self.provider.model());
        if usage.is_zero() && cost == 0.0 {
            return; // nothing spent, nothing to journal
        }
        self.emit(
            &mut rec,
            EventKind::UsageRecorded {
                usage,
                cost,
                unpriced,
            },
        );
    }

    /// After an unlock / history reset / resume: the breakers start clean.
    pub fn breakers_cleared(&self) {
        let mut b = self.breakers.lock();
        b.on_unlock();
        b.restore_consecutive_errors(0);
        drop(b);
        self.safety.cleared(&self.key);
    }

    /// After a restart: the breakers' count follows the record's.
    pub fn breakers_restore(&self, consecutive_errors: u32) {
        self.breakers
            .lock()
            .restore_consecutive_errors(consecutive_errors);
    }

    /// The running turn's usage so far, reset to zero (a turn starts, or it finished).
    pub fn take_turn_usage(&self) -> Usage {
        std::mem::take(&mut *self.turn_usage.lock())
    }

    // ---- replies ----------------------------------------------------------------------------------

    /// Settles event `id` (see [`super::reply`]): its waiter and the team's reply stream hear of it.
    pub fn settle(&self, id: u64, accepted: Option<tokio::time::Instant>, fate: EventFate) {
        super::reply::settle(&self.waiters, &self.replies, &self.key, id, accepted, fate);
    }

    /// The running turn answers event `id` (called under the record lock, as it is taken).
    pub fn set_answering(&self, id: u64, accepted: tokio::time::Instant) {
        *self.answering.lock() = Some((id, accepted));
    }

    /// The event the running turn answers, if any, no longer marked (its settler takes it).
    pub fn take_answering(&self) -> Option<(u64, tokio::time::Instant)> {
        self.answering.lock().take()
    }

    /// `true` while event `id` is pending or its turn runs (not settled yet). Under the record lock.
    pub fn unsettled(&self, rec: &AgentRecord, id: u64) -> bool {
        rec.pending.iter().any(|p| p.id == id)
            || self
                .answering
                .lock()
                .is_some_and(|(running, _)| running == id)
    }

    /// Settles the event of a turn that will never finish (the actor crashed or was restarted).
    pub fn settle_taken(&self, fate: EventFate) {
        if let Some((id, accepted)) = self.take_answering() {
            self.settle(id, Some(accepted), fate);
        }
    }

    // ---- task progress ------------------------------------------------------------------------------

    /// A new task (event or delegated task) starts: loop caps and the wall clock restart, and the
    /// checkpoint forgets the extensions it counted for the previous task (which ends here: a tick
    /// runs on in the current task, so nothing earlier does).
    pub fn begin_task(&self) -> String {
        let mut task = self.task.lock();
        if !task.run_id.is_empty() {
            self.safety.checkpoint.forget_run(&task.run_id);
        }
        task.seq += 1;
        task.run_id = format!("{}#{}", self.key, task.seq);
        task.iterations = 0;
        task.started = tokio::time::Instant::now();
        self.breakers.lock().begin_task();
        task.run_id.clone()
    }

    /// One more loop iteration of the current task: (iteration number in the task, elapsed).
    pub fn task_iteration(&self) -> (u32, Duration, String) {
        let mut task = self.task.lock();
        task.iterations = task.iterations.saturating_add(1);
        (task.iterations, task.started.elapsed(), task.run_id.clone())
    }

    /// The current task's run id (auto-extensions are counted per run).
    pub fn current_run_id(&self) -> String {
        self.task.lock().run_id.clone()
    }

    /// Takes back an iteration that a refused limit did not let run.
    pub fn task_iteration_undo(&self) {
        let mut task = self.task.lock();
        task.iterations = task.iterations.saturating_sub(1);
    }

    // ---- history ----------------------------------------------------------------------------------

    pub fn append_history(&self, message: ChatMessage) {
        let mut rec = self.lock();
        self.emit(&mut rec, EventKind::HistoryAppended { message });
    }

    /// System prompt + history, as sent to the model.
    pub fn conversation(&self) -> Vec<ChatMessage> {
        let rec = self.lock();
        let mut messages = Vec::with_capacity(rec.history.len() + 1);
        if let Some(prompt) = &self.system_prompt {
            messages.push(ChatMessage::system(prompt.clone()));
        }
        messages.extend(rec.history.iter().cloned());
        messages
    }

    // ---- delegations ------------------------------------------------------------------------------

    /// Takes a delegation slot if fewer than `budget` are in use; returns the count before on refusal.
    pub fn try_acquire_slot(&self, budget: u32) -> Result<(), u32> {
        self.active_delegations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < budget).then_some(n + 1)
            })
            .map(|_| ())
    }

    pub fn release_slot(&self) {
        let _ = self
            .active_delegations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    pub fn active_delegations(&self) -> u32 {
        self.active_delegations.load(Ordering::Acquire)
    }

    pub fn add_delegation(&self, id: u64, delegate: Arc<AgentCell>) {
        self.delegations.lock().insert(id, delegate);
    }

    pub fn remove_delegation(&self, id: u64) {
        self.delegations.lock().remove(&id);
    }

    pub fn add_delegator(&self, id: u64, delegator: &Arc<AgentCell>) {
        self.delegators.lock().insert(id, Arc::downgrade(delegator));
    }

    pub fn remove_delegator(&self, id: u64) {
        self.delegators.lock().remove(&id);
    }

    /// The delegates of the delegations running now.
    pub fn running_delegates(&self) -> Vec<Arc<AgentCell>> {
        self.delegations.lock().values().cloned().collect()
    }

    // ---- tools in flight --------------------------------------------------------------------------

    pub fn tools_in_flight(&self) -> u32 {
        self.tools_in_flight.load(Ordering::Acquire)
    }

    /// No tool runs now: a turn starts, or its calls were dropped (halt, crash).
    pub fn reset_tools_in_flight(&self) {
        self.tools_in_flight.store(0, Ordering::Release);
    }

    pub fn tool_started(&self) {
        self.tools_in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// Returns how many are still running.
    pub fn tool_finished(&self) -> u32 {
        self.tools_in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map_or(0, |n| n - 1)
    }

    // ---- crash ------------------------------------------------------------------------------------

    /// The generation of the next actor to start on this cell.
    pub fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The generation of the actor started last.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn report_crash(&self, generation: u64) {
        if let Some(tx) = &self.crash_tx {
            let _ = tx.send((self.key.clone(), generation));
        }
    }

    // ---- status -----------------------------------------------------------------------------------

    pub fn status(&self) -> AgentStatus {
        let (tokens_used, cost_used) = {
            let breakers = self.breakers.lock();
            (breakers.tokens_used(), breakers.cost_used())
        };
        let rec = self.lock();
        AgentStatus {
            key: rec.key.clone(),
            role: rec.role,
            state: rec.state,
            emergency_stop: rec.emergency_stop(),
            lockout: rec.lockout.clone(),
            consecutive_errors: rec.consecutive_errors,
            max_consecutive_errors: rec.max_consecutive_errors,
            active_sub_agents: self.active_delegations(),
            sub_agent_budget: self.settings.sub_agent_budget,
            parent: rec.parent.clone(),
            queued: self.mailbox.depths(),
            ordinary_capacity: self.mailbox.capacity(),
            discarded_by_halt: rec.discarded_by_halt,
            paused: rec.paused,
            halts: rec.halts,
            turns: rec.turns,
            restarts: rec.restarts,
            history_len: rec.history.len(),
            stopped_by: rec.stopped_by.clone(),
            tokens_used,
            cost_used,
        }
    }

    /// A copy of the record.
    pub fn record(&self) -> AgentRecord {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{journal::MemoryJournal, provider::ScriptedProvider};

    fn cell(journal: Arc<MemoryJournal>) -> AgentCell {
        cell_on(journal)
    }

    fn cell_on(journal: Arc<dyn Journal>) -> AgentCell {
        let config = warden_protocols::WardenConfig::default();
        let team = Arc::new(crate::safety::TeamBudget::new(&config.safety.budget));
        AgentCell::new(CellParts {
            record: AgentRecord::new("a".into()),
            mailbox: PriorityMailbox::new(8),
            provider: Arc::new(ScriptedProvider::new([])),
            tools: ToolRegistry::new(),
            runner: ToolRunner::default(),
            system_prompt: None,
            settings: AgentSettings {
                max_iterations_per_tick: 5,
                multi_action: true,
                tool_timeout: Duration::from_secs(30),
                sub_agent_budget: 3,
                max_context_tokens: 0,
                context_strategy: ContextStrategy::SlidingWindow,
                max_tokens_recoveries: 2,
            },
            journal,
            crash_tx: None,
            replies: Arc::default(),
            safety: Arc::new(TeamSafety {
                config: Arc::new(config.safety.clone()),
                checkpoint: Arc::new(crate::safety::LimitCheckpoint::new(
                    config.safety.on_limit.clone(),
                    None,
                )),
                team,
                monitor: None,
                checks: true,
            }),
        })
    }

    #[test]
    fn an_illegal_transition_is_refused_journaled_and_not_applied() {
        let journal = Arc::new(MemoryJournal::new());
        let cell = cell(journal.clone());
        let mut rec = cell.lock();
        let err = cell
            .transition(&mut rec, AgentState::SafetyLockout, "test")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "illegal transition WAITING_FOR_EVENT -> SAFETY_LOCKOUT"
        );
        assert_eq!(rec.state, AgentState::WaitingForEvent);
        drop(rec);
        assert_eq!(cell.state(), AgentState::WaitingForEvent);
        let events = journal.events();
        assert!(matches!(
            events.last().map(|e| &e.kind),
            Some(EventKind::TransitionRefused {
                from: AgentState::WaitingForEvent,
                to: AgentState::SafetyLockout,
                ..
            })
        ));
    }

    /// Records each `append`/`append_all` call as one batch.
    #[derive(Default)]
    struct Batches(Mutex<Vec<Vec<EventKind>>>);

    impl Journal for Batches {
        fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
            self.append_all(agent, vec![kind])
        }
        fn append_all(&self, _: &AgentKey, kinds: Vec<EventKind>) -> u64 {
            let mut batches = self.0.lock();
            batches.push(kinds);
            batches.len() as u64
        }
        fn durable(
            &self,
            _: u64,
        ) -> futures::future::BoxFuture<'static, Result<(), crate::journal::NotDurable>> {
            crate::journal::already_durable()
        }
        fn degraded(&self) -> Option<String> {
            None
        }
    }

    #[test]
    fn a_lockout_and_its_state_change_are_one_batch_and_only_from_executing() {
        let journal = Arc::new(Batches::default());
        let cell = cell_on(journal.clone());
        let mut rec = cell.lock();
        // Not in a turn: refused, and nothing is locked out.
        cell.trip(&mut rec, Breaker::Stuck, "stuck".into());
        assert!(!rec.emergency_stop());
        cell.transition(&mut rec, AgentState::Executing, "turn")
            .unwrap();
        journal.0.lock().clear();
        cell.trip(&mut rec, Breaker::Stuck, "stuck".into());
        assert!(rec.emergency_stop() && rec.lockout_consistent());
        let batches = journal.0.lock();
        assert_eq!(batches.len(), 1, "{batches:?}");
        assert!(matches!(
            batches[0].as_slice(),
            [
                EventKind::LockedOut { .. },
                EventKind::StateChanged {
                    from: AgentState::Executing,
                    to: AgentState::SafetyLockout,
                    ..
                }
            ]
        ));
    }

    #[test]
    fn a_failure_outside_a_turn_counts_but_cannot_trip_into_lockout() {
        let journal = Arc::new(MemoryJournal::new());
        let cell = cell(journal);
        for _ in 0..10 {
            assert_eq!(cell.fail("x", Verdict::Continue), Counted::Below);
        }
        assert_eq!(cell.state(), AgentState::WaitingForEvent);
    }

    #[test]
    fn slots_are_counted_exactly_against_the_budget() {
        let cell = cell(Arc::new(MemoryJournal::new()));
        assert!(cell.try_acquire_slot(2).is_ok());
        assert!(cell.try_acquire_slot(2).is_ok());
        assert_eq!(cell.try_acquire_slot(2), Err(2));
        cell.release_slot();
        assert_eq!(cell.active_delegations(), 1);
        cell.release_slot();
        cell.release_slot();
        assert_eq!(cell.active_delegations(), 0, "release never underflows");
    }
}
