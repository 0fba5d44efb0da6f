//! Network namespaces for the cluster tests: a node whose whole network to NATS can be cut for
//! real, in the kernel, not in a proxy of the test.
//!
//! [`Netns::create`] makes a uniquely named namespace (`warden-PID-K`) and two veth pairs to it,
//! each on a /30 of its own inside a /29 of the benchmarking range 198.18.0.0/15 (RFC 2544,
//! routed nowhere):
//!
//! ```text
//!   host                                     namespace warden-PID-K
//!   wnPIDxK  198.18.B.1/30  ── veth ──  198.18.B.2/30  nats0    ← the node's NATS traffic (cut)
//!   waPIDxK  198.18.B.5/30  ── veth ──  198.18.B.6/30  admin0   ← the test reaches its API (kept up)
//! ```
//!
//! A process run with [`Netns::command`] sees only `lo`, `nats0` and `admin0`: it has no default
//! route, so its only way to NATS is `nats0` to [`Netns::nats_host`] (where the test's
//! `nats-server` listens, see `NatsServer::start_on`). That host-side address is a local address
//! of the host: processes on the host (the other nodes) reach it over `lo`, whatever the state of
//! the veth — checked: a connect to it from the host succeeds while `wnPIDxK` is down.
//!
//! [`Netns::partition`] is `ip link set wnPIDxK down` (the host side of `nats0`);
//! [`Netns::heal`] sets it up again. What that does, as observed on Linux 6.18 with a TCP
//! connection established across the pair (a client in the namespace, a server on the host):
//!
//! * **a black hole, no FIN, no RST**: the namespace's side keeps its address and its route
//!   (flagged `linkdown`, the peer having no carrier); writes there still succeed and queue, the
//!   kernel retransmits with a growing backoff (`ss -ti`: `backoff:4`, `rto:3264` after 7 s) and
//!   reports no error to the socket; the server on the host reads nothing and sees no end of
//!   stream; a new `connect` from the namespace times out (its SYNs are lost), it is not refused.
//! * ARP: the namespace's entry for the host's address would expire a few seconds into the cut
//!   (no answer to its probes), and from then on a new `connect` there fails at once with
//!   `EHOSTUNREACH` ("No route to host", observed 3 s into a cut) — a cut of the L2 segment rather
//!   than silence. So [`Netns::create`] pins that entry (`ip neigh … nud permanent`): the cut
//!   stays a black hole however long it lasts, as a partition beyond a router is.
//! * on the host, the down link's connected route is removed; without more, packets to the
//!   namespace would then follow the default route out of the machine. So each namespace's /29
//!   also has a `blackhole` route on the host at a high metric, unused while the link is up
//!   (the connected /30s are more specific); while it is down, the host's packets to the
//!   namespace go nowhere (`ip route get` to the namespace answers `Invalid argument`). The
//!   host's side of a connection survives it: what the host wrote during the cut arrives after
//!   the heal (this module's test), no FIN, no RST.
//! * healed, the queued bytes arrive at the next retransmit (which, after a long cut, may be
//!   seconds later: the backoff is not reset by the link coming back), on the same connection
//!   (measured by this module's test: 2.6 s after the heal of a 5.2 s cut).
//!
//! The kernel's `netem` qdisc and `nft`/`iptables` are not needed (iproute2 only).
//!
//! Needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`): [`Netns::create`] gives the reason when it
//! cannot, and [`Netns::create_or_skip`] prints `SKIPPED: network namespaces unavailable: …`
//! (the test then passes, as the `nats-server` skips do); `.ci/run` runs as root and installs
//! `iproute2` when `ip` is missing.
//!
//! Clean-up: [`Drop`] deletes the namespace, both veth pairs and the blackhole route (a test that
//! panics included). The first namespace a test process creates also removes what earlier runs
//! left behind when they could not clean up (killed): namespaces, veths and routes named after a
//! process id that no longer runs, or after this process's own id (a crashed earlier run with the
//! same names).

use std::{
    ffi::OsStr,
    net::Ipv4Addr,
    process::Command,
    sync::{
        atomic::{AtomicU32, Ordering},
        Mutex, Once,
    },
};

