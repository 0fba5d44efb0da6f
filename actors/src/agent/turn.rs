//! One turn: the ReAct loop for one piece of work, with every safety hook in its place.
//!
//! ```text
//! per iteration (react's steps, each going on, starting the next iteration or ending the turn):
//!   unless_halted        halt requested?
//!   iterations_per_tick  past execution.max_iterations_per_tick → checkpoint (more, or wrap up);
//!                        with multi_action_enabled = false one action ends the turn instead
//!   loop_limits          on_loop_start: loop caps, wall clock → checkpoint; other verdicts obeyed
//!   hourly_budget        last hour's tokens at safety.budget.tokens_per_hour → wait (halt ends it)
//!   memory               reflection due → reflection call; history at ≥ 80 % of the window →
//!                        compacted (summary call); see memory.rs
//!   budget_slice         a cluster's shared team budget: claim a slice before spending past it
//!   request              fit context → before_llm_call (budgets)
//!   call_model           LLM call (≤ llm_call_seconds); unparsable → correcting message, again
//!   read_response        record usage → after_llm_call → answer (or max-tokens continuation)
//!   run_tools            validate, circuit, cache, permission gate (allow / deny / ask an
//!                        operator in WAITING_FOR_INPUT), run → after_tool_execution each
//!   conclude             TERMINAL / DANGEROUS / critical context end the turn; else again
//! ```
//!
//! The turn runs as a future spawned by the actor. Every await is raced (`biased`) against the agent's
//! halt token, and [`AgentCell::begin_tool`] refuses to start a tool once a halt is requested, so after a
//! halt no LLM call continues and no tool starts — even before the actor has read the halt message.
//!
//! Counting (design 000): a failed LLM call, an unparsable response, a failed tool call, an unknown
//! tool, invalid arguments, a tool rejected by its open circuit, a tool timeout, and a panic inside a
//! provider's or tool's future each add 1 to `consecutive_errors`. A *successful action* resets it: a
//! tool call that succeeds, or a final answer. A successful LLM call that only asks for a tool does not
//! reset it — otherwise a model that keeps calling a failing tool would alternate 0,1,0,1 and never trip.
//! An LLM call that failed and was retried successfully inside the provider counts as a success.

use super::{cell::AgentCell, cell::Counted, DelegatedTask, TaskReply, Work};
use crate::{
    context,
    provider::{LlmRequest, LlmResponse, ProviderError},
    safety::{limit_refusal_message, LimitContext, PermissionRequest, Verdict},
    telemetry,
    tools::{self, panic_message, Admission, CircuitStep, CircuitTransition, ToolRun},
    tools::{ToolContext, ToolError},
};
use futures::FutureExt;
use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use warden_protocols::{
    AgentKey, AgentState, AnomalyKind, Breaker, ChatMessage, ChatRole, EventKind, FinishReason,
    LimitDecision, LimitKind, LlmOutcome, PermissionDecision, PermissionVerdict, Ruling,
    TerminationReason, ToolCall, ToolCategory, ToolOutcome, TurnOutcome, UserEvent,
};

/// The internal message that asks the model to continue an answer cut by `finish_reason: length`.
pub(crate) const CONTINUE_PROMPT: &str =
    "Your previous reply was cut off by the length limit. Continue exactly where you left off, without repeating anything.";

/// The result given to a tool call that was not run (after a DANGEROUS tool or a trip in the same
/// response).
const NOT_RUN_RESULT: &str = r#"{"success":false,"error":"not run: only one DANGEROUS tool per tick, or the turn was stopped by a safety limit; call it again if still needed"}"#;

/// The result given to the calls after the first of one response when
/// `execution.multi_action_enabled = false` (one action per tick).
const NOT_RUN_SINGLE_RESULT: &str = r#"{"success":false,"error":"not run: one action per tick (execution.multi_action_enabled = false); call it again next tick if still needed"}"#;

/// The result given to a tool call a halt, a pause or a crash interrupted: it may have been sent
/// (an MCP server may have received it and acted) before the turn stopped, so the model must not
/// take it for a call that did not happen.
const INTERRUPTED_RESULT: &str = r#"{"success":false,"error":"interrupted: the turn was stopped (halt, pause or restart) before this call's result came back; it may have run, in part or in full. Do not call it again before checking whether it took effect"}"#;

/// The result given to a tool call the turn stopped at while its permission ask waited: it
/// certainly did not run.
const NOT_RUN_ASKED_RESULT: &str = r#"{"success":false,"error":"not run: the turn was stopped (halt, pause or restart) while this call waited for an operator's permission; call it again if still needed"}"#;

/// Gives every tool call left without a result (a turn interrupted by a halt or a crash) an
/// `interrupted` result, so the next request is a valid conversation. Only the end of the history is read: the
/// results of a call are appended right after it, and every turn starts here, so an unanswered call
/// can only be in the newest assistant message, followed by nothing but tool results and internal
/// system alerts.
fn answer_dangling_calls(cell: &AgentCell) {
    let (dangling, asking) = {
        let rec = cell.lock();
        let asking = rec.asking_call();
        let Some(pos) = rec.history.iter().rposition(|m| {
            !(m.role == ChatRole::Tool || (m.role == ChatRole::System && m.internal))
        }) else {
            return;
        };
        let last = &rec.history[pos];
        if last.role != ChatRole::Assistant || last.tool_calls.is_empty() {
            return;
        }
        let answered: Vec<&str> = rec.history[pos + 1..]
            .iter()
            .filter_map(|m| m.tool_call_id.as_deref())
            .collect();
        let dangling: Vec<String> = last
            .tool_calls
            .iter()
            .filter(|c| !answered.contains(&c.id.as_str()))
            .map(|c| c.id.clone())
            .collect();
        (dangling, asking)
    };
    for id in dangling {
        let result = if asking.as_deref() == Some(id.as_str()) {
            NOT_RUN_ASKED_RESULT
        } else {
            INTERRUPTED_RESULT
        };
        cell.append_history(ChatMessage::tool_result(id, result));
    }
}

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

fn outcome(reason: TerminationReason, iterations: u32, answer: Option<String>) -> TurnOutcome {
    TurnOutcome::new(reason, iterations, answer)
}

