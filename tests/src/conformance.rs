//! The store conformance suite: the semantics every [`StepStore`] backend
//! must have, as one set of tests run against each implementation.
//!
//! A backend implements [`Backend`] (make an empty journal, open another
//! handle onto one, make one at the previous schema version), and a test
//! module runs the whole suite with [`conformance_suite!`](crate::conformance_suite).
//! Properties: a step and its Commands commit atomically; a failing write
//! changes nothing; a run keeps its restriction; a ticket is claimed exactly
//! once by threads, by handles and by processes racing for it; expired, used
//! and unknown tickets are refused without change; a resolution records who
//! approved and changes exactly one claimed row; a claim is taken over only
//! after its holder's heartbeat lapsed (never a live holder's), and the old
//! holder's late result is refused; a decided result is delivered to a retry
//! once; concurrent writes are all durable once acknowledged (group commit);
//! a journal written by the previous schema version opens with its data
//! intact.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use toolgate::Digest;
use toolgate::store::{
    ApprovedBy, AskScope, AwaitingRecord, NewStep, OutcomeKind, RunRecord, StateChange, StepStore, TicketError,
    Verdict, now,
};

/// The host instance the suite claims as.
const ME: &str = "host-conformance";

/// One journal under test, and what keeps it alive (a temporary directory, a database).
pub struct Journal {
    /// The store.
    pub store: Arc<dyn StepStore>,
    /// What opens it again from another handle or process (a config's
    /// `store` value); `None` for a journal that lives in one handle only.
    pub locator: Option<String>,
    /// Dropped with the journal.
    pub keep: Box<dyn Any + Send + Sync>,
}

/// A store implementation under test.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Whether this backend can run here (a server it needs is configured);
    /// the suite skips, saying so, when it cannot.
    fn available(&self) -> bool {
        true
    }
    /// A fresh, empty journal.
    async fn create(&self) -> Journal;
    /// Another handle on the journal at `locator`, as another host would open it.
    async fn open(&self, locator: &str) -> Arc<dyn StepStore>;
    /// A journal holding [`legacy_fixture`] as the previous schema version
    /// wrote it, not yet opened by this version; `None` if there is none.
    async fn previous_version(&self) -> Option<Legacy>;
}

/// A journal an older version wrote: where it is, and what keeps it alive.
pub struct Legacy {
    /// What opens it (a config's `store` value).
    pub locator: String,
    /// Dropped with the journal.
    pub keep: Box<dyn Any + Send + Sync>,
}

/// What a previous-version journal holds: two steps of run `run-old` (the
/// second an ask with the pending ticket `t-old`), and Tool state `k = "v"`
/// of agent `main`, Tool `notes.add`.
pub fn legacy_fixture() -> &'static str {
    "run-old: c-old-1 output, c-old-2 awaiting t-old (pending, expires far ahead); state main/notes.add k=\"v\""
}

/// The rows of [`legacy_fixture`], as SQL both backends' previous schemas take.
fn legacy_rows() -> String {
    format!(
        "INSERT INTO runs (run_id, agent, narrowing, started_at) VALUES ('run-old', 'main', 'configured', 1);
         INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id, committed_at)
           VALUES ('run-old', 'c-old-1', 'notes.add', '{{}}', 'allow', 'output', 'ok', '{{}}', NULL, 1),
                  ('run-old', 'c-old-2', 'notes.add', '{{}}', 'ask', 'awaiting', 'awaiting', '{{}}', 't-old', 2);
         INSERT INTO awaiting (ticket_id, run_id, agent, call_id, tool_id, arguments, argument_digest,
                               component_digest, expires_at, state)
           VALUES ('t-old', 'run-old', 'main', 'c-old-2', 'notes.add', '{{}}', '{}', '{}', {}, 'pending');
         INSERT INTO tool_state (agent, tool_id, key, value) VALUES ('main', 'notes.add', 'k', '\"v\"');",
        "d".repeat(64),
        Digest::of(b"component").hex(),
        i64::MAX
    )
}

fn step<'a>(call_id: &'a str, outcome: OutcomeKind) -> NewStep<'a> {
    NewStep {
        run_id: "run-1",
        agent: "main",
        call_id,
        tool_id: "notes.add",
        arguments: r#"{"text":"hi"}"#,
        verdict: Verdict::Allow,
        outcome,
        result: "ok",
        captured: "{}",
        ticket: None,
        structured: false,
        approved_by: None,
        state_read: None,
        state_limit_kib: None,
    }
}

fn set(key: &str, value: &str) -> StateChange {
    StateChange { key: key.into(), value: Some(value.into()) }
}

