//! Shared test support. Everything is deterministic: agents run on the test's own arbiter
//! (`Supervisor::on_current_arbiter`), time is paused, and waiting means yielding to the runtime until a
//! condition holds — never sleeping on the wall clock.
#![allow(dead_code)]

use serde_json::json;
use std::{
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};
use warden::{
    protocols::{DelegationOutcome, DelegationRefusal},
    AgentHandle, AgentKey, AgentRecord, AgentSpec, AgentState, EventKind, FnTool, HaltCause,
    MemoryJournal, Provider, ScriptStep, ScriptedProvider, Supervisor, Tool, ToolCategory,
    ToolError, WardenConfig,
};

/// The journal's replay of `agent` equals its live record, and the record keeps the lockout
/// invariant (locked out exactly while in SAFETY_LOCKOUT: the state and `emergency_stop` never
/// disagree).
pub fn replay_matches(journal: &MemoryJournal, agent: &warden::AgentHandle) {
    let live = agent.record();
    assert_eq!(
        warden::AgentRecord::replay(agent.key().clone(), &journal.events()),
        live,
        "journal replay of {} differs from its live record",
        agent.key()
    );
    assert!(
        live.lockout_consistent(),
        "{}: state {} but emergency_stop {}",
        agent.key(),
        live.state,
        live.emergency_stop()
    );
    assert_eq!(agent.status().emergency_stop, live.emergency_stop());
}

/// The outcomes of `agent`'s finished turns, in order (its `turn_finished` events).
pub fn outcomes(journal: &MemoryJournal, agent: &str) -> Vec<warden::protocols::TurnOutcome> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            warden::EventKind::TurnFinished { outcome } => Some(outcome),
            _ => None,
        })
        .collect()
}

/// Yields to the runtime until `cond` holds; every 16th try it sleeps 100 ms of (paused, virtual)
/// time, so timers can fire. Panics (naming `what`) if it never holds, instead of hanging the run.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for i in 0..200_000u32 {
        if cond() {
            return;
        }
        if i % 16 == 15 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
    panic!("condition never held: {what}");
}

/// Yields `n` times (lets every ready actor run).
pub async fn settle(n: usize) {
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
}

/// A team on the current arbiter with an in-memory journal.
pub fn team(config: WardenConfig) -> (Supervisor, Arc<MemoryJournal>) {
    let journal = Arc::new(MemoryJournal::new());
    (
        Supervisor::on_current_arbiter(config, journal.clone()),
        journal,
    )
}

/// Spawning in one call, for tests: `team.assistant("a", model([...]))` for
/// `team.spawn(AgentSpec::assistant("a", model([...]))).unwrap()`. A spec with more to it (tools, a
/// prompt, no delegation) still goes through `team.spawn(spec)`.
pub trait Spawn {
    /// Spawns assistant `key` on `model`; panics (failing the test) if the spawn is refused.
    fn assistant(&self, key: &str, model: Arc<dyn Provider>) -> AgentHandle;
    /// Spawns sub-agent `key` of `parent` on `model`; panics if the spawn is refused.
    fn sub_agent(&self, key: &str, parent: &str, model: Arc<dyn Provider>) -> AgentHandle;
}

impl Spawn for Supervisor {
    #[track_caller]
    fn assistant(&self, key: &str, model: Arc<dyn Provider>) -> AgentHandle {
        self.spawn(AgentSpec::assistant(key, model))
            .unwrap_or_else(|e| panic!("spawn {key}: {e}"))
    }

    #[track_caller]
    fn sub_agent(&self, key: &str, parent: &str, model: Arc<dyn Provider>) -> AgentHandle {
        self.spawn(AgentSpec::sub_agent(key, parent, model))
            .unwrap_or_else(|e| panic!("spawn {key}: {e}"))
    }
}

