//! The SQLite journal: round trip, group commit and the durability wait, restore after a restart
//! (a locked-out agent stays locked out), schema migrations, snapshots (restore from them equals the
//! full replay, reads a bounded number of events, survives a migration) and the `warden journal`
//! inspection.
mod common;
use common::*;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::{
    path::Path,
    sync::{atomic::Ordering, Arc},
};
use warden::{
    journal::{
        self, must_be_durable, JournalError, JournalOptions, RECOVERY_CAUSE, SCHEMA_VERSION,
    },
    protocols::{Breaker, ToolCall, TurnOutcome},
    *,
};

fn key(k: &str) -> AgentKey {
    AgentKey::new(k)
}

fn halted() -> EventKind {
    EventKind::Halted {
        cause: HaltCause::Operator {
            operator: "op".into(),
        },
        discarded: 2,
        stopped: true,
    }
}

fn alert(i: usize) -> EventKind {
    EventKind::SafetyAlert {
        message: format!("alert {i}"),
    }
}

#[test]
fn events_round_trip_in_order_with_their_kinds() {
    let journal = SqliteJournal::open(":memory:").unwrap();
    let kinds = vec![
        EventKind::Spawned {
            role: AgentRole::Assistant,
            parent: None,
            max_consecutive_errors: 5,
        },
        EventKind::HistoryAppended {
            message: ChatMessage::user("hello"),
        },
        halted(),
        EventKind::LockedOut {
            breaker: Breaker::ConsecutiveErrors,
            reason: "Maximum consecutive errors reached (5)".into(),
            consecutive_errors: 5,
        },
    ];
    let mut seqs = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let agent = if i % 2 == 0 { "a" } else { "b" };
        seqs.push(journal.append(&key(agent), kind.clone()));
    }
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    let events = journal.events().unwrap();
    assert_eq!(
        events.iter().map(|e| e.kind.clone()).collect::<Vec<_>>(),
        kinds
    );
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert!(events.iter().all(|e| e.at_ms > 0));
    let of_a = journal.events_of("a").unwrap();
    assert_eq!(of_a.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(journal.agents().unwrap(), vec![key("a"), key("b")]);
    let records = journal.restore_records().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].halts, 1);
    assert_eq!(records[0].discarded_by_halt, 2);
    assert!(records[1].emergency_stop());
}

/// `append_rows` (a fleet halt's batch): several agents' rows in one call, numbered
/// consecutively in the order given, at the given time, committed in one transaction, and
/// durable once the last is; reopened, each agent replays to what the rows say.
#[actix_rt::test]
async fn rows_of_several_agents_are_appended_consecutively_in_one_commit() {
    let db = TempDb::new("rows");
    let journal = SqliteJournal::open(&db.0).unwrap();
    let first = journal.append(&key("z"), alert(0));
    journal.flush();
    let stop = |from| EventKind::StateChanged {
        from,
        to: AgentState::Stopped,
        cause: "system halt".into(),
    };
    let rows: Vec<(AgentKey, EventKind)> = ["a", "b", "c"]
        .into_iter()
        .flat_map(|a| {
            [
                (key(a), stop(AgentState::WaitingForEvent)),
                (key(a), halted()),
            ]
        })
        .collect();
    let commits = journal.stats().commits;
    let last = journal.append_rows(rows.clone(), 1_234);
    assert_eq!(last, first + 6);
    journal.durable(last).await.unwrap();
    assert_eq!(journal.stats().commits, commits + 1, "one transaction");
    drop(journal);
    let journal = SqliteJournal::open(&db.0).unwrap();
    let events: Vec<Event> = journal.events().unwrap().into_iter().skip(1).collect();
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (first + 1..=last).collect::<Vec<_>>()
    );
    assert!(events.iter().all(|e| e.at_ms == 1_234));
    assert_eq!(
        events
            .into_iter()
            .map(|e| (e.agent, e.kind))
            .collect::<Vec<_>>(),
        rows
    );
    for record in journal.restore_records().unwrap() {
        if record.key.as_str() != "z" {
            assert_eq!((record.state, record.halts), (AgentState::Stopped, 1));
        }
    }
}

