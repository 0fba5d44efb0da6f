//! Reading a response body with a ceiling on its size.
//!
//! reqwest reads a whole body (`Response::bytes`, `text`) however long it is; a model server that
//! answers with gigabytes (hostile, or a proxy's error page in a loop) would be held in memory
//! whole before the parser could refuse it. `read_capped` stops at the ceiling instead.

use crate::provider::ProviderError;

/// The default ceiling of a model server's answer ([`super::OpenAiConfig::max_response_bytes`]):
/// 16 MiB, about a thousand times a long completion, and room for a batch of embeddings.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How much of an error answer (a non-2xx status) is read: its text is only shown to the operator,
/// truncated to a couple of thousand characters.
pub(super) const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Why [`read_capped`] stopped.
pub(super) enum ReadError {
    /// The transport failed while reading.
    Transport(reqwest::Error),
    /// The body is longer than the ceiling (by its `Content-Length` or by what arrived).
    TooLarge,
}

/// Reads `response`'s body, at most `cap` bytes. A `Content-Length` over the ceiling is refused
/// before anything is read.
///
/// # Errors
/// [`ReadError::TooLarge`] past `cap`, [`ReadError::Transport`] when the connection fails.
///
/// # Cancel safety
/// Dropping the future drops the response, which closes its connection.
pub(super) async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, ReadError> {
    if response
        .content_length()
        .is_some_and(|length| length > cap as u64)
    {
        return Err(ReadError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Transport)? {
        if body.len() + chunk.len() > cap {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error answer's text, at most [`MAX_ERROR_BODY_BYTES`] of it, lossily decoded; empty when
/// it cannot be read (the status is what matters).
pub(super) async fn read_error_text(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = MAX_ERROR_BODY_BYTES.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BODY_BYTES {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// The error a body over the ceiling becomes: not retryable (the same server would answer the
/// same way), and it names the key that raises the ceiling.
pub(super) fn too_large(cap: usize) -> ProviderError {
    ProviderError::Malformed {
        message: format!(
            "the response body is over {cap} bytes (max_response_bytes); it was not read further"
        ),
    }
}
