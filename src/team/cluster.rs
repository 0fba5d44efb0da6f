//! `[cluster]` in a team file and `warden serve --cluster URL --node NAME` (the flags win).
//!
//! Every value is range-checked while the file is read, so a bad one is refused with its key, its
//! value and its line, like the other sections:
//!
//! ```text
//! invalid config: line 3, column 21: `cluster.fail_safe_seconds`: invalid value 0 (allowed: 1 to 3600)
//! invalid config: line 2, column 9: `cluster.adopt`: invalid value "yes" (allowed: true or false)
//! ```

use serde::{de::Error as _, Deserialize, Deserializer, Serialize};
use std::{path::PathBuf, time::Duration};

/// The `[cluster]` section. The cluster is on when both `url` and `node` are set (here or by the
/// flags); see docs/cluster.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// The NATS server, `nats://HOST:PORT` (JetStream on). `--cluster` wins.
    #[serde(deserialize_with = "nats_url")]
    pub url: Option<String>,
    /// This node's name, unique in the cluster: 1 to 64 letters, digits, `-` and `_`. `--node` wins.
    #[serde(deserialize_with = "node_name")]
    pub node: Option<String>,
    /// How long a node may be cut off from JetStream (no successful heartbeat) before it starts no
    /// model call, in seconds (1 to 3600; default 10).
    #[serde(deserialize_with = "fail_safe_seconds")]
    pub fail_safe_seconds: u64,
    /// The lease TTL: an agent lease not renewed for this long expires (the lease bucket's
    /// `max_age`), in seconds (2 to 3600; default 6). Renewals come every TTL/3 (at most every
    /// second). Every node of a cluster must use the same value: the first node creates the bucket.
    #[serde(deserialize_with = "lease_ttl_seconds")]
    pub lease_ttl_seconds: u64,
    /// How long `POST /api/halt` waits for the other nodes' acknowledgements, in milliseconds
    /// (10 to 60000; default 2000). A node that did not answer is listed as such.
    #[serde(deserialize_with = "halt_ack_timeout_ms")]
    pub halt_ack_timeout_ms: u64,
    /// How long `warden serve` waits for the first connection to NATS before it gives up, in
    /// seconds (1 to 600; default 10).
    #[serde(deserialize_with = "connect_timeout_seconds")]
    pub connect_timeout_seconds: u64,
    /// Replicas of the buckets this node creates when they are missing (1 to 5; default 1). On a
    /// NATS cluster of 3 servers, 3 keeps the halt key, leases and lockouts through the loss of one
    /// server. Buckets that exist are used as they are.
    #[serde(deserialize_with = "replicas")]
    pub replicas: u64,
    /// With `safety.budget.tokens_per_team`, the nodes share it: each claims slices of this many
    /// tokens (the last one smaller) by compare-and-swap before spending past what it holds
    /// (0 to 10^12; default 0: a tenth of `tokens_per_team`).
    #[serde(deserialize_with = "budget_slice_tokens")]
    pub budget_slice_tokens: u64,
    /// With `safety.budget.cost_per_team`, the nodes share it the same way, in slices of this much
    /// cost (the currency of `safety.budget.prices`; 0 to 10^9, finite; default 0: a tenth of
    /// `cost_per_team`).
    #[serde(deserialize_with = "budget_slice_cost")]
    pub budget_slice_cost: f64,
    /// Whether this node adopts the agents of its team file that another node owned, once that
    /// node's lease on them aged out (it died, or was cut off longer than the lease TTL): `true`
    /// (the default) or `false` (such an agent is started again only by a node started with it).
    #[serde(deserialize_with = "adopt_flag")]
    pub adopt: bool,
    /// A file holding this node's NATS user nkey seed (one line, `SU…`); the server lists the user
    /// by its public key (`authorization { users = [{ nkey: "U…" }] }`). Not with a user or token
    /// in `url`. Read at start; the seed is never shown. Relative to the working directory.
    #[serde(deserialize_with = "file_path")]
    pub nkey_seed_file: Option<PathBuf>,
    /// A NATS credentials file (`.creds`: the user's JWT and nkey seed, as `nsc` writes it) for a
    /// server in operator (JWT) mode. Not with `nkey_seed_file` nor a user or token in `url`.
    #[serde(deserialize_with = "file_path")]
    pub credentials_file: Option<PathBuf>,
    /// PEM root certificates the NATS server's certificate must chain to. Setting it (or a client
    /// certificate, or a `tls://` URL) makes TLS required: a server that does not offer it is
    /// refused.
    #[serde(deserialize_with = "file_path")]
    pub tls_ca_file: Option<PathBuf>,
    /// This node's PEM client certificate, for a server that verifies clients (`tls { verify:
    /// true }`); with `tls_key_file`.
    #[serde(deserialize_with = "file_path")]
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of `tls_cert_file`.
    #[serde(deserialize_with = "file_path")]
    pub tls_key_file: Option<PathBuf>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            url: None,
            node: None,
            fail_safe_seconds: 10,
            lease_ttl_seconds: 6,
            halt_ack_timeout_ms: 2000,
            connect_timeout_seconds: 10,
            replicas: 1,
            budget_slice_tokens: 0,
            budget_slice_cost: 0.0,
            adopt: true,
            nkey_seed_file: None,
            credentials_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

