//! Fixtures for the end-to-end tests: the built guest components, packing
//! them once per test binary, and a host on a temporary directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use toolgate::commit::StepStore;
use toolgate::{Catalog, Config, ExecutableAgentSnapshot, Executor, ExecutorSettings, Runtime, SqliteJournal};

/// Paths of the built (unpacked) guest components.
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// The bytes of a built guest component, unpacked.
pub fn raw(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read guest {path}: {e}"))
}

/// The packed (shippable) bytes of a guest; packed once per process.
pub fn packed(path: &str) -> Vec<u8> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(b) = cache.lock().unwrap().get(path) {
        return b.clone();
    }
    let bytes = raw(path);
    // Its own thread and runtime: callers may already be inside one.
    let (packed, _) = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(toolgate::pack::pack(&bytes))
        })
        .join()
        .unwrap()
    })
    .unwrap_or_else(|e| panic!("pack {path}: {e}"));
    cache.lock().unwrap().insert(path.to_owned(), packed.clone());
    packed
}

/// A host over a temporary directory: `plugins/`, `journal.db`, `cache/`.
pub struct TestHost {
    /// The temporary directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// The checked config.
    pub config: Config,
    /// The agent runtime.
    pub runtime: Runtime,
}

/// The config preamble every test host uses; tests append agents and grants.
pub const PREAMBLE: &str = "plugins = \"plugins\"\nstore = \"journal.db\"\ncache = \"cache\"\n";

impl TestHost {
    /// A host with `config` (TOML, appended to [`PREAMBLE`]) and `plugins` (file name, bytes).
    pub fn new(config: &str, plugins: &[(&str, Vec<u8>)]) -> TestHost {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
        for (name, bytes) in plugins {
            std::fs::write(dir.path().join("plugins").join(name), bytes).unwrap();
        }
        std::fs::write(dir.path().join("toolgate.toml"), format!("{PREAMBLE}{config}")).unwrap();
        Self::open(dir, "default")
    }

    /// Open a host on an existing directory (a restart).
    pub fn open(dir: tempfile::TempDir, agent: &str) -> TestHost {
        let config = Config::load(&dir.path().join("toolgate.toml")).unwrap();
        let runtime = runtime_for(&config, agent);
        TestHost { dir, config, runtime }
    }

    /// Stop this host and start a new one on the same directory.
    pub fn restart(self) -> TestHost {
        let TestHost { dir, .. } = self;
        Self::open(dir, "default")
    }

    /// The plugin directory.
    pub fn plugins(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// The journal file.
    pub fn journal_path(&self) -> PathBuf {
        self.dir.path().join("journal.db")
    }

    /// Instances created so far by this host's executor.
    pub fn instantiations(&self) -> u64 {
        self.runtime.executor().instantiations()
    }
}

/// A runtime for `agent` over `config`.
pub fn runtime_for(config: &Config, agent: &str) -> Runtime {
    let catalog = Arc::new(Catalog::load(&config.plugins).unwrap());
    let snapshot = ExecutableAgentSnapshot::build(config, agent, catalog).unwrap();
    let executor = Arc::new(Executor::new(ExecutorSettings::new(config.limits.clone(), Some(config.cache.clone()))).unwrap());
    let store: Arc<dyn StepStore> = Arc::new(SqliteJournal::open(&config.store).unwrap());
    Runtime::new(snapshot, executor, store, config.limits.ticket_ttl_secs)
}

/// Write `bytes` to `dir/name`.
pub fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}
