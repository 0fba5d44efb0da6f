//! An OpenAI-compatible Chat Completions provider (OpenAI, vLLM, llama.cpp, Ollama, ...), over
//! reqwest with rustls.
//!
//! Guarantees:
//! - **Tool formats.** [`ToolFormat::Native`] sends `tools` and reads `tool_calls`;
//!   [`ToolFormat::JsonFallback`] describes the tools in a system message and reads a
//!   `{"tool": name, "parameters": {...}}` object from the model's text. Either way the
//!   [`LlmResponse`] and the conversation warden keeps are in native Chat Completions form; the
//!   fallback form exists only on the wire. Warden-only fields (`ChatMessage::internal`) are never
//!   sent.
//! - **Retries** follow [`RetryPolicy`] (see its module docs) and happen inside the returned future
//!   or stream: dropping it stops them. Every failed attempt is reported to the
//!   [`AttemptObserver`], if any.
//! - **Streaming teardown.** A stream from [`OpenAiCompatible::stream`] yields exactly one
//!   [`StreamEvent::Finished`], as its last item, for every call: normal end (`data: [DONE]`),
//!   error before or during the body, idle timeout, malformed chunk, or a body that ends without
//!   `[DONE]` (then a warning is logged and the outcome is built from what was received, with the
//!   finish reason inferred; an event the body ended inside of is discarded, as the SSE spec says).
//!   Events are decoded per the WHATWG SSE rules (see the `sse` module): `data` spread over
//!   several lines is joined with `\n` before it is parsed as JSON. The only exception is a consumer that drops the stream first: then the
//!   HTTP response is dropped at once, which closes its connection, and nothing more is read.
//!   Streams are retried only until the response headers arrive; an error after that finishes the
//!   stream (deltas already handed out cannot be taken back).
//! - **Finish reasons** are passed through (`"length"` is
//!   [`FinishReason::Length`](warden_protocols::FinishReason::Length); max-tokens
//!   recovery is the agent's job). Missing `usage` is estimated at 4 characters per token and marked
//!   `estimated`.
//! - **No panics on server data**: anything unusable is [`ProviderError::Malformed`].
//! - **Timeouts.** Without streaming, [`OpenAiConfig::request_timeout`] bounds each attempt (send
//!   and the whole body). With streaming it bounds the wait for the response headers, and then
//!   each wait for the next piece of the body (an idle timeout), so long generations are not cut.
//! - **Shared limits.** With [`OpenAiCompatible::with_limiter`] a call holds the shared
//!   [`ProviderLimiter`]'s permit from before its first attempt until it ends (a stream: until its
//!   `Finished` event, or until it is dropped); each attempt waits for the limiter's pause and
//!   rates first (outside the attempt's timeout), and every response's `Retry-After` (429, 503)
//!   or exhausted `x-ratelimit-remaining-*` pauses every holder of the limiter.
//! - The API key is sent as a bearer token and is never logged, serialized or shown by `Debug`.

mod body;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod retry;
mod sse;
mod wire;

pub use body::DEFAULT_MAX_RESPONSE_BYTES;
pub use retry::{
    retry_class, retry_counts, AttemptObserver, FailedAttempt, RetryPolicy, RETRY_CLASSES,
};

use crate::provider::{
    limits::parse_reset, CallPermit, LlmRequest, LlmResponse, Provider, ProviderError,
    ProviderLimiter,
};
use body::{read_capped, read_error_text, too_large, ReadError};
use futures::{future::BoxFuture, stream::BoxStream, FutureExt, StreamExt};
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use retry::{parse_retry_after, run_with_retries, AttemptError};
use serde::{Deserialize, Serialize};
use std::{
    collections::VecDeque,
    fmt,
    sync::Arc,
    time::{Duration, SystemTime},
};
use wire::Draft;

/// How tools are offered to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// The Chat Completions `tools` / `tool_calls` fields.
    #[default]
    Native,
    /// Tools described in a system message; calls read from JSON in the model's text.
    JsonFallback,
}

