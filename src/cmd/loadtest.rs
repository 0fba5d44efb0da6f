//! `warden loadtest`: its flags, the run (or `--repeat` runs in child processes), its signal
//! handling, and `warden loadtest compare`.

use super::{is_broken_pipe, read_team};
use clap::Subcommand;
use std::{io::IsTerminal, path::PathBuf, process::ExitCode};

#[derive(clap::Args)]
pub(crate) struct LoadtestArgs {
    /// Preset: idle | steady | cascade (failures at the leaves) | halt-storm.
    #[arg(long, value_enum, default_value_t = warden::loadtest::Scenario::Steady)]
    scenario: warden::loadtest::Scenario,
    /// Agents in the fleet, 1 or more (roots × tree; the last tree is cut short).
    #[arg(long, default_value_t = 100, allow_negative_numbers = true, value_parser = at_least_one)]
    agents: usize,
    /// Children per inner agent.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    fanout: usize,
    /// Levels below each root.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    depth: usize,
    /// Tasks sent to every root (each cascades down its tree).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true)]
    tasks_per_agent: usize,
    /// Probability (0 to 1) that a model or tool call fails.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = probability)]
    fail_rate: f64,
    /// Probability (0 to 1) that a tool call panics.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = probability)]
    panic_rate: f64,
    /// Mean simulated model latency in ms, 0 or more (jittered ×0.5–1.5).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = non_negative)]
    llm_latency_ms: f64,
    /// RNG seed (same seed, same counts when the latency is 0).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
    /// Halt probe: ordinary messages queued on a paused agent before it is halted.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    backlog: usize,
    /// Halt probes to run (0 = none).
    #[arg(long, default_value_t = 11, allow_negative_numbers = true)]
    halt_probes: usize,
    /// Spread the fleet's agents over this many arbiter threads (the driver stays on its own);
    /// 0 = every agent on one thread with the driver, so each figure is one core's. Not with
    /// --config or --cluster.
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        conflicts_with = "cluster"
    )]
    threads: usize,
    /// Turn the SafetyMonitor's checks off, for overhead comparisons: budgets, loop caps,
    /// repetition and error-cascade breakers. The consecutive-error breaker and halts stay on.
    #[arg(long)]
    no_safety: bool,
    /// The fleet's `supervisor.passivate_after_seconds`: agents idle this long stop their actor
    /// (and are spawned without one); 0 = an actor per agent from its spawn on, for comparisons.
    #[arg(long, default_value_t = 120.0, allow_negative_numbers = true, value_parser = non_negative)]
    passivate_after_s: f64,
    /// Stop waiting for the fleet after this many seconds (> 0); a run cut short is reported as
    /// timed out (exit 12).
    #[arg(long, default_value_t = 300.0, allow_negative_numbers = true, value_parser = positive_seconds)]
    timeout_s: f64,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Load-test this team file instead of a synthetic fleet: its agents, providers and safety
    /// settings, driven by its [workload] section (docs/loadtest.md). --scenario and the fleet
    /// and fault flags cannot be given with it.
    #[arg(long, conflicts_with_all = [
        "scenario", "agents", "fanout", "depth", "tasks_per_agent", "fail_rate", "panic_rate",
        "llm_latency_ms", "threads",
    ])]
    config: Option<PathBuf>,
    /// With --config: open loop at this many events per second (replaces the file's rate or
    /// concurrency).
    #[arg(long, requires = "config", conflicts_with = "concurrency", allow_negative_numbers = true, value_parser = positive_rate)]
    rate: Option<f64>,
    /// With --config: closed loop with this many events in flight.
    #[arg(long, requires = "config", allow_negative_numbers = true, value_parser = at_least_one_u64)]
    concurrency: Option<u64>,
    /// With --config: send events for this many seconds (replaces the file's duration_seconds
    /// and count; with --count, whichever comes first).
    #[arg(long, requires = "config", allow_negative_numbers = true, value_parser = positive_seconds)]
    duration: Option<f64>,
    /// With --config: send this many events (replaces the file's duration_seconds and count).
    #[arg(long, requires = "config", allow_negative_numbers = true, value_parser = at_least_one_u64)]
    count: Option<u64>,
    /// Run N times with the same seed and add the median, range and values of each headline
    /// figure ("repeat" in the JSON; `loadtest compare` tests B against A over them).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = at_least_one)]
    repeat: usize,
    /// Also write the run as one self-contained HTML file (charts over time, latency histogram,
    /// lockouts by depth, the invariants, the configuration; no network references).
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
    /// Run the fleet on cluster nodes in this process, joined to this NATS server (JetStream
    /// on): depth d of every tree runs on node d mod N, so every delegation crosses nodes. The
    /// report adds "nodes" and "cluster" (docs/cluster.md). Not with --config.
    #[arg(long, value_name = "nats://HOST:PORT", conflicts_with = "config", value_parser = nats_url)]
    cluster: Option<String>,
    /// With --cluster: nodes to run, 2 to 26 [default: 3].
    #[arg(long, requires = "cluster", allow_negative_numbers = true, value_parser = node_count)]
    nodes: Option<usize>,
    /// A condition on the report that fails the run (exit 15) when it does not hold, k6-like:
    /// METRIC OP VALUE, e.g. 'event_latency.p99_ms<500', 'failed_rate<0.01', 'lockouts.d2<=1'
    /// (repeatable; added to the team file's [workload] thresholds; docs/loadtest.md).
    #[arg(long, value_name = "METRIC<VALUE", value_parser = threshold)]
    threshold: Vec<String>,
    #[command(subcommand)]
    command: Option<LoadtestCommand>,
}

