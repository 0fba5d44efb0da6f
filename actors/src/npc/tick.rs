//! The tick arbiter: autonomous ticks for every ticking NPC of a team, from **one** timer task.
//!
//! A team has one [`TickArbiter`] (built with its supervisor). It keeps a schedule — a `BTreeSet`
//! of `(due instant, slot id)` — and its single task sleeps until the earliest entry; a change
//! that may bring an entry forward (a registration, a presence report, a TRIGGER, the host setting
//! the game hour) wakes it through a [`Notify`]. No NPC has a timer of its own, so 1,000 ticking
//! NPCs cost one task and a thousand small entries.
//!
//! On a due tick of an NPC (see [`fire`]):
//! * halted (or a halt requested), stopped, locked out or paused → no tick (not counted);
//! * its turn runs, or a tick of this arbiter is still queued → the tick is **skipped** and counted,
//!   never queued twice;
//! * else `Work::Tick` goes into the ordinary lane, behind any user event already queued (a tick
//!   neither starves nor reorders user events: it is ordinary FIFO work and at most one is queued).
//!
//! Each NPC is in one [`NpcMode`], decided by the arbiter (its only writer) in this order:
//! woken by a TRIGGER within `npc.tick.wake_seconds` → `awake`; inside its sleep hours of game
//! time (`npc.sleep`) → `asleep`; the host reported its room and nobody is in it → `idle`; else
//! `awake`. Each mode has a rate (`npc.tick.rate`, `npc.sleep.tick_rate`, `npc.tick.idle_rate`;
//! 0: no ticks). A mode change is journaled (`NpcModeChanged`) — ticks are not: with 1,000 NPCs a
//! journal event per tick would be thousands of rows a minute, a mode change is a few a game day.
//!
//! Where a mode can end on its own (the sleep hours' end or start, a wake's end) the schedule holds
//! a *check* at that instant instead of a tick, so a mode without ticks costs nothing until then.
//!
//! # Invariants
//! * At most one tick of this arbiter is queued per NPC: [`Ticking::queued`] is set before the tick
//!   is pushed and cleared only when that tick leaves the ordinary lane — taken by a turn
//!   (`turn::take`), refused by the actor, or discarded by a halt (the discard's listing clears it).
//! * The mode changes only here, under the schedule lock; [`Ticking`]'s view is a copy for the status.
//!
//! # Lock order
//! `schedule` → a [`Ticking`]'s `view` (a leaf). No agent lock (record, mailbox lane) is taken while
//! the schedule is held: due ticks are collected under it and fired after it is released.

use crate::agent::{cell::AgentCell, AgentMsg, Work};
use parking_lot::Mutex;
use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Weak,
    },
    time::Duration,
};
use tokio::{sync::Notify, time::Instant};
use warden_protocols::{
    npc::{ClockConfig, NpcConfig, NpcMode},
    EventKind, TickStatus,
};

/// A check scheduled at a mode's end runs this long after it (clear of float rounding at the
/// boundary).
const BOUNDARY_SLACK: Duration = Duration::from_millis(1);

/// The longest wait the arbiter schedules (a rate or a boundary further out is cut to this).
const MAX_WAIT: Duration = Duration::from_secs(365 * 86_400);

/// What one team's tick arbiter is doing: how many NPCs it schedules, on how many timer tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickReport {
    /// NPCs with ticks enabled, scheduled by the arbiter.
    pub agents: usize,
    /// Timer tasks the arbiter ever started (one; never one per NPC).
    pub timers: usize,
}

/// An NPC's side of the arbiter, held by its cell: the collision flag, the counters, and a copy of
/// its mode for the status.
#[derive(Debug)]
pub(crate) struct Ticking {
    id: u64,
    arbiter: Weak<Shared>,
    /// A tick of the arbiter is in the ordinary lane.
    queued: AtomicBool,
    ticks: AtomicU64,
    skipped: AtomicU64,
    view: Mutex<View>,
}

/// What the status shows (written by the arbiter only).
#[derive(Debug, Default)]
struct View {
    mode: NpcMode,
    next: Option<Instant>,
    room: Option<String>,
}

impl Ticking {
    /// The arbiter's tick left the ordinary lane (taken, refused or discarded).
    pub(crate) fn left_lane(&self) {
        self.queued.store(false, Ordering::Release);
    }

