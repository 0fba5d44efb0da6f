//! The route table ([`ROUTES`]): the one registration of the API's routes, `405`/`404` for what
//! it does not serve, and [`configure`].

use crate::server::api::*;
use actix_web::{
    http::{header, Method, StatusCode},
    web, HttpRequest, HttpResponse, ResponseError,
};

/// Whether `path` fits the route pattern `pattern` (`{name}` matches one non-empty segment).
pub(crate) fn path_matches(pattern: &str, path: &str) -> bool {
    let mut want = pattern.split('/');
    let mut got = path.split('/');
    loop {
        match (want.next(), got.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) if w.starts_with('{') && w.ends_with('}') => {
                if g.is_empty() {
                    return false;
                }
            }
            (Some(w), Some(g)) if w == g => {}
            _ => return false,
        }
    }
}

/// The methods [`ROUTES`] serves on `path` (empty when no route has that path).
pub fn allowed_methods(path: &str) -> Vec<&'static str> {
    ROUTES
        .iter()
        .filter(|(_, pattern)| path_matches(pattern, path))
        .map(|(method, _)| *method)
        .collect()
}

/// What no route answers: `405 {"error"}` with `Allow` for a served path asked with another method,
/// else `404 {"error"}`.
pub(crate) async fn no_route(req: HttpRequest) -> HttpResponse {
    let path = req.path();
    let allowed = allowed_methods(path);
    if allowed.is_empty() {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no route {path} (GET /api/openapi.json lists the routes)"),
        )
        .error_response();
    }
    let allow = allowed.join(", ");
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} {path} is not served; allowed: {allow}", req.method()),
    )
    .error_response();
    if let Ok(value) = header::HeaderValue::from_str(&allow) {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

/// Declares [`ROUTES`] and `register` from one list, so they cannot differ.
macro_rules! routes {
    ($($method:ident $path:literal => $handler:path),* $(,)?) => {
        /// Every `(method, path)` the API serves, in OpenAPI spelling (`{key}` is a path parameter).
        /// One method per path: a second route on a served path would be answered 405 by the first.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn register(cfg: &mut web::ServiceConfig) {
            $(cfg.route($path, web::method(Method::$method).to($handler));)*
        }
    };
}

routes! {
    GET "/healthz" => healthz,
    GET "/metrics" => metrics_text,
    GET "/api/openapi.json" => openapi,
    GET "/api/agents" => list_agents,
    GET "/api/agents/{key}" => get_agent,
    POST "/api/agents/{key}/events" => post_event,
    GET "/api/agents/{key}/events/{id}" => get_event,
    POST "/api/agents/{key}/world" => post_world,
    POST "/api/world/batch" => post_world_batch,
    GET "/api/replies" => crate::server::routes::replies::get_replies,
    POST "/api/world/presence" => post_presence,
    POST "/api/world/clock" => post_clock,
    POST "/api/halt" => halt_all,
    POST "/api/resume" => lift_halt,
    POST "/api/agents/{key}/halt" => halt_agent,
    POST "/api/agents/{key}/unlock" => unlock,
    POST "/api/agents/{key}/emergency/clear" => clear,
    POST "/api/agents/{key}/history/reset" => reset_history,
    PUT "/api/agents/{key}/goals" => set_goals,
    GET "/api/agents/{key}/memories" => get_memories,
    DELETE "/api/agents/{key}/memories/{id}" => delete_memory,
    DELETE "/api/memories" => forget_about,
    POST "/api/agents/{key}/pause" => pause,
    POST "/api/agents/{key}/resume" => resume,
    GET "/api/interventions" => list_interventions,
    POST "/api/interventions/{id}" => answer_intervention,
    GET "/api/events" => events,
    GET "/api/events/recent" => recent_events,
    GET "/api/fleet" => fleet,
    GET "/api/cluster" => cluster_status,
    GET "/api/breakers/recent" => recent_trips,
}

/// The OpenAPI 3.1 description of [`ROUTES`], served at `GET /api/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Registers the routes with `state`: `App::new().configure(api::configure(state))`.
pub fn configure(state: ApiState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        let limit = state.config.limit();
        cfg.app_data(web::Data::new(state))
            .app_data(
                web::JsonConfig::default()
                    .limit(limit)
                    .error_handler(json_error),
            )
            .app_data(web::QueryConfig::default().error_handler(query_error))
            .app_data(web::PathConfig::default().error_handler(path_error));
        // The one registration of the API's routes: a route that answers differently on a cluster
        // node asks the cluster in its handler (`crate::server::cluster`).
        register(cfg);
        // `/mcp` is a protocol endpoint, not a REST route: it answers JSON-RPC, serves the read
        // token too on POST, and takes three methods; it is not in `ROUTES` nor `openapi.json`.
        #[cfg(feature = "mcp-server")]
        crate::server::mcp::configure(cfg);
        // A2A (`/.well-known/agent-card.json`, `/a2a`): a protocol endpoint too, like `/mcp`.
        crate::server::a2a::configure(cfg);
        // The browser console (`/`, `/console/…`): pages, not REST routes, so not in `ROUTES`.
        crate::server::console::configure(cfg);
        cfg.default_service(web::to(no_route));
    }
}
