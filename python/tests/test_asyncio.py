"""The asyncio forms: `ask_async`, the async iterator of replies, and a 20 Hz game loop with
100 NPCs (examples/python/asyncio_game.py) — its tick with the agents on against off."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from types import ModuleType

import pytest

import warden
from conftest import EXAMPLES, team, whisper


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_ask_async_answers_without_blocking_the_loop(start) -> None:
    w = start(team(npcs=5, latency_ms=400))

    async def run() -> tuple[list[str], int, float]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        beat = asyncio.create_task(ticker())
        started = time.monotonic()
        answers = await asyncio.gather(
            *(w.ask_async(f"npc{i:03}", "news?", timeout=10) for i in range(5))
        )
        took = time.monotonic() - started
        stop.set()
        await beat
        return list(answers), ticks, took

    answers, ticks, took = asyncio.run(run())
    assert answers == ["Welcome, traveller."] * 5
    assert took < 1.5  # five 0.4 s answers, concurrently
    assert ticks >= 20  # the loop kept running meanwhile (0.4 s at 100 Hz ≈ 40)


def test_ask_async_raises_the_typed_exceptions(start) -> None:
    w = start(team(latency_ms=2000))

    async def run() -> None:
        with pytest.raises(warden.Unknown):
            await w.ask_async("nobody", "hi")
        with pytest.raises(warden.AskTimeout):
            await w.ask_async("innkeeper", "hi", timeout=0.05)
        w.halt_all("stop")
        # Right after the halt: refused, or queued and then discarded — never answered.
        with pytest.raises((warden.Halted, warden.Discarded)):
            await w.ask_async("innkeeper", "are you there?")
        while w.status("innkeeper")["state"] != "STOPPED":
            await asyncio.sleep(0.01)
        with pytest.raises(warden.Halted) as raised:
            await w.ask_async("innkeeper", "still there?")
        assert raised.value.event == "still there?"

    asyncio.run(run())


def test_the_async_iterator_yields_replies_and_ends_at_shutdown(start) -> None:
    w = start(team(npcs=3))
    game = load("asyncio_game")
    ids = {w.deliver(f"npc{i:03}", whisper("hi")).event_id for i in range(3)}

    async def run() -> list[warden.Reply]:
        return await asyncio.wait_for(game.replies_as_they_come(w, 3), timeout=10)

    got = asyncio.run(run())
    assert {r.event_id for r in got} == ids and all(r.text for r in got)

    async def after_shutdown() -> list[warden.Reply]:
        pending = asyncio.ensure_future(game.replies_as_they_come(w, 1))
        await asyncio.sleep(0.1)
        w.shutdown()  # the iterator waiting for a reply ends
        return await asyncio.wait_for(pending, timeout=10)

    assert asyncio.run(after_shutdown()) == []


def test_a_20_hz_loop_with_100_npcs_keeps_its_tick_with_the_agents_on() -> None:
    game = load("asyncio_game")
    seconds, npcs, players = 6.0, 100, 200
    with warden.Warden.start(team_toml=game.team_toml(npcs)) as w:
        on = asyncio.run(game.game(w, seconds, npcs, players))
        stats = w.stats()
    off = asyncio.run(game.game(None, seconds, npcs, players))
    print(
        f"\n20 Hz, {npcs} NPCs, {players} players, {seconds:.0f} s: tick p50/p99 µs "
        f"agents off {off.percentile(50):.0f}/{off.percentile(99):.0f}, "
        f"on {on.percentile(50):.0f}/{on.percentile(99):.0f}; "
        f"{on.delivered} events delivered, {on.replies} replies, {stats['wakes']} wakes"
    )
    assert on.ticks >= 0.9 * seconds * 20 and off.ticks >= 0.9 * seconds * 20
    assert on.delivered > 0 and on.replies > 0 and on.lines_shown
    # The tick's work stays far inside its 50 ms budget: the model calls are on warden's thread.
    assert on.percentile(99) < 50_000, on.percentile(99)
