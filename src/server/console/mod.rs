//! The operator console: a browser page served by `warden serve` at `/`, from files embedded in the
//! binary (`assets/`: HTML, CSS and plain JavaScript — no build step, no CDN, works offline).
//!
//! Routes (pages, not REST: they are not in [`crate::server::api::ROUTES`]):
//! * `GET /` — the console for a logged-in browser, else `303` to the login page;
//! * `GET /console/login`, `POST /console/login` (form field `token`: the admin or the read token)
//!   — success sets the `warden_session` cookie (HttpOnly, SameSite=Strict, Path=/) and the
//!   `warden_csrf` cookie (readable by the page) and redirects to `/`; a wrong token sets no cookie
//!   and shows the login page again with an error (`401`);
//! * `POST /console/logout` — ends the session, clears both cookies;
//! * `POST /console/halt` — HALT ALL from a plain form (no JavaScript needed): admin session, the
//!   form's `csrf` field equal to the session's token and its `confirm` box ticked;
//! * `GET /console/assets/{name}` — the stylesheet and the script.
//!
//! The session cookie also authenticates `/api/*` (see `access_of` in `server::api`), with
//! the role of the token the session logged in with; a cookie-authenticated request other than
//! `GET` must carry `X-CSRF-Token` equal to the session's token, else `403`. The bearer-token API
//! is unchanged. Every page is sent with a `Content-Security-Policy` that allows no inline script,
//! `X-Frame-Options: DENY` and `Cache-Control: no-store`.

mod session;

pub use session::{Session, Sessions, MAX_SESSIONS};

use super::api::{access_of_token, Access, ApiError, ApiState};
use actix_web::{
    http::{header, StatusCode},
    web, HttpRequest, HttpResponse,
};

/// How long a console session lasts by default (`api.session_ttl_seconds`): 8 hours, a shift.
pub const DEFAULT_SESSION_TTL_SECONDS: u64 = 8 * 60 * 60;

/// The session cookie (HttpOnly).
pub const SESSION_COOKIE: &str = "warden_session";
/// The CSRF cookie (readable by the page, echoed in `X-CSRF-Token`).
pub const CSRF_COOKIE: &str = "warden_csrf";
/// The header a cookie-authenticated mutating request carries.
pub const CSRF_HEADER: &str = "X-CSRF-Token";

const INDEX: &str = include_str!("assets/index.html");
const LOGIN: &str = include_str!("assets/login.html");
const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// What the console's pages allow: their own script and style only, nothing inline, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Registers the console's routes.
pub(crate) fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .route("/console/login", web::get().to(login_page))
        .route("/console/login", web::post().to(login))
        .route("/console/logout", web::post().to(logout))
        .route("/console/halt", web::post().to(halt_form))
        .route("/console/assets/{name}", web::get().to(asset));
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// The live session the request's cookie names, if any.
fn session_of(state: &ApiState, req: &HttpRequest) -> Option<(String, Session)> {
    let id = cookie(req, SESSION_COOKIE)?;
    state.console.get(id).map(|s| (id.to_owned(), s))
}

/// The access a console session cookie gives `req`, for [`crate::server::api::access_of`]:
/// `None` without a session cookie; `401` for a cookie whose session expired or is unknown (a
/// restart ends every session); `403` for a request other than `GET`/`HEAD` whose
/// `X-CSRF-Token` is missing or is not the session's.
pub(crate) fn cookie_access(
    state: &ApiState,
    req: &HttpRequest,
) -> Result<Option<Access>, ApiError> {
    let Some(id) = cookie(req, SESSION_COOKIE) else {
        return Ok(None);
    };
    let Some(session) = state.console.get(id) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the console session has expired or is unknown (sessions end after \
             api.session_ttl_seconds and when the server restarts): log in again at \
             /console/login, or send a bearer token",
        ));
    };
    if !req.method().is_safe() {
        let given = req
            .headers()
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !session.csrf_matches(given) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "a request authenticated by the console's session cookie needs X-CSRF-Token \
                 equal to the warden_csrf cookie",
            ));
        }
    }
    Ok(Some(session.access))
}

/// A page with the console's security headers.
fn page(status: StatusCode, content_type: &str, body: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status)
        .content_type(content_type)
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "same-origin"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(body.into())
}

/// `303 See Other` to `location`.
fn see_other(location: &str) -> actix_web::HttpResponseBuilder {
    let mut response = HttpResponse::SeeOther();
    response
        .insert_header((header::LOCATION, location.to_owned()))
        .insert_header((header::CACHE_CONTROL, "no-store"));
    response
}

