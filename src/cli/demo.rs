//! `warden demo`: a small team on the built-in scripted model. No API key, no network.
//!
//! Act 1 — an assistant delegates to two sub-agents and answers.
//! Act 2 — a sub-agent's tool keeps failing: the consecutive-error breaker trips it into SAFETY_LOCKOUT;
//!          the assistant's next delegation to it is refused.
//! Act 3 — an operator unlocks it; delegation works again.
//! Act 4 — a SystemHalt reaches a busy agent behind a 10,000-message backlog: acted on first, the
//!          in-flight LLM call dropped, the backlog cleared and counted, nothing processed after it.
//! Act 5 — a verbose agent runs into its token budget: STOPPED before the call that would exceed it.
//! Act 6 — an agent reaches its loop cap; the operator is asked (at the terminal, or auto-denied
//!          without one) and the refused agent ends with a forced wrap-up.

use crate::{
    AgentHandle, AgentSpec, AgentState, AgentStatus, ChannelInterventionBus, FnTool, HaltCause,
    MemoryJournal, ScriptStep, ScriptedProvider, Supervisor, ToolCategory, ToolError, UserEvent,
    WardenConfig,
};
use serde_json::json;
use std::{
    io::{self, Write},
    num::NonZeroUsize,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};
use warden_protocols::EventKind;

/// What the demo showed (checked by the test suite).
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    /// Act 1: the concierge's answer after delegating; `None` if its turn ended without one.
    pub act1_answer: Option<String>,
    /// Act 2: the researcher's lockout reason; `None` if it was not locked out.
    pub lockout_reason: Option<String>,
    /// Act 2: the concierge's refused delegation to the locked-out researcher, as journaled;
    /// `None` if none was refused.
    pub refusal: Option<String>,
    /// Act 3: after the unlock, the concierge's delegation worked and it gave the expected answer.
    pub unlocked_and_answered: bool,
    /// Act 4: user events queued on the busy scribe before the halt (10,000).
    pub halt_backlog: u64,
    /// Act 4: queued ordinary messages the halt discarded (its acknowledgement's count).
    pub halt_discarded: u64,
    /// Act 4: turns the scribe ran after the halt: must be 0.
    pub processed_after_halt: u64,
    /// Act 4: in-flight model calls the halt dropped (1: the scribe was mid-call).
    pub llm_calls_dropped_by_halt: u64,
    /// Act 2: the repetition alert was injected into the researcher's history before the
    /// lockout.
    pub alert_injected: bool,
    /// Act 5: why the poet was stopped by its token budget; `None` if it was not.
    pub budget_stop: Option<String>,
    /// Act 5: model calls the poet made before it was stopped.
    pub budget_calls_made: u64,
    /// Act 6: the operator's first limit ask; `None` if none came.
    pub ask_question: Option<String>,
    /// Act 6: the answer given to it (`no` without a terminal); empty without an ask.
    pub ask_answer: String,
    /// Act 6: the surveyor's forced wrap-up after a refused ask; `None` when the ask was
    /// approved or the turn gave no answer.
    pub wrap_up: Option<String>,
    /// Every agent's status at the end, in spawn order.
    pub statuses: Vec<AgentStatus>,
}

/// Answers the operator's limit asks: `Some(line)` from a terminal, `None` when there is none (the
/// ask is then answered "no").
pub type Asker<'a> = &'a mut dyn FnMut(&str) -> Option<String>;

/// Plots in Act 6's valley: more than the loop cap lets the surveyor reach without an approval.
const VALLEY_PLOTS: u64 = 9;

/// Polls `cond` every 2 ms for up to 10 s.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> io::Result<()> {
    for _ in 0..5000 {
        if cond() {
            return Ok(());
        }
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("demo: timed out waiting for {what}"),
    ))
}

/// Sends `text` to `agent` and returns its answer (the reply correlated to the event), or `None`
/// when the event ended without one; times out after 10 s like [`wait_for`].
async fn ask(agent: &AgentHandle, text: &str) -> io::Result<Option<String>> {
    match actix_rt::time::timeout(Duration::from_secs(10), agent.ask(UserEvent::new(text))).await {
        Ok(Ok(reply)) => Ok(Some(reply.answer)),
        Ok(Err(crate::AskError::NotQueued(err))) => Err(io::Error::other(err)),
        Ok(Err(_)) => Ok(None),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("demo: timed out waiting for {}", agent.key()),
        )),
    }
}