fn stopped(counted: Counted, iterations: u32) -> Option<TurnOutcome> {
    match counted {
        Counted::Below => None,
        Counted::Tripped => Some(outcome(TerminationReason::SafetyLockout, iterations, None)),
        Counted::Stopped => Some(outcome(TerminationReason::BudgetExceeded, iterations, None)),
    }
}

/// The work a turn runs on, taken from the mailbox by [`take`].
pub(crate) struct Taken {
    /// The delegation chain the turn runs in, root first.
    lineage: Arc<[AgentKey]>,
    /// Where a delegated task's answer goes.
    reply: Option<TaskReply>,
    /// The id of the user event taken: what the turn answers.
    event: Option<u64>,
    /// What the turn's `invoke_agent` span descends from (see [`crate::telemetry`]).
    parent: telemetry::Parent,
}

/// Takes `work`, synchronously in the actor right after its transition to `EXECUTING` (before the
/// turn is spawned, so no halt can come between): answers tool calls a cut turn left open, starts the
/// task and puts the work's message in the history. A user event is settled in the same journal
/// transaction as its message (`EventTaken` + `HistoryAppended`): after a crash it is either still
/// pending (and queued again) or in the history, never both and never neither.
pub(crate) fn take(cell: &AgentCell, work: Work) -> Taken {
    answer_dangling_calls(cell);
    // Long-term memory: the observations delivered before this work (a TRIGGER's own among
    // them) are written before the turn recalls anything.
    cell.write_observations_ahead();
    let _ = cell.take_turn_usage();
    let own = || Arc::from(vec![cell.key.clone()]);
    match work {
        Work::Event {
            id,
            event,
            accepted,
            trace,
        } => {
            cell.begin_task();
            cell.memory_turn(event.sender.as_deref(), true);
            let message = ChatMessage::user(event_message(&event));
            let mut events = vec![EventKind::EventTaken { id }];
            // What the NPC perceived as context since its last turn comes first (never a turn of
            // its own: it waits for one).
            if let Some(context) = cell.take_context() {
                events.push(EventKind::HistoryAppended { message: context });
            }
            events.push(EventKind::HistoryAppended { message });
            let mut rec = cell.lock();
            cell.emit_all(&mut rec, events);
            cell.set_answering(id, accepted);
            drop(rec);
            Taken {
                lineage: own(),
                reply: None,
                event: Some(id),
                parent: telemetry::Parent::Context(trace),
            }
        }
        // An autonomous tick: no new event. It is a task of its own (a ticking NPC's wall clock and
        // loop count would otherwise run on for hours and trip the per-task limits), and the model
        // sees what it perceived since its last turn, then one internal line (never shown to users)
        // saying a tick came
        // (with the game time when the tick arbiter sent it). Both are journaled together.
        Work::Tick => {
            cell.tick_left_lane();
            cell.begin_task();
            cell.memory_turn(None, false);
            let mut events = Vec::with_capacity(2);
            if let Some(context) = cell.take_context() {
                events.push(EventKind::HistoryAppended { message: context });
            }
            let message = ChatMessage::user(crate::npc::tick::tick_message(
                cell.ticking().and_then(|t| t.game_hour()),
            ))
            .internal();
            events.push(EventKind::HistoryAppended { message });
            let mut rec = cell.lock();
            cell.emit_all(&mut rec, events);
            drop(rec);
            Taken {
                lineage: own(),
                reply: None,
                event: None,
                parent: telemetry::Parent::None,
            }
        }
        Work::Delegated(DelegatedTask {
            task,
            lineage,
            reply,
            parent,
        }) => {
            cell.begin_task();
            cell.memory_turn(None, false);
            cell.append_history(ChatMessage::user(task));
            Taken {
                lineage,
                reply: Some(reply),
                event: None,
                parent: telemetry::Parent::Span(parent),
            }
        }
    }
}

/// A user event as the model is shown it. With a sender, the text is that speaker's words (a
/// player's TRIGGER, a relayed chat line): `[whisper] p7: "hi\n…"`, quoted by the function that
/// quotes a CONTEXT line (`npc::quote`), so a line break, a bracket or a role marker in it cannot
/// pass for another speaker's line. Without one it is the user's own request, as sent: `[api] …`.
/// The source and the sender are shown as plain names, or quoted (`npc::name`).
fn event_message(event: &UserEvent) -> String {
    let source = crate::npc::name(&event.source);
    match event.sender.as_deref() {
        Some(sender) => format!(
            "[{source}] {}: {}",
            crate::npc::name(sender),
            crate::npc::quote(&event.content)
        ),
        None => format!("[{source}] {}", event.content),
    }
}

/// Runs one turn on work [`take`]n. The agent is `EXECUTING` on entry; on return it is `EXECUTING`,
/// `SAFETY_LOCKOUT` or `STOPPED` (or anything, if a halt was requested: the actor's halt handling
/// takes over).
///
/// The outcome names the event the turn answers and carries the turn's usage.
pub(crate) async fn run(cell: Arc<AgentCell>, taken: Taken) -> (TurnOutcome, Option<TaskReply>) {
    // The epoch first: a halt after this read either cancels the token below or makes it cancelled.
    let epoch = cell.halt_epoch();
    let token = cell.halt_token();
    let span = telemetry::invoke_agent(&taken.parent, &cell.key);
    let mut result = react(&cell, &token, epoch, taken.lineage)
        .instrument(span.clone())
        .await;
    cell.runner().clear_tick();
    result.events.extend(taken.event);
    result.usage = cell.take_turn_usage();
    telemetry::turn_ended(&span, &result, || {
        cell.lock()
            .lockout
            .as_ref()
            .map(|l| l.reason.clone())
            .unwrap_or_default()
    });
    (result, taken.reply)
}

