//! warden's agents as A2A servers (A2A 1.0, JSON-RPC binding; docs/a2a.md).
//!
//! * [`card`]: `GET /.well-known/agent-card.json`, open like A2A discovery expects: one card for
//!   the server, one skill per agent this node runs (docs/design-decisions.md says why).
//! * [`jsonrpc`]: `POST /a2a`, the JSON-RPC endpoint the card names: the envelope, the methods'
//!   dispatch (1.0 names and the 0.3 ones), the tokens (the admin token sends and cancels, the read
//!   token gets, lists and subscribes), and the errors.
//! * [`tasks`]: a task is a warden user event (`AGENT/EVENT_ID`): its state is read from the
//!   event's fate in the journal, so tasks outlive a restart as events do; cancel is a halt.
//! * `stream`: `SendStreamingMessage` and `SubscribeToTask` over Server-Sent Events.
//! * [`push`]: push-notification configs, and their webhook POSTs (retried, never blocking).
//!
//! Not in `api::ROUTES` nor `openapi.json`: a protocol endpoint, like `/mcp`.

pub mod card;
pub mod jsonrpc;
pub mod push;
mod stream;
pub mod tasks;

use actix_web::{web, HttpRequest, HttpResponse, ResponseError};

/// The JSON-RPC endpoint's path.
pub const ENDPOINT: &str = "/a2a";

/// Registers the card and the endpoint (inside [`crate::server::api::configure`]). Another method
/// on either path is `405 {"error"}` with `Allow`, as the API's routes answer.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource(warden_protocols::a2a::AGENT_CARD_PATH)
            .route(web::get().to(card::agent_card))
            .default_service(web::to(|req: HttpRequest| async move {
                not_allowed(&req, "GET")
            })),
    )
    .service(
        web::resource(ENDPOINT)
            .route(web::post().to(jsonrpc::endpoint))
            .default_service(web::to(|req: HttpRequest| async move {
                not_allowed(&req, "POST")
            })),
    );
}

fn not_allowed(req: &HttpRequest, allow: &'static str) -> HttpResponse {
    let mut response = crate::server::api::ApiError::new(
        actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} {} is not served; allowed: {allow}",
            req.method(),
            req.path()
        ),
    )
    .error_response();
    response.headers_mut().insert(
        actix_web::http::header::ALLOW,
        actix_web::http::header::HeaderValue::from_static(allow),
    );
    response
}
