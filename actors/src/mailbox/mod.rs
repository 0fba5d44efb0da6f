//! The priority mailbox: four FIFO lanes shared by every sender and the owning actor, with actix's own
//! (FIFO) mailbox carrying nothing but coalesced [`Wake`] signals.
//!
//! # Invariants
//! * The reader always takes the most urgent non-empty lane ([`Priority`] order), so a message in the
//!   `SystemHalt` lane is read before any ordinary message, whatever the ordinary backlog.
//! * Only the ordinary lane is bounded. Halt, control and supervision lanes never refuse a message, so a
//!   full ordinary lane cannot block a halt.
//! * Wake-ups are coalesced: a sender posts a `Wake` only when its swap flips `wake_scheduled` from
//!   false to true; the reader clears the flag with a swap *before* it reads
//!   ([`PriorityMailbox::begin_drain`]), so a message pushed after the clear posts a new wake and
//!   none is missed. Both sides swap (never a plain load and a plain store): the two swaps are
//!   totally ordered, which rules out the store-buffering interleaving that lost a wake-up in the
//!   loom model (`actors/tests/loom_mailbox.rs`, run with `--cfg warden_loom`; see `sync.rs`).
//! * `depth[i]` is incremented after a push and decremented after a pop, both under lane `i`'s lock, so it
//!   is exact whenever no lock is held and never undercounts a visible message.
//!
//! * Between two messages the reader may be *borrowed* by another thread, which then acts on the
//!   agent for it ([`PriorityMailbox::borrow_idle_reader`], see `mailbox/reader.rs`): never both at once, and
//!   a reader that came meanwhile is woken when the borrow ends.
//!
//! # Lock order
//! Each lane lock is a leaf: it is never held while taking another lock or posting a wake.

mod reader;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, OnceBox, Ordering};
use actix::{Message, Recipient};
use std::collections::VecDeque;
use tokio::sync::Notify;
use warden_protocols::{Priority, QueueDepths};

/// Where the mailbox posts its coalesced wake-ups: the reader's actor (its `Addr`, or a
/// [`Recipient<Wake>`]), or a test's probe (the loom models count wakes with one). The mailbox keeps
/// the one given to [`PriorityMailbox::attach`] and gives a copy back ([`PriorityMailbox::waker`]),
/// so an agent's address is held once, here.
pub trait WakeSink: std::any::Any + Send + Sync + 'static {
    /// Tells the reader its lanes may have work. Must not block or take the mailbox's locks.
    fn wake(&self);

    /// For a sink that stands for a reader that does not run (a *passive* one, attached with
    /// [`PriorityMailbox::attach_passive`] or left by [`PriorityMailbox::passivate`]): starts the
    /// reader and returns its sink, which takes this one's place and is woken at once. `None`: no
    /// reader could be started (its owner is gone); the sink stays. Called under the mailbox's
    /// waker lock, by the sender whose message needs the reader: must not block or take the
    /// mailbox's locks. Readers that always run keep the default (never called for them).
    fn activate(&self) -> Option<Box<dyn WakeSink>> {
        None
    }
}

impl WakeSink for Recipient<Wake> {
    fn wake(&self) {
        self.do_send(Wake);
    }
}

std::thread_local! {
    /// Set while the host handle queues a batch on this thread: [`PriorityMailbox::schedule_wake`]
    /// does nothing, and the batch hands its mailboxes to the host's pump, which schedules their
    /// wakes on warden's own thread (one cross-thread wake per batch instead of one per agent).
    static DEFERRED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Wakes posted by this thread (for the host handle's wake count).
    static POSTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with this thread's wake-ups deferred (see `DEFERRED`). The caller must call
/// [`PriorityMailbox::schedule_wake`] afterwards, from any thread, on every mailbox `f` pushed to.
pub(crate) fn defer_wakes<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEFERRED.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DEFERRED.with(|d| d.replace(true)));
    f()
}

/// How many wakes this thread has posted to mailbox readers so far.
pub(crate) fn wakes_posted_here() -> u64 {
    POSTED.with(std::cell::Cell::get)
}

/// The only message that travels through actix's mailbox: "your lanes may have work".
#[derive(Debug, Clone, Copy)]
pub struct Wake;

impl Message for Wake {
    type Result = ();
}

/// A message that knows its lane.
pub trait Prioritized {
    /// The lane this message goes to. Must not change while it is queued.
    fn priority(&self) -> Priority;
}

