//! The HTTP admin API, in-process (`actix_web::test`): every endpoint's success and error paths, auth,
//! body limits, that event content never unlocks anything, the event stream (asks and their answers,
//! agent filter, lag notice, order, resume), the metrics exposition, and the OpenAPI document against
//! the routes actually served.
mod common;
use actix_web::{
    body::{BoxBody, MessageBody},
    dev::ServiceResponse,
    http::StatusCode,
    test, App,
};
use common::*;
use serde_json::{json, Value};
use std::{collections::BTreeSet, pin::Pin, sync::Arc};
use warden::{
    safety::ChannelInterventionBus,
    server::api::{self, ApiConfig, ApiState},
    server::events::EventHub,
    *,
};

const ADMIN: &str = "admin-secret";
const READ: &str = "read-secret";

fn config() -> ApiConfig {
    ApiConfig {
        admin_token: Some(ADMIN.into()),
        read_token: Some(READ.into()),
        body_limit: 1024,
        ..ApiConfig::default()
    }
}

struct Fixture {
    team: Supervisor,
    bus: Arc<ChannelInterventionBus>,
    journal: Arc<MemoryJournal>,
}

fn fixture(config: WardenConfig) -> Fixture {
    let bus = Arc::new(ChannelInterventionBus::new());
    let journal = Arc::new(MemoryJournal::new());
    let team = Supervisor::builder(config, journal.clone())
        .intervention_bus(bus.clone())
        .current_arbiter()
        .build();
    Fixture { team, bus, journal }
}

/// The API over `f`'s team and bus, as an in-process service.
macro_rules! app {
    ($f:expr) => {
        test::init_service(
            App::new().configure(api::configure(
                ApiState::new($f.team.clone(), config())
                    .with_bus($f.bus.clone())
                    .with_fates($f.journal.clone()),
            )),
        )
        .await
    };
}

/// Calls and returns status and JSON body (`Null` when empty).
macro_rules! call {
    ($app:expr, $req:expr $(,)?) => {
        json_of(test::call_service(&$app, $req.to_request()).await).await
    };
}

fn get(path: &str, token: Option<&str>) -> test::TestRequest {
    let mut req = test::TestRequest::get().uri(path);
    if let Some(token) = token {
        req = req.insert_header(("Authorization", format!("Bearer {token}")));
    }
    req
}

fn post(path: &str, token: Option<&str>, body: Option<Value>) -> test::TestRequest {
    let mut req = test::TestRequest::post().uri(path);
    if let Some(token) = token {
        req = req.insert_header(("Authorization", format!("Bearer {token}")));
    }
    if let Some(body) = body {
        req = req.set_json(body);
    }
    req
}

async fn json_of<B: MessageBody>(resp: ServiceResponse<B>) -> (StatusCode, Value) {
    let status = resp.status();
    let bytes = test::read_body(resp).await;
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            panic!("not JSON: {}", String::from_utf8_lossy(&bytes));
        })
    };
    (status, body)
}

#[actix_rt::test]
async fn healthz_is_open_and_everything_under_api_needs_a_token() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let app = app!(f);
    let (status, body) = call!(app, get("/healthz", None));
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));

    let resp = test::call_service(&app, get("/api/agents", None).to_request()).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers().get("www-authenticate").unwrap(), "Bearer");
    let (status, body) = call!(app, get("/api/agents", Some("wrong")));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"], "invalid bearer token");
    // A prefix of the real token is not the token.
    let (status, _) = call!(app, get("/api/agents", Some(&ADMIN[..5])));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call!(app, post("/api/halt", None, None));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The read token reads, but may not mutate.
    let (status, _) = call!(app, get("/api/agents", Some(READ)));
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call!(app, post("/api/halt", Some(READ), None));
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"], "this call needs the admin token");
}

#[actix_rt::test]
async fn with_no_token_configured_nothing_under_api_is_reachable() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let app = test::init_service(App::new().configure(api::configure(ApiState::new(
        f.team.clone(),
        ApiConfig::default(),
    ))))
    .await;
    let (status, _) = call!(app, get("/api/agents", Some("")));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call!(app, get("/healthz", None));
    assert_eq!(status, StatusCode::OK);
}

#[actix_rt::test]
async fn agents_list_and_status_and_unknown_agent_is_404() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    f.team.assistant("innkeeper", chatty());
    f.team.sub_agent("scout", "innkeeper", chatty());
    let app = app!(f);
    let (status, body) = call!(app, get("/api/agents", Some(READ)));
    assert_eq!(status, StatusCode::OK);
    let keys: Vec<_> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["innkeeper", "scout"]);

    let (status, body) = call!(app, get("/api/agents/scout", Some(ADMIN)));
    assert_eq!(status, StatusCode::OK);
    let s: AgentStatus = serde_json::from_value(body).unwrap();
    assert_eq!(s.state, AgentState::WaitingForEvent);
    assert_eq!(s.parent.as_ref().map(|p| p.as_str()), Some("innkeeper"));
    assert!(!s.emergency_stop);

    let (status, body) = call!(app, get("/api/agents/nobody", Some(READ)));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "unknown agent nobody");
    for path in [
        "/api/agents/nobody/events",
        "/api/agents/nobody/halt",
        "/api/agents/nobody/unlock",
        "/api/agents/nobody/emergency/clear",
        "/api/agents/nobody/history/reset",
    ] {
        let (status, _) = call!(app, post(path, Some(ADMIN), Some(json!({"content": "x"}))));
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
}

#[actix_rt::test]
async fn posting_an_event_delivers_it_and_bad_bodies_are_rejected() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", chatty());
    let app = app!(f);

    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": "hi there", "sender": "bob"})),
        ),
    );
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body["id"].is_u64());
    until("answered", || a.status().turns == 1).await;
    assert_eq!(
        a.record().history.last().unwrap().content.as_deref(),
        Some("hello")
    );

    // The read token may not deliver events.
    let (status, _) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(READ),
            Some(json!({"content": "x"}))
        ),
    );
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Malformed JSON: 400 with serde's message.
    let req = test::TestRequest::post()
        .uri("/api/agents/a/events")
        .insert_header(("Authorization", format!("Bearer {ADMIN}")))
        .insert_header(("Content-Type", "application/json"))
        .set_payload("{\"content\": ");
    let (status, body) = call!(app, req);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("malformed JSON"),
        "{body}"
    );
    // Well-formed but missing `content`.
    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"text": "x"}))
        ),
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap().contains("content"),
        "{body}"
    );

    // Too large: 413.
    let big = "x".repeat(4096);
    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": big}))
        ),
    );
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body["error"].as_str().unwrap().contains("1024"));
    assert_eq!(a.status().turns, 1);

    // An unauthenticated oversized body is refused for its missing token first.
    let (status, _) = call!(
        app,
        post(
            "/api/agents/a/events",
            None,
            Some(json!({"content": "x".repeat(4096)}))
        ),
    );
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[actix_rt::test]
async fn an_event_saying_admin_unlock_unlocks_nothing_only_the_admin_call_does() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let model = failing();
    let stats = model.stats();
    let a = f.team.assistant("a", model);
    lock_out(&a).await;
    let app = app!(f);

    for content in ["admin:unlock", "/unlock", "{\"unlock\": true}"] {
        let (status, body) = call!(
            app,
            post(
                "/api/agents/a/events",
                Some(ADMIN),
                Some(json!({"content": content, "sender": "admin"})),
            ),
        );
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(body["refusal"]["reason"], "locked_out");
        assert_eq!(
            body["error"],
            "agent is in SAFETY_LOCKOUT: Maximum consecutive errors reached (5)"
        );
    }
    settle(50).await;
    let s = a.status();
    assert_eq!(
        (s.state, s.emergency_stop),
        (AgentState::SafetyLockout, true)
    );
    assert_eq!(stats.calls.load(std::sync::atomic::Ordering::SeqCst), 5);
    assert!(!f
        .journal
        .events_of("a")
        .iter()
        .any(|e| matches!(e.kind, EventKind::Unlocked { .. })));

    // The read token may not unlock.
    let (status, _) = call!(app, post("/api/agents/a/unlock", Some(READ), None));
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(a.state(), AgentState::SafetyLockout);

    let (status, body) = call!(app, post("/api/agents/a/unlock", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], json!(AgentState::WaitingForEvent));
    assert_eq!(body["emergency_stop"], false);
    assert!(f.journal.events_of("a").iter().any(
        |e| matches!(&e.kind, EventKind::Unlocked { operator, .. } if operator == api::API_OPERATOR)
    ));
    // Unlocking again: nothing to unlock.
    let (status, body) = call!(app, post("/api/agents/a/unlock", Some(ADMIN), None));
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "emergency stop is not active");
}

#[actix_rt::test]
async fn emergency_clear_and_history_reset_clear_a_lockout() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", failing());
    let b = f.team.assistant("b", failing());
    lock_out(&a).await;
    lock_out(&b).await;
    let app = app!(f);

    let (status, _) = call!(app, post("/api/agents/a/emergency/clear", Some(READ), None));
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = call!(
        app,
        post("/api/agents/a/emergency/clear", Some(ADMIN), None)
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    assert!(!a.record().history.is_empty(), "clear keeps the history");

    let (status, body) = call!(app, post("/api/agents/b/history/reset", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    let s = b.status();
    assert_eq!(
        (
            s.state,
            s.emergency_stop,
            s.history_len,
            s.consecutive_errors
        ),
        (AgentState::WaitingForEvent, false, 0, 0)
    );
}

#[actix_rt::test]
async fn put_goals_sets_them_with_the_admin_token_journaled_by_the_operator() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", chatty());
    let app = app!(f);
    let put = |token, body| request("PUT", "/api/agents/a/goals", Some(token), Some(body));
    let (status, _) = call!(app, put(READ, json!({"goals": ["x"]})));
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = call!(app, put(ADMIN, json!({"goals": ["tend the bar", "  "]})));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid goals: goal 2 is blank");
    let (status, body) = call!(app, put(ADMIN, json!({"goal": ["x"]})));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(a.record().goals.is_empty());
    let (status, body) = call!(app, put(ADMIN, json!({"goals": ["tend the bar"]})));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["key"], "a");
    assert_eq!(a.record().goals, vec!["tend the bar".to_owned()]);
    assert!(f.journal.events_of("a").iter().any(|e| matches!(
        &e.kind,
        EventKind::GoalsSet { goals, by } if by == api::API_OPERATOR && goals.len() == 1
    )));
    let (status, _) = call!(
        app,
        request(
            "PUT",
            "/api/agents/nobody/goals",
            Some(ADMIN),
            Some(json!({"goals": []}))
        )
    );
    assert_eq!(status, StatusCode::NOT_FOUND);
    replay_matches(&f.journal, &a);
}