fn awaiting(ticket: &str, call_id: &str, expires_at: i64) -> AwaitingRecord {
    AwaitingRecord {
        ticket_id: ticket.into(),
        run_id: "run-1".into(),
        agent: "main".into(),
        call_id: call_id.into(),
        tool_id: "notes.add".into(),
        arguments: r#"{"text":"hi"}"#.into(),
        argument_digest: "d".repeat(64),
        component_digest: Digest::of(b"component"),
        expires_at,
        requested_at: 1,
        state: "pending".into(),
        restriction: None,
        approvers: Some(r#"{"keys":[],"terminal":true,"mcp_elicitation":true}"#.into()),
    }
}

async fn state_of(s: &dyn StepStore, ticket: &str) -> Option<String> {
    s.awaiting(ticket).await.unwrap().map(|a| a.state)
}

/// A step and its state changes commit together; state is scoped by agent and Tool.
pub async fn a_step_and_its_changes_commit_together(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    s.begin_run(&RunRecord { run_id: "run-1", agent: "main", narrowing: "configured", restriction: None })
        .await
        .unwrap();
    let restricted =
        RunRecord { run_id: "run-r", agent: "main", narrowing: "deny-all", restriction: Some("{\"hosts\":[]}") };
    s.begin_run(&restricted).await.unwrap();
    // Begun again (a run continued before its first step): the first begin stays.
    s.begin_run(&RunRecord { restriction: None, narrowing: "configured", ..restricted }).await.unwrap();
    let seq = s.commit_step(&step("c1", OutcomeKind::Output), &[set("a", "1"), set("b", "2")], None).await.unwrap();
    let removal = StateChange { key: "a".into(), value: None };
    let seq2 = s.commit_step(&step("c2", OutcomeKind::Output), &[removal, set("b", "3")], None).await.unwrap();
    assert!(seq2 > seq);
    let state = s.tool_state("main", "notes.add").await.unwrap();
    assert_eq!(state, BTreeMap::from([("b".to_owned(), "3".to_owned())]));
    assert!(s.tool_state("other", "notes.add").await.unwrap().is_empty());
    assert!(s.tool_state("main", "notes.list").await.unwrap().is_empty());
    let steps = s.steps(Some("run-1")).await.unwrap();
    assert_eq!(steps.iter().map(|s| s.call_id.as_str()).collect::<Vec<_>>(), ["c1", "c2"]);
    assert_eq!(steps[0].seq, seq);
    assert_eq!((steps[0].outcome, steps[0].verdict.as_str()), (OutcomeKind::Output, "allow"));
    assert!(s.steps(Some("run-2")).await.unwrap().is_empty());
    assert_eq!(s.steps(None).await.unwrap().len(), 2);
    assert_eq!(s.skill_activations("run-1").await.unwrap(), [("notes.add".to_owned(), None)]);
    // A Skill's output journals the allowed-tools it narrowed its run to:
    // each distinct list once, in journal order; a malformed one allows nothing.
    let skill = |call_id, captured| NewStep { tool_id: "skill.x", captured, ..step(call_id, OutcomeKind::Output) };
    s.commit_step(&skill("k1", r#"{"stdout":"","narrowed_to":["text.*"]}"#), &[], None).await.unwrap();
    s.commit_step(&skill("k2", r#"{"stdout":"","narrowed_to":["text.*"]}"#), &[], None).await.unwrap();
    s.commit_step(&skill("k3", r#"{"narrowed_to":"everything"}"#), &[], None).await.unwrap();
    s.commit_step(&NewStep { tool_id: "skill.y", ..step("k4", OutcomeKind::ToolError) }, &[], None).await.unwrap();
    assert_eq!(
        s.skill_activations("run-1").await.unwrap(),
        [
            ("notes.add".to_owned(), None),
            ("skill.x".to_owned(), Some(r#"["text.*"]"#.to_owned())),
            ("skill.x".to_owned(), Some("[]".to_owned())),
        ]
    );
    let run = s.run("run-r").await.unwrap().expect("a begun run is recorded");
    assert_eq!((run.agent.as_str(), run.narrowing.as_str()), ("main", "deny-all"));
    assert_eq!(run.restriction.as_deref(), Some("{\"hosts\":[]}"), "the restriction is kept with the run");
    assert_eq!(s.run("run-1").await.unwrap().unwrap().restriction, None);
    assert_eq!(s.run("run-none").await.unwrap(), None);
}

/// A write that fails (a duplicate ticket or call id) leaves no step, no
/// change and no Awaiting record behind; the journal goes on working.
pub async fn a_failed_write_rolls_back_step_and_changes(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    // The restriction the call asked under is kept with its ticket.
    let first = AwaitingRecord { restriction: Some(r#"[{"hosts":[]}]"#.into()), ..awaiting("t-1", "c1", i64::MAX) };
    s.commit_step(&step("c1", OutcomeKind::Awaiting), &[set("k", "before")], Some(&first)).await.unwrap();
    let before_steps = s.steps(None).await.unwrap();
    let before_state = s.tool_state("main", "notes.add").await.unwrap();
    for dup in [awaiting("t-1", "c2", i64::MAX), awaiting("t-2", "c1", i64::MAX)] {
        let r = s
            .commit_step(
                &step("c2", OutcomeKind::Awaiting),
                &[set("k", "after"), set("new", "x"), StateChange { key: "k".into(), value: None }],
                Some(&dup),
            )
            .await;
        assert!(r.is_err(), "a duplicate ticket or call id must fail: {r:?}");
        assert_eq!(s.steps(None).await.unwrap(), before_steps, "the step must not be visible");
        assert_eq!(s.tool_state("main", "notes.add").await.unwrap(), before_state, "no change may be visible");
    }
    let pending = s.pending().await.unwrap();
    assert_eq!(pending, [first]);
    s.commit_step(&step("c3", OutcomeKind::Output), &[set("k", "later")], None).await.unwrap();
    assert_eq!(s.tool_state("main", "notes.add").await.unwrap()["k"], "later");
}

/// A pending ticket is claimed once; expired ones (at and past expiry),
/// used and unknown ones are refused and left as they were.
pub async fn tickets_are_claimed_once(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    let now = 1_000;
    s.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("live", "c1", now + 1))).await.unwrap();
    s.commit_step(&step("c2", OutcomeKind::Awaiting), &[], Some(&awaiting("stale", "c2", now))).await.unwrap();
    s.commit_step(&step("c3", OutcomeKind::Awaiting), &[], Some(&awaiting("old", "c3", now - 60))).await.unwrap();
    assert_eq!(s.pending().await.unwrap().len(), 3);

    let claimed = s.claim_ticket("live", now, ME).await.unwrap().expect("a pending ticket is claimable");
    assert_eq!((claimed.ticket_id(), claimed.call_id(), claimed.tool_id()), ("live", "c1", "notes.add"));
    assert_eq!(claimed.argument_digest(), "d".repeat(64));
    assert_eq!(claimed.component_digest(), &Digest::of(b"component"));
    assert_eq!(claimed.record().state, "claimed");
    assert_eq!(state_of(s, "live").await.as_deref(), Some("claimed"));
    assert_eq!(s.claim_ticket("live", now, ME).await.unwrap().unwrap_err(), TicketError::Used("live".into()));
    for t in ["stale", "old"] {
        assert_eq!(s.claim_ticket(t, now, ME).await.unwrap().unwrap_err(), TicketError::Expired(t.into()));
        assert_eq!(state_of(s, t).await.as_deref(), Some("pending"));
    }
    let pending: Vec<String> = s.pending().await.unwrap().into_iter().map(|a| a.ticket_id).collect();
    assert_eq!(pending, ["stale", "old"]);
    for t in ["nope", "", "live' OR '1'='1"] {
        assert_eq!(s.claim_ticket(t, now, ME).await.unwrap().unwrap_err(), TicketError::Unknown(t.into()));
    }
    assert_eq!(state_of(s, "live").await.as_deref(), Some("claimed"));
}

/// Resolving a claimed ticket commits its step and changes with it and
/// records who approved; it cannot be claimed again.
pub async fn resolving_a_ticket_commits_its_step_and_changes(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    s.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t", "c1", i64::MAX))).await.unwrap();
    let claimed = s.claim_ticket("t", now(), ME).await.unwrap().unwrap();
    assert_eq!(claimed.holder(), ME);
    let by = ApprovedBy { principal: "ed25519:approver".into(), channel: "signature".into(), at: 42 };
    let mut resolving = step("c1", OutcomeKind::Output);
    resolving.approved_by = Some(&by);
    resolving.structured = true;
    resolving.result = "{\"n\":1}";
    let seq = s.resolve_ticket(claimed, &resolving, &[set("n", "1")], false).await.unwrap().unwrap();
    assert_eq!(state_of(s, "t").await.as_deref(), Some("resolved"));
    assert_eq!(s.tool_state("main", "notes.add").await.unwrap()["n"], "1");
    let steps = s.steps(None).await.unwrap();
    let resolved = steps.iter().find(|s| s.seq == seq).unwrap();
    assert_eq!((resolved.ticket_id.as_deref(), resolved.outcome), (Some("t"), OutcomeKind::Output));
    assert_eq!(resolved.approved_by.as_ref(), Some(&by), "the approver is recorded on the step");
    assert!(resolved.structured);
    assert_eq!((steps[0].ticket_id.as_deref(), steps[0].outcome), (Some("t"), OutcomeKind::Awaiting));
    assert_eq!(steps[0].approved_by, None);
    assert_eq!(s.claim_ticket("t", now(), ME).await.unwrap().unwrap_err(), TicketError::Used("t".into()));
    assert!(s.pending().await.unwrap().is_empty());
}

/// A claim is taken over only once its holder's heartbeat is older than the
/// lease — never while the holder beats — and then the old holder's late
/// result is refused: one resolution, never a second step.
pub async fn claims_are_taken_over_only_from_a_holder_whose_heartbeat_lapsed(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    let t0 = now();
    let lease = 60;
    s.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t1", "c1", t0 + 6000))).await.unwrap();
    s.commit_step(&step("c2", OutcomeKind::Awaiting), &[], Some(&awaiting("t2", "c2", t0 + 6000))).await.unwrap();
    s.commit_step(&step("c3", OutcomeKind::Awaiting), &[], Some(&awaiting("t3", "c3", t0 + 6000))).await.unwrap();
    let old = s.claim_ticket("t1", t0, "host-old").await.unwrap().unwrap();
    s.claim_ticket("t3", t0, "host-old").await.unwrap().unwrap();
    // Within the lease: nothing to take.
    assert!(s.take_over_stale_claims(ME, t0 + lease - 1, lease, None).await.unwrap().is_empty());
    // The holder keeps beating: alive long after its claim.
    s.heartbeat("host-old", t0 + 500).await.unwrap();
    assert!(s.take_over_stale_claims(ME, t0 + 500 + lease - 1, lease, None).await.unwrap().is_empty());
    assert_eq!(state_of(s, "t1").await.as_deref(), Some("claimed"));
    // A holder never takes over its own claims.
    assert!(s.take_over_stale_claims("host-old", t0 + 10_000, lease, None).await.unwrap().is_empty());
    // Silent past the lease: taken over once, by one host — and a take-over
    // of one ticket (a retry settling its own ask) takes only that one.
    let taken = s.take_over_stale_claims(ME, t0 + 500 + lease + 1, lease, Some("t1")).await.unwrap();
    assert_eq!(taken.iter().map(|t| t.ticket_id()).collect::<Vec<_>>(), ["t1"]);
    assert_eq!(taken[0].holder(), ME);
    let again = s.take_over_stale_claims("host-third", t0 + 500 + lease + 2, lease, None).await.unwrap();
    assert_eq!(
        again.iter().map(|t| t.ticket_id()).collect::<Vec<_>>(),
        ["t3"],
        "the new holder's claim is fresh; the other lapsed claim was left to this take-over"
    );
    assert_eq!(state_of(s, "t2").await.as_deref(), Some("pending"), "pending tickets are not claims");
    let mut interrupted = step("c1", OutcomeKind::ExecutorError);
    interrupted.result = "interrupted";
    let seq = s.resolve_ticket(taken.into_iter().next().unwrap(), &interrupted, &[], false).await.unwrap().unwrap();
    // The old holder wakes up with a result: refused, nothing written.
    let before = s.steps(None).await.unwrap();
    let late = s.resolve_ticket(old, &step("c1", OutcomeKind::Output), &[set("late", "1")], false).await.unwrap();
    assert_eq!(late, Err(TicketError::Settled("t1".into())));
    assert_eq!(s.steps(None).await.unwrap(), before, "no second step");
    assert!(s.tool_state("main", "notes.add").await.unwrap().is_empty(), "no late change");
    assert_eq!(before.last().unwrap().seq, seq);
    assert_eq!(s.claim_ticket("t1", t0, ME).await.unwrap().unwrap_err(), TicketError::Used("t1".into()));
}

/// The latest ask for an exact call is found by run (or by the agent's
/// stateless requests), Tool and argument digest; once decided, its result is delivered to one retry only.
pub async fn a_decided_result_is_delivered_once(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    let digest = "d".repeat(64);
    assert!(s.prior_ask(AskScope::Run("run-1"), "notes.add", &digest).await.unwrap().is_none());
    s.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t", "c1", i64::MAX))).await.unwrap();
    let prior = s.prior_ask(AskScope::Run("run-1"), "notes.add", &digest).await.unwrap().expect("the ask is found");
    assert_eq!((prior.record.ticket_id.as_str(), prior.record.state.as_str()), ("t", "pending"));
    assert!(!prior.delivered && prior.resolution.is_none());
    assert!(s.prior_ask(AskScope::Run("run-2"), "notes.add", &digest).await.unwrap().is_none(), "another run");
    // A principal's stateless requests to the agent: only runs that serve one of
    // that principal's, never a conversation's ask, also when a conversation
    // asked the same call after them; no other agent's, no other principal's.
    let stateless = |agent| s.prior_ask(AskScope::StatelessRequests { agent, runs: "req-a1-" }, "notes.add", &digest);
    assert!(stateless("main").await.unwrap().is_none(), "a conversation's ask");
    let in_run = |run: &'static str, call, ticket: &str| {
        let mut step = step(call, OutcomeKind::Awaiting);
        step.run_id = run;
        let mut record = awaiting(ticket, call, i64::MAX);
        record.run_id = run.into();
        (step, record)
    };
    for (run, call, ticket) in [("req-a1-1", "s1", "s"), ("run-9", "c9", "t9"), ("req-b2-1", "s2", "s2")] {
        let (step, record) = in_run(run, call, ticket);
        s.commit_step(&step, &[], Some(&record)).await.unwrap();
    }
    let found = stateless("main").await.unwrap().expect("a stateless request's ask");
    assert_eq!(found.record.ticket_id, "s");
    assert!(stateless("other").await.unwrap().is_none(), "another agent");
    let of = |runs| s.prior_ask(AskScope::StatelessRequests { agent: "main", runs }, "notes.add", &digest);
    assert_eq!(of("req-b2-").await.unwrap().map(|p| p.record.ticket_id).as_deref(), Some("s2"));
    assert!(of("req-c3-").await.unwrap().is_none(), "another principal");
    // A prefix is text, not a pattern: LIKE's wildcards match nothing here.
    assert!(of("req-%").await.unwrap().is_none() && of("req-__-").await.unwrap().is_none(), "a pattern");
    assert!(
        s.prior_ask(AskScope::Run("run-1"), "notes.add", &"e".repeat(64)).await.unwrap().is_none(),
        "other arguments"
    );
    // Not decided yet: nothing to deliver.
    assert_eq!(s.deliver("t", &step("retry-0", OutcomeKind::Output)).await.unwrap(), None);
    let claimed = s.claim_ticket("t", now(), ME).await.unwrap().unwrap();
    let mut out = step("c1", OutcomeKind::Output);
    out.result = "done";
    let resolved_seq = s.resolve_ticket(claimed, &out, &[], false).await.unwrap().unwrap();
    let prior = s.prior_ask(AskScope::Run("run-1"), "notes.add", &digest).await.unwrap().unwrap();
    assert_eq!(prior.record.state, "resolved");
    let resolution = prior.resolution.expect("the resolving step");
    assert_eq!((resolution.seq, resolution.result.as_str()), (resolved_seq, "done"));
    let seq = s.deliver("t", &step("retry-1", OutcomeKind::Output)).await.unwrap().expect("delivered to one retry");
    assert!(seq > resolved_seq);
    assert_eq!(s.deliver("t", &step("retry-2", OutcomeKind::Output)).await.unwrap(), None, "once");
    assert!(s.prior_ask(AskScope::Run("run-1"), "notes.add", &digest).await.unwrap().unwrap().delivered);
    let steps = s.steps(None).await.unwrap();
    assert_eq!(steps.iter().filter(|s| s.call_id.starts_with("retry")).count(), 1);
    // A result that went back in the conversation is not delivered again.
    s.commit_step(&step("c2", OutcomeKind::Awaiting), &[], Some(&awaiting("u", "c2", i64::MAX))).await.unwrap();
    let claimed = s.claim_ticket("u", now(), ME).await.unwrap().unwrap();
    s.resolve_ticket(claimed, &step("c2", OutcomeKind::Output), &[], true).await.unwrap().unwrap();
    assert_eq!(s.deliver("u", &step("retry-3", OutcomeKind::Output)).await.unwrap(), None);
}

/// Everything acknowledged is there when the journal is opened again.
pub async fn a_journal_survives_reopening(b: &dyn Backend) {
    let j = b.create().await;
    let Some(locator) = j.locator.clone() else { return };
    j.store
        .commit_step(&step("c1", OutcomeKind::Awaiting), &[set("k", "v")], Some(&awaiting("t", "c1", i64::MAX)))
        .await
        .unwrap();
    let Journal { store, keep, .. } = j;
    drop(store);
    let again = b.open(&locator).await;
    assert_eq!(again.tool_state("main", "notes.add").await.unwrap()["k"], "v");
    assert_eq!(again.pending().await.unwrap()[0].ticket_id, "t");
    assert!(again.claim_ticket("t", now(), ME).await.unwrap().is_ok());
    drop(keep);
}

/// Two handles (as two hosts) racing for one ticket: exactly one wins, the
/// other is told it was used. Twenty rounds.
pub async fn handles_racing_for_one_ticket_yield_one_winner(b: &dyn Backend) {
    for round in 0..20 {
        let j = b.create().await;
        let Some(locator) = j.locator.clone() else { return };
        let ticket = format!("ticket-{round}");
        j.store
            .commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting(&ticket, "c1", i64::MAX)))
            .await
            .unwrap();
        let (a, c) = (b.open(&locator).await, b.open(&locator).await);
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let race = |s: Arc<dyn StepStore>| {
            let (ticket, barrier) = (ticket.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                s.claim_ticket(&ticket, now(), ME).await.unwrap().map(|c| c.ticket_id().to_owned())
            })
        };
        let (ra, rc) = (race(a), race(c));
        let results = [ra.await.unwrap(), rc.await.unwrap()];
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "round {round}: {results:?}");
        assert!(results.contains(&Err(TicketError::Used(ticket.clone()))), "round {round}: {results:?}");
    }
}

/// The environment variable that makes a test binary a claiming child.
const CHILD: &str = "TOOLGATE_CONFORMANCE_CHILD";

/// Commands computed from a state that another step changed since are
/// refused whole (no lost update): by a fresh step and by a resolution, whose
/// claim stays held; steps without Commands, or from the current state, commit.
pub async fn a_write_from_stale_state_is_refused(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    s.commit_step(&step("c0", OutcomeKind::Output), &[set("n", "1")], None).await.unwrap();
    let read: BTreeMap<String, String> = s.tool_state("main", "notes.add").await.unwrap();
    // Another call commits from the same state first.
    let mut first = step("c1", OutcomeKind::Output);
    first.state_read = Some(&read);
    s.commit_step(&first, &[set("n", "2")], None).await.unwrap();
    // This one read the same state: its change would overwrite "2" unseen.
    let mut stale = step("c2", OutcomeKind::Output);
    stale.state_read = Some(&read);
    match s.commit_step(&stale, &[set("n", "3"), set("other", "x")], None).await {
        Err(toolgate::store::CommitError::StateChanged { agent, tool }) => {
            assert_eq!((agent.as_str(), tool.as_str()), ("main", "notes.add"))
        }
        other => panic!("a stale write must be refused: {other:?}"),
    }
    assert_eq!(s.tool_state("main", "notes.add").await.unwrap(), BTreeMap::from([("n".into(), "2".into())]));
    assert!(!s.steps(None).await.unwrap().iter().any(|x| x.call_id == "c2"), "nothing of the refused step");
    // Without Commands a stale read commits (it changes nothing); another
    // agent's state of the same Tool is its own.
    s.commit_step(&stale, &[], None).await.unwrap();
    let mut other_agent = step("c3", OutcomeKind::Output);
    other_agent.agent = "other";
    let empty = BTreeMap::new();
    other_agent.state_read = Some(&empty);
    s.commit_step(&other_agent, &[set("n", "9")], None).await.unwrap();
    // A resolution from a stale state is refused and its claim stays held.
    s.commit_step(&step("c4", OutcomeKind::Awaiting), &[], Some(&awaiting("t-stale", "c4", i64::MAX))).await.unwrap();
    let claimed = s.claim_ticket("t-stale", now(), ME).await.unwrap().unwrap();
    let mut resolving = step("c4", OutcomeKind::Output);
    resolving.state_read = Some(&read);
    match s.resolve_ticket(claimed, &resolving, &[set("n", "4")], false).await {
        Err(toolgate::store::CommitError::StateChanged { .. }) => {}
        other => panic!("a stale resolution must be refused: {other:?}"),
    }
    assert_eq!(state_of(s, "t-stale").await.as_deref(), Some("claimed"), "the claim is still held");
    assert_eq!(s.tool_state("main", "notes.add").await.unwrap()["n"], "2");
    // From the current state it goes through.
    let now_state = s.tool_state("main", "notes.add").await.unwrap();
    let mut fresh = step("c5", OutcomeKind::Output);
    fresh.state_read = Some(&now_state);
    s.commit_step(&fresh, &[set("n", "5")], None).await.unwrap();
    assert_eq!(s.tool_state("main", "notes.add").await.unwrap()["n"], "5");
}

/// Cache keys (`cache/…`) are last-writer-wins: a step that writes only
/// cache keys commits from any state, and a changed cache key does not make
/// another step's read stale; a changed ordinary key still does, even when
/// the stale step also writes cache keys.
pub async fn cache_keys_never_make_a_commit_stale(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.as_ref();
    s.commit_step(&step("c0", OutcomeKind::Output), &[set("n", "1"), set("cache/session", "\"a\"")], None)
        .await
        .unwrap();
    let read: BTreeMap<String, String> = s.tool_state("main", "notes.add").await.unwrap();
    // Two calls read the same state; both refresh the cache: both commit, the later wins.
    for (call, value) in [("c1", "\"b\""), ("c2", "\"c\"")] {
        let mut refresh = step(call, OutcomeKind::Output);
        refresh.state_read = Some(&read);
        s.commit_step(&refresh, &[set("cache/session", value)], None).await.unwrap();
    }
    assert_eq!(s.tool_state("main", "notes.add").await.unwrap()["cache/session"], "\"c\"");
    // The cache changed since `read`, the ordinary state did not: not stale.
    let mut update = step("c3", OutcomeKind::Output);
    update.state_read = Some(&read);
    s.commit_step(&update, &[set("n", "2"), set("cache/verified", "1")], None).await.unwrap();
    // Now the ordinary key changed: a write from `read` is refused whole,
    // cache keys included.
    let mut stale = step("c4", OutcomeKind::Output);
    stale.state_read = Some(&read);
    match s.commit_step(&stale, &[set("n", "3"), set("cache/verified", "2")], None).await {
        Err(toolgate::store::CommitError::StateChanged { .. }) => {}
        other => panic!("a stale write must be refused even with cache keys: {other:?}"),
    }
    let state = s.tool_state("main", "notes.add").await.unwrap();
    assert_eq!((state["n"].as_str(), state["cache/verified"].as_str()), ("2", "1"));
    // A key that only looks like the prefix (`cachex/`) is ordinary: its
    // change makes a read stale.
    let read = s.tool_state("main", "notes.add").await.unwrap();
    let mut first = step("c5", OutcomeKind::Output);
    first.state_read = Some(&read);
    s.commit_step(&first, &[set("cachex/y", "1")], None).await.unwrap();
    let mut second = step("c6", OutcomeKind::Output);
    second.state_read = Some(&read);
    match s.commit_step(&second, &[set("n", "4")], None).await {
        Err(toolgate::store::CommitError::StateChanged { .. }) => {}
        other => panic!("`cachex/y` is an ordinary key: {other:?}"),
    }
}

/// Processes racing for one ticket: exactly one wins. `test_name` is this
/// test's full name in its binary (the child re-runs it with `--exact`).
/// In the child, claims once and prints the outcome.
pub async fn processes_racing_for_one_ticket_yield_one_winner(b: &dyn Backend, test_name: &str) {
    if let Ok(spec) = std::env::var(CHILD) {
        let (locator, ticket) = spec.split_once('\t').expect("locator<TAB>ticket");
        let s = b.open(locator).await;
        let outcome = match s.claim_ticket(ticket, now(), &format!("host-{}", std::process::id())).await.unwrap() {
            Ok(_) => "won".to_owned(),
            Err(e) => format!("{e:?}"),
        };
        println!("conformance-claim: {outcome}");
        return;
    }
    let j = b.create().await;
    let Some(locator) = j.locator.clone() else { return };
    let exe = std::env::current_exe().unwrap();
    for round in 0..3 {
        let ticket = format!("proc-{round}");
        let call = format!("c{round}");
        j.store
            .commit_step(&step(&call, OutcomeKind::Awaiting), &[], Some(&awaiting(&ticket, &call, i64::MAX)))
            .await
            .unwrap();
        let children: Vec<_> = (0..4)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
                    .env(CHILD, format!("{locator}\t{ticket}"))
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut outcomes = Vec::new();
        for c in children {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let line = text.lines().find_map(|l| l.split_once("conformance-claim: ")).map(|(_, o)| o.to_owned());
            outcomes.push(line.unwrap_or_else(|| {
                panic!("child printed no outcome:\n{text}\n{}", String::from_utf8_lossy(&out.stderr))
            }));
        }
        assert_eq!(outcomes.iter().filter(|o| *o == "won").count(), 1, "round {round}: {outcomes:?}");
        assert!(outcomes.iter().all(|o| o == "won" || o.starts_with("Used")), "round {round}: {outcomes:?}");
        assert_eq!(state_of(j.store.as_ref(), &ticket).await.as_deref(), Some("claimed"));
    }
}

/// Many tasks committing at once: each gets its own sequence number, a
/// failing one rolls back alone, and everything acknowledged is durable.
pub async fn concurrent_commits_are_all_durable_and_fail_alone(b: &dyn Backend) {
    let j = b.create().await;
    let s = j.store.clone();
    s.commit_step(&step("dup", OutcomeKind::Awaiting), &[], Some(&awaiting("taken", "dup", i64::MAX))).await.unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..20 {
                    let call = format!("c{t}-{i}");
                    if t == 3 && i == 10 {
                        let r = s
                            .commit_step(
                                &step(&call, OutcomeKind::Awaiting),
                                &[set("poison", "1")],
                                Some(&awaiting("taken", &call, i64::MAX)),
                            )
                            .await;
                        assert!(r.is_err(), "{r:?}");
                        continue;
                    }
                    seqs.push(
                        s.commit_step(&step(&call, OutcomeKind::Output), &[set(&call, "1")], None).await.unwrap(),
                    );
                }
                seqs
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.extend(t.await.unwrap());
    }
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len(), 16 * 20 - 1, "every other step committed, each with its own seq");
    let state = s.tool_state("main", "notes.add").await.unwrap();
    assert_eq!(state.len(), 16 * 20 - 1);
    assert!(!state.contains_key("poison"), "the failed step's changes rolled back with it");
    let Some(locator) = j.locator.clone() else { return };
    drop(s);
    let Journal { store, keep, .. } = j;
    drop(store);
    let again = b.open(&locator).await;
    assert_eq!(again.steps(None).await.unwrap().len(), 16 * 20);
    drop(keep);
}

/// A journal the previous schema version wrote opens with its data intact:
/// steps in order, the pending ticket claimable and resolvable, Tool state.
pub async fn the_previous_schema_version_migrates(b: &dyn Backend) {
    let Some(legacy) = b.previous_version().await else { return };
    let s = b.open(&legacy.locator).await;
    let steps = s.steps(Some("run-old")).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| (s.call_id.as_str(), s.outcome)).collect::<Vec<_>>(),
        [("c-old-1", OutcomeKind::Output), ("c-old-2", OutcomeKind::Awaiting)],
        "{}",
        legacy_fixture()
    );
    assert_eq!(s.tool_state("main", "notes.add").await.unwrap()["k"], "\"v\"");
    let pending = s.pending().await.unwrap();
    assert_eq!(pending.iter().map(|a| a.ticket_id.as_str()).collect::<Vec<_>>(), ["t-old"]);
    // Asked before approvers were recorded: none are made up for it (it can be denied, not approved).
    assert_eq!(pending[0].approvers, None);
    let claimed = s.claim_ticket("t-old", now(), ME).await.unwrap().expect("the old ticket is claimable");
    let mut resolving = step("c-old-2", OutcomeKind::Output);
    resolving.run_id = "run-old";
    let seq = s.resolve_ticket(claimed, &resolving, &[], false).await.unwrap().unwrap();
    assert!(seq > steps[1].seq, "new steps come after the old ones");
    assert_eq!(s.claim_ticket("t-old", now(), ME).await.unwrap().unwrap_err(), TicketError::Used("t-old".into()));
    assert_eq!(s.run("run-old").await.unwrap().map(|r| r.agent), Some("main".to_owned()));
    drop(s);
    drop(legacy.keep);
}

