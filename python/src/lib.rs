//! `warden._native`: the host handle ([`warden_actors::host`]) and team files ([`warden::team`])
//! for Python, through PyO3 (abi3, CPython ≥ 3.9).
//!
//! The public package is `warden` (python/warden/): it subclasses `PyWarden` to add the context
//! manager, the asyncio forms and the shutdown at interpreter exit, and it defines the exception
//! classes (python/warden/errors.py) this module raises. Everything here maps one call of the
//! handle; the docs a Python user reads are in the stubs (python/warden/*.pyi) and docs/python.md.
//!
//! The GIL: calls that never wait (`deliver`, `deliver_batch`, `drain_replies`, `halt_all`, …)
//! keep it (releasing and taking it again would cost more than the call); the calls that wait
//! (`start`, `ask`, `shutdown`) release it for the whole wait. warden's own thread never touches
//! Python.

// A refused delivery hands its world event back by value, as the host handle does.
#![allow(clippy::result_large_err)]
#![deny(clippy::unwrap_used)]
#![deny(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links)]

use parking_lot::RwLock;
use pyo3::{
    exceptions::{PyStopAsyncIteration, PyValueError},
    prelude::*,
    sync::PyOnceLock,
    types::{PyDict, PyList, PyModule, PyTuple},
};
use serde::Deserialize;
use std::{path::PathBuf, sync::Arc, time::Duration};
use warden::{
    host::{DeliverError, Delivered, HostStats, NpcReply, StartError, Warden, WardenHandle},
    team::TeamFile,
    AskError, Journal, MemoryJournal, SqliteJournal, UserEvent, WorkRefusal,
};
use warden_protocols::{
    npc::{Verdict, WorldEvent},
    AgentKey,
};

/// The running warden: a [`WardenHandle`] until `shutdown`.
#[pyclass(frozen, subclass, module = "warden._native", name = "Warden")]
struct PyWarden {
    /// `None` once shut down. Each call clones the handle under the read lock; `shutdown` takes it.
    handle: RwLock<Option<WardenHandle>>,
}

/// What `deliver` did with a world event: its classification and, for a TRIGGER, the id its
/// reply will carry.
#[pyclass(frozen, get_all, module = "warden._native", name = "Delivered")]
struct PyDelivered {
    /// `"TRIGGER"`, `"CONTEXT"`, `"CAPTURE"` or `"IGNORE"`.
    verdict: &'static str,
    /// For a TRIGGER: the id its reply will carry; `None` otherwise.
    event_id: Option<u64>,
    /// The NPC's halt epoch the event was delivered under.
    halt_epoch: u64,
}

#[pymethods]
impl PyDelivered {
    /// Whether the event was queued (a TRIGGER): a reply will come for it.
    #[getter]
    fn queued(&self) -> bool {
        self.event_id.is_some()
    }

    fn __repr__(&self) -> String {
        format!(
            "Delivered(verdict={:?}, event_id={}, halt_epoch={})",
            self.verdict,
            self.event_id
                .map_or_else(|| "None".to_owned(), |id| id.to_string()),
            self.halt_epoch
        )
    }
}

impl From<Delivered> for PyDelivered {
    fn from(done: Delivered) -> Self {
        PyDelivered {
            verdict: verdict_name(done.verdict),
            event_id: done.event_id,
            halt_epoch: done.halt_epoch,
        }
    }
}

fn verdict_name(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Trigger => "TRIGGER",
        Verdict::Context => "CONTEXT",
        Verdict::Capture => "CAPTURE",
        Verdict::Ignore => "IGNORE",
    }
}