/// The namespaces' addresses: 198.18.0.0/15, 16,384 blocks of /29.
const RANGE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const BLOCKS: u32 = 1 << 14;
/// The blackhole routes' metric is `METRIC_BASE + (pid << 9 | k % 512)` (a `u32`: pids are below
/// 2^22), which names the process that owns it for the sweep of leftovers.
const METRIC_BASE: u32 = 1000;

/// One network namespace with a NATS link (cut by [`Netns::partition`]) and an admin link (always
/// up) to the host. Deleted, with its links and route, when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
    nats_dev: String,
    admin_dev: String,
    block: Ipv4Addr,
    metric: u32,
    /// The host's address on the NATS link (198.18.B.1): where `nats-server` listens.
    pub nats_host: Ipv4Addr,
    /// The namespace's address on the NATS link (198.18.B.2).
    pub nats_peer: Ipv4Addr,
    /// The host's address on the admin link (198.18.B.5).
    pub admin_host: Ipv4Addr,
    /// The namespace's address on the admin link (198.18.B.6): where a node inside listens.
    pub admin_peer: Ipv4Addr,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();
/// Serializes the choice of a free block and its creation within this process.
static CREATING: Mutex<()> = Mutex::new(());

impl Netns {
    /// Creates a namespace with both links up.
    ///
    /// # Errors
    /// Why it cannot: not root, `ip` missing, or the `ip` command that failed and its message
    /// (whatever was created by then is removed).
    pub fn create() -> Result<Netns, String> {
        if let Some(uid) = effective_uid() {
            if uid != 0 {
                return Err(format!(
                    "not root (euid {uid}): `ip netns add` needs CAP_SYS_ADMIN"
                ));
            }
        }
        ip(&["-V"])?;
        SWEEP.call_once(sweep_leftovers);
        let _creating = CREATING.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        let k = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("warden-{pid}-{k}");
        let block = free_block(pid, k)?;
        let at = |offset: u32| Ipv4Addr::from(u32::from(block) + offset);
        let netns = Netns {
            nats_dev: format!("wn{pid}x{k}"),
            admin_dev: format!("wa{pid}x{k}"),
            block,
            metric: METRIC_BASE + ((pid << 9) | (k % 512)),
            nats_host: at(1),
            nats_peer: at(2),
            admin_host: at(5),
            admin_peer: at(6),
            name,
        };
        // From here on, a failure drops `netns`: whatever was made is removed.
        netns.remove();
        netns.build()?;
        Ok(netns)
    }

    /// [`Netns::create`], or `None` after printing `SKIPPED: network namespaces unavailable:
    /// REASON` on standard error (the caller returns: the test passes, loudly skipped).
    pub fn create_or_skip() -> Option<Netns> {
        match Netns::create() {
            Ok(netns) => Some(netns),
            Err(reason) => {
                crate::skip(&format!("network namespaces unavailable: {reason}"));
                None
            }
        }
    }

    fn build(&self) -> Result<(), String> {
        let (name, block) = (self.name.as_str(), self.block);
        ip(&["netns", "add", name])?;
        // Some containers allow `ip netns add` but not the mounts `ip netns exec` makes.
        ip(&["netns", "exec", name, "true"])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        for (dev, peer, host, inside) in [
            (&self.nats_dev, "nats0", self.nats_host, self.nats_peer),
            (&self.admin_dev, "admin0", self.admin_host, self.admin_peer),
        ] {
            ip(&[
                "link", "add", dev, "type", "veth", "peer", "name", peer, "netns", name,
            ])?;
            ip(&["addr", "add", &format!("{host}/30"), "dev", dev])?;
            ip(&["link", "set", dev, "up"])?;
            ip(&[
                "-n",
                name,
                "addr",
                "add",
                &format!("{inside}/30"),
                "dev",
                peer,
            ])?;
            ip(&["-n", name, "link", "set", peer, "up"])?;
        }
        // The host's NATS address stays resolved in the namespace while the link is down: a
        // neighbour entry that never expires (else ARP fails a few seconds into a cut, and new
        // connections fail at once, `No route to host`, instead of timing out).
        let mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", self.nats_dev))
            .map_err(|e| format!("the MAC of {}: {e}", self.nats_dev))?;
        ip(&[
            "-n",
            name,
            "neigh",
            "replace",
            &self.nats_host.to_string(),
            "lladdr",
            mac.trim(),
            "dev",
            "nats0",
            "nud",
            "permanent",
        ])?;
        ip(&[
            "route",
            "add",
            "blackhole",
            &format!("{block}/29"),
            "metric",
            &self.metric.to_string(),
        ])?;
        Ok(())
    }

