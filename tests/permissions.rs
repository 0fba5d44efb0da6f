//! The permission gate end to end through real agents (design 003, docs/permissions.md): every
//! verdict × mode × bus / no bus, argument rules, an agent's own rules, a halt during an ask, a
//! refused call counted by no breaker, what the journal keeps, a restart during an ask; and the
//! team-file examples of docs/permissions.md parsed.
//!
//! Everything runs on the test's arbiter with paused time; nothing sleeps on the wall clock.
mod common;
use common::*;
use serde_json::json;
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc, Mutex,
};
use std::time::Duration;
use warden::protocols::{
    Answer, ChatRole, FinishReason, OnLimitMode, OperatorReply, PermissionDecision,
    PermissionReason, PermissionRule, PermissionVerdict, PermissionsConfig, TerminationReason,
    ToolCall, Usage,
};
use warden::*;
use warden_actors::safety::ChannelInterventionBus;

/// A DANGEROUS tool that counts its runs and keeps their arguments.
fn dangerous(name: &str) -> (Arc<dyn Tool>, Arc<Mutex<Vec<serde_json::Value>>>) {
    let runs: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let seen = runs.clone();
    let tool = FnTool::new(
        name,
        "changes the world",
        ToolCategory::Dangerous,
        move |args, _| {
            seen.lock().unwrap().push(args);
            std::future::ready(Ok(json!({"done": true})))
        },
    );
    (Arc::new(tool), runs)
}

fn ran(runs: &Mutex<Vec<serde_json::Value>>) -> usize {
    runs.lock().unwrap().len()
}

fn config(permissions: PermissionsConfig) -> WardenConfig {
    WardenConfig {
        permissions,
        ..WardenConfig::default()
    }
}

fn ask_dangerous(mode: OnLimitMode) -> PermissionsConfig {
    PermissionsConfig {
        dangerous: PermissionVerdict::Ask,
        mode,
        ..PermissionsConfig::default()
    }
}

fn team_of(
    config: WardenConfig,
    bus: Option<Arc<ChannelInterventionBus>>,
) -> (Supervisor, Arc<MemoryJournal>) {
    let journal = Arc::new(MemoryJournal::new());
    let mut builder = Supervisor::builder(config, journal.clone()).current_arbiter();
    if let Some(bus) = bus {
        builder = builder.intervention_bus(bus);
    }
    (builder.build(), journal)
}

fn decided(journal: &MemoryJournal, agent: &str) -> Vec<(String, PermissionDecision)> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::PermissionDecided { tool, decision, .. } => Some((tool, decision)),
            _ => None,
        })
        .collect()
}

/// The tool results the model was given, in order.
fn tool_results(agent: &AgentHandle) -> Vec<String> {
    agent
        .record()
        .history
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .filter_map(|m| m.content.clone())
        .collect()
}

async fn turns(agent: &AgentHandle, n: u64) {
    until(&format!("{} finished {n} turns", agent.key()), || {
        agent.status().turns == n
    })
    .await;
}