/// Run every conformance test against a backend: `conformance_suite!(BACKEND_EXPR);`
/// inside a test module makes one `#[tokio::test]` per property.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::conformance_suite!(@tests $backend;
            a_step_and_its_changes_commit_together,
            a_write_from_stale_state_is_refused,
            cache_keys_never_make_a_commit_stale,
            a_failed_write_rolls_back_step_and_changes,
            tickets_are_claimed_once,
            resolving_a_ticket_commits_its_step_and_changes,
            claims_are_taken_over_only_from_a_holder_whose_heartbeat_lapsed,
            a_decided_result_is_delivered_once,
            a_journal_survives_reopening,
            handles_racing_for_one_ticket_yield_one_winner,
            concurrent_commits_are_all_durable_and_fail_alone,
            the_previous_schema_version_migrates,
        );
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn processes_racing_for_one_ticket_yield_one_winner() {
            // The name `--exact` needs: the module path without the crate.
            let path = module_path!().split_once("::").map_or("", |(_, rest)| rest);
            let name = format!("{path}::processes_racing_for_one_ticket_yield_one_winner");
            if !$crate::conformance::Backend::available(&$backend) {
                eprintln!("skipped: {} is not available here", stringify!($backend));
                return;
            }
            $crate::conformance::processes_racing_for_one_ticket_yield_one_winner(&$backend, &name).await
        }
    };
    (@tests $backend:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if !$crate::conformance::Backend::available(&$backend) {
                    eprintln!("skipped: {} is not available here", stringify!($backend));
                    return;
                }
                $crate::conformance::$name(&$backend).await
            }
        )*
    };
}

