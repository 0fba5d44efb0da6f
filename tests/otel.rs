//! OpenTelemetry export, end to end: the `warden` binary (`serve` and `run`) exports to an OTLP/HTTP
//! receiver inside the test, which decodes each `ExportTraceServiceRequest` (protobuf) and keeps
//! the spans. Checked: span names and GenAI attributes, the parent links of one delegated task (one
//! trace from the caller's `traceparent` down to the delegate's model call), a malformed
//! `traceparent` ignored, content kept out unless `capture_content`, the `[telemetry]` section, and
//! a collector that is down (the turn answers, drops are counted, the exit is bounded).
//!
//! No test sleeps for correctness: the receiver is polled until the expected spans are there,
//! within [`PATIENCE`].

use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest, common::v1::any_value::Value as AnyValue,
};
use prost::Message;
use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Bound on every wait.
const PATIENCE: Duration = Duration::from_secs(30);
const ADMIN: &str = "otel-test-admin-token";

/// One received span, flattened.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    kind: i32,
    /// 0 unset, 1 ok, 2 error.
    status: i32,
    attributes: HashMap<String, String>,
    events: Vec<String>,
    /// Unix nanoseconds.
    end: u64,
}

impl Span {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn render(value: Option<&AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1: answers every `POST` with `200` and keeps the spans of the
/// protobuf bodies sent to `/v1/traces`.
struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let port = listener.local_addr().unwrap().port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        Receiver { port, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Polls until `done` holds for the spans received, within [`PATIENCE`].
    fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let start = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "timed out waiting for {what}; received: {:#?}",
                spans
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Serves one keep-alive connection: HTTP/1.1 requests with a `Content-Length` body.
fn serve(stream: TcpStream, kept: &Mutex<Vec<Span>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut length = 0;
        let mut content_type = String::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "content-type" => content_type = value.trim().to_owned(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        assert_eq!(path, "/v1/traces", "spans go to /v1/traces");
        assert_eq!(content_type, "application/x-protobuf");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("valid protobuf");
        let mut spans = Vec::new();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| render(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Span {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent: hex(&span.parent_span_id),
                        kind: span.kind,
                        status: span.status.map_or(0, |s| s.code),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| {
                                let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
                                (kv.key.clone(), render(value))
                            })
                            .collect(),
                        events: span.events.iter().map(|e| e.name.clone()).collect(),
                        end: span.end_time_unix_nano,
                    });
                }
            }
        }
        kept.lock().unwrap().extend(spans);
        let reply =
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// A lead that delegates to a helper, on scripted models; every text is recognisable, to look for
/// it in the spans.
const TEAM: &str = r#"
[providers.lead]
kind = "scripted"
cycle = true
replies = [
  { tool = "delegate", args = { agent = "helper", task = "SECRET-TASK-TEXT: look it up." } },
  "LEAD-ANSWER-TEXT",
]

[providers.helper]
kind = "scripted"
replies = ["HELPER-ANSWER-TEXT"]

[[agents]]
key = "lead"
provider = "lead"
system_prompt = "SYSTEM-PROMPT-TEXT"

[[agents]]
key = "helper"
role = "sub_agent"
parent = "lead"
provider = "helper"
delegate = false
"#;

/// Texts that must never reach a span while `capture_content` is off.
const CONTENT: [&str; 5] = [
    "USER-PROMPT-TEXT",
    "SYSTEM-PROMPT-TEXT",
    "SECRET-TASK-TEXT",
    "HELPER-ANSWER-TEXT",
    "LEAD-ANSWER-TEXT",
];

fn temp(name: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    std::env::temp_dir().join(format!("warden-otel-{}-{n}-{name}", std::process::id()))
}

/// The `warden` binary with no `OTEL_*`, `WARDEN_*` or `RUST_LOG` from the test's environment.
fn warden() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_warden"));
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") || name.starts_with("WARDEN_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    // Export every 50 ms instead of every 5 s: the receiver sees spans soon (correctness does not
    // depend on it: the exit flushes too).
    command.env("OTEL_BSP_SCHEDULE_DELAY", "50");
    command
}

/// `warden serve` ([`warden_testkit::Serve`]) of `team` in a scratch directory, with no
/// `OTEL_*`, `WARDEN_*` or `RUST_LOG` from the test's environment (as [`warden`]).
struct Served {
    serve: warden_testkit::Serve,
    url: String,
    _dir: warden_testkit::Scratch,
}

