//! Executor: runs an allowed call in a wasmtime sandbox.
//!
//! Owns the engine (component model, WASI p2, pooling allocator, epoch
//! interruption), the lazily compiled `InstancePre` per component, the on-disk
//! cache of compiled components, and one fresh `Store` per call holding
//! exactly the call's authority: no preopens, no environment, no network, no
//! inherited stdio (stdout, stderr and log are captured, bounded), a memory
//! limit, a deadline and an output limit. A trap, a timeout or an
//! out-of-memory becomes a [`ToolFailure`] the model reads; the host goes on.
//!
//! Architecture invariant: [`Executor::execute`] accepts only an
//! [`AllowedCall`], which only the gate builds from Allow. Nothing here
//! decides permission, and no component is compiled or instantiated for a
//! call the gate did not allow.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits, StoreLimitsBuilder, Trap,
};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::authority::narrowing::Access;
use crate::sandbox::outbound::{HttpLimits, OutboundPolicy};
use crate::snapshot::EffectiveGrant;

use crate::catalog::descriptor::CheckedTool;
use crate::catalog::{self};
use crate::config::Limits;
use crate::digest::Digest;
use crate::policy::gate::AllowedCall;
use crate::sandbox::capture::Capture;

mod bindings {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit",
        exports: { default: async },
    });
}

use bindings::toolgate::plugin::{log as wit_log, state as wit_state, types as wit_types};

/// How often the epoch advances; deadlines are whole ticks.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Engine-wide settings. Changing any of them changes the compiled-code cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorSettings {
    /// Per-call limits.
    pub limits: Limits,
    /// Compiled-component cache directory; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
}

impl ExecutorSettings {
    /// Defaults with the given limits and cache.
    pub fn new(limits: Limits, cache_dir: Option<PathBuf>) -> Self {
        ExecutorSettings { limits, cache_dir }
    }
}

/// Errors that need someone outside the agent loop to act.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The engine could not be configured.
    #[error("cannot start the wasmtime engine: {0:#}")]
    Engine(wasmtime::Error),
    /// The file changed after it was loaded; the catalog is stale.
    #[error("component {} changed on disk since it was loaded (was {was}); reload the plugin directory", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// Digest at load.
        was: Digest,
    },
    /// The file cannot be read.
    #[error("component {}: {reason}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Compilation or linking failed (e.g. it imports what the host does not provide).
    #[error("component {} cannot be loaded: {reason}", path.display())]
    Load {
        /// The file.
        path: PathBuf,
        /// Why, with the fix where known.
        reason: String,
    },
    /// The Tool failed after a granted outbound request could not be
    /// delivered (connect, DNS, TLS, timeout): the destination must be fixed
    /// or brought up, not the call.
    #[error(
        "`{tool}` failed because the host could not reach {failure}; check that the destination is up and reachable from this host (the Tool said: {said})"
    )]
    Transport {
        /// The Tool.
        tool: String,
        /// `scheme://host:port: reason`.
        failure: String,
        /// The Tool's own message.
        said: String,
    },
    /// Instantiation failed for a reason that is not the Tool's fault.
    #[error("cannot instantiate {}: {reason}", path.display())]
    Instantiate {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Why a call produced no output. Model-visible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolFailure {
    /// The Tool rejected its arguments.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The Tool reported a failure.
    #[error("{0}")]
    Failed(String),
    /// It ran past its deadline.
    #[error("the Tool ran past its {0} ms deadline and was stopped")]
    Timeout(u64),
    /// It tried to use more memory than allowed.
    #[error("the Tool exceeded its memory limit of {0} MiB and was stopped")]
    OutOfMemory(u64),
    /// It trapped (a panic in Rust guests).
    #[error("the Tool crashed: {0}")]
    Trapped(String),
    /// Output over the limit.
    #[error("the Tool's output is {size} bytes, more than the {limit} allowed")]
    OutputTooLarge {
        /// Bytes produced.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Output that is not what the WIT contract promises (e.g. invalid JSON).
    #[error("the Tool returned malformed output: {0}")]
    Malformed(String),
}

/// Content the model reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// JSON document.
    Json(serde_json::Value),
    /// Text.
    Text(String),
}

/// A Command as the guest returned it (scope not yet checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestCommand {
    /// Whose state.
    pub scope: String,
    /// Key.
    pub key: String,
    /// `Some(json)` sets, `None` removes.
    pub value: Option<String>,
}