    /// A world event was perceived: its room (the NPC's, unless configured), and whether it was a
    /// TRIGGER (which wakes the NPC).
    pub(crate) fn perceived(&self, room: Option<&str>, trigger: bool) {
        if let Some(shared) = self.arbiter.upgrade() {
            shared.perceived(self.id, room, trigger);
        }
    }

    /// Changes the NPC's tick settings (`npc.tick`, `npc.sleep`; the clock is the team's).
    pub(crate) fn reconfigure(&self, config: Arc<NpcConfig>) {
        if let Some(shared) = self.arbiter.upgrade() {
            shared.reconfigure(self.id, config);
        }
    }

    /// Schedules the NPC's wake `after` from now, within its current sleep hours (design 001's
    /// `scheduled_wake_time`): from then until those sleep hours end it is `awake`. A wake past
    /// their end is their end.
    ///
    /// # Errors
    ///
    /// The NPC is not in its sleep hours (in words, for the model), or the arbiter is gone.
    pub(crate) fn schedule_wake(&self, after: Duration) -> Result<(), String> {
        let shared = self.arbiter.upgrade().ok_or("the tick schedule is gone")?;
        shared.schedule_wake(self.id, after)
    }

    /// The team's game hour now (`None` once the arbiter is gone).
    pub(crate) fn game_hour(&self) -> Option<f64> {
        let shared = self.arbiter.upgrade()?;
        let hour = shared.schedule.lock().clock.hour(Instant::now());
        Some(hour)
    }

    pub(crate) fn status(&self) -> TickStatus {
        let view = self.view.lock();
        TickStatus {
            mode: view.mode,
            ticks: self.ticks.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Acquire),
            next_tick_ms: view
                .next
                .map(|next| next.saturating_duration_since(Instant::now()).as_millis() as u64),
            room: view.room.clone(),
        }
    }
}

/// The game clock: `hour = origin hour + elapsed real time × speed`, modulo 24.
#[derive(Debug)]
struct GameClock {
    speed: f64,
    origin: Instant,
    /// Game seconds at `origin`.
    origin_secs: f64,
}

impl GameClock {
    fn new(config: &ClockConfig, now: Instant) -> Self {
        let speed = if config.speed.is_finite() && config.speed > 0.0 {
            config.speed
        } else {
            1.0
        };
        let mut clock = GameClock {
            speed,
            origin: now,
            origin_secs: 0.0,
        };
        clock.set_hour(config.start_hour, now);
        clock
    }

    fn set_hour(&mut self, hour: f64, now: Instant) {
        let hour = if hour.is_finite() {
            hour.rem_euclid(24.0)
        } else {
            0.0
        };
        self.origin = now;
        self.origin_secs = hour * 3600.0;
    }

    fn hour(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.origin).as_secs_f64();
        ((self.origin_secs + elapsed * self.speed) / 3600.0).rem_euclid(24.0)
    }

    /// Real time from `now` until the game clock next shows `hour`.
    fn until_hour(&self, now: Instant, hour: f64) -> Duration {
        let hours = (hour - self.hour(now)).rem_euclid(24.0);
        capped(hours * 3600.0 / self.speed)
    }
}

fn capped(secs: f64) -> Duration {
    if secs.is_finite() && secs > 0.0 {
        Duration::from_secs_f64(secs).min(MAX_WAIT)
    } else {
        Duration::ZERO
    }
}

