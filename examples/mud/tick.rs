//! The world thread: 20 ticks a second, on a thread of its own. It owns the world and talks to
//! warden only through the [`WardenHandle`]: each tick it reads the players' commands (a bounded
//! channel, never waited on), runs them, delivers the tick's world events as one batch, drains the
//! NPCs' replies and shows their lines to the players in the room. No call waits for a model.

use crate::{
    model::Meter,
    protocol,
    world::{PlayerId, World},
};
use hdrhistogram::Histogram;
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, TryRecvError},
        Arc,
    },
    time::{Duration, Instant},
};
use tokio::sync::mpsc::Sender;
use warden::{
    host::{DeliverError, NpcReply, WardenHandle},
    protocols::{
        npc::{Verdict, WorldEvent},
        AgentKey,
    },
    AskError,
};

pub const TICK: Duration = Duration::from_millis(50);
/// Commands read per tick at most (the rest wait for the next tick in the channel).
const MAX_INPUTS: usize = 4096;
const MAX_REPLIES: usize = 1024;

/// What the network side tells the world thread.
pub enum Input {
    Join { id: PlayerId, out: Sender<String> },
    Line { id: PlayerId, line: String },
    Leave { id: PlayerId },
}

/// When the host halts every NPC and brings them back (from the world thread's start).
#[derive(Debug, Default, Clone, Copy)]
pub struct HaltPlan {
    pub halt_at: Option<Duration>,
    pub resume_at: Option<Duration>,
}

pub struct Setup {
    pub warden: Option<WardenHandle>,
    pub meter: Option<Arc<Meter>>,
    /// Joins and leaves (unbounded: one of each per connection).
    pub control: Receiver<Input>,
    /// Players' lines (bounded: the network side drops and counts a line when it is full).
    pub inputs: Receiver<Input>,
    pub stop: Arc<AtomicBool>,
    pub halt: HaltPlan,
    pub npcs: usize,
    /// Players are kept to the first `zone` rooms (see [`World::new`]).
    pub zone: usize,
}

/// The halt's figures.
#[derive(Debug, Default, Clone, Copy)]
pub struct HaltReport {
    /// How long `halt_all` took on the world thread.
    pub halt_call_us: f64,
    /// Model calls in flight just before the halt.
    pub inflight_at_halt: u64,
    /// Model calls started between the halt and the resume.
    pub llm_calls_started_after_halt: u64,
    /// From the halt until no model call was in flight (every one aborted or ended).
    pub inflight_aborted_ms_max: f64,
    /// Model calls that ran to their end after the halt.
    pub llm_calls_completed_after_halt: u64,
    /// Tokens of the model calls that ended between the halt and the resume.
    pub tokens_after_halt: u64,
    /// From the halt until the last reply the world drained before the resume (0: none).
    pub quiet_ms: f64,
    /// Replies drained during the halt that were stale (from before it: dropped, never shown).
    pub stale_dropped: u64,
    /// NPC lines shown to players during the halt (must be 0).
    pub npc_lines_during_halt: u64,
}

/// What the world thread measured.
pub struct Report {
    /// Tick durations in µs, corrected for coordinated omission (expected interval: one tick).
    pub tick_us: Histogram<u64>,
    /// Ticks run (the histogram also holds the samples the correction added).
    pub ticks: u64,
    /// Ticks that took more than 50 ms (uncorrected count).
    pub ticks_over_50ms: u64,
    /// Every host call (`deliver_batch`, `drain_replies`), in ns.
    pub host_call_ns: Histogram<u64>,
    /// `deliver_batch` alone (ns), and divided by the batch's events.
    pub deliver_ns: Histogram<u64>,
    pub deliver_per_event_ns: Histogram<u64>,
    /// The world thread's CPU time in `deliver_batch` (`CLOCK_THREAD_CPUTIME_ID`), per event:
    /// what it ran, without the time it was off its core.
    pub deliver_cpu_per_event_ns: Histogram<u64>,
    /// Per event, the batches during which the world thread was never switched out.
    pub deliver_unswitched_per_event_ns: Histogram<u64>,
    /// Batches during which the world thread gave up its core (it waited: a parked lock) and
    /// was preempted (another thread took the core), by `getrusage(RUSAGE_THREAD)`.
    pub deliver_switched: [u64; 2],
    /// `drain_replies` alone (ns).
    pub drain_ns: Histogram<u64>,
    /// From delivery to the drained reply, in ms (answered events only).
    pub reply_ms: Histogram<u64>,
    pub npc_replies: u64,
    pub reply_failures: u64,
    pub reply_discarded: u64,
    pub reply_refused: u64,
    pub classified: [u64; 4],
    pub refused_busy: u64,
    pub refused_halted: u64,
    pub refused_locked: u64,
    pub refused_other: u64,
    pub delivered: u64,
    /// TRIGGERs whose speaker was another NPC (the ping-pong).
    pub npc_triggers: u64,
    pub halt: Option<HaltReport>,
    pub commands: u64,
    pub lines_sent: u64,
    pub lines_dropped: u64,
    pub inputs_max_per_tick: usize,
}