/// One settled event: the NPC's line, or why there is none.
#[pyclass(frozen, get_all, module = "warden._native", name = "Reply")]
struct PyReply {
    /// The NPC.
    npc: String,
    /// The event's id (`Delivered.event_id`).
    event_id: u64,
    /// The NPC's halt epoch when the event was delivered.
    halt_epoch: u64,
    /// The NPC was halted after the event was delivered: a host that halted drops this reply.
    stale: bool,
    /// `"answered"`, `"refused"`, `"discarded"` (by a halt), `"failed"` or `"gone"`.
    status: &'static str,
    /// The NPC's line when it answered.
    text: Option<String>,
    /// For a refused event: `"locked_out"`, `"halted"`, `"busy"`, `"journal_unavailable"` or
    /// `"shutdown"`.
    refusal: Option<&'static str>,
    /// Why there is no line (the error's text), when there is none.
    error: Option<String>,
    /// Tokens of the turn's model calls (0 without an answer).
    tokens: u64,
    /// From the event's acceptance to its answer, in milliseconds (0 without an answer).
    latency_ms: f64,
}

#[pymethods]
impl PyReply {
    fn __repr__(&self) -> String {
        format!(
            "Reply(npc={:?}, event_id={}, halt_epoch={}, stale={}, status={:?}, text={:?}, \
             error={:?})",
            self.npc,
            self.event_id,
            self.halt_epoch,
            if self.stale { "True" } else { "False" },
            self.status,
            self.text,
            self.error
        )
    }
}

fn refusal_name(refusal: &WorkRefusal) -> &'static str {
    match refusal {
        WorkRefusal::LockedOut { .. } => "locked_out",
        WorkRefusal::Stopped => "halted",
        WorkRefusal::MailboxFull { .. } => "busy",
        WorkRefusal::JournalUnavailable { .. } => "journal_unavailable",
        WorkRefusal::Closed => "shutdown",
    }
}

impl From<NpcReply> for PyReply {
    fn from(reply: NpcReply) -> Self {
        let mut out = PyReply {
            npc: reply.agent.to_string(),
            event_id: reply.event_id,
            halt_epoch: reply.halt_epoch,
            stale: reply.stale,
            status: "answered",
            text: None,
            refusal: None,
            error: None,
            tokens: 0,
            latency_ms: 0.0,
        };
        match reply.result {
            Ok(answer) => {
                out.tokens = answer.usage.total();
                out.latency_ms = answer.latency.as_secs_f64() * 1000.0;
                out.text = Some(answer.answer);
            }
            Err(err) => {
                let (status, refusal) = match &err {
                    AskError::NotQueued(sent) => ("refused", Some(refusal_name(&sent.refusal))),
                    AskError::Refused { refusal, .. } => ("refused", Some(refusal_name(refusal))),
                    AskError::Discarded { .. } => ("discarded", None),
                    AskError::Failed { .. } => ("failed", None),
                    AskError::AgentGone => ("gone", None),
                };
                out.status = status;
                out.refusal = refusal;
                out.error = Some(err.to_string());
            }
        }
        out
    }
}

/// The exception classes of `warden.errors` (imported once, on the first error).
static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An instance of `warden.errors.<class>` as a `PyErr`; `npc`, `event` (the refused event, handed
/// back) and `cause` as keyword arguments.
fn error(
    py: Python<'_>,
    class: &str,
    message: String,
    npc: Option<&str>,
    event: Option<Py<PyAny>>,
    cause: Option<String>,
) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let module = ERRORS.get_or_try_init(py, || {
            PyModule::import(py, "warden.errors").map(Bound::unbind)
        })?;
        let class = module.bind(py).getattr(class)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("npc", npc)?;
        kwargs.set_item("event", event)?;
        kwargs.set_item("cause", cause)?;
        let instance = class.call((message,), Some(&kwargs))?;
        Ok(PyErr::from_value(instance))
    })();
    made.unwrap_or_else(|err| err)
}

