//! warden as an MCP server, driven by a real MCP client (rmcp's): the `warden` binary, as
//! `warden serve` (`/mcp`, streamable HTTP) on a free port and as `warden mcp` (stdio) child.
//!
//! * initialize + tools/list: the admin token sees `ask_agent`, `halt`, `halt_all`; the read token
//!   only the tools that read, and calling `halt` with it is refused (`isError`).
//! * `ask_agent` returns the scripted model's answer; `event_status` reads its fate by id; an
//!   unknown agent is a tool error, not a protocol error.
//! * `halt` from one MCP client makes another client's waiting `ask_agent` return `discarded` at
//!   once (bounded by a guard far below its `wait_s`).
//! * HTTP faults: no token → 401; a body that is not JSON → a JSON-RPC parse error (and the server
//!   goes on); no session → 400; an unknown session → 404; GET → 405; DELETE ends a session.
//! * The read token cannot deny the admin: 256 read sessions fill the read class only; the admin
//!   still initializes and may end a read session.
//! * The transport's `Origin` rule (403 for a foreign or rebinding origin), `-32602` for a
//!   `tools/call` without (or with wrong) params, a second `initialize` on an open session refused.
//!
//! Waits poll with a deadline; nothing asserts a duration.
use rmcp::{
    model::{CallToolRequestParams, CallToolResult, JsonObject},
    service::RunningService,
    transport::{
        streamable_http_client::StreamableHttpClientTransportConfig, StreamableHttpClientTransport,
        TokioChildProcess,
    },
    RoleClient, ServiceExt,
};
use serde_json::{json, Value};
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const ADMIN: &str = "mcp-admin-token";
const READ: &str = "mcp-read-token";
const ANSWER: &str = "The library opens at nine.";

/// `quick` answers at once; `slow`'s model takes ten minutes (a turn to halt).
const TEAM: &str = r#"
[safety.timeout]
llm_call_seconds = 900

[providers.quick]
kind = "scripted"
replies = ["The library opens at nine."]
cycle = true

[providers.slow]
kind = "scripted"
replies = ["too late"]
latency_ms = 600000

[[agents]]
key = "quick"
provider = "quick"

[[agents]]
key = "slow"
provider = "slow"
"#;

fn temp_dir(name: &str) -> PathBuf {
    temp_dir_with(name, TEAM)
}

fn temp_dir_with(name: &str, team: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warden-mcp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("team.toml"), team).unwrap();
    dir
}

/// Whether `GET /healthz` on 127.0.0.1:`port` answers 200.
fn healthy(port: u16) -> bool {
    matches!(
        warden_testkit::blocking_request(port, "GET", "/healthz", "", None),
        Ok((200, _))
    )
}

/// `warden serve` on a free port (`warden_testkit::Serve`: killed on drop, its log kept and named
/// when the test fails), and its folder, removed on drop.
struct Server {
    serve: warden_testkit::Serve,
    port: u16,
    dir: PathBuf,
}

impl Server {
    fn start(name: &str) -> Server {
        Server::start_in(temp_dir(name))
    }

    fn start_in(dir: PathBuf) -> Server {
        let serve = warden_testkit::Serve::command(env!("CARGO_BIN_EXE_warden"))
            .config(dir.join("team.toml"))
            .db(dir.join("warden.db"))
            .admin_token(ADMIN)
            .read_token(READ)
            .log(dir.join("serve.log"))
            .start();
        Server {
            port: serve.port(),
            serve,
            dir,
        }
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.serve.url())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

type Client = RunningService<RoleClient, ()>;

fn install_crypto() {
    // rmcp's reqwest is built without a TLS provider (as warden-actors builds it); none is used on
    // plain http, but the client builder wants one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

async fn http_client(server: &Server, token: &str) -> Client {
    install_crypto();
    let config = StreamableHttpClientTransportConfig::with_uri(server.url()).auth_header(token);
    let transport = StreamableHttpClientTransport::from_config(config);
    ().serve(transport).await.expect("MCP handshake over HTTP")
}

fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments must be an object, not {other}"),
    }
}

