//! The HTTP host path (issue 37 §2), in-process (`actix_web::test`): the host token's class
//! checked on every route against every other class, `POST /api/world/batch` (per-event verdicts,
//! an invalid batch delivers nothing, the size bound), `GET /api/replies` (replies and notices from
//! the journal, `next`, the long-poll) and `npc.journal_ignored`.
//!
//! The SIGKILL checks of the batch's acknowledgement and of the replies' resume after a restart
//! are in `tests/crash.rs` (real `warden serve` processes).
mod common;
use actix_web::{dev::ServiceResponse, http::StatusCode, test, App};
use common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use warden::{
    protocols::npc::{NpcConfig, Verdict, WorldEvent, WorldEventKind},
    server::api::{self, ApiConfig, ApiState},
    server::events::EventHub,
    *,
};

const ADMIN: &str = "admin-secret";
const READ: &str = "read-secret";
const HOST: &str = "host-secret";
const HOST2: &str = "second-host-secret";

fn config() -> ApiConfig {
    ApiConfig {
        admin_token: Some(ADMIN.into()),
        read_token: Some(READ.into()),
        host_tokens: vec![HOST.into(), HOST2.into()],
        max_batch_events: 4,
        ..ApiConfig::default()
    }
}

/// A team over a SQLite journal (in memory) teed into an event hub with that journal as its log:
/// what `warden serve` builds.
struct Host {
    team: Supervisor,
    hub: EventHub,
    sqlite: Arc<SqliteJournal>,
}

fn host_team() -> Host {
    let sqlite = Arc::new(SqliteJournal::open(":memory:").unwrap());
    let hub = EventHub::default().with_log(sqlite.clone());
    let team = Supervisor::builder(
        WardenConfig::default(),
        Arc::new(hub.journal(sqlite.clone())),
    )
    .current_arbiter()
    .build();
    Host { team, hub, sqlite }
}

fn state(h: &Host) -> ApiState {
    ApiState::new(h.team.clone(), config())
        .with_events(h.hub.clone())
        .with_fates(h.sqlite.clone())
        .with_journal(h.sqlite.clone())
}

macro_rules! service {
    ($state:expr) => {
        test::init_service(App::new().configure(api::configure($state))).await
    };
}

macro_rules! call {
    ($app:expr, $req:expr $(,)?) => {
        json_of(test::call_service(&$app, $req.to_request()).await).await
    };
}

fn request(
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> test::TestRequest {
    let mut req = test::TestRequest::default()
        .method(actix_web::http::Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path);
    if let Some(token) = token {
        req = req.insert_header(("Authorization", format!("Bearer {token}")));
    }
    if let Some(body) = body {
        req = req.set_json(body);
    }
    req
}

async fn json_of<B: actix_web::body::MessageBody>(resp: ServiceResponse<B>) -> (StatusCode, Value) {
    let status = resp.status();
    let streaming = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v == "text/event-stream");
    if streaming {
        return (status, Value::Null);
    }
    let bytes = test::read_body(resp).await;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, body)
}

fn whisper(npc: &str, text: &str) -> Value {
    json!({"npc": npc, "speaker": {"id": "p1", "kind": "player"}, "kind": "whisper", "text": text})
}

/// Room talk nobody addressed: an IGNORE (rule 7).
fn chatter(npc: &str, text: &str) -> Value {
    json!({"npc": npc, "speaker": {"id": "p1", "kind": "player"}, "kind": "say", "text": text})
}

/// The token classes: who may call what.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    Admin,
    Read,
    Host,
    /// No `Authorization` header.
    None,
    /// A token that is none of them.
    Wrong,
}