/// A refused delivery as its exception, with `event` (the caller's object) handed back.
fn refused(py: Python<'_>, npc: &str, err: &DeliverError, event: Py<PyAny>) -> PyErr {
    let (class, cause) = match err {
        DeliverError::Unknown(_) => ("Unknown", None),
        DeliverError::Busy(_) => ("Busy", None),
        DeliverError::Halted(_) => ("Halted", None),
        DeliverError::LockedOut { cause, .. } => ("LockedOut", Some(cause.clone())),
        DeliverError::JournalUnavailable { cause, .. } => {
            ("JournalUnavailable", Some(cause.clone()))
        }
        DeliverError::Shutdown(_) => ("Shutdown", None),
    };
    error(
        py,
        class,
        format!("{npc}: {err}"),
        Some(npc),
        Some(event),
        cause,
    )
}

/// A work refusal (of an `ask`) as its exception.
fn refusal_error(py: Python<'_>, npc: &str, refusal: &WorkRefusal, event: Py<PyAny>) -> PyErr {
    let (class, cause) = match refusal {
        WorkRefusal::LockedOut { cause } => ("LockedOut", Some(cause.clone())),
        WorkRefusal::Stopped => ("Halted", None),
        WorkRefusal::MailboxFull { .. } => ("Busy", None),
        WorkRefusal::JournalUnavailable { cause } => ("JournalUnavailable", Some(cause.clone())),
        WorkRefusal::Closed => ("Shutdown", None),
    };
    error(
        py,
        class,
        format!("{npc}: {refusal}"),
        Some(npc),
        Some(event),
        cause,
    )
}

/// Why an `ask` has no answer, as its exception (`event`: the question, handed back).
fn ask_error(py: Python<'_>, npc: &str, err: &AskError, event: Py<PyAny>) -> PyErr {
    match err {
        AskError::NotQueued(sent) => refusal_error(py, npc, &sent.refusal, event),
        AskError::Refused { refusal, .. } => refusal_error(py, npc, refusal, event),
        AskError::Discarded { .. } => error(
            py,
            "Discarded",
            format!("{npc}: {err}"),
            Some(npc),
            Some(event),
            None,
        ),
        AskError::Failed { .. } => error(
            py,
            "TurnFailed",
            format!("{npc}: {err}"),
            Some(npc),
            Some(event),
            None,
        ),
        AskError::AgentGone => error(
            py,
            "Shutdown",
            format!("{npc}: {err}"),
            Some(npc),
            Some(event),
            None,
        ),
    }
}

fn shut_down(py: Python<'_>, npc: Option<&str>, event: Option<Py<PyAny>>) -> PyErr {
    error(
        py,
        "Shutdown",
        "warden is shut down".to_owned(),
        npc,
        event,
        None,
    )
}

fn unknown(py: Python<'_>, npc: &str) -> PyErr {
    error(
        py,
        "Unknown",
        format!("no NPC named {npc:?}"),
        Some(npc),
        None,
        None,
    )
}

