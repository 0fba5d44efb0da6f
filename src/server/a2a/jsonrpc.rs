//! `POST /a2a`: A2A's JSON-RPC 2.0 binding.
//!
//! Methods, by their 1.0 name (and the 0.3 name many clients still send, answered in 0.3 shapes):
//! `SendMessage` (`message/send`), `SendStreamingMessage` (`message/stream`), `GetTask`
//! (`tasks/get`), `ListTasks` (`tasks/list`), `CancelTask` (`tasks/cancel`), `SubscribeToTask`
//! (`tasks/resubscribe`), `GetExtendedAgentCard` (`agent/getAuthenticatedExtendedCard`: the public
//! card), `CreateTaskPushNotificationConfig`, `GetTaskPushNotificationConfig`,
//! `ListTaskPushNotificationConfigs`, `DeleteTaskPushNotificationConfig` (1.0 names only; the 0.3
//! ones answer `-32003`).
//!
//! Tokens are HTTP's business, as for the rest of the API: no or a wrong token is `401`, the read
//! token on `SendMessage`, `SendStreamingMessage` or `CancelTask` is `403`. Everything else that
//! goes wrong is a JSON-RPC error in a `200`: `-32700` not JSON, `-32600` not a request (a batch,
//! no `method`, a body over `api.max_body_bytes`), `-32601` unknown method, `-32602` bad params,
//! `-32001` unknown task, `-32002` a task that cannot be canceled any more, `-32004` a message on
//! a task that asks nothing, `-32005` a part that is not text. A refused call queues nothing.

use super::tasks::{self, A2aError};
use crate::server::api::{self, Access, ApiError, ApiState};
use actix_web::{http::StatusCode, web, HttpRequest, HttpResponse, ResponseError};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use warden_protocols::a2a::{
    codes, to_v03, ListTasksRequest, PushConfigParams, SendMessageRequest, TaskIdParams,
    TaskPushNotificationConfig,
};

/// Which spelling of the protocol a call used: its answer is given in the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// A2A 1.0 (`SendMessage`): proto-JSON shapes.
    V10,
    /// A2A 0.3 (`message/send`): `kind` discriminators, lowercase states.
    V03,
}

impl Dialect {
    /// `value` (a 1.0 result) as this dialect writes it.
    pub fn shape(self, value: Value) -> Value {
        match self {
            Dialect::V10 => value,
            Dialect::V03 => to_v03(value),
        }
    }
}

/// The methods served, each with the access it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Send,
    Stream,
    Get,
    List,
    Cancel,
    Subscribe,
    Card,
    PushCreate,
    PushGet,
    PushList,
    PushDelete,
    PushV03,
}

fn method_of(name: &str) -> Option<(Method, Dialect)> {
    use Dialect::*;
    use Method::*;
    Some(match name {
        "SendMessage" => (Send, V10),
        "message/send" => (Send, V03),
        "SendStreamingMessage" => (Stream, V10),
        "message/stream" => (Stream, V03),
        "GetTask" => (Get, V10),
        "tasks/get" => (Get, V03),
        "ListTasks" => (List, V10),
        "tasks/list" => (List, V03),
        "CancelTask" => (Cancel, V10),
        "tasks/cancel" => (Cancel, V03),
        "SubscribeToTask" => (Subscribe, V10),
        "tasks/resubscribe" => (Subscribe, V03),
        "GetExtendedAgentCard" => (Card, V10),
        "agent/getAuthenticatedExtendedCard" => (Card, V03),
        "CreateTaskPushNotificationConfig" => (PushCreate, V10),
        "GetTaskPushNotificationConfig" => (PushGet, V10),
        "ListTaskPushNotificationConfigs" => (PushList, V10),
        "DeleteTaskPushNotificationConfig" => (PushDelete, V10),
        "tasks/pushNotificationConfig/set"
        | "tasks/pushNotificationConfig/get"
        | "tasks/pushNotificationConfig/list"
        | "tasks/pushNotificationConfig/delete" => (PushV03, V03),
        _ => return None,
    })
}

/// A JSON-RPC error response (in a `200`).
pub fn error(id: &Value, code: i64, message: impl Into<String>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message.into() },
    }))
}

fn failed(id: &Value, err: A2aError) -> HttpResponse {
    error(id, err.code, err.message)
}

fn result(id: &Value, value: Value) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "jsonrpc": "2.0", "id": id, "result": value }))
}

fn params<T: DeserializeOwned>(params: Option<Value>) -> Result<T, A2aError> {
    serde_json::from_value(params.unwrap_or_else(|| json!({})))
        .map_err(|e| A2aError::new(codes::INVALID_PARAMS, format!("params: {e}")))
}

