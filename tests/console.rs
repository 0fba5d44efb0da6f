//! The operator console (issue 16) against a real `warden serve` process.
//!
//! * Plain HTTP (always run): the login page, a wrong token (no cookie, an error), the session
//!   cookie on `/api/*`, the CSRF rule (403 without `X-CSRF-Token`, accepted with it), a read
//!   session that cannot mutate, logout, expiry (`api.session_ttl_seconds`), the no-JavaScript
//!   HALT ALL form, the security headers, and the bearer API unchanged; the wrong-token limit
//!   (never the right token; one limit for many loopback addresses), two session cookies (told
//!   apart by the page's CSRF token, else 400, never a logout), `__Host-` cookies over https, read
//!   logins that cannot evict the admin.
//! * In headless Chromium through WebDriver (`chromium` and `chromedriver` on PATH; otherwise the
//!   tests print `SKIPPED …` and pass, or fail under `CI=true`; `WARDEN_TEST_BROWSER=skip` skips them on purpose): log in,
//!   see the agents, unlock a locked-out agent with a reason, chat with an agent, answer an
//!   approval, see the breaker's trip, a CSRF refusal, HALT ALL with every row STOPPED, Escape on
//!   the confirmation, a read session, the degraded journal's banner; a cookie tossed in from a page
//!   on another port that does not stop HALT ALL; and the first paint with 1,000 agents. Screenshots are kept in
//!   `target/tmp/artefacts/console-*.png`; the measured figures are printed.
//!
//! The WebDriver client is the few W3C WebDriver commands these tests use (new session, navigate,
//! find, click, type, execute script, screenshot), spoken over the `reqwest` already in the tree.
//! A crate such as `fantoccini` would bring its own HTTP stack and the `webdriver` crate's
//! dependencies into every CI build on a two-core machine for those seven JSON calls.

use serde_json::{json, Value};
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use warden_testkit::free_port;

const ADMIN: &str = "console-admin-token";
const READ: &str = "console-read-token";

/// A team with an agent that answers, one whose model always errors (locked out after two
/// failures), one that asks for a limit extension on its first turn, and `workers` more.
fn team(workers: usize, ttl_seconds: u64) -> String {
    let mut team = format!(
        r#"
[safety.breakers]
max_consecutive_errors = 2

[safety.loop]
max_iterations_per_task = 1

[providers.ok]
kind = "scripted"
cycle = true
replies = ["Hello from the console test."]

[providers.broken]
kind = "scripted"
error = "model unavailable (scripted)"

[providers.asker]
kind = "scripted"
cycle = true
replies = [{{ tool = "delegate", args = {{ agent = "helper", task = "look" }} }}, "done"]

[[agents]]
key = "greeter"
provider = "ok"
memory = {{ long_term = true }}

[[agents]]
key = "flaky"
provider = "broken"

[[agents]]
key = "asker"
provider = "asker"

[[agents]]
key = "helper"
role = "sub_agent"
parent = "asker"
provider = "ok"
delegate = false

[api]
session_ttl_seconds = {ttl_seconds}
"#
    );
    for i in 0..workers {
        team.push_str(&format!(
            "\n[[agents]]\nkey = \"worker-{i:05}\"\nprovider = \"ok\"\n"
        ));
    }
    team
}

/// A `warden serve` child process on a free loopback port ([`warden_testkit::Serve`]), killed on
/// drop; its directory (team file, journal, log) removed when the test passes.
struct Serve {
    /// The process, killed when this is dropped.
    _process: warden_testkit::Serve,
    url: String,
    dir: warden_testkit::Scratch,
}

impl Serve {
    fn start(name: &str, team_toml: &str) -> Serve {
        let dir = warden_testkit::scratch_dir("console", name);
        std::fs::write(dir.join("team.toml"), team_toml).unwrap();
        let serve = warden_testkit::Serve::command(env!("CARGO_BIN_EXE_warden"))
            .config(dir.join("team.toml"))
            .db(dir.join("journal.db"))
            .admin_token(ADMIN)
            .read_token(READ)
            .log(dir.join("serve.log"))
            .patience(Duration::from_secs(60))
            .start();
        Serve {
            url: serve.url(),
            _process: serve,
            dir,
        }
    }

    /// A bearer-token call; the status and the JSON body (`Null` when there is none).
    fn bearer(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = http()
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(Value::Null))
    }

    fn agent(&self, key: &str) -> Value {
        self.bearer("GET", &format!("/api/agents/{key}"), READ, None)
            .1
    }

    /// Two failing events lock `flaky` out; one event to `asker` opens a limit ask.
    fn prepare_lockout_and_ask(&self) {
        for _ in 0..2 {
            self.bearer(
                "POST",
                "/api/agents/flaky/events?wait=10",
                ADMIN,
                Some(json!({"content": "hi"})),
            );
        }
        assert_eq!(self.agent("flaky")["state"], "SAFETY_LOCKOUT");
        self.bearer(
            "POST",
            "/api/agents/asker/events",
            ADMIN,
            Some(json!({"content": "look around"})),
        );
        wait_for("the limit ask", Duration::from_secs(20), || {
            let (_, asks) = self.bearer("GET", "/api/interventions", READ, None);
            asks.as_array().is_some_and(|a| !a.is_empty())
        });
    }
}

/// A client that does not follow redirects (the tests look at them).
fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("timed out waiting for {what}");
}

/// The `name=value` of each `Set-Cookie`.
fn set_cookies(resp: &reqwest::blocking::Response) -> Vec<(String, String)> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            let pair = v.split(';').next().unwrap_or("");
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// A logged-in browser as plain HTTP: its session cookie and CSRF token.
struct Login {
    session: String,
    csrf: String,
}

impl Login {
    fn cookie(&self) -> String {
        format!("warden_session={}; warden_csrf={}", self.session, self.csrf)
    }
}

fn login(serve: &Serve, token: &str) -> Login {
    let resp = http()
        .post(format!("{}/console/login", serve.url))
        .form(&[("token", token)])
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/");
    let raw: Vec<String> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let session_line = raw
        .iter()
        .find(|c| c.starts_with("warden_session="))
        .unwrap();
    assert!(session_line.contains("HttpOnly"), "{session_line}");
    assert!(session_line.contains("SameSite=Strict"), "{session_line}");
    assert!(session_line.contains("Path=/"), "{session_line}");
    let csrf_line = raw.iter().find(|c| c.starts_with("warden_csrf=")).unwrap();
    assert!(!csrf_line.contains("HttpOnly"), "{csrf_line}");
    let cookies = set_cookies(&resp);
    let get = |name: &str| cookies.iter().find(|(k, _)| k == name).unwrap().1.clone();
    let login = Login {
        session: get("warden_session"),
        csrf: get("warden_csrf"),
    };
    assert_eq!(login.session.len(), 64, "256 bits in hex");
    assert_eq!(login.csrf.len(), 64);
    login
}

/// A cookie-authenticated call, with `X-CSRF-Token` when `csrf` is given.
fn with_cookie(
    serve: &Serve,
    login: &Login,
    method: &str,
    path: &str,
    csrf: Option<&str>,
) -> (u16, Value) {
    let mut req = http()
        .request(method.parse().unwrap(), format!("{}{path}", serve.url))
        .header("cookie", login.cookie());
    if let Some(csrf) = csrf {
        req = req.header("x-csrf-token", csrf);
    }
    let resp = req.send().unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().unwrap_or(Value::Null))
}