/// Which classes each route serves. A route missing here fails the test: every new route must be
/// classified.
fn allowed(method: &str, path: &str) -> &'static [Class] {
    use Class::*;
    match (method, path) {
        ("GET", "/healthz") => &[Admin, Read, Host, None, Wrong],
        ("GET", "/api/replies") => &[Admin, Read, Host],
        (
            "POST",
            "/api/agents/{key}/world"
            | "/api/world/batch"
            | "/api/world/presence"
            | "/api/world/clock"
            | "/api/halt"
            | "/api/agents/{key}/halt",
        ) => &[Admin, Host],
        (
            "GET",
            "/metrics"
            | "/api/openapi.json"
            | "/api/agents"
            | "/api/agents/{key}"
            | "/api/agents/{key}/events/{id}"
            | "/api/interventions"
            | "/api/events"
            | "/api/events/recent"
            | "/api/fleet"
            | "/api/cluster"
            | "/api/breakers/recent"
            | "/api/agents/{key}/memories",
        ) => &[Admin, Read],
        (
            "POST",
            "/api/agents/{key}/events"
            | "/api/resume"
            | "/api/agents/{key}/unlock"
            | "/api/agents/{key}/emergency/clear"
            | "/api/agents/{key}/history/reset"
            | "/api/agents/{key}/pause"
            | "/api/agents/{key}/resume"
            | "/api/interventions/{id}",
        )
        | ("PUT", "/api/agents/{key}/goals")
        | ("DELETE", "/api/agents/{key}/memories/{id}" | "/api/memories") => &[Admin],
        _ => panic!("{method} {path} is not classified: add it to `allowed`"),
    }
}

#[actix_rt::test]
async fn every_route_answers_every_token_class_as_its_class_allows() {
    tokio::time::pause();
    let h = host_team();
    h.team.assistant("innkeeper", chatty());
    let app = service!(state(&h));
    let mut routes = api::ROUTES.to_vec();
    // Halts last: they stop the agent the other routes act on.
    routes.sort_by_key(|(_, p)| p.ends_with("/halt"));
    let mut wrong = Vec::new();
    for (method, path) in routes {
        let allowed = allowed(method, path);
        let uri = path.replace("{key}", "innkeeper").replace("{id}", "1");
        for class in [
            Class::None,
            Class::Wrong,
            Class::Read,
            Class::Host,
            Class::Admin,
        ] {
            let token = match class {
                Class::Admin => Some(ADMIN),
                Class::Read => Some(READ),
                Class::Host => Some(HOST),
                Class::None => None,
                Class::Wrong => Some("not-a-token"),
            };
            let (status, body) = call!(app, request(method, &uri, token, None));
            let ok = if allowed.contains(&class) {
                status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN
            } else if matches!(class, Class::None | Class::Wrong) {
                status == StatusCode::UNAUTHORIZED
            } else {
                status == StatusCode::FORBIDDEN
            };
            if !ok {
                wrong.push(format!("{method} {path} with {class:?}: {status} {body}"));
            }
        }
    }
    assert!(wrong.is_empty(), "wrong answers:\n{}", wrong.join("\n"));
    // The second host token opens the same as the first.
    let (status, _) = call!(
        app,
        request(
            "POST",
            "/api/world/clock",
            Some(HOST2),
            Some(json!({"hour": 7.0}))
        )
    );
    assert_eq!(status, StatusCode::OK);
    // The host token's 403 names what it may do.
    let (status, body) = call!(
        app,
        request("POST", "/api/agents/innkeeper/unlock", Some(HOST), None)
    );
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("a host token may only"),
        "{body}"
    );
}

#[actix_rt::test]
async fn a_host_token_cannot_log_in_to_the_console_nor_call_mcp() {
    tokio::time::pause();
    let h = host_team();
    let app = service!(state(&h));
    let login = |token: &str| {
        test::TestRequest::post()
            .uri("/console/login")
            .set_form([("token", token)])
            .to_request()
    };
    let resp = test::call_service(&app, login(HOST)).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(resp.headers().get("set-cookie").is_none());
    let page = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    assert!(
        page.contains("A host token cannot log in to the console"),
        "{page}"
    );
    // The same form with the admin token logs in: the refusal is the host token's.
    let resp = test::call_service(&app, login(ADMIN)).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert!(resp.headers().get("set-cookie").is_some());
    let (status, body) = call!(
        app,
        request(
            "POST",
            "/mcp",
            Some(HOST),
            Some(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-03-26", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"}
                }})
            )
        )
        .insert_header(("Accept", "application/json, text/event-stream"))
    );
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("a host token may only")),
        "{body}"
    );
}