/// Escapes text for HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `GET /`: the console, or the login page's address.
async fn index(state: web::Data<ApiState>, req: HttpRequest) -> HttpResponse {
    let Some((_, session)) = session_of(&state, &req) else {
        // A cookie that names no live session: it expired, or the server restarted.
        let to = if cookie(&req, SESSION_COOKIE).is_some() {
            "/console/login?expired"
        } else {
            "/console/login"
        };
        return see_other(to).finish();
    };
    let role = match session.access {
        Access::Admin => "admin",
        Access::Read => "read",
    };
    let body = INDEX
        .replace("{{CSRF}}", &session.csrf)
        .replace("{{ROLE}}", role)
        .replace("{{TTL}}", &session.remaining().as_secs().to_string());
    page(StatusCode::OK, "text/html; charset=utf-8", body)
}

/// The login page, with an error message (escaped) or none.
fn login_with(status: StatusCode, error: Option<&str>) -> HttpResponse {
    let error = error.map_or(String::new(), |e| {
        format!(
            "<p class=\"error\" role=\"alert\" id=\"login-error\">⚠ {}</p>",
            escape(e)
        )
    });
    page(
        status,
        "text/html; charset=utf-8",
        LOGIN.replace("{{ERROR}}", &error),
    )
}

/// `GET /console/login`.
async fn login_page(req: HttpRequest) -> HttpResponse {
    let expired = req.query_string().contains("expired");
    login_with(
        StatusCode::OK,
        expired.then_some("Your session has ended. Log in again."),
    )
}

/// The login form.
#[derive(Debug, serde::Deserialize)]
struct LoginForm {
    token: String,
}

/// Whether a browser's `Origin` (when sent) is this server: a form posted from another site is
/// refused (the SameSite cookies already keep the session from being used there; this also stops
/// a login forced from elsewhere). The pages' `Referrer-Policy: same-origin` keeps the browser
/// sending the real origin on their own posts (with `no-referrer` it sends `Origin: null`).
fn same_origin(req: &HttpRequest) -> bool {
    let Some(origin) = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
    else {
        return true;
    };
    let host = req.connection_info().host().to_owned();
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    bare == Some(host.as_str())
}

fn cross_site() -> HttpResponse {
    page(
        StatusCode::FORBIDDEN,
        "text/plain; charset=utf-8",
        "refused: a console form posted from another origin",
    )
}

/// `Set-Cookie` values for a session (or, with `max_age` 0, their removal).
fn cookies(req: &HttpRequest, id: &str, csrf: &str, max_age: u64) -> [String; 2] {
    // Secure only behind a TLS-terminating proxy that says so: on plain http (the loopback default)
    // a Secure cookie would never come back.
    let secure = req
        .headers()
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let secure = if secure { "; Secure" } else { "" };
    [
        format!(
            "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"
        ),
        format!("{CSRF_COOKIE}={csrf}; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"),
    ]
}

/// `POST /console/login`: the admin or read token opens a session.
async fn login(
    state: web::Data<ApiState>,
    req: HttpRequest,
    form: Option<web::Form<LoginForm>>,
) -> HttpResponse {
    if !same_origin(&req) {
        return cross_site();
    }
    let addr = req.peer_addr().map(|a| a.ip());
    if let Some((addr, seconds)) =
        addr.and_then(|addr| state.auth_failures.check(addr).err().map(|s| (addr, s)))
    {
        tracing::warn!(%addr, "console login refused: too many wrong tokens");
        let mut response = login_with(
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "Too many wrong tokens from {addr}: try again in {seconds} s."
            )),
        );
        if let Ok(value) = header::HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    let token = form.map(|f| f.into_inner().token).unwrap_or_default();
    let Some(access) = access_of_token(&state.config, token.trim()) else {
        tracing::warn!("console login refused: wrong token");
        if let Some(addr) = addr {
            state.auth_failures.failed(addr);
        }
        return login_with(
            StatusCode::UNAUTHORIZED,
            Some("That token is not the admin token nor the read token."),
        );
    };
    let (id, session) = state.console.open(access);
    tracing::info!(?access, "console login");
    let mut response = see_other("/");
    for cookie in cookies(&req, &id, &session.csrf, state.console.ttl().as_secs()) {
        response.append_header((header::SET_COOKIE, cookie));
    }
    response.finish()
}

