//! `warden serve`: a team file, the SQLite journal and the API put together — [`serve_team`] — and
//! the team it runs by default ([`DEFAULT_TEAM`]).

use super::{
    api::{check_listen, listen_on, ApiConfig, ApiState},
    events::EventHub,
};
use crate::journal::SqliteJournal;
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

/// `warden serve`: opens the journal at `db` (taking its lock and checking its integrity: see
/// [`SqliteJournal::open`]), recovers every agent recorded there
/// ([`crate::journal::SqliteJournal::recover_records`]), spawns the team (restored agents keep their
/// state, lockout and history) and serves the API on `addr` until stopped. Every event is also
/// published to the event stream (`GET /api/events`), which replays missed events from the journal.
pub async fn serve_team(
    file: crate::team::TeamFile,
    db: &std::path::Path,
    addr: SocketAddr,
    config: ApiConfig,
) -> Result<(), Box<dyn std::error::Error>> {
    check_listen(addr, &config)?;
    // The socket first: a port in use fails before the journal is opened (or created).
    let listener =
        std::net::TcpListener::bind(addr).map_err(|e| super::api::ServeError::Bind(addr, e))?;
    let empty = std::fs::metadata(db).is_ok_and(|m| m.len() == 0);
    // Takes the journal's lock (a second server is refused before it touches the file) and checks
    // the file's integrity.
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
    let unknown = agents_not_in_team(&file, &records);
    if !unknown.is_empty() {
        eprintln!(
            "warden: warning: journal {} holds agents the team file does not define: {} (they are \
             not started; their events stay in the journal)",
            db.display(),
            unknown.join(", ")
        );
    }
    let hub = EventHub::default().with_log(journal.clone());
    let bus = Arc::new(ChannelInterventionBus::new());
    let supervisor =
        Supervisor::builder(file.config.clone(), Arc::new(hub.journal(journal.clone())))
            .intervention_bus(Arc::new(hub.intervention_bus(bus.clone())))
            .build();
    let mcp = file.start_mcp().await?;
    file.spawn_agents_with_mcp(&supervisor, &records, mcp.as_ref())?;
    let notice = token_notice(&config);
    let state = ApiState::new(supervisor.clone(), config)
        .with_bus(bus)
        .with_events(hub.clone())
        .with_journal(journal.clone());
    let (server, addrs) = listen_on(state, listener)?;
    // actix-web stops gracefully on SIGTERM/SIGINT, waiting for open responses; an event stream
    // never ends by itself, so end them all on the same signals.
    actix_rt::spawn(close_streams_on_signal(hub.clone()));
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
    server.await?;
    supervisor.shutdown().await;
    if let Some(mcp) = mcp {
        mcp.shutdown().await;
    }
    journal.close();
    Ok(())
}

/// What `warden serve` says at start when a token is missing: without any, only `GET /healthz` is
/// reachable; without the admin token, nothing can be changed.
pub fn token_notice(config: &ApiConfig) -> Option<&'static str> {
    match (&config.admin_token, &config.read_token) {
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

/// Closes `hub` (ending every event stream) on the first SIGTERM or SIGINT.
async fn close_streams_on_signal(hub: EventHub) {
    #[cfg(unix)]
    {
        use actix_rt::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot listen for SIGTERM/SIGINT: event streams will not be closed");
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        if actix_rt::signal::ctrl_c().await.is_err() {
            return;
        }
    }
    hub.close();
}
