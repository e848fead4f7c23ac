//! The server in process: what a test of the binary cannot reach — its
//! internals, or settings no config names.

use std::path::Path;

use super::*;
use toolgate::store::AwaitingRecord;
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
        let max = max_line(&server.shared.config);
        Client::connect_with(server, max)
    }

    /// Over the stdio transport with lines of at most `max_line` bytes.
    fn connect_with(server: McpServer, max_line: usize) -> Client {
        use tokio::io::AsyncBufReadExt as _;
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let (read, write) = tokio::io::split(theirs);
        let transport = line_transport(read, write, max_line);
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

    async fn send_line(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt as _;
        self.write.write_all(format!("{line}\n").as_bytes()).await.unwrap();
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
    /// A 2025-11-25 client that can elicit, which has called `notes add "n"`
    /// (request id 2).
    async fn adding_a_note(server: McpServer) -> Client {
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
        c
    }

    async fn asked(server: McpServer) -> (Client, serde_json::Value) {
        let mut c = Client::adding_a_note(server).await;
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

/// An ask whose client leaves keep-alive pings unanswered keeps waiting
/// for the human's answer (the ticket's life bounds the wait: see the next
/// test): the Python SDK's 1.x session reads nothing while its elicitation
/// callback runs, so a human reading for two minutes lost the ask when an
/// unanswered ping ended the wait.
#[tokio::test]
async fn an_ask_whose_client_leaves_pings_unanswered_waits_for_the_answer() {
    within_a_minute(ask_whose_client_stops_answering_pings()).await;
}

async fn ask_whose_client_stops_answering_pings() {
    let dir = serve_dir("");
    let server = server(dir.path(), settings(Duration::from_millis(200))).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let (mut c, ask) = Client::asked(server).await;
    // The first ping is answered, the next ones are not (a client busy with
    // its dialog, as the Python SDK's 1.x session is): the wait goes on.
    let ping = c.receive().await;
    assert_eq!(ping["method"], "ping", "{ping}");
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": ping["id"], "result": {}})).await;
    let mut unanswered = 0;
    while unanswered < 3 {
        let m = c.receive().await;
        // The server's own requests count their ids apart from ours.
        assert!(m["id"] != 2 || m["method"].is_string(), "the wait ended on an unanswered ping: {m}");
        if m["method"] == "ping" {
            unanswered += 1;
        }
    }
    // The human answers at last: the answer decides.
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "decline"}})).await;
    let done = loop {
        let m = c.receive().await;
        if m["id"] == 2 && !m["method"].is_string() {
            break m;
        }
    };
    let text = done["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(done["result"]["isError"] == true && text.contains("blocked"), "{done}");
    assert!(store.pending().await.unwrap().is_empty(), "the request was decided");
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

/// The one pending request of `dir`'s journal, after rewriting it as a
/// journal writer (the agent's OS user can write the journal) would while
/// the human reads its prompt: another call of the tool, its arguments and
/// their digest consistent. The record as it was is returned.
async fn rewrite_the_pending_call(dir: &Path, store: &Arc<dyn toolgate::store::StepStore>) -> AwaitingRecord {
    let pending = store.pending().await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let was = pending[0].clone();
    let tampered = serde_json::json!({"op": "add", "note": "TAMPERED"});
    toolgate_tests::rewrite_awaiting(
        &dir.join("journal.db"),
        &was.ticket_id,
        "notes",
        &tampered,
        &was.component_digest,
    );
    was
}

/// `done` (the answer to the call that was asked) refuses the approval,
/// naming the request and never its ticket; the request is still pending,
/// as rewritten; nothing ran: the journal holds no output and no approval,
/// and the rewritten note is not in the Tool's state.
async fn assert_refused_and_nothing_ran(
    done: &serde_json::Value,
    store: &Arc<dyn toolgate::store::StepStore>,
    was: &AwaitingRecord,
) {
    let message = done["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("request {}", was.call_id)) && message.contains("since it was shown to the human"),
        "refused, naming the request: {done}"
    );
    assert!(message.contains("still pending") && !done.to_string().contains("tkt-"), "{done}");
    let now = store.awaiting(&was.ticket_id).await.unwrap().expect("the request is in the journal");
    assert_eq!(now.state, "pending", "still pending");
    assert_ne!(now.call_digest(), was.call_digest(), "as rewritten");
    let steps = store.steps(None).await.unwrap();
    assert!(
        steps.iter().all(|s| s.outcome == toolgate::store::OutcomeKind::Awaiting && s.approved_by.is_none()),
        "the journal has no result for the request: {steps:?}"
    );
    let state = store.tool_state("default", "notes").await.unwrap();
    assert!(!format!("{state:?}").contains("TAMPERED"), "the rewritten call did not run: {state:?}");
}

/// The pending call is rewritten while the human reads the prompt
/// (`elicitation/create`, 2025-11-25) — `notes add "n"` becomes
/// `notes add "TAMPERED"` — and the human accepts: the approval names the
/// record the prompt was built from, which the journal no longer holds, so
/// it is refused; nothing runs and the request stays pending. Before, the
/// approval named no call and the rewritten call ran as the human's.
#[tokio::test]
async fn a_call_rewritten_while_the_prompt_is_open_is_not_approved() {
    within_a_minute(rewritten_while_the_prompt_is_open()).await;
}

async fn rewritten_while_the_prompt_is_open() {
    let dir = serve_dir("");
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let (mut c, ask) = Client::asked(server).await;
    let message = ask["params"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(r#"{"note":"n","op":"add"}"#), "the prompt shows the pending call: {message}");
    let was = rewrite_the_pending_call(dir.path(), &store).await;
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"confirm": true}}}))
        .await;
    let done = c.receive().await;
    assert_eq!(done["id"], 2, "{done}");
    assert_refused_and_nothing_ran(&done, &store, &was).await;
}

