//! The actix actor that drives one agent.
//!
//! It owns no state of its own beyond the handle of the running turn: everything lives in the
//! [`AgentCell`], so a restarted actor picks up exactly where the crashed one was (queue included).
//!
//! Reading order on every [`Wake`]: the most urgent lane first, one message at a time. While a turn runs
//! (or the agent is paused) only lanes 0–2 are read; ordinary work waits. The turn's future is kept
//! in the actor ([`RunningTurn`]) and polled by an item `ctx.spawn`ed for it, so a halt can end it
//! deterministically (see [`AgentActor::on_halt`]); nothing here ever `ctx.wait`s.

use super::{
    cell::AgentCell, turn, AgentMsg, ControlError, ControlOp, ControlRequest, HaltAck, HaltRequest,
    SentAck, Signal, TaskError, TaskReply, Work,
};
use crate::mailbox::{Envelope, Wake};
use crate::supervisor::Activator;
use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, SpawnHandle,
    WrapFuture,
};
use futures::FutureExt;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use warden_protocols::{
    AgentRecord, AgentState, DiscardedMessage, EventFate, EventKind, Priority, TerminationReason,
    TurnOutcome,
};

/// Messages read per wake before yielding to the arbiter.
const BATCH: usize = 64;

/// While the journal is degraded, how often an agent with queued work looks again.
const DEGRADED_RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

pub(crate) struct AgentActor {
    cell: Arc<AgentCell>,
    turn: Option<RunningTurn>,
    /// Turns started by this actor (the id of the next one).
    turns: u64,
    /// A look at queued work is scheduled (the journal was degraded).
    recheck: bool,
    generation: u64,
    /// Set only by a deliberate [`Shutdown`] or by passivation; any other end of the actor is a
    /// crash.
    clean_stop: bool,
    /// With `supervisor.passivate_after_seconds`: what takes this actor's place in the mailbox when
    /// it has been idle that long (see [`AgentActor::check_idle`]).
    passivation: Option<Activator>,
    /// It read or ran something since the last idle check.
    worked: bool,
}

/// A turn's future: what [`turn::run`] returns, boxed (the actor owns it, not its context).
type TurnFuture = Pin<Box<dyn Future<Output = (TurnOutcome, Option<TaskReply>)>>>;

/// The running turn. Its future lives here, in the actor, and a [`TurnDriver`] spawned on the
/// actor's context polls it: a halt takes it out and polls it one last time itself, so the turn
/// ends through its (already cancelled) token whatever else the context holds — see
/// [`AgentActor::on_halt`].
struct RunningTurn {
    id: u64,
    future: TurnFuture,
    /// The driver's handle, to cancel it when the turn is taken out.
    driver: SpawnHandle,
}

/// The context item that polls the running turn `0` (by id: a driver whose turn was taken out
/// never polls the next one) and, when it ends, finishes it and reads on.
struct TurnDriver(u64);

impl actix::ActorFuture<AgentActor> for TurnDriver {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut AgentActor,
        ctx: &mut Context<AgentActor>,
        task: &mut std::task::Context<'_>,
    ) -> Poll<()> {
        let id = self.0;
        let Some(turn) = act.turn.as_mut().filter(|t| t.id == id) else {
            return Poll::Ready(());
        };
        let Poll::Ready((outcome, reply)) = turn.future.as_mut().poll(task) else {
            return Poll::Pending;
        };
        act.turn = None;
        act.finish_turn(outcome, reply);
        act.pump(ctx);
        Poll::Ready(())
    }
}

/// The mailbox wakes its agent through the actor's address, which the mailbox holds (the one copy:
/// each copy of an actix address is two allocations, and an idle agent's size counts).
impl crate::mailbox::WakeSink for actix::Addr<AgentActor> {
    fn wake(&self) {
        self.do_send(Wake);
    }
}

/// Stops the actor deliberately (supervisor restarts of healthy agents, shutdown).
pub(crate) struct Shutdown;

impl Message for Shutdown {
    type Result = ();
}