/// Configuration of an [`OpenAiCompatible`] provider. Durations are seconds (fractions allowed) in
/// config files. `api_key` may be read from a file but is never serialized back.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API root, e.g. `http://127.0.0.1:8080/v1`; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// The model name sent with every request (and used for the price table). Default `default`.
    pub model: String,
    /// Sent as `Authorization: Bearer ...`. Never logged, serialized or shown by `Debug`.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// Per-attempt timeout (see the module docs for streaming); also the connect timeout.
    /// Default 60 s.
    #[serde(with = "duration_secs")]
    pub request_timeout: Duration,
    /// How tools are offered to the model. Default [`ToolFormat::Native`].
    pub tool_format: ToolFormat,
    /// Use server-sent events for [`Provider::complete`]. Default `false`.
    pub stream: bool,
    /// Retries of failed attempts (see [`RetryPolicy`] for the defaults).
    pub retry: RetryPolicy,
    /// `max_tokens` sent with each request; `None` (the default) sends none: the server's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// `temperature` sent with each request; `None` (the default) sends none: the server's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The embedding model for long-term memory's relevance (`[providers.NAME] embedding_model`):
    /// `{base_url}/embeddings` is asked with it ([`Provider::embed`]). `None` (the default): no
    /// embeddings, recall ranks by BM25.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding_model: Option<String>,
    /// The ceiling of an answer's body (a completion, a stream's whole body, embeddings): past it
    /// the call fails as malformed and nothing more is read. Default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`] (16 MiB).
    pub max_response_bytes: usize,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            base_url: "http://127.0.0.1:8080/v1".into(),
            model: "default".into(),
            api_key: None,
            request_timeout: Duration::from_secs(60),
            tool_format: ToolFormat::Native,
            stream: false,
            retry: RetryPolicy::default(),
            max_tokens: None,
            temperature: None,
            embedding_model: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("request_timeout", &self.request_timeout)
            .field("tool_format", &self.tool_format)
            .field("stream", &self.stream)
            .field("retry", &self.retry)
            .field("max_tokens", &self.max_tokens)
            .field("temperature", &self.temperature)
            .field("embedding_model", &self.embedding_model)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl OpenAiConfig {
    /// The defaults with `base_url` and `model`.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            ..OpenAiConfig::default()
        }
    }

    /// Sets the API key from environment variable `var` (trimmed).
    ///
    /// # Errors
    /// [`OpenAiSetupError::MissingApiKey`] when `var` is unset, not Unicode, or blank.
    pub fn with_api_key_from_env(mut self, var: &str) -> Result<Self, OpenAiSetupError> {
        match std::env::var(var) {
            Ok(key) if !key.trim().is_empty() => {
                self.api_key = Some(key.trim().to_owned());
                Ok(self)
            }
            _ => Err(OpenAiSetupError::MissingApiKey {
                var: var.to_owned(),
            }),
        }
    }

    fn endpoint(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

/// Why an [`OpenAiCompatible`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenAiSetupError {
    /// The environment variable meant to hold the API key is unset or blank.
    #[error("environment variable {var} holds no api key")]
    MissingApiKey {
        /// The variable's name.
        var: String,
    },
    /// reqwest could not build its HTTP client (TLS backend initialisation).
    #[error("cannot build http client: {message}")]
    Client {
        /// reqwest's error text.
        message: String,
    },
}

/// One item of [`OpenAiCompatible::stream`].
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A piece of the model's text (in fallback mode, tool-call JSON arrives as text too).
    Delta(String),
    /// A piece of native tool call `index`: `id` and `name` usually come first, `arguments` are
    /// pieces of JSON text to concatenate.
    ToolCallDelta {
        /// Which tool call of the message this piece belongs to (0-based).
        index: u32,
        /// The call's id, in the piece that carries it (usually the first); `None` otherwise.
        id: Option<String>,
        /// The tool's name, in the piece that carries it (usually the first); `None` otherwise.
        name: Option<String>,
        /// A piece of the arguments' JSON text (may be empty).
        arguments: String,
    },
    /// The end of the stream, always its last item, exactly once.
    Finished {
        /// The whole response, as [`Provider::complete`] would return it, or the call's error.
        outcome: Result<LlmResponse, ProviderError>,
        /// HTTP attempts made (retries included).
        attempts: u32,
    },
}

