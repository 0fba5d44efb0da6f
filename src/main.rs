//! The `warden` command: a thin clap layer over the library.
#![deny(clippy::unwrap_used)]
use clap::{Parser, Subcommand};
use std::{io::IsTerminal, path::PathBuf, process::ExitCode};

/// mimalloc: a fleet of small actors allocates and frees many small blocks; glibc's malloc spent a
/// fifth of `warden loadtest --scenario idle` in chunk consolidation (measured with `perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "warden",
    version,
    about = "An actor-model supervisor for teams of LLM agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a small team on the built-in scripted model: a breaker trip, a refused delegation, an
    /// unlock and a SystemHalt behind a backlog. No API key, no network.
    Demo,
    /// Start a team from a team file and talk to it: events from --event, or one per input line.
    /// Exits 9 when the agent ends locked out, 10 when events were sent and none was answered.
    ///
    /// Logs go to standard error, errors only by default; RUST_LOG=info (or warn, debug,
    /// warden=debug: the tracing env-filter syntax) shows more, such as the provider's retries.
    Run {
        /// Team file: config sections plus [providers.NAME] and [[agents]].
        #[arg(long)]
        config: PathBuf,
        /// The agent to talk to (default: the first assistant).
        #[arg(long)]
        agent: Option<String>,
        /// An event to send (repeatable); without any, each line of standard input is one.
        #[arg(long = "event")]
        events: Vec<String>,
    },
    /// Load-test a fleet of agents (delegation trees on the scripted model), or your own team with
    /// --config (its [workload] section), and print a report; `loadtest compare A.json B.json`
    /// compares two reports. Exits 11 when an invariant is violated, 14 when Ctrl-C or SIGTERM
    /// stopped it (the report of what was done is printed), 15 when a --threshold failed, 12 when
    /// --timeout-s cut the run short.
    Loadtest(Box<LoadtestArgs>),
    /// Run a team and the HTTP admin API on a durable journal (agents are restored from it).
    ///
    /// Every route but GET /healthz needs a token: set WARDEN_ADMIN_TOKEN (and optionally
    /// WARDEN_READ_TOKEN), or api.admin_token in the team file. Logs go to standard error, errors
    /// only by default; RUST_LOG=info (or warn, debug, warden=debug: the tracing env-filter syntax)
    /// shows more, such as answered asks and the provider's retries.
    Serve {
        /// Team file (default: the demo's team on the scripted model: `concierge`, which delegates to
        /// `researcher` and `scribe`); its [api] section sets tokens, the listen address and the body
        /// limit (WARDEN_ADMIN_TOKEN / WARDEN_READ_TOKEN win).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on [default: api.listen from the team file, else 127.0.0.1:7878].
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// The journal database file (created if missing).
        #[arg(long, default_value = warden::journal::DEFAULT_DB)]
        db: PathBuf,
        /// Join a cluster on NATS JetStream (nats://HOST:PORT); needs --node (or [cluster] in the
        /// team file). See docs/cluster.md.
        #[arg(long, value_name = "URL")]
        cluster: Option<String>,
        /// This node's name in the cluster (letters, digits, - and _).
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
    },
    /// Serve a team as an MCP server over standard input/output (for Claude Desktop, an IDE, any
    /// MCP client): tools list_agents, agent_status, event_status, list_asks, ask_agent, halt,
    /// halt_all, answer_ask.
    ///
    /// Agents are restored from the journal as `warden serve` does. Standard output carries the
    /// protocol only; logs go to standard error (RUST_LOG=info shows more). Ends when the client
    /// closes standard input.
    Mcp {
        /// Team file: config sections plus [providers.NAME] and [[agents]].
        #[arg(long)]
        config: PathBuf,
        /// The journal database file (created if missing; not one a running `warden serve` holds).
        #[arg(long, default_value = warden::journal::DEFAULT_DB)]
        db: PathBuf,
        /// Offer only the tools that read (list_agents, agent_status, event_status, list_asks): no
        /// ask_agent, no halts, no answer_ask.
        #[arg(long)]
        read_only: bool,
    },
    /// Inspect a journal database (read-only; safe while warden runs on it).
    Journal {
        /// The journal database file (never created nor changed here).
        #[arg(long, default_value = warden::journal::DEFAULT_DB, global = true)]
        db: PathBuf,
        #[command(subcommand)]
        action: JournalAction,
    },
    /// Write a commented team file to start from (default: warden.toml): the scripted model (runs
    /// offline), one assistant and one sub-agent, the safety keys with their defaults, an [api]
    /// section taking its tokens from the environment. Never overwrites a file without --force.
    Init {
        /// Where to write it.
        #[arg(default_value = warden::cli::init::DEFAULT_PATH)]
        path: PathBuf,
        /// Replace the file if one is there.
        #[arg(long)]
        force: bool,
    },
    /// Print a shell completion script: `warden completions bash > ~/.local/share/bash-completion/completions/warden`,
    /// `warden completions zsh > ~/.zfunc/_warden`, `warden completions fish > ~/.config/fish/completions/warden.fish`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Validate or print configuration files.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Status of a running server's agents (a table; --json for the raw statuses).
    Status {
        /// One agent (default: all).
        key: Option<String>,
        /// Print the raw statuses as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// SystemHalt one agent (and its delegates) on a running server, or every agent.
    Halt {
        /// The agent (default: all).
        key: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Unlock a locked-out agent on a running server.
    Unlock {
        /// The agent's key.
        key: String,
        /// Why (journaled with the unlock, as the console's unlock note is).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Clear an agent's emergency stop on a running server.
    Clear {
        /// The agent's key.
        key: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Pause an agent on a running server (ordinary work stays queued).
    Pause {
        /// The agent's key.
        key: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Resume a paused or halted agent on a running server, or (`--all`) lift the fleet halt: every
    /// agent `warden halt` stopped runs again (not one locked out, stopped by a breaker, paused, or
    /// halted again since). On a cluster node the lift is for every node.
    Resume {
        /// The agent's key.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        key: Option<String>,
        /// Lift the fleet halt instead of resuming one agent.
        #[arg(long)]
        all: bool,
        /// Why (journaled with every resume of the lift).
        #[arg(long, requires = "all")]
        reason: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Send a user event to an agent on a running server and print its answer.
    ///
    /// Exits 16 when the event is still pending (or running) after --wait seconds: it stays queued
    /// on the server, and the message names what it may wait for (a pending ask: answer it with
    /// `warden ask ID yes|no`). Exits 8 when it ended without an answer (refused, discarded,
    /// failed), 7 when the agent refuses events (locked out, halted).
    Send {
        /// The agent.
        key: String,
        /// The event's text.
        text: String,
        /// Wait up to this many seconds (0–300) for the answer; 0: only queue it (exit 0).
        #[arg(long, default_value_t = 60.0)]
        wait: f64,
        /// Print the event's fate as JSON (`{"id", "status", "answer", …}`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Show a running server's events, one a line: the last ones, then (with --follow) new ones as
    /// they happen.
    Events {
        /// Only this agent's events (and notices).
        #[arg(long, value_name = "KEY")]
        agent: Option<String>,
        /// How many past events to show first (0–1000).
        #[arg(long, short = 'n', default_value_t = 20, value_parser = clap::value_parser!(u16).range(0..=1000))]
        last: u16,
        /// Keep showing new events until interrupted (reconnecting when the stream breaks).
        #[arg(long, short = 'f')]
        follow: bool,
        /// One JSON object a line: each event as the journal has it (epoch-ms `at_ms`), each notice
        /// as `{"notice": KIND, "data": …}`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// List the pending asks (limits and tool permissions), or answer one: `warden ask ID yes|no`.
    Ask {
        /// The ask to answer (without it: list the pending asks).
        id: Option<u64>,
        /// The answer (required with ID).
        #[arg(value_parser = ["yes", "no", "y", "n"], requires = "id")]
        answer: Option<String>,
        /// A note for the record: journaled with the decision and who answered (`limit_decided`,
        /// `permission_decided`).
        #[arg(long, requires = "answer")]
        note: Option<String>,
        /// The pending asks as JSON.
        #[arg(long, conflicts_with = "id")]
        json: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// Where the server is and how to authenticate.
#[derive(clap::Args)]
struct ServerArgs {
    /// The server: http://HOST:PORT, https://HOST:PORT, or HOST:PORT for http [env: WARDEN_URL;
    /// default: http://127.0.0.1:7878].
    #[arg(long)]
    url: Option<String>,
    /// Bearer token [default: WARDEN_ADMIN_TOKEN, then WARDEN_READ_TOKEN for status and ask].
    #[arg(long)]
    token: Option<String>,
}

#[derive(clap::Args)]
struct LoadtestArgs {
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

#[derive(Subcommand)]
enum JournalAction {
    /// The last events, oldest first.
    Tail {
        /// How many events.
        #[arg(short = 'n', long, default_value_t = 20)]
        lines: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// One agent: its record rebuilt from the journal, and its events.
    Show {
        /// The agent's key.
        agent: String,
        /// One JSON object `{record, events}`.
        #[arg(long)]
        json: bool,
    },
    /// Every event, oldest first, one JSON object a line (as `tail --json`).
    Export {
        /// JSON lines (the only format, and the default; accepted for older scripts).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Check a config or team file as `run` and `serve` would; prints the first error (where it
    /// is, the key, the value, what is allowed).
    Check {
        /// The file (TOML): configuration sections, and for a team file [providers.NAME] and
        /// [[agents]].
        file: PathBuf,
    },
    /// Print the full default configuration, [api] included.
    Defaults,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = init_tracing(&cli.command);
    let code = command(cli);
    if let Some(telemetry) = telemetry {
        // Bounded (`warden::telemetry::SHUTDOWN_TIMEOUT`): a dead collector cannot hold the exit.
        telemetry.shutdown();
    }
    code
}

/// Logs to standard error (`RUST_LOG`, errors only by default) and, when configured by the
/// `OTEL_*` variables or the team file's `[telemetry]` (`warden run` and `warden serve`), the
/// OpenTelemetry export. A telemetry setting that cannot be used is reported and export stays off:
/// warden runs as it would without it.
fn init_tracing(command: &Command) -> Option<warden::telemetry::Telemetry> {
    use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt, Layer};
    let config = match command {
        Command::Run { config, .. }
        | Command::Serve {
            config: Some(config),
            ..
        } => Some(config.as_path()),
        _ => None,
    };
    let section = config
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| warden::telemetry::TelemetrySection::from_team_toml(&text));
    let telemetry = match warden::telemetry::TelemetryConfig::resolve(section.as_ref(), |name| {
        std::env::var(name).ok()
    }) {
        Ok(None) => None,
        Ok(Some(settings)) => match warden::telemetry::Telemetry::start(&settings) {
            Ok(telemetry) => Some(telemetry),
            Err(err) => {
                eprintln!("warden: telemetry off: {err}");
                None
            }
        },
        Err(err) => {
            eprintln!("warden: telemetry off: {err}");
            None
        }
    };
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        );
    tracing_subscriber::registry()
        .with(logs)
        .with(telemetry.as_ref().map(|t| t.layer()))
        .init();
    if let Some(t) = &telemetry {
        tracing::info!(endpoint = %t.config().traces_endpoint, "OpenTelemetry export on");
    }
    telemetry
}

fn command(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Demo => {
            let terminal = std::io::stdin().is_terminal();
            let mut asker = move |_question: &str| -> Option<String> {
                if !terminal {
                    return None;
                }
                print!("   your answer (yes/no): ");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).ok()?;
                Some(line.trim().to_owned())
            };
            let result = actix_rt::System::new().block_on(async {
                let mut stdout = std::io::stdout();
                warden::cli::demo::run(&mut stdout, &mut asker).await
            });
            match result {
                Ok(_) => ExitCode::SUCCESS,
                Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run {
            config,
            agent,
            events,
        } => {
            let file = match load_team(&config) {
                Ok(file) => file,
                Err(code) => return code,
            };
            // Standard input carries events (when no --event is given) and answers to limit asks;
            // it is read only when it is a terminal or when no --event was given.
            let read_stdin = events.is_empty() || std::io::stdin().is_terminal();
            let input = read_stdin.then(stdin_lines);
            let options = warden::cli::run::RunOptions { agent, events };
            let result = actix_rt::System::new().block_on(async move {
                let mut stdout = std::io::stdout();
                warden::cli::run::run(file, options, input, &mut stdout).await
            });
            match result {
                Ok(summary) => match summary.failure() {
                    None => ExitCode::SUCCESS,
                    Some((code, why)) => {
                        eprintln!("warden run: {why}");
                        ExitCode::from(code)
                    }
                },
                // The reader went away (`warden run … | head`): the run itself is over.
                Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Loadtest(args) => loadtest(*args),
        Command::Init { path, force } => match warden::cli::init::write(&path, force) {
            Ok(()) => {
                println!(
                    "wrote {0}: `warden config check {0}` checks it, `warden run --config {0}` \
                     talks to it",
                    path.display()
                );
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "warden", &mut out);
            match std::io::Write::write_all(&mut std::io::stdout(), &out) {
                Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Command::Status { key, json, server } => {
            client(server, warden::cli::client::Call::Status { key, json })
        }
        Command::Halt { key, server } => client(server, warden::cli::client::Call::Halt { key }),
        Command::Send {
            key,
            text,
            wait,
            json,
            server,
        } => client(
            server,
            warden::cli::client::Call::Send {
                key,
                content: text,
                wait: Some(wait),
                json,
            },
        ),
        Command::Events {
            agent,
            last,
            follow,
            json,
            server,
        } => client(
            server,
            warden::cli::client::Call::Events {
                agent,
                last: usize::from(last),
                follow,
                json,
            },
        ),
        Command::Unlock {
            key,
            reason,
            server,
        } => client(server, warden::cli::client::Call::Unlock { key, reason }),
        Command::Pause { key, server } => client(server, warden::cli::client::Call::Pause { key }),
        Command::Resume {
            key,
            all: _,
            reason,
            server,
        } => match key {
            Some(key) => client(server, warden::cli::client::Call::Resume { key }),
            None => client(server, warden::cli::client::Call::ResumeAll { reason }),
        },
        Command::Clear { key, server } => client(server, warden::cli::client::Call::Clear { key }),
        Command::Ask {
            id,
            answer,
            note,
            json,
            server,
        } => {
            let call = match (id, answer) {
                (Some(id), Some(answer)) => warden::cli::client::Call::Answer { id, answer, note },
                (Some(_), None) => {
                    eprintln!("error: warden ask ID needs an answer: yes or no");
                    return ExitCode::from(2);
                }
                (None, _) => warden::cli::client::Call::Asks { json },
            };
            client(server, call)
        }
        Command::Serve {
            config,
            listen,
            db,
            cluster,
            node,
        } => {
            let text = match &config {
                Some(path) => match std::fs::read_to_string(path) {
                    Ok(text) => text,
                    Err(err) => {
                        eprintln!("error: cannot read {}: {err}", path.display());
                        return ExitCode::FAILURE;
                    }
                },
                None => warden::serve::DEFAULT_TEAM.to_owned(),
            };
            // Validated as `warden config check` validates it: nothing is spawned from a bad file.
            let mut file = match warden::team::TeamFile::from_toml(&text) {
                Ok(file) => file,
                Err(err) => {
                    match &config {
                        Some(path) => eprintln!("error: {}: {err}", path.display()),
                        None => eprintln!("error: the default team: {err}"),
                    }
                    return ExitCode::FAILURE;
                }
            };
            match file.cluster.clone().with_flags(cluster, node) {
                Ok(section) => file.cluster = section,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::FAILURE;
                }
            }
            let api = match file.api_config() {
                Ok(api) => api,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::FAILURE;
                }
            };
            let listen = listen
                .or(file.api.listen)
                .unwrap_or(std::net::SocketAddr::from(([127, 0, 0, 1], 7878)));
            let result = actix_rt::System::new()
                .block_on(async move { warden::serve::serve_team(file, &db, listen, api).await });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Mcp {
            config,
            db,
            read_only,
        } => {
            let file = match load_team(&config) {
                Ok(file) => file,
                Err(code) => return code,
            };
            let access = if read_only {
                warden::server::mcp::McpAccess::Read
            } else {
                warden::server::mcp::McpAccess::Admin
            };
            let result = actix_rt::System::new()
                .block_on(async move { warden::serve::serve_stdio(file, &db, access).await });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Journal { db, action } => {
            let mut stdout = std::io::stdout().lock();
            let result = match action {
                JournalAction::Tail { lines, json } => {
                    warden::journal::tail(&db, lines, json, &mut stdout)
                }
                JournalAction::Show { agent, json } => {
                    warden::journal::show(&db, &agent, json, &mut stdout)
                }
                JournalAction::Export { json: _ } => warden::journal::export_json(&db, &mut stdout),
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Config { action } => match action {
            ConfigAction::Defaults => {
                use std::io::Write;
                let mut stdout = std::io::stdout().lock();
                let printed = write!(stdout, "{}", warden::team::defaults_toml())
                    .and_then(|()| write!(stdout, "{}", warden::team::provider_defaults_toml()));
                match printed {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
                    Err(err) => {
                        eprintln!("error: {err}");
                        ExitCode::FAILURE
                    }
                }
            }
            ConfigAction::Check { file } => {
                let text = match std::fs::read_to_string(&file) {
                    Ok(text) => text,
                    Err(err) => {
                        eprintln!("error: cannot read {}: {err}", file.display());
                        return ExitCode::FAILURE;
                    }
                };
                match warden::team::check(&text) {
                    Ok(warden::team::Checked::Team { agents }) => {
                        // Each agent's provider built as `run` and `serve` build it: an
                        // `api_key_env` that is unset or empty fails here as it fails there.
                        if let Err(err) = build_providers(&text) {
                            eprintln!("error: {}: {err}", file.display());
                            return ExitCode::FAILURE;
                        }
                        let noun = if agents == 1 { "agent" } else { "agents" };
                        let mut mcp_tools = std::collections::BTreeMap::new();
                        if !check_mcp_servers(&text, &mut mcp_tools) {
                            return ExitCode::FAILURE;
                        }
                        if let Ok(team) = warden::team::TeamFile::parse(&text) {
                            print!("{}", team.permission_table(&mcp_tools));
                        }
                        println!("{}: ok (a team of {agents} {noun})", file.display());
                        ExitCode::SUCCESS
                    }
                    Ok(warden::team::Checked::ConfigOnly) => {
                        println!(
                            "{}: ok (configuration only: warden run and warden serve also need \
                             [providers.NAME] and [[agents]])",
                            file.display()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(err) => {
                        eprintln!("error: {}: {err}", file.display());
                        ExitCode::FAILURE
                    }
                }
            }
        },
    }
}

/// `warden config check` of a valid team file: builds the provider of every agent (reading each
/// `api_key_env` variable) as [`warden::team::TeamFile::spawn_agents`] does, and nothing else (no
/// request is sent).
fn build_providers(text: &str) -> Result<(), warden::team::TeamError> {
    let Ok(team) = warden::team::TeamFile::from_toml(text) else {
        return Ok(()); // reported by the check already
    };
    let used: std::collections::BTreeSet<&str> =
        team.agents.iter().map(|a| a.provider.as_str()).collect();
    for name in used {
        team.provider(name)?;
    }
    Ok(())
}

/// `warden config check` of a team file with `[mcp_servers]`: starts each server, lists its tools
/// (printed) and ends it; checks that every agent's `tools` entry names a tool that exists. Prints
/// exactly why not and returns false on any failure. Each agent's MCP tools (the name the model
/// sees, the tier) go into `agent_tools` for the permission table.
fn check_mcp_servers(
    text: &str,
    agent_tools: &mut std::collections::BTreeMap<
        String,
        Vec<(String, warden_protocols::ToolCategory)>,
    >,
) -> bool {
    let Ok(file) = warden::team::TeamFile::parse(text) else {
        return true; // reported by the check already
    };
    if file.mcp_servers.is_empty() {
        return true;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start a runtime to check the MCP servers: {err}");
            return false;
        }
    };
    // Each server is started once: its tools listed, then every agent's `tools` checked against it
    // (the same check `warden run` makes at start).
    let check = runtime.block_on(file.check_mcp());
    let mut ok = true;
    for (name, probe) in &check.servers {
        match probe {
            Ok(tools) => {
                println!("mcp server {name}: {} tools", tools.len());
                for tool in tools {
                    match &tool.model_name {
                        Ok(model) => println!("  {name}.{} (the model sees {model})", tool.name),
                        Err(why) => println!("  {name}.{} REFUSED: {why}", tool.name),
                    }
                }
            }
            Err(err) => {
                eprintln!("error: {err}");
                ok = false;
            }
        }
    }
    if !ok {
        return false;
    }
    match check.tools {
        Ok(tiers) => agent_tools.extend(tiers),
        Err(err) => {
            eprintln!("error: {err}");
            return false;
        }
    }
    true
}

/// Runs one client command against a running server; prints one `error:` line on failure.
fn client(server: ServerArgs, call: warden::cli::client::Call) -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let url = server
        .url
        .or_else(|| env("WARDEN_URL").filter(|u| !u.is_empty()))
        .unwrap_or_else(|| warden::cli::client::DEFAULT_URL.to_owned());
    let token = warden::cli::client::token_for(server.token, call.read_only(), env);
    let result = actix_rt::System::new().block_on(async move {
        let client = warden::cli::client::Client::new(&url, token)?;
        let mut stdout = std::io::stdout();
        warden::cli::client::run(&client, call, &mut stdout).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`warden events -f | head`): not an error worth a word.
        Err(warden::cli::client::ClientError::Output(e))
            if e.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

fn loadtest(args: LoadtestArgs) -> ExitCode {
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
        Some(path) => match std::fs::File::create(path) {
            Ok(file) => Some(file),
            Err(err) => {
                eprintln!("error: cannot write {}: {err}", path.display());
                return ExitCode::FAILURE;
            }
        },
    };
    if !stdout_is_open() {
        eprintln!("error: stdout is closed: the report would be lost");
        return ExitCode::FAILURE;
    }
    // Every sample reads mimalloc's committed memory beside RSS (the soak is judged on it).
    warden::loadtest::set_committed_probe(mimalloc_committed);
    // SIGINT / SIGTERM: stop, drain, report (exit 14); a second one exits at once.
    let signals = match LoadtestSignals::install() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("error: cannot catch SIGINT/SIGTERM: {err}");
            return ExitCode::FAILURE;
        }
    };
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
    // anything is spawned.
    let team = match &args.config {
        None => None,
        Some(path) => match load_workload(path, &args) {
            Ok(team) => Some(team),
            Err(code) => return code,
        },
    };
    let mut reports = Vec::with_capacity(args.repeat);
    // Each repeat in a fresh process, as a user's run is (peak RSS and memory per agent are
    // process-wide; a second run in the same process would reuse the first one's memory): the
    // first N-1 in children, the last in this process, which has run nothing else.
    for _ in 1..args.repeat {
        match args.run_child(&signals) {
            Ok(report) => reports.push(report),
            Err(err) => {
                eprintln!("error: a repeat of the run failed: {err}");
                return ExitCode::FAILURE;
            }
        }
        if signals.interrupt.raised().is_some() {
            break;
        }
    }
    // Interrupted during a repeat: report what was done, without starting another run.
    if signals.interrupt.raised().is_none() || reports.is_empty() {
        let report = match &team {
            None => match args.cluster_options() {
                None => warden::loadtest::run_loadtest(options.clone()),
                Some(cluster) => {
                    match warden::loadtest::cluster::run_cluster(options.clone(), &cluster) {
                        Ok(report) => report,
                        Err(err) => {
                            eprintln!("error: {err}");
                            return ExitCode::FAILURE;
                        }
                    }
                }
            },
            Some((file, workload)) => {
                let config = args
                    .config
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                match warden::loadtest::workload::run_team(file, workload, &config, &options) {
                    Ok(report) => report,
                    Err(err) => {
                        // Named by its file, as every other error of a team file.
                        eprintln!("error: {config}: {err}");
                        return ExitCode::FAILURE;
                    }
                }
            }
        };
        reports.push(report);
    }
    // Thresholds: the team file's, then the flags'; judged on the report printed (the last).
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
            match serde_json::to_value(&*last) {
                Ok(value) => {
                    last.thresholds = warden::loadtest::thresholds::evaluate(&thresholds, &value)
                }
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let Some(report) = reports.last() else {
        return ExitCode::SUCCESS;
    };
    let mut value = match serde_json::to_value(report) {
        Ok(value) => value,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    if args.repeat > 1 {
        let all: Vec<serde_json::Value> = reports
            .iter()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        value["repeat"] = warden::loadtest::compare::summarize(&all);
    }
    let printed = if args.json {
        use std::io::Write;
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
        Err(err) if !is_broken_pipe(&err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
        _ => {}
    }
    if let (Some(path), Some(file)) = (&args.report, html_out) {
        let written = (|| {
            let mut out = std::io::BufWriter::new(file);
            warden::loadtest::html::write_html(&mut out, report, &args.configuration())?;
            use std::io::Write;
            out.flush()
        })();
        if let Err(err) = written {
            eprintln!("error: cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
    }
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

/// Whether `err`, or an error it wraps, is a write to a closed pipe (`warden journal tail | head`):
/// the reader went away, which is not worth a word.
fn is_broken_pipe(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        if e.downcast_ref::<serde_json::Error>()
            .is_some_and(|j| j.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Lines of standard input, read on their own thread.
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads and parses the team file at `path` (`warden run`, `warden mcp`), saying on stderr why not.
fn load_team(path: &std::path::Path) -> Result<warden::team::TeamFile, ExitCode> {
    read_team(path).map(|(_, file)| file)
}

/// [`load_team`], with the file's text.
fn read_team(path: &std::path::Path) -> Result<(String, warden::team::TeamFile), ExitCode> {
    let text = std::fs::read_to_string(path).map_err(|err| {
        eprintln!("error: cannot read {}: {err}", path.display());
        ExitCode::FAILURE
    })?;
    let file = warden::team::TeamFile::from_toml(&text).map_err(|err| {
        eprintln!("error: {}: {err}", path.display());
        ExitCode::FAILURE
    })?;
    Ok((text, file))
}
