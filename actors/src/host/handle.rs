//! [`WardenHandle`]: the host's calls, and the state they share with warden's thread.

// A refused delivery hands its `WorldEvent` back by value (as tokio's `TrySendError` does): a
// move of ~170 bytes, where boxing it would allocate on the path a busy frame loop takes most.
#![allow(clippy::result_large_err)]

use super::{AddError, DeliverError, EventId, Pump, SpawnJob};
use crate::{
    agent::{cell::AgentCell, reply::Settlement},
    mailbox::{defer_wakes, wakes_posted_here},
    AgentHandle, AgentSpec, HaltAck, Settled, Supervisor,
};
use parking_lot::{Mutex, RwLock};
use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use warden_protocols::{
    npc::{Verdict, WorldEvent},
    AgentKey, HaltCause,
};

/// What [`WardenHandle::try_deliver`] did with a world event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// The classification (journaled as `perceived`): only a TRIGGER is queued and gets a reply;
    /// a CONTEXT is folded into the NPC's next turn, an IGNORE dropped.
    pub verdict: Verdict,
    /// For a TRIGGER: the id its reply will carry ([`NpcReply::event_id`]).
    pub event_id: Option<EventId>,
    /// The NPC's halt epoch the event was delivered under ([`NpcReply::halt_epoch`]).
    pub halt_epoch: u64,
}

/// One settled event: the NPC's line, or why there is none, tagged with its event id and the halt
/// epoch it was delivered under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpcReply {
    /// The NPC.
    pub agent: AgentKey,
    /// The event's id ([`Delivered::event_id`]).
    pub event_id: EventId,
    /// The NPC's halt epoch when the event was delivered.
    pub halt_epoch: u64,
    /// The NPC was halted after the event was delivered (its halt epoch moved on): the reply is
    /// from before the halt, and a host that halted its NPCs drops it.
    pub stale: bool,
    /// The answer ([`crate::Reply`]: the line, the tokens, the latency), or why there is none
    /// ([`crate::AskError`]: refused, discarded by a halt, failed, the NPC gone).
    pub result: Settled,
}

impl NpcReply {
    /// The NPC's line, if it answered.
    pub fn text(&self) -> Option<&str> {
        self.result.as_ref().ok().map(|reply| reply.answer.as_str())
    }
}

/// The handle's counters ([`WardenHandle::stats`]); cumulative since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// NPCs the team has.
    pub agents: usize,
    /// World events delivered (classified; TRIGGERs queued).
    pub delivered: u64,
    /// World events handed back ([`DeliverError`]).
    pub refused: u64,
    /// Replies drained ([`WardenHandle::drain_replies`], [`WardenHandle::next_reply`]).
    pub replies: u64,
    /// Cross-thread wakes the host's calls posted: at most one per [`WardenHandle::try_deliver`] or
    /// [`WardenHandle::deliver_batch`], and none while warden's thread is polling (the host
    /// delivered within the last 200 ms).
    pub wakes: u64,
    /// Batches delivered.
    pub batches: u64,
    /// [`WardenHandle::halt_all`] calls.
    pub halts: u64,
    /// Resumes queued by [`WardenHandle::resume_all`] (one per NPC it was sent to).
    pub resumes: u64,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    refused: AtomicU64,
    replies: AtomicU64,
    wakes: AtomicU64,
    batches: AtomicU64,
    halts: AtomicU64,
    resumes: AtomicU64,
}

/// One NPC, as the host sees it: its handle and where its halt epoch changed.
pub(super) struct HostAgent {
    handle: AgentHandle,
    /// `(first event id, halt epoch)`: events from that id on were delivered under that epoch
    /// (until the next mark). One entry per halt the NPC went through, at most.
    marks: Mutex<Vec<(EventId, u64)>>,
    /// The epoch of the last mark (the fast path: no lock while it is current).
    marked: AtomicU64,
}

impl HostAgent {
    pub(super) fn new(handle: AgentHandle) -> Self {
        let epoch = handle.cell.halt_epoch();
        HostAgent {
            handle,
            marks: Mutex::new(vec![(0, epoch)]),
            marked: AtomicU64::new(epoch),
        }
    }

