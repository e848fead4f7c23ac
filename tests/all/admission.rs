//! A call reads its Tool's state once it has a slot to run in, not before it
//! waits for one: calls queued behind a busy Tool run on the state as it is
//! when their turn comes, not on what it was when they arrived.

use serde_json::json;
use toolgate::StepResult;
use toolgate_tests::{TestHost, guests, packed};

use super::call;

/// 64 calls of a counter (a Tool without effects beyond its state) at once
/// under two slots per Tool: every call counts and the count ends at 64.
/// Read before the wait, 62 calls held a count as old as the queue, each
/// conflicted at commit, was queued again behind equally stale reads, and
/// most ended as "make the call again" Tool errors past the retry limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_for_a_slot_count_on_the_state_of_their_turn() {
    let host = TestHost::new(
        "[limits]\nmax_instances_per_tool = 2\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("hostile.wasm", packed(guests::HOSTILE))],
    );
    // Compiled before the race.
    let first = call(&host, "hostile.slow_count", json!({"ms": 0})).await;
    assert!(matches!(first, StepResult::Output { .. }), "{first:?}");
    let runtime = std::sync::Arc::new(host.runtime);
    let calls: Vec<_> = (0..64)
        .map(|_| {
            let r = runtime.clone();
            tokio::spawn(async move {
                let run = r.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
                run.call("hostile.slow_count", json!({"ms": 2})).await.unwrap()
            })
        })
        .collect();
    let mut failed = Vec::new();
    for c in calls {
        match c.await.unwrap() {
            StepResult::Output { .. } => {}
            other => failed.push(other),
        }
    }
    let state = runtime.store().tool_state("default", "hostile.slow_count").await.unwrap();
    assert!(failed.is_empty(), "{} of 64 calls failed (count {}), e.g. {:?}", failed.len(), state["n"], failed[0]);
    assert_eq!(state["n"], "65", "the first call and the 64");
}
