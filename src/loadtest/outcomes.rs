//! What became of every event the harness sent and of every turn the fleet ran: counted by fate
//! and reason, so that a run where everything failed says so (issue 34).
//!
//! * [`Outcomes`] (`outcomes` in the JSON): every event the harness sent, exactly once, by fate —
//!   `answered`, `failed`, `refused`, `discarded`, `gone`, `timed_out` (still open when the drive
//!   phase was cut, by `--timeout-s` or an interrupt, then discarded by the final halt) — their sum
//!   is `tasks_sent`; the reasons (`failed` by the turn's termination reason, `refused` by the
//!   refusal) with a count and one sample message each, the most frequent first.
//! * [`TurnReasons`] (`turns_by_depth`, `turns_by_agent`): every finished turn (a user event or a
//!   delegated task) by its termination reason, at the agent's depth, and for a team file per
//!   agent (with its role): where in the tree the failures happen.
//! * [`StoppedAgent`] (`stopped_agents`): the agents STOPPED before the final halt, with their depth
//!   and what stopped them (a budget, a breaker, a halt).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use warden_actors::{AskError, Settled};
use warden_protocols::WorkRefusal;

/// At most this many distinct reasons are listed (the rest are summed under `other`).
pub const MAX_REASONS: usize = 20;
/// A sample message is cut to this many characters.
const MAX_SAMPLE: usize = 300;

/// One reason of [`Outcomes::reasons`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    /// The fate: `failed`, `refused`, `discarded`, `gone`, `timed_out`.
    pub fate: String,
    /// The turn's termination reason (`llm_error`, `critical_tokens`, …) for `failed`; the
    /// refusal (`locked_out`, `stopped`, `mailbox_full`, …) for `refused`; the fate again for the
    /// others.
    pub reason: String,
    /// Events with this fate and reason.
    pub count: u64,
    /// The first one's message (the error text, the lockout's cause), cut to 300 characters.
    pub sample: String,
}

/// Every event the harness sent, by fate (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcomes {
    /// Answered (their latencies are `event_latency`).
    pub answered: u64,
    /// Taken by a turn that ended without an answer (a model failure, a limit, a budget stop, a
    /// crash).
    pub failed: u64,
    /// Refused: at once when sent (locked out, stopped, mailbox full), or when the agent came to
    /// take it, or its turn ended in a lockout.
    pub refused: u64,
    /// Discarded by a halt (a halt storm's) before they were answered.
    pub discarded: u64,
    /// The agent was shut down before settling them.
    pub gone: u64,
    /// Still open when the drive phase was cut (`--timeout-s`, an interrupt).
    pub timed_out: u64,
    /// The reasons, the most frequent first (at most [`MAX_REASONS`]).
    pub reasons: Vec<Reason>,
}

impl Outcomes {
    /// Every fate's count summed: `tasks_sent` once the run has ended.
    pub fn total(&self) -> u64 {
        self.answered + self.failed + self.refused + self.discarded + self.gone + self.timed_out
    }

    /// Events that were not answered.
    pub fn unanswered(&self) -> u64 {
        self.total() - self.answered
    }

    /// Counts one event refused when it was sent.
    pub(super) fn refused_at_once(&mut self, refusal: &WorkRefusal) {
        self.refused += 1;
        self.reason("refused", refusal_name(refusal), || refusal.to_string());
    }

    /// Counts one settlement. `cut`: the drive phase was cut before it came (a discard is then
    /// the final halt's, of an event the run did not wait for).
    pub(super) fn settled(&mut self, result: &Settled, cut: bool) {
        match result {
            Ok(_) => self.answered += 1,
            Err(AskError::NotQueued(err)) => self.refused_at_once(&err.refusal),
            Err(AskError::Refused { refusal, .. }) => {
                self.refused += 1;
                self.reason("refused", refusal_name(refusal), || refusal.to_string());
            }
            Err(AskError::Failed { reason, error, id }) => {
                self.failed += 1;
                self.reason("failed", reason.as_str(), || match error {
                    Some(e) => e.clone(),
                    None => format!("event {id} failed ({})", reason.as_str()),
                });
            }
            Err(AskError::Discarded { .. }) if cut => {
                self.timed_out += 1;
                self.reason("timed_out", "timed_out", || {
                    "open when the drive phase was cut; discarded by the final halt".to_owned()
                });
            }
            Err(AskError::Discarded { .. }) => {
                self.discarded += 1;
                self.reason("discarded", "halted", || "discarded by a halt".to_owned());
            }
            Err(AskError::AgentGone) => {
                self.gone += 1;
                self.reason("gone", "agent_gone", || "agent is gone".to_owned());
            }
        }
    }

