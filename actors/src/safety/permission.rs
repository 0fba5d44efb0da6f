//! The permission gate: before a tool call runs, the agent's [`PermissionPolicy`] gives it a
//! verdict — `allow`, `deny` or `ask` — and an `ask` goes to an operator through the same
//! intervention bus, with the same three modes, as the limit checkpoint (design 003: "intentionally
//! parallel … both degrade to deny when no bus is wired").
//!
//! ```text
//! tool call (arguments valid)
//!   ├─ allow ──► runs
//!   ├─ deny  ──► refused, denied
//!   └─ ask
//!        ├─ mode = unattended           ──► refused, unattended
//!        ├─ auto_extend, a yes remembered for (task, tool, arguments) ──► runs, remembered
//!        ├─ no bus                       ──► refused, no_bus
//!        └─ ask the bus  ──► yes → runs, user_approved (auto_extend: remembered for
//!                                   remember_minutes, 0 = the rest of the task)
//!                            no / other / bus error → refused, user_refused
//!                            ask_timeout_seconds elapsed → refused, ask_timeout
//! ```
//!
//! # Invariants
//! * Fail closed: only `allow`, an operator's yes, or a remembered yes runs a call.
//! * A refused call is not a tool failure: the model gets a tool error saying it was refused and
//!   why ([`warden_protocols::permission_refusal`]), and the breakers count it as neither a success
//!   nor an error.
//! * The caller holds the agent in `WAITING_FOR_INPUT` while [`PermissionGate::ask`] waits, and
//!   races it against the halt token: a halt drops the ask (withdrawn from the bus) and the tool
//!   never starts.
//! * Remembered approvals never outlive their task: keyed by run id, dropped when the agent's next
//!   task begins ([`PermissionGate::forget_run`]).

use super::intervention::InterventionBus;
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::time::Instant;
use warden_protocols::{
    AgentKey, Answer, Intervention, OnLimitMode, OperatorReply, PermissionAsk, PermissionDecision,
    PermissionPolicy, PermissionReason, PermissionVerdict, Ruling, ToolCategory,
};

/// One tool call the gate decides.
#[derive(Debug, Clone)]
pub struct PermissionRequest {
    /// The calling agent.
    pub agent: AgentKey,
    /// Its task's run id (remembered approvals are per task).
    pub run_id: String,
    /// The model's id of the call.
    pub call_id: String,
    /// The tool, as the model calls it.
    pub tool: String,
    /// Its tier.
    pub category: ToolCategory,
    /// The arguments (parsed).
    pub arguments: serde_json::Value,
    /// What the agent said with the call, for the operator.
    pub last_message: Option<String>,
}

/// (run id, tool, hash of the canonical arguments).
type Remembered = (String, String, u64);

/// The team's permission gate: the bus and id counter it shares with the limit checkpoint, and the
/// approvals `auto_extend` remembers.
pub struct PermissionGate {
    bus: Option<Arc<dyn InterventionBus>>,
    ids: Arc<AtomicU64>,
    /// `None`: until the task ends; `Some(t)`: until `t`.
    remembered: Mutex<HashMap<Remembered, Option<Instant>>>,
}

impl std::fmt::Debug for PermissionGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermissionGate")
            .field("bus", &self.bus.is_some())
            .field("remembered", &self.remembered.lock().len())
            .finish()
    }
}

fn arguments_hash(arguments: &serde_json::Value) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    crate::tools::canonical_json(arguments).hash(&mut h);
    h.finish()
}

