//! The operator console: a browser page served by `warden serve` at `/`, from files embedded in the
//! binary (`assets/`: HTML, CSS and plain JavaScript — no build step, no CDN, works offline).
//!
//! Routes (pages, not REST: they are not in [`crate::server::api::ROUTES`]):
//! * `GET /` — the console for a logged-in browser, else `303` to the login page;
//! * `GET /console/login`, `POST /console/login` (form field `token`: the admin or the read token)
//!   — success sets the `warden_session` cookie (HttpOnly, SameSite=Strict, Path=/) and the
//!   informational `warden_csrf` cookie (`__Host-…` and `Secure` over https) and redirects to `/`;
//!   a wrong token sets no cookie and shows the login page again with an error (`401`, or `429`
//!   past `api.auth_failures_per_minute`: the right token is never refused for a rate);
//! * `POST /console/logout` — ends the session, clears both cookies;
//! * `POST /console/halt` — HALT ALL from a plain form (no JavaScript needed): admin session, the
//!   form's `csrf` field equal to the session's token and its `confirm` box ticked;
//! * `GET /console/assets/{name}` — the stylesheet and the script.
//!
//! The session cookie also authenticates `/api/*` (see `access_of` in `server::api`), with
//! the role of the token the session logged in with; a cookie-authenticated request other than
//! `GET` must carry `X-CSRF-Token` equal to the session's token, else `403`. The page holds that
//! token (written into it by `GET /`), never a cookie: a page on another port of this host can
//! overwrite cookies. A request with several session cookies (one tossed in from another port) is
//! told apart by that token, or refused `400` as ambiguous — never taken by its first cookie, never
//! a logout. The bearer-token API
//! is unchanged. Every page is sent with a `Content-Security-Policy` that allows no inline script,
//! `X-Frame-Options: DENY` and `Cache-Control: no-store`.

mod session;

pub use session::{Session, Sessions, MAX_SESSIONS};

use super::api::{access_of_token, Access, ApiError, ApiState};
use actix_web::{
    http::{header, StatusCode},
    web, HttpRequest, HttpResponse, ResponseError,
};

pub use crate::team::api::DEFAULT_SESSION_TTL_SECONDS;

/// The session cookie (HttpOnly) over plain http.
pub const SESSION_COOKIE: &str = "warden_session";
/// The session cookie over https (`__Host-`: only this host's https pages can set it, with
/// `Secure`, `Path=/` and no `Domain`).
pub const SECURE_SESSION_COOKIE: &str = "__Host-warden_session";
/// The CSRF cookie over plain http: informational only (scripts may read their token from the
/// login's answer). Neither the server nor the console reads it: the console's token is the one
/// in the page, which no other site can overwrite.
pub const CSRF_COOKIE: &str = "warden_csrf";
/// The CSRF cookie over https.
pub const SECURE_CSRF_COOKIE: &str = "__Host-warden_csrf";
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

/// Whether the browser reached this server over https (directly, or through a TLS-terminating
/// proxy that says so with `X-Forwarded-Proto: https`): the cookies are then `Secure` and named
/// `__Host-…`.
fn https(req: &HttpRequest) -> bool {
    req.app_config().secure()
        || req
            .headers()
            .get("x-forwarded-proto")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// The session cookie's name for this request's scheme.
fn session_cookie_name(req: &HttpRequest) -> &'static str {
    if https(req) {
        SECURE_SESSION_COOKIE
    } else {
        SESSION_COOKIE
    }
}

/// Every value of cookie `name` in the request's `Cookie` headers, in the order sent.
fn cookies_named<'a>(req: &'a HttpRequest, name: &str) -> Vec<&'a str> {
    req.headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .collect()
}

/// The session cookies the request carries.
fn session_ids(req: &HttpRequest) -> Vec<&str> {
    cookies_named(req, session_cookie_name(req))
}

/// `Set-Cookie` values that delete the session cookie at every path, other than `/` (the
/// console's own), that a browser sends with a request for this request's path: where a page on
/// another port of this host (cookies do not isolate ports) can put a second `warden_session`.
fn clear_tossed(req: &HttpRequest) -> Vec<String> {
    let name = session_cookie_name(req);
    let secure = if https(req) { "; Secure" } else { "" };
    let path = req.path();
    let mut paths = Vec::new();
    for (i, c) in path.char_indices().skip(1) {
        if c == '/' {
            paths.push(&path[..i]);
            paths.push(&path[..=i]);
        }
    }
    if path.len() > 1 && !path.ends_with('/') {
        paths.push(path);
    }
    paths.dedup();
    paths
        .into_iter()
        .take(16)
        .map(|p| format!("{name}=; Path={p}; Max-Age=0{secure}"))
        .collect()
}

/// What several session cookies in one request are answered when the page's CSRF token does not
/// tell which is the console's: `400`, never a logout (no session is ended, and not `401`, which
/// sends the page to the login). The answer deletes the extra cookies where it can.
fn ambiguous(req: &HttpRequest) -> ApiError {
    ApiError {
        set_cookies: clear_tossed(req),
        ..ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "ambiguous credentials: {} session cookies were sent, and warden will not guess \
                 which is yours (a page on another port of this host can set a cookie for this \
                 one: cookies do not isolate ports). The console tells them apart with its CSRF \
                 token (X-CSRF-Token); this answer deletes the extra ones below /; if that does \
                 not help, clear this site's cookies in the browser and log in again",
                session_ids(req).len()
            ),
        )
    }
}

