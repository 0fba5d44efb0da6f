//! LLM providers: the [`Provider`] trait the agent's ReAct loop calls, and its implementations.
//!
//! A provider call is a future the agent spawns (never `ctx.wait`s on); a halt drops it, which drops
//! the HTTP request and closes its connection. Retries live inside the future, so a dropped future
//! also stops retrying — a halted agent is never retried.

#[cfg(feature = "openai")]
mod openai;
#[cfg(all(feature = "fuzzing", feature = "openai"))]
pub(crate) use openai::fuzzing;
mod limits;
mod scripted;

pub use limits::{
    provider_limit_stats, CallPermit, Limited, ProviderLimitStats, ProviderLimiter, ProviderLimits,
};
#[cfg(feature = "openai")]
pub use openai::{
    retry_class, retry_counts, AttemptObserver, FailedAttempt, OpenAiCompatible, OpenAiConfig,
    OpenAiSetupError, RetryPolicy, StreamEvent, ToolFormat, DEFAULT_MAX_RESPONSE_BYTES,
    RETRY_CLASSES,
};
pub use scripted::{Latency, ScriptStats, ScriptStep, ScriptedProvider};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use warden_protocols::{AgentKey, ChatMessage, FinishReason, ToolSpec, Usage};

/// One chat-completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRequest {
    /// The agent making the call (for logs and per-agent accounting; not sent to the model).
    pub agent: AgentKey,
    /// The conversation, system prompt first, in Chat Completions format.
    pub messages: Vec<ChatMessage>,
    /// Tools the model may call; empty for a tool-less turn (e.g. a wrap-up).
    pub tools: Vec<ToolSpec>,
}

/// The model's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmResponse {
    /// An assistant message: text, tool calls, or both.
    pub message: ChatMessage,
    /// Why the model stopped (`stop`, `tool_calls`, `length`: cut by its token limit, …).
    pub finish_reason: FinishReason,
    /// Tokens the call used (`estimated` when the server did not report them).
    pub usage: Usage,
}

/// Why a provider call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum ProviderError {
    /// The call (or one attempt of it) took longer than its timeout. Retryable.
    #[error("llm call timed out after {after_ms} ms")]
    Timeout {
        /// The timeout that elapsed, in milliseconds.
        after_ms: u64,
    },
    /// The server could not be reached or the connection broke. Retryable.
    #[error("connection error: {message}")]
    Connection {
        /// The transport's error text.
        message: String,
    },
    /// The server answered with a non-success status. Retryable for 408, 429 and 5xx.
    #[error("http status {status}: {body}")]
    Http {
        /// The HTTP status code.
        status: u16,
        /// The response body (truncated; empty if it could not be read), for the operator.
        body: String,
    },
    /// The server answered, but not with something we can use (invalid JSON, missing fields).
    #[error("malformed response: {message}")]
    Malformed {
        /// What was wrong with the response.
        message: String,
    },
    /// A panic inside the provider's future, caught by the agent.
    #[error("provider panicked: {message}")]
    Panicked {
        /// The panic's message.
        message: String,
    },
    /// A scripted provider ran out of steps.
    #[error("script exhausted after {calls} calls")]
    ScriptExhausted {
        /// The number of the call that found the script empty (1-based).
        calls: u64,
    },
    /// Anything else (a scripted failure, a stream that ended without its finish marker).
    /// Not retryable.
    #[error("{message}")]
    Other {
        /// The error text.
        message: String,
    },
    /// A retryable failure that lasted through every attempt the provider's retry policy allows
    /// (`retry_attempts`, at least 2): the last attempt's error. Not retried again.
    #[error("{last} (after {attempts} attempts)")]
    Retried {
        /// Attempts made, the first included.
        attempts: u32,
        /// The last attempt's error.
        last: Box<ProviderError>,
    },
}

impl ProviderError {
    /// The error itself, or for [`ProviderError::Retried`] the last attempt's: what went wrong,
    /// retries aside.
    pub fn last_attempt(&self) -> &ProviderError {
        match self {
            ProviderError::Retried { last, .. } => last.last_attempt(),
            other => other,
        }
    }

    /// Whether another attempt may succeed: timeouts, connection errors, 408, 429 and 5xx (not a
    /// [`ProviderError::Retried`]: its attempts are spent).
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Timeout { .. } | ProviderError::Connection { .. } => true,
            ProviderError::Http { status, .. } => {
                *status == 408 || *status == 429 || (500..=599).contains(status)
            }
            _ => false,
        }
    }
}

/// What an embedding call returns: one vector per text, in order, and the call's tokens.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Embedded {
    /// One vector per text, in the order given.
    pub vectors: Vec<Vec<f32>>,
    /// The tokens of the call (prompt tokens; counted against the budgets like a model call's).
    pub usage: warden_protocols::Usage,
}

/// A chat-completions backend.
pub trait Provider: Send + Sync + 'static {
    /// A short name for logs and status (`scripted`, `openai-compatible:gpt-4o`).
    fn name(&self) -> &str;

    /// The model name, for the price table (`safety.budget.prices`). Defaults to [`Provider::name`].
    fn model(&self) -> &str {
        self.name()
    }

    /// `true` if the provider bounds each of its attempts by `safety.timeout.llm_call_seconds`
    /// itself (the OpenAI-compatible one does: per attempt, between retries, and as an idle timeout
    /// while streaming). Otherwise (the default) the turn bounds the whole call by it: a call still
    /// running then is dropped and fails as [`ProviderError::Timeout`].
    fn bounds_its_own_calls(&self) -> bool {
        false
    }

    /// Sends one request (with the provider's own retries). Dropping the future abandons the call.
    ///
    /// # Errors
    /// A [`ProviderError`]: the call's final outcome, after any retries.
    ///
    /// # Cancel safety
    /// Must be cancel safe: a halt drops the future at any await. Dropping it must abandon the call
    /// (close the HTTP request, stop retrying) and leave the provider usable for the next call.
    fn complete(
        &self,
        request: LlmRequest,
    ) -> BoxFuture<'static, Result<LlmResponse, ProviderError>>;

    /// Embeddings of `texts`, for long-term memory's relevance (docs/memory.md): `None` (the
    /// default) when the provider has no embedding model (then recall ranks by BM25). Dropping
    /// the future abandons the call.
    fn embed(
        &self,
        texts: Vec<String>,
    ) -> Option<BoxFuture<'static, Result<Embedded, ProviderError>>> {
        let _ = texts;
        None
    }
}
