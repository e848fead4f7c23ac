//! Invariant 11: RequireConfirmation is resumable run state with a single-use
//! ticket bound to the exact call.

use serde_json::json;
use toolgate::store::{OutcomeKind, TicketError};
use toolgate::{CallError, StepResult};
use toolgate_tests::{guests, packed};

use super::{call, steps, text_and_notes, text_and_notes_in};

/// The test harness decides as an embedding runtime's approval UI would: on
/// the pending call it shows the human, read from `rt`'s journal now (an
/// unknown ticket shows nothing).
async fn approver(rt: &toolgate::Runtime, ticket: &str) -> toolgate::Approval {
    let shown = rt.store().awaiting(ticket).await.unwrap().map(|r| r.call_digest());
    toolgate::Approval::by_embedder("test-approver", shown.unwrap_or(toolgate::Digest([0; 32])))
}

async fn ask(host: &toolgate_tests::TestHost, note: &str) -> String {
    match call(host, "notes", json!({"op": "add", "note": note})).await {
        StepResult::Awaiting { ticket, .. } => ticket,
        other => panic!("expected awaiting, got {other:?}"),
    }
}

each_lang! {
async fn ask_awaits_then_approve_executes_the_exact_call_once(lang: Lang) {
    let host = text_and_notes_in(lang, "");
    let ticket = ask(&host, "buy milk").await;
    assert_eq!(host.instantiations(), 0, "nothing runs before approval");
    assert_eq!(host.runtime.store().pending().await.unwrap().len(), 1);

    let r = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(
        matches!(&r, StepResult::Output { content: toolgate::sandbox::executor::Content::Json(v), .. } if v == &json!({"notes": ["buy milk"]})),
        "{r:?}"
    );
    assert_eq!(host.instantiations(), 1);

    let again = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap_err();
    assert!(matches!(again, CallError::Ticket(TicketError::Used(_))), "{again}");
    assert_eq!(host.instantiations(), 1, "a reused ticket executes nothing");

    let s = steps(&host).await;
    assert_eq!(s.iter().map(|s| s.outcome).collect::<Vec<_>>(), [OutcomeKind::Awaiting, OutcomeKind::Output]);
    assert_eq!(s[0].call_id, s[1].call_id, "the approval resolves the same call");
    assert_eq!(s[1].arguments, s[0].arguments);
    assert!(host.runtime.store().pending().await.unwrap().is_empty());
}
}

each_lang! {
async fn deny_commits_a_blocked_result_and_executes_nothing(lang: Lang) {
    let host = text_and_notes_in(lang, "");
    let ticket = ask(&host, "x").await;
    let r = host.runtime.deny(&ticket, "not today", &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("not today")), "{r:?}");
    assert_eq!(host.instantiations(), 0);
    let again = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap_err();
    assert!(matches!(again, CallError::Ticket(TicketError::Used(_))));
    assert_eq!(host.instantiations(), 0);
}
}

#[tokio::test]
async fn unknown_and_expired_tickets_execute_nothing() {
    let host = text_and_notes("");
    let e = host
        .runtime
        .approve("tkt-00000000000000000000000000000000", &approver(&host.runtime, "tkt-0").await)
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Ticket(TicketError::Unknown(_))), "{e}");

    let ticket = ask(&host, "x").await;
    let db = rusqlite::Connection::open(host.journal_path()).unwrap();
    db.execute("UPDATE awaiting SET expires_at = 0 WHERE ticket_id = ?1", [&ticket]).unwrap();
    let e = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap_err();
    assert!(matches!(e, CallError::Ticket(TicketError::Expired(_))), "{e}");
    assert_eq!(host.instantiations(), 0);
}

each_lang! {
async fn tickets_survive_a_restart_of_the_host(lang: Lang) {
    let host = text_and_notes_in(lang, "");
    let ticket = ask(&host, "persisted").await;
    let host = host.restart();
    let r = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
}
}

