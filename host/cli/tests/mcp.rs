//! `toolgate serve` against the official MCP Python SDK (tests/mcp/test_serve.py),
//! in the venv that `scripts/test` creates with the pinned SDK: stdio and
//! Streamable HTTP, the SDK's default mode (2026-07-28) and its legacy mode.

use std::path::PathBuf;
use std::process::Command;

use toolgate_tests::{guests, packed};

#[test]
fn the_official_python_mcp_client_drives_toolgate_serve() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test, which creates the venv with the pinned MCP SDK (tests/requirements.txt)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    for (name, path) in [("text", guests::TEXT), ("notes", guests::NOTES), ("hostile", guests::HOSTILE)] {
        std::fs::write(plugins.join(format!("{name}.wasm")), packed(path)).unwrap();
    }
    let extra = dir.path().join("files.wasm");
    std::fs::write(&extra, packed(guests::FILES)).unwrap();
    let config = dir.path().join("toolgate.toml");
    std::fs::write(
        &config,
        r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
[limits]
timeout_ms = 3000
[[grants]]
tools = "files.*"
directories = [{ path = "/data", host = "data", access = "read" }]
[serve]
auth = [
  { agent = "default", token = { env = "TOOLGATE_TEST_TOKEN" } },
  { agent = "reader", token = { env = "TOOLGATE_READER_TOKEN" } },
]
[agents.reader]
visible = ["text.*"]
default = "deny"
rules = [{ pattern = "text.*", behavior = "allow" }]
[agents.default]
visible = ["text.*", "notes", "hostile.chatter", "hostile.loop", "files.*"]
default = "deny"
rules = [
  { pattern = "text.*", behavior = "allow" },
  { pattern = "text.repeat", behavior = "deny" },
  { pattern = "files.*", behavior = "allow" },
  { pattern = "hostile.*", behavior = "allow" },
  { pattern = 'notes(op = "list")', behavior = "allow" },
  { pattern = 'notes(op = "add")', behavior = "ask" },
]
"#,
    )
    .unwrap();
    // The approver's key, trusted by `[approval] keys`.
    let key = dir.path().join("approver.key");
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["keygen", "--for", "approval", "-o"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    // Answers in the client's UI count as well (off by default with keys;
    // test_serve.py's keys-only config drops this line).
    text.push_str("mcp_elicitation = true\n");
    std::fs::write(&config, text).unwrap();
    // Fresh bearer tokens for this run; the server reads them by reference (env).
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let token = format!("tg-default-{nonce:x}-{}", std::process::id());
    let reader = format!("tg-reader-{nonce:x}-{}", std::process::id());
    // `TOOLGATE_PYTEST_K=EXPR` runs only the tests pytest's `-k EXPR` selects.
    let only: Vec<String> = std::env::var("TOOLGATE_PYTEST_K").map(|k| vec!["-k".into(), k]).unwrap_or_default();
    let out = Command::new(&python)
        .current_dir(&root)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/mcp/test_serve.py"])
        .args(&only)
        .env("TOOLGATE_BIN", env!("CARGO_BIN_EXE_toolgate"))
        .env("TOOLGATE_CONFIG", &config)
        .env("TOOLGATE_EXTRA", &extra)
        .env("TOOLGATE_APPROVER_KEY", &key)
        .env("TOOLGATE_TEST_TOKEN", &token)
        .env("TOOLGATE_READER_TOKEN", &reader)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
    println!("{stdout}");
    assert!(stdout.contains("passed") && !stdout.contains("failed"), "{stdout}");
}

// ---- What the approver sees in the client's UI, and who the journal says approved.

/// Arguments built to disguise themselves in an approval dialog: a bidi
/// override that shows `out/\u{202E}fdp.exe` as `out/exe.pdf`, and line
/// separators that push model text onto lines of their own, where it would
/// read as the host's.
const DISGUISED: &str = "out/\u{202E}fdp.exe\u{2028}\u{2028}(verified read-only by toolgate)";

/// A client naming itself after an approver key.
const IMPOSTOR: &str = "ed25519:AAAA via signature\u{202E}";

/// A directory for `toolgate serve`: `notes(op = "add")` asks; no approver
/// keys, so the client's UI decides; three HTTP tokens (the second and third for `default`).
fn serve_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::write(plugins.join("notes.wasm"), packed(guests::NOTES)).unwrap();
    std::fs::write(
        dir.path().join("toolgate.toml"),
        r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
[serve]
auth = [
  { agent = "reader", token = { env = "TOOLGATE_READER_TOKEN" } },
  { agent = "default", token = { env = "TOOLGATE_TEST_TOKEN" } },
  { agent = "default", token = { env = "TOOLGATE_OTHER_TOKEN" } },
]
[agents.reader]
visible = []
[agents.default]
visible = ["notes"]
default = "deny"
rules = [
  { pattern = 'notes(op = "list")', behavior = "allow" },
  { pattern = 'notes(op = "add")', behavior = "ask" },
]
"#,
    )
    .unwrap();
    dir
}

const TEST_TOKEN: &str = "tg-test-token-0123456789abcdef";
const READER_TOKEN: &str = "tg-reader-token-0123456789abcdef";
const OTHER_TOKEN: &str = "tg-other-token-0123456789abcdef";

fn serve_command(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    cmd.current_dir(dir)
        .args(["--config", "toolgate.toml", "serve"])
        .args(extra)
        .env("TOOLGATE_TEST_TOKEN", TEST_TOKEN)
        .env("TOOLGATE_READER_TOKEN", READER_TOKEN)
        .env("TOOLGATE_OTHER_TOKEN", OTHER_TOKEN);
    cmd
}

/// The approvals in the journal: (principal, channel) of each approved step.
fn approvals(dir: &std::path::Path) -> Vec<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir)
        .args(["--config", "toolgate.toml", "--json", "journal"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| {
            let a = v.get("approved_by")?.as_object()?.clone();
            Some((a["principal"].as_str()?.to_owned(), a["channel"].as_str()?.to_owned()))
        })
        .collect()
}

