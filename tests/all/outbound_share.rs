//! Invariant 14 across Tools: the host-wide pool of outbound requests in
//! flight is shared out. One Tool whose granted server accepts connections
//! and never answers holds at most its share of the host's slots
//! (`limits.http_requests_in_flight_host` × `limits.max_instances_per_tool`
//! / `limits.max_instances`), so another Tool's request still leaves at once.
//! Before, its calls held every slot, and the other Tool's request waited
//! until its own call's deadline.

use serde_json::json;
use toolgate::StepResult;
use toolgate::sandbox::executor::Content;
use toolgate_tests::{Lang, TestHost, TestServer, guests, packed};

const SECRET: &str = "share-test-token-8c1f2a";

/// A server on 127.0.0.1 that accepts connections and never answers; how
/// many it accepted. Its connections are held until the process ends.
fn silent_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (port, accepted)
}

/// Tool A's call: 4 requests at once to `target`, withdrawn once `stopped` says so.
async fn flood(run: toolgate::Run<'_>, target: &str, mut stopped: tokio::sync::watch::Receiver<bool>) -> StepResult {
    let args = json!({"op": "flood", "target": target, "count": 4});
    run.call_until("hostile.thief", args, async move {
        let _ = stopped.wait_for(|s| *s).await;
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_tool_whose_server_never_answers_leaves_other_tools_requests_their_slots() {
    let (silent, accepted) = silent_server();
    let api = TestServer::start(SECRET, "http://127.0.0.1:1/");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["plugins", "data", "scratch"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    std::fs::write(d.join("plugins/tracker.wasm"), Lang::Rust.tracker()).unwrap();
    std::fs::write(d.join("tracker.secret"), format!("{SECRET}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("tracker.secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // The host's 4 slots, a Tool's share 2 (2 of 4 instances); the silent
    // server's requests time out long after the test is done.
    let config = format!(
        r#"{preamble}
[limits]
timeout_ms = 30000
http_timeout_ms = 20000
http_requests_in_flight = 4
http_requests_in_flight_host = 4
max_instances = 4
max_instances_per_tool = 2

[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = ["{api}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}

[[grants]]
tools = "hostile.thief"
directories = [
  {{ path = "/data", host = "data", access = "read" }},
  {{ path = "/scratch", host = "scratch", access = "read-write" }},
]
hosts = ["http://127.0.0.1:{silent}"]
credentials = ["tracker"]

[[grants]]
tools = "tracker.*"
hosts = ["{api}"]
credentials = ["tracker"]

[agents.default]
visible = ["*"]
default = "allow"
"#,
        preamble = toolgate_tests::PREAMBLE,
        api = api.origin(),
    );
    std::fs::write(d.join("toolgate.toml"), config).unwrap();
    let host = TestHost::open(dir, "default");
    let configured = toolgate::ToolCapabilityNarrowing::Configured;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Tool A: two calls, each sending 4 requests at once to the silent server.
    let target = format!("http://127.0.0.1:{silent}/never");
    let flood = |run| flood(run, &target, stopped.clone());
    let a1 = host.runtime.start_run(None, configured).await.unwrap();
    let a2 = host.runtime.start_run(None, configured).await.unwrap();
    let b = host.runtime.start_run(None, configured).await.unwrap();
    // Tool B, once Tool A's requests hold what they can: its own request to
    // a server that answers at once, given 5 s (its call withdrawn then).
    let other = async {
        let began = std::time::Instant::now();
        while accepted.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            if began.elapsed() > std::time::Duration::from_secs(20) {
                stop.send(true).unwrap();
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // The rest of Tool A's requests are queued by now (sent at once).
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let args = json!({"base_url": api.origin()});
        let r = b.call_until("tracker.issues", args, tokio::time::sleep(std::time::Duration::from_secs(5))).await;
        // Counted before Tool A's calls are withdrawn: their queued requests
        // then take the slots the withdrawn ones free, and connect.
        let held = accepted.load(std::sync::atomic::Ordering::SeqCst);
        stop.send(true).unwrap();
        Some((r.unwrap(), held))
    };
    let (r1, r2, rb) = tokio::join!(flood(a1), flood(a2), other);
    let Some((rb, held)) = rb else { panic!("Tool A's requests never connected: {r1:?} {r2:?}") };
    let StepResult::Output { content: Content::Json(issues), .. } = &rb else {
        panic!("Tool B's request waited on Tool A's slots: {rb:?}")
    };
    assert_eq!(issues.as_array().map(Vec::len), Some(2), "{issues}");
    assert!(held <= 2, "Tool A held {held} connections, more than its share of 2");
    for r in [r1, r2] {
        assert!(matches!(r, StepResult::Cancelled { .. }), "{r:?}");
    }
}
