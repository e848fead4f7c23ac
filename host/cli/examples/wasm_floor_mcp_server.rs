//! The floor of a sandboxed MCP server, for the `toolgate serve` per-call
//! benchmark (`tests/mcp/bench_serve.py`): the trivial rmcp server of
//! `trivial_mcp_server.rs`, whose one tool, `upper`, runs each call in a
//! fresh wasmtime instance of a toolgate component — the engine settings of
//! `toolgate::Executor` (pooling allocator, slot reuse, epoch interruption),
//! WASI with nothing granted, code loaded from a compiled file (mmap), the
//! `InstancePre` built once — and nothing else: no catalog, gate, journal,
//! captures or output checks. What `toolgate serve` costs above it is what
//! toolgate adds to a fresh instance per call; what it costs above the
//! trivial server is what the engine costs.
//!
//! It allocates with mimalloc, as the `toolgate` binary does.
//!
//! `cargo build --release -p toolgate-cli --example wasm_floor_mcp_server`,
//! then `wasm_floor_mcp_server COMPONENT` (a packed component exporting
//! `text.upper`; stdio).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

mod bindings {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../../wit",
        exports: { default: async },
    });
}

use bindings::toolgate::plugin::{log as wit_log, state as wit_state, types as wit_types};

/// `toolgate::Executor`'s defaults: 64 instances of at most 64 MiB, a 5 ms
/// epoch tick, a 10 s deadline.
const INSTANCES: u32 = 64;
const MEMORY_MIB: usize = 64;
const EPOCH_TICK: Duration = Duration::from_millis(5);
const DEADLINE_TICKS: u64 = 10_000 / 5;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}
impl wit_types::Host for CallState {}
impl wit_log::Host for CallState {
    fn log(&mut self, _level: wit_log::Level, _message: String) {}
}
impl wit_state::Host for CallState {
    fn get(&mut self, _key: String) -> Option<String> {
        None
    }
    fn keys(&mut self) -> Vec<String> {
        Vec::new()
    }
}

struct Floor {
    engine: Engine,
    pre: bindings::PluginPre<CallState>,
}

impl Floor {
    fn load(path: &str) -> wasmtime::Result<Floor> {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(INSTANCES)
            .total_core_instances(INSTANCES * 16)
            .total_memories(INSTANCES * 4)
            .total_tables(INSTANCES * 16)
            .total_stacks(INSTANCES)
            .max_memory_size(MEMORY_MIB << 20);
        toolgate::sandbox::executor::slot_reuse(&mut pool);
        let mut config = wasmtime::Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        bindings::Plugin::add_to_linker::<CallState, wasmtime::component::HasSelf<CallState>>(&mut linker, |s| s)?;
        let bytes = std::fs::read(path).map_err(|e| wasmtime::Error::msg(format!("cannot read {path}: {e}")))?;
        let compiled = tempfile::NamedTempFile::new()?;
        std::fs::write(compiled.path(), Component::new(&engine, &bytes)?.serialize()?)?;
        // SAFETY: written just above by this engine.
        let component = unsafe { Component::deserialize_file(&engine, compiled.path()) }?;
        let pre = bindings::PluginPre::new(linker.instantiate_pre(&component)?)?;
        let weak = engine.weak();
        std::thread::spawn(move || {
            while let Some(e) = weak.upgrade() {
                e.increment_epoch();
                drop(e);
                std::thread::sleep(EPOCH_TICK);
            }
        });
        Ok(Floor { engine, pre })
    }

    async fn call(&self, arguments: &str) -> wasmtime::Result<String> {
        let state = CallState {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new().memory_size(MEMORY_MIB << 20).trap_on_grow_failure(true).build(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(DEADLINE_TICKS);
        store.epoch_deadline_trap();
        let plugin = self.pre.instantiate_async(&mut store).await?;
        let out = plugin.toolgate_plugin_tool().call_call(&mut store, "text.upper", arguments).await?;
        match out {
            Ok(wit_types::ToolOutput {
                content: wit_types::Content::Json(s) | wit_types::Content::Text(s), ..
            }) => Ok(s),
            Err(e) => Err(wasmtime::Error::msg(format!("text.upper failed: {e:?}"))),
        }
    }
}

struct Server(Arc<Floor>);

impl ServerHandler for Server {
    fn get_info(&self) -> InitializeResult {
        let mut info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("wasm-floor", "0");
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema =
            serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
        let schema = schema.as_object().cloned().unwrap_or_default();
        Ok(ListToolsResult::with_all_items(vec![Tool::new("upper", "Upper-case a text.", Arc::new(schema))]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default()).to_string();
        let out = self.0.call(&arguments).await.map_err(|e| ErrorData::internal_error(format!("{e:#}"), None))?;
        Ok(CallToolResponse::from(CallToolResult::success(vec![ContentBlock::text(out)])))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).context("usage: wasm_floor_mcp_server COMPONENT")?;
    let floor = Arc::new(Floor::load(&path).map_err(|e| anyhow::anyhow!("{e:#}"))?);
    let service = Server(floor).serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
