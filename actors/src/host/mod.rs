//! The host handle: warden on threads of its own, driven from any thread of the host's.
//!
//! A game server must never call a model on its tick thread: the tick decides, the model call runs
//! elsewhere, the result comes back tagged. [`Warden::start`] runs the actor system (an actix
//! `System` and every agent) on a dedicated thread and returns a [`WardenHandle`]: `Clone + Send +
//! Sync + 'static`, with no actix type in its signatures, usable from a tokio task, a frame loop or
//! a plain `std::thread` (no runtime needed on the caller's thread).
//!
//! * [`WardenHandle::try_deliver`] classifies a world event for an NPC and queues it when it is a
//!   TRIGGER, synchronously: the event's id, or the event handed back with why
//!   ([`DeliverError`]: unknown, busy, halted, locked out, shut down).
//! * [`WardenHandle::deliver_batch`] does the same for many events and costs the host's thread at
//!   most one cross-thread wake for the whole batch (the agents' wake-ups are posted by warden's
//!   own thread; [`HostStats::wakes`] counts them). While the host keeps delivering, none: the
//!   pump polls (see *Threads* below). Not yet deferred: a TRIGGER for an NPC with
//!   autonomous ticks also notifies the tick timer on warden's thread directly.
//! * [`WardenHandle::drain_replies`] moves settled events ([`NpcReply`]: the NPC's line or why
//!   there is none, with its event id and halt epoch) into the host's buffer without blocking.
//! * [`WardenHandle::halt_all`] raises every agent's halt at once (priority 0) before it returns,
//!   journaled with the host's reason; [`WardenHandle::halt_all_acked`] also waits for the
//!   acknowledgements; [`WardenHandle::resume_all`] queues every NPC's resume.
//! * [`WardenHandle::spawn`] adds an NPC to the running team; an agent spawned after start by
//!   any means (the admin API beside the host, a task of the setup's) is reachable too.
//! * [`WardenHandle::stats`] reads counters (atomics).
//! * Async hosts: [`WardenHandle::deliver`] (waits for room in the lane) and
//!   [`WardenHandle::next_reply`].
//!
//! [`Warden::start_with`] sets the team up with a closure on warden's thread instead of specs (a
//! team file's agents, presence, the game hour).
//!
//! [`WardenHandle::shutdown`], or dropping the last handle, stops the team and joins the thread;
//! a process may start and stop warden any number of times.
//!
//! # Halt epochs
//! Every agent counts its halts (its *halt epoch*). A reply is tagged with the epoch its event was
//! delivered under and marked [`NpcReply::stale`] when the agent has been halted since: a host
//! that halted its NPCs drops the stale replies, and never shows a line from before the halt as
//! if it were current. (An event delivered while a halt *and* a resume both happen during the one
//! call may be tagged with the earlier epoch: reported stale, never the other way round.)
//!
//! # What a host call may wait on
//! No host call performs I/O or waits on a lock that is held across I/O or across an `.await`.
//! The locks a host call can take, all `parking_lot` mutexes held for a few instructions:
//! * the agent's record lock and its mailbox's lane lock (queueing, as
//!   [`crate::AgentHandle::try_send_event`]; see the `agent` and `mailbox` lock orders), its
//!   classifier state lock, and the journal's append (in memory; the SQLite journal hands the
//!   batch to its writer thread, whose I/O holds none of these);
//! * `marks` (one per agent: where its halt epoch changed) — a leaf, taken only when an epoch
//!   changed and by the drain;
//! * `pending` (the pump's list of mailboxes to wake) — a leaf;
//! * `replies` (the receiving end of the team's reply stream) — a leaf, held by
//!   [`WardenHandle::drain_replies`] for its `try_recv` loop and by [`WardenHandle::next_reply`]
//!   for one poll, never across an `.await` (it polls under the lock inside `poll_fn`).
//!
//! Lock order: `marks` → record → lane (when an epoch changes, the delivery is queued under
//! `marks`, so a drain that reads the mark waits for the queueing rather than reading an old one);
//! `replies` → `marks` (the drain tags replies). `pending` is never held with another.
//!
//! # Threads
//! One thread, `warden`, runs the actix `System` with every agent on it (model calls are I/O: one
//! thread serves many agents), the SafetyMonitor, the tick arbiter, the task that runs
//! [`WardenHandle::spawn`]'s spawns, and the *pump*: the task that posts the host's wake-ups,
//! polling every millisecond while deliveries come and parked after 200 ms without one.