/// Long-term memory over HTTP: read with the read (or admin) token, forgotten only by the admin
/// (journaled with who), every other token class refused; a player forgotten across all NPCs.
#[actix_rt::test]
async fn memories_are_read_with_the_read_token_and_forgotten_only_by_the_admin() {
    tokio::time::pause();
    let mut wc = WardenConfig::default();
    wc.memory.long_term = true;
    let f = fixture(wc);
    let a = f.team.assistant("a", chatty());
    let b = f.team.assistant("b", chatty());
    for (npc, who, text) in [
        (&a, "p1", "p1 hid the key"),
        (&a, "p2", "p2 likes swords"),
        (&b, "p1", "p1 owes me gold"),
    ] {
        let event = warden::protocols::npc::WorldEvent {
            speaker: warden::protocols::npc::Speaker {
                id: who.into(),
                kind: warden::protocols::npc::SpeakerKind::Player,
            },
            kind: warden::protocols::npc::WorldEventKind::Whisper,
            room: None,
            text: text.into(),
            mentions: None,
            oob: Default::default(),
        };
        npc.perceive(event).unwrap();
    }
    const HOST: &str = "host-secret";
    let app = test::init_service(
        App::new().configure(api::configure(
            ApiState::new(
                f.team.clone(),
                ApiConfig {
                    host_tokens: vec![HOST.into()],
                    ..config()
                },
            )
            .with_fates(f.journal.clone()),
        )),
    )
    .await;
    // Reading: read and admin tokens; a host token, a wrong token and none are refused.
    for (token, expected) in [
        (Some(READ), StatusCode::OK),
        (Some(ADMIN), StatusCode::OK),
        (Some(HOST), StatusCode::FORBIDDEN),
        (Some("wrong"), StatusCode::UNAUTHORIZED),
        (None, StatusCode::UNAUTHORIZED),
    ] {
        let (status, body) = call!(app, get("/api/agents/a/memories?about=p1", token));
        assert_eq!(status, expected, "{token:?}: {body}");
    }
    let (_, body) = call!(app, get("/api/agents/a/memories?q=key", Some(READ)));
    assert_eq!(body["memories"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["memories"][0]["text"], "p1 hid the key");
    let (_, body) = call!(app, get("/api/agents/a/memories?about=p1", Some(READ)));
    assert_eq!(body["profile"]["heard"], 1, "{body}");
    let id = body["memories"][0]["id"].as_u64().unwrap();
    let (status, _) = call!(app, get("/api/agents/a/memories?nope=1", Some(READ)));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Forgetting: the admin token only.
    for (path, _) in [
        (format!("/api/agents/a/memories/{id}"), ()),
        ("/api/memories?about=p1".to_owned(), ()),
    ] {
        for (token, expected) in [
            (Some(READ), StatusCode::FORBIDDEN),
            (Some(HOST), StatusCode::FORBIDDEN),
            (Some("wrong"), StatusCode::UNAUTHORIZED),
            (None, StatusCode::UNAUTHORIZED),
        ] {
            let (status, _) = call!(app, request("DELETE", &path, token, None));
            assert_eq!(status, expected, "DELETE {path} {token:?}");
        }
    }
    assert_eq!(
        a.memories(None, None, 10).len(),
        2,
        "nothing was forgotten yet"
    );
    let (status, body) = call!(
        app,
        request(
            "DELETE",
            &format!("/api/agents/a/memories/{id}"),
            Some(ADMIN),
            None
        )
    );
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({"forgotten": {"a": [id]}}))
    );
    let (status, _) = call!(
        app,
        request(
            "DELETE",
            &format!("/api/agents/a/memories/{id}"),
            Some(ADMIN),
            None
        )
    );
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call!(
        app,
        request("DELETE", "/api/agents/a/memories/x", Some(ADMIN), None)
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // The right to be forgotten: p1 across every NPC, with its profile.
    let (status, body) = call!(
        app,
        request("DELETE", "/api/memories?about=p1", Some(ADMIN), None)
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["forgotten"]["b"].as_array().unwrap().len(),
        1,
        "{body}"
    );
    assert!(b.memories(None, Some("p1"), 10).is_empty() && b.profile("p1").is_none());
    assert!(a.profile("p1").is_none());
    assert_eq!(a.memories(None, None, 10).len(), 1, "p2's memory stays");
    let (status, _) = call!(
        app,
        request("DELETE", "/api/memories?about=", Some(ADMIN), None)
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(f.journal.events_of("b").iter().any(|e| matches!(
        &e.kind,
        EventKind::MemoryForgotten { about: Some(p), by, .. } if p == "p1" && by == api::API_OPERATOR
    )));
    replay_matches(&f.journal, &a);
    replay_matches(&f.journal, &b);
}

#[actix_rt::test]
async fn halt_one_and_halt_all_stop_agents_and_refuse_further_events() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", chatty());
    let b = f.team.assistant("b", chatty());
    let app = app!(f);

    let (status, _) = call!(app, post("/api/agents/a/halt", Some(READ), None));
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = call!(app, post("/api/agents/a/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["halted"][0]["agent"], "a");
    assert_eq!(body["halted"][0]["state"], json!(AgentState::Stopped));
    assert_eq!(a.state(), AgentState::Stopped);
    assert_eq!(b.state(), AgentState::WaitingForEvent);
    assert!(f.journal.events_of("a").iter().any(|e| matches!(
        &e.kind,
        EventKind::Halted { cause: HaltCause::Operator { operator }, .. } if operator == api::API_OPERATOR
    )));

    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": "x"}))
        ),
    );
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["refusal"]["reason"], "stopped");

    let (status, body) = call!(app, post("/api/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["halted"].as_array().unwrap().len(), 2);
    assert_eq!(b.state(), AgentState::Stopped);
}

#[actix_rt::test]
async fn pause_holds_work_and_resume_releases_it_and_brings_a_halted_agent_back() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", chatty());
    let app = app!(f);

    let (status, _) = call!(app, post("/api/agents/a/pause", Some(READ), None));
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call!(app, post("/api/agents/nobody/pause", Some(ADMIN), None));
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = call!(app, post("/api/agents/a/pause", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["paused"], true, "{body}");

    // Paused: an event is accepted and stays queued.
    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": "held"}))
        )
    );
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    settle(50).await;
    assert_eq!(a.status().turns, 0);
    assert_eq!(a.status().queued.ordinary, 1);

    let (status, body) = call!(app, post("/api/agents/a/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    until("the held event runs", || a.status().turns == 1).await;

    // Resuming an agent that is neither paused nor stopped is a conflict.
    let (status, body) = call!(app, post("/api/agents/a/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // A halted agent comes back with resume and takes work again.
    let (status, _) = call!(app, post("/api/agents/a/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(a.state(), AgentState::Stopped);
    let (status, body) = call!(app, post("/api/agents/a/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], json!(AgentState::WaitingForEvent), "{body}");
    let (status, _) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": "again"}))
        )
    );
    assert_eq!(status, StatusCode::ACCEPTED);
    until("the new event runs", || a.status().turns == 2).await;
    let operators: Vec<String> = f
        .journal
        .events_of("a")
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Paused { operator } | EventKind::Unpaused { operator } => Some(operator),
            _ => None,
        })
        .collect();
    assert_eq!(operators, [api::API_OPERATOR, api::API_OPERATOR]);
}

// ---- replies: ?wait=, GET /events/{id}, Idempotency-Key ------------------------------------------

/// A model that answers after `delay` with "answer to <the event's text>".
fn answering(delay: std::time::Duration) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(move |request| {
        let asked = request
            .messages
            .last()
            .and_then(|m| m.content.clone())
            .unwrap_or_default();
        ScriptStep::reply(format!("answer to {asked}")).delayed(delay)
    }))
}

fn event_body(content: &str) -> Option<Value> {
    Some(json!({ "content": content }))
}

#[actix_rt::test]
async fn post_with_wait_answers_200_with_the_answer_and_get_reads_it_back_from_the_journal() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f
        .team
        .assistant("a", answering(std::time::Duration::from_millis(500)));
    let app = app!(f);
    let (status, body) = call!(
        app,
        post("/api/agents/a/events?wait=5", Some(ADMIN), event_body("hi"))
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "answered", "{body}");
    assert_eq!(body["reason"], "answered", "{body}");
    assert!(body["answer"].as_str().unwrap().ends_with("hi"), "{body}");
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{body}"
    );
    let id = body["id"].as_u64().unwrap();
    let (status, got) = call!(app, get(&format!("/api/agents/a/events/{id}"), Some(READ)));
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got, body, "the journal says what the wait said");

    // Without a wait: 202 pending, then running, then answered.
    let (status, body) = call!(
        app,
        post("/api/agents/a/events", Some(ADMIN), event_body("later"))
    );
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "pending", "{body}");
    let id = body["id"].as_u64().unwrap();
    until("running", || a.state() == AgentState::Executing).await;
    let (_, got) = call!(app, get(&format!("/api/agents/a/events/{id}"), Some(READ)));
    assert_eq!(got["status"], "running", "{got}");
    until("answered", || a.status().turns == 2).await;
    let (_, got) = call!(app, get(&format!("/api/agents/a/events/{id}"), Some(READ)));
    assert_eq!(got["status"], "answered", "{got}");

    // A wait shorter than the turn: 202 pending.
    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events?wait=0.1",
            Some(ADMIN),
            event_body("slow")
        )
    );
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "pending", "{body}");
    replay_matches(&f.journal, &a);
}

#[actix_rt::test]
async fn bad_waits_ids_and_unknown_events_are_clear_errors() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    f.team.assistant("a", chatty());
    let app = app!(f);
    for wait in ["301", "-1", "abc", "NaN", ""] {
        let (status, body) = call!(
            app,
            post(
                &format!("/api/agents/a/events?wait={wait}"),
                Some(ADMIN),
                event_body("x")
            )
        );
        assert_eq!(status, StatusCode::BAD_REQUEST, "wait={wait}: {body}");
        assert!(body["error"].as_str().unwrap().contains("wait"), "{body}");
    }
    let (status, _) = call!(app, get("/api/agents/a/events/999", Some(READ)));
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call!(app, get("/api/agents/a/events/x1", Some(READ)));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call!(app, get("/api/agents/nobody/events/1", Some(READ)));
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call!(app, get("/api/agents/a/events/1", None));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[actix_rt::test]
async fn a_halt_answers_a_waiting_caller_at_once_and_a_lockout_answers_refused() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let slow = f
        .team
        .assistant("slow", answering(std::time::Duration::from_secs(10_000)));
    let down = f.team.assistant("down", failing());
    let app = app!(f);
    let waiting = test::call_service(
        &app,
        post(
            "/api/agents/slow/events?wait=300",
            Some(ADMIN),
            event_body("think"),
        )
        .to_request(),
    );
    let halting = async {
        until("slow is running", || slow.state() == AgentState::Executing).await;
        call!(app, post("/api/agents/slow/halt", Some(ADMIN), None))
    };
    let (resp, (halt_status, _)) = futures::join!(waiting, halting);
    assert_eq!(halt_status, StatusCode::OK);
    let (status, body) = json_of(resp).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "discarded", "{body}");

    // Four failures fail; the fifth trips the lockout: refused.
    for i in 0..5 {
        let (status, body) = call!(
            app,
            post(
                "/api/agents/down/events?wait=60",
                Some(ADMIN),
                event_body(&format!("e{i}"))
            )
        );
        assert_eq!(status, StatusCode::OK, "{body}");
        let expected = if i < 4 { "failed" } else { "refused" };
        assert_eq!(body["status"], expected, "{i}: {body}");
    }
    assert_eq!(down.state(), AgentState::SafetyLockout);
}

#[actix_rt::test]
async fn an_idempotency_key_queues_once_and_refuses_another_body() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", chatty());
    let app = app!(f);
    let keyed = |content: &str| {
        post("/api/agents/a/events", Some(ADMIN), event_body(content))
            .insert_header(("Idempotency-Key", "order-7"))
    };
    let (status, first) = call!(app, keyed("buy a sword"));
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let id = first["id"].as_u64().unwrap();
    until("answered", || a.status().turns == 1).await;
    let (status, again) = call!(app, keyed("buy a sword"));
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["id"], id, "{again}");
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["status"], "answered", "{again}");
    let (status, body) = call!(app, keyed("buy a shield"));
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["id"], id, "{body}");
    settle(50).await;
    assert_eq!(a.status().turns, 1, "nothing was queued twice");
    let queued = f
        .journal
        .events_of("a")
        .iter()
        .filter(|e| matches!(e.kind, EventKind::EventQueued { .. }))
        .count();
    assert_eq!(queued, 1);
    replay_matches(&f.journal, &a);
}