impl Report {
    fn new() -> Self {
        let hist = |max| Histogram::new_with_bounds(1, max, 3).expect("histogram bounds");
        Report {
            tick_us: hist(3_600_000_000),
            ticks: 0,
            ticks_over_50ms: 0,
            host_call_ns: hist(60_000_000_000),
            deliver_ns: hist(60_000_000_000),
            deliver_per_event_ns: hist(60_000_000_000),
            deliver_cpu_per_event_ns: hist(60_000_000_000),
            deliver_unswitched_per_event_ns: hist(60_000_000_000),
            deliver_switched: [0; 2],
            drain_ns: hist(60_000_000_000),
            reply_ms: hist(3_600_000),
            npc_replies: 0,
            reply_failures: 0,
            reply_discarded: 0,
            reply_refused: 0,
            classified: [0; 4],
            refused_busy: 0,
            refused_halted: 0,
            refused_locked: 0,
            refused_other: 0,
            delivered: 0,
            npc_triggers: 0,
            halt: None,
            commands: 0,
            lines_sent: 0,
            lines_dropped: 0,
            inputs_max_per_tick: 0,
        }
    }
}

struct HaltState {
    at: Instant,
    calls: u64,
    tokens: u64,
    completed: u64,
    report: HaltReport,
    monitor: Option<std::thread::JoinHandle<f64>>,
    lines_before: u64,
    over: bool,
}

/// This thread's CPU time (ns).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// This thread's context switches so far: (voluntary, involuntary).
fn minor_faults() -> i64 {
    // SAFETY: as in `switches`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_minflt
}

fn switches() -> (i64, i64) {
    // SAFETY: an all-zero `rusage` is valid (plain integers); getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    (usage.ru_nvcsw, usage.ru_nivcsw)
}

/// `WARDEN_MUD_PIN=1`: the world thread on CPU 0 (the rest of the process is on CPU 1, see
/// `main`), so the NPCs' work never shares the host thread's core.
pub fn pin_to(cpu: usize) {
    if std::env::var_os("WARDEN_MUD_PIN").is_none_or(|v| v != "1") {
        return;
    }
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (0 or 1 here).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        eprintln!("WARDEN_MUD_PIN: sched_setaffinity(cpu {cpu}) failed");
    }
}