#[test]
fn the_kind_column_holds_the_event_tag_and_body_is_json() {
    let db = TempDb::new("columns");
    let journal = SqliteJournal::open(&db.0).unwrap();
    journal.append(&key("a"), halted());
    journal.flush();
    let conn = rusqlite::Connection::open(&db.0).unwrap();
    let (kind, by): (String, String) = conn
        .query_row(
            "SELECT kind, json_extract(body, '$.cause.by') FROM events WHERE seq = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((kind.as_str(), by.as_str()), ("halted", "operator"));
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn safety_events_are_counted_and_durable_only_once_committed() {
    let db = TempDb::new("durable");
    let journal = SqliteJournal::open(&db.0).unwrap();
    // A second, independent connection sees only what is committed.
    let observer = rusqlite::Connection::open(&db.0).unwrap();
    let committed = |seq: u64| -> bool {
        observer
            .query_row(
                "SELECT count(*) FROM events WHERE seq = ?1",
                [seq as i64],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
            == 1
    };
    let durable = [
        halted(),
        EventKind::LockedOut {
            breaker: Breaker::Repetition,
            reason: "r".into(),
            consecutive_errors: 1,
        },
        EventKind::Unlocked {
            operator: "op".into(),
            note: None,
        },
        EventKind::StateChanged {
            from: AgentState::Executing,
            to: AgentState::SafetyLockout,
            cause: "trip".into(),
        },
        EventKind::StateChanged {
            from: AgentState::Executing,
            to: AgentState::Stopped,
            cause: "halt".into(),
        },
        EventKind::BreakerStopped {
            breaker: Breaker::BudgetExceeded,
            reason: "budget".into(),
        },
        // The state change of an unlock and of a resume: acknowledged only once on disk.
        EventKind::StateChanged {
            from: AgentState::SafetyLockout,
            to: AgentState::WaitingForEvent,
            cause: "unlocked by op".into(),
        },
        EventKind::StateChanged {
            from: AgentState::Stopped,
            to: AgentState::WaitingForEvent,
            cause: "resumed by op".into(),
        },
    ];
    for (i, kind) in durable.into_iter().enumerate() {
        assert!(must_be_durable(&kind));
        let before = journal.stats();
        let seq = journal.append(&key("a"), kind);
        // `append` does not wait for the disk; `durable` resolves only once it is there.
        assert_eq!(futures::executor::block_on(journal.durable(seq)), Ok(()));
        assert!(
            committed(seq),
            "event {i} reported durable before it was committed"
        );
        let after = journal.stats();
        assert_eq!(after.durable_waits, before.durable_waits + 1);
        assert!(after.commits > before.commits);
        assert!(after.committed_seq >= seq);
    }
    // Ordinary events do not wait.
    let before = journal.stats();
    journal.append(&key("a"), alert(0));
    assert_eq!(journal.stats().durable_waits, before.durable_waits);
    assert!(!must_be_durable(&EventKind::StateChanged {
        from: AgentState::WaitingForEvent,
        to: AgentState::Executing,
        cause: "event".into(),
    }));
    // A model call's usage is group-committed with the turn's events: no fsync of its own.
    let usage = EventKind::UsageRecorded {
        usage: protocols::Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            estimated: false,
        },
        cost: 0.25,
        unpriced: false,
    };
    assert!(!must_be_durable(&usage));
    let before = journal.stats();
    journal.append(&key("a"), usage);
    assert_eq!(journal.stats().durable_waits, before.durable_waits);
    journal.flush();
    assert!(committed(before.committed_seq + 1));
}

#[test]
fn group_commit_batches_a_burst_into_few_transactions() {
    // On a file, each commit syncs: appends arriving meanwhile join the next batch.
    let db = TempDb::new("group");
    let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let journal = journal.clone();
            std::thread::spawn(move || {
                for i in 0..500 {
                    journal.append(&key(&format!("agent{t}")), alert(i));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A durable event behind the burst commits everything before it too.
    let seq = journal.append(&key("agent0"), halted());
    assert_eq!(seq, 2001);
    journal.flush();
    let stats = journal.stats();
    assert_eq!(stats.committed_seq, 2001);
    assert!(
        stats.commits < 1000,
        "one transaction per event: {} commits",
        stats.commits
    );
    let events = journal.events().unwrap();
    assert_eq!(events.len(), 2001);
    assert!(events.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
    assert_eq!(journal.events_of("agent3").unwrap().len(), 500);
}

/// Issue 10.7: appends do not wake an active writer (it comes back within its linger by itself) and
/// wake an idle one; either way an event nobody waits for is committed without a flush or a
/// durability wait. Polls `stats()` only (neither pokes the writer); the deadline is a hang guard.
#[test]
fn an_event_nobody_waits_for_is_committed_whether_the_writer_was_idle_or_active() {
    let db = TempDb::new("linger");
    let journal = SqliteJournal::open(&db.0).unwrap();
    let committed = |seq: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while journal.stats().committed_seq < seq {
            assert!(
                std::time::Instant::now() < deadline,
                "event {seq} never committed: {:?}",
                journal.stats()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    // Idle: the writer has had nothing to do for longer than it lingers.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let first = journal.append(&key("a"), alert(0));
    committed(first);
    // Active: right after a commit, a burst from a plain thread, each event nobody waits for.
    let mut last = first;
    for i in 1..50 {
        last = journal.append(&key("a"), alert(i));
        std::thread::sleep(std::time::Duration::from_micros(300));
    }
    committed(last);
    // Idle again, then one event: still written.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let again = journal.append(&key("b"), alert(99));
    committed(again);
    assert_eq!(journal.events().unwrap().len() as u64, again);
}

#[test]
fn reopening_a_file_keeps_its_events_and_continues_the_sequence() {
    let db = TempDb::new("reopen");
    {
        let journal = SqliteJournal::open(&db.0).unwrap();
        for i in 0..10 {
            journal.append(&key("a"), alert(i));
        }
        // Dropped without an explicit flush: closing drains the queue.
    }
    let journal = SqliteJournal::open(&db.0).unwrap();
    assert_eq!(journal.events().unwrap().len(), 10);
    assert_eq!(journal.append(&key("b"), alert(10)), 11);
    journal.close();
    let reader = JournalReader::open(&db.0).unwrap();
    assert_eq!(reader.events().unwrap().len(), 11);
    assert_eq!(reader.agents().unwrap(), vec![key("a"), key("b")]);
}

#[test]
fn migrations_create_the_schema_once_and_refuse_a_newer_file() {
    let db = TempDb::new("schema");
    drop(SqliteJournal::open(&db.0).unwrap());
    let mut conn = rusqlite::Connection::open(&db.0).unwrap();
    assert_eq!(journal::schema_version(&conn).unwrap(), SCHEMA_VERSION);
    // Migrating again is a no-op.
    assert_eq!(journal::migrate(&mut conn, "x").unwrap(), SCHEMA_VERSION);
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1);
    conn.execute("UPDATE schema_version SET version = 99", [])
        .unwrap();
    drop(conn);
    let err = SqliteJournal::open(&db.0).expect_err("newer schema refused");
    assert!(matches!(err, JournalError::NewerSchema { found: 99, .. }));
    assert!(err.to_string().contains("schema version 99 is newer"));
    assert!(JournalReader::open(&db.0).is_err());
}

#[actix_rt::test]
async fn restored_records_equal_the_live_records_after_a_scenario() {
    tokio::time::pause();
    let journal = Arc::new(SqliteJournal::open(":memory:").unwrap());
    let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    let failing =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("model down")));
    let chatty = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("hi")));
    let a = team.assistant("a", failing);
    let b = team.assistant("b", chatty.clone());
    let c = team.assistant("c", chatty);
    lock_out(&a).await;
    for i in 0..3 {
        b.try_send_event(UserEvent::new(format!("hello {i}")))
            .unwrap();
        until("b answered", || b.status().turns == i + 1).await;
    }
    c.try_send_event(UserEvent::new("hello")).unwrap();
    until("c answered", || c.status().turns == 1).await;
    team.halt(
        "c",
        HaltCause::Operator {
            operator: "op".into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(c.state(), AgentState::Stopped);

    let records = journal.restore_records().unwrap();
    assert_eq!(records.len(), 3);
    for (record, live) in records.iter().zip([&a, &b, &c]) {
        assert_eq!(record, &live.record(), "replay of {} differs", live.key());
    }
    assert!(records[0].emergency_stop());
    assert_eq!(records[1].history.len(), 6);
    assert_eq!(records[2].state, AgentState::Stopped);
}

#[actix_rt::test]
async fn a_locked_out_agent_restored_from_the_file_stays_locked_out() {
    tokio::time::pause();
    let db = TempDb::new("restore");
    let live_record = {
        let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
        let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
        let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("down")));
        let a = team.assistant("a", model);
        lock_out(&a).await;
        let record = a.record();
        // The "crash": the process goes away; only what is committed survives.
        journal.close();
        drop(team);
        record
    };

    // "Restart": a new journal on the same file, a new team, agents restored from their records.
    let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
    let records = journal.restore_records().unwrap();
    assert_eq!(records, vec![live_record.clone()]);
    let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("working")));
    let stats = model.stats();
    let a = team
        .spawn(AgentSpec::assistant("a", model).restored_from(records[0].clone()))
        .unwrap();
    settle(50).await;
    let s = a.status();
    assert_eq!(
        (s.state, s.emergency_stop, s.consecutive_errors),
        (AgentState::SafetyLockout, true, 5)
    );
    let err = a.try_send_event(UserEvent::new("do work")).unwrap_err();
    assert!(matches!(err.refusal, WorkRefusal::LockedOut { .. }));
    // Event content asking for an unlock is only data.
    assert!(a.try_send_event(UserEvent::new("admin:unlock")).is_err());
    settle(50).await;
    assert_eq!(stats.calls.load(Ordering::SeqCst), 0);
    assert_eq!(a.state(), AgentState::SafetyLockout);

    // An authenticated unlock works on the restored agent, and is itself journaled durably.
    a.unlock("alice").await.unwrap();
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    let after = journal.restore_records().unwrap();
    assert_eq!(after[0], a.record());
    assert!(!after[0].emergency_stop());
}

#[actix_rt::test]
async fn a_fleet_halt_outlives_a_restart_and_its_lift_resumes_only_what_it_stopped() {
    tokio::time::pause();
    let db = TempDb::new("fleet-halt");
    let model = || Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    let keys = ["running", "halted-alone", "paused-after"];
    {
        let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
        let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
        let agents: Vec<_> = keys.iter().map(|k| team.assistant(k, model())).collect();
        // Stopped by an operator before the fleet halt: not the fleet halt's.
        let op = HaltCause::Operator {
            operator: "op".into(),
        };
        agents[1].halt(op).await;
        team.halt_all().await;
        // Paused by an operator after it: a lift leaves it.
        agents[2].pause("op").await.unwrap();
        assert!(team.in_fleet_halt("running") && team.in_fleet_halt("paused-after"));
        // The "crash", with the fleet halt standing.
        journal.close();
        drop(team);
    }
    let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
    let records = journal.recover_records().unwrap();
    let flagged: Vec<_> = records
        .iter()
        .filter(|r| r.fleet_halted)
        .map(|r| r.key.as_str())
        .collect();
    assert_eq!(flagged, ["running"]);
    let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    assert_eq!(records.len(), keys.len());
    for record in &records {
        team.spawn(
            AgentSpec::assistant(record.key.as_str(), model()).restored_from(record.clone()),
        )
        .unwrap();
    }
    settle(20).await;
    // The fleet halt stands again, with the one agent it stopped.
    assert!(team.fleet_halted());
    assert!(team.in_fleet_halt("running"));
    assert!(!team.in_fleet_halt("halted-alone") && !team.in_fleet_halt("paused-after"));
    let outcomes = team
        .resume_fleet_halt("lifter")
        .await
        .expect("a fleet halt stands");
    let resumed: Vec<_> = outcomes
        .iter()
        .filter(|o| o.resumed)
        .map(|o| o.agent.as_str())
        .collect();
    assert_eq!(resumed, ["running"], "{outcomes:?}");
    settle(20).await;
    let state = |k: &str| team.get(k).unwrap().state();
    assert_eq!(state("running"), AgentState::WaitingForEvent);
    assert_eq!(state("halted-alone"), AgentState::Stopped);
    assert_eq!(state("paused-after"), AgentState::Stopped);
    // The resume cleared the flag: a second restart restores no fleet halt.
    assert!(!team.get("running").unwrap().record().fleet_halted);
    journal.close();
    drop(team);
    let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
    assert!(journal
        .recover_records()
        .unwrap()
        .iter()
        .all(|r| !r.fleet_halted));
}

#[test]
fn inspection_commands_print_tail_show_and_export() {
    let db = TempDb::new("inspect");
    {
        let journal = SqliteJournal::open(&db.0).unwrap();
        journal.append(
            &key("npc"),
            EventKind::Spawned {
                role: AgentRole::Assistant,
                parent: None,
                max_consecutive_errors: 5,
            },
        );
        for i in 0..5 {
            journal.append(&key("npc"), alert(i));
        }
        journal.append(&key("other"), halted());
    }
    let mut out = Vec::new();
    journal::tail(&db.0, 3, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].contains("safety_alert") && lines[0].contains("alert 3"));
    assert!(lines[2].contains("other") && lines[2].contains("halted"));

    let mut out = Vec::new();
    journal::tail(&db.0, 2, true, &mut out).unwrap();
    let first: Event =
        serde_json::from_str(String::from_utf8(out).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(first.seq, 6);

    let mut out = Vec::new();
    journal::show(&db.0, "npc", false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("agent npc"), "{text}");
    assert!(text.contains("emergency_stop       false"));
    assert!(text.contains("snapshot             none"), "{text}");
    assert!(text.contains("events (6):"));

    let mut out = Vec::new();
    journal::show(&db.0, "other", true, &mut out).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(doc["record"]["halts"], 1);

    let err = journal::show(&db.0, "nobody", false, &mut Vec::new()).unwrap_err();
    assert_eq!(err.to_string(), "no events for agent nobody");

    let mut out = Vec::new();
    journal::export_json(&db.0, &mut out).unwrap();
    let events: Vec<Event> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events.len(), 7);

    let missing = db.0.with_file_name("absent.db");
    let err = journal::tail(&missing, 1, false, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("does not exist"));
    assert!(!missing.exists(), "inspection must not create a journal");
}

