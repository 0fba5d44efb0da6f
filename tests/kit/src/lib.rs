//! Test support shared by warden's crates (a dev-dependency only; never in a build users get).
//!
//! * [`http`] — a raw HTTP/1.1 server on 127.0.0.1 whose every byte a test scripts: complete
//!   responses, chunked SSE bodies, connections cut mid-body, stalls, and noticing when the client
//!   hangs up. The OpenAI provider's tests and the ReAct loop's HTTP tests both use it.
//! * [`nats`] — real `nats-server` children (JetStream on) and a TCP proxy that black-holes a
//!   connection, for the cluster tests.
//! * [`netns`] — network namespaces joined to the host by veth pairs, for partitions that are
//!   real (a link set down in the kernel), for the cluster tests run as root.
//! * [`Serve`] — a real `warden serve` process: started on a free port, ready at `/healthz`, its
//!   tokens, stopped by its pid, its log kept when the test fails.
//! * [`free_port`] — a loopback port nobody listens on (for processes started on a port).
//! * [`wait_for`], [`wait_until`] — poll a condition with a deadline (tests of processes, which
//!   have no paused clock).
//! * [`scratch_dir`] — a directory removed when the test passes; [`now_ms`].
//!
//! Scenario helpers over the journal (replays, refusals, outcomes) stay in `tests/common`: they
//! need the `warden` facade, which this crate must not depend on (`warden-actors` uses it too).

#![warn(missing_docs)]

pub mod http;
pub mod nats;
pub mod netns;
pub mod serve;

pub use serve::Serve;

/// A scratch directory, removed when the test passes (kept for a look when it fails). Declared
/// first in a test, it is dropped last: after the processes and servers it holds are stopped.
#[derive(Debug)]
pub struct Scratch(std::path::PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Shown with the failed test's output (the harness captures stderr of passing ones).
            eprintln!("kept for a look: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh [`Scratch`] directory `warden-PREFIX-PID-NAME` under the system's temporary directory.
///
/// # Panics
/// When it cannot be created.
pub fn scratch_dir(prefix: &str, name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("warden-{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    Scratch(dir)
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(since.unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

/// Polls `cond` every 20 ms until it holds (`true`) or `limit` passed (`false`).
pub fn wait_for(limit: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    loop {
        if cond() {
            return true;
        }
        if started.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// [`wait_for`], panicking with `what` when `limit` passed; how long it took.
///
/// # Panics
/// When `cond` does not hold within `limit`.
pub fn wait_until(
    what: &str,
    limit: std::time::Duration,
    cond: impl FnMut() -> bool,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    assert!(
        wait_for(limit, cond),
        "never happened within {limit:?}: {what}"
    );
    started.elapsed()
}

/// One blocking HTTP/1.1 request to 127.0.0.1:`port` on a fresh connection (`Connection: close`),
/// with `Authorization: Bearer token` and a JSON body when given: the status code and the body.
/// For tests of `warden serve` processes.
///
/// # Errors
/// When the connection or the exchange fails (a read waits at most 20 s).
pub fn blocking_request(
    port: u16,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    blocking_request_to(loopback, method, path, token, body)
}

/// [`blocking_request`] to any address (a `warden serve` inside a network namespace); the
/// connection waits at most 5 s.
///
/// # Errors
/// When the connection or the exchange fails (a read waits at most 20 s).
pub fn blocking_request_to(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(20)))?;
    let body = body.unwrap_or("");
    let host = addr.ip();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A loopback port that was free a moment ago (bound, then released).
///
/// # Panics
/// If no port can be bound on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// Skips a test whose tool (a browser, node, `nats-server`, root for namespaces…) is missing:
/// prints `SKIPPED: WHY` on standard error (shown in `cargo test`'s output even though the test
/// passes) and returns, so the caller returns and the test passes.
/// Under `CI=true` (what `.ci/run` runs with) a missing tool is a failure, never a silent pass: this
/// panics with the same text instead.
///
/// # Panics
/// When the environment variable `CI` is set to anything but `false` or `0`.
pub fn skip(why: &str) {
    if in_ci() {
        panic!("{why} (required under CI=true: .ci/run installs it)");
    }
    // Written to the process's standard error itself, not through `eprintln!`, which the test
    // harness captures and hides for a passing test: a skip shows in `cargo test`'s output.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED: {why}");
}

/// Whether the tests run under CI (`CI` set, and not to `false` or `0`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

#[cfg(test)]
mod tests {
    /// Runs this test binary's `skip_probe` alone, with `CI` as given: its exit status and output.
    fn probe(ci: Option<&str>) -> std::process::Output {
        let mut command = std::process::Command::new(std::env::current_exe().expect("this binary"));
        command
            .args(["tests::skip_probe", "--exact", "--test-threads=1"])
            .env("WARDEN_SKIP_PROBE", "1")
            .env_remove("CI");
        if let Some(ci) = ci {
            command.env("CI", ci);
        }
        command.output().expect("run the probe")
    }

    /// Calls [`crate::skip`] when run by [`a_skip_is_shown_outside_ci_and_fails_under_ci`].
    #[test]
    fn skip_probe() {
        if std::env::var_os("WARDEN_SKIP_PROBE").is_some() {
            crate::skip("probe tool missing");
        }
    }

    #[test]
    fn a_skip_is_shown_outside_ci_and_fails_under_ci() {
        let outside = probe(None);
        let shown = String::from_utf8_lossy(&outside.stdout).into_owned()
            + &String::from_utf8_lossy(&outside.stderr);
        assert!(outside.status.success(), "{shown}");
        assert!(
            shown.contains("SKIPPED: probe tool missing"),
            "a passing skip is visible in the test output: {shown}"
        );
        let under_ci = probe(Some("true"));
        assert!(!under_ci.status.success(), "a skip under CI=true fails");
        assert!(probe(Some("false")).status.success());
    }
}