each_lang! {
async fn a_changed_component_voids_the_ticket(lang: Lang) {
    let host = text_and_notes_in(lang, "");
    let ticket = ask(&host, "x").await;
    // Same tool id, different bytes: a new build of the component.
    let mut changed = lang.notes();
    wasm_encoder_custom(&mut changed, "rebuilt", b"1");
    toolgate_tests::put(&host.plugins(), "notes.wasm", &changed);
    let host = host.restart();
    let e = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap_err();
    assert!(matches!(e, CallError::Ticket(TicketError::ComponentChanged { .. })), "{e}");
    assert!(e.to_string().contains("make the call again"), "{e}");
    assert_eq!(host.instantiations(), 0);
    let again = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap_err();
    assert!(matches!(again, CallError::Ticket(TicketError::Used(_))), "{again}");
    // The step resolving the ticket is the model's to read: the request, never the ticket.
    let last = steps(&host).await.pop().unwrap();
    assert!(last.result.contains("changed") && !last.result.contains(ticket.as_str()), "{}", last.result);
}
}

each_lang! {
async fn arguments_cannot_be_changed_on_resume(lang: Lang) {
    let host = text_and_notes_in(lang, "");
    let ticket = ask(&host, "original").await;
    // Tamper with the stored arguments behind the host's back.
    let db = rusqlite::Connection::open(host.journal_path()).unwrap();
    db.execute(
        "UPDATE awaiting SET arguments = ?1 WHERE ticket_id = ?2",
        [r#"{"op":"add","note":"tampered"}"#, ticket.as_str()],
    )
    .unwrap();
    // The approver is shown the tampered text (the record as it is now); its
    // digest still names the original arguments, so the gate refuses it.
    let r = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("does not match")), "{r:?}");
    assert_eq!(host.instantiations(), 0);
}
}

/// The approver is shown the pending call; while the human reads it, an
/// agent that can write the journal (the same OS user) rewrites the record
/// self-consistently: another call or tool, its arguments *and* their digest,
/// that tool's component digest. An approval names the call it was shown,
/// so it is refused for what the record now holds, on every channel: nothing
/// runs, nothing is committed for the rewritten call, the ticket stays
/// pending. A denial still denies (whatever the ticket holds). On the
/// previous code a channel's approval named no call and the rewritten call
/// ran, journaled as approved by the human.
#[tokio::test]
async fn a_call_rewritten_while_the_approver_reads_it_is_not_approved() {
    use toolgate::approval::ApprovalError;
    let host = text_and_notes("");
    let store = host.runtime.store();
    let text = host.runtime.snapshot().candidate("text.upper", &|_| None).unwrap().installed.component.digest;
    let notes = host.runtime.snapshot().candidate("notes", &|_| None).unwrap().installed.component.digest;
    // Another call of the same tool (which also asks), and another tool.
    let rewrites = [("notes", json!({"op": "clear"}), notes), ("text.upper", json!({"text": "tampered"}), text)];
    for (i, (tool, arguments, component)) in rewrites.iter().enumerate() {
        for channel in ["terminal", "embedder", "mcp-elicitation"] {
            let ticket = ask(&host, &format!("buy milk {i} {channel}")).await;
            let shown = store.awaiting(&ticket).await.unwrap().unwrap().call_digest();
            let approval = match channel {
                "terminal" => toolgate::Approval::on_terminal("alice", shown),
                "embedder" => toolgate::Approval::by_embedder("ui:alice", shown),
                _ => toolgate::Approval::by_mcp_client_for("stdio", shown),
            };
            toolgate_tests::rewrite_awaiting(&host.journal_path(), &ticket, tool, arguments, component);

            let e = host.runtime.approve(&ticket, &approval).await.unwrap_err();
            assert!(
                matches!(&e, CallError::Approval(ApprovalError::ChangedSinceShown { ticket: t }) if *t == ticket),
                "{channel}, {tool}: {e}"
            );
            let message = e.to_string();
            assert!(message.contains(&ticket) && message.contains("changed since it was shown"), "{message}");
            assert_eq!(host.instantiations(), 0, "{channel}, {tool}: nothing runs");
            let now = store.awaiting(&ticket).await.unwrap().unwrap();
            assert_eq!((now.state.as_str(), now.tool_id.as_str()), ("pending", *tool), "still pending, as rewritten");
            let of_ticket: Vec<_> = steps(&host).await.into_iter().filter(|s| s.run_id == now.run_id).collect();
            assert!(
                of_ticket.iter().all(|s| s.outcome == OutcomeKind::Awaiting && s.approved_by.is_none()),
                "{channel}, {tool}: the journal has no result for the rewritten call: {of_ticket:?}"
            );

            // A denial made on the call shown denies whatever the ticket holds.
            let r = host.runtime.deny(&ticket, "not what I saw", &approval).await.unwrap();
            assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("not what I saw")), "{r:?}");
            assert_eq!(host.instantiations(), 0);
        }
    }
    assert!(steps(&host).await.iter().all(|s| s.outcome != OutcomeKind::Output), "nothing ran");
    assert!(store.pending().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_deny_rule_in_force_at_approval_wins() {
    let host = text_and_notes("");
    let ticket = ask(&host, "x").await;
    // The operator tightens the policy before approving.
    let cfg = host.dir.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        r#"pattern = "notes(op = \"add\")", behavior = "ask""#,
        r#"pattern = "notes(op = \"add\")", behavior = "deny""#,
    );
    std::fs::write(&cfg, text).unwrap();
    let host = host.restart();
    let r = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(matches!(r, StepResult::Blocked { .. }), "{r:?}");
    assert_eq!(host.instantiations(), 0);
}

