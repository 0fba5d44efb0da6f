//! `warden loadtest`: spawns a fleet of agents as delegation trees, drives it with the scripted model
//! (jittered latency, injected failures and panics, all from a seeded RNG) and reports throughput,
//! delegation outcomes, halt latency, memory and the harness's own accounting.
//!
//! # Fleet shape
//! `agents` agents in trees of fanout `fanout` and depth `depth` (a tree has
//! `1 + F + F² + … + F^D` agents; the last tree is cut short so the fleet has exactly `agents`).
//! Agent keys are `a{root}` for roots and `a{root}.{i}.{j}…` below them, so a key's depth is its number
//! of dots. Every root receives `tasks_per_agent` tasks; an inner agent delegates each task to all of
//! its children at once, a leaf calls its `work` tool and answers — so without refusals every agent
//! runs `tasks_per_agent` turns.
//!
//! # Scenarios
//! * `idle` — spawn, measure spawn time and memory, halt all. No tasks.
//! * `steady` — the fleet runs every task to its end, then is halted.
//! * `cascade` — as `steady`, but the leaves fail (model and tool) at `max(fail_rate, 0.8)`: their
//!   breakers trip, they are locked out and their parents' delegations to them are refused. The table
//!   shows lockouts by depth (how far the failure spread).
//! * `halt-storm` — as `steady`, but every agent is halted while the fleet is at work.
//!
//! # On cluster nodes
//! [`cluster`]: `warden loadtest --cluster nats://HOST:PORT --nodes N` runs the same scenarios on N
//! cluster nodes in this process (depth `d` on node `d mod N`, so every delegation crosses nodes
//! through NATS), with per-node and cluster figures and the same accounting across nodes.
//!
//! # Your own team
//! [`workload`]: `warden loadtest --config team.toml` spawns a team file's agents with its providers
//! and configuration and sends the events its `[workload]` section describes; the report is the
//! same (scenario `team`), with the same accounting. [`compare`] compares reports (`--repeat`,
//! `warden loadtest compare`); [`html`] writes one as a self-contained HTML page (`--report`).
//!
//! # The harness's own accounting
//! `lost_events` and `leaked_slots` are counted by the harness from the journal it hands to the
//! supervisor, independently of the supervisor's own counters: every task it sends and every
//! delegated task must end exactly once (a `TurnFinished`, a `WorkRefused`, a listing in
//! `MessagesDiscarded`, or a halt/crash of the turn that ran it); every `DelegationRequested` id must be
//! matched by exactly one `DelegationEnded` (ids are per supervisor: on cluster nodes, per node and
//! id); and every agent must end with `active_sub_agents == 0`.
//! The harness journal keeps counts, not events, so a million idle agents are not measured with a
//! million stored `Spawned` events.

use crate::{
    AgentSpec, ChatMessage, FnTool, HaltCause, Journal, LlmResponse, NullJournal, ScriptStats,
    ScriptStep, ScriptedProvider, Supervisor, ToolCategory, ToolError, UserEvent, WardenConfig,
};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    num::NonZeroUsize,
    sync::Arc,
    time::{Duration, Instant},
};
use warden_protocols::{
    AgentKey, AgentState, ChatRole, DelegationRefusal, EventKind, FinishReason, ToolCall,
    WorkRefusal,
};

pub mod cluster;
pub mod compare;
pub mod html;
pub mod outcomes;
mod report;
pub mod soak;
pub mod thresholds;
pub mod workload;

pub use report::{write_repeat, write_report};

/// `warden loadtest`'s exit code when an invariant is violated (`lost_events`, `leaked_slots` or
/// `halt.processed_after_halt` not 0). Not 2: that is a usage error, as for every command.
pub const EXIT_INVARIANT_VIOLATED: u8 = 11;
/// `warden loadtest`'s exit code when `--timeout-s` cut the drive phase short (and no invariant was
/// violated).
pub const EXIT_TIMED_OUT: u8 = 12;

/// `warden loadtest`'s exit code when SIGINT or SIGTERM stopped the run (the report of what was
/// done is printed, marked `interrupted`). An invariant violation (11) wins over it; it wins over
/// a timeout (12).
pub const EXIT_INTERRUPTED: u8 = 14;

/// How long an interrupted run waits for the events in flight to settle before it is cut
/// (at most `--timeout-s`).
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// A request to stop a run early (SIGINT, SIGTERM): the run stops sending, waits for the events
/// in flight (at most [`INTERRUPT_GRACE`]), halts the fleet and reports what was done, with
/// [`LoadReport::interrupted`] set. Shared between the run and whoever catches the signal.
#[derive(Debug, Default)]
pub struct Interrupt {
    signal: std::sync::OnceLock<String>,
    notify: tokio::sync::Notify,
}

impl Interrupt {
    /// Asks the run to stop, naming why (`SIGINT`, `SIGTERM`). `true` the first time; `false`
    /// when it was asked already (the reason stays the first one).
    pub fn raise(&self, signal: &str) -> bool {
        let first = self.signal.set(signal.to_owned()).is_ok();
        self.notify.notify_waiters();
        first
    }

    /// Why the run was asked to stop, if it was.
    pub fn raised(&self) -> Option<&str> {
        self.signal.get().map(String::as_str)
    }

    /// Resolves once the run is asked to stop (at once if it was already).
    pub async fn wait(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.raised().is_some() {
            return;
        }
        notified.await;
    }

    /// `deadline`, or sooner if the run was asked to stop: [`INTERRUPT_GRACE`] from now.
    fn cut(&self, deadline: Instant) -> Instant {
        match self.raised() {
            Some(_) => deadline.min(Instant::now() + INTERRUPT_GRACE),
            None => deadline,
        }
    }
}

/// Marker in the message of every injected panic (the CLI's panic hook keeps them quiet).
pub const INJECTED_PANIC: &str = "loadtest: injected panic";

/// A preset (see the module docs for what each one does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Spawn, measure spawn time and memory, halt all; no tasks.
    Idle,
    /// Every task runs to its end, then the fleet is halted.
    Steady,
    /// As `Steady`, but the leaves fail at `max(fail_rate, 0.8)` and are locked out.
    Cascade,
    /// As `Steady`, but every agent is halted while the fleet is at work.
    HaltStorm,
}

impl Scenario {
    /// The name on the command line and in the report: `idle`, `steady`, `cascade`, `halt-storm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Idle => "idle",
            Scenario::Steady => "steady",
            Scenario::Cascade => "cascade",
            Scenario::HaltStorm => "halt-storm",
        }
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadtestOptions {
    /// The preset to run.
    pub scenario: Scenario,
    /// Agents in the fleet (roots × tree, the last tree cut short).
    pub agents: usize,
    /// Children per inner agent of a tree. Default 3.
    pub fanout: usize,
    /// Levels below a root (0: every agent is a root). Default 2.
    pub depth: usize,
    /// Tasks sent to every root (each cascades down its tree).
    pub tasks_per_agent: usize,
    /// Probability that a model call or a tool call fails.
    pub fail_rate: f64,
    /// Probability that a tool call panics.
    pub panic_rate: f64,
    /// Mean simulated model latency; each call waits `mean × U(0.5, 1.5)`. 0 = no wait.
    pub llm_latency_ms: f64,
    /// Seed of every random draw (latency, failures, panics): the same seed gives the same run.
    /// Default 1.
    pub seed: u64,
    /// Halt probe: ordinary messages queued on a paused agent before it is halted.
    pub backlog: usize,
    /// Halt probes to run (latency percentiles are over these).
    pub halt_probes: usize,
    /// `false` turns the SafetyMonitor's checks off (`--no-safety`).
    pub safety: bool,
    /// The fleet's `supervisor.passivate_after_seconds` (`--passivate-after-s`; 0: an actor per
    /// agent from its spawn on). Default: the configuration's default.
    pub passivate_after_s: f64,
    /// Give up waiting for the fleet after this long (what is still open is reported as lost).
    pub timeout: Duration,
    /// Draw a progress bar on stderr (the CLI sets it when stderr is a terminal).
    pub progress: bool,
    /// Raised to stop the run early (the CLI raises it on SIGINT and SIGTERM).
    pub interrupt: Arc<Interrupt>,
    /// Arbiter threads the fleet's agents are spread over (`supervisor.arbiters`), the driver
    /// staying on the calling thread; `0` (the default): every agent on the calling thread, so a
    /// figure is one core's.
    pub threads: usize,
}

