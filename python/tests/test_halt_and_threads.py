"""A halt from Python while model calls are in flight; the GIL released while `ask` waits;
warden's thread joined at interpreter exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import warden
from conftest import drain_until, team, wait_for, whisper


def test_a_halt_while_calls_are_in_flight_leaves_no_reply_after_its_epoch(start) -> None:
    npcs = 20
    w = start(team(npcs=npcs, latency_ms=1500))
    keys = [f"npc{i:03}" for i in range(npcs)]
    delivered = {key: w.deliver(key, whisper("what news?")) for key in keys}
    assert all(d.verdict == "TRIGGER" and d.halt_epoch == 0 for d in delivered.values())
    # Every NPC is in its turn: its model call (1.5 s) is in flight.
    assert wait_for(lambda: all(w.status(k)["state"] == "EXECUTING" for k in keys), timeout=5)
    halted_at = time.monotonic()
    w.halt_all("the game's kill switch")
    assert time.monotonic() - halted_at < 0.5  # never waits for the calls
    assert all(w.halt_epoch(k) == 1 for k in keys)
    # Well past the model's latency: whatever settles, none of it is a current answer.
    replies = drain_until(w, lambda got: False, timeout=3.0)
    assert len(replies) == npcs, replies
    for reply in replies:
        assert reply.stale and reply.halt_epoch == 0, reply
        assert reply.status == "discarded" and reply.text is None, reply
    # No model call finished after the halt: no tokens were spent.
    assert all(w.status(k)["tokens_used"] == 0 for k in keys)
    assert w.stats()["halts"] == 1


def test_ask_releases_the_gil_so_another_thread_keeps_running(start) -> None:
    w = start(team(latency_ms=1000))
    counted = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counted
        while not stop.is_set():
            counted += 1

    counter = threading.Thread(target=count)
    counter.start()
    # The counter's pace while this thread sleeps (the GIL free for it): the yardstick.
    time.sleep(0.1)
    paced = counted
    time.sleep(0.4)
    rate = (counted - paced) / 0.4
    before = counted
    started = time.monotonic()
    answer = w.ask("innkeeper", "a room?", timeout=10)
    waited = time.monotonic() - started
    during = counted - before
    stop.set()
    counter.join()
    assert answer == "Welcome, traveller." and waited >= 0.9
    share = during / (rate * waited)
    print(f"\ncounter thread ran {during} iterations during a {waited:.2f} s ask ({share:.0%} of its pace)")
    # With the GIL held during the ask, the counter gets only a switch interval or two (~1 %).
    assert share > 0.3, share


def test_interpreter_exit_shuts_warden_down_and_joins_its_thread(tmp_path) -> None:
    script = tmp_path / "exit.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import atexit, os

            def threads():
                names = []
                for task in os.listdir("/proc/self/task"):
                    with open(f"/proc/self/task/{{task}}/comm") as f:
                        names.append(f.read().strip())
                return names

            # Registered before warden's own hook, so it runs after it (atexit is LIFO).
            atexit.register(lambda: print("after exit:", "warden" in threads(), flush=True))

            import warden
            w = warden.Warden.start(team_toml={team()!r})
            w.deliver("innkeeper", {{"speaker": {{"id": "p1", "kind": "player"}},
                                     "kind": "whisper", "text": "hello"}})
            print("running:", "warden" in threads(), flush=True)
            # no shutdown: the interpreter's exit does it
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["running: True", "after exit: False"], done.stdout


def test_ctrl_c_interrupts_an_ask_that_waits_for_a_slow_model(tmp_path) -> None:
    script = tmp_path / "ask.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time, warden
            w = warden.Warden.start(team_toml={team(latency_ms=60_000)!r})
            print("asking", flush=True)
            started = time.monotonic()
            try:
                w.ask("innkeeper", "a room?")          # no timeout: the model takes a minute
            except KeyboardInterrupt:
                print(f"interrupted after {{time.monotonic() - started:.1f}} s", flush=True)
            w.shutdown()
            """
        )
    )
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "asking\n"
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert out.startswith("interrupted after "), out
    assert float(out.split()[2]) < 5, out