/// Append a custom section to a component (changes its digest, not its meaning).
pub fn wasm_encoder_custom(bytes: &mut Vec<u8>, name: &str, data: &[u8]) {
    let mut section = vec![name.len() as u8];
    section.extend_from_slice(name.as_bytes());
    section.extend_from_slice(data);
    bytes.push(0);
    bytes.push(section.len() as u8);
    bytes.extend_from_slice(&section);
}

#[tokio::test]
async fn two_hosts_approving_one_ticket_at_once_execute_it_once() {
    let host = text_and_notes("");
    let ticket = ask(&host, "once").await;
    let other = toolgate_tests::runtime_for(&host.config, "default");
    let approval = approver(&host.runtime, &ticket).await;
    let (a, b) = tokio::join!(host.runtime.approve(&ticket, &approval), other.approve(&ticket, &approval));
    let oks = [a.is_ok(), b.is_ok()].iter().filter(|x| **x).count();
    assert_eq!(oks, 1, "exactly one approval runs: {a:?} {b:?}");
    let loser = if a.is_ok() { b } else { a };
    assert!(matches!(loser, Err(CallError::Ticket(TicketError::Used(_)))));
    assert_eq!(host.instantiations() + other.executor().instantiations(), 1);
    let state = host.runtime.store().tool_state("default", "notes").await.unwrap();
    assert_eq!(state.get("notes").map(String::as_str), Some("[\"once\"]"));
}

/// The run of `host`'s agent, and the ticket of an ask made in it.
async fn ask_in<'r>(run: &toolgate::Run<'r>, note: &str) -> (String, String) {
    match run.call("notes", json!({"op": "add", "note": note})).await.unwrap() {
        StepResult::Awaiting { ticket, correlation, .. } => (ticket, correlation),
        other => panic!("expected awaiting, got {other:?}"),
    }
}

