//! Loom models of the priority mailbox: every interleaving of the real mailbox code (its atomics and
//! lane locks come from loom under `--cfg warden_loom`, see `actors/src/sync.rs`).
//!
//! ```sh
//! RUSTFLAGS="--cfg warden_loom" cargo test -p warden-actors --test loom_mailbox --release
//! ```
//!
//! Not part of `cargo test`: without the cfg this file is empty.
#![cfg(warden_loom)]

use loom::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread,
};
use warden_actors::mailbox::{Prioritized, PriorityMailbox, WakeSink};
use warden_protocols::Priority;

#[derive(Debug, PartialEq)]
struct M(Priority, u32);

impl Prioritized for M {
    fn priority(&self) -> Priority {
        self.0
    }
}

/// Counts wakes posted; with `coalesced`, checks that at most one wake is outstanding (posted and
/// not yet consumed by the reader) at any time.
#[derive(Clone)]
struct Probe {
    posted: Arc<AtomicUsize>,
    outstanding: Arc<AtomicUsize>,
    coalesced: bool,
}

impl WakeSink for Probe {
    fn wake(&self) {
        self.posted.fetch_add(1, Ordering::SeqCst);
        let before = self.outstanding.fetch_add(1, Ordering::SeqCst);
        assert!(
            !self.coalesced || before == 0,
            "a second wake was posted before the first was read"
        );
    }
}

/// One drain round of the reader, if a wake is outstanding: consume it, clear the flag
/// (`begin_drain`), pop everything. The reader never waits (no spinning in the model).
fn drain_if_woken(mailbox: &PriorityMailbox<M>, probe: &Probe, got: &mut Vec<M>) {
    if probe.outstanding.load(Ordering::SeqCst) == 0 {
        return;
    }
    probe.outstanding.fetch_sub(1, Ordering::SeqCst);
    mailbox.begin_drain();
    while let Some(envelope) = mailbox.pop() {
        got.push(envelope.msg);
    }
}

/// At quiescence (every sender done): a message still queued has a wake outstanding — the reader
/// will come back for it. Then drains everything.
fn settle(mailbox: &PriorityMailbox<M>, probe: &Probe, got: &mut Vec<M>) {
    let queued = mailbox.depths();
    if queued.system_halt + queued.control + queued.supervision + queued.ordinary > 0 {
        assert!(
            probe.outstanding.load(Ordering::SeqCst) > 0,
            "a message is queued ({queued:?}) and no wake is outstanding: a lost wake-up"
        );
    }
    while probe.outstanding.load(Ordering::SeqCst) > 0 {
        drain_if_woken(mailbox, probe, got);
    }
}

fn probe() -> Probe {
    Probe {
        posted: Arc::new(AtomicUsize::new(0)),
        outstanding: Arc::new(AtomicUsize::new(0)),
        coalesced: true,
    }
}

/// Two senders on two lanes and a draining reader: no wake-up is lost (every message is read),
/// wakes are coalesced (never two outstanding), and each message is read exactly once.
#[test]
fn no_wake_is_lost_and_wakes_are_coalesced() {
    loom::model(|| {
        let mailbox = Arc::new(PriorityMailbox::new(4));
        let probe = probe();
        mailbox.attach(probe.clone());
        let senders: Vec<_> = [(Priority::Ordinary, 1), (Priority::SystemHalt, 2)]
            .into_iter()
            .map(|(lane, n)| {
                let mailbox = mailbox.clone();
                thread::spawn(move || mailbox.try_send(M(lane, n)).expect("room"))
            })
            .collect();
        let mut got = Vec::new();
        drain_if_woken(&mailbox, &probe, &mut got);
        for sender in senders {
            sender.join().expect("sender");
        }
        settle(&mailbox, &probe, &mut got);
        got.sort_by_key(|m| m.1);
        assert_eq!(got, [M(Priority::Ordinary, 1), M(Priority::SystemHalt, 2)]);
        assert!(mailbox.pop().is_none());
    });
}

/// A reader attached after a sender flagged a wake still gets one (the attach checks under the
/// waker lock), so a message sent before the actor started is read. (Here a second wake may be
/// posted — the attach's and the sender's, when the sender takes the waker lock after the attach —
/// which costs the reader one empty drain; coalescing is not checked.)
#[test]
fn a_message_sent_before_the_reader_attached_is_read() {
    loom::model(|| {
        let mailbox = Arc::new(PriorityMailbox::new(4));
        let probe = Probe {
            coalesced: false,
            ..probe()
        };
        let sender = {
            let mailbox = mailbox.clone();
            thread::spawn(move || mailbox.try_send(M(Priority::Control, 7)).expect("room"))
        };
        mailbox.attach(probe.clone());
        let mut got = Vec::new();
        drain_if_woken(&mailbox, &probe, &mut got);
        sender.join().expect("sender");
        settle(&mailbox, &probe, &mut got);
        assert_eq!(got, [M(Priority::Control, 7)]);
    });
}

/// With both lanes filled before the reader looks, the halt lane is read first.
#[test]
fn the_halt_lane_is_read_before_ordinary_work() {
    loom::model(|| {
        let mailbox = Arc::new(PriorityMailbox::new(4));
        let probe = probe();
        mailbox.attach(probe.clone());
        let sender = {
            let mailbox = mailbox.clone();
            thread::spawn(move || {
                mailbox.try_send(M(Priority::Ordinary, 1)).expect("room");
                mailbox.try_send(M(Priority::SystemHalt, 2)).expect("room");
            })
        };
        sender.join().expect("sender");
        let mut got = Vec::new();
        settle(&mailbox, &probe, &mut got);
        assert_eq!(got, [M(Priority::SystemHalt, 2), M(Priority::Ordinary, 1)]);
    });
}

