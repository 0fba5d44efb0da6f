"""An Evennia-shaped game server driving NPCs through warden, without Evennia.

What an Evennia contrib would do, on the same reactor Evennia runs on (Twisted): players' lines are
perceived by every NPC in the room, a ``LoopingCall`` at 20 Hz delivers them to warden in one
``deliver_batch`` (classification: TRIGGER, CONTEXT or IGNORE), shows the NPCs' replies in the room
with ``drain_replies``, and says so when a breaker locks an NPC out ("the innkeeper falls
silent"). No call waits for a model: the model calls run on warden's thread. Run it::

    pip install twisted
    python examples/python/evennia_like.py            # about 6 seconds

It uses Twisted's asyncio reactor so that an asyncio awaitable (``ask_async``) becomes a Deferred
with ``Deferred.fromFuture``.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
from typing import Any, Dict, List, Optional, Tuple

from twisted.internet import asyncioreactor

_loop = asyncio.new_event_loop()
asyncio.set_event_loop(_loop)
asyncioreactor.install(_loop)  # type: ignore[no-untyped-call]

from twisted.internet import defer, task  # noqa: E402  (after the reactor's install)

from twisted.python.failure import Failure  # noqa: E402

import warden  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent

# (second of the game, player, kind, text): what the players type.
SCRIPT: List[Tuple[float, str, str, str]] = [
    (0.2, "Frodo", "say", "What a lovely evening."),
    (0.4, "Frodo", "@innkeeper", "Have you a room for the night?"),
    (1.2, "Sam", "@guard", "Is it safe here?"),
    (1.6, "Sam", "@innkeeper", "And what does the ale cost?"),
    (2.4, "Frodo", "@innkeeper", "Any news from the Shire?"),
    (3.2, "Sam", "@innkeeper", "Hello? Barliman?"),
    (4.0, "Frodo", "@innkeeper", "Are you listening?"),
    (4.4, "Sam", "say", "He has gone quiet."),
]


class Room:
    """A room: its NPCs and what is shown in it (Evennia's ``msg_contents``)."""

    def __init__(self, name: str, npcs: List[str]) -> None:
        self.name = name
        self.npcs = npcs
        self.silent: set[str] = set()

    def msg_contents(self, text: str) -> None:
        print(f"[{self.name}] {text}", flush=True)


class Game:
    """The server: a room, its NPCs behind warden, and the 20 Hz tick."""

    def __init__(self, w: warden.Warden, room: Room) -> None:
        self.w = w
        self.room = room
        self.perceived: List[Tuple[str, Dict[str, Any]]] = []
        self.elapsed = 0.0
        self.script = list(SCRIPT)
        # The events this tick loop delivered, by (NPC, event id): the reply stream also carries
        # the answers to `ask`, which their own callers show.
        self.awaiting: set[Tuple[str, int]] = set()

    def player_types(self, player: str, kind: str, text: str) -> None:
        """A player's line: shown in the room and perceived by every NPC there."""
        mentions: List[str] = []
        if kind.startswith("@"):  # `@innkeeper text`: said aloud, addressed to the NPC
            mentions = [kind[1:]]
            self.room.msg_contents(f'{player} says to {kind[1:]}: "{text}"')
        else:
            self.room.msg_contents(f'{player} says: "{text}"')
        event = {
            "speaker": {"id": player, "kind": "player"},
            "kind": "say",
            "room": self.room.name,
            "text": text,
            "mentions": mentions,
        }
        self.perceived.extend((npc, event) for npc in self.room.npcs)

    def tick(self) -> None:
        """One frame: the players' input, one batch to warden, the replies that came in."""
        self.elapsed += 0.05
        while self.script and self.script[0][0] <= self.elapsed:
            _, player, kind, text = self.script.pop(0)
            self.player_types(player, kind, text)
        if self.perceived:
            batch, self.perceived = self.perceived, []
            for (npc, event), result in zip(batch, self.w.deliver_batch(batch)):
                if isinstance(result, warden.Delivered):
                    if result.event_id is not None:
                        self.awaiting.add((npc, result.event_id))
                    if result.verdict != "IGNORE":
                        print(f"    ({npc} perceives it: {result.verdict})", flush=True)
                elif isinstance(result, warden.LockedOut):
                    self.falls_silent(npc)
                else:
                    print(f"    ({npc} did not take it: {result})", flush=True)
        for reply in self.w.drain_replies(max=32):
            if (reply.npc, reply.event_id) not in self.awaiting:
                continue  # an `ask`'s answer: its caller shows it
            self.awaiting.discard((reply.npc, reply.event_id))
            if reply.stale:
                continue  # from before a halt: never shown as current
            if reply.text is not None:
                self.room.msg_contents(f'{reply.npc.capitalize()} says: "{reply.text}"')
            elif reply.refusal == "locked_out":
                self.falls_silent(reply.npc)
            else:
                print(f"    ({reply.npc} has no answer: {reply.status})", flush=True)
        for npc in self.room.npcs:
            if npc not in self.room.silent and self.w.status(npc)["state"] == "SAFETY_LOCKOUT":
                self.falls_silent(npc)

    def falls_silent(self, npc: str) -> None:
        if npc not in self.room.silent:
            self.room.silent.add(npc)
            self.room.msg_contents(f"The {npc} falls silent.")


def ask_deferred(w: warden.Warden, npc: str, text: str) -> "defer.Deferred[str]":
    """An asyncio awaitable as a Twisted Deferred (the asyncio reactor runs both)."""
    return defer.Deferred.fromFuture(asyncio.ensure_future(w.ask_async(npc, text, timeout=10)))


def tavern(reactor: Any, seconds: float, team: str) -> "defer.Deferred[None]":
    """The server's life: warden started, the 20 Hz tick, a question from the GM, the halt at
    closing time; the Deferred fires once everything is stopped."""
    w = warden.Warden.start(team_file=team)
    room = Room("tavern", ["innkeeper", "guard"])
    game = Game(w, room)
    loop = task.LoopingCall(game.tick)
    loop.clock = reactor
    loop.start(0.05)  # 20 Hz

    def asked(answer: str) -> None:
        room.msg_contents(f'Guard (asked by the GM) says: "{answer}"')

    def failed(failure: Failure) -> None:
        room.msg_contents(f"(the GM's question got no answer: {failure.getErrorMessage()})")

    def ask_the_guard() -> None:
        ask_deferred(w, "guard", "Report, guard.").addCallbacks(asked, failed)

    def closing() -> None:
        w.halt_all("closing time")  # the game's kill switch: every NPC, at once
        room.msg_contents("The GM halts every NPC.")
        stats = w.stats()
        print(f"delivered {stats['delivered']}, refused {stats['refused']}, replies {stats['replies']}")

    def stop() -> None:
        loop.stop()
        w.shutdown()

    reactor.callLater(0.1, ask_the_guard)
    reactor.callLater(seconds - 0.5, closing)
    done: "defer.Deferred[None]" = task.deferLater(reactor, seconds, stop)
    return done


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="An Evennia-shaped tavern driven by warden.")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--team", default=str(HERE / "team.toml"))
    args = parser.parse_args(argv)
    task.react(tavern, (args.seconds, args.team))  # runs the reactor; exits when done


if __name__ == "__main__":
    main()
