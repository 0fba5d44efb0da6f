//! The fail safe: a node cut off from JetStream starts no model call.
//!
//! Every beat (TTL/3, at most a second) the node reads the halt key (and applies it), writes its
//! heartbeat and renews its leases, each bounded by the beat. A beat whose halt read and heartbeat
//! write both succeeded is a *heartbeat*. When none came for longer than
//! `cluster.fail_safe_seconds`, the guard closes the team's model gate (see
//! [`warden_actors::safety::ModelGate`]): no model call starts, calls already running finish. The
//! first heartbeat after that reopens it — after the halt key was read, so a halt that happened
//! meanwhile is applied before any call starts. Entering and leaving are journaled as a
//! `safety_alert` on every local agent, logged, and shown by `GET /api/cluster` and `/metrics`.

use super::Cluster;
use parking_lot::Mutex;
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::time::Instant;
use warden_actors::now_ms;
use warden_protocols::EventKind;

/// The fail-safe's state.
#[derive(Debug)]
pub(super) struct FailSafe {
    last_ok: Mutex<Instant>,
    /// While on: since when (ms since the Unix epoch) and why.
    on: Mutex<Option<(u64, String)>>,
    /// How many times it came on.
    pub(super) entered: AtomicU64,
}

impl FailSafe {
    pub(super) fn new() -> Self {
        FailSafe {
            last_ok: Mutex::new(Instant::now()),
            on: Mutex::new(None),
            entered: AtomicU64::new(0),
        }
    }

    pub(super) fn beat_ok(&self) {
        *self.last_ok.lock() = Instant::now();
    }

    /// How long since the last heartbeat.
    pub(super) fn silence(&self) -> Duration {
        self.last_ok.lock().elapsed()
    }

    /// Why no model call starts, while the fail safe is on.
    pub(super) fn reason(&self) -> Option<String> {
        self.on.lock().as_ref().map(|(_, r)| r.clone())
    }

    /// Since when it is on (ms since the Unix epoch).
    pub(super) fn since_ms(&self) -> Option<u64> {
        self.on.lock().as_ref().map(|(at, _)| *at)
    }
}

impl Cluster {
    /// Why this node starts no model call, while its fail safe is on.
    pub fn fail_safe(&self) -> Option<String> {
        self.fail.reason()
    }

    /// The other nodes whose heartbeat lived at the last beat: the nodes a halt issued here waits
    /// for (a node that joined since is not waited for).
    pub fn peers(&self) -> Vec<String> {
        self.peers.lock().clone()
    }

    /// One beat: the halt key read and applied, the heartbeat written (both: a heartbeat), the
    /// leases renewed.
    async fn beat_once(self: &Arc<Self>) {
        let bound = self.config.beat().max(Duration::from_millis(500));
        let heartbeat = tokio::time::timeout(bound, async {
            self.poll_halt().await?;
            self.write_beat().await
        })
        .await;
        let beat = matches!(heartbeat, Ok(Ok(())));
        match heartbeat {
            Ok(Ok(())) => {
                self.fail.beat_ok();
                if let Ok(Ok(nodes)) = tokio::time::timeout(bound, self.nodes()).await {
                    let mut peers: Vec<String> = nodes
                        .into_iter()
                        .map(|n| n.node)
                        .filter(|n| *n != self.config.node)
                        .collect();
                    peers.sort();
                    *self.peers.lock() = peers;
                }
            }
            Ok(Err(e)) => tracing::debug!("cluster heartbeat failed: {e}"),
            Err(_) => tracing::debug!("cluster heartbeat timed out"),
        }
        let _ = tokio::time::timeout(bound, self.renew()).await;
        let _ = tokio::time::timeout(bound, self.publish_lockouts()).await;
        // Only after a heartbeat: the halt key was just read (a dead node's agents come up halted
        // if the cluster is).
        if beat {
            let _ = tokio::time::timeout(bound, self.adopt()).await;
        }
    }

    /// Beats until the process ends.
    pub(super) async fn beat(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.beat());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.beat_once().await;
        }
    }

    /// Closes the model gate after `fail_safe_seconds` without a heartbeat, opens it at the next.
    pub(super) async fn guard(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let silence = self.fail.silence();
            let cut_off = silence > self.config.fail_safe;
            let on = self.fail.reason().is_some();
            if cut_off && !on {
                let reason = format!(
                    "cluster fail safe: no heartbeat to JetStream for {:.1} s (> \
                     cluster.fail_safe_seconds = {}): no model call starts until it is back",
                    silence.as_secs_f64(),
                    self.config.fail_safe.as_secs()
                );
                *self.fail.on.lock() = Some((now_ms(), reason.clone()));
                self.fail.entered.fetch_add(1, Ordering::Relaxed);
                self.supervisor.model_gate().close(reason.as_str());
                eprintln!("warden: {reason}");
                self.journal_all(&reason);
            } else if !cut_off && on {
                *self.fail.on.lock() = None;
                self.supervisor.model_gate().open();
                let reason = "cluster fail safe off: JetStream answers again; model calls start";
                eprintln!("warden: {reason}");
                self.journal_all(reason);
            }
        }
    }

    fn journal_all(&self, message: &str) {
        let journal = self.supervisor.journal();
        for agent in self.supervisor.agents() {
            journal.append(
                agent.key(),
                EventKind::SafetyAlert {
                    message: message.into(),
                },
            );
        }
    }
}
