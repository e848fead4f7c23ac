//! Config: the host's `toolgate.toml`.
//!
//! Owns parsing and checking the configuration file: plugin directory, store
//! and cache paths, limits, capability grants and agents (visible tools,
//! permission rules, default, narrowing). Unknown keys are errors; every error
//! names the file and the field. Relative paths resolve against the config
//! file's directory. Each directory grant is checked against the host's own
//! state and bound, where it exists, to the directory found at load
//! (`sandbox::grant_dir`): parsing opens those directories, nothing else.
//!
//! Architecture invariant: configuration is data. Nothing here grants
//! authority by itself; grants only bound what a Tool may receive.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use std::sync::Arc;

use crate::authority::credentials::{CredentialConfig, CredentialSpec, Source};
use crate::authority::destination::Destination;
use crate::authority::narrowing::ToolCapabilityNarrowing;
use crate::policy::{Behavior, RuleSpec};

/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Config errors. Each says which file and field, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config {}: {source}; pass `--config FILE` or create toolgate.toml", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the key and line.
        message: String,
    },
    /// The config file itself is where a Tool could change it.
    #[error("refused config {}: {message}", path.display())]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// Why, and what to do.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid config {}: field `{field}`: {message}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// Dotted path of the field.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// Resource limits for one call. Every value has a safe default.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Linear memory a call may use, MiB.
    pub memory_mib: u64,
    /// Wall-clock deadline of one call (CPU included), milliseconds.
    pub timeout_ms: u64,
    /// Largest Tool output, KiB.
    pub output_kib: u64,
    /// Captured stdout, stderr and log per call, KiB each; the rest is dropped.
    pub capture_kib: u64,
    /// How long a confirmation ticket stays valid, seconds.
    pub ticket_ttl_secs: u64,
    /// Largest outbound HTTP request body, KiB.
    pub http_request_kib: u64,
    /// Largest outbound HTTP response body, KiB (buffered, so it can be
    /// checked for secrets before the guest reads it).
    pub http_response_kib: u64,
    /// Response bytes one call may buffer over all its requests, KiB.
    pub http_response_total_kib: u64,
    /// What one call may hold in the host for outbound requests not yet
    /// sent, KiB: header fields it builds, requests' method, authority and
    /// path, and body bytes the HTTP client has not yet taken. Past it a
    /// body write fails (an `error-code` naming this setting) and a header
    /// or target change stops the call.
    pub http_request_total_kib: u64,
    /// Outbound requests of one call in flight at once; more wait.
    pub http_requests_in_flight: u64,
    /// Outbound requests in flight in the whole host; more wait.
    pub http_requests_in_flight_host: u64,
    /// Largest set of HTTP header fields a guest may build, KiB.
    pub http_field_kib: u64,
    /// Handles (streams, fields, requests, …) one call may hold at once.
    pub resource_table_entries: u64,
    /// Files, directories and directory listings one call may hold open at
    /// once (each is a descriptor of the host process); past it, opening fails.
    pub open_files: u64,
    /// File read/write streams one call may hold at once (each may hold a
    /// 64 KiB host buffer until the guest takes the data).
    pub file_streams: u64,
    /// Largest arguments of one call, KiB of JSON text (nesting is bounded
    /// too, at 128 levels): checked before anything else reads them — the
    /// schema check, the gate, the journal. Over it the call is a Tool error.
    pub arguments_kib: u64,
    /// Bytes one call may write to files in its read-write grants, MiB
    /// (every byte written counts, also over bytes already there); past it
    /// a write fails with `insufficient-space`, as on a full disk.
    pub disk_write_mib: u64,
    /// Files, directories and links one call may create in its read-write
    /// grants (every open with `create` counts); past it creating fails with
    /// `insufficient-space`, as when a filesystem is out of inodes.
    pub files_created: u64,
    /// Largest file a guest may open while any credential is configured,
    /// MiB: the host checks a file for every configured secret before the
    /// guest gets it, and refuses a larger one (naming this
    /// setting) rather than let it through unchecked.
    pub file_check_mib: u64,
    /// Largest state one Tool keeps for one agent (keys and values), KiB:
    /// every call of the Tool reads it whole. A call whose Commands would
    /// grow it past this gets a Tool error and changes nothing.
    pub state_kib: u64,
    /// Longest a component may take to compile, milliseconds; past it the
    /// call fails and the component is marked unhealthy.
    pub compile_timeout_ms: u64,
    /// Outbound HTTP connect / first-byte / between-bytes timeout, milliseconds.
    pub http_timeout_ms: u64,
    /// Component instances alive at once, all Tools together; further calls
    /// wait for a slot (back-pressure) instead of failing.
    pub max_instances: u64,
    /// Instances of one Tool alive at once; further calls of it wait.
    pub max_instances_per_tool: u64,
    /// A host approving a ticket beats a heartbeat four times per lease; a
    /// claim whose holder's heartbeat is older than this is taken over and
    /// settled as interrupted by the next host to start, seconds.
    pub claim_lease_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mib: 64,
            timeout_ms: 10_000,
            output_kib: 1024,
            capture_kib: 64,
            ticket_ttl_secs: 86_400,
            http_request_kib: 1024,
            http_response_kib: 4096,
            http_response_total_kib: 16384,
            http_request_total_kib: 4096,
            http_requests_in_flight: 8,
            http_requests_in_flight_host: 64,
            http_field_kib: 64,
            resource_table_entries: 4096,
            open_files: 256,
            file_streams: 256,
            file_check_mib: 64,
            arguments_kib: 4096,
            disk_write_mib: 64,
            files_created: 4096,
            state_kib: 1024,
            compile_timeout_ms: 60_000,
            http_timeout_ms: 30_000,
            max_instances: 64,
            max_instances_per_tool: 16,
            claim_lease_secs: 60,
        }
    }
}

/// A directory the host grants, mapped to the guest path a Tool declares.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DirectoryGrant {
    /// Guest path, as the Tool declares it (e.g. `/data`).
    pub path: String,
    /// Host directory behind it.
    pub host: PathBuf,
    /// `read` or `read-write`.
    pub access: toolgate_sdk::Access,
    /// The directory this entry is bound to at load, or at its first use (not configuration).
    #[serde(skip)]
    pub bound: crate::sandbox::grant_dir::GrantDir,
}

/// Authority the host grants to the Tools whose id matches `tools`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Tool id or glob (`files.*`).
    pub tools: String,
    /// Directories.
    #[serde(default)]
    pub directories: Vec<DirectoryGrant>,
    /// Outbound HTTP destinations, `scheme://host:port`.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Credential names (defined under `[credentials.NAME]`).
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Environment variables set to these literal, non-secret values.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// One agent's view and policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Tool ids or globs the model may see. Default: none.
    #[serde(default)]
    pub visible: Vec<String>,
    /// Permission rules.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// Behaviour when no rule matches. Default: deny.
    #[serde(default = "deny")]
    pub default: Behavior,
    /// `configured` (default) or `deny-all`.
    #[serde(default = "configured")]
    pub narrowing: ToolCapabilityNarrowing,
    /// Further narrows the authority this agent's Tools get; absent lists
    /// do not narrow. It can only remove what the grants gave.
    #[serde(default)]
    pub authority: Restriction,
}

/// A narrowing of concrete authority: each present list is intersected with
/// what the grants give; an absent list leaves that kind as granted.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Restriction {
    /// Guest paths that may stay mounted.
    pub directories: Option<Vec<String>>,
    /// Destinations that may stay reachable (exact grants or patterns covering them).
    pub hosts: Option<Vec<String>>,
    /// Credentials that may stay usable.
    pub credentials: Option<Vec<String>>,
}

impl Restriction {
    /// The restriction that removes every directory, host and credential.
    pub fn nothing() -> Self {
        Restriction { directories: Some(Vec::new()), hosts: Some(Vec::new()), credentials: Some(Vec::new()) }
    }
}

fn deny() -> Behavior {
    Behavior::Deny
}
fn configured() -> ToolCapabilityNarrowing {
    ToolCapabilityNarrowing::Configured
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    plugins: Option<PathBuf>,
    store: Option<String>,
    #[serde(default)]
    durability: Durability,
    #[serde(default = "yes")]
    baseline_compiler: bool,
    #[serde(default)]
    postgres: Option<PostgresOptions>,
    cache: Option<PathBuf>,
    lock: Option<PathBuf>,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    grants: Vec<Grant>,
    #[serde(default)]
    agents: BTreeMap<String, AgentConfig>,
    #[serde(default)]
    credentials: BTreeMap<String, CredentialConfig>,
    #[serde(default)]
    signing: Option<SigningConfig>,
    #[serde(default)]
    approval: Option<ApprovalConfig>,
    #[serde(default)]
    serve: ServeConfig,
}

pub use crate::store::Durability;

/// Where the journal lives: the `store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// `:memory:` — nothing survives the process (CI, benchmarks).
    Memory,
    /// A SQLite file (the embedded default, one machine).
    Sqlite(PathBuf),
    /// A PostgreSQL server several hosts share.
    Postgres(PostgresStore),
}

impl StoreLocation {
    /// The SQLite file, if the journal is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            StoreLocation::Sqlite(p) => Some(p),
            _ => None,
        }
    }

    /// The Unix sockets a PostgreSQL journal connects through (`host=/dir`:
    /// `/dir/.s.PGSQL.<port>`); none for SQLite, TCP hosts, or a connection
    /// string that does not parse (the store says so when it connects).
    pub fn unix_sockets(&self) -> Vec<PathBuf> {
        #[cfg(all(unix, feature = "postgres"))]
        if let StoreLocation::Postgres(pg) = self
            && let Ok(c) = <tokio_postgres::Config as std::str::FromStr>::from_str(&pg.dsn)
        {
            let ports = c.get_ports();
            return c
                .get_hosts()
                .iter()
                .enumerate()
                .filter_map(|(i, h)| match h {
                    tokio_postgres::config::Host::Unix(dir) => {
                        // One port for every host, one per host, or the default.
                        let port = ports.get(i).or_else(|| ports.first()).copied().unwrap_or(5432);
                        Some(dir.join(format!(".s.PGSQL.{port}")))
                    }
                    _ => None,
                })
                .collect();
        }
        Vec::new()
    }
}

