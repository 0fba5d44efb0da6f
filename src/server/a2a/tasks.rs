//! A2A tasks as warden events. A task is one user event of one agent: its id is `AGENT/EVENT_ID`
//! (the event's id in the agent's journal), its context is the agent's key (an agent keeps one
//! conversation), and its state is read from the event's fate ([`EventFate`]) — in the journal,
//! so a task outlives a restart exactly as its event does. Nothing is stored beside the journal.
//!
//! | fate | state |
//! |---|---|
//! | pending | `submitted` |
//! | running | `working`, or `input-required` while the agent's limit ask waits |
//! | answered | `completed`, the answer as the artifact and the status message |
//! | refused (locked out, stopped, …) | `rejected` |
//! | discarded (a halt) | `canceled` |
//! | failed | `failed`, with why |

use crate::server::api::{self, ApiState};
use serde_json::json;
use std::time::Duration;
use warden_actors::{PendingReply, Submit, SubmitError};
use warden_protocols::{
    a2a::{
        codes, Artifact, ListTasksRequest, ListTasksResponse, Message, Part, Role,
        SendMessageRequest, Task, TaskState, TaskStatus,
    },
    Answer, EventFate, HaltCause, Intervention, OperatorReply, UserEvent, WorkRefusal,
};

/// The operator name journaled for what the A2A endpoint does (answers, cancels).
pub const A2A_OPERATOR: &str = "a2a:admin";

/// How long a blocking `SendMessage` waits for the task to end or ask at most; then it answers
/// with the task still `working` (the client reads on with `GetTask` or `SubscribeToTask`).
pub const MAX_BLOCKING_WAIT: Duration = Duration::from_secs(300);

/// How often a waiting send checks for a limit ask of its agent.
const POLL: Duration = Duration::from_millis(50);

/// How often a task without a reply to await (`GetTask`'s subscribers) reads its fate again.
const POLL_JOURNAL: Duration = Duration::from_millis(250);

/// `ListTasks`'s default and largest page.
const PAGE_DEFAULT: u32 = 50;
const PAGE_MAX: u32 = 100;

/// An A2A call's failure, sent as a JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct A2aError {
    /// The JSON-RPC code ([`codes`]).
    pub code: i64,
    /// What went wrong, and what to do.
    pub message: String,
}

impl A2aError {
    /// An error with this code and message.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        A2aError {
            code,
            message: message.into(),
        }
    }

    fn not_found(task: &str) -> Self {
        Self::new(codes::TASK_NOT_FOUND, format!("no task {task}"))
    }

    fn internal(err: impl std::fmt::Display) -> Self {
        Self::new(codes::INTERNAL_ERROR, err.to_string())
    }
}

/// Whether agent `key` is served here (a cluster node serves the agents it runs).
pub fn exposed(state: &ApiState, key: &str) -> bool {
    state.supervisor.get(key).is_some() && state.runs_elsewhere(key).is_none()
}

/// The task id of `agent`'s event `id`.
pub fn task_id(agent: &str, id: u64) -> String {
    format!("{agent}/{id}")
}

/// `(agent, event id)` of a task id (`None`: not one warden gives).
pub fn parse_task_id(task: &str) -> Option<(&str, u64)> {
    let (agent, id) = task.rsplit_once('/')?;
    let id = id.parse().ok().filter(|id| *id > 0)?;
    (!agent.is_empty()).then_some((agent, id))
}

fn agent_message(task: &str, agent: &str, suffix: &str, text: impl Into<String>) -> Message {
    Message {
        message_id: format!("{task}#{suffix}"),
        context_id: Some(agent.to_owned()),
        task_id: Some(task.to_owned()),
        role: Role::Agent,
        parts: vec![Part::text(text)],
        metadata: None,
    }
}

/// The ask (a limit or a permission ask) agent `agent` waits on now, if any (the oldest).
pub fn pending_ask(state: &ApiState, agent: &str) -> Option<Intervention> {
    let bus = state.bus.as_ref()?;
    bus.pending()
        .into_iter()
        .filter(|i| i.agent.as_str() == agent)
        .min_by_key(|i| i.id)
}

