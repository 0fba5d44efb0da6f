//! From a checked team file to a running team: providers (with their shared limiters), MCP
//! servers, agents' specs and their spawn ([`TeamFile::spawn_agents`] and its variants), and the
//! permission table `warden config check` prints.

use super::*;

impl TeamFile {
    /// Starts the `[mcp_servers]` (none: `None`) and lists their tools, so that
    /// [`TeamFile::spawn_agents_with_mcp`] can give agents the tools they name. Needs a tokio
    /// runtime with I/O and time (an actix `System` is one).
    pub async fn start_mcp(&self) -> Result<Option<McpHub>, TeamError> {
        if self.mcp_servers.is_empty() {
            return Ok(None);
        }
        let env = Arc::new(|name: &str| std::env::var(name).ok());
        Ok(Some(McpHub::start(&self.mcp_servers, env).await?))
    }

    /// [`TeamFile::start_mcp`] for `warden serve`: the stdio servers' process groups are recorded
    /// in the file `record` (next to the journal), and those a previous run left there still
    /// running (a `SIGKILL`ed warden) are ended first, even when the team has no MCP server now.
    pub async fn start_mcp_recorded(
        &self,
        record: &std::path::Path,
    ) -> Result<Option<McpHub>, TeamError> {
        if self.mcp_servers.is_empty() {
            warden_actors::tools::mcp::end_recorded(record);
            return Ok(None);
        }
        let env = Arc::new(|name: &str| std::env::var(name).ok());
        Ok(Some(
            McpHub::start_recorded(&self.mcp_servers, env, record).await?,
        ))
    }

    /// `warden config check` of the `[mcp_servers]`: starts each server once, lists its tools, checks
    /// every agent's `tools` against them (when all servers started) and ends them. Per server its
    /// tools or exactly why not; then the first agent entry naming no usable tool, if any.
    pub async fn check_mcp(&self) -> McpCheck {
        let env: warden_actors::tools::mcp::EnvLookup =
            Arc::new(|name: &str| std::env::var(name).ok());
        let (hub, servers) = warden_actors::tools::mcp::start_each(&self.mcp_servers, env).await;
        let mut tools = Ok(BTreeMap::new());
        if servers.iter().all(|(_, listed)| listed.is_ok()) {
            let journal: Arc<dyn crate::Journal> = Arc::new(crate::MemoryJournal::new());
            for agent in self.agents.iter().filter(|a| !a.tools.is_empty()) {
                match hub.tools_for(&agent.key.as_str().into(), &agent.tools, &journal) {
                    Ok(given) => {
                        let tiers = given
                            .iter()
                            .map(|t| {
                                let spec = warden_actors::Tool::spec(t.as_ref());
                                (spec.name, spec.category)
                            })
                            .collect();
                        if let Ok(table) = &mut tools {
                            table.insert(agent.key.clone(), tiers);
                        }
                    }
                    Err(e) => {
                        tools = Err(TeamError::from(e));
                        break;
                    }
                }
            }
        }
        hub.shutdown().await;
        McpCheck { servers, tools }
    }

