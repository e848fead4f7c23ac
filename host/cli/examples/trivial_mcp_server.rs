//! The baseline of the `toolgate serve` per-call benchmark
//! (`tests/mcp/bench_serve.py`): a trivial stdio MCP server on the same
//! official Rust SDK (rmcp) with one tool, `upper`, that upper-cases a text in
//! process — no catalog, gate, sandbox or journal. What `toolgate serve` costs
//! per call above it is what toolgate adds.
//!
//! `cargo build --release -p toolgate-cli --example trivial_mcp_server`
//! (stdio; `--http` serves Streamable HTTP on a free loopback port)

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};

struct Trivial;

impl ServerHandler for Trivial {
    fn get_info(&self) -> InitializeResult {
        let mut info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("trivial", "0");
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
        let text = request.arguments.as_ref().and_then(|a| a.get("text")).and_then(|t| t.as_str()).unwrap_or_default();
        let out = serde_json::Value::String(text.to_uppercase()).to_string();
        Ok(CallToolResponse::from(CallToolResult::success(vec![ContentBlock::text(out)])))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `--http`: Streamable HTTP on a free loopback port, announced on stderr
    // the way `toolgate serve --http` announces it; the same rmcp service
    // defaults as toolgate (stateful sessions, in-process session manager).
    if std::env::args().nth(1).as_deref() == Some("--http") {
        use rmcp::transport::streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
        };
        let service: StreamableHttpService<Trivial, LocalSessionManager> =
            StreamableHttpService::new(|| Ok(Trivial), Default::default(), StreamableHttpServerConfig::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        eprintln!("trivial: serving MCP on http://{}/mcp", listener.local_addr()?);
        let app = axum::Router::new().nest_service("/mcp", service);
        axum::serve(listener, app).await?;
        return Ok(());
    }
    let service = Trivial.serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
