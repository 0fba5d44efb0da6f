//! Moving agents off a dead node: a node adopts the agents of its team file that another node owned
//! once that node's lease on them is gone (`cluster.adopt`, default on).
//!
//! ```text
//! every beat (heartbeat succeeded, fail safe off), for each agent listed under `elsewhere`:
//!   1. its lease (agent.KEY in warden_leases) still lives → nothing (the owner noted)
//!   2. gone (aged out: its node died or was cut off longer than the TTL), and for long enough that
//!      a cut-off owner's fail safe is on (see below) →
//!      read its shared lockout (warden_lockouts)          no answer → not this beat
//!   3. claim the lease: `create` (fails when another node created it first: it won)
//!   4. spawn it from the team file's spec, in this node's journal:
//!      locked out in warden_lockouts → it comes up SAFETY_LOCKOUT (only an unlock lifts it)
//!      the cluster halted (the key, or a halt applied here not written yet) → it comes up halted,
//!      noted with the fleet halt (a lift resumes it)
//! ```
//!
//! # Invariants
//! * **The old owner starts no model call once the agent runs here.** A lease ages out
//!   `lease_ttl_seconds` after its last renewal; a cut-off owner closes its model gate
//!   `fail_safe_seconds` after its last heartbeat. When `fail_safe_seconds` is the longer (the
//!   defaults: 10 > 6), a node waits the difference plus a beat after it first saw the lease gone
//!   before it claims it ([`Cluster::adoption_wait`]).
//! * **One node wins.** The lease is claimed by `create`, which JetStream grants to one writer; a
//!   node that lost the race spawns nothing.
//! * **Safety state follows the agent.** A lockout in `warden_lockouts` is journaled at the spawn
//!   (`locked_out`, then `SAFETY_LOCKOUT`) before the agent reads anything; when the lockout cannot be
//!   read, nothing is adopted. A halted cluster halts the agent before it reads anything, and a halt
//!   that comes while it is spawned halts it after (lifts wait meanwhile: the spawn holds
//!   `lifting`). The model gate is the team's: closed while the node is cut off, and no adoption
//!   is tried then.
//! * **History does not move.** The agent's conversation is in the dead node's journal; it starts
//!   here from this node's journal (its own record of the agent if it ever ran it, else fresh).
//!
//! An agent whose team-file entry names MCP tools gets them from the servers this node started at
//! launch (`[mcp_servers]` are all started, whichever agents a node owns).
//!
//! # Taking back an agent this node gave up
//! A node that finds its lease on an agent taken (it was cut off longer than the TTL and another
//! node adopted the agent) halts its copy and notes it given up. If the new owner dies in turn, the
//! lease ages out again and this node adopts the agent back like any other — but its halted copy is
//! still in its team, so step 4 brings that copy back instead of spawning one
//! ([`warden_actors::Supervisor::take_back`]): locked out if the agent is locked out in
//! `warden_lockouts`, kept halted (noted with the fleet halt) if the cluster is halted, resumed
//! otherwise — each only if nothing touched the copy since the give-up. Meanwhile the copy makes
//! no model call: an agent whose lease this node does not hold is fenced (`lease.rs`).
//!
//! The give-up's halt is journaled as [`HaltCause::LeaseLost`], and the agent's record keeps
//! `lease_lost` while it stays stopped so: a node restarted meanwhile takes the agent back too —
//! at its start when it claims the lease ([`Cluster::take_back_at_start`]), or when it adopts it
//! later (the copy its journal restored is taken back rather than left `STOPPED`).

use super::{kv_key, Cluster};
use async_nats::jetstream::kv::{self, CreateErrorKind, Operation};
use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};
use warden_actors::tools::mcp::McpHub;
use warden_protocols::{
    cluster::{AgentLease, LockoutEntry},
    AgentKey, AgentRecord, AgentState, Breaker, HaltCause, Lockout,
};

/// What a node needs to spawn an agent it adopts: the team file's specs of the agents it did not
/// start, and its journal's records of them at start.
#[derive(Debug)]
pub(super) struct Adopter {
    file: crate::team::TeamFile,
    records: Vec<AgentRecord>,
    /// The MCP servers started at launch (the tools of adopted agents).
    mcp: Option<Arc<McpHub>>,
}

