//! [`ToolResultCache`]: successful tool results, keyed by tool name and canonical arguments.
//!
//! Invariants:
//! * The key is the tool name plus the arguments in canonical form ([`canonical_json`]: object keys
//!   sorted recursively, no whitespace), so the order in which the model wrote the keys never matters.
//!   `1` and `1.0` are different arguments.
//! * Only successful results are stored ([`ToolResultCache::store`] ignores an `Err`), and only when
//!   the policy says the tool is cacheable.
//! * An entry is never returned once its TTL has passed (`tokio::time::Instant`, so tests can pause
//!   time). `Tick` entries are also removed by [`ToolResultCache::clear_tick`]; `Session` entries live
//!   until their TTL passes or [`ToolResultCache::clear`].
//! * The cache holds at most `max_entries` entries: when full, expired entries are purged first, then
//!   the oldest entry is evicted.
//! * One cache belongs to one agent: a tool's result may depend on the calling agent
//!   ([`crate::ToolContext`]), which is not part of the key.

use crate::tools::ToolError;
use parking_lot::Mutex;
use serde_json::Value;
use std::{collections::HashMap, time::Duration};
use tokio::time::Instant;

/// How long a cached result lives besides its TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheScope {
    /// Cleared at the end of each tick ([`ToolResultCache::clear_tick`]).
    #[default]
    Tick,
    /// Kept across ticks until the TTL passes.
    Session,
}

/// Whether and how a tool's results are cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePolicy {
    /// Whether successful results are stored and served. `false` (the default) disables the rest.
    pub cacheable: bool,
    /// How long entries live: `Tick` (legacy name: until the end of the turn) or `Session`.
    pub scope: CacheScope,
    /// Time to live of each entry; `None` means no expiry (only the scope clears it).
    pub ttl: Option<Duration>,
}

impl CachePolicy {
    /// The design's default TTL (300 s).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

    /// Not cached (the default: caching must be opted into per tool).
    pub const fn disabled() -> Self {
        CachePolicy {
            cacheable: false,
            scope: CacheScope::Tick,
            ttl: Some(Self::DEFAULT_TTL),
        }
    }

    /// Cached until the end of the tick or `ttl`, whichever comes first.
    pub const fn tick(ttl: Duration) -> Self {
        CachePolicy {
            cacheable: true,
            scope: CacheScope::Tick,
            ttl: Some(ttl),
        }
    }

    /// Cached across ticks for `ttl`.
    pub const fn session(ttl: Duration) -> Self {
        CachePolicy {
            cacheable: true,
            scope: CacheScope::Session,
            ttl: Some(ttl),
        }
    }
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self::disabled()
    }
}

/// `value` as compact JSON with every object's keys sorted (recursively).
pub fn canonical_json(value: &Value) -> String {
    crate::safety::canonical_json_cut(value, usize::MAX)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    tool: String,
    args: String,
}

#[derive(Debug)]
struct Entry {
    value: Value,
    scope: CacheScope,
    stored_at: Instant,
    expires_at: Option<Instant>,
}

impl Entry {
    fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }
}

/// Successful tool results of one agent. Cheap to share behind an `Arc`; all methods take `&self`.
#[derive(Debug)]
pub struct ToolResultCache {
    entries: Mutex<HashMap<Key, Entry>>,
    max_entries: usize,
}

impl Default for ToolResultCache {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolResultCache {
    /// Default capacity of [`ToolResultCache::new`].
    pub const DEFAULT_MAX_ENTRIES: usize = 1024;

    /// An empty cache of [`ToolResultCache::DEFAULT_MAX_ENTRIES`] entries.
    pub fn new() -> Self {
        Self::with_max_entries(Self::DEFAULT_MAX_ENTRIES)
    }

    /// A cache holding at most `max_entries` results (at least 1).
    pub fn with_max_entries(max_entries: usize) -> Self {
        ToolResultCache {
            entries: Mutex::new(HashMap::new()),
            max_entries: max_entries.max(1),
        }
    }

    fn key(tool: &str, args: &Value) -> Key {
        Key {
            tool: tool.to_owned(),
            args: canonical_json(args),
        }
    }

    /// The cached result of `tool` with `args`, if present and not expired.
    pub fn get(&self, tool: &str, args: &Value) -> Option<Value> {
        let key = Self::key(tool, args);
        let now = Instant::now();
        let mut entries = self.entries.lock();
        match entries.get(&key) {
            Some(entry) if entry.expired(now) => {
                entries.remove(&key);
                None
            }
            Some(entry) => Some(entry.value.clone()),
            None => None,
        }
    }

    /// Stores `result` if it is `Ok` and `policy.cacheable`; returns whether it was stored.
    pub fn store(
        &self,
        tool: &str,
        args: &Value,
        result: &Result<Value, ToolError>,
        policy: &CachePolicy,
    ) -> bool {
        let Ok(value) = result else { return false };
        if !policy.cacheable {
            return false;
        }
        let now = Instant::now();
        let expires_at = policy.ttl.map(|ttl| now + ttl);
        let key = Self::key(tool, args);
        let mut entries = self.entries.lock();
        if !entries.contains_key(&key) && entries.len() >= self.max_entries {
            entries.retain(|_, e| !e.expired(now));
            if entries.len() >= self.max_entries {
                let oldest = entries
                    .iter()
                    .min_by_key(|(_, e)| e.stored_at)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    entries.remove(&oldest);
                }
            }
        }
        entries.insert(
            key,
            Entry {
                value: value.clone(),
                scope: policy.scope,
                stored_at: now,
                expires_at,
            },
        );
        true
    }

