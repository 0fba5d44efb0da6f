//! MCP client tools (`warden_actors::tools::mcp`, `[mcp_servers]` in team files), against the real
//! reference server `@modelcontextprotocol/server-everything` (stdio and streamable HTTP), against
//! a hostile server of our own (`tests/mcp/hostile_server.py`) and a minimal streamable-HTTP one
//! (`tests/mcp/http_server.py`, for how a server says a session is gone), and with `warden serve`
//! `SIGKILL`ed under a busy stdio server.
//!
//! The reference server comes from npm: `.ci/run` installs it into `$WARDEN_NPM_CACHE` (default
//! `~/.cache/warden-npm`); `WARDEN_MCP_EVERYTHING` may name its `dist/index.js` directly. Without
//! node, the package or python3, the tests that need them say so on stderr and pass without running.

use serde_json::{json, Value};
use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};
use warden::team::TeamFile;
use warden_actors::tools::{
    mcp::{McpError, McpHub},
    CircuitConfig, ToolContext, ToolError, ToolRegistry, ToolRun, ToolRunner,
};
use warden_protocols::{AgentKey, EventKind, McpServerConfig};

fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The reference server's entry point, or `None` (said loudly) when it cannot run here.
fn everything() -> Option<String> {
    if !have("node") {
        warden_testkit::skip(
            "node is not installed (needed for @modelcontextprotocol/server-everything)",
        );
        return None;
    }
    let path = match std::env::var_os("WARDEN_MCP_EVERYTHING") {
        Some(path) => PathBuf::from(path),
        None => {
            let cache = std::env::var_os("WARDEN_NPM_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/warden-npm"))
                });
            match cache {
                Some(cache) => {
                    cache.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
                }
                None => PathBuf::new(),
            }
        }
    };
    if !path.is_file() {
        warden_testkit::skip(&format!(
            "{} not found; install it with `npm install --prefix \
             \"${{WARDEN_NPM_CACHE:-$HOME/.cache/warden-npm}}\" @modelcontextprotocol/server-everything` \
             (or set WARDEN_MCP_EVERYTHING)",
            path.display()
        ));
        return None;
    }
    Some(path.to_string_lossy().into_owned())
}

fn hostile() -> Option<String> {
    if !have("python3") {
        warden_testkit::skip("python3 is not installed (needed for the hostile MCP server)");
        return None;
    }
    Some(format!(
        "{}/tests/mcp/hostile_server.py",
        env!("CARGO_MANIFEST_DIR")
    ))
}

fn no_env() -> warden_actors::tools::mcp::EnvLookup {
    Arc::new(|_: &str| None)
}

fn servers(name: &str, config: McpServerConfig) -> BTreeMap<String, McpServerConfig> {
    BTreeMap::from([(name.to_owned(), config)])
}

/// An agent's view: its registry and runner over the tools `entries` name.
struct Agent {
    registry: ToolRegistry,
    runner: ToolRunner,
    journal: Arc<warden::MemoryJournal>,
}

impl Agent {
    fn new(hub: &McpHub, entries: &[&str]) -> Result<Agent, McpError> {
        let journal = Arc::new(warden::MemoryJournal::new());
        let dyn_journal: Arc<dyn warden::Journal> = journal.clone();
        let entries: Vec<String> = entries.iter().map(|s| s.to_string()).collect();
        let mut registry = ToolRegistry::new();
        for tool in hub.tools_for(&AgentKey::new("a"), &entries, &dyn_journal)? {
            registry.register(tool);
        }
        Ok(Agent {
            registry,
            runner: ToolRunner::new(CircuitConfig::default()),
            journal,
        })
    }

    async fn call(&self, tool: &str, args: Value) -> ToolRun {
        let ctx = ToolContext {
            agent: AgentKey::new("a"),
            call_id: "call-1".into(),
            lineage: Arc::from(vec![AgentKey::new("a")]),
        };
        self.runner
            .run(&self.registry, tool, args, ctx, Duration::from_secs(20))
            .await
    }

    fn kinds(&self) -> Vec<EventKind> {
        self.journal.events().into_iter().map(|e| e.kind).collect()
    }
}

