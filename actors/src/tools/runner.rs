//! [`ToolRunner`]: the pipeline of one tool call (see the module docs of `tools` for its order).

use super::{
    cache::{CachePolicy, ToolResultCache},
    circuit::{CircuitConfig, CircuitPermit, CircuitRejection, CircuitTransition, ToolCircuits},
    schema, Tool, ToolContext, ToolError, ToolRegistry,
};
use futures::FutureExt;
use serde_json::Value;
use std::{collections::HashMap, panic::AssertUnwindSafe, sync::Arc, time::Duration};
use warden_protocols::ToolCategory;

/// How the runner treats one tool. The default: validate arguments, use the circuit, do not cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolPolicy {
    /// Whether and how results are cached (default: not cached).
    pub cache: CachePolicy,
    /// Check the arguments against the spec's `parameters` before running.
    pub validate_arguments: bool,
    /// Put the tool behind a circuit breaker.
    pub circuit_breaker: bool,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        ToolPolicy {
            cache: CachePolicy::disabled(),
            validate_arguments: true,
            circuit_breaker: true,
        }
    }
}

impl ToolPolicy {
    /// The default policy with `cache`.
    pub fn cached(cache: CachePolicy) -> Self {
        ToolPolicy {
            cache,
            ..Self::default()
        }
    }
}

/// What the circuit did for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CircuitStep {
    /// Not consulted: unknown tool, or the tool's policy has no circuit breaker.
    NotChecked,
    /// Refused; the tool did not run. `ToolRun::result` is the refusal as a [`ToolError::Failed`].
    Rejected(CircuitRejection),
    /// Let through (`probe`: as the single half-open probe); `transition` is the state change its
    /// outcome caused, if any (none when the outcome was not recorded: invalid arguments, cache hit).
    Admitted {
        /// The call was the circuit's single half-open probe.
        probe: bool,
        /// The state change the call's outcome caused; `None` for none or not recorded.
        transition: Option<CircuitTransition>,
    },
}

/// The outcome of one tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRun {
    /// The tool's value, or why there is none (the model sees either, see [`ToolRun::content`]).
    pub result: Result<Value, ToolError>,
    /// The value came from the cache; the tool did not run.
    pub cached: bool,
    /// The tool's `call` was actually invoked.
    pub executed: bool,
    /// What the circuit did.
    pub circuit: CircuitStep,
    /// The tool's category; `None` for an unknown tool.
    pub category: Option<ToolCategory>,
}

impl ToolRun {
    /// Whether the circuit refused the call.
    pub fn rejected_by_circuit(&self) -> bool {
        matches!(self.circuit, CircuitStep::Rejected(_))
    }

    /// The tool message content the model sees: the value's JSON, or
    /// `{"success":false,"error":"…"}` (the same shape the agent's turn uses today).
    pub fn content(&self) -> String {
        match &self.result {
            Ok(value) => value.to_string(),
            Err(error) => {
                serde_json::json!({"success": false, "error": error.to_string()}).to_string()
            }
        }
    }
}

/// Parses the model's argument text; blank text is `{}`.
///
/// # Errors
/// [`ToolError::InvalidArguments`] when the text is not valid JSON.
pub fn parse_arguments(raw: &str) -> Result<Value, ToolError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    serde_json::from_str(raw)
        .map_err(|e| ToolError::InvalidArguments(format!("arguments are not valid JSON: {e}")))
}

/// Result of [`ToolRunner::admit`].
pub enum Admission<'a> {
    /// Everything before execution passed: run it with [`PendingCall::execute`] (or drop it).
    Ready(PendingCall<'a>),
    /// Decided without running the tool: unknown tool, circuit refusal, invalid arguments, cache hit.
    Finished(ToolRun),
}

impl std::fmt::Debug for Admission<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Admission::Ready(_) => f.write_str("Admission::Ready"),
            Admission::Finished(run) => f.debug_tuple("Admission::Finished").field(run).finish(),
        }
    }
}

/// A call that passed the circuit, validation and the cache, and may now run.
pub struct PendingCall<'a> {
    runner: &'a ToolRunner,
    name: String,
    tool: Arc<dyn Tool>,
    category: ToolCategory,
    args: Value,
    policy: ToolPolicy,
    permit: Option<CircuitPermit<'a>>,
}