/// A reload while the human reads the prompt (`elicitation/create`) that
/// makes the Tool unavailable — another plugin claims `notes`, so the id is
/// ambiguous — and the human accepts: the approval is decided on the
/// catalog in force when the human answers, so nothing runs. Before, it was
/// decided on the runtime the call was asked under, from before the
/// reload, and the component ran (first-wins across a reload).
#[tokio::test]
async fn an_approval_is_decided_on_the_catalog_in_force_when_the_human_answers() {
    within_a_minute(decided_after_a_reload()).await;
}

async fn decided_after_a_reload() {
    let dir = serve_dir("");
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let (mut c, ask) = Client::asked(server.clone()).await;
    let again = toolgate::catalog::descriptor::embed_section(&packed(guests::NOTES), "test-copy", b"2").unwrap();
    std::fs::write(dir.path().join("plugins/notes-again.wasm"), again).unwrap();
    server.reload().unwrap();
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"confirm": true}}}))
        .await;
    let done = loop {
        let m = c.receive().await;
        if m["id"] == 2 {
            break m;
        }
    };
    assert!(done["result"]["isError"] == true || done["error"].is_object(), "{done}");
    let state = store.tool_state("default", "notes").await.unwrap();
    assert!(state.is_empty(), "nothing ran: {state:?} ({done})");
}

/// The same on 2026-07-28 (input request; the answer comes with the retry
/// and the sealed state). The retry finds its request by run, tool and
/// arguments, so a rewrite of those is not found (the call is asked anew);
/// here the restriction the call asked under is rewritten, which that
/// lookup does not see. The sealed state carries the digest of the record
/// shown, so the answer is refused; before, the rewritten call ran.
#[tokio::test]
async fn a_call_rewritten_before_the_retry_answers_is_not_approved() {
    within_a_minute(rewritten_before_the_retry()).await;
}

async fn rewritten_before_the_retry() {
    let dir = serve_dir("");
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let mut c = Client::connect(server);
    let call = |id: u64, extra: serde_json::Value| {
        let mut params = serde_json::json!({"name": "notes", "arguments": {"op": "add", "note": "n"}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        }});
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    c.send(call(1, serde_json::json!({}))).await;
    let asked = c.receive().await;
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let state = asked["result"]["requestState"].as_str().unwrap_or_default().to_owned();
    let pending = store.pending().await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let was = pending[0].clone();
    let restriction = r#"[{"directories":["/elsewhere"],"hosts":null,"credentials":null}]"#;
    toolgate_tests::rewrite_awaiting_restriction(&dir.path().join("journal.db"), &was.ticket_id, Some(restriction));
    c.send(call(
        2,
        serde_json::json!({
            "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": true}}},
            "requestState": state,
        }),
    ))
    .await;
    let done = c.receive().await;
    assert_eq!(done["id"], 2, "{done}");
    assert_refused_and_nothing_ran(&done, &store, &was).await;
    assert_eq!(store.pending().await.unwrap().len(), 1, "not asked anew: the retry found the request");
}