struct Inner {
    config: OpenAiConfig,
    name: String,
    endpoint: String,
    client: reqwest::Client,
    observer: Option<AttemptObserver>,
    limiter: Option<Arc<ProviderLimiter>>,
}

/// A [`Provider`] for any OpenAI-compatible `/chat/completions` endpoint. Cheap to clone.
#[derive(Clone)]
pub struct OpenAiCompatible {
    inner: Arc<Inner>,
}

impl fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("config", &self.inner.config)
            .field("observer", &self.inner.observer)
            .field("limiter", &self.inner.limiter)
            .finish()
    }
}

impl OpenAiCompatible {
    /// A provider for `config`. Connects nothing yet: the first call opens the connection.
    ///
    /// # Errors
    /// [`OpenAiSetupError::Client`] when the HTTP client cannot be built.
    ///
    /// # Examples
    /// ```
    /// use warden_actors::{OpenAiCompatible, OpenAiConfig, Provider, ToolFormat};
    ///
    /// let mut config = OpenAiConfig::new("http://127.0.0.1:8080/v1", "llama-3-8b");
    /// config.tool_format = ToolFormat::JsonFallback;
    /// let provider = OpenAiCompatible::new(config).unwrap();
    /// assert_eq!(provider.name(), "openai-compatible:llama-3-8b");
    /// ```
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiSetupError> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.request_timeout)
            .build()
            .map_err(|e| OpenAiSetupError::Client {
                message: e.to_string(),
            })?;
        Ok(OpenAiCompatible {
            inner: Arc::new(Inner {
                name: format!("openai-compatible:{}", config.model),
                endpoint: config.endpoint(),
                config,
                client,
                observer: None,
                limiter: None,
            }),
        })
    }

    /// Like [`OpenAiCompatible::new`], with the API key from environment variable `var`.
    ///
    /// # Errors
    /// [`OpenAiSetupError::MissingApiKey`] (see [`OpenAiConfig::with_api_key_from_env`]),
    /// [`OpenAiSetupError::Client`].
    pub fn from_env(config: OpenAiConfig, var: &str) -> Result<Self, OpenAiSetupError> {
        Self::new(config.with_api_key_from_env(var)?)
    }

    /// Reports every failed attempt to `observer` (see [`AttemptObserver`] for how to count them).
    pub fn with_attempt_observer(self, observer: AttemptObserver) -> Self {
        self.rebuilt(|inner| inner.observer = Some(observer))
    }

    /// Puts every call under `limiter`, shared with the other providers that hold it (see
    /// [`ProviderLimiter`]): a permit for the whole call, each attempt admitted by the rates and
    /// the shared pause, and the server's `Retry-After` (on 429 and 503) and
    /// `x-ratelimit-remaining-*: 0` with `x-ratelimit-reset-*` pausing every holder, each capped
    /// by [`RetryPolicy::retry_after_cap`].
    pub fn with_limiter(self, limiter: Arc<ProviderLimiter>) -> Self {
        self.rebuilt(|inner| inner.limiter = Some(limiter))
    }

    fn rebuilt(self, change: impl FnOnce(&mut Inner)) -> Self {
        let inner = &self.inner;
        let mut inner = Inner {
            config: inner.config.clone(),
            name: inner.name.clone(),
            endpoint: inner.endpoint.clone(),
            client: inner.client.clone(),
            observer: inner.observer.clone(),
            limiter: inner.limiter.clone(),
        };
        change(&mut inner);
        OpenAiCompatible {
            inner: Arc::new(inner),
        }
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }

    /// Streams one call (always with `stream: true`, whatever [`OpenAiConfig::stream`] says).
    ///
    /// The stream ends with exactly one [`StreamEvent::Finished`]. Dropping it drops the HTTP
    /// response (closing its connection) and any pending retry.
    pub fn stream(&self, request: LlmRequest) -> BoxStream<'static, StreamEvent> {
        let state = StreamState {
            inner: self.inner.clone(),
            phase: Phase::Start(request),
            pending: VecDeque::new(),
            permit: None,
        };
        futures::stream::unfold(state, StreamState::next)
            .fuse()
            .boxed()
    }

    async fn complete_plain(
        inner: Arc<Inner>,
        request: LlmRequest,
    ) -> Result<LlmResponse, ProviderError> {
        let body = wire::request_body(&inner.config, &request, false);
        let timeout = inner.config.request_timeout;
        let mut permit = admit(&inner, &request).await;
        let (result, _attempts) =
            run_with_retries(&inner.config.retry, inner.observer.as_ref(), |number| {
                let inner = &inner;
                let body = &body;
                let permit = permit.as_ref();
                async move {
                    retry_admitted(permit, number).await;
                    let cap = inner.config.max_response_bytes;
                    let bytes = tokio::time::timeout(timeout, async {
                        let response = send(inner, body, false).await?;
                        read_capped(response, cap).await.map_err(|e| match e {
                            ReadError::Transport(e) => {
                                AttemptError::from(from_reqwest(&e, timeout))
                            }
                            ReadError::TooLarge => AttemptError::from(too_large(cap)),
                        })
                    })
                    .await
                    .map_err(|_| timeout_error(timeout))??;
                    Ok(wire::parse_completion(&bytes)?)
                }
            })
            .await;
        let outcome = result
            .and_then(|draft| draft.finish(inner.config.tool_format, wire::prompt_chars(&request)));
        settle(permit.as_mut(), &outcome);
        outcome
    }
}