    /// Counts `n` events never settled by the end of the run (as `timed_out`).
    pub(super) fn unsettled(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.timed_out += n;
        self.reason_n("timed_out", "unsettled", n, || {
            "open when the drive phase was cut; not settled by the end of the run".to_owned()
        });
    }

    fn reason(&mut self, fate: &str, reason: &str, sample: impl FnOnce() -> String) {
        self.reason_n(fate, reason, 1, sample);
    }

    fn reason_n(&mut self, fate: &str, reason: &str, n: u64, sample: impl FnOnce() -> String) {
        match self
            .reasons
            .iter_mut()
            .find(|r| r.fate == fate && r.reason == reason)
        {
            Some(r) => r.count += n,
            None => self.reasons.push(Reason {
                fate: fate.to_owned(),
                reason: reason.to_owned(),
                count: n,
                sample: cut_text(&sample()),
            }),
        }
    }

    /// Sorts the reasons, the most frequent first, and keeps [`MAX_REASONS`] (the rest summed
    /// under `other`).
    pub(super) fn finish(&mut self) {
        self.reasons.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.fate.cmp(&b.fate))
                .then_with(|| a.reason.cmp(&b.reason))
        });
        if self.reasons.len() > MAX_REASONS {
            let rest: u64 = self.reasons[MAX_REASONS - 1..]
                .iter()
                .map(|r| r.count)
                .sum();
            self.reasons.truncate(MAX_REASONS - 1);
            self.reasons.push(Reason {
                fate: "other".to_owned(),
                reason: "other".to_owned(),
                count: rest,
                sample: String::new(),
            });
        }
    }
}

/// A refusal's name: `locked_out`, `stopped`, `mailbox_full`, `closed`, `journal_unavailable`.
pub fn refusal_name(refusal: &WorkRefusal) -> &'static str {
    match refusal {
        WorkRefusal::LockedOut { .. } => "locked_out",
        WorkRefusal::Stopped => "stopped",
        WorkRefusal::MailboxFull { .. } => "mailbox_full",
        WorkRefusal::Closed => "closed",
        WorkRefusal::JournalUnavailable { .. } => "journal_unavailable",
    }
}

fn cut_text(text: &str) -> String {
    match text.char_indices().nth(MAX_SAMPLE) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Finished turns by termination reason (`answered`, `llm_error`, `critical_tokens`, …).
pub type TurnReasons = BTreeMap<String, u64>;

/// One agent's turns, for a team file's run (`turns_by_agent`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentTurns {
    /// Its depth in its delegation tree (roots are 0).
    pub depth: usize,
    /// Its role in the team file: `assistant` or `sub_agent`.
    pub role: String,
    /// Its finished turns by termination reason.
    pub turns: TurnReasons,
}

/// An agent STOPPED before the final halt (`stopped_agents`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoppedAgent {
    /// Its key.
    pub agent: String,
    /// Its depth (roots are 0).
    pub depth: usize,
    /// What stopped it: the `StateChanged` cause journaled with its change to STOPPED (a budget
    /// breaker, a halt, …).
    pub cause: String,
}

/// One lockout of a workload that unlocks (`unlock_after_seconds`), in seconds since the drive
/// phase started (`recoveries`): time to recover is `recovered_s - locked_s`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// The agent locked out.
    pub agent: String,
    /// Its depth (roots are 0).
    pub depth: usize,
    /// When it was locked out.
    pub locked_s: f64,
    /// When the harness unlocked it (`null`: the run ended first).
    pub unlocked_s: Option<f64>,
    /// When it next finished a turn with an answer (`null`: not before the run ended).
    pub recovered_s: Option<f64>,
}
