//! The crash tests: `warden serve` as a child process on a journal file, killed with SIGKILL, then
//! started again on the same file.
//!
//! * At a seed-chosen point while it works: a halt acknowledged before the kill is never lost, the
//!   halted agent refuses work after the restart, and no agent is left stuck in a mid-turn state.
//! * Inside a turn (the scripted model answers after `latency_ms`; the kill comes once the journal
//!   shows the turn started, after more messages were acknowledged while the agent was busy):
//!   acknowledged halts, lockouts and unlocks hold, locked-out and stopped agents do no work after the
//!   restart, the agent caught mid-turn is recovered (journaled, legal transitions), and every message
//!   it acknowledged with a `202` is, at the kill, in its history or pending, and after the restart
//!   in its history once, in the order sent (checked by unique content): none lost, none run twice.
//!
//! * During a delegation cascade (a leaf's model is down and locks it out, its parent's delegations
//!   to it are then refused; on some seeds an operator halts the other leaf): every event the root
//!   acknowledged is settled and run exactly once across the kill, no agent locked out or stopped
//!   at the kill works after the restart, and every state change in the file is a legal one.
//!
//! Waits poll with a deadline; nothing asserts a duration.
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};
use warden::{
    journal::{JournalReader, RECOVERY_CAUSE},
    AgentRecord, AgentState, Event, EventKind, HaltCause,
};
use warden_testkit::Serve;

const TOKEN: &str = "crash-test-token";

const TEAM: &str = r#"
[providers.scripted]
kind = "scripted"
replies = ["one", "two", "three"]

[[agents]]
key = "a"
provider = "scripted"

[[agents]]
key = "b"
provider = "scripted"
"#;

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        // The high half: xorshift's low bits are its weakest.
        (self.next() >> 32) % n
    }
}

/// One HTTP/1.1 request; returns the status code and the body.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
    warden_testkit::blocking_request(port, method, path, TOKEN, body)
}

