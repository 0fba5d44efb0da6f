//! The [`Tool`] trait, what a call knows ([`ToolContext`]), how it can fail ([`ToolError`]), and
//! [`FnTool`], a tool made from a closure.

use futures::future::BoxFuture;
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use warden_protocols::{AgentKey, ToolCategory, ToolSpec};

/// What a tool knows about the call.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The calling agent.
    pub agent: AgentKey,
    /// The model's id for this call (`call_…`), unique within the turn.
    pub call_id: String,
    /// The delegation chain of the task being worked on, root first, ending with `agent`.
    pub lineage: Arc<[AgentKey]>,
}

/// Why a tool call failed. The model sees the message as the tool's result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The tool failed (or its circuit refused the call). Counts against its circuit.
    #[error("{0}")]
    Failed(String),
    /// The arguments do not fit the tool's schema, or are not JSON: the model's mistake, which
    /// does not count against the circuit.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// No tool of that name is registered for the agent.
    #[error("unknown tool `{0}`")]
    Unknown(String),
    /// The call ran past its timeout ([`Tool::timeout`], else `tools.timeout_seconds`) and was
    /// dropped. Counts against its circuit.
    #[error("tool timed out after {after_ms} ms")]
    Timeout {
        /// The timeout that elapsed, in milliseconds.
        after_ms: u64,
    },
    /// The tool panicked (in `call` or in its future); the panic was caught. Counts against its
    /// circuit.
    #[error("tool panicked: {0}")]
    Panicked(String),
    /// The permission gate refused the call (`[permissions]`): the tool did not run. The text says
    /// which tool, which key refused it and what to change. Counts against nothing: not the
    /// circuit, not the agent's breakers.
    #[error("{0}")]
    Refused(String),
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
    fn cache_policy(&self) -> super::CachePolicy {
        super::CachePolicy::disabled()
    }

    /// Whether the agent's per-tool circuit breaker guards this tool. Default: yes. (`delegate` says
    /// no: one failing delegate must not open a circuit that blocks delegation to every other agent;
    /// the supervisor refuses locked-out delegates itself.)
    fn circuit_breaker(&self) -> bool {
        true
    }

    /// Its own retry settings for a call that failed with a retryable error
    /// ([`super::retry`]); `None` (the default): the runner's (`[tools.retry]` for an agent's).
    fn retry(&self) -> Option<warden_protocols::ToolRetryConfig> {
        None
    }

    /// Whether calling it twice with the same arguments has the effect of calling it once. A
    /// DANGEROUS tool is retried only when it says so. Default false.
    fn idempotent(&self) -> bool {
        false
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
    fn cache_policy(&self) -> super::CachePolicy {
        (**self).cache_policy()
    }
    fn circuit_breaker(&self) -> bool {
        (**self).circuit_breaker()
    }
    fn retry(&self) -> Option<warden_protocols::ToolRetryConfig> {
        (**self).retry()
    }
    fn idempotent(&self) -> bool {
        (**self).idempotent()
    }
}

/// A tool made from a closure (for embedding code, tests and the demo).
pub struct FnTool<F> {
    spec: ToolSpec,
    f: F,
    retry: Option<warden_protocols::ToolRetryConfig>,
    idempotent: bool,
}

impl<F> std::fmt::Debug for FnTool<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl<F, Fut> FnTool<F>
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    /// A tool named `name` that runs `f(args, ctx)` for each call. Its parameters schema is
    /// `{"type": "object"}` (any object) until [`FnTool::with_parameters`]; not cached, behind a
    /// circuit, timed out by `tools.timeout_seconds`.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use serde_json::json;
    /// use warden_actors::{FnTool, Tool, ToolContext, ToolError};
    /// use warden_protocols::{AgentKey, ToolCategory};
    ///
    /// let open = FnTool::new("open_door", "Opens a door", ToolCategory::Terminal, |args, ctx| async move {
    ///     match args["door"].as_str() {
    ///         Some(door) => Ok(json!({"opened": door, "by": ctx.agent.as_str()})),
    ///         None => Err(ToolError::InvalidArguments("`door` must be a string".into())),
    ///     }
    /// })
    /// .with_parameters(json!({"type": "object", "properties": {"door": {"type": "string"}}}));
    /// assert_eq!(open.spec().name, "open_door");
    ///
    /// let ctx = ToolContext {
    ///     agent: AgentKey::new("rogue"),
    ///     call_id: "call_1".into(),
    ///     lineage: Arc::from([AgentKey::new("rogue")]),
    /// };
    /// let value = futures::executor::block_on(open.call(json!({"door": "north"}), ctx)).unwrap();
    /// assert_eq!(value, json!({"opened": "north", "by": "rogue"}));
    /// ```
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
            retry: None,
            idempotent: false,
        }
    }

    /// Sets the JSON schema of the arguments.
    pub fn with_parameters(mut self, schema: Value) -> Self {
        self.spec.parameters = schema;
        self
    }

    /// Its own retry settings ([`Tool::retry`]) instead of the runner's.
    pub fn with_retry(mut self, retry: warden_protocols::ToolRetryConfig) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Declares it idempotent ([`Tool::idempotent`]): a DANGEROUS one is then retried too.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
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

    fn retry(&self) -> Option<warden_protocols::ToolRetryConfig> {
        self.retry
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }
}
