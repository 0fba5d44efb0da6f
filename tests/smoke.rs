mod common;
use common::*;
use std::sync::Arc;
use warden::*;

#[actix_rt::test]
async fn an_event_gets_an_answer() {
    tokio::time::pause();
    let (team, journal) = team(WardenConfig::default());
    let model = Arc::new(ScriptedProvider::new([ScriptStep::reply("hello")]));
    let a = team.spawn(AgentSpec::assistant("a", model)).unwrap();
    a.try_send_event(UserEvent::new("hi")).unwrap();
    until("turn finished", || a.status().turns == 1).await;
    assert_eq!(a.state(), AgentState::WaitingForEvent);
    let rec = a.record();
    assert_eq!(rec.history.len(), 2);
    assert_eq!(AgentRecord::replay("a".into(), &journal.events()), rec);
}