/// How many asks are pending in the journal of `dir`.
fn pending(dir: &std::path::Path) -> usize {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir)
        .args(["--config", "toolgate.toml", "--json", "journal", "--awaiting"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// What an approval dialog must show of `arguments` (the JSON text the
/// server received): every hidden character escaped, the arguments on one
/// line of their own, their byte length named — so no part of them can pass
/// for the host's words, and a client that cuts the text cannot hide that.
fn assert_undisguised(message: &str, arguments: &serde_json::Value) {
    for c in ['\u{202E}', '\u{2028}', '\u{2029}', '\u{85}', '\u{200B}', '\u{FEFF}', '\u{2066}'] {
        assert!(!message.contains(c), "{c:?} reaches the dialog: {message:?}");
    }
    assert!(message.contains("\\u{202e}") && message.contains("\\u{2028}"), "escaped, not dropped: {message}");
    let lines: Vec<&str> = message.split(['\n', '\r']).collect();
    let with_model_text: Vec<&&str> = lines.iter().filter(|l| l.contains("verified read-only")).collect();
    assert_eq!(with_model_text.len(), 1, "the arguments stay on one line: {message:?}");
    assert!(with_model_text[0].starts_with('{') && with_model_text[0].ends_with('}'), "{message:?}");
    assert!(with_model_text[0].contains("\"op\":\"add\""), "the whole arguments on that line: {message:?}");
    let bytes = arguments.to_string().len();
    assert!(message.contains(&format!("{bytes} bytes")), "the byte length ({bytes}) is named: {message}");
    assert!(message.contains("`notes`"), "{message}");
}

/// `toolgate serve` over stdio, line by line; lines arrive through a
/// channel so a silent server fails the test instead of hanging it.
struct Stdio {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Stdio {
    fn start(dir: &std::path::Path) -> Stdio {
        Stdio::spawn(serve_command(dir, &[]))
    }

    fn spawn(mut command: Command) -> Stdio {
        use std::io::BufRead as _;
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Stdio { child, stdin, lines }
    }

    fn send(&mut self, message: serde_json::Value) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    fn receive(&self) -> serde_json::Value {
        let line = self.lines.recv_timeout(std::time::Duration::from_secs(60)).expect("the server answers");
        serde_json::from_str(&line).unwrap()
    }

    fn finish(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Stdio {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An ask reaches the human through `elicitation/create` (2025-06-18 over
/// stdio): the dialog shows the arguments undisguised, and the journal
/// records the connection (stdio) as who approved — the name the client
/// gave itself only as an unverified note, escaped.
#[test]
fn the_approval_dialog_shows_disguised_arguments_escaped_and_the_journal_records_the_connection() {
    let dir = serve_dir();
    let mut s = Stdio::start(dir.path());
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}},
        "clientInfo": {"name": IMPOSTOR, "version": "1"}}}));
    assert!(s.receive()["result"]["protocolVersion"].is_string());
    s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let arguments = serde_json::json!({"op": "add", "note": DISGUISED});
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "notes", "arguments": arguments}}));
    let ask = loop {
        let m = s.receive();
        assert_ne!(m["id"], 2, "the call was asked about first: {m}");
        if m["method"] == "elicitation/create" {
            break m;
        }
    };
    let message = ask["params"]["message"].as_str().unwrap();
    assert_undisguised(message, &arguments);
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"confirm": true}}}));
    let done = loop {
        let m = s.receive();
        if m["id"] == 2 {
            break m;
        }
    };
    assert_eq!(done["result"]["isError"], false, "{done}");
    s.finish();

    let approvals = approvals(dir.path());
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    let (principal, channel) = &approvals[0];
    assert_eq!(channel, "mcp-elicitation");
    assert!(principal.starts_with("stdio "), "the connection, not the client's name: {principal}");
    assert!(principal.contains(r#"client says "ed25519:AAAA via signature\u{202e}", unverified"#), "{principal}");
    assert!(!principal.contains('\u{202E}'), "{principal:?}");
}

/// A minimal HTTP/1.1 POST (one request per connection); returns the
/// status and the JSON-RPC message of the body (plain JSON or the last SSE
/// `data:` event).
fn post(port: u16, token: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let headers = "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: notes\r\n";
    let (status, _, json) = post_with(port, token, headers, body);
    (status, json)
}

/// [`post`] with `headers` (each line ending in CRLF); also the response's head.
fn post_with(port: u16, token: &str, headers: &str, body: &serde_json::Value) -> (u16, String, serde_json::Value) {
    let (status, head, text) = post_raw(port, token, headers, body);
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| d.starts_with('{'))
        .last()
        .map_or(text.as_str(), |d| d)
        .to_owned();
    let json = if json.trim().is_empty() {
        serde_json::Value::Null
    } else if status >= 400 && !json.trim_start().starts_with('{') {
        // A refusal in plain text (rmcp's and ours).
        serde_json::Value::String(text.clone())
    } else {
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    (status, head, json)
}

/// [`post_with`]'s exchange: the status, the head and the body as sent
/// (an SSE stream's text, chunks joined).
fn post_raw(port: u16, token: &str, headers: &str, body: &serde_json::Value) -> (u16, String, String) {
    use std::io::{Read as _, Write as _};
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{headers}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let mut text = String::new();
    if chunked {
        let mut rest = rest;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            text.push_str(&after[..size]);
            rest = &after[size..].trim_start_matches("\r\n");
        }
    } else {
        text = rest.to_owned();
    }
    (status, head.to_owned(), text)
}

/// The SSE events of `text` with no data (a priming event: an id and a
/// retry, `data:` empty).
fn dataless_events(text: &str) -> Vec<String> {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter(|e| e.lines().any(|l| l.starts_with("id:") || l.starts_with("retry:") || l.starts_with("data:")))
        .filter(|e| e.lines().filter_map(|l| l.strip_prefix("data:")).all(|d| d.trim().is_empty()))
        .map(str::to_owned)
        .collect()
}

/// What a session's GET stream sends within `wait` (its raw bytes: chunk
/// sizes between the lines).
fn get_stream(port: u16, token: &str, session: &str, version: &str, wait: std::time::Duration) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\
         Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {version}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    let until = std::time::Instant::now() + wait;
    while std::time::Instant::now() < until {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&raw).into_owned()
}

/// The `Mcp-Session-Id` of a response's head.
fn session_of(head: &str) -> String {
    head.lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id")))
        .map(|(_, v)| v.trim().to_owned())
        .expect("a session")
}

// ---- Sessions abandoned without a DELETE, and the cap on a token's sessions.

/// A 2025-11-25 session of `token` as a client opens one: `initialize`, then
/// `notifications/initialized`; the status, and the session when opened
/// (else the refusal's JSON-RPC message).
fn open_session(port: u16, token: &str) -> (u16, Result<String, serde_json::Value>) {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "abandoner", "version": "1"}}});
    let (status, head, body) = post_with(port, token, "", &init);
    if status != 200 {
        return (status, Err(body));
    }
    let session = session_of(&head);
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _, body) = post_with(port, token, &in_session(&session), &initialized);
    assert_eq!(status, 202, "{body}");
    (200, Ok(session))
}

/// The headers of a request in `session` (2025-11-25).
fn in_session(session: &str) -> String {
    format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n")
}

