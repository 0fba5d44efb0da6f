//! The `warden` binary's commands, one file each (declared by `main.rs`: the binary's own modules,
//! not part of the library). `main.rs` parses the command line and calls one function here; each
//! is a thin layer over the library (`warden::cli`, `warden::team`, `warden::journal`, …) that
//! prints and chooses the exit code.

pub(crate) mod client;
pub(crate) mod config;
pub(crate) mod demo;
pub(crate) mod init;
pub(crate) mod journal;
pub(crate) mod loadtest;
pub(crate) mod run;
pub(crate) mod serve;

use std::process::ExitCode;

/// Whether `err`, or an error it wraps, is a write to a closed pipe (`warden journal tail | head`):
/// the reader went away, which is not worth a word.
pub(crate) fn is_broken_pipe(err: &(dyn std::error::Error + 'static)) -> bool {
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

/// Reads and parses the team file at `path` (`warden run`, `warden mcp`), saying on stderr why not.
pub(crate) fn load_team(path: &std::path::Path) -> Result<warden::team::TeamFile, ExitCode> {
    read_team(path).map(|(_, file)| file)
}

/// [`load_team`], with the file's text.
pub(crate) fn read_team(
    path: &std::path::Path,
) -> Result<(String, warden::team::TeamFile), ExitCode> {
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

/// The exit code of a command whose work is done: success, also when the reader of standard output
/// went away (`warden journal tail | head`); else the error on standard error and failure.
pub(crate) fn finish<E: std::error::Error + 'static>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
