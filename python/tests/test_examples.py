"""The examples run as a user runs them, and their types check under `mypy --strict`."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

from conftest import EXAMPLES


def test_the_evennia_like_tavern_shows_replies_and_the_innkeeper_falling_silent() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "evennia_like.py"), "--seconds", "6"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '[tavern] Innkeeper says: "Welcome to the Prancing Pony! A room is five silver."' in out
    assert '[tavern] Guard says: "' in out
    assert "(innkeeper perceives it: TRIGGER)" in out
    assert "[tavern] The innkeeper falls silent." in out
    assert 'Guard (asked by the GM) says: "' in out
    assert "[tavern] The GM halts every NPC." in out
    # Nothing the innkeeper says after it fell silent.
    after = out.split("The innkeeper falls silent.", 1)[1]
    assert "Innkeeper says" not in after


def test_the_asyncio_game_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "asyncio_game.py"), "--seconds", "3", "--npcs", "20",
         "--compare"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    assert "npc000 answers: " in done.stdout
    assert "agents on: " in done.stdout and "agents off: " in done.stdout


def test_the_examples_type_check_under_mypy_strict() -> None:
    mypy = shutil.which("mypy") or str(pathlib.Path(sys.executable).parent / "mypy")
    done = subprocess.run(
        [mypy, "--strict", "--no-incremental", str(EXAMPLES / "evennia_like.py"),
         str(EXAMPLES / "asyncio_game.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