/// `--threshold`: METRIC OP VALUE with a metric the report has (kept as text: parsed again when
/// the run is judged).
fn threshold(text: &str) -> Result<String, String> {
    warden::loadtest::thresholds::Threshold::parse(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

/// `--cluster`: a NATS URL, checked as `warden serve --cluster`'s.
fn nats_url(text: &str) -> Result<String, String> {
    warden::cluster::ClusterSection::default()
        .with_flags(Some(text.to_owned()), None)
        .map(|_| text.to_owned())
        .map_err(|e| match e {
            warden::cluster::ClusterError::Invalid { allowed, .. } => format!("allowed: {allowed}"),
            other => other.to_string(),
        })
}

/// `--nodes`: 2 to 26.
fn node_count(text: &str) -> Result<usize, String> {
    use warden::loadtest::cluster::{MAX_NODES, MIN_NODES};
    match text.trim().parse::<usize>() {
        Ok(n) if (MIN_NODES..=MAX_NODES).contains(&n) => Ok(n),
        _ => Err(format!(
            "must be a whole number from {MIN_NODES} to {MAX_NODES}"
        )),
    }
}

impl LoadtestArgs {
    /// `--cluster` and `--nodes`, when the run is on cluster nodes.
    fn cluster_options(&self) -> Option<warden::loadtest::cluster::ClusterOptions> {
        self.cluster
            .as_ref()
            .map(|url| warden::loadtest::cluster::ClusterOptions {
                url: url.clone(),
                nodes: self
                    .nodes
                    .unwrap_or(warden::loadtest::cluster::DEFAULT_NODES),
            })
    }

    /// Runs the same load test (`--repeat 1`, `--json`, no `--report`) in a child process and
    /// reads its report. The child runs in a process group of its own (a Ctrl-C in the terminal
    /// reaches only this process) and its pid is in `signals.child` while it runs, so that a
    /// SIGINT or SIGTERM of this process is forwarded to it, once.
    fn run_child(&self, signals: &LoadtestSignals) -> Result<warden::loadtest::LoadReport, String> {
        let mut cmd =
            std::process::Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
        cmd.arg("loadtest").arg("--json");
        // The flags that were given or defaulted; a team file's run takes no fleet flags.
        let synthetic = self.config.is_none();
        let fleet = |value: String| synthetic.then_some(value);
        let flags: [(&str, Option<String>); 21] = [
            ("--scenario", fleet(self.scenario.as_str().to_owned())),
            ("--agents", fleet(self.agents.to_string())),
            ("--fanout", fleet(self.fanout.to_string())),
            ("--depth", fleet(self.depth.to_string())),
            ("--tasks-per-agent", fleet(self.tasks_per_agent.to_string())),
            ("--fail-rate", fleet(self.fail_rate.to_string())),
            ("--panic-rate", fleet(self.panic_rate.to_string())),
            ("--llm-latency-ms", fleet(self.llm_latency_ms.to_string())),
            ("--seed", Some(self.seed.to_string())),
            ("--backlog", Some(self.backlog.to_string())),
            ("--halt-probes", Some(self.halt_probes.to_string())),
            ("--threads", fleet(self.threads.to_string())),
            ("--timeout-s", Some(self.timeout_s.to_string())),
            (
                "--passivate-after-s",
                fleet(self.passivate_after_s.to_string()),
            ),
            (
                "--config",
                self.config.as_ref().map(|p| p.display().to_string()),
            ),
            ("--rate", self.rate.map(|v| v.to_string())),
            ("--concurrency", self.concurrency.map(|v| v.to_string())),
            ("--duration", self.duration.map(|v| v.to_string())),
            ("--count", self.count.map(|v| v.to_string())),
            ("--cluster", self.cluster.clone()),
            ("--nodes", self.nodes.map(|v| v.to_string())),
        ];
        for (flag, value) in flags {
            if let Some(value) = value {
                cmd.arg(flag).arg(value);
            }
        }
        if self.no_safety {
            cmd.arg("--no-safety");
        }
        use std::os::unix::process::CommandExt;
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| e.to_string())?;
        signals.running(child.id());
        let out = child.wait_with_output();
        signals.running(0);
        let out = out.map_err(|e| e.to_string())?;
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "{e} (exit {:?}): {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }

    /// The run's configuration as the HTML report shows it.
    fn configuration(&self) -> serde_json::Value {
        let common = serde_json::json!({
            "seed": self.seed,
            "backlog": self.backlog,
            "halt_probes": self.halt_probes,
            "threads": self.threads,
            "timeout_s": self.timeout_s,
            "repeat": self.repeat,
        });
        let specific = match &self.config {
            Some(path) => serde_json::json!({
                "config": path.display().to_string(),
                "rate": self.rate,
                "concurrency": self.concurrency,
                "duration": self.duration,
                "count": self.count,
            }),
            None => serde_json::json!({
                "scenario": self.scenario.as_str(),
                "agents": self.agents,
                "fanout": self.fanout,
                "depth": self.depth,
                "tasks_per_agent": self.tasks_per_agent,
                "fail_rate": self.fail_rate,
                "panic_rate": self.panic_rate,
                "llm_latency_ms": self.llm_latency_ms,
                "safety": !self.no_safety,
                "passivate_after_s": self.passivate_after_s,
                "cluster": self.cluster,
                "nodes": self.cluster_options().map(|c| c.nodes),
            }),
        };
        serde_json::json!({ "command line": specific, "common": common })
    }
}

#[derive(Subcommand)]
enum LoadtestCommand {
    /// Compare two JSON reports (`warden loadtest --json > A.json`) of the same run: B/A per
    /// headline figure, and whether B is faster or slower than A by a Mann-Whitney U test over
    /// the runs (reports made with --repeat), with its p-value and effect size.
    Compare {
        /// The baseline report.
        a: PathBuf,
        /// The report compared to it.
        b: PathBuf,
        /// Print the comparison as one JSON object.
        #[arg(long)]
        json: bool,
        /// Exit 13 when a figure of B is worse than A's beyond the noise band.
        #[arg(long)]
        fail_on_regression: bool,
        /// Compare even when A and B are not the same run (another scenario, seed, fleet or
        /// workload, or different work done); refused otherwise.
        #[arg(long)]
        allow_different: bool,
    },
}

/// `--concurrency`, `--count`: a whole number of 1 or more.
fn at_least_one_u64(text: &str) -> Result<u64, String> {
    at_least_one(text).map(|n| n as u64)
}

/// `--rate`: events per second.
fn positive_rate(text: &str) -> Result<f64, String> {
    number(
        text,
        "a number of events per second greater than 0 (at most 1000000)",
        |x| x > 0.0 && x <= warden::loadtest::workload::MAX_RATE,
    )
}

/// `--agents`: a whole number of 1 or more.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("must be a whole number of 1 or more".into()),
    }
}