/// The cluster a node joins: a [`ClusterSection`] with both `url` and `node`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// The NATS server.
    pub url: String,
    /// This node's name.
    pub node: String,
    /// See [`ClusterSection::fail_safe_seconds`].
    pub fail_safe: Duration,
    /// See [`ClusterSection::lease_ttl_seconds`].
    pub lease_ttl: Duration,
    /// See [`ClusterSection::halt_ack_timeout_ms`].
    pub halt_ack_timeout: Duration,
    /// See [`ClusterSection::connect_timeout_seconds`].
    pub connect_timeout: Duration,
    /// See [`ClusterSection::replicas`].
    pub replicas: usize,
    /// See [`ClusterSection::budget_slice_tokens`] (0: a tenth of the team budget).
    pub budget_slice_tokens: u64,
    /// See [`ClusterSection::budget_slice_cost`] (0: a tenth of the team budget).
    pub budget_slice_cost: f64,
    /// The prefix of every bucket and subject ([`DEFAULT_NAMESPACE`] for `warden serve`: buckets
    /// `warden_halt`, …, subjects `warden.cluster.…`). `warden loadtest --cluster` gives each run a
    /// namespace of its own, so that its nodes never meet a served cluster's (nor an earlier run's
    /// halt key). Not a `[cluster]` key.
    pub namespace: String,
    /// See [`ClusterSection::adopt`].
    pub adopt: bool,
    /// How this node proves itself to NATS and checks the server, beyond a user or token in `url`.
    pub security: NatsSecurity,
}

/// The `[cluster]` keys of NATS authentication and TLS, checked (a client certificate has its
/// key; an nkey is not given with a user or token in the URL). Files are read when connecting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NatsSecurity {
    /// See [`ClusterSection::nkey_seed_file`].
    pub nkey_seed_file: Option<PathBuf>,
    /// See [`ClusterSection::credentials_file`].
    pub credentials_file: Option<PathBuf>,
    /// See [`ClusterSection::tls_ca_file`].
    pub tls_ca_file: Option<PathBuf>,
    /// [`ClusterSection::tls_cert_file`] with its [`ClusterSection::tls_key_file`].
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// TLS is required: a CA file or a client certificate is set, or a server of the URL is
    /// `tls://`.
    pub tls_required: bool,
}

/// The namespace of `warden serve`'s buckets and subjects.
pub const DEFAULT_NAMESPACE: &str = "warden";

impl ClusterConfig {
    /// How often leases and the node's heartbeat are written: TTL/3, at most every second.
    pub fn beat(&self) -> Duration {
        (self.lease_ttl / 3).min(Duration::from_secs(1))
    }

    /// The bucket `base` (`halt`, `leases`, `lockouts`, `budget`) of this namespace:
    /// `warden_halt` in the default one.
    pub fn bucket(&self, base: &str) -> String {
        format!("{}_{base}", self.namespace)
    }

    /// The subject `rest` (`halt`, `delegate.NODE`) of this namespace: `warden.cluster.halt` in the
    /// default one.
    pub fn subject(&self, rest: &str) -> String {
        format!("{}.cluster.{rest}", self.namespace)
    }

    /// [`ClusterConfig::url`] as it may be shown (logs, `GET /api/cluster`, reports): a password or
    /// token in it replaced by `***`.
    pub fn shown_url(&self) -> String {
        shown_url(&self.url)
    }

