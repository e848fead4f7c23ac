//! Config: the host's `toolgate.toml`.
//!
//! Owns parsing and checking the configuration file: plugin directory, store
//! and cache paths, limits, capability grants and agents (visible tools,
//! permission rules, default, narrowing). Unknown keys are errors; every error
//! names the file and the field. Relative paths resolve against the config
//! file's directory.
//!
//! Architecture invariant: configuration is data. Nothing here grants
//! authority by itself; grants only bound what a Tool may receive.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::narrowing::ToolCapabilityNarrowing;
use crate::policy::{Behavior, RuleSpec};

/// Config errors. Each says which file and field, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config {}: {source}; pass `--config FILE` or create toolgate.toml", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the key and line.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid config {}: field `{field}`: {message}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// Dotted path of the field.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// Resource limits for one call. Every value has a safe default.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Linear memory a call may use, MiB.
    pub memory_mib: u64,
    /// Wall-clock deadline of one call (CPU included), milliseconds.
    pub timeout_ms: u64,
    /// Largest Tool output, KiB.
    pub output_kib: u64,
    /// Captured stdout, stderr and log per call, KiB each; the rest is dropped.
    pub capture_kib: u64,
    /// How long a confirmation ticket stays valid, seconds.
    pub ticket_ttl_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { memory_mib: 64, timeout_ms: 10_000, output_kib: 1024, capture_kib: 64, ticket_ttl_secs: 86_400 }
    }
}

/// A directory the host grants, mapped to the guest path a Tool declares.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DirectoryGrant {
    /// Guest path, as the Tool declares it (e.g. `/data`).
    pub path: String,
    /// Host directory behind it.
    pub host: PathBuf,
    /// `read` or `read-write`.
    pub access: toolgate_sdk::Access,
}

/// Authority the host grants to the Tools whose id matches `tools`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Tool id or glob (`files.*`).
    pub tools: String,
    /// Directories.
    #[serde(default)]
    pub directories: Vec<DirectoryGrant>,
    /// Outbound HTTP destinations, `scheme://host:port`.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Credential names.
    #[serde(default)]
    pub credentials: Vec<String>,
}

/// One agent's view and policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Tool ids or globs the model may see. Default: none.
    #[serde(default)]
    pub visible: Vec<String>,
    /// Permission rules.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// Behaviour when no rule matches. Default: deny.
    #[serde(default = "deny")]
    pub default: Behavior,
    /// `configured` (default) or `deny-all`.
    #[serde(default = "configured")]
    pub narrowing: ToolCapabilityNarrowing,
}

fn deny() -> Behavior {
    Behavior::Deny
}
fn configured() -> ToolCapabilityNarrowing {
    ToolCapabilityNarrowing::Configured
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    plugins: Option<PathBuf>,
    store: Option<PathBuf>,
    cache: Option<PathBuf>,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    grants: Vec<Grant>,
    #[serde(default)]
    agents: BTreeMap<String, AgentConfig>,
}

/// A checked configuration with absolute paths.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, if any.
    pub source: Option<PathBuf>,
    /// Plugin directory.
    pub plugins: PathBuf,
    /// SQLite journal file.
    pub store: PathBuf,
    /// Compiled-component cache directory.
    pub cache: PathBuf,
    /// Per-call limits.
    pub limits: Limits,
    /// Capability grants.
    pub grants: Vec<Grant>,
    /// Agents by name.
    pub agents: BTreeMap<String, AgentConfig>,
}

impl Config {
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, path, &base)
    }

    /// Parse `text` as if read from `path`, resolving relative paths against `base`.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let field = |field: &str, message: String| ConfigError::Field {
            path: path.to_owned(),
            field: field.to_owned(),
            message,
        };
        let l = &raw.limits;
        for (name, value, max) in [
            ("limits.memory_mib", l.memory_mib, 4096),
            ("limits.timeout_ms", l.timeout_ms, 3_600_000),
            ("limits.output_kib", l.output_kib, 64 * 1024),
            ("limits.capture_kib", l.capture_kib, 64 * 1024),
            ("limits.ticket_ttl_secs", l.ticket_ttl_secs, 365 * 86_400),
        ] {
            if value == 0 || value > max {
                return Err(field(name, format!("{value} is out of range; use 1 to {max}")));
            }
        }
        for (i, g) in raw.grants.iter().enumerate() {
            globset::Glob::new(&g.tools)
                .map_err(|e| field(&format!("grants[{i}].tools"), format!("{e}")))?;
            for (j, d) in g.directories.iter().enumerate() {
                if !d.path.starts_with('/') || d.path.split('/').any(|c| c == "..") {
                    return Err(field(
                        &format!("grants[{i}].directories[{j}].path"),
                        "must be an absolute guest path without `..`".into(),
                    ));
                }
            }
        }
        for (name, a) in &raw.agents {
            for (i, v) in a.visible.iter().enumerate() {
                globset::Glob::new(v)
                    .map_err(|e| field(&format!("agents.{name}.visible[{i}]"), format!("{e}")))?;
            }
            crate::policy::Policy::new(&a.rules, a.default)
                .map_err(|e| field(&format!("agents.{name}.rules"), e.to_string()))?;
        }
        let abs = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let mut grants = raw.grants;
        for g in &mut grants {
            for d in &mut g.directories {
                d.host = abs(std::mem::take(&mut d.host));
            }
        }
        Ok(Config {
            source: Some(path.to_owned()),
            plugins: abs(raw.plugins.unwrap_or_else(|| "plugins".into())),
            store: abs(raw.store.unwrap_or_else(|| ".toolgate/journal.db".into())),
            cache: abs(raw.cache.unwrap_or_else(|| ".toolgate/cache".into())),
            limits: raw.limits,
            grants,
            agents: raw.agents,
        })
    }

    /// The agent named `name`; the error lists the configured ones.
    pub fn agent(&self, name: &str) -> Result<&AgentConfig, ConfigError> {
        self.agents.get(name).ok_or_else(|| ConfigError::Field {
            path: self.source.clone().unwrap_or_default(),
            field: format!("agents.{name}"),
            message: format!(
                "no such agent; configured: {}",
                if self.agents.is_empty() {
                    "none (add an [agents.NAME] table)".to_owned()
                } else {
                    self.agents.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ),
        })
    }
}
