//! `[permissions]`: the permission gate's policy (design 003: "a JIT operator ask for tier-2/3 ops …
//! the same three-state gate (allow / deny / ask)"), and the record of what it decided.
//!
//! Plain data and pure functions: [`PermissionPolicy::rule_for`] says which verdict a tool call gets
//! and which config key gave it. Asking an operator is `warden_actors::safety::PermissionGate`'s.
//!
//! ```toml
//! [permissions]
//! dangerous = "ask"          # the tier defaults: safe_chain, terminal, dangerous
//! mode = "interactive"       # interactive | auto_extend | unattended, as safety.on_limit.mode
//!
//! [[permissions.rules]]      # first matching rule wins, before the tier defaults
//! tool = "fs__write_file"    # a tool name or a glob (`*`, `?`)
//! arg = "/path"              # a JSON pointer into the arguments …
//! glob = "notes/*"           # … whose value must match this glob (or `regex`)
//! verdict = "allow"
//! ```
//!
//! # Invariants
//! * A rule with `arg` has exactly one of `glob` and `regex`; one without `arg` has neither; every
//!   regex compiles (checked when the file is read, with the rule's line).
//! * A rule whose `arg` is missing from the arguments does not match (the next rule decides).
//! * Every ruling names the key that decided it ([`Ruling::key`]), so a refusal can say what to
//!   change.

use crate::{AnsweredBy, OnLimitMode, ToolCategory};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What the gate does with a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionVerdict {
    /// It runs.
    Allow,
    /// It is refused; the model gets a tool error saying so and why.
    Deny,
    /// An operator is asked (by `permissions.mode`); only a yes runs it.
    Ask,
}

impl PermissionVerdict {
    /// The config spelling (`allow`, `deny`, `ask`).
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionVerdict::Allow => "allow",
            PermissionVerdict::Deny => "deny",
            PermissionVerdict::Ask => "ask",
        }
    }
}

impl fmt::Display for PermissionVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a rule matches an argument's value.
#[derive(Debug, Clone)]
enum ArgMatch {
    Glob(String),
    Regex(regex::Regex),
}

/// One `[[permissions.rules]]` entry: which calls it matches and the verdict it gives them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "RuleText", into = "RuleText")]
pub struct PermissionRule {
    tool: String,
    arg: Option<(String, ArgMatch)>,
    verdict: PermissionVerdict,
}

impl PartialEq for PermissionRule {
    fn eq(&self, other: &Self) -> bool {
        RuleText::from(self.clone()) == RuleText::from(other.clone())
    }
}

/// A rule as the file writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleText {
    tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    glob: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<String>,
    verdict: PermissionVerdict,
}

impl From<PermissionRule> for RuleText {
    fn from(rule: PermissionRule) -> Self {
        let (arg, glob, regex) = match rule.arg {
            None => (None, None, None),
            Some((arg, ArgMatch::Glob(g))) => (Some(arg), Some(g), None),
            Some((arg, ArgMatch::Regex(r))) => (Some(arg), None, Some(r.as_str().to_owned())),
        };
        RuleText {
            tool: rule.tool,
            arg,
            glob,
            regex,
            verdict: rule.verdict,
        }
    }
}

/// Why a `[[permissions.rules]]` entry was refused (reported with its line by the TOML parser).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for `{key}`: {value} (allowed: {allowed})")]
pub struct RuleError {
    /// The rule's key: `tool`, `arg`, `glob` or `regex`.
    pub key: &'static str,
    /// The value as written (or `none`).
    pub value: String,
    /// What is allowed.
    pub allowed: &'static str,
}

