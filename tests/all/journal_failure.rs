//! When the journal fails: a call that ran is never told as one that did
//! not (its effects may have happened), nor one that never started as one
//! that ran; and an approval whose call could not be recorded — or whose
//! journal failed after the claim, before the call ran — does not leave its
//! ticket claimed with nobody working on it: the claim is settled at once,
//! or, once its holder's heartbeat lapsed, by the model's identical retry
//! in any process, which gets the settled outcome.

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
/// Output step, the next `cancels` of a Cancelled one, the next `resolves`
/// resolutions of a ticket and the next `states` reads of a Tool's state;
/// and whose answer is lost for the next `lost_claims` claims (made, but
/// reported failed: PostgreSQL's connection dropped before the answer).
struct FullJournal {
    inner: toolgate::MemoryJournal,
    outputs: AtomicU32,
    cancels: AtomicU32,
    resolves: AtomicU32,
    states: AtomicU32,
    lost_claims: AtomicU32,
}

impl FullJournal {
    fn new(outputs: u32, resolves: u32) -> Arc<Self> {
        Arc::new(FullJournal {
            inner: toolgate::MemoryJournal::new(),
            outputs: AtomicU32::new(outputs),
            cancels: AtomicU32::new(0),
            resolves: AtomicU32::new(resolves),
            states: AtomicU32::new(0),
            lost_claims: AtomicU32::new(0),
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
        if step.outcome == OutcomeKind::Cancelled && fails(&self.cancels) {
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
        let claimed = self.inner.claim_ticket(ticket_id, now, holder).await;
        if fails(&self.lost_claims) {
            return Err(CommitError::Group { path: "db.example:5432".into(), message: "connection reset".into() });
        }
        claimed
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
        if fails(&self.states) {
            return Err(full());
        }
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
    over_with(host, store, toolgate::RuntimeSettings::of(&host.config))
}

fn over_with(
    host: &toolgate_tests::TestHost,
    store: Arc<FullJournal>,
    settings: toolgate::RuntimeSettings,
) -> toolgate::Runtime {
    toolgate::Runtime::new(host.runtime.snapshot().clone(), host.runtime.executor().clone(), store, settings)
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

/// The journal stays failing past the immediate settlement, and the
/// process that approved exits (`toolgate approve` is short-lived): no
/// process remembers the claim. Once its heartbeat lapsed, the model's
/// retry in another process takes it over and settles it as interrupted —
/// no host restart; a takeover whose settling fails lapses in turn, and a
/// later retry settles it.
#[tokio::test]
async fn a_claim_left_by_a_failed_journal_is_settled_by_a_retry_once_it_lapsed() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 100);
    let lease = toolgate::RuntimeSettings { claim_lease_secs: 1, ..toolgate::RuntimeSettings::of(&host.config) };
    let rt = over_with(&host, store.clone(), lease.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let args = json!({"op": "add", "note": "buy milk"});
    let StepResult::Awaiting { ticket, .. } = run.call("notes", args.clone()).await.unwrap() else {
        panic!("notes add asks")
    };
    // Another conversation's ask, approved and left claimed the same way.
    let other_run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let StepResult::Awaiting { ticket: other, .. } =
        other_run.call("notes", json!({"op": "add", "note": "buy eggs"})).await.unwrap()
    else {
        panic!("notes add asks")
    };
    {
        let approving = over_with(&host, store.clone(), lease);
        for t in [&ticket, &other] {
            let e = approving.approve(t, &approver(&approving, t).await).await.unwrap_err();
            assert!(matches!(&e, CallError::RanUnrecorded { .. }), "{e:?}");
        }
    }
    assert_eq!(store.awaiting(&ticket).await.unwrap().unwrap().state, "claimed");

    // Lapsed, the journal still failing: taken over, not settled — the
    // retry says the journal failed, and commits no new ask.
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let steps_before = store.steps(None).await.unwrap().len();
    let still = run.call("notes", args.clone()).await;
    assert!(matches!(&still, Err(CallError::Commit(_))), "{still:?}");
    assert_eq!(store.steps(None).await.unwrap().len(), steps_before);
    assert_eq!(store.awaiting(&ticket).await.unwrap().unwrap().state, "claimed");

    store.resolves.store(0, Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let r = run.call("notes", args).await.unwrap();
    let StepResult::ToolError { message, .. } = &r else { panic!("the retry got {r:?}") };
    assert!(message.starts_with("interrupted:") && message.contains("may have run"), "{message}");
    assert_eq!(store.awaiting(&ticket).await.unwrap().unwrap().state, "resolved");
    // A retry settles its own ask only: the other conversation's lapsed
    // claim is left to its own retry (or the next host's start), not
    // written — or failed on — by this one's call.
    assert_eq!(store.awaiting(&other).await.unwrap().unwrap().state, "claimed");
}

/// A read of the journal after the claim fails (the Tool's state, before
/// the approved call runs): nothing ran, and the claim is settled at once
/// as that — not left claimed, the retry receiving "awaiting approval" for
/// as long as some host did not restart. The next identical call asks anew.
#[tokio::test]
async fn a_read_failing_after_the_claim_settles_it_as_not_run() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 0);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let args = json!({"op": "add", "note": "buy milk"});
    let StepResult::Awaiting { ticket, correlation, .. } = run.call("notes", args.clone()).await.unwrap() else {
        panic!("notes add asks")
    };
    let approval = approver(&rt, &ticket).await;
    store.states.store(1, Ordering::SeqCst);
    let e = rt.approve(&ticket, &approval).await.unwrap_err();
    assert!(matches!(&e, CallError::Commit(_)), "nothing ran: {e:?}");
    assert_eq!(host.instantiations(), 0);
    assert_eq!(store.awaiting(&ticket).await.unwrap().unwrap().state, "resolved", "not left claimed");

    let r = run.call("notes", args.clone()).await.unwrap();
    let StepResult::Blocked { reason, .. } = &r else { panic!("the retry got {r:?}") };
    assert!(reason.contains("nothing ran") && reason.contains(&correlation), "{reason}");
    assert!(!reason.contains(&ticket) && !reason.contains("/srv/secret"), "{reason}");
    let again = run.call("notes", args).await.unwrap();
    assert!(matches!(again, StepResult::Awaiting { .. }), "{again:?}");
}

/// The claim was made but its answer lost (PostgreSQL: the connection
/// dropped before it): the approval fails, and the claim this host may hold
/// is settled as not run — not left claimed by a live host.
#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_settled_as_not_run() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 0);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let args = json!({"op": "add", "note": "buy milk"});
    let StepResult::Awaiting { ticket, .. } = run.call("notes", args.clone()).await.unwrap() else {
        panic!("notes add asks")
    };
    store.lost_claims.store(1, Ordering::SeqCst);
    let e = rt.approve(&ticket, &approver(&rt, &ticket).await).await.unwrap_err();
    assert!(matches!(&e, CallError::Commit(_)), "{e:?}");
    assert_eq!(host.instantiations(), 0);
    assert_eq!(store.awaiting(&ticket).await.unwrap().unwrap().state, "resolved", "not left claimed");
    let r = run.call("notes", args).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("nothing ran")), "{r:?}");
}

