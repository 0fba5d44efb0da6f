//! The supervisor: owns the agents, enforces delegation budgets, propagates halts, restarts crashes.
//!
//! # Invariants
//! * Every delegation holds a [`Slot`] for its whole life. The slot's `Drop` releases the delegator's
//!   budget, unlinks the pair and journals `DelegationEnded` — so success, failure, timeout, halt,
//!   abandonment and panic all release it, and `active_sub_agents` counts running delegations exactly.
//! * A refusal is decided before anything is queued, and journaled on the delegator.
//! * A restart reuses the agent's [`AgentCell`]: record (state, lockout, counters, history) and mailbox
//!   survive. A locked-out agent comes back locked out.
//! * An agent spawned from a restored record gets its pending events queued again, in id order, before
//!   any new work (a locked-out one refuses them when it reads them, a stopped one keeps them queued
//!   until resumed, as with any queued work).
//!
//! # Lock order
//! Registry shard (dashmap) → agent record. Never a record while holding another agent's record, except
//! the breaker's leaf notification (delegate record → delegator's mailbox lane).

use crate::{
    agent::{
        actor::{AgentActor, Shutdown},
        cell::{AgentCell, AgentSettings, CellParts},
        queue_halt,
        reply::{ReplyHub, Settlement},
        send_halt, AgentHandle, AgentMsg, DelegatedTask, HaltAck, HaltReply, TaskError, Work,
    },
    context::ContextStrategy,
    journal::Journal,
    mailbox::PriorityMailbox,
    provider::Provider,
    safety::{
        GetSafetyReport, InterventionBus, LimitCheckpoint, LimitContext, SafetyMonitor,
        SafetyReport, TeamBudget, TeamSafety,
    },
    tools::{CircuitConfig, ToolRunner},
    tools::{Tool, ToolContext, ToolError, ToolRegistry},
};
use actix::{Actor, Addr, Arbiter, ArbiterHandle};
use dashmap::DashMap;
use futures::future::{join_all, BoxFuture};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, OnceLock, Weak,
    },
    time::Duration,
};
use tokio::{sync::oneshot, time::Instant};
use warden_protocols::{
    AgentKey, AgentRecord, AgentRole, AgentState, AgentStatus, ContextStrategyConfig,
    DelegationOutcome, DelegationRefusal, EventFate, EventKind, FleetView, HaltCause, LimitKind,
    RestartStrategy, TerminationReason, ToolCategory, ToolSpec, WardenConfig,
};

/// What to spawn.
pub struct AgentSpec {
    key: AgentKey,
    role: AgentRole,
    parent: Option<AgentKey>,
    system_prompt: Option<String>,
    provider: Arc<dyn Provider>,
    tools: ToolRegistry,
    can_delegate: bool,
    restored: Option<AgentRecord>,
}

impl AgentSpec {
    /// An assistant (may delegate).
    pub fn assistant(key: impl Into<AgentKey>, provider: Arc<dyn Provider>) -> Self {
        AgentSpec {
            key: key.into(),
            role: AgentRole::Assistant,
            parent: None,
            system_prompt: None,
            provider,
            tools: ToolRegistry::new(),
            can_delegate: true,
            restored: None,
        }
    }

    /// A sub-agent owned by `parent` (may delegate further, within the hop limit).
    pub fn sub_agent(
        key: impl Into<AgentKey>,
        parent: impl Into<AgentKey>,
        provider: Arc<dyn Provider>,
    ) -> Self {
        AgentSpec {
            role: AgentRole::SubAgent,
            parent: Some(parent.into()),
            ..AgentSpec::assistant(key, provider)
        }
    }

    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    pub fn with_tool(mut self, tool: impl Tool) -> Self {
        self.tools.register(Arc::new(tool));
        self
    }

    pub fn with_tool_arc(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.register(tool);
        self
    }

    /// No `delegate` tool.
    pub fn without_delegation(mut self) -> Self {
        self.can_delegate = false;
        self
    }

    /// Starts from a record rebuilt from a journal instead of a fresh one (state, lockout, counters and
    /// history are kept as they were; its pending events are queued again, in id order, before any
    /// new work, keeping their ids).
    pub fn restored_from(mut self, record: AgentRecord) -> Self {
        self.restored = Some(record);
        self
    }
}

