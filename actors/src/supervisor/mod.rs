//! The supervisor: owns the agents, enforces delegation budgets, propagates halts, restarts crashes.
//!
//! Files: this one (the registry: building, spawning, looking up, halting, shutting down),
//! `spec.rs` (what to spawn, the errors), `delegation.rs` (budgets, the [`Slot`], the `delegate`
//! tool), `restart.rs` (crash recovery and the restart intensity), `fleet_halt.rs` (which agents a
//! fleet halt stopped, and lifting it).
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
//! Registry shard (dashmap; a spawn holds its key's shard while it sets the new agent up) → agent
//! record. Never a record while holding another agent's record, except
//! the breaker's leaf notification (delegate record → delegator's mailbox lane).

mod delegation;
mod fleet_halt;
mod goals;
mod restart;
mod spec;

pub use delegation::a2a::{A2aPeers, PeerError, PeerMessage, PeerState, PeerTask};
pub use fleet_halt::LiftOutcome;
pub use spec::{AgentSpec, DelegationError, SpawnError, TickConfigError, UnknownAgent};

use delegation::DelegateTool;
use restart::start_actor;
pub(crate) use restart::Activator;

use crate::{
    agent::{
        actor::{AgentActor, Shutdown},
        cell::{AgentCell, AgentSettings, CellParts, Profile},
        halt_batch::{HaltBatch, Unsettled},
        queue_halt, queue_halt_gathered,
        reply::{ReplyHub, Settlement},
        send_halt, AgentHandle, AgentMsg, DelegatedTask, HaltAck, SentAck, TaskError, Work,
    },
    context::ContextStrategy,
    journal::Journal,
    mailbox::PriorityMailbox,
    npc::{tick::TickArbiter, TickReport},
    provider::Provider,
    safety::{
        GetSafetyReport, InterventionBus, LimitCheckpoint, LimitContext, SafetyMonitor,
        SafetyReport, TeamBudget, TeamSafety,
    },
    tools::CircuitConfig,
    tools::{Tool, ToolContext, ToolError, ToolRegistry},
};
use actix::{Actor, Addr, Arbiter, ArbiterHandle};
use dashmap::DashMap;
use futures::future::BoxFuture;
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, OnceLock, Weak,
    },
    time::Duration,
};
use tokio::{sync::oneshot, time::Instant};
use warden_protocols::{
    cluster::{RemoteReply, RemoteTask},
    AgentKey, AgentRecord, AgentRole, AgentState, AgentStatus, ContextStrategyConfig,
    DelegationOutcome, DelegationRefusal, EventFate, EventKind, FleetView, HaltCause, LimitKind,
    RestartStrategy, TerminationReason, ToolCategory, ToolSpec, WardenConfig,
};

/// An agent in the registry: its cell (which knows its arbiter; the restart times are in its
/// `Busy` part). No allocation of its own: every agent of a fleet has one.
#[derive(Clone)]
struct AgentEntry {
    cell: Arc<AgentCell>,
}

struct SupervisorShared {
    config: WardenConfig,
    journal: Arc<dyn Journal>,
    /// Hashed with foldhash, seeded per process, not std's SipHash: a spawn hashes its key twice
    /// (the early duplicate check and the insert), and SipHash of a short key was ~235 of a
    /// passive spawn's ~4,200 instructions (callgrind, docs/performance.md). Keys come from the
    /// team file and the admin's API; the seed keeps them from being crafted to collide.
    agents: DashMap<AgentKey, AgentEntry, foldhash::fast::RandomState>,
    /// Spawn order (for `rest_for_one` and stable listings).
    order: Mutex<Vec<AgentEntry>>,
    arbiters: Vec<ArbiterHandle>,
    /// The arbiter the supervisor was built on: where a passive agent's actor starts when the
    /// agents run on the current arbiter (`arbiters` empty).
    home: Option<ArbiterHandle>,
    next_arbiter: AtomicUsize,
    next_delegation: AtomicU64,
    crash_tx: tokio::sync::mpsc::UnboundedSender<(AgentKey, u64)>,
    shutting_down: AtomicBool,
    safety: Arc<TeamSafety>,
    /// The `delegate` tool and its spec, built once and shared by every agent that may delegate.
    delegate_tool: OnceLock<(Arc<ToolSpec>, Arc<DelegateTool>)>,
    /// The `set_goals` tool, and the long-term memory tools without and with `wake_at`: built
    /// once and shared like `delegate_tool` (agents share a [`Profile`] only when they have the
    /// very same tools).
    goals_tool: OnceLock<(Arc<ToolSpec>, Arc<goals::GoalsTool>)>,
    memory_tools: [OnceLock<Vec<SharedTool>>; 2],
    /// The settings of an agent spawned without its own `npc`, `memory`, `permissions` or
    /// `execution` (most of them), built at
    /// the first such spawn and shared (an `Arc` per agent instead of a copy).
    default_settings: OnceLock<Arc<AgentSettings>>,
    /// Every agent's settled events, for the host that takes the stream.
    replies: Arc<ReplyHub>,
    /// `[npc]`, shared by every agent whose spec does not set its own.
    npc: Arc<warden_protocols::npc::NpcConfig>,
    /// The team's one tick arbiter (one timer task for every ticking NPC).
    ticks: TickArbiter,
    /// What another node knows about agents not spawned here (set once, by the cluster layer).
    remote: OnceLock<Arc<dyn RemoteAgents>>,
    /// The remote A2A agents this team may delegate to (set once, before the agents are spawned).
    a2a: OnceLock<Arc<dyn A2aPeers>>,
    /// The agents the standing fleet halt stopped (`fleet_halt.rs`).
    fleet_halt: Mutex<fleet_halt::FleetHaltNote>,
    /// The profiles built last, the most recently used last (see [`Supervisor::profile`]).
    profiles: Mutex<Vec<Arc<Profile>>>,
    /// `supervisor.passivate_after_seconds` as a duration, if agents are passivated (converted
    /// once: each spawn asks).
    passivate_after: Option<Duration>,
}