/// A passive reader's sink: starting the reader wakes `next` (the new reader).
#[derive(Clone)]
struct Starter {
    next: Probe,
    started: Arc<AtomicUsize>,
}

impl WakeSink for Starter {
    fn wake(&self) {
        panic!("a passive sink is activated, never woken");
    }

    fn activate(&self) -> Option<Box<dyn WakeSink>> {
        self.started.fetch_add(1, Ordering::SeqCst);
        Some(Box::new(self.next.clone()))
    }
}

/// A send racing passivation (issue 36): the idle reader gives up its place
/// (`PriorityMailbox::passivate`) while a sender pushes. Either the passivation is refused and the
/// running reader has a wake for the message, or it succeeds with no wake left for the stopping
/// reader (which is never woken again) and the message starts exactly one new reader, which reads
/// it. In no interleaving is the message left queued with nobody to read it.
#[test]
fn a_send_racing_passivation_is_read_by_the_reader_or_starts_a_new_one() {
    loom::model(|| {
        let mailbox = Arc::new(PriorityMailbox::new(4));
        let first = probe();
        mailbox.attach(first.clone());
        let starter = Starter {
            next: probe(),
            started: Arc::new(AtomicUsize::new(0)),
        };
        let sender = {
            let mailbox = mailbox.clone();
            thread::spawn(move || mailbox.try_send(M(Priority::Ordinary, 1)).expect("room"))
        };
        let mut got = Vec::new();
        drain_if_woken(&mailbox, &first, &mut got);
        let passive = mailbox.passivate(starter.clone());
        let posted_to_first = first.posted.load(Ordering::SeqCst);
        if passive {
            assert_eq!(
                first.outstanding.load(Ordering::SeqCst),
                0,
                "passivated with a wake still on its way to the stopping reader"
            );
        }
        sender.join().expect("sender");
        if passive {
            assert_eq!(
                first.posted.load(Ordering::SeqCst),
                posted_to_first,
                "the stopped reader was woken"
            );
            settle(&mailbox, &starter.next, &mut got);
            let started = starter.started.load(Ordering::SeqCst);
            assert!(started <= 1, "one message started {started} readers");
            assert_eq!(mailbox.is_passive(), started == 0);
        } else {
            assert_eq!(starter.started.load(Ordering::SeqCst), 0);
            settle(&mailbox, &first, &mut got);
        }
        assert_eq!(got, [M(Priority::Ordinary, 1)]);
        assert!(mailbox.pop().is_none());
    });
}

/// [`drain_if_woken`] as the agent's actor drains: entering as the reader first, and reading
/// nothing when another thread has borrowed it (the borrow's end wakes it again).
fn drain_as_reader(
    mailbox: &PriorityMailbox<M>,
    probe: &Probe,
    got: &mut Vec<M>,
    reading: &AtomicBool,
    borrowed: &AtomicBool,
) {
    if probe.outstanding.load(Ordering::SeqCst) == 0 {
        return;
    }
    probe.outstanding.fetch_sub(1, Ordering::SeqCst);
    mailbox.begin_drain();
    if !mailbox.enter_reader() {
        return;
    }
    reading.store(true, Ordering::SeqCst);
    assert!(
        !borrowed.load(Ordering::SeqCst),
        "the reader read while another thread had borrowed it"
    );
    while let Some(envelope) = mailbox.pop() {
        got.push(envelope.msg);
    }
    reading.store(false, Ordering::SeqCst);
    mailbox.leave_reader();
}

/// An operator's halt applied on the halting thread (issue 36, item 3) borrows the idle reader
/// while a sender wakes it: the reader and the borrower are never inside together, and a reader
/// that came during the borrow (and read nothing) is woken when it ends — the message is read, no
/// wake is lost, and wakes stay coalesced.
#[test]
fn a_borrowed_idle_reader_is_excluded_and_woken_after() {
    loom::model(|| {
        let mailbox = Arc::new(PriorityMailbox::new(4));
        let probe = probe();
        mailbox.attach(probe.clone());
        let reading = Arc::new(AtomicBool::new(false));
        let borrowed = Arc::new(AtomicBool::new(false));
        let borrower = {
            let (mailbox, reading, borrowed) = (mailbox.clone(), reading.clone(), borrowed.clone());
            thread::spawn(move || {
                let Some(borrow) = mailbox.borrow_idle_reader() else {
                    return false;
                };
                borrowed.store(true, Ordering::SeqCst);
                assert!(
                    !reading.load(Ordering::SeqCst),
                    "a borrow was taken while the reader read"
                );
                borrowed.store(false, Ordering::SeqCst);
                drop(borrow);
                true
            })
        };
        let sender = {
            let mailbox = mailbox.clone();
            thread::spawn(move || mailbox.try_send(M(Priority::Control, 1)).expect("room"))
        };
        let mut got = Vec::new();
        drain_as_reader(&mailbox, &probe, &mut got, &reading, &borrowed);
        borrower.join().expect("borrower");
        sender.join().expect("sender");
        let queued = mailbox.depths();
        if queued.control > 0 {
            assert!(
                probe.outstanding.load(Ordering::SeqCst) > 0,
                "a message is queued and no wake is outstanding: the reader was left behind"
            );
        }
        while probe.outstanding.load(Ordering::SeqCst) > 0 {
            drain_as_reader(&mailbox, &probe, &mut got, &reading, &borrowed);
        }
        assert_eq!(got, [M(Priority::Control, 1)]);
        assert!(
            mailbox.borrow_idle_reader().is_some(),
            "the reader stayed borrowed"
        );
    });
}
