//! Mailbox benchmarks.
//!
//! * `ordinary_throughput/*` — N ordinary messages through (a) warden's priority mailbox driven by an
//!   actix actor exactly as the agent drives it (coalesced `Wake`s, batches of 64, most urgent lane
//!   first), (b) a plain actix actor (`do_send` per message), (c) a plain tokio mpsc actor loop. Same
//!   work per message (add its payload to a sum), same run. Compare the three as ratios.
//! * `halt_latency/*` — from `AgentHandle::halt` to the agent's acknowledgement of STOPPED, with 0, 10k
//!   and 1M ordinary messages queued (the backlog is built outside the measurement). The agent runs on
//!   its own arbiter and is paused while the backlog is built, so nothing drains it; each measurement
//!   starts with the agent's thread idle.
//!
//! With `CI` set, sizes are smaller so the bench runs quickly.
use actix::{Actor, Context, Handler};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::{
    num::NonZeroUsize,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use support::{LaneActor, Sum, Work};
use tokio::sync::oneshot;
use warden::{
    mailbox::PriorityMailbox, AgentKey, AgentSpec, EventKind, HaltCause, Journal, ScriptStep,
    ScriptedProvider, Supervisor, UserEvent, WardenConfig,
};

/// Counts the messages halts have listed as discarded (the deferred clean-up journals them chunk by
/// chunk, then frees the chunk): the halt bench waits for it between samples, so no sample measures a
/// halt queued behind the previous sample's clean-up.
#[derive(Default)]
struct DiscardCounter(AtomicU64);

impl Journal for DiscardCounter {
    fn append(&self, _: &AgentKey, kind: EventKind) -> u64 {
        if let EventKind::MessagesDiscarded { messages } = &kind {
            self.0.fetch_add(messages.len() as u64, Ordering::Relaxed);
        }
        0
    }

    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        for kind in kinds {
            self.append(agent, kind);
        }
        0
    }

    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, _: u64) -> u64 {
        for (agent, kind) in rows {
            self.append(&agent, kind);
        }
        0
    }

    fn durable(
        &self,
        _: u64,
    ) -> futures::future::BoxFuture<'static, Result<(), warden::NotDurable>> {
        warden::already_durable()
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}

mod support;

fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// (b) plain actix.
struct PlainActor(Sum);

impl Actor for PlainActor {
    type Context = Context<Self>;
}

impl Handler<Work> for PlainActor {
    type Result = ();
    fn handle(&mut self, w: Work, _: &mut Context<Self>) {
        self.0.work(w);
    }
}

fn ordinary_throughput(c: &mut Criterion) {
    let n: u64 = if ci() { 10_000 } else { 200_000 };
    let sys = actix_rt::System::new();
    let mut group = c.benchmark_group("ordinary_throughput");
    group.throughput(Throughput::Elements(n));
    group.sample_size(if ci() { 10 } else { 30 });

    group.bench_function(BenchmarkId::new("warden_priority_mailbox", n), |b| {
        b.iter_custom(|iters| {
            sys.block_on(async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (tx, rx) = oneshot::channel();
                    let mailbox = Arc::new(PriorityMailbox::new(n as usize + 1));
                    let _addr = LaneActor {
                        mailbox: mailbox.clone(),
                        sum: Sum::new(n, tx),
                    }
                    .start();
                    let start = Instant::now();
                    for i in 0..n {
                        let _ = mailbox.try_send(Work(i));
                    }
                    let _ = rx.await;
                    total += start.elapsed();
                }
                total
            })
        })
    });

    group.bench_function(BenchmarkId::new("plain_actix", n), |b| {
        b.iter_custom(|iters| {
            sys.block_on(async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (tx, rx) = oneshot::channel();
                    let addr = PlainActor(Sum::new(n, tx)).start();
                    let start = Instant::now();
                    for i in 0..n {
                        addr.do_send(Work(i));
                    }
                    let _ = rx.await;
                    total += start.elapsed();
                }
                total
            })
        })
    });

    group.bench_function(BenchmarkId::new("plain_tokio_mpsc", n), |b| {
        b.iter_custom(|iters| {
            sys.block_on(async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (tx, rx) = oneshot::channel();
                    let (send, mut recv) = tokio::sync::mpsc::channel::<Work>(n as usize + 1);
                    actix_rt::spawn(async move {
                        let mut sum = Sum::new(n, tx);
                        while let Some(w) = recv.recv().await {
                            sum.work(w);
                        }
                    });
                    let start = Instant::now();
                    for i in 0..n {
                        let _ = send.try_send(Work(i));
                    }
                    let _ = rx.await;
                    total += start.elapsed();
                }
                total
            })
        })
    });
    group.finish();
}

fn halt_latency(c: &mut Criterion) {
    let backlogs: &[usize] = if ci() {
        &[0, 10_000, 100_000]
    } else {
        &[0, 10_000, 1_000_000]
    };
    let sys = actix_rt::System::new();
    let mut group = c.benchmark_group("halt_latency");
    group.sample_size(10);
    for &backlog in backlogs {
        group.bench_function(BenchmarkId::from_parameter(backlog), |b| {
            b.iter_custom(|iters| {
                sys.block_on(async move {
                    let mut config = WardenConfig::default();
                    config.mailbox.ordinary_capacity =
                        NonZeroUsize::new(backlog + 1).unwrap_or(NonZeroUsize::MIN);
                    // The agent runs on its own arbiter (thread), as in production: the operator's
                    // task observes the ack without waiting for the agent thread's other work.
                    config.supervisor.arbiters = 1;
                    let cleared = Arc::new(DiscardCounter::default());
                    let team = Supervisor::new(config, cleared.clone());
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        let model = Arc::new(
                            ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")),
                        );
                        let agent = team
                            .spawn(AgentSpec::assistant(format!("a{i}"), model))
                            .expect("fresh key");
                        // Paused: the ordinary lane is not read, so the backlog stays queued.
                        agent.pause("bench").await.expect("pause");
                        for j in 0..backlog {
                            let _ = agent.try_send_event(UserEvent::new(format!("e{j}")));
                        }
                        // Every backlog size starts from the same place: the agent's thread idle
                        // (parked), as it is whenever an operator's halt arrives out of the blue.
                        actix_rt::time::sleep(Duration::from_millis(5)).await;
                        let start = Instant::now();
                        let ack = agent
                            .halt(HaltCause::Operator {
                                operator: "bench".into(),
                            })
                            .await;
                        total += start.elapsed();
                        assert_eq!(ack.discarded, backlog as u64);
                        // Let the deferred clean-up finish outside the measurement.
                        let expected = (i + 1) * backlog as u64;
                        while cleared.0.load(Ordering::Relaxed) < expected {
                            actix_rt::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                    team.shutdown().await;
                    total
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, ordinary_throughput, halt_latency);
criterion_main!(benches);