async fn call(client: &Client, tool: &'static str, arguments: Value) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args(arguments)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_error(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
}

async fn tool_names(client: &Client) -> Vec<String> {
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    names
}

const ALL_TOOLS: [&str; 8] = [
    "agent_status",
    "answer_ask",
    "ask_agent",
    "event_status",
    "halt",
    "halt_all",
    "list_agents",
    "list_asks",
];
const READ_TOOLS: [&str; 4] = ["agent_status", "event_status", "list_agents", "list_asks"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_gets_every_tool_and_the_read_token_only_reads() {
    let server = Server::start("tokens");
    let admin = http_client(&server, ADMIN).await;
    let info = admin.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("warden")
    );
    assert!(info.capabilities.tools.is_some());
    assert_eq!(tool_names(&admin).await, ALL_TOOLS);

    // Exact schemas: required fields and no others.
    let tools = admin.list_all_tools().await.unwrap();
    let ask = tools.iter().find(|t| t.name == "ask_agent").unwrap();
    let schema = Value::Object((*ask.input_schema).clone());
    assert_eq!(schema["required"], json!(["agent", "content"]));
    assert_eq!(schema["additionalProperties"], json!(false));
    assert_eq!(schema["properties"]["wait_s"]["maximum"], json!(300.0));

    let read = http_client(&server, READ).await;
    assert_eq!(tool_names(&read).await, READ_TOOLS);
    let listed = call(&read, "list_agents", json!({})).await;
    assert!(!is_error(&listed), "{}", text(&listed));
    let agents = &listed.structured_content.as_ref().unwrap()["agents"];
    assert_eq!(agents[0]["key"], "quick");
    assert_eq!(agents[1]["state"], "WAITING_FOR_EVENT");

    // Refused with a clear tool error: the halt is not carried out.
    let refused = call(&read, "halt", json!({ "agent": "quick" })).await;
    assert!(is_error(&refused));
    assert!(text(&refused).contains("admin token"), "{}", text(&refused));
    let refused = call(
        &read,
        "ask_agent",
        json!({ "agent": "quick", "content": "hi" }),
    )
    .await;
    assert!(is_error(&refused));
    let status = call(&read, "agent_status", json!({ "agent": "quick" })).await;
    assert_eq!(
        status.structured_content.as_ref().unwrap()["state"],
        "WAITING_FOR_EVENT"
    );
    admin.cancel().await.unwrap();
    read.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_agent_returns_the_answer_and_refusals_are_tool_errors() {
    let server = Server::start("ask");
    let client = http_client(&server, ADMIN).await;
    let answered = call(
        &client,
        "ask_agent",
        json!({ "agent": "quick", "content": "When does the library open?", "wait_s": 60 }),
    )
    .await;
    assert!(!is_error(&answered), "{}", text(&answered));
    assert_eq!(text(&answered), ANSWER);
    let body = answered.structured_content.clone().unwrap();
    assert_eq!(body["status"], "answered");
    let id = body["id"].as_u64().unwrap();

    // Its fate, by id, from the journal.
    let fate = call(
        &client,
        "event_status",
        json!({ "agent": "quick", "id": id }),
    )
    .await;
    assert!(!is_error(&fate), "{}", text(&fate));
    assert_eq!(fate.structured_content.as_ref().unwrap()["answer"], ANSWER);

    // The same idempotency key queues once.
    let keyed =
        json!({ "agent": "quick", "content": "again", "wait_s": 60, "idempotency_key": "k1" });
    let first = call(&client, "ask_agent", keyed.clone()).await;
    let second = call(&client, "ask_agent", keyed).await;
    let (first, second) = (
        first.structured_content.unwrap(),
        second.structured_content.unwrap(),
    );
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["duplicate"], true);

    // No wait: the id and the status, to poll with event_status.
    let queued = call(
        &client,
        "ask_agent",
        json!({ "agent": "slow", "content": "later", "wait_s": 0 }),
    )
    .await;
    assert!(!is_error(&queued), "{}", text(&queued));
    let body = queued.structured_content.clone().unwrap();
    assert!(
        ["pending", "running"].contains(&body["status"].as_str().unwrap()),
        "{body}"
    );
    assert!(text(&queued).contains("event_status"), "{}", text(&queued));
    let polled = call(
        &client,
        "event_status",
        json!({ "agent": "slow", "id": body["id"] }),
    )
    .await;
    let status = polled.structured_content.unwrap()["status"].clone();
    assert!(status == "pending" || status == "running", "{status}");
    let missing = call(
        &client,
        "event_status",
        json!({ "agent": "slow", "id": 999 }),
    )
    .await;
    assert!(is_error(&missing));

    // Refusals are tool errors with a sentence, not JSON-RPC errors.
    let unknown = call(
        &client,
        "ask_agent",
        json!({ "agent": "nobody", "content": "hi" }),
    )
    .await;
    assert!(is_error(&unknown));
    assert!(
        text(&unknown).contains("unknown agent nobody"),
        "{}",
        text(&unknown)
    );
    let unknown = call(&client, "agent_status", json!({ "agent": "nobody" })).await;
    assert!(is_error(&unknown));
    let bad = call(
        &client,
        "ask_agent",
        json!({ "agent": "quick", "content": "hi", "extra": 1 }),
    )
    .await;
    assert!(is_error(&bad));
    assert!(text(&bad).contains("unknown field"), "{}", text(&bad));
    let bad = call(
        &client,
        "ask_agent",
        json!({ "agent": "quick", "content": "hi", "wait_s": 301 }),
    )
    .await;
    assert!(is_error(&bad));
    // An unknown tool is a protocol error.
    let err = client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no_such_tool"), "{err}");
    client.cancel().await.unwrap();
}

