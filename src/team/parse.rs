//! Reading a team file: TOML → [`TeamFile`] (`[providers]`, `[[agents]]` and the sections),
//! every error placed at its line and column ([`TeamFile::parse`], [`TeamFile::from_toml`], [`check`]).

use super::*;

impl TeamFile {
    /// Parses and validates a team file: `[providers.*]`, `[[agents]]`, `[api]` and the
    /// configuration sections ([`TeamFile::parse`]), then the team itself ([`TeamFile::validate`]).
    /// `warden run` and `warden serve` start only files that pass, and `warden config check` checks
    /// team files with the same validation.
    ///
    /// Building the providers (and reading their API keys) is left to [`TeamFile::provider`] and
    /// [`TeamFile::spawn_agents`].
    ///
    /// # Errors
    ///
    /// Those of [`TeamFile::parse`], then those of [`TeamFile::validate`].
    ///
    /// # Examples
    ///
    /// ```
    /// use warden::team::TeamFile;
    ///
    /// let team = TeamFile::from_toml(
    ///     r#"
    /// [execution]
    /// max_iterations_per_tick = 3
    ///
    /// [providers.canned]
    /// kind = "scripted"
    /// replies = ["Welcome!"]
    ///
    /// [[agents]]
    /// key = "innkeeper"
    /// provider = "canned"
    /// system_prompt = "You run the inn."
    /// "#,
    /// )?;
    /// assert_eq!(team.config.execution.max_iterations_per_tick, 3);
    /// assert_eq!(team.agents[0].key, "innkeeper");
    /// assert!(team.agents[0].delegate); // the default
    /// # Ok::<(), warden::team::TeamError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, TeamError> {
        let file = Self::parse(text)?;
        file.validate().map_err(|e| place(text, e))?;
        Ok(file)
    }

    /// Parses a team file without checking the team ([`TeamFile::validate`]): syntax, types, unknown
    /// keys (each error with its line, column and the offending line), value ranges and `[api]`.
    ///
    /// # Errors
    ///
    /// * [`TeamError::Config`] — not TOML, an unknown key, a wrong type, or a configuration value
    ///   out of range (`ConfigError::Parse` with the place, or `ConfigError::Invalid`).
    /// * [`TeamError::ProviderValue`] — an OpenAI-compatible provider's `retry_*` key out of
    ///   range.
    /// * [`TeamError::Api`] — an invalid `[api]` section.
    ///
    /// # Examples
    ///
    /// ```
    /// use warden::team::{TeamError, TeamFile};
    ///
    /// // Parsed, though `warden run` would refuse it: no agents.
    /// let file = TeamFile::parse("[providers.canned]\nkind = \"scripted\"\n")?;
    /// assert!(file.agents.is_empty());
    /// assert!(file.validate().is_err());
    ///
    /// // A typo is placed in the file.
    /// let err = TeamFile::parse("[[agents]]\nkey = \"a\"\nprovidr = \"m\"\n").unwrap_err();
    /// assert!(matches!(err, TeamError::Config(_)));
    /// assert!(err.to_string().contains("line 3, column 1"));
    /// # Ok::<(), TeamError>(())
    /// ```
    pub fn parse(text: &str) -> Result<Self, TeamError> {
        warden_protocols::precheck(text)?;
        // The retry keys of OpenAI-compatible providers are range-checked on the raw values first,
        // so a negative or fractional one gets the usual message (a syntax error is left to the
        // located parse below).
        if let Ok(table) = toml::from_str::<toml::Table>(text) {
            if let Some(providers) = table.get("providers") {
                validate_providers(providers)?;
            }
        }
        let file = warden_protocols::parse_toml::<TeamDoc>(text)?.split();
        file.config.validate()?;
        file.api.validate()?;
        file.telemetry.validate()?;
        Ok(file)
    }
}

