//! Executor: runs an allowed call in a wasmtime sandbox.
//!
//! Owns the engine (component model, WASI p2, pooling allocator, epoch
//! interruption), the lazily compiled `InstancePre` per component, the on-disk
//! cache of compiled components (Cranelift's code), the baseline tier (a
//! second engine, same settings, compiled by Winch: a component never
//! compiled before runs its first calls on Winch's code, in milliseconds,
//! while Cranelift compiles it behind them — both are wasmtime Tier 1), and one fresh `Store` per call holding
//! exactly the call's authority: no preopens, no environment, no network, no
//! inherited stdio (stdout, stderr and log are captured, bounded), a memory
//! limit, a deadline and an output limit. A trap, a timeout or an
//! out-of-memory becomes a [`ToolFailure`] the model reads; the host goes on.
//! With any credential configured, what a call returns and captured is
//! checked for every configured secret before anyone reads it
//! ([`withhold_secrets`]): a part holding one is withheld, with a note
//! naming the credential, and recorded; all of it, while a credential
//! cannot be read, when the call read its state or pinned data, listed a
//! directory or had an `env` grant — and then the guest's text quoted in
//! its host records too.
//!
//! Architecture invariant: [`Executor::admit`] (and [`Executor::execute`]) accept only an
//! [`AllowedCall`], which only the gate builds from Allow. Nothing here
//! decides permission, and no component is compiled or instantiated for a
//! call the gate did not allow.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits, StoreLimitsBuilder, Trap,
    UpdateDeadline,
};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::authority::narrowing::Access;
use crate::sandbox::outbound::{self, HttpLimits, OutboundPolicy, Record, Watched};
use crate::snapshot::{Candidate, EffectiveGrant};

use crate::catalog::descriptor::CheckedTool;
use crate::catalog::{self};
use crate::config::Limits;
use crate::digest::{Digest, DigestMap};
use crate::policy::gate::AllowedCall;
use crate::sandbox::capture::{Capture, Kept};
use crate::sandbox::filesystem::{self, FilesystemCall, Held};
use crate::sandbox::http_held::{self, HttpCall, HttpHeld};
use crate::sandbox::ticker::{PARK_AFTER, Ticker};
use crate::sandbox::withhold::{self, CallSecrets};

mod bindings {
    wasmtime::component::bindgen!({
        // `adapter` is `plugin` plus the `pinned` import: every component
        // may read its own pinned section; most never import it.
        world: "adapter",
        path: "../wit",
        exports: { default: async },
    });
}

use bindings::toolgate::plugin::{log as wit_log, pinned as wit_pinned, state as wit_state, types as wit_types};

/// How often the epoch advances; deadlines are whole ticks.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Core instances, memories and tables one component instance may use:
/// its share of the pooling allocator (ample for Rust and Python guests).
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;
const MEMORIES_PER_COMPONENT: u32 = 4;
const TABLES_PER_COMPONENT: u32 = 16;

/// Bytes of a pool slot's linear memory, and of its tables, kept resident
/// when an instance is done: the pages it dirtied below this are reset in
/// place (memset, to zero or to the memory image) instead of returned to the
/// kernel with `madvise`, so the next instance neither faults them in again
/// nor makes the kernel flush every core's TLB. Enough for the pages a Rust
/// Tool touches per call; a Python Tool's larger heap is still `madvise`d.
pub const KEEP_RESIDENT_BYTES: usize = 1 << 20;
/// The same for a slot's tables.
pub const TABLE_KEEP_RESIDENT_BYTES: usize = 64 << 10;

/// How a pool slot is made ready for the next instance: the
/// [`KEEP_RESIDENT_BYTES`] above, found with Linux's `PAGEMAP_SCAN` (6.7+)
/// where the kernel has it, so only the pages that were written are reset.
/// Public so the bare-wasmtime benchmark runs with the same settings.
pub fn slot_reuse(pool: &mut PoolingAllocationConfig) -> &mut PoolingAllocationConfig {
    pool.linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES)
        .pagemap_scan(wasmtime::Enabled::Auto)
}

/// Components compiled at once (Cranelift uses every core for one).
const COMPILES_AT_ONCE: usize = 2;

/// Cranelift compiles of components already running on the baseline tier,
/// at once: background work, kept off the second core's calls.
const OPTIMIZING_AT_ONCE: usize = 1;

/// Feeds [`Hash`] input into SHA-256, for stable cache keys (unlike
/// `DefaultHasher`, whose output may change between Rust releases).
#[derive(Default)]
struct Sha256Hasher(sha2::Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        sha2::Digest::update(&mut self.0, bytes);
    }
    fn finish(&self) -> u64 {
        0 // unused: the key is the whole digest
    }
}

impl Sha256Hasher {
    fn hex(self) -> String {
        hex::encode(sha2::Digest::finalize(self.0))
    }
}

/// Engine-wide settings. Changing any of them changes the compiled-code cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorSettings {
    /// Per-call limits.
    pub limits: Limits,
    /// Compiled-component cache directory; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Run a component's first calls on Winch's code while Cranelift
    /// compiles it (default); `false` waits for Cranelift.
    pub baseline_tier: bool,
}

impl ExecutorSettings {
    /// Defaults with the given limits and cache.
    pub fn new(limits: Limits, cache_dir: Option<PathBuf>) -> Self {
        ExecutorSettings { limits, cache_dir, baseline_tier: true }
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

impl ExecutorError {
    /// What the model reads of this error: what happened and who must act,
    /// without the host's own state — its paths, the engine's or the
    /// loader's words (invariant 14). The journal's host records and the
    /// host's log keep the whole text ([`std::fmt::Display`]). A transport
    /// failure names the Tool's own granted destination: said whole.
    pub fn model_text(&self, tool: &str) -> String {
        let Some(what) = self.what_happened() else { return self.to_string() };
        format!(
            "`{tool}` could not be run: {what}; nothing of the call ran. This is for the host's operator to fix (the \
             host's log and journal hold the cause), not the call"
        )
    }

    /// What happened, in words without the host's paths; `None` for a
    /// transport failure (its text names the Tool's own destination).
    fn what_happened(&self) -> Option<&'static str> {
        Some(match self {
            ExecutorError::Transport { .. } => return None,
            ExecutorError::Engine(_) => "the host's sandbox engine could not start",
            ExecutorError::Changed { .. } => "its component changed on disk since the host loaded it",
            ExecutorError::Read { .. } => "the host could not read its component",
            ExecutorError::Load { .. } => "the host could not load its component",
            ExecutorError::Instantiate { .. } => "the host could not start its component",
        })
    }
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
    /// The caller withdrew the call; the guest was stopped (or never started).
    #[error("the call was cancelled by its caller and stopped")]
    Cancelled,
    /// What the Tool returned held a configured secret: withheld whole (its
    /// content and Commands), with this note naming the credential.
    #[error("{0}")]
    Withheld(String),
}

impl ToolFailure {
    /// This failure with the text the Tool wrote (its error, or what was
    /// wrong with its output) at most `limit` bytes, the output limit: what
    /// a call gives the model and the journal is bounded whether it succeeded
    /// or not. Cut, not refused as [`ToolFailure::OutputTooLarge`]: an error
    /// says what went wrong at its start, which is what the model needs to
    /// choose its next action and an operator needs to read in the journal.
    fn bounded(self, limit: usize) -> Self {
        match self {
            Self::InvalidArguments(m) => Self::InvalidArguments(cut_to(m, limit)),
            Self::Failed(m) => Self::Failed(cut_to(m, limit)),
            Self::Malformed(m) => Self::Malformed(cut_to(m, limit)),
            // Host-written, and short (a trap's text is cut to 500 bytes).
            other @ (Self::Timeout(_)
            | Self::OutOfMemory(_)
            | Self::Trapped(_)
            | Self::OutputTooLarge { .. }
            | Self::Cancelled
            | Self::Withheld(_)) => other,
        }
    }

    /// A trap's text (a guest's panic message, an engine's error chain) cut
    /// to what a reader needs. Applied after the text was checked for
    /// secrets: a cut before the check could leave a secret's first bytes.
    fn shortened(self) -> Self {
        match self {
            Self::Trapped(m) if m.len() > TRAP_TEXT => Self::Trapped(truncate(&m, TRAP_TEXT)),
            other => other,
        }
    }

    /// The text in this failure that came from the guest (its error, or a
    /// message quoting its output or its stderr), if any.
    fn guest_text(&mut self) -> Option<&mut String> {
        match self {
            Self::InvalidArguments(m) | Self::Failed(m) | Self::Malformed(m) | Self::Trapped(m) => Some(m),
            Self::Timeout(_)
            | Self::OutOfMemory(_)
            | Self::OutputTooLarge { .. }
            | Self::Cancelled
            | Self::Withheld(_) => None,
        }
    }
}

/// `text` cut at a character boundary to at most `limit` bytes, with a note
/// of how many bytes were cut and the setting that cut them.
fn cut_to(mut text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let end = text.floor_char_boundary(limit);
    let cut = text.len() - end;
    text.truncate(end);
    text.push_str(&format!(" … [{cut} bytes cut: longer than `limits.output_kib` = {} KiB]", limit >> 10));
    // The megabytes it held go now, not with the step.
    text.shrink_to_fit();
    text
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
    /// A granted outbound request that failed in transport (`scheme://host:port: reason`).
    pub transport_failure: Option<String>,
    /// When the call's deadline ended (or ends), if the guest was admitted:
    /// a call run again ([`Executor::execute_until`]'s `within`) gets only
    /// what is left of it.
    pub(crate) ends: Option<Instant>,
}

impl Execution {
    /// A call withdrawn before or while it ran.
    pub fn cancelled() -> Self {
        Execution {
            result: Err(ToolFailure::Cancelled),
            captured: Captured::default(),
            transport_failure: None,
            ends: None,
        }
    }
}

/// Bounded output of one call: the guest's streams, and apart from them
/// the host's own records of the call (denied requests, withheld
/// responses, limits hit), which the guest can neither flood away nor imitate.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Captured {
    /// stdout (lossy UTF-8), truncated to the capture limit.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
    /// `log` import messages.
    pub log: String,
    /// Bytes the guest wrote over the limit, all streams.
    pub dropped: u64,
    /// What the host recorded about the call.
    pub host: Vec<String>,
    /// Host records beyond the kept ones.
    pub host_dropped: u64,
}

impl Captured {
    /// Whether nothing at all was captured (most calls).
    pub fn is_empty(&self) -> bool {
        let Captured { stdout, stderr, log, dropped, host, host_dropped } = self;
        stdout.is_empty()
            && stderr.is_empty()
            && log.is_empty()
            && *dropped == 0
            && host.is_empty()
            && *host_dropped == 0
    }
}