/// Why a spawn failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnError {
    #[error("an agent with key {0} already exists")]
    DuplicateKey(AgentKey),
    #[error("restored record is for {found}, not {expected}")]
    RecordMismatch { expected: AgentKey, found: AgentKey },
}

/// No agent with that key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown agent {0}")]
pub struct UnknownAgent(pub AgentKey);

/// How a delegation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelegationError {
    #[error("delegation refused: {0}")]
    Refused(DelegationRefusal),
    #[error("delegation failed: {0}")]
    Failed(TaskError),
    #[error("delegate timed out after {0} ms")]
    TimedOut(u64),
    #[error("delegate dropped the task (halted, crashed or shut down)")]
    Abandoned,
}

struct AgentEntry {
    cell: Arc<AgentCell>,
    addr: Mutex<Option<Addr<AgentActor>>>,
    arbiter: Option<ArbiterHandle>,
    /// Restart times inside the intensity window.
    restarts: Mutex<VecDeque<Instant>>,
}

struct SupervisorShared {
    config: WardenConfig,
    journal: Arc<dyn Journal>,
    agents: DashMap<AgentKey, Arc<AgentEntry>>,
    /// Spawn order (for `rest_for_one` and stable listings).
    order: Mutex<Vec<Arc<AgentEntry>>>,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: AtomicUsize,
    next_delegation: AtomicU64,
    crash_tx: tokio::sync::mpsc::UnboundedSender<(AgentKey, u64)>,
    shutting_down: AtomicBool,
    safety: Arc<TeamSafety>,
    /// The `delegate` tool and its spec, built once and shared by every agent that may delegate.
    delegate_tool: OnceLock<(Arc<ToolSpec>, Arc<DelegateTool>)>,
    /// Every agent's settled events, for the host that takes the stream.
    replies: Arc<ReplyHub>,
}

/// Builds a [`Supervisor`]. Must be used inside a running actix `System`.
pub struct SupervisorBuilder {
    config: WardenConfig,
    journal: Arc<dyn Journal>,
    bus: Option<Arc<dyn InterventionBus>>,
    current_arbiter: bool,
    safety_checks: bool,
    capacity: usize,
}

impl SupervisorBuilder {
    /// The operator channel for `safety.on_limit.mode = "interactive"` (without one, interactive
    /// asks are refused with `no_bus`).
    pub fn intervention_bus(mut self, bus: Arc<dyn InterventionBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// Every agent on the current arbiter (deterministic tests, paused time, one-thread embedding)
    /// instead of `supervisor.arbiters` new ones.
    pub fn current_arbiter(mut self) -> Self {
        self.current_arbiter = true;
        self
    }

    /// Room for `agents` agents in the registry from the start (no rehashing while a large fleet is
    /// spawned). Default 0: grows as needed.
    pub fn capacity(mut self, agents: usize) -> Self {
        self.capacity = agents;
        self
    }

    /// `false` turns the SafetyMonitor's checks off (budgets, loop caps, repetition, error cascade),
    /// for overhead comparisons in load tests. The consecutive-error stop and halts stay on.
    pub fn safety_checks(mut self, on: bool) -> Self {
        self.safety_checks = on;
        self
    }

    pub fn build(self) -> Supervisor {
        let arbiters = if self.current_arbiter {
            Vec::new()
        } else {
            let n = match self.config.supervisor.arbiters {
                0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                n => n,
            };
            (0..n).map(|_| Arbiter::new().handle()).collect()
        };
        let team = Arc::new(TeamBudget::new(&self.config.safety.budget));
        let monitor = SafetyMonitor::new(team.clone()).start();
        let safety = Arc::new(TeamSafety {
            config: Arc::new(self.config.safety.clone()),
            checkpoint: Arc::new(LimitCheckpoint::new(
                self.config.safety.on_limit.clone(),
                self.bus,
            )),
            team,
            monitor: Some(monitor),
            checks: self.safety_checks,
        });
        Supervisor::build(self.config, self.journal, arbiters, safety, self.capacity)
    }
}

/// Owns a team of agents. Cheap to clone. Must be created inside a running actix `System`.
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<SupervisorShared>,
}

impl Supervisor {
    /// A builder (intervention bus, arbiters, safety checks).
    pub fn builder(config: WardenConfig, journal: Arc<dyn Journal>) -> SupervisorBuilder {
        SupervisorBuilder {
            config,
            journal,
            bus: None,
            current_arbiter: false,
            safety_checks: true,
            capacity: 0,
        }
    }