#[actix_rt::test]
async fn an_agent_caught_mid_turn_is_recovered_to_waiting_and_takes_work_again() {
    tokio::time::pause();
    let db = TempDb::new("midturn");
    {
        // What a process killed during a tool call leaves behind.
        let journal = SqliteJournal::open(&db.0).unwrap();
        let a = key("a");
        journal.append(
            &a,
            EventKind::Spawned {
                role: AgentRole::Assistant,
                parent: None,
                max_consecutive_errors: 5,
            },
        );
        for (from, to) in [
            (AgentState::WaitingForEvent, AgentState::Executing),
            (AgentState::Executing, AgentState::WaitingForTool),
        ] {
            journal.append(
                &a,
                EventKind::StateChanged {
                    from,
                    to,
                    cause: "turn".into(),
                },
            );
        }
    }
    let journal = Arc::new(SqliteJournal::open(&db.0).unwrap());
    assert_eq!(
        journal.restore_records().unwrap()[0].state,
        AgentState::WaitingForTool
    );
    let records = journal.recover_records().unwrap();
    assert_eq!(records[0].state, AgentState::WaitingForEvent);
    // The recovery is journaled along legal transitions, so replay still equals the record.
    assert_eq!(journal.restore_records().unwrap(), records);
    let recovery: Vec<_> = journal
        .events_of("a")
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::StateChanged { from, to, cause } if cause == journal::RECOVERY_CAUSE => {
                assert!(from.can_transition_to(to));
                Some((from, to))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        recovery,
        [
            (AgentState::WaitingForTool, AgentState::Executing),
            (AgentState::Executing, AgentState::WaitingForEvent)
        ]
    );

    let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("back")));
    let a = team
        .spawn(AgentSpec::assistant("a", model).restored_from(records[0].clone()))
        .unwrap();
    a.try_send_event(UserEvent::new("hello again")).unwrap();
    until("answered", || a.status().turns == 1).await;
    assert_eq!(journal.restore_records().unwrap()[0], a.record());
}

#[test]
fn recovery_leaves_locked_out_and_stopped_agents_as_they_are() {
    let journal = SqliteJournal::open(":memory:").unwrap();
    // A trip journals the lockout, then the state change.
    journal.append(
        &key("l"),
        EventKind::LockedOut {
            breaker: Breaker::Stuck,
            reason: "stuck".into(),
            consecutive_errors: 0,
        },
    );
    for (agent, to) in [("l", AgentState::SafetyLockout), ("s", AgentState::Stopped)] {
        journal.append(
            &key(agent),
            EventKind::StateChanged {
                from: AgentState::Executing,
                to,
                cause: "x".into(),
            },
        );
    }
    let before = journal.events().unwrap().len();
    let records = journal.recover_records().unwrap();
    assert_eq!(records[0].state, AgentState::SafetyLockout);
    assert_eq!(records[1].state, AgentState::Stopped);
    assert_eq!(journal.events().unwrap().len(), before);
}

// ---- snapshots ----------------------------------------------------------------------------------

fn every(snapshot_every: u64) -> JournalOptions {
    JournalOptions { snapshot_every }
}

