//! [`McpTool`]: one MCP server's tool as a warden [`Tool`], and the mapping of its results to what a
//! chat model can take.

use super::{
    client::{ProgressRoute, Shared},
    error::in_words,
};
use crate::tools::{CachePolicy, CacheScope, Tool, ToolContext, ToolError};
use futures::future::BoxFuture;
use rmcp::{
    model::{
        CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest,
        ProgressToken, RequestId, ServerResult,
    },
    service::PeerRequestOptions,
    Peer, RoleClient,
};
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use warden_protocols::{AgentKey, ToolSpec};

/// One tool of an MCP server, given to one agent. Calls go through the agent's
/// [`ToolRunner`](crate::tools::ToolRunner) like any tool's (timeout, circuit, schema, cache).
pub struct McpTool {
    pub(crate) shared: Arc<Shared>,
    pub(crate) remote: String,
    pub(crate) spec: ToolSpec,
    pub(crate) cacheable: bool,
    /// The team file's `idempotent`, else the tool's `idempotentHint`.
    pub(crate) idempotent: bool,
    pub(crate) agent: AgentKey,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("server", &self.shared.name)
            .field("tool", &self.remote)
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        let shared = self.shared.clone();
        let remote = self.remote.clone();
        let tool = self.spec.name.clone();
        let agent = self.agent.clone();
        Box::pin(async move {
            if let Some(why) = shared
                .defs
                .read()
                .get(&remote)
                .and_then(|d| d.disabled.clone())
            {
                return Err(ToolError::Failed(format!(
                    "MCP tool `{tool}` is disabled: {why}"
                )));
            }
            let peer = shared.peer().map_err(|why| {
                ToolError::Failed(format!("MCP server `{}` is down: {why}", shared.name))
            })?;
            let Value::Object(arguments) = args else {
                return Err(ToolError::InvalidArguments(
                    "the arguments must be a JSON object".into(),
                ));
            };
            let params = CallToolRequestParams::new(remote).with_arguments(arguments);
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let handle = peer
                .send_cancellable_request(request, PeerRequestOptions::no_options())
                .await
                .map_err(|e| {
                    ToolError::Failed(format!("MCP server `{}`: {}", shared.name, in_words(&e)))
                })?;
            // From here on a drop (a halt cancels the turn, a timeout) tells the server.
            let guard = InFlight {
                peer: peer.clone(),
                id: Some(handle.id.clone()),
                token: handle.progress_token.clone(),
                shared: shared.clone(),
            };
            shared.progress.lock().insert(
                handle.progress_token.clone(),
                ProgressRoute {
                    agent,
                    call_id: ctx.call_id.clone(),
                    tool: tool.clone(),
                },
            );
            let response = handle.await_response().await;
            guard.finished();
            let result = match response {
                Ok(ServerResult::CallToolResult(result)) => result,
                Ok(_) => {
                    return Err(ToolError::Failed(format!(
                        "MCP server `{}` answered tools/call with something else",
                        shared.name
                    )))
                }
                Err(e) => {
                    return Err(ToolError::Failed(format!(
                        "MCP server `{}`: {}",
                        shared.name,
                        in_words(&e)
                    )))
                }
            };
            let value = serde_json::to_value(&result)
                .map_err(|e| ToolError::Failed(format!("MCP result could not be read: {e}")))?;
            map_result(&value, shared.config.max_result_bytes)
        })
    }

    fn timeout(&self) -> Option<Duration> {
        self.shared
            .config
            .timeout_seconds
            .map(Duration::from_secs_f64)
    }

    fn retry(&self) -> Option<warden_protocols::ToolRetryConfig> {
        self.shared.config.retry
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    fn cache_policy(&self) -> CachePolicy {
        if self.cacheable {
            CachePolicy {
                cacheable: true,
                scope: CacheScope::Tick,
                ttl: None,
            }
        } else {
            CachePolicy::disabled()
        }
    }
}

