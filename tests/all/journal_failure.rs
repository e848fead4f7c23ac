//! When the journal fails: a call that ran is never told as one that did
//! not (its effects may have happened), and an approved call whose result
//! could not be recorded does not leave its ticket claimed by a live
//! process — the model's identical retry gets the settled outcome.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::json;
use toolgate::store::{
    AskScope, AwaitingRecord, ClaimedTicket, CommitError, NewStep, OutcomeKind, PriorAsk, RunInfo, RunRecord,
    StateChange, StepRecord, StepStore, TicketError,
};
use toolgate::{CallError, StepResult};

use super::text_and_notes;

/// A journal whose disk is full for the next `outputs` commits of an
/// Output step and the next `resolves` resolutions of a ticket.
struct FullJournal {
    inner: toolgate::MemoryJournal,
    outputs: AtomicU32,
    resolves: AtomicU32,
}

impl FullJournal {
    fn new(outputs: u32, resolves: u32) -> Arc<Self> {
        Arc::new(FullJournal {
            inner: toolgate::MemoryJournal::new(),
            outputs: AtomicU32::new(outputs),
            resolves: AtomicU32::new(resolves),
        })
    }
}

/// Takes one failure from `left`, if any are left.
fn fails(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

fn full() -> CommitError {
    CommitError::Group { path: "/srv/secret/journal.db".into(), message: "database or disk is full".into() }
}

#[async_trait::async_trait]
impl StepStore for FullJournal {
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
        if step.outcome == OutcomeKind::Output && fails(&self.outputs) {
            return Err(full());
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
        if fails(&self.resolves) {
            return Err(full());
        }
        self.inner.resolve_ticket(ticket, step, changes, delivered).await
    }
    async fn take_over_stale_claims(
        &self,
        holder: &str,
        now: i64,
        lease_secs: i64,
    ) -> Result<Vec<ClaimedTicket>, CommitError> {
        self.inner.take_over_stale_claims(holder, now, lease_secs).await
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

/// The text-and-notes host's runtime over `store`.
fn over(host: &toolgate_tests::TestHost, store: Arc<FullJournal>) -> toolgate::Runtime {
    toolgate::Runtime::new(
        host.runtime.snapshot().clone(),
        host.runtime.executor().clone(),
        store,
        toolgate::RuntimeSettings::of(&host.config),
    )
}

async fn approver(rt: &toolgate::Runtime, ticket: &str) -> toolgate::Approval {
    let shown = rt.store().awaiting(ticket).await.unwrap().map(|r| r.call_digest());
    toolgate::Approval::by_embedder("test-approver", shown.unwrap_or(toolgate::Digest([0; 32])))
}

/// A call that ran and whose step could not be committed is its own error:
/// it says the call ran, that its result was not recorded and to check its
/// effects before calling again — never that nothing ran, and, as the model
/// reads it, without the journal's path.
#[tokio::test]
async fn a_call_that_ran_but_was_not_recorded_says_it_ran() {
    let host = text_and_notes("");
    let store = FullJournal::new(1, 0);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let e = run.call("text.upper", json!({"text": "hi"})).await.unwrap_err();
    assert!(matches!(&e, CallError::RanUnrecorded { tool, .. } if tool == "text.upper"), "{e:?}");
    let model = e.model_text().expect("the model reads what happened");
    assert!(model.contains("ran") && model.contains("not recorded") && model.contains("check"), "{model}");
    assert!(!model.contains("/srv/secret") && !model.contains("nothing"), "{model}");
    // The operator's text holds the whole cause.
    let whole = e.to_string();
    assert!(whole.contains("ran") && whole.contains("database or disk is full"), "{whole}");
    assert!(store.steps(None).await.unwrap().is_empty(), "nothing was recorded");
}

/// The approved call ran, and resolving its ticket failed once: the ticket
/// is settled at once as interrupted (it may have run), not left claimed by
/// this live process — the model's identical retry gets that outcome, not
/// "awaiting approval", without a restart; the Tool's Commands were not kept.
#[tokio::test]
async fn an_approved_call_whose_resolve_failed_is_settled_not_left_claimed() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 1);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let args = json!({"op": "add", "note": "buy milk"});
    let StepResult::Awaiting { ticket, correlation, .. } = run.call("notes", args.clone()).await.unwrap() else {
        panic!("notes add asks")
    };
    let e = rt.approve(&ticket, &approver(&rt, &ticket).await).await.unwrap_err();
    assert!(matches!(&e, CallError::RanUnrecorded { tool, .. } if tool == "notes"), "{e:?}");
    let record = store.awaiting(&ticket).await.unwrap().unwrap();
    assert_eq!(record.state, "resolved", "not left claimed");

    let r = run.call("notes", args.clone()).await.unwrap();
    let StepResult::ToolError { message, .. } = &r else { panic!("the retry got {r:?}") };
    assert!(message.starts_with("interrupted:") && message.contains("may have run"), "{message}");
    assert!(message.contains(&correlation) && !message.contains(&ticket), "{message}");
    assert!(store.tool_state("default", "notes").await.unwrap().is_empty(), "its Commands were not kept");
    // Delivered once: the next identical call asks anew.
    let again = run.call("notes", args).await.unwrap();
    assert!(matches!(again, StepResult::Awaiting { .. }), "{again:?}");
}

/// The journal stays failing past the immediate settlement: the claim is
/// this process's, no longer worked on — the model's first retry once the
/// journal works again settles it as interrupted and gets that outcome.
#[tokio::test]
async fn a_claim_left_by_a_failed_journal_is_settled_by_the_next_retry() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 100);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let args = json!({"op": "add", "note": "buy milk"});
    let StepResult::Awaiting { ticket, .. } = run.call("notes", args.clone()).await.unwrap() else {
        panic!("notes add asks")
    };
    let e = rt.approve(&ticket, &approver(&rt, &ticket).await).await.unwrap_err();
    assert!(matches!(&e, CallError::RanUnrecorded { .. }), "{e:?}");
    assert_eq!(store.awaiting(&ticket).await.unwrap().unwrap().state, "claimed");

    // Still failing: the retry says the journal failed, and commits no new ask.
    let steps_before = store.steps(None).await.unwrap().len();
    let still = run.call("notes", args.clone()).await;
    assert!(matches!(&still, Err(CallError::Commit(_))), "{still:?}");
    assert_eq!(store.steps(None).await.unwrap().len(), steps_before);

    store.resolves.store(0, Ordering::SeqCst);
    let r = run.call("notes", args).await.unwrap();
    let StepResult::ToolError { message, .. } = &r else { panic!("the retry got {r:?}") };
    assert!(message.starts_with("interrupted:") && message.contains("may have run"), "{message}");
    assert_eq!(store.awaiting(&ticket).await.unwrap().unwrap().state, "resolved");
}

/// A denial whose resolve failed once ran nothing: its error is the
/// journal's (not "ran"), and the denial is still recorded for the retry.
#[tokio::test]
async fn a_denial_whose_resolve_failed_says_nothing_ran_and_is_recorded() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 1);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let args = json!({"op": "add", "note": "x"});
    let StepResult::Awaiting { ticket, .. } = run.call("notes", args.clone()).await.unwrap() else {
        panic!("notes add asks")
    };
    let e = rt.deny(&ticket, "not today", &approver(&rt, &ticket).await).await.unwrap_err();
    assert!(matches!(&e, CallError::Commit(_)), "{e:?}");
    assert_eq!(host.instantiations(), 0);
    let r = run.call("notes", args).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("not today")), "{r:?}");
}