/// A random event: most kinds change the record (history, state, counters, lockout, halts, pending
/// events), some change nothing. States and settled ids are random too: `apply` folds whatever was
/// journaled.
fn random_kind(rng: &mut SmallRng, i: usize) -> EventKind {
    let state = |rng: &mut SmallRng| AgentState::ALL[rng.gen_range(0..AgentState::ALL.len())];
    // Ids of queued events are their plan index + 1; settled ids are any of them (or none queued).
    let some_id = |rng: &mut SmallRng| rng.gen_range(1..=i as u64 + 1);
    match rng.gen_range(0..23) {
        // Costs with no exact binary form: the snapshot's JSON must keep the sum bit for bit.
        21 => EventKind::UsageRecorded {
            usage: protocols::Usage {
                prompt_tokens: rng.gen_range(0..5000),
                completion_tokens: rng.gen_range(0..500),
                estimated: rng.gen_bool(0.2),
            },
            cost: f64::from(rng.gen_range(0..1000u32)) * 0.0001 + 0.1,
            unpriced: rng.gen_bool(0.2),
        },
        17 | 18 => EventKind::EventQueued {
            id: i as u64 + 1,
            event: Arc::new(UserEvent {
                source: "say".into(),
                sender: rng.gen_bool(0.5).then(|| format!("player {i}")),
                content: format!("event {i} — ünïcode"),
            }),
        },
        19 => EventKind::EventTaken { id: some_id(rng) },
        22 => EventKind::HistoryCompacted {
            removed: rng.gen_range(0..4),
            summary: ChatMessage::user(format!("[memory: summary {i}]")).internal(),
            fallback: rng.gen(),
        },
        20 => EventKind::WorkRefused {
            work: "user_event".into(),
            refusal: WorkRefusal::Stopped,
            queued: rng.gen_bool(0.8).then(|| some_id(rng)),
        },
        0 => EventKind::Spawned {
            role: if rng.gen() {
                AgentRole::Assistant
            } else {
                AgentRole::SubAgent
            },
            parent: rng.gen_bool(0.5).then(|| key("boss")),
            max_consecutive_errors: rng.gen_range(1..10),
        },
        1 | 2 => EventKind::StateChanged {
            from: state(rng),
            to: state(rng),
            cause: format!("cause {i}"),
        },
        3 => EventKind::ErrorCounted {
            consecutive_errors: rng.gen_range(0..8),
            error: format!("error {i}"),
        },
        4 => EventKind::ErrorsReset,
        5 => EventKind::LockedOut {
            breaker: Breaker::ConsecutiveErrors,
            reason: format!("reason {i}"),
            consecutive_errors: 5,
        },
        6 => EventKind::Unlocked {
            operator: "op".into(),
            note: None,
        },
        7 => EventKind::HistoryReset {
            operator: "op".into(),
        },
        8 if rng.gen() => EventKind::Paused {
            operator: "op".into(),
        },
        8 => EventKind::Unpaused {
            operator: "op".into(),
        },
        9 => EventKind::Halted {
            cause: HaltCause::HaltAll,
            discarded: rng.gen_range(0..4),
            stopped: rng.gen_bool(0.5),
        },
        10..=12 => EventKind::HistoryAppended {
            message: match rng.gen_range(0..5) {
                0 => ChatMessage::user(format!("[user] hello {i} — ünïcode")),
                1 => ChatMessage::assistant(format!("answer {i}")),
                2 => ChatMessage::assistant_tool_calls(
                    None,
                    vec![ToolCall::new(
                        format!("call_{i}"),
                        "search",
                        &serde_json::json!({ "q": i, "deep": [1, 2.5, null] }),
                    )],
                ),
                3 => ChatMessage::tool_result(format!("call_{i}"), "{\"ok\":true}"),
                _ => ChatMessage::system(format!("alert {i}")).internal(),
            },
        },
        13 => EventKind::TurnFinished {
            outcome: TurnOutcome::new(
                TerminationReason::Answered,
                rng.gen_range(1..5),
                Some(format!("answer {i}")),
            ),
        },
        14 => EventKind::Restarted {
            restarts: rng.gen_range(0..5),
        },
        15 => EventKind::BreakerStopped {
            breaker: Breaker::BudgetExceeded,
            reason: format!("budget {i}"),
        },
        _ => alert(i),
    }
}

/// A random plan: `n` events over `agents` agents.
fn random_plan(rng: &mut SmallRng, agents: usize, n: usize) -> Vec<(AgentKey, EventKind)> {
    (0..n)
        .map(|i| {
            let agent = key(&format!("agent{}", rng.gen_range(0..agents)));
            (agent, random_kind(rng, i))
        })
        .collect()
}

/// Agents in order of their first event.
fn first_seen(plan: &[(AgentKey, EventKind)]) -> Vec<AgentKey> {
    let mut agents: Vec<AgentKey> = Vec::new();
    for (agent, _) in plan {
        if !agents.contains(agent) {
            agents.push(agent.clone());
        }
    }
    agents
}

/// Every snapshot row is the replay of its agent's events up to its seq, and that seq is one of the
/// agent's events. Returns how many snapshots there are.
fn assert_snapshots_match_their_events(db: &Path, events: &[Event], what: &str) -> usize {
    let conn = rusqlite::Connection::open(db).unwrap();
    let rows: Vec<(String, i64, String)> = conn
        .prepare("SELECT agent, seq, record FROM snapshots")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (agent, seq, json) in &rows {
        let seq = *seq as u64;
        let record: AgentRecord = serde_json::from_str(json).unwrap();
        let upto = events.iter().filter(|e| e.seq <= seq);
        assert_eq!(
            record,
            AgentRecord::replay(key(agent), upto),
            "{what}: snapshot of {agent} at {seq} is not its events up to {seq}"
        );
        assert!(
            events
                .iter()
                .any(|e| e.seq == seq && e.agent.as_str() == agent),
            "{what}: snapshot of {agent} at {seq}, which is not one of its events"
        );
    }
    rows.len()
}

/// The log holds the plan; restore (the journal's and the read-only reader's) equals the full
/// replay; every snapshot agrees with its events. Returns the number of snapshots.
fn check_restore(
    journal: &SqliteJournal,
    db: &Path,
    plan: &[(AgentKey, EventKind)],
    what: &str,
) -> usize {
    let events = journal.events().unwrap();
    let logged: Vec<_> = events
        .iter()
        .map(|e| (e.agent.clone(), e.kind.clone()))
        .collect();
    assert_eq!(logged, plan, "{what}: the log");
    let agents = first_seen(plan);
    assert_eq!(journal.agents().unwrap(), agents, "{what}: the agents");
    let replayed: Vec<AgentRecord> = agents
        .iter()
        .map(|a| AgentRecord::replay(a.clone(), &events))
        .collect();
    assert_eq!(journal.restore_records().unwrap(), replayed, "{what}");
    let reader = JournalReader::open(db).unwrap();
    assert_eq!(
        reader.restore_records().unwrap(),
        replayed,
        "{what}: reader"
    );
    assert_snapshots_match_their_events(db, &events, what)
}

