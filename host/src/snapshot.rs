//! Snapshot & filter: what one agent sees, and which candidates survive.
//!
//! Owns [`ExecutableAgentSnapshot`], an immutable view built from the config
//! and a loaded [`Catalog`]: the agent's visible set, its policy, its
//! narrowing and the host's grants. A reload builds a new snapshot; nobody
//! mutates one. The availability & capability filter ([`ExecutableAgentSnapshot::candidate`])
//! removes candidates that are not visible, not installed, ambiguous,
//! unhealthy, or declare authority the host does not grant — each with a reason.
//!
//! Architecture invariant: the filter can only remove. Its output, a
//! [`Candidate`], is not permission: only the gate turns a candidate into an
//! executable call, and only on Allow.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use toolgate_sdk::{DeclaredCapabilities, ToolDescriptor};

use crate::authority::credentials::CredentialSpec;
use crate::authority::destination::Destination;
use crate::authority::narrowing::{Access, CapabilitySet, ToolCapabilityNarrowing};
use crate::catalog::{Availability, Catalog, InstalledTool};
use crate::config::{AgentConfig, Config, ConfigError, Grant, Restriction};
use crate::policy::{Policy, ToolRules};

/// Why a Tool is not a candidate for a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Removal {
    /// The agent may not see it.
    #[error("not visible to this agent")]
    NotVisible,
    /// No component implements it.
    #[error("not installed")]
    NotInstalled,
    /// Several components claim it. Shown to the model too: it counts them
    /// and leaves their host paths to `list --all` ([`Listing::files`]).
    #[error("ambiguous: claimed by {} components; the host's operator must remove all but one", .0.len())]
    Ambiguous(Vec<PathBuf>),
    /// Its component failed to load into the engine.
    #[error("unhealthy: {0}")]
    Unhealthy(String),
    /// It declares authority the host does not grant.
    #[error("not granted: {0}")]
    NotGranted(String),
}

impl Removal {
    /// Whether the model should see this as an unknown tool (it may not know
    /// the Tool exists at all).
    pub fn is_unknown_to_model(&self) -> bool {
        matches!(self, Removal::NotVisible | Removal::NotInstalled)
    }
}

/// A Tool that passed the filter: installed, visible, healthy, and whose
/// declared authority the host grants. Not permission.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The installed Tool.
    pub installed: InstalledTool,
    /// Declared ∩ granted: the most authority a call may hold.
    pub authority: CapabilitySet,
    /// The concrete grants behind `authority`.
    pub grant: EffectiveGrant,
    /// The agent's rules that can decide a call of this Tool, found on the
    /// first call (the gate then matches only their argument parts; a
    /// listing never looks for them).
    rules: std::sync::OnceLock<ToolRules>,
}

/// The concrete authority of one Tool: what the executor hands the sandbox.
#[derive(Debug, Clone, Default)]
pub struct EffectiveGrant {
    /// Host directories mounted at guest paths, with the effective access.
    pub mounts: Vec<Mount>,
    /// Outbound HTTP destinations (exact grants).
    pub hosts: Arc<[Destination]>,
    /// Credentials the Tool may ask for by reference.
    pub credentials: Arc<[Arc<CredentialSpec>]>,
    /// Environment variables (literal, non-secret values).
    pub env: Vec<(String, String)>,
    /// Every secret the config names — each credential's and the host's
    /// own ([`Config::watched`]) — not authority: what comes back to the
    /// guest is checked for all of them, granted or not.
    pub watched: Arc<[Arc<CredentialSpec>]>,
}

impl EffectiveGrant {
    /// Whether a call holding this grant can change nothing outside its own
    /// Tool state: no outbound host and no writable directory.
    pub fn has_no_effects(&self) -> bool {
        self.hosts.is_empty() && self.mounts.iter().all(|m| m.access == Access::Read)
    }
}

/// A host directory visible to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Path inside the guest.
    pub guest: String,
    /// Directory on the host.
    pub host: PathBuf,
    /// Declared ∩ granted access.
    pub access: Access,
    /// The directory the grant is bound to (checked when bound: at load, or its first use).
    pub bound: crate::sandbox::grant_dir::GrantDir,
}

impl Candidate {
    /// The descriptor.
    pub fn descriptor(&self) -> &ToolDescriptor {
        &self.installed.tool.metadata.descriptor
    }