#[tokio::test]
async fn the_reference_server_over_stdio_echoes_and_its_tools_are_journaled() {
    let Some(js) = everything() else { return };
    let hub = McpHub::start(
        &servers("everything", McpServerConfig::stdio("node", [js])),
        no_env(),
    )
    .await
    .expect("started");
    let agent = Agent::new(&hub, &["everything.echo", "everything.get-sum"]).expect("tools");
    assert_eq!(
        agent.registry.names().collect::<Vec<_>>(),
        ["everything__echo", "everything__get-sum"]
    );
    let run = agent
        .call("everything__echo", json!({"message": "hello from warden"}))
        .await;
    let text = run.result.expect("echo answered");
    assert!(
        text.as_str()
            .is_some_and(|t| t.contains("hello from warden")),
        "{text}"
    );
    // Arguments are checked against the server's schema before any call.
    let run = agent.call("everything__echo", json!({"message": 5})).await;
    assert!(
        matches!(run.result, Err(ToolError::InvalidArguments(_))),
        "{:?}",
        run.result
    );
    assert!(!run.executed);
    let defined: Vec<String> = agent
        .kinds()
        .into_iter()
        .filter_map(|k| match k {
            EventKind::ToolDefined {
                tool,
                source,
                description_sha256,
                ..
            } => {
                assert_eq!(source, "everything");
                assert_eq!(description_sha256.len(), 64);
                Some(tool)
            }
            _ => None,
        })
        .collect();
    assert_eq!(defined, ["everything__echo", "everything__get-sum"]);
    // An unknown tool names what the server has.
    let err = match Agent::new(&hub, &["everything.nope"]) {
        Ok(_) => panic!("an unknown tool was given"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("no usable tool `nope`") && err.contains("echo"),
        "{err}"
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn a_dropped_long_running_call_ends_at_once_and_progress_is_journaled() {
    let Some(js) = everything() else { return };
    let hub = McpHub::start(
        &servers("everything", McpServerConfig::stdio("node", [js])),
        no_env(),
    )
    .await
    .expect("started");
    let agent = Agent::new(&hub, &["everything.trigger-long-running-operation"]).expect("tools");
    let agent = Arc::new(agent);
    let call = {
        let agent = agent.clone();
        tokio::spawn(async move {
            agent
                .call(
                    "everything__trigger-long-running-operation",
                    json!({"duration": 30, "steps": 30}),
                )
                .await
        })
    };
    // Wait for the first progress notification: the call is running on the server.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !agent
        .kinds()
        .iter()
        .any(|k| matches!(k, EventKind::ToolProgress { .. }))
    {
        assert!(Instant::now() < deadline, "no progress journaled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    call.abort(); // what a halt does to the turn's tool future
    assert!(call.await.unwrap_err().is_cancelled());
    // The server is still usable afterwards.
    let echo = Agent::new(&hub, &["everything.echo"]).expect("tools");
    let run = echo
        .call("everything__echo", json!({"message": "still here"}))
        .await;
    assert!(run.result.is_ok(), "{:?}", run.result);
    hub.shutdown().await;
}

#[tokio::test]
async fn the_reference_server_over_streamable_http_echoes() {
    let Some(js) = everything() else { return };
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut server = tokio::process::Command::new("node")
        .arg(&js)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let url = format!("http://127.0.0.1:{port}/mcp");
    // Wait for it to listen.
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the HTTP server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut config = McpServerConfig::http(url);
    config.bearer_env = Some("EVERYTHING_TOKEN".into());
    let env: warden_actors::tools::mcp::EnvLookup =
        Arc::new(|name: &str| (name == "EVERYTHING_TOKEN").then(|| "not-a-real-secret".to_owned()));
    let hub = McpHub::start(&servers("web", config), env)
        .await
        .expect("connected");
    let agent = Agent::new(&hub, &["web.*"]).expect("tools");
    assert!(agent.registry.names().any(|n| n == "web__echo"));
    let run = agent
        .call("web__echo", json!({"message": "over http"}))
        .await;
    assert!(
        run.result
            .as_ref()
            .is_ok_and(|v| v.as_str().is_some_and(|t| t.contains("over http"))),
        "{:?}",
        run.result
    );
    hub.shutdown().await;
    let _ = server.kill().await;
}

/// `server-everything` over streamable HTTP on `port`; returns once it listens.
async fn everything_http(js: &str, port: u16) -> tokio::process::Child {
    let server = tokio::process::Command::new("node")
        .arg(js)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the HTTP server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
}

/// A streamable-HTTP server that restarts loses its sessions; `server-everything` then answers 400
/// to the old session id (the spec says 404). warden takes either as "session gone" and
/// initializes a new session, so calls work again without restarting warden.
#[tokio::test]
async fn an_http_server_restarted_mid_run_is_reconnected() {
    let Some(js) = everything() else { return };
    let port = warden_testkit::free_port();
    let mut server = everything_http(&js, port).await;
    let mut config = McpServerConfig::http(format!("http://127.0.0.1:{port}/mcp"));
    config.timeout_seconds = Some(5.0);
    let hub = McpHub::start(&servers("web", config), no_env())
        .await
        .expect("connected");
    let echo = |hub: &McpHub| Agent::new(hub, &["web.echo"]).expect("tools");
    let said = |run: &ToolRun, what: &str| {
        run.result
            .as_ref()
            .is_ok_and(|v| v.as_str().is_some_and(|t| t.contains(what)))
    };
    let run = echo(&hub)
        .call("web__echo", json!({"message": "before"}))
        .await;
    assert!(said(&run, "before"), "{:?}", run.result);

    // The server restarts on the same port: every session it had is gone.
    server.kill().await.expect("killed");
    let _ = server.wait().await;
    let _server = everything_http(&js, port).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failures = Vec::new();
    loop {
        // A fresh runner each time: the calls failing meanwhile would open the circuit.
        let run = echo(&hub)
            .call("web__echo", json!({"message": "after"}))
            .await;
        if said(&run, "after") {
            break;
        }
        failures.push(format!("{:?}", run.result));
        assert!(
            Instant::now() < deadline,
            "no call worked after the restart in 30 s: {failures:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    hub.shutdown().await;
}

/// Calls `web.echo` (a fresh runner each time: failures would open the circuit) until it answers,
/// within 30 s; panics with every failure seen otherwise.
async fn echo_works_again(hub: &McpHub, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failures = Vec::new();
    loop {
        let agent = Agent::new(hub, &["web.echo"]).expect("tools");
        let run = agent.call("web__echo", json!({"message": "after"})).await;
        if run
            .result
            .as_ref()
            .is_ok_and(|v| v.as_str().is_some_and(|t| t.contains("after")))
        {
            return;
        }
        failures.push(format!("{:?}", run.result));
        assert!(
            Instant::now() < deadline,
            "{what}: no call worked after the restart in 30 s: {failures:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `tests/mcp/http_server.py` on `port`, answering an unknown session as `gone` says; returns once
/// it listens.
async fn python_http(py: &str, port: u16, gone: &str) -> tokio::process::Child {
    let server = tokio::process::Command::new("python3")
        .arg(py)
        .arg(port.to_string())
        .env("SESSION_GONE", gone)
        .kill_on_drop(true)
        .spawn()
        .expect("python3 starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the HTTP server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
}

/// However a restarted streamable-HTTP server says it no longer knows the session — 404 (the
/// spec), 400 with an error for no request, 400 in plain text — warden starts a new session.
#[tokio::test]
async fn a_session_the_server_forgot_is_started_again_on_404_or_400() {
    let Some(hostile) = hostile() else { return };
    let py = hostile.replace("hostile_server.py", "http_server.py");
    for gone in ["404", "400-json", "400-text"] {
        let port = warden_testkit::free_port();
        let mut server = python_http(&py, port, gone).await;
        let mut config = McpServerConfig::http(format!("http://127.0.0.1:{port}/mcp"));
        config.timeout_seconds = Some(5.0);
        let hub = McpHub::start(&servers("web", config), no_env())
            .await
            .expect("connected");
        echo_works_again(&hub, gone).await;
        server.kill().await.expect("killed");
        let _ = server.wait().await;
        let _server = python_http(&py, port, gone).await;
        echo_works_again(&hub, gone).await;
        hub.shutdown().await;
    }
}

fn hostile_config(py: &str, log: &std::path::Path) -> McpServerConfig {
    let mut config = McpServerConfig::stdio("python3", [py.to_owned()]);
    config
        .env
        .insert("HOSTILE_LOG".into(), log.display().to_string());
    config.timeout_seconds = Some(2.0);
    config.max_result_bytes = 1 << 20;
    config
}

fn temp_log(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "warden-mcp-{name}-{}-{:?}.log",
        std::process::id(),
        Instant::now()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn logged(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test]
async fn a_dropped_call_sends_notifications_cancelled_for_its_request() {
    let Some(py) = hostile() else { return };
    let log = temp_log("cancel");
    let hub = McpHub::start(&servers("h", hostile_config(&py, &log)), no_env())
        .await
        .expect("started");
    let agent = Arc::new(Agent::new(&hub, &["h.hang"]).expect("tools"));
    let call = {
        let agent = agent.clone();
        tokio::spawn(async move { agent.call("h__hang", json!({})).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let id = loop {
        if let Some(id) = logged(&log)
            .iter()
            .find_map(|m| m.get("started").and(m.get("id")).cloned())
        {
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "the call never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    call.abort();
    let _ = call.await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let cancelled = logged(&log)
            .into_iter()
            .find(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == id);
        if cancelled.is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no notifications/cancelled for {id}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    hub.shutdown().await;
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn a_hostile_server_fails_only_the_call_it_breaks() {
    let Some(py) = hostile() else { return };
    let log = temp_log("hostile");
    let hub = McpHub::start(&servers("h", hostile_config(&py, &log)), no_env())
        .await
        .expect("started");
    let agent = Agent::new(&hub, &["h.*"]).expect("tools");
    let failed = |run: &ToolRun| match &run.result {
        Err(ToolError::Failed(m)) => m.clone(),
        Err(ToolError::Timeout { .. }) => "timeout".into(),
        other => panic!("expected a failure, got {other:?}"),
    };
    let ok = |run: ToolRun| assert_eq!(run.result, Ok(Value::String("ok".into())));

    ok(agent.call("h__ok", json!({})).await);
    // Never answers: the timeout ends it (and cancels it on the server).
    assert_eq!(failed(&agent.call("h__hang", json!({})).await), "timeout");
    ok(agent.call("h__ok", json!({})).await);
    // Garbage instead of an answer: ignored, so the call times out.
    assert_eq!(
        failed(&agent.call("h__garbage", json!({})).await),
        "timeout"
    );
    ok(agent.call("h__ok", json!({})).await);
    // isError: a failure.
    assert_eq!(
        failed(&agent.call("h__fail", json!({})).await),
        "it went wrong"
    );
    // 50 MB: cut as it is read; the call fails saying so.
    let big = failed(&agent.call("h__big", json!({})).await);
    assert!(big.contains("max_result_bytes"), "{big}");
    ok(agent.call("h__ok", json!({})).await);
    // Dies mid-call: that call fails; the server is restarted with backoff and works again.
    let died = failed(&agent.call("h__die", json!({})).await);
    assert!(!died.is_empty());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // A fresh runner each time: the calls failing meanwhile would open the circuit.
        let probe = Agent::new(&hub, &["h.ok"]).expect("tools");
        let run = probe.call("h__ok", json!({})).await;
        if run.result.is_ok() {
            break;
        }
        let why = failed(&run);
        assert!(why.contains("down") || why.contains("closed"), "{why}");
        assert!(Instant::now() < deadline, "never came back: {why}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    hub.shutdown().await;
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn tools_renamed_or_redescribed_later_are_refused_and_journaled() {
    let Some(py) = hostile() else { return };
    let log = temp_log("rename");
    let hub = McpHub::start(&servers("h", hostile_config(&py, &log)), no_env())
        .await
        .expect("started");
    let agent = Agent::new(&hub, &["h.ok", "h.rename", "h.fail"]).expect("tools");
    assert!(agent.call("h__rename", json!({})).await.result.is_ok());
    // The server now lists `ok` with a new description and the others renamed.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let changed: Vec<(String, bool, bool)> = agent
            .kinds()
            .into_iter()
            .filter_map(|k| match k {
                EventKind::ToolDefinitionChanged {
                    tool,
                    accepted,
                    removed,
                    ..
                } => Some((tool, accepted, removed)),
                _ => None,
            })
            .collect();
        if changed.len() == 3 {
            assert!(
                changed.contains(&("h__ok".into(), false, false)),
                "{changed:?}"
            );
            assert!(
                changed.contains(&("h__fail".into(), false, true)),
                "{changed:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "changes not journaled: {changed:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for tool in ["h__ok", "h__fail"] {
        let run = agent.call(tool, json!({})).await;
        assert!(
            matches!(&run.result, Err(ToolError::Failed(m)) if m.contains("disabled")),
            "{run:?}"
        );
    }
    hub.shutdown().await;
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn starting_says_exactly_why_not() {
    let err = McpHub::start(
        &servers("x", McpServerConfig::stdio("warden-no-such-program", [])),
        no_env(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, McpError::CommandNotFound { .. }), "{err}");
    // Nobody listens at the URL: said in words, not the SDK's type names.
    let mut config = McpServerConfig::http(format!(
        "http://127.0.0.1:{}/mcp",
        warden_testkit::free_port()
    ));
    config.startup_timeout_seconds = 10.0;
    let err = McpHub::start(&servers("web", config), no_env())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        !err.contains("rmcp::") && !err.contains("WorkerTransport") && !err.contains('<'),
        "{err}"
    );
    assert!(err.to_lowercase().contains("connection refused"), "{err}");
    if have("python3") {
        // A program that is no MCP server: the handshake fails, with its stderr.
        let config = McpServerConfig::stdio(
            "python3",
            [
                "-c".to_owned(),
                "import sys; sys.stderr.write('not mcp\\n')".to_owned(),
            ],
        );
        let err = McpHub::start(&servers("x", config), no_env())
            .await
            .unwrap_err();
        assert!(matches!(err, McpError::Handshake { .. }), "{err}");
        assert!(err.to_string().contains("not mcp"), "{err}");
        // One that never answers: timed out.
        let mut config = McpServerConfig::stdio(
            "python3",
            ["-c".to_owned(), "import time; time.sleep(60)".to_owned()],
        );
        config.startup_timeout_seconds = 0.5;
        let err = McpHub::start(&servers("x", config), no_env())
            .await
            .unwrap_err();
        assert!(matches!(err, McpError::TimedOut { .. }), "{err}");
    }
}

const TEAM: &str = r#"
[providers.m]
kind = "scripted"
replies = [{ tool = "everything__echo", args = { message = "hello from warden" } }, "done"]

[mcp_servers.everything]
command = "node"
args = ["EVERYTHING_JS"]

[[agents]]
key = "a"
provider = "m"
tools = ["everything.echo"]
"#;

#[actix_rt::test]
async fn a_team_agent_calls_an_mcp_tool_and_sees_its_answer() {
    let Some(js) = everything() else { return };
    let file = TeamFile::from_toml(&TEAM.replace("EVERYTHING_JS", &js)).expect("team");
    let journal = Arc::new(warden::MemoryJournal::new());
    let team = warden::Supervisor::new(file.config.clone(), journal.clone());
    let mcp = file.start_mcp().await.expect("mcp started");
    file.spawn_agents_with_mcp(&team, &[], mcp.as_ref())
        .expect("spawned");
    let reply = team
        .get("a")
        .expect("agent a")
        .ask(warden::UserEvent::new("echo something"))
        .await
        .expect("answered");
    assert_eq!(reply.answer, "done");
    let echoed = journal.events_of("a").into_iter().any(|e| match e.kind {
        EventKind::HistoryAppended { message } => {
            message.role == warden_protocols::ChatRole::Tool
                && message
                    .content
                    .as_deref()
                    .is_some_and(|c| c.contains("Echo: hello from warden"))
        }
        _ => false,
    });
    assert!(echoed, "{:#?}", journal.events_of("a"));
    team.shutdown().await;
    if let Some(mcp) = mcp {
        mcp.shutdown().await;
    }
}

#[test]
fn unknown_servers_in_tools_are_config_errors_with_their_line() {
    let text = TEAM.replace("everything.echo", "nowhere.echo");
    let err = TeamFile::from_toml(&text).unwrap_err().to_string();
    assert_eq!(
        err,
        "line 13: invalid value for `agents[0].tools[0]` (agent `a`): \"nowhere.echo\" (allowed: \
         \"SERVER.TOOL\" or \"SERVER.*\" with SERVER a key of [mcp_servers]: everything)"
    );
    let text = TEAM.replace(
        "command = \"node\"",
        "command = \"node\"\nurl = \"http://x\"",
    );
    let err = TeamFile::from_toml(&text).unwrap_err().to_string();
    assert!(err.contains("mcp_servers.everything.command"), "{err}");
}

/// The team file in `docs/mcp.md` parses (its server is not started here).
#[test]
fn the_docs_example_parses() {
    let doc = include_str!("../docs/mcp.md");
    let start = doc.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + doc[start..].find("```").expect("its end");
    let file = TeamFile::from_toml(&doc[start..end]).expect("the docs example is a valid team");
    assert!(!file.mcp_servers.is_empty());
    assert!(file.agents.iter().any(|a| !a.tools.is_empty()));
}

/// A halt of an agent whose turn is inside an MCP call reaches the server: the turn's tool future is
/// dropped and `notifications/cancelled` arrives for the call's request id. The model later learns
/// that the call was interrupted and may have run.
#[actix_rt::test]
async fn halting_an_agent_cancels_its_mcp_call_on_the_server() {
    let Some(py) = hostile() else { return };
    let log = temp_log("halt");
    let mut config = hostile_config(&py, &log);
    config.timeout_seconds = Some(120.0);
    let hub = McpHub::start(&servers("h", config), no_env())
        .await
        .expect("started");
    let journal = Arc::new(warden::MemoryJournal::new());
    let dyn_journal: Arc<dyn warden::Journal> = journal.clone();
    let team = warden::Supervisor::new(warden::WardenConfig::default(), journal.clone());
    let provider = warden::ScriptedProvider::new([
        warden::ScriptStep::call("h__hang", json!({})),
        warden::ScriptStep::reply("done"),
    ]);
    let mut spec = warden::AgentSpec::assistant("a", Arc::new(provider));
    for tool in hub
        .tools_for(&AgentKey::new("a"), &["h.hang".to_owned()], &dyn_journal)
        .expect("tools")
    {
        spec = spec.with_tool_arc(tool);
    }
    let agent = team.spawn(spec).expect("spawned");
    agent
        .send_event(warden::UserEvent::new("go"))
        .await
        .expect("accepted");
    let deadline = Instant::now() + Duration::from_secs(10);
    let id = loop {
        if let Some(id) = logged(&log)
            .iter()
            .find_map(|m| m.get("started").and(m.get("id")).cloned())
        {
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "the call never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    team.halt(
        "a",
        warden::HaltCause::Operator {
            operator: "test".into(),
        },
    )
    .await
    .expect("halted");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !logged(&log)
        .iter()
        .any(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == id)
    {
        assert!(
            Instant::now() < deadline,
            "the server never heard of the halt"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Resumed, the agent's next turn answers the interrupted call first: the server had received
    // it, so the model is told it may have run, not invited to call it again.
    agent.resume("test").await.expect("resumed");
    let reply = agent
        .ask(warden::UserEvent::new("again"))
        .await
        .expect("answered");
    assert_eq!(reply.answer, "done");
    let results: Vec<String> = journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::HistoryAppended { message }
                if message.role == warden_protocols::ChatRole::Tool =>
            {
                message.content
            }
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        results[0].contains("interrupted") && results[0].contains("may have run"),
        "{results:?}"
    );
    assert!(
        !results[0].contains("call it again if still needed"),
        "{results:?}"
    );
    team.shutdown().await;
    hub.shutdown().await;
    let _ = std::fs::remove_file(&log);
}

/// `warden config check` starts each MCP server, lists its tools, and says exactly why not with a
/// non-zero exit code.
#[test]
fn config_check_lists_each_servers_tools_or_says_why_not() {
    let dir = std::env::temp_dir().join(format!("warden-mcp-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let check = |text: &str| {
        let path = dir.join("team.toml");
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
            .args(["config", "check"])
            .arg(&path)
            .output()
            .expect("warden runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Each server is started once (it was twice: once to list, once to check the agents' tools):
    // the hostile server logs each `notifications/initialized` it gets.
    if let Some(py) = hostile() {
        let log = dir.join("hostile.log");
        let team = format!(
            "[providers.m]\nkind = \"scripted\"\nreplies = [\"done\"]\n\n[mcp_servers.h]\n\
             command = \"python3\"\nargs = [\"{py}\"]\nenv = {{ HOSTILE_LOG = \"{}\" }}\n\n\
             [[agents]]\nkey = \"a\"\nprovider = \"m\"\ntools = [\"h.ok\"]\n",
            log.display()
        );
        let (ok, stdout, stderr) = check(&team);
        assert!(ok, "{stderr}");
        assert!(stdout.contains("h.ok (the model sees h__ok)"), "{stdout}");
        let starts = logged(&log)
            .iter()
            .filter(|m| m["method"] == "notifications/initialized")
            .count();
        assert_eq!(starts, 1, "config check started the server {starts} times");
    }
    let missing = TEAM.replace("command = \"node\"", "command = \"warden-no-such-program\"");
    let (ok, _, stderr) = check(&missing);
    assert!(!ok);
    assert!(
        stderr.contains("command `warden-no-such-program` not found"),
        "{stderr}"
    );
    if let Some(js) = everything() {
        let (ok, stdout, stderr) = check(&TEAM.replace("EVERYTHING_JS", &js));
        assert!(ok, "{stderr}");
        assert!(
            stdout.contains("everything.echo (the model sees everything__echo)"),
            "{stdout}"
        );
        let (ok, _, stderr) = check(
            &TEAM
                .replace("EVERYTHING_JS", &js)
                .replace("\"everything.echo\"", "\"everything.nope\""),
        );
        assert!(!ok);
        assert!(stderr.contains("no usable tool `nope`"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether process `pid` runs (a zombie does not: nobody may reap an orphan in a container).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next());
        !matches!(state, Some("Z") | Some("X") | None)
    })
}

/// The `server PID` and `helper PID` lines `hostile_server.py` wrote in busy mode, in order.
fn busy_pids(path: &std::path::Path) -> Vec<(String, u32)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (what, pid) = l.split_once(' ')?;
            Some((what.to_owned(), pid.parse().ok()?))
        })
        .collect()
}

/// `warden serve` with the busy hostile server on a free port ([`warden_testkit::Serve`]);
/// ready once `/healthz` answers.
fn serve_busy(team: &std::path::Path, db: &std::path::Path) -> warden_testkit::Serve {
    warden_testkit::Serve::command(env!("CARGO_BIN_EXE_warden"))
        .config(team)
        .db(db)
        .admin_token("admin-token-for-mcp-tests")
        .env_remove("RUST_LOG")
        .start()
}

/// A busy stdio server (it does not exit when its stdin closes, and has started a helper process)
/// does not outlive a `SIGKILL`ed `warden serve`: the server dies with warden (parent-death
/// signal), its helper is ended by the next start (the process groups recorded next to the
/// journal), and a clean stop ends the server's whole group.
#[test]
fn a_sigkilled_warden_leaves_no_mcp_server_behind() {
    if !cfg!(target_os = "linux") {
        return; // the parent-death signal and /proc are Linux's
    }
    let Some(py) = hostile() else { return };
    let dir = warden_testkit::scratch_dir("mcp", "orphans");
    let pids = dir.join("pids");
    let team = dir.join("team.toml");
    let db = dir.join("journal.db");
    std::fs::write(
        &team,
        format!(
            r#"
[providers.m]
kind = "scripted"
replies = ["done"]

[mcp_servers.h]
command = "python3"
args = ["{py}"]
env = {{ HOSTILE_BUSY = "1", HOSTILE_PIDS = "{pids}" }}

[[agents]]
key = "a"
provider = "m"
tools = ["h.ok"]
"#,
            pids = pids.display()
        ),
    )
    .unwrap();
    let mut first = serve_busy(&team, &db);
    let started = busy_pids(&pids);
    let (server, helper) = match started.as_slice() {
        [(s, server), (h, helper)] if s == "server" && h == "helper" => (*server, *helper),
        other => panic!("the server did not say its pids: {other:?}"),
    };
    assert!(running(server) && running(helper));

    // SIGKILL: warden cannot end anything itself.
    first.kill();
    let server_gone = warden_testkit::wait_for(Duration::from_secs(10), || !running(server));
    // Its helper is in the server's group, orphaned; the next start ends it.
    let mut second = serve_busy(&team, &db);
    let helper_gone = warden_testkit::wait_for(Duration::from_secs(10), || !running(helper));
    let restarted = busy_pids(&pids);
    assert_eq!(restarted.len(), 4, "{restarted:?}");
    let (server2, helper2) = (restarted[2].1, restarted[3].1);

    // A clean stop (SIGTERM) ends the new server and its helper.
    second.stop(Duration::from_secs(30));
    let stopped_clean = warden_testkit::wait_for(Duration::from_secs(10), || {
        !running(server2) && !running(helper2)
    });
    // Whatever failed, leave nothing behind.
    for pid in [server, helper, server2, helper2] {
        if running(pid) {
            // SAFETY: a plain signal to a process this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
    assert!(
        server_gone,
        "the busy MCP server {server} outlived the SIGKILLed warden"
    );
    assert!(
        helper_gone,
        "the next warden did not end the helper {helper} the killed one left behind"
    );
    assert!(
        stopped_clean,
        "a clean stop left the server {server2} or its helper {helper2} running"
    );
}
