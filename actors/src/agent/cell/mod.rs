//! [`AgentCell`]: everything an agent is, shared by its handle, its actor (across restarts) and the
//! supervisor. The actor is a thin driver; the cell holds the state.
//!
//! Files, one per section of its methods: this one (the struct, the record, journaling and state
//! transitions, crash bookkeeping, status), `halt.rs` (with `gate.rs`, the [`HaltGate`]: flag, turn
//! token and running delegations, with its invariants and loom models), `safety.rs` (errors, breakers, verdicts,
//! usage), `replies.rs`, `work.rs` (task progress, history), `delegations.rs`, `tools.rs` (tools in
//! flight, `begin_tool`/`end_tool`), `tests.rs`.
//!
//! # Invariants
//! * The [`AgentRecord`] changes only through [`AgentCell::emit`], which applies the event and journals
//!   it under the record lock — the journal order is the order of changes, and a replay rebuilds it.
//! * The state changes only through [`AgentCell::transition`], checked against
//!   [`warden_protocols::TRANSITIONS`]; an illegal request is journaled as `TransitionRefused` and logged.
//! * A halt is visible before the actor reads it: [`AgentCell::request_halt`] raises the halt flag and
//!   cancels the turn's token synchronously (through the [`HaltGate`]), so a running turn stops at its
//!   next await point and [`AgentCell::begin_tool`] refuses to start a tool.
//!
//! * A user event is queued (mailbox push and `EventQueued`) under the record lock, and the actor
//!   settles it under the record lock, so the record's pending events are the user events in the
//!   ordinary lane (see the `agent` module docs).
//!
//! * What only a working agent needs (tool circuits, task progress, the running turn's usage and
//!   event, its delegators, the rolling hour, who waits for its replies) is its [`Busy`] part, allocated by the first call
//!   that changes it and never freed; readers that only look see `None` as "nothing yet". A fresh
//!   agent's record (spawned, nothing since) is built at its first lock ([`RecordSlot`]); what
//!   agents of one spec share is one [`Profile`]; its breakers are made at their first use. An
//!   idle cell is one allocation of at most 256 bytes (a test holds it there).
//!
//! # Lock order
//! `record` → journal's internal lock; `record` → a mailbox lane (a leaf); `record` → `waiters`,
//! `record` → `answering`, `record` → `hourly` (leaves). The halt gate's lock is a leaf (see
//! `gate.rs`), and so is `npc` (the perception and the tick handle).
//! No lock is held across an await.

mod delegations;
mod gate;
mod halt;
mod hourly;
mod npc;
mod replies;
mod safety;
mod tools;
mod work;

use crate::{
    agent::{
        reply::{ReplyHub, Waiters},
        AgentMsg, Signal, Work,
    },
    context::ContextStrategy,
    journal::{now_ms, Journal},
    mailbox::PriorityMailbox,
    provider::Provider,
    safety::{AgentBreakers, BreakersShared, TeamSafety, TripNotice, Verdict},
    tools::ToolRegistry,
    tools::ToolRunner,
};
use gate::HaltGate;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
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
    AgentKey, AgentRecord, AgentRole, AgentState, AgentStatus, Breaker, ChatMessage, EventFate,
    EventKind, IllegalTransition, Usage,
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
    /// `[npc]`: how it classifies world events.
    pub npc: Arc<warden_protocols::npc::NpcConfig>,
    /// `[memory]`: compaction of the history.
    pub memory: warden_protocols::MemoryConfig,
    /// `[tools]`: when a tool's circuit opens and for how long.
    pub circuit: crate::tools::CircuitConfig,
    /// `[tools.retry]`: how a tool call with a retryable error is tried again.
    pub tool_retry: warden_protocols::ToolRetryConfig,
    /// `[permissions]` (with the agent's own keys over it): the gate before each tool call.
    pub permissions: Arc<warden_protocols::PermissionPolicy>,
    /// `supervisor.passivate_after_seconds`: how long an actor idles before it stops (its agent
    /// passive); unused when passivation is off.
    pub passivate_after: Duration,
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