impl Provider for OpenAiCompatible {
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// `POST {base_url}/embeddings` with the embedding model and the texts (one attempt, bounded
    /// by the request timeout, under the provider's shared limits; a failure leaves recall on BM25
    /// for that call).
    fn embed(
        &self,
        texts: Vec<String>,
    ) -> Option<BoxFuture<'static, Result<super::Embedded, ProviderError>>> {
        let model = self.inner.config.embedding_model.clone()?;
        let inner = self.inner.clone();
        Some(Box::pin(async move {
            let url = format!("{}/embeddings", inner.config.base_url.trim_end_matches('/'));
            let timeout = inner.config.request_timeout;
            let count = texts.len();
            // Under the provider's shared limits, as a model call is.
            let tokens = texts.iter().map(|t| t.len() as u64 / 4 + 1).sum();
            let mut permit = match &inner.limiter {
                Some(limiter) => Some(limiter.start(tokens).await),
                None => None,
            };
            let mut builder = inner
                .client
                .post(&url)
                .timeout(timeout)
                .json(&serde_json::json!({"model": model, "input": texts}));
            if let Some(key) = &inner.config.api_key {
                builder = builder.bearer_auth(key);
            }
            let response = builder
                .send()
                .await
                .map_err(|e| from_reqwest(&e, timeout))?;
            let status = response.status();
            if !status.is_success() {
                let body = read_error_text(response).await;
                return Err(ProviderError::Http {
                    status: status.as_u16(),
                    body: wire::truncate_body(&body),
                });
            }
            let cap = inner.config.max_response_bytes;
            let body = read_capped(response, cap).await.map_err(|e| match e {
                ReadError::Transport(e) => from_reqwest(&e, timeout),
                ReadError::TooLarge => too_large(cap),
            })?;
            let body = std::str::from_utf8(&body).map_err(|_| ProviderError::Malformed {
                message: "the embeddings answer is not UTF-8".into(),
            })?;
            let embedded = parse_embeddings(body, count)?;
            if let Some(permit) = permit.as_mut() {
                permit.settle(Some(&embedded.usage));
            }
            Ok(embedded)
        }))
    }

    fn model(&self) -> &str {
        &self.inner.config.model
    }

    /// Each attempt is bounded by [`OpenAiConfig::request_timeout`] (a team file sets it from
    /// `safety.timeout.llm_call_seconds`), with retries in between and an idle timeout while
    /// streaming, so the turn does not cut the whole call at one attempt's limit.
    fn bounds_its_own_calls(&self) -> bool {
        true
    }

    fn complete(
        &self,
        request: LlmRequest,
    ) -> BoxFuture<'static, Result<LlmResponse, ProviderError>> {
        if self.inner.config.stream {
            let mut events = self.stream(request);
            async move {
                while let Some(event) = events.next().await {
                    if let StreamEvent::Finished { outcome, .. } = event {
                        return outcome;
                    }
                }
                Err(ProviderError::Other {
                    message: "stream ended without a finished marker".into(),
                })
            }
            .boxed()
        } else {
            Self::complete_plain(self.inner.clone(), request).boxed()
        }
    }
}