#[actix_rt::test]
async fn a_batch_answers_one_verdict_per_event_in_order() {
    tokio::time::pause();
    let h = host_team();
    let innkeeper = h.team.assistant("innkeeper", chatty());
    h.team.assistant("smith", chatty());
    let guard = h.team.assistant("guard", failing());
    lock_out(&guard).await;
    let app = service!(state(&h));
    let batch = json!({"events": [
        whisper("innkeeper", "a room for the night?"),
        chatter("smith", "nice weather"),
        whisper("guard", "let me pass"),
    ]});
    let (status, body) = call!(
        app,
        request("POST", "/api/world/batch", Some(HOST), Some(batch))
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{body}");
    assert_eq!(results[0]["npc"], "innkeeper");
    assert_eq!(results[0]["perception"]["verdict"], "TRIGGER", "{body}");
    let id = results[0]["id"].as_u64().expect("a TRIGGER's queued id");
    assert_eq!(results[1]["npc"], "smith");
    assert_eq!(results[1]["perception"]["verdict"], "IGNORE", "{body}");
    assert_eq!(results[1]["id"], Value::Null);
    assert_eq!(results[2]["npc"], "guard");
    assert_eq!(results[2]["refusal"]["reason"], "locked_out", "{body}");
    // The queued TRIGGER is the innkeeper's event, answered as any other.
    until("the innkeeper answered", || innkeeper.status().turns == 1).await;
    let (status, fate) = call!(
        app,
        request(
            "GET",
            &format!("/api/agents/innkeeper/events/{id}"),
            Some(READ),
            None
        )
    );
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fate["status"], "answered", "{fate}");
}

#[actix_rt::test]
async fn an_invalid_batch_delivers_nothing() {
    tokio::time::pause();
    let h = host_team();
    let innkeeper = h.team.assistant("innkeeper", chatty());
    let app = service!(state(&h));
    let perceived = || innkeeper.status().npc.map_or(0, |n| n.perceived);
    // An unknown NPC after a good event: 404 naming it, and the good one was not delivered.
    let (status, body) = call!(
        app,
        request(
            "POST",
            "/api/world/batch",
            Some(HOST),
            Some(json!({"events": [whisper("innkeeper", "hello"), whisper("nobody", "hi")]}))
        )
    );
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"], "events[1]: unknown agent nobody");
    // A malformed item (no text): 400.
    let (status, body) = call!(
        app,
        request(
            "POST",
            "/api/world/batch",
            Some(HOST),
            Some(json!({"events": [whisper("innkeeper", "hello"),
                {"npc": "innkeeper", "speaker": {"id": "p1", "kind": "player"}, "kind": "say"}]}))
        )
    );
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // More than api.max_batch_events (4 here): 413 with the limit named.
    let five: Vec<Value> = (0..5)
        .map(|i| whisper("innkeeper", &format!("{i}")))
        .collect();
    let (status, body) = call!(
        app,
        request(
            "POST",
            "/api/world/batch",
            Some(HOST),
            Some(json!({ "events": five }))
        )
    );
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("at most 4 (api.max_batch_events)"),
        "{body}"
    );
    settle(10).await;
    assert_eq!(perceived(), 0, "a refused batch delivered something");
    assert_eq!(innkeeper.status().turns, 0);
    // At the limit it is accepted.
    let four: Vec<Value> = (0..4)
        .map(|i| chatter("innkeeper", &format!("{i}")))
        .collect();
    let (status, body) = call!(
        app,
        request(
            "POST",
            "/api/world/batch",
            Some(HOST),
            Some(json!({ "events": four }))
        )
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(perceived(), 4);
}