/// A PostgreSQL journal: the connection string (without a password) and
/// `[postgres]` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresStore {
    /// `postgres://…`, `postgresql://…` or a libpq `key=value` string.
    pub dsn: String,
    /// The password, by reference (`[postgres] password`).
    pub password: Option<Source>,
    /// Connections per host (`[postgres] pool_size`).
    pub pool_size: usize,
    /// PEM certificates trusted for the server's TLS certificate, besides the
    /// public web roots (`[postgres] ca_file`).
    pub ca_file: Option<PathBuf>,
}

/// `[postgres]`: options of a PostgreSQL `store`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct PostgresOptions {
    password: Option<Source>,
    #[serde(default = "default_pool_size")]
    pool_size: usize,
    ca_file: Option<PathBuf>,
}

fn default_pool_size() -> usize {
    8
}

/// Whether a `store` value names a PostgreSQL server: a `postgres://` or
/// `postgresql://` URL, or a libpq `key=value` string.
fn is_postgres(store: &str) -> bool {
    let s = store.trim_start();
    s.starts_with("postgres://")
        || s.starts_with("postgresql://")
        || s.split_whitespace().next().is_some_and(|first| {
            first
                .split_once('=')
                .is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        })
}

/// Whether a PostgreSQL connection string carries a password itself (which
/// would then sit in the config file and in every log of the value).
fn dsn_has_password(dsn: &str) -> bool {
    let s = dsn.trim_start();
    if let Some(rest) = s.strip_prefix("postgresql://").or_else(|| s.strip_prefix("postgres://")) {
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        let userinfo_has_password = authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':'));
        let query_has_password =
            rest.split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv.split('=').next() == Some("password")));
        userinfo_has_password || query_has_password
    } else {
        s.split_whitespace().any(|kv| kv.split('=').next().map(str::trim) == Some("password"))
    }
}

/// The longest agent name, bytes.
pub const MAX_AGENT_NAME: usize = 64;

/// An agent name (`[agents.NAME]`): letters, digits, `_`, `-` and `.`,
/// starting with a letter or digit, at most [`MAX_AGENT_NAME`] bytes — it is
/// recorded in the journal and given on the command line (`--agent`).
pub fn check_agent_name(name: &str) -> Result<(), String> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && name.len() <= MAX_AGENT_NAME;
    if ok {
        Ok(())
    } else {
        Err(format!(
            "is not a usable agent name; name it with a letter or digit followed by letters, digits, `_`, `-` or \
             `.` (at most {MAX_AGENT_NAME}), e.g. `[agents.main]`"
        ))
    }
}

/// A browser origin as `serve.allowed_origins` lists it: exactly what a
/// browser sends in `Origin` — `scheme://host[:port]`, lowercase, no path,
/// no user, no default port — and a valid header value. `*` and `null` are
/// refused: the list names the pages trusted, each one.
pub fn check_origin(origin: &str) -> Result<(), String> {
    let fix = "list each page's origin as a browser sends it, `scheme://host[:port]` (e.g. \
               `https://app.example.com` or `http://localhost:5173`), or leave the list empty to refuse every \
               browser origin";
    if origin == "*" {
        return Err(format!("`*` (any origin) is not accepted: any web page could use this server; {fix}"));
    }
    if http::HeaderValue::from_str(origin).is_err() {
        return Err(format!("{origin:?} is not a valid header value (control characters or non-ASCII); {fix}"));
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Err(format!("`{origin}` is not `scheme://host[:port]`; {fix}"));
    };
    let scheme_ok = scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Err(format!("`{origin}`: `{scheme}` is not a URL scheme; {fix}"));
    }
    if rest.contains(['/', '?', '#', '@', ' ']) {
        return Err(format!(
            "`{origin}` has a path, query, user or space, which a browser's `Origin` never carries; {fix}"
        ));
    }
    let (host, port) = match rest.rsplit_once(':') {
        // An IPv6 literal's own colons: `[::1]` or `[::1]:8080`.
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (rest, None),
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    };
    if !host_ok {
        return Err(format!("`{origin}`: `{host}` is not a host name or address; {fix}"));
    }
    if let Some(p) = port {
        let n = p.parse::<u16>().ok().filter(|n| *n != 0 && !p.starts_with('0'));
        let Some(n) = n else {
            return Err(format!("`{origin}`: `{p}` is not a port (1 to 65535, no leading zeros); {fix}"));
        };
        if (scheme == "https" && n == 443) || (scheme == "http" && n == 80) {
            return Err(format!(
                "`{origin}`: a browser leaves out the default port, so this never matches; write `{scheme}://{host}`"
            ));
        }
    }
    if origin.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(format!(
            "`{origin}` has capital letters; a browser sends its origin in lowercase, so this never matches: \
             write `{}`",
            origin.to_ascii_lowercase()
        ));
    }
    Ok(())
}

/// `[serve]`: how `toolgate serve` runs (read by that front end).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// How long calls in flight may finish at shutdown before they are cancelled, milliseconds.
    pub grace_ms: u64,
    /// `Host` headers accepted over HTTP (DNS-rebinding protection); a name without a port matches any port.
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin`s accepted over HTTP; empty: a request carrying any `Origin` is refused.
    pub allowed_origins: Vec<String>,
    /// Largest HTTP request body, KiB.
    pub max_body_kib: u64,
    /// HTTP connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// HTTP connections served at once from one peer address (IPv6: one
    /// /64); more are refused (429). Behind a reverse proxy every client has
    /// the proxy's address: raise it (to `max_connections`) and limit there.
    pub max_connections_per_address: usize,
    /// Live MCP sessions per `[[serve.auth]]` entry; a new one past it is
    /// refused (429) until one ends (DELETE, idle timeout).
    pub max_sessions_per_token: usize,
    /// HTTP requests of one `[[serve.auth]]` entry open at once, each until
    /// its response ends (an SSE stream while it is open); more are refused (429).
    pub max_requests_per_token: usize,
    /// How long a client has to send a request's headers, milliseconds
    /// (from the connection, or from the end of its previous request).
    pub header_timeout_ms: u64,
    /// How long an HTTP session may go without a request and with no SSE
    /// stream open (a GET stream held open keeps it) before it is closed
    /// and its place freed, seconds.
    pub session_idle_secs: u64,
    /// The endpoint's public URL (for the OAuth protected-resource metadata), if not `http://ADDR/mcp`.
    pub public_url: Option<String>,
    /// Authorization servers named in the protected-resource metadata.
    pub authorization_servers: Vec<String>,
    /// Bearer tokens accepted over HTTP, each bound to one agent.
    pub auth: Vec<ServeAuth>,
    /// The key that seals the `requestState` of 2026-07-28 asks, by reference
    /// (at least 32 characters): replicas that share it (and a journal)
    /// resume each other's asks. Without it each process makes its own.
    pub state_key: Option<Source>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            grace_ms: 1000,
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
            max_body_kib: 4096,
            max_connections: 1024,
            max_connections_per_address: 64,
            max_sessions_per_token: 32,
            max_requests_per_token: 128,
            header_timeout_ms: 30_000,
            session_idle_secs: 1800,
            public_url: None,
            authorization_servers: Vec::new(),
            auth: Vec::new(),
            state_key: None,
        }
    }
}

/// One accepted bearer token (by reference) and the agent it acts for.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServeAuth {
    /// The agent requests with this token act for; never chosen by the client.
    pub agent: String,
    /// Where the token comes from: `{ env = "VAR" }` or `{ file = "path" }` (0600).
    pub token: Source,
}

/// `[approval]`: who may decide tickets.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalConfig {
    /// Approver public keys (`toolgate keygen --for approval`).
    #[serde(default)]
    keys: Option<Vec<String>>,
    /// Whether an answer in an MCP client's own UI (elicitation) decides a
    /// ticket. Default: `true` without `keys`, `false` with them (an agent
    /// with a shell can run a client of its own and answer its own ask); set
    /// `true` to trust the MCP client's UI as well as the key holders.
    #[serde(default)]
    mcp_elicitation: Option<bool>,
}

/// `[signing]`: publishers whose components this host accepts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SigningConfig {
    keys: Vec<String>,
}

/// A checked configuration with absolute paths.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, if any.
    pub source: Option<PathBuf>,
    /// Plugin directory.
    pub plugins: PathBuf,
    /// Where the journal lives.
    pub store: StoreLocation,
    /// What an acknowledged step survives (SQLite journal).
    pub durability: Durability,
    /// A component never compiled runs its first calls on the baseline
    /// compiler's code (Winch) while Cranelift compiles it (default `true`).
    pub baseline_compiler: bool,
    /// Compiled-component cache directory.
    pub cache: PathBuf,
    /// `toolgate.lock`: when it exists, only pinned plugin digests load.
    pub lock: PathBuf,
    /// Per-call limits.
    pub limits: Limits,
    /// Capability grants.
    pub grants: Vec<Grant>,
    /// Agents by name.
    pub agents: BTreeMap<String, AgentConfig>,
    /// Credentials by name: where the secret comes from, never the secret.
    pub credentials: BTreeMap<String, Arc<CredentialSpec>>,
    /// With keys, only components signed by one of them load.
    pub trusted_keys: crate::keys::TrustedKeys,
    /// `[approval] keys`: with keys, a ticket is decided by a signature of
    /// one of them (or in an MCP client's own UI, if `mcp_elicitation`),
    /// never on a bare terminal.
    pub approvers: crate::keys::TrustedKeys,
    /// `[approval] mcp_elicitation` in effect: whether an answer in an MCP
    /// client's own UI decides a ticket (and `toolgate serve` asks there).
    /// Default: only when no approver keys are configured.
    pub mcp_elicitation: bool,
    /// `[serve]`: how `toolgate serve` runs.
    pub serve: ServeConfig,
}

/// The parser's error as the operator reads it: the line, column and what
/// is wrong, and the line with what its strings hold left out — never the
/// line as written, which may hold a secret written where its source
/// belongs (`source = "ghp_…"`; a duplicate key, an unclosed string or a
/// typo beside it quoted that line too). An error in a secret's source
/// shows no line at all ([`crate::authority::credentials::SOURCE_ERROR`]).
fn parse_error_text(e: &toml::de::Error, text: &str) -> String {
    let Some(span) = e.span() else { return e.message().to_owned() };
    let before = text.get(..span.start).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let at = format!("line {line}, column {column}: {}", e.message());
    if e.message().contains(crate::authority::credentials::SOURCE_ERROR) {
        return at;
    }
    let written = text.lines().nth(line - 1).unwrap_or("");
    format!("{at}\n  {line} | {}", without_strings(written))
}

