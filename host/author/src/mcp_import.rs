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
//! definitions hold the secret of any configured credential is refused (they
//! become what models read), and a remote is listed within a deadline and
//! page, tool and size limits.

use std::collections::{BTreeMap, HashMap};

use rmcp::ServiceExt as _;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use toolgate_sdk::Annotations;
use toolgate_sdk::mcp::{AdapterConfig, PinnedTool, sanitize, tool_id};

use toolgate::authority::credentials::CredentialSpec;
use toolgate::authority::destination::{default_port, redacted};

/// Why an import failed. Messages name the URL, tool or credential; the
/// server's text in them is shown on one line ([`crate::one_line`]).
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The URL is not an `http(s)://host[:port]/path` URL. Holds it without
    /// its user part, path, query and fragment (where a secret would be).
    #[error("`{0}` is not an http:// or https:// URL of an MCP endpoint")]
    Url(String),
    /// The URL carries a user name or password (`user:pass@host`): it would
    /// be pinned in the component as plain data, and the adapter can derive
    /// no origin from it (its capability would declare no host). Holds the
    /// URL with that part left out.
    #[error(
        "`{0}`: the URL holds a user name or password (`user@` before the host), which would be stored in the \
         component as plain text and leaves it no host to reach: remove `user@` from the URL and give the secret \
         by reference with `--credential NAME` (a `[credentials.NAME]` of the config, bound to this origin)"
    )]
    UrlUserInfo(String),
    /// The URL's query holds what is named as a secret (`?token=…`,
    /// `?api_key=…`) or the value of a configured credential: it would be
    /// pinned in the component as plain text, and the host would send it
    /// unwatched. Holds the URL without its query, and the parameter.
    #[error(
        "`{url}`: the query parameter `{param}` looks like a secret, which would be stored in the component as \
         plain text: remove it from the URL and give the secret by reference with `--credential NAME` (a \
         `[credentials.NAME]` of the config with `apply = {{ query = {{ param = \"{param}\" }} }}`, bound to this \
         origin)"
    )]
    UrlQuerySecret {
        /// The URL without its query.
        url: String,
        /// The parameter's name as written (the host's words for a value: `a configured credential`).
        param: String,
    },
    /// The URL holds the secret of a configured credential (in its path,
    /// query or fragment): it would be pinned as plain text. Holds the
    /// URL's origin only.
    #[error(
        "`{0}`: the URL holds the secret of a configured credential, which would be stored in the component as \
         plain text: give it by reference with `--credential NAME` (`apply = {{ query = … }}` or a header); a \
         server that takes its key only in the URL's path cannot be imported with it"
    )]
    UrlSecret(String),
    /// The credential cannot be used for this URL.
    #[error("{0}")]
    Credential(String),
    /// Talking to the remote failed.
    #[error("cannot list the tools of the MCP server at {url}: {}", crate::one_line(.reason))]
    Remote {
        /// The endpoint.
        url: String,
        /// Why.
        reason: String,
    },
    /// The operator's `--name` cannot be the ids' server segment.
    #[error("{}", crate::one_line(.0))]
    Name(String),
    /// What the remote offers cannot be pinned.
    #[error("the MCP server at {url}: {}", crate::one_line(.reason))]
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

