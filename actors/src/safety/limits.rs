//! The limit checkpoint: one function, [`LimitCheckpoint::handle_limit_exceeded`], for every
//! checkpointed limit (iterations per task / per tick, steps, agent hops, sub-agent budget, task wall
//! clock, chain wait, LLM call time).
//!
//! ```text
//! limit hit
//!   ├─ unattended  ──► refuse, unattended
//!   ├─ auto_extend ──► granted < auto_extend_times for (run, kind) → allow, auto_extended
//!   │                  otherwise                                   → refuse, auto_extend_exhausted
//!   └─ interactive
//!        ├─ no bus       ──► refuse, no_bus
//!        └─ ask the bus  ──► yes → allow, user_approved
//!                            no / other answer / bus error → refuse, user_refused
//!                            ask_timeout_seconds elapsed (0 = wait forever) → refuse, ask_timeout
//! ```
//!
//! # Invariants
//! * Fail closed: every path that is not an explicit auto-extension or an explicit operator "yes"
//!   refuses.
//! * Auto-extensions are counted per (run id, limit kind) exactly: `auto_extend_times` allows, then
//!   refusals. Operator approvals are counted in the same table (for `LimitDecision::extension`) but
//!   never exhaust.
//! * While interactive, the caller should hold the agent in `WAITING_FOR_INPUT` and race the ask
//!   against its halt token (a halt drops the ask future, which withdraws the question).
//! * Every refusal has a decision-enabling text ([`limit_refusal_message`]).

use super::intervention::InterventionBus;
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use warden_protocols::{
    AgentKey, Answer, Intervention, LimitDecision, LimitKind, LimitReason, OnLimitMode,
    SafetyOnLimitConfig,
};

/// What was exceeded, where.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitContext {
    /// The run (task) id; auto-extensions are counted per (run id, kind).
    pub run_id: String,
    pub agent: AgentKey,
    pub kind: LimitKind,
    /// The value reached (count, or seconds).
    pub current: f64,
    /// The limit in force (count, or seconds), extensions included.
    pub configured: f64,
    /// Whether the run has produced something usable so far.
    pub partial_results: bool,
}

/// The checkpoint: the `safety.on_limit` policy, an optional bus and the extension counts.
/// Share one per supervisor (or per agent) with `Arc`.
pub struct LimitCheckpoint {
    config: SafetyOnLimitConfig,
    bus: Option<Arc<dyn InterventionBus>>,
    granted: Mutex<HashMap<(String, LimitKind), u32>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for LimitCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitCheckpoint")
            .field("config", &self.config)
            .field("bus", &self.bus.is_some())
            .finish()
    }
}

