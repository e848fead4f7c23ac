//! Fixtures for the end-to-end tests: the built guest components, packing
//! them once per test binary, and a host on a temporary directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use toolgate::store::StepStore;
use toolgate::{Config, ExecutableAgentSnapshot, Executor, ExecutorSettings, Runtime, SqliteJournal};

pub mod conformance;

/// Paths of the built (unpacked) guest components.
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// The bytes of a built guest component, unpacked.
pub fn raw(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read guest {path}: {e}"))
}

/// The packed (shippable) bytes of a guest; packed once per process.
pub fn packed(path: &str) -> Vec<u8> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(b) = cache.lock().unwrap().get(path) {
        return b.clone();
    }
    let bytes = raw(path);
    // Its own thread and runtime: callers may already be inside one.
    let (packed, _) = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(toolgate_author::pack::pack(&bytes))
        })
        .join()
        .unwrap()
    })
    .unwrap_or_else(|e| panic!("pack {path}: {e}"));
    cache.lock().unwrap().insert(path.to_owned(), packed.clone());
    packed
}

/// The language of the example Tools a test runs: the end-to-end proofs about
/// Tools run over each SDK's examples (the same Tool ids and behaviour), so a
/// Python Tool is proven on the same path as a Rust one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// `example-tools/{text,notes,files,tracker}`, built with cargo.
    Rust,
    /// `example-tools/python-{text,notes,files,tracker}`, built with componentize-py.
    Python,
}

impl Lang {
    /// `text.upper`, `text.count`, `text.repeat`, packed.
    pub fn text(self) -> Vec<u8> {
        packed(if self == Lang::Rust { guests::TEXT } else { guests::PY_TEXT })
    }
    /// `notes` (Tool state), packed.
    pub fn notes(self) -> Vec<u8> {
        packed(if self == Lang::Rust { guests::NOTES } else { guests::PY_NOTES })
    }
    /// `files.read`, `files.search` (a `/data` grant), packed.
    pub fn files(self) -> Vec<u8> {
        packed(if self == Lang::Rust { guests::FILES } else { guests::PY_FILES })
    }
    /// `tracker.issues` (HTTP with the `tracker` credential), packed.
    pub fn tracker(self) -> Vec<u8> {
        packed(if self == Lang::Rust { guests::TRACKER } else { guests::PY_TRACKER })
    }
    /// The config preamble of a test host for this language. Python
    /// components (~18 MB, seconds of Cranelift each) share one compiled-code
    /// cache across tests; Rust hosts keep a cache of their own, so tests can
    /// count compilations.
    pub fn preamble(self) -> String {
        match self {
            Lang::Rust => PREAMBLE.to_owned(),
            Lang::Python => {
                let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-cache");
                format!("plugins = \"plugins\"\nstore = \"journal.db\"\ncache = {:?}\n", cache.display().to_string())
            }
        }
    }
    /// The compiled-code cache of a host of this language in `dir`.
    pub fn cache_dir(self, dir: &Path) -> PathBuf {
        match self {
            Lang::Rust => dir.join("cache"),
            Lang::Python => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-cache"),
        }
    }
}

/// `PATH` without any directory holding `cargo` or `rustc`: a command run with
/// it (and without `CARGO`) proves it needs no Rust toolchain.
pub fn path_without_toolchain() -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> =
        std::env::split_paths(&path).filter(|d| !d.join("cargo").exists() && !d.join("rustc").exists()).collect();
    std::env::join_paths(kept).unwrap_or_default()
}

/// `cmd` with no way to reach a Rust toolchain: `PATH` without cargo and
/// rustc, no `CARGO`, `RUSTC` or rustup variables.
pub fn without_toolchain(cmd: &mut std::process::Command) -> &mut std::process::Command {
    cmd.env("PATH", path_without_toolchain());
    for var in ["CARGO", "RUSTC", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "CARGO_HOME"] {
        cmd.env_remove(var);
    }
    cmd
}