mod error;
mod handle;

pub use error::{AddError, DeliverError, StartError};
pub use handle::{Delivered, HostStats, NpcReply, WardenHandle};

use crate::{agent::cell::AgentCell, journal::Journal, AgentSpec, Supervisor};
use handle::{HostAgent, Shared};
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    sync::{
        atomic::{fence, AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use warden_protocols::WardenConfig;

/// An event's id: unique per agent, growing (as [`crate::AgentHandle::try_send_event`] returns).
pub type EventId = u64;

/// A spawn, run on warden's thread ([`WardenHandle::spawn`]).
type SpawnJob = Box<dyn FnOnce() + Send>;

/// Starts warden on threads of its own; see the [module docs](self).
#[derive(Debug)]
pub struct Warden;

impl Warden {
    /// Starts an actix `System` on a new thread (`warden`), builds the team there with `config`
    /// and `journal`, spawns `agents` (in order) and returns the handle once they are spawned.
    ///
    /// # Errors
    /// [`StartError::Spawn`] when an agent cannot be spawned (then nothing keeps running: the
    /// team is shut down and the thread joined); [`StartError::Thread`] when the thread cannot be
    /// started; [`StartError::Died`] when it ends (panics) before it is ready.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use warden_actors::{host::Warden, AgentSpec, MemoryJournal, ScriptStep, ScriptedProvider};
    /// use warden_protocols::{npc::{WorldEvent, WorldEventKind}, WardenConfig};
    ///
    /// // No runtime on this thread: warden brings its own.
    /// let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("Welcome, traveller.")]));
    /// let warden = Warden::start(
    ///     WardenConfig::default(),
    ///     Arc::new(MemoryJournal::new()),
    ///     [AgentSpec::assistant("innkeeper", model)],
    /// )?;
    /// let hello = WorldEvent::player("p1", WorldEventKind::Whisper, "a room for the night?");
    /// let delivered = warden.try_deliver("innkeeper", hello)?;
    /// let mut replies = Vec::new();
    /// while replies.is_empty() {
    ///     warden.drain_replies(&mut replies, 16); // never blocks: a real host does this once a frame
    ///     std::thread::sleep(std::time::Duration::from_millis(1));
    /// }
    /// assert_eq!(Some(replies[0].event_id), delivered.event_id);
    /// assert_eq!(replies[0].text(), Some("Welcome, traveller."));
    /// warden.shutdown();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(
        config: WardenConfig,
        journal: Arc<dyn Journal>,
        agents: impl IntoIterator<Item = AgentSpec>,
    ) -> Result<WardenHandle, StartError> {
        let agents: Vec<AgentSpec> = agents.into_iter().collect();
        Self::start_with(config, journal, move |team| {
            for spec in agents {
                team.spawn(spec)?;
            }
            Ok(())
        })
    }

    /// [`Warden::start`], with the team set up by `setup`, which runs on warden's thread inside
    /// the actix `System`: spawn agents there (a team file's: `TeamFile::spawn_agents` of the
    /// `warden` crate's `server` feature), set presence or the game hour. Every agent the team has
    /// when `setup` returns is reachable through the handle.
    ///
    /// # Errors
    /// What `setup` returns (then nothing keeps running: the team is shut down and the thread
    /// joined; [`StartError::Setup`] wraps any error); [`StartError::Thread`], [`StartError::Died`]
    /// as [`Warden::start`].
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{host::{StartError, Warden}, AgentSpec, MemoryJournal, ScriptedProvider};
    /// # use warden_protocols::WardenConfig;
    /// let warden = Warden::start_with(WardenConfig::default(), Arc::new(MemoryJournal::new()), |team| {
    ///     team.spawn(AgentSpec::assistant("smith", Arc::new(ScriptedProvider::new([]))))?;
    ///     team.set_game_hour(9.0);
    ///     Ok(())
    /// })?;
    /// assert_eq!(warden.stats().agents, 1);
    /// # Ok::<(), StartError>(())
    /// ```
    pub fn start_with(
        config: WardenConfig,
        journal: Arc<dyn Journal>,
        setup: impl FnOnce(&Supervisor) -> Result<(), StartError> + Send + 'static,
    ) -> Result<WardenHandle, StartError> {
        Self::spawn_thread(config, journal, setup, Clock::Real)
    }

    /// [`Warden::start_with`] on *paused* time (feature `test-util`, for a host's tests): warden's
    /// runtime starts with tokio's clock paused, so whenever warden's thread has nothing to do its
    /// clock jumps to the next timer. A scripted model's latency ([`crate::ScriptStep::delayed`],
    /// [`crate::Latency`]) then costs no wall time — a test of a host against NPCs that take
    /// 30 s per answer runs in milliseconds, with every reply's `latency` still 30 s — and the
    /// order in which one NPC's events are answered is the order they were delivered. The host's
    /// own thread keeps real time: drain in a loop with a wall-clock deadline, as `tests/host.rs`
    /// does.
    ///
    /// # Errors
    /// As [`Warden::start_with`].
    #[cfg(feature = "test-util")]
    pub fn start_paused(
        config: WardenConfig,
        journal: Arc<dyn Journal>,
        setup: impl FnOnce(&Supervisor) -> Result<(), StartError> + Send + 'static,
    ) -> Result<WardenHandle, StartError> {
        Self::spawn_thread(config, journal, setup, Clock::Paused)
    }

    fn spawn_thread(
        config: WardenConfig,
        journal: Arc<dyn Journal>,
        setup: impl FnOnce(&Supervisor) -> Result<(), StartError> + Send + 'static,
        clock: Clock,
    ) -> Result<WardenHandle, StartError> {
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("warden".into())
            .spawn(move || run(config, journal, setup, thread_stop, ready_tx, clock))?;
        match ready_rx.recv() {
            Ok(Ok(shared)) => Ok(WardenHandle::new(shared, stop, thread)),
            Ok(Err(err)) => {
                let _ = thread.join();
                Err(err)
            }
            Err(_) => {
                let _ = thread.join();
                Err(StartError::Died)
            }
        }
    }
}

type Ready = std::sync::mpsc::SyncSender<Result<Arc<Shared>, StartError>>;

/// warden's clock: real, or paused ([`Warden::start_paused`]).
#[derive(Clone, Copy)]
enum Clock {
    Real,
    #[cfg(feature = "test-util")]
    Paused,
}

/// warden's thread: the System, the team, the pump; returns once `stop` is cancelled and the team
/// is shut down.
fn run(
    config: WardenConfig,
    journal: Arc<dyn Journal>,
    setup: impl FnOnce(&Supervisor) -> Result<(), StartError>,
    stop: CancellationToken,
    ready: Ready,
    clock: Clock,
) {
    let system = match clock {
        Clock::Real => actix_rt::System::new(),
        #[cfg(feature = "test-util")]
        Clock::Paused => actix_rt::System::with_tokio_rt(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("a current-thread runtime")
        }),
    };
    system.block_on(async move {
        let team = Supervisor::on_current_arbiter(config, journal);
        let replies = team.take_replies();
        if let Err(err) = setup(&team) {
            team.shutdown().await;
            let _ = ready.send(Err(err));
            return;
        }
        let agents: HashMap<_, _> = team
            .agents()
            .into_iter()
            .map(|handle| (handle.key().clone(), Arc::new(HostAgent::new(handle))))
            .collect();
        let Some(replies) = replies else {
            // A fresh team's stream is untaken: unreachable, but never a panic on this thread.
            team.shutdown().await;
            return;
        };
        let (spawns, mut spawn_rx) = tokio::sync::mpsc::unbounded_channel::<SpawnJob>();
        let shared = Arc::new(Shared::new(
            team.clone(),
            agents,
            replies,
            spawns,
            stop.clone(),
        ));
        // Spawns from the handle run here, on warden's thread (an actor starts on its arbiter).
        actix_rt::spawn(async move {
            while let Some(job) = spawn_rx.recv().await {
                job();
            }
        });
        if ready.send(Ok(shared.clone())).is_err() {
            team.shutdown().await;
            return;
        }
        pump(&shared.pump, &stop).await;
        shared.closing();
        team.shutdown().await;
    });
}