impl std::fmt::Debug for PendingCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingCall")
            .field("name", &self.name)
            .field("category", &self.category)
            .field("probe", &self.is_probe())
            .finish_non_exhaustive()
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Whether an error the tool itself returned says something about the tool's health.
fn counts_against_circuit(error: &ToolError) -> bool {
    matches!(
        error,
        ToolError::Failed(_) | ToolError::Timeout { .. } | ToolError::Panicked(_)
    )
}

impl PendingCall<'_> {
    /// The tool's name.
    pub fn tool_name(&self) -> &str {
        &self.name
    }

    /// The tool's category (`SAFE_CHAIN`, `TERMINAL`, `DANGEROUS`): a caller may refuse a second
    /// `DANGEROUS` call of a turn before running it.
    pub fn category(&self) -> ToolCategory {
        self.category
    }

    /// Whether this call is its circuit's half-open probe.
    pub fn is_probe(&self) -> bool {
        self.permit.as_ref().is_some_and(CircuitPermit::is_probe)
    }

    /// Runs the tool (timeout: `Tool::timeout()` or `default_timeout`, per attempt), retrying an
    /// attempt that failed with a retryable error ([`super::retry`]), records the final outcome
    /// on the circuit and stores a successful result in the cache.
    ///
    /// # Cancel safety
    /// Dropping the future (a halt) drops the tool's future or the wait between attempts,
    /// wherever it is; its outcome is not recorded and a half-open probe frees its slot, so the
    /// circuit is never left stuck. Side effects the tool already had stay done.
    pub async fn execute(self, ctx: ToolContext, default_timeout: Duration) -> ToolRun {
        // `Unobserved` never stops the retries: there is always a run.
        self.execute_observed(ctx, default_timeout, &super::Unobserved)
            .await
            .unwrap_or_else(unreachable_run)
    }

    /// [`PendingCall::execute`], telling `observer` of each retry and asking it before each:
    /// `None` when it stopped them (a halt); the call's outcome is then not recorded, as when
    /// the future is dropped.
    ///
    /// # Cancel safety
    /// As [`PendingCall::execute`].
    pub async fn execute_observed(
        self,
        ctx: ToolContext,
        default_timeout: Duration,
        observer: &dyn super::RetryObserver,
    ) -> Option<ToolRun> {
        let PendingCall {
            runner,
            name,
            tool,
            category,
            args,
            policy,
            permit,
        } = self;
        let probe = permit.as_ref().map(CircuitPermit::is_probe);
        let cache_args = policy.cache.cacheable.then(|| args.clone());
        let timeout = tool.timeout().unwrap_or(default_timeout);
        let retry = runner.retry_of(&*tool, category);
        let mut attempt = 1;
        let result = loop {
            let result = attempt_once(&*tool, args.clone(), ctx.clone(), timeout).await;
            match &result {
                Err(error) if attempt < retry.max_attempts && super::is_retryable(error) => {
                    let delay = super::retry::delay_after(&retry, attempt);
                    observer.retrying(attempt, retry.max_attempts, error, delay);
                    tokio::time::sleep(delay).await;
                    if !observer.may_retry() {
                        return None;
                    }
                    attempt += 1;
                }
                _ => break result,
            }
        };
        let transition = match (permit, &result) {
            (None, _) => None,
            (Some(permit), Ok(_)) => permit.succeeded(),
            (Some(permit), Err(error)) if counts_against_circuit(error) => permit.failed(),
            (Some(permit), Err(_)) => {
                drop(permit);
                None
            }
        };
        if let Some(args) = cache_args {
            runner.cache.store(&name, &args, &result, &policy.cache);
        }
        Some(ToolRun {
            result,
            cached: false,
            executed: true,
            circuit: match probe {
                None => CircuitStep::NotChecked,
                Some(probe) => CircuitStep::Admitted { probe, transition },
            },
            category: Some(category),
        })
    }
}

