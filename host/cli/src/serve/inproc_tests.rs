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
    let server = server(dir.path(), ServeSettings { grace: Duration::from_secs(1) }).await;
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
