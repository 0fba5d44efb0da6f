//! `warden loadtest` on small fleets: the report's invariants in every scenario (nothing lost, no slot
//! leaked, delegation counts that add up, nothing processed after a halt), its JSON contract and its
//! reproducibility.
use std::time::Duration;
use warden::loadtest::{run_loadtest, LoadReport, LoadtestOptions, Scenario};

fn small(scenario: Scenario) -> LoadtestOptions {
    LoadtestOptions {
        agents: 40,
        fanout: 3,
        depth: 2,
        tasks_per_agent: 4,
        backlog: 2_000,
        halt_probes: 3,
        timeout: Duration::from_secs(60),
        ..LoadtestOptions::new(scenario)
    }
}

fn check_invariants(r: &LoadReport) {
    assert_eq!(r.lost_events, 0, "lost events: {r:#?}");
    assert_eq!(r.leaked_slots, 0, "leaked slots: {r:#?}");
    assert_eq!(r.halt.processed_after_halt, 0, "{r:#?}");
    assert_eq!(r.halt.backlog, 2_000);
    assert!(r.halt.latency_us_p50 <= r.halt.latency_us_p99);
    assert!(r.halt.latency_us_p99 <= r.halt.latency_us_max);
    let d = &r.delegations;
    assert_eq!(
        d.requested,
        d.accepted
            + d.refused_budget
            + d.refused_hops
            + d.refused_locked
            + d.refused_cycle
            + r.refused_other,
        "{d:?}"
    );
    assert_eq!(r.refused_other, 0, "{r:#?}");
    assert_eq!(r.agents, 40);
    assert_eq!(r.halt_all.agents, 40);
}

#[test]
fn idle_fleet_spawns_measures_and_halts() {
    let r = run_loadtest(small(Scenario::Idle));
    check_invariants(&r);
    assert_eq!(r.steps, 0);
    assert_eq!(r.delegations.requested, 0);
    assert!(r.spawn_ns_per_agent > 0);
}

#[test]
fn steady_fleet_runs_every_task_down_every_tree() {
    let r = run_loadtest(small(Scenario::Steady));
    check_invariants(&r);
    // 40 agents = 3 trees of 13 + one root: 4 roots × 4 tasks; every agent runs every task in two
    // model calls; every inner agent delegates each task to each child.
    assert_eq!(r.tasks_sent, 16);
    assert_eq!(r.steps, 40 * 4 * 2);
    assert_eq!(r.delegations.accepted, 36 * 4);
    assert_eq!(r.delegations.requested, r.delegations.accepted);
    // 27 leaves in the full trees, and the lone fourth root is a leaf too.
    assert_eq!(r.tool_calls, 28 * 4);
    assert_eq!(r.lockouts, 0);
    assert!(r.steps_per_sec > 0.0);
    // Every root task is answered, and its latency correlated by its id.
    let l = &r.event_latency;
    assert_eq!(l.answered, r.tasks_sent);
    assert!(l.p50_ms <= l.p99_ms && l.p99_ms <= l.max_ms, "{l:?}");
}

#[test]
fn steady_fleet_with_latency_and_faults_keeps_its_accounting() {
    let r = run_loadtest(LoadtestOptions {
        llm_latency_ms: 2.0,
        fail_rate: 0.1,
        panic_rate: 0.05,
        ..small(Scenario::Steady)
    });
    check_invariants(&r);
    assert!(r.steps > 0);
}

#[test]
fn cascade_trips_leaf_breakers_and_refuses_delegations_to_them() {
    let r = run_loadtest(LoadtestOptions {
        tasks_per_agent: 10,
        ..small(Scenario::Cascade)
    });
    check_invariants(&r);
    assert!(r.lockouts > 0, "{r:#?}");
    // The failure starts at the leaves (depth 2).
    assert!(
        r.lockouts_by_depth.get(2).copied().unwrap_or(0) > 0,
        "{r:#?}"
    );
    assert!(r.delegations.refused_locked > 0, "{r:#?}");
}

#[test]
fn hop_limit_refusals_are_counted() {
    // Depth 5 with fanout 1: chains of 6 agents, past safety.loop.max_agent_hops = 3.
    let r = run_loadtest(LoadtestOptions {
        agents: 12,
        fanout: 1,
        depth: 5,
        ..small(Scenario::Steady)
    });
    assert_eq!(r.lost_events, 0, "{r:#?}");
    assert_eq!(r.leaked_slots, 0, "{r:#?}");
    assert!(r.delegations.refused_hops > 0, "{r:#?}");
    let d = &r.delegations;
    assert_eq!(
        d.requested,
        d.accepted + d.refused_budget + d.refused_hops + d.refused_locked + d.refused_cycle
    );
}

#[test]
fn budget_refusals_are_counted() {
    // Fanout 5 > delegation.sub_agent_budget = 3: two delegations of every task are refused.
    let r = run_loadtest(LoadtestOptions {
        agents: 12,
        fanout: 5,
        depth: 1,
        safety: false,
        ..small(Scenario::Steady)
    });
    assert_eq!(r.lost_events, 0, "{r:#?}");
    assert_eq!(r.leaked_slots, 0, "{r:#?}");
    assert!(r.delegations.refused_budget > 0, "{r:#?}");
    // Issue 18: the refused delegations were to children, at depth 1.
    let d = &r.delegations;
    assert_eq!(r.refusals_by_depth, [0, d.requested - d.accepted], "{r:#?}");
    check_series(&r);
}

#[test]
fn halt_storm_halts_a_busy_fleet_without_losing_anything() {
    let r = run_loadtest(LoadtestOptions {
        llm_latency_ms: 1.0,
        tasks_per_agent: 20,
        ..small(Scenario::HaltStorm)
    });
    check_invariants(&r);
    // Halted mid-run: not every task ran to its end.
    assert!(r.steps < 40 * 20 * 2, "{r:#?}");
}

#[test]
fn no_safety_runs_the_same_scenario() {
    let r = run_loadtest(LoadtestOptions {
        safety: false,
        ..small(Scenario::Cascade)
    });
    check_invariants(&r);
}

#[test]
fn same_seed_gives_the_same_counts() {
    let opts = LoadtestOptions {
        fail_rate: 0.2,
        panic_rate: 0.05,
        seed: 42,
        ..small(Scenario::Cascade)
    };
    let a = run_loadtest(opts.clone());
    let b = run_loadtest(opts);
    check_invariants(&a);
    let counts = |r: &LoadReport| {
        (
            r.steps,
            r.tool_calls,
            r.delegations.clone(),
            r.lockouts,
            r.stopped,
            r.restarts,
            r.lockouts_by_depth.clone(),
        )
    };
    assert_eq!(counts(&a), counts(&b));
}

#[test]
fn json_report_has_exactly_the_contract_keys() {
    let r = run_loadtest(small(Scenario::Steady));
    let json = serde_json::to_value(&r).unwrap();
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let sorted = |k: &[&str]| {
        let mut k: Vec<String> = k.iter().map(|s| s.to_string()).collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&json),
        sorted(&[
            "scenario",
            "seed",
            "threads",
            "agents",
            "duration_s",
            "spawn_ns_per_agent",
            "steps",
            "steps_per_sec",
            "tool_calls",
            "delegations",
            "lockouts",
            "stopped",
            "restarts",
            "halt",
            "halt_all",
            "event_latency",
            "memory",
            "lost_events",
            "leaked_slots",
            "timed_out",
            "unfinished_tasks",
            // Added by issue 18 (the keys above are unchanged).
            "lockouts_by_depth",
            "refusals_by_depth",
            "retries",
            "tasks_sent",
            "tasks_refused",
            "series",
            "workload",
            // Added by issue 34 (the keys above are unchanged).
            "outcomes",
            "turns_by_depth",
            "turns_by_agent",
            "stopped_agents",
            "recoveries",
            "thresholds",
            "interrupted",
        ])
    );
    assert_eq!(
        keys(&json["outcomes"]),
        sorted(&[
            "answered",
            "failed",
            "refused",
            "discarded",
            "gone",
            "timed_out",
            "reasons"
        ])
    );
    assert_eq!(json["interrupted"], serde_json::Value::Null);
    assert_eq!(
        keys(&json["delegations"]),
        sorted(&[
            "requested",
            "accepted",
            "refused_budget",
            "refused_hops",
            "refused_locked",
            "refused_cycle",
        ])
    );
    assert_eq!(
        keys(&json["halt"]),
        sorted(&[
            "backlog",
            "latency_us_p50",
            "latency_us_p99",
            "latency_us_max",
            "processed_after_halt",
        ])
    );
    assert_eq!(keys(&json["halt_all"]), sorted(&["agents", "ms"]));
    assert_eq!(
        keys(&json["event_latency"]),
        sorted(&["answered", "p50_ms", "p90_ms", "p99_ms", "max_ms"])
    );
    assert_eq!(
        keys(&json["memory"]),
        sorted(&["rss_peak_bytes", "bytes_per_agent"])
    );
    assert_eq!(json["scenario"], "steady");
}

#[test]
fn cli_prints_one_json_object() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args([
            "loadtest",
            "--scenario",
            "halt-storm",
            "--agents",
            "20",
            "--halt-probes",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.trim().lines().count(), 1);
    let json: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(json["scenario"], "halt-storm");
    assert_eq!(json["agents"], 20);
    assert_eq!(json["lost_events"], 0);
}