/// A finite number; `what` says what is allowed.
fn number(text: &str, what: &str, ok: impl Fn(f64) -> bool) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && ok(x) => Ok(x),
        _ => Err(format!("must be {what}")),
    }
}

fn probability(text: &str) -> Result<f64, String> {
    number(text, "a probability from 0 to 1", |p| {
        (0.0..=1.0).contains(&p)
    })
}

fn non_negative(text: &str) -> Result<f64, String> {
    number(text, "a number of 0 or more", |x| x >= 0.0)
}

fn positive_seconds(text: &str) -> Result<f64, String> {
    // Bounded so that it is a valid `Duration` (a year is plenty).
    number(
        text,
        "a number of seconds greater than 0 (at most 31536000)",
        |x| x > 0.0 && x <= 31_536_000.0,
    )
}

/// `warden loadtest`: prepare (checks before an hour's run), run (repeats in child processes, the
/// last here), judge the thresholds, print, and exit with the code of the worst finding.
pub(crate) fn loadtest(args: LoadtestArgs) -> ExitCode {
    if let Some(LoadtestCommand::Compare {
        a,
        b,
        json,
        fail_on_regression,
        allow_different,
    }) = &args.command
    {
        return loadtest_compare(a, b, *json, *fail_on_regression, *allow_different);
    }
    let outcome = prepare(&args).and_then(|prepared| {
        let mut reports = run_all(&args, &prepared)?;
        judge_thresholds(&args, prepared.team.as_ref(), &mut reports)?;
        print_report(&args, &reports, prepared.html_out)?;
        Ok(reports)
    });
    match outcome {
        Ok(reports) => exit_code(&args, &reports),
        Err(Failed(Some(message))) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
        Err(Failed(None)) => ExitCode::FAILURE,
    }
}

