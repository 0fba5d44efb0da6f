//! `warden serve --cluster` on real processes: `nats-server -js` children and `warden serve`
//! children on loopback ports (docs/cluster.md). Each test skips, saying
//! `SKIPPED: nats-server not installed`, where there is no `nats-server`.
//!
//! * A halt on node a stops b and c: over 25 trials, `POST /api/halt` on a returns with every
//!   node's acknowledgements (b's and c's agents `STOPPED`); p50/p99 of that round trip are
//!   printed and p99 must be ≤ 1 s.
//! * A node started after the halt comes up halted.
//! * A node crash: its leases expire (the fleet listing on the others drops its agents within the
//!   TTL), a node started meanwhile with the same agent does not start it while the lease lives,
//!   and the crashed node, restarted, takes its agents back.
//! * A NATS restart mid-run: the nodes reconnect, the halt key survived, and a later halt reaches
//!   every node.
//! * A lockout on node b: published to the lockout bucket, seen by a, a delegation from a to the
//!   locked-out agent is refused `emergency_stop`; cut off, b refuses the unlock (503); healed, it
//!   unlocks.
//! * A three-server NATS cluster (replicated buckets): with one server killed the nodes recover and
//!   a halt reaches every node and is written; with two killed (no quorum) every node fails safe and
//!   a local halt still works; it is written once the quorum is back.
//! * A partition (a TCP proxy between node b and NATS that black-holes the connection): b starts
//!   no model call within `fail_safe_seconds`, says so in `GET /api/cluster`, `/healthz`,
//!   `/metrics` and its journal; a halt on a meanwhile returns after its ack timeout listing b as
//!   unanswered; the result of a call in flight at the cut is held, and dropped once b, healed,
//!   reads the halt it missed; a halt on b while cut off stops b's agent at once. (The same with a
//!   real cut, node b in a network namespace whose link goes down: `tests/cluster_netns.rs`.)
//! * Cross-node delegation: boss on a delegates to worker on b and gets b's answer (20 round
//!   trips, p50/p99 printed); one request delivered three times runs once, every copy answered
//!   alike; a reply lost while a is black-holed is asked again and answered from b's first run; a
//!   1 s chain wait ends `timed_out` through the checkpoint; a halt of boss on a ends its wait and
//!   the cancel halts worker on b.
//! * A cascade across three nodes (a → b → c, 12 trees, 300 events): every hop runs once; a JSON
//!   line with latency percentiles, events per second and per-node figures is printed.
//! * A team token budget shared by two nodes in slices: both end stopped by it, every slice
//!   claimed by compare-and-swap, no node past what it held; a restarted node holds what it held.
//!
//! Waits poll with deadlines.
mod cluster_node;

use cluster_node::{peers, request, team, Node, TOKEN};
use futures::StreamExt;
use serde_json::Value;
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};
use warden_testkit::{
    free_port,
    nats::{NatsServer, Proxy},
    now_ms, scratch_dir, wait_until, Scratch,
};

fn temp_dir(name: &str) -> Scratch {
    scratch_dir("cluster", name)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Three nodes, each answering a halt broadcast before the others' acks are in.
fn three_nodes(dir: &Path, url: &str) -> [Node; 3] {
    [
        Node::start(dir, "a", url, &["a1", "a2"]),
        Node::start(dir, "b", url, &["b1", "b2"]),
        Node::start(dir, "c", url, &["c1"]),
    ]
}

#[test]
fn a_halt_on_node_a_stops_b_and_c() {
    let dir = temp_dir("halt");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let [a, b, c] = three_nodes(&dir, &nats.url());
    wait_until(
        "every node lists the whole fleet",
        Duration::from_secs(10),
        || [&a, &b, &c].iter().all(|n| n.fleet().len() == 5),
    );
    peers(&a, &["b", "c"]);

    assert_eq!(
        b.fleet(),
        [
            ("a1", "a"),
            ("a2", "a"),
            ("b1", "b"),
            ("b2", "b"),
            ("c1", "c")
        ]
        .map(|(k, n)| (k.into(), n.into(), "WAITING_FOR_EVENT".into()))
    );
    let trials = 25;
    let mut took = Vec::new();
    for trial in 0..trials {
        // Every agent running again (a resume is local), then a halt on a.
        let stopped = if trial == 0 {
            &[][..]
        } else {
            &[(&a, &["a1", "a2"][..]), (&b, &["b1", "b2"]), (&c, &["c1"])][..]
        };
        for (node, agents) in stopped {
            for agent in *agents {
                let (status, body) = node.post(&format!("/api/agents/{agent}/resume"), None);
                assert_eq!(status, 200, "{body}");
            }
        }
        let started = Instant::now();
        let (status, body) = a.post("/api/halt", None);
        took.push(started.elapsed());
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["unanswered"],
            serde_json::json!([]),
            "trial {trial}: {body}"
        );
        let mut halted: Vec<(String, String)> = body["halted"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["agent"].as_str().unwrap().to_owned(),
                    format!(
                        "{} {}",
                        h["node"].as_str().unwrap(),
                        h["state"].as_str().unwrap()
                    ),
                )
            })
            .collect();
        halted.sort();
        assert_eq!(halted.len(), 5, "trial {trial}: {body}");
        assert!(
            halted.iter().all(|(_, s)| s.ends_with(" STOPPED")),
            "{body}"
        );
        // The acks came from the nodes themselves: their own view agrees.
        assert_eq!(b.state_of("b1"), "STOPPED");
        assert_eq!(c.state_of("c1"), "STOPPED");
        assert_eq!(body["epoch"], trial + 1, "{body}");
    }
    took.sort();
    let (p50, p99) = (percentile(&took, 50.0), percentile(&took, 99.0));
    eprintln!(
        "cluster halt a→b,c over {trials} trials (POST /api/halt on a until every node's acks): \
         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        took[took.len() - 1].as_secs_f64() * 1e3
    );
    assert!(p99 <= Duration::from_secs(1), "p99 {p99:?}");
    // Every node's view of the halt key caught up.
    for node in [&a, &b, &c] {
        wait_until(
            "the halt key read everywhere",
            Duration::from_secs(5),
            || node.get("/api/cluster")["halt_epoch"] == trials,
        );
    }
}

#[test]
fn a_node_started_after_the_halt_comes_up_halted() {
    let dir = temp_dir("late");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    let (status, body) = a.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(a.state_of("a1"), "STOPPED");
    // b comes up after the halt, with a pending-free agent: halted before it serves.
    let b = Node::start(&dir, "b", &nats.url(), &["b1"]);
    assert_eq!(b.state_of("b1"), "STOPPED");
    assert!(b.stderr().contains("coming up halted"), "{}", b.stderr());
    let cluster = b.get("/api/cluster");
    assert_eq!(cluster["halt"]["halted"], true, "{cluster}");
    assert_eq!(cluster["halt_epoch"], 1, "{cluster}");
    // The CLI reads a cluster node's answers: the whole fleet, every node's halt acks.
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_warden"))
            .args(args)
            .args([
                "--url",
                &format!("http://127.0.0.1:{}", b.port),
                "--token",
                TOKEN,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Each agent with its node (the NODE column).
    let status = cli(&["status"]);
    let row = |agent: &str| {
        status
            .lines()
            .find(|l| l.starts_with(agent))
            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>())
    };
    assert!(status.starts_with("AGENT  NODE  ROLE"), "{status}");
    assert_eq!(row("a1"), Some(vec!["a1", "a"]), "{status}");
    assert_eq!(row("b1"), Some(vec!["b1", "b"]), "{status}");
    let one = cli(&["status", "a1"]);
    assert!(one.starts_with("AGENT  NODE"), "{one}");
    let halted = cli(&["halt"]);
    assert!(halted.contains("a1") && halted.contains("b1"), "{halted}");
}

#[test]
fn a_crashed_nodes_leases_expire_and_no_agent_runs_twice() {
    let dir = temp_dir("crash");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let mut a = Node::start(&dir, "a", &nats.url(), &["shared", "a1"]);
    let b = Node::start(&dir, "b", &nats.url(), &["b1"]);
    wait_until("b lists a's agents", Duration::from_secs(10), || {
        b.fleet().len() == 3
    });
    // d's team file has `shared` too: a holds its lease, so d does not start it.
    let d = Node::start(&dir, "d", &nats.url(), &["shared", "d1"]);
    assert!(!runs(&d, "shared"), "d must not start an agent a owns");
    wait_until("d shows shared on a", Duration::from_secs(5), || {
        d.get("/api/agents/shared")["node"] == "a"
    });
    assert!(
        d.stderr().contains("agent shared is owned by node a"),
        "{}",
        d.stderr()
    );
    assert_eq!(d.get("/api/cluster")["elsewhere"]["shared"], "a");
    drop(d);
    // kill -9 a: its leases are not renewed and age out of the bucket (TTL 3 s).
    a.kill();
    let gone = wait_until(
        "a's agents leave the fleet",
        Duration::from_secs(10),
        || {
            b.fleet()
                .iter()
                .all(|(_, node, _)| node != "a" && node != "d")
        },
    );
    eprintln!(
        "leases of the killed node expired {:.1} s after the kill",
        gone.as_secs_f64()
    );
    // Restarted under its name, a takes its agents back.
    a.spawn();
    assert_eq!(a.state_of("shared"), "WAITING_FOR_EVENT");
    wait_until("b lists a's agents again", Duration::from_secs(10), || {
        b.fleet()
            .iter()
            .any(|(k, node, _)| k == "shared" && node == "a")
    });
    // A clean stop (SIGTERM) deletes a's leases: gone from b's listing well within the TTL.
    let stopped = Instant::now();
    let exited = a.terminate().expect("a exits on SIGTERM");
    assert!(exited.success(), "{exited}: {}", a.stderr());
    wait_until("a's agents leave at once", Duration::from_secs(2), || {
        b.fleet().iter().all(|(_, node, _)| node != "a")
    });
    eprintln!(
        "leases of the stopped node gone {:.2} s after SIGTERM",
        stopped.elapsed().as_secs_f64()
    );
}

#[test]
fn a_nats_restart_mid_run_keeps_the_halt_key_and_halts_still_reach_every_node() {
    let dir = temp_dir("restart");
    let Some(mut nats) = NatsServer::start(&dir) else {
        return;
    };
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    let b = Node::start(&dir, "b", &nats.url(), &["b1"]);
    peers(&a, &["b"]);
    let (status, body) = a.post("/api/halt", None);
    assert_eq!(
        (status, &body["unanswered"]),
        (200, &serde_json::json!([])),
        "{body}"
    );
    let (status, _) = b.post("/api/agents/b1/resume", None);
    assert_eq!(status, 200);
    nats.kill();
    std::thread::sleep(Duration::from_millis(500));
    nats.restart();
    let restarted = Instant::now();
    for node in [&a, &b] {
        // A heartbeat written since the restart: the node is on the new server (a fresh-looking
        // age alone can be a beat from before the kill, not yet noticed as a disconnect).
        wait_until("reconnected", Duration::from_secs(15), || {
            let since = u64::try_from(restarted.elapsed().as_millis()).unwrap_or(u64::MAX);
            let cluster = node.get("/api/cluster");
            cluster["connected"] == true
                && cluster["heartbeat_age_ms"]
                    .as_u64()
                    .is_some_and(|age| age < since)
        });
    }
    // The halt key survived (file store): the next halt is epoch 2, and reaches b.
    let (status, body) = a.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["epoch"], 2, "{body}");
    assert_eq!(body["unanswered"], serde_json::json!([]), "{body}");
    assert_eq!(b.state_of("b1"), "STOPPED");
}

