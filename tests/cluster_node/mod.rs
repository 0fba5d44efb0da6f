//! The cluster tests' nodes (`tests/cluster.rs`, `tests/cluster_netns.rs`): `warden serve
//! --cluster URL --node NAME` children, on the host or inside a network namespace, and the
//! helpers both files use. Waits poll with deadlines.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use serde_json::Value;
use std::{
    ffi::OsString,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};
use warden_testkit::{free_port, netns::Netns, wait_for};

/// Every node's admin token.
pub const TOKEN: &str = "cluster-test-token";

/// The `[cluster]` section of the test teams: a 2 s fail safe, 3 s leases, 1.5 s halt acks.
pub const CLUSTER: &str =
    "[cluster]\nfail_safe_seconds = 2\nlease_ttl_seconds = 3\nhalt_ack_timeout_ms = 1500\n";

/// A team of `agents` on a scripted model answering after `latency_ms`.
pub fn team(agents: &[&str], latency_ms: u64) -> String {
    let mut text = format!(
        "[providers.m]\nkind = \"scripted\"\nreplies = [\"done\"]\ncycle = true\nlatency_ms = \
         {latency_ms}\n\n{CLUSTER}"
    );
    for agent in agents {
        text.push_str(&format!(
            "\n[[agents]]\nkey = \"{agent}\"\nprovider = \"m\"\n"
        ));
    }
    text
}

/// One `warden serve --cluster URL --node NAME` child in `DIR/NAME` (team file, journal,
/// `stderr.log`), on the host or inside a namespace (then it listens on the namespace's admin
/// address). A restart ([`Node::spawn`]) keeps its address, environment and namespace.
pub struct Node {
    child: Option<Child>,
    pub name: String,
    pub addr: SocketAddr,
    pub port: u16,
    pub dir: PathBuf,
    url: String,
    env: Vec<(String, String)>,
    /// `ip netns exec NAME` for a node in a namespace.
    launcher: Option<(OsString, Vec<OsString>)>,
}

impl Node {
    /// A node on the host running `agents` ([`team`], no model latency).
    pub fn start(dir: &Path, name: &str, url: &str, agents: &[&str]) -> Node {
        Node::start_with(dir, name, url, &team(agents, 0))
    }

    /// A node on the host running `team`.
    pub fn start_with(dir: &Path, name: &str, url: &str, team: &str) -> Node {
        Node::start_env(dir, name, url, team, &[])
    }

    /// [`Node::start_with`] with extra environment variables (a test hook), kept for restarts.
    pub fn start_env(dir: &Path, name: &str, url: &str, team: &str, env: &[(&str, &str)]) -> Node {
        let mut node = Node::new(dir, name, url, team, None);
        node.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        node.spawn();
        node
    }

    /// A node running `team`, inside `netns` when given.
    pub fn start_in(dir: &Path, name: &str, url: &str, team: &str, netns: Option<&Netns>) -> Node {
        let mut node = Node::new(dir, name, url, team, netns);
        node.spawn();
        node
    }

    fn new(dir: &Path, name: &str, url: &str, team: &str, netns: Option<&Netns>) -> Node {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).expect("the node's directory");
        std::fs::write(dir.join("team.toml"), team).expect("the node's team file");
        let ip = netns.map_or(Ipv4Addr::LOCALHOST, |ns| ns.admin_peer);
        let port = free_port();
        let launcher = netns.map(|ns| {
            let command = ns.command(env!("CARGO_BIN_EXE_warden"));
            (
                command.get_program().to_owned(),
                command.get_args().map(ToOwned::to_owned).collect(),
            )
        });
        Node {
            child: None,
            name: name.into(),
            addr: SocketAddr::from((ip, port)),
            port,
            dir,
            url: url.into(),
            env: Vec::new(),
            launcher,
        }
    }

    /// Starts the process (again) and waits until it serves `GET /healthz`.
    pub fn spawn(&mut self) {
        let mut command = match &self.launcher {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args);
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_warden")),
        };
        let stderr = std::fs::File::create(self.dir.join("stderr.log")).expect("stderr.log");
        command
            .args(["serve", "--config"])
            .arg(self.dir.join("team.toml"))
            .arg("--db")
            .arg(self.dir.join("journal.db"))
            .args(["--listen", &self.addr.to_string()])
            .args(["--cluster", &self.url, "--node", &self.name])
            .env("WARDEN_ADMIN_TOKEN", TOKEN)
            .env_remove("WARDEN_READ_TOKEN")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        self.child = Some(command.spawn().expect("start warden serve"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.request("GET", "/healthz", None).0 != 200 {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("node {} exited with {status}: {}", self.name, self.stderr());
            }
            assert!(Instant::now() < deadline, "node {} never served", self.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the node wrote to standard error.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// SIGKILL (`ip netns exec` execs warden: the child is warden itself).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (at most 20 s) for the process to end: its exit status.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Sends `signal` (`STOP`, `CONT`) to the node's process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(sent.success());
    }

    /// One request on a fresh connection: (status, body); (0, "") when nothing answers.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        warden_testkit::blocking_request_to(self.addr, method, path, TOKEN, body)
            .unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Value {
        let (status, body) = self.request("GET", path, None);
        assert_eq!(status, 200, "GET {path} on {}: {body}", self.name);
        serde_json::from_str(&body).unwrap_or(Value::String(body))
    }

    pub fn post(&self, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, body) = self.request("POST", path, body);
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }

    /// Each agent of the fleet listing: (key, node, state).
    pub fn fleet(&self) -> Vec<(String, String, String)> {
        let listed = self.get("/api/agents");
        let mut fleet: Vec<_> = listed
            .as_array()
            .expect("the fleet is a list")
            .iter()
            .map(|a| {
                let s = |k: &str| a[k].as_str().unwrap_or_default().to_owned();
                (s("key"), s("node"), s("state"))
            })
            .collect();
        fleet.sort();
        fleet
    }

    /// `agent`'s state as this node reports it ("" when the answer has none).
    pub fn state_of(&self, agent: &str) -> String {
        self.get(&format!("/api/agents/{agent}"))["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The journal as `warden journal tail` prints it.
    pub fn journal(&self) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_warden"))
            .args(["journal", "tail", "-n", "1000", "--db"])
            .arg(self.dir.join("journal.db"))
            .output()
            .expect("warden journal tail");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port` on a fresh connection: (status, body); (0, "") when
/// nothing answers.
pub fn request(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    warden_testkit::blocking_request(port, method, path, TOKEN, body).unwrap_or_default()
}

/// Waits until `node` knows exactly `others` as its peers (the nodes a halt waits for).
pub fn peers(node: &Node, others: &[&str]) {
    let mut last = Value::Null;
    let known = wait_for(Duration::from_secs(10), || {
        last = node.get("/api/cluster");
        last["peers"] == serde_json::json!(others)
    });
    assert!(
        known,
        "{} never knew {others:?} as its peers: {last}",
        node.name
    );
}
