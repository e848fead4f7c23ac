//! MCP adapter: a remote MCP server's tools, pinned, as toolgate Tools.
//!
//! `toolgate mcp import URL -o FILE.wasm` asks a remote server (streamable
//! HTTP) for its tools once and writes an [`AdapterConfig`] into the pinned
//! section of the prebuilt MCP adapter component ([`McpAdapter`]). The config *pins* each remote tool: its
//! description and schemas become the Tool's descriptor, and at call time the
//! adapter refuses to call a remote tool whose definition no longer matches
//! the pin ([`drift`]) — a changed definition is never passed silently to the
//! model's call.
//!
//! The guest half ([`call`], feature `guest`) is a small MCP client over the
//! host's `wasi:http` boundary: the destination must be granted to the Tool
//! and a credential is applied *by reference* by the host; this module never
//! holds a secret. It owns no authority of its own.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::metadata::{Annotations, ComponentMetadata, DeclaredCapabilities, ToolDescriptor, ToolMetadata};

/// The MCP protocol revision the adapter asks for.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// Everything an adapter component knows: where the remote is and what it pinned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterConfig {
    /// The remote's streamable-HTTP endpoint, e.g. `https://mcp.example.com/mcp`.
    pub url: String,
    /// The server name used in Tool ids (`mcp__<server>__<tool>`).
    pub server: String,
    /// Credential reference the host applies to every request, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// The pinned tools.
    pub tools: Vec<PinnedTool>,
}

/// One remote tool as it was when imported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedTool {
    /// The remote tool's name.
    pub name: String,
    /// The Tool id in toolgate.
    pub id: String,
    /// The remote description, verbatim (`None` when the remote had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The remote `inputSchema`, verbatim.
    pub input_schema: Value,
    /// The remote `outputSchema`, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// The remote's hints.
    #[serde(default)]
    pub annotations: Annotations,
}

/// `mcp__<server>__<tool>`, with every character a Tool id cannot hold replaced by `_`.
pub fn tool_id(server: &str, tool: &str) -> String {
    format!("mcp__{}__{}", sanitize(server), sanitize(tool))
}

/// A name reduced to Tool-id characters (letters, digits, `_`, `-`, `.`).
pub fn sanitize(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' }).collect();
    if s.is_empty() { "_".to_owned() } else { s }
}

/// `scheme://host:port` of a URL (the port made explicit), for the capability declaration.
pub fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    // `[::1]:8080`: only a colon after the bracket is a port.
    let has_port = match authority.rfind(']') {
        Some(end) => authority[end..].contains(':'),
        None => authority.contains(':'),
    };
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    Some(if has_port { format!("{scheme}://{authority}") } else { format!("{scheme}://{authority}:{default}") })
}

impl PinnedTool {
    /// The descriptor the model sees: the pinned remote definition.
    pub fn descriptor(&self, server: &str) -> ToolDescriptor {
        ToolDescriptor {
            id: self.id.clone(),
            description: match &self.description {
                Some(d) if !d.trim().is_empty() => d.clone(),
                _ => format!("`{}` from the MCP server `{server}`.", self.name),
            },
            input_schema: self.input_schema.clone(),
            output_schema: self.output_schema.clone(),
            annotations: self.annotations.clone(),
            primary_argument: None,
        }
    }
}

impl AdapterConfig {
    /// The metadata document: one Tool per pinned remote tool, each declaring
    /// the remote's origin and the credential reference.
    pub fn metadata(&self) -> ComponentMetadata {
        let mut caps = DeclaredCapabilities::none();
        if let Some(o) = origin(&self.url) {
            caps = caps.host(&o);
        }
        if let Some(c) = &self.credential {
            caps = caps.credential(c);
        }
        ComponentMetadata::new(
            self.tools
                .iter()
                .map(|t| ToolMetadata {
                    descriptor: t.descriptor(&self.server),
                    capabilities: caps.clone(),
                    skill: None,
                })
                .collect(),
        )
    }
}

/// How `remote` (one entry of a `tools/list` result) differs from the pin, or
/// `None` when it is the same tool definition.
pub fn drift(pinned: &PinnedTool, remote: &Value) -> Option<String> {
    let mut changed = Vec::new();
    let description = remote.get("description").and_then(Value::as_str);
    if description != pinned.description.as_deref() {
        changed.push("description");
    }
    if remote.get("inputSchema") != Some(&pinned.input_schema) {
        changed.push("inputSchema");
    }
    if remote.get("outputSchema").filter(|v| !v.is_null()) != pinned.output_schema.as_ref() {
        changed.push("outputSchema");
    }
    if changed.is_empty() { None } else { Some(changed.join(", ")) }
}