impl LoadtestOptions {
    /// The defaults of `warden loadtest` for `scenario`: 100 agents, fanout 3, depth 2, 5 tasks
    /// per root, no failures, panics or latency, seed 1, a backlog of 1000, 11 halt probes,
    /// safety checks on, a 300 s timeout, no progress bar.
    pub fn new(scenario: Scenario) -> Self {
        LoadtestOptions {
            scenario,
            agents: 100,
            fanout: 3,
            depth: 2,
            tasks_per_agent: 5,
            fail_rate: 0.0,
            panic_rate: 0.0,
            llm_latency_ms: 0.0,
            seed: 1,
            backlog: 1_000,
            halt_probes: 11,
            safety: true,
            passivate_after_s: WardenConfig::default().supervisor.passivate_after_seconds,
            timeout: Duration::from_secs(300),
            progress: false,
            interrupt: Arc::default(),
            threads: 0,
        }
    }
}

/// Delegations, counted from the journal. `requested` is every attempt:
/// `requested == accepted + refused_budget + refused_hops + refused_locked + refused_cycle`
/// (+ [`LoadReport::refused_other`], which is not part of the JSON contract and 0 in every scenario).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegationCounts {
    /// Delegations attempted.
    pub requested: u64,
    /// Delegations whose task was queued on the delegate.
    pub accepted: u64,
    /// Refused by the sub-agent budget (`delegation.sub_agent_budget`).
    pub refused_budget: u64,
    /// Refused by the hop limit (`safety.loop.max_agent_hops`).
    pub refused_hops: u64,
    /// The delegate was locked out or stopped (or the delegator itself was not running).
    pub refused_locked: u64,
    /// Refused because the delegate is already in the task's lineage.
    pub refused_cycle: u64,
}

/// The halt probe's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HaltProbe {
    /// Ordinary messages queued on the paused probe agent before each halt.
    pub backlog: u64,
    /// Median halt latency in µs: the halt call to its acknowledgement, the agent on an arbiter
    /// thread of its own.
    pub latency_us_p50: u64,
    /// 99th percentile of the same, in µs.
    pub latency_us_p99: u64,
    /// Slowest halt, in µs (0 without probes).
    pub latency_us_max: u64,
    /// Turns run after a halt was asked for, plus halts not acknowledged as `STOPPED`, over all
    /// probes: must be 0 (a halt comes before any queued work).
    pub processed_after_halt: u64,
}

/// Per-event latency: from a root's acceptance of a task to its answer (the reply correlated to
/// the event's id), over the tasks that were answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventLatency {
    /// Tasks answered (the others failed, were refused or were discarded).
    pub answered: u64,
    /// Median, in ms.
    pub p50_ms: f64,
    /// 90th percentile, in ms.
    pub p90_ms: f64,
    /// 99th percentile, in ms.
    pub p99_ms: f64,
    /// Slowest, in ms (0 when none was answered).
    pub max_ms: f64,
}

impl EventLatency {
    fn of(mut micros: Vec<u64>) -> Self {
        micros.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        EventLatency {
            answered: micros.len() as u64,
            p50_ms: ms(percentile(&micros, 0.50)),
            p90_ms: ms(percentile(&micros, 0.90)),
            p99_ms: ms(percentile(&micros, 0.99)),
            max_ms: ms(micros.last().copied().unwrap_or(0)),
        }
    }
}

/// `halt_all` of the whole fleet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HaltAll {
    /// Agents acknowledged.
    pub agents: u64,
    /// From the call to the last acknowledgement, in ms.
    pub ms: f64,
}

/// Memory of the process, as Linux reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Peak resident set (`VmHWM` of `/proc/self/status`); 0 where unavailable.
    pub rss_peak_bytes: u64,
    /// Resident-set growth over spawning the fleet, divided by the fleet's size.
    pub bytes_per_agent: u64,
}

/// The report. Its JSON form is a stable contract (docs/loadtest.md); it reads back from that
/// form (`--repeat` runs each repeat in a process of its own and reads its JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// [`Scenario::as_str`] of the scenario run.
    pub scenario: String,
    /// [`LoadtestOptions::seed`].
    pub seed: u64,
    /// [`LoadtestOptions::threads`]: arbiter threads of the fleet, 0 for the calling thread. Absent
    /// from reports written before it existed (read as 0).
    #[serde(default)]
    pub threads: u64,
    /// Agents spawned.
    pub agents: u64,
    /// Wall time of the drive phase (first task sent → every task ended or halted).
    pub duration_s: f64,
    /// Spawning the fleet until every actor has started, divided by the fleet's size, in ns.
    pub spawn_ns_per_agent: u64,
    /// Model calls made by the fleet.
    pub steps: u64,
    /// `steps / duration_s` (0 when the drive phase took no time).
    pub steps_per_sec: f64,
    /// Tool calls started (delegations not included).
    pub tool_calls: u64,
    /// Delegations, counted from the journal.
    pub delegations: DelegationCounts,
    /// Agents locked out by a breaker (`LockedOut` events).
    pub lockouts: u64,
    /// Agents STOPPED (by a breaker) before the final halt.
    pub stopped: u64,
    /// Actor restarts after crashes (injected panics), summed over the agents.
    pub restarts: u64,
    /// The halt probe, run on a quiet system after the fleet is gone.
    pub halt: HaltProbe,
    /// The final `halt_all` of the fleet.
    pub halt_all: HaltAll,
    /// Accepted → answered, per root task.
    pub event_latency: EventLatency,
    /// Peak memory and memory per agent.
    pub memory: Memory,
    /// Work items that did not end exactly once, by the harness's own count (see the module
    /// docs): must be 0.
    pub lost_events: u64,
    /// Delegation slots still held at the end, plus delegation ids not ended exactly once: must
    /// be 0.
    pub leaked_slots: u64,
    /// The drive phase was cut by the timeout (`--timeout-s`) before every task ended (for
    /// `halt-storm`: before the storm's halt was due). The run's figures cover only what was done.
    pub timed_out: bool,
    /// Work items (tasks sent to roots and delegated tasks) still open when the timeout cut the drive
    /// phase; 0 unless `timed_out`.
    pub unfinished_tasks: u64,
    /// Lockouts by depth (index = depth: the number of dots of a synthetic key, the agent's depth
    /// in its delegation tree for a team file; roots are 0).
    pub lockouts_by_depth: Vec<u64>,
    /// Delegation refusals (every kind, `refused_other` included) by the delegate's depth:
    /// they add up to `delegations.requested - delegations.accepted`.
    pub refusals_by_depth: Vec<u64>,
    /// Retries of OpenAI-compatible model calls made during the run, by status class
    /// (`408`, `429`, `5xx`, `timeout`, `connect`, `other`; every class listed). All 0 with
    /// scripted models.
    pub retries: BTreeMap<String, u64>,
    /// Tasks the harness sent to roots (for a team file: the workload's events).
    pub tasks_sent: u64,
    /// Of [`LoadReport::tasks_sent`], those refused at once (a locked-out or stopped root, a
    /// full mailbox).
    pub tasks_refused: u64,
    /// One [`Sample`] per second of the drive phase (the last one covers what was left).
    pub series: Vec<Sample>,
    /// RSS growth after the warm-up, for runs long enough ([`soak`]; `None` for shorter ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<soak::Soak>,
    /// The workload of a team-file run (`--config`); `None` for the scenarios.
    pub workload: Option<workload::WorkloadSummary>,
    /// A cluster run's nodes, each one's figures (`warden loadtest --cluster`; not in the JSON of
    /// a run on one node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<cluster::NodeFigures>,
    /// A cluster run's cluster-wide figures (not in the JSON of a run on one node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<cluster::ClusterFigures>,
    /// Every event the harness sent, by fate (answered, failed, refused, discarded, gone, timed
    /// out) and reason, with a sample of each reason ([`outcomes`]). Added by issue 34.
    #[serde(default)]
    pub outcomes: outcomes::Outcomes,
    /// Every finished turn (user events and delegated tasks) by termination reason, per depth
    /// (index 0 = roots). Added by issue 34.
    #[serde(default)]
    pub turns_by_depth: Vec<outcomes::TurnReasons>,
    /// A team file's run: every agent's finished turns by termination reason, with its depth and
    /// role (empty for the scenarios). Added by issue 34.
    #[serde(default)]
    pub turns_by_agent: BTreeMap<String, outcomes::AgentTurns>,
    /// The agents STOPPED before the final halt, with their depth and cause (at most 100; the
    /// count of all is `stopped`). Added by issue 34.
    #[serde(default)]
    pub stopped_agents: Vec<outcomes::StoppedAgent>,
    /// A workload with `unlock_after_seconds`: every lockout, when the harness unlocked the agent
    /// and when it answered again ([`outcomes::Recovery`]); empty otherwise. Added by issue 34.
    #[serde(default)]
    pub recoveries: Vec<outcomes::Recovery>,
    /// The thresholds (`--threshold`, `[workload] thresholds`) and their verdicts on this run
    /// ([`thresholds`]); empty without any. Added by issue 34.
    #[serde(default)]
    pub thresholds: Vec<thresholds::Verdict>,
    /// `SIGINT` or `SIGTERM` when a signal stopped the run early (its figures cover what was done);
    /// `null` otherwise. Added by issue 34.
    #[serde(default)]
    pub interrupted: Option<String>,
    /// Not in the JSON contract: delegation refusals of other kinds (unknown delegate, full mailbox).
    #[serde(skip)]
    pub refused_other: u64,
    /// Not in the JSON: every answered event's latency (accepted → answered) in µs, sorted (for
    /// the HTML report's histogram).
    #[serde(skip)]
    pub event_latencies_us: Vec<u64>,
}

