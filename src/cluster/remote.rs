//! One agent of another node, asked for on this one: where it runs, and its halt.
//!
//! ```text
//! POST /api/agents/KEY/halt on node a, KEY owned by node b
//!   1. the owner: `elsewhere` (this node's team file), else KEY's lease     JetStream, ≤ 1 s
//!   2. request on warden.cluster.agent_halt.b {agent, by}                   core NATS
//!   3. b halts KEY (and its delegates) as a local halt, journaled with `by`, and replies
//!      with the acks once applied                                           ≤ cluster.halt_ack_timeout_ms
//! ```
//!
//! # Invariants
//! * **Answered only once applied.** The owner replies after the halt is applied (its acks); no
//!   reply within the bound is a `504` that says the halt may not have happened — never a success.
//! * **Not retried, not stored.** A halt of one agent is a message, unlike the cluster halt (state
//!   in the halt key): a node that is cut off does not get it. The answer says to halt the cluster
//!   (`POST /api/halt`) when that matters.
//! * **The owner is asked by name.** The request goes to the node whose lease this node last saw;
//!   a node that does not run the agent (the lease moved) answers `found: false` and halts nothing.

use super::{kv_key, Cluster, RemoteHaltError};
use futures::StreamExt;
use std::{sync::Arc, time::Duration};
use warden_protocols::{
    cluster::{AgentHaltAck, RemoteAgentHalt, RemoteAgentHaltReply},
    AgentKey, AgentStatus, HaltCause,
};

/// How long the owner of an agent is looked up in JetStream when this node's team file does not
/// say.
const OWNER_LOOKUP: Duration = Duration::from_secs(1);

/// The subject `node` receives halts of single agents on.
fn subject(cluster: &Cluster, node: &str) -> String {
    cluster.config.subject(&format!("agent_halt.{node}"))
}

impl Cluster {
    /// The node this node's team file says runs `agent` (no network): `None` when it runs here, or
    /// the team file does not list it.
    pub fn runs_on(&self, agent: &str) -> Option<String> {
        self.elsewhere.lock().get(agent).cloned()
    }

    /// The node that runs `agent` when it is not this one: [`Cluster::runs_on`], else the node its
    /// lease names (read within a second). `None`: nobody (or no answer).
    pub async fn owner(&self, agent: &str) -> Option<String> {
        if let Some(node) = self.runs_on(agent) {
            return Some(node);
        }
        tokio::time::timeout(OWNER_LOOKUP, self.owner_of(agent))
            .await
            .ok()
            .flatten()
            .filter(|node| *node != self.config.node)
    }

    /// `agent`'s status as its owner's last lease renewal wrote it (at most a beat old), with that
    /// node. `None`: no lease lives, or JetStream did not answer within a second.
    pub async fn remote_status(&self, agent: &str) -> Option<(AgentStatus, String)> {
        let reading = self.leases.get(kv_key("agent", agent));
        let value = tokio::time::timeout(OWNER_LOOKUP, reading)
            .await
            .ok()?
            .ok()??;
        let lease = serde_json::from_slice::<warden_protocols::cluster::AgentLease>(&value).ok()?;
        Some((lease.status?, lease.node))
    }

    /// Halts `agent`, which runs on `node`, journaled there with `by`: its acks once applied.
    ///
    /// # Errors
    /// [`RemoteHaltError::Moved`] when `node` does not run it, [`RemoteHaltError::Unanswered`]
    /// when no answer came within `cluster.halt_ack_timeout_ms`.
    pub async fn halt_remote(
        &self,
        node: &str,
        agent: &AgentKey,
        by: &str,
    ) -> Result<Vec<AgentHaltAck>, RemoteHaltError> {
        let request = RemoteAgentHalt {
            agent: agent.clone(),
            by: format!("{by} via node {}", self.config.node),
        };
        let body = serde_json::to_vec(&request).unwrap_or_default();
        let waited = self.config.halt_ack_timeout;
        // The request's own timeout: the client's default is a beat.
        let asking = self.client.send_request(
            subject(self, node),
            async_nats::Request::new()
                .payload(body.into())
                .timeout(Some(waited)),
        );
        let unanswered = || RemoteHaltError::Unanswered {
            agent: agent.clone(),
            node: node.to_owned(),
            waited,
        };
        let message = match tokio::time::timeout(waited, asking).await {
            Ok(Ok(message)) => message,
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(RemoteHaltError::NoResponder {
                    agent: agent.clone(),
                    node: node.to_owned(),
                })
            }
            Ok(Err(_)) | Err(_) => return Err(unanswered()),
        };
        let reply = serde_json::from_slice::<RemoteAgentHaltReply>(&message.payload)
            .map_err(|_| unanswered())?;
        if !reply.found {
            return Err(RemoteHaltError::Moved {
                agent: agent.clone(),
                node: reply.node,
            });
        }
        if let Some(cause) = reply.not_durable {
            tracing::error!(%agent, node, "halt applied on node {node} but not durable: {cause}");
        }
        Ok(reply.halted)
    }

    /// Answers halts of single agents sent to this node (each applied as a local halt).
    pub(super) async fn answer_agent_halts(self: Arc<Self>) {
        let Ok(mut requests) = self
            .client
            .subscribe(subject(&self, &self.config.node))
            .await
        else {
            eprintln!("warden: cluster: cannot receive halts of single agents");
            return;
        };
        while let Some(message) = requests.next().await {
            let Some(reply_to) = message.reply else {
                continue;
            };
            let Ok(request) = serde_json::from_slice::<RemoteAgentHalt>(&message.payload) else {
                continue;
            };
            let cluster = self.clone();
            actix_rt::spawn(async move {
                let reply = cluster.halt_here(request).await;
                let body = serde_json::to_vec(&reply).unwrap_or_default();
                let _ = cluster.client.publish(reply_to, body.into()).await;
            });
        }
    }

    /// Applies a [`RemoteAgentHalt`] here (only to an agent this node owns).
    async fn halt_here(self: &Arc<Self>, request: RemoteAgentHalt) -> RemoteAgentHaltReply {
        let mut reply = RemoteAgentHaltReply {
            node: self.config.node.clone(),
            found: false,
            halted: Vec::new(),
            not_durable: None,
        };
        if !self.owns(request.agent.as_str()) {
            return reply;
        }
        let cause = HaltCause::Operator {
            operator: request.by,
        };
        if let Ok(acks) = self.supervisor.halt(request.agent.as_str(), cause).await {
            // The lease carries the status other nodes show: the asking node reads it halted
            // once it has the answer.
            self.write_lease_now(request.agent.as_str()).await;
            reply.found = true;
            reply.not_durable = acks
                .iter()
                .find_map(|a| a.not_durable.as_ref().map(|c| c.to_string()));
            reply.halted = crate::server::cluster::agent_acks(&acks);
        }
        reply
    }
}
