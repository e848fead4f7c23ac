//! Host: opening the whole path from a checked [`Config`] — catalog,
//! snapshot, executor, store, runtime.
//!
//! Owns the order in which a host starts: the plugin directory is loaded
//! (lock and signatures checked before any metadata is read), the agent's
//! snapshot is built, the executor and the journal open, and claims left by
//! hosts that died mid-approval are settled before anything else is served.
//! The CLI and any embedding agent runtime open a host the same way.
//!
//! Architecture invariant: opening a host compiles and runs nothing; the
//! first compilation happens inside the first allowed call.

use std::sync::Arc;

use crate::catalog::lockfile::Lockfile;
use crate::catalog::{Catalog, CatalogError};
use crate::config::{Config, ConfigError, StoreLocation};
use crate::runtime::{CallError, Runtime, RuntimeSettings};
use crate::sandbox::executor::{Executor, ExecutorError, ExecutorSettings};
use crate::snapshot::ExecutableAgentSnapshot;
use crate::store::memory::MemoryJournal;
use crate::store::sqlite::SqliteJournal;
use crate::store::{CommitError, StepStore};

/// Raise this process's soft limit on open files to its hard limit, and
/// return both as they are now. Every file a guest holds open in its grant
/// is one of the host's descriptors (up to `limits.resource_table_entries`
/// per call); at a soft limit of 1024, one call could take them all from the
/// journal, outbound connections and other calls. For a host process (the
/// CLI calls it at start); an embedder decides for its own process.
pub fn raise_open_file_limit() -> std::io::Result<(u64, u64)> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        setrlimit(Resource::Nofile, rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum })?;
    }
    let now = getrlimit(Resource::Nofile);
    Ok((now.current.unwrap_or(u64::MAX), now.maximum.unwrap_or(u64::MAX)))
}

/// Why a host could not start. Each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The config names something that does not exist or does not fit.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The plugin directory or its lockfile cannot be read.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The engine cannot start.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// The journal cannot be opened.
    #[error(transparent)]
    Store(#[from] CommitError),
    /// Settling interrupted claims failed.
    #[error(transparent)]
    Settle(#[from] CallError),
}

/// The config's plugin directory, checked against its lockfile when one
/// exists and against its trusted signing keys when it lists any; a
/// component a Tool could change (found through a read-write grant, or with
/// a second link) is refused. Reads metadata only: nothing is compiled.
pub fn catalog(config: &Config) -> Result<Catalog, CatalogError> {
    let lock = Lockfile::read(&config.lock)?;
    let writable = config.writable();
    Catalog::load_guarded(&config.plugins, lock.as_ref(), &config.trusted_keys, &|p| writable.check_component(p))
}

/// The journal the config's `store` names.
pub async fn store(config: &Config) -> Result<Arc<dyn StepStore>, CommitError> {
    match &config.store {
        StoreLocation::Memory => Ok(Arc::new(MemoryJournal::new())),
        StoreLocation::Sqlite(path) => Ok(Arc::new(SqliteJournal::open_with(path, config.durability)?)),
        #[cfg(feature = "postgres")]
        StoreLocation::Postgres(pg) => {
            let password = match &pg.password {
                Some(source) => Some(crate::authority::credentials::read_source(source).map_err(|message| {
                    CommitError::Postgres { store: "postgres".into(), message: format!("postgres.password: {message}") }
                })?),
                None => None,
            };
            Ok(Arc::new(
                crate::store::postgres::PostgresJournal::connect(
                    &pg.dsn,
                    password.as_deref(),
                    pg.pool_size,
                    pg.ca_file.as_deref(),
                )
                .await?,
            ))
        }
        #[cfg(not(feature = "postgres"))]
        StoreLocation::Postgres(_) => Err(CommitError::Unsupported {
            store: "postgres".into(),
            message: "this build has no PostgreSQL support; build toolgate with the `postgres` feature".into(),
        }),
    }
}

/// The executor the config describes: its limits, its compiled-code cache.
pub fn executor(config: &Config) -> Result<Executor, ExecutorError> {
    let mut settings = ExecutorSettings::new(config.limits.clone(), Some(config.cache.clone()));
    settings.baseline_tier = config.baseline_compiler;
    Executor::new(settings)
}

/// Compile every component of `catalog` into the config's compiled-code
/// cache, so no first call waits for Cranelift. For components an operator
/// has just pinned (`toolgate lock`): a trust decision already made; a host
/// never compiles a component before an allowed call otherwise. Returns, per
/// component, whether it was compiled now (`false`: already cached) or why not.
pub async fn precompile(
    config: &Config,
    catalog: &Catalog,
) -> Result<Vec<(std::path::PathBuf, Result<bool, String>)>, ExecutorError> {
    let executor = executor(config)?;
    let mut out = Vec::new();
    for c in catalog.components() {
        let before = executor.compilations();
        let r = executor.precompile(&c.path, c.digest).await.map(|()| executor.compilations() > before);
        out.push((c.path.clone(), r.map_err(|e| e.to_string())));
    }
    Ok(out)
}

/// Open agent `agent`'s runtime on `config`: catalog, snapshot, executor and
/// store, then settle claims of hosts that died mid-approval. Files the
/// catalog refused are in `runtime.snapshot().catalog().refused()`.
pub async fn open(config: &Config, agent: &str) -> Result<Runtime, HostError> {
    // An MCP client starting `toolgate serve` passes its own environment,
    // not the user's shell's: a secret whose variable is missing (a
    // credential's, or the host's own: a `[[serve.auth]]` token,
    // `serve.state_key`, `postgres.password`) leaves the host nothing to
    // check for, so it refuses files and requests.
    for spec in config.watched() {
        match spec.unreadable() {
            Some(why) if spec.is_watch_only() => tracing::warn!(
                "{why}; this process does not look for that secret in what reaches its Tools (the process that \
                 can read it does): give it the same source to have it watched here too"
            ),
            Some(why) => tracing::warn!(
                "{why}; until the host can read it, it cannot check anything for this secret: it refuses Tools' \
                 files, sends none of their HTTP requests, and withholds the output of calls that read their \
                 state or pinned data"
            ),
            None => {}
        }
    }
    let catalog = Arc::new(catalog(config)?);
    let snapshot = ExecutableAgentSnapshot::build(config, agent, catalog)?;
    let executor = Arc::new(executor(config)?);
    let runtime = Runtime::new(snapshot, executor, store(config).await?, RuntimeSettings::of(config));
    // A host that died mid-approval left its ticket claimed: record that, once.
    for request in runtime.settle_interrupted().await? {
        tracing::warn!(
            request,
            "an approved call was interrupted by a host that stopped mid-call; see `toolgate journal`"
        );
    }
    Ok(runtime)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let before = getrlimit(Resource::Nofile);
        // One below the hard limit (harmless to the other tests of this process), then raised.
        if let Some(max) = before.maximum.filter(|m| *m > 1) {
            setrlimit(Resource::Nofile, Rlimit { current: Some(max - 1), maximum: Some(max) }).unwrap();
        }
        let (soft, hard) = super::raise_open_file_limit().unwrap();
        assert_eq!(soft, hard);
        assert_eq!(Some(hard), before.maximum.or(Some(u64::MAX)));
    }
}
