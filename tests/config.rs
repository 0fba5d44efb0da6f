//! `warden config check|defaults` on the binary, and `warden run`/`warden serve` refusing the same
//! team files with the same errors.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

/// A file under the system temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "warden-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs `warden ARGS` (no input, no RUST_LOG): exit code, stdout, stderr.
fn warden(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_ADMIN_TOKEN")
        .env_remove("WARDEN_READ_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const DUPLICATE: &str = r#"
[providers.m]
kind = "scripted"
replies = ["hi"]

[[agents]]
key = "inn"
provider = "m"

[[agents]]
key = "inn"
provider = "m"
"#;

#[test]
fn check_run_and_serve_refuse_a_duplicate_key_with_the_same_error() {
    let file = TempFile::new("team.toml", DUPLICATE);
    let expected = format!(
        "error: {}: invalid value for `agents[1].key` (agent `inn`): \"inn\" (allowed: a key no \
         other agent has; agents[0] is \"inn\" too)\n",
        file.path()
    );
    let (code, stdout, stderr) = warden(&["config", "check", file.path()]);
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (1, "", expected.as_str())
    );
    let (code, stdout, stderr) = warden(&["run", "--config", file.path(), "--event", "hi"]);
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (1, "", expected.as_str())
    );
    // Refused before anything is spawned or opened: no "agent actor crashed", no journal file.
    let db = file.0.with_file_name("warden.db");
    let (code, stdout, stderr) = warden(&[
        "serve",
        "--config",
        file.path(),
        "--listen",
        "127.0.0.1:0",
        "--db",
        db.to_str().unwrap(),
    ]);
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (1, "", expected.as_str())
    );
    assert!(!db.exists());
}

#[test]
fn check_names_team_mistakes() {
    let team = |agents: &str| format!("[providers.m]\nkind = \"scripted\"\n\n{agents}");
    let cases = [
        (
            team(""),
            "invalid value for `agents`: none (allowed: one or more [[agents]] entries, each with \
             a `key` and a `provider`)",
        ),
        (
            team("[[agents]]\nkey = \"a\"\nprovider = \"m\"\nrole = \"sub_agent\"\nparent = \"a\"\n"),
            "invalid value for `agents[0].parent` (agent `a`): \"a\" (allowed: the key of another \
             agent: (none))",
        ),
        (
            team("[[agents]]\nkey = \"a\"\nprovider = \"m\"\n\n[[agents]]\nkey = \"b\"\nprovider = \"m\"\nrole = \"sub_agent\"\nparent = \"zzz\"\n"),
            "invalid value for `agents[1].parent` (agent `b`): \"zzz\" (allowed: the key of \
             another agent: a)",
        ),
        (
            team("[[agents]]\nkey = \"a\"\nprovider = \"m\"\n\n[[agents]]\nkey = \"b\"\nprovider = \"m\"\nrole = \"sub_agent\"\n"),
            "invalid value for `agents[1].parent` (agent `b`): none (allowed: the key of another \
             agent, as role = \"sub_agent\" needs a parent: a)",
        ),
        (
            team("[[agents]]\nkey = \"a\"\nprovider = \"m\"\n\n[[agents]]\nkey = \"b\"\nprovider = \"m\"\nrole = \"sub_agent\"\nparent = \"c\"\n\n[[agents]]\nkey = \"c\"\nprovider = \"m\"\nrole = \"sub_agent\"\nparent = \"b\"\n"),
            "invalid value for `agents[1].parent` (agent `b`): \"c\" (allowed: a parent whose \
             chain of parents ends at an assistant; this one loops: b -> c -> b)",
        ),
        (
            "[providers.local]\nkind = \"openai_compatible\"\nbase_url = \"not a url\"\nmodel = \"q\"\n\n[[agents]]\nkey = \"a\"\nprovider = \"local\"\n".to_owned(),
            "invalid value for `providers.local.base_url`: \"not a url\" (allowed: an http:// or \
             https:// URL with a host, such as \"http://127.0.0.1:8080/v1\")",
        ),
    ];
    for (text, expected) in cases {
        let file = TempFile::new("team.toml", &text);
        let (code, stdout, stderr) = warden(&["config", "check", file.path()]);
        assert_eq!(code, 1, "{text}");
        assert_eq!(stdout, "");
        assert_eq!(
            stderr,
            format!("error: {}: {expected}\n", file.path()),
            "{text}"
        );
    }
}