/// A host over a temporary directory: `plugins/`, `journal.db`, `cache/`.
pub struct TestHost {
    /// The temporary directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// The checked config.
    pub config: Config,
    /// The agent runtime.
    pub runtime: Runtime,
}

/// The config preamble every test host uses; tests append agents and grants.
pub const PREAMBLE: &str = "plugins = \"plugins\"\nstore = \"journal.db\"\ncache = \"cache\"\n";

impl TestHost {
    /// A host with `config` (TOML, appended to [`PREAMBLE`]) and `plugins` (file name, bytes).
    pub fn new(config: &str, plugins: &[(&str, Vec<u8>)]) -> TestHost {
        Self::new_in(Lang::Rust, config, plugins)
    }

    /// A host for Tools in `lang` (its [`Lang::preamble`]) with `config` and `plugins`.
    pub fn new_in(lang: Lang, config: &str, plugins: &[(&str, Vec<u8>)]) -> TestHost {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
        for (name, bytes) in plugins {
            std::fs::write(dir.path().join("plugins").join(name), bytes).unwrap();
        }
        std::fs::write(dir.path().join("toolgate.toml"), format!("{}{config}", lang.preamble())).unwrap();
        Self::open(dir, "default")
    }

    /// Open a host on an existing directory (a restart).
    pub fn open(dir: tempfile::TempDir, agent: &str) -> TestHost {
        let config = Config::load(&dir.path().join("toolgate.toml")).unwrap();
        let runtime = runtime_for(&config, agent);
        TestHost { dir, config, runtime }
    }

    /// Stop this host and start a new one on the same directory.
    pub fn restart(self) -> TestHost {
        let TestHost { dir, .. } = self;
        Self::open(dir, "default")
    }

