//! `GET /.well-known/agent-card.json`: the server's A2A agent card.
//!
//! One card for the server with one skill per agent this node runs (skill id = agent key), rather
//! than a card per agent: A2A discovery reads one well-known path per origin, and every agent is
//! reached through the same endpoint and tokens. The card is open (no token): A2A clients fetch it
//! before they know which credentials to send; it names the agents, nothing more.

use super::ENDPOINT;
use crate::server::api::ApiState;
use actix_web::{web, HttpRequest, HttpResponse};
use warden_protocols::a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentSkill, HttpAuthSecurityScheme,
    SecurityRequirement, SecurityScheme, StringList, PROTOCOL_VERSION,
};

/// The security scheme's name in the card.
pub const BEARER_SCHEME: &str = "bearer";

/// The card as `req` reaches this server (the endpoint URL uses the request's scheme and host).
pub fn card_for(state: &ApiState, req: &HttpRequest) -> AgentCard {
    let info = req.connection_info();
    let url = format!("{}://{}{ENDPOINT}", info.scheme(), info.host());
    let skills = state
        .supervisor
        .statuses()
        .into_iter()
        .filter(|s| super::tasks::exposed(state, s.key.as_str()))
        .map(|s| {
            let role = format!("{:?}", s.role).to_lowercase();
            AgentSkill {
                id: s.key.to_string(),
                name: s.key.to_string(),
                description: format!(
                    "warden agent {} ({role}): send it a text message with \
                     metadata.agent = \"{}\"",
                    s.key, s.key
                ),
                tags: vec!["warden".into(), role],
            }
        })
        .collect();
    AgentCard {
        name: "warden".into(),
        description: "A team of LLM agents under warden's supervisor: each skill is an agent; \
                      name it in the message's metadata.agent (the first one otherwise)."
            .into(),
        supported_interfaces: vec![AgentInterface {
            url: url.clone(),
            protocol_binding: "JSONRPC".into(),
            protocol_version: PROTOCOL_VERSION.into(),
        }],
        version: env!("CARGO_PKG_VERSION").into(),
        capabilities: AgentCapabilities {
            streaming: true,
            push_notifications: true,
        },
        security_schemes: [(
            BEARER_SCHEME.to_owned(),
            SecurityScheme {
                http_auth_security_scheme: Some(HttpAuthSecurityScheme {
                    scheme: "Bearer".into(),
                    description: "warden's API tokens: the admin token sends and cancels, the \
                                  read token gets, lists and subscribes"
                        .into(),
                }),
            },
        )]
        .into(),
        security_requirements: vec![SecurityRequirement {
            schemes: [(BEARER_SCHEME.to_owned(), StringList::default())].into(),
        }],
        default_input_modes: vec!["text/plain".into()],
        default_output_modes: vec!["text/plain".into()],
        skills,
        url: Some(url),
        preferred_transport: Some("JSONRPC".into()),
    }
}

pub(crate) async fn agent_card(state: web::Data<ApiState>, req: HttpRequest) -> HttpResponse {
    HttpResponse::Ok().json(card_for(&state, &req))
}