/// A stateless request (MCP 2026-07-28 over HTTP) finds the identical ask
/// of an earlier stateless request of its principal to its agent, never
/// another principal's, never a conversation's: a
/// session's (or a `toolgate call` run's) pending ask, and its decided result,
/// stay that conversation's.
#[tokio::test]
async fn a_stateless_request_finds_only_stateless_asks() {
    let host = text_and_notes("");
    let rt = &host.runtime;
    let configured = toolgate::ToolCapabilityNarrowing::Configured;
    let conversation = rt.start_run(None, configured).await.unwrap();
    let (ticket, correlation) = ask_in(&conversation, "ours").await;
    let of = |principal: &'static str| async move {
        rt.start_run(Some(toolgate::runtime::stateless_run_id(principal)), configured).await.unwrap().stateless()
    };
    let stateless = || of("token A");
    let (own, own_correlation) = ask_in(&stateless().await, "ours").await;
    assert!(own != ticket && own_correlation != correlation, "a stateless request found a conversation's ask");
    // Another stateless request finds the first stateless one: the same request, no new ticket.
    let (again, again_correlation) = ask_in(&stateless().await, "ours").await;
    assert_eq!((again, again_correlation.clone()), (own.clone(), own_correlation.clone()));
    // Another principal bound to the same agent (another token) does not: its own request.
    let (theirs, theirs_correlation) = ask_in(&of("token B").await, "ours").await;
    assert!(theirs != own && theirs_correlation != own_correlation, "another principal found token A's ask");
    // Decided, the conversation's result is not handed to a stateless request.
    assert!(matches!(rt.approve(&ticket, &approver(rt, &ticket).await).await.unwrap(), StepResult::Output { .. }));
    rt.deny(&own, "not this one", &approver(rt, &own).await).await.unwrap();
    let r = stateless().await.call("notes", json!({"op": "add", "note": "ours"})).await.unwrap();
    let conversations =
        matches!(&r, StepResult::Output { .. }) || matches!(&r, StepResult::Awaiting { ticket: t, .. } if *t == ticket);
    assert!(!conversations, "a stateless request got the conversation's ask or result: {r:?}");
    assert_eq!(host.instantiations(), 1, "only the approved call ran");
}

#[tokio::test]
async fn the_model_never_reads_a_ticket() {
    let host = text_and_notes("");
    let r = call(&host, "notes", json!({"op": "add", "note": "secretive"})).await;
    let StepResult::Awaiting { ticket, correlation, .. } = &r else { panic!("{r:?}") };
    let text = r.model_text();
    assert!(text.contains(correlation.as_str()) && text.contains("awaiting human approval"), "{text}");
    assert!(!text.contains(ticket.as_str()), "{text}");
    for s in steps(&host).await {
        assert!(!s.result.contains(ticket.as_str()), "the model-facing journal text holds the ticket: {}", s.result);
    }
}

#[tokio::test]
async fn an_identical_call_while_undecided_is_the_same_request() {
    let host = text_and_notes("");
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let (ticket, correlation) = ask_in(&run, "once").await;
    let (again, again_corr) = ask_in(&run, "once").await;
    assert_eq!((&again, &again_corr), (&ticket, &correlation), "no second ticket for the same call");
    assert_eq!(host.runtime.store().pending().await.unwrap().len(), 1);
    let (other, _) = ask_in(&run, "different").await;
    assert_ne!(other, ticket, "a different call asks anew");
}

#[tokio::test]
async fn an_out_of_band_decision_reaches_the_identical_retry_once() {
    let host = text_and_notes("");
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let (ticket, _) = ask_in(&run, "milk").await;
    // Decided elsewhere (a terminal, no approver keys configured): the result waits for the agent.
    let shown = host.runtime.store().awaiting(&ticket).await.unwrap().unwrap().call_digest();
    host.runtime.approve(&ticket, &toolgate::Approval::on_terminal("alice", shown)).await.unwrap();
    assert_eq!(host.instantiations(), 1);
    let retry = run.call("notes", json!({"op": "add", "note": "milk"})).await.unwrap();
    assert!(
        matches!(&retry, StepResult::Output { content: toolgate::sandbox::executor::Content::Json(v), .. } if v == &json!({"notes": ["milk"]})),
        "{retry:?}"
    );
    assert_eq!(host.instantiations(), 1, "the retry receives the result; nothing runs again");
    let second = run.call("notes", json!({"op": "add", "note": "milk"})).await.unwrap();
    assert!(matches!(&second, StepResult::Awaiting { ticket: t, .. } if *t != ticket), "{second:?}");
    // Another run does not receive it.
    let other = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    assert!(matches!(
        other.call("notes", json!({"op": "add", "note": "milk"})).await.unwrap(),
        StepResult::Awaiting { .. }
    ));
    let s = steps(&host).await;
    let approved = s.iter().find(|s| s.approved_by.is_some()).unwrap();
    let by = approved.approved_by.as_ref().unwrap();
    assert_eq!((by.principal.as_str(), by.channel.as_str()), ("alice", "terminal"));
}

