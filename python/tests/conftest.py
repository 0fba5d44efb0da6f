"""Shared pieces of the pytest suite. It runs against the *installed* wheel (see .ci/run and
docs/python.md): `warden` must come from site-packages, never from this source tree."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Callable, Iterator, List

import pytest

import warden

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "python"


def pytest_sessionstart(session: pytest.Session) -> None:
    # An in-tree import would test the sources, not the wheel a user installs.
    where = pathlib.Path(warden.__file__).resolve()
    assert "site-packages" in where.parts, f"warden imported from {where}, not an installed wheel"


def team(
    replies: str = '["Welcome, traveller."]',
    latency_ms: int = 0,
    npcs: int = 1,
    extra: str = "",
    prefix: str = "innkeeper",
) -> str:
    """A team file on the scripted model: `npcs` NPCs (`innkeeper`, or `npc000`…)."""
    keys = [prefix] if npcs == 1 else [f"npc{i:03}" for i in range(npcs)]
    agents = "".join(
        f'\n[[agents]]\nkey = "{key}"\nprovider = "canned"\nsystem_prompt = "You keep an inn."\n'
        for key in keys
    )
    return (
        f"{extra}\n[providers.canned]\nkind = \"scripted\"\nreplies = {replies}\n"
        f"latency_ms = {latency_ms}\n{agents}"
    )


def whisper(text: str, player: str = "p1") -> dict:
    return {"speaker": {"id": player, "kind": "player"}, "kind": "whisper", "text": text}


def say(text: str, player: str = "p1", room: str = "tavern") -> dict:
    return {
        "speaker": {"id": player, "kind": "player"},
        "kind": "say",
        "room": room,
        "text": text,
        "mentions": [],
    }


def drain_until(
    w: warden.Warden,
    done: Callable[[List[warden.Reply]], bool],
    timeout: float = 10.0,
) -> List[warden.Reply]:
    """Drains replies (as a host's tick would) until `done(all so far)` or the deadline."""
    got: List[warden.Reply] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got.extend(w.drain_replies(max=64))
        if done(got):
            return got
        time.sleep(0.005)
    return got


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


@pytest.fixture
def start() -> Iterator[Callable[..., warden.Warden]]:
    started: List[warden.Warden] = []

    def make(toml: str, **kwargs: object) -> warden.Warden:
        w = warden.Warden.start(team_toml=toml, **kwargs)  # type: ignore[arg-type]
        started.append(w)
        return w

    yield make
    for w in started:
        w.shutdown()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