/// Waits for the limiter's permit for a call of `request`, if the provider has a limiter.
async fn admit(inner: &Inner, request: &LlmRequest) -> Option<CallPermit> {
    let limiter = inner.limiter.as_ref()?;
    let tokens = ProviderLimiter::estimate(request, inner.config.max_tokens);
    Some(limiter.start(tokens).await)
}

/// Before attempt `number` after the first: waits until the limiter admits it.
async fn retry_admitted(permit: Option<&CallPermit>, number: u32) {
    if let (Some(permit), true) = (permit, number > 1) {
        permit.retry().await;
    }
}

/// Corrects the permit's token charge by the reply's usage.
fn settle(permit: Option<&mut CallPermit>, outcome: &Result<LlmResponse, ProviderError>) {
    if let (Some(permit), Ok(response)) = (permit, outcome) {
        permit.settle(Some(&response.usage));
    }
}

/// The pause a response asks every call of the provider for, and why: a `Retry-After` on a 429 or
/// 503, or `x-ratelimit-remaining-requests` / `-tokens` at 0 with their `x-ratelimit-reset-*`
/// (the longest of those present). Unreadable values are ignored.
fn server_pause(
    status: u16,
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<(Duration, &'static str)> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut pause: Option<(Duration, &'static str)> = None;
    let mut longer = |wait: Duration, why: &'static str| {
        if pause.is_none_or(|(longest, _)| wait > longest) {
            pause = Some((wait, why));
        }
    };
    if status == 429 || status == 503 {
        if let Some(wait) = header("retry-after").and_then(|v| parse_retry_after(v, now)) {
            longer(wait, "retry-after");
        }
    }
    for (remaining, reset, why) in [
        (
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "x-ratelimit-remaining-requests: 0",
        ),
        (
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
            "x-ratelimit-remaining-tokens: 0",
        ),
    ] {
        let exhausted = header(remaining).and_then(|v| v.trim().parse::<u64>().ok()) == Some(0);
        if let Some(wait) = header(reset).and_then(parse_reset).filter(|_| exhausted) {
            longer(wait, why);
        }
    }
    pause
}

/// Tells the provider's limiter, if any, what a response's status and headers say.
fn note_response(inner: &Inner, status: u16, headers: &HeaderMap) {
    let Some(limiter) = &inner.limiter else {
        return;
    };
    if status == 429 {
        limiter.note_throttled();
    }
    if let Some((wait, why)) = server_pause(status, headers, SystemTime::now()) {
        limiter.pause(wait.min(inner.config.retry.retry_after_cap), why);
    }
}

fn timeout_error(after: Duration) -> AttemptError {
    ProviderError::Timeout {
        after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
    }
    .into()
}

fn from_reqwest(error: &reqwest::Error, timeout: Duration) -> ProviderError {
    if error.is_timeout() {
        return timeout_error(timeout).error;
    }
    // The source chain says what actually went wrong (refused, reset, incomplete body, ...).
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    // JSON is decoded by us, not by reqwest, so anything else here is a transport problem (reqwest
    // also labels a body cut mid-way as a "decode" error).
    ProviderError::Connection { message }
}