/// A claim whose holder died (its heartbeat older than the lease) is taken
/// over and settled by the model's identical retry — no host restart — and
/// the retry receives that: interrupted, it may have run. A claim whose
/// holder is alive is not: the retry is told the request still awaits.
#[tokio::test]
async fn a_claim_of_a_dead_holder_is_settled_by_the_retry() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 0);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let (dead_args, live_args) = (json!({"op": "add", "note": "a"}), json!({"op": "add", "note": "b"}));
    let StepResult::Awaiting { ticket: dead, correlation, .. } = run.call("notes", dead_args.clone()).await.unwrap()
    else {
        panic!("notes add asks")
    };
    let StepResult::Awaiting { ticket: live, correlation: live_request, .. } =
        run.call("notes", live_args.clone()).await.unwrap()
    else {
        panic!("notes add asks")
    };
    let t = toolgate::store::now();
    store.claim_ticket(&dead, t - 3600, "host-dead").await.unwrap().unwrap();
    store.claim_ticket(&live, t, "host-alive").await.unwrap().unwrap();

    let r = run.call("notes", dead_args.clone()).await.unwrap();
    let StepResult::ToolError { message, .. } = &r else { panic!("the retry got {r:?}") };
    assert!(message.starts_with("interrupted:") && message.contains("may have run"), "{message}");
    assert!(message.contains(&correlation) && !message.contains(&dead), "{message}");
    assert_eq!(store.awaiting(&dead).await.unwrap().unwrap().state, "resolved");
    assert_eq!(host.instantiations(), 0, "never run again");
    let again = run.call("notes", dead_args).await.unwrap();
    assert!(matches!(again, StepResult::Awaiting { .. }), "delivered once: {again:?}");

    let r = run.call("notes", live_args).await.unwrap();
    assert!(matches!(&r, StepResult::Awaiting { correlation, .. } if *correlation == live_request), "{r:?}");
    assert_eq!(store.awaiting(&live).await.unwrap().unwrap().state, "claimed");
}

/// A call withdrawn before it started (before its slot) whose step the
/// journal could not commit ran nothing: it is told the journal failed, not
/// that it ran and to check its effects.
#[tokio::test]
async fn a_call_withdrawn_before_it_started_is_not_told_it_ran() {
    let host = text_and_notes("");
    let store = FullJournal::new(0, 0);
    store.cancels.store(1, Ordering::SeqCst);
    let rt = over(&host, store.clone());
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let e = run.call_until("text.upper", json!({"text": "hi"}), std::future::ready(())).await.unwrap_err();
    assert!(matches!(&e, CallError::Commit(_)), "{e:?}");
    assert!(e.model_text().is_none(), "{e:?}");
    assert_eq!(host.instantiations(), 0);
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