/// `scheme`, `host`, `port` of an MCP endpoint URL; refused unless it is
/// `http(s)://host[:port]/path` with an origin the adapter derives too (its
/// capability declaration), and without a user name or password.
pub fn endpoint(url: &str) -> Result<(String, String, u16), ImportError> {
    let (scheme_part, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((_, host)) = authority.rsplit_once('@') {
        // Shown without what precedes the `@`: it may be a password.
        let tail = &rest[authority.len()..];
        return Err(ImportError::UrlUserInfo(format!(
            "{scheme_part}://…@{host}{}",
            tail.split('?').next().unwrap_or("")
        )));
    }
    let uri: http::Uri = url.parse().map_err(|_| ImportError::Url(redacted(url)))?;
    if let Some(param) = uri.query().and_then(secret_parameter) {
        let bare = url.split(['?', '#']).next().unwrap_or("");
        return Err(ImportError::UrlQuerySecret { url: bare.to_owned(), param: crate::one_line(param) });
    }
    let scheme = uri.scheme_str().map(str::to_ascii_lowercase).ok_or_else(|| ImportError::Url(redacted(url)))?;
    if scheme != "http" && scheme != "https" {
        return Err(ImportError::Url(redacted(url)));
    }
    let host = uri.host().ok_or_else(|| ImportError::Url(redacted(url)))?.to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
    // What the adapter reads its own host from: a URL it derives none from
    // would pin a component that can reach nothing.
    if toolgate_sdk::mcp::origin(url).is_none() {
        return Err(ImportError::Url(redacted(url)));
    }
    Ok((scheme, host, port))
}

/// The first parameter of `query` whose name says it holds a secret — a
/// token, key, secret, password, signature, session or credential, in the
/// spellings APIs use (`access_token`, `apiKey`, `X-Api-Key`, `sig`, `pwd`,
/// `client_secret`, `sessionid`). Names are read as words (split at `-`,
/// `_`, `.` and camelCase), so `max_tokens`, `tokenizer`, `author`,
/// `sortKey` or `monkey` are not secrets.
fn secret_parameter(query: &str) -> Option<&str> {
    // A word of the name that alone makes it a secret's.
    const WORDS: &[&str] = &[
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "signature",
        "sig",
        "session",
        "sid",
        "credential",
        "credentials",
        "jwt",
        "bearer",
        "auth",
        "authorization",
        "apikey",
        "accesskey",
        "privatekey",
    ];
    // Words after which `key` names a secret (`api_key`, `X-Api-Key`, `subscription-key`).
    const KEY_OF: &[&str] = &[
        "api",
        "access",
        "app",
        "auth",
        "client",
        "dev",
        "license",
        "master",
        "private",
        "secret",
        "session",
        "shared",
        "signing",
        "subscription",
        "user",
        "sas",
        "x",
    ];
    // Whole names, written as one word.
    const JOINED: &[&str] = &[
        "key",
        "code",
        "apikey",
        "accesskey",
        "accesstoken",
        "authtoken",
        "refreshtoken",
        "idtoken",
        "sessionid",
        "sessiontoken",
        "clientsecret",
        "secretkey",
        "privatekey",
        "subscriptionkey",
        "signingkey",
        "masterkey",
        "appkey",
        "authkey",
        "clientkey",
        "licensekey",
        "sharedkey",
        "userkey",
        "devkey",
        "saskey",
    ];
    query.split(['&', ';']).map(|pair| pair.split('=').next().unwrap_or("")).find(|name| {
        let words = words_of(name);
        let joined: String = words.concat();
        JOINED.contains(&joined.as_str())
            || words.iter().any(|w| WORDS.contains(&w.as_str()))
            || words.windows(2).any(|p| p[1] == "key" && KEY_OF.contains(&p[0].as_str()))
    })
}

/// `name` as lower-case words: split at anything not a letter or digit and
/// where a lower-case letter or digit meets an upper-case one.
fn words_of(name: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            words.extend((!word.is_empty()).then(|| std::mem::take(&mut word)));
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower {
            words.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    words.extend((!word.is_empty()).then_some(word));
    words
}

/// How long an import may take by default, from the first request to the
/// last page: a remote that stops answering does not hold it longer.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// Most `tools/list` pages read (as the adapter reads when it verifies a pin).
pub const MAX_PAGES: usize = 64;

/// Most tools listed: more than a component may export cannot be imported.
pub const MAX_TOOLS: usize = toolgate::catalog::descriptor::MAX_TOOLS_PER_COMPONENT;

/// Most bytes of descriptions and schemas listed: each is part of a
/// descriptor, and a component's descriptors may not exceed this together.
pub const MAX_DEFINITION_BYTES: usize = toolgate::catalog::descriptor::MAX_METADATA_BYTES;

/// Largest single response read (rmcp's default is 16 MiB): a page larger
/// than every descriptor a component may hold is refused unread.
const MAX_RESPONSE_BYTES: usize = 4 * MAX_DEFINITION_BYTES;

/// The current value of every configured credential. Whatever an import
/// pins becomes model-visible descriptors, so a remote's tool definitions
/// that hold any of them (in any encoding the host's response check knows)
/// are refused: a remote that learned a credential (it is sent one at call
/// time) cannot hand it to every model that reads its Tools.
pub struct ConfiguredSecrets {
    values: Vec<(String, Vec<u8>)>,
    unreadable: Vec<(String, String)>,
}

impl std::fmt::Debug for ConfiguredSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        let names: Vec<_> = self.values.iter().map(|(n, _)| n).collect();
        f.debug_struct("ConfiguredSecrets").field("checked", &names).field("unreadable", &self.unreadable).finish()
    }
}