#[actix_rt::test]
async fn concurrent_waiters_on_many_agents_each_get_their_own_answer_over_http() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    for i in 0..20 {
        f.team
            .spawn(AgentSpec::assistant(
                format!("npc{i}"),
                answering(std::time::Duration::from_millis(100 + 37 * i)),
            ))
            .unwrap();
    }
    let app = app!(f);
    let calls = (0..20).flat_map(|i| {
        let app = &app;
        (0..3).map(move |j| async move {
            let content = format!("q{i}-{j}");
            let (status, body) = call!(
                app,
                post(
                    &format!("/api/agents/npc{i}/events?wait=60"),
                    Some(ADMIN),
                    event_body(&content)
                )
            );
            (status, body, content)
        })
    });
    for (status, body, content) in futures::future::join_all(calls).await {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["answer"],
            format!("answer to [api] {content}"),
            "{body}"
        );
    }
}

/// Issue 10.1: halt + resume used to take a locked-out agent to WAITING_FOR_EVENT with
/// `emergency_stop` still set, and it took work. A halt never lifts a lockout; a resume is refused
/// while locked out; only the unlock lets work in again.
#[actix_rt::test]
async fn halt_and_resume_cannot_lift_a_lockout_only_the_unlock_does() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", failing());
    let app = app!(f);
    lock_out(&a).await;
    let turns = a.status().turns;

    for halt in ["/api/agents/a/halt", "/api/halt"] {
        let (status, body) = call!(app, post(halt, Some(ADMIN), None));
        assert_eq!(status, StatusCode::OK, "{halt}: {body}");
        assert_eq!(
            body["halted"][0]["state"],
            json!(AgentState::SafetyLockout),
            "{halt}: {body}"
        );
        assert_eq!(a.state(), AgentState::SafetyLockout, "{halt}");
        let (status, body) = call!(app, post("/api/agents/a/resume", Some(ADMIN), None));
        assert_eq!(status, StatusCode::CONFLICT, "{halt}: {body}");
        assert_eq!(body["error"], "locked out: unlock first", "{halt}: {body}");
        let (_, body) = call!(app, get("/api/agents/a", Some(ADMIN)));
        assert_eq!(body["state"], json!(AgentState::SafetyLockout), "{body}");
        assert_eq!(body["emergency_stop"], true, "{body}");
        let (status, body) = call!(
            app,
            post(
                "/api/agents/a/events",
                Some(ADMIN),
                Some(json!({"content": "sneak in"}))
            )
        );
        assert_eq!(status, StatusCode::CONFLICT, "{halt}: {body}");
    }
    // A pause survives a refused resume, and no turn ran.
    let (status, _) = call!(app, post("/api/agents/a/pause", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call!(app, post("/api/agents/a/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(a.status().paused);
    settle(50).await;
    assert_eq!(a.status().turns, turns, "no turn ran while locked out");
    replay_matches(&f.journal, &a);

    // The unlock lifts the lockout and the earlier halt; the resume lifts the pause.
    let (status, body) = call!(app, post("/api/agents/a/unlock", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call!(app, post("/api/agents/a/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": "after unlock"}))
        )
    );
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    until("a turn after the unlock", || a.status().turns == turns + 1).await;
    replay_matches(&f.journal, &a);
}

/// `max_iterations_per_task = 2` in interactive mode, with a model that keeps calling `look`.
fn ask_config() -> WardenConfig {
    let mut config = WardenConfig::default();
    config.execution.max_iterations_per_tick = 10;
    config.safety.loop_.max_iterations_per_task = 2;
    config.safety.on_limit.mode = warden::protocols::OnLimitMode::Interactive;
    config
}

/// An agent `key` whose model keeps calling `look` (so it reaches the iteration limit), and answers
/// "wrap-up" when offered no tools.
fn looking(team: &Supervisor, key: &str) -> AgentHandle {
    let n = std::sync::atomic::AtomicUsize::new(0);
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(move |req| {
        if req.tools.is_empty() {
            return ScriptStep::reply("wrap-up");
        }
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ScriptStep::call("look", json!({ "at": i }))
    }));
    let (look, _) = counting_tool("look", ToolCategory::SafeChain, false);
    team.spawn(AgentSpec::assistant(key, model).with_tool_arc(look))
        .unwrap()
}

#[actix_rt::test]
async fn interventions_are_listed_and_answered_over_http() {
    tokio::time::pause();
    let f = fixture(ask_config());
    let a = looking(&f.team, "a");
    let app = app!(f);
    let (status, body) = call!(app, get("/api/interventions", Some(READ)));
    assert_eq!((status, body), (StatusCode::OK, json!([])));

    a.try_send_event(UserEvent::new("scout")).unwrap();
    until("ask", || !f.bus.pending().is_empty()).await;
    let (status, body) = call!(app, get("/api/interventions", Some(READ)));
    assert_eq!(status, StatusCode::OK);
    let id = body[0]["id"].as_u64().unwrap();
    assert_eq!(body[0]["agent"], "a");

    let path = format!("/api/interventions/{id}");
    let (status, _) = call!(app, post(&path, Some(READ), Some(json!({"answer": "no"}))));
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call!(app, post(&path, Some(ADMIN), Some(json!({"reply": "no"}))));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call!(
        app,
        post(
            "/api/interventions/abc",
            Some(ADMIN),
            Some(json!({"answer": "no"}))
        ),
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = call!(
        app,
        post(
            &path,
            Some(ADMIN),
            Some(json!({"answer": "no", "note": "enough looking"}))
        )
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"id": id, "answer": "no", "note": "enough looking"})
    );
    // Answered once; a second answer finds nothing pending.
    let (status, body) = call!(
        app,
        post(&path, Some(ADMIN), Some(json!({"answer": "yes"})))
    );
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body["error"],
        format!("no pending intervention with id {id}")
    );
    // The "no" refused the limit: the task ends with the wrap-up. The journal says who refused it,
    // and why.
    until("wrapped up", || a.status().turns == 1).await;
    let events = f.journal.events_of("a");
    assert!(events
        .iter()
        .any(|e| matches!(e.kind, EventKind::LimitDenied { .. })));
    let decided: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::LimitDecided { decision, .. } => Some(decision.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        decided,
        [
            warden::protocols::LimitDecision::refuse(warden::protocols::LimitReason::UserRefused)
                .answered_by(Some(warden::protocols::AnsweredBy {
                    operator: "api:admin".into(),
                    note: Some("enough looking".into()),
                }))
        ]
    );
    assert_eq!(
        serde_json::to_value(&decided[0]).unwrap()["answered_by"],
        json!({"operator": "api:admin", "note": "enough looking"})
    );
}

#[actix_rt::test]
async fn serve_refuses_a_public_address_without_an_admin_token() {
    let public: std::net::SocketAddr = "0.0.0.0:7878".parse().unwrap();
    let local: std::net::SocketAddr = "127.0.0.1:7878".parse().unwrap();
    let err = api::check_listen(public, &ApiConfig::default()).unwrap_err();
    assert!(err.to_string().contains("without an admin token"), "{err}");
    assert!(api::check_listen(local, &ApiConfig::default()).is_ok());
    assert!(api::check_listen(public, &config()).is_ok());
    // Binding a server checks the same.
    let f = fixture(WardenConfig::default());
    let open = ApiState::new(f.team.clone(), ApiConfig::default());
    let err = api::bind(open, "0.0.0.0:0".parse().unwrap())
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(err, api::ServeError::NoTokenOnPublicAddress(_)),
        "{err}"
    );
}

/// `warden serve` without `--config` serves the demo's team: the concierge delegates each event to
/// the researcher and the scribe, then answers.
#[actix_rt::test]
async fn the_default_team_delegates_to_both_sub_agents_and_answers() {
    tokio::time::pause();
    let file = warden::team::TeamFile::from_toml(warden::serve::DEFAULT_TEAM).unwrap();
    let (team, journal) = common::team(file.config.clone());
    file.spawn_agents(&team).unwrap();
    let keys: Vec<String> = team.statuses().iter().map(|s| s.key.to_string()).collect();
    assert_eq!(keys, ["concierge", "researcher", "scribe"]);
    let concierge = team.get("concierge").unwrap();
    for round in 1..=2 {
        concierge
            .try_send_event(UserEvent::new("When does the library open?"))
            .unwrap();
        until("the concierge answered", || {
            concierge.status().turns == round
        })
        .await;
        assert_eq!(
            concierge
                .record()
                .history
                .last()
                .unwrap()
                .content
                .as_deref(),
            Some("Done: the researcher looked it up and the scribe noted it.")
        );
        for sub in ["researcher", "scribe"] {
            assert_eq!(team.get(sub).unwrap().status().turns, round, "{sub}");
        }
    }
    let ended = journal
        .events()
        .into_iter()
        .filter(|e| matches!(e.kind, EventKind::DelegationEnded { .. }))
        .count();
    assert_eq!(ended, 4);
}

// ---- the event stream ---------------------------------------------------------------------------

/// A team whose journal (in memory) and intervention bus publish to `hub`.
struct Streaming {
    team: Supervisor,
    bus: Arc<ChannelInterventionBus>,
    hub: EventHub,
}

fn streaming(config: WardenConfig, hub: EventHub, inner: Arc<dyn Journal>) -> Streaming {
    let bus = Arc::new(ChannelInterventionBus::new());
    let team = Supervisor::builder(config, Arc::new(hub.journal(inner)))
        .intervention_bus(Arc::new(hub.intervention_bus(bus.clone())))
        .current_arbiter()
        .build();
    Streaming { team, bus, hub }
}

fn streaming_state(s: &Streaming) -> ApiState {
    ApiState::new(s.team.clone(), config())
        .with_bus(s.bus.clone())
        .with_events(s.hub.clone())
}

macro_rules! service {
    ($state:expr) => {
        test::init_service(App::new().configure(api::configure($state))).await
    };
}

/// One SSE message.
#[derive(Debug, Clone)]
struct Msg {
    id: Option<u64>,
    event: String,
    data: Value,
}

/// Reads SSE messages from a response body.
struct Sse {
    body: BoxBody,
    buf: String,
    /// Comment lines seen (keep-alives, the greeting).
    comments: Vec<String>,
}

impl Sse {
    fn new<B: MessageBody + 'static>(resp: ServiceResponse<B>) -> Self {
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers().get("content-type").unwrap(),
            "text/event-stream"
        );
        Sse {
            body: resp.into_body().boxed(),
            buf: String::new(),
            comments: Vec::new(),
        }
    }

    /// The next message (comments are collected, not returned). Time is paused: an idle stream
    /// still yields keep-alives, so this never hangs; it panics after 10 000 chunks.
    async fn next(&mut self) -> Msg {
        for _ in 0..10_000 {
            while let Some(end) = self.buf.find("\n\n") {
                let raw: String = self.buf.drain(..end + 2).collect();
                let mut msg = Msg {
                    id: None,
                    event: String::new(),
                    data: Value::Null,
                };
                for line in raw.lines() {
                    if let Some(comment) = line.strip_prefix(':') {
                        self.comments.push(comment.trim().to_owned());
                    } else if let Some(id) = line.strip_prefix("id: ") {
                        msg.id = Some(id.parse().unwrap());
                    } else if let Some(event) = line.strip_prefix("event: ") {
                        msg.event = event.to_owned();
                    } else if let Some(data) = line.strip_prefix("data: ") {
                        msg.data = serde_json::from_str(data).unwrap();
                    } else if !line.is_empty() {
                        panic!("not an SSE line: {line:?}");
                    }
                }
                if !msg.event.is_empty() {
                    return msg;
                }
            }
            let chunk = futures::future::poll_fn(|cx| Pin::new(&mut self.body).poll_next(cx))
                .await
                .expect("the stream ended")
                .unwrap();
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        panic!("no SSE message in 10 000 chunks");
    }

    /// Reads until a message matches; returns it and the messages before it.
    async fn until(&mut self, what: &str, pred: impl Fn(&Msg) -> bool) -> (Msg, Vec<Msg>) {
        let mut before = Vec::new();
        for _ in 0..10_000 {
            let msg = self.next().await;
            if pred(&msg) {
                return (msg, before);
            }
            before.push(msg);
        }
        panic!("no SSE message {what}; got {before:?}");
    }
}