/// `notes(op = "list")` (allowed) called in `session`: the status and the answer.
fn list_notes_in(port: u16, token: &str, session: &str) -> (u16, serde_json::Value) {
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "notes", "arguments": {"op": "list"}}});
    let (status, _, answer) = post_with(port, token, &in_session(session), &call);
    (status, answer)
}

/// The GET stream of `session`, held open (its head read) until dropped.
fn hold_stream(port: u16, token: &str, session: &str) -> std::net::TcpStream {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n{}\r\n",
        in_session(session)
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the GET stream's head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// A client that abandons its sessions — no DELETE, as the TypeScript
/// SDK's v1 transport (Claude Code, Claude Desktop, Cursor) does when it
/// closes — past `[serve] max_sessions_per_token` (here 2) still opens a
/// session and calls: the token's least recently used session with no
/// request or stream open is ended (404 to it from then on), never one
/// with a stream open, however recently the other was used. Only when
/// every session of the token has a stream open is a new one refused, 429
/// naming the setting; another token is unaffected. Before, the third
/// session was refused until `session_idle_secs` (30 minutes) after the
/// abandoned ones' last use: the 33rd connect of a stock client failed.
#[test]
fn sessions_abandoned_past_the_cap_make_room_and_only_busy_ones_refuse_a_new_one() {
    let dir = serve_dir();
    let config = dir.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace("[serve]\n", "[serve]\nmax_sessions_per_token = 2\n");
    std::fs::write(&config, text).unwrap();
    let (_server, port) = http_server(dir.path());
    // Five sessions opened and abandoned, each used once.
    let mut abandoned = Vec::new();
    for n in 0..5 {
        let (status, session) = open_session(port, TEST_TOKEN);
        let session = session.unwrap_or_else(|e| panic!("session {n}, past the cap of 2: {status} {e}"));
        let (status, answer) = list_notes_in(port, TEST_TOKEN, &session);
        assert_eq!((status, &answer["result"]["isError"]), (200, &serde_json::json!(false)), "{answer}");
        abandoned.push(session);
    }
    // The oldest are gone: their clients are told to initialize again.
    let (status, answer) = list_notes_in(port, TEST_TOKEN, &abandoned[0]);
    assert_eq!(status, 404, "an ended session: {answer}");

    // The older of the two live sessions listens on its GET stream: the
    // newer one, with nothing open, makes room instead.
    let [.., older, newer] = &abandoned[..] else { unreachable!() };
    let listening = hold_stream(port, TEST_TOKEN, older);
    let (status, fresh) = open_session(port, TEST_TOKEN);
    let fresh = fresh.unwrap_or_else(|e| panic!("a session next to a busy one: {status} {e}"));
    assert_eq!(list_notes_in(port, TEST_TOKEN, newer).0, 404, "the idle session was ended");
    let (status, answer) = list_notes_in(port, TEST_TOKEN, older);
    assert_eq!((status, &answer["result"]["isError"]), (200, &serde_json::json!(false)), "{answer}");

    // Every session busy: refused, naming the setting; another token opens its own.
    let also = hold_stream(port, TEST_TOKEN, &fresh);
    let (status, refused) = open_session(port, TEST_TOKEN);
    assert_eq!(status, 429, "{refused:?}");
    let refused = refused.unwrap_err();
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_sessions_per_token") && message.contains("serve.auth[1]"), "{refused}");
    let (status, theirs) = open_session(port, OTHER_TOKEN);
    let theirs = theirs.unwrap_or_else(|e| panic!("another token: {status} {e}"));
    assert_eq!(list_notes_in(port, OTHER_TOKEN, &theirs).0, 200);
    // The busy sessions are untouched.
    for session in [older, &fresh] {
        let (status, answer) = list_notes_in(port, TEST_TOKEN, session);
        assert_eq!((status, &answer["result"]["isError"]), (200, &serde_json::json!(false)), "{answer}");
    }
    drop((listening, also));
}

/// A request without a valid token is answered 401 with JSON-RPC code
/// -32600 and a message saying what to send. Before, the code was -32001,
/// which the Python and TypeScript SDKs name RequestTimeout: a bad token
/// read as a timeout.
#[test]
fn a_request_without_a_valid_token_is_not_reported_as_a_timeout() {
    let dir = serve_dir();
    let (_server, port) = http_server(dir.path());
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}});
    for token in ["", "not-the-token-0123456789abcdef"] {
        let (status, _, answer) = post_with(port, token, "", &init);
        assert_eq!(status, 401, "{answer}");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("Authorization: Bearer"), "{answer}");
    }
}

/// Sessions of 2024-11-05 and 2025-03-26 get no priming event — an SSE
/// event with an id, a retry and empty data (SEP-1699, 2025-11-25) — on
/// the initialize answer, a request's stream or the GET stream: the Java
/// and Go SDKs fail to initialize on one, older TypeScript clients report
/// `JSON.parse("")`. A 2025-11-25 session still gets it on its request
/// streams. Before, every session got one on each stream.
#[test]
fn sessions_before_2025_11_25_get_no_priming_event_over_http() {
    let dir = serve_dir();
    let (_server, port) = http_server(dir.path());
    for version in ["2024-11-05", "2025-03-26", "2025-11-25"] {
        let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}});
        let (status, head, text) = post_raw(port, TEST_TOKEN, "", &init);
        assert_eq!(status, 200, "{text}");
        assert!(text.contains(&format!("\"protocolVersion\":\"{version}\"")), "{text}");
        assert_eq!(dataless_events(&text), Vec::<String>::new(), "{version}: the initialize answer: {text}");
        let session = session_of(&head);
        let headers = format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {version}\r\n");
        let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post_raw(port, TEST_TOKEN, &headers, &initialized);
        let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
        let (status, _, text) = post_raw(port, TEST_TOKEN, &headers, &list);
        assert!(status == 200 && text.contains("\"notes\""), "{text}");
        let primed = !dataless_events(&text).is_empty();
        assert_eq!(primed, version == "2025-11-25", "{version}: a request's stream: {text}");
        let stream = get_stream(port, TEST_TOKEN, &session, version, std::time::Duration::from_millis(700));
        assert!(stream.starts_with("HTTP/1.1 200"), "{stream}");
        if version != "2025-11-25" {
            let body = stream.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            assert!(
                !body.lines().any(|l| l.starts_with("retry:") || l.trim() == "data:"),
                "{version}: the GET stream: {stream}"
            );
        }
    }
}

/// `toolgate serve --http` in `dir` on a free port: killed when dropped.
struct HttpServer(std::process::Child);

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http_server(dir: &std::path::Path) -> (HttpServer, u16) {
    http_server_of(serve_command(dir, &["--http", "127.0.0.1:0"]))
}

