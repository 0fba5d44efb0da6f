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

/// Runs example `name` (built by `cargo test` with the other examples) and returns its stdout;
/// panics if it fails.
fn run_example(name: &str) -> String {
    // target/debug/deps/smoke-… → target/debug/examples/NAME
    let exe = std::env::current_exe().expect("test binary path");
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join(name))
        .expect("target dir");
    let out = std::process::Command::new(&example)
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