/// The task of `agent`'s event `id` with this fate.
pub fn task_of(state: &ApiState, agent: &str, id: u64, fate: &EventFate) -> Task {
    let tid = task_id(agent, id);
    let status = |state, message: Option<Message>| TaskStatus { state, message };
    let mut artifacts = Vec::new();
    let status = match fate {
        EventFate::Pending => status(TaskState::Submitted, None),
        EventFate::Running => match pending_ask(state, agent) {
            Some(ask) => status(
                TaskState::InputRequired,
                Some(agent_message(
                    &tid,
                    agent,
                    &format!("ask-{}", ask.id),
                    format!(
                        "{} (answer yes or no, a note after it, in a message with taskId {tid})",
                        ask.question
                    ),
                )),
            ),
            None => status(TaskState::Working, None),
        },
        EventFate::Answered { answer, .. } => {
            artifacts.push(Artifact {
                artifact_id: "answer".into(),
                name: Some("answer".into()),
                parts: vec![Part::text(answer.clone())],
            });
            status(
                TaskState::Completed,
                Some(agent_message(&tid, agent, "answer", answer.clone())),
            )
        }
        EventFate::Refused { refusal } => status(
            TaskState::Rejected,
            Some(agent_message(&tid, agent, "refused", refusal.to_string())),
        ),
        EventFate::Discarded => status(
            TaskState::Canceled,
            Some(agent_message(
                &tid,
                agent,
                "canceled",
                "a halt of the agent canceled it",
            )),
        ),
        EventFate::Failed { reason, error } => status(
            TaskState::Failed,
            Some(agent_message(
                &tid,
                agent,
                "failed",
                match error {
                    Some(error) => format!("{reason:?}: {error}"),
                    None => format!("{reason:?}"),
                },
            )),
        ),
    };
    Task {
        id: tid,
        context_id: agent.to_owned(),
        status,
        artifacts,
        metadata: Some(json!({ "agent": agent, "eventId": id })),
    }
}

/// What became of task `task`, from the journal.
///
/// # Errors
/// `-32001` for a task id warden never gave (unknown agent, unknown event); `-32603` when the
/// journal cannot be read.
pub async fn get(state: &ApiState, task: &str) -> Result<Task, A2aError> {
    let (agent, id) = parse_task_id(task).ok_or_else(|| A2aError::not_found(task))?;
    if !exposed(state, agent) {
        return Err(A2aError::not_found(task));
    }
    let fate = fate(state, agent, id)
        .await?
        .ok_or_else(|| A2aError::not_found(task))?;
    Ok(task_of(state, agent, id, &fate))
}

async fn fate(state: &ApiState, agent: &str, id: u64) -> Result<Option<EventFate>, A2aError> {
    api::fate_from_journal(state, agent, id)
        .await
        .map_err(|e| A2aError::internal(e.message))
}

/// The message's text: its text parts, joined by a blank line.
///
/// # Errors
/// `-32005` for a part that is not text (files and data are not read); `-32602` for no text.
pub fn text_of(message: &Message) -> Result<String, A2aError> {
    let mut texts = Vec::new();
    for part in &message.parts {
        match &part.text {
            Some(text) if part.raw.is_none() && part.url.is_none() && part.data.is_none() => {
                texts.push(text.as_str())
            }
            _ => {
                return Err(A2aError::new(
                    codes::CONTENT_TYPE_NOT_SUPPORTED,
                    "warden's agents read text parts only (no file, url, raw or data parts)",
                ))
            }
        }
    }
    let text = texts.join("\n\n");
    if text.trim().is_empty() {
        return Err(A2aError::new(
            codes::INVALID_PARAMS,
            "the message has no text (params.message.parts[].text)",
        ));
    }
    Ok(text)
}

fn metadata_agent(meta: Option<&serde_json::Value>) -> Option<&str> {
    meta?.get("agent")?.as_str()
}

/// The agent a new message goes to: `message.metadata.agent`, else `params.metadata.agent`, else
/// the first agent this node runs.
///
/// # Errors
/// `-32602` for an agent not served here, or no agent at all.
pub fn target(state: &ApiState, req: &SendMessageRequest) -> Result<String, A2aError> {
    let named = metadata_agent(req.message.metadata.as_ref())
        .or_else(|| metadata_agent(req.metadata.as_ref()));
    match named {
        Some(agent) if exposed(state, agent) => Ok(agent.to_owned()),
        Some(agent) => Err(A2aError::new(
            codes::INVALID_PARAMS,
            format!(
                "metadata.agent: no agent {agent} here (the agent card's skills list the agents)"
            ),
        )),
        None => state
            .supervisor
            .statuses()
            .into_iter()
            .map(|s| s.key.to_string())
            .find(|k| exposed(state, k))
            .ok_or_else(|| A2aError::new(codes::INVALID_PARAMS, "this server runs no agent")),
    }
}