fn http_server_of(mut command: Command) -> (HttpServer, u16) {
    use std::io::BufRead as _;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let server = HttpServer(child);
    let port: u16 = loop {
        let line = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the server starts");
        if let Some(url) = line.split("serving MCP on http://").nth(1) {
            break url.split(['/', ':']).nth(1).unwrap().parse().unwrap();
        }
    };
    (server, port)
}

/// Two tokens bound to one agent are two askers (2026-07-28, stateless): the
/// second's identical call is its own request, not the first's, and the
/// first's sealed request state answers nothing for the second.
#[test]
fn another_token_of_the_same_agent_can_neither_find_nor_answer_an_ask() {
    let dir = serve_dir();
    let (_server, port) = http_server(dir.path());
    let meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "client", "version": "1"},
    });
    let call = |id: u64, extra: serde_json::Value| {
        let mut params =
            serde_json::json!({"name": "notes", "arguments": {"op": "add", "note": "theirs"}, "_meta": meta});
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    let asked = |token| {
        let (status, r) = post(port, token, &call(1, serde_json::json!({})));
        assert_eq!((status, &r["result"]["resultType"]), (200, &serde_json::json!("input_required")), "{r}");
        r["result"]["requestState"].as_str().unwrap().to_owned()
    };
    let first = asked(TEST_TOKEN);
    let _second = asked(OTHER_TOKEN);
    let pending = pending(dir.path());
    assert_eq!(pending, 2, "each token's call is its own pending request");
    // The other token presents the first token's sealed state with an answer.
    let answer = serde_json::json!({
        "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": true}}},
        "requestState": first,
    });
    let (_, r) = post(port, OTHER_TOKEN, &call(2, answer));
    let refused = r["error"]["message"].as_str().unwrap_or_default();
    assert!(refused.contains("request state was refused"), "{r}");
    assert!(approvals(dir.path()).is_empty(), "nothing was approved");
    // The runs' ids tell the tokens apart by a keyed tag: no plain digest of
    // a token is in the journal to test guesses against.
    use sha2::Digest as _;
    let journal = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir.path())
        .args(["--config", "toolgate.toml", "--json", "journal"])
        .output()
        .unwrap();
    let journal = String::from_utf8_lossy(&journal.stdout).into_owned();
    assert!(journal.contains("\"req-"), "{journal}");
    for token in [TEST_TOKEN, OTHER_TOKEN] {
        let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
        for plain in [digest.clone(), hex::encode(sha2::Sha256::digest(digest.as_bytes()))] {
            assert!(!journal.contains(&plain[..16]), "{journal}");
        }
    }
}

/// A request inside a session is the session's, whatever revision its
/// `_meta` claims: its ask is the conversation's, never found by a
/// stateless request of the same token.
#[test]
fn a_session_request_claiming_the_stateless_revision_keeps_its_ask_in_the_session() {
    let dir = serve_dir();
    let (_server, port) = http_server(dir.path());
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "client", "version": "1"},
    }});
    let (status, head, r) = post_with(port, TEST_TOKEN, "", &init);
    assert_eq!(status, 200, "{r}");
    let session = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id")))
        .map(|(_, v)| v.trim().to_owned())
        .expect("a session");
    let in_session = format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n");
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post_with(port, TEST_TOKEN, &in_session, &initialized);
    let call = |id: u64, meta: serde_json::Value| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "notes", "arguments": {"op": "add", "note": "ours"}, "_meta": meta}})
    };
    let modern = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    // No elicitation declared on this call: the ask stays pending, named.
    let claiming = format!(
        "Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: notes\r\n"
    );
    let (_, _, asked) = post_with(port, TEST_TOKEN, &claiming, &call(2, modern.clone()));
    assert!(asked.to_string().contains("needs human approval"), "{asked}");
    // A stateless request of the same token, the identical call: its own request.
    let (status, stateless) = post(port, TEST_TOKEN, &call(3, modern));
    assert_eq!(status, 200, "{stateless}");
    let pending = pending(dir.path());
    assert_eq!(pending, 2, "the session's ask is not a stateless one: {stateless}");
}

/// The same over Streamable HTTP, stateless (2026-07-28): the ask comes as
/// an input request, the retry carries the answer; the journal records the
/// `[[serve.auth]]` entry whose token the retry presented, never the token,
/// and the client's self-given name only as an unverified note.
#[test]
fn over_http_the_journal_records_the_token_entry_that_approved_and_the_dialog_is_undisguised() {
    let dir = serve_dir();
    let (_server, port) = http_server(dir.path());
    let meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": IMPOSTOR, "version": "1"},
    });
    let arguments = serde_json::json!({"op": "add", "note": DISGUISED});
    let call = |id: u64, extra: serde_json::Value| {
        let mut params = serde_json::json!({"name": "notes", "arguments": arguments, "_meta": meta});
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    let (status, asked) = post(port, TEST_TOKEN, &call(1, serde_json::json!({})));
    assert_eq!(status, 200, "{asked}");
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let message = result["inputRequests"]["confirm"]["params"]["message"].as_str().unwrap();
    assert_undisguised(message, &arguments);
    let state = result["requestState"].as_str().unwrap().to_owned();
    let answer = serde_json::json!({
        "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": true}}},
        "requestState": state,
    });
    let (status, done) = post(port, TEST_TOKEN, &call(2, answer));
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");

    let approvals = approvals(dir.path());
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    let (principal, channel) = &approvals[0];
    assert_eq!(channel, "mcp-elicitation");
    assert!(principal.starts_with("http token serve.auth[1] "), "the authenticated token's entry: {principal}");
    assert!(principal.contains(r#"client says "ed25519:AAAA via signature\u{202e}", unverified"#), "{principal}");
    assert!(!principal.contains(TEST_TOKEN) && !principal.contains('\u{202E}'), "{principal:?}");
}

/// Over stdio, initialized with `capabilities`; the call `notes add` sent as request 2.
fn asked_over_stdio(dir: &std::path::Path, capabilities: serde_json::Value) -> Stdio {
    let mut s = Stdio::start(dir);
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities,
        "clientInfo": {"name": "test", "version": "1"}}}));
    assert!(s.receive()["result"]["protocolVersion"].is_string());
    s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "notes", "arguments": {"op": "add", "note": "n"}}}));
    s
}

/// The next message that is not a ping from the server (answered).
fn next_from_server(s: &mut Stdio) -> serde_json::Value {
    loop {
        let m = s.receive();
        if m["method"] == "ping" {
            s.send(serde_json::json!({"jsonrpc": "2.0", "id": m["id"], "result": {}}));
            continue;
        }
        return m;
    }
}

