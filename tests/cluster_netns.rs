//! Real partitions for `warden serve --cluster`: node b runs inside a network namespace of its own
//! (`warden_testkit::netns`) and its whole network to NATS is cut in the kernel (`ip link set …
//! down` on the host side of its veth: a black hole, no FIN, no RST); node a and `nats-server` run
//! on the host (nats-server listens on the host's address of b's veth, which a reaches over
//! `lo`). The test reaches b's API over a second veth that stays up. `tests/cluster.rs` has the
//! same cases with a black-holing TCP proxy (they run without root); these are the real ones.
//!
//! Each test needs root and `ip` (iproute2) and skips, saying `SKIPPED: network namespaces
//! unavailable: …`, when it cannot create a namespace; and `SKIPPED: nats-server not installed`
//! without `nats-server`.
//!
//! * A partition: b enters its fail safe within `fail_safe_seconds` (+ one beat), `/healthz` on b
//!   answers 503 degraded, no model call starts there; a halt on a meanwhile lists b as
//!   unanswered; healed, b applies the halt it missed before its model gate opens, and the result
//!   of a call in flight at the cut (held meanwhile) is dropped. Prints when the fail safe came
//!   and how long after the heal the halt was applied.
//! * A lockout on b, then b cut off: the unlock on b is refused (503) and the agent stays locked
//!   out; a delegation from a is still refused `emergency_stop`; healed, the unlock goes through.
//! * A node killed while partitioned: its leases expire on a within the TTL; restarted (still in
//!   its namespace, healed) it takes its agent back.
mod cluster_node;

use cluster_node::{peers, team, Node, CLUSTER};
use std::{
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};
use warden_testkit::{nats::NatsServer, netns::Netns, now_ms, scratch_dir, wait_until, Scratch};

/// `cluster.fail_safe_seconds` of every team here.
const FAIL_SAFE: Duration = Duration::from_secs(2);
/// One beat: `lease_ttl_seconds` (3) / 3.
const BEAT: Duration = Duration::from_secs(1);
/// `cluster.lease_ttl_seconds` of every team here.
const LEASE_TTL: Duration = Duration::from_secs(3);

fn temp_dir(name: &str) -> Scratch {
    scratch_dir("netns", name)
}

/// A namespace for node b and a `nats-server` it can reach (on the host's address of its NATS
/// veth); `None` (the test returns, having said why) when either is unavailable.
fn netns_and_nats(dir: &Path) -> Option<(Netns, NatsServer)> {
    let netns = Netns::create_or_skip()?;
    let nats = NatsServer::start_on(dir, IpAddr::V4(netns.nats_host))?;
    Some((netns, nats))
}

/// The model calls `agent` on `node` made that returned: its `usage_recorded` journal entries
/// (each call's usage is recorded when its result comes back, held or not).
fn model_calls(node: &Node, agent: &str) -> usize {
    let recent = node.get(&format!("/api/events/recent?agent={agent}&limit=1000"));
    recent["events"].as_array().map_or(0, |events| {
        events
            .iter()
            .filter(|e| e["kind"]["type"] == "usage_recorded")
            .count()
    })
}

fn in_fail_safe(node: &Node) -> bool {
    node.request("GET", "/metrics", None).1.contains(&format!(
        "warden_cluster_fail_safe{{node=\"{}\"}} 1",
        node.name
    ))
}

