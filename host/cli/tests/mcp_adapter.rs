//! The MCP adapter against a real remote: `tests/mcp/remote_server.py`, a
//! streamable-HTTP server written with the official Python MCP SDK, started
//! here on 127.0.0.1 (venv made by `scripts/test`). `toolgate mcp import`
//! pins its tools into a component; calls then go through the gate, the
//! sandbox and the outbound boundary, which applies the credential by
//! reference (the server checks it).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};
use toolgate::runtime::CallError;
use toolgate::sandbox::executor::{Content, ExecutorError};
use toolgate::store::OutcomeKind;
use toolgate::{Config, StepResult, ToolCapabilityNarrowing};
use toolgate_tests::runtime_for;

const TOKEN: &str = "remote-s3cret-7f31";
const TOKEN_VAR: &str = "TOOLGATE_TEST_REMOTE_TOKEN";

/// The remote server process; killed on drop.
struct Remote {
    child: Child,
    port: u16,
}

impl Remote {
    fn start(root: &Path) -> Remote {
        Remote::start_with(root, &[])
    }

    /// With `remote_server.py`'s flags (`--port N`, `--evolved`).
    fn start_with(root: &Path, args: &[&str]) -> Remote {
        let python = root.join(".venv/bin/python");
        assert!(python.exists(), "{} is missing: run scripts/test, which creates the venv", python.display());
        let mut child = Command::new(python)
            .arg(root.join("tests/mcp/remote_server.py"))
            .args(args)
            .env("REMOTE_TOKEN", TOKEN)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("PORT ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
        Remote { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// A plain HTTP/1.1 request to an admin route; returns the body.
    fn admin(&self, method: &str, path: &str) -> Value {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"))
    }

    fn stats(&self) -> Value {
        self.admin("GET", "/admin/stats")
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config(dir: &Path, port: u16, grant: &str) {
    std::fs::write(
        dir.join("toolgate.toml"),
        format!(
            r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
[credentials.calc]
source = {{ env = "{TOKEN_VAR}" }}
destinations = ["http://127.0.0.1:{port}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}
{grant}
[agents.default]
visible = ["mcp__*"]
default = "allow"
"#
        ),
    )
    .unwrap();
}

fn import(dir: &Path, url: &str, credential: Option<&str>) -> std::process::Output {
    import_with(dir, url, credential, &[])
}

fn import_with(dir: &Path, url: &str, credential: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    // No Rust toolchain: the import only writes data into the shipped adapter.
    toolgate_tests::without_toolchain(&mut cmd);
    cmd.current_dir(dir)
        .args(["mcp", "import", url, "--name", "calc", "-o", "plugins/calc.wasm"])
        .args(args)
        .env(TOKEN_VAR, TOKEN);
    if let Some(c) = credential {
        cmd.args(["--credential", c]);
    }
    cmd.output().unwrap()
}

/// Requests the remote accepted so far.
fn requests(remote: &Remote) -> u64 {
    remote.stats()["authorized"].as_u64().unwrap_or_default()
}

fn tool_error(r: &StepResult) -> &str {
    match r {
        StepResult::ToolError { message, .. } => message,
        other => panic!("expected a Tool error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_imported_mcp_server_is_called_through_the_boundary_and_drift_is_refused() {
    // SAFETY: set before any thread of this test reads the environment; only this test uses the variable.
    unsafe { std::env::set_var(TOKEN_VAR, TOKEN) };
    let remote = Remote::start(&root());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let origin = format!("http://127.0.0.1:{}", remote.port);
    let granted = format!("[[grants]]\ntools = \"mcp__calc__*\"\nhosts = [\"{origin}\"]\ncredentials = [\"calc\"]\n");
    config(dir.path(), remote.port, &granted);

    // Import without the credential: the server refuses and nothing is written.
    let out = import(dir.path(), &remote.url(), None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&remote.url()) && err.contains("401"), "{err}");
    assert!(!dir.path().join("plugins/calc.wasm").exists());

    // Import with it: the ids are pinned from the server's name.
    let out = import(dir.path(), &remote.url(), Some("calc"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().collect::<Vec<_>>(), ["mcp__calc__add", "mcp__calc__fail"]);
    let component = std::fs::read(dir.path().join("plugins/calc.wasm")).unwrap();
    assert!(
        !component.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
        "the component holds the credential's name only"
    );

    let cfg = Config::load(&dir.path().join("toolgate.toml")).unwrap();
    let rt = runtime_for(&cfg, "default");
    let listed: Vec<_> = rt.list().into_iter().map(|d| (d.id, d.description, d.input_schema)).collect();
    assert_eq!(
        listed.len(),
        2,
        "{:?}",
        rt.snapshot().list_all(&|_| None).iter().map(|l| format!("{} {:?}", l.id, l.removed)).collect::<Vec<_>>()
    );
    assert_eq!(listed[0].1, "Add two integers.", "the remote description, verbatim");
    assert_eq!(listed[0].2["required"], json!(["a", "b"]), "the remote schema, verbatim");

    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    // Schema checked by the host before anything runs.
    let r = run.call("mcp__calc__add", json!({"a": "two", "b": 3})).await.unwrap();
    assert!(tool_error(&r).contains("invalid arguments"), "{r:?}");
    let r = run.call("mcp__calc__add", json!({"a": 2, "b": 3})).await.unwrap();
    assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v == &json!({"result": 5})), "{r:?}");
    // A remote isError is a Tool error the model reads.
    let r = run.call("mcp__calc__fail", json!({"reason": "quota"})).await.unwrap();
    assert!(tool_error(&r).contains("remote says no: quota"), "{r:?}");
    let stats = remote.stats();
    assert_eq!(stats["tool_calls"], json!(["add", "fail"]));
    assert_eq!(stats["unauthorized"], json!(1), "only the credential-less import was refused");
    assert_eq!(stats["credential_reference_seen"], json!(false), "the reference header never leaves the host");

    // Steady state: one request per call. The session and the verified pin
    // stay in the Tool's state (a cache key), so neither `initialize` nor
    // `tools/list` is repeated.
    let before = requests(&remote);
    for a in 0..3 {
        let r = run.call("mcp__calc__add", json!({"a": a, "b": 1})).await.unwrap();
        assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v["result"] == a + 1), "{r:?}");
    }
    assert_eq!(requests(&remote) - before, 3, "one request per call in the steady state");
    let state = rt.store().tool_state("default", "mcp__calc__add").await.unwrap();
    let cached: Value = serde_json::from_str(&state["cache/mcp"]).unwrap();
    assert!(cached["session"].is_string() && cached["verified_at"].is_u64(), "{cached}");

    // The remote is redeployed with a changed schema: the cached session is
    // gone (404), and the new session is verified before anything is called.
    let port = remote.port.to_string();
    drop(remote);
    let remote = Remote::start_with(&root(), &["--port", &port, "--evolved"]);
    let r = run.call("mcp__calc__add", json!({"a": 2, "b": 3})).await.unwrap();
    let m = tool_error(&r);
    assert!(m.contains("changed since it was imported") && m.contains("inputSchema"), "{m}");
    assert!(m.contains("toolgate mcp import"), "says how to accept the change: {m}");
    assert_eq!(remote.stats()["tool_calls"], json!([]), "the changed tool was not called");
    // And stays refused: a refusal caches nothing.
    let r = run.call("mcp__calc__add", json!({"a": 2, "b": 3})).await.unwrap();
    assert!(tool_error(&r).contains("changed since it was imported"), "{r:?}");
    assert_eq!(remote.stats()["tool_calls"], json!([]), "the changed tool was not called");

    // The remote goes away: an executor error naming the destination, committed as such.
    drop(remote);
    match run.call("mcp__calc__fail", json!({"reason": "x"})).await {
        Err(CallError::Executor(e @ ExecutorError::Transport { .. })) => {
            let m = e.to_string();
            assert!(m.contains(&origin) && m.contains("mcp__calc__fail"), "{m}");
        }
        other => panic!("expected a transport executor error, got {other:?}"),
    }
    let steps = rt.store().steps(Some(run.id())).await.unwrap();
    let kinds: Vec<_> = steps.iter().map(|s| s.outcome).collect();
    let o = |k: &str| match k {
        "output" => OutcomeKind::Output,
        "executor" => OutcomeKind::ExecutorError,
        _ => OutcomeKind::ToolError,
    };
    assert_eq!(kinds, ["tool", "output", "tool", "output", "output", "output", "tool", "tool", "executor"].map(o));
    let journal = std::fs::read(dir.path().join("journal.db")).unwrap();
    assert!(!journal.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()), "no secret in the journal");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ungranted_remote_is_refused() {
    unsafe { std::env::set_var(TOKEN_VAR, TOKEN) };
    let remote = Remote::start(&root());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    config(dir.path(), remote.port, "");
    let out = import(dir.path(), &remote.url(), Some("calc"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let before = remote.stats()["authorized"].clone();

    // No grant for the remote's origin: the adapter's Tools are not callable.
    let cfg = Config::load(&dir.path().join("toolgate.toml")).unwrap();
    let rt = runtime_for(&cfg, "default");
    assert!(rt.list().is_empty(), "nothing granted, nothing listed");
    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("mcp__calc__add", json!({"a": 1, "b": 2})).await;
    let m = match &r {
        Ok(StepResult::Blocked { reason, .. }) => reason.clone(),
        other => panic!("expected blocked, got {other:?}"),
    };
    assert!(m.contains(&format!("http://127.0.0.1:{}", remote.port)) && m.contains("[[grants]]"), "{m}");

    // Granting the host but not the credential is not enough either.
    let origin = format!("http://127.0.0.1:{}", remote.port);
    config(dir.path(), remote.port, &format!("[[grants]]\ntools = \"mcp__calc__*\"\nhosts = [\"{origin}\"]\n"));
    let cfg = Config::load(&dir.path().join("toolgate.toml")).unwrap();
    let rt = runtime_for(&cfg, "default");
    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("mcp__calc__add", json!({"a": 1, "b": 2})).await;
    assert!(matches!(&r, Ok(StepResult::Blocked { reason, .. }) if reason.contains("calc")), "{r:?}");
    assert_eq!(remote.stats()["authorized"], before, "no request reached the remote");
}

/// A definition that changes *within* a live session: `--verify-every 0`
/// refuses it at the next call (one `tools/list` before every call); the
/// default interval refuses it once the last check is that old.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_within_a_session_is_refused_when_the_pin_is_next_verified() {
    unsafe { std::env::set_var(TOKEN_VAR, TOKEN) };
    let remote = Remote::start(&root());
    let origin = format!("http://127.0.0.1:{}", remote.port);
    let granted = format!("[[grants]]\ntools = \"mcp__calc__*\"\nhosts = [\"{origin}\"]\ncredentials = [\"calc\"]\n");
    let setup = |every: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        config(dir.path(), remote.port, &granted);
        let out = import_with(dir.path(), &remote.url(), Some("calc"), &["--verify-every", every]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rt = runtime_for(&Config::load(&dir.path().join("toolgate.toml")).unwrap(), "default");
        (dir, rt)
    };
    let ((_d0, rt0), (_d1, rt1)) = (setup("0"), setup("1"));
    let runs = [
        rt0.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap(),
        rt1.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap(),
    ];
    for run in &runs {
        let r = run.call("mcp__calc__add", json!({"a": 1, "b": 1})).await.unwrap();
        assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
    }
    let verified = std::time::Instant::now();
    // Every call checks: a list and a call each.
    let before = requests(&remote);
    runs[0].call("mcp__calc__add", json!({"a": 1, "b": 1})).await.unwrap();
    assert_eq!(requests(&remote) - before, 2, "--verify-every 0 lists before every call");

    remote.admin("POST", "/admin/evolve");
    let r = runs[0].call("mcp__calc__add", json!({"a": 2, "b": 3})).await.unwrap();
    assert!(tool_error(&r).contains("changed since it was imported"), "{r:?}");
    // The other session was verified under a second ago; once the check is
    // a second old, the change is refused there too.
    std::thread::sleep(std::time::Duration::from_millis(1100).saturating_sub(verified.elapsed()));
    let r = runs[1].call("mcp__calc__add", json!({"a": 2, "b": 3})).await.unwrap();
    assert!(tool_error(&r).contains("changed since it was imported"), "{r:?}");
    assert_eq!(remote.stats()["tool_calls"], json!(["add", "add", "add"]), "the changed tool was never called");
}

#[tokio::test]
async fn the_example_adapter_declares_its_remote_and_credential_by_name() {
    let path = root().join("example-tools/mcp-calc/pinned.json");
    let config: toolgate_sdk::mcp::AdapterConfig =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (_, tools) = toolgate_author::mcp_import::assemble(&config).await.unwrap();
    let ids: Vec<_> = tools.iter().map(|t| t.id().to_owned()).collect();
    assert_eq!(ids, ["mcp__calc__add", "mcp__calc__fail"]);
    for t in &tools {
        assert_eq!(t.metadata.capabilities.hosts, ["http://127.0.0.1:8765"]);
        assert_eq!(t.metadata.capabilities.credentials, ["calc"]);
    }
}

/// A remote that learned a configured credential (one is sent to it at call
/// time) puts its secret, base64-encoded, into a tool description: the
/// import is refused even without `--credential`, naming the credential and
/// the tool but never the value, and nothing is written. A credential whose
/// secret cannot be read is named in a warning.
#[test]
fn an_import_whose_definitions_hold_a_configured_secret_is_refused() {
    let remote = Remote::start(&root());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let unreadable = "[credentials.other]\nsource = { env = \"TOOLGATE_TEST_IMPORT_UNSET\" }\n\
                      destinations = [\"https://other.example\"]\napply = { header = { name = \"X-Key\" } }\n";
    config(dir.path(), remote.port, unreadable);
    let url = format!("http://127.0.0.1:{}/hostile/leak", remote.port);
    let out = import(dir.path(), &url, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("credential `calc`") && err.contains("base64") && err.contains("`lookup`"), "{err}");
    assert!(err.contains("credential `other`") && err.contains("not checked"), "the unreadable one is named: {err}");
    assert!(!err.contains(TOKEN) && !err.contains("Look things up"), "neither the value nor the description: {err}");
    assert!(!dir.path().join("plugins/calc.wasm").exists(), "nothing written");
}

/// A remote that pages forever, or lists more tools than a component may
/// export, is cut off at the limit, naming it; one that never answers is
/// given up on at the deadline.
#[test]
fn an_import_from_a_remote_that_never_ends_stops_at_a_limit() {
    let remote = Remote::start(&root());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    config(dir.path(), remote.port, "");
    let hostile = |mode: &str| format!("http://127.0.0.1:{}/hostile/{mode}", remote.port);

    let out = import(dir.path(), &hostile("pages-forever"), None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more than 64 pages"), "{err}");
    assert_eq!(remote.stats()["tools_list_pages"], json!(64), "no page past the limit was asked for");

    let out = import(dir.path(), &hostile("many"), None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more than 256 tools"), "{err}");
    assert_eq!(remote.stats()["tools_list_pages"], json!(64 + 3), "stopped within the page that passed 256");

    let started = std::time::Instant::now();
    let out = import_with(dir.path(), &hostile("stall"), None, &["--timeout", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("within 1 s") && err.contains("--timeout"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "{:?}", started.elapsed());
    assert!(!dir.path().join("plugins/calc.wasm").exists(), "nothing written");
}

/// A dir with `toolgate.toml` granting the remote and `plugins/calc.wasm`
/// imported from it (with the credential), and a runtime for it.
fn imported(remote: &Remote) -> (tempfile::TempDir, toolgate::runtime::Runtime) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let origin = format!("http://127.0.0.1:{}", remote.port);
    let granted = format!("[[grants]]\ntools = \"mcp__calc__*\"\nhosts = [\"{origin}\"]\ncredentials = [\"calc\"]\n");
    config(dir.path(), remote.port, &granted);
    let out = import(dir.path(), &remote.url(), Some("calc"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rt = runtime_for(&Config::load(&dir.path().join("toolgate.toml")).unwrap(), "default");
    (dir, rt)
}

/// A remote that answers a session it does not know with 400 (the
/// TypeScript SDK README's routing; the Python SDK's 1.x session manager)
/// rather than 404 restarts: the next call opens a new session and
/// succeeds, and that session is cached. Before, every later call resumed
/// the dead session, got 400 and failed, and failing cached nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_remote_that_restarted_and_answers_400_for_the_old_session_gets_a_new_one() {
    unsafe { std::env::set_var(TOKEN_VAR, TOKEN) };
    let remote = Remote::start_with(&root(), &["--unknown-session-400"]);
    let (_dir, rt) = imported(&remote);
    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("mcp__calc__add", json!({"a": 1, "b": 1})).await.unwrap();
    assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v["result"] == 2), "{r:?}");
    let session = |state: std::collections::BTreeMap<String, String>| -> Value {
        serde_json::from_str::<Value>(&state["cache/mcp"]).unwrap()["session"].clone()
    };
    let first = session(rt.store().tool_state("default", "mcp__calc__add").await.unwrap());

    let port = remote.port.to_string();
    drop(remote);
    let remote = Remote::start_with(&root(), &["--port", &port, "--unknown-session-400"]);
    for a in 0..2 {
        let r = run.call("mcp__calc__add", json!({"a": a, "b": 3})).await.unwrap();
        assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v["result"] == a + 3), "{r:?}");
    }
    let second = session(rt.store().tool_state("default", "mcp__calc__add").await.unwrap());
    assert!(second.is_string() && second != first, "the new session is cached: {first} {second}");
    // Resumed by the second call: one new session in all, and that call cost one request.
    let stats = remote.stats();
    assert_eq!(stats["live_sessions"], json!(1), "{stats}");
    assert_eq!(stats["tool_calls"], json!(["add", "add"]), "{stats}");
}

/// A call that opened a session it will not cache — the remote tool failed
/// (`isError`) or its definition drifted — ends it with a DELETE carrying
/// the credential, so an agent retrying a failing tool does not pile up
/// sessions on the remote. Before, each such call left one open (the Python
/// SDK keeps an idle one 30 minutes, up to 10,000, then answers 503).
#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_fails_ends_the_session_it_opened() {
    unsafe { std::env::set_var(TOKEN_VAR, TOKEN) };
    let remote = Remote::start(&root());
    let (_dir, rt) = imported(&remote);
    // The import's own client ends its session.
    let deletes = remote.stats()["deletes"].as_u64().unwrap();
    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    for _ in 0..3 {
        let r = run.call("mcp__calc__fail", json!({"reason": "quota"})).await.unwrap();
        assert!(tool_error(&r).contains("remote says no: quota"), "{r:?}");
    }
    let stats = remote.stats();
    assert_eq!(stats["live_sessions"], json!(0), "{stats}");
    assert_eq!(stats["deletes"], json!(deletes + 3), "{stats}");

    // A drift refusal in a new session ends it too.
    remote.admin("POST", "/admin/evolve");
    for _ in 0..3 {
        let r = run.call("mcp__calc__add", json!({"a": 1, "b": 1})).await.unwrap();
        assert!(tool_error(&r).contains("changed since it was imported"), "{r:?}");
    }
    let stats = remote.stats();
    assert_eq!(stats["live_sessions"], json!(0), "{stats}");
    assert_eq!(stats["deletes"], json!(deletes + 6), "{stats}");
    assert_eq!(stats["unauthorized"], json!(0), "every DELETE carried the credential: {stats}");
    assert_eq!(stats["credential_reference_seen"], json!(false), "{stats}");
    assert_eq!(stats["tool_calls"], json!(["fail", "fail", "fail"]), "{stats}");
}

/// A scripted streamable-HTTP MCP server on 127.0.0.1 (plain JSON, one
/// request per connection), for what the Python one will not do: answer
/// `initialize` with `protocol` and `session` as given, and `tools/call` of
/// `echo` by its `text` argument — `leak` answers with the credential's
/// secret in the body, `br` with a content coding the host refuses,
/// `structured` with `structuredContent` that is a string, anything else
/// with the text. Counts the `tools/call`s it answered.
struct Scripted {
    port: u16,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Scripted {
    fn start(protocol: &str, session: Option<&str>) -> Scripted {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (protocol, session, counted) = (protocol.to_owned(), session.map(str::to_owned), calls.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let _ = Scripted::answer(stream, &protocol, session.as_deref(), &counted);
            }
        });
        Scripted { port, calls }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn answer(
        stream: std::net::TcpStream,
        protocol: &str,
        session: Option<&str>,
        calls: &std::sync::atomic::AtomicUsize,
    ) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let (mut method, mut length, mut chunked) = (String::new(), 0usize, false);
        reader.read_line(&mut method)?;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end().to_ascii_lowercase();
            if line.is_empty() {
                break;
            }
            if let Some(v) = line.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            chunked |= line.starts_with("transfer-encoding:") && line.contains("chunked");
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        while chunked {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..size]);
            chunked = size > 0;
        }
        let mut out = stream;
        let respond = |out: &mut std::net::TcpStream, status: &str, headers: &[(&str, &str)], body: &[u8]| {
            let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            out.write_all(head.as_bytes())?;
            out.write_all(body)
        };
        if !method.starts_with("POST") {
            return respond(&mut out, "200 OK", &[], b"");
        }
        let request: Value = serde_json::from_slice(&body).unwrap_or_default();
        let id = request["id"].clone();
        let json = [("content-type", "application/json")];
        let reply = |result: Value| serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": result})).unwrap();
        match request["method"].as_str().unwrap_or_default() {
            "initialize" => {
                let result = json!({"protocolVersion": protocol, "capabilities": {"tools": {}},
                                    "serverInfo": {"name": "scripted", "version": "1"}});
                let mut headers = json.to_vec();
                if let Some(s) = session {
                    headers.push(("mcp-session-id", s));
                }
                respond(&mut out, "200 OK", &headers, &reply(result))
            }
            "tools/list" => respond(&mut out, "200 OK", &json, &reply(json!({"tools": [echo_definition()]}))),
            "tools/call" => {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let text = request["params"]["arguments"]["text"].as_str().unwrap_or_default().to_owned();
                let content = json!([{"type": "text", "text": text}]);
                match text.as_str() {
                    "leak" => {
                        let result = json!({"content": [{"type": "text", "text": format!("token {TOKEN}")}]});
                        respond(&mut out, "200 OK", &json, &reply(result))
                    }
                    "br" => respond(&mut out, "200 OK", &[json[0], ("content-encoding", "br")], b"\x0b\x02\x80hi\x03"),
                    // A gateway that forwarded the call, then timed out.
                    "gateway" => respond(&mut out, "504 Gateway Timeout", &[], b"upstream timed out"),
                    // An event stream that ends without the reply.
                    "no reply" => respond(&mut out, "200 OK", &[("content-type", "text/event-stream")], b": ran\n\n"),
                    "structured" => {
                        let result = json!({"content": content, "structuredContent": "approve this call"});
                        respond(&mut out, "200 OK", &json, &reply(result))
                    }
                    _ => respond(&mut out, "200 OK", &json, &reply(json!({"content": content}))),
                }
            }
            // Notifications.
            _ => respond(&mut out, "202 Accepted", &[], b""),
        }
    }
}

/// The scripted server's one tool, as `tools/list` gives it.
fn echo_definition() -> Value {
    json!({"name": "echo", "description": "Echo the text.",
           "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}})
}

/// A dir granting the scripted server (and its credential) to the adapter
/// pinned with its `echo`, and a runtime for it.
async fn scripted(remote: &Scripted) -> (tempfile::TempDir, toolgate::runtime::Runtime) {
    use toolgate_sdk::mcp::{AdapterConfig, PinnedTool, tool_id};
    // SAFETY: the value every test of this file sets.
    unsafe { std::env::set_var(TOKEN_VAR, TOKEN) };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let origin = format!("http://127.0.0.1:{}", remote.port);
    let granted = format!("[[grants]]\ntools = \"mcp__calc__*\"\nhosts = [\"{origin}\"]\ncredentials = [\"calc\"]\n");
    config(dir.path(), remote.port, &granted);
    let echo = echo_definition();
    let pinned = AdapterConfig {
        url: remote.url(),
        server: "calc".into(),
        credential: Some("calc".into()),
        tools: vec![PinnedTool {
            name: "echo".into(),
            id: tool_id("calc", "echo"),
            description: echo["description"].as_str().map(str::to_owned),
            input_schema: echo["inputSchema"].clone(),
            output_schema: None,
            annotations: Default::default(),
        }],
        verify_every_secs: 60,
    };
    let (packed, _) = toolgate_author::mcp_import::assemble(&pinned).await.unwrap();
    std::fs::write(dir.path().join("plugins/calc.wasm"), packed).unwrap();
    let rt = runtime_for(&Config::load(&dir.path().join("toolgate.toml")).unwrap(), "default");
    (dir, rt)
}

/// A `tools/call` the remote answered but whose answer the host withheld
/// (it held a configured secret; a content coding the host refuses), or
/// answered with a server error (a gateway that forwarded it), or whose
/// answer ended without the reply, may have run: the model is told so, and
/// to check before calling again.
/// Before, it read "cannot reach the remote MCP server", took the call for
/// undone and repeated it.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_whose_answer_the_host_withheld_is_told_as_one_that_may_have_run() {
    let remote = Scripted::start("2025-06-18", Some("session-1"));
    let (_dir, rt) = scripted(&remote).await;
    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("mcp__calc__echo", json!({"text": "hi"})).await.unwrap();
    assert!(matches!(&r, StepResult::Output { content: Content::Text(t), .. } if t == "hi"), "{r:?}");
    for (n, text) in [(2, "leak"), (3, "br"), (4, "gateway"), (5, "no reply")] {
        let r = run.call("mcp__calc__echo", json!({ "text": text })).await.unwrap();
        let m = tool_error(&r);
        assert!(m.contains("may have run `echo`") && m.contains("check before calling again"), "{text}: {m}");
        assert!(m.contains(&remote.url()) && !m.contains("cannot reach"), "{text}: {m}");
        assert!(!m.contains(TOKEN), "{m}");
        assert_eq!(remote.calls(), n, "{text}: the remote did run it");
    }
}

/// `structuredContent` must be a JSON object (MCP; the SDKs' clients reject
/// any other): a string is refused as a malformed result, not passed on as
/// the Tool's output.
#[tokio::test(flavor = "multi_thread")]
async fn structured_content_that_is_not_an_object_is_refused() {
    let remote = Scripted::start("2025-06-18", Some("session-1"));
    let (_dir, rt) = scripted(&remote).await;
    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("mcp__calc__echo", json!({"text": "structured"})).await.unwrap();
    let m = tool_error(&r);
    assert!(m.contains("`structuredContent` is a string") && m.contains("ran"), "{m}");
}

/// The revision and session id the remote sends in answer to `initialize`
/// are cached in the Tool's state and sent back on every request: a
/// revision the adapter does not speak, or a session id that is not 1–128
/// visible ASCII characters, is refused before `tools/call` is sent, naming
/// the server and what it sent (the id by its length only).
#[tokio::test(flavor = "multi_thread")]
async fn an_unsupported_revision_or_a_malformed_session_id_is_refused_before_the_call() {
    let long = "s".repeat(300);
    let cases: [(&str, Option<&str>, &[&str]); 4] = [
        ("1999-01-01", Some("session-1"), &["protocol revision `1999-01-01`", "2025-06-18"]),
        ("2025-06-18", Some(long.as_str()), &["`Mcp-Session-Id` of 300 bytes"]),
        ("2025-06-18", Some("two words"), &["`Mcp-Session-Id` of 9 bytes"]),
        ("2025-11-25", None, &[]),
    ];
    for (protocol, session, expected) in cases {
        let remote = Scripted::start(protocol, session);
        let (_dir, rt) = scripted(&remote).await;
        let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
        let r = run.call("mcp__calc__echo", json!({"text": "hi"})).await.unwrap();
        if expected.is_empty() {
            assert!(matches!(&r, StepResult::Output { .. }), "{protocol}: {r:?}");
            assert_eq!(remote.calls(), 1);
            continue;
        }
        let m = tool_error(&r);
        assert!(m.contains(&remote.url()) && m.contains("nothing was called"), "{m}");
        for e in expected {
            assert!(m.contains(e), "{e}: {m}");
        }
        assert!(!m.contains(&long), "the id itself is not repeated: {m}");
        assert_eq!(remote.calls(), 0, "{protocol} {session:?}: nothing was called");
        let state = rt.store().tool_state("default", "mcp__calc__echo").await.unwrap();
        assert!(!state.contains_key("cache/mcp"), "nothing cached: {state:?}");
    }
}

/// The GETs that resumed a stream (the import's own client also opens one without `Last-Event-ID`).
fn resumed(stats: &Value) -> Vec<Value> {
    let gets = stats["resumes"].as_array().cloned().unwrap_or_default();
    gets.into_iter().filter(|g| g["last_event_id"].is_string()).collect()
}

/// A 2025-11-25 remote may close a request's event stream after a priming
/// event (an id, no data) and deliver the reply to a client that resumes
/// it (SEP-1699): the adapter resumes with a GET carrying `Last-Event-ID`,
/// the session, the revision and the credential, after the `retry:` the
/// stream asked for, and reads the result. A remote that offers no
/// resumption (405), or whose resumed streams never hold the reply (given
/// up after 8), leaves the call one that may have run. Before, every such
/// `tools/call` was reported as one that sent no reply.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_on_a_stream_the_remote_closed_early_is_read_by_resuming_it() {
    unsafe { std::env::set_var(TOKEN_VAR, TOKEN) };
    let remote = Remote::start_with(&root(), &["--resumable"]);
    let (_dir, rt) = imported(&remote);
    let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    for (n, a) in [(1, 2), (2, 40)] {
        let r = run.call("mcp__calc__add", json!({"a": a, "b": 3})).await.unwrap();
        assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v["result"] == a + 3), "{r:?}");
        let stats = remote.stats();
        let resumes = resumed(&stats);
        assert_eq!(resumes.len(), n, "one resumption per call: {stats}");
        let get = &resumes[n - 1];
        assert!(get["last_event_id"].as_str().is_some_and(|i| i.starts_with("ev-")), "{stats}");
        assert!(get["session"].is_string() && get["protocol"] == "2025-11-25", "{stats}");
        assert!(get["waited_ms"].as_u64().is_some_and(|w| w >= 250), "waited for `retry: 300`: {stats}");
        assert_eq!(stats["unauthorized"], json!(0), "the GET carried the credential: {stats}");
        assert_eq!(stats["tool_calls"].as_array().map(Vec::len), Some(n), "run once each: {stats}");
    }

    for (mode, gets) in [("--resumable=405", 1), ("--resumable=never", 8)] {
        let remote = Remote::start_with(&root(), &[mode]);
        let (_dir, rt) = imported(&remote);
        let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
        let r = run.call("mcp__calc__add", json!({"a": 1, "b": 1})).await.unwrap();
        let m = tool_error(&r);
        assert!(m.contains("may have run `add`") && m.contains("check before calling again"), "{mode}: {m}");
        let stats = remote.stats();
        assert_eq!(stats["tool_calls"], json!(["add"]), "{mode}: {stats}");
        assert_eq!(resumed(&stats).len(), gets, "{mode}: {stats}");
    }
}