async fn react(
    cell: &Arc<AgentCell>,
    token: &CancellationToken,
    epoch: u64,
    lineage: Arc<[AgentKey]>,
) -> TurnOutcome {
    let mut turn = React {
        cell,
        token,
        epoch,
        lineage,
        max_iterations: cell.settings.max_iterations_per_tick.max(1),
        recoveries: 0,
        partial: String::new(),
        last_was_parse_error: false,
        iteration: 0,
    };
    // One iteration: each step goes on (`Go`), starts the next iteration (`Again`) or ends the turn
    // (`End`), in this order.
    macro_rules! step {
        ($e:expr) => {
            match $e {
                Next::Go(value) => value,
                Next::Again => continue,
                Next::End(outcome) => return outcome,
            }
        };
    }
    loop {
        turn.iteration += 1;
        step!(turn.unless_halted());
        step!(turn.iterations_per_tick().await);
        step!(turn.loop_limits().await);
        step!(turn.hourly_budget().await);
        step!(turn.memory().await);
        step!(turn.hourly_budget().await);
        step!(turn.budget_slice().await);
        let request = step!(turn.request());
        let response = step!(turn.call_model(request).await);
        let calls = step!(turn.read_response(response));
        let steps = step!(turn.run_tools(&calls).await);
        step!(turn.conclude(steps));
    }
}

/// An NPC's command output captured while its tool calls ran (rule 1b) goes into the history
/// after their results (a message of its own: tool results must follow their call directly).
fn append_captured(cell: &AgentCell) {
    if let Some(output) = cell.take_captured() {
        cell.append_history(output.internal());
    }
}

/// What one step of [`react`]'s loop decided.
enum Next<T> {
    /// Go on with the iteration.
    Go(T),
    /// Start the next iteration (a correcting message or a continuation prompt was added).
    Again,
    /// The turn ends with this outcome.
    End(TurnOutcome),
}

/// The state of one turn's ReAct loop.
struct React<'a> {
    cell: &'a Arc<AgentCell>,
    token: &'a CancellationToken,
    /// The halt epoch the turn started under: a result that comes back under a later one is stale.
    epoch: u64,
    lineage: Arc<[AgentKey]>,
    /// Iterations allowed this turn (`execution.max_iterations_per_tick`, raised when the limit
    /// checkpoint allows more).
    max_iterations: u32,
    /// Max-tokens recoveries used (continuation prompts after an answer cut by the token limit).
    recoveries: u32,
    /// The answer so far, across recoveries.
    partial: String,
    /// The last iteration's output could not be used (unparsable, or only anomalous tool calls).
    last_was_parse_error: bool,
    /// The current iteration, from 1.
    iteration: u32,
}

