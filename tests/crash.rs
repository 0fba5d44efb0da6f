//! The crash test: `warden serve` as a child process on a journal file, killed with SIGKILL at a
//! seed-chosen point while it works, then started again on the same file. A halt acknowledged before
//! the kill is never lost, the halted agent refuses work after the restart, and no agent is left stuck
//! in a mid-turn state.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use warden::{journal::JournalReader, AgentState, EventKind, HaltCause};

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
        self.next() % n
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request; returns the status code and the body.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_warden"))
            .args(["serve", "--config"])
            .arg(dir.join("team.toml"))
            .arg("--db")
            .arg(dir.join("warden.db"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("WARDEN_ADMIN_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start warden serve");
        let server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if matches!(http(port, "GET", "/healthz", None), Ok((200, _))) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("warden serve did not come up on port {port}");
    }

    fn state(&self, agent: &str) -> AgentState {
        let (status, body) = http(self.port, "GET", &format!("/api/agents/{agent}"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        serde_json::from_value(value["state"].clone()).unwrap()
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
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_dir(seed: u64) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warden-crash-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("team.toml"), TEAM).unwrap();
    dir
}

fn crash_and_restart(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let dir = temp_dir(seed);
    let server = Server::start(&dir);

    // Some work for both agents, then an acknowledged halt of `a`, then more work for `b` while
    // the process is killed at a seed-chosen moment.
    for i in 0..rng.below(20) {
        server.send("a", &format!("a{i}"));
        server.send("b", &format!("b{i}"));
    }
    let (status, body) = http(server.port, "POST", "/api/agents/a/halt", None).unwrap();
    assert_eq!(status, 200, "seed {seed}: {body}");
    let burst = rng.below(30);
    for i in 0..burst {
        server.send("b", &format!("late{i}"));
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
    drop(reader);

    // Restart on the same file: `a` is still STOPPED and refuses work; `b` is not stuck mid-turn.
    let server = Server::start(&dir);
    assert_eq!(server.state("a"), AgentState::Stopped, "seed {seed}");
    assert_eq!(server.send("a", "admin:unlock"), 409, "seed {seed}");
    let b = server.state("b");
    assert!(!b.is_busy(), "seed {seed}: b restored mid-turn in {b:?}");
    let turns = |server: &Server| {
        let (_, body) = http(server.port, "GET", "/api/agents/b", None).unwrap();
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        value["turns"].as_u64().unwrap()
    };
    let before = turns(&server);
    assert_eq!(server.send("b", "after restart"), 202, "seed {seed}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while turns(&server) <= before {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: b never took work after the restart"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_loses_no_acknowledged_halt_and_the_halted_agent_stays_stopped() {
    for seed in [1, 2, 3, 4, 5] {
        crash_and_restart(seed);
    }
}