/// The live session the request names, told apart by `proof` (the page's CSRF token: a form's
/// `csrf` field or `X-CSRF-Token`) when the request carries several session cookies. Several
/// cookies none of which names a live session name none (`None`: the browser's own session ended;
/// the page goes to the login).
///
/// # Errors
/// `400` ([`ambiguous`]) for several session cookies, some live, that `proof` does not tell apart.
fn session_of(
    state: &ApiState,
    req: &HttpRequest,
    proof: Option<&str>,
) -> Result<Option<(String, Session)>, ApiError> {
    match session_ids(req).as_slice() {
        [] => Ok(None),
        [id] => Ok(state.console.get(id).map(|s| ((*id).to_owned(), s))),
        ids => match proof.and_then(|given| state.console.by_csrf(ids, given)) {
            Some((id, session)) => Ok(Some((id.to_owned(), session))),
            None if ids.iter().all(|id| state.console.get(id).is_none()) => Ok(None),
            None => Err(ambiguous(req)),
        },
    }
}

/// The request's `X-CSRF-Token`.
fn csrf_header(req: &HttpRequest) -> Option<&str> {
    req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok())
}

/// The access a console session cookie gives `req`, for [`crate::server::api::access_of`]:
/// `None` without a session cookie; `401` for a cookie whose session expired or is unknown (a
/// restart ends every session); `403` for a request other than `GET`/`HEAD` whose
/// `X-CSRF-Token` is missing or is not the session's; `400` for several session cookies that
/// `X-CSRF-Token` does not tell apart (see [`session_of`]).
pub(crate) fn cookie_access(
    state: &ApiState,
    req: &HttpRequest,
) -> Result<Option<Access>, ApiError> {
    let sent = session_ids(req).len();
    let Some((_, session)) = session_of(state, req, csrf_header(req))? else {
        if sent == 0 {
            return Ok(None);
        }
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the console session has expired or is unknown (sessions end after \
             api.session_ttl_seconds and when the server restarts): log in again at \
             /console/login, or send a bearer token",
        ));
    };
    // With several cookies the session was found by its CSRF token: checked already.
    if sent == 1 && !req.method().is_safe() {
        let given = csrf_header(req).unwrap_or("");
        if !session.csrf_matches(given) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "a request authenticated by the console's session cookie needs X-CSRF-Token \
                 equal to its session's token (the console page holds it)",
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
    let found = match session_of(&state, &req, None) {
        Ok(found) => found,
        Err(err) => return err.error_response(),
    };
    let Some((_, session)) = found else {
        // A cookie that names no live session: it expired, or the server restarted.
        let to = if session_ids(&req).is_empty() {
            "/console/login"
        } else {
            "/console/login?expired"
        };
        return see_other(to).finish();
    };
    let role = match session.access {
        Access::Admin => "admin",
        Access::Read => "read",
        // Never opened: `login` refuses a host token.
        Access::Host => "host",
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

/// `Set-Cookie` values for a session (or, with `max_age` 0, their removal): over https `Secure`
/// and named `__Host-…`; over plain http (the loopback default, where a `Secure` cookie may not
/// come back) the plain names.
fn cookies(req: &HttpRequest, id: &str, csrf: &str, max_age: u64) -> [String; 2] {
    let (session_name, csrf_name, secure) = if https(req) {
        (SECURE_SESSION_COOKIE, SECURE_CSRF_COOKIE, "; Secure")
    } else {
        (SESSION_COOKIE, CSRF_COOKIE, "")
    };
    [
        format!(
            "{session_name}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"
        ),
        format!("{csrf_name}={csrf}; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"),
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
    let token = form.map(|f| f.into_inner().token).unwrap_or_default();
    // The token is judged first: a right one is never refused for a rate.
    let Some(access) = access_of_token(&state.config, token.trim()) else {
        let addr = req.peer_addr().map(|a| a.ip());
        let Some(refused) = state.auth_failures.failed(addr) else {
            tracing::warn!("console login refused: wrong token");
            return login_with(
                StatusCode::UNAUTHORIZED,
                Some("That token is not the admin token nor the read token."),
            );
        };
        tracing::warn!(?addr, "console login refused: too many wrong tokens");
        let seconds = refused.seconds;
        let from = match (refused.everyone, addr) {
            (true, _) => "from all addresses together".to_owned(),
            (false, Some(addr)) => format!("from {addr}"),
            (false, None) => "from this address".to_owned(),
        };
        let mut response = login_with(
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "That token is not the admin token nor the read token, and too many wrong \
                 tokens came {from}: wrong tokens are refused for {seconds} s more."
            )),
        );
        if let Ok(value) = header::HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    };
    if access == Access::Host {
        // A game server's token, not a person's: the console's pages call routes it may not.
        tracing::warn!("console login refused: a host token");
        return login_with(
            StatusCode::FORBIDDEN,
            Some(
                "A host token cannot log in to the console: use the admin token or the read token.",
            ),
        );
    }
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
    let given = form.as_ref().map_or("", |f| f.csrf.as_str());
    let Some((id, session)) =
        session_of(state, req, Some(given)).map_err(|e| Box::new(e.error_response()))?
    else {
        return Err(Box::new(see_other("/console/login?expired").finish()));
    };
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
                .clone()
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