    /// Agents spread over `supervisor.arbiters` new arbiters (0 = one per core).
    pub fn new(config: WardenConfig, journal: Arc<dyn Journal>) -> Self {
        Self::builder(config, journal).build()
    }

    /// Every agent on the current arbiter (deterministic tests, paused time, embedding in one thread).
    pub fn on_current_arbiter(config: WardenConfig, journal: Arc<dyn Journal>) -> Self {
        Self::builder(config, journal).current_arbiter().build()
    }

    fn build(
        config: WardenConfig,
        journal: Arc<dyn Journal>,
        arbiters: Vec<ArbiterHandle>,
        safety: Arc<TeamSafety>,
        capacity: usize,
    ) -> Self {
        let (crash_tx, mut crash_rx) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(SupervisorShared {
            config,
            journal,
            agents: DashMap::with_capacity(capacity),
            delegate_tool: OnceLock::new(),
            order: Mutex::new(Vec::with_capacity(capacity)),
            arbiters,
            next_arbiter: AtomicUsize::new(0),
            next_delegation: AtomicU64::new(1),
            crash_tx,
            shutting_down: AtomicBool::new(false),
            safety,
            replies: Arc::default(),
        });
        let weak = Arc::downgrade(&shared);
        actix_rt::spawn(async move {
            while let Some((key, generation)) = crash_rx.recv().await {
                let Some(shared) = weak.upgrade() else { break };
                Supervisor { shared }.on_crash(key, generation).await;
            }
        });
        Supervisor { shared }
    }