fn events_request(token: Option<&str>) -> test::TestRequest {
    get("/api/events", token)
}

#[actix_rt::test]
async fn the_event_stream_delivers_an_ask_and_the_answer_resolves_it() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let s = streaming(ask_config(), EventHub::default(), journal.clone());
    let a = looking(&s.team, "a");
    let app = service!(streaming_state(&s));
    let mut sse = Sse::new(test::call_service(&app, events_request(Some(READ)).to_request()).await);

    a.try_send_event(UserEvent::new("scout")).unwrap();
    let (ask, before) = sse
        .until("intervention_asked", |m| m.event == "intervention_asked")
        .await;
    assert_eq!(ask.id, None, "notices are not journaled");
    assert_eq!(ask.data["agent"], "a");
    assert_eq!(ask.data["kind"], "iterations_per_task");
    let id = ask.data["id"].as_u64().unwrap();
    assert_eq!(
        s.bus.pending()[0].id,
        id,
        "the ask on the stream is answerable"
    );
    // Journal events come first, each with its seq as the SSE id, and the journal's content.
    let waiting = before
        .iter()
        .find(|m| m.event == "state_changed" && m.data["kind"]["to"] == "WAITING_FOR_INPUT")
        .expect("the agent waits for input");
    assert_eq!(waiting.id, waiting.data["seq"].as_u64());
    let ids: Vec<u64> = before.iter().filter_map(|m| m.id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] + 1 == w[1]),
        "in order: {ids:?}"
    );
    let journaled: Vec<Event> = journal.events();
    for m in &before {
        let event: Event = serde_json::from_value(m.data.clone()).unwrap();
        let same = journaled.iter().find(|e| e.seq == event.seq).unwrap();
        assert_eq!((&same.agent, &same.kind), (&event.agent, &event.kind));
    }

    let (status, body) = call!(
        app,
        post(
            &format!("/api/interventions/{id}"),
            Some(ADMIN),
            Some(json!({"answer": "yes"}))
        )
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    let (answered, _) = sse
        .until("intervention_answered", |m| {
            m.event == "intervention_answered"
        })
        .await;
    assert_eq!(
        answered.data,
        json!({"id": id, "agent": "a", "answer": "yes", "answered_by": {"operator": "api:admin"}})
    );
    // The agent resumes, then journals the decision, with who took it.
    let (decided, between) = sse
        .until("limit_decided", |m| m.event == "limit_decided")
        .await;
    assert_eq!(decided.data["kind"]["decision"]["allow"], true);
    assert_eq!(decided.data["kind"]["decision"]["reason"], "user_approved");
    assert_eq!(
        decided.data["kind"]["decision"]["answered_by"],
        json!({"operator": "api:admin"})
    );
    let resumed: Vec<_> = between
        .iter()
        .map(|m| {
            (
                m.event.as_str(),
                &m.data["kind"]["from"],
                &m.data["kind"]["to"],
                &m.data["kind"]["cause"],
            )
        })
        .collect();
    assert_eq!(
        resumed,
        [(
            "state_changed",
            &json!("WAITING_FOR_INPUT"),
            &json!("EXECUTING"),
            &json!("operator answered")
        )]
    );
    assert!(s.bus.pending().iter().all(|p| p.id != id), "resolved");
}

#[actix_rt::test]
async fn an_ask_pending_when_the_stream_opens_is_sent_first_and_a_withdrawn_one_is_announced() {
    tokio::time::pause();
    let mut config = ask_config();
    config.safety.on_limit.ask_timeout_seconds = 30.0;
    let s = streaming(config, EventHub::default(), Arc::new(MemoryJournal::new()));
    let a = looking(&s.team, "a");
    let app = service!(streaming_state(&s));
    a.try_send_event(UserEvent::new("scout")).unwrap();
    until("ask", || !s.bus.pending().is_empty()).await;
    let id = s.bus.pending()[0].id;

    let mut sse =
        Sse::new(test::call_service(&app, events_request(Some(ADMIN)).to_request()).await);
    let first = sse.next().await;
    assert_eq!(
        (first.event.as_str(), first.data["id"].as_u64()),
        ("intervention_asked", Some(id))
    );
    // Nobody answers: the ask times out and is withdrawn, once, and the limit is refused.
    let (withdrawn, before) = sse
        .until("withdrawn", |m| m.event == "intervention_withdrawn")
        .await;
    assert_eq!(withdrawn.data["id"], id);
    assert!(
        !before.iter().any(|m| m.event.starts_with("intervention")),
        "{before:?}"
    );
    let (decided, _) = sse.until("decided", |m| m.event == "limit_decided").await;
    assert_eq!(decided.data["kind"]["decision"]["reason"], "ask_timeout");
}

#[actix_rt::test]
async fn the_event_stream_needs_a_token_a_hub_and_a_good_resume_point() {
    tokio::time::pause();
    let s = streaming(
        WardenConfig::default(),
        EventHub::default(),
        Arc::new(MemoryJournal::new()),
    );
    s.team.assistant("a", chatty());
    let app = service!(streaming_state(&s));
    let resp = test::call_service(&app, events_request(None).to_request()).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let (status, _) = call!(app, events_request(Some("nope")));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = call!(
        app,
        events_request(Some(READ)).insert_header(("Last-Event-ID", "x1"))
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"],
        "Last-Event-ID must be a journal sequence number, not \"x1\""
    );
    let (status, body) = call!(app, get("/api/events?agent=nobody", Some(READ)));
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown agent nobody"))
    );
    let (status, body) = call!(app, get("/api/events?agnt=a", Some(READ)));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("bad query string"),
        "{body}"
    );
    assert_eq!(s.hub.subscribers(), 0, "refused requests do not subscribe");

    // Resuming without a durable journal says so, and goes on live; an idle stream keeps alive.
    let mut sse = Sse::new(
        test::call_service(
            &app,
            events_request(Some(READ))
                .insert_header(("Last-Event-ID", "5"))
                .to_request(),
        )
        .await,
    );
    let msg = sse.next().await;
    assert_eq!(msg.event, "replay_unavailable");
    assert_eq!(msg.data["last_event_id"], 5);
    assert_eq!(s.hub.subscribers(), 1);
    let before = sse.comments.len();
    let started = tokio::time::Instant::now();
    s.team
        .get("a")
        .unwrap()
        .try_send_event(UserEvent::new("hi"))
        .unwrap();
    sse.until("turn", |m| m.event == "turn_finished").await;
    assert!(sse.comments.len() >= before);
    // With nothing happening, the next thing on the wire is a keep-alive comment, on the interval.
    let chunk = futures::future::poll_fn(|cx| Pin::new(&mut sse.body).poll_next(cx))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&chunk[..], b": keep-alive\n\n");
    assert!(started.elapsed() >= warden::server::events::DEFAULT_KEEP_ALIVE);

    // Without a hub: 503.
    let plain = service!(ApiState::new(s.team.clone(), config()));
    let (status, body) = call!(plain, events_request(Some(READ)));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body["error"].as_str().unwrap().contains("no event stream"));
}

#[actix_rt::test]
async fn the_agent_filter_keeps_one_agents_events() {
    tokio::time::pause();
    let s = streaming(
        WardenConfig::default(),
        EventHub::default(),
        Arc::new(MemoryJournal::new()),
    );
    let a = s.team.assistant("a", chatty());
    let b = s.team.assistant("b", chatty());
    let app = service!(streaming_state(&s));
    let mut only_b = Sse::new(
        test::call_service(&app, get("/api/events?agent=b", Some(READ)).to_request()).await,
    );
    let mut all = Sse::new(test::call_service(&app, events_request(Some(READ)).to_request()).await);
    a.try_send_event(UserEvent::new("to a")).unwrap();
    until("a answered", || a.status().turns == 1).await;
    b.try_send_event(UserEvent::new("to b")).unwrap();
    let (_, before) = only_b
        .until("b's turn", |m| m.event == "turn_finished")
        .await;
    assert!(before.iter().all(|m| m.data["agent"] == "b"), "{before:?}");
    assert!(!before.is_empty());
    let (first_of_b, before) = all.until("b's first", |m| m.data["agent"] == "b").await;
    assert!(before
        .iter()
        .any(|m| m.event == "turn_finished" && m.data["agent"] == "a"));
    assert!(first_of_b.id.is_some());
}

#[actix_rt::test]
async fn a_slow_client_is_told_how_many_events_it_missed() {
    tokio::time::pause();
    let hub = EventHub::new(4);
    let journal = hub.journal(Arc::new(MemoryJournal::new()));
    let s = streaming(WardenConfig::default(), hub, Arc::new(MemoryJournal::new()));
    let app = service!(streaming_state(&s));
    let mut sse = Sse::new(test::call_service(&app, events_request(Some(READ)).to_request()).await);
    // Ten events while the client reads nothing: the channel keeps the last four.
    let agent = AgentKey::new("x");
    for _ in 0..10 {
        journal.append(&agent, EventKind::ErrorsReset);
    }
    let lagged = sse.next().await;
    assert_eq!((lagged.event.as_str(), lagged.id), ("lagged", None));
    assert_eq!(lagged.data, json!({"skipped": 6}));
    let mut ids = Vec::new();
    for _ in 0..4 {
        let msg = sse.next().await;
        assert_eq!(msg.event, "errors_reset");
        ids.push(msg.id.unwrap());
    }
    assert_eq!(ids, [7, 8, 9, 10]);
}

/// A journal that hands out the sequence numbers it is given, in that order.
struct Numbered(parking_lot::Mutex<std::collections::VecDeque<u64>>);

impl Journal for Numbered {
    fn append(&self, _: &AgentKey, _: EventKind) -> u64 {
        self.0.lock().pop_front().unwrap()
    }

    fn append_all(&self, _: &AgentKey, _: Vec<EventKind>) -> u64 {
        unreachable!("the test appends one event at a time")
    }

    fn append_rows(&self, _: Vec<(AgentKey, EventKind)>, _: u64) -> u64 {
        unreachable!("the test appends one event at a time")
    }

    fn durable(&self, _: u64) -> futures::future::BoxFuture<'static, Result<(), NotDurable>> {
        warden::already_durable()
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}

#[actix_rt::test]
async fn events_published_out_of_order_are_streamed_in_sequence() {
    tokio::time::pause();
    let hub = EventHub::default();
    let journal = hub.journal(Arc::new(Numbered(parking_lot::Mutex::new(
        [1, 3, 4, 2, 6, 7, 5, 9].into(),
    ))));
    let s = streaming(WardenConfig::default(), hub, Arc::new(MemoryJournal::new()));
    let app = service!(streaming_state(&s));
    let mut sse = Sse::new(test::call_service(&app, events_request(Some(READ)).to_request()).await);
    let agent = AgentKey::new("x");
    for _ in 0..7 {
        journal.append(&agent, EventKind::ErrorsReset);
    }
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(sse.next().await.id.unwrap());
    }
    assert_eq!(ids, [1, 2, 3, 4, 5, 6, 7]);
    // 8 never comes: 9 is held for the reorder wait, then sent.
    let started = tokio::time::Instant::now();
    journal.append(&agent, EventKind::ErrorsReset);
    assert_eq!(sse.next().await.id, Some(9));
    assert!(started.elapsed() >= warden::server::events::DEFAULT_REORDER_WAIT);
}

/// Lets the runtime run until it is idle (the paused clock then jumps): `call` must still be waiting.
async fn still_waiting<F: std::future::Future<Output = ServiceResponse<B>> + Unpin, B>(
    what: &str,
    call: &mut F,
) {
    tokio::select! {
        biased;
        resp = call => panic!("{what}: answered {} too early", resp.status()),
        () = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
    }
}

