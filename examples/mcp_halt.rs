//! How fast a halt ends an in-flight MCP call, and whether the server hears of it: an agent calls
//! the reference server's `trigger-long-running-operation` (30 s, a progress notification each
//! second) through a recording proxy (`tests/mcp/recording_proxy.py`); once the first progress is
//! journaled the agent is halted. Prints, per round and as p50/max: the halt's acknowledgement and
//! the arrival of `notifications/cancelled` at the server's stdin (sent when the call's future is
//! dropped, so the call has ended by then).
//!
//! ```sh
//! npm install --prefix ~/.cache/warden-npm @modelcontextprotocol/server-everything
//! cargo run --release --example mcp_halt -- 10      # rounds (default 10)
//! ```
use serde_json::json;
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};
use warden::{AgentSpec, HaltCause, MemoryJournal, ScriptStep, ScriptedProvider, Supervisor};
use warden_actors::tools::mcp::McpHub;
use warden_protocols::{EventKind, McpServerConfig, UserEvent, WardenConfig};

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn summary(name: &str, mut values: Vec<f64>) {
    values.sort_by(f64::total_cmp);
    let p50 = values[values.len() / 2];
    let max = values[values.len() - 1];
    println!(
        "{name:<40} p50 {p50:>7.1} ms   max {max:>7.1} ms   (n = {})",
        values.len()
    );
}

#[actix_rt::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(10);
    let home = std::env::var("HOME")?;
    let js = std::env::var("WARDEN_MCP_EVERYTHING").unwrap_or_else(|_| {
        format!("{home}/.cache/warden-npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    });
    let log = std::env::temp_dir().join(format!("warden-mcp-halt-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let proxy = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/recording_proxy.py");
    let mut config = McpServerConfig::stdio(
        "python3",
        [
            proxy.to_owned(),
            log.display().to_string(),
            "node".into(),
            js,
        ],
    );
    config.timeout_seconds = Some(120.0);
    let servers = BTreeMap::from([("everything".to_owned(), config)]);
    let hub = McpHub::start(&servers, Arc::new(|_: &str| None)).await?;
    let journal = Arc::new(MemoryJournal::new());
    let team = Supervisor::new(WardenConfig::default(), journal.clone());
    let (mut acks, mut cancels) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let key = format!("a{round}");
        let dyn_journal: Arc<dyn warden::Journal> = journal.clone();
        let provider = ScriptedProvider::new([
            ScriptStep::call(
                "everything__trigger-long-running-operation",
                json!({"duration": 30, "steps": 30}),
            ),
            ScriptStep::reply("done"),
        ]);
        let mut spec = AgentSpec::assistant(key.as_str(), Arc::new(provider));
        for tool in hub.tools_for(
            &key.as_str().into(),
            &["everything.trigger-long-running-operation".to_owned()],
            &dyn_journal,
        )? {
            spec = spec.with_tool_arc(tool);
        }
        let agent = team.spawn(spec)?;
        agent.send_event(UserEvent::new("go")).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !journal
            .events_of(&key)
            .iter()
            .any(|e| matches!(e.kind, EventKind::ToolProgress { .. }))
        {
            if Instant::now() > deadline {
                return Err("no progress from the server".into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let cancels_before = std::fs::read_to_string(&log)?
            .matches("notifications/cancelled")
            .count();
        let halted = Instant::now();
        team.halt(
            &key,
            HaltCause::Operator {
                operator: "bench".into(),
            },
        )
        .await
        .map_err(|e| format!("{e:?}"))?;
        acks.push(millis(halted.elapsed()));
        let cancelled = loop {
            if std::fs::read_to_string(&log)?
                .matches("notifications/cancelled")
                .count()
                > cancels_before
            {
                break millis(halted.elapsed());
            }
            if halted.elapsed() > Duration::from_secs(10) {
                return Err(
                    format!("round {round}: the server got no notifications/cancelled").into(),
                );
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        println!(
            "round {round}: halt acknowledged {:.1} ms, server got notifications/cancelled {cancelled:.1} ms",
            acks[round]
        );
        cancels.push(cancelled);
    }
    summary("halt acknowledged", acks);
    summary("notifications/cancelled at the server", cancels);
    team.shutdown().await;
    hub.shutdown().await;
    let _ = std::fs::remove_file(&log);
    Ok(())
}