/// A message accepted: the task, and the reply to await when it was queued now.
#[derive(Debug)]
pub struct Sent {
    /// The agent.
    pub agent: String,
    /// The event's id (0 for a send the agent rejected: nothing was queued).
    pub id: u64,
    /// The task as it is now.
    pub task: Task,
    /// The event's reply.
    pub reply: Option<PendingReply>,
}

/// `SendMessage`: a new message becomes a user event of its agent (`source = "a2a"`; its
/// `messageId` is the idempotency key, so a client's retry queues nothing twice); a message with
/// a `taskId` answers that task's limit ask.
///
/// # Errors
/// See [`text_of`], [`target`], [`answer`]; `-32602` for a `messageId` sent again with another
/// text; `-32603` when the event is queued but not durable.
pub async fn send(state: &ApiState, req: &SendMessageRequest) -> Result<Sent, A2aError> {
    if let Some(task) = req.message.task_id.as_deref() {
        return answer(state, task, &req.message).await;
    }
    let text = text_of(&req.message)?;
    let agent = target(state, req)?;
    let handle = state
        .agent(&agent)
        .map_err(|e| A2aError::new(codes::INVALID_PARAMS, e.message))?;
    let key = req.message.message_id.trim();
    let options = Submit {
        idempotency_key: (!key.is_empty() && key.len() <= 240).then(|| format!("a2a:{key}")),
        watch: true,
    };
    let event = UserEvent {
        source: "a2a".into(),
        sender: None,
        content: text,
    };
    match handle.submit(event, options).await {
        Ok(submitted) => {
            let id = submitted.id;
            let fate = if submitted.duplicate && submitted.reply.is_none() {
                fate(state, &agent, id).await?.unwrap_or(EventFate::Pending)
            } else {
                EventFate::Pending
            };
            Ok(Sent {
                task: task_of(state, &agent, id, &fate),
                agent,
                id,
                reply: submitted.reply,
            })
        }
        Err(SubmitError::KeyReused { id, .. }) => Err(A2aError::new(
            codes::INVALID_PARAMS,
            format!(
                "messageId {key:?} was sent before with another text (task {})",
                task_id(&agent, id)
            ),
        )),
        Err(err @ SubmitError::NotDurable { .. }) => Err(A2aError::internal(err)),
        Err(SubmitError::Refused(err)) => Ok(rejected(&agent, &req.message, &err.refusal)),
    }
}

/// A send the agent refused before queueing it: a `rejected` task that is not stored (warden
/// queued no event; `GetTask` does not find it).
fn rejected(agent: &str, message: &Message, refusal: &WorkRefusal) -> Sent {
    let tid = format!("{agent}/rejected:{}", message.message_id);
    let why = match refusal {
        WorkRefusal::MailboxFull { .. } => format!("{refusal}: send again later"),
        _ => refusal.to_string(),
    };
    Sent {
        agent: agent.to_owned(),
        id: 0,
        task: Task {
            id: tid.clone(),
            context_id: agent.to_owned(),
            status: TaskStatus {
                state: TaskState::Rejected,
                message: Some(agent_message(&tid, agent, "refused", why)),
            },
            artifacts: Vec::new(),
            metadata: Some(json!({ "agent": agent, "refusal": refusal })),
        },
        reply: None,
    }
}

