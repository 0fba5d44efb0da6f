//! Push notifications: a task's state changes POSTed to the client's webhook.
//!
//! A config (`CreateTaskPushNotificationConfig`, or `SendMessage`'s
//! `configuration.taskPushNotificationConfig`) starts a watch of its task: each change of state is
//! queued for delivery as `{"statusUpdate": …}` (the stream's item), the current state first, until
//! the task ends or the config is deleted. One delivery task per config POSTs them in order with
//! `X-A2A-Notification-Token: TOKEN` (and `Authorization: SCHEME CREDENTIALS` when the config has
//! `authentication`), retrying a failed POST (network error or a non-2xx answer) with backoff: 4
//! attempts, 1 s, ×2, 10 s cap. Nothing here is on the agent's path: the watch reads the journal
//! and the bus, the delivery has its own queue (64 updates; past that an update is dropped and
//! logged), so a slow or dead webhook never holds an agent up.
//!
//! Configs live in memory: after a restart a client sets them again (the tasks themselves survive).

use super::tasks::{self, A2aError};
use crate::server::api::ApiState;
use parking_lot::Mutex;
use serde_json::json;
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};
use warden_protocols::a2a::{
    codes, StreamResponse, Task, TaskPushNotificationConfig, TaskStatusUpdateEvent,
};

/// Delivery attempts per update.
pub const ATTEMPTS: u32 = 4;
const BASE: Duration = Duration::from_secs(1);
const CAP: Duration = Duration::from_secs(10);
const QUEUE: usize = 64;

/// The push configs of this server's tasks.
#[derive(Debug, Default)]
pub struct Pushes {
    configs: Mutex<HashMap<String, Vec<TaskPushNotificationConfig>>>,
    next: AtomicU64,
    http: std::sync::OnceLock<reqwest::Client>,
}

impl Pushes {
    fn client(&self) -> reqwest::Client {
        self.http
            .get_or_init(|| {
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap_or_default()
            })
            .clone()
    }

    fn live(&self, task: &str, id: &str) -> bool {
        self.configs
            .lock()
            .get(task)
            .is_some_and(|c| c.iter().any(|c| c.id == id))
    }

    /// The configs of `task`.
    pub fn list(&self, task: &str) -> Vec<TaskPushNotificationConfig> {
        self.configs.lock().get(task).cloned().unwrap_or_default()
    }

    /// Config `id` of `task`.
    ///
    /// # Errors
    /// `-32602` for a config that does not exist.
    pub fn get(&self, task: &str, id: &str) -> Result<TaskPushNotificationConfig, A2aError> {
        self.list(task)
            .into_iter()
            .find(|c| c.id == id)
            .ok_or_else(|| no_config(task, id))
    }

    /// Deletes config `id` of `task` (its watch stops before its next update).
    ///
    /// # Errors
    /// `-32602` for a config that does not exist.
    pub fn delete(&self, task: &str, id: &str) -> Result<(), A2aError> {
        let mut configs = self.configs.lock();
        let list = configs.get_mut(task).ok_or_else(|| no_config(task, id))?;
        let before = list.len();
        list.retain(|c| c.id != id);
        if list.len() == before {
            return Err(no_config(task, id));
        }
        Ok(())
    }
}

fn no_config(task: &str, id: &str) -> A2aError {
    A2aError::new(
        codes::INVALID_PARAMS,
        format!("task {task} has no push notification config {id:?}"),
    )
}

/// Stores `config` for `task` (as it is now) and starts its watch and delivery.
///
/// # Errors
/// `-32602` for a URL that is not `http` or `https`.
pub fn create(
    state: &Arc<ApiState>,
    task: &Task,
    mut config: TaskPushNotificationConfig,
) -> Result<TaskPushNotificationConfig, A2aError> {
    let url = reqwest::Url::parse(&config.url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| {
            A2aError::new(
                codes::INVALID_PARAMS,
                format!("url {:?}: an http or https URL is required", config.url),
            )
        })?;
    let (agent, event) = tasks::parse_task_id(&task.id)
        .map(|(a, e)| (a.to_owned(), e))
        .ok_or_else(|| A2aError::new(codes::TASK_NOT_FOUND, format!("no task {}", task.id)))?;
    let pushes = state.a2a_push.clone();
    config.task_id = task.id.clone();
    if config.id.is_empty() {
        config.id = format!("push-{}", pushes.next.fetch_add(1, Ordering::Relaxed) + 1);
    }
    {
        let mut configs = pushes.configs.lock();
        let list = configs.entry(task.id.clone()).or_default();
        list.retain(|c| c.id != config.id);
        list.push(config.clone());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
    actix_web::rt::spawn(deliver(pushes.clone(), config.clone(), url, rx));
    actix_web::rt::spawn(watch(
        state.clone(),
        agent,
        event,
        task.clone(),
        config.clone(),
        tx,
    ));
    Ok(config)
}

fn update(task: &Task) -> serde_json::Value {
    json!(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: task.status.clone(),
    }))
}

/// Queues the task's state now and each change until it ends or the config goes.
async fn watch(
    state: Arc<ApiState>,
    agent: String,
    event: u64,
    first: Task,
    config: TaskPushNotificationConfig,
    tx: tokio::sync::mpsc::Sender<serde_json::Value>,
) {
    let queue = |task: &Task| {
        if tx.try_send(update(task)).is_err() {
            tracing::warn!(task = %task.id, config = %config.id, "A2A push queue full: update dropped");
        }
    };
    queue(&first);
    let mut last = first.status.state;
    let mut reply = None;
    while !last.is_terminal() {
        let task = match tasks::next(
            &state,
            &agent,
            event,
            &mut reply,
            Some(last),
            Duration::from_secs(60),
        )
        .await
        {
            Ok(task) => task,
            Err(err) => {
                tracing::warn!(task = %first.id, "A2A push watch ended: {err}");
                return;
            }
        };
        if !state.a2a_push.live(&first.id, &config.id) {
            return;
        }
        if task.status.state != last {
            last = task.status.state;
            queue(&task);
        }
    }
}

/// POSTs the queued updates in order, each with retries.
async fn deliver(
    pushes: Arc<Pushes>,
    config: TaskPushNotificationConfig,
    url: reqwest::Url,
    mut rx: tokio::sync::mpsc::Receiver<serde_json::Value>,
) {
    let http = pushes.client();
    while let Some(body) = rx.recv().await {
        let mut wait = BASE;
        for attempt in 1..=ATTEMPTS {
            let mut req = http.post(url.clone()).json(&body);
            if !config.token.is_empty() {
                req = req.header("X-A2A-Notification-Token", &config.token);
            }
            if let Some(auth) = &config.authentication {
                req = req.header(
                    "Authorization",
                    format!("{} {}", auth.scheme, auth.credentials),
                );
            }
            let outcome = match req.send().await {
                Ok(resp) if resp.status().is_success() => Ok(()),
                Ok(resp) => Err(format!("webhook answered {}", resp.status())),
                Err(err) => Err(err.to_string()),
            };
            match outcome {
                Ok(()) => break,
                Err(why) if attempt == ATTEMPTS => {
                    tracing::warn!(task = %config.task_id, config = %config.id, attempts = ATTEMPTS,
                        "A2A push not delivered, given up: {why}");
                }
                Err(why) => {
                    tracing::info!(task = %config.task_id, config = %config.id, attempt,
                        "A2A push failed, retrying in {wait:?}: {why}");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(CAP);
                }
            }
        }
    }
}
