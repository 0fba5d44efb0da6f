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
//!   refusals. A run's counts are dropped when its agent begins its next task
//!   ([`LimitCheckpoint::forget_run`]), so the table holds at most one run per agent. Operator approvals are counted in the same table (for `LimitDecision::extension`) but
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
    OperatorReply, SafetyOnLimitConfig,
};

/// What was exceeded, where.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitContext {
    /// The run (task) id; auto-extensions are counted per (run id, kind).
    pub run_id: String,
    /// The agent that hit the limit.
    pub agent: AgentKey,
    /// Which limit.
    pub kind: LimitKind,
    /// The value reached (count, or seconds).
    pub current: f64,
    /// The limit in force (count, or seconds), extensions included.
    pub configured: f64,
    /// Whether the run has produced something usable so far.
    pub partial_results: bool,
    /// What one extension grants (count, or seconds): the question promises exactly this.
    pub extension: f64,
}

/// The checkpoint: the `safety.on_limit` policy, an optional bus and the extension counts.
/// Share one per supervisor (or per agent) with `Arc`.
pub struct LimitCheckpoint {
    config: SafetyOnLimitConfig,
    bus: Option<Arc<dyn InterventionBus>>,
    granted: Mutex<HashMap<(String, LimitKind), u32>>,
    /// Intervention ids, shared with the permission gate (one bus, one id space).
    next_id: Arc<AtomicU64>,
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
    /// A checkpoint applying `config` (`safety.on_limit`); `bus` is where interactive asks go
    /// (`None`: they are refused as `no_bus`).
    pub fn new(config: SafetyOnLimitConfig, bus: Option<Arc<dyn InterventionBus>>) -> Self {
        LimitCheckpoint {
            config,
            bus,
            granted: Mutex::new(HashMap::new()),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// The bus asks go to, and the id counter of its asks: the permission gate asks through the
    /// same bus with ids from the same counter (the bus refuses a duplicate id).
    pub(crate) fn bus_and_ids(&self) -> (Option<Arc<dyn InterventionBus>>, Arc<AtomicU64>) {
        (self.bus.clone(), self.next_id.clone())
    }

    /// The configured mode: unattended, auto-extend or interactive.
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

    /// Forgets a finished run's counts (an agent calls it when its next task begins: a task runs
    /// on across ticks until then, so its counts must too).
    pub fn forget_run(&self, run_id: &str) {
        self.granted.lock().retain(|(run, _), _| run != run_id);
    }

    /// How many runs have counts kept (at most one per agent: the task it is on).
    pub fn runs_tracked(&self) -> usize {
        let granted = self.granted.lock();
        let mut runs: Vec<&str> = granted.keys().map(|(run, _)| run.as_str()).collect();
        runs.sort_unstable();
        runs.dedup();
        runs.len()
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
            answered_by: None,
        }
    }

    /// Decides whether the operation that hit the limit may continue (with one more configured
    /// amount). Never panics, never errs: every failure refuses.
    ///
    /// # Cancel safety
    /// Only the interactive mode awaits (the operator's answer). Dropping the future then withdraws
    /// the question (the bus's contract) and grants nothing; the caller decides what a dropped
    /// decision means (a halted turn stops anyway).
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
            kind: Some(ctx.kind),
            current: ctx.current,
            configured: ctx.configured,
            config_key: ctx.kind.config_key().to_owned(),
            question: limit_question(ctx),
            permission: None,
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
            Ok(OperatorReply { answer, by }) => match answer {
                Answer::Yes => self.grant(ctx, LimitReason::UserApproved, None),
                Answer::No | Answer::Other(_) => LimitDecision::refuse(LimitReason::UserRefused),
            }
            .answered_by(by),
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
        value(ctx.kind, ctx.extension),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safety::intervention::{BusError, ChannelInterventionBus};
    use futures::future::BoxFuture;

    fn ctx(run: &str, kind: LimitKind) -> LimitContext {
        LimitContext {
            run_id: run.into(),
            agent: "a".into(),
            kind,
            current: 51.0,
            configured: 50.0,
            partial_results: true,
            extension: 50.0,
        }
    }

    fn checkpoint(
        mode: OnLimitMode,
        times: u32,
        timeout: f64,
        bus: Option<Arc<dyn InterventionBus>>,
    ) -> LimitCheckpoint {
        LimitCheckpoint::new(
            SafetyOnLimitConfig {
                mode,
                auto_extend_times: times,
                ask_timeout_seconds: timeout,
            },
            bus,
        )
    }

    fn allowed(extension: u32, reason: LimitReason) -> LimitDecision {
        LimitDecision {
            allow: true,
            extension,
            reason,
            answered_by: None,
        }
    }

    #[tokio::test]
    async fn unattended_refuses_without_asking() {
        let bus = Arc::new(ChannelInterventionBus::new());
        let cp = checkpoint(OnLimitMode::Unattended, 5, 0.0, Some(bus.clone()));
        let d = cp
            .handle_limit_exceeded(&ctx("r", LimitKind::AgentHops))
            .await;
        assert_eq!(d, LimitDecision::refuse(LimitReason::Unattended));
        assert!(bus.pending().is_empty());
    }

    #[tokio::test]
    async fn auto_extend_counts_exactly_per_run_and_kind() {
        let cp = checkpoint(OnLimitMode::AutoExtend, 2, 0.0, None);
        let iter = ctx("r1", LimitKind::IterationsPerTask);
        assert_eq!(
            cp.handle_limit_exceeded(&iter).await,
            allowed(1, LimitReason::AutoExtended)
        );
        assert_eq!(
            cp.handle_limit_exceeded(&iter).await,
            allowed(2, LimitReason::AutoExtended)
        );
        let exhausted = LimitDecision::refuse(LimitReason::AutoExtendExhausted);
        assert_eq!(cp.handle_limit_exceeded(&iter).await, exhausted);
        assert_eq!(cp.handle_limit_exceeded(&iter).await, exhausted);
        assert_eq!(cp.granted("r1", LimitKind::IterationsPerTask), 2);
        // Another kind in the same run, and the same kind in another run, have their own counts.
        assert_eq!(
            cp.handle_limit_exceeded(&ctx("r1", LimitKind::ChainWait))
                .await,
            allowed(1, LimitReason::AutoExtended)
        );
        assert_eq!(
            cp.handle_limit_exceeded(&ctx("r2", LimitKind::IterationsPerTask))
                .await,
            allowed(1, LimitReason::AutoExtended)
        );
        assert_eq!(cp.runs_tracked(), 2);
        cp.forget_run("r1");
        assert_eq!(cp.granted("r1", LimitKind::IterationsPerTask), 0);
        assert_eq!(cp.granted("r2", LimitKind::IterationsPerTask), 1);
        assert_eq!(cp.runs_tracked(), 1);

        let none = checkpoint(OnLimitMode::AutoExtend, 0, 0.0, None);
        assert_eq!(none.handle_limit_exceeded(&iter).await, exhausted);
    }

    #[tokio::test]
    async fn interactive_without_a_bus_refuses() {
        let cp = checkpoint(OnLimitMode::Interactive, 1, 0.0, None);
        assert_eq!(
            cp.handle_limit_exceeded(&ctx("r", LimitKind::Steps)).await,
            LimitDecision::refuse(LimitReason::NoBus)
        );
    }

    async fn interactive_answer(answer: Answer) -> (LimitDecision, Intervention) {
        let bus = Arc::new(ChannelInterventionBus::new());
        let cp = checkpoint(OnLimitMode::Interactive, 1, 0.0, Some(bus.clone()));
        let operator = {
            let bus = bus.clone();
            tokio::spawn(async move {
                let iv = bus.next_pending().await;
                bus.answer(iv.id, answer).unwrap();
                iv
            })
        };
        let d = cp
            .handle_limit_exceeded(&ctx("r", LimitKind::IterationsPerTask))
            .await;
        (d, operator.await.unwrap())
    }

    #[tokio::test]
    async fn interactive_allows_only_on_yes() {
        let (d, iv) = interactive_answer(Answer::Yes).await;
        assert_eq!(d, allowed(1, LimitReason::UserApproved));
        assert_eq!(iv.kind, Some(LimitKind::IterationsPerTask));
        assert_eq!(iv.config_key, "safety.loop.max_iterations_per_task");
        assert_eq!((iv.current, iv.configured), (51.0, 50.0));
        assert_eq!(
            iv.question,
            "Agent a reached its limit on iterations per task: 51 against a configured 50 (`safety.loop.max_iterations_per_task`). Allow it to continue for another 50? (yes/no)"
        );
        let refused = LimitDecision::refuse(LimitReason::UserRefused);
        assert_eq!(interactive_answer(Answer::No).await.0, refused);
        assert_eq!(interactive_answer(Answer::parse("maybe")).await.0, refused);
    }

    struct BrokenBus;
    impl InterventionBus for BrokenBus {
        fn ask(&self, _: Intervention) -> BoxFuture<'_, Result<OperatorReply, BusError>> {
            Box::pin(async { Err(BusError::Closed) })
        }
    }