/// The peer's next message on an `input-required` task answers its agent's ask: `yes`/`no` (the
/// first word; anything else is a no), the rest the note, journaled with the decision as
/// answered by `a2a:admin`.
///
/// # Errors
/// `-32001` unknown task; `-32004` a task that asks nothing (A2A's follow-up messages on a task
/// are answers only in warden).
pub async fn answer(state: &ApiState, task: &str, message: &Message) -> Result<Sent, A2aError> {
    let current = get(state, task).await?;
    let (agent, id) = parse_task_id(task).ok_or_else(|| A2aError::not_found(task))?;
    let ask = match (current.status.state, pending_ask(state, agent), &state.bus) {
        (TaskState::InputRequired, Some(ask), Some(_)) => ask,
        (other, _, _) => {
            return Err(A2aError::new(
                codes::UNSUPPORTED_OPERATION,
                format!(
                    "task {task} is {}, not input-required: a message on a task answers its \
                     agent's question; send a new message (no taskId) for new work",
                    other.v03()
                ),
            ))
        }
    };
    let text = text_of(message)?;
    let text = text.trim();
    let (word, note) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let word = word.trim_end_matches(|c: char| c.is_ascii_punctuation());
    let note = note.trim();
    let answer = Answer::parse(word);
    let reply = OperatorReply::by(
        answer.clone(),
        A2A_OPERATOR,
        (!note.is_empty()).then(|| note.to_owned()),
    );
    if let Some(bus) = &state.bus {
        bus.reply(ask.id, reply)
            .map_err(|e| A2aError::new(codes::UNSUPPORTED_OPERATION, e.to_string()))?;
    }
    tracing::info!(task, ask = ask.id, answer = %answer, "A2A peer answered an ask");
    let fate = fate(state, agent, id).await?.unwrap_or(EventFate::Running);
    Ok(Sent {
        task: task_of(state, agent, id, &fate),
        agent: agent.to_owned(),
        id,
        reply: None,
    })
}

/// Waits until the task's state differs from `last` (or the task is interrupted), `limit` at most,
/// and answers the task then (as it is at `limit`). With `reply`, the end is the reply; without,
/// the fate is read again from the journal.
pub async fn next(
    state: &ApiState,
    agent: &str,
    id: u64,
    reply: &mut Option<PendingReply>,
    last: Option<TaskState>,
    limit: Duration,
) -> Result<Task, A2aError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let task = match reply.as_mut().and_then(PendingReply::try_recv) {
            Some(settled) => {
                *reply = None;
                // The end leaves once its turn is on disk (as the REST `?wait=` and MCP do): a
                // crash right after must not find the task unfinished and fail it.
                let durable = match state.supervisor.get(agent) {
                    Some(handle) => handle.durable_so_far().await,
                    None => Ok(()),
                };
                if let Err(cause) = durable {
                    return Err(A2aError::internal(format!(
                        "task {} ended but is not durable: {cause}",
                        task_id(agent, id)
                    )));
                }
                task_of(state, agent, id, &api::settled_fate(settled))
            }
            None if reply.is_some() => {
                let running = if pending_ask(state, agent).is_some()
                    || last.is_some_and(|s| s != TaskState::Submitted)
                {
                    EventFate::Running
                } else {
                    // Still queued, or taken by a turn: the journal says which (read only until
                    // the task is seen working; the reply and the bus say the rest).
                    fate(state, agent, id).await?.unwrap_or(EventFate::Pending)
                };
                task_of(state, agent, id, &running)
            }
            None => {
                let fate = fate(state, agent, id)
                    .await?
                    .ok_or_else(|| A2aError::not_found(&task_id(agent, id)))?;
                task_of(state, agent, id, &fate)
            }
        };
        let state_now = task.status.state;
        if Some(state_now) != last
            || state_now.is_terminal()
            || tokio::time::Instant::now() >= deadline
        {
            return Ok(task);
        }
        let poll = if reply.is_some() { POLL } else { POLL_JOURNAL };
        tokio::time::sleep(poll.min(deadline - tokio::time::Instant::now())).await;
    }
}

/// A blocking send's wait: until the task ends or asks, [`MAX_BLOCKING_WAIT`] at most.
pub async fn until_interrupted(state: &ApiState, sent: &mut Sent) -> Result<Task, A2aError> {
    if sent.id == 0 || sent.task.status.state.is_interrupted() {
        return Ok(sent.task.clone());
    }
    let deadline = tokio::time::Instant::now() + MAX_BLOCKING_WAIT;
    let mut last = Some(sent.task.status.state);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let task = next(state, &sent.agent, sent.id, &mut sent.reply, last, left).await?;
        if task.status.state.is_interrupted() || left.is_zero() {
            return Ok(task);
        }
        last = Some(task.status.state);
    }
}