/// A successful call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// What the model reads.
    pub content: Content,
    /// State changes, unchecked.
    pub commands: Vec<GuestCommand>,
}

/// What one execution produced.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Output or a model-visible failure.
    pub result: Result<ToolOutput, ToolFailure>,
    /// Captured guest output.
    pub captured: Captured,
    /// Wall time of instantiate + call.
    pub elapsed: Duration,
    /// A granted outbound request that failed in transport (`scheme://host:port: reason`).
    pub transport_failure: Option<String>,
}

/// Bounded guest output of one call.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Captured {
    /// stdout (lossy UTF-8), truncated to the capture limit.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
    /// `log` import messages.
    pub log: String,
    /// Bytes dropped over the limit, all streams.
    pub dropped: u64,
}

/// Per-call store state: the whole authority of one call.
struct CallState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    outbound: OutboundPolicy,
    table: ResourceTable,
    limits: StoreLimits,
    state: BTreeMap<String, String>,
    log: Capture,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.outbound }
    }
}

impl wit_types::Host for CallState {}

impl wit_log::Host for CallState {
    fn log(&mut self, level: wit_log::Level, message: String) {
        self.log.write(format!("[{level:?}] {message}\n").as_bytes());
    }
}

impl wit_state::Host for CallState {
    fn get(&mut self, key: String) -> Option<String> {
        self.state.get(&key).cloned()
    }
    fn keys(&mut self) -> Vec<String> {
        self.state.keys().cloned().collect()
    }
}

type Pre = bindings::PluginPre<CallState>;

/// The sandbox.
pub struct Executor {
    engine: Engine,
    linker: Linker<CallState>,
    settings: ExecutorSettings,
    cache_key: String,
    prepared: Mutex<HashMap<Digest, Arc<OnceCell<Pre>>>>,
    unhealthy: Mutex<HashMap<Digest, String>>,
    instantiations: AtomicU64,
    compilations: AtomicU64,
    stop_ticker: Arc<AtomicBool>,
    admission: Admission,
}

