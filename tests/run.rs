//! `warden run`: each event's answer is the reply correlated to it, and with `--event` exactly those
//! events run and it returns, even while the input (a terminal) stays open.
use warden::{
    cli::run::{run, RunOptions},
    team::TeamFile,
};

const TEAM: &str = r#"
[providers.s]
kind = "scripted"
replies = ["first answer", "second answer"]

[[agents]]
key = "inn"
provider = "s"
"#;

#[actix_rt::test]
async fn with_events_it_answers_each_and_returns_while_the_input_stays_open() {
    let file = TeamFile::from_toml(TEAM).unwrap();
    // An input that never ends, as a terminal nobody types into.
    let (_keep_open, input) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut out = Vec::new();
    let options = RunOptions {
        agent: None,
        events: vec!["hi".into(), "again".into()],
    };
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        run(file, options, Some(input), &mut out),
    )
    .await
    .expect("run returned after its events")
    .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("inn: first answer\ninn: second answer\n"),
        "{out}"
    );
}

#[actix_rt::test]
async fn without_events_each_input_line_is_one_and_a_failure_says_why() {
    let file = TeamFile::from_toml(
        r#"
[providers.down]
kind = "scripted"
replies = ["x"]
error = "model down"

[[agents]]
key = "inn"
provider = "down"
"#,
    )
    .unwrap();
    let (tx, input) = tokio::sync::mpsc::unbounded_channel::<String>();
    tx.send("hello".into()).unwrap();
    drop(tx);
    let mut out = Vec::new();
    run(file, RunOptions::default(), Some(input), &mut out)
        .await
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("inn: [error] llm call failed: model down"),
        "{out}"
    );
}