    /// Every agent's settled events as one stream, in the order they settle: each answered,
    /// refused, discarded or failed user event, waited for or not (a game server's NPC lines, a load
    /// tester's latencies). One taker: the first call gets the stream, later calls `None`. Until it
    /// is taken nothing is kept; once taken, settlements queue until read (unbounded: read them).
    pub fn take_replies(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Settlement>> {
        self.shared.replies.take()
    }

    /// `Some(reason)` while the team's journal cannot write (see [`Journal::degraded`]).
    pub fn journal_degraded(&self) -> Option<String> {
        self.shared.journal.degraded()
    }

    /// The team's token/cost totals and locked-out share (synchronous).
    pub fn fleet_view(&self) -> FleetView {
        self.shared.safety.team.fleet_view()
    }

    /// How many task runs the limit checkpoint keeps extension counts for (at most one per agent).
    pub fn limit_runs_tracked(&self) -> usize {
        self.shared.safety.checkpoint.runs_tracked()
    }

    /// The SafetyMonitor's report: fleet view, trips by breaker, recent trips.
    pub async fn safety_report(&self) -> Option<SafetyReport> {
        let monitor = self.shared.safety.monitor.clone()?;
        monitor.send(GetSafetyReport).await.ok()
    }

    pub fn config(&self) -> &WardenConfig {
        &self.shared.config
    }

    /// Spawns an agent and starts its actor.
    pub fn spawn(&self, spec: AgentSpec) -> Result<AgentHandle, SpawnError> {
        let config = &self.shared.config;
        let AgentSpec {
            key,
            role,
            parent,
            system_prompt,
            provider,
            mut tools,
            can_delegate,
            restored,
        } = spec;
        if self.shared.agents.contains_key(&key) {
            return Err(SpawnError::DuplicateKey(key));
        }
        if can_delegate {
            let (spec, tool) = self.shared.delegate_tool.get_or_init(|| {
                let tool = DelegateTool {
                    supervisor: Arc::downgrade(&self.shared),
                };
                (Arc::new(tool.spec()), Arc::new(tool))
            });
            tools.register_with_spec(spec.clone(), tool.clone());
        }
        let fresh = restored.is_none();
        let record = match restored {
            Some(record) if record.key != key => {
                return Err(SpawnError::RecordMismatch {
                    expected: key,
                    found: record.key,
                })
            }
            Some(record) => record,
            None => AgentRecord::new(key.clone()),
        };
        let settings = AgentSettings {
            max_iterations_per_tick: config.execution.max_iterations_per_tick,
            multi_action: config.execution.multi_action_enabled,
            tool_timeout: Duration::from_secs_f64(config.tools.timeout_seconds),
            sub_agent_budget: config.delegation.sub_agent_budget,
            max_context_tokens: config.execution.max_context_tokens,
            context_strategy: match config.execution.context_strategy {
                ContextStrategyConfig::SlidingWindow => ContextStrategy::SlidingWindow,
                ContextStrategyConfig::Compact => ContextStrategy::Compact,
            },
            max_tokens_recoveries: config.execution.max_tokens_recoveries,
        };
        let runner = ToolRunner::new(CircuitConfig {
            failure_threshold: config.tools.circuit_failure_threshold.get(),
            cool_down: Duration::from_secs_f64(config.tools.circuit_cool_down_seconds),
        });
        let cell = Arc::new(AgentCell::new(CellParts {
            record,
            mailbox: PriorityMailbox::new(config.mailbox.ordinary_capacity.get()),
            provider,
            tools,
            runner,
            system_prompt,
            settings,
            journal: self.shared.journal.clone(),
            crash_tx: Some(self.shared.crash_tx.clone()),
            safety: self.shared.safety.clone(),
            replies: self.shared.replies.clone(),
        }));
        if fresh {
            cell.note(EventKind::Spawned {
                role,
                parent,
                max_consecutive_errors: config.safety.breakers.max_consecutive_errors.get(),
            });
        } else {
            // The events a previous process accepted and had not settled, before any new work.
            let requeued = cell.requeue_pending();
            if requeued > 0 {
                tracing::info!(agent = %cell.key, requeued, "pending events queued again");
            }
        }
        let arbiter = (!self.shared.arbiters.is_empty()).then(|| {
            let i = self.shared.next_arbiter.fetch_add(1, Ordering::Relaxed);
            self.shared.arbiters[i % self.shared.arbiters.len()].clone()
        });
        let entry = Arc::new(AgentEntry {
            cell: cell.clone(),
            addr: Mutex::new(None),
            arbiter,
            restarts: Mutex::new(VecDeque::new()),
        });
        match self.shared.agents.entry(key.clone()) {
            dashmap::mapref::entry::Entry::Occupied(_) => {
                return Err(SpawnError::DuplicateKey(key))
            }
            dashmap::mapref::entry::Entry::Vacant(v) => {
                v.insert(entry.clone());
            }
        }
        self.shared.order.lock().push(entry.clone());
        start_actor(&entry);
        Ok(AgentHandle { cell })
    }

    pub fn get(&self, key: &str) -> Option<AgentHandle> {
        self.shared.agents.get(key).map(|e| AgentHandle {
            cell: e.cell.clone(),
        })
    }

    /// Every agent, in spawn order.
    pub fn agents(&self) -> Vec<AgentHandle> {
        self.cells()
            .into_iter()
            .map(|cell| AgentHandle { cell })
            .collect()
    }

    /// Every agent's cell, in spawn order (which is also, roughly, the order of their memory: walking
    /// it is kinder to the caches than the registry's hash order).
    fn cells(&self) -> Vec<Arc<AgentCell>> {
        self.shared
            .order
            .lock()
            .iter()
            .map(|e| e.cell.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.shared.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shared.agents.is_empty()
    }

    /// Resolves once every agent's actor has started (`spawn` returns before its actor runs: the
    /// actor starts on its arbiter). For measurements that must include the actors' own cost. Returns
    /// at once after [`Supervisor::shutdown`].
    pub async fn started(&self) {
        let cells = self.cells();
        // Actors start roughly in spawn order: walk forward, yielding only while the next one waits.
        let mut next = 0;
        while let Some(cell) = cells.get(next) {
            if self.shared.shutting_down.load(Ordering::SeqCst) {
                return; // a stopped arbiter would never start the rest
            }
            if cell.mailbox.has_reader() {
                next += 1;
            } else {
                tokio::task::yield_now().await;
            }
        }
    }

    /// Status of every agent, in spawn order.
    pub fn statuses(&self) -> Vec<AgentStatus> {
        self.agents().iter().map(AgentHandle::status).collect()
    }

    /// Halts `key` and every delegate it is running (transitively). Resolves when all of them have
    /// acknowledged `STOPPED`; the first ack is `key`'s.
    pub async fn halt(&self, key: &str, cause: HaltCause) -> Result<Vec<HaltAck>, UnknownAgent> {
        let handle = self.get(key).ok_or_else(|| UnknownAgent(key.into()))?;
        // Collect the subtree before halting: the halt ends the delegations that link it.
        let mut subtree = Vec::new();
        let mut stack = vec![handle.cell.clone()];
        while let Some(cell) = stack.pop() {
            if subtree
                .iter()
                .any(|c: &Arc<AgentCell>| Arc::ptr_eq(c, &cell))
            {
                continue;
            }
            stack.extend(cell.running_delegates());
            subtree.push(cell);
        }
        let receivers: Vec<_> = subtree
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                let cause = if i == 0 {
                    cause.clone()
                } else {
                    HaltCause::Parent {
                        parent: handle.key().clone(),
                    }
                };
                (cell.clone(), send_halt(cell, cause))
            })
            .collect();
        Ok(collect_acks(receivers).await)
    }