/// Per-call store state: the whole authority of one call.
struct CallState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    outbound: OutboundPolicy,
    table: ResourceTable,
    limits: StoreLimits,
    /// The Tool's committed state as the call read it (shared with the
    /// runtime's compare-and-set at commit, not copied).
    state: Arc<BTreeMap<String, String>>,
    /// What of `state` and `pinned` is withheld from the guest: it holds a
    /// watched secret (checked when the call starts).
    withheld: Withheld,
    log: Capture,
    /// The component's own `toolgate-pinned` section (usually empty).
    pinned: Arc<[u8]>,
    /// What the call holds open through its filesystem, against its limits.
    held: Held,
    /// What the call holds through `wasi:http` before its requests leave.
    http_held: HttpHeld,
    /// When the call's deadline ends: the guest is stopped at the first
    /// epoch tick after it ([`stop_at_deadline`]).
    ends: Instant,
}

impl FilesystemCall for CallState {
    fn filesystem_and_held(&mut self) -> (wasmtime_wasi::filesystem::WasiFilesystemCtxView<'_>, &mut Held) {
        let view =
            wasmtime_wasi::filesystem::WasiFilesystemCtxView { ctx: self.wasi.filesystem(), table: &mut self.table };
        (view, &mut self.held)
    }
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

impl HttpCall for CallState {
    fn http_and_held(&mut self) -> (WasiHttpCtxView<'_>, &mut HttpHeld) {
        let view = WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.outbound };
        (view, &mut self.http_held)
    }
}

impl wit_types::Host for CallState {}

impl wit_log::Host for CallState {
    fn log(&mut self, level: wit_log::Level, message: String) {
        self.log.write(format!("[{level:?}] {message}\n").as_bytes());
    }
}

/// What the guest may not read of the host's own keeping — its committed
/// state, its pinned data — because it holds a watched secret: state
/// committed before a credential was configured (or by a host with another
/// config sharing the journal) and data pinned under the packer's config
/// were never checked for this host's secrets. Found when the call starts,
/// on the blocking pool within its deadline ([`Executor::check_kept`]).
#[derive(Debug, Default)]
struct Withheld {
    /// Nothing of either is handed over (the check could not finish).
    all: bool,
    /// The pinned data reads as empty.
    pinned: bool,
    /// Keys holding one: left out of the keys, their values absent.
    keys: std::collections::HashSet<String>,
    /// Keys whose value holds one: the value reads as absent.
    values: std::collections::HashSet<String>,
}

/// As the output check names them while a credential is unreadable.
const STATE_RECEIVED: &str = "its committed state";
const PINNED_RECEIVED: &str = "its pinned data (a Skill's content, an adapter's pins)";

impl wit_pinned::Host for CallState {
    fn data(&mut self) -> Vec<u8> {
        if self.pinned.is_empty() {
            return Vec::new();
        }
        if let Some(secrets) = self.held.secrets() {
            secrets.received(PINNED_RECEIVED);
        }
        if self.withheld.all || self.withheld.pinned {
            return Vec::new();
        }
        self.pinned.to_vec()
    }
}

impl wit_state::Host for CallState {
    fn get(&mut self, key: String) -> Option<String> {
        let value = self.state.get(&key)?;
        if let Some(secrets) = self.held.secrets() {
            secrets.received(STATE_RECEIVED);
        }
        let w = &self.withheld;
        (!(w.all || w.keys.contains(&key) || w.values.contains(&key))).then(|| value.clone())
    }
    fn keys(&mut self) -> Vec<String> {
        if self.state.is_empty() {
            return Vec::new();
        }
        if let Some(secrets) = self.held.secrets() {
            secrets.received(STATE_RECEIVED);
        }
        let w = &self.withheld;
        if w.all {
            return Vec::new();
        }
        self.state.keys().filter(|k| !w.keys.contains(*k)).cloned().collect()
    }
}

type Pre = bindings::AdapterPre<CallState>;

/// One compiler's engine and its linker (the same host functions).
#[derive(Clone)]
struct Tier {
    engine: Engine,
    linker: Linker<CallState>,
}

/// A component's code: Cranelift's (from the disk cache or compiled), and
/// Winch's for the calls that come before Cranelift's is ready.
#[derive(Default)]
struct Prepared {
    optimized: OnceCell<Pre>,
    baseline: OnceCell<Pre>,
    /// Cranelift's compile was started behind the baseline.
    optimizing: AtomicBool,
}

/// How surely a call would run failed closed ([`Executor::fails_closed`]),
/// with what the host cannot check for (each credential, why, the fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailsClosed {
    /// Whatever the guest does: its output will be withheld.
    Certainly(String),
    /// If the guest reads what it may (a file, a response, its state).
    Possibly(String),
}

impl FailsClosed {
    /// What the host cannot check for.
    pub fn why(&self) -> &str {
        match self {
            FailsClosed::Certainly(why) | FailsClosed::Possibly(why) => why,
        }
    }
}

/// The sandbox.
pub struct Executor {
    optimized: Tier,
    /// `None` where Winch does not run (not x86_64) or when turned off.
    baseline: Option<Tier>,
    settings: ExecutorSettings,
    cache_key: String,
    /// Read on every call; written once per component (and when Cranelift's code replaces Winch's).
    prepared: Arc<RwLock<DigestMap<Arc<Prepared>>>>,
    /// Read on every call (availability); written when a component fails to load.
    unhealthy: RwLock<DigestMap<String>>,
    /// Whether `unhealthy` holds any: most hosts never have one, and their
    /// calls then skip its lock.
    any_unhealthy: AtomicBool,
    instantiations: AtomicU64,
    baseline_instantiations: AtomicU64,
    compilations: Arc<AtomicU64>,
    baseline_compilations: Arc<AtomicU64>,
    /// Advances the epoch while guests run; parked when the host is idle.
    ticker: Ticker,
    admission: Admission,
    /// Compilations running at once; a compile waits for one, under its own time limit.
    compiles: Arc<tokio::sync::Semaphore>,
    /// Cranelift compiles behind the baseline tier, at once.
    optimizing: Arc<tokio::sync::Semaphore>,
    /// Those compiles, until [`Executor::settle`] awaits them.
    behind: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Outbound requests in flight and name lookups in the whole host,
    /// each Tool drawing at most its share of each.
    http_slots: outbound::HostPools,
    /// Why the cache directory is not used, if it is not trusted (said once).
    cache_distrust: std::sync::OnceLock<Option<String>>,
    /// Each component's pinned data, checked for secrets with a complete
    /// scanner: the verdict holds while the scanner does (pinned data does
    /// not change with the digest).
    pinned_checked: Arc<Mutex<HashMap<Digest, PinnedVerdict>>>,
}

/// A component's pinned data checked for secrets, and with what.
type PinnedVerdict = (Arc<super::scan::SecretScanner>, Result<(), String>);

/// Back-pressure: a call waits for a slot of its Tool and a slot of the
/// executor before it instantiates, so saturation queues calls instead of
/// failing them (the pooling allocator has exactly as many slots).
struct Admission {
    total: tokio::sync::Semaphore,
    total_limit: usize,
    per_tool_limit: usize,
    /// Read on every call, written once per Tool: concurrent calls share the
    /// read lock. Keys are installed Tool ids (only allowed calls get here),
    /// so a fast hasher does.
    tools: RwLock<HashMap<String, Arc<ToolSlots>, foldhash::fast::RandomState>>,
    peak: AtomicUsize,
}

/// One Tool's slots, its calls admitted to run, and the most of those at once.
struct ToolSlots {
    slots: tokio::sync::Semaphore,
    /// Calls of this Tool holding both slots (a call holding only its Tool's
    /// slot still queues for the executor's and runs nothing).
    running: AtomicUsize,
    peak: AtomicUsize,
}

/// A slot of one Tool, given back on drop (also when the call is dropped
/// while it waits for the executor's slot).
struct ToolSlot(Arc<ToolSlots>);

impl Drop for ToolSlot {
    fn drop(&mut self) {
        self.0.slots.add_permits(1);
    }
}

/// The slots of one admitted call; given back on drop.
struct Admitted<'a> {
    tool: ToolSlot,
    _total: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.tool.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admission {
    fn new(total: usize, per_tool: usize) -> Self {
        Admission {
            total: tokio::sync::Semaphore::new(total),
            total_limit: total,
            per_tool_limit: per_tool,
            tools: RwLock::new(HashMap::default()),
            peak: AtomicUsize::new(0),
        }
    }

    fn slots(&self, tool: &str) -> Arc<ToolSlots> {
        if let Some(t) = self.tools.read().unwrap_or_else(|p| p.into_inner()).get(tool) {
            return t.clone();
        }
        let mut tools = self.tools.write().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tools.get(tool) {
            return t.clone();
        }
        let t = Arc::new(ToolSlots {
            slots: tokio::sync::Semaphore::new(self.per_tool_limit),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        });
        tools.insert(tool.to_owned(), t.clone());
        t
    }

    async fn admit(&self, tool: &str) -> Admitted<'_> {
        let slots = self.slots(tool);
        // Tool slot first: a call waiting on its own Tool holds no executor slot.
        permit(&slots.slots).await.forget();
        let tool_slot = ToolSlot(slots);
        let total = permit(&self.total).await;
        // Held now: the limit less what is free (the executor's slot is taken
        // last, so every holder of one runs).
        raise(&self.peak, self.total_limit - self.total.available_permits());
        raise(&tool_slot.0.peak, tool_slot.0.running.fetch_add(1, Ordering::Relaxed) + 1);
        Admitted { tool: tool_slot, _total: total }
    }
}

/// `peak` raised to `n`; a load when it is not higher.
fn raise(peak: &AtomicUsize, n: usize) {
    if n > peak.load(Ordering::Relaxed) {
        peak.fetch_max(n, Ordering::Relaxed);
    }
}

/// A permit of `semaphore`: taken at once when one is free (no waiter
/// queued: tokio hands released permits to waiters first), else in turn.
async fn permit(semaphore: &tokio::sync::Semaphore) -> tokio::sync::SemaphorePermit<'_> {
    match semaphore.try_acquire() {
        Ok(p) => p,
        // The semaphores are never closed, so acquiring cannot fail.
        Err(_) => semaphore.acquire().await.unwrap_or_else(|_| unreachable!("never closed")),
    }
}

