//! `SendStreamingMessage` and `SubscribeToTask`: the task over Server-Sent Events, one JSON-RPC
//! response per `data:` line: the task first, then a status update at each change of state, the
//! answer as an artifact update before the `completed` one. The stream ends when the task is
//! interrupted (ended, or `input-required`: the peer answers with a new message on the task, and
//! subscribes again). A client that goes away stops the watch; the task runs on.

use super::{jsonrpc::Dialect, tasks};
use crate::server::api::ApiState;
use actix_web::{web::Bytes, HttpResponse};
use serde_json::{json, Value};
use std::{sync::Arc, time::Duration};
use warden_protocols::a2a::{
    StreamResponse, TaskArtifactUpdateEvent, TaskState, TaskStatusUpdateEvent,
};

/// How long the watch waits for a change before it sends a keep-alive comment (which also finds
/// out that a client went away).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn frame(id: &Value, dialect: Dialect, item: &StreamResponse) -> Bytes {
    let result = dialect.shape(json!(item));
    let body = json!({ "jsonrpc": "2.0", "id": id, "result": result });
    Bytes::from(format!("data: {body}\n\n"))
}

/// The SSE response watching `sent`'s task.
pub(super) fn sse(
    state: Arc<ApiState>,
    id: Value,
    dialect: Dialect,
    mut sent: tasks::Sent,
) -> HttpResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    actix_web::rt::spawn(async move {
        let first = sent.task.clone();
        if tx
            .send(frame(&id, dialect, &StreamResponse::Task(first.clone())))
            .await
            .is_err()
        {
            return;
        }
        let mut last = first.status.state;
        while !last.is_interrupted() && sent.id != 0 {
            let task = match tasks::next(
                &state,
                &sent.agent,
                sent.id,
                &mut sent.reply,
                Some(last),
                KEEP_ALIVE,
            )
            .await
            {
                Ok(task) => task,
                Err(err) => {
                    let body = json!({ "jsonrpc": "2.0", "id": id,
                        "error": { "code": err.code, "message": err.message } });
                    let _ = tx.send(Bytes::from(format!("data: {body}\n\n"))).await;
                    return;
                }
            };
            if task.status.state == last {
                if tx
                    .send(Bytes::from_static(b": keep-alive\n\n"))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            if task.status.state == TaskState::Completed {
                for artifact in &task.artifacts {
                    let update = StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                        task_id: task.id.clone(),
                        context_id: task.context_id.clone(),
                        artifact: artifact.clone(),
                        last_chunk: true,
                    });
                    if tx.send(frame(&id, dialect, &update)).await.is_err() {
                        return;
                    }
                }
            }
            last = task.status.state;
            let update = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
                task_id: task.id,
                context_id: task.context_id,
                status: task.status,
            });
            if tx.send(frame(&id, dialect, &update)).await.is_err() {
                return;
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, actix_web::Error>(b), rx))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(body)
}
