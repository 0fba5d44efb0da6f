//! Issue 13: `--help` is true and complete: every argument and option of every command says what it
//! is, and `serve`/`run` document `RUST_LOG`.
use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .output()
        .expect("run warden");
    assert!(out.status.success(), "warden {args:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

const COMMANDS: &[&[&str]] = &[
    &["demo"],
    &["run"],
    &["loadtest"],
    &["loadtest", "compare"],
    &["serve"],
    &["mcp"],
    &["journal"],
    &["journal", "tail"],
    &["journal", "show"],
    &["journal", "export"],
    &["config", "check"],
    &["config", "defaults"],
    &["status"],
    &["halt"],
    &["unlock"],
    &["clear"],
    &["pause"],
    &["resume"],
    &["send"],
    &["events"],
    &["ask"],
    &["init"],
    &["completions"],
];

#[test]
fn every_argument_and_option_has_a_description() {
    for command in COMMANDS {
        let mut args = command.to_vec();
        args.push("-h");
        let text = help(&args);
        let mut section = "";
        let lines: Vec<&str> = text.lines().collect();
        let indent = |line: &str| line.len() - line.trim_start().len();
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with(' ') {
                section = line;
                continue;
            }
            let name = line.trim_start();
            if !matches!(section, "Arguments:" | "Options:")
                || !(name.starts_with('<') || name.starts_with('[') || name.starts_with('-'))
            {
                continue;
            }
            // `  <KEY>  The agent's key`, `  -n, --last <LAST>  How many …`: a name, then words;
            // or, when clap puts it on the next line, the words more indented below the name.
            let same_line = name.split("  ").filter(|p| !p.is_empty()).count() >= 2;
            let next_line = lines
                .get(i + 1)
                .is_some_and(|next| indent(next) > indent(line) && !next.trim().is_empty());
            assert!(
                same_line || next_line,
                "warden {command:?}: no description: {line:?}\n{text}"
            );
        }
    }
}

#[test]
fn serve_and_ask_help_are_current_and_rust_log_is_documented() {
    let serve = help(&["serve", "--help"]);
    assert!(!serve.contains("one assistant"), "{serve}");
    assert!(
        serve.contains("`concierge`, which delegates to `researcher` and `scribe`"),
        "{serve}"
    );
    assert!(
        serve.contains("only GET /healthz") || serve.contains("but GET /healthz"),
        "{serve}"
    );
    let ask = help(&["ask", "--help"]);
    assert!(!ask.contains("echoed"), "{ask}");
    assert!(
        ask.contains("A note for the record: journaled with the decision and who answered"),
        "{ask}"
    );
    for command in ["serve", "run"] {
        let text = help(&[command, "--help"]);
        assert!(
            text.contains("RUST_LOG=info"),
            "warden {command} --help:\n{text}"
        );
    }
}

/// Issue 35: each default is shown once (clap's `[default: …]`, not also in the doc text), and
/// `send --help` documents the exit code of an event still pending after --wait.
#[test]
fn defaults_are_shown_once_and_send_documents_its_exit_codes() {
    for command in COMMANDS {
        let mut args = command.to_vec();
        args.push("--help");
        let text = help(&args);
        for line in text.lines() {
            let defaults = line.matches("[default: ").count();
            assert!(defaults <= 1, "warden {command:?}: {line:?}\n{text}");
        }
    }
    let send = help(&["send", "--help"]);
    assert_eq!(send.matches("[default: 60]").count(), 1, "{send}");
    assert!(
        send.contains("Exits 16 when the event is still pending"),
        "{send}"
    );
    assert!(send.contains("`warden ask ID yes|no`"), "{send}");
}