    /// The plugin directory.
    pub fn plugins(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// The journal file.
    pub fn journal_path(&self) -> PathBuf {
        self.dir.path().join("journal.db")
    }

    /// Instances created so far by this host's executor.
    pub fn instantiations(&self) -> u64 {
        self.runtime.executor().instantiations()
    }
}

/// A runtime for `agent` over `config`.
pub fn runtime_for(config: &Config, agent: &str) -> Runtime {
    let catalog = Arc::new(toolgate::host::catalog(config).unwrap());
    let snapshot = ExecutableAgentSnapshot::build(config, agent, catalog).unwrap();
    let executor =
        Arc::new(Executor::new(ExecutorSettings::new(config.limits.clone(), Some(config.cache.clone()))).unwrap());
    let store: Arc<dyn StepStore> = match &config.store {
        toolgate::config::StoreLocation::Memory => Arc::new(toolgate::MemoryJournal::new()),
        toolgate::config::StoreLocation::Sqlite(path) => Arc::new(SqliteJournal::open(path).unwrap()),
        toolgate::config::StoreLocation::Postgres(_) => panic!("runtime_for opens SQLite stores; use host::open"),
    };
    Runtime::new(snapshot, executor, store, toolgate::RuntimeSettings::of(config))
}

/// Rewrite the pending call of `ticket` in the SQLite journal at `journal`
/// as an agent that can write the file (the same OS user) would: another
/// tool, arguments with their digest (a plain SHA-256 anyone can compute)
/// and that tool's component digest, all consistent with each other.
pub fn rewrite_awaiting(
    journal: &Path,
    ticket: &str,
    tool: &str,
    arguments: &serde_json::Value,
    component: &toolgate::Digest,
) {
    let db = rusqlite::Connection::open(journal).unwrap();
    let changed = db
        .execute(
            "UPDATE awaiting SET tool_id = ?1, arguments = ?2, argument_digest = ?3, component_digest = ?4 \
             WHERE ticket_id = ?5",
            [
                tool,
                &arguments.to_string(),
                &toolgate::policy::gate::argument_digest(arguments),
                &component.hex(),
                ticket,
            ],
        )
        .unwrap();
    assert_eq!(changed, 1, "no awaiting record for {ticket}");
}

/// Rewrite the run restrictions the pending call of `ticket` asked under
/// (a JSON array of `Restriction`s; `None`: none) in the SQLite journal at
/// `journal`, as a journal writer would: neither the tool, the arguments
/// nor the run changes, so anything that finds the request by them still
/// finds it.
pub fn rewrite_awaiting_restriction(journal: &Path, ticket: &str, restriction: Option<&str>) {
    let db = rusqlite::Connection::open(journal).unwrap();
    let changed = db
        .execute("UPDATE awaiting SET restriction = ?1 WHERE ticket_id = ?2", rusqlite::params![restriction, ticket])
        .unwrap();
    assert_eq!(changed, 1, "no awaiting record for {ticket}");
}

/// Write `bytes` to `dir/name`.
pub fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// A request the test server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `GET /path?query HTTP/1.1`.
    pub line: String,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    /// The first header named `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A small HTTP/1.1 server on 127.0.0.1 for outbound tests (a thread per
/// connection); stops on drop.
///
/// Routes: `/issues?state=S` (needs `Authorization: Bearer <token>`, answers
/// JSON issues), `/echo` (reflects the request line and headers in body and
/// headers), `/redirect` (302 to the configured location), `/slow` (never
/// answers), `/big` (64 KiB), `/bytes?kib=N` (N KiB), `/upload` (reads the
/// request's body and answers `received N bytes`), `/reflect?form=F&in=body|header&coding=C`
/// (reflects the token it received in encoding `F` — see [`encode`] — and
/// stores it), `/rotate` (writes the value given to [`TestServer::on_rotate`]
/// to its file), `/recall?form=F&in=…&coding=…` (the stored token, asked for
/// without any credential), else 404.
pub struct TestServer {
    /// The port it listens on.
    pub port: u16,
    requests: Arc<Mutex<Vec<Recorded>>>,
    rotation: Arc<Mutex<Option<(std::path::PathBuf, String)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The token a request carried: a bearer token, a basic-auth password, or an `api_key` query parameter.
fn received_token(rec: &Recorded, target: &str) -> Option<String> {
    use base64::Engine as _;
    if let Some(auth) = rec.header("authorization") {
        if let Some(t) = auth.strip_prefix("Bearer ") {
            return Some(t.to_owned());
        }
        if let Some(b) = auth.strip_prefix("Basic ") {
            let decoded = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
            let text = String::from_utf8(decoded).ok()?;
            return text.split_once(':').map(|(_, p)| p.to_owned());
        }
    }
    let query = target.split_once('?')?.1;
    query.split('&').find_map(|kv| kv.strip_prefix("api_key=")).map(|v| percent_decode(v))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length of the body of `rec`, read from `reader` (length-delimited or
/// chunked); `None` if it cannot be read.
fn read_body(reader: &mut impl std::io::BufRead, rec: &Recorded) -> Option<usize> {
    if let Some(n) = rec.header("content-length") {
        let n: usize = n.parse().ok()?;
        std::io::copy(&mut std::io::Read::take(&mut *reader, n as u64), &mut std::io::sink())
            .ok()
            .filter(|&got| got == n as u64)?;
        return Some(n);
    }
    if !rec.header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        return Some(0);
    }
    let mut total = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                let mut t = String::new();
                if reader.read_line(&mut t).ok()? == 0 || t.trim().is_empty() {
                    return Some(total);
                }
            }
        }
        std::io::copy(&mut std::io::Read::take(&mut *reader, size as u64 + 2), &mut std::io::sink()).ok()?;
        total += size;
    }
}

/// Every encoding the reflecting routes produce, by name.
pub const FORMS: &[&str] = &[
    "raw",
    "json-slash",
    "json-u",
    "json-u-upper",
    "html-dec",
    "html-hex",
    "html-named",
    "pct-upper",
    "pct-lower",
    "form",
    "b64",
    "b64-nopad",
    "b64url",
    "b64-basic",
    "b64-bearer",
    "b64-offset1",
    "b64-offset2",
    "b64-json",
    "b64-pct",
    "hex",
    "hex-upper",
    "pct-twice",
    "html-in-json",
    "json-in-pct",
    "b64-pct-twice",
    "b64-wrapped-json",
    "b64-twice",
    "base32",
    "base32-lower",
    "hex-colons",
    "byte-list",
    "qp",
    "js-x",
];