impl ConfiguredSecrets {
    /// No configured credential (no config was found).
    pub fn none() -> Self {
        ConfiguredSecrets { values: Vec::new(), unreadable: Vec::new() }
    }

    /// Read each credential's secret now, to check against; one that cannot
    /// be read is listed in [`ConfiguredSecrets::unreadable`].
    pub fn read<'a>(specs: impl IntoIterator<Item = &'a CredentialSpec>) -> Self {
        let mut secrets = ConfiguredSecrets::none();
        for spec in specs {
            match spec.read_to_check() {
                Ok(s) => secrets.values.push((spec.name.clone(), s.expose().to_vec())),
                Err(e) => secrets.unreadable.push((spec.name.clone(), e.to_string())),
            }
        }
        secrets
    }

    /// Credentials whose secret could not be read (name, why): the
    /// definitions were not checked for them, which the caller must say.
    pub fn unreadable(&self) -> &[(String, String)] {
        &self.unreadable
    }

    /// A scanner for every secret that was read (also what a Skill's pack
    /// checks its content against).
    pub fn scanner(&self) -> toolgate::sandbox::scan::SecretScanner {
        toolgate::sandbox::scan::SecretScanner::new(&self.values)
    }
}

/// List the remote's tools once, applying `credential` as the host would,
/// within `timeout`, reading at most [`MAX_PAGES`] pages, [`MAX_TOOLS`]
/// tools and [`MAX_DEFINITION_BYTES`] of definitions. What it lists is
/// refused if it holds the import credential's secret or any of `secrets`.
/// Runs on a Tokio runtime with its time driver enabled.
pub async fn discover(
    url: &str,
    credential: Option<&CredentialSpec>,
    secrets: &ConfiguredSecrets,
    timeout: std::time::Duration,
) -> Result<Discovered, ImportError> {
    let (scheme, host, port) = endpoint(url)?;
    // A configured secret anywhere in the URL — its path (`/s/<key>/mcp`),
    // query or fragment — under any name: it would be pinned.
    if secrets.scanner().find(url.as_bytes()).is_some() {
        return Err(ImportError::UrlSecret(format!("{scheme}://{host}:{port}/…")));
    }
    let mut target = url.to_owned();
    let mut headers = HashMap::new();
    let mut watch = secrets.values.clone();
    if let Some(spec) = credential {
        let secret = spec.materialize(&scheme, &host, port).map_err(|e| ImportError::Credential(e.to_string()))?;
        let mut request = http::Request::builder().uri(url).body(()).map_err(|_| ImportError::Url(redacted(url)))?;
        toolgate::sandbox::outbound::apply(&mut request, spec, &secret)
            .map_err(|_| ImportError::Credential(format!("credential `{}` cannot be applied to {url}", spec.name)))?;
        watch.push((spec.name.clone(), secret.expose().as_bytes().to_vec()));
        target = request.uri().to_string();
        headers = request.headers().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    // An error's text can hold the URL the secret was written into (a
    // query credential) or the server's bytes: it is shown only once checked.
    let scanner = toolgate::sandbox::scan::SecretScanner::new(&watch);
    drop(watch);
    let remote = |reason: String| {
        let reason = reason.replace(&target, url);
        let reason = match scanner.find(reason.as_bytes()) {
            None => reason,
            Some(f) => format!("an error whose text held {f}; its text is withheld"),
        };
        ImportError::Remote { url: url.to_owned(), reason }
    };
    let refuse = |reason: String| ImportError::Tools { url: url.to_owned(), reason };
    // https needs a crypto provider; the first install wins and later ones are no-ops.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = StreamableHttpClientTransportConfig::with_uri(target.clone())
        .custom_headers(headers)
        .max_json_response_size(MAX_RESPONSE_BYTES)
        .max_sse_event_size(MAX_RESPONSE_BYTES);
    let transport = StreamableHttpClientTransport::from_config(config);
    let now = tokio::time::Instant::now();
    // A timeout past what the clock can hold is no deadline at all: a year.
    let deadline = now.checked_add(timeout).unwrap_or_else(|| now + std::time::Duration::from_secs(365 * 86_400));
    let session = async {
        let client = ().serve(transport).await.map_err(|e| remote(e.to_string()))?;
        let server_name = client.peer_info().and_then(|i| i.server_info.as_ref().map(|s| s.name.clone()));
        let listed = list_pages(client.peer(), &remote, &refuse).await;
        Ok::<_, ImportError>((client, server_name, listed))
    };
    let (client, server_name, listed) = tokio::time::timeout_at(deadline, session).await.map_err(|_| {
        refuse(format!(
            "it did not list its tools within {} s; nothing was written (pass `--timeout SECS` for a slow server)",
            timeout.as_secs_f64()
        ))
    })??;
    // Ending the session is a courtesy: a remote that does not answer does not hold the import.
    let _ = tokio::time::timeout_at(deadline, client.cancel()).await;
    let discovered = Discovered { server_name, tools: listed? };
    refuse_secrets(&discovered, &scanner).map_err(refuse)?;
    Ok(discovered)
}

/// Every page of `tools/list`, within the limits; stops at the first past one.
async fn list_pages(
    peer: &rmcp::Peer<rmcp::RoleClient>,
    remote: &dyn Fn(String) -> ImportError,
    refuse: &dyn Fn(String) -> ImportError,
) -> Result<Vec<RemoteTool>, ImportError> {
    let mut tools = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor);
        let page = peer.list_tools(Some(params)).await.map_err(|e| remote(e.to_string()))?;
        for t in page.tools {
            if tools.len() == MAX_TOOLS {
                return Err(refuse(format!(
                    "it lists more than {MAX_TOOLS} tools, more than a component may export; nothing was written"
                )));
            }
            let tool = RemoteTool {
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
            };
            bytes = bytes.saturating_add(definition_bytes(&tool));
            if bytes > MAX_DEFINITION_BYTES {
                return Err(refuse(format!(
                    "its tool definitions are more than the {MAX_DEFINITION_BYTES} bytes a component's descriptors \
                     may hold; nothing was written"
                )));
            }
            tools.push(tool);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
    Err(refuse(format!(
        "it lists its tools in more than {MAX_PAGES} pages (read {} tools so far); nothing was written",
        tools.len()
    )))
}

/// Bytes of `tool`'s definition that its descriptor will hold (at least).
fn definition_bytes(tool: &RemoteTool) -> usize {
    let json = |v: &serde_json::Value| serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX);
    tool.name
        .len()
        .saturating_add(tool.description.as_ref().map_or(0, String::len))
        .saturating_add(json(&tool.input_schema))
        .saturating_add(tool.output_schema.as_ref().map_or(0, json))
}

