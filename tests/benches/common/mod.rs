//! Shared by the benchmarks: the bare wasmtime baseline and a toolgate host
//! over the same component.

#![allow(dead_code)] // each bench uses part of it

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use toolgate::store::StepStore;
use toolgate::{
    Catalog, Config, ExecutableAgentSnapshot, Executor, ExecutorSettings, Runtime, SqliteJournal, StepResult,
    ToolCapabilityNarrowing,
};
use toolgate_tests::{guests, packed};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub const TOOL: &str = "text.upper";
pub const ARGS: &str = r#"{"text":"hello"}"#;

/// Resident memory of this process, KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The `p` quantile of sorted durations.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    pct(&v, 0.5)
}

pub fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

// ---------------------------------------------------------------------------
// Bare wasmtime: the baseline.

mod bare {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit",
        exports: { default: async },
    });
}

pub use bare::toolgate::plugin::types as wit_types;
use bare::toolgate::plugin::{log as wit_log, state as wit_state};

struct BareState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    state: BTreeMap<String, String>,
}

impl WasiView for BareState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}
impl wit_types::Host for BareState {}
impl wit_log::Host for BareState {
    fn log(&mut self, _level: wit_log::Level, _message: String) {}
}
impl wit_state::Host for BareState {
    fn get(&mut self, key: String) -> Option<String> {
        self.state.get(&key).cloned()
    }
    fn keys(&mut self) -> Vec<String> {
        self.state.keys().cloned().collect()
    }
}

/// The engine of `toolgate::Executor::new` with its default settings
/// (64 instances, 64 MiB memory), an epoch ticker like the executor's, and
/// the `InstancePre` of the packed text component, loaded like the host loads
/// it from its compiled-component cache: compiled, serialized to a file,
/// `Component::deserialize_file` (mmap). Code loaded that way instantiates a
/// few µs faster than code compiled in memory, so both sides load it alike.
pub struct Bare {
    engine: Engine,
    pre: bare::PluginPre<BareState>,
    stop: Arc<AtomicBool>,
}

impl Drop for Bare {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

pub const MAX_INSTANCES: u32 = 64;
pub const MEMORY_MIB: usize = 64;
pub const TIMEOUT_MS: u64 = 10_000;
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

impl Bare {
    pub fn new(bytes: &[u8], dir: &Path) -> Bare {
        let n = MAX_INSTANCES;
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(n)
            .total_core_instances(n * 8)
            .total_memories(n * 4)
            .total_tables(n * 8)
            .total_stacks(n)
            .max_memory_size(MEMORY_MIB << 20);
        // The executor's slot reuse: the same engine settings on both sides.
        toolgate::sandbox::executor::slot_reuse(&mut pool);
        let mut config = wasmtime::Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).unwrap();
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        bare::Plugin::add_to_linker::<BareState, wasmtime::component::HasSelf<BareState>>(&mut linker, |s| s).unwrap();
        let file = dir.join("bare.cwasm");
        std::fs::write(&file, Component::new(&engine, bytes).unwrap().serialize().unwrap()).unwrap();
        // SAFETY: written just above by this engine configuration.
        let component = unsafe { Component::deserialize_file(&engine, &file) }.unwrap();
        let pre = bare::PluginPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (engine.weak(), stop.clone());
        std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => break,
                }
            }
        });
        Bare { engine, pre, stop }
    }

    pub async fn call(&self, tool: &str, args: &str) -> wit_types::ToolOutput {
        let state = BareState {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new().memory_size(MEMORY_MIB << 20).trap_on_grow_failure(true).build(),
            state: BTreeMap::new(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(TIMEOUT_MS.div_ceil(EPOCH_TICK.as_millis() as u64));
        store.epoch_deadline_trap();
        let plugin = self.pre.instantiate_async(&mut store).await.unwrap();
        plugin.toolgate_plugin_tool().call_call(&mut store, tool, args).await.unwrap().unwrap()
    }
}

// ---------------------------------------------------------------------------
// The toolgate host.

/// A host directory with the packed text component and an agent that sees
/// and may run `text.*`. Its compiled-component cache is filled once here, so
/// every runtime below loads the component as a restarted host does (from
/// the cache, mmap) and no benchmark measures compilation.
pub struct Host {
    pub dir: tempfile::TempDir,
    pub config: Config,
}

impl Host {
    pub fn new(rt: &tokio::runtime::Runtime) -> Host {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
        std::fs::write(dir.path().join("plugins/text.wasm"), packed(guests::TEXT)).unwrap();
        let toml = format!(
            "{}\n[agents.default]\nvisible = [\"text.*\"]\ndefault = \"deny\"\nrules = [{{ pattern = \"text.*\", behavior = \"allow\" }}]\n",
            toolgate_tests::PREAMBLE
        );
        std::fs::write(dir.path().join("toolgate.toml"), toml).unwrap();
        let config = Config::load(&dir.path().join("toolgate.toml")).unwrap();
        let host = Host { dir, config };
        let warm = host.runtime("default", Arc::new(toolgate::MemoryJournal::new()));
        let run = rt.block_on(warm.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
        assert_upper(&rt.block_on(run.call(TOOL, json!({"text": "hello"}))).unwrap());
        // Cranelift's compile behind the first (baseline) call fills the disk cache.
        rt.block_on(warm.executor().settle());
        assert_eq!(warm.executor().compilations(), 1);
        host
    }

    pub fn runtime(&self, agent: &str, store: Arc<dyn StepStore>) -> Runtime {
        let catalog = Arc::new(Catalog::load(&self.config.plugins).unwrap());
        let snapshot = ExecutableAgentSnapshot::build(&self.config, agent, catalog).unwrap();
        let settings = ExecutorSettings::new(self.config.limits.clone(), Some(self.config.cache.clone()));
        let executor = Arc::new(Executor::new(settings).unwrap());
        Runtime::new(snapshot, executor, store, toolgate::RuntimeSettings::of(&self.config))
    }

    pub fn durable_journal(&self, name: &str) -> Arc<dyn StepStore> {
        Arc::new(SqliteJournal::open(&self.dir.path().join(name)).unwrap())
    }
}

pub fn assert_upper(r: &StepResult) {
    assert!(
        matches!(r, StepResult::Output { content: toolgate::sandbox::executor::Content::Json(Value::String(s)), .. } if s == "HELLO"),
        "{r:?}"
    );
}
