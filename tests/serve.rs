//! `warden serve` as a real process: what it refuses to start on, and how it stops.
//!
//! * A second server on the same journal exits non-zero at once, naming the first one's pid, and
//!   leaves the file alone; `warden journal tail` still reads it beside the running server.
//! * A journal with 8 KiB scribbled into it is refused with one line saying how to recover.
//! * A zero-length journal starts fresh, and says so.
//! * SIGTERM with a connected event-stream client ends the process (hang guard, not a timing claim).
//! * SIGTERM during a turn, three times: a clean stop, never a crash (nothing journaled as one, no
//!   error logged, no error counted toward a lockout).
//! * Tokens from the environment are validated like the team file's.
//! * `warden events --follow` outlives a SIGKILL of the server: it reconnects with the last seq it
//!   printed and shows every event once, in order, across the restart.
//! * Controls do not queue behind ordinary work (issue 31, item 4): with an agent working through a
//!   backlog while 8 clients flood it, `POST …/resume` is answered while most of the backlog is still
//!   queued, and so is a halt of another agent on the same arbiter thread.
//!
//! Waits poll with a deadline; nothing asserts a duration.
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};
use warden::{journal::SqliteJournal, AgentKey, EventKind, Journal};
use warden_testkit::{free_port, Serve};

const TOKEN: &str = "serve-test-token";

const TEAM: &str = r#"
[providers.scripted]
kind = "scripted"
replies = ["one"]
cycle = true

[[agents]]
key = "a"
provider = "scripted"
"#;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warden-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("team.toml"), TEAM).unwrap();
    dir
}

