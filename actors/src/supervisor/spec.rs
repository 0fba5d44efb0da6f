//! What to spawn ([`AgentSpec`]) and why a spawn, a lookup or a delegation failed.

use super::*;

/// What to spawn: key, role, provider, tools, system prompt, and optionally a record restored
/// from a journal. Passed to [`Supervisor::spawn`].
///
/// Defaults: no system prompt, no tools but the built-in `delegate` (left out with
/// [`AgentSpec::without_delegation`]), a fresh record.
///
/// # Examples
/// ```
/// # use std::sync::Arc;
/// # use serde_json::json;
/// # use warden_actors::{AgentSpec, FnTool, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
/// # use warden_protocols::{AgentRole, ToolCategory, UserEvent, WardenConfig};
/// # actix_rt::System::new().block_on(async {
/// let team = Supervisor::on_current_arbiter(WardenConfig::default(), Arc::new(MemoryJournal::new()));
/// let model = Arc::new(ScriptedProvider::new([
///     ScriptStep::call("price", json!({"item": "sword"})),
///     ScriptStep::reply("30 gold."),
/// ]));
/// let price = FnTool::new("price", "Price of an item", ToolCategory::SafeChain, |_args, _ctx| async {
///     Ok(json!({"gold": 30}))
/// });
/// let spec = AgentSpec::assistant("smith", model)
///     .with_system_prompt("You are a blacksmith.")
///     .with_tool(price)
///     .without_delegation();
/// let smith = team.spawn(spec).unwrap();
/// assert_eq!(smith.ask(UserEvent::new("a sword?")).await.unwrap().answer, "30 gold.");
///
/// let apprentice = team
///     .spawn(AgentSpec::sub_agent("apprentice", "smith", Arc::new(ScriptedProvider::new([]))))
///     .unwrap();
/// assert_eq!(apprentice.status().role, AgentRole::SubAgent);
/// # });
/// ```
pub struct AgentSpec {
    pub(super) key: AgentKey,
    pub(super) role: AgentRole,
    pub(super) parent: Option<AgentKey>,
    pub(super) system_prompt: Option<String>,
    pub(super) provider: Arc<dyn Provider>,
    pub(super) tools: ToolRegistry,
    pub(super) can_delegate: bool,
    /// (The large, rarely given parts are boxed: a spec is moved a few times per spawn, and most
    /// specs have none of them.)
    pub(super) restored: Option<Box<AgentRecord>>,
    /// `[npc]` for this agent; `None`: the team's.
    pub(super) npc: Option<Box<warden_protocols::npc::NpcConfig>>,
    /// Goals: the first ones (journaled at a fresh spawn) and the `set_goals` tool; `None`: no
    /// goals tool.
    pub(super) goals: Option<Vec<String>>,
    /// `[memory]` for this agent; `None`: the team's.
    pub(super) memory: Option<warden_protocols::MemoryConfig>,
    /// The permission gate's policy for this agent; `None`: the team's `[permissions]`.
    pub(super) permissions: Option<Box<warden_protocols::PermissionPolicy>>,
    /// `[execution]` for this agent; `None`: the team's.
    pub(super) execution: Option<warden_protocols::ExecutionConfig>,
    /// A lockout it must come up in (journaled at the spawn): it was locked out elsewhere.
    pub(super) start_lockout: Option<warden_protocols::Lockout>,
    /// It comes up halted: as part of the standing fleet halt, or by a cause of its own.
    pub(super) start_halted: Option<StartHalted>,
}

/// How an agent comes up halted ([`AgentSpec::starting_halted`], [`AgentSpec::starting_stopped`]).
#[derive(Debug, Clone)]
pub(super) enum StartHalted {
    /// Part of the standing fleet halt: noted with it (a lift resumes it).
    Fleet,
    /// Halted by this cause: only a resume of the agent itself brings it back.
    By(warden_protocols::HaltCause),
}