    /// Drops every `Tick`-scoped entry (call at the end of each tick); `Session` entries stay.
    pub fn clear_tick(&self) {
        self.entries
            .lock()
            .retain(|_, e| e.scope == CacheScope::Session);
    }

    /// Drops everything.
    pub fn clear(&self) {
        self.entries.lock().clear();
    }

    /// Drops expired entries.
    pub fn purge_expired(&self) {
        let now = Instant::now();
        self.entries.lock().retain(|_, e| !e.expired(now));
    }

    /// Number of entries, expired ones included until they are looked up or purged.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether the cache holds no entry (expired ones count until purged).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(v: Value) -> Result<Value, ToolError> {
        Ok(v)
    }

    const SESSION: CachePolicy = CachePolicy::session(Duration::from_secs(60));
    const TICK: CachePolicy = CachePolicy::tick(Duration::from_secs(60));

    #[tokio::test]
    async fn hit_and_miss() {
        let cache = ToolResultCache::new();
        assert_eq!(cache.get("look", &json!({"at": "door"})), None);
        assert!(cache.store(
            "look",
            &json!({"at": "door"}),
            &ok(json!("a door")),
            &SESSION
        ));
        assert_eq!(
            cache.get("look", &json!({"at": "door"})),
            Some(json!("a door"))
        );
        // Other arguments, other tool: misses.
        assert_eq!(cache.get("look", &json!({"at": "window"})), None);
        assert_eq!(cache.get("peek", &json!({"at": "door"})), None);
    }

    #[tokio::test]
    async fn argument_order_never_matters() {
        let cache = ToolResultCache::new();
        let a: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, {"q": 1, "p": 2}], "x": null}}"#)
                .expect("valid json");
        let b: Value =
            serde_json::from_str(r#"{"a": {"x": null, "y": [1, {"p": 2, "q": 1}]}, "b": 1}"#)
                .expect("valid json");
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":null,"y":[1,{"p":2,"q":1}]},"b":1}"#
        );
        cache.store("t", &a, &ok(json!(1)), &SESSION);
        assert_eq!(cache.get("t", &b), Some(json!(1)));
        // Array order does matter.
        assert_eq!(
            cache.get(
                "t",
                &json!({"b": 1, "a": {"x": null, "y": [{"p": 2, "q": 1}, 1]}})
            ),
            None
        );
    }

    #[tokio::test]
    async fn only_successful_cacheable_results_are_stored() {
        let cache = ToolResultCache::new();
        let err = Err(ToolError::Failed("boom".into()));
        assert!(!cache.store("t", &json!({}), &err, &SESSION));
        assert!(!cache.store("t", &json!({}), &ok(json!(1)), &CachePolicy::disabled()));
        assert!(cache.is_empty());
        assert_eq!(cache.get("t", &json!({})), None);
    }

    #[tokio::test]
    async fn entries_expire_after_their_ttl() {
        tokio::time::pause();
        let cache = ToolResultCache::new();
        cache.store(
            "t",
            &json!({}),
            &ok(json!(1)),
            &CachePolicy::session(Duration::from_secs(10)),
        );
        cache.store(
            "u",
            &json!({}),
            &ok(json!(2)),
            &CachePolicy {
                ttl: None,
                ..SESSION
            },
        );
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(cache.get("t", &json!({})), Some(json!(1)));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.get("t", &json!({})), None);
        assert_eq!(cache.len(), 1, "the expired entry is removed on lookup");
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert_eq!(
            cache.get("u", &json!({})),
            Some(json!(2)),
            "no ttl: no expiry"
        );
    }

    #[tokio::test]
    async fn clear_tick_keeps_session_entries() {
        let cache = ToolResultCache::new();
        cache.store("tick", &json!({}), &ok(json!(1)), &TICK);
        cache.store("session", &json!({}), &ok(json!(2)), &SESSION);
        cache.clear_tick();
        assert_eq!(cache.get("tick", &json!({})), None);
        assert_eq!(cache.get("session", &json!({})), Some(json!(2)));
        cache.clear();
        assert!(cache.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn full_cache_evicts_expired_then_oldest() {
        let cache = ToolResultCache::with_max_entries(2);
        cache.store(
            "a",
            &json!({}),
            &ok(json!(1)),
            &CachePolicy::session(Duration::from_secs(1)),
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        cache.store("b", &json!({}), &ok(json!(2)), &SESSION);
        tokio::time::advance(Duration::from_secs(2)).await;
        cache.store("c", &json!({}), &ok(json!(3)), &SESSION); // evicts expired "a"
        assert_eq!(cache.get("b", &json!({})), Some(json!(2)));
        cache.store("d", &json!({}), &ok(json!(4)), &SESSION); // evicts oldest "b"
        assert_eq!(cache.get("b", &json!({})), None);
        assert_eq!(cache.get("c", &json!({})), Some(json!(3)));
        assert_eq!(cache.get("d", &json!({})), Some(json!(4)));
        assert_eq!(cache.len(), 2);
    }
}
