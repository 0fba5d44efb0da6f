//! `warden config check` and `warden config defaults`.

use crate::ConfigAction;
use std::{path::Path, process::ExitCode};

pub(crate) fn config(action: ConfigAction) -> ExitCode {
    match action {
        ConfigAction::Defaults => {
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            super::finish(
                write!(stdout, "{}", warden::team::defaults_toml())
                    .and_then(|()| write!(stdout, "{}", warden::team::provider_defaults_toml())),
            )
        }
        ConfigAction::Check { file } => check(&file),
    }
}

/// `warden config check FILE`: the first error, or what the file is (and each tool's rule).
fn check(file: &Path) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
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