impl Executor {
    /// An engine with `settings`. Starts the epoch ticker thread.
    pub fn new(settings: ExecutorSettings) -> Result<Self, ExecutorError> {
        let n = u32::try_from(settings.limits.max_instances).unwrap_or(u32::MAX).max(1);
        filesystem::check_open_file_limit(&settings.limits);
        let optimized = tier(&settings, n, wasmtime::Strategy::Cranelift).map_err(ExecutorError::Engine)?;
        // Winch where wasmtime supports it; without it every first call waits for Cranelift.
        let baseline = if settings.baseline_tier && cfg!(target_arch = "x86_64") {
            match tier(&settings, n, wasmtime::Strategy::Winch) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!("no baseline compiler ({e:#}); first calls wait for Cranelift");
                    None
                }
            }
        } else {
            None
        };

        // The compiled-code cache is keyed by everything a compiled artifact
        // depends on: the engine's own compatibility hash (wasmtime version,
        // target, settings) and ours, as SHA-256. Only Cranelift's code is cached.
        let mut h = Sha256Hasher::default();
        optimized.engine.precompile_compatibility_hash().hash(&mut h);
        (env!("CARGO_PKG_VERSION"), settings.limits.memory_mib, n).hash(&mut h);
        (CORE_INSTANCES_PER_COMPONENT, MEMORIES_PER_COMPONENT, TABLES_PER_COMPONENT).hash(&mut h);
        let cache_key = h.hex()[..32].to_owned();

        let engines = std::iter::once(&optimized).chain(&baseline).map(|t| t.engine.weak()).collect();
        let ticker = Ticker::start(engines, EPOCH_TICK, PARK_AFTER)
            .map_err(|e| ExecutorError::Engine(wasmtime::Error::msg(format!("cannot start epoch thread: {e}"))))?;

        let per_tool = usize::try_from(settings.limits.max_instances_per_tool).unwrap_or(usize::MAX).max(1);
        let http_in_flight = usize::try_from(settings.limits.http_requests_in_flight_host).unwrap_or(usize::MAX).max(1);
        let admission = Admission::new(n as usize, per_tool);
        Ok(Executor {
            optimized,
            baseline,
            settings,
            cache_key,
            prepared: Arc::default(),
            unhealthy: RwLock::default(),
            any_unhealthy: AtomicBool::new(false),
            instantiations: AtomicU64::new(0),
            baseline_instantiations: AtomicU64::new(0),
            compilations: Arc::new(AtomicU64::new(0)),
            baseline_compilations: Arc::new(AtomicU64::new(0)),
            ticker,
            admission,
            compiles: Arc::new(tokio::sync::Semaphore::new(COMPILES_AT_ONCE)),
            optimizing: Arc::new(tokio::sync::Semaphore::new(OPTIMIZING_AT_ONCE)),
            behind: Mutex::new(Vec::new()),
            http_slots: outbound::HostPools::new(
                http_in_flight,
                outbound::Resolver::system(outbound::LOOKUPS_AT_ONCE),
                per_tool,
                n as usize,
            ),
            cache_distrust: std::sync::OnceLock::new(),
            pinned_checked: Arc::default(),
        })
    }

    /// The most instances that were alive at once: in total, and of `tool`.
    pub fn peak_instances(&self, tool: &str) -> (usize, usize) {
        let total = self.admission.peak.load(Ordering::Relaxed);
        let tools = self.admission.tools.read().unwrap_or_else(|p| p.into_inner());
        (total, tools.get(tool).map_or(0, |t| t.peak.load(Ordering::Relaxed)))
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &crate::config::Limits {
        &self.settings.limits
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

    /// Components compiled by the baseline tier (Winch), and instances made
    /// from that code.
    pub fn baseline_counts(&self) -> (u64, u64) {
        (self.baseline_compilations.load(Ordering::SeqCst), self.baseline_instantiations.load(Ordering::SeqCst))
    }

    /// Wait for the Cranelift compiles running behind the baseline tier (and
    /// their writes to the disk cache): before a host exits, or in a test.
    pub async fn settle(&self) {
        loop {
            let handles = std::mem::take(&mut *self.behind.lock().unwrap_or_else(|p| p.into_inner()));
            if handles.is_empty() {
                return;
            }
            for h in handles {
                let _ = h.await;
            }
        }
    }

    /// Epoch ticks so far: they stop while the host is idle (see [`Ticker`]).
    pub fn epoch_ticks(&self) -> u64 {
        self.ticker.ticks()
    }

    /// Why `digest`'s component cannot run, if it failed to load before.
    pub fn unhealthy(&self, digest: &Digest) -> Option<String> {
        if !self.any_unhealthy.load(Ordering::Acquire) {
            return None;
        }
        self.unhealthy.read().unwrap_or_else(|p| p.into_inner()).get(digest).cloned()
    }

    /// Whether a call of `candidate` with committed `state` would run
    /// failed closed in this process, and why; `None` when it would not. A
    /// configured credential this process has never read leaves nothing to
    /// look for ([`Watched::Unvouched`]): the output of a call that received
    /// anything from outside its arguments is withheld, its files with bytes
    /// and its requests refused. [`FailsClosed::Certainly`] when the guest
    /// receives something whatever it does (an `env` grant's values, handed
    /// over at start); [`FailsClosed::Possibly`] when it may (a directory, a
    /// host, pinned data, committed state: only what it reads counts).
    /// Reads the credentials' sources on the blocking pool.
    pub async fn fails_closed(&self, candidate: &Candidate, state: &BTreeMap<String, String>) -> Option<FailsClosed> {
        let g = &candidate.grant;
        let certainly = !g.env.is_empty();
        let possibly = !g.mounts.is_empty()
            || !g.hosts.is_empty()
            || !candidate.installed.component.pinned.is_empty()
            || !state.is_empty();
        if !(certainly || possibly) || g.watched.is_empty() {
            return None;
        }
        let watch = outbound::SecretWatch::new(g.watched.clone());
        let watched = tokio::task::spawn_blocking(move || watch.scanner(&outbound::HostRecords::default())).await;
        let why = match watched {
            Ok(Watched::Complete(_)) => return None,
            Ok(Watched::Unvouched { credentials, .. }) => credentials.why(),
            Err(_) => "the configured credentials (their check did not finish)".to_owned(),
        };
        Some(if certainly { FailsClosed::Certainly(why) } else { FailsClosed::Possibly(why) })
    }

    /// Run an allowed call with the Tool's committed `state` visible
    /// read-only: [`Executor::admit`], then [`Slot::run`]. The runtime takes
    /// the two steps itself, reading the state between them.
    pub async fn execute(
        &self,
        call: &AllowedCall<'_>,
        state: Arc<BTreeMap<String, String>>,
    ) -> Result<Execution, ExecutorError> {
        match self.admit(call, std::future::pending()).await? {
            Some(slot) => slot.run(state, std::future::pending(), None).await,
            None => Ok(Execution::cancelled()),
        }
    }

    /// A slot for `call` to run in: its component's code loaded (compiled
    /// on its first call), then a slot of its Tool and one of the executor
    /// (back-pressure: saturation queues calls instead of failing them).
    /// Waiting is not part of the call's deadline (queueing is the host's
    /// doing), and a call that waits holds no descriptor of its grants.
    /// `None`: `cancel` completed first (the caller withdrew the call) and
    /// nothing of it started. Read the Tool's state once the slot is taken:
    /// read before, it is as old as the queue is long.
    pub async fn admit<'a>(
        &'a self,
        call: &'a AllowedCall<'a>,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<Option<Slot<'a>>, ExecutorError> {
        tokio::pin!(cancel);
        let component = &call.candidate().installed.component;
        let entry = self.entry(component.digest);
        let code = if entry.optimized.get().is_some() {
            // Borrowed from the entry when the call runs: a clone would be three reference counts per call.
            Code::Ready(entry)
        } else {
            // Loading or compiling: boxed, so the future of every later call
            // does not carry the space of a compile's. A call withdrawn
            // while its code loads stops waiting for it. Before the slot:
            // a compile holds no slot other Tools' calls wait for.
            let (pre, baseline) = tokio::select! {
                biased;
                () = &mut cancel => return Ok(None),
                r = Box::pin(self.prepare(&component.path, component.digest)) => r?,
            };
            Code::Loaded(pre, baseline)
        };
        let admitted = tokio::select! {
            biased;
            () = &mut cancel => return Ok(None),
            admitted = self.admission.admit(&call.call().tool_id) => admitted,
        };
        Ok(Some(Slot { executor: self, call, code, _admitted: admitted }))
    }
}

/// The code a [`Slot`]'s call runs.
enum Code {
    /// Cranelift's, in this entry (set once, never unset).
    Ready(Arc<Prepared>),
    /// Loaded for this call: Winch's, with the entry Cranelift's compile
    /// fills once the call is over, or Cranelift's.
    Loaded(Pre, Option<Arc<Prepared>>),
}

/// An allowed call admitted to run ([`Executor::admit`]): its slots (given
/// back on drop) and its code. Running takes one, so no call runs without
/// its slots; a call run again (its state changed under it) runs in the
/// same slot, and its state is read again first.
pub struct Slot<'a> {
    executor: &'a Executor,
    call: &'a AllowedCall<'a>,
    code: Code,
    _admitted: Admitted<'a>,
}

impl Slot<'_> {
    /// Run the call with the Tool's committed `state` visible read-only,
    /// stopped when `cancel` completes (the caller withdrew the call): a
    /// running guest is dropped at once, and the result is
    /// [`ToolFailure::Cancelled`]. A call run again (its state changed under
    /// it) passes what its earlier runs left of its deadline as `within`:
    /// one deadline for the whole call's running, however often it runs
    /// (waiting for a slot is not part of it).
    pub async fn run(
        &self,
        state: Arc<BTreeMap<String, String>>,
        cancel: impl Future<Output = ()> + Send,
        within: Option<Duration>,
    ) -> Result<Execution, ExecutorError> {
        self.executor.run(self, state, cancel, within).await
    }
}