/// A world event from a Python dict (the HTTP API's JSON shape).
fn world_event(py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<WorldEvent> {
    pythonize::depythonize(event).map_err(|err| {
        error(
            py,
            "InvalidEvent",
            format!("not a world event: {err}"),
            None,
            Some(event.clone().unbind()),
            None,
        )
    })
}

/// One item of `deliver_batch` in the dict form: the NPC's key beside the event's fields, as
/// `POST /api/world/batch` takes them.
#[derive(Deserialize)]
struct BatchItem {
    npc: String,
    #[serde(flatten)]
    event: WorldEvent,
}

/// Where the team comes from.
enum Source {
    File(PathBuf),
    Toml(String),
    /// A dict, written out as TOML (errors then name the key, not a line of a file).
    Dict(String),
}

/// Reads, parses and validates the team file, opens the journal and starts warden (blocking:
/// called with the GIL released).
fn start(source: Source, journal: Option<PathBuf>) -> Result<WardenHandle, (&'static str, String)> {
    let (text, name) = match source {
        Source::File(path) => match std::fs::read_to_string(&path) {
            Ok(text) => (text, path.display().to_string()),
            Err(err) => {
                return Err((
                    "ConfigError",
                    format!("cannot read team file {}: {err}", path.display()),
                ))
            }
        },
        Source::Toml(text) => (text, "team_toml".to_owned()),
        Source::Dict(text) => (text, "team".to_owned()),
    };
    let file =
        TeamFile::from_toml(&text).map_err(|err| ("ConfigError", format!("{name}: {err}")))?;
    let (journal, records): (Arc<dyn Journal>, _) = match journal {
        None => (Arc::new(MemoryJournal::new()), Vec::new()),
        Some(path) => {
            let opened = SqliteJournal::open_with(
                &path,
                warden::journal::JournalOptions::from(&file.config.journal),
            )
            .map_err(|err| {
                (
                    "JournalUnavailable",
                    format!("journal {}: {err}", path.display()),
                )
            })?;
            let records = opened.recover_records().map_err(|err| {
                (
                    "JournalUnavailable",
                    format!("journal {}: {err}", path.display()),
                )
            })?;
            (Arc::new(opened), records)
        }
    };
    let config = file.config.clone();
    Warden::start_with(config, journal, move |team| {
        file.spawn_agents_restored(team, &records)
            .map_err(StartError::setup)
    })
    .map_err(|err| {
        let class = match err {
            StartError::Spawn(_) | StartError::Setup(_) => "ConfigError",
            StartError::Thread(_) | StartError::Died => "StartFailed",
        };
        (class, format!("{name}: warden could not start: {err}"))
    })
}

impl PyWarden {
    /// Runs `f` on the handle, or raises `Shutdown` once warden is shut down.
    ///
    /// The lock is held only to clone the handle (two reference counts): never across a Python
    /// call, which may let another thread take the GIL and wait for this lock.
    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&WardenHandle) -> PyResult<T>) -> PyResult<T> {
        match self.current() {
            Some(handle) => f(&handle),
            None => Err(shut_down(py, None, None)),
        }
    }

    fn current(&self) -> Option<WardenHandle> {
        self.handle.read().clone()
    }

    fn handle(&self, py: Python<'_>) -> PyResult<WardenHandle> {
        self.current().ok_or_else(|| shut_down(py, None, None))
    }
}

#[pymethods]
impl PyWarden {
    /// Starts warden on a thread of its own with the team of `team_file` (a path), `team_toml`
    /// (the file's text) or `team` (a dict of its tables), on the journal at `journal` (a SQLite file, created if missing; the
    /// team's agents are restored from it) or in memory (`None`).
    #[new]
    #[pyo3(signature = (*, team_file=None, team_toml=None, team=None, journal=None))]
    fn new(
        py: Python<'_>,
        team_file: Option<PathBuf>,
        team_toml: Option<String>,
        team: Option<&Bound<'_, PyAny>>,
        journal: Option<PathBuf>,
    ) -> PyResult<Self> {
        let source = match (team_file, team_toml, team) {
            (Some(path), None, None) => Source::File(path),
            (None, Some(text), None) => Source::Toml(text),
            (None, None, Some(dict)) => {
                let value: toml::Value = pythonize::depythonize(dict).map_err(|err| {
                    error(
                        py,
                        "ConfigError",
                        format!("team: not a team file's tables: {err}"),
                        None,
                        None,
                        None,
                    )
                })?;
                let text = toml::to_string(&value).map_err(|err| {
                    error(
                        py,
                        "ConfigError",
                        format!("team: cannot be written as TOML: {err}"),
                        None,
                        None,
                        None,
                    )
                })?;
                Source::Dict(text)
            }
            _ => {
                return Err(PyValueError::new_err(
                    "give exactly one of team_file= (a path), team_toml= (the file's text) or \
                     team= (a dict of its tables)",
                ))
            }
        };
        match py.detach(move || start(source, journal)) {
            Ok(handle) => Ok(PyWarden {
                handle: RwLock::new(Some(handle)),
            }),
            Err((class, message)) => Err(error(py, class, message, None, None, None)),
        }
    }