/// A message with the id the mailbox gave it.
#[derive(Debug)]
pub struct Envelope<M> {
    /// Unique per mailbox, growing in send order (across lanes); journaled with a discarded
    /// message.
    pub id: u64,
    /// The message.
    pub msg: M,
}

/// A `try_send` that could not enqueue; the message is handed back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrySendError<M> {
    /// The ordinary lane holds `capacity` messages (only the ordinary lane is bounded).
    #[error("ordinary lane is full")]
    Full(M),
    /// The mailbox was closed ([`PriorityMailbox::close`]); no lane takes messages.
    #[error("mailbox is closed")]
    Closed(M),
}

impl<M> TrySendError<M> {
    /// The message handed back.
    pub fn into_inner(self) -> M {
        match self {
            TrySendError::Full(m) | TrySendError::Closed(m) => m,
        }
    }
}

/// A `send` on a closed mailbox; the message is handed back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("mailbox is closed")]
pub struct SendError<M>(pub M);

/// Four priority lanes. See the module docs for the invariants.
///
/// Senders push with [`PriorityMailbox::try_send`] (or wait for room with
/// [`PriorityMailbox::send`]); the one reader pops the most urgent non-empty lane with
/// [`PriorityMailbox::pop`]. Only the ordinary lane is bounded (`capacity`, at least 1).
///
/// # Examples
/// ```
/// use warden_actors::mailbox::{Prioritized, PriorityMailbox, TrySendError};
/// use warden_protocols::Priority;
///
/// #[derive(Debug)]
/// struct Msg(Priority, &'static str);
/// impl Prioritized for Msg {
///     fn priority(&self) -> Priority {
///         self.0
///     }
/// }
///
/// let mailbox = PriorityMailbox::new(1);
/// mailbox.try_send(Msg(Priority::Ordinary, "work")).unwrap();
/// // The ordinary lane is full, and hands the message back...
/// let refused = mailbox.try_send(Msg(Priority::Ordinary, "more work"));
/// assert!(matches!(refused, Err(TrySendError::Full(Msg(_, "more work")))));
/// // ...but a halt is never refused, and is read first.
/// mailbox.try_send(Msg(Priority::SystemHalt, "halt")).unwrap();
/// assert_eq!(mailbox.pop().unwrap().msg.1, "halt");
/// assert_eq!(mailbox.pop().unwrap().msg.1, "work");
/// assert!(mailbox.pop().is_none());
/// ```
pub struct PriorityMailbox<M> {
    /// The lanes, allocated by the first message (see [`Lanes`]).
    lanes: OnceBox<Lanes<M>>,
    capacity: usize,
    closed: AtomicBool,
    wake_scheduled: AtomicBool,
    /// Set once by the reader when it first runs (or when a passive one is attached).
    reading: AtomicBool,
    /// The sink in `waker` stands for a reader that does not run ([`WakeSink::activate`]). Changed
    /// only under the `waker` lock; read without it by [`PriorityMailbox::is_passive`].
    passive: AtomicBool,
    /// Whether the reader is inside, or another thread acts for it ([`reader`]).
    reader: reader::ReaderSlot,
    waker: Mutex<Option<Box<dyn WakeSink>>>,
}

/// The four lanes with their depths and the id counter: allocated by the first message a mailbox
/// takes and kept, so that the mailbox of an agent nobody sent anything (most of a large idle
/// fleet) is ~100 bytes instead of ~280 (`docs/performance.md`, "Passive agents"). Until then
/// every lane reads as empty. Allocated before the first push and reached by the readers through
/// the same flags and locks that make the push visible (the wake flag's swaps, the waker lock), so
/// whoever sees a message sees its lanes.
struct Lanes<M> {
    lanes: [Mutex<VecDeque<Envelope<M>>>; Priority::COUNT],
    depth: [AtomicUsize; Priority::COUNT],
    next_id: AtomicU64,
    /// Senders parked in [`PriorityMailbox::send`] waiting for ordinary space (only a mailbox
    /// that took messages can be full).
    waiting_senders: AtomicUsize,
    space: Notify,
}

impl<M> Default for Lanes<M> {
    fn default() -> Self {
        Lanes {
            lanes: std::array::from_fn(|_| Mutex::new(VecDeque::new())),
            depth: std::array::from_fn(|_| AtomicUsize::new(0)),
            next_id: AtomicU64::new(1),
            waiting_senders: AtomicUsize::new(0),
            space: Notify::new(),
        }
    }
}