/// The mailboxes the host's calls queued to without waking their readers, and the wake that
/// tells warden's thread to wake them — posted only when warden's thread is parked.
///
/// While deliveries keep coming, the pump *polls*: it looks at `pending` every [`POLL`] on
/// warden's own timer, so a host call only pushes to the list and reads `parked`, with no
/// cross-thread wake at all (a wake is a futex or eventfd write, and on a busy machine the woken
/// thread may preempt the caller: the tail of the host's call). After [`IDLE`] without a delivery
/// the pump parks, and the next hand-over posts one wake. The price: a delivery waits up to
/// `POLL` for warden's thread to look (nothing next to a model call), and warden's thread wakes
/// every `POLL` while the host delivers.
#[derive(Default)]
pub(super) struct Pump {
    pending: Mutex<Vec<Arc<AgentCell>>>,
    notify: Notify,
    /// The pump waits on `notify` (not polling): a hand-over must wake it.
    parked: AtomicBool,
}

/// How often the pump looks at `pending` while deliveries come.
const POLL: Duration = Duration::from_millis(1);
/// How long the pump polls without finding anything before it parks.
const IDLE: Duration = Duration::from_millis(200);

impl Pump {
    /// Hands `cells` to the pump; returns whether this posted a cross-thread wake (only when the
    /// pump is parked).
    pub(super) fn hand_over(&self, cells: &mut Vec<Arc<AgentCell>>) -> bool {
        if cells.is_empty() {
            return false;
        }
        self.pending.lock().append(cells);
        self.wake_if_parked()
    }