/// A run that cannot go on: its message (`None`: already printed).
struct Failed(Option<String>);

impl From<String> for Failed {
    fn from(message: String) -> Self {
        Failed(Some(message))
    }
}

/// What a run needs, checked and set up before it starts.
struct Prepared {
    options: warden::loadtest::LoadtestOptions,
    signals: LoadtestSignals,
    /// `--report`'s file, created before the run rather than found unwritable after it.
    html_out: Option<std::fs::File>,
    /// `--config`'s team file and its workload.
    team: Option<(warden::team::TeamFile, warden::loadtest::workload::Workload)>,
}

/// The checks and set-up before a run: the panic hook, the report's file, stdout, the memory
/// probe, the signals, the options and (with `--config`) the team file and its model servers.
fn prepare(args: &LoadtestArgs) -> Result<Prepared, Failed> {
    // The flags' ranges are checked by their value parsers (a usage error, exit 2).
    // Injected panics are expected: keep them off stderr, report any other.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m.contains(warden::loadtest::INJECTED_PANIC));
        if !injected {
            default_hook(info);
        }
    }));
    // Where the report goes, checked before an hour's run rather than after it.
    let html_out = match &args.report {
        None => None,
        Some(path) => Some(
            std::fs::File::create(path)
                .map_err(|err| format!("cannot write {}: {err}", path.display()))?,
        ),
    };
    if !stdout_is_open() {
        return Err("stdout is closed: the report would be lost"
            .to_owned()
            .into());
    }
    // Every sample reads mimalloc's committed memory beside RSS (the soak is judged on it).
    warden::loadtest::set_committed_probe(mimalloc_committed);
    // SIGINT / SIGTERM: stop, drain, report (exit 14); a second one exits at once.
    let signals =
        LoadtestSignals::install().map_err(|err| format!("cannot catch SIGINT/SIGTERM: {err}"))?;
    let options = warden::loadtest::LoadtestOptions {
        interrupt: signals.interrupt.clone(),
        scenario: args.scenario,
        agents: args.agents,
        fanout: args.fanout,
        depth: args.depth,
        tasks_per_agent: args.tasks_per_agent,
        fail_rate: args.fail_rate,
        panic_rate: args.panic_rate,
        llm_latency_ms: args.llm_latency_ms,
        seed: args.seed,
        backlog: args.backlog,
        halt_probes: args.halt_probes,
        threads: args.threads,
        safety: !args.no_safety,
        passivate_after_s: args.passivate_after_s,
        timeout: std::time::Duration::from_secs_f64(args.timeout_s),
        progress: std::io::stderr().is_terminal(),
    };
    // A team file: read, parse and check it (the workload too) and reach its model servers before
    // anything is spawned (its errors are printed there).
    let team = match &args.config {
        None => None,
        Some(path) => Some(load_workload(path, args).map_err(|_| Failed(None))?),
    };
    Ok(Prepared {
        options,
        signals,
        html_out,
        team,
    })
}

