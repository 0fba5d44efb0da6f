//! [`Serve`]: a real `warden serve` child process for the tests of the `warden` binary — started
//! on a free loopback port, ready once `GET /healthz` answers, its standard error in a log file
//! that is kept (and named) when the test fails, stopped by its pid.
//!
//! This crate cannot name the binary (`env!("CARGO_BIN_EXE_warden")` exists only in the `warden`
//! package's tests), so the test passes its path to [`Serve::command`].

use crate::{blocking_request, free_port};
use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

/// How long a server gets to answer `GET /healthz` (a cold start on a loaded machine).
const START_PATIENCE: Duration = Duration::from_secs(30);

/// How `warden serve` is started: build it with [`Serve::command`], then [`ServeCommand::start`].
#[derive(Debug)]
pub struct ServeCommand {
    bin: PathBuf,
    config: Option<PathBuf>,
    db: Option<PathBuf>,
    port: Option<u16>,
    args: Vec<OsString>,
    env: Vec<(OsString, Option<OsString>)>,
    admin: Option<String>,
    read: Option<String>,
    log: Option<PathBuf>,
    patience: Duration,
}

impl ServeCommand {
    /// How long the server gets to answer `GET /healthz` (default 30 s).
    #[must_use]
    pub fn patience(mut self, limit: Duration) -> Self {
        self.patience = limit;
        self
    }

    /// `--config PATH`.
    #[must_use]
    pub fn config(mut self, path: impl Into<PathBuf>) -> Self {
        self.config = Some(path.into());
        self
    }

    /// `--db PATH` (default: `warden.db` beside the log, or the binary's own default).
    #[must_use]
    pub fn db(mut self, path: impl Into<PathBuf>) -> Self {
        self.db = Some(path.into());
        self
    }

