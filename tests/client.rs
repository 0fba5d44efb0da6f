//! The CLI client against a real server on 127.0.0.1 (port 0), started in-process: the library calls,
//! their errors and exit codes, the event stream over a socket, and the `warden` binary itself.
//! Agents run on their own arbiter in real time; every wait is bounded by a timeout.
mod common;
use common::{chatty, counting_tool, failing, Spawn};
use serde_json::json;
use std::{
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use warden::{
    cli::client::{self, Call, Client, ClientError},
    protocols::{Answer, OnLimitMode},
    safety::ChannelInterventionBus,
    server::api::{self, ApiConfig, ApiState},
    server::events::EventHub,
    *,
};

const ADMIN: &str = "client-admin";
const READ: &str = "client-read";
const WAIT: Duration = Duration::from_secs(20);

struct Running {
    url: String,
    team: Supervisor,
    bus: Arc<ChannelInterventionBus>,
    handle: actix_web::dev::ServerHandle,
}

impl Running {
    async fn stop(self) {
        self.handle.stop(false).await;
        self.team.shutdown().await;
    }
}

/// A team on its own arbiter behind the API on a free loopback port.
fn start(mut config: WardenConfig) -> Running {
    config.supervisor.arbiters = 1;
    let journal = Arc::new(MemoryJournal::new());
    let hub = EventHub::default().with_log(journal.clone());
    let bus = Arc::new(ChannelInterventionBus::new());
    let team = Supervisor::builder(config, Arc::new(hub.journal(journal)))
        .intervention_bus(Arc::new(hub.intervention_bus(bus.clone())))
        .build();
    let api_config = ApiConfig {
        admin_token: Some(ADMIN.into()),
        read_token: Some(READ.into()),
        body_limit: 0,
        ..ApiConfig::default()
    };
    let state = ApiState::new(team.clone(), api_config)
        .with_bus(bus.clone())
        .with_events(hub);
    let (server, addrs) = api::bind(state, "127.0.0.1:0".parse().unwrap()).unwrap();
    let handle = server.handle();
    actix_rt::spawn(server);
    Running {
        url: format!("http://{}", addrs[0]),
        team,
        bus,
        handle,
    }
}

/// Polls `cond` every 10 ms; panics after [`WAIT`].
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A loopback URL nothing listens on.
fn closed_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

fn http_error(err: &ClientError) -> (u16, &str) {
    match err {
        ClientError::Http {
            status, message, ..
        } => (*status, message.as_str()),
        other => panic!("not an HTTP error: {other}"),
    }
}

#[actix_rt::test]
async fn the_client_reads_halts_unlocks_and_clears_over_a_socket() {
    let server = start(WardenConfig::default());
    server.team.assistant("a", chatty());
    for key in ["b", "c"] {
        let agent = server
            .team
            .spawn(AgentSpec::assistant(key, failing()))
            .unwrap();
        for i in 0..5 {
            agent
                .try_send_event(UserEvent::new(format!("e{i}")))
                .unwrap();
        }
        eventually("locked out", || agent.state() == AgentState::SafetyLockout).await;
    }
    let admin = Client::new(&server.url, Some(ADMIN.into())).unwrap();

    let keys: Vec<String> = admin
        .statuses()
        .await
        .unwrap()
        .iter()
        .map(|s| s.key.to_string())
        .collect();
    assert_eq!(keys, ["a", "b", "c"]);
    let b = admin.status("b").await.unwrap();
    assert_eq!(
        (b.state, b.emergency_stop),
        (AgentState::SafetyLockout, true)
    );
    let mut table = Vec::new();
    client::run(
        &admin,
        Call::Status {
            key: None,
            json: false,
        },
        &mut table,
    )
    .await
    .unwrap();
    let table = String::from_utf8(table).unwrap();
    assert!(table.starts_with("AGENT"), "{table}");
    assert!(
        table.contains("b: locked out by consecutive_errors: "),
        "{table}"
    );

    assert_eq!(
        admin
            .unlock_with_reason("b", Some("the model is back"))
            .await
            .unwrap()
            .state,
        AgentState::WaitingForEvent
    );
    let recent = admin.recent_events(Some("b"), 100).await.unwrap();
    let noted = recent.events.iter().any(|e| {
        matches!(&e.kind, warden::EventKind::Unlocked { note: Some(n), .. } if n == "the model is back")
    });
    assert!(
        noted,
        "the unlock's reason is journaled: {:?}",
        recent.events
    );
    assert_eq!(
        admin.clear("c").await.unwrap().state,
        AgentState::WaitingForEvent
    );
    let err = admin.unlock("a").await.unwrap_err();
    assert_eq!(http_error(&err), (409, "emergency stop is not active"));
    assert_eq!(err.exit_code(), 7);
    let err = admin.status("nobody").await.unwrap_err();
    assert_eq!(err.to_string(), "404 not found: unknown agent nobody");
    assert_eq!(err.exit_code(), 6);

    let acks = admin.halt(Some("a")).await.unwrap();
    assert_eq!(acks.len(), 1);
    assert_eq!(
        (acks[0].agent.as_str(), acks[0].state),
        ("a", AgentState::Stopped)
    );
    let acks = admin.halt(None).await.unwrap();
    assert_eq!(acks.len(), 3);
    assert!(acks.iter().all(|a| a.state == AgentState::Stopped));

    // A halted agent comes back with resume; pause is shown in its status.
    let resumed = admin.resume("a").await.unwrap();
    assert_eq!(resumed.state, AgentState::WaitingForEvent);
    assert!(admin.pause("a").await.unwrap().paused);
    assert!(!admin.resume("a").await.unwrap().paused);
    let err = admin.resume("a").await.unwrap_err();
    assert_eq!(
        http_error(&err),
        (409, "agent is neither paused nor stopped")
    );

    // The read token reads, and may not mutate; a wrong token is refused; nothing listening.
    let reader = Client::new(&server.url, Some(READ.into())).unwrap();
    assert_eq!(reader.statuses().await.unwrap().len(), 3);
    let err = reader.halt(Some("a")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "403 forbidden: this call needs the admin token"
    );
    assert_eq!(err.exit_code(), 5);
    let err = Client::new(&server.url, Some("wrong".into()))
        .unwrap()
        .statuses()
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "401 unauthorized: invalid bearer token");
    assert_eq!(err.exit_code(), 4);
    let url = closed_url();
    let err = Client::new(&url, None)
        .unwrap()
        .statuses()
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("cannot connect to {url}/: ")),
        "{err}"
    );
    assert!(!err.to_string().contains('\n'));
    assert_eq!(err.exit_code(), 3);
    server.stop().await;
}

