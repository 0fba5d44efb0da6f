"""The exceptions warden raises, mirroring the Rust host handle's errors.

Every refusal hands the refused event back (``exc.event``): the dict given to ``deliver`` (or the
text given to ``ask``), so a host can keep it for the next tick, retry it, or drop it.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "WardenError",
    "DeliveryRefused",
    "Unknown",
    "Busy",
    "Halted",
    "LockedOut",
    "JournalUnavailable",
    "Shutdown",
    "Discarded",
    "TurnFailed",
    "AskTimeout",
    "InvalidEvent",
    "ConfigError",
    "StartFailed",
]


class WardenError(Exception):
    """Base class of every warden exception.

    Attributes:
        npc: the NPC the call named, when it named one.
        event: the event handed back (the world-event dict, or the text of an ``ask``), if any.
        cause: the Rust error's detail (a lockout's message, the journal's write error), if any.
    """

    npc: Optional[str]
    event: Any
    cause: Optional[str]

    def __init__(
        self,
        message: str,
        *,
        npc: Optional[str] = None,
        event: Any = None,
        cause: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.npc = npc
        self.event = event
        self.cause = cause


class DeliveryRefused(WardenError):
    """An event warden did not take; ``event`` is the event, handed back."""


class Unknown(DeliveryRefused):
    """No NPC has that key."""


class Busy(DeliveryRefused):
    """The NPC's ordinary lane is full (``mailbox.ordinary_capacity``): try again next tick."""


class Halted(DeliveryRefused):
    """The NPC is halted (or a halt was requested): ``resume_all`` brings it back."""


class LockedOut(DeliveryRefused):
    """A breaker locked the NPC out until an operator unlocks it; ``cause`` says why.

    A host shows the NPC as silent ("the innkeeper falls silent").
    """


class JournalUnavailable(DeliveryRefused):
    """The journal cannot write, so nothing is accepted; ``cause`` is its last write error."""


class Shutdown(DeliveryRefused):
    """warden is shut down (or the NPC went away before it answered)."""


class Discarded(WardenError):
    """An ``ask``'s question was queued, then discarded by a halt."""


class TurnFailed(WardenError):
    """The turn that took an ``ask``'s question ended without an answer (a model failure, a
    limit, a budget stop)."""


class AskTimeout(WardenError, TimeoutError):
    """No answer within ``ask``'s ``timeout``; the question stays queued and runs."""


class InvalidEvent(WardenError, ValueError):
    """The dict is not a world event (``{"speaker": {"id", "kind"}, "kind", "text", ...}``);
    nothing was delivered. ``event`` is the offending object."""


class ConfigError(WardenError, ValueError):
    """The team file cannot be read, parsed or started (the key, the value, what is allowed)."""


class StartFailed(WardenError):
    """warden's thread could not be started."""