/// Runs the load test `--repeat` times: each repeat in a fresh process, as a user's run is (peak
/// RSS and memory per agent are process-wide; a second run in the same process would reuse the
/// first one's memory): the first N-1 in children, the last in this process, which has run
/// nothing else. Interrupted during a repeat: the reports of what was done, no further run.
fn run_all(
    args: &LoadtestArgs,
    prepared: &Prepared,
) -> Result<Vec<warden::loadtest::LoadReport>, Failed> {
    let mut reports = Vec::with_capacity(args.repeat);
    let interrupt = &prepared.signals.interrupt;
    for _ in 1..args.repeat {
        let report = args
            .run_child(&prepared.signals)
            .map_err(|err| format!("a repeat of the run failed: {err}"))?;
        reports.push(report);
        if interrupt.raised().is_some() {
            break;
        }
    }
    if interrupt.raised().is_none() || reports.is_empty() {
        reports.push(run_once(args, prepared)?);
    }
    Ok(reports)
}

/// One run in this process: the synthetic fleet, a cluster of them, or the team file's workload.
fn run_once(
    args: &LoadtestArgs,
    prepared: &Prepared,
) -> Result<warden::loadtest::LoadReport, Failed> {
    let options = &prepared.options;
    match &prepared.team {
        None => match args.cluster_options() {
            None => Ok(warden::loadtest::run_loadtest(options.clone())),
            Some(cluster) => warden::loadtest::cluster::run_cluster(options.clone(), &cluster)
                .map_err(|err| err.to_string().into()),
        },
        Some((file, workload)) => {
            let config = args
                .config
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            warden::loadtest::workload::run_team(file, workload, &config, options)
                // Named by its file, as every other error of a team file.
                .map_err(|err| format!("{config}: {err}").into())
        }
    }
}

