//! What to spawn ([`AgentSpec`]) and why a spawn, a lookup or a delegation failed.

use super::*;

/// What to spawn.
pub struct AgentSpec {
    pub(super) key: AgentKey,
    pub(super) role: AgentRole,
    pub(super) parent: Option<AgentKey>,
    pub(super) system_prompt: Option<String>,
    pub(super) provider: Arc<dyn Provider>,
    pub(super) tools: ToolRegistry,
    pub(super) can_delegate: bool,
    pub(super) restored: Option<AgentRecord>,
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