#[test]
fn login_sets_the_session_and_a_wrong_token_sets_nothing() {
    let serve = Serve::start("login", &team(0, 3600));
    let client = http();
    // Not logged in: the console sends the browser to the login page.
    let resp = client.get(format!("{}/", serve.url)).send().unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/console/login");
    let page = client
        .get(format!("{}/console/login", serve.url))
        .send()
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert_eq!(page.headers()["cache-control"], "no-store");
    let text = page.text().unwrap();
    assert!(text.contains("name=\"token\""), "{text}");
    assert!(
        !text.contains("<script"),
        "the login page works without JavaScript"
    );

    // A wrong token: no cookie, the page again with an error.
    for wrong in ["nope", "", " console-admin-token-x"] {
        let resp = client
            .post(format!("{}/console/login", serve.url))
            .form(&[("token", wrong)])
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{wrong:?}");
        assert!(resp.headers().get("set-cookie").is_none(), "{wrong:?}");
        let body = resp.text().unwrap();
        assert!(body.contains("id=\"login-error\""), "{body}");
    }
    // A form posted from another origin is refused.
    let resp = client
        .post(format!("{}/console/login", serve.url))
        .header("origin", "http://evil.example")
        .form(&[("token", ADMIN)])
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    assert!(resp.headers().get("set-cookie").is_none());

    // The admin token: the console, with the session's CSRF token in the page.
    let admin = login(&serve, ADMIN);
    let resp = client
        .get(format!("{}/", serve.url))
        .header("cookie", admin.cookie())
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let html = resp.text().unwrap();
    assert!(html.contains("data-role=\"admin\""));
    assert!(html.contains(&format!("value=\"{}\"", admin.csrf)));
    assert!(!html.contains("{{"), "every placeholder filled");
    for asset in ["console.js", "console.css"] {
        let resp = client
            .get(format!("{}/console/assets/{asset}", serve.url))
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{asset}");
        assert!(resp.text().unwrap().len() > 1000);
    }
}

#[test]
fn the_session_cookie_authenticates_the_api_with_csrf_on_mutations() {
    let serve = Serve::start("cookie", &team(3, 3600));
    let admin = login(&serve, ADMIN);
    // Reads need no CSRF header.
    let (status, agents) = with_cookie(&serve, &admin, "GET", "/api/agents", None);
    assert_eq!(status, 200);
    assert_eq!(agents.as_array().unwrap().len(), 7);
    let (status, fleet) = with_cookie(&serve, &admin, "GET", "/api/fleet", None);
    assert_eq!(status, 200);
    assert_eq!(fleet["agents"], 7);
    assert_eq!(fleet["journal"]["ok"], true);
    // A mutating call without the header, or with another token: 403, and nothing happens.
    for csrf in [None, Some("0".repeat(64).as_str()), Some("")] {
        let (status, body) = with_cookie(&serve, &admin, "POST", "/api/agents/greeter/halt", csrf);
        assert_eq!(status, 403, "{csrf:?}: {body}");
        assert!(body["error"].as_str().unwrap().contains("X-CSRF-Token"));
    }
    assert_eq!(serve.agent("greeter")["state"], "WAITING_FOR_EVENT");
    // With it: done.
    let (status, body) = with_cookie(
        &serve,
        &admin,
        "POST",
        "/api/agents/greeter/halt",
        Some(&admin.csrf),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(serve.agent("greeter")["state"], "STOPPED");

    // A read session sees everything and can change nothing.
    let read = login(&serve, READ);
    let (status, _) = with_cookie(&serve, &read, "GET", "/api/agents", None);
    assert_eq!(status, 200);
    let (status, _) = with_cookie(&serve, &read, "GET", "/api/breakers/recent", None);
    assert_eq!(status, 200);
    let (status, body) = with_cookie(
        &serve,
        &read,
        "POST",
        "/api/agents/greeter/resume",
        Some(&read.csrf),
    );
    assert_eq!(status, 403, "{body}");
    let html = http()
        .get(format!("{}/", serve.url))
        .header("cookie", read.cookie())
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(html.contains("data-role=\"read\""));
    // One session's CSRF token does not open another's.
    let (status, _) = with_cookie(
        &serve,
        &admin,
        "POST",
        "/api/agents/greeter/resume",
        Some(&read.csrf),
    );
    assert_eq!(status, 403);

    // Logout ends the session: its cookie opens nothing any more.
    let resp = http()
        .post(format!("{}/console/logout", serve.url))
        .header("cookie", admin.cookie())
        .form(&[("csrf", admin.csrf.as_str())])
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    let cleared = set_cookies(&resp);
    assert!(cleared
        .iter()
        .any(|(k, v)| k == "warden_session" && v.is_empty()));
    let (status, _) = with_cookie(&serve, &admin, "GET", "/api/agents", None);
    assert_eq!(status, 401);
    let resp = http()
        .get(format!("{}/", serve.url))
        .header("cookie", admin.cookie())
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);

    // The bearer API is unchanged (and a bearer header wins over a cookie).
    let (status, _) = serve.bearer("GET", "/api/agents", READ, None);
    assert_eq!(status, 200);
    let (status, _) = serve.bearer("POST", "/api/agents/greeter/resume", READ, None);
    assert_eq!(status, 403);
    let (status, _) = serve.bearer("POST", "/api/agents/greeter/resume", ADMIN, None);
    assert_eq!(status, 200);
    let (status, _) = serve.bearer("GET", "/api/agents", "wrong", None);
    assert_eq!(status, 401);
    let (status, _) = with_cookie(&serve, &read, "GET", "/api/agents", None);
    assert_eq!(status, 200);
}

