//! The SQLite journal: round trip, group commit and the durability wait, restore after a restart
//! (a locked-out agent stays locked out), schema migrations and the `warden journal` inspection.
mod common;
use common::*;
use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
};
use warden::{
    journal::{self, must_be_durable, JournalError, SCHEMA_VERSION},
    protocols::Breaker,
    *,
};

/// A fresh database path under the system temp dir, removed (with its WAL files) on drop.
struct TempDb(PathBuf);

impl TempDb {
    fn new(name: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "warden-journal-test-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst),
            name
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDb(dir.join("warden.db"))
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn key(k: &str) -> AgentKey {
    AgentKey::new(k)
}

fn halted() -> EventKind {
    EventKind::Halted {
        cause: HaltCause::Operator {
            operator: "op".into(),
        },
        discarded: 2,
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
    assert!(records[1].emergency_stop);
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
fn safety_events_are_committed_before_append_returns() {
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
    ];
    for (i, kind) in durable.into_iter().enumerate() {
        assert!(must_be_durable(&kind));
        let before = journal.stats();
        let seq = journal.append(&key("a"), kind);
        assert!(
            committed(seq),
            "event {i} acknowledged before it was committed"
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
    let err = SqliteJournal::open(&db.0)
        .err()
        .expect("newer schema refused");
    assert!(matches!(err, JournalError::NewerSchema { found: 99, .. }));
    assert!(err.to_string().contains("schema version 99 is newer"));
    assert!(JournalReader::open(&db.0).is_err());
}

/// One failing LLM call per event until the agent is locked out.
async fn lock_out(agent: &AgentHandle) {
    for i in 0..5 {
        agent
            .try_send_event(UserEvent::new(format!("e{i}")))
            .unwrap();
        until("turn done", || {
            agent.status().turns == i + 1 || agent.state() == AgentState::SafetyLockout
        })
        .await;
    }
    assert_eq!(agent.state(), AgentState::SafetyLockout);
}

#[actix_rt::test]
async fn restored_records_equal_the_live_records_after_a_scenario() {
    tokio::time::pause();
    let journal = Arc::new(SqliteJournal::open(":memory:").unwrap());
    let team = Supervisor::on_current_arbiter(WardenConfig::default(), journal.clone());
    let failing =
        Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::fail("model down")));
    let chatty = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("hi")));
    let a = team.spawn(AgentSpec::assistant("a", failing)).unwrap();
    let b = team
        .spawn(AgentSpec::assistant("b", chatty.clone()))
        .unwrap();
    let c = team.spawn(AgentSpec::assistant("c", chatty)).unwrap();
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
    assert!(records[0].emergency_stop);
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
        let a = team.spawn(AgentSpec::assistant("a", model)).unwrap();
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
    assert!(!after[0].emergency_stop);
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
    assert!(text.contains("events (6):"));

    let mut out = Vec::new();
    journal::show(&db.0, "other", true, &mut out).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(doc["record"]["halts"], 1);

    let err = journal::show(&db.0, "nobody", false, &mut Vec::new()).unwrap_err();
    assert_eq!(err.to_string(), "no events for agent nobody");

    let mut out = Vec::new();
    journal::export_json(&db.0, &mut out).unwrap();
    let events: Vec<Event> = serde_json::from_slice(&out).unwrap();
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
