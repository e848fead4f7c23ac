//! Invariant 8: one commit path. Commands commit atomically with the result;
//! a Command outside the Tool's own scope changes nothing.

use serde_json::json;
use toolgate::StepResult;
use toolgate::sandbox::executor::Content;
use toolgate_tests::{TestHost, guests, packed};

use super::{call, steps};

fn notes_host() -> TestHost {
    TestHost::new(
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("notes.wasm", packed(guests::NOTES)), ("hostile.wasm", packed(guests::HOSTILE))],
    )
}

fn notes(r: &StepResult) -> serde_json::Value {
    match r {
        StepResult::Output { content: Content::Json(v), .. } => v["notes"].clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn commands_commit_with_the_result_and_persist_across_runs_and_restarts() {
    let host = notes_host();
    call(&host, "notes", json!({"op": "add", "note": "a"})).await;
    call(&host, "notes", json!({"op": "add", "note": "b"})).await;
    let host = host.restart();
    assert_eq!(notes(&call(&host, "notes", json!({"op": "list"})).await), json!(["a", "b"]));
    call(&host, "notes", json!({"op": "clear"})).await;
    assert_eq!(notes(&call(&host, "notes", json!({"op": "list"})).await), json!([]));
    let state = host.runtime.store().tool_state("default", "notes").await.unwrap();
    assert!(state.is_empty());
}

#[tokio::test]
async fn a_command_for_another_tools_state_fails_the_call_and_changes_nothing() {
    let host = notes_host();
    call(&host, "notes", json!({"op": "add", "note": "mine"})).await;
    let r = call(&host, "hostile.trespass", json!({})).await;
    let StepResult::ToolError { message, .. } = &r else { panic!("{r:?}") };
    assert!(message.contains("outside its own scope") && message.contains("`notes`"), "{message}");
    let store = host.runtime.store();
    assert_eq!(
        store.tool_state("default", "notes").await.unwrap().get("notes").map(String::as_str),
        Some("[\"mine\"]")
    );
    assert!(
        store.tool_state("default", "hostile.trespass").await.unwrap().is_empty(),
        "its own in-scope Command was not applied either"
    );
    assert_eq!(steps(&host).await.last().unwrap().outcome, toolgate::store::OutcomeKind::ToolError);
}

#[tokio::test]
async fn state_is_scoped_by_agent() {
    let host = TestHost::new(
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n[agents.other]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("notes.wasm", packed(guests::NOTES))],
    );
    call(&host, "notes", json!({"op": "add", "note": "default's"})).await;
    let other = toolgate_tests::runtime_for(&host.config, "other");
    let run = other.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("notes", json!({"op": "list"})).await.unwrap();
    assert_eq!(notes(&r), json!([]));
}