/// What an agent shares with the other agents of its team spawned with the same model, tools,
/// system prompt and settings (most of a large fleet): one `Arc` per agent instead of ~110 bytes
/// of handles and a copy of its prompt and tool list each. The supervisor keeps the last few it
/// built and hands an equal one out again ([`Profile::same_as`]). The cell derefs to it, so
/// `cell.provider`, `cell.tools`, `cell.settings` and `cell.safety` read as the agent's own.
pub(crate) struct Profile {
    pub provider: Arc<dyn Provider>,
    pub tools: ToolRegistry,
    pub system_prompt: Option<String>,
    /// Shared by every agent spawned with the same settings.
    pub settings: Arc<AgentSettings>,
    pub safety: Arc<TeamSafety>,
    pub journal: Arc<dyn Journal>,
    pub crash_tx: Option<UnboundedSender<(AgentKey, u64)>>,
    /// The team's reply stream.
    pub replies: Arc<ReplyHub>,
    /// What the agents' breakers share: the model (its price), the safety config, the team.
    breakers: Arc<BreakersShared>,
    /// `Some(b)`: `tools` is the team's built-in tools `b` alone (a spec with no tools of its
    /// own): a spawn of such a spec finds this profile without building a registry to compare
    /// (see `Supervisor::profile`).
    pub built_ins: Option<u8>,
}

impl Profile {
    /// A profile (`crash_tx`: where the agent's actor reports a crash).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        system_prompt: Option<String>,
        settings: Arc<AgentSettings>,
        safety: Arc<TeamSafety>,
        journal: Arc<dyn Journal>,
        crash_tx: Option<UnboundedSender<(AgentKey, u64)>>,
        replies: Arc<ReplyHub>,
    ) -> Self {
        let breakers = Arc::new(BreakersShared::new(
            safety.config.clone(),
            provider.model(),
            Some(safety.team.clone()),
        ));
        Profile {
            built_ins: None,
            provider,
            tools,
            system_prompt,
            settings,
            safety,
            journal,
            crash_tx,
            replies,
            breakers,
        }
    }

    /// Whether an agent with this model, tool list, system prompt and settings behaves as one of
    /// `self` (the team's parts are the same within a supervisor): `self` can be shared.
    /// [`Profile::fits`] for a spec with no tools of its own, to which the team adds its built-in
    /// tools `built_ins`.
    pub(crate) fn fits_built_ins(
        &self,
        provider: &Arc<dyn Provider>,
        built_ins: u8,
        system_prompt: &Option<String>,
        settings: &Arc<AgentSettings>,
    ) -> bool {
        self.built_ins == Some(built_ins)
            && std::ptr::addr_eq(Arc::as_ptr(&self.provider), Arc::as_ptr(provider))
            && Arc::ptr_eq(&self.settings, settings)
            && self.system_prompt == *system_prompt
    }

    pub(crate) fn fits(
        &self,
        provider: &Arc<dyn Provider>,
        tools: &ToolRegistry,
        system_prompt: &Option<String>,
        settings: &Arc<AgentSettings>,
    ) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.provider), Arc::as_ptr(provider))
            && Arc::ptr_eq(&self.settings, settings)
            && self.tools.same_as(tools)
            && self.system_prompt == *system_prompt
    }
}

/// Where [`AgentCell::stage`] puts the events it applied, for its caller to journal (before it
/// releases the record lock): one agent's list, or a fleet halt's rows ([`StagedRows`]).
pub(crate) trait Staged {
    fn stage(&mut self, kind: EventKind);
}

impl Staged for Vec<EventKind> {
    fn stage(&mut self, kind: EventKind) {
        self.push(kind);
    }
}

/// Events staged straight into a batch of several agents' rows, as `key`'s (no list of its own
/// moved over after).
pub(crate) struct StagedRows<'r> {
    pub key: &'r AgentKey,
    pub rows: &'r mut Vec<(AgentKey, EventKind)>,
}

impl Staged for StagedRows<'_> {
    fn stage(&mut self, kind: EventKind) {
        self.rows.push((self.key.clone(), kind));
    }
}

