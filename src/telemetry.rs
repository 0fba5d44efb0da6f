//! OpenTelemetry export (feature `otel`): the GenAI spans of `warden-actors` ([`warden_actors::telemetry`])
//! sent as OTLP over HTTP/protobuf, and the W3C `traceparent` of API requests. docs/telemetry.md is
//! the user's guide.
//!
//! * Settings: [`TelemetrySection`] (a team file's `[telemetry]`) and the standard `OTEL_*`
//!   environment variables, resolved by [`TelemetryConfig::resolve`]; each variable wins over its
//!   key in the file. Nothing set: no exporter, no layer, no cost.
//! * [`Telemetry::start`] builds the exporter (our small HTTP client on the workspace's reqwest:
//!   no gRPC, no second TLS stack) behind the SDK's batch processor, which runs on its own thread.
//!   A turn only ever pushes a finished span into a bounded queue: when the queue is full the span
//!   is dropped and counted ([`stats`], shown by `/metrics`), never waited for.
//! * [`Telemetry::layer`] is the `tracing` layer to install; it sees only the GenAI spans
//!   ([`warden_actors::telemetry::TARGET`]) and this module's request spans.
//! * [`request_span`] continues a caller's trace from its `traceparent` header.

#[cfg(feature = "otel")]
use opentelemetry::{
    propagation::TextMapPropagator,
    trace::{TraceContextExt, TracerProvider as _},
};
#[cfg(feature = "otel")]
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
#[cfg(feature = "otel")]
use opentelemetry_sdk::{
    error::OTelSdkResult,
    propagation::TraceContextPropagator,
    trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanProcessor},
    Resource,
};
use serde::Deserialize;
#[cfg(feature = "otel")]
use std::collections::HashMap;
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
    time::Duration,
};
#[cfg(feature = "otel")]
use tracing_opentelemetry::OpenTelemetrySpanExt;
#[cfg(feature = "otel")]
use tracing_subscriber::{filter::Targets, Layer};

/// The OTLP/HTTP endpoint used when telemetry is enabled but no endpoint is given (the standard
/// default: a collector on this machine).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// The service name when neither `OTEL_SERVICE_NAME` nor `service_name` is set.
pub const DEFAULT_SERVICE_NAME: &str = "warden";

/// Finished spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE` changes it); past it,
/// spans are dropped and counted.
pub const DEFAULT_QUEUE: usize = 2048;

/// How long one export request may take (`OTEL_EXPORTER_OTLP_TIMEOUT`, in ms, changes it).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Telemetry::shutdown`] waits for the last spans to be sent before giving up.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The `[telemetry]` section of a team file. Each `OTEL_*` variable wins over its key here
/// (docs/telemetry.md lists them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// Export on or off. Default: on when an endpoint is set (here or in the environment).
    /// `OTEL_SDK_DISABLED=true` wins.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The collector's OTLP/HTTP base URL (`/v1/traces` is appended), like
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, which wins.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `service.name` of the exported spans; `OTEL_SERVICE_NAME` wins.
    #[serde(default)]
    pub service_name: Option<String>,
    /// Put prompts, completions, tool arguments and results in the spans (capped). Default off;
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` wins.
    #[serde(default)]
    pub capture_content: Option<bool>,
}

impl TelemetrySection {
    /// Refuses an `endpoint` that is not an http(s) URL and an empty `service_name`.
    pub fn validate(&self) -> Result<(), TelemetryError> {
        if let Some(endpoint) = &self.endpoint {
            check_url("telemetry.endpoint", endpoint)?;
        }
        if self
            .service_name
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(TelemetryError::Invalid {
                key: "telemetry.service_name",
                value: String::new(),
                problem: "must not be empty",
            });
        }
        Ok(())
    }

    /// The `[telemetry]` section of a team file's text, read on its own (before the whole file is
    /// loaded, to set up logging first). `None` when the text is no valid TOML or the section is
    /// invalid: loading the whole file reports that with its place.
    pub fn from_team_toml(text: &str) -> Option<Self> {
        let table = toml::from_str::<toml::Table>(text).ok()?;
        let section = table.get("telemetry")?.clone();
        section.try_into().ok()
    }
}

/// Why telemetry cannot start as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryError {
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` (or `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`) names a protocol
    /// other than `http/protobuf`.
    #[error("{var}={value:?} is not supported: warden exports OTLP as http/protobuf only (unset it, or set it to http/protobuf)")]
    Protocol {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A setting with a value that cannot be used.
    #[error("invalid value for `{key}`: {value:?} ({problem})")]
    Invalid {
        /// The key or variable.
        key: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

fn check_url(key: &'static str, value: &str) -> Result<(), TelemetryError> {
    match reqwest::Url::parse(value) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Ok(()),
        _ => Err(TelemetryError::Invalid {
            key,
            value: value.to_owned(),
            problem: "must be an http:// or https:// URL",
        }),
    }
}

/// Telemetry settings after the environment and the team file are combined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub traces_endpoint: String,
    /// `service.name`.
    pub service_name: String,
    /// Content capture ([`warden_actors::telemetry::set_capture_content`]).
    pub capture_content: bool,
    /// The bounded export queue's size, in spans.
    pub queue: usize,
    /// The time one export request may take.
    pub export_timeout: Duration,
}

