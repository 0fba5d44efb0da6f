//! The one status table `warden demo`, `warden run` and `warden status` print.

use std::io::{self, Write};
use warden_protocols::AgentStatus;

/// The table's columns: the agent, its role and state (the documented names: `sub_agent`,
/// `WAITING_FOR_EVENT`), whether it is paused and emergency-stopped (`yes`/`no`), its consecutive
/// errors against the breaker's limit, its running delegations against their budget, its queued
/// ordinary messages, the messages halts discarded, its turns and its tokens.
pub const HEADER: [&str; 11] = [
    "AGENT",
    "ROLE",
    "STATE",
    "PAUSED",
    "E-STOP",
    "ERRORS",
    "SUBS",
    "QUEUED",
    "DISCARDED",
    "TURNS",
    "TOKENS",
];

/// Columns from this one on are numbers, aligned right (one more with the NODE column).
const FIRST_NUMBER: usize = 5;

fn yes_no(flag: bool) -> String {
    if flag { "yes" } else { "no" }.to_owned()
}

/// Statuses as a table (a header, then one agent a line), then one line per lockout or breaker
/// stop saying which breaker and why (`b: locked out by consecutive_errors: …`). Statuses from a
/// cluster node (with `node`) get a `NODE` column after `AGENT`.
pub fn status_table(statuses: &[AgentStatus]) -> String {
    let nodes = statuses.iter().any(|s| s.node.is_some());
    let with_node = |mut cells: Vec<String>, node: &str| {
        if nodes {
            cells.insert(1, node.to_owned());
        }
        cells
    };
    let header = with_node(HEADER.map(str::to_owned).to_vec(), "NODE");
    let first_number = FIRST_NUMBER + usize::from(nodes);
    let rows: Vec<Vec<String>> = statuses
        .iter()
        .map(|s| {
            let cells = vec![
                s.key.to_string(),
                s.role.to_string(),
                s.state.to_string(),
                yes_no(s.paused),
                yes_no(s.emergency_stop),
                format!("{}/{}", s.consecutive_errors, s.max_consecutive_errors),
                format!("{}/{}", s.active_sub_agents, s.sub_agent_budget),
                s.queued.ordinary.to_string(),
                s.discarded_by_halt.to_string(),
                s.turns.to_string(),
                s.tokens_used.to_string(),
            ];
            with_node(cells, s.node.as_deref().unwrap_or("-"))
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| {
                if i >= first_number {
                    format!("{cell:>w$}")
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        text.push_str(padded.join("  ").trim_end());
        text.push('\n');
    };
    line(&header);
    for row in &rows {
        line(row);
    }
    for s in statuses {
        if let Some(lockout) = &s.lockout {
            text.push_str(&format!(
                "{}: locked out by {}: {}\n",
                s.key, lockout.breaker, lockout.reason
            ));
        }
        if let Some(stop) = &s.stopped_by {
            text.push_str(&format!(
                "{}: stopped by {}: {}\n",
                s.key, stop.breaker, stop.reason
            ));
        }
    }
    text
}

/// Writes [`status_table`] to `out`.
///
/// # Errors
///
/// The error of writing to `out`.
pub fn write_status_table(out: &mut dyn Write, statuses: &[AgentStatus]) -> io::Result<()> {
    out.write_all(status_table(statuses).as_bytes())
}