/// Everything a cell is made of.
pub(crate) struct CellParts {
    /// Where its actor runs (`None`: on the current arbiter, started there at once).
    pub arbiter: Option<actix::ArbiterHandle>,
    pub key: AgentKey,
    /// A restored record (its key is `key`); `None`: a fresh agent (see [`RecordSlot`]).
    pub record: Option<Box<AgentRecord>>,
    pub mailbox: PriorityMailbox<AgentMsg>,
    pub profile: Arc<Profile>,
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
    /// What it shares with the agents of the same spec (read through the cell: `Deref`).
    profile: Arc<Profile>,
    /// Where its actor runs (`None`: on the current arbiter, started there at once).
    arbiter: Option<actix::ArbiterHandle>,
    /// The synchronous breakers, made at their first use ([`AgentCell::breakers_lock`]; boxed: an
    /// idle agent's are empty, 80 bytes it need not carry — it is counted in the team budget at
    /// its spawn all the same). Lock order: `record` → `breakers`; never held across an await.
    breakers: Mutex<Option<Box<AgentBreakers>>>,
    /// What it needs once it works, allocated then (see [`Busy`]).
    busy: once_cell::race::OnceBox<Busy>,
    record: Mutex<RecordSlot>,
    state_mirror: AtomicU8,
    /// Mirrors `record.paused` (read by the mailbox pump without the record lock).
    paused_mirror: AtomicBool,
    /// The halt flag, the running turn's token and the delegations this agent runs now (id → the
    /// delegate's cell).
    halt: HaltGate<Arc<AgentCell>>,
    /// Its perception of world events and its side of the tick arbiter ([`npc::NpcSlot`]). A leaf
    /// lock.
    npc: Mutex<npc::NpcSlot>,
    active_delegations: AtomicU32,
    /// Tool calls running now (several when a response's calls run in parallel). Changed under the
    /// record lock.
    tools_in_flight: AtomicU32,
    /// Incremented for each actor started on this cell; crash reports carry it, so a report from an
    /// actor that was already replaced is recognised as stale.
    generation: AtomicU32,
    /// The journal seq of the last event this agent journaled.
    last_seq: AtomicU64,
}

impl std::ops::Deref for AgentCell {
    type Target = Profile;

    fn deref(&self) -> &Profile {
        &self.profile
    }
}

/// What an agent needs once it works — its first task, model call, tool call or delegation, or
/// with long-term memory on its first perception — and not before. Allocated then and kept (a `OnceBox`: two threads that race to allocate it may
/// both build one, and one is dropped unused — building it has no side effect): an idle agent
/// (most of a large fleet, an NPC nobody talks to) never pays for it (`docs/performance.md`).
/// Readers that only look ([`AgentCell::busy_now`]) see `None` and answer as for a fresh agent.
pub(crate) struct Busy {
    /// Circuits and the result cache of its tools.
    pub runner: ToolRunner,
    task: Mutex<TaskProgress>,
    /// Agents running a delegation to this one now: id → the delegator (notified when this one trips).
    delegators: Mutex<HashMap<u64, Weak<AgentCell>>>,
    /// Tokens of the running turn's model calls (reset when a turn starts).
    turn_usage: Mutex<Usage>,
    /// The user event the running turn answers (id, accepted): settled when the turn finishes, as
    /// discarded when a halt stops it, as failed when the actor crashes. Set under the record lock.
    answering: Mutex<Option<(u64, tokio::time::Instant)>>,
    /// The calls of the last hour, for `safety.budget.tokens_per_hour` (a leaf lock).
    hourly: Mutex<hourly::HourlyWindow>,
    /// Its actor's crashes inside the restart intensity window (the supervisor's; a leaf lock).
    pub restarts: Mutex<std::collections::VecDeque<tokio::time::Instant>>,
    /// Who waits for the reply to which event (an ask makes the agent work: it is here, not in
    /// every idle cell).
    pub(crate) waiters: Waiters,
    /// Its long-term memory's live state: rate windows, the trust of the speakers it heard, the
    /// memory clock, its turn's source — its own, not the team's, so a host's delivery takes no
    /// lock another agent's delivery or turn takes. A leaf lock, taken under the record lock.
    live: Mutex<crate::memory::live::Live>,
}