/// The embedded SQLite journal in a file (durable, group-committed).
pub struct SqliteFile;

#[async_trait::async_trait]
impl Backend for SqliteFile {
    async fn create(&self) -> Journal {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/journal.db");
        let store = Arc::new(toolgate::SqliteJournal::open(&path).unwrap());
        Journal { store, locator: Some(path.display().to_string()), keep: Box::new(dir) }
    }
    async fn open(&self, locator: &str) -> Arc<dyn StepStore> {
        Arc::new(toolgate::SqliteJournal::open(std::path::Path::new(locator)).unwrap())
    }
    async fn previous_version(&self) -> Option<Legacy> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let version = toolgate::store::sqlite::SCHEMA_VERSION - 1;
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(&toolgate::store::sqlite::schema_at(version)).unwrap();
        c.pragma_update(None, "user_version", version).unwrap();
        c.execute_batch(&legacy_rows()).unwrap();
        drop(c);
        Some(Legacy { locator: path.display().to_string(), keep: Box::new(dir) })
    }
}

/// The in-memory SQLite journal: one handle, no durability.
pub struct SqliteMemory;

#[async_trait::async_trait]
impl Backend for SqliteMemory {
    async fn create(&self) -> Journal {
        Journal { store: Arc::new(toolgate::SqliteJournal::in_memory().unwrap()), locator: None, keep: Box::new(()) }
    }
    async fn open(&self, locator: &str) -> Arc<dyn StepStore> {
        unreachable!("an in-memory journal has no locator ({locator})")
    }
    async fn previous_version(&self) -> Option<Legacy> {
        None
    }
}