/// A rate in seconds as a period (`None`: 0 or not a positive number, no ticks).
fn period(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs > 0.0).then(|| capped(secs).max(Duration::from_millis(1)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// A tick (fired if the mode is still the one it was scheduled in).
    Tick,
    /// A mode may end here: look again.
    Check,
}

#[derive(Debug)]
struct Slot {
    cell: Weak<AgentCell>,
    ticking: Arc<Ticking>,
    config: Arc<NpcConfig>,
    mode: NpcMode,
    due: Option<(Instant, Due)>,
    /// The room of its last world event that named one (`npc.tick.room` comes first).
    heard_in: Option<String>,
    woken_until: Option<Instant>,
    /// A wake the NPC scheduled in its sleep hours (design 001's `scheduled_wake_time`): awake
    /// from the first instant until the second (the end of those sleep hours).
    scheduled_wake: Option<(Instant, Instant)>,
}

impl Slot {
    fn room(&self) -> Option<&str> {
        self.config
            .tick
            .room
            .as_deref()
            .or(self.heard_in.as_deref())
    }

    fn rate(&self, mode: NpcMode) -> Option<Duration> {
        match mode {
            NpcMode::Awake => period(self.config.tick.rate),
            NpcMode::Asleep => period(self.config.sleep.tick_rate),
            NpcMode::Idle => period(self.config.tick.idle_rate),
        }
    }

    fn in_sleep_hours(&self, hour: f64) -> bool {
        let sleep = &self.config.sleep;
        sleep.enabled
            && (hour - f64::from(sleep.start_hour)).rem_euclid(24.0)
                < f64::from(sleep.duration_hours)
    }

    /// The mode now, and why.
    fn mode_at(
        &self,
        clock: &GameClock,
        presence: &HashMap<String, usize>,
        now: Instant,
    ) -> (NpcMode, String) {
        if self.woken_until.is_some_and(|until| until > now) {
            return (NpcMode::Awake, "woken by a TRIGGER".into());
        }
        let hour = clock.hour(now);
        if self.in_sleep_hours(hour) {
            if self
                .scheduled_wake
                .is_some_and(|(at, until)| at <= now && now < until)
            {
                return (
                    NpcMode::Awake,
                    format!("its scheduled wake (game hour {hour:.2})"),
                );
            }
            return (
                NpcMode::Asleep,
                format!("sleep hours (game hour {hour:.2})"),
            );
        }
        if let Some(room) = self.room() {
            if presence.get(room) == Some(&0) {
                return (NpcMode::Idle, format!("no player in {room}"));
            }
        }
        let cause = if self.config.sleep.enabled {
            format!("awake (game hour {hour:.2})")
        } else {
            "awake".into()
        };
        (NpcMode::Awake, cause)
    }

    /// The next instant its mode may change without an event: a wake's end, or its sleep hours'
    /// start or end.
    fn boundary(&self, clock: &GameClock, now: Instant) -> Option<Instant> {
        let woke = self.woken_until.filter(|until| *until > now);
        let sleep = &self.config.sleep;
        let sleep = sleep.enabled.then(|| {
            let start = f64::from(sleep.start_hour);
            let edge = if self.in_sleep_hours(clock.hour(now)) {
                start + f64::from(sleep.duration_hours)
            } else {
                start
            };
            now + clock.until_hour(now, edge)
        });
        let scheduled = self.scheduled_wake.map(|(at, _)| at).filter(|at| *at > now);
        [woke, sleep, scheduled].into_iter().flatten().min()
    }

    /// What comes next from `now` in its current mode: a tick, or a check at a boundary.
    fn next(&self, clock: &GameClock, now: Instant) -> Option<(Instant, Due)> {
        let boundary = self.boundary(clock, now);
        let check = boundary.map(|at| (at + BOUNDARY_SLACK, Due::Check));
        match self.rate(self.mode) {
            Some(rate) if boundary.is_none_or(|at| now + rate < at) => {
                Some((now + rate, Due::Tick))
            }
            _ => check,
        }
    }
}

/// A mode change to journal (outside the schedule lock).
struct Change {
    cell: Weak<AgentCell>,
    from: NpcMode,
    to: NpcMode,
    cause: String,
}

#[derive(Debug)]
struct Schedule {
    clock: GameClock,
    due: BTreeSet<(Instant, u64)>,
    slots: HashMap<u64, Slot>,
    /// Players per room, as the host last reported (a room never reported is not known empty).
    presence: HashMap<String, usize>,
    next_id: u64,
}

impl Schedule {
    /// Re-decides slot `id`'s mode at `now`; on a change (or when `force`), its next entry is
    /// scheduled afresh from now.
    fn reevaluate(&mut self, id: u64, now: Instant, force: bool) -> Option<Change> {
        let Schedule {
            clock,
            due,
            slots,
            presence,
            ..
        } = self;
        let slot = slots.get_mut(&id)?;
        let (mode, cause) = slot.mode_at(clock, presence, now);
        let from = slot.mode;
        slot.mode = mode;
        if mode == from && !force {
            // Same mode: a pending tick stays; a pending check moves to the (maybe new) boundary.
            if !matches!(slot.due, Some((_, Due::Check)) | None) {
                return None;
            }
        }
        if let Some((at, _)) = slot.due.take() {
            due.remove(&(at, id));
        }
        slot.due = slot.next(clock, now);
        if let Some((at, _)) = slot.due {
            due.insert((at, id));
        }
        publish(slot);
        (mode != from).then(|| Change {
            cell: slot.cell.clone(),
            from,
            to: mode,
            cause,
        })
    }
}

/// Copies a slot's mode, next tick and room to its status view.
fn publish(slot: &Slot) {
    let mut view = slot.ticking.view.lock();
    view.mode = slot.mode;
    view.next = match slot.due {
        Some((at, Due::Tick)) => Some(at),
        _ => None,
    };
    view.room = slot.room().map(str::to_owned);
}

#[derive(Debug)]
struct Shared {
    schedule: Mutex<Schedule>,
    /// Wakes the timer task: the earliest entry may have moved, or the arbiter closed.
    wake: Arc<Notify>,
    timers: AtomicUsize,
    closed: AtomicBool,
}

impl Shared {
    fn perceived(&self, id: u64, room: Option<&str>, trigger: bool) {
        let now = Instant::now();
        let change = {
            let mut schedule = self.schedule.lock();
            let Some(slot) = schedule.slots.get_mut(&id) else {
                return;
            };
            let mut moved = false;
            if let Some(room) = room {
                if slot.heard_in.as_deref() != Some(room) {
                    slot.heard_in = Some(room.to_owned());
                    moved = slot.config.tick.room.is_none();
                }
            }
            let mut force = false;
            if trigger {
                if let Some(wake) = period(slot.config.tick.wake_seconds) {
                    // A wake that changes the mode schedules afresh; one that only extends an
                    // awake NPC's wake keeps its ticks as they are.
                    force = slot.mode != NpcMode::Awake;
                    slot.woken_until = Some(now + wake);
                }
            }
            if !moved && !trigger {
                return;
            }
            let change = schedule.reevaluate(id, now, force);
            if change.is_none() {
                if let Some(slot) = schedule.slots.get(&id) {
                    publish(slot);
                }
            }
            change
        };
        self.wake.notify_one();
        journal(change);
    }

    fn schedule_wake(&self, id: u64, after: Duration) -> Result<(), String> {
        let now = Instant::now();
        let change = {
            let mut schedule = self.schedule.lock();
            let hour = schedule.clock.hour(now);
            let Some(slot) = schedule.slots.get(&id) else {
                return Err("not scheduled".into());
            };
            if !slot.in_sleep_hours(hour) {
                return Err(format!("not in its sleep hours (game hour {hour:.2})"));
            }
            let sleep = &slot.config.sleep;
            let end_hour = f64::from(sleep.start_hour) + f64::from(sleep.duration_hours);
            let end = now + schedule.clock.until_hour(now, end_hour);
            let at = (now + capped(after.as_secs_f64())).min(end);
            if let Some(slot) = schedule.slots.get_mut(&id) {
                slot.scheduled_wake = Some((at, end));
            }
            schedule.reevaluate(id, now, true)
        };
        self.wake.notify_one();
        journal(change);
        Ok(())
    }

    fn reconfigure(&self, id: u64, config: Arc<NpcConfig>) {
        let change = {
            let mut schedule = self.schedule.lock();
            let Some(slot) = schedule.slots.get_mut(&id) else {
                return;
            };
            slot.config = config;
            schedule.reevaluate(id, Instant::now(), true)
        };
        self.wake.notify_one();
        journal(change);
    }

    /// Pops every entry due at `now`, decides each slot's mode, fires the ticks (outside the lock).
    fn fire_due(&self, now: Instant) {
        let mut ticks = Vec::new();
        let mut changes = Vec::new();
        {
            let mut schedule = self.schedule.lock();
            while let Some(&(at, id)) = schedule.due.first() {
                if at > now {
                    break;
                }
                schedule.due.remove(&(at, id));
                let Some(slot) = schedule.slots.get_mut(&id) else {
                    continue;
                };
                if slot.cell.strong_count() == 0 {
                    schedule.slots.remove(&id);
                    continue;
                }
                let kind = slot.due.take().map(|(_, kind)| kind);
                let before = slot.mode;
                let change = schedule.reevaluate(id, now, true);
                if kind == Some(Due::Tick) && change.is_none() {
                    if let Some(slot) = schedule.slots.get(&id) {
                        if slot.rate(before).is_some() {
                            ticks.push((slot.cell.clone(), slot.ticking.clone()));
                        }
                    }
                }
                changes.extend(change);
            }
        }
        for (cell, ticking) in ticks {
            if let Some(cell) = cell.upgrade() {
                fire(&cell, &ticking);
            }
        }
        for change in changes {
            journal(Some(change));
        }
    }

    fn earliest(&self) -> Option<Instant> {
        self.schedule.lock().due.first().map(|(at, _)| *at)
    }
}

/// What an autonomous tick shows the model, after the context buffer: an internal line, in the
/// bracketed form of the other internal messages, with the game time (`hour`) when known.
pub(crate) fn tick_message(hour: Option<f64>) -> String {
    match hour {
        Some(hour) => {
            let minutes = (hour * 60.0).floor() as u32 % (24 * 60);
            format!(
                "[tick] game time {:02}:{:02}; nothing new was addressed to you since your last turn.",
                minutes / 60,
                minutes % 60
            )
        }
        None => "[tick] nothing new was addressed to you since your last turn.".into(),
    }
}

/// One due tick of `cell` (see the module docs for the rules).
pub(crate) fn fire(cell: &AgentCell, ticking: &Ticking) {
    let state = cell.state();
    if state.refuses_work() || cell.halt_requested() || cell.paused() {
        return;
    }
    if state.is_busy() || ticking.queued.load(Ordering::Acquire) {
        // A turn runs, or a tick is still queued.
        ticking.skipped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    ticking.queued.store(true, Ordering::Release);
    match cell.mailbox.try_send(AgentMsg::Work(Work::Tick)) {
        Ok(_) => {
            ticking.ticks.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            // The ordinary lane is full (or closed): nothing was queued.
            ticking.queued.store(false, Ordering::Release);
            ticking.skipped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn journal(change: Option<Change>) {
    let Some(Change {
        cell,
        from,
        to,
        cause,
    }) = change
    else {
        return;
    };
    if let Some(cell) = cell.upgrade() {
        tracing::debug!(agent = %cell.key, %from, %to, %cause, "npc mode changed");
        cell.note(EventKind::NpcModeChanged { from, to, cause });
    }
}

/// One team's tick arbiter: the schedule of every ticking NPC, the game clock, the presence of
/// players per room, and the one timer task that serves them all.
#[derive(Debug)]
pub(crate) struct TickArbiter {
    shared: Arc<Shared>,
}

impl TickArbiter {
    /// The arbiter and its timer task (spawned on the current actix arbiter; it ends when the
    /// arbiter is dropped).
    pub(crate) fn start(clock: &ClockConfig) -> Self {
        let shared = Arc::new(Shared {
            schedule: Mutex::new(Schedule {
                clock: GameClock::new(clock, Instant::now()),
                due: BTreeSet::new(),
                slots: HashMap::new(),
                presence: HashMap::new(),
                next_id: 1,
            }),
            wake: Arc::new(Notify::new()),
            timers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        });
        shared.timers.fetch_add(1, Ordering::Relaxed);
        let (weak, wake) = (Arc::downgrade(&shared), shared.wake.clone());
        actix_rt::spawn(async move {
            loop {
                let Some(shared) = weak.upgrade() else { return };
                if shared.closed.load(Ordering::Acquire) {
                    return;
                }
                let next = shared.earliest();
                drop(shared);
                match next {
                    Some(at) if at > Instant::now() => {
                        tokio::select! {
                            _ = tokio::time::sleep_until(at) => {}
                            _ = wake.notified() => continue,
                        }
                    }
                    Some(_) => {}
                    None => {
                        wake.notified().await;
                        continue;
                    }
                }
                let Some(shared) = weak.upgrade() else { return };
                shared.fire_due(Instant::now());
                drop(shared);
                // Many NPCs due at once: let their actors run before the next round.
                tokio::task::yield_now().await;
            }
        });
        TickArbiter { shared }
    }

    /// Schedules `cell`'s ticks by `config` (its `npc.tick.enabled` is the caller's to check).
    pub(crate) fn register(&self, cell: &Arc<AgentCell>, config: Arc<NpcConfig>) -> Arc<Ticking> {
        let now = Instant::now();
        let (ticking, change) = {
            let mut schedule = self.shared.schedule.lock();
            let id = schedule.next_id;
            schedule.next_id += 1;
            let ticking = Arc::new(Ticking {
                id,
                arbiter: Arc::downgrade(&self.shared),
                queued: AtomicBool::new(false),
                ticks: AtomicU64::new(0),
                skipped: AtomicU64::new(0),
                view: Mutex::new(View::default()),
            });
            schedule.slots.insert(
                id,
                Slot {
                    cell: Arc::downgrade(cell),
                    ticking: ticking.clone(),
                    config,
                    mode: NpcMode::Awake,
                    due: None,
                    heard_in: None,
                    woken_until: None,
                    scheduled_wake: None,
                },
            );
            let change = schedule.reevaluate(id, now, true);
            (ticking, change)
        };
        self.shared.wake.notify_one();
        journal(change);
        ticking
    }

    /// Stops scheduling `ticking`'s NPC (a queued tick stays queued).
    pub(crate) fn unregister(&self, ticking: &Ticking) {
        let mut schedule = self.shared.schedule.lock();
        if let Some(slot) = schedule.slots.remove(&ticking.id) {
            if let Some((at, _)) = slot.due {
                schedule.due.remove(&(at, ticking.id));
            }
        }
        ticking.view.lock().next = None;
    }

    /// The host's report: `players` players are in `room` now (0: nobody, so its NPCs go idle).
    pub(crate) fn set_presence(&self, room: &str, players: usize) {
        self.reevaluate_where(
            false,
            |schedule, _| {
                let before = schedule.presence.insert(room.to_owned(), players);
                // Still empty, or still occupied: no mode can change.
                before.map(|n| n == 0) != Some(players == 0)
            },
            |slot| slot.room() == Some(room),
        );
    }

    /// Sets the game clock to `hour` (0 to 24) now; every NPC's mode is decided again.
    pub(crate) fn set_game_hour(&self, hour: f64) {
        self.reevaluate_where(
            true,
            |schedule, now| {
                schedule.clock.set_hour(hour, now);
                true
            },
            |_| true,
        );
    }

    /// Applies `change` to the schedule; if it says modes may have changed, decides again the mode
    /// of every slot `which` selects (`force`: and schedules it afresh). The mode changes are
    /// journaled after the lock is released.
    fn reevaluate_where(
        &self,
        force: bool,
        change: impl FnOnce(&mut Schedule, Instant) -> bool,
        which: impl Fn(&Slot) -> bool,
    ) {
        let now = Instant::now();
        let changes: Vec<_> = {
            let mut schedule = self.shared.schedule.lock();
            if !change(&mut schedule, now) {
                return;
            }
            let ids: Vec<u64> = schedule
                .slots
                .iter()
                .filter(|(_, slot)| which(slot))
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| schedule.reevaluate(id, now, force))
                .collect()
        };
        self.shared.wake.notify_one();
        for change in changes {
            journal(Some(change));
        }
    }

    /// The game hour now (0 to 24).
    pub(crate) fn game_hour(&self) -> f64 {
        self.shared.schedule.lock().clock.hour(Instant::now())
    }

    pub(crate) fn report(&self) -> TickReport {
        TickReport {
            agents: self.shared.schedule.lock().slots.len(),
            timers: self.shared.timers.load(Ordering::Relaxed),
        }
    }
}

impl TickArbiter {
    /// Ends the timer task: no tick is queued any more (the team shuts down).
    pub(crate) fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

impl Drop for TickArbiter {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_game_clock_runs_at_its_speed_and_wraps_at_midnight() {
        let now = Instant::now();
        let clock = GameClock::new(
            &ClockConfig {
                start_hour: 23.0,
                speed: 60.0,
            },
            now,
        );
        assert_eq!(clock.hour(now), 23.0);
        // A game hour is a real minute at 60×.
        assert!((clock.hour(now + Duration::from_secs(90)) - 0.5).abs() < 1e-9);
        assert_eq!(clock.until_hour(now, 2.0), Duration::from_secs(180));
    }
}
