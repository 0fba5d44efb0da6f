//! `GET /healthz`, `GET /metrics`, `GET /api/openapi.json`.

use crate::server::api::*;
use crate::{
    server::events::EventHub,
    server::metrics::{self},
};
use actix_web::{web, HttpResponse};

/// `200 {"status": "ok"}`, or `503 {"status": "degraded", "journal": …}` while the journal cannot
/// write (no event is accepted and no turn starts meanwhile).
pub(crate) async fn healthz(state: web::Data<ApiState>) -> HttpResponse {
    // A cluster node cut off from JetStream starts no model call: degraded too.
    if let Some(reason) = state.cluster.as_ref().and_then(|c| c.fail_safe()) {
        return HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({ "status": "degraded", "cluster": reason }));
    }
    match state.supervisor.journal_degraded() {
        None => HttpResponse::Ok().json(serde_json::json!({ "status": "ok" })),
        Some(reason) => HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({ "status": "degraded", "journal": reason })),
    }
}

pub(crate) async fn openapi(_: Reader) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}

pub(crate) async fn metrics_text(_: Reader, state: web::Data<ApiState>) -> HttpResponse {
    let journal = state.journal.as_ref().map(|j| {
        let stats = j.stats();
        metrics::JournalNumbers {
            committed_seq: stats.committed_seq,
            commits: stats.commits,
            durable_waits: stats.durable_waits,
            failed_batches: stats.failed_batches,
            write_error: j.last_error().is_some(),
        }
    });
    let snapshot = metrics::Snapshot {
        statuses: state.supervisor.statuses(),
        fleet: state.supervisor.fleet_view(),
        trips: state.supervisor.safety_report().await.map(|r| r.trips),
        journal,
        interventions_pending: state.bus.as_ref().map(|b| b.pending().len()),
        stream_subscribers: state.events.as_ref().map(EventHub::subscribers),
        halt_agent: state.metrics.halt_agent.snapshot(),
        halt_all: state.metrics.halt_all.snapshot(),
        provider_retries: warden_actors::retry_counts().to_vec(),
        provider_limits: warden_actors::provider_limit_stats(),
        otel: crate::telemetry::stats(),
    };
    let mut body = metrics::render(&snapshot);
    if let Some(cluster) = &state.cluster {
        body.push_str(&cluster.metrics());
    }
    HttpResponse::Ok()
        .content_type(metrics::CONTENT_TYPE)
        .body(body)
}