impl AgentActor {
    pub(crate) fn new(
        cell: Arc<AgentCell>,
        generation: u64,
        passivation: Option<Activator>,
    ) -> Self {
        AgentActor {
            cell,
            turn: None,
            turns: 0,
            recheck: false,
            generation,
            clean_stop: false,
            passivation,
            worked: true,
        }
    }

    /// Every `passivate_after`: an actor that did nothing since the last look, runs no turn and
    /// waits for no timer, with no delegation running and an empty mailbox, stops and leaves the
    /// mailbox its [`Activator`] (the agent is *passive*; its cell stays in the registry, and the
    /// next message starts a new actor on the same arbiter). The mailbox decides the last part
    /// under its waker lock ([`crate::mailbox::PriorityMailbox::passivate`]), so a message sent
    /// meanwhile either keeps this actor or starts the next. An agent passivates between one and
    /// two periods after its last work.
    fn check_idle(&mut self, ctx: &mut Context<Self>) {
        let Some(activator) = &self.passivation else {
            return;
        };
        let idle = !self.worked
            && self.turn.is_none()
            && !self.recheck
            && self.cell.active_delegations() == 0;
        if idle && self.cell.mailbox.passivate(activator.clone()) {
            #[cfg(feature = "test-hooks")]
            crate::test_hooks::passivated(&self.cell.key);
            self.clean_stop = true;
            ctx.stop();
            return;
        }
        self.worked = false;
        let after = self.cell.settings.passivate_after;
        ctx.run_later(after, |act, ctx| act.check_idle(ctx));
    }

    fn pump(&mut self, ctx: &mut Context<Self>) {
        self.worked = true;
        // Another thread acts for this idle actor right now (an operator's halt applied on the
        // halting thread: `super::halt_if_idle`): read nothing; the end of its borrow wakes us.
        if !self.cell.mailbox.enter_reader() {
            #[cfg(feature = "test-hooks")]
            crate::test_hooks::pump_parked(&self.cell.key);
            return;
        }
        // Fail closed while the journal cannot write: no turn starts (a restart would not know of
        // it, and could not stop it); ordinary work waits, and is looked at again while it does.
        let degraded = self.cell.journal().degraded().is_some();
        if degraded && !self.recheck && self.cell.mailbox.depths().ordinary > 0 {
            self.recheck = true;
            ctx.run_later(DEGRADED_RECHECK, |act, ctx| {
                act.recheck = false;
                act.pump(ctx);
            });
        }
        for _ in 0..BATCH {
            // While a halt is requested but not yet read, ordinary work must stay queued: the halt
            // flag is set (and the turn cancelled) a moment before the halt message reaches lane 0.
            let busy =
                self.turn.is_some() || self.cell.halt_requested() || self.cell.paused() || degraded;
            let next = if busy {
                self.cell.mailbox.pop_urgent()
            } else {
                self.cell.mailbox.pop()
            };
            let Some(envelope) = next else {
                if self.turn.is_none() {
                    // Idle until the next wake: a halt may now be applied for us, on its caller's
                    // thread. (A running turn is ours to end: a halt meanwhile is queued.)
                    self.cell.mailbox.leave_reader();
                }
                #[cfg(feature = "test-hooks")]
                crate::test_hooks::pump_parked(&self.cell.key);
                return;
            };
            match envelope.msg {
                AgentMsg::Halt(request) => self.on_halt(request, ctx),
                AgentMsg::Control(request) => self.on_control(request),
                AgentMsg::Signal(signal) => self.on_signal(signal),
                AgentMsg::Work(work) => self.on_work(work, ctx),
            }
        }
        // Batch used up: continue after yielding the arbiter thread, so its other actors get a turn.
        // (Not with `ctx.notify(Wake)`: actix handles a notification in the same poll of this
        // actor's context, so the thread was never yielded.) The wake stays marked pending
        // meanwhile: senders post none, and this continuation drains as a `Wake` would.
        self.cell.mailbox.mark_wake_pending();
        ctx.spawn(
            tokio::task::yield_now()
                .into_actor(self)
                .map(|(), act, ctx| {
                    act.cell.mailbox.begin_drain();
                    act.pump(ctx);
                }),
        );
    }

