"""An asyncio game loop at 20 Hz driving NPCs through warden's handle.

A world of rooms, NPCs standing in them and simulated players: each tick the players' lines become
world events (a ``say`` is heard by every NPC of the room, a whisper triggers one NPC), the tick
delivers them in one ``deliver_batch`` and shows the replies that came in with ``drain_replies``;
the model calls run on warden's thread, never on the loop. Run it::

    python examples/python/asyncio_game.py --seconds 10 --npcs 100

It prints the tick's p50/p99 (the work each tick did, in µs) with the agents on and, with
``--compare``, the same world with them off (the NPCs are furniture: the baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import warden

TICK = 0.05  # 20 Hz


def team_toml(npcs: int, latency_ms: int = 200) -> str:
    """A team of ``npcs`` NPCs (``npc000``…) on the scripted model (no network, no API key)."""
    agents = "".join(
        f'[[agents]]\nkey = "npc{i:03}"\nprovider = "scripted"\n'
        f'system_prompt = "You are a villager of room {i % 50}."\n\n'
        for i in range(npcs)
    )
    return f"""
[npc]
journal_ignored = false   # room chatter: counted, not journaled one row per listener

[providers.scripted]
kind = "scripted"
replies = ["Good day to you.", "Mind the mud.", "The inn is to the north."]
cycle = true
latency_ms = {latency_ms}
jitter_ms = {latency_ms}

{agents}"""


@dataclass
class Figures:
    ticks: int = 0
    tick_us: List[float] = field(default_factory=list)
    delivered: int = 0
    replies: int = 0
    lines_shown: List[str] = field(default_factory=list)

    def percentile(self, p: float) -> float:
        ordered = sorted(self.tick_us)
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def player_lines(rng: random.Random, npcs: int, players: int) -> List[Tuple[str, Dict[str, Any]]]:
    """This tick's player lines, as (npc, world event) pairs: a ``say`` reaches every NPC of the
    room (IGNORE unless addressed), a whisper one NPC (a TRIGGER)."""
    events: List[Tuple[str, Dict[str, Any]]] = []
    rooms = max(1, min(50, npcs))
    for p in range(players):
        if rng.random() > 0.5 * TICK:  # each player acts about once every two seconds
            continue
        room = rng.randrange(rooms)
        speaker = {"id": f"p{p}", "kind": "player"}
        in_room = [f"npc{i:03}" for i in range(room, npcs, rooms)]
        if rng.random() < 0.1 and in_room:
            npc = rng.choice(in_room)
            events.append((npc, {"speaker": speaker, "kind": "whisper", "text": "any news?"}))
        else:
            line = {"speaker": speaker, "kind": "say", "room": f"r{room}", "text": "hello all",
                    "mentions": []}
            events.extend((npc, line) for npc in in_room)
    return events


async def game(
    w: Optional[warden.Warden], seconds: float, npcs: int, players: int, seed: int = 7
) -> Figures:
    """Runs the world for ``seconds`` at 20 Hz; ``w is None``: agents off (the baseline)."""
    rng = random.Random(seed)
    figures = Figures()
    loop = asyncio.get_running_loop()
    next_tick = loop.time()
    end = next_tick + seconds
    while next_tick < end:
        started = time.perf_counter()
        events = player_lines(rng, npcs, players)
        if w is not None:
            results: List[Union[warden.Delivered, warden.DeliveryRefused]] = w.deliver_batch(events)
            figures.delivered += sum(isinstance(r, warden.Delivered) for r in results)
            for reply in w.drain_replies(max=256):
                figures.replies += 1
                if reply.stale or reply.text is None:
                    continue  # from before a halt, or no line: nothing to show
                figures.lines_shown.append(f"{reply.npc} says: {reply.text}")
        figures.tick_us.append((time.perf_counter() - started) * 1e6)
        figures.ticks += 1
        next_tick += TICK
        await asyncio.sleep(max(0.0, next_tick - loop.time()))
    return figures


async def replies_as_they_come(w: warden.Warden, want: int) -> List[warden.Reply]:
    """The other way to take replies: an async iterator (instead of draining once a tick)."""
    got: List[warden.Reply] = []
    async for reply in w.replies():
        got.append(reply)
        if len(got) == want:
            break
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--npcs", type=int, default=100)
    parser.add_argument("--players", type=int, default=200)
    parser.add_argument("--compare", action="store_true", help="also run with the agents off")
    args = parser.parse_args()

    with warden.Warden.start(team_toml=team_toml(args.npcs)) as w:
        on = asyncio.run(game(w, args.seconds, args.npcs, args.players))
        # One question asked directly, awaited without blocking the loop.
        answer = asyncio.run(w.ask_async("npc000", "Where is the inn?", timeout=10))
    for line in on.lines_shown[:5]:
        print(line)
    print(f"npc000 answers: {answer}")
    print(
        f"agents on:  {on.ticks} ticks, tick p50 {on.percentile(50):.0f} µs, "
        f"p99 {on.percentile(99):.0f} µs, {on.delivered} events delivered, {on.replies} replies"
    )
    if args.compare:
        off = asyncio.run(game(None, args.seconds, args.npcs, args.players))
        print(
            f"agents off: {off.ticks} ticks, tick p50 {off.percentile(50):.0f} µs, "
            f"p99 {off.percentile(99):.0f} µs"
        )


if __name__ == "__main__":
    main()