/// Sends the request and checks the status; a non-2xx answer becomes an [`AttemptError`] carrying
/// the server's `Retry-After`.
async fn send(
    inner: &Inner,
    body: &serde_json::Value,
    stream: bool,
) -> Result<reqwest::Response, AttemptError> {
    let timeout = inner.config.request_timeout;
    let mut builder = inner.client.post(&inner.endpoint).json(body);
    if stream {
        builder = builder.header(ACCEPT, "text/event-stream");
    }
    if let Some(key) = &inner.config.api_key {
        builder = builder.bearer_auth(key);
    }
    let response = builder
        .send()
        .await
        .map_err(|e| from_reqwest(&e, timeout))?;
    let status = response.status();
    note_response(inner, status.as_u16(), response.headers());
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = retry_after(response.headers());
    // The error body is informative only: a failure to read it must not hide the status.
    let text = read_error_text(response).await;
    Err(AttemptError {
        error: ProviderError::Http {
            status: status.as_u16(),
            body: wire::truncate_body(&text),
        },
        retry_after,
    })
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()))
}

enum Phase {
    Start(LlmRequest),
    Body(Box<Body>),
    Done,
}

struct Body {
    bytes: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    events: sse::EventDecoder,
    draft: Draft,
    attempts: u32,
    prompt_chars: usize,
    /// Bytes of the body read so far, against `max_response_bytes`.
    received: usize,
}

struct StreamState {
    inner: Arc<Inner>,
    phase: Phase,
    pending: VecDeque<StreamEvent>,
    /// The limiter's permit, held from the start until the stream finishes (or is dropped).
    permit: Option<CallPermit>,
}

impl StreamState {
    async fn next(mut self) -> Option<(StreamEvent, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some((event, self));
            }
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => return None,
                Phase::Start(request) => self.start(request).await,
                Phase::Body(body) => self.read(body).await,
            }
        }
    }

    fn finish(&mut self, outcome: Result<LlmResponse, ProviderError>, attempts: u32) {
        self.phase = Phase::Done;
        settle(self.permit.as_mut(), &outcome);
        self.permit = None;
        self.pending
            .push_back(StreamEvent::Finished { outcome, attempts });
    }

    /// Sends the request (with retries) up to the response headers.
    async fn start(&mut self, request: LlmRequest) {
        let inner = self.inner.clone();
        let body = wire::request_body(&inner.config, &request, true);
        let prompt_chars = wire::prompt_chars(&request);
        let timeout = inner.config.request_timeout;
        self.permit = admit(&inner, &request).await;
        let permit = self.permit.as_ref();
        let (result, attempts) =
            run_with_retries(&inner.config.retry, inner.observer.as_ref(), |number| {
                let inner = &inner;
                let body = &body;
                async move {
                    retry_admitted(permit, number).await;
                    tokio::time::timeout(timeout, send(inner, body, true))
                        .await
                        .map_err(|_| timeout_error(timeout))?
                }
            })
            .await;
        let response = match result {
            Ok(response) => response,
            Err(error) => return self.finish(Err(error), attempts),
        };
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            // Some servers ignore `stream: true` and answer with one JSON body.
            let cap = inner.config.max_response_bytes;
            let outcome = match tokio::time::timeout(timeout, read_capped(response, cap)).await {
                Err(_) => Err(timeout_error(timeout).error),
                Ok(Err(ReadError::Transport(e))) => Err(from_reqwest(&e, timeout)),
                Ok(Err(ReadError::TooLarge)) => Err(too_large(cap)),
                Ok(Ok(bytes)) => wire::parse_completion(&bytes)
                    .and_then(|draft| draft.finish(inner.config.tool_format, prompt_chars)),
            };
            if let Ok(response) = &outcome {
                if let Some(text) = response.message.content.clone().filter(|t| !t.is_empty()) {
                    self.pending.push_back(StreamEvent::Delta(text));
                }
            }
            return self.finish(outcome, attempts);
        }
        self.phase = Phase::Body(Box::new(Body {
            bytes: response.bytes_stream().boxed(),
            events: sse::EventDecoder::default(),
            draft: Draft::default(),
            attempts,
            prompt_chars,
            received: 0,
        }));
    }

    /// Reads the next piece of the body. Whenever this finishes the stream, `body` (and with it the
    /// HTTP response) is dropped before returning.
    async fn read(&mut self, mut body: Box<Body>) {
        let timeout = self.inner.config.request_timeout;
        let format = self.inner.config.tool_format;
        let attempts = body.attempts;
        match tokio::time::timeout(timeout, body.bytes.next()).await {
            Err(_) => self.finish(Err(timeout_error(timeout).error), attempts),
            Ok(Some(Err(e))) => {
                let error = from_reqwest(&e, timeout);
                tracing::warn!(%error, "llm stream broke off");
                self.finish(Err(error), attempts)
            }
            Ok(None) => {
                if body.events.finish() {
                    tracing::warn!(
                        model = %self.inner.config.model,
                        "llm stream ended inside an event (no blank line after it); \
                         that event is discarded, as the SSE spec says"
                    );
                }
                tracing::warn!(
                    model = %self.inner.config.model,
                    "llm stream closed without [DONE]; finishing with what was received"
                );
                let Body {
                    draft,
                    prompt_chars,
                    ..
                } = *body;
                let outcome = draft.finish(format, prompt_chars);
                self.finish(outcome, attempts);
            }
            Ok(Some(Ok(bytes))) => {
                body.received = body.received.saturating_add(bytes.len());
                let cap = self.inner.config.max_response_bytes;
                if body.received > cap {
                    tracing::warn!(
                        model = %self.inner.config.model,
                        cap,
                        "llm stream longer than max_response_bytes; finishing it as malformed"
                    );
                    self.finish(Err(too_large(cap)), attempts);
                    return;
                }
                for event in body.events.push(&bytes) {
                    if self.handle_event(
                        &event.data,
                        &mut body.draft,
                        format,
                        body.prompt_chars,
                        attempts,
                    ) {
                        return;
                    }
                }
                self.phase = Phase::Body(body);
            }
        }
    }

    /// Handles one SSE event's data; returns `true` when it finished the stream.
    fn handle_event(
        &mut self,
        data: &str,
        draft: &mut Draft,
        format: ToolFormat,
        prompt_chars: usize,
        attempts: u32,
    ) -> bool {
        match sse::classify(data) {
            sse::SseData::Empty => false,
            sse::SseData::Done => {
                let outcome = std::mem::take(draft).finish(format, prompt_chars);
                self.finish(outcome, attempts);
                true
            }
            sse::SseData::Chunk(data) => match sse::apply_chunk(draft, data) {
                Ok(events) => {
                    self.pending.extend(events);
                    false
                }
                Err(error) => {
                    self.finish(Err(error), attempts);
                    true
                }
            },
        }
    }
}

