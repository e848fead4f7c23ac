//! Catalog: what is installed in a plugin directory.
//!
//! Owns loading every `*.wasm` file of a directory, its sha256 digest and its
//! checked descriptors, and availability: a Tool id claimed by exactly one
//! component is installed; an id claimed by two or more is ambiguous and none
//! of the claimants is used (never first-wins). A bad file is refused with its
//! reason and the other plugins still load.
//!
//! Architecture invariant: the catalog knows nothing of agents, visibility or
//! permission, and never compiles or instantiates a component.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod descriptor;
pub mod lockfile;
pub mod signing;

use crate::digest::Digest;
use descriptor::{CheckedTool, DescriptorError};
use lockfile::{LockError, Lockfile};
use signing::TrustedKeys;

/// Largest component file accepted.
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// One loaded component file.
#[derive(Debug)]
pub struct Component {
    /// Where it was loaded from.
    pub path: PathBuf,
    /// sha256 of the file's bytes as loaded.
    pub digest: Digest,
    /// Its Tools.
    pub tools: Vec<Arc<CheckedTool>>,
    /// Its `toolgate-pinned` section (empty when it has none), which the
    /// `pinned` import hands back to it at call time.
    pub pinned: Arc<[u8]>,
}

/// An installed Tool: its checked descriptor and the one component that implements it.
#[derive(Debug, Clone)]
pub struct InstalledTool {
    /// Descriptor, declared capabilities and argument validator.
    pub tool: Arc<CheckedTool>,
    /// The implementing component.
    pub component: Arc<Component>,
}

/// Availability of one Tool id.
#[derive(Debug, Clone)]
pub enum Availability {
    /// Exactly one component implements it.
    Installed(InstalledTool),
    /// Several components claim it; none is used.
    Ambiguous(Vec<PathBuf>),
}

/// A file that could not be loaded.
#[derive(Debug, Clone)]
pub struct Refused {
    /// The file.
    pub path: PathBuf,
    /// Why, and what to do.
    pub reason: String,
}

/// Errors that stop loading a directory as a whole.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The lockfile cannot be used.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The directory cannot be read.
    #[error("cannot read plugin directory {}: {source}; check `plugins` in the config", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
}

/// Everything installed in one plugin directory, as loaded at one moment.
#[derive(Debug, Default)]
pub struct Catalog {
    dir: PathBuf,
    components: Vec<Arc<Component>>,
    tools: BTreeMap<String, Availability>,
    refused: Vec<Refused>,
    /// Installed Skills with `allowed-tools`: id → the tools they allow.
    narrowing_skills: BTreeMap<String, Vec<String>>,
}

impl Catalog {
    /// Load every `*.wasm` file of `dir` (not recursive), in file-name order.
    pub fn load(dir: &Path) -> Result<Catalog, CatalogError> {
        Self::load_locked(dir, None)
    }

    /// Load `dir`; with `lock`, a file that is not pinned or whose digest
    /// differs is refused before its metadata is read.
    pub fn load_locked(dir: &Path, lock: Option<&Lockfile>) -> Result<Catalog, CatalogError> {
        Self::load_checked(dir, lock, &TrustedKeys::default())
    }

    /// [`Catalog::load_locked`], and with `keys`, a file without a valid
    /// signature by one of them is refused before its metadata is read.
    pub fn load_checked(dir: &Path, lock: Option<&Lockfile>, keys: &TrustedKeys) -> Result<Catalog, CatalogError> {
        Self::load_guarded(dir, lock, keys, &|_| Ok(()))
    }

    /// [`Catalog::load_checked`], each file first passed to `guard`, which
    /// refuses (with the reason) one a Tool could change — e.g.
    /// [`crate::sandbox::grant_dir::Writable::check_component`]: a file
    /// found through a directory granted read-write (the file, or a link on
    /// the way to it, may be a symlink out of the plugin directory), or with
    /// a second link. Nothing of a refused file is read.
    pub fn load_guarded(
        dir: &Path,
        lock: Option<&Lockfile>,
        keys: &TrustedKeys,
        guard: &dyn Fn(&Path) -> Result<(), String>,
    ) -> Result<Catalog, CatalogError> {
        let entries =
            std::fs::read_dir(dir).map_err(|source| CatalogError::Directory { path: dir.to_owned(), source })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
            .collect();
        paths.sort();
        let mut catalog = Catalog { dir: dir.to_owned(), ..Default::default() };
        for path in paths {
            let checked = |digest: &Digest| -> Result<(), String> {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if let Some(l) = lock {
                    l.check(&name, digest)?;
                }
                if !keys.is_empty() {
                    signing::verify(keys, &path, digest)?;
                }
                Ok(())
            };
            match guard(&path).and_then(|()| load_file_checked(&path, checked)) {
                Ok(c) => catalog.components.push(Arc::new(c)),
                Err(reason) => catalog.refused.push(Refused { path, reason }),
            }
        }
        catalog.index();
        Ok(catalog)
    }