impl Adopter {
    /// The agent's spec, coming up as the cluster says.
    fn spawn(
        &self,
        supervisor: &warden_actors::Supervisor,
        agent: &AgentKey,
        lockout: Option<Lockout>,
        halted: bool,
        stopped: Option<HaltCause>,
    ) -> Result<warden_actors::AgentHandle, String> {
        let Some(def) = self.file.agents.iter().find(|a| a.key == agent.as_str()) else {
            return Err("not in the team file".into());
        };
        let tools = match &self.mcp {
            _ if def.tools.is_empty() => Vec::new(),
            Some(hub) => hub
                .tools_for(agent, &def.tools, supervisor.journal())
                .map_err(|e| e.to_string())?,
            None => return Err("its MCP tools' servers are not started here".into()),
        };
        let mut spec = self
            .file
            .agent_spec(def, tools, &self.records, &|p| p)
            .map_err(|e| e.to_string())?;
        if let Some(lockout) = lockout {
            spec = spec.starting_locked_out(lockout);
        }
        if halted {
            spec = spec.starting_halted();
        } else if let Some(cause) = stopped {
            spec = spec.starting_stopped(cause);
        }
        supervisor.spawn(spec).map_err(|e| e.to_string())
    }
}

/// See [`Cluster::adoption_wait`].
fn adoption_wait(fail_safe: Duration, lease_ttl: Duration, beat: Duration) -> Duration {
    match fail_safe.checked_sub(lease_ttl) {
        Some(more) if !more.is_zero() => more + beat,
        _ => Duration::ZERO,
    }
}

/// The lockout a shared entry says `agent` is in (`None`: not locked out).
fn lockout_of(entry: &LockoutEntry) -> Option<Lockout> {
    if !entry.locked {
        return None;
    }
    // The owner publishes the lockout itself as JSON; anything else is the reason as text.
    Some(
        serde_json::from_str::<Lockout>(&entry.reason).unwrap_or_else(|_| Lockout {
            breaker: Breaker::ConsecutiveErrors,
            reason: format!("locked out on node {}: {}", entry.node, entry.reason),
        }),
    )
}

impl Cluster {
    /// Keeps what adopting needs (`warden serve`, after the team is spawned): `file` is the whole
    /// team file, `records` the journal's records at start, `mcp` the MCP servers started for the
    /// team. Only the agents not started here are kept. Nothing when `cluster.adopt` is off.
    pub fn keep_for_adoption(
        &self,
        file: &crate::team::TeamFile,
        records: &[AgentRecord],
        mcp: Option<Arc<McpHub>>,
    ) {
        if !self.config.adopt {
            return;
        }
        let elsewhere = self.elsewhere.lock().clone();
        let mut file = file.clone();
        file.agents
            .retain(|a| elsewhere.contains_key(&AgentKey::from(a.key.as_str())));
        let records = records
            .iter()
            .filter(|r| file.agents.iter().any(|a| a.key == r.key.as_str()))
            .cloned()
            .collect();
        let _ = self.adopter.set(Adopter { file, records, mcp });
    }

    /// One beat of adoption (see the module docs). Bounded by the caller.
    pub(super) async fn adopt(self: &Arc<Self>) {
        let Some(adopter) = self.adopter.get() else {
            return;
        };
        if self.fail.reason().is_some() {
            return;
        }
        let candidates: Vec<(AgentKey, String)> = {
            let given_up = self.given_up.lock();
            self.elsewhere
                .lock()
                .iter()
                .filter(|(k, _)| {
                    given_up.contains_key(*k)
                        || adopter.file.agents.iter().any(|a| a.key == k.as_str())
                })
                .map(|(k, n)| (k.clone(), n.clone()))
                .collect()
        };
        for (agent, owner) in candidates {
            let key = kv_key("agent", agent.as_str());
            let Ok(entry) = self.leases.entry(key.clone()).await else {
                return;
            };
            if let Some(entry) = entry.filter(|e| e.operation == Operation::Put) {
                self.gone_since.lock().remove(&agent);
                // Still owned: note by whom (it may have moved to a third node), and as what.
                if let Ok(lease) = serde_json::from_slice::<AgentLease>(&entry.value) {
                    self.saw(&agent, &lease);
                    if lease.node != owner && lease.node != self.config.node {
                        self.elsewhere.lock().insert(agent, lease.node);
                    }
                }
                continue;
            }
            // Gone: long enough for a cut-off owner's fail safe to be on?
            let first_seen = *self
                .gone_since
                .lock()
                .entry(agent.clone())
                .or_insert_with(tokio::time::Instant::now);
            if first_seen.elapsed() < self.adoption_wait() {
                continue;
            }
            // Its lockout first: without knowing it, nothing is adopted (fail safe).
            let Ok(lockout) = self.shared_lockout(&agent).await else {
                return;
            };
            let sent = std::time::Instant::now();
            let body = serde_json::to_vec(&self.lease(&agent)).unwrap_or_default();
            let revision = match self.leases.create(&key, body.into()).await {
                Ok(revision) => {
                    self.mark_renewed(&agent, sent);
                    revision
                }
                // Another node claimed it first: it runs there (noted at the next beat).
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                Err(_) => return,
            };
            self.spawn_adopted(adopter, &agent, &owner, lockout, revision)
                .await;
        }
    }