impl LimitCheckpoint {
    pub fn new(config: SafetyOnLimitConfig, bus: Option<Arc<dyn InterventionBus>>) -> Self {
        LimitCheckpoint {
            config,
            bus,
            granted: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn mode(&self) -> OnLimitMode {
        self.config.mode
    }

    /// Extensions granted so far for (run, kind).
    pub fn granted(&self, run_id: &str, kind: LimitKind) -> u32 {
        self.granted
            .lock()
            .get(&(run_id.to_owned(), kind))
            .copied()
            .unwrap_or(0)
    }

    /// Forgets a finished run's counts.
    pub fn forget_run(&self, run_id: &str) {
        self.granted.lock().retain(|(run, _), _| run != run_id);
    }

    fn grant(&self, ctx: &LimitContext, reason: LimitReason, cap: Option<u32>) -> LimitDecision {
        let mut granted = self.granted.lock();
        let n = granted.entry((ctx.run_id.clone(), ctx.kind)).or_insert(0);
        if let Some(cap) = cap {
            if *n >= cap {
                return LimitDecision::refuse(LimitReason::AutoExtendExhausted);
            }
        }
        *n = n.saturating_add(1);
        LimitDecision {
            allow: true,
            extension: *n,
            reason,
        }
    }

    /// Decides whether the operation that hit the limit may continue (with one more configured
    /// amount). Never panics, never errs: every failure refuses.
    pub async fn handle_limit_exceeded(&self, ctx: &LimitContext) -> LimitDecision {
        let decision = match self.config.mode {
            OnLimitMode::Unattended => LimitDecision::refuse(LimitReason::Unattended),
            OnLimitMode::AutoExtend => self.grant(
                ctx,
                LimitReason::AutoExtended,
                Some(self.config.auto_extend_times),
            ),
            OnLimitMode::Interactive => self.ask(ctx).await,
        };
        tracing::info!(
            agent = %ctx.agent, run = %ctx.run_id, kind = %ctx.kind, current = ctx.current,
            configured = ctx.configured, allow = decision.allow, reason = %decision.reason,
            "limit checkpoint"
        );
        decision
    }

    async fn ask(&self, ctx: &LimitContext) -> LimitDecision {
        let Some(bus) = &self.bus else {
            return LimitDecision::refuse(LimitReason::NoBus);
        };
        let intervention = Intervention {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            agent: ctx.agent.clone(),
            run_id: ctx.run_id.clone(),
            kind: ctx.kind,
            current: ctx.current,
            configured: ctx.configured,
            config_key: ctx.kind.config_key().to_owned(),
            question: limit_question(ctx),
        };
        let asked = bus.ask(intervention);
        let answer = match ask_timeout(self.config.ask_timeout_seconds) {
            None => asked.await,
            Some(limit) => match tokio::time::timeout(limit, asked).await {
                Ok(answer) => answer,
                Err(_elapsed) => return LimitDecision::refuse(LimitReason::AskTimeout),
            },
        };
        match answer {
            Ok(Answer::Yes) => self.grant(ctx, LimitReason::UserApproved, None),
            Ok(Answer::No | Answer::Other(_)) => LimitDecision::refuse(LimitReason::UserRefused),
            Err(error) => {
                tracing::warn!(agent = %ctx.agent, %error, "intervention bus failed; refusing");
                LimitDecision::refuse(LimitReason::UserRefused)
            }
        }
    }
}

/// `None` = wait forever (0, or an unusable value — validation refuses those anyway).
fn ask_timeout(seconds: f64) -> Option<Duration> {
    if seconds > 0.0 {
        Duration::try_from_secs_f64(seconds).ok()
    } else {
        None
    }
}

fn value(kind: LimitKind, v: f64) -> String {
    format!("{v}{}", kind.unit())
}

/// The operator's yes/no question.
pub fn limit_question(ctx: &LimitContext) -> String {
    format!(
        "Agent {} reached its limit on {}: {} against a configured {} (`{}`). Allow it to continue for another {}? (yes/no)",
        ctx.agent,
        ctx.kind.describe(),
        value(ctx.kind, ctx.current),
        value(ctx.kind, ctx.configured),
        ctx.kind.config_key(),
        value(ctx.kind, ctx.configured),
    )
}

/// The decision-enabling fallback text for a refusal: which limit, its configured value, the key to
/// raise, the `safety.on_limit.mode` to set, and whether partial results exist.
pub fn limit_refusal_message(
    ctx: &LimitContext,
    decision: &LimitDecision,
    auto_extend_times: u32,
) -> String {
    let key = ctx.kind.config_key();
    let configured = value(ctx.kind, ctx.configured);
    let how = match decision.reason {
        LimitReason::AutoExtendExhausted => format!(
            "raise `{key}` above {configured}, raise `safety.on_limit.auto_extend_times` (now {auto_extend_times}), or set `safety.on_limit.mode = \"interactive\"` to be asked"
        ),
        LimitReason::NoBus => format!(
            "raise `{key}` above {configured}, attach an operator (intervention bus) for `safety.on_limit.mode = \"interactive\"`, or set `safety.on_limit.mode = \"auto_extend\"` to extend automatically"
        ),
        LimitReason::AskTimeout => format!(
            "raise `{key}` above {configured}, raise `safety.on_limit.ask_timeout_seconds` (0 waits forever), or set `safety.on_limit.mode = \"auto_extend\"` to extend automatically"
        ),
        LimitReason::UserRefused => format!(
            "raise `{key}` above {configured}, or set `safety.on_limit.mode = \"auto_extend\"` to extend automatically"
        ),
        LimitReason::Unattended
        | LimitReason::AutoExtended
        | LimitReason::UserApproved => format!(
            "raise `{key}` above {configured}, or set `safety.on_limit.mode` to \"interactive\" (ask an operator) or \"auto_extend\" (extend automatically)"
        ),
    };
    let partial = if ctx.partial_results {
        "Partial results are available."
    } else {
        "No partial results are available."
    };
    format!(
        "Stopped: the limit on {} was reached ({} against a configured {}) and not extended ({}). To allow more, {how}. {partial}",
        ctx.kind.describe(),
        value(ctx.kind, ctx.current),
        configured,
        decision.reason,
    )
}