#[actix_rt::test]
async fn replies_come_from_the_journal_with_notices_and_next_reads_only_what_is_new() {
    tokio::time::pause();
    let h = host_team();
    let innkeeper = h.team.assistant("innkeeper", chatty());
    let guard = h.team.assistant("guard", failing());
    let app = service!(state(&h));
    let (status, body) = call!(
        app,
        request(
            "POST",
            "/api/world/batch",
            Some(HOST),
            Some(json!({"events": [whisper("innkeeper", "ale, please")]}))
        )
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["results"][0]["id"].as_u64().unwrap();
    until("answered", || innkeeper.status().turns == 1).await;
    lock_out(&guard).await;
    let (status, body) = call!(
        app,
        request("GET", "/api/replies?after=0", Some(HOST), None)
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    let replies = body["replies"].as_array().unwrap();
    let reply = replies
        .iter()
        .find(|r| r["type"] == "reply" && r["agent"] == "innkeeper")
        .unwrap_or_else(|| panic!("no reply of the innkeeper: {body}"));
    assert_eq!(reply["event_id"], id);
    assert_eq!(reply["status"], "answered");
    assert!(reply["answer"].is_string(), "{reply}");
    assert!(
        replies
            .iter()
            .any(|r| r["type"] == "locked_out" && r["agent"] == "guard"),
        "the lockout notice: {body}"
    );
    // `seq` is the journal's, in order; `next` is the last row read.
    let seqs: Vec<u64> = replies.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{seqs:?}");
    let next = body["next"].as_u64().unwrap();
    let last = h.sqlite.events().unwrap().last().unwrap().seq;
    assert_eq!(next, last);
    // Nothing new after `next`.
    let (status, body) = call!(
        app,
        request(
            "GET",
            &format!("/api/replies?after={next}"),
            Some(READ),
            None
        )
    );
    assert_eq!(
        (status, body["replies"].clone()),
        (StatusCode::OK, json!([]))
    );
    assert_eq!(body["next"], next);
    // `max` bounds the answer; the rest comes with the next call.
    let (_, first) = call!(
        app,
        request("GET", "/api/replies?after=0&max=1", Some(HOST), None)
    );
    assert_eq!(first["replies"].as_array().unwrap().len(), 1);
    assert_eq!(first["replies"][0], replies[0]);
    let after = first["next"].as_u64().unwrap();
    let (_, rest) = call!(
        app,
        request(
            "GET",
            &format!("/api/replies?after={after}"),
            Some(HOST),
            None
        )
    );
    assert_eq!(rest["replies"].as_array().unwrap()[..], replies[1..]);
    // Bad queries are 400.
    for query in [
        "wait=31",
        "wait=-1",
        "wait=soon",
        "max=0",
        "max=5000",
        "after=x",
        "nope=1",
    ] {
        let (status, _) = call!(
            app,
            request("GET", &format!("/api/replies?{query}"), Some(HOST), None)
        );
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
    }
}

/// Real time: the SQLite journal's writer is a real thread, which paused time would race.
#[actix_rt::test]
async fn a_long_poll_answers_when_a_reply_is_journaled() {
    let h = host_team();
    let innkeeper = h.team.assistant("innkeeper", chatty());
    let app = service!(state(&h));
    let (_, body) = call!(app, request("GET", "/api/replies", Some(HOST), None));
    let next = body["next"].as_u64().unwrap();
    let poll = test::call_service(
        &app,
        request(
            "GET",
            &format!("/api/replies?after={next}&wait=30"),
            Some(HOST),
            None,
        )
        .to_request(),
    );
    let deliver = async {
        // The poll is waiting (it found nothing) before the event is delivered.
        tokio::task::yield_now().await;
        innkeeper
            .perceive(WorldEvent::player("p1", WorldEventKind::Whisper, "hello"))
            .unwrap()
            .queued
            .unwrap()
    };
    let (resp, id) = futures::join!(poll, deliver);
    let (status, body) = json_of(resp).await;
    assert_eq!(status, StatusCode::OK);
    let replies = body["replies"].as_array().unwrap();
    assert!(
        replies
            .iter()
            .any(|r| r["event_id"] == id && r["status"] == "answered"),
        "{body}"
    );
}

#[actix_rt::test]
async fn journal_ignored_false_counts_an_ignore_without_a_journal_row_and_true_journals_it() {
    tokio::time::pause();
    let h = host_team();
    let quiet = NpcConfig {
        journal_ignored: false,
        ..NpcConfig::default()
    };
    let keeping = h.team.assistant("keeping", chatty());
    let quiet = h
        .team
        .spawn(AgentSpec::assistant("quiet", chatty()).with_npc(quiet))
        .unwrap();
    assert!(
        NpcConfig::default().journal_ignored,
        "the default keeps every row"
    );
    let app = service!(state(&h));
    let (status, body) = call!(
        app,
        request(
            "POST",
            "/api/world/batch",
            Some(HOST),
            Some(json!({"events": [
                chatter("keeping", "nice weather"),
                chatter("quiet", "nice weather"),
                whisper("quiet", "psst"),
            ]}))
        )
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    let perceived = |agent: &str| -> Vec<Verdict> {
        h.sqlite
            .events_of(agent)
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::Perceived { perception, .. } => Some(perception.verdict),
                _ => None,
            })
            .collect()
    };
    assert_eq!(perceived("keeping"), [Verdict::Ignore]);
    // The IGNORE is not journaled; the TRIGGER is.
    assert_eq!(perceived("quiet"), [Verdict::Trigger]);
    let npc = quiet.status().npc.unwrap();
    assert_eq!((npc.perceived, npc.ignored_unjournaled), (2, 1));
    let npc = keeping.status().npc.unwrap();
    assert_eq!((npc.perceived, npc.ignored_unjournaled), (1, 0));
    // And on /metrics, summed over the NPCs.
    let resp = test::call_service(
        &app,
        request("GET", "/metrics", Some(READ), None).to_request(),
    )
    .await;
    let text = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    assert!(
        text.lines()
            .any(|l| l == "warden_npc_ignored_unjournaled_total 1"),
        "{text}"
    );
}

/// A halt made with a host token is journaled as the host's (`api:host`), one made with the admin
/// token as the operator's (`api:admin`): the audit trail tells the game server from the operator.
#[actix_web::test]
async fn a_halt_by_a_host_token_is_journaled_as_the_hosts() {
    tokio::time::pause();
    let h = host_team();
    h.team.assistant("by-host", chatty());
    h.team.assistant("by-admin", chatty());
    let app = service!(state(&h));
    for (agent, token) in [("by-host", HOST), ("by-admin", ADMIN)] {
        let (status, body) = call!(
            app,
            request(
                "POST",
                &format!("/api/agents/{agent}/halt"),
                Some(token),
                None
            )
        );
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let halted_by = |agent: &str| -> Vec<String> {
        h.sqlite
            .events_of(agent)
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::Halted {
                    cause: HaltCause::Operator { operator },
                    ..
                } => Some(operator),
                _ => None,
            })
            .collect()
    };
    assert_eq!(halted_by("by-host"), ["api:host"]);
    assert_eq!(halted_by("by-admin"), ["api:admin"]);
}

