//! `warden run --config FILE`: start a team and talk to it.
//!
//! Events come from `--event` flags (exactly those, then it exits), or else one per line of standard
//! input; each answer is the reply correlated to its event (`AgentHandle::try_ask`). While an agent waits on
//! an interactive limit ask (`safety.on_limit.mode = "interactive"`) or a permission ask
//! (`[permissions]`), the next input line answers it
//! (`yes`/`no`). Without input (no terminal, no `--event` left) asks are refused (`no_bus`).
//!
//! The returned [`RunSummary`] gives the exit code: [`EXIT_LOCKED_OUT`] when the agent ended locked
//! out, [`EXIT_NO_ANSWER`] when events were sent and none was answered.

use crate::{
    cli::table::write_status_table, team::TeamFile, AgentRole, AskError, ChannelInterventionBus,
    MemoryJournal, Supervisor, UserEvent,
};
use std::{
    io::{self, Write},
    sync::Arc,
    time::Duration,
};
use tokio::sync::mpsc::UnboundedReceiver;
use warden_protocols::{AgentState, Answer, OperatorReply};

/// Who answers the asks `warden run` prints: the person at its terminal (journaled with the decision).
pub const TTY_OPERATOR: &str = "tty";

/// Appended to an answer the model's token limit still cut after the last max-tokens recovery
/// (`truncated` in the event's fate).
pub const TRUNCATED_MARK: &str = " [truncated: max_tokens]";

/// Options of `warden run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The agent to talk to (default: the first assistant).
    pub agent: Option<String>,
    /// Events to send, in order; when empty, lines of `input` are the events.
    pub events: Vec<String>,
}

/// How a `warden run` went, for its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// The agent talked to.
    pub agent: String,
    /// Events sent (blank lines are not events).
    pub events: usize,
    /// Events answered (the others failed or were refused).
    pub answered: usize,
    /// The agent ended locked out (`SAFETY_LOCKOUT`: a breaker tripped; an operator must unlock).
    pub locked_out: bool,
}

/// `warden run`'s exit code when its agent ended locked out.
pub const EXIT_LOCKED_OUT: u8 = 9;
/// `warden run`'s exit code when events were sent and none was answered (every turn failed or was
/// refused).
pub const EXIT_NO_ANSWER: u8 = 10;