#[test]
fn wrong_tokens_past_the_limit_are_refused_and_the_right_token_never_is() {
    // `api.auth_failures_per_minute = 3`: three wrong tokens, by bearer and by the login form.
    let team = team(0, 3600).replace("[api]\n", "[api]\nauth_failures_per_minute = 3\n");
    let serve = Serve::start("auth-limit", &team);
    let client = http();
    let (status, _) = serve.bearer("GET", "/api/agents", "guess-1", None);
    assert_eq!(status, 401);
    let (status, _) = serve.bearer("GET", "/api/agents", "guess-2", None);
    assert_eq!(status, 401);
    // A request without a token is not a guess: not counted.
    let resp = client
        .get(format!("{}/api/agents", serve.url))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = client
        .post(format!("{}/console/login", serve.url))
        .form(&[("token", "guess-3")])
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401, "the third wrong token");
    // Past the limit a wrong token is refused 429, with how long to wait, by both doors...
    let resp = client
        .get(format!("{}/api/agents", serve.url))
        .bearer_auth("guess-4")
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let body: Value = resp.json().unwrap();
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("too many wrong tokens from 127.0.0.1")),
        "{body}"
    );
    let resp = client
        .post(format!("{}/console/login", serve.url))
        .form(&[("token", "guess-5")])
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().get("set-cookie").is_none());
    assert!(resp.headers().get("retry-after").is_some());
    assert!(resp
        .text()
        .unwrap()
        .to_lowercase()
        .contains("too many wrong tokens"));
    // ...but the right token is never refused for a rate: the admin reads, halts and logs in
    // from the very address that guessed.
    let (status, body) = serve.bearer("GET", "/api/agents", ADMIN, None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = serve.bearer("POST", "/api/halt", ADMIN, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serve.agent("greeter")["state"], "STOPPED");
    let admin = login(&serve, ADMIN);
    let (status, _) = with_cookie(&serve, &admin, "GET", "/api/fleet", None);
    assert_eq!(status, 200);
    // Requests that need no token still work.
    let resp = client.get(format!("{}/healthz", serve.url)).send().unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

/// A client whose connections come from `addr` (any of 127.0.0.0/8 is this host on Linux).
fn http_from(addr: [u8; 4]) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(std::net::IpAddr::from(addr))
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[test]
fn guesses_from_many_loopback_addresses_share_one_limit_and_never_lock_the_admin_out() {
    // 3 a minute per address, so 30 from all addresses together.
    let team = team(0, 3600).replace("[api]\n", "[api]\nauth_failures_per_minute = 3\n");
    let serve = Serve::start("auth-global", &team);
    let (mut unauthorized, mut refused) = (0, 0);
    // One wrong guess from each of 60 addresses, 127.0.0.2 to 127.0.0.61: none over its own
    // limit, so only a limit over all of them refuses any.
    for n in 0..60u8 {
        let client = http_from([127, 0, 0, 2 + n]);
        let resp = client
            .get(format!("{}/api/agents", serve.url))
            .bearer_auth(format!("guess-{n}"))
            .send()
            .unwrap();
        match resp.status().as_u16() {
            401 => unauthorized += 1,
            429 => {
                refused += 1;
                let body: Value = resp.json().unwrap();
                assert!(
                    body["error"]
                        .as_str()
                        .is_some_and(|e| e.contains("from all addresses together")),
                    "{body}"
                );
            }
            other => panic!("guess {n}: {other}"),
        }
    }
    say(&format!(
        "60 wrong guesses from 60 loopback addresses: {unauthorized} answered 401, {refused} 429"
    ));
    assert_eq!((unauthorized, refused), (30, 30));
    // Two addresses past their own limits as well: 127.0.0.2, and 127.0.0.1 (where the CLI and
    // the MCP client below come from).
    for addr in [[127, 0, 0, 2], [127, 0, 0, 1]] {
        let guesser = http_from(addr);
        for n in 0..5 {
            let resp = guesser
                .post(format!("{}/api/halt", serve.url))
                .bearer_auth(format!("again-{n}"))
                .send()
                .unwrap();
            assert_eq!(resp.status().as_u16(), 429);
        }
    }
    // `warden halt` halts.
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["halt", "--url", &serve.url])
        .env("WARDEN_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "warden halt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(serve.agent("greeter")["state"], "STOPPED");
    let (status, _) = serve.bearer("POST", "/api/agents/greeter/resume", ADMIN, None);
    assert_eq!(status, 200);
    // /mcp's halt_all halts.
    let mcp = |session: Option<&str>, body: Value| {
        let mut req = http()
            .post(format!("{}/mcp", serve.url))
            .bearer_auth(ADMIN)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            req = req.header("mcp-session-id", session);
        }
        req.send().unwrap()
    };
    let init = mcp(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}),
    );
    assert_eq!(init.status().as_u16(), 200);
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let halted = mcp(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "halt_all", "arguments": {}}}),
    );
    assert_eq!(halted.status().as_u16(), 200);
    let halted: Value = halted.json().unwrap();
    assert_ne!(halted["result"]["isError"], true, "{halted}");
    assert_eq!(serve.agent("greeter")["state"], "STOPPED");
    // The admin, from those very addresses (behind a shared proxy, say) and from another: the API
    // and the console's login still work.
    for addr in [[127, 0, 0, 2], [127, 0, 0, 1], [127, 0, 0, 99]] {
        let admin = http_from(addr);
        let resp = admin
            .post(format!("{}/api/agents/greeter/resume", serve.url))
            .bearer_auth(ADMIN)
            .send()
            .unwrap();
        assert!(
            [200, 409].contains(&resp.status().as_u16()),
            "{addr:?}: {}",
            resp.status()
        );
        let resp = admin
            .post(format!("{}/api/halt", serve.url))
            .bearer_auth(ADMIN)
            .send()
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            200,
            "the admin's halt from {addr:?}"
        );
        assert_eq!(serve.agent("greeter")["state"], "STOPPED");
        let resp = admin
            .post(format!("{}/console/login", serve.url))
            .form(&[("token", ADMIN)])
            .send()
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            303,
            "the admin's login from {addr:?}"
        );
        let resp = admin
            .get(format!("{}/api/agents", serve.url))
            .bearer_auth(READ)
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "the read token from {addr:?}");
    }
}

/// `warden_session` twice — a tossed one first, as a browser orders a cookie with a longer path
/// — and the admin's.
fn tossed(admin: &Login) -> String {
    format!(
        "warden_session=tossed; warden_session={}; warden_csrf=00",
        admin.session
    )
}

#[test]
fn two_session_cookies_are_refused_as_ambiguous_unless_the_pages_token_tells_them_apart() {
    let serve = Serve::start("tossed", &team(0, 3600));
    let admin = login(&serve, ADMIN);
    let call = |method: &str, path: &str, csrf: Option<&str>| {
        let mut req = http()
            .request(method.parse().unwrap(), format!("{}{path}", serve.url))
            .header("cookie", tossed(&admin));
        if let Some(csrf) = csrf {
            req = req.header("x-csrf-token", csrf);
        }
        let resp = req.send().unwrap();
        let status = resp.status().as_u16();
        let cleared: Vec<String> = resp
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        (status, cleared, resp.json::<Value>().unwrap_or(Value::Null))
    };
    // Without the page's token: 400, ambiguous — not 401 (the page's way to the login), and the
    // answer deletes the cookie at the paths below / that this request could carry.
    let (status, cleared, body) = call("GET", "/api/agents", None);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("ambiguous"),
        "{body}"
    );
    for path in ["/api", "/api/", "/api/agents"] {
        let line = format!("warden_session=; Path={path}; Max-Age=0");
        assert!(cleared.contains(&line), "{line} in {cleared:?}");
    }
    assert!(
        !cleared.iter().any(|c| c.contains("Path=/;")),
        "{cleared:?}"
    );
    // A token that is no session's (the tossed CSRF cookie's 00): ambiguous still, nothing halted.
    let (status, _, body) = call("POST", "/api/halt", Some("00"));
    assert_eq!(status, 400, "{body}");
    assert_eq!(serve.agent("greeter")["state"], "WAITING_FOR_EVENT");
    // The page's token tells the admin's session apart: reads and HALT ALL work.
    let (status, _, body) = call("GET", "/api/agents", Some(&admin.csrf));
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call("POST", "/api/halt", Some(&admin.csrf));
    assert_eq!(status, 200, "{body}");
    assert_eq!(serve.agent("greeter")["state"], "STOPPED");
    // The no-JavaScript form too (its csrf field is the page's token).
    let resp = http()
        .post(format!("{}/console/halt", serve.url))
        .header("cookie", tossed(&admin))
        .form(&[("csrf", admin.csrf.as_str()), ("confirm", "on")])
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    assert!(resp.headers()["location"]
        .to_str()
        .unwrap()
        .starts_with("/?halted="));
    // Nothing of it was a logout: the admin's cookie alone still works.
    let (status, _) = with_cookie(&serve, &admin, "GET", "/api/agents", None);
    assert_eq!(status, 200);
    // Several cookies none of which is a live session: the browser's own session ended, so 401
    // (the page's way to the login), not an ambiguity the operator could not get out of.
    let resp = http()
        .get(format!("{}/api/agents", serve.url))
        .header("cookie", "warden_session=tossed; warden_session=ended")
        .header("x-csrf-token", &admin.csrf)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    // A read session's cookie tossed in (someone with the read token) does not win either.
    let read = login(&serve, READ);
    let both = format!(
        "warden_session={}; warden_session={}",
        read.session, admin.session
    );
    let resp = http()
        .post(format!("{}/api/agents/greeter/resume", serve.url))
        .header("cookie", both)
        .header("x-csrf-token", &admin.csrf)
        .send()
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "the admin's session, by its token"
    );
}

