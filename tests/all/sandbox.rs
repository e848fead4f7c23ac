//! The executor's sandbox: deny-by-default WASI, limits, and containment of
//! hostile components — the host keeps serving after each.

use serde_json::json;
use toolgate::StepResult;
use toolgate_tests::{TestHost, guests, packed};

use super::{call, steps};

fn hostile(limits: &str) -> TestHost {
    TestHost::new(
        &format!("[limits]\n{limits}\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n"),
        &[("hostile.wasm", packed(guests::HOSTILE)), ("text.wasm", packed(guests::TEXT))],
    )
}

async fn still_serving(host: &TestHost) {
    let r = call(host, "text.upper", json!({"text": "next"})).await;
    assert!(matches!(&r, StepResult::Output { .. }), "the host serves the next call: {r:?}");
}

fn tool_error(r: &StepResult) -> &str {
    match r {
        StepResult::ToolError { message, .. } => message,
        other => panic!("expected a tool error, got {other:?}"),
    }
}

#[tokio::test]
async fn an_infinite_loop_is_stopped_at_the_deadline() {
    let host = hostile("timeout_ms = 200");
    let r = call(&host, "hostile.loop", json!({})).await;
    assert!(tool_error(&r).contains("200 ms deadline"), "{r:?}");
    still_serving(&host).await;
}

/// A deadline holds however busy the host is: three guests that each spin
/// 700 ms under a 300 ms deadline, on a runtime with two worker threads (as
/// `toolgate serve` has on this kind of machine), are all stopped, and none
/// commits. Before, the deadline was tokio's timer only, which a runtime
/// whose every worker runs guests yielding at each epoch tick looks at late
/// (~840 ms for a 300 ms deadline here): the guests finished and their
/// results and state were committed as if within their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_spinning_on_every_worker_are_stopped_at_their_deadline() {
    let host = std::sync::Arc::new(hostile("timeout_ms = 300"));
    // Compiled before the race.
    assert!(matches!(call(&host, "hostile.slow_count", json!({"ms": 0})).await, StepResult::Output { .. }));
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let h = host.clone();
            tokio::spawn(async move { call(&h, "hostile.slow_count", json!({"ms": 700})).await })
        })
        .collect();
    for c in calls {
        let r = c.await.unwrap();
        assert!(tool_error(&r).contains("300 ms deadline"), "{r:?}");
    }
    let state = host.runtime.store().tool_state("default", "hostile.slow_count").await.unwrap();
    assert_eq!(state["n"], "1", "no stopped call committed");
    still_serving(&host).await;
}

/// An idle host parks its epoch ticker (it does not wake 200 times a
/// second); a guest that spins after that is still interrupted and stopped
/// at its deadline, since a call wakes the ticker before any guest code runs.
#[tokio::test]
async fn after_the_host_idles_an_infinite_loop_is_still_stopped_at_the_deadline() {
    let host = hostile("timeout_ms = 200");
    still_serving(&host).await;
    let executor = host.runtime.executor();
    // Parked: no tick in 100 ms (it parks after a second without a guest).
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let before = executor.epoch_ticks();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if executor.epoch_ticks() == before {
            break;
        }
        assert!(std::time::Instant::now() < end, "the ticker of an idle host never parked");
    }
    // Were the ticker not woken, the spinning guest would never yield and
    // this call never return: a watchdog fails the test instead of hanging it.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        if !flag.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("a spinning guest was not interrupted after the host idled: the ticker stayed parked");
            std::process::exit(101);
        }
    });
    let r = call(&host, "hostile.loop", json!({})).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(tool_error(&r).contains("200 ms deadline"), "{r:?}");
    still_serving(&host).await;
}

/// A call that waits on the host (no guest code runs, so no epoch tick can
/// interrupt it) is stopped by the wall-clock deadline all the same.
#[tokio::test]
async fn a_guest_waiting_on_the_host_is_stopped_at_the_deadline() {
    let host = hostile("timeout_ms = 200");
    // The guest sleeps for an hour: an answer at all means the deadline ended it.
    let r = call(&host, "hostile.sleep", json!({})).await;
    assert!(tool_error(&r).contains("200 ms deadline"), "{r:?}");
    still_serving(&host).await;
}