impl std::fmt::Debug for AgentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSpec")
            .field("key", &self.key)
            .field("role", &self.role)
            .field("parent", &self.parent)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
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
            npc: None,
            goals: None,
            memory: None,
            permissions: None,
            execution: None,
            start_lockout: None,
            start_halted: None,
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

    /// The system prompt, the first message of every model request. Default: none.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// Adds a tool (replacing one of the same name).
    pub fn with_tool(mut self, tool: impl Tool) -> Self {
        self.tools.register(Arc::new(tool));
        self
    }

    /// Adds a shared tool (replacing one of the same name): one instance for many agents.
    pub fn with_tool_arc(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.register(tool);
        self
    }

    /// No `delegate` tool.
    pub fn without_delegation(mut self) -> Self {
        self.can_delegate = false;
        self
    }

    /// Gives this agent its own `[npc]` settings (how it classifies world events, its context
    /// buffer's bounds, its ticks and sleep schedule: `npc.tick`, `npc.sleep`) instead of the
    /// team's. The game clock (`npc.clock`) is the team's whatever this says.
    pub fn with_npc(mut self, npc: warden_protocols::npc::NpcConfig) -> Self {
        self.npc = Some(Box::new(npc));
        self
    }

    /// Gives this agent its own `[memory]` settings (compaction, reflection) instead of the
    /// team's. Out-of-range values fail the spawn ([`SpawnError::InvalidMemory`]).
    pub fn with_memory(mut self, memory: warden_protocols::MemoryConfig) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Gives this agent its own `[execution]` settings (single action or a ReAct loop, the
    /// per-tick cap, the context window, max-tokens recoveries) instead of the team's.
    /// Out-of-range values fail the spawn ([`SpawnError::InvalidExecution`]).
    pub fn with_execution(mut self, execution: warden_protocols::ExecutionConfig) -> Self {
        self.execution = Some(execution);
        self
    }

    /// Gives this agent its own permission policy (`[[agents]] permissions = { … }` over the
    /// team's `[permissions]`, [`warden_protocols::PermissionPolicy::agent`]) instead of the
    /// team's.
    pub fn with_permissions(mut self, policy: warden_protocols::PermissionPolicy) -> Self {
        self.permissions = Some(Box::new(policy));
        self
    }

    /// Gives the agent goals, carried in its system message, and the built-in `set_goals` tool to
    /// change them. `goals` are journaled (`goals_set`, by `team`) when the agent is spawned fresh;
    /// a restored agent keeps the goals its journal holds. Invalid goals
    /// ([`warden_protocols::check_goals`]) fail the spawn.
    pub fn with_goals(mut self, goals: Vec<String>) -> Self {
        self.goals = Some(goals);
        self
    }

    /// Comes up locked out (`SAFETY_LOCKOUT`, journaled at the spawn as a `locked_out` and a
    /// `state_changed`, before the agent reads anything): it was locked out where it ran before (a
    /// cluster node adopting an agent whose shared lockout says so). Only an authenticated unlock
    /// lifts it. Nothing is journaled if the record is locked out already.
    pub fn starting_locked_out(mut self, lockout: warden_protocols::Lockout) -> Self {
        self.start_lockout = Some(lockout);
        self
    }

    /// Comes up halted, as part of the standing fleet halt (its halt is raised before the agent
    /// reads anything, cause `halt_all`, and noted: a lift of the fleet halt resumes it).
    pub fn starting_halted(mut self) -> Self {
        self.start_halted = Some(StartHalted::Fleet);
        self
    }

    /// Comes up halted with `cause` (its halt raised before the agent reads anything), not noted
    /// with the fleet halt: only a resume of this agent brings it back. For a cluster node that
    /// adopts an agent an operator had halted on the node that died.
    pub fn starting_stopped(mut self, cause: warden_protocols::HaltCause) -> Self {
        self.start_halted = Some(StartHalted::By(cause));
        self
    }

    /// Starts from a record rebuilt from a journal instead of a fresh one (state, lockout, counters and
    /// history are kept as they were; its pending events are queued again, in id order, before any
    /// new work, keeping their ids).
    pub fn restored_from(mut self, record: AgentRecord) -> Self {
        self.restored = Some(Box::new(record));
        self
    }
}

/// Why a spawn failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnError {
    /// The settings given to [`AgentSpec::with_memory`] are out of range.
    #[error("{0}")]
    InvalidMemory(warden_protocols::ConfigError),
    /// The settings given to [`AgentSpec::with_execution`] are out of range.
    #[error("{0}")]
    InvalidExecution(warden_protocols::ConfigError),
    /// The goals given to [`AgentSpec::with_goals`] are invalid.
    #[error("invalid goals: {0}")]
    InvalidGoals(String),
    /// The team already has an agent with this key.
    #[error("an agent with key {0} already exists")]
    DuplicateKey(AgentKey),
    /// The record given to [`AgentSpec::restored_from`] belongs to another agent.
    #[error("restored record is for {found}, not {expected}")]
    RecordMismatch {
        /// The spec's key.
        expected: AgentKey,
        /// The record's key.
        found: AgentKey,
    },
}

/// No agent with that key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown agent {0}")]
pub struct UnknownAgent(pub AgentKey);

/// How a delegation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelegationError {
    /// Not delegated: decided before anything was queued, and journaled on the delegator
    /// (budget, hops, unknown or locked-out delegate, …).
    #[error("delegation refused: {0}")]
    Refused(DelegationRefusal),
    /// The delegate took the task but produced no answer.
    #[error("delegation failed: {0}")]
    Failed(TaskError),
    /// No answer within `safety.timeout.chain_seconds` (and the limit checkpoint refused to wait
    /// longer); the value is how long the delegator waited, in milliseconds.
    #[error("delegate timed out after {0} ms")]
    TimedOut(u64),
    /// The delegate dropped the task unanswered: halted, crashed or shut down.
    #[error("delegate dropped the task (halted, crashed or shut down)")]
    Abandoned,
}

/// Why [`Supervisor::set_ticks`] changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TickConfigError {
    /// No agent with that key.
    #[error(transparent)]
    UnknownAgent(#[from] UnknownAgent),
    /// A value out of range.
    #[error(transparent)]
    Invalid(warden_protocols::ConfigError),
}
