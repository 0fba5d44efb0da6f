mod common;
use common::*;
use warden::*;

#[actix_rt::test]
async fn an_event_gets_an_answer() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = model([ScriptStep::reply("hello")]);
    let a = team.assistant("a", model);
    a.try_send_event(UserEvent::new("hi")).unwrap();
    until("turn finished", || a.status().turns == 1).await;
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    let rec = a.record();
    assert_eq!(rec.history.len(), 2);
    assert_eq!(AgentRecord::replay("a".into(), &journal.events()), rec);
}

/// The README's embedding example (`examples/embed.rs`, built by `cargo test` with the other
/// examples) runs and prints the smith's answer.
#[test]
fn the_embedding_example_prints_the_answer() {
    let stdout = run_example("embed");
    assert!(
        stdout.contains("innkeeper (event 1,") && stdout.contains("The smith says 40 gold."),
        "{stdout}"
    );
    assert!(
        stdout.contains("innkeeper: STOPPED") && stdout.contains("smith: STOPPED"),
        "{stdout}"
    );
}

/// The host handle's frame loop (`examples/host_loop.rs`) runs on a plain thread: the NPCs answer,
/// the reply from before the halt is dropped as stale, and nothing stays unanswered.
#[test]
fn the_frame_loop_example_drops_the_stale_reply() {
    let stdout = run_example("host_loop");
    assert!(
        stdout.contains("smith says: Swords are 40 gold.")
            && stdout.contains("baker says: Fresh bread, 2 silver."),
        "{stdout}"
    );
    assert!(
        stdout.contains("from before the halt (epoch 0), dropped"),
        "{stdout}"
    );
    assert!(stdout.contains("; 0 unanswered"), "{stdout}");
}

/// The async host (`examples/tokio_host.rs`): three connection tasks each get the baker's answer
/// to their own event, routed by event id.
#[test]
fn the_tokio_host_example_routes_replies_by_event_id() {
    let stdout = run_example("tokio_host");
    for player in ["p1", "p2", "p3"] {
        assert!(
            stdout.contains(&format!(
                "{player} hears: baker says: Fresh bread, 2 silver."
            )),
            "{stdout}"
        );
    }
}