    #[tokio::test]
    async fn a_bus_error_refuses() {
        let cp = checkpoint(OnLimitMode::Interactive, 1, 0.0, Some(Arc::new(BrokenBus)));
        assert_eq!(
            cp.handle_limit_exceeded(&ctx("r", LimitKind::AgentHops))
                .await,
            LimitDecision::refuse(LimitReason::UserRefused)
        );
    }

    #[tokio::test]
    async fn an_unanswered_ask_times_out_and_is_withdrawn() {
        tokio::time::pause();
        let bus = Arc::new(ChannelInterventionBus::new());
        let cp = Arc::new(checkpoint(
            OnLimitMode::Interactive,
            1,
            30.0,
            Some(bus.clone()),
        ));
        let started = tokio::time::Instant::now();
        let task = {
            let cp = cp.clone();
            tokio::spawn(async move {
                cp.handle_limit_exceeded(&ctx("r", LimitKind::ChainWait))
                    .await
            })
        };
        let iv = bus.next_pending().await;
        tokio::time::sleep(std::time::Duration::from_millis(29_999)).await;
        assert!(!task.is_finished(), "not before the timeout");
        assert_eq!(
            task.await.unwrap(),
            LimitDecision::refuse(LimitReason::AskTimeout)
        );
        let waited = started.elapsed();
        assert!(
            waited >= std::time::Duration::from_secs(30)
                && waited <= std::time::Duration::from_millis(30_002),
            "{waited:?}"
        );
        assert!(bus.pending().is_empty());
        assert!(
            bus.answer(iv.id, Answer::Yes).is_err(),
            "a late answer is refused"
        );
    }

