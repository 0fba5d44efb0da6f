//! One turn: the ReAct loop for one piece of work.
//!
//! The turn runs as a future spawned by the actor. Every await is raced (`biased`) against the agent's
//! halt token, and [`AgentCell::begin_tool`] refuses to start a tool once a halt is requested, so after a
//! halt no LLM call continues and no tool starts — even before the actor has read the halt message.
//!
//! Counting (design 000): a failed LLM call, a failed tool call, an unknown tool, invalid tool
//! arguments, a tool timeout, and a panic inside a provider's or tool's future each add 1 to
//! `consecutive_errors`. A *successful action* resets it: a tool call that succeeds, or a final answer.
//! A successful LLM call that only asks for a tool does not reset it — otherwise a model that keeps
//! calling a failing tool would alternate 0,1,0,1 and never trip the emergency stop.

use super::{cell::AgentCell, cell::Counted, DelegatedTask, TaskReply, Work};
use crate::{
    provider::{LlmRequest, LlmResponse, ProviderError},
    tools::{ToolContext, ToolError},
};
use futures::FutureExt;
use serde_json::Value;
use std::{panic::AssertUnwindSafe, sync::Arc};
use tokio_util::sync::CancellationToken;
use warden_protocols::{
    AgentKey, AgentState, ChatMessage, EventKind, TerminationReason, ToolCall, ToolCategory,
    TurnOutcome,
};

