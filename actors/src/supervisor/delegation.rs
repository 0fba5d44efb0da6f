//! Delegation: [`Supervisor::delegate`] within the budgets, the [`Slot`] every delegation holds for
//! its whole life, and the built-in `delegate` tool.

use super::*;

pub(super) mod a2a;

impl Supervisor {
    /// Runs `task` on `to` for `from`, within the budgets. `lineage` is `from`'s current chain;
    /// `call_id` the tool call's id (part of a cross-node delegation's idempotency key).
    pub(crate) async fn delegate(
        &self,
        from: &Arc<AgentCell>,
        to: &AgentKey,
        task: String,
        lineage: &[AgentKey],
        call_id: &str,
    ) -> Result<String, DelegationError> {
        if from.state().refuses_work() {
            return Err(refused(
                from,
                to,
                DelegationRefusal::DelegatorNotRunning {
                    delegator: from.key.clone(),
                },
            ));
        }
        let Some(delegate) = self.shared.agents.get(to).map(|e| e.cell.clone()) else {
            let ask = Ask {
                to,
                task,
                lineage,
                call_id,
            };
            // Not here: a remote A2A agent (`[a2a_agents.NAME]`), or maybe an agent of another
            // node (the cluster).
            if let Some(peers) = self.shared.a2a.get().filter(|p| p.knows(to)).cloned() {
                return self.delegate_a2a(from, peers, ask).await;
            }
            return self.delegate_remote(from, ask).await;
        };
        let hops = self
            .admit(from, to, lineage)
            .await
            .map_err(|r| refused(from, to, r))?;
        if let Some(refusal) = unwilling(&delegate, to) {
            return Err(refused(from, to, refusal));
        }
        self.acquire_slot(from)
            .await
            .map_err(|r| refused(from, to, r))?;
        let id = self.shared.next_delegation.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::delegation_gap(&from.key);
        let (slot, admitted) = Slot::new(from.clone(), delegate.clone(), id);
        // A halt raised before the delegation was listed did not see it: refuse it here, before
        // the task is sent (the halt gate's ordering, `agent/cell/gate.rs`).
        let (mut slot, chain) = slot.start(admitted, hops, lineage, &task)?;
        let rx = match send_task(&delegate, task, chain) {
            Ok(rx) => rx,
            Err(refusal) => {
                slot.outcome = Some(DelegationOutcome::Failed {
                    error: refusal.to_string(),
                });
                drop(slot);
                return Err(refused(
                    from,
                    to,
                    DelegationRefusal::DelegateRefused {
                        delegate: to.clone(),
                        refusal,
                    },
                ));
            }
        };
        let answer = self.wait_chain(&mut slot, rx).await?;
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

    /// A delegation to an agent this team does not have: refused as unknown, unless another node
    /// of the cluster runs it ([`RemoteAgents`]). Then the same checks as a local one (cycle,
    /// hops, slots), the task sent as a request to the owning node with the idempotency key
    /// `from/run id/call id`, and the same chain wait. A halt of `from` ends the wait (its turn is
    /// cancelled, which drops this future) and sends a best-effort cancel to the owner.
    async fn delegate_remote(
        &self,
        from: &Arc<AgentCell>,
        ask: Ask<'_>,
    ) -> Result<String, DelegationError> {
        let Ask {
            to,
            task,
            lineage,
            call_id,
        } = ask;
        let unknown = || DelegationRefusal::UnknownDelegate {
            delegate: to.clone(),
        };
        let Some(remote) = self.shared.remote.get().cloned() else {
            return Err(refused(from, to, unknown()));
        };
        if let Some(refusal) = remote.refusal(to) {
            return Err(refused(from, to, refusal));
        }
        let Some(node) = remote.owner(to).await else {
            return Err(refused(from, to, unknown()));
        };
        let hops = self
            .admit(from, to, lineage)
            .await
            .map_err(|r| refused(from, to, r))?;
        self.acquire_slot(from)
            .await
            .map_err(|r| refused(from, to, r))?;
        let id = self.shared.next_delegation.fetch_add(1, Ordering::Relaxed);
        let key = format!("{}/{}/{}", from.key, from.current_run_id(), call_id);
        let slot = Slot::remote(from.clone(), to.clone(), id);
        let (mut slot, chain) = slot.start(!from.halt_requested(), hops, lineage, &task)?;
        let request = remote.delegate(
            &node,
            RemoteTask {
                key: key.clone(),
                from: from.key.clone(),
                to: to.clone(),
                task,
                lineage: chain,
            },
        );
        // From here a drop without an outcome (the delegator's turn cancelled by a halt) cancels.
        slot.cancel = Some((remote, node, key));
        let reply = self.wait_chain(&mut slot, request).await?;
        match reply {
            RemoteReply::Answer { answer } => {
                slot.outcome = Some(DelegationOutcome::Completed);
                Ok(answer)
            }
            RemoteReply::Refused { refusal } => {
                slot.outcome = Some(DelegationOutcome::Failed {
                    error: refusal.to_string(),
                });
                drop(slot);
                Err(refused(from, to, refusal))
            }
            RemoteReply::Failed { error } => {
                slot.outcome = Some(DelegationOutcome::Failed {
                    error: error.clone(),
                });
                Err(DelegationError::Failed(TaskError::Failed(error)))
            }
            RemoteReply::Abandoned => {
                slot.outcome = Some(DelegationOutcome::Abandoned);
                Err(DelegationError::Abandoned)
            }
        }
    }

    /// Runs a task a delegator on another node sent to this team's `task.to` (the owning node's
    /// side of a cross-node delegation): refused when the agent is unknown, locked out or stopped;
    /// otherwise queued as a delegated task and answered. No wait limit here: the delegator's
    /// chain wait bounds it, and its halt arrives as a halt of the delegate
    /// ([`Supervisor::halt`] with [`HaltCause::Parent`]).
    ///
    /// The answer leaves only once the delegate's turn is durable (its `turn_finished` and
    /// everything it journaled before): a node killed right after it replied still knows on restart
    /// that the task ran. When the journal cannot write, the answer is
    /// [`RemoteReply::Failed`] saying so (the turn ran, but this node could not keep it).
    pub async fn run_remote_task(&self, task: RemoteTask) -> RemoteReply {
        let RemoteTask {
            to, task, lineage, ..
        } = task;
        let Some(delegate) = self.shared.agents.get(&to).map(|e| e.cell.clone()) else {
            return RemoteReply::Refused {
                refusal: DelegationRefusal::UnknownDelegate { delegate: to },
            };
        };
        if let Some(refusal) = unwilling(&delegate, &to) {
            return RemoteReply::Refused { refusal };
        }
        let rx = match send_task(&delegate, task, lineage) {
            Ok(rx) => rx,
            Err(refusal) => {
                return RemoteReply::Refused {
                    refusal: DelegationRefusal::DelegateRefused {
                        delegate: to,
                        refusal,
                    },
                }
            }
        };
        let reply = match rx.await {
            Ok(Ok(answer)) => RemoteReply::Answer { answer },
            Ok(Err(error)) => RemoteReply::Failed {
                error: error.to_string(),
            },
            Err(_) => RemoteReply::Abandoned,
        };
        // The turn's end is journaled before its answer is sent to `rx`: wait until it is on disk.
        match delegate.durable_so_far().await {
            Ok(()) => reply,
            Err(e) => RemoteReply::Failed {
                error: format!(
                    "the task ran on {to}, but its turn is not durable on that node ({e}): it \
                     may be lost there if the node stops now"
                ),
            },
        }
    }

    /// The checks of every delegation before a slot: no cycle, hops within
    /// `safety.loop.max_agent_hops` (or the checkpoint allows one more). `Ok`: the hops.
    async fn admit(
        &self,
        from: &AgentCell,
        to: &AgentKey,
        lineage: &[AgentKey],
    ) -> Result<u32, DelegationRefusal> {
        if lineage.contains(to) {
            let mut chain = lineage.to_vec();
            chain.push(to.clone());
            return Err(DelegationRefusal::Cycle { chain });
        }
        let hops = lineage.len() as u32;
        let max = self.shared.config.safety.loop_.max_agent_hops;
        if hops > max
            && !self
                .limit_allows(from, LimitKind::AgentHops, f64::from(hops), f64::from(max))
                .await
        {
            return Err(DelegationRefusal::HopLimit { hops, max });
        }
        Ok(hops)
    }

    /// Takes one of `from`'s `delegation.sub_agent_budget` slots (or one more, if the checkpoint
    /// allows it).
    async fn acquire_slot(&self, from: &AgentCell) -> Result<(), DelegationRefusal> {
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
                return Err(DelegationRefusal::SubAgentBudget { active, budget });
            }
        }
        Ok(())
    }

    /// Awaits `answer` within `safety.timeout.chain_seconds`, extended period by period while the
    /// limit checkpoint allows; when it refuses more, the slot's outcome is `timed_out`.
    async fn wait_chain<F: std::future::Future + Unpin>(
        &self,
        slot: &mut Slot,
        mut answer: F,
    ) -> Result<F::Output, DelegationError> {
        let from = &*slot.from.clone();
        let chain_seconds = self.shared.config.safety.timeout.chain_seconds;
        if chain_seconds <= 0.0 {
            return Ok(answer.await);
        }
        let limit = Duration::from_secs_f64(chain_seconds);
        let mut waited = Duration::ZERO;
        loop {
            match tokio::time::timeout(limit, &mut answer).await {
                Ok(answer) => return Ok(answer),
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

/// What a delegator asks of a delegate on another node.
/// How much of a task the delegator's `delegation_requested` entry keeps, in characters.
const TASK_EXCERPT_CHARS: usize = 200;

/// The first [`TASK_EXCERPT_CHARS`] characters of `task`, `…` appended when it was longer: the
/// delegate's own event carries the whole task, so a long one is not journaled twice.
fn excerpt(task: &str) -> String {
    match task.char_indices().nth(TASK_EXCERPT_CHARS) {
        Some((at, _)) => format!("{}…", &task[..at]),
        None => task.to_owned(),
    }
}

struct Ask<'a> {
    to: &'a AgentKey,
    task: String,
    lineage: &'a [AgentKey],
    call_id: &'a str,
}

/// Adds the remote A2A agents (name, what it does) to the `delegate` tool's description: the model
/// learns of them there, as it learns of local delegates from its instructions.
pub(super) fn describe_remote(spec: &mut ToolSpec, remote: &[(AgentKey, String)]) {
    if remote.is_empty() {
        return;
    }
    spec.description
        .push_str(" Remote agents (A2A) you may also name as `agent`:");
    for (name, what) in remote {
        let what: String = what.chars().take(300).collect();
        spec.description.push_str(&format!("\n- {name}: {what:?}"));
    }
}

/// Why `delegate` takes no task now: locked out (`emergency_stop`) or stopped.
fn unwilling(delegate: &AgentCell, to: &AgentKey) -> Option<DelegationRefusal> {
    let rec = delegate.lock();
    let (locked, state) = (rec.emergency_stop(), rec.state);
    drop(rec);
    if locked {
        return Some(DelegationRefusal::EmergencyStop {
            delegate: to.clone(),
            state,
        });
    }
    state.refuses_work().then(|| DelegationRefusal::Stopped {
        delegate: to.clone(),
        state,
    })
}

/// Queues `task` on `delegate` as a delegated task (`chain`: the lineage, ending with the
/// delegate); the receiver gets its answer.
///
/// Refused when the delegate is stopped or locked out *now*: the check and the push are made under
/// the delegate's record lock, as a user event's are, so a halt applied on another arbiter between
/// the early check ([`unwilling`]) and here cannot leave a task queued on a stopped agent (its
/// clear takes the task whole, or the task sees the halt).
fn send_task(
    delegate: &AgentCell,
    task: String,
    chain: Vec<AgentKey>,
) -> Result<oneshot::Receiver<Result<String, TaskError>>, warden_protocols::WorkRefusal> {
    let (reply, rx) = oneshot::channel();
    let task = AgentMsg::Work(Work::Delegated(DelegatedTask {
        task,
        lineage: Arc::from(chain),
        reply,
        parent: tracing::Span::current(),
    }));
    let rec = delegate.lock();
    if let Some(refusal) = crate::agent::refusal_for(&rec) {
        return Err(refusal);
    }
    let sent = delegate.mailbox.try_send(task);
    drop(rec);
    match sent {
        Ok(_) => Ok(rx),
        Err(crate::mailbox::TrySendError::Full(_)) => {
            Err(warden_protocols::WorkRefusal::MailboxFull {
                capacity: delegate.mailbox.capacity(),
            })
        }
        Err(crate::mailbox::TrySendError::Closed(_)) => Err(warden_protocols::WorkRefusal::Closed),
    }
}

/// Journals `refusal` on `from` (and in telemetry) and returns it as the error.
fn refused(from: &AgentCell, to: &AgentKey, refusal: DelegationRefusal) -> DelegationError {
    crate::telemetry::refused("warden.delegation_refused", &refusal);
    from.note(EventKind::DelegationRefused {
        to: to.clone(),
        refusal: refusal.clone(),
    });
    DelegationError::Refused(refusal)
}

/// One running delegation. Dropping it — on any ending — releases the delegator's slot.
struct Slot {
    from: Arc<AgentCell>,
    /// The delegate's cell; `None` for an agent of another node.
    to: Option<Arc<AgentCell>>,
    to_key: AgentKey,
    id: u64,
    /// `DelegationRequested` is journaled ([`Slot::start`] admitted it): only then does its end
    /// journal a `DelegationEnded`. A slot refused before (a halt raised meanwhile) is refused as
    /// `delegator_not_running` and ends unjournaled: no delegation ends that never started.
    requested: bool,
    outcome: Option<DelegationOutcome>,
    /// A cross-node delegation's owner: told when the slot ends without an outcome (node, key).
    cancel: Option<(Arc<dyn RemoteAgents>, String, String)>,
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
            to_key: to.key.clone(),
            to: Some(to),
            id,
            requested: false,
            outcome: None,
            cancel: None,
        };
        (slot, admitted)
    }

    /// The slot (already acquired on `from`) of a delegation to `to` on another node. Not listed
    /// in `from`'s halt gate: a halt cancels `from`'s turn, which drops the wait and this slot.
    fn remote(from: Arc<AgentCell>, to: AgentKey, id: u64) -> Self {
        Slot {
            from,
            to: None,
            to_key: to,
            id,
            requested: false,
            outcome: None,
            cancel: None,
        }
    }
}

