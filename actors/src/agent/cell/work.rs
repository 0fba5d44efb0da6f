//! The work of a turn: task progress for the limits, and the conversation history.

use super::*;

impl AgentCell {
    /// A new task (event or delegated task) starts: loop caps and the wall clock restart, and the
    /// checkpoint forgets the extensions it counted for the previous task (which ends here: a tick
    /// runs on in the current task, so nothing earlier does).
    pub(crate) fn begin_task(&self) -> String {
        let mut task = self.task.lock();
        if !task.run_id.is_empty() {
            self.safety.checkpoint.forget_run(&task.run_id);
        }
        task.seq += 1;
        task.run_id = format!("{}#{}", self.key, task.seq);
        task.iterations = 0;
        task.started = tokio::time::Instant::now();
        self.breakers.lock().begin_task();
        task.run_id.clone()
    }

    /// One more loop iteration of the current task: (iteration number in the task, elapsed).
    pub(crate) fn task_iteration(&self) -> (u32, Duration, String) {
        let mut task = self.task.lock();
        task.iterations = task.iterations.saturating_add(1);
        (task.iterations, task.started.elapsed(), task.run_id.clone())
    }

    /// The current task's run id (auto-extensions are counted per run).
    pub(crate) fn current_run_id(&self) -> String {
        self.task.lock().run_id.clone()
    }

    /// Takes back an iteration that a refused limit did not let run.
    pub(crate) fn task_iteration_undo(&self) {
        let mut task = self.task.lock();
        task.iterations = task.iterations.saturating_sub(1);
    }

    pub(crate) fn append_history(&self, message: ChatMessage) {
        let mut rec = self.lock();
        self.emit(&mut rec, EventKind::HistoryAppended { message });
    }

    /// System prompt + history, as sent to the model.
    pub(crate) fn conversation(&self) -> Vec<ChatMessage> {
        let rec = self.lock();
        let mut messages = Vec::with_capacity(rec.history.len() + 1);
        if let Some(prompt) = &self.system_prompt {
            messages.push(ChatMessage::system(prompt.clone()));
        }
        messages.extend(rec.history.iter().cloned());
        messages
    }
}
