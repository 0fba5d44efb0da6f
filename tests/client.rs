//! The CLI client against a real server on 127.0.0.1 (port 0), started in-process: the library calls,
//! their errors and exit codes, the event stream over a socket, and the `warden` binary itself.
//! Agents run on their own arbiter in real time; every wait is bounded by a timeout.
mod common;
use common::{chatty, counting_tool, failing};
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
    api::{self, ApiConfig, ApiState},
    client::{self, Call, Client, ClientError},
    events::EventHub,
    protocols::{Answer, OnLimitMode},
    safety::ChannelInterventionBus,
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
    let hub = EventHub::default();
    let bus = Arc::new(ChannelInterventionBus::new());
    let team = Supervisor::builder(
        config,
        Arc::new(hub.journal(Arc::new(MemoryJournal::new()))),
    )
    .intervention_bus(Arc::new(hub.intervention_bus(bus.clone())))
    .build();
    let api_config = ApiConfig {
        admin_token: Some(ADMIN.into()),
        read_token: Some(READ.into()),
        body_limit: 0,
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
    server
        .team
        .spawn(AgentSpec::assistant("a", chatty()))
        .unwrap();
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
        table.contains("b: locked out by ConsecutiveErrors"),
        "{table}"
    );

    assert_eq!(
        admin.unlock("b").await.unwrap().state,
        AgentState::WaitingForEvent
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
    server
        .team
        .spawn(AgentSpec::assistant("a", chatty()))
        .unwrap();
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
    let (code, _, err) = warden(&["status", "--url", "localhost:7878"], &[]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("error: invalid server url"), "{err}");
    server.stop().await;
}

/// Issue 12: `warden send KEY TEXT` prints the agent's answer; `--json` the event's fate; an event
/// that ends without an answer exits 8 saying why; a locked-out agent's refusal exits 7.
#[actix_rt::test]
async fn warden_send_prints_the_answer_and_says_why_there_is_none() {
    let server = start(WardenConfig::default());
    server
        .team
        .spawn(AgentSpec::assistant("smith", chatty()))
        .unwrap();
    let down = server
        .team
        .spawn(AgentSpec::assistant("down", failing()))
        .unwrap();
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
