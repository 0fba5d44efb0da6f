//! Issue 35, the CLI front door, run as a newcomer runs it (the built `warden` binary): `warden init`
//! writes a team file that `warden config check` passes and `warden run` answers with, and never
//! overwrites one without `--force`; `warden completions SHELL` prints a script for each shell;
//! `warden journal` on an empty file says it is not a journal rather than that it does not exist.
use std::{path::Path, process::Command};
use warden_testkit::scratch_dir;

/// Runs `warden ARGS` in `dir`; returns the exit code, standard output and standard error.
fn warden(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run warden");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn init_writes_a_team_that_checks_and_runs_and_never_overwrites_without_force() {
    let dir = scratch_dir("cli", "init");
    let (code, out, err) = warden(&dir, &["init"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("wrote warden.toml"), "{out}");
    let written = std::fs::read_to_string(dir.join("warden.toml")).expect("warden.toml written");
    assert!(written.contains("# [safety.loop]"), "{written}");
    assert!(written.contains("WARDEN_ADMIN_TOKEN"), "{written}");
    assert!(written.contains("# [permissions]"), "{written}");

    let (code, out, err) = warden(&dir, &["config", "check", "warden.toml"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("warden.toml: ok (a team of 2 agents)"),
        "{out}"
    );

    let (code, out, err) = warden(&dir, &["run", "--config", "warden.toml", "--event", "hi"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("assistant: Done: the helper looked into it."),
        "{out}{err}"
    );

    // A second init keeps the file as it is, a changed one included.
    std::fs::write(dir.join("warden.toml"), "# mine\n").unwrap();
    let (code, out, err) = warden(&dir, &["init"]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        err,
        "error: warden.toml already exists; not overwritten (--force replaces it)\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("warden.toml")).unwrap(),
        "# mine\n"
    );
    let (code, out, err) = warden(&dir, &["init", "--force"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("warden.toml")).unwrap(),
        written
    );

    // Another path; a directory that does not exist is a clear error.
    let (code, out, err) = warden(&dir, &["init", "team.toml"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(dir.join("team.toml").is_file());
    let (code, _, err) = warden(&dir, &["init", "no/such/dir/team.toml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: cannot write no/such/dir/team.toml: "),
        "{err}"
    );
}

#[test]
fn completions_are_printed_for_every_shell() {
    let dir = scratch_dir("cli", "completions");
    for (shell, mark) in [
        ("bash", "complete -F _warden"),
        ("zsh", "#compdef warden"),
        ("fish", "complete -c warden"),
        ("elvish", "edit:completion:arg-completer[warden]"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let (code, out, err) = warden(&dir, &["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.contains(mark), "{shell}: {out}");
        // The subcommands and their flags are in it (fish spells `--wait` as `-l wait`).
        assert!(out.contains("send") && out.contains("wait"), "{shell}");
    }
    let (code, _, err) = warden(&dir, &["completions", "tcsh"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn journal_on_an_empty_file_says_it_is_not_a_journal() {
    let dir = scratch_dir("cli", "journal-empty");
    std::fs::write(dir.join("empty.db"), b"").unwrap();
    for view in [&["tail"][..], &["export"], &["show", "npc"]] {
        let mut args = vec!["journal", "--db", "empty.db"];
        args.extend_from_slice(view);
        let (code, out, err) = warden(&dir, &args);
        assert_eq!((code, out.as_str()), (1, ""), "{view:?}");
        assert_eq!(
            err,
            "error: empty.db is empty: not a warden journal (`warden serve --db empty.db` creates \
             one)\n",
            "{view:?}"
        );
    }
    assert_eq!(std::fs::metadata(dir.join("empty.db")).unwrap().len(), 0);
}

/// Issue 35: `config check` refuses a team whose `api_key_env` is unset, as `run` does (it used to
/// pass it); with the variable set both go on (no request is sent by the check).
#[test]
fn config_check_refuses_an_unset_api_key_env_as_run_does() {
    let dir = scratch_dir("cli", "api-key-env");
    let var = "WARDEN_TEST_CLI_UNSET_KEY";
    std::fs::write(
        dir.join("team.toml"),
        format!(
            "[providers.m]\nkind = \"openai_compatible\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             model = \"x\"\napi_key_env = \"{var}\"\n\n[[agents]]\nkey = \"a\"\nprovider = \"m\"\n"
        ),
    )
    .unwrap();
    let (code, out, err) = warden(&dir, &["config", "check", "team.toml"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.starts_with("error: team.toml: "), "{err}");
    assert!(err.contains(var), "{err}");
    let (code, _, run_err) = warden(&dir, &["run", "--config", "team.toml", "--event", "hi"]);
    assert_ne!(code, 0);
    assert!(run_err.contains(var), "{run_err}");

    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["config", "check", "team.toml"])
        .current_dir(&*dir)
        .env(var, "sk-test")
        .output()
        .expect("run warden");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
