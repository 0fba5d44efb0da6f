//! Delegation: [`Supervisor::delegate`] within the budgets, the [`Slot`] every delegation holds for
//! its whole life, and the built-in `delegate` tool.

use super::*;

impl Supervisor {
    /// Runs `task` on `to` for `from`, within the budgets. `lineage` is `from`'s current chain.
    pub(crate) async fn delegate(
        &self,
        from: &Arc<AgentCell>,
        to: &AgentKey,
        task: String,
        lineage: &[AgentKey],
    ) -> Result<String, DelegationError> {
        let config = &self.shared.config;
        let refuse = |refusal: DelegationRefusal| {
            crate::telemetry::refused("warden.delegation_refused", &refusal);
            from.note(EventKind::DelegationRefused {
                to: to.clone(),
                refusal: refusal.clone(),
            });
            DelegationError::Refused(refusal)
        };
        if from.state().refuses_work() {
            return Err(refuse(DelegationRefusal::DelegatorNotRunning {
                delegator: from.key.clone(),
            }));
        }
        let Some(delegate) = self.shared.agents.get(to).map(|e| e.cell.clone()) else {
            // Not here: an agent of another node (the cluster) may be known to be locked out.
            if let Some(refusal) = self.shared.remote.get().and_then(|r| r.refusal(to)) {
                return Err(refuse(refusal));
            }
            return Err(refuse(DelegationRefusal::UnknownDelegate {
                delegate: to.clone(),
            }));
        };
        if lineage.contains(to) {
            let mut chain = lineage.to_vec();
            chain.push(to.clone());
            return Err(refuse(DelegationRefusal::Cycle { chain }));
        }
        let hops = lineage.len() as u32;
        let max = config.safety.loop_.max_agent_hops;
        if hops > max
            && !self
                .limit_allows(from, LimitKind::AgentHops, f64::from(hops), f64::from(max))
                .await
        {
            return Err(refuse(DelegationRefusal::HopLimit { hops, max }));
        }
        {
            let rec = delegate.lock();
            let (locked, state) = (rec.emergency_stop(), rec.state);
            drop(rec);
            if locked {
                return Err(refuse(DelegationRefusal::EmergencyStop {
                    delegate: to.clone(),
                    state,
                }));
            }
            if state.refuses_work() {
                return Err(refuse(DelegationRefusal::Stopped {
                    delegate: to.clone(),
                    state,
                }));
            }
        }
        let budget = from.settings.sub_agent_budget;
        if let Err(active) = from.try_acquire_slot(budget) {
            let allowed = self
                .limit_allows(
                    from,
                    LimitKind::SubAgentBudget,
                    f64::from(active + 1),
                    f64::from(budget),
                )
                .await;
            if !allowed || from.try_acquire_slot(active + 1).is_err() {
                return Err(refuse(DelegationRefusal::SubAgentBudget { active, budget }));
            }
        }
        let id = self.shared.next_delegation.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::delegation_gap(&from.key);
        let (mut slot, admitted) = Slot::new(from.clone(), delegate.clone(), id);
        // A halt raised before the delegation was listed did not see it: refuse it here, before
        // the task is sent (the halt gate's ordering, `agent/cell/gate.rs`).
        if !admitted {
            drop(slot);
            return Err(refuse(DelegationRefusal::DelegatorNotRunning {
                delegator: from.key.clone(),
            }));
        }
        from.note(EventKind::DelegationRequested {
            id,
            to: to.clone(),
            hops,
        });
        let (reply, rx) = oneshot::channel();
        let mut chain = lineage.to_vec();
        chain.push(to.clone());
        let task = AgentMsg::Work(Work::Delegated(DelegatedTask {
            task,
            lineage: Arc::from(chain),
            reply,
            parent: tracing::Span::current(),
        }));
        if let Err(err) = delegate.mailbox.try_send(task) {
            let refusal = match err {
                crate::mailbox::TrySendError::Full(_) => {
                    warden_protocols::WorkRefusal::MailboxFull {
                        capacity: delegate.mailbox.capacity(),
                    }
                }
                crate::mailbox::TrySendError::Closed(_) => warden_protocols::WorkRefusal::Closed,
            };
            slot.outcome = Some(DelegationOutcome::Failed {
                error: refusal.to_string(),
            });
            drop(slot);
            return Err(refuse(DelegationRefusal::DelegateRefused {
                delegate: to.clone(),
                refusal,
            }));
        }
        let chain_seconds = config.safety.timeout.chain_seconds;
        let answer = if chain_seconds > 0.0 {
            let limit = Duration::from_secs_f64(chain_seconds);
            let mut rx = rx;
            let mut waited = Duration::ZERO;
            loop {
                match tokio::time::timeout(limit, &mut rx).await {
                    Ok(answer) => break answer,
                    Err(_) => {
                        waited += limit;
                        let allowed = self
                            .limit_allows(
                                from,
                                LimitKind::ChainWait,
                                waited.as_secs_f64(),
                                waited.as_secs_f64(),
                            )
                            .await;
                        if !allowed {
                            let after_ms = waited.as_millis() as u64;
                            slot.outcome = Some(DelegationOutcome::TimedOut { after_ms });
                            return Err(DelegationError::TimedOut(after_ms));
                        }
                    }
                }
            }
        } else {
            rx.await
        };
        match answer {
            Ok(Ok(answer)) => {
                slot.outcome = Some(DelegationOutcome::Completed);
                Ok(answer)
            }
            Ok(Err(error)) => {
                slot.outcome = Some(DelegationOutcome::Failed {
                    error: error.to_string(),
                });
                Err(DelegationError::Failed(error))
            }
            Err(_) => {
                slot.outcome = Some(DelegationOutcome::Abandoned);
                Err(DelegationError::Abandoned)
            }
        }
    }