    /// The namespace's name (`warden-PID-K`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`; `ip`
    /// execs it, so the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Cuts the namespace's NATS link: `ip link set wnPIDxK down` (a black hole, see the module
    /// doc). The admin link stays up.
    ///
    /// # Panics
    /// If `ip` fails.
    pub fn partition(&self) {
        ip(&["link", "set", &self.nats_dev, "down"]).expect("cut the NATS link");
    }

    /// Sets the NATS link up again.
    ///
    /// # Panics
    /// If `ip` fails.
    pub fn heal(&self) {
        ip(&["link", "set", &self.nats_dev, "up"]).expect("heal the NATS link");
    }

    /// Removes the namespace, the host sides of both veth pairs (their peers go with them) and
    /// the blackhole route; whatever is missing is skipped.
    fn remove(&self) {
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.nats_dev]);
        let _ = ip(&["link", "del", &self.admin_dev]);
        let _ = ip(&[
            "route",
            "del",
            "blackhole",
            &format!("{}/29", self.block),
            "metric",
            &self.metric.to_string(),
        ]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Runs `ip ARGS`: its standard output, or what went wrong.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            "`ip` not found (apt-get install iproute2)".to_owned()
        } else {
            format!("cannot run ip: {e}")
        }
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The effective uid from `/proc/self/status` (`None` where there is no such file).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The first /29 from a start derived from `pid` and `k` that no address or route of the host
/// uses (parallel test binaries start 8 blocks apart per pid; the check catches the rest).
fn free_block(pid: u32, k: u32) -> Result<Ipv4Addr, String> {
    let used = format!(
        "{}\n{}",
        ip(&["-4", "-o", "addr", "show"])?,
        ip(&["-4", "route", "show", "table", "all"])?
    );
    // Every IPv4 address or prefix the host mentions, without its length.
    let taken: std::collections::HashSet<Ipv4Addr> = used
        .split_whitespace()
        .filter_map(|word| word.split('/').next()?.parse().ok())
        .collect();
    let start = (pid.wrapping_mul(8).wrapping_add(k)) % BLOCKS;
    (0..BLOCKS)
        .map(|i| Ipv4Addr::from(RANGE + ((start + i) % BLOCKS) * 8))
        .find(|base| {
            let base = u32::from(*base);
            (0..8).all(|offset| !taken.contains(&Ipv4Addr::from(base + offset)))
        })
        .ok_or_else(|| "no free /29 left in 198.18.0.0/15".to_owned())
}

/// Whether process `pid` runs (it has a `/proc` entry).
fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether leftovers named after `pid` are to be removed: that process is gone, or it is this
/// one (an earlier run with the same pid; called before this process creates any).
fn stale(pid: u32) -> bool {
    pid == std::process::id() || !alive(pid)
}