#[test]
fn over_https_the_cookies_are_host_prefixed_and_secure() {
    let serve = Serve::start("host-prefix", &team(0, 3600));
    let resp = http()
        .post(format!("{}/console/login", serve.url))
        .header("x-forwarded-proto", "https")
        .form(&[("token", ADMIN)])
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    let lines: Vec<String> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let session = lines
        .iter()
        .find(|l| l.starts_with("__Host-warden_session="))
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(
        session.contains("; Secure") && session.contains("Path=/;"),
        "{session}"
    );
    assert!(!session.contains("Domain"), "{session}");
    let id = session
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("__Host-warden_session=");
    let get = |cookie: String| {
        http()
            .get(format!("{}/api/agents", serve.url))
            .header("x-forwarded-proto", "https")
            .header("cookie", cookie)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(get(format!("__Host-warden_session={id}")), 200);
    // Over https a plain-named cookie (which any port of the host could set) opens nothing.
    assert_eq!(get(format!("warden_session={id}")), 401);
}

#[test]
fn a_thousand_read_logins_never_end_the_admins_session_nor_keep_the_admin_out() {
    let serve = Serve::start("read-cap", &team(0, 3600));
    let admin = login(&serve, ADMIN);
    let client = http();
    for n in 0..1100 {
        let resp = client
            .post(format!("{}/console/login", serve.url))
            .form(&[("token", READ)])
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 303, "read login {n}");
    }
    let (status, body) = with_cookie(&serve, &admin, "GET", "/api/agents", None);
    assert_eq!(status, 200, "the admin's session survives: {body}");
    let (status, body) = with_cookie(&serve, &admin, "POST", "/api/halt", Some(&admin.csrf));
    assert_eq!(status, 200, "{body}");
    let again = login(&serve, ADMIN);
    let (status, _) = with_cookie(&serve, &again, "GET", "/api/agents", None);
    assert_eq!(status, 200);
}

#[test]
fn sessions_expire() {
    let serve = Serve::start("expiry", &team(0, 1));
    let admin = login(&serve, ADMIN);
    let (status, _) = with_cookie(&serve, &admin, "GET", "/api/agents", None);
    assert_eq!(status, 200);
    std::thread::sleep(Duration::from_millis(1300));
    let (status, body) = with_cookie(&serve, &admin, "GET", "/api/agents", None);
    assert_eq!(status, 401);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("console session has expired")),
        "a stale cookie is told so, not 'missing bearer token': {body}"
    );
    let resp = http()
        .get(format!("{}/", serve.url))
        .header("cookie", admin.cookie())
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/console/login?expired");
    let page = http()
        .get(format!("{}/console/login?expired", serve.url))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(page.contains("Your session has ended"), "{page}");
}