impl TryFrom<RuleText> for PermissionRule {
    type Error = RuleError;
    fn try_from(text: RuleText) -> Result<Self, RuleError> {
        if text.tool.trim().is_empty() {
            return Err(RuleError {
                key: "tool",
                value: format!("{:?}", text.tool),
                allowed: "a tool name as the model sees it, or a glob of them (`*`, `?`)",
            });
        }
        let arg = match (text.arg, text.glob, text.regex) {
            (None, None, None) => None,
            (None, Some(g), _) | (None, None, Some(g)) => return Err(RuleError {
                key: "arg",
                value: format!("none (with the pattern {g:?})"),
                allowed:
                    "a JSON pointer such as \"/path\" naming the argument the glob or regex matches",
            }),
            (Some(arg), _, _) if !arg.starts_with('/') => {
                return Err(RuleError {
                    key: "arg",
                    value: format!("{arg:?}"),
                    allowed:
                        "a JSON pointer starting with `/`, such as \"/path\" or \"/options/mode\"",
                })
            }
            (Some(arg), None, None) => {
                return Err(RuleError {
                    key: "glob",
                    value: format!("none (with arg {arg:?})"),
                    allowed: "exactly one of `glob` and `regex` with `arg`",
                })
            }
            (Some(arg), Some(_), Some(_)) => {
                return Err(RuleError {
                    key: "regex",
                    value: format!("set with `glob` too (arg {arg:?})"),
                    allowed: "exactly one of `glob` and `regex` with `arg`",
                })
            }
            (Some(arg), Some(g), None) => Some((arg, ArgMatch::Glob(g))),
            (Some(arg), None, Some(r)) => match regex::Regex::new(&r) {
                Ok(re) => Some((arg, ArgMatch::Regex(re))),
                Err(e) => {
                    let why = e.to_string();
                    let why = why.lines().last().unwrap_or_default().trim();
                    return Err(RuleError {
                        key: "regex",
                        value: format!("{r:?} ({why})"),
                        allowed: "a regular expression in the syntax of the Rust `regex` crate",
                    });
                }
            },
        };
        Ok(PermissionRule {
            tool: text.tool,
            arg,
            verdict: text.verdict,
        })
    }
}

impl PermissionRule {
    /// A rule for `tool` (a name or a glob) alone.
    pub fn tool(tool: impl Into<String>, verdict: PermissionVerdict) -> Self {
        PermissionRule {
            tool: tool.into(),
            arg: None,
            verdict,
        }
    }

    /// A rule for `tool` whose argument at the JSON pointer `arg` matches the glob `glob`.
    ///
    /// # Errors
    /// [`RuleError`] when `arg` is not a JSON pointer (`/…`).
    pub fn arg_glob(
        tool: impl Into<String>,
        arg: impl Into<String>,
        glob: impl Into<String>,
        verdict: PermissionVerdict,
    ) -> Result<Self, RuleError> {
        PermissionRule::try_from(RuleText {
            tool: tool.into(),
            arg: Some(arg.into()),
            glob: Some(glob.into()),
            regex: None,
            verdict,
        })
    }

    /// A rule for `tool` whose argument at the JSON pointer `arg` matches `regex` (searched:
    /// anchor it with `^…$` to match the whole value).
    ///
    /// # Errors
    /// [`RuleError`] when `arg` is not a JSON pointer or `regex` does not compile.
    pub fn arg_regex(
        tool: impl Into<String>,
        arg: impl Into<String>,
        regex: impl Into<String>,
        verdict: PermissionVerdict,
    ) -> Result<Self, RuleError> {
        PermissionRule::try_from(RuleText {
            tool: tool.into(),
            arg: Some(arg.into()),
            glob: None,
            regex: Some(regex.into()),
            verdict,
        })
    }

    /// The verdict it gives.
    pub fn verdict(&self) -> PermissionVerdict {
        self.verdict
    }

    /// Whether it applies to every call of `tool` whatever the arguments.
    fn matches_tool(&self, tool: &str) -> bool {
        glob_match(&self.tool, tool)
    }

