//! Shared lockouts: the bucket `warden_lockouts` holds, per agent (`agent.KEY`), a
//! [`LockoutEntry`] `{locked, reason, node, at_ms}` with its revision. Entries never expire: a
//! lockout outlives its node.
//!
//! * The owning node publishes its agents' lockouts every beat (a breaker trip is seen within one
//!   beat), by compare-and-swap over the revision it last saw.
//! * Every node watches the bucket and keeps a cache; a delegation to an agent that is not local and
//!   that the cache says is locked out is refused as `emergency_stop`
//!   ([`warden_actors::RemoteAgents`], `delegate.rs`).
//! * An unlock (`POST /api/agents/KEY/unlock` on a cluster node) writes `locked: false` first, by
//!   compare-and-swap; only when that write succeeded is the agent unlocked locally. A node cut off
//!   from the cluster cannot unlock (`503`).

use super::{kv_key, Cluster};
use async_nats::jetstream::kv::Operation;
use futures::StreamExt;
use parking_lot::Mutex;
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use warden_actors::now_ms;
use warden_protocols::{cluster::LockoutEntry, AgentKey};

/// Every agent's lockout entry as last seen, with its revision (kept by the watch).
pub(super) type Lockouts = Arc<Mutex<BTreeMap<AgentKey, (LockoutEntry, u64)>>>;

/// The agent key of a lockout entry's KV key (`agent.KEY`, escapes undone).
fn agent_of(key: &str) -> Option<AgentKey> {
    let escaped = key.strip_prefix("agent.")?;
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut rest = escaped.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'=' && tail.len() >= 2 {
            let hex = std::str::from_utf8(&tail[..2]).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok().map(AgentKey::from)
}

impl Cluster {
    /// Writes `agent`'s lockout by compare-and-swap over the revision last seen (create when
    /// none). `Err`: not written (JetStream did not answer, or another write came first).
    pub(super) async fn write_lockout(
        &self,
        agent: &AgentKey,
        locked: bool,
        reason: &str,
    ) -> Result<(), String> {
        let key = kv_key("agent", agent.as_str());
        let entry = LockoutEntry {
            locked,
            reason: reason.into(),
            node: self.config.node.clone(),
            at_ms: now_ms(),
        };
        let body = serde_json::to_vec(&entry).unwrap_or_default();
        let current = self
            .lockouts_kv
            .entry(key.clone())
            .await
            .map_err(|e| e.to_string())?;
        let revision = match current.filter(|e| e.operation == Operation::Put) {
            None => self
                .lockouts_kv
                .create(&key, body.into())
                .await
                .map_err(|e| e.to_string())?,
            Some(e) => self
                .lockouts_kv
                .update(&key, body.into(), e.revision)
                .await
                .map_err(|e| e.to_string())?,
        };
        self.lockouts
            .lock()
            .insert(agent.clone(), (entry, revision));
        Ok(())
    }

    /// Publishes the lockouts of the agents this node owns that the bucket does not show yet (one
    /// beat). An agent being unlocked through the cluster is left alone meanwhile.
    pub(super) async fn publish_lockouts(&self) {
        let owned: Vec<AgentKey> = self.owned.lock().keys().cloned().collect();
        for agent in owned {
            let Some(handle) = self.supervisor.get(agent.as_str()) else {
                continue;
            };
            let status = handle.status();
            let shown = self
                .lockouts
                .lock()
                .get(&agent)
                .is_some_and(|(e, _)| e.locked);
            if status.emergency_stop == shown || self.unlocking.lock().contains(&agent) {
                continue;
            }
            let reason = match (&status.lockout, status.emergency_stop) {
                (Some(lockout), true) => serde_json::to_string(lockout).unwrap_or_default(),
                (None, true) => "locked out".to_owned(),
                (_, false) => "unlocked on its node".to_owned(),
            };
            if let Err(e) = self
                .write_lockout(&agent, status.emergency_stop, &reason)
                .await
            {
                tracing::debug!(%agent, "lockout not published yet: {e}");
            }
        }
    }

    /// Watches the bucket into the cache; restarts when the watch ends (a NATS restart).
    pub(super) async fn watch_lockouts(self: Arc<Self>) {
        loop {
            if let Ok(mut watch) = self.lockouts_kv.watch_with_history("agent.>").await {
                while let Some(Ok(entry)) = watch.next().await {
                    let Some(agent) = agent_of(&entry.key) else {
                        continue;
                    };
                    let mut cache = self.lockouts.lock();
                    if cache.get(&agent).is_some_and(|(_, r)| *r > entry.revision) {
                        continue;
                    }
                    match entry.operation {
                        Operation::Put => {
                            if let Ok(value) = serde_json::from_slice(&entry.value) {
                                cache.insert(agent, (value, entry.revision));
                            }
                        }
                        _ => {
                            cache.remove(&agent);
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every lockout entry as last seen.
    pub fn lockouts(&self) -> BTreeMap<AgentKey, LockoutEntry> {
        self.lockouts
            .lock()
            .iter()
            .map(|(k, (e, _))| (k.clone(), e.clone()))
            .collect()
    }

    /// Lifts `agent`'s lockout (a local one) with `local` — an unlock, an emergency clear, or a
    /// history reset of a locked-out agent — after `locked: false` is written to the bucket.
    /// `Err(None)`: the write failed within `bound` (`local` is not run: the agent stays locked
    /// out); `Err(Some)`: `local` failed.
    pub(super) async fn unlock<F>(
        &self,
        agent: &warden_actors::AgentHandle,
        operator: &str,
        bound: Duration,
        local: F,
    ) -> Result<(), Option<warden_actors::ControlError>>
    where
        F: std::future::Future<Output = Result<(), warden_actors::ControlError>>,
    {
        let key = agent.key().clone();
        self.unlocking.lock().insert(key.clone());
        let written = tokio::time::timeout(
            bound,
            self.write_lockout(&key, false, &format!("unlocked by {operator}")),
        )
        .await;
        let result = match written {
            Ok(Ok(())) => local.await.map_err(Some),
            Ok(Err(e)) => {
                tracing::warn!(agent = %key, "unlock refused: the cluster write failed: {e}");
                Err(None)
            }
            Err(_) => Err(None),
        };
        self.unlocking.lock().remove(&key);
        result
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lockout_key_gives_its_agent_back() {
        let key = super::kv_key("agent", "a.b c");
        assert_eq!(super::agent_of(&key).unwrap().as_str(), "a.b c");
        assert_eq!(super::agent_of("node.a"), None);
    }
}