#[test]
fn restore_from_snapshots_equals_the_full_replay_for_random_event_sequences() {
    const EVERY: [u64; 7] = [0, 1, 2, 3, 5, 8, 40];
    let mut snapshots = 0;
    for seed in 0..24u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let db = TempDb::new(&format!("random-{seed}"));
        let agents = rng.gen_range(1..6);
        let n = rng.gen_range(0..300);
        let plan = random_plan(&mut rng, agents, n);
        let mut snapshot_every = EVERY[seed as usize % EVERY.len()];
        let mut journal = SqliteJournal::open_with(&db.0, every(snapshot_every)).unwrap();
        for (i, (agent, kind)) in plan.iter().enumerate() {
            journal.append(agent, kind.clone());
            let what = format!("seed {seed}, snapshot_every {snapshot_every}, event {i}");
            match rng.gen_range(0..60) {
                // A restart, possibly with another `snapshot_every`.
                0 => {
                    drop(journal);
                    snapshot_every = EVERY[rng.gen_range(0..EVERY.len())];
                    journal = SqliteJournal::open_with(&db.0, every(snapshot_every)).unwrap();
                    check_restore(&journal, &db.0, &plan[..=i], &what);
                }
                1 => {
                    check_restore(&journal, &db.0, &plan[..=i], &what);
                }
                // Batch boundaries fall in different places.
                2..=9 => journal.flush(),
                _ => {}
            }
        }
        let what = format!("seed {seed}, snapshot_every {snapshot_every}, end");
        check_restore(&journal, &db.0, &plan, &what);
        drop(journal);
        let journal = SqliteJournal::open_with(&db.0, every(snapshot_every)).unwrap();
        snapshots += check_restore(&journal, &db.0, &plan, &format!("{what}, reopened"));
    }
    assert!(snapshots > 20, "the seeds made only {snapshots} snapshots");
}

#[test]
fn a_restore_reads_fewer_than_snapshot_every_events_per_agent_however_long_the_history() {
    let agents = [key("a"), key("b"), key("c")];
    let plan: Vec<(AgentKey, EventKind)> = (0..6_000)
        .map(|i| {
            let kind = if i % 2 == 0 {
                EventKind::HistoryAppended {
                    message: ChatMessage::user(format!("message {i}")),
                }
            } else {
                alert(i)
            };
            (agents[i % 3].clone(), kind)
        })
        .collect();
    let restore_reads = |snapshot_every: u64| {
        let db = TempDb::new(&format!("bounded-{snapshot_every}"));
        {
            let journal = SqliteJournal::open_with(&db.0, every(snapshot_every)).unwrap();
            for (agent, kind) in &plan {
                journal.append(agent, kind.clone());
            }
        }
        // A restart: only the restore reads.
        let journal = SqliteJournal::open_with(&db.0, every(snapshot_every)).unwrap();
        let before = journal.stats();
        let records = journal.restore_records().unwrap();
        let after = journal.stats();
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].history.len(), 1_000);
        let events = journal.events().unwrap();
        for record in &records {
            assert_eq!(record, &AgentRecord::replay(record.key.clone(), &events));
        }
        (
            after.restored_snapshots - before.restored_snapshots,
            after.restored_events - before.restored_events,
        )
    };
    let (snapshots, read) = restore_reads(100);
    assert_eq!(snapshots, 3);
    assert!(read < 3 * 100, "{read} events read for 3 agents");
    // Without snapshots the same history is read in full.
    assert_eq!(restore_reads(0), (0, 6_000));
}

/// The schema-1 tables, as the previous warden created them.
const SCHEMA_1: &str = "
    PRAGMA journal_mode = WAL;
    CREATE TABLE schema_version (version INTEGER NOT NULL);
    INSERT INTO schema_version (version) VALUES (1);
    CREATE TABLE events (
        seq   INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        agent TEXT    NOT NULL,
        kind  TEXT    NOT NULL,
        body  JSON    NOT NULL
    );
    CREATE INDEX events_agent ON events(agent, seq);";

#[test]
fn a_schema_1_file_migrates_keeps_its_events_and_restores_identically() {
    let db = TempDb::new("schema1");
    let mut rng = SmallRng::seed_from_u64(61);
    let plan = random_plan(&mut rng, 3, 600);
    let events: Vec<Event> = plan
        .iter()
        .enumerate()
        .map(|(i, (agent, kind))| Event {
            seq: i as u64 + 1,
            at_ms: 1_700_000_000_000 + i as u64,
            agent: agent.clone(),
            kind: kind.clone(),
        })
        .collect();
    {
        let conn = rusqlite::Connection::open(&db.0).unwrap();
        conn.execute_batch(SCHEMA_1).unwrap();
        for e in &events {
            let body = serde_json::to_value(&e.kind).unwrap();
            conn.execute(
                "INSERT INTO events (seq, at_ms, agent, kind, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                rusqlite::params![
                    e.seq as i64,
                    e.at_ms as i64,
                    e.agent.as_str(),
                    journal::kind_name(&body),
                    body.to_string()
                ],
            )
            .unwrap();
        }
    }
    let agents = first_seen(&plan);
    let expected: Vec<AgentRecord> = agents
        .iter()
        .map(|a| AgentRecord::replay(a.clone(), &events))
        .collect();
    // The read-only view reads the old file as it is (it never migrates).
    let reader = JournalReader::open(&db.0).unwrap();
    assert_eq!(reader.restore_records().unwrap(), expected);
    assert_eq!(reader.agents().unwrap(), agents);
    drop(reader);

    let journal = SqliteJournal::open_with(&db.0, every(50)).unwrap();
    let conn = rusqlite::Connection::open(&db.0).unwrap();
    assert_eq!(journal::schema_version(&conn).unwrap(), SCHEMA_VERSION);
    let listed: Vec<(String, i64)> = conn
        .prepare("SELECT agent, first_seq FROM agents ORDER BY first_seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let firsts: Vec<(String, i64)> = agents
        .iter()
        .map(|a| {
            let first = events.iter().find(|e| &e.agent == a).unwrap().seq as i64;
            (a.to_string(), first)
        })
        .collect();
    assert_eq!(listed, firsts);
    assert_eq!(
        journal.events().unwrap(),
        events,
        "the migration kept the events"
    );
    // The first restore replays every event, and snapshots the agents so the next one need not.
    let before = journal.stats();
    assert_eq!(journal.restore_records().unwrap(), expected);
    let after = journal.stats();
    assert_eq!(after.restored_events - before.restored_events, 600);
    assert_eq!(after.snapshots_written - before.snapshots_written, 3);
    assert_eq!(
        assert_snapshots_match_their_events(&db.0, &events, "migrated"),
        3
    );
    drop(journal);

    let journal = SqliteJournal::open_with(&db.0, every(50)).unwrap();
    let before = journal.stats();
    assert_eq!(journal.restore_records().unwrap(), expected);
    assert_eq!(journal.stats().restored_events - before.restored_events, 0);
    assert_eq!(journal.append(&key("agent0"), alert(0)), 601);
    // Migrating again is a no-op.
    drop(journal);
    let mut conn = rusqlite::Connection::open(&db.0).unwrap();
    assert_eq!(journal::migrate(&mut conn, "x").unwrap(), SCHEMA_VERSION);
}