    /// SystemHalt to every agent. Resolves once every agent has acknowledged `STOPPED`; one ack per
    /// agent, in spawn order.
    ///
    /// Every agent's halt flag is raised (and its turn cancelled) synchronously, before the first
    /// await. The acknowledgements are gathered on one channel rather than one oneshot and one
    /// future per agent: that is the difference between O(agents) allocations and futures for the
    /// caller to poll, and none.
    pub async fn halt_all(&self) -> Vec<HaltAck> {
        let cells = self.cells();
        // Every flag first: each agent is halted with this cause, its delegates included (they are
        // agents of the team), so nothing needs passing down a tree.
        for cell in &cells {
            let _ = cell.request_halt();
        }
        let (to, mut acks_rx) = tokio::sync::mpsc::unbounded_channel();
        for (slot, cell) in cells.iter().enumerate() {
            let reply = HaltReply::Gathered {
                slot,
                to: to.clone(),
            };
            queue_halt(cell, HaltCause::HaltAll, Some(reply));
        }
        drop(to);
        let mut acks: Vec<Option<HaltAck>> = Vec::new();
        acks.resize_with(cells.len(), || None);
        // Ends when every request was answered or dropped (an actor that died with it queued).
        while let Some((slot, ack)) = acks_rx.recv().await {
            if let Some(place) = acks.get_mut(slot) {
                *place = Some(ack);
            }
        }
        acks.into_iter()
            .zip(&cells)
            .map(|(ack, cell)| ack.unwrap_or_else(|| cell.halt_ack_now()))
            .collect()
    }