    #[tokio::test]
    async fn a_zero_timeout_waits_forever() {
        tokio::time::pause();
        let bus = Arc::new(ChannelInterventionBus::new());
        let cp = Arc::new(checkpoint(
            OnLimitMode::Interactive,
            1,
            0.0,
            Some(bus.clone()),
        ));
        let task = {
            let cp = cp.clone();
            tokio::spawn(async move {
                cp.handle_limit_exceeded(&ctx("r", LimitKind::ChainWait))
                    .await
            })
        };
        let iv = bus.next_pending().await;
        tokio::time::sleep(std::time::Duration::from_secs(365 * 24 * 3600)).await;
        assert!(!task.is_finished(), "still waiting after a year");
        bus.answer(iv.id, Answer::Yes).unwrap();
        assert_eq!(task.await.unwrap(), allowed(1, LimitReason::UserApproved));
    }

    #[test]
    fn the_refusal_message_is_decision_enabling() {
        let c = ctx("r", LimitKind::IterationsPerTask);
        assert_eq!(
            limit_refusal_message(&c, &LimitDecision::refuse(LimitReason::Unattended), 1),
            "Stopped: the limit on iterations per task was reached (51 against a configured 50) and not extended (unattended). To allow more, raise `safety.loop.max_iterations_per_task` above 50, or set `safety.on_limit.mode` to \"interactive\" (ask an operator) or \"auto_extend\" (extend automatically). Partial results are available."
        );
        let c = LimitContext {
            kind: LimitKind::TaskWallClock,
            current: 120.5,
            configured: 120.0,
            partial_results: false,
            ..c
        };
        assert_eq!(
            limit_refusal_message(
                &c,
                &LimitDecision::refuse(LimitReason::AutoExtendExhausted),
                2
            ),
            "Stopped: the limit on task wall-clock time was reached (120.5s against a configured 120s) and not extended (auto_extend_exhausted). To allow more, raise `safety.timeout.task_seconds` above 120s, raise `safety.on_limit.auto_extend_times` (now 2), or set `safety.on_limit.mode = \"interactive\"` to be asked. No partial results are available."
        );
        assert_eq!(
            limit_refusal_message(&c, &LimitDecision::refuse(LimitReason::AskTimeout), 1),
            "Stopped: the limit on task wall-clock time was reached (120.5s against a configured 120s) and not extended (ask_timeout). To allow more, raise `safety.timeout.task_seconds` above 120s, raise `safety.on_limit.ask_timeout_seconds` (0 waits forever), or set `safety.on_limit.mode = \"auto_extend\"` to extend automatically. No partial results are available."
        );
        let hops = LimitContext {
            kind: LimitKind::AgentHops,
            current: 4.0,
            configured: 3.0,
            partial_results: true,
            ..c
        };
        assert_eq!(
            limit_refusal_message(&hops, &LimitDecision::refuse(LimitReason::NoBus), 1),
            "Stopped: the limit on delegation hops was reached (4 against a configured 3) and not extended (no_bus). To allow more, raise `safety.loop.max_agent_hops` above 3, attach an operator (intervention bus) for `safety.on_limit.mode = \"interactive\"`, or set `safety.on_limit.mode = \"auto_extend\"` to extend automatically. Partial results are available."
        );
    }
}
