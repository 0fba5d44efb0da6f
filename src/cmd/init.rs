//! `warden init` (a commented team file to start from) and `warden completions SHELL`.

use std::{path::Path, process::ExitCode};

/// Writes the starter team file at `path` ([`warden::cli::init::write`]; refused over an existing
/// file unless `force`).
pub(crate) fn init(path: &Path, force: bool) -> ExitCode {
    match warden::cli::init::write(path, force) {
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
    }
}

/// Prints the completion script for `shell`, generated from the command line's definition.
pub(crate) fn completions(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut crate::Cli::command(), "warden", &mut out);
    match std::io::Write::write_all(&mut std::io::stdout(), &out) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}