fn truthy(value: &str) -> bool {
    value.trim().eq_ignore_ascii_case("true")
}

impl TelemetryConfig {
    /// Combines the team file's section with the environment (`env` reads a variable; empty values
    /// count as unset). `Ok(None)`: telemetry is off.
    ///
    /// Precedence, per setting: `OTEL_SDK_DISABLED=true` > `enabled`; the endpoint from
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) > `OTEL_EXPORTER_OTLP_ENDPOINT` (+
    /// `/v1/traces`) > `endpoint` (+ `/v1/traces`) > [`DEFAULT_ENDPOINT`]; `OTEL_SERVICE_NAME` >
    /// `service_name` > `warden`; `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` >
    /// `capture_content` > off. Telemetry is on when `enabled = true` or any endpoint is set.
    ///
    /// # Errors
    /// [`TelemetryError::Protocol`] for a protocol other than `http/protobuf`,
    /// [`TelemetryError::Invalid`] for an endpoint that is not an http(s) URL or a bad number.
    pub fn resolve(
        section: Option<&TelemetrySection>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TelemetryError> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let empty = TelemetrySection::default();
        let section = section.unwrap_or(&empty);
        let traces = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base = env("OTEL_EXPORTER_OTLP_ENDPOINT");
        let any_endpoint = traces.is_some() || base.is_some() || section.endpoint.is_some();
        let enabled = match env("OTEL_SDK_DISABLED") {
            Some(v) if truthy(&v) => false,
            _ => section.enabled.unwrap_or(any_endpoint),
        };
        if !enabled {
            return Ok(None);
        }
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(value) = env(var) {
                if value.trim() != "http/protobuf" {
                    return Err(TelemetryError::Protocol { var, value });
                }
                break;
            }
        }
        let with_path = |base: &str| format!("{}/v1/traces", base.trim_end_matches('/'));
        let (key, traces_endpoint) = match (traces, base, &section.endpoint) {
            (Some(url), _, _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url),
            (None, Some(url), _) => ("OTEL_EXPORTER_OTLP_ENDPOINT", with_path(&url)),
            (None, None, Some(url)) => ("telemetry.endpoint", with_path(url)),
            (None, None, None) => ("telemetry.endpoint", with_path(DEFAULT_ENDPOINT)),
        };
        check_url(key, &traces_endpoint)?;
        let service_name = env("OTEL_SERVICE_NAME")
            .or_else(|| section.service_name.clone())
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
        let capture_content = match env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT") {
            Some(v) => truthy(&v),
            None => section.capture_content.unwrap_or(false),
        };
        let number = |var: &'static str, default: u64| -> Result<u64, TelemetryError> {
            match env(var) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(TelemetryError::Invalid {
                        key: var,
                        value: v,
                        problem: "must be a whole number above 0",
                    }),
                },
            }
        };
        let queue = number("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE as u64)?;
        let timeout_ms = number(
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            DEFAULT_EXPORT_TIMEOUT.as_millis() as u64,
        )?;
        Ok(Some(TelemetryConfig {
            traces_endpoint,
            service_name,
            capture_content,
            queue: usize::try_from(queue).unwrap_or(usize::MAX),
            export_timeout: Duration::from_millis(timeout_ms),
        }))
    }
}