    /// Whether it matches this call.
    pub fn matches(&self, tool: &str, args: &serde_json::Value) -> bool {
        if !self.matches_tool(tool) {
            return false;
        }
        let Some((pointer, how)) = &self.arg else {
            return true;
        };
        let Some(value) = args.pointer(pointer) else {
            return false;
        };
        let text = match value {
            serde_json::Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
            other => std::borrow::Cow::Owned(other.to_string()),
        };
        match how {
            ArgMatch::Glob(g) => glob_match(g, &text),
            ArgMatch::Regex(r) => r.is_match(&text),
        }
    }

    /// The rule in words: `allow fs__* when /path matches glob "notes/*"`.
    pub fn describe(&self) -> String {
        match &self.arg {
            None => format!("{} {}", self.verdict, self.tool),
            Some((arg, ArgMatch::Glob(g))) => {
                format!(
                    "{} {} when {arg} matches glob {g:?}",
                    self.verdict, self.tool
                )
            }
            Some((arg, ArgMatch::Regex(r))) => format!(
                "{} {} when {arg} matches regex {:?}",
                self.verdict,
                self.tool,
                r.as_str()
            ),
        }
    }
}

/// Whether `text` matches the glob `pattern` as a whole: `*` matches any run of characters (`/`
/// included), `?` any one character, everything else itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // The classic greedy match with one backtrack point (the last `*`): linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// `[permissions]`: the gate every tool call passes before it runs (docs/permissions.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PermissionsConfig {
    /// The verdict for SAFE_CHAIN tools no rule matches. Default `allow`.
    pub safe_chain: PermissionVerdict,
    /// The verdict for TERMINAL tools no rule matches. Default `allow`.
    pub terminal: PermissionVerdict,
    /// The verdict for DANGEROUS tools no rule matches. Default `allow` (see
    /// docs/design-decisions.md: `ask` would refuse every DANGEROUS tool of a run with no operator).
    pub dangerous: PermissionVerdict,
    /// What an `ask` does: `interactive` asks an operator; `auto_extend` asks too, and remembers a
    /// yes for that tool and those arguments (`remember_minutes`); `unattended` refuses without
    /// asking. Without an intervention bus every ask is refused. Default `interactive`.
    pub mode: OnLimitMode,
    /// `auto_extend` only: how long a yes is remembered, in minutes; 0 = until the task ends.
    /// 0 to 10080. Default 0.
    pub remember_minutes: u32,
    /// How long an ask waits for an answer before refusing. 0 = forever. Default 0.
    pub ask_timeout_seconds: f64,
    /// Rules by tool name and arguments, tried in order before the tier defaults; the first match
    /// wins. Default none.
    pub rules: Vec<PermissionRule>,
}

impl Default for PermissionsConfig {
    fn default() -> Self {
        PermissionsConfig {
            safe_chain: PermissionVerdict::Allow,
            terminal: PermissionVerdict::Allow,
            dangerous: PermissionVerdict::Allow,
            mode: OnLimitMode::Interactive,
            remember_minutes: 0,
            ask_timeout_seconds: 0.0,
            rules: Vec::new(),
        }
    }
}

impl PermissionsConfig {
    /// The verdict of tier `category` (no rule matched).
    pub fn tier(&self, category: ToolCategory) -> PermissionVerdict {
        match category {
            ToolCategory::SafeChain => self.safe_chain,
            ToolCategory::Terminal => self.terminal,
            ToolCategory::Dangerous => self.dangerous,
        }
    }

    /// Checks the ranges (`remember_minutes`, `ask_timeout_seconds`).
    ///
    /// # Errors
    /// The first value out of range: `(key under permissions., value, allowed)`.
    pub fn check(&self) -> Result<(), (&'static str, String, &'static str)> {
        if self.remember_minutes > 10_080 {
            return Err((
                "remember_minutes",
                self.remember_minutes.to_string(),
                "0 (until the task ends) to 10080 (a week)",
            ));
        }
        let t = self.ask_timeout_seconds;
        if !(0.0..=31_536_000.0).contains(&t) {
            return Err((
                "ask_timeout_seconds",
                t.to_string(),
                "a number of seconds from 0 to 31536000",
            ));
        }
        Ok(())
    }
}

