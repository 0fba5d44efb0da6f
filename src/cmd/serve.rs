//! `warden serve` (the team and the HTTP admin API on a durable journal) and `warden mcp` (the
//! same team over MCP on standard input and output).

use super::load_team;
use std::{net::SocketAddr, path::Path, process::ExitCode};

/// `warden serve`: the team file (or the demo's team), checked as `warden config check` checks it,
/// with the `--cluster`/`--node` flags applied; serves until stopped.
pub(crate) fn serve(
    config: Option<&Path>,
    listen: Option<SocketAddr>,
    db: &Path,
    cluster: Option<String>,
    node: Option<String>,
) -> ExitCode {
    let text = match config {
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
            match config {
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
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7878)));
    let result = actix_rt::System::new()
        .block_on(async move { warden::serve::serve_team(file, db, listen, api).await });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `warden mcp`: the team of `config` as an MCP server on standard input and output.
pub(crate) fn mcp(config: &Path, db: &Path, read_only: bool) -> ExitCode {
    let file = match load_team(config) {
        Ok(file) => file,
        Err(code) => return code,
    };
    let access = if read_only {
        warden::server::mcp::McpAccess::Read
    } else {
        warden::server::mcp::McpAccess::Admin
    };
    let result = actix_rt::System::new()
        .block_on(async move { warden::serve::serve_stdio(file, db, access).await });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
