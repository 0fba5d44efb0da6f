//! [`McpError`]: why an MCP server could not be started, listed or used.

/// Why an MCP server could not be started, listed, or give an agent the tools it names.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum McpError {
    /// The stdio server's program does not exist (or is not executable) on `PATH`.
    #[error("MCP server `{server}`: command `{command}` not found ({detail})")]
    CommandNotFound {
        /// The server's name.
        server: String,
        /// The program as configured.
        command: String,
        /// The operating system's words.
        detail: String,
    },
    /// The program started but could not be spawned or spoken to.
    #[error("MCP server `{server}`: could not start: {detail}")]
    Spawn {
        /// The server's name.
        server: String,
        /// What failed.
        detail: String,
    },
    /// The MCP handshake (`initialize`) failed: the process exited, answered something else, or the
    /// HTTP endpoint refused. `stderr` holds the last lines the child wrote, if any.
    #[error("MCP server `{server}`: handshake failed: {detail}{}", stderr_tail(.stderr))]
    Handshake {
        /// The server's name.
        server: String,
        /// The SDK's words.
        detail: String,
        /// The child's last stderr lines.
        stderr: String,
    },
    /// Starting (spawn or connect, handshake, `tools/list`) took longer than
    /// `startup_timeout_seconds`.
    #[error("MCP server `{server}`: timed out after {seconds} s while {during}{}", stderr_tail(.stderr))]
    TimedOut {
        /// The server's name.
        server: String,
        /// The limit.
        seconds: f64,
        /// `the handshake` or `listing tools`.
        during: &'static str,
        /// The child's last stderr lines.
        stderr: String,
    },
    /// `tools/list` failed.
    #[error("MCP server `{server}`: tools/list failed: {detail}")]
    List {
        /// The server's name.
        server: String,
        /// The SDK's words.
        detail: String,
    },
    /// A configuration value the runtime cannot use (an unset environment variable, a header that
    /// is not valid HTTP, a bad URL).
    #[error("MCP server `{server}`: {detail}")]
    Config {
        /// The server's name.
        server: String,
        /// What is wrong.
        detail: String,
    },
    /// An agent's `tools` names a server that is not in `[mcp_servers]`.
    #[error("agent `{agent}`: tools entry `{entry}` names MCP server `{server}`, which is not in [mcp_servers] (have: {have})")]
    UnknownServer {
        /// The agent's key.
        agent: String,
        /// The entry as written.
        entry: String,
        /// The server part.
        server: String,
        /// The configured servers.
        have: String,
    },
    /// An agent's `tools` names a tool its server does not offer (or offers but warden refused).
    #[error("agent `{agent}`: tools entry `{entry}`: MCP server `{server}` has no usable tool `{tool}` ({detail})")]
    UnknownTool {
        /// The agent's key.
        agent: String,
        /// The entry as written.
        entry: String,
        /// The server's name.
        server: String,
        /// The tool part.
        tool: String,
        /// The tools the server offers that warden accepted, and why warden refused this one if
        /// the server does offer it.
        detail: String,
    },
}

fn stderr_tail(stderr: &str) -> String {
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with:\n{}", stderr.trim_end())
    }
}