    /// A catalog of already loaded components (tests, embedding hosts).
    pub fn from_components(components: Vec<Component>) -> Catalog {
        let mut catalog = Catalog { components: components.into_iter().map(Arc::new).collect(), ..Default::default() };
        catalog.index();
        catalog
    }

    fn index(&mut self) {
        let mut claims: BTreeMap<String, Vec<InstalledTool>> = BTreeMap::new();
        for c in &self.components {
            for t in &c.tools {
                claims
                    .entry(t.id().to_owned())
                    .or_default()
                    .push(InstalledTool { tool: t.clone(), component: c.clone() });
            }
        }
        // A run that activated a Skill is narrowed by it whenever its view
        // is rebuilt from this catalog. An id some claimant of which is a
        // narrowing Skill stays one when another plugin makes it ambiguous,
        // narrowed to nothing (no claimant's list is the Skill's any more):
        // dropping it would widen every run that activated it.
        let mut narrowing = BTreeMap::new();
        for (id, claimants) in &claims {
            let lists: Vec<&Vec<String>> =
                claimants.iter().filter_map(|c| c.tool.metadata.skill.as_ref()?.allowed_tools.as_ref()).collect();
            match (claimants.len(), lists.first()) {
                (1, Some(allowed)) => narrowing.insert(id.clone(), (*allowed).clone()),
                (_, Some(_)) => narrowing.insert(id.clone(), Vec::new()),
                (_, None) => None,
            };
        }
        self.narrowing_skills = narrowing;
        self.tools = claims
            .into_iter()
            .map(|(id, mut claimants)| {
                let a = if claimants.len() == 1 {
                    Availability::Installed(claimants.remove(0))
                } else {
                    Availability::Ambiguous(claimants.iter().map(|c| c.component.path.clone()).collect())
                };
                (id, a)
            })
            .collect();
    }

    /// Installed Skills whose `allowed-tools` narrow a run once activated.
    pub fn narrowing_skills(&self) -> &BTreeMap<String, Vec<String>> {
        &self.narrowing_skills
    }

    /// The plugin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Availability of `id`, if any component claims it.
    pub fn get(&self, id: &str) -> Option<&Availability> {
        self.tools.get(id)
    }
    /// Every claimed id with its availability, sorted by id.
    pub fn tools(&self) -> impl Iterator<Item = (&str, &Availability)> {
        self.tools.iter().map(|(k, v)| (k.as_str(), v))
    }
    /// Loaded components.
    pub fn components(&self) -> &[Arc<Component>] {
        &self.components
    }
    /// Refused files with reasons.
    pub fn refused(&self) -> &[Refused] {
        &self.refused
    }
}

/// Read one file: size bound, digest, metadata. The error is the reason.
pub fn load_file(path: &Path) -> Result<Component, String> {
    load_file_checked(path, |_| Ok(()))
}

/// [`load_file`], with `check` (lock, signature) run on the digest before
/// any metadata is read.
fn load_file_checked(path: &Path, check: impl Fn(&Digest) -> Result<(), String>) -> Result<Component, String> {
    let bytes = read_bounded(path)?;
    let digest = Digest::of(&bytes);
    check(&digest)?;
    let (tools, pinned) = descriptor::read_component(&bytes).map_err(|e: DescriptorError| e.to_string())?;
    Ok(Component { path: path.to_owned(), digest, tools, pinned: pinned.into() })
}

/// Read a component file, refusing anything over [`MAX_COMPONENT_BYTES`].
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    crate::files::read_bounded(path, MAX_COMPONENT_BYTES).map_err(|e| format!("cannot read: {e}"))
}
