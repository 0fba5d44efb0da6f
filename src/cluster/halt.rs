//! The halt as state: the key `halt` of the bucket `warden_halt` holds a [`HaltState`]
//! `{epoch, halted, reason, by, node, at_ms}`.
//!
//! ```text
//! POST /api/halt on node a
//!   1. every local agent's halt flag raised (SystemHalt, priority 0)      no network
//!   2. epoch = max(own, last read) + 1; published on warden.cluster.halt   core NATS, bounded
//!   3. halt key ← epoch by compare-and-swap (background, retried)         JetStream
//!   4. acks: the local ones, then each node's reply until all known
//!      nodes answered or cluster.halt_ack_timeout_ms                       listed per node
//! every node
//!   broadcast with epoch ≥ own → halt_all, reply with its acks (below own: `stale`)
//!   KV watch / heartbeat poll with epoch > own → halt_all
//! ```
//!
//! Lifting it (`POST /api/resume` on a cluster node):
//!
//! ```text
//!   1. read the halt key (state, revision)                                  JetStream, bounded
//!      not halted → 409; this node's epoch above the key's (a halt not written yet) → 409
//!   2. key ← {epoch + 1, halted: false} by update over the revision read    JetStream, bounded
//!      the key moved → 409 (never retried over a halt it has not seen); no answer → 503
//!   3. only then: this node's agents the halt stopped are resumed, and the lift is published on
//!      warden.cluster.halt (no acks awaited)
//! every node
//!   a lift (halted: false) with epoch > own, from the broadcast, the watch or the poll →
//!   resume the agents the fleet halt stopped (`Supervisor::resume_fleet_halt`)
//! ```
//!
//! # Invariants of the lift
//! * **A lift never overrides a halt it has not seen.** The write is one compare-and-swap over the
//!   revision read, never retried; a node whose epoch is above the key's (it applied a halt whose
//!   write has not landed) refuses too.
//! * **A halt racing a lift wins.** A halt's write retries over a lift with `epoch + 1`, `halted:
//!   true`; a halt broadcast at an epoch equal to a lift's is applied, a lift at an epoch equal to
//!   or below a node's own is not. After resuming, a node that applied a halt meanwhile (its epoch
//!   moved past the lift's, or a halt of the lift's epoch came) halts every agent again.
//! * **Stale is ignored.** A lift below a node's epoch is not applied; a halt below it neither.
//!
//! Model calls carry the epoch: applying a cluster epoch halts every local agent, which moves each
//! agent's own halt epoch on, and a model result that comes back under an earlier one is dropped
//! (the turn's staleness check).

use super::{Cluster, ClusterHalt, ClusterLift, LiftError, HALT_KEY};
use crate::server::cluster::agent_acks;
use async_nats::jetstream::kv::{self, Operation};
use futures::{FutureExt, StreamExt};
use std::{collections::BTreeMap, sync::atomic::Ordering, sync::Arc, time::Duration};
use warden_actors::{now_ms, LiftOutcome};
use warden_protocols::cluster::{HaltState, NodeHaltAck};

impl Cluster {
    /// The halt epoch this node has applied.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The halt key as last read.
    pub fn halt_state(&self) -> HaltState {
        self.halt.lock().0.clone()
    }

    /// Reads the halt key: its state and revision (0 and the default state when it was never
    /// written).
    pub(super) async fn read_halt(&self) -> Result<(HaltState, u64), String> {
        let entry = self
            .halt_kv
            .entry(HALT_KEY)
            .await
            .map_err(|e| e.to_string())?;
        Ok(match entry.filter(|e| e.operation == Operation::Put) {
            None => (HaltState::default(), 0),
            Some(e) => (
                serde_json::from_slice(&e.value).unwrap_or_default(),
                e.revision,
            ),
        })
    }

