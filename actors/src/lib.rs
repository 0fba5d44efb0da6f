//! warden's actors.
mod provider;

pub use provider::{
    AttemptObserver, FailedAttempt, LlmRequest, LlmResponse, OpenAiCompatible, OpenAiConfig,
    OpenAiSetupError, Provider, ProviderError, RetryPolicy, ScriptStats, ScriptStep,
    ScriptedProvider, StreamEvent, ToolFormat,
};