/// An in-flight `tools/call`: dropped before [`InFlight::finished`], it sends
/// `notifications/cancelled` for the request (the SDK's own request handle does not).
struct InFlight {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
    token: ProgressToken,
    shared: Arc<Shared>,
}

impl InFlight {
    fn finished(mut self) {
        self.id = None;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.progress.lock().remove(&self.token);
        let Some(id) = self.id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let params = CancelledNotificationParam::new(
                Some(id),
                Some("the call was stopped (halt, pause or timeout)".to_owned()),
            );
            let _ = peer.notify_cancelled(params).await;
        });
    }
}

/// What the model gets from a `CallToolResult` (as JSON): its contents as text, or a
/// [`ToolError::Failed`] for `isError` or a result over `max_bytes`.
pub(crate) fn map_result(result: &Value, max_bytes: usize) -> Result<Value, ToolError> {
    let size = result.to_string().len();
    if size > max_bytes {
        return Err(ToolError::Failed(format!(
            "the MCP result is {size} bytes, over max_result_bytes ({max_bytes})"
        )));
    }
    let mut parts = Vec::new();
    if let Some(contents) = result.get("content").and_then(Value::as_array) {
        for content in contents {
            parts.push(content_text(content));
        }
    }
    if parts.is_empty() {
        if let Some(structured) = result.get("structuredContent") {
            parts.push(structured.to_string());
        }
    }
    let text = parts.join("\n");
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let text = if text.is_empty() {
            "the tool reported an error".into()
        } else {
            text
        };
        return Err(ToolError::Failed(text));
    }
    Ok(Value::String(text))
}

/// One content block as text: text as is; an image or audio as a placeholder naming its type and
/// size (chat-completions models take images only in user messages); a resource as its text or
/// a line naming it.
fn content_text(content: &Value) -> String {
    let str_of = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    match content.get("type").and_then(Value::as_str) {
        Some("text") => str_of(content, "text").unwrap_or_default(),
        Some(kind @ ("image" | "audio")) => {
            let mime = str_of(content, "mimeType").unwrap_or_else(|| "unknown type".into());
            let bytes = content
                .get("data")
                .and_then(Value::as_str)
                .map_or(0, |d| d.len() / 4 * 3);
            format!("[{kind}: {mime}, about {bytes} bytes, not shown]")
        }
        Some("resource") => {
            let resource = content.get("resource").cloned().unwrap_or_default();
            match str_of(&resource, "text") {
                Some(text) => text,
                None => format!(
                    "[resource: {} ({}), binary, not shown]",
                    str_of(&resource, "uri").unwrap_or_default(),
                    str_of(&resource, "mimeType").unwrap_or_else(|| "unknown type".into())
                ),
            }
        }
        Some("resource_link") => format!(
            "[link: {} {}]",
            str_of(content, "name").unwrap_or_default(),
            str_of(content, "uri").unwrap_or_default()
        ),
        other => format!("[content of type {} not shown]", other.unwrap_or("unknown")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn contents_map_to_text() {
        let result = json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "mimeType": "image/png", "data": "AAAA"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}},
            {"type": "resource", "resource": {"uri": "file:///b", "mimeType": "image/png", "blob": "AA=="}},
            {"type": "resource_link", "uri": "file:///c", "name": "c"}
        ]});
        assert_eq!(
            map_result(&result, 1 << 20),
            Ok(Value::String(
                "hello\n[image: image/png, about 3 bytes, not shown]\ninside\n[resource: \
                 file:///b (image/png), binary, not shown]\n[link: c file:///c]"
                    .into()
            ))
        );
    }

    #[test]
    fn errors_and_over_size_results_fail() {
        let error = json!({"content": [{"type": "text", "text": "no such file"}], "isError": true});
        assert_eq!(
            map_result(&error, 1 << 20),
            Err(ToolError::Failed("no such file".into()))
        );
        let big = json!({"content": [{"type": "text", "text": "x".repeat(2000)}]});
        assert!(
            matches!(map_result(&big, 1000), Err(ToolError::Failed(m)) if m.contains("over max_result_bytes"))
        );
    }
}
