//! End-to-end tests: real components, a real host, a real journal.
//! Each module pins the invariants of DESIGN.md it is named after.

use serde_json::json;
use toolgate::StepResult;
use toolgate_tests::{Lang, TestHost};

/// Test bodies that prove something about Tools run once per SDK language:
/// `async fn name(lang: Lang) { … }` becomes the tests `name::rust` and
/// `name::python`, over the Rust and Python examples (same ids, same behaviour).
macro_rules! each_lang {
    ($($(#[$meta:meta])* async fn $name:ident($lang:ident: Lang) $body:block)*) => {$(
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn body($lang: toolgate_tests::Lang) $body
            #[tokio::test]
            async fn rust() {
                body(toolgate_tests::Lang::Rust).await
            }
            #[tokio::test]
            async fn python() {
                body(toolgate_tests::Lang::Python).await
            }
        }
    )*};
}

// After the macro: modules see it by textual order.
mod admission;
mod approval;
mod boundary;
mod capabilities;
mod journal_failure;
mod loading;
mod outbound_share;
mod path;
mod sandbox;
mod skills;
mod state;
mod state_limit;
mod store;

/// The Rust text and notes examples, with a policy exercising every behaviour.
fn text_and_notes(extra: &str) -> TestHost {
    text_and_notes_in(Lang::Rust, extra)
}

/// The text and notes examples in `lang`, with a policy exercising every behaviour.
fn text_and_notes_in(lang: Lang, extra: &str) -> TestHost {
    TestHost::new_in(
        lang,
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
        &[("text.wasm", lang.text()), ("notes.wasm", lang.notes())],
    )
}

async fn call(host: &TestHost, tool: &str, args: serde_json::Value) -> StepResult {
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    run.call(tool, args).await.unwrap()
}

async fn steps(host: &TestHost) -> Vec<toolgate::store::StepRecord> {
    host.runtime.store().steps(None).await.unwrap()
}

each_lang! {
async fn allowed_call_returns_the_tools_output(lang: Lang) {
    let host = text_and_notes_in(lang, "");
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
}