/// `line` with the contents of each quoted string (and of a string left
/// open) shown as `…`; numbers stay (only a source could hold a secret, and
/// its errors show no line).
fn without_strings(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut open: Option<char> = None;
    for c in line.chars() {
        match open {
            Some(q) if c == q => {
                out.push('…');
                out.push(c);
                open = None;
            }
            Some(_) => {}
            None if c == '"' || c == '\'' => {
                out.push(c);
                open = Some(c);
            }
            None => out.push(c),
        }
    }
    if open.is_some() {
        out.push('…');
    }
    out
}

impl Config {
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = crate::files::read_text(path, MAX_CONFIG_BYTES)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, path, &base)
    }

    /// Parse `text` as if read from `path`, resolving relative paths against `base`.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Config, ConfigError> {
        // Relative to the working directory now (`--config toolgate.toml` has
        // the base ""): every path below is absolute, so a protected path and
        // a grant are compared as the same kind of path.
        let base = &if base.as_os_str().is_empty() { std::env::current_dir() } else { std::path::absolute(base) }
            .unwrap_or_else(|_| base.to_owned());
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_owned(), message: parse_error_text(&e, text) })?;
        let field = |field: &str, message: String| ConfigError::Field {
            path: path.to_owned(),
            field: field.to_owned(),
            message,
        };
        let l = &raw.limits;
        for (name, value, max) in [
            ("limits.memory_mib", l.memory_mib, 4096),
            ("limits.timeout_ms", l.timeout_ms, 3_600_000),
            ("limits.output_kib", l.output_kib, 64 * 1024),
            ("limits.capture_kib", l.capture_kib, 64 * 1024),
            ("limits.ticket_ttl_secs", l.ticket_ttl_secs, 365 * 86_400),
            ("limits.http_request_kib", l.http_request_kib, 1024 * 1024),
            ("limits.http_response_kib", l.http_response_kib, 1024 * 1024),
            ("limits.http_response_total_kib", l.http_response_total_kib, 4 * 1024 * 1024),
            ("limits.http_request_total_kib", l.http_request_total_kib, 4 * 1024 * 1024),
            ("limits.http_requests_in_flight", l.http_requests_in_flight, 1024),
            ("limits.http_requests_in_flight_host", l.http_requests_in_flight_host, 65_536),
            ("limits.http_field_kib", l.http_field_kib, 16 * 1024),
            ("limits.resource_table_entries", l.resource_table_entries, 1_000_000),
            ("limits.open_files", l.open_files, 65_536),
            ("limits.file_streams", l.file_streams, 65_536),
            ("limits.file_check_mib", l.file_check_mib, 1024 * 1024),
            ("limits.arguments_kib", l.arguments_kib, 1024 * 1024),
            ("limits.disk_write_mib", l.disk_write_mib, 1024 * 1024),
            ("limits.files_created", l.files_created, 100_000_000),
            ("limits.state_kib", l.state_kib, 1024 * 1024),
            ("limits.compile_timeout_ms", l.compile_timeout_ms, 3_600_000),
            ("limits.http_timeout_ms", l.http_timeout_ms, 3_600_000),
            ("limits.max_instances", l.max_instances, 10_000),
            ("limits.max_instances_per_tool", l.max_instances_per_tool, 10_000),
            ("limits.claim_lease_secs", l.claim_lease_secs, 86_400),
        ] {
            if value == 0 || value > max {
                return Err(field(name, format!("{value} is out of range; use 1 to {max}")));
            }
        }
        let trusted_keys = match &raw.signing {
            None => crate::keys::TrustedKeys::default(),
            Some(sc) if sc.keys.is_empty() => {
                return Err(field("signing.keys", "is empty; list trusted keys or remove `[signing]`".into()));
            }
            Some(sc) => crate::keys::TrustedKeys::parse(&sc.keys).map_err(|e| field("signing.keys", e))?,
        };
        let approvers = match raw.approval.as_ref().map(|a| (&a.keys, a.mcp_elicitation)) {
            None | Some((None, Some(_))) => crate::keys::TrustedKeys::default(),
            Some((None, None)) => {
                return Err(field("approval.keys", "is missing; list approver keys or remove `[approval]`".into()));
            }
            Some((Some(keys), _)) if keys.is_empty() => {
                return Err(field("approval.keys", "is empty; list approver keys or remove `[approval]`".into()));
            }
            Some((Some(keys), _)) => crate::keys::TrustedKeys::parse(keys).map_err(|e| field("approval.keys", e))?,
        };
        let mcp_elicitation = crate::approval::mcp_elicitation_in_effect(
            raw.approval.as_ref().and_then(|a| a.mcp_elicitation),
            &approvers,
        );
        for name in raw.agents.keys() {
            check_agent_name(name).map_err(|e| field(&format!("agents.{name:?}"), e))?;
        }
        for (i, o) in raw.serve.allowed_origins.iter().enumerate() {
            check_origin(o).map_err(|e| field(&format!("serve.allowed_origins[{i}]"), e))?;
        }
        for (i, a) in raw.serve.auth.iter().enumerate() {
            a.token.check().map_err(|e| field(&format!("serve.auth[{i}].token"), e))?;
        }
        if let Some(k) = &raw.serve.state_key {
            k.check().map_err(|e| field("serve.state_key", e))?;
        }
        if let Some(p) = raw.postgres.as_ref().and_then(|p| p.password.as_ref()) {
            p.check().map_err(|e| field("postgres.password", e))?;
        }
        for (i, a) in raw.serve.auth.iter().enumerate() {
            if !raw.agents.contains_key(&a.agent) {
                return Err(field(
                    &format!("serve.auth[{i}].agent"),
                    format!("no agent `{}`; define `[agents.{}]`", a.agent, a.agent),
                ));
            }
        }
        if !(1..=1_048_576).contains(&raw.serve.max_body_kib) {
            return Err(field(
                "serve.max_body_kib",
                format!("{} is out of range; use 1 to 1048576", raw.serve.max_body_kib),
            ));
        }
        if !(1..=65_536).contains(&raw.serve.max_connections) {
            return Err(field(
                "serve.max_connections",
                format!("{} is out of range; use 1 to 65536", raw.serve.max_connections),
            ));
        }
        for (name, value) in [
            ("serve.max_connections_per_address", raw.serve.max_connections_per_address),
            ("serve.max_sessions_per_token", raw.serve.max_sessions_per_token),
            ("serve.max_requests_per_token", raw.serve.max_requests_per_token),
        ] {
            if !(1..=65_536).contains(&value) {
                return Err(field(name, format!("{value} is out of range; use 1 to 65536")));
            }
        }
        if !(1..=604_800).contains(&raw.serve.session_idle_secs) {
            return Err(field(
                "serve.session_idle_secs",
                format!("{} is out of range; use 1 to 604800 (a week)", raw.serve.session_idle_secs),
            ));
        }
        if !(1..=600_000).contains(&raw.serve.header_timeout_ms) {
            return Err(field(
                "serve.header_timeout_ms",
                format!("{} is out of range; use 1 to 600000", raw.serve.header_timeout_ms),
            ));
        }
        if raw.serve.grace_ms > 600_000 {
            return Err(field("serve.grace_ms", format!("{} is out of range; use 0 to 600000", raw.serve.grace_ms)));
        }
        let mut credentials = BTreeMap::new();
        for (name, c) in &raw.credentials {
            let spec =
                CredentialSpec::new(name, c, base).map_err(|e| field(&format!("credentials.{name}"), e.to_string()))?;
            credentials.insert(name.clone(), Arc::new(spec));
        }
        for (i, g) in raw.grants.iter().enumerate() {
            globset::Glob::new(&g.tools).map_err(|e| field(&format!("grants[{i}].tools"), format!("{e}")))?;
            for (j, h) in g.hosts.iter().enumerate() {
                Destination::parse(h, false).map_err(|e| field(&format!("grants[{i}].hosts[{j}]"), e.to_string()))?;
            }
            for (j, c) in g.credentials.iter().enumerate() {
                if !credentials.contains_key(c) {
                    return Err(field(
                        &format!("grants[{i}].credentials[{j}]"),
                        format!("no credential `{c}`; define it in a [credentials.{c}] table"),
                    ));
                }
            }
            for k in g.env.keys() {
                if k.is_empty() || k.contains(['=', '\0']) {
                    return Err(field(&format!("grants[{i}].env"), format!("invalid variable name `{k}`")));
                }
            }
            for (j, d) in g.directories.iter().enumerate() {
                if !d.path.starts_with('/') || d.path.split('/').any(|c| c == "..") {
                    return Err(field(
                        &format!("grants[{i}].directories[{j}].path"),
                        "must be an absolute guest path without `..`".into(),
                    ));
                }
            }
        }
        for (name, a) in &raw.agents {
            for (i, v) in a.visible.iter().enumerate() {
                globset::Glob::new(v).map_err(|e| field(&format!("agents.{name}.visible[{i}]"), format!("{e}")))?;
            }
            for (i, h) in a.authority.hosts.iter().flatten().enumerate() {
                Destination::parse(h, true)
                    .map_err(|e| field(&format!("agents.{name}.authority.hosts[{i}]"), e.to_string()))?;
            }
            crate::policy::Policy::new(&a.rules, a.default)
                .map_err(|e| field(&format!("agents.{name}.rules"), e.to_string()))?;
        }
        let abs = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let mut serve = raw.serve;
        for a in &mut serve.auth {
            if let Source::File(p) = &mut a.token
                && p.is_relative()
            {
                *p = base.join(&*p);
            }
        }
        if let Some(Source::File(p)) = &mut serve.state_key
            && p.is_relative()
        {
            *p = base.join(&*p);
        }
        let mut grants = raw.grants;
        for g in &mut grants {
            for d in &mut g.directories {
                d.host = abs(std::mem::take(&mut d.host));
            }
        }
        let store = match raw.store {
            // An ephemeral journal (CI, benchmarks): nothing survives the process.
            Some(s) if s == crate::store::sqlite::IN_MEMORY => StoreLocation::Memory,
            Some(s) if is_postgres(&s) => {
                if dsn_has_password(&s) {
                    return Err(field(
                        "store",
                        "the connection string carries a password; remove it and give it by reference: \
                         `[postgres] password = { env = \"VAR\" }` or `{ file = \"path\" }` (mode 0600)"
                            .into(),
                    ));
                }
                let options =
                    raw.postgres.clone().unwrap_or(PostgresOptions { password: None, pool_size: 8, ca_file: None });
                if !(1..=256).contains(&options.pool_size) {
                    return Err(field(
                        "postgres.pool_size",
                        format!("{} is out of range; use 1 to 256", options.pool_size),
                    ));
                }
                let password = options.password.map(|source| match source {
                    Source::File(p) if p.is_relative() => Source::File(base.join(p)),
                    other => other,
                });
                StoreLocation::Postgres(PostgresStore {
                    dsn: s,
                    password,
                    pool_size: options.pool_size,
                    ca_file: options.ca_file.map(&abs),
                })
            }
            s => StoreLocation::Sqlite(abs(s.map_or_else(|| ".toolgate/journal.db".into(), PathBuf::from))),
        };
        if raw.durability == Durability::Process && matches!(store, StoreLocation::Postgres(_)) {
            return Err(field(
                "durability",
                "\"process\" applies to the SQLite journal; with PostgreSQL the server decides \
                 (its `synchronous_commit` setting): remove `durability`"
                    .into(),
            ));
        }
        if raw.postgres.is_some() && !matches!(store, StoreLocation::Postgres(_)) {
            return Err(field(
                "postgres",
                "`[postgres]` options need a PostgreSQL `store` (`postgres://…` or a `key=value` string)".into(),
            ));
        }
        let plugins = abs(raw.plugins.unwrap_or_else(|| "plugins".into()));
        let cache = abs(raw.cache.unwrap_or_else(|| ".toolgate/cache".into()));
        let lock = abs(raw.lock.unwrap_or_else(|| "toolgate.lock".into()));
        // The host's own state is out of reach (invariant 14): no directory
        // grant may contain it, nor sit inside the directories it owns.
        use crate::sandbox::grant_dir::Guarded;
        let mut protected: Vec<Guarded> = vec![
            // `path` as given: relative to the working directory, not to `base` (its own directory).
            Guarded::new("the config file", std::path::absolute(path).unwrap_or_else(|_| path.to_owned()), false),
            Guarded::new("the plugin directory", plugins.clone(), true),
            Guarded::new("the compiled-code cache", cache.clone(), true),
            Guarded::new("the lock file", lock.clone(), false),
            // Guests run inside the host's process: `/proc/self/environ` holds
            // every secret read from the environment, `/proc/self/mem` all it read.
            Guarded::new("the host process's own files (its environment and memory)", PathBuf::from("/proc"), true),
        ];
        // The program running now (toolgate, or the embedder's): a Tool that
        // could replace it — a build Tool given `~/.cargo` to write, which
        // holds `~/.cargo/bin/toolgate` — runs its own native code, with every
        // secret and approval, the next time it starts. Reading it is harmless.
        if let Ok(exe) = std::env::current_exe() {
            protected.push(Guarded::from_writes("the host's own executable", exe));
        }
        // `current_exe` is where the last link leads (`/proc/self/exe`); a
        // symlinked install (Homebrew's `bin/toolgate`, a Nix profile,
        // `~/.local/bin/toolgate -> /opt/…`) is started through a link a
        // Tool writing its directory could replace. The name it was started
        // as is kept too, not followed: every name on the way to it (that
        // link included) is then kept from read-write grants.
        if let (Some(argv0), Ok(cwd)) = (std::env::args_os().next(), std::env::current_dir())
            && let Some(started) = started_as(&argv0, std::env::var_os("PATH").as_deref(), &cwd)
        {
            protected.push(Guarded::from_writes("the host's own executable (the name it was started as)", started));
        }
        if let Some(file) = store.file() {
            protected.push(Guarded::new("the journal", file.to_owned(), false));
        }
        // The journal server's Unix sockets: a Tool that could write their
        // directory could remove a socket (every commit fails) or put a link
        // to another server's in its place (the journal goes there).
        for socket in store.unix_sockets() {
            protected.push(Guarded::from_writes("the PostgreSQL server's socket (`store`)", socket));
        }
        // The files among them no second name (hard link) may reach, with
        // their fields: `true` for those whose content is secret.
        let mut single: Vec<(String, PathBuf, bool)> = vec![("lock".into(), lock.clone(), false)];
        if let Some(file) = store.file() {
            // It holds tickets.
            single.push(("store".into(), file.to_owned(), true));
        }
        if let StoreLocation::Postgres(PostgresStore { password: Some(Source::File(p)), .. }) = &store {
            protected.push(Guarded::new("the PostgreSQL password file", p.clone(), false));
            single.push(("postgres.password".into(), p.clone(), true));
        }
        if let StoreLocation::Postgres(PostgresStore { ca_file: Some(p), .. }) = &store {
            // Whoever writes it chooses whom the journal's TLS connection trusts.
            protected.push(Guarded::new("the PostgreSQL CA file (postgres.ca_file)", p.clone(), false));
            single.push(("postgres.ca_file".into(), p.clone(), false));
        }
        for (name, c) in &credentials {
            if let Some(file) = c.source_file() {
                protected.push(Guarded::new(format!("the secret file of credential `{name}`"), file.to_owned(), false));
                single.push((format!("credentials.{name}.source"), file.to_owned(), true));
            }
        }
        for (i, a) in serve.auth.iter().enumerate() {
            if let Source::File(p) = &a.token {
                protected.push(Guarded::new(format!("the token file of serve.auth[{i}]"), p.clone(), false));
                single.push((format!("serve.auth[{i}].token"), p.clone(), true));
            }
        }
        if let Some(Source::File(p)) = &serve.state_key {
            protected.push(Guarded::new("the key file of serve.state_key", p.clone(), false));
            single.push(("serve.state_key".into(), p.clone(), true));
        }
        if let Err(message) = crate::files::single_link(path, false) {
            return Err(ConfigError::Unsafe { path: path.to_owned(), message });
        }
        for (name, p, secret) in &single {
            crate::files::single_link(p, *secret).map_err(|message| field(name, message))?;
        }
        use crate::sandbox::grant_dir::{self, GrantDir};
        // Each bound where it exists (checked on the directory opened), so
        // nothing done after load redirects it.
        let protected: grant_dir::Protected = protected.into();
        for d in grants.iter_mut().flat_map(|g| g.directories.iter_mut()) {
            d.bound = GrantDir::new(protected.clone(), d.access == toolgate_sdk::Access::ReadWrite);
        }
        let dirs: Vec<(String, &DirectoryGrant)> = grants
            .iter()
            .enumerate()
            .flat_map(|(i, g)| {
                g.directories.iter().enumerate().map(move |(j, d)| (format!("grants[{i}].directories[{j}]"), d))
            })
            .collect();
        for (at, d) in &dirs {
            let refuse = |message: String| Err(field(&format!("{at}.host"), message));
            let read_write = d.access == toolgate_sdk::Access::ReadWrite;
            for g in protected.iter().filter(|g| g.applies_to(read_write)) {
                if let Some(relation) = grant_dir::overlap(&d.host, &g.path, g.owned_dir) {
                    return refuse(format!(
                        "{} {relation} {} ({}); a Tool must never reach the host's own state — grant a \
                         directory that holds only the Tool's data",
                        d.host.display(),
                        g.what,
                        g.path.display()
                    ));
                }
            }
            // Compared by identity too: a second mount of a directory is the same directory.
            if let Err(grant_dir::Refusal { checked, relation, what, path }) = d.bound.bind(&d.host) {
                let found =
                    if checked == d.host { String::new() } else { format!(" (found at {})", checked.display()) };
                return refuse(format!(
                    "{}{found} {relation} {what} ({}); a Tool must never reach the host's own state — grant a \
                     directory that holds only the Tool's data (a bind mount or a second mount of a directory is \
                     the same directory)",
                    d.host.display(),
                    path.display()
                ));
            }
            // A Tool holding a read-write grant above this directory could
            // rename it away and put a symlink in its place before it is
            // bound (a later process): refused, whichever Tools hold them.
            let outer = dirs.iter().find(|(other, o)| {
                o.access == toolgate_sdk::Access::ReadWrite
                    && other != at
                    && grant_dir::overlap(&o.host, &d.host, false) == Some("contains")
            });
            if let Some((other, o)) = outer {
                return refuse(format!(
                    "{} is inside {}, granted read-write by {other}; a Tool holding that grant could replace \
                     this directory with a link to anywhere — grant directories that do not nest under a \
                     read-write one",
                    d.host.display(),
                    o.host.display()
                ));
            }
        }
        // The same by identity: inside another name of a read-write grant,
        // or of a mount inside it, or found through a name in it.
        let reaches: Vec<_> = dirs.iter().map(|(_, d)| d.bound.reach(&d.host)).collect();
        for (k, (at, d)) in dirs.iter().enumerate() {
            for (m, (other, o)) in dirs.iter().enumerate() {
                let Some(outer) = reaches[m].as_ref().filter(|_| m != k && o.access == toolgate_sdk::Access::ReadWrite)
                else {
                    continue;
                };
                if let Some(how) = outer.holds_dir(reaches[k].as_ref(), &d.host) {
                    return Err(field(
                        &format!("{at}.host"),
                        format!(
                            "{} is inside {} ({how}), granted read-write by {other}; a Tool holding that grant \
                             could replace this directory with a link to anywhere — grant directories that do \
                             not nest under a read-write one",
                            d.host.display(),
                            o.host.display()
                        ),
                    ));
                }
            }
        }
        Ok(Config {
            source: Some(path.to_owned()),
            plugins,
            store,
            durability: raw.durability,
            baseline_compiler: raw.baseline_compiler,
            cache,
            lock,
            limits: raw.limits,
            grants,
            agents: raw.agents,
            credentials,
            trusted_keys,
            approvers,
            mcp_elicitation,
            serve,
        })
    }

    /// Where Tools may write — every read-write directory grant, by
    /// identity — for the catalog to keep component files out of
    /// ([`crate::sandbox::grant_dir::Writable::check_component`]).
    pub fn writable(&self) -> crate::sandbox::grant_dir::Writable {
        crate::sandbox::grant_dir::Writable::new(
            self.grants
                .iter()
                .enumerate()
                .flat_map(|(i, g)| g.directories.iter().enumerate().map(move |(j, d)| (i, j, d)))
                .filter(|(_, _, d)| d.access == toolgate_sdk::Access::ReadWrite)
                .map(|(i, j, d)| (format!("grants[{i}].directories[{j}]"), d.host.clone(), d.bound.reach(&d.host)))
                .collect(),
        )
    }

    /// Every secret the config names by reference, watched for in all that
    /// comes back to a guest (DESIGN.md invariants 7 and 13): each
    /// credential of `[credentials]`, then the host's own — each
    /// `[[serve.auth]]` token (`serve.auth[N].token`), `serve.state_key`
    /// and `postgres.password` — as [`CredentialSpec::watch_only`] entries
    /// named by their field, which nothing applies to a request. Empty when
    /// the config names no secret at all (then no check is built).
    pub fn watched(&self) -> Vec<Arc<CredentialSpec>> {
        let mut watched: Vec<Arc<CredentialSpec>> = self.credentials.values().cloned().collect();
        let own = |field: String, source: &Source| Arc::new(CredentialSpec::watch_only(&field, source.clone()));
        for (i, a) in self.serve.auth.iter().enumerate() {
            watched.push(own(format!("serve.auth[{i}].token"), &a.token));
        }
        if let Some(source) = &self.serve.state_key {
            watched.push(own("serve.state_key".into(), source));
        }
        if let StoreLocation::Postgres(PostgresStore { password: Some(source), .. }) = &self.store {
            watched.push(own("postgres.password".into(), source));
        }
        watched
    }

    /// The agent named `name`; the error lists the configured ones.
    pub fn agent(&self, name: &str) -> Result<&AgentConfig, ConfigError> {
        self.agents.get(name).ok_or_else(|| ConfigError::Field {
            path: self.source.clone().unwrap_or_default(),
            field: format!("agents.{name}"),
            message: format!(
                "no such agent; configured: {}",
                if self.agents.is_empty() {
                    "none (add an [agents.NAME] table)".to_owned()
                } else {
                    self.agents.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ),
        })
    }
}