/// `CancelTask`: a halt of the task's agent and its delegates, as `POST /api/agents/{key}/halt`
/// (through the `SystemHalt` lane: no tool or model call of theirs after the acknowledgement).
/// Every other queued task of that agent is canceled with it, and the agent stays `STOPPED`
/// until `POST /api/agents/{key}/resume`.
///
/// # Errors
/// `-32001` unknown task; `-32002` a task already completed, failed, canceled or rejected.
pub async fn cancel(state: &ApiState, task: &str) -> Result<Task, A2aError> {
    let current = get(state, task).await?;
    if current.status.state.is_terminal() {
        return Err(A2aError::new(
            codes::TASK_NOT_CANCELABLE,
            format!("task {task} is already {}", current.status.state.v03()),
        ));
    }
    let (agent, id) = parse_task_id(task).ok_or_else(|| A2aError::not_found(task))?;
    let started = tokio::time::Instant::now();
    let cause = HaltCause::Operator {
        operator: A2A_OPERATOR.into(),
    };
    state
        .supervisor
        .halt(agent, cause)
        .await
        .map_err(|_| A2aError::not_found(task))?;
    state.metrics.halt_agent.observe(started.elapsed());
    let fate = fate(state, agent, id)
        .await?
        .unwrap_or(EventFate::Discarded);
    let mut task = task_of(state, agent, id, &fate);
    if !task.status.state.is_terminal() {
        // Halted and acknowledged; the journal has not said so yet (never expected).
        task.status.state = TaskState::Canceled;
    }
    Ok(task)
}

/// The highest event id of `agent` (0: none): ids count from 1 without gaps, so a doubling probe
/// and a bisection find it in O(log n) journal reads.
async fn last_id(state: &ApiState, agent: &str) -> Result<u64, A2aError> {
    let exists = |id| async move { fate(state, agent, id).await.map(|f| f.is_some()) };
    if !exists(1).await? {
        return Ok(0);
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while exists(hi).await? {
        lo = hi;
        hi = hi.saturating_mul(2);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if exists(mid).await? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// `ListTasks`: every event of every agent served here (or of `contextId`'s agent), newest first
/// per agent, agents in spawn order; `pageToken` is the task id the next page starts at.
///
/// # Errors
/// `-32602` for a page size over 100 or a page token warden did not give.
pub async fn list(state: &ApiState, req: &ListTasksRequest) -> Result<ListTasksResponse, A2aError> {
    let size = match req.page_size {
        None | Some(0) => PAGE_DEFAULT,
        Some(n) if n <= PAGE_MAX => n,
        Some(n) => {
            return Err(A2aError::new(
                codes::INVALID_PARAMS,
                format!("pageSize {n}: at most {PAGE_MAX}"),
            ))
        }
    };
    let mut agents: Vec<String> = state
        .supervisor
        .statuses()
        .into_iter()
        .map(|s| s.key.to_string())
        .filter(|k| exposed(state, k))
        .collect();
    if let Some(context) = req.context_id.as_deref().filter(|c| !c.is_empty()) {
        agents.retain(|a| a == context);
    }
    let mut start: Option<(String, u64)> = None;
    if let Some(token) = req.page_token.as_deref().filter(|t| !t.is_empty()) {
        let (agent, id) = parse_task_id(token)
            .filter(|(a, _)| agents.iter().any(|x| x == a))
            .ok_or_else(|| {
                A2aError::new(
                    codes::INVALID_PARAMS,
                    format!("pageToken {token:?} is not one warden gave"),
                )
            })?;
        let at = agents.iter().position(|a| a == agent).unwrap_or(0);
        agents.drain(..at);
        start = Some((agent.to_owned(), id));
    }
    let mut tasks = Vec::new();
    let mut next_page_token = String::new();
    'agents: for agent in agents {
        let top = match &start {
            Some((a, id)) if *a == agent => *id,
            _ => last_id(state, &agent).await?,
        };
        for id in (1..=top).rev() {
            if tasks.len() as u32 == size {
                next_page_token = task_id(&agent, id);
                break 'agents;
            }
            if let Some(fate) = fate(state, &agent, id).await? {
                tasks.push(task_of(state, &agent, id, &fate));
            }
        }
    }
    Ok(ListTasksResponse {
        tasks,
        next_page_token,
        page_size: size,
    })
}