/// Runs the world until `stop`; returns what it measured.
pub fn run(setup: Setup) -> Report {
    pin_to(0);
    let Setup {
        warden,
        meter,
        control,
        inputs,
        stop,
        halt: plan,
        npcs,
        zone,
    } = setup;
    let mut world = World::new(npcs, zone);
    let mut report = Report::new();
    let mut batch_log = std::env::var("WARDEN_MUD_BATCH_LOG")
        .ok()
        .filter(|_| warden.is_some())
        .and_then(|p| std::fs::File::create(p).ok())
        .map(std::io::BufWriter::new);
    let mut events: Vec<(AgentKey, WorldEvent)> = Vec::new();
    let mut keys: Vec<(AgentKey, bool)> = Vec::new();
    let mut results = Vec::new();
    let mut replies: Vec<NpcReply> = Vec::new();
    let mut asked: HashMap<(AgentKey, u64), Instant> = HashMap::new();
    let mut halt: Option<HaltState> = None;
    let started = Instant::now();
    let mut next = started + TICK;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        // 1. Who came and went, then the players' commands.
        while let Ok(input) = control.try_recv() {
            match input {
                Input::Join { id, out } => world.join(id, out),
                Input::Leave { id } => world.leave(id),
                Input::Line { .. } => {}
            }
        }
        let mut n = 0;
        while n < MAX_INPUTS {
            match inputs.try_recv() {
                Ok(Input::Join { id, out }) => world.join(id, out),
                Ok(Input::Leave { id }) => world.leave(id),
                Ok(Input::Line { id, line }) => {
                    world.command(id, protocol::parse(&line), &mut events);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
            n += 1;
        }
        report.inputs_max_per_tick = report.inputs_max_per_tick.max(n);
        if let Some(warden) = &warden {
            // 2. The operator's halt and resume, at their times.
            let elapsed = started.elapsed();
            if halt.is_none() && plan.halt_at.is_some_and(|at| elapsed >= at) {
                halt = Some(start_halt(warden, meter.as_deref(), report.npc_replies));
            }
            if let Some(state) = halt.as_mut().filter(|s| !s.over) {
                if plan.resume_at.is_none_or(|at| elapsed >= at) || stop.load(Ordering::Relaxed) {
                    end_halt(state, meter.as_deref(), report.npc_replies);
                    if plan.resume_at.is_some() {
                        warden.resume_all("mud");
                    }
                }
            }
            // 3. The tick's world events, as one batch: one cross-thread wake at most.
            if !events.is_empty() {
                keys.clear();
                keys.extend(events.iter().map(|(k, e)| {
                    (
                        k.clone(),
                        e.speaker.kind == warden::protocols::npc::SpeakerKind::Npc,
                    )
                }));
                // Page faults only for the batch log (a system call each).
                let faults = if batch_log.is_some() {
                    minor_faults()
                } else {
                    0
                };
                let switched = switches();
                let cpu = thread_cpu_ns();
                let t = Instant::now();
                warden.deliver_batch(&mut events, &mut results);
                let took = t.elapsed().as_nanos();
                let cpu = thread_cpu_ns().saturating_sub(cpu);
                let (voluntary, preempted) = {
                    let after = switches();
                    (after.0 > switched.0, after.1 > switched.1)
                };
                let n = keys.len() as u128;
                record(&mut report.host_call_ns, took);
                record(&mut report.deliver_ns, took);
                record(&mut report.deliver_per_event_ns, took / n);
                record(&mut report.deliver_cpu_per_event_ns, u128::from(cpu) / n);
                report.deliver_switched[0] += u64::from(voluntary);
                report.deliver_switched[1] += u64::from(preempted);
                if !voluntary && !preempted {
                    record(&mut report.deliver_unswitched_per_event_ns, took / n);
                }
                if let Some(log) = batch_log.as_mut() {
                    use std::io::Write;
                    let admitted = results
                        .iter()
                        .filter(|r| {
                            matches!(r, Ok(d) if matches!(d.verdict, Verdict::Trigger | Verdict::Context))
                        })
                        .count();
                    let _ = writeln!(
                        log,
                        "{} {} {} {} {}",
                        keys.len(),
                        admitted,
                        took,
                        cpu,
                        minor_faults() - faults
                    );
                }
                let now = Instant::now();
                for ((key, from_npc), result) in keys.drain(..).zip(results.drain(..)) {
                    count_delivery(&mut report, &mut asked, key, from_npc, result, now);
                }
            }
            // 4. The NPCs' replies since the last tick.
            let t = Instant::now();
            warden.drain_replies(&mut replies, MAX_REPLIES);
            let took = t.elapsed().as_nanos();
            record(&mut report.host_call_ns, took);
            record(&mut report.drain_ns, took);
            let now = Instant::now();
            for reply in replies.drain(..) {
                let sent = asked.remove(&(reply.agent.clone(), reply.event_id));
                if let Some(state) = halt.as_mut().filter(|s| !s.over) {
                    state.report.quiet_ms = ms(now - state.at);
                    if reply.stale {
                        state.report.stale_dropped += 1;
                    }
                }
                if reply.stale {
                    continue; // from before a halt: never shown as current
                }
                match &reply.result {
                    Ok(answer) => {
                        report.npc_replies += 1;
                        if let Some(sent) = sent {
                            record(&mut report.reply_ms, (now - sent).as_millis());
                        }
                        world.npc_says(&reply.agent, &answer.answer, &mut events);
                    }
                    Err(AskError::Discarded { .. }) => report.reply_discarded += 1,
                    Err(AskError::Refused { .. } | AskError::NotQueued(_)) => {
                        report.reply_refused += 1
                    }
                    Err(_) => report.reply_failures += 1,
                }
            }
        } else {
            events.clear(); // agents off: the NPCs are furniture
        }
        let took = tick.elapsed();
        report.ticks += 1;
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = report.tick_us.record_correct(us, TICK.as_micros() as u64);
        if took > TICK {
            report.ticks_over_50ms += 1;
        }
        // The next tick at its time; a late tick does not make the next ones hurry.
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
            next += TICK;
        } else {
            next = now + TICK;
        }
    }
    if let Some(mut state) = halt {
        if !state.over {
            end_halt(&mut state, meter.as_deref(), report.npc_replies);
        }
        if let Some(monitor) = state.monitor.take() {
            state.report.inflight_aborted_ms_max = monitor.join().unwrap_or(f64::NAN);
        }
        report.halt = Some(state.report);
    }
    report.commands = world.counts.commands;
    report.lines_sent = world.counts.lines_sent;
    report.lines_dropped = world.counts.lines_dropped;
    report
}