/// A tool that counts its calls and succeeds (or fails when `fail`).
pub fn counting_tool(
    name: &str,
    category: ToolCategory,
    fail: bool,
) -> (Arc<dyn Tool>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let tool = FnTool::new(name, "test tool", category, move |_args, _ctx| {
        counter.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if fail {
            Err(ToolError::Failed("tool failed on purpose".into()))
        } else {
            Ok(serde_json::json!({"success": true}))
        })
    });
    (Arc::new(tool), calls)
}

/// A model that answers "hello" to everything.
pub fn chatty() -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("hello")))
}

/// A model whose every call fails ("model down").
pub fn failing() -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("model down")))
}

pub fn count(c: &AtomicUsize) -> usize {
    c.load(Ordering::SeqCst)
}

/// Awaits `fut` while letting the runtime run; panics if it does not finish within `n` yields.
pub async fn within<F: Future>(what: &str, n: usize, fut: F) -> F::Output {
    tokio::pin!(fut);
    for _ in 0..n {
        if let std::task::Poll::Ready(out) = futures::poll!(fut.as_mut()) {
            return out;
        }
        tokio::task::yield_now().await;
    }
    panic!("did not finish: {what}");
}

pub fn is_state(s: AgentState) -> impl Fn(&warden::AgentHandle) -> bool {
    move |h| h.state() == s
}

/// Sends one event per turn until the agent is locked out (its model must fail every call, so the
/// consecutive-error stop trips after 5).
pub async fn lock_out(agent: &warden::AgentHandle) {
    for i in 0..5 {
        agent
            .try_send_event(warden::UserEvent::new(format!("e{i}")))
            .unwrap();
        until("turn done", || {
            agent.status().turns == i + 1 || agent.state() == AgentState::SafetyLockout
        })
        .await;
    }
    assert_eq!(agent.state(), AgentState::SafetyLockout);
}

/// A fresh database path under the system temp dir, removed (with its WAL files) on drop.
pub struct TempDb(pub std::path::PathBuf);

impl TempDb {
    pub fn new(name: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "warden-journal-test-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst),
            name
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDb(dir.join("warden.db"))
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Undoes [`poison_writes`]: the disk "comes back".
pub fn unpoison_writes(db: &std::path::Path) {
    rusqlite::Connection::open(db)
        .unwrap()
        .execute_batch("DROP TRIGGER poison;")
        .unwrap();
}

/// Makes every insert into the journal's `events` table whose JSON body contains `poison` fail
/// (a trigger created from a second connection): a write failure on demand, in the real journal.
pub fn poison_writes(db: &std::path::Path) {
    rusqlite::Connection::open(db)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.body LIKE '%poison%'
             BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;",
        )
        .unwrap();
}

// ---- journal scenario helpers (shared by the scenario tests) -------------------------------------

pub fn refusals(journal: &MemoryJournal, agent: &str) -> Vec<(AgentKey, DelegationRefusal)> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::DelegationRefused { to, refusal } => Some((to, refusal)),
            _ => None,
        })
        .collect()
}

pub fn endings(journal: &MemoryJournal, agent: &str) -> Vec<(AgentKey, DelegationOutcome)> {
    journal
        .events_of(agent)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::DelegationEnded { to, outcome, .. } => Some((to, outcome)),
            _ => None,
        })
        .collect()
}

pub fn count_events(
    journal: &MemoryJournal,
    agent: &str,
    pred: impl Fn(&EventKind) -> bool,
) -> usize {
    journal
        .events_of(agent)
        .iter()
        .filter(|e| pred(&e.kind))
        .count()
}

pub fn delegate(to: &str, task: &str) -> ScriptStep {
    ScriptStep::call("delegate", json!({"agent": to, "task": task}))
}

pub fn op() -> HaltCause {
    HaltCause::Operator {
        operator: "ops".into(),
    }
}

pub fn model(steps: impl IntoIterator<Item = ScriptStep>) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new(steps))
}

pub fn pending_ids(record: &AgentRecord) -> Vec<u64> {
    record.pending.iter().map(|p| p.id).collect()
}