impl Executor {
    async fn run(
        &self,
        slot: &Slot<'_>,
        state: Arc<BTreeMap<String, String>>,
        cancel: impl Future<Output = ()> + Send,
        within: Option<Duration>,
    ) -> Result<Execution, ExecutorError> {
        tokio::pin!(cancel);
        let call = slot.call;
        let component = &call.candidate().installed.component;
        let (pre, baseline) = match &slot.code {
            Code::Loaded(pre, baseline) => (pre, baseline.clone()),
            Code::Ready(entry) => match entry.optimized.get() {
                Some(pre) => (pre, None),
                None => {
                    return Err(ExecutorError::Load {
                        path: component.path.clone(),
                        reason: "its compiled code went missing (a bug)".into(),
                    });
                }
            },
        };
        // Cranelift's compile starts once this run is over: until then
        // the call has the CPU Winch saved it.
        let _optimize =
            OptimizeAfter { executor: self, entry: baseline, path: &component.path, digest: component.digest };
        let limits = &self.settings.limits;
        let grant = &call.candidate().grant;
        // Before any guest code (instantiation runs some): an idle ticker wakes.
        let _running = self.ticker.hold();
        let started = Instant::now();
        let timeout = Duration::from_millis(limits.timeout_ms);
        let ends = started + within.map_or(timeout, |w| w.min(timeout));
        // With no credential configured (most hosts), nothing to look for: `None`.
        let secrets = CallSecrets::new(&grant.watched, limits.file_check_mib);
        let capture = (limits.capture_kib as usize) << 10;
        // With secrets to look for, a capture keeps what follows its cut too,
        // so a secret written across the cut is found (and then cut).
        let lookahead = if secrets.is_some() { withhold::LOOKAHEAD } else { 0 };
        let (stdout, stderr, log) = Capture::three_with_lookahead(capture, lookahead);
        // What the call wrote is read through this handle once it is over.
        let captured = log.clone();

        let wasi = sandbox(grant, stdout, stderr)
            .map_err(|reason| ExecutorError::Instantiate { path: component.path.clone(), reason })?;
        let outbound = OutboundPolicy::new(
            grant.hosts.clone(),
            grant.credentials.clone(),
            self.http_limits(),
            grant.watched.clone(),
            // A call granted no destination sends nothing: no share to look up.
            if grant.hosts.is_empty() {
                self.http_slots.no_network()
            } else {
                self.http_slots.for_tool(&call.call().tool_id)
            },
        );
        let state = CallState {
            wasi,
            http: self.http_ctx(),
            outbound,
            table: self.resource_table(),
            limits: StoreLimitsBuilder::new()
                .memory_size((limits.memory_mib as usize) << 20)
                .trap_on_grow_failure(true)
                .build(),
            state,
            withheld: Withheld::default(),
            log,
            pinned: component.pinned.clone(),
            held: Held::new(limits, secrets.clone()),
            http_held: HttpHeld::new(limits),
            ends,
        };
        let mut store = Store::new(pre.engine(), state);
        store.limiter(|s| &mut s.limits);
        // At every epoch tick: stopped past its deadline, else a yield to
        // the async runtime (a guest that spins cannot starve other calls on
        // its thread). The timer below ends a call waiting on the host.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(stop_at_deadline);

        let c = call.call();
        let arguments = call.arguments_json();
        let raw = {
            let run = async {
                if let Some(secrets) = &secrets {
                    let data = store.data();
                    if !data.state.is_empty() || !data.pinned.is_empty() {
                        let (state, pinned) = (data.state.clone(), data.pinned.clone());
                        store.data_mut().withheld = self.check_kept(secrets, component.digest, state, pinned).await;
                    }
                }
                self.instantiations.fetch_add(1, Ordering::SeqCst);
                if !Engine::same(pre.engine(), &self.optimized.engine) {
                    self.baseline_instantiations.fetch_add(1, Ordering::SeqCst);
                }
                let plugin = pre.instantiate_async(&mut store).await?;
                plugin.toolgate_plugin_tool().call_call(&mut store, &c.tool_id, arguments).await
            };
            let mut run = std::pin::pin!(run);
            // Most calls end within their first poll (the guest runs until it
            // returns, an epoch tick makes it yield, or it waits on the host):
            // they need no timer. One that does not gets the rest of its deadline,
            // which only a pending call can overrun.
            let first = std::future::poll_fn(|cx| match cancel.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => Poll::Ready(Some(run.as_mut().poll(cx))),
            })
            .await;
            match first {
                None => None,
                Some(Poll::Ready(r)) => Some(r),
                Some(Poll::Pending) => tokio::select! {
                    biased;
                    () = &mut cancel => None,
                    r = tokio::time::timeout_at(ends.into(), run) => Some(match r {
                        Ok(r) => r,
                        Err(_) => Err(wasmtime::Error::new(Trap::Interrupt)),
                    }),
                },
            }
        };
        let Some(raw) = raw else {
            drop(store);
            return Ok(Execution::cancelled());
        };
        // The instances, then every handle the guest held (requests in
        // flight among them) go before what the call left is read.
        let CallState { outbound, table, held, http_held, .. } = store.into_data();
        drop(table);
        let (mut host, mut host_dropped) = outbound.take_quoting_records();
        host.extend(held.records().map(Record::host));
        host.extend(http_held.record().map(Record::host));
        let kept = captured.take_all();
        let output_limit = (limits.output_kib as usize) << 10;
        // What the host does with the output once the guest returned — its
        // schema, the secret check — is work the Tool chose the size of:
        // it counts toward the call's deadline (`CHECK_GRACE` past it), so
        // output slow to check, returned just before the deadline, cannot
        // keep the call (its slot, a blocking thread) past it.
        // Without secrets to look for, the host's records need no check:
        // kept whatever the checks of the output come to.
        let (mut records, host) = if secrets.is_none() { (host, Vec::new()) } else { (Vec::new(), host) };
        let records_checked = host.len() as u64;
        let checks = async {
            let (mut result, mut kept, mut host) = (
                match raw {
                    Ok(Ok(out)) => self.convert(out, &call.candidate().installed.tool).await,
                    Ok(Err(wit_types::ToolError::InvalidArguments(m))) => Err(ToolFailure::InvalidArguments(m)),
                    Ok(Err(wit_types::ToolError::Failed(m))) => Err(ToolFailure::Failed(m)),
                    Err(e) => Err(classify(&e, limits, &kept.stderr)),
                },
                kept,
                host,
            );
            let mut dropped = 0;
            if let Some(secrets) = secrets {
                if !grant.env.is_empty() {
                    secrets.received("the values of its `env` grant");
                }
                // Stopped between its parts once the deadline dropped it.
                let stop = Arc::new(AtomicBool::new(false));
                let _stop = withhold::CancelOnDrop(stop.clone());
                // CPU in proportion to what the guest wrote: on the blocking pool.
                let checked = tokio::task::spawn_blocking(move || {
                    let dropped =
                        withhold_secrets(&secrets, &mut result, &mut kept, &mut host, (output_limit, capture), &stop);
                    (result, kept, host, dropped)
                })
                .await;
                (result, kept, host) = match checked {
                    Ok((r, k, h, d)) => {
                        dropped = d;
                        (r, k, h)
                    }
                    // The host cannot vouch for what it did not check: nothing of it is kept.
                    Err(_) => unchecked(
                        "the host could not check the Tool's output for secrets; nothing it returned was kept".into(),
                        "the check of the call's output for secrets failed; its output and captures were withheld",
                    ),
                };
            }
            (result, kept, host, dropped)
        };
        let (result, kept, host, dropped) = within_deadline(ends + CHECK_GRACE, checks).await.unwrap_or_else(|| {
            let budget = ends.saturating_duration_since(started).as_millis();
            let (r, k, h) = unchecked(
                format!(
                    "the host could not finish checking the Tool's output within the call's {budget} ms deadline \
                     (and {} ms past it); nothing it returned was kept",
                    CHECK_GRACE.as_millis()
                ),
                "the checks of the call's output did not finish by its deadline; its output and captures were \
                 withheld",
            );
            // The records the check had not vouched for are gone: counted.
            (r, k, h, records_checked)
        });
        host_dropped += dropped;
        records.extend(host);
        let host = records;
        let kept = kept.cut_to(capture);
        let result = result.map_err(|failure| failure.bounded(output_limit).shortened());
        Ok(Execution {
            result,
            captured: Captured {
                stdout: kept.stdout,
                stderr: kept.stderr,
                log: kept.log,
                dropped: kept.dropped,
                host: host.into_iter().map(Record::into_line).collect(),
                host_dropped,
            },
            transport_failure: outbound.transport_failure(),
            ends: Some(ends),
        })
    }

    /// What of a call's committed `state` and the component's `pinned`
    /// data holds a watched secret ([`Withheld`]), checked on the blocking
    /// pool (CPU in proportion to their size, bounded by
    /// `limits.file_check_mib` each) and stopped when the call is dropped;
    /// each withheld part is recorded. A check that cannot finish withholds
    /// all of both.
    async fn check_kept(
        &self,
        secrets: &Arc<CallSecrets>,
        digest: Digest,
        state: Arc<BTreeMap<String, String>>,
        pinned: Arc<[u8]>,
    ) -> Withheld {
        let cancel = Arc::new(AtomicBool::new(false));
        let _stop = withhold::CancelOnDrop(cancel.clone());
        let (secrets, verdicts) = (secrets.clone(), self.pinned_checked.clone());
        let check = tokio::task::spawn_blocking(move || {
            let mut withheld = Withheld::default();
            let watched = secrets.scanner();
            let scanner = withhold::scanner_of(&watched);
            if !pinned.is_empty() {
                let complete = secrets.complete_scanner();
                let known = complete.as_ref().and_then(|s| {
                    let verdicts = verdicts.lock().unwrap_or_else(|p| p.into_inner());
                    verdicts.get(&digest).filter(|(with, _)| Arc::ptr_eq(with, s)).map(|(_, v)| v.clone())
                });
                let verdict = known.unwrap_or_else(|| {
                    let v = secrets.check_kept(scanner, &pinned, &cancel);
                    if let Some(s) = complete
                        && !cancel.load(Ordering::Relaxed)
                    {
                        verdicts.lock().unwrap_or_else(|p| p.into_inner()).insert(digest, (s, v.clone()));
                    }
                    v
                });
                if let Err(why) = verdict {
                    secrets.record(format!("the component's pinned data was withheld from the guest: {why}"));
                    withheld.pinned = true;
                }
            }
            for (key, value) in state.iter() {
                if cancel.load(Ordering::Relaxed) {
                    // The call is over: nothing of it is read any more.
                    withheld.all = true;
                    break;
                }
                if let Err(why) = secrets.check_kept(scanner, key.as_bytes(), &cancel) {
                    secrets.record(format!("a key of the Tool's committed state was withheld from the guest: {why}"));
                    withheld.keys.insert(key.clone());
                } else if let Err(why) = secrets.check_kept(scanner, value.as_bytes(), &cancel) {
                    secrets.record(format!("a value of the Tool's committed state was withheld from the guest: {why}"));
                    withheld.values.insert(key.clone());
                }
            }
            withheld
        });
        check.await.unwrap_or_else(|_| Withheld { all: true, ..Withheld::default() })
    }

    fn http_limits(&self) -> HttpLimits {
        let l = &self.settings.limits;
        HttpLimits {
            request_bytes: (l.http_request_kib as usize) << 10,
            response_bytes: (l.http_response_kib as usize) << 10,
            timeout: Duration::from_millis(l.http_timeout_ms),
            in_flight_per_call: l.http_requests_in_flight as usize,
            response_bytes_per_call: (l.http_response_total_kib as usize) << 10,
        }
    }

    /// The `wasi:http` context of a call: bounded header fields.
    fn http_ctx(&self) -> WasiHttpCtx {
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit((self.settings.limits.http_field_kib as usize) << 10);
        http
    }

    /// A call's resource table: bounded, so a guest cannot make the host
    /// allocate handles (streams, fields, requests) without end.
    fn resource_table(&self) -> ResourceTable {
        let mut table = ResourceTable::new();
        table.set_max_capacity(self.settings.limits.resource_table_entries as usize);
        table
    }

    async fn convert(&self, out: wit_types::ToolOutput, tool: &Arc<CheckedTool>) -> Result<ToolOutput, ToolFailure> {
        let limit = (self.settings.limits.output_kib as usize) << 10;
        let size = output_size(&out);
        if size > limit {
            return Err(ToolFailure::OutputTooLarge { size, limit });
        }
        // Large content is parsed and held to its schema on the blocking
        // pool, as large arguments are (`descriptor::SCHEMA_CHECK_INLINE_BYTES`).
        let (content, commands) = (out.content, out.commands);
        let content = if size <= catalog::descriptor::SCHEMA_CHECK_INLINE_BYTES {
            checked_content(content, tool)?
        } else {
            let tool = tool.clone();
            tokio::task::spawn_blocking(move || checked_content(content, &tool)).await.unwrap_or_else(|e| {
                Err(ToolFailure::Malformed(format!("the host could not check the output against its schema ({e})")))
            })?
        };
        let commands = commands
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

    /// Compile the component at `path` (which must have `digest`) into the
    /// disk cache now, instead of on its first allowed call. Only for
    /// components an operator pinned: see `host::precompile`.
    pub async fn precompile(&self, path: &Path, digest: Digest) -> Result<(), ExecutorError> {
        let entry = self.entry(digest);
        self.optimized_pre(&entry, path, digest).await.map(|_| ())
    }

    fn entry(&self, digest: Digest) -> Arc<Prepared> {
        if let Some(e) = self.prepared.read().unwrap_or_else(|p| p.into_inner()).get(&digest) {
            return e.clone();
        }
        self.prepared.write().unwrap_or_else(|p| p.into_inner()).entry(digest).or_default().clone()
    }

    /// The `InstancePre` a call runs: Cranelift's code when it is ready or in
    /// the disk cache; otherwise Winch's (compiled once, on the first allowed
    /// call), with the entry that Cranelift's compile should fill behind it.
    /// A component Winch cannot compile (a proposal it lacks) waits for
    /// Cranelift.
    async fn prepare(&self, path: &Path, digest: Digest) -> Result<(Pre, Option<Arc<Prepared>>), ExecutorError> {
        let entry = self.entry(digest);
        if let Some(pre) = entry.optimized.get() {
            return Ok((pre.clone(), None));
        }
        let cached = self.cache_file(digest).is_some_and(|c| trusted_cache_file(&c));
        if let (Some(baseline), false) = (&self.baseline, cached) {
            let loader = self.loader(baseline, None, &self.compiles, &self.baseline_compilations);
            match entry.baseline.get_or_try_init(|| loader.load(path.to_owned(), digest)).await {
                Ok(pre) => return Ok((pre.clone(), Some(entry.clone()))),
                // Past the limit on Winch, Cranelift (slower) would be too:
                // unhealthy now, not a second compile that holds the other slot.
                Err(Failed::TooSlow(e)) => {
                    self.mark_unhealthy(digest, &e);
                    return Err(e);
                }
                // Cranelift decides, and its error is the one reported.
                Err(Failed::Other(ExecutorError::Load { reason, .. })) => {
                    tracing::debug!("{}: the baseline compiler cannot compile it ({reason})", path.display())
                }
                Err(Failed::Other(e)) => return Err(e),
            }
        }
        self.optimized_pre(&entry, path, digest).await.map(|pre| (pre, None))
    }

    async fn optimized_pre(&self, entry: &Prepared, path: &Path, digest: Digest) -> Result<Pre, ExecutorError> {
        let loader = self.loader(&self.optimized, self.cache_file(digest), &self.compiles, &self.compilations);
        let pre = entry
            .optimized
            .get_or_try_init(|| async {
                let r = loader.load(path.to_owned(), digest).await.map_err(ExecutorError::from);
                if let Err(e @ ExecutorError::Load { .. }) = &r {
                    self.mark_unhealthy(digest, e);
                }
                r
            })
            .await?;
        Ok(pre.clone())
    }

    /// Blocked from now on (until a reload): it cannot be compiled or linked.
    fn mark_unhealthy(&self, digest: Digest, why: &ExecutorError) {
        // The reason is shown wherever the component's Tools are refused —
        // to the model too: without the host's paths or the loader's words,
        // which go to the operator's log.
        tracing::warn!("component {digest} is marked unhealthy until a reload: {why}");
        let shown = match why.what_happened() {
            Some(what) => format!("{what}; the host's operator must fix it (the host's log holds the cause)"),
            None => why.to_string(),
        };
        self.unhealthy.write().unwrap_or_else(|p| p.into_inner()).insert(digest, shown);
        self.any_unhealthy.store(true, Ordering::Release);
    }

    /// Start Cranelift's compile of a component that runs on Winch's code
    /// (once); later calls take Cranelift's code when it is ready, and Winch's
    /// is dropped with the last call using it. A failure keeps the component
    /// on Winch's code.
    fn optimize_behind(&self, entry: &Arc<Prepared>, path: &Path, digest: Digest) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if entry.optimizing.swap(true, Ordering::SeqCst) {
            return;
        }
        let loader = self.loader(&self.optimized, self.cache_file(digest), &self.optimizing, &self.compilations);
        let (entry, path, prepared) = (entry.clone(), path.to_owned(), self.prepared.clone());
        let handle = runtime.spawn(async move {
            match loader.load(path.clone(), digest).await.map_err(ExecutorError::from) {
                Ok(pre) => {
                    let optimized = Prepared { optimized: OnceCell::new_with(Some(pre)), ..Prepared::default() };
                    let mut map = prepared.write().unwrap_or_else(|p| p.into_inner());
                    // Unless a reload replaced the entry meanwhile.
                    if map.get(&digest).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                        map.insert(digest, Arc::new(optimized));
                    }
                }
                // The host was busy (no compile slot or thread within the
                // limit): a later call starts it again.
                Err(e @ ExecutorError::Instantiate { .. }) => {
                    entry.optimizing.store(false, Ordering::SeqCst);
                    tracing::debug!(
                        "{}: Cranelift's compile did not start ({e}); a later call tries again",
                        path.display()
                    )
                }
                Err(e) => tracing::warn!(
                    "{}: compiling it with Cranelift failed ({e}); it keeps running on Winch's code",
                    path.display()
                ),
            }
        });
        let mut behind = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        behind.retain(|h| !h.is_finished());
        behind.push(handle);
    }

    /// Where Cranelift's code for `digest` is cached, if the cache is trusted.
    fn cache_file(&self, digest: Digest) -> Option<PathBuf> {
        self.trusted_cache_dir().map(|d| d.join(format!("{}-{}.cwasm", digest.hex(), self.cache_key)))
    }

    fn loader(
        &self,
        tier: &Tier,
        cache_file: Option<PathBuf>,
        slots: &Arc<tokio::sync::Semaphore>,
        counter: &Arc<AtomicU64>,
    ) -> Loader {
        Loader {
            tier: tier.clone(),
            cache_file,
            slots: slots.clone(),
            counter: counter.clone(),
            timeout: Duration::from_millis(self.settings.limits.compile_timeout_ms),
            memory_mib: self.settings.limits.memory_mib,
        }
    }

    /// The cache directory, if it may be trusted: created owner-only, and
    /// checked (not just set) to be a directory owned by this user with no
    /// group or other access. A directory that fails the check is neither
    /// read nor written; the host says so once and compiles from source.
    fn trusted_cache_dir(&self) -> Option<&Path> {
        let dir = self.settings.cache_dir.as_deref()?;
        let distrust = self.cache_distrust.get_or_init(|| {
            let why = prepare_cache_dir(dir).err();
            if let Some(why) = &why {
                tracing::warn!("not using the compiled-code cache {}: {why}", dir.display());
            }
            why
        });
        distrust.is_none().then_some(dir)
    }

    /// Call a component's `describe` export in a sandbox with no authority.
    /// Used by `toolgate pack` only; a host never calls it.
    pub async fn describe(&self, bytes: &[u8]) -> Result<String, ExecutorError> {
        let path = PathBuf::from("<pack input>");
        // Compiled once, run once: the baseline compiler's job, where it can.
        let baseline = self.baseline.as_ref().and_then(|t| Component::new(&t.engine, bytes).ok().map(|c| (t, c)));
        let (tier, component) = match baseline {
            Some(b) => b,
            None => (
                &self.optimized,
                Component::new(&self.optimized.engine, bytes)
                    .map_err(|e| ExecutorError::Load { path: path.clone(), reason: format!("{e:#}") })?,
            ),
        };
        let pre = tier
            .linker
            .instantiate_pre(&component)
            .map_err(|e| ExecutorError::Load { path: path.clone(), reason: format!("{e:#}") })?;
        let pre = bindings::AdapterPre::new(pre)
            .map_err(|e| ExecutorError::Load { path: path.clone(), reason: format!("{e:#}") })?;
        let pinned: Arc<[u8]> = catalog::descriptor::read_pinned(bytes)
            .map_err(|e| ExecutorError::Load { path: path.clone(), reason: e.to_string() })?
            .into();
        let limits = &self.settings.limits;
        let no_http = HttpLimits {
            request_bytes: 0,
            response_bytes: 0,
            timeout: Duration::from_millis(1),
            in_flight_per_call: 1,
            response_bytes_per_call: 0,
        };
        let state = CallState {
            wasi: WasiCtx::builder().build(),
            http: self.http_ctx(),
            // No destinations: `describe` gets no network.
            outbound: OutboundPolicy::new(
                Arc::default(),
                Arc::default(),
                no_http,
                Arc::default(),
                self.http_slots.no_network(),
            ),
            table: self.resource_table(),
            limits: StoreLimitsBuilder::new()
                .memory_size((limits.memory_mib as usize) << 20)
                .trap_on_grow_failure(true)
                .build(),
            state: Arc::default(),
            withheld: Withheld::default(),
            log: Capture::new(0),
            pinned,
            held: Held::new(limits, None),
            http_held: HttpHeld::new(limits),
            ends: Instant::now() + Duration::from_millis(limits.timeout_ms),
        };
        let mut store = Store::new(&tier.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(limits.timeout_ms.div_ceil(EPOCH_TICK.as_millis() as u64).max(1));
        store.epoch_deadline_trap();
        let _running = self.ticker.hold();
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

/// At each epoch tick of a running guest: stop it once its deadline has
/// passed, else yield to the async runtime (a guest that spins cannot starve
/// other calls on its thread). The guest's own code enforces the deadline:
/// tokio's timer (which ends a call waiting on the host) is looked at only
/// when a worker thread parks or between batches of tasks, and with every
/// worker running guests that yield at each tick it fired hundreds of
/// milliseconds late — a guest finishing meanwhile was committed as if
/// within its deadline. Captures nothing: no allocation per call.
fn stop_at_deadline(store: wasmtime::StoreContextMut<'_, CallState>) -> wasmtime::Result<UpdateDeadline> {
    Ok(if Instant::now() >= store.data().ends { UpdateDeadline::Interrupt } else { UpdateDeadline::Yield(1) })
}

/// Starts Cranelift's compile behind a call that ran on Winch's code, when
/// the call is over (or dropped).
struct OptimizeAfter<'a> {
    executor: &'a Executor,
    entry: Option<Arc<Prepared>>,
    path: &'a Path,
    digest: Digest,
}

impl Drop for OptimizeAfter<'_> {
    fn drop(&mut self) {
        if let Some(entry) = &self.entry {
            self.executor.optimize_behind(entry, self.path, self.digest);
        }
    }
}

