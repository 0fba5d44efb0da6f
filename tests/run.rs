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
    // The one status table, with the documented names (no Rust Debug names).
    assert!(
        stdout.ends_with(
            "\nAGENT  ROLE       STATE           PAUSED  E-STOP  ERRORS  SUBS  QUEUED  DISCARDED  \
             TURNS  TOKENS\n\
             inn    assistant  SAFETY_LOCKOUT  no      yes        1/1   0/3       0          0      \
             1       0\n\
             inn: locked out by consecutive_errors: Maximum consecutive errors reached (1)\n"
        ),
        "{stdout}"
    );
    assert!(stdout.starts_with("talking to inn (1 agent)\n"), "{stdout}");
}

/// Issue 13: `warden run --config F --event X` at a terminal (standard input a terminal nobody types
/// into, kept open) answers the event and exits: with `--event`, exactly those events.
#[cfg(target_os = "linux")]
#[test]
fn with_events_at_a_terminal_it_exits_after_them() {
    use std::{
        io::Read,
        os::fd::{FromRawFd, OwnedFd},
        time::{Duration, Instant},
    };
    // A pseudo-terminal: the child's stdin, stdout and stderr are its slave side; the master stays
    // open (and silent) until the end.
    // SAFETY: plain libc calls on descriptors this test owns; each result is checked.
    let (master, slave) = unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(master), 0, "grantpt");
        assert_eq!(libc::unlockpt(master), 0, "unlockpt");
        let name = libc::ptsname(master);
        assert!(!name.is_null(), "ptsname");
        let slave = libc::open(name, libc::O_RDWR | libc::O_NOCTTY);
        assert!(slave >= 0, "open the slave");
        (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave))
    };
    let path = std::env::temp_dir().join(format!("warden-run-tty-{}.toml", std::process::id()));
    std::fs::write(&path, TEAM).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["run", "--config"])
        .arg(&path)
        .args(["--event", "hi"])
        .env_remove("RUST_LOG")
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave)
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = std::fs::remove_file(&path);
            panic!("warden run --event did not exit at a terminal");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_file(&path);
    // Every byte is in the terminal's buffer: read what the child wrote (the slave is closed, so
    // the read ends with EIO after the last byte).
    let mut out = Vec::new();
    let _ = std::fs::File::from(master).read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("inn: first answer\r\n"), "{out}");
}
