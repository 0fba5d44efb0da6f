use serde::{Deserialize, Serialize};

/// The mailbox lanes, most urgent first. `Ord` follows urgency: `SystemHalt < Control < …`, so the
/// smallest non-empty lane is the one to read. Within one lane messages are FIFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Priority {
    /// 0 — the kill switch. Acted on before anything queued; aborts the in-flight LLM call.
    SystemHalt = 0,
    /// 1 — operator controls: unlock, emergency clear, history reset, pause, resume.
    Control = 1,
    /// 2 — supervision: a delegate this agent waits on was locked out (the signal that ends the
    /// wait at once).
    Supervision = 2,
    /// 3 — ordinary work, each message one turn: user events, ticks, tasks delegated to this agent.
    /// (Tool results and delegation results never use the mailbox: they resolve inside the turn
    /// that waits for them.)
    Ordinary = 3,
}

impl Priority {
    /// Number of lanes.
    pub const COUNT: usize = 4;
    /// All lanes, most urgent first.
    pub const ALL: [Priority; Priority::COUNT] = [
        Priority::SystemHalt,
        Priority::Control,
        Priority::Supervision,
        Priority::Ordinary,
    ];

    /// The lane index, 0 for `SystemHalt` up to 3 for `Ordinary`.
    pub const fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halt_is_the_most_urgent_and_order_follows_the_numbers() {
        let mut all = Priority::ALL;
        all.reverse();
        all.sort();
        assert_eq!(all, Priority::ALL);
        for (i, p) in Priority::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
        }
        assert!(Priority::SystemHalt < Priority::Ordinary);
    }
}