/// The path a program started as `argv0` was found at, its last symlink
/// not followed: `argv0` itself when it holds a `/` (made absolute against
/// `cwd`), else the first entry of `path` (`PATH`; an empty entry is the
/// working directory) holding an executable file of that name, as a shell
/// or `execvp` finds it. `None` when there is no such name.
pub fn started_as(argv0: &std::ffi::OsStr, path: Option<&std::ffi::OsStr>, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::PermissionsExt as _;
    if argv0.is_empty() {
        return None;
    }
    if argv0.as_bytes().contains(&b'/') {
        return Some(cwd.join(argv0));
    }
    std::env::split_paths(path?).find_map(|dir| {
        let candidate = cwd.join(dir).join(argv0);
        let meta = std::fs::metadata(&candidate).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(candidate)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/etc/tg/toolgate.toml";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new(PATH), Path::new("/etc/tg"))
    }

    fn err(text: &str) -> String {
        let e = parse(text).expect_err("config must be refused");
        let s = e.to_string();
        assert!(s.contains(PATH), "error does not name the file: {s}");
        s
    }

    /// A secret written into the config where its source belongs — a
    /// credential's `source`, a `[[serve.auth]]` token, `serve.state_key`,
    /// `[postgres] password`, as a string, a number or a table of other
    /// keys — is refused naming where it is and what a source is, never
    /// quoting it (the parser's error quoted the line holding it: printed
    /// into CI logs). Other errors keep the line they are on.
    #[test]
    fn a_secret_written_in_place_of_its_source_is_refused_without_quoting_it() {
        const SECRET: &str = "ghp_L1teralS3cretValue0123456789";
        for text in [
            format!("[credentials.gh]\nsource = \"{SECRET}\"\ndestinations = [\"https://api.github.com:443\"]\n"),
            format!(
                "[credentials.gh]\nsource = {{ value = \"{SECRET}\" }}\ndestinations = [\"https://a.example:443\"]\n"
            ),
            format!("[serve]\nauth = [{{ agent = \"default\", token = \"{SECRET}\" }}]\n"),
            format!("[serve]\nstate_key = \"{SECRET}\"\n"),
            format!("store = \"postgres://db.example/tg\"\n[postgres]\npassword = \"{SECRET}\"\n"),
            "[serve]\nstate_key = 1234567890123\n".to_owned(),
        ] {
            let s = err(&text);
            assert!(!s.contains(SECRET) && !s.contains("1234567890123"), "quoted: {s}");
            assert!(s.contains("never the secret") && s.contains("line "), "{s}");
        }
        // Any error on the line that holds it: a duplicate key, an unclosed
        // string, a typo after it, an unknown key beside it.
        for text in [
            format!("[credentials.gh]\nsource = {{ env = \"GH\" }}\nsource = \"{SECRET}\"\n"),
            format!("[serve]\nstate_key = \"{SECRET}\n"),
            format!("[credentials.gh]\nsource = \"{SECRET}\", \n"),
            format!("[serve]\nauth = [{{ agnt = \"default\", token = \"{SECRET}\" }}]\n"),
            format!("store = \"postgres://tg:{SECRET}@db/tg\" x\n"),
        ] {
            let s = err(&text);
            assert!(!s.contains(SECRET) && s.contains("line "), "quoted: {s}");
        }
        let s = err("[limits]\nmemory_mib = \"lots\"\n");
        assert!(s.contains("line 2") && s.contains("memory_mib = \"…\""), "other errors show their line: {s}");
        let ok = "[credentials.gh]\nsource = { env = \"GH_TOKEN\" }\ndestinations = [\"https://api.github.com:443\"]\n\
                  apply = { header = { name = \"Authorization\", format = \"Bearer {}\" } }\n";
        assert!(parse(ok).is_ok(), "{:?}", parse(ok).err());
    }

    #[test]
    fn origins_that_can_never_match_are_refused_by_index() {
        for (origin, says) in [
            ("*", "any origin"),
            ("null", "scheme://host"),
            ("https://a.example\n", "header value"),
            ("https://a.example/", "path"),
            ("https://bob@a.example", "user"),
            ("https://a.example:443", "default port"),
            ("https://a.example:99999", "not a port"),
            ("https://A.example", "lowercase"),
            ("a.example", "scheme://host"),
            ("https://", "host"),
        ] {
            let text =
                format!("[serve]\nallowed_origins = [\"http://localhost:5173\", {}]\n", toml::Value::from(origin));
            let e = err(&text);
            assert!(e.contains("serve.allowed_origins[1]") && e.contains(says), "{origin:?}: {e}");
        }
        for ok in ["http://localhost:5173", "https://app.example.com", "http://[::1]:8080", "http://127.0.0.1"] {
            let c = parse(&format!("[serve]\nallowed_origins = [{}]\n", toml::Value::from(ok))).unwrap();
            assert_eq!(c.serve.allowed_origins, [ok]);
        }
    }

    #[test]
    fn sources_and_formats_that_can_never_work_are_refused_at_load() {
        let agents = "[agents.main]\n";
        for (text, at) in [
            (
                "[credentials.gh]\nsource = { env = \"\" }\ndestinations = [\"https://api.github.com:443\"]\n\
                 apply = { query = { param = \"k\" } }\n",
                "credentials.gh",
            ),
            (
                "[credentials.gh]\nsource = { env = \"A=B\" }\ndestinations = [\"https://api.github.com:443\"]\n\
                 apply = { query = { param = \"k\" } }\n",
                "credentials.gh",
            ),
            (
                "[credentials.gh]\nsource = { env = \"T\" }\ndestinations = [\"https://api.github.com:443\"]\n\
                 apply = { header = { name = \"Authorization\", format = \"Bearer {}\\r\\nX-A: b\" } }\n",
                "apply.format",
            ),
            ("[[serve.auth]]\nagent = \"main\"\ntoken = { env = \"\" }\n", "serve.auth[0].token"),
            ("[[serve.auth]]\nagent = \"main\"\ntoken = { env = \"A\\u0000B\" }\n", "serve.auth[0].token"),
            ("[serve]\nstate_key = { env = \"K=V\" }\n", "serve.state_key"),
            ("store = \"postgres://u@db/toolgate\"\n[postgres]\npassword = { env = \"\" }\n", "postgres.password"),
        ] {
            let e = err(&format!("{text}{agents}"));
            assert!(e.contains(at) && (e.contains("`env`") || e.contains("header value")), "{text}: {e}");
        }
    }

    #[test]
    fn agent_names_must_be_ids() {
        for name in ["\"\"", "\"a b\"", "\"-x\"", "\"a\\nb\""] {
            let e = err(&format!("[agents.{name}]\n"));
            assert!(e.contains("agents.") && e.contains("agent name"), "{name}: {e}");
        }
        let long = "a".repeat(MAX_AGENT_NAME + 1);
        assert!(err(&format!("[agents.{long}]\n")).contains("agent name"));
        parse("[agents.\"claude-code_1.x\"]\n[agents.2nd]\n").unwrap();
    }

    #[test]
    fn unknown_keys_are_named() {
        let cases = [
            ("top level", "plugin = \"p\"\n", "plugin"),
            ("limits", "[limits]\ntimeout = 5\n", "timeout"),
            ("grants", "[[grants]]\ntools = \"a.*\"\nhost = [\"https://x:443\"]\n", "host"),
            (
                "grant directory",
                "[[grants]]\ntools = \"a\"\ndirectories = [{ path = \"/d\", host = \"d\", access = \"read\", mode = 1 }]\n",
                "mode",
            ),
            ("agent", "[agents.main]\nvisibl = [\"*\"]\n", "visibl"),
            ("rule", "[agents.main]\nrules = [{ pattern = \"a\", behavior = \"allow\", when = \"now\" }]\n", "when"),
            ("rule table", "[[agents.main.rules]]\npattern = \"a\"\nbehaviour = \"allow\"\n", "behaviour"),
        ];
        for (name, text, key) in cases {
            let s = err(text);
            assert!(s.contains(&format!("`{key}`")), "{name}: error does not name `{key}`: {s}");
            assert!(matches!(parse(text), Err(ConfigError::Parse { .. })), "{name}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            ("behavior", "[agents.main]\ndefault = \"maybe\"\n", "maybe"),
            ("narrowing", "[agents.main]\nnarrowing = \"none\"\n", "none"),
            (
                "access",
                "[[grants]]\ntools = \"a\"\ndirectories = [{ path = \"/d\", host = \"d\", access = \"write\" }]\n",
                "write",
            ),
            ("type", "[limits]\ntimeout_ms = \"10s\"\n", "timeout_ms"),
            ("negative", "[limits]\nmemory_mib = -1\n", "memory_mib"),
            ("missing", "[[grants]]\nhosts = []\n", "tools"),
            ("syntax", "[limits\n", "limits"),
        ];
        for (name, text, word) in cases {
            let s = err(text);
            assert!(s.contains(word), "{name}: error lacks {word:?}: {s}");
        }
    }

    #[test]
    fn serve_connection_caps_out_of_range_name_the_field() {
        for key in
            ["max_connections", "max_connections_per_address", "max_sessions_per_token", "max_requests_per_token"]
        {
            for value in ["0", "65537"] {
                match parse(&format!("[serve]\n{key} = {value}\n")) {
                    Err(ConfigError::Field { field, message, .. }) => {
                        assert_eq!(field, format!("serve.{key}"));
                        assert!(message.contains(value) && message.contains("use 1 to 65536"), "{message}");
                    }
                    other => panic!("{key} = {value}: expected a field error, got {other:?}"),
                }
            }
        }
        let ok = parse("[serve]\nmax_connections_per_address = 1024\nmax_sessions_per_token = 1\n").unwrap();
        assert_eq!((ok.serve.max_connections_per_address, ok.serve.max_sessions_per_token), (1024, 1));
        assert_eq!(ok.serve.max_requests_per_token, 128);
    }

    #[test]
    fn serve_session_idle_secs_defaults_to_half_an_hour_and_is_bounded() {
        assert_eq!(parse("").unwrap().serve.session_idle_secs, 1800);
        assert_eq!(parse("[serve]\nsession_idle_secs = 60\n").unwrap().serve.session_idle_secs, 60);
        for value in ["0", "604801"] {
            match parse(&format!("[serve]\nsession_idle_secs = {value}\n")) {
                Err(ConfigError::Field { field, message, .. }) => {
                    assert_eq!(field, "serve.session_idle_secs");
                    assert!(message.contains(value), "{message}");
                }
                other => panic!("session_idle_secs = {value}: expected a field error, got {other:?}"),
            }
        }
    }

    #[test]
    fn limits_out_of_range_name_the_field() {
        let cases = [
            ("memory_mib", "0"),
            ("memory_mib", "4097"),
            ("timeout_ms", "0"),
            ("timeout_ms", "3600001"),
            ("output_kib", "0"),
            ("output_kib", "65537"),
            ("capture_kib", "0"),
            ("capture_kib", "65537"),
            ("ticket_ttl_secs", "0"),
            ("ticket_ttl_secs", "31536001"),
        ];
        for (key, value) in cases {
            let text = format!("[limits]\n{key} = {value}\n");
            match parse(&text) {
                Err(ConfigError::Field { path, field, message }) => {
                    assert_eq!(path, Path::new(PATH));
                    assert_eq!(field, format!("limits.{key}"));
                    assert!(message.contains(value) && message.contains("use 1 to"), "{message}");
                }
                other => panic!("{key} = {value}: expected a field error, got {other:?}"),
            }
        }
        // The bounds themselves are accepted.
        let ok = parse(
            "[limits]\nmemory_mib = 4096\ntimeout_ms = 3600000\noutput_kib = 65536\ncapture_kib = 1\nticket_ttl_secs = 31536000\n",
        )
        .unwrap();
        assert_eq!(ok.limits.memory_mib, 4096);
        assert_eq!(ok.limits.timeout_ms, 3_600_000);
        assert_eq!(ok.limits.capture_kib, 1);
        // Unset limits keep their defaults next to set ones.
        assert_eq!(parse("[limits]\nmemory_mib = 8\n").unwrap().limits, Limits { memory_mib: 8, ..Limits::default() });
    }

    #[test]
    fn bad_patterns_name_the_field() {
        let cases = [
            ("[agents.bot]\nrules = [{ pattern = \"fs.read(\", behavior = \"deny\" }]\n", "agents.bot.rules"),
            ("[agents.bot]\nrules = [{ pattern = \"\", behavior = \"allow\" }]\n", "agents.bot.rules"),
            ("[agents.bot]\nrules = [{ pattern = \"a b\", behavior = \"ask\" }]\n", "agents.bot.rules"),
            ("[agents.bot]\nrules = [{ pattern = \"fs.write(path ~ 3)\", behavior = \"deny\" }]\n", "agents.bot.rules"),
            ("[agents.bot]\nvisible = [\"a\", \"[x\"]\n", "agents.bot.visible[1]"),
            ("[[grants]]\ntools = \"a{b\"\n", "grants[0].tools"),
            (
                "[[grants]]\ntools = \"a\"\ndirectories = [{ path = \"data\", host = \"d\", access = \"read\" }]\n",
                "grants[0].directories[0].path",
            ),
            (
                "[[grants]]\ntools = \"a\"\n[[grants]]\ntools = \"b\"\ndirectories = [{ path = \"/d/../e\", host = \"d\", access = \"read\" }]\n",
                "grants[1].directories[0].path",
            ),
        ];
        for (text, want) in cases {
            match parse(text) {
                Err(e @ ConfigError::Field { .. }) => {
                    let ConfigError::Field { field, .. } = &e else { unreachable!() };
                    assert_eq!(field, want, "{text}");
                    assert!(e.to_string().contains(PATH));
                }
                other => panic!("{text}: expected a field error, got {other:?}"),
            }
        }
        // The rule error says which rule and where.
        let s = err(
            "[agents.bot]\nrules = [{ pattern = \"ok\", behavior = \"allow\" }, { pattern = \"x(\", behavior = \"deny\" }]\n",
        );
        assert!(s.contains("rule 1") && s.contains("x("), "{s}");
    }

    #[test]
    fn the_baseline_compiler_is_on_unless_turned_off() {
        assert!(parse("").unwrap().baseline_compiler);
        assert!(!parse("baseline_compiler = false\n").unwrap().baseline_compiler);
        let e = parse("baseline_compiler = \"winch\"\n").unwrap_err().to_string();
        assert!(e.contains("baseline_compiler"), "{e}");
    }

    #[test]
    fn durability_is_machine_unless_said_and_only_for_sqlite() {
        assert_eq!(parse("").unwrap().durability, Durability::Machine);
        assert_eq!(parse("durability = \"process\"\n").unwrap().durability, Durability::Process);
        assert_eq!(parse("durability = \"machine\"\n").unwrap().durability, Durability::Machine);
        let e = parse("durability = \"fast\"\n").unwrap_err().to_string();
        assert!(e.contains("durability") && e.contains("machine") && e.contains("process"), "{e}");
        let e = parse("store = \"postgres://u@h/db\"\ndurability = \"process\"\n").unwrap_err().to_string();
        assert!(e.contains("durability") && e.contains("synchronous_commit"), "{e}");
    }

    #[test]
    fn an_in_memory_store_is_not_a_path() {
        let c = parse("store = \":memory:\"\n").unwrap();
        assert_eq!(c.store, StoreLocation::Memory);
        let j = crate::SqliteJournal::in_memory().unwrap();
        assert_eq!(j.group_commits(), (0, 0), "in memory: no committer, no file");
        assert!(!Path::new("/etc/tg/:memory:").exists());
    }

    #[test]
    fn a_postgres_store_takes_its_password_by_reference_only() {
        for dsn in [
            "postgres://tg:hunter2@db.example/toolgate",
            "postgresql://tg:hunter2@db.example:5432/toolgate?sslmode=disable",
            "postgres://db.example/toolgate?user=tg&password=hunter2",
            "host=db.example user=tg password=hunter2 dbname=toolgate",
        ] {
            let e = parse(&format!("store = \"{dsn}\"\n")).unwrap_err().to_string();
            assert!(e.contains("store") && e.contains("[postgres] password"), "{dsn}: {e}");
            assert!(!e.contains("hunter2"), "the password is not repeated: {e}");
        }
        let c = parse(
            "store = \"postgres://tg@db.example/toolgate\"\n[postgres]\npassword = { file = \"pg.secret\" }\npool_size = 4\n",
        )
        .unwrap();
        assert_eq!(
            c.store,
            StoreLocation::Postgres(PostgresStore {
                dsn: "postgres://tg@db.example/toolgate".into(),
                password: Some(Source::File("/etc/tg/pg.secret".into())),
                pool_size: 4,
                ca_file: None,
            })
        );
        let c = parse("store = \"host=/run/postgresql dbname=toolgate\"\n").unwrap();
        assert!(matches!(&c.store, StoreLocation::Postgres(p) if p.password.is_none() && p.pool_size == 8));
        let c = parse("store = \"postgres://db/x\"\n[postgres]\nca_file = \"pg-ca.pem\"\n").unwrap();
        assert!(
            matches!(&c.store, StoreLocation::Postgres(p) if p.ca_file.as_deref() == Some(Path::new("/etc/tg/pg-ca.pem")))
        );
        // A file name with `=` in it later in the path is still a file.
        assert!(matches!(parse("store = \"data/a=b.db\"\n").unwrap().store, StoreLocation::Sqlite(_)));
        let e = parse("[postgres]\npool_size = 2\n").unwrap_err().to_string();
        assert!(e.contains("postgres") && e.contains("PostgreSQL `store`"), "{e}");
        let e = parse("store = \"postgres://db/x\"\n[postgres]\npool_size = 0\n").unwrap_err().to_string();
        assert!(e.contains("postgres.pool_size"), "{e}");
    }

    #[test]
    fn a_grant_cannot_reach_the_postgres_password_file() {
        let e = parse(
            "store = \"postgres://tg@db/x\"\n[postgres]\npassword = { file = \"secrets/pg\" }\n\
             [[grants]]\ntools = \"fs.*\"\ndirectories = [{ path = \"/s\", host = \"secrets\", access = \"read\" }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("PostgreSQL password file"), "{e}");
    }

    #[test]
    fn a_grant_cannot_reach_the_postgres_ca_file() {
        // Whoever writes it chooses whom the journal's TLS connection trusts.
        let e = parse(
            "store = \"postgres://tg@db/x\"\n[postgres]\nca_file = \"/srv/ca/pg-ca.pem\"\n\
             [[grants]]\ntools = \"fs.*\"\ndirectories = [{ path = \"/s\", host = \"/srv/ca\", access = \"read-write\" }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("grants[0].directories[0].host") && e.contains("postgres.ca_file"), "{e}");
        // Nor a link on the way to it: the file is outside the grant, a link to it inside.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["work", "pki"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("pki/ca.pem"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        std::os::unix::fs::symlink(d.join("pki/ca.pem"), d.join("work/ca-link")).unwrap();
        std::os::unix::fs::symlink(d.join("work/ca-link"), d.join("ca.pem")).unwrap();
        let text = "store = \"postgres://tg@db/x\"\n[postgres]\nca_file = \"ca.pem\"\n\
                    [[grants]]\ntools = \"fs.*\"\ndirectories = [{ path = \"/w\", host = \"work\", access = \"read-write\" }]\n";
        let e = Config::parse(text, &d.join("toolgate.toml"), d).unwrap_err().to_string();
        assert!(e.contains("grants[0].directories[0].host") && e.contains("postgres.ca_file"), "{e}");
        // Read-only, that link cannot be changed; the file itself is not in the grant.
        Config::parse(&text.replace("read-write", "read"), &d.join("toolgate.toml"), d).unwrap();
    }

    /// A hard link is a second name of the same file, anywhere on its file
    /// system — inside a grant, where a Tool would read or rewrite it — and
    /// the host cannot list every grant's files to find it: a protected
    /// file with more than one link is refused, naming it and what to do.
    #[cfg(unix)]
    #[test]
    fn a_protected_file_with_a_second_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("work")).unwrap();
        for f in ["api.secret", "journal.db", "toolgate.lock", "ca.pem", "state.key"] {
            std::fs::write(d.join(f), "x".repeat(40)).unwrap();
        }
        let text = "store = \"journal.db\"\n\
                    [credentials.api]\nsource = { file = \"api.secret\" }\ndestinations = [\"https://a.example:443\"]\n\
                    apply = { header = { name = \"Authorization\" } }\n\
                    [serve]\nstate_key = { file = \"state.key\" }\n\
                    [[grants]]\ntools = \"*\"\ndirectories = [{ path = \"/w\", host = \"work\", access = \"read-write\" }]\n";
        let file = d.join("toolgate.toml");
        std::fs::write(&file, text).unwrap();
        Config::load(&file).unwrap();
        for (name, field) in [
            ("toolgate.toml", "config"),
            ("api.secret", "credentials.api"),
            ("journal.db", "store"),
            ("toolgate.lock", "lock"),
            ("state.key", "serve.state_key"),
        ] {
            let link = d.join("work").join(name);
            std::fs::hard_link(d.join(name), &link).unwrap();
            let e = Config::load(&file).expect_err(name).to_string();
            assert!(e.contains(field) && e.contains("2 links") && e.contains("samefile"), "{name}: {e}");
            std::fs::remove_file(&link).unwrap();
        }
        Config::load(&file).unwrap();
        let pg = d.join("pg.toml");
        std::fs::write(&pg, "store = \"postgres://tg@db/x\"\n[postgres]\nca_file = \"ca.pem\"\n").unwrap();
        Config::load(&pg).unwrap();
        std::fs::hard_link(d.join("ca.pem"), d.join("work/ca.pem")).unwrap();
        let e = Config::load(&pg).unwrap_err().to_string();
        assert!(e.contains("postgres.ca_file") && e.contains("2 links"), "{e}");
    }

    #[test]
    fn a_config_named_relatively_is_checked_with_absolute_paths() {
        // `--config toolgate.toml`: the base is "", the journal not created yet.
        let cwd = std::env::current_dir().unwrap();
        let text = format!(
            "store = \"state/journal.db\"\n[[grants]]\ntools = \"*\"\n\
             directories = [{{ path = \"/d\", host = \"{}\", access = \"read-write\" }}]\n",
            cwd.join("state").display()
        );
        let e = Config::parse(&text, Path::new("toolgate.toml"), Path::new("")).expect_err("must be refused");
        assert!(e.to_string().contains("the journal"), "{e}");
    }

    #[test]
    fn the_config_file_named_relatively_is_protected_where_it_is() {
        // `--config ../toolgate.toml`: the file is in the working directory's parent.
        let parent = std::env::current_dir().unwrap().parent().unwrap().to_owned();
        let text = format!(
            "plugins = \"/var/tg/plugins\"\nstore = \"/var/tg/j.db\"\ncache = \"/var/tg/cache\"\n\
             lock = \"/var/tg/toolgate.lock\"\n[[grants]]\ntools = \"*\"\n\
             directories = [{{ path = \"/d\", host = \"{}\", access = \"read-write\" }}]\n",
            parent.display()
        );
        let e = Config::parse(&text, Path::new("../toolgate.toml"), Path::new("..")).expect_err("must be refused");
        assert!(e.to_string().contains("the config file"), "{e}");
    }

    #[test]
    fn a_directory_under_another_read_write_grant_is_refused() {
        let e = err(
            "[[grants]]\ntools = \"a.*\"\ndirectories = [{ path = \"/w\", host = \"/srv/work\", access = \"read-write\" }]\n\
             [[grants]]\ntools = \"b.*\"\ndirectories = [{ path = \"/r\", host = \"/srv/work/ref\", access = \"read\" }]\n",
        );
        assert!(
            e.contains("grants[1].directories[0].host")
                && e.contains("grants[0].directories[0]")
                && e.contains("read-write"),
            "{e}"
        );
        // Within one entry too: the Tool could redirect its own other grant.
        let e = err(
            "[[grants]]\ntools = \"a.*\"\ndirectories = [{ path = \"/w\", host = \"/srv/work\", access = \"read-write\" }, \
             { path = \"/r\", host = \"/srv/work/../work/ref\", access = \"read\" }]\n",
        );
        assert!(e.contains("grants[0].directories[1].host"), "{e}");
        // Under a read-only directory, side by side, or the same directory twice: accepted.
        parse(
            "[[grants]]\ntools = \"a.*\"\ndirectories = [{ path = \"/w\", host = \"/srv/work\", access = \"read\" }, \
             { path = \"/r\", host = \"/srv/work/ref\", access = \"read-write\" }, \
             { path = \"/o\", host = \"/srv/out\", access = \"read-write\" }]\n\
             [[grants]]\ntools = \"b.*\"\ndirectories = [{ path = \"/o\", host = \"/srv/out\", access = \"read\" }]\n",
        )
        .unwrap();
    }

    #[test]
    fn paths_resolve_against_the_base_dir() {
        let c = parse(
            "plugins = \"plug\"\nstore = \"/var/tg/j.db\"\ncache = \"../cache\"\n\
             [[grants]]\ntools = \"fs.*\"\ndirectories = [{ path = \"/data\", host = \"data\", access = \"read\" }, { path = \"/abs\", host = \"/srv/abs\", access = \"read-write\" }]\n",
        )
        .unwrap();
        assert_eq!(c.plugins, Path::new("/etc/tg/plug"));
        assert_eq!(c.store, StoreLocation::Sqlite("/var/tg/j.db".into()));
        assert_eq!(c.cache, Path::new("/etc/tg/../cache"));
        let dirs = &c.grants[0].directories;
        assert_eq!(dirs[0].host, Path::new("/etc/tg/data"));
        assert_eq!(dirs[0].access, toolgate_sdk::Access::Read);
        assert_eq!(dirs[1].host, Path::new("/srv/abs"));
        assert_eq!(dirs[1].access, toolgate_sdk::Access::ReadWrite);
        // Config::load uses the file's directory as the base.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("toolgate.toml");
        std::fs::write(&file, "plugins = \"p\"\n").unwrap();
        let loaded = Config::load(&file).unwrap();
        assert_eq!(loaded.plugins, dir.path().join("p"));
        assert_eq!(loaded.source.as_deref(), Some(file.as_path()));
        let missing = dir.path().join("absent.toml");
        let e = Config::load(&missing).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(e.to_string().contains("absent.toml"), "{e}");
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.plugins, Path::new("/etc/tg/plugins"));
        assert_eq!(c.store, StoreLocation::Sqlite("/etc/tg/.toolgate/journal.db".into()));
        assert_eq!(c.cache, Path::new("/etc/tg/.toolgate/cache"));
        assert_eq!(c.limits, Limits::default());
        assert_eq!(
            (
                c.limits.memory_mib,
                c.limits.timeout_ms,
                c.limits.output_kib,
                c.limits.capture_kib,
                c.limits.ticket_ttl_secs
            ),
            (64, 10_000, 1024, 64, 86_400)
        );
        assert!(c.grants.is_empty() && c.agents.is_empty());

        let c = parse("[agents.main]\n").unwrap();
        let a = c.agent("main").unwrap();
        assert_eq!(a.default, Behavior::Deny);
        assert_eq!(a.narrowing, ToolCapabilityNarrowing::Configured);
        assert!(a.visible.is_empty() && a.rules.is_empty());

        let c = parse(
            "[agents.main]\nvisible = [\"text.*\"]\ndefault = \"ask\"\nnarrowing = \"deny-all\"\n\
             [[agents.main.rules]]\npattern = \"text.upper\"\nbehavior = \"allow\"\n",
        )
        .unwrap();
        let a = c.agent("main").unwrap();
        assert_eq!(a.default, Behavior::Ask);
        assert_eq!(a.narrowing, ToolCapabilityNarrowing::DenyAll);
        assert_eq!(a.rules, vec![RuleSpec { pattern: "text.upper".into(), behavior: Behavior::Allow }]);
        let g = parse("[[grants]]\ntools = \"a\"\n").unwrap();
        assert!(
            g.grants[0].directories.is_empty() && g.grants[0].hosts.is_empty() && g.grants[0].credentials.is_empty()
        );
    }

    #[test]
    fn a_grant_never_reaches_the_hosts_own_state() {
        let grant = |host: &str, access: &str| {
            format!(
                "[[grants]]\ntools = \"*\"\ndirectories = [{{ path = \"/d\", host = \"{host}\", access = \"{access}\" }}]\n"
            )
        };
        let cases = [
            (".", "the config file"),
            ("/etc", "the config file"),
            ("/", "the config file"),
            (".toolgate", "the compiled-code cache"),
            (".toolgate/cache/sub", "the compiled-code cache"),
            ("plugins", "the plugin directory"),
            ("plugins/inner", "the plugin directory"),
            ("data/../.toolgate", "the compiled-code cache"),
            ("/proc", "the host process's own files"),
            ("/proc/self", "the host process's own files"),
            ("/proc/1/../self/", "the host process's own files"),
        ];
        for (host, what) in cases {
            for access in ["read", "read-write"] {
                match parse(&grant(host, access)) {
                    Err(e @ ConfigError::Field { .. }) => {
                        let text = e.to_string();
                        assert!(
                            text.contains("grants[0].directories[0].host") && text.contains(what),
                            "{host}: {text}"
                        );
                        assert!(text.contains("host's own state"), "{text}");
                    }
                    other => panic!("a grant of {host} must be refused, got {other:?}"),
                }
            }
        }
        // A credential's secret file, the lock file, a journal moved elsewhere: each protected where it is.
        let with_secret = format!(
            "store = \"/var/tg/j.db\"\n[credentials.api]\nsource = {{ file = \"/srv/secrets/api\" }}\ndestinations = [\"https://a.example:443\"]\napply = {{ header = {{ name = \"Authorization\" }} }}\n{}",
            grant("/srv/secrets", "read")
        );
        assert!(parse(&with_secret).unwrap_err().to_string().contains("secret file of credential `api`"));
        assert!(
            parse(&format!("store = \"/var/tg/j.db\"\n{}", grant("/var/tg", "read")))
                .unwrap_err()
                .to_string()
                .contains("the journal")
        );
        assert!(
            parse(&format!("lock = \"/srv/l/toolgate.lock\"\n{}", grant("/srv/l", "read")))
                .unwrap_err()
                .to_string()
                .contains("the lock file")
        );
        // Data beside them is fine; an in-memory journal protects no path.
        parse(&grant("data", "read-write")).unwrap();
        parse(&format!("store = \":memory:\"\ncache = \"/var/cache/tg\"\n{}", grant("/srv/data", "read"))).unwrap();
    }

    #[test]
    fn no_grant_tools_may_write_holds_the_hosts_own_executable() {
        // A build Tool given `~/.cargo` to write would otherwise hold
        // `~/.cargo/bin/toolgate`: the next start runs the Tool's code.
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().unwrap();
        let grant = |host: &std::path::Path, access: &str| {
            format!(
                "[[grants]]\ntools = \"*\"\ndirectories = [{{ path = \"/d\", host = \"{}\", access = \"{access}\" }}]\n",
                host.display()
            )
        };
        for host in [bin, bin.parent().unwrap()] {
            let e = parse(&grant(host, "read-write")).unwrap_err().to_string();
            assert!(
                e.contains("grants[0].directories[0].host") && e.contains("the host's own executable"),
                "{}: {e}",
                host.display()
            );
        }
        // Reading it gives a Tool nothing: a read-only grant stays valid.
        parse(&grant(bin, "read")).unwrap();
        // Nor through a link to its directory placed where Tools write.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(bin, dir.path().join("bin")).unwrap();
        let e = parse(&grant(&dir.path().join("bin"), "read-write")).unwrap_err().to_string();
        assert!(e.contains("the host's own executable"), "{e}");
    }

    /// Where a program started as `argv[0]` was found, its last link not
    /// followed: the name with a `/` against the working directory, else
    /// the first `PATH` entry holding an executable of that name.
    #[test]
    fn the_name_a_program_was_started_as_is_found_as_execvp_finds_it() {
        use std::ffi::OsStr;
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for d in ["opt/bin", "local/bin", "plain", "work"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        let real = r.join("opt/bin/toolgate");
        std::fs::write(&real, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&real, r.join("local/bin/toolgate")).unwrap();
        // Not executable: skipped, as execvp skips it.
        std::fs::write(r.join("plain/toolgate"), "data").unwrap();
        let cwd = r.join("work");
        let path =
            std::env::join_paths([r.join("nowhere"), r.join("plain"), r.join("local/bin"), r.join("opt/bin")]).unwrap();
        let found = started_as(OsStr::new("toolgate"), Some(&path), &cwd).unwrap();
        assert_eq!(found, r.join("local/bin/toolgate"), "the link, not its target");
        assert!(std::fs::symlink_metadata(&found).unwrap().file_type().is_symlink());
        assert_eq!(started_as(OsStr::new("other"), Some(&path), &cwd), None);
        assert_eq!(started_as(OsStr::new("toolgate"), None, &cwd), None);
        assert_eq!(started_as(OsStr::new(""), Some(&path), &cwd), None);
        // With a `/`: as given, against the working directory; PATH unread.
        assert_eq!(
            started_as(OsStr::new("../local/bin/toolgate"), Some(&path), &cwd),
            Some(cwd.join("../local/bin/toolgate"))
        );
        assert_eq!(started_as(OsStr::new("/usr/bin/x"), None, &cwd), Some(PathBuf::from("/usr/bin/x")));
        // An empty PATH entry is the working directory.
        std::os::unix::fs::symlink(&real, cwd.join("toolgate")).unwrap();
        let with_empty = std::env::join_paths([r.join("nowhere"), PathBuf::new(), r.join("opt/bin")]).unwrap();
        assert_eq!(started_as(OsStr::new("toolgate"), Some(&with_empty), &cwd), Some(cwd.join("toolgate")));
    }

    /// Started through a symlink (`~/.local/bin/toolgate -> /opt/…`), a
    /// read-write grant of the link's directory is refused: a Tool there
    /// could replace the link the MCP client launches. Before, only where
    /// the link leads (`current_exe`) was kept. This process's `argv[0]` is
    /// the test binary, so the check runs in a child started through a link
    /// to it: by a path, and by a bare name found on `PATH`.
    #[test]
    fn a_read_write_grant_of_the_directory_holding_the_link_the_host_was_started_through_is_refused() {
        const CHILD: &str = "TOOLGATE_TEST_STARTED_THROUGH_LINK";
        let grant = |host: &Path, access: &str| {
            format!(
                "[[grants]]\ntools = \"*\"\ndirectories = [{{ path = \"/d\", host = \"{}\", access = \"{access}\" }}]\n",
                host.display()
            )
        };
        if let Some(bin) = std::env::var_os(CHILD) {
            let bin = PathBuf::from(bin);
            let e = parse(&grant(&bin, "read-write")).unwrap_err().to_string();
            assert!(e.contains("the name it was started as"), "{e}");
            // Reading it gives a Tool nothing.
            parse(&grant(&bin, "read")).unwrap();
            return;
        }
        let name = "config::tests::a_read_write_grant_of_the_directory_holding_the_link_the_host_was_started_through_is_refused";
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(std::env::current_exe().unwrap(), bin.join("tg-link")).unwrap();
        // The link's directory alone holds nothing of the host's otherwise.
        parse(&grant(&bin, "read-write")).unwrap();
        for by_path in [true, false] {
            let mut cmd = if by_path {
                std::process::Command::new(bin.join("tg-link"))
            } else {
                let mut c = std::process::Command::new("tg-link");
                c.env("PATH", &bin);
                c
            };
            let out = cmd.args([name, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD, &bin).output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && said.contains("1 passed"), "by path {by_path}: {said}");
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn no_grant_tools_may_write_holds_the_journal_servers_socket() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("pg");
        std::fs::create_dir(&run).unwrap();
        let config = |store: &str, access: &str| {
            format!(
                "store = \"{store}\"\n[[grants]]\ntools = \"*\"\ndirectories = [{{ path = \"/d\", host = \"{}\", access = \"{access}\" }}]\n",
                run.display()
            )
        };
        // A key=value string and a URL naming the socket directory, with and without a port.
        for store in [
            format!("host={} dbname=tg", run.display()),
            format!("host={} port=5433 dbname=tg", run.display()),
            format!("postgresql:///tg?host={}", run.display()),
        ] {
            let e = parse(&config(&store, "read-write")).unwrap_err().to_string();
            assert!(e.contains("the PostgreSQL server's socket") && e.contains(".s.PGSQL.543"), "{store}: {e}");
            parse(&config(&store, "read")).unwrap();
        }
        // A TCP host has no socket here.
        parse(&config("host=db.internal dbname=tg", "read-write")).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_grant_through_a_symlink_is_compared_where_it_leads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".toolgate/cache")).unwrap();
        std::os::unix::fs::symlink(dir.path().join(".toolgate"), dir.path().join("innocent")).unwrap();
        let file = dir.path().join("toolgate.toml");
        std::fs::write(
            &file,
            "[[grants]]\ntools = \"*\"\ndirectories = [{ path = \"/d\", host = \"innocent\", access = \"read\" }]\n",
        )
        .unwrap();
        let e = Config::load(&file).unwrap_err().to_string();
        assert!(e.contains("the journal") || e.contains("the compiled-code cache"), "{e}");
    }

    #[test]
    fn missing_agent_lists_configured_ones() {
        let c = parse("[agents.beta]\n[agents.alpha]\n").unwrap();
        match c.agent("gamma") {
            Err(e @ ConfigError::Field { .. }) => {
                let s = e.to_string();
                assert!(s.contains("agents.gamma") && s.contains("alpha, beta") && s.contains(PATH), "{s}");
            }
            other => panic!("expected a field error, got {other:?}"),
        }
        let none = parse("").unwrap().agent("main").unwrap_err().to_string();
        assert!(none.contains("none") && none.contains("[agents.NAME]"), "{none}");
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn limits_are_accepted_exactly_in_range(
            key in 0usize..5,
            pick in 0u8..3,
            near in -2i64..3,
            raw in proptest::prelude::any::<i64>(),
        ) {
            let (name, max) = [
                ("memory_mib", 4096i64),
                ("timeout_ms", 3_600_000),
                ("output_kib", 65_536),
                ("capture_kib", 65_536),
                ("ticket_ttl_secs", 31_536_000),
            ][key];
            // Near the lower bound, near the upper bound, or anywhere.
            let value = match pick { 0 => near, 1 => max + near, _ => raw };
            let r = parse(&format!("[limits]\n{name} = {value}\n"));
            proptest::prop_assert_eq!(r.is_ok(), (1..=max).contains(&value), "{} = {}: {:?}", name, value, r.err());
        }

        #[test]
        fn agent_sections_never_panic(
            name in "[a-z]{1,8}",
            patterns in proptest::collection::vec("\\PC{0,24}", 0..4),
            visible in proptest::collection::vec("\\PC{0,12}", 0..3),
        ) {
            let mut text = format!("[agents.{name}]\nvisible = {}\n", toml::Value::from(visible));
            for p in &patterns {
                text.push_str(&format!("[[agents.{name}.rules]]\npattern = {}\nbehavior = \"ask\"\n", toml::Value::from(p.as_str())));
            }
            if let Err(e) = parse(&text) {
                let s = e.to_string();
                proptest::prop_assert!(s.contains(PATH), "{}", s);
            }
        }
    }
}
