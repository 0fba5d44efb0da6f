//! `warden config defaults`: every section of a team file with its default values, commented.

use super::*;

/// The whole default configuration as TOML, `[api]` included (its tokens have no default and are
/// shown commented out), as `warden config defaults` prints it.
pub fn defaults_toml() -> String {
    format!(
        "{}\n\n\
         # warden serve only. WARDEN_ADMIN_TOKEN / WARDEN_READ_TOKEN (set, not empty) win over the\n\
         # tokens, --listen over listen. The tokens have no default.\n\
         [api]\n\
         # admin_token = \"…\"\n\
         # read_token = \"…\"\n\
         listen = \"{}\"\n\
         max_body_bytes = {}\n\
         # a game server's tokens: world events, replies, presence, clock and halts only\n\
         # host_tokens = [\"…\"]\n\
         # most events in one POST /api/world/batch\n\
         max_batch_events = {}\n\
         # how long a login to the browser console lasts (docs/console.md)\n\
         session_ttl_seconds = {}\n\
         # wrong tokens per client address and minute before its wrong ones get 429 (0: no limit)\n\
         auth_failures_per_minute = {}\n\
         \n\
         # OpenTelemetry export (docs/telemetry.md); off unless an endpoint is set here or in\n\
         # OTEL_EXPORTER_OTLP_ENDPOINT. Each OTEL_* variable wins over its key.\n\
         [telemetry]\n\
         # enabled = true\n\
         # endpoint = \"http://127.0.0.1:4318\"\n\
         # service_name = \"warden\"\n\
         # capture_content = false\n\
         \n\
         # A team file for warden run and warden serve adds [providers.NAME] and [[agents]].\n",
        WardenConfig::defaults_toml().trim_end(),
        api::DEFAULT_LISTEN,
        api::DEFAULT_BODY_LIMIT,
        api::DEFAULT_MAX_BATCH_EVENTS,
        api::DEFAULT_SESSION_TTL_SECONDS,
        api::DEFAULT_AUTH_FAILURES_PER_MINUTE,
    )
}

/// The `[providers.NAME]` keys of the OpenAI-compatible kind with their defaults, as commented TOML
/// (for `warden config defaults`: providers belong to team files, not to the plain configuration).
pub fn provider_defaults_toml() -> String {
    let d = OpenAiConfig::default();
    format!(
        r#"
# Team files (`warden run`, `warden serve`) add one [providers.NAME] per model endpoint and the
# [[agents]] that use them. The OpenAI-compatible kind, with its defaults. All the agents of one
# provider share its limits (the last three keys, of either kind), and a server's Retry-After or
# exhausted x-ratelimit-remaining-* pauses all of them at once:
# [providers.NAME]
# kind = "openai_compatible"            # or "scripted" (replies = ["…"], no network)
# base_url = "{base_url}"  # required: the API root; requests go to {{base_url}}/chat/completions
# model = "{model}"                     # required: sent as `model`, and the price table's key
# api_key_env = "OPENAI_API_KEY"        # optional: the variable holding the key (never the key itself)
# tool_format = "native"                # or "json_fallback" (tools described in a system message)
# stream = {stream}                        # true: server-sent events (an idle timeout instead of a total one)
# max_tokens = 1024                     # optional; unset: not sent (the server's default)
# temperature = 0.2                     # optional; unset: not sent (the server's default)
# embedding_model = "bge-small-en-v1.5" # optional: long-term memory's relevance by {{base_url}}/embeddings; unset: BM25
# retry_attempts = {attempts}                    # attempts per call, the first included; 1 to 20
# retry_base_ms = {base}                  # backoff before the 2nd attempt, x2 per attempt, 50-100 % jitter; 0 to 600000
# retry_cap_ms = {cap}                  # upper bound of that backoff; retry_base_ms to 600000
# retry_after_cap_ms = {after_cap}            # upper bound of a server's Retry-After (seconds or HTTP date); 0 to 3600000
# max_response_bytes = 16777216         # an answer's body (completion, stream, embeddings) past this fails as malformed; 1024 to 1073741824
# max_concurrency = 0                   # shared: calls in flight at once, streaming included; 0 (no cap) to 10000
# requests_per_minute = 0               # shared: requests started a minute, retries included; 0 (no limit) to 1000000
# tokens_per_minute = 0                 # shared: prompt estimate + max_tokens, corrected by usage; 0 (no limit) to 1000000000
"#,
        base_url = d.base_url,
        model = d.model,
        stream = d.stream,
        attempts = d.retry.max_attempts,
        base = millis(d.retry.base),
        cap = millis(d.retry.max),
        after_cap = millis(d.retry.retry_after_cap),
    )
}
