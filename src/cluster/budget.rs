//! The team budgets across nodes: `safety.budget.tokens_per_team` and `cost_per_team` are the
//! whole cluster's. The keys `tokens` and `cost` in the bucket `warden_budget` hold
//! [`BudgetClaims`] `{budget, claimed, nodes}` (`cost` in nano-units, 1e-9 of the price currency,
//! so that both are integers grown by compare-and-swap); a node spends only the slices it claimed.
//!
//! * A model call that would spend past what the node holds of either budget waits while the
//!   node claims one more slice of it (`cluster.budget_slice_tokens` / `budget_slice_cost`,
//!   default a tenth of the budget; the last one is what is left) by compare-and-swap (`update`
//!   over the revision read; `create` for the first).
//! * `claimed` never passes `budget`, and each node spends at most what it holds (plus, as on one
//!   node, one call per agent running at once): the team never overshoots by more than that. A
//!   slice a node holds and does not spend is lost to the others (under-use: at most one slice a
//!   node).
//! * No slice left, or JetStream not answering within [`CLAIM_FOR`]: nothing is granted and the
//!   call is stopped by the budget, as on one node.

use super::Cluster;
use async_nats::jetstream::kv;
use futures::future::BoxFuture;
use std::{
    sync::{Arc, Weak},
    time::Duration,
};
use warden_actors::{BudgetSlices, SliceOf};
use warden_protocols::cluster::BudgetClaims;

/// The bucket of the shared budget.
pub const BUDGET_BUCKET: &str = "warden_budget";
/// The key of the team token budget.
pub(super) const TOKENS_KEY: &str = "tokens";
/// The key of the team cost budget (in nano-units).
pub(super) const COST_KEY: &str = "cost";
/// Nano-units of cost in one unit of the price currency.
const NANOS: f64 = 1e9;

fn to_nanos(cost: f64) -> u64 {
    if cost.is_finite() && cost > 0.0 {
        (cost * NANOS).round() as u64 // saturates
    } else {
        0
    }
}

/// The budget behind a key: (key, budget, slice), in tokens or nano-units.
#[derive(Debug, Clone, Copy)]
struct Shared {
    key: &'static str,
    budget: u64,
    slice: u64,
}
/// How long one claim may take (every JetStream round trip and compare-and-swap retry included).
pub(super) const CLAIM_FOR: Duration = Duration::from_secs(5);

/// The slices as the team budget asks for them.
struct Slices {
    cluster: Weak<Cluster>,
    /// `safety.budget.tokens_per_team` and its slice here (the budget is used when this node
    /// creates the key); `None` without a token budget.
    tokens: Option<Shared>,
    /// The same for `cost_per_team`, in nano-units.
    cost: Option<Shared>,
}

impl BudgetSlices for Slices {
    fn claim(&self, of: SliceOf) -> BoxFuture<'static, u64> {
        let shared = match of {
            SliceOf::Tokens => self.tokens,
            SliceOf::Cost => self.cost,
        };
        let (Some(cluster), Some(shared)) = (self.cluster.upgrade(), shared) else {
            return Box::pin(async { 0 });
        };
        Box::pin(async move {
            tokio::time::timeout(CLAIM_FOR, cluster.claim_slice(shared))
                .await
                .unwrap_or(0)
        })
    }
}

impl Cluster {
    /// One slice (at most `slice`, what is left of the budget) added to `claimed` of `key` by
    /// compare-and-swap, retried while another node's write came first. 0: none left.
    async fn claim_slice(&self, shared: Shared) -> u64 {
        let Shared { key, budget, slice } = shared;
        loop {
            let entry = match self.budget_kv.entry(key).await {
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
                match self.budget_kv.create(key, body.into()).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Err(true),
                    Err(_) => Err(false),
                }
            } else {
                match self.budget_kv.update(key, body.into(), revision).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Err(true),
                    Err(_) => Err(false),
                }
            };
            match written {
                Ok(()) => return grant,
                // Another node's claim came first: read again at once.
                Err(true) => {}
                // The write failed (no quorum, a timeout): read again after a pause, not in a spin.
                Err(false) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The shared budget of `key` as JetStream has it now (`GET /api/cluster`'s `budget`), if any.
    pub(super) async fn budget_claims(&self, key: &str) -> Option<BudgetClaims> {
        let read = tokio::time::timeout(Duration::from_secs(2), self.budget_kv.get(key));
        let bytes = read.await.ok()?.ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Shares the team budgets through slices when there are any. A restarted node holds again
    /// what it claimed before (its usage is restored from its journal too).
    pub(super) async fn share_budget(self: &Arc<Self>) {
        let budget = &self.supervisor.config().safety.budget;
        let tokens = (budget.tokens_per_team > 0).then(|| Shared {
            key: TOKENS_KEY,
            budget: budget.tokens_per_team,
            slice: match self.config.budget_slice_tokens {
                0 => (budget.tokens_per_team / 10).max(1),
                n => n,
            },
        });
        let cost_budget = to_nanos(budget.cost_per_team);
        let cost = (cost_budget > 0).then(|| Shared {
            key: COST_KEY,
            budget: cost_budget,
            slice: match to_nanos(self.config.budget_slice_cost) {
                0 => (cost_budget / 10).max(1),
                n => n,
            },
        });
        if tokens.is_none() && cost.is_none() {
            return;
        }
        let mut held = [0_u64; 2];
        for (slot, shared) in held.iter_mut().zip([tokens, cost]) {
            if let Some(shared) = shared {
                *slot = self
                    .budget_claims(shared.key)
                    .await
                    .and_then(|c| c.nodes.get(&self.config.node).copied())
                    .unwrap_or(0);
            }
        }
        let slices = Arc::new(Slices {
            cluster: Arc::downgrade(self),
            tokens,
            cost,
        });
        self.supervisor
            .set_budget_slices(slices, held[0], held[1] as f64 / NANOS);
    }

    /// `GET /api/cluster`'s `budget`: what this node holds and used of each shared budget, and the
    /// shared keys as read now (`with_shared`: not while cut off, it would only wait). Cost figures
    /// are in the price currency, under `cost`. `Null` without a shared budget.
    pub(super) async fn budget_status(&self, with_shared: bool) -> serde_json::Value {
        let view = self.supervisor.fleet_view();
        let mut out = serde_json::Map::new();
        if let Some(held) = self.supervisor.budget_held() {
            out.insert("held".into(), held.into());
            out.insert("used".into(), view.tokens.into());
            if with_shared {
                let shared = self.budget_claims(TOKENS_KEY).await;
                out.insert("shared".into(), serde_json::json!(shared));
            }
        }
        if let Some(held) = self.supervisor.budget_held_cost() {
            let mut cost = serde_json::json!({"held": held, "used": view.cost});
            if with_shared {
                cost["shared"] = match self.budget_claims(COST_KEY).await {
                    Some(c) => serde_json::json!({
                        "budget": c.budget as f64 / NANOS,
                        "claimed": c.claimed as f64 / NANOS,
                        "nodes": c.nodes.iter()
                            .map(|(node, n)| (node.clone(), *n as f64 / NANOS))
                            .collect::<std::collections::BTreeMap<_, _>>(),
                    }),
                    None => serde_json::Value::Null,
                };
            }
            out.insert("cost".into(), cost);
        }
        if out.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::Object(out)
        }
    }
}