impl React<'_> {
    /// The turn's outcome now, after `iterations` iterations.
    fn end(&self, reason: TerminationReason, iterations: u32) -> Next<()> {
        Next::End(outcome(reason, iterations, None))
    }

    /// Whether a halt came since the turn started (its token cancelled, or a later epoch even if a
    /// resume cleared the flag): a result that arrives now is stale and is dropped unapplied.
    fn stale(&self) -> bool {
        self.token.is_cancelled() || self.cell.halt_epoch() != self.epoch
    }

    /// A halt was requested: end before anything else.
    fn unless_halted(&self) -> Next<()> {
        if self.cell.halt_requested() {
            return self.end(TerminationReason::Halted, self.iteration - 1);
        }
        Next::Go(())
    }

    /// Past `max_iterations`: ask the limit checkpoint for more, or wrap up.
    async fn iterations_per_tick(&mut self) -> Next<()> {
        let cell = self.cell;
        if !cell.settings.multi_action {
            // One action per tick (design 001's `single_action`): the turn ends after its one
            // action (`conclude`) or its one unusable reply (`call_model`), never at a cap, so
            // nothing here asks an operator or calls for a wrap-up. Only the continuations of an
            // answer cut by the token limit come back this way.
            if self.iteration <= 1 + self.recoveries {
                return Next::Go(());
            }
            return self.end(TerminationReason::SingleAction, self.iteration - 1);
        }
        if self.iteration <= self.max_iterations {
            return Next::Go(());
        }
        let configured = f64::from(self.max_iterations);
        let kind = LimitKind::IterationsPerTick;
        let (_, _, run_id) = cell.task_iteration();
        cell.task_iteration_undo();
        let extension = f64::from(cell.settings.max_iterations_per_tick.max(1));
        let asked = checkpoint(
            cell, self.token, &run_id, kind, configured, configured, extension,
        )
        .await;
        match asked {
            None => self.end(TerminationReason::Halted, self.iteration - 1),
            Some((decision, _)) if decision.allow => {
                self.max_iterations += cell.settings.max_iterations_per_tick.max(1);
                Next::Go(())
            }
            Some((decision, ctx)) => {
                if self.last_was_parse_error {
                    return self.end(TerminationReason::ParseError, self.iteration - 1);
                }
                Next::End(wrap_up(cell, self.token, &ctx, &decision, self.iteration - 1).await)
            }
        }
    }

    /// The loop caps and the task's wall clock: a limit goes through the checkpoint; any other
    /// verdict is obeyed.
    async fn loop_limits(&mut self) -> Next<()> {
        let cell = self.cell;
        // A pair loop perceived since the last turn (`npc::conversation`) trips here, in the turn,
        // before any model call.
        if let Some(reason) = cell.take_pair_loop() {
            let verdict = Verdict::Lockout {
                breaker: Breaker::PairLoop,
                reason,
            };
            if let Some(done) = stopped(cell.obey(verdict), self.iteration - 1) {
                return Next::End(done);
            }
        }
        let (task_iteration, elapsed, run_id) = cell.task_iteration();
        let verdict = cell
            .breakers(|b| b.on_loop_start(task_iteration, elapsed))
            .unwrap_or(Verdict::Continue);
        let Verdict::Limit {
            kind,
            current,
            configured,
        } = verdict
        else {
            return match stopped(cell.obey(verdict), self.iteration - 1) {
                Some(done) => Next::End(done),
                None => Next::Go(()),
            };
        };
        let loops = &cell.safety.config.loop_;
        let extension = match kind {
            LimitKind::IterationsPerTask => f64::from(loops.max_iterations_per_task),
            LimitKind::Steps => loops.max_steps as f64,
            LimitKind::TaskWallClock => cell.safety.config.timeout.task_seconds,
            _ => configured,
        };
        match checkpoint(
            cell, self.token, &run_id, kind, current, configured, extension,
        )
        .await
        {
            None => self.end(TerminationReason::Halted, self.iteration - 1),
            Some((decision, _)) if decision.allow => {
                cell.breakers(|b| b.extend(kind));
                Next::Go(())
            }
            Some((decision, ctx)) => {
                cell.task_iteration_undo();
                Next::End(wrap_up(cell, self.token, &ctx, &decision, self.iteration - 1).await)
            }
        }
    }

    /// The rolling budget (`safety.budget.tokens_per_hour`): no model call starts while the last
    /// hour's tokens are at the limit; the turn waits (a halt ends it).
    async fn hourly_budget(&self) -> Next<()> {
        if self.cell.hourly_budget(self.token).await {
            Next::Go(())
        } else {
            self.end(TerminationReason::Halted, self.iteration - 1)
        }
    }

    /// Team budgets shared by the nodes of a cluster (slices, [`crate::safety::BudgetSlices`]): a
    /// call that would spend past what this node holds of the token or the cost budget waits for a
    /// slice first (a halt ends the wait). No slice granted: the budget check of the request stops
    /// it, as on one node.
    async fn budget_slice(&self) -> Next<()> {
        let team = &self.cell.safety.team;
        if !team.shared() {
            return Next::Go(());
        }
        let estimate = context::estimate_tokens(&self.cell.conversation());
        let cost = self
            .cell
            .breakers(|b| b.estimated_cost(estimate))
            .unwrap_or(0.0);
        match unless_halted(self.token, team.cover(estimate, cost)).await {
            Some(_) => Next::Go(()),
            None => self.end(TerminationReason::Halted, self.iteration - 1),
        }
    }

    /// Bounded memory before the request: the history compacted when it is due
    /// ([`super::memory`]). A halt during the summary call ends the turn.
    /// Every `memory.reflection_interval` turns, the turn's first iteration reflects first.
    async fn memory(&self) -> Next<()> {
        let (cell, token) = (self.cell, self.token);
        let go = (self.iteration > 1
            || (crate::memory::sleep::consolidate_if_asleep(cell, token, || self.stale()).await
                && super::memory::reflect_if_due(cell, token, || self.stale()).await))
            && super::memory::compact_if_due(cell, token, || self.stale()).await
            && crate::memory::embed::prepare(cell, token).await;
        if go {
            Next::Go(())
        } else {
            self.end(TerminationReason::Halted, self.iteration - 1)
        }
    }

    /// The request: the history fitted into the context window, checked against the budgets.
    fn request(&self) -> Next<LlmRequest> {
        let cell = self.cell;
        let mut messages = cell.conversation();
        // Long-term memory: what it remembers, quoted into the system message (memory::recall).
        cell.with_recall(&mut messages);
        let estimate = context::estimate_tokens(&messages);
        let verdict = cell
            .breakers(|b| b.before_llm_call(estimate))
            .unwrap_or(Verdict::Continue);
        if let Some(done) = stopped(cell.obey(verdict), self.iteration - 1) {
            return Next::End(done);
        }
        Next::Go(LlmRequest {
            agent: cell.key.clone(),
            messages,
            tools: cell.tools.specs(),
        })
    }

    /// The model call. Unparsable output is an anomaly: the model gets a correcting message and
    /// another iteration. A failed call ends the turn.
    async fn call_model(&mut self, request: LlmRequest) -> Next<LlmResponse> {
        let cell = self.cell;
        let iteration = self.iteration;
        match call_provider(cell, self.token, request).await {
            None => Next::End(outcome(TerminationReason::Halted, iteration, None)),
            // A reply that raced a halt (done in the same poll the halt landed in, or after a
            // halt and a resume): dropped before any side effect — nothing in the history, no
            // tool — but its tokens were spent and count against the budgets.
            Some(Ok(response)) if self.stale() => {
                cell.record_usage(response.usage);
                Next::End(outcome(TerminationReason::Halted, iteration, None))
            }
            Some(Ok(response)) => Next::Go(response),
            Some(Err(ProviderError::Malformed { message })) => {
                let verdict = cell
                    .breakers(|b| b.after_llm_call(LlmOutcome::Anomaly(AnomalyKind::InvalidJson)))
                    .unwrap_or(Verdict::Continue);
                let error = format!("unparsable model output: {message}");
                if let Some(done) = stopped(cell.fail(&error, verdict), iteration) {
                    return Next::End(done);
                }
                if !cell.settings.multi_action {
                    // One action per tick: an unusable reply is this tick's action.
                    let mut out = outcome(TerminationReason::ParseError, iteration, None);
                    out.error = Some(error);
                    return Next::End(out);
                }
                cell.append_history(
                    ChatMessage::user(format!(
                        "Your last reply could not be parsed ({message}). Reply with plain text, or call one of the tools with a JSON object of arguments."
                    ))
                    .internal(),
                );
                self.last_was_parse_error = true;
                Next::Again
            }
            Some(Err(error)) => {
                let verdict = cell
                    .breakers(|b| b.after_llm_call(LlmOutcome::Failed))
                    .unwrap_or(Verdict::Continue);
                let error = format!("llm call failed: {error}");
                let counted = cell.fail(&error, verdict);
                Next::End(stopped(counted, iteration).unwrap_or_else(|| {
                    let mut out = outcome(TerminationReason::LlmError, iteration, None);
                    out.error = Some(error);
                    out
                }))
            }
        }
    }

    /// The model's reply: usage accounted, the message in the history. An answer ends the turn
    /// (after up to `max_tokens_recoveries` continuations when the token limit cut it); tool calls
    /// go on.
    fn read_response(&mut self, response: LlmResponse) -> Next<Vec<ToolCall>> {
        let cell = self.cell;
        let iteration = self.iteration;
        cell.record_usage(response.usage);
        let calls = response.message.tool_calls.clone();
        let llm_outcome = if calls.is_empty() {
            LlmOutcome::Answer
        } else {
            LlmOutcome::ToolCalls
        };
        let verdict = cell
            .breakers(|b| b.after_llm_call(llm_outcome))
            .unwrap_or(Verdict::Continue);
        cell.append_history(response.message.clone());
        if !calls.is_empty() {
            return match stopped(cell.obey(verdict), iteration) {
                Some(done) => Next::End(done),
                None => Next::Go(calls),
            };
        }
        let text = response.message.content.unwrap_or_default();
        let cut = response.finish_reason == FinishReason::Length;
        if cut && self.recoveries < cell.settings.max_tokens_recoveries {
            self.recoveries += 1;
            self.partial.push_str(&text);
            cell.append_history(ChatMessage::user(CONTINUE_PROMPT).internal());
            return Next::Again;
        }
        if let Some(done) = stopped(cell.succeed(verdict), iteration) {
            return Next::End(done);
        }
        self.partial.push_str(&text);
        let answer = std::mem::take(&mut self.partial);
        let mut out = outcome(TerminationReason::Answered, iteration, Some(answer));
        // Still cut after the last recovery: the caller must know the answer is incomplete.
        out.truncated = cut;
        if cut {
            tracing::warn!(
                agent = %cell.key,
                recoveries = self.recoveries,
                "answer still cut by the model's token limit after the last max-tokens recovery; marked truncated"
            );
        }
        Next::End(out)
    }

    /// Runs the calls of one response: concurrently when all are SAFE_CHAIN (a model's parallel
    /// tool calls, e.g. several delegations), else one after the other, stopping after a DANGEROUS
    /// one or a trip (the calls not run get a "not run" result, so the conversation stays valid).
    /// Results are accounted in call order either way.
    async fn run_tools(&self, calls: &[ToolCall]) -> Next<Vec<ToolStep>> {
        let cell = self.cell;
        let (token, lineage) = (self.token, &self.lineage);
        // In parallel only when no call waits for the permission gate (one ask at a time, each
        // in WAITING_FOR_INPUT).
        let single = !cell.settings.multi_action;
        let parallel = calls.len() > 1
            && !single
            && calls.iter().all(|c| {
                cell.tools
                    .get(&c.function.name)
                    .is_some_and(|(spec, _)| spec.category == ToolCategory::SafeChain)
                    && gated(
                        cell,
                        c.function.name.as_str(),
                        ToolCategory::SafeChain,
                        || tools::parse_arguments(&c.function.arguments).unwrap_or_default(),
                    )
                    .is_none()
            });
        let mut steps = Vec::with_capacity(calls.len());
        if parallel {
            let executed =
                futures::future::join_all(calls.iter().map(|c| execute(cell, token, c, lineage)))
                    .await;
            for (call, executed) in calls.iter().zip(executed) {
                steps.push(account(cell, call, executed));
            }
            append_captured(cell);
            return Next::Go(steps);
        }
        for (i, call) in calls.iter().enumerate() {
            let step = account(cell, call, execute(cell, token, call, lineage).await);
            let stop = match &step {
                ToolStep::Done { category, .. } => *category == Some(ToolCategory::Dangerous),
                ToolStep::Stopped(_) => true,
                ToolStep::Halted => {
                    return Next::End(outcome(TerminationReason::Halted, self.iteration, None))
                }
            };
            steps.push(step);
            if stop || single {
                // One DANGEROUS tool per tick; nothing after a trip; one action per tick when
                // multi-action is off.
                let result = if stop {
                    NOT_RUN_RESULT
                } else {
                    NOT_RUN_SINGLE_RESULT
                };
                for skipped in &calls[i + 1..] {
                    cell.append_history(ChatMessage::tool_result(&skipped.id, result));
                }
                break;
            }
        }
        append_captured(cell);
        Next::Go(steps)
    }

    /// What the tools' results mean for the turn: a halt or a trip ends it, as do a TERMINAL or
    /// DANGEROUS tool and a context at its critical size; otherwise the next iteration.
    fn conclude(&mut self, steps: Vec<ToolStep>) -> Next<()> {
        let iteration = self.iteration;
        let mut ended_by = None;
        let mut all_anomalies = true;
        let mut critical = false;
        for step in steps {
            match step {
                ToolStep::Halted => return self.end(TerminationReason::Halted, iteration),
                ToolStep::Stopped(counted) => {
                    return Next::End(stopped(counted, iteration).unwrap_or_else(|| {
                        outcome(TerminationReason::SafetyLockout, iteration, None)
                    }))
                }
                ToolStep::Done {
                    category,
                    anomaly,
                    critical: c,
                } => {
                    all_anomalies &= anomaly;
                    critical |= c;
                    match category {
                        Some(ToolCategory::Terminal) => {
                            ended_by.get_or_insert(TerminationReason::TerminalTool);
                        }
                        Some(ToolCategory::Dangerous) => {
                            ended_by = Some(TerminationReason::DangerousTool);
                        }
                        _ => {}
                    }
                }
            }
        }
        self.last_was_parse_error = all_anomalies;
        if let Some(reason) = ended_by {
            return self.end(reason, iteration);
        }
        if critical {
            return self.end(TerminationReason::CriticalTokens, iteration);
        }
        if !self.cell.settings.multi_action {
            return self.end(TerminationReason::SingleAction, iteration);
        }
        Next::Go(())
    }
}