/// An engine with the host's settings and `strategy`, and its linker.
fn tier(settings: &ExecutorSettings, n: u32, strategy: wasmtime::Strategy) -> wasmtime::Result<Tier> {
    let mut pool = PoolingAllocationConfig::new();
    // One pooling slot per admitted instance: the admission semaphore
    // guarantees the pool is never exhausted, so saturation waits, never fails.
    // Per-component caps equal each slot's share of the totals, so one
    // component cannot drain what other calls' instances then fail on.
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .total_memories(n.saturating_mul(MEMORIES_PER_COMPONENT))
        .total_tables(n.saturating_mul(TABLES_PER_COMPONENT))
        .total_stacks(n)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memory_size((settings.limits.memory_mib as usize) << 20);
    slot_reuse(&mut pool);
    let mut config = Config::new();
    config
        .strategy(strategy)
        .wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    if matches!(strategy, wasmtime::Strategy::Winch) {
        // Winch compiles the function bodies; Cranelift still compiles a
        // trampoline per escaping function (thousands in CPython), which cost
        // more than Winch itself. Unoptimized trampolines and no address map
        // (wasm offsets in backtraces; trap codes stay) cut ~15% of a
        // baseline compile; the code lives minutes and is never cached.
        config.cranelift_opt_level(wasmtime::OptLevel::None).generate_address_map(false);
    }
    let engine = Engine::new(&config)?;
    let mut linker = Linker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    // Special files refused and what a call holds open counted, in front of wasmtime-wasi's own.
    filesystem::add_to_linker(&mut linker)?;
    // The only network a guest gets: HTTP through the outbound policy.
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    // What a call holds for requests not yet sent counted, in front of wasmtime-wasi-http's own.
    http_held::add_to_linker(&mut linker)?;
    bindings::Adapter::add_to_linker::<CallState, wasmtime::component::HasSelf<CallState>>(&mut linker, |s| s)?;
    Ok(Tier { engine, linker })
}