/// Removes namespaces, veths and blackhole routes of earlier runs that could not clean up.
fn sweep_leftovers() {
    if let Ok(list) = ip(&["netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            let owner = name
                .strip_prefix("warden-")
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(pid, _)| pid.parse::<u32>().ok());
            if owner.is_some_and(stale) {
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
    if let Ok(links) = ip(&["-o", "link", "show"]) {
        for line in links.lines() {
            // "7: wn123x0@if6: <…" — the name, without the peer after '@'.
            let Some(dev) = line.split(": ").nth(1).and_then(|d| d.split('@').next()) else {
                continue;
            };
            let owner = dev
                .strip_prefix("wn")
                .or_else(|| dev.strip_prefix("wa"))
                .and_then(|rest| rest.split_once('x'))
                .filter(|(_, k)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|(pid, _)| pid.parse::<u32>().ok());
            if owner.is_some_and(stale) {
                let _ = ip(&["link", "del", dev]);
            }
        }
    }
    if let Ok(routes) = ip(&["-4", "route", "show", "type", "blackhole"]) {
        for line in routes.lines() {
            // "blackhole 198.18.0.8/29 metric 123456"
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(prefix) = words.get(1) else { continue };
            let in_range = prefix
                .split('/')
                .next()
                .and_then(|a| a.parse::<Ipv4Addr>().ok())
                .is_some_and(|a| u32::from(a) >> 17 == RANGE >> 17);
            let metric = words
                .iter()
                .position(|w| *w == "metric")
                .and_then(|i| words.get(i + 1))
                .and_then(|m| m.parse::<u32>().ok())
                .filter(|m| *m >= METRIC_BASE);
            let (Some(metric), true) = (metric, in_range) else {
                continue;
            };
            if stale((metric - METRIC_BASE) >> 9) {
                let _ = ip(&[
                    "route",
                    "del",
                    "blackhole",
                    prefix,
                    "metric",
                    &metric.to_string(),
                ]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Netns;
    use std::{
        io::{Read, Write},
        net::TcpListener,
        process::Stdio,
        time::{Duration, Instant},
    };

    /// What a cut does to an established TCP connection, from both ends: writes in the namespace
    /// still succeed, the host reads nothing and sees no end (no FIN, no RST), a new connection
    /// from the namespace times out (not refused); healed, the bytes written during the cut
    /// arrive on the same connection, both ways. Uses bash's `/dev/tcp` inside the namespace.
    #[test]
    fn a_cut_link_is_a_black_hole_and_the_connection_survives_the_heal() {
        let Some(ns) = Netns::create_or_skip() else {
            return;
        };
        let listener = TcpListener::bind((ns.nats_host, 0)).expect("bind on the host side");
        let port = listener.local_addr().expect("address").port();
        let host = ns.nats_host;
        let script = format!(
            "exec 3<>/dev/tcp/{host}/{port} || exit 9; echo before >&3; sleep 1; \
             echo during >&3 && echo wrote-during; read -r reply <&3; echo \"got $reply\""
        );
        let child = ns
            .command("bash")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run bash in the namespace");
        let (mut conn, _) = listener
            .accept()
            .expect("accept the namespace's connection");
        let mut line = [0u8; 7];
        conn.read_exact(&mut line).expect("read `before`");
        assert_eq!(&line, b"before\n");
        ns.partition();
        let cut = Instant::now();
        // The namespace writes `during` 1 s from now; nothing arrives, nothing ends.
        conn.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("read timeout");
        let mut buf = [0u8; 64];
        match conn.read(&mut buf) {
            Ok(0) => panic!("the host saw an end of stream (FIN) through a cut link"),
            Ok(n) => panic!("bytes crossed a cut link: {:?}", &buf[..n]),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "the host's read failed ({e}): not a silent black hole"
            ),
        }
        // The host writes into the cut too (queued: no error).
        conn.write_all(b"after\n")
            .expect("the host's write is queued");
        // A new connection from the namespace: its SYNs are lost (timeout 124), not refused.
        let connect = ns
            .command("timeout")
            .args([
                "2",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{host}/{port}"),
            ])
            .status()
            .expect("run timeout in the namespace");
        assert_eq!(connect.code(), Some(124), "a connect through the cut ended");
        let held = cut.elapsed();
        ns.heal();
        let healed = Instant::now();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        let mut line = [0u8; 7];
        conn.read_exact(&mut line)
            .expect("the bytes written during the cut arrive");
        assert_eq!(&line, b"during\n");
        let arrived = healed.elapsed();
        let out = child.wait_with_output().expect("bash ends");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout} {:?}", out.stderr);
        assert_eq!(stdout, "wrote-during\ngot after\n");
        eprintln!(
            "link cut {:.1} s: no FIN, no RST, writes queued on both sides, a new connect timed \
             out; healed, the queued bytes arrived after {} ms on the same connection",
            held.as_secs_f64(),
            arrived.as_millis()
        );
    }
}
