//! Serve: `toolgate serve`, an MCP server over stdio (rmcp).
//!
//! Owns translating between MCP and the runtime: `tools/list` is the agent
//! snapshot's list, `tools/call` is `Run::call` — the same descriptor, gate,
//! executor and Step commit as every other front end. A blocked call or a
//! Tool error is an `isError` result the model reads; an unknown or invisible
//! tool is a protocol error. RequireConfirmation asks the client through
//! elicitation when it declared that capability (accept executes exactly the
//! stored call through its ticket; decline or cancel commits a blocked
//! result; the journal records the client as the approver); otherwise the
//! result names the pending request — never its ticket — and an approver
//! decides it out of band; the identical call later gets the decided result.
//! When the plugin directory changes, the catalog reloads and the client gets
//! `notifications/tools/list_changed`.
//!
//! Architecture invariant: this is the only module that knows MCP types, and
//! it makes no decision of its own — no side channel for authorization.
//! Guest output never reaches stdout: it is captured by the executor.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams, ElicitationAction,
    ElicitationSchema, Implementation, InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use toolgate_sdk::ToolDescriptor;

use toolgate::config::Config;
use toolgate::runtime::{CallError, Runtime, StepResult, new_id};
use toolgate::sandbox::executor::Content;
use toolgate::{ExecutableAgentSnapshot, ToolCapabilityNarrowing};

/// How often the plugin directory is checked for changes.
const RELOAD_POLL: Duration = Duration::from_millis(500);

/// The MCP server of one agent.
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
}

struct Shared {
    config: Config,
    agent: String,
    runtime: RwLock<Arc<Runtime>>,
    run_id: String,
    peer: Mutex<Option<Peer<RoleServer>>>,
}

impl McpServer {
    /// A server over `runtime`; `config` and `agent` rebuild it on reload.
    pub fn new(config: Config, agent: &str, runtime: Runtime) -> Self {
        McpServer {
            shared: Arc::new(Shared {
                config,
                agent: agent.to_owned(),
                runtime: RwLock::new(Arc::new(runtime)),
                run_id: new_id("run"),
                peer: Mutex::new(None),
            }),
        }
    }

    fn runtime(&self) -> Arc<Runtime> {
        self.shared.runtime.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Serve MCP over stdin/stdout until stdin closes.
    pub async fn serve_stdio(self) -> anyhow::Result<()> {
        let watcher = tokio::spawn(self.clone().watch());
        let service = self.serve(rmcp::transport::stdio()).await?;
        let result = service.waiting().await;
        watcher.abort();
        result?;
        Ok(())
    }

    /// Reload the catalog when the plugin directory changes.
    async fn watch(self) {
        let dir = self.shared.config.plugins.clone();
        let mut last = fingerprint(&dir);
        loop {
            tokio::time::sleep(RELOAD_POLL).await;
            let now = fingerprint(&dir);
            if now == last {
                continue;
            }
            last = now;
            match self.reload() {
                Ok(()) => {
                    let peer = self.shared.peer.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    if let Some(peer) = peer {
                        let _ = peer.notify_tool_list_changed().await;
                    }
                }
                Err(e) => tracing::warn!("plugin directory changed but cannot be reloaded: {e:#}"),
            }
        }
    }

    fn reload(&self) -> anyhow::Result<()> {
        let catalog = Arc::new(toolgate::host::catalog(&self.shared.config)?);
        for r in catalog.refused() {
            tracing::warn!(file = %r.path.display(), "refused: {}", r.reason);
        }
        let snapshot = ExecutableAgentSnapshot::build(&self.shared.config, &self.shared.agent, catalog)?;
        let next = self.runtime().with_snapshot(snapshot);
        *self.shared.runtime.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        Ok(())
    }

    async fn call(
        &self,
        name: &str,
        arguments: serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let runtime = self.runtime();
        let run = runtime
            .start_run(Some(self.shared.run_id.clone()), ToolCapabilityNarrowing::Configured)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let descriptor = runtime
            .snapshot()
            .candidate(name, &|d| runtime.executor().unhealthy(d))
            .ok()
            .map(|c| c.descriptor().clone());
        let result = match run.call(name, arguments.clone()).await {
            Ok(r) => r,
            Err(CallError::UnknownTool(id)) => {
                return Err(ErrorData::invalid_params(format!("unknown tool `{id}`"), None));
            }
            Err(e) => return Err(ErrorData::internal_error(e.to_string(), None)),
        };
        let result = match result {
            StepResult::Awaiting { ticket, correlation, expires_at, seq } => {
                let awaiting = StepResult::Awaiting { seq, correlation, ticket: ticket.clone(), expires_at };
                self.confirm(&runtime, name, &arguments, &ticket, awaiting, context).await?
            }
            other => other,
        };
        Ok(to_mcp_result(&result, descriptor.as_ref()))
    }

    /// Ask the human through the client's own UI; a client that cannot ask
    /// gets the pending request (no ticket: the model may read the result)
    /// and an approver decides it out of band.
    async fn confirm(
        &self,
        runtime: &Runtime,
        name: &str,
        arguments: &serde_json::Value,
        ticket: &str,
        awaiting: StepResult,
        context: &RequestContext<RoleServer>,
    ) -> Result<StepResult, ErrorData> {
        let info = context.peer.peer_info();
        let can_elicit = info.as_ref().is_some_and(|info| info.capabilities.elicitation.is_some());
        if !can_elicit {
            return Ok(StepResult::ToolError {
                seq: 0,
                message: format!("`{name}` needs human approval and this client cannot ask: {}", awaiting.model_text()),
            });
        }
        let client = info.map(|i| i.client_info.name.clone()).unwrap_or_else(|| "an MCP client".into());
        let approval = toolgate::Approval::by_mcp_client(client);
        let schema: ElicitationSchema = ElicitationSchema::builder()
            .required_bool_property("confirm", |b| b.title("Run this call?"))
            .build_unchecked();
        let request = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: format!("Allow the tool `{name}` to run with these arguments?\n{arguments}"),
            requested_schema: schema,
        };
        let answer = context.peer.create_elicitation(request).await;
        let approved = match &answer {
            Ok(r) => {
                r.action == ElicitationAction::Accept
                    && r.content.as_ref().and_then(|c| c.get("confirm")).and_then(|v| v.as_bool()) == Some(true)
            }
            Err(e) => {
                tracing::warn!("elicitation failed: {e}");
                false
            }
        };
        let step = if approved {
            runtime.approve(ticket, &approval).await
        } else {
            let why = match &answer {
                Ok(r) if r.action == ElicitationAction::Cancel => "cancelled by the user",
                Ok(_) => "declined by the user",
                Err(_) => "the approval request failed",
            };
            runtime.deny(ticket, why, &approval).await
        };
        step.map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }
}

