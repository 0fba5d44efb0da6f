"""docs/python.md stays true: its team file starts, its tour runs and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys

import warden
from conftest import REPO

DOC = (REPO / "docs" / "python.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)


def test_every_team_file_in_the_doc_starts() -> None:
    tomls = blocks("toml")
    assert tomls
    for toml in tomls:
        with warden.Warden.start(team_toml=toml) as w:
            assert w.stats()["agents"] >= 1


def test_the_five_minute_tour_runs_as_shown() -> None:
    tour = [b for b in blocks("python") if "Warden.start(team_toml=TEAM)" in b]
    assert len(tour) == 1
    done = subprocess.run(
        [sys.executable, "-c", tour[0]], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [
        "TRIGGER 1",
        "innkeeper says: Welcome, traveller.",
        "not delivered: hello?",
        "1",
    ], done.stdout