/// The record as the cell keeps it. A fresh agent's — spawned, nothing since — is
/// [`AgentRecord::new`] with its `Spawned` applied, so the cell keeps only what that event set
/// (`Fresh`, 24 bytes instead of the record's ~300: most agents of a large idle fleet never
/// change theirs). The record is built the first time it is locked ([`AgentCell::lock`]) and kept;
/// readers that only look ([`AgentCell::read`]) never build it. A replay of the same journal
/// builds the same record (its only event is `Spawned`, applied the same way).
///
/// A fresh agent stopped by a fleet halt with nothing to clear (`fleet_halted`: the halt's
/// `StateChanged` to `STOPPED` and `Halted` applied, [`RecordSlot::fleet_halt`]) stays fresh too:
/// a halted idle fleet is as small as an idle one, and its halt builds no record.
enum RecordSlot {
    Fresh {
        role: AgentRole,
        parent: Option<AgentKey>,
        max_consecutive_errors: u32,
        fleet_halted: bool,
    },
    Full(Box<AgentRecord>),
}

/// The record lock held, a fresh record not built yet ([`AgentCell::lock_slot`]): a fleet halt
/// may halt a fresh agent in its slot ([`AgentCell::halt_fresh`]); [`RecordGuard::record`] builds
/// the record.
pub(crate) struct RecordGuard<'a> {
    slot: MutexGuard<'a, RecordSlot>,
    key: &'a AgentKey,
}

impl RecordGuard<'_> {
    /// The record, built now if the slot is fresh.
    pub(crate) fn record(&mut self) -> &mut AgentRecord {
        self.slot.full(self.key)
    }
}

impl RecordSlot {
    /// The slot of an agent that has journaled nothing yet: [`AgentRecord::new`]'s values (a
    /// test holds the two equal), without building a record to read them from.
    fn fresh() -> Self {
        RecordSlot::Fresh {
            role: AgentRole::Assistant,
            parent: None,
            max_consecutive_errors: 5,
            fleet_halted: false,
        }
    }

    /// The events of a fleet halt (`cause`) of a fresh agent with nothing to clear, as
    /// [`crate::agent::actor::halt_record`] journals them: `WAITING_FOR_EVENT → STOPPED`, then
    /// `Halted`. A record keeps no more of the cause than that it is a fleet's.
    fn fleet_halt(cause: &warden_protocols::HaltCause) -> [EventKind; 2] {
        [
            EventKind::StateChanged {
                from: AgentState::WaitingForEvent,
                to: AgentState::Stopped,
                cause: crate::agent::actor::HALT.to_owned(),
            },
            EventKind::Halted {
                cause: cause.clone(),
                discarded: 0,
                stopped: true,
            },
        ]
    }

    /// The record a fresh slot stands for.
    fn build(
        key: &AgentKey,
        role: AgentRole,
        parent: Option<AgentKey>,
        max_consecutive_errors: u32,
        fleet_halted: bool,
    ) -> AgentRecord {
        let mut rec = AgentRecord::new(key.clone());
        rec.apply(&EventKind::Spawned {
            role,
            parent,
            max_consecutive_errors,
        });
        if fleet_halted {
            for kind in Self::fleet_halt(&warden_protocols::HaltCause::HaltAll) {
                rec.apply(&kind);
            }
        }
        rec
    }

    /// The record, built now if the slot is fresh.
    fn full(&mut self, key: &AgentKey) -> &mut AgentRecord {
        if let RecordSlot::Fresh {
            role,
            parent,
            max_consecutive_errors,
            fleet_halted,
        } = self
        {
            let rec = Self::build(
                key,
                *role,
                parent.take(),
                *max_consecutive_errors,
                *fleet_halted,
            );
            *self = RecordSlot::Full(Box::new(rec));
        }
        match self {
            RecordSlot::Full(rec) => rec,
            RecordSlot::Fresh { .. } => unreachable!("built above"),
        }
    }
}

