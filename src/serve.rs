//! `warden serve`: a team file, the SQLite journal, the cluster when the file has one and the API
//! put together — [`serve_team`] — and the team it runs by default ([`DEFAULT_TEAM`]). The one
//! place that knows all of them (the server itself does not know the cluster's implementation:
//! [`crate::server::cluster::ClusterNode`]).

use crate::journal::SqliteJournal;
use crate::server::{
    api::{check_listen, listen_on, ApiConfig, ApiState},
    events::EventHub,
};
use std::{net::SocketAddr, sync::Arc};
use warden_actors::{ChannelInterventionBus, Supervisor};

/// The team `warden serve` runs when no `--config` is given: the demo's team on the scripted model —
/// the `concierge` delegates every event to the `researcher` and the `scribe`, then answers.
pub const DEFAULT_TEAM: &str = r#"
[providers.concierge]
kind = "scripted"
cycle = true
replies = [
  { tool = "delegate", args = { agent = "researcher", task = "Find out what was asked." } },
  { tool = "delegate", args = { agent = "scribe", task = "Note the answer." } },
  "Done: the researcher looked it up and the scribe noted it.",
]

[providers.researcher]
kind = "scripted"
replies = ["Found it: the library opens at nine."]

[providers.scribe]
kind = "scripted"
replies = ["Noted."]

[[agents]]
key = "concierge"
provider = "concierge"
system_prompt = "You are a helpful concierge."

[[agents]]
key = "researcher"
role = "sub_agent"
parent = "concierge"
provider = "researcher"
delegate = false

[[agents]]
key = "scribe"
role = "sub_agent"
parent = "concierge"
provider = "scribe"
delegate = false
"#;