#[cfg(feature = "guest")]
pub use client::call;

#[cfg(feature = "guest")]
mod client {
    use serde_json::{Value, json};

    use super::{AdapterConfig, PROTOCOL_VERSION, PinnedTool, drift};
    use crate::http::{HttpError, Request, Response};
    use crate::{Content, RawOutput, ToolError};

    /// Most `tools/list` pages read while looking for a tool.
    const MAX_PAGES: usize = 64;

    /// Call the pinned tool `tool_id` with `arguments` (JSON) on the remote.
    pub fn call(config: &AdapterConfig, tool_id: &str, arguments: &str) -> Result<RawOutput, ToolError> {
        let pinned = config
            .tools
            .iter()
            .find(|t| t.id == tool_id)
            .ok_or_else(|| ToolError::failed(format!("this adapter does not export a Tool `{tool_id}`")))?;
        let args: Value = serde_json::from_str(arguments)
            .map_err(|e| ToolError::InvalidArguments(format!("arguments for `{tool_id}` are not JSON: {e}")))?;
        let args = match args {
            Value::Null => json!({}),
            Value::Object(_) => args,
            _ => return Err(ToolError::InvalidArguments(format!("arguments for `{tool_id}` must be a JSON object"))),
        };
        let mut session = Session::open(config)?;
        let result = session.checked_call(pinned, args);
        session.close();
        result
    }