/// One point of [`LoadReport::series`]: the counts are over the interval that ends at `t_s`, the
/// gauges are read at `t_s`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// End of the interval, in seconds since the drive phase started.
    pub t_s: f64,
    /// Tasks (events) accepted by their agents in the interval.
    pub events_accepted: u64,
    /// Turns finished in the interval.
    pub turns: u64,
    /// Model calls made in the interval.
    pub llm_calls: u64,
    /// Agents locked out in the interval.
    pub lockouts: u64,
    /// Events answered in the interval (as the harness saw their answers).
    pub answered: u64,
    /// Median accepted → answered latency of those, in ms (0 when none).
    pub latency_p50_ms: f64,
    /// 99th percentile of the same, in ms.
    pub latency_p99_ms: f64,
    /// 90th percentile of the same, in ms (added by issue 34).
    #[serde(default)]
    pub latency_p90_ms: f64,
    /// 95th percentile of the same, in ms (added by issue 34).
    #[serde(default)]
    pub latency_p95_ms: f64,
    /// The harness's events that failed in the interval (added by issue 34).
    #[serde(default)]
    pub failed: u64,
    /// The harness's events refused in the interval, at once or later (added by issue 34).
    #[serde(default)]
    pub refused: u64,
    /// The harness's events discarded by a halt or left to the final halt in the interval
    /// (added by issue 34).
    #[serde(default)]
    pub discarded: u64,
    /// Agents in each state at `t_s`, by state name (`EXECUTING`, …; states with no agent
    /// left out).
    pub agents_by_state: BTreeMap<String, u64>,
    /// Resident set at `t_s` (`VmRSS`; 0 where unavailable).
    pub rss_bytes: u64,
    /// Memory the allocator has committed at `t_s` (the `warden` binary: mimalloc's
    /// `current_commit`; 0 where the allocator does not say). Unlike RSS it drops when the
    /// allocator frees, even before freed pages are purged. Added by issue 34.
    #[serde(default)]
    pub committed_bytes: u64,
}

/// How the samples read the allocator's committed memory ([`set_committed_probe`]).
static COMMITTED_PROBE: std::sync::OnceLock<fn() -> u64> = std::sync::OnceLock::new();

/// Tells the samples how to read the global allocator's committed memory (the `warden` binary
/// sets mimalloc's); without it [`Sample::committed_bytes`] is 0. Only the first call counts.
pub fn set_committed_probe(probe: fn() -> u64) {
    let _ = COMMITTED_PROBE.set(probe);
}

// ---- the harness journal ------------------------------------------------------------------------

#[derive(Default)]
struct Tally {
    /// Per agent: work items accepted minus work items ended.
    balance: HashMap<AgentKey, i64>,
    /// Agents running a work item (entered EXECUTING from WAITING_FOR_EVENT, not yet ended).
    in_progress: HashSet<AgentKey>,
    /// Sum of `balance`.
    outstanding: i64,
    /// Per delegation (node, id): requested (+1) minus ended (−1). Ids are unique per supervisor,
    /// so a cluster run keys them by node too (a single node is node 0).
    open: HashMap<(usize, u64), i64>,
    delegations: DelegationCounts,
    refused_other: u64,
    tool_calls: u64,
    turns: u64,
    lockouts: u64,
    lockouts_by_depth: Vec<u64>,
    /// Delegation refusals, by the delegate's depth.
    refusals_by_depth: Vec<u64>,
    /// Tasks the harness sent that were accepted.
    events_accepted: u64,
    /// Agents' depths in their delegation trees (team files); empty: a key's number of dots.
    depths: HashMap<AgentKey, usize>,
    /// Agents' roles (team files: `turns_by_agent` is kept for these); empty for the scenarios.
    roles: HashMap<AgentKey, String>,
    /// Finished turns by termination reason, per depth.
    turns_by_depth: Vec<outcomes::TurnReasons>,
    /// Finished turns by termination reason, per agent (team files only).
    turns_by_agent: BTreeMap<String, outcomes::AgentTurns>,
    /// Every lockout, for a workload that unlocks (`unlock_after_seconds`); `None`: not kept.
    recoveries: Option<Vec<Recovering>>,
    /// Agents in each state, by [`AgentState::ALL`] index: from `Spawned` (an agent starts
    /// `WAITING_FOR_EVENT`) and every `StateChanged` (no status scan of the fleet).
    states: [i64; AgentState::ALL.len()],
    /// A cluster run's per-node counts (`None` on one node).
    cluster: Option<cluster::ClusterTally>,
}

/// One lockout of a workload that unlocks: when it came, when the harness unlocked the agent,
/// when the agent finished a turn with an answer again.
#[derive(Debug, Clone)]
struct Recovering {
    agent: AgentKey,
    locked: Instant,
    unlocked: Option<Instant>,
    recovered: Option<Instant>,
}

/// `state`'s index in [`AgentState::ALL`].
fn state_index(state: AgentState) -> usize {
    AgentState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or_default()
}

/// Adds one at `depth`, growing `by_depth` as needed.
fn bump(by_depth: &mut Vec<u64>, depth: usize) {
    if by_depth.len() <= depth {
        by_depth.resize(depth + 1, 0);
    }
    by_depth[depth] += 1;
}

impl Tally {
    fn depth(&self, agent: &AgentKey) -> usize {
        self.depths
            .get(agent)
            .copied()
            .unwrap_or_else(|| depth_of(agent.as_str()))
    }

    /// A delegation id requested (+1) or ended (−1). An id back at 0 is forgotten, so the map
    /// holds only the delegations running now (and any ended twice or never requested, which
    /// stay ≠ 0 and are reported as leaked): a soak's memory is the fleet's, not the harness's.
    fn open_delegation(&mut self, node: usize, id: u64, n: i64) {
        let slot = self.open.entry((node, id)).or_default();
        *slot += n;
        if *slot == 0 {
            self.open.remove(&(node, id));
        }
    }

    fn add(&mut self, agent: &AgentKey, n: i64) {
        *self.balance.entry(agent.clone()).or_default() += n;
        self.outstanding += n;
    }

    /// A finished turn of `agent`, by its termination reason.
    fn count_turn(&mut self, agent: &AgentKey, reason: &str) {
        let depth = self.depth(agent);
        if self.turns_by_depth.len() <= depth {
            self.turns_by_depth.resize_with(depth + 1, Default::default);
        }
        *self.turns_by_depth[depth]
            .entry(reason.to_owned())
            .or_default() += 1;
        if let Some(role) = self.roles.get(agent) {
            let entry = self
                .turns_by_agent
                .entry(agent.as_str().to_owned())
                .or_insert_with(|| outcomes::AgentTurns {
                    depth,
                    role: role.clone(),
                    turns: Default::default(),
                });
            *entry.turns.entry(reason.to_owned()).or_default() += 1;
        }
    }

    fn end_in_progress(&mut self, agent: &AgentKey) {
        // (Not hashed when none is in progress: a fleet halt of a million idle agents journals a
        // million `halted`.)
        if !self.in_progress.is_empty() && self.in_progress.remove(agent) {
            self.add(agent, -1);
        }
    }
}

