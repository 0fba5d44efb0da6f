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
        ])
    );
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
        sorted(&["answered", "p50_ms", "p99_ms", "max_ms"])
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
    for (args, expected) in cases {
        let (code, stdout, stderr) = loadtest_cli(args);
        // 2: a usage error, as for every command (an invariant violation is 11).
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(stdout, "");
        assert_eq!(stderr.lines().next(), Some(expected), "{args:?}: {stderr}");
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