#[tokio::test]
async fn a_memory_bomb_is_stopped_at_the_memory_limit() {
    let host = hostile("memory_mib = 16");
    let r = call(&host, "hostile.membomb", json!({})).await;
    assert!(tool_error(&r).contains("memory limit of 16 MiB"), "{r:?}");
    still_serving(&host).await;
}

#[tokio::test]
async fn a_panic_is_a_tool_error() {
    let host = hostile("");
    let r = call(&host, "hostile.panic", json!({})).await;
    let m = tool_error(&r);
    assert!(m.contains("crashed") && m.contains("hostile panic"), "{m}");
    still_serving(&host).await;
}

#[tokio::test]
async fn output_over_the_limit_is_a_tool_error() {
    let host = hostile("output_kib = 4");
    let r = call(&host, "hostile.big", json!({"bytes": 10_000})).await;
    assert!(tool_error(&r).contains("more than the 4096 allowed"), "{r:?}");
    let r = call(&host, "hostile.big", json!({"bytes": 100})).await;
    assert!(matches!(r, StepResult::Output { .. }));
}

/// A Tool's error is bounded like its output (a guest, or the MCP adapter
/// relaying a remote's error, can return megabytes of it): cut at a character
/// boundary to `limits.output_kib`, with a note of how much was cut, in what
/// the model reads and in the journal alike. A shorter error is untouched.
#[tokio::test]
async fn an_error_over_the_output_limit_is_cut_to_it() {
    let host = hostile("output_kib = 4");
    // The Tool's text: "x" then 2-byte characters, 1 MiB + 1 bytes in all;
    // the longest prefix within 4096 bytes that ends on a character is 4095.
    let (sent, kept) = (1 + (1 << 20), 4095);
    for (invalid, prefix) in [(false, ""), (true, "invalid arguments: ")] {
        let r = call(&host, "hostile.loud_error", json!({"bytes": 1 << 20, "invalid": invalid})).await;
        let m = tool_error(&r);
        let said = &m[prefix.len()..];
        assert!(m.starts_with(prefix) && said.starts_with("xéé"), "{}", &m[..40]);
        assert_eq!(said[1..kept].chars().filter(|&c| c == 'é').count(), (kept - 1) / 2);
        let note = &said[kept..];
        assert!(note.len() < 200, "the limit plus a short note: {} bytes", m.len());
        assert!(note.contains(&format!("{} bytes cut", sent - kept)) && note.contains("limits.output_kib"), "{note}");
        let journal = steps(&host).await;
        let step = journal.last().unwrap();
        assert!(step.result.len() < 4096 + 200, "journal holds {} bytes", step.result.len());
    }
    let r = call(&host, "hostile.loud_error", json!({"bytes": 4000})).await;
    assert_eq!(tool_error(&r), format!("x{}", "é".repeat(2000)));
    still_serving(&host).await;
}

#[tokio::test]
async fn guest_output_is_captured_bounded_and_attached_to_the_step() {
    let host = hostile("capture_kib = 1");
    let r = call(&host, "hostile.chatter", json!({})).await;
    assert!(matches!(r, StepResult::Output { .. }), "a full capture does not fail the Tool: {r:?}");
    let s = steps(&host).await;
    let captured: serde_json::Value = serde_json::from_str(&s[0].captured).unwrap();
    let stdout = captured["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("{\"jsonrpc\""), "{stdout}");
    assert!(stdout.len() <= 1024);
    assert!(captured["stderr"].as_str().unwrap().contains("list_changed"));
    assert!(captured["dropped"].as_u64().unwrap() > 100_000);
}

#[tokio::test]
async fn ambient_authority_is_absent() {
    let host = hostile("");
    let r = call(&host, "hostile.snoop", json!({})).await;
    let StepResult::Output { content: toolgate::sandbox::executor::Content::Json(v), .. } = &r else { panic!("{r:?}") };
    assert_eq!(v["env"], json!([]), "no environment variables");
    for key in ["root", "passwd", "tcp"] {
        assert!(v[key].as_str().unwrap().starts_with("Err("), "{key}: {}", v[key]);
    }
}