/// `secret` in encoding `form` (one of [`FORMS`]), as servers and HTTP
/// libraries produce them.
pub fn encode(form: &str, secret: &str) -> String {
    use base64::Engine as _;
    let std = base64::engine::general_purpose::STANDARD;
    let nopad = base64::engine::general_purpose::STANDARD_NO_PAD;
    let url = base64::engine::general_purpose::URL_SAFE;
    let json_u: String = secret.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
    match form {
        "raw" => secret.to_owned(),
        "json-slash" => serde_json::to_string(secret).unwrap().trim_matches('"').replace('/', "\\/"),
        "json-u" => json_u,
        "json-u-upper" => json_u.to_uppercase().replace("\\U", "\\u"),
        "html-dec" => secret.chars().map(|c| format!("&#{};", c as u32)).collect(),
        "html-hex" => secret.chars().map(|c| format!("&#x{:x};", c as u32)).collect(),
        "html-named" => {
            secret.replace('&', "&amp;").replace('/', "&sol;").replace('+', "&plus;").replace('=', "&equals;")
        }
        "pct-upper" => secret.bytes().map(|b| format!("%{b:02X}")).collect(),
        "pct-lower" => secret.bytes().map(|b| format!("%{b:02x}")).collect(),
        "form" => secret
            .bytes()
            .map(|b| match b {
                b' ' => "+".to_owned(),
                b if b.is_ascii_alphanumeric() => (b as char).to_string(),
                b => format!("%{b:02X}"),
            })
            .collect(),
        "b64" => std.encode(secret),
        "b64-nopad" => nopad.encode(secret),
        "b64url" => url.encode(secret),
        "b64-basic" => std.encode(format!("bot:{secret}")),
        "b64-bearer" => std.encode(format!("Bearer {secret}")),
        "b64-offset1" => std.encode(format!("x{secret}y")),
        "b64-offset2" => std.encode(format!("xy{secret}z")),
        "b64-json" => std.encode(format!("u:{secret}")).replace('/', "\\/"),
        "b64-pct" => std.encode(format!("u:{secret}")).replace('+', "%2B").replace('/', "%2f").replace('=', "%3D"),
        "pct-twice" => secret.bytes().map(|b| format!("%25{b:02X}")).collect(),
        "html-in-json" => secret.chars().map(|c| format!("\\u0026#x{:x};", c as u32)).collect(),
        "json-in-pct" => json_u.replace('\\', "%5C"),
        "b64-pct-twice" => std.encode(secret).replace('+', "%252B").replace('/', "%252F").replace('=', "%253D"),
        "b64-wrapped-json" => {
            let b = std.encode(format!("u:{secret}"));
            b.as_bytes().chunks(8).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join("\\r\\n")
        }
        "b64-twice" => std.encode(std.encode(secret)),
        "base32" => data_encoding::BASE32.encode(secret.as_bytes()),
        "base32-lower" => data_encoding::BASE32.encode(secret.as_bytes()).to_lowercase(),
        "hex-colons" => secret.bytes().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"),
        "byte-list" => secret.bytes().map(|b| b.to_string()).collect::<Vec<_>>().join(","),
        "qp" => secret.bytes().map(|b| format!("={b:02X}")).collect(),
        "js-x" => secret.bytes().map(|b| format!("\\x{b:02x}")).collect(),
        "hex" => hex_encode(secret, false),
        "hex-upper" => hex_encode(secret, true),
        other => panic!("unknown form {other}"),
    }
}

fn hex_encode(s: &str, upper: bool) -> String {
    s.bytes().map(|b| if upper { format!("{b:02X}") } else { format!("{b:02x}") }).collect()
}

fn query_param<'a>(target: &'a str, name: &str) -> Option<&'a str> {
    target.split_once('?')?.1.split('&').find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
}