    /// How long a lease must have been seen gone before it is claimed: 0 when `fail_safe_seconds`
    /// ≤ `lease_ttl_seconds` (a cut-off owner's model gate closed before its lease aged out),
    /// otherwise the difference plus a beat.
    pub(super) fn adoption_wait(&self) -> Duration {
        adoption_wait(
            self.config.fail_safe,
            self.config.lease_ttl,
            self.config.beat(),
        )
    }

    /// How `agent` was on `owner` when its lease was last read here: STOPPED by a halt of its own
    /// (not the fleet halt's: the cluster's halt key decides that one), paused (each `false` when
    /// unknown).
    fn as_it_was(&self, agent: &AgentKey) -> (bool, bool) {
        self.last_seen
            .lock()
            .get(agent)
            .map_or((false, false), |(_, s, fleet)| {
                (s.state == AgentState::Stopped && !fleet, s.paused)
            })
    }

    /// Spawns `agent`, whose lease this node just created at `revision` — or brings back its halted
    /// copy when this node gave it up — and makes it this node's; on failure the lease is given
    /// back. It comes up locked out if it is locked out; halted with the cluster if the cluster is
    /// halted; otherwise as its owner's last lease renewal showed it: halted (only its own resume
    /// brings it back) or paused by an operator there, else running.
    async fn spawn_adopted(
        &self,
        adopter: &Adopter,
        agent: &AgentKey,
        owner: &str,
        lockout: Option<Lockout>,
        revision: u64,
    ) {
        // No lift is applied while the agent is spawned (a halt may be).
        let _lifting = self.lifting.lock().await;
        let halts = self.halted_at.load(Ordering::SeqCst);
        let halted = {
            // A halt applied here (its write may not have landed) or the key's, unless a lift
            // above it was applied here (the key may not have been read again since).
            let key = &self.halt.lock().0;
            let halt = halts.max(if key.halted { key.epoch } else { 0 });
            halt > 0 && halt >= self.lifted.load(Ordering::SeqCst)
        };
        let locked = lockout.is_some();
        let (stopped_there, paused_there) = self.as_it_was(agent);
        // An operator's halt there holds here (not as part of a fleet halt: a lift keeps it).
        let stopped = (stopped_there && !halted && !locked).then(|| HaltCause::Operator {
            operator: format!("cluster: STOPPED on node {owner} when its lease was last renewed"),
        });
        let paused = paused_there && !locked;
        let given_up = self.given_up.lock().get(agent).copied();
        let done = match given_up {
            // Its copy here is halted already (the give-up): kept so.
            Some(_) if stopped.is_some() => {
                Ok(format!(" back: kept halted (STOPPED on node {owner})"))
            }
            Some(epoch) => self.bring_back(agent, epoch, lockout, halted, owner).await,
            None => match adopter.spawn(
                &self.supervisor,
                agent,
                lockout.clone(),
                halted,
                stopped.clone(),
            ) {
                // Its copy in this node's journal was given up here before this node restarted:
                // brought back as a take-back would.
                Ok(handle) if stopped.is_none() && handle.given_up() => {
                    self.bring_back(agent, handle.halt_epoch(), lockout, halted, owner)
                        .await
                }
                Ok(_) => Ok(format!(
                    "{}{}{}",
                    if locked { ", locked out" } else { "" },
                    if halted { ", halted" } else { "" },
                    if stopped.is_some() {
                        format!(", halted on node {owner}")
                    } else {
                        String::new()
                    },
                )),
                Err(e) => Err(e),
            },
        };
        match done {
            Ok(mut how) => {
                if paused {
                    how.push_str(&self.pause_adopted(agent, owner).await);
                }
                self.gone_since.lock().remove(agent);
                self.given_up.lock().remove(agent);
                self.owned.lock().insert(agent.clone(), revision);
                self.elsewhere.lock().remove(agent);
                eprintln!(
                    "warden: cluster: node {owner}'s lease on agent {agent} is gone: adopted \
                     here{how} (its conversation history stays in node {owner}'s journal)"
                );
                if self.halted_at.load(Ordering::SeqCst) != halts {
                    // A halt came while it was spawned (after `halt_all` listed the agents).
                    // Halted with the others again (noted with them: a lift resumes it).
                    self.supervisor.halt_all().await;
                }
            }
            Err(e) => {
                eprintln!("warden: cluster: agent {agent} could not be adopted: {e}");
                let _ = self.leases.delete(kv_key("agent", agent.as_str())).await;
            }
        }
    }