/// A client that declared only URL-mode elicitation cannot show the form
/// an approval is: it is never sent one (2025-11-25: servers MUST NOT send
/// a mode the client did not declare), and the request stays pending for an
/// approver — before, the form went out, the client refused it, and the
/// refusal denied the ticket in the human's name.
#[test]
fn a_client_that_declared_only_url_elicitation_is_not_sent_a_form_and_the_ask_stays_pending() {
    let dir = serve_dir();
    let mut s = asked_over_stdio(dir.path(), serde_json::json!({"elicitation": {"url": {}}}));
    let m = next_from_server(&mut s);
    assert_eq!(m["id"], 2, "no elicitation was sent first: {m}");
    assert_eq!(m["result"]["isError"], true, "{m}");
    let text = m["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("cannot ask") && !text.contains("tkt-"), "{text}");
    s.finish();
    assert_eq!(pending(dir.path()), 1, "the ask stays pending for an approver");
}

/// Only the human's answer decides. A call the client withdrew while the
/// human read (`notifications/cancelled`, as SDKs send at their request
/// timeout) is not run by an answer that arrives afterwards, and an ask the
/// client could not show (an error instead of an answer) denies nothing:
/// both leave the request pending for an approver, and the same call asks again.
#[test]
fn a_withdrawn_or_failed_ask_decides_nothing_and_the_request_stays_pending() {
    let dir = serve_dir();
    let mut s = asked_over_stdio(dir.path(), serde_json::json!({"elicitation": {}}));
    let ask = next_from_server(&mut s);
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "timed out"}}));
    // Synchronise: the server has read the cancellation when it answers this.
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}));
    loop {
        let m = next_from_server(&mut s);
        if m["id"] == 3 {
            break;
        }
    }
    // The human accepts after the call was withdrawn.
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"confirm": true}}}));
    // The same call again: the pending request is asked anew; the client fails to show it.
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "notes", "arguments": {"op": "add", "note": "n"}}}));
    let again = loop {
        let m = next_from_server(&mut s);
        if m["method"] == "elicitation/create" {
            break m;
        }
        assert_ne!(m["id"], 4, "asked again before answering: {m}");
    };
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": again["id"],
        "error": {"code": -32602, "message": "Client does not support form-mode elicitation requests"}}));
    let done = loop {
        let m = next_from_server(&mut s);
        if m["id"] == 4 {
            break m;
        }
    };
    assert_eq!(done["result"]["isError"], true, "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("stays pending") && !text.contains("tkt-"), "{text}");
    s.finish();
    assert!(approvals(dir.path()).is_empty(), "nothing was approved: {:?}", approvals(dir.path()));
    assert_eq!(pending(dir.path()), 1, "one request, still pending");
}

/// A client that never finishes its request's headers (nothing sent, or a
/// byte now and then: slowloris) is disconnected at `[serve]
/// header_timeout_ms` — before, it held a task and a descriptor for as
/// long as it liked, before authentication could refuse it.
#[test]
fn a_connection_that_does_not_finish_its_headers_is_closed() {
    use std::io::{Read as _, Write as _};
    let dir = serve_dir();
    let toml = dir.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&toml).unwrap().replace("[serve]\n", "[serve]\nheader_timeout_ms = 300\n");
    std::fs::write(&toml, text).unwrap();
    let (_server, port) = http_server(dir.path());
    let started = std::time::Instant::now();
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    for part in ["POST /mcp HTTP/1.1\r\n", "Host: 127.0.0.1\r\n", "X-Slow: 1\r\n"] {
        slow.write_all(part.as_bytes()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    let mut rest = Vec::new();
    let closed = match slow.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "the server kept the connection open for {:?}", started.elapsed());
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    // The server goes on serving whoever sends a request.
    let mut ok = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    ok.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A browser page of an origin in `[serve] allowed_origins` can call: its
/// preflight (`OPTIONS`, which carries no token) is answered with what it
/// may send, and the response lets it read `Mcp-Session-Id`. Before, the
/// preflight got 401 and no response allowed the origin: the setting could
/// not work. Another origin is allowed nothing.
#[test]
fn a_browser_page_of_an_allowed_origin_passes_its_preflight_and_reads_the_session() {
    use std::io::{Read as _, Write as _};
    let dir = serve_dir();
    let toml = dir.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&toml)
        .unwrap()
        .replace("[serve]\n", "[serve]\nallowed_origins = [\"http://app.example\"]\n");
    std::fs::write(&toml, text).unwrap();
    let (_server, port) = http_server(dir.path());
    let exchange = |request: String| {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer.to_ascii_lowercase()
    };
    let preflight = |origin: &str| {
        exchange(format!(
            "OPTIONS /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
             Access-Control-Request-Headers: authorization, content-type, mcp-protocol-version, mcp-method, mcp-name, \
             mcp-param-region\r\nConnection: close\r\n\r\n"
        ))
    };
    let allowed = preflight("http://app.example");
    assert!(allowed.starts_with("http/1.1 200"), "{allowed}");
    assert!(allowed.contains("access-control-allow-origin: http://app.example"), "{allowed}");
    // The 2026-07-28 request headers too: `Mcp-Method` and `Mcp-Name` on
    // every request of the TypeScript client 2.4, `Mcp-Param-*` per marked
    // parameter. Before, the preflight left them out and the browser sent nothing.
    let allow = allowed.lines().find(|l| l.starts_with("access-control-allow-headers:")).unwrap_or_default();
    for h in ["mcp-protocol-version", "authorization", "mcp-method", "mcp-name", "mcp-param-region"] {
        assert!(allow.contains(h), "{h}: {allowed}");
    }
    let foreign = preflight("http://evil.example");
    assert!(!foreign.contains("access-control-allow-origin"), "{foreign}");

    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}})
    .to_string();
    let answer = exchange(format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://app.example\r\nAuthorization: Bearer {TEST_TOKEN}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    ));
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    assert!(answer.contains("access-control-allow-origin: http://app.example"), "{answer}");
    let exposed = answer.lines().find(|l| l.starts_with("access-control-expose-headers:")).unwrap_or_default();
    assert!(exposed.contains("mcp-session-id"), "{answer}");
}