/// Routes an exceeded limit through the team's checkpoint. In interactive mode the agent waits in
/// `WAITING_FOR_INPUT`, and a halt still preempts the ask. `None` = halted.
#[allow(clippy::too_many_arguments)]
async fn checkpoint(
    cell: &AgentCell,
    token: &CancellationToken,
    run_id: &str,
    kind: LimitKind,
    current: f64,
    configured: f64,
    extension: f64,
) -> Option<(LimitDecision, LimitContext)> {
    let ctx = LimitContext {
        extension,
        run_id: run_id.to_owned(),
        agent: cell.key.clone(),
        kind,
        current,
        configured,
        // From the newest back: an answer or a tool result is usually near the end.
        partial_results: cell.lock().history.iter().rev().any(|m| {
            m.role == ChatRole::Tool || (m.role == ChatRole::Assistant && m.content.is_some())
        }),
    };
    let asks = cell.safety.checkpoint.mode() == warden_protocols::OnLimitMode::Interactive;
    if asks {
        let mut rec = cell.lock();
        let _ = cell.transition(&mut rec, AgentState::WaitingForInput, kind.as_str());
    }
    let decision = unless_halted(token, cell.safety.checkpoint.handle_limit_exceeded(&ctx)).await;
    if asks && decision.is_some() {
        let mut rec = cell.lock();
        if rec.state == AgentState::WaitingForInput {
            let _ = cell.transition(&mut rec, AgentState::Executing, "operator answered");
        }
    }
    let decision = decision?;
    cell.note(EventKind::LimitDecided {
        kind,
        current,
        configured,
        decision: decision.clone(),
    });
    Some((decision, ctx))
}