/// A console form's CSRF field (and HALT ALL's confirmation box).
#[derive(Debug, serde::Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: Option<String>,
}

/// The session of a console form post whose `csrf` field is the session's token.
fn form_session(
    state: &ApiState,
    req: &HttpRequest,
    form: &Option<web::Form<CsrfForm>>,
) -> Result<(String, Session), Box<HttpResponse>> {
    if !same_origin(req) {
        return Err(Box::new(cross_site()));
    }
    let Some((id, session)) = session_of(state, req) else {
        return Err(Box::new(see_other("/console/login?expired").finish()));
    };
    let given = form.as_ref().map_or("", |f| f.csrf.as_str());
    if !session.csrf_matches(given) {
        return Err(Box::new(page(
            StatusCode::FORBIDDEN,
            "text/plain; charset=utf-8",
            "refused: the form's CSRF token is missing or wrong (reload the console)",
        )));
    }
    Ok((id, session))
}

/// `POST /console/logout`.
async fn logout(
    state: web::Data<ApiState>,
    req: HttpRequest,
    form: Option<web::Form<CsrfForm>>,
) -> HttpResponse {
    let (id, _) = match form_session(&state, &req, &form) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    state.console.close(&id);
    let mut response = see_other("/console/login");
    for cookie in cookies(&req, "", "", 0) {
        response.append_header((header::SET_COOKIE, cookie));
    }
    response.finish()
}

/// Who a HALT ALL from the plain form is journaled as, on a cluster (the halt key's `by`).
const CONSOLE_OPERATOR: &str = "console:admin";

/// `POST /console/halt`: HALT ALL from the plain form; back to `/` with how many were halted.
async fn halt_form(
    state: web::Data<ApiState>,
    req: HttpRequest,
    form: Option<web::Form<CsrfForm>>,
) -> HttpResponse {
    let session = match form_session(&state, &req, &form) {
        Ok((_, session)) => session,
        Err(response) => return *response,
    };
    if session.access != Access::Admin {
        return page(
            StatusCode::FORBIDDEN,
            "text/plain; charset=utf-8",
            "refused: HALT ALL needs a session opened with the admin token",
        );
    }
    if form.as_ref().and_then(|f| f.confirm.as_deref()).is_none() {
        return see_other("/?halt=unconfirmed").finish();
    }
    let started = tokio::time::Instant::now();
    // On a cluster node, HALT ALL is the cluster's halt (every node), as `POST /api/halt` is.
    let acks = match &state.cluster {
        Some(cluster) => {
            let halt = cluster
                .halt("HALT ALL from the console form", CONSOLE_OPERATOR)
                .await;
            let remote: usize = halt.remote.values().map(|n| n.halted.len()).sum();
            state.metrics.halt_all.observe(started.elapsed());
            let halted = halt.local.len() + remote;
            tracing::warn!(
                agents = halted,
                unanswered = ?halt.unanswered,
                "HALT ALL of the cluster from the console form"
            );
            if let Some(cause) = halt.local.iter().find_map(|a| a.not_durable.as_ref()) {
                return not_durable(halted, cause);
            }
            return see_other(&format!("/?halted={halted}")).finish();
        }
        None => state.supervisor.halt_all().await,
    };
    state.metrics.halt_all.observe(started.elapsed());
    tracing::warn!(agents = acks.len(), "HALT ALL from the console form");
    if let Some(cause) = acks.iter().find_map(|a| a.not_durable.as_ref()) {
        return not_durable(acks.len(), cause);
    }
    see_other(&format!("/?halted={}", acks.len())).finish()
}

/// The answer to a HALT ALL applied to `halted` agents whose journal could not make it durable.
fn not_durable(halted: usize, cause: &impl std::fmt::Display) -> HttpResponse {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        format!("HALT ALL applied to {halted} agents but not durable: {cause}"),
    )
}

/// `GET /console/assets/{name}`.
async fn asset(name: web::Path<String>) -> HttpResponse {
    let (content_type, body) = match name.as_str() {
        "console.css" => ("text/css; charset=utf-8", CSS),
        "console.js" => ("text/javascript; charset=utf-8", JS),
        _ => {
            return page(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "no such console asset",
            )
        }
    };
    // Embedded in the binary: they change only with it. Revalidate on each load.
    let mut response = page(StatusCode::OK, content_type, body);
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escape_covers_html_metacharacters() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}