/// `max_iterations_per_task = 2` in interactive mode, and an agent whose model keeps calling `look`.
fn asking_server() -> (Running, AgentHandle) {
    let mut config = WardenConfig::default();
    config.execution.max_iterations_per_tick = 10;
    config.safety.loop_.max_iterations_per_task = 2;
    config.safety.on_limit.mode = OnLimitMode::Interactive;
    let server = start(config);
    let n = AtomicUsize::new(0);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        if req.tools.is_empty() {
            return ScriptStep::reply("wrap-up");
        }
        ScriptStep::call("look", json!({ "at": n.fetch_add(1, Ordering::SeqCst) }))
    }));
    let (look, _) = counting_tool("look", ToolCategory::SafeChain, false);
    let agent = server
        .team
        .spawn(AgentSpec::assistant("a", model).with_tool_arc(look))
        .unwrap();
    (server, agent)
}

/// Reads the event stream until every name in `names` was an `event:`; bounded by [`WAIT`].
async fn read_events(response: &mut reqwest::Response, names: &[&str]) -> String {
    let mut text = String::new();
    let reading = async {
        while !names
            .iter()
            .all(|n| text.contains(&format!("event: {n}\n")))
        {
            let chunk = response.chunk().await.unwrap().expect("stream ended");
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    };
    tokio::time::timeout(WAIT, reading)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {names:?}; got {text}"));
    text
}

#[actix_rt::test]
async fn asks_are_listed_and_answered_with_the_client_and_streamed_over_the_socket() {
    let (server, agent) = asking_server();
    let admin = Client::new(&server.url, Some(ADMIN.into())).unwrap();
    let mut stream = reqwest::Client::new()
        .get(format!("{}/api/events?agent=a", server.url))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");

    let mut out = Vec::new();
    client::run(&admin, Call::Asks { json: false }, &mut out)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "no pending interventions\n"
    );

    agent.try_send_event(UserEvent::new("scout")).unwrap();
    eventually("ask", || !server.bus.pending().is_empty()).await;
    let pending = admin.interventions().await.unwrap();
    assert_eq!(pending.len(), 1);
    let id = pending[0].id;
    let mut out = Vec::new();
    client::run(&admin, Call::Asks { json: false }, &mut out)
        .await
        .unwrap();
    let listed = String::from_utf8(out).unwrap();
    assert!(
        listed.starts_with(&format!("{id}  a  Agent a reached its limit")),
        "{listed}"
    );
    read_events(&mut stream, &["intervention_asked"]).await;

    let reply = admin.answer(id, "no", Some("enough")).await.unwrap();
    assert_eq!(
        (reply.id, reply.answer, reply.note.as_deref()),
        (id, Answer::No, Some("enough"))
    );
    let text = read_events(&mut stream, &["intervention_answered", "limit_denied"]).await;
    assert!(
        text.contains(&format!(
            "data: {{\"agent\":\"a\",\"answer\":\"no\",\"answered_by\":\
             {{\"note\":\"enough\",\"operator\":\"api:admin\"}},\"id\":{id}}}"
        )),
        "{text}"
    );
    let err = admin.answer(id, "yes", None).await.unwrap_err();
    assert_eq!(
        http_error(&err),
        (
            404,
            format!("no pending intervention with id {id}").as_str()
        )
    );
    assert_eq!(err.exit_code(), 6);
    server.stop().await;
}

