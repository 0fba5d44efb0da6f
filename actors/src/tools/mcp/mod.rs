//! Tools from MCP servers (feature `mcp`), on `rmcp`, the official Rust SDK. See `docs/mcp.md`.
//!
//! [`McpHub::start`] starts every `[mcp_servers.NAME]` of a team file — a stdio child (clean
//! environment: only `env`, plus `PATH`) or a streamable-HTTP session — performs the handshake and
//! lists the tools (`tools/list`, all pages). [`McpHub::tools_for`] turns an agent's
//! `tools = ["NAME.TOOL", "NAME.*"]` into [`McpTool`]s, which are ordinary [`Tool`]s: the agent's
//! `ToolRunner` gives them a timeout, a circuit breaker, argument validation against the server's
//! input schema and (opt-in) a cache, and the turn's halt gate keeps a halted agent from starting one.
//!
//! * Names: the model sees `NAME__TOOL` (OpenAI function names allow no dot); team files and the
//!   journal's `source` say which server.
//! * Untrusted metadata: a description is cut to `max_description_chars`; a schema over
//!   `max_schema_bytes` makes the tool refused; each tool given to an agent is journaled
//!   (`ToolDefined`, with SHA-256 hashes). After `notifications/tools/list_changed` (or a restart)
//!   the list is fetched again; a changed description or schema is journaled
//!   (`ToolDefinitionChanged`) and the tool is disabled unless `allow_changes = true`; a tool gone
//!   from the list is disabled.
//! * Halts: dropping a call's future (a halt or pause cancels the turn; a timeout) sends
//!   `notifications/cancelled` for its request id at once.
//! * Progress notifications are journaled as `ToolProgress` on the calling agent.
//! * Results: text as is, images and binary resources as placeholders, over `max_result_bytes` a
//!   failed call (a stdio line over the cap is cut as it is read, never held whole); `isError` a
//!   failed call, counted on the circuit.
//! * A stdio child that dies is restarted with exponential backoff (0.5 s doubling to 30 s); calls
//!   meanwhile fail at once saying so. [`McpHub::shutdown`] (or dropping the hub) ends children.
//!
//! Files: `client.rs` (connection, restarts, notifications), `definition.rs` (checking listed
//! tools), `tool.rs` ([`McpTool`], result mapping), `capped.rs` (the stdio line cap), `group.rs`
//! (stdio servers' process groups), `session.rs` (a 400 on a known HTTP session is the session
//! gone), `error.rs`.

mod capped;
mod client;
mod definition;
mod error;
#[allow(unsafe_code)] // pre_exec and killpg: the SAFETY comments are in group.rs
mod group;
mod session;
mod tool;

pub use definition::model_tool_name;
pub use error::McpError;

/// Looks up an environment variable by name (`bearer_env`, `headers_env`); injectable for tests.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;
pub use tool::McpTool;

use crate::{journal::Journal, tools::Tool};
use client::Shared;
use std::{collections::BTreeMap, sync::Arc};
use warden_protocols::{AgentKey, EventKind, McpServerConfig, McpToolSelector, ToolSpec};

/// A tool a server lists, as `warden config check` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTool {
    /// The name the server knows it by.
    pub name: String,
    /// The name the model sees (`SERVER__TOOL`), or why the tool is refused.
    pub model_name: Result<String, String>,
    /// Its description (cut to the server's cap).
    pub description: String,
}

/// The running MCP servers of a team. Dropping it ends them (children are killed).
#[derive(Debug, Default)]
pub struct McpHub {
    servers: BTreeMap<String, Arc<Shared>>,
    /// Taken by [`McpHub::shutdown`] (which needs only `&self`: a cluster node's adoption shares
    /// the hub).
    tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Where the stdio children's process groups are recorded, if anywhere.
    groups: Option<Arc<group::GroupRecord>>,
}

impl Drop for McpHub {
    fn drop(&mut self) {
        for server in self.servers.values() {
            server.shutdown.cancel();
        }
    }
}

impl McpHub {
    /// Starts every server (all at once) and lists its tools; the first failure is returned (the
    /// others are ended). `env` resolves the variables named by `bearer_env` and `headers_env`.
    pub async fn start(
        configs: &BTreeMap<String, McpServerConfig>,
        env: EnvLookup,
    ) -> Result<Self, McpError> {
        Self::start_with(configs, env, None).await
    }