#[test]
fn halt_all_works_from_the_plain_form_and_unlock_journals_the_reason() {
    let serve = Serve::start("form", &team(5, 3600));
    serve.prepare_lockout_and_ask();
    let admin = login(&serve, ADMIN);
    let post_form = |login: &Login, path: &str, form: &[(&str, &str)]| {
        http()
            .post(format!("{}{path}", serve.url))
            .header("cookie", login.cookie())
            .form(form)
            .send()
            .unwrap()
    };
    // Unlock with a reason (the page's call): journaled as the note.
    let resp = http()
        .post(format!("{}/api/agents/flaky/unlock", serve.url))
        .header("cookie", admin.cookie())
        .header("x-csrf-token", &admin.csrf)
        .json(&json!({"reason": "the model is back"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let (_, recent) = serve.bearer("GET", "/api/events/recent?agent=flaky&limit=50", READ, None);
    let unlocked = recent["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"]["type"] == "unlocked")
        .expect("an unlocked event");
    assert_eq!(unlocked["kind"]["note"], "the model is back");
    // The breaker's trip is listed with its message.
    let (_, trips) = serve.bearer("GET", "/api/breakers/recent", READ, None);
    assert_eq!(trips["trips"]["consecutive_errors"], 1);
    assert_eq!(trips["recent"][0]["agent"], "flaky");
    assert!(trips["recent"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("consecutive errors"));

    // The form without its CSRF field, or unconfirmed, halts nothing.
    let resp = post_form(&admin, "/console/halt", &[("confirm", "on")]);
    assert_eq!(resp.status().as_u16(), 403);
    let resp = post_form(&admin, "/console/halt", &[("csrf", &admin.csrf)]);
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/?halt=unconfirmed");
    // A read session's form is refused.
    let read = login(&serve, READ);
    let resp = post_form(
        &read,
        "/console/halt",
        &[("csrf", &read.csrf), ("confirm", "on")],
    );
    assert_eq!(resp.status().as_u16(), 403);
    assert_eq!(serve.agent("greeter")["state"], "WAITING_FOR_EVENT");
    // Confirmed, with the token: every agent STOPPED, back to the console.
    let resp = post_form(
        &admin,
        "/console/halt",
        &[("csrf", &admin.csrf), ("confirm", "on")],
    );
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/?halted=9");
    let (_, agents) = serve.bearer("GET", "/api/agents", READ, None);
    for agent in agents.as_array().unwrap() {
        assert_eq!(agent["state"], "STOPPED", "{agent}");
    }
}

// ---- the browser --------------------------------------------------------------------------

/// The few W3C WebDriver commands the tests use (see the module docs for why not a crate).
struct Browser {
    driver: Child,
    base: String,
    session: String,
    client: reqwest::blocking::Client,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// `chromium` and `chromedriver`, when both are installed.
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let find = |names: &[&str]| {
        names.iter().find_map(|name| {
            std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .chain([
                    PathBuf::from("/usr/bin"),
                    PathBuf::from("/usr/lib/chromium"),
                ])
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    };
    Some((
        find(&["chromium", "chromium-browser", "google-chrome"])?,
        find(&["chromedriver"])?,
    ))
}

/// One browser at a time: Chromium is heavy for a two-core machine.
static BROWSER_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Browser {
    fn start(chromium: &Path, chromedriver: &Path) -> Browser {
        let port = free_port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            client,
        };
        wait_for("chromedriver", Duration::from_secs(30), || {
            browser
                .client
                .get(format!("{}/status", browser.base))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .is_some_and(|v| v["value"]["ready"] == true)
        });
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"],
            },
        }}});
        let created = browser.command("POST", "/session", Some(caps));
        browser.session = created["sessionId"]
            .as_str()
            .expect("a WebDriver session")
            .to_owned();
        browser
    }

    /// One WebDriver command; its `value`. Panics on a WebDriver error.
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = if path == "/session" {
            format!("{}/session", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let mut req = self.client.request(method.parse().unwrap(), url);
        if let Some(body) = body {
            req = req.json(&body);
        } else if method == "POST" {
            req = req.json(&json!({}));
        }
        let resp = req.send().unwrap();
        let status = resp.status();
        let value: Value = resp.json().unwrap();
        assert!(status.is_success(), "WebDriver {method} {path}: {value}");
        value["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })));
    }

    fn find(&self, css: &str) -> String {
        let found = self.command(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        found[ELEMENT].as_str().unwrap().to_owned()
    }

    fn click(&self, css: &str) {
        let id = self.find(css);
        self.command("POST", &format!("/element/{id}/click"), None);
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.command("POST", &format!("/element/{id}/clear"), None);
        self.command(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn js(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    fn js_async(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Polls `script` until it returns `true`.
    fn until(&self, what: &str, script: &str) {
        wait_for(what, Duration::from_secs(20), || self.js(script) == true);
    }

    /// Presses a key (a WebDriver key code such as `\u{E00C}`, Escape) on the focused element.
    fn press(&self, key: &str) {
        self.command(
            "POST",
            "/actions",
            Some(
                json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
                    {"type": "keyDown", "value": key}, {"type": "keyUp", "value": key},
                ]}]}),
            ),
        );
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let png = decode_base64(self.command("GET", "/screenshot", None).as_str().unwrap());
        let artefacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("artefacts");
        std::fs::create_dir_all(&artefacts).unwrap();
        let path = artefacts.join(format!("console-{name}.png"));
        std::fs::write(&path, &png).unwrap();
        assert!(png.len() > 5_000, "{name}: a blank screenshot?");
        eprintln!("screenshot: {}", path.display());
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self
                .client
                .delete(format!("{}/session/{}", self.base, self.session))
                .send();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Standard base64 (the screenshot), without a crate for it.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// A line on the real standard error: the test harness captures `eprintln!` of a passing test, and
/// a skip or a measured figure must show in `cargo test`'s output.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The browser, or `None` after saying loudly that the test is skipped
/// (`WARDEN_TEST_BROWSER=skip` skips on purpose).
fn browser_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    let found = browser_binaries()
        .filter(|_| std::env::var("WARDEN_TEST_BROWSER").map_or(true, |v| v != "skip"));
    if found.is_none() {
        warden_testkit::skip(&format!(
            "{test}: no chromium and chromedriver on PATH, or WARDEN_TEST_BROWSER=skip \
             (Debian: apt-get install chromium chromium-driver; .ci/run installs them)"
        ));
    }
    found
}

/// Logs in through the login page (a wrong token first: the error is shown, no cookie is set).
fn log_in(browser: &Browser, serve: &Serve, token: &str) {
    browser.goto(&format!("{}/", serve.url));
    browser.until(
        "the login page",
        "return !!document.getElementById('token')",
    );
    browser.type_into("#token", "not-the-token");
    browser.click("#login-submit");
    browser.until(
        "the login error",
        "return !!document.getElementById('login-error')",
    );
    assert_eq!(browser.js("return document.cookie"), "", "no cookie set");
    browser.type_into("#token", token);
    browser.click("#login-submit");
    browser.until(
        "the console",
        "return !!document.getElementById('agents-body')",
    );
}

fn rows_script(condition: &str) -> String {
    format!(
        "const rows = [...document.querySelectorAll('#agents-body tr')]; \
         return rows.length > 0 && {condition};"
    )
}

#[test]
fn the_console_in_a_headless_browser() {
    let Some((chromium, chromedriver)) = browser_or_skip("the_console_in_a_headless_browser")
    else {
        return;
    };
    let _one = BROWSER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let serve = Serve::start("browser", &team(20, 3600));
    serve.prepare_lockout_and_ask();
    let browser = Browser::start(&chromium, &chromedriver);

    browser.goto(&format!("{}/", serve.url));
    browser.until(
        "the login page",
        "return !!document.getElementById('token')",
    );
    browser.screenshot("login");
    log_in(&browser, &serve, ADMIN);

    // The agents, live; flaky locked out (status and symbol, not colour alone).
    browser.until("24 rows", &rows_script("rows.length === 24"));
    browser.until(
        "flaky locked out",
        "return document.querySelector('tr[data-key=flaky]').dataset.state === 'SAFETY_LOCKOUT'",
    );
    let text = browser.js("return document.querySelector('tr[data-key=flaky]').innerText");
    assert!(text.as_str().unwrap().contains("LOCKED"), "{text}");
    browser.until(
        "the fleet header",
        "return document.getElementById('fleet-state').textContent.includes('locked out')",
    );
    browser.screenshot("agents");

    // Unlock with a reason.
    browser.click("button[data-action=unlock][data-key=flaky]");
    browser.until(
        "the unlock dialog",
        "return document.getElementById('unlock-dialog').open",
    );
    browser.type_into("#unlock-reason", "scripted model fixed");
    browser.screenshot("unlock-dialog");
    browser.click("#unlock-yes");
    browser.until(
        "flaky unlocked",
        "return document.querySelector('tr[data-key=flaky]').dataset.state === 'WAITING_FOR_EVENT'",
    );
    let (_, recent) = serve.bearer("GET", "/api/events/recent?agent=flaky&limit=50", READ, None);
    assert!(
        recent["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"]["type"] == "unlocked"
                && e["kind"]["note"] == "scripted model fixed"),
        "{recent}"
    );

    // An agent's detail: the timeline (the failures in red, marked ✖) and a chat.
    browser.goto(&format!("{}/#agent/flaky", serve.url));
    browser.until(
        "flaky's timeline",
        "return document.querySelectorAll('#timeline li.fail').length >= 2",
    );
    // An NPC's world event: its classification (rule, trust) shows on the timeline.
    let (status, seen) = serve.bearer(
        "POST",
        "/api/agents/greeter/world",
        ADMIN,
        Some(json!({"speaker": {"id": "p1", "kind": "player"}, "kind": "whisper", "text": "psst <b>bold</b>"})),
    );
    assert_eq!(status, 200, "{seen}");
    browser.goto(&format!("{}/#agent/greeter", serve.url));
    browser.until(
        "the classification on the timeline",
        "const li = document.querySelector('#timeline li[data-type=perceived]'); \
         return !!li && li.textContent.includes('by rule direct_message, trust 0.9')",
    );
    browser.until(
        "the NPC summary",
        "return document.getElementById('agent-summary').textContent.includes('NPC: last classification')",
    );
    // What it remembers (long-term memory): the whisper, as text (never as markup).
    browser.until(
        "the NPC's memories",
        "const m = document.getElementById('agent-memories'); \
         return !!m && m.textContent.includes('p1 (whisper, trust 0.9): psst <b>bold</b>') && !m.querySelector('b')",
    );
    browser.until(
        "greeter's detail",
        "return document.getElementById('agent-h').textContent === 'Agent greeter'",
    );
    browser.type_into("#chat-text", "Hello?");
    browser.click("#chat-send");
    browser.until(
        "the answer",
        "const p = document.querySelector('#chat-log p.answer'); \
         return !!p && p.textContent.includes('Hello from the console test.')",
    );
    browser.until(
        "the turn on the timeline",
        "return [...document.querySelectorAll('#timeline li')].some(li => li.dataset.type === 'turn_finished')",
    );
    browser.screenshot("agent-detail");

    // An approval: answered yes with a note.
    browser.goto(&format!("{}/#approvals", serve.url));
    browser.until(
        "the pending ask",
        "return !!document.querySelector('li[data-intervention]')",
    );
    browser.screenshot("approvals");
    let id =
        browser.js("return document.querySelector('li[data-intervention]').dataset.intervention");
    browser.type_into(
        &format!("#note-{}", id.as_str().unwrap()),
        "one more look is fine",
    );
    browser.click("li[data-intervention] button[data-answer=yes]");
    browser.until(
        "the ask answered",
        "return !document.querySelector('li[data-intervention]')",
    );
    let (_, asks) = serve.bearer("GET", "/api/interventions", READ, None);
    assert_eq!(asks, json!([]));
    let (_, recent) = serve.bearer(
        "GET",
        "/api/events/recent?agent=asker&limit=100",
        READ,
        None,
    );
    assert!(
        recent.to_string().contains("one more look is fine"),
        "the note is journaled with the decision: {recent}"
    );
    // The asker's delegation on its timeline, with the task (it read "delegates to helper:" with
    // nothing after the colon).
    browser.goto(&format!("{}/#agent/asker", serve.url));
    browser.until(
        "the delegation's task on the timeline",
        "const li = document.querySelector('#timeline li[data-type=delegation_requested]'); \
         return !!li && li.textContent.includes('delegates to helper: look (delegation ')",
    );

    // The breakers: the trip with its message.
    browser.goto(&format!("{}/#breakers", serve.url));
    browser.until(
        "the trip",
        "return document.getElementById('trips-body').textContent.includes('Maximum consecutive errors')",
    );
    browser.screenshot("breakers");

    // A CSRF refusal: the session cookie alone does not halt.
    let refused = browser.js_async(
        "const done = arguments[0]; \
         fetch('/api/halt', {method: 'POST', credentials: 'same-origin'}).then(r => done(r.status));",
    );
    assert_eq!(refused, 403);
    assert_ne!(serve.agent("greeter")["state"], "STOPPED");

    // HALT ALL: confirmed in the dialog, every row STOPPED on screen.
    browser.goto(&format!("{}/#agents", serve.url));
    browser.until("24 rows", &rows_script("rows.length === 24"));
    browser.click("#halt-all");
    browser.until(
        "the confirmation",
        "return document.getElementById('halt-dialog').open",
    );
    browser.click("#halt-yes");
    browser.until(
        "every row STOPPED",
        &rows_script("rows.every(r => r.dataset.state === 'STOPPED')"),
    );
    browser.until(
        "the halt measured",
        "return window.wardenPerf.haltOnScreen !== null",
    );
    let halt_ms = browser
        .js("return window.wardenPerf.haltOnScreen - window.wardenPerf.haltClicked")
        .as_f64()
        .unwrap();
    browser.until(
        "the header says halted",
        "return document.getElementById('fleet-state').textContent.includes('HALTED')",
    );
    browser.screenshot("halted");
    let lags: Vec<f64> =
        serde_json::from_value(browser.js("return window.wardenPerf.sseLagMs")).unwrap();
    let max_lag = lags.iter().copied().fold(0.0, f64::max);
    say(&format!(
        "console figures: HALT ALL to every row STOPPED on screen {halt_ms:.0} ms; state changes \
         on screen after they were journaled: {} measured, max {max_lag:.0} ms",
        lags.len()
    ));
    assert!(halt_ms <= 1000.0, "HALT ALL took {halt_ms} ms to show");
    assert!(!lags.is_empty());
    assert!(
        max_lag <= 1000.0,
        "a state change took {max_lag} ms to show"
    );
    for agent in serve
        .bearer("GET", "/api/agents", READ, None)
        .1
        .as_array()
        .unwrap()
    {
        assert_eq!(agent["state"], "STOPPED");
    }

    // Escape dismisses the confirmation and halts nothing (even after a confirmed HALT ALL).
    let (status, _) = serve.bearer("POST", "/api/agents/greeter/resume", ADMIN, None);
    assert_eq!(status, 200);
    browser.until(
        "greeter resumed on screen",
        "return document.querySelector('tr[data-key=greeter]').dataset.state === 'WAITING_FOR_EVENT'",
    );
    // By keyboard: Enter on HALT ALL opens the dialog with Cancel focused; Enter there cancels.
    browser.js("document.getElementById('halt-all').focus()");
    browser.press("\u{E007}");
    browser.until(
        "the confirmation, Cancel focused",
        "return document.getElementById('halt-dialog').open \
         && document.activeElement.id === 'halt-cancel'",
    );
    browser.press("\u{E007}");
    browser.until(
        "the dialog closed",
        "return !document.getElementById('halt-dialog').open",
    );
    browser.click("#halt-all");
    browser.until(
        "the confirmation",
        "return document.getElementById('halt-dialog').open",
    );
    browser.press("\u{E00C}");
    browser.until(
        "the dialog closed",
        "return !document.getElementById('halt-dialog').open",
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(serve.agent("greeter")["state"], "WAITING_FOR_EVENT");

    // Log out; a read session sees the agents and every control is disabled.
    browser.click("#logout");
    browser.until(
        "the login page",
        "return !!document.getElementById('token')",
    );
    log_in(&browser, &serve, READ);
    browser.until("24 rows", &rows_script("rows.length === 24"));
    assert_eq!(
        browser.js("return document.getElementById('halt-all').disabled"),
        true
    );
    assert_eq!(
        browser.js(
            "return [...document.querySelectorAll('#agents-body button')].every(b => b.disabled)"
        ),
        true
    );
    browser.screenshot("read-only");

    // The journal cannot write: the header says so, and a banner.
    rusqlite::Connection::open(serve.dir.join("journal.db"))
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.body LIKE '%poison%'
             BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;",
        )
        .unwrap();
    let (status, _) = serve.bearer(
        "POST",
        "/api/agents/greeter/events",
        ADMIN,
        Some(json!({"content": "poison pill"})),
    );
    assert_eq!(status, 500);
    let (_, fleet) = serve.bearer("GET", "/api/fleet", READ, None);
    assert_eq!(fleet["journal"]["ok"], false, "{fleet}");
    browser.until(
        "the degraded banner",
        "const b = document.getElementById('journal-banner'); \
         return !b.hidden && b.textContent.includes('Journal degraded')",
    );
    browser.screenshot("journal-degraded");
}

/// A hostile page on another loopback port (cookies do not isolate ports): it sets
/// `warden_session=x; Path=/api` and `warden_csrf=00` for 127.0.0.1, by `Set-Cookie` and by
/// script. Serves until the test ends; its port.
fn attack_page() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = "<!doctype html><title>cats</title><p id=tossed>cute cats</p>\
                        <script>document.cookie = 'warden_session=x; path=/api'; \
                        document.cookie = 'warden_csrf=00; path=/';</script>";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\
                 Set-Cookie: warden_session=x; Path=/api\r\n\
                 Set-Cookie: warden_csrf=00; Path=/\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn a_cookie_tossed_from_another_port_does_not_stop_halt_all() {
    let Some((chromium, chromedriver)) =
        browser_or_skip("a_cookie_tossed_from_another_port_does_not_stop_halt_all")
    else {
        return;
    };
    let _one = BROWSER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let serve = Serve::start("tossing", &team(4, 3600));
    let attacker = attack_page();
    let browser = Browser::start(&chromium, &chromedriver);
    log_in(&browser, &serve, ADMIN);
    browser.until("8 rows", &rows_script("rows.length === 8"));

    // The admin visits another page on this host; it tosses its cookies in.
    browser.goto(&format!("http://127.0.0.1:{attacker}/"));
    browser.until(
        "the hostile page",
        "return !!document.getElementById('tossed')",
    );
    // Back to the console: it still shows the agents (not the login page), its stream comes back,
    // and HALT ALL halts.
    browser.goto(&format!("{}/#agents", serve.url));
    browser.until("8 rows", &rows_script("rows.length === 8"));
    browser.until(
        "the event stream open again",
        "return document.body.dataset.stream === 'open'",
    );
    browser.click("#halt-all");
    browser.until(
        "the confirmation",
        "return document.getElementById('halt-dialog').open",
    );
    browser.click("#halt-yes");
    wait_for("every agent STOPPED", Duration::from_secs(20), || {
        serve
            .bearer("GET", "/api/agents", READ, None)
            .1
            .as_array()
            .is_some_and(|a| a.len() == 8 && a.iter().all(|x| x["state"] == "STOPPED"))
    });
    browser.until(
        "every row STOPPED",
        &rows_script("rows.every(r => r.dataset.state === 'STOPPED')"),
    );
    browser.screenshot("tossed-halted");

    // Tossed again, then a fresh login (the attacker's cookies still in the jar) works too.
    let (status, _) = serve.bearer("POST", "/api/agents/greeter/resume", ADMIN, None);
    assert_eq!(status, 200);
    browser.goto(&format!("http://127.0.0.1:{attacker}/"));
    browser.until(
        "the hostile page",
        "return !!document.getElementById('tossed')",
    );
    browser.goto(&format!("{}/console/login", serve.url));
    browser.until(
        "the login page",
        "return !!document.getElementById('token')",
    );
    browser.type_into("#token", ADMIN);
    browser.click("#login-submit");
    browser.until("8 rows", &rows_script("rows.length === 8"));
    browser.until(
        "greeter resumed on screen",
        "return document.querySelector('tr[data-key=greeter]').dataset.state === 'WAITING_FOR_EVENT'",
    );
    // (Clicked by script: the table is redrawn as events arrive, a found element can go stale.)
    browser.js("document.querySelector('button[data-action=halt][data-key=greeter]').click()");
    wait_for("greeter STOPPED", Duration::from_secs(20), || {
        serve.agent("greeter")["state"] == "STOPPED"
    });
}

#[test]
fn the_first_paint_with_a_thousand_agents() {
    let Some((chromium, chromedriver)) = browser_or_skip("the_first_paint_with_a_thousand_agents")
    else {
        return;
    };
    let _one = BROWSER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let serve = Serve::start("thousand", &team(996, 3600));
    let browser = Browser::start(&chromium, &chromedriver);
    log_in(&browser, &serve, ADMIN);
    browser.until(
        "the table",
        "return document.getElementById('agents-shown').textContent.startsWith('1000 of 1000')",
    );
    // Measured on a fresh load (the login's redirect is not counted): navigation start to the
    // table showing the agents.
    let mut paints = Vec::new();
    for _ in 0..3 {
        browser.goto(&format!("{}/", serve.url));
        browser.until(
            "the first paint",
            "return window.wardenPerf && window.wardenPerf.firstPaint !== null",
        );
        paints.push(
            browser
                .js("return window.wardenPerf.firstPaint")
                .as_f64()
                .unwrap(),
        );
    }
    browser.screenshot("thousand");
    // Pages and filters.
    browser.click("#page-next");
    browser.until(
        "page 2",
        "return document.querySelector('#agents-body tr').dataset.key === 'worker-00096'",
    );
    browser.type_into("#f-text", "worker-0098");
    browser.until(
        "the filter",
        &rows_script(
            "rows.length === 10 && rows.every(r => r.dataset.key.startsWith('worker-0098'))",
        ),
    );
    let best = paints.iter().copied().fold(f64::INFINITY, f64::min);
    say(&format!(
        "console figures: first paint with 1000 agents: {paints:?} ms (best {best:.0} ms)"
    ));
    // The target is 200 ms; a shared two-core CI machine gets a margin, and the figure is printed.
    assert!(best <= 1000.0, "first paint {best} ms");
}

/// A cluster node's team: `agents` answering, in the cluster at `url` as `node`.
fn cluster_team(url: &str, node: &str, agents: &[&str]) -> String {
    let mut team = format!(
        "[providers.ok]\nkind = \"scripted\"\ncycle = true\nreplies = [\"hi\"]\n\n[cluster]\n\
         url = \"{url}\"\nnode = \"{node}\"\nfail_safe_seconds = 2\nlease_ttl_seconds = 3\n"
    );
    for agent in agents {
        team.push_str(&format!(
            "\n[[agents]]\nkey = \"{agent}\"\nprovider = \"ok\"\n"
        ));
    }
    team
}

#[test]
fn the_console_of_a_cluster_node_shows_every_node_and_halts_another_nodes_agent() {
    let Some((chromium, chromedriver)) = browser_or_skip(
        "the_console_of_a_cluster_node_shows_every_node_and_halts_another_nodes_agent",
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("warden-console-{}-nats", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let Some(nats) = warden_testkit::nats::NatsServer::start(&dir) else {
        return;
    };
    let _one = BROWSER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let a = Serve::start("cluster-a", &cluster_team(&nats.url(), "a", &["a1"]));
    let b = Serve::start("cluster-b", &cluster_team(&nats.url(), "b", &["b1"]));
    let browser = Browser::start(&chromium, &chromedriver);
    log_in(&browser, &b, ADMIN);
    // b's console lists a's agent with its node, and says which node it is.
    browser.until(
        "both nodes' agents",
        &rows_script(
            "rows.length === 2 && \
             document.querySelector('tr[data-key=a1] .node')?.dataset.node === 'a' && \
             document.querySelector('tr[data-key=b1] .node')?.dataset.node === 'b'",
        ),
    );
    browser.until(
        "the cluster gauge",
        "return document.getElementById('g-cluster').textContent.startsWith('node b · 2 nodes')",
    );
    assert_eq!(
        browser.js("return document.getElementById('cluster-banner').hidden"),
        true
    );
    // Another node's agent: resume and unlock are not offered here; its halt is.
    assert_eq!(
        browser.js(
            "return document.querySelector('button[data-action=resume][data-key=a1]').disabled"
        ),
        true
    );
    browser.screenshot("cluster");
    browser.click("button[data-action=halt][data-key=a1]");
    browser.until(
        "a1 stopped on screen",
        "return document.querySelector('tr[data-key=a1]').dataset.state === 'STOPPED'",
    );
    assert_eq!(a.agent("a1")["state"], "STOPPED", "halted on node a");
    assert_eq!(b.agent("b1")["state"], "WAITING_FOR_EVENT");
    // Its detail says where it runs.
    browser.goto(&format!("{}/#agent/a1", b.url));
    browser.until(
        "the node in the detail",
        "return document.getElementById('agent-summary').textContent.includes('another node')",
    );
    assert_eq!(
        browser
            .js("return document.getElementById('agent-summary').textContent.includes('STOPPED')"),
        true,
        "the detail shows the halt the owner applied"
    );
    browser.until(
        "the timeline says where its events are",
        "return document.getElementById('timeline').textContent.includes('runs on node a')",
    );
    assert_eq!(
        browser.js("return document.getElementById('chat-send').disabled"),
        true
    );
    // NATS gone: b's fail safe comes on (fail_safe_seconds = 2), and the console says so.
    let mut nats = nats;
    nats.kill();
    browser.until(
        "the fail-safe banner",
        "const b = document.getElementById('cluster-banner'); \
         return !b.hidden && b.textContent.includes('fail safe')",
    );
    browser.screenshot("cluster-fail-safe");
    drop(browser);
    drop(b);
    drop(a);
    drop(nats);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- a permission ask on the approvals page -----------------------------------------------------

/// A minimal MCP stdio server (newline-delimited JSON-RPC, no SDK): `wipe` is annotated
/// `destructiveHint: true` (so DANGEROUS) and appends its arguments to `ran.log` beside this
/// script when it runs, so the test sees whether it ran.
const WIPE_SERVER: &str = r#"
import json, os, sys
LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.log")
TOOLS = [{"name": "wipe", "description": "Deletes a path.",
          "annotations": {"destructiveHint": True, "readOnlyHint": False},
          "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("id") is None:
        continue
    method, id = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "wipe", "version": "0"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        with open(LOG, "a") as f:
            f.write(json.dumps(msg["params"].get("arguments", {})) + "\n")
        result = {"content": [{"type": "text", "text": "wiped"}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": id, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// The arguments `wipe` ran with, one per run.
fn wipe_runs(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("ran.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `[permissions] dangerous = "ask"` and a DANGEROUS MCP tool: the approvals page shows the ask as
/// the agent, the tool, its arguments (markup in them shown as text, never parsed), the category
/// and the rule, with a drawn pause sign (no "⏸" glyph); yes runs the tool, the next ask's no
/// refuses it, and the journal has both decisions with their notes.
#[test]
fn a_permission_ask_shows_the_tool_and_its_arguments_and_yes_or_no_decides() {
    let Some((chromium, chromedriver)) = browser_or_skip("a_permission_ask_in_the_browser") else {
        return;
    };
    let have_python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_python {
        warden_testkit::skip("python3 is not installed (needed for the wipe MCP server)");
        return;
    }
    let _one = BROWSER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let tool_dir = std::env::temp_dir().join(format!(
        "warden-console-{}-permission-tool",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tool_dir);
    std::fs::create_dir_all(&tool_dir).unwrap();
    let script = tool_dir.join("wipe.py");
    std::fs::write(&script, WIPE_SERVER).unwrap();
    let team = format!(
        r#"
[permissions]
dangerous = "ask"

[providers.m]
kind = "scripted"
replies = [
  {{ tool = "w__wipe", args = {{ path = "notes/<img src=x onerror=alert(1)>old" }} }},
  {{ tool = "w__wipe", args = {{ path = "/etc" }} }},
  "refused, so I stop",
]

[mcp_servers.w]
command = "python3"
args = [{script:?}]

[[agents]]
key = "g"
provider = "m"
delegate = false
tools = ["w.wipe"]
"#
    );
    let serve = Serve::start("permission", &team);
    let browser = Browser::start(&chromium, &chromedriver);
    log_in(&browser, &serve, ADMIN);
    let send = |text: &str| {
        let (status, body) = serve.bearer(
            "POST",
            "/api/agents/g/events",
            ADMIN,
            Some(json!({ "content": text })),
        );
        assert_eq!(status, 202, "{body}");
    };

    send("tidy up");
    browser.goto(&format!("{}/#approvals", serve.url));
    browser.until(
        "the ask's card",
        "return !!document.querySelector('li[data-intervention]')",
    );
    let card = browser.js(
        "const li = document.querySelector('li[data-intervention]'); \
         const text = (css) => li.querySelector(css)?.textContent ?? null; \
         return { text: li.innerText, \
                  tool: text('.ask-tool'), \
                  args: text('.ask-arguments'), \
                  parsed: li.querySelectorAll('img').length, \
                  category: text('.ask-category'), \
                  rule: text('.ask-rule'), \
                  icon: li.querySelectorAll('strong svg.icon').length };",
    );
    browser.screenshot("permission-ask");
    let shown = card["text"].as_str().unwrap();
    assert!(!shown.contains("undefined"), "{shown}");
    assert!(
        !shown.contains('⏸'),
        "the glyph Debian's fonts lack: {shown}"
    );
    assert!(shown.contains("g wants to run"), "{shown}");
    assert_eq!(card["tool"], "w__wipe");
    assert_eq!(card["category"], "DANGEROUS");
    assert_eq!(card["rule"], "permissions.dangerous");
    assert_eq!(card["icon"], 1, "a drawn pause sign");
    assert_eq!(card["parsed"], 0, "the arguments' markup is text: {card}");
    let args: Value = serde_json::from_str(card["args"].as_str().unwrap()).unwrap();
    assert_eq!(
        args,
        json!({"path": "notes/<img src=x onerror=alert(1)>old"})
    );
    assert!(
        card["args"].as_str().unwrap().contains("\n  \"path\""),
        "pretty JSON: {card}"
    );
    assert!(wipe_runs(&tool_dir).is_empty(), "nothing runs while asked");

    let id =
        browser.js("return document.querySelector('li[data-intervention]').dataset.intervention");
    browser.type_into(
        &format!("#note-{}", id.as_str().unwrap()),
        "old notes may go",
    );
    browser.click("li[data-intervention] button[data-answer=yes]");
    browser.until(
        "the ask answered",
        "return !document.querySelector('li[data-intervention]')",
    );
    wait_for("the yes ran the tool", Duration::from_secs(30), || {
        wipe_runs(&tool_dir).len() == 1
    });
    assert_eq!(
        wipe_runs(&tool_dir),
        vec![json!({"path": "notes/<img src=x onerror=alert(1)>old"})]
    );
    wait_for("turn 1", Duration::from_secs(30), || {
        serve.agent("g")["turns"].as_u64() >= Some(1)
    });

    send("tidy more");
    browser.until(
        "the second ask",
        "return !!document.querySelector('li[data-kind=permission] .ask-arguments') && \
         document.querySelector('.ask-arguments').textContent.includes('/etc')",
    );
    let id =
        browser.js("return document.querySelector('li[data-intervention]').dataset.intervention");
    browser.type_into(&format!("#note-{}", id.as_str().unwrap()), "never /etc");
    browser.click("li[data-intervention] button[data-answer=no]");
    browser.until(
        "the second ask answered",
        "return !document.querySelector('li[data-intervention]')",
    );
    wait_for("turn 2", Duration::from_secs(30), || {
        serve.agent("g")["turns"].as_u64() >= Some(2)
    });
    assert_eq!(wipe_runs(&tool_dir).len(), 1, "no refused it");
    let (_, asks) = serve.bearer("GET", "/api/interventions", READ, None);
    assert_eq!(asks, json!([]));
    let mut recent = String::new();
    wait_for("both decisions journaled", Duration::from_secs(30), || {
        recent = serve
            .bearer("GET", "/api/events/recent?agent=g&limit=200", READ, None)
            .1
            .to_string();
        recent.matches("\"permission_decided\"").count() == 2
    });
    assert!(
        recent.contains("old notes may go") && recent.contains("never /etc"),
        "{recent}"
    );
    let _ = std::fs::remove_dir_all(&tool_dir);
}