    /// Routes a delegation limit through the team's checkpoint (`safety.on_limit`). With the safety
    /// checks off, limits are plain refusals.
    async fn limit_allows(
        &self,
        from: &AgentCell,
        kind: LimitKind,
        current: f64,
        configured: f64,
    ) -> bool {
        if !self.shared.safety.checks {
            return false;
        }
        let ctx = LimitContext {
            // Hops and sub-agents are allowed one at a time; a wait by one more period.
            extension: match kind {
                LimitKind::ChainWait => self.shared.config.safety.timeout.chain_seconds,
                _ => 1.0,
            },
            run_id: from.current_run_id(),
            agent: from.key.clone(),
            kind,
            current,
            configured,
            partial_results: false,
        };
        let decision = self
            .shared
            .safety
            .checkpoint
            .handle_limit_exceeded(&ctx)
            .await;
        let allow = decision.allow;
        from.note(EventKind::LimitDecided {
            kind,
            current,
            configured,
            decision,
        });
        allow
    }
}

/// One running delegation. Dropping it — on any ending — releases the delegator's slot.
struct Slot {
    from: Arc<AgentCell>,
    to: Arc<AgentCell>,
    id: u64,
    outcome: Option<DelegationOutcome>,
}

impl Slot {
    /// The slot is already acquired on `from`. Lists the delegation on both sides; `false` with it:
    /// a halt of `from` is requested and may not have seen it (refuse the delegation; dropping the
    /// slot unlists it).
    fn new(from: Arc<AgentCell>, to: Arc<AgentCell>, id: u64) -> (Self, bool) {
        let admitted = from.add_delegation(id, to.clone());
        to.add_delegator(id, &from);
        let slot = Slot {
            from,
            to,
            id,
            outcome: None,
        };
        (slot, admitted)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.from.remove_delegation(self.id);
        self.to.remove_delegator(self.id);
        self.from.release_slot();
        self.from.note(EventKind::DelegationEnded {
            id: self.id,
            to: self.to.key.clone(),
            outcome: self.outcome.take().unwrap_or(DelegationOutcome::Cancelled),
        });
    }
}

/// The built-in `delegate` tool.
pub(super) struct DelegateTool {
    pub(super) supervisor: Weak<SupervisorShared>,
}

impl Tool for DelegateTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "delegate".into(),
            description: "Hand a task to another agent and wait for its answer.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "description": "key of the agent to delegate to"},
                    "task": {"type": "string", "description": "what it should do"}
                },
                "required": ["agent", "task"]
            }),
            category: ToolCategory::SafeChain,
        }
    }

    fn circuit_breaker(&self) -> bool {
        // Per-delegate safety is the supervisor's (refusals of locked-out delegates).
        false
    }

    fn timeout(&self) -> Option<Duration> {
        // The delegation enforces `safety.timeout.chain_seconds` itself, through the limit checkpoint
        // (which may extend the wait); a tool timeout must never cut it short.
        Some(Duration::from_secs(100 * 365 * 86_400))
    }

    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        let supervisor = self.supervisor.clone();
        Box::pin(async move {
            let field = |name: &str| {
                args.get(name)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        ToolError::InvalidArguments(format!("`{name}` must be a string"))
                    })
            };
            let to = AgentKey::from(field("agent")?);
            let task = field("task")?;
            let shared = supervisor
                .upgrade()
                .ok_or_else(|| ToolError::Failed("supervisor is gone".into()))?;
            let supervisor = Supervisor { shared };
            let from = supervisor
                .shared
                .agents
                .get(&ctx.agent)
                .map(|e| e.cell.clone())
                .ok_or_else(|| ToolError::Failed(format!("unknown delegator {}", ctx.agent)))?;
            let answer = supervisor
                .delegate(&from, &to, task, &ctx.lineage)
                .await
                .map_err(|e| ToolError::Failed(e.to_string()))?;
            Ok(json!({"agent": to, "answer": answer}))
        })
    }
}
