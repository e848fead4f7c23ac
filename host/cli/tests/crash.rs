//! Crash safety: the host process is killed with SIGKILL at random points
//! during a stream of calls and approvals, then restarted, and the journal is
//! checked against everything that was acknowledged.
//!
//! Properties: no step is half-committed (the Tool state equals a replay of
//! the committed steps), none is lost after it was acknowledged (a process
//! that exited with a result has its step), none is executed twice (each
//! call id and each ticket resolves at most once; each note text is added at
//! most once), Awaiting tickets stay resumable, and a ticket whose approving
//! host died mid-call is settled as interrupted rather than left dangling or
//! run again. Two processes approving the same ticket at once execute it once.
//!
//! The random kills run in both `durability` modes: `machine` (every commit
//! fsynced) and `process` (fsync at checkpoints). CI runs a bounded number of
//! kills per mode (`TOOLGATE_CRASH_KILLS`, default 100); set it higher for a
//! longer run.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate::store::{OutcomeKind, StepStore};
use toolgate::{Config, SqliteJournal};
use toolgate_tests::{PREAMBLE, guests, packed};

const CONFIG: &str = r#"
[limits]
timeout_ms = 2000
# A killed approver's claim is settled by the next host to start once its
# heartbeat is a second old.
claim_lease_secs = 1
[agents.default]
visible = ["notes", "hostile.loop"]
default = "deny"
rules = [
  { pattern = 'notes(op = "add")', behavior = "allow" },
  { pattern = 'notes(note ~ "ask-*")', behavior = "ask" },
  { pattern = 'notes(op = "list")', behavior = "allow" },
  { pattern = 'hostile.loop', behavior = "ask" },
]
"#;

/// A small deterministic generator (xorshift64*), so a failing run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn host(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    c.current_dir(dir).arg("--json").args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// The ticket of pending request `request`, as an approver reads it.
async fn ticket_of(dir: &Path, request: &str) -> String {
    let config = Config::load(&dir.join("toolgate.toml")).unwrap();
    let journal = SqliteJournal::open(config.store.file().expect("a SQLite journal")).unwrap();
    let pending = journal.pending().await.unwrap();
    pending.into_iter().find(|a| a.call_id == request).map(|a| a.ticket_id).expect("the request is pending")
}

/// The call digest of `ticket`'s record, as `journal --awaiting` lists it
/// for `approve --digest` (the approver names what it was shown).
async fn digest_of(dir: &Path, ticket: &str) -> String {
    let config = Config::load(&dir.join("toolgate.toml")).unwrap();
    let journal = SqliteJournal::open(config.store.file().expect("a SQLite journal")).unwrap();
    journal.awaiting(ticket).await.unwrap().expect("the ticket is recorded").call_digest().hex()
}

fn json_out(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    })
}