/// An agent's own `permissions` keys in a team file (`[[agents]] permissions = { dangerous =
/// "deny" }`): each key set replaces the team's; its `rules` are tried before the team's.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PermissionsOverride {
    /// Replaces `permissions.safe_chain`.
    pub safe_chain: Option<PermissionVerdict>,
    /// Replaces `permissions.terminal`.
    pub terminal: Option<PermissionVerdict>,
    /// Replaces `permissions.dangerous`.
    pub dangerous: Option<PermissionVerdict>,
    /// Replaces `permissions.mode`.
    pub mode: Option<OnLimitMode>,
    /// Replaces `permissions.remember_minutes`.
    pub remember_minutes: Option<u32>,
    /// Replaces `permissions.ask_timeout_seconds`.
    pub ask_timeout_seconds: Option<f64>,
    /// Tried before the team's rules.
    pub rules: Vec<PermissionRule>,
}

/// A rule and the key it is written under (`permissions.rules[2]`, `agents[0].permissions.rules[0]`).
#[derive(Debug, Clone, PartialEq)]
struct KeyedRule {
    key: String,
    rule: PermissionRule,
}

/// The policy of one agent (or a team): the config, its rules named by their keys.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionPolicy {
    config: PermissionsConfig,
    rules: Vec<KeyedRule>,
    /// Where each tier default and setting is written: `permissions` or `agents[0].permissions`.
    tier_keys: [String; 3],
    mode_key: String,
}

/// Which verdict a call gets and the key that gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruling {
    /// The verdict.
    pub verdict: PermissionVerdict,
    /// The key that gave it: a rule (`permissions.rules[0]`) or a tier default
    /// (`permissions.dangerous`).
    pub key: String,
}

impl Default for PermissionPolicy {
    fn default() -> Self {
        PermissionPolicy::team(&PermissionsConfig::default())
    }
}

impl PermissionPolicy {
    /// The team's policy (`[permissions]`).
    pub fn team(config: &PermissionsConfig) -> Self {
        PermissionPolicy {
            rules: config
                .rules
                .iter()
                .enumerate()
                .map(|(i, rule)| KeyedRule {
                    key: format!("permissions.rules[{i}]"),
                    rule: rule.clone(),
                })
                .collect(),
            config: config.clone(),
            tier_keys: ["safe_chain", "terminal", "dangerous"].map(|t| format!("permissions.{t}")),
            mode_key: "permissions.mode".into(),
        }
    }