/// The contract: `dangerous = "ask"` makes a DANGEROUS tool wait (the agent in WAITING_FOR_INPUT,
/// the ask naming the tool and its arguments); yes runs it, no refuses it with a tool error that
/// says why, and who answered is journaled.
#[actix_rt::test]
async fn a_dangerous_tool_waits_for_an_answer_yes_runs_it_and_no_refuses_it() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let (team, journal) = team_of(
        config(ask_dangerous(OnLimitMode::Interactive)),
        Some(bus.clone()),
    );
    let (rm, runs) = dangerous("rm");
    let model = model([
        ScriptStep::Respond(LlmResponse {
            message: ChatMessage::assistant_tool_calls(
                Some("Clearing the cellar.".into()),
                vec![ToolCall::new("call_1", "rm", &json!({"path": "cellar"}))],
            ),
            finish_reason: FinishReason::ToolCalls,
            usage: Usage::default(),
        }),
        ScriptStep::call("rm", json!({"path": "attic"})),
        ScriptStep::reply("could not clear the attic"),
    ]);
    let a = team
        .spawn(AgentSpec::assistant("a", model).with_tool(rm))
        .unwrap();
    a.try_send_event(UserEvent::new("clear the cellar"))
        .unwrap();

    until("the ask", || !bus.pending().is_empty()).await;
    let iv = bus.pending().remove(0);
    let ask = iv.permission.clone().expect("a permission ask");
    assert_eq!(
        (ask.tool.as_str(), &ask.arguments, ask.rule.as_str()),
        ("rm", &json!({"path": "cellar"}), "permissions.dangerous")
    );
    assert_eq!(ask.last_message.as_deref(), Some("Clearing the cellar."));
    assert_eq!(iv.kind, None);
    assert_eq!(a.state(), AgentState::WaitingForInput);
    tokio::time::advance(Duration::from_secs(3600)).await;
    settle(50).await;
    assert_eq!(
        (a.state(), ran(&runs)),
        (AgentState::WaitingForInput, 0),
        "nothing runs while asked"
    );

    bus.reply(
        iv.id,
        OperatorReply::by(Answer::Yes, "api:admin", Some("ok".into())),
    )
    .unwrap();
    turns(&a, 1).await;
    assert_eq!(*runs.lock().unwrap(), vec![json!({"path": "cellar"})]);
    assert_eq!(last_reason(&journal, "a"), TerminationReason::DangerousTool);

    a.try_send_event(UserEvent::new("and the attic")).unwrap();
    until("the second ask", || !bus.pending().is_empty()).await;
    let second = bus.pending().remove(0);
    assert!(second.id > iv.id);
    bus.answer(second.id, Answer::No).unwrap();
    turns(&a, 2).await;
    assert_eq!(ran(&runs), 1, "a no never runs the tool");
    let results = tool_results(&a);
    assert_eq!(
        results.last().unwrap(),
        &json!({"success": false, "error": "refused by the permission gate: tool `rm` was not run (user_refused): `permissions.dangerous` is \"ask\" and the operator said no. Do not retry it unless the situation changes; continue without it or say what you need."}).to_string()
    );
    assert_eq!(
        a.record().history.last().unwrap().content.as_deref(),
        Some("could not clear the attic")
    );
    let d = decided(&journal, "a");
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0].1.allow, d[0].1.reason, d[0].1.asked),
        (true, PermissionReason::UserApproved, Some(iv.id))
    );
    let by = d[0].1.answered_by.clone().unwrap();
    assert_eq!(
        (by.operator.as_str(), by.note.as_deref()),
        ("api:admin", Some("ok"))
    );
    assert_eq!(
        (d[1].1.allow, d[1].1.reason),
        (false, PermissionReason::UserRefused)
    );
    let asked = journal
        .events_of("a")
        .into_iter()
        .filter(|e| matches!(e.kind, EventKind::PermissionAsked { .. }))
        .count();
    assert_eq!(asked, 2);
    replay_matches(&journal, &a);
}

fn last_reason(journal: &MemoryJournal, agent: &str) -> TerminationReason {
    outcomes(journal, agent).pop().expect("a turn").reason
}

/// Every verdict × every mode × bus / no bus, through a real agent: only allow, a yes, or a
/// remembered yes run the tool; everything else refuses with the reason journaled.
#[actix_rt::test]
async fn every_verdict_mode_and_bus_combination_through_an_agent() {
    tokio::time::pause();
    for verdict in [
        PermissionVerdict::Allow,
        PermissionVerdict::Deny,
        PermissionVerdict::Ask,
    ] {
        for mode in OnLimitMode::ALL {
            for with_bus in [false, true] {
                let what = format!("{verdict} {mode} bus={with_bus}");
                let bus = with_bus.then(|| Arc::new(ChannelInterventionBus::new()));
                let permissions = PermissionsConfig {
                    dangerous: verdict,
                    mode,
                    ..PermissionsConfig::default()
                };
                let (team, journal) = team_of(config(permissions), bus.clone());
                let (rm, runs) = dangerous("rm");
                // One call of the DANGEROUS tool; an operator (when there is a bus) says yes to
                // every ask and counts them.
                let a = team
                    .spawn(
                        AgentSpec::assistant(
                            "a",
                            model([
                                ScriptStep::call("rm", json!({"path": "x"})),
                                ScriptStep::reply("ok"),
                            ]),
                        )
                        .with_tool(rm),
                    )
                    .unwrap();
                let answers = Arc::new(AtomicUsize::new(0));
                if let Some(bus) = bus.clone() {
                    let answers = answers.clone();
                    actix_rt::spawn(async move {
                        loop {
                            let iv = bus.next_pending().await;
                            answers.fetch_add(1, Ordering::SeqCst);
                            let _ = bus.answer(iv.id, Answer::Yes);
                        }
                    });
                }
                a.try_send_event(UserEvent::new("go")).unwrap();
                turns(&a, 1).await;
                let (runs_expected, reason) = match (verdict, mode, with_bus) {
                    (PermissionVerdict::Allow, _, _) => (1, None),
                    (PermissionVerdict::Deny, _, _) => (0, Some(PermissionReason::Denied)),
                    (_, OnLimitMode::Unattended, _) => (0, Some(PermissionReason::Unattended)),
                    (_, _, false) => (0, Some(PermissionReason::NoBus)),
                    (_, _, true) => (1, Some(PermissionReason::UserApproved)),
                };
                assert_eq!(ran(&runs), runs_expected, "{what}");
                let d = decided(&journal, "a");
                assert_eq!(d.first().map(|(_, d)| d.reason), reason, "{what}");
                let asked = usize::from(reason == Some(PermissionReason::UserApproved));
                assert_eq!(
                    answers.load(Ordering::SeqCst),
                    asked,
                    "{what}: asked only when it may wait"
                );
                if runs_expected == 0 {
                    let result = tool_results(&a).pop().unwrap();
                    assert!(
                        result.contains("refused by the permission gate: tool `rm` was not run"),
                        "{what}: {result}"
                    );
                    assert!(result.contains("permissions.dangerous"), "{what}: {result}");
                }
                team.shutdown().await;
            }
        }
    }
}