/// A host directory whose journal has `durability` (`machine` or `process`).
fn setup(durability: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins/notes.wasm"), packed(guests::NOTES)).unwrap();
    std::fs::write(dir.path().join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    // The harness is the approver: its key is the one `[approval] keys` trusts.
    let o = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir.path())
        .args(["keygen", "--for", "approval", "-o", "approver.key"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let approval = String::from_utf8(o.stdout).unwrap();
    let config = format!("{PREAMBLE}durability = \"{durability}\"\n{CONFIG}{approval}");
    std::fs::write(dir.path().join("toolgate.toml"), config).unwrap();
    // Compile once (the cache is shared by every process after), so kills land in calls, not compiles.
    let o = host(dir.path(), &["call", "notes", "--args", r#"{"op":"list"}"#]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dir
}

/// With every commit fsynced (`durability = "machine"`, the default).
#[tokio::test]
async fn killing_the_host_at_random_points_loses_and_repeats_nothing() {
    killing_the_host_at_random_points("machine").await;
}

/// With commits fsynced at checkpoints only (`durability = "process"`): a
/// killed process still loses nothing it acknowledged (the WAL reached the
/// OS before the acknowledgement); only a power loss could.
#[tokio::test]
async fn with_process_durability_killing_the_host_loses_and_repeats_nothing() {
    killing_the_host_at_random_points("process").await;
}

async fn killing_the_host_at_random_points(durability: &str) {
    let kills: u64 = std::env::var("TOOLGATE_CRASH_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(100);
    let seed: u64 = std::env::var("TOOLGATE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_c0de);
    let mut rng = Rng(seed);
    let dir = setup(durability);
    let d = dir.path();

    // How long an uninterrupted call takes here, so kill points spread over a whole call.
    let t = Instant::now();
    let o = host(d, &["call", "notes", "--args", r#"{"op":"add","note":"warmup"}"#]).output().unwrap();
    assert!(o.status.success());
    let span = t.elapsed().as_micros() as u64 * 3 / 2;
    let mut acked_notes: BTreeSet<String> = ["warmup".to_owned()].into();
    let mut acked_tickets: BTreeSet<String> = BTreeSet::new(); // issued, acknowledged
    let mut approved: BTreeSet<String> = BTreeSet::new(); // approval acknowledged
    let (mut killed, mut i) = (0, 0u64);

    while killed < kills {
        i += 1;
        let kill_after = Duration::from_micros(rng.below(span));
        let pending: Vec<&String> = acked_tickets.difference(&approved).collect();
        let approve = !pending.is_empty() && rng.below(3) == 0;
        if approve {
            let ticket = pending[rng.below(pending.len() as u64) as usize].clone();
            let digest = digest_of(d, &ticket).await;
            let approve = host(d, &["approve", &ticket, "--key", "approver.key", "--digest", &digest]);
            match toolgate_tests::run_or_kill(approve, kill_after) {
                None => killed += 1,
                Some(o) => {
                    let code = o.status.code();
                    // 0: ran now; 1: used (a killed approver's claim was settled, or it committed before dying).
                    assert!(
                        matches!(code, Some(0) | Some(1)),
                        "approve {ticket}: {code:?} {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                    approved.insert(ticket);
                }
            }
        } else {
            let note = if rng.below(3) == 0 { format!("ask-{i}") } else { format!("n{i}") };
            let args = json!({"op": "add", "note": note}).to_string();
            match toolgate_tests::run_or_kill(host(d, &["call", "notes", "--args", &args]), kill_after) {
                None => killed += 1,
                Some(o) => {
                    let v = json_out(&o);
                    match v["outcome"].as_str() {
                        Some("output") => {
                            acked_notes.insert(note);
                        }
                        Some("awaiting") => {
                            assert!(v.get("ticket").is_none(), "a ticket reached the caller: {v}");
                            acked_tickets.insert(ticket_of(d, v["request"].as_str().unwrap()).await);
                        }
                        other => panic!("unexpected outcome {other:?}: {v}"),
                    }
                }
            }
        }
    }

    // One approver is certainly killed mid-call: an approved `hostile.loop` spins
    // until its deadline, and the process dies holding the claim.
    let o = host(d, &["call", "hostile.loop"]).output().unwrap();
    let looping = ticket_of(d, json_out(&o)["request"].as_str().unwrap()).await;
    let looping_digest = digest_of(d, &looping).await;
    assert!(
        toolgate_tests::run_or_kill(
            host(d, &["approve", &looping, "--key", "approver.key", "--digest", &looping_digest]),
            Duration::from_millis(700)
        )
        .is_none()
    );
    // Restart after the lease: a new process settles claims of the dead ones,
    // then every ticket is accounted for.
    std::thread::sleep(Duration::from_millis(2100));
    let o = host(d, &["call", "notes", "--args", r#"{"op":"list"}"#]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config = Config::load(&d.join("toolgate.toml")).unwrap();
    let journal = SqliteJournal::open(config.store.file().expect("a SQLite journal")).unwrap();

    // Awaiting tickets are still resumable: approve every one still pending.
    for a in journal.pending().await.unwrap() {
        let digest = a.call_digest().hex();
        let o = host(d, &["approve", &a.ticket_id, "--key", "approver.key", "--digest", &digest]).output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "pending {} must resume: {}",
            a.ticket_id,
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(json_out(&o)["outcome"], "output");
    }
    assert!(journal.pending().await.unwrap().is_empty());

    let steps = journal.steps(None).await.unwrap();
    // None executed twice: call ids are unique among results; a ticket resolves at most once.
    let resolutions = toolgate_tests::assert_no_call_or_ticket_committed_twice(&steps);

    // No half-commit: the state is exactly a replay of the committed output steps.
    let mut replay: Vec<String> = Vec::new();
    for s in steps.iter().filter(|s| s.tool_id == "notes" && s.outcome == OutcomeKind::Output) {
        let args: Value = serde_json::from_str(&s.arguments).unwrap();
        if args["op"] == "add" {
            replay.push(args["note"].as_str().unwrap().to_owned());
        }
        let shown: Value = serde_json::from_str(&s.result).unwrap();
        assert_eq!(shown["notes"], json!(replay), "step {} reported a state the replay disagrees with", s.seq);
    }
    let state = journal.tool_state("default", "notes").await.unwrap();
    let stored: Vec<String> = state.get("notes").map(|v| serde_json::from_str(v).unwrap()).unwrap_or_default();
    assert_eq!(stored, replay, "Tool state and committed steps disagree");
    // Each note was added at most once, and none acknowledged is missing.
    let unique: BTreeSet<&String> = replay.iter().collect();
    assert_eq!(unique.len(), replay.len(), "a note was added twice: {replay:?}");
    for n in &acked_notes {
        assert!(unique.contains(n), "acknowledged note {n} is not in the journal");
    }
    for t in &acked_tickets {
        assert_eq!(resolutions.get(t.as_str()), Some(&1), "acknowledged ticket {t} did not resolve exactly once");
    }
    // Interrupted approvals are recorded, not silent: the settle path ran.
    let interrupted = steps.iter().filter(|s| s.result.starts_with("interrupted:")).count();
    assert!(interrupted > 0, "no interrupted approval was settled over {killed} kills");
    assert!(
        steps.iter().any(|s| s.ticket_id.as_deref() == Some(looping.as_str()) && s.result.starts_with("interrupted:")),
        "the approver killed mid-call was settled"
    );
    println!(
        "seed {seed:#x}: {killed} kills in {i} operations; {} steps, {} notes, {} tickets, {interrupted} interrupted approvals",
        steps.len(),
        replay.len(),
        acked_tickets.len()
    );
}

#[tokio::test]
async fn two_processes_approving_one_ticket_execute_it_once() {
    let dir = setup("machine");
    let d = dir.path();
    for round in 0..5 {
        let args = json!({"op": "add", "note": format!("ask-race-{round}")}).to_string();
        let o = host(d, &["call", "notes", "--args", &args]).output().unwrap();
        let ticket = ticket_of(d, json_out(&o)["request"].as_str().unwrap()).await;
        let digest = digest_of(d, &ticket).await;
        let a = host(d, &["approve", &ticket, "--key", "approver.key", "--digest", &digest]).spawn().unwrap();
        let b = host(d, &["approve", &ticket, "--key", "approver.key", "--digest", &digest]).spawn().unwrap();
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let mut codes = [a.status.code(), b.status.code()];
        codes.sort();
        assert_eq!(codes, [Some(0), Some(1)], "exactly one approval runs");
        let loser = if a.status.code() == Some(1) { &a } else { &b };
        assert!(String::from_utf8_lossy(&loser.stderr).contains("already used"));
    }
    let config = Config::load(&d.join("toolgate.toml")).unwrap();
    let journal = SqliteJournal::open(config.store.file().expect("a SQLite journal")).unwrap();
    let state = journal.tool_state("default", "notes").await.unwrap();
    let notes: Vec<String> = serde_json::from_str(&state["notes"]).unwrap();
    assert_eq!(notes, (0..5).map(|r| format!("ask-race-{r}")).collect::<Vec<_>>());
}
