//! Restarts: a crashed actor comes back on the same [`AgentCell`] (record and mailbox survive), within
//! the restart intensity; past it the agent is stopped for good.

use super::*;

impl Supervisor {
    pub(super) async fn on_crash(&self, key: AgentKey, generation: u64) {
        if self.shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let Some(entry) = self.shared.agents.get(&key).map(|e| e.clone()) else {
            return;
        };
        if generation != entry.cell.generation() {
            // That actor was already replaced (restarted along with another agent's crash).
            return;
        }
        entry.cell.note(EventKind::Crashed {
            state: entry.cell.state(),
        });
        let policy = &self.shared.config.supervisor.restart;
        let window = Duration::from_secs_f64(policy.within_seconds);
        let now = Instant::now();
        let gave_up = {
            let mut times = entry.cell.busy().restarts.lock();
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) > window)
            {
                times.pop_front();
            }
            if times.len() as u32 >= policy.max_restarts {
                Some(times.len() as u32)
            } else {
                times.push_back(now);
                None
            }
        };
        if let Some(restarts) = gave_up {
            tracing::error!(agent = %key, restarts, "restart intensity exceeded; giving up");
            give_up(&entry.cell, restarts, window);
            return;
        }
        let victims: Vec<AgentKey> = match policy.strategy {
            RestartStrategy::OneForOne => vec![key.clone()],
            RestartStrategy::OneForAll => self.cells().iter().map(|c| c.key.clone()).collect(),
            RestartStrategy::RestForOne => {
                let order = self.shared.order.lock();
                let from = order.iter().position(|e| e.cell.key == key).unwrap_or(0);
                order[from..].iter().map(|e| e.cell.key.clone()).collect()
            }
        };
        for victim in victims {
            let Some(v) = self.shared.agents.get(&victim).map(|e| e.clone()) else {
                continue;
            };
            let mut crashed = victim == key;
            if !crashed {
                let addr = v.cell.mailbox.waker::<Addr<AgentActor>>();
                if let Some(addr) = addr {
                    // A victim whose actor is already dead crashed at the same time: count it.
                    crashed = addr.send(Shutdown).await.is_err();
                    if crashed {
                        v.cell.note(EventKind::Crashed {
                            state: v.cell.state(),
                        });
                    }
                }
            }
            recover(&v.cell, crashed);
            start_actor(&v, self.passivate_after());
        }
    }
}

/// Starts the agent's reader: passive ([`Activator`]: the actor starts with the first message;
/// at once if something is queued) when `supervisor.passivate_after_seconds` is set, else its actor.
pub(super) fn start_actor(entry: &AgentEntry, passivate_after: Option<Duration>) {
    if let (Some(_), Some(_)) = (passivate_after, entry.cell.arbiter()) {
        // A new generation, as for an actor started now: a crash report of the actor this
        // replaces (a restart) is recognised as stale.
        entry.cell.next_generation();
        let activator = Activator {
            cell: Arc::downgrade(&entry.cell),
        };
        entry.cell.mailbox.attach_passive(activator);
        return;
    }
    let cell = entry.cell.clone();
    let generation = cell.next_generation();
    let addr = match entry.cell.arbiter() {
        Some(arbiter) => {
            AgentActor::start_in_arbiter(arbiter, move |_| AgentActor::new(cell, generation, None))
        }
        None => AgentActor::new(cell, generation, None).start(),
    };
    // The mailbox keeps the address (its waker): the actor wakes on its first message, and the
    // supervisor finds it there to stop it.
    entry.cell.mailbox.attach(addr);
}

/// What a passive agent's mailbox holds in place of its actor's address: the agent's cell, from
/// which the first message that needs the agent starts its actor
/// ([`crate::mailbox::WakeSink::activate`]), on the agent's arbiter. An idle actor leaves one
/// behind when it stops (`AgentActor::check_idle`). A weak reference: the registry owns the
/// cell, the cell this. Only that (8 bytes, every passive agent holds one): the idle time is in
/// the agent's settings ([`AgentSettings::passivate_after`]).
#[derive(Clone)]
pub(crate) struct Activator {
    cell: Weak<AgentCell>,
}