/// Clients of 2024-11-05 and 2025-03-26 (mcp-remote, LangChain's MCP
/// adapters, the Go and Java SDKs of that time) get the revision they ask
/// for, list and call; an ask is never sent to them as an elicitation (their
/// revisions have none, whatever they declare): they are answered as clients
/// that cannot ask, the request pending and no ticket shown. Before, they
/// got 2025-11-25 back and disconnected.
#[test]
fn clients_of_the_2024_and_early_2025_revisions_are_served_their_revision() {
    let dir = serve_dir();
    for version in ["2024-11-05", "2025-03-26"] {
        let mut s = Stdio::start(dir.path());
        // As the Python SDK's 1.x line sends it: elicitation declared whatever the revision.
        s.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "old", "version": "1"}}}));
        let init = s.receive();
        assert_eq!(init["result"]["protocolVersion"], version, "{init}");
        s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
        let listed = next_from_server(&mut s);
        assert_eq!(listed["id"], 2, "{listed}");
        assert_eq!(listed["result"]["tools"][0]["name"], "notes", "{listed}");
        s.send(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "notes", "arguments": {"op": "list"}}}));
        let called = next_from_server(&mut s);
        assert_eq!(called["id"], 3, "{called}");
        assert_eq!(called["result"]["isError"], false, "{called}");
        s.send(serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "notes", "arguments": {"op": "add", "note": version}}}));
        let asked = next_from_server(&mut s);
        assert_eq!(asked["id"], 4, "no elicitation was sent first: {asked}");
        let text = asked["result"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(asked["result"]["isError"] == true && text.contains("cannot ask") && !text.contains("tkt-"), "{asked}");
        s.finish();
    }
    assert_eq!(pending(dir.path()), 2, "each ask stays pending for an approver");
}

/// An HTTP session of a 2025-03-26 client (before, refused as that revision
/// was not offered) is served, its requests naming the revision; a request
/// naming one the server does not offer gets 400 (the transport: an
/// unsupported `MCP-Protocol-Version` MUST be refused), also when its
/// `_meta` claims the same. (A revision rmcp knows but the server does not
/// offer is refused in the middleware: `http::tests`.)
#[test]
fn a_session_request_naming_a_revision_not_offered_is_400() {
    let dir = serve_dir();
    let (_server, port) = http_server(dir.path());
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}});
    let (status, head, r) = post_with(port, TEST_TOKEN, "", &init);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["protocolVersion"], "2025-03-26", "{r}");
    let session = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id")))
        .map(|(_, v)| v.trim().to_owned())
        .expect("a session");
    let list = |version: &str, meta: bool| {
        let mut body = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
        if meta {
            body["params"]["_meta"] = serde_json::json!({"io.modelcontextprotocol/protocolVersion": version});
        }
        // With the headers a revision after 2026-07-28 would require.
        let headers =
            format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {version}\r\nMcp-Method: tools/list\r\n");
        post_with(port, TEST_TOKEN, &headers, &body)
    };
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post_with(port, TEST_TOKEN, &format!("Mcp-Session-Id: {session}\r\n"), &initialized);
    for meta in [false, true] {
        let (status, _, r) = list("2099-01-01", meta);
        assert_eq!(status, 400, "with _meta: {meta}: {r}");
    }
    let (status, _, r) = list("2025-03-26", false);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["tools"][0]["name"], "notes", "{r}");
}

// ---- Shutdown: calls in flight get `[serve] grace_ms` to finish.

/// A tracker API on 127.0.0.1 that answers every request `[]` after
/// `delay`, saying on the channel when one came in.
fn slow_tracker(delay: std::time::Duration) -> (u16, std::sync::mpsc::Receiver<()>) {
    use std::io::{BufRead as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (arrived, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let arrived = arrived.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    line.clear();
                }
                let _ = arrived.send(());
                std::thread::sleep(delay);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n[]",
                );
            });
        }
    });
    (port, rx)
}

/// A directory whose `tracker.issues` calls the tracker on `port`, allowed,
/// with a grace of 5 s at shutdown.
fn slow_call_dir(port: u16) -> tempfile::TempDir {
    slow_call_dir_with_grace(port, 5000)
}