/// What compiling one component needs, owned: a compile behind the baseline
/// outlives the call that started it.
struct Loader {
    tier: Tier,
    /// Read first, written after a compile (Cranelift's code only).
    cache_file: Option<PathBuf>,
    /// Compiles at once (a compile waits for a slot at most its time limit;
    /// the compile job holds it until it ends, also past its limit).
    slots: Arc<tokio::sync::Semaphore>,
    /// Counts the compiles this loader does.
    counter: Arc<AtomicU64>,
    timeout: Duration,
    memory_mib: u64,
}

impl Loader {
    async fn load(self, path: PathBuf, digest: Digest) -> Result<Pre, Failed> {
        let Loader { tier, cache_file, slots, counter, timeout, memory_mib } = self;
        // Cached code is mapped, not compiled: it takes no compile slot, so
        // a first call after a restart never waits behind another
        // component's compile (which may run long past its limit).
        if let Some(c) = cache_file.clone() {
            let engine = tier.engine.clone();
            let mapped = tokio::task::spawn_blocking(move || {
                // SAFETY: the file is a regular file owned by this user with
                // no group or other access, in a directory with the same
                // checks, written only by this host (atomic renames) and keyed
                // by a SHA-256 of the engine settings: as trusted as the host
                // binary. A failed load falls back to compiling from the
                // verified source.
                trusted_cache_file(&c).then(|| unsafe { Component::deserialize_file(&engine, &c) }.ok()).flatten()
            });
            match tokio::time::timeout(timeout, mapped).await {
                Ok(Ok(Some(component))) => return link(&tier, &component, path),
                Ok(_) => {}
                Err(_) => return Err(Failed::Other(no_thread(path, timeout))),
            }
        }
        // Compiling is CPU the host shares: a few at a time, under a time
        // limit. The slot goes with the compile job, which holds it to its
        // end: a compile that ran past its limit keeps running (a compiler
        // cannot be interrupted) and still counts as one of the few. Waiting
        // for a slot is bounded by the same limit: the slots may be held by
        // compiles that run on past theirs.
        let slot = match tokio::time::timeout(timeout, slots.acquire_owned()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) => {
                return Err(Failed::Other(ExecutorError::Load { path, reason: "the host is shutting down".into() }));
            }
            Err(_) => {
                return Err(Failed::Other(ExecutorError::Instantiate {
                    path,
                    reason: format!(
                        "the host was compiling other components and had no compile slot free within \
                         `limits.compile_timeout_ms` ({} ms): it is busy; try again",
                        timeout.as_millis()
                    ),
                }));
            }
        };
        let engine = tier.engine.clone();
        let path_owned = path.clone();
        // Told when the job starts: the limit counts from then, not from
        // the queue of the blocking pool it waits in first.
        let (started, began) = tokio::sync::oneshot::channel::<()>();
        let compile = tokio::task::spawn_blocking(move || -> Result<Component, ExecutorError> {
            let _slot = slot;
            if started.send(()).is_err() {
                // The call gave up before a thread took the job: nothing to do.
                return Err(ExecutorError::Instantiate { path: path_owned, reason: "abandoned".into() });
            }
            let bytes = catalog::read_bounded(&path_owned)
                .map_err(|reason| ExecutorError::Read { path: path_owned.clone(), reason })?;
            if Digest::of(&bytes) != digest {
                return Err(ExecutorError::Changed { path: path_owned.clone(), was: digest });
            }
            let comp = Component::new(&engine, &bytes).map_err(|e| ExecutorError::Load {
                path: path_owned.clone(),
                reason: compile_failure(&e, memory_mib),
            })?;
            if let Some(c) = &cache_file {
                write_cache(c, &comp);
            }
            Ok(comp)
        });
        // A job no thread took within the limit says nothing about the
        // component (the host's blocking threads are busy): the call fails,
        // and the component stays healthy.
        match tokio::time::timeout(timeout, began).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(Failed::Other(ExecutorError::Instantiate {
                    path,
                    reason: "the host is shutting down".into(),
                }));
            }
            Err(_) => return Err(Failed::Other(no_thread(path, timeout))),
        }
        let component = match tokio::time::timeout(timeout, compile).await {
            Ok(joined) => joined.map_err(|e| ExecutorError::Load {
                path: path.clone(),
                reason: format!("compile task failed: {e}"),
            })??,
            // A compiler cannot be interrupted: the compile finishes in the
            // background and is dropped; the component is marked unhealthy.
            Err(_) => {
                return Err(Failed::TooSlow(ExecutorError::Load {
                    path,
                    reason: format!(
                        "compiling it took longer than `limits.compile_timeout_ms` ({} ms); raise the limit if the component is trusted",
                        timeout.as_millis()
                    ),
                }));
            }
        };
        counter.fetch_add(1, Ordering::SeqCst);
        link(&tier, &component, path)
    }
}

/// Why loading a component failed: its compile ran past
/// `limits.compile_timeout_ms` (on any tier: the component is unhealthy), or
/// anything else.
#[derive(Debug)]
enum Failed {
    TooSlow(ExecutorError),
    Other(ExecutorError),
}

impl From<ExecutorError> for Failed {
    fn from(e: ExecutorError) -> Self {
        Failed::Other(e)
    }
}

impl From<Failed> for ExecutorError {
    fn from(f: Failed) -> Self {
        match f {
            Failed::TooSlow(e) | Failed::Other(e) => e,
        }
    }
}

/// A job no blocking thread took within the limit.
fn no_thread(path: PathBuf, timeout: Duration) -> ExecutorError {
    ExecutorError::Instantiate {
        path,
        reason: format!(
            "the host had no thread free to compile it within `limits.compile_timeout_ms` ({} ms): it is busy; try again",
            timeout.as_millis()
        ),
    }
}

/// A loaded component linked against the tier's host functions.
fn link(tier: &Tier, component: &Component, path: PathBuf) -> Result<Pre, Failed> {
    let pre = tier.linker.instantiate_pre(component).map_err(|e| ExecutorError::Load {
        path: path.clone(),
        reason: format!("{e:#}; the component imports something this host does not provide"),
    })?;
    Ok(bindings::AdapterPre::new(pre).map_err(|e| ExecutorError::Load {
        path,
        reason: format!("{e:#}; build it with toolgate-sdk's `export_tools!`"),
    })?)
}

/// The WASI context of one call: exactly the granted mounts and environment,
/// stdout/stderr into bounded captures, and nothing else — no inherited stdio,
/// no arguments, no sockets, no name lookup. (wasmtime-wasi 48 defaults to
/// that; the switches are said here so a changed default cannot widen it.
/// Its default address check refuses every address; setting our own would
/// cost an allocation per call, and `sockets_and_name_lookup_are_off` tests
/// the whole.)
fn sandbox(grant: &EffectiveGrant, stdout: Capture, stderr: Capture) -> Result<WasiCtx, String> {
    let mut b = WasiCtx::builder();
    b.stdout(stdout).stderr(stderr);
    b.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
    // The host allocates and fills what a guest asks of `get-random-bytes`
    // (and the insecure one) before copying it in: wasmtime-wasi's bound
    // is 64 MiB a request, outside the guest's memory limit.
    b.max_random_size(MAX_RANDOM_BYTES);
    for (k, v) in &grant.env {
        b.env(k, v);
    }
    for m in &grant.mounts {
        let perms = match m.access {
            Access::Read => FsPerms::ReadOnly,
            Access::ReadWrite => FsPerms::ReadWrite,
        };
        // The directory the grant was bound to (at load), whatever is at the path now.
        let dir = m.bound.path(&m.host)?;
        // cap-std underneath: `..`, absolute paths and symlinks cannot leave the directory.
        b.preopened_dir(&dir, &m.guest, perms).map_err(|e| {
            format!(
                "cannot open granted directory {} for {}: {e:#}; check the [[grants]] entry",
                m.host.display(),
                m.guest
            )
        })?;
    }
    Ok(b.build())
}