/// A stdio message longer than a line may be is answered, with the id its
/// start names, and the connection goes on. Before, rmcp dropped it with no
/// answer and the client waited for ever (here: no answer within 30 s).
#[tokio::test]
async fn a_stdio_message_past_the_line_limit_is_answered_with_its_id() {
    within_a_minute(oversized_line()).await;
}

async fn oversized_line() {
    let dir = serve_dir("");
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let mut c = Client::connect_with(server, 4096);
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}))
        .await;
    assert!(c.receive().await["result"]["protocolVersion"].is_string());
    c.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let big = "x".repeat(64 * 1024);
    for (id, params) in [
        (serde_json::json!(2), serde_json::json!({"name": "notes", "arguments": {"op": "add", "note": big}})),
        (
            serde_json::json!("s-3"),
            serde_json::json!({"name": "notes", "arguments": {"op": "add", "note": &big[..5000]}}),
        ),
    ] {
        c.send(serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})).await;
        let answer = c.receive().await;
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("4096 bytes"), "{answer}");
    }
    // The id after a long `params`: past the start kept, answered without one.
    let line = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"notes","arguments":{{"op":"add","note":"{big}"}}}},"id":4}}"#
    );
    c.send_line(&line).await;
    let answer = c.receive().await;
    assert!(answer["id"].is_null() && answer["error"]["code"] == -32600, "{answer}");
    // The session goes on: the next message, whole, is read and answered.
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "notes", "arguments": {"op": "list"}}}))
        .await;
    let answer = c.receive().await;
    assert!(answer["id"] == 5 && answer["result"]["isError"] == false, "{answer}");
}

/// A directory whose agent sees `text.*` (ids with a dot) and `notes`.
fn text_dir() -> tempfile::TempDir {
    let dir = serve_dir("");
    std::fs::write(dir.path().join("plugins/text.wasm"), packed(guests::TEXT)).unwrap();
    let toml = dir.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&toml).unwrap().replace(
        "visible = [\"notes\"]\ndefault = \"deny\"\nrules = [\n",
        "visible = [\"notes\", \"text.*\"]\ndefault = \"deny\"\nrules = [\n  { pattern = \"text.*\", behavior = \"allow\" },\n",
    );
    assert!(text.contains("text.*"), "{text}");
    std::fs::write(&toml, text).unwrap();
    dir
}

/// `tools/list` gives names every client takes (`files.read` and
/// `text.upper` were refused by Claude Desktop and Codex), the id as the
/// title; a call by the listed name runs the tool by its id, in the rules
/// and the journal; a call by the id runs it too.
#[tokio::test]
async fn listed_names_are_portable_and_a_call_by_name_runs_the_id() {
    within_a_minute(portable_names()).await;
}

async fn portable_names() {
    let dir = text_dir();
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let mut c = Client::connect(server);
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}))
        .await;
    assert!(c.receive().await["result"]["protocolVersion"].is_string());
    c.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    let listed = c.receive().await;
    let tools = listed["result"]["tools"].as_array().cloned().unwrap_or_default();
    assert!(tools.len() > 2, "{listed}");
    for t in &tools {
        let name = t["name"].as_str().unwrap_or_default();
        assert!(portable_name(name), "not a name every client takes: {name:?}");
    }
    let upper = tools.iter().find(|t| t["title"] == "text.upper").expect("text.upper listed");
    assert_eq!(upper["name"], "text_upper", "{upper}");
    for (id, name) in [(3, "text_upper"), (4, "text.upper")] {
        c.send(serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": {"text": "hi"}}}))
            .await;
        let done = c.receive().await;
        assert_eq!(done["result"]["content"][0]["text"], "\"HI\"", "{name}: {done}");
    }
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "text_nothing", "arguments": {}}}))
        .await;
    let unknown = c.receive().await;
    assert!(unknown["error"]["message"].as_str().unwrap_or_default().contains("unknown tool"), "{unknown}");
    let steps = store.steps(None).await.unwrap();
    let tools: Vec<&str> = steps.iter().map(|s| s.tool_id.as_str()).collect();
    assert_eq!(tools, ["text.upper", "text.upper"], "the journal holds the id");
}

