//! Who acts on an agent's cell between two of its messages: its reader (the actor, while it drains
//! the lanes or holds work it has not finished — a running turn), or, while the reader is idle,
//! one other thread that *borrows* it (an operator's halt applied on the halting thread: no
//! cross-thread wake-up before the acknowledgement).
//!
//! # Invariants (`actors/tests/loom_mailbox.rs` checks them in every interleaving)
//! * **One at a time.** The reader and a borrower are never both inside: the reader enters with a
//!   compare-and-swap that fails while a borrow is held, and a borrow is taken only from the idle
//!   state (no reader inside, no other borrow).
//! * **The reader is never left behind.** A reader that finds a borrow reads nothing and leaves a
//!   mark (`MISSED`) in the same word, atomically; the borrow's release reads the mark with the swap
//!   that ends the borrow and posts the reader a wake. So a wake the reader consumed while the
//!   borrow was held is posted again, and nothing queued meanwhile waits for another message.
//!
//! The state is one byte (it sits in the mailbox's padding: an idle agent's cell does not grow).

use crate::sync::{AtomicU8, Ordering};

/// The reader is inside: draining the lanes, or holding work across drains (a running turn).
const READING: u8 = 1;
/// Another thread acts for the idle reader.
const LENT: u8 = 2;
/// The reader came while the borrow was held and read nothing: the release must wake it.
const MISSED: u8 = 4;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ReaderSlot(AtomicU8);

impl ReaderSlot {
    /// The reader enters (at each drain). `true`: go on (also when it is inside already, holding a
    /// turn). `false`: a borrow is held — read nothing; the borrow's release posts a wake.
    pub(crate) fn enter(&self) -> bool {
        let mut now = self.0.load(Ordering::Acquire);
        loop {
            if now & READING != 0 {
                return true;
            }
            let (next, entered) = if now & LENT != 0 {
                (now | MISSED, false)
            } else {
                (now | READING, true)
            };
            match self
                .0
                .compare_exchange(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return entered,
                Err(actual) => now = actual,
            }
        }
    }

    /// The reader is idle: it holds nothing between messages until it enters again.
    pub(crate) fn leave(&self) {
        // While the reader is inside nobody else changes the word (a borrow needs it idle).
        self.0.fetch_and(!READING, Ordering::AcqRel);
    }

    /// Borrows the idle reader: `true` when nobody was inside (the caller now acts for the reader
    /// until [`ReaderSlot::release`]).
    pub(crate) fn lend(&self) -> bool {
        self.0
            .compare_exchange(0, LENT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends a borrow. `true`: the reader came meanwhile and read nothing — wake it.
    pub(crate) fn release(&self) -> bool {
        self.0.swap(0, Ordering::AcqRel) & MISSED != 0
    }
}

#[cfg(all(test, not(warden_loom)))]
mod tests {
    use super::ReaderSlot;

    #[test]
    fn only_an_idle_reader_is_lent_and_a_lent_one_cannot_enter() {
        let slot = ReaderSlot::default();
        assert!(slot.enter());
        assert!(slot.enter(), "a reader inside (a turn held) enters again");
        assert!(!slot.lend(), "borrowed while the reader is inside");
        slot.leave();
        assert!(slot.lend());
        assert!(!slot.lend(), "two borrows at once");
        assert!(!slot.release(), "nobody came: no wake");
        assert!(slot.lend());
        assert!(!slot.enter(), "the reader entered while borrowed");
        assert!(!slot.enter());
        assert!(slot.release(), "the reader came: it is owed a wake");
        assert!(slot.enter());
    }
}