/// Export counters since the process started (all zero while telemetry is off).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Spans sent to the collector and accepted.
    pub exported: u64,
    /// Spans dropped because the export queue was full.
    pub dropped_queue_full: u64,
    /// Spans lost in an export that failed (collector down, refused, timed out) after the
    /// exporter's retries.
    pub dropped_export_failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    /// Spans handed to the batch processor and not yet taken by an export.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))] // only the exporter counts them
    queued: AtomicU64,
    exported: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_export_failed: AtomicU64,
}

fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<Counters> = OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}

/// The export counters (process-wide, like the `tracing` subscriber they belong to).
pub fn stats() -> ExportStats {
    let c = counters();
    ExportStats {
        exported: c.exported.load(Ordering::Relaxed),
        dropped_queue_full: c.dropped_queue_full.load(Ordering::Relaxed),
        dropped_export_failed: c.dropped_export_failed.load(Ordering::Relaxed),
    }
}

#[cfg(feature = "otel")]
/// The SDK's batch processor behind a counter of queued spans: a span that would not fit in the
/// queue is dropped here and counted (the SDK drops it too, but only logs the count at shutdown).
/// The counter goes down when the exporter is done with a batch ([`CountingExporter`]), so the
/// SDK's own queue (of the same size) never overflows.
#[derive(Debug)]
struct BoundedProcessor {
    inner: BatchSpanProcessor,
    queue: u64,
}

#[cfg(feature = "otel")]
impl SpanProcessor for BoundedProcessor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let c = counters();
        if c.queued.fetch_add(1, Ordering::AcqRel) >= self.queue {
            c.queued.fetch_sub(1, Ordering::AcqRel);
            c.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(feature = "otel")]
/// The OTLP exporter, counting what it exports and what it loses.
#[derive(Debug)]
struct CountingExporter {
    inner: opentelemetry_otlp::SpanExporter,
}

#[cfg(feature = "otel")]
impl opentelemetry_sdk::trace::SpanExporter for CountingExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.inner.export(batch).await;
        let c = counters();
        match &result {
            Ok(()) => c.exported.fetch_add(n, Ordering::Relaxed),
            Err(_) => c.dropped_export_failed.fetch_add(n, Ordering::Relaxed),
        };
        // Only now do the spans leave the queue's count: the bound covers the batch in flight too,
        // so a slow or dead collector never lets more than the queue's size pile up.
        let _ = c
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(n))
            });
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(feature = "otel")]
/// Retries of one export after its first attempt (connection errors, timeouts, 429, 502, 503,
/// 504), waiting [`RETRY_FIRST_WAIT`] doubling to [`RETRY_MAX_WAIT`]: the OTLP exporter's own
/// policy, made here so that an exit does not wait for them ([`Telemetry::shutdown`]).
const RETRIES: u32 = 3;
#[cfg(feature = "otel")]
const RETRY_FIRST_WAIT: Duration = Duration::from_millis(100);
#[cfg(feature = "otel")]
const RETRY_MAX_WAIT: Duration = Duration::from_millis(1600);

#[cfg(feature = "otel")]
/// The HTTP client of the exporter: the workspace's reqwest, blocking (the batch processor exports
/// on its own thread, outside any async runtime), bounded by the export timeout. It retries a
/// failed export itself ([`RETRIES`]) — except once `stopping` is set: at exit each export is
/// tried once, so a collector that refuses the connection ends the exit at once.
#[derive(Debug)]
struct BlockingClient {
    client: reqwest::blocking::Client,
    timeout: Duration,
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(feature = "otel")]
impl BlockingClient {
    fn send_once(
        &self,
        parts: &http::request::Parts,
        body: &bytes::Bytes,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let response = self
            .client
            .request(parts.method.clone(), parts.uri.to_string())
            .headers(parts.headers.clone())
            .body(body.to_vec())
            .send()?;
        let status = response.status();
        // The collector's answer is small (a partial-success message); read at most 64 KiB of it.
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(response, 64 * 1024), &mut body)?;
        Ok(http::Response::builder()
            .status(status)
            .body(bytes::Bytes::from(body))?)
    }
}