/// A reflected value as a response: in the body or a header, with content coding `coding`.
fn reflect(value: &str, target: &str) -> (String, String, Vec<u8>) {
    use std::io::Write as _;
    let place = query_param(target, "in").unwrap_or("body");
    let coding = query_param(target, "coding").unwrap_or("identity");
    let (mut extra, body) = if place == "header" {
        (format!("x-reflect: {value}\r\n"), b"{\"ok\":true}".to_vec())
    } else {
        (String::new(), format!("{{\"echo\":\"{value}\"}}").into_bytes())
    };
    let gzip = |b: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    };
    let zlib = |b: &[u8]| {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    };
    let (body, declared): (Vec<u8>, &[&str]) = match coding {
        "gzip" => (gzip(&body), &["content-encoding: gzip"]),
        "deflate" => (zlib(&body), &["content-encoding: deflate"]),
        // Compressed, and the headers do not say so.
        "gzip-unlabeled" => (gzip(&body), &[]),
        "zlib-unlabeled" => (zlib(&body), &[]),
        // Two layers declared on two lines (a server may list codings either way).
        "gzip-deflate-lines" => (zlib(&gzip(&body)), &["content-encoding: gzip", "content-encoding: deflate"]),
        // A compressed multipart part, after other bytes.
        "gzip-part" => ([b"--part\r\ncontent-type: application/gzip\r\n\r\n".as_slice(), &gzip(&body)].concat(), &[]),
        "identity" => (body, &[]),
        // A coding the host cannot decode: the bytes are just the body.
        _ => {
            extra.push_str(&format!("content-encoding: {coding}\r\n"));
            (body, &[])
        }
    };
    for line in declared {
        extra.push_str(&format!("{line}\r\n"));
    }
    ("200 OK".into(), extra, body)
}