/// `warden serve` journals through the event-stream tee: the tee must hand the `202`'s wait and the
/// take's one-transaction batch to the journal under it, whether or not someone listens. (It once
/// resolved `durable` at once and split the batch: a SIGKILL after the `202` lost the event.)
#[actix_rt::test]
async fn an_event_is_acknowledged_only_once_durable_under_the_event_stream_tee() {
    tokio::time::pause();
    let hub = EventHub::default();
    let gated = Arc::new(Gated::new());
    let s = streaming(WardenConfig::default(), hub.clone(), gated.clone());
    let a = s.team.assistant("a", chatty());
    let app = service!(streaming_state(&s));
    let send = |content: &str| {
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({ "content": content })),
        )
        .to_request()
    };

    // Nobody listens: the tee's short path.
    let mut call = Box::pin(test::call_service(&app, send("first")));
    still_waiting("nothing durable yet", &mut call).await;
    let queued = gated.last_queued();
    gated.durable_up_to.send_replace(queued - 1);
    still_waiting("durable up to just before the event", &mut call).await;
    gated.durable_up_to.send_replace(queued);
    let (status, body) = json_of(within("the 202", 1_000, call).await).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    until("first turn", || a.status().turns == 1).await;
    assert_eq!(gated.takes_in_one_call(), 1);

    // Someone listens: the publishing path.
    let mut feed = hub.subscribe();
    let from = gated.inner.len() as u64 + 1;
    let mut call = Box::pin(test::call_service(&app, send("second")));
    still_waiting("second event not durable yet", &mut call).await;
    gated.durable_up_to.send_replace(gated.last_queued());
    let (status, _) = json_of(within("the second 202", 1_000, call).await).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until("second turn", || a.status().turns == 2).await;
    assert_eq!(gated.takes_in_one_call(), 2);
    // The feed carried every event once, with the journal's own sequence numbers.
    let mut published = Vec::new();
    while let Ok(Ok(item)) =
        tokio::time::timeout(std::time::Duration::from_secs(1), feed.recv()).await
    {
        if let warden::server::events::FeedItem::Journal(e) = &*item {
            published.push((e.seq, e.kind.clone()));
        }
    }
    let journaled: Vec<_> = gated
        .inner
        .events()
        .into_iter()
        .filter(|e| e.seq >= from)
        .map(|e| (e.seq, e.kind))
        .collect();
    assert!(journaled
        .iter()
        .any(|(_, k)| matches!(k, EventKind::EventTaken { .. })));
    assert_eq!(published, journaled);
}

/// When the journal cannot write an event's acceptance the answer is not a `202`: a `500` that
/// says so and gives the id (the event is queued and runs; sending it again would run it twice).
#[actix_rt::test]
async fn a_failing_disk_degrades_the_server_fail_closed_and_it_recovers_whole() {
    // Real time: the journal's writer thread retries on the wall clock.
    let db = TempDb::new("api-not-durable");
    let sqlite = Arc::new(SqliteJournal::open(&db.0).unwrap());
    let s = streaming(WardenConfig::default(), EventHub::default(), sqlite.clone());
    let a = s.team.assistant("a", chatty());
    let b = s.team.assistant("b", chatty());
    let app = service!(streaming_state(&s).with_journal(sqlite.clone()));
    let (status, body) = call!(app, get("/healthz", None));
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("ok")));
    // An event for `a` waits behind a pause, durable, before the disk fails.
    let (status, _) = call!(app, post("/api/agents/a/pause", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": "held"}))
        ),
    );
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    poison_writes(&db.0);

    // The event that cannot be written: 500 with its id (it is queued; it will land later).
    let (status, body) = call!(
        app,
        post(
            "/api/agents/b/events",
            Some(ADMIN),
            Some(json!({"content": "poison pill"}))
        ),
    );
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let id = body["id"].as_u64().expect("the id");
    assert_eq!(
        body["error"],
        format!(
            "event {id} was queued but is not durable: journal write failed: injected write failure"
        )
    );
    let doc: Value = serde_json::from_str(api::OPENAPI).unwrap();
    let documented = &doc["paths"]["/api/agents/{key}/events"]["post"]["responses"]["500"];
    conforms(
        &doc,
        &documented["content"]["application/json"]["schema"],
        &body,
        "500",
    )
    .unwrap();

    // Degraded: health says so, new events are refused, a halt is applied but answered 503.
    let (status, body) = call!(app, get("/healthz", None));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert!(body["journal"]
        .as_str()
        .unwrap()
        .contains("injected write failure"));
    let (status, body) = call!(
        app,
        post(
            "/api/agents/b/events",
            Some(ADMIN),
            Some(json!({"content": "fine"}))
        ),
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["refusal"]["reason"], "journal_unavailable", "{body}");
    let (status, body) = call!(app, post("/api/agents/b/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("halt applied but not durable: journal write failed"),
        "{body}"
    );
    assert_eq!(
        body["halted"][0]["state"],
        json!(AgentState::Stopped),
        "{body}"
    );
    assert_eq!(
        b.state(),
        AgentState::Stopped,
        "applied at once all the same"
    );
    // A resume is applied but not durable; and no turn starts while the journal cannot write:
    // a's event waits.
    let (status, body) = call!(app, post("/api/agents/a/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("applied but not durable"),
        "{body}"
    );
    assert!(!a.status().paused);
    std::thread::sleep(std::time::Duration::from_millis(600));
    settle(100).await;
    assert_eq!(a.status().turns, 0, "a turn started on a degraded journal");
    assert_eq!(a.status().queued.ordinary, 1);

    // The disk comes back: the journal is whole again, the server healthy, the event runs.
    unpoison_writes(&db.0);
    until("healthy again", || sqlite.degraded().is_none()).await;
    let (status, _) = call!(app, get("/healthz", None));
    assert_eq!(status, StatusCode::OK);
    until("the held event ran", || a.status().turns == 1).await;
    assert!(a
        .record()
        .history
        .iter()
        .any(|m| m.content.as_deref().is_some_and(|c| c.contains("held"))));
    let (status, body) = call!(
        app,
        post(
            "/api/agents/a/events",
            Some(ADMIN),
            Some(json!({"content": "fine"}))
        ),
    );
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    until("the second event ran", || a.status().turns == 2).await;
    sqlite.flush();
    let on_disk = sqlite.events().unwrap();
    for agent in [&a, &b] {
        let replayed = AgentRecord::replay(agent.key().clone(), &on_disk);
        assert_eq!(
            replayed,
            agent.record(),
            "{}: the file equals the live record",
            agent.key()
        );
    }
    assert!(sqlite.stats().failed_batches >= 1);
}

#[actix_rt::test]
async fn resuming_with_last_event_id_replays_the_durable_journal_without_duplicates() {
    tokio::time::pause();
    let sqlite = Arc::new(SqliteJournal::open(":memory:").unwrap());
    let hub = EventHub::default().with_log(sqlite.clone());
    let s = streaming(WardenConfig::default(), hub, sqlite.clone());
    let a = s.team.assistant("a", chatty());
    a.try_send_event(UserEvent::new("one")).unwrap();
    until("answered", || a.status().turns == 1).await;
    let past = sqlite.events().unwrap();
    assert!(past.len() > 4);
    let app = service!(streaming_state(&s));
    let resume = past[2].seq;
    let mut sse = Sse::new(
        test::call_service(
            &app,
            events_request(Some(READ))
                .insert_header(("Last-Event-ID", resume.to_string()))
                .to_request(),
        )
        .await,
    );
    let mut replayed = Vec::new();
    for _ in 3..past.len() {
        let msg = sse.next().await;
        replayed.push(serde_json::from_value::<Event>(msg.data).unwrap());
    }
    assert_eq!(replayed, past[3..]);
    // Then live, continuing the sequence.
    a.try_send_event(UserEvent::new("two")).unwrap();
    let (_, before) = sse
        .until("second turn", |m| m.event == "turn_finished")
        .await;
    let mut ids: Vec<u64> = before.iter().filter_map(|m| m.id).collect();
    ids.push(ids.last().unwrap() + 1);
    let expected: Vec<u64> = (past.last().unwrap().seq + 1..).take(ids.len()).collect();
    assert_eq!(ids, expected);
}

// ---- metrics ------------------------------------------------------------------------------------

/// One sample line: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Every sample; checks HELP and TYPE precede each family once.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut helps = BTreeSet::new();
    let mut types = std::collections::BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(helps.insert(name.to_owned()), "HELP twice: {name}");
            assert!(rest.len() > name.len() + 1, "empty HELP: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(helps.contains(name), "TYPE before HELP: {name}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(
                types.insert(name.to_owned(), kind.to_owned()).is_none(),
                "TYPE twice: {name}"
            );
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "stray line: {line:?}"
        );
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("labels of {line}"));
                let labels = inner
                    .split(',')
                    .map(|pair| {
                        let (k, v) = pair.split_once('=').unwrap();
                        let v = v
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap();
                        (k.to_owned(), v.to_owned())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(name.starts_with("warden_"), "{name}");
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{name}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("no TYPE for {name}"));
        if kind == "counter" {
            assert!(family.ends_with("_total"), "{family}");
        }
        samples.push((name.to_owned(), labels, value));
    }
    samples
}

fn value_of(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
        .2
}

