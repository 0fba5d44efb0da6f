//! The `warden` command: its command line (clap) and one call per command into `cmd/` (one file
//! per command, each a thin layer over the library).
#![deny(clippy::unwrap_used)]
use clap::{Parser, Subcommand};
use cmd::{client::ServerArgs, loadtest::LoadtestArgs};
use std::{path::PathBuf, process::ExitCode};

mod cmd;

/// mimalloc: a fleet of small actors allocates and frees many small blocks; glibc's malloc spent a
/// fifth of `warden loadtest --scenario idle` in chunk consolidation (measured with `perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Lets mimalloc back its segments with 2 MiB pages (transparent huge pages, asked for with
/// `madvise`), unless `MIMALLOC_ALLOW_LARGE_OS_PAGES` (or its older name `MIMALLOC_LARGE_OS_PAGES`)
/// says otherwise. A fleet of agents is hundreds of megabytes of small cells that a fleet halt or a
/// tick visits in no order: on 4 KiB pages most of those visits miss the TLB. Measured with
/// `warden loadtest --scenario idle --agents 1000000`: `halt_all` 423–450 → 236–253 ms and the
/// whole run's CPU time 2.5 → 1.6 s, at the same resident bytes (docs/performance.md). A small
/// team's resident memory does not change (`warden demo`: 41 MB either way).
fn allow_huge_pages() {
    let set = |name| std::env::var_os(name).is_some();
    if !set("MIMALLOC_ALLOW_LARGE_OS_PAGES") && !set("MIMALLOC_LARGE_OS_PAGES") {
        // SAFETY: sets one of mimalloc's options, read when it next asks the OS for memory.
        unsafe {
            libmimalloc_sys::mi_option_set_enabled(libmimalloc_sys::mi_option_large_os_pages, true)
        };
    }
}

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
    allow_huge_pages();
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

/// Runs the parsed command: one function of `cmd/` each.
fn command(cli: Cli) -> ExitCode {
    use warden::cli::client::Call;
    match cli.command {
        Command::Demo => cmd::demo::demo(),
        Command::Run {
            config,
            agent,
            events,
        } => cmd::run::run(&config, agent, events),
        Command::Loadtest(args) => cmd::loadtest::loadtest(*args),
        Command::Init { path, force } => cmd::init::init(&path, force),
        Command::Completions { shell } => cmd::init::completions(shell),
        Command::Status { key, json, server } => {
            cmd::client::client(server, Call::Status { key, json })
        }
        Command::Halt { key, server } => cmd::client::client(server, Call::Halt { key }),
        Command::Send {
            key,
            text,
            wait,
            json,
            server,
        } => cmd::client::client(
            server,
            Call::Send {
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
        } => cmd::client::client(
            server,
            Call::Events {
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
        } => cmd::client::client(server, Call::Unlock { key, reason }),
        Command::Pause { key, server } => cmd::client::client(server, Call::Pause { key }),
        Command::Resume {
            key,
            all: _,
            reason,
            server,
        } => match key {
            Some(key) => cmd::client::client(server, Call::Resume { key }),
            None => cmd::client::client(server, Call::ResumeAll { reason }),
        },
        Command::Clear { key, server } => cmd::client::client(server, Call::Clear { key }),
        Command::Ask {
            id,
            answer,
            note,
            json,
            server,
        } => cmd::client::ask(server, id, answer, note, json),
        Command::Serve {
            config,
            listen,
            db,
            cluster,
            node,
        } => cmd::serve::serve(config.as_deref(), listen, &db, cluster, node),
        Command::Mcp {
            config,
            db,
            read_only,
        } => cmd::serve::mcp(&config, &db, read_only),
        Command::Journal { db, action } => cmd::journal::journal(&db, action),
        Command::Config { action } => cmd::config::config(action),
    }
}
