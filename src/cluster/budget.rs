//! The team token budget across nodes: `safety.budget.tokens_per_team` is the whole cluster's.
//! The key `tokens` in the bucket `warden_budget` holds [`BudgetClaims`] `{budget, claimed,
//! nodes}`; a node spends only the slices it claimed.
//!
//! * A model call that would spend past what the node holds waits while the node claims one more
//!   slice (`cluster.budget_slice_tokens`, default a tenth of the budget; the last one is what is
//!   left) by compare-and-swap (`update` over the revision read; `create` for the first).
//! * `claimed` never passes `budget`, and each node spends at most what it holds (plus, as on one
//!   node, one call per agent running at once): the team never overshoots by more than that. A
//!   slice a node holds and does not spend is lost to the others (under-use: at most one slice a
//!   node).
//! * No slice left, or JetStream not answering within [`CLAIM_FOR`]: nothing is granted and the
//!   call is stopped by the budget, as on one node.

use super::Cluster;
use futures::future::BoxFuture;
use std::{
    sync::{Arc, Weak},
    time::Duration,
};
use warden_actors::BudgetSlices;
use warden_protocols::cluster::BudgetClaims;

/// The bucket of the shared budget.
pub const BUDGET_BUCKET: &str = "warden_budget";
/// The key of the team token budget.
pub(super) const TOKENS_KEY: &str = "tokens";
/// How long one claim may take (every JetStream round trip and compare-and-swap retry included).
pub(super) const CLAIM_FOR: Duration = Duration::from_secs(5);

/// The slices as the team budget asks for them.
pub(super) struct Slices {
    pub(super) cluster: Weak<Cluster>,
    /// `safety.budget.tokens_per_team` here (used when this node creates the key).
    pub(super) budget: u64,
    pub(super) slice: u64,
}

impl BudgetSlices for Slices {
    fn claim(&self) -> BoxFuture<'static, u64> {
        let Some(cluster) = self.cluster.upgrade() else {
            return Box::pin(async { 0 });
        };
        let (budget, slice) = (self.budget, self.slice);
        Box::pin(async move {
            tokio::time::timeout(CLAIM_FOR, cluster.claim_slice(budget, slice))
                .await
                .unwrap_or(0)
        })
    }
}

impl Cluster {
    /// One slice (at most `slice` tokens, what is left of the budget) added to `claimed` by
    /// compare-and-swap, retried while another node's write came first. 0: none left.
    async fn claim_slice(&self, budget: u64, slice: u64) -> u64 {
        loop {
            let entry = match self.budget_kv.entry(TOKENS_KEY).await {
                Ok(entry) => entry,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let (mut claims, revision) = match entry {
                Some(e) if e.operation == async_nats::jetstream::kv::Operation::Put => (
                    serde_json::from_slice::<BudgetClaims>(&e.value).unwrap_or_default(),
                    e.revision,
                ),
                _ => (
                    BudgetClaims {
                        budget,
                        ..BudgetClaims::default()
                    },
                    0,
                ),
            };
            let grant = slice.min(claims.budget.saturating_sub(claims.claimed));
            if grant == 0 {
                return 0;
            }
            claims.claimed += grant;
            *claims.nodes.entry(self.config.node.clone()).or_default() += grant;
            let body: Vec<u8> = serde_json::to_vec(&claims).unwrap_or_default();
            let written = if revision == 0 {
                self.budget_kv
                    .create(TOKENS_KEY, body.into())
                    .await
                    .map(drop)
                    .map_err(drop)
            } else {
                self.budget_kv
                    .update(TOKENS_KEY, body.into(), revision)
                    .await
                    .map(drop)
                    .map_err(drop)
            };
            if written.is_ok() {
                return grant;
            }
            // Another node's claim came first (or the write failed): read again.
        }
    }

    /// The shared budget as JetStream has it now (`GET /api/cluster`'s `budget`), if any.
    pub(super) async fn budget_claims(&self) -> Option<BudgetClaims> {
        let read = tokio::time::timeout(Duration::from_secs(2), self.budget_kv.get(TOKENS_KEY));
        let bytes = read.await.ok()?.ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Shares the team token budget through slices when there is one. A restarted node holds
    /// again what it claimed before (its usage is restored from its journal too).
    pub(super) async fn share_budget(self: &Arc<Self>) {
        let budget = self.supervisor.config().safety.budget.tokens_per_team;
        if budget == 0 {
            return;
        }
        let slice = match self.config.budget_slice_tokens {
            0 => (budget / 10).max(1),
            n => n,
        };
        let held = self
            .budget_claims()
            .await
            .and_then(|c| c.nodes.get(&self.config.node).copied())
            .unwrap_or(0);
        let slices = Arc::new(Slices {
            cluster: Arc::downgrade(self),
            budget,
            slice,
        });
        self.supervisor.set_budget_slices(slices, held);
    }
}
