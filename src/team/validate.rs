//! Checking a parsed team file ([`TeamFile::validate`]): each rule a named check, run in a fixed
//! order so the first problem reported is always the same.

use super::*;

impl TeamFile {
    /// Checks `[a2a_agents.*]`: each name usable as a delegate's key and not an agent of the team,
    /// each value in range.
    pub(super) fn validate_a2a_agents(&self) -> Result<(), TeamError> {
        for (name, agent) in &self.a2a_agents {
            let invalid = |key: &str, value: String, allowed: &str| TeamError::Invalid {
                key: format!("a2a_agents.{name}{key}"),
                agent: None,
                value,
                allowed: allowed.into(),
            };
            if !warden_protocols::valid_server_name(name) {
                return Err(invalid(
                    "",
                    quoted(name),
                    "a name of 1 to 32 letters, digits, `-` and `_`, without `__` and not \
                     starting or ending with `_`",
                ));
            }
            if self.agents.iter().any(|a| a.key == *name) {
                return Err(invalid(
                    "",
                    quoted(name),
                    "a name no `[[agents]]` entry has (a delegation names one or the other)",
                ));
            }
            if let Err((key, value, allowed)) = agent.check() {
                return Err(invalid(&format!(".{key}"), value, allowed));
            }
        }
        Ok(())
    }