/// auto_extend through an agent: a yes is remembered for the same tool and arguments in the
/// same task (one ask for two calls), other arguments are asked again.
#[actix_rt::test]
async fn auto_extend_asks_once_per_tool_and_arguments_in_a_task() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let mut permissions = ask_dangerous(OnLimitMode::AutoExtend);
    permissions.dangerous = PermissionVerdict::Allow;
    // A TERMINAL-free, DANGEROUS-free setting: a SAFE_CHAIN tool asked, so one turn can call it
    // several times.
    permissions.safe_chain = PermissionVerdict::Ask;
    let (team, _journal) = team_of(config(permissions), Some(bus.clone()));
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let a = team
        .spawn(
            AgentSpec::assistant(
                "a",
                model([
                    ScriptStep::call("look", json!({"at": "door"})),
                    ScriptStep::call("look", json!({"at": "door"})),
                    ScriptStep::call("look", json!({"at": "window"})),
                    ScriptStep::reply("seen"),
                ]),
            )
            .with_tool(look)
            .without_delegation(),
        )
        .unwrap();
    let asked: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    {
        let (bus, asked) = (bus.clone(), asked.clone());
        actix_rt::spawn(async move {
            loop {
                let iv = bus.next_pending().await;
                asked
                    .lock()
                    .unwrap()
                    .push(iv.permission.map(|p| p.arguments).unwrap_or_default());
                let _ = bus.answer(iv.id, Answer::Yes);
            }
        });
    }
    a.try_send_event(UserEvent::new("look around")).unwrap();
    turns(&a, 1).await;
    assert_eq!(count(&looks), 3);
    assert_eq!(
        *asked.lock().unwrap(),
        vec![json!({"at": "door"}), json!({"at": "window"})]
    );
}

/// Argument rules: `write` is allowed under notes/, denied for `..` anywhere, asked otherwise
/// (unattended here: refused); an agent's own rule comes before the team's.
#[actix_rt::test]
async fn argument_rules_and_an_agents_own_rules() {
    tokio::time::pause();
    let permissions: PermissionsConfig = toml::from_str(
        r#"
dangerous = "ask"
mode = "unattended"

[[rules]]
tool = "write"
arg = "/path"
glob = "*..*"
verdict = "deny"

[[rules]]
tool = "write"
arg = "/path"
glob = "notes/*"
verdict = "allow"
"#,
    )
    .unwrap();
    let (team, journal) = team_of(config(permissions.clone()), None);
    let (write, runs) = dangerous("write");
    let calls = [
        json!({"path": "notes/a.txt"}),
        json!({"path": "notes/../etc/passwd"}),
        json!({"path": "src/main.rs"}),
    ];
    // An allowed DANGEROUS call ends its turn; a refused one goes on to the model's answer.
    let steps = vec![
        ScriptStep::call("write", calls[0].clone()),
        ScriptStep::call("write", calls[1].clone()),
        ScriptStep::reply("refused"),
        ScriptStep::call("write", calls[2].clone()),
        ScriptStep::reply("refused"),
    ];
    let a = team
        .spawn(AgentSpec::assistant("a", model(steps)).with_tool(write.clone()))
        .unwrap();
    for (i, _) in calls.iter().enumerate() {
        a.try_send_event(UserEvent::new("write")).unwrap();
        turns(&a, i as u64 + 1).await;
    }
    assert_eq!(*runs.lock().unwrap(), vec![json!({"path": "notes/a.txt"})]);
    let d = decided(&journal, "a");
    let got: Vec<(PermissionReason, &str)> = d
        .iter()
        .map(|(_, d)| (d.reason, d.ruling.key.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (PermissionReason::Denied, "permissions.rules[0]"),
            (PermissionReason::Unattended, "permissions.dangerous"),
        ],
        "the allowed call needs no decision record"
    );

    // An agent whose own rule allows everything under src/.
    let own: warden::protocols::PermissionsOverride = toml::from_str(
        "[[rules]]\ntool = \"write\"\narg = \"/path\"\nregex = \"^src/\"\nverdict = \"allow\"\n",
    )
    .unwrap();
    let policy =
        warden::protocols::PermissionPolicy::agent(&permissions, &own, "agents[1].permissions");
    let (write, runs) = dangerous("write");
    let b = team
        .spawn(
            AgentSpec::assistant(
                "b",
                model([
                    ScriptStep::call("write", json!({"path": "src/main.rs"})),
                    ScriptStep::reply("ok"),
                ]),
            )
            .with_tool(write)
            .with_permissions(policy),
        )
        .unwrap();
    b.try_send_event(UserEvent::new("write")).unwrap();
    turns(&b, 1).await;
    assert_eq!(ran(&runs), 1, "the agent's own rule allowed it");
}