/// `text.upper` listed as `text_upper`; then a plugin whose id is
/// `text_upper` is added (the next generation). A client that has not
/// listed again calls `text_upper` meaning `text.upper`: the name is now
/// ambiguous, so the call is refused naming both ids and nothing runs —
/// neither tool is listed under it, and `text.upper` still runs by its id.
/// Before, `text_upper` went to the new tool and `text.upper` was renamed.
#[tokio::test]
async fn a_name_another_plugin_takes_later_is_refused_as_ambiguous_never_runs_the_other() {
    within_a_minute(stale_name()).await;
}

async fn stale_name() {
    let dir = text_dir();
    let toml = dir.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&toml)
        .unwrap()
        .replace("visible = [\"notes\", \"text.*\"]", "visible = [\"notes\", \"text.*\", \"text_upper\"]");
    let text = text.replace(
        "  { pattern = \"text.*\", behavior = \"allow\" },\n",
        "  { pattern = \"text.*\", behavior = \"allow\" },\n  { pattern = \"text_upper\", behavior = \"allow\" },\n",
    );
    assert!(text.contains("pattern = \"text_upper\""), "{text}");
    std::fs::write(&toml, text).unwrap();
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let mut c = Client::connect(server.clone());
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}))
        .await;
    assert!(c.receive().await["result"]["protocolVersion"].is_string());
    c.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let names = |listed: &serde_json::Value| -> Vec<(String, String)> {
        let tools = listed["result"]["tools"].as_array().cloned().unwrap_or_default();
        tools
            .iter()
            .map(|t| (t["name"].as_str().unwrap().to_owned(), t["title"].as_str().unwrap().to_owned()))
            .collect()
    };
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    let first = names(&c.receive().await);
    assert!(first.contains(&("text_upper".into(), "text.upper".into())), "{first:?}");

    // Generation 2: a component whose one tool is `text_upper` (the text
    // component with its metadata renamed).
    let packed = packed(guests::TEXT);
    let mut tools: Vec<_> = toolgate::catalog::descriptor::read_metadata(&packed)
        .unwrap()
        .iter()
        .filter(|t| t.id() == "text.upper")
        .map(|t| t.metadata.clone())
        .collect();
    tools[0].descriptor.id = "text_upper".into();
    let doc = toolgate_sdk::ComponentMetadata::new(tools);
    let renamed = toolgate::catalog::descriptor::embed_metadata(&packed, &doc).unwrap();
    std::fs::write(dir.path().join("plugins/other.wasm"), renamed).unwrap();
    server.reload().unwrap();

    // The stale name: refused, naming both ids; nothing runs.
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "text_upper", "arguments": {"text": "hi"}}}))
        .await;
    let refused = loop {
        let m = c.receive().await;
        if m["id"] == 3 {
            break m;
        }
    };
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ambiguous") && message.contains("`text.upper`") && message.contains("`text_upper`"),
        "{refused}"
    );
    assert!(store.steps(None).await.unwrap().is_empty(), "nothing ran");
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})).await;
    let second = loop {
        let m = c.receive().await;
        if m["id"] == 4 {
            break names(&m);
        }
    };
    assert!(
        second.iter().all(|(name, title)| name != "text_upper" && title != "text.upper" && title != "text_upper"),
        "{second:?}"
    );
    assert!(second.contains(&("text_count".into(), "text.count".into())), "the others keep their names: {second:?}");
    // By its real id, `text.upper` still runs.
    c.send(serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "text.upper", "arguments": {"text": "hi"}}}))
        .await;
    let done = c.receive().await;
    assert_eq!(done["result"]["content"][0]["text"], "\"HI\"", "{done}");
    let steps = store.steps(None).await.unwrap();
    let ran: Vec<&str> = steps.iter().map(|s| s.tool_id.as_str()).collect();
    assert_eq!(ran, ["text.upper"]);
}