/// The thresholds, the team file's then the flags', judged on the report printed (the last).
fn judge_thresholds(
    args: &LoadtestArgs,
    team: Option<&(warden::team::TeamFile, warden::loadtest::workload::Workload)>,
    reports: &mut [warden::loadtest::LoadReport],
) -> Result<(), Failed> {
    let thresholds: Vec<warden::loadtest::thresholds::Threshold> = team
        .iter()
        .flat_map(|(_, workload)| workload.thresholds.iter().cloned())
        .chain(
            args.threshold
                .iter()
                .filter_map(|t| warden::loadtest::thresholds::Threshold::parse(t).ok()),
        )
        .collect();
    if let Some(last) = reports.last_mut() {
        if !thresholds.is_empty() {
            let value = serde_json::to_value(&*last).map_err(|err| err.to_string())?;
            last.thresholds = warden::loadtest::thresholds::evaluate(&thresholds, &value);
        }
    }
    Ok(())
}

/// Prints the last report (JSON or text, with the repeats' summary) and writes `--report`'s HTML.
fn print_report(
    args: &LoadtestArgs,
    reports: &[warden::loadtest::LoadReport],
    html_out: Option<std::fs::File>,
) -> Result<(), Failed> {
    use std::io::Write;
    let Some(report) = reports.last() else {
        return Ok(());
    };
    let mut value = serde_json::to_value(report).map_err(|err| err.to_string())?;
    if args.repeat > 1 {
        let all: Vec<serde_json::Value> = reports
            .iter()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        value["repeat"] = warden::loadtest::compare::summarize(&all);
    }
    let printed = if args.json {
        writeln!(std::io::stdout(), "{value}")
    } else {
        warden::loadtest::write_report(&mut std::io::stdout(), report).and_then(|()| {
            match value.get("repeat") {
                Some(repeat) => warden::loadtest::write_repeat(&mut std::io::stdout(), repeat),
                None => Ok(()),
            }
        })
    };
    match printed {
        Err(err) if !is_broken_pipe(&err) => return Err(err.to_string().into()),
        _ => {}
    }
    if let (Some(path), Some(file)) = (&args.report, html_out) {
        let mut out = std::io::BufWriter::new(file);
        warden::loadtest::html::write_html(&mut out, report, &args.configuration())
            .and_then(|()| out.flush())
            .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    }
    Ok(())
}

/// The exit code of a finished run, worst finding first: an invariant violated (11), an
/// interrupt (14), a failed threshold (15), a timeout (12), else success.
fn exit_code(args: &LoadtestArgs, reports: &[warden::loadtest::LoadReport]) -> ExitCode {
    let Some(report) = reports.last() else {
        return ExitCode::SUCCESS;
    };
    let timed_out = reports.iter().find(|r| r.timed_out);
    if let Some(r) = timed_out {
        eprintln!(
            "loadtest: timed out after {} s (--timeout-s): {} tasks unfinished",
            args.timeout_s, r.unfinished_tasks
        );
    }
    let cluster_wrong = |r: &warden::loadtest::LoadReport| {
        r.cluster
            .as_ref()
            .map(warden::loadtest::cluster::ClusterFigures::violations)
            .unwrap_or_default()
    };
    let violated = reports.iter().find(|r| {
        r.lost_events > 0
            || r.leaked_slots > 0
            || r.halt.processed_after_halt > 0
            || !cluster_wrong(r).is_empty()
    });
    if let Some(r) = violated {
        let cluster: String = cluster_wrong(r)
            .iter()
            .map(|wrong| format!(", {wrong}"))
            .collect();
        eprintln!(
            "loadtest: invariant violated (lost_events {}, leaked_slots {}, processed_after_halt {}{cluster})",
            r.lost_events, r.leaked_slots, r.halt.processed_after_halt
        );
        return ExitCode::from(warden::loadtest::EXIT_INVARIANT_VIOLATED);
    }
    if let Some(signal) = reports.iter().find_map(|r| r.interrupted.as_deref()) {
        eprintln!(
            "loadtest: interrupted by {signal}: the report covers what was done ({} of {} events settled)",
            report.outcomes.total() - report.outcomes.timed_out,
            report.tasks_sent
        );
        return ExitCode::from(warden::loadtest::EXIT_INTERRUPTED);
    }
    let failed: Vec<&str> = report
        .thresholds
        .iter()
        .filter(|v| !v.pass)
        .map(|v| v.threshold.as_str())
        .collect();
    if !failed.is_empty() {
        eprintln!(
            "loadtest: {} of {} thresholds failed: {}",
            failed.len(),
            report.thresholds.len(),
            failed.join(", ")
        );
        return ExitCode::from(warden::loadtest::thresholds::EXIT_THRESHOLD_FAILED);
    }
    if timed_out.is_some() {
        return ExitCode::from(warden::loadtest::EXIT_TIMED_OUT);
    }
    ExitCode::SUCCESS
}