/// Appends `plan` to a fresh in-memory journal and recovers: the records, and every event after.
fn recover(plan: &[(AgentKey, EventKind)], snapshot_every: u64) -> (Vec<AgentRecord>, Vec<Event>) {
    let journal = SqliteJournal::open_with(":memory:", every(snapshot_every)).unwrap();
    for (i, (agent, kind)) in plan.iter().enumerate() {
        journal.append(agent, kind.clone());
        if i % 7 == 0 {
            journal.flush();
        }
    }
    let records = journal.recover_records().unwrap();
    let events = journal.events().unwrap();
    assert_eq!(journal.restore_records().unwrap(), records);
    (records, events)
}

#[test]
fn recovery_gives_the_same_answer_with_and_without_snapshots() {
    for seed in 0..16u64 {
        let mut rng = SmallRng::seed_from_u64(1_000 + seed);
        let agents = rng.gen_range(1..8);
        let n = rng.gen_range(1..200);
        let plan = random_plan(&mut rng, agents, n);
        let (full, full_events) = recover(&plan, 0);
        for snapshot_every in [1, 3, 10] {
            let (snap, snap_events) = recover(&plan, snapshot_every);
            assert_eq!(snap, full, "seed {seed}, snapshot_every {snapshot_every}");
            let kinds = |events: &[Event]| {
                events
                    .iter()
                    .map(|e| (e.seq, e.agent.clone(), e.kind.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(kinds(&snap_events), kinds(&full_events), "seed {seed}");
        }
        for record in &full {
            assert!(!record.state.is_busy(), "seed {seed}: {record:?}");
            assert_eq!(record.unlisted(), 0, "seed {seed}: a listing left cut");
            assert!(journal::recovery_path(record).is_empty(), "seed {seed}");
            if record.emergency_stop() {
                // Locked out idle happens only in journals of older versions (random plans make
                // them); recovery leaves those alone, and their lockout refuses work.
                assert!(
                    record.state.refuses_work() || record.state == AgentState::WaitingForEvent,
                    "seed {seed}: {record:?}"
                );
            }
        }
        for e in &full_events[n..] {
            match &e.kind {
                EventKind::StateChanged { from, to, cause } if cause == RECOVERY_CAUSE => {
                    assert!(
                        from.can_transition_to(*to),
                        "seed {seed}: {from:?} → {to:?}"
                    );
                    // Recovery ends a turn a crash cut; it never starts one.
                    assert_ne!(
                        *from,
                        AgentState::WaitingForEvent,
                        "seed {seed}: recovery invented a turn"
                    );
                }
                // A halt whose `messages_discarded` listing the crash cut is listed now.
                EventKind::MessagesDiscarded { messages } => {
                    assert!(!messages.is_empty(), "seed {seed}");
                }
                other => panic!("seed {seed}: recovery journaled {other:?}"),
            }
        }
    }
}

#[test]
fn a_snapshot_that_cannot_be_read_is_ignored_and_rebuilt_from_the_events() {
    let db = TempDb::new("bad-snapshot");
    let mut rng = SmallRng::seed_from_u64(5);
    let plan: Vec<_> = random_plan(&mut rng, 1, 100);
    {
        let journal = SqliteJournal::open_with(&db.0, every(10)).unwrap();
        for (agent, kind) in &plan {
            journal.append(agent, kind.clone());
            journal.flush();
        }
    }
    for tamper in [
        "UPDATE snapshots SET record = '{\"not\": \"a record\"}'",
        "UPDATE snapshots SET format = 999",
        "UPDATE snapshots SET record = json_set(record, '$.key', 'someone else')",
    ] {
        rusqlite::Connection::open(&db.0)
            .unwrap()
            .execute(tamper, [])
            .unwrap();
        let journal = SqliteJournal::open_with(&db.0, every(10)).unwrap();
        // Replayed from the first event, and snapshotted again.
        check_restore(&journal, &db.0, &plan, tamper);
        let stats = journal.stats();
        assert_eq!((stats.restored_snapshots, stats.restored_events), (0, 100));
        assert_eq!(stats.snapshots_written, 1);
    }
}

#[test]
fn show_says_whether_the_snapshot_agrees_and_export_has_only_events() {
    let db = TempDb::new("show-snapshot");
    {
        let journal = SqliteJournal::open_with(&db.0, every(2)).unwrap();
        // Each append its own batch (flushed), so the snapshots fall at 2 and 4.
        for _ in 0..5 {
            journal.append(&key("npc"), halted());
            journal.flush();
        }
    }
    let show = |json: bool| {
        let mut out = Vec::new();
        journal::show(&db.0, "npc", json, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    assert!(
        show(false).contains("snapshot             seq 4, matches the replay"),
        "{}",
        show(false)
    );
    let doc: serde_json::Value = serde_json::from_str(&show(true)).unwrap();
    assert_eq!(doc["snapshot"]["seq"], 4);
    assert_eq!(doc["snapshot"]["matches_replay"], true);
    assert_eq!(doc["record"]["halts"], 5);
    // A snapshot that disagrees with the events is reported; the events are shown as they are.
    rusqlite::Connection::open(&db.0)
        .unwrap()
        .execute(
            "UPDATE snapshots SET record = json_set(record, '$.halts', 99)",
            [],
        )
        .unwrap();
    assert!(show(false).contains("seq 4, DIFFERS from the replay"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&show(true)).unwrap()["record"]["halts"],
        5
    );
    let mut out = Vec::new();
    journal::export_json(&db.0, &mut out).unwrap();
    let events: Vec<Event> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events.len(), 5);
}

fn state_changed(from: AgentState, to: AgentState) -> EventKind {
    EventKind::StateChanged {
        from,
        to,
        cause: "turn".into(),
    }
}

#[actix_rt::test]
async fn recovery_completes_the_lockout_stop_and_unlock_a_crash_cut_in_two() {
    use AgentState::*;
    tokio::time::pause();
    let journal = Arc::new(SqliteJournal::open(":memory:").unwrap());
    let locked_out = EventKind::LockedOut {
        breaker: Breaker::ConsecutiveErrors,
        reason: "Maximum consecutive errors reached (5)".into(),
        consecutive_errors: 5,
    };
    // Each agent's events stop where a SIGKILL between two durable commits would stop them.
    let cases: [(&str, Vec<EventKind>, AgentState); 5] = [
        // The lockout is on disk, its state change is not.
        (
            "tripped",
            vec![
                state_changed(WaitingForEvent, Executing),
                locked_out.clone(),
            ],
            SafetyLockout,
        ),
        // Locked out in a tool wait (the same, one step further from the lockout).
        (
            "tripped-in-tool",
            vec![
                state_changed(WaitingForEvent, Executing),
                state_changed(Executing, WaitingForTool),
                locked_out.clone(),
            ],
            SafetyLockout,
        ),
        // Idle, yet locked out (a journal of an older version): recovery invents no turn to reach
        // SAFETY_LOCKOUT; the record keeps its state and its lockout refuses work (below).
        (
            "idle-locked",
            vec![
                state_changed(WaitingForEvent, Executing),
                locked_out.clone(),
                state_changed(Executing, WaitingForEvent),
            ],
            WaitingForEvent,
        ),
        // A budget stop is on disk, its state change is not.
        (
            "budget",
            vec![
                state_changed(WaitingForEvent, Executing),
                EventKind::BreakerStopped {
                    breaker: Breaker::BudgetExceeded,
                    reason: "budget".into(),
                },
            ],
            Stopped,
        ),
        // An unlock is on disk, its state change is not: the operator's decision stands.
        (
            "unlocked",
            vec![
                state_changed(WaitingForEvent, Executing),
                locked_out.clone(),
                state_changed(Executing, SafetyLockout),
                EventKind::Unlocked {
                    operator: "alice".into(),
                    note: None,
                },
            ],
            WaitingForEvent,
        ),
    ];
    for (agent, kinds, _) in &cases {
        for kind in kinds {
            journal.append(&key(agent), kind.clone());
        }
    }
    let records = journal.recover_records().unwrap();
    for ((agent, _, expected), record) in cases.iter().zip(&records) {
        assert_eq!(record.state, *expected, "{agent}");
        assert!(journal::recovery_path(record).is_empty(), "{agent}");
    }
    assert_eq!(journal.restore_records().unwrap(), records);
    // The locked-out agents refuse work once spawned; the unlocked one takes it.
    let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    let stats = model.stats();
    let mut handles = Vec::new();
    for record in &records {
        let spec = AgentSpec::assistant(record.key.as_str(), model.clone());
        handles.push(team.spawn(spec.restored_from(record.clone())).unwrap());
    }
    for handle in &handles[..4] {
        let err = handle.try_send_event(UserEvent::new("work")).unwrap_err();
        assert!(
            matches!(
                err.refusal,
                WorkRefusal::LockedOut { .. } | WorkRefusal::Stopped
            ),
            "{}: {:?}",
            handle.key(),
            err.refusal
        );
    }
    handles[4].try_send_event(UserEvent::new("work")).unwrap();
    until("unlocked agent answered", || handles[4].status().turns == 1).await;
    assert_eq!(stats.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn vacuum_into_backs_up_a_journal_while_it_is_written() {
    let db = TempDb::new("backup");
    let journal = Arc::new(SqliteJournal::open_with(&db.0, every(10)).unwrap());
    for i in 0..500 {
        journal.append(&key("a"), alert(i));
    }
    journal.flush();
    let writer = {
        let journal = journal.clone();
        std::thread::spawn(move || {
            for i in 0..2_000 {
                journal.append(&key(["a", "b"][i % 2]), alert(i));
            }
        })
    };
    let copy = db.0.with_file_name("copy.db");
    rusqlite::Connection::open(&db.0)
        .unwrap()
        .execute("VACUUM INTO ?1", [copy.to_string_lossy()])
        .unwrap();
    writer.join().unwrap();
    // The copy is a consistent prefix of the log, and restores like one.
    let reader = JournalReader::open(&copy).unwrap();
    let copied = reader.events().unwrap();
    let all = journal.events().unwrap();
    assert!(copied.len() >= 500);
    assert_eq!(copied, all[..copied.len()]);
    let replayed: Vec<AgentRecord> = reader
        .agents()
        .unwrap()
        .into_iter()
        .map(|a| AgentRecord::replay(a, &copied))
        .collect();
    assert_eq!(reader.restore_records().unwrap(), replayed);
    assert_snapshots_match_their_events(&copy, &copied, "backup");
}

// ---- pending events -----------------------------------------------------------------------------

fn queued(id: u64) -> EventKind {
    EventKind::EventQueued {
        id,
        event: Arc::new(UserEvent::new(format!("event {id}"))),
    }
}

#[test]
fn pending_events_are_in_snapshots_and_later_events_settle_the_right_ids() {
    let db = TempDb::new("pending-snapshot");
    let a = key("a");
    let spawned = EventKind::Spawned {
        role: AgentRole::Assistant,
        parent: None,
        max_consecutive_errors: 5,
    };
    // Seven events: the snapshot is taken at the seventh (snapshot_every = 7), with six pending.
    let mut plan = vec![spawned];
    plan.extend((1..=6).map(queued));
    {
        let journal = SqliteJournal::open_with(&db.0, every(7)).unwrap();
        for kind in &plan {
            journal.append(&a, kind.clone());
        }
    }
    let reader = JournalReader::open(&db.0).unwrap();
    let (seq, snapshot) = reader.snapshot_of("a").unwrap().expect("a snapshot");
    assert_eq!(seq, 7);
    assert_eq!(pending_ids(&snapshot), [1, 2, 3, 4, 5, 6]);
    drop(reader);

    // After the snapshot: one taken, one refused, one listed by a halt's discard, one more queued.
    let after = [
        EventKind::EventTaken { id: 1 },
        EventKind::WorkRefused {
            work: "user_event".into(),
            refusal: WorkRefusal::Stopped,
            queued: Some(3),
        },
        EventKind::MessagesDiscarded {
            messages: vec![protocols::DiscardedMessage {
                id: 40,
                priority: Priority::Ordinary,
                kind: "user_event".into(),
                queued: Some(5),
            }],
        },
        queued(7),
    ];
    {
        let journal = SqliteJournal::open_with(&db.0, every(7)).unwrap();
        for kind in &after {
            journal.append(&a, kind.clone());
        }
    }
    plan.extend(after);
    let journal = SqliteJournal::open_with(&db.0, every(7)).unwrap();
    let records = journal.restore_records().unwrap();
    let stats = journal.stats();
    // From the snapshot and the four events after it.
    assert_eq!((stats.restored_snapshots, stats.restored_events), (1, 4));
    assert_eq!(pending_ids(&records[0]), [2, 4, 6, 7]);
    assert_eq!(records[0].pending[3].event.content, "event 7");
    assert_eq!(records[0].next_event_id(), 8);
    check_restore(
        &journal,
        &db.0,
        &plan.into_iter().map(|k| (a.clone(), k)).collect::<Vec<_>>(),
        "pending",
    );
}

/// Polls `cond` (yielding, and every 16th try sleeping 1 ms) until it holds; panics after 10 s.
async fn within_secs(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for i in 0u64.. {
        if cond() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "condition never held: {what}"
        );
        if i % 16 == 15 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

#[actix_rt::test]
async fn acknowledged_events_come_back_after_a_restart_and_run_once_each() {
    // Real time: the durability waits depend on the writer thread, and paused time would jump to the
    // model's answer while the runtime idles in them.
    let db = TempDb::new("pending-restart");
    let sent: Vec<String> = (0..5).map(|i| format!("event {i}")).collect();
    {
        // e0's turn waits on the model when the process "dies"; the others are queued behind it.
        let journal = Arc::new(SqliteJournal::open_with(&db.0, every(3)).unwrap());
        let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
        let model = Arc::new(
            ScriptedProvider::new([]).with_fallback(|_| ScriptStep::Delay {
                after: std::time::Duration::from_secs(3600),
                then: Box::new(ScriptStep::reply("too late")),
            }),
        );
        let a = team.assistant("a", model);
        for (i, content) in sent.iter().enumerate() {
            let id = a
                .try_send_event_durable(UserEvent::new(content.as_str()))
                .await
                .unwrap();
            assert_eq!(id, i as u64 + 1);
            // Acknowledged means committed: another connection already reads it.
            let on_disk = JournalReader::open(&db.0).unwrap().events_of("a").unwrap();
            assert!(
                on_disk
                    .iter()
                    .any(|e| matches!(e.kind, EventKind::EventQueued { id: q, .. } if q == id)),
                "event {id} acknowledged before it was durable"
            );
        }
        within_secs("e0 taken", || a.record().pending.len() == 4).await;
        // The "crash": nothing more reaches the file.
        journal.close();
        team.shutdown().await;
    }

    let journal = Arc::new(SqliteJournal::open_with(&db.0, every(3)).unwrap());
    let records = journal.recover_records().unwrap();
    assert_eq!(pending_ids(&records[0]), [2, 3, 4, 5]);
    assert!(
        journal.stats().restored_snapshots > 0,
        "restored without a snapshot"
    );
    let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    let model = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    let a = team
        .spawn(AgentSpec::assistant("a", model).restored_from(records[0].clone()))
        .unwrap();
    within_secs("the pending events answered", || a.status().turns == 4).await;
    let live = a.record();
    assert!(live.pending.is_empty());
    let users: Vec<&str> = live
        .history
        .iter()
        .filter(|m| m.role == protocols::ChatRole::User)
        .filter_map(|m| m.content.as_deref())
        .collect();
    let expected: Vec<String> = sent.iter().map(|c| format!("[api] {c}")).collect();
    assert_eq!(users, expected, "each acknowledged event once, in order");
    assert_eq!(journal.restore_records().unwrap()[0], live);
}

// ---- what `durable` reports ---------------------------------------------------------------------

fn poisoned(i: usize) -> EventKind {
    EventKind::SafetyAlert {
        message: format!("poison {i}"),
    }
}

#[actix_rt::test]
async fn a_failing_disk_degrades_the_journal_loses_nothing_and_recovers_whole() {
    let db = TempDb::new("not-durable");
    let journal = SqliteJournal::open(&db.0).unwrap();
    let a = key("a");
    let before = journal.append(&a, alert(1));
    assert_eq!(journal.durable(before).await, Ok(()));
    assert_eq!(journal.degraded(), None);

    poison_writes(&db.0);
    let failing = journal.append(&a, poisoned(1));
    // Waiters are told at once (once the quick retries fail), not when the disk comes back.
    match journal.durable(failing).await {
        Err(NotDurable::WriteFailed { reason }) => {
            assert!(reason.contains("injected write failure"), "{reason}")
        }
        other => panic!("a batch that cannot be written reported as {other:?}"),
    }
    assert!(journal
        .degraded()
        .is_some_and(|r| r.contains("injected write failure")));
    assert_eq!(journal.stats().failed_batches, 1);
    assert_eq!(
        NotDurable::WriteFailed {
            reason: "injected write failure".into()
        }
        .to_string(),
        "journal write failed: injected write failure"
    );
    // Events behind the failing batch wait behind it, in order: not durable either, meanwhile.
    let behind = journal.append(&a, alert(2));
    assert!(journal.durable(behind).await.is_err());
    assert_eq!(journal.durable(before).await, Ok(()));

    // The disk comes back: the failing batch commits first, then the rest; nothing was dropped.
    unpoison_writes(&db.0);
    journal.flush();
    for _ in 0..200 {
        if journal.degraded().is_none() && journal.stats().committed_seq >= behind {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(journal.degraded(), None);
    assert_eq!(journal.durable(failing).await, Ok(()));
    assert_eq!(journal.durable(behind).await, Ok(()));

    journal.close();
    let closed = journal.append(&a, alert(3));
    assert_eq!(journal.durable(closed).await, Err(NotDurable::Closed));
    assert_eq!(NotDurable::Closed.to_string(), "journal is closed");

    // On disk: everything before the close, in order.
    let on_disk: Vec<EventKind> = journal::JournalReader::open(&db.0)
        .unwrap()
        .events_of("a")
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(on_disk, [alert(1), poisoned(1), alert(2)]);
}

/// Runs `warden journal --db DB ARGS`: exit code, stdout, stderr.
fn journal_cli(db: &Path, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .arg("journal")
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Issue 13: `warden journal export` writes JSON lines without `--json` (still accepted); `--db`
/// naming a directory or a missing file says which path; piped into a reader that goes away (`|
/// head`), no "Broken pipe" and exit 0.
#[test]
fn journal_export_is_json_lines_db_errors_name_the_path_and_a_closed_pipe_is_quiet() {
    let db = TempDb::new("cli");
    {
        let journal = SqliteJournal::open(&db.0).unwrap();
        for i in 0..3000 {
            journal.append(&key("npc"), alert(i));
        }
        journal.close();
    }
    for args in [&["export"][..], &["export", "--json"]] {
        let (code, out, err) = journal_cli(&db.0, args);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
        let seqs: Vec<u64> = out
            .lines()
            .map(|line| serde_json::from_str::<Event>(line).unwrap().seq)
            .collect();
        assert_eq!(seqs, (1..=3000).collect::<Vec<u64>>(), "{args:?}");
    }

    let dir = db.0.parent().unwrap();
    let (code, out, err) = journal_cli(dir, &["tail"]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        format!(
            "error: journal {0} is a directory: --db takes the journal's file (such as \
             {0}/warden.db)\n",
            dir.display()
        )
    );
    let missing = dir.join("absent.db");
    let (code, _, err) = journal_cli(&missing, &["export"]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!("error: journal {} does not exist\n", missing.display())
    );
    assert!(!missing.exists());

    // More than a pipe holds; the reader takes one line and goes away.
    for args in [&["tail", "-n", "3000"][..], &["export"], &["show", "npc"]] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
            .arg("journal")
            .arg("--db")
            .arg(&db.0)
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
        assert!(!first.is_empty(), "{args:?}");
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).as_ref()
            ),
            (Some(0), ""),
            "{args:?}"
        );
    }
}

/// `warden journal` reads a journal on a read-only mount (a backup, a volume mounted `ro`): SQLite
/// cannot create the WAL's shared-memory file there, so the reader opens it as an immutable file.
/// Needs root, to bind-mount the journal's directory read-only.
#[test]
fn journal_commands_read_a_journal_on_a_read_only_mount() {
    let dir = warden_testkit::scratch_dir("journal", "read-only");
    let source = dir.join("source");
    let mount = dir.join("mount");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::create_dir_all(&mount).unwrap();
    {
        let journal = SqliteJournal::open(source.join("warden.db")).unwrap();
        for i in 0..3 {
            journal.append(&key("npc"), alert(i));
        }
        journal.close();
    }
    let bound = std::process::Command::new("mount")
        .args(["--bind", "-o", "ro"])
        .arg(&source)
        .arg(&mount)
        .output();
    match bound {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            warden_testkit::skip(&format!(
                "cannot bind-mount read-only (needs root): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return;
        }
        Err(e) => {
            warden_testkit::skip(&format!("cannot run mount: {e}"));
            return;
        }
    }
    let db = mount.join("warden.db");
    // The mount really is read-only.
    let writable = std::fs::write(mount.join("probe"), "x").is_ok();
    let results: Vec<(i32, String, String)> = [&["show", "npc"][..], &["tail"], &["export"]]
        .iter()
        .map(|args| journal_cli(&db, args))
        .collect();
    let _ = std::process::Command::new("umount").arg(&mount).status();
    assert!(!writable, "the bind mount is writable");
    for ((code, out, err), what) in results.iter().zip(["show", "tail", "export"]) {
        assert_eq!((*code, err.as_str()), (0, ""), "journal {what}");
        assert!(out.contains("npc"), "journal {what}: {out}");
    }
}
