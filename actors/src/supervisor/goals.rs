//! The built-in `set_goals` tool (agents spawned with [`super::AgentSpec::with_goals`]).

use super::*;
use crate::tools::{Tool, ToolContext, ToolError};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use warden_protocols::{ToolCategory, ToolSpec, MAX_GOALS, MAX_GOAL_CHARS};

/// `set_goals`: replaces the calling agent's goals (journaled `goals_set` by `model`).
pub(super) struct GoalsTool {
    pub(super) supervisor: Weak<SupervisorShared>,
}

impl Tool for GoalsTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "set_goals".into(),
            description: format!(
                "Replace your list of current goals (shown in your instructions). Give the whole new list: at most {MAX_GOALS} goals of at most {MAX_GOAL_CHARS} characters; an empty list clears them."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "goals": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "the new goals, most important first"
                    }
                },
                "required": ["goals"]
            }),
            category: ToolCategory::SafeChain,
        }
    }

    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        let supervisor = self.supervisor.clone();
        Box::pin(async move {
            let goals: Vec<String> = args
                .get("goals")
                .cloned()
                .and_then(|g| serde_json::from_value(g).ok())
                .ok_or_else(|| {
                    ToolError::InvalidArguments("`goals` must be an array of strings".into())
                })?;
            warden_protocols::check_goals(&goals).map_err(ToolError::InvalidArguments)?;
            let shared = supervisor
                .upgrade()
                .ok_or_else(|| ToolError::Failed("supervisor is gone".into()))?;
            let cell = shared
                .agents
                .get(&ctx.agent)
                .map(|e| e.cell.clone())
                .ok_or_else(|| ToolError::Failed(format!("unknown agent {}", ctx.agent)))?;
            cell.note(EventKind::GoalsSet {
                goals: goals.clone(),
                by: "model".into(),
            });
            Ok(json!({"goals": goals}))
        })
    }
}