/// The demo's team: the concierge and its two sub-agents, with what the acts look at.
struct Stage {
    team: Supervisor,
    journal: Arc<MemoryJournal>,
    bus: Arc<ChannelInterventionBus>,
    concierge: AgentHandle,
    researcher: AgentHandle,
    scribe: AgentHandle,
    scribe_stats: Arc<crate::ScriptStats>,
}

/// Runs the demo, narrating to `out`. Must run inside an actix `System` (it starts two arbiter
/// threads). Takes a few seconds; no network.
///
/// # Errors
///
/// An [`io::Error`]: writing to `out` failed; `TimedOut`, a step the demo waits for did not
/// happen within 10 s; `Other`, the team refused a step (a spawn, a send, the unlock). Each is a
/// regression, not an outcome: the outcomes are in the report.
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future leaves the demo's team running on its arbiters, and
/// loses the report.
pub async fn run(out: &mut dyn Write, asker: Asker<'_>) -> io::Result<DemoReport> {
    let stage = stage()?;
    let mut report = DemoReport::default();
    act1_delegation(&stage, out, &mut report).await?;
    act2_lockout(&stage, out, &mut report).await?;
    act3_unlock(&stage, out, &mut report).await?;
    act4_halt_behind_a_backlog(&stage, out, &mut report).await?;
    act5_token_budget(&stage, out, &mut report).await?;
    act6_loop_cap(&stage, out, asker, &mut report).await?;
    report.statuses = stage.team.statuses();
    writeln!(out, "\n== Final status")?;
    crate::cli::table::write_status_table(out, &report.statuses)?;
    stage.team.shutdown().await;
    Ok(report)
}

/// The team of the first four acts on the scripted model: each agent's script, its tools.
fn stage() -> io::Result<Stage> {
    let mut config = WardenConfig::default();
    config.supervisor.arbiters = 2;
    config.mailbox.ordinary_capacity = NonZeroUsize::new(20_000).unwrap_or(NonZeroUsize::MIN);
    config.safety.budget.tokens_per_agent = 5_000;
    config.safety.loop_.max_iterations_per_task = 6;
    config.execution.max_iterations_per_tick = 10;
    let journal = Arc::new(MemoryJournal::new());
    let bus = Arc::new(ChannelInterventionBus::new());
    let team = Supervisor::builder(config, journal.clone())
        .intervention_bus(bus.clone())
        .build();

    let concierge_model = Arc::new(ScriptedProvider::new([
        // Act 1
        ScriptStep::call(
            "delegate",
            json!({"agent": "researcher", "task": "When does the library open?"}),
        ),
        ScriptStep::call(
            "delegate",
            json!({"agent": "scribe", "task": "Note: the library opens at 9."}),
        ),
        ScriptStep::reply("The library opens at 9 — I've noted it for you."),
        // Act 2
        ScriptStep::call(
            "delegate",
            json!({"agent": "researcher", "task": "And the museum?"}),
        ),
        ScriptStep::reply("My researcher is unavailable right now."),
        // Act 3
        ScriptStep::call(
            "delegate",
            json!({"agent": "researcher", "task": "And the museum?"}),
        ),
        ScriptStep::reply("The museum opens at 10."),
    ]));
    let researcher_model = Arc::new(ScriptedProvider::new(
        [
            ScriptStep::call(
                "fetch_page",
                json!({"url": "https://library.example/hours"}),
            ),
            ScriptStep::reply("Opens at 9am."),
        ]
        .into_iter()
        .chain(
            (0..5)
                .map(|_| ScriptStep::call("fetch_page", json!({"url": "https://broken.example/"}))),
        )
        .chain([
            ScriptStep::call("fetch_page", json!({"url": "https://museum.example/hours"})),
            ScriptStep::reply("Opens at 10am."),
        ]),
    ));
    let scribe_model = Arc::new(
        ScriptedProvider::new([
            ScriptStep::call("write_note", json!({"text": "library opens at 9"})),
            ScriptStep::reply("Noted."),
            // Act 4: a slow call that the halt will drop.
            ScriptStep::reply("slow answer").delayed(Duration::from_secs(30)),
        ])
        .with_fallback(|_| ScriptStep::reply("processed")),
    );
    let scribe_stats = scribe_model.stats();

    let fetch_page = FnTool::new(
        "fetch_page",
        "Fetch a web page",
        ToolCategory::SafeChain,
        |args, _ctx| async move {
            let url = args
                .get("url")
                .and_then(|u| u.as_str())
                .unwrap_or_default()
                .to_owned();
            if url.contains("broken") {
                Err(ToolError::Failed(format!("{url}: 404 not found")))
            } else {
                Ok(json!({"url": url, "body": "Opening hours: 9–17"}))
            }
        },
    );
    let write_note = FnTool::new(
        "write_note",
        "Write a note",
        ToolCategory::SafeChain,
        |_args, _ctx| async move { Ok(json!({"saved": true})) },
    );

    let concierge = team
        .spawn(
            AgentSpec::assistant("concierge", concierge_model)
                .with_system_prompt("You are a helpful concierge."),
        )
        .map_err(io::Error::other)?;
    let researcher = team
        .spawn(
            AgentSpec::sub_agent("researcher", "concierge", researcher_model).with_tool(fetch_page),
        )
        .map_err(io::Error::other)?;
    let scribe = team
        .spawn(AgentSpec::sub_agent("scribe", "concierge", scribe_model).with_tool(write_note))
        .map_err(io::Error::other)?;

    Ok(Stage {
        team,
        journal,
        bus,
        concierge,
        researcher,
        scribe,
        scribe_stats,
    })
}