    fn on_work(&mut self, work: Work, ctx: &mut Context<Self>) {
        {
            let mut rec = self.cell.lock();
            let refusal = super::refusal_for(&rec);
            if let Some(refusal) = refusal {
                // A refused user event is settled by its refusal (it never runs).
                self.cell.emit(
                    &mut rec,
                    EventKind::WorkRefused {
                        work: work.kind().into(),
                        refusal: refusal.clone(),
                        queued: work.queued(),
                    },
                );
                drop(rec);
                // A refused TRIGGER's turn was the writer of its delivery's observation.
                self.cell.write_observations_ahead();
                match work {
                    Work::Delegated(task) => {
                        let _ = task.reply.send(Err(TaskError::Refused(refusal)));
                    }
                    Work::Event { id, accepted, .. } => {
                        self.cell
                            .settle(id, Some(accepted), EventFate::Refused { refusal });
                    }
                    Work::Tick => self.cell.tick_left_lane(),
                }
                return;
            }
            self.cell.reset_tools_in_flight();
            let cause = format!("{} received", work.kind());
            if self
                .cell
                .transition(&mut rec, AgentState::Executing, &cause)
                .is_err()
            {
                drop(rec);
                self.cell.write_observations_ahead();
                return;
            }
        }
        let taken = turn::take(&self.cell, work);
        let cell = self.cell.clone();
        let turn = async move {
            // A turn that waits for nothing (a scripted or cached answer) ends in the poll that
            // started it, and its end starts the next one: actix polls this actor's context until
            // it has nothing left to do, so a backlog kept the arbiter thread from every other
            // actor on it — their halts and controls included — until the backlog was done
            // (issue 31). Once this task has spent its cooperative budget, the turn yields first.
            tokio::task::consume_budget().await;
            turn::run(cell, taken).await
        };
        self.turns += 1;
        let id = self.turns;
        let driver = ctx.spawn(TurnDriver(id));
        self.turn = Some(RunningTurn {
            id,
            future: Box::pin(turn),
            driver,
        });
    }

    fn finish_turn(&mut self, outcome: TurnOutcome, reply: Option<TaskReply>) {
        let mut rec = self.cell.lock();
        // A halt seen by the turn before the actor read it: the halt message will do the rest.
        if self.cell.halt_requested() {
            return;
        }
        if rec.state == AgentState::Executing {
            let cause = format!("turn finished: {}", outcome.reason);
            let _ = self
                .cell
                .transition(&mut rec, AgentState::WaitingForEvent, &cause);
        }
        let lockout = rec.lockout.as_ref().map(|l| l.reason.clone());
        self.cell.emit(
            &mut rec,
            EventKind::TurnFinished {
                outcome: outcome.clone(),
            },
        );
        drop(rec);
        if let Some((id, accepted)) = self.cell.take_answering() {
            let fate = EventFate::of_turn(&outcome, lockout.as_deref());
            self.cell.settle(id, Some(accepted), fate);
        }
        if let Some(reply) = reply {
            let result = match (outcome.answer, lockout, outcome.error) {
                (Some(answer), _, _) => Ok(answer),
                (None, Some(reason), _) if outcome.reason == TerminationReason::SafetyLockout => {
                    Err(TaskError::LockedOut(reason))
                }
                (None, _, Some(error)) => Err(TaskError::Failed(error)),
                (None, _, None) => Err(TaskError::NoAnswer(outcome.reason)),
            };
            let _ = reply.send(result);
        }
    }