#[test]
fn a_node_cut_off_in_its_namespace_fails_safe_and_applies_the_missed_halt_before_any_call() {
    let dir = temp_dir("partition");
    let Some((netns, nats)) = netns_and_nats(&dir) else {
        return;
    };
    let a = Node::start_in(&dir, "a", &nats.url(), &team(&["a1"], 0), None);
    // On b, b1's model answers after 3 s, b2's at once.
    let b_team = format!(
        "{}\n[providers.fast]\nkind = \"scripted\"\nreplies = [\"fast\"]\ncycle = true\n\n\
         [[agents]]\nkey = \"b2\"\nprovider = \"fast\"\n",
        team(&["b1"], 3000)
    );
    let b = Node::start_in(&dir, "b", &nats.url(), &b_team, Some(&netns));
    peers(&a, &["b"]);
    peers(&b, &["a"]);
    // b answers while connected.
    let (status, body) = b.post("/api/agents/b1/events?wait=10", Some(r#"{"content":"hi"}"#));
    assert_eq!(status, 200, "{body}");
    // A call in flight when the cut comes: its result returns while b is cut off (fail safe on
    // after at most 2 s + a beat, the result after 3 s), so it is held, and dropped once b learns
    // of the halt below.
    let (status, body) = b.post("/api/agents/b1/events", Some(r#"{"content":"in flight"}"#));
    assert_eq!(status, 202, "{body}");
    let in_flight = body["id"].as_u64().expect("an event id");
    wait_until("the call started", Duration::from_secs(5), || {
        b.state_of("b1") == "EXECUTING"
    });
    netns.partition();
    let cut = Instant::now();
    let cut_ms = now_ms();
    // A halt on a meanwhile does not wait for b: b (its heartbeat still lives) is listed as not
    // answering, after `halt_ack_timeout_ms` (1.5 s).
    let (status, body) = a.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unanswered"], serde_json::json!(["b"]), "{body}");
    assert!(
        cut.elapsed() < Duration::from_millis(1900),
        "{:?}",
        cut.elapsed()
    );
    assert_eq!(a.state_of("a1"), "STOPPED");
    wait_until("b's fail safe on", Duration::from_secs(10), || {
        in_fail_safe(&b)
    });
    let seen = cut.elapsed();
    let cluster = b.get("/api/cluster");
    let since_ms = cluster["fail_safe_since_ms"]
        .as_u64()
        .expect("fail_safe_since_ms while in the fail safe");
    let on = Duration::from_millis(since_ms.saturating_sub(cut_ms));
    eprintln!(
        "node in a namespace, NATS link down: fail safe entered {:.2} s after the cut (seen by \
         the test after {:.2} s; fail_safe_seconds = 2, a beat is 1 s)",
        on.as_secs_f64(),
        seen.as_secs_f64()
    );
    assert!(
        on <= FAIL_SAFE + BEAT,
        "fail safe {on:?} after the cut, more than fail_safe_seconds + one beat"
    );
    assert!(cluster["fail_safe"].is_string(), "{cluster}");
    eprintln!("b says: {}", cluster["fail_safe"]);
    let (status, health) = b.request("GET", "/healthz", None);
    assert_eq!(status, 503, "{health}");
    assert!(
        health.contains("degraded") && health.contains("cluster fail safe"),
        "{health}"
    );
    // A new event is accepted but no model call starts: not for b2 (idle at the cut, its model
    // answers at once), not for b1 (its call in flight came back at 3 s, held).
    assert_eq!(model_calls(&b, "b2"), 0);
    let (status, body) = b.post("/api/agents/b2/events", Some(r#"{"content":"now"}"#));
    assert_eq!(status, 202, "{body}");
    let now = body["id"].as_u64().expect("an event id");
    let (status, body) = b.post("/api/agents/b1/events", Some(r#"{"content":"again"}"#));
    assert_eq!(status, 202, "{body}");
    let again = body["id"].as_u64().expect("an event id");
    std::thread::sleep(Duration::from_millis(3000).saturating_sub(cut.elapsed()) + BEAT);
    assert!(in_fail_safe(&b), "b left its fail safe while cut off");
    for (agent, id) in [("b2", now), ("b1", again), ("b1", in_flight)] {
        let fate = b.get(&format!("/api/agents/{agent}/events/{id}"));
        assert_ne!(fate["status"], "answered", "{agent}, while cut off: {fate}");
    }
    assert_eq!(
        model_calls(&b, "b2"),
        0,
        "b2's model was called in the fail safe"
    );
    // b1: the call before the cut, and maybe the one in flight at the cut (its usage is
    // recorded once b is back and drops it).
    let b1_calls = model_calls(&b, "b1");
    assert!(b1_calls <= 2, "b1 called its model {b1_calls} times");
    assert_eq!(b.get("/api/agents/b1")["turns"], 1);
    // Healed: b reads the halt key before its gate opens. Each sample reads b's fail safe first,
    // then b1's state: once the fail safe is off, b1 must already be stopped.
    let cut_for = cut.elapsed();
    netns.heal();
    let healed = Instant::now();
    let mut halted_after = None;
    let mut open_after = None;
    while open_after.is_none() {
        assert!(
            healed.elapsed() < Duration::from_secs(30),
            "b never left its fail safe after the heal: {}",
            b.stderr()
        );
        let off = b.get("/api/cluster")["fail_safe"].is_null();
        let stopped = b.state_of("b1") == "STOPPED" && b.state_of("b2") == "STOPPED";
        let at = healed.elapsed();
        if stopped && halted_after.is_none() {
            halted_after = Some(at);
        }
        if off {
            assert!(
                stopped,
                "b's gate opened before the missed halt was applied"
            );
            open_after = Some(at);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (halted_after, open_after) = (
        halted_after.unwrap_or_default(),
        open_after.unwrap_or_default(),
    );
    assert!(
        open_after <= Duration::from_secs(5),
        "b took {open_after:?} after the heal to read the halt key and leave its fail safe"
    );
    eprintln!(
        "healed after a {:.1} s cut: the missed halt applied on b {} ms after the heal, its fail \
         safe off {} ms after the heal",
        cut_for.as_secs_f64(),
        halted_after.as_millis(),
        open_after.as_millis()
    );
    // The result that came back while b was cut off was dropped (the halt was older), and the
    // queued events never ran: b2 stopped without a model call, b1 still at one turn.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(b.state_of("b2"), "STOPPED");
    for (agent, id) in [("b2", now), ("b1", again), ("b1", in_flight)] {
        let fate = b.get(&format!("/api/agents/{agent}/events/{id}"));
        assert_ne!(
            fate["status"], "answered",
            "{agent}, after the heal: {fate}"
        );
    }
    assert_eq!(
        model_calls(&b, "b2"),
        0,
        "b2's model was called after the heal"
    );
    assert_eq!(
        model_calls(&b, "b1"),
        2,
        "b1: the call before the cut and the one in flight at the cut, no other"
    );
    assert_eq!(b.get("/api/agents/b1")["turns"], 1);
    assert_eq!(b.get("/api/cluster")["halt"]["epoch"], 1);
    assert!(b.stderr().contains("cluster fail safe:"), "{}", b.stderr());
    assert!(b.journal().contains("cluster fail safe"));
}

/// The `worker`'s team: its model always fails, its breaker trips after one error.
fn failing_worker() -> String {
    format!(
        "[safety.breakers]\nmax_consecutive_errors = 1\n\n[providers.m]\nkind = \"scripted\"\n\
         cycle = true\nreplies = [{{ fail = \"model down\" }}]\n\n{CLUSTER}\n[[agents]]\nkey = \
         \"worker\"\nprovider = \"m\"\n"
    )
}

/// `boss`, whose model delegates a task to `worker`, then answers "done".
fn boss_team() -> String {
    format!(
        "[providers.m]\nkind = \"scripted\"\ncycle = true\nreplies = [\n  {{ tool = \"delegate\", \
         args = {{ agent = \"worker\", task = \"x\" }} }},\n  \"done\",\n]\n\n{CLUSTER}\n\
         [[agents]]\nkey = \"boss\"\nprovider = \"m\"\n"
    )
}

/// The delegations `boss` saw refused `emergency_stop` (from its recent events on a).
fn refusals(a: &Node) -> usize {
    let events = a.get("/api/events/recent?agent=boss&limit=500");
    events["events"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|e| {
                    let text = e.to_string();
                    text.contains("delegation_refused") && text.contains("emergency_stop")
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_lockout_on_a_cut_off_node_cannot_be_unlocked_and_still_refuses_delegation() {
    let dir = temp_dir("lockout");
    let Some((netns, nats)) = netns_and_nats(&dir) else {
        return;
    };
    let a = Node::start_in(&dir, "a", &nats.url(), &boss_team(), None);
    let b = Node::start_in(&dir, "b", &nats.url(), &failing_worker(), Some(&netns));
    // The worker trips its breaker on b; a learns it from the lockout bucket.
    let (status, body) = b.post("/api/agents/worker/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("worker locked out on b", Duration::from_secs(10), || {
        b.state_of("worker") == "SAFETY_LOCKOUT"
    });
    wait_until("a sees the lockout", Duration::from_secs(5), || {
        a.get("/api/cluster")["lockouts"]["worker"]["locked"] == true
    });
    // b cut off, for real.
    netns.partition();
    let cut = Instant::now();
    wait_until("b's fail safe on", Duration::from_secs(10), || {
        in_fail_safe(&b)
    });
    // The unlock needs a write to the cluster: refused, the worker stays locked out.
    let asked = Instant::now();
    let (status, body) = b.post("/api/agents/worker/unlock", None);
    let took = asked.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("unlock refused")),
        "{body}"
    );
    assert_eq!(b.state_of("worker"), "SAFETY_LOCKOUT");
    eprintln!(
        "unlock on b cut off {:.1} s: refused 503 in {} ms",
        cut.elapsed().as_secs_f64(),
        took.as_millis()
    );
    // Delegation from a to the worker, once b's lease has expired on a: still refused
    // emergency_stop (a's cache of the lockout bucket, no network to b).
    wait_until("b's lease expires on a", LEASE_TTL + BEAT * 2, || {
        a.fleet().iter().all(|(_, node, _)| node != "b")
    });
    let before = refusals(&a);
    let (status, body) = a.post(
        "/api/agents/boss/events?wait=10",
        Some(r#"{"content":"go"}"#),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(refusals(&a), before + 1, "the delegation was not refused");
    assert_eq!(b.state_of("worker"), "SAFETY_LOCKOUT");
    // Healed: the unlock goes through once the write does, and a sees it.
    netns.heal();
    let healed = Instant::now();
    wait_until("the unlock succeeds", Duration::from_secs(30), || {
        b.post("/api/agents/worker/unlock", None).0 == 200
    });
    eprintln!(
        "healed: the unlock on b succeeded {} ms after the heal",
        healed.elapsed().as_millis()
    );
    assert_eq!(b.state_of("worker"), "WAITING_FOR_EVENT");
    wait_until("a sees the unlock", Duration::from_secs(5), || {
        a.get("/api/cluster")["lockouts"]["worker"]["locked"] == false
    });
}

#[test]
fn a_node_killed_while_cut_off_loses_its_leases_and_takes_them_back_on_restart() {
    let dir = temp_dir("killed");
    let Some((netns, nats)) = netns_and_nats(&dir) else {
        return;
    };
    let a = Node::start_in(&dir, "a", &nats.url(), &team(&["a1"], 0), None);
    let mut b = Node::start_in(&dir, "b", &nats.url(), &team(&["b1"], 0), Some(&netns));
    wait_until("a lists b's agent", Duration::from_secs(10), || {
        a.fleet().iter().any(|(k, n, _)| k == "b1" && n == "b")
    });
    netns.partition();
    let cut = Instant::now();
    // Killed while cut off: nothing it sends on the way out (a FIN) reaches NATS.
    b.kill();
    let gone = wait_until("b's agent leaves a's fleet", LEASE_TTL + BEAT * 5, || {
        a.fleet().iter().all(|(_, node, _)| node != "b")
    });
    let after_cut = cut.elapsed();
    eprintln!(
        "node killed while cut off: its leases expired on a {:.2} s after the kill ({:.2} s after \
         the cut; lease_ttl_seconds = 3)",
        gone.as_secs_f64(),
        after_cut.as_secs_f64()
    );
    assert!(
        after_cut <= LEASE_TTL + BEAT * 2,
        "leases lived {after_cut:?} after the cut"
    );
    peers(&a, &[]);
    // Healed and restarted in its namespace under the same name: it takes its agent back.
    netns.heal();
    b.spawn();
    assert_eq!(b.state_of("b1"), "WAITING_FOR_EVENT");
    wait_until("a lists b's agent again", Duration::from_secs(10), || {
        a.fleet().iter().any(|(k, n, _)| k == "b1" && n == "b")
    });
}
