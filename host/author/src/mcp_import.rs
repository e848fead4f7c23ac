//! MCP adapter import: a remote MCP server's tools, pinned into a component.
//!
//! Owns `toolgate mcp import`: asking a remote server (streamable HTTP, with
//! rmcp's client) for its tools once, pinning them as an
//! [`AdapterConfig`] (ids `mcp__<server>__<tool>`, unique, descriptors that
//! pass the host's checks), and writing it into the generic adapter component
//! shipped in `toolgate` ([`assemble`]): data only, no toolchain.
//! The component then calls the remote through the host's outbound boundary
//! like any Tool, and refuses a remote tool whose definition drifted from the
//! pin (see `toolgate_sdk::mcp`).
//!
//! Architecture invariant: author-side only. The credential used for the
//! import is read only for the URL's own origin when it is bound to it, and
//! the component holds the credential's *name*; an import whose tool
//! definitions echo the secret is refused.

use std::collections::{BTreeMap, HashMap};

use rmcp::ServiceExt as _;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use toolgate_sdk::Annotations;
use toolgate_sdk::mcp::{AdapterConfig, PinnedTool, sanitize, tool_id};

use toolgate::authority::credentials::CredentialSpec;
use toolgate::authority::destination::default_port;

/// Why an import failed. Messages name the URL, tool or credential.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The URL is not an `http(s)://host[:port]/path` URL.
    #[error("`{0}` is not an http:// or https:// URL of an MCP endpoint")]
    Url(String),
    /// The credential cannot be used for this URL.
    #[error("{0}")]
    Credential(String),
    /// Talking to the remote failed.
    #[error("cannot list the tools of the MCP server at {url}: {reason}")]
    Remote {
        /// The endpoint.
        url: String,
        /// Why.
        reason: String,
    },
    /// What the remote offers cannot be pinned.
    #[error("the MCP server at {url}: {reason}")]
    Tools {
        /// The endpoint.
        url: String,
        /// What is wrong and what to do.
        reason: String,
    },
}

/// A remote tool as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTool {
    /// Name.
    pub name: String,
    /// Description.
    pub description: Option<String>,
    /// `inputSchema`.
    pub input_schema: serde_json::Value,
    /// `outputSchema`.
    pub output_schema: Option<serde_json::Value>,
    /// Hints.
    pub annotations: Annotations,
}

/// What the remote said about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Discovered {
    /// `serverInfo.name`, if it sent one.
    pub server_name: Option<String>,
    /// Every tool, all pages.
    pub tools: Vec<RemoteTool>,
}

/// `scheme`, `host`, `port` of an MCP endpoint URL.
fn endpoint(url: &str) -> Result<(String, String, u16), ImportError> {
    let uri: http::Uri = url.parse().map_err(|_| ImportError::Url(url.to_owned()))?;
    let scheme = uri.scheme_str().map(str::to_ascii_lowercase).ok_or_else(|| ImportError::Url(url.to_owned()))?;
    if scheme != "http" && scheme != "https" {
        return Err(ImportError::Url(url.to_owned()));
    }
    let host = uri.host().ok_or_else(|| ImportError::Url(url.to_owned()))?.to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
    Ok((scheme, host, port))
}

