//! Several hosts, one journal: three `toolgate` hosts (each its own
//! directory, config and compiled-code cache, the same plugins) on one
//! PostgreSQL database.
//!
//! Properties: calls made on any host are in the one journal, and notes
//! added on the three hosts at the same moment are all kept (each add builds
//! on every add committed before it, whichever host made it); a ticket raised
//! on A and approved at the same moment on B and C runs exactly once; a host
//! killed while it runs an approved call is settled by another host once its
//! lease lapsed, never run again; afterwards the journal equals the replay of
//! the acknowledged steps, and no database password appears in it.
//!
//! Needs the server `TOOLGATE_TEST_PG` names (`scripts/test` starts one);
//! skipped, saying so, without it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use toolgate::store::postgres::PostgresJournal;
use toolgate::store::{OutcomeKind, StepStore};
use toolgate_tests::conformance::Postgres;
use toolgate_tests::{guests, packed};

const CONFIG: &str = r#"
[postgres]
pool_size = 4
password = { env = "TOOLGATE_TEST_PG_PASSWORD" }
[limits]
timeout_ms = 2000
claim_lease_secs = 1
[agents.default]
visible = ["notes", "text.*", "hostile.loop"]
default = "deny"
rules = [
  { pattern = 'notes(op = "add")', behavior = "allow" },
  { pattern = 'notes(note ~ "ask-*")', behavior = "ask" },
  { pattern = 'notes(op = "list")', behavior = "allow" },
  { pattern = 'text.*', behavior = "allow" },
  { pattern = 'hostile.loop', behavior = "ask" },
]
"#;

/// Handed to every host as the (unused, trust-authenticated) password: it
/// must appear nowhere in the journal.
const PASSWORD: &str = "pg-password-never-journaled-5150";