impl Served {
    fn start(team: &str, env: &[(&str, &str)]) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = warden_testkit::scratch_dir("otel", &format!("served-{n}"));
        std::fs::write(dir.join("team.toml"), team).unwrap();
        let mut command = warden_testkit::Serve::command(env!("CARGO_BIN_EXE_warden"))
            .config(dir.join("team.toml"))
            .db(dir.join("journal.db"))
            .log(dir.join("serve.log"));
        for (name, _) in std::env::vars() {
            if name.starts_with("OTEL_") || name.starts_with("WARDEN_") || name == "RUST_LOG" {
                command = command.env_remove(name);
            }
        }
        command = command
            .env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .admin_token(ADMIN);
        for (name, value) in env {
            command = command.env(name, value);
        }
        let serve = command.start();
        Served {
            url: serve.url(),
            serve,
            _dir: dir,
        }
    }

    /// `POST /api/agents/{agent}/events?wait=20` with extra headers: status and body.
    fn post(&self, agent: &str, content: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let client = reqwest::blocking::Client::new();
        let mut request = client
            .post(format!("{}/api/agents/{agent}/events?wait=20", self.url))
            .bearer_auth(ADMIN)
            .json(&serde_json::json!({ "content": content }));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().expect("post the event");
        (response.status().as_u16(), response.text().unwrap())
    }

    fn metrics(&self) -> String {
        reqwest::blocking::Client::new()
            .get(format!("{}/metrics", self.url))
            .bearer_auth(ADMIN)
            .send()
            .expect("get /metrics")
            .text()
            .unwrap()
    }

    /// SIGTERM, then the exit (bounded): how long it took, and standard error.
    fn stop(mut self) -> (Duration, String) {
        let start = Instant::now();
        self.serve.stop(PATIENCE);
        (start.elapsed(), self.serve.log_text())
    }
}

fn one<'a>(spans: &'a [Span], what: &str, pick: impl Fn(&&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| pick(s)).collect();
    assert_eq!(found.len(), 1, "exactly one {what} in {spans:#?}");
    found[0]
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