/// Why `warden serve` ([`serve_team`]) or `warden mcp` ([`serve_stdio`]) did not start, or stopped
/// with an error. Each variant is the error of one start-up step, shown as that error (its
/// `source()` chain is the step's own).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The API's address: refused without an admin token, not bindable, or the HTTP server could
    /// not start or failed while it ran.
    #[error(transparent)]
    Listen(#[from] crate::server::api::ServeError),
    /// The journal could not be opened (in use by another server, damaged, a newer schema, …) or
    /// recovered.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// A provider could not be built (an unset API key variable), an MCP server of the team file
    /// could not start, or an agent could not be spawned.
    #[error(transparent)]
    Team(#[from] crate::team::TeamError),
    /// The team file's `[cluster]` could not be joined.
    #[error(transparent)]
    Cluster(#[from] crate::team::ClusterError),
    /// The team file's `[a2a_agents]` could not be reached.
    #[error(transparent)]
    A2a(#[from] crate::a2a_client::A2aClientError),
    /// `warden mcp`: the MCP handshake or service on standard input/output failed.
    #[cfg(feature = "mcp-server")]
    #[error(transparent)]
    Mcp(crate::server::mcp::McpServeError),
}

/// `warden serve`: opens the journal at `db` (taking its lock and checking its integrity: see
/// [`SqliteJournal::open`]), recovers every agent recorded there
/// ([`crate::journal::SqliteJournal::recover_records`]), spawns the team (restored agents keep their
/// state, lockout and history) and serves the API on `addr` until stopped. Every event is also
/// published to the event stream (`GET /api/events`), which replays missed events from the journal.
///
/// Must run inside an actix `System` (`actix_rt::System::new().block_on(…)` or
/// `#[actix_rt::main]`).
/// The socket is bound before the journal is opened, so a port in use leaves the journal
/// untouched. On SIGTERM or SIGINT the server stops gracefully (open event streams are ended),
/// then the agents are shut down and the journal is closed; the future then resolves `Ok(())`.
///
/// # Errors
///
/// Before anything is served, [`ServeError`]:
/// * [`ServeError::Listen`] with
///   [`NoTokenOnPublicAddress`](crate::server::api::ServeError::NoTokenOnPublicAddress) —
///   `addr` is not loopback and `config` has no admin token (nothing is bound or opened), or
///   [`Bind`](crate::server::api::ServeError::Bind) — `addr` cannot be bound;
/// * [`ServeError::Journal`] — the journal cannot be opened (in use by another server, damaged,
///   a newer schema, …) or recovered;
/// * [`ServeError::Team`] — a provider cannot be built (an unset API key variable), an MCP server
///   cannot start, or an agent cannot be spawned;
/// * [`ServeError::Cluster`], [`ServeError::A2a`] — `[cluster]` cannot be joined, `[a2a_agents]`
///   cannot be reached;
/// * [`ServeError::Listen`] with [`Io`](crate::server::api::ServeError::Io) — the HTTP server
///   cannot start.
///
/// Later, [`ServeError::Listen`] with [`Io`](crate::server::api::ServeError::Io) if the HTTP
/// server fails while it runs.
///
/// # Cancel safety
///
/// Dropping the future while it serves stops the HTTP server at once (no grace: requests in
/// flight and event streams are cut). Nothing acknowledged is lost: every `202` and every halt
/// acknowledgement was durable before it was sent. The agents are not shut down: they keep
/// running on their arbiter threads, and keep the journal (and its lock) open, until the process
/// ends; a turn cut there is ended by the next start's recovery (see
/// [`SqliteJournal::recover_records`](crate::journal::SqliteJournal::recover_records)). To stop
/// cleanly, send SIGTERM or SIGINT and let the future resolve.
///
/// # Examples
///
/// Serving the default team on a free loopback port, asking `GET /healthz` (no token needed),
/// then stopping by dropping the future:
///
/// ```
/// use std::{io::{Read, Write}, time::Duration};
/// use warden::{server::api::ApiConfig, serve::{serve_team, DEFAULT_TEAM}, team::TeamFile};
///
/// let db = std::env::temp_dir().join(format!("warden-doc-serve-{}.db", std::process::id()));
/// # let clean = |db: &std::path::Path| {
/// #     for end in ["", "-wal", "-shm", ".lock"] {
/// #         let _ = std::fs::remove_file(format!("{}{end}", db.display()));
/// #     }
/// # };
/// # clean(&db);
/// let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?; // a free port
/// let file = TeamFile::from_toml(DEFAULT_TEAM)?;
/// let config = ApiConfig { admin_token: Some("s3cret".into()), ..ApiConfig::default() };
/// let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
///
/// actix_rt::System::new().block_on(async {
///     let server = actix_rt::spawn({
///         let db = db.clone();
///         async move { serve_team(file, &db, addr, config).await.map_err(|e| e.to_string()) }
///     });
///     // A blocking client on another thread: this one runs `serve_team`.
///     let answer = actix_rt::task::spawn_blocking(move || {
///         for _ in 0..200 {
///             if let Ok(mut conn) = std::net::TcpStream::connect(addr) {
///                 conn.write_all(request)?;
///                 let mut text = String::new();
///                 conn.read_to_string(&mut text)?;
///                 return Ok(text);
///             }
///             std::thread::sleep(Duration::from_millis(50));
///         }
///         Err(std::io::Error::other("the server never listened"))
///     })
///     .await
///     .unwrap()?;
///     assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
///     server.abort(); // drops `serve_team`'s future: the HTTP server stops
///     let _ = server.await;
///     Ok::<(), std::io::Error>(())
/// })?;
/// # clean(&db);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Refused before anything is touched:
///
/// ```
/// use warden::serve::{serve_team, ServeError, DEFAULT_TEAM};
/// use warden::server::api::{self, ApiConfig};
///
/// let file = warden::team::TeamFile::from_toml(DEFAULT_TEAM)?;
/// let public = "0.0.0.0:7878".parse()?;
/// let db = std::path::Path::new("never-created.db");
/// let err = actix_rt::System::new()
///     .block_on(serve_team(file, db, public, ApiConfig::default()))
///     .unwrap_err();
/// assert!(matches!(
///     err,
///     ServeError::Listen(api::ServeError::NoTokenOnPublicAddress(_))
/// ));
/// assert!(!db.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn serve_team(
    file: crate::team::TeamFile,
    db: &std::path::Path,
    addr: SocketAddr,
    config: ApiConfig,
) -> Result<(), ServeError> {
    check_listen(addr, &config)?;
    // The socket first: a port in use fails before the journal is opened (or created).
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| crate::server::api::ServeError::Bind(addr, e))?;
    let (journal, records) = open_journal(&file, db)?;
    let hub = EventHub::default().with_log(journal.clone());
    let bus = Arc::new(ChannelInterventionBus::new());
    let supervisor =
        Supervisor::builder(file.config.clone(), Arc::new(hub.journal(journal.clone())))
            .intervention_bus(Arc::new(hub.intervention_bus(bus.clone())))
            .build();
    // `[cluster]`: only the agents whose lease this node holds are started; a halted cluster
    // halts them before anything is served (docs/cluster.md).
    #[cfg(feature = "cluster")]
    let (file, whole, cluster) = {
        let mut file = file;
        let whole = file.clone();
        let cluster = crate::cluster::join_for(&mut file, &supervisor).await?;
        (file, whole, cluster)
    };
    #[cfg(not(feature = "cluster"))]
    refuse_cluster(&file)?;
    let mcp = spawn_team(&file, db, &supervisor, &records).await?;
    #[cfg(feature = "cluster")]
    if let Some(cluster) = &cluster {
        // The agents another node owns now: adopted if that node's lease on them goes.
        cluster.keep_for_adoption(&whole, &records, mcp.clone());
        cluster.run().await;
    }
    let notice = token_notice(&config);
    let state = ApiState::new(supervisor.clone(), config)
        .with_bus(bus)
        .with_events(hub.clone())
        .with_journal(journal.clone());
    #[cfg(feature = "cluster")]
    let state = match cluster.clone() {
        Some(cluster) => state.with_cluster(cluster),
        None => state,
    };
    let (server, addrs) = listen_on(state, listener)?;
    // On SIGTERM/SIGINT: every event stream ended (one never ends by itself), then the server
    // stopped — gracefully on SIGTERM, waiting for open responses — and only then the team, below.
    // Not actix's own signal handling: it stops the whole actix System, whose arbiters are the
    // agents' — each agent's actor dropped while the team still ran, taken for a crash (journaled
    // `crashed`, `restarted`, an error counted for a turn in flight).
    actix_rt::spawn(stop_on_signal(hub.clone(), server.handle()));
    let shown: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    eprintln!(
        "warden: serving {} agents on {} (journal {}, {} restored)",
        supervisor.len(),
        shown.join(", "),
        db.display(),
        records.len()
    );
    if let Some(notice) = notice {
        eprintln!("{notice}");
    }
    server.await.map_err(crate::server::api::ServeError::Io)?;
    // A clean stop: the agents first (each actor told to stop: nothing is a crash, a turn in
    // flight counts no error and its event stays pending for the next start), then the cluster
    // leases released (no other node adopts an agent still running here).
    supervisor.shutdown().await;
    #[cfg(feature = "cluster")]
    if let Some(cluster) = cluster {
        cluster.leave().await;
    }
    if let Some(mcp) = mcp {
        mcp.shutdown().await;
    }
    journal.close();
    Ok(())
}

/// What `warden serve` says at start when a token is missing: without any, only `GET /healthz` is
/// reachable; without the admin token, nothing can be changed.
pub(super) fn token_notice(config: &ApiConfig) -> Option<&'static str> {
    match (&config.admin_token, &config.read_token) {
        (None, None) if !config.host_tokens.is_empty() => Some(
            "warden: no admin token configured: only the host tokens' routes (world events, \
             replies, presence, clock, halts) and GET /healthz are reachable. To unlock, resume \
             or read statuses, set WARDEN_ADMIN_TOKEN, or api.admin_token in the team file's \
             [api] section",
        ),
        (None, None) => Some(
            "warden: no token configured: only GET /healthz is reachable. To use the API and the \
             CLI, set WARDEN_ADMIN_TOKEN (and optionally WARDEN_READ_TOKEN) in the environment, or \
             api.admin_token in the team file's [api] section",
        ),
        (None, Some(_)) => Some(
            "warden: no admin token configured: the API is read-only (GETs with the read token). \
             To halt, unlock or send events, set WARDEN_ADMIN_TOKEN, or api.admin_token in the team \
             file's [api] section",
        ),
        _ => None,
    }
}