/// Polls `agent_status` until `agent` is in `state` (bounded).
async fn wait_for_state(client: &Client, agent: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = call(client, "agent_status", json!({ "agent": agent })).await;
        if status.structured_content.as_ref().unwrap()["state"] == state {
            return;
        }
        assert!(Instant::now() < deadline, "{agent} never reached {state}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_over_mcp_ends_another_clients_waiting_ask_with_discarded() {
    let server = Server::start("halt");
    let asker = http_client(&server, ADMIN).await;
    let operator = http_client(&server, ADMIN).await;
    let ask = tokio::spawn(async move {
        let result = call(
            &asker,
            "ask_agent",
            json!({ "agent": "slow", "content": "take your time", "wait_s": 300 }),
        )
        .await;
        (asker, result)
    });
    wait_for_state(&operator, "slow", "EXECUTING").await;
    assert!(!ask.is_finished(), "the ask must still be waiting");

    let halt_sent = Instant::now();
    let halted = call(&operator, "halt", json!({ "agent": "slow" })).await;
    let halt_acked = halt_sent.elapsed();
    assert!(!is_error(&halted), "{}", text(&halted));
    assert_eq!(
        halted.structured_content.as_ref().unwrap()["halted"][0]["state"],
        "STOPPED"
    );
    // Far below its wait_s of 300: a hang here means the halt did not reach the waiting ask.
    let (asker, result) = tokio::time::timeout(Duration::from_secs(60), ask)
        .await
        .expect("ask_agent still waiting after the halt")
        .unwrap();
    // A figure for the record, not a claim: from sending the halt to the waiting ask's result.
    eprintln!(
        "halt over MCP: acknowledged after {halt_acked:?}, the waiting ask_agent returned after {:?}",
        halt_sent.elapsed()
    );
    assert!(is_error(&result), "{}", text(&result));
    let body = result.structured_content.as_ref().unwrap();
    assert_eq!(body["status"], "discarded");
    assert!(text(&result).contains("halted"), "{}", text(&result));
    let id = body["id"].as_u64().unwrap();
    let fate = call(
        &operator,
        "event_status",
        json!({ "agent": "slow", "id": id }),
    )
    .await;
    assert_eq!(
        fate.structured_content.as_ref().unwrap()["status"],
        "discarded"
    );

    // halt_all answers one acknowledgement per agent.
    let all = call(&operator, "halt_all", json!({})).await;
    assert_eq!(
        all.structured_content.as_ref().unwrap()["halted"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    asker.cancel().await.unwrap();
    operator.cancel().await.unwrap();
}

/// One raw HTTP exchange with `/mcp`: status, headers, body.
async fn raw(
    server: &Server,
    method: reqwest::Method,
    token: Option<&str>,
    session: Option<&str>,
    body: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    raw_with(server, method, token, session, body, &[]).await
}

/// [`raw`] with more request headers.
async fn raw_with(
    server: &Server,
    method: reqwest::Method,
    token: Option<&str>,
    session: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, String) {
    let client = reqwest::Client::new();
    let mut request = client
        .request(method, server.url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(body.to_owned());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(session) = session {
        request = request.header("Mcp-Session-Id", session);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_faults_are_answered_not_crashed_on() {
    use reqwest::Method;
    let server = Server::start("faults");
    // No token, a wrong token: 401.
    let (status, _, _) = raw(&server, Method::POST, None, None, INITIALIZE).await;
    assert_eq!(status, 401);
    let (status, _, _) = raw(&server, Method::POST, Some("wrong"), None, INITIALIZE).await;
    assert_eq!(status, 401);
    // Not JSON: a JSON-RPC parse error.
    let (status, _, body) = raw(&server, Method::POST, Some(ADMIN), None, "{not json").await;
    assert_eq!(status, 400);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["error"]["code"], -32700);
    assert_eq!(body["id"], Value::Null);
    // JSON, but not JSON-RPC; a batch.
    let (status, _, body) = raw(&server, Method::POST, Some(ADMIN), None, r#"{"hello":1}"#).await;
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        -32600
    );
    let (status, _, body) = raw(&server, Method::POST, Some(ADMIN), None, "[]").await;
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        -32600
    );
    // A request without a session, and with an unknown one.
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (status, _, body) = raw(&server, Method::POST, Some(ADMIN), None, list).await;
    assert_eq!(status, 400, "{body}");
    let (status, _, _) = raw(&server, Method::POST, Some(ADMIN), Some("nope"), list).await;
    assert_eq!(status, 404);
    // GET: no server-initiated stream.
    let (status, headers, _) = raw(&server, Method::GET, Some(ADMIN), None, "").await;
    assert_eq!(status, 405);
    assert!(headers.get("allow").is_some());

    // The server goes on: a session opens, lists, and a DELETE ends it.
    let (status, headers, body) = raw(&server, Method::POST, Some(ADMIN), None, INITIALIZE).await;
    assert_eq!(status, 200, "{body}");
    let init: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    let session = headers
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_owned();
    // Another token cannot use it.
    let (status, _, _) = raw(&server, Method::POST, Some(READ), Some(&session), list).await;
    assert_eq!(status, 403);
    // A protocol version this server does not speak.
    let response = reqwest::Client::new()
        .post(server.url())
        .bearer_auth(ADMIN)
        .header("Content-Type", "application/json")
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", "1999-01-01")
        .body(list)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let (status, _, body) = raw(&server, Method::POST, Some(ADMIN), Some(&session), list).await;
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["id"], 2);
    assert_eq!(
        listed["result"]["tools"].as_array().unwrap().len(),
        ALL_TOOLS.len()
    );
    // An unknown method: a JSON-RPC error, the session lives on.
    let nope = r#"{"jsonrpc":"2.0","id":3,"method":"nope/nothing"}"#;
    let (status, _, body) = raw(&server, Method::POST, Some(ADMIN), Some(&session), nope).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        -32601
    );
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _, _) = raw(&server, Method::POST, Some(ADMIN), Some(&session), note).await;
    assert_eq!(status, 202);
    let (status, _, _) = raw(&server, Method::DELETE, Some(ADMIN), Some(&session), "").await;
    assert_eq!(status, 204);
    let (status, _, _) = raw(&server, Method::POST, Some(ADMIN), Some(&session), list).await;
    assert_eq!(status, 404);
    // A body over the API's limit (64 KiB by default).
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(70 * 1024)
    );
    let (status, _, _) = raw(&server, Method::POST, Some(ADMIN), None, &big).await;
    assert_eq!(status, 413);
    assert!(healthy(server.port));
}