/// `warden serve` of `DIR/team.toml` on `DIR/warden.db` ([`warden_testkit::Serve`]).
struct Server {
    serve: Serve,
    port: u16,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let serve = Serve::command(env!("CARGO_BIN_EXE_warden"))
            .config(dir.join("team.toml"))
            .db(dir.join("warden.db"))
            .admin_token(TOKEN)
            .log(dir.join("serve.log"))
            .start();
        Server {
            port: serve.port(),
            serve,
        }
    }

    fn status(&self, agent: &str) -> serde_json::Value {
        let (status, body) = http(self.port, "GET", &format!("/api/agents/{agent}"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    fn state(&self, agent: &str) -> AgentState {
        serde_json::from_value(self.status(agent)["state"].clone()).unwrap()
    }

    /// `POST /api/agents/{agent}/{action}` (halt, unlock): the status code.
    fn control(&self, agent: &str, action: &str) -> u16 {
        let (status, body) = http(
            self.port,
            "POST",
            &format!("/api/agents/{agent}/{action}"),
            None,
        )
        .unwrap();
        assert!(status == 200 || status >= 400, "{body}");
        status
    }

    fn send(&self, agent: &str, content: &str) -> u16 {
        let body = serde_json::json!({ "content": content }).to_string();
        http(
            self.port,
            "POST",
            &format!("/api/agents/{agent}/events"),
            Some(&body),
        )
        .map(|(status, _)| status)
        .unwrap_or(0)
    }

    /// SIGKILL: no shutdown, no flush.
    fn kill(mut self) {
        self.serve.kill();
    }
}

fn temp_dir(name: &str, seed: u64, team: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("warden-crash-{}-{name}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("team.toml"), team).unwrap();
    dir
}

fn crash_and_restart(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let dir = temp_dir("halt", seed, TEAM);
    let server = Server::start(&dir);

    // Some work for both agents, then an acknowledged halt of `a`, then more work for `b` while
    // the process is killed at a seed-chosen moment.
    // Every message b acknowledges with a 202 must run exactly once, before or after the kill.
    let mut acked = Vec::new();
    let mut send_b = |server: &Server, content: String| {
        if server.send("b", &content) == 202 {
            acked.push(content);
        }
    };
    for i in 0..rng.below(20) {
        server.send("a", &format!("a{i}"));
        send_b(&server, format!("b{i}"));
    }
    let (status, body) = http(server.port, "POST", "/api/agents/a/halt", None).unwrap();
    assert_eq!(status, 200, "seed {seed}: {body}");
    let burst = rng.below(30);
    for i in 0..burst {
        send_b(&server, format!("late{i}"));
    }
    std::thread::sleep(Duration::from_millis(rng.below(40)));
    server.kill();

    // What was acknowledged is on disk.
    let reader = JournalReader::open(dir.join("warden.db")).unwrap();
    let events = reader.events_of("a").unwrap();
    assert!(
        events.iter().any(|e| matches!(
            &e.kind,
            EventKind::Halted { cause: HaltCause::Operator { operator }, .. } if operator == "api:admin"
        )),
        "seed {seed}: the acknowledged halt was lost"
    );
    // So is every event b answered 202 to.
    let queued: Vec<String> = reader
        .events_of("b")
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::EventQueued { event, .. } => Some(event.content.clone()),
            _ => None,
        })
        .collect();
    for content in &acked {
        assert!(
            queued.contains(content),
            "seed {seed}: {content:?} was answered 202 but is not in the journal"
        );
    }
    drop(reader);

    // Restart on the same file: `a` is still STOPPED and refuses work; `b` is not stuck mid-turn.
    let server = Server::start(&dir);
    assert_eq!(server.state("a"), AgentState::Stopped, "seed {seed}");
    assert_eq!(server.send("a", "admin:unlock"), 409, "seed {seed}");
    // b runs the events it had acknowledged and not yet taken; it must not be stuck mid-turn.
    wait_for(&format!("seed {seed}: b not stuck mid-turn"), || {
        !server.state("b").is_busy()
    });
    let db = dir.join("warden.db");
    assert_eq!(server.send("b", "after restart"), 202, "seed {seed}");
    acked.push("after restart".into());
    wait_for(
        &format!("seed {seed}: b took work after the restart"),
        || {
            let b = record_of(&db, "b");
            b.pending.is_empty()
                && !b.state.is_busy()
                && b.history
                    .iter()
                    .any(|m| m.content.as_deref() == Some("[api] after restart"))
        },
    );
    server.kill();
    let history = record_of(&db, "b").history;
    for content in &acked {
        let want = format!("[api] {content}");
        let runs = history
            .iter()
            .filter(|m| m.content.as_deref() == Some(want.as_str()))
            .count();
        assert_eq!(runs, 1, "seed {seed}: {content:?} ran {runs} times");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_loses_no_acknowledged_halt_and_the_halted_agent_stays_stopped() {
    for seed in [1, 2, 3, 4, 5] {
        crash_and_restart(seed);
    }
}

/// `a` is halted, `b` is killed inside a turn (its model answers after 800 to 1200 ms), `c` is locked
/// out, `d` is locked out and unlocked (their model is down: five failed turns trip the breaker).
const TURN_TEAM: &str = r#"
[providers.slow]
kind = "scripted"
replies = ["done"]
latency_ms = 800
jitter_ms = 400

[providers.down]
kind = "scripted"
error = "model down"

[[agents]]
key = "a"
provider = "slow"

[[agents]]
key = "b"
provider = "slow"

[[agents]]
key = "c"
provider = "down"

[[agents]]
key = "d"
provider = "down"
"#;

/// The same team with a quick model, for the restart (a restart may change the configuration; the
/// agents come back from the journal all the same): what b had queued runs in milliseconds.
fn quick_turn_team() -> String {
    TURN_TEAM.replace(
        "latency_ms = 800\njitter_ms = 400",
        "latency_ms = 5\njitter_ms = 0",
    )
}

/// Polls `cond` every 10 ms until it holds; panics with `what` after 15 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The agent's events in the journal file (read-only, while warden may be writing it).
fn events_of(db: &Path, agent: &str) -> Vec<Event> {
    JournalReader::open(db).unwrap().events_of(agent).unwrap()
}

fn record_of(db: &Path, agent: &str) -> AgentRecord {
    let records = JournalReader::open(db).unwrap().restore_records().unwrap();
    records
        .into_iter()
        .find(|r| r.key.as_str() == agent)
        .unwrap_or_else(|| panic!("no record of {agent}"))
}

/// The last sequence number in the journal file.
fn last_seq(db: &Path) -> u64 {
    JournalReader::open(db)
        .unwrap()
        .tail(1)
        .unwrap()
        .last()
        .map_or(0, |e| e.seq)
}

/// The last state the journal shows for the agent.
fn last_state(events: &[Event]) -> Option<AgentState> {
    events.iter().rev().find_map(|e| match e.kind {
        EventKind::StateChanged { to, .. } => Some(to),
        _ => None,
    })
}

/// The user messages of `record`'s history that carry `marker`.
fn user_messages(record: &AgentRecord, marker: &str) -> Vec<String> {
    record
        .history
        .iter()
        .filter_map(|m| m.content.clone())
        .filter(|c| c.contains(marker))
        .collect()
}

/// Events that mean the agent worked: a turn started, a message was added, a turn ended.
fn is_work(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::StateChanged {
            to: AgentState::Executing,
            ..
        } | EventKind::HistoryAppended { .. }
            | EventKind::TurnFinished { .. }
            | EventKind::ToolStarted { .. }
    )
}

fn kill_inside_a_turn_and_restart(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let dir = temp_dir("turn", seed, TURN_TEAM);
    let db = dir.join("warden.db");
    let server = Server::start(&dir);

    // c and d fail five turns in a row and lock out; d is unlocked; a is halted. Each is acknowledged.
    for agent in ["c", "d"] {
        for i in 0..5 {
            assert_eq!(
                server.send(agent, &format!("{agent}{i}")),
                202,
                "seed {seed}"
            );
        }
    }
    wait_for("c and d locked out", || {
        server.state("c") == AgentState::SafetyLockout
            && server.state("d") == AgentState::SafetyLockout
    });
    assert_eq!(server.control("d", "unlock"), 200, "seed {seed}");
    assert_eq!(server.control("a", "halt"), 200, "seed {seed}");

    // b accepts a few messages, then more while it is busy in the first one's turn; every one is
    // acknowledged with a 202. The kill comes inside that turn, a seed-chosen time after the journal
    // shows it started (well before the model's 800 ms answer).
    let marker = format!("msg-{seed}-");
    let mut sent: Vec<String> = Vec::new();
    let send_b = |server: &Server, sent: &mut Vec<String>| {
        let content = format!("{marker}{}", sent.len());
        assert_eq!(server.send("b", &content), 202, "seed {seed}");
        sent.push(content);
    };
    for _ in 0..1 + rng.below(2) {
        send_b(&server, &mut sent);
    }
    wait_for("b's turn in the journal", || {
        let events = events_of(&db, "b");
        let started = events.iter().any(|e| match &e.kind {
            EventKind::HistoryAppended { message } => message
                .content
                .as_deref()
                .is_some_and(|c| c.contains(&sent[0])),
            _ => false,
        });
        started && last_state(&events).is_some_and(AgentState::is_busy)
    });
    for _ in 0..1 + rng.below(2) {
        send_b(&server, &mut sent);
    }
    std::thread::sleep(Duration::from_millis(rng.below(250)));
    server.kill();

    // What the file holds at the kill.
    let b_events = events_of(&db, "b");
    assert!(
        last_state(&b_events).is_some_and(AgentState::is_busy),
        "seed {seed}: the kill did not land inside b's turn"
    );
    let killed_at = last_seq(&db);
    assert!(
        events_of(&db, "a")
            .iter()
            .any(|e| matches!(e.kind, EventKind::Halted { .. })),
        "seed {seed}: the acknowledged halt of a was lost"
    );
    let c = record_of(&db, "c");
    assert!(c.emergency_stop(), "seed {seed}: c's lockout was lost");
    let d = record_of(&db, "d");
    assert_eq!(
        (d.state, d.emergency_stop()),
        (AgentState::WaitingForEvent, false),
        "seed {seed}: the acknowledged unlock of d was lost"
    );
    // Every message b acknowledged is, at the kill, either in its history (the cut turn's) or
    // pending: exactly once, in the order sent.
    let b = record_of(&db, "b");
    let in_history = user_messages(&b, &marker);
    assert_eq!(in_history.len(), 1, "seed {seed}: {in_history:?}");
    assert!(
        in_history[0].ends_with(&sent[0]),
        "seed {seed}: {in_history:?}"
    );
    let pending: Vec<String> = b.pending.iter().map(|p| p.event.content.clone()).collect();
    assert_eq!(pending, sent[1..], "seed {seed}: pending at the kill");

    // Restart on the same file, with a quick model.
    std::fs::write(dir.join("team.toml"), quick_turn_team()).unwrap();
    let server = Server::start(&dir);
    assert_eq!(server.state("a"), AgentState::Stopped, "seed {seed}");
    let c = server.status("c");
    assert_eq!(c["state"], "SAFETY_LOCKOUT", "seed {seed}");
    assert_eq!(c["emergency_stop"], true, "seed {seed}");
    let d = server.status("d");
    assert_eq!(
        (&d["state"], &d["emergency_stop"]),
        (
            &serde_json::json!("WAITING_FOR_EVENT"),
            &serde_json::json!(false)
        ),
        "seed {seed}"
    );

    // b was recovered along legal transitions, journaled after the kill.
    let recovery: Vec<(AgentState, AgentState)> = events_of(&db, "b")
        .into_iter()
        .filter(|e| e.seq > killed_at)
        .filter_map(|e| match e.kind {
            EventKind::StateChanged { from, to, cause } if cause == RECOVERY_CAUSE => {
                Some((from, to))
            }
            _ => None,
        })
        .collect();
    assert!(
        !recovery.is_empty(),
        "seed {seed}: b's recovery not journaled"
    );
    assert!(
        recovery
            .iter()
            .all(|(from, to)| from.can_transition_to(*to)),
        "seed {seed}: {recovery:?}"
    );
    assert_eq!(
        recovery.first().map(|r| r.0),
        last_state(&b_events),
        "seed {seed}: recovery starts where the kill left b"
    );
    assert_eq!(
        recovery.last().map(|r| r.1),
        Some(AgentState::WaitingForEvent)
    );

    // The locked-out and the stopped agent refuse work; b and the unlocked d take it.
    assert_eq!(server.send("c", "work after restart"), 409, "seed {seed}");
    assert_eq!(server.send("a", "work after restart"), 409, "seed {seed}");
    assert_eq!(server.send("d", "work after restart"), 202, "seed {seed}");
    let after = format!("{marker}after-restart");
    assert_eq!(server.send("b", &after), 202, "seed {seed}");
    wait_for("b's queued work done", || {
        let b = record_of(&db, "b");
        b.pending.is_empty()
            && b.state == AgentState::WaitingForEvent
            && !user_messages(&b, &after).is_empty()
    });
    wait_for("d's turn journaled", || {
        events_of(&db, "d")
            .iter()
            .any(|e| e.seq > killed_at && matches!(e.kind, EventKind::TurnFinished { .. }))
    });
    server.kill();

    // b ran every acknowledged message once: the cut turn's before the kill, the pending ones after
    // the restart, in order and before the new one. None lost, none twice.
    let mut expected = sent.clone();
    expected.push(after);
    let history = user_messages(&record_of(&db, "b"), &marker);
    assert_eq!(
        history.len(),
        expected.len(),
        "seed {seed}: {history:?} vs {expected:?}"
    );
    for (got, want) in history.iter().zip(&expected) {
        assert!(
            got.ends_with(want.as_str()),
            "seed {seed}: {history:?} vs {expected:?}"
        );
    }
    // Nothing the locked-out or the stopped agent did after the restart was work.
    for agent in ["a", "c"] {
        let worked: Vec<Event> = events_of(&db, agent)
            .into_iter()
            .filter(|e| e.seq > killed_at && is_work(&e.kind))
            .collect();
        assert!(worked.is_empty(), "seed {seed}: {agent} worked: {worked:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_inside_a_turn_keeps_acknowledged_decisions_and_recovers_the_turn() {
    for seed in [11, 12, 13, 14] {
        kill_inside_a_turn_and_restart(seed);
    }
}

/// A delegation tree: `lead` delegates every event to `mid`, which delegates to `leaf_down` (its
/// model is down: five failed tasks lock it out, and `mid`'s later delegations to it are refused)
/// and to `leaf_ok` (answers after 50 to 80 ms).
const CASCADE_TEAM: &str = r#"
[providers.lead]
kind = "scripted"
cycle = true
replies = [{ tool = "delegate", args = { agent = "mid", task = "survey" } }, "lead done"]

[providers.mid]
kind = "scripted"
cycle = true
replies = [
  { tool = "delegate", args = { agent = "leaf_down", task = "fetch" } },
  { tool = "delegate", args = { agent = "leaf_ok", task = "fetch" } },
  "mid done",
]

[providers.down]
kind = "scripted"
error = "model down"

[providers.ok]
kind = "scripted"
replies = ["leaf done"]
latency_ms = 50
jitter_ms = 30

[[agents]]
key = "lead"
provider = "lead"

[[agents]]
key = "mid"
role = "sub_agent"
parent = "lead"
provider = "mid"

[[agents]]
key = "leaf_down"
role = "sub_agent"
parent = "mid"
provider = "down"
delegate = false

[[agents]]
key = "leaf_ok"
role = "sub_agent"
parent = "mid"
provider = "ok"
delegate = false
"#;

const CASCADE: [&str; 4] = ["lead", "mid", "leaf_down", "leaf_ok"];

/// Every event `lead` acknowledged, by content, with its id (from `event_queued`).
fn queued_ids(events: &[Event]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::EventQueued { id, event } => Some((event.content.clone(), *id)),
            _ => None,
        })
        .collect()
}

/// How many times the event `id` was settled (taken, refused, or discarded by a halt's listing).
fn settlements(events: &[Event], id: u64) -> usize {
    events
        .iter()
        .map(|e| match &e.kind {
            EventKind::EventTaken { id: taken } => usize::from(*taken == id),
            EventKind::WorkRefused {
                queued: Some(refused),
                ..
            } => usize::from(*refused == id),
            EventKind::MessagesDiscarded { messages } => {
                messages.iter().filter(|m| m.queued == Some(id)).count()
            }
            _ => 0,
        })
        .sum()
}

/// What one cascade run's kill hit.
struct CascadeKill {
    taken_before_kill: usize,
    leaf_locked_out: bool,
    leaf_halted: bool,
}

fn kill_a_cascade_and_restart(seed: u64) -> CascadeKill {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let dir = temp_dir("cascade", seed, CASCADE_TEAM);
    let db = dir.join("warden.db");
    let server = Server::start(&dir);

    // A burst of work for the tree; on some seeds an operator halts leaf_ok part-way. The kill comes
    // at a seed-chosen moment: before, during or after leaf_down's lockout.
    let marker = format!("cascade-{seed}-");
    let events = 6 + rng.below(8);
    let halt_leaf_at = (rng.below(2) == 0).then(|| rng.below(events));
    let mut acked = Vec::new();
    for i in 0..events {
        if halt_leaf_at == Some(i) {
            assert_eq!(server.control("leaf_ok", "halt"), 200, "seed {seed}");
        }
        let content = format!("{marker}{i}");
        assert_eq!(server.send("lead", &content), 202, "seed {seed}");
        acked.push(content);
    }
    let taken_before_kill = rng.below(events + 1) as usize;
    wait_for(
        &format!("seed {seed}: lead took {taken_before_kill}"),
        || {
            events_of(&db, "lead")
                .iter()
                .filter(|e| matches!(e.kind, EventKind::EventTaken { .. }))
                .count()
                >= taken_before_kill
        },
    );
    std::thread::sleep(Duration::from_millis(rng.below(40)));
    server.kill();

    // At the kill: every acknowledged event and halt is on disk.
    let killed_at = last_seq(&db);
    let lead_events = events_of(&db, "lead");
    let ids = queued_ids(&lead_events);
    for content in &acked {
        assert!(
            ids.iter().any(|(c, _)| c == content),
            "seed {seed}: {content:?} was answered 202 but is not in the journal"
        );
    }
    if halt_leaf_at.is_some() {
        assert!(
            events_of(&db, "leaf_ok")
                .iter()
                .any(|e| matches!(e.kind, EventKind::Halted { .. })),
            "seed {seed}: the acknowledged halt of leaf_ok was lost"
        );
    }
    let locked_at_kill: Vec<&str> = CASCADE
        .into_iter()
        .filter(|agent| record_of(&db, agent).emergency_stop())
        .collect();
    let stopped_at_kill: Vec<&str> = CASCADE
        .into_iter()
        .filter(|agent| record_of(&db, agent).state == AgentState::Stopped)
        .collect();

    // Restart: locked-out agents stay locked out, stopped ones stopped, none is left mid-turn, and
    // the tree finishes what lead had acknowledged. (The requeued work starts at once, so an agent
    // not locked out at the kill may lock out now: only the other way round is checked.)
    let server = Server::start(&dir);
    for agent in CASCADE {
        let status = server.status(agent);
        if locked_at_kill.contains(&agent) {
            assert_eq!(status["emergency_stop"], true, "seed {seed}: {agent}");
            assert_eq!(status["state"], "SAFETY_LOCKOUT", "seed {seed}: {agent}");
            assert_eq!(server.send(agent, "work"), 409, "seed {seed}: {agent}");
        }
        if stopped_at_kill.contains(&agent) {
            assert_eq!(status["state"], "STOPPED", "seed {seed}: {agent}");
        }
    }
    let after = format!("{marker}after-restart");
    assert_eq!(server.send("lead", &after), 202, "seed {seed}");
    acked.push(after.clone());
    wait_for(&format!("seed {seed}: the tree settled"), || {
        let lead = record_of(&db, "lead");
        lead.pending.is_empty()
            && !user_messages(&lead, &after).is_empty()
            && CASCADE
                .into_iter()
                .all(|agent| !record_of(&db, agent).state.is_busy())
    });
    server.kill();

    // Every event lead acknowledged was settled exactly once and, since lead never locks out here,
    // ran exactly once: none lost across the kill, none run twice.
    let lead_events = events_of(&db, "lead");
    let ids = queued_ids(&lead_events);
    let lead = record_of(&db, "lead");
    for content in &acked {
        let (_, id) = ids
            .iter()
            .find(|(c, _)| c == content)
            .unwrap_or_else(|| panic!("seed {seed}: {content:?} not journaled"));
        assert_eq!(
            settlements(&lead_events, *id),
            1,
            "seed {seed}: {content:?} (id {id})"
        );
        let runs = user_messages(&lead, content)
            .iter()
            .filter(|m| m.ends_with(content.as_str()))
            .count();
        assert_eq!(runs, 1, "seed {seed}: {content:?} ran {runs} times");
    }
    // No agent locked out or stopped at the kill worked after the restart; mid's delegations to a
    // locked-out leaf were refused, not run.
    for agent in locked_at_kill.iter().chain(&stopped_at_kill) {
        let worked: Vec<Event> = events_of(&db, agent)
            .into_iter()
            .filter(|e| e.seq > killed_at && is_work(&e.kind))
            .collect();
        assert!(worked.is_empty(), "seed {seed}: {agent} worked: {worked:?}");
    }
    if locked_at_kill.contains(&"leaf_down") {
        assert!(
            events_of(&db, "mid").iter().any(|e| e.seq > killed_at
                && matches!(&e.kind, EventKind::DelegationRefused { to, .. } if to.as_str() == "leaf_down")),
            "seed {seed}: mid's delegation to the locked-out leaf was not refused"
        );
    }
    // Every state change in the file, before the kill, in recovery and after, is a legal one.
    for agent in CASCADE {
        for e in events_of(&db, agent) {
            if let EventKind::StateChanged { from, to, cause } = &e.kind {
                assert!(
                    from.can_transition_to(*to),
                    "seed {seed}: {agent}: {from} -> {to} ({cause})"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    CascadeKill {
        taken_before_kill,
        leaf_locked_out: locked_at_kill.contains(&"leaf_down"),
        leaf_halted: halt_leaf_at.is_some(),
    }
}

/// The issue's crash test: warden runs a delegation cascade (a leaf's model is down, its lockout
/// makes its parent's delegations be refused), is killed with SIGKILL at a seed-chosen point and
/// restarted on the same file.
#[test]
fn sigkill_during_a_cascade_loses_nothing_acknowledged_and_resumes_no_locked_out_agent() {
    let kills: Vec<CascadeKill> = (21..=26).map(kill_a_cascade_and_restart).collect();
    // The seeds cover kills before and after the leaf's lockout, with and without a halted leaf.
    let summary: Vec<_> = kills
        .iter()
        .map(|k| (k.taken_before_kill, k.leaf_locked_out, k.leaf_halted))
        .collect();
    assert!(kills.iter().any(|k| k.leaf_locked_out), "{summary:?}");
    assert!(kills.iter().any(|k| !k.leaf_locked_out), "{summary:?}");
    assert!(kills.iter().any(|k| k.leaf_halted), "{summary:?}");
    assert!(kills.iter().any(|k| !k.leaf_halted), "{summary:?}");
}

/// Issue 10.1 through the real binary: a locked-out agent (its model is down) is halted and then
/// resumed over HTTP — the resume is refused, the agent stays SAFETY_LOCKOUT and refuses events —,
/// then the process is SIGKILLed and restarted: it comes back SAFETY_LOCKOUT, recovery journals
/// nothing for it (no invented turn), and only the unlock lets it work again.
#[test]
fn sigkill_after_halt_and_resume_keeps_a_lockout_and_recovery_invents_no_turn() {
    let team = r#"
[providers.down]
kind = "scripted"
replies = ["never"]
error = "model down"

[[agents]]
key = "a"
provider = "down"
"#;
    let dir = temp_dir("lockout-halt-resume", 0, team);
    let db = dir.join("warden.db");
    let server = Server::start(&dir);
    for i in 0..5 {
        assert_eq!(server.send("a", &format!("e{i}")), 202);
    }
    wait_for("a locked out", || {
        server.state("a") == AgentState::SafetyLockout
    });
    assert_eq!(server.control("a", "halt"), 200);
    assert_eq!(server.control("a", "resume"), 409);
    assert_eq!(server.state("a"), AgentState::SafetyLockout);
    assert_eq!(server.status("a")["emergency_stop"], true);
    assert_eq!(server.send("a", "sneak in"), 409);
    let before = last_seq(&db);
    server.kill();

    let server = Server::start(&dir);
    assert_eq!(server.state("a"), AgentState::SafetyLockout);
    assert_eq!(server.status("a")["emergency_stop"], true);
    assert_eq!(server.send("a", "after restart"), 409);
    let recovered: Vec<_> = events_of(&db, "a")
        .into_iter()
        .filter(|e| e.seq > before)
        .filter(
            |e| matches!(&e.kind, EventKind::StateChanged { cause, .. } if cause == RECOVERY_CAUSE),
        )
        .collect();
    assert!(recovered.is_empty(), "recovery journaled {recovered:?}");
    let record = record_of(&db, "a");
    assert!(record.lockout_consistent(), "{record:?}");
    assert_eq!(server.control("a", "unlock"), 200);
    assert_eq!(server.send("a", "after unlock"), 202);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12: what became of an event is read from the journal, so it survives a SIGKILL: an event
/// answered before the kill is still `answered` (same answer) after the restart, and one whose turn
/// the kill cut is `failed` with reason `crashed`.
#[test]
fn an_events_fate_is_answered_from_the_journal_after_a_sigkill() {
    let team = r#"
[providers.slow]
kind = "scripted"
replies = ["the answer"]
latency_ms = 400

[[agents]]
key = "a"
provider = "slow"
"#;
    let dir = temp_dir("fate-after-kill", 0, team);
    let server = Server::start(&dir);
    let body = serde_json::json!({ "content": "first" }).to_string();
    let (status, answered) = http(
        server.port,
        "POST",
        "/api/agents/a/events?wait=30",
        Some(&body),
    )
    .unwrap();
    assert_eq!(status, 200, "{answered}");
    let answered: serde_json::Value = serde_json::from_str(&answered).unwrap();
    assert_eq!(answered["status"], "answered", "{answered}");
    let first = answered["id"].as_u64().unwrap();
    let body = serde_json::json!({ "content": "second" }).to_string();
    let (status, queued) = http(server.port, "POST", "/api/agents/a/events", Some(&body)).unwrap();
    assert_eq!(status, 202, "{queued}");
    let queued: serde_json::Value = serde_json::from_str(&queued).unwrap();
    let second = queued["id"].as_u64().unwrap();
    wait_for("the second turn runs", || {
        let (_, body) = http(
            server.port,
            "GET",
            &format!("/api/agents/a/events/{second}"),
            None,
        )
        .unwrap();
        body.contains("\"running\"")
    });
    server.kill();

    let server = Server::start(&dir);
    let (status, got) = http(
        server.port,
        "GET",
        &format!("/api/agents/a/events/{first}"),
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{got}");
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got, answered, "the same fate after the restart");
    let (status, got) = http(
        server.port,
        "GET",
        &format!("/api/agents/a/events/{second}"),
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{got}");
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(
        (got["status"].as_str(), got["reason"].as_str()),
        (Some("failed"), Some("crashed")),
        "{got}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 10 item 6: a SIGKILL does not reset a budget. Usage is journaled with each turn's events,
/// so `tokens_used` and `cost_used` after the restart equal what they were before the kill.
#[test]
fn spent_tokens_and_cost_survive_a_sigkill() {
    let team = r#"
[safety.budget]
tokens_per_agent = 100000

[safety.budget.prices.scripted]
prompt_per_1k = 0.5
completion_per_1k = 1.0

[providers.scripted]
kind = "scripted"
replies = ["one answer", "another, longer answer", "a third"]

[[agents]]
key = "a"
provider = "scripted"
"#;
    let dir = temp_dir("budget-after-kill", 0, team);
    let db = dir.join("warden.db");
    let server = Server::start(&dir);
    for i in 0..3 {
        let body = serde_json::json!({ "content": format!("question {i}") }).to_string();
        let (status, answered) = http(
            server.port,
            "POST",
            "/api/agents/a/events?wait=30",
            Some(&body),
        )
        .unwrap();
        assert_eq!(status, 200, "{answered}");
    }
    let before = server.status("a");
    let tokens = before["tokens_used"].as_u64().unwrap();
    assert!(tokens > 0, "{before}");
    // The usage is group-committed with the turn (not waited for): kill once it is on disk.
    wait_for("usage committed", || {
        record_of(&db, "a").usage.tokens() == tokens
    });
    server.kill();

    let server = Server::start(&dir);
    let after = server.status("a");
    assert_eq!(after["tokens_used"], before["tokens_used"], "{after}");
    assert_eq!(after["cost_used"], before["cost_used"], "{after}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- every acknowledged change is on disk -------------------------------------------------------

/// The routes that change state but whose `2xx` promises nothing across a crash, and why. Every
/// other route that is not a `GET` is checked by
/// [`every_state_change_acknowledged_over_http_survives_a_sigkill_right_after_its_2xx`].
const NOT_DURABLE_BY_DESIGN: &[(&str, &str, &str)] = &[
    (
        "POST",
        "/api/world/presence",
        "kept in memory only (never journaled): the host reports presence again",
    ),
    (
        "POST",
        "/api/world/clock",
        "kept in memory only (never journaled): the host sets the game hour again",
    ),
    (
        "POST",
        "/api/interventions/{id}",
        "answers a question of a running turn, which a crash ends (the turn is not resumed)",
    ),
];

/// `a` and `b` answer at once, `slow` after 50 ms (its turn ends long after its event's acceptance
/// was committed); `down`'s model is down (five failed turns lock it out).
const ROUTES_TEAM: &str = r#"
[providers.scripted]
kind = "scripted"
replies = ["answered"]

[providers.slowly]
kind = "scripted"
replies = ["answered"]
latency_ms = 50

[providers.down]
kind = "scripted"
error = "model down"

[[agents]]
key = "a"
provider = "scripted"

[[agents]]
key = "b"
provider = "scripted"

[[agents]]
key = "slow"
provider = "slowly"

[[agents]]
key = "down"
provider = "down"

[[agents]]
key = "m"
provider = "scripted"
memory = { long_term = true }
"#;

/// One acknowledged request: asserts a `2xx` and returns the body as JSON.
fn acknowledged(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> serde_json::Value {
    let (status, answer) = http(server.port, method, path, body).unwrap();
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {answer}"
    );
    serde_json::from_str(&answer).unwrap_or(serde_json::Value::Null)
}

/// Locks `down` out (five events, each a failed turn).
fn lock_out(server: &Server) {
    for i in 0..5 {
        assert_eq!(server.send("down", &format!("fail {i}")), 202);
    }
    wait_for("down locked out", || {
        server.state("down") == AgentState::SafetyLockout
    });
}

/// Issue 31 item 7: a `2xx` means the change is on disk. For every route that changes state (the
/// route table is walked, so a new route cannot be forgotten), `warden serve` is SIGKILLed right
/// after the acknowledgement — no wait, no shutdown — and the journal file must hold the change;
/// the restarted process must show it. Three rounds, each with a new value; every loss is listed.
#[test]
fn every_state_change_acknowledged_over_http_survives_a_sigkill_right_after_its_2xx() {
    let dir = temp_dir("routes", 0, ROUTES_TEAM);
    let db = dir.join("warden.db");
    let mut covered = std::collections::BTreeSet::new();
    // What was acknowledged and then missing, all of it (not only the first).
    let mut lost: Vec<String> = Vec::new();
    // The kill comes right after each acknowledgement; the restarted process is the next step's.
    let mut server = Server::start(&dir);
    for round in 0..3 {
        let mut check = |held: bool, step: &str| {
            if !held {
                lost.push(format!("round {round}: {step}"));
            }
        };

        covered.insert(("PUT", "/api/agents/{key}/goals"));
        let goals = vec![format!("goal of round {round}")];
        let body = serde_json::json!({ "goals": goals }).to_string();
        acknowledged(&server, "PUT", "/api/agents/a/goals", Some(&body));
        server.kill();
        check(record_of(&db, "a").goals == goals, "goals lost");
        server = Server::start(&dir);
        check(
            server.status("a")["goals"] == serde_json::json!(goals),
            "goals lost after the restart",
        );

        // Long-term memory: two players whisper to `m` (the world route answers once the
        // observation is on disk); one memory is deleted, the other player forgotten everywhere.
        let (p, q) = (format!("p{round}"), format!("q{round}"));
        for who in [&p, &q] {
            let body = serde_json::json!({
                "speaker": {"id": who, "kind": "player"}, "kind": "whisper",
                "text": format!("{who} says the river is high")
            })
            .to_string();
            acknowledged(&server, "POST", "/api/agents/m/world", Some(&body));
        }
        let listed = acknowledged(
            &server,
            "GET",
            &format!("/api/agents/m/memories?about={p}"),
            None,
        );
        let id = listed["memories"][0]["id"].as_u64().expect("a memory of p");
        let about = |db: &Path, who: &str| {
            record_of(db, "m").memory().map_or(0, |s| {
                s.about(who).len() + usize::from(s.profiles.contains_key(who))
            })
        };
        covered.insert(("DELETE", "/api/agents/{key}/memories/{id}"));
        acknowledged(
            &server,
            "DELETE",
            &format!("/api/agents/m/memories/{id}"),
            None,
        );
        server.kill();
        check(
            record_of(&db, "m")
                .memory()
                .is_some_and(|s| !s.memories.contains_key(&id)),
            "memory delete lost",
        );
        server = Server::start(&dir);
        let listed = acknowledged(
            &server,
            "GET",
            &format!("/api/agents/m/memories?about={p}"),
            None,
        );
        check(
            listed["memories"].as_array().is_some_and(|m| m.is_empty()),
            "memory delete lost after the restart",
        );
        covered.insert(("DELETE", "/api/memories"));
        check(about(&db, &q) > 0, "q's memory was stored");
        acknowledged(&server, "DELETE", &format!("/api/memories?about={q}"), None);
        server.kill();
        check(about(&db, &q) == 0, "forgetting a player lost");
        server = Server::start(&dir);
        let listed = acknowledged(
            &server,
            "GET",
            &format!("/api/agents/m/memories?about={q}"),
            None,
        );
        check(
            listed["memories"].as_array().is_some_and(|m| m.is_empty())
                && listed["profile"].is_null(),
            "forgetting a player lost after the restart",
        );

        // An observation of CONTEXT (another NPC's line in the room): the 200 comes once its
        // `perceived` (which keeps it for memory) is on disk; the NPC's actor writes it afterwards, and a
        // SIGKILL before that write loses nothing: the restart writes it.
        let guard = format!("guard{round}");
        let body = serde_json::json!({
            "speaker": {"id": guard, "kind": "npc"}, "kind": "say", "room": "gate",
            "text": format!("{guard} saw smoke over the hills")
        })
        .to_string();
        let seen = acknowledged(&server, "POST", "/api/agents/m/world", Some(&body));
        assert_eq!(seen["perception"]["verdict"], "CONTEXT", "{seen}");
        server.kill();
        check(
            record_of(&db, "m").memory().is_some_and(|s| {
                !s.about(&guard).is_empty()
                    || s.unwritten.iter().any(|u| u.event.speaker.id == guard)
            }),
            "a kept observation lost",
        );
        server = Server::start(&dir);
        let listed = acknowledged(
            &server,
            "GET",
            &format!("/api/agents/m/memories?about={guard}"),
            None,
        );
        check(
            listed["memories"].as_array().is_some_and(|m| m.len() == 1),
            "a kept observation lost after the restart",
        );

        covered.insert(("POST", "/api/agents/{key}/pause"));
        acknowledged(&server, "POST", "/api/agents/a/pause", None);
        server.kill();
        check(record_of(&db, "a").paused, "pause lost");
        server = Server::start(&dir);
        check(
            server.status("a")["paused"] == true,
            "pause lost after the restart",
        );

        covered.insert(("POST", "/api/agents/{key}/resume"));
        acknowledged(&server, "POST", "/api/agents/a/resume", None);
        server.kill();
        check(!record_of(&db, "a").paused, "unpause lost");
        server = Server::start(&dir);
        check(
            server.status("a")["paused"] == false,
            "unpause lost after the restart",
        );

        covered.insert(("POST", "/api/agents/{key}/halt"));
        acknowledged(&server, "POST", "/api/agents/a/halt", None);
        server.kill();
        check(
            record_of(&db, "a").state == AgentState::Stopped,
            "halt lost",
        );
        server = Server::start(&dir);
        check(
            server.state("a") == AgentState::Stopped,
            "halt lost after the restart",
        );

        acknowledged(&server, "POST", "/api/agents/a/resume", None);
        server.kill();
        check(
            record_of(&db, "a").state == AgentState::WaitingForEvent,
            "resume lost",
        );
        server = Server::start(&dir);
        check(
            server.state("a") == AgentState::WaitingForEvent,
            "resume lost after the restart",
        );

        covered.insert(("POST", "/api/halt"));
        acknowledged(&server, "POST", "/api/halt", None);
        server.kill();
        for agent in ["a", "b"] {
            let rec = record_of(&db, agent);
            check(
                rec.state == AgentState::Stopped && rec.fleet_halted,
                "fleet halt lost",
            );
        }
        server = Server::start(&dir);
        check(
            server.state("b") == AgentState::Stopped,
            "fleet halt lost after the restart",
        );

        covered.insert(("POST", "/api/resume"));
        acknowledged(&server, "POST", "/api/resume", None);
        server.kill();
        for agent in ["a", "b"] {
            check(
                record_of(&db, agent).state == AgentState::WaitingForEvent,
                "lift lost",
            );
        }
        server = Server::start(&dir);
        check(
            server.state("b") == AgentState::WaitingForEvent,
            "lift lost after the restart",
        );

        covered.insert(("POST", "/api/agents/{key}/events"));
        let content = format!("queued in round {round}");
        let body = serde_json::json!({ "content": content }).to_string();
        let queued = acknowledged(&server, "POST", "/api/agents/b/events", Some(&body));
        let id = queued["id"].as_u64().unwrap();
        server.kill();
        let rec = record_of(&db, "b");
        check(
            rec.pending.iter().any(|p| p.id == id)
                || rec
                    .history
                    .iter()
                    .any(|m| m.content.as_deref().is_some_and(|c| c.contains(&content))),
            "a 202 event lost",
        );
        server = Server::start(&dir);

        // The same route waiting for the answer: the answer sent means its turn is on disk (else
        // the restart would find the event pending and run it again, for an answer already sent).
        let content = format!("answered in round {round}");
        let body = serde_json::json!({ "content": content }).to_string();
        let answered = acknowledged(
            &server,
            "POST",
            "/api/agents/slow/events?wait=30",
            Some(&body),
        );
        assert_eq!(answered["status"], "answered", "{answered}");
        let id = answered["id"].as_u64().unwrap();
        server.kill();
        let rec = record_of(&db, "slow");
        check(
            !rec.pending.iter().any(|p| p.id == id),
            "an answered event is pending again: it would run twice",
        );
        let asked = rec
            .history
            .iter()
            .position(|m| m.content.as_deref().is_some_and(|c| c.contains(&content)));
        check(
            asked.is_some_and(|at| {
                rec.history[at + 1..]
                    .iter()
                    .any(|m| m.content.as_deref() == Some("answered"))
            }),
            "the answer sent is not on disk",
        );
        server = Server::start(&dir);

        covered.insert(("POST", "/api/agents/{key}/world"));
        let text = format!("psst, round {round}");
        let body = serde_json::json!({
            "speaker": {"id": "p1", "kind": "player"}, "kind": "whisper", "text": text
        })
        .to_string();
        let seen = acknowledged(&server, "POST", "/api/agents/b/world", Some(&body));
        let id = seen["id"].as_u64().expect("a whisper is a TRIGGER");
        server.kill();
        let rec = record_of(&db, "b");
        check(
            rec.pending.iter().any(|p| p.id == id)
                || rec
                    .history
                    .iter()
                    .any(|m| m.content.as_deref().is_some_and(|c| c.contains(&text))),
            "a queued world event lost",
        );
        server = Server::start(&dir);

        // A batch: both TRIGGERs acknowledged with the 200 are in the file at the kill.
        covered.insert(("POST", "/api/world/batch"));
        let texts = [
            format!("batched to a, round {round}"),
            format!("batched to b, round {round}"),
        ];
        let body = serde_json::json!({"events": [
            {"npc": "a", "speaker": {"id": "p1", "kind": "player"}, "kind": "whisper", "text": texts[0]},
            {"npc": "b", "speaker": {"id": "p1", "kind": "player"}, "kind": "whisper", "text": texts[1]},
        ]})
        .to_string();
        let seen = acknowledged(&server, "POST", "/api/world/batch", Some(&body));
        let ids: Vec<u64> = (0..2)
            .map(|i| {
                seen["results"][i]["id"]
                    .as_u64()
                    .expect("a whisper is a TRIGGER")
            })
            .collect();
        server.kill();
        for ((agent, id), text) in ["a", "b"].into_iter().zip(ids).zip(&texts) {
            let rec = record_of(&db, agent);
            check(
                rec.pending.iter().any(|p| p.id == id)
                    || rec
                        .history
                        .iter()
                        .any(|m| m.content.as_deref().is_some_and(|c| c.contains(text))),
                "a batched world event lost",
            );
        }
        server = Server::start(&dir);

        covered.insert(("POST", "/api/agents/{key}/history/reset"));
        wait_for("b answered", || {
            let s = server.status("b");
            s["history_len"].as_u64() > Some(0) && s["queued"]["ordinary"] == 0
        });
        wait_for("b idle", || {
            server.state("b") == AgentState::WaitingForEvent
        });
        acknowledged(&server, "POST", "/api/agents/b/history/reset", None);
        server.kill();
        check(record_of(&db, "b").history.is_empty(), "history reset lost");
        server = Server::start(&dir);
        check(
            server.status("b")["history_len"] == 0,
            "history reset lost after the restart",
        );

        covered.insert(("POST", "/api/agents/{key}/unlock"));
        lock_out(&server);
        acknowledged(&server, "POST", "/api/agents/down/unlock", None);
        server.kill();
        check(record_of(&db, "down").lockout.is_none(), "unlock lost");
        server = Server::start(&dir);
        check(
            server.state("down") == AgentState::WaitingForEvent,
            "unlock lost after the restart",
        );

        covered.insert(("POST", "/api/agents/{key}/emergency/clear"));
        if server.state("down") == AgentState::WaitingForEvent {
            lock_out(&server);
            acknowledged(&server, "POST", "/api/agents/down/emergency/clear", None);
            server.kill();
            check(
                record_of(&db, "down").lockout.is_none(),
                "emergency clear lost",
            );
            server = Server::start(&dir);
            check(
                server.state("down") == AgentState::WaitingForEvent,
                "emergency clear lost after the restart",
            );
        }
    }
    drop(server);
    assert!(
        lost.is_empty(),
        "acknowledged, killed, lost:\n{}",
        lost.join("\n")
    );
    for &(method, path) in warden::server::api::ROUTES {
        if method == "GET" || covered.contains(&(method, path)) {
            continue;
        }
        assert!(
            NOT_DURABLE_BY_DESIGN
                .iter()
                .any(|&(m, p, _)| (m, p) == (method, path)),
            "{method} {path} changes state: check that its 2xx survives a SIGKILL"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every reply and notice in `GET /api/replies` after `after` (long-polls until `until` holds).
fn replies_until(
    server: &Server,
    mut after: u64,
    until: impl Fn(&[serde_json::Value]) -> bool,
) -> (Vec<serde_json::Value>, u64) {
    let mut replies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http(
            server.port,
            "GET",
            &format!("/api/replies?after={after}&wait=5"),
            None,
        )
        .unwrap();
        assert_eq!(status, 200, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        replies.extend(body["replies"].as_array().unwrap().iter().cloned());
        after = body["next"].as_u64().unwrap();
        if until(&replies) {
            return (replies, after);
        }
        assert!(Instant::now() < deadline, "no such replies: {replies:?}");
    }
}

/// Issue 37 §2: `GET /api/replies` reads the journal, so a host that was told `next` before a
/// SIGKILL of warden reads the same replies with the same `seq` after the restart, and resumes
/// after `next` with nothing repeated and the new replies after it.
#[test]
fn replies_resume_after_a_sigkill_from_the_next_a_host_was_given() {
    let dir = temp_dir("replies", 0, ROUTES_TEAM);
    let server = Server::start(&dir);
    let whisper = |npc: &str, text: &str| {
        serde_json::json!({"npc": npc, "speaker": {"id": "p1", "kind": "player"},
            "kind": "whisper", "text": text})
    };
    let body =
        serde_json::json!({"events": [whisper("a", "one"), whisper("b", "two")]}).to_string();
    let seen = acknowledged(&server, "POST", "/api/world/batch", Some(&body));
    let ids: Vec<u64> = (0..2)
        .map(|i| seen["results"][i]["id"].as_u64().unwrap())
        .collect();
    let answered = |agent: &'static str, id: u64| {
        move |r: &serde_json::Value| {
            r["type"] == "reply" && r["agent"] == agent && r["event_id"] == id
        }
    };
    let (before, next) = replies_until(&server, 0, |r| {
        r.iter().any(answered("a", ids[0])) && r.iter().any(answered("b", ids[1]))
    });
    assert!(before
        .iter()
        .all(|r| r["status"] == "answered" || r["type"] != "reply"));
    server.kill();
    let server = Server::start(&dir);
    // The same replies, the same sequence numbers, from the file.
    let (again, _) = replies_until(&server, 0, |r| r.len() >= before.len());
    assert_eq!(again[..before.len()], before[..]);
    // After `next`: nothing repeated, and a reply journaled after the restart comes.
    let body = serde_json::json!({"events": [whisper("a", "three")]}).to_string();
    let seen = acknowledged(&server, "POST", "/api/world/batch", Some(&body));
    let id = seen["results"][0]["id"].as_u64().unwrap();
    let (after, _) = replies_until(&server, next, |r| r.iter().any(answered("a", id)));
    for reply in &after {
        assert!(reply["seq"].as_u64().unwrap() > next, "{reply}");
        assert!(
            !before.iter().any(|b| b["type"] == "reply"
                && b["event_id"] == reply["event_id"]
                && b["agent"] == reply["agent"]),
            "repeated after the restart: {reply}"
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 31 item 7, on a failing disk (an insert the journal cannot commit, as a full disk makes
/// it): goals the journal cannot write are answered `503 applied but not durable`, never `200`,
/// and the restarted process has the goals that were on disk.
#[test]
fn goals_the_journal_cannot_write_are_answered_503_not_200() {
    let dir = temp_dir("goals-full-disk", 0, ROUTES_TEAM);
    let db = dir.join("warden.db");
    let server = Server::start(&dir);
    let body = serde_json::json!({ "goals": ["on disk"] }).to_string();
    acknowledged(&server, "PUT", "/api/agents/a/goals", Some(&body));
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.body LIKE '%poison%'
             BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;",
        )
        .unwrap();
    let body = serde_json::json!({ "goals": ["poison"] }).to_string();
    let (status, answer) = http(server.port, "PUT", "/api/agents/a/goals", Some(&body)).unwrap();
    assert_eq!(status, 503, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        answer["error"],
        "applied but not durable: journal write failed: injected write failure"
    );
    server.kill();
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("DROP TRIGGER poison;")
        .unwrap();
    let server = Server::start(&dir);
    assert_eq!(server.status("a")["goals"], serde_json::json!(["on disk"]));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 31 item 9: a halt is acknowledged before its `messages_discarded` listing is written (so
/// the ack stays O(1) whatever the backlog). SIGKILLed right after the ack, the restart completes
/// what the crash cut: every user event the halt cleared is listed, by its id, exactly once.
#[test]
fn a_halts_listing_cut_by_a_sigkill_right_after_the_ack_is_completed_by_the_restart() {
    const SENDERS: usize = 8;
    const EACH: usize = 250;
    let dir = temp_dir("halt-listing", 0, TEAM);
    let db = dir.join("warden.db");
    let server = Server::start(&dir);
    acknowledged(&server, "POST", "/api/agents/a/pause", None);
    let mut ids: Vec<u64> = std::thread::scope(|scope| {
        let senders: Vec<_> = (0..SENDERS)
            .map(|t| {
                let port = server.port;
                scope.spawn(move || {
                    (0..EACH)
                        .map(|i| {
                            let body =
                                serde_json::json!({ "content": format!("m{t}-{i}") }).to_string();
                            let (status, answer) =
                                http(port, "POST", "/api/agents/a/events", Some(&body)).unwrap();
                            assert_eq!(status, 202, "{answer}");
                            let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
                            answer["id"].as_u64().unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        senders
            .into_iter()
            .flat_map(|s| s.join().unwrap())
            .collect()
    });
    ids.sort_unstable();
    let halted = acknowledged(&server, "POST", "/api/agents/a/halt", None);
    server.kill();
    assert_eq!(halted["halted"][0]["discarded"], SENDERS * EACH, "{halted}");
    let listed = |events: &[Event]| -> Vec<u64> {
        let mut listed: Vec<u64> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::MessagesDiscarded { messages } => Some(messages),
                _ => None,
            })
            .flatten()
            .filter_map(|m| m.queued)
            .collect();
        listed.sort_unstable();
        listed
    };
    let at_kill = listed(&events_of(&db, "a")).len();
    eprintln!("listed at the kill: {at_kill} of {}", ids.len());

    let server = Server::start(&dir);
    assert_eq!(server.state("a"), AgentState::Stopped);
    drop(server);
    assert_eq!(
        listed(&events_of(&db, "a")),
        ids,
        "every cleared event listed once (at the kill: {at_kill})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 31 item 8: `safety.budget.tokens_per_hour` is not refilled by a restart. One call spends
/// the hour's budget; after each of three SIGKILLs and restarts (a crash loop) the next event waits
/// for the window instead of calling the model: the restored window comes from the journal's
/// `usage_recorded` times.
#[test]
fn the_rolling_token_budget_is_not_refilled_by_restarts() {
    let team = r#"
[safety.budget]
tokens_per_hour = 1

[providers.scripted]
kind = "scripted"
replies = ["spent"]

[[agents]]
key = "a"
provider = "scripted"
"#;
    let dir = temp_dir("hourly-after-kill", 0, team);
    let db = dir.join("warden.db");
    let mut server = Server::start(&dir);
    let body = serde_json::json!({ "content": "spend it" }).to_string();
    let answered = acknowledged(&server, "POST", "/api/agents/a/events?wait=30", Some(&body));
    assert_eq!(answered["status"], "answered", "{answered}");
    let spent = server.status("a")["tokens_used"].as_u64().unwrap();
    assert!(spent > 0);
    for restart in 0..3 {
        wait_for("usage committed", || {
            record_of(&db, "a").usage.tokens() == spent
        });
        server.kill();
        server = Server::start(&dir);
        assert_eq!(server.send("a", &format!("after restart {restart}")), 202);
        // Either the agent waits for its window, or it called the model again.
        wait_for("the event taken", || {
            let s = server.status("a");
            !s["budget_wait_until_ms"].is_null() || s["tokens_used"].as_u64() != Some(spent)
        });
        let status = server.status("a");
        assert_eq!(
            status["tokens_used"].as_u64(),
            Some(spent),
            "restart {restart}: the model was called again within the hour: {status}"
        );
        assert!(!status["budget_wait_until_ms"].is_null(), "{status}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One JSON-RPC message to `POST /mcp` (with the session, once there is one): the status, the
/// `Mcp-Session-Id` the answer carries (at `initialize`) and the body as JSON.
fn mcp(
    port: u16,
    session: Option<&str>,
    message: &serde_json::Value,
) -> (u16, Option<String>, serde_json::Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(40)))
        .unwrap();
    let body = message.to_string();
    let session = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         {session}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let session = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("mcp-session-id")
            .then(|| value.trim().to_owned())
    });
    (
        status,
        session,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

/// An MCP session on `/mcp` (admin token), initialized.
fn mcp_session(port: u16) -> String {
    let (status, session, answer) = mcp(
        port,
        None,
        &serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": "2025-03-26",
                "capabilities": {},
                "clientInfo": {"name": "crash-test", "version": "0"}
            }
        }),
    );
    assert_eq!(status, 200, "{answer}");
    let session = session.expect("a session id");
    let (status, _, _) = mcp(
        port,
        Some(&session),
        &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert!((200..300).contains(&status), "initialized: {status}");
    session
}

/// A `tools/call` on the session: the call's `structuredContent`, after asserting it succeeded.
fn mcp_call(port: u16, session: &str, tool: &str, args: serde_json::Value) -> serde_json::Value {
    let (status, _, answer) = mcp(
        port,
        Some(session),
        &serde_json::json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": args}
        }),
    );
    assert_eq!(status, 200, "{answer}");
    assert_ne!(answer["result"]["isError"], true, "{tool}: {answer}");
    answer["result"]["structuredContent"].clone()
}

/// Issue 31 item 7, over `/mcp`: what its tools acknowledge is on disk when the answer leaves —
/// `ask_agent`'s answer (its turn), `halt` and `halt_all` — SIGKILLed right after each, three
/// rounds.
#[test]
fn every_state_change_acknowledged_over_mcp_survives_a_sigkill_right_after_it() {
    let dir = temp_dir("mcp-tools", 0, ROUTES_TEAM);
    let db = dir.join("warden.db");
    let mut lost: Vec<String> = Vec::new();
    let mut server = Server::start(&dir);
    for round in 0..3 {
        let mut check = |held: bool, step: &str| {
            if !held {
                lost.push(format!("round {round}: {step}"));
            }
        };
        let session = mcp_session(server.port);
        let content = format!("asked over mcp in round {round}");
        let fate = mcp_call(
            server.port,
            &session,
            "ask_agent",
            serde_json::json!({"agent": "slow", "content": content, "wait_s": 30}),
        );
        assert_eq!(fate["status"], "answered", "{fate}");
        server.kill();
        let rec = record_of(&db, "slow");
        let asked = rec
            .history
            .iter()
            .position(|m| m.content.as_deref().is_some_and(|c| c.contains(&content)));
        check(
            asked.is_some_and(|at| {
                rec.history[at + 1..]
                    .iter()
                    .any(|m| m.content.as_deref() == Some("answered"))
            }),
            "ask_agent's answer is not on disk",
        );
        server = Server::start(&dir);

        let session = mcp_session(server.port);
        mcp_call(
            server.port,
            &session,
            "halt",
            serde_json::json!({"agent": "a"}),
        );
        server.kill();
        check(
            record_of(&db, "a").state == AgentState::Stopped,
            "halt lost",
        );
        server = Server::start(&dir);
        acknowledged(&server, "POST", "/api/agents/a/resume", None);

        let session = mcp_session(server.port);
        mcp_call(server.port, &session, "halt_all", serde_json::json!({}));
        server.kill();
        check(
            record_of(&db, "b").state == AgentState::Stopped,
            "halt_all lost",
        );
        server = Server::start(&dir);
        acknowledged(&server, "POST", "/api/resume", None);
    }
    drop(server);
    assert!(
        lost.is_empty(),
        "acknowledged, killed, lost:\n{}",
        lost.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