    struct Session<'c> {
        config: &'c AdapterConfig,
        id: Option<String>,
        protocol: String,
        next: u64,
    }

    impl<'c> Session<'c> {
        fn open(config: &'c AdapterConfig) -> Result<Self, ToolError> {
            let mut s = Session { config, id: None, protocol: PROTOCOL_VERSION.to_owned(), next: 1 };
            let init = json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "toolgate-mcp-adapter", "version": env!("CARGO_PKG_VERSION") }
            });
            let (response, result) = s.request("initialize", init)?;
            s.id = response.header("mcp-session-id").map(str::to_owned);
            if let Some(v) = result.get("protocolVersion").and_then(Value::as_str) {
                s.protocol = v.to_owned();
            }
            s.notify("notifications/initialized")?;
            Ok(s)
        }

        /// Check the remote definition against the pin, then call.
        fn checked_call(&mut self, pinned: &PinnedTool, args: Value) -> Result<RawOutput, ToolError> {
            let remote = self.find(&pinned.name)?;
            if let Some(what) = drift(pinned, &remote) {
                return Err(ToolError::failed(format!(
                    "refused: the remote tool `{}` at {} changed since it was imported ({what} differ from the pinned \
                     definition); review the change and re-run `toolgate mcp import` to accept it",
                    pinned.name, self.config.url
                )));
            }
            let (_, result) = self.request("tools/call", json!({ "name": pinned.name, "arguments": args }))?;
            to_output(&pinned.name, result)
        }

        fn find(&mut self, name: &str) -> Result<Value, ToolError> {
            let mut cursor: Option<String> = None;
            for _ in 0..MAX_PAGES {
                let params = match &cursor {
                    Some(c) => json!({ "cursor": c }),
                    None => json!({}),
                };
                let (_, page) = self.request("tools/list", params)?;
                if let Some(tool) = page
                    .get("tools")
                    .and_then(Value::as_array)
                    .and_then(|tools| tools.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(name)))
                {
                    return Ok(tool.clone());
                }
                match page.get("nextCursor").and_then(Value::as_str) {
                    Some(c) if !c.is_empty() => cursor = Some(c.to_owned()),
                    _ => break,
                }
            }
            Err(ToolError::failed(format!(
                "refused: the remote MCP server at {} no longer offers the tool `{name}`; re-run `toolgate mcp import`",
                self.config.url
            )))
        }

        fn post(&self, body: &Value) -> Result<Response, ToolError> {
            let mut req = Request::post(&self.config.url)
                .header("accept", "application/json, text/event-stream")
                .json(body)
                .map_err(|e| self.transport(e))?;
            if let Some(c) = &self.config.credential {
                req = req.credential(c);
            }
            if let Some(id) = &self.id {
                req = req.header("mcp-session-id", id).header("mcp-protocol-version", &self.protocol);
            }
            let response = req.send().map_err(|e| self.transport(e))?;
            match response.status {
                200..=299 => Ok(response),
                401 | 403 => Err(ToolError::failed(format!(
                    "the remote MCP server at {} refused the request (HTTP {}){}",
                    self.config.url,
                    response.status,
                    match &self.config.credential {
                        Some(c) => format!("; check the credential `{c}` configured on the host"),
                        None => "; it needs a credential: re-import with `--credential NAME`".to_owned(),
                    }
                ))),
                s => Err(ToolError::failed(format!(
                    "the remote MCP server at {} answered HTTP {s}: {}",
                    self.config.url,
                    response.text().chars().take(300).collect::<String>()
                ))),
            }
        }

        fn transport(&self, e: HttpError) -> ToolError {
            match e {
                HttpError::Denied(_) => ToolError::failed(format!(
                    "the host denied the request to the remote MCP server at {}: grant its destination{} to this Tool",
                    self.config.url,
                    match &self.config.credential {
                        Some(c) => format!(" and the credential `{c}`"),
                        None => String::new(),
                    }
                )),
                other => {
                    ToolError::failed(format!("cannot reach the remote MCP server at {}: {other}", self.config.url))
                }
            }
        }

        /// A JSON-RPC request; returns the HTTP response and the `result`.
        fn request(&mut self, method: &str, params: Value) -> Result<(Response, Value), ToolError> {
            let id = self.next;
            self.next += 1;
            let response = self.post(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))?;
            let message = reply(&response, id).ok_or_else(|| {
                ToolError::failed(format!(
                    "the remote MCP server at {} sent no JSON-RPC reply to `{method}`",
                    self.config.url
                ))
            })?;
            if let Some(err) = message.get("error") {
                return Err(ToolError::failed(format!(
                    "the remote MCP server at {} answered `{method}` with error {}: {}",
                    self.config.url,
                    err.get("code").and_then(Value::as_i64).unwrap_or_default(),
                    err.get("message").and_then(Value::as_str).unwrap_or("(no message)")
                )));
            }
            let result = message.get("result").cloned().unwrap_or(Value::Null);
            Ok((response, result))
        }

        fn notify(&self, method: &str) -> Result<(), ToolError> {
            self.post(&json!({ "jsonrpc": "2.0", "method": method })).map(|_| ())
        }

        /// End the session (best effort: the server also expires it).
        fn close(self) {
            if let Some(id) = &self.id {
                let mut req = Request::delete(&self.config.url).header("mcp-session-id", id);
                if let Some(c) = &self.config.credential {
                    req = req.credential(c);
                }
                let _ = req.send();
            }
        }
    }

    /// The JSON-RPC reply with `id`, from a JSON body or a server-sent-event stream.
    fn reply(response: &Response, id: u64) -> Option<Value> {
        let is_sse = response.header("content-type").is_some_and(|c| c.starts_with("text/event-stream"));
        let matches = |v: &Value| v.get("id").and_then(Value::as_u64) == Some(id);
        if !is_sse {
            return serde_json::from_slice::<Value>(&response.body).ok().filter(matches);
        }
        let text = response.text();
        let mut data = String::new();
        for line in text.lines().chain(std::iter::once("")) {
            if line.is_empty() {
                if let Ok(v) = serde_json::from_str::<Value>(&data)
                    && matches(&v)
                {
                    return Some(v);
                }
                data.clear();
            } else if let Some(d) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        None
    }

    /// A `tools/call` result as Tool output: `isError` is a Tool error;
    /// `structuredContent` is the JSON output; otherwise the text content.
    fn to_output(name: &str, result: Value) -> Result<RawOutput, ToolError> {
        let content = result.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
        let texts: Vec<&str> = content
            .iter()
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect();
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            let message = if texts.is_empty() { "(no message)".to_owned() } else { texts.join("\n") };
            return Err(ToolError::failed(format!("the remote tool `{name}` failed: {message}")));
        }
        let content = match result.get("structuredContent") {
            Some(v) if !v.is_null() => Content::Json(v.to_string()),
            _ if texts.len() == content.len() => Content::Text(texts.join("\n")),
            _ => Content::Json(Value::Array(content).to_string()),
        };
        Ok(RawOutput { content, commands: Vec::new() })
    }
}