/// One attempt of a call: the tool's future under `timeout`, its panics caught.
async fn attempt_once(
    tool: &dyn Tool,
    args: Value,
    ctx: ToolContext,
    timeout: Duration,
) -> Result<Value, ToolError> {
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| tool.call(args, ctx)));
    match started {
        Err(payload) => Err(ToolError::Panicked(panic_message(payload))),
        Ok(future) => {
            match tokio::time::timeout(timeout, AssertUnwindSafe(future).catch_unwind()).await {
                Err(_elapsed) => Err(ToolError::Timeout {
                    after_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                }),
                Ok(Err(payload)) => Err(ToolError::Panicked(panic_message(payload))),
                Ok(Ok(result)) => result,
            }
        }
    }
}

/// The run [`PendingCall::execute`] would give if its retries were stopped, which `Unobserved`
/// never does: a failed call, so that nothing here can panic.
fn unreachable_run() -> ToolRun {
    ToolRun {
        result: Err(ToolError::Failed("the call's retries were stopped".into())),
        cached: false,
        executed: true,
        circuit: CircuitStep::NotChecked,
        category: None,
    }
}

/// Circuit breakers, argument validation and a result cache for one agent's tools.
#[derive(Debug, Default)]
pub struct ToolRunner {
    circuits: ToolCircuits,
    cache: ToolResultCache,
    policies: HashMap<String, ToolPolicy>,
    default_policy: ToolPolicy,
    /// The retries of a tool without its own ([`Tool::retry`]); `None`: one attempt.
    retry: Option<warden_protocols::ToolRetryConfig>,
}

impl ToolRunner {
    /// A runner whose circuits use `circuit`; every tool gets the default [`ToolPolicy`].
    pub fn new(circuit: CircuitConfig) -> Self {
        ToolRunner {
            circuits: ToolCircuits::new(circuit),
            ..Self::default()
        }
    }

    /// Sets `tool`'s policy.
    pub fn with_policy(mut self, tool: impl Into<String>, policy: ToolPolicy) -> Self {
        self.policies.insert(tool.into(), policy);
        self
    }

    /// Sets the policy of tools without their own.
    pub fn with_default_policy(mut self, policy: ToolPolicy) -> Self {
        self.default_policy = policy;
        self
    }

    /// Retries a failed call of a tool without its own settings ([`Tool::retry`]) this way when
    /// its error is retryable (an agent's runner: `[tools.retry]`). Without it such a tool is
    /// tried once.
    pub fn with_retry(mut self, retry: warden_protocols::ToolRetryConfig) -> Self {
        self.retry = Some(retry);
        self
    }

    /// The retries a call of `tool` gets: its own, else the runner's; one attempt for a
    /// DANGEROUS tool that is not idempotent.
    pub fn retry_of(
        &self,
        tool: &dyn Tool,
        category: ToolCategory,
    ) -> warden_protocols::ToolRetryConfig {
        let once = warden_protocols::ToolRetryConfig::none();
        if category == ToolCategory::Dangerous && !tool.idempotent() {
            return once;
        }
        tool.retry().or(self.retry).unwrap_or(once)
    }

    /// Replaces the (empty) cache, e.g. to change its capacity.
    pub fn with_cache(mut self, cache: ToolResultCache) -> Self {
        self.cache = cache;
        self
    }

    /// `name`'s policy: the one set with [`ToolRunner::with_policy`], else the default policy with
    /// the tool's own [`Tool::cache_policy`] and [`Tool::circuit_breaker`] applied.
    pub fn policy(&self, name: &str, tool: &dyn Tool) -> ToolPolicy {
        if let Some(policy) = self.policies.get(name) {
            return *policy;
        }
        let mut policy = self.default_policy;
        let cache = tool.cache_policy();
        if cache.cacheable {
            policy.cache = cache;
        }
        policy.circuit_breaker &= tool.circuit_breaker();
        policy
    }

    /// The per-tool circuit breakers (for status and tests).
    pub fn circuits(&self) -> &ToolCircuits {
        &self.circuits
    }

    /// The result cache.
    pub fn cache(&self) -> &ToolResultCache {
        &self.cache
    }

    /// Ends a tick: drops `Tick`-scoped cache entries.
    pub fn clear_tick(&self) {
        self.cache.clear_tick();
    }