    /// The rules of `policy` that can decide a call of this Tool.
    pub(crate) fn rules(&self, policy: &Policy) -> &ToolRules {
        self.rules.get_or_init(|| policy.rules_for(self.installed.tool.id()))
    }
}

/// One line of `list --all`.
#[derive(Debug, Clone)]
pub struct Listing {
    /// The Tool id.
    pub id: String,
    /// Its descriptor, when exactly one component declares it.
    pub descriptor: Option<ToolDescriptor>,
    /// The component file(s).
    pub files: Vec<PathBuf>,
    /// `None` when the model sees it; otherwise why not.
    pub removed: Option<Removal>,
}

/// An agent's immutable view of the installed Tools.
#[derive(Debug, Clone)]
pub struct ExecutableAgentSnapshot {
    agent: String,
    visible: GlobSet,
    policy: Arc<Policy>,
    narrowing: ToolCapabilityNarrowing,
    restrictions: Vec<Restriction>,
    /// Skills activated in the run, each limiting calls to its allowed-tools.
    skills: Vec<(String, Vec<String>, GlobSet)>,
    /// The count of Skill activations in the run's bucket of the runtime
    /// (`Runtime`'s marks) this view was last brought up to date with: a
    /// call finding the count moved looks in the journal first.
    skills_as_of: u64,
    grants: Arc<Vec<(globset::GlobMatcher, Grant)>>,
    credentials: Arc<BTreeMap<String, Arc<CredentialSpec>>>,
    /// Every secret the config names (credentials and the host's own,
    /// [`Config::watched`]), for the checks (built once).
    watched: Arc<[Arc<CredentialSpec>]>,
    catalog: Arc<Catalog>,
    /// The filter's result per installed Tool id, computed on its first call:
    /// it depends only on the fields above, so it holds until a derived view
    /// changes one of them (`restricted` starts afresh). Health is not in it:
    /// it is checked on every call. Only ids in the catalog are kept, so a
    /// client sending made-up ids cannot grow it.
    filtered: Arc<Filtered>,
}

/// The filter's results kept by a view, per installed Tool id.
/// Keys are installed Tool ids only (a client's made-up ids are not kept),
/// so a fast hasher does.
type Filtered = RwLock<HashMap<String, Result<Arc<Candidate>, Removal>, foldhash::fast::RandomState>>;

fn glob(pattern: &str) -> Result<globset::Glob, globset::Error> {
    GlobBuilder::new(pattern).literal_separator(false).build()
}

impl ExecutableAgentSnapshot {
    /// The snapshot of agent `agent` over `catalog`.
    pub fn build(config: &Config, agent: &str, catalog: Arc<Catalog>) -> Result<Self, ConfigError> {
        let a: &AgentConfig = config.agent(agent)?;
        let field = |field: String, message: String| ConfigError::Field {
            path: config.source.clone().unwrap_or_default(),
            field,
            message,
        };
        let mut visible = GlobSetBuilder::new();
        for (i, v) in a.visible.iter().enumerate() {
            visible.add(glob(v).map_err(|e| field(format!("agents.{agent}.visible[{i}]"), e.to_string()))?);
        }
        let visible = visible.build().map_err(|e| field(format!("agents.{agent}.visible"), e.to_string()))?;
        let policy =
            Policy::new(&a.rules, a.default).map_err(|e| field(format!("agents.{agent}.rules"), e.to_string()))?;
        // A primary-argument glob on a Tool without a primary argument never matches: refused here, where descriptors are known.
        policy
            .check_primary_arguments(|id| match catalog.get(id) {
                Some(Availability::Installed(t)) => Some(t.tool.metadata.descriptor.primary_argument.is_some()),
                _ => None,
            })
            .map_err(|e| field(format!("agents.{agent}.rules"), e.to_string()))?;
        let mut grants = Vec::new();
        for (i, g) in config.grants.iter().enumerate() {
            let m = glob(&g.tools).map_err(|e| field(format!("grants[{i}].tools"), e.to_string()))?.compile_matcher();
            grants.push((m, g.clone()));
        }
        Ok(ExecutableAgentSnapshot {
            agent: agent.to_owned(),
            visible,
            policy: Arc::new(policy),
            narrowing: a.narrowing,
            restrictions: vec![a.authority.clone()],
            skills: Vec::new(),
            skills_as_of: 0,
            grants: Arc::new(grants),
            credentials: Arc::new(config.credentials.clone()),
            watched: config.watched().into(),
            catalog,
            filtered: Arc::default(),
        })
    }

