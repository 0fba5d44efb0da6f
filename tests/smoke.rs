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