    /// `--listen 127.0.0.1:PORT` on this port (default: a free one).
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// One more argument after `serve`.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// An environment variable of the child.
    #[must_use]
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), Some(value.into())));
        self
    }

    /// An environment variable removed from the child's environment.
    #[must_use]
    pub fn env_remove(mut self, name: impl Into<OsString>) -> Self {
        self.env.push((name.into(), None));
        self
    }

    /// `WARDEN_ADMIN_TOKEN` (default: none set, which the binary refuses unless the team file has
    /// one).
    #[must_use]
    pub fn admin_token(mut self, token: &str) -> Self {
        self.admin = Some(token.to_owned());
        self
    }

    /// `WARDEN_READ_TOKEN` (default: removed from the child's environment).
    #[must_use]
    pub fn read_token(mut self, token: &str) -> Self {
        self.read = Some(token.to_owned());
        self
    }

    /// Where standard error goes (default: `warden-serve-PID-PORT.log` in the temporary
    /// directory).
    #[must_use]
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// Starts the server and waits until `GET /healthz` answers 200.
    ///
    /// # Panics
    /// When it cannot be started, exits, or does not answer within its patience: the message
    /// holds its log.
    pub fn start(self) -> Serve {
        let port = self.port.unwrap_or_else(free_port);
        let log = self.log.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("warden-serve-{}-{port}.log", std::process::id()))
        });
        let file = std::fs::File::create(&log).expect("create the server's log");
        let mut command = Command::new(&self.bin);
        command.arg("serve");
        if let Some(config) = &self.config {
            command.arg("--config").arg(config);
        }
        if let Some(db) = &self.db {
            command.arg("--db").arg(db);
        }
        command
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(&self.args)
            .env_remove("WARDEN_ADMIN_TOKEN")
            .env_remove("WARDEN_READ_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        for (name, value) in &self.env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        // The tokens last: an `env_remove` of every `WARDEN_*` variable does not remove them.
        if let Some(admin) = &self.admin {
            command.env("WARDEN_ADMIN_TOKEN", admin);
        }
        if let Some(read) = &self.read {
            command.env("WARDEN_READ_TOKEN", read);
        }
        let child = command.spawn().expect("start warden serve");
        let mut serve = Serve {
            child,
            port,
            log,
            admin: self.admin.unwrap_or_default(),
            read: self.read.unwrap_or_default(),
        };
        let started = Instant::now();
        loop {
            if matches!(serve.get_as("", "/healthz"), Ok((200, _))) {
                return serve;
            }
            if let Ok(Some(status)) = serve.child.try_wait() {
                panic!(
                    "warden serve exited ({status}); its log:\n{}",
                    serve.log_text()
                );
            }
            assert!(
                started.elapsed() < self.patience,
                "warden serve did not answer /healthz on port {port} within {:?}; its log:\n{}",
                self.patience,
                serve.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A running `warden serve`. Dropped, it is killed (SIGKILL) and its log removed — or kept and
/// named on standard error when the test is failing.
#[derive(Debug)]
pub struct Serve {
    child: Child,
    port: u16,
    log: PathBuf,
    admin: String,
    read: String,
}

impl Serve {
    /// A server of the binary at `bin` (`env!("CARGO_BIN_EXE_warden")`), to be configured.
    pub fn command(bin: impl Into<PathBuf>) -> ServeCommand {
        ServeCommand {
            bin: bin.into(),
            config: None,
            db: None,
            port: None,
            args: Vec::new(),
            env: Vec::new(),
            admin: None,
            read: None,
            log: None,
            patience: START_PATIENCE,
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The admin token it was started with (empty: none).
    pub fn admin_token(&self) -> &str {
        &self.admin
    }

    /// The read token it was started with (empty: none).
    pub fn read_token(&self) -> &str {
        &self.read
    }

    /// The log file (the server's standard error).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What the server wrote to standard error so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One request with the admin token: status and body.
    ///
    /// # Errors
    /// When the connection or the exchange fails.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> std::io::Result<(u16, String)> {
        blocking_request(self.port, method, path, &self.admin, body)
    }

    /// `GET path` with `token`: status and body.
    ///
    /// # Errors
    /// When the connection or the exchange fails.
    pub fn get_as(&self, token: &str, path: &str) -> std::io::Result<(u16, String)> {
        blocking_request(self.port, "GET", path, token, None)
    }

    /// Whether the process has ended (its status then).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the process to end, at most `limit` (a hang guard): its status, `None` if it
    /// did not end.
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if started.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (`TERM`, `INT`, `KILL`…) to the process by its pid (`kill -SIGNAL PID`).
    ///
    /// # Panics
    /// When `kill` cannot be run.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// SIGTERM, then waits for the clean exit (at most `limit`): its status.
    ///
    /// # Panics
    /// When it did not exit within `limit` (the log is in the message).
    pub fn stop(&mut self, limit: Duration) -> ExitStatus {
        self.signal("TERM");
        match self.wait_for_exit(limit) {
            Some(status) => status,
            None => panic!(
                "warden serve did not exit within {limit:?} of SIGTERM; its log:\n{}",
                self.log_text()
            ),
        }
    }

    /// SIGKILL (no shutdown, no flush), and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("warden serve's log kept: {}", self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Serve;

    /// A "server" that exits at once (`sh serve …`: no such script): the start fails, and its
    /// message holds what the process wrote to standard error.
    #[test]
    fn a_server_that_exits_at_start_fails_with_its_log() {
        let log = std::env::temp_dir().join(format!("warden-kit-{}-exits.log", std::process::id()));
        let started = std::panic::catch_unwind(|| Serve::command("sh").log(&log).start());
        let message = match started {
            Ok(_) => panic!("sh is not a server"),
            Err(panic) => panic.downcast::<String>().map(|m| *m).unwrap_or_default(),
        };
        assert!(message.contains("warden serve exited"), "{message}");
        let log_text = message.split("its log:\n").nth(1).unwrap_or_default();
        assert!(log_text.contains("No such file"), "{message}");
        let _ = std::fs::remove_file(&log);
    }
}