impl<M> Lanes<M> {
    /// Whether any lane holds a message.
    fn queued(&self) -> bool {
        self.depth.iter().any(|d| d.load(Ordering::Acquire) > 0)
    }
}

impl<M> std::fmt::Debug for PriorityMailbox<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorityMailbox")
            .field("capacity", &self.capacity)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<M: Prioritized> PriorityMailbox<M> {
    /// A mailbox whose ordinary lane holds at most `capacity` messages.
    pub fn new(capacity: usize) -> Self {
        PriorityMailbox {
            lanes: OnceBox::new(),
            capacity: capacity.max(1),
            closed: AtomicBool::new(false),
            wake_scheduled: AtomicBool::new(false),
            reading: AtomicBool::new(false),
            passive: AtomicBool::new(false),
            reader: reader::ReaderSlot::default(),
            waker: Mutex::new(None),
        }
    }

    /// The lanes, allocated now if no message came yet.
    fn lanes(&self) -> &Lanes<M> {
        self.lanes.get_or_init(Box::default)
    }

    /// The lanes, if a message ever came (`None`: every lane is empty).
    fn lanes_now(&self) -> Option<&Lanes<M>> {
        self.lanes.get()
    }

    /// The depth of `lane` (0 before the first message).
    fn depth(&self, lane: usize) -> usize {
        self.lanes_now()
            .map_or(0, |l| l.depth[lane].load(Ordering::Acquire))
    }

    /// Ordinary-lane capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Enqueues without waiting, and posts a [`Wake`] unless one is pending. Returns the message's
    /// [`Envelope::id`].
    ///
    /// # Errors
    /// [`TrySendError::Full`] when `msg` is ordinary and the ordinary lane holds `capacity`
    /// messages; [`TrySendError::Closed`] after [`PriorityMailbox::close`]. The message is handed
    /// back either way.
    pub fn try_send(&self, msg: M) -> Result<u64, TrySendError<M>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(TrySendError::Closed(msg));
        }
        let lane = msg.priority().index();
        let lanes = self.lanes();
        let id = {
            let mut q = lanes.lanes[lane].lock();
            if lane == Priority::Ordinary.index() && q.len() >= self.capacity {
                return Err(TrySendError::Full(msg));
            }
            Self::push_locked(lanes, &mut q, lane, msg)
        };
        self.schedule_wake();
        Ok(id)
    }

    /// Enqueues, waiting for space in the ordinary lane (backpressure). Messages of the other
    /// lanes never wait.
    ///
    /// # Errors
    /// [`SendError`], with the message, when the mailbox is closed (also while waiting).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is queued until the future resolves; dropping it while it waits drops
    /// the message.
    pub async fn send(&self, msg: M) -> Result<u64, SendError<M>> {
        let mut msg = Some(msg);
        self.retry_while_full(|| match self.try_send(msg.take()?) {
            Ok(id) => Some(Ok(id)),
            Err(TrySendError::Closed(m)) => Some(Err(SendError(m))),
            Err(TrySendError::Full(m)) => {
                msg = Some(m);
                None
            }
        })
        .await
    }

    /// Runs `attempt` until it returns `Some`, waiting between attempts until the ordinary lane may
    /// have room (a pop, a halt's clear, a close). `attempt` returns `None` for "full, try again":
    /// it is a `try_send` wrapped by the caller (e.g. under a lock of its own). [`Self::send`] is this
    /// with a bare `try_send`.
    ///
    /// No wake-up is missed: the waiter is registered before each attempt. The lanes (where the
    /// waiter registers) are allocated first, and the waker lock is taken and released between
    /// registering and the attempt; [`Self::close`] takes it between raising its flag and looking
    /// for the lanes. So either the close finds the lanes and wakes this waiter, or the attempt
    /// sees the close.
    ///
    /// # Cancel safety
    /// Cancel safe as long as `attempt` is: dropping the future between attempts leaves nothing
    /// registered and nothing sent.
    pub async fn retry_while_full<T>(&self, mut attempt: impl FnMut() -> Option<T>) -> T {
        let lanes = self.lanes();
        loop {
            let notified = lanes.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            lanes.waiting_senders.fetch_add(1, Ordering::SeqCst);
            drop(self.waker.lock());
            if let Some(done) = attempt() {
                lanes.waiting_senders.fetch_sub(1, Ordering::SeqCst);
                return done;
            }
            notified.await;
            lanes.waiting_senders.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Puts back, at the end of its lane, a message a previous process had accepted (a restart on a
    /// journal). Unlike [`Self::try_send`] it ignores the ordinary lane's capacity — an acknowledged
    /// message is never refused for room it had when it was accepted; new sends are refused until
    /// the lane drains below capacity.
    ///
    /// # Errors
    /// The message, handed back, when the mailbox is closed.
    pub fn requeue(&self, msg: M) -> Result<u64, M> {
        if self.closed.load(Ordering::Acquire) {
            return Err(msg);
        }
        let lane = msg.priority().index();
        let lanes = self.lanes();
        let id = Self::push_locked(lanes, &mut lanes.lanes[lane].lock(), lane, msg);
        self.schedule_wake();
        Ok(id)
    }

    /// Appends to `lane` (whose lock the caller holds as `q`) under a fresh id.
    fn push_locked(lanes: &Lanes<M>, q: &mut VecDeque<Envelope<M>>, lane: usize, msg: M) -> u64 {
        let id = lanes.next_id.fetch_add(1, Ordering::Relaxed);
        q.push_back(Envelope { id, msg });
        lanes.depth[lane].fetch_add(1, Ordering::Release);
        id
    }

    /// Asks the reader to drain (posts one `Wake` unless one is already pending).
    pub fn schedule_wake(&self) {
        // Always the swap (a read-modify-write reads the latest value), never a plain load first:
        // a load may read a stale `true` from before the reader's clear while the reader misses
        // this push — the store-buffering pattern, which the loom model found (a lost wake-up).
        // The swap and the reader's clearing swap are totally ordered: either the reader's clear
        // comes first (this swap reads `false` and posts a wake) or this one does (the reader's
        // swap reads it, synchronises with it and sees the push).
        if DEFERRED.with(std::cell::Cell::get) {
            return; // the host handle's batch: its pump calls this again, on warden's thread
        }
        self.schedule_wake_now();
    }

    /// [`PriorityMailbox::schedule_wake`], deferred or not (see `DEFERRED`).
    fn schedule_wake_now(&self) {
        if !self.wake_scheduled.swap(true, Ordering::AcqRel)
            && self.wake_locked(&mut self.waker.lock())
        {
            POSTED.with(|n| n.set(n.get() + 1));
        }
    }

    /// Wakes the attached reader, first starting it if it is passive (the started reader's sink
    /// takes the passive one's place). `false`: nothing attached, or a passive reader that could
    /// not be started (the wake stays flagged: whoever attaches a reader next is woken).
    fn wake_locked(&self, slot: &mut Option<Box<dyn WakeSink>>) -> bool {
        let Some(sink) = slot.as_ref() else {
            return false;
        };
        if self.passive.load(Ordering::SeqCst) {
            // Cleared before the reader is started (SeqCst: paired with a halt's flag, see
            // `is_passive`), so the started reader runs after it.
            self.passive.store(false, Ordering::SeqCst);
            let Some(started) = sink.activate() else {
                self.passive.store(true, Ordering::SeqCst);
                return false;
            };
            *slot = Some(started);
        }
        match slot.as_ref() {
            Some(sink) => {
                sink.wake();
                true
            }
            None => false,
        }
    }

    /// Connects (or reconnects, after a restart) the reader. Queued messages stay; a wake is posted
    /// if anything is queued or a sender flagged a wake before the reader was there.
    ///
    /// Race-free without a wake for an empty mailbox: the check runs under the waker lock, and a
    /// sender that flips `wake_scheduled` afterwards takes that lock and finds the new waker.
    pub fn attach(&self, waker: impl WakeSink) {
        self.attach_as(Box::new(waker), false);
    }

    /// Attaches a *passive* reader: `sink` stands for a reader that does not run yet, and
    /// [`WakeSink::activate`] starts it when the first message needs it (at once, if something is
    /// queued already). [`PriorityMailbox::has_reader`] is `true` from now on: a passive reader
    /// counts as ready.
    pub fn attach_passive(&self, sink: impl WakeSink) {
        self.reading.store(true, Ordering::Release);
        self.attach_as(Box::new(sink), true);
    }

    fn attach_as(&self, sink: Box<dyn WakeSink>, passive: bool) {
        let mut slot = self.waker.lock();
        *slot = Some(sink);
        self.passive.store(passive, Ordering::SeqCst);
        let queued = self.lanes_now().is_some_and(Lanes::queued);
        if queued || self.wake_scheduled.load(Ordering::Acquire) {
            self.wake_scheduled.store(true, Ordering::Release);
            self.wake_locked(&mut slot);
        }
    }

    /// The reader, idle, gives up running: if every lane is empty and no wake is pending, `sink`
    /// (a passive one: see [`WakeSink::activate`]) takes the reader's place and `true` is returned
    /// — the reader may stop, and the next message starts a new one. Otherwise nothing changes
    /// (`false`): a message came, or is on its way.
    ///
    /// Race-free against senders: the check and the swap run under the waker lock. A sender that
    /// pushed before the check is seen (its message in a lane, or its flipped wake flag); one whose
    /// flag flip comes after it takes the waker lock after this and finds the passive sink, which
    /// starts a reader (`actors/tests/loom_mailbox.rs` checks every interleaving).
    pub fn passivate(&self, sink: impl WakeSink) -> bool {
        let mut slot = self.waker.lock();
        let queued = self.lanes_now().is_some_and(Lanes::queued);
        if queued || self.wake_scheduled.load(Ordering::Acquire) {
            return false;
        }
        let reader = slot.replace(Box::new(sink));
        self.passive.store(true, Ordering::SeqCst);
        drop(slot);
        drop(reader);
        true
    }

    /// Whether the reader is passive (no reader runs; the next message starts one).
    ///
    /// SeqCst, as the store that ends passivity: a halt raises its agent's flag (SeqCst) and then
    /// reads this; an activation clears this and the reader it starts then reads the flag. In any
    /// interleaving either the halt sees the reader active, or the started reader sees the flag.
    pub fn is_passive(&self) -> bool {
        self.passive.load(Ordering::SeqCst)
    }

    /// A copy of the attached waker, if it is a `W` (e.g. the reader's address, to stop it).
    pub fn waker<W: WakeSink + Clone>(&self) -> Option<W> {
        let slot = self.waker.lock();
        let sink: &dyn std::any::Any = &**slot.as_ref()?;
        sink.downcast_ref::<W>().cloned()
    }

    /// The reader says it runs ([`PriorityMailbox::has_reader`] from now on). A waker may be
    /// attached before its reader runs (wakes posted to it wait for the reader).
    pub fn reader_started(&self) {
        self.reading.store(true, Ordering::Release);
    }

    /// Whether a reader has started (its actor started at least once), or a passive one is attached.
    pub fn has_reader(&self) -> bool {
        self.reading.load(Ordering::Acquire)
    }

    /// The reader is about to read (after [`PriorityMailbox::begin_drain`]). `false`: another
    /// thread has borrowed it ([`PriorityMailbox::borrow_idle_reader`]) — read nothing and
    /// wait: the borrow's end posts a wake. `true` also when the reader is inside already (it holds
    /// work across drains, as a running turn).
    pub fn enter_reader(&self) -> bool {
        self.reader.enter()
    }

    /// The reader is idle: it holds nothing between messages (no work it has not finished) until
    /// it enters again. A borrow may be taken from now on.
    pub fn leave_reader(&self) {
        self.reader.leave();
    }

    /// Borrows the reader while it is idle (not inside, nobody else borrowing, the mailbox open):
    /// until the returned borrow is dropped the reader reads nothing, and the caller may act on
    /// the agent as its reader would between two messages. `None`: the reader is inside (or
    /// another borrow is held, or the mailbox is closed) — send it a message instead.
    ///
    /// A borrow is short (a record change): a reader that comes meanwhile backs off, and the
    /// borrow's drop posts it a wake.
    pub fn borrow_idle_reader(&self) -> Option<BorrowedReader<'_, M>> {
        if self.is_closed() || !self.reader.lend() {
            return None;
        }
        Some(BorrowedReader { mailbox: self })
    }

    /// Called by the reader before it reads, on every `Wake`.
    pub fn begin_drain(&self) {
        // A swap, not a store: see `schedule_wake` (it synchronises with the last sender's swap, so
        // every push before that swap is visible to the pops that follow).
        self.wake_scheduled.swap(false, Ordering::AcqRel);
    }

    /// Marks a wake as pending without posting one (the reader re-notifies itself).
    pub fn mark_wake_pending(&self) {
        self.wake_scheduled.store(true, Ordering::Release);
    }

    fn pop_lane(&self, lane: usize) -> Option<Envelope<M>> {
        let lanes = self.lanes_now()?;
        if lanes.depth[lane].load(Ordering::Acquire) == 0 {
            return None;
        }
        let env = {
            let mut q = lanes.lanes[lane].lock();
            let env = q.pop_front()?;
            lanes.depth[lane].fetch_sub(1, Ordering::Release);
            env
        };
        if lane == Priority::Ordinary.index() && lanes.waiting_senders.load(Ordering::SeqCst) > 0 {
            lanes.space.notify_waiters();
        }
        Some(env)
    }

    /// The next message of the most urgent non-empty lane.
    pub fn pop(&self) -> Option<Envelope<M>> {
        (0..Priority::COUNT).find_map(|lane| self.pop_lane(lane))
    }

    /// The next message from a lane more urgent than `Ordinary` (used while the reader is busy).
    pub fn pop_urgent(&self) -> Option<Envelope<M>> {
        (0..Priority::Ordinary.index()).find_map(|lane| self.pop_lane(lane))
    }

    /// Takes the whole ordinary lane at once (O(1)); used by a halt.
    pub fn take_ordinary(&self) -> VecDeque<Envelope<M>> {
        let lane = Priority::Ordinary.index();
        let Some(lanes) = self.lanes_now() else {
            return VecDeque::new();
        };
        let taken = {
            let mut q = lanes.lanes[lane].lock();
            let taken = std::mem::take(&mut *q);
            lanes.depth[lane].fetch_sub(taken.len(), Ordering::Release);
            taken
        };
        if lanes.waiting_senders.load(Ordering::SeqCst) > 0 {
            lanes.space.notify_waiters();
        }
        taken
    }

    /// Whether a lane more urgent than `Ordinary` has a message.
    pub fn has_urgent(&self) -> bool {
        (0..Priority::Ordinary.index()).any(|lane| self.depth(lane) > 0)
    }

    /// Messages queued per lane.
    pub fn depths(&self) -> QueueDepths {
        let d = |p: Priority| self.depth(p.index());
        QueueDepths {
            system_halt: d(Priority::SystemHalt),
            control: d(Priority::Control),
            supervision: d(Priority::Supervision),
            ordinary: d(Priority::Ordinary),
        }
    }

    /// Refuses all further sends (queued messages stay readable). Wakes parked senders.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // The waker lock orders this against a parked sender's registration (see
        // `retry_while_full`): a sender that registered before it is found here and woken.
        let lanes = {
            let _order = self.waker.lock();
            self.lanes_now()
        };
        if let Some(lanes) = lanes {
            lanes.space.notify_waiters();
        }
    }

    /// Whether [`PriorityMailbox::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// A borrowed idle reader ([`PriorityMailbox::borrow_idle_reader`]); dropping it gives the reader
/// back, and wakes it if it came meanwhile.
#[must_use = "the reader is borrowed until this is dropped"]
pub struct BorrowedReader<'a, M: Prioritized> {
    mailbox: &'a PriorityMailbox<M>,
}

