"""The host handle from Python: deliveries, replies, the typed exceptions, presence and clock."""

from __future__ import annotations

import pathlib
import time

import pytest

import warden
from conftest import drain_until, say, team, wait_for, whisper


def test_the_contract_a_team_file_a_whisper_and_its_reply(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "team.toml"
    path.write_text(team())
    w = warden.Warden.start(team_file=str(path))
    try:
        done = w.deliver(
            "innkeeper",
            {"speaker": {"id": "p1", "kind": "player"}, "kind": "whisper", "text": "hello"},
        )
        assert done.verdict == "TRIGGER" and done.queued and done.event_id is not None
        assert done.halt_epoch == 0
        replies = drain_until(w, lambda got: len(got) >= 1)
        assert len(replies) == 1, replies
        reply = replies[0]
        assert (reply.npc, reply.event_id, reply.halt_epoch, reply.stale) == (
            "innkeeper",
            done.event_id,
            0,
            False,
        )
        assert (reply.status, reply.text, reply.error) == ("answered", "Welcome, traveller.", None)
        assert reply.tokens > 0
        assert w.drain_replies(max=16) == []
        w.halt_all("reason")
        assert w.halt_epoch("innkeeper") == 1
        with pytest.raises(warden.Halted):
            w.deliver("innkeeper", whisper("hello again"))
        assert wait_for(lambda: w.status("innkeeper")["state"] == "STOPPED")
    finally:
        w.shutdown()


def test_a_say_nobody_addressed_is_ignored_and_gets_no_reply(start) -> None:
    w = start(team())
    done = w.deliver("innkeeper", say("nice weather"))
    assert (done.verdict, done.event_id, done.queued) == ("IGNORE", None, False)
    assert w.stats()["delivered"] == 1


def test_a_batch_takes_tuples_and_dicts_and_gives_one_result_each(start) -> None:
    w = start(team(npcs=3))
    results = w.deliver_batch(
        [
            ("npc000", whisper("a room?")),
            {"npc": "npc001", **whisper("ale?")},
            ("nobody", whisper("hello?")),
            ("npc002", say("chatter")),
        ]
    )
    assert [type(r).__name__ for r in results] == ["Delivered", "Delivered", "Unknown", "Delivered"]
    assert results[0].verdict == "TRIGGER" and results[3].verdict == "IGNORE"
    refused = results[2]
    assert isinstance(refused, warden.Unknown) and refused.npc == "nobody"
    assert refused.event == whisper("hello?")  # the event handed back
    replies = drain_until(w, lambda got: len(got) >= 2)
    assert sorted(r.npc for r in replies) == ["npc000", "npc001"]
    stats = w.stats()
    assert (stats["batches"], stats["delivered"], stats["refused"]) == (1, 3, 1)


def test_an_unknown_npc_raises_unknown_with_the_event_handed_back(start) -> None:
    w = start(team())
    event = whisper("anyone?")
    with pytest.raises(warden.Unknown) as raised:
        w.deliver("nobody", event)
    assert raised.value.event is event and raised.value.npc == "nobody"
    assert isinstance(raised.value, warden.DeliveryRefused)
    with pytest.raises(warden.Unknown):
        w.status("nobody")


def test_a_malformed_event_is_refused_with_what_is_wrong_and_nothing_delivered(start) -> None:
    w = start(team())
    bad = {"speaker": {"id": "p1", "kind": "player"}, "kind": "shout", "text": "hi"}
    with pytest.raises(warden.InvalidEvent) as raised:
        w.deliver("innkeeper", bad)
    assert "shout" in str(raised.value) and raised.value.event is bad
    assert isinstance(raised.value, ValueError)
    with pytest.raises(warden.InvalidEvent, match="unknown field"):
        w.deliver("innkeeper", {**whisper("hi"), "colour": "red"})
    with pytest.raises(warden.InvalidEvent):
        w.deliver_batch([("innkeeper", whisper("fine")), ("innkeeper", bad)])
    assert w.stats()["delivered"] == 0  # the batch was refused whole


def test_halted_npcs_refuse_until_resumed(start) -> None:
    w = start(team())
    w.halt_all("closing time")
    event = whisper("one more?")
    with pytest.raises(warden.Halted) as raised:
        w.deliver("innkeeper", event)
    assert raised.value.event is event
    assert w.halt_epoch("innkeeper") == 1
    assert w.resume_all("gm") == 1
    done = None
    for _ in range(400):  # the resume is queued; deliveries are refused until it is read
        try:
            done = w.deliver("innkeeper", whisper("one more?"))
            break
        except warden.Halted:
            time.sleep(0.005)
    assert done is not None and done.halt_epoch == 1
    replies = drain_until(w, lambda got: any(r.event_id == done.event_id for r in got))
    mine = [r for r in replies if r.event_id == done.event_id]
    assert mine and mine[0].text == "Welcome, traveller." and not mine[0].stale


def test_a_failing_model_locks_the_npc_out_and_deliveries_say_why(start) -> None:
    toml = team(
        replies='[{ fail = "the model is down" }]',
        extra="[safety.breakers]\nmax_consecutive_errors = 2\n",
    )
    w = start(toml)
    for i in range(4):
        try:
            w.deliver("innkeeper", whisper(f"hello {i}"))
        except warden.LockedOut:
            break
        drain_until(w, lambda got: len(got) >= 1, timeout=5)
    with pytest.raises(warden.LockedOut) as raised:
        w.deliver("innkeeper", whisper("hello?"))
    assert raised.value.cause and raised.value.event == whisper("hello?")
    assert w.status("innkeeper")["state"] == "SAFETY_LOCKOUT"
    assert w.status("innkeeper")["emergency_stop"] is True


def test_after_shutdown_every_call_raises_shutdown(start) -> None:
    w = start(team())
    w.shutdown()
    w.shutdown()  # again: nothing
    assert w.closed
    event = whisper("hello?")
    with pytest.raises(warden.Shutdown) as raised:
        w.deliver("innkeeper", event)
    assert raised.value.event is event
    results = w.deliver_batch([("innkeeper", event)])
    assert isinstance(results[0], warden.Shutdown) and results[0].event is event
    with pytest.raises(warden.Shutdown):
        w.drain_replies()
    with pytest.raises(warden.Shutdown):
        w.halt_all("late")


def test_a_context_manager_shuts_down(start) -> None:
    with warden.Warden.start(team_toml=team()) as w:
        assert w.stats()["agents"] == 1
    assert w.closed


def test_a_bad_team_file_names_the_key_the_value_and_what_is_allowed(tmp_path) -> None:
    toml = team(extra="[safety.breakers]\nmax_consecutive_errors = 0\n")
    with pytest.raises(warden.ConfigError) as raised:
        warden.Warden.start(team_toml=toml)
    assert "max_consecutive_errors" in str(raised.value) and "line" in str(raised.value)
    with pytest.raises(warden.ConfigError, match="cannot read team file"):
        warden.Warden.start(team_file=str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match="exactly one"):
        warden.Warden.start()


def test_presence_and_the_clock_reach_the_team(start) -> None:
    w = start(team())
    w.set_presence("tavern", 0)
    w.set_clock(21.5)
    assert abs(w.game_hour() - 21.5) < 0.1
    with pytest.raises(ValueError, match="game hour"):
        w.set_clock(24.0)


def test_a_journal_file_keeps_the_npcs_state_across_restarts(tmp_path) -> None:
    db = tmp_path / "warden.db"
    with warden.Warden.start(team_toml=team(), journal=str(db)) as w:
        w.halt_all("kept across a restart")
    with warden.Warden.start(team_toml=team(), journal=db) as w:
        assert w.status("innkeeper")["state"] == "STOPPED"
        with pytest.raises(warden.Halted):
            w.deliver("innkeeper", whisper("still shut?"))


def test_ask_answers_and_a_timeout_raises_ask_timeout(start) -> None:
    w = start(team(latency_ms=300))
    assert w.ask("innkeeper", "a room?", timeout=10) == "Welcome, traveller."
    with pytest.raises(warden.AskTimeout) as raised:
        w.ask("innkeeper", "another?", timeout=0.01)
    assert isinstance(raised.value, TimeoutError) and raised.value.event == "another?"
    with pytest.raises(warden.Unknown):
        w.ask("nobody", "hi")


def test_a_full_lane_raises_busy_with_the_event_handed_back(start) -> None:
    w = start(team(latency_ms=5000, extra="[mailbox]\nordinary_capacity = 2\n"))
    refused = None
    for i in range(10):
        event = whisper(f"hello {i}")
        try:
            w.deliver("innkeeper", event)
        except warden.Busy as busy:
            refused = (busy, event)
            break
    assert refused is not None, "the lane never filled"
    busy, event = refused
    assert busy.event is event and busy.npc == "innkeeper"
    assert w.stats()["refused"] == 1


def test_a_team_can_be_a_dict_of_the_files_tables(start) -> None:
    tables = {
        "providers": {"canned": {"kind": "scripted", "replies": ["Aye."]}},
        "agents": [{"key": "smith", "provider": "canned"}],
    }
    with warden.Warden.start(team=tables) as w:
        assert w.ask("smith", "a sword?", timeout=10) == "Aye."
    with pytest.raises(warden.ConfigError, match="agents"):
        warden.Warden.start(team={"providers": tables["providers"]})
    with pytest.raises(ValueError, match="exactly one"):
        warden.Warden.start(team_toml=team(), team=tables)