#[actix_rt::test]
async fn metrics_are_prometheus_text_that_matches_the_fleet() {
    tokio::time::pause();
    let sqlite = Arc::new(SqliteJournal::open(":memory:").unwrap());
    let bus = Arc::new(ChannelInterventionBus::new());
    let team = Supervisor::builder(WardenConfig::default(), sqlite.clone())
        .intervention_bus(bus.clone())
        .current_arbiter()
        .build();
    let a = team.assistant("a", chatty());
    let b = team.assistant("b", failing());
    let c = team.assistant("c", chatty());
    a.try_send_event(UserEvent::new("hi")).unwrap();
    until("a answered", || a.status().turns == 1).await;
    lock_out(&b).await;
    let app = service!(ApiState::new(team.clone(), config())
        .with_bus(bus)
        .with_events(EventHub::default())
        .with_journal(sqlite.clone()));
    let (status, _) = call!(app, post("/api/agents/c/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(c.state(), AgentState::Stopped);
    // A provider's shared limits: a 429 seen and a pause of 2 s.
    let limiter = warden::ProviderLimiter::new(
        "metrics-test",
        warden::ProviderLimits {
            max_concurrency: 4,
            ..Default::default()
        },
    );
    limiter.note_throttled();
    limiter.pause(std::time::Duration::from_secs(2), "retry-after");

    let resp = test::call_service(&app, get("/metrics", None).to_request()).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = test::call_service(&app, get("/metrics", Some(READ)).to_request()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers().get("content-type").unwrap(),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    let samples = parse_exposition(&text);
    for (family, value) in [
        ("warden_provider_calls_in_flight", 0.0),
        ("warden_provider_calls_waiting", 0.0),
        ("warden_provider_throttled_total", 1.0),
        ("warden_provider_pauses_total", 1.0),
        ("warden_provider_paused_seconds_total", 2.0),
    ] {
        assert_eq!(
            value_of(&samples, family, &[("provider", "metrics-test")]),
            value,
            "{family}"
        );
    }
    drop(limiter);

    for state in AgentState::ALL {
        let expected = team.statuses().iter().filter(|s| s.state == state).count();
        assert_eq!(
            value_of(&samples, "warden_agents", &[("state", state.as_str())]),
            expected as f64,
            "{state}"
        );
    }
    assert_eq!(
        value_of(&samples, "warden_agents", &[("state", "WAITING_FOR_EVENT")]),
        1.0
    );
    assert_eq!(
        value_of(&samples, "warden_agents_emergency_stopped", &[]),
        1.0
    );
    for breaker in warden::server::metrics::BREAKERS {
        let name = warden::server::metrics::breaker_name(breaker);
        let expected = if name == "consecutive_errors" {
            1.0
        } else {
            0.0
        };
        assert_eq!(
            value_of(&samples, "warden_safety_trips_total", &[("breaker", &name)]),
            expected,
            "{name}"
        );
    }
    let fleet = team.fleet_view();
    assert_eq!(
        value_of(&samples, "warden_tokens_used_total", &[]),
        fleet.tokens as f64
    );
    assert_eq!(
        value_of(&samples, "warden_cost_used_total", &[]),
        fleet.cost
    );
    assert_eq!(value_of(&samples, "warden_halts_total", &[]), 1.0);
    assert_eq!(
        value_of(&samples, "warden_turns_total", &[]),
        6.0,
        "a: 1, b: 5"
    );
    assert_eq!(value_of(&samples, "warden_restarts_total", &[]), 0.0);
    // No agent of this team ticks: the tick families are there, at 0, every mode listed.
    assert_eq!(value_of(&samples, "warden_npc_ticks_total", &[]), 0.0);
    assert_eq!(
        value_of(&samples, "warden_npc_ticks_skipped_total", &[]),
        0.0
    );
    for mode in ["awake", "asleep", "idle"] {
        assert_eq!(value_of(&samples, "warden_npcs", &[("mode", mode)]), 0.0);
    }
    assert_eq!(
        value_of(&samples, "warden_halt_discarded_messages_total", &[]),
        0.0
    );
    assert_eq!(value_of(&samples, "warden_interventions_pending", &[]), 0.0);
    assert_eq!(
        value_of(&samples, "warden_event_stream_subscribers", &[]),
        0.0
    );
    let stats = sqlite.stats();
    assert!(value_of(&samples, "warden_journal_committed_seq", &[]) > 0.0);
    assert!(value_of(&samples, "warden_journal_committed_seq", &[]) <= stats.committed_seq as f64);
    assert!(value_of(&samples, "warden_journal_batches_total", &[]) >= 1.0);
    assert_eq!(value_of(&samples, "warden_journal_write_error", &[]), 0.0);
    assert_eq!(
        value_of(&samples, "warden_journal_failed_batches_total", &[]),
        0.0
    );
    // One halt through the API, timed; none of all.
    let h = "warden_api_halt_duration_seconds";
    assert_eq!(
        value_of(&samples, &format!("{h}_count"), &[("scope", "agent")]),
        1.0
    );
    assert_eq!(
        value_of(
            &samples,
            &format!("{h}_bucket"),
            &[("scope", "agent"), ("le", "+Inf")]
        ),
        1.0
    );
    assert_eq!(
        value_of(&samples, &format!("{h}_count"), &[("scope", "all")]),
        0.0
    );
    let buckets: Vec<f64> = samples
        .iter()
        .filter(|(n, l, _)| n == &format!("{h}_bucket") && l[0].1 == "agent")
        .map(|s| s.2)
        .collect();
    assert_eq!(
        buckets.len(),
        warden::server::metrics::HALT_BUCKETS.len() + 1
    );
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "cumulative: {buckets:?}"
    );
}

// ---- the OpenAPI document -------------------------------------------------------------------------

/// Follows `$ref`s within `doc`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => resolve(
            doc,
            doc.pointer(r.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("bad $ref {r}")),
        ),
        None => schema,
    }
}