/// List the remote's tools once, applying `credential` as the host would.
pub async fn discover(url: &str, credential: Option<&CredentialSpec>) -> Result<Discovered, ImportError> {
    let (scheme, host, port) = endpoint(url)?;
    let mut target = url.to_owned();
    let mut headers = HashMap::new();
    let mut watch = Vec::new();
    if let Some(spec) = credential {
        let secret = spec.materialize(&scheme, &host, port).map_err(|e| ImportError::Credential(e.to_string()))?;
        let mut request = http::Request::builder().uri(url).body(()).map_err(|_| ImportError::Url(url.to_owned()))?;
        toolgate::sandbox::outbound::apply(&mut request, spec, &secret)
            .map_err(|_| ImportError::Credential(format!("credential `{}` cannot be applied to {url}", spec.name)))?;
        watch.push((spec.name.clone(), secret.expose().as_bytes().to_vec()));
        target = request.uri().to_string();
        headers = request.headers().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    // An error's text can hold the URL the secret was written into (a
    // query credential) or the server's bytes: it is shown only once checked.
    let scanner = toolgate::sandbox::scan::SecretScanner::new(&watch);
    let remote = |reason: String| {
        let reason = reason.replace(&target, url);
        let reason = match scanner.find(reason.as_bytes()) {
            None => reason,
            Some(f) => {
                format!("an error whose text held credential `{}` ({}); its text is withheld", f.credential, f.form)
            }
        };
        ImportError::Remote { url: url.to_owned(), reason }
    };
    // https needs a crypto provider; the first install wins and later ones are no-ops.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = StreamableHttpClientTransportConfig::with_uri(target.clone()).custom_headers(headers);
    let transport = StreamableHttpClientTransport::from_config(config);
    let client = ().serve(transport).await.map_err(|e| remote(e.to_string()))?;
    let server_name = client.peer_info().and_then(|i| i.server_info.as_ref().map(|s| s.name.clone()));
    let listed = client.list_all_tools().await.map_err(|e| remote(e.to_string()));
    let _ = client.cancel().await;
    let tools = listed?
        .into_iter()
        .map(|t| RemoteTool {
            name: t.name.into_owned(),
            description: t.description.map(|d| d.into_owned()),
            input_schema: serde_json::Value::Object((*t.input_schema).clone()),
            output_schema: t.output_schema.map(|s| serde_json::Value::Object((*s).clone())),
            annotations: t
                .annotations
                .map(|a| Annotations {
                    read_only: a.read_only_hint,
                    destructive: a.destructive_hint,
                    idempotent: a.idempotent_hint,
                    open_world: a.open_world_hint,
                })
                .unwrap_or_default(),
        })
        .collect::<Vec<_>>();
    let discovered = Discovered { server_name, tools };
    // A remote that echoes the secret into its tool definitions (in any
    // encoding the host's response check knows) would ship it in the component.
    let text = format!("{discovered:?}");
    if scanner.find(text.as_bytes()).is_some() {
        return Err(ImportError::Tools {
            url: url.to_owned(),
            reason: "its tool definitions contain the credential's secret; refusing to write them into a component"
                .into(),
        });
    }
    Ok(discovered)
}

/// Pin what was discovered: ids `mcp__<server>__<tool>` (server from `--name`,
/// else `serverInfo.name`), unique, each descriptor checked as a host will.
pub fn pin(
    url: &str,
    discovered: &Discovered,
    name: Option<&str>,
    credential: Option<&str>,
) -> Result<AdapterConfig, ImportError> {
    let bad = |reason: String| ImportError::Tools { url: url.to_owned(), reason };
    let server = match (name, &discovered.server_name) {
        (Some(n), _) => sanitize(n),
        (None, Some(n)) if !n.trim().is_empty() => sanitize(n),
        _ => return Err(bad("it sent no server name; pass `--name NAME` for the Tool ids".into())),
    };
    if discovered.tools.is_empty() {
        return Err(bad("it offers no tools".into()));
    }
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    let mut tools = Vec::new();
    for t in &discovered.tools {
        let id = tool_id(&server, &t.name);
        if let Some(other) = seen.insert(id.clone(), &t.name) {
            return Err(bad(format!("the tools `{other}` and `{}` both map to the id `{id}`", t.name)));
        }
        tools.push(PinnedTool {
            name: t.name.clone(),
            id,
            description: t.description.clone(),
            input_schema: t.input_schema.clone(),
            output_schema: t.output_schema.clone(),
            annotations: t.annotations.clone(),
        });
    }
    let config = AdapterConfig {
        url: url.to_owned(),
        server,
        credential: credential.map(str::to_owned),
        tools,
        verify_every_secs: toolgate_sdk::mcp::DEFAULT_VERIFY_EVERY_SECS,
    };
    // The same checks a host applies when it loads the component.
    toolgate::catalog::descriptor::check_document(config.metadata())
        .map_err(|e| bad(format!("{e}; it cannot be imported as is")))?;
    Ok(config)
}

/// The adapter component for `config`: the generic MCP adapter shipped in
/// `toolgate` with the pinned config as its pinned data, packed. No toolchain.
pub async fn assemble(
    config: &AdapterConfig,
) -> Result<(Vec<u8>, Vec<std::sync::Arc<toolgate::catalog::descriptor::CheckedTool>>), crate::pack::PackError> {
    let data = serde_json::to_vec_pretty(config).map_err(crate::pack::PackError::Malformed)?;
    crate::adapters::assemble(crate::adapters::MCP, &data).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> RemoteTool {
        RemoteTool {
            name: name.into(),
            description: Some(format!("Does {name}.")),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            annotations: Annotations::default(),
        }
    }

    #[test]
    fn pins_ids_from_the_server_name() {
        let d = Discovered { server_name: Some("Calc Server".into()), tools: vec![tool("add"), tool("sub")] };
        let c = pin("http://127.0.0.1:1/mcp", &d, None, Some("calc")).unwrap();
        assert_eq!(c.server, "Calc_Server");
        let ids: Vec<_> = c.tools.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["mcp__Calc_Server__add", "mcp__Calc_Server__sub"]);
        assert_eq!(c.credential.as_deref(), Some("calc"));
        assert_eq!(pin("http://h/mcp", &d, Some("calc"), None).unwrap().tools[0].id, "mcp__calc__add");
    }

    #[test]
    fn what_cannot_be_pinned_is_refused_naming_it() {
        let url = "http://127.0.0.1:1/mcp";
        let no_name = Discovered { server_name: None, tools: vec![tool("a")] };
        assert!(pin(url, &no_name, None, None).unwrap_err().to_string().contains("--name"));
        let empty = Discovered { server_name: Some("s".into()), tools: vec![] };
        assert!(pin(url, &empty, None, None).unwrap_err().to_string().contains("no tools"));
        let clash = Discovered { server_name: Some("s".into()), tools: vec![tool("a/b"), tool("a:b")] };
        let e = pin(url, &clash, None, None).unwrap_err().to_string();
        assert!(e.contains("`a/b`") && e.contains("`a:b`") && e.contains("mcp__s__a_b"), "{e}");
        let mut bad_schema = tool("x");
        bad_schema.input_schema = json!({"type": "string"});
        let d = Discovered { server_name: Some("s".into()), tools: vec![bad_schema] };
        let e = pin(url, &d, None, None).unwrap_err().to_string();
        assert!(e.contains("mcp__s__x") && e.contains(url), "{e}");
    }

    /// A remote that cannot be reached: the error names the URL as given,
    /// never the one the query credential was written into.
    #[tokio::test]
    async fn an_unreachable_remote_is_reported_without_the_query_credential() {
        use toolgate::authority::credentials::{Apply, CredentialConfig, Source};
        let var = "TOOLGATE_TEST_IMPORT_QUERY_SECRET";
        unsafe { std::env::set_var(var, "q-s3cr3t/value+42") };
        let config = CredentialConfig {
            source: Source::Env(var.into()),
            destinations: vec!["http://127.0.0.1:1".into()],
            apply: Apply::Query { param: "api_key".into() },
        };
        let spec = CredentialSpec::new("calc", &config, std::path::Path::new("/")).unwrap();
        let e = discover("http://127.0.0.1:1/mcp", Some(&spec)).await.err().expect("unreachable").to_string();
        assert!(e.contains("http://127.0.0.1:1/mcp"), "{e}");
        for form in ["q-s3cr3t", "q-s3cr3t%2Fvalue", "api_key="] {
            assert!(!e.contains(form), "{form} in {e}");
        }
    }

    /// The example's pins are what an import writes: the generic adapter
    /// with them is an ordinary component whose descriptors are the pins.
    #[tokio::test]
    async fn the_example_pins_assemble_into_a_component_that_describes_them() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../example-tools/mcp-calc/pinned.json");
        let config: AdapterConfig = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (packed, tools) = assemble(&config).await.unwrap();
        let ids: Vec<_> = tools.iter().map(|t| t.id().to_owned()).collect();
        assert_eq!(ids, ["mcp__calc__add", "mcp__calc__fail"]);
        assert_eq!(tools[0].metadata, config.metadata().tools[0]);
        let pinned = toolgate::catalog::descriptor::read_pinned(&packed).unwrap();
        assert_eq!(
            serde_json::from_slice::<AdapterConfig>(&pinned).unwrap(),
            config,
            "the pins travel in the component"
        );
    }

    #[test]
    fn urls_must_be_http() {
        for u in ["ftp://h/x", "nonsense", "http:///x"] {
            assert!(matches!(endpoint(u), Err(ImportError::Url(_))), "{u}");
        }
        assert_eq!(endpoint("https://Mcp.Example.com/mcp").unwrap(), ("https".into(), "mcp.example.com".into(), 443));
    }
}