#[tokio::test]
async fn an_in_conversation_decision_is_not_delivered_twice() {
    let host = text_and_notes("");
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let (ticket, _) = ask_in(&run, "x").await;
    let r = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
    let retry = run.call("notes", json!({"op": "add", "note": "x"})).await.unwrap();
    assert!(matches!(retry, StepResult::Awaiting { .. }), "the result already went back: {retry:?}");
}

#[tokio::test]
async fn with_approver_keys_only_a_signature_decides() {
    let (secret, public) = toolgate::keys::keygen().unwrap();
    let host = text_and_notes(&format!("[approval]\nkeys = [\"{public}\"]\n"));
    let (ticket, _) = {
        let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
        ask_in(&run, "signed").await
    };
    let record = host.runtime.store().awaiting(&ticket).await.unwrap().unwrap();
    let e = host
        .runtime
        .approve(&ticket, &toolgate::Approval::on_terminal("mallory", record.call_digest()))
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Approval(toolgate::approval::ApprovalError::KeyRequired)), "{e}");
    let (stranger, _) = toolgate::keys::keygen().unwrap();
    let forged = toolgate::approval::sign(
        &toolgate::keys::SecretKey::parse(&stranger).unwrap(),
        &record,
        &toolgate::approval::Decision::Approve,
    );
    let e = host.runtime.approve(&ticket, &toolgate::Approval::signed(forged)).await.unwrap_err();
    assert!(matches!(e, CallError::Approval(toolgate::approval::ApprovalError::Untrusted)), "{e}");
    // A denial's signature does not approve.
    let key = toolgate::keys::SecretKey::parse(&secret).unwrap();
    let deny = toolgate::approval::Decision::Deny { reason: "no".into() };
    let e = host
        .runtime
        .approve(&ticket, &toolgate::Approval::signed(toolgate::approval::sign(&key, &record, &deny)))
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Approval(_)), "{e}");
    assert_eq!(host.instantiations(), 0);
    assert_eq!(host.runtime.store().pending().await.unwrap().len(), 1, "refused decisions leave the ticket pending");
    let signed = toolgate::approval::sign(&key, &record, &toolgate::approval::Decision::Approve);
    let r = host.runtime.approve(&ticket, &toolgate::Approval::signed(signed)).await.unwrap();
    assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
    let last = steps(&host).await.pop().unwrap();
    let by = last.approved_by.unwrap();
    assert_eq!((by.principal, by.channel.as_str()), (public, "signature"));
}

/// A signed approval is checked against the ticket as the host read it; the
/// call that runs is the one the claim read. A journal writer that rewrites
/// the call in between (its write lock held across the check, committed
/// while the claim waits) gets nothing run: the claimed call must be the
/// checked one.
#[tokio::test]
async fn a_call_rewritten_between_check_and_claim_does_not_run() {
    let (secret, public) = toolgate::keys::keygen().unwrap();
    let host = text_and_notes(&format!("[approval]\nkeys = [\"{public}\"]\n"));
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let (ticket, _) = ask_in(&run, "approved").await;
    let record = host.runtime.store().awaiting(&ticket).await.unwrap().unwrap();
    let key = toolgate::keys::SecretKey::parse(&secret).unwrap();
    let signed = toolgate::approval::sign(&key, &record, &toolgate::approval::Decision::Approve);

    let tampered = json!({"op": "add", "note": "tampered"});
    let mut db = rusqlite::Connection::open(host.journal_path()).unwrap();
    let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).unwrap();
    tx.execute(
        "UPDATE awaiting SET arguments = ?1, argument_digest = ?2 WHERE ticket_id = ?3",
        [tampered.to_string(), toolgate::policy::gate::argument_digest(&tampered), ticket.clone()],
    )
    .unwrap();
    let approval = toolgate::Approval::signed(signed);
    let approving = host.runtime.approve(&ticket, &approval);
    let commit_later = async {
        // The check reads the committed row at once; the claim waits for this lock.
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        tx.commit().unwrap();
    };
    let (r, ()) = tokio::join!(approving, commit_later);
    match r {
        Err(CallError::Ticket(TicketError::Changed(t))) => assert_eq!(t, ticket),
        // A machine slow enough to check after the commit: the signature no longer matches.
        Err(CallError::Approval(toolgate::approval::ApprovalError::Untrusted)) => {}
        other => panic!("the rewritten call must not run: {other:?}"),
    }
    assert_eq!(host.instantiations(), 0, "nothing ran");
    let notes = host.runtime.store().tool_state("default", "notes").await.unwrap();
    assert!(notes.values().all(|v| !v.contains("tampered")), "{notes:?}");
}