/// A refused limit: journal `limit_denied`, then one final tool-less LLM turn that summarises what
/// was done, where the outputs are and what remains, delivered as the answer with `limit_stopped`. If
/// that fails or is empty, the turn ends with a decision-enabling error instead.
async fn wrap_up(
    cell: &AgentCell,
    token: &CancellationToken,
    ctx: &LimitContext,
    decision: &LimitDecision,
    iterations: u32,
) -> TurnOutcome {
    cell.note(EventKind::LimitDenied {
        kind: ctx.kind,
        current: ctx.current,
        configured: ctx.configured,
        reason: decision.reason,
    });
    let cause = format!(
        "You must stop now: the limit on {} was reached and not extended ({}). Do not call any tool. In a few sentences, say what you have accomplished, where any outputs are, and what remains to be done.",
        ctx.kind.describe(),
        decision.reason
    );
    // The stop cause goes into the system prompt (some providers reject a user turn right after a
    // tool result).
    let mut messages = cell.conversation();
    match messages.first_mut() {
        Some(first) if first.role == ChatRole::System => {
            let prompt = first.content.take().unwrap_or_default();
            first.content = Some(format!("{prompt}\n\n{cause}"));
        }
        _ => messages.insert(0, ChatMessage::system(cause)),
    }
    let request = LlmRequest {
        agent: cell.key.clone(),
        messages,
        tools: Vec::new(),
    };
    let mut cut = false;
    let text = match call_provider(cell, token, request).await {
        None => return outcome(TerminationReason::Halted, iterations, None),
        Some(Ok(response)) => {
            cell.record_usage(response.usage);
            cut = response.finish_reason == FinishReason::Length;
            response
                .message
                .content
                .filter(|t| !t.trim().is_empty() && response.message.tool_calls.is_empty())
        }
        Some(Err(_)) => None,
    };
    // The per-tick cap keeps the design's own termination reason; the others are limit stops.
    let reason = if ctx.kind == LimitKind::IterationsPerTick {
        TerminationReason::MaxIterations
    } else {
        TerminationReason::LimitStopped
    };
    let mut out = outcome(reason, iterations, None);
    out.limit_stopped = true;
    out.limit_kind = Some(ctx.kind);
    match text {
        Some(text) => {
            cell.append_history(ChatMessage::assistant(text.clone()));
            out.answer = Some(text);
            // The wrap-up gets no max-tokens recovery: a cut one is marked.
            out.truncated = cut;
        }
        None => {
            out.error = Some(limit_refusal_message(
                ctx,
                decision,
                cell.safety.config.on_limit.auto_extend_times,
            ))
        }
    }
    out
}

/// One provider call, raced against the halt token (`None` = halted) and bounded by
/// `safety.timeout.llm_call_seconds` unless the provider bounds its own attempts
/// ([`crate::provider::Provider::bounds_its_own_calls`]): a call still running at the limit is
/// dropped and fails as [`ProviderError::Timeout`], a failed call like any other.
pub(super) async fn call_provider(
    cell: &AgentCell,
    token: &CancellationToken,
    request: LlmRequest,
) -> Option<Result<LlmResponse, ProviderError>> {
    // No model call starts while the team's gate is closed (the cluster's fail safe) or this
    // agent is fenced (its cluster lease not renewed in time); a halt ends the wait.
    if !cell.safety.model_gate.wait_open_for(&cell.key, token).await {
        return None;
    }
    let span = telemetry::chat(cell.provider.name(), cell.provider.model(), &request);
    let result = call_provider_in(cell, token, request)
        .instrument(span.clone())
        .await;
    telemetry::chat_ended(&span, result.as_ref());
    // A result that comes back while the gate is closed (the cluster's fail safe: this node may
    // have missed a halt) is held until it opens — after the node read the halt key again. A halt
    // meanwhile drops it (stale); its tokens still count.
    if !cell.safety.model_gate.wait_open_for(&cell.key, token).await {
        if let Some(Ok(response)) = &result {
            cell.record_usage(response.usage);
        }
        return None;
    }
    result
}