/// The request body, `limit` bytes at most (`None`: larger).
async fn body(mut payload: web::Payload, limit: usize) -> Result<Option<web::BytesMut>, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// `POST /a2a`.
pub(crate) async fn endpoint(
    state: web::Data<ApiState>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let access = match api::access_of(&req) {
        Ok(access) => access,
        Err(err) => return err.error_response(),
    };
    let null = Value::Null;
    let limit = state.config.limit();
    let bytes = match body(payload, limit).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return error(
                &null,
                codes::INVALID_REQUEST,
                format!("request larger than {limit} bytes (api.max_body_bytes)"),
            )
        }
        Err(err) => return err.error_response(),
    };
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(value) => value,
        Err(e) => return error(&null, codes::PARSE_ERROR, format!("not JSON: {e}")),
    };
    let Value::Object(mut request) = request else {
        return error(
            &null,
            codes::INVALID_REQUEST,
            "a JSON-RPC request is an object (batches are not served)",
        );
    };
    let id = match request.remove("id") {
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id,
        None => Value::Null,
        Some(_) => return error(&null, codes::INVALID_REQUEST, "id: a string or a number"),
    };
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return error(&id, codes::INVALID_REQUEST, "jsonrpc: must be \"2.0\"");
    }
    let Some(name) = request.get("method").and_then(Value::as_str) else {
        return error(&id, codes::INVALID_REQUEST, "method: a string is required");
    };
    let Some((method, dialect)) = method_of(name) else {
        return error(
            &id,
            codes::METHOD_NOT_FOUND,
            format!("no method {name:?} (docs/a2a.md lists the methods)"),
        );
    };
    let needs_admin = matches!(
        method,
        Method::Send | Method::Stream | Method::Cancel | Method::PushCreate | Method::PushDelete
    );
    if needs_admin && access != Access::Admin {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{name} needs the admin token"),
        )
        .error_response();
    }
    let params_value = request.remove("params");
    let state = state.into_inner();
    match method {
        Method::Send => {
            let send: SendMessageRequest = match params(params_value) {
                Ok(p) => p,
                Err(err) => return failed(&id, err),
            };
            let mut sent = match tasks::send(&state, &send).await {
                Ok(sent) => sent,
                Err(err) => return failed(&id, err),
            };
            let config = send.configuration.clone().unwrap_or_default();
            if let Some(push) = config.task_push_notification_config.clone() {
                if sent.id != 0 {
                    if let Err(err) = super::push::create(&state, &sent.task, push) {
                        return failed(&id, err);
                    }
                }
            }
            let immediately = config.return_immediately || config.blocking == Some(false);
            let task = if immediately {
                Ok(sent.task.clone())
            } else {
                tasks::until_interrupted(&state, &mut sent).await
            };
            match task {
                Ok(task) => result(&id, dialect.shape(json!({ "task": task }))),
                Err(err) => failed(&id, err),
            }
        }
        Method::Stream => {
            let send: SendMessageRequest = match params(params_value) {
                Ok(p) => p,
                Err(err) => return failed(&id, err),
            };
            match tasks::send(&state, &send).await {
                Ok(sent) => super::stream::sse(state, id, dialect, sent),
                Err(err) => failed(&id, err),
            }
        }
        Method::Subscribe => {
            let params: TaskIdParams = match params(params_value) {
                Ok(p) => p,
                Err(err) => return failed(&id, err),
            };
            match tasks::get(&state, &params.id).await {
                Ok(task) => {
                    let (agent, event) = tasks::parse_task_id(&task.id)
                        .map(|(a, e)| (a.to_owned(), e))
                        .unwrap_or_default();
                    let sent = tasks::Sent {
                        agent,
                        id: event,
                        task,
                        reply: None,
                    };
                    super::stream::sse(state, id, dialect, sent)
                }
                Err(err) => failed(&id, err),
            }
        }
        Method::Get => match params::<TaskIdParams>(params_value) {
            Ok(p) => match tasks::get(&state, &p.id).await {
                // `GetTask` and `CancelTask` answer the task itself (`SendMessage` wraps it).
                Ok(task) => result(&id, dialect.shape(json!(task))),
                Err(err) => failed(&id, err),
            },
            Err(err) => failed(&id, err),
        },
        Method::Cancel => match params::<TaskIdParams>(params_value) {
            Ok(p) => match tasks::cancel(&state, &p.id).await {
                // `GetTask` and `CancelTask` answer the task itself (`SendMessage` wraps it).
                Ok(task) => result(&id, dialect.shape(json!(task))),
                Err(err) => failed(&id, err),
            },
            Err(err) => failed(&id, err),
        },
        Method::List => match params::<ListTasksRequest>(params_value) {
            Ok(p) => match tasks::list(&state, &p).await {
                Ok(list) => {
                    let mut value = json!(list);
                    if dialect == Dialect::V03 {
                        value["tasks"] = to_v03(value["tasks"].take());
                    }
                    result(&id, value)
                }
                Err(err) => failed(&id, err),
            },
            Err(err) => failed(&id, err),
        },
        Method::Card => {
            let card = super::card::card_for(&state, &req);
            result(&id, json!(card))
        }
        Method::PushCreate => {
            let config: TaskPushNotificationConfig = match params(params_value) {
                Ok(p) => p,
                Err(err) => return failed(&id, err),
            };
            let created = match tasks::get(&state, &config.task_id).await {
                Ok(task) => super::push::create(&state, &task, config),
                Err(err) => Err(err),
            };
            match created {
                Ok(config) => result(&id, json!(config)),
                Err(err) => failed(&id, err),
            }
        }
        Method::PushGet | Method::PushList | Method::PushDelete => {
            let p: PushConfigParams = match params(params_value) {
                Ok(p) => p,
                Err(err) => return failed(&id, err),
            };
            if let Err(err) = tasks::get(&state, &p.task_id).await {
                return failed(&id, err);
            }
            let pushes = &state.a2a_push;
            let answer = match method {
                Method::PushGet => pushes.get(&p.task_id, &p.id).map(|c| json!(c)),
                Method::PushList => Ok(json!({ "configs": pushes.list(&p.task_id) })),
                _ => pushes.delete(&p.task_id, &p.id).map(|()| json!({})),
            };
            match answer {
                Ok(value) => result(&id, value),
                Err(err) => failed(&id, err),
            }
        }
        Method::PushV03 => error(
            &id,
            codes::PUSH_NOTIFICATION_NOT_SUPPORTED,
            "the 0.3 push-notification config methods are not served: use A2A 1.0's \
             CreateTaskPushNotificationConfig and the like",
        ),
    }
}