    /// Checks `[mcp_servers.*]`: each name usable in tool names, exactly one of `command` and
    /// `url`, a `url` that is http(s), positive timeouts and caps.
    pub(super) fn validate_mcp_servers(&self) -> Result<(), TeamError> {
        for (name, server) in &self.mcp_servers {
            if !warden_protocols::valid_server_name(name) {
                return Err(TeamError::Invalid {
                    key: format!("mcp_servers.{name}"),
                    agent: None,
                    value: quoted(name),
                    allowed: "a name of 1 to 32 letters, digits, `-` and `_`, without `__` and \
                              not starting or ending with `_`"
                        .into(),
                });
            }
            if let Err((key, value, allowed)) = server.check() {
                return Err(TeamError::Invalid {
                    key: format!("mcp_servers.{name}.{key}"),
                    agent: None,
                    value,
                    allowed: allowed.into(),
                });
            }
            if let Some(retry) = &server.retry {
                if let Err(ConfigError::Invalid {
                    key,
                    value,
                    allowed,
                }) = retry.validate(&format!("mcp_servers.{name}.retry"))
                {
                    return Err(TeamError::Invalid {
                        key: key.into_owned(),
                        agent: None,
                        value,
                        allowed: allowed.into(),
                    });
                }
            }
            if let Some(url) = &server.url {
                if !is_http_url(url) {
                    return Err(TeamError::Invalid {
                        key: format!("mcp_servers.{name}.url"),
                        agent: None,
                        value: quoted(url),
                        allowed: "an http:// or https:// URL with a host".into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks what `warden run` and `warden serve` would otherwise reject or misread, naming the
    /// agent, the key, the value and what is allowed: a `base_url` that is not an http(s) URL; no
    /// agents; an empty or duplicate key; a provider not in `[providers]`; a sub-agent without a
    /// parent, an assistant with one, a parent that is no other agent, a cycle of parents.
    ///
    /// # Errors
    ///
    /// [`TeamError::Invalid`] for the first such problem, with the key's path
    /// (`providers.NAME.base_url`, `agents`, `agents[i].key`, `agents[i].provider`,
    /// `agents[i].parent`).
    ///
    /// # Examples
    ///
    /// ```
    /// use warden::team::{TeamError, TeamFile};
    ///
    /// let file = TeamFile::parse(
    ///     r#"
    /// [providers.canned]
    /// kind = "scripted"
    ///
    /// [[agents]]
    /// key = "innkeeper"
    /// provider = "canned"
    ///
    /// [[agents]]
    /// key = "cook"
    /// role = "sub_agent"
    /// provider = "canned"
    /// "#,
    /// )?;
    /// let err = file.validate().unwrap_err();
    /// let TeamError::Invalid { key, .. } = &err else { panic!("{err}") };
    /// assert_eq!(key, "agents[1].parent");
    /// # Ok::<(), TeamError>(())
    /// ```
    pub fn validate(&self) -> Result<(), TeamError> {
        // The order is part of the contract: the first problem found is the one reported.
        self.validate_mcp_servers()?;
        self.validate_a2a_agents()?;
        self.check_agent_settings()?;
        self.check_base_urls()?;
        self.check_some_agents()?;
        let index = self.check_keys_tools_and_providers()?;
        self.check_parents(&index)?;
        self.check_parent_chains(&index)
    }

    /// `agents[i].memory`, `.execution`, `.permissions`, `.goals` and the NPC keys: an agent's own
    /// values over the team's, checked as the team's are, named by the agent's path.
    fn check_agent_settings(&self) -> Result<(), TeamError> {
        for (i, agent) in self.agents.iter().enumerate() {
            // An agent's own `memory` and `execution` keys over the team's, named by its path.
            let own = [
                agent
                    .memory
                    .map(|own| own.apply(&self.config.memory).validate()),
                agent
                    .execution
                    .map(|own| own.apply(&self.config.execution).validate()),
            ];
            for checked in own.into_iter().flatten() {
                if let Err(ConfigError::Invalid {
                    key,
                    value,
                    allowed,
                }) = checked
                {
                    return Err(TeamError::Invalid {
                        key: format!("agents[{i}].{key}"),
                        agent: Some(agent.key.clone()),
                        value,
                        allowed: allowed.into(),
                    });
                }
            }
            if agent.permissions.is_some() {
                let policy = agent.permission_policy(&self.config.permissions, i);
                if let Err((key, value, allowed)) = policy.config().check() {
                    return Err(TeamError::Invalid {
                        key: format!("agents[{i}].permissions.{key}"),
                        agent: Some(agent.key.clone()),
                        value,
                        allowed: allowed.into(),
                    });
                }
            }
            if let Some(goals) = &agent.goals {
                if let Err(why) = warden_protocols::check_goals(goals) {
                    return Err(TeamError::Invalid {
                        key: format!("agents[{i}].goals"),
                        agent: Some(agent.key.clone()),
                        value: why,
                        allowed: format!(
                            "at most {} goals, each not blank and at most {} characters",
                            warden_protocols::MAX_GOALS,
                            warden_protocols::MAX_GOAL_CHARS
                        ),
                    });
                }
            }
            let Some(npc) = agent.npc_config(&self.config.npc) else {
                continue;
            };
            if let Err(ConfigError::Invalid {
                key,
                value,
                allowed,
            }) = npc.validate()
            {
                return Err(TeamError::Invalid {
                    key: format!("agents[{i}].{key}"),
                    agent: Some(agent.key.clone()),
                    value,
                    allowed: allowed.into(),
                });
            }
        }
        Ok(())
    }

    /// `providers.NAME.base_url`: an http(s) URL with a host.
    fn check_base_urls(&self) -> Result<(), TeamError> {
        for (name, spec) in &self.providers {
            if let ProviderSpec::OpenaiCompatible { base_url, .. } = spec {
                if !is_http_url(base_url) {
                    return Err(TeamError::Invalid {
                        key: format!("providers.{name}.base_url"),
                        agent: None,
                        value: quoted(base_url),
                        allowed: "an http:// or https:// URL with a host, such as \
                                  \"http://127.0.0.1:8080/v1\""
                            .into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// `agents`: at least one.
    fn check_some_agents(&self) -> Result<(), TeamError> {
        if self.agents.is_empty() {
            return Err(TeamError::Invalid {
                key: "agents".into(),
                agent: None,
                value: "none".into(),
                allowed: "one or more [[agents]] entries, each with a `key` and a `provider`"
                    .into(),
            });
        }
        Ok(())
    }

    /// `TeamError::Invalid` for `agents[at].field`.
    fn invalid_agent(&self, at: usize, field: &str, value: String, allowed: String) -> TeamError {
        TeamError::Invalid {
            key: format!("agents[{at}].{field}"),
            agent: Some(self.agents[at].key.clone()),
            value,
            allowed,
        }
    }

    /// `agents[i].key` (not blank, no surrounding whitespace, unique), `agents[i].tools` (each an
    /// MCP server's tool or all of one), `agents[i].provider` (one of `[providers]`). The agents'
    /// index by key, for the parent checks.
    fn check_keys_tools_and_providers(&self) -> Result<BTreeMap<&str, usize>, TeamError> {
        let invalid =
            |at, field: &str, value, allowed| self.invalid_agent(at, field, value, allowed);
        let mut index: BTreeMap<&str, usize> = BTreeMap::new();
        for (at, agent) in self.agents.iter().enumerate() {
            let key = agent.key.as_str();
            if key.trim().is_empty() || key.trim() != key {
                return Err(TeamError::Invalid {
                    key: format!("agents[{at}].key"),
                    agent: None,
                    value: quoted(key),
                    allowed: "a key that is not empty and does not start or end with whitespace"
                        .into(),
                });
            }
            if let Some(first) = index.insert(key, at) {
                return Err(invalid(
                    at,
                    "key",
                    quoted(key),
                    format!(
                        "a key no other agent has; agents[{first}] is {} too",
                        quoted(key)
                    ),
                ));
            }
            for (i, entry) in agent.tools.iter().enumerate() {
                let known = McpToolSelector::parse(entry)
                    .is_some_and(|s| self.mcp_servers.contains_key(&s.server));
                if !known {
                    return Err(invalid(
                        at,
                        &format!("tools[{i}]"),
                        quoted(entry),
                        format!(
                            "\"SERVER.TOOL\" or \"SERVER.*\" with SERVER a key of [mcp_servers]: {}",
                            listed(self.mcp_servers.keys().map(String::as_str))
                        ),
                    ));
                }
            }
            if !self.providers.contains_key(&agent.provider) {
                return Err(invalid(
                    at,
                    "provider",
                    quoted(&agent.provider),
                    format!(
                        "a provider of [providers]: {}",
                        listed(self.providers.keys().map(String::as_str))
                    ),
                ));
            }
        }
        Ok(index)
    }

    /// `agents[i].parent`: a sub-agent has one, an assistant none, and it is another agent's key.
    fn check_parents(&self, index: &BTreeMap<&str, usize>) -> Result<(), TeamError> {
        let invalid =
            |at, field: &str, value, allowed| self.invalid_agent(at, field, value, allowed);
        let others = |me: &str| listed(index.keys().copied().filter(|k| *k != me));
        for (at, agent) in self.agents.iter().enumerate() {
            let key = agent.key.as_str();
            match (agent.role, &agent.parent) {
                (AgentRole::SubAgent, None) => {
                    return Err(invalid(
                        at,
                        "parent",
                        "none".into(),
                        format!(
                            "the key of another agent, as role = \"sub_agent\" needs a parent: {}",
                            others(key)
                        ),
                    ))
                }
                (AgentRole::Assistant, Some(parent)) => {
                    return Err(invalid(
                        at,
                        "parent",
                        quoted(parent),
                        format!(
                            "none for an assistant; add role = \"sub_agent\" to make `{key}` a \
                             sub-agent of `{parent}`"
                        ),
                    ))
                }
                (AgentRole::SubAgent, Some(parent))
                    if parent == key || !index.contains_key(parent.as_str()) =>
                {
                    return Err(invalid(
                        at,
                        "parent",
                        quoted(parent),
                        format!("the key of another agent: {}", others(key)),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `agents[i].parent`: every chain of parents ends at an assistant (no loop).
    fn check_parent_chains(&self, index: &BTreeMap<&str, usize>) -> Result<(), TeamError> {
        let invalid =
            |at, field: &str, value, allowed| self.invalid_agent(at, field, value, allowed);
        // Every parent is now another agent: follow each chain; it ends at an assistant or loops.
        for (at, agent) in self.agents.iter().enumerate() {
            let mut chain = vec![agent.key.as_str()];
            let mut next = agent.parent.as_deref();
            while let Some(parent) = next {
                if parent == agent.key {
                    chain.push(parent);
                    return Err(invalid(
                        at,
                        "parent",
                        quoted(agent.parent.as_deref().unwrap_or_default()),
                        format!(
                            "a parent whose chain of parents ends at an assistant; this one \
                             loops: {}",
                            chain.join(" -> ")
                        ),
                    ));
                }
                if chain.contains(&parent) {
                    break; // a loop further up: reported for an agent on it
                }
                chain.push(parent);
                next = index
                    .get(parent)
                    .and_then(|&i| self.agents[i].parent.as_deref());
            }
        }
        Ok(())
    }
}

/// Checks the values of `[providers.*]` that have a range, before typed parsing (whose errors
/// inside the tagged provider table would not name the key): each error names
/// `providers.NAME.key`, the value as written and what is allowed.
pub(super) fn validate_providers(providers: &toml::Value) -> Result<(), TeamError> {
    let Some(providers) = providers.as_table() else {
        return Ok(()); // the typed parse reports it
    };
    for (name, spec) in providers {
        let Some(spec) = spec.as_table() else {
            continue;
        };
        let check = |key: &str, lo: i64, hi: i64, allowed: String| -> Result<(), TeamError> {
            match spec.get(key) {
                None => Ok(()),
                Some(toml::Value::Integer(v)) if (lo..=hi).contains(v) => Ok(()),
                Some(value) => Err(TeamError::ProviderValue {
                    key: format!("providers.{name}.{key}"),
                    value: value.to_string(),
                    allowed,
                }),
            }
        };
        // The shared limits, of every kind (0: unlimited).
        check("max_concurrency", 0, 10_000, "0 (no cap) to 10000".into())?;
        check(
            "requests_per_minute",
            0,
            1_000_000,
            "0 (no limit) to 1000000".into(),
        )?;
        check(
            "tokens_per_minute",
            0,
            1_000_000_000,
            "0 (no limit) to 1000000000".into(),
        )?;
        if spec.get("kind").and_then(toml::Value::as_str) != Some("openai_compatible") {
            if spec.get("embedding_dimensions") != Some(&toml::Value::Integer(0)) {
                check(
                    "embedding_dimensions",
                    8,
                    4096,
                    "0 (none) or 8 to 4096".into(),
                )?;
            }
            continue;
        }
        check("retry_attempts", 1, 20, "1 to 20".into())?;
        check("retry_base_ms", 0, 600_000, "0 to 600000".into())?;
        let base = spec
            .get("retry_base_ms")
            .and_then(toml::Value::as_integer)
            .unwrap_or_else(|| i64::try_from(default_retry_base_ms()).unwrap_or(0));
        check(
            "retry_cap_ms",
            base,
            600_000,
            format!("the value of providers.{name}.retry_base_ms ({base}) to 600000"),
        )?;
        check("retry_after_cap_ms", 0, 3_600_000, "0 to 3600000".into())?;
        check(
            "max_response_bytes",
            1024,
            1 << 30,
            "1024 to 1073741824".into(),
        )?;
    }
    Ok(())
}

/// Whether `url` is an absolute http(s) URL with a host (what the provider can post to).
pub(super) fn is_http_url(url: &str) -> bool {
    reqwest::Url::parse(url).is_ok_and(|u| {
        matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty())
    })
}