    /// The halt message (lane 0). Its delegates were already halted by whoever sent it
    /// ([`super::send_halt_to`]), when the halt was raised.
    ///
    /// A running turn ends here, before the halt is applied: its token was cancelled when the halt
    /// was raised, and it is polled one last time, now, so that it ends through the token — its
    /// ending done (the `invoke_agent` span's halt, the tokens of a reply it held back recorded, a
    /// shown budget wait cleared) and nothing else run: every await of a turn races its token,
    /// which wins (`unless_halted` is biased). What it did not finish in that poll is dropped.
    /// Not left to the context: actix drops a cancelled item unpolled once an earlier item in its
    /// list was polled (an actor started by its first message has its idle check's timer there),
    /// and which came first decided whether a halted turn ended as halted or vanished.
    fn on_halt(&mut self, request: HaltRequest, ctx: &mut Context<Self>) {
        if let Some(turn) = self.turn.take() {
            ctx.cancel_future(turn.driver);
            // Unconstrained: a task out of cooperative budget would make the turn's first await
            // (`consume_budget`) pending. The turn's result is the halt's to settle: its outcome is
            // `Halted` or it raced the halt (`finish_turn` would drop it either way), and a
            // delegated task's reply, dropped, tells the delegator its task was abandoned.
            if tokio::task::unconstrained(turn.future)
                .now_or_never()
                .is_none()
            {
                tracing::debug!(agent = %self.cell.key, "a halted turn did not end in its last poll");
            }
        }
        let discarded = apply_halt(&self.cell, request);
        self.discard_later(discarded);
    }

    /// Listing and dropping a halt's cleared backlog is O(N): it runs as its own task after the
    /// ack, so the halt is acknowledged in O(1) whatever the backlog.
    fn discard_later(&self, discarded: VecDeque<Envelope<AgentMsg>>) {
        if !discarded.is_empty() {
            let cell = self.cell.clone();
            actix_rt::spawn(async move {
                discard_backlog_gently(&cell, discarded).await;
            });
        }
    }

    fn on_control(&mut self, request: ControlRequest) {
        let ControlRequest { op, reply } = request;
        let result = apply_control(&self.cell, op);
        // Acknowledged once what it changed is on disk: the caller waits for that (off every lock,
        // and off this arbiter, which a flooded agent may keep busy: see `SentAck`).
        let _ = reply.send(result.map(|()| self.cell.durable_so_far()));
    }

    fn on_signal(&mut self, signal: Signal) {
        match signal {
            Signal::DelegateLockedOut { delegate, reason } => {
                tracing::info!(agent = %self.cell.key, %delegate, %reason, "delegate locked out");
                self.cell
                    .note(EventKind::DelegateLockedOut { delegate, reason });
            }
            Signal::Remember => self.cell.write_observations_ahead(),
            Signal::Cleared(discarded) => {
                settle_cleared(&self.cell, &discarded);
                self.discard_later(discarded);
            }
        }
    }
}

/// An operator's control (unlock, resume, pause, reset) applied to the agent's record, under its
/// lock: by its actor, in the order of its control lane, or — for a passive agent — by the caller,
/// with no actor started ([`super::AgentHandle`]'s `control`). Touches nothing but the cell.
pub(crate) fn apply_control(cell: &AgentCell, op: ControlOp) -> Result<(), ControlError> {
    let mut rec = cell.lock();
    match op {
        ControlOp::Unlock { operator, note } => lift_lockout(cell, &mut rec, &operator, note),
        ControlOp::ClearEmergency { operator } => lift_lockout(cell, &mut rec, &operator, None),
        ControlOp::ResetHistory { operator } => {
            cell.emit(
                &mut rec,
                EventKind::HistoryReset {
                    operator: operator.clone(),
                },
            );
            if rec.emergency_stop() {
                let cause = format!("history reset by {operator}");
                unlock(cell, &mut rec, &operator, None, &cause);
            } else if rec.consecutive_errors > 0 {
                cell.emit(&mut rec, EventKind::ErrorsReset);
            }
            cell.breakers_cleared();
            Ok(())
        }
        ControlOp::Pause { operator } => {
            if !rec.paused {
                cell.emit(&mut rec, EventKind::Paused { operator });
            }
            Ok(())
        }
        // Checked before anything changes: a refused resume leaves the pause as it is.
        ControlOp::Resume { .. } if rec.emergency_stop() => Err(ControlError::LockedOut),
        ControlOp::Resume { operator } => {
            let mut did = false;
            if rec.paused {
                cell.emit(
                    &mut rec,
                    EventKind::Unpaused {
                        operator: operator.clone(),
                    },
                );
                did = true;
            }
            if rec.state == AgentState::Stopped {
                cell.clear_halt();
                let cause = format!("resumed by {operator}");
                let _ = cell.transition(&mut rec, AgentState::WaitingForEvent, &cause);
                cell.breakers_cleared();
                // The breakers start clean: so does the journal's copy of their window.
                if !rec.error_window().is_empty() {
                    cell.emit(
                        &mut rec,
                        EventKind::ErrorWindow {
                            window: String::new(),
                        },
                    );
                }
                did = true;
            }
            if did {
                Ok(())
            } else {
                Err(ControlError::NotStopped)
            }
        }
    }
}