/// Most bytes one `get-random-bytes` (or `get-insecure-random-bytes`) may
/// ask for; a request for more traps, as wasmtime-wasi's own bound does.
/// Key material and seeds take a few dozen bytes; a guest that wants more
/// asks again.
pub const MAX_RANDOM_BYTES: u64 = 64 << 10;

/// The effective user id, owner of everything this host writes.
#[cfg(unix)]
fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Make `dir` (0700) if needed, then check it may be trusted.
fn prepare_cache_dir(dir: &Path) -> Result<(), String> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| format!("cannot create it: {e}"))?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_dir() {
        return Err("it is not a directory".into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != me() {
            return Err(format!("it is owned by uid {}, not this user (uid {})", meta.uid(), me()));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(format!("its mode is {:o}; run `chmod 700` on it", meta.mode() & 0o777));
        }
    }
    Ok(())
}

/// Whether a cached artifact may be loaded: a regular file (not a link),
/// owned by this user, with no group or other access.
fn trusted_cache_file(path: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    if !meta.is_file() {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != me() || meta.mode() & 0o077 != 0 {
            tracing::warn!("ignoring cached artifact {}: wrong owner or mode; recompiling", path.display());
            return false;
        }
        // A second name (a hard link, e.g. inside a grant a Tool can write)
        // is a way to change the native code this host would load.
        if meta.nlink() != 1 {
            tracing::warn!(
                "ignoring cached artifact {}: it has another name (a hard link); recompiling",
                path.display()
            );
            return false;
        }
    }
    true
}

fn write_cache(path: &Path, component: &Component) {
    // Best effort: a cache that cannot be written only costs a recompile.
    let Ok(bytes) = component.serialize() else { return };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|mut f| std::io::Write::write_all(&mut f, &bytes));
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Withhold every part of a call's result and captures that holds a
/// configured secret, before the Step commit: the content and Commands
/// How long past a call's deadline the host's checks of its output (schema,
/// secrets) may run before nothing of the output is kept.
const CHECK_GRACE: Duration = Duration::from_secs(1);