/// The in-process journal of `store = ":memory:"` ([`toolgate::MemoryJournal`]).
pub struct Memory;

#[async_trait::async_trait]
impl Backend for Memory {
    async fn create(&self) -> Journal {
        Journal { store: Arc::new(toolgate::MemoryJournal::new()), locator: None, keep: Box::new(()) }
    }
    async fn open(&self, locator: &str) -> Arc<dyn StepStore> {
        unreachable!("an in-memory journal has no locator ({locator})")
    }
    async fn previous_version(&self) -> Option<Legacy> {
        None
    }
}

/// The environment variable naming a PostgreSQL server for the suite: a
/// libpq `key=value` string whose role may create databases (e.g.
/// `host=/tmp/pg user=postgres`). `scripts/test` starts a server and sets it.
pub const PG_ENV: &str = "TOOLGATE_TEST_PG";

/// Set (by `scripts/test`) to make a missing [`PG_ENV`] a failure, not a skip.
pub const PG_REQUIRED_ENV: &str = "TOOLGATE_REQUIRE_PG";

/// The PostgreSQL journal: a new database per journal on the server that
/// [`PG_ENV`] names, dropped with it.
pub struct Postgres;

impl Postgres {
    fn server() -> Option<String> {
        match std::env::var(PG_ENV) {
            Ok(dsn) => {
                assert!(
                    !dsn.trim_start().starts_with("postgres"),
                    "{PG_ENV}: give a libpq key=value string (host=… user=…), not a URL"
                );
                Some(dsn)
            }
            Err(_) => {
                assert!(std::env::var_os(PG_REQUIRED_ENV).is_none(), "{PG_REQUIRED_ENV} is set but {PG_ENV} is not");
                None
            }
        }
    }

