//! `toolgate serve --http`: what one client — with a token or without —
//! can hold of the connections every agent shares (`[serve]
//! max_connections_per_address`, `max_sessions_per_token`,
//! `max_requests_per_token`; a connection kept only after an authenticated
//! request).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use toolgate_tests::{guests, packed};

const TOKEN: &str = "tg-limits-token-0123456789abcdef";
const OTHER: &str = "tg-limits-other-0123456789abcdef";

/// A served directory: `notes(op = "list")` allowed for two tokens of one
/// agent, with `serve` (lines of `[serve]`) added.
fn serve_dir(serve: &str) -> tempfile::TempDir {
    served(serve, false)
}

/// [`serve_dir`] with `hostile.sleep` (a call that waits far past its
/// deadline, here 60 s) visible and allowed too.
fn serve_dir_sleeping(serve: &str) -> tempfile::TempDir {
    served(serve, true)
}

fn served(serve: &str, sleeping: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::write(plugins.join("notes.wasm"), packed(guests::NOTES)).unwrap();
    let (visible, rules, limits) = if sleeping {
        std::fs::write(plugins.join("hostile.wasm"), packed(guests::HOSTILE)).unwrap();
        (
            r#"["notes", "hostile.sleep"]"#,
            r#"[{ pattern = 'notes(op = "list")', behavior = "allow" }, { pattern = "hostile.sleep", behavior = "allow" }]"#,
            "[limits]\ntimeout_ms = 60000\n",
        )
    } else {
        (r#"["notes"]"#, r#"[{ pattern = 'notes(op = "list")', behavior = "allow" }]"#, "")
    };
    std::fs::write(
        dir.path().join("toolgate.toml"),
        format!(
            r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
{limits}
[serve]
{serve}
auth = [
  {{ agent = "default", token = {{ env = "TOOLGATE_TEST_TOKEN" }} }},
  {{ agent = "default", token = {{ env = "TOOLGATE_OTHER_TOKEN" }} }},
]
[agents.default]
visible = {visible}
default = "deny"
rules = {rules}
"#
        ),
    )
    .unwrap();
    dir
}

/// `toolgate serve --http 127.0.0.1:0` in `dir`: killed when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the server; its port.
fn serve(dir: &std::path::Path) -> (Server, u16) {
    use std::io::BufRead as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir)
        .args(["--config", "toolgate.toml", "serve", "--http", "127.0.0.1:0"])
        .env("TOOLGATE_TEST_TOKEN", TOKEN)
        .env("TOOLGATE_OTHER_TOKEN", OTHER)
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
    let server = Server(child);
    let port = loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("the server starts");
        if let Some(url) = line.split("serving MCP on http://").nth(1) {
            break url.split(['/', ':']).nth(1).unwrap().parse().unwrap();
        }
    };
    (server, port)
}

/// A connection to the server from 127.0.0.1.
fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A connection to the server from `source` (another loopback address: a
/// second peer).
fn connect_from(source: [u8; 4], port: u16) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let s = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        let stream = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        stream.into_std().unwrap()
    });
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Everything the server sends until it closes the connection; `None` if
/// it kept the connection open (nothing more within the read timeout).
fn until_closed(s: &mut TcpStream) -> Option<String> {
    let mut all = Vec::new();
    match s.read_to_end(&mut all) {
        Ok(_) => Some(String::from_utf8_lossy(&all).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(String::from_utf8_lossy(&all).into_owned()),
        Err(_) => None,
    }
}

/// One response's head (status line and headers, lower case), read without
/// waiting for its body (an SSE stream stays open).
fn head(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut byte = [0u8; 1];
    while !all.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => all.push(byte[0]),
            other => panic!("the response's head ended early ({other:?}): {}", String::from_utf8_lossy(&all)),
        }
    }
    String::from_utf8_lossy(&all).to_ascii_lowercase()
}

/// A stateless (2026-07-28) `tools/list` of [`TOKEN`], keeping the connection.
fn list_request() -> String {
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n\
         Content-Length: {}\r\n\r\n{list}",
        list.len()
    )
}

