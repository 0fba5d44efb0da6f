//! [`ToolRegistry`]: the tools of one agent, by name.

use super::Tool;
use std::sync::Arc;
use warden_protocols::ToolSpec;

/// The tools of one agent, by name.
///
/// A short vector sorted by name (agents have a handful of tools; a hash map per agent would cost
/// more memory than it saves time). Specs are shared by `Arc`, so a tool registered with many agents
/// (the supervisor's `delegate`) keeps one copy of its JSON schema.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<(Arc<ToolSpec>, Arc<dyn Tool>)>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a tool under its spec's name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        let spec = Arc::new(tool.spec());
        self.register_with_spec(spec, tool);
    }

    /// Adds (or replaces) a tool whose spec is already built and shared.
    pub(crate) fn register_with_spec(&mut self, spec: Arc<ToolSpec>, tool: Arc<dyn Tool>) {
        match self.position(&spec.name) {
            Ok(i) => self.tools[i] = (spec, tool),
            Err(i) => self.tools.insert(i, (spec, tool)),
        }
    }

    /// Whether both hold the very same tools (the same specs and tools, by address): an agent
    /// with one can share the other's.
    pub(crate) fn same_as(&self, other: &ToolRegistry) -> bool {
        self.tools.len() == other.tools.len()
            && self
                .tools
                .iter()
                .zip(&other.tools)
                .all(|((s, t), (os, ot))| {
                    Arc::ptr_eq(s, os) && std::ptr::addr_eq(Arc::as_ptr(t), Arc::as_ptr(ot))
                })
    }

    /// Drops the spare room growth left (a registry is built once and then only read).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.tools.shrink_to_fit();
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.tools
            .binary_search_by(|(spec, _)| spec.name.as_str().cmp(name))
    }

    /// The spec and the tool registered under `name`; `None` if there is none.
    pub fn get(&self, name: &str) -> Option<(&ToolSpec, &Arc<dyn Tool>)> {
        let i = self.position(name).ok()?;
        self.tools.get(i).map(|(s, t)| (&**s, t))
    }

    /// Specs sorted by name (a stable prompt).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|(s, _)| (**s).clone()).collect()
    }

    /// Names sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|(s, _)| s.name.as_str())
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}