    /// The credentials the URL carries (`nats://USER:PASSWORD@HOST:PORT`, or `nats://TOKEN@…`),
    /// from its first server that has any: `(user or token, password)`. async-nats 0.51 does not
    /// take them from the URL itself.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn credentials(&self) -> Option<(String, Option<String>)> {
        credentials(&self.url)
    }
}

/// See [`ClusterConfig::credentials`].
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
fn credentials(url: &str) -> Option<(String, Option<String>)> {
    url.split(',').find_map(|one| {
        let rest = strip_scheme(one.trim())?.1;
        let (userinfo, _) = rest.rsplit_once('@')?;
        Some(match userinfo.split_once(':') {
            Some((user, pass)) => (user.to_owned(), Some(pass.to_owned())),
            None => (userinfo.to_owned(), None),
        })
    })
}

/// `url` with the secret of each server's credentials replaced by `***` (a password, or a token:
/// the user part when there is no password).
pub fn shown_url(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let one = one.trim();
            let Some((scheme, (userinfo, host))) =
                strip_scheme(one).and_then(|(scheme, rest)| Some((scheme, rest.rsplit_once('@')?)))
            else {
                return one.to_owned();
            };
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}{user}:***@{host}"),
                None => format!("{scheme}***@{host}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The schemes a server of `cluster.url` may have: `tls://` requires TLS of that server.
const SCHEMES: [&str; 2] = ["nats://", "tls://"];

/// `(scheme, the rest)` of one server of a URL; `None` for another scheme.
fn strip_scheme(one: &str) -> Option<(&'static str, &str)> {
    SCHEMES
        .iter()
        .find_map(|scheme| Some((*scheme, one.strip_prefix(scheme)?)))
}

impl ClusterSection {
    /// The section with the `--cluster` and `--node` flags applied (each wins over its key), checked
    /// as the file's values are.
    ///
    /// # Errors
    /// The flag's name, its value and what is allowed.
    pub fn with_flags(
        mut self,
        url: Option<String>,
        node: Option<String>,
    ) -> Result<Self, crate::team::cluster_error::ClusterError> {
        let flag = |key: &'static str, value: Option<String>, check: Check| match value {
            None => Ok(None),
            Some(value) => match check(&value) {
                Ok(()) => Ok(Some(value)),
                Err(allowed) => Err(crate::team::cluster_error::ClusterError::Invalid {
                    key,
                    value,
                    allowed,
                }),
            },
        };
        if let Some(url) = flag("--cluster", url, check_url)? {
            self.url = Some(url);
        }
        if let Some(node) = flag("--node", node, check_node)? {
            self.node = Some(node);
        }
        Ok(self)
    }

    /// The cluster to join: `None` when neither `url` nor `node` is set (a single node).
    ///
    /// # Errors
    /// [`crate::team::cluster_error::ClusterError::Invalid`] when only one of them is set.
    pub fn resolve(
        &self,
    ) -> Result<Option<ClusterConfig>, crate::team::cluster_error::ClusterError> {
        let (url, node) = match (&self.url, &self.node) {
            (None, None) => return Ok(None),
            (Some(url), Some(node)) => (url.clone(), node.clone()),
            (Some(_), None) => {
                return Err(crate::team::cluster_error::ClusterError::Invalid {
                    key: "cluster.node",
                    value: "(unset)".into(),
                    allowed: "a node name (`--node NAME`) whenever a cluster URL is set",
                })
            }
            (None, Some(_)) => {
                return Err(crate::team::cluster_error::ClusterError::Invalid {
                    key: "cluster.url",
                    value: "(unset)".into(),
                    allowed: "a NATS URL (`--cluster nats://HOST:PORT`) whenever a node is set",
                })
            }
        };
        let security = self.security(&url)?;
        Ok(Some(ClusterConfig {
            security,
            url,
            node,
            fail_safe: Duration::from_secs(self.fail_safe_seconds),
            lease_ttl: Duration::from_secs(self.lease_ttl_seconds),
            halt_ack_timeout: Duration::from_millis(self.halt_ack_timeout_ms),
            connect_timeout: Duration::from_secs(self.connect_timeout_seconds),
            replicas: usize::try_from(self.replicas).unwrap_or(1),
            budget_slice_tokens: self.budget_slice_tokens,
            budget_slice_cost: self.budget_slice_cost,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            adopt: self.adopt,
        }))
    }
}