/// Act 1: the concierge delegates to the researcher and the scribe, and answers.
async fn act1_delegation(
    stage: &Stage,
    out: &mut dyn Write,
    report: &mut DemoReport,
) -> io::Result<()> {
    let Stage { concierge, .. } = stage;
    writeln!(out, "== Act 1: the concierge delegates to two sub-agents")?;
    let act1_answer = ask(concierge, "When does the library open? Please note it.").await?;
    writeln!(
        out,
        "   concierge: {}",
        act1_answer.as_deref().unwrap_or("(no answer)")
    )?;
    report.act1_answer = act1_answer;
    Ok(())
}

/// Act 2: the researcher repeats a failing call until the breaker locks it out; the concierge's
/// next delegation to it is refused.
async fn act2_lockout(
    stage: &Stage,
    out: &mut dyn Write,
    report: &mut DemoReport,
) -> io::Result<()> {
    let Stage {
        concierge,
        researcher,
        journal,
        ..
    } = stage;
    writeln!(
        out,
        "\n== Act 2: the researcher keeps repeating a failing call"
    )?;
    researcher
        .try_send_event(UserEvent::new("Check https://broken.example/ please"))
        .map_err(io::Error::other)?;
    wait_for("lockout", || {
        researcher.state() == AgentState::SafetyLockout
    })
    .await?;
    let status = researcher.status();
    let lockout_reason = status.lockout.as_ref().map(|l| l.reason.clone());
    let alert_injected = researcher
        .record()
        .history
        .iter()
        .any(|m| m.internal && m.content.as_deref() == Some(crate::safety::REPETITION_ALERT));
    if alert_injected {
        writeln!(
            out,
            "   injected after 3 identical failures: \"{}\"",
            crate::safety::REPETITION_ALERT
        )?;
    }
    writeln!(
        out,
        "   researcher: {} — {}",
        status.state,
        lockout_reason.as_deref().unwrap_or("")
    )?;
    let act2_answer = ask(concierge, "And when does the museum open?").await?;
    let refusal = journal
        .events_of("concierge")
        .into_iter()
        .find_map(|e| match e.kind {
            EventKind::DelegationRefused { refusal, .. } => Some(refusal.to_string()),
            _ => None,
        });
    writeln!(
        out,
        "   delegation refused: {}",
        refusal.as_deref().unwrap_or("(none!)")
    )?;
    writeln!(out, "   concierge: {}", act2_answer.unwrap_or_default())?;
    report.lockout_reason = lockout_reason;
    report.alert_injected = alert_injected;
    report.refusal = refusal;
    Ok(())
}

