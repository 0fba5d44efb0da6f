//! The work of a turn: task progress for the limits, and the conversation history.

use super::*;
use crate::context;
use warden_protocols::AgentRecord;

impl AgentCell {
    /// A new task (event or delegated task) starts: loop caps and the wall clock restart, and the
    /// checkpoint forgets the extensions it counted for the previous task (which ends here: a tick
    /// runs on in the current task, so nothing earlier does).
    pub(crate) fn begin_task(&self) -> String {
        let mut task = self.busy().task.lock();
        if !task.run_id.is_empty() {
            self.safety.checkpoint.forget_run(&task.run_id);
            self.safety.permissions.forget_run(&task.run_id);
        }
        task.seq += 1;
        task.run_id = format!("{}#{}", self.key, task.seq);
        task.iterations = 0;
        task.started = tokio::time::Instant::now();
        self.breakers_lock().begin_task();
        task.run_id.clone()
    }

    /// One more loop iteration of the current task: (iteration number in the task, elapsed).
    pub(crate) fn task_iteration(&self) -> (u32, Duration, String) {
        let mut task = self.busy().task.lock();
        task.iterations = task.iterations.saturating_add(1);
        (task.iterations, task.started.elapsed(), task.run_id.clone())
    }

    /// The current task's run id (auto-extensions are counted per run).
    pub(crate) fn current_run_id(&self) -> String {
        self.busy_now()
            .map(|b| b.task.lock().run_id.clone())
            .unwrap_or_default()
    }

    /// Takes back an iteration that a refused limit did not let run.
    pub(crate) fn task_iteration_undo(&self) {
        let mut task = self.busy().task.lock();
        task.iterations = task.iterations.saturating_sub(1);
    }

    pub(crate) fn append_history(&self, message: ChatMessage) {
        let mut rec = self.lock();
        self.emit(&mut rec, EventKind::HistoryAppended { message });
    }

    /// The system message as sent to the model: the system prompt, then the goals (if any).
    pub(crate) fn system_message(&self, rec: &AgentRecord) -> Option<ChatMessage> {
        if rec.goals.is_empty() && rec.reflections.is_empty() {
            return self
                .system_prompt
                .as_ref()
                .map(|prompt| ChatMessage::system(prompt.clone()));
        }
        let mut text = self.system_prompt.clone().unwrap_or_default();
        for (title, items) in [
            ("Your current goals:", &rec.goals),
            ("Your recent reflections:", &rec.reflections),
        ] {
            if items.is_empty() {
                continue;
            }
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(title);
            for item in items {
                text.push_str("\n- ");
                text.push_str(item);
            }
        }
        Some(ChatMessage::system(text))
    }

    /// System prompt + history as sent to the model: fitted into `execution.max_context_tokens` by
    /// the context strategy, cloning only the newest messages the window needs
    /// ([`context::fit_history`]: O(window), however long the history); the whole history when
    /// the window is unknown (0).
    pub(crate) fn conversation(&self) -> Vec<ChatMessage> {
        let rec = self.lock();
        let system = self.system_message(&rec);
        let max = self.settings.max_context_tokens;
        if max > 0 {
            return context::fit_history(
                system.as_ref(),
                &rec.history,
                max,
                self.settings.context_strategy,
            )
            .0;
        }
        let mut messages = Vec::with_capacity(rec.history.len() + 1);
        messages.extend(system);
        messages.extend(rec.history.iter().cloned());
        messages
    }
}