    /// [`McpHub::start`], recording the process group of each stdio server in the file `record`
    /// (`warden serve` keeps it next to its journal): the groups a previous run recorded there and
    /// that still run — a warden killed by `SIGKILL` leaves behind what its children started, and
    /// outside Linux its children too — are killed first. See `docs/mcp.md` ("Processes").
    pub async fn start_recorded(
        configs: &BTreeMap<String, McpServerConfig>,
        env: EnvLookup,
        record: &std::path::Path,
    ) -> Result<Self, McpError> {
        let (groups, ended) = group::GroupRecord::take_over(record);
        for (server, pgid) in ended {
            tracing::warn!(
                server = %server,
                pgid,
                "ended MCP server `{server}` (process group {pgid}) left running by a previous \
                 warden that did not stop cleanly"
            );
        }
        Self::start_with(configs, env, Some(Arc::new(groups))).await
    }

    async fn start_with(
        configs: &BTreeMap<String, McpServerConfig>,
        env: EnvLookup,
        groups: Option<Arc<group::GroupRecord>>,
    ) -> Result<Self, McpError> {
        let starts = configs.iter().map(|(name, config)| {
            let shared = Shared::new(name.clone(), config.clone(), env.clone(), groups.clone());
            async move {
                let connection = shared.connect().await?;
                shared.up(&connection);
                let tools = match shared.peer() {
                    Ok(peer) => shared.list(&peer).await?,
                    Err(why) => {
                        return Err(McpError::Handshake {
                            server: shared.name.clone(),
                            detail: why,
                            stderr: String::new(),
                        })
                    }
                };
                let mut defs = BTreeMap::new();
                let mut refused = BTreeMap::new();
                let mut models: BTreeMap<String, String> = BTreeMap::new();
                for tool in tools {
                    match definition::ToolDef::from_listed(&shared.name, &shared.config, tool) {
                        Ok(def) => {
                            if let Some(first) = models.insert(def.model_name.clone(), def.remote.clone()) {
                                refused.insert(
                                    def.remote.clone(),
                                    format!("its model name `{}` is taken by `{first}`", def.model_name),
                                );
                                continue;
                            }
                            defs.insert(def.remote.clone(), def);
                        }
                        Err((name, why)) => {
                            tracing::warn!(server = %shared.name, tool = %name, "MCP tool refused: {why}");
                            refused.insert(name, why);
                        }
                    }
                }
                *shared.defs.write() = defs;
                *shared.refused.write() = refused;
                Ok((shared, connection))
            }
        });
        let started = futures::future::join_all(starts).await;
        let mut hub = McpHub {
            servers: BTreeMap::new(),
            tasks: parking_lot::Mutex::new(Vec::new()),
            groups,
        };
        let mut first_error = None;
        for outcome in started {
            match outcome {
                Ok((shared, connection)) => {
                    hub.tasks
                        .get_mut()
                        .push(tokio::spawn(shared.clone().supervise(connection)));
                    hub.servers.insert(shared.name.clone(), shared);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e), // dropping `hub` ends the servers that did start
            None => Ok(hub),
        }
    }

    /// The servers' names.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// The tools `server` lists (accepted and refused), sorted by name.
    pub fn listed(&self, server: &str) -> Vec<ListedTool> {
        let Some(shared) = self.servers.get(server) else {
            return Vec::new();
        };
        let mut out: Vec<ListedTool> = shared
            .defs
            .read()
            .values()
            .map(|d| ListedTool {
                name: d.remote.clone(),
                model_name: Ok(d.model_name.clone()),
                description: d.description.clone(),
            })
            .collect();
        out.extend(shared.refused.read().iter().map(|(name, why)| ListedTool {
            name: name.clone(),
            model_name: Err(why.clone()),
            description: String::new(),
        }));
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The tools `entries` (an agent's `tools = [...]`) name, for `agent`: each journaled on it as
    /// [`EventKind::ToolDefined`] through `journal`, which also receives its progress and changes.
    /// An entry naming an unknown server or tool is an error naming the agent, the entry and what
    /// there is.
    pub fn tools_for(
        &self,
        agent: &AgentKey,
        entries: &[String],
        journal: &Arc<dyn Journal>,
    ) -> Result<Vec<Arc<dyn Tool>>, McpError> {
        let mut picked: BTreeMap<String, Arc<dyn Tool>> = BTreeMap::new();
        let have = || self.servers.keys().cloned().collect::<Vec<_>>().join(", ");
        for entry in entries {
            let Some(selector) = McpToolSelector::parse(entry) else {
                return Err(McpError::UnknownServer {
                    agent: agent.to_string(),
                    entry: entry.clone(),
                    server: entry.split('.').next().unwrap_or_default().to_owned(),
                    have: have(),
                });
            };
            let Some(shared) = self.servers.get(&selector.server) else {
                return Err(McpError::UnknownServer {
                    agent: agent.to_string(),
                    entry: entry.clone(),
                    server: selector.server,
                    have: have(),
                });
            };
            let defs = shared.defs.read();
            let chosen: Vec<_> = match &selector.tool {
                None => defs.values().collect(),
                Some(tool) => match defs.get(tool) {
                    Some(def) => vec![def],
                    None => {
                        return Err(McpError::UnknownTool {
                            agent: agent.to_string(),
                            entry: entry.clone(),
                            server: selector.server.clone(),
                            tool: tool.clone(),
                            detail: {
                                let names: Vec<&str> = defs.keys().map(String::as_str).collect();
                                let have = if names.is_empty() {
                                    "(none)".to_owned()
                                } else {
                                    names.join(", ")
                                };
                                match shared.refused.read().get(tool) {
                                    Some(why) => format!(
                                        "its tools: {have}; the server offers it but it was \
                                         refused: {why}"
                                    ),
                                    None => format!("its tools: {have}"),
                                }
                            },
                        })
                    }
                },
            };
            for def in chosen {
                if picked.contains_key(&def.model_name) {
                    continue;
                }
                let tool = McpTool {
                    shared: shared.clone(),
                    remote: def.remote.clone(),
                    spec: ToolSpec {
                        name: def.model_name.clone(),
                        description: def.description.clone(),
                        parameters: def.schema.clone(),
                        // The team file's `category` wins over the tool's annotations.
                        category: shared.config.category.or(def.annotated).unwrap_or_default(),
                    },
                    cacheable: shared.config.cache && def.cache_hint,
                    idempotent: shared.config.idempotent.unwrap_or(def.idempotent_hint),
                    agent: agent.clone(),
                };
                journal.append(
                    agent,
                    EventKind::ToolDefined {
                        tool: def.model_name.clone(),
                        source: shared.name.clone(),
                        description: def.description.clone(),
                        description_sha256: def.description_sha256.clone(),
                        schema_sha256: def.schema_sha256.clone(),
                    },
                );
                shared
                    .holders
                    .lock()
                    .entry(def.remote.clone())
                    .or_default()
                    .push(agent.clone());
                picked.insert(def.model_name.clone(), Arc::new(tool));
            }
            drop(defs);
            *shared.journal.write() = Some(journal.clone());
        }
        Ok(picked.into_values().collect())
    }

    /// Ends every server: children get their stdin closed and are killed, HTTP sessions closed.
    /// Waits for that (a few seconds at most per server).
    pub async fn shutdown(&self) {
        for server in self.servers.values() {
            server.shutdown.cancel();
        }
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for task in tasks {
            let _ = task.await;
        }
        if let Some(groups) = &self.groups {
            groups.clear();
        }
    }
}

/// Ends the process groups a previous run recorded in `record` that still run (see
/// [`McpHub::start_recorded`]) and removes the file: for a team that no longer has MCP servers.
pub fn end_recorded(record: &std::path::Path) {
    if !record.exists() {
        return;
    }
    let (_, ended) = group::GroupRecord::take_over(record);
    for (server, pgid) in ended {
        tracing::warn!(
            server = %server,
            pgid,
            "ended MCP server `{server}` (process group {pgid}) left running by a previous warden \
             that did not stop cleanly"
        );
    }
    let _ = std::fs::remove_file(record);
}

/// Starts every server (all at once), each on its own: the hub of those that started, and per
/// server its tools or why it did not start (`warden config check`, which then checks the agents'
/// `tools` against the same hub: each server is started once).
pub async fn start_each(
    configs: &BTreeMap<String, McpServerConfig>,
    env: EnvLookup,
) -> (McpHub, Vec<(String, Result<Vec<ListedTool>, McpError>)>) {
    let starts = configs.iter().map(|(name, config)| {
        let one = BTreeMap::from([(name.clone(), config.clone())]);
        let env = env.clone();
        async move { (name.clone(), McpHub::start(&one, env).await) }
    });
    let mut hub = McpHub::default();
    let mut listed = Vec::new();
    for (name, started) in futures::future::join_all(starts).await {
        match started {
            Ok(mut one) => {
                listed.push((name.clone(), Ok(one.listed(&name))));
                hub.servers.append(&mut one.servers);
                hub.tasks.get_mut().append(one.tasks.get_mut());
            }
            Err(e) => listed.push((name, Err(e))),
        }
    }
    (hub, listed)
}

/// Starts one server, lists its tools and ends it.
pub async fn probe(
    name: &str,
    config: &McpServerConfig,
    env: EnvLookup,
) -> Result<Vec<ListedTool>, McpError> {
    let mut one = BTreeMap::new();
    one.insert(name.to_owned(), config.clone());
    let hub = McpHub::start(&one, env).await?;
    let listed = hub.listed(name);
    hub.shutdown().await;
    Ok(listed)
}