    /// Steps 1–4: decides whether `name` may run with `args`, without running it.
    pub fn admit(&self, registry: &ToolRegistry, name: &str, args: Value) -> Admission<'_> {
        let Some((spec, tool)) = registry.get(name) else {
            return Admission::Finished(ToolRun {
                result: Err(ToolError::Unknown(name.to_owned())),
                cached: false,
                executed: false,
                circuit: CircuitStep::NotChecked,
                category: None,
            });
        };
        let category = spec.category;
        let policy = self.policy(name, &**tool);
        let finished = |result, cached, circuit| {
            Admission::Finished(ToolRun {
                result,
                cached,
                executed: false,
                circuit,
                category: Some(category),
            })
        };
        let permit = if policy.circuit_breaker {
            match self.circuits.try_acquire(name) {
                Ok(permit) => Some(permit),
                Err(rejection) => {
                    let error = ToolError::Failed(rejection.to_string());
                    return finished(Err(error), false, CircuitStep::Rejected(rejection));
                }
            }
        } else {
            None
        };
        // From here on an early return drops the permit unrecorded.
        let admitted = |permit: &Option<CircuitPermit<'_>>| match permit {
            None => CircuitStep::NotChecked,
            Some(p) => CircuitStep::Admitted {
                probe: p.is_probe(),
                transition: None,
            },
        };
        if policy.validate_arguments {
            if let Err(errors) = schema::validate(&spec.parameters, &args) {
                let error = ToolError::InvalidArguments(errors.to_string());
                return finished(Err(error), false, admitted(&permit));
            }
        }
        if policy.cache.cacheable {
            if let Some(value) = self.cache.get(name, &args) {
                return finished(Ok(value), true, admitted(&permit));
            }
        }
        Admission::Ready(PendingCall {
            runner: self,
            name: name.to_owned(),
            tool: tool.clone(),
            category,
            args,
            policy,
            permit,
        })
    }

    /// The whole pipeline: [`ToolRunner::admit`], then [`PendingCall::execute`] if admitted. Every
    /// failure is in [`ToolRun::result`] (nothing panics on model data); `default_timeout` applies
    /// unless the tool sets its own [`Tool::timeout`].
    ///
    /// # Cancel safety
    /// As [`PendingCall::execute`]: dropping the future leaves no circuit stuck and caches nothing.
    ///
    /// # Examples
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use serde_json::json;
    /// use warden_actors::{CircuitConfig, FnTool, ToolContext, ToolError, ToolRegistry, ToolRunner};
    /// use warden_protocols::{AgentKey, ToolCategory};
    ///
    /// let dice = FnTool::new("roll", "Rolls a die", ToolCategory::SafeChain, |args, _ctx| async move {
    ///     Ok(json!({"sides": args["sides"], "result": 4}))
    /// })
    /// .with_parameters(json!({
    ///     "type": "object",
    ///     "properties": {"sides": {"type": "integer"}},
    ///     "required": ["sides"]
    /// }));
    /// let mut registry = ToolRegistry::new();
    /// registry.register(Arc::new(dice));
    /// let runner = ToolRunner::new(CircuitConfig::default());
    /// let ctx = ToolContext {
    ///     agent: AgentKey::new("gm"),
    ///     call_id: "call_1".into(),
    ///     lineage: Arc::from([AgentKey::new("gm")]),
    /// };
    /// # actix_rt::System::new().block_on(async {
    /// let run = runner
    ///     .run(&registry, "roll", json!({"sides": 6}), ctx.clone(), Duration::from_secs(5))
    ///     .await;
    /// assert_eq!(run.result, Ok(json!({"sides": 6, "result": 4})));
    /// assert!(run.executed);
    ///
    /// // Invalid arguments are the model's mistake: the tool does not run.
    /// let run = runner.run(&registry, "roll", json!({}), ctx, Duration::from_secs(5)).await;
    /// assert!(matches!(run.result, Err(ToolError::InvalidArguments(_))));
    /// assert!(!run.executed);
    /// # });
    /// ```
    pub async fn run(
        &self,
        registry: &ToolRegistry,
        name: &str,
        args: Value,
        ctx: ToolContext,
        default_timeout: Duration,
    ) -> ToolRun {
        match self.admit(registry, name, args) {
            Admission::Finished(run) => run,
            Admission::Ready(call) => call.execute(ctx, default_timeout).await,
        }
    }
}