/// [`call_provider`] inside its `chat` span.
async fn call_provider_in(
    cell: &AgentCell,
    token: &CancellationToken,
    request: LlmRequest,
) -> Option<Result<LlmResponse, ProviderError>> {
    // `complete` itself runs unguarded: a panic there is a crash of the agent (restart policy).
    // A panic inside the returned future is a failed call.
    let call = AssertUnwindSafe(cell.provider.complete(request)).catch_unwind();
    let limit = (!cell.provider.bounds_its_own_calls())
        .then(|| Duration::try_from_secs_f64(cell.safety.config.timeout.llm_call_seconds).ok())
        .flatten()
        .filter(|limit| !limit.is_zero());
    let bounded = async move {
        match limit {
            None => Some(call.await),
            Some(limit) => tokio::time::timeout(limit, call).await.ok(),
        }
    };
    let result = unless_halted(token, bounded).await?;
    let Some(result) = result else {
        let after_ms = limit.map_or(0, |l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
        tracing::warn!(agent = %cell.key, after_ms, "llm call timed out (safety.timeout.llm_call_seconds)");
        return Some(Err(ProviderError::Timeout { after_ms }));
    };
    Some(result.unwrap_or_else(|payload| {
        Err(ProviderError::Panicked {
            message: panic_message(payload),
        })
    }))
}

enum ToolStep {
    Done {
        category: Option<ToolCategory>,
        /// Unknown tool or unusable arguments (a parse error of the model's).
        anomaly: bool,
        /// The context reached the critical advisory threshold.
        critical: bool,
    },
    Stopped(Counted),
    Halted,
}

/// What happened to one tool call.
enum Executed {
    /// A halt stopped it (before it started, or while it ran).
    Halted,
    Ran(ToolRun, Option<AnomalyKind>),
}

/// Runs one tool call through the agent's [`tools::ToolRunner`]: circuit breaker, JSON-schema
/// validation, cache, the halt gate, timeout, panic catching. Records nothing in the history or the
/// error count (see [`account`]). The call runs inside its `execute_tool` span (the parent of a
/// delegate's turn).
async fn execute(
    cell: &Arc<AgentCell>,
    token: &CancellationToken,
    call: &ToolCall,
    lineage: &Arc<[AgentKey]>,
) -> Executed {
    let span = telemetry::execute_tool(&call.function.name, &call.id, &call.function.arguments);
    let executed = execute_in(cell, token, call, lineage)
        .instrument(span.clone())
        .await;
    let run = match &executed {
        Executed::Halted => None,
        Executed::Ran(run, _) => Some(run),
    };
    telemetry::tool_ended(&span, run);
    executed
}

/// [`execute`] inside its span.
async fn execute_in(
    cell: &Arc<AgentCell>,
    token: &CancellationToken,
    call: &ToolCall,
    lineage: &Arc<[AgentKey]>,
) -> Executed {
    let name = call.function.name.as_str();
    let args = match tools::parse_arguments(&call.function.arguments) {
        Ok(args) => args,
        Err(error) => {
            return rejected(
                cell,
                call,
                ToolRun {
                    result: Err(error),
                    cached: false,
                    executed: false,
                    circuit: CircuitStep::NotChecked,
                    category: cell.tools.get(name).map(|(s, _)| s.category),
                },
                Some(AnomalyKind::InvalidJson),
            )
        }
    };
    // The permission gate's ruling, on the parsed arguments (`None`: allowed outright).
    let gate = cell
        .tools
        .get(name)
        .map(|(spec, _)| spec.category)
        .and_then(|category| {
            gated(cell, name, category, || args.clone())
                .map(|(ruling, arguments)| (ruling, category, arguments))
        });
    let pending = match cell.runner().admit(&cell.tools, name, args) {
        Admission::Finished(run) => {
            let anomaly = match &run.result {
                Err(ToolError::Unknown(_)) => Some(AnomalyKind::UnknownTool),
                Err(ToolError::InvalidArguments(_)) => Some(AnomalyKind::BadArguments),
                _ => None,
            };
            if run.cached {
                cell.note(EventKind::ToolFinished {
                    call_id: call.id.clone(),
                    tool: name.to_owned(),
                    ok: true,
                    error: None,
                });
                return Executed::Ran(run, None);
            }
            return rejected(cell, call, run, anomaly);
        }
        Admission::Ready(pending) => pending,
    };
    // After validation (an operator is never asked about a call that could not run), before the
    // tool starts. A halt while asked drops the ask and the call: the tool never runs.
    if let Some((ruling, category, arguments)) = gate {
        match permit(cell, token, call, ruling, category, arguments).await {
            None => return Executed::Halted,
            Some(decision) if decision.allow => {}
            Some(decision) => {
                drop(pending);
                let message = warden_protocols::permission_refusal(
                    name,
                    &decision,
                    cell.settings.permissions.mode_key(),
                );
                let run = ToolRun {
                    result: Err(ToolError::Refused(message)),
                    cached: false,
                    executed: false,
                    circuit: CircuitStep::NotChecked,
                    category: Some(category),
                };
                return rejected(cell, call, run, None);
            }
        }
    }
    if !cell.begin_tool(&call.id, name) {
        return Executed::Halted;
    }
    let ctx = ToolContext {
        agent: cell.key.clone(),
        call_id: call.id.clone(),
        lineage: lineage.clone(),
    };
    let retries = Retries { cell, call, token };
    let executed = pending.execute_observed(ctx, cell.settings.tool_timeout, &retries);
    // `None` twice over: halted while the tool ran or waited to be retried, or its retries were
    // stopped by a halt.
    let Some(Some(run)) = unless_halted(token, executed).await else {
        return Executed::Halted;
    };
    // A result that raced a halt (done in the poll the halt landed in) is not applied either.
    if token.is_cancelled() {
        return Executed::Halted;
    }
    cell.end_tool(
        &call.id,
        name,
        run.result.as_ref().err().map(ToString::to_string),
    );
    if let CircuitStep::Admitted {
        transition: Some(transition),
        ..
    } = &run.circuit
    {
        let transition = match transition {
            CircuitTransition::Opened { failures } => format!("opened after {failures} failures"),
            CircuitTransition::Reopened { failures } => {
                format!("reopened after {failures} failures")
            }
            CircuitTransition::Closed => "closed".to_owned(),
        };
        cell.note(EventKind::ToolCircuitChanged {
            tool: name.to_owned(),
            transition,
        });
    }
    Executed::Ran(run, None)
}

/// A call's retries ([`tools::retry`]): each is journaled (`tool_retried`) and logged, and none
/// starts once a halt is requested (a halt during the wait drops the call's future before that).
struct Retries<'a> {
    cell: &'a AgentCell,
    call: &'a ToolCall,
    token: &'a CancellationToken,
}

impl tools::RetryObserver for Retries<'_> {
    fn retrying(&self, attempt: u32, max_attempts: u32, error: &ToolError, delay: Duration) {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(
            agent = %self.cell.key,
            tool = %self.call.function.name,
            attempt,
            max_attempts,
            %error,
            delay_ms,
            "tool call failed with a retryable error; trying again"
        );
        self.cell.note(EventKind::ToolRetried {
            call_id: self.call.id.clone(),
            tool: self.call.function.name.clone(),
            attempt,
            max_attempts,
            error: error.to_string(),
            delay_ms,
        });
    }

    fn may_retry(&self) -> bool {
        !self.token.is_cancelled() && !self.cell.halt_requested()
    }
}