/// A provider answering with `inner` and keeping every request it was sent.
pub struct Capture {
    inner: ScriptedProvider,
    seen: Arc<parking_lot::Mutex<Vec<warden::LlmRequest>>>,
}

impl Capture {
    /// The provider and the requests it was sent (shared).
    pub fn new(
        inner: ScriptedProvider,
    ) -> (Arc<Self>, Arc<parking_lot::Mutex<Vec<warden::LlmRequest>>>) {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        (
            Arc::new(Capture {
                inner,
                seen: seen.clone(),
            }),
            seen,
        )
    }
}

impl Provider for Capture {
    fn name(&self) -> &str {
        "capture"
    }

    fn complete(
        &self,
        request: warden::LlmRequest,
    ) -> futures::future::BoxFuture<'static, Result<warden::LlmResponse, warden::ProviderError>>
    {
        self.seen.lock().push(request.clone());
        self.inner.complete(request)
    }
}

/// A journal in memory that calls its events durable only up to where the test says
/// (`durable_up_to`), and records each call it gets as the list of the kinds' tags (one entry per
/// `append`, `append_all` or `append_rows`): an acknowledgement that must wait for the disk is held by the test.
pub struct Gated {
    pub inner: MemoryJournal,
    pub durable_up_to: tokio::sync::watch::Sender<u64>,
    calls: parking_lot::Mutex<Vec<Vec<String>>>,
}

impl Default for Gated {
    fn default() -> Self {
        Self::new()
    }
}

impl Gated {
    pub fn new() -> Self {
        Gated {
            inner: MemoryJournal::new(),
            durable_up_to: tokio::sync::watch::channel(0).0,
            calls: Default::default(),
        }
    }

    fn record(&self, kinds: &[EventKind]) {
        let tags = kinds
            .iter()
            .map(|k| {
                serde_json::to_value(k).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        self.calls.lock().push(tags);
    }

    /// The seq of the last event journaled whose kind `is`.
    pub fn last(&self, what: &str, is: impl Fn(&EventKind) -> bool) -> u64 {
        self.inner.inspect(|events| {
            events
                .iter()
                .rev()
                .find(|e| is(&e.kind))
                .map(|e| e.seq)
                .unwrap_or_else(|| panic!("no {what} journaled"))
        })
    }

    /// The seq of the last `event_queued` journaled.
    pub fn last_queued(&self) -> u64 {
        self.last("event_queued", |k| {
            matches!(k, EventKind::EventQueued { .. })
        })
    }

    /// Every call so far, in order: the tags of the kinds each brought.
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().clone()
    }

    /// How many calls brought exactly `event_taken` then `history_appended`.
    pub fn takes_in_one_call(&self) -> usize {
        let take = ["event_taken", "history_appended"];
        self.calls.lock().iter().filter(|c| *c == &take).count()
    }
}

impl warden::Journal for Gated {
    fn append(&self, agent: &AgentKey, kind: EventKind) -> u64 {
        self.record(std::slice::from_ref(&kind));
        self.inner.append(agent, kind)
    }

    fn append_all(&self, agent: &AgentKey, kinds: Vec<EventKind>) -> u64 {
        self.record(&kinds);
        self.inner.append_all(agent, kinds)
    }

    fn append_rows(&self, rows: Vec<(AgentKey, EventKind)>, at_ms: u64) -> u64 {
        let kinds: Vec<_> = rows.iter().map(|(_, kind)| kind.clone()).collect();
        self.record(&kinds);
        self.inner.append_rows(rows, at_ms)
    }

    fn durable(
        &self,
        seq: u64,
    ) -> futures::future::BoxFuture<'static, Result<(), warden::NotDurable>> {
        let mut up_to = self.durable_up_to.subscribe();
        Box::pin(async move {
            let _ = up_to.wait_for(|&d| d >= seq).await;
            Ok(())
        })
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}