impl ClusterSection {
    /// The authentication and TLS keys, checked against each other and `url`.
    fn security(
        &self,
        url: &str,
    ) -> Result<NatsSecurity, crate::team::cluster_error::ClusterError> {
        let unset = |key: &'static str, allowed: &'static str| {
            crate::team::cluster_error::ClusterError::Invalid {
                key,
                value: "(unset)".into(),
                allowed,
            }
        };
        let tls_client = match (&self.tls_cert_file, &self.tls_key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (Some(_), None) => {
                return Err(unset(
                    "cluster.tls_key_file",
                    "the PEM private key of cluster.tls_cert_file, whenever that is set",
                ))
            }
            (None, Some(_)) => {
                return Err(unset(
                    "cluster.tls_cert_file",
                    "the PEM client certificate of cluster.tls_key_file, whenever that is set",
                ))
            }
        };
        // One way of proving who the node is.
        let ways = [
            ("cluster.nkey_seed_file", &self.nkey_seed_file),
            ("cluster.credentials_file", &self.credentials_file),
        ];
        for (i, (key, file)) in ways.iter().enumerate() {
            let Some(file) = file else { continue };
            let other = ways.iter().skip(i + 1).any(|(_, f)| f.is_some());
            if other || credentials(url).is_some() {
                return Err(crate::team::cluster_error::ClusterError::Invalid {
                    key,
                    value: file.display().to_string(),
                    allowed: "one of cluster.nkey_seed_file, cluster.credentials_file and a user \
                              (or token) in cluster.url",
                });
            }
        }
        let tls_url = url.split(',').any(|one| one.trim().starts_with("tls://"));
        Ok(NatsSecurity {
            nkey_seed_file: self.nkey_seed_file.clone(),
            credentials_file: self.credentials_file.clone(),
            tls_ca_file: self.tls_ca_file.clone(),
            tls_required: tls_url || self.tls_ca_file.is_some() || tls_client.is_some(),
            tls_client,
        })
    }
}

/// A value check: `Err(what is allowed)`.
type Check = fn(&str) -> Result<(), &'static str>;

const URL_ALLOWED: &str =
    "nats://HOST:PORT (tls://HOST:PORT: TLS required), several separated by commas (USER:PASSWORD@ or TOKEN@ before HOST for a server that wants them)";
const NODE_ALLOWED: &str = "1 to 64 letters, digits, `-` and `_`";

fn check_url(url: &str) -> Result<(), &'static str> {
    let ok = url.split(',').all(|one| {
        strip_scheme(one.trim())
            .is_some_and(|(_, rest)| !rest.is_empty() && !rest.contains(char::is_whitespace))
    });
    if ok {
        Ok(())
    } else {
        Err(URL_ALLOWED)
    }
}

fn check_node(node: &str) -> Result<(), &'static str> {
    let ok = (1..=64).contains(&node.len())
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(NODE_ALLOWED)
    }
}

fn checked<'de, D: Deserializer<'de>>(d: D, check: Check) -> Result<Option<String>, D::Error> {
    let value = String::deserialize(d)?;
    check(&value).map_err(|allowed| {
        D::Error::custom(format!("invalid value {value:?} (allowed: {allowed})"))
    })?;
    Ok(Some(value))
}

fn nats_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked(d, check_url)
}

fn node_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked(d, check_node)
}

/// A file's path: not empty.
fn file_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let value = String::deserialize(d)?;
    if value.trim().is_empty() {
        return Err(D::Error::custom(format!(
            "invalid value {value:?} (allowed: a file's path)"
        )));
    }
    Ok(Some(PathBuf::from(value)))
}

fn in_range<'de, D: Deserializer<'de>>(d: D, min: u64, max: u64) -> Result<u64, D::Error> {
    let value = i64::deserialize(d)?;
    match u64::try_from(value) {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(D::Error::custom(format!(
            "invalid value {value} (allowed: {min} to {max})"
        ))),
    }
}

fn fail_safe_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, 1, 3600)
}

fn lease_ttl_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, 2, 3600)
}

fn halt_ack_timeout_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, 10, 60_000)
}

fn replicas<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, 1, 5)
}

fn budget_slice_tokens<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, 0, 1_000_000_000_000)
}