/// A whole team file, deserialized in one pass over its text so that every error carries its place
/// in the file. The configuration's sections are listed here one by one (not flattened: flattening
/// loses both the places and `deny_unknown_fields`); [`TeamDoc::split`] builds a [`WardenConfig`]
/// from them without a `..`, so that a section added there cannot be forgotten here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TeamDoc {
    #[serde(default)]
    safety: warden_protocols::SafetyConfig,
    #[serde(default)]
    execution: warden_protocols::ExecutionConfig,
    #[serde(default)]
    delegation: warden_protocols::DelegationConfig,
    #[serde(default)]
    tools: warden_protocols::ToolsConfig,
    #[serde(default)]
    mailbox: warden_protocols::MailboxConfig,
    #[serde(default)]
    supervisor: warden_protocols::SupervisorConfig,
    #[serde(default)]
    journal: warden_protocols::JournalConfig,
    #[serde(default)]
    npc: warden_protocols::npc::NpcConfig,
    #[serde(default)]
    memory: warden_protocols::MemoryConfig,
    #[serde(default)]
    permissions: warden_protocols::PermissionsConfig,
    #[serde(default)]
    providers: BTreeMap<String, ProviderSpec>,
    #[serde(default)]
    agents: Vec<AgentFileSpec>,
    #[serde(default)]
    api: ApiSection,
    #[serde(default)]
    telemetry: crate::telemetry::TelemetrySection,
    #[serde(default)]
    mcp_servers: BTreeMap<String, McpServerConfig>,
    #[serde(default)]
    a2a_agents: BTreeMap<String, crate::a2a_client::A2aAgentConfig>,
    #[serde(default)]
    cluster: ClusterSection,
    /// `[workload]`: read by `warden loadtest --config` (`crate::loadtest::workload`), ignored by
    /// `warden run` and `warden serve`.
    #[serde(default)]
    #[allow(dead_code)]
    workload: Option<serde::de::IgnoredAny>,
}

impl TeamDoc {
    pub(super) fn split(self) -> TeamFile {
        let TeamDoc {
            safety,
            execution,
            delegation,
            tools,
            mailbox,
            supervisor,
            journal,
            npc,
            memory,
            permissions,
            providers,
            agents,
            api,
            telemetry,
            mcp_servers,
            a2a_agents,
            cluster,
            workload: _,
        } = self;
        TeamFile {
            config: WardenConfig {
                safety,
                execution,
                delegation,
                tools,
                mailbox,
                supervisor,
                journal,
                npc,
                memory,
                permissions,
            },
            providers,
            agents,
            api,
            telemetry,
            mcp_servers,
            a2a_agents,
            cluster,
            limiters: Arc::default(),
        }
    }
}

/// Checks a configuration or team file as `warden config check` does: a file with `[providers.*]`
/// or `[[agents]]` is a team file and is checked as `warden run` and `warden serve` check it
/// ([`TeamFile::validate`]); a file with neither is checked as configuration only.
///
/// # Errors
///
/// The first problem found, as [`TeamFile::from_toml`] reports it: [`TeamError::Config`] for
/// syntax, unknown keys, types and configuration ranges, [`TeamError::ProviderValue`] for a
/// provider's retry keys, [`TeamError::Api`] for `[api]`, and (team files only)
/// [`TeamError::Invalid`] for the team itself.
///
/// # Examples
///
/// ```
/// use warden::team::{check, Checked};
///
/// assert_eq!(check("[execution]\nmax_iterations_per_tick = 3\n")?, Checked::ConfigOnly);
///
/// let team = r#"
/// [providers.canned]
/// kind = "scripted"
/// replies = ["hello"]
///
/// [[agents]]
/// key = "innkeeper"
/// provider = "canned"
/// "#;
/// assert_eq!(check(team)?, Checked::Team { agents: 1 });
///
/// // A team file without agents is refused, naming the key.
/// let err = check("[providers.canned]\nkind = \"scripted\"\n").unwrap_err();
/// assert!(err.to_string().starts_with("invalid value for `agents`"));
/// # Ok::<(), warden::team::TeamError>(())
/// ```
pub fn check(text: &str) -> Result<Checked, TeamError> {
    let file = TeamFile::parse(text)?;
    if file.providers.is_empty() && file.agents.is_empty() {
        file.validate_mcp_servers()?;
        return Ok(Checked::ConfigOnly);
    }
    file.validate().map_err(|e| place(text, e))?;
    Ok(Checked::Team {
        agents: file.agents.len(),
    })
}

/// `error` with the line of the file it is about, where that can be told: an agent's `tools`
/// entry (the line of the quoted entry inside that agent's `[[agents]]` table).
pub(super) fn place(text: &str, error: TeamError) -> TeamError {
    let TeamError::Invalid { key, value, .. } = &error else {
        return error;
    };
    let Some(at) = key
        .strip_prefix("agents[")
        .and_then(|k| k.split_once("].tools["))
        .and_then(|(at, _)| at.parse::<usize>().ok())
    else {
        return error;
    };
    // The at-th `[[agents]]` header, then the entry as written after it.
    let mut offset = 0;
    for (n, (start, _)) in text.match_indices("[[agents]]").enumerate() {
        offset = start;
        if n == at {
            break;
        }
    }
    let Some(found) = text[offset..].find(value.as_str()) else {
        return error;
    };
    let line = text[..offset + found].matches('\n').count() + 1;
    TeamError::Located {
        line,
        error: Box::new(error),
    }
}
