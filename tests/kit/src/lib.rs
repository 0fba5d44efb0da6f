//! Test support shared by warden's crates (a dev-dependency only; never in a build users get).
//!
//! * [`http`] — a raw HTTP/1.1 server on 127.0.0.1 whose every byte a test scripts: complete
//!   responses, chunked SSE bodies, connections cut mid-body, stalls, and noticing when the client
//!   hangs up. The OpenAI provider's tests and the ReAct loop's HTTP tests both use it.
//! * [`free_port`] — a loopback port nobody listens on (for processes started on a port).
//!
//! Scenario helpers over the journal (replays, refusals, outcomes) stay in `tests/common`: they
//! need the `warden` facade, which this crate must not depend on (`warden-actors` uses it too).

#![warn(missing_docs)]

pub mod http;

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