/// The MUD's benchmark (`examples/mud`), briefly: the JSON report has the keys of its contract,
/// the halt started no model call and spent no token, and the tick never waited on a model.
#[cfg(feature = "server")]
#[test]
fn the_mud_benchmark_reports_its_json_contract() {
    let stdout = run_example_with(
        "mud",
        &[
            "bench",
            "--players",
            "8",
            "--npcs",
            "10",
            "--seconds",
            "2",
            "--seed",
            "3",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    for key in [
        "/baseline/ticks",
        "/baseline/tick_us/p50",
        "/baseline/tick_us/p99",
        "/baseline/tick_us/p999",
        "/baseline/tick_us/max",
        "/baseline/ticks_over_50ms",
        "/agents/ticks",
        "/agents/tick_us/p99",
        "/agents/ticks_over_50ms",
        "/agents/npc_replies",
        "/agents/reply_ms/p50",
        "/agents/reply_ms/p99",
        "/agents/llm_calls",
        "/agents/llm_calls_dropped",
        "/agents/tokens",
        "/agents/classified/trigger",
        "/agents/classified/context",
        "/agents/classified/capture",
        "/agents/classified/ignore",
        "/agents/host_call_us/p50",
        "/agents/host_call_us/p99",
        "/agents/host_call_us/max",
        "/halt/llm_calls_started_after_halt",
        "/halt/inflight_aborted_ms_max",
        "/halt/tokens_after_halt",
        "/halt/quiet_ms",
        "/memory/bytes_per_npc",
    ] {
        assert!(
            report.pointer(key).is_some_and(|v| v.is_number()),
            "{key} in {report}"
        );
    }
    assert!(report["agents"]["ticks"].as_u64() > Some(10), "{report}");
    assert_eq!(
        report["halt"]["llm_calls_started_after_halt"], 0,
        "{report}"
    );
    assert_eq!(report["halt"]["tokens_after_halt"], 0, "{report}");
}

/// A person can join the MUD with `nc`: it prints where, and answers `look` over TCP.
#[cfg(feature = "server")]
#[test]
fn a_player_joins_the_mud_over_tcp() {
    use std::io::{BufRead, BufReader, Write};
    let mut child = std::process::Command::new(example_path("mud"))
        .args(["serve", "--port", "0", "--npcs", "4"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("mud serve");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut banner = String::new();
    out.read_line(&mut banner).expect("the banner");
    let port = banner
        .rsplit(' ')
        .next()
        .and_then(|p| p.trim().parse::<u16>().ok())
        .unwrap_or_else(|| panic!("no port in {banner:?}"));
    let socket = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut lines = BufReader::new(socket.try_clone().expect("clone"));
    (&socket).write_all(b"look\nquit\n").expect("send");
    let mut seen = Vec::new();
    let mut line = String::new();
    while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
        seen.push(std::mem::take(&mut line));
        if seen.last().is_some_and(|l| l.starts_with("Bye.")) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().any(|l| l.starts_with("Welcome, p1.")),
        "{seen:?}"
    );
    let looks = seen
        .iter()
        .filter(|l| l.starts_with("You are in room-01."))
        .count();
    assert_eq!(looks, 2, "one on joining, one for `look`: {seen:?}");
    assert!(
        seen.iter().any(|l| l.contains("NPCs here: npc001.")),
        "{seen:?}"
    );
}

/// A `mud serve` process, killed when dropped (a failed assertion included).
#[cfg(feature = "server")]
struct Mud {
    child: std::process::Child,
    port: u16,
}

#[cfg(feature = "server")]
impl Drop for Mud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mud serve` on a free port with `args` added.
#[cfg(feature = "server")]
fn mud_serve(args: &[&str]) -> Mud {
    use std::io::BufRead;
    let mut child = std::process::Command::new(example_path("mud"))
        .args(["serve", "--port", "0", "--npcs", "4"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("mud serve");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut banner = String::new();
    out.read_line(&mut banner).expect("the banner");
    let port = banner
        .rsplit(' ')
        .next()
        .and_then(|p| p.trim().parse::<u16>().ok())
        .unwrap_or_else(|| panic!("no port in {banner:?}"));
    // Its stdout keeps being read (and dropped), so the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Mud { child, port }
}

/// A player's connection to the MUD: its socket and its lines, read with a timeout.
#[cfg(feature = "server")]
struct Player {
    socket: std::net::TcpStream,
    lines: std::io::BufReader<std::net::TcpStream>,
}

#[cfg(feature = "server")]
impl Player {
    fn join(port: u16) -> Player {
        let socket = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        let lines = std::io::BufReader::new(socket.try_clone().expect("clone"));
        let mut player = Player { socket, lines };
        player.until(|l| l.starts_with("You are in "));
        player
    }

    fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.socket.write_all(bytes).expect("send");
    }

    /// Reads lines (as bytes, decoded lossily) until one matches `done`; every line read, or a
    /// panic naming them when the connection ends or stays quiet for the read timeout.
    fn until(&mut self, done: impl Fn(&str) -> bool) -> Vec<String> {
        use std::io::BufRead;
        let mut seen = Vec::new();
        loop {
            let mut line = Vec::new();
            match self.lines.read_until(b'\n', &mut line) {
                Ok(n) if n > 0 => {
                    let line = String::from_utf8_lossy(&line).trim_end().to_owned();
                    let stop = done(&line);
                    seen.push(line);
                    if stop {
                        return seen;
                    }
                }
                end => panic!("the connection ended ({end:?}) after {seen:?}"),
            }
        }
    }
}

/// The peak resident set of process `pid` (`VmHWM`), in bytes.
#[cfg(all(feature = "server", target_os = "linux"))]
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// Found by player bots: a line was read whole before the 512-byte cut (one 32 MiB line cost the
/// server 32.8 MB, 25 bots × 4 MiB 102 MB). Sixteen players each send a 4 MiB line at once: the
/// server's peak memory stays within 8 MiB of where it was, and each is answered "unknown
/// command" (the first 512 bytes) and keeps its connection.
#[cfg(all(feature = "server", target_os = "linux"))]
#[test]
fn long_lines_keep_the_connection_and_the_servers_memory_bounded() {
    let mud = mud_serve(&[]);
    let mut players: Vec<Player> = (0..16).map(|_| Player::join(mud.port)).collect();
    let before = peak_rss(mud.child.id());
    const LONG: usize = 4 << 20;
    let senders: Vec<_> = players
        .iter()
        .map(|p| {
            let mut socket = p.socket.try_clone().expect("clone");
            std::thread::spawn(move || {
                use std::io::Write;
                let mut line = vec![b'x'; LONG];
                line.extend_from_slice(b"\nlook\n");
                socket.write_all(&line).expect("send the long line");
            })
        })
        .collect();
    for player in &mut players {
        let seen = player.until(|l| l.starts_with("You are in "));
        assert!(
            seen.iter().any(|l| l == "unknown command (try: help)"),
            "{seen:?}"
        );
    }
    for sender in senders {
        sender.join().expect("sender");
    }
    let grown = peak_rss(mud.child.id()).saturating_sub(before);
    assert!(
        grown < 8 << 20,
        "the server's peak RSS grew by {grown} bytes for 16 lines of {LONG}"
    );
}

/// Found by player bots: a byte that was not UTF-8 closed the player's connection. A Latin-1
/// client's `café` is read as `café`, a stray byte is shown as U+FFFD, and the connection stays.
#[cfg(feature = "server")]
#[test]
fn a_line_that_is_not_utf8_keeps_the_connection() {
    let mud = mud_serve(&[]);
    let mut player = Player::join(mud.port);
    // Latin-1 (`é` is 0xE9) and a stray byte (0x80: a C1 control in Latin-1), then a command on
    // the same connection.
    player.send(b"say caf\xe9 au lait\nsay bad \x80 byte\nlook\n");
    let seen = player.until(|l| l.starts_with("You are in "));
    assert!(
        seen.iter().any(|l| l == "You say: café au lait"),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|l| l == "You say: bad \u{fffd} byte"),
        "{seen:?}"
    );
}

/// Found by player bots: one flooding client took the tick's p99 from 0.5 ms to 181 ms (a `say`
/// is one world event per NPC in the room, and nothing limited a player's lines). A player who
/// sends 400 lines at once is read at the default 10 lines a second (a burst of 20): in any window
/// the server echoes at most 20 + 10 a second of them, while another player is answered at once.
#[cfg(feature = "server")]
#[test]
fn a_flooding_player_is_rate_limited_and_the_others_are_not() {
    let mud = mud_serve(&[]);
    let mut flooder = Player::join(mud.port);
    let mut other = Player::join(mud.port);
    let flood: String = (0..400).map(|i| format!("say flood {i}\n")).collect();
    flooder
        .socket
        .set_read_timeout(Some(std::time::Duration::from_millis(100)))
        .expect("timeout");
    let start = std::time::Instant::now();
    flooder.send(flood.as_bytes());
    // Another player meanwhile: answered.
    other.send(b"look\n");
    other.until(|l| l.starts_with("You are in "));
    // The flooder's echoes over 1.5 s (at least), counted against what the limit allows in the
    // time that really passed (a slow machine only widens the window).
    let mut echoed = 0u64;
    while start.elapsed() < std::time::Duration::from_millis(1500) {
        use std::io::BufRead;
        let mut line = Vec::new();
        match flooder.lines.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => echoed += u64::from(line.starts_with(b"You say: flood")),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("the flooder's connection: {e}"),
        }
    }
    let allowed = 20 + (10.0 * start.elapsed().as_secs_f64()).ceil() as u64;
    assert!(echoed > 0, "the flooder was not read at all");
    assert!(
        echoed <= allowed,
        "{echoed} of 400 flood lines echoed, {allowed} allowed in {:?}",
        start.elapsed()
    );
}

/// The flood as a benchmark scenario: the same players with and without flooders, side by side;
/// the flooders' lines wait for the server's rate limit.
#[cfg(feature = "server")]
#[test]
fn the_mud_flood_scenario_reports_both_sides() {
    let stdout = run_example_with(
        "mud",
        &[
            "bench",
            "--scenario",
            "flood",
            "--players",
            "8",
            "--flooders",
            "2",
            "--npcs",
            "10",
            "--seconds",
            "2",
            "--seed",
            "3",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    for key in [
        "/no_flood/tick_us/p99",
        "/no_flood/host_call_us/p99",
        "/no_flood/deliver_per_event_us/p99",
        "/agents/tick_us/p99",
        "/agents/host_call_us/p99",
        "/agents/deliver_per_event_us/p99",
        "/agents_clients/flood_lines_written",
        "/agents_clients/server_lines_in",
        "/agents_clients/server_lines_throttled",
    ] {
        assert!(
            report.pointer(key).is_some_and(|v| v.is_number()),
            "{key} in {report}"
        );
    }
    let clients = &report["agents_clients"];
    let written = clients["flood_lines_written"].as_u64().unwrap_or(0);
    let read = clients["server_lines_in"].as_u64().unwrap_or(u64::MAX);
    assert!(written > 0, "{report}");
    assert!(
        clients["server_lines_throttled"].as_u64() > Some(0),
        "{report}"
    );
    // 2 flooders at 10 lines a second (a burst of 20) for about 2 s, and 8 players' few lines:
    // far below what the flooders wrote.
    assert!(read < written, "{report}");
}

/// Runs example `name` (built by `cargo test` with the other examples) and returns its stdout;
/// panics if it fails.
fn run_example(name: &str) -> String {
    run_example_with(name, &[])
}

/// `target/debug/examples/NAME`, next to the test binary's `deps`.
fn example_path(name: &str) -> std::path::PathBuf {
    // target/debug/deps/smoke-… → target/debug/examples/NAME
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join(name))
        .expect("target dir")
}

/// [`run_example`] with arguments.
fn run_example_with(name: &str, args: &[&str]) -> String {
    let example = example_path(name);
    let out = std::process::Command::new(&example)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", example.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