    /// Stops every actor deliberately (no restarts), then the arbiter threads the supervisor started.
    /// Queued work stays in the records' mailboxes; queued user events also stay pending in the
    /// journal, and come back when the team is restored from it.
    pub async fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        // Whoever waits for a reply is told the agent is gone (the events stay pending).
        for e in self.shared.agents.iter() {
            e.cell.waiters.clear();
        }
        let addrs: Vec<_> = self
            .shared
            .agents
            .iter()
            .filter_map(|e| e.addr.lock().clone())
            .collect();
        join_all(addrs.iter().map(|a| a.send(Shutdown))).await;
        for e in self.shared.agents.iter() {
            e.cell.mailbox.close();
        }
        // The arbiter threads this supervisor started end with it (the actix System keeps a handle
        // to every arbiter, so they would otherwise idle until the System stops).
        for arbiter in &self.shared.arbiters {
            arbiter.stop();
        }
    }

    // ---- delegation -------------------------------------------------------------------------------

    /// Runs `task` on `to` for `from`, within the budgets. `lineage` is `from`'s current chain.
    pub(crate) async fn delegate(
        &self,
        from: &Arc<AgentCell>,
        to: &AgentKey,
        task: String,
        lineage: &[AgentKey],
    ) -> Result<String, DelegationError> {
        let config = &self.shared.config;
        let refuse = |refusal: DelegationRefusal| {
            from.note(EventKind::DelegationRefused {
                to: to.clone(),
                refusal: refusal.clone(),
            });
            DelegationError::Refused(refusal)
        };
        if from.state().refuses_work() {
            return Err(refuse(DelegationRefusal::DelegatorNotRunning {
                delegator: from.key.clone(),
            }));
        }
        let Some(delegate) = self.shared.agents.get(to).map(|e| e.cell.clone()) else {
            return Err(refuse(DelegationRefusal::UnknownDelegate {
                delegate: to.clone(),
            }));
        };
        if lineage.contains(to) {
            let mut chain = lineage.to_vec();
            chain.push(to.clone());
            return Err(refuse(DelegationRefusal::Cycle { chain }));
        }
        let hops = lineage.len() as u32;
        let max = config.safety.loop_.max_agent_hops;
        if hops > max
            && !self
                .limit_allows(from, LimitKind::AgentHops, f64::from(hops), f64::from(max))
                .await
        {
            return Err(refuse(DelegationRefusal::HopLimit { hops, max }));
        }
        {
            let rec = delegate.lock();
            if rec.emergency_stop() || rec.state.refuses_work() {
                let state = rec.state;
                drop(rec);
                return Err(refuse(DelegationRefusal::EmergencyStop {
                    delegate: to.clone(),
                    state,
                }));
            }
        }
        let budget = from.settings.sub_agent_budget;
        if let Err(active) = from.try_acquire_slot(budget) {
            let allowed = self
                .limit_allows(
                    from,
                    LimitKind::SubAgentBudget,
                    f64::from(active + 1),
                    f64::from(budget),
                )
                .await;
            if !allowed || from.try_acquire_slot(active + 1).is_err() {
                return Err(refuse(DelegationRefusal::SubAgentBudget { active, budget }));
            }
        }
        let id = self.shared.next_delegation.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::delegation_gap(&from.key);
        let mut slot = Slot::new(from.clone(), delegate.clone(), id);
        // A halt raised before the delegation was listed (`Slot::new`) did not see it: refuse it
        // here, before the task is sent (see `AgentCell::request_halt` for the ordering).
        if from.halt_requested() {
            drop(slot);
            return Err(refuse(DelegationRefusal::DelegatorNotRunning {
                delegator: from.key.clone(),
            }));
        }
        from.note(EventKind::DelegationRequested {
            id,
            to: to.clone(),
            hops,
        });
        let (reply, rx) = oneshot::channel();
        let mut chain = lineage.to_vec();
        chain.push(to.clone());
        let task = AgentMsg::Work(Work::Delegated(DelegatedTask {
            task,
            lineage: Arc::from(chain),
            reply,
        }));
        if let Err(err) = delegate.mailbox.try_send(task) {
            let refusal = match err {
                crate::mailbox::TrySendError::Full(_) => {
                    warden_protocols::WorkRefusal::MailboxFull {
                        capacity: delegate.mailbox.capacity(),
                    }
                }
                crate::mailbox::TrySendError::Closed(_) => warden_protocols::WorkRefusal::Closed,
            };
            slot.outcome = Some(DelegationOutcome::Failed {
                error: refusal.to_string(),
            });
            drop(slot);
            return Err(refuse(DelegationRefusal::DelegateRefused {
                delegate: to.clone(),
                refusal,
            }));
        }
        let chain_seconds = config.safety.timeout.chain_seconds;
        let answer = if chain_seconds > 0.0 {
            let limit = Duration::from_secs_f64(chain_seconds);
            let mut rx = rx;
            let mut waited = Duration::ZERO;
            loop {
                match tokio::time::timeout(limit, &mut rx).await {
                    Ok(answer) => break answer,
                    Err(_) => {
                        waited += limit;
                        let allowed = self
                            .limit_allows(
                                from,
                                LimitKind::ChainWait,
                                waited.as_secs_f64(),
                                waited.as_secs_f64(),
                            )
                            .await;
                        if !allowed {
                            let after_ms = waited.as_millis() as u64;
                            slot.outcome = Some(DelegationOutcome::TimedOut { after_ms });
                            return Err(DelegationError::TimedOut(after_ms));
                        }
                    }
                }
            }
        } else {
            rx.await
        };
        match answer {
            Ok(Ok(answer)) => {
                slot.outcome = Some(DelegationOutcome::Completed);
                Ok(answer)
            }
            Ok(Err(error)) => {
                slot.outcome = Some(DelegationOutcome::Failed {
                    error: error.to_string(),
                });
                Err(DelegationError::Failed(error))
            }
            Err(_) => {
                slot.outcome = Some(DelegationOutcome::Abandoned);
                Err(DelegationError::Abandoned)
            }
        }
    }

    /// Routes a delegation limit through the team's checkpoint (`safety.on_limit`). With the safety
    /// checks off, limits are plain refusals.
    async fn limit_allows(
        &self,
        from: &AgentCell,
        kind: LimitKind,
        current: f64,
        configured: f64,
    ) -> bool {
        if !self.shared.safety.checks {
            return false;
        }
        let ctx = LimitContext {
            // Hops and sub-agents are allowed one at a time; a wait by one more period.
            extension: match kind {
                LimitKind::ChainWait => self.shared.config.safety.timeout.chain_seconds,
                _ => 1.0,
            },
            run_id: from.current_run_id(),
            agent: from.key.clone(),
            kind,
            current,
            configured,
            partial_results: false,
        };
        let decision = self
            .shared
            .safety
            .checkpoint
            .handle_limit_exceeded(&ctx)
            .await;
        let allow = decision.allow;
        from.note(EventKind::LimitDecided {
            kind,
            current,
            configured,
            decision,
        });
        allow
    }

    // ---- restarts ---------------------------------------------------------------------------------

    async fn on_crash(&self, key: AgentKey, generation: u64) {
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
            let mut times = entry.restarts.lock();
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
                let addr = v.addr.lock().clone();
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
            start_actor(&v);
        }
    }
}

