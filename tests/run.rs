//! `warden run`: each event's answer is the reply correlated to it, and with `--event` exactly those
//! events run and it returns, even while the input (a terminal) stays open.
use warden::{
    cli::run::{run, RunOptions},
    team::TeamFile,
};

const TEAM: &str = r#"
[providers.s]
kind = "scripted"
replies = ["first answer", "second answer"]

[[agents]]
key = "inn"
provider = "s"
"#;

#[actix_rt::test]
async fn with_events_it_answers_each_and_returns_while_the_input_stays_open() {
    let file = TeamFile::from_toml(TEAM).unwrap();
    // An input that never ends, as a terminal nobody types into.
    let (_keep_open, input) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut out = Vec::new();
    let options = RunOptions {
        agent: None,
        events: vec!["hi".into(), "again".into()],
    };
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        run(file, options, Some(input), &mut out),
    )
    .await
    .expect("run returned after its events")
    .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("inn: first answer\ninn: second answer\n"),
        "{out}"
    );
}

#[actix_rt::test]
async fn without_events_each_input_line_is_one_and_a_failure_says_why() {
    let file = TeamFile::from_toml(
        r#"
[providers.down]
kind = "scripted"
replies = ["x"]
error = "model down"

[[agents]]
key = "inn"
provider = "down"
"#,
    )
    .unwrap();
    let (tx, input) = tokio::sync::mpsc::unbounded_channel::<String>();
    tx.send("hello".into()).unwrap();
    drop(tx);
    let mut out = Vec::new();
    run(file, RunOptions::default(), Some(input), &mut out)
        .await
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("inn: [error] llm call failed: model down"),
        "{out}"
    );
}

/// Runs `warden run --config FILE ARGS` on `team` (no input): exit code, stdout, stderr.
fn run_cli(team: &str, args: &[&str]) -> (i32, String, String) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "warden-run-test-{}-{}.toml",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    std::fs::write(&path, team).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .arg("run")
        .arg("--config")
        .arg(&path)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const DOWN: &str = r#"
[providers.down]
kind = "scripted"
error = "model down"

[[agents]]
key = "inn"
provider = "down"
"#;

#[test]
fn the_exit_code_says_whether_any_event_was_answered() {
    let (code, stdout, stderr) = run_cli(TEAM, &["--event", "hi"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    assert!(stdout.contains("inn: first answer\n"), "{stdout}");

    // Every turn failed (one failure is not a lockout: 5 in a row are).
    let (code, stdout, stderr) = run_cli(DOWN, &["--event", "hi", "--event", "again"]);
    assert_eq!(code, 10, "{stdout}");
    assert!(
        stdout.contains("inn: [error] llm call failed: model down\n"),
        "{stdout}"
    );
    assert_eq!(stderr, "warden run: inn answered none of 2 events\n");
}

#[test]
fn an_agent_that_ends_locked_out_exits_9() {
    let team = format!("[safety.breakers]\nmax_consecutive_errors = 1\n{DOWN}");
    let (code, stdout, stderr) = run_cli(&team, &["--event", "hi"]);
    assert_eq!(code, 9, "{stdout}");
    assert_eq!(
        stderr,
        "warden run: inn ended locked out (SAFETY_LOCKOUT), 0 of 1 events answered\n"
    );
}