/// An embedder that sets approver keys and leaves the rest at its defaults
/// gets the config's default too: an MCP client's answer decides nothing.
#[tokio::test]
async fn runtime_settings_with_keys_do_not_trust_mcp_elicitation_by_default() {
    let (_, public) = toolgate::keys::keygen().unwrap();
    let host = text_and_notes("");
    let ticket = ask(&host, "embedded").await;
    let settings = toolgate::RuntimeSettings {
        approvers: toolgate::keys::TrustedKeys::parse(&[public]).unwrap(),
        ..Default::default()
    };
    let r = &host.runtime;
    let embedded = toolgate::Runtime::new(r.snapshot().clone(), r.executor().clone(), r.store().clone(), settings);
    let shown = r.store().awaiting(&ticket).await.unwrap().unwrap().call_digest();
    let e = embedded.approve(&ticket, &toolgate::Approval::by_mcp_client_for("self", shown)).await.unwrap_err();
    assert!(matches!(e, CallError::Approval(toolgate::approval::ApprovalError::ElicitationNotTrusted)), "{e}");
    assert_eq!(host.instantiations(), 0);
    assert_eq!(r.store().pending().await.unwrap().len(), 1, "the ticket stays pending");
}

#[tokio::test]
async fn the_wrong_agent_leaves_the_ticket_pending() {
    let host = text_and_notes("[agents.other]\nvisible = [\"notes\"]\ndefault = \"allow\"\n");
    let ticket = ask(&host, "mine").await;
    let other = toolgate_tests::runtime_for(&host.config, "other");
    let e = other.approve(&ticket, &approver(&other, &ticket).await).await.unwrap_err();
    assert!(matches!(&e, CallError::WrongAgent { ticket_agent } if ticket_agent == "default"), "{e}");
    let e = other.deny(&ticket, "not yours", &approver(&other, &ticket).await).await.unwrap_err();
    assert!(matches!(e, CallError::WrongAgent { .. }), "{e}");
    assert_eq!(host.runtime.store().pending().await.unwrap().len(), 1, "still pending");
    assert_eq!(steps(&host).await.len(), 1, "no step");
    let r = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(matches!(r, StepResult::Output { .. }), "the right agent still can: {r:?}");
}

#[tokio::test]
async fn an_ask_beats_a_more_specific_allow() {
    let host = toolgate_tests::TestHost::new(
        r#"
[agents.default]
visible = ["notes"]
default = "deny"
rules = [
  { pattern = "notes", behavior = "ask" },
  { pattern = 'notes(op = "add", note ~ "ok-*")', behavior = "allow" },
]
"#,
        &[("notes.wasm", packed(guests::NOTES))],
    );
    let r = call(&host, "notes", json!({"op": "add", "note": "ok-1"})).await;
    assert!(matches!(r, StepResult::Awaiting { .. }), "{r:?}");
    assert_eq!(host.instantiations(), 0);
    assert_eq!(steps(&host).await[0].verdict, "ask");
}