    /// The lockout `warden_lockouts` holds for `agent` (`None`: not locked out).
    async fn shared_lockout(&self, agent: &AgentKey) -> Result<Option<Lockout>, kv::EntryError> {
        let shared = self
            .lockouts_kv
            .entry(kv_key("agent", agent.as_str()))
            .await?;
        Ok(shared
            .filter(|e| e.operation == Operation::Put)
            .and_then(|e| serde_json::from_slice::<LockoutEntry>(&e.value).ok())
            .and_then(|e| lockout_of(&e)))
    }

    /// Takes back `agent`, given up here with its halt epoch then at `epoch`, from `owner`
    /// ([`warden_actors::Supervisor::take_back`]): what to add to the log line.
    async fn bring_back(
        &self,
        agent: &AgentKey,
        epoch: u64,
        lockout: Option<Lockout>,
        halted: bool,
        owner: &str,
    ) -> Result<String, String> {
        let operator = format!("cluster: adopted back from node {owner}");
        match self
            .supervisor
            .take_back(agent.as_str(), epoch, lockout, halted, &operator)
            .await
        {
            Ok(outcome) if outcome.resumed => Ok(" back: resumed".to_owned()),
            Ok(outcome) => Ok(format!(" back: {}", outcome.kept)),
            Err(e) => Err(e.to_string()),
        }
    }

    /// At this node's start (`Cluster::run`, after the halt key is applied): takes back each agent
    /// it claimed that its journal restored as given up here before the restart
    /// ([`warden_actors::AgentHandle::given_up`]: `STOPPED` as `lease_lost`) — locked out if
    /// `warden_lockouts` says so, kept halted (noted with the fleet halt) if `halted`, resumed
    /// otherwise. When its shared lockout cannot be read, it is left `STOPPED` (fail safe) and
    /// said so.
    pub(super) async fn take_back_at_start(&self, halted: bool) {
        let owned: Vec<AgentKey> = self.owned.lock().keys().cloned().collect();
        for agent in owned {
            let Some(handle) = self.supervisor.get(agent.as_str()) else {
                continue;
            };
            if !handle.given_up() {
                continue;
            }
            let lockout = match self.shared_lockout(&agent).await {
                Ok(lockout) => lockout,
                Err(e) => {
                    eprintln!(
                        "warden: cluster: agent {agent} was given up here before this node \
                         restarted, and its shared lockout cannot be read ({e}): left STOPPED \
                         (resume it by hand)"
                    );
                    continue;
                }
            };
            let operator = format!(
                "cluster: taken back at the start of node {}",
                self.config.node
            );
            let how = match self
                .supervisor
                .take_back(
                    agent.as_str(),
                    handle.halt_epoch(),
                    lockout,
                    halted,
                    &operator,
                )
                .await
            {
                Ok(outcome) if outcome.resumed => "resumed".to_owned(),
                Ok(outcome) => outcome.kept,
                Err(e) => e.to_string(),
            };
            eprintln!(
                "warden: cluster: agent {agent}, given up here before this node restarted, is \
                 this node's again: {how}"
            );
        }
    }

    /// Pauses an adopted agent that was paused on `owner`: what to add to the log line.
    async fn pause_adopted(&self, agent: &AgentKey, owner: &str) -> String {
        let Some(handle) = self.supervisor.get(agent.as_str()) else {
            return String::new();
        };
        let operator = format!("cluster: paused on node {owner} when its lease was last renewed");
        match handle.pause(&operator).await {
            Ok(()) | Err(warden_actors::ControlError::NotDurable(_)) => {
                format!(", paused on node {owner}")
            }
            Err(e) => format!(", paused on node {owner} but not here: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adoption_waits_for_a_cut_off_owners_fail_safe() {
        let s = Duration::from_secs;
        // The defaults: fail safe 10 s, TTL 6 s, beat 1 s → 5 s more after the lease is gone.
        assert_eq!(adoption_wait(s(10), s(6), s(1)), s(5));
        assert_eq!(adoption_wait(s(2), s(3), s(1)), Duration::ZERO);
        assert_eq!(adoption_wait(s(6), s(6), s(1)), Duration::ZERO);
    }

    #[test]
    fn a_shared_lockout_reads_back_as_the_lockout_or_its_text() {
        let published = Lockout {
            breaker: Breaker::Stuck,
            reason: "same call 5 times".into(),
        };
        let entry = |locked, reason: String| LockoutEntry {
            locked,
            reason,
            node: "a".into(),
            at_ms: 1,
        };
        let json = serde_json::to_string(&published).unwrap();
        assert_eq!(lockout_of(&entry(true, json.clone())), Some(published));
        assert_eq!(lockout_of(&entry(false, json)), None);
        let text = lockout_of(&entry(true, "locked out".into())).unwrap();
        assert_eq!(text.reason, "locked out on node a: locked out");
    }
}