/// Checks `value` against the subset of JSON Schema the document uses: type, required, properties,
/// items, enum, const, oneOf.
fn conforms(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(doc, schema);
    if let Some(options) = schema["oneOf"].as_array() {
        return if options.iter().any(|o| conforms(doc, o, value, at).is_ok()) {
            Ok(())
        } else {
            Err(format!("{at}: {value} matches no oneOf option"))
        };
    }
    if let Some(expected) = schema.get("const") {
        if expected != value {
            return Err(format!("{at}: {value} is not {expected}"));
        }
    }
    if let Some(options) = schema["enum"].as_array() {
        if !options.contains(value) {
            return Err(format!("{at}: {value} not in {options:?}"));
        }
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let type_ok = types.is_empty()
        || types.iter().any(|t| match *t {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_u64() || value.is_i64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "null" => value.is_null(),
            _ => false,
        });
    if !type_ok {
        return Err(format!("{at}: {value} is not {types:?}"));
    }
    if let Some(object) = value.as_object() {
        for field in schema["required"].as_array().into_iter().flatten() {
            let field = field.as_str().unwrap();
            if !object.contains_key(field) {
                return Err(format!("{at}: missing required field {field}"));
            }
        }
        if let Some(properties) = schema["properties"].as_object() {
            for (name, sub) in properties {
                if let Some(v) = object.get(name) {
                    conforms(doc, sub, v, &format!("{at}.{name}"))?;
                }
            }
        }
    }
    if let (Some(items), Some(values)) = (schema.get("items"), value.as_array()) {
        for (i, v) in values.iter().enumerate() {
            conforms(doc, items, v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
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

#[actix_rt::test]
async fn the_openapi_document_matches_the_served_routes_and_responses() {
    tokio::time::pause();
    let s = streaming(
        ask_config(),
        EventHub::default(),
        Arc::new(MemoryJournal::new()),
    );
    let asker = looking(&s.team, "asker");
    s.team.assistant("b", chatty());
    let locked = s.team.assistant("locked", failing());
    lock_out(&locked).await;
    asker.try_send_event(UserEvent::new("scout")).unwrap();
    until("ask", || !s.bus.pending().is_empty()).await;
    let ask_id = s.bus.pending()[0].id;
    let app = service!(streaming_state(&s));

    let (status, doc) = call!(app, get("/api/openapi.json", Some(READ)));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc, serde_json::from_str::<Value>(api::OPENAPI).unwrap());

    // The documented (method, path) pairs are exactly the served ones.
    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, served);
    let paths: BTreeSet<&str> = api::ROUTES.iter().map(|r| r.1).collect();
    assert_eq!(paths.len(), api::ROUTES.len(), "one method per path");

    let concrete = |path: &str, found: bool| {
        path.replace("{key}", if found { "b" } else { "nobody" })
            .replace(
                "{id}",
                &if found {
                    ask_id.to_string()
                } else {
                    "999999".into()
                },
            )
    };
    let body_for = |path: &str| match path {
        "/api/agents/{key}/events" => Some(json!({"content": "hello"})),
        "/api/interventions/{id}" => Some(json!({"answer": "no", "note": "from the test"})),
        "/api/agents/{key}/goals" => Some(json!({"goals": ["keep the inn tidy"]})),
        "/api/agents/{key}/world" => Some(json!({
            "speaker": {"id": "p1", "kind": "player"}, "kind": "whisper", "text": "psst"
        })),
        "/api/world/presence" => Some(json!({"rooms": {"tavern": 0, "forge": 2}})),
        "/api/world/clock" => Some(json!({"hour": 6.5})),
        "/api/world/batch" => Some(json!({"events": [{
            "npc": "b", "speaker": {"id": "p1", "kind": "player"}, "kind": "say", "text": "hi"
        }]})),
        _ => None,
    };
    // What no route answers is `{"error": "no route …"}` (404) or 405.
    let routed = |status: StatusCode, body: &[u8]| {
        status != StatusCode::METHOD_NOT_ALLOWED
            && !(status == StatusCode::NOT_FOUND
                && serde_json::from_slice::<Value>(body).map_or(true, |v| {
                    v["error"]
                        .as_str()
                        .is_some_and(|e| e.starts_with("no route"))
                }))
    };
    let mut checked = BTreeSet::new();
    // Halts last (they stop agents and withdraw the pending ask).
    let mut routes = api::ROUTES.to_vec();
    routes.sort_by_key(|(_, p)| (*p == "/api/halt", p.ends_with("/halt")));
    for (method, path) in routes {
        let op = &doc["paths"][path][method.to_lowercase()];
        let secured = op.get("security").is_none_or(|s| s != &json!([]));
        // Without a token: 401 where a token is needed, and documented.
        let resp = test::call_service(
            &app,
            request(method, &concrete(path, true), None, body_for(path)).to_request(),
        )
        .await;
        let expected = if secured {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::OK
        };
        assert_eq!(resp.status(), expected, "{method} {path} without a token");
        // With the read token, mutating calls are 403.
        if method == "POST" {
            let (status, _) = call!(
                app,
                request(method, &concrete(path, true), Some(READ), body_for(path))
            );
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{method} {path} with the read token"
            );
        }
        let variants = if path.contains('{') {
            vec![false, true]
        } else {
            vec![true]
        };
        for found in variants {
            let uri = concrete(path, found);
            let resp = test::call_service(
                &app,
                request(method, &uri, Some(ADMIN), body_for(path)).to_request(),
            )
            .await;
            let status = resp.status();
            let streaming = resp
                .headers()
                .get("content-type")
                .is_some_and(|v| v == "text/event-stream");
            let bytes = if streaming {
                Default::default()
            } else {
                test::read_body(resp).await
            };
            assert!(
                routed(status, &bytes),
                "{method} {uri} is not routed: {status}"
            );
            let documented = &op["responses"][status.as_str()];
            assert!(
                documented.is_object(),
                "{method} {path}: {status} is not documented"
            );
            let json_schema = documented["content"]["application/json"]["schema"].clone();
            if !json_schema.is_null() && !streaming {
                let value: Value = serde_json::from_slice(&bytes).unwrap();
                if let Err(err) = conforms(&doc, &json_schema, &value, "body") {
                    panic!("{method} {uri} {status}: {err}\n{value}");
                }
                checked.insert(format!("{method} {path} {}", status.as_u16()));
            }
        }
        // Undocumented methods on a documented path are not served: 405, `Allow`, a JSON error.
        for other in METHODS.iter().filter(|m| **m != method) {
            let uri = concrete(path, true);
            let resp =
                test::call_service(&app, request(other, &uri, Some(ADMIN), None).to_request())
                    .await;
            assert_eq!(
                resp.status(),
                StatusCode::METHOD_NOT_ALLOWED,
                "{other} {path}"
            );
            assert_eq!(
                resp.headers().get("allow").and_then(|v| v.to_str().ok()),
                Some(method),
                "{other} {path}"
            );
            let (_, body) = json_of(resp).await;
            assert_eq!(
                body,
                json!({"error": format!("{other} {uri} is not served; allowed: {method}")})
            );
        }
    }
    // Unknown paths: 404 with a JSON error, whatever the method, with or without a token.
    for path in [
        "/api",
        "/api/nope",
        "/api/agents/b/nope",
        "/api/agents/b/halt/now",
        "/metrics/x",
        "/api/agents/",
    ] {
        for (method, token) in [("GET", Some(ADMIN)), ("POST", None), ("DELETE", Some(READ))] {
            let (status, body) = call!(app, request(method, path, token, None));
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
            assert_eq!(
                body,
                json!({"error": format!("no route {path} (GET /api/openapi.json lists the routes)")}),
                "{method} {path}"
            );
        }
    }
    // The main bodies were checked against their schemas, success and error alike.
    for expected in [
        "GET /api/agents 200",
        "GET /api/agents/{key} 200",
        "GET /api/agents/{key} 404",
        "POST /api/agents/{key}/events 202",
        "POST /api/agents/{key}/halt 200",
        "POST /api/halt 200",
        "GET /api/interventions 200",
        "POST /api/interventions/{id} 200",
        "POST /api/interventions/{id} 404",
        "POST /api/agents/{key}/unlock 409",
        "POST /api/world/presence 200",
        "POST /api/world/clock 200",
        "POST /api/world/batch 200",
        "GET /api/replies 503",
        "GET /healthz 200",
    ] {
        assert!(
            checked.contains(expected),
            "{expected} not checked; checked: {checked:?}"
        );
    }
    // 401, 403, 409 with a refusal, 413 bodies conform too.
    let error_schema = json!({"$ref": "#/components/schemas/Error"});
    let (_, body) = call!(app, get("/api/agents", None));
    conforms(&doc, &error_schema, &body, "401").unwrap();
    let (_, body) = call!(app, post("/api/halt", Some(READ), None));
    conforms(&doc, &error_schema, &body, "403").unwrap();
    let (status, body) = call!(
        app,
        post(
            "/api/agents/locked/events",
            Some(ADMIN),
            Some(json!({"content": "x"}))
        )
    );
    assert_eq!(status, StatusCode::CONFLICT);
    conforms(
        &doc,
        &json!({"$ref": "#/components/schemas/Refusal"}),
        &body,
        "409",
    )
    .unwrap();
    let (status, body) = call!(
        app,
        post(
            "/api/agents/b/events",
            Some(ADMIN),
            Some(json!({"content": "x".repeat(4096)}))
        )
    );
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    conforms(&doc, &error_schema, &body, "413").unwrap();
}

#[actix_rt::test]
async fn a_gap_that_does_not_fill_is_read_from_the_log() {
    tokio::time::pause();
    let inner = Arc::new(MemoryJournal::new());
    let hub = EventHub::default().with_log(inner.clone());
    let journal = hub.journal(inner.clone());
    let s = streaming(WardenConfig::default(), hub, Arc::new(MemoryJournal::new()));
    let app = service!(streaming_state(&s));
    let mut sse = Sse::new(test::call_service(&app, events_request(Some(READ)).to_request()).await);
    let agent = AgentKey::new("x");
    journal.append(&agent, EventKind::ErrorsReset);
    // Journaled but never published (as when appended just before the subscription took effect).
    inner.append(
        &agent,
        EventKind::HistoryReset {
            operator: "op".into(),
        },
    );
    journal.append(&agent, EventKind::ErrorsReset);
    let got: Vec<(Option<u64>, String)> = [sse.next().await, sse.next().await, sse.next().await]
        .into_iter()
        .map(|m| (m.id, m.event))
        .collect();
    assert_eq!(
        got,
        [
            (Some(1), "errors_reset".to_owned()),
            (Some(2), "history_reset".to_owned()),
            (Some(3), "errors_reset".to_owned())
        ]
    );
}

/// `GET /api/events/recent`: the last events oldest first with the head read with them; `limit`
/// and `agent` are checked; a server keeping no journal says so with 503.
#[actix_rt::test]
async fn recent_events_list_the_tail_and_the_head_and_refuse_bad_queries() {
    let f = fixture(WardenConfig::default());
    f.team.assistant("a", chatty());
    f.team.assistant("b", chatty());
    let hub = EventHub::default().with_log(f.journal.clone());
    let app = test::init_service(App::new().configure(api::configure(
        ApiState::new(f.team.clone(), config()).with_events(hub),
    )))
    .await;
    let all = f.journal.events();
    let (status, body) = call!(app, get("/api/events/recent?limit=1", Some(READ)));
    assert_eq!(status, StatusCode::OK, "{body}");
    let last = all.last().unwrap();
    assert_eq!(body["head"], last.seq);
    assert_eq!(body["events"][0]["seq"], last.seq);
    assert_eq!(body["events"].as_array().unwrap().len(), 1);
    let (_, body) = call!(
        app,
        get("/api/events/recent?agent=a&limit=1000", Some(READ))
    );
    let of_a: Vec<Event> = serde_json::from_value(body["events"].clone()).unwrap();
    assert_eq!(of_a, f.journal.events_of("a"));
    assert_eq!(
        body["head"], last.seq,
        "the head is the journal's, not the agent's"
    );
    let (_, body) = call!(app, get("/api/events/recent?limit=0", Some(READ)));
    assert_eq!(body, json!({ "events": [], "head": last.seq }));

    for (query, status, error) in [
        (
            "limit=1001",
            400,
            "limit must be between 0 and 1000, not 1001",
        ),
        ("agent=nobody", 404, "unknown agent nobody"),
    ] {
        let (got, body) = call!(app, get(&format!("/api/events/recent?{query}"), Some(READ)));
        assert_eq!(
            (got.as_u16(), body["error"].as_str()),
            (status, Some(error))
        );
    }
    let (status, _) = call!(app, get("/api/events/recent?limit=-1", Some(READ)));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call!(app, get("/api/events/recent", None));
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let plain = app!(f);
    let (status, body) = call!(plain, get("/api/events/recent", Some(READ)));
    assert_eq!(
        (status, body["error"].as_str()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("this server keeps no journal to read events from")
        )
    );
}

/// A blocking HTTP/1.1 server on 127.0.0.1 (a std thread) that answers each connection with the
/// next of `responses` (status, body), `Connection: close`.
fn plain_http_server(responses: Vec<(u16, &'static str)>) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for (status, body) in responses {
            let Ok((mut socket, _)) = listener.accept() else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break pos + 4;
                }
                match socket.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < head_end + length {
                match socket.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = write!(
                socket,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// Collects what a tracing subscriber writes.
#[derive(Clone, Default)]
struct LogBuffer(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[actix_rt::test]
async fn provider_retries_are_logged_at_warn_and_counted_on_metrics() {
    let addr = plain_http_server(vec![
        (429, r#"{"error":{"message":"slow down"}}"#),
        (503, "busy"),
        (
            200,
            r#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#,
        ),
    ]);
    let provider = OpenAiCompatible::new(OpenAiConfig {
        retry: RetryPolicy {
            max_attempts: 3,
            base: std::time::Duration::from_millis(10),
            jitter: false,
            ..RetryPolicy::default()
        },
        ..OpenAiConfig::new(format!("http://{addr}/v1"), "m")
    })
    .unwrap();
    let count = |class: &str| {
        warden_actors::retry_counts()
            .iter()
            .find(|(c, _)| *c == class)
            .map_or(0, |(_, n)| *n)
    };
    // Only this test of this binary calls an OpenAI-compatible provider: the counts are exact.
    let (before_429, before_5xx) = (count("429"), count("5xx"));

    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let response = {
        let _guard = tracing::subscriber::set_default(subscriber);
        provider
            .complete(LlmRequest {
                agent: AgentKey::new("a"),
                messages: vec![ChatMessage::user("hello")],
                tools: Vec::new(),
            })
            .await
            .unwrap()
    };
    assert_eq!(response.message.content.as_deref(), Some("hi"));
    let logs = String::from_utf8(logs.0.lock().clone()).unwrap();
    let retries: Vec<&str> = logs.lines().filter(|l| l.contains("retrying")).collect();
    assert_eq!(retries.len(), 2, "{logs}");
    assert!(retries[0].contains(" WARN "), "{logs}");
    assert!(retries[0].contains("attempt=1"), "{logs}");
    assert!(retries[0].contains("class=\"429\""), "{logs}");
    assert!(retries[0].contains("delay_ms=10"), "{logs}");
    assert!(retries[0].contains("http status 429"), "{logs}");
    assert!(retries[1].contains("attempt=2"), "{logs}");
    assert!(retries[1].contains("class=\"5xx\""), "{logs}");
    assert!(retries[1].contains("delay_ms=20"), "{logs}");
    assert_eq!(
        (count("429"), count("5xx")),
        (before_429 + 1, before_5xx + 1)
    );

    let f = fixture(WardenConfig::default());
    let app = service!(ApiState::new(f.team.clone(), config()));
    let resp = test::call_service(&app, get("/metrics", Some(READ)).to_request()).await;
    let text = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    assert!(
        text.contains("# TYPE warden_provider_retries_total counter"),
        "{text}"
    );
    let samples = parse_exposition(&text);
    for class in warden_actors::RETRY_CLASSES {
        assert_eq!(
            value_of(
                &samples,
                "warden_provider_retries_total",
                &[("class", class)]
            ),
            count(class) as f64,
            "{class}"
        );
    }
    assert!(
        value_of(
            &samples,
            "warden_provider_retries_total",
            &[("class", "429")]
        ) >= 1.0
    );
}

#[actix_rt::test]
async fn the_host_reports_presence_and_sets_the_game_hour_over_http() {
    tokio::time::pause();
    let (team, _journal) = team(WardenConfig::default());
    let mut npc = warden::protocols::npc::NpcConfig::default();
    npc.tick.enabled = true;
    npc.tick.room = Some("forge".into());
    npc.sleep.enabled = true;
    team.spawn(warden::AgentSpec::assistant("smith", chatty()).with_npc(npc))
        .unwrap();
    let app = service!(ApiState::new(team.clone(), config()));
    let mode = |body: &Value| body["npc"]["tick"]["mode"].as_str().map(str::to_owned);

    let (status, body) = call!(
        app,
        post(
            "/api/world/presence",
            Some(ADMIN),
            Some(json!({"rooms": {"forge": 0}}))
        )
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["rooms"], 1);
    let (_, agent) = call!(app, get("/api/agents/smith", Some(READ)));
    assert_eq!(mode(&agent).as_deref(), Some("idle"), "{agent}");

    let (status, body) = call!(
        app,
        post("/api/world/clock", Some(ADMIN), Some(json!({"hour": 3})))
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        (body["game_hour"].as_f64().unwrap() - 3.0).abs() < 1e-6,
        "{body}"
    );
    let (_, agent) = call!(app, get("/api/agents/smith", Some(READ)));
    assert_eq!(mode(&agent).as_deref(), Some("asleep"), "{agent}");

    let (status, body) = call!(
        app,
        post("/api/world/clock", Some(ADMIN), Some(json!({"hour": 24})))
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"],
        "hour 24 is not a game hour from 0 to 24 (24 excluded)"
    );
    let (status, _) = call!(
        app,
        post(
            "/api/world/presence",
            Some(ADMIN),
            Some(json!({"rooms": {"forge": -1}}))
        )
    );
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[actix_rt::test]
async fn a_lift_resumes_what_the_fleet_halt_stopped_and_nothing_else() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let a = f.team.assistant("a", chatty());
    let alone = f.team.assistant("alone", chatty());
    let paused = f.team.assistant("paused", chatty());
    let locked = f.team.assistant("locked", failing());
    lock_out(&locked).await;
    let app = app!(f);

    let (status, body) = call!(app, post("/api/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::CONFLICT, "nothing to lift yet: {body}");
    let (status, _) = call!(app, post("/api/resume", Some(READ), None));
    assert_eq!(status, StatusCode::FORBIDDEN);
    // `alone` halted by itself before the fleet halt; `paused` paused by an operator.
    let (status, _) = call!(app, post("/api/agents/alone/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call!(app, post("/api/agents/paused/pause", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call!(app, post("/api/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(a.state(), AgentState::Stopped);

    let (status, body) = call!(
        app,
        post(
            "/api/resume",
            Some(ADMIN),
            Some(json!({"reason": "all clear"}))
        )
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["resumed"], json!([{"agent": "a"}]), "{body}");
    assert_eq!(body["kept"][0]["agent"], "paused", "{body}");
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    assert_eq!(alone.state(), AgentState::Stopped, "halted by itself: kept");
    assert_eq!(paused.state(), AgentState::Stopped, "paused: kept");
    assert!(paused.status().paused);
    assert_eq!(locked.state(), AgentState::SafetyLockout, "only an unlock");
    assert!(f.journal.events_of("a").iter().any(|e| matches!(
        &e.kind,
        EventKind::StateChanged { cause, .. }
            if cause == "resumed by api:admin (lift of the fleet halt: all clear)"
    )));
    // Lifted: nothing stands any more.
    let (status, _) = call!(app, post("/api/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, body) = call!(
        app,
        request("POST", "/api/resume", Some(ADMIN), None).set_payload("{")
    );
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[actix_rt::test]
async fn an_agent_spawned_locked_out_or_halted_is_so_before_it_reads_anything_and_replays_so() {
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let lockout = protocols::Lockout {
        breaker: protocols::Breaker::ConsecutiveErrors,
        reason: "model down 1 time".into(),
    };
    let locked = f
        .team
        .spawn(
            AgentSpec::assistant("locked", chatty())
                .starting_locked_out(lockout)
                .starting_halted(),
        )
        .unwrap();
    let halted = f
        .team
        .spawn(AgentSpec::assistant("halted", chatty()).starting_halted())
        .unwrap();
    // Locked out at once, with the reason; the halted one reads its halt before any work: an event
    // sent right after the spawn is discarded by it, never answered.
    assert_eq!(locked.state(), AgentState::SafetyLockout);
    assert!(locked.status().emergency_stop);
    let _ = halted.try_send_event(UserEvent::new("hi"));
    until("halted stops", || halted.state() == AgentState::Stopped).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!((halted.status().turns, halted.status().history_len), (0, 0));
    replay_matches(&f.journal, &locked);
    replay_matches(&f.journal, &halted);
    // Both were noted with the fleet halt: a lift resumes the halted one, not the locked-out one.
    let app = app!(f);
    let (status, body) = call!(app, post("/api/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["resumed"], json!([{"agent": "halted"}]), "{body}");
    assert_eq!(halted.state(), AgentState::WaitingForEvent);
    assert_eq!(locked.state(), AgentState::SafetyLockout);
}

/// The API's routes are registered in one place, the route table (`api::ROUTES`, which
/// `api::configure` registers and nothing else): no module registers an API path of its own. Before
/// the route table was the only registration, `src/cluster/http.rs` registered eleven `/api` routes
/// ahead of the table's, silently shadowing ten of them on a cluster node (`POST /api/halt`,
/// `…/unlock`, …) and serving `GET /api/cluster`, which `openapi.json` did not list.
#[actix_rt::test]
async fn every_api_route_is_registered_once_by_the_route_table_and_documented() {
    // The table: one handler per (method, path), and one method per path.
    let mut seen = BTreeSet::new();
    for (method, path) in api::ROUTES {
        assert!(
            seen.insert((method, path)),
            "{method} {path} is listed twice in ROUTES"
        );
    }
    let paths: BTreeSet<&str> = api::ROUTES.iter().map(|r| r.1).collect();
    assert_eq!(paths.len(), api::ROUTES.len(), "one method per path");
    // Documented: exactly the table.
    let doc: Value = serde_json::from_str(api::OPENAPI).unwrap();
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            let path = path.clone();
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, served, "openapi.json and ROUTES differ");
    // No other registration of an API path anywhere in the crate's source: `.route("/api…")`,
    // `web::resource("/api…")` or `web::scope("/api…")` outside the table (whose entries are
    // `METHOD "/path" => handler`, not `.route(` calls).
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src];
    let mut elsewhere = Vec::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for call in [".route(", "resource(", "scope("] {
            for (at, _) in text.match_indices(call) {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                if text[line_start..at].contains("//") {
                    continue; // a comment
                }
                // The first argument, on this line or the next (rustfmt breaks long calls).
                let arg = text[at + call.len()..].trim_start();
                let api_path = ["\"/api", "\"/metrics", "\"/healthz"]
                    .iter()
                    .any(|p| arg.starts_with(p));
                if api_path {
                    let line = text[..at].matches('\n').count() + 1;
                    let shown = arg.lines().next().unwrap_or_default();
                    elsewhere.push(format!("{}:{line}: {call}{shown}", path.display()));
                }
            }
        }
    }
    assert!(
        elsewhere.is_empty(),
        "API paths registered outside the route table (they would shadow or bypass it):\n{}",
        elsewhere.join("\n")
    );
}

/// A cluster as the server sees it, recording what it is asked.
#[derive(Debug, Default)]
struct FakeCluster {
    asked: parking_lot::Mutex<Vec<String>>,
}

impl FakeCluster {
    fn asked(&self) -> Vec<String> {
        std::mem::take(&mut *self.asked.lock())
    }
    fn ask(&self, what: String) {
        self.asked.lock().push(what);
    }
}

mod fake_cluster {
    use super::FakeCluster;
    use futures::future::{BoxFuture, FutureExt};
    use std::{sync::Arc, time::Duration};
    use warden::server::cluster::{
        ClusterHalt, ClusterLift, ClusterNode, LiftError, RemoteHaltError,
    };
    use warden::{protocols::cluster::AgentHaltAck, protocols::cluster::AgentLease, *};

    impl ClusterNode for FakeCluster {
        fn node(&self) -> &str {
            "n1"
        }
        fn owns(&self, agent: &str) -> bool {
            agent != "far"
        }
        fn runs_on(&self, agent: &str) -> Option<String> {
            (agent == "far").then(|| "n2".to_owned())
        }
        fn fail_safe(&self) -> Option<String> {
            None
        }
        fn halt_ack_timeout(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn owner<'a>(&'a self, agent: &'a str) -> BoxFuture<'a, Option<String>> {
            std::future::ready(self.runs_on(agent)).boxed()
        }
        fn remote_status<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Option<(AgentStatus, String)>> {
            std::future::ready(None).boxed()
        }
        fn write_lease_now<'a>(self: Arc<Self>, agent: &'a str) -> BoxFuture<'a, ()> {
            self.ask(format!("lease {agent}"));
            std::future::ready(()).boxed()
        }
        fn halt<'a>(self: Arc<Self>, _: &'a str, by: &'a str) -> BoxFuture<'a, ClusterHalt> {
            self.ask(format!("halt by {by}"));
            std::future::ready(ClusterHalt {
                epoch: 7,
                local: Vec::new(),
                remote: Default::default(),
                unanswered: Vec::new(),
            })
            .boxed()
        }
        fn halt_remote<'a>(
            &'a self,
            node: &'a str,
            agent: &'a AgentKey,
            by: &'a str,
        ) -> BoxFuture<'a, Result<Vec<AgentHaltAck>, RemoteHaltError>> {
            self.ask(format!("halt {agent} on {node} by {by}"));
            std::future::ready(Ok(Vec::new())).boxed()
        }
        fn lift<'a>(
            self: Arc<Self>,
            reason: &'a str,
            by: &'a str,
        ) -> BoxFuture<'a, Result<ClusterLift, LiftError>> {
            self.ask(format!("lift by {by}: {reason}"));
            std::future::ready(Ok(ClusterLift {
                epoch: 8,
                local: Vec::new(),
            }))
            .boxed()
        }
        fn unlock<'a>(
            &'a self,
            agent: &'a AgentHandle,
            by: &'a str,
            _: Duration,
            local: BoxFuture<'a, Result<(), ControlError>>,
        ) -> BoxFuture<'a, Result<(), Option<ControlError>>> {
            self.ask(format!("unlock {} by {by}", agent.key()));
            async move { local.await.map_err(Some) }.boxed()
        }
        fn leases(&self) -> BoxFuture<'_, Result<Vec<AgentLease>, String>> {
            std::future::ready(Ok(Vec::new())).boxed()
        }
        fn status(&self) -> BoxFuture<'_, serde_json::Value> {
            std::future::ready(serde_json::json!({ "node": "n1" })).boxed()
        }
        fn metrics(&self) -> String {
            "warden_cluster_fake 1\n".to_owned()
        }
    }
}

/// On a cluster node every route is its table's one handler, which asks the cluster: the halt is
/// the cluster's (a host token's journaled as the host's), only the admin token lifts it or a
/// lockout, another node's agent is halted there, and `GET /api/cluster` answers.
#[actix_rt::test]
async fn on_a_cluster_node_the_routes_ask_the_cluster_and_only_the_admin_lifts() {
    const HOST: &str = "host-secret";
    tokio::time::pause();
    let f = fixture(WardenConfig::default());
    let locked = f.team.assistant("locked", failing());
    lock_out(&locked).await;
    let cluster = Arc::new(FakeCluster::default());
    let config = ApiConfig {
        host_tokens: vec![HOST.into()],
        ..config()
    };
    let state = ApiState::new(f.team.clone(), config).with_cluster(cluster.clone());
    let app = test::init_service(App::new().configure(api::configure(state))).await;

    // The halt: the cluster's, for the admin and the host token only.
    for (token, status) in [(None, 401), (Some("wrong"), 401), (Some(READ), 403)] {
        let (got, _) = call!(app, post("/api/halt", token, None));
        assert_eq!(got.as_u16(), status, "{token:?}");
    }
    assert_eq!(cluster.asked(), Vec::<String>::new());
    let doc: Value = serde_json::from_str(api::OPENAPI).unwrap();
    let documented = |path: &str, method: &str, status: StatusCode, body: &Value| {
        let op = &doc["paths"][path][method]["responses"][status.as_str()];
        assert!(op.is_object(), "{method} {path} {status} is not documented");
        let schema = &op["content"]["application/json"]["schema"];
        if let Err(err) = conforms(&doc, schema, body, "body") {
            panic!("{method} {path} {status} on a cluster node: {err}\n{body}");
        }
    };
    let (status, body) = call!(app, post("/api/halt", Some(HOST), None));
    assert_eq!((status, &body["epoch"]), (StatusCode::OK, &json!(7)));
    documented("/api/halt", "post", status, &body);
    assert_eq!(cluster.asked(), ["halt by api:host"]);
    let (status, _) = call!(app, post("/api/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cluster.asked(), ["halt by api:admin"]);
    // The lift: the admin token only.
    for token in [None, Some(READ), Some(HOST)] {
        let (status, _) = call!(app, post("/api/resume", token, None));
        assert!(status == 401 || status == 403, "{token:?}: {status}");
    }
    assert_eq!(cluster.asked(), Vec::<String>::new());
    let body = json!({"reason": "fixed"});
    let (status, got) = call!(app, post("/api/resume", Some(ADMIN), Some(body)));
    assert_eq!((status, &got["epoch"]), (StatusCode::OK, &json!(8)));
    documented("/api/resume", "post", status, &got);
    assert_eq!(cluster.asked(), ["lift by api:admin: fixed"]);
    // A lockout is lifted through the cluster, by the admin token only.
    for route in ["unlock", "emergency/clear", "history/reset"] {
        let path = format!("/api/agents/locked/{route}");
        for token in [None, Some(READ), Some(HOST)] {
            let (status, _) = call!(app, post(&path, token, None));
            assert!(
                status == 401 || status == 403,
                "{route} {token:?}: {status}"
            );
        }
        assert_eq!(cluster.asked(), Vec::<String>::new(), "{route}");
    }
    let (status, body) = call!(app, post("/api/agents/locked/unlock", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(cluster.asked(), ["unlock locked by api:admin"]);
    // Another node's agent is halted there; this node's has its lease rewritten.
    let (status, body) = call!(app, post("/api/agents/far/halt", Some(HOST), None));
    assert_eq!((status, &body["node"]), (StatusCode::OK, &json!("n2")));
    documented("/api/agents/{key}/halt", "post", status, &body);
    assert_eq!(cluster.asked(), ["halt far on n2 by api:host"]);
    let (status, _) = call!(app, post("/api/agents/locked/halt", Some(ADMIN), None));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cluster.asked(), ["lease locked"]);
    // A resume of another node's agent is refused here.
    let (status, body) = call!(app, post("/api/agents/far/resume", Some(ADMIN), None));
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    documented("/api/agents/{key}/resume", "post", status, &body);
    let (status, body) = call!(app, get("/api/agents", Some(READ)));
    assert_eq!(body[0]["node"], "n1");
    documented("/api/agents", "get", status, &body);
    // The cluster's own route and its metrics.
    let (status, body) = call!(app, get("/api/cluster", Some(READ)));
    assert_eq!((status, &body), (StatusCode::OK, &json!({"node": "n1"})));
    let resp = test::call_service(&app, get("/metrics", Some(READ)).to_request()).await;
    let text = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    assert!(text.contains("warden_cluster_fake 1"), "{text}");
    // Without a cluster, `GET /api/cluster` is a 404 of the route, not "no route".
    let plain = app!(f);
    let (status, body) = call!(plain, get("/api/cluster", Some(READ)));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("not a cluster node"),
        "{body}"
    );
}