/// `checks` if they finish by `by`; `None` otherwise (dropped then). Most
/// finish at their first poll and need no timer.
async fn within_deadline<T>(by: Instant, checks: impl Future<Output = T>) -> Option<T> {
    let mut checks = std::pin::pin!(checks);
    let first = std::future::poll_fn(|cx| Poll::Ready(checks.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(done) => Some(done),
        Poll::Pending => tokio::time::timeout_at(by.into(), checks).await.ok(),
    }
}

/// A call's output, error text and captures withheld because the host could
/// not check them (`why`, for the model), recorded as `record`.
fn unchecked(why: String, record: &str) -> (Result<ToolOutput, ToolFailure>, Kept, Vec<Record>) {
    (Err(ToolFailure::Withheld(why)), Kept::default(), vec![Record::host(record.to_owned())])
}

/// together (the output becomes [`ToolFailure::Withheld`], so nothing it
/// returned or changed is kept — a changed value would break its declared
/// output schema, a dropped Command half its changes), the guest's text in
/// a failure, each of stdout, stderr and log, each host record — each
/// replaced by a note naming the credential, and recorded. Text the host
/// cuts to a limit afterwards (`limit` for a failure's, `capture` for a
/// stream) is checked past the cut too. Returns the host records dropped
/// over their bound. Blocking: it reads the secrets' sources.
fn withhold_secrets(
    secrets: &CallSecrets,
    result: &mut Result<ToolOutput, ToolFailure>,
    kept: &mut Kept,
    host: &mut Vec<Record>,
    (limit, capture): (usize, usize),
    stop: &AtomicBool,
) -> u64 {
    // Once set, the caller has dropped what this returns: each part after is skipped.
    let stopped = || stop.load(Ordering::Relaxed);
    let mut unvouched_guest = false;
    let scanner = match secrets.scanner() {
        Watched::Complete(scanner) => scanner,
        // A credential the host never read (unset where it runs): files
        // with bytes were refused and no request sent, so what the guest
        // had is its arguments (the model's own) — and whatever it received
        // unrefused: its state (committed by calls that may have run while
        // the credential was unreadable, so never checked for it), the
        // literals of its `env` grant, names from its directories, its
        // pinned data. Having any of those, nothing it wrote can be vouched
        // for: all of it is withheld, and so is its text in the host's
        // records (a path it opened, a host it asked for). Having none, it
        // is checked for the secrets there are.
        Watched::Unvouched { scanner, credentials } => {
            let received = secrets.received_from_outside();
            if !received.is_empty() {
                unvouched_guest = true;
                secrets.record(format!(
                    "the Tool's output, error text and captures were withheld, and the guest's text left out of \
                     these records: it received {}, which the host cannot check for {}",
                    received.join(", "),
                    credentials.why()
                ));
                *result = Err(ToolFailure::Withheld(format!(
                    "the host withheld the Tool's output: it cannot check what the Tool received ({}) for \
                     credential {}; nothing it returned or changed was kept",
                    received.join(", "),
                    credentials.names()
                )));
                let note = format!("[withheld by the host: unchecked for credential {}]", credentials.names());
                for text in [&mut kept.stdout, &mut kept.stderr, &mut kept.log] {
                    if !text.is_empty() {
                        text.clone_from(&note);
                    }
                }
            }
            scanner
        }
    };
    let note = |f: &crate::sandbox::scan::Finding, what: &str| {
        format!("[withheld by the host: {what} held {}]", withhold::named(f))
    };
    if let Ok(out) = &*result
        && !stopped()
    {
        let content = match &out.content {
            Content::Json(v) => scanner.find(&serde_json::to_vec(v).unwrap_or_default()),
            Content::Text(t) => scanner.find(t.as_bytes()),
        };
        let found = content.map(|f| (f, "content".to_owned())).or_else(|| {
            out.commands.iter().enumerate().find_map(|(i, c)| {
                [c.scope.as_str(), &c.key, c.value.as_deref().unwrap_or_default()]
                    .iter()
                    .find_map(|part| scanner.find(part.as_bytes()))
                    .map(|f| (f, format!("Command #{}", i + 1)))
            })
        });
        if let Some((f, part)) = found {
            secrets.record(format!("the Tool's output was withheld: its {part} held {}", withhold::named(&f)));
            *result = Err(ToolFailure::Withheld(format!(
                "the host withheld the Tool's output: its {part} held {}; nothing it returned or changed was kept",
                withhold::named(&f)
            )));
        }
    }
    if let Err(failure) = result
        && let Some(text) = failure.guest_text()
        && let Some(f) = withhold::find_in_kept(&scanner, text, limit)
    {
        secrets.record(format!("the Tool's error text was withheld: it held {}", withhold::named(&f)));
        *text = note(&f, "the Tool's error text");
    }
    for (name, text) in [("stdout", &mut kept.stdout), ("stderr", &mut kept.stderr), ("log", &mut kept.log)] {
        if stopped() {
            return 0;
        }
        if let Some(f) = withhold::find_in_kept(&scanner, text, capture) {
            secrets.record(format!("the guest's {name} was withheld: it held {}", withhold::named(&f)));
            *text = note(&f, &format!("the guest's {name}"));
        }
    }
    let (records, dropped) = secrets.take_records();
    host.extend(records);
    for record in host.iter_mut() {
        if unvouched_guest {
            record.leave_out_guest_text();
        }
        // Host records quote the guest's text (a path, a destination).
        if let Some(f) = scanner.find(record.line().as_bytes()) {
            record.set_line(note(&f, "a host record"));
        }
    }
    dropped
}

/// A Tool's content, checked against its declared output schema: JSON as
/// it is, text as a JSON string — a Tool (or a remote behind an adapter)
/// cannot skip its contract by answering in text.
fn checked_content(content: wit_types::Content, tool: &CheckedTool) -> Result<Content, ToolFailure> {
    let (value, json) = match content {
        wit_types::Content::Json(s) => {
            let v =
                serde_json::from_str(&s).map_err(|e| ToolFailure::Malformed(format!("content is not JSON: {e}")))?;
            (v, true)
        }
        wit_types::Content::Text(t) => (serde_json::Value::String(t), false),
    };
    tool.validate_output(&value).map_err(ToolFailure::Malformed)?;
    Ok(match value {
        serde_json::Value::String(t) if !json => Content::Text(t),
        v => Content::Json(v),
    })
}

/// Why a component did not compile, in the operator's terms: a memory it
/// declares larger than the limit names both sizes and the setting.
fn compile_failure(e: &wasmtime::Error, memory_mib: u64) -> String {
    let text = format!("{e:#}");
    let needed = text
        .split_once("minimum byte size of ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u64>().ok());
    match needed {
        Some(bytes) if text.contains("exceeds the limit") => format!(
            "it needs {:.1} MiB of memory to start, more than `limits.memory_mib` = {memory_mib}; raise the limit to run it",
            bytes as f64 / (1024.0 * 1024.0)
        ),
        _ => text,
    }
}

/// What a Command takes in the guest's memory besides its text (the
/// canonical ABI's record of two strings and a variant of one): counted
/// against `limits.output_kib`, so Commands with empty strings are not free.
/// They were: hundreds of thousands of them passed the check, each lifted
/// into the host (~72 bytes) and converted again (~72 more) — up to ~5 times
/// the guest's memory, per call.
///
/// The lift itself still happens before the host sees the list (inside
/// wasmtime's typed call of the export, which runs the guest's post-return
/// at once, so a `WasmList` read after it would read memory the guest has
/// freed): bounded by `limits.memory_mib`, ~2.6 host bytes per guest byte
/// at most.
const COMMAND_ABI_BYTES: usize = 28;

/// The size of a Tool's output, as `limits.output_kib` bounds it: its
/// content, and each Command's text and [`COMMAND_ABI_BYTES`].
fn output_size(out: &wit_types::ToolOutput) -> usize {
    let command_bytes: usize = out
        .commands
        .iter()
        .map(|c| {
            COMMAND_ABI_BYTES
                + c.scope.len()
                + c.key.len()
                + match &c.op {
                    wit_types::CommandOp::Set(v) => v.len(),
                    wit_types::CommandOp::Remove => 0,
                }
        })
        .sum();
    let content = match &out.content {
        wit_types::Content::Json(s) | wit_types::Content::Text(s) => s.len(),
    };
    content + command_bytes
}

/// Turn a wasmtime error into the model-visible failure.
fn classify(e: &wasmtime::Error, limits: &Limits, stderr: &str) -> ToolFailure {
    if let Some(over) = e.downcast_ref::<http_held::OverBudget>() {
        return ToolFailure::Trapped(over.to_string());
    }
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return match trap {
            Trap::Interrupt => ToolFailure::Timeout(limits.timeout_ms),
            Trap::StackOverflow => ToolFailure::Trapped("stack overflow".into()),
            Trap::UnreachableCodeReached => {
                // A Rust guest panics (or aborts on allocation failure) by
                // reaching `unreachable`; its stderr says which.
                if stderr.contains("memory allocation") {
                    ToolFailure::OutOfMemory(limits.memory_mib)
                } else {
                    // Cut short only once it has been checked for secrets (`shortened`).
                    ToolFailure::Trapped(format!("panic or abort ({})", panic_message(stderr)))
                }
            }
            other => ToolFailure::Trapped(other.to_string()),
        };
    }
    let chain = format!("{e:#}");
    if chain.contains("forcing trap when growing memory") {
        return ToolFailure::OutOfMemory(limits.memory_mib);
    }
    ToolFailure::Trapped(chain)
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

/// How much of a trap's text a failure keeps.
const TRAP_TEXT: usize = 500;

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    format!("{}…", &s[..s.floor_char_boundary(max)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's checks of a call's output end at the call's deadline
    /// (plus `CHECK_GRACE`): checks still running then — the secret check
    /// of large output on the blocking pool — are dropped, told to stop,
    /// and yield nothing, however long they would have run. Checks done at
    /// their first poll need no timer.
    #[tokio::test]
    async fn checks_of_the_output_end_at_the_deadline() {
        let past = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let slow = {
            let stop = stop.clone();
            async move {
                let _stop = withhold::CancelOnDrop(stop);
                tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_secs(3))).await.ok();
                "checked"
            }
        };
        let waited = Instant::now();
        assert_eq!(within_deadline(past, slow).await, None);
        assert!(waited.elapsed() < Duration::from_secs(2), "ended at the deadline, not when the check did");
        assert!(stop.load(Ordering::Relaxed), "the check was told to stop");
        assert_eq!(within_deadline(past, async { "at once" }).await, Some("at once"));
        let in_time = async { tokio::task::spawn_blocking(|| "on the pool").await.unwrap_or("failed") };
        assert_eq!(within_deadline(Instant::now() + Duration::from_secs(30), in_time).await, Some("on the pool"));
    }

    /// A declared output schema holds whatever kind of content the Tool
    /// answers with: text is checked as a JSON string.
    #[cfg(unix)]
    #[test]
    fn a_cached_artifact_with_a_second_name_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.cwasm");
        std::fs::write(&file, b"artifact").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(super::trusted_cache_file(&file));
        std::fs::hard_link(&file, dir.path().join("elsewhere")).unwrap();
        assert!(!super::trusted_cache_file(&file), "a hard-linked artifact is loaded");
        std::fs::remove_file(dir.path().join("elsewhere")).unwrap();
        assert!(super::trusted_cache_file(&file));
    }

    #[test]
    fn text_content_is_held_to_the_declared_output_schema() {
        let tool = |output_schema: serde_json::Value| {
            let doc = serde_json::json!({
                "format": toolgate_sdk::metadata::METADATA_FORMAT,
                "wit": format!("{}@{}", toolgate_sdk::metadata::WIT_PACKAGE, toolgate_sdk::metadata::WIT_VERSION),
                "sdk": "0.1.0",
                "tools": [{"descriptor": {
                    "id": "remote.add", "description": "Add.",
                    "input_schema": {"type": "object"}, "output_schema": output_schema,
                }}],
            });
            let tools = crate::catalog::descriptor::check_document(serde_json::from_value(doc).unwrap()).unwrap();
            tools[0].clone()
        };
        let object = tool(serde_json::json!({"type": "object", "required": ["sum"]}));
        let text = || wit_types::Content::Text("{\"sum\": 3}".into());
        let refused = checked_content(text(), &object);
        assert!(
            matches!(&refused, Err(ToolFailure::Malformed(m)) if m.contains("declared output schema")),
            "{refused:?}"
        );
        let json = wit_types::Content::Json(r#"{"sum":3}"#.into());
        assert!(matches!(checked_content(json, &object), Ok(Content::Json(_))));
        let string = tool(serde_json::json!({"type": "string", "maxLength": 5}));
        assert!(
            matches!(checked_content(wit_types::Content::Text("short".into()), &string), Ok(Content::Text(t)) if t == "short")
        );
        assert!(checked_content(wit_types::Content::Text("too long".into()), &string).is_err());
    }

    /// Every Command counts against the output limit, also one with empty
    /// strings: its size in the guest's memory besides its text.
    #[test]
    fn every_command_counts_against_the_output_limit() {
        let command =
            |key: &str| wit_types::Command { scope: String::new(), key: key.into(), op: wit_types::CommandOp::Remove };
        let out = wit_types::ToolOutput {
            content: wit_types::Content::Text("ok".into()),
            commands: vec![command(""), command("k")],
        };
        assert_eq!(output_size(&out), 2 + 2 * COMMAND_ABI_BYTES + 1);
    }

    /// The text a failure carries from the Tool is cut to the output limit at
    /// a character boundary, with a note; what the host wrote is left alone.
    #[test]
    fn a_failures_text_is_cut_to_the_output_limit() {
        let long = format!("x{}", "é".repeat(3000));
        let makers: [fn(String) -> ToolFailure; 3] =
            [ToolFailure::InvalidArguments, ToolFailure::Failed, ToolFailure::Malformed];
        for make in makers {
            let (ToolFailure::InvalidArguments(m) | ToolFailure::Failed(m) | ToolFailure::Malformed(m)) =
                make(long.clone()).bounded(4096)
            else {
                panic!("the variant changed")
            };
            assert_eq!(&m[..4095], &long[..4095]);
            assert_eq!(&m[4095..], " … [1906 bytes cut: longer than `limits.output_kib` = 4 KiB]");
            assert_eq!(make(long.clone()).bounded(long.len()), make(long.clone()), "at the limit: whole");
        }
        let host = ToolFailure::Trapped("y".repeat(500));
        assert_eq!(host.clone().bounded(8), host);
    }

    /// A Cranelift tier with the host's default settings, and the packed
    /// text component written to a fresh directory: (tier, dir, path, bytes, digest).
    fn text_component() -> (Tier, tempfile::TempDir, PathBuf, Vec<u8>, Digest) {
        let settings = ExecutorSettings::new(Limits::default(), None);
        let tier = tier(&settings, 1, wasmtime::Strategy::Cranelift).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("text.wasm");
        let bytes = toolgate_tests::packed(toolgate_tests::guests::TEXT);
        std::fs::write(&path, &bytes).unwrap();
        let digest = Digest::of(&bytes);
        (tier, dir, path, bytes, digest)
    }

    /// Invariant 14, threads: a compile waits for a thread of the blocking
    /// pool (file checks, DNS and other calls' compiles use it too) before
    /// it starts. `limits.compile_timeout_ms` counts from its start: a
    /// compile that no thread took within it fails the call without
    /// marking the component unhealthy (`ExecutorError::Load` does), and
    /// the job, once a thread takes it, does nothing. (Before, the limit
    /// counted from the queue: a busy pool marked the component unhealthy
    /// for good; the first assertion fails on that code.)
    #[test]
    fn a_compile_waiting_for_a_thread_is_timed_from_its_start_and_leaves_the_component_healthy() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (tier, _dir, path, _, digest) = text_component();
            let compiled = Arc::new(AtomicU64::new(0));
            let slots = Arc::new(tokio::sync::Semaphore::new(COMPILES_AT_ONCE));
            let loader = || Loader {
                tier: tier.clone(),
                cache_file: None,
                slots: slots.clone(),
                counter: compiled.clone(),
                timeout: Duration::from_secs(3),
                memory_mib: 64,
            };
            // The host's one blocking thread is busy for longer than the limit.
            let (free, wait) = std::sync::mpsc::channel::<()>();
            let busy = tokio::task::spawn_blocking(move || wait.recv());
            let refused = loader().load(path.clone(), digest).await.map_err(ExecutorError::from).err().unwrap();
            assert!(
                matches!(&refused, ExecutorError::Instantiate { reason, .. } if reason.contains("no thread free")),
                "{refused:?}"
            );
            free.send(()).unwrap();
            busy.await.unwrap().unwrap();
            // With a thread free, it compiles within the same limit; the
            // abandoned job compiled nothing.
            loader().load(path, digest).await.unwrap();
            assert_eq!(compiled.load(Ordering::SeqCst), 1);
            assert_eq!(slots.available_permits(), COMPILES_AT_ONCE, "every compile gave its slot back");
        });
    }
    /// Invariant 14, deadlines: compiles past their limit keep their slots
    /// (a compiler cannot be stopped), so a call waiting for one waits at
    /// most `limits.compile_timeout_ms` and fails without marking the
    /// component unhealthy; and code already in the trusted cache is mapped
    /// without a slot. (Before, both waited for a slot without bound: with
    /// both slots held, every first call of every other component hung,
    /// also after a restart with its code cached.)
    #[test]
    fn a_call_waits_for_a_compile_slot_within_the_limit_and_cached_code_needs_none() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(async {
            let (tier, dir, path, bytes, digest) = text_component();
            let cache = dir.path().join("cache");
            prepare_cache_dir(&cache).unwrap();
            let cached = cache.join("text.cwasm");
            // Every slot held, as by compiles running past their limit.
            let held = Arc::new(tokio::sync::Semaphore::new(0));
            let loader = |cache_file: Option<PathBuf>| Loader {
                tier: tier.clone(),
                cache_file,
                slots: held.clone(),
                counter: Arc::new(AtomicU64::new(0)),
                timeout: Duration::from_millis(300),
                memory_mib: 64,
            };
            let bound = Duration::from_secs(20);
            let refused = tokio::time::timeout(bound, loader(Some(cached.clone())).load(path.clone(), digest))
                .await
                .expect("the wait for a slot is bounded")
                .map_err(ExecutorError::from)
                .err()
                .unwrap();
            assert!(
                matches!(&refused, ExecutorError::Instantiate { reason, .. }
                    if reason.contains("no compile slot free") && reason.contains("compile_timeout_ms")),
                "{refused:?}"
            );
            write_cache(&cached, &Component::new(&tier.engine, &bytes).unwrap());
            assert!(trusted_cache_file(&cached));
            let loaded = tokio::time::timeout(bound, loader(Some(cached)).load(path, digest))
                .await
                .expect("cached code needs no compile slot");
            assert!(loaded.is_ok());
        });
    }
}
