//! Tools: the [`Tool`] trait, the per-agent [`ToolRegistry`], and the errors a tool call can end with.
//!
//! A tool's future runs inside the agent's turn. The agent checks for a pending halt immediately before
//! starting it (so no tool starts after a halt), bounds it with a timeout, and catches a panic inside it
//! (counted as a failed call).

use futures::future::BoxFuture;
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use warden_protocols::{AgentKey, ToolCategory, ToolSpec};

/// What a tool knows about the call.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The calling agent.
    pub agent: AgentKey,
    pub call_id: String,
    /// The delegation chain of the task being worked on, root first, ending with `agent`.
    pub lineage: Arc<[AgentKey]>,
}

/// Why a tool call failed. The model sees the message as the tool's result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Failed(String),
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("unknown tool `{0}`")]
    Unknown(String),
    #[error("tool timed out after {after_ms} ms")]
    Timeout { after_ms: u64 },
    #[error("tool panicked: {0}")]
    Panicked(String),
}

/// A tool an agent can call.
pub trait Tool: Send + Sync + 'static {
    /// Name, description, JSON-schema parameters and category.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool. `args` is the parsed arguments object.
    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>>;

    /// Per-call timeout; `None` uses `tools.timeout_seconds`.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Whether successful results may be cached (scope `tick` or `session`, TTL). Default: never.
    /// Never make a TERMINAL or DANGEROUS tool cacheable: a cache hit skips its side effect.
    fn cache_policy(&self) -> crate::toolkit::CachePolicy {
        crate::toolkit::CachePolicy::disabled()
    }

    /// Whether the agent's per-tool circuit breaker guards this tool. Default: yes. (`delegate` says
    /// no: one failing delegate must not open a circuit that blocks delegation to every other agent;
    /// the supervisor refuses locked-out delegates itself.)
    fn circuit_breaker(&self) -> bool {
        true
    }
}

impl<T: Tool + ?Sized> Tool for Arc<T> {
    fn spec(&self) -> ToolSpec {
        (**self).spec()
    }
    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        (**self).call(args, ctx)
    }
    fn timeout(&self) -> Option<Duration> {
        (**self).timeout()
    }
    fn cache_policy(&self) -> crate::toolkit::CachePolicy {
        (**self).cache_policy()
    }
    fn circuit_breaker(&self) -> bool {
        (**self).circuit_breaker()
    }
}

/// A tool made from a closure (for embedding code, tests and the demo).
pub struct FnTool<F> {
    spec: ToolSpec,
    f: F,
}

impl<F, Fut> FnTool<F>
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        category: ToolCategory,
        f: F,
    ) -> Self {
        FnTool {
            spec: ToolSpec {
                name: name.into(),
                description: description.into(),
                parameters: serde_json::json!({"type": "object"}),
                category,
            },
            f,
        }
    }

    /// Sets the JSON schema of the arguments.
    pub fn with_parameters(mut self, schema: Value) -> Self {
        self.spec.parameters = schema;
        self
    }
}

impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin((self.f)(args, ctx))
    }
}

/// The tools of one agent, by name.
///
/// A short vector sorted by name (agents have a handful of tools; a hash map per agent would cost
/// more memory than it saves time). Specs are shared by `Arc`, so a tool registered with many agents
/// (the supervisor's `delegate`) keeps one copy of its JSON schema.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<(Arc<ToolSpec>, Arc<dyn Tool>)>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a tool under its spec's name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        let spec = Arc::new(tool.spec());
        self.register_with_spec(spec, tool);
    }

    /// Adds (or replaces) a tool whose spec is already built and shared.
    pub(crate) fn register_with_spec(&mut self, spec: Arc<ToolSpec>, tool: Arc<dyn Tool>) {
        match self.position(&spec.name) {
            Ok(i) => self.tools[i] = (spec, tool),
            Err(i) => self.tools.insert(i, (spec, tool)),
        }
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.tools
            .binary_search_by(|(spec, _)| spec.name.as_str().cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<(&ToolSpec, &Arc<dyn Tool>)> {
        let i = self.position(name).ok()?;
        self.tools.get(i).map(|(s, t)| (&**s, t))
    }

    /// Specs sorted by name (a stable prompt).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|(s, _)| (**s).clone()).collect()
    }

    /// Names sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|(s, _)| s.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}
