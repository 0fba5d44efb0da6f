//! The `warden` command: a thin clap layer over the library.
use clap::{Parser, Subcommand};
use std::{io::IsTerminal, path::PathBuf, process::ExitCode};
use warden::WardenConfig;

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
    /// Run a team and the HTTP admin API on a durable journal (agents are restored from it).
    Serve {
        /// Team file (default: one assistant on the scripted model).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: std::net::SocketAddr,
        /// The journal database.
        #[arg(long, default_value = warden::journal::DEFAULT_DB)]
        db: PathBuf,
    },
    /// Inspect a journal database (read-only; safe while warden runs on it).
    Journal {
        /// The journal database.
        #[arg(long, default_value = warden::journal::DEFAULT_DB, global = true)]
        db: PathBuf,
        #[command(subcommand)]
        action: JournalAction,
    },
    /// Validate or print configuration files.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
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
        agent: String,
        /// One JSON object `{record, events}`.
        #[arg(long)]
        json: bool,
    },
    /// Every event.
    Export {
        /// As a JSON array (the only format for now).
        #[arg(long, required = true)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Check a config or team file; prints the first error (key, value, what is allowed).
    Check { file: PathBuf },
    /// Print the full default configuration.
    Defaults,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
                warden::demo::run(&mut stdout, &mut asker).await
            });
            match result {
                Ok(_) => ExitCode::SUCCESS,
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
            let text = match std::fs::read_to_string(&config) {
                Ok(text) => text,
                Err(err) => {
                    eprintln!("error: cannot read {}: {err}", config.display());
                    return ExitCode::FAILURE;
                }
            };
            let file = match warden::team::TeamFile::from_toml(&text) {
                Ok(file) => file,
                Err(err) => {
                    eprintln!("{}: {err}", config.display());
                    return ExitCode::FAILURE;
                }
            };
            // Standard input carries events (when no --event is given) and answers to limit asks;
            // it is read only when it is a terminal or when no --event was given.
            let read_stdin = events.is_empty() || std::io::stdin().is_terminal();
            let input = read_stdin.then(stdin_lines);
            let options = warden::run::RunOptions { agent, events };
            let result = actix_rt::System::new().block_on(async move {
                let mut stdout = std::io::stdout();
                warden::run::run(file, options, input, &mut stdout).await
            });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve { config, listen, db } => {
            let text = match &config {
                Some(path) => match std::fs::read_to_string(path) {
                    Ok(text) => text,
                    Err(err) => {
                        eprintln!("error: cannot read {}: {err}", path.display());
                        return ExitCode::FAILURE;
                    }
                },
                None => warden::api::DEFAULT_TEAM.to_owned(),
            };
            let file = match warden::team::TeamFile::from_toml(&text) {
                Ok(file) => file,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::FAILURE;
                }
            };
            let api = warden::api::ApiConfig::from_env();
            let result = actix_rt::System::new()
                .block_on(async move { warden::api::serve_team(file, &db, listen, api).await });
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
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Config { action } => match action {
            ConfigAction::Defaults => {
                print!("{}", WardenConfig::defaults_toml());
                ExitCode::SUCCESS
            }
            ConfigAction::Check { file } => {
                let text = match std::fs::read_to_string(&file) {
                    Ok(text) => text,
                    Err(err) => {
                        eprintln!("error: cannot read {}: {err}", file.display());
                        return ExitCode::FAILURE;
                    }
                };
                match warden::team::TeamFile::from_toml(&text) {
                    Ok(_) => {
                        println!("{}: ok", file.display());
                        ExitCode::SUCCESS
                    }
                    Err(err) => {
                        eprintln!("{}: {err}", file.display());
                        ExitCode::FAILURE
                    }
                }
            }
        },
    }
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