/// Design 000's "notify the character" over HTTP: `GET /api/replies` carries a world-facing notice
/// (`type: notice`) when an NPC falls silent (locked out, halted) and when it is back (resumed,
/// unlocked), in journal order, with default words a host may show. Read from the journal's state
/// changes, so a host resuming with `after` after a restart sees them too. Before: only the
/// `locked_out` / `unlocked` / `halted` records, and nothing for a resume.
#[actix_rt::test]
async fn replies_carry_a_notice_when_an_npc_falls_silent_and_when_it_is_back() {
    tokio::time::pause();
    let h = host_team();
    h.team.assistant("innkeeper", chatty());
    let guard = h.team.assistant("guard", failing());
    let app = service!(state(&h));
    lock_out(&guard).await;
    for (method, path, token) in [
        ("POST", "/api/agents/innkeeper/halt", HOST),
        ("POST", "/api/agents/innkeeper/resume", ADMIN),
        ("POST", "/api/agents/guard/unlock", ADMIN),
    ] {
        let (status, body) = call!(app, request(method, path, Some(token), None));
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let notices = |body: &Value| -> Vec<(String, String, String)> {
        body["replies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["type"] == "notice")
            .map(|r| {
                (
                    r["agent"].as_str().unwrap().to_owned(),
                    r["presence"].as_str().unwrap().to_owned(),
                    r["text"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let (status, body) = call!(
        app,
        request("GET", "/api/replies?after=0", Some(HOST), None)
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    let seen = notices(&body);
    let expected = [
        ("guard", "silent", "guard falls silent."),
        ("innkeeper", "silent", "innkeeper falls silent."),
        ("innkeeper", "back", "innkeeper stirs again."),
        ("guard", "back", "guard stirs again."),
    ]
    .map(|(a, p, t)| (a.to_owned(), p.to_owned(), t.to_owned()));
    assert_eq!(seen, expected, "{body}");
    // Each carries its cause and its journal row; resuming after the first one gives the rest.
    let first = body["replies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["type"] == "notice")
        .unwrap()
        .clone();
    assert!(first["cause"].is_string(), "{first}");
    let (_, rest) = call!(
        app,
        request(
            "GET",
            &format!("/api/replies?after={}", first["seq"]),
            Some(READ),
            None
        )
    );
    assert_eq!(notices(&rest), expected[1..], "{rest}");
}