/// Back-pressure: a call waits for a slot of its Tool and a slot of the
/// executor before it instantiates, so saturation queues calls instead of
/// failing them (the pooling allocator has exactly as many slots).
struct Admission {
    total: Arc<tokio::sync::Semaphore>,
    per_tool_limit: usize,
    tools: Mutex<HashMap<String, Arc<ToolSlots>>>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

/// One Tool's slots and counts.
struct ToolSlots {
    slots: Arc<tokio::sync::Semaphore>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

/// Permits of one admitted call; released (and counted down) on drop.
struct Admitted<'a> {
    admission: &'a Admission,
    tool: Arc<ToolSlots>,
    _tool: tokio::sync::OwnedSemaphorePermit,
    _total: tokio::sync::OwnedSemaphorePermit,
}

impl Admission {
    fn new(total: usize, per_tool: usize) -> Self {
        Admission {
            total: Arc::new(tokio::sync::Semaphore::new(total)),
            per_tool_limit: per_tool,
            tools: Mutex::new(HashMap::new()),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    fn slots(&self, tool: &str) -> Arc<ToolSlots> {
        let mut tools = self.tools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tools.get(tool) {
            return t.clone();
        }
        let t = Arc::new(ToolSlots {
            slots: Arc::new(tokio::sync::Semaphore::new(self.per_tool_limit)),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        });
        tools.insert(tool.to_owned(), t.clone());
        t
    }

    async fn admit(&self, tool: &str) -> Admitted<'_> {
        let slots = self.slots(tool);
        // Tool slot first: a call waiting on its own Tool holds no executor slot.
        // The semaphores are never closed, so acquiring cannot fail.
        let tool_permit = slots.slots.clone().acquire_owned().await.unwrap_or_else(|_| unreachable!("never closed"));
        let total_permit = self.total.clone().acquire_owned().await.unwrap_or_else(|_| unreachable!("never closed"));
        let n = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(n, Ordering::Relaxed);
        let n = slots.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        slots.peak.fetch_max(n, Ordering::Relaxed);
        Admitted { admission: self, tool: slots, _tool: tool_permit, _total: total_permit }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.admission.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.tool.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }
}

impl Executor {
    /// An engine with `settings`. Starts the epoch ticker thread.
    pub fn new(settings: ExecutorSettings) -> Result<Self, ExecutorError> {
        let mut pool = PoolingAllocationConfig::new();
        // One pooling slot per admitted instance: the admission semaphore below
        // guarantees the pool is never exhausted, so saturation waits, never fails.
        let n = u32::try_from(settings.limits.max_instances).unwrap_or(u32::MAX).max(1);
        pool.total_component_instances(n)
            .total_core_instances(n * 8)
            .total_memories(n * 4)
            .total_tables(n * 8)
            .total_stacks(n)
            .max_memory_size((settings.limits.memory_mib as usize) << 20);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(ExecutorError::Engine)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(ExecutorError::Engine)?;
        // The only network a guest gets: HTTP through the outbound policy.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(ExecutorError::Engine)?;
        bindings::Plugin::add_to_linker::<CallState, wasmtime::component::HasSelf<CallState>>(&mut linker, |s| s)
            .map_err(ExecutorError::Engine)?;

        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        settings.limits.memory_mib.hash(&mut h);
        n.hash(&mut h);
        let cache_key = format!("{:016x}", h.finish());

        let stop_ticker = Arc::new(AtomicBool::new(false));
        let (weak, stop) = (engine.weak(), stop_ticker.clone());
        std::thread::Builder::new()
            .name("toolgate-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(e) => e.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| ExecutorError::Engine(wasmtime::Error::msg(format!("cannot start epoch thread: {e}"))))?;

        let per_tool = usize::try_from(settings.limits.max_instances_per_tool).unwrap_or(usize::MAX).max(1);
        let admission = Admission::new(n as usize, per_tool);
        Ok(Executor {
            engine,
            linker,
            settings,
            cache_key,
            prepared: Mutex::new(HashMap::new()),
            unhealthy: Mutex::new(HashMap::new()),
            instantiations: AtomicU64::new(0),
            compilations: AtomicU64::new(0),
            stop_ticker,
            admission,
        })
    }

    /// The most instances that were alive at once: in total, and of `tool`.
    pub fn peak_instances(&self, tool: &str) -> (usize, usize) {
        let total = self.admission.peak.load(Ordering::Relaxed);
        let tools = self.admission.tools.lock().unwrap_or_else(|p| p.into_inner());
        (total, tools.get(tool).map_or(0, |t| t.peak.load(Ordering::Relaxed)))
    }

    /// How many component instances this executor has created. Tests use it
    /// to prove that denied and awaiting calls instantiate nothing.
    pub fn instantiations(&self) -> u64 {
        self.instantiations.load(Ordering::SeqCst)
    }

    /// How many components this executor compiled (cache misses).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::SeqCst)
    }

    /// Why `digest`'s component cannot run, if it failed to load before.
    pub fn unhealthy(&self, digest: &Digest) -> Option<String> {
        self.unhealthy.lock().unwrap_or_else(|p| p.into_inner()).get(digest).cloned()
    }

