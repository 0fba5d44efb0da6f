"""What a host call costs from Python, and no leak over many deliveries. Figures are printed
(`pytest -s`); the assertions are loose bounds, not timers."""

from __future__ import annotations

import gc
import os
import time

import warden
from conftest import rss_bytes, say, team


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99)]


def test_deliver_costs_a_few_microseconds_over_a_noop_pyo3_call(start) -> None:
    w = start(team(npcs=16, extra="[npc]\njournal_ignored = false\n"))
    keys = [f"npc{i:03}" for i in range(16)]
    event = say("chatter")
    noop = warden._noop
    n = 20_000
    clock = time.perf_counter_ns
    floor: list[float] = []
    cost: list[float] = []
    for i in range(n):
        key = keys[i % 16]
        t0 = clock()
        noop(key, event)
        t1 = clock()
        w.deliver(key, event)
        t2 = clock()
        floor.append((t1 - t0) / 1000)
        cost.append((t2 - t1) / 1000)
    batch = [(key, event) for key in keys]
    batched: list[float] = []
    for _ in range(n // 16):
        t0 = clock()
        w.deliver_batch(batch)
        batched.append((clock() - t0) / 1000)
    f50, f99 = percentiles(floor)
    d50, d99 = percentiles(cost)
    b50, b99 = percentiles(batched)
    print(
        f"\n{n} calls, µs: no-op PyO3 call p50 {f50:.2f} p99 {f99:.2f}; "
        f"deliver (an IGNORE) p50 {d50:.2f} p99 {d99:.2f}; "
        f"deliver_batch of 16 p50 {b50:.2f} p99 {b99:.2f} ({b50 / 16:.2f} per event at p50)"
    )
    assert d50 < 1000, d50  # a bound, not a target: a wait on I/O would be milliseconds


def test_a_million_deliveries_do_not_leak() -> None:
    n = int(os.environ.get("WARDEN_LEAK_DELIVERIES", "1000000"))
    toml = team(npcs=10, extra="[npc]\njournal_ignored = false\n")
    with warden.Warden.start(team_toml=toml) as w:
        keys = [f"npc{i:03}" for i in range(10)]
        event = say("chatter")
        batch = [(key, event) for key in keys] * 10  # 100 events a call

        def deliver(count: int) -> None:
            for _ in range(count // len(batch)):
                w.deliver_batch(batch)
                w.drain_replies(max=64)

        deliver(100_000)  # warm up: allocator pools, caches
        gc.collect()
        before = rss_bytes()
        started = time.monotonic()
        deliver(n)
        gc.collect()
        after = rss_bytes()
        took = time.monotonic() - started
        assert w.stats()["delivered"] == 100_000 + n
    growth = after - before
    print(
        f"\n{n} deliveries in {took:.1f} s: RSS {before / 2**20:.1f} MiB before, "
        f"{after / 2**20:.1f} MiB after, growth {growth / 1024:.0f} KiB"
    )
    assert growth < 8 * 2**20, growth
