//! warden's actors.
mod provider;

pub use provider::{
    LlmRequest, LlmResponse, Provider, ProviderError, ScriptStep, ScriptedProvider,
};