/// Invariant 11 across configs: who may decide an ask is fixed when it is
/// asked. A process on the same journal with other approver settings — the
/// agent's own key listed, MCP elicitation on, no keys so a terminal would
/// decide — decides nothing the keyed host asked; the ticket stays pending
/// and the host's own approver still decides it. An ask journaled before
/// approvers were recorded can be denied, not approved. Fails on the
/// previous code, where each process checked only its own settings.
#[tokio::test]
async fn a_process_with_other_approvers_decides_nothing_this_host_asked() {
    use toolgate::approval::{ApprovalError, Approvers, Decision, sign};
    use toolgate::keys::{SecretKey, TrustedKeys, keygen};
    let (operator_secret, operator) = keygen().unwrap();
    let (agent_secret, agent) = keygen().unwrap();
    let host = text_and_notes(&format!("[approval]\nkeys = [\"{operator}\"]\n"));
    let ticket = ask(&host, "asked under keys").await;
    let record = host.runtime.store().awaiting(&ticket).await.unwrap().unwrap();
    let asked_of = Approvers::parse(record.approvers.as_deref().unwrap()).unwrap();
    assert_eq!(asked_of, Approvers { keys: vec![operator.clone()], terminal: false, mcp_elicitation: false });

    let r = &host.runtime;
    let with = |keys: &[String], mcp: Option<bool>| {
        let settings = toolgate::RuntimeSettings {
            approvers: TrustedKeys::parse(keys).unwrap(),
            mcp_elicitation: mcp,
            ..Default::default()
        };
        toolgate::Runtime::new(r.snapshot().clone(), r.executor().clone(), r.store().clone(), settings)
    };
    let agents_host = with(std::slice::from_ref(&agent), Some(true));
    let open_host = with(&[], None);
    let agent_key = SecretKey::parse(&agent_secret).unwrap();
    let shown = record.call_digest();
    let attempts = [
        (&agents_host, toolgate::Approval::signed(sign(&agent_key, &record, &Decision::Approve))),
        (&agents_host, toolgate::Approval::by_mcp_client_for("stdio", shown)),
        (&open_host, toolgate::Approval::by_mcp_client_for("stdio", shown)),
        (&open_host, toolgate::Approval::on_terminal("agent", shown)),
    ];
    for (rt, approval) in &attempts {
        let e = rt.approve(&ticket, approval).await.unwrap_err();
        assert!(matches!(e, CallError::Approval(ApprovalError::NotAnApproverOfTheAsk { .. })), "{approval:?}: {e}");
        assert!(e.to_string().contains(&operator) && e.to_string().contains("still pending"), "{e}");
    }
    let e = open_host.deny(&ticket, "mine now", &toolgate::Approval::on_terminal("agent", shown)).await.unwrap_err();
    assert!(matches!(e, CallError::Approval(ApprovalError::NotAnApproverOfTheAsk { .. })), "{e}");
    assert_eq!(host.instantiations(), 0, "nothing ran");
    assert_eq!(r.store().pending().await.unwrap().len(), 1, "the ticket stays pending");
    assert_eq!(steps(&host).await.len(), 1, "no step");
    let operator_key = SecretKey::parse(&operator_secret).unwrap();
    let ok = r.approve(&ticket, &toolgate::Approval::signed(sign(&operator_key, &record, &Decision::Approve))).await;
    assert!(matches!(ok, Ok(StepResult::Output { .. })), "{ok:?}");

    // An ask from before approvers were recorded (a migrated journal).
    let old = ask(&host, "asked before").await;
    let db = rusqlite::Connection::open(host.journal_path()).unwrap();
    db.execute("UPDATE awaiting SET approvers = NULL WHERE ticket_id = ?1", [&old]).unwrap();
    let record = r.store().awaiting(&old).await.unwrap().unwrap();
    let e = r
        .approve(&old, &toolgate::Approval::signed(sign(&operator_key, &record, &Decision::Approve)))
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Approval(ApprovalError::AskedBeforeApproversWereRecorded { .. })), "{e}");
    let deny = Decision::Deny { reason: "stale".into() };
    let d = r.deny(&old, "stale", &toolgate::Approval::signed(sign(&operator_key, &record, &deny))).await;
    assert!(matches!(d, Ok(StepResult::Blocked { .. })), "{d:?}");
}

/// Invariant 11: a host settling a claim that a host stopped holding
/// (mid-approval) names the request, never the ticket — what a host logs at
/// start, an agent running `toolgate call` reads. (Before, it returned and
/// logged the ticket ids.)
#[tokio::test]
async fn settling_an_interrupted_approval_names_the_request_not_the_ticket() {
    let host = text_and_notes("");
    let ticket = ask(&host, "x").await;
    let request = steps(&host).await[0].call_id.clone();
    let store = host.runtime.store();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    // Claimed an hour ago by a host that never came back.
    let claimed = store.claim_ticket(&ticket, now - 3600, "gone-host").await.unwrap();
    assert!(claimed.is_ok(), "{claimed:?}");
    let settled = host.runtime.settle_interrupted().await.unwrap();
    assert_eq!(settled, vec![request]);
    assert!(!settled.iter().any(|s| s.contains(&ticket)));
    assert!(steps(&host).await.last().unwrap().result.starts_with("interrupted:"));
}