/// Waits for every ack; an agent whose actor is gone reports its record's state.
async fn collect_acks(
    receivers: Vec<(Arc<AgentCell>, oneshot::Receiver<HaltAck>)>,
) -> Vec<HaltAck> {
    join_all(
        receivers
            .into_iter()
            .map(|(cell, rx)| async move { rx.await.unwrap_or_else(|_| cell.halt_ack_now()) }),
    )
    .await
}

fn start_actor(entry: &Arc<AgentEntry>) {
    let cell = entry.cell.clone();
    let generation = cell.next_generation();
    let addr = match &entry.arbiter {
        Some(arbiter) => {
            AgentActor::start_in_arbiter(arbiter, move |_| AgentActor::new(cell, generation))
        }
        None => AgentActor::new(cell, generation).start(),
    };
    *entry.addr.lock() = Some(addr);
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
    if !rec.state.refuses_work() {
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
                reply.send(cell.halt_ack_now());
            }
        }
    }
}

/// One running delegation. Dropping it — on any ending — releases the delegator's slot.
struct Slot {
    from: Arc<AgentCell>,
    to: Arc<AgentCell>,
    id: u64,
    outcome: Option<DelegationOutcome>,
}

impl Slot {
    /// The slot is already acquired on `from`.
    fn new(from: Arc<AgentCell>, to: Arc<AgentCell>, id: u64) -> Self {
        from.add_delegation(id, to.clone());
        to.add_delegator(id, &from);
        Slot {
            from,
            to,
            id,
            outcome: None,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.from.remove_delegation(self.id);
        self.to.remove_delegator(self.id);
        self.from.release_slot();
        self.from.note(EventKind::DelegationEnded {
            id: self.id,
            to: self.to.key.clone(),
            outcome: self.outcome.take().unwrap_or(DelegationOutcome::Cancelled),
        });
    }
}

/// The built-in `delegate` tool.
struct DelegateTool {
    supervisor: Weak<SupervisorShared>,
}

impl Tool for DelegateTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "delegate".into(),
            description: "Hand a task to another agent and wait for its answer.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "description": "key of the agent to delegate to"},
                    "task": {"type": "string", "description": "what it should do"}
                },
                "required": ["agent", "task"]
            }),
            category: ToolCategory::SafeChain,
        }
    }

    fn circuit_breaker(&self) -> bool {
        // Per-delegate safety is the supervisor's (refusals of locked-out delegates).
        false
    }

    fn timeout(&self) -> Option<Duration> {
        // The delegation enforces `safety.timeout.chain_seconds` itself, through the limit checkpoint
        // (which may extend the wait); a tool timeout must never cut it short.
        Some(Duration::from_secs(100 * 365 * 86_400))
    }

    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        let supervisor = self.supervisor.clone();
        Box::pin(async move {
            let field = |name: &str| {
                args.get(name)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        ToolError::InvalidArguments(format!("`{name}` must be a string"))
                    })
            };
            let to = AgentKey::from(field("agent")?);
            let task = field("task")?;
            let shared = supervisor
                .upgrade()
                .ok_or_else(|| ToolError::Failed("supervisor is gone".into()))?;
            let supervisor = Supervisor { shared };
            let from = supervisor
                .shared
                .agents
                .get(&ctx.agent)
                .map(|e| e.cell.clone())
                .ok_or_else(|| ToolError::Failed(format!("unknown delegator {}", ctx.agent)))?;
            let answer = supervisor
                .delegate(&from, &to, task, &ctx.lineage)
                .await
                .map_err(|e| ToolError::Failed(e.to_string()))?;
            Ok(json!({"agent": to, "answer": answer}))
        })
    }
}
