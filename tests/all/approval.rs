//! Invariant 11: RequireConfirmation is resumable run state with a single-use
//! ticket bound to the exact call.

use serde_json::json;
use toolgate::store::{OutcomeKind, TicketError};
use toolgate::{CallError, StepResult};
use toolgate_tests::{guests, packed};

use super::{call, steps, text_and_notes};

async fn ask(host: &toolgate_tests::TestHost, note: &str) -> String {
    match call(host, "notes", json!({"op": "add", "note": note})).await {
        StepResult::Awaiting { ticket, .. } => ticket,
        other => panic!("expected awaiting, got {other:?}"),
    }
}

#[tokio::test]
async fn ask_awaits_then_approve_executes_the_exact_call_once() {
    let host = text_and_notes("");
    let ticket = ask(&host, "buy milk").await;
    assert_eq!(host.instantiations(), 0, "nothing runs before approval");
    assert_eq!(host.runtime.store().pending().await.unwrap().len(), 1);

    let r = host.runtime.approve(&ticket).await.unwrap();
    assert!(
        matches!(&r, StepResult::Output { content: toolgate::sandbox::executor::Content::Json(v), .. } if v == &json!({"notes": ["buy milk"]})),
        "{r:?}"
    );
    assert_eq!(host.instantiations(), 1);

    let again = host.runtime.approve(&ticket).await.unwrap_err();
    assert!(matches!(again, CallError::Ticket(TicketError::Used(_))), "{again}");
    assert_eq!(host.instantiations(), 1, "a reused ticket executes nothing");

    let s = steps(&host).await;
    assert_eq!(s.iter().map(|s| s.outcome).collect::<Vec<_>>(), [OutcomeKind::Awaiting, OutcomeKind::Output]);
    assert_eq!(s[0].call_id, s[1].call_id, "the approval resolves the same call");
    assert_eq!(s[1].arguments, s[0].arguments);
    assert!(host.runtime.store().pending().await.unwrap().is_empty());
}

#[tokio::test]
async fn deny_commits_a_blocked_result_and_executes_nothing() {
    let host = text_and_notes("");
    let ticket = ask(&host, "x").await;
    let r = host.runtime.deny(&ticket, "not today").await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("not today")), "{r:?}");
    assert_eq!(host.instantiations(), 0);
    let again = host.runtime.approve(&ticket).await.unwrap_err();
    assert!(matches!(again, CallError::Ticket(TicketError::Used(_))));
    assert_eq!(host.instantiations(), 0);
}

#[tokio::test]
async fn unknown_and_expired_tickets_execute_nothing() {
    let host = text_and_notes("");
    let e = host.runtime.approve("tkt-00000000000000000000000000000000").await.unwrap_err();
    assert!(matches!(e, CallError::Ticket(TicketError::Unknown(_))), "{e}");

    let ticket = ask(&host, "x").await;
    let db = rusqlite::Connection::open(host.journal_path()).unwrap();
    db.execute("UPDATE awaiting SET expires_at = 0 WHERE ticket_id = ?1", [&ticket]).unwrap();
    let e = host.runtime.approve(&ticket).await.unwrap_err();
    assert!(matches!(e, CallError::Ticket(TicketError::Expired(_))), "{e}");
    assert_eq!(host.instantiations(), 0);
}

#[tokio::test]
async fn tickets_survive_a_restart_of_the_host() {
    let host = text_and_notes("");
    let ticket = ask(&host, "persisted").await;
    let host = host.restart();
    let r = host.runtime.approve(&ticket).await.unwrap();
    assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
}

#[tokio::test]
async fn a_changed_component_voids_the_ticket() {
    let host = text_and_notes("");
    let ticket = ask(&host, "x").await;
    // Same tool id, different bytes: a new build of the component.
    let mut changed = packed(guests::NOTES);
    wasm_encoder_custom(&mut changed, "rebuilt", b"1");
    toolgate_tests::put(&host.plugins(), "notes.wasm", &changed);
    let host = host.restart();
    let e = host.runtime.approve(&ticket).await.unwrap_err();
    assert!(matches!(e, CallError::Ticket(TicketError::ComponentChanged { .. })), "{e}");
    assert!(e.to_string().contains("make the call again"), "{e}");
    assert_eq!(host.instantiations(), 0);
    let again = host.runtime.approve(&ticket).await.unwrap_err();
    assert!(matches!(again, CallError::Ticket(TicketError::Used(_))), "{again}");
}

#[tokio::test]
async fn arguments_cannot_be_changed_on_resume() {
    let host = text_and_notes("");
    let ticket = ask(&host, "original").await;
    // Tamper with the stored arguments behind the host's back.
    let db = rusqlite::Connection::open(host.journal_path()).unwrap();
    db.execute(
        "UPDATE awaiting SET arguments = ?1 WHERE ticket_id = ?2",
        [r#"{"op":"add","note":"tampered"}"#, ticket.as_str()],
    )
    .unwrap();
    let r = host.runtime.approve(&ticket).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("does not match")), "{r:?}");
    assert_eq!(host.instantiations(), 0);
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
    let r = host.runtime.approve(&ticket).await.unwrap();
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
    let (a, b) = tokio::join!(host.runtime.approve(&ticket), other.approve(&ticket));
    let oks = [a.is_ok(), b.is_ok()].iter().filter(|x| **x).count();
    assert_eq!(oks, 1, "exactly one approval runs: {a:?} {b:?}");
    let loser = if a.is_ok() { b } else { a };
    assert!(matches!(loser, Err(CallError::Ticket(TicketError::Used(_)))));
    assert_eq!(host.instantiations() + other.executor().instantiations(), 1);
    let state = host.runtime.store().tool_state("default", "notes").await.unwrap();
    assert_eq!(state.get("notes").map(String::as_str), Some("[\"once\"]"));
}