/// mimalloc's committed memory now (`current_commit` of `mi_process_info`), in bytes.
fn mimalloc_committed() -> u64 {
    let mut info = [0usize; 8];
    let [elapsed, user, system, rss, peak_rss, commit, peak_commit, faults] = &mut info;
    // SAFETY: mi_process_info writes one usize through each pointer, all valid and distinct.
    unsafe {
        libmimalloc_sys::mi_process_info(
            elapsed,
            user,
            system,
            rss,
            peak_rss,
            commit,
            peak_commit,
            faults,
        );
    }
    info[5] as u64
}

/// Whether file descriptor 1 is open (a closed stdout would lose the report after the run).
fn stdout_is_open() -> bool {
    // SAFETY: F_GETFD on a descriptor number only reads the descriptor table.
    unsafe { libc::fcntl(1, libc::F_GETFD) != -1 }
}

/// `warden loadtest`'s signal handling: SIGINT and SIGTERM, caught on a thread of their own.
/// The first raises [`warden::loadtest::Interrupt`] (the run stops sending, drains for a grace
/// period, halts and reports) and is forwarded to a `--repeat` child running then; a second one
/// ends the process at once (exit 128 + the signal), the child killed with it.
struct LoadtestSignals {
    interrupt: std::sync::Arc<warden::loadtest::Interrupt>,
    /// The `--repeat` child running now.
    child: std::sync::Arc<std::sync::Mutex<RepeatChild>>,
}

/// The `--repeat` child running now (pid 0: none), and whether it was sent the interrupt.
#[derive(Default)]
struct RepeatChild {
    pid: i32,
    told: bool,
}

impl RepeatChild {
    /// Sends `signal` to the child, once per child.
    fn tell(&mut self, signal: i32) {
        if self.pid > 0 && !self.told {
            self.told = true;
            // SAFETY: kill(2) with the pid of our own child and a valid signal number.
            unsafe {
                libc::kill(self.pid, signal);
            }
        }
    }
}

/// `SIGINT` or `SIGTERM`'s number.
fn signal_number(name: &str) -> i32 {
    if name == "SIGTERM" {
        libc::SIGTERM
    } else {
        libc::SIGINT
    }
}

impl LoadtestSignals {
    /// Catches SIGINT and SIGTERM from now on.
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (mut int, mut term) = runtime.block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })?;
        let signals = LoadtestSignals {
            interrupt: std::sync::Arc::default(),
            child: std::sync::Arc::default(),
        };
        let interrupt = signals.interrupt.clone();
        let child = signals.child.clone();
        std::thread::Builder::new()
            .name("loadtest-signals".into())
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        let name = tokio::select! {
                            _ = int.recv() => "SIGINT",
                            _ = term.recv() => "SIGTERM",
                        };
                        let number = signal_number(name);
                        let mut running = child.lock().unwrap_or_else(|e| e.into_inner());
                        if !interrupt.raise(name) {
                            if running.pid > 0 {
                                // SAFETY: kill(2) with the pid of our own child.
                                unsafe {
                                    libc::kill(running.pid, libc::SIGKILL);
                                }
                            }
                            eprintln!("\nloadtest: {name} again: exiting at once, no report");
                            std::process::exit(128 + number);
                        }
                        running.tell(number);
                        drop(running);
                        eprintln!(
                            "\nloadtest: {name}: stopped sending; waiting at most {} s for the events in flight, then the report ({name} again exits at once)",
                            warden::loadtest::INTERRUPT_GRACE.as_secs()
                        );
                    }
                });
            })?;
        Ok(signals)
    }

    /// A `--repeat` child started (`pid`) or ended (0). A signal that came just before it
    /// started is forwarded now.
    fn running(&self, pid: u32) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        *child = RepeatChild {
            pid: i32::try_from(pid).unwrap_or(0),
            told: false,
        };
        if let Some(signal) = self.interrupt.raised() {
            child.tell(signal_number(signal));
        }
    }
}

