"""Type stubs of the extension module `warden._native` (the public names are re-exported by
`warden`; use those)."""

import os
from typing import Any, Awaitable, Dict, Iterable, List, Literal, Mapping, Optional, Tuple, Union

from .errors import DeliveryRefused

#: A world event in the HTTP API's JSON shape:
#: ``{"speaker": {"id": "p1", "kind": "player"}, "kind": "say", "room": "tavern", "text": "...",
#: "mentions": ["innkeeper"], "oob": {...}}`` (``room``, ``mentions`` and ``oob`` optional;
#: speaker kinds ``player``, ``npc``, ``system``; kinds ``say``, ``whisper``, ``emote``,
#: ``channel``, ``system``).
WorldEvent = Mapping[str, Any]

#: One item of :meth:`Warden.deliver_batch`: ``(npc, event)`` or the event's dict with an
#: ``"npc"`` key beside its fields (the shape of ``POST /api/world/batch``).
BatchItem = Union[Tuple[str, WorldEvent], Mapping[str, Any]]

class Delivered:
    """What :meth:`Warden.deliver` did with a world event."""

    @property
    def verdict(self) -> Literal["TRIGGER", "CONTEXT", "CAPTURE", "IGNORE"]:
        """The classification: only a TRIGGER is queued and gets a reply."""
    @property
    def event_id(self) -> Optional[int]:
        """For a TRIGGER, the id its reply will carry (:attr:`Reply.event_id`)."""
    @property
    def halt_epoch(self) -> int:
        """The NPC's halt epoch the event was delivered under."""
    @property
    def queued(self) -> bool:
        """Whether a reply will come for it (it was a TRIGGER)."""

class Reply:
    """One settled event: the NPC's line, or why there is none."""

    @property
    def npc(self) -> str:
        """The NPC."""
    @property
    def event_id(self) -> int:
        """The event's id (:attr:`Delivered.event_id`)."""
    @property
    def halt_epoch(self) -> int:
        """The NPC's halt epoch when the event was delivered."""
    @property
    def stale(self) -> bool:
        """The NPC was halted since the event was delivered: a host that halted drops it."""
    @property
    def status(self) -> Literal["answered", "refused", "discarded", "failed", "gone"]:
        """``answered`` (``text`` is the line) or why there is none."""
    @property
    def text(self) -> Optional[str]:
        """The NPC's line when it answered."""
    @property
    def refusal(
        self,
    ) -> Optional[Literal["locked_out", "halted", "busy", "journal_unavailable", "shutdown"]]:
        """Why a refused event was refused (``locked_out``: show the NPC silent)."""
    @property
    def error(self) -> Optional[str]:
        """The reason there is no line, as text."""
    @property
    def tokens(self) -> int:
        """Tokens of the turn's model calls."""
    @property
    def latency_ms(self) -> float:
        """From the event's acceptance to its answer."""

class Warden:
    """The native handle; :class:`warden.Warden` is the class to use."""

    def __init__(
        self,
        *,
        team_file: Union[str, "os.PathLike[str]", None] = None,
        team_toml: Optional[str] = None,
        team: Optional[Mapping[str, Any]] = None,
        journal: Union[str, "os.PathLike[str]", None] = None,
    ) -> None: ...
    def deliver(self, npc: str, event: WorldEvent) -> Delivered:
        """Delivers a world event to NPC ``npc`` now; never waits.

        Raises:
            Unknown, Busy, Halted, LockedOut, JournalUnavailable, Shutdown: the event was not
                taken (``exc.event`` is it, handed back).
            InvalidEvent: the dict is not a world event.
        """
    def deliver_batch(self, events: Iterable[BatchItem]) -> List[Union[Delivered, DeliveryRefused]]:
        """Delivers every event (at most one cross-thread wake for the batch); one result per
        event, in order: a :class:`Delivered` or the refusal (not raised) with the event."""
    def drain_replies(self, max: int = 64) -> List[Reply]:
        """Up to ``max`` settled events, oldest first; ``[]`` when none is ready. Never waits."""
    def halt_all(self, reason: str) -> None:
        """Halts every NPC (priority 0) before it returns; journaled with ``reason``."""
    def resume_all(self, operator: str) -> int:
        """Queues a resume for every NPC; returns how many. A lockout stays."""
    def status(self, agent: str) -> Dict[str, Any]:
        """NPC ``agent``'s status (the shape of ``GET /api/agents/{key}``)."""
    def stats(self) -> Dict[str, int]:
        """Counters: agents, delivered, refused, replies, wakes, batches, halts, resumes."""
    def set_presence(self, room: str, players: int) -> None:
        """``players`` players are in ``room`` now (0: its NPCs go idle)."""
    def set_clock(self, hour: float) -> None:
        """Sets the game hour (0 to 24, 24 excluded)."""
    def game_hour(self) -> float:
        """The game hour now."""
    def halt_epoch(self, agent: str) -> int:
        """NPC ``agent``'s halt epoch now."""
    def ask(self, agent: str, text: str, timeout: Optional[float] = None) -> str:
        """Asks NPC ``agent`` directly and waits for the answer with the GIL released.

        Raises:
            AskTimeout: no answer within ``timeout`` seconds (the question stays queued).
            Discarded: a halt discarded it. TurnFailed: the turn ended without an answer.
            Unknown, Busy, Halted, LockedOut, JournalUnavailable, Shutdown: refused.
        """
    def _ask_future(self, agent: str, text: str, timeout: Optional[float] = None) -> Awaitable[str]: ...
    def _next_reply_future(self) -> Awaitable[Reply]: ...
    def shutdown(self) -> None:
        """Stops warden and joins its thread; again: nothing."""
    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called."""

def _noop(*args: object) -> None:
    """Does nothing: the floor a ``deliver`` is measured against."""