/// An HTTP session: made as rmcp makes one (its worker served, initialized
/// at `version`) for `[[serve.auth]]` entry `entry`.
async fn http_session(
    sessions: &Arc<http::TokenSessions>,
    server: &McpServer,
    entry: usize,
    version: &str,
) -> Result<rmcp::transport::streamable_http_server::session::SessionId, http::TokenSessionError> {
    use rmcp::transport::streamable_http_server::session::SessionManager as _;
    let opener = http::Opener { digest: [entry as u8; 32], entry, refused: Default::default() };
    let (id, transport) = http::OPENER.scope(opener, sessions.create_session()).await?;
    let service = server.for_new_session();
    tokio::spawn(async move {
        if let Ok(s) = service.serve(transport).await {
            let _ = s.waiting().await;
        }
    });
    let init: rmcp::model::ClientJsonRpcMessage = serde_json::from_value(serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}))
    .unwrap();
    sessions.initialize_session(&id, init).await.unwrap();
    let initialized: rmcp::model::ClientJsonRpcMessage =
        serde_json::from_value(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).unwrap();
    sessions.accept_message(&id, initialized).await.unwrap();
    Ok(id)
}

/// A session whose client holds its GET stream open outlives the idle time
/// however quiet it is; one with no stream open is closed once idle past
/// it, and its place under `max_sessions_per_token` is freed. Before,
/// rmcp closed every session 5 minutes after its last message, GET stream
/// open or not (the Python SDK then failed every call).
#[tokio::test]
async fn an_http_session_with_an_open_stream_outlives_the_idle_time_and_an_idle_one_is_reaped() {
    within_a_minute(idle_sessions()).await;
}

async fn idle_sessions() {
    use futures_util::StreamExt as _;
    use rmcp::transport::streamable_http_server::session::SessionManager as _;
    let dir = serve_dir("");
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let idle = Duration::from_millis(300);
    let sessions = Arc::new(http::TokenSessions::new(1, idle));
    let reaper = tokio::spawn(sessions.clone().reap());
    let listening = http_session(&sessions, &server, 0, "2025-11-25").await.unwrap();
    let mut stream = Box::pin(sessions.create_standalone_stream(&listening).await.unwrap());
    // A 2025-11-25 session is primed: the stream's first event has no message.
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap();
    assert!(first.message.is_none() && first.retry.is_some(), "{first:?}");
    let quiet = http_session(&sessions, &server, 1, "2025-03-26").await.unwrap();
    // One session per entry: while the first has a stream open, the second
    // of entry 1 waits for it (with none open, the first would make room).
    let busy = sessions.create_standalone_stream(&quiet).await.unwrap();
    assert!(matches!(
        http_session(&sessions, &server, 1, "2025-03-26").await,
        Err(http::TokenSessionError::Refused { .. })
    ));
    drop(busy);
    tokio::time::sleep(idle * 4).await;
    assert!(sessions.has_session(&listening).await.unwrap(), "the session holding its stream was closed");
    assert!(!sessions.has_session(&quiet).await.unwrap(), "the idle session was not closed");
    let again = http_session(&sessions, &server, 1, "2025-03-26").await;
    assert!(again.is_ok(), "the idle session's place was not freed");
    // Its stream closed, the first one goes too, once idle.
    drop(stream);
    tokio::time::sleep(idle * 4).await;
    assert!(!sessions.has_session(&listening).await.unwrap(), "an idle session with its stream closed stayed");
    reaper.abort();
}

/// Sessions of revisions before 2025-11-25 get no priming event (an SSE
/// event with no data: the Java and Go SDKs fail on one) on any stream.
#[tokio::test]
async fn sessions_before_2025_11_25_get_no_priming_event() {
    within_a_minute(no_priming()).await;
}

async fn no_priming() {
    use futures_util::StreamExt as _;
    use rmcp::transport::streamable_http_server::session::SessionManager as _;
    let dir = serve_dir("");
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let sessions = Arc::new(http::TokenSessions::new(8, Duration::from_secs(60)));
    for (entry, version) in [(0, "2024-11-05"), (1, "2025-03-26"), (2, "2025-06-18"), (3, "2025-11-25")] {
        let id = http_session(&sessions, &server, entry, version).await.unwrap();
        let list: rmcp::model::ClientJsonRpcMessage =
            serde_json::from_value(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).unwrap();
        let events: Vec<_> = tokio::time::timeout(
            Duration::from_secs(10),
            sessions.create_stream(&id, list).await.unwrap().collect::<Vec<_>>(),
        )
        .await
        .unwrap();
        let primed = events.iter().any(|e| e.message.is_none());
        assert!(events.iter().any(|e| e.message.is_some()), "{version}: no answer: {events:?}");
        assert_eq!(primed, version == "2025-11-25", "{version}: {events:?}");
        let mut standalone = Box::pin(sessions.create_standalone_stream(&id).await.unwrap());
        let first = tokio::time::timeout(Duration::from_millis(300), standalone.next()).await;
        assert_eq!(
            matches!(first, Ok(Some(ref e)) if e.message.is_none()),
            version == "2025-11-25",
            "{version}: {first:?}"
        );
    }
}