#[test]
fn a_partitioned_node_starts_no_model_call_within_fail_safe_seconds() {
    let dir = temp_dir("partition");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let proxy = Proxy::start(nats.port);
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    // b's model answers after 3 s.
    let b = Node::start_with(&dir, "b", &proxy.url(), &team(&["b1"], 3000));
    peers(&a, &["b"]);
    peers(&b, &["a"]);
    // b answers while connected.
    let (status, body) = b.post("/api/agents/b1/events?wait=10", Some(r#"{"content":"hi"}"#));
    assert_eq!(status, 200, "{body}");
    // A call in flight when the cut comes: its result returns while b is cut off (fail safe on
    // after at most 2 s, the result after 3 s), so it is held, and dropped once b learns of the
    // halt below.
    let (status, body) = b.post("/api/agents/b1/events", Some(r#"{"content":"in flight"}"#));
    assert_eq!(status, 202, "{body}");
    let in_flight = body["id"].as_u64().unwrap();
    wait_until("the call started", Duration::from_secs(5), || {
        b.state_of("b1") == "EXECUTING"
    });
    proxy.black_hole();
    let cut = Instant::now();
    let cut_ms = now_ms();
    // A halt on a meanwhile does not wait for b: b (its heartbeat still lives) is listed as not
    // answering, after `halt_ack_timeout_ms`.
    let (status, body) = a.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unanswered"], serde_json::json!(["b"]), "{body}");
    assert!(
        cut.elapsed() < Duration::from_millis(1900),
        "{:?}",
        cut.elapsed()
    );
    wait_until("b's fail safe on", Duration::from_secs(10), || {
        request(b.port, "GET", "/metrics", None)
            .1
            .contains("warden_cluster_fail_safe{node=\"b\"} 1")
    });
    let since_ms = b.get("/api/cluster")["fail_safe_since_ms"]
        .as_u64()
        .unwrap();
    let on = Duration::from_millis(since_ms.saturating_sub(cut_ms));
    eprintln!(
        "partitioned node: fail safe on {:.2} s after the partition (fail_safe_seconds = 2, a beat \
         is 1 s: the silence is counted from the last heartbeat, up to a beat before the cut)",
        on.as_secs_f64()
    );
    // No later than fail_safe_seconds (2) after the cut, + the guard's tick and a bound beat.
    assert!(
        on <= Duration::from_millis(2600),
        "{on:?} ({:?})",
        cut.elapsed()
    );
    assert!(b.get("/api/cluster")["fail_safe"].is_string());
    let (status, health) = request(b.port, "GET", "/healthz", None);
    assert_eq!(status, 503, "{health}");
    assert!(health.contains("cluster fail safe"), "{health}");
    // A new event is accepted but its model call does not start.
    let (status, body) = b.post("/api/agents/b1/events", Some(r#"{"content":"again"}"#));
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let fate = b.get(&format!("/api/agents/b1/events/{id}"));
    assert_ne!(fate["status"], "answered", "{fate}");
    assert_eq!(b.get("/api/agents/b1")["turns"], 1);
    // Healed: b reads the halt key before its gate opens, so the waiting turn is halted, not run.
    proxy.heal();
    wait_until("b's fail safe off", Duration::from_secs(15), || {
        b.get("/api/cluster")["fail_safe"].is_null()
    });
    assert_eq!(b.state_of("b1"), "STOPPED");
    // The result that came back while b was cut off was dropped: the halt was older.
    let fate = b.get(&format!("/api/agents/b1/events/{in_flight}"));
    assert_ne!(fate["status"], "answered", "{fate}");
    let fate = b.get(&format!("/api/agents/b1/events/{id}"));
    assert_ne!(fate["status"], "answered", "{fate}");
    assert!(b.stderr().contains("cluster fail safe:"), "{}", b.stderr());
    // Journaled on b's agent (read with `warden journal tail`).
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["journal", "tail", "-n", "500", "--db"])
        .arg(b.dir.join("journal.db"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cluster fail safe"), "{text}");
    // Cut off again, a halt on b itself: b's agent is stopped at once (nothing waits on NATS), and
    // a, which b knew at its last beat, is listed as not answering.
    let (status, _) = b.post("/api/agents/b1/resume", None);
    assert_eq!(status, 200);
    proxy.black_hole();
    let started = Instant::now();
    let (status, body) = b.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["halted"][0]["agent"], "b1", "{body}");
    assert_eq!(body["halted"][0]["state"], "STOPPED", "{body}");
    assert_eq!(body["unanswered"], serde_json::json!(["a"]), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(b.state_of("b1"), "STOPPED");
    proxy.heal();
}

/// `warden serve` on `dir/team.toml` with `args`, run until it exits (for runs that must fail):
/// its exit code and standard error.
fn serve_to_the_end(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["serve", "--config"])
        .arg(dir.join("team.toml"))
        .arg("--db")
        .arg(dir.join("j.db"))
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(args)
        .env("WARDEN_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn serve_refuses_a_bad_cluster_flag_and_an_unreachable_nats() {
    let dir = temp_dir("flags");
    std::fs::write(dir.join("team.toml"), team(&["x"], 0)).unwrap();
    let run = |args: &[&str]| serve_to_the_end(&dir, args);
    let (code, err) = run(&["--cluster", "http://x:1", "--node", "a"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("invalid value for `--cluster`: http://x:1"),
        "{err}"
    );
    let (code, err) = run(&["--cluster", "nats://127.0.0.1:1"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("`cluster.node`"), "{err}");
    let text = team(&["x"], 0).replace("[cluster]\n", "[cluster]\nconnect_timeout_seconds = 1\n");
    std::fs::write(dir.join("team.toml"), text).unwrap();
    let port = free_port();
    let (code, err) = run(&[
        "--cluster",
        &format!("nats://127.0.0.1:{port}"),
        "--node",
        "a",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot connect to NATS"), "{err}");
}

#[test]
fn a_nats_server_that_wants_a_password_gets_the_one_in_the_url_and_it_is_never_shown() {
    let dir = temp_dir("nats-auth");
    let Some(nats) = NatsServer::start_with_args(&dir, &["--user", "warden", "--pass", "s3cret"])
    else {
        return;
    };
    let text = team(&["x"], 0).replace("[cluster]\n", "[cluster]\nconnect_timeout_seconds = 2\n");
    std::fs::write(dir.join("team.toml"), &text).unwrap();
    // Without the password: refused, and said so.
    let (code, err) = serve_to_the_end(&dir, &["--cluster", &nats.url(), "--node", "a"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("authorization violation"), "{err}");
    // With it in the URL: joined, and the password appears nowhere.
    let url = format!("nats://warden:s3cret@127.0.0.1:{}", nats.port);
    let a = Node::start_with(&dir, "a", &url, &text);
    assert!(answered(&a, "x"));
    let cluster = a.get("/api/cluster");
    assert_eq!(
        cluster["url"],
        format!("nats://warden:***@127.0.0.1:{}", nats.port),
        "{cluster}"
    );
    assert!(cluster["connected"] == true, "{cluster}");
    assert!(
        a.stderr().contains("joined nats://warden:***@"),
        "{}",
        a.stderr()
    );
    assert!(!a.stderr().contains("s3cret"), "{}", a.stderr());
}

/// `warden serve` of `team` (node a) against `nats`, which must refuse it: standard error, which
/// must not hold `secret`.
fn refused_by(dir: &Path, nats: &NatsServer, team: &str, secret: &str) -> String {
    std::fs::write(dir.join("team.toml"), team).unwrap();
    let (code, err) = serve_to_the_end(dir, &["--cluster", &nats.url(), "--node", "a"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains(secret), "the secret is never shown: {err}");
    err
}

/// A CA, and the NATS server's and a node's certificates signed by it, written under `dir` as
/// `ca.pem`, `server.pem`/`server-key.pem` and `node.pem`/`node-key.pem`; also `other-ca.pem`, a
/// CA that signed none of them.
fn certificates(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };
    let ca = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert, key)
    };
    let (ca_cert, ca_key) = ca("warden test CA");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("other-ca.pem"), ca("another CA").0.pem()).unwrap();
    for (name, sans, usage) in [
        (
            "server",
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        (
            "node",
            vec!["warden-node".to_owned()],
            ExtendedKeyUsagePurpose::ClientAuth,
        ),
    ] {
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem()).unwrap();
    }
}

#[test]
fn a_nats_server_with_tls_and_nkeys_takes_a_node_with_its_certificate_and_seed() {
    let dir = temp_dir("nats-tls");
    let path = |name: &str| dir.join(name).display().to_string();
    certificates(&dir);
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    std::fs::write(dir.join("seed"), format!("{seed}\n")).unwrap();
    std::fs::write(
        dir.join("stranger"),
        nkeys::KeyPair::new_user().seed().unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("not-a-seed"), "hunter2 is my password\n").unwrap();
    // Clients must present a certificate of the CA (`verify`), and be the nkey user.
    let conf = format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}\n\
         authorization {{\n  users = [ {{ nkey: \"{}\" }} ]\n}}\n",
        path("server.pem"),
        path("server-key.pem"),
        path("ca.pem"),
        user.public_key()
    );
    std::fs::write(dir.join("nats.conf"), conf).unwrap();
    let Some(nats) = NatsServer::start_with_args(&dir, &["-c", &path("nats.conf")]) else {
        return;
    };
    let keys = |ca: &str, client: bool, seed: &str| {
        let mut keys = format!(
            "[cluster]\nconnect_timeout_seconds = 2\ntls_ca_file = \"{}\"\n",
            path(ca)
        );
        if client {
            keys.push_str(&format!(
                "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
                path("node.pem"),
                path("node-key.pem")
            ));
        }
        if !seed.is_empty() {
            keys.push_str(&format!("nkey_seed_file = \"{}\"\n", path(seed)));
        }
        team(&["x"], 0).replace("[cluster]\n", &keys)
    };
    let refused = |team: &str| refused_by(&dir, &nats, team, &seed);
    // Each thing missing or wrong is refused, and says which.
    let err = refused(&keys("ca.pem", true, "not-a-seed"));
    assert!(
        err.contains(&format!(
            "cluster: `cluster.nkey_seed_file` = {}: not a NATS user nkey seed",
            path("not-a-seed")
        )),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    let err = refused(&keys("missing.pem", true, "seed"));
    assert!(
        err.contains(&format!(
            "`cluster.tls_ca_file` = {}: ",
            path("missing.pem")
        )),
        "{err}"
    );
    let err = refused(&keys("ca.pem", true, "stranger"));
    assert!(err.contains("authorization violation"), "{err}");
    let err = refused(&keys("ca.pem", true, ""));
    assert!(err.contains("authorization violation"), "{err}");
    // The server's certificate is not of a CA the node trusts.
    let err = refused(&keys("other-ca.pem", true, "seed"));
    assert!(
        err.contains("invalid peer certificate: UnknownIssuer"),
        "{err}"
    );
    // No client certificate: the server's `verify` refuses the handshake.
    let err = refused(&keys("ca.pem", false, "seed"));
    assert!(
        err.contains("cannot connect to NATS") && err.contains("BadCertificate"),
        "{err}"
    );
    // All of it: joined, and working (an event answered, a halt applied).
    let a = Node::start_with(&dir, "a", &nats.url(), &keys("ca.pem", true, "seed"));
    assert!(answered(&a, "x"));
    let cluster = a.get("/api/cluster");
    assert!(cluster["connected"] == true, "{cluster}");
    halt_cluster(&a, &[(&a, "x")]);
    assert!(!a.stderr().contains(&seed), "{}", a.stderr());
}

/// A NATS JWT (v2) of `claims` about `subject`, signed by `issuer`: what `nsc` writes, made here
/// because Debian has no `nsc`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: Value) -> String {
    use data_encoding::BASE64URL_NOPAD as B64;
    let header = B64.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("{name}-{subject}"),
        "iat": 1_700_000_000u64,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let body = format!("{header}.{}", B64.encode(claims.to_string().as_bytes()));
    let signature = issuer.sign(body.as_bytes()).unwrap();
    format!("{body}.{}", B64.encode(&signature))
}

#[test]
fn a_nats_server_in_operator_mode_takes_a_node_with_its_credentials_file() {
    let dir = temp_dir("nats-creds");
    let path = |name: &str| dir.join(name).display().to_string();
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let system = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let unlimited = serde_json::json!({"subs": -1, "data": -1, "payload": -1, "imports": -1,
        "exports": -1, "wildcards": true, "conn": -1, "leaf": -1});
    let mut limits = unlimited.clone();
    for (k, v) in [
        ("mem_storage", -1),
        ("disk_storage", -1),
        ("streams", -1),
        ("consumer", -1),
    ] {
        limits[k] = v.into();
    }
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "warden",
        serde_json::json!({"limits": limits, "type": "account", "version": 2}),
    );
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"limits": unlimited, "type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "node",
        serde_json::json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2}),
    );
    let seed = user.seed().unwrap();
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    );
    std::fs::write(dir.join("node.creds"), &creds).unwrap();
    std::fs::write(dir.join("broken.creds"), format!("{user_jwt}\n{seed}\n")).unwrap();
    // The same user, signed by an account the server does not know.
    let forged = jwt(
        &nkeys::KeyPair::new_account(),
        &user.public_key(),
        "node",
        serde_json::json!({"type": "user", "version": 2}),
    );
    std::fs::write(dir.join("forged.creds"), creds.replace(&user_jwt, &forged)).unwrap();
    let conf = format!(
        "operator: \"{operator_jwt}\"\nsystem_account: \"{}\"\nresolver: MEMORY\n\
         resolver_preload: {{\n  {}: \"{account_jwt}\"\n  {}: \"{system_jwt}\"\n}}\n",
        system.public_key(),
        account.public_key(),
        system.public_key()
    );
    std::fs::write(dir.join("nats.conf"), conf).unwrap();
    let Some(nats) = NatsServer::start_with_args(&dir, &["-c", &path("nats.conf")]) else {
        return;
    };
    let with = |creds: &str| {
        let keys = match creds {
            "" => "[cluster]\nconnect_timeout_seconds = 2\n".to_owned(),
            file => format!(
                "[cluster]\nconnect_timeout_seconds = 2\ncredentials_file = \"{}\"\n",
                path(file)
            ),
        };
        team(&["x"], 0).replace("[cluster]\n", &keys)
    };
    let refused = |team: &str| refused_by(&dir, &nats, team, &seed);
    let err = refused(&with(""));
    assert!(err.contains("authorization violation"), "{err}");
    let err = refused(&with("forged.creds"));
    assert!(err.contains("authorization violation"), "{err}");
    let err = refused(&with("broken.creds"));
    assert!(
        err.contains(&format!(
            "`cluster.credentials_file` = {}: not a NATS credentials file",
            path("broken.creds")
        )),
        "{err}"
    );
    let a = Node::start_with(&dir, "a", &nats.url(), &with("node.creds"));
    assert!(answered(&a, "x"));
    halt_cluster(&a, &[(&a, "x")]);
    assert!(!a.stderr().contains(&seed), "{}", a.stderr());
}

#[test]
fn a_lockout_on_b_refuses_delegation_from_a_and_an_unlock_needs_a_cluster_write() {
    let dir = temp_dir("lockout");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let proxy = Proxy::start(nats.port);
    let (cluster, boss) = (PAIR_CLUSTER, boss_team());
    let worker = format!(
        "[safety.breakers]\nmax_consecutive_errors = 1\n\n[providers.m]\nkind = \"scripted\"\n\
         cycle = true\nreplies = [{{ fail = \"model down\" }}]\n\n{cluster}\n[[agents]]\nkey = \
         \"worker\"\nprovider = \"m\"\n"
    );
    let a = Node::start_with(&dir, "a", &nats.url(), &boss);
    let b = Node::start_with(&dir, "b", &proxy.url(), &worker);
    // The worker trips its breaker on b.
    let (status, body) = b.post("/api/agents/worker/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("worker locked out on b", Duration::from_secs(10), || {
        b.state_of("worker") == "SAFETY_LOCKOUT"
    });
    let seen = wait_until("a sees the lockout", Duration::from_secs(5), || {
        a.get("/api/cluster")["lockouts"]["worker"]["locked"] == true
    });
    eprintln!("lockout on b seen by a after {:.2} s", seen.as_secs_f64());
    assert_eq!(
        a.get("/api/cluster")["lockouts"]["worker"]["node"],
        "b",
        "the owning node wrote it"
    );
    // boss on a delegates to worker: refused as emergency_stop (and then answers).
    let (status, body) = a.post(
        "/api/agents/boss/events?wait=10",
        Some(r#"{"content":"go"}"#),
    );
    assert_eq!(status, 200, "{body}");
    let events = a.get("/api/events/recent?agent=boss&limit=100").to_string();
    assert!(
        events.contains("delegation_refused") && events.contains("emergency_stop"),
        "{events}"
    );
    // b cut off: the unlock is refused, the worker stays locked out.
    proxy.black_hole();
    let (status, body) = b.post("/api/agents/worker/unlock", None);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("unlock refused"),
        "{body}"
    );
    assert_eq!(b.state_of("worker"), "SAFETY_LOCKOUT");
    // Unlocking it on a, which does not run it, is refused too (while b's lease lives).
    let (status, body) = a.post("/api/agents/worker/unlock", None);
    assert_eq!(status, 409, "{body}");
    // So are the other routes that lift a lockout, on b.
    for route in ["emergency/clear", "history/reset"] {
        let (status, body) = b.post(&format!("/api/agents/worker/{route}"), None);
        assert_eq!(status, 503, "{route}: {body}");
    }
    assert_eq!(b.state_of("worker"), "SAFETY_LOCKOUT");
    // Healed: the unlock goes through once the write does.
    proxy.heal();
    wait_until("the unlock succeeds", Duration::from_secs(15), || {
        b.post("/api/agents/worker/unlock", None).0 == 200
    });
    assert_eq!(b.state_of("worker"), "WAITING_FOR_EVENT");
    wait_until("a sees the unlock", Duration::from_secs(5), || {
        a.get("/api/cluster")["lockouts"]["worker"]["locked"] == false
    });
}

/// Healthy: connected, a heartbeat within the last 1.5 s, no fail safe.
fn healthy_in_cluster(node: &Node) -> bool {
    let cluster = node.get("/api/cluster");
    cluster["connected"] == true
        && cluster["fail_safe"].is_null()
        && cluster["heartbeat_age_ms"].as_u64() < Some(1500)
}

#[test]
fn on_a_three_server_nats_cluster_halts_survive_one_server_and_no_quorum_means_fail_safe() {
    let dir = temp_dir("quorum");
    let Some(mut servers) = NatsServer::cluster(&dir, 3) else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    // Each node lists every server, its own first.
    let list = |first: usize| {
        (0..3)
            .map(|i| urls[(first + i) % 3].clone())
            .collect::<Vec<_>>()
            .join(",")
    };
    let replicated = |agent: &str| {
        team(&[agent], 0).replace(
            "[cluster]\n",
            "[cluster]\nreplicas = 3\nconnect_timeout_seconds = 30\n",
        )
    };
    let a = Node::start_with(&dir, "a", &list(0), &replicated("a1"));
    let b = Node::start_with(&dir, "b", &list(1), &replicated("b1"));
    let c = Node::start_with(&dir, "c", &list(2), &replicated("c1"));
    peers(&b, &["a", "c"]);
    // One server of three down: the replicated buckets keep their quorum.
    servers[0].kill();
    let back = wait_until(
        "every node healthy on two servers",
        Duration::from_secs(30),
        || [&a, &b, &c].iter().all(|n| healthy_in_cluster(n)),
    );
    eprintln!(
        "one NATS server of three killed: every node healthy again after {:.1} s",
        back.as_secs_f64()
    );
    peers(&b, &["a", "c"]);
    let (status, body) = b.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unanswered"], serde_json::json!([]), "{body}");
    assert_eq!(body["halted"].as_array().map(Vec::len), Some(3), "{body}");
    for node in [&a, &b, &c] {
        wait_until(
            "the halt key written and read",
            Duration::from_secs(10),
            || node.get("/api/cluster")["halt"]["epoch"] == 1,
        );
    }
    // Two of three down: no quorum, no write succeeds: every node fails safe.
    servers[1].kill();
    let cut = Instant::now();
    wait_until("every node fails safe", Duration::from_secs(15), || {
        [&a, &b, &c]
            .iter()
            .all(|n| n.get("/api/cluster")["fail_safe"].is_string())
    });
    eprintln!(
        "two NATS servers of three killed: every node in fail safe after {:.1} s",
        cut.elapsed().as_secs_f64()
    );
    // A local halt still works without the cluster.
    let (status, _) = c.post("/api/agents/c1/resume", None);
    assert_eq!(status, 200);
    let (status, body) = c.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["halted"][0]["state"], "STOPPED", "{body}");
    // Quorum back: the fail safe ends everywhere, and c's halt (epoch 2) was written.
    servers[0].restart();
    servers[1].restart();
    wait_until("every node healthy again", Duration::from_secs(60), || {
        [&a, &b, &c].iter().all(|n| healthy_in_cluster(n))
    });
    wait_until(
        "c's halt written once the quorum is back",
        Duration::from_secs(15),
        || a.get("/api/cluster")["halt"]["epoch"] == 2,
    );
}

/// The `[cluster]` of the delegation tests.
const PAIR_CLUSTER: &str =
    "[cluster]\nfail_safe_seconds = 2\nlease_ttl_seconds = 3\nhalt_ack_timeout_ms = 1000\n";

/// `boss`, whose model delegates a task to `worker`, then answers "done".
fn boss_team() -> String {
    format!(
        "[providers.m]\nkind = \"scripted\"\ncycle = true\nreplies = [\n  {{ tool = \"delegate\", \
         args = {{ agent = \"worker\", task = \"x\" }} }},\n  \"done\",\n]\n\n{PAIR_CLUSTER}\n\
         [[agents]]\nkey = \"boss\"\nprovider = \"m\"\n"
    )
}

/// Node a runs `boss`, whose model delegates to `worker` then answers; node b runs `worker`,
/// answering "worker on b says hi" after `worker_latency_ms`.
fn delegation_pair(dir: &Path, url: &str, worker_latency_ms: u64) -> (Node, Node) {
    delegation_pair_with(dir, url, worker_latency_ms, "")
}

/// [`delegation_pair`] with `boss_settings` (TOML tables) in front of the boss's team file.
fn delegation_pair_with(
    dir: &Path,
    url: &str,
    worker_latency_ms: u64,
    boss_settings: &str,
) -> (Node, Node) {
    let a = Node::start_with(dir, "a", url, &format!("{boss_settings}{}", boss_team()));
    let b = Node::start_with(dir, "b", url, &worker_team(worker_latency_ms));
    (a, b)
}

/// `worker`, answering "worker on b says hi" after `worker_latency_ms`.
fn worker_team(worker_latency_ms: u64) -> String {
    format!(
        "[providers.m]\nkind = \"scripted\"\ncycle = true\nreplies = [\"worker on b says hi\"]\n\
         latency_ms = {worker_latency_ms}\n\n{PAIR_CLUSTER}\n[[agents]]\nkey = \"worker\"\nprovider = \
         \"m\"\n"
    )
}

fn turns_of(node: &Node, agent: &str) -> u64 {
    node.get(&format!("/api/agents/{agent}"))["turns"]
        .as_u64()
        .unwrap()
}

/// Three rolling SIGTERMs of a cluster node with a turn in flight (a 60 s model), restarted each
/// time: a clean stop journals no `crashed`, `restarted` or `error_counted`, logs no `ERROR`, and
/// leaves the agent unlocked (each stop used to count an error, shared with the other nodes, so
/// the third locked it out).
#[test]
fn a_clean_sigterm_of_a_cluster_node_is_no_crash_and_counts_no_error() {
    let dir = temp_dir("sigterm");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    // x in a turn at each stop, y idle.
    let mut a = Node::start_with(&dir, "a", &nats.url(), &team(&["x", "y"], 60_000));
    for round in 1..=3 {
        let (status, body) = a.post("/api/agents/x/events", Some(r#"{"content":"think long"}"#));
        assert_eq!(status, 202, "{body}");
        wait_until(
            &format!("round {round}: a turn in flight"),
            Duration::from_secs(20),
            || a.state_of("x") == "EXECUTING",
        );
        let status = a.terminate();
        let stderr = a.stderr();
        assert!(
            status.is_some_and(|s| s.success()),
            "round {round}: {status:?}: {stderr}"
        );
        assert!(
            !stderr.contains("agent actor crashed") && !stderr.contains("ERROR"),
            "round {round}: a clean stop logged an error: {stderr}"
        );
        let events = warden::journal::JournalReader::open(a.dir.join("journal.db"))
            .unwrap()
            .events()
            .unwrap();
        let crashes: Vec<String> = events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    warden::EventKind::Crashed { .. }
                        | warden::EventKind::Restarted { .. }
                        | warden::EventKind::ErrorCounted { .. }
                )
            })
            .map(|e| format!("{} {:?}", e.seq, e.kind))
            .collect();
        assert!(crashes.is_empty(), "round {round}: journaled {crashes:?}");
        a.spawn();
    }
    for agent in ["x", "y"] {
        let status = a.get(&format!("/api/agents/{agent}"));
        assert_eq!(status["consecutive_errors"], 0, "{status}");
        assert_ne!(status["state"], "SAFETY_LOCKOUT", "{status}");
        assert_eq!(status["emergency_stop"], false, "{status}");
        assert_eq!(status["restarts"], 0, "{status}");
    }
}

#[test]
fn a_delegation_from_node_a_to_an_agent_of_node_b_runs_there_and_answers() {
    let dir = temp_dir("delegate");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (a, b) = delegation_pair(&dir, &nats.url(), 0);
    let trials = 20;
    let mut took = Vec::with_capacity(trials);
    for _ in 0..trials {
        let started = Instant::now();
        let (status, body) = a.post(
            "/api/agents/boss/events?wait=10",
            Some(r#"{"content":"go"}"#),
        );
        took.push(started.elapsed());
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["answer"], "done", "{body}");
    }
    took.sort();
    eprintln!(
        "boss on a → worker on b → boss answers, {trials} trials: p50 {:.1} ms, p99 {:.1} ms",
        percentile(&took, 50.0).as_secs_f64() * 1e3,
        percentile(&took, 99.0).as_secs_f64() * 1e3
    );
    // b ran every task once, and the boss saw b's answer.
    assert_eq!(turns_of(&b, "worker"), trials as u64);
    assert_eq!(b.get("/api/cluster")["delegations"]["ran"], trials as u64);
    let events = a.get("/api/events/recent?agent=boss&limit=200").to_string();
    assert!(events.contains("worker on b says hi"), "{events}");
    assert!(events.contains("delegation_ended"), "{events}");
    assert!(!events.contains("delegation_refused"), "{events}");
}

#[test]
fn a_redelivered_delegation_runs_once_and_both_copies_get_the_first_answer() {
    let dir = temp_dir("delegate-once");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (_a, b) = delegation_pair(&dir, &nats.url(), 300);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let replies: Vec<Value> = runtime.block_on(async {
        let client = async_nats::connect(nats.url()).await.unwrap();
        let task = serde_json::json!({
            "key": "boss/run-1/call-1",
            "from": "boss",
            "to": "worker",
            "task": "x",
            "lineage": ["boss", "worker"],
        });
        let body = serde_json::to_vec(&task).unwrap();
        // Two copies of one request (the second while the first runs), then a third after.
        let first = client.request("warden.cluster.delegate.b", body.clone().into());
        let second = client.request("warden.cluster.delegate.b", body.clone().into());
        let (first, second) = futures::join!(first, second);
        let third = client
            .request("warden.cluster.delegate.b", body.into())
            .await
            .unwrap();
        [first.unwrap(), second.unwrap(), third]
            .iter()
            .map(|m| serde_json::from_slice(&m.payload).unwrap())
            .collect()
    });
    for reply in &replies {
        assert_eq!(
            reply,
            &serde_json::json!({"outcome": "answer", "answer": "worker on b says hi"})
        );
    }
    assert_eq!(turns_of(&b, "worker"), 1, "three copies, one run");
    let counts = &b.get("/api/cluster")["delegations"];
    assert_eq!(
        counts,
        &serde_json::json!({"received": 3, "ran": 1, "recovered": 0})
    );
}

#[test]
fn a_copy_sent_after_the_owner_restarted_is_answered_from_the_task_record() {
    let dir = temp_dir("delegate-record");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (_a, mut b) = delegation_pair(&dir, &nats.url(), 50);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime
        .block_on(async_nats::connect(nats.url()))
        .expect("a NATS client");
    let task = |key: &str| {
        serde_json::to_vec(&serde_json::json!({
            "key": key,
            "from": "boss",
            "to": "worker",
            "task": "x",
            "lineage": ["boss", "worker"],
        }))
        .unwrap()
    };
    let ask = |key: &str| -> Value {
        let reply = runtime
            .block_on(client.request("warden.cluster.delegate.b", task(key).into()))
            .expect("a reply from b");
        serde_json::from_slice(&reply.payload).unwrap()
    };
    let hi = serde_json::json!({"outcome": "answer", "answer": "worker on b says hi"});
    assert_eq!(ask("i1/boss/1/call-1"), hi);
    assert_eq!(turns_of(&b, "worker"), 1);
    // The reply is recorded just after it was sent.
    let recorded = runtime.block_on(async {
        let js = async_nats::jetstream::new(client.clone());
        let records = js.get_key_value("warden_tasks").await.expect("the bucket");
        for _ in 0..100 {
            let entry = records.get("task.i1=2Fboss=2F1=2Fcall-1").await;
            if let Ok(Some(bytes)) = entry {
                let record: Value = serde_json::from_slice(&bytes).unwrap();
                if record["reply"] == hi {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    });
    assert!(recorded, "the task's record never got its reply");
    // b dies (its memory of the key with it) and comes back; a copy of the same request comes.
    b.kill();
    b.spawn();
    assert_eq!(ask("i1/boss/1/call-1"), hi, "answered from the record");
    assert_eq!(turns_of(&b, "worker"), 1, "not run again after the restart");
    assert_eq!(
        b.get("/api/cluster")["delegations"],
        serde_json::json!({"received": 1, "ran": 0, "recovered": 1})
    );
    // A record another process left `running` (a crash cut that run short): the task runs.
    runtime.block_on(async {
        let js = async_nats::jetstream::new(client.clone());
        let records = js.get_key_value("warden_tasks").await.expect("the bucket");
        let cut_short = br#"{"node": "b", "instance": "0000000000000dead"}"#;
        records
            .put("task.i1=2Fboss=2F2=2Fcall-1", cut_short.to_vec().into())
            .await
            .expect("a record written");
    });
    assert_eq!(ask("i1/boss/2/call-1"), hi);
    assert_eq!(turns_of(&b, "worker"), 2, "a run cut short runs again");
    assert_eq!(
        b.get("/api/cluster")["delegations"],
        serde_json::json!({"received": 2, "ran": 1, "recovered": 1})
    );
}

#[test]
fn a_halt_of_the_delegator_on_a_ends_the_wait_and_halts_the_delegate_on_b() {
    let dir = temp_dir("delegate-halt");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (a, b) = delegation_pair(&dir, &nats.url(), 10_000);
    let (status, body) = a.post("/api/agents/boss/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until(
        "the worker on b runs the task",
        Duration::from_secs(10),
        || b.get("/api/cluster")["delegations"]["ran"] == 1,
    );
    let started = Instant::now();
    let (status, body) = a.post("/api/agents/boss/halt", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(a.state_of("boss"), "STOPPED");
    let events = a.get("/api/events/recent?agent=boss&limit=100").to_string();
    assert!(
        events.contains("delegation_ended") && events.contains("cancelled"),
        "{events}"
    );
    let stopped = wait_until("the worker on b halted", Duration::from_secs(5), || {
        b.state_of("worker") == "STOPPED"
    });
    eprintln!(
        "halt of boss on a: wait ended at once ({:.1} ms), worker on b stopped {:.1} ms after",
        started.elapsed().as_secs_f64() * 1e3,
        stopped.as_secs_f64() * 1e3
    );
    let events = b
        .get("/api/events/recent?agent=worker&limit=100")
        .to_string();
    assert!(events.contains("parent"), "{events}");
}

#[test]
fn a_cross_node_delegation_waits_through_the_chain_wait_checkpoint_and_times_out() {
    let dir = temp_dir("delegate-timeout");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let settings =
        "[safety.timeout]\nchain_seconds = 1\n\n[safety.on_limit]\nmode = \"unattended\"\n\n";
    let (a, _b) = delegation_pair_with(&dir, &nats.url(), 10_000, settings);
    let started = Instant::now();
    let (status, body) = a.post(
        "/api/agents/boss/events?wait=10",
        Some(r#"{"content":"go"}"#),
    );
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["answer"], "done", "{body}");
    let events = a.get("/api/events/recent?agent=boss&limit=100").to_string();
    assert!(
        events.contains("limit_decided") && events.contains("timed_out"),
        "{events}"
    );
    assert!(
        took < Duration::from_secs(5),
        "waited {took:?} for a 1 s chain wait"
    );
    eprintln!("cross-node delegation timed out through the checkpoint; the event took {took:?}");
}

#[test]
fn a_cancel_lost_to_a_partition_is_sent_again_and_halts_the_delegate() {
    let dir = temp_dir("delegate-cancel-lost");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    // b reaches NATS through a proxy that can black-hole it; a directly. The worker takes 30 s.
    let proxy = Proxy::start(nats.port);
    let a = Node::start_with(&dir, "a", &nats.url(), &boss_team());
    let b = Node::start_with(&dir, "b", &proxy.url(), &worker_team(30_000));
    let (status, body) = a.post("/api/agents/boss/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("b runs the task", Duration::from_secs(10), || {
        b.get("/api/cluster")["delegations"]["ran"] == 1
    });
    // b is cut off, then boss on a is halted: NATS hands the first cancel to b's connection of
    // before the partition, which b's client gives up on (its pings go unanswered) and replaces:
    // that copy is lost with it (core NATS, at most once).
    proxy.black_hole();
    let (status, body) = a.post("/api/agents/boss/halt", None);
    assert_eq!(status, 200, "{body}");
    std::thread::sleep(Duration::from_secs(4));
    proxy.heal();
    let stopped = wait_until(
        "the worker on b halted by a cancel sent again",
        Duration::from_secs(15),
        || b.state_of("worker") == "STOPPED",
    );
    eprintln!(
        "lost cancel: the worker on b stopped {:.1} s after the heal",
        stopped.as_secs_f64()
    );
    let events = b
        .get("/api/events/recent?agent=worker&limit=100")
        .to_string();
    assert!(events.contains("parent"), "{events}");
}

#[test]
fn a_cancel_that_comes_before_its_task_leaves_the_task_abandoned() {
    let dir = temp_dir("delegate-cancel-first");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (_a, b) = delegation_pair(&dir, &nats.url(), 50);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let replies: (Vec<u8>, Value) = runtime.block_on(async {
        let client = async_nats::connect(nats.url()).await.unwrap();
        let cancel = serde_json::json!({"key": "i9/boss/1/call-1", "from": "boss"});
        let ack = client
            .request(
                "warden.cluster.delegate.b.cancel",
                serde_json::to_vec(&cancel).unwrap().into(),
            )
            .await
            .expect("the cancel is acknowledged");
        let task = serde_json::json!({
            "key": "i9/boss/1/call-1",
            "from": "boss",
            "to": "worker",
            "task": "x",
            "lineage": ["boss", "worker"],
        });
        let reply = client
            .request(
                "warden.cluster.delegate.b",
                serde_json::to_vec(&task).unwrap().into(),
            )
            .await
            .expect("a reply");
        (
            ack.payload.to_vec(),
            serde_json::from_slice(&reply.payload).unwrap(),
        )
    });
    assert_eq!(replies.0, b"ack");
    assert_eq!(replies.1, serde_json::json!({"outcome": "abandoned"}));
    assert_eq!(turns_of(&b, "worker"), 0, "a cancelled task never runs");
    assert_eq!(b.get("/api/cluster")["delegations"]["ran"], 0);
}

/// boss on a delegates to worker on b (a 3 s model); c lists worker too (started after b, it
/// does not run it). b is killed (`SIGKILL`) while the task runs and never comes back: c adopts
/// worker, a's copies of the request go to c with the same key, c runs the task once, and boss
/// gets its answer. (Before, a sent its copies to the dead b until its chain wait ran out.)
#[test]
fn a_delegation_whose_delegates_node_dies_is_sent_to_the_adopter_and_runs_there_once() {
    let dir = temp_dir("delegate-adopted");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (a, mut b) = delegation_pair(&dir, &nats.url(), 3_000);
    let c = Node::start_with(&dir, "c", &nats.url(), &worker_team(3_000));
    assert_eq!(c.get("/api/cluster")["elsewhere"]["worker"], "b");
    let (status, body) = a.post("/api/agents/boss/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("b runs the task", Duration::from_secs(10), || {
        b.get("/api/cluster")["delegations"]["ran"] == 1
    });
    b.kill();
    wait_until("c adopts worker", Duration::from_secs(10), || {
        runs(&c, "worker")
    });
    wait_until("c runs the task", Duration::from_secs(10), || {
        c.get("/api/cluster")["delegations"]["ran"] == 1
    });
    wait_until("boss gets its answer", Duration::from_secs(15), || {
        let events = a.get("/api/events/recent?agent=boss&limit=200").to_string();
        events.contains("worker on b says hi") && events.contains("turn_finished")
    });
    logs(&a, "agent worker moved from node b to node c");
    // Once: c's worker ran one turn, every copy of the request was answered from that run.
    wait_until(
        "the worker's turn ended on c",
        Duration::from_secs(5),
        || turns_of(&c, "worker") == 1,
    );
    std::thread::sleep(Duration::from_secs(3)); // a resend window: no second run
    assert_eq!(turns_of(&c, "worker"), 1);
    assert_eq!(c.get("/api/cluster")["delegations"]["ran"], 1);
    let events = a.get("/api/events/recent?agent=boss&limit=200").to_string();
    assert!(events.contains("completed"), "{events}");
}

/// Node b alone runs `worker` (10 s model); the test stands in for the delegator's node with an
/// async-nats client: it sends a task, then the cancel a cluster halt of epoch 1 makes its
/// delegator send — before b has seen that halt (NATS orders nothing across subjects, and on a
/// three-server NATS cluster the cancel came first in 5 of 12 trials) — then writes the halt key
/// as the halting node would, and lifts the halt on b. The lift must resume the worker: the
/// cluster halt stopped it, through its delegator's cancel.
#[test]
fn a_cancel_that_comes_before_its_cluster_halt_leaves_the_delegate_to_the_lift() {
    let dir = temp_dir("cancel-before-halt");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let b = Node::start_with(&dir, "b", &nats.url(), &worker_team(10_000));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime
        .block_on(async_nats::connect(nats.url()))
        .expect("a NATS client");
    let task = serde_json::json!({
        "key": "i7/boss/1/call-1",
        "from": "boss",
        "to": "worker",
        "task": "x",
        "lineage": ["boss", "worker"],
    });
    // The task runs (its reply is never awaited: the delegator was halted).
    runtime.block_on(async {
        client
            .publish_with_reply(
                "warden.cluster.delegate.b",
                "_INBOX.nobody",
                serde_json::to_vec(&task).unwrap().into(),
            )
            .await
            .unwrap();
        client.flush().await.unwrap();
    });
    wait_until("b runs the task", Duration::from_secs(10), || {
        b.get("/api/cluster")["delegations"]["ran"] == 1
    });
    assert_eq!(b.state_of("worker"), "EXECUTING");
    // The delegator's cancel, sent because the cluster halt of epoch 1 stopped it.
    let cancel = serde_json::json!({"key": "i7/boss/1/call-1", "from": "boss", "halt_epoch": 1});
    let ack = runtime
        .block_on(client.request(
            "warden.cluster.delegate.b.cancel",
            serde_json::to_vec(&cancel).unwrap().into(),
        ))
        .expect("the cancel is acknowledged");
    assert_eq!(&ack.payload[..], b"ack");
    wait_until("the worker stopped", Duration::from_secs(5), || {
        b.state_of("worker") == "STOPPED"
    });
    // The halting node's write of the halt key lands after the cancel.
    runtime.block_on(async {
        let js = async_nats::jetstream::new(client.clone());
        let halt = js.get_key_value("warden_halt").await.expect("the bucket");
        let state = serde_json::json!({
            "epoch": 1, "halted": true, "reason": "", "by": "api:admin", "node": "a", "at_ms": now_ms(),
        });
        halt.put("halt", serde_json::to_vec(&state).unwrap().into())
            .await
            .expect("the halt key written");
    });
    wait_until("b read the halt key", Duration::from_secs(5), || {
        b.get("/api/cluster")["halt"]["halted"] == true
    });
    let (status, body) = b.post("/api/resume", Some(r#"{"reason":"lift"}"#));
    assert_eq!(status, 200, "{body}");
    wait_until(
        "the lift resumed the worker",
        Duration::from_secs(5),
        || b.state_of("worker") == "WAITING_FOR_EVENT",
    );
    let (status, body) = b.post("/api/agents/worker/events", Some(r#"{"content":"again"}"#));
    assert_eq!(
        status, 202,
        "the worker takes work again after the lift: {body}"
    );
}

/// A cluster halt on a while boss (on a) waits for worker (on b): the cancel boss's halt sends
/// carries the halt's epoch, and the lift runs both again.
#[test]
fn a_cluster_halt_during_a_cross_node_delegation_is_lifted_for_the_delegate_too() {
    let dir = temp_dir("halt-during-delegation");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (a, b) = delegation_pair(&dir, &nats.url(), 10_000);
    peers(&a, &["b"]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime
        .block_on(async_nats::connect(nats.url()))
        .expect("a NATS client");
    let mut cancels = runtime
        .block_on(client.subscribe("warden.cluster.delegate.b.cancel"))
        .expect("a subscription");
    runtime.block_on(client.flush()).unwrap();
    let (status, body) = a.post("/api/agents/boss/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("b runs the task", Duration::from_secs(10), || {
        b.get("/api/cluster")["delegations"]["ran"] == 1
    });
    let (status, body) = a.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    let epoch = body["epoch"].as_u64().expect("the halt's epoch");
    let cancel: Value = runtime.block_on(async {
        let message = tokio::time::timeout(Duration::from_secs(5), cancels.next())
            .await
            .expect("a cancel within 5 s")
            .expect("the subscription lives");
        serde_json::from_slice(&message.payload).unwrap()
    });
    assert_eq!(cancel["from"], "boss", "{cancel}");
    assert_eq!(cancel["halt_epoch"], epoch, "{cancel}");
    wait_until("the worker stopped", Duration::from_secs(5), || {
        b.state_of("worker") == "STOPPED"
    });
    let (status, body) = a.post("/api/resume", Some(r#"{"reason":"lift"}"#));
    assert_eq!(status, 200, "{body}");
    for (node, agent) in [(&a, "boss"), (&b, "worker")] {
        wait_until(
            &format!("the lift resumed {agent}"),
            Duration::from_secs(5),
            || node.state_of(agent) != "STOPPED",
        );
    }
}

#[test]
fn a_delegation_whose_reply_is_lost_is_sent_again_and_answered_from_the_first_run() {
    let dir = temp_dir("delegate-resend");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    // a reaches NATS through a proxy that can black-hole it; b directly.
    let proxy = Proxy::start(nats.port);
    let a = Node::start_with(&dir, "a", &proxy.url(), &boss_team());
    let b = Node::start_with(&dir, "b", &nats.url(), &worker_team(2_000));
    let (status, body) = a.post("/api/agents/boss/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("b runs the task", Duration::from_secs(10), || {
        b.get("/api/cluster")["delegations"]["ran"] == 1
    });
    // a is cut off while b works: b's reply goes nowhere.
    proxy.black_hole();
    std::thread::sleep(Duration::from_secs(3));
    proxy.heal();
    // a reconnects and sends the same key again: b answers from its first run.
    let done = wait_until("boss answers", Duration::from_secs(20), || {
        turns_of(&a, "boss") == 1 && a.state_of("boss") == "WAITING_FOR_EVENT"
    });
    let counts = &b.get("/api/cluster")["delegations"];
    eprintln!(
        "lost reply: boss answered {:.1} s after the heal; b: {counts}",
        done.as_secs_f64()
    );
    assert_eq!(counts["ran"], 1, "one run");
    assert!(
        counts["received"].as_u64().unwrap() >= 2,
        "sent again: {counts}"
    );
    assert_eq!(turns_of(&b, "worker"), 1);
    let events = a.get("/api/events/recent?agent=boss&limit=100").to_string();
    assert!(
        events.contains("worker on b says hi") && events.contains("completed"),
        "{events}"
    );
}

/// Which team budget a shared-budget test spends.
#[derive(Clone, Copy, Debug)]
enum Spend {
    /// `tokens_per_team` = 600 in slices of 60.
    Tokens,
    /// `cost_per_team` = 0.6 in slices of 0.06, at 1.0 per 1,000 tokens (the same calls).
    Cost,
}

#[test]
fn a_team_budget_is_shared_by_slices_and_stops_every_node_once_claimed() {
    shared_budget_stops_every_node(Spend::Tokens);
}

#[test]
fn a_team_cost_budget_is_shared_by_slices_and_stops_every_node_once_claimed() {
    shared_budget_stops_every_node(Spend::Cost);
}

fn shared_budget_stops_every_node(spend: Spend) {
    let dir = temp_dir(&format!("budget-{spend:?}"));
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let (budget, slice, keys) = match spend {
        Spend::Tokens => (
            600.0,
            60.0,
            "[safety.budget]\ntokens_per_team = 600\n".to_string(),
        ),
        Spend::Cost => (
            0.6,
            0.06,
            "[safety.budget]\ncost_per_team = 0.6\n\n[safety.budget.prices.\"*\"]\n\
             prompt_per_1k = 1.0\ncompletion_per_1k = 1.0\n"
                .to_string(),
        ),
    };
    let slice_key = match spend {
        Spend::Tokens => "budget_slice_tokens = 60",
        Spend::Cost => "budget_slice_cost = 0.06",
    };
    let team = |agent: &str| {
        format!(
            "{keys}\n[providers.m]\nkind = \"scripted\"\nreplies = [\"done\"]\ncycle = true\n\n\
             {PAIR_CLUSTER}{slice_key}\n\n[[agents]]\nkey = \"{agent}\"\nprovider = \"m\"\n"
        )
    };
    let a = Node::start_with(&dir, "a", &nats.url(), &team("a1"));
    let b = Node::start_with(&dir, "b", &nats.url(), &team("b1"));
    let nodes = [(&a, "a1"), (&b, "b1")];
    let mut answered = [0_u32; 2];
    for _ in 0..400 {
        let mut running = false;
        for (i, (node, agent)) in nodes.iter().enumerate() {
            if node.state_of(agent) == "STOPPED" {
                continue;
            }
            running = true;
            let path = format!("/api/agents/{agent}/events?wait=10");
            if node.post(&path, Some(r#"{"content":"go"}"#)).0 == 200 {
                answered[i] += 1;
            }
        }
        if !running {
            break;
        }
    }
    let what = match spend {
        Spend::Tokens => "team token budget exhausted",
        Spend::Cost => "team cost budget exhausted",
    };
    for (node, agent) in nodes {
        assert_eq!(
            node.state_of(agent),
            "STOPPED",
            "{} never stopped",
            node.name
        );
        let events = node
            .get(&format!("/api/events/recent?agent={agent}&limit=500"))
            .to_string();
        assert!(
            events.contains(what) && events.contains("held by this node"),
            "{events}"
        );
    }
    // Tokens at the top of `budget`, cost under `budget.cost` (in the price currency).
    let of = |c: &Value| match spend {
        Spend::Tokens => c["budget"].clone(),
        Spend::Cost => c["budget"]["cost"].clone(),
    };
    let (ca, cb) = (of(&a.get("/api/cluster")), of(&b.get("/api/cluster")));
    let shared = &ca["shared"];
    let figure = |c: &Value, k: &str| c[k].as_f64().unwrap_or_else(|| panic!("no {k} in {c}"));
    let (held_a, held_b) = (figure(&ca, "held"), figure(&cb, "held"));
    let (used_a, used_b) = (figure(&ca, "used"), figure(&cb, "used"));
    eprintln!(
        "{spend:?}: budget {budget}, slices of {slice}: a answered {} (used {used_a} of {held_a} \
         held), b answered {} (used {used_b} of {held_b} held); shared {shared}",
        answered[0], answered[1]
    );
    let same = |x: f64, y: f64| (x - y).abs() < 1e-9;
    assert!(same(figure(shared, "budget"), budget), "{shared}");
    assert!(
        same(figure(shared, "claimed"), budget),
        "every slice claimed: {shared}"
    );
    assert!(same(held_a + held_b, budget));
    assert!(same(figure(&shared["nodes"], "a"), held_a));
    assert!(same(figure(&shared["nodes"], "b"), held_b));
    assert!(
        held_a >= slice - 1e-9 && held_b >= slice - 1e-9,
        "both nodes spent"
    );
    // Each node spends at most what it holds (the check is on the call's estimate, which here
    // is above what the scripted model reports): no overshoot at all, let alone one slice.
    assert!(
        used_a <= held_a + 1e-9 && used_b <= held_b + 1e-9,
        "a node spent past its slices"
    );
    assert!(used_a + used_b <= budget + 1e-9);
    // a restarted holds what it claimed before (and its usage, from its journal): nothing is
    // claimed again.
    let mut a = a;
    a.kill();
    a.spawn();
    let again = of(&a.get("/api/cluster"));
    assert!(same(figure(&again, "held"), held_a), "{again}");
    assert!(same(figure(&again, "used"), used_a), "{again}");
    assert!(same(figure(&again["shared"], "claimed"), budget), "{again}");
}

/// A team file of `agents`, each (key, what its model does: delegate to `Some(agent)` first, or
/// only answer), with its own scripted provider.
fn chain_team(agents: &[(String, Option<String>)]) -> String {
    let mut text = format!("{PAIR_CLUSTER}\n");
    for (key, delegate) in agents {
        let replies = match delegate {
            Some(to) => format!(
                "[\n  {{ tool = \"delegate\", args = {{ agent = \"{to}\", task = \"x\" }} }},\n  \
                 \"{key} done\",\n]"
            ),
            None => format!("[\"{key} done\"]"),
        };
        text.push_str(&format!(
            "\n[providers.{key}]\nkind = \"scripted\"\ncycle = true\nreplies = {replies}\n\n\
             [[agents]]\nkey = \"{key}\"\nprovider = \"{key}\"\n"
        ));
    }
    text
}

#[test]
fn a_cascade_across_three_nodes_runs_every_hop_once_with_per_node_figures() {
    let dir = temp_dir("cascade3");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    // Root r{i} on a delegates to m{i} on b, which delegates to l{i} on c.
    let (trees, events) = (12, 25);
    let level = |name: &str, next: Option<&str>| -> Vec<(String, Option<String>)> {
        (0..trees)
            .map(|i| (format!("{name}{i}"), next.map(|n| format!("{n}{i}"))))
            .collect()
    };
    let a = Node::start_with(&dir, "a", &nats.url(), &chain_team(&level("r", Some("m"))));
    let b = Node::start_with(&dir, "b", &nats.url(), &chain_team(&level("m", Some("l"))));
    let c = Node::start_with(&dir, "c", &nats.url(), &chain_team(&level("l", None)));
    let started = Instant::now();
    let mut took: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..trees)
            .map(|i| {
                let a = &a;
                s.spawn(move || {
                    (0..events)
                        .map(|_| {
                            let at = Instant::now();
                            let (status, body) = a.post(
                                &format!("/api/agents/r{i}/events?wait=30"),
                                Some(r#"{"content":"go"}"#),
                            );
                            assert_eq!(status, 200, "{body}");
                            assert_eq!(body["answer"], format!("r{i} done"), "{body}");
                            at.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let wall = started.elapsed();
    took.sort();
    let total = trees * events;
    let mut per_node = serde_json::Map::new();
    for (node, prefix) in [(&a, "r"), (&b, "m"), (&c, "l")] {
        let turns: u64 = (0..trees)
            .map(|i| turns_of(node, &format!("{prefix}{i}")))
            .sum();
        let cluster = node.get("/api/cluster");
        assert_eq!(turns, total as u64, "every hop ran once on {}", node.name);
        per_node.insert(
            node.name.clone(),
            serde_json::json!({
                "agents": trees,
                "turns": turns,
                "delegations_received": cluster["delegations"]["received"],
                "delegations_ran": cluster["delegations"]["ran"],
            }),
        );
    }
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    let report = serde_json::json!({
        "scenario": "cascade-3-nodes",
        "trees": trees,
        "events": total,
        "wall_s": (wall.as_secs_f64() * 1e3).round() / 1e3,
        "events_per_s": (total as f64 / wall.as_secs_f64()).round(),
        "latency_ms": {"p50": ms(percentile(&took, 50.0)), "p99": ms(percentile(&took, 99.0)),
                       "max": ms(*took.last().unwrap())},
        "nodes": per_node,
    });
    eprintln!("{report}");
    // b and c received one request a hop (no resends were needed on loopback).
    assert_eq!(report["nodes"]["b"]["delegations_ran"], total);
    assert_eq!(report["nodes"]["c"]["delegations_ran"], total);
    assert_eq!(report["nodes"]["a"]["delegations_ran"], 0);
}

// ================================================================================================
// Lifting the cluster halt (`POST /api/resume`, `warden resume --all`) and moving agents off a
// dead node (adoption). Added by the wip-lift branch; keep new tests of other topics out of here.
// ================================================================================================

/// Posts an event to `agent` on `node` and waits for its answer (`answered`).
fn answered(node: &Node, agent: &str) -> bool {
    let (status, body) = node.post(
        &format!("/api/agents/{agent}/events?wait=10"),
        Some(r#"{"content":"are you there"}"#),
    );
    status == 200 && body["status"] == "answered"
}

/// Halts the cluster on `node` and waits until every `(node, agent)` is `STOPPED`.
fn halt_cluster(node: &Node, agents: &[(&Node, &str)]) {
    let (status, body) = node.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    for (n, agent) in agents {
        wait_until(
            &format!("{agent} stopped on {}", n.name),
            Duration::from_secs(5),
            || n.state_of(agent) == "STOPPED",
        );
    }
}

#[test]
fn a_lift_on_b_runs_every_nodes_agents_again_and_a_later_node_comes_up_running() {
    let dir = temp_dir("lift");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let a = Node::start(&dir, "a", &nats.url(), &["a1", "a2"]);
    let b = Node::start(&dir, "b", &nats.url(), &["b1"]);
    peers(&a, &["b"]);
    // a2 halted by itself before the cluster halt: the lift leaves it stopped.
    let (status, body) = a.post("/api/agents/a2/halt", None);
    assert_eq!(status, 200, "{body}");
    // Nothing to lift yet.
    let (status, body) = b.post("/api/resume", None);
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("not halted"),
        "{body}"
    );
    halt_cluster(&a, &[(&a, "a1"), (&b, "b1")]);
    assert!(!answered(&b, "b1"), "a halted agent answers nothing");
    // The lift on b, through the CLI.
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["resume", "--all", "--reason", "all clear"])
        .args(["--url", &format!("http://127.0.0.1:{}", b.port)])
        .args(["--token", TOKEN])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("cluster halt lifted (epoch 2)"), "{stdout}");
    assert!(stdout.contains("resumed b1 (node b)"), "{stdout}");
    wait_until("a1 runs again on a", Duration::from_secs(5), || {
        a.state_of("a1") == "WAITING_FOR_EVENT"
    });
    eprintln!(
        "cluster halt lifted on b: a's agent running {:.0} ms after the request",
        started.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(b.state_of("b1"), "WAITING_FOR_EVENT");
    assert!(answered(&a, "a1"), "a1 answers after the lift");
    assert!(answered(&b, "b1"), "b1 answers after the lift");
    assert_eq!(a.state_of("a2"), "STOPPED", "halted by itself: kept");
    for node in [&a, &b] {
        wait_until("the lift read everywhere", Duration::from_secs(5), || {
            let cluster = node.get("/api/cluster");
            cluster["halt_epoch"] == 2 && cluster["halt"]["halted"] == false
        });
    }
    // Journaled on a with the reason.
    let events = a.get("/api/events/recent?agent=a1&limit=100").to_string();
    assert!(
        events.contains("lift of the cluster halt, epoch 2: all clear"),
        "{events}"
    );
    // A node started after the lift is not halted.
    let c = Node::start(&dir, "c", &nats.url(), &["c1"]);
    assert_eq!(c.state_of("c1"), "WAITING_FOR_EVENT");
    assert!(!c.stderr().contains("coming up halted"), "{}", c.stderr());
    assert!(answered(&c, "c1"));
    // Lifted already: a second lift is refused.
    let (status, body) = a.post("/api/resume", None);
    assert_eq!(status, 409, "{body}");
    // A halt after the lift halts again, at the next epoch, everywhere.
    halt_cluster(&c, &[(&a, "a1"), (&b, "b1"), (&c, "c1")]);
    assert_eq!(a.get("/api/cluster")["halt_epoch"], 3);
}

#[test]
fn a_node_killed_while_the_cluster_is_halted_runs_its_agents_again_after_the_lift() {
    let dir = temp_dir("halt-restart");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    let mut b = Node::start(&dir, "b", &nats.url(), &["b1", "b2"]);
    peers(&a, &["b"]);
    // b2 halted by itself before the cluster halt: no lift resumes it, restarts or not.
    let (status, body) = b.post("/api/agents/b2/halt", None);
    assert_eq!(status, 200, "{body}");

    // 1. Killed while halted, lifted while down: b comes back with b1 running.
    halt_cluster(&a, &[(&a, "a1"), (&b, "b1")]);
    b.kill();
    let (status, body) = a.post("/api/resume", None);
    assert_eq!(status, 200, "{body}");
    wait_until("a1 runs again", Duration::from_secs(5), || {
        a.state_of("a1") == "WAITING_FOR_EVENT"
    });
    b.spawn();
    wait_until("b1 resumed at b's start", Duration::from_secs(5), || {
        b.state_of("b1") == "WAITING_FOR_EVENT"
    });
    assert!(
        b.stderr()
            .contains("cluster halt was lifted while this node was down (epoch 2): 1 of the 1"),
        "{}",
        b.stderr()
    );
    assert!(answered(&b, "b1"), "b1 answers after the restart");
    assert_eq!(b.state_of("b2"), "STOPPED", "halted by itself: kept");

    // 2. Killed while halted, restarted while still halted, lifted after: b1 runs again.
    halt_cluster(&a, &[(&a, "a1"), (&b, "b1")]);
    b.kill();
    b.spawn();
    assert!(b.stderr().contains("coming up halted"), "{}", b.stderr());
    assert_eq!(b.state_of("b1"), "STOPPED");
    assert!(!answered(&b, "b1"), "a halted agent answers nothing");
    let (status, body) = a.post("/api/resume", None);
    assert_eq!(status, 200, "{body}");
    wait_until("b1 resumed by the lift", Duration::from_secs(5), || {
        b.state_of("b1") == "WAITING_FOR_EVENT"
    });
    assert!(answered(&b, "b1"), "b1 answers after the lift");
    assert_eq!(b.state_of("b2"), "STOPPED", "halted by itself: kept");
    // The resumes are journaled with the lift that made them.
    let events = b.get("/api/events/recent?agent=b1&limit=200").to_string();
    assert!(events.contains("read at the start of node b"), "{events}");
    assert!(
        events.contains("lift of the cluster halt, epoch 4"),
        "{events}"
    );
}

#[test]
fn a_lift_whose_read_went_stale_is_refused_and_the_cluster_stays_halted() {
    let dir = temp_dir("lift-stale");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    // b's lifts wait 1.5 s between reading the halt key and writing it (the test hook).
    let b = Node::start_env(
        &dir,
        "b",
        &nats.url(),
        &team(&["b1"], 0),
        &[("WARDEN_TEST_LIFT_PAUSE_MS", "1500")],
    );
    peers(&a, &["b"]);
    halt_cluster(&a, &[(&a, "a1"), (&b, "b1")]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let kv = runtime.block_on(async {
        let client = async_nats::connect(nats.url()).await.unwrap();
        async_nats::jetstream::new(client)
            .get_key_value("warden_halt")
            .await
            .unwrap()
    });
    let rewrite = |state: Value| {
        runtime.block_on(async {
            let entry = kv.entry("halt").await.unwrap().unwrap();
            let body = serde_json::to_vec(&state).unwrap();
            kv.update("halt", body.into(), entry.revision)
                .await
                .unwrap();
        })
    };
    let lift_on_b = || {
        let port = b.port;
        std::thread::spawn(move || {
            let started = Instant::now();
            let answer = request(port, "POST", "/api/resume", Some(r#"{"reason":"stale"}"#));
            (answer, started.elapsed())
        })
    };
    // 1. The key is rewritten between the lift's read and its write (the same epoch: only the
    //    compare-and-swap can tell).
    let lifting = lift_on_b();
    std::thread::sleep(Duration::from_millis(500));
    rewrite(
        serde_json::json!({"epoch": 1, "halted": true, "reason": "rewritten", "by": "test",
                               "node": "test", "at_ms": now_ms()}),
    );
    let ((status, body), took) = lifting.join().unwrap();
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("a halt came since"), "{body}");
    assert!(took >= Duration::from_millis(1500), "the hook paused it");
    // 2. A halt on a between the read and the write.
    let lifting = lift_on_b();
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = a.post("/api/halt", None);
    assert_eq!(status, 200, "{body}");
    let ((status, body), _) = lifting.join().unwrap();
    assert_eq!(status, 409, "{body}");
    // The cluster stays halted: nothing resumed anywhere, the key halted.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(a.state_of("a1"), "STOPPED");
    assert_eq!(b.state_of("b1"), "STOPPED");
    let halt = runtime.block_on(async { kv.get("halt").await.unwrap().unwrap() });
    let halt: Value = serde_json::from_slice(&halt).unwrap();
    assert_eq!(
        (halt["epoch"].as_u64(), &halt["halted"]),
        (Some(2), &Value::Bool(true))
    );
    // Nothing in between: the same lift goes through.
    let ((status, body), _) = lift_on_b().join().unwrap();
    assert_eq!(status, 200, "{body}");
    wait_until("a1 runs again", Duration::from_secs(5), || {
        a.state_of("a1") == "WAITING_FOR_EVENT"
    });
    assert_eq!(b.state_of("b1"), "WAITING_FOR_EVENT");
}

#[test]
fn a_node_cut_off_from_jetstream_cannot_lift_the_halt() {
    let dir = temp_dir("lift-cut");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let proxy = Proxy::start(nats.port);
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    let b = Node::start(&dir, "b", &proxy.url(), &["b1"]);
    peers(&a, &["b"]);
    halt_cluster(&a, &[(&a, "a1"), (&b, "b1")]);
    proxy.black_hole();
    let started = Instant::now();
    let (status, body) = b.post("/api/resume", None);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("lift refused"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "bounded");
    assert_eq!(b.state_of("b1"), "STOPPED");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(a.state_of("a1"), "STOPPED");
    assert_eq!(a.get("/api/cluster")["halt"]["halted"], true);
    // Healed, the lift goes through.
    proxy.heal();
    wait_until("the lift succeeds", Duration::from_secs(15), || {
        b.post("/api/resume", None).0 == 200
    });
    wait_until("a1 runs again", Duration::from_secs(5), || {
        a.state_of("a1") == "WAITING_FOR_EVENT"
    });
    assert_eq!(b.state_of("b1"), "WAITING_FOR_EVENT");
}

#[test]
fn a_locked_out_agent_stays_locked_out_after_a_lift() {
    let dir = temp_dir("lift-lockout");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let worker = format!(
        "[safety.breakers]\nmax_consecutive_errors = 1\n\n[providers.m]\nkind = \"scripted\"\n\
         cycle = true\nreplies = [{{ fail = \"model down\" }}]\n\n[providers.ok]\nkind = \
         \"scripted\"\ncycle = true\nreplies = [\"fine\"]\n\n{PAIR_CLUSTER}\n[[agents]]\nkey = \
         \"worker\"\nprovider = \"m\"\n\n[[agents]]\nkey = \"b1\"\nprovider = \"ok\"\n"
    );
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    let b = Node::start_with(&dir, "b", &nats.url(), &worker);
    peers(&a, &["b"]);
    let (status, body) = b.post("/api/agents/worker/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("worker locked out on b", Duration::from_secs(10), || {
        b.state_of("worker") == "SAFETY_LOCKOUT"
    });
    halt_cluster(&a, &[(&a, "a1"), (&b, "b1")]);
    let (status, body) = a.post("/api/resume", Some(r#"{"reason":"go on"}"#));
    assert_eq!(status, 200, "{body}");
    wait_until("b1 runs again", Duration::from_secs(5), || {
        b.state_of("b1") == "WAITING_FOR_EVENT"
    });
    assert_eq!(
        b.state_of("worker"),
        "SAFETY_LOCKOUT",
        "only an unlock lifts it"
    );
    assert_eq!(b.get("/api/agents/worker")["emergency_stop"], true);
    // The unlock still works, and is what it takes.
    let (status, body) = b.post("/api/agents/worker/unlock", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(b.state_of("worker"), "WAITING_FOR_EVENT");
}

/// A team of `agents` (`y`'s model fails: one failure locks it out; the others answer), with
/// `[cluster]` `settings` after the pair's.
fn adoption_team(agents: &[&str], settings: &str) -> String {
    let mut text = format!(
        "[safety.breakers]\nmax_consecutive_errors = 1\n\n[providers.m]\nkind = \"scripted\"\n\
         cycle = true\nreplies = [\"x here\"]\n\n[providers.bad]\nkind = \"scripted\"\ncycle = \
         true\nreplies = [{{ fail = \"model down\" }}]\n\n{PAIR_CLUSTER}{settings}"
    );
    for agent in agents {
        let provider = if *agent == "y" { "bad" } else { "m" };
        text.push_str(&format!(
            "\n[[agents]]\nkey = \"{agent}\"\nprovider = \"{provider}\"\n"
        ));
    }
    text
}

/// Whether `node` runs `agent` itself (its `GET /api/agents/KEY` names it as the node).
/// Waits (5 s at most) for `node`'s standard error to hold `line`. An adoption or take-back is
/// visible (the agent listed, its state) a moment before its log line is written.
fn logs(node: &Node, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node.stderr().contains(line) {
        assert!(
            Instant::now() < deadline,
            "node {} never logged {line:?}:\n{}",
            node.name,
            node.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runs(node: &Node, agent: &str) -> bool {
    let (status, body) = request(node.port, "GET", &format!("/api/agents/{agent}"), None);
    status == 200
        && serde_json::from_str::<Value>(&body).is_ok_and(|v| v["node"] == node.name.as_str())
}

#[test]
fn a_dead_nodes_agents_are_adopted_with_their_lockout_and_not_started_twice() {
    let dir = temp_dir("adopt");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let mut a = Node::start_with(&dir, "a", &nats.url(), &adoption_team(&["x", "y"], ""));
    let b = Node::start_with(
        &dir,
        "b",
        &nats.url(),
        &adoption_team(&["x", "y", "b1"], ""),
    );
    // b was started second: a owns x and y, b has them elsewhere.
    assert!(!runs(&b, "x") && !runs(&b, "y"));
    assert_eq!(b.get("/api/cluster")["elsewhere"]["x"], "a");
    // y locks itself out on a; b sees the lockout.
    let (status, body) = a.post("/api/agents/y/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 202, "{body}");
    wait_until("y locked out on a", Duration::from_secs(10), || {
        a.state_of("y") == "SAFETY_LOCKOUT"
    });
    wait_until("b sees y's lockout", Duration::from_secs(5), || {
        b.get("/api/cluster")["lockouts"]["y"]["locked"] == true
    });
    assert!(answered(&a, "x"));
    // kill -9 a: b adopts x within the lease TTL (3 s) and a beat.
    a.kill();
    let killed = Instant::now();
    wait_until("b adopts x", Duration::from_secs(10), || runs(&b, "x"));
    let adopted = killed.elapsed();
    assert!(answered(&b, "x"), "x answers on b");
    let answered_after = killed.elapsed();
    eprintln!(
        "adoption: x running on b {:.2} s after kill -9 of a (lease_ttl_seconds = 3), answering \
         {:.2} s after",
        adopted.as_secs_f64(),
        answered_after.as_secs_f64()
    );
    assert!(adopted < Duration::from_secs(3 + 2), "{adopted:?}");
    // y came up locked out on b: it refuses work until an unlock.
    wait_until("b adopts y", Duration::from_secs(5), || runs(&b, "y"));
    assert_eq!(b.state_of("y"), "SAFETY_LOCKOUT");
    let (status, body) = b.post("/api/agents/y/events", Some(r#"{"content":"go"}"#));
    assert_eq!(status, 409, "{body}");
    logs(&b, "adopted here");
    let cluster = b.get("/api/cluster");
    assert!(cluster["elsewhere"].get("x").is_none(), "{cluster}");
    assert_eq!(cluster["lockouts"]["y"]["locked"], true, "{cluster}");
    // a restarted (same team file): x and y are b's now, a does not start them.
    a.spawn();
    assert!(!runs(&a, "x") && !runs(&a, "y"), "a must not start x twice");
    assert!(
        a.stderr().contains("agent x is owned by node b"),
        "{}",
        a.stderr()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(runs(&b, "x") && !runs(&a, "x"));
    assert!(answered(&b, "x"));
    let fleet = b.fleet();
    assert_eq!(
        fleet.iter().filter(|(k, _, _)| k == "x").count(),
        1,
        "{fleet:?}"
    );
}

#[test]
fn an_operators_halt_and_pause_survive_the_death_of_the_node() {
    let dir = temp_dir("adopt-stopped");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let mut a = Node::start_with(&dir, "a", &nats.url(), &adoption_team(&["x", "z", "w"], ""));
    let b = Node::start_with(
        &dir,
        "b",
        &nats.url(),
        &adoption_team(&["x", "z", "w", "b1"], ""),
    );
    // On a: x halted by an operator, z paused; w runs. Then a dies at once.
    let (status, body) = a.post("/api/agents/x/halt", None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = a.post("/api/agents/z/pause", None);
    assert_eq!(status, 200, "{body}");
    a.kill();
    for agent in ["x", "z", "w"] {
        wait_until(
            &format!("b adopts {agent}"),
            Duration::from_secs(10),
            || runs(&b, agent),
        );
    }
    // The operator's decisions hold on the new node; a lift of a fleet halt would not undo them.
    assert_eq!(b.state_of("x"), "STOPPED");
    assert_eq!(b.get("/api/agents/z")["paused"], true);
    assert!(!answered(&b, "x"));
    assert!(answered(&b, "w"));
    logs(&b, "adopted here, halted on node a");
    // A cluster halt and its lift leave x halted (its halt was not the fleet's).
    halt_cluster(&b, &[(&b, "w")]);
    let (status, body) = b.post("/api/resume", None);
    assert_eq!(status, 200, "{body}");
    wait_until("w runs again", Duration::from_secs(5), || {
        b.state_of("w") == "WAITING_FOR_EVENT"
    });
    assert_eq!(b.state_of("x"), "STOPPED");
    // Resumed by hand on b, x works again.
    let (status, body) = b.post("/api/agents/x/resume", None);
    assert_eq!(status, 200, "{body}");
    assert!(answered(&b, "x"));
}

#[test]
fn an_agent_stopped_by_a_cluster_halt_lifted_since_comes_up_running_on_the_adopter() {
    let dir = temp_dir("adopt-lifted");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let mut a = Node::start_with(&dir, "a", &nats.url(), &adoption_team(&["x"], ""));
    let b = Node::start_with(&dir, "b", &nats.url(), &adoption_team(&["x", "b1"], ""));
    peers(&a, &["b"]);
    halt_cluster(&a, &[(&a, "x"), (&b, "b1")]);
    // Two beats: a's lease on x says STOPPED by the fleet halt, and b has read it.
    std::thread::sleep(Duration::from_secs(2));
    a.kill();
    let (status, body) = b.post("/api/resume", None);
    assert_eq!(status, 200, "{body}");
    wait_until("b adopts x", Duration::from_secs(10), || runs(&b, "x"));
    // Its halt was the cluster's, and it is lifted: x runs (it used to stay STOPPED).
    assert_eq!(b.state_of("x"), "WAITING_FOR_EVENT");
    assert!(answered(&b, "x"));
}

#[test]
fn an_agent_adopted_while_the_cluster_is_halted_comes_up_halted_and_adopt_false_adopts_nothing() {
    let dir = temp_dir("adopt-halted");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let mut a = Node::start_with(&dir, "a", &nats.url(), &adoption_team(&["x", "z"], ""));
    // b lists x (adopts it); c lists z with adoption off (never adopts it).
    let b = Node::start_with(&dir, "b", &nats.url(), &adoption_team(&["x", "b1"], ""));
    let c = Node::start_with(
        &dir,
        "c",
        &nats.url(),
        &adoption_team(&["z", "c1"], "adopt = false\n"),
    );
    assert_eq!(c.get("/api/cluster")["elsewhere"]["z"], "a");
    peers(&a, &["b", "c"]);
    halt_cluster(&a, &[(&a, "x"), (&b, "b1"), (&c, "c1")]);
    a.kill();
    // Waited for the adoption's end (its log line), not for the lease: b's API can name b as
    // x's node before the adoption is done. It came up halted, not halted afterwards.
    wait_until("b adopts x", Duration::from_secs(15), || {
        b.stderr()
            .contains("node a's lease on agent x is gone: adopted here")
    });
    assert!(
        b.stderr()
            .contains("node a's lease on agent x is gone: adopted here, halted ("),
        "{}",
        b.stderr()
    );
    assert!(runs(&b, "x"));
    assert_eq!(b.state_of("x"), "STOPPED", "the cluster is halted");
    assert!(!answered(&b, "x"));
    // c has adoption off: z is started nowhere.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!runs(&c, "z"), "adopt = false");
    assert!(b.fleet().iter().all(|(k, _, _)| k != "z"));
    // The lift resumes the adopted agent with the others.
    let (status, body) = c.post("/api/resume", None);
    assert_eq!(status, 200, "{body}");
    wait_until("x runs on b", Duration::from_secs(5), || {
        b.state_of("x") == "WAITING_FOR_EVENT"
    });
    assert!(answered(&b, "x"));
    assert_eq!(b.state_of("b1"), "WAITING_FOR_EVENT");
}

/// Cuts `a` (joined through `proxy`) off until `b` adopts x, heals it, and waits until `a` has
/// given its copy up.
fn give_x_up(proxy: &Proxy, a: &Node, b: &Node) {
    proxy.black_hole();
    wait_until("b adopts x", Duration::from_secs(10), || runs(b, "x"));
    proxy.heal();
    wait_until("a gives its copy of x up", Duration::from_secs(15), || {
        a.get("/api/agents/x")["node"] == "b"
            && a.get("/api/events/recent?agent=x&limit=100")
                .to_string()
                .contains(r#""by":"lease_lost""#)
    });
}

#[test]
fn a_node_restarted_after_giving_an_agent_up_takes_it_back_all_the_same() {
    let dir = temp_dir("give-up-restart");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let proxy = Proxy::start(nats.port);
    let mut a = Node::start_with(&dir, "a", &proxy.url(), &adoption_team(&["x"], ""));
    let mut b = Node::start_with(&dir, "b", &nats.url(), &adoption_team(&["x", "b1"], ""));
    assert!(runs(&a, "x"));

    // 1. a gives x up, restarts while b runs x, and adopts x back when b dies.
    give_x_up(&proxy, &a, &b);
    a.kill();
    a.spawn();
    assert!(!runs(&a, "x"), "b holds x's lease");
    b.kill();
    wait_until("a adopts x back", Duration::from_secs(10), || {
        runs(&a, "x") && a.state_of("x") == "WAITING_FOR_EVENT"
    });
    logs(&a, "adopted here back: resumed");
    assert!(answered(&a, "x"), "x answers on a");

    // 2. a gives x up again, both nodes die, and a restarted claims x at its start.
    b.spawn();
    give_x_up(&proxy, &a, &b);
    a.kill();
    b.kill();
    // x's lease (b's) ages out: TTL 3 s.
    std::thread::sleep(Duration::from_secs(4));
    a.spawn();
    assert!(runs(&a, "x"));
    assert_eq!(a.state_of("x"), "WAITING_FOR_EVENT");
    logs(
        &a,
        "agent x, given up here before this node restarted, is this node's again: resumed",
    );
    assert!(answered(&a, "x"), "x answers on a");
    let events = a.get("/api/events/recent?agent=x&limit=200").to_string();
    assert!(
        events.contains("taken back at the start of node a"),
        "{events}"
    );
}

#[test]
fn a_partitioned_owner_that_comes_back_halts_the_agent_another_node_adopted_and_takes_it_back() {
    let dir = temp_dir("adopt-partition");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let proxy = Proxy::start(nats.port);
    let a = Node::start_with(&dir, "a", &proxy.url(), &adoption_team(&["x"], ""));
    let mut b = Node::start_with(&dir, "b", &nats.url(), &adoption_team(&["x", "b1"], ""));
    assert!(runs(&a, "x") && !runs(&b, "x"));
    // a cut off longer than the TTL: its lease ages out and b adopts x.
    proxy.black_hole();
    wait_until("b adopts x", Duration::from_secs(10), || runs(&b, "x"));
    assert!(answered(&b, "x"));
    // a back: it finds x's lease b's and halts its copy.
    proxy.heal();
    wait_until("a halts its copy of x", Duration::from_secs(15), || {
        a.get("/api/events/recent?agent=x&limit=100")
            .to_string()
            .contains(r#"{"by":"lease_lost","node":"b"}"#)
    });
    assert!(
        a.stderr().contains("the lease of x is now node b's"),
        "{}",
        a.stderr()
    );
    assert_eq!(a.get("/api/cluster")["elsewhere"]["x"], "b");
    assert!(answered(&b, "x"));
    // a's halted copy cannot be brought back by hand while b runs x.
    for (route, body) in [
        ("resume", None),
        ("unlock", None),
        ("pause", None),
        ("events", Some(r#"{"content":"hi"}"#)),
    ] {
        let (status, body) = a.post(&format!("/api/agents/x/{route}"), body);
        assert_eq!(status, 409, "{route}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap_or_default()
                .contains("runs on node b"),
            "{route}: {body}"
        );
    }
    // GET on a tells where x runs: b (once a reads the cluster again after the heal).
    wait_until("a shows x on b", Duration::from_secs(5), || {
        let x = a.get("/api/agents/x");
        x["node"] == "b" && x["state"] == "WAITING_FOR_EVENT"
    });
    let calls = model_calls(&a, "x");
    // b dies: a adopts x back (its halted copy, resumed) once b's lease has aged out.
    b.kill();
    wait_until("a takes x back", Duration::from_secs(10), || {
        runs(&a, "x") && a.state_of("x") == "WAITING_FOR_EVENT"
    });
    logs(&a, "adopted here back: resumed");
    assert!(answered(&a, "x"), "x answers on a again");
    assert_eq!(model_calls(&a, "x"), calls + 1);
    let cluster = a.get("/api/cluster");
    assert!(cluster["elsewhere"].get("x").is_none(), "{cluster}");
    let fleet = a.fleet();
    assert_eq!(
        fleet.iter().filter(|(k, _, _)| k == "x").count(),
        1,
        "{fleet:?}"
    );
}

#[test]
fn an_agent_with_mcp_tools_is_adopted_with_its_tools() {
    let dir = temp_dir("adopt-mcp");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        warden_testkit::skip("python3 is not installed (needed for the MCP server of this test)");
        return;
    }
    // x calls the `ok` tool of the MCP server `h` (tests/mcp/hostile_server.py), then answers.
    let team = |agents: &[&str]| {
        let server = format!("{}/tests/mcp/hostile_server.py", env!("CARGO_MANIFEST_DIR"));
        let mut text = format!(
            "[providers.m]\nkind = \"scripted\"\ncycle = true\nreplies = [\"here\"]\n\n\
             [providers.t]\nkind = \"scripted\"\ncycle = true\nreplies = [{{ tool = \"h__ok\", \
             args = {{}} }}, \"the tool said ok\"]\n\n[mcp_servers.h]\ncommand = \"python3\"\n\
             args = [{server:?}]\n\n{PAIR_CLUSTER}"
        );
        for agent in agents {
            let (provider, tools) = match *agent {
                "x" => ("t", "\ntools = [\"h.ok\"]"),
                _ => ("m", ""),
            };
            text.push_str(&format!(
                "\n[[agents]]\nkey = \"{agent}\"\nprovider = \"{provider}\"{tools}\n"
            ));
        }
        text
    };
    let mut a = Node::start_with(&dir, "a", &nats.url(), &team(&["x"]));
    let b = Node::start_with(&dir, "b", &nats.url(), &team(&["x", "b1"]));
    assert!(runs(&a, "x") && !runs(&b, "x"));
    assert!(answered(&a, "x"));
    a.kill();
    wait_until("b adopts x", Duration::from_secs(10), || runs(&b, "x"));
    assert!(answered(&b, "x"), "x answers on b");
    let events = b.get("/api/events/recent?agent=x&limit=100").to_string();
    assert!(
        events.contains("tool_finished") && events.contains("h__ok"),
        "x called its MCP tool on b: {events}"
    );
    assert!(!events.contains("tool_refused"), "{events}");
}

#[test]
fn an_agent_of_another_node_is_shown_and_halted_from_any_node() {
    let dir = temp_dir("remote-agent");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    // b lists x (a's: started first) but not a1.
    let mut a = Node::start_with(&dir, "a", &nats.url(), &adoption_team(&["x", "a1"], ""));
    let b = Node::start_with(&dir, "b", &nats.url(), &adoption_team(&["x", "b1"], ""));
    for agent in ["x", "a1"] {
        wait_until(
            &format!("b shows {agent} on a"),
            Duration::from_secs(5),
            || {
                let (status, body) = request(b.port, "GET", &format!("/api/agents/{agent}"), None);
                status == 200 && body.contains(r#""node":"a""#)
            },
        );
    }
    assert_eq!(b.get("/api/agents/b1")["node"], "b");
    assert_eq!(request(b.port, "GET", "/api/agents/nobody", None).0, 404);
    // The routes that act on x through b name its node.
    let (status, body) = b.post("/api/agents/x/events", Some(r#"{"content":"hi"}"#));
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("runs on node a"),
        "{body}"
    );
    // b never ran x: an unlock or resume asked there says where x runs, not that b's copy was
    // halted (b has none).
    for route in ["unlock", "resume", "emergency/clear"] {
        let (status, body) = b.post(&format!("/api/agents/x/{route}"), None);
        assert_eq!(status, 409, "{route}: {body}");
        let said = body["error"].as_str().unwrap_or_default();
        assert!(said.contains("runs on node a"), "{route}: {body}");
        assert!(
            !said.contains("copy"),
            "{route}: b never had a copy: {body}"
        );
    }
    // A halt asked on b is applied on a and answered with a's acks.
    for agent in ["x", "a1"] {
        let (status, body) = b.post(&format!("/api/agents/{agent}/halt"), None);
        assert_eq!(status, 200, "{agent}: {body}");
        assert_eq!(body["node"], "a", "{body}");
        assert_eq!(body["halted"][0]["agent"], agent, "{body}");
        assert_eq!(body["halted"][0]["state"], "STOPPED", "{body}");
        assert_eq!(a.state_of(agent), "STOPPED", "applied before the answer");
        assert_eq!(
            b.state_of(agent),
            "STOPPED",
            "b shows it halted once it has the answer (the owner wrote its lease)"
        );
        let events = a.get(&format!("/api/events/recent?agent={agent}&limit=50"));
        assert!(events.to_string().contains(" via node b"), "{events}");
    }
    assert_eq!(b.state_of("b1"), "WAITING_FOR_EVENT");
    // a frozen: the halt cannot be acknowledged, and the answer says so (never a success).
    a.signal("STOP");
    let (status, body) = b.post("/api/agents/x/halt", None);
    a.signal("CONT");
    assert_eq!(status, 504, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("did not acknowledge"),
        "{body}"
    );
    // a killed: until its lease ages out, b asks a, and nothing listens on NATS.
    a.kill();
    let (status, body) = b.post("/api/agents/x/halt", None);
    assert_eq!(status, 504, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("not reachable"),
        "{body}"
    );
}

/// One tool call over `warden serve`'s MCP endpoint on `node` (a session opened for it, with the
/// admin token): the tool's structured result.
fn mcp_call(node: &Node, tool: &str, arguments: Value) -> Value {
    let client = reqwest::blocking::Client::new();
    let url = format!("http://127.0.0.1:{}/mcp", node.port);
    let post = |session: Option<&str>, body: Value| {
        let mut request = client
            .post(&url)
            .bearer_auth(TOKEN)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("Mcp-Session-Id", session);
        }
        request.send().unwrap()
    };
    let init = post(
        None,
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "cluster-test", "version": "0"}}}),
    );
    assert_eq!(init.status().as_u16(), 200);
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    post(
        Some(&session),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let called = post(
        Some(&session),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}),
    );
    let body: Value = called.json().unwrap();
    assert_eq!(body["result"]["isError"], false, "{tool}: {body}");
    body["result"]["structuredContent"].clone()
}

/// HALT ALL through `node`'s console form (a session logged in with the admin token): where it
/// sends the browser.
fn console_halt_all(node: &Node) -> String {
    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = format!("http://127.0.0.1:{}", node.port);
    let login = client
        .post(format!("{base}/console/login"))
        .form(&[("token", TOKEN)])
        .send()
        .unwrap();
    assert_eq!(login.status().as_u16(), 303);
    let cookies: Vec<(String, String)> = login
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| {
            let (pair, _) = v.to_str().ok()?.split_once(';')?;
            let (k, v) = pair.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect();
    let cookie = |name: &str| {
        cookies
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let halted = client
        .post(format!("{base}/console/halt"))
        .header(
            "Cookie",
            format!(
                "warden_session={}; warden_csrf={}",
                cookie("warden_session"),
                cookie("warden_csrf")
            ),
        )
        .form(&[("csrf", cookie("warden_csrf")), ("confirm", "on".into())])
        .send()
        .unwrap();
    assert_eq!(halted.status().as_u16(), 303);
    halted.headers()["location"].to_str().unwrap().to_owned()
}

#[test]
fn the_console_form_and_the_mcp_tools_halt_across_the_cluster() {
    let dir = temp_dir("halt-paths");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    let a = Node::start(&dir, "a", &nats.url(), &["a1"]);
    let b = Node::start(&dir, "b", &nats.url(), &["b1"]);
    peers(&a, &["b"]);
    peers(&b, &["a"]);
    let running = |node: &Node, agent: &str| {
        wait_until(&format!("{agent} running"), Duration::from_secs(5), || {
            node.state_of(agent) == "WAITING_FOR_EVENT"
        });
    };
    // MCP halt_all on b: the cluster halt, a's agent included.
    let result = mcp_call(&b, "halt_all", serde_json::json!({}));
    assert!(result["epoch"].as_u64() >= Some(1), "{result}");
    assert!(result.to_string().contains(r#""node":"a""#), "{result}");
    assert_eq!(a.state_of("a1"), "STOPPED");
    assert_eq!(b.state_of("b1"), "STOPPED");
    let (status, body) = b.post("/api/resume", None);
    assert_eq!(status, 200, "{body}");
    running(&a, "a1");
    // MCP halt of a's agent, asked on b: applied on a.
    let result = mcp_call(&b, "halt", serde_json::json!({"agent": "a1"}));
    assert_eq!(result["node"], "a", "{result}");
    assert_eq!(a.state_of("a1"), "STOPPED");
    assert_eq!(b.state_of("b1"), "WAITING_FOR_EVENT");
    let (status, body) = a.post("/api/agents/a1/resume", None);
    assert_eq!(status, 200, "{body}");
    // The console's plain HALT ALL form on b: every node's agents.
    assert_eq!(console_halt_all(&b), "/?halted=2");
    assert_eq!(a.state_of("a1"), "STOPPED");
    assert_eq!(b.state_of("b1"), "STOPPED");
    assert_eq!(a.get("/api/cluster")["halt"]["by"], "console:admin");
}

/// How many model calls `agent` on `node` made (its `usage_recorded` events).
fn model_calls(node: &Node, agent: &str) -> usize {
    node.get(&format!("/api/events/recent?agent={agent}&limit=500"))
        .to_string()
        .matches("usage_recorded")
        .count()
}

#[test]
fn an_owner_that_stops_renewing_a_lease_starts_no_model_call_for_it_before_it_is_adopted() {
    let dir = temp_dir("fence");
    let Some(nats) = NatsServer::start(&dir) else {
        return;
    };
    // a never renews x's lease (the test hook: a thread too busy to renew it, or a bug), but
    // beats and renews everything else; b lists x too.
    let a = Node::start_env(
        &dir,
        "a",
        &nats.url(),
        &adoption_team(&["x", "a1"], ""),
        &[("WARDEN_TEST_SKIP_RENEW", "x")],
    );
    let claimed = Instant::now();
    let b = Node::start_with(&dir, "b", &nats.url(), &adoption_team(&["x", "b1"], ""));
    assert!(answered(&a, "x"), "x answers on a while its lease is fresh");
    let calls = model_calls(&a, "x");
    assert!(calls >= 1);
    // Past the TTL less a beat (3 - 1 s) since a's claim: x is fenced on a.
    let fence = Duration::from_secs(2);
    std::thread::sleep(fence.saturating_sub(claimed.elapsed()) + Duration::from_millis(300));
    let (status, body) = a.post(
        "/api/agents/x/events",
        Some(r#"{"content":"still there?"}"#),
    );
    assert_eq!(status, 202, "the event is accepted and queued: {body}");
    assert!(answered(&a, "a1"), "a's other agents go on");
    // b adopts x once the lease aged out (3 s after a's claim, and a beat).
    wait_until("b adopts x", Duration::from_secs(10), || runs(&b, "x"));
    let adopted = claimed.elapsed();
    assert!(answered(&b, "x"), "x answers on b");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        model_calls(&a, "x"),
        calls,
        "a started a model call for x after its lease could have lapsed"
    );
    eprintln!(
        "lease fence: x fenced on a from {:.1} s after its last lease write; adopted by b {:.2} s \
         after it; a made no model call for x meanwhile",
        fence.as_secs_f64(),
        adopted.as_secs_f64()
    );
}
