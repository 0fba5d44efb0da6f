//! What a host call can refuse: the world event is always handed back.

use warden_protocols::{npc::WorldEvent, WorkRefusal};

/// A world event [`super::WardenHandle::try_deliver`] did not deliver, handed back (like tokio's
/// `TrySendError`): the host may keep it, retry next frame, or drop it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliverError {
    /// No NPC has that key.
    #[error("no agent with that key")]
    Unknown(WorldEvent),
    /// The NPC's ordinary lane is full (`mailbox.ordinary_capacity`): try again later.
    #[error("the agent's ordinary lane is full")]
    Busy(WorldEvent),
    /// The NPC is halted (or a halt was requested and not yet acted on).
    #[error("the agent is halted")]
    Halted(WorldEvent),
    /// The NPC is locked out by a breaker until an operator unlocks it.
    #[error("the agent is locked out: {cause}")]
    LockedOut {
        /// The world event, handed back.
        event: WorldEvent,
        /// The lockout's message.
        cause: String,
    },
    /// The journal cannot write, so nothing is accepted (see `Journal::degraded`).
    #[error("the journal cannot write: {cause}")]
    JournalUnavailable {
        /// The world event, handed back.
        event: WorldEvent,
        /// The journal's last write error.
        cause: String,
    },
    /// warden was shut down.
    #[error("warden is shut down")]
    Shutdown(WorldEvent),
}

impl DeliverError {
    /// The world event, handed back.
    pub fn into_event(self) -> WorldEvent {
        match self {
            DeliverError::Unknown(event)
            | DeliverError::Busy(event)
            | DeliverError::Halted(event)
            | DeliverError::Shutdown(event)
            | DeliverError::LockedOut { event, .. }
            | DeliverError::JournalUnavailable { event, .. } => event,
        }
    }

    /// The error for a refused event.
    pub(super) fn refused(event: WorldEvent, refusal: WorkRefusal) -> Self {
        match refusal {
            WorkRefusal::LockedOut { cause } => DeliverError::LockedOut { event, cause },
            WorkRefusal::Stopped => DeliverError::Halted(event),
            WorkRefusal::MailboxFull { .. } => DeliverError::Busy(event),
            WorkRefusal::Closed => DeliverError::Shutdown(event),
            WorkRefusal::JournalUnavailable { cause } => {
                DeliverError::JournalUnavailable { event, cause }
            }
        }
    }
}

/// Why [`super::Warden::start`] could not start warden.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// An agent could not be spawned (a duplicate key, a restored record that is another agent's).
    /// Nothing keeps running: the threads started are stopped and joined.
    #[error(transparent)]
    Spawn(#[from] crate::SpawnError),
    /// The operating system refused a thread.
    #[error("cannot start warden's thread: {0}")]
    Thread(#[from] std::io::Error),
    /// The setup of [`super::Warden::start_with`] failed (a team file's agents, …). Nothing keeps
    /// running.
    #[error("warden's setup failed: {0}")]
    Setup(#[from] Box<dyn std::error::Error + Send + Sync>),
    /// warden's thread ended before it was ready (it panicked: see the log).
    #[error("warden's thread ended before it was ready")]
    Died,
}

impl StartError {
    /// A setup error ([`StartError::Setup`]), for `map_err` in the setup of
    /// [`super::Warden::start_with`].
    pub fn setup(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        StartError::Setup(err.into())
    }
}

/// Why [`super::WardenHandle::spawn`] did not add an NPC.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The team refused the spec (a duplicate key, invalid goals or memory settings, …).
    #[error(transparent)]
    Spawn(#[from] crate::SpawnError),
    /// warden is shut down.
    #[error("warden is shut down")]
    Shutdown,
}