/// A session whose client reads nothing does not hold the others' notices:
/// the list-changed notice of a reload goes to every session at once, each
/// for a bounded time. Before, they went one after another, each waiting
/// until its transport took it, so one client that stopped reading (its
/// pipe full) held every later session's notice — and the next reload —
/// for as long as it did not read.
#[tokio::test]
async fn a_session_that_reads_nothing_does_not_hold_the_others_list_changed_notices() {
    within_a_minute(stalled_session()).await;
}

async fn stalled_session() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = text_dir();
    let server = server(dir.path(), settings(Duration::from_secs(30))).await;
    let init = |id: u64| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
    };
    // The stalled client: a pipe of 64 bytes it stops reading after its
    // initialize answer, and it is the first session the server knows.
    let (ours, theirs) = tokio::io::duplex(64);
    let (read, write) = tokio::io::split(theirs);
    let stalled_server = server.for_new_session();
    let max = max_line(&server.shared.config);
    tokio::spawn(async move {
        if let Ok(service) = stalled_server.serve(line_transport(read, write, max)).await {
            let _ = service.waiting().await;
        }
    });
    let (read, write) = tokio::io::split(ours);
    let mut stalled = Client { write, lines: tokio::io::BufReader::new(read).lines() };
    stalled.send(init(1)).await;
    assert!(stalled.receive().await["result"]["protocolVersion"].is_string());
    stalled.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let mut other = Client::connect(server.for_new_session());
    other.send(init(1)).await;
    assert!(other.receive().await["result"]["protocolVersion"].is_string());
    other.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    // Both registered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.shared.legacy_peers.lock().unwrap().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "both sessions are known");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Two reloads' notices: the first fills the stalled pipe, the second
    // waits on it.
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), server.announce_list_changed())
            .await
            .expect("a reload's notices are sent within their bound");
        let m = other.receive().await;
        assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
    }
}

/// A call that would run failed closed here whatever it does — an `env`
/// grant while this host has never read a configured credential — cannot
/// be approved, so the human is not asked (their answer would be refused,
/// and the model's retry would ask again): the call is answered that it
/// cannot be approved on this host, naming the request and no ticket, and
/// the request stays pending for a host that can read the credential.
#[tokio::test]
async fn an_ask_that_cannot_be_approved_here_is_not_put_to_the_human() {
    within_a_minute(ask_that_cannot_be_approved_here()).await;
}

async fn ask_that_cannot_be_approved_here() {
    let var = format!("TOOLGATE_SERVE_NEVER_SET_{}", std::process::id());
    let dir = serve_dir(&format!(
        "\n[credentials.tracker]\nsource = {{ env = \"{var}\" }}\ndestinations = [\"https://tracker.example:443\"]\n\
         apply = {{ header = {{ name = \"Authorization\", format = \"Bearer {{}}\" }} }}\n\
         [[grants]]\ntools = \"notes\"\nenv = {{ MODE = \"test\" }}\n"
    ));
    let server = server(dir.path(), settings(KEEP_ASKING)).await;
    let store = server.shared.runtimes.read().unwrap().base.store().clone();
    let mut c = Client::adding_a_note(server).await;
    let done = c.receive().await;
    assert_eq!(done["id"], 2, "answered, not asked: {done}");
    let message = done["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("cannot be approved on this host") && message.contains("still pending"), "{done}");
    assert!(!done.to_string().contains("tkt-") && !message.contains(&var), "{done}");
    let pending = store.pending().await.unwrap();
    assert_eq!(pending.len(), 1, "still pending: {pending:?}");
    assert!(message.contains(&pending[0].call_id), "names the request: {done}");
}