#[cfg(feature = "otel")]
#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for BlockingClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let started = std::time::Instant::now();
        let mut wait = RETRY_FIRST_WAIT;
        let mut retries = 0;
        loop {
            let outcome = self.send_once(&parts, &body);
            let retryable = match &outcome {
                Ok(response) => matches!(response.status().as_u16(), 429 | 502 | 503 | 504),
                Err(_) => true,
            };
            let stopping = self.stopping.load(Ordering::Acquire);
            if !retryable
                || stopping
                || retries == RETRIES
                || started.elapsed() + wait >= self.timeout
            {
                return outcome;
            }
            // The SDK runs this on its own thread (`block_on`): a plain sleep is the wait.
            std::thread::sleep(wait);
            wait = (wait * 2).min(RETRY_MAX_WAIT);
            retries += 1;
        }
    }
}

#[cfg(feature = "otel")]
/// Running telemetry: the tracer provider and its exporter thread. Keep it for the life of the
/// process and call [`Telemetry::shutdown`] at the end (dropping it shuts down too).
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    config: TelemetryConfig,
    /// Set at shutdown: the exporter stops retrying.
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(feature = "otel")]
impl Telemetry {
    /// Builds the exporter and its batch processor, and applies the content setting. Call it outside
    /// an async runtime (the blocking HTTP client refuses to be built inside one).
    ///
    /// # Errors
    /// [`TelemetryError::Exporter`] when the exporter cannot be built.
    pub fn start(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let client = reqwest::blocking::Client::builder()
            .timeout(config.export_timeout)
            .connect_timeout(config.export_timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(BlockingClient {
                client,
                timeout: config.export_timeout,
                stopping: stopping.clone(),
            })
            // Retried by `BlockingClient`, which can stop retrying at exit.
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(config.traces_endpoint.clone())
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(config.queue)
            .with_max_export_batch_size(config.queue.min(512))
            .build();
        let processor = BoundedProcessor {
            inner: BatchSpanProcessor::new(CountingExporter { inner: exporter }, batch),
            queue: config.queue as u64,
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        warden_actors::telemetry::set_capture_content(config.capture_content);
        install_context_hooks();
        Ok(Telemetry {
            provider,
            config: config.clone(),
            stopping,
        })
    }

    /// The settings it runs with.
    pub fn config(&self) -> &TelemetryConfig {
        &self.config
    }

    /// The `tracing` layer that turns the GenAI spans (and the API's request spans) into OTLP spans;
    /// it ignores every other span and event.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let tracer = self.provider.tracer("warden");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(
                Targets::new()
                    .with_target(warden_actors::telemetry::TARGET, tracing::Level::INFO)
                    .with_target(REQUEST_TARGET, tracing::Level::INFO),
            )
    }

    /// Sends the spans still queued (the SDK waits at most 5 s for it).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }

    /// Sends what is queued and stops the exporter, waiting at most [`SHUTDOWN_TIMEOUT`] (a
    /// collector that does not answer cannot hold the process longer). Each export is tried once
    /// from here on: a collector that refuses the connection ends it at once.
    pub fn shutdown(self) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
    }
}

#[cfg(feature = "otel")]
/// Lets a user event carry the OpenTelemetry context of the span it is sent under to the turn that
/// takes it ([`warden_actors::telemetry::ContextHooks`]). [`Telemetry::start`] calls it; call it
/// yourself when you install your own `tracing-opentelemetry` layer. Idempotent.
pub fn install_context_hooks() {
    fn capture() -> Option<std::sync::Arc<dyn std::any::Any + Send + Sync>> {
        let current = tracing::Span::current();
        if current.is_disabled() {
            return None;
        }
        let cx = current.context();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        Some(std::sync::Arc::new(cx))
    }
    fn attach(span: &tracing::Span, context: &(dyn std::any::Any + Send + Sync)) {
        if let Some(cx) = context.downcast_ref::<opentelemetry::Context>() {
            let _ = span.set_parent(cx.clone());
        }
    }
    let _ = warden_actors::telemetry::set_context_hooks(warden_actors::telemetry::ContextHooks {
        capture,
        attach,
    });
}

/// The target of [`request_span`]'s spans.
pub const REQUEST_TARGET: &str = "warden::telemetry";