    /// Builds the provider `[providers.NAME]` describes. An OpenAI-compatible one bounds each
    /// attempt by `safety.timeout.llm_call_seconds` and reads its key from `api_key_env` now;
    /// a scripted one needs no network. Each call builds a new provider (a scripted one starts
    /// its replies over), but every provider built for one name shares that name's
    /// [`ProviderLimiter`] (`max_concurrency`, `requests_per_minute`, `tokens_per_minute`, and the
    /// pause a server's `Retry-After` or `x-ratelimit-*` headers ask for): it is made on the first
    /// call for the name and kept by this file (see [`TeamFile::limiter`]).
    ///
    /// # Errors
    ///
    /// * [`TeamError::UnknownProvider`] — no provider has that name (with `agent` empty).
    /// * [`TeamError::Provider`] — the `api_key_env` variable is unset or empty, or the HTTP
    ///   client could not be built.
    pub fn provider(&self, name: &str) -> Result<Arc<dyn Provider>, TeamError> {
        let spec = self
            .providers
            .get(name)
            .ok_or_else(|| TeamError::UnknownProvider {
                agent: String::new(),
                provider: name.to_owned(),
                have: self
                    .providers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        Ok(match spec {
            ProviderSpec::OpenaiCompatible { api_key_env, .. } => {
                let timeout = Duration::from_secs_f64(self.config.safety.timeout.llm_call_seconds);
                let config = spec
                    .openai_config(timeout)
                    .ok_or_else(|| TeamError::Provider {
                        provider: name.to_owned(),
                        message: "not an OpenAI-compatible provider".into(),
                    })?;
                let provider = match api_key_env {
                    Some(var) => OpenAiCompatible::from_env(config, var),
                    None => OpenAiCompatible::new(config),
                }
                .map_err(|e| TeamError::Provider {
                    provider: name.to_owned(),
                    message: e.to_string(),
                })?;
                Arc::new(provider.with_limiter(self.limiter_for(name, spec)))
            }
            ProviderSpec::Scripted {
                replies,
                cycle,
                latency_ms,
                jitter_ms,
                error,
                embedding_dimensions,
                ..
            } => {
                let (latency_ms, jitter_ms, cycle) = (*latency_ms, *jitter_ms, *cycle);
                let script: Vec<ScriptStep> = match error {
                    Some(message) => vec![ScriptStep::fail(message.clone())],
                    None if replies.is_empty() => vec![ScriptStep::reply("(no reply scripted)")],
                    None => replies.iter().map(ScriptedReply::step).collect(),
                };
                let calls = std::sync::atomic::AtomicU64::new(0);
                let mut scripted = ScriptedProvider::new([]);
                if *embedding_dimensions > 0 {
                    scripted = scripted.with_embeddings(*embedding_dimensions as usize);
                }
                let scripted = Arc::new(scripted.with_fallback(move |_| {
                    // Call `n` (from 0) answers after latency_ms + a deterministic 0..=jitter_ms.
                    let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let last = script.len() - 1;
                    let at = if cycle {
                        (n % script.len() as u64) as usize
                    } else {
                        usize::try_from(n).map_or(last, |n| n.min(last))
                    };
                    let step = script[at].clone();
                    let ms = latency_ms.saturating_add(jitter(n, jitter_ms));
                    if ms == 0 {
                        step
                    } else {
                        step.delayed(Duration::from_millis(ms))
                    }
                }));
                // The turn's llm_call_seconds bounds the scripted call itself, not the wait for
                // the shared limits (as for the OpenAI-compatible kind).
                let timeout =
                    Duration::try_from_secs_f64(self.config.safety.timeout.llm_call_seconds)
                        .unwrap_or_default();
                Arc::new(
                    Limited::new(scripted, self.limiter_for(name, spec)).with_call_timeout(timeout),
                )
            }
        })
    }

    /// The limiter shared by every agent of provider `name`, once [`TeamFile::provider`] has built
    /// one for it; `None` before, or for a name not in `[providers]`.
    pub fn limiter(&self, name: &str) -> Option<Arc<ProviderLimiter>> {
        self.limiters.lock().get(name).cloned()
    }

    pub(super) fn limiter_for(&self, name: &str, spec: &ProviderSpec) -> Arc<ProviderLimiter> {
        self.limiters
            .lock()
            .entry(name.to_owned())
            .or_insert_with(|| ProviderLimiter::new(name, spec.limits()))
            .clone()
    }

    /// Spawns every agent on `team` (a file from [`TeamFile::from_toml`], so the team is valid),
    /// in file order, each with its provider, system prompt and (unless `delegate = false`) the
    /// `delegate` tool. Agents spawned before an error stay spawned.
    ///
    /// # Errors
    ///
    /// * [`TeamError::Provider`] / [`TeamError::UnknownProvider`] — a provider could not be built
    ///   (see [`TeamFile::provider`]).
    /// * [`TeamError::Spawn`] — the supervisor already has an agent with one of the keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use warden::{team::TeamFile, MemoryJournal, Supervisor};
    ///
    /// let file = TeamFile::from_toml(
    ///     r#"
    /// [providers.canned]
    /// kind = "scripted"
    /// replies = ["Welcome!"]
    ///
    /// [[agents]]
    /// key = "innkeeper"
    /// provider = "canned"
    ///
    /// [[agents]]
    /// key = "cook"
    /// role = "sub_agent"
    /// parent = "innkeeper"
    /// provider = "canned"
    /// "#,
    /// )?;
    /// actix_rt::System::new().block_on(async {
    ///     let journal = Arc::new(MemoryJournal::new());
    ///     let team = Supervisor::on_current_arbiter(file.config.clone(), journal);
    ///     file.spawn_agents(&team)?;
    ///     assert!(team.get("cook").is_some());
    ///     // The keys are taken now: a second spawn is refused.
    ///     assert!(file.spawn_agents(&team).is_err());
    ///     Ok::<(), warden::team::TeamError>(())
    /// })?;
    /// # Ok::<(), warden::team::TeamError>(())
    /// ```
    pub fn spawn_agents(&self, team: &Supervisor) -> Result<(), TeamError> {
        self.spawn_agents_restored(team, &[])
    }

    /// Spawns every agent on `team`, each from its record in `records` when there is one (a restart
    /// on a journal: state, lockout, counters and history come back as they were). Records of
    /// keys the file no longer has are ignored. A team whose agents name MCP tools needs
    /// [`TeamFile::spawn_agents_with_mcp`].
    ///
    /// # Errors
    ///
    /// As [`TeamFile::spawn_agents`].
    pub fn spawn_agents_restored(
        &self,
        team: &Supervisor,
        records: &[warden_protocols::AgentRecord],
    ) -> Result<(), TeamError> {
        self.spawn_agents_with_mcp(team, records, None)
    }

    /// [`TeamFile::spawn_agents_restored`], giving each agent the MCP tools its `tools` names from
    /// `mcp` (from [`TeamFile::start_mcp`]). An entry naming a tool the server does not offer is an
    /// error naming the agent, the entry and the server's tools; nothing is spawned then.
    pub fn spawn_agents_with_mcp(
        &self,
        team: &Supervisor,
        records: &[warden_protocols::AgentRecord],
        mcp: Option<&McpHub>,
    ) -> Result<(), TeamError> {
        self.spawn_agents_wrapped(team, records, mcp, &|provider| provider)
    }

    /// [`TeamFile::spawn_agents_with_mcp`], each agent's provider passed through `wrap` first
    /// (`warden loadtest --config` counts the model calls this way).
    ///
    /// # Errors
    ///
    /// As [`TeamFile::spawn_agents_with_mcp`].
    pub fn spawn_agents_wrapped(
        &self,
        team: &Supervisor,
        records: &[warden_protocols::AgentRecord],
        mcp: Option<&McpHub>,
        wrap: &dyn Fn(Arc<dyn Provider>) -> Arc<dyn Provider>,
    ) -> Result<(), TeamError> {
        let mut tools = Vec::with_capacity(self.agents.len());
        for agent in &self.agents {
            let key = warden_protocols::AgentKey::from(agent.key.as_str());
            tools.push(match mcp {
                _ if agent.tools.is_empty() => Vec::new(),
                Some(hub) => hub.tools_for(&key, &agent.tools, team.journal())?,
                None => {
                    return Err(TeamError::Invalid {
                        key: "tools".into(),
                        agent: Some(agent.key.clone()),
                        value: agent.tools.join(", "),
                        allowed: "tools of MCP servers started with TeamFile::start_mcp".into(),
                    })
                }
            });
        }
        for (agent, tools) in self.agents.iter().zip(tools) {
            team.spawn(self.agent_spec(agent, tools, records, wrap)?)?;
        }
        Ok(())
    }

    /// The spec `agent` is spawned from: its provider (passed through `wrap`), prompt, delegation,
    /// `[npc]`, goals, `[memory]`, `tools`, and its record in `records` when there is one.
    ///
    /// # Errors
    ///
    /// [`TeamError`] when its provider cannot be made.
    pub(crate) fn agent_spec(
        &self,
        agent: &AgentFileSpec,
        tools: Vec<Arc<dyn warden_actors::Tool>>,
        records: &[warden_protocols::AgentRecord],
        wrap: &dyn Fn(Arc<dyn Provider>) -> Arc<dyn Provider>,
    ) -> Result<AgentSpec, TeamError> {
        let provider = wrap(self.provider(&agent.provider)?);
        let mut spec = match (agent.role, &agent.parent) {
            (AgentRole::SubAgent, Some(parent)) => {
                AgentSpec::sub_agent(agent.key.as_str(), parent.as_str(), provider)
            }
            _ => AgentSpec::assistant(agent.key.as_str(), provider),
        };
        if let Some(prompt) = &agent.system_prompt {
            spec = spec.with_system_prompt(prompt.clone());
        }
        if !agent.delegate {
            spec = spec.without_delegation();
        }
        if let Some(npc) = agent.npc_config(&self.config.npc) {
            spec = spec.with_npc(npc);
        }
        if let Some(goals) = &agent.goals {
            spec = spec.with_goals(goals.clone());
        }
        if let Some(own) = &agent.memory {
            spec = spec.with_memory(own.apply(&self.config.memory));
        }
        if let Some(own) = &agent.execution {
            spec = spec.with_execution(own.apply(&self.config.execution));
        }
        if agent.permissions.is_some() {
            let at = self
                .agents
                .iter()
                .position(|a| a.key == agent.key)
                .unwrap_or_default();
            spec = spec.with_permissions(agent.permission_policy(&self.config.permissions, at));
        }
        for tool in tools {
            spec = spec.with_tool_arc(tool);
        }
        if let Some(record) = records.iter().find(|r| r.key.as_str() == agent.key) {
            spec = spec.restored_from(record.clone());
        }
        Ok(spec)
    }
}

impl TeamFile {
    /// The permission gate's effective rule for every tool of every agent, as `warden config
    /// check` prints it: one line per tool, `  AGENT  TOOL (TIER): RULING`, the rulings in the
    /// order tried (see [`warden_protocols::PermissionPolicy::describe`]). `mcp` gives each
    /// agent's MCP tools (name as the model sees it, tier), when the servers were started.
    pub fn permission_table(
        &self,
        mcp: &BTreeMap<String, Vec<(String, warden_protocols::ToolCategory)>>,
    ) -> String {
        use warden_protocols::ToolCategory;
        let mut out =
            String::from("permissions (the effective rule for each tool, first match first):\n");
        for (at, agent) in self.agents.iter().enumerate() {
            let policy = agent.permission_policy(&self.config.permissions, at);
            let mut tools: Vec<(String, ToolCategory)> = Vec::new();
            if agent.delegate {
                tools.push(("delegate".into(), ToolCategory::SafeChain));
            }
            if agent.goals.is_some() {
                tools.push(("set_goals".into(), ToolCategory::SafeChain));
            }
            tools.extend(mcp.get(&agent.key).cloned().unwrap_or_default());
            tools.sort_by(|a, b| a.0.cmp(&b.0));
            if tools.is_empty() {
                out.push_str(&format!("  {}: no tools\n", agent.key));
            }
            for (tool, category) in tools {
                let tier = match category {
                    ToolCategory::SafeChain => "SAFE_CHAIN",
                    ToolCategory::Terminal => "TERMINAL",
                    ToolCategory::Dangerous => "DANGEROUS",
                };
                out.push_str(&format!(
                    "  {}  {tool} ({tier}): {}\n",
                    agent.key,
                    policy.describe(&tool, category)
                ));
            }
        }
        out
    }
}

/// A deterministic 0..=`max` for call `n` (splitmix64), for the scripted model's jitter.
pub(super) fn jitter(n: u64, max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % (max + 1)
}