#[test]
fn one_delegated_task_is_one_trace_from_the_callers_traceparent() {
    let receiver = Receiver::start();
    let endpoint = receiver.endpoint();
    let team = format!("{TEAM}\n[telemetry]\nservice_name = \"from-file\"\n");
    let served = Served::start(
        &team,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "warden-otel-test"),
        ],
    );
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let (status, body) = served.post(
        "lead",
        "USER-PROMPT-TEXT",
        &[("traceparent", traceparent.as_str())],
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("LEAD-ANSWER-TEXT"), "{body}");
    // A malformed traceparent is ignored: the event is taken, in a trace of its own.
    let (status, body) = served.post("lead", "again", &[("traceparent", "00-zz-nonsense")]);
    assert_eq!(status, 200, "{body}");

    let spans = receiver.wait_for("both tasks' spans", |spans| {
        spans
            .iter()
            .filter(|s| s.name == "invoke_agent helper")
            .count()
            == 2
            && spans.iter().filter(|s| s.name.starts_with("POST ")).count() == 2
            && spans
                .iter()
                .filter(|s| s.name == "invoke_agent lead")
                .count()
                == 2
    });
    let traced: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id == TRACE)
        .cloned()
        .collect();
    let request = one(&traced, "request span", |s| {
        s.name == "POST /api/agents/{key}/events"
    });
    assert_eq!(
        request.parent, CALLER,
        "the request continues the caller's span"
    );
    assert_eq!(request.kind, 2, "server");
    assert_eq!(
        request.service, "warden-otel-test",
        "OTEL_SERVICE_NAME wins over the file"
    );
    assert_eq!(request.attr("http.response.status_code"), Some("200"));

    let lead = one(&traced, "lead turn", |s| s.name == "invoke_agent lead");
    assert_eq!(lead.parent, request.span_id);
    assert_eq!(lead.attr("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(lead.attr("gen_ai.agent.name"), Some("lead"));
    assert_eq!(lead.attr("warden.termination"), Some("answered"));
    assert_eq!(lead.status, 0, "an answered turn is no error");

    let lead_chats: Vec<&Span> = traced
        .iter()
        .filter(|s| s.name == "chat scripted" && s.parent == lead.span_id)
        .collect();
    assert_eq!(
        lead_chats.len(),
        2,
        "two model calls: the delegation, the answer"
    );
    for chat in &lead_chats {
        assert_eq!(chat.kind, 3, "client");
        assert_eq!(chat.attr("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.attr("gen_ai.request.model"), Some("scripted"));
        assert_eq!(chat.attr("gen_ai.provider.name"), Some("scripted"));
        assert!(chat.attr("gen_ai.usage.input_tokens").is_some(), "{chat:?}");
        assert!(
            chat.attr("gen_ai.usage.output_tokens").is_some(),
            "{chat:?}"
        );
        // The scripted model reports no usage: warden's estimate is marked.
        assert_eq!(chat.attr("warden.usage.estimated"), Some("true"));
    }
    let reasons: Vec<&str> = lead_chats
        .iter()
        .filter_map(|c| c.attr("gen_ai.response.finish_reasons"))
        .collect();
    assert!(reasons.contains(&r#"["tool_call"]"#), "{reasons:?}");
    assert!(reasons.contains(&r#"["stop"]"#), "{reasons:?}");

    let tool = one(&traced, "delegate call", |s| {
        s.name == "execute_tool delegate"
    });
    assert_eq!(tool.parent, lead.span_id);
    assert_eq!(tool.attr("gen_ai.operation.name"), Some("execute_tool"));
    assert_eq!(tool.attr("gen_ai.tool.name"), Some("delegate"));
    assert!(tool
        .attr("gen_ai.tool.call.id")
        .is_some_and(|id| !id.is_empty()));

    let helper = one(&traced, "helper turn", |s| s.name == "invoke_agent helper");
    assert_eq!(
        helper.parent, tool.span_id,
        "the delegate's turn is a child of the delegator's tool call"
    );
    assert_eq!(helper.attr("gen_ai.agent.name"), Some("helper"));
    one(&traced, "helper model call", |s| {
        s.name == "chat scripted" && s.parent == helper.span_id
    });

    // The second task: a new trace, rooted at its request span.
    let other = spans
        .iter()
        .find(|s| s.name.starts_with("POST ") && s.trace_id != TRACE)
        .expect("the second request's span");
    assert_eq!(
        other.parent, "",
        "a malformed traceparent starts a new trace"
    );
    assert!(spans
        .iter()
        .any(|s| s.name == "invoke_agent lead" && s.parent == other.span_id));

    // capture_content is off: no prompt, task or answer text in any attribute.
    for span in &spans {
        for (key, value) in &span.attributes {
            for text in CONTENT {
                assert!(
                    !value.contains(text),
                    "{text} leaked into {key} of {}",
                    span.name
                );
            }
        }
        assert!(span.attr("gen_ai.input.messages").is_none());
    }

    let metrics = served.metrics();
    assert!(
        metrics.contains("warden_otel_spans_dropped_total{reason=\"queue_full\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("warden_otel_spans_exported_total "),
        "{metrics}"
    );
    let (_, stderr) = served.stop();
    assert!(!stderr.contains("telemetry off"), "{stderr}");
}

#[test]
fn capture_content_from_the_team_file_puts_messages_in_the_spans() {
    let receiver = Receiver::start();
    let team = format!(
        "{TEAM}\n[telemetry]\nendpoint = \"{}\"\nservice_name = \"from-file\"\ncapture_content = true\n",
        receiver.endpoint()
    );
    let config = temp("capture.toml");
    std::fs::write(&config, team).unwrap();
    let out = warden()
        .args(["run", "--event", "USER-PROMPT-TEXT", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&config);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("LEAD-ANSWER-TEXT"), "{stdout}");
    // `warden run` flushes on exit: the spans are there once it has ended.
    let spans = receiver.wait_for("the run's spans", |spans| {
        spans.iter().any(|s| s.name == "invoke_agent helper")
            && spans.iter().any(|s| s.name == "invoke_agent lead")
    });
    assert!(spans.iter().all(|s| s.service == "from-file"), "{spans:#?}");
    let input: Vec<&str> = spans
        .iter()
        .filter_map(|s| s.attr("gen_ai.input.messages"))
        .collect();
    assert!(
        input.iter().any(|m| m.contains("USER-PROMPT-TEXT")),
        "{input:?}"
    );
    assert!(
        input.iter().any(|m| m.contains("SYSTEM-PROMPT-TEXT")),
        "{input:?}"
    );
    let output: Vec<&str> = spans
        .iter()
        .filter_map(|s| s.attr("gen_ai.output.messages"))
        .collect();
    assert!(
        output.iter().any(|m| m.contains("LEAD-ANSWER-TEXT")),
        "{output:?}"
    );
    assert!(
        output.iter().any(|m| m.contains("HELPER-ANSWER-TEXT")),
        "{output:?}"
    );
    let tool = spans
        .iter()
        .find(|s| s.name == "execute_tool delegate")
        .expect("the delegate call");
    assert!(tool
        .attr("gen_ai.tool.call.arguments")
        .is_some_and(|a| a.contains("SECRET-TASK-TEXT")));
}

#[test]
fn with_the_collector_down_turns_answer_drops_are_counted_and_the_exit_is_bounded() {
    // Nobody listens there.
    let down = format!("http://127.0.0.1:{}", warden_testkit::free_port());
    let served = Served::start(
        TEAM,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", down.as_str()),
            // A queue of one span, exported only at exit: the rest of each task's spans drop.
            ("OTEL_BSP_MAX_QUEUE_SIZE", "1"),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    for _ in 0..3 {
        let (status, body) = served.post("lead", "USER-PROMPT-TEXT", &[]);
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("LEAD-ANSWER-TEXT"), "{body}");
    }
    let metrics = served.metrics();
    let dropped = metrics
        .lines()
        .find_map(|l| l.strip_prefix("warden_otel_spans_dropped_total{reason=\"queue_full\"} "))
        .and_then(|n| n.parse::<u64>().ok())
        .expect("the drop counter");
    // Per task: a request span, two turns, three model calls, one tool call. The queue holds one
    // span, and keeps it while its export fails (with the exporter's retries): the rest drop.
    assert!(
        (1..=3 * 7).contains(&dropped),
        "dropped {dropped}\n{metrics}"
    );
    let (took, stderr) = served.stop();
    assert!(
        took < Duration::from_secs(10),
        "the exit waited {took:?} on a dead collector\n{stderr}"
    );

    // An unsupported protocol: said once, export off, the run unchanged.
    let config = temp("grpc.toml");
    std::fs::write(&config, TEAM).unwrap();
    let out = warden()
        .args(["run", "--event", "hi", "--config"])
        .arg(&config)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", down.as_str())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "warden: telemetry off: OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\" is not supported"
        ),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("LEAD-ANSWER-TEXT"));
}

/// Runs `warden run --config TEAM ARGS` with the given environment; returns standard output.
fn run(team: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let config = temp("run.toml");
    std::fs::write(&config, team).unwrap();
    let out = warden()
        .arg("run")
        .args(args)
        .arg("--config")
        .arg(&config)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&config);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn refusals_and_lockouts_are_span_events_with_error_status() {
    let receiver = Receiver::start();
    let endpoint = receiver.endpoint();
    let refuses = r#"
[providers.lead]
kind = "scripted"
replies = [
  { tool = "delegate", args = { agent = "nobody", task = "x" } },
  "gave up",
]

[[agents]]
key = "lead"
provider = "lead"
"#;
    let fails = r#"
[safety.breakers]
max_consecutive_errors = 1

[providers.down]
kind = "scripted"
error = "model down"

[[agents]]
key = "broken"
provider = "down"
"#;
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let out = run(refuses, &["--event", "hi"], &env);
    assert!(out.contains("gave up"), "{out}");
    run(fails, &["--event", "hi"], &env);
    let spans = receiver.wait_for("both runs' turns", |spans| {
        spans.iter().any(|s| s.name == "invoke_agent lead")
            && spans.iter().any(|s| s.name == "invoke_agent broken")
    });
    let tool = one(&spans, "refused delegation", |s| {
        s.name == "execute_tool delegate"
    });
    assert_eq!(tool.status, 2, "{tool:#?}");
    assert!(
        tool.events.iter().any(|e| e == "warden.delegation_refused"),
        "{tool:#?}"
    );
    let broken = one(&spans, "locked-out turn", |s| {
        s.name == "invoke_agent broken"
    });
    assert_eq!(broken.status, 2, "{broken:#?}");
    assert_eq!(broken.attr("warden.termination"), Some("safety_lockout"));
    assert!(
        broken.events.iter().any(|e| e == "warden.safety_lockout"),
        "{broken:#?}"
    );
    let chat = one(&spans, "failed model call", |s| {
        s.name == "chat scripted" && s.parent == broken.span_id
    });
    assert_eq!(chat.status, 2, "{chat:#?}");
}

#[test]
fn a_halt_is_a_span_event_with_error_status() {
    let receiver = Receiver::start();
    let endpoint = receiver.endpoint();
    let team = r#"
[providers.slow]
kind = "scripted"
latency_ms = 600000
replies = ["never"]

[[agents]]
key = "lead"
provider = "slow"
"#;
    let served = Served::start(team, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]);
    let client = reqwest::blocking::Client::new();
    let response = client
        .post(format!("{}/api/agents/lead/events", served.url))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({ "content": "hi" }))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    // Halt once the turn is in its model call: the call holds its provider's permit (EXECUTING
    // alone comes a moment before the call starts, and a halt then drops no model call).
    let start = Instant::now();
    loop {
        let metrics = served.metrics();
        if metrics.contains("warden_provider_calls_in_flight{provider=\"slow\"} 1") {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the model call never started: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let halted = client
        .post(format!("{}/api/agents/lead/halt", served.url))
        .bearer_auth(ADMIN)
        .send()
        .unwrap();
    assert!(halted.status().is_success());
    // The turn's span and its dropped model call's span end in the same halt, but may reach the
    // collector in different export batches: wait for both.
    let spans = receiver.wait_for("the halted turn and its dropped model call", |spans| {
        spans.iter().any(|s| s.name == "invoke_agent lead")
            && spans.iter().any(|s| s.name == "chat scripted")
    });
    let turn = one(&spans, "halted turn", |s| s.name == "invoke_agent lead");
    assert_eq!(turn.status, 2, "{turn:#?}");
    assert!(turn.events.iter().any(|e| e == "warden.halt"), "{turn:#?}");
    assert_eq!(turn.attr("error.type"), Some("halted"));
    let chat = one(&spans, "dropped model call", |s| s.name == "chat scripted");
    assert_eq!(chat.status, 2, "{chat:#?}");
    assert_eq!(chat.attr("error.type"), Some("halted"));
    // The event was answered 202 at once: its request span ended then, long before the turn it
    // started (the turn continues the request's trace without holding its span open).
    let request = one(&spans, "request span", |s| s.name.starts_with("POST "));
    assert_eq!(turn.parent, request.span_id);
    assert_eq!(turn.trace_id, request.trace_id);
    assert!(request.end < turn.end, "{request:#?} {turn:#?}");
    assert!(request.end <= chat.end);
    served.stop();
}

#[test]
fn the_example_team_file_parses_with_its_telemetry_section() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/telemetry.toml"
    ))
    .unwrap();
    let file = warden::team::TeamFile::from_toml(&text).expect("examples/telemetry.toml is valid");
    assert_eq!(
        file.telemetry.endpoint.as_deref(),
        Some("http://localhost:4318")
    );
    assert_eq!(
        file.telemetry.service_name.as_deref(),
        Some("warden-example")
    );
    assert_eq!(file.telemetry.capture_content, Some(false));
    let config = warden::telemetry::TelemetryConfig::resolve(Some(&file.telemetry), |_| None)
        .unwrap()
        .expect("on: the file names an endpoint");
    assert_eq!(config.traces_endpoint, "http://localhost:4318/v1/traces");
    // A mistake in the section is a config error with its place in the file.
    let err = warden::team::TeamFile::from_toml(&text.replace("capture_content", "capture"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 13"), "{err}");
    let err = warden::team::TeamFile::from_toml(
        &text.replace("\"http://localhost:4318\"", "\"localhost:4318\""),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("telemetry.endpoint"), "{err}");
}

/// A collector that answers every request with `503` (a failure the exporter retries), counting
/// the requests it got.
fn failing_collector() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the collector");
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            return;
                        }
                        if header.trim().is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
                    if writer.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, count)
}

/// At exit each export is tried once: the exporter's retries (for a collector that fails, or
/// refuses the connection) would only delay the exit. Spans are exported only at exit here, in one
/// batch; the collector fails it.
#[test]
fn at_exit_a_failing_export_is_not_retried() {
    let (port, requests) = failing_collector();
    let endpoint = format!("http://127.0.0.1:{port}");
    let served = Served::start(
        TEAM,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    let (status, body) = served.post("lead", "USER-PROMPT-TEXT", &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 0);
    let (_, stderr) = served.stop();
    assert_eq!(
        requests.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "export attempts at exit\n{stderr}"
    );
}
