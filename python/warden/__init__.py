"""warden from Python: supervised LLM NPCs behind a host handle that never blocks the game loop.

    import warden

    w = warden.Warden.start(team_file="team.toml")          # journal in memory unless given
    w.deliver("innkeeper", {"speaker": {"id": "p1", "kind": "player"},
                            "kind": "whisper", "text": "a room for the night?"})
    for reply in w.drain_replies(max=16):                   # once a tick; never waits
        if not reply.stale and reply.text:
            print(f"{reply.npc} says: {reply.text}")
    w.halt_all("the game's kill switch")                   # every NPC, before it returns
    w.shutdown()

warden runs on a thread of its own (a Rust actor system); the calls here hand work to it and
return at once. See docs/python.md.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any, AsyncIterator, Mapping, Optional, Union

from . import errors

# `X as X`: an explicit re-export, as type checkers read it. `_noop`: a PyO3 call that does
# nothing, the floor `deliver` is measured against.
from ._native import Delivered as Delivered
from ._native import Reply as Reply
from ._native import _noop as _noop
from ._native import Warden as _NativeWarden
from .errors import (
    AskTimeout as AskTimeout,
    Busy as Busy,
    ConfigError as ConfigError,
    DeliveryRefused as DeliveryRefused,
    Discarded as Discarded,
    Halted as Halted,
    InvalidEvent as InvalidEvent,
    JournalUnavailable as JournalUnavailable,
    LockedOut as LockedOut,
    Shutdown as Shutdown,
    StartFailed as StartFailed,
    TurnFailed as TurnFailed,
    Unknown as Unknown,
    WardenError as WardenError,
)

__all__ = ["Warden", "Delivered", "Reply", "errors"]
__all__ += errors.__all__

# Every warden still running, shut down at interpreter exit (joining warden's thread).
_running: "weakref.WeakSet[Warden]" = weakref.WeakSet()


class Warden(_NativeWarden):
    """A running warden: a team of NPCs on a thread of its own, and the host's calls on it.

    Start it with :meth:`Warden.start`; stop it with :meth:`shutdown` or a ``with`` block
    (or let the interpreter's exit do it).
    """

    @classmethod
    def start(
        cls,
        team_file: Union[str, "os.PathLike[str]", None] = None,
        *,
        team_toml: Optional[str] = None,
        team: Optional[Mapping[str, Any]] = None,
        journal: Union[str, "os.PathLike[str]", None] = None,
    ) -> "Warden":
        """Starts warden with the team of ``team_file`` (a path), ``team_toml`` (its text) or
        ``team`` (a dict of its tables: ``{"providers": {...}, "agents": [...]}``).

        ``journal``: a SQLite file (created if missing; the team's agents come back from it as
        they were) or ``None`` for a journal in memory. Blocks (with the GIL released) until
        every agent is spawned.

        Raises:
            ConfigError: the file cannot be read, parsed or validated (the key, the value and
                what is allowed), or an agent cannot be spawned.
            JournalUnavailable: the journal cannot be opened.
        """
        warden = cls(team_file=team_file, team_toml=team_toml, team=team, journal=journal)
        _running.add(warden)
        return warden

    def __enter__(self) -> "Warden":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    async def ask_async(self, agent: str, text: str, timeout: Optional[float] = None) -> str:
        """:meth:`ask` for asyncio: awaits the answer without blocking the event loop.

        Under Twisted, wrap it: ``Deferred.fromFuture(asyncio.ensure_future(w.ask_async(...)))``
        with the asyncio reactor.
        """
        answer: str = await self._ask_future(agent, text, timeout)
        return answer

    def replies(self) -> AsyncIterator[Reply]:
        """An async iterator over settled events as they come; it ends once warden is shut down.

        It takes replies from the same stream as :meth:`drain_replies`: use one or the other.
        """
        return _Replies(self)


class _Replies:
    """The async iterator of :meth:`Warden.replies`."""

    def __init__(self, warden: Warden) -> None:
        self._warden = warden

    def __aiter__(self) -> "_Replies":
        return self

    async def __anext__(self) -> Reply:
        if self._warden.closed:
            raise StopAsyncIteration
        try:
            reply: Reply = await self._warden._next_reply_future()
        except Shutdown:
            raise StopAsyncIteration from None
        return reply


def _shutdown_all() -> None:
    for warden in list(_running):
        warden.shutdown()


atexit.register(_shutdown_all)