/// One whole response from `r` (its head lower case; its body by
/// `Content-Length` or chunked), leaving the connection for the next.
fn response(r: &mut impl std::io::BufRead) -> (String, String) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "the connection closed in a head: {head}");
        head.push_str(&line.to_ascii_lowercase());
        if line == "\r\n" {
            break;
        }
    }
    let mut body = Vec::new();
    if head.contains("transfer-encoding: chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut all = vec![0; length];
        r.read_exact(&mut all).unwrap();
        body = all;
    }
    (head, String::from_utf8_lossy(&body).into_owned())
}

fn status_of(head: &str) -> u16 {
    head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A POST to `/mcp` on a new connection (closed after it), from `from`;
/// the status, the response's head and the JSON-RPC message of its body
/// (plain JSON, or the last SSE `data:` event).
fn post_from(
    from: [u8; 4],
    port: u16,
    token: &str,
    headers: &str,
    body: &serde_json::Value,
) -> (u16, String, serde_json::Value) {
    let mut s = connect_from(from, port);
    let body = body.to_string();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let raw = until_closed(&mut s).expect("the server answers and closes");
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut text = String::new();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut rest = rest;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 || size > after.len() {
                break;
            }
            text.push_str(&after[..size]);
            rest = after[size..].trim_start_matches("\r\n");
        }
    } else {
        text = rest.to_owned();
    }
    let data = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).rfind(|d| d.starts_with('{'));
    let json = serde_json::from_str(data.unwrap_or(&text)).unwrap_or(serde_json::Value::String(text.clone()));
    (status_of(&head.to_ascii_lowercase()), head.to_ascii_lowercase(), json)
}

fn post(port: u16, token: &str, headers: &str, body: &serde_json::Value) -> (u16, String, serde_json::Value) {
    post_from([127, 0, 0, 1], port, token, headers, body)
}

/// `initialize` (2025-11-25, a session): the status, the session's id if one
/// was made, and the body.
fn initialize(port: u16, token: &str) -> (u16, Option<String>, serde_json::Value) {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "limits", "version": "1"}}});
    let (status, head, body) = post(port, token, "", &init);
    let id = head.lines().find_map(|l| l.strip_prefix("mcp-session-id:")).map(|v| v.trim().to_owned());
    (status, id, body)
}

fn in_session(session: &str) -> String {
    format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n")
}

/// A session of `token`, initialized.
fn session(port: u16, token: &str) -> String {
    session_of(port, token, "2025-11-25")
}

/// A session of `token` speaking `version`, initialized.
fn session_of(port: u16, token: &str, version: &str) -> String {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "limits", "version": "1"}}});
    let (status, head, body) = post(port, token, "", &init);
    assert_eq!(status, 200, "{body}");
    let id = head.lines().find_map(|l| l.strip_prefix("mcp-session-id:")).map(|v| v.trim().to_owned());
    let id = id.expect("a session");
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _, body) = post(port, token, &in_session_of(&id, version), &initialized);
    assert_eq!(status, 202, "{body}");
    id
}

fn in_session_of(session: &str, version: &str) -> String {
    format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {version}\r\n")
}

/// POST `hostile.sleep` as request `id` in `session` (of `version`), read
/// the response's head — the call's SSE stream — and hang up.
fn call_and_hang_up(port: u16, token: &str, session: &str, version: &str, id: u64) {
    let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "hostile.sleep", "arguments": {}}})
    .to_string();
    let mut s = connect(port);
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{}Content-Length: {}\r\n\r\n{call}",
        in_session_of(session, version),
        call.len()
    )
    .unwrap();
    let h = head(&mut s);
    assert_eq!(status_of(&h), 200, "{h}");
    assert!(h.contains("text/event-stream"), "{h}");
}

/// `notes(op = "list")` in `session`: the JSON-RPC answer.
fn call(port: u16, token: &str, session: &str) -> (u16, serde_json::Value) {
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "notes", "arguments": {"op": "list"}}});
    let (status, _, body) = post(port, token, &in_session(session), &call);
    (status, body)
}

