//! Invariant 8: one commit path. Commands commit atomically with the result;
//! a Command outside the Tool's own scope changes nothing.

use serde_json::json;
use toolgate::StepResult;
use toolgate::sandbox::executor::Content;
use toolgate_tests::{TestHost, guests, packed};

use super::{call, steps};

fn notes_host() -> TestHost {
    notes_host_in(toolgate_tests::Lang::Rust)
}

fn notes_host_in(lang: toolgate_tests::Lang) -> TestHost {
    TestHost::new_in(
        lang,
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("notes.wasm", lang.notes()), ("hostile.wasm", packed(guests::HOSTILE))],
    )
}

fn notes(r: &StepResult) -> serde_json::Value {
    match r {
        StepResult::Output { content: Content::Json(v), .. } => v["notes"].clone(),
        other => panic!("{other:?}"),
    }
}

each_lang! {
async fn commands_commit_with_the_result_and_persist_across_runs_and_restarts(lang: Lang) {
    let host = notes_host_in(lang);
    call(&host, "notes", json!({"op": "add", "note": "a"})).await;
    call(&host, "notes", json!({"op": "add", "note": "b"})).await;
    let host = host.restart();
    assert_eq!(notes(&call(&host, "notes", json!({"op": "list"})).await), json!(["a", "b"]));
    call(&host, "notes", json!({"op": "clear"})).await;
    assert_eq!(notes(&call(&host, "notes", json!({"op": "list"})).await), json!([]));
    let state = host.runtime.store().tool_state("default", "notes").await.unwrap();
    assert!(state.is_empty());
}
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

each_lang! {
async fn state_is_scoped_by_agent(lang: Lang) {
    let host = TestHost::new_in(
        lang,
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n[agents.other]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("notes.wasm", lang.notes())],
    );
    call(&host, "notes", json!({"op": "add", "note": "default's"})).await;
    let other = toolgate_tests::runtime_for(&host.config, "other");
    let run = other.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("notes", json!({"op": "list"})).await.unwrap();
    assert_eq!(notes(&r), json!([]));
}
}

/// Concurrent calls of one stateful Tool never lose an update: each add
/// commits on top of every add committed before it. `notes` has no effect
/// beyond its state, so a call whose state changed under it runs again on
/// the new state (a Tool with effects gets a Tool error instead: the
/// conformance suite's `a_write_from_stale_state_is_refused`); the stored
/// state is the replay of the committed adds, in journal order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_of_one_tool_never_lose_an_update() {
    let host = notes_host();
    let runtime = std::sync::Arc::new(host.runtime);
    let calls: Vec<_> = (0..12)
        .map(|i| {
            let r = runtime.clone();
            tokio::spawn(async move {
                let run = r.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
                (i, run.call("notes", json!({"op": "add", "note": format!("n{i}")})).await.unwrap())
            })
        })
        .collect();
    let (mut added, mut refused) = (0, 0);
    for c in calls {
        match c.await.unwrap() {
            (_, StepResult::Output { .. }) => added += 1,
            (i, StepResult::ToolError { message, .. }) => {
                assert!(message.contains("changed while the call ran"), "call {i}: {message}");
                refused += 1;
            }
            (i, other) => panic!("call {i}: {other:?}"),
        }
    }
    assert_eq!((added, refused), (12, 0), "every add of a Tool without effects commits");
    let steps = runtime.store().steps(None).await.unwrap();
    let mut replay = Vec::new();
    for s in steps.iter().filter(|s| s.outcome == toolgate::store::OutcomeKind::Output) {
        let args: serde_json::Value = serde_json::from_str(&s.arguments).unwrap();
        replay.push(args["note"].clone());
        let shown: serde_json::Value = serde_json::from_str(&s.result).unwrap();
        assert_eq!(shown["notes"], json!(replay), "step {} built on every add committed before it", s.seq);
    }
    assert_eq!(replay.len(), added);
    let state = runtime.store().tool_state("default", "notes").await.unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&state["notes"]).unwrap(), json!(replay));
}

/// One deadline for a call, however often it runs: a Tool without effects
/// whose state a concurrent call changed runs again only within what is left
/// of its first run's `limits.timeout_ms`. Three calls that each spin 600 ms
/// under a 1,000 ms deadline start together; the first commits at ~600 ms,
/// the other two run again at ~600 ms and reach their deadline at ~1,000 ms.
/// Before, each run had a deadline of its own: all three committed (at ~600,
/// ~1,200 and ~1,800 ms), and sixteen such calls held a slot sixteen
/// deadlines long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_run_again_keeps_its_first_deadline() {
    let host = TestHost::new(
        "[limits]\ntimeout_ms = 1000\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("hostile.wasm", packed(guests::HOSTILE))],
    );
    // Compiled and counted once before the race.
    let first = call(&host, "hostile.slow_count", json!({"ms": 0})).await;
    assert!(matches!(first, StepResult::Output { .. }), "{first:?}");
    let runtime = std::sync::Arc::new(host.runtime);
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let r = runtime.clone();
            tokio::spawn(async move {
                let run = r.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
                run.call("hostile.slow_count", json!({"ms": 600})).await.unwrap()
            })
        })
        .collect();
    let (mut counted, mut stopped) = (0, 0);
    for c in calls {
        match c.await.unwrap() {
            StepResult::Output { .. } => counted += 1,
            StepResult::ToolError { message, .. } => {
                assert!(message.contains("1000 ms deadline"), "{message}");
                stopped += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((counted, stopped), (1, 2), "only the first to commit fit in its deadline");
    let state = runtime.store().tool_state("default", "hostile.slow_count").await.unwrap();
    assert_eq!(state["n"], "2");
}

/// `limits.state_kib` bounds what one Tool keeps for one agent (every call
/// of the Tool reads it whole): a call whose Commands would grow it past the
/// limit is a Tool error naming the setting, and nothing changes; a call
/// that shrinks it, or keeps it within, commits.
#[tokio::test]
async fn a_tools_state_cannot_grow_past_limits_state_kib() {
    let host = TestHost::new(
        "[limits]\nstate_kib = 1\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("notes.wasm", packed(guests::NOTES))],
    );
    let note = "n".repeat(300);
    for _ in 0..3 {
        assert!(matches!(call(&host, "notes", json!({"op": "add", "note": note})).await, StepResult::Output { .. }));
    }
    let r = call(&host, "notes", json!({"op": "add", "note": note})).await;
    match &r {
        StepResult::ToolError { message, .. } => {
            assert!(message.contains("limits.state_kib") && message.contains("nothing was changed"), "{message}")
        }
        other => panic!("the fourth note went over 1 KiB: {other:?}"),
    }
    assert_eq!(notes(&call(&host, "notes", json!({"op": "list"})).await).as_array().unwrap().len(), 3);
    let state = host.runtime.store().tool_state("default", "notes").await.unwrap();
    assert!(state.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() <= 1024, "{state:?}");
    // Shrinking is always allowed.
    assert!(matches!(call(&host, "notes", json!({"op": "clear"})).await, StepResult::Output { .. }));
    assert_eq!(notes(&call(&host, "notes", json!({"op": "list"})).await), json!([]));
}
