//! Real `nats-server` processes for the cluster tests, and a TCP proxy that can black-hole a
//! connection (a partition at the socket level: bytes stop flowing, nothing is closed).
//!
//! [`NatsServer::start`] gives `None` when `nats-server` is not installed (the test then prints
//! `SKIPPED: nats-server not installed` and passes, or fails under `CI=true`); `.ci/run` installs it with apt-get.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Shutdown, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// Where `nats-server` is: on `PATH`, or Debian's `/usr/sbin` (not on every user's `PATH`).
pub fn nats_server_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("nats-server"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    })
}

/// One `nats-server -js` child on a loopback port (or the address given to
/// [`NatsServer::start_on`]), its store in a directory of its own.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    binary: PathBuf,
    /// The address it listens on (`-a`).
    pub host: IpAddr,
    /// The client port.
    pub port: u16,
    store: PathBuf,
    /// More arguments: `-n`, `--cluster_name`, `--cluster`, `--routes` for a member of a NATS
    /// cluster; `--user`, `--pass` for a server that wants them.
    args: Vec<String>,
}

impl NatsServer {
    /// Starts one with JetStream on a free port, storing under `dir`. `None` (and a line saying
    /// so on standard error) when `nats-server` is not installed.
    ///
    /// # Panics
    /// If it is installed but does not start listening within 10 s.
    pub fn start(dir: &Path) -> Option<NatsServer> {
        NatsServer::start_on(dir, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// [`NatsServer::start`] with more arguments for `nats-server` (`--user U --pass P`).
    ///
    /// # Panics
    /// If it is installed but does not start listening within 10 s.
    pub fn start_with_args(dir: &Path, args: &[&str]) -> Option<NatsServer> {
        NatsServer::launch(dir, IpAddr::V4(Ipv4Addr::LOCALHOST), args)
    }

    /// [`NatsServer::start`] listening on `host` only (a network namespace's host-side address,
    /// which processes on the host reach too: it is one of the host's own addresses).
    ///
    /// # Panics
    /// If it is installed but does not start listening within 10 s.
    pub fn start_on(dir: &Path, host: IpAddr) -> Option<NatsServer> {
        NatsServer::launch(dir, host, &[])
    }

    fn launch(dir: &Path, host: IpAddr, args: &[&str]) -> Option<NatsServer> {
        let Some(binary) = nats_server_binary() else {
            crate::skip("nats-server not installed (apt-get install nats-server)");
            return None;
        };
        let mut server = NatsServer {
            child: None,
            binary,
            host,
            port: crate::free_port(),
            store: dir.join("jetstream"),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        server.restart();
        Some(server)
    }

    /// A NATS cluster of `n` servers with JetStream (each storing under `dir/sI`, routes between
    /// them on loopback ports), started and accepting connections; JetStream's meta leader may
    /// still be electing (clients retry). `None` when `nats-server` is not installed.
    ///
    /// # Panics
    /// If a server does not listen within 10 s.
    pub fn cluster(dir: &Path, n: usize) -> Option<Vec<NatsServer>> {
        let binary = nats_server_binary();
        let Some(binary) = binary else {
            crate::skip("nats-server not installed (apt-get install nats-server)");
            return None;
        };
        let routes: Vec<u16> = (0..n).map(|_| crate::free_port()).collect();
        let servers = (0..n)
            .map(|i| {
                let others: Vec<String> = (0..n)
                    .filter(|&j| j != i)
                    .map(|j| format!("nats://127.0.0.1:{}", routes[j]))
                    .collect();
                let mut server = NatsServer {
                    child: None,
                    binary: binary.clone(),
                    host: IpAddr::V4(Ipv4Addr::LOCALHOST),
                    port: crate::free_port(),
                    store: dir.join(format!("s{i}")),
                    args: vec![
                        "-n".into(),
                        format!("s{i}"),
                        "--cluster_name".into(),
                        "warden-test".into(),
                        "--cluster".into(),
                        format!("nats://127.0.0.1:{}", routes[i]),
                        "--routes".into(),
                        others.join(","),
                    ],
                };
                server.restart();
                server
            })
            .collect();
        Some(servers)
    }

    /// `nats://HOST:PORT` (`nats://127.0.0.1:PORT` unless started with [`NatsServer::start_on`]).
    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.host, self.port)
    }

    /// Kills it (SIGKILL); its store stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store (after [`NatsServer::kill`]), and waits until
    /// it accepts connections.
    ///
    /// # Panics
    /// If it does not listen within 10 s.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new(&self.binary)
            .args([
                "-js",
                "-a",
                &self.host.to_string(),
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((self.host, self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP proxy on a loopback port to `upstream`. [`Proxy::black_hole`] stops forwarding in both
/// directions without closing anything (the bytes wait in the kernel's buffers: a real partition
/// as the endpoints see it — no FIN, no RST, just silence); [`Proxy::heal`] forwards again.
#[derive(Debug)]
pub struct Proxy {
    /// The port to connect to instead of the upstream's.
    pub port: u16,
    holed: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts forwarding 127.0.0.1:`port` → 127.0.0.1:`upstream` (threads that live as long as
    /// the test process).
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let holed = Arc::new(AtomicBool::new(false));
        let flag = holed.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to) = (from.try_clone(), to.try_clone());
                    let (Ok(from), Ok(to)) = (from, to) else {
                        continue;
                    };
                    let flag = flag.clone();
                    std::thread::spawn(move || pump(from, to, &flag));
                }
            }
        });
        Proxy { port, holed }
    }

    /// `nats://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops forwarding (nothing is closed).
    pub fn black_hole(&self) {
        self.holed.store(true, Ordering::SeqCst);
    }

    /// Forwards again.
    pub fn heal(&self) {
        self.holed.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` → `to` while not black-holed (then it reads nothing: the data waits); ends both
/// on EOF or an error.
fn pump(mut from: TcpStream, mut to: TcpStream, holed: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0u8; 16 * 1024];
    loop {
        if holed.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Read just before the black hole opened: held back (not lost) until healed.
                while holed.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