impl crate::mailbox::WakeSink for Activator {
    fn wake(&self) {
        // Never called: the mailbox activates a passive sink instead of waking it.
    }

    fn activate(&self) -> Option<Box<dyn crate::mailbox::WakeSink>> {
        let cell = self.cell.upgrade()?;
        let arbiter = cell.arbiter()?.clone();
        let generation = cell.next_generation();
        let me = self.clone();
        let addr = AgentActor::start_in_arbiter(&arbiter, move |_| {
            AgentActor::new(cell, generation, Some(me))
        });
        Some(Box::new(addr))
    }
}

/// Brings a record whose actor died mid-turn back to a consistent state. A crash counts as a failed
/// call; reaching the threshold trips the emergency stop. Locked-out and stopped agents stay so.
fn recover(cell: &AgentCell, crashed: bool) {
    cell.reset_tools_in_flight();
    // The event the lost turn had taken gets no answer.
    let _ = cell.take_turn_usage();
    cell.settle_taken(crashed_turn());
    let mut rec = cell.lock();
    if matches!(
        rec.state,
        AgentState::WaitingForTool | AgentState::WaitingForInput
    ) {
        let _ = cell.transition(&mut rec, AgentState::Executing, "actor restarted");
    }
    if rec.state == AgentState::Executing {
        let mut tripped = false;
        if crashed {
            let n = rec.consecutive_errors.saturating_add(1);
            cell.emit(
                &mut rec,
                EventKind::ErrorCounted {
                    consecutive_errors: n,
                    error: "agent crashed during a turn".into(),
                },
            );
            if n >= rec.max_consecutive_errors {
                cell.trip(
                    &mut rec,
                    warden_protocols::Breaker::ConsecutiveErrors,
                    format!("Critical error in tick loop after {n} failures"),
                );
                tripped = true;
            }
        }
        if !tripped {
            let _ = cell.transition(&mut rec, AgentState::WaitingForEvent, "actor restarted");
        }
    }
    let restarts = rec.restarts + 1;
    cell.emit(&mut rec, EventKind::Restarted { restarts });
    let errors = rec.consecutive_errors;
    drop(rec);
    cell.breakers_restore(errors);
}

/// What becomes of an event whose turn died with its actor.
fn crashed_turn() -> EventFate {
    EventFate::Failed {
        reason: TerminationReason::Crashed,
        error: Some("the agent's actor crashed (or was restarted) during the turn".into()),
    }
}

/// The restart intensity was exceeded: the agent is stopped for good, its queue discarded.
fn give_up(cell: &AgentCell, restarts: u32, window: Duration) {
    // The actor is gone: its turn, and with it its delegations, already ended.
    let _ = cell.request_halt();
    let mut rec = cell.lock();
    // Under the record lock, as a halt does: `Halted` settles exactly the pending events cleared here.
    let discarded = cell.mailbox.take_ordinary();
    let cleared: Vec<u64> = rec.pending.iter().map(|p| p.id).collect();
    if matches!(
        rec.state,
        AgentState::WaitingForTool | AgentState::WaitingForInput
    ) {
        let _ = cell.transition(&mut rec, AgentState::Executing, "actor crashed");
    }
    // A locked-out agent stays `SAFETY_LOCKOUT` (only an unlock leaves it); it refuses work anyway.
    let stops = !rec.state.refuses_work();
    if stops {
        let _ = cell.transition(&mut rec, AgentState::Stopped, "restart intensity exceeded");
    }
    cell.emit(
        &mut rec,
        EventKind::Halted {
            cause: HaltCause::RestartIntensity {
                restarts,
                within_ms: window.as_millis() as u64,
            },
            discarded: discarded.len() as u64,
            stopped: stops,
        },
    );
    drop(rec);
    for id in cleared {
        cell.settle(id, None, EventFate::Discarded);
    }
    cell.settle_taken(crashed_turn());
    crate::agent::actor::discard_backlog(cell, discarded);
    cell.mailbox.close();
    // Pending halts can never be read now: answer them.
    while let Some(envelope) = cell.mailbox.pop() {
        if let AgentMsg::Halt(request) = envelope.msg {
            if let Some(reply) = request.ack {
                reply.send(crate::agent::SentAck::settled(cell.halt_ack_now()));
            }
        }
    }
}