/// Runs the `warden` binary with `args` and only the given `WARDEN_*` variables; returns the exit
/// code, standard output and standard error.
async fn warden(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_warden"));
    command.args(args);
    for var in ["WARDEN_URL", "WARDEN_ADMIN_TOKEN", "WARDEN_READ_TOKEN"] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let output = tokio::time::timeout(WAIT, tokio::task::spawn_blocking(move || command.output()))
        .await
        .expect("warden did not finish")
        .unwrap()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[actix_rt::test]
async fn the_warden_binary_talks_to_a_running_server() {
    let server = start(WardenConfig::default());
    server.team.assistant("a", chatty());
    let url = server.url.as_str();

    let (code, out, err) = warden(&["status", "--url", url, "--token", READ], &[]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("AGENT  ROLE"), "{out}");
    assert!(lines[1].starts_with("a "), "{out}");
    assert!(lines[1].contains("WAITING_FOR_EVENT"), "{out}");

    // URL and the read token from the environment; --json prints the raw statuses.
    let env = [("WARDEN_URL", url), ("WARDEN_READ_TOKEN", READ)];
    let (code, out, _) = warden(&["status", "--json"], &env).await;
    assert_eq!(code, 0);
    let statuses: Vec<AgentStatus> = serde_json::from_str(&out).unwrap();
    assert_eq!(statuses.len(), 1);
    let (code, _, err) = warden(&["status", "nobody"], &env).await;
    assert_eq!(
        (code, err.as_str()),
        (6, "error: 404 not found: unknown agent nobody\n")
    );
    // The read token is never used for a mutating call.
    let (code, _, err) = warden(&["halt", "a"], &env).await;
    assert_eq!(
        (code, err.as_str()),
        (4, "error: 401 unauthorized: missing bearer token\n")
    );
    let (code, _, err) = warden(&["halt", "a", "--token", READ], &env).await;
    assert_eq!(
        (code, err.as_str()),
        (5, "error: 403 forbidden: this call needs the admin token\n")
    );
    let admin_env = [("WARDEN_URL", url), ("WARDEN_ADMIN_TOKEN", ADMIN)];
    let (code, _, err) = warden(&["unlock", "a"], &admin_env).await;
    assert_eq!(
        (code, err.as_str()),
        (7, "error: 409 conflict: emergency stop is not active\n")
    );
    let (code, out, err) = warden(&["halt", "a"], &admin_env).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "halted a: STOPPED (0 queued messages discarded)\n");
    let (code, out, _) = warden(&["ask"], &admin_env).await;
    assert_eq!((code, out.as_str()), (0, "no pending interventions\n"));
    let (code, _, err) = warden(&["ask", "7"], &admin_env).await;
    assert_eq!(
        (code, err.as_str()),
        (2, "error: warden ask ID needs an answer: yes or no\n")
    );
    let (code, _, _) = warden(&["ask", "7", "maybe"], &admin_env).await;
    assert_eq!(code, 2, "clap refuses an answer other than yes or no");
    let (code, _, err) = warden(&["ask", "7", "yes"], &admin_env).await;
    assert_eq!(
        (code, err.as_str()),
        (
            6,
            "error: 404 not found: no pending intervention with id 7\n"
        )
    );

    let closed = closed_url();
    let (code, _, err) = warden(&["status", "--url", &closed], &[]).await;
    assert_eq!(code, 3, "{err}");
    assert!(
        err.starts_with(&format!("error: cannot connect to {closed}/: ")),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1);
    // Issue 13: HOST:PORT without a scheme is http (it was "relative URL without a base").
    let bare = url.trim_start_matches("http://").trim_end_matches('/');
    let (code, out, err) = warden(&["status", "--url", bare, "--token", READ], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("AGENT  ROLE"), "{out}");
    let (code, _, err) = warden(&["status", "--url", "ftp://localhost:7878"], &[]).await;
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err,
        "error: invalid server url \"ftp://localhost:7878\": expected HOST:PORT, http://HOST:PORT \
         or https://HOST:PORT\n"
    );
    server.stop().await;
}

