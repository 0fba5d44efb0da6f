//! The synchronisation primitives the mailbox is built on: std's atomics and parking_lot's mutex in
//! every build, loom's under `--cfg warden_loom`, so the loom models (`actors/tests/loom_mailbox.rs`)
//! explore every interleaving of the real mailbox code.
//!
//! Written by hand because the swap needs parking_lot's guard-returning `lock()` on both sides; the
//! cfg is `warden_loom`, not `loom`, because tokio reacts to a plain `loom` cfg by expecting its own
//! loom build.

#[cfg(not(warden_loom))]
pub(crate) use parking_lot::Mutex;
#[cfg(not(warden_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(warden_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// loom's mutex with parking_lot's `lock()` (no poisoning to handle: a panic fails the model).
#[cfg(warden_loom)]
#[derive(Debug)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(warden_loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