    /// An agent's policy: the team's with `own` over it; `prefix` is where `own` is written
    /// (`agents[0].permissions`), for the keys rulings name.
    pub fn agent(team: &PermissionsConfig, own: &PermissionsOverride, prefix: &str) -> Self {
        let mut policy = PermissionPolicy::team(team);
        let mine: Vec<KeyedRule> = own
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| KeyedRule {
                key: format!("{prefix}.rules[{i}]"),
                rule: rule.clone(),
            })
            .collect();
        policy.rules.splice(0..0, mine);
        let c = &mut policy.config;
        let tiers = [own.safe_chain, own.terminal, own.dangerous];
        for (i, (set, slot)) in tiers
            .into_iter()
            .zip([&mut c.safe_chain, &mut c.terminal, &mut c.dangerous])
            .enumerate()
        {
            if let Some(v) = set {
                *slot = v;
                let name = ["safe_chain", "terminal", "dangerous"][i];
                policy.tier_keys[i] = format!("{prefix}.{name}");
            }
        }
        if let Some(mode) = own.mode {
            c.mode = mode;
            policy.mode_key = format!("{prefix}.mode");
        }
        if let Some(m) = own.remember_minutes {
            c.remember_minutes = m;
        }
        if let Some(t) = own.ask_timeout_seconds {
            c.ask_timeout_seconds = t;
        }
        c.rules = policy.rules.iter().map(|k| k.rule.clone()).collect();
        policy
    }

    /// The merged settings (mode, timeout, remember, tiers; `rules` in the order tried).
    pub fn config(&self) -> &PermissionsConfig {
        &self.config
    }

    /// The key that sets the mode (`permissions.mode` or an agent's own).
    pub fn mode_key(&self) -> &str {
        &self.mode_key
    }

    /// The verdict for a call of `tool` (of tier `category`) with `args`: the first rule that
    /// matches, else the tier default.
    pub fn rule_for(&self, tool: &str, category: ToolCategory, args: &serde_json::Value) -> Ruling {
        for keyed in &self.rules {
            if keyed.rule.matches(tool, args) {
                return Ruling {
                    verdict: keyed.rule.verdict,
                    key: keyed.key.clone(),
                };
            }
        }
        self.tier_ruling(category)
    }

    fn tier_ruling(&self, category: ToolCategory) -> Ruling {
        let i = match category {
            ToolCategory::SafeChain => 0,
            ToolCategory::Terminal => 1,
            ToolCategory::Dangerous => 2,
        };
        Ruling {
            verdict: self.config.tier(category),
            key: self.tier_keys[i].clone(),
        }
    }

    /// What `warden config check` prints for one tool: the rules that may apply to it, in the
    /// order tried, ending at the first that applies whatever the arguments (or the tier default):
    /// `allow when /path matches glob "notes/*" (permissions.rules[0]); else ask (permissions.dangerous)`.
    pub fn describe(&self, tool: &str, category: ToolCategory) -> String {
        let mut parts = Vec::new();
        for keyed in &self.rules {
            if !keyed.rule.matches_tool(tool) {
                continue;
            }
            match &keyed.rule.arg {
                None => {
                    parts.push(format!("{} ({})", keyed.rule.verdict, keyed.key));
                    return parts.join("; else ");
                }
                Some(_) => parts.push(format!(
                    "{} ({})",
                    keyed
                        .rule
                        .describe()
                        .replacen(&format!(" {}", keyed.rule.tool), "", 1),
                    keyed.key
                )),
            }
        }
        let tier = self.tier_ruling(category);
        parts.push(format!("{} ({})", tier.verdict, tier.key));
        parts.join("; else ")
    }
}

/// Why the permission gate decided as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionReason {
    /// The verdict was `allow`.
    Allowed,
    /// The verdict was `deny`.
    Denied,
    /// `ask`, `mode = unattended`: refused without asking.
    Unattended,
    /// `ask`, but no intervention bus is wired (a headless run): refused.
    NoBus,
    /// `ask`, the operator said yes.
    UserApproved,
    /// `ask`, `mode = auto_extend`: an earlier yes for this tool and these arguments still holds.
    Remembered,
    /// `ask`, the operator said no (or anything but yes), or the bus failed.
    UserRefused,
    /// `ask`, `ask_timeout_seconds` passed without an answer.
    AskTimeout,
}

impl PermissionReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionReason::Allowed => "allowed",
            PermissionReason::Denied => "denied",
            PermissionReason::Unattended => "unattended",
            PermissionReason::NoBus => "no_bus",
            PermissionReason::UserApproved => "user_approved",
            PermissionReason::Remembered => "remembered",
            PermissionReason::UserRefused => "user_refused",
            PermissionReason::AskTimeout => "ask_timeout",
        }
    }
}