/// A permission ask and a limit ask pending at once (two agents) share the bus and its id space:
/// distinct ids, each answered on its own.
#[actix_rt::test]
async fn permission_and_limit_asks_share_one_bus_and_one_id_space() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let mut config = config(ask_dangerous(OnLimitMode::Interactive));
    // b's third iteration (its answer) needs one extension: one limit ask.
    config.safety.loop_.max_iterations_per_task = 2;
    let (team, _journal) = team_of(config, Some(bus.clone()));
    let (rm, runs) = dangerous("rm");
    let a = team
        .spawn(
            AgentSpec::assistant("a", model([ScriptStep::call("rm", json!({}))]))
                .with_tool(rm)
                .without_delegation(),
        )
        .unwrap();
    let (look, looks) = counting_tool("look", ToolCategory::SafeChain, false);
    let b = team
        .spawn(
            AgentSpec::assistant(
                "b",
                model([
                    ScriptStep::call("look", json!({"at": 1})),
                    ScriptStep::call("look", json!({"at": 2})),
                    ScriptStep::reply("seen"),
                ]),
            )
            .with_tool(look)
            .without_delegation(),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("remove it")).unwrap();
    until("a's permission ask", || bus.pending().len() == 1).await;
    b.try_send_event(UserEvent::new("look twice")).unwrap();
    until("b's limit ask too", || bus.pending().len() == 2).await;
    let pending = bus.pending();
    let permission = pending.iter().find(|i| i.permission.is_some()).unwrap();
    let limit = pending.iter().find(|i| i.kind.is_some()).unwrap();
    assert_ne!(permission.id, limit.id);
    assert_eq!(
        (permission.agent.as_str(), limit.agent.as_str()),
        ("a", "b")
    );
    bus.answer(limit.id, Answer::Yes).unwrap();
    turns(&b, 1).await;
    assert_eq!(
        (count(&looks), ran(&runs)),
        (2, 0),
        "the limit yes ran nothing of a's"
    );
    bus.answer(permission.id, Answer::Yes).unwrap();
    turns(&a, 1).await;
    assert_eq!(ran(&runs), 1);
}

/// A halt while the operator is asked: the ask is withdrawn, the tool never runs, a late answer
/// is refused.
#[actix_rt::test]
async fn a_halt_during_an_ask_withdraws_it_and_the_tool_never_runs() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let (team, journal) = team_of(
        config(ask_dangerous(OnLimitMode::Interactive)),
        Some(bus.clone()),
    );
    let (rm, runs) = dangerous("rm");
    let a = team
        .spawn(
            AgentSpec::assistant(
                "a",
                model([ScriptStep::call("rm", json!({})), ScriptStep::reply("x")]),
            )
            .with_tool(rm),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("the ask", || !bus.pending().is_empty()).await;
    let iv = bus.pending().remove(0);
    let ack = a.halt(op()).await;
    assert_eq!(ack.state, AgentState::Stopped);
    assert!(bus.pending().is_empty(), "the halt withdrew the ask");
    assert!(
        bus.answer(iv.id, Answer::Yes).is_err(),
        "a late yes is refused"
    );
    settle(200).await;
    tokio::time::advance(Duration::from_secs(60)).await;
    settle(200).await;
    assert_eq!(ran(&runs), 0);
    let events = journal.events_of("a");
    assert!(!events
        .iter()
        .any(|e| matches!(e.kind, EventKind::ToolStarted { .. })));
    assert!(
        decided(&journal, "a").is_empty(),
        "no decision: the ask was withdrawn"
    );
    replay_matches(&journal, &a);
}