/// A client with no token cannot hold a connection by re-sending requests
/// on it before each header deadline: every response to a request that was
/// not authenticated — 401 with no token or a wrong one (an unknown path
/// too), `/healthz` — says `Connection: close` and the server closes the
/// connection. Connections it opens and leaves idle count against its
/// address's cap (here 3) only until a connection that authenticates needs
/// the place: a fourth connection is served, and the oldest idle one is
/// closed for it; once every connection of the address has carried a valid
/// token, the next is answered 429 naming the setting. Before, each stayed
/// open for the next request (keep-alive), so a request every < 30 s on
/// each held a slot of `max_connections` for ever; and until this change
/// idle connections of anyone on the address (on loopback, any local user)
/// had every authenticated client of it refused with 429.
#[test]
fn an_unauthenticated_client_cannot_hold_connections_past_its_address_cap() {
    let dir = serve_dir("max_connections_per_address = 3");
    let (_server, port) = serve(dir.path());
    let requests = [
        ("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n".to_owned(), 200),
        ("GET /nowhere HTTP/1.1\r\nHost: localhost\r\n\r\n".to_owned(), 401),
        (
            "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                .to_owned(),
            401,
        ),
        (
            "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer tg-not-a-token-0123456789\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                .to_owned(),
            401,
        ),
        ("DELETE /mcp HTTP/1.1\r\nHost: localhost\r\nMcp-Session-Id: x\r\n\r\n".to_owned(), 401),
    ];
    for (request, expected) in &requests {
        let mut s = connect(port);
        s.write_all(request.as_bytes()).unwrap();
        let answer = until_closed(&mut s)
            .unwrap_or_else(|| panic!("the connection stayed open after an unauthenticated request: {request:?}"));
        let lower = answer.to_ascii_lowercase();
        assert_eq!(status_of(&lower), *expected, "{answer}");
        assert!(lower.contains("connection: close"), "{answer}");
    }
    // An authenticated request's connection stays for the next one.
    let kept = connect(port);
    let mut reader = std::io::BufReader::new(&kept);
    for _ in 0..2 {
        write!(&kept, "{}", list_request()).unwrap();
        let (h, body) = response(&mut reader);
        assert_eq!(status_of(&h), 200, "{h}{body}");
        assert!(!h.contains("connection: close"), "{h}");
        assert!(body.contains("notes"), "{body}");
    }
    drop(reader);
    drop(kept);
    // Its end seen by the server: the address holds none.
    std::thread::sleep(Duration::from_millis(300));
    // Three idle connections fill the address's cap; a client that
    // authenticates is still served, the oldest idle connection closed for it
    // — once the idle ones had a second to send headers (a connection still
    // sending its first is never closed for a newer one).
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect(port)).collect();
    std::thread::sleep(Duration::from_millis(1200));
    let fourth = connect(port);
    write!(&fourth, "{}", list_request()).unwrap();
    let (h, body) = response(&mut std::io::BufReader::new(&fourth));
    assert_eq!(status_of(&h), 200, "an authenticated client refused for idle connections: {h}{body}");
    assert!(until_closed(&mut held[0]).is_some(), "the oldest idle connection was kept");
    // Every connection of the address authenticated: the next is refused.
    for s in &held[1..] {
        write!(&*s, "{}", list_request()).unwrap();
        let (h, body) = response(&mut std::io::BufReader::new(s));
        assert_eq!(status_of(&h), 200, "{h}{body}");
    }
    let mut fifth = connect(port);
    let refused = until_closed(&mut fifth).expect("the connection past the address's cap was served");
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains("max_connections_per_address"), "{refused}");
    drop((held, fourth));
}