    /// A new empty database on the server [`PG_ENV`] names: its locator (the
    /// server's DSN naming it) and the guard that drops it. `None` without a
    /// server (a failure instead if [`PG_REQUIRED_ENV`] is set).
    pub async fn fresh_database() -> Option<(String, DropDatabase)> {
        let server = Self::server()?;
        let name = format!("tg_conformance_{:016x}", rand_u64());
        let (client, conn) = tokio_postgres::connect(&server, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        Some((format!("{server} dbname={name}"), DropDatabase { server, name }))
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    h.write_u32(std::process::id());
    h.finish()
}

/// Drops a test database (on its own thread: `Drop` cannot await).
pub struct DropDatabase {
    server: String,
    name: String,
}

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Ok((client, conn)) = tokio_postgres::connect(&server, tokio_postgres::NoTls).await {
                    tokio::spawn(conn);
                    let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                }
            });
        })
        .join();
    }
}

#[async_trait::async_trait]
impl Backend for Postgres {
    fn available(&self) -> bool {
        Self::server().is_some()
    }
    async fn create(&self) -> Journal {
        let (locator, keep) = Self::fresh_database().await.expect("checked by available()");
        let store =
            Arc::new(toolgate::store::postgres::PostgresJournal::connect(&locator, None, 4, None).await.unwrap());
        Journal { store, locator: Some(locator), keep: Box::new(keep) }
    }
    async fn open(&self, locator: &str) -> Arc<dyn StepStore> {
        Arc::new(toolgate::store::postgres::PostgresJournal::connect(locator, None, 4, None).await.unwrap())
    }
    async fn previous_version(&self) -> Option<Legacy> {
        let (locator, keep) = Self::fresh_database().await.expect("checked by available()");
        let (client, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let version = toolgate::store::postgres::SCHEMA_VERSION - 1;
        client.batch_execute(&toolgate::store::postgres::schema_at(version)).await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE toolgate_schema (version BIGINT NOT NULL);
                 INSERT INTO toolgate_schema (version) VALUES ({version});
                 {}",
                legacy_rows()
            ))
            .await
            .unwrap();
        Some(Legacy { locator, keep: Box::new(keep) })
    }
}