/// A refused call is neither a success nor an error: with `max_consecutive_errors = 2`, one real
/// failure, seven refusals in a row (identical calls, past the repetition thresholds too), then a
/// second real failure: the refusals neither tripped the stop (they are not errors) nor reset the
/// count (they are not successes), so the second failure trips it.
#[actix_rt::test]
async fn refusals_count_for_no_breaker() {
    tokio::time::pause();
    let mut config = config(PermissionsConfig {
        rules: vec![PermissionRule::tool("rm", PermissionVerdict::Deny)],
        ..PermissionsConfig::default()
    });
    config.execution.max_iterations_per_tick = 10;
    config.safety.breakers.max_consecutive_errors = std::num::NonZeroU32::new(2).unwrap();
    let (team, journal) = team_of(config, None);
    let (rm, runs) = dangerous("rm");
    let (bad, bads) = counting_tool("bad", ToolCategory::SafeChain, true);
    let mut steps = vec![ScriptStep::call("bad", json!({"n": 1}))];
    steps.extend((0..7).map(|_| ScriptStep::call("rm", json!({"path": "x"}))));
    steps.push(ScriptStep::call("bad", json!({"n": 2})));
    steps.push(ScriptStep::reply("never reached"));
    let a = team
        .spawn(
            AgentSpec::assistant("a", model(steps))
                .with_tool(rm)
                .with_tool(bad),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("locked out", || a.state() == AgentState::SafetyLockout).await;
    assert_eq!((ran(&runs), count(&bads)), (0, 2));
    assert_eq!(
        decided(&journal, "a").len(),
        7,
        "all seven refusals came before the trip"
    );
    let results = tool_results(&a);
    assert_eq!(
        results
            .iter()
            .filter(|r| r.contains("refused by the permission gate"))
            .count(),
        7
    );
}

/// A restart (the process dies) while an ask is pending: the agent comes back from its journal,
/// the call that was asked about is answered `not run` (never run on its own), and the next time
/// the model makes it, it is asked again.
#[actix_rt::test]
async fn a_restart_during_an_ask_never_runs_the_call_and_asks_again() {
    tokio::time::pause();
    let bus = Arc::new(ChannelInterventionBus::new());
    let (team, journal) = team_of(
        config(ask_dangerous(OnLimitMode::Interactive)),
        Some(bus.clone()),
    );
    let (rm, runs) = dangerous("rm");
    let a = team
        .spawn(
            AgentSpec::assistant("a", model([ScriptStep::call("rm", json!({"n": 1}))]))
                .with_tool(rm),
        )
        .unwrap();
    a.try_send_event(UserEvent::new("go")).unwrap();
    until("the ask", || !bus.pending().is_empty()).await;
    // The "crash": the journal as it is now is all a new process has.
    let events = journal.events();
    drop(a);
    team.shutdown().await;

    let bus2 = Arc::new(ChannelInterventionBus::new());
    let journal2 = Arc::new(MemoryJournal::new());
    let team2 = Supervisor::builder(
        config(ask_dangerous(OnLimitMode::Interactive)),
        journal2.clone(),
    )
    .intervention_bus(bus2.clone())
    .current_arbiter()
    .build();
    let record = AgentRecord::replay(AgentKey::from("a"), &events);
    let (rm2, runs2) = dangerous("rm");
    let a2 = team2
        .spawn(
            AgentSpec::assistant(
                "a",
                model([
                    ScriptStep::call("rm", json!({"n": 1})),
                    ScriptStep::reply("done"),
                ]),
            )
            .with_tool(rm2)
            .restored_from(record),
        )
        .unwrap();
    settle(100).await;
    assert!(
        bus2.pending().is_empty(),
        "nothing is asked, nothing runs, on its own"
    );
    assert_eq!((ran(&runs), ran(&runs2)), (0, 0));
    if a2.state() != AgentState::WaitingForEvent {
        // Back as it was before the crash (e.g. still marked busy): a resume makes it usable.
        let _ = a2.resume("test").await;
    }
    a2.try_send_event(UserEvent::new("again")).unwrap();
    until("asked again", || !bus2.pending().is_empty()).await;
    assert_eq!(ran(&runs2), 0);
    let iv = bus2.pending().remove(0);
    bus2.answer(iv.id, Answer::Yes).unwrap();
    until("ran once", || ran(&runs2) == 1).await;
    settle(100).await;
    assert_eq!(ran(&runs2), 1);
    let results = tool_results(&a2);
    assert!(results.iter().any(|r| r.contains("not run")), "{results:?}");
}

/// docs/permissions.md: every ```toml example is a team file (or a part of one) that parses.
#[test]
fn the_examples_in_docs_permissions_md_parse() {
    let doc = include_str!("../docs/permissions.md");
    let mut examples = 0;
    for block in doc.split("```toml\n").skip(1) {
        let text = block.split("```").next().unwrap();
        if text.contains("[[agents]]") {
            warden::team::TeamFile::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        } else {
            warden::team::TeamFile::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
        examples += 1;
    }
    assert!(examples >= 3, "{examples}");
}

// ---- real processes: `warden serve` over HTTP, server-everything as the MCP server --------------

const ADMIN: &str = "gate-admin-token";

/// server-everything's `dist/index.js`, or `None` (skipped loudly; a failure under `CI=true`).
fn everything() -> Option<String> {
    let have_node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_node {
        warden_testkit::skip(
            "node is not installed (needed for @modelcontextprotocol/server-everything)",
        );
        return None;
    }
    let path = match std::env::var_os("WARDEN_MCP_EVERYTHING") {
        Some(path) => std::path::PathBuf::from(path),
        None => std::env::var_os("WARDEN_NPM_CACHE")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|h| std::path::PathBuf::from(h).join(".cache/warden-npm"))
            })
            .unwrap_or_default()
            .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
    };
    if !path.is_file() {
        warden_testkit::skip(&format!(
            "{} not found; install it with `npm install --prefix \"$HOME/.cache/warden-npm\" @modelcontextprotocol/server-everything`",
            path.display()
        ));
        return None;
    }
    Some(path.display().to_string())
}