impl Busy {
    fn new(circuit: crate::tools::CircuitConfig, retry: warden_protocols::ToolRetryConfig) -> Self {
        Busy {
            runner: ToolRunner::new(circuit).with_retry(retry),
            task: Mutex::new(TaskProgress {
                run_id: String::new(),
                iterations: 0,
                started: tokio::time::Instant::now(),
                seq: 0,
            }),
            delegators: Mutex::new(HashMap::new()),
            turn_usage: Mutex::new(Usage::default()),
            answering: Mutex::new(None),
            hourly: Mutex::new(hourly::HourlyWindow::default()),
            restarts: Mutex::new(std::collections::VecDeque::new()),
            waiters: Waiters::default(),
            live: Mutex::default(),
        }
    }
}

fn state_index(s: AgentState) -> u8 {
    AgentState::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8
}

impl AgentCell {
    /// `#[inline]`: one caller (`Supervisor::spawn`), and rustc stopped inlining it there, which
    /// costs a spawn a call and the cell's copy (`docs/performance.md`, "The idle agent itself").
    #[inline]
    pub(crate) fn new(parts: CellParts) -> Self {
        let CellParts {
            arbiter,
            key,
            record,
            mailbox,
            profile,
        } = parts;
        let safety = &profile.safety;
        let mut breakers = None;
        let (slot, state, paused, halted, spent) = match record {
            None => {
                profile.breakers.register(&key);
                (
                    RecordSlot::fresh(),
                    AgentState::WaitingForEvent,
                    false,
                    false,
                    false,
                )
            }
            Some(mut record) => {
                let breakers = breakers.insert(Box::new(AgentBreakers::shared(
                    key.clone(),
                    profile.breakers.clone(),
                )));
                // The running estimate of the history, counted once here (a record built by
                // hand, not folded from events, may lack it); every change after goes through
                // `apply`.
                record.history_tokens = record
                    .history
                    .iter()
                    .map(ChatMessage::estimated_tokens)
                    .sum();
                breakers.restore_consecutive_errors(record.consecutive_errors);
                breakers.restore_error_window(record.error_window());
                // Budgets spent before a restart stay spent (a fresh record has spent nothing).
                breakers.restore_usage(record.usage);
                if record.emergency_stop() {
                    safety.team.set_locked_out(&record.key, true);
                }
                // A record that has spent tokens was restored: its rolling budget starts from
                // the journal.
                let spent = record.usage.tokens() > 0;
                let (state, paused) = (record.state, record.paused);
                let halted = state == AgentState::Stopped;
                (RecordSlot::Full(record), state, paused, halted, spent)
            }
        };
        let cell = AgentCell {
            key,
            state_mirror: AtomicU8::new(state_index(state)),
            paused_mirror: AtomicBool::new(paused),
            record: Mutex::new(slot),
            mailbox,
            breakers: Mutex::new(breakers),
            busy: once_cell::race::OnceBox::new(),
            halt: HaltGate::new(halted),
            npc: Mutex::new(npc::NpcSlot::default()),
            active_delegations: AtomicU32::new(0),
            tools_in_flight: AtomicU32::new(0),
            generation: AtomicU32::new(0),
            last_seq: AtomicU64::new(0),
            profile,
            arbiter,
        };
        if spent {
            cell.hourly_restore();
        }
        cell
    }

    /// Its [`Busy`] part, allocated at the first call.
    pub(crate) fn busy(&self) -> &Busy {
        self.busy
            .get_or_init(|| Box::new(Busy::new(self.settings.circuit, self.settings.tool_retry)))
    }

    /// What it shares with the agents of its spec.
    #[cfg(test)]
    pub(crate) fn profile(&self) -> &Arc<Profile> {
        &self.profile
    }

    /// Where its actor runs (`None`: on the current arbiter).
    pub(crate) fn arbiter(&self) -> Option<&actix::ArbiterHandle> {
        self.arbiter.as_ref()
    }

    /// Its waiters, if anyone ever asked it anything ([`Busy::waiters`]).
    pub(crate) fn waiters_now(&self) -> Option<&Waiters> {
        self.busy_now().map(|b| &b.waiters)
    }

