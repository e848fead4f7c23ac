//! The server in process: what a test of the binary cannot reach — its
//! internals, or settings no config names.

use std::path::Path;

use super::*;
use toolgate_tests::{guests, packed};

/// A directory for `toolgate serve`: `notes`, whose `add` asks (no approver
/// keys: the client's UI decides); agents `default` and `reader`.
fn serve_dir(limits: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins/notes.wasm"), packed(guests::NOTES)).unwrap();
    std::fs::write(
        dir.path().join("toolgate.toml"),
        format!(
            r#"{}
[limits]
{limits}
[agents.reader]
visible = []
[agents.default]
visible = ["notes"]
default = "deny"
rules = [
  {{ pattern = 'notes(op = "list")', behavior = "allow" }},
  {{ pattern = 'notes(op = "add")', behavior = "ask" }},
]
"#,
            toolgate_tests::PREAMBLE
        ),
    )
    .unwrap();
    dir
}

async fn server(dir: &Path, settings: ServeSettings) -> McpServer {
    let config = Config::load(&dir.join("toolgate.toml")).unwrap();
    let runtime = toolgate::host::open(&config, "default").await.unwrap();
    McpServer::new(config, Some("default"), runtime, settings).unwrap()
}

/// Requests of an agent with no runtime yet, at once: each gets the same
/// runtime. Before, each that missed the lookup built its own and the last
/// replaced the others — with Skill marks of its own, so a Skill approved
/// through one did not narrow the sessions served by another. (A race: the
/// requests are let go together, for sixteen agents.)
#[tokio::test]
async fn concurrent_requests_of_a_new_agent_share_one_runtime() {
    let dir = serve_dir("");
    let toml = dir.path().join("toolgate.toml");
    let mut text = std::fs::read_to_string(&toml).unwrap();
    for i in 0..16 {
        text.push_str(&format!("[agents.a{i}]\nvisible = [\"notes\"]\n"));
    }
    std::fs::write(&toml, text).unwrap();
    let server = server(dir.path(), ServeSettings::new(Duration::from_secs(1))).await;
    for i in 0..16 {
        let agent = format!("a{i}");
        // Held while the requests start, so they all wait to look the agent
        // up and are let go together (a reload holds it the same way).
        let held = server.shared.runtimes.write().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (server, agent) = (server.clone(), agent.clone());
                std::thread::spawn(move || server.runtime(&agent).map(|(_, rt)| rt).ok())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        let got: Vec<Arc<Runtime>> = threads.into_iter().map(|t| t.join().unwrap().expect("a runtime")).collect();
        let (_, kept) = server.runtime(&agent).unwrap();
        for rt in &got {
            assert!(Arc::ptr_eq(rt, &kept), "a request of {agent} was served by a runtime that is not the agent's");
        }
    }
}

/// A client of the server over an in-memory pipe, as over stdio: raw
/// JSON-RPC lines.
struct Client {
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
}

impl Client {
    fn connect(server: McpServer) -> Client {
        use tokio::io::AsyncBufReadExt as _;
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let (read, write) = tokio::io::split(theirs);
        let transport = RequestsFirst::new(rmcp::transport::async_rw::AsyncRwTransport::new_server(read, write));
        tokio::spawn(async move {
            if let Ok(service) = server.serve(transport).await {
                let _ = service.waiting().await;
            }
        });
        let (read, write) = tokio::io::split(ours);
        Client { write, lines: tokio::io::BufReader::new(read).lines() }
    }

    async fn send(&mut self, message: serde_json::Value) {
        use tokio::io::AsyncWriteExt as _;
        self.write.write_all(format!("{message}\n").as_bytes()).await.unwrap();
    }