/// Issue 12: `warden send KEY TEXT` prints the agent's answer; `--json` the event's fate; an event
/// that ends without an answer exits 8 saying why; a locked-out agent's refusal exits 7.
#[actix_rt::test]
async fn warden_send_prints_the_answer_and_says_why_there_is_none() {
    let server = start(WardenConfig::default());
    server.team.assistant("smith", chatty());
    let down = server.team.assistant("down", failing());
    let env = [
        ("WARDEN_URL", server.url.as_str()),
        ("WARDEN_ADMIN_TOKEN", ADMIN),
    ];
    let (code, out, err) = warden(&["send", "smith", "a sword?"], &env).await;
    assert_eq!((code, out.as_str()), (0, "smith: hello\n"), "{err}");
    let (code, out, err) = warden(&["send", "smith", "again", "--json"], &env).await;
    assert_eq!(code, 0, "{err}");
    let fate: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (fate["status"].as_str(), fate["answer"].as_str()),
        (Some("answered"), Some("hello"))
    );
    assert!(fate["id"].as_u64().is_some());
    let (code, out, err) = warden(&["send", "down", "hi"], &env).await;
    assert_eq!(code, 8, "{out}{err}");
    assert!(
        err.contains("event 1 failed: llm call failed: model down"),
        "{err}"
    );
    for i in 0..4 {
        down.try_send_event(UserEvent::new(format!("e{i}")))
            .unwrap();
    }
    eventually("down locked out", || {
        down.state() == AgentState::SafetyLockout
    })
    .await;
    let (code, _, err) = warden(&["send", "down", "hi"], &env).await;
    assert_eq!(code, 7, "{err}");
    let (code, _, err) = warden(&["send", "smith", "x", "--wait", "301"], &env).await;
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("wait"), "{err}");
    server.stop().await;
}