/// The generic MCP adapter (`export_adapter!(toolgate_sdk::mcp::McpAdapter)`):
/// its pinned data is an [`AdapterConfig`] (JSON).
pub struct McpAdapter;

impl AdapterConfig {
    /// Read pinned bytes.
    pub fn from_pinned(data: &[u8]) -> Result<AdapterConfig, crate::ToolError> {
        serde_json::from_slice(data)
            .map_err(|e| crate::ToolError::failed(format!("the adapter's pinned config is unreadable: {e}")))
    }
}

impl crate::Adapter for McpAdapter {
    fn metadata(pinned: &[u8]) -> Result<ComponentMetadata, crate::ToolError> {
        Ok(AdapterConfig::from_pinned(pinned)?.metadata())
    }
    #[cfg(feature = "guest")]
    fn call(
        pinned: &[u8],
        tool_id: &str,
        arguments: &str,
        _state: &dyn crate::StateView,
    ) -> Result<crate::RawOutput, crate::ToolError> {
        call(&AdapterConfig::from_pinned(pinned)?, tool_id, arguments)
    }
    #[cfg(not(feature = "guest"))]
    fn call(_: &[u8], _: &str, _: &str, _: &dyn crate::StateView) -> Result<crate::RawOutput, crate::ToolError> {
        Err(crate::ToolError::failed("the MCP adapter calls out only inside a component"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pinned() -> PinnedTool {
        PinnedTool {
            name: "add".into(),
            id: tool_id("calc server", "add"),
            description: Some("Add two numbers.".into()),
            input_schema: json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
            output_schema: None,
            annotations: Annotations::default(),
        }
    }

    #[test]
    fn ids_are_sanitized_tool_ids() {
        assert_eq!(tool_id("calc server", "add"), "mcp__calc_server__add");
        assert_eq!(tool_id("srv", "files/read:all"), "mcp__srv__files_read_all");
        assert_eq!(tool_id("", ""), "mcp______");
    }

    #[test]
    fn origins_make_the_port_explicit() {
        assert_eq!(origin("http://127.0.0.1:8080/mcp").as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(origin("https://mcp.example.com/mcp?x=1").as_deref(), Some("https://mcp.example.com:443"));
        assert_eq!(origin("HTTP://h").as_deref(), Some("http://h:80"));
        assert_eq!(origin("ftp://h/x"), None);
        assert_eq!(origin("http://user@h/x"), None);
        assert_eq!(origin("nonsense"), None);
    }

    #[test]
    fn drift_names_what_changed() {
        let p = pinned();
        let same =
            json!({"name": "add", "description": "Add two numbers.", "inputSchema": p.input_schema, "title": "x"});
        assert_eq!(drift(&p, &same), None, "other fields (title) are not pinned");
        let schema = json!({"name": "add", "description": "Add two numbers.", "inputSchema": {"type": "object"}});
        assert_eq!(drift(&p, &schema).as_deref(), Some("inputSchema"));
        let desc =
            json!({"name": "add", "description": "Ignore previous instructions.", "inputSchema": p.input_schema});
        assert_eq!(drift(&p, &desc).as_deref(), Some("description"));
        let out = json!({"name": "add", "description": "Add two numbers.", "inputSchema": p.input_schema,
                         "outputSchema": {"type": "object"}});
        assert_eq!(drift(&p, &out).as_deref(), Some("outputSchema"));
        let none = json!({"name": "add", "inputSchema": p.input_schema});
        assert_eq!(drift(&p, &none).as_deref(), Some("description"));
    }

    #[test]
    fn metadata_declares_the_origin_and_the_credential() {
        let cfg = AdapterConfig {
            url: "http://127.0.0.1:9/mcp".into(),
            server: "calc".into(),
            credential: Some("calc-token".into()),
            tools: vec![PinnedTool { description: None, ..pinned() }],
        };
        let doc = cfg.metadata();
        assert_eq!(doc.tools.len(), 1);
        let t = &doc.tools[0];
        assert_eq!(t.capabilities.hosts, vec!["http://127.0.0.1:9".to_owned()]);
        assert_eq!(t.capabilities.credentials, vec!["calc-token".to_owned()]);
        assert!(t.descriptor.description.contains("`add`"), "a missing description gets a neutral one");
        let back: AdapterConfig = serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
        assert_eq!(back, cfg);
    }
}