    /// The same view with a run's narrowing merged in: it can only narrow.
    pub fn narrowed(&self, run: ToolCapabilityNarrowing) -> Self {
        let mut s = self.clone();
        s.narrowing = s.narrowing.merge(run);
        s
    }

    /// The same view with a further restriction of concrete authority (a
    /// run's): intersected with every restriction already in force.
    pub fn restricted(&self, run: Restriction) -> Self {
        let mut s = self.clone();
        // The default restriction removes nothing: the filter's results still hold.
        if run != Restriction::default() {
            s.restrictions.push(run);
            s.filtered = Arc::default();
        }
        s
    }

    /// The restrictions a run put on this view, beyond the agent's own
    /// authority, in the order they were applied.
    pub fn run_restrictions(&self) -> &[Restriction] {
        self.restrictions.get(1..).unwrap_or_default()
    }

    /// The same view after Skill `skill_id` activated with `allowed` (tool
    /// ids or globs). Patterns that do not compile match nothing.
    /// The Skill itself stays callable (to read its resources).
    /// Applying the same Skill with the same list again changes nothing.
    pub fn with_skill(&self, skill_id: &str, allowed: &[String]) -> Self {
        if self.skills.iter().any(|(id, list, _)| id == skill_id && list == allowed) {
            return self.clone();
        }
        let mut set = GlobSetBuilder::new();
        if let Ok(g) = glob(&globset::escape(skill_id)) {
            set.add(g);
        }
        for p in allowed {
            if let Ok(g) = glob(p) {
                set.add(g);
            }
        }
        let mut s = self.clone();
        s.skills.push((skill_id.to_owned(), allowed.to_vec(), set.build().unwrap_or_else(|_| GlobSet::empty())));
        s
    }

    /// The count of Skill activations this view is up to date with (see
    /// `Runtime`'s marks); 0 for a view no run has used.
    pub fn skills_as_of(&self) -> u64 {
        self.skills_as_of
    }

    /// The same view, up to date with `mark` Skill activations.
    pub(crate) fn skills_checked_at(mut self, mark: u64) -> Self {
        self.skills_as_of = mark;
        self
    }

    /// The first active Skill whose allowed-tools exclude `tool_id`.
    pub fn skill_excluding(&self, tool_id: &str) -> Option<&str> {
        self.skills.iter().find(|(.., set)| !set.is_match(tool_id)).map(|(id, ..)| id.as_str())
    }

    /// The agent's name.
    pub fn agent(&self) -> &str {
        &self.agent
    }
    /// The agent's policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
    /// The effective narrowing (agent ∧ run).
    pub fn narrowing(&self) -> ToolCapabilityNarrowing {
        self.narrowing
    }
    /// The catalog this view was built over.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Whether the model may see `id`.
    pub fn is_visible(&self, id: &str) -> bool {
        self.visible.is_match(id)
    }

    /// The availability & capability filter for one Tool id. `unhealthy`
    /// reports a component the executor could not load.
    pub fn candidate(
        &self,
        id: &str,
        unhealthy: &dyn Fn(&crate::digest::Digest) -> Option<String>,
    ) -> Result<Arc<Candidate>, Removal> {
        healthy(self.filtered(id)?, unhealthy)
    }

    /// [`Self::candidate`] without keeping the result: a listing visits
    /// every Tool once and is not a call, so it leaves the per-call cache to
    /// the Tools that are called.
    fn listed(
        &self,
        id: &str,
        unhealthy: &dyn Fn(&crate::digest::Digest) -> Option<String>,
    ) -> Result<Arc<Candidate>, Removal> {
        healthy(self.kept(id).unwrap_or_else(|| self.filter(id))?, unhealthy)
    }