/// Issue 35: `warden send --wait S` on an event still pending after S exits 16 (not 0 like an
/// answer), says so, names the pending ask that holds the agent and how to answer it, and points to
/// `warden events`; `--wait 0` only queues (exit 0). The ask is pending before the send, so what
/// the message names does not depend on timing.
#[actix_rt::test]
async fn warden_send_still_pending_after_its_wait_names_the_ask_and_exits_16() {
    let (server, agent) = asking_server();
    agent.try_send_event(UserEvent::new("scout")).unwrap();
    eventually("ask", || !server.bus.pending().is_empty()).await;
    let id = server.bus.pending()[0].id;
    let env = [
        ("WARDEN_URL", server.url.as_str()),
        ("WARDEN_ADMIN_TOKEN", ADMIN),
    ];
    let (code, out, err) = warden(&["send", "a", "more", "--wait", "0.5"], &env).await;
    assert_eq!(code, 16, "{out}{err}");
    assert_eq!(out, "", "{err}");
    assert!(err.contains("still pending after 0.5 s"), "{err}");
    assert!(
        err.contains(&format!(
            "ask {id} is pending, answer it with `warden ask {id} yes|no`"
        )),
        "{err}"
    );
    assert!(err.contains("`warden events --agent a --follow`"), "{err}");
    assert!(!err.contains("`warden send --wait S`"), "{err}");
    // --json: the fate on standard output, the same exit code.
    let (code, out, err) = warden(&["send", "a", "more", "--wait", "0.5", "--json"], &env).await;
    assert_eq!(code, 16, "{out}{err}");
    let fate: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(fate["status"], "pending", "{out}");
    // --wait 0 asks for no answer: queued, exit 0.
    let (code, out, err) = warden(&["send", "a", "more", "--wait", "0"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("queued (pending)"), "{out}");
    assert!(out.contains("`warden events --agent a`"), "{out}");
    server.stop().await;
}

/// Issue 12: `warden events` shows the last events readably (UTC time, the agent column as wide as
/// the longest key, the documented kind names), `--agent` keeps one agent's, `--json` gives the
/// journal's JSON; bad arguments and unknown agents are refused with the usual exit codes.
#[actix_rt::test]
async fn warden_events_shows_the_last_events_readably() {
    let server = start(WardenConfig::default());
    let long = "blacksmith-of-the-northern-gate";
    for key in ["a", long] {
        let agent = server
            .team
            .spawn(AgentSpec::assistant(key, chatty()))
            .unwrap();
        agent.ask(UserEvent::new("hello?")).await.unwrap();
    }
    let env = [
        ("WARDEN_URL", server.url.as_str()),
        ("WARDEN_READ_TOKEN", READ),
    ];
    let (code, out, err) = warden(&["events", "-n", "4"], &env).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 4, "{out}");
    let (code, out, err) = warden(&["events", "-n", "1000"], &env).await;
    assert_eq!(code, 0, "{err}");
    // `seq  YYYY-MM-DD HH:MM:SS.mmm  agent  kind  body`, the kind column aligned for both keys.
    let mut kind_columns = std::collections::HashSet::new();
    let mut agents = std::collections::HashSet::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields[0].parse::<u64>().is_ok(), "{line}");
        assert_eq!((fields[1].len(), fields[2].len()), (10, 12), "{line}");
        agents.insert(fields[3]);
        kind_columns.insert(line.find(&format!(" {} ", fields[4])).unwrap());
    }
    assert_eq!(agents, ["a", long].into_iter().collect(), "{out}");
    assert_eq!(kind_columns.len(), 1, "{out}");

    let (code, out, err) = warden(&["events", "--agent", "a", "--json", "-n", "1000"], &env).await;
    assert_eq!(code, 0, "{err}");
    let events: Vec<Event> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events.len() >= 4, "{out}");
    assert!(events.iter().all(|e| e.agent.as_str() == "a"));
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(events[0].seq, 1, "the whole history of a");

    let (code, _, err) = warden(&["events", "--agent", "nobody"], &env).await;
    assert_eq!(
        (code, err.as_str()),
        (6, "error: 404 not found: unknown agent nobody\n")
    );
    let (code, _, err) = warden(&["events", "-n", "1001"], &env).await;
    assert_ne!(code, 0);
    assert!(err.contains("1001 is not in 0..=1000"), "{err}");
    let (code, _, err) = warden(&["events"], &[("WARDEN_URL", server.url.as_str())]).await;
    assert_eq!(
        (code, err.as_str()),
        (4, "error: 401 unauthorized: missing bearer token\n")
    );
    server.stop().await;
}

/// Issue 12: [`Client::follow_events`] continues exactly after the head of
/// [`Client::recent_events`] (no event twice, none missed) and passes intervention notices on.
#[actix_rt::test]
async fn following_events_continues_after_the_listing_with_notices() {
    let (server, agent) = asking_server();
    let client = Client::new(&server.url, Some(READ.into())).unwrap();
    let recent = client.recent_events(None, 0).await.unwrap();
    assert!(recent.events.is_empty());
    let head = recent.head;
    agent.try_send_event(UserEvent::new("look around")).unwrap();
    eventually("the agent asks", || !server.bus.pending().is_empty()).await;
    // The agent waits for the answer: nothing more is journaled meanwhile.
    let last = client.recent_events(None, 0).await.unwrap().head;
    assert!(last > head);
    let mut seen = Vec::new();
    let mut asked = None;
    let mut each = |followed| {
        match followed {
            client::Followed::Item(client::StreamItem::Event(event)) => seen.push(event.seq),
            client::Followed::Item(client::StreamItem::Notice { kind, data }) => {
                assert_eq!(kind, "intervention_asked");
                asked = data["id"].as_u64();
            }
            client::Followed::Reconnecting { reason, .. } => panic!("reconnected: {reason}"),
        }
        if asked.is_some() && seen.last() == Some(&last) {
            // The callback's error ends the stream.
            return Err(ClientError::Output(std::io::Error::other("enough")));
        }
        Ok(())
    };
    let following = client.follow_events(Some("a"), head, &mut each);
    let ended = tokio::time::timeout(WAIT, following)
        .await
        .expect("the ask and every event");
    assert!(matches!(ended, Err(ClientError::Output(_))));
    assert_eq!(asked, Some(server.bus.pending()[0].id));
    let expected: Vec<u64> = (head + 1..=last).collect();
    assert_eq!(
        seen, expected,
        "every event after the listing's head, once, in order"
    );
    server.stop().await;
}