    /// [`Pump::hand_over`] for one cell (no vector to fill: a single delivery allocates nothing).
    pub(super) fn hand_over_one(&self, cell: Arc<AgentCell>) -> bool {
        self.pending.lock().push(cell);
        self.wake_if_parked()
    }

    fn wake_if_parked(&self) -> bool {
        // Dekker with the pump's park: either it sees the cells when it checks after raising
        // `parked`, or this load sees `parked` and wakes it (`Notify` keeps the permit).
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) && self.parked.swap(false, Ordering::SeqCst) {
            self.notify.notify_one();
            return true;
        }
        false
    }
}

/// Posts the wake-ups of every hand-over, until `stop`.
async fn pump(pump: &Pump, stop: &CancellationToken) {
    let mut idle = Duration::ZERO;
    // Swapped with `pending`: the two buffers keep their capacity, a host push never allocates.
    let mut cells = Vec::new();
    loop {
        std::mem::swap(&mut *pump.pending.lock(), &mut cells);
        if cells.is_empty() {
            idle += POLL;
        } else {
            idle = Duration::ZERO;
        }
        // One mailbox may appear many times: after the first, `schedule_wake` finds a wake pending.
        for cell in cells.drain(..) {
            cell.mailbox.schedule_wake();
        }
        if idle >= IDLE {
            pump.parked.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !pump.pending.lock().is_empty() {
                pump.parked.store(false, Ordering::SeqCst);
                continue;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = pump.notify.notified() => {}
            }
            pump.parked.store(false, Ordering::SeqCst);
            idle = Duration::ZERO;
        } else {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(POLL) => {}
            }
        }
    }
}

// The handle must stay usable from any thread of the host's.
const _: fn() = || {
    fn is<T: Clone + Send + Sync + 'static>() {}
    is::<WardenHandle>();
};