    /// Delivers a world event (a dict in the HTTP API's shape) to NPC `npc`; never waits.
    fn deliver(
        &self,
        py: Python<'_>,
        npc: &str,
        event: &Bound<'_, PyAny>,
    ) -> PyResult<PyDelivered> {
        let world = world_event(py, event)?;
        let Some(handle) = self.current() else {
            return Err(shut_down(py, Some(npc), Some(event.clone().unbind())));
        };
        match handle.try_deliver(npc, world) {
            Ok(done) => Ok(done.into()),
            Err(err) => Err(refused(py, npc, &err, event.clone().unbind())),
        }
    }

    /// Delivers many events at once: `(npc, event)` tuples or dicts with an `"npc"` key beside
    /// the event's fields. Returns one result per event, in order: a `Delivered` or the exception
    /// (not raised) with the event handed back. An item that is not a world event raises
    /// `InvalidEvent` before anything is delivered.
    fn deliver_batch<'py>(
        &self,
        py: Python<'py>,
        events: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut batch: Vec<(AgentKey, WorldEvent)> = Vec::new();
        let mut originals: Vec<Bound<'py, PyAny>> = Vec::new();
        for item in events.try_iter()? {
            let item = item?;
            if let Ok(pair) = item.cast::<PyTuple>() {
                if pair.len() != 2 {
                    return Err(error(
                        py,
                        "InvalidEvent",
                        format!(
                            "a batch item is (npc, event) or a dict: got {} values",
                            pair.len()
                        ),
                        None,
                        Some(item.clone().unbind()),
                        None,
                    ));
                }
                let npc: String = pair.get_item(0)?.extract()?;
                let event = pair.get_item(1)?;
                batch.push((AgentKey::from(npc.as_str()), world_event(py, &event)?));
                originals.push(event);
            } else {
                let parsed: BatchItem = pythonize::depythonize(&item).map_err(|err| {
                    error(
                        py,
                        "InvalidEvent",
                        format!("not a batch item (an \"npc\" key and a world event): {err}"),
                        None,
                        Some(item.clone().unbind()),
                        None,
                    )
                })?;
                batch.push((AgentKey::from(parsed.npc.as_str()), parsed.event));
                originals.push(item);
            }
        }
        let keys: Vec<AgentKey> = batch.iter().map(|(key, _)| key.clone()).collect();
        let mut results = Vec::with_capacity(batch.len());
        match self.current() {
            Some(handle) => {
                handle.deliver_batch(&mut batch, &mut results);
            }
            None => results.extend(
                batch
                    .drain(..)
                    .map(|(_, event)| Err(DeliverError::Shutdown(event))),
            ),
        }
        let out = PyList::empty(py);
        for ((result, key), original) in results.into_iter().zip(keys).zip(originals) {
            match result {
                Ok(done) => out.append(Bound::new(py, PyDelivered::from(done))?)?,
                Err(err) => {
                    let exception = refused(py, key.as_str(), &err, original.unbind());
                    out.append(exception.into_value(py))?;
                }
            }
        }
        Ok(out)
    }

    /// Up to `max` settled events, oldest first; an empty list when none is ready. Never waits.
    #[pyo3(signature = (max=64))]
    fn drain_replies<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyList>> {
        let mut replies = Vec::new();
        self.with(py, |handle| {
            handle.drain_replies(&mut replies, max);
            Ok(())
        })?;
        let out = PyList::empty(py);
        for reply in replies {
            out.append(Bound::new(py, PyReply::from(reply))?)?;
        }
        Ok(out)
    }

    /// Halts every NPC (priority 0) before it returns: model calls in flight are abandoned,
    /// deliveries refused as `Halted`, replies from before are stale. Journaled with `reason`.
    fn halt_all(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        self.with(py, |handle| {
            handle.halt_all(reason);
            Ok(())
        })
    }

    /// Queues a resume for every NPC (journaled with `operator`); returns how many. A breaker's
    /// lockout stays.
    fn resume_all(&self, py: Python<'_>, operator: &str) -> PyResult<usize> {
        self.with(py, |handle| Ok(handle.resume_all(operator)))
    }

    /// NPC `agent`'s status as a dict (the shape of `GET /api/agents/{key}`).
    fn status<'py>(&self, py: Python<'py>, agent: &str) -> PyResult<Bound<'py, PyAny>> {
        let status = self.with(py, |handle| {
            handle
                .agent(agent)
                .map(|found| found.status())
                .ok_or_else(|| unknown(py, agent))
        })?;
        Ok(pythonize::pythonize(py, &status)?)
    }

    /// The handle's counters as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let HostStats {
            agents,
            delivered,
            refused,
            replies,
            wakes,
            batches,
            halts,
            resumes,
        } = self.with(py, |handle| Ok(handle.stats()))?;
        let out = PyDict::new(py);
        out.set_item("agents", agents)?;
        out.set_item("delivered", delivered)?;
        out.set_item("refused", refused)?;
        out.set_item("replies", replies)?;
        out.set_item("wakes", wakes)?;
        out.set_item("batches", batches)?;
        out.set_item("halts", halts)?;
        out.set_item("resumes", resumes)?;
        Ok(out)
    }

    /// The game server reports that `players` players are in `room` now; an NPC whose room is
    /// reported empty goes idle.
    fn set_presence(&self, py: Python<'_>, room: &str, players: usize) -> PyResult<()> {
        self.with(py, |handle| {
            handle.set_presence(room, players);
            Ok(())
        })
    }

    /// Sets the game clock to `hour` (0 to 24, 24 excluded; fractions are minutes).
    fn set_clock(&self, py: Python<'_>, hour: f64) -> PyResult<()> {
        if !(0.0..24.0).contains(&hour) {
            return Err(PyValueError::new_err(format!(
                "hour {hour} is not a game hour from 0 to 24 (24 excluded)"
            )));
        }
        self.with(py, |handle| {
            handle.set_game_hour(hour);
            Ok(())
        })
    }

    /// The game hour now (0 to 24).
    fn game_hour(&self, py: Python<'_>) -> PyResult<f64> {
        self.with(py, |handle| Ok(handle.game_hour()))
    }

    /// NPC `agent`'s halt epoch now (how many halts it went through).
    fn halt_epoch(&self, py: Python<'_>, agent: &str) -> PyResult<u64> {
        self.with(py, |handle| {
            handle.halt_epoch(agent).ok_or_else(|| unknown(py, agent))
        })
    }

    /// Asks NPC `agent` `text` directly (an ordinary user event, not a world event) and waits
    /// for its answer, with the GIL released; `timeout` in seconds (`None`: no limit).
    #[pyo3(signature = (agent, text, timeout=None))]
    fn ask(
        &self,
        py: Python<'_>,
        agent: &str,
        text: String,
        timeout: Option<f64>,
    ) -> PyResult<String> {
        let handle = self.handle(py)?;
        let limit = timeout_of(timeout)?;
        let question = text.clone();
        let key = agent.to_owned();
        let mut asked = Box::pin(ask_future(handle, key, question, limit));
        // Waited for in slices, the GIL released for each, so that Ctrl-C (a signal handled by
        // Python's main thread) interrupts a long ask: `check_signals` raises KeyboardInterrupt,
        // and dropping the future leaves the question queued (cancel safe), as a timeout does.
        let outcome = loop {
            let slice = py.detach(|| {
                pyo3_async_runtimes::tokio::get_runtime()
                    .block_on(async { tokio::time::timeout(SIGNAL_SLICE, &mut asked).await })
            });
            match slice {
                Ok(outcome) => break outcome,
                Err(_) => py.check_signals()?,
            }
        };
        outcome_to_py(py, agent, outcome, text)
    }

    /// The awaitable of `ask_async` (the `warden.Warden` method wraps it).
    #[pyo3(signature = (agent, text, timeout=None))]
    fn _ask_future<'py>(
        &self,
        py: Python<'py>,
        agent: String,
        text: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle(py)?;
        let limit = timeout_of(timeout)?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let outcome = ask_future(handle, agent.clone(), text.clone(), limit).await;
            Python::attach(|py| outcome_to_py(py, &agent, outcome, text))
        })
    }

    /// The awaitable of the next settled event (`None` once warden is shut down and nothing is
    /// left), for the async reply iterator.
    fn _next_reply_future<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle(py)?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            match handle.next_reply().await {
                Some(reply) => Ok(PyReply::from(reply)),
                None => Err(PyStopAsyncIteration::new_err("warden is shut down")),
            }
        })
    }

    /// Stops warden: the team is shut down and warden's thread joined (with the GIL released).
    /// Calling it again does nothing.
    fn shutdown(&self, py: Python<'_>) {
        // The write lock is waited for with the GIL released: a reader holding the read lock may
        // be inside a Python call (an exception being built) that needs the GIL.
        let handle = py.detach(|| self.handle.write().take());
        if let Some(handle) = handle {
            py.detach(move || handle.shutdown());
        }
    }

    /// Whether `shutdown` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.handle.read().is_none()
    }
}

