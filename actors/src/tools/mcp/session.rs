//! [`SessionAware`]: the streamable-HTTP client with one more rule than the SDK's. The SDK
//! re-initializes a session the server answers 404 to (the spec's "session gone"); servers built on
//! the TypeScript SDK's examples (`server-everything` among them) answer a session they no longer
//! know — after a restart — with **400** instead, and a JSON-RPC error without an id, which the SDK
//! drops: every call then waited for its full timeout until warden restarted. Here a 400 on a
//! request that carried a session id, answered either without JSON or with an error not tied to
//! the request (no id), is taken as "session gone" too: the SDK then initializes a new session and
//! sends the request again, once.

use http::{HeaderName, HeaderValue};
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use std::{collections::HashMap, sync::Arc};

/// At most this many redirects are followed for one request (as the SDK's own client).
const MAX_REDIRECTS: usize = 10;

/// The SDK's reqwest client, taking a 400 on a known session as the session gone (module docs).
#[derive(Debug, Clone)]
pub(crate) struct SessionAware(reqwest13::Client);

impl SessionAware {
    /// The client as the SDK builds its own: no idle connection pool (a reused connection whose
    /// previous body was not read to the end stalls ~40 ms on delayed ACKs) and only same-origin
    /// 307/308 redirects (they keep the body; another origin would get the session id and headers).
    pub(crate) fn new() -> Result<Self, String> {
        let policy = reqwest13::redirect::Policy::custom(|attempt| {
            let keeps_body = matches!(
                attempt.status(),
                reqwest13::StatusCode::TEMPORARY_REDIRECT
                    | reqwest13::StatusCode::PERMANENT_REDIRECT
            );
            let same_origin = attempt
                .previous()
                .first()
                .is_some_and(|first| first.origin() == attempt.url().origin());
            if !keeps_body || !same_origin {
                attempt.stop()
            } else if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else {
                attempt.follow()
            }
        });
        reqwest13::Client::builder()
            .pool_max_idle_per_host(0)
            .redirect(policy)
            .build()
            .map(SessionAware)
            .map_err(|e| format!("the HTTP client could not be built: {e}"))
    }
}

/// A POST's outcome with a session gone reported as [`StreamableHttpError::SessionExpired`] (see
/// the module docs).
fn session_gone<E: std::error::Error + Send + Sync + 'static>(
    sent_session: bool,
    outcome: Result<StreamableHttpPostResponse, StreamableHttpError<E>>,
) -> Result<StreamableHttpPostResponse, StreamableHttpError<E>> {
    if !sent_session {
        return outcome;
    }
    match outcome {
        Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(error), _))
            if error.id.is_none() =>
        {
            tracing::info!(
                code = error.error.code.0,
                message = %error.error.message,
                "MCP server answered our session with an error for no request: taken as the \
                 session gone; starting a new one"
            );
            Err(StreamableHttpError::SessionExpired)
        }
        Err(StreamableHttpError::UnexpectedServerResponse(text))
            if text.starts_with("HTTP 400") =>
        {
            tracing::info!(
                "MCP server answered our session with HTTP 400: taken as the session gone; \
                 starting a new one"
            );
            Err(StreamableHttpError::SessionExpired)
        }
        other => other,
    }
}

impl StreamableHttpClient for SessionAware {
    type Error = reqwest13::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let sent_session = session_id.is_some();
        let outcome = self
            .0
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        session_gone(sent_session, outcome)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let sent_session = session_id.is_some();
        let outcome = self
            .0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        session_gone(sent_session, outcome)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let sent_session = session_id.is_some();
        let outcome = self
            .0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        session_gone(sent_session, outcome)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