/// [`slow_call_dir`] with a grace of `grace_ms` at shutdown.
fn slow_call_dir_with_grace(port: u16, grace_ms: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins/tracker.wasm"), packed(guests::TRACKER)).unwrap();
    std::fs::write(
        dir.path().join("toolgate.toml"),
        format!(
            r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
[serve]
grace_ms = {grace_ms}
auth = [{{ agent = "default", token = {{ env = "TOOLGATE_TEST_TOKEN" }} }}]
[credentials.tracker]
source = {{ env = "TOOLGATE_TRACKER_TOKEN" }}
destinations = ["http://127.0.0.1:{port}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}
[[grants]]
tools = "tracker.*"
hosts = ["http://127.0.0.1:{port}"]
credentials = ["tracker"]
[agents.default]
visible = ["tracker.*"]
default = "deny"
rules = [{{ pattern = "tracker.*", behavior = "allow" }}]
"#
        ),
    )
    .unwrap();
    dir
}

fn slow_serve_command(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut command = serve_command(dir, extra);
    command.env("TOOLGATE_TRACKER_TOKEN", "tg-tracker-token-0123456789abcdef");
    command
}

fn terminate(child: &std::process::Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// The exit status of `child`, which must end within a minute.
fn exited(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "the server did not exit within a minute of SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The outcomes the journal of `dir` records for `tool`.
fn outcomes(dir: &std::path::Path, tool: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir)
        .args(["--config", "toolgate.toml", "--json", "journal"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["tool"] == tool)
        .map(|v| v["outcome"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn tracker_call(id: u64, port: u16, meta: Option<&serde_json::Value>) -> serde_json::Value {
    let mut params =
        serde_json::json!({"name": "tracker.issues", "arguments": {"base_url": format!("http://127.0.0.1:{port}")}});
    if let Some(meta) = meta {
        params["_meta"] = meta.clone();
    }
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// SIGTERM over stdio while a call that ends within `[serve] grace_ms` is
/// running: the client gets the call's result and the journal records its
/// output, and the server exits 0. Before, the signal cancelled rmcp's
/// token first — and with it every call in flight, at once: the call was
/// journaled `cancelled` and its client got nothing.
#[test]
fn sigterm_over_stdio_lets_a_call_in_flight_finish_within_the_grace() {
    let (port, arrived) = slow_tracker(std::time::Duration::from_millis(1000));
    let dir = slow_call_dir(port);
    let mut s = Stdio::spawn(slow_serve_command(dir.path(), &[]));
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
    assert!(s.receive()["result"]["protocolVersion"].is_string());
    s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    s.send(tracker_call(2, port, None));
    arrived.recv_timeout(std::time::Duration::from_secs(60)).expect("the call reached the tracker");
    terminate(&s.child);
    let done = next_from_server(&mut s);
    assert_eq!(done["id"], 2, "{done}");
    assert_eq!(done["result"]["isError"], false, "the call's own result: {done}");
    assert_eq!(done["result"]["content"][0]["text"], "[]", "{done}");
    assert!(exited(&mut s.child).success());
    assert_eq!(outcomes(dir.path(), "tracker.issues"), ["output"]);
}

/// Stdin closing (a stdio client's way to end the session) while a call
/// that needs longer than the 5 s rmcp gives its handlers once its input
/// ends, but less than `[serve] grace_ms`, is running: the client still gets
/// the call's result, the journal records its output, the server exits 0.
/// Before, rmcp cancelled the call after 5 s whatever the grace: journaled
/// `cancelled`, and the client got nothing.
#[test]
fn stdin_closing_lets_a_call_in_flight_finish_within_the_grace() {
    let (port, arrived) = slow_tracker(std::time::Duration::from_millis(6500));
    let dir = slow_call_dir_with_grace(port, 10_000);
    let mut s = Stdio::spawn(slow_serve_command(dir.path(), &[]));
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
    assert!(s.receive()["result"]["protocolVersion"].is_string());
    s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    s.send(tracker_call(2, port, None));
    arrived.recv_timeout(std::time::Duration::from_secs(60)).expect("the call reached the tracker");
    drop(s.stdin.take());
    let done = s.receive();
    assert_eq!(done["id"], 2, "{done}");
    assert_eq!(done["result"]["isError"], false, "the call's own result: {done}");
    assert_eq!(done["result"]["content"][0]["text"], "[]", "{done}");
    assert!(exited(&mut s.child).success());
    assert_eq!(outcomes(dir.path(), "tracker.issues"), ["output"]);
}

/// The same over HTTP, for a call in a session (its result on the POST's
/// SSE stream) and a stateless 2026-07-28 one, both in flight at SIGTERM:
/// each client gets its call's result, the journal records both outputs,
/// the server exits 0. Before, rmcp's own token was cancelled first: its
/// sessions and streams ended and both calls were cancelled.
///
/// It failed about one run in four while a stateless POST was counted only
/// once it had a response: between the call's end and rmcp handing its
/// result to the POST, the stopping server saw nothing left to write and
/// cancelled rmcp, and the client got "no response message received from
/// handler".
#[test]
fn sigterm_over_http_lets_calls_in_flight_finish_within_the_grace() {
    let (port, arrived) = slow_tracker(std::time::Duration::from_millis(1000));
    let dir = slow_call_dir(port);
    let (mut server, mcp) = http_server_of(slow_serve_command(dir.path(), &["--http", "127.0.0.1:0"]));
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    let (status, head, r) = post_with(mcp, TEST_TOKEN, "", &init);
    assert_eq!(status, 200, "{r}");
    let session = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id")))
        .map(|(_, v)| v.trim().to_owned())
        .expect("a session");
    let in_session = format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n");
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post_with(mcp, TEST_TOKEN, &in_session, &initialized);
    let meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
    });
    let stateless = "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: tracker.issues\r\n";
    let calls = [
        std::thread::spawn(move || post_with(mcp, TEST_TOKEN, &in_session, &tracker_call(2, port, None))),
        std::thread::spawn(move || post_with(mcp, TEST_TOKEN, stateless, &tracker_call(3, port, Some(&meta)))),
    ];
    for _ in &calls {
        arrived.recv_timeout(std::time::Duration::from_secs(60)).expect("the calls reached the tracker");
    }
    terminate(&server.0);
    for call in calls {
        let (status, _, done) = call.join().unwrap();
        assert_eq!(status, 200, "{done}");
        assert_eq!(done["result"]["isError"], false, "the call's own result: {done}");
        assert_eq!(done["result"]["content"][0]["text"], "[]", "{done}");
    }
    assert!(exited(&mut server.0).success());
    assert_eq!(outcomes(dir.path(), "tracker.issues"), ["output", "output"]);
}

// ---- No message over `serve::MAX_MESSAGE_BYTES`: a large catalog is listed in pages.

/// The bound on one message serve sends (`serve::MAX_MESSAGE_BYTES`).
const MAX_MESSAGE_BYTES: usize = 1_000_000;

/// A directory whose catalog lists past one message: two imported MCP
/// servers of 100 tools each, every description 7,000 bytes (1.4 MB listed).
/// A tool whose schema mirrors an argument into a header (`x-mcp-header`,
/// MCP 2026-07-28): a request whose `Mcp-Param-*` header says otherwise than
/// its arguments is refused before anything runs — a gateway in front of the
/// server routes or authorizes on that header. Fails on the previous code
/// (rmcp skipped the check: serve gave it no tool schemas, and the call
/// went to the gate with other values than the header named).
#[test]
fn a_param_header_that_differs_from_the_arguments_is_refused() {
    use toolgate_sdk::mcp::{AdapterConfig, PinnedTool, tool_id};
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let pinned = AdapterConfig {
        url: "http://127.0.0.1:9/mcp".into(),
        server: "geo".into(),
        credential: None,
        tools: vec![PinnedTool {
            name: "route".into(),
            id: tool_id("geo", "route"),
            description: Some("Route a request to a region.".into()),
            input_schema: serde_json::json!({"type": "object",
                "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}),
            output_schema: None,
            annotations: Default::default(),
        }],
        verify_every_secs: 60,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (packed, _) = rt.block_on(toolgate_author::mcp_import::assemble(&pinned)).unwrap();
    std::fs::write(dir.path().join("plugins/geo.wasm"), packed).unwrap();
    std::fs::write(
        dir.path().join("toolgate.toml"),
        "plugins = \"plugins\"\nstore = \"journal.db\"\ncache = \"cache\"\n[serve]\n\
         auth = [{ agent = \"default\", token = { env = \"TOOLGATE_TEST_TOKEN\" } }]\n\
         [[grants]]\ntools = \"mcp__*\"\nhosts = [\"http://127.0.0.1:9\"]\n\
         [agents.default]\nvisible = [\"mcp__*\"]\ndefault = \"deny\"\n",
    )
    .unwrap();
    let (_server, port) = http_server(dir.path());
    let meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "client", "version": "1"},
    });
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "mcp__geo__route", "arguments": {"region": "us"}, "_meta": meta}});
    let headers = |region: &str| {
        format!(
            "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: mcp__geo__route\r\n\
             Mcp-Param-Region: {region}\r\n"
        )
    };
    let (status, _, refused) = post_with(port, TEST_TOKEN, &headers("eu"), &call);
    assert_eq!(status, 400, "{refused}");
    let why = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("Mcp-Param-Region") || why.contains("Region"), "{refused}");
    assert_eq!(journal_steps(dir.path()), 0, "nothing reached the gate");
    // The header as the arguments say: the call goes on (to the gate, which denies it).
    let (status, _, r) = post_with(port, TEST_TOKEN, &headers("us"), &call);
    assert_eq!(status, 200, "{r}");
    assert!(r["result"].is_object(), "{r}");
    assert_eq!(journal_steps(dir.path()), 1);
}

/// Steps in the journal of a serve directory (`toolgate journal --json`).
fn journal_steps(dir: &std::path::Path) -> usize {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir)
        .args(["--config", "toolgate.toml", "--json", "journal"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().filter(|l| l.trim_start().starts_with('{')).count()
}

fn large_catalog_dir() -> tempfile::TempDir {
    use toolgate_sdk::mcp::{AdapterConfig, PinnedTool, tool_id};
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for server in ["bigone", "bigtwo"] {
        let tools = (0..100)
            .map(|i| PinnedTool {
                name: format!("t{i:03}"),
                id: tool_id(server, &format!("t{i:03}")),
                description: Some(format!("{server} {i}: {}", "x".repeat(7_000))),
                input_schema: serde_json::json!({"type": "object"}),
                output_schema: None,
                annotations: Default::default(),
            })
            .collect();
        let pinned = AdapterConfig {
            url: "http://127.0.0.1:9/mcp".into(),
            server: server.into(),
            credential: None,
            tools,
            verify_every_secs: 60,
        };
        let (packed, _) = rt.block_on(toolgate_author::mcp_import::assemble(&pinned)).unwrap();
        std::fs::write(dir.path().join(format!("plugins/{server}.wasm")), packed).unwrap();
    }
    std::fs::write(
        dir.path().join("toolgate.toml"),
        r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
[serve]
auth = [{ agent = "default", token = { env = "TOOLGATE_TEST_TOKEN" } }]
[[grants]]
tools = "mcp__*"
hosts = ["http://127.0.0.1:9"]
[agents.default]
visible = ["mcp__*"]
default = "deny"
"#,
    )
    .unwrap();
    dir
}

/// A `tools/list` that would be 1.4 MB — past the 1 MiB the Python SDK's
/// HTTP client takes in one SSE event by default — is paged by size: every
/// page (as sent over stdio, and as an SSE event over HTTP) within the
/// bound, together the whole list in order; a cursor the server did not
/// make, or one from before a reload, is refused with -32602. Before, the
/// list went out whole, in one message of 1.4 MB, with no cursor.
#[test]
fn a_tool_list_past_one_message_is_paged_by_size() {
    let dir = large_catalog_dir();
    let mut s = Stdio::start(dir.path());
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pager", "version": "1"}}}));
    assert_eq!(s.receive()["id"], 1);
    s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let (mut names, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let mut request = serde_json::json!({"jsonrpc": "2.0", "id": 10 + pages, "method": "tools/list"});
        if let Some(c) = &cursor {
            request["params"] = serde_json::json!({"cursor": c});
        }
        s.send(request);
        let line = s.lines.recv_timeout(std::time::Duration::from_secs(60)).expect("the server answers");
        assert!(line.len() <= MAX_MESSAGE_BYTES, "a page of {} bytes", line.len());
        let page: serde_json::Value = serde_json::from_str(&line).unwrap();
        let tools = page["result"]["tools"].as_array().unwrap_or_else(|| panic!("{}", &line[..line.len().min(500)]));
        names.extend(tools.iter().map(|t| t["name"].as_str().unwrap_or_default().to_owned()));
        pages += 1;
        match page["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 10, "pages without end");
    }
    let mut expected: Vec<String> =
        ["bigone", "bigtwo"].iter().flat_map(|s| (0..100).map(move |i| format!("mcp__{s}__t{i:03}"))).collect();
    expected.sort();
    assert!(pages >= 2, "one message of the whole list: {} tools", names.len());
    assert_eq!(names, expected);
    // A cursor this server did not make.
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 30, "method": "tools/list", "params": {"cursor": "tools.0.x"}}));
    let refused = s.receive();
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    // The first page's cursor, after a reload (a plugin removed).
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 31, "method": "tools/list"}));
    let first = s.receive();
    let next = first["result"]["nextCursor"].as_str().unwrap().to_owned();
    std::fs::remove_file(dir.path().join("plugins/bigtwo.wasm")).unwrap();
    let changed = s.receive();
    assert_eq!(changed["method"], "notifications/tools/list_changed", "{changed}");
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 32, "method": "tools/list", "params": {"cursor": next}}));
    let stale = s.receive();
    assert_eq!(stale["error"]["code"], -32602, "{stale}");
    assert!(stale["error"]["message"].as_str().unwrap_or_default().contains("from the start"), "{stale}");
    s.finish();
    // Over HTTP: the first page is one SSE event within the bound.
    let dir = large_catalog_dir();
    let (_server, port) = http_server(dir.path());
    let (status, session) = open_session(port, TEST_TOKEN);
    let session = session.unwrap_or_else(|e| panic!("{status} {e}"));
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, _, body) = post_raw(port, TEST_TOKEN, &in_session(&session), &list);
    assert_eq!(status, 200);
    let data: Vec<&str> =
        body.lines().filter_map(|l| l.strip_prefix("data:")).filter(|d| !d.trim().is_empty()).collect();
    assert_eq!(data.len(), 1, "one event");
    assert!(data[0].len() <= MAX_MESSAGE_BYTES, "an event of {} bytes", data[0].len());
    assert!(data[0].contains("\"nextCursor\""));
}