fn host(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    c.current_dir(dir)
        .env("TOOLGATE_TEST_PG_PASSWORD", PASSWORD)
        .arg("--json")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn ok(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// Three host directories on the database at `locator`, one approver key.
fn hosts(root: &Path, locator: &str) -> Vec<PathBuf> {
    let key = root.join("approver.key");
    let o = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["keygen", "--for", "approval", "-o"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let approval = String::from_utf8(o.stdout).unwrap();
    ["a", "b", "c"]
        .iter()
        .map(|name| {
            let d = root.join(name);
            std::fs::create_dir_all(d.join("plugins")).unwrap();
            std::fs::write(d.join("plugins/notes.wasm"), packed(guests::NOTES)).unwrap();
            std::fs::write(d.join("plugins/text.wasm"), packed(guests::TEXT)).unwrap();
            std::fs::write(d.join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
            std::fs::copy(&key, d.join("approver.key")).unwrap();
            let preamble = format!("plugins = \"plugins\"\nstore = \"{locator}\"\ncache = \"cache\"\n");
            std::fs::write(d.join("toolgate.toml"), format!("{preamble}{CONFIG}{approval}")).unwrap();
            d
        })
        .collect()
}

/// The JSON a call printed, whatever its exit code (an ask exits 12).
fn json_out(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    })
}

async fn ticket_of(journal: &PostgresJournal, request: &str) -> String {
    journal
        .pending()
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.call_id == request)
        .map(|a| a.ticket_id)
        .expect("the request is pending")
}

/// The call digest of `ticket`'s pending record, as `journal --awaiting`
/// lists it for `approve --digest`.
async fn digest_of(journal: &PostgresJournal, ticket: &str) -> String {
    journal.awaiting(ticket).await.unwrap().expect("the ticket is recorded").call_digest().hex()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_share_one_journal_and_run_each_approval_once() {
    let Some((locator, _drop)) = Postgres::fresh_database().await else {
        eprintln!("skipped: set TOOLGATE_TEST_PG to a PostgreSQL server (scripts/test starts one)");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let h = hosts(root.path(), &locator);
    // Compile once per host (each has its own cache), all three at once: they
    // also create the schema together.
    let warm: Vec<_> =
        h.iter().map(|d| host(d, &["call", "notes", "--args", r#"{"op":"list"}"#]).spawn().unwrap()).collect();
    for w in warm {
        ok(&w.wait_with_output().unwrap());
    }

    // 1. Calls spread over the three hosts, three at a time (a pure Tool), and
    //    state written on one host read by the next call on another.
    let mut acked_text = 0;
    for round in 0..8 {
        let running: Vec<_> = h
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let args = json!({"text": format!("r{round}-h{i}")}).to_string();
                host(d, &["call", "text.upper", "--args", &args]).spawn().unwrap()
            })
            .collect();
        for (i, r) in running.into_iter().enumerate() {
            let v = ok(&r.wait_with_output().unwrap());
            assert_eq!(v["outcome"], "output", "{v}");
            assert!(v["result"].to_string().contains(&format!("R{round}-H{i}")), "{v}");
            acked_text += 1;
        }
    }
    // State: the three hosts add notes at the same moment; none is lost
    // (each add commits on top of every add committed before it).
    let mut acked_notes: BTreeSet<String> = BTreeSet::new();
    for round in 0..4 {
        let running: Vec<_> = h
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let args = json!({"op": "add", "note": format!("n{round}-h{i}")}).to_string();
                host(d, &["call", "notes", "--args", &args]).spawn().unwrap()
            })
            .collect();
        for (i, r) in running.into_iter().enumerate() {
            let v = ok(&r.wait_with_output().unwrap());
            assert_eq!(v["outcome"], "output", "{v}");
            acked_notes.insert(format!("n{round}-h{i}"));
        }
    }

    let journal = PostgresJournal::connect(&locator, None, 2, None).await.unwrap();

    // 2. A ticket raised on A, approved at the same moment on B and C: one runs.
    for round in 0..4 {
        let args = json!({"op": "add", "note": format!("ask-{round}")}).to_string();
        let v = json_out(&host(&h[0], &["call", "notes", "--args", &args]).output().unwrap());
        assert_eq!(v["outcome"], "awaiting", "{v}");
        let ticket = ticket_of(&journal, v["request"].as_str().unwrap()).await;
        let digest = digest_of(&journal, &ticket).await;
        let b = host(&h[1], &["approve", &ticket, "--key", "approver.key", "--digest", &digest]).spawn().unwrap();
        let c = host(&h[2], &["approve", &ticket, "--key", "approver.key", "--digest", &digest]).spawn().unwrap();
        let (b, c) = (b.wait_with_output().unwrap(), c.wait_with_output().unwrap());
        let mut codes = [b.status.code(), c.status.code()];
        codes.sort();
        assert_eq!(
            codes,
            [Some(0), Some(1)],
            "exactly one approval runs: {}{}",
            String::from_utf8_lossy(&b.stderr),
            String::from_utf8_lossy(&c.stderr)
        );
        let loser = if b.status.code() == Some(1) { &b } else { &c };
        assert!(String::from_utf8_lossy(&loser.stderr).contains("already used"));
        acked_notes.insert(format!("ask-{round}"));
    }

    // 3. B dies while it runs an approved call (the loop spins to its deadline);
    //    after the lease, C settles the claim as interrupted; it never runs again.
    let v = json_out(&host(&h[0], &["call", "hostile.loop"]).output().unwrap());
    let looping = ticket_of(&journal, v["request"].as_str().unwrap()).await;
    let looping_digest = digest_of(&journal, &looping).await;
    assert!(
        toolgate_tests::run_or_kill(
            host(&h[1], &["approve", &looping, "--key", "approver.key", "--digest", &looping_digest]),
            Duration::from_millis(900)
        )
        .is_none(),
        "the approving host was killed mid-call"
    );
    assert_eq!(journal.awaiting(&looping).await.unwrap().map(|a| a.state).as_deref(), Some("claimed"));
    std::thread::sleep(Duration::from_millis(2100));
    ok(&host(&h[2], &["call", "notes", "--args", r#"{"op":"list"}"#]).output().unwrap());
    let o = host(&h[0], &["approve", &looping, "--key", "approver.key", "--digest", &looping_digest]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "a settled ticket is used: {}", String::from_utf8_lossy(&o.stderr));

    // 4. The journal equals the replay of what was acknowledged.
    let steps = journal.steps(None).await.unwrap();
    toolgate_tests::assert_no_call_or_ticket_committed_twice(&steps);
    let upper = steps.iter().filter(|s| s.tool_id == "text.upper" && s.outcome == OutcomeKind::Output).count();
    assert_eq!(upper, acked_text, "every acknowledged call on every host is in the journal");
    let mut replay: Vec<String> = Vec::new();
    for s in steps.iter().filter(|s| s.tool_id == "notes" && s.outcome == OutcomeKind::Output) {
        let args: Value = serde_json::from_str(&s.arguments).unwrap();
        if args["op"] == "add" {
            replay.push(args["note"].as_str().unwrap().to_owned());
        }
        let shown: Value = serde_json::from_str(&s.result).unwrap();
        assert_eq!(shown["notes"], json!(replay), "step {} built on every add committed before it", s.seq);
    }
    assert_eq!(
        replay.iter().cloned().collect::<BTreeSet<_>>(),
        acked_notes,
        "the committed adds are exactly the acknowledged ones"
    );
    assert_eq!(replay.len(), acked_notes.len(), "each once");
    let state = journal.tool_state("default", "notes").await.unwrap();
    let stored: Vec<String> = serde_json::from_str(&state["notes"]).unwrap();
    assert_eq!(stored, replay, "Tool state equals the replay of committed steps");
    assert!(
        steps.iter().any(|s| s.ticket_id.as_deref() == Some(looping.as_str()) && s.result.starts_with("interrupted:")),
        "the killed host's claim was settled by another host"
    );

    // No password in the journal: every text column of every table.
    let (client, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    for table in ["runs", "steps", "awaiting", "tool_state", "hosts"] {
        let rows = client.query(&format!("SELECT t::text FROM {table} t"), &[]).await.unwrap();
        for r in rows {
            let row: String = r.get(0);
            assert!(!row.contains(PASSWORD), "{table} holds the password: {row}");
        }
    }
}