/// A tool with its spec, built once and registered with every agent that has it.
type SharedTool = (Arc<ToolSpec>, Arc<dyn Tool>);

/// Which of the team's own tools a spawned agent gets besides its spec's (see
/// `Supervisor::add_built_ins`).
#[derive(Debug, Clone, Copy)]
struct BuiltIns {
    goals: bool,
    /// Long-term memory's tools: `Some(sleeps)`, with the sleep tools when it sleeps.
    memory_sleeps: Option<bool>,
    delegate: bool,
}

impl BuiltIns {
    /// As one number, for a profile to say which it was made with.
    fn bits(self) -> u8 {
        u8::from(self.goals)
            | u8::from(self.memory_sleeps.is_some()) << 1
            | u8::from(self.memory_sleeps == Some(true)) << 2
            | u8::from(self.delegate) << 3
    }
}

/// How many profiles a supervisor keeps for agents spawned after to share.
const PROFILES_KEPT: usize = 8;

/// Agents that run elsewhere (on another node of a cluster): asked by a delegation whose delegate
/// is not in this team, before it is refused as unknown. Synchronous: answer from what is known
/// already (a cache kept by watching), never from the network.
pub trait RemoteAgents: Send + Sync + 'static {
    /// The refusal for a delegation to `agent`, if one is due (a lockout on its node:
    /// [`DelegationRefusal::EmergencyStop`]); `None`: refused as unknown, as without a cluster.
    fn refusal(&self, agent: &AgentKey) -> Option<DelegationRefusal>;

    /// The node that runs `agent`, when another node does (`None`: refused as unknown). May ask
    /// the network; bounded by the implementation.
    fn owner(&self, agent: &AgentKey) -> BoxFuture<'static, Option<String>> {
        let _ = agent;
        Box::pin(async { None })
    }

    /// Sends `task` to `node` and resolves with its reply, sending it again while none came
    /// (at-least-once; the owner runs one `task.key` once). The delegation's wait limit is the
    /// caller's (`safety.timeout.chain_seconds`): dropping the future stops waiting.
    fn delegate(&self, node: &str, task: RemoteTask) -> BoxFuture<'static, RemoteReply> {
        let _ = (node, task);
        Box::pin(async { RemoteReply::Abandoned })
    }

    /// Best effort: the delegator of task `key` on `node` was halted while waiting (the owner
    /// halts the delegate if the task still runs).
    fn cancel(&self, node: &str, key: &str, from: &AgentKey) {
        let _ = (node, key, from);
    }
}

/// Builds a [`Supervisor`]. Must be used inside a running actix `System`.
///
/// Defaults: agents spread over `supervisor.arbiters` new arbiters (0: one per core), no
/// intervention bus, safety checks on, an empty registry that grows as needed.
///
/// # Examples
/// ```
/// # use std::sync::Arc;
/// # use warden_actors::{ChannelInterventionBus, MemoryJournal, Supervisor};
/// # use warden_protocols::WardenConfig;
/// # actix_rt::System::new().block_on(async {
/// let bus = Arc::new(ChannelInterventionBus::new());
/// let team = Supervisor::builder(WardenConfig::default(), Arc::new(MemoryJournal::new()))
///     .current_arbiter()
///     .capacity(64)
///     .intervention_bus(bus.clone())
///     .build();
/// assert!(team.is_empty());
/// # });
/// ```
pub struct SupervisorBuilder {
    config: WardenConfig,
    journal: Arc<dyn Journal>,
    bus: Option<Arc<dyn InterventionBus>>,
    current_arbiter: bool,
    safety_checks: bool,
    capacity: usize,
}

impl std::fmt::Debug for SupervisorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SupervisorBuilder").finish_non_exhaustive()
    }
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

    /// The supervisor, with its SafetyMonitor actor started (and its arbiter threads, unless
    /// [`SupervisorBuilder::current_arbiter`]).
    ///
    /// # Panics
    /// Outside a running actix `System`.
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
        let checkpoint = Arc::new(LimitCheckpoint::new(
            self.config.safety.on_limit.clone(),
            self.bus,
        ));
        let (bus, ids) = checkpoint.bus_and_ids();
        let safety = Arc::new(TeamSafety {
            config: Arc::new(self.config.safety.clone()),
            checkpoint,
            permissions: Arc::new(crate::safety::PermissionGate::new(bus, ids)),
            team,
            monitor: Some(monitor),
            checks: self.safety_checks,
            conversations: Default::default(),
            memory: Default::default(),
            model_gate: Default::default(),
        });
        Supervisor::build(self.config, self.journal, arbiters, safety, self.capacity)
    }
}

