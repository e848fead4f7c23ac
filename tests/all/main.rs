//! End-to-end tests: real components, a real host, a real journal.
//! Each module pins the invariants of DESIGN.md it is named after.

mod approval;
mod boundary;
mod capabilities;
mod loading;
mod path;
mod sandbox;
mod skills;
mod state;
mod store;

use serde_json::json;
use toolgate::StepResult;
use toolgate_tests::{TestHost, guests, packed};

/// The text and notes examples, with a policy exercising every behaviour.
fn text_and_notes(extra: &str) -> TestHost {
    TestHost::new(
        &format!(
            r#"
{extra}
[agents.default]
visible = ["text.*", "notes"]
default = "deny"
rules = [
  {{ pattern = "text.*", behavior = "allow" }},
  {{ pattern = "text.repeat", behavior = "deny" }},
  {{ pattern = "notes(op = \"list\")", behavior = "allow" }},
  {{ pattern = "notes(op = \"add\")", behavior = "ask" }},
  {{ pattern = "notes(op = \"clear\")", behavior = "ask" }},
]
"#
        ),
        &[("text.wasm", packed(guests::TEXT)), ("notes.wasm", packed(guests::NOTES))],
    )
}

async fn call(host: &TestHost, tool: &str, args: serde_json::Value) -> StepResult {
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    run.call(tool, args).await.unwrap()
}

async fn steps(host: &TestHost) -> Vec<toolgate::store::StepRecord> {
    host.runtime.store().steps(None).await.unwrap()
}

#[tokio::test]
async fn allowed_call_returns_the_tools_output() {
    let host = text_and_notes("");
    let r = call(&host, "text.upper", json!({"text": "hello"})).await;
    assert!(
        matches!(&r, StepResult::Output { content: toolgate::sandbox::executor::Content::Json(v), .. } if v == "HELLO"),
        "{r:?}"
    );
    let s = steps(&host).await;
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].verdict, "allow");
    assert_eq!(s[0].result, "\"HELLO\"");
}