fn serve_command(dir: &Path, db: &Path, port: u16) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_warden"));
    command
        .args(["serve", "--config"])
        .arg(dir.join("team.toml"))
        .arg("--db")
        .arg(db)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("WARDEN_ADMIN_TOKEN", TOKEN)
        .env_remove("WARDEN_READ_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// Whether `GET /healthz` on 127.0.0.1:`port` answers 200.
fn healthy(port: u16) -> bool {
    matches!(
        warden_testkit::blocking_request(port, "GET", "/healthz", "", None),
        Ok((200, _))
    )
}

/// `warden serve` of `DIR/team.toml` on `db` ([`warden_testkit::Serve`]).
fn start(dir: &Path, db: &Path) -> Serve {
    start_on(dir, db, free_port())
}

/// [`start`] on `port`.
fn start_on(dir: &Path, db: &Path, port: u16) -> Serve {
    Serve::command(env!("CARGO_BIN_EXE_warden"))
        .config(dir.join("team.toml"))
        .db(db)
        .port(port)
        .admin_token(TOKEN)
        .log(dir.join(format!("serve-{port}.log")))
        .start()
}

/// Runs `command` to its end, killing it after `limit` (a hang guard).
fn run_bounded(mut command: Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start warden");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!(
                "warden did not exit within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

fn journal_events(db: &Path) -> Vec<warden::Event> {
    warden::journal::JournalReader::open(db)
        .unwrap()
        .events()
        .unwrap()
}

fn event_count(db: &Path) -> usize {
    journal_events(db).len()
}

/// The highest seq in the journal at `db` (read beside the running server).
fn last_seq(db: &Path) -> u64 {
    journal_events(db).last().map_or(0, |e| e.seq)
}

#[test]
fn a_second_server_on_the_same_journal_is_refused_and_the_journal_stays_readable() {
    let dir = temp_dir("two");
    let db = dir.join("warden.db");
    let first = start(&dir, &db);
    // The first server's `spawned` event reaches the file within the writer's linger (2 ms).
    let deadline = Instant::now() + Duration::from_secs(10);
    while event_count(&db) == 0 {
        assert!(
            Instant::now() < deadline,
            "the first server journaled nothing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = event_count(&db);
    let pid = first.pid();

    let output = run_bounded(
        serve_command(&dir, &db, free_port()),
        Duration::from_secs(10),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the second server must fail");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: journal {} is in use by another warden (pid {pid})",
            db.display()
        )
    );
    assert_eq!(event_count(&db), before, "the second server wrote nothing");

    // Read-only inspection still works beside the running server.
    for args in [&["tail"][..], &["export", "--json"], &["show", "a"]] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_warden"));
        command.arg("journal").arg("--db").arg(&db).args(args);
        let output = run_bounded(command, Duration::from_secs(10));
        assert!(
            output.status.success(),
            "journal {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    assert!(healthy(first.port()), "the first server still serves");
    drop(first);

    // Once the first is gone, the lock is free again (a SIGKILL releases it too).
    let again = start(&dir, &db);
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_journal_is_refused_with_one_line_on_how_to_recover() {
    let dir = temp_dir("damaged");
    let db = dir.join("warden.db");
    {
        let journal = SqliteJournal::open(&db).unwrap();
        let agent = AgentKey::new("a");
        for i in 0..2000 {
            journal.append(
                &agent,
                EventKind::SafetyAlert {
                    message: format!("alert {i} with some text to fill pages"),
                },
            );
        }
        journal.close();
    }
    // 8 KiB of noise over pages 3 and 4.
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 16 * 1024, "{} bytes", bytes.len());
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for byte in &mut bytes[8192..16384] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = (x >> 24) as u8;
    }
    std::fs::write(&db, &bytes).unwrap();

    let output = run_bounded(
        serve_command(&dir, &db, free_port()),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "serve must refuse: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let shown = db.display().to_string();
    assert!(
        stderr.starts_with(&format!("error: journal {shown} is damaged (")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("sqlite3 {shown} .recover | sqlite3 recovered.db")),
        "{stderr}"
    );
    assert!(stderr.contains("VACUUM INTO"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_zero_length_journal_starts_fresh_and_says_so() {
    let dir = temp_dir("empty");
    let db = dir.join("warden.db");
    std::fs::write(&db, b"").unwrap();
    let port = free_port();
    let mut child = serve_command(&dir, &db, port)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start warden serve");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let first = lines.next().unwrap().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        first,
        format!(
            "warden: journal {} was an empty file (0 bytes): starting a fresh journal",
            db.display()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_ends_the_server_while_an_event_stream_is_open() {
    let dir = temp_dir("sigterm");
    let db = dir.join("warden.db");
    let mut server = start(&dir, &db);
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /api/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains(": warden events") {
        let n = stream.read(&mut buf).expect("the stream's first chunk");
        assert!(n > 0, "the stream closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    server.signal("TERM");
    // A hang guard, not a timing claim: before the fix it took the 30 s shutdown timeout.
    let status = server.wait_for_exit(Duration::from_secs(10));
    assert!(status.is_some(), "warden serve still runs after SIGTERM");
    // The stream was ended, not cut: the chunked body's last chunk arrived.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    seen.extend_from_slice(&rest);
    assert!(
        String::from_utf8_lossy(&seen).ends_with("0\r\n\r\n"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The crash-like events a clean stop must not journal: `crashed`, `restarted`, `error_counted`.
fn crash_events(db: &Path) -> Vec<String> {
    journal_events(db)
        .into_iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::Crashed { .. }
                    | EventKind::Restarted { .. }
                    | EventKind::ErrorCounted { .. }
            )
        })
        .map(|e| format!("{} {:?}", e.seq, e.kind))
        .collect()
}

/// Three times: `warden serve` with a turn in flight (a 60 s model), SIGTERM, the process waited
/// for. A clean stop is no crash: exit 0, no `ERROR … agent actor crashed` on standard error, no
/// `crashed`, `restarted` or `error_counted` in the journal, and the agent is not locked out after
/// the third (each stop used to count an error for the turn it cut).
#[test]
fn a_sigterm_during_a_turn_is_a_clean_stop_not_a_crash() {
    let dir = temp_dir("sigterm-turn");
    std::fs::write(
        dir.join("team.toml"),
        TEAM.replace("cycle = true", "cycle = true\nlatency_ms = 60000"),
    )
    .unwrap();
    let db = dir.join("warden.db");
    for round in 1..=3 {
        let mut server = start(&dir, &db);
        let port = server.port();
        let (status, body) = warden_testkit::blocking_request(
            port,
            "POST",
            "/api/agents/a/events",
            TOKEN,
            Some(r#"{"content":"think long"}"#),
        )
        .unwrap_or_default();
        assert_eq!(status, 202, "{body}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, body) =
                warden_testkit::blocking_request(port, "GET", "/api/agents/a", TOKEN, None)
                    .unwrap_or_default();
            if body.contains(r#""state":"EXECUTING""#) {
                break;
            }
            assert!(Instant::now() < deadline, "no turn in flight: {body}");
            std::thread::sleep(Duration::from_millis(20));
        }
        server.signal("TERM");
        let status = server.wait_for_exit(Duration::from_secs(20));
        let stderr = server.log_text();
        assert!(
            status.is_some_and(|s| s.success()),
            "round {round}: {status:?}: {stderr}"
        );
        assert!(
            !stderr.contains("agent actor crashed") && !stderr.contains("ERROR"),
            "round {round}: a clean stop logged an error: {stderr}"
        );
        let crashes = crash_events(&db);
        assert!(
            crashes.is_empty(),
            "round {round}: a clean stop journaled {crashes:?}"
        );
    }
    let record = warden::journal::JournalReader::open(&db)
        .unwrap()
        .restore_records()
        .unwrap()
        .into_iter()
        .find(|r| r.key.as_str() == "a")
        .expect("a's record");
    assert_eq!(record.consecutive_errors, 0);
    assert!(record.lockout.is_none(), "{:?}", record.lockout);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tokens_from_the_environment_are_validated_like_the_files() {
    let dir = temp_dir("env-tokens");
    let db = dir.join("warden.db");
    let cases: [(&[(&str, &str)], &str); 3] = [
        (
            &[("WARDEN_ADMIN_TOKEN", " padded ")],
            "error: WARDEN_ADMIN_TOKEN: must not start or end with whitespace",
        ),
        (
            &[("WARDEN_ADMIN_TOKEN", "adm"), ("WARDEN_READ_TOKEN", "rd\n")],
            "error: WARDEN_READ_TOKEN: must not start or end with whitespace",
        ),
        (
            &[
                ("WARDEN_ADMIN_TOKEN", "same"),
                ("WARDEN_READ_TOKEN", "same"),
            ],
            "error: WARDEN_READ_TOKEN: must differ from WARDEN_ADMIN_TOKEN",
        ),
    ];
    for (env, expected) in cases {
        let mut command = serve_command(&dir, &db, free_port());
        command.env_remove("WARDEN_ADMIN_TOKEN");
        for (name, value) in env {
            command.env(name, value);
        }
        let output = run_bounded(command, Duration::from_secs(10));
        assert!(!output.status.success(), "{env:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stderr).trim_end(),
            expected,
            "{env:?}"
        );
    }
    assert!(!db.exists(), "refused before the journal was touched");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `warden send a TEXT` against the server on `port`; panics unless the agent answered.
fn send(port: u16, text: &str) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_warden"));
    command
        .args([
            "send",
            "a",
            text,
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ])
        .env("WARDEN_ADMIN_TOKEN", TOKEN);
    let output = run_bounded(command, Duration::from_secs(30));
    assert!(
        output.status.success(),
        "warden send: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Issue 12: `warden events --follow` prints the last events, then new ones; when the server is
/// SIGKILLed and started again it reconnects with `Last-Event-ID` and goes on, so across the kill
/// every journal event is printed exactly once, in order.
#[test]
fn warden_events_follows_the_stream_across_a_server_kill() {
    let dir = temp_dir("events-follow");
    let db = dir.join("warden.db");
    let port = free_port();
    let mut server = start_on(&dir, &db, port);
    send(port, "before");

    let mut follower = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["events", "--follow", "--json", "--last", "1000"])
        .args(["--url", &format!("http://127.0.0.1:{port}")])
        .env("WARDEN_READ_TOKEN", TOKEN)
        .env_remove("WARDEN_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start warden events");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seqs = Vec::new();
    // Reads printed events until the journal's last seq has been printed.
    let mut read_through = |seqs: &mut Vec<u64>, last: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while seqs.last().is_none_or(|&s| s < last) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = lines.recv_timeout(left) else {
                let _ = follower.kill();
                let mut stderr = String::new();
                let _ = follower
                    .stderr
                    .take()
                    .map(|mut e| e.read_to_string(&mut stderr));
                panic!("warden events stopped before seq {last}: {seqs:?}; stderr: {stderr}");
            };
            let value: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
            if let Some(seq) = value["seq"].as_u64() {
                seqs.push(seq);
            }
        }
    };
    read_through(&mut seqs, last_seq(&db));
    // Live: these come over the open stream, not from the listing.
    send(port, "during");
    let last_before = last_seq(&db);
    read_through(&mut seqs, last_before);

    server.kill();
    let restarted = start_on(&dir, &db, port);
    send(port, "after");
    let last_after = last_seq(&db);
    assert!(last_after > last_before);
    read_through(&mut seqs, last_after);

    let _ = follower.kill();
    let output = follower.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("reconnecting"), "{stderr}");
    let expected: Vec<u64> = (1..=last_after).collect();
    assert_eq!(seqs, expected, "every event once, in order");
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13: with the port in use, `warden serve` fails before it touches the journal: no journal
/// file, no lock file.
#[test]
fn a_port_in_use_fails_before_the_journal_is_touched() {
    let dir = temp_dir("port-in-use");
    let db = dir.join("warden.db");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let output = run_bounded(serve_command(&dir, &db, port), Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let prefix = format!("error: cannot listen on 127.0.0.1:{port}: ");
    assert!(
        stderr.starts_with(&prefix) && stderr.lines().count() == 1,
        "{stderr}"
    );
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["team.toml"], "the journal was touched");
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13: without a token `warden serve` says that only `/healthz` is reachable and how to set
/// one; it warns about agents the journal holds and the team file does not define.
#[test]
fn serve_says_when_no_token_is_set_and_warns_of_agents_not_in_the_team() {
    let dir = temp_dir("no-token");
    let db = dir.join("warden.db");
    {
        let journal = SqliteJournal::open(&db).unwrap();
        for ghost in ["ghost", "a", "banshee"] {
            journal.append(
                &AgentKey::new(ghost),
                EventKind::Spawned {
                    role: warden::AgentRole::Assistant,
                    parent: None,
                    max_consecutive_errors: 5,
                },
            );
        }
        journal.close();
    }
    let port = free_port();
    let mut command = serve_command(&dir, &db, port);
    command
        .env_remove("WARDEN_ADMIN_TOKEN")
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("start warden serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !healthy(port) {
        assert!(Instant::now() < deadline, "warden serve did not come up");
        assert!(child.try_wait().unwrap().is_none(), "warden serve exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.contains(
            &format!(
                "warden: warning: journal {} holds agents the team file does not define: banshee, \
             ghost (they are not started; their events stay in the journal)",
                db.display()
            )
            .as_str()
        ),
        "{stderr}"
    );
    assert!(
        lines.contains(
            &"warden: no token configured: only GET /healthz is reachable. To use the API and the \
              CLI, set WARDEN_ADMIN_TOKEN (and optionally WARDEN_READ_TOKEN) in the environment, \
              or api.admin_token in the team file's [api] section"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two agents on one arbiter thread, whose turns never wait for anything (the scripted model
/// answers at once): a backlog keeps that thread busy turn after turn. No token budget (it would
/// stop the agent part-way), and a context window that keeps each turn's prompt small.
const BUSY_TEAM: &str = r#"
[supervisor]
arbiters = 1

[safety.budget]
tokens_per_agent = 0

[execution]
max_context_tokens = 4000

[memory]
compaction = false

[providers.scripted]
kind = "scripted"
replies = ["one"]
cycle = true

[[agents]]
key = "a"
provider = "scripted"

[[agents]]
key = "b"
provider = "scripted"
"#;

/// Events queued in the journal before the server starts: a backlog the agent needs seconds for.
const BACKLOG: u64 = 20_000;

/// A journal at `db` in which agent `a` is paused with [`BACKLOG`] events queued — what a flood
/// leaves behind while an agent is paused, written directly (20,000 requests would take the test
/// longer than the rest of it).
fn paused_with_backlog(db: &Path) {
    let journal = SqliteJournal::open(db).unwrap();
    let a = AgentKey::new("a");
    journal.append(
        &a,
        EventKind::Spawned {
            role: warden::AgentRole::Assistant,
            parent: None,
            max_consecutive_errors: 5,
        },
    );
    journal.append(
        &a,
        EventKind::Paused {
            operator: "test".into(),
        },
    );
    let queued = (1..=BACKLOG).map(|id| EventKind::EventQueued {
        id,
        event: std::sync::Arc::new(warden::UserEvent::new(format!("backlog {id}"))),
    });
    journal.append_all(&a, queued.collect());
    journal.close();
}

/// `GET /api/agents/{key}`: the agent's status.
fn agent_status(port: u16, key: &str) -> warden::AgentStatus {
    let (status, body) =
        warden_testkit::blocking_request(port, "GET", &format!("/api/agents/{key}"), TOKEN, None)
            .expect("GET the agent");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("an agent status")
}

/// `clients` threads that post events to `a` as fast as they are answered, until `stop`.
fn flood(
    port: u16,
    clients: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    use std::sync::atomic::Ordering;
    (0..clients)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut accepted = 0;
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let body = format!(r#"{{"content": "flood {i} {n}"}}"#);
                    let sent = warden_testkit::blocking_request(
                        port,
                        "POST",
                        "/api/agents/a/events",
                        TOKEN,
                        Some(&body),
                    );
                    if matches!(sent, Ok((202, _))) {
                        accepted += 1;
                    }
                }
                accepted
            })
        })
        .collect()
}

/// Issue 31, item 4: a resume applied at once was answered only when the agent's backlog was done
/// — never, while a flood kept it fed. The control was applied by the agent's actor, but its
/// answer waited for durability in a task on the agent's arbiter thread, and actix polls an actor
/// that has work turn after turn without letting that thread run anything else. Now the answer
/// leaves the actor the moment the control is applied and the caller waits for durability.
///
/// Without the fix the resume was answered after the whole backlog ran (`queued.ordinary` 0 in
/// its answer, or no answer within the client's 20 s). Nothing here measures a duration: the
/// answer's own status says how much was still queued when it was given.
#[test]
fn a_resume_is_answered_while_the_agent_it_resumed_works_through_a_flood() {
    use std::sync::{atomic::AtomicBool, atomic::Ordering, Arc};
    let dir = temp_dir("resume-flood");
    std::fs::write(dir.join("team.toml"), BUSY_TEAM).unwrap();
    let db = dir.join("warden.db");
    paused_with_backlog(&db);
    let server = start(&dir, &db);
    let port = server.port();
    assert!(agent_status(port, "a").paused);

    let stop = Arc::new(AtomicBool::new(false));
    let flooders = flood(port, 8, &stop);
    warden_testkit::wait_until("the flood is accepted", Duration::from_secs(20), || {
        agent_status(port, "a").queued.ordinary as u64 > BACKLOG
    });
    let answer =
        warden_testkit::blocking_request(port, "POST", "/api/agents/a/resume", TOKEN, None);
    stop.store(true, Ordering::Relaxed);
    let accepted: u64 = flooders.into_iter().map(|f| f.join().unwrap()).sum();
    let (status, body) = answer.expect("POST /api/agents/a/resume got no answer within 20 s");
    assert_eq!(status, 200, "{body}");
    let resumed: warden::AgentStatus = serde_json::from_str(&body).expect("an agent status");
    assert!(!resumed.paused, "{body}");
    assert!(accepted > 0, "the flood was never accepted");
    assert!(
        resumed.queued.ordinary as u64 >= BACKLOG / 2,
        "the resume was answered only after {} turns, with {} events left queued: it waited \
         behind the agent's work; {body}",
        resumed.turns,
        resumed.queued.ordinary
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 31, item 4, the other half: a flooded agent kept its arbiter thread from the other agents
/// on it — actix polls an actor's context until it has nothing left to do, and a turn that waits
/// for nothing ends in the poll that started it and starts the next — so `POST …/b/halt` for an
/// agent sharing that thread was acted on only when the flooded agent's backlog was done. Now a
/// busy agent yields the thread between turns once its cooperative budget is spent.
///
/// Without the fix the halt of `b` got no answer within the client's 20 s (or one only once `a`'s
/// backlog was gone). Nothing here measures a duration.
#[test]
fn a_halt_of_another_agent_on_the_flooded_agents_thread_is_answered_during_the_flood() {
    use std::sync::{atomic::AtomicBool, atomic::Ordering, Arc};
    let dir = temp_dir("halt-beside-flood");
    std::fs::write(dir.join("team.toml"), BUSY_TEAM).unwrap();
    let db = dir.join("warden.db");
    paused_with_backlog(&db);
    let server = start(&dir, &db);
    let port = server.port();

    let stop = Arc::new(AtomicBool::new(false));
    let flooders = flood(port, 8, &stop);
    warden_testkit::wait_until("the flood is accepted", Duration::from_secs(20), || {
        agent_status(port, "a").queued.ordinary as u64 > BACKLOG
    });
    let resume =
        warden_testkit::blocking_request(port, "POST", "/api/agents/a/resume", TOKEN, None);
    let halt = warden_testkit::blocking_request(port, "POST", "/api/agents/b/halt", TOKEN, None);
    let a = agent_status(port, "a");
    stop.store(true, Ordering::Relaxed);
    for flooder in flooders {
        flooder.join().unwrap();
    }
    let (status, body) = resume.expect("POST /api/agents/a/resume got no answer within 20 s");
    assert_eq!(status, 200, "{body}");
    let (status, body) = halt.expect("POST /api/agents/b/halt got no answer within 20 s");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""state":"STOPPED""#), "{body}");
    assert_eq!(agent_status(port, "b").state, warden::AgentState::Stopped);
    assert!(
        a.queued.ordinary as u64 >= BACKLOG / 2,
        "b's halt was answered only after a ran {} turns, with {} events left queued: it waited \
         behind a's work",
        a.turns,
        a.queued.ordinary
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
