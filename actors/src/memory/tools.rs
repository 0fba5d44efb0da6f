//! The agent's own memory tools (Letta-style self-managed memory): `remember`, `recall`,
//! `forget`. Given to every agent with `memory.long_term`; like every tool they go through the
//! runner, so the permission gate (`[permissions]`) and the circuits apply to them.
//!
//! What the model remembers carries the trust of the source the turn answers (the speaker of the
//! TRIGGER; an operator's request is trusted; a tick is `self` at the claim threshold), so a
//! player cannot launder a rumour into a fact by getting the NPC to write it down.

use crate::{
    agent::cell::AgentCell,
    tools::{Tool, ToolContext, ToolError},
};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::sync::Arc;
use warden_protocols::{memory::MemoryKind, npc::SpeakerKind, AgentKey, ToolCategory, ToolSpec};

/// Finds an agent's cell (the supervisor's registry).
pub(crate) type CellOf = Arc<dyn Fn(&AgentKey) -> Option<Arc<AgentCell>> + Send + Sync>;

/// Which memory tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Remember,
    Recall,
    Forget,
    WakeAt,
}

/// One of the three memory tools.
pub(crate) struct MemoryTool {
    pub(crate) which: Which,
    pub(crate) cell_of: CellOf,
}

impl std::fmt::Debug for MemoryTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryTool({:?})", self.which)
    }
}

/// The memory tools for one agent (`wake_at` only for an NPC that sleeps: `npc.sleep.enabled`).
pub(crate) fn memory_tools(cell_of: CellOf, sleeps: bool) -> Vec<MemoryTool> {
    let mut which = vec![Which::Remember, Which::Recall, Which::Forget];
    if sleeps {
        which.push(Which::WakeAt);
    }
    which
        .into_iter()
        .map(|which| MemoryTool {
            which,
            cell_of: cell_of.clone(),
        })
        .collect()
}

fn text_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

impl Tool for MemoryTool {
    fn spec(&self) -> ToolSpec {
        match self.which {
            Which::Remember => ToolSpec {
                name: "remember".into(),
                description: "Write something down in your long-term memory. Either a note (`text`), or a fact about someone or something (`subject`, `predicate`, `object`, e.g. p1 / name / Aldric). What the person you answer told you is stored with their trust: a low-trust source's word is kept as their claim, not as a fact.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "description": "a note in your words"},
                        "subject": {"type": "string"},
                        "predicate": {"type": "string"},
                        "object": {"type": "string"},
                        "importance": {"type": "integer", "minimum": 1, "maximum": 10}
                    }
                }),
                category: ToolCategory::SafeChain,
            },
            Which::Recall => ToolSpec {
                name: "recall".into(),
                description: "Search your long-term memory: the memories most relevant to `query`, and what you know `about` someone (their id).".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string"},
                        "about": {"type": "string", "description": "a speaker id"}
                    }
                }),
                category: ToolCategory::SafeChain,
            },
            Which::Forget => ToolSpec {
                name: "forget".into(),
                description: "Remove a memory for good, by its number (`#12` is id 12).".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {"id": {"type": "integer", "minimum": 0}},
                    "required": ["id"]
                }),
                category: ToolCategory::Dangerous,
            },
            Which::WakeAt => ToolSpec {
                name: "wake_at".into(),
                description: "While you sleep (your sleep hours), wake at this game hour instead of when your sleep hours end.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {"hour": {"type": "number", "minimum": 0, "maximum": 24}},
                    "required": ["hour"]
                }),
                category: ToolCategory::SafeChain,
            },
        }
    }

    fn call(&self, args: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        let cell = (self.cell_of)(&ctx.agent);
        let which = self.which;
        Box::pin(async move {
            let cell =
                cell.ok_or_else(|| ToolError::Failed(format!("unknown agent {}", ctx.agent)))?;
            match which {
                Which::Remember => remember(&cell, &args),
                Which::Recall => recall(&cell, &args),
                Which::WakeAt => wake_at(&cell, &args),
                Which::Forget => {
                    let id = args.get("id").and_then(Value::as_u64).ok_or_else(|| {
                        ToolError::InvalidArguments("`id` must be a memory number".into())
                    })?;
                    let (gone, _) = cell.forget_memories(&[id], None, "model");
                    if gone.is_empty() {
                        return Err(ToolError::Failed(format!("no memory #{id}")));
                    }
                    Ok(json!({"forgotten": id}))
                }
            }
        })
    }
}

