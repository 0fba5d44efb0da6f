//! One MCP server's connection: starting it (a stdio child or a streamable-HTTP session), the
//! handshake, `tools/list`, restarts with backoff, `list_changed`, progress routing, shutdown.

use super::{
    capped::CappedLines,
    definition::ToolDef,
    group::{kill_group, set_parent_death_signal, GroupRecord},
    McpError,
};
use crate::journal::Journal;
use parking_lot::{Mutex, RwLock};
use rmcp::{
    model::{ClientConfig, ProgressNotificationParam, ProgressToken},
    service::{NotificationContext, RunningService},
    ClientHandler, Peer, RoleClient, ServiceExt,
};
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};
use tokio::{io::AsyncBufReadExt, sync::Notify};
use tokio_util::sync::CancellationToken;
use warden_protocols::{AgentKey, EventKind, McpServerConfig};

/// Backoff before the first restart of a server that went away; doubles up to [`BACKOFF_MAX`].
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A server that stayed up this long restarts with the base backoff again.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// Lines of a child's stderr kept for error messages.
const STDERR_LINES: usize = 20;

/// Where a progress notification goes: the agent and call it belongs to.
#[derive(Debug, Clone)]
pub(crate) struct ProgressRoute {
    pub(crate) agent: AgentKey,
    pub(crate) call_id: String,
    pub(crate) tool: String,
}

/// The state of one server shared by its connection task, its handler and its tools.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) config: McpServerConfig,
    /// The connected peer; `None` while down.
    peer: RwLock<Option<Peer<RoleClient>>>,
    /// Why the server is down (for the error of a call made meanwhile).
    down: RwLock<String>,
    /// The tools as accepted at start (and changes accepted since), by the server's tool name.
    pub(crate) defs: RwLock<BTreeMap<String, ToolDef>>,
    /// Tools the server offers that warden refused at start, with why.
    pub(crate) refused: RwLock<BTreeMap<String, String>>,
    /// Which agents hold which tool (server tool name → agents), for journaling changes.
    pub(crate) holders: Mutex<BTreeMap<String, Vec<AgentKey>>>,
    pub(crate) progress: Mutex<HashMap<ProgressToken, ProgressRoute>>,
    pub(crate) journal: RwLock<Option<Arc<dyn Journal>>>,
    stderr: Mutex<VecDeque<String>>,
    list_changed: Notify,
    pub(crate) shutdown: CancellationToken,
    /// Resolves the environment variables named in the config (`bearer_env`, `headers_env`).
    env: super::EnvLookup,
    /// Where a stdio child's process group is recorded (`warden serve`: next to the journal).
    pub(crate) groups: Option<Arc<GroupRecord>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("connected", &self.peer.read().is_some())
            .finish_non_exhaustive()
    }
}

/// The client side handler: routes progress and `tools/list_changed`.
#[derive(Clone)]
pub(crate) struct Handler {
    shared: Arc<Shared>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.shared.progressed(params);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.shared.list_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

/// A running connection: the service, and the child if it is a stdio server.
pub(crate) struct Connection {
    service: RunningService<RoleClient, Handler>,
    child: Option<tokio::process::Child>,
}

impl Shared {
    pub(crate) fn new(
        name: String,
        config: McpServerConfig,
        env: super::EnvLookup,
        groups: Option<Arc<GroupRecord>>,
    ) -> Arc<Self> {
        Arc::new(Shared {
            name,
            config,
            peer: RwLock::new(None),
            down: RwLock::new("not started".to_owned()),
            defs: RwLock::new(BTreeMap::new()),
            refused: RwLock::new(BTreeMap::new()),
            holders: Mutex::new(BTreeMap::new()),
            progress: Mutex::new(HashMap::new()),
            journal: RwLock::new(None),
            stderr: Mutex::new(VecDeque::new()),
            list_changed: Notify::new(),
            shutdown: CancellationToken::new(),
            env,
            groups,
        })
    }

    /// The connected peer, or why there is none.
    pub(crate) fn peer(&self) -> Result<Peer<RoleClient>, String> {
        match &*self.peer.read() {
            Some(peer) if !peer.is_transport_closed() => Ok(peer.clone()),
            Some(_) => Err("its connection closed; it is being restarted".to_owned()),
            None => Err(self.down.read().clone()),
        }
    }

    fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn startup_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.config.startup_timeout_seconds)
    }

    fn progressed(&self, params: ProgressNotificationParam) {
        let Some(route) = self.progress.lock().get(&params.progress_token).cloned() else {
            return;
        };
        let Some(journal) = self.journal.read().clone() else {
            return;
        };
        let message = params
            .message
            .map(|m| super::definition::truncate_chars(&m, 500));
        journal.append(
            &route.agent,
            EventKind::ToolProgress {
                call_id: route.call_id,
                tool: route.tool,
                progress: params.progress,
                total: params.total,
                message,
            },
        );
    }

    /// Starts the server once: spawn or connect, handshake. Errors say exactly why not.
    pub(crate) async fn connect(self: &Arc<Self>) -> Result<Connection, McpError> {
        let handler = Handler {
            shared: self.clone(),
        };
        let timeout = self.startup_timeout();
        let (service, child) = match (&self.config.command, &self.config.url) {
            (Some(command), _) => {
                let mut child = self.spawn(command)?;
                let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                    return Err(McpError::Spawn {
                        server: self.name.clone(),
                        detail: "the child's stdio could not be opened".into(),
                    });
                };
                if let Some(stderr) = child.stderr.take() {
                    tokio::spawn(read_stderr(self.clone(), stderr));
                }
                // The cap on one line: the result cap plus room for the envelope.
                let cap = self.config.max_result_bytes.saturating_add(64 * 1024);
                let transport = (CappedLines::new(stdout, cap), stdin);
                let served = tokio::time::timeout(timeout, handler.serve(transport)).await;
                let service = self.served(served, &mut Some(&mut child)).await?;
                (service, Some(child))
            }
            (None, Some(url)) => {
                // First: it installs the TLS provider the client needs.
                let config = self.http_config(url)?;
                let client =
                    super::session::SessionAware::new().map_err(|detail| McpError::Config {
                        server: self.name.clone(),
                        detail,
                    })?;
                let transport =
                    rmcp::transport::StreamableHttpClientTransport::with_client(client, config);
                let served = tokio::time::timeout(timeout, handler.serve(transport)).await;
                (self.served(served, &mut None).await?, None)
            }
            (None, None) => {
                return Err(McpError::Config {
                    server: self.name.clone(),
                    detail: "neither `command` nor `url` is set".into(),
                })
            }
        };
        Ok(Connection { service, child })
    }

    /// The outcome of a handshake as a [`McpError`], with the child's stderr.
    async fn served<E: std::error::Error + 'static>(
        &self,
        served: Result<Result<RunningService<RoleClient, Handler>, E>, tokio::time::error::Elapsed>,
        child: &mut Option<&mut tokio::process::Child>,
    ) -> Result<RunningService<RoleClient, Handler>, McpError> {
        let failed = match served {
            Ok(Ok(service)) => return Ok(service),
            Ok(Err(e)) => Err(super::error::in_words(&e)),
            Err(_) => Ok(()),
        };
        if let Some(child) = child.as_mut() {
            kill_group(child);
            let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
        }
        // Let the stderr reader catch up with what the child wrote before it ended.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stderr = self.stderr_tail();
        Err(match failed {
            Err(detail) => McpError::Handshake {
                server: self.name.clone(),
                detail,
                stderr,
            },
            Ok(()) => McpError::TimedOut {
                server: self.name.clone(),
                seconds: self.config.startup_timeout_seconds,
                during: "the handshake",
                stderr,
            },
        })
    }

    fn spawn(&self, command: &str) -> Result<tokio::process::Child, McpError> {
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(&self.config.args)
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        // PATH (not a secret) so that `npx` and `#!/usr/bin/env node` scripts work; `env` may set
        // its own. Nothing else of warden's environment is passed on.
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(&self.config.env);
        #[cfg(unix)]
        cmd.process_group(0); // its own group: a shutdown kills what it started too
        set_parent_death_signal(&mut cmd); // and a SIGKILLed warden takes it along
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound
                || e.kind() == std::io::ErrorKind::PermissionDenied
            {
                McpError::CommandNotFound {
                    server: self.name.clone(),
                    command: command.to_owned(),
                    detail: e.to_string(),
                }
            } else {
                McpError::Spawn {
                    server: self.name.clone(),
                    detail: e.to_string(),
                }
            }
        })?;
        if let (Some(groups), Some(pid)) = (&self.groups, child.id()) {
            groups.spawned(&self.name, pid);
        }
        Ok(child)
    }

    fn http_config(
        &self,
        url: &str,
    ) -> Result<
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
        McpError,
    > {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        // reqwest 0.13 is built without a TLS provider of its own: use rustls' ring, the one the
        // workspace's other HTTP client uses. Installing it twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config_error = |detail: String| McpError::Config {
            server: self.name.clone(),
            detail,
        };
        let env = |var: &str, what: &str| {
            (self.env)(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                config_error(format!("{what}: environment variable `{var}` is not set"))
            })
        };
        let mut headers = HashMap::new();
        let literal = self.config.headers.iter().map(|(k, v)| Ok((k, v.clone())));
        let from_env = self
            .config
            .headers_env
            .iter()
            .map(|(k, var)| env(var, &format!("header `{k}`")).map(|v| (k, v)));
        for pair in literal.chain(from_env) {
            let (name, value) = pair?;
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| config_error(format!("header name `{name}`: {e}")))?;
            // The value is not shown: it may be a secret.
            let mut value = http::HeaderValue::from_str(&value)
                .map_err(|_| config_error(format!("the value of header `{name}` is not valid")))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let cap = self.config.max_result_bytes.saturating_add(64 * 1024);
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
            .custom_headers(headers)
            .max_sse_event_size(cap);
        config.max_json_response_size = cap;
        if let Some(var) = &self.config.bearer_env {
            config = config.auth_header(env(var, "bearer_env")?);
        }
        Ok(config)
    }

    /// `tools/list`, all pages, bounded by the startup timeout.
    pub(crate) async fn list(
        &self,
        peer: &Peer<RoleClient>,
    ) -> Result<Vec<rmcp::model::Tool>, McpError> {
        match tokio::time::timeout(self.startup_timeout(), peer.list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => Err(McpError::List {
                server: self.name.clone(),
                detail: super::error::in_words(&e),
            }),
            Err(_) => Err(McpError::TimedOut {
                server: self.name.clone(),
                seconds: self.config.startup_timeout_seconds,
                during: "listing tools",
                stderr: self.stderr_tail(),
            }),
        }
    }

    /// Marks the server up with `connection`'s peer.
    pub(crate) fn up(&self, connection: &Connection) {
        *self.peer.write() = Some(connection.service.peer().clone());
    }

    fn set_down(&self, why: String) {
        *self.peer.write() = None;
        *self.down.write() = why;
    }

    /// Compares a new `tools/list` with the accepted definitions: journals each change, accepts it
    /// when `allow_changes`, else disables the tool.
    async fn relist(&self, peer: &Peer<RoleClient>) {
        let tools = match self.list(peer).await {
            Ok(tools) => tools,
            Err(e) => {
                tracing::warn!(server = %self.name, "re-listing tools failed: {e}");
                return;
            }
        };
        let mut listed = BTreeMap::new();
        for tool in tools {
            if let Ok(def) = ToolDef::from_listed(&self.name, &self.config, tool) {
                listed.insert(def.remote.clone(), def);
            }
        }
        let mut changes = Vec::new();
        {
            let mut defs = self.defs.write();
            for (remote, def) in defs.iter_mut() {
                match listed.get(remote) {
                    None if def.disabled.is_none() => {
                        def.disabled = Some(
                            "the server no longer offers it (removed or renamed after start)"
                                .to_owned(),
                        );
                        changes.push((remote.clone(), None, false));
                    }
                    Some(new) if new.differs(def) => {
                        let accepted = self.config.allow_changes;
                        if accepted {
                            let model_name = def.model_name.clone();
                            *def = new.clone();
                            def.model_name = model_name;
                        } else {
                            def.disabled = Some(
                                "its description or schema changed after start; refused \
                                 (allow_changes = false)"
                                    .to_owned(),
                            );
                        }
                        changes.push((remote.clone(), Some(new.clone()), accepted));
                    }
                    Some(new) if def.disabled.is_some() && !new.differs(def) => {
                        // Back as it was at start (e.g. after a restart): usable again.
                        def.disabled = None;
                    }
                    _ => {}
                }
            }
        }
        let journal = self.journal.read().clone();
        let holders = self.holders.lock().clone();
        for (remote, new, accepted) in changes {
            tracing::warn!(
                server = %self.name, tool = %remote, accepted,
                "an MCP tool's definition changed after start"
            );
            let (Some(journal), Some(agents)) = (&journal, holders.get(&remote)) else {
                continue;
            };
            let model_name = self
                .defs
                .read()
                .get(&remote)
                .map(|d| d.model_name.clone())
                .unwrap_or_default();
            for agent in agents {
                let kind = match &new {
                    Some(new) => EventKind::ToolDefinitionChanged {
                        tool: model_name.clone(),
                        source: self.name.clone(),
                        description: Some(new.description.clone()),
                        description_sha256: new.description_sha256.clone(),
                        schema_sha256: new.schema_sha256.clone(),
                        accepted,
                        removed: false,
                    },
                    None => EventKind::ToolDefinitionChanged {
                        tool: model_name.clone(),
                        source: self.name.clone(),
                        description: None,
                        description_sha256: String::new(),
                        schema_sha256: String::new(),
                        accepted: false,
                        removed: true,
                    },
                };
                journal.append(agent, kind);
            }
        }
    }

    /// Runs a connected server until shutdown: re-lists on `list_changed`, restarts it with
    /// backoff when it goes away.
    pub(crate) async fn supervise(self: Arc<Self>, mut connection: Connection) {
        let mut backoff = BACKOFF_BASE;
        loop {
            let since = tokio::time::Instant::now();
            self.up(&connection);
            let peer = connection.service.peer().clone();
            let token = connection.service.cancellation_token();
            let waiting = connection.service.waiting();
            tokio::pin!(waiting);
            let mut child = connection.child;
            let why = loop {
                tokio::select! {
                    _ = self.shutdown.cancelled() => {
                        self.set_down("warden is shutting down".into());
                        token.cancel();
                        let _ = tokio::time::timeout(Duration::from_secs(2), &mut waiting).await;
                        if let Some(child) = child.as_mut() {
                            kill_group(child);
                            let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
                        }
                        return;
                    }
                    _ = self.list_changed.notified() => self.relist(&peer).await,
                    quit = &mut waiting => break format!("{quit:?}"),
                }
            };
            let status = match child.as_mut() {
                Some(child) => {
                    kill_group(child);
                    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
                        Ok(Ok(status)) => format!("the process ended ({status})"),
                        _ => "the process was killed".to_owned(),
                    }
                }
                None => "the connection closed".to_owned(),
            };
            tracing::warn!(server = %self.name, "MCP server went away: {status}; {why}");
            if since.elapsed() >= STABLE_AFTER {
                backoff = BACKOFF_BASE;
            }
            connection = loop {
                self.set_down(format!(
                    "{status}; restarting in {} ms",
                    backoff.as_millis()
                ));
                tokio::select! {
                    _ = self.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                match self.connect().await {
                    Ok(c) => break c,
                    Err(e) => {
                        tracing::warn!(server = %self.name, "restart failed: {e}");
                    }
                }
            };
            // Tools may differ after a restart: compare as on `list_changed`.
            let peer = connection.service.peer().clone();
            self.relist(&peer).await;
        }
    }
}

/// Keeps the last lines of a child's stderr (for error messages) and logs them at debug level.
async fn read_stderr(shared: Arc<Shared>, stderr: tokio::process::ChildStderr) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = super::definition::truncate_chars(&line, 400);
        tracing::debug!(server = %shared.name, "stderr: {line}");
        let mut kept = shared.stderr.lock();
        if kept.len() == STDERR_LINES {
            kept.pop_front();
        }
        kept.push_back(line);
    }
}