/// The server span of one API request, continuing the caller's trace from its W3C `traceparent`
/// (and `tracestate`) header. A missing or malformed `traceparent` is ignored: the span starts a
/// new trace. Disabled (and free) when no telemetry layer is installed.
pub fn request_span(
    method: &str,
    route: &'static str,
    agent: &str,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> tracing::Span {
    let span = tracing::info_span!(
        target: REQUEST_TARGET,
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        http.request.method = method,
        http.route = route,
        gen_ai.agent.name = agent,
        http.response.status_code = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    #[cfg(not(feature = "otel"))]
    let _ = (traceparent, tracestate); // no exporter: no trace to continue
    #[cfg(feature = "otel")]
    if let Some(traceparent) = traceparent {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert("traceparent".to_owned(), traceparent.to_owned());
        if let Some(state) = tracestate {
            carrier.insert("tracestate".to_owned(), state.to_owned());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        if cx.span().span_context().is_valid() {
            let _ = span.set_parent(cx);
        }
    }
    span
}

/// Records the response status on a [`request_span`]; a refusal (4xx/5xx) is a span event with
/// error status.
pub fn request_ended(span: &tracing::Span, status: u16, refusal: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    span.record("http.response.status_code", status);
    if let Some(refusal) = refusal {
        tracing::warn!(target: REQUEST_TARGET, parent: span, reason = refusal, "warden.event_refused");
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", refusal);
    }
}

#[cfg(feature = "otel")]
/// The trace id of `span` as 32 hex digits, when it is exported (for logs and tests).
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let id = cx.span().span_context().trace_id();
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn off_when_nothing_is_set() {
        assert_eq!(TelemetryConfig::resolve(None, env(&[])), Ok(None));
        let section = TelemetrySection {
            capture_content: Some(true),
            ..Default::default()
        };
        assert_eq!(TelemetryConfig::resolve(Some(&section), env(&[])), Ok(None));
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let section = TelemetrySection {
            endpoint: Some("http://file:4318".into()),
            service_name: Some("from-file".into()),
            capture_content: Some(true),
            enabled: None,
        };
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318/"),
            ("OTEL_SERVICE_NAME", "from-env"),
            (
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
                "false",
            ),
        ];
        let config = TelemetryConfig::resolve(Some(&section), env(&vars))
            .unwrap()
            .unwrap();
        assert_eq!(config.traces_endpoint, "http://env:4318/v1/traces");
        assert_eq!(config.service_name, "from-env");
        assert!(!config.capture_content);
        let file_only = TelemetryConfig::resolve(Some(&section), env(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(file_only.traces_endpoint, "http://file:4318/v1/traces");
        assert_eq!(file_only.service_name, "from-file");
        assert!(file_only.capture_content);
        let signal = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x")];
        let config = TelemetryConfig::resolve(None, env(&signal))
            .unwrap()
            .unwrap();
        assert_eq!(config.traces_endpoint, "http://t:1/x");
        let disabled = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        assert_eq!(TelemetryConfig::resolve(None, env(&disabled)), Ok(None));
    }

    #[test]
    fn enabled_without_endpoint_uses_the_default_collector() {
        let section = TelemetrySection {
            enabled: Some(true),
            ..Default::default()
        };
        let config = TelemetryConfig::resolve(Some(&section), env(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(config.traces_endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(config.service_name, "warden");
    }

    #[test]
    fn only_http_protobuf_is_accepted() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        let err = TelemetryConfig::resolve(None, env(&vars)).unwrap_err();
        assert!(err.to_string().contains("http/protobuf only"), "{err}");
        let ok = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ];
        assert!(TelemetryConfig::resolve(None, env(&ok)).unwrap().is_some());
        let bad = [("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")];
        assert!(TelemetryConfig::resolve(None, env(&bad)).is_err());
    }

    #[test]
    fn the_section_is_read_alone_from_a_team_file() {
        let text = "[telemetry]\nendpoint = \"http://c:4318\"\ncapture_content = true\n\n[[agents]]\nkey = \"a\"\n";
        let section = TelemetrySection::from_team_toml(text).unwrap();
        assert_eq!(section.endpoint.as_deref(), Some("http://c:4318"));
        assert_eq!(section.capture_content, Some(true));
        assert_eq!(
            TelemetrySection::from_team_toml("[telemetry]\nbogus = 1"),
            None
        );
    }
}