impl<M: Prioritized> std::fmt::Debug for BorrowedReader<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BorrowedReader").finish_non_exhaustive()
    }
}

impl<M: Prioritized> Drop for BorrowedReader<'_, M> {
    fn drop(&mut self) {
        if self.mailbox.reader.release() {
            // Not deferred by a host batch: nobody else knows this mailbox needs its wake.
            self.mailbox.schedule_wake_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    struct M(Priority, u32);
    impl Prioritized for M {
        fn priority(&self) -> Priority {
            self.0
        }
    }

    #[test]
    fn most_urgent_lane_first_fifo_within_a_lane() {
        let mb = PriorityMailbox::new(16);
        mb.try_send(M(Priority::Ordinary, 1)).unwrap();
        mb.try_send(M(Priority::Supervision, 2)).unwrap();
        mb.try_send(M(Priority::Ordinary, 3)).unwrap();
        mb.try_send(M(Priority::Control, 4)).unwrap();
        mb.try_send(M(Priority::SystemHalt, 5)).unwrap();
        mb.try_send(M(Priority::Control, 6)).unwrap();
        let order: Vec<u32> = std::iter::from_fn(|| mb.pop()).map(|e| e.msg.1).collect();
        assert_eq!(order, vec![5, 4, 6, 2, 1, 3]);
    }

    #[test]
    fn full_ordinary_lane_hands_the_message_back_and_never_blocks_urgent_lanes() {
        let mb = PriorityMailbox::new(2);
        mb.try_send(M(Priority::Ordinary, 1)).unwrap();
        mb.try_send(M(Priority::Ordinary, 2)).unwrap();
        assert_eq!(
            mb.try_send(M(Priority::Ordinary, 3)),
            Err(TrySendError::Full(M(Priority::Ordinary, 3)))
        );
        for i in 0..1000 {
            mb.try_send(M(Priority::SystemHalt, i)).unwrap();
            mb.try_send(M(Priority::Control, i)).unwrap();
        }
        let d = mb.depths();
        assert_eq!((d.system_halt, d.control, d.ordinary), (1000, 1000, 2));
    }

    #[test]
    fn pop_urgent_leaves_ordinary_work_queued() {
        let mb = PriorityMailbox::new(4);
        mb.try_send(M(Priority::Ordinary, 1)).unwrap();
        assert!(mb.pop_urgent().is_none());
        mb.try_send(M(Priority::Control, 2)).unwrap();
        assert_eq!(mb.pop_urgent().map(|e| e.msg.1), Some(2));
        assert_eq!(mb.depths().ordinary, 1);
    }

    #[test]
    fn take_ordinary_empties_the_lane_and_counts_stay_exact() {
        let mb = PriorityMailbox::new(100);
        for i in 0..10 {
            mb.try_send(M(Priority::Ordinary, i)).unwrap();
        }
        let taken = mb.take_ordinary();
        assert_eq!(taken.len(), 10);
        assert_eq!(mb.depths().ordinary, 0);
        assert!(mb.pop().is_none());
        let ids: Vec<u64> = taken.iter().map(|e| e.id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 10, "ids are unique");
    }

    #[test]
    fn requeue_ignores_capacity_keeps_order_and_new_sends_wait_for_room() {
        let mb = PriorityMailbox::new(2);
        for i in 0..4 {
            mb.requeue(M(Priority::Ordinary, i)).unwrap();
        }
        assert_eq!(mb.depths().ordinary, 4);
        assert!(matches!(
            mb.try_send(M(Priority::Ordinary, 9)),
            Err(TrySendError::Full(_))
        ));
        let order: Vec<u32> = std::iter::from_fn(|| mb.pop()).map(|e| e.msg.1).collect();
        assert_eq!(order, [0, 1, 2, 3]);
        mb.close();
        assert_eq!(
            mb.requeue(M(Priority::Ordinary, 5)),
            Err(M(Priority::Ordinary, 5))
        );
    }

    #[test]
    fn closed_mailbox_hands_the_message_back() {
        let mb = PriorityMailbox::new(4);
        mb.close();
        assert_eq!(
            mb.try_send(M(Priority::SystemHalt, 1)),
            Err(TrySendError::Closed(M(Priority::SystemHalt, 1)))
        );
    }

    #[tokio::test]
    async fn send_waits_for_space_and_completes_when_the_reader_pops() {
        let mb = std::sync::Arc::new(PriorityMailbox::new(1));
        mb.try_send(M(Priority::Ordinary, 1)).unwrap();
        let mb2 = mb.clone();
        let sender = tokio::spawn(async move { mb2.send(M(Priority::Ordinary, 2)).await.is_ok() });
        tokio::task::yield_now().await;
        assert!(
            !sender.is_finished(),
            "send must wait while the lane is full"
        );
        assert_eq!(mb.pop().map(|e| e.msg.1), Some(1));
        assert!(sender.await.unwrap());
        assert_eq!(mb.pop().map(|e| e.msg.1), Some(2));
    }

    #[tokio::test]
    async fn a_parked_sender_gets_its_message_back_when_the_mailbox_closes() {
        let mb = std::sync::Arc::new(PriorityMailbox::new(1));
        mb.try_send(M(Priority::Ordinary, 1)).unwrap();
        let mb2 = mb.clone();
        let sender = tokio::spawn(async move { mb2.send(M(Priority::Ordinary, 2)).await });
        tokio::task::yield_now().await;
        mb.close();
        assert_eq!(
            sender.await.unwrap(),
            Err(SendError(M(Priority::Ordinary, 2)))
        );
    }
}