/// The journal the harness hands to the supervisor: counts, independently of the supervisor's own
/// counters, what it needs for the report.
#[derive(Default)]
struct HarnessJournal {
    seq: std::sync::atomic::AtomicU64,
    tally: Mutex<Tally>,
    /// Halt storm: wake the harness once this many turns have finished (0: never), or once the
    /// fleet has settled. The harness is woken by the very event that crosses the line, not by a
    /// clock, so with no latency the halt lands at the same point of the run every time.
    storm_turns: std::sync::atomic::AtomicU64,
    storm: tokio::sync::Notify,
}

fn depth_of(key: &str) -> usize {
    key.bytes().filter(|b| *b == b'.').count()
}

impl Tally {
    /// Counts one journaled event, journaled by `node`'s supervisor (0 on one node).
    fn count(&mut self, node: usize, agent: &AgentKey, kind: EventKind) {
        if let Some(c) = &mut self.cluster {
            // Before the fleet-wide counts: a refusal after a request is recognised here.
            if c.count(node, agent, &kind) == cluster::Seen::RefusedAfterRequest {
                if let EventKind::DelegationRefused { to, refusal } = kind {
                    let d = self.depth(&to);
                    bump(&mut self.refusals_by_depth, d);
                    self.count_refusal_after_request(to, &refusal);
                }
                return;
            }
        }
        let t = self;
        if let EventKind::StateChanged { from, to, .. } = &kind {
            t.states[state_index(*from)] -= 1;
            t.states[state_index(*to)] += 1;
        }
        match kind {
            EventKind::Spawned { .. } => t.states[state_index(AgentState::WaitingForEvent)] += 1,
            EventKind::StateChanged { from, to, .. }
                if from == AgentState::WaitingForEvent && to == AgentState::Executing =>
            {
                t.in_progress.insert(agent.clone());
            }
            EventKind::TurnFinished { outcome } => {
                t.turns += 1;
                t.end_in_progress(agent);
                t.count_turn(agent, outcome.reason.as_str());
                if outcome.reason == warden_protocols::TerminationReason::Answered {
                    if let Some(r) = t.recoveries.as_mut().and_then(|all| {
                        all.iter_mut().rev().find(|r| {
                            &r.agent == agent && r.unlocked.is_some() && r.recovered.is_none()
                        })
                    }) {
                        r.recovered = Some(Instant::now());
                    }
                }
            }
            // The turn running when the halt came was cancelled (no TurnFinished will come).
            EventKind::Halted { .. } | EventKind::Crashed { .. } => t.end_in_progress(agent),
            EventKind::WorkRefused { work, .. }
                if work == "user_event" || work == "delegated_task" =>
            {
                t.add(agent, -1);
            }
            EventKind::MessagesDiscarded { messages } => {
                let n = messages
                    .iter()
                    .filter(|m| m.kind == "user_event" || m.kind == "delegated_task")
                    .count() as i64;
                t.add(agent, -n);
            }
            EventKind::ToolStarted { tool, .. } if tool != "delegate" => t.tool_calls += 1,
            EventKind::LockedOut { .. } => {
                if let Some(all) = &mut t.recoveries {
                    all.push(Recovering {
                        agent: agent.clone(),
                        locked: Instant::now(),
                        unlocked: None,
                        recovered: None,
                    });
                }
                t.lockouts += 1;
                let d = t.depth(agent);
                bump(&mut t.lockouts_by_depth, d);
            }
            EventKind::DelegationRequested { id, to, .. } => {
                t.delegations.requested += 1;
                t.delegations.accepted += 1;
                t.open_delegation(node, id, 1);
                t.add(&to, 1);
            }
            EventKind::DelegationEnded { id, .. } => t.open_delegation(node, id, -1),
            EventKind::DelegationRefused { to, refusal } => {
                let d = t.depth(&to);
                bump(&mut t.refusals_by_depth, d);
                t.count_refusal(to, refusal);
            }
            _ => {}
        }
    }

    /// A refusal that came after its `DelegationRequested` (the delegate refused the task, here
    /// or on its node): the task was never queued on `to`.
    fn count_refusal_after_request(&mut self, to: AgentKey, refusal: &DelegationRefusal) {
        let t = self;
        t.delegations.accepted -= 1;
        t.add(&to, -1);
        let locked = match refusal {
            DelegationRefusal::DelegateRefused { refusal, .. } => {
                matches!(
                    refusal,
                    WorkRefusal::LockedOut { .. } | WorkRefusal::Stopped
                )
            }
            DelegationRefusal::EmergencyStop { .. } | DelegationRefusal::Stopped { .. } => true,
            _ => false,
        };
        if locked {
            t.delegations.refused_locked += 1;
        } else {
            t.refused_other += 1;
        }
    }

    /// A `DelegationRefused` by kind.
    fn count_refusal(&mut self, to: AgentKey, refusal: DelegationRefusal) {
        let t = self;
        match refusal {
            // Refused after it was requested: the task was never queued on `to`.
            refusal @ DelegationRefusal::DelegateRefused { .. } => {
                t.count_refusal_after_request(to, &refusal);
            }
            other => {
                t.delegations.requested += 1;
                match other {
                    DelegationRefusal::SubAgentBudget { .. } => t.delegations.refused_budget += 1,
                    DelegationRefusal::HopLimit { .. } => t.delegations.refused_hops += 1,
                    DelegationRefusal::EmergencyStop { .. }
                    | DelegationRefusal::Stopped { .. }
                    | DelegationRefusal::DelegatorNotRunning { .. } => {
                        t.delegations.refused_locked += 1
                    }
                    DelegationRefusal::Cycle { .. } => t.delegations.refused_cycle += 1,
                    _ => t.refused_other += 1,
                }
            }
        }
    }
}

impl HarnessJournal {
    /// Counts `kinds`, journaled by `node`'s supervisor (0 on one node).
    fn append_from(&self, node: usize, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        self.rows_from(node, kinds.into_iter().map(|kind| (agent, kind)))
    }

    /// Counts `rows` (each an agent's event), journaled by `node`'s supervisor, under one lock of
    /// the tally: their numbers are consecutive.
    fn rows_from<A: std::borrow::Borrow<AgentKey>>(
        &self,
        node: usize,
        rows: impl ExactSizeIterator<Item = (A, EventKind)>,
    ) -> u64 {
        let n = rows.len() as u64;
        let mut t = self.tally.lock();
        let last = self.seq.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
        for (agent, kind) in rows {
            t.count(node, agent.borrow(), kind);
        }
        let storm_turns = self.storm_turns.load(std::sync::atomic::Ordering::Relaxed);
        if storm_turns > 0
            && (t.turns >= storm_turns || (t.outstanding == 0 && t.open.values().all(|v| *v == 0)))
        {
            self.storm.notify_one();
        }
        last
    }
}

impl Journal for HarnessJournal {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        self.append_all(agent, vec![kind])
    }

    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        self.append_from(0, agent, kinds)
    }

    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, _at_ms: u64) -> u64 {
        self.rows_from(0, rows.into_iter())
    }

    /// Keeps nothing across a crash.
    fn durable(&self, _seq: u64) -> BoxFuture<'static, Result<(), crate::NotDurable>> {
        crate::already_durable()
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}

// ---- the simulated model --------------------------------------------------------------------------

fn agent_seed(seed: u64, index: usize) -> u64 {
    // splitmix64 of (seed, index)
    let mut z = seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Clone, Copy)]
struct Faults {
    fail: f64,
    panic: f64,
    latency_ms: f64,
}

fn jitter(rng: &mut SmallRng, mean_ms: f64, step: ScriptStep) -> ScriptStep {
    if mean_ms <= 0.0 {
        return step;
    }
    let ms = mean_ms * rng.gen_range(0.5..1.5);
    step.delayed(Duration::from_secs_f64(ms / 1000.0))
}