/// The permission gate's ruling for a call of `name`, when it is not a plain `allow`: the ruling
/// and the arguments (made by `arguments` only then).
fn gated(
    cell: &AgentCell,
    name: &str,
    category: ToolCategory,
    arguments: impl FnOnce() -> serde_json::Value,
) -> Option<(Ruling, serde_json::Value)> {
    let policy = &cell.settings.permissions;
    // Most calls of most teams: nothing but the tier defaults, and `allow` for this tier.
    if policy.config().rules.is_empty()
        && policy.config().tier(category) == PermissionVerdict::Allow
    {
        return None;
    }
    let arguments = arguments();
    let ruling = policy.rule_for(name, category, &arguments);
    (ruling.verdict != PermissionVerdict::Allow).then_some((ruling, arguments))
}

/// The permission gate for a call ruled `deny` or `ask`: journals the ask (`permission_asked`) and
/// the decision (`permission_decided`, before an allowed call starts). While an operator is asked
/// the agent waits in `WAITING_FOR_INPUT`, and a halt preempts the ask. `None` = halted.
async fn permit(
    cell: &AgentCell,
    token: &CancellationToken,
    call: &ToolCall,
    ruling: Ruling,
    category: ToolCategory,
    arguments: serde_json::Value,
) -> Option<PermissionDecision> {
    let tool = call.function.name.clone();
    // What the agent said with the call: the content of the message that made it.
    let last_message = cell
        .lock()
        .history
        .iter()
        .rev()
        .find(|m| m.role == ChatRole::Assistant && m.tool_calls.iter().any(|c| c.id == call.id))
        .and_then(|m| m.content.clone())
        .filter(|text| !text.trim().is_empty());
    let request = PermissionRequest {
        agent: cell.key.clone(),
        run_id: cell.current_run_id(),
        call_id: call.id.clone(),
        tool: tool.clone(),
        category,
        arguments,
        last_message,
    };
    let policy = cell.settings.permissions.clone();
    let gate = &cell.safety.permissions;
    let waits = ruling.verdict == PermissionVerdict::Ask && gate.will_wait(&policy, &request);
    if waits {
        let mut rec = cell.lock();
        let _ = cell.transition(
            &mut rec,
            AgentState::WaitingForInput,
            &format!("permission: {tool}"),
        );
    }
    let asking = |iv: &warden_protocols::Intervention| {
        cell.note(EventKind::PermissionAsked {
            id: iv.id,
            call_id: call.id.clone(),
            tool: tool.clone(),
            arguments: crate::safety::canonical_json_cut(&request.arguments, 2000),
            rule: iv.config_key.clone(),
        })
    };
    let decision = unless_halted(token, gate.decide(&policy, ruling, &request, asking)).await;
    if waits && decision.is_some() {
        let mut rec = cell.lock();
        if rec.state == AgentState::WaitingForInput {
            let _ = cell.transition(&mut rec, AgentState::Executing, "operator answered");
        }
    }
    let decision = decision?;
    // A result that raced a halt is not applied.
    if token.is_cancelled() {
        return None;
    }
    cell.note(EventKind::PermissionDecided {
        call_id: call.id.clone(),
        tool,
        decision: decision.clone(),
    });
    Some(decision)
}

/// A call that did not start (unknown tool, unparsable or invalid arguments, open circuit, refused
/// by the permission gate).
fn rejected(
    cell: &AgentCell,
    call: &ToolCall,
    run: ToolRun,
    anomaly: Option<AnomalyKind>,
) -> Executed {
    cell.note(EventKind::ToolFinished {
        call_id: call.id.clone(),
        tool: call.function.name.clone(),
        ok: false,
        error: run.result.as_ref().err().map(ToString::to_string),
    });
    Executed::Ran(run, anomaly)
}

/// Puts a call's result in the history (the model sees errors as the tool's result, with the context
/// advisory appended), and runs the breakers on it.
fn account(cell: &AgentCell, call: &ToolCall, executed: Executed) -> ToolStep {
    let (run, anomaly) = match executed {
        Executed::Halted => return ToolStep::Halted,
        Executed::Ran(run, anomaly) => (run, anomaly),
    };
    let mut content = match (&run.result, &anomaly) {
        (Err(ToolError::Unknown(_)), _) => {
            let known: Vec<&str> = cell.tools.names().collect();
            serde_json::json!({
                "success": false,
                "error": format!("unknown tool `{}`; available tools: {}", call.function.name, known.join(", ")),
            })
            .to_string()
        }
        _ => run.content(),
    };
    let mut critical = false;
    if cell.settings.max_context_tokens > 0 {
        // Measured on what the model will be sent (the fitted conversation), not the full history.
        let max = cell.settings.max_context_tokens;
        let sent = cell.conversation();
        let estimate = context::estimate_tokens(&sent)
            + context::estimate_message_tokens(&ChatMessage::tool_result(&call.id, &content));
        critical = context::advisory(estimate, max).is_critical();
        content = context::append_advisory(&content, estimate, max);
    }
    cell.append_history(ChatMessage::tool_result(&call.id, content));
    // Refused by the permission gate: neither a success nor an error of the agent's; it did not
    // run, so its category does not end the turn either.
    if matches!(run.result, Err(ToolError::Refused(_))) {
        return ToolStep::Done {
            category: None,
            anomaly: false,
            critical,
        };
    }
    let tool_outcome = match (&run.result, anomaly) {
        (Ok(_), _) => ToolOutcome::Ok,
        (Err(_), Some(kind)) => ToolOutcome::Anomaly(kind),
        (Err(_), None) => ToolOutcome::Failed,
    };
    let verdict = cell
        .breakers(|b| {
            let fingerprint = b.fingerprint(call);
            b.after_tool_execution(fingerprint, tool_outcome)
        })
        .unwrap_or(Verdict::Continue);
    let counted = match &run.result {
        Ok(_) => cell.succeed(verdict),
        Err(error) => {
            let name = &call.function.name;
            cell.fail(&format!("tool {name} failed: {error}"), verdict)
        }
    };
    if counted != Counted::Below {
        return ToolStep::Stopped(counted);
    }
    ToolStep::Done {
        // A call that ran counts for its category (one DANGEROUS attempt per tick, success or not);
        // one that never started does not.
        category: if run.executed || run.cached {
            run.category
        } else {
            None
        },
        anomaly: anomaly.is_some(),
        critical,
    }
}