impl RunSummary {
    /// Why the run failed, and its exit code: [`EXIT_LOCKED_OUT`] before [`EXIT_NO_ANSWER`];
    /// `None` when it did not (some answers, or no events at all, and not locked out).
    pub fn failure(&self) -> Option<(u8, String)> {
        if self.locked_out {
            Some((
                EXIT_LOCKED_OUT,
                format!(
                    "{} ended locked out (SAFETY_LOCKOUT), {} of {} events answered",
                    self.agent, self.answered, self.events
                ),
            ))
        } else if self.events > 0 && self.answered == 0 {
            Some((
                EXIT_NO_ANSWER,
                format!("{} answered none of {} events", self.agent, self.events),
            ))
        } else {
            None
        }
    }
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Runs the team until the events (or the input lines) are used up, then halts it and prints the
/// final status. `input` also answers interactive asks. Must run inside an actix `System`.
/// Returns how many events were answered and whether the agent ended locked out. The journal
/// is in memory: nothing is written to disk.
///
/// # Errors
///
/// An [`io::Error`] (kind `Other`) when the file has no agents, no assistant (or no agent
/// `options.agent`), or a provider or agent cannot be set up ([`TeamFile::spawn_agents`]); any
/// error of writing to `out`. A refused or failed event is not an error: it is printed and
/// counted in the summary.
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future leaves the team running (neither halted nor shut down)
/// and loses the summary; an event in flight is still answered, to nobody.
///
/// # Examples
///
/// ```
/// use warden::{cli::run::{run, RunOptions}, team::TeamFile};
///
/// let file = TeamFile::from_toml(
///     r#"
/// [providers.canned]
/// kind = "scripted"
/// replies = ["A room with a view, two nights."]
///
/// [[agents]]
/// key = "innkeeper"
/// provider = "canned"
/// "#,
/// )?;
/// let options = RunOptions { agent: None, events: vec!["A room, please.".into()] };
/// let mut out = Vec::new();
/// let summary = actix_rt::System::new().block_on(run(file, options, None, &mut out))?;
/// assert_eq!((summary.events, summary.answered), (1, 1));
/// assert!(summary.failure().is_none());
/// assert!(String::from_utf8_lossy(&out).contains("innkeeper: A room with a view, two nights."));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn run(
    file: TeamFile,
    options: RunOptions,
    mut input: Option<UnboundedReceiver<String>>,
    out: &mut dyn Write,
) -> io::Result<RunSummary> {
    if file.agents.is_empty() {
        return Err(io_err(
            "no agents configured: add [providers.NAME] and [[agents]] sections (see README, \"warden run\")",
        ));
    }
    let journal = Arc::new(MemoryJournal::new());
    let bus = Arc::new(ChannelInterventionBus::new());
    let mut builder = Supervisor::builder(file.config.clone(), journal.clone());
    if input.is_some() {
        builder = builder.intervention_bus(bus.clone());
    }
    let team = builder.build();
    // MCP servers first: a server that cannot start, or a tool an agent names that its server does
    // not offer, stops the run before any agent exists. Dropping `mcp` ends them.
    let mcp = file.start_mcp().await.map_err(io_err)?;
    // `[a2a_agents]`: before the agents (the `delegate` tool lists them). The journal is in
    // memory: no remote task outlives the run to be settled.
    if !file.a2a_agents.is_empty() {
        let clients = crate::a2a_client::A2aClients::connect(&file.a2a_agents)
            .await
            .map_err(io_err)?;
        team.set_a2a_peers(Arc::new(clients));
    }
    file.spawn_agents_with_mcp(&team, &[], mcp.as_ref())
        .map_err(io_err)?;
    let target = match &options.agent {
        Some(key) => team
            .get(key)
            .ok_or_else(|| io_err(format!("no agent `{key}` in the team file")))?,
        None => team
            .agents()
            .into_iter()
            .find(|a| a.status().role == AgentRole::Assistant)
            .ok_or_else(|| io_err("no assistant in the team file"))?,
    };
    let agents = team.len();
    let noun = if agents == 1 { "agent" } else { "agents" };
    writeln!(out, "talking to {} ({agents} {noun})", target.key())?;
    // With --event, exactly those events; without, one per input line. Input also answers asks.
    let from_input = options.events.is_empty();
    let mut scripted = options.events.into_iter();
    let mut summary = RunSummary {
        agent: target.key().to_string(),
        events: 0,
        answered: 0,
        locked_out: false,
    };
    loop {
        let line = match scripted.next() {
            Some(line) => Some(line),
            None if from_input => match &mut input {
                Some(rx) => rx.recv().await,
                None => None,
            },
            None => None,
        };
        let Some(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        summary.events += 1;
        let mut pending = match target.try_ask(UserEvent {
            source: "cli".into(),
            sender: Some("operator".into()),
            content: line,
        }) {
            Ok(pending) => pending,
            Err(err) => {
                writeln!(out, "refused: {err}")?;
                continue;
            }
        };
        // The answer, correlated to the event; meanwhile, an ask (a limit or a permission) is shown and
        // the next input line answers it.
        let mut asked = None;
        let settled = loop {
            tokio::select! {
                settled = &mut pending => break settled,
                () = actix_rt::time::sleep(Duration::from_millis(20)) => {}
            }
            if let Some(ask) = bus.pending().into_iter().next() {
                if asked != Some(ask.id) {
                    writeln!(out, "? {}", ask.question)?;
                    out.flush()?;
                    asked = Some(ask.id);
                    let answer = match &mut input {
                        Some(rx) => rx.recv().await.unwrap_or_default(),
                        None => String::new(),
                    };
                    let _ = bus.reply(
                        ask.id,
                        OperatorReply::by(Answer::parse(&answer), TTY_OPERATOR, None),
                    );
                }
            }
        };
        let key = target.key();
        match settled {
            Ok(reply) => {
                summary.answered += 1;
                writeln!(
                    out,
                    "{key}: {}{}",
                    reply.answer,
                    if reply.truncated { TRUNCATED_MARK } else { "" }
                )?
            }
            Err(AskError::Failed {
                error: Some(error), ..
            }) => writeln!(out, "{key}: [error] {error}")?,
            Err(err) => writeln!(out, "{key}: [{err}]")?,
        }
    }
    // Before the final halt, which stops every agent.
    let status = target.status();
    summary.locked_out = status.emergency_stop || status.state == AgentState::SafetyLockout;
    team.halt_all().await;
    writeln!(out)?;
    write_status_table(out, &team.statuses())?;
    team.shutdown().await;
    if let Some(mcp) = mcp {
        mcp.shutdown().await;
    }
    Ok(summary)
}