#[tokio::test]
async fn spinning_guests_do_not_starve_other_calls() {
    // One runtime thread: only the executor's yields let the third call in.
    let host = hostile("timeout_ms = 3000");
    let spin = || call(&host, "hostile.loop", json!({}));
    let loops = async { tokio::join!(spin(), spin()) };
    tokio::pin!(loops);
    tokio::select! {
        biased;
        (a, b) = &mut loops => panic!("the loops finished before the other call: {a:?} {b:?}"),
        r = call(&host, "text.upper", json!({"text": "still here"})) => {
            assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
        }
    }
    let (a, b) = loops.await;
    assert!(tool_error(&a).contains("deadline") && tool_error(&b).contains("deadline"));
}

#[tokio::test]
async fn unbounded_recursion_is_a_tool_error() {
    let host = hostile("");
    let r = call(&host, "hostile.recurse", json!({})).await;
    let m = tool_error(&r);
    assert!(m.contains("crashed") && m.contains("stack"), "a stack overflow is a trap, named: {m}");
    still_serving(&host).await;
    let s = steps(&host).await;
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].outcome, toolgate::store::OutcomeKind::ToolError);
}

#[tokio::test]
async fn output_that_breaks_the_declared_output_schema_is_refused() {
    let host = hostile("");
    let r = call(&host, "hostile.liar", json!({})).await;
    let m = tool_error(&r);
    assert!(m.contains("hostile.liar") && m.contains("output schema") && m.contains("object"), "{m}");
    still_serving(&host).await;
    let s = steps(&host).await;
    assert_eq!(s[0].outcome, toolgate::store::OutcomeKind::ToolError);
    assert!(s[0].result.starts_with("the Tool returned malformed output"), "{}", s[0].result);
}

fn output_count(r: &StepResult) -> u64 {
    match r {
        StepResult::Output { content: toolgate::sandbox::executor::Content::Json(v), .. } => {
            v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
        }
        other => panic!("expected output, got {other:?}"),
    }
}

/// Memory slots are reused between calls (the pooling allocator, pages kept
/// resident): whatever a call left in static data, on the heap or in pages it
/// grew must be gone before the next call's instance runs.
#[tokio::test]
async fn a_call_never_sees_memory_an_earlier_call_left_behind() {
    let host = hostile("");
    for round in 0..4 {
        let marker = format!("residue-{round}-7f3a9c1e5b");
        let reversed: String = marker.chars().rev().collect();
        let planted = output_count(&call(&host, "hostile.residue", json!({"plant": marker})).await);
        // 256 heap copies, 16 grown pages, static data: the scan sees them.
        assert!(planted >= 256 + 16 + 1, "round {round}: the planting call finds its own marker {planted} times");
        let seen = output_count(&call(&host, "hostile.residue", json!({"seek_reversed": reversed})).await);
        assert_eq!(seen, 0, "round {round}: the next call's instance saw an earlier call's memory");
    }
    assert_eq!(host.instantiations(), 8, "a fresh instance per call");
}

/// A component that imports an interface no toolgate host provides, with
/// valid metadata: it loads as a file, and fails to link at its first call.
fn imports_a_backdoor() -> Vec<u8> {
    use wasm_encoder::{
        Component, ComponentExportKind, ComponentExportSection, ComponentImportSection, ComponentTypeRef,
        ComponentTypeSection, ComponentValType, InstanceType,
    };
    let mut types = ComponentTypeSection::new();
    let mut api = InstanceType::new();
    api.ty().function().params(std::iter::empty::<(&str, ComponentValType)>()).result(None);
    api.export("open", ComponentTypeRef::Func(0));
    types.instance(&api);
    types.instance(&InstanceType::new());
    let mut imports = ComponentImportSection::new();
    imports.import("evil:backdoor/api", ComponentTypeRef::Instance(0));
    imports.import("evil:backdoor/tool", ComponentTypeRef::Instance(1));
    // It names the tool export, so it passes the load-time shape check.
    let mut exports = ComponentExportSection::new();
    exports.export("toolgate:plugin/tool@0.1.0", ComponentExportKind::Instance, 1, None);
    let mut c = Component::new();
    c.section(&types).section(&imports).section(&exports);
    let mut doc = {
        let tools = toolgate::catalog::descriptor::read_metadata(&packed(guests::TEXT)).unwrap();
        toolgate_sdk::ComponentMetadata::new(tools.iter().take(1).map(|t| t.metadata.clone()).collect())
    };
    doc.tools[0].descriptor.id = "evil.open".into();
    toolgate::catalog::descriptor::embed_metadata(&c.finish(), &doc).unwrap()
}

