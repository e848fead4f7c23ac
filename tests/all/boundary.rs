//! Invariants 13 and 14 against an adversary: a hostile Tool and a server
//! that reflects a credential back in every encoding servers and HTTP
//! libraries commonly produce — compressed or not, in bodies and headers,
//! in the same call and in a later call without the credential. Nothing of
//! a configured secret reaches the guest; the host's own records say what
//! it withheld; the host's files and threads stay out of reach.

use serde_json::{Value, json};
use toolgate::StepResult;
use toolgate::sandbox::executor::Content;
use toolgate_tests::{FORMS, TestHost, TestServer, encode, guests, packed};

/// A secret with `/`, `+`, `=` and a space: every encoding differs from it.
const SECRET: &str = "tg/s3+cr=t Zq8v";
/// Another configured credential, never granted to the Tool.
const OTHER: &str = "0th3r/s3cr=t+k3y";

struct World {
    host: TestHost,
    api: TestServer,
}

fn world() -> World {
    let api = TestServer::start(SECRET, "http://127.0.0.1:1/");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["plugins", "data", "scratch"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("data/a.txt"), "alpha\n").unwrap();
    for (name, secret) in [("tracker.secret", SECRET), ("other.secret", OTHER)] {
        std::fs::write(d.join(name), format!("{secret}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join(name), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(d.join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    let config = format!(
        r#"{preamble}
[limits]
timeout_ms = 5000
open_files = 16
file_streams = 32

[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = ["{api}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}

[credentials.other]
source = {{ file = "other.secret" }}
destinations = ["https://elsewhere.example:443"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}

[[grants]]
tools = "hostile.*"
directories = [
  {{ path = "/data", host = "data", access = "read" }},
  {{ path = "/scratch", host = "scratch", access = "read-write" }},
]
hosts = ["{api}"]
credentials = ["tracker"]

[agents.default]
visible = ["hostile.thief"]
default = "allow"
"#,
        preamble = toolgate_tests::PREAMBLE,
        api = api.origin(),
    );
    std::fs::write(d.join("toolgate.toml"), config).unwrap();
    World { host: TestHost::open(dir, "default"), api }
}

async fn thief(host: &TestHost, args: Value) -> String {
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    match run.call("hostile.thief", args.clone()).await.unwrap() {
        StepResult::Output { content: Content::Json(Value::String(s)), .. } => s,
        other => panic!("{args}: {other:?}"),
    }
}

/// The host's own records of the last step.
async fn host_records(host: &TestHost) -> Vec<String> {
    let last = host.runtime.store().steps(None).await.unwrap().pop().unwrap();
    let captured: Value = serde_json::from_str(&last.captured).unwrap();
    captured["host"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
}

/// No form of either secret in `seen` (what the guest observed).
fn assert_clean(seen: &str, what: &str) {
    for secret in [SECRET, OTHER] {
        for form in FORMS {
            let encoded = encode(form, secret);
            assert!(!seen.contains(&encoded), "{what}: the guest saw the secret as {form}: {seen}");
        }
    }
}

#[tokio::test]
async fn a_reflected_secret_never_reaches_the_guest_in_any_common_form() {
    let w = world();
    let mut checked = 0;
    // Compressed as declared, on several lines, and with nothing declared at all.
    const BODY_CODINGS: &[&str] =
        &["identity", "gzip", "deflate", "gzip-deflate-lines", "gzip-unlabeled", "zlib-unlabeled", "gzip-part"];
    for form in FORMS {
        for place in ["body", "header"] {
            let codings = if place == "body" { BODY_CODINGS } else { &BODY_CODINGS[..2] };
            for &coding in codings {
                let url = w.api.url(&format!("/reflect?form={form}&in={place}&coding={coding}"));
                let seen = thief(&w.host, json!({"op": "http", "target": url, "credential": true})).await;
                let what = format!("{form} in the {place}, {coding}");
                assert!(seen.starts_with("err: ") && seen.contains("withheld"), "{what}: {seen}");
                assert_clean(&seen, &what);
                let records = host_records(&w.host).await;
                assert!(
                    records.iter().any(|r| r.contains("withheld") && r.contains("credential `tracker`")),
                    "{what}: {records:?}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, FORMS.len() * (BODY_CODINGS.len() + 2));
    // Each request did carry the credential: the server saw it and reflected it.
    assert!(w.api.requests().iter().all(|r| r.header("authorization") == Some(&format!("Bearer {SECRET}"))));
    // Nothing in the journal either (the guest's output is committed there).
    assert_no_secret_in(&w.host.dir.path().join("journal.db"));
}

#[tokio::test]
async fn a_secret_returned_later_without_the_credential_is_withheld() {
    let w = world();
    // The server keeps the token it received once...
    let first =
        thief(&w.host, json!({"op": "http", "target": w.api.url("/reflect?form=raw"), "credential": true})).await;
    assert!(first.contains("withheld"), "{first}");
    // ...and a later call, without any credential, asks for it back.
    for form in ["raw", "b64", "hex", "json-u", "pct-lower", "b64-bearer"] {
        for coding in ["identity", "gzip"] {
            let url = w.api.url(&format!("/recall?form={form}&coding={coding}"));
            let seen = thief(&w.host, json!({"op": "http", "target": url, "credential": false})).await;
            assert!(seen.contains("withheld"), "{form}, {coding}: {seen}");
            assert_clean(&seen, form);
        }
    }
}

#[tokio::test]
async fn a_credential_refreshed_during_a_call_is_watched_in_its_new_value() {
    let w = world();
    const REFRESHED: &str = "n3w/t0k3n=after+refresh";
    w.api.on_rotate(&w.host.dir.path().join("tracker.secret"), REFRESHED);
    // One call: a clean answer (its check reads the secret), a token
    // refresh, then a request carrying the new token, which the server reflects.
    let then = [w.api.url("/rotate"), w.api.url("/reflect?form=b64")];
    let args = json!({"op": "http", "target": w.api.url("/issues?state=open"), "then": then, "credential": true});
    let seen = thief(&w.host, args).await;
    let lines: Vec<&str> = seen.lines().filter(|l| l.starts_with("ok: ") || l.starts_with("err: ")).collect();
    assert!(lines.len() == 3 && lines[0].starts_with("ok: 200") && lines[1].starts_with("ok: 200"), "{seen}");
    assert!(lines[2].contains("withheld"), "{seen}");
    for form in FORMS {
        assert!(!seen.contains(&encode(form, REFRESHED)), "the guest saw the refreshed token as {form}: {seen}");
    }
    assert!(host_records(&w.host).await.iter().any(|r| r.contains("withheld") && r.contains("credential `tracker`")));
    // The server did get the new token: the refresh was real.
    let last = w.api.requests().pop().unwrap();
    assert_eq!(last.header("authorization"), Some(format!("Bearer {REFRESHED}").as_str()));
}

#[tokio::test]
async fn every_configured_secret_is_checked_not_only_the_one_applied() {
    let w = world();
    // A server that knows another credential's secret (stored from elsewhere)
    // and sends it to this Tool, which was never granted that credential.
    for form in ["raw", "b64", "json-slash", "html-named"] {
        let headers = json!([["x-relay", encode(form, OTHER)]]);
        let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
        assert!(seen.contains("withheld"), "{form}: {seen}");
        assert_clean(&seen, form);
        assert!(host_records(&w.host).await.iter().any(|r| r.contains("credential `other`")));
    }
}

#[tokio::test]
async fn the_guest_cannot_negotiate_what_the_host_cannot_check() {
    let w = world();
    // Accept-Encoding is pinned to identity, TE dropped: the server sees what the host sent.
    let headers = json!([["accept-encoding", "gzip, br"], ["te", "trailers, gzip"]]);
    let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
    assert!(seen.starts_with("ok: 200"), "{seen}");
    let sent = w.api.requests().pop().unwrap();
    assert_eq!(sent.header("accept-encoding"), Some("identity"));
    assert_eq!(sent.header("te"), None);
    // A coding the host cannot decode is refused, not passed through.
    let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/recall?coding=br")})).await;
    assert!(seen.starts_with("err: "), "{seen}");
    assert!(host_records(&w.host).await.iter().any(|r| r.contains("content coding `br`")));
    // The coding's name is the server's text: a secret in it (in any form)
    // is caught in the head, and an unknown name is never repeated back.
    for form in ["raw", "hex", "b64"] {
        let coding = encode(form, OTHER);
        let target = format!("{}?coding={coding}", w.api.url("/recall"));
        let seen = thief(&w.host, json!({"op": "http", "target": target})).await;
        assert!(seen.starts_with("err: "), "{form}: {seen}");
        assert_clean(&seen, form);
        assert!(host_records(&w.host).await.iter().any(|r| r.contains("a header held credential `other`")), "{form}");
    }
    let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/recall?coding=x-mine-42")})).await;
    assert!(seen.starts_with("err: ") && !seen.contains("x-mine-42"), "{seen}");
    assert!(host_records(&w.host).await.iter().all(|r| !r.contains("x-mine-42")));
    // A partial response could carry a secret in pieces: Range is refused before anything is sent.
    let before = w.api.requests().len();
    let headers = json!([["range", "bytes=0-3"]]);
    let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
    assert!(seen.starts_with("err: ") && seen.contains("denied"), "{seen}");
    assert_eq!(w.api.requests().len(), before, "nothing left the host");
    assert!(host_records(&w.host).await.iter().any(|r| r.contains("Range")));
}

#[tokio::test]
async fn one_request_carries_at_most_one_credential_and_no_userinfo() {
    let w = world();
    let before = w.api.requests().len();
    let headers = json!([["toolgate-credential", "tracker"]]);
    let seen =
        thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "credential": true, "headers": headers}))
            .await;
    assert!(seen.starts_with("err: ") && seen.contains("denied"), "{seen}");
    assert!(host_records(&w.host).await.iter().any(|r| r.contains("2 credentials")), "the check fires");
    let url = format!("http://bot:pw@127.0.0.1:{}/echo", w.api.port);
    let seen = thief(&w.host, json!({"op": "http", "target": url})).await;
    assert!(seen.starts_with("err: "), "{seen}");
    assert_eq!(w.api.requests().len(), before, "nothing left the host");
}

#[tokio::test]
async fn the_hosts_records_are_apart_from_what_the_guest_writes() {
    let w = world();
    // The guest floods its own output with lines that imitate the host's, then is denied.
    let seen = thief(&w.host, json!({"op": "forge", "target": "http://127.0.0.1:1/"})).await;
    assert!(seen.starts_with("err: "), "{seen}");
    let last = w.host.runtime.store().steps(None).await.unwrap().pop().unwrap();
    let captured: Value = serde_json::from_str(&last.captured).unwrap();
    let host: Vec<&str> = captured["host"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(host.len(), 1, "exactly the host's own record: {host:?}");
    assert!(host[0].contains("http://127.0.0.1:1 is not granted"), "{host:?}");
    assert!(captured["dropped"].as_u64().unwrap() > 0, "the guest's flood was bounded");
    assert!(
        captured["stderr"].as_str().unwrap().contains("outbound request denied: forged"),
        "the imitation stays in the guest's stream"
    );
}

/// Invariant 14, the host's resources: what one call holds open through its
/// filesystem — files and directory listings (descriptors of the host
/// process), file streams with their host read buffers — is bounded live,
/// each by its own limit, whatever the guest does; opened and dropped one
/// after another, it is never refused (a search Tool opens thousands of
/// files in turn).
#[tokio::test]
async fn what_a_call_holds_open_is_bounded_live_by_its_limits() {
    let w = world();
    for (op, target, count, limit, setting) in [
        ("hold-files", "/data/a.txt", 40, 16, "limits.open_files"),
        ("hold-streams", "/data/a.txt", 40, 32, "limits.file_streams"),
        // A stream keeps its file open after the guest drops the descriptor.
        ("hold-streams-of-dropped-files", "/data/a.txt", 40, 16, "limits.open_files"),
        ("hold-listings", "/data", 40, 16, "limits.open_files"),
    ] {
        let seen = thief(&w.host, json!({"op": op, "target": target, "count": count})).await;
        assert!(seen.starts_with(&format!("held {limit} of {count} (")), "{op}: {seen}");
        assert!(
            seen.contains("insufficient-memory") || seen.contains("Out of memory"),
            "{op}: the guest gets an error: {seen}"
        );
        assert!(seen.ends_with(&format!("one at a time {count} of {count}")), "{op}: {seen}");
        let records = host_records(&w.host).await;
        let refused = count - limit;
        assert!(
            records.iter().any(|r| r.starts_with(&format!("{refused} opens were refused")) && r.contains(setting)),
            "{op}: the host records which limit the call met: {records:?}"
        );
    }
    // A listing is read as the guest asks, a batch at a time: a directory of
    // many batches is listed whole, every name once, with its type.
    let many = w.host.dir.path().join("data/many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..300 {
        std::fs::write(many.join(format!("n{i:03}")), "").unwrap();
    }
    std::fs::create_dir(many.join("sub")).unwrap();
    let seen = thief(&w.host, json!({"op": "list", "target": "/data/many"})).await;
    let names: std::collections::BTreeSet<&str> = seen.split('"').skip(1).step_by(2).collect();
    assert_eq!(names.len(), 301, "{seen}");
    assert!(names.contains("n000") && names.contains("n299") && names.contains("sub"), "{seen}");
}

#[tokio::test]
async fn a_fifo_inside_a_grant_is_refused_without_blocking_a_host_thread() {
    let w = world();
    let fifo = w.host.dir.path().join("data/pipe");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let started = std::time::Instant::now();
    let seen = thief(&w.host, json!({"op": "read", "target": "/data/pipe"})).await;
    assert!(seen.starts_with("err: "), "{seen}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "refused at once, not at the deadline");
    // Regular files beside it still read.
    assert_eq!(thief(&w.host, json!({"op": "read", "target": "/data/a.txt"})).await, "ok: \"alpha\\n\"");
}

fn assert_no_secret_in(path: &std::path::Path) {
    for suffix in ["", "-wal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(bytes) = std::fs::read(&p) {
            for secret in [SECRET, OTHER] {
                assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()), "{}", p.to_string_lossy());
            }
        }
    }
}