/// Awaits `fut` unless the halt token fires first.
async fn unless_halted<F: std::future::Future>(
    token: &CancellationToken,
    fut: F,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        _ = token.cancelled() => None,
        out = fut => Some(out),
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

fn outcome(reason: TerminationReason, iterations: u32, answer: Option<String>) -> TurnOutcome {
    TurnOutcome {
        reason,
        iterations,
        answer,
    }
}

/// Runs one turn. The agent is `EXECUTING` on entry and is `EXECUTING` or `SAFETY_LOCKOUT` on return
/// (or anything, if a halt was requested: the actor's halt handling takes over).
pub(crate) async fn run(cell: Arc<AgentCell>, work: Work) -> (TurnOutcome, Option<TaskReply>) {
    let token = cell.halt_token();
    let (lineage, reply): (Arc<[AgentKey]>, Option<TaskReply>) = match work {
        Work::Event(event) => {
            let from = event
                .sender
                .as_deref()
                .map(|s| format!(" {s}:"))
                .unwrap_or_default();
            cell.append_history(ChatMessage::user(format!(
                "[{}]{from} {}",
                event.source, event.content
            )));
            (Arc::from(vec![cell.key.clone()]), None)
        }
        Work::Tick => (Arc::from(vec![cell.key.clone()]), None),
        Work::Delegated(DelegatedTask {
            task,
            lineage,
            reply,
        }) => {
            cell.append_history(ChatMessage::user(task));
            (lineage, Some(reply))
        }
    };
    let result = react(&cell, &token, lineage).await;
    (result, reply)
}

async fn react(
    cell: &Arc<AgentCell>,
    token: &CancellationToken,
    lineage: Arc<[AgentKey]>,
) -> TurnOutcome {
    let max_iterations = if cell.settings.multi_action {
        cell.settings.max_iterations_per_tick.max(1)
    } else {
        1
    };
    for iteration in 1..=max_iterations {
        if cell.halt_requested() {
            return outcome(TerminationReason::Halted, iteration - 1, None);
        }
        let request = LlmRequest {
            agent: cell.key.clone(),
            messages: cell.conversation(),
            tools: cell.tools.specs(),
        };
        let response = match call_provider(cell, token, request).await {
            None => return outcome(TerminationReason::Halted, iteration, None),
            Some(Ok(response)) => response,
            Some(Err(error)) => {
                let reason = match cell.record_failure(&format!("llm call failed: {error}")) {
                    Counted::Tripped => TerminationReason::SafetyLockout,
                    Counted::Below => TerminationReason::LlmError,
                };
                return outcome(reason, iteration, None);
            }
        };
        let calls = response.message.tool_calls.clone();
        cell.append_history(response.message.clone());
        if calls.is_empty() {
            cell.record_success();
            let answer = response.message.content.unwrap_or_default();
            return outcome(TerminationReason::Noop, iteration, Some(answer));
        }
        // Calls of one response that are all SAFE_CHAIN run concurrently (a model's parallel tool
        // calls, e.g. several delegations); otherwise one after the other. Results are accounted in
        // call order either way.
        let parallel = calls.len() > 1
            && calls.iter().all(|c| {
                cell.tools
                    .get(&c.function.name)
                    .is_some_and(|(spec, _)| spec.category == ToolCategory::SafeChain)
            });
        let mut steps = Vec::with_capacity(calls.len());
        if parallel {
            let executed =
                futures::future::join_all(calls.iter().map(|c| execute(cell, token, c, &lineage)))
                    .await;
            for (call, executed) in calls.iter().zip(executed) {
                steps.push(account(cell, call, executed));
            }
        } else {
            for call in &calls {
                let step = account(cell, call, execute(cell, token, call, &lineage).await);
                let stop = !matches!(step, ToolStep::Done(_));
                steps.push(step);
                if stop {
                    break;
                }
            }
        }
        let mut ended_by = None;
        for step in steps {
            match step {
                ToolStep::Halted => return outcome(TerminationReason::Halted, iteration, None),
                ToolStep::Tripped => {
                    return outcome(TerminationReason::SafetyLockout, iteration, None)
                }
                ToolStep::Done(category) => match category {
                    Some(ToolCategory::Terminal) => {
                        ended_by.get_or_insert(TerminationReason::TerminalTool);
                    }
                    Some(ToolCategory::Dangerous) => {
                        ended_by = Some(TerminationReason::DangerousTool);
                    }
                    _ => {}
                },
            }
        }
        if let Some(reason) = ended_by {
            return outcome(reason, iteration, None);
        }
    }
    outcome(TerminationReason::MaxIterations, max_iterations, None)
}

async fn call_provider(
    cell: &AgentCell,
    token: &CancellationToken,
    request: LlmRequest,
) -> Option<Result<LlmResponse, ProviderError>> {
    // `complete` itself runs unguarded: a panic there is a crash of the agent (restart policy).
    // A panic inside the returned future is a failed call.
    let call = AssertUnwindSafe(cell.provider.complete(request)).catch_unwind();
    let result = unless_halted(token, call).await?;
    Some(result.unwrap_or_else(|payload| {
        Err(ProviderError::Panicked {
            message: panic_message(payload),
        })
    }))
}

enum ToolStep {
    Done(Option<ToolCategory>),
    Tripped,
    Halted,
}

fn tool_error_message(error: &ToolError) -> String {
    serde_json::json!({"success": false, "error": error.to_string()}).to_string()
}

/// What happened to one tool call.
enum Executed {
    /// A halt stopped it (before it started, or while it ran).
    Halted,
    /// It ran, or was rejected before starting (`category` is `None` then).
    Ran {
        category: Option<ToolCategory>,
        result: Result<Value, ToolError>,
    },
}

/// Runs one tool call: validation, the halt gate, timeout, panic catching. Records nothing in the
/// history or the error count (see [`account`]).
async fn execute(
    cell: &Arc<AgentCell>,
    token: &CancellationToken,
    call: &ToolCall,
    lineage: &Arc<[AgentKey]>,
) -> Executed {
    let name = call.function.name.as_str();
    let Some((spec, tool)) = cell.tools.get(name) else {
        return rejected(cell, call, ToolError::Unknown(name.to_owned()));
    };
    let raw = if call.function.arguments.trim().is_empty() {
        "{}"
    } else {
        call.function.arguments.as_str()
    };
    let args = match serde_json::from_str::<Value>(raw) {
        Ok(args) => args,
        Err(e) => return rejected(cell, call, ToolError::InvalidArguments(e.to_string())),
    };
    let category = spec.category;
    if !cell.begin_tool(&call.id, name) {
        return Executed::Halted;
    }
    let ctx = ToolContext {
        agent: cell.key.clone(),
        call_id: call.id.clone(),
        lineage: lineage.clone(),
    };
    let timeout = tool.timeout().unwrap_or(cell.settings.tool_timeout);
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| tool.call(args, ctx)));
    let result: Result<Value, ToolError> = match started {
        Err(payload) => Err(ToolError::Panicked(panic_message(payload))),
        Ok(future) => {
            let guarded = tokio::time::timeout(timeout, AssertUnwindSafe(future).catch_unwind());
            match unless_halted(token, guarded).await {
                None => return Executed::Halted,
                Some(Err(_elapsed)) => Err(ToolError::Timeout {
                    after_ms: timeout.as_millis() as u64,
                }),
                Some(Ok(Err(payload))) => Err(ToolError::Panicked(panic_message(payload))),
                Some(Ok(Ok(result))) => result,
            }
        }
    };
    cell.end_tool(
        &call.id,
        name,
        result.as_ref().err().map(ToString::to_string),
    );
    Executed::Ran {
        category: Some(category),
        result,
    }
}