/// The journal `warden serve` and `warden mcp` open: its lock taken (a second server is refused
/// before it touches the file) and its integrity checked, then every agent recorded there
/// recovered. Says so on standard error when the file was empty, and warns of recorded agents the
/// team file does not define.
fn open_journal(
    file: &crate::team::TeamFile,
    db: &std::path::Path,
) -> Result<(Arc<SqliteJournal>, Vec<warden_protocols::AgentRecord>), ServeError> {
    let empty = std::fs::metadata(db).is_ok_and(|m| m.len() == 0);
    let journal = Arc::new(SqliteJournal::open_with(
        db,
        crate::journal::JournalOptions::from(&file.config.journal),
    )?);
    if empty {
        eprintln!(
            "warden: journal {} was an empty file (0 bytes): starting a fresh journal",
            db.display()
        );
    }
    let records = journal.recover_records()?;
    let unknown = agents_not_in_team(file, &records);
    if !unknown.is_empty() {
        eprintln!(
            "warden: warning: journal {} holds agents the team file does not define: {} (they are \
             not started; their events stay in the journal)",
            db.display(),
            unknown.join(", ")
        );
    }
    Ok((journal, records))
}

/// The team's start on `supervisor`, shared by `warden serve` and `warden mcp`: the MCP servers
/// (their process groups recorded next to the journal: a killed warden's are ended here), the
/// `[a2a_agents]` (set before the agents are spawned: the `delegate` tool lists them), the agents
/// (restored from `records`), then the remote A2A tasks a crash left outstanding settled in the
/// background (canceled, or read if they ended; never sent again: docs/a2a.md, "After a crash").
async fn spawn_team(
    file: &crate::team::TeamFile,
    db: &std::path::Path,
    supervisor: &Supervisor,
    records: &[warden_protocols::AgentRecord],
) -> Result<Option<Arc<warden_actors::tools::mcp::McpHub>>, ServeError> {
    let mut groups = db.as_os_str().to_owned();
    groups.push(".mcp-groups");
    let mcp = file
        .start_mcp_recorded(std::path::Path::new(&groups))
        .await?
        .map(Arc::new);
    let outstanding: Vec<_> = records
        .iter()
        .flat_map(|r| r.a2a_tasks().iter().map(|t| (r.key.clone(), t.clone())))
        .collect();
    if !file.a2a_agents.is_empty() {
        let clients = crate::a2a_client::A2aClients::connect(&file.a2a_agents).await?;
        supervisor.set_a2a_peers(Arc::new(clients));
    }
    file.spawn_agents_with_mcp(supervisor, records, mcp.as_deref())?;
    if !outstanding.is_empty() {
        let supervisor = supervisor.clone();
        actix_rt::spawn(async move {
            let settled = supervisor.settle_a2a_tasks(outstanding).await;
            if settled > 0 {
                eprintln!(
                    "warden: settled {settled} remote A2A task(s) a previous run left outstanding"
                );
            }
        });
    }
    Ok(mcp)
}