/// The team of the contract: `dangerous = "ask"`, server-everything's `echo` (annotated
/// read-only) made DANGEROUS by the team file's `category`; the model calls it once per event.
fn gated_team(js: &str, category: &str) -> String {
    format!(
        r#"
[permissions]
dangerous = "ask"

[providers.m]
kind = "scripted"
replies = [
  {{ tool = "everything__echo", args = {{ message = "one" }} }},
  {{ tool = "everything__echo", args = {{ message = "two" }} }},
  "refused, so I stop",
  {{ tool = "everything__echo", args = {{ message = "three" }} }},
]

[mcp_servers.everything]
command = "node"
args = ["{js}"]
{category}

[[agents]]
key = "a"
provider = "m"
delegate = false
tools = ["everything.echo"]
"#
    )
}

/// `warden serve` of a team file on a journal ([`warden_testkit::Serve`]).
struct Serve(warden_testkit::Serve);

impl Serve {
    fn start(team: &std::path::Path, db: &std::path::Path) -> Serve {
        let log = db.with_extension("serve.log");
        Serve(
            warden_testkit::Serve::command(env!("CARGO_BIN_EXE_warden"))
                .config(team)
                .db(db)
                .admin_token(ADMIN)
                .env_remove("RUST_LOG")
                .log(log)
                .start(),
        )
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> std::io::Result<(u16, String)> {
        self.0.request(method, path, body)
    }

    fn json(&self, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
        let (status, text) = self.request(method, path, body).expect("request");
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Waits for exactly one pending ask and returns it.
    fn ask(&self) -> serde_json::Value {
        let mut found = serde_json::Value::Null;
        let asked = warden_testkit::wait_for(Duration::from_secs(30), || {
            let (status, list) = self.json("GET", "/api/interventions", None);
            assert_eq!(status, 200);
            match list.as_array() {
                Some(list) if !list.is_empty() => {
                    assert_eq!(list.len(), 1, "{list:?}");
                    found = list[0].clone();
                    true
                }
                _ => false,
            }
        });
        assert!(asked, "no ask came");
        found
    }

    fn send(&self, text: &str) {
        let (status, body) = self.json(
            "POST",
            "/api/agents/a/events",
            Some(&json!({"content": text}).to_string()),
        );
        assert_eq!(status, 202, "{body}");
    }

    fn turns(&self, n: u64) {
        let done = warden_testkit::wait_for(Duration::from_secs(30), || {
            self.json("GET", "/api/agents/a", None).1["turns"].as_u64() >= Some(n)
        });
        assert!(done, "turn {n} never finished");
    }
}

fn journal(db: &std::path::Path) -> Vec<warden::Event> {
    warden::journal::JournalReader::open(db)
        .unwrap()
        .events()
        .unwrap()
}

/// Waits until `n` turns have ended in the journal at `db` (it is written behind the live record).
fn journaled_turns(db: &std::path::Path, n: usize) {
    let written = warden_testkit::wait_for(Duration::from_secs(30), || {
        journal(db)
            .iter()
            .filter(|e| matches!(e.kind, EventKind::TurnFinished { .. }))
            .count()
            >= n
    });
    assert!(written, "turn {n} never reached the journal");
}

fn echo_runs(db: &std::path::Path) -> usize {
    journal(db)
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::ToolStarted { tool, .. } if tool == "everything__echo"))
        .count()
}