#[test]
fn check_gives_a_syntax_errors_line_column_and_line() {
    let file = TempFile::new(
        "team.toml",
        "[providers.m]\nkind = \"scripted\nreplies = [\"hi\"]\n",
    );
    let (code, stdout, stderr) = warden(&["config", "check", file.path()]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(
        stderr,
        format!(
            "error: {}: invalid config: line 2, column 17: invalid basic string\n\
             2 | kind = \"scripted\n  \
               |                 ^\n",
            file.path()
        )
    );
}

#[test]
fn check_tells_a_team_from_configuration_only() {
    let file = TempFile::new("team.toml", &DUPLICATE.replacen("\"inn\"", "\"bar\"", 1));
    let (code, stdout, stderr) = warden(&["config", "check", file.path()]);
    assert_eq!(
        (code, stdout, stderr),
        (
            0,
            format!(
                "permissions (the effective rule for each tool, first match first):\n  \
                 bar  delegate (SAFE_CHAIN): allow (permissions.safe_chain)\n  \
                 inn  delegate (SAFE_CHAIN): allow (permissions.safe_chain)\n\
                 {}: ok (a team of 2 agents)\n",
                file.path()
            ),
            String::new()
        )
    );
    let file = TempFile::new("config.toml", "[execution]\nmax_iterations_per_tick = 3\n");
    let (code, stdout, _) = warden(&["config", "check", file.path()]);
    assert_eq!(code, 0);
    assert_eq!(
        stdout,
        format!(
            "{}: ok (configuration only: warden run and warden serve also need [providers.NAME] \
             and [[agents]])\n",
            file.path()
        )
    );
}

#[test]
fn defaults_print_the_whole_configuration_which_checks_ok() {
    let (code, defaults, stderr) = warden(&["config", "defaults"]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    for section in ["[safety.budget]", "[execution]", "[journal]", "[api]"] {
        assert!(defaults.lines().any(|l| l == section), "{section}");
    }
    assert!(defaults.contains("\n[api]\n# admin_token = \"…\"\n# read_token = \"…\"\nlisten = \"127.0.0.1:7878\"\nmax_body_bytes = 65536\n"), "{defaults}");
    let file = TempFile::new("defaults.toml", &defaults);
    let (code, _, stderr) = warden(&["config", "check", file.path()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
}

#[test]
fn an_unknown_section_lists_every_section() {
    let file = TempFile::new("team.toml", "[mailboxes]\ncapacity = 3\n");
    let (code, _, stderr) = warden(&["config", "check", file.path()]);
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "error: {}: invalid config: line 1, column 2: `mailboxes`: unknown field `mailboxes`, \
             expected one of `safety`, `execution`, `delegation`, `tools`, `mailbox`, \
             `supervisor`, `journal`, `npc`, `memory`, `permissions`, `providers`, `agents`, `api`, `telemetry`, `mcp_servers`, `a2a_agents`, \
             `cluster`, `workload`\n\
             1 | [mailboxes]\n  |  ^^^^^^^^^\n",
            file.path()
        )
    );
}

/// Every page of docs/ with a ```rust example is compiled by `cargo test --doc`: src/lib.rs
/// includes it as a doctest item (and no Rust block is left untagged: rustdoc would take an
/// untagged block for Rust, so every fence names its language).
#[test]
fn every_rust_example_in_the_docs_is_a_doctest() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let mut pages = 0;
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        if text.contains("```rust") {
            pages += 1;
            assert!(
                lib.contains(&format!("include_str!(\"../docs/{name}\")")),
                "docs/{name} has a Rust example that src/lib.rs does not compile as a doctest"
            );
            // Inside a doctested page, an opening fence with no language is compiled as Rust.
            let mut open = false;
            for (n, line) in text.lines().enumerate() {
                if let Some(lang) = line.trim_start().strip_prefix("```") {
                    if !open {
                        assert!(
                            !lang.trim().is_empty(),
                            "docs/{name}:{}: a fence with no language",
                            n + 1
                        );
                    }
                    open = !open;
                }
            }
        }
    }
    assert!(
        pages >= 3,
        "the docs' Rust examples were not found ({pages} pages)"
    );
}

/// docs/configuration.md: every ```toml example is a team file that parses and validates (a
/// block with `[[agents]]`), or a configuration that does.
#[test]
fn the_examples_in_docs_configuration_md_parse() {
    let doc = include_str!("../docs/configuration.md");
    let mut examples = 0;
    for block in doc.split("```toml\n").skip(1) {
        let text = block.split("```").next().unwrap();
        if text.contains("[[agents]]") {
            warden::team::TeamFile::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        } else {
            warden::WardenConfig::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
        examples += 1;
    }
    assert!(examples >= 1, "{examples}");
}