/// A halt applied to the cell: the ordinary lane cleared, `STOPPED` (a locked-out agent stays
/// `SAFETY_LOCKOUT`), `Halted` journaled, the acknowledgement sent, the answered and cleared events
/// settled. Returns the cleared messages, to be listed and freed by the caller. Any running turn
/// was cancelled by the caller (the actor), or there is none (a passive agent's halt, applied by
/// whoever halts it: [`super::queue_halt`]).
pub(crate) fn apply_halt(cell: &AgentCell, request: HaltRequest) -> VecDeque<Envelope<AgentMsg>> {
    let HaltRequest { cause, ack: reply } = request;
    let (discarded, sent) = halt_cell(cell, &cause, reply.is_some());
    if let (Some(reply), Some(sent)) = (reply, sent) {
        reply.send(sent);
    }
    settle_halted(cell, &discarded);
    discarded
}

/// [`apply_halt`] up to the acknowledgement, which it returns (when `ack`) rather than sends:
/// the cleared messages (their events not yet settled: [`settle_halted`]), and the ack.
pub(crate) fn halt_cell(
    cell: &AgentCell,
    cause: &warden_protocols::HaltCause,
    ack_wanted: bool,
) -> (VecDeque<Envelope<AgentMsg>>, Option<SentAck>) {
    cell.reset_tools_in_flight();
    let (discarded, ack) = {
        let mut rec = cell.lock();
        let mut staged = Vec::new();
        // Cleared under the record lock: a sender queues (mailbox push and `EventQueued`) under
        // it too, so each user event is either cleared here and settled by `Halted`, or queued
        // after it.
        let discarded = cell.mailbox.take_ordinary();
        cell.remind_after_clearing(&rec, discarded.len());
        let (discarded, ack, stopped) = halt_record(cell, &mut rec, cause, discarded, &mut staged);
        // One batch: the state change and `Halted` are durable together.
        if !staged.is_empty() {
            let seq = cell.journal.append_all(&cell.key, staged);
            cell.journaled(seq);
        }
        if let Some(from) = stopped {
            cell.announce(from, AgentState::Stopped, HALT);
        }
        (discarded, ack)
    };
    if !ack_wanted {
        return (discarded, None);
    }
    // The ack says whether the halt is on disk. It goes out now, with the wait for that (off
    // every lock) when the answer is not already there (an in-memory journal, a fast disk): its
    // receiver awaits it, not a task on this arbiter, which a flooded agent may keep busy (see
    // `SentAck`).
    let mut durable = cell.durable_so_far();
    let mut ack = ack;
    let sent = match (&mut durable).now_or_never() {
        Some(result) => {
            ack.not_durable = result.err();
            SentAck::settled(ack)
        }
        None => SentAck {
            ack,
            durable: Some(durable),
        },
    };
    (discarded, Some(sent))
}

/// The cause of a halt's state change.
pub(crate) const HALT: &str = "system halt";