/// Runs `warden loadtest ARGS`: exit code, stdout, stderr.
fn loadtest_cli(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .arg("loadtest")
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn bad_flag_values_are_usage_errors_that_name_the_flag() {
    let cases = [
        (
            &["--agents", "0"][..],
            "error: invalid value '0' for '--agents <AGENTS>': must be at least 1",
        ),
        (
            &["--agents", "-5"][..],
            "error: invalid value '-5' for '--agents <AGENTS>': must be a whole number of 1 or more",
        ),
        (
            &["--fail-rate", "1.5"][..],
            "error: invalid value '1.5' for '--fail-rate <FAIL_RATE>': must be a probability from 0 to 1",
        ),
        (
            &["--timeout-s", "0"][..],
            "error: invalid value '0' for '--timeout-s <TIMEOUT_S>': must be a number of seconds \
             greater than 0 (at most 31536000)",
        ),
        (
            &["--llm-latency-ms", "-1"][..],
            "error: invalid value '-1' for '--llm-latency-ms <LLM_LATENCY_MS>': must be a number of 0 or more",
        ),
    ];
    assert_usage_errors(&cases);
}

/// Each `(args, first line of stderr)`: `warden loadtest ARGS` is a usage error (exit 2: as for
/// every command; an invariant violation is 11) with that first line, and prints nothing.
fn assert_usage_errors(cases: &[(&[&str], &str)]) {
    for (args, expected) in cases {
        let (code, stdout, stderr) = loadtest_cli(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(stdout, "");
        assert_eq!(stderr.lines().next(), Some(*expected), "{args:?}: {stderr}");
    }
}

#[test]
fn a_run_cut_by_its_timeout_is_reported_as_timed_out() {
    // Every model call takes 0.5 to 1.5 s: nothing is done when the 0.2 s timeout cuts the run.
    let (code, stdout, stderr) = loadtest_cli(&[
        "--agents",
        "13",
        "--llm-latency-ms",
        "1000",
        "--timeout-s",
        "0.2",
        "--halt-probes",
        "0",
        "--json",
    ]);
    assert_eq!(code, 12, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["timed_out"], true);
    // One tree of 13: 5 tasks sent to its root, none done, none delegated yet.
    assert_eq!(json["unfinished_tasks"], 5, "{json}");
    assert_eq!(json["lost_events"], 0, "{json}");
    assert_eq!(
        stderr,
        "loadtest: timed out after 0.2 s (--timeout-s): 5 tasks unfinished\n"
    );

    let (code, stdout, _) = loadtest_cli(&[
        "--agents",
        "13",
        "--llm-latency-ms",
        "1000",
        "--timeout-s",
        "0.2",
        "--halt-probes",
        "0",
    ]);
    assert_eq!(code, 12);
    assert!(
        stdout.contains("\n  timed out     yes: 5 tasks unfinished (--timeout-s)\n"),
        "{stdout}"
    );
    let (code, stdout, _) = loadtest_cli(&["--agents", "13", "--halt-probes", "0"]);
    assert_eq!(code, 0);
    assert!(stdout.ends_with("\n  timed out     no\n"), "{stdout}");
}

/// Issue 13: a halt storm without latency is reproducible per seed. The harness halted after a
/// 200 µs polling sleep, so how much of the fleet ran before the halt depended on the clock (at 50
/// agents, 3 runs of 20 took 194 steps instead of 95); the journal now wakes it with the event that
/// crosses the line.
#[test]
fn a_halt_storm_without_latency_gives_the_same_counts_every_run() {
    let opts = LoadtestOptions {
        tasks_per_agent: 5,
        halt_probes: 0,
        ..small(Scenario::HaltStorm)
    };
    let counts = |r: &LoadReport| {
        (
            r.steps,
            r.tool_calls,
            r.delegations.clone(),
            r.lockouts,
            r.stopped,
        )
    };
    let first = run_loadtest(opts.clone());
    check_invariants(&first);
    for _ in 0..5 {
        let again = run_loadtest(opts.clone());
        check_invariants(&again);
        assert_eq!(counts(&again), counts(&first));
    }
}

// ---- team files (`--config`) ----------------------------------------------------------------------

use warden::loadtest::workload::{run_team, Overrides, Workload};
use warden::team::TeamFile;

/// A desk that delegates every event to its cook, then answers; the cook answers at once.
const DESK_AND_COOK: &str = r#"
[providers.desk]
kind = "scripted"
cycle = true
replies = [{ tool = "delegate", args = { agent = "cook", task = "cook it" } }, "served"]

[providers.cook]
kind = "scripted"
replies = ["cooked"]

[[agents]]
key = "desk"
provider = "desk"

[[agents]]
key = "cook"
role = "sub_agent"
parent = "desk"
provider = "cook"
"#;

fn team_run(text: &str, overrides: Overrides) -> LoadReport {
    let file = TeamFile::from_toml(text).unwrap();
    let workload = Workload::from_team_toml(text, &file, overrides).unwrap();
    let options = LoadtestOptions {
        halt_probes: 1,
        backlog: 10,
        timeout: Duration::from_secs(60),
        ..LoadtestOptions::new(Scenario::Steady)
    };
    run_team(&file, &workload, "team.toml", &options).unwrap()
}

/// The series adds up to the run's totals: counts per interval, nothing counted twice or lost.
fn check_series(r: &LoadReport) {
    assert!(!r.series.is_empty(), "{r:#?}");
    let sum = |f: fn(&warden::loadtest::Sample) -> u64| r.series.iter().map(f).sum::<u64>();
    assert_eq!(sum(|s| s.llm_calls), r.steps, "{r:#?}");
    assert_eq!(sum(|s| s.events_accepted), r.tasks_sent - r.tasks_refused);
    assert_eq!(sum(|s| s.lockouts), r.lockouts);
    let last = r.series.last().unwrap();
    assert_eq!(
        last.agents_by_state.values().sum::<u64>(),
        r.agents,
        "{last:?}"
    );
    assert!(r.series.windows(2).all(|w| w[0].t_s <= w[1].t_s));
}

#[test]
fn a_team_file_runs_its_workload_closed_loop() {
    let text = format!("{DESK_AND_COOK}\n[workload]\nconcurrency = 2\ncount = 10\n");
    let r = team_run(&text, Overrides::default());
    assert_eq!(r.scenario, "team");
    assert_eq!((r.lost_events, r.leaked_slots), (0, 0), "{r:#?}");
    assert!(!r.timed_out);
    assert_eq!(r.agents, 2);
    assert_eq!((r.tasks_sent, r.tasks_refused), (10, 0));
    assert_eq!(r.event_latency.answered, 10);
    let l = &r.event_latency;
    assert!(l.p50_ms <= l.p90_ms && l.p90_ms <= l.p99_ms && l.p99_ms <= l.max_ms);
    // Per event: the desk delegates (1 call) and answers (1 call); the cook answers (1 call).
    assert_eq!(r.steps, 30);
    assert_eq!(r.delegations.accepted, 10);
    assert_eq!(r.delegations.requested, 10);
    // Settled: every agent waits for its next event.
    let last = &r.series.last().unwrap().agents_by_state;
    assert_eq!(last.get("WAITING_FOR_EVENT"), Some(&2), "{last:?}");
    assert_eq!(last.len(), 1, "{last:?}");
    assert!(r.retries.values().all(|n| *n == 0), "{:?}", r.retries);
    let w = r.workload.as_ref().unwrap();
    assert_eq!(
        (w.mode.as_str(), w.level, w.count),
        ("concurrency", 2.0, Some(10))
    );
    assert_eq!(w.agents, ["desk"]);
    check_series(&r);
}

#[test]
fn a_team_file_runs_open_loop_and_flags_override_the_file() {
    let text = format!("{DESK_AND_COOK}\n[workload]\nconcurrency = 2\ncount = 1000\n");
    let r = team_run(
        &text,
        Overrides {
            rate: Some(200.0),
            count: Some(6),
            ..Overrides::default()
        },
    );
    assert_eq!(r.tasks_sent, 6);
    assert_eq!(r.event_latency.answered, 6);
    assert_eq!((r.lost_events, r.leaked_slots), (0, 0), "{r:#?}");
    let w = r.workload.as_ref().unwrap();
    assert_eq!(
        (w.mode.as_str(), w.level, w.count),
        ("rate", 200.0, Some(6))
    );
    // 6 events at 200/s: the last is sent at 25 ms.
    assert!(r.duration_s >= 0.025, "{}", r.duration_s);
    check_series(&r);
}

/// A cook whose model is down: its breaker locks it out (depth 1 of the team's tree), then the
/// desk's delegations to it are refused — counted by the delegate's depth. Reproducible: no
/// latency, one arbiter.
#[test]
fn a_team_files_lockouts_and_refusals_are_counted_by_tree_depth() {
    let text = DESK_AND_COOK.replace(
        "replies = [\"cooked\"]",
        "error = \"the kitchen is on fire\"",
    ) + "\n[workload]\nconcurrency = 1\ncount = 8\n";
    let r = team_run(&text, Overrides::default());
    assert_eq!((r.lost_events, r.leaked_slots), (0, 0), "{r:#?}");
    assert_eq!(r.lockouts, 1, "{r:#?}");
    assert_eq!(r.lockouts_by_depth, [0, 1], "{r:#?}");
    // The states at the end, from the journal's transitions: the cook is still locked out.
    let last = &r.series.last().unwrap().agents_by_state;
    let states: Vec<(&str, u64)> = last.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(states, [("SAFETY_LOCKOUT", 1), ("WAITING_FOR_EVENT", 1)]);
    let d = &r.delegations;
    assert!(d.refused_locked > 0, "{r:#?}");
    assert_eq!(
        r.refusals_by_depth.iter().sum::<u64>(),
        d.requested - d.accepted
    );
    assert_eq!(r.refusals_by_depth.first().copied().unwrap_or(0), 0);
    check_series(&r);
    // The same file, the same counts.
    let again = team_run(&text, Overrides::default());
    let counts = |r: &LoadReport| {
        (
            r.steps,
            r.delegations.clone(),
            r.lockouts_by_depth.clone(),
            r.refusals_by_depth.clone(),
            r.event_latency.answered,
        )
    };
    assert_eq!(counts(&again), counts(&r));
}

/// A file (a team file, a report) in a scratch directory of its own (`warden_testkit::Scratch`:
/// removed when the test passes, kept for a look when it fails); derefs to the file's path.
struct TeamPath {
    path: std::path::PathBuf,
    _dir: warden_testkit::Scratch,
}

impl AsRef<std::ffi::OsStr> for TeamPath {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl AsRef<std::path::Path> for TeamPath {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl std::ops::Deref for TeamPath {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

/// Writes `text` to a fresh team file in a temporary directory of its own.
fn team_file(name: &str, text: &str) -> TeamPath {
    let dir = warden_testkit::scratch_dir("loadtest", name);
    let path = dir.join("team.toml");
    std::fs::write(&path, text).unwrap();
    TeamPath { path, _dir: dir }
}

/// `warden loadtest --config PATH ARGS --json`, which must succeed: its report.
fn team_json(path: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--config", path.to_str().unwrap()];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, stdout, stderr) = loadtest_cli(&all);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(stdout.trim()).unwrap()
}

#[test]
fn cli_runs_a_team_file_and_reports_the_new_figures() {
    let path = team_file(
        "json",
        &format!("{DESK_AND_COOK}\n[workload]\nrate = 500\ncount = 5\n"),
    );
    // Repeated: each repeat in a process of its own, with the same flags.
    let json = team_json(
        &path,
        &["--count", "4", "--halt-probes", "1", "--repeat", "2"],
    );
    assert_eq!(json["scenario"], "team");
    assert_eq!(json["tasks_sent"], 4);
    assert_eq!(json["event_latency"]["answered"], 4);
    assert_eq!(json["workload"]["mode"], "rate");
    assert_eq!(json["workload"]["count"], 4);
    assert_eq!(json["lost_events"], 0);
    assert_eq!(json["timed_out"], false);
    assert_eq!(json["unfinished_tasks"], 0);
    let retries: Vec<&str> = json["retries"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        retries,
        ["408", "429", "5xx", "connect", "other", "timeout"]
    );
    assert!(json["series"].as_array().is_some_and(|s| !s.is_empty()));
    assert_eq!(json["repeat"]["runs"], 2, "{json}");
    assert!(json["repeat"]["figures"]["event_latency.p90_ms"].is_object());
}

#[test]
fn cli_refuses_bad_workloads_naming_the_key_and_the_line() {
    let cases = [
        (
            "agents = [\"desk\", \"chef\", \"waiter\"]",
            "line 22, column 19: invalid value for `workload.agents[1]`: \"chef\", \"waiter\" \
             (allowed: agents of the team: desk, cook)",
        ),
        (
            "rate = \"fast\"",
            "line 22, column 8: `workload.rate`: invalid type: string \"fast\", expected f64",
        ),
        (
            "rate = -2",
            "line 22, column 8: invalid value for `workload.rate`: -2 (allowed: a number greater \
             than 0, at most 1000000)",
        ),
        (
            "duration_seconds = 0",
            "line 22, column 20: invalid value for `workload.duration_seconds`: 0 (allowed: a \
             number greater than 0, at most 31536000)",
        ),
        (
            "count = 1.5",
            "line 22, column 9: `workload.count`: invalid type: floating point `1.5`, expected i64",
        ),
        (
            "rate = 1\nconcurrency = 2",
            "line 23, column 15: invalid value for `workload.concurrency`: 2 (allowed: unset when \
             `workload.rate` is set: `rate` is an open loop, `concurrency` a closed one; set one \
             of them)",
        ),
        (
            "ratee = 1",
            "line 22, column 1: `workload.ratee`: unknown field `ratee`, expected one of `agents`, \
             `rate`, `concurrency`, `duration_seconds`, `count`, `templates`",
        ),
    ];
    for (i, (line, expected)) in cases.iter().enumerate() {
        let path = team_file(
            &format!("bad{i}"),
            &format!("{DESK_AND_COOK}\n[workload]\n{line}\n"),
        );
        let (code, stdout, stderr) = loadtest_cli(&["--config", path.to_str().unwrap(), "--json"]);
        assert_eq!(code, 1, "{line}: {stderr}");
        assert_eq!(stdout, "", "{line}");
        let first = stderr.lines().next().unwrap_or_default();
        let want = format!("error: {}: invalid config: {expected}", path.display());
        assert!(first.starts_with(&want), "{line}:\n{first}\nwanted\n{want}");
    }
}

#[test]
fn cli_workload_flags_are_checked_like_the_others() {
    let path = team_file("flags", DESK_AND_COOK);
    let path = path.to_str().unwrap();
    let cases = [
        (
            &["--config", path, "--rate", "0"][..],
            "error: invalid value '0' for '--rate <RATE>': must be a number of events per second \
             greater than 0 (at most 1000000)",
        ),
        (
            &["--config", path, "--duration", "x"][..],
            "error: invalid value 'x' for '--duration <DURATION>': must be a number of seconds \
             greater than 0 (at most 31536000)",
        ),
        (
            &["--config", path, "--count", "0"][..],
            "error: invalid value '0' for '--count <COUNT>': must be at least 1",
        ),
        (
            &["--rate", "5"][..],
            "error: the following required arguments were not provided:",
        ),
        (
            &["--config", path, "--agents", "5"][..],
            "error: the argument '--config <CONFIG>' cannot be used with '--agents <AGENTS>'",
        ),
        (
            &["--config", path, "--rate", "5", "--concurrency", "2"][..],
            "error: the argument '--rate <RATE>' cannot be used with '--concurrency <CONCURRENCY>'",
        ),
    ];
    assert_usage_errors(&cases);
}

#[test]
fn cli_fails_fast_on_an_unreachable_model_server() {
    // A port nobody listens on: the connect is refused before anything is spawned.
    let url = format!("http://127.0.0.1:{}/v1", warden_testkit::free_port());
    let path = team_file(
        "unreachable",
        &format!(
            "[providers.local]\nkind = \"openai_compatible\"\nbase_url = \"{url}\"\nmodel = \"m\"\n\n\
             [[agents]]\nkey = \"desk\"\nprovider = \"local\"\n"
        ),
    );
    let (code, stdout, stderr) = loadtest_cli(&["--config", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "");
    let want = format!(
        "error: {}: provider `local`: cannot reach {url}: 127.0.0.1:",
        path.display()
    );
    assert!(stderr.starts_with(&want), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    // Nothing ran: no report, no progress, one line.
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// Against a real OpenAI-compatible server: its 429 is retried by the provider and counted by class.
#[actix_rt::test]
async fn cli_load_tests_a_model_server_through_the_retries() {
    use warden_testkit::http::{ok_json, status, Server};
    let answer = serde_json::json!({"choices": [{"message": {"role": "assistant", "content": "hi"},
        "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}});
    let server = Server::start(vec![
        // The reachability check's connect (no request is sent on it).
        vec![],
        vec![status(429, r#"{"error":{"message":"slow down"}}"#)],
        vec![ok_json(answer.clone())],
        vec![ok_json(answer)],
    ])
    .await;
    let path = team_file(
        "server",
        &format!(
            "[providers.local]\nkind = \"openai_compatible\"\nbase_url = \"{}\"\nmodel = \"m\"\n\
             retry_base_ms = 1\nretry_cap_ms = 1\n\n\
             [[agents]]\nkey = \"desk\"\nprovider = \"local\"\ndelegate = false\n\n\
             [workload]\nconcurrency = 1\ncount = 2\n",
            server.url("/v1")
        ),
    );
    let path = path.to_str().unwrap().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        loadtest_cli(&["--config", &path, "--halt-probes", "0", "--json"])
    })
    .await
    .unwrap();
    let (code, stdout, stderr) = out;
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["event_latency"]["answered"], 2, "{json}");
    assert_eq!(json["retries"]["429"], 1, "{json}");
    assert_eq!(json["steps"], 2, "{json}");
    assert_eq!(server.bodies().len(), 3);
}

#[test]
fn repeat_reports_median_and_range_and_compare_reads_them() {
    let run = |seed: &str| {
        let (code, stdout, stderr) = loadtest_cli(&[
            "--agents",
            "13",
            "--halt-probes",
            "1",
            "--repeat",
            "3",
            "--seed",
            seed,
            "--json",
        ]);
        assert_eq!(code, 0, "{stderr}");
        let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(json["repeat"]["runs"], 3);
        let f = &json["repeat"]["figures"]["duration_s"];
        assert!(f["min"].as_f64() <= f["median"].as_f64(), "{f}");
        assert!(f["median"].as_f64() <= f["max"].as_f64(), "{f}");
        stdout
    };
    let dir = warden_testkit::scratch_dir("loadtest", "compare");
    let a = dir.join("a.json");
    let b = dir.join("b.json");
    std::fs::write(&a, run("1")).unwrap();
    std::fs::write(&b, run("1")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["loadtest", "compare"])
        .args([&a, &b])
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = json["figures"].as_array().unwrap();
    let duration = rows.iter().find(|r| r["figure"] == "duration_s").unwrap();
    // Both sides have every run's value: the test over 3 + 3 runs cannot reach p < 0.05.
    let verdict = duration["verdict"].as_str().unwrap();
    assert!(verdict.starts_with("too few runs to tell"), "{verdict}");
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["loadtest", "compare"])
        .args([&a, &b])
        .output()
        .unwrap();
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.starts_with("A: scenario steady, seed 1, 13 agents, 3 runs\n"),
        "{text}"
    );
    assert!(text.contains("\n  steps_per_sec "), "{text}");
}

/// Checks that `html` is well-formed XML-style markup: every tag closed in order (self-closing
/// tags allowed), after the doctype. Returns the tags seen, by name.
fn check_well_formed(html: &str) -> Vec<String> {
    let body = html
        .strip_prefix("<!DOCTYPE html>\n")
        .expect("starts with the doctype");
    let mut stack: Vec<String> = Vec::new();
    let mut seen = Vec::new();
    let mut rest = body;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("a tag ends") + open;
        let tag = &rest[open + 1..close];
        assert!(!tag.contains('<'), "a `<` inside a tag: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "closing {name}");
        } else {
            let name = tag.split_whitespace().next().unwrap().trim_end_matches('/');
            seen.push(name.to_owned());
            if !tag.ends_with('/') {
                stack.push(name.to_owned());
            }
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    seen
}

/// `warden loadtest ARGS --report FILE`, which must succeed: the file and its text.
fn html_report(name: &str, args: &[&str]) -> (TeamPath, String) {
    let dir = warden_testkit::scratch_dir("loadtest", name);
    let path = TeamPath {
        path: dir.join("report.html"),
        _dir: dir,
    };
    let mut all = args.to_vec();
    all.extend(["--report", path.to_str().unwrap()]);
    let (code, _, stderr) = loadtest_cli(&all);
    assert_eq!(code, 0, "{stderr}");
    let html = std::fs::read_to_string(&path).unwrap();
    (path, html)
}

#[test]
fn cli_writes_a_self_contained_html_report() {
    let (_, html) = html_report(
        "html",
        &[
            "--scenario",
            "cascade",
            "--agents",
            "40",
            "--halt-probes",
            "1",
        ],
    );
    let tags = check_well_formed(&html);
    // Self-contained: no reference to anything on a network, no script, nothing loaded.
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert!(!tags
        .iter()
        .any(|t| ["script", "link", "img", "iframe"].contains(&t.as_str())));
    // Eight charts: throughput, latency, events not answered, agents by state, RSS, histogram,
    // lockouts, refusals.
    assert_eq!(tags.iter().filter(|t| *t == "svg").count(), 8);
    assert!(html.contains("Resident set (VmRSS) (MiB)"), "{html}");
    assert!(html.contains("Events not answered, by fate"), "{html}");
    assert!(html.contains(">p95</text>"), "{html}");
    assert!(html.contains("invariants: pass"), "{html}");
    assert!(html.contains("Lockouts by depth"));
    assert!(
        html.contains("&quot;scenario&quot;: &quot;cascade&quot;"),
        "{html}"
    );

    // A broken invariant shows as FAIL in the header.
    let mut report = run_loadtest(LoadtestOptions {
        halt_probes: 0,
        ..small(Scenario::Steady)
    });
    report.lost_events = 1;
    let mut out = Vec::new();
    warden::loadtest::html::write_html(&mut out, &report, &serde_json::json!({})).unwrap();
    let html = String::from_utf8(out).unwrap();
    check_well_formed(&html);
    assert!(html.contains("invariants: FAIL"));
    assert!(
        html.contains("<td class=\"fail\">FAIL</td><td>1</td>"),
        "{html}"
    );

    // A second with no answer is a gap in the latency lines, not a zero; the histogram is on a
    // log scale (a fast bulk and a slow tail both show).
    let second = |t_s: f64, answered: u64| warden::loadtest::Sample {
        t_s,
        answered,
        latency_p50_ms: if answered > 0 { 10.0 } else { 0.0 },
        latency_p90_ms: if answered > 0 { 20.0 } else { 0.0 },
        latency_p95_ms: if answered > 0 { 30.0 } else { 0.0 },
        latency_p99_ms: if answered > 0 { 40.0 } else { 0.0 },
        ..Default::default()
    };
    report.series = vec![
        second(1.0, 3),
        second(2.0, 3),
        second(3.0, 0),
        second(4.0, 3),
        second(5.0, 3),
    ];
    report.event_latencies_us = vec![1_000; 1000];
    report.event_latencies_us.push(1_000_000);
    let mut out = Vec::new();
    warden::loadtest::html::write_html(&mut out, &report, &serde_json::json!({})).unwrap();
    let html = String::from_utf8(out).unwrap();
    check_well_formed(&html);
    let chart = |title: &str| {
        html.split("<svg")
            .find(|svg| svg.contains(title))
            .unwrap()
            .to_owned()
    };
    let latency = chart("Event latency (accepted");
    // Four lines (p50, p90, p95, p99), each in two pieces around the silent second.
    assert_eq!(latency.matches("<polyline").count(), 8, "{latency}");
    // Nothing is drawn at 0 ms: the y axis of 0 is at y = 180.
    assert!(!latency.contains(",180.0"), "{latency}");
    let histogram = chart("histogram");
    assert!(histogram.contains("log scale"), "{histogram}");
    // 1 ms to 1000 ms: 13 buckets of a quarter decade, the first and last labelled.
    assert_eq!(histogram.matches("<rect").count(), 13, "{histogram}");
    assert!(histogram.contains(">1.0</text>"), "{histogram}");
    assert!(histogram.contains(">1000</text>"), "{histogram}");
}

/// Renders the report in a headless Chromium when one is installed (optional; skipped loudly).
#[test]
fn the_html_report_renders_in_a_headless_browser() {
    let browser = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    let Some(browser) = browser else {
        warden_testkit::skip("the_html_report_renders_in_a_headless_browser: no chromium on PATH");
        return;
    };
    let (path, _) = html_report("render", &["--agents", "13", "--halt-probes", "0"]);
    let out = std::process::Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", path.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains("<svg"), "{dom}");
    assert!(dom.contains("invariants: pass"), "{dom}");
    // A screenshot, kept as a test artefact (target/tmp/artefacts/loadtest-report.png).
    let artefacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("artefacts");
    std::fs::create_dir_all(&artefacts).unwrap();
    let png = artefacts.join("loadtest-report.png");
    let _ = std::fs::remove_file(&png);
    let shot = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg("--window-size=1400,2400")
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", path.display()))
        .output()
        .unwrap();
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "no screenshot ({size} bytes): {shot:?}");
    eprintln!("screenshot: {}", png.display());
}

/// The example team file of docs/loadtest.md, and the errors the page shows for it.
fn doc_example() -> (String, Vec<String>) {
    let doc = include_str!("../docs/loadtest.md");
    let after = doc
        .split("<!-- example: team-workload -->\n```toml\n")
        .nth(1)
        .expect("the example's marker");
    let toml = after.split("\n```").next().unwrap().to_owned() + "\n";
    let errors = doc
        .lines()
        .filter(|l| l.starts_with("error: team.toml: invalid config: "))
        .map(str::to_owned)
        .collect();
    (toml, errors)
}

#[test]
fn the_documented_team_file_runs_and_its_documented_errors_are_the_real_ones() {
    let (toml, errors) = doc_example();
    let path = team_file("doc", &toml);
    let json = team_json(&path, &["--duration", "0.3", "--halt-probes", "0"]);
    assert_eq!(json["lost_events"], 0, "{json}");
    assert_eq!(json["workload"]["mode"], "rate");
    assert_eq!(json["workload"]["agents"], serde_json::json!(["concierge"]));
    // 20 events/s for 0.3 s: events 0 to 5 are due (event n at n/20 s).
    assert_eq!(json["tasks_sent"], 6, "{json}");
    assert_eq!(json["event_latency"]["answered"], 6, "{json}");
    assert_eq!(json["delegations"]["accepted"], 6, "{json}");
    // `warden config check` (as `warden run` and `warden serve`) accepts the file, [workload] and all.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    // Every key of the report is in the page's contract.
    let doc = include_str!("../docs/loadtest.md");
    for key in json.as_object().unwrap().keys() {
        assert!(
            doc.contains(&format!("\"{key}\"")),
            "{key} is not documented"
        );
    }

    let rate_line = toml
        .lines()
        .find(|l| l.starts_with("rate = "))
        .unwrap()
        .to_owned();
    let mutations = [
        toml.replace("agents = [\"concierge\"]", "agents = [\"conceirge\"]"),
        toml.replace(&rate_line, "rate = \"fast\""),
        toml.replace(&rate_line, "rate = -2"),
        toml.replace("\"failed_rate == 0\"", "\"p99 < fast\""),
    ];
    assert_eq!(errors.len(), mutations.len(), "{errors:?}");
    for (i, (text, documented)) in mutations.iter().zip(&errors).enumerate() {
        let path = team_file(&format!("doc{i}"), text);
        let (code, _, stderr) = loadtest_cli(&["--config", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{stderr}");
        let real = stderr
            .lines()
            .next()
            .unwrap_or_default()
            .replace(path.to_str().unwrap(), "team.toml");
        assert_eq!(&real, documented);
    }
}

#[test]
fn a_team_file_run_cut_by_its_timeout_is_reported_as_timed_out() {
    // Every answer takes 2 s; the 0.2 s timeout cuts the run with the 3 events sent and open.
    let text = DESK_AND_COOK.replace(
        "replies = [\"cooked\"]",
        "replies = [\"cooked\"]\nlatency_ms = 2000",
    ) + "\n[workload]\nrate = 1000\ncount = 3\n";
    let path = team_file("timeout", &text);
    let (code, stdout, stderr) = loadtest_cli(&[
        "--config",
        path.to_str().unwrap(),
        "--timeout-s",
        "0.2",
        "--halt-probes",
        "0",
        "--json",
    ]);
    assert_eq!(code, 12, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["timed_out"], true, "{json}");
    assert_eq!(json["tasks_sent"], 3, "{json}");
    // The desk takes one event at a time: the first waits on its delegation (the cook's 2 s
    // answer), the other two are queued behind it; plus the delegated task.
    assert_eq!(json["unfinished_tasks"], 4, "{json}");
    assert_eq!(json["delegations"]["accepted"], 1, "{json}");
    assert_eq!(json["lost_events"], 0, "{json}");
    assert_eq!(
        stderr,
        "loadtest: timed out after 0.2 s (--timeout-s): 4 tasks unfinished\n"
    );
}

#[test]
fn the_soak_example_cascades_its_faults() {
    let path = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/teams/soak-cascade.toml"
    ));
    // 40 events; archivist-b fails three calls in a row at its 8th to 10th call: locked out.
    let json = team_json(path, &["--count", "40", "--halt-probes", "0"]);
    assert_eq!(json["lost_events"], 0, "{json}");
    assert_eq!(json["leaked_slots"], 0, "{json}");
    assert_eq!(json["lockouts"], 1, "{json}");
    assert_eq!(json["lockouts_by_depth"], serde_json::json!([0, 0, 1]));
    assert!(json["refusals_by_depth"][2].as_u64().unwrap() > 0, "{json}");
    // A short run has no soak figures.
    assert!(json.get("soak").is_none(), "{json}");
}

// ---- `warden loadtest --cluster`: the fleet on cluster nodes (real nats-server) ----------------

/// `warden loadtest --cluster URL ARGS --json`: the exit code, the report and stderr.
fn cluster_run(url: &str, args: &[&str]) -> (i32, serde_json::Value, String) {
    let mut all = vec!["--cluster", url, "--json"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = loadtest_cli(&all);
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (code, json, stderr)
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn a_cascade_on_three_cluster_nodes_runs_every_cross_node_delegation_once() {
    let dir = std::env::temp_dir().join(format!("warden-lt-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let Some(nats) = warden_testkit::nats::NatsServer::start(&dir) else {
        return;
    };
    let url = nats.url();
    let args = [
        "--nodes",
        "3",
        "--scenario",
        "cascade",
        "--agents",
        "40",
        "--tasks-per-agent",
        "10",
        "--halt-probes",
        "1",
        "--backlog",
        "10",
        "--timeout-s",
        "60",
    ];
    let mut namespaces = Vec::new();
    // Twice on one NATS server: the first run's halt key (left halted) does not halt the second.
    for run in 0..2 {
        let (code, r, stderr) = cluster_run(&url, &args);
        assert_eq!(code, 0, "run {run}: {stderr}\n{r}");
        assert_eq!(r["scenario"], "cascade");
        assert_eq!((u(&r["lost_events"]), u(&r["leaked_slots"])), (0, 0), "{r}");
        assert_eq!(u(&r["agents"]), 40);
        assert_eq!(u(&r["halt_all"]["agents"]), 40, "{r}");
        let nodes = r["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 3, "{r}");
        // 40 agents = 3 trees of 13 + a root: depth 0 (4 roots) on a, 9 on b, 27 on c.
        let agents: Vec<u64> = nodes.iter().map(|n| u(&n["agents"])).collect();
        assert_eq!(agents, [4, 9, 27], "{r}");
        for n in nodes {
            assert!(u(&n["turns"]) > 0, "{n}");
            assert!(u(&n["llm_calls"]) > 0, "{n}");
            assert_eq!(n["halt_answered"], true, "{n}");
            assert!(n["halt_ack_ms"].as_f64().is_some(), "{n}");
        }
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
        // a delegates to b, b to c; c's leaves delegate nothing; a receives nothing.
        assert!(
            u(&a["delegations_sent"]) > 0 && u(&b["delegations_sent"]) > 0,
            "{r}"
        );
        assert_eq!(u(&c["delegations_sent"]), 0, "{r}");
        assert_eq!(u(&a["delegations_ran"]), 0, "{r}");
        // Every delegation sent from a ran once on b, every one from b once on c.
        assert_eq!(u(&a["delegations_sent"]), u(&b["delegations_ran"]), "{r}");
        assert_eq!(u(&b["delegations_sent"]), u(&c["delegations_ran"]), "{r}");
        assert!(u(&b["delegations_received"]) >= u(&b["delegations_ran"]));
        // 4 roots × 10 tasks, each delegated by its root to each of its children on b.
        assert_eq!(u(&r["tasks_sent"]), 40, "{r}");
        assert_eq!(u(&a["delegations_sent"]), 10 * 9, "{r}");
        let cl = &r["cluster"];
        assert_eq!(u(&cl["nodes"]), 3);
        assert_eq!(cl["url"], url.as_str());
        assert_eq!(u(&cl["delegations_sent"]), u(&cl["delegations_ran"]), "{r}");
        assert_eq!(u(&cl["delegations_unmatched"]), 0, "{r}");
        assert_eq!(u(&cl["refused_unknown"]), 0, "every lease found: {r}");
        assert_eq!(cl["halt_unreached"], serde_json::json!([]), "{r}");
        assert!(cl["halt_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{r}");
        assert_eq!(cl["buckets_removed"], true, "{r}");
        // The leaves (depth 2, on c) fail and are locked out; b's delegations to them are refused.
        assert!(u(&c["lockouts"]) > 0, "{r}");
        assert_eq!(u(&c["lockouts"]), u(&r["lockouts_by_depth"][2]), "{r}");
        assert!(u(&b["refusals"]) > 0, "{r}");
        let d = &r["delegations"];
        assert_eq!(
            u(&d["requested"]),
            u(&d["accepted"])
                + u(&d["refused_budget"])
                + u(&d["refused_hops"])
                + u(&d["refused_locked"])
                + u(&d["refused_cycle"]),
            "{r}"
        );
        // Every agent has one parent, which sends it one task at a time: the counts do not
        // depend on the interleaving, and are those of the same fleet on one node.
        let one = run_loadtest(LoadtestOptions {
            agents: 40,
            tasks_per_agent: 10,
            halt_probes: 0,
            ..LoadtestOptions::new(Scenario::Cascade)
        });
        assert_eq!(u(&r["steps"]), one.steps, "{r}");
        assert_eq!(u(&r["tool_calls"]), one.tool_calls, "{r}");
        assert_eq!(
            r["delegations"],
            serde_json::to_value(&one.delegations).unwrap(),
            "{r}"
        );
        assert_eq!(
            r["lockouts_by_depth"],
            serde_json::json!(one.lockouts_by_depth)
        );
        assert_eq!(
            r["refusals_by_depth"],
            serde_json::json!(one.refusals_by_depth)
        );
        namespaces.push(cl["namespace"].as_str().unwrap_or_default().to_owned());
    }
    assert_ne!(namespaces[0], namespaces[1]);
    drop(nats);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_halt_storm_on_two_cluster_nodes_keeps_its_accounting() {
    let dir = std::env::temp_dir().join(format!("warden-lt-storm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let Some(nats) = warden_testkit::nats::NatsServer::start(&dir) else {
        return;
    };
    let (code, r, stderr) = cluster_run(
        &nats.url(),
        &[
            "--nodes",
            "2",
            "--scenario",
            "halt-storm",
            "--agents",
            "40",
            "--tasks-per-agent",
            "4",
            "--halt-probes",
            "0",
            "--timeout-s",
            "60",
        ],
    );
    assert_eq!(code, 0, "{stderr}\n{r}");
    assert_eq!((u(&r["lost_events"]), u(&r["leaked_slots"])), (0, 0), "{r}");
    let nodes = r["nodes"].as_array().expect("nodes");
    // Depths 0 and 2 on a (4 + 27), depth 1 on b.
    let agents: Vec<u64> = nodes.iter().map(|n| u(&n["agents"])).collect();
    assert_eq!(agents, [31, 9], "{r}");
    assert_eq!(r["cluster"]["halt_unreached"], serde_json::json!([]), "{r}");
    // Every node answered the halt broadcast (each had seen the other's heartbeat before the drive).
    assert_eq!(u(&r["halt_all"]["agents"]), 40, "{r}");
    for n in nodes {
        assert!(n["halt_ack_ms"].as_f64().is_some(), "{n}");
        assert_eq!(n["halt_answered"], true, "{n}");
    }
    drop(nats);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cluster_flags_are_checked_and_an_unreachable_nats_is_named() {
    let cases = [
        (
            &["--cluster", "nats://127.0.0.1:1", "--nodes", "1"][..],
            "error: invalid value '1' for '--nodes <NODES>': must be a whole number from 2 to 26",
        ),
        (
            &["--cluster", "http://127.0.0.1:1"][..],
            "error: invalid value 'http://127.0.0.1:1' for '--cluster <nats://HOST:PORT>': \
             allowed: nats://HOST:PORT (tls://HOST:PORT: TLS required), several separated by \
             commas (USER:PASSWORD@ or TOKEN@ \
             before HOST for a server that wants them)",
        ),
    ];
    assert_usage_errors(&cases);
    let (code, _, stderr) = loadtest_cli(&["--nodes", "3"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--cluster"), "{stderr}");
    // Nothing listens there: refused before anything runs.
    let port = warden_testkit::free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let (code, stdout, stderr) = loadtest_cli(&["--cluster", &url, "--agents", "5"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!("error: cluster: cannot connect to NATS at {url}")),
        "{stderr}"
    );
}

// ---- issue 34: interrupts keep the report, every event counted by fate ------------------------

/// A desk that delegates every event to a cook who answers in `cook_ms`, at `rate` events/s for
/// an hour: a run that is only ever ended by a signal.
fn endless_team(name: &str, cook_ms: u64) -> TeamPath {
    let text = DESK_AND_COOK.replace(
        "replies = [\"cooked\"]",
        &format!("replies = [\"cooked\"]\nlatency_ms = {cook_ms}"),
    ) + "\n[workload]\nrate = 50\nduration_seconds = 3600\n";
    team_file(name, &text)
}

/// Polls `done` every 50 ms for at most `limit` (a bound on a wait, not a timing assertion).
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// Whether process `pid` catches `signal` (its `SigCgt` mask in /proc): its handler is in place.
fn catches(pid: u32, signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// The children of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

/// Every event sent is counted once by fate.
fn check_outcomes(json: &serde_json::Value) {
    let o = &json["outcomes"];
    let total: u64 = [
        "answered",
        "failed",
        "refused",
        "discarded",
        "gone",
        "timed_out",
    ]
    .iter()
    .map(|k| o[k].as_u64().unwrap())
    .sum();
    assert_eq!(total, u(&json["tasks_sent"]), "{json}");
    assert_eq!(o["answered"], json["event_latency"]["answered"], "{json}");
    let by_reason: u64 = o["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| u(&r["count"]))
        .sum();
    assert_eq!(by_reason, total - u(&o["answered"]), "{json}");
}

#[test]
fn ctrl_c_in_a_terminal_drains_and_keeps_the_report() {
    if std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_err()
    {
        warden_testkit::skip("ctrl_c_in_a_terminal_drains_and_keeps_the_report: no tmux");
        return;
    }
    let path = endless_team("ctrl-c", 20);
    let dir = path.parent().unwrap().to_owned();
    let (out, html, rc) = (dir.join("out.json"), dir.join("run.html"), dir.join("rc"));
    let session = format!("warden-loadtest-{}", std::process::id());
    // stdout and the exit code to files; stderr (the progress bar) on the terminal. The shell
    // traps SIGINT (a handler, reset to the default in warden) so that it lives to write the code.
    let command = format!(
        "trap : INT; {} loadtest --config {} --halt-probes 1 --json --report {} > {}; echo $? > {}",
        env!("CARGO_BIN_EXE_warden"),
        path.display(),
        html.display(),
        out.display(),
        rc.display()
    );
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .args(args)
            .output()
            .unwrap()
    };
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "200",
        "-y",
        "20",
        "sh",
        "-c",
        &command,
    ]);
    assert!(started.status.success(), "{started:?}");
    let pane = || {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned()
    };
    // The drive phase is under way when its progress bar shows, with its total known: 50
    // events/s for 3600 s (not "…/0").
    let driving = wait_for(Duration::from_secs(60), || {
        let screen = pane();
        screen.contains("drive") && screen.contains("/180000")
    });
    if !driving {
        let screen = pane();
        tmux(&["kill-session", "-t", &session]);
        panic!("no progress bar with its total: {screen}");
    }
    tmux(&["send-keys", "-t", &session, "C-c", ""]);
    let ended = wait_for(Duration::from_secs(60), || {
        std::fs::read_to_string(&rc).is_ok_and(|t| t.ends_with('\n'))
    });
    let screen = pane();
    tmux(&["kill-session", "-t", &session]);
    assert!(ended, "the run did not end after Ctrl-C: {screen}");
    let code = std::fs::read_to_string(&rc).unwrap();
    let stdout = std::fs::read_to_string(&out).unwrap();
    assert_eq!(code.trim(), "14", "stdout: {stdout:?}, screen: {screen}");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["interrupted"], "SIGINT", "{json}");
    assert!(u(&json["tasks_sent"]) > 0, "{json}");
    assert_eq!(json["lost_events"], 0, "{json}");
    assert_eq!(json["leaked_slots"], 0, "{json}");
    // Stopped sending and drained: every event sent settled, none cut.
    check_outcomes(&json);
    assert_eq!(json["outcomes"]["timed_out"], 0, "{json}");
    assert_eq!(json["timed_out"], false, "{json}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("interrupted by SIGINT"), "{page}");
}

#[test]
fn sigterm_to_a_repeating_run_is_forwarded_to_its_child_and_reported() {
    let path = endless_team("sigterm", 20);
    let mut parent = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["loadtest", "--config", path.to_str().unwrap()])
        .args(["--halt-probes", "0", "--repeat", "2", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = parent.id();
    // The first repeat runs in a child; both catch SIGTERM once their handlers are in place.
    let mut child = 0;
    let ready = wait_for(Duration::from_secs(60), || {
        child = children(pid).first().copied().unwrap_or(0);
        child > 0 && catches(pid, 15) && catches(child, 15)
    });
    if !ready {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .args(children(pid).iter().map(u32::to_string))
            .status();
    }
    assert!(
        ready,
        "no child catching SIGTERM (children {:?})",
        children(pid)
    );
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let waited = wait_for(Duration::from_secs(60), || {
        matches!(parent.try_wait(), Ok(Some(_)))
    });
    let child_left = alive(child);
    if child_left || !waited {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &child.to_string(), &pid.to_string()])
            .status();
    }
    assert!(waited, "the parent did not end after SIGTERM");
    let out = parent.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !child_left,
        "the child run is still going after the parent's SIGTERM: {stderr}"
    );
    assert_eq!(out.status.code(), Some(14), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // (The signal may come before the child's first event: what was done can be nothing.)
    assert_eq!(json["interrupted"], "SIGTERM", "{json}");
    check_outcomes(&json);
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
}

#[test]
fn report_destinations_are_checked_before_the_run() {
    let path = team_file(
        "destinations",
        &format!("{DESK_AND_COOK}\n[workload]\nrate = 500\ncount = 3\n"),
    );
    let (code, stdout, stderr) = loadtest_cli(&[
        "--config",
        path.to_str().unwrap(),
        "--halt-probes",
        "0",
        "--report",
        "/nonexistent-warden-dir/run.html",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with("error: cannot write /nonexistent-warden-dir/run.html"),
        "{stderr}"
    );
    // Nothing ran: no report on stdout.
    assert_eq!(stdout, "", "{stderr}");
}

#[test]
fn every_event_is_counted_by_fate_and_a_run_where_all_failed_says_so() {
    // Every model call fails as a 401 would: nothing is answered.
    let text = r#"
[providers.desk]
kind = "scripted"
cycle = true
replies = [{ fail = "401 Unauthorized: invalid api key" }]

[[agents]]
key = "desk"
provider = "desk"

[safety.breakers]
max_consecutive_errors = 1000

[workload]
rate = 500
count = 10
"#;
    let path = team_file("all-fail", text);
    let json = team_json(&path, &["--halt-probes", "0"]);
    check_outcomes(&json);
    // 7 turns fail; the 8th failure trips the error-window breaker (its turn ends in the
    // lockout: refused), and the last two events are refused by the locked-out desk.
    let o = &json["outcomes"];
    assert_eq!(o["answered"], 0, "{json}");
    assert_eq!(o["failed"], 7, "{json}");
    assert_eq!(o["refused"], 3, "{json}");
    assert_eq!(o["reasons"][0]["fate"], "failed", "{json}");
    assert_eq!(o["reasons"][0]["reason"], "llm_error", "{json}");
    assert_eq!(o["reasons"][0]["count"], 7, "{json}");
    let sample = |i: usize| o["reasons"][i]["sample"].as_str().unwrap().to_owned();
    assert!(sample(0).contains("401"), "{json}");
    assert_eq!(o["reasons"][1]["reason"], "locked_out", "{json}");
    assert!(sample(1).contains("error cascade"), "{json}");
    let desk = &json["turns_by_agent"]["desk"];
    assert_eq!(desk["turns"]["llm_error"], 7, "{json}");
    assert_eq!(desk["turns"]["safety_lockout"], 1, "{json}");
    assert_eq!(desk["role"], "assistant", "{json}");
    assert_eq!(json["turns_by_depth"][0]["llm_error"], 7, "{json}");
    // The table says it in words.
    let (code, table, stderr) =
        loadtest_cli(&["--config", path.to_str().unwrap(), "--halt-probes", "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        table.contains("10 settled: 0 answered, 7 failed, 3 refused"),
        "{table}"
    );
    assert!(table.contains("NONE ANSWERED"), "{table}");
    assert!(
        table.contains("failed      7 llm_error: llm call failed: 401 Unauthorized"),
        "{table}"
    );
}

#[test]
fn a_budget_stop_names_the_stopped_agent_its_depth_and_cause() {
    // A budget of one token: the desk is stopped by its first call; the rest are refused.
    let text = format!(
        "{DESK_AND_COOK}\n[safety.budget]\ntokens_per_agent = 1\n\n[workload]\nconcurrency = 1\ncount = 5\n"
    );
    let path = team_file("budget", &text);
    let json = team_json(&path, &["--halt-probes", "0"]);
    check_outcomes(&json);
    assert_eq!(json["stopped"], 1, "{json}");
    let stopped = &json["stopped_agents"][0];
    assert_eq!(stopped["agent"], "desk", "{json}");
    assert_eq!(stopped["depth"], 0, "{json}");
    assert!(
        stopped["cause"]
            .as_str()
            .unwrap()
            .starts_with("budget_exceeded"),
        "{json}"
    );
    assert!(u(&json["outcomes"]["refused"]) >= 4, "{json}");
}

// ---- thresholds: parsed and judged on synthetic reports --------------------------------------

use serde_json::json;
use warden::loadtest::thresholds::{Op, Threshold, ThresholdError};

#[test]
fn thresholds_parse_every_operator_and_refuses_what_is_not_a_threshold() {
    for (text, op) in [
        ("steps<1", Op::Lt),
        ("steps<=1", Op::Le),
        ("steps>1", Op::Gt),
        ("steps>=1", Op::Ge),
        ("steps==1", Op::Eq),
    ] {
        assert_eq!(Threshold::parse(text).unwrap().op, op, "{text}");
    }
    assert!(matches!(
        Threshold::parse("steps"),
        Err(ThresholdError::Malformed(_))
    ));
    assert!(matches!(
        Threshold::parse("<5"),
        Err(ThresholdError::Malformed(_))
    ));
    assert!(matches!(
        Threshold::parse("steps<fast"),
        Err(ThresholdError::NotANumber { .. })
    ));
    assert!(matches!(
        Threshold::parse("steps<inf"),
        Err(ThresholdError::NotANumber { .. })
    ));
    assert!(matches!(
        Threshold::parse("event_latency.p98_ms<5"),
        Err(ThresholdError::UnknownMetric { .. })
    ));
    // Not a number: an object.
    assert!(matches!(
        Threshold::parse("event_latency<5"),
        Err(ThresholdError::UnknownMetric { .. })
    ));
    assert!(Threshold::parse("retries.429==0").is_ok());
    assert!(Threshold::parse("retries.418==0").is_err());
}

#[test]
fn thresholds_evaluate_paths_rates_and_depths() {
    let report = json!({
        "tasks_sent": 200,
        "outcomes": {"answered": 190, "failed": 6, "refused": 4},
        "event_latency": {"p99_ms": 480.0},
        "lockouts_by_depth": [0, 0, 2],
    });
    let verdict = |text: &str| Threshold::parse(text).unwrap().evaluate(&report);
    assert!(verdict("event_latency.p99_ms<500").pass);
    assert!(!verdict("event_latency.p99_ms<400").pass);
    assert_eq!(verdict("failed_rate<0.01").value, Some(0.03));
    assert!(!verdict("failed_rate<0.01").pass);
    assert_eq!(verdict("unanswered_rate<=0.05").value, Some(0.05));
    assert!(verdict("unanswered_rate<=0.05").pass);
    assert!(!verdict("lockouts.d2<=1").pass);
    assert!(verdict("lockouts.d7==0").pass);
    // A figure the report does not have fails.
    let missing = verdict("halt.latency_us_p99<10");
    assert_eq!((missing.value, missing.pass), (None, false));
}

#[test]
fn thresholds_fail_a_run_with_exit_15_and_are_listed_in_the_report() {
    // Every model call fails: a latency threshold holds (nothing answered, p99 0), the failure
    // rate's does not.
    let text = r#"
[providers.desk]
kind = "scripted"
cycle = true
replies = [{ fail = "401 Unauthorized" }]

[[agents]]
key = "desk"
provider = "desk"

[workload]
rate = 500
count = 4
thresholds = ["event_latency.p99_ms < 100000"]
"#;
    let path = team_file("thresholds", text);
    let config = path.to_str().unwrap();
    let (code, stdout, stderr) = loadtest_cli(&[
        "--config",
        config,
        "--halt-probes",
        "0",
        "--threshold",
        "failed_rate<0.01",
        "--threshold",
        "lockouts.d0<=1",
        "--json",
    ]);
    assert_eq!(code, 15, "{stderr}");
    assert_eq!(
        stderr,
        "loadtest: 1 of 3 thresholds failed: failed_rate<0.01\n"
    );
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        json["thresholds"],
        json!([
            {"threshold": "event_latency.p99_ms<100000", "value": 0.0, "pass": true},
            {"threshold": "failed_rate<0.01", "value": 1.0, "pass": false},
            {"threshold": "lockouts.d0<=1", "value": 0.0, "pass": true},
        ])
    );
    // The table lists the verdicts first.
    let (code, table, _) = loadtest_cli(&[
        "--config",
        config,
        "--halt-probes",
        "0",
        "--threshold",
        "failed_rate<0.01",
    ]);
    assert_eq!(code, 15);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[1], "  threshold     pass event_latency.p99_ms<100000 (value 0)",
        "{table}"
    );
    assert_eq!(
        lines[2], "  threshold     FAIL failed_rate<0.01 (value 1)",
        "{table}"
    );
    // All hold: exit 0.
    let (code, _, stderr) = loadtest_cli(&[
        "--config",
        config,
        "--halt-probes",
        "0",
        "--threshold",
        "failed_rate<=1",
    ]);
    assert_eq!(code, 0, "{stderr}");
    // Bad thresholds are refused before the run: a flag's as a usage error, the file's with its
    // line and column.
    let (code, stdout, stderr) = loadtest_cli(&["--threshold", "latency<5"]);
    assert_eq!((code, stdout.as_str()), (2, ""), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: invalid value 'latency<5' for '--threshold <METRIC<VALUE>': `latency<5`: unknown metric `latency` (a number of the JSON report"
        ),
        "{stderr}"
    );
    let bad = team_file(
        "bad-threshold",
        &text.replace("event_latency.p99_ms < 100000", "p99 < fast"),
    );
    let (code, stdout, stderr) = loadtest_cli(&["--config", bad.to_str().unwrap()]);
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert!(
        stderr.contains("line 14, column 15: invalid value for `workload.thresholds[0]`: `p99<fast`: `fast` is not a number"),
        "{stderr}"
    );
}

// ---- compare: a test over the runs, the same work on both sides, real reports only -------------

/// A synthetic report of `values.len()` repeated runs whose `duration_s` were `values`.
fn synthetic_report(values: &[f64], refused: u64, mode: &str) -> serde_json::Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    json!({
        "scenario": "team", "seed": 1, "agents": 3, "duration_s": median, "steps": 900,
        "steps_per_sec": 900.0 / median, "tasks_sent": 300, "tasks_refused": refused,
        "lost_events": 0, "lockouts": 0,
        "event_latency": {"answered": 300 - refused, "p50_ms": 10.0},
        "outcomes": {"answered": 300 - refused},
        "delegations": {"accepted": 300},
        "workload": {"config": "team.toml", "mode": mode, "level": 20.0, "duration_s": 15.0,
                     "count": null, "agents": ["desk"], "templates": 1},
        "repeat": {"runs": values.len(), "figures": {
            "duration_s": {"median": median, "min": sorted[0], "max": sorted[sorted.len() - 1],
                           "values": values},
            "event_latency.p50_ms": {"median": 10.0, "min": 9.0, "max": 11.0,
                                     "values": vec![10.0; values.len()]},
        }},
    })
}

/// `warden loadtest compare A B ARGS` on two reports: exit code, stdout, stderr.
fn compare_cli(
    name: &str,
    a: &serde_json::Value,
    b: &serde_json::Value,
    args: &[&str],
) -> (i32, String, String) {
    let dir = warden_testkit::scratch_dir("loadtest", name);
    let (pa, pb) = (dir.join("a.json"), dir.join("b.json"));
    std::fs::write(&pa, a.to_string()).unwrap();
    std::fs::write(&pb, b.to_string()).unwrap();
    let mut all = vec!["compare", pa.to_str().unwrap(), pb.to_str().unwrap()];
    all.extend_from_slice(args);
    loadtest_cli(&all)
}

fn duration_row(stdout: &str) -> serde_json::Value {
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    json["figures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["figure"] == "duration_s")
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

#[test]
fn compare_finds_a_slowdown_whose_ranges_overlap() {
    // B is 1.75x slower; one noisy run of A overlaps B's range (the old rule said "within noise").
    let a = synthetic_report(&[1.00, 1.02, 0.98, 1.05, 1.76], 0, "concurrency");
    let b = synthetic_report(&[1.75, 1.78, 1.72, 1.80, 1.79], 0, "concurrency");
    let (code, stdout, stderr) =
        compare_cli("cmp-slow", &a, &b, &["--json", "--fail-on-regression"]);
    assert_eq!(code, 13, "{stdout} {stderr}");
    let row = duration_row(&stdout);
    assert_eq!(row["regression"], true, "{row}");
    // U = 23 of 25 pairs: P(U >= 23) = 4/252, two-sided 0.032; Cliff's delta (23 - 2) / 25.
    let p = row["p_value"].as_f64().unwrap();
    assert!((p - 8.0 / 252.0).abs() < 1e-9, "{row}");
    assert!(
        (row["effect"].as_f64().unwrap() - 0.84).abs() < 1e-9,
        "{row}"
    );
    assert!(
        row["verdict"]
            .as_str()
            .unwrap()
            .starts_with("slower (p=0.032, effect +0.84)"),
        "{row}"
    );
    // The same runs shuffled between A and B: within noise, no regression.
    let a = synthetic_report(&[1.00, 1.78, 0.98, 1.80, 1.76], 0, "concurrency");
    let b = synthetic_report(&[1.75, 1.02, 1.72, 1.05, 1.79], 0, "concurrency");
    let (code, stdout, _) = compare_cli("cmp-same", &a, &b, &["--json", "--fail-on-regression"]);
    assert_eq!(code, 0, "{stdout}");
    let row = duration_row(&stdout);
    assert!(
        row["verdict"]
            .as_str()
            .unwrap()
            .starts_with("within noise (p="),
        "{row}"
    );
    // Three runs a side cannot tell even a complete separation.
    let a = synthetic_report(&[1.0, 1.1, 1.2], 0, "concurrency");
    let b = synthetic_report(&[2.0, 2.1, 2.2], 0, "concurrency");
    let (code, stdout, _) = compare_cli("cmp-few", &a, &b, &["--json", "--fail-on-regression"]);
    assert_eq!(code, 0, "{stdout}");
    let row = duration_row(&stdout);
    assert!(
        row["verdict"]
            .as_str()
            .unwrap()
            .starts_with("too few runs to tell (3+3 runs: p ≥ 0.100"),
        "{row}"
    );
}

#[test]
fn compare_skips_what_an_open_loop_schedule_fixes() {
    let a = synthetic_report(&[15.00, 15.01, 15.02, 15.00, 15.01], 0, "rate");
    let b = synthetic_report(&[15.09, 15.10, 15.11, 15.09, 15.10], 0, "rate");
    let (code, stdout, stderr) =
        compare_cli("cmp-open", &a, &b, &["--json", "--fail-on-regression"]);
    assert_eq!(code, 0, "{stdout} {stderr}");
    assert_eq!(duration_row(&stdout), serde_json::Value::Null, "{stdout}");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let figures: Vec<&str> = json["figures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["figure"].as_str().unwrap())
        .collect();
    assert_eq!(figures, ["event_latency.p50_ms"], "{stdout}");
    let (_, table, _) = compare_cli("cmp-open-table", &a, &b, &[]);
    assert!(
        table.contains(
            "note: open loop: duration_s, steps_per_sec are fixed by the schedule, not compared"
        ),
        "{table}"
    );
}

#[test]
fn compare_refuses_different_work_and_what_is_not_a_report() {
    // 142 events refused in A, none in B: B is "faster" only because it did less.
    let a = synthetic_report(&[4.0, 4.1, 4.2, 4.3], 142, "concurrency");
    let b = synthetic_report(&[1.0, 1.1, 1.2, 1.3], 0, "concurrency");
    let (code, stdout, stderr) = compare_cli("cmp-work", &a, &b, &[]);
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert_eq!(
        stderr,
        "error: A and B are not the same run, so their timings do not compare: \
         tasks_refused: 142 vs 0; outcomes.answered: 158 vs 300 (--allow-different compares them anyway)\n"
    );
    let (code, stdout, _) = compare_cli("cmp-work-allowed", &a, &b, &["--allow-different"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("note: A and B are not the same run, timings may not be comparable: tasks_refused: 142 vs 0"),
        "{stdout}"
    );
    let mut other_seed = b.clone();
    other_seed["seed"] = json!(2);
    let (code, _, stderr) = compare_cli("cmp-seed", &b, &other_seed, &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("seed: 1 vs 2"), "{stderr}");
    // `{}` is not a report.
    let (code, stdout, stderr) = compare_cli("cmp-empty", &json!({}), &json!({}), &[]);
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert!(
        stderr.contains("a.json: not a `warden loadtest --json` report: no scenario, seed, agents, duration_s, steps, tasks_sent, event_latency, lost_events\n"),
        "{stderr}"
    );
}

// ---- small ones: unknown placeholders, the file named, what --no-safety turns off ---------------

#[test]
fn unknown_template_placeholders_are_refused_with_their_place() {
    let text = format!(
        "{DESK_AND_COOK}\n[workload]\ncount = 2\ntemplates = [\"order {{n}} for {{nope}}\", \"{{\\\"json\\\": 1}}\"]\n"
    );
    let path = team_file("placeholder", &text);
    let (code, stdout, stderr) = loadtest_cli(&["--config", path.to_str().unwrap()]);
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert_eq!(
        stderr.lines().next().unwrap(),
        format!(
            "error: {}: invalid config: line 23, column 14: invalid value for `workload.templates[0]`: \"order {{n}} for {{nope}}\" (allowed: the placeholders {{n}} and {{agent}}; `{{nope}}` is not one)",
            path.display()
        )
    );
    // Braces around what is not a name are text.
    let ok = team_file(
        "placeholder-ok",
        &text.replace("order {n} for {nope}", "order {n} for {agent}"),
    );
    let json = team_json(&ok, &["--halt-probes", "0"]);
    assert_eq!(json["outcomes"]["answered"], 2, "{json}");
}

#[test]
fn an_unset_api_key_variable_is_named_with_the_file() {
    // A server that accepts connections (the preflight's connect), never called.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let text = format!(
        "[providers.local]\nkind = \"openai_compatible\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nmodel = \"m\"\napi_key_env = \"WARDEN_LOADTEST_UNSET_KEY\"\n\n[[agents]]\nkey = \"desk\"\nprovider = \"local\"\n"
    );
    let path = team_file("unset-key", &text);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args([
            "loadtest",
            "--config",
            path.to_str().unwrap(),
            "--halt-probes",
            "0",
        ])
        .env_remove("WARDEN_LOADTEST_UNSET_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: {}: provider `local`: environment variable WARDEN_LOADTEST_UNSET_KEY holds no api key\n",
            path.display()
        )
    );
}

#[test]
fn no_safety_says_what_it_turns_off() {
    let (code, help, _) = loadtest_cli(&["--help"]);
    assert_eq!(code, 0);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("--no-safety Turn the SafetyMonitor's checks off, for overhead comparisons: budgets, loop caps, repetition and error-cascade breakers. The consecutive-error breaker and halts stay on"),
        "{help}"
    );
}

#[test]
fn a_workload_that_unlocks_measures_the_time_to_recover() {
    // The cook fails three calls in a row, then answers: locked out at its first burst, unlocked
    // by the harness 0.2 s later, it answers again.
    // (Then 100 answers: enough for the run, with no second burst.)
    let text = r#"
[safety.breakers]
max_consecutive_errors = 3

[providers.desk]
kind = "scripted"
cycle = true
replies = [{ tool = "delegate", args = { agent = "cook", task = "cook it" } }, "served"]

[providers.cook]
kind = "scripted"
cycle = true
replies = [{ fail = "stove down" }, { fail = "stove down" }, { fail = "stove down" }, COOKED]

[[agents]]
key = "desk"
provider = "desk"

[[agents]]
key = "cook"
role = "sub_agent"
parent = "desk"
provider = "cook"

[workload]
rate = 20
duration_seconds = 2
unlock_after_seconds = 0.2
"#
    .replace("COOKED", &vec!["\"cooked\""; 100].join(", "));
    let path = team_file("unlock", &text);
    let json = team_json(&path, &["--halt-probes", "0"]);
    let recoveries = json["recoveries"].as_array().unwrap();
    let cook = recoveries
        .iter()
        .find(|r| r["agent"] == "cook")
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(cook["depth"], 1, "{json}");
    let at = |k: &str| cook[k].as_f64().unwrap_or_else(|| panic!("{k}: {json}"));
    // Unlocked no sooner than 0.2 s after the lockout, answering again after that.
    assert!(at("unlocked_s") >= at("locked_s") + 0.2, "{json}");
    assert!(at("recovered_s") >= at("unlocked_s"), "{json}");
    assert_eq!(json["lost_events"], 0, "{json}");
    // Without the option nothing is unlocked and no recovery is listed.
    let still = team_file(
        "no-unlock",
        &text.replace("unlock_after_seconds = 0.2\n", ""),
    );
    let json = team_json(&still, &["--halt-probes", "0"]);
    assert_eq!(json["recoveries"], json!([]), "{json}");
    assert!(json["lockouts"].as_u64().unwrap() >= 1, "{json}");
}

#[test]
fn the_soak_verdict_is_judged_on_the_allocators_committed_memory() {
    // Half an hour, a sample a second: RSS climbs 20 MiB/h (freed pages kept by the allocator)
    // while the allocator's committed memory stays at 10 MiB.
    let mib = 1024.0 * 1024.0;
    let series = |committed: bool| -> Vec<warden::loadtest::Sample> {
        (1..=1800)
            .map(|t| warden::loadtest::Sample {
                t_s: f64::from(t),
                turns: 10,
                rss_bytes: (40.0 * mib + 20.0 * mib * f64::from(t) / 3600.0) as u64,
                committed_bytes: if committed { (10.0 * mib) as u64 } else { 0 },
                ..Default::default()
            })
            .collect()
    };
    let soak = warden::loadtest::soak::analyse(&series(true)).unwrap();
    assert!(
        (soak.rss_slope_bytes_per_hour / mib - 20.0).abs() < 0.01,
        "{soak:?}"
    );
    assert_eq!(soak.committed_slope_bytes_per_hour, Some(0.0), "{soak:?}");
    assert!(!soak.growth, "{soak:?}");
    assert!(
        warden::loadtest::soak::describe(&soak).contains("allocator committed +0.00 MiB/h"),
        "{soak:?}"
    );
    // Without the allocator's figure the RSS line decides, as before.
    let soak = warden::loadtest::soak::analyse(&series(false)).unwrap();
    assert_eq!(soak.committed_slope_bytes_per_hour, None);
    assert!(soak.growth, "{soak:?}");
    // The binary samples mimalloc's committed memory beside RSS.
    let path = team_file(
        "committed",
        &format!("{DESK_AND_COOK}\n[workload]\nrate = 500\ncount = 3\n"),
    );
    let json = team_json(&path, &["--halt-probes", "0"]);
    let sample = &json["series"][0];
    assert!(u(&sample["committed_bytes"]) > 0, "{json}");
}

/// `--threads 2`: the fleet on two arbiter threads of its own keeps every invariant, and the
/// counts of a run without latency or faults are those of the one-thread run.
#[test]
fn a_fleet_over_two_arbiter_threads_keeps_the_invariants_and_the_counts() {
    for scenario in [Scenario::Steady, Scenario::Cascade, Scenario::HaltStorm] {
        let one = run_loadtest(small(scenario));
        let two = run_loadtest(LoadtestOptions {
            threads: 2,
            ..small(scenario)
        });
        check_invariants(&two);
        assert_eq!((one.threads, two.threads), (0, 2));
        assert_eq!(two.halt_all.agents, two.agents, "{two:#?}");
        if scenario == Scenario::Steady {
            assert_eq!(one.delegations, two.delegations);
            assert_eq!(one.steps, two.steps);
        }
    }
}