fn budget_slice_cost<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let value = f64::deserialize(d)?;
    if value.is_finite() && (0.0..=1e9).contains(&value) {
        Ok(value)
    } else {
        Err(D::Error::custom(format!(
            "invalid value {value} (allowed: 0 to 1000000000, a finite number)"
        )))
    }
}

fn connect_timeout_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, 1, 600)
}

/// `true` or `false`, nothing else (`"yes"`, `1` are refused with what is allowed).
fn adopt_flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct Flag;
    impl serde::de::Visitor<'_> for Flag {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("true or false")
        }
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
            Err(E::custom(format!(
                "invalid value {v:?} (allowed: true or false)"
            )))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<bool, E> {
            Err(E::custom(format!(
                "invalid value {v} (allowed: true or false)"
            )))
        }
    }
    d.deserialize_any(Flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        cluster: ClusterSection,
    }

    fn parse(text: &str) -> Result<ClusterSection, String> {
        warden_protocols::parse_toml::<Doc>(text)
            .map(|d| d.cluster)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_a_full_section() {
        assert_eq!(parse("").unwrap(), ClusterSection::default());
        assert_eq!(ClusterSection::default().resolve().unwrap(), None);
        let section = parse(
            "[cluster]\nurl = \"nats://127.0.0.1:4222\"\nnode = \"a-1\"\nfail_safe_seconds = 3\n",
        )
        .unwrap();
        let config = section.resolve().unwrap().unwrap();
        assert_eq!(
            (config.url.as_str(), config.node.as_str()),
            ("nats://127.0.0.1:4222", "a-1")
        );
        assert_eq!(config.fail_safe, Duration::from_secs(3));
        assert_eq!(config.beat(), Duration::from_secs(1));
        // `warden serve`'s names are those of the docs and of the constants.
        assert_eq!(config.bucket("halt"), "warden_halt");
        assert_eq!(config.bucket("leases"), "warden_leases");
        assert_eq!(config.bucket("lockouts"), "warden_lockouts");
        assert_eq!(config.bucket("budget"), "warden_budget");
        assert_eq!(config.bucket("tasks"), "warden_tasks");
        assert_eq!(config.subject("halt"), "warden.cluster.halt");
    }

    #[test]
    fn a_bad_value_names_its_key_value_and_line() {
        let err = parse("[cluster]\nnode = \"a\"\nfail_safe_seconds = 0\n").unwrap_err();
        assert!(
            err.starts_with(
                "invalid config: line 3, column 21: `cluster.fail_safe_seconds`: invalid value 0 \
                 (allowed: 1 to 3600)"
            ),
            "{err}"
        );
        let err = parse("[cluster]\nnode = \"a b\"\n").unwrap_err();
        assert!(
            err.contains("line 2") && err.contains("`cluster.node`"),
            "{err}"
        );
        let err = parse("[cluster]\nurl = \"http://x\"\n").unwrap_err();
        assert!(
            err.contains("`cluster.url`") && err.contains("nats://"),
            "{err}"
        );
        let err = parse("[cluster]\nbudget_slice_cost = -0.5\n").unwrap_err();
        assert!(
            err.starts_with(
                "invalid config: line 2, column 21: `cluster.budget_slice_cost`: invalid value \
                 -0.5 (allowed: 0 to 1000000000, a finite number)"
            ),
            "{err}"
        );
        assert_eq!(
            parse("[cluster]\nbudget_slice_cost = 2\n")
                .unwrap()
                .budget_slice_cost,
            2.0,
            "an integer is a cost too"
        );
        let err = parse("[cluster]\nadopt = \"yes\"\n").unwrap_err();
        assert!(
            err.starts_with(
                "invalid config: line 2, column 9: `cluster.adopt`: invalid value \"yes\" \
                 (allowed: true or false)"
            ),
            "{err}"
        );
        let section = parse("[cluster]\nadopt = false\n").unwrap();
        assert!(!section.adopt && ClusterSection::default().adopt);
        let err = parse("[cluster]\nnodes = \"a\"\n").unwrap_err();
        assert!(err.contains("unknown field `nodes`"), "{err}");
    }

    #[test]
    fn credentials_come_from_the_url_and_are_never_shown() {
        let config = |url: &str| {
            ClusterSection::default()
                .with_flags(Some(url.into()), Some("a".into()))
                .unwrap()
                .resolve()
                .unwrap()
                .unwrap()
        };
        let plain = config("nats://h:1");
        assert_eq!(plain.credentials(), None);
        assert_eq!(plain.shown_url(), "nats://h:1");
        let user = config("nats://h:1, nats://u:p:w@h2:2");
        assert_eq!(user.credentials(), Some(("u".into(), Some("p:w".into()))));
        assert_eq!(user.shown_url(), "nats://h:1,nats://u:***@h2:2");
        let token = config("nats://t0ken@h:1");
        assert_eq!(token.credentials(), Some(("t0ken".into(), None)));
        assert_eq!(token.shown_url(), "nats://***@h:1");
    }

    #[test]
    fn tls_and_nkey_keys_are_checked_against_each_other_and_the_url() {
        let resolve = |text: &str| {
            parse(&format!("[cluster]\nnode = \"a\"\n{text}"))
                .and_then(|s| s.resolve().map_err(|e| e.to_string()))
                .map(|c| c.unwrap().security)
        };
        // Nothing set: no TLS asked for (a server that offers it is still used).
        let plain = resolve("url = \"nats://h:1\"\n").unwrap();
        assert_eq!(plain, NatsSecurity::default());
        // A tls:// server, a CA, or a client certificate: TLS required.
        assert!(
            resolve("url = \"nats://h:1, tls://h:2\"\n")
                .unwrap()
                .tls_required
        );
        let ca = resolve("url = \"nats://h:1\"\ntls_ca_file = \"ca.pem\"\n").unwrap();
        assert!(ca.tls_required && ca.tls_ca_file == Some("ca.pem".into()));
        let client =
            resolve("url = \"nats://h:1\"\ntls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\n")
                .unwrap();
        assert_eq!(client.tls_client, Some(("c.pem".into(), "k.pem".into())));
        assert!(client.tls_required);
        // A certificate without its key, or the other way round.
        let err = resolve("url = \"nats://h:1\"\ntls_cert_file = \"c.pem\"\n").unwrap_err();
        assert_eq!(
            err,
            "invalid value for `cluster.tls_key_file`: (unset) (allowed: the PEM private key of \
             cluster.tls_cert_file, whenever that is set)"
        );
        let err = resolve("url = \"nats://h:1\"\ntls_key_file = \"k.pem\"\n").unwrap_err();
        assert!(err.contains("`cluster.tls_cert_file`"), "{err}");
        // An nkey and a user in the URL: one or the other.
        let err = resolve("url = \"nats://u:p@h:1\"\nnkey_seed_file = \"seed\"\n").unwrap_err();
        assert_eq!(
            err,
            "invalid value for `cluster.nkey_seed_file`: seed (allowed: one of \
             cluster.nkey_seed_file, cluster.credentials_file and a user (or token) in \
             cluster.url)"
        );
        let err = resolve(
            "url = \"nats://h:1\"\nnkey_seed_file = \"seed\"\ncredentials_file = \"c.creds\"\n",
        )
        .unwrap_err();
        assert!(err.contains("`cluster.nkey_seed_file`"), "{err}");
        let err = resolve("url = \"nats://t@h:1\"\ncredentials_file = \"c.creds\"\n").unwrap_err();
        assert!(err.contains("`cluster.credentials_file`: c.creds"), "{err}");
        // An empty path, with its line.
        let err = parse("[cluster]\ntls_ca_file = \" \"\n").unwrap_err();
        assert!(
            err.starts_with(
                "invalid config: line 2, column 15: `cluster.tls_ca_file`: invalid value \" \" \
                 (allowed: a file's path)"
            ),
            "{err}"
        );
        // tls:// credentials are hidden as nats:// ones are.
        assert_eq!(shown_url("tls://u:pw@h:1"), "tls://u:***@h:1");
        assert_eq!(credentials("tls://tok@h:1"), Some(("tok".into(), None)));
        assert!(check_url("http://h:1").is_err() && check_url("tls://h:1").is_ok());
    }

    #[test]
    fn flags_win_and_both_url_and_node_are_needed() {
        let section = ClusterSection::default()
            .with_flags(Some("nats://h:1".into()), None)
            .unwrap();
        assert!(section
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("cluster.node"));
        let err = ClusterSection::default()
            .with_flags(None, Some("no/slash".into()))
            .unwrap_err();
        assert!(err.to_string().contains("--node"), "{err}");
    }
}