/// The contract over real processes: `[permissions] dangerous = "ask"` and `[mcp_servers.NAME]
/// category = "DANGEROUS"`: `GET /api/interventions` lists the ask naming the tool, `POST
/// /api/interventions/{id}` with yes runs it, with no refuses it; a SIGKILL while an ask is pending
/// and a restart on the same journal: the call never runs on its own, the ask is gone, and the next
/// call is asked again.
#[test]
fn over_http_a_dangerous_mcp_tool_waits_for_yes_or_no_and_a_kill_never_runs_it() {
    let Some(js) = everything() else { return };
    let dir = warden_testkit::scratch_dir("permissions", "http");
    let team = dir.join("team.toml");
    let db = dir.join("warden.db");
    std::fs::write(&team, gated_team(&js, "category = \"DANGEROUS\"")).unwrap();

    // `warden config check` prints the ruling: DANGEROUS by the team file, so asked.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["config", "check"])
        .arg(&team)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{check:?}");
    assert!(
        stdout.contains("  a  everything__echo (DANGEROUS): ask (permissions.dangerous)\n"),
        "{stdout}"
    );

    let serve = Serve::start(&team, &db);
    serve.send("echo one");
    let ask = serve.ask();
    assert_eq!(ask["permission"]["tool"], "everything__echo", "{ask}");
    assert_eq!(
        ask["permission"]["arguments"],
        json!({"message": "one"}),
        "{ask}"
    );
    assert_eq!(ask["config_key"], "permissions.dangerous");
    assert!(
        ask["question"]
            .as_str()
            .unwrap()
            .contains("`everything__echo`"),
        "{ask}"
    );
    assert_eq!(
        serve.json("GET", "/api/agents/a", None).1["state"],
        "WAITING_FOR_INPUT"
    );
    assert_eq!(echo_runs(&db), 0, "nothing runs while asked");
    let id = ask["id"].as_u64().unwrap();
    let (status, body) = serve.json(
        "POST",
        &format!("/api/interventions/{id}"),
        Some(r#"{"answer":"yes","note":"fine"}"#),
    );
    assert_eq!(status, 200, "{body}");
    serve.turns(1);
    journaled_turns(&db, 1);
    assert_eq!(echo_runs(&db), 1);

    serve.send("echo two");
    let ask = serve.ask();
    assert_eq!(ask["permission"]["arguments"], json!({"message": "two"}));
    let id = ask["id"].as_u64().unwrap();
    // This one through the CLI: `warden ask` lists it (naming the tool), `warden ask ID no` refuses.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
            .args(args)
            .env("WARDEN_URL", serve.0.url())
            .env("WARDEN_ADMIN_TOKEN", ADMIN)
            .env_remove("WARDEN_READ_TOKEN")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = cli(&["ask"]);
    assert!(
        listed.starts_with(&format!("{id}  a  Agent a wants to run the DANGEROUS tool `everything__echo` with {{\"message\":\"two\"}}")),
        "{listed}"
    );
    cli(&["ask", &id.to_string(), "no", "--note", "not now"]);
    serve.turns(2);
    // The journal is written behind the live record: wait until the second turn's end is in it.
    let mut decisions: Vec<PermissionDecision> = Vec::new();
    let written = warden_testkit::wait_for(Duration::from_secs(30), || {
        let events = journal(&db);
        decisions = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::PermissionDecided { decision, .. } => Some(decision.clone()),
                _ => None,
            })
            .collect();
        events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::TurnFinished { .. }))
            .count()
            == 2
    });
    assert!(written, "the second turn never reached the journal");
    assert_eq!(echo_runs(&db), 1, "no refused it");
    assert_eq!(decisions.len(), 2);
    assert_eq!((decisions[0].allow, decisions[1].allow), (true, false));
    let by = decisions[0].answered_by.clone().unwrap();
    assert_eq!(
        (by.operator.as_str(), by.note.as_deref()),
        ("api:admin", Some("fine"))
    );
    let by = decisions[1].answered_by.clone().unwrap();
    assert_eq!(by.note.as_deref(), Some("not now"));

    // An ask pending, then SIGKILL: the call must never run.
    serve.send("echo three");
    let pending = serve.ask();
    assert_eq!(
        pending["permission"]["arguments"],
        json!({"message": "three"})
    );
    // Kill once the ask is on disk: its event is then known to be taken. Killed before, the event
    // may still read as queued in the file, and a restart rightly delivers it again (its turn then
    // asks anew), which is not what this test is about.
    let asked_on_disk = warden_testkit::wait_for(Duration::from_secs(30), || {
        journal(&db).iter().any(|e| {
            matches!(&e.kind, EventKind::PermissionAsked { arguments, .. }
                if arguments.to_string().contains("three"))
        })
    });
    assert!(asked_on_disk, "the third ask never reached the journal");
    drop(serve); // Child::kill is SIGKILL
    assert_eq!(echo_runs(&db), 1, "still one run");
    let serve = Serve::start(&team, &db);
    std::thread::sleep(Duration::from_millis(300)); // real processes: give a wrong run a chance
    let (_, list) = serve.json("GET", "/api/interventions", None);
    assert_eq!(list, json!([]), "the ask died with the process");
    assert_eq!(
        echo_runs(&db),
        1,
        "the pending call did not run after the restart"
    );
    // The scripted model starts over in the new process: its next call is asked again.
    serve.send("echo again");
    let again = serve.ask();
    assert_eq!(again["permission"]["tool"], "everything__echo");
    assert_eq!(echo_runs(&db), 1);
}