/// What a halt does to the record, under its lock, `discarded` the ordinary lane the caller
/// cleared under it: `STOPPED` (a locked-out agent stays `SAFETY_LOCKOUT`), `Halted`; the events
/// applied and staged on `staged` ([`AgentCell::stage`]) for the caller to journal before it
/// releases the lock. Returns the cleared messages, the acknowledgement (durability not yet known)
/// and, when the agent moved to `STOPPED`, the state it left (the caller announces the move once
/// it is journaled).
pub(crate) fn halt_record(
    cell: &AgentCell,
    rec: &mut AgentRecord,
    cause: &warden_protocols::HaltCause,
    discarded: VecDeque<Envelope<AgentMsg>>,
    staged: &mut impl super::cell::Staged,
) -> (VecDeque<Envelope<AgentMsg>>, HaltAck, Option<AgentState>) {
    let from = rec.state;
    let already_stopped = from == AgentState::Stopped;
    // A locked-out agent is not moved (its halt is journaled): it already refuses all work,
    // and only an unlock may take it out of `SAFETY_LOCKOUT` (a `STOPPED` one could be
    // resumed past its lockout).
    let stops = !already_stopped && from != AgentState::SafetyLockout;
    let stopped = (stops
        && cell
            .stage_transition(rec, AgentState::Stopped, HALT, staged)
            .is_ok())
    .then_some(from);
    // A second halt of a stopped agent (e.g. the supervisor and the parent both propagating
    // down a tree) is acknowledged but journaled only if it cleared something.
    if !already_stopped || !discarded.is_empty() {
        // `Halted` settles the pending events (they are the ones in `discarded`) and moves
        // them, in O(1), to the record's `discarding` until the listing after the ack names
        // them (and frees them, chunk by chunk): a crash before that leaves them in the
        // record, and the restart lists them.
        cell.stage(
            rec,
            EventKind::Halted {
                cause: cause.clone(),
                discarded: discarded.len() as u64,
                stopped: stops,
            },
            staged,
        );
    }
    let ack = HaltAck {
        agent: cell.key.clone(),
        state: rec.state,
        discarded: discarded.len() as u64,
        not_durable: None,
    };
    (discarded, ack, stopped)
}

/// The rest of [`apply_halt`], after the ack: whoever waits on the stopped turn's event or on a
/// cleared one is answered.
pub(crate) fn settle_halted(cell: &AgentCell, discarded: &VecDeque<Envelope<AgentMsg>>) {
    settle_answering(cell);
    settle_cleared(cell, discarded);
}

/// Whoever waits on the event of the turn a halt stopped is answered ([`settle_halted`]'s first
/// half).
pub(crate) fn settle_answering(cell: &AgentCell) {
    if let Some((id, accepted)) = cell.take_answering() {
        cell.settle(id, Some(accepted), EventFate::Discarded);
    }
}

/// Whoever waits on an event a halt cleared from the ordinary lane is answered ([`settle_halted`]'s
/// second half: O(N) in the cleared messages).
pub(crate) fn settle_cleared(cell: &AgentCell, discarded: &VecDeque<Envelope<AgentMsg>>) {
    for id in discarded.iter().filter_map(|e| match &e.msg {
        AgentMsg::Work(w) => w.queued(),
        _ => None,
    }) {
        cell.settle(id, None, EventFate::Discarded);
    }
}

/// Lifts a lockout: `Unlocked` and `SAFETY_LOCKOUT → WAITING_FOR_EVENT` in one batch, a past halt
/// request cleared (a locked-out agent that was halted stays `SAFETY_LOCKOUT`, and the unlock is the
/// operator's decision that it may work again).
///
/// A record locked out in another state (only in journals written before lockouts and state changes
/// were journaled together) journals the unlock alone and keeps its state.
fn unlock(
    cell: &AgentCell,
    rec: &mut AgentRecord,
    operator: &str,
    note: Option<String>,
    cause: &str,
) {
    let unlocked = EventKind::Unlocked {
        operator: operator.to_owned(),
        note,
    };
    if rec.state == AgentState::SafetyLockout {
        cell.clear_halt();
        let _ = cell.transition_with(rec, vec![unlocked], AgentState::WaitingForEvent, cause);
    } else {
        cell.emit(rec, unlocked);
    }
}