    /// Its [`Busy`] part if it has one (for readers that must not allocate it).
    /// Its long-term memory's live state (in [`Busy`]: a listening NPC with memory on works).
    pub(crate) fn live(&self) -> MutexGuard<'_, crate::memory::live::Live> {
        self.busy().live.lock()
    }

    pub(crate) fn busy_now(&self) -> Option<&Busy> {
        self.busy.get()
    }

    /// The circuits and result cache of its tools.
    pub(crate) fn runner(&self) -> &ToolRunner {
        &self.busy().runner
    }

    /// Locks the record for a sequence of changes (building a fresh agent's: see [`RecordSlot`]).
    /// The breakers, made at the first call (an idle agent has none: see the `breakers` field).
    pub(crate) fn breakers_lock(&self) -> MappedMutexGuard<'_, AgentBreakers> {
        MutexGuard::map(self.breakers.lock(), |b| {
            &mut **b.get_or_insert_with(|| {
                Box::new(AgentBreakers::registered(
                    self.key.clone(),
                    self.profile.breakers.clone(),
                ))
            })
        })
    }

    pub(crate) fn lock(&self) -> MappedMutexGuard<'_, AgentRecord> {
        MutexGuard::map(self.record.lock(), |slot| slot.full(&self.key))
    }

    /// The record lock, the record not built yet ([`RecordGuard`]).
    pub(crate) fn lock_slot(&self) -> RecordGuard<'_> {
        RecordGuard {
            slot: self.record.lock(),
            key: &self.key,
        }
    }

    /// [`AgentCell::lock_slot`] if the record lock is free now (`None`: someone holds it).
    pub(crate) fn try_lock_slot(&self) -> Option<RecordGuard<'_>> {
        Some(RecordGuard {
            slot: self.record.try_lock()?,
            key: &self.key,
        })
    }

    /// A fleet halt (`cause`) of a fresh agent with nothing to clear, kept in its fresh slot (no
    /// record built, see [`RecordSlot`]): the halt's events staged on `staged` (as
    /// [`AgentCell::stage`]), the state mirror `STOPPED`. Returns the state to acknowledge and,
    /// when it moved now, the state it left (already halted so: nothing staged). `None`: not a
    /// fleet halt, or the record is built — the caller halts the record.
    pub(crate) fn halt_fresh(
        &self,
        guard: &mut RecordGuard<'_>,
        cause: &warden_protocols::HaltCause,
        staged: &mut impl Staged,
    ) -> Option<(AgentState, Option<AgentState>)> {
        let RecordSlot::Fresh { fleet_halted, .. } = &mut *guard.slot else {
            return None;
        };
        if !cause.is_fleet() {
            return None;
        }
        if *fleet_halted {
            return Some((AgentState::Stopped, None));
        }
        AgentState::WaitingForEvent
            .check_transition(AgentState::Stopped)
            .ok()?;
        *fleet_halted = true;
        self.state_mirror
            .store(state_index(AgentState::Stopped), Ordering::Release);
        for kind in RecordSlot::fleet_halt(cause) {
            staged.stage(kind);
        }
        Some((AgentState::Stopped, Some(AgentState::WaitingForEvent)))
    }

    /// Whether someone holds the record lock now (tests).
    #[cfg(test)]
    pub(crate) fn record_locked(&self) -> bool {
        self.record.is_locked()
    }

    /// The record lock, waited for at most `d` (tests: a holder that must not wait forever).
    #[cfg(test)]
    pub(crate) fn hold_record_for(&self, d: Duration) -> Option<impl Sized + '_> {
        self.record.try_lock_for(d)
    }

    /// Runs `f` on the record under its lock without building a fresh agent's (a reader that
    /// only looks: a fresh record is built on the stack for it, with no heap allocation).
    pub(crate) fn read<R>(&self, f: impl FnOnce(&AgentRecord) -> R) -> R {
        let slot = self.record.lock();
        match &*slot {
            RecordSlot::Full(rec) => f(rec),
            RecordSlot::Fresh {
                role,
                parent,
                max_consecutive_errors,
                fleet_halted,
            } => f(&RecordSlot::build(
                &self.key,
                *role,
                parent.clone(),
                *max_consecutive_errors,
                *fleet_halted,
            )),
        }
    }

    /// Applies `kind` to the record and journals it. Returns its journal seq.
    pub(crate) fn emit(&self, rec: &mut AgentRecord, kind: EventKind) -> u64 {
        self.apply(rec, &kind);
        let seq = self.journal.append(&self.key, kind);
        self.last_seq.store(seq, Ordering::Release);
        seq
    }

    /// [`AgentCell::emit`] for several events that must be durable together (a crash keeps all or
    /// none of them; see [`Journal::append_all`]).
    pub(crate) fn emit_all(&self, rec: &mut AgentRecord, kinds: Vec<EventKind>) -> u64 {
        for kind in &kinds {
            self.apply(rec, kind);
        }
        let seq = self.journal.append_all(&self.key, kinds);
        self.last_seq.store(seq, Ordering::Release);
        seq
    }

    /// Resolves once everything this agent has journaled so far is durable (an acknowledgement
    /// that promises durability waits on it, outside every lock), or with why it is not.
    pub(crate) fn durable_so_far(
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
    pub(crate) fn journal(&self) -> &Arc<dyn Journal> {
        &self.journal
    }

    /// Puts the record's pending events back in the ordinary lane, in id order, before the actor
    /// starts (a restart on a journal): they keep their ids and are not journaled again. They may
    /// exceed the lane's capacity (see [`PriorityMailbox::requeue`]). Returns how many.
    pub(crate) fn requeue_pending(&self) -> usize {
        let rec = self.lock();
        let mut pending: Vec<_> = rec.pending.iter().collect();
        pending.sort_by_key(|p| p.id);
        let mut requeued = 0;
        for p in pending {
            let work = Work::Event {
                id: p.id,
                event: p.event.clone(),
                accepted: tokio::time::Instant::now(),
                // The caller's trace did not survive the restart.
                trace: crate::telemetry::TraceContext::default(),
            };
            if self.mailbox.requeue(AgentMsg::Work(work)).is_ok() {
                requeued += 1;
            }
        }
        requeued
    }

    /// Journals an event that changes nothing in the record (or a fresh agent's `Spawned`,
    /// which the fresh slot keeps without building the record: see [`RecordSlot`]).
    pub(crate) fn note(&self, kind: EventKind) {
        let mut slot = self.record.lock();
        if let (
            RecordSlot::Fresh {
                role,
                parent,
                max_consecutive_errors,
                fleet_halted: false,
            },
            EventKind::Spawned {
                role: r,
                parent: p,
                max_consecutive_errors: m,
            },
        ) = (&mut *slot, &kind)
        {
            (*role, *parent, *max_consecutive_errors) = (*r, p.clone(), *m);
            let seq = self.journal.append(&self.key, kind);
            self.last_seq.store(seq, Ordering::Release);
            return;
        }
        let rec = slot.full(&self.key);
        self.emit(rec, kind);
    }

    /// Moves to `to` if the table allows it; otherwise journals the refusal and returns the error.
    pub(crate) fn transition(
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
    pub(crate) fn transition_with(
        &self,
        rec: &mut AgentRecord,
        with: Vec<EventKind>,
        to: AgentState,
        cause: &str,
    ) -> Result<(), IllegalTransition> {
        let from = rec.state;
        let (change, allowed) = self.checked_change(from, to, cause);
        if let Err(err) = allowed {
            self.emit(rec, change);
            return Err(err);
        }
        if with.is_empty() {
            self.emit(rec, change);
        } else {
            let mut kinds = with;
            kinds.push(change);
            self.emit_all(rec, kinds);
        }
        self.announce(from, to, cause);
        Ok(())
    }

    /// The event a move from `from` to `to` journals: the `StateChanged` if the table allows it,
    /// otherwise the `TransitionRefused` (logged) with the error.
    fn checked_change(
        &self,
        from: AgentState,
        to: AgentState,
        cause: &str,
    ) -> (EventKind, Result<(), IllegalTransition>) {
        let cause = cause.to_owned();
        match from.check_transition(to) {
            Ok(()) => (EventKind::StateChanged { from, to, cause }, Ok(())),
            Err(err) => {
                tracing::warn!(agent = %self.key, %from, %to, cause, "illegal transition refused");
                (EventKind::TransitionRefused { from, to, cause }, Err(err))
            }
        }
    }

    /// Applies `kind` to the record and hands it to `out` instead of the journal: the caller
    /// journals what `out` gathered (see [`AgentCell::journaled`]) before it releases the record
    /// lock, so the journal order is still the order of changes.
    pub(crate) fn stage(&self, rec: &mut AgentRecord, kind: EventKind, out: &mut impl Staged) {
        self.apply(rec, &kind);
        out.stage(kind);
    }

    /// [`AgentCell::transition`] staged ([`AgentCell::stage`]): the `StateChanged` (or the
    /// `TransitionRefused`) applied and handed to `out`. The caller announces the change
    /// ([`AgentCell::announce`]) once it is journaled.
    pub(crate) fn stage_transition(
        &self,
        rec: &mut AgentRecord,
        to: AgentState,
        cause: &str,
        out: &mut impl Staged,
    ) -> Result<(), IllegalTransition> {
        let (change, allowed) = self.checked_change(rec.state, to, cause);
        self.stage(rec, change, out);
        allowed
    }

    /// Notes `seq` as the journal seq of the last event this agent journaled (staged events the
    /// caller journaled itself, under the record lock it still holds).
    pub(crate) fn journaled(&self, seq: u64) {
        self.last_seq.store(seq, Ordering::Release);
    }

    /// The journal seq of the last event this agent journaled.
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Acquire)
    }

    /// A host's world hears the agent fall silent or come back (`from → to`, when it is one of
    /// those; journaled: the state change is). Never blocks.
    pub(crate) fn announce(&self, from: AgentState, to: AgentState, cause: &str) {
        self.replies.announce(&self.key, from, to, cause);
    }

    /// Whether ordinary work is paused, without taking the record lock.
    pub(crate) fn paused(&self) -> bool {
        self.paused_mirror.load(Ordering::Acquire)
    }

    /// The current state, without taking the record lock.
    pub(crate) fn state(&self) -> AgentState {
        AgentState::ALL[self.state_mirror.load(Ordering::Acquire) as usize]
    }

    // ---- crash ------------------------------------------------------------------------------------
    /// The generation of the next actor to start on this cell.
    pub(crate) fn next_generation(&self) -> u64 {
        u64::from(
            self.generation
                .fetch_add(1, Ordering::AcqRel)
                .wrapping_add(1),
        )
    }

    /// The generation of the actor started last.
    pub(crate) fn generation(&self) -> u64 {
        u64::from(self.generation.load(Ordering::Acquire))
    }

    pub(crate) fn report_crash(&self, generation: u64) {
        if let Some(tx) = &self.crash_tx {
            let _ = tx.send((self.key.clone(), generation));
        }
    }

    // ---- status -----------------------------------------------------------------------------------
    pub(crate) fn status(&self) -> AgentStatus {
        let (tokens_used, cost_used) = {
            let breakers = self.breakers.lock();
            breakers
                .as_ref()
                .map_or((0, 0.0), |b| (b.tokens_used(), b.cost_used()))
        };
        self.read(|rec| AgentStatus {
            key: rec.key.clone(),
            role: rec.role,
            state: rec.state,
            emergency_stop: rec.emergency_stop(),
            lockout: rec.lockout.as_deref().cloned(),
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
            history_tokens: rec.history_tokens,
            goals: rec.goals.clone(),
            budget_wait_until_ms: self.hourly_wait_until_ms(),
            stopped_by: rec.stopped_by.as_deref().cloned(),
            tokens_used,
            cost_used,
            npc: self.npc_status(),
            node: None,
        })
    }

    /// A copy of the record.
    pub(crate) fn record(&self) -> AgentRecord {
        self.read(AgentRecord::clone)
    }
}

#[cfg(test)]
mod tests;