    /// The next message; a server that says nothing for 30 s fails the test
    /// instead of hanging it.
    async fn receive(&mut self) -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .expect("the server said nothing for 30 s")
            .unwrap()
            .expect("the server is there");
        serde_json::from_str(&line).unwrap()
    }

    /// Initialized as a 2025-11-25 client that takes forms; `notes add` sent
    /// as request 2; the elicitation it asks returned.
    async fn asked(server: McpServer) -> (Client, serde_json::Value) {
        let mut c = Client::connect(server);
        c.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "test", "version": "1"}}}))
            .await;
        assert!(c.receive().await["result"]["protocolVersion"].is_string());
        c.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        c.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "notes", "arguments": {"op": "add", "note": "n"}}}))
            .await;
        let ask = c.receive().await;
        assert_eq!(ask["method"], "elicitation/create", "{ask}");
        (c, ask)
    }
}

/// A bound on a test that would otherwise hang (a client kept busy by pings).
async fn within_a_minute(test: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), test).await.expect("the call ended within a minute");
}

fn settings(keep_alive: Duration) -> ServeSettings {
    ServeSettings { grace: Duration::from_secs(1), keep_alive }
}

/// An ask whose client stops answering the keep-alive ping (it went away:
/// a legacy HTTP session nobody reads) is withdrawn: the call ends, the
/// request stays pending, and the question and the ping are withdrawn
/// from the client (rmcp forgets both). Before, the wait never ended — and
/// its pings kept the session from rmcp's idle timeout.
#[tokio::test]
async fn an_ask_whose_client_stops_answering_pings_ends_and_stays_pending() {
    within_a_minute(ask_whose_client_stops_answering_pings()).await;
}

async fn ask_whose_client_stops_answering_pings() {
    let dir = serve_dir("");
    let server = server(dir.path(), settings(Duration::from_millis(200))).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let (mut c, ask) = Client::asked(server).await;
    // The first ping is answered: the wait goes on.
    let ping = c.receive().await;
    assert_eq!(ping["method"], "ping", "{ping}");
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": ping["id"], "result": {}})).await;
    let unanswered = c.receive().await;
    assert_eq!(unanswered["method"], "ping", "{unanswered}");
    let (mut done, mut withdrawn) = (None, Vec::new());
    while done.is_none() || withdrawn.len() < 2 {
        let m = c.receive().await;
        if m["id"] == 2 {
            done = Some(m);
        } else if m["method"] == "notifications/cancelled" {
            withdrawn.push(m["params"]["requestId"].clone());
        } else {
            panic!("unexpected: {m}");
        }
    }
    let done = done.unwrap_or_default();
    let text = done["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(done["result"]["isError"] == true && text.contains("stopped answering"), "{done}");
    assert!(text.contains("stays pending") && !text.contains("tkt-"), "{text}");
    withdrawn.sort_by_key(|v| v.to_string());
    let mut expected = vec![unanswered["id"].clone(), ask["id"].clone()];
    expected.sort_by_key(|v| v.to_string());
    assert_eq!(withdrawn, expected, "the ping and the question are withdrawn");
    assert_eq!(store.pending().await.unwrap().len(), 1, "the request stays pending");
}

/// An ask answered by nobody while its client keeps answering pings waits
/// no longer than its ticket lives: then the call ends saying the approval
/// expired, and the question is withdrawn from the client. Before, it
/// waited for ever.
#[tokio::test]
async fn an_ask_waits_no_longer_than_its_ticket() {
    within_a_minute(ask_answered_by_nobody()).await;
}

async fn ask_answered_by_nobody() {
    let dir = serve_dir("ticket_ttl_secs = 1");
    let server = server(dir.path(), settings(Duration::from_millis(200))).await;
    let (mut c, ask) = Client::asked(server).await;
    let mut withdrawn = None;
    let done = loop {
        let m = c.receive().await;
        if m["method"] == "ping" {
            c.send(serde_json::json!({"jsonrpc": "2.0", "id": m["id"], "result": {}})).await;
        } else if m["method"] == "notifications/cancelled" {
            withdrawn = Some(m["params"]["requestId"].clone());
        } else if m["id"] == 2 {
            break m;
        } else {
            panic!("unexpected: {m}");
        }
    };
    let text = done["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(done["result"]["isError"] == true && text.contains("expired before the human answered"), "{done}");
    assert_eq!(withdrawn, Some(ask["id"].clone()), "the question is withdrawn");
}
