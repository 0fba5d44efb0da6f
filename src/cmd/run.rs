//! `warden run`: a team from a team file, talked to from `--event`s or standard input.

use super::{is_broken_pipe, load_team};
use std::{io::IsTerminal, path::Path, process::ExitCode};

/// Runs the team of `config`, talking to `agent` (or the first assistant); the exit code says how
/// it ended ([`warden::cli::run::RunSummary::failure`]).
pub(crate) fn run(config: &Path, agent: Option<String>, events: Vec<String>) -> ExitCode {
    let file = match load_team(config) {
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