/// Act 3: an operator unlocks the researcher; the concierge's delegation works again.
async fn act3_unlock(
    stage: &Stage,
    out: &mut dyn Write,
    report: &mut DemoReport,
) -> io::Result<()> {
    let Stage {
        concierge,
        researcher,
        ..
    } = stage;
    writeln!(out, "\n== Act 3: an operator unlocks the researcher")?;
    researcher
        .unlock("demo-operator")
        .await
        .map_err(io::Error::other)?;
    writeln!(out, "   researcher: {}", researcher.state())?;
    let act3 = ask(concierge, "Try the museum again?").await?;
    writeln!(out, "   concierge: {}", act3.as_deref().unwrap_or_default())?;
    let unlocked_and_answered = act3.as_deref() == Some("The museum opens at 10.");
    report.unlocked_and_answered = unlocked_and_answered;
    Ok(())
}

/// Act 4: a SystemHalt reaches the scribe, mid-call, behind a backlog of 10,000 events.
async fn act4_halt_behind_a_backlog(
    stage: &Stage,
    out: &mut dyn Write,
    report: &mut DemoReport,
) -> io::Result<()> {
    let Stage {
        scribe,
        scribe_stats,
        ..
    } = stage;
    writeln!(out, "\n== Act 4: SystemHalt behind a backlog")?;
    let backlog = 10_000u64;
    scribe
        .try_send_event(UserEvent::new("Take a long note"))
        .map_err(io::Error::other)?;
    wait_for("scribe busy", || {
        scribe_stats.calls.load(Ordering::SeqCst) == 3
    })
    .await?;
    for i in 0..backlog {
        scribe
            .try_send_event(UserEvent::new(format!("note {i}")))
            .map_err(io::Error::other)?;
    }
    let turns_before = scribe.status().turns;
    let queued = scribe.status().queued.ordinary;
    writeln!(
        out,
        "   scribe is {} with {queued} ordinary messages queued",
        scribe.state()
    )?;
    let ack = scribe
        .halt(HaltCause::Operator {
            operator: "demo-operator".into(),
        })
        .await;
    // Give anything that could still run a chance to (nothing should).
    actix_rt::time::sleep(Duration::from_millis(50)).await;
    let processed_after_halt = scribe.status().turns - turns_before;
    let dropped = scribe_stats.dropped_in_flight.load(Ordering::SeqCst);
    writeln!(
        out,
        "   halt acknowledged: {} — {} queued messages discarded, {} processed after the halt, {} in-flight LLM call dropped",
        ack.state, ack.discarded, processed_after_halt, dropped
    )?;
    report.halt_backlog = backlog;
    report.halt_discarded = ack.discarded;
    report.processed_after_halt = processed_after_halt;
    report.llm_calls_dropped_by_halt = dropped;
    Ok(())
}

/// Act 5: a verbose poet runs into its token budget.
async fn act5_token_budget(
    stage: &Stage,
    out: &mut dyn Write,
    report: &mut DemoReport,
) -> io::Result<()> {
    let team = &stage.team;
    writeln!(
        out,
        "\n== Act 5: a token budget (safety.budget.tokens_per_agent = 5000)"
    )?;
    let poet_model = Arc::new(
        ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("la ".repeat(2_000))),
    );
    let poet_stats = poet_model.stats();
    let poet = team
        .spawn(AgentSpec::assistant("poet", poet_model).without_delegation())
        .map_err(io::Error::other)?;
    for i in 0..5 {
        if poet.state() == AgentState::Stopped {
            break;
        }
        poet.try_send_event(UserEvent::new(format!("another long poem, please ({i})")))
            .map_err(io::Error::other)?;
        wait_for("poet", || {
            poet.status().turns == i + 1 || poet.state() == AgentState::Stopped
        })
        .await?;
    }
    let poet_status = poet.status();
    let budget_stop = poet_status.stopped_by.as_ref().map(|s| s.reason.clone());
    let budget_calls_made = poet_stats.calls.load(Ordering::SeqCst);
    writeln!(
        out,
        "   poet: {} after {} LLM calls and {} tokens — {}",
        poet_status.state,
        budget_calls_made,
        poet_status.tokens_used,
        budget_stop.as_deref().unwrap_or("(not stopped!)")
    )?;
    report.budget_stop = budget_stop;
    report.budget_calls_made = budget_calls_made;
    Ok(())
}