impl Slot {
    /// `admitted` (no halt of the delegator may have missed it): journals `DelegationRequested`
    /// and returns the delegate's chain. Otherwise refused (`delegator_not_running`; dropping the
    /// slot unlists it).
    fn start(
        mut self,
        admitted: bool,
        hops: u32,
        lineage: &[AgentKey],
        task: &str,
    ) -> Result<(Self, Vec<AgentKey>), DelegationError> {
        let (from, to) = (self.from.clone(), self.to_key.clone());
        if !admitted {
            drop(self);
            let delegator = from.key.clone();
            return Err(refused(
                &from,
                &to,
                DelegationRefusal::DelegatorNotRunning { delegator },
            ));
        }
        from.note(EventKind::DelegationRequested {
            id: self.id,
            to: to.clone(),
            hops,
            task: excerpt(task),
        });
        self.requested = true;
        let mut chain = lineage.to_vec();
        chain.push(to);
        Ok((self, chain))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(to) = &self.to {
            self.from.remove_delegation(self.id);
            to.remove_delegator(self.id);
        }
        self.from.release_slot();
        if !self.requested {
            return;
        }
        if self.outcome.is_none() {
            if let Some((remote, node, key)) = self.cancel.take() {
                remote.cancel(&node, &key, &self.from.key);
            }
        }
        self.from.note(EventKind::DelegationEnded {
            id: self.id,
            to: self.to_key.clone(),
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

    fn retry(&self) -> Option<warden_protocols::ToolRetryConfig> {
        // Never retried by the runner: a delegation that timed out is still running its task
        // (a retry would run it twice), and its waits and refusals go through the chain-wait
        // checkpoint and the supervisor's rules.
        Some(warden_protocols::ToolRetryConfig::none())
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
                .delegate(&from, &to, task, &ctx.lineage, &ctx.call_id)
                .await
                .map_err(|e| ToolError::Failed(e.to_string()))?;
            Ok(json!({"agent": to, "answer": answer}))
        })
    }
}