impl PermissionGate {
    /// A gate asking through `bus` (`None`: every ask is refused as `no_bus`), with intervention
    /// ids from `ids` (share the limit checkpoint's: one bus, one id space).
    pub fn new(bus: Option<Arc<dyn InterventionBus>>, ids: Arc<AtomicU64>) -> Self {
        PermissionGate {
            bus,
            ids,
            remembered: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a call the policy rules `ask` will wait for an operator (the caller then puts the
    /// agent in `WAITING_FOR_INPUT` first): interactive or auto-extend mode, a bus, and no
    /// remembered yes.
    pub fn will_wait(&self, policy: &PermissionPolicy, request: &PermissionRequest) -> bool {
        policy.config().mode != OnLimitMode::Unattended
            && self.bus.is_some()
            && !self.is_remembered(request)
    }

    fn key(request: &PermissionRequest) -> Remembered {
        (
            request.run_id.clone(),
            request.tool.clone(),
            arguments_hash(&request.arguments),
        )
    }

    fn is_remembered(&self, request: &PermissionRequest) -> bool {
        let key = Self::key(request);
        let mut remembered = self.remembered.lock();
        match remembered.get(&key) {
            None => false,
            Some(None) => true,
            Some(Some(until)) if Instant::now() < *until => true,
            Some(Some(_)) => {
                remembered.remove(&key);
                false
            }
        }
    }

    /// Drops the approvals remembered for a finished task.
    pub fn forget_run(&self, run_id: &str) {
        self.remembered
            .lock()
            .retain(|(run, _, _), _| run != run_id);
    }

    /// How many approvals are remembered now.
    pub fn remembered(&self) -> usize {
        self.remembered.lock().len()
    }

    /// Decides a call whose ruling is `deny` or `ask` (an `allow` needs no gate). `asking` is
    /// called with the intervention just before it goes to the bus (to journal it).
    ///
    /// # Cancel safety
    /// Dropping the future while it waits withdraws the question from the bus; nothing is
    /// remembered and the caller must not run the call.
    pub async fn decide(
        &self,
        policy: &PermissionPolicy,
        ruling: Ruling,
        request: &PermissionRequest,
        asking: impl FnOnce(&Intervention),
    ) -> PermissionDecision {
        let decided = |allow, reason| PermissionDecision {
            allow,
            ruling: ruling.clone(),
            reason,
            asked: None,
            answered_by: None,
        };
        let config = policy.config();
        let decision = match ruling.verdict {
            PermissionVerdict::Allow => decided(true, PermissionReason::Allowed),
            PermissionVerdict::Deny => decided(false, PermissionReason::Denied),
            PermissionVerdict::Ask => match config.mode {
                OnLimitMode::Unattended => decided(false, PermissionReason::Unattended),
                _ if self.is_remembered(request) => decided(true, PermissionReason::Remembered),
                _ => match &self.bus {
                    None => decided(false, PermissionReason::NoBus),
                    Some(bus) => {
                        let mut decision = self
                            .ask(bus.as_ref(), policy, &ruling, request, asking)
                            .await;
                        if decision.allow && config.mode == OnLimitMode::AutoExtend {
                            let until = match config.remember_minutes {
                                0 => None,
                                m => Some(Instant::now() + Duration::from_secs(u64::from(m) * 60)),
                            };
                            self.remembered.lock().insert(Self::key(request), until);
                        }
                        decision.ruling = ruling.clone();
                        decision
                    }
                },
            },
        };
        tracing::info!(
            agent = %request.agent, tool = %request.tool, call = %request.call_id,
            verdict = %ruling.verdict, key = %ruling.key, allow = decision.allow,
            reason = %decision.reason, "permission gate"
        );
        decision
    }

    async fn ask(
        &self,
        bus: &dyn InterventionBus,
        policy: &PermissionPolicy,
        ruling: &Ruling,
        request: &PermissionRequest,
        asking: impl FnOnce(&Intervention),
    ) -> PermissionDecision {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let refused = |reason| PermissionDecision {
            allow: false,
            ruling: ruling.clone(),
            reason,
            asked: Some(id),
            answered_by: None,
        };
        let intervention = Intervention {
            id,
            agent: request.agent.clone(),
            run_id: request.run_id.clone(),
            kind: None,
            current: 0.0,
            configured: 0.0,
            config_key: ruling.key.clone(),
            question: permission_question(request, ruling),
            permission: Some(PermissionAsk {
                call_id: request.call_id.clone(),
                tool: request.tool.clone(),
                category: request.category,
                arguments: request.arguments.clone(),
                rule: ruling.key.clone(),
                last_message: request.last_message.clone(),
            }),
        };
        asking(&intervention);
        let asked = bus.ask(intervention);
        let seconds = policy.config().ask_timeout_seconds;
        let limit = (seconds > 0.0)
            .then(|| Duration::try_from_secs_f64(seconds).ok())
            .flatten();
        let answer = match limit {
            None => asked.await,
            Some(limit) => match tokio::time::timeout(limit, asked).await {
                Ok(answer) => answer,
                Err(_elapsed) => return refused(PermissionReason::AskTimeout),
            },
        };
        match answer {
            Ok(OperatorReply { answer, by }) => {
                let mut decision = match answer {
                    Answer::Yes => PermissionDecision {
                        allow: true,
                        reason: PermissionReason::UserApproved,
                        ..refused(PermissionReason::UserApproved)
                    },
                    Answer::No | Answer::Other(_) => refused(PermissionReason::UserRefused),
                };
                decision.answered_by = by;
                decision
            }
            Err(error) => {
                tracing::warn!(agent = %request.agent, %error, "intervention bus failed; refusing the tool call");
                refused(PermissionReason::UserRefused)
            }
        }
    }
}

/// The operator's question: which agent, which tool with which arguments, which key asks.
pub fn permission_question(request: &PermissionRequest, ruling: &Ruling) -> String {
    let mut arguments = crate::tools::canonical_json(&request.arguments);
    if let Some((at, _)) = arguments.char_indices().nth(500) {
        arguments.truncate(at);
        arguments.push('…');
    }
    format!(
        "Agent {} wants to run the {} tool `{}` with {} (`{}` = \"ask\"). Allow it? (yes/no)",
        request.agent,
        category_name(request.category),
        request.tool,
        arguments,
        ruling.key,
    )
}

fn category_name(category: ToolCategory) -> &'static str {
    match category {
        ToolCategory::SafeChain => "SAFE_CHAIN",
        ToolCategory::Terminal => "TERMINAL",
        ToolCategory::Dangerous => "DANGEROUS",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safety::intervention::ChannelInterventionBus;
    use serde_json::json;
    use warden_protocols::{PermissionRule, PermissionsConfig};

    fn policy(mode: OnLimitMode, remember: u32, timeout: f64) -> PermissionPolicy {
        PermissionPolicy::team(&PermissionsConfig {
            dangerous: PermissionVerdict::Ask,
            mode,
            remember_minutes: remember,
            ask_timeout_seconds: timeout,
            rules: vec![PermissionRule::tool("rm", PermissionVerdict::Deny)],
            ..PermissionsConfig::default()
        })
    }

    fn request(run: &str, path: &str) -> PermissionRequest {
        PermissionRequest {
            agent: "a".into(),
            run_id: run.into(),
            call_id: "call_1".into(),
            tool: "write".into(),
            category: ToolCategory::Dangerous,
            arguments: json!({"path": path}),
            last_message: Some("writing it".into()),
        }
    }

    fn gate(bus: Option<Arc<ChannelInterventionBus>>) -> Arc<PermissionGate> {
        Arc::new(PermissionGate::new(
            bus.map(|b| b as Arc<dyn InterventionBus>),
            Arc::new(AtomicU64::new(1)),
        ))
    }

    async fn decide(
        gate: &Arc<PermissionGate>,
        policy: &PermissionPolicy,
        req: &PermissionRequest,
    ) -> PermissionDecision {
        let ruling = policy.rule_for(&req.tool, req.category, &req.arguments);
        gate.decide(policy, ruling, req, |_| {}).await
    }

    /// Every verdict × every mode × bus / no bus: only allow, a yes and a remembered yes run.
    #[tokio::test]
    async fn every_verdict_mode_and_bus_combination() {
        for mode in OnLimitMode::ALL {
            for with_bus in [false, true] {
                let bus = with_bus.then(|| Arc::new(ChannelInterventionBus::new()));
                let g = gate(bus.clone());
                let p = policy(mode, 0, 0.0);
                // allow (a SAFE_CHAIN tool by its tier default): runs, nothing asked.
                let mut look = request("r", "x");
                look.category = ToolCategory::SafeChain;
                let d = decide(&g, &p, &look).await;
                assert_eq!((d.allow, d.reason), (true, PermissionReason::Allowed));
                // deny (a rule): refused, nothing asked.
                let mut rm = request("r", "x");
                rm.tool = "rm".into();
                let d = decide(&g, &p, &rm).await;
                assert_eq!((d.allow, d.reason), (false, PermissionReason::Denied));
                assert_eq!(d.ruling.key, "permissions.rules[0]");
                // ask
                let req = request("r", "x");
                let expected_wait = mode != OnLimitMode::Unattended && with_bus;
                assert_eq!(
                    g.will_wait(&p, &req),
                    expected_wait,
                    "{mode} bus={with_bus}"
                );
                let answerer = bus.clone().map(|bus| {
                    tokio::spawn(async move {
                        let iv = bus.next_pending().await;
                        bus.reply(iv.id, OperatorReply::by(Answer::Yes, "test", None))
                            .unwrap();
                        iv
                    })
                });
                let d = decide(&g, &p, &req).await;
                let want = match (mode, with_bus) {
                    (OnLimitMode::Unattended, _) => (false, PermissionReason::Unattended),
                    (_, false) => (false, PermissionReason::NoBus),
                    (_, true) => (true, PermissionReason::UserApproved),
                };
                assert_eq!((d.allow, d.reason), want, "{mode} bus={with_bus}");
                assert_eq!(d.ruling.key, "permissions.dangerous");
                if let (Some(answerer), true) = (answerer, expected_wait) {
                    let iv = answerer.await.unwrap();
                    let ask = iv.permission.expect("a permission ask");
                    assert_eq!(
                        (ask.tool.as_str(), ask.arguments.clone()),
                        ("write", json!({"path": "x"}))
                    );
                    assert_eq!(iv.kind, None);
                    assert_eq!(d.answered_by.unwrap().operator, "test");
                    assert_eq!(
                        iv.question,
                        "Agent a wants to run the DANGEROUS tool `write` with {\"path\":\"x\"} (`permissions.dangerous` = \"ask\"). Allow it? (yes/no)"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn no_and_other_answers_refuse() {
        for answer in [Answer::No, Answer::parse("later")] {
            let bus = Arc::new(ChannelInterventionBus::new());
            let g = gate(Some(bus.clone()));
            let p = policy(OnLimitMode::Interactive, 0, 0.0);
            let op = tokio::spawn({
                let bus = bus.clone();
                async move {
                    let iv = bus.next_pending().await;
                    bus.answer(iv.id, answer).unwrap();
                }
            });
            let d = decide(&g, &p, &request("r", "x")).await;
            op.await.unwrap();
            assert_eq!((d.allow, d.reason), (false, PermissionReason::UserRefused));
        }
    }

    /// auto_extend: a yes is remembered for that tool and those arguments in that task only, and
    /// for `remember_minutes` when set.
    #[tokio::test]
    async fn auto_extend_remembers_a_yes_per_task_tool_and_arguments() {
        tokio::time::pause();
        let bus = Arc::new(ChannelInterventionBus::new());
        let g = gate(Some(bus.clone()));
        let p = policy(OnLimitMode::AutoExtend, 0, 0.0);
        let op = tokio::spawn({
            let bus = bus.clone();
            async move {
                let iv = bus.next_pending().await;
                bus.answer(iv.id, Answer::Yes).unwrap();
            }
        });
        assert_eq!(
            decide(&g, &p, &request("r1", "a")).await.reason,
            PermissionReason::UserApproved
        );
        op.await.unwrap();
        assert_eq!(
            decide(&g, &p, &request("r1", "a")).await.reason,
            PermissionReason::Remembered
        );
        assert!(!g.will_wait(&p, &request("r1", "a")));
        // Other arguments, or another task, are asked again.
        assert!(g.will_wait(&p, &request("r1", "b")));
        assert!(g.will_wait(&p, &request("r2", "a")));
        g.forget_run("r1");
        assert!(g.will_wait(&p, &request("r1", "a")));
        assert_eq!(g.remembered(), 0);

        // remember_minutes = 10: remembered for 10 minutes, then asked again.
        let p = policy(OnLimitMode::AutoExtend, 10, 0.0);
        let op = tokio::spawn({
            let bus = bus.clone();
            async move {
                let iv = bus.next_pending().await;
                bus.answer(iv.id, Answer::Yes).unwrap();
            }
        });
        assert!(decide(&g, &p, &request("r3", "a")).await.allow);
        op.await.unwrap();
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(!g.will_wait(&p, &request("r3", "a")));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(g.will_wait(&p, &request("r3", "a")));
    }

    #[tokio::test]
    async fn an_unanswered_ask_times_out_and_is_withdrawn() {
        tokio::time::pause();
        let bus = Arc::new(ChannelInterventionBus::new());
        let g = gate(Some(bus.clone()));
        let p = policy(OnLimitMode::Interactive, 0, 30.0);
        let task = tokio::spawn({
            let g = g.clone();
            async move { decide(&g, &p, &request("r", "x")).await }
        });
        let iv = bus.next_pending().await;
        tokio::time::sleep(Duration::from_millis(29_999)).await;
        assert!(!task.is_finished());
        let d = task.await.unwrap();
        assert_eq!(
            (d.allow, d.reason, d.asked),
            (false, PermissionReason::AskTimeout, Some(iv.id))
        );
        assert!(bus.pending().is_empty());
        assert!(
            bus.answer(iv.id, Answer::Yes).is_err(),
            "a late answer is refused"
        );
    }

    #[tokio::test]
    async fn a_dropped_ask_is_withdrawn_and_remembers_nothing() {
        let bus = Arc::new(ChannelInterventionBus::new());
        let g = gate(Some(bus.clone()));
        let p = policy(OnLimitMode::AutoExtend, 0, 0.0);
        let req = request("r", "x");
        {
            let ruling = p.rule_for(&req.tool, req.category, &req.arguments);
            let mut asked = std::pin::pin!(g.decide(&p, ruling, &req, |_| {}));
            assert!(futures::poll!(&mut asked).is_pending());
            assert_eq!(bus.pending().len(), 1);
        }
        assert!(bus.pending().is_empty());
        assert_eq!(g.remembered(), 0);
    }
}