/// An operator's unlock (or emergency clear): lifts the lockout, or [`ControlError::NotActive`]
/// when the agent is not locked out.
fn lift_lockout(
    cell: &AgentCell,
    rec: &mut AgentRecord,
    operator: &str,
    note: Option<String>,
) -> Result<(), ControlError> {
    if !rec.emergency_stop() {
        return Err(ControlError::NotActive);
    }
    unlock(
        cell,
        rec,
        operator,
        note,
        &format!("unlocked by {operator}"),
    );
    cell.breakers_cleared();
    Ok(())
}

/// Each cleared message by id and kind (and a user event's pending id).
///
/// A tick among them has left the ordinary lane: the tick arbiter may queue the next one.
fn listing<'a>(
    cell: &AgentCell,
    discarded: impl IntoIterator<Item = &'a Envelope<AgentMsg>>,
) -> Vec<DiscardedMessage> {
    discarded
        .into_iter()
        .map(|e| {
            if matches!(e.msg, AgentMsg::Work(Work::Tick)) {
                cell.tick_left_lane();
            }
            let (kind, queued) = match &e.msg {
                AgentMsg::Work(w) => (w.kind().into(), w.queued()),
                _ => ("other".into(), None),
            };
            DiscardedMessage {
                id: e.id,
                priority: Priority::Ordinary,
                kind,
                queued,
            }
        })
        .collect()
}

/// Journals every cleared message (id and kind), then drops them. Dropping the reply channels of
/// delegated tasks tells their delegators the task was abandoned, which releases their slots.
pub(crate) fn discard_backlog(cell: &AgentCell, discarded: VecDeque<Envelope<AgentMsg>>) {
    if discarded.is_empty() {
        return;
    }
    cell.note(EventKind::MessagesDiscarded {
        messages: listing(cell, &discarded),
    });
    drop(discarded);
}

/// [`discard_backlog`] for a halt: starts 2 ms after the acknowledgement has gone out and frees the
/// backlog in chunks, yielding between them, so the O(N) clean-up never competes with the ack.
/// Measured (`examples/halt_probe.rs`, agent on its own arbiter): starting the clean-up at once made
/// the operator observe the ack of a 10k–100k backlog after 0.6–3 ms instead of ~60 µs; deferred, the
/// latency is flat from 0 to 1M queued messages. The messages are already out of the queue and counted
/// when the ack is sent; only their listing in the journal and their memory wait.
///
/// Each chunk is listed (one `MessagesDiscarded` event per chunk) and freed before the next: listing
/// a million messages at once held the arbiter thread for tens of milliseconds, delaying every other
/// agent on it — a halt of another agent included. A chunk costs tens of microseconds.
async fn discard_backlog_gently(cell: &AgentCell, mut discarded: VecDeque<Envelope<AgentMsg>>) {
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    while !discarded.is_empty() {
        let chunk: Vec<_> = discarded.drain(..discarded.len().min(CHUNK)).collect();
        cell.note(EventKind::MessagesDiscarded {
            messages: listing(cell, &chunk),
        });
        drop(chunk);
        tokio::task::yield_now().await;
    }
}

/// How many queued items a deferred clean-up lists or frees between two yields.
const CHUNK: usize = 1024;

impl Actor for AgentActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The supervisor attached this actor's address as the mailbox's waker when it started it.
        self.cell.mailbox.reader_started();
        if self.passivation.is_some() {
            let after = self.cell.settings.passivate_after;
            ctx.run_later(after, |act, ctx| act.check_idle(ctx));
        }
    }
}

impl Drop for AgentActor {
    fn drop(&mut self) {
        if !self.clean_stop {
            tracing::error!(agent = %self.cell.key, "agent actor crashed");
            self.cell.report_crash(self.generation);
        }
    }
}

impl Handler<Wake> for AgentActor {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        self.cell.mailbox.begin_drain();
        self.pump(ctx);
    }
}

impl Handler<Shutdown> for AgentActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        self.clean_stop = true;
        ctx.stop();
    }
}