fn remember(cell: &AgentCell, args: &Value) -> Result<Value, ToolError> {
    let importance = args
        .get("importance")
        .and_then(Value::as_u64)
        .map_or(5, |i| i.clamp(1, 10) as u8);
    // The source the turn answers: its speaker and trust (an operator's request: trusted).
    let turn = cell.live().turn();
    let (speaker, trust) = turn.unwrap_or((None, cell.settings.npc.trigger_min_trust));
    let by = speaker.unwrap_or_else(|| "self".to_owned());
    let fact = (
        text_arg(args, "subject"),
        text_arg(args, "predicate"),
        text_arg(args, "object"),
    );
    let stored = match fact {
        (Some(s), Some(p), Some(o)) => cell.store_fact(s, p, o, trust, &by, Vec::new(), importance),
        (None, None, None) => {
            let text = text_arg(args, "text").ok_or_else(|| {
                ToolError::InvalidArguments(
                    "give `text`, or all of `subject`, `predicate` and `object`".into(),
                )
            })?;
            let kind = MemoryKind::Observation {
                speaker: by.clone(),
                speaker_kind: if by == "self" {
                    SpeakerKind::Npc
                } else {
                    SpeakerKind::Unknown
                },
                source: "remember".into(),
                room: None,
            };
            cell.store_memory(kind, text, importance, trust)
        }
        _ => {
            return Err(ToolError::InvalidArguments(
                "a fact needs all of `subject`, `predicate` and `object`".into(),
            ))
        }
    };
    let id = stored.map_err(|why| ToolError::Failed(why.to_string()))?;
    Ok(json!({"remembered": id}))
}

fn recall(cell: &AgentCell, args: &Value) -> Result<Value, ToolError> {
    let query = text_arg(args, "query").unwrap_or_default();
    let about = text_arg(args, "about");
    if query.is_empty() && about.is_none() {
        return Err(ToolError::InvalidArguments(
            "give `query` or `about`".into(),
        ));
    }
    let k = usize::from(cell.settings.memory.recall_k.max(1));
    let rec = cell.memory_lock();
    Ok(match cell.recall_for(&rec, query, about, k) {
        Some(found) => json!({"memories": found.text, "ids": found.ids}),
        None => json!({"memories": "nothing remembered", "ids": []}),
    })
}

/// `wake_at`: the next time the game clock shows `hour`, within the current sleep hours; the
/// tick arbiter honours it, and it is journaled (`wake_scheduled`) so a restart keeps it.
fn wake_at(cell: &AgentCell, args: &Value) -> Result<Value, ToolError> {
    let hour = args
        .get("hour")
        .and_then(Value::as_f64)
        .filter(|h| (0.0..=24.0).contains(h))
        .ok_or_else(|| {
            ToolError::InvalidArguments("`hour` must be a number from 0 to 24".into())
        })?;
    let ticking = cell
        .ticking()
        .ok_or_else(|| ToolError::Failed("no tick schedule (`npc.tick.enabled = false`)".into()))?;
    let now = ticking
        .game_hour()
        .ok_or_else(|| ToolError::Failed("the tick schedule is gone".into()))?;
    let hours = (hour - now).rem_euclid(24.0);
    let speed = cell.settings.npc.clock.speed;
    let speed = if speed.is_finite() && speed > 0.0 {
        speed
    } else {
        1.0
    };
    ticking
        .schedule_wake(std::time::Duration::from_secs_f64(hours * 3600.0 / speed))
        .map_err(ToolError::Failed)?;
    let mut rec = cell.lock();
    if rec.memory().is_some() {
        let at = cell.memory_now(&rec) + hours * 3600.0;
        cell.emit(&mut rec, warden_protocols::EventKind::WakeScheduled { at });
    }
    Ok(json!({"wake_at": hour}))
}