/// The model of one agent: delegates each task to all `children` at once (a leaf calls `work`), then
/// answers once the results are in.
fn node_model(children: Vec<AgentKey>, faults: Faults, seed: u64) -> Arc<ScriptedProvider> {
    let rng = Mutex::new(SmallRng::seed_from_u64(seed));
    let item = std::sync::atomic::AtomicU64::new(0);
    Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        let mut rng = rng.lock();
        let failed = faults.fail > 0.0 && rng.gen_bool(faults.fail.min(1.0));
        let step = if failed {
            ScriptStep::fail("loadtest: injected model failure")
        } else if req
            .messages
            .last()
            .is_some_and(|m| m.role == ChatRole::Tool)
        {
            ScriptStep::reply("done")
        } else if children.is_empty() {
            let i = item.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            ScriptStep::call("work", json!({ "item": i }))
        } else {
            let calls = children
                .iter()
                .enumerate()
                .map(|(i, child)| {
                    ToolCall::new(
                        format!("d{i}"),
                        "delegate",
                        &json!({"agent": child.as_str(), "task": "work"}),
                    )
                })
                .collect();
            ScriptStep::Respond(LlmResponse {
                message: ChatMessage::assistant_tool_calls(None, calls),
                finish_reason: FinishReason::ToolCalls,
                usage: Default::default(),
            })
        };
        jitter(&mut rng, faults.latency_ms, step)
    }))
}

/// The leaves' tool: fails or panics at the configured rates.
fn work_tool(faults: Faults, seed: u64) -> impl crate::Tool {
    let rng = Mutex::new(SmallRng::seed_from_u64(seed ^ 0x5A5A_5A5A));
    FnTool::new(
        "work",
        "Do one unit of work",
        ToolCategory::SafeChain,
        move |_args, _ctx| {
            let (fail, panic) = {
                let mut rng = rng.lock();
                let roll: f64 = rng.gen();
                (
                    roll < faults.fail,
                    roll >= faults.fail && roll < faults.fail + faults.panic,
                )
            };
            async move {
                if panic {
                    panic!("{INJECTED_PANIC}");
                }
                if fail {
                    Err(ToolError::Failed("loadtest: injected tool failure".into()))
                } else {
                    Ok(json!({"ok": true}))
                }
            }
        },
    )
}

// ---- measurements -------------------------------------------------------------------------------

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`); 0 where unavailable.
pub fn proc_status_bytes(field: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Halt probes on their own one-agent teams: pause, queue `backlog` events, halt; latency is from the
/// halt request to its acknowledgement; messages processed after it are counted (must be 0).
async fn halt_probe(options: &LoadtestOptions) -> HaltProbe {
    let backlog = options.backlog;
    let mut config = WardenConfig::default();
    config.mailbox.ordinary_capacity =
        NonZeroUsize::new(backlog.max(1)).unwrap_or(NonZeroUsize::MIN);
    config.supervisor.arbiters = 1;
    let mut latencies = Vec::new();
    let mut processed_after_halt = 0;
    for i in 0..options.halt_probes {
        // The probed agent runs on an arbiter of its own, as an agent does when an operator's halt
        // comes from another thread (the API, the CLI).
        let team = Supervisor::builder(config.clone(), Arc::new(NullJournal::default())).build();
        let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
        let Ok(agent) = team.spawn(AgentSpec::assistant(format!("probe{i}"), model)) else {
            continue;
        };
        if agent.pause("loadtest").await.is_err() {
            continue;
        }
        for n in 0..backlog {
            if agent
                .try_send_event(UserEvent::new(format!("m{n}")))
                .is_err()
            {
                break;
            }
        }
        let turns_before = agent.status().turns;
        let start = Instant::now();
        let ack = agent
            .halt(HaltCause::Operator {
                operator: "loadtest".into(),
            })
            .await;
        latencies.push(start.elapsed().as_micros() as u64);
        // Give anything that could still run the chance to (nothing should), and the backlog's
        // deferred clean-up the time to free it.
        actix_rt::time::sleep(Duration::from_millis(5)).await;
        let status = agent.status();
        processed_after_halt += status.turns - turns_before;
        if ack.state != AgentState::Stopped {
            processed_after_halt += 1;
        }
        team.shutdown().await;
    }
    latencies.sort_unstable();
    HaltProbe {
        backlog: backlog as u64,
        latency_us_p50: percentile(&latencies, 0.50),
        latency_us_p99: percentile(&latencies, 0.99),
        latency_us_max: latencies.last().copied().unwrap_or(0),
        processed_after_halt,
    }
}

// ---- the run ------------------------------------------------------------------------------------

/// One agent of the fleet, by spawn order.
struct Node {
    key: AgentKey,
    parent: Option<AgentKey>,
    children: Vec<AgentKey>,
}

/// Trees of `fanout`/`depth`, breadth first, cut at `agents`.
fn fleet_shape(agents: usize, fanout: usize, depth: usize) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::with_capacity(agents);
    let mut root = 0;
    while nodes.len() < agents {
        // Breadth first within one tree: (key, parent index in `nodes`, depth).
        let start = nodes.len();
        nodes.push(Node {
            key: AgentKey::from(format!("a{root}")),
            parent: None,
            children: Vec::new(),
        });
        let mut i = start;
        while i < nodes.len() && nodes.len() < agents {
            let d = depth_of(nodes[i].key.as_str());
            if d < depth {
                for c in 0..fanout {
                    if nodes.len() >= agents {
                        break;
                    }
                    let key = AgentKey::from(format!("{}.{c}", nodes[i].key.as_str()));
                    nodes[i].children.push(key.clone());
                    let parent = Some(nodes[i].key.clone());
                    nodes.push(Node {
                        key,
                        parent,
                        children: Vec::new(),
                    });
                }
            }
            i += 1;
        }
        root += 1;
    }
    nodes
}

/// At most this many agents are listed in [`LoadReport::stopped_agents`].
const MAX_STOPPED_LISTED: usize = 100;

/// What stopped an agent: the breaker that did (a budget), else a halt, else `stopped`.
fn stop_cause(status: &warden_protocols::AgentStatus) -> String {
    match &status.stopped_by {
        Some(lockout) => format!("{}: {}", lockout.breaker.as_str(), lockout.reason),
        None if status.halts > 0 => "halted".to_owned(),
        None => "stopped".to_owned(),
    }
}

/// The configuration of a synthetic fleet's team: no per-agent token budget, no iteration limit
/// that a long run would reach, a mailbox that holds every task a root is sent.
fn fleet_config(options: &LoadtestOptions) -> WardenConfig {
    let mut config = WardenConfig::default();
    config.safety.budget.tokens_per_agent = 0;
    config.safety.loop_.max_iterations_per_task = 1_000_000;
    config.mailbox.ordinary_capacity =
        NonZeroUsize::new(fleet_tasks(options).max(1024)).unwrap_or(NonZeroUsize::MIN);
    config.supervisor.passivate_after_seconds = options.passivate_after_s;
    config.supervisor.arbiters = options.threads;
    config
}

/// Tasks sent to every root: none for `idle`.
fn fleet_tasks(options: &LoadtestOptions) -> usize {
    if options.scenario == Scenario::Idle {
        0
    } else {
        options.tasks_per_agent
    }
}

/// The models and faults of a synthetic fleet: makes each agent's spec.
struct FleetModels {
    scenario: Scenario,
    seed: u64,
    inner: Faults,
    leaf: Faults,
    idle_model: Arc<ScriptedProvider>,
}

impl FleetModels {
    fn new(options: &LoadtestOptions) -> Self {
        let inner = Faults {
            fail: options.fail_rate,
            panic: options.panic_rate,
            latency_ms: options.llm_latency_ms,
        };
        let leaf = if options.scenario == Scenario::Cascade {
            Faults {
                fail: options.fail_rate.max(0.8),
                ..inner
            }
        } else {
            inner
        };
        FleetModels {
            scenario: options.scenario,
            seed: options.seed,
            inner,
            leaf,
            idle_model: Arc::new(
                ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")),
            ),
        }
    }

    /// The spec of the `index`th agent of the fleet, and its model's call counter (none for
    /// `idle`, whose agents share one model that is never called).
    fn spec(&self, node: Node, index: usize) -> (AgentSpec, Option<Arc<ScriptStats>>) {
        let Node {
            key,
            parent,
            children,
        } = node;
        let seed = agent_seed(self.seed, index);
        if self.scenario == Scenario::Idle {
            // No task will reach them: one shared model, no tools (measures the agents themselves).
            let spec = match parent {
                None => AgentSpec::assistant(key, self.idle_model.clone()),
                Some(p) => AgentSpec::sub_agent(key, p, self.idle_model.clone()),
            };
            return (spec, None);
        }
        let faults = if children.is_empty() {
            self.leaf
        } else {
            self.inner
        };
        let leafy = children.is_empty();
        let model = node_model(children, faults, seed);
        let stats = model.stats();
        let spec = match parent {
            None => AgentSpec::assistant(key, model),
            Some(p) => AgentSpec::sub_agent(key, p, model),
        };
        let spec = if leafy {
            spec.with_tool(work_tool(faults, seed)).without_delegation()
        } else {
            spec
        };
        (spec, Some(stats))
    }
}

/// Runs a load test in its own actix `System` (blocks the calling thread). Every agent runs on
/// the calling thread unless [`LoadtestOptions::threads`] asks for arbiters of their own; the
/// halt probe uses an arbiter thread of its own. Nothing is written
/// to disk and nothing goes over the network: the journal is the harness's own counter and the
/// model is scripted.
///
/// Never fails: a violated invariant shows in the report (`lost_events`, `leaked_slots`,
/// `halt.processed_after_halt` above 0), a run cut by [`LoadtestOptions::timeout`] as
/// `timed_out`.
///
/// # Panics
///
/// If called inside a running actix `System` or tokio runtime (use [`run_loadtest_async`]
/// there).
///
/// # Examples
///
/// ```
/// use warden::loadtest::{run_loadtest, LoadtestOptions, Scenario};
///
/// let options = LoadtestOptions {
///     agents: 13, // one tree: a root, 3 children, 9 grandchildren
///     tasks_per_agent: 2,
///     halt_probes: 1,
///     backlog: 10,
///     ..LoadtestOptions::new(Scenario::Steady)
/// };
/// let report = run_loadtest(options);
/// assert_eq!(report.agents, 13);
/// assert_eq!((report.lost_events, report.leaked_slots), (0, 0));
/// assert_eq!(report.halt.processed_after_halt, 0);
/// assert!(!report.timed_out);
/// // 2 tasks, each delegated by the root to 3 children and by each child to 3 grandchildren.
/// assert_eq!(report.delegations.accepted, 2 * (3 + 9));
///
/// let mut table = Vec::new();
/// warden::loadtest::write_report(&mut table, &report)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn run_loadtest(options: LoadtestOptions) -> LoadReport {
    actix_rt::System::new().block_on(run_loadtest_async(options))
}

