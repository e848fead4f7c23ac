//! The generic MCP adapter component shipped inside `toolgate`: `toolgate mcp
//! import` writes the pinned remote descriptors and origin into its
//! `toolgate-pinned` section; it describes itself from them and calls the
//! remote through the host's `wasi:http` boundary. No code per server.

toolgate_sdk::export_adapter!(toolgate_sdk::mcp::McpAdapter);