/// `Duration` as seconds (`f64`) in config files.
pub(crate) mod duration_secs {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs)
            .map_err(|_| D::Error::custom(format!("invalid duration {secs} (seconds, >= 0)")))
    }
}

/// An `/embeddings` answer: `data[i].embedding` by `data[i].index`, exactly `count` of them, and
/// `usage.prompt_tokens` (estimated from nothing when absent: 0, marked estimated).
fn parse_embeddings(body: &str, count: usize) -> Result<super::Embedded, ProviderError> {
    #[derive(serde::Deserialize)]
    struct Item {
        #[serde(default)]
        index: Option<usize>,
        embedding: Vec<f32>,
    }
    #[derive(serde::Deserialize)]
    struct Usage {
        #[serde(default)]
        prompt_tokens: u64,
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        data: Vec<Item>,
        #[serde(default)]
        usage: Option<Usage>,
    }
    let malformed = |message: String| ProviderError::Malformed { message };
    let answer: Answer = serde_json::from_str(body)
        .map_err(|e| malformed(format!("not an embeddings answer: {e}")))?;
    if answer.data.len() != count {
        return Err(malformed(format!(
            "{} embeddings for {count} texts",
            answer.data.len()
        )));
    }
    let mut vectors = vec![Vec::new(); count];
    for (i, item) in answer.data.into_iter().enumerate() {
        let at = item.index.unwrap_or(i);
        match vectors.get_mut(at) {
            Some(slot) if slot.is_empty() && !item.embedding.is_empty() => *slot = item.embedding,
            _ => return Err(malformed(format!("embedding index {at} is out of place"))),
        }
    }
    let usage = answer.usage.map_or(
        warden_protocols::Usage {
            prompt_tokens: 0,
            completion_tokens: 0,
            estimated: true,
        },
        |u| warden_protocols::Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: 0,
            estimated: false,
        },
    );
    Ok(super::Embedded { vectors, usage })
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_is_read_from_the_environment() {
        // Only this test touches this variable.
        let var = "WARDEN_UNIT_TEST_OPENAI_KEY_91c2";
        std::env::set_var(var, " sk-from-env \n");
        let config = OpenAiConfig::default().with_api_key_from_env(var).unwrap();
        assert_eq!(config.api_key.as_deref(), Some("sk-from-env"));
        assert!(!format!("{config:?}").contains("sk-from-env"));
        std::env::set_var(var, "  ");
        assert_eq!(
            OpenAiConfig::default().with_api_key_from_env(var),
            Err(OpenAiSetupError::MissingApiKey { var: var.into() })
        );
        std::env::remove_var(var);
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            if let Ok(value) = reqwest::header::HeaderValue::from_str(value) {
                map.append(*name, value);
            }
        }
        map
    }

    #[test]
    fn server_pauses_from_headers() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 07:28:00
        let pause = |status, pairs: &[(&'static str, &str)]| {
            server_pause(status, &headers(pairs), now).map(|(d, why)| (d.as_millis(), why))
        };
        assert_eq!(
            pause(429, &[("retry-after", "7")]),
            Some((7000, "retry-after"))
        );
        assert_eq!(
            pause(503, &[("retry-after", "Wed, 21 Oct 2015 07:28:03 GMT")]),
            Some((3000, "retry-after"))
        );
        // Retry-After means nothing on a success or another error.
        assert_eq!(pause(200, &[("retry-after", "7")]), None);
        assert_eq!(pause(500, &[("retry-after", "7")]), None);
        // An exhausted budget pauses until its reset, on any status; the longest wins.
        assert_eq!(
            pause(
                200,
                &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "1s"),
                    ("x-ratelimit-remaining-tokens", "0"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                ]
            ),
            Some((360_000, "x-ratelimit-remaining-tokens: 0"))
        );
        assert_eq!(
            pause(
                429,
                &[
                    ("retry-after", "1"),
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "1h2m3.5s"),
                ]
            ),
            Some((3_723_500, "x-ratelimit-remaining-requests: 0"))
        );
        // Budget left: no pause, whatever the reset says.
        assert_eq!(
            pause(
                200,
                &[
                    ("x-ratelimit-remaining-requests", "12"),
                    ("x-ratelimit-reset-requests", "20ms"),
                ]
            ),
            None
        );
    }

    #[test]
    fn malformed_rate_limit_headers_are_ignored() {
        let now = SystemTime::now();
        for pairs in [
            &[("retry-after", "soon")][..],
            &[("retry-after", "-5")],
            &[("retry-after", "")],
            &[
                ("x-ratelimit-remaining-requests", "zero"),
                ("x-ratelimit-reset-requests", "1s"),
            ],
            &[
                ("x-ratelimit-remaining-requests", "-0.5"),
                ("x-ratelimit-reset-requests", "1s"),
            ],
            &[
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "1 fortnight"),
            ],
            &[
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "99999999999999999999999h"),
            ],
            &[("x-ratelimit-remaining-tokens", "0")],
            &[("x-ratelimit-reset-tokens", "1s")],
        ] {
            assert_eq!(server_pause(429, &headers(pairs), now), None, "{pairs:?}");
        }
        // A header that is not visible ASCII is not a string: ignored too.
        let mut map = HeaderMap::new();
        map.insert(
            "retry-after",
            reqwest::header::HeaderValue::from_bytes(b"\xff5").unwrap(),
        );
        assert_eq!(server_pause(429, &map, now), None);
    }

    #[test]
    fn endpoint_tolerates_a_trailing_slash() {
        let config = OpenAiConfig::new("http://h:1/v1/", "m");
        assert_eq!(config.endpoint(), "http://h:1/v1/chat/completions");
    }
}
