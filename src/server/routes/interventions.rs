//! Limit and permission asks: `GET /api/interventions`, `POST /api/interventions/{id}`.

use crate::server::api::*;
use actix_web::{http::StatusCode, web, HttpResponse};
use serde::{Deserialize, Serialize};
use warden_actors::safety::AnswerError;
use warden_protocols::{Answer, OperatorReply};

pub(crate) async fn list_interventions(_: Reader, state: web::Data<ApiState>) -> Handled {
    let pending = state
        .bus
        .as_ref()
        .map(|bus| bus.pending())
        .unwrap_or_default();
    Ok(HttpResponse::Ok().json(pending))
}

/// `POST /api/interventions/{id}` body: `{"answer": "yes"}` (`yes`/`y`, `no`/`n`; anything else is
/// a no), with an optional `note`, journaled with the decision (`limit_decided.decision.answered_by`,
/// or `permission_decided.decision.answered_by` for a permission ask: yes runs the tool).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    /// `yes`/`y` or `no`/`n` (trimmed, any case); anything else counts as no.
    pub answer: String,
    /// Free text journaled with the decision; `None`: no note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What `POST /api/interventions/{id}` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerReply {
    /// The intervention answered.
    pub id: u64,
    /// The answer as it was understood.
    pub answer: Answer,
    /// The note given with it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

pub(crate) async fn answer_intervention(
    _: Admin,
    state: web::Data<ApiState>,
    id: web::Path<String>,
    body: web::Json<AnswerBody>,
) -> Handled {
    let id: u64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("intervention id must be a number, not {:?}", id.as_str()),
        )
    })?;
    let not_pending = |id: u64| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no pending intervention with id {id}"),
        )
    };
    let bus = state.bus.as_ref().ok_or_else(|| not_pending(id))?;
    let AnswerBody { answer, note } = body.into_inner();
    let answer = Answer::parse(&answer);
    // Who answered and the note go with the answer: the agent journals them in `limit_decided`
    // (a limit ask) or `permission_decided` (a permission ask).
    bus.reply(
        id,
        OperatorReply::by(answer.clone(), API_OPERATOR, note.clone()),
    )
    .map_err(|AnswerError::Unknown(id)| not_pending(id))?;
    tracing::info!(
        id,
        operator = API_OPERATOR,
        answer = %answer,
        note = note.as_deref().unwrap_or(""),
        "intervention answered"
    );
    Ok(HttpResponse::Ok().json(AnswerReply { id, answer, note }))
}
