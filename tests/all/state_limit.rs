//! `limits.state_kib` holds against a Tool's state as it is when a call's
//! step commits, not as the call read it: a concurrent call's cache key
//! (`cache/…`, no part of the compare-and-set) that commits between the
//! read and the commit counts too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;
use toolgate::StepResult;
use toolgate::store::{
    AskScope, AwaitingRecord, ClaimedTicket, CommitError, NewStep, OutcomeKind, PriorAsk, RunInfo, RunRecord,
    StateChange, StepRecord, StepStore, TicketError,
};
use toolgate_tests::{TestHost, guests, packed};

/// A journal where, just before the first step that changes state commits,
/// a concurrent call of the same Tool from the same (empty) read commits a
/// cache key of its own that fits the limit alone.
struct RacedJournal {
    inner: toolgate::MemoryJournal,
    raced: AtomicBool,
}

#[async_trait::async_trait]
impl StepStore for RacedJournal {
    async fn begin_run(&self, run: &RunRecord<'_>) -> Result<(), CommitError> {
        self.inner.begin_run(run).await
    }
    async fn run(&self, run_id: &str) -> Result<Option<RunInfo>, CommitError> {
        self.inner.run(run_id).await
    }
    async fn commit_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
        if !changes.is_empty() && !self.raced.swap(true, Ordering::SeqCst) {
            let read = BTreeMap::new();
            let other = NewStep { call_id: "concurrent", state_read: Some(&read), ..step.clone() };
            let key = StateChange { key: "cache/concurrent".into(), value: Some(format!("\"{}\"", "c".repeat(600))) };
            self.inner.commit_step(&other, &[key], None).await.expect("the concurrent call's key fits alone");
        }
        self.inner.commit_step(step, changes, awaiting).await
    }
    async fn claim_ticket(
        &self,
        ticket_id: &str,
        now: i64,
        holder: &str,
    ) -> Result<Result<ClaimedTicket, TicketError>, CommitError> {
        self.inner.claim_ticket(ticket_id, now, holder).await
    }
    async fn heartbeat(&self, holder: &str, now: i64) -> Result<(), CommitError> {
        self.inner.heartbeat(holder, now).await
    }
    async fn resolve_ticket(
        &self,
        ticket: ClaimedTicket,
        step: &NewStep<'_>,
        changes: &[StateChange],
        delivered: bool,
    ) -> Result<Result<i64, TicketError>, CommitError> {
        self.inner.resolve_ticket(ticket, step, changes, delivered).await
    }
    async fn take_over_stale_claims(
        &self,
        holder: &str,
        now: i64,
        lease_secs: i64,
        only: Option<&str>,
    ) -> Result<Vec<ClaimedTicket>, CommitError> {
        self.inner.take_over_stale_claims(holder, now, lease_secs, only).await
    }
    async fn prior_ask(
        &self,
        scope: AskScope<'_>,
        tool_id: &str,
        argument_digest: &str,
    ) -> Result<Option<PriorAsk>, CommitError> {
        self.inner.prior_ask(scope, tool_id, argument_digest).await
    }
    async fn deliver(&self, ticket_id: &str, step: &NewStep<'_>) -> Result<Option<i64>, CommitError> {
        self.inner.deliver(ticket_id, step).await
    }
    async fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError> {
        self.inner.tool_state(agent, tool_id).await
    }
    async fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        self.inner.steps(run_id).await
    }
    async fn awaiting(&self, ticket_id: &str) -> Result<Option<AwaitingRecord>, CommitError> {
        self.inner.awaiting(ticket_id).await
    }
    async fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError> {
        self.inner.pending().await
    }
}

/// A note of ~370 counted bytes fits the empty state the call read under
/// `state_kib = 1`; with the concurrent call's ~670-byte cache key
/// committed meanwhile it does not: the call ends as the Tool error of the
/// limit, committed with no change, and the note is not kept.
#[tokio::test]
async fn a_cache_key_committed_after_the_read_counts_toward_the_limit() {
    let host = TestHost::new(
        "[limits]\nstate_kib = 1\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("notes.wasm", packed(guests::NOTES))],
    );
    let store = Arc::new(RacedJournal { inner: toolgate::MemoryJournal::new(), raced: AtomicBool::new(false) });
    let runtime = toolgate::Runtime::new(
        host.runtime.snapshot().clone(),
        host.runtime.executor().clone(),
        store.clone(),
        toolgate::RuntimeSettings::of(&host.config),
    );
    let run = runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("notes", json!({"op": "add", "note": "n".repeat(300)})).await.unwrap();
    let StepResult::ToolError { message, .. } = &r else { panic!("the note passed the limit: {r:?}") };
    assert!(
        message.starts_with("`notes` returned Commands that would grow its state to 2 KiB, over limits.state_kib (1); nothing was changed —"),
        "{message}"
    );
    let state = store.tool_state("default", "notes").await.unwrap();
    assert_eq!(state.keys().collect::<Vec<_>>(), ["cache/concurrent"], "the note was not kept");
    let steps = store.steps(None).await.unwrap();
    let last = steps.last().unwrap();
    assert_eq!((last.outcome, &last.result), (OutcomeKind::ToolError, message));
}