/// What identifies the directory's content cheaply: names, sizes, mtimes.
fn fingerprint(dir: &std::path::Path) -> Vec<(String, u64, Option<SystemTime>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), m.len(), m.modified().ok()))
        })
        .collect();
    v.sort();
    v
}

/// A descriptor as an MCP tool: name, description, input schema, output
/// schema (object-rooted only, as MCP requires), annotations.
pub fn to_mcp_tool(d: &ToolDescriptor) -> Tool {
    let input = d.input_schema.as_object().cloned().unwrap_or_default();
    let mut tool = Tool::new(d.id.clone(), d.description.clone(), Arc::new(input));
    if let Some(out) = object_schema(d) {
        tool = tool.with_raw_output_schema(Arc::new(out));
    }
    let a = &d.annotations;
    if a.read_only.is_some() || a.destructive.is_some() || a.idempotent.is_some() || a.open_world.is_some() {
        tool = tool.with_annotations(ToolAnnotations::from_raw(
            None,
            a.read_only,
            a.destructive,
            a.idempotent,
            a.open_world,
        ));
    }
    tool
}

fn object_schema(d: &ToolDescriptor) -> Option<serde_json::Map<String, serde_json::Value>> {
    let out = d.output_schema.as_ref()?;
    (out.get("type").and_then(|t| t.as_str()) == Some("object")).then(|| out.as_object().cloned()).flatten()
}

fn to_mcp_result(result: &StepResult, descriptor: Option<&ToolDescriptor>) -> CallToolResult {
    match result {
        StepResult::Output { content, .. } => {
            let text = result.model_text();
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            if let (Content::Json(v), Some(d)) = (content, descriptor)
                && object_schema(d).is_some()
            {
                r.structured_content = Some(v.clone());
            }
            r
        }
        other => CallToolResult::error(vec![ContentBlock::text(other.model_text())]),
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build();
        let mut info = InitializeResult::new(capabilities);
        info.server_info = Implementation::new("toolgate", env!("CARGO_PKG_VERSION"));
        info.instructions =
            Some("Tools run sandboxed after a permission check; some calls need human approval.".into());
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.runtime().list().iter().map(to_mcp_tool).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.map(serde_json::Value::Object).unwrap_or(serde_json::Value::Null);
        self.call(&request.name, arguments, &context).await.map(CallToolResponse::from)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        *self.shared.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(context.peer.clone());
    }
}