/// A call rejected before it could start (unknown tool, unparsable arguments).
fn rejected(cell: &AgentCell, call: &ToolCall, error: ToolError) -> Executed {
    cell.note(EventKind::ToolFinished {
        call_id: call.id.clone(),
        tool: call.function.name.clone(),
        ok: false,
        error: Some(error.to_string()),
    });
    Executed::Ran {
        category: None,
        result: Err(error),
    }
}

/// Puts a call's result in the history (the model sees errors as the tool's result) and counts it.
fn account(cell: &AgentCell, call: &ToolCall, executed: Executed) -> ToolStep {
    let (category, result) = match executed {
        Executed::Halted => return ToolStep::Halted,
        Executed::Ran { category, result } => (category, result),
    };
    match result {
        Ok(value) => {
            cell.append_history(ChatMessage::tool_result(&call.id, value.to_string()));
            cell.record_success();
            ToolStep::Done(category)
        }
        Err(error) => {
            cell.append_history(ChatMessage::tool_result(
                &call.id,
                tool_error_message(&error),
            ));
            let name = &call.function.name;
            match cell.record_failure(&format!("tool {name} failed: {error}")) {
                Counted::Tripped => ToolStep::Tripped,
                Counted::Below => ToolStep::Done(category),
            }
        }
    }
}

impl AgentCell {
    /// Starts a tool unless a halt is requested: `EXECUTING → WAITING_FOR_TOOL` for the first of
    /// the calls running at once.
    pub(crate) fn begin_tool(&self, call_id: &str, tool: &str) -> bool {
        let mut rec = self.lock();
        let parallel = rec.state == AgentState::WaitingForTool && self.tools_in_flight() > 0;
        if self.halt_requested() || !(rec.state == AgentState::Executing || parallel) {
            self.emit(
                &mut rec,
                EventKind::ToolRefused {
                    call_id: call_id.to_owned(),
                    tool: tool.to_owned(),
                    reason: "halt requested".into(),
                },
            );
            return false;
        }
        if !parallel
            && self
                .transition(&mut rec, AgentState::WaitingForTool, tool)
                .is_err()
        {
            return false;
        }
        self.tool_started();
        self.emit(
            &mut rec,
            EventKind::ToolStarted {
                call_id: call_id.to_owned(),
                tool: tool.to_owned(),
            },
        );
        true
    }

    /// `WAITING_FOR_TOOL → EXECUTING` when the last running call ends, and the tool's ending journaled.
    pub(crate) fn end_tool(&self, call_id: &str, tool: &str, error: Option<String>) {
        let mut rec = self.lock();
        if self.tool_finished() == 0 && rec.state == AgentState::WaitingForTool {
            let _ = self.transition(&mut rec, AgentState::Executing, "tool finished");
        }
        self.emit(
            &mut rec,
            EventKind::ToolFinished {
                call_id: call_id.to_owned(),
                tool: tool.to_owned(),
                ok: error.is_none(),
                error,
            },
        );
    }
}