/// `warden loadtest --config FILE`: the team and its workload (flags applied), its model servers
/// reached; on stderr why not.
fn load_workload(
    path: &std::path::Path,
    args: &LoadtestArgs,
) -> Result<(warden::team::TeamFile, warden::loadtest::workload::Workload), ExitCode> {
    use warden::loadtest::workload::{preflight, Overrides, Workload, CONNECT_TIMEOUT};
    let (text, file) = read_team(path)?;
    let overrides = Overrides {
        rate: args.rate,
        concurrency: args.concurrency,
        duration_s: args.duration,
        count: args.count,
    };
    let fail = |err: warden::loadtest::workload::WorkloadError| {
        eprintln!("error: {}: {err}", path.display());
        ExitCode::FAILURE
    };
    let workload = Workload::from_team_toml(&text, &file, overrides).map_err(fail)?;
    preflight(&file, CONNECT_TIMEOUT).map_err(fail)?;
    Ok((file, workload))
}

/// `warden loadtest compare A B`.
fn loadtest_compare(
    a: &std::path::Path,
    b: &std::path::Path,
    json: bool,
    fail_on_regression: bool,
    allow_different: bool,
) -> ExitCode {
    let read = |path: &std::path::Path| -> Result<serde_json::Value, ExitCode> {
        let text = std::fs::read_to_string(path).map_err(|err| {
            eprintln!("error: cannot read {}: {err}", path.display());
            ExitCode::FAILURE
        })?;
        serde_json::from_str(text.trim()).map_err(|err| {
            eprintln!(
                "error: {}: not a `warden loadtest --json` report: {err}",
                path.display()
            );
            ExitCode::FAILURE
        })
    };
    let checked = |path: &std::path::Path| {
        let value = read(path)?;
        match warden::loadtest::compare::check_report(&value) {
            Ok(()) => Ok(value),
            Err(why) => {
                eprintln!(
                    "error: {}: not a `warden loadtest --json` report: {why}",
                    path.display()
                );
                Err(ExitCode::FAILURE)
            }
        }
    };
    let (a, b) = match (checked(a), checked(b)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let differ = warden::loadtest::compare::differences(&a, &b);
    if !differ.is_empty() && !allow_different {
        eprintln!(
            "error: A and B are not the same run, so their timings do not compare: {} (--allow-different compares them anyway)",
            differ.join("; ")
        );
        return ExitCode::FAILURE;
    }
    let rows = warden::loadtest::compare::compare(&a, &b);
    let printed = if json {
        use std::io::Write;
        serde_json::to_string(&serde_json::json!({ "figures": rows }))
            .map_err(std::io::Error::other)
            .and_then(|text| writeln!(std::io::stdout(), "{text}"))
    } else {
        warden::loadtest::compare::write_comparison(&mut std::io::stdout(), &a, &b, &rows)
    };
    match printed {
        Err(err) if !is_broken_pipe(&err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
        _ => {}
    }
    if fail_on_regression && rows.iter().any(|r| r.regression) {
        return ExitCode::from(warden::loadtest::compare::EXIT_REGRESSION);
    }
    ExitCode::SUCCESS
}