    /// Applies `state` read from the key (watch or poll): remembered; a halt above this node's
    /// epoch halts every local agent, a lift above it resumes those the halt stopped.
    async fn seen(self: &Arc<Self>, state: HaltState, revision: u64) {
        {
            let mut halt = self.halt.lock();
            if revision < halt.1 {
                return;
            }
            *halt = (state.clone(), revision);
        }
        if state.halted && self.epoch.fetch_max(state.epoch, Ordering::SeqCst) < state.epoch {
            self.halted_at.fetch_max(state.epoch, Ordering::SeqCst);
            tracing::warn!(epoch = state.epoch, by = %state.by, node = %state.node, "cluster halt applied");
            self.supervisor.halt_all().await;
        } else if !state.halted && state.epoch > self.epoch() {
            // In its own task: a poll is bounded by the beat, the resumes are not.
            let this = self.clone();
            actix_rt::spawn(async move { this.apply_lift(&state).await });
        }
    }

    /// Reads the key and applies it (every heartbeat: the watch's fallback).
    pub(super) async fn poll_halt(self: &Arc<Self>) -> Result<(), String> {
        let (state, revision) = self.read_halt().await?;
        self.seen(state, revision).await;
        Ok(())
    }

    /// Halts the whole cluster: this node's agents first (before any network), then the broadcast,
    /// the key's compare-and-swap (in the background) and the other nodes' acknowledgements.
    pub async fn halt(self: &Arc<Self>, reason: &str, by: &str) -> ClusterHalt {
        // The epoch moves on first (no network): a lift being applied here that reads it after
        // this sees the halt and halts again (`apply_lift`).
        let seen = self.halt.lock().0.epoch;
        let epoch = self.epoch().max(seen) + 1;
        self.epoch.fetch_max(epoch, Ordering::SeqCst);
        self.halted_at.fetch_max(epoch, Ordering::SeqCst);
        let local = self.supervisor.halt_all();
        futures::pin_mut!(local);
        // The first poll raises every local halt flag (see `Supervisor::halt_all`).
        let mut local_acks = match futures::poll!(local.as_mut()) {
            std::task::Poll::Ready(acks) => Some(acks),
            std::task::Poll::Pending => None,
        };
        let state = HaltState {
            epoch,
            halted: true,
            reason: reason.into(),
            by: by.into(),
            node: self.config.node.clone(),
            at_ms: now_ms(),
        };
        let body = serde_json::to_vec(&state).unwrap_or_default();
        let bound = self.config.halt_ack_timeout;
        // Every network step bounded: a node cut off answers with its own acks after the bound.
        let inbox = self.client.new_inbox();
        let replies = match tokio::time::timeout(bound, self.client.subscribe(inbox.clone())).await
        {
            Ok(Ok(sub)) => {
                let sent =
                    self.client
                        .publish_with_reply(self.config.subject("halt"), inbox, body.into());
                tokio::time::timeout(bound, sent)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|()| sub)
            }
            _ => None,
        };
        // `tokio::spawn`, not actix's: a halt may be asked from a task outside an arbiter's
        // `LocalSet` (an MCP session's tool call).
        tokio::spawn(self.clone().write_halt(state));
        let local = match local_acks.take() {
            Some(acks) => acks,
            None => local.await,
        };
        // The nodes whose heartbeat lived at the last beat (no network here).
        let expected = self.peers.lock().clone();
        let mut remote = BTreeMap::new();
        let take = |remote: &mut BTreeMap<String, NodeHaltAck>, msg: async_nats::Message| {
            if let Ok(ack) = serde_json::from_slice::<NodeHaltAck>(&msg.payload) {
                remote.insert(ack.node.clone(), ack);
            }
        };
        if let Some(mut sub) = replies {
            let deadline = tokio::time::Instant::now() + bound;
            while !expected.iter().all(|n| remote.contains_key(n)) {
                match tokio::time::timeout_at(deadline, sub.next()).await {
                    Ok(Some(msg)) => take(&mut remote, msg),
                    Ok(None) | Err(_) => break,
                }
            }
            // Answers already in from nodes not known at the last beat (one that just joined).
            while let Some(Some(msg)) = sub.next().now_or_never() {
                take(&mut remote, msg);
            }
        }
        let unanswered = expected
            .into_iter()
            .filter(|n| !remote.contains_key(n))
            .collect();
        ClusterHalt {
            epoch,
            local,
            remote,
            unanswered,
        }
    }

    /// Writes `state` to the halt key by compare-and-swap, retrying until it lands or a halt at or
    /// above its epoch is there. Never awaited by a halt.
    async fn write_halt(self: Arc<Self>, mut state: HaltState) {
        let mut pause = Duration::from_millis(50);
        loop {
            let written = async {
                let (current, revision) = self.read_halt().await?;
                if current.halted && current.epoch >= state.epoch {
                    return Ok(true);
                }
                state.epoch = state.epoch.max(current.epoch + 1);
                let body = serde_json::to_vec(&state).unwrap_or_default();
                // `Ok(false)`: a lost race, retried at once with the new revision; any other
                // failure (no quorum, a timeout) backs off below rather than spin.
                if revision == 0 {
                    match self.halt_kv.create(HALT_KEY, body.into()).await {
                        Ok(_) => Ok(true),
                        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                        Err(e) => Err(e.to_string()),
                    }
                } else {
                    match self.halt_kv.update(HALT_KEY, body.into(), revision).await {
                        Ok(_) => Ok(true),
                        Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(false),
                        Err(e) => Err(e.to_string()),
                    }
                }
            }
            .await;
            match written {
                Ok(true) => {
                    self.epoch.fetch_max(state.epoch, Ordering::SeqCst);
                    self.halted_at.fetch_max(state.epoch, Ordering::SeqCst);
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!("cluster halt not written yet (retrying): {e}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Answers halt broadcasts: an epoch at or above this node's halts every local agent; the
    /// reply carries the acks. Resubscribes if the subscription ends.
    pub(super) async fn answer_halts(self: Arc<Self>) {
        loop {
            let Ok(mut sub) = self.client.subscribe(self.config.subject("halt")).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            while let Some(msg) = sub.next().await {
                let Ok(state) = serde_json::from_slice::<HaltState>(&msg.payload) else {
                    continue;
                };
                if state.node == self.config.node {
                    continue; // our own: applied before it was sent
                }
                if !state.halted {
                    // A lift: applied when above this node's epoch (no reply is awaited).
                    let this = self.clone();
                    actix_rt::spawn(async move { this.apply_lift(&state).await });
                    continue;
                }
                let own = self.epoch();
                let ack = if state.epoch >= own {
                    self.epoch.fetch_max(state.epoch, Ordering::SeqCst);
                    self.halted_at.fetch_max(state.epoch, Ordering::SeqCst);
                    let acks = self.supervisor.halt_all().await;
                    tracing::warn!(epoch = state.epoch, from = %state.node, "cluster halt applied (broadcast)");
                    NodeHaltAck {
                        node: self.config.node.clone(),
                        epoch: state.epoch,
                        stale: false,
                        halted: agent_acks(&acks),
                    }
                } else {
                    NodeHaltAck {
                        node: self.config.node.clone(),
                        epoch: own,
                        stale: true,
                        halted: Vec::new(),
                    }
                };
                if let Some(reply) = msg.reply {
                    let body = serde_json::to_vec(&ack).unwrap_or_default();
                    let _ = self.client.publish(reply, body.into()).await;
                }
            }
        }
    }

    /// Watches the halt key; restarts the watch when it ends (a NATS restart).
    pub(super) async fn watch_halt(self: Arc<Self>) {
        loop {
            if let Ok(mut watch) = self.halt_kv.watch(HALT_KEY).await {
                while let Some(Ok(entry)) = watch.next().await {
                    if entry.operation != Operation::Put {
                        continue;
                    }
                    if let Ok(state) = serde_json::from_slice::<HaltState>(&entry.value) {
                        self.seen(state, entry.revision).await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Test hook (not a setting): `WARDEN_TEST_LIFT_PAUSE_MS` makes a lift wait this long between
/// its read of the halt key and its write, so that a test can put a halt in between.
fn test_pause() -> Option<Duration> {
    std::env::var("WARDEN_TEST_LIFT_PAUSE_MS")
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

impl Cluster {
    /// Lifts the cluster halt (see the module docs): the key written `{epoch + 1, halted: false}`
    /// by one compare-and-swap over the revision read, then this node's agents resumed and the
    /// lift published.
    ///
    /// # Errors
    /// [`LiftError`]: nothing was lifted.
    pub async fn lift(self: &Arc<Self>, reason: &str, by: &str) -> Result<ClusterLift, LiftError> {
        let bound = self.config.halt_ack_timeout;
        let cut = |cause: String| LiftError::CutOff {
            ms: bound.as_millis(),
            cause,
        };
        if let Some(fail) = self.fail.reason() {
            return Err(cut(fail));
        }
        let _lifting = self.lifting.lock().await;
        let (current, revision) = match tokio::time::timeout(bound, self.read_halt()).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => return Err(cut(format!("reading the halt key: {e}"))),
            Err(_) => return Err(cut("reading the halt key: no answer".into())),
        };
        if !current.halted || revision == 0 {
            return Err(LiftError::NotHalted {
                epoch: current.epoch,
            });
        }
        if let Some(pause) = test_pause() {
            tokio::time::sleep(pause).await;
        }
        let own = self.epoch();
        if own > current.epoch {
            return Err(LiftError::Moved {
                read: current.epoch,
                now: own,
            });
        }
        let state = HaltState {
            epoch: current.epoch + 1,
            halted: false,
            reason: reason.into(),
            by: by.into(),
            node: self.config.node.clone(),
            at_ms: now_ms(),
        };
        let body = serde_json::to_vec(&state).unwrap_or_default();
        let written = tokio::time::timeout(
            bound,
            self.halt_kv.update(HALT_KEY, body.clone().into(), revision),
        )
        .await;
        let written = match written {
            Ok(Ok(written)) => written,
            Ok(Err(e)) => {
                // A lost race (the key moved) or JetStream's refusal: read again to tell which.
                return Err(match tokio::time::timeout(bound, self.read_halt()).await {
                    Ok(Ok((now, now_revision))) if now_revision != revision => LiftError::Moved {
                        read: current.epoch,
                        now: now.epoch,
                    },
                    _ => cut(format!("writing the halt key: {e}")),
                });
            }
            Err(_) => return Err(cut("writing the halt key: no answer".into())),
        };
        {
            let mut halt = self.halt.lock();
            if written > halt.1 {
                *halt = (state.clone(), written);
            }
        }
        let local = self.resume_for_lift(&state).await.unwrap_or_default();
        // Best effort: the other nodes also read the key (watch, poll).
        let _ = tokio::time::timeout(
            bound,
            self.client
                .publish(self.config.subject("halt"), body.into()),
        )
        .await;
        Ok(ClusterLift {
            epoch: state.epoch,
            local,
        })
    }

    /// Applies a lift read from the key or received on the broadcast: when its epoch is above this
    /// node's, resumes the agents the halt stopped.
    async fn apply_lift(&self, state: &HaltState) {
        let _lifting = self.lifting.lock().await;
        if let Some(outcomes) = self.resume_for_lift(state).await {
            let resumed = outcomes.iter().filter(|o| o.resumed).count();
            tracing::warn!(epoch = state.epoch, by = %state.by, node = %state.node, resumed, "cluster halt lifted");
            eprintln!(
                "warden: cluster halt lifted (epoch {}, by {} on node {}: {}): {resumed} agents resumed",
                state.epoch, state.by, state.node, state.reason
            );
        }
    }

    /// Moves this node's epoch to the lift's and resumes the agents the halt stopped; `None` when
    /// the lift is not above this node's epoch (stale, or a halt at its epoch came first). A halt
    /// that came while resuming halts every agent again. Called under `lifting`.
    async fn resume_for_lift(&self, state: &HaltState) -> Option<Vec<LiftOutcome>> {
        self.epoch
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |own| {
                (state.epoch > own).then_some(state.epoch)
            })
            .ok()?;
        self.lifted.fetch_max(state.epoch, Ordering::SeqCst);
        let operator = if state.reason.trim().is_empty() {
            format!(
                "{} (lift of the cluster halt, epoch {})",
                state.by, state.epoch
            )
        } else {
            format!(
                "{} (lift of the cluster halt, epoch {}: {})",
                state.by,
                state.epoch,
                state.reason.trim()
            )
        };
        let outcomes = self
            .supervisor
            .resume_fleet_halt(&operator)
            .await
            .unwrap_or_default();
        if self.epoch() != state.epoch || self.halted_at.load(Ordering::SeqCst) >= state.epoch {
            // A halt came while the resumes were queued (above the lift, or of its epoch): it wins.
            self.supervisor.halt_all().await;
        }
        Some(outcomes)
    }
}