impl fmt::Display for PermissionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the permission gate decided for one call (journaled as `permission_decided`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionDecision {
    /// `true`: the call runs.
    pub allow: bool,
    /// The verdict the policy gave, and the key that gave it.
    pub ruling: Ruling,
    /// Why it was allowed or refused.
    pub reason: PermissionReason,
    /// The intervention id, when an operator was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<u64>,
    /// Who answered, and their note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<AnsweredBy>,
}

/// What an operator is asked about a tool call (the `permission` of an
/// [`Intervention`](crate::Intervention)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionAsk {
    /// The model's id of the call.
    pub call_id: String,
    /// The tool, as the model calls it.
    pub tool: String,
    /// Its tier.
    pub category: ToolCategory,
    /// The arguments the model gave.
    pub arguments: serde_json::Value,
    /// The key whose `ask` verdict asked (`permissions.dangerous`, `permissions.rules[0]`).
    pub rule: String,
    /// What the agent said with the call (the text of its message), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message: Option<String>,
}

/// The decision-enabling text a refused call gives the model (and the journal): which tool, which
/// key refused it, what to change.
pub fn permission_refusal(tool: &str, decision: &PermissionDecision, mode_key: &str) -> String {
    let key = &decision.ruling.key;
    let how = match decision.reason {
        PermissionReason::Denied => format!("`{key}` is \"deny\"; an operator may set it to \"ask\" or \"allow\""),
        PermissionReason::Unattended => format!(
            "`{key}` is \"ask\" and `{mode_key}` is \"unattended\" (never asks); an operator may set `{mode_key}` to \"interactive\" or `{key}` to \"allow\""
        ),
        PermissionReason::NoBus => format!(
            "`{key}` is \"ask\" but no operator is attached (no intervention bus: run it under `warden serve` or `warden run` on a terminal), or set `{key}` to \"allow\""
        ),
        PermissionReason::AskTimeout => format!(
            "`{key}` is \"ask\" and nobody answered within the ask timeout (`ask_timeout_seconds` under {})",
            mode_key.trim_end_matches(".mode")
        ),
        PermissionReason::UserRefused => {
            let by = decision
                .answered_by
                .as_ref()
                .map(|b| match &b.note {
                    Some(note) => format!(" by {} (\"{note}\")", b.operator),
                    None => format!(" by {}", b.operator),
                })
                .unwrap_or_default();
            format!("`{key}` is \"ask\" and the operator said no{by}")
        }
        PermissionReason::Allowed | PermissionReason::UserApproved | PermissionReason::Remembered => {
            format!("`{key}` allowed it")
        }
    };
    format!(
        "refused by the permission gate: tool `{tool}` was not run ({}): {how}. Do not retry it unless the situation changes; continue without it or say what you need.",
        decision.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globs_match_whole_values() {
        assert!(glob_match("notes/*", "notes/a.txt"));
        assert!(glob_match("notes/*", "notes/deep/a.txt"));
        assert!(!glob_match("notes/*", "etc/notes/a"));
        assert!(glob_match("fs__*", "fs__write_file"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "abbc"));
        assert!(glob_match("*", ""));
        assert!(glob_match("*a*b*", "xxaxxbxx"));
        assert!(!glob_match("*a*b*", "xxbxxaxx"));
        assert!(glob_match("écrire", "écrire"));
    }

    fn rule(text: &str) -> Result<PermissionRule, String> {
        #[derive(Deserialize)]
        struct W {
            r: PermissionRule,
        }
        crate::parse_toml::<W>(&format!("r = {text}\n"))
            .map(|w| w.r)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn rules_match_by_name_and_argument() {
        let r =
            rule(r#"{ tool = "fs__write*", arg = "/path", glob = "notes/*", verdict = "allow" }"#)
                .unwrap();
        assert!(r.matches("fs__write_file", &json!({"path": "notes/x"})));
        assert!(!r.matches("fs__write_file", &json!({"path": "src/x"})));
        assert!(
            !r.matches("fs__write_file", &json!({"other": "notes/x"})),
            "missing argument"
        );
        assert!(!r.matches("fs__read_file", &json!({"path": "notes/x"})));
        let r = rule(r#"{ tool = "t", arg = "/n", regex = "^[0-9]{1,2}$", verdict = "deny" }"#)
            .unwrap();
        assert!(
            r.matches("t", &json!({"n": 42})),
            "a number matches as its JSON text"
        );
        assert!(!r.matches("t", &json!({"n": 420})));
        assert_eq!(
            r.describe(),
            "deny t when /n matches regex \"^[0-9]{1,2}$\""
        );
    }

    #[test]
    fn bad_rules_are_refused_with_key_value_and_line() {
        assert_eq!(
            rule(r#"{ tool = "t", arg = "/p", regex = "(a", verdict = "deny" }"#).unwrap_err(),
            "invalid config: line 1, column 5: `r`: invalid value for `regex`: \"(a\" (error: unclosed group) (allowed: a regular expression in the syntax of the Rust `regex` crate)\n1 | r = { tool = \"t\", arg = \"/p\", regex = \"(a\", verdict = \"deny\" }\n  |     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
        );
        let e = rule(r#"{ tool = "t", arg = "p", glob = "*", verdict = "deny" }"#).unwrap_err();
        assert!(
            e.contains("invalid value for `arg`: \"p\" (allowed: a JSON pointer starting with `/`"),
            "{e}"
        );
        let e = rule(r#"{ tool = "t", glob = "*", verdict = "deny" }"#).unwrap_err();
        assert!(
            e.contains("invalid value for `arg`: none (with the pattern \"*\")"),
            "{e}"
        );
        let e = rule(r#"{ tool = "t", arg = "/p", verdict = "deny" }"#).unwrap_err();
        assert!(e.contains("invalid value for `glob`: none (with arg \"/p\") (allowed: exactly one of `glob` and `regex` with `arg`)"), "{e}");
        let e = rule(r#"{ tool = "t", arg = "/p", glob = "a", regex = "b", verdict = "deny" }"#)
            .unwrap_err();
        assert!(
            e.contains("invalid value for `regex`: set with `glob` too"),
            "{e}"
        );
        let e = rule(r#"{ tool = " ", verdict = "deny" }"#).unwrap_err();
        assert!(e.contains("invalid value for `tool`: \" \""), "{e}");
        let e = rule(r#"{ tool = "t", verdict = "maybe" }"#).unwrap_err();
        assert!(
            e.contains("unknown variant `maybe`, expected one of `allow`, `deny`, `ask`"),
            "{e}"
        );
        let e = rule(r#"{ tool = "t", verdict = "ask", when = 1 }"#).unwrap_err();
        assert!(e.contains("unknown field `when`"), "{e}");
    }

    #[test]
    fn the_first_matching_rule_wins_then_the_tier_default() {
        let team: PermissionsConfig = crate::parse_toml(
            r#"
dangerous = "ask"
[[rules]]
tool = "fs__write_file"
arg = "/path"
glob = "notes/*"
verdict = "allow"
[[rules]]
tool = "fs__*"
verdict = "deny"
"#,
        )
        .unwrap();
        let p = PermissionPolicy::team(&team);
        let d = ToolCategory::Dangerous;
        let ruling = |tool, args| p.rule_for(tool, d, &args);
        assert_eq!(
            ruling("fs__write_file", json!({"path": "notes/a"})),
            Ruling {
                verdict: PermissionVerdict::Allow,
                key: "permissions.rules[0]".into()
            }
        );
        assert_eq!(
            ruling("fs__write_file", json!({"path": "/etc/passwd"})),
            Ruling {
                verdict: PermissionVerdict::Deny,
                key: "permissions.rules[1]".into()
            }
        );
        assert_eq!(
            ruling("shell", json!({})),
            Ruling {
                verdict: PermissionVerdict::Ask,
                key: "permissions.dangerous".into()
            }
        );
        assert_eq!(
            p.rule_for("look", ToolCategory::SafeChain, &json!({})),
            Ruling {
                verdict: PermissionVerdict::Allow,
                key: "permissions.safe_chain".into()
            }
        );
        assert_eq!(
            p.describe("fs__write_file", d),
            "allow when /path matches glob \"notes/*\" (permissions.rules[0]); else deny (permissions.rules[1])"
        );
        assert_eq!(p.describe("shell", d), "ask (permissions.dangerous)");

        // An agent's own rules come first, its keys over the team's.
        let own: PermissionsOverride = crate::parse_toml(
            "dangerous = \"deny\"\nmode = \"unattended\"\n[[rules]]\ntool = \"fs__write_file\"\nverdict = \"ask\"\n",
        )
        .unwrap();
        let a = PermissionPolicy::agent(&team, &own, "agents[1].permissions");
        assert_eq!(
            a.rule_for("fs__write_file", d, &json!({"path": "notes/a"})),
            Ruling {
                verdict: PermissionVerdict::Ask,
                key: "agents[1].permissions.rules[0]".into()
            }
        );
        assert_eq!(
            a.rule_for("fs__read", d, &json!({})),
            Ruling {
                verdict: PermissionVerdict::Deny,
                key: "permissions.rules[1]".into()
            }
        );
        assert_eq!(
            a.rule_for("shell", d, &json!({})),
            Ruling {
                verdict: PermissionVerdict::Deny,
                key: "agents[1].permissions.dangerous".into()
            }
        );
        assert_eq!(a.config().mode, OnLimitMode::Unattended);
        assert_eq!(a.mode_key(), "agents[1].permissions.mode");
        assert_eq!(a.config().rules.len(), 3);
    }

    #[test]
    fn defaults_allow_and_round_trip() {
        let c = PermissionsConfig::default();
        for cat in [
            ToolCategory::SafeChain,
            ToolCategory::Terminal,
            ToolCategory::Dangerous,
        ] {
            assert_eq!(c.tier(cat), PermissionVerdict::Allow);
        }
        assert_eq!(
            (c.mode, c.remember_minutes, c.ask_timeout_seconds),
            (OnLimitMode::Interactive, 0, 0.0)
        );
        let r = rule(r#"{ tool = "t", arg = "/p", regex = "^a", verdict = "ask" }"#).unwrap();
        let with = PermissionsConfig {
            rules: vec![r],
            ..c
        };
        let text = toml::to_string(&with).unwrap();
        assert_eq!(crate::parse_toml::<PermissionsConfig>(&text).unwrap(), with);
    }

    #[test]
    fn refusals_say_which_tool_which_key_and_what_to_change() {
        let decision = |reason| PermissionDecision {
            allow: false,
            ruling: Ruling {
                verdict: PermissionVerdict::Ask,
                key: "permissions.dangerous".into(),
            },
            reason,
            asked: None,
            answered_by: None,
        };
        assert_eq!(
            permission_refusal("fs__rm", &decision(PermissionReason::NoBus), "permissions.mode"),
            "refused by the permission gate: tool `fs__rm` was not run (no_bus): `permissions.dangerous` is \"ask\" but no operator is attached (no intervention bus: run it under `warden serve` or `warden run` on a terminal), or set `permissions.dangerous` to \"allow\". Do not retry it unless the situation changes; continue without it or say what you need."
        );
        let mut no = decision(PermissionReason::UserRefused);
        no.answered_by = Some(AnsweredBy {
            operator: "api:admin".into(),
            note: Some("not today".into()),
        });
        assert!(permission_refusal("fs__rm", &no, "permissions.mode")
            .contains("`permissions.dangerous` is \"ask\" and the operator said no by api:admin (\"not today\")"));
        assert!(permission_refusal(
            "fs__rm",
            &decision(PermissionReason::AskTimeout),
            "permissions.mode"
        )
        .contains("(`ask_timeout_seconds` under permissions)"));
    }
}