/// The progress bar on stderr: one bar reused by each phase (hidden unless `options.progress`).
struct Progress(indicatif::ProgressBar);

impl Progress {
    fn new(enabled: bool) -> Self {
        if !enabled {
            return Progress(indicatif::ProgressBar::hidden());
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::stderr_with_hz(10),
        );
        let style = indicatif::ProgressStyle::with_template(
            "{prefix:>10} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
        );
        if let Ok(style) = style {
            bar.set_style(style);
        }
        Progress(bar)
    }

    fn phase(&self, name: &'static str, len: u64) {
        self.0.set_prefix(name);
        self.0.set_length(len);
        self.0.set_position(0);
        self.0.set_message("");
    }

    /// A phase whose total may be unknown (`None`: the bar counts up with no total).
    fn phase_of(&self, name: &'static str, len: Option<u64>) {
        self.phase(name, len.unwrap_or(0));
        if len.is_none() {
            self.0.unset_length();
        }
    }

    fn at(&self, pos: u64) {
        self.0.set_position(pos);
    }

    fn note(&self, message: String) {
        self.0.set_message(message);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// [`run_loadtest`] inside a running actix `System` (every agent on the current arbiter, unless
/// [`LoadtestOptions::threads`] is above 0).
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future mid-run leaves the fleet's actors running on the
/// current arbiter (the team is neither halted nor shut down) and loses the report.
pub async fn run_loadtest_async(options: LoadtestOptions) -> LoadReport {
    let progress = Progress::new(options.progress);
    let scenario = options.scenario;
    let config = fleet_config(&options);
    let journal = Arc::new(HarnessJournal::default());
    let builder = Supervisor::builder(config, journal.clone());
    let builder = if options.threads == 0 {
        builder.current_arbiter()
    } else {
        builder
    };
    let team = builder
        .safety_checks(options.safety)
        .capacity(options.agents)
        .build();
    let retries_before = warden_actors::retry_counts();

    let fleet = FleetModels::new(&options);

    // ---- spawn
    let shape = fleet_shape(options.agents, options.fanout, options.depth);
    let rss_before = proc_status_bytes("VmRSS");
    let mut roots = Vec::new();
    let mut stats: Vec<Arc<ScriptStats>> = Vec::new();
    let spawn_start = Instant::now();
    progress.phase("spawn", shape.len() as u64);
    for (index, node) in shape.into_iter().enumerate() {
        if index % 4096 == 0 {
            progress.at(index as u64);
        }
        let is_root = node.parent.is_none();
        let (spec, model_stats) = fleet.spec(node, index);
        stats.extend(model_stats);
        match team.spawn(spec) {
            Ok(handle) if is_root => roots.push(handle),
            _ => {}
        }
    }
    // Spawn time and memory include the actors themselves: wait until every one has started.
    progress.note("starting actors".into());
    team.started().await;
    let spawned = Spawned {
        agents: team.len() as u64,
        elapsed: spawn_start.elapsed(),
        rss_growth: proc_status_bytes("VmRSS").saturating_sub(rss_before),
    };
    let agents = spawned.agents;
    let llm_calls = || -> u64 {
        stats
            .iter()
            .map(|s| s.calls.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    };

    let (driven, storm) = drive(
        &journal, &progress, &options, &team, &roots, agents, &llm_calls,
    )
    .await;
    let mut report = finish(
        team, &journal, &progress, &options, storm, driven, &llm_calls,
    )
    .await;
    report.scenario = scenario.as_str().to_owned();
    report.retries = retries_since(&retries_before);
    spawned.apply(&mut report);
    report
}

/// The drive phase: every root is sent its tasks (by `team`, the roots' team), then the fleet is
/// waited for until it settles (or, for `halt-storm`, until the storm's halt is due) or the
/// timeout passes. `storm`: the drive phase's start, when the final halt ends it.
async fn drive(
    journal: &HarnessJournal,
    progress: &Progress,
    options: &LoadtestOptions,
    team: &Supervisor,
    roots: &[crate::AgentHandle],
    agents: u64,
    llm_calls: CallCount<'_>,
) -> (Driven, Option<Instant>) {
    let scenario = options.scenario;
    let tasks = fleet_tasks(options);
    // ---- drive
    if scenario == Scenario::HaltStorm {
        // Before any task is sent: the first turns must not be missed.
        journal.storm_turns.store(
            (roots.len() as u64).max(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    let drive_start = Instant::now();
    // Every settled event of the fleet, correlated by id: the roots' answers give the latencies.
    let mut driven = Driven::new(team, drive_start, false);
    // Turns without refusals: every agent runs every task once.
    progress.phase("drive", agents * tasks as u64);
    for t in 0..tasks {
        for root in roots {
            driven.send(journal, root, UserEvent::new(format!("task {t}")));
        }
    }
    let deadline = Instant::now() + options.timeout;
    if scenario == Scenario::HaltStorm {
        // Halt while the fleet is at work: once as many turns have finished as there are roots.
        // The journal wakes this task with the event that crosses the line (no polling clock), so
        // with no latency the halt comes at the same point every run.
        let target = journal
            .storm_turns
            .load(std::sync::atomic::Ordering::Relaxed);
        loop {
            {
                let t = journal.tally.lock();
                if t.turns >= target || settled(&t) {
                    break;
                }
                if Instant::now() >= deadline || options.interrupt.raised().is_some() {
                    driven.unfinished = Some(t.outstanding.max(0) as u64);
                    break;
                }
            }
            driven.poll(journal, llm_calls);
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1));
            tokio::select! {
                () = journal.storm.notified() => {}
                () = options.interrupt.wait() => {}
                () = actix_rt::time::sleep(left) => {}
            }
        }
    } else {
        driven.unfinished = drain(
            journal,
            progress,
            &mut driven,
            llm_calls,
            deadline,
            &options.interrupt,
        )
        .await;
    }
    driven.duration = drive_start.elapsed();
    let storm = (scenario == Scenario::HaltStorm).then_some(drive_start);
    (driven, storm)
}

/// Whether every work item and every delegation id has ended.
fn settled(t: &Tally) -> bool {
    t.outstanding == 0 && t.open.values().all(|v| *v == 0)
}

/// The model calls made so far, read by the sampler.
type CallCount<'a> = &'a dyn Fn() -> u64;

/// Waits until the fleet has settled or `deadline` passes; `Some(work items still open)` then.
/// An interrupt ([`LoadtestOptions::interrupt`]) brings the deadline to [`INTERRUPT_GRACE`] from
/// when it came.
async fn drain(
    journal: &HarnessJournal,
    progress: &Progress,
    driven: &mut Driven,
    llm_calls: CallCount<'_>,
    deadline: Instant,
    interrupt: &Interrupt,
) -> Option<u64> {
    let mut deadline = deadline;
    let mut cut_once = false;
    loop {
        if !cut_once && interrupt.raised().is_some() {
            deadline = interrupt.cut(deadline);
            cut_once = true;
        }
        {
            let t = journal.tally.lock();
            if settled(&t) {
                return None;
            }
            if Instant::now() >= deadline {
                return Some(t.outstanding.max(0) as u64);
            }
            progress.at(t.turns);
            progress.note(format!(
                "{} outstanding, {} lockouts",
                t.outstanding, t.lockouts
            ));
        }
        driven.poll(journal, llm_calls);
        actix_rt::time::sleep(Duration::from_micros(500)).await;
    }
}

/// The spawn phase's figures.
struct Spawned {
    agents: u64,
    elapsed: Duration,
    rss_growth: u64,
}

impl Spawned {
    fn apply(&self, report: &mut LoadReport) {
        report.agents = self.agents;
        report.spawn_ns_per_agent =
            (self.elapsed.as_nanos() / u128::from(self.agents.max(1))) as u64;
        report.memory.bytes_per_agent = self.rss_growth / self.agents.max(1);
    }
}

/// The drive phase: what it sent, what settled, the time series; what it leaves for the report.
struct Driven {
    duration: Duration,
    /// Work items still open when the deadline cut the drive phase.
    unfinished: Option<u64>,
    tasks_sent: u64,
    tasks_refused: u64,
    /// Accepted → answered, in µs, of the tasks that were answered.
    latencies: Vec<u64>,
    /// The team's settlements ([`Supervisor::take_replies`]).
    replies: tokio::sync::mpsc::UnboundedReceiver<crate::Settlement>,
    /// Keeps `replies` open when the team's stream was taken already (then nothing settles).
    _spare: tokio::sync::mpsc::UnboundedSender<crate::Settlement>,
    /// The harness's own events not settled yet; `None`: every settlement is the harness's.
    in_flight: Option<HashSet<(AgentKey, u64)>>,
    sampler: Sampler,
    /// The harness's events by fate and reason.
    outcomes: outcomes::Outcomes,
    /// The drive phase was cut (timeout, interrupt): what settles from now on was not waited for.
    cut: bool,
}

impl Driven {
    /// The drive phase of `team`, from `start`. `track`: time only the events sent with
    /// [`Driven::send`] (the team may settle others).
    fn new(team: &Supervisor, start: Instant, track: bool) -> Self {
        let (spare, taken) = tokio::sync::mpsc::unbounded_channel();
        Driven {
            duration: Duration::ZERO,
            unfinished: None,
            tasks_sent: 0,
            tasks_refused: 0,
            latencies: Vec::new(),
            replies: team.take_replies().unwrap_or(taken),
            _spare: spare,
            in_flight: track.then(HashSet::new),
            sampler: Sampler::new(start),
            outcomes: outcomes::Outcomes::default(),
            cut: false,
        }
    }

    /// Events sent and not settled yet (0 when not tracked).
    fn in_flight(&self) -> usize {
        self.in_flight.as_ref().map_or(0, HashSet::len)
    }

    /// Ends `s` if it is the harness's: an answer's latency is kept.
    fn settle(&mut self, s: crate::Settlement) {
        let ours = match &mut self.in_flight {
            None => true,
            Some(set) => set.remove(&(s.agent, s.id)),
        };
        if ours {
            self.outcomes.settled(&s.result, self.cut);
            match &s.result {
                Ok(_) | Err(crate::AskError::AgentGone) => {}
                Err(crate::AskError::Failed { .. }) => self.sampler.failed += 1,
                Err(crate::AskError::Refused { .. } | crate::AskError::NotQueued(_)) => {
                    self.sampler.refused += 1
                }
                Err(crate::AskError::Discarded { .. }) => self.sampler.discarded += 1,
            }
        }
        if let (true, Ok(reply)) = (ours, s.result) {
            let us = reply.latency.as_micros() as u64;
            self.latencies.push(us);
            self.sampler.answered.push(us);
        }
    }

    /// Takes the settlements that came, and a sample when one is due.
    fn poll(&mut self, journal: &HarnessJournal, llm_calls: CallCount<'_>) {
        while let Ok(s) = self.replies.try_recv() {
            self.settle(s);
        }
        self.sampler.tick(journal, llm_calls);
    }

    /// Sends `event` to `agent`, counting it; its id when it was accepted.
    fn send(
        &mut self,
        journal: &HarnessJournal,
        agent: &crate::AgentHandle,
        event: UserEvent,
    ) -> Option<u64> {
        self.tasks_sent += 1;
        match agent.try_send_event(event) {
            Ok(id) => {
                let mut t = journal.tally.lock();
                t.add(agent.key(), 1);
                t.events_accepted += 1;
                if let Some(set) = &mut self.in_flight {
                    set.insert((agent.key().clone(), id));
                }
                Some(id)
            }
            Err(err) => {
                self.tasks_refused += 1;
                self.outcomes.refused_at_once(&err.refusal);
                self.sampler.refused += 1;
                // A refusal by a locked-out or stopped agent is journaled (and counted as the
                // task's ending); a full or closed mailbox is not.
                if matches!(
                    err.refusal,
                    WorkRefusal::LockedOut { .. } | WorkRefusal::Stopped
                ) {
                    journal.tally.lock().add(agent.key(), 1);
                }
                None
            }
        }
    }
}

/// The per-second time series of the drive phase.
struct Sampler {
    start: Instant,
    next: Instant,
    /// Counts at the last sample: events accepted, turns, model calls, lockouts.
    last: [u64; 4],
    /// Latencies (µs) of the events answered since the last sample.
    answered: Vec<u64>,
    /// The harness's events failed, refused and discarded since the last sample.
    failed: u64,
    refused: u64,
    discarded: u64,
    samples: Vec<Sample>,
}

impl Sampler {
    fn new(start: Instant) -> Self {
        Sampler {
            start,
            next: start + Duration::from_secs(1),
            last: [0; 4],
            answered: Vec::new(),
            failed: 0,
            refused: 0,
            discarded: 0,
            samples: Vec::new(),
        }
    }

    /// Takes a sample when a second has passed since the last one.
    fn tick(&mut self, journal: &HarnessJournal, llm_calls: CallCount<'_>) {
        let now = Instant::now();
        if now >= self.next {
            self.sample(now, journal, llm_calls);
            self.next += Duration::from_secs(1);
            if self.next <= now {
                self.next = now + Duration::from_secs(1);
            }
        }
    }

    fn sample(&mut self, now: Instant, journal: &HarnessJournal, llm_calls: CallCount<'_>) {
        let (counts, by_state) = {
            let t = journal.tally.lock();
            (
                [t.events_accepted, t.turns, llm_calls(), t.lockouts],
                t.states,
            )
        };
        let delta: Vec<u64> = counts
            .iter()
            .zip(self.last)
            .map(|(now, before)| now.saturating_sub(before))
            .collect();
        self.last = counts;
        let agents_by_state = AgentState::ALL
            .iter()
            .zip(by_state)
            .filter(|(_, n)| *n > 0)
            .map(|(state, n)| (state.as_str().to_owned(), n as u64))
            .collect();
        let mut latencies = std::mem::take(&mut self.answered);
        latencies.sort_unstable();
        let p95_ms = percentile(&latencies, 0.95) as f64 / 1000.0;
        let answered = EventLatency::of(latencies);
        self.samples.push(Sample {
            t_s: (now - self.start).as_secs_f64(),
            answered: answered.answered,
            latency_p50_ms: answered.p50_ms,
            latency_p99_ms: answered.p99_ms,
            latency_p90_ms: answered.p90_ms,
            latency_p95_ms: p95_ms,
            failed: std::mem::take(&mut self.failed),
            refused: std::mem::take(&mut self.refused),
            discarded: std::mem::take(&mut self.discarded),
            events_accepted: delta[0],
            turns: delta[1],
            llm_calls: delta[2],
            lockouts: delta[3],
            agents_by_state,
            rss_bytes: proc_status_bytes("VmRSS"),
            committed_bytes: COMMITTED_PROBE.get().map_or(0, |probe| probe()),
        });
    }
}

/// Retries counted since `before` (a [`warden_actors::retry_counts`] snapshot), by class.
fn retries_since(
    before: &[(&'static str, u64); warden_actors::RETRY_CLASSES.len()],
) -> BTreeMap<String, u64> {
    warden_actors::retry_counts()
        .iter()
        .zip(before)
        .map(|((class, now), (_, then))| ((*class).to_owned(), now.saturating_sub(*then)))
        .collect()
}

/// Everything after the drive phase, for the scenarios and team-file runs alike: the last sample,
/// the final `halt_all`, the accounting's settling, the halt probe and the report.
/// `storm`: the drive phase's start, when the drive phase ends with the final halt.
async fn finish(
    team: Supervisor,
    journal: &HarnessJournal,
    progress: &Progress,
    options: &LoadtestOptions,
    storm: Option<Instant>,
    driven: Driven,
    llm_calls: CallCount<'_>,
) -> LoadReport {
    finish_fleet(
        vec![team],
        None,
        journal,
        progress,
        options,
        storm,
        driven,
        llm_calls,
    )
    .await
}

/// [`finish`] for a fleet of one team or of a cluster run's nodes (`cluster`: the final halt is
/// then the cluster halt issued on the first node, and the nodes leave the cluster before the
/// halt probe).
#[allow(clippy::too_many_arguments)]
async fn finish_fleet(
    teams: Vec<Supervisor>,
    mut cluster: Option<&mut cluster::Nodes>,
    journal: &HarnessJournal,
    progress: &Progress,
    options: &LoadtestOptions,
    storm: Option<Instant>,
    mut driven: Driven,
    llm_calls: CallCount<'_>,
) -> LoadReport {
    while let Ok(s) = driven.replies.try_recv() {
        driven.settle(s);
    }
    // What the final halt discards from now on was not waited for.
    driven.cut = driven.unfinished.is_some();
    driven.sampler.sample(Instant::now(), journal, llm_calls);
    let agents: u64 = teams.iter().map(|t| t.len() as u64).sum();
    let (stopped, stopped_agents) = {
        // The statuses first, then the tally's lock: a status takes each agent's record lock,
        // and an agent journals (takes the tally's lock) under its record lock — with the fleet
        // on other threads (`--threads`), the other order deadlocked.
        let statuses: Vec<_> = teams.iter().flat_map(Supervisor::statuses).collect();
        let t = journal.tally.lock();
        let mut stopped = 0;
        let mut listed = Vec::new();
        for status in statuses {
            if status.state != AgentState::Stopped {
                continue;
            }
            stopped += 1;
            if listed.len() < MAX_STOPPED_LISTED {
                listed.push(outcomes::StoppedAgent {
                    agent: status.key.as_str().to_owned(),
                    depth: t.depth(&status.key),
                    cause: stop_cause(&status),
                });
            }
        }
        (stopped, listed)
    };

    // ---- halt all
    progress.phase("halt all", agents);
    let halt_start = Instant::now();
    let (acked, halted_at) = match cluster.as_deref_mut() {
        None => {
            let mut acked = 0;
            for team in &teams {
                acked += team.halt_all().await.len() as u64;
            }
            (acked, Instant::now())
        }
        Some(nodes) => nodes.halt(journal, options.timeout).await,
    };
    let halt_all = HaltAll {
        agents: acked,
        ms: (halted_at - halt_start).as_secs_f64() * 1000.0,
    };
    // The halts' deferred clean-ups list what they cleared; wait for the accounting to settle.
    // (At least a second, even after a short `--timeout-s`: a cut run has the most to clean up.)
    let settle_deadline =
        Instant::now() + Duration::from_secs(10).min(options.timeout.max(Duration::from_secs(1)));
    actix_rt::time::sleep(Duration::from_millis(5)).await;
    let settled_now = |cluster: &Option<&mut cluster::Nodes>| {
        let t = journal.tally.lock();
        match cluster {
            None => settled(&t),
            Some(nodes) => nodes.settled(&t),
        }
    };
    while Instant::now() < settle_deadline && !settled_now(&cluster) {
        actix_rt::time::sleep(Duration::from_millis(1)).await;
    }
    // The events the final halt settled (discarded from the queues, or their turns stopped).
    while let Ok(s) = driven.replies.try_recv() {
        driven.settle(s);
    }
    if let Some(drive_start) = storm {
        // The drive phase ends when the storm's halts are acknowledged.
        driven.duration = halted_at - drive_start;
    }

    let (mut restarts, mut active_slots) = (0_u64, 0_u64);
    for team in &teams {
        let statuses = team.statuses();
        restarts += statuses.iter().map(|s| u64::from(s.restarts)).sum::<u64>();
        active_slots += statuses
            .iter()
            .map(|s| u64::from(s.active_sub_agents))
            .sum::<u64>();
    }
    if let Some(nodes) = cluster {
        // Nothing answers for these nodes any more (their agents are halted).
        nodes.leave().await;
    }
    for team in &teams {
        team.shutdown().await;
    }
    drop(teams);
    // The probes measure a quiet system: let the fleet's actors stop and free it first.
    actix_rt::time::sleep(Duration::from_millis(10)).await;

    let halt = if options.halt_probes > 0 {
        progress.phase("halt probe", options.halt_probes as u64);
        halt_probe(options).await
    } else {
        HaltProbe {
            backlog: options.backlog as u64,
            ..HaltProbe::default()
        }
    };

    let steps = llm_calls();
    let t = journal.tally.lock();
    let lost_events: u64 = t.balance.values().map(|b| b.unsigned_abs()).sum();
    let open_ids: u64 = t.open.values().map(|v| v.unsigned_abs()).sum();
    let duration_s = driven.duration.as_secs_f64();
    let mut outcomes = driven.outcomes;
    outcomes.unsettled(driven.tasks_sent.saturating_sub(outcomes.total()));
    outcomes.finish();
    LoadReport {
        seed: options.seed,
        threads: options.threads as u64,
        agents,
        duration_s,
        steps,
        steps_per_sec: if duration_s > 0.0 {
            steps as f64 / duration_s
        } else {
            0.0
        },
        tool_calls: t.tool_calls,
        delegations: t.delegations.clone(),
        lockouts: t.lockouts,
        stopped,
        restarts,
        halt,
        halt_all,
        event_latency: EventLatency::of(driven.latencies.clone()),
        event_latencies_us: {
            let mut all = driven.latencies;
            all.sort_unstable();
            all
        },
        memory: Memory {
            rss_peak_bytes: proc_status_bytes("VmHWM"),
            bytes_per_agent: 0,
        },
        lost_events,
        leaked_slots: active_slots + open_ids,
        // An interrupted run cut at its grace period was not timed out (`interrupted` says why).
        timed_out: driven.unfinished.is_some() && options.interrupt.raised().is_none(),
        unfinished_tasks: driven.unfinished.unwrap_or(0),
        lockouts_by_depth: t.lockouts_by_depth.clone(),
        refusals_by_depth: t.refusals_by_depth.clone(),
        refused_other: t.refused_other,
        tasks_sent: driven.tasks_sent,
        tasks_refused: driven.tasks_refused,
        outcomes,
        turns_by_depth: t.turns_by_depth.clone(),
        turns_by_agent: t.turns_by_agent.clone(),
        stopped_agents,
        recoveries: t
            .recoveries
            .iter()
            .flatten()
            .map(|r| {
                let at = |i: Instant| {
                    i.saturating_duration_since(driven.sampler.start)
                        .as_secs_f64()
                };
                outcomes::Recovery {
                    agent: r.agent.as_str().to_owned(),
                    depth: t.depth(&r.agent),
                    locked_s: at(r.locked),
                    unlocked_s: r.unlocked.map(at),
                    recovered_s: r.recovered.map(at),
                }
            })
            .collect(),
        interrupted: options.interrupt.raised().map(str::to_owned),
        soak: soak::analyse(&driven.sampler.samples),
        series: driven.sampler.samples,
        ..LoadReport::default()
    }
}