impl TestServer {
    /// Start a server expecting `token`; `/redirect` points at `location`.
    pub fn start(token: &str, location: &str) -> TestServer {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let stored: Arc<Mutex<Option<String>>> = Arc::default();
        let rotation: Arc<Mutex<Option<(std::path::PathBuf, String)>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (token, location) = (token.to_owned(), location.to_owned());
        let (reqs, stopping, rotating) = (requests.clone(), stop.clone(), rotation.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                let (token, location, reqs, stored) = (token.clone(), location.clone(), reqs.clone(), stored.clone());
                let rotating = rotating.clone();
                std::thread::spawn(move || {
                    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok();
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_err() {
                        return;
                    }
                    let line = line.trim_end().to_owned();
                    let mut headers = Vec::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).is_err() || h.trim_end().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.trim_end().split_once(':') {
                            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                        }
                    }
                    let rec = Recorded { line: line.clone(), headers };
                    reqs.lock().unwrap().push(rec.clone());
                    let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let (status, extra, body): (String, String, Vec<u8>) = if target.starts_with("/issues") {
                        if rec.header("authorization") == Some(&format!("Bearer {token}")) {
                            let state = if target.contains("state=closed") { "closed" } else { "open" };
                            let all = serde_json::json!([
                                {"id": 1, "title": "Crash on start", "state": "open"},
                                {"id": 2, "title": "Typo in docs", "state": "closed"},
                                {"id": 3, "title": "Slow search", "state": "open"},
                            ]);
                            let list: Vec<_> =
                                all.as_array().unwrap().iter().filter(|i| i["state"] == state).cloned().collect();
                            ("200 OK".into(), String::new(), serde_json::to_vec(&list).unwrap())
                        } else {
                            ("401 Unauthorized".into(), String::new(), b"{\"error\":\"unauthorized\"}".to_vec())
                        }
                    } else if target.starts_with("/echo") {
                        let mut body = format!("{line}\n");
                        for (k, v) in &rec.headers {
                            body.push_str(&format!("{k}: {v}\n"));
                        }
                        let auth = rec.header("authorization").unwrap_or("none").to_owned();
                        (
                            "200 OK".into(),
                            format!("x-echo-authorization: {auth}\r\nx-echo-line: {line}\r\n"),
                            body.into_bytes(),
                        )
                    } else if target.starts_with("/reflect") {
                        match received_token(&rec, &target) {
                            Some(t) => {
                                *stored.lock().unwrap() = Some(t.clone());
                                reflect(&encode(query_param(&target, "form").unwrap_or("raw"), &t), &target)
                            }
                            None => ("401 Unauthorized".into(), String::new(), b"no token".to_vec()),
                        }
                    } else if target.starts_with("/recall") {
                        let t = stored.lock().unwrap().clone().unwrap_or_default();
                        reflect(&encode(query_param(&target, "form").unwrap_or("raw"), &t), &target)
                    } else if target.starts_with("/rotate") {
                        // A token refresh: the credential's file gets a new value.
                        if let Some((path, value)) = rotating.lock().unwrap().clone() {
                            std::fs::write(path, value).unwrap();
                        }
                        ("200 OK".into(), String::new(), b"{\"rotated\":true}".to_vec())
                    } else if target.starts_with("/slow") {
                        // Never answers in time: hold the connection, then give up.
                        std::thread::sleep(std::time::Duration::from_secs(3));
                        return;
                    } else if target.starts_with("/upload") {
                        // Reads the whole body (length-delimited or chunked) and says how long it was.
                        match read_body(&mut reader, &rec) {
                            Some(n) => ("200 OK".into(), String::new(), format!("received {n} bytes").into_bytes()),
                            None => ("400 Bad Request".into(), String::new(), b"unreadable body".to_vec()),
                        }
                    } else if target.starts_with("/bytes") {
                        let kib: usize = query_param(&target, "kib").and_then(|k| k.parse().ok()).unwrap_or(1);
                        ("200 OK".into(), String::new(), vec![b'x'; kib << 10])
                    } else if target.starts_with("/big") {
                        ("200 OK".into(), String::new(), vec![b'x'; 64 * 1024])
                    } else if target.starts_with("/redirect") {
                        ("302 Found".into(), format!("location: {location}\r\n"), Vec::new())
                    } else {
                        ("404 Not Found".into(), String::new(), b"not found".to_vec())
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&body));
                });
            }
        });
        TestServer { port, requests, rotation, stop, thread: Some(thread) }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Have `/rotate` write `value` to `path` (a credential's file).
    pub fn on_rotate(&self, path: &std::path::Path, value: &str) {
        *self.rotation.lock().unwrap() = Some((path.to_owned(), value.to_owned()));
    }

    /// `http://127.0.0.1:PORT`.
    pub fn origin(&self) -> String {
        self.url("")
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Among `steps` (a whole journal), no call has two results and no ticket two
/// resolutions (an ask's own step aside); the resolutions per ticket.
pub fn assert_no_call_or_ticket_committed_twice(
    steps: &[toolgate::store::StepRecord],
) -> std::collections::BTreeMap<String, usize> {
    use std::collections::BTreeMap;
    let mut results_per_call: BTreeMap<&str, usize> = BTreeMap::new();
    let mut resolutions: BTreeMap<String, usize> = BTreeMap::new();
    for s in steps {
        if s.outcome != toolgate::store::OutcomeKind::Awaiting {
            *results_per_call.entry(&s.call_id).or_default() += 1;
            if let Some(t) = &s.ticket_id {
                *resolutions.entry(t.clone()).or_default() += 1;
            }
        }
    }
    assert!(results_per_call.values().all(|&n| n == 1), "a call committed twice: {results_per_call:?}");
    assert!(resolutions.values().all(|&n| n == 1), "a ticket resolved twice: {resolutions:?}");
    resolutions
}

/// Run `cmd`, SIGKILL it after `kill_after` unless it finished; `None` if
/// killed. Crash tests kill hosts at chosen points.
pub fn run_or_kill(mut cmd: std::process::Command, kill_after: std::time::Duration) -> Option<std::process::Output> {
    let mut child = cmd.spawn().unwrap();
    let start = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if start.elapsed() >= kill_after {
            child.kill().unwrap(); // SIGKILL on Unix
            child.wait().unwrap(); // reaped: its pid is gone
            return None;
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
}