    /// The filter's result for `id`, if this view kept it.
    pub(crate) fn kept(&self, id: &str) -> Option<Result<Arc<Candidate>, Removal>> {
        self.filtered.read().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    /// The filter without health, kept per installed id.
    fn filtered(&self, id: &str) -> Result<Arc<Candidate>, Removal> {
        if let Some(kept) = self.kept(id) {
            return kept;
        }
        let result = self.filter(id);
        if self.catalog.get(id).is_some() {
            self.filtered.write().unwrap_or_else(|p| p.into_inner()).insert(id.to_owned(), result.clone());
        }
        result
    }

    fn filter(&self, id: &str) -> Result<Arc<Candidate>, Removal> {
        if !self.is_visible(id) {
            return Err(Removal::NotVisible);
        }
        let installed = match self.catalog.get(id) {
            None => return Err(Removal::NotInstalled),
            Some(Availability::Ambiguous(files)) => return Err(Removal::Ambiguous(files.clone())),
            Some(Availability::Installed(t)) => t,
        };
        let (mut authority, mut grant) = self.authority_for(id, &installed.tool.metadata.capabilities)?;
        for r in &self.restrictions {
            restrict(&mut authority, &mut grant, r);
        }
        Ok(Arc::new(Candidate { installed: installed.clone(), authority, grant, rules: Default::default() }))
    }

    /// Declared ∩ granted, or the first declared need the host does not grant.
    ///
    /// Directories and credentials: each declared one must be granted.
    /// Hosts: a Tool may declare alternatives (`http://127.0.0.1:*`,
    /// `https://*.tracker.example`); it gets the grants its declarations
    /// cover, and is removed only if it declares hosts and none is granted.
    fn authority_for(
        &self,
        id: &str,
        declared: &DeclaredCapabilities,
    ) -> Result<(CapabilitySet, EffectiveGrant), Removal> {
        let matching: Vec<&Grant> = self.grants.iter().filter(|(m, _)| m.is_match(id)).map(|(_, g)| g).collect();
        let mut granted = CapabilitySet::default();
        for g in &matching {
            for d in &g.directories {
                let a = access(d.access);
                let e = granted.directories.entry(d.path.clone()).or_insert(a);
                *e = (*e).max(a);
            }
            granted.credentials.extend(g.credentials.iter().cloned());
        }
        let mut wanted = CapabilitySet::default();
        for d in &declared.directories {
            wanted.directories.insert(d.path.clone(), access(d.access));
        }
        wanted.credentials.extend(declared.credentials.iter().cloned());

        // Hosts: grants (exact) covered by some declared pattern.
        let declared_hosts: Vec<Destination> =
            declared.hosts.iter().filter_map(|h| Destination::parse(h, true).ok()).collect();
        let mut hosts: Vec<Destination> = Vec::new();
        for g in &matching {
            for h in g.hosts.iter().filter_map(|h| Destination::parse(h, false).ok()) {
                if declared_hosts.iter().any(|d| d.covers(&h)) && !hosts.contains(&h) {
                    hosts.push(h);
                }
            }
        }
        if !declared_hosts.is_empty() && hosts.is_empty() {
            return Err(Removal::NotGranted(format!(
                "`{id}` declares hosts {}; add one of them (with an exact port) to `hosts` of a [[grants]] entry matching `{id}`",
                declared.hosts.join(", ")
            )));
        }
        // Every granted host is covered by a declaration, so it is in the intersection.
        granted.hosts.extend(hosts.iter().map(ToString::to_string));
        wanted.hosts.extend(hosts.iter().map(ToString::to_string));
        if !wanted.is_subset_of(&granted) {
            return Err(Removal::NotGranted(missing(id, &wanted, &granted)));
        }
        let authority = wanted.intersect(&granted);

        let mut grant = EffectiveGrant { hosts: hosts.into(), watched: self.watched.clone(), ..Default::default() };
        for g in &matching {
            for d in &g.directories {
                if let Some(a) = authority.directories.get(&d.path)
                    && !grant.mounts.iter().any(|m| m.guest == d.path)
                {
                    grant.mounts.push(Mount {
                        guest: d.path.clone(),
                        host: d.host.clone(),
                        access: access(d.access).meet(*a),
                        bound: d.bound.clone(),
                    });
                }
            }
            for (k, v) in &g.env {
                if !grant.env.iter().any(|(ek, _)| ek == k) {
                    grant.env.push((k.clone(), v.clone()));
                }
            }
        }
        // Config checks that every granted credential is defined.
        grant.credentials =
            authority.credentials.iter().filter_map(|name| self.credentials.get(name).cloned()).collect();
        Ok((authority, grant))
    }

    /// Descriptors the model sees: visible and passing the filter, sorted by id.
    pub fn list(&self, unhealthy: &dyn Fn(&crate::digest::Digest) -> Option<String>) -> Vec<ToolDescriptor> {
        self.catalog
            .tools()
            .filter_map(|(id, _)| self.listed(id, unhealthy).ok())
            .map(|c| c.descriptor().clone())
            .collect()
    }

    /// Every claimed id with why it is or is not shown (`list --all`).
    pub fn list_all(&self, unhealthy: &dyn Fn(&crate::digest::Digest) -> Option<String>) -> Vec<Listing> {
        self.catalog
            .tools()
            .map(|(id, a)| {
                let (descriptor, files) = match a {
                    Availability::Installed(t) => {
                        (Some(t.tool.metadata.descriptor.clone()), vec![t.component.path.clone()])
                    }
                    Availability::Ambiguous(files) => (None, files.clone()),
                };
                Listing { id: id.to_owned(), descriptor, files, removed: self.listed(id, unhealthy).err() }
            })
            .collect()
    }
}

/// `candidate`, unless the executor could not load its component.
fn healthy(
    candidate: Arc<Candidate>,
    unhealthy: &dyn Fn(&crate::digest::Digest) -> Option<String>,
) -> Result<Arc<Candidate>, Removal> {
    match unhealthy(&candidate.installed.component.digest) {
        Some(reason) => Err(Removal::Unhealthy(reason)),
        None => Ok(candidate),
    }
}

/// Narrow `authority` and `grant` by `r`: only removes.
fn restrict(authority: &mut CapabilitySet, grant: &mut EffectiveGrant, r: &Restriction) {
    if let Some(dirs) = &r.directories {
        grant.mounts.retain(|m| dirs.contains(&m.guest));
        authority.directories.retain(|k, _| dirs.contains(k));
    }
    if let Some(hosts) = &r.hosts {
        let allowed: Vec<Destination> = hosts.iter().filter_map(|h| Destination::parse(h, true).ok()).collect();
        grant.hosts = grant.hosts.iter().filter(|h| allowed.iter().any(|a| a.covers(h))).cloned().collect();
        authority.hosts = grant.hosts.iter().map(ToString::to_string).collect();
    }
    if let Some(creds) = &r.credentials {
        grant.credentials = grant.credentials.iter().filter(|c| creds.contains(&c.name)).cloned().collect();
        authority.credentials.retain(|c| creds.contains(c));
    }
}

fn access(a: toolgate_sdk::Access) -> Access {
    match a {
        toolgate_sdk::Access::Read => Access::Read,
        toolgate_sdk::Access::ReadWrite => Access::ReadWrite,
    }
}

fn missing(id: &str, wanted: &CapabilitySet, granted: &CapabilitySet) -> String {
    for (path, a) in &wanted.directories {
        if granted.directories.get(path).is_none_or(|g| g < a) {
            return format!(
                "`{id}` declares directory {path} ({a:?}); add it to a [[grants]] entry whose `tools` matches `{id}`"
            );
        }
    }
    if let Some(h) = wanted.hosts.difference(&granted.hosts).next() {
        return format!("`{id}` declares host {h}; add it to `hosts` of a [[grants]] entry matching `{id}`");
    }
    if let Some(c) = wanted.credentials.difference(&granted.credentials).next() {
        return format!(
            "`{id}` declares credential {c}; add it to `credentials` of a [[grants]] entry matching `{id}`"
        );
    }
    format!("`{id}` declares authority the host does not grant")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn made_up_tool_ids_are_not_kept() {
        let text = "[agents.default]\nvisible = [\"*\"]\nrules = [{ pattern = \"*\", behavior = \"allow\" }]\n";
        let config = Config::parse(text, Path::new("toolgate.toml"), Path::new(".")).unwrap();
        let snapshot = ExecutableAgentSnapshot::build(&config, "default", Arc::new(Catalog::default())).unwrap();
        for i in 0..1000 {
            assert_eq!(snapshot.candidate(&format!("made.up{i}"), &|_| None).unwrap_err(), Removal::NotInstalled);
        }
        assert_eq!(snapshot.filtered.read().unwrap().len(), 0, "a client's made-up ids grew the filter's memory");
    }
}
