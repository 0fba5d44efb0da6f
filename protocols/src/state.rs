use serde::{Deserialize, Serialize};
use std::fmt;

/// An agent's lifecycle state. Changed only through the agent cell's `transition` (under the
/// agent's record lock, journaled with the change): by the agent's actor as it runs turns, halts
/// and controls, and by the supervisor when it recovers or gives up on a crashed actor — and only
/// along [`TRANSITIONS`]; anything else is an [`IllegalTransition`], refused and journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AgentState {
    /// Idle; takes the next ordinary message.
    #[default]
    WaitingForEvent,
    /// Running a turn: building a prompt, waiting for the model, deciding.
    Executing,
    /// A tool is running on the agent's behalf (delegations included).
    WaitingForTool,
    /// Waiting for an operator's answer (limit checkpoint in interactive mode).
    WaitingForInput,
    /// A breaker tripped. Refuses all work until an authenticated unlock.
    SafetyLockout,
    /// Halted (SystemHalt, or a hard stop such as an exhausted budget). Refuses all work until resumed.
    Stopped,
}

/// Every legal `(from, to)` pair. One table, read by [`AgentState::can_transition_to`].
///
/// * A breaker trip is only `EXECUTING → SAFETY_LOCKOUT`: breakers are evaluated while the turn runs.
/// * Only an unlock leaves `SAFETY_LOCKOUT`, and it goes to `WAITING_FOR_EVENT`. A halt does not
///   leave it either: a locked-out agent already refuses all work, and moving it to `STOPPED` would
///   let a resume (`STOPPED → WAITING_FOR_EVENT`) lift the lockout without an unlock. A halted
///   locked-out agent stays `SAFETY_LOCKOUT` (its queue is still cleared and its halt journaled).
/// * A halt reaches `STOPPED` from every other state.
/// * `STOPPED → WAITING_FOR_EVENT` is an operator's resume.
pub const TRANSITIONS: &[(AgentState, AgentState)] = {
    use AgentState::*;
    &[
        (WaitingForEvent, Executing),
        (WaitingForEvent, Stopped),
        (Executing, WaitingForTool),
        (Executing, WaitingForInput),
        (Executing, WaitingForEvent),
        (Executing, SafetyLockout),
        (Executing, Stopped),
        (WaitingForTool, Executing),
        (WaitingForTool, Stopped),
        (WaitingForInput, Executing),
        (WaitingForInput, Stopped),
        (SafetyLockout, WaitingForEvent),
        (Stopped, WaitingForEvent),
    ]
};

impl AgentState {
    /// Whether `self → to` is in [`TRANSITIONS`].
    pub fn can_transition_to(self, to: AgentState) -> bool {
        TRANSITIONS.iter().any(|&(f, t)| f == self && t == to)
    }

    /// Checks `self → to` against the table.
    pub fn check_transition(self, to: AgentState) -> Result<(), IllegalTransition> {
        if self.can_transition_to(to) {
            Ok(())
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }

    /// What `self → to` means to the world a host shows (design 000's "notify the character"):
    /// into `SAFETY_LOCKOUT` or `STOPPED` the agent falls silent, out of them it is back; `None`
    /// for every other change.
    pub fn presence_change(self, to: AgentState) -> Option<Presence> {
        match (self.refuses_work(), to.refuses_work()) {
            (false, true) => Some(Presence::Silent),
            (true, false) => Some(Presence::Back),
            _ => None,
        }
    }

    /// `true` for the states that refuse all work (`SAFETY_LOCKOUT`, `STOPPED`).
    pub fn refuses_work(self) -> bool {
        matches!(self, AgentState::SafetyLockout | AgentState::Stopped)
    }

    /// `true` while a turn is running.
    pub fn is_busy(self) -> bool {
        matches!(
            self,
            AgentState::Executing | AgentState::WaitingForTool | AgentState::WaitingForInput
        )
    }

    /// The wire name, e.g. `SAFETY_LOCKOUT`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::WaitingForEvent => "WAITING_FOR_EVENT",
            AgentState::Executing => "EXECUTING",
            AgentState::WaitingForTool => "WAITING_FOR_TOOL",
            AgentState::WaitingForInput => "WAITING_FOR_INPUT",
            AgentState::SafetyLockout => "SAFETY_LOCKOUT",
            AgentState::Stopped => "STOPPED",
        }
    }

    /// All states.
    pub const ALL: [AgentState; 6] = [
        AgentState::WaitingForEvent,
        AgentState::Executing,
        AgentState::WaitingForTool,
        AgentState::WaitingForInput,
        AgentState::SafetyLockout,
        AgentState::Stopped,
    ];
}

impl fmt::Display for AgentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transition that is not in [`TRANSITIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("illegal transition {from} -> {to}")]
pub struct IllegalTransition {
    /// The state the agent was in.
    pub from: AgentState,
    /// The state that was asked for.
    pub to: AgentState,
}

#[cfg(test)]
mod tests {
    use super::AgentState::*;
    use super::*;

    #[test]
    fn only_executing_trips_into_lockout() {
        for s in AgentState::ALL {
            assert_eq!(s.can_transition_to(SafetyLockout), s == Executing, "{s}");
        }
    }

    #[test]
    fn only_unlock_leaves_lockout_and_it_goes_to_waiting() {
        for s in AgentState::ALL {
            let legal = SafetyLockout.can_transition_to(s);
            assert_eq!(legal, s == WaitingForEvent, "{s}");
        }
    }

    #[test]
    fn halt_reaches_stopped_from_every_state_but_lockout() {
        for s in AgentState::ALL {
            let legal = s.can_transition_to(Stopped);
            assert_eq!(legal, s != Stopped && s != SafetyLockout, "{s}");
        }
    }

    #[test]
    fn illegal_transition_is_an_error_with_both_names() {
        let err = WaitingForEvent.check_transition(SafetyLockout).unwrap_err();
        assert_eq!(
            err.to_string(),
            "illegal transition WAITING_FOR_EVENT -> SAFETY_LOCKOUT"
        );
        assert!(Stopped.check_transition(Executing).is_err());
    }

    #[test]
    fn wire_names_are_screaming_snake_case() {
        for s in AgentState::ALL {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
    }
}

/// An agent falling silent or coming back, as a host's world shows it ([`AgentState::presence_change`]):
/// a world-facing notice on the host's reply stream (`GET /api/replies`, the Rust host handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    /// Locked out or halted (`SAFETY_LOCKOUT`, `STOPPED`): it answers nothing until it is back.
    Silent,
    /// Unlocked or resumed: it takes work again.
    Back,
}

impl Presence {
    /// The notice's default words for `agent` (`innkeeper falls silent.`, `innkeeper stirs
    /// again.`); a host with its own words goes by the [`Presence`] itself.
    pub fn notice(self, agent: &str) -> String {
        match self {
            Presence::Silent => format!("{agent} falls silent."),
            Presence::Back => format!("{agent} stirs again."),
        }
    }

    /// `silent` or `back`.
    pub fn as_str(self) -> &'static str {
        match self {
            Presence::Silent => "silent",
            Presence::Back => "back",
        }
    }
}