/// One token opening sessions past `[serve] max_sessions_per_token` (here
/// 2), each with a stream open, is refused with 429 naming the setting, while another token's client
/// (of the same agent) still opens its session and calls; a token holding
/// `max_requests_per_token` (here 3) open — SSE streams — is refused its
/// next request likewise, the other token unaffected; ending a session
/// (DELETE, let past the cap) gives both places back. Before, sessions and
/// their streams per token were unlimited: one token's client could hold
/// every connection.
#[test]
fn a_token_past_its_session_and_request_caps_is_refused_while_another_calls() {
    let dir = serve_dir("max_sessions_per_token = 2\nmax_requests_per_token = 3");
    let (_server, port) = serve(dir.path());
    let first = session(port, TOKEN);
    let second = session(port, TOKEN);
    // Three GET streams of the first token (two primaries, a shadow) stay
    // open; a session with none open would make room for a new one.
    let stream = |id: &String| {
        let mut s = connect(port);
        write!(
            s,
            "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n{}\r\n",
            in_session(id)
        )
        .unwrap();
        let h = head(&mut s);
        assert_eq!(status_of(&h), 200, "{h}");
        s
    };
    let mut streams: Vec<TcpStream> = [&first, &second].iter().map(|id| stream(id)).collect();
    let (status, id, body) = initialize(port, TOKEN);
    assert_eq!((status, id), (429, None), "a third session of one token, both busy: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_sessions_per_token") && message.contains("serve.auth[0]"), "{body}");

    let theirs = session(port, OTHER);
    let (status, answer) = call(port, OTHER, &theirs);
    assert_eq!((status, &answer["result"]["isError"]), (200, &serde_json::json!(false)), "{answer}");

    streams.push(stream(&first));
    let (status, answer) = call(port, TOKEN, &second);
    assert_eq!(status, 429, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_requests_per_token") && message.contains("serve.auth[0]"), "{answer}");
    let (status, answer) = call(port, OTHER, &theirs);
    assert_eq!((status, &answer["result"]["isError"]), (200, &serde_json::json!(false)), "{answer}");

    // Ending the first session ends its two streams and frees its place.
    let (status, _, body) = post(port, TOKEN, "", &serde_json::json!({}));
    assert_eq!(status, 429, "still at the cap: {body}");
    let mut delete = connect(port);
    write!(
        delete,
        "DELETE /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n{}Connection: close\r\n\r\n",
        in_session(&first)
    )
    .unwrap();
    let deleted = until_closed(&mut delete).expect("the DELETE is answered");
    assert!(deleted.starts_with("HTTP/1.1 20"), "{deleted}");
    let started = Instant::now();
    let third = loop {
        let (status, id, body) = initialize(port, TOKEN);
        if status == 200 {
            break id.expect("a session");
        }
        assert_eq!(status, 429, "{body}");
        assert!(started.elapsed() < Duration::from_secs(30), "the ended session's place never came back: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(third, first);
    drop(streams);
}

/// A peer address past `[serve] max_connections_per_address` (here 2),
/// each of its connections authenticated (an idle one would be closed for
/// the new one), is refused — 429 naming the setting, the connection closed — while the
/// server goes on serving another address (127.0.0.2), and serves the
/// first again once one of its connections ends. Before, one address could
/// take every one of the `max_connections`.
#[test]
fn a_peer_address_past_its_cap_is_refused_while_the_server_serves_others() {
    let dir = serve_dir("max_connections_per_address = 2");
    let (_server, port) = serve(dir.path());
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let s = connect(port);
            write!(&s, "{}", list_request()).unwrap();
            let (h, body) = response(&mut std::io::BufReader::new(&s));
            assert_eq!(status_of(&h), 200, "{h}{body}");
            s
        })
        .collect();
    let mut third = connect(port);
    let refused = until_closed(&mut third).expect("a third connection from one address was served");
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains("max_connections_per_address"), "{refused}");

    let mut other = connect_from([127, 0, 0, 2], port);
    other.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let answer = until_closed(&mut other).expect("the health check is answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let (status, _, body) =
        post_from([127, 0, 0, 2], port, TOKEN, "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n", &list);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["tools"][0]["name"], "notes", "{body}");

    // One of the first address's connections ends: it is served again.
    drop(held.pop());
    let started = Instant::now();
    loop {
        let mut s = connect(port);
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let answer = until_closed(&mut s).unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never served again: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A keep-alive connection left idle after its response — authenticated —
/// is closed at `[serve] header_timeout_ms` (hyper re-arms the header
/// deadline for each request), so an idle connection is bounded too.
#[test]
fn an_idle_keep_alive_connection_is_closed_at_the_header_deadline() {
    let dir = serve_dir("header_timeout_ms = 300");
    let (_server, port) = serve(dir.path());
    let mut s = connect(port);
    write!(s, "{}", list_request()).unwrap();
    let h = head(&mut s);
    assert_eq!(status_of(&h), 200, "{h}");
    assert!(!h.contains("connection: close"), "{h}");
    assert!(until_closed(&mut s).is_some(), "the idle connection stayed open");
}

/// A session's `tools/call` whose client hangs up after the response's head
/// keeps running (2025-11-25: the client got the priming event's id and may
/// resume the stream), and stays counted: a token with `[serve]
/// max_requests_per_token` (here 3) calls running is refused the next — a
/// JSON-RPC error naming the setting, at once — while another token's call
/// runs. Before, a call was counted only while its HTTP request was open:
/// hanging up after each head gave one token any number of calls running,
/// each queued at its Tool and holding its arguments, the fourth here among
/// them (it ran, so its answer did not come within the read timeout).
#[test]
fn calls_whose_requests_hung_up_still_count_against_their_token() {
    let dir = serve_dir_sleeping("max_requests_per_token = 3");
    let (_server, port) = serve(dir.path());
    let mine = session(port, TOKEN);
    for id in 10..13 {
        call_and_hang_up(port, TOKEN, &mine, "2025-11-25", id);
    }
    // The three handlers have taken their places.
    std::thread::sleep(Duration::from_millis(500));
    let sleep = serde_json::json!({"jsonrpc": "2.0", "id": 13, "method": "tools/call",
        "params": {"name": "hostile.sleep", "arguments": {}}});
    let started = Instant::now();
    let (status, _, answer) = post(port, TOKEN, &in_session(&mine), &sleep);
    assert_eq!(status, 200, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("max_requests_per_token") && message.contains("serve.auth[0]") && message.contains("running"),
        "{answer}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "the refusal waited {:?}", started.elapsed());
    // Any tool: the token's calls are what is counted.
    let (status, answer) = call(port, TOKEN, &mine);
    assert_eq!(status, 200, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("max_requests_per_token"), "{answer}");
    // Another token of the same agent calls as ever.
    let theirs = session(port, OTHER);
    let (status, answer) = call(port, OTHER, &theirs);
    assert_eq!((status, &answer["result"]["isError"]), (200, &serde_json::json!(false)), "{answer}");
}

/// A session's `tools/call` whose client hangs up before any event with an
/// id reached it (2025-06-18: no priming event, so nothing to resume the
/// stream from) is withdrawn: its guest stops, the journal says
/// `cancelled`, and its token's place among calls in flight (here 1) comes
/// back at once. Before, the call ran to its deadline (60 s here) with
/// nobody to read its result.
#[test]
fn a_call_whose_client_hung_up_before_any_event_is_withdrawn() {
    let dir = serve_dir_sleeping("max_requests_per_token = 1");
    let (_server, port) = serve(dir.path());
    let mine = session_of(port, TOKEN, "2025-06-18");
    call_and_hang_up(port, TOKEN, &mine, "2025-06-18", 10);
    let started = Instant::now();
    let journal = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .current_dir(dir.path())
            .args(["--config", "toolgate.toml", "--json", "journal"])
            .env("TOOLGATE_TEST_TOKEN", TOKEN)
            .env("TOOLGATE_OTHER_TOKEN", OTHER)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.lines().any(|l| l.contains("hostile.sleep") && l.contains("cancelled")) {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the call of a client that hung up was not cancelled: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(started.elapsed() < Duration::from_secs(20), "{journal}");
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call",
        "params": {"name": "notes", "arguments": {"op": "list"}}});
    let (status, _, answer) = post(port, TOKEN, &in_session_of(&mine, "2025-06-18"), &call);
    assert_eq!((status, &answer["result"]["isError"]), (200, &serde_json::json!(false)), "{answer}");
}
