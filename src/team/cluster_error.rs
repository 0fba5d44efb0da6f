//! Why a node cannot join its cluster.

/// Why `warden serve --cluster` could not join (nothing is served then).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A `[cluster]` value or flag that cannot be used.
    #[error("invalid value for `{key}`: {value} (allowed: {allowed})")]
    Invalid {
        /// The key (`cluster.node`) or flag (`--node`).
        key: &'static str,
        /// The value as given.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// The NATS server could not be reached within `cluster.connect_timeout_seconds`.
    #[error("cluster: cannot connect to NATS at {url}: {cause}")]
    Connect {
        /// The URL tried.
        url: String,
        /// What the client said.
        cause: String,
    },
    /// A file a `[cluster]` key names (`nkey_seed_file`, `tls_ca_file`, …) cannot be read or is
    /// not what the key wants. (The content of a seed file is never shown.)
    #[error("cluster: `{key}` = {path}: {cause}")]
    File {
        /// The key (`cluster.nkey_seed_file`).
        key: &'static str,
        /// The file, as given.
        path: String,
        /// What is wrong with it.
        cause: String,
    },
    /// JetStream refused or did not answer (it is off on the server, a bucket could not be made).
    #[error("cluster: JetStream: {0}")]
    JetStream(String),
}