/// An agent continues only its own runs: a run's recorded restriction,
/// Skills and decided asks are its agent's (before, another agent passing
/// the run's id took over all three — an approved, undelivered result of
/// the owner's ask among them).
#[tokio::test]
async fn another_agent_cannot_continue_a_run() {
    let host = text_and_notes("[agents.other]\nvisible = [\"*\"]\ndefault = \"allow\"\n");
    ask(&host, "mine").await;
    let run_id = steps(&host).await[0].run_id.clone();
    let other = toolgate_tests::runtime_for(&host.config, "other");
    let refused = other.start_run(Some(run_id.clone()), toolgate::ToolCapabilityNarrowing::Configured).await.err();
    let Some(toolgate::store::CommitError::RunOfAnotherAgent { owner, agent, .. }) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!((owner.as_str(), agent.as_str()), ("default", "other"));
    // Its own agent continues it.
    assert!(host.runtime.start_run(Some(run_id), toolgate::ToolCapabilityNarrowing::Configured).await.is_ok());
}

/// An approval is refused before its claim — by the runtime, whatever
/// channel decides (here an embedder's dialog) — while this process has
/// never read a configured credential and the call would run failed closed
/// whatever its Tool does (an `env` grant's values are handed over at
/// start, so its output would be withheld): it would spend the single-use
/// ticket on nothing. Nothing runs, the ticket stays pending, and once the
/// credential can be read the same approval runs the call. A call that only
/// may fail closed (it may read its state) is approved, as an allowed call
/// of it runs in this process (`toolgate approve`, which runs the call in
/// the approver's shell, refuses that too: `cli.rs`).
#[tokio::test]
async fn an_approval_that_would_run_failed_closed_is_refused_before_the_claim() {
    let var = format!("TOOLGATE_APPROVAL_UNSET_{}", std::process::id());
    let credential = format!(
        "[credentials.tracker]\nsource = {{ env = \"{var}\" }}\ndestinations = [\"https://tracker.example:443\"]\n\
         apply = {{ header = {{ name = \"Authorization\", format = \"Bearer {{}}\" }} }}\n"
    );
    // Possibly: committed state the Tool may read. Approved.
    let host = text_and_notes_in(toolgate_tests::Lang::Rust, &credential);
    for note in ["bread", "milk"] {
        let ticket = ask(&host, note).await;
        let approval = approver(&host.runtime, &ticket).await;
        let r = host.runtime.approve(&ticket, &approval).await;
        assert!(r.is_ok(), "{note}: approved, run as an allowed call would be: {r:?}");
    }
    assert_eq!(host.instantiations(), 2);

    // Certainly: an `env` grant.
    let host = text_and_notes_in(
        toolgate_tests::Lang::Rust,
        &format!("{credential}\n[[grants]]\ntools = \"notes\"\nenv = {{ MODE = \"test\" }}\n"),
    );
    let ticket = ask(&host, "milk").await;
    let refused = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap_err();
    assert!(
        matches!(&refused, CallError::Approval(toolgate::approval::ApprovalError::CredentialUnreadable { why, .. }) if why.contains(&var)),
        "{refused}"
    );
    assert!(refused.to_string().contains("still pending"), "{refused}");
    assert_eq!(host.instantiations(), 0, "nothing ran");
    let pending = host.runtime.store().pending().await.unwrap();
    assert_eq!(pending.len(), 1, "the ticket was not claimed");
    assert_eq!(pending[0].ticket_id, ticket);

    // SAFETY: a variable no other test reads.
    unsafe { std::env::set_var(&var, "tracker-token-0123456789") };
    let r = host.runtime.approve(&ticket, &approver(&host.runtime, &ticket).await).await.unwrap();
    assert!(
        matches!(&r, StepResult::Output { content: toolgate::sandbox::executor::Content::Json(v), .. } if v == &json!({"notes": ["milk"]})),
        "{r:?}"
    );
}