/// Whether what was listed holds a watched secret: the first finding, naming
/// the credential and where (never the value, nor a name that holds it).
fn refuse_secrets(discovered: &Discovered, scanner: &toolgate::sandbox::scan::SecretScanner) -> Result<(), String> {
    let held = |f: toolgate::sandbox::scan::Finding, place: String| {
        format!(
            "{place} holds the secret of credential `{}` ({}); tool definitions are what every model that sees \
             the Tools reads, so the import is refused and nothing was written. The server knows this secret: \
             rotate it",
            f.credential, f.form
        )
    };
    if let Some(name) = &discovered.server_name
        && let Some(f) = scanner.find(name.as_bytes())
    {
        return Err(held(f, "its server name (`serverInfo.name`)".into()));
    }
    for (i, t) in discovered.tools.iter().enumerate() {
        if let Some(f) = scanner.find(t.name.as_bytes()) {
            return Err(held(f, format!("the name of its tool #{} (of those listed)", i + 1)));
        }
        // As the component pins it: the description, the schemas, the hints.
        let text = serde_json::json!({
            "description": t.description,
            "inputSchema": t.input_schema,
            "outputSchema": t.output_schema,
            "annotations": t.annotations,
        });
        let text = serde_json::to_vec(&text).map_err(|e| format!("the definition of its tool `{}`: {e}", t.name))?;
        let found = t.description.as_deref().and_then(|d| scanner.find(d.as_bytes())).or_else(|| scanner.find(&text));
        if let Some(f) = found {
            return Err(held(f, format!("the definition of its tool `{}`", t.name)));
        }
    }
    Ok(())
}