/// The keys of agents recorded in the journal that the team file does not define, sorted.
fn agents_not_in_team(
    file: &crate::team::TeamFile,
    records: &[warden_protocols::AgentRecord],
) -> Vec<String> {
    let mut unknown: Vec<String> = records
        .iter()
        .map(|r| r.key.to_string())
        .filter(|key| !file.agents.iter().any(|a| a.key == *key))
        .collect();
    unknown.sort();
    unknown.dedup();
    unknown
}

/// On the first SIGTERM or SIGINT: closes `hub` (ending every event stream) and stops `server`
/// (gracefully on SIGTERM), without stopping the actix System.
async fn stop_on_signal(hub: EventHub, server: actix_web::dev::ServerHandle) {
    #[cfg(unix)]
    {
        use actix_rt::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot listen for SIGTERM/SIGINT: stop warden serve with SIGKILL");
            return;
        };
        let graceful = tokio::select! {
            _ = term.recv() => true,
            _ = int.recv() => false,
        };
        hub.close();
        server.stop(graceful).await;
    }
    #[cfg(not(unix))]
    {
        if actix_rt::signal::ctrl_c().await.is_err() {
            return;
        }
        hub.close();
        server.stop(true).await;
    }
}

/// `warden mcp`: opens the journal at `db` (as `warden serve` does: its lock, its integrity check,
/// every agent recorded there restored), spawns the team and serves it as an MCP server over
/// standard input and output until the client closes standard input; then the agents are shut
/// down and the journal closed. Nothing but the protocol is written to standard output.
///
/// Must run inside an actix `System`.
///
/// # Errors
///
/// [`ServeError::Cluster`] for a team file with `[cluster]` (`warden mcp` joins no cluster),
/// [`ServeError::Journal`] when the journal cannot be opened or recovered, [`ServeError::Team`]
/// when the team cannot be spawned, [`ServeError::A2a`] when `[a2a_agents]` cannot be reached,
/// [`ServeError::Mcp`] when the handshake or the service fails.
#[cfg(feature = "mcp-server")]
pub async fn serve_stdio(
    file: crate::team::TeamFile,
    db: &std::path::Path,
    access: crate::server::mcp::McpAccess,
) -> Result<(), ServeError> {
    // The team is started as `serve_team` starts it (the same two steps), without the HTTP pieces:
    // no event stream, no intervention bus (an ask is refused on its own), and no cluster — an
    // agent runs on the node that holds its lease, and `warden mcp` holds none.
    if let Some(config) = file.cluster.resolve()? {
        return Err(ServeError::Cluster(crate::team::ClusterError::Invalid {
            key: "cluster",
            value: format!("node {} at {}", config.node, config.shown_url()),
            allowed: "no [cluster] section for warden mcp (it joins no cluster): serve the team \
                      with warden serve and use its /mcp",
        }));
    }
    let (journal, records) = open_journal(&file, db)?;
    let supervisor = Supervisor::builder(file.config.clone(), journal.clone()).build();
    let mcp = spawn_team(&file, db, &supervisor, &records).await?;
    eprintln!(
        "warden: serving {} agents over MCP on standard input/output (journal {}, {} restored{})",
        supervisor.len(),
        db.display(),
        records.len(),
        if access == crate::server::mcp::McpAccess::Read {
            ", read-only"
        } else {
            ""
        }
    );
    let fates: Arc<dyn crate::journal::EventFates> = journal.clone();
    let handler = crate::server::mcp::WardenMcp::new(
        supervisor.clone(),
        Some(fates),
        access,
        crate::server::mcp::MCP_STDIO_OPERATOR,
    );
    let result = crate::server::mcp::serve_on_stdio(handler).await;
    supervisor.shutdown().await;
    if let Some(mcp) = mcp {
        mcp.shutdown().await;
    }
    journal.close();
    result.map_err(ServeError::Mcp)
}

/// Without the `cluster` feature: a team file whose `[cluster]` is set (a URL and a node name) is
/// refused, not served as a single node.
#[cfg(not(feature = "cluster"))]
fn refuse_cluster(file: &crate::team::TeamFile) -> Result<(), crate::team::ClusterError> {
    match file.cluster.resolve()? {
        None => Ok(()),
        Some(config) => Err(crate::team::ClusterError::Invalid {
            key: "cluster",
            value: format!("node {} at {}", config.node, config.shown_url()),
            allowed: "no [cluster] section: this warden was built without the `cluster` feature",
        }),
    }
}