/// Act 6: a surveyor reaches its loop cap; the operator is asked (`asker`) whether it goes on.
async fn act6_loop_cap(
    stage: &Stage,
    out: &mut dyn Write,
    asker: Asker<'_>,
    report: &mut DemoReport,
) -> io::Result<()> {
    let Stage {
        team, journal, bus, ..
    } = stage;
    writeln!(
        out,
        "\n== Act 6: a loop cap (safety.loop.max_iterations_per_task = 6), interactive mode"
    )?;
    let counter = std::sync::atomic::AtomicU64::new(0);
    let surveyor_model = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        if req.tools.is_empty() {
            return ScriptStep::reply(
                "I surveyed plots 1 to 6 (notes in the survey log); plots 7 and up remain.",
            );
        }
        let plot = counter.fetch_add(1, Ordering::SeqCst) + 1;
        if plot > VALLEY_PLOTS {
            // Reached only when the operator let it go on past the cap.
            return ScriptStep::reply(format!(
                "I surveyed all {VALLEY_PLOTS} plots in the valley."
            ));
        }
        ScriptStep::call("survey", json!({"plot": plot}))
    }));
    let survey = FnTool::new(
        "survey",
        "Survey a plot",
        ToolCategory::SafeChain,
        |args, _ctx| async move {
            Ok(json!({"plot": args.get("plot").cloned().unwrap_or_default(), "ok": true}))
        },
    );
    let surveyor = team
        .spawn(
            AgentSpec::assistant("surveyor", surveyor_model)
                .with_tool(survey)
                .without_delegation(),
        )
        .map_err(io::Error::other)?;
    surveyor
        .try_send_event(UserEvent::new("Survey every plot in the valley."))
        .map_err(io::Error::other)?;
    wait_for("the ask", || !bus.pending().is_empty()).await?;
    writeln!(out, "   surveyor is {}", surveyor.state())?;
    // Every ask is shown and answered until the turn ends: an approved surveyor goes on, and could
    // reach the cap again (it does not: it finishes first), which is asked again.
    let mut ask_question = None;
    let mut ask_answer = String::new();
    let mut asked = std::collections::HashSet::new();
    let mut waited = 0u32;
    while surveyor.status().turns < 1 {
        let next = bus
            .pending()
            .into_iter()
            .find(|a| a.agent.as_str() == "surveyor" && !asked.contains(&a.id));
        let Some(ask) = next else {
            // Up to 10 s without an ask to answer, like `wait_for`.
            waited += 1;
            if waited > 5000 {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "demo: timed out waiting for surveyor",
                ));
            }
            actix_rt::time::sleep(Duration::from_millis(2)).await;
            continue;
        };
        waited = 0;
        asked.insert(ask.id);
        writeln!(out, "   ? {}", ask.question)?;
        out.flush()?;
        let answer = match asker(&ask.question) {
            Some(line) => line,
            None => {
                writeln!(out, "   (no terminal: answering no)")?;
                "no".to_owned()
            }
        };
        // The ask may have ended meanwhile (timed out, say): the turn then ends without it.
        let _ = bus.answer(ask.id, warden_protocols::Answer::parse(&answer));
        if ask_question.is_none() {
            ask_question = Some(ask.question.clone());
            ask_answer = answer;
        }
    }
    let finished = journal
        .events_of("surveyor")
        .into_iter()
        .rev()
        .find_map(|e| match e.kind {
            EventKind::TurnFinished { outcome } => Some(outcome),
            _ => None,
        });
    let wrap_up = finished
        .as_ref()
        .and_then(|o| o.limit_stopped.then(|| o.answer.clone()).flatten());
    match &finished {
        Some(o) if o.limit_stopped => writeln!(
            out,
            "   refused; forced wrap-up: {}",
            o.answer
                .as_deref()
                .or(o.error.as_deref())
                .unwrap_or_default()
        )?,
        Some(o) => match (&o.answer, &o.error) {
            (Some(answer), _) => writeln!(out, "   approved; surveyor: {answer}")?,
            (None, error) => writeln!(
                out,
                "   approved; the surveyor's turn ended: {}{}",
                o.reason,
                error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )?,
        },
        None => {}
    }
    report.ask_question = ask_question;
    report.ask_answer = ask_answer;
    report.wrap_up = wrap_up;
    Ok(())
}