/// The server segment of the Tool ids for the operator's `--name`: the name
/// with every character an id cannot hold replaced by `_`. Refused (naming
/// the sanitized form and a name to use instead) when that is empty, holds
/// `__`, or starts or ends with `_`: then `mcp__<segment>__` is a prefix no
/// other name produces, and no name lands its Tools under the ids — and so
/// the grants, rules and visibility patterns — written for another server
/// (`github: community` would give `mcp__github__community__<tool>`, matched
/// by `mcp__github__*`). The tool segment needs no such rule: whatever a
/// tool is called, its id starts with its own server's prefix.
pub fn server_segment(name: &str) -> Result<String, ImportError> {
    let segment = sanitize(name);
    let why = if name.is_empty() {
        "the name is empty".to_owned()
    } else if segment.contains("__") {
        let other = match segment.split("__").next() {
            Some(first) if !first.is_empty() => format!(" (rules written for `mcp__{first}__*` would match them)"),
            _ => String::new(),
        };
        format!("`{segment}` holds `__`, so its Tools would fall under the ids of another server's name{other}")
    } else if segment.starts_with('_') || segment.ends_with('_') {
        format!(
            "`{segment}` starts or ends with `_`, next to the `__` around a server's segment, so the ids' prefix \
             would not be one only this name gives"
        )
    } else {
        return Ok(segment);
    };
    let suggested = segment.split('_').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("_");
    let instead = if suggested.is_empty() { "NAME".to_owned() } else { suggested };
    Err(ImportError::Name(format!(
        "`--name {name:?}` gives the Tool ids `mcp__{segment}__<tool>`: {why}. Pass `--name {instead}` instead: \
         letters, digits, `-`, `.`, and single `_` between them"
    )))
}