/// A JSON-RPC batch over stdio — which 2025-03-26 clients may send — is
/// answered request by request: each id in it gets an error of its own
/// saying batches are not taken and to send each request on its own, and
/// the session goes on. Before, rmcp answered the whole array with one
/// error of id `null`: no request in it was answered, and its client
/// waited for ever.
#[test]
fn a_batch_over_stdio_gets_an_error_for_each_request_in_it() {
    let dir = serve_dir();
    let mut s = Stdio::start(dir.path());
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "batcher", "version": "1"}}}));
    assert_eq!(s.receive()["result"]["protocolVersion"], "2025-03-26");
    s.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    s.send(serde_json::json!([
        {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}},
        {"jsonrpc": "2.0", "id": "six", "method": "tools/call", "params": {"name": "notes", "arguments": {"op": "list"}}},
    ]));
    let mut answered = Vec::new();
    for _ in 0..2 {
        let e = s.receive();
        assert_eq!(e["error"]["code"], -32600, "{e}");
        let message = e["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("batch") && message.contains("each request as a message of its own"), "{e}");
        answered.push(e["id"].clone());
    }
    assert_eq!(answered, [serde_json::json!(5), serde_json::json!("six")]);
    // Nothing of the batch ran; the session goes on.
    s.send(serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}));
    let listed = s.receive();
    assert_eq!((listed["id"].clone(), listed["result"]["tools"][0]["name"].clone()), (7.into(), "notes".into()));
    s.finish();
    assert_eq!(outcomes(dir.path(), "notes"), Vec::<String>::new());
}