/// A minimal MCP stdio server (newline-delimited JSON-RPC, no SDK) whose tools carry the three
/// kinds of annotations: `wipe` `destructiveHint: true`, `peek` `readOnlyHint: true`, `plain` none.
const ANNOTATED_SERVER: &str = r#"
import json, sys
TOOLS = [
    {"name": "wipe", "annotations": {"destructiveHint": True, "readOnlyHint": False}},
    {"name": "peek", "annotations": {"readOnlyHint": True}},
    {"name": "plain"},
]
for t in TOOLS:
    t["description"] = "Does " + t["name"] + "."
    t["inputSchema"] = {"type": "object", "properties": {}}
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("id") is None:
        continue
    method, id = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "annotated", "version": "0"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "done"}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": id, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// An MCP tool's tier comes from its annotations (`destructiveHint` → DANGEROUS, `readOnlyHint` →
/// SAFE_CHAIN, neither → SAFE_CHAIN) unless the team file's `category` says otherwise; `warden
/// config check` prints the ruling each gets under `dangerous = "ask"`.
#[test]
fn an_mcp_tools_annotations_give_its_tier_unless_the_team_file_says_otherwise() {
    let have_python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_python {
        warden_testkit::skip("python3 is not installed (needed for the annotated MCP server)");
        return;
    }
    let dir = warden_testkit::scratch_dir("permissions", "annotations");
    let server = dir.join("annotated.py");
    std::fs::write(&server, ANNOTATED_SERVER).unwrap();
    let team = dir.join("team.toml");
    let check = |category: &str| {
        std::fs::write(
            &team,
            format!(
                "[permissions]\ndangerous = \"ask\"\n\n[providers.m]\nkind = \"scripted\"\n\n\
                 [mcp_servers.ann]\ncommand = \"python3\"\nargs = [{:?}]\n{category}\n\n\
                 [[agents]]\nkey = \"a\"\nprovider = \"m\"\ndelegate = false\ntools = [\"ann.*\"]\n",
                server.display().to_string()
            ),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
            .args(["config", "check"])
            .arg(&team)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let table: Vec<String> = stdout
            .lines()
            .filter(|l| l.starts_with("  a  "))
            .map(str::to_owned)
            .collect();
        table
    };
    assert_eq!(
        check(""),
        [
            "  a  ann__peek (SAFE_CHAIN): allow (permissions.safe_chain)",
            "  a  ann__plain (SAFE_CHAIN): allow (permissions.safe_chain)",
            "  a  ann__wipe (DANGEROUS): ask (permissions.dangerous)",
        ]
    );
    assert_eq!(
        check("category = \"TERMINAL\""),
        [
            "  a  ann__peek (TERMINAL): allow (permissions.terminal)",
            "  a  ann__plain (TERMINAL): allow (permissions.terminal)",
            "  a  ann__wipe (TERMINAL): allow (permissions.terminal)",
        ]
    );
}

/// `warden run` at a terminal: a permission ask is shown as `? QUESTION` and the next input line
/// answers it, so the run goes on to the answer (what yes and no do is tested above).
#[actix_rt::test]
async fn warden_run_shows_a_permission_ask_and_the_next_line_answers_it() {
    for answer in ["yes", "no"] {
        let file = warden::team::TeamFile::from_toml(
            r#"
[[permissions.rules]]
tool = "set_goals"
verdict = "ask"

[providers.s]
kind = "scripted"
replies = [{ tool = "set_goals", args = { goals = ["keep the fire lit"] } }, "done"]

[[agents]]
key = "inn"
provider = "s"
delegate = false
goals = []
"#,
        )
        .unwrap();
        let (tx, input) = tokio::sync::mpsc::unbounded_channel::<String>();
        tx.send(answer.into()).unwrap();
        let mut out = Vec::new();
        let options = warden::cli::run::RunOptions {
            agent: None,
            events: vec!["set your goals".into()],
        };
        tokio::time::timeout(
            Duration::from_secs(20),
            warden::cli::run::run(file, options, Some(input), &mut out),
        )
        .await
        .expect("run returned after its event")
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("? Agent inn wants to run the SAFE_CHAIN tool `set_goals` with {\"goals\":[\"keep the fire lit\"]} (`permissions.rules[0]` = \"ask\"). Allow it? (yes/no)\n"),
            "{out}"
        );
        assert!(out.contains("inn: done\n"), "{out}");
        drop(tx);
    }
}