/// Owns a team of agents. Cheap to clone. Must be created inside a running actix `System`.
///
/// It spawns agents ([`Supervisor::spawn`]), looks them up ([`Supervisor::get`]), halts one with
/// its delegates ([`Supervisor::halt`]) or all ([`Supervisor::halt_all`]), restarts crashed actors
/// by `[supervisor.restart]` (the cell, and with it the record and the mailbox, survives),
/// and stops everything with [`Supervisor::shutdown`].
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use warden_actors::{AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
/// use warden_protocols::{AgentState, UserEvent, WardenConfig};
///
/// #[actix::main]
/// async fn main() {
///     let journal = Arc::new(MemoryJournal::new());
///     let team = Supervisor::builder(WardenConfig::default(), journal)
///         .current_arbiter()
///         .build();
///     let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("Aye.")]));
///     let guard = team.spawn(AgentSpec::assistant("guard", model)).unwrap();
///     assert_eq!(guard.ask(UserEvent::new("halt, who goes there?")).await.unwrap().answer, "Aye.");
///
///     // Stop everything: one acknowledgement per agent, in spawn order.
///     let acks = team.halt_all().await;
///     assert_eq!(acks.len(), 1);
///     assert_eq!(acks[0].state, AgentState::Stopped);
///     team.shutdown().await;
/// }
/// ```
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<SupervisorShared>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("agents", &self.len())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A builder (intervention bus, arbiters, registry capacity, safety checks); see
    /// [`SupervisorBuilder`] for the defaults.
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
    ///
    /// # Panics
    /// Outside a running actix `System`.
    pub fn new(config: WardenConfig, journal: Arc<dyn Journal>) -> Self {
        Self::builder(config, journal).build()
    }

    /// Every agent on the current arbiter (deterministic tests, paused time, embedding in one thread).
    ///
    /// # Panics
    /// Outside a running actix `System`.
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
        let npc = Arc::new(config.npc.clone());
        let ticks = TickArbiter::start(&config.npc.clock);
        let seconds = config.supervisor.passivate_after_seconds;
        let passivate_after = (seconds > 0.0)
            .then(|| Duration::try_from_secs_f64(seconds).ok())
            .flatten();
        let shared = Arc::new(SupervisorShared {
            npc,
            ticks,
            config,
            journal,
            agents: DashMap::with_capacity_and_hasher(
                capacity,
                foldhash::fast::RandomState::default(),
            ),
            delegate_tool: OnceLock::new(),
            goals_tool: OnceLock::new(),
            memory_tools: Default::default(),
            default_settings: OnceLock::new(),
            order: Mutex::new(Vec::with_capacity(capacity)),
            arbiters,
            home: actix_rt::Arbiter::try_current(),
            next_arbiter: AtomicUsize::new(0),
            next_delegation: AtomicU64::new(1),
            crash_tx,
            shutting_down: AtomicBool::new(false),
            safety,
            replies: Arc::default(),
            remote: OnceLock::new(),
            a2a: OnceLock::new(),
            fleet_halt: Mutex::new(None),
            profiles: Mutex::new(Vec::with_capacity(PROFILES_KEPT)),
            passivate_after,
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

    /// Every agent's world-facing notices as one stream, in order: it fell silent (locked out,
    /// halted, stopped by its budget) or is back (unlocked, resumed) — design 000's "notify the
    /// character" (`GET /api/replies` shows the same, read from the journal). One taker, as
    /// [`Supervisor::take_replies`]; nothing is kept until it is taken.
    pub fn take_notices(
        &self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<crate::agent::Notice>> {
        self.shared.replies.take_notices()
    }

    /// The team's journal (external tools journal their definitions and progress through it).
    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.shared.journal
    }

    /// `Some(reason)` while the team's journal cannot write (see [`Journal::degraded`]).
    pub fn journal_degraded(&self) -> Option<String> {
        self.shared.journal.degraded()
    }

    /// The team's token/cost totals and locked-out share (synchronous).
    pub fn fleet_view(&self) -> FleetView {
        self.shared.safety.team.fleet_view()
    }

    /// Sets what is known about agents of other nodes ([`RemoteAgents`]); once (a second call is
    /// ignored and returns `false`).
    pub fn set_remote_agents(&self, remote: Arc<dyn RemoteAgents>) -> bool {
        self.shared.remote.set(remote).is_ok()
    }

    /// Sets the remote A2A agents this team may delegate to ([`A2aPeers`], `[a2a_agents.NAME]`);
    /// once, and before the first agent that may delegate is spawned (the `delegate` tool's
    /// description lists them). `false` when set already.
    pub fn set_a2a_peers(&self, peers: Arc<dyn A2aPeers>) -> bool {
        self.shared.a2a.set(peers).is_ok()
    }

    /// Shares `safety.budget.tokens_per_team` and `cost_per_team` (those set) with other nodes:
    /// this team spends only `held_tokens` and `held_cost` (what it claimed before a restart) and
    /// the slices it claims through `slices` (see [`crate::BudgetSlices`]). Once; `false` when set
    /// already or when there is no team budget.
    pub fn set_budget_slices(
        &self,
        slices: Arc<dyn crate::BudgetSlices>,
        held_tokens: u64,
        held_cost: f64,
    ) -> bool {
        self.shared
            .safety
            .team
            .set_slices(slices, held_tokens, held_cost)
    }

    /// With budget slices: the tokens this team holds of the shared token budget (`None`
    /// without).
    pub fn budget_held(&self) -> Option<u64> {
        self.shared.safety.team.held()
    }

    /// With budget slices: the cost this team holds of the shared cost budget (`None` without).
    pub fn budget_held_cost(&self) -> Option<f64> {
        self.shared.safety.team.held_cost()
    }

    /// The team's model gate: closed, no model call starts (see [`crate::safety::ModelGate`]).
    pub fn model_gate(&self) -> &crate::safety::ModelGate {
        &self.shared.safety.model_gate
    }

    /// How many task runs the limit checkpoint keeps extension counts for (at most one per agent).
    pub fn limit_runs_tracked(&self) -> usize {
        self.shared.safety.checkpoint.runs_tracked()
    }

    /// The SafetyMonitor's report: fleet view, trips by breaker, recent trips. `None` when the
    /// monitor is not running (no monitor, or its actor stopped).
    ///
    /// # Cancel safety
    /// Cancel safe: a read; dropping the future loses only the report.
    pub async fn safety_report(&self) -> Option<SafetyReport> {
        let monitor = self.shared.safety.monitor.clone()?;
        monitor.send(GetSafetyReport).await.ok()
    }

    /// The configuration the team was built with.
    pub fn config(&self) -> &WardenConfig {
        &self.shared.config
    }

    /// Spawns an agent and starts its actor. Returns at once (the actor starts on its arbiter; see
    /// [`Supervisor::started`]); work sent meanwhile waits in its mailbox. A fresh agent journals
    /// `Spawned`; a restored one ([`AgentSpec::restored_from`]) gets its pending events queued
    /// again first.
    ///
    /// # Errors
    /// [`SpawnError::DuplicateKey`] when an agent with that key exists;
    /// [`SpawnError::RecordMismatch`] when the restored record is another agent's. Nothing is
    /// journaled or started then.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptedProvider, SpawnError, Supervisor};
    /// # use warden_protocols::WardenConfig;
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let model = Arc::new(ScriptedProvider::new([]));
    /// team.spawn(AgentSpec::assistant("smith", model.clone())).unwrap();
    /// let again = team.spawn(AgentSpec::assistant("smith", model));
    /// assert!(matches!(again, Err(SpawnError::DuplicateKey(_))));
    /// assert_eq!(team.len(), 1);
    /// # });
    /// ```
    pub fn spawn(&self, spec: AgentSpec) -> Result<AgentHandle, SpawnError> {
        let config = &self.shared.config;
        let AgentSpec {
            key,
            role,
            parent,
            system_prompt,
            provider,
            tools,
            can_delegate,
            restored,
            npc,
            goals,
            memory,
            permissions,
            execution,
            start_lockout,
            start_halted,
        } = spec;
        if let Some(memory) = &memory {
            memory.validate().map_err(SpawnError::InvalidMemory)?;
        }
        if let Some(execution) = &execution {
            execution.validate().map_err(SpawnError::InvalidExecution)?;
        }
        if let Some(goals) = &goals {
            warden_protocols::check_goals(goals).map_err(SpawnError::InvalidGoals)?;
        }
        // The team's own tools this agent gets (registered by `profile`, only when no profile
        // made before fits).
        let memory_sleeps = memory
            .as_ref()
            .map_or(config.memory.long_term, |m| m.long_term)
            .then(|| {
                let npc_config = npc.as_deref().unwrap_or(&*self.shared.npc);
                npc_config.sleep.enabled && npc_config.tick.enabled
            });
        let built_ins = BuiltIns {
            goals: goals.is_some(),
            memory_sleeps,
            delegate: can_delegate,
        };
        let fresh = restored.is_none();
        if let Some(record) = restored.as_ref().filter(|r| r.key != key) {
            return Err(SpawnError::RecordMismatch {
                expected: key,
                found: record.key.clone(),
            });
        }
        let settings = match (npc, memory, permissions, execution) {
            (None, None, None, None) => self
                .shared
                .default_settings
                .get_or_init(|| Arc::new(self.settings(None, None, None, None)))
                .clone(),
            (npc, memory, permissions, execution) => {
                Arc::new(self.settings(npc.map(|n| *n), memory, permissions.map(|p| *p), execution))
            }
        };
        let npc = settings.npc.clone();
        let profile = self.profile(provider, tools, built_ins, system_prompt, settings);
        let arbiter = if self.shared.arbiters.is_empty() {
            // A passive agent's actor is started from any thread: on this one, by its handle.
            self.passivate_after()
                .and_then(|_| self.shared.home.clone())
        } else {
            let i = self.shared.next_arbiter.fetch_add(1, Ordering::Relaxed);
            Some(self.shared.arbiters[i % self.shared.arbiters.len()].clone())
        };
        let cell = Arc::new(AgentCell::new(CellParts {
            arbiter,
            key: key.clone(),
            record: restored,
            mailbox: PriorityMailbox::new(config.mailbox.ordinary_capacity.get()),
            profile,
        }));
        let entry = AgentEntry { cell: cell.clone() };
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::spawn_gap(&key);
        // The key is claimed before anything is journaled: of two spawns of one key, the loser
        // journals nothing (its `Spawned` would be replayed onto the winner's agent). The set-up
        // below runs holding the claim (the registry shard's lock: nothing in it looks an agent
        // up), and the agent is found by others only once it is set up.
        let claim = match self.shared.agents.entry(key.clone()) {
            dashmap::mapref::entry::Entry::Occupied(_) => {
                self.shared.safety.team.register_undone();
                return Err(SpawnError::DuplicateKey(key));
            }
            dashmap::mapref::entry::Entry::Vacant(claim) => claim,
        };
        if fresh {
            cell.note(EventKind::Spawned {
                role,
                parent,
                max_consecutive_errors: config.safety.breakers.max_consecutive_errors.get(),
            });
            if let Some(goals) = goals.filter(|g| !g.is_empty()) {
                cell.note(EventKind::GoalsSet {
                    goals,
                    by: "team".into(),
                });
            }
        } else {
            // The events a previous process accepted and had not settled, before any new work.
            let requeued = cell.requeue_pending();
            if requeued > 0 {
                tracing::info!(agent = %cell.key, requeued, "pending events queued again");
            }
            // Perceptions a previous process kept for memory (journaled in their `perceived`)
            // and had not settled: the actor settles them first.
            if cell
                .lock()
                .memory()
                .is_some_and(|s| !s.unwritten.is_empty())
            {
                let _ = cell.remind();
            }
        }
        // A restored agent that a fleet halt stopped (its record says so) is noted with the
        // standing fleet halt again: a lift resumes it, as it would have before the restart.
        let restored_fleet_halted = !fresh && {
            let rec = cell.lock();
            rec.fleet_halted && rec.state == AgentState::Stopped
        };
        if let Some(lockout) = start_lockout {
            fleet_halt::lock_out_at_start(&cell, lockout);
        }
        // Noted with the fleet halt only when it is part of it (`Some(running)`).
        let start_halted = start_halted.and_then(|how| {
            let running = Self::runs(cell.state());
            let _ = cell.request_halt();
            match how {
                spec::StartHalted::Fleet => {
                    queue_halt(&cell, HaltCause::HaltAll, None);
                    Some(running)
                }
                spec::StartHalted::By(cause) => {
                    queue_halt(&cell, cause, None);
                    None
                }
            }
        });
        claim.insert(entry.clone());
        self.shared.order.lock().push(entry.clone());
        if npc.tick.enabled {
            let ticking = self.shared.ticks.register(&cell, npc);
            cell.set_ticking(Some(ticking));
            cell.restore_wake();
        }
        if let Some(running) = start_halted {
            self.note_fleet_halt(std::slice::from_ref(&cell), &[running]);
        }
        if restored_fleet_halted && cell.lock().lockout.is_none() {
            self.note_fleet_halt(std::slice::from_ref(&cell), &[true]);
        }
        start_actor(&entry, self.passivate_after());
        Ok(AgentHandle { cell })
    }

    /// The profile of an agent with this model, tools, prompt and settings: one built before
    /// that fits (shared: see [`Profile`]), or a new one. The last [`PROFILES_KEPT`] built are
    /// kept: agents spawned from one spec, in a row or interleaved with a few others, share one.
    fn profile(
        &self,
        provider: Arc<dyn Provider>,
        mut tools: ToolRegistry,
        built_ins: BuiltIns,
        system_prompt: Option<String>,
        settings: Arc<AgentSettings>,
    ) -> Arc<Profile> {
        let mut kept = self.shared.profiles.lock();
        // A spec with no tools of its own (most of a large fleet): found by which built-in tools
        // it gets, with no registry built to compare (an allocation and a free a spawn).
        let own = !tools.is_empty();
        let found = if own {
            self.add_built_ins(&mut tools, built_ins);
            kept.iter()
                .rposition(|p| p.fits(&provider, &tools, &system_prompt, &settings))
        } else {
            kept.iter().rposition(|p| {
                p.fits_built_ins(&provider, built_ins.bits(), &system_prompt, &settings)
            })
        };
        if let Some(i) = found {
            // The most recently used last (the one dropped when the list is full is the first).
            if i + 1 != kept.len() {
                let found = kept.remove(i);
                kept.push(found);
            }
            return kept[kept.len() - 1].clone();
        }
        if !own {
            self.add_built_ins(&mut tools, built_ins);
        }
        // Kept for as long as its agents: one allocation for the registry's entries, not the
        // doubling growth's spare room.
        tools.shrink_to_fit();
        let mut profile = Profile::new(
            provider,
            tools,
            system_prompt,
            settings,
            self.shared.safety.clone(),
            self.shared.journal.clone(),
            Some(self.shared.crash_tx.clone()),
            self.shared.replies.clone(),
        );
        profile.built_ins = (!own).then(|| built_ins.bits());
        let profile = Arc::new(profile);
        if kept.len() == PROFILES_KEPT {
            kept.remove(0);
        }
        kept.push(profile.clone());
        profile
    }

    /// Registers the team's built-in tools `built_ins` in `tools`: the goals tool, long-term
    /// memory's `remember`, `recall` and `forget` (and the sleep tools), `delegate`.
    fn add_built_ins(&self, tools: &mut ToolRegistry, built_ins: BuiltIns) {
        if built_ins.goals {
            let (spec, tool) = self.shared.goals_tool.get_or_init(|| {
                let tool = goals::GoalsTool {
                    supervisor: Arc::downgrade(&self.shared),
                };
                (Arc::new(tool.spec()), Arc::new(tool))
            });
            tools.register_with_spec(spec.clone(), tool.clone());
        }
        if let Some(sleeps) = built_ins.memory_sleeps {
            let built = self.shared.memory_tools[usize::from(sleeps)].get_or_init(|| {
                let shared = Arc::downgrade(&self.shared);
                let cell_of: crate::memory::tools::CellOf = Arc::new(move |key| {
                    shared
                        .upgrade()
                        .and_then(|s| s.agents.get(key).map(|e| e.cell.clone()))
                });
                crate::memory::tools::memory_tools(cell_of, sleeps)
                    .into_iter()
                    .map(|tool| {
                        let tool: Arc<dyn Tool> = Arc::new(tool);
                        (Arc::new(tool.spec()), tool)
                    })
                    .collect()
            });
            for (spec, tool) in built {
                tools.register_with_spec(spec.clone(), tool.clone());
            }
        }
        if built_ins.delegate {
            let (spec, tool) = self.shared.delegate_tool.get_or_init(|| {
                let tool = DelegateTool {
                    supervisor: Arc::downgrade(&self.shared),
                };
                let mut spec = tool.spec();
                if let Some(peers) = self.shared.a2a.get() {
                    delegation::describe_remote(&mut spec, &peers.describe());
                }
                (Arc::new(spec), Arc::new(tool))
            });
            tools.register_with_spec(spec.clone(), tool.clone());
        }
    }

    /// `supervisor.passivate_after_seconds`, if agents are passivated (see [`Activator`]).
    fn passivate_after(&self) -> Option<Duration> {
        self.shared.passivate_after
    }

    /// The per-agent settings taken from the config (`npc`, `memory`, `permissions` and
    /// `execution`: the spec's own, if any).
    fn settings(
        &self,
        npc: Option<warden_protocols::npc::NpcConfig>,
        memory: Option<warden_protocols::MemoryConfig>,
        permissions: Option<warden_protocols::PermissionPolicy>,
        execution: Option<warden_protocols::ExecutionConfig>,
    ) -> AgentSettings {
        let config = &self.shared.config;
        let execution = execution.as_ref().unwrap_or(&config.execution);
        AgentSettings {
            max_iterations_per_tick: execution.max_iterations_per_tick,
            multi_action: execution.multi_action_enabled,
            tool_timeout: Duration::from_secs_f64(config.tools.timeout_seconds),
            sub_agent_budget: config.delegation.sub_agent_budget,
            max_context_tokens: execution.max_context_tokens,
            context_strategy: match execution.context_strategy {
                ContextStrategyConfig::SlidingWindow => ContextStrategy::SlidingWindow,
                ContextStrategyConfig::Compact => ContextStrategy::Compact,
            },
            max_tokens_recoveries: execution.max_tokens_recoveries,
            // The game clock is the team's whatever an agent's own `[npc]` says (memory time
            // runs at its speed).
            npc: npc.map_or_else(
                || self.shared.npc.clone(),
                |mut npc| {
                    npc.clock = self.shared.npc.clock.clone();
                    Arc::new(npc)
                },
            ),
            memory: memory.unwrap_or(config.memory),
            permissions: Arc::new(
                permissions.unwrap_or_else(|| {
                    warden_protocols::PermissionPolicy::team(&config.permissions)
                }),
            ),
            circuit: CircuitConfig {
                failure_threshold: config.tools.circuit_failure_threshold.get(),
                cool_down: Duration::from_secs_f64(config.tools.circuit_cool_down_seconds),
            },
            tool_retry: config.tools.retry,
            passivate_after: self.passivate_after().unwrap_or_default(),
        }
    }

    /// The agent with that key; `None` if there is none.
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

    /// How many agents were spawned (a halted or shut-down agent still counts).
    pub fn len(&self) -> usize {
        self.shared.agents.len()
    }

    /// Whether no agent was spawned.
    pub fn is_empty(&self) -> bool {
        self.shared.agents.is_empty()
    }

    /// Resolves once every agent's actor has started (`spawn` returns before its actor runs: the
    /// actor starts on its arbiter). For measurements that must include the actors' own cost. Returns
    /// at once after [`Supervisor::shutdown`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches.
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

    /// The host reports that `players` players are in `room` now. An NPC in a room reported empty
    /// is `idle` (`npc.tick.idle_rate`, 0: no ticks) until a player is reported there again; a
    /// room never reported counts as occupied. An NPC's room is `npc.tick.room`, or else the room
    /// of the last world event it perceived that named one.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{AgentSpec, MemoryJournal, ScriptedProvider, Supervisor};
    /// # use warden_protocols::{npc::{NpcConfig, NpcMode}, WardenConfig};
    /// # actix_rt::System::new().block_on(async {
    /// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
    /// let mut npc = NpcConfig::default();
    /// npc.tick.enabled = true;
    /// npc.tick.room = Some("forge".into());
    /// let smith = AgentSpec::assistant("smith", Arc::new(ScriptedProvider::new([]))).with_npc(npc);
    /// let smith = team.spawn(smith).unwrap();
    /// team.set_presence("forge", 0);
    /// assert_eq!(smith.status().npc.unwrap().tick.unwrap().mode, NpcMode::Idle);
    /// team.set_presence("forge", 2);
    /// assert_eq!(smith.status().npc.unwrap().tick.unwrap().mode, NpcMode::Awake);
    /// # });
    /// ```
    pub fn set_presence(&self, room: &str, players: usize) {
        self.shared.ticks.set_presence(room, players);
    }

    /// Sets the team's game clock to `hour` (0 to 24; fractions are minutes) now; it runs on at
    /// `npc.clock.speed`. Every ticking NPC's sleep schedule is read again at once.
    pub fn set_game_hour(&self, hour: f64) {
        self.shared.ticks.set_game_hour(hour);
    }

    /// The team's game hour now (0 to 24).
    pub fn game_hour(&self) -> f64 {
        self.shared.ticks.game_hour()
    }

    /// How many NPCs the team's tick arbiter schedules, and on how many timer tasks (one).
    pub fn tick_report(&self) -> TickReport {
        self.shared.ticks.report()
    }

    /// Starts, changes or stops `key`'s autonomous ticks: its `npc.tick` and `npc.sleep` become
    /// `npc`'s (`npc.tick.enabled = false` stops them; a tick already queued stays queued). Its
    /// classification settings are not changed.
    ///
    /// # Errors
    /// [`TickConfigError::UnknownAgent`]; [`TickConfigError::Invalid`] (nothing changed) when
    /// `npc` is out of range ([`warden_protocols::npc::NpcConfig::validate`]).
    pub fn set_ticks(
        &self,
        key: &str,
        npc: warden_protocols::npc::NpcConfig,
    ) -> Result<(), TickConfigError> {
        let handle = self
            .get(key)
            .ok_or_else(|| TickConfigError::UnknownAgent(UnknownAgent(key.into())))?;
        npc.validate().map_err(TickConfigError::Invalid)?;
        let cell = &handle.cell;
        let npc = Arc::new(npc);
        match (cell.ticking(), npc.tick.enabled) {
            (Some(ticking), true) => ticking.reconfigure(npc),
            (Some(ticking), false) => {
                self.shared.ticks.unregister(&ticking);
                cell.set_ticking(None);
            }
            (None, true) => {
                let ticking = self.shared.ticks.register(cell, npc);
                cell.set_ticking(Some(ticking));
            }
            (None, false) => {}
        }
        Ok(())
    }

    /// Status of every agent, in spawn order.
    pub fn statuses(&self) -> Vec<AgentStatus> {
        self.agents().iter().map(AgentHandle::status).collect()
    }

    /// Halts `key` and every delegate it is running (transitively). Resolves when all of them have
    /// acknowledged `STOPPED`; the first ack is `key`'s. Each halt goes through the `SystemHalt`
    /// lane (priority 0); see [`AgentHandle::halt`] for what a halt does.
    ///
    /// # Errors
    /// [`UnknownAgent`] when no agent has that key (nothing is halted).
    ///
    /// # Cancel safety
    /// Cancel safe: every halt of the subtree is raised and queued before the first await;
    /// dropping the future loses only the acknowledgements.
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
    ///
    /// # Cancel safety
    /// Cancel safe: every halt is raised and queued when the future is first polled; dropping it
    /// afterwards loses only the acknowledgements (the agents still stop).
    pub async fn halt_all(&self) -> Vec<HaltAck> {
        self.halt_all_with(HaltCause::HaltAll).await
    }

    /// [`Supervisor::halt_all`], journaling `cause` as every agent's halt cause (an embedding
    /// host's reason: [`HaltCause::Host`]).
    ///
    /// # Cancel safety
    /// As [`Supervisor::halt_all`].
    pub async fn halt_all_with(&self, cause: HaltCause) -> Vec<HaltAck> {
        let cells = self.cells();
        // Every flag first, in one pass (each pass over a million scattered cells is tens of
        // milliseconds of cache misses): each agent is halted with this cause, its delegates
        // included (they are agents of the team), so nothing needs passing down a tree; and which
        // agents this halt stops (the others were stopped already: a lift resumes those).
        let mut stopped = Vec::with_capacity(cells.len());
        for cell in &cells {
            let running = Self::runs(cell.state());
            let _ = cell.request_halt();
            if running {
                stopped.push(Self::noted(cell));
            }
        }
        self.note_stopped(stopped);
        let (to, mut acks_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut acks: Vec<Option<HaltAck>> = Vec::new();
        acks.resize_with(cells.len(), || None);
        // Halts applied whose durability is still to be awaited (here, not on the agents'
        // arbiters: see `SentAck`).
        let mut unsettled = Vec::new();
        let batches = queue_halts(&cells, &cause, &to, &mut acks);
        drop(to);
        // Ends when every request was answered or dropped (an actor that died with it queued).
        while let Some((slot, sent)) = acks_rx.recv().await {
            unsettled.push((slot, sent));
        }
        // One after the other: they wait for the same commits, so after the first most are ready.
        for (slot, sent) in unsettled {
            let ack = sent.settle().await;
            if let Some(place) = acks.get_mut(slot) {
                *place = Some(ack);
            }
        }
        for Unsettled { slots, durable } in batches {
            let not_durable = durable.await.err();
            for slot in slots {
                if let Some(Some(ack)) = acks.get_mut(slot) {
                    ack.not_durable.clone_from(&not_durable);
                }
            }
        }
        acks.into_iter()
            .zip(cells)
            .map(|(ack, cell)| ack.unwrap_or_else(|| cell.halt_ack_now()))
            .collect()
    }

    /// Stops every actor deliberately (no restarts), then the arbiter threads the supervisor started.
    /// Queued work stays in the records' mailboxes; queued user events also stay pending in the
    /// journal, and come back when the team is restored from it. Whoever awaits a reply is told
    /// [`crate::AskError::AgentGone`]; later sends are refused as `Closed`.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future part-way may leave some actors running and their
    /// mailboxes open (the shutdown flag is set at once, so crashed actors are not restarted).
    pub async fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        // No tick is queued from now on (the timer task ends).
        self.shared.ticks.close();
        // Whoever waits for a reply is told the agent is gone (the events stay pending).
        for e in self.shared.agents.iter() {
            if let Some(waiters) = e.cell.waiters_now() {
                waiters.clear();
            }
        }
        let addrs: Vec<_> = self
            .shared
            .agents
            .iter()
            .filter_map(|e| e.cell.mailbox.waker::<Addr<AgentActor>>())
            .collect();
        // A bounded number in flight (see `IN_FLIGHT`).
        futures::stream::iter(addrs.iter().map(|a| a.send(Shutdown)))
            .buffer_unordered(IN_FLIGHT)
            .for_each(|_| async {})
            .await;
        for e in self.shared.agents.iter() {
            e.cell.mailbox.close();
        }
        // The arbiter threads this supervisor started end with it (the actix System keeps a handle
        // to every arbiter, so they would otherwise idle until the System stops).
        for arbiter in &self.shared.arbiters {
            arbiter.stop();
        }
    }
}

/// Halts every agent of `cells` with `cause`: a passive one, or an active one whose actor is idle
/// (its reader borrowed), here, a batch at a time ([`HaltBatch`]: one journal append and one
/// durability wait per batch), its ack put in `acks` (the waits for the batches' durability
/// returned); one whose turn runs by a message, its ack to come on `to`.
/// Synchronous, so that no record lock a batch holds is ever held across an await.
fn queue_halts(
    cells: &[Arc<AgentCell>],
    cause: &HaltCause,
    to: &tokio::sync::mpsc::UnboundedSender<(usize, SentAck)>,
    acks: &mut [Option<HaltAck>],
) -> Vec<Unsettled> {
    let mut batch = HaltBatch::new(cause, cells.len());
    for (slot, cell) in cells.iter().enumerate() {
        queue_halt_gathered(cell, cause, slot, to, &mut batch, acks);
    }
    batch.finish(acks)
}

/// Requests to the fleet's actors in flight at once (a shutdown, a fleet lift, the acks of a
/// halt): `join_all` over a million futures is quadratic (once tokio's cooperative budget is
/// spent, each poll of the set wakes every pending future again; 200,000 idle agents took 19 s to
/// shut down, a million minutes).
const IN_FLIGHT: usize = 1024;

/// Waits for every ack; an agent whose actor is gone reports its record's state.
async fn collect_acks(
    receivers: Vec<(Arc<AgentCell>, oneshot::Receiver<SentAck>)>,
) -> Vec<HaltAck> {
    futures::stream::iter(receivers.into_iter().map(|(cell, rx)| async move {
        match rx.await {
            Ok(sent) => sent.settle().await,
            Err(_) => cell.halt_ack_now(),
        }
    }))
    .buffered(IN_FLIGHT)
    .collect()
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{journal::NullJournal, provider::ScriptedProvider};

    /// Agents of one spec share one profile (the memory of an idle fleet depends on it); another
    /// prompt, model or tool list gets its own, and a profile is found again among the last few.
    #[test]
    fn agents_of_one_spec_share_a_profile_and_others_do_not() {
        actix_rt::System::new().block_on(async {
            let team = Supervisor::on_current_arbiter(
                WardenConfig::default(),
                Arc::new(NullJournal::default()),
            );
            let model: Arc<dyn Provider> = Arc::new(ScriptedProvider::new([]));
            let other: Arc<dyn Provider> = Arc::new(ScriptedProvider::new([]));
            let spawn = |spec: AgentSpec| team.spawn(spec).expect("spawn").cell.profile().clone();
            let a = spawn(AgentSpec::assistant("a", model.clone()));
            let b = spawn(AgentSpec::assistant("b", model.clone()));
            let prompted =
                spawn(AgentSpec::assistant("c", model.clone()).with_system_prompt("You are c."));
            let same_prompt =
                spawn(AgentSpec::assistant("d", model.clone()).with_system_prompt("You are c."));
            let other_model = spawn(AgentSpec::assistant("e", other));
            let no_delegate = spawn(AgentSpec::assistant("f", model.clone()).without_delegation());
            let again = spawn(AgentSpec::assistant("g", model.clone()));
            let goals =
                |k: &str| AgentSpec::assistant(k, model.clone()).with_goals(vec!["x".into()]);
            let (with_goals, also_goals) = (spawn(goals("h")), spawn(goals("i")));
            assert!(Arc::ptr_eq(&with_goals, &also_goals) && !Arc::ptr_eq(&a, &with_goals));
            assert_eq!(
                with_goals.tools.names().collect::<Vec<_>>(),
                ["delegate", "set_goals"]
            );
            // The most recently used stays found after another was used.
            assert!(Arc::ptr_eq(
                &a,
                &spawn(AgentSpec::assistant("j", model.clone()))
            ));
            assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&a, &again));
            assert!(Arc::ptr_eq(&prompted, &same_prompt));
            for distinct in [&prompted, &other_model, &no_delegate] {
                assert!(!Arc::ptr_eq(&a, distinct));
            }
            assert!(!Arc::ptr_eq(&prompted, &other_model));
            assert_eq!(no_delegate.tools.len(), 0);
            assert_eq!(a.tools.names().collect::<Vec<_>>(), ["delegate"]);
        });
    }
}