    fn cell(&self) -> &Arc<AgentCell> {
        &self.handle.cell
    }

    /// The epoch event `id` was delivered under.
    fn epoch_of(&self, id: EventId) -> u64 {
        let marks = self.marks.lock();
        marks
            .iter()
            .rev()
            .find(|(from, _)| *from <= id)
            .map_or(0, |&(_, epoch)| epoch)
    }
}

/// What the handles share with warden's thread.
pub(super) struct Shared {
    team: Supervisor,
    /// The NPCs the host has reached, by key (a leaf lock, read on every delivery: an agent
    /// spawned after start is added on its first lookup, from the team's registry).
    agents: RwLock<HashMap<AgentKey, Arc<HostAgent>>>,
    /// The team's reply stream (a leaf lock; never held across an `.await`).
    replies: Mutex<UnboundedReceiver<Settlement>>,
    /// The team's notices ([`crate::Notice`]; a leaf lock, taken at start: `None` if another
    /// taker had them).
    notices: Mutex<Option<UnboundedReceiver<crate::agent::Notice>>>,
    pub(super) pump: Pump,
    /// Spawns for warden's thread ([`WardenHandle::spawn`]).
    spawns: tokio::sync::mpsc::UnboundedSender<SpawnJob>,
    stop: CancellationToken,
    closed: AtomicBool,
    counters: Counters,
}