    /// Run an allowed call with the Tool's committed `state` visible read-only.
    pub async fn execute(
        &self,
        call: &AllowedCall,
        state: BTreeMap<String, String>,
    ) -> Result<Execution, ExecutorError> {
        let component = &call.candidate().installed.component;
        let pre = self.prepare(&component.path, component.digest).await?;
        let limits = &self.settings.limits;
        let capture = (limits.capture_kib as usize) << 10;
        let (stdout, stderr, log) = (Capture::new(capture), Capture::new(capture), Capture::new(capture));

        let grant = &call.candidate().grant;
        let wasi = sandbox(grant, &stdout, &stderr)
            .map_err(|reason| ExecutorError::Instantiate { path: component.path.clone(), reason })?;
        let outbound = OutboundPolicy::new(
            Arc::new(grant.hosts.clone()),
            Arc::new(grant.credentials.clone()),
            HttpLimits {
                request_bytes: (limits.http_request_kib as usize) << 10,
                response_bytes: (limits.http_response_kib as usize) << 10,
                timeout: Duration::from_millis(limits.http_timeout_ms),
            },
            log.clone(),
        );
        let transport = outbound.transport_failure();
        let state = CallState {
            wasi,
            http: WasiHttpCtx::new(),
            outbound,
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new()
                .memory_size((limits.memory_mib as usize) << 20)
                .trap_on_grow_failure(true)
                .build(),
            state,
            log: log.clone(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        // Yield to the async runtime at every epoch tick: a guest that spins
        // cannot starve other calls on this thread, and the deadline below
        // (which covers instantiation, guest code and host calls alike)
        // cancels it by dropping the call.
        store.set_epoch_deadline(1);
        store.epoch_deadline_async_yield_and_update(1);

        // Wait for a slot (not part of the call's deadline: queueing is the host's doing).
        let _admitted = self.admission.admit(&call.call().tool_id).await;
        let started = Instant::now();
        let c = call.call();
        let arguments = c.arguments.to_string();
        let deadline = Duration::from_millis(limits.timeout_ms);
        let run = async {
            self.instantiations.fetch_add(1, Ordering::SeqCst);
            let plugin = pre.instantiate_async(&mut store).await?;
            plugin.toolgate_plugin_tool().call_call(&mut store, &c.tool_id, &arguments).await
        };
        let raw = match tokio::time::timeout(deadline, run).await {
            Ok(r) => r,
            Err(_) => Err(wasmtime::Error::new(Trap::Interrupt)),
        };
        let elapsed = started.elapsed();
        let result = match raw {
            Ok(Ok(out)) => self.convert(out, &call.candidate().installed.tool),
            Ok(Err(wit_types::ToolError::InvalidArguments(m))) => Err(ToolFailure::InvalidArguments(m)),
            Ok(Err(wit_types::ToolError::Failed(m))) => Err(ToolFailure::Failed(m)),
            Err(e) => Err(classify(&e, limits, &stderr)),
        };
        drop(store);
        let dropped = stdout.dropped() + stderr.dropped() + log.dropped();
        Ok(Execution {
            result,
            captured: Captured { stdout: stdout.text(), stderr: stderr.text(), log: log.text(), dropped },
            elapsed,
            transport_failure: transport.get(),
        })
    }

    fn convert(&self, out: wit_types::ToolOutput, tool: &CheckedTool) -> Result<ToolOutput, ToolFailure> {
        let limit = (self.settings.limits.output_kib as usize) << 10;
        let command_bytes: usize = out
            .commands
            .iter()
            .map(|c| {
                c.scope.len()
                    + c.key.len()
                    + match &c.op {
                        wit_types::CommandOp::Set(v) => v.len(),
                        wit_types::CommandOp::Remove => 0,
                    }
            })
            .sum();
        let size = match &out.content {
            wit_types::Content::Json(s) | wit_types::Content::Text(s) => s.len(),
        } + command_bytes;
        if size > limit {
            return Err(ToolFailure::OutputTooLarge { size, limit });
        }
        let content = match out.content {
            wit_types::Content::Json(s) => {
                let v = serde_json::from_str(&s)
                    .map_err(|e| ToolFailure::Malformed(format!("content is not JSON: {e}")))?;
                tool.validate_output(&v).map_err(ToolFailure::Malformed)?;
                Content::Json(v)
            }
            wit_types::Content::Text(t) => Content::Text(t),
        };
        let commands = out
            .commands
            .into_iter()
            .map(|c| GuestCommand {
                scope: c.scope,
                key: c.key,
                value: match c.op {
                    wit_types::CommandOp::Set(v) => Some(v),
                    wit_types::CommandOp::Remove => None,
                },
            })
            .collect();
        Ok(ToolOutput { content, commands })
    }

    /// The `InstancePre` of a component: compiled once, lazily, on the first
    /// allowed call; from the disk cache when present.
    async fn prepare(&self, path: &Path, digest: Digest) -> Result<Pre, ExecutorError> {
        let cell = {
            let mut map = self.prepared.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(digest).or_default().clone()
        };
        let pre = cell
            .get_or_try_init(|| async {
                let r = self.load(path, digest).await;
                if let Err(e @ ExecutorError::Load { .. }) = &r {
                    self.unhealthy.lock().unwrap_or_else(|p| p.into_inner()).insert(digest, e.to_string());
                }
                r
            })
            .await?;
        Ok(pre.clone())
    }

    async fn load(&self, path: &Path, digest: Digest) -> Result<Pre, ExecutorError> {
        let cached =
            self.settings.cache_dir.as_ref().map(|d| d.join(format!("{}-{}.cwasm", digest.hex(), self.cache_key)));
        let engine = self.engine.clone();
        let path_owned = path.to_owned();
        let cached_path = cached.clone();
        let (component, compiled) = tokio::task::spawn_blocking(move || -> Result<(Component, bool), ExecutorError> {
            if let Some(c) = cached_path.as_ref().filter(|c| c.is_file()) {
                // SAFETY: the cache directory is written only by this host
                // (0700, atomic renames) and is keyed by engine settings; it
                // is as trusted as the host binary. A failed load falls back
                // to compiling from the verified source.
                if let Ok(comp) = unsafe { Component::deserialize_file(&engine, c) } {
                    return Ok((comp, false));
                }
            }
            let bytes = catalog::read_bounded(&path_owned)
                .map_err(|reason| ExecutorError::Read { path: path_owned.clone(), reason })?;
            if Digest::of(&bytes) != digest {
                return Err(ExecutorError::Changed { path: path_owned.clone(), was: digest });
            }
            let comp = Component::new(&engine, &bytes)
                .map_err(|e| ExecutorError::Load { path: path_owned.clone(), reason: format!("{e:#}") })?;
            if let Some(c) = &cached_path {
                write_cache(c, &comp);
            }
            Ok((comp, true))
        })
        .await
        .map_err(|e| ExecutorError::Load { path: path.to_owned(), reason: format!("compile task failed: {e}") })??;
        if compiled {
            self.compilations.fetch_add(1, Ordering::SeqCst);
        }
        let pre = self.linker.instantiate_pre(&component).map_err(|e| ExecutorError::Load {
            path: path.to_owned(),
            reason: format!("{e:#}; the component imports something this host does not provide"),
        })?;
        bindings::PluginPre::new(pre).map_err(|e| ExecutorError::Load {
            path: path.to_owned(),
            reason: format!("{e:#}; build it with toolgate-sdk's `export_tools!`"),
        })
    }

    /// Call a component's `describe` export in a sandbox with no authority.
    /// Used by `toolgate pack` only; a host never calls it.
    pub async fn describe(&self, bytes: &[u8]) -> Result<String, ExecutorError> {
        let path = PathBuf::from("<pack input>");
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| ExecutorError::Load { path: path.clone(), reason: format!("{e:#}") })?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| ExecutorError::Load { path: path.clone(), reason: format!("{e:#}") })?;
        let pre = bindings::PluginPre::new(pre)
            .map_err(|e| ExecutorError::Load { path: path.clone(), reason: format!("{e:#}") })?;
        let limits = &self.settings.limits;
        let state = CallState {
            wasi: WasiCtx::builder().build(),
            http: WasiHttpCtx::new(),
            // No destinations: `describe` gets no network.
            outbound: OutboundPolicy::new(
                Arc::default(),
                Arc::default(),
                HttpLimits { request_bytes: 0, response_bytes: 0, timeout: Duration::from_millis(1) },
                Capture::new(0),
            ),
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new()
                .memory_size((limits.memory_mib as usize) << 20)
                .trap_on_grow_failure(true)
                .build(),
            state: BTreeMap::new(),
            log: Capture::new(0),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(limits.timeout_ms.div_ceil(EPOCH_TICK.as_millis() as u64).max(1));
        store.epoch_deadline_trap();
        let plugin = pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| ExecutorError::Instantiate { path: path.clone(), reason: format!("{e:#}") })?;
        plugin
            .toolgate_plugin_tool()
            .call_describe(&mut store)
            .await
            .map_err(|e| ExecutorError::Instantiate { path, reason: format!("describe failed: {e:#}") })
    }
}

/// The WASI context of one call: exactly the granted mounts and environment,
/// stdout/stderr into bounded captures, and nothing else — no inherited stdio,
/// no arguments, no sockets, no name lookup (all off by default in wasmtime-wasi).
fn sandbox(grant: &EffectiveGrant, stdout: &Capture, stderr: &Capture) -> Result<WasiCtx, String> {
    let mut b = WasiCtx::builder();
    b.stdout(stdout.clone()).stderr(stderr.clone());
    for (k, v) in &grant.env {
        b.env(k, v);
    }
    for m in &grant.mounts {
        let perms = match m.access {
            Access::Read => FsPerms::ReadOnly,
            Access::ReadWrite => FsPerms::ReadWrite,
        };
        // cap-std underneath: `..`, absolute paths and symlinks cannot leave the directory.
        b.preopened_dir(&m.host, &m.guest, perms).map_err(|e| {
            format!(
                "cannot open granted directory {} for {}: {e:#}; check the [[grants]] entry",
                m.host.display(),
                m.guest
            )
        })?;
    }
    Ok(b.build())
}

fn write_cache(path: &Path, component: &Component) {
    // Best effort: a cache that cannot be written only costs a recompile.
    let Ok(bytes) = component.serialize() else { return };
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Turn a wasmtime error into the model-visible failure.
fn classify(e: &wasmtime::Error, limits: &Limits, stderr: &Capture) -> ToolFailure {
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return match trap {
            Trap::Interrupt => ToolFailure::Timeout(limits.timeout_ms),
            Trap::StackOverflow => ToolFailure::Trapped("stack overflow".into()),
            Trap::UnreachableCodeReached => {
                // A Rust guest panics (or aborts on allocation failure) by
                // reaching `unreachable`; its stderr says which.
                let text = stderr.text();
                if text.contains("memory allocation") {
                    ToolFailure::OutOfMemory(limits.memory_mib)
                } else {
                    ToolFailure::Trapped(format!("panic or abort ({})", truncate(&panic_message(&text), 300)))
                }
            }
            other => ToolFailure::Trapped(other.to_string()),
        };
    }
    let chain = format!("{e:#}");
    if chain.contains("forcing trap when growing memory") {
        return ToolFailure::OutOfMemory(limits.memory_mib);
    }
    ToolFailure::Trapped(truncate(&chain, 500))
}

/// The panic message from a Rust guest's stderr (`thread '…' panicked at …:` then the message).
fn panic_message(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    if let Some(i) = lines.iter().rposition(|l| l.contains("panicked at")) {
        let msg = lines.get(i + 1).copied().unwrap_or_default();
        return format!("{} {msg}", lines[i].trim());
    }
    lines
        .iter()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.starts_with("note:"))
        .map(|l| l.to_string())
        .unwrap_or_else(|| "no message".into())
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