/// Pin what was discovered: ids `mcp__<name>__<tool>`, unique, each
/// descriptor checked as a host will. The name is the operator's (`--name`),
/// never the server's own `serverInfo.name`: the ids decide which of the
/// config's grants, rules and visibility patterns apply, and a server calling
/// itself `github` would otherwise land under the rules written for another.
pub fn pin(
    url: &str,
    discovered: &Discovered,
    name: Option<&str>,
    credential: Option<&str>,
) -> Result<AdapterConfig, ImportError> {
    endpoint(url)?;
    let bad = |reason: String| ImportError::Tools { url: url.to_owned(), reason };
    let server = match (name, &discovered.server_name) {
        (Some(n), _) if !n.trim().is_empty() => server_segment(n)?,
        (_, Some(n)) if !n.trim().is_empty() => {
            // The server's name is quoted for the operator, escaped and cut short: it is the server's text.
            let shown: String = n.chars().take(64).collect();
            return Err(bad(format!(
                "pass `--name NAME`: its Tools are `mcp__NAME__<tool>`, and the config's grants and rules for \
                 those ids apply to them, so the name is yours to choose, not the server's (it calls itself {shown:?})"
            )));
        }
        _ => return Err(bad("pass `--name NAME` for the Tool ids (`mcp__NAME__<tool>`)".into())),
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
    fn pins_ids_from_the_operators_name_never_the_servers() {
        let d = Discovered { server_name: Some("github".into()), tools: vec![tool("add")] };
        let e = pin("http://h/mcp", &d, None, None).unwrap_err().to_string();
        assert!(e.contains("--name") && e.contains("\"github\""), "{e}");
        let d = Discovered { server_name: Some("Calc Server".into()), tools: vec![tool("add"), tool("sub")] };
        let c = pin("http://127.0.0.1:1/mcp", &d, Some("Calc Server"), Some("calc")).unwrap();
        assert_eq!(c.server, "Calc_Server");
        let ids: Vec<_> = c.tools.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["mcp__Calc_Server__add", "mcp__Calc_Server__sub"]);
        assert_eq!(c.credential.as_deref(), Some("calc"));
        assert_eq!(pin("http://h/mcp", &d, Some("calc"), None).unwrap().tools[0].id, "mcp__calc__add");
    }

    /// The ids' server segment is one no other name can reach into: a name
    /// that sanitizes to something with `__` in it, or that starts or ends
    /// with `_`, would put its Tools under another server's ids
    /// (`github: community` → `mcp__github__community__x`, matched by the
    /// rules for `mcp__github__*`), so it is refused, naming the sanitized
    /// form and what to use instead. A tool name cannot leave the prefix.
    #[test]
    fn a_name_that_would_reach_into_another_servers_ids_is_refused() {
        let url = "http://127.0.0.1:1/mcp";
        let d = Discovered { server_name: None, tools: vec![tool("x"), tool("a__b")] };
        for (name, sanitized) in [
            ("github: community", "github__community"),
            ("github__community", "github__community"),
            ("_github", "_github"),
            ("github_", "github_"),
            ("github ", "github_"),
            ("!!", "__"),
        ] {
            let e = match pin(url, &d, Some(name), None) {
                Ok(c) => panic!("{name:?}: pinned as {:?}", c.tools.iter().map(|t| &t.id).collect::<Vec<_>>()),
                Err(e) => e.to_string(),
            };
            assert!(e.contains(&format!("`{sanitized}`")) && e.contains("--name"), "{name:?}: {e}");
        }
        // Allowed: a single `_` inside; the tool segment may hold anything,
        // the server's prefix stays `mcp__github_community__`.
        let c = pin(url, &d, Some("github community"), None).unwrap();
        let ids: Vec<_> = c.tools.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["mcp__github_community__x", "mcp__github_community__a__b"]);
        assert!(ids.iter().all(|id| !id.starts_with("mcp__github__")));
    }

    #[test]
    fn what_cannot_be_pinned_is_refused_naming_it() {
        let url = "http://127.0.0.1:1/mcp";
        let no_name = Discovered { server_name: None, tools: vec![tool("a")] };
        assert!(pin(url, &no_name, None, None).unwrap_err().to_string().contains("--name"));
        let empty = Discovered { server_name: Some("s".into()), tools: vec![] };
        assert!(pin(url, &empty, Some("s"), None).unwrap_err().to_string().contains("no tools"));
        let clash = Discovered { server_name: Some("s".into()), tools: vec![tool("a/b"), tool("a:b")] };
        let e = pin(url, &clash, Some("s"), None).unwrap_err().to_string();
        assert!(e.contains("`a/b`") && e.contains("`a:b`") && e.contains("mcp__s__a_b"), "{e}");
        // The server's text stays on the error's line.
        let clash = Discovered { server_name: Some("s".into()), tools: vec![tool("a\nb"), tool("a\rb")] };
        let e = pin(url, &clash, Some("s"), None).unwrap_err().to_string();
        assert!(!e.contains(['\n', '\r']) && e.contains(r"`a\nb`") && e.contains(r"`a\rb`"), "{e}");
        let mut bad_schema = tool("x");
        bad_schema.input_schema = json!({"type": "string"});
        let d = Discovered { server_name: Some("s".into()), tools: vec![bad_schema] };
        let e = pin(url, &d, Some("s"), None).unwrap_err().to_string();
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
        let timeout = std::time::Duration::from_secs(DEFAULT_TIMEOUT_SECS);
        let e = discover("http://127.0.0.1:1/mcp", Some(&spec), &ConfiguredSecrets::none(), timeout)
            .await
            .expect_err("unreachable")
            .to_string();
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

    /// Whatever a remote lists is searched for every configured secret, in
    /// every encoding the host's response check knows; the refusal names the
    /// credential and the tool, never the value or a name that holds it.
    #[test]
    fn definitions_that_hold_a_configured_secret_are_refused_naming_the_credential_and_tool() {
        use toolgate::authority::credentials::{Apply, CredentialConfig, Source};
        let (set, unset) = ("TOOLGATE_TEST_IMPORT_CONFIGURED", "TOOLGATE_TEST_IMPORT_NEVER_SET");
        let secret = "cfg-s3cr3t-value-9a7e";
        // SAFETY: only this test uses these variables.
        unsafe { std::env::set_var(set, secret) };
        let spec = |name: &str, var: &str| {
            let config = CredentialConfig {
                source: Source::Env(var.into()),
                destinations: vec!["https://elsewhere.example".into()],
                apply: Apply::Header { name: "X-Key".into(), format: "{}".into() },
            };
            CredentialSpec::new(name, &config, std::path::Path::new("/")).unwrap()
        };
        let (tracker, other) = (spec("tracker", set), spec("other", unset));
        let secrets = ConfiguredSecrets::read([&tracker, &other]);
        assert_eq!(secrets.unreadable().len(), 1);
        assert!(secrets.unreadable()[0].1.contains("`other`"), "{:?}", secrets.unreadable());
        assert!(!format!("{secrets:?}").contains(secret), "never the value");
        let scanner = toolgate::sandbox::scan::SecretScanner::new(&secrets.values);

        let b64 = "Y2ZnLXMzY3IzdC12YWx1ZS05YTdl"; // base64 of the secret
        let with = |f: &dyn Fn(&mut RemoteTool)| {
            let mut t = tool("lookup");
            f(&mut t);
            Discovered { server_name: Some("s".into()), tools: vec![tool("add"), t] }
        };
        let cases: [(&str, Discovered, &str); 5] = [
            ("description, base64", with(&|t| t.description = Some(format!("Looks up. ref {b64}"))), "`lookup`"),
            ("description, raw", with(&|t| t.description = Some(format!("key={secret}"))), "`lookup`"),
            (
                "input schema",
                with(&|t| t.input_schema = json!({"type": "object", "properties": {"k": {"default": secret}}})),
                "`lookup`",
            ),
            ("tool name", with(&|t| t.name = format!("get_{secret}")), "tool #2"),
            ("server name", Discovered { server_name: Some(secret.into()), tools: vec![tool("a")] }, "server name"),
        ];
        for (what, d, place) in cases {
            let e = refuse_secrets(&d, &scanner).expect_err(what);
            assert!(e.contains("credential `tracker`") && e.contains(place), "{what}: {e}");
            assert!(!e.contains(secret) && !e.contains(b64), "{what}: {e}");
        }
        let clean = Discovered { server_name: Some("s".into()), tools: vec![tool("add"), tool("sub")] };
        assert_eq!(refuse_secrets(&clean, &scanner), Ok(()));
    }

    #[test]
    fn urls_must_be_http() {
        for u in ["ftp://h/x", "nonsense", "http:///x"] {
            assert!(matches!(endpoint(u), Err(ImportError::Url(_))), "{u}");
        }
        // Quoted without what could be a secret (a key in the path or query).
        for u in ["mcp.example.com/api/mcp/s/s3cr3t-k3y-0123/mcp", "wss://mcp.example.com/s/s3cr3t-k3y-0123/mcp"] {
            let e = endpoint(u).unwrap_err().to_string();
            assert!(!e.contains("s3cr3t") && e.contains("mcp.example.com"), "{e}");
        }
        assert_eq!(endpoint("https://Mcp.Example.com/mcp").unwrap(), ("https".into(), "mcp.example.com".into(), 443));
    }

    /// A user name or password in the URL would be pinned as plain data
    /// and leave the adapter no origin: refused, the password not shown.
    #[test]
    fn a_url_with_user_info_is_refused_without_showing_it() {
        for u in ["http://bob:pass@h.example/mcp?token=abc", "https://bob@h.example/mcp", "http://:pass@h.example:8080"]
        {
            let e = endpoint(u).unwrap_err();
            assert!(matches!(e, ImportError::UrlUserInfo(_)), "{u}: {e}");
            let e = e.to_string();
            assert!(e.contains("remove `user@`") && e.contains("--credential NAME"), "{e}");
            assert!(!e.contains(":pass") && !e.contains("bob") && !e.contains("abc"), "{e}");
        }
        let d = Discovered { server_name: Some("s".into()), tools: vec![] };
        assert!(matches!(pin("http://bob:pass@h.example/mcp", &d, Some("s"), None), Err(ImportError::UrlUserInfo(_))));
    }

    /// A query parameter named as a secret, in the spellings APIs use, would
    /// be pinned as plain data: refused, naming the parameter, never its
    /// value; ordinary parameters pass.
    #[test]
    fn a_url_whose_query_names_a_secret_is_refused_without_showing_it() {
        for (u, param) in [
            ("https://h.example/mcp?token=s3cr3t-v4lue", "token"),
            ("https://h.example/mcp?v=2&access_token=s3cr3t-v4lue", "access_token"),
            ("https://h.example/mcp?apiKey=s3cr3t-v4lue", "apiKey"),
            ("https://h.example/mcp?X-Api-Key=s3cr3t-v4lue", "X-Api-Key"),
            ("https://h.example/mcp?key=s3cr3t-v4lue", "key"),
            ("https://h.example/mcp?client_secret=s3cr3t-v4lue", "client_secret"),
            ("https://h.example/mcp?sig=s3cr3t-v4lue&se=2030", "sig"),
            ("https://h.example/mcp?password=s3cr3t-v4lue", "password"),
            ("https://h.example/mcp?Authorization=s3cr3t-v4lue", "Authorization"),
            ("https://h.example/mcp?session_id=s3cr3t-v4lue", "session_id"),
            ("https://h.example/mcp?subscription-key=s3cr3t-v4lue", "subscription-key"),
            ("https://h.example/mcp?access_key=s3cr3t-v4lue", "access_key"),
            ("https://h.example/mcp?v=1;sessionid=s3cr3t-v4lue", "sessionid"),
            ("https://h.example/mcp?refreshToken=s3cr3t-v4lue", "refreshToken"),
            ("https://h.example/mcp?auth=s3cr3t-v4lue", "auth"),
        ] {
            let e = endpoint(u).unwrap_err();
            assert!(matches!(&e, ImportError::UrlQuerySecret { param: p, .. } if p == param), "{u}: {e}");
            let e = e.to_string();
            assert!(e.contains("--credential NAME") && e.contains(&format!("param = \"{param}\"")), "{e}");
            assert!(!e.contains("s3cr3t"), "{e}");
        }
        for u in [
            "https://h.example/mcp?v=2",
            "https://h.example/mcp?format=json&region=eu",
            "https://h.example/mcp?sortKey=name&keyword=x&monkey=1&apiVersion=3",
            "https://h.example/mcp?author=alice&authority=x&max_tokens=512&tokenizer=bpe&passenger=2",
            "https://h.example/mcp",
        ] {
            assert!(endpoint(u).is_ok(), "{u}");
        }
    }

    /// A configured credential's secret in the query, under any name: refused
    /// before anything is sent, its value not shown.
    #[tokio::test]
    async fn a_url_holding_a_configured_secret_is_refused_before_anything_is_sent() {
        let secrets =
            ConfiguredSecrets { values: vec![("tracker".into(), b"tr4cker-s3cret-0123".to_vec())], unreadable: vec![] };
        let timeout = std::time::Duration::from_secs(5);
        for u in [
            "http://127.0.0.1:1/mcp?v=tr4cker-s3cret-0123",
            "http://127.0.0.1:1/s/tr4cker-s3cret-0123/mcp",
            "http://127.0.0.1:1/mcp#tr4cker-s3cret-0123",
            "http://127.0.0.1:1/mcp?v=tr4cker%2Ds3cret%2D0123",
        ] {
            let e = discover(u, None, &secrets, timeout).await.unwrap_err();
            assert!(matches!(e, ImportError::UrlSecret(_)), "{u}: {e}");
            assert!(!e.to_string().contains("tr4cker"), "{e}");
        }
    }
}