fn count_delivery(
    report: &mut Report,
    asked: &mut HashMap<(AgentKey, u64), Instant>,
    key: AgentKey,
    from_npc: bool,
    result: Result<warden::host::Delivered, DeliverError>,
    now: Instant,
) {
    match result {
        Ok(delivered) => {
            report.delivered += 1;
            let slot = match delivered.verdict {
                Verdict::Trigger => 0,
                Verdict::Context => 1,
                Verdict::Capture => 2,
                Verdict::Ignore => 3,
            };
            report.classified[slot] += 1;
            if let Some(id) = delivered.event_id {
                report.npc_triggers += u64::from(from_npc);
                asked.insert((key, id), now);
            }
        }
        Err(DeliverError::Busy(_)) => report.refused_busy += 1,
        Err(DeliverError::Halted(_)) => report.refused_halted += 1,
        Err(DeliverError::LockedOut { .. }) => report.refused_locked += 1,
        Err(_) => report.refused_other += 1,
    }
}

fn start_halt(warden: &WardenHandle, meter: Option<&Meter>, lines: u64) -> HaltState {
    // Counted just before the halt: a call that starts between this and the halt counts as
    // started after it (never the other way round).
    let (calls, tokens, completed, inflight) = meter.map_or((0, 0, 0, 0), Meter::snapshot);
    let t = Instant::now();
    warden.halt_all("mud: the operator's kill switch");
    let halt_call_us = t.elapsed().as_secs_f64() * 1e6;
    // Watches the model calls in flight end (aborted by the halt), off the world thread.
    let monitor = meter.map(|m| {
        let meter = m.clone_arc();
        std::thread::spawn(move || {
            let deadline = t + Duration::from_secs(10);
            while meter.in_flight() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(200));
            }
            ms(t.elapsed())
        })
    });
    HaltState {
        at: t,
        calls,
        tokens,
        completed,
        report: HaltReport {
            halt_call_us,
            inflight_at_halt: inflight,
            ..HaltReport::default()
        },
        monitor,
        lines_before: lines,
        over: false,
    }
}

fn end_halt(state: &mut HaltState, meter: Option<&Meter>, lines: u64) {
    let (calls, tokens, completed, _) = meter.map_or((0, 0, 0, 0), Meter::snapshot);
    state.report.llm_calls_started_after_halt = calls - state.calls;
    state.report.tokens_after_halt = tokens - state.tokens;
    state.report.llm_calls_completed_after_halt = completed - state.completed;
    state.report.npc_lines_during_halt = lines - state.lines_before;
    state.over = true;
}

fn record(hist: &mut Histogram<u64>, value: u128) {
    let _ = hist.record(u64::try_from(value).unwrap_or(u64::MAX).max(1));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