/// How often a blocking `ask` looks for a signal (Ctrl-C) while it waits.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// What an ask came to, before it is turned into Python objects.
enum AskOutcome {
    Answer(String),
    Unknown,
    Failed(AskError),
    TimedOut(f64),
}

fn timeout_of(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(seconds) => Duration::try_from_secs_f64(seconds).map(Some).map_err(|_| {
            PyValueError::new_err(format!(
                "timeout {seconds} is not a number of seconds ≥ 0 (or None: no limit)"
            ))
        }),
    }
}

async fn ask_future(
    handle: WardenHandle,
    npc: String,
    text: String,
    limit: Option<Duration>,
) -> AskOutcome {
    let Some(agent) = handle.agent(&npc) else {
        return AskOutcome::Unknown;
    };
    let asked = agent.ask(UserEvent::new(text));
    let settled = match limit {
        None => asked.await,
        Some(limit) => match tokio::time::timeout(limit, asked).await {
            Ok(settled) => settled,
            Err(_) => return AskOutcome::TimedOut(limit.as_secs_f64()),
        },
    };
    match settled {
        Ok(reply) => AskOutcome::Answer(reply.answer),
        Err(err) => AskOutcome::Failed(err),
    }
}

fn outcome_to_py(py: Python<'_>, npc: &str, outcome: AskOutcome, text: String) -> PyResult<String> {
    let question = || {
        text.clone()
            .into_pyobject(py)
            .map(|s| s.into_any().unbind())
    };
    match outcome {
        AskOutcome::Answer(answer) => Ok(answer),
        AskOutcome::Unknown => Err(unknown(py, npc)),
        AskOutcome::Failed(err) => Err(ask_error(py, npc, &err, question()?)),
        AskOutcome::TimedOut(seconds) => Err(error(
            py,
            "AskTimeout",
            format!("{npc}: no answer within {seconds} s (the question stays queued)"),
            Some(npc),
            Some(question()?),
            None,
        )),
    }
}

/// Does nothing: the floor a `deliver` is measured against (the cost of any PyO3 call).
#[pyfunction]
#[pyo3(signature = (*_args))]
fn _noop(_args: &Bound<'_, PyTuple>) {}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWarden>()?;
    m.add_class::<PyDelivered>()?;
    m.add_class::<PyReply>()?;
    m.add_function(wrap_pyfunction!(_noop, m)?)?;
    Ok(())
}
