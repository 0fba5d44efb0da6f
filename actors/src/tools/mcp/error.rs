//! [`McpError`]: why an MCP server could not be started, listed or used.

use rmcp::transport::streamable_http_client::StreamableHttpError;

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

/// An SDK error in words: its message without the transport's Rust type name (the SDK writes
/// `Transport [rmcp::transport::worker::WorkerTransport<…>] error: …`), then its innermost cause
/// when the message does not already say it (`Connection refused (os error 111)`: reqwest's own
/// message stops at `error sending request for url (…)`).
pub(crate) fn in_words(error: &(dyn std::error::Error + 'static)) -> String {
    // The SDK keeps the transport's own error outside the `source` chain here: say it ourselves.
    if let Some(rmcp::service::ClientInitializeError::TransportError { error, context }) =
        error.downcast_ref()
    {
        let doing = context.trim_start_matches("when ");
        return format!("could not {doing}: {}", chain(error.error.as_ref()));
    }
    if let Some(rmcp::ServiceError::TransportSend(error)) = error.downcast_ref() {
        return format!(
            "could not send the request: {}",
            chain(error.error.as_ref())
        );
    }
    chain(error)
}

/// `error`'s message without type names, then its innermost cause if not already said.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = without_type_names(&error.to_string());
    // The HTTP client's error is not the `source` of the SDK's either.
    let mut cause = error.source().or_else(|| {
        match error.downcast_ref::<StreamableHttpError<reqwest13::Error>>() {
            Some(StreamableHttpError::Client(e)) => Some(e as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    });
    let mut innermost = None;
    while let Some(e) = cause {
        innermost = Some(e);
        cause = e.source();
    }
    if let Some(innermost) = innermost {
        let said = innermost.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
    }
    text
}

/// `text` with each `Transport [TYPE] error: ` (TYPE a Rust type, brackets nested) taken out.
fn without_type_names(text: &str) -> String {
    const OPEN: &str = "Transport [";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        let mut depth = 1usize;
        let end = after.char_indices().find_map(|(i, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(i)
        });
        let Some(end) = end else {
            out.push_str(&rest[at..]);
            return out;
        };
        let tail = &after[end + 1..];
        rest = tail.strip_prefix(" error: ").unwrap_or(tail);
        out.push_str("transport error: ");
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_are_taken_out() {
        assert_eq!(
            without_type_names(
                "Send message error Transport [rmcp::transport::worker::WorkerTransport<a::B<c::[D]>>] \
                 error: Client error: refused, when send initialize request"
            ),
            "Send message error transport error: Client error: refused, when send initialize request"
        );
        assert_eq!(without_type_names("no names"), "no names");
        assert_eq!(
            without_type_names("Transport [unclosed"),
            "Transport [unclosed"
        );
    }
}
