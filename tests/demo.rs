//! The demo shows what the README says it shows.
#[test]
fn the_demo_trips_refuses_unlocks_and_halts_behind_a_backlog() {
    let mut out = Vec::new();
    let report = actix_rt::System::new()
        .block_on(async { warden::cli::demo::run(&mut out, &mut |_q: &str| None).await })
        .expect("demo runs");
    let text = String::from_utf8(out).expect("utf-8");
    assert_eq!(
        report.act1_answer.as_deref(),
        Some("The library opens at 9 — I've noted it for you.")
    );
    assert_eq!(
        report.lockout_reason.as_deref(),
        Some("repeated a failed action after the system alert (4 identical failures in a row)")
    );
    assert_eq!(
        report.refusal.as_deref(),
        Some("delegate researcher is emergency-stopped (state SAFETY_LOCKOUT)")
    );
    assert!(report.unlocked_and_answered);
    assert_eq!(report.halt_discarded, report.halt_backlog);
    assert_eq!(report.processed_after_halt, 0);
    assert_eq!(report.llm_calls_dropped_by_halt, 1);
    assert!(text.contains("== Final status"));
    // Act 2: the alert came before the lockout.
    assert!(report.alert_injected);
    // Act 5: stopped by the budget before the call that would exceed it.
    assert_eq!(
        report
            .budget_stop
            .as_deref()
            .map(|r| r.starts_with("token budget")),
        Some(true),
        "{:?}",
        report.budget_stop
    );
    let poet = report
        .statuses
        .iter()
        .find(|s| s.key.as_str() == "poet")
        .expect("poet");
    assert_eq!(poet.state, warden::AgentState::Stopped);
    assert!(poet.tokens_used <= 5_000, "{}", poet.tokens_used);
    // Act 6: asked, auto-denied without a terminal, wrapped up.
    assert!(report
        .ask_question
        .as_deref()
        .is_some_and(|q| q.contains("safety.loop.max_iterations_per_task")));
    assert_eq!(report.ask_answer, "no");
    assert_eq!(
        report.wrap_up.as_deref(),
        Some("I surveyed plots 1 to 6 (notes in the survey log); plots 7 and up remain.")
    );
    let scribe = report
        .statuses
        .iter()
        .find(|s| s.key.as_str() == "scribe")
        .expect("scribe");
    assert_eq!(scribe.state, warden::AgentState::Stopped);
    assert_eq!(scribe.discarded_by_halt, 10_000);
}

/// Issue 13: the README's demo transcript is the demo's real output. Every line of each transcript
/// block in the README's tour (between "### 1. The demo" and the next section) appears in the
/// output, in order; a line that is `…` stands for lines left out.
#[test]
fn the_readme_transcript_is_the_demos_real_output() {
    let mut out = Vec::new();
    actix_rt::System::new()
        .block_on(async { warden::cli::demo::run(&mut out, &mut |_q: &str| None).await })
        .expect("demo runs");
    let output = String::from_utf8(out).expect("utf-8");
    let readme = include_str!("../README.md");
    let start = readme
        .find("### 1. The demo")
        .expect("the tour's demo section");
    let section = &readme[start..];
    let section = &section[..section[4..].find("\n##").map_or(section.len(), |i| i + 4)];
    let mut blocks = 0;
    for block in section.split("```").skip(1).step_by(2) {
        let (info, body) = block.split_once('\n').unwrap_or((block, ""));
        if info != "text" {
            continue; // the commands (`sh`), not the output
        }
        blocks += 1;
        let mut lines = output.lines();
        for expected in body.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
            if expected == "…" {
                continue;
            }
            assert!(
                lines.any(|line| line.trim_end() == expected),
                "README transcript line not in the demo's output (in order):\n{expected}\n\
                 --- output ---\n{output}"
            );
        }
    }
    assert!(blocks >= 2, "the README's tour shows the demo's output");
}

/// Issue 13: answering `yes` (or `y`) to Act 6's ask at a terminal let the surveyor go on to a second
/// ask the demo never showed, and the demo timed out waiting for the surveyor. Every ask is shown
/// and answered; approved, the surveyor finishes its survey.
#[test]
fn approving_act_6s_ask_lets_the_surveyor_finish() {
    for yes in ["yes", "y"] {
        let mut out = Vec::new();
        let mut questions = Vec::new();
        let report = actix_rt::System::new()
            .block_on(async {
                warden::cli::demo::run(&mut out, &mut |q: &str| {
                    questions.push(q.to_owned());
                    Some(yes.to_owned())
                })
                .await
            })
            .expect("demo runs");
        let text = String::from_utf8(out).expect("utf-8");
        let act6 = &text[text.find("== Act 6").expect("act 6")..text.find("\n== Final").unwrap()];
        assert_eq!(
            act6,
            "== Act 6: a loop cap (safety.loop.max_iterations_per_task = 6), interactive mode\n   \
             surveyor is WAITING_FOR_INPUT\n   \
             ? Agent surveyor reached its limit on iterations per task: 7 against a configured 6 \
             (`safety.loop.max_iterations_per_task`). Allow it to continue for another 6? (yes/no)\n   \
             approved; surveyor: I surveyed all 9 plots in the valley.\n"
        );
        assert_eq!(questions.len(), 1, "{questions:?}");
        assert_eq!(report.ask_answer, yes);
        assert_eq!(report.wrap_up, None);
        let surveyor = report
            .statuses
            .iter()
            .find(|s| s.key.as_str() == "surveyor")
            .expect("surveyor");
        assert_eq!(surveyor.turns, 1);
        assert_eq!(surveyor.state, warden::AgentState::WaitingForEvent);
    }
}

/// Issue 13: one status table for `demo`, `run` and `status`: the documented names (`sub_agent`,
/// `yes`/`no`), a PAUSED column, the breaker by its snake_case name.
#[test]
fn the_demos_final_status_is_the_one_status_table() {
    let mut out = Vec::new();
    let report = actix_rt::System::new()
        .block_on(async { warden::cli::demo::run(&mut out, &mut |_q: &str| None).await })
        .expect("demo runs");
    let text = String::from_utf8(out).expect("utf-8");
    let table = &text[text.find("== Final status\n").expect("final status") + 16..];
    assert_eq!(table, warden::cli::table::status_table(&report.statuses));
    assert_eq!(
        table.lines().next(),
        Some(
            "AGENT       ROLE       STATE              PAUSED  E-STOP  ERRORS  SUBS  QUEUED  \
             DISCARDED  TURNS  TOKENS"
        )
    );
    assert!(
        table.contains(
            "\nscribe      sub_agent  STOPPED            no      no         0/5   0/3       0      \
             10000      1      29\n"
        ),
        "{table}"
    );
    assert!(
        table.contains("\npoet: stopped by budget_exceeded: token budget exhausted"),
        "{table}"
    );
}
