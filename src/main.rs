//! The `warden` command: a thin clap layer over the library.
use clap::{Parser, Subcommand};
use std::{path::PathBuf, process::ExitCode};
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
    /// Validate or print configuration files.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Check a TOML config file; prints the first error (key, value, what is allowed).
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
            let result = actix_rt::System::new().block_on(async {
                let mut stdout = std::io::stdout();
                warden::demo::run(&mut stdout).await
            });
            match result {
                Ok(_) => ExitCode::SUCCESS,
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
                match WardenConfig::from_toml(&text) {
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