/// An `initialize` with `token`: the session id it opened, or the status and body of its refusal.
async fn initialize(server: &Server, token: &str) -> Result<String, (u16, String)> {
    let (status, headers, body) =
        raw(server, reqwest::Method::POST, Some(token), None, INITIALIZE).await;
    match headers.get("mcp-session-id") {
        Some(id) if status == 200 => Ok(id.to_str().unwrap().to_owned()),
        _ => Err((status, body)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_sessions_cannot_fill_the_admins_cap_and_the_admin_may_end_any_session() {
    use reqwest::Method;
    let server = Server::start("caps");
    let mut read_sessions = Vec::new();
    for n in 0..256 {
        let id = initialize(&server, READ)
            .await
            .unwrap_or_else(|e| panic!("read session {n}: {e:?}"));
        read_sessions.push(id);
    }
    // The read class is full: a 257th read session is refused.
    let (status, body) = initialize(&server, READ).await.unwrap_err();
    assert_eq!(status, 503, "{body}");
    // The admin still gets a session, and it works.
    let admin = initialize(&server, ADMIN)
        .await
        .expect("the admin initializes while the read token's sessions are full");
    assert!(
        body.contains("read token"),
        "the refusal says whose: {body}"
    );
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (status, _, body) = raw(&server, Method::POST, Some(ADMIN), Some(&admin), list).await;
    assert_eq!(status, 200, "{body}");
    // The admin ends a read session; the read token may not end the admin's.
    let (status, _, body) = raw(
        &server,
        Method::DELETE,
        Some(ADMIN),
        Some(&read_sessions[0]),
        "",
    )
    .await;
    assert_eq!(status, 204, "the admin ends a read session: {body}");
    let (status, _, _) = raw(&server, Method::DELETE, Some(READ), Some(&admin), "").await;
    assert_eq!(status, 403);
    // Room for one read session again; the read token may end its own.
    let again = initialize(&server, READ).await.expect("room again");
    let (status, _, _) = raw(&server, Method::DELETE, Some(READ), Some(&again), "").await;
    assert_eq!(status, 204);
    // More admin sessions than the cap: the admin is never refused (the least recently used of
    // its own sessions ends).
    for n in 0..300 {
        initialize(&server, ADMIN)
            .await
            .unwrap_or_else(|e| panic!("admin session {n}: {e:?}"));
    }
    let (status, _, body) = raw(
        &server,
        Method::POST,
        Some(READ),
        Some(&read_sessions[1]),
        list,
    )
    .await;
    assert_eq!(status, 200, "admin sessions never end read ones: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_origin_is_refused_and_a_client_without_origin_is_served() {
    use reqwest::Method;
    let server = Server::start("origin");
    async fn post(server: &Server, origin: &str, host: Option<&str>) -> u16 {
        let mut headers = vec![("Origin", origin)];
        if let Some(host) = host {
            headers.push(("Host", host));
        }
        raw_with(
            server,
            Method::POST,
            Some(ADMIN),
            None,
            INITIALIZE,
            &headers,
        )
        .await
        .0
    }
    // A page elsewhere: refused before anything else (the right token included).
    assert_eq!(post(&server, "http://evil.example", None).await, 403);
    assert_eq!(post(&server, "null", None).await, 403);
    // DNS rebinding: the attacker's name resolved to this address; Origin and Host agree.
    let rebound = format!("evil.example:{}", server.port);
    let origin = format!("http://{rebound}");
    assert_eq!(post(&server, &origin, Some(&rebound)).await, 403);
    // This server's own origin, and no Origin at all (not a browser): served.
    let own = format!("http://127.0.0.1:{}", server.port);
    assert_eq!(post(&server, &own, None).await, 200);
    let session = initialize(&server, ADMIN).await.unwrap();
    // DELETE and GET check it too.
    let (status, _, _) = raw_with(
        &server,
        Method::DELETE,
        Some(ADMIN),
        Some(&session),
        "",
        &[("Origin", "http://evil.example")],
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_call_without_params_is_invalid_params() {
    use reqwest::Method;
    let server = Server::start("params");
    let session = initialize(&server, ADMIN).await.unwrap();
    // tools/call without params, and with params that are not a tool call: -32602.
    for body in [
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call"}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":5}}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":[]}"#,
    ] {
        let (status, _, answer) =
            raw(&server, Method::POST, Some(ADMIN), Some(&session), body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["error"]["code"], -32602, "{body}: {answer}");
        assert_eq!(answer["id"], 5);
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("invalid params for tools/call")),
            "{answer}"
        );
    }
    // A well-formed call works.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"list_agents","arguments":{}}}"#;
    let (status, _, answer) = raw(&server, Method::POST, Some(ADMIN), Some(&session), call).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("quick"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_initialize_on_an_open_session_is_refused() {
    use reqwest::Method;
    let server = Server::start("reinit");
    let session = initialize(&server, ADMIN).await.unwrap();
    // A second initialize on the open session: refused, and the session goes on.
    let (status, headers, answer) = raw(
        &server,
        Method::POST,
        Some(ADMIN),
        Some(&session),
        INITIALIZE,
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(headers.get("mcp-session-id").is_none());
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("already initialized")),
        "{answer}"
    );
    let list = r#"{"jsonrpc":"2.0","id":6,"method":"tools/list"}"#;
    let (status, _, answer) = raw(&server, Method::POST, Some(ADMIN), Some(&session), list).await;
    assert_eq!(status, 200, "{answer}");
}

fn stdio_client_command(dir: &Path, read_only: bool) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_warden"));
    command
        .arg("mcp")
        .arg("--config")
        .arg(dir.join("team.toml"))
        .arg("--db")
        .arg(dir.join("warden.db"))
        .env_remove("WARDEN_ADMIN_TOKEN")
        .env_remove("WARDEN_READ_TOKEN");
    if read_only {
        command.arg("--read-only");
    }
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warden_mcp_serves_the_team_over_stdio() {
    let dir = temp_dir("stdio");
    let transport = TokioChildProcess::new(stdio_client_command(&dir, false)).unwrap();
    let client = ().serve(transport).await.expect("MCP handshake over stdio");
    assert_eq!(tool_names(&client).await, ALL_TOOLS);
    let answered = call(
        &client,
        "ask_agent",
        json!({ "agent": "quick", "content": "When?", "wait_s": 60 }),
    )
    .await;
    assert_eq!(text(&answered), ANSWER);
    let unknown = call(&client, "halt", json!({ "agent": "nobody" })).await;
    assert!(is_error(&unknown));
    let halted = call(&client, "halt", json!({ "agent": "quick" })).await;
    assert!(!is_error(&halted), "{}", text(&halted));
    // Closing standard input ends the process (and frees the journal for the next one).
    client.cancel().await.unwrap();

    let transport = TokioChildProcess::new(stdio_client_command(&dir, true)).unwrap();
    let client = ().serve(transport).await.expect("MCP handshake over stdio");
    assert_eq!(tool_names(&client).await, READ_TOOLS);
    // The halt of the first run was journaled: the agent is restored STOPPED.
    let status = call(&client, "agent_status", json!({ "agent": "quick" })).await;
    assert_eq!(
        status.structured_content.as_ref().unwrap()["state"],
        "STOPPED"
    );
    let refused = call(&client, "halt_all", json!({})).await;
    assert!(is_error(&refused));
    client.cancel().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where `.ci/run` installs the npm packages the tests use (`WARDEN_NPM_CACHE`, else
/// `~/.cache/warden-npm`).
fn npm_cache() -> PathBuf {
    match std::env::var_os("WARDEN_NPM_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/warden-npm"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_typescript_sdk_talks_to_mcp() {
    let sdk = npm_cache().join("node_modules/@modelcontextprotocol/sdk");
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        warden_testkit::skip("the_official_typescript_sdk_talks_to_mcp: node is not installed");
        return;
    }
    if !sdk.join("package.json").exists() {
        warden_testkit::skip(&format!(
            "the_official_typescript_sdk_talks_to_mcp: {} is missing (.ci/run installs \
             @modelcontextprotocol/sdk there)",
            sdk.display()
        ));
        return;
    }
    let server = Server::start("node");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_node/client.mjs");
    let url = server.url();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .arg(sdk)
            .arg(url)
            .arg(ADMIN)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "node client failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["server"]["name"], "warden");
    assert_eq!(report["tools"], json!(ALL_TOOLS));
    assert_eq!(report["answer"], ANSWER);
    assert_eq!(report["asked_error"], false);
    assert_eq!(report["halt_error"], false, "{}", report["halt_text"]);
}

// ---- permission asks over /mcp ------------------------------------------------------------------

/// A minimal MCP stdio server (newline-delimited JSON-RPC, no SDK): `wipe` is annotated
/// `destructiveHint: true` (so DANGEROUS) and appends its arguments to `ran.log` beside this
/// script when it runs, so a test sees whether it ran.
const WIPE_SERVER: &str = r#"
import json, os, sys
LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.log")
TOOLS = [{"name": "wipe", "description": "Deletes a path.",
          "annotations": {"destructiveHint": True, "readOnlyHint": False},
          "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
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
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "wipe", "version": "0"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        with open(LOG, "a") as f:
            f.write(json.dumps(msg["params"].get("arguments", {})) + "\n")
        result = {"content": [{"type": "text", "text": "wiped"}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": id, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// `dangerous = "ask"`; agent `g`'s model calls `wipe` once per event (a yes ends the turn; after
/// a no it says so and stops).
fn gated_team(script: &Path) -> String {
    format!(
        r#"
[permissions]
dangerous = "ask"

[providers.m]
kind = "scripted"
replies = [
  {{ tool = "w__wipe", args = {{ path = "notes/old" }} }},
  {{ tool = "w__wipe", args = {{ path = "/etc" }} }},
  "refused, so I stop",
]

[mcp_servers.w]
command = "python3"
args = [{script:?}]

[[agents]]
key = "g"
provider = "m"
delegate = false
tools = ["w.wipe"]
"#
    )
}

/// The arguments `wipe` ran with, one per run.
fn wipe_runs(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("ran.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Polls `list_asks` until one ask is pending; returns it.
async fn pending_ask(client: &Client) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = call(client, "list_asks", json!({})).await;
        assert!(!is_error(&listed), "{}", text(&listed));
        let asks = listed.structured_content.clone().unwrap()["asks"].clone();
        if let Some([ask]) = asks.as_array().map(Vec::as_slice) {
            return ask.clone();
        }
        assert!(Instant::now() < deadline, "no ask came: {asks}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A DANGEROUS MCP tool's ask, answered over `/mcp`: `list_asks` (read token too) names the tool
/// and its arguments; `answer_ask` with the read token is refused like the other admin tools and
/// answers nothing; the admin's yes runs the tool, its no refuses it, an unknown id is a tool error;
/// the journal names `mcp:admin` and the note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_ask_is_listed_and_answered_over_mcp() {
    let have_python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_python {
        warden_testkit::skip("python3 is not installed (needed for the wipe MCP server)");
        return;
    }
    let dir = temp_dir_with("asks", "");
    let script = dir.join("wipe.py");
    std::fs::write(&script, WIPE_SERVER).unwrap();
    std::fs::write(dir.join("team.toml"), gated_team(&script)).unwrap();
    let server = Server::start_in(dir.clone());
    let admin = http_client(&server, ADMIN).await;
    let read = http_client(&server, READ).await;

    let sent = call(
        &admin,
        "ask_agent",
        json!({ "agent": "g", "content": "tidy up", "wait_s": 0 }),
    )
    .await;
    assert!(!is_error(&sent), "{}", text(&sent));
    let ask = pending_ask(&read).await;
    assert_eq!(ask["agent"], "g", "{ask}");
    assert_eq!(ask["permission"]["tool"], "w__wipe", "{ask}");
    assert_eq!(ask["permission"]["arguments"], json!({"path": "notes/old"}));
    assert_eq!(ask["permission"]["category"], "DANGEROUS");
    assert_eq!(ask["permission"]["rule"], "permissions.dangerous");
    let id = ask["id"].as_u64().unwrap();

    // The read token: refused as halt is, and the ask is still pending.
    let refused = call(&read, "answer_ask", json!({ "id": id, "answer": "yes" })).await;
    assert!(is_error(&refused));
    assert!(text(&refused).contains("admin token"), "{}", text(&refused));
    assert_eq!(pending_ask(&admin).await["id"], id);
    assert!(wipe_runs(&dir).is_empty(), "nothing runs while asked");
    // Not yes or no; an unknown id: tool errors that answer nothing.
    let odd = call(&admin, "answer_ask", json!({ "id": id, "answer": "maybe" })).await;
    assert!(is_error(&odd), "{}", text(&odd));
    let unknown = call(&admin, "answer_ask", json!({ "id": 9999, "answer": "yes" })).await;
    assert!(is_error(&unknown));
    assert!(text(&unknown).contains("9999"), "{}", text(&unknown));

    let yes = call(
        &admin,
        "answer_ask",
        json!({ "id": id, "answer": "yes", "note": "old notes may go" }),
    )
    .await;
    assert!(!is_error(&yes), "{}", text(&yes));
    wait_for_turns(&admin, "g", 1).await;
    assert_eq!(wipe_runs(&dir), vec![json!({"path": "notes/old"})]);
    // Answered once: a second answer finds nothing pending.
    let again = call(&admin, "answer_ask", json!({ "id": id, "answer": "no" })).await;
    assert!(is_error(&again), "{}", text(&again));

    call(
        &admin,
        "ask_agent",
        json!({ "agent": "g", "content": "tidy more", "wait_s": 0 }),
    )
    .await;
    let ask = pending_ask(&admin).await;
    assert_eq!(ask["permission"]["arguments"], json!({"path": "/etc"}));
    let no = call(
        &admin,
        "answer_ask",
        json!({ "id": ask["id"], "answer": "no", "note": "never /etc" }),
    )
    .await;
    assert!(!is_error(&no), "{}", text(&no));
    wait_for_turns(&admin, "g", 2).await;
    assert_eq!(wipe_runs(&dir).len(), 1, "no refused it");

    // The journal: both decisions, by mcp:admin, with the notes.
    let (status, recent) = warden_testkit::blocking_request(
        server.port,
        "GET",
        "/api/events/recent?agent=g&limit=200",
        READ,
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{recent}");
    let recent: Value = serde_json::from_str(&recent).unwrap();
    let text = recent.to_string();
    assert_eq!(text.matches("\"permission_decided\"").count(), 2, "{text}");
    assert!(text.contains("mcp:admin"), "{text}");
    assert!(
        text.contains("old notes may go") && text.contains("never /etc"),
        "{text}"
    );
    admin.cancel().await.unwrap();
    read.cancel().await.unwrap();
}

/// Polls `agent_status` until `agent` has finished `n` turns (bounded).
async fn wait_for_turns(client: &Client, agent: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = call(client, "agent_status", json!({ "agent": agent })).await;
        if status.structured_content.as_ref().unwrap()["turns"].as_u64() >= Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "{agent} never finished turn {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `warden mcp` joins no cluster: a team file with `[cluster]` is refused before anything starts
/// (serving it would run agents whose lease another node may hold), naming the key and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warden_mcp_refuses_a_cluster_team_file() {
    let team = format!("{TEAM}\n[cluster]\nurl = \"nats://127.0.0.1:4222\"\nnode = \"a\"\n");
    let dir = temp_dir_with("stdio-cluster", &team);
    let out = stdio_client_command(&dir, false)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("invalid value for `cluster`")
            && stderr.contains("no [cluster] section for warden mcp"),
        "{stderr}"
    );
    assert!(!dir.join("warden.db").exists(), "the journal was opened");
    let _ = std::fs::remove_dir_all(&dir);
}