impl Shared {
    pub(super) fn new(
        team: Supervisor,
        agents: HashMap<AgentKey, Arc<HostAgent>>,
        replies: UnboundedReceiver<Settlement>,
        spawns: tokio::sync::mpsc::UnboundedSender<SpawnJob>,
        stop: CancellationToken,
    ) -> Self {
        let notices = team.take_notices();
        Shared {
            team,
            agents: RwLock::new(agents),
            replies: Mutex::new(replies),
            notices: Mutex::new(notices),
            pump: Pump::default(),
            spawns,
            stop,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// From now on every delivery is refused as `Shutdown`.
    pub(super) fn closing(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// The NPC with that key: one the host reached before, or one spawned since start (by
    /// [`WardenHandle::spawn`], the admin API, a task of the setup's), found in the team's registry
    /// and remembered.
    fn agent(&self, key: &str) -> Option<Arc<HostAgent>> {
        if let Some(agent) = self.agents.read().get(key) {
            return Some(agent.clone());
        }
        let handle = self.team.get(key)?;
        let mut agents = self.agents.write();
        let agent = agents
            .entry(handle.key().clone())
            .or_insert_with(|| Arc::new(HostAgent::new(handle)));
        Some(agent.clone())
    }

    /// Classifies `event` for `key` and queues it if it is a TRIGGER; `woken` gets the agent's
    /// cell when it queued (the event, or the signal to write an observation — also for a refused
    /// TRIGGER). An out-parameter, not a tuple with the result: the result holds the world event,
    /// and a bigger return value costs every delivery one more copy of it.
    fn deliver(
        &self,
        key: &str,
        event: WorldEvent,
        woken: &mut Option<Arc<AgentCell>>,
    ) -> Result<Delivered, DeliverError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(DeliverError::Shutdown(event));
        }
        let Some(agent) = self.agent(key) else {
            return Err(DeliverError::Unknown(event));
        };
        let cell = agent.cell();
        // The epoch before the flag: a halt after this read makes the event stale (or refused).
        let epoch = cell.halt_epoch();
        if cell.halt_requested() {
            return Err(DeliverError::Halted(event));
        }
        let perceived = if agent.marked.load(Ordering::Acquire) == epoch {
            agent.handle.perceive_cow(Cow::Borrowed(&event))
        } else {
            // The epoch moved on: mark where, queueing under `marks` so that a drain that reads
            // the mark never sees this event's reply before it.
            let mut marks = agent.marks.lock();
            let perceived = agent.handle.perceive_cow(Cow::Borrowed(&event));
            if let Ok(crate::Perceived {
                queued: Some(id), ..
            }) = &perceived
            {
                if marks.last().is_none_or(|&(_, last)| last < epoch) {
                    marks.push((*id, epoch));
                    agent.marked.store(epoch, Ordering::Release);
                }
            }
            perceived
        };
        match perceived {
            Ok(seen) => {
                // Queued work, or a `Remember` signal: the pump wakes the agent.
                if seen.queued.is_some() || seen.reminded {
                    *woken = Some(agent.cell().clone());
                }
                Ok(Delivered {
                    verdict: seen.perception.verdict,
                    event_id: seen.queued,
                    halt_epoch: epoch,
                })
            }
            Err(rejected) => {
                if rejected.reminded {
                    *woken = Some(agent.cell().clone());
                }
                Err(DeliverError::refused(event, rejected.refusal))
            }
        }
    }

    fn count(&self, result: &Result<Delivered, DeliverError>) {
        let counter = match result {
            Ok(_) => &self.counters.delivered,
            Err(_) => &self.counters.refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A settlement as the host sees it: tagged with its delivery epoch.
    fn tag(&self, settled: Settlement) -> NpcReply {
        let (halt_epoch, now) = self.agent(settled.agent.as_str()).map_or((0, 0), |agent| {
            (agent.epoch_of(settled.id), agent.cell().halt_epoch())
        });
        self.counters.replies.fetch_add(1, Ordering::Relaxed);
        NpcReply {
            agent: settled.agent,
            event_id: settled.id,
            halt_epoch,
            stale: now > halt_epoch,
            result: settled.result,
        }
    }
}

/// Stops warden's thread when the last handle goes.
struct Owner {
    stop: CancellationToken,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Owner {
    fn stop_and_join(&self) {
        self.stop.cancel();
        let Some(thread) = self.thread.lock().take() else {
            return;
        };
        if thread.thread().id() == std::thread::current().id() {
            return; // the last handle dropped on warden's own thread: it ends by itself
        }
        if thread.join().is_err() {
            tracing::error!("warden's thread panicked");
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The host's handle on a running warden ([`super::Warden::start`]). Cheap to clone; `Send`,
/// `Sync` and `'static`. The synchronous calls never block on I/O (see the [module docs](super) for the
/// locks they may take); the async ones need no particular runtime.
///
/// Dropping the last clone stops warden as [`WardenHandle::shutdown`] does.
#[derive(Clone)]
pub struct WardenHandle {
    shared: Arc<Shared>,
    owner: Arc<Owner>,
}

impl std::fmt::Debug for WardenHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WardenHandle")
            .field("agents", &self.shared.team.len())
            .field("closed", &self.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl WardenHandle {
    pub(super) fn new(
        shared: Arc<Shared>,
        stop: CancellationToken,
        thread: JoinHandle<()>,
    ) -> Self {
        WardenHandle {
            shared,
            owner: Arc::new(Owner {
                stop,
                thread: Mutex::new(Some(thread)),
            }),
        }
    }

    /// Delivers a world event to NPC `npc` now: it is classified (journaled as `perceived`) and,
    /// when it is a TRIGGER, queued; its reply comes back through
    /// [`WardenHandle::drain_replies`]. Never waits: the NPC's wake-up is handed to warden's
    /// thread, and a cross-thread wake is posted only when that thread is parked (no delivery for
    /// 200 ms; see the module docs' *pump*).
    ///
    /// # Errors
    /// [`DeliverError`], with the event handed back: `Unknown` (no such NPC), `Busy` (its lane is
    /// full), `Halted`, `LockedOut`, `JournalUnavailable`, `Shutdown`. A refused TRIGGER's
    /// perception is journaled all the same.
    pub fn try_deliver(&self, npc: &str, event: WorldEvent) -> Result<Delivered, DeliverError> {
        let before = wakes_posted_here();
        let mut woken = None;
        let result = defer_wakes(|| self.shared.deliver(npc, event, &mut woken));
        let posted = wakes_posted_here().wrapping_sub(before);
        let pumped = woken.map_or(0, |cell| u64::from(self.shared.pump.hand_over_one(cell)));
        self.shared.count(&result);
        let counters = &self.shared.counters;
        counters.wakes.fetch_add(posted + pumped, Ordering::Relaxed);
        result
    }

    /// Delivers every event of `batch` (draining it; its capacity stays for the next frame) as
    /// [`WardenHandle::try_deliver`] does, and appends one result per event to `results`, in
    /// order. Returns how many were delivered. The whole batch costs the calling thread at most
    /// one cross-thread wake: the NPCs' mailboxes are filled without waking their readers, and
    /// warden's thread wakes them.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use warden_actors::{host::Warden, AgentSpec, MemoryJournal, ScriptedProvider};
    /// # use warden_protocols::{npc::{WorldEvent, WorldEventKind}, AgentKey, WardenConfig};
    /// # let npcs = ["smith", "guard"].map(|k| AgentSpec::assistant(k, Arc::new(ScriptedProvider::new([]))));
    /// let warden = Warden::start(WardenConfig::default(), Arc::new(MemoryJournal::new()), npcs)?;
    /// let shout = |text: &str| WorldEvent::player("p1", WorldEventKind::Whisper, text);
    /// let mut batch = vec![(AgentKey::from("smith"), shout("a sword?")), (AgentKey::from("guard"), shout("hi"))];
    /// let mut results = Vec::new();
    /// let before = warden.stats().wakes;
    /// assert_eq!(warden.deliver_batch(&mut batch, &mut results), 2);
    /// assert!(batch.is_empty());
    /// assert!(warden.stats().wakes - before <= 1); // none if warden's thread was polling
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn deliver_batch(
        &self,
        batch: &mut Vec<(AgentKey, WorldEvent)>,
        results: &mut Vec<Result<Delivered, DeliverError>>,
    ) -> usize {
        let mut woken: Vec<Arc<AgentCell>> = Vec::new();
        let mut delivered = 0;
        let before = wakes_posted_here();
        defer_wakes(|| {
            results.reserve(batch.len());
            for (key, event) in batch.drain(..) {
                let mut cell = None;
                let result = self.shared.deliver(key.as_str(), event, &mut cell);
                woken.extend(cell);
                delivered += usize::from(result.is_ok());
                self.shared.count(&result);
                results.push(result);
            }
        });
        let posted = wakes_posted_here().wrapping_sub(before);
        let pumped = u64::from(self.shared.pump.hand_over(&mut woken));
        let counters = &self.shared.counters;
        counters.wakes.fetch_add(posted + pumped, Ordering::Relaxed);
        counters.batches.fetch_add(1, Ordering::Relaxed);
        delivered
    }

    /// Moves up to `max` settled events into `out` (appending), oldest first; returns how many.
    /// Never waits. Each [`NpcReply`] carries its event id and halt epoch; drop the
    /// [`NpcReply::stale`] ones after a halt.
    pub fn drain_replies(&self, out: &mut Vec<NpcReply>, max: usize) -> usize {
        // Tagged under the lock (`replies` → `marks`): no buffer of its own to allocate.
        let mut replies = self.shared.replies.lock();
        let mut n = 0;
        while n < max {
            let Ok(settled) = replies.try_recv() else {
                break;
            };
            out.push(self.shared.tag(settled));
            n += 1;
        }
        n
    }

    /// Moves up to `max` world-facing notices into `out` (appending), oldest first; returns how
    /// many. Never waits. A notice says an NPC fell silent (locked out, halted) or is back
    /// (unlocked, resumed), with default words a host may show as they are ("innkeeper falls
    /// silent.") or replace by its own from [`crate::Notice::presence`].
    pub fn drain_notices(&self, out: &mut Vec<crate::agent::Notice>, max: usize) -> usize {
        let mut notices = self.shared.notices.lock();
        let Some(notices) = notices.as_mut() else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Ok(notice) = notices.try_recv() else {
                break;
            };
            out.push(notice);
            n += 1;
        }
        n
    }

    /// The next settled event, waiting for one; `None` once warden is shut down and nothing is
    /// left. For async hosts; any executor will do. One waiter at a time: concurrent callers may
    /// be woken in turn rather than together.
    ///
    /// # Cancel safety
    /// Cancel safe: a reply is taken only when the future resolves with it.
    pub async fn next_reply(&self) -> Option<NpcReply> {
        let shared = &self.shared;
        let next = tokio::select! {
            biased;
            settled = std::future::poll_fn(|cx| shared.replies.lock().poll_recv(cx)) => settled,
            () = shared.stop.cancelled() => {
                let settled = shared.replies.lock().try_recv().ok();
                settled
            }
        };
        next.map(|settled| shared.tag(settled))
    }

    /// [`WardenHandle::try_deliver`], waiting for room while the NPC's lane is full.
    ///
    /// # Errors
    /// As [`WardenHandle::try_deliver`], but never `Busy`.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is delivered until the future resolves.
    pub async fn deliver(&self, npc: &str, event: WorldEvent) -> Result<Delivered, DeliverError> {
        let mut event = event;
        loop {
            if let Some(agent) = self.shared.agent(npc) {
                let mailbox = &agent.cell().mailbox;
                let room = mailbox.retry_while_full(|| {
                    (mailbox.depths().ordinary < mailbox.capacity()
                        || mailbox.is_closed()
                        || agent.cell().halt_requested())
                    .then_some(())
                });
                tokio::select! {
                    biased;
                    () = self.shared.stop.cancelled() => return Err(DeliverError::Shutdown(event)),
                    () = room => {}
                }
            }
            match self.try_deliver(npc, event) {
                Err(DeliverError::Busy(back)) => event = back,
                done => return done,
            }
        }
    }

    /// Halts every NPC (priority 0; journaled with cause `host` and `reason`): each one's halt
    /// flag is raised and its running turn cancelled before this returns, so a model call in
    /// flight is abandoned, every later delivery is refused as `Halted`, and every reply from
    /// before is [`NpcReply::stale`]. Queued events are discarded when the NPCs read the halt
    /// (their replies say so). Never waits; [`WardenHandle::halt_all_acked`] waits for the
    /// acknowledgements. [`WardenHandle::resume_all`] brings the NPCs back.
    pub fn halt_all(&self, reason: &str) {
        self.shared.counters.halts.fetch_add(1, Ordering::Relaxed);
        // Polled once: every halt is raised and queued on the first poll (see
        // `Supervisor::halt_all_with`); dropping the future gives up only the acknowledgements.
        let _ = futures::FutureExt::now_or_never(self.shared.team.halt_all_with(host(reason)));
    }

    /// [`WardenHandle::halt_all`], resolving once every NPC has acknowledged (one ack per NPC, in
    /// spawn order).
    ///
    /// # Cancel safety
    /// Cancel safe: the halts are raised on the first poll; dropping the future afterwards loses
    /// only the acknowledgements.
    pub async fn halt_all_acked(&self, reason: &str) -> Vec<HaltAck> {
        self.shared.counters.halts.fetch_add(1, Ordering::Relaxed);
        self.shared.team.halt_all_with(host(reason)).await
    }

    /// Brings every halted (or paused) NPC back to `WAITING_FOR_EVENT`: a resume is queued in
    /// each NPC's control lane (priority 1), journaled with `operator`, and this returns how many
    /// were queued without waiting for them to be applied (deliveries are refused as `Halted`
    /// until an NPC has read its resume). A locked-out NPC stays locked out: only
    /// [`AgentHandle::unlock`] (through [`WardenHandle::agent`]) lifts a breaker's lockout.
    ///
    /// The handle is the host's: as with the CLI and the admin API, authenticating `operator` is
    /// the caller's business, and nothing an NPC or a model produces can reach this call.
    pub fn resume_all(&self, operator: &str) -> usize {
        let mut queued = 0;
        for agent in self.shared.team.agents() {
            // Queued on the first poll (`AgentHandle::resume`'s cancel safety); the outcome is not
            // waited for: `NotStopped` for an NPC that was running is expected.
            let resume = agent.resume(operator);
            futures::pin_mut!(resume);
            match futures::FutureExt::now_or_never(resume) {
                Some(Err(crate::ControlError::Closed)) => {}
                _ => queued += 1,
            }
        }
        // Every NPC was sent a resume: no fleet halt stands any more.
        self.shared.team.forget_fleet_halt();
        let counters = &self.shared.counters;
        counters.resumes.fetch_add(queued as u64, Ordering::Relaxed);
        queued
    }

    /// Spawns an NPC into the running team (on warden's thread) and resolves once it is spawned;
    /// it is reachable through every clone of the handle from then on. Any executor will do; a
    /// plain thread may `futures::executor::block_on` it (outside its frame: a spawn waits for
    /// warden's thread).
    ///
    /// # Errors
    /// [`AddError::Spawn`]: what `Supervisor::spawn` refused (a duplicate key, …);
    /// [`AddError::Shutdown`] when warden is shut down.
    pub async fn spawn(&self, spec: AgentSpec) -> Result<(), AddError> {
        let (done, rx) = tokio::sync::oneshot::channel();
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(AddError::Shutdown);
        }
        let team = self.shared.team.clone();
        let job: SpawnJob = Box::new(move || {
            let _ = done.send(team.spawn(spec).map(drop).map_err(AddError::Spawn));
        });
        if self.shared.spawns.send(job).is_err() {
            return Err(AddError::Shutdown);
        }
        rx.await.unwrap_or(Err(AddError::Shutdown))
    }

    /// NPC `npc`'s halt epoch now (how many halts it went through); `None` if there is no such
    /// NPC.
    pub fn halt_epoch(&self, npc: &str) -> Option<u64> {
        self.shared.agent(npc).map(|a| a.cell().halt_epoch())
    }

    /// The NPC with that key, for everything else an [`AgentHandle`] does (status, unlock,
    /// resume, asking with a reply of its own).
    pub fn agent(&self, npc: &str) -> Option<AgentHandle> {
        self.shared.agent(npc).map(|a| a.handle.clone())
    }

    /// What NPC `npc` remembers about speaker `about`, as its model would be shown it before a
    /// call now (its profile and the memories that matter; docs/memory.md), for game logic.
    /// `None`: no such NPC, or nothing remembered. Nothing is journaled.
    pub fn recall(&self, npc: &str, about: &str) -> Option<String> {
        self.shared.agent(npc)?.handle.recall(about, None)
    }

    /// The host reports that `players` players are in `room` now ([`Supervisor::set_presence`]:
    /// an NPC whose room is reported empty goes idle). Never waits.
    pub fn set_presence(&self, room: &str, players: usize) {
        self.shared.team.set_presence(room, players);
    }

    /// Sets the team's game clock to `hour` (0 to 24) now ([`Supervisor::set_game_hour`]).
    /// Never waits.
    pub fn set_game_hour(&self, hour: f64) {
        self.shared.team.set_game_hour(hour);
    }

    /// The team's game hour now (0 to 24).
    pub fn game_hour(&self) -> f64 {
        self.shared.team.game_hour()
    }

    /// The handle's counters (relaxed atomics: cheap, each exact, not a consistent snapshot).
    pub fn stats(&self) -> HostStats {
        let c = &self.shared.counters;
        HostStats {
            agents: self.shared.team.len(),
            delivered: c.delivered.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            replies: c.replies.load(Ordering::Relaxed),
            wakes: c.wakes.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            halts: c.halts.load(Ordering::Relaxed),
            resumes: c.resumes.load(Ordering::Relaxed),
        }
    }

    /// Stops warden: the team is shut down (queued events stay pending in the journal, as with
    /// `Supervisor::shutdown`), the thread joined. Other clones of the handle then refuse every
    /// delivery as `Shutdown` and drain what replies were left. Blocks until the thread ends, so
    /// call it from the host's thread, not from inside an async task.
    pub fn shutdown(self) {
        self.owner.stop_and_join();
    }
}

/// The halt cause of the host's `halt_all`.
fn host(reason: &str) -> HaltCause {
    HaltCause::Host {
        reason: reason.into(),
    }
}
