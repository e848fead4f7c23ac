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

#[tokio::test]
async fn guest_output_is_captured_bounded_and_attached_to_the_step() {
    let host = hostile("capture_kib = 1");
    let r = call(&host, "hostile.chatter", json!({})).await;
    assert!(matches!(r, StepResult::Output { .. }), "a full capture does not fail the Tool: {r:?}");
    let s = steps(&host);
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
    let StepResult::Output { content: toolgate::executor::Content::Json(v), .. } = &r else { panic!("{r:?}") };
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
