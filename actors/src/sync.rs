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
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

#[cfg(warden_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// A part allocated at its first use (the mailbox's lanes): `once_cell`'s `race::OnceBox`.
#[cfg(not(warden_loom))]
pub(crate) use once_cell::race::OnceBox;

/// The loom stand-in for `once_cell::race::OnceBox`, whose pointer is a std atomic that loom cannot
/// see (the lanes' loom atomics created by one thread and loaded by another would be reported as
/// unordered). The value is built up front (before the model's threads run) and *published* by a
/// loom flag with the `OnceBox`'s orderings (a swap with acquire-release, an acquire load): loom
/// explores every interleaving in which a reader does not see the lanes yet and reads them as
/// empty, as it does in the real build.
#[cfg(warden_loom)]
pub(crate) struct OnceBox<T> {
    value: Box<T>,
    set: AtomicBool,
}

#[cfg(warden_loom)]
impl<T: Default> OnceBox<T> {
    pub(crate) fn new() -> Self {
        OnceBox {
            value: Box::default(),
            set: AtomicBool::new(false),
        }
    }

    pub(crate) fn get(&self) -> Option<&T> {
        self.set.load(Ordering::Acquire).then_some(&*self.value)
    }

    pub(crate) fn get_or_init(&self, _init: impl FnOnce() -> Box<T>) -> &T {
        self.set.swap(true, Ordering::AcqRel);
        &self.value
    }
}

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
