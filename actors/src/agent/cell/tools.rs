//! Tools in flight: starting a tool (refused after a halt), ending it, counting the parallel ones.

use super::*;

impl AgentCell {
    pub(crate) fn tools_in_flight(&self) -> u32 {
        self.tools_in_flight.load(Ordering::Acquire)
    }

    /// No tool runs now: a turn starts, or its calls were dropped (halt, crash).
    pub(crate) fn reset_tools_in_flight(&self) {
        self.tools_in_flight.store(0, Ordering::Release);
    }

    pub(crate) fn tool_started(&self) {
        self.tools_in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// Returns how many are still running.
    pub(crate) fn tool_finished(&self) -> u32 {
        self.tools_in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map_or(0, |n| n - 1)
    }

    /// Starts a tool unless a halt is requested: `EXECUTING → WAITING_FOR_TOOL` for the first of
    /// the calls running at once.
    pub(crate) fn begin_tool(&self, call_id: &str, tool: &str) -> bool {
        let mut rec = self.lock();
        let parallel = rec.state == AgentState::WaitingForTool && self.tools_in_flight() > 0;
        if self.halt_requested() || !(rec.state == AgentState::Executing || parallel) {
            self.emit(
                &mut rec,
                EventKind::ToolRefused {
                    call_id: call_id.to_owned(),
                    tool: tool.to_owned(),
                    reason: "halt requested".into(),
                },
            );
            return false;
        }
        if !parallel
            && self
                .transition(&mut rec, AgentState::WaitingForTool, tool)
                .is_err()
        {
            return false;
        }
        self.tool_started();
        self.emit(
            &mut rec,
            EventKind::ToolStarted {
                call_id: call_id.to_owned(),
                tool: tool.to_owned(),
            },
        );
        true
    }

    /// `WAITING_FOR_TOOL → EXECUTING` when the last running call ends, and the tool's ending journaled.
    pub(crate) fn end_tool(&self, call_id: &str, tool: &str, error: Option<String>) {
        let mut rec = self.lock();
        if self.tool_finished() == 0 && rec.state == AgentState::WaitingForTool {
            let _ = self.transition(&mut rec, AgentState::Executing, "tool finished");
        }
        self.emit(
            &mut rec,
            EventKind::ToolFinished {
                call_id: call_id.to_owned(),
                tool: tool.to_owned(),
                ok: error.is_none(),
                error,
            },
        );
        drop(rec);
        self.npc_tool_finished();
    }
}