#[tokio::test]
async fn a_component_importing_what_the_host_lacks_fails_to_link_and_is_marked_unhealthy() {
    let host = TestHost::new(
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("evil.wasm", imports_a_backdoor()), ("text.wasm", packed(guests::TEXT))],
    );
    let refused: Vec<_> = host.runtime.snapshot().catalog().refused().iter().map(|r| r.reason.clone()).collect();
    assert!(host.runtime.list().iter().any(|d| d.id == "evil.open"), "metadata alone loads; nothing ran: {refused:?}");
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    match run.call("evil.open", json!({"text": "x"})).await {
        Err(toolgate::runtime::CallError::Executor(e)) => {
            let m = e.to_string();
            assert!(m.contains("evil.wasm") && m.contains("evil:backdoor/api"), "names the file and the import: {m}");
        }
        other => panic!("expected a link failure, got {other:?}"),
    }
    still_serving(&host).await;
    // Unhealthy from now on: hidden from the listing, blocked with the reason, never linked again.
    assert!(!host.runtime.list().iter().any(|d| d.id == "evil.open"));
    let r = call(&host, "evil.open", json!({"text": "x"})).await;
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("unhealthy")), "{r:?}");
    let s = steps(&host).await;
    let kinds: Vec<_> = s.iter().map(|s| s.outcome).collect();
    use toolgate::store::OutcomeKind as K;
    assert_eq!(kinds, [K::ExecutorError, K::Output, K::Blocked]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturation_queues_calls_instead_of_failing_them() {
    // Two instance slots in all (the pooling allocator has exactly two), one per Tool;
    // three spinning calls hold their slot until the deadline, so everyone else must queue.
    let host = std::sync::Arc::new(hostile("timeout_ms = 300\nmax_instances = 2\nmax_instances_per_tool = 1"));
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..24 {
        let h = host.clone();
        let tool = ["hostile.loop", "text.upper", "text.count", "hostile.big"][if i < 3 { 0 } else { 1 + i % 3 }];
        let args = match tool {
            "hostile.loop" => json!({}),
            "hostile.big" => json!({"bytes": 10}),
            _ => json!({"text": format!("t{i}")}),
        };
        calls.spawn(async move { (tool, call(&h, tool, args).await) });
    }
    let mut done = 0;
    while let Some(r) = calls.join_next().await {
        let (tool, r) = r.unwrap();
        if tool == "hostile.loop" {
            assert!(tool_error(&r).contains("deadline"), "only its own deadline stops it: {r:?}");
        } else {
            assert!(matches!(r, StepResult::Output { .. }), "a saturated host queues, it does not fail: {r:?}");
        }
        done += 1;
    }
    assert_eq!(done, 24);
    for tool in ["hostile.loop", "text.upper", "text.count", "hostile.big"] {
        let (total, per_tool) = host.runtime.executor().peak_instances(tool);
        assert!(total <= 2 && per_tool == 1, "{tool}: peak {total} in total, {per_tool} of the Tool");
    }
    assert_eq!(steps(&host).await.len(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_peak_counts_only_the_calls_that_run() {
    // The Tool may hold 16 slots but the executor has 2: calls holding their
    // Tool's slot while they queue for the executor's run nothing, and the
    // Tool's peak must not count them.
    let host = std::sync::Arc::new(hostile("timeout_ms = 300\nmax_instances = 2\nmax_instances_per_tool = 16"));
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let h = host.clone();
        calls.spawn(async move { call(&h, "hostile.loop", json!({})).await });
    }
    while let Some(r) = calls.join_next().await {
        assert!(tool_error(&r.unwrap()).contains("deadline"));
    }
    let (total, per_tool) = host.runtime.executor().peak_instances("hostile.loop");
    assert_eq!((total, per_tool), (2, 2), "peak {total} in total, {per_tool} of the Tool");
}

/// A Tool in either SDK under tight limits: a component whose memory does not
/// fit the limit is refused before it runs, naming what it needs and the
/// setting (a Python component starts with ~13 MiB, a Rust one with ~1 MiB);
/// its output is bounded the same; and the host serves the next call.
fn text_with_limits(lang: toolgate_tests::Lang, limits: &str) -> TestHost {
    TestHost::new_in(
        lang,
        &format!("[limits]\n{limits}\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n"),
        &[("text.wasm", lang.text())],
    )
}

each_lang! {
async fn a_tool_outside_its_limits_is_refused_naming_the_setting(lang: Lang) {
    let host = text_with_limits(lang, "memory_mib = 1");
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let e = run.call("text.upper", json!({"text": "x"})).await.unwrap_err().to_string();
    assert!(e.contains("MiB of memory to start, more than `limits.memory_mib` = 1"), "{e}");
    assert_eq!(host.instantiations(), 0);

    let host = text_with_limits(lang, "output_kib = 1");
    let r = call(&host, "text.repeat", json!({"text": "abcdefghijklmnopqrstuvwxyz", "times": 100})).await;
    assert!(tool_error(&r).contains("more than the 1024 allowed"), "{r:?}");
    let r = call(&host, "text.repeat", json!({"text": "ab", "times": 3})).await;
    assert!(matches!(&r, StepResult::Output { .. }), "{r:?}");
}
}

/// Invariant 10: a Tool's own error stays a Tool error the model reads when
/// the only failed request of the call ran out of a timeout the Tool itself
/// set shorter than the host's. Before, any transport failure in the call
/// turned the Tool's error into an executor error (not a result: `serve`
/// answered a JSON-RPC error) — a Tool could do that to any error of its own
/// with a 1 ms first-byte timeout against a slow granted host. A
/// destination that fails otherwise (here: refused) still is one.
#[tokio::test]
async fn a_timeout_the_tool_chose_leaves_its_error_a_tool_error() {
    // A granted host that accepts and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // And one where nothing listens (connection refused).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        while let Ok((s, _)) = listener.accept() {
            open.push(s);
            if open.len() == 4 {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_secs(5));
    });
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["plugins", "data", "scratch"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    std::fs::write(d.join("tracker.secret"), "tracker-secret-0123456789\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(d.join("tracker.secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = format!(
        r#"{preamble}
[limits]
timeout_ms = 5000

[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = ["https://tracker.example:443"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}

[[grants]]
tools = "hostile.thief"
directories = [{{ path = "/data", host = "data", access = "read" }}, {{ path = "/scratch", host = "scratch", access = "read-write" }}]
hosts = ["http://localhost:{port}", "http://localhost:{closed}"]
credentials = ["tracker"]

[agents.default]
visible = ["*"]
default = "allow"
"#,
        preamble = toolgate_tests::PREAMBLE,
    );
    std::fs::write(d.join("toolgate.toml"), config).unwrap();
    let host = TestHost::open(dir, "default");
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run
        .call("hostile.thief", json!({"op": "impatient", "target": format!("http://localhost:{port}/")}))
        .await
        .expect("a result the model reads, not an executor error");
    assert!(tool_error(&r).starts_with("gave up: err:"), "{r:?}");
    // A destination that fails otherwise is still the call's transport
    // failure, whatever timeout the Tool set: an executor error naming it.
    let refused =
        run.call("hostile.thief", json!({"op": "impatient", "target": format!("http://localhost:{closed}/")})).await;
    match refused {
        Err(toolgate::runtime::CallError::Executor(
            e @ toolgate::sandbox::executor::ExecutorError::Transport { .. },
        )) => {
            assert!(e.to_string().contains(&closed.to_string()), "{e}")
        }
        other => panic!("a refused connection is the destination's failure: {other:?}"),
    }
    drop(held);
}
