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
    world_with("", "")
}

/// [`world`] with more `[limits]` lines, and more keys in the grant.
fn world_with(limits: &str, grant: &str) -> World {
    world_with_credentials(limits, grant, "")
}

/// [`world_with`] with more credentials (tables after the two of [`world`]).
fn world_with_credentials(limits: &str, grant: &str, credentials: &str) -> World {
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
{limits}

[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = ["{api}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}

[credentials.other]
source = {{ file = "other.secret" }}
destinations = ["https://elsewhere.example:443"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}
{credentials}

[[grants]]
tools = "hostile.*"
directories = [
  {{ path = "/data", host = "data", access = "read" }},
  {{ path = "/scratch", host = "scratch", access = "read-write" }},
]
hosts = ["{api}"]
credentials = ["tracker"]
{grant}

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
        // The guest learns that some configured secret was found, never which one nor how it was written.
        assert!(
            seen.contains("it held a configured secret") && !seen.contains("other") && !seen.contains("credential"),
            "{seen}"
        );
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
        assert!(
            host_records(&w.host).await.iter().any(|r| r.contains("a header held the secret of credential `other`")),
            "{form}"
        );
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

/// Invariant 14: a record quotes what the guest sent, which has no length
/// limit of its own. A host name of 300 KB, denied, was kept whole in the
/// host's memory (64 such records per call) and written to the journal.
#[tokio::test]
async fn a_hosts_record_quoting_the_guest_is_bounded() {
    let w = world();
    let long = format!("http://{}.example/x", "a".repeat(300_000));
    let scheme = format!("{}://127.0.0.1:1/", "x".repeat(100_000));
    let seen = thief(&w.host, json!({"op": "http", "target": long, "then": [scheme]})).await;
    assert!(seen.starts_with("err: "), "{seen}");
    let host = host_records(&w.host).await;
    assert!(!host.is_empty(), "the denials are recorded");
    for r in &host {
        assert!(r.len() <= 1200, "a record of {} bytes: {}…", r.len(), &r[..r.floor_char_boundary(200)]);
    }
    assert!(host.iter().any(|r| r.contains("a host of 300008 bytes")), "{host:?}");
}

/// Invariant 14, a deadline ends what a call waits on: an HTTPS server that
/// accepts the connection and never answers the TLS handshake. wasmtime-wasi-http
/// times the TCP connect, the HTTP handshake and the first byte, not the TLS
/// handshake: the request held its slots until the call's deadline, far past
/// `limits.http_timeout_ms`. Now the guest gets a timeout error and goes on.
#[tokio::test]
async fn a_server_that_never_finishes_the_tls_handshake_times_out_the_request() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and hold every connection, never writing a byte.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    for sub in ["plugins", "data", "scratch"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    std::fs::write(dir.path().join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    // The Tool declares a credential; granted, unused here.
    std::fs::write(dir.path().join("tracker.secret"), format!("{SECRET}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path().join("tracker.secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = format!(
        r#"{preamble}
[limits]
timeout_ms = 30000
http_timeout_ms = 300

[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = ["https://127.0.0.1:{port}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}

[[grants]]
tools = "hostile.*"
directories = [
  {{ path = "/data", host = "data", access = "read" }},
  {{ path = "/scratch", host = "scratch", access = "read-write" }},
]
hosts = ["https://127.0.0.1:{port}"]
credentials = ["tracker"]

[agents.default]
visible = ["hostile.thief"]
default = "allow"
"#,
        preamble = toolgate_tests::PREAMBLE,
    );
    std::fs::write(dir.path().join("toolgate.toml"), config).unwrap();
    let host = TestHost::open(dir, "default");
    // Before, the call ended at its deadline, as a Tool error (`thief` panics on one).
    let seen = thief(&host, json!({"op": "http", "target": format!("https://127.0.0.1:{port}/")})).await;
    assert!(seen.starts_with("err: ") && seen.to_lowercase().contains("timeout"), "{seen}");
}

/// Invariant 14, disk: a Tool with a read-write grant could fill the
/// filesystem the journal, the cache and every other call write to, in one
/// call. What one call writes is bounded by `limits.disk_write_mib` through
/// every way a guest writes a file, and the names it creates by
/// `limits.files_created`; past either it gets `insufficient-space`, as from
/// a full disk, and the host records the setting. The next call has its own.
#[tokio::test]
async fn what_a_call_writes_to_disk_is_bounded_by_its_budget() {
    let w = world_with("disk_write_mib = 1\nfiles_created = 20", "");
    let scratch = w.host.dir.path().join("scratch");
    for op in ["fill", "fill-stream", "fill-at"] {
        let target = format!("/scratch/{op}.bin");
        let seen = thief(&w.host, json!({"op": op, "target": target, "count": 4096})).await;
        // wasi-libc reports a failed stream write as EIO (its errno 29), whatever the host's code.
        let code = if op == "fill" { "os error 29" } else { "insufficient-space" };
        assert!(seen.starts_with("err: after 1024 KiB") && seen.contains(code), "{op}: {seen}");
        let size = std::fs::metadata(scratch.join(format!("{op}.bin"))).unwrap().len();
        assert_eq!(size, 1 << 20, "{op} wrote {size} bytes");
        let host = host_records(&w.host).await;
        assert!(host.iter().any(|r| r.contains("limits.disk_write_mib")), "{op}: {host:?}");
    }
    // Growing a file counts as writing it, however few bytes make it grow:
    // a filesystem that cannot leave a hole fills it with zeroes.
    for op in ["sparse-at", "sparse-stream", "grow"] {
        let target = format!("/scratch/{op}.bin");
        let seen = thief(&w.host, json!({"op": op, "target": target, "count": 1 << 20})).await;
        assert!(seen.starts_with("err: ") && seen.contains("insufficient-space"), "{op}: {seen}");
        let size = std::fs::metadata(scratch.join(format!("{op}.bin"))).unwrap().len();
        assert!(size <= 1 << 20, "{op} grew the file to {size} bytes");
    }
    // Its own budget: a call writing within it is not refused.
    let seen = thief(&w.host, json!({"op": "fill", "target": "/scratch/fill.bin", "count": 512})).await;
    assert_eq!(seen, "ok: 512 KiB");
    for kind in ["files", "dirs", "links"] {
        std::fs::create_dir(scratch.join(kind)).unwrap();
        let args = json!({"op": "create-many", "target": format!("/scratch/{kind}"), "count": 100, "then": [kind]});
        let seen = thief(&w.host, args).await;
        assert!(seen.starts_with("made 20 of 100 (StorageFull"), "{kind}: {seen}");
        assert_eq!(std::fs::read_dir(scratch.join(kind)).unwrap().count(), 20, "{kind}");
        let host = host_records(&w.host).await;
        assert!(host.iter().any(|r| r.contains("limits.files_created")), "{kind}: {host:?}");
    }
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

/// What a call holds in the host for requests it has not sent — body bytes
/// the HTTP client has not taken, header fields, authorities — is bounded
/// live by `limits.http_request_total_kib`, whatever the Tool's grants
/// (`wasi:http` is linked into every component, and the review's attack never
/// calls `handle`, where the outbound policy runs): requests each holding a
/// full body buffer, never sent, are refused past the budget with an error
/// code naming the setting, and the host records it; what the guest drops
/// frees its place; a request body larger than the budget still streams out
/// whole (only what the client has not taken counts).
#[tokio::test]
async fn what_a_call_holds_in_requests_it_has_not_sent_is_bounded_by_its_budget() {
    const SETTING: &str = "limits.http_request_total_kib";
    let w = world_with("http_request_total_kib = 256", "");
    // Each body buffers at most two 64 KiB chunks in the host: two requests fit.
    let seen = thief(&w.host, json!({"op": "hoard", "target": "bodies", "count": 10})).await;
    assert!(seen.starts_with("held 2 of 10 ("), "{seen}");
    assert!(seen.contains(SETTING), "the guest's error code names the setting: {seen}");
    assert!(seen.contains("; 256 KiB written at once;"), "{seen}");
    assert!(seen.ends_with("one at a time 10 of 10"), "what is dropped frees its place: {seen}");
    let records = host_records(&w.host).await;
    assert!(
        records.iter().any(|r| r.starts_with("8 writes or header changes were refused") && r.contains(SETTING)),
        "the host records the limit the call met: {records:?}"
    );
    // Header fields (60 KiB each: four fit) and authorities (100 KiB each:
    // two fit): dropped, they free their place; past the budget the call is
    // stopped, naming the setting.
    for (what, fit) in [("fields", 4), ("authority", 2)] {
        let seen = thief(&w.host, json!({"op": "hoard", "target": what, "count": fit})).await;
        assert!(seen.starts_with(&format!("held {fit} of {fit} (no error)")), "{what}: {seen}");
        assert!(seen.ends_with(&format!("one at a time {fit} of {fit}")), "{what}: {seen}");
        let run = w.host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
        match run.call("hostile.thief", json!({"op": "hoard", "target": what, "count": 10})).await.unwrap() {
            StepResult::ToolError { message, .. } => assert!(message.contains(SETTING), "{what}: {message}"),
            other => panic!("{what}: {other:?}"),
        }
        let records = host_records(&w.host).await;
        assert!(
            records.iter().any(|r| r.starts_with("1 write or header change was refused") && r.contains(SETTING)),
            "{what}: {records:?}"
        );
    }
    // A body of 900 KiB (more than the budget) streams to the server whole.
    let seen = thief(&w.host, json!({"op": "post", "target": w.api.url("/upload"), "count": 900})).await;
    assert_eq!(seen, format!("ok: 200 received {} bytes", (900 << 10) + 2), "a JSON string: its quotes too");
}

#[tokio::test]
async fn a_fifo_inside_a_grant_is_refused_without_blocking_a_host_thread() {
    let w = world();
    let fifo = w.host.dir.path().join("data/pipe");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let started = std::time::Instant::now();
    let seen = thief(&w.host, json!({"op": "read", "target": "/data/pipe"})).await;
    // The guest's own error (not the deadline's trap) says it was refused;
    // the bound only catches a hang (a blocked open), not speed on a loaded machine.
    assert!(seen.starts_with("err: "), "refused, not ended by the deadline: {seen}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "the call did not hang on the FIFO");
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

/// Invariants 7 and 13, files: a granted directory that holds a configured
/// secret — a `.env`, a Git config with the token in its remote's URL, an
/// `.npmrc`, a `.netrc` with a credential never granted to the Tool, a copy
/// of the secret file, the secret in every common form — gives the guest
/// none of it: the open fails with `access` before a byte is read, and the
/// host records the credential and the guest's path (never the value). A
/// name holding a secret is left out of a listing; a file larger than the
/// host checks is refused naming the setting; clean files beside them read.
#[tokio::test]
async fn a_file_holding_a_configured_secret_is_never_read_by_the_guest() {
    let w = world_with("file_check_mib = 1", "");
    let data = w.host.dir.path().join("data");
    std::fs::create_dir(data.join(".git")).unwrap();
    let copy = std::fs::read(w.host.dir.path().join("tracker.secret")).unwrap();
    let mut files: Vec<(String, Vec<u8>, &str)> = vec![
        (".env".into(), format!("GH_TOKEN={SECRET}\nDEBUG=1\n").into_bytes(), "tracker"),
        (
            ".git/config".into(),
            format!("[remote \"origin\"]\n\turl = https://x:{}@github.com/o/r\n", encode("form", SECRET)).into_bytes(),
            "tracker",
        ),
        (
            ".npmrc".into(),
            format!("//registry.npmjs.org/:_authToken={}\n", encode("b64", SECRET)).into_bytes(),
            "tracker",
        ),
        (".netrc".into(), format!("machine elsewhere.example login bot password {OTHER}\n").into_bytes(), "other"),
        ("copy.secret".into(), copy, "tracker"),
    ];
    for form in FORMS {
        files.push((format!("leak-{form}.txt"), format!("key = {}\n", encode(form, SECRET)).into_bytes(), "tracker"));
    }
    for (name, content, credential) in &files {
        std::fs::write(data.join(name), content).unwrap();
        let seen = thief(&w.host, json!({"op": "read", "target": format!("/data/{name}")})).await;
        assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{name}: {seen}");
        assert_clean(&seen, name);
        let records = host_records(&w.host).await;
        assert!(
            records.iter().any(|r| r.starts_with(&format!("file \"/data/{name}\" refused to the guest (`access`)"))
                && r.contains(&format!("credential `{credential}`"))),
            "{name}: {records:?}"
        );
        for record in &records {
            assert_clean(record, name);
        }
    }
    // Opened again in one call, or read through a stream: refused the same way.
    let seen = thief(&w.host, json!({"op": "hold-streams", "target": "/data/.env", "count": 2})).await;
    assert!(seen.starts_with("err: ") && seen.contains("name: \"access\""), "{seen}");
    // A name that holds a secret is left out of the listing; the rest are listed.
    std::fs::write(data.join(encode("hex", SECRET)), "").unwrap();
    let seen = thief(&w.host, json!({"op": "list", "target": "/data"})).await;
    assert!(seen.starts_with("ok: ") && seen.contains("\"a.txt\"") && seen.contains("\".env\""), "{seen}");
    assert_clean(&seen, "a listing");
    let records = host_records(&w.host).await;
    assert!(records.iter().any(|r| r.contains("listing of \"/data\" was left out") && r.contains("`tracker`")));
    // So is a link's target.
    std::os::unix::fs::symlink(encode("b64", SECRET), data.join("link")).unwrap();
    let seen = thief(&w.host, json!({"op": "readlink", "target": "/data/link"})).await;
    assert!(seen.starts_with("err: "), "{seen}");
    assert_clean(&seen, "a link");
    let records = host_records(&w.host).await;
    assert!(records.iter().any(|r| r.contains("link \"/data/link\" was refused") && r.contains("`tracker`")));
    // A file the guest may write but opens for writing only is checked too:
    // cutting a secret down to what the guest may read (byte by byte, the
    // refusal telling when the rest is gone) is refused at the open, the file
    // left whole.
    let scratch = w.host.dir.path().join("scratch");
    let env = format!("GH_TOKEN={SECRET}\n");
    std::fs::write(scratch.join(".env"), &env).unwrap();
    let cut = thief(&w.host, json!({"op": "cut", "target": "/scratch/.env", "count": 9 + SECRET.len() - 1})).await;
    assert!(cut.starts_with("err: ") && cut.contains("ermission denied"), "{cut}");
    assert_eq!(std::fs::read_to_string(scratch.join(".env")).unwrap(), env, "the file is whole");
    assert!(host_records(&w.host).await.iter().any(|r| r.starts_with("file \"/scratch/.env\" refused")));
    // Writing a clean file that way still works.
    std::fs::write(scratch.join("out.txt"), "0123456789").unwrap();
    assert_eq!(thief(&w.host, json!({"op": "cut", "target": "/scratch/out.txt", "count": 4})).await, "ok: ()");
    assert_eq!(std::fs::read_to_string(scratch.join("out.txt")).unwrap(), "0123");
    // Larger than the host checks: refused, naming the setting.
    std::fs::write(data.join("big.log"), vec![b'.'; (1 << 20) + 1]).unwrap();
    let seen = thief(&w.host, json!({"op": "read", "target": "/data/big.log"})).await;
    assert!(seen.starts_with("err: "), "{seen}");
    assert!(host_records(&w.host).await.iter().any(|r| r.contains("`limits.file_check_mib` = 1")));
    // The negative control: clean files read, whole.
    assert_eq!(thief(&w.host, json!({"op": "read", "target": "/data/a.txt"})).await, "ok: \"alpha\\n\"");
    std::fs::write(data.join("notes.md"), "GH_TOKEN is read from the environment\n").unwrap();
    let seen = thief(&w.host, json!({"op": "read", "target": "/data/notes.md"})).await;
    assert_eq!(seen, "ok: \"GH_TOKEN is read from the environment\\n\"");
    assert_no_secret_in(&w.host.dir.path().join("journal.db"));
}

/// Invariants 7 and 13 for a credential the host refuses to use: its secret
/// file is readable by others (a Kubernetes secret volume's default 0644).
/// Refusing to send it does not stop watching for it: a granted `.env`
/// holding it is refused to the guest, a response echoing it is withheld.
#[tokio::test]
async fn a_secret_the_host_refuses_to_apply_is_still_kept_from_the_guest() {
    const LOOSE: &str = "l00se/k8s-v0lume+t0ken";
    let loose = r#"
[credentials.loose]
source = { file = "loose.secret" }
destinations = ["https://loose.example:443"]
apply = { header = { name = "Authorization", format = "Bearer {}" } }
"#;
    let w = world_with_credentials("", "", loose);
    let secret = w.host.dir.path().join("loose.secret");
    std::fs::write(&secret, format!("{LOOSE}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(w.host.dir.path().join("data/.env"), format!("LOOSE_TOKEN={LOOSE}\n")).unwrap();
    let seen = thief(&w.host, json!({"op": "read", "target": "/data/.env"})).await;
    assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{seen}");
    assert!(!seen.contains(LOOSE), "{seen}");
    let records = host_records(&w.host).await;
    assert!(records.iter().any(|r| r.contains("\"/data/.env\" refused") && r.contains("`loose`")), "{records:?}");
    for form in ["raw", "b64", "hex"] {
        let headers = json!([["x-relay", encode(form, LOOSE)]]);
        let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
        assert!(seen.contains("withheld") && !seen.contains(&encode(form, LOOSE)), "{form}: {seen}");
        assert!(host_records(&w.host).await.iter().any(|r| r.contains("credential `loose`")), "{form}");
    }
    // Clean files beside it still read.
    assert_eq!(thief(&w.host, json!({"op": "read", "target": "/data/a.txt"})).await, "ok: \"alpha\\n\"");
}

/// Invariant 13 for a secret stored with more than the token: blanks
/// around it (sent as `Bearer tok-… `, read by the server without them),
/// or a scheme before it (`Bearer s3cr3t…` applied with the format `{}`).
/// What the destination reads as the credential is watched in every form.
#[tokio::test]
async fn a_secret_is_watched_as_the_destination_reads_it() {
    let extra = r#"
[credentials.spaced]
source = { file = "spaced.secret" }
destinations = ["https://spaced.example:443"]
apply = { header = { name = "Authorization", format = "Bearer {}" } }

[credentials.schemed]
source = { file = "schemed.secret" }
destinations = ["https://schemed.example:443"]
apply = { header = { name = "Authorization" } }
"#;
    let w = world_with_credentials("", "", extra);
    use std::os::unix::fs::PermissionsExt as _;
    for (name, stored) in [("spaced", "tok-abcdef0123456789 \n"), ("schemed", "Bearer s3cr3t-t0ken-value\n")] {
        let path = w.host.dir.path().join(format!("{name}.secret"));
        std::fs::write(&path, stored).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let data = w.host.dir.path().join("data");
    for (file, content, credential) in [
        ("spaced.txt", format!("token_hex = {}\n", encode("hex", "tok-abcdef0123456789")), "spaced"),
        ("schemed.json", "{\"token\":\"s3cr3t-t0ken-value\"}\n".to_owned(), "schemed"),
    ] {
        std::fs::write(data.join(file), &content).unwrap();
        let seen = thief(&w.host, json!({"op": "read", "target": format!("/data/{file}")})).await;
        assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{file}: {seen}");
        let records = host_records(&w.host).await;
        assert!(records.iter().any(|r| r.contains(&format!("credential `{credential}`"))), "{file}: {records:?}");
    }
    let headers = json!([["x-relay", encode("b64", "Bearer tok-abcdef0123456789")]]);
    let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
    assert!(seen.contains("withheld"), "{seen}");
    assert!(host_records(&w.host).await.iter().any(|r| r.contains("credential `spaced`")));
}

/// Invariant 13 for a secret stored already encoded: a secret file
/// holding the base64 of `bot:<password>`, applied as `Basic {}`. The
/// server decodes it and echoes the password (plain, JSON-escaped,
/// percent-encoded, in a header, later without the credential): each
/// response is withheld, naming the credential, and a granted file
/// holding the password is refused. The request carried the credential
/// (named `tracker`, as the hostile guest declares it).
#[tokio::test]
async fn a_secret_stored_encoded_is_watched_as_the_server_decodes_it() {
    use base64::Engine as _;
    // Its own: every value this process read is watched, and another test
    // binds `s3cr3t-t0ken-value` (its credential would be named first).
    const PASSWORD: &str = "b0t-p4ssw0rd-0f-v4lue";
    let api = TestServer::start(SECRET, "http://127.0.0.1:1/");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["plugins", "data", "scratch"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    let stored = base64::engine::general_purpose::STANDARD.encode(format!("bot:{PASSWORD}"));
    std::fs::write(d.join("tracker.secret"), format!("{stored}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(d.join("tracker.secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(d.join("data/notes.txt"), format!("password: {PASSWORD}\n")).unwrap();
    std::fs::write(d.join("data/a.txt"), "alpha\n").unwrap();
    std::fs::write(d.join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    let config = format!(
        r#"{preamble}
[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = ["{api}"]
apply = {{ header = {{ name = "Authorization", format = "Basic {{}}" }} }}

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
    let host = TestHost::open(dir, "default");
    for (form, place) in [("raw", "body"), ("json-u", "body"), ("pct-upper", "body"), ("raw", "header")] {
        let url = api.url(&format!("/reflect?form={form}&in={place}&coding=identity"));
        let seen = thief(&host, json!({"op": "http", "target": url, "credential": true})).await;
        assert!(seen.contains("withheld") && !seen.contains(PASSWORD), "{form} in {place}: {seen}");
        let records = host_records(&host).await;
        assert!(records.iter().any(|r| r.contains("credential `tracker`")), "{form} in {place}: {records:?}");
    }
    // The server saw the encoded value, as `Basic` carries it.
    let sent = api.requests().pop().unwrap();
    assert_eq!(sent.header("authorization"), Some(format!("Basic {stored}").as_str()));
    // Asked for later without the credential: the password alone.
    let seen = thief(&host, json!({"op": "http", "target": api.url("/recall?form=raw"), "credential": false})).await;
    assert!(seen.contains("withheld") && !seen.contains(PASSWORD), "{seen}");
    let seen = thief(&host, json!({"op": "read", "target": "/data/notes.txt"})).await;
    assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{seen}");
    assert!(host_records(&host).await.iter().any(|r| r.contains("credential `tracker`")));
    assert_eq!(thief(&host, json!({"op": "read", "target": "/data/a.txt"})).await, "ok: \"alpha\\n\"");
}

/// Invariant 13 end to end for encodings the check once passed: UTF-16
/// text mostly beyond Latin (PowerShell's `>` of a Cyrillic report) holding
/// `Basic <base64>`, a secret's letters beyond ASCII as `htmlentities`
/// writes them or upper-cased, escapes upper-cased after they were written,
/// and a secret file saved with a byte order mark. Each file is refused and
/// each response withheld, naming the credential; the request carried the
/// secret without the mark.
#[tokio::test]
async fn text_in_utf16_named_references_changed_case_and_a_marked_secret_are_kept_from_the_guest() {
    const ACCENTED: &str = "caf\u{e9}-s3cr3t-\u{fc}ber";
    const MARKED: &str = "tok-m4rk3d-0123456789";
    let extra = r#"
[credentials.accented]
source = { file = "accented.secret" }
destinations = ["https://accented.example:443"]
apply = { header = { name = "Authorization", format = "Bearer {}" } }

[credentials.marked]
source = { file = "marked.secret" }
destinations = ["https://marked.example:443"]
apply = { basic = { username = "bot" } }
"#;
    let w = world_with_credentials("", "", extra);
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt as _;
    for (name, stored) in [("accented", format!("{ACCENTED}\n")), ("marked", format!("\u{feff}{MARKED}\r\n"))] {
        let path = w.host.dir.path().join(format!("{name}.secret"));
        std::fs::write(&path, stored).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let prose = "\u{41e}\u{442}\u{447}\u{451}\u{442} \u{43e} \u{432}\u{44b}\u{43f}\u{43e}\u{43b}\u{43d}\u{435}\u{43d}\u{438}\u{438} \u{437}\u{430}\u{434}\u{430}\u{43d}\u{438}\u{44f}. "
        .repeat(8);
    let utf16le = |text: &str| -> Vec<u8> {
        [0xFF, 0xFE].into_iter().chain(text.encode_utf16().flat_map(u16::to_le_bytes)).collect()
    };
    let upper_json_u = |s: &str| -> String { s.encode_utf16().map(|u| format!("\\U{u:04X}")).collect() };
    let data = w.host.dir.path().join("data");
    for (file, content, credential) in [
        (
            "report.txt",
            utf16le(&format!("{prose}\r\n\"auth\":\"Basic {}\"\r\n{prose}", b64(&format!("u:{SECRET}")))),
            "tracker",
        ),
        ("page.html", b"<p>caf&eacute;-s3cr3t-&uuml;ber</p>".to_vec(), "accented"),
        ("shout.txt", "CAF\u{c9}-S3CR3T-\u{dc}BER".as_bytes().to_vec(), "accented"),
        ("log.json", format!("{{\"ECHO\":\"{}\"}}", upper_json_u(SECRET)).into_bytes(), "tracker"),
        ("marked.txt", format!("token = {}\n", b64(MARKED)).into_bytes(), "marked"),
    ] {
        std::fs::write(data.join(file), &content).unwrap();
        let seen = thief(&w.host, json!({"op": "read", "target": format!("/data/{file}")})).await;
        assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{file}: {seen}");
        let records = host_records(&w.host).await;
        assert!(records.iter().any(|r| r.contains(&format!("credential `{credential}`"))), "{file}: {records:?}");
    }
    for (value, credential) in [
        ("caf&Eacute;-s3cr3t-&Uuml;ber".to_owned(), "accented"),
        (upper_json_u(SECRET).replace('\\', "%5C"), "tracker"),
        (format!("Basic {}", b64(&format!("bot:{MARKED}"))), "marked"),
    ] {
        let headers = json!([["x-relay", value]]);
        let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
        assert!(seen.contains("withheld"), "{value}: {seen}");
        assert!(host_records(&w.host).await.iter().any(|r| r.contains(&format!("credential `{credential}`"))));
    }
    // The same text without a secret (and without the mark, which the
    // Tool's UTF-8 read would refuse) reads whole.
    std::fs::write(data.join("clean.txt"), &utf16le(&prose)[2..]).unwrap();
    let seen = thief(&w.host, json!({"op": "read", "target": "/data/clean.txt"})).await;
    assert!(seen.starts_with("ok: "), "{seen}");
}

/// Invariants 7 and 13, the Tool's output: a secret the Tool got some other
/// way (here an environment variable an operator set to the same value) is
/// withheld from everything the call hands the journal and the model — its
/// content and Commands (the output becomes a Tool error, nothing changes),
/// its error text, its stdout, stderr and log (also encoded, also across the
/// capture's bound) — each replaced by a note naming the credential.
#[tokio::test]
async fn a_secret_the_tool_returns_never_reaches_the_journal_or_the_model() {
    let w = world_with("", &format!("env = {{ LEAK = \"{SECRET}\" }}"));
    let call = |then: Value, count: u32| {
        let host = &w.host;
        async move {
            let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
            let args = json!({"op": "leak", "target": "LEAK", "then": then, "count": count});
            let result = run.call("hostile.thief", args).await.unwrap();
            let step = host.runtime.store().steps(None).await.unwrap().pop().unwrap();
            let captured: Value = serde_json::from_str(&step.captured).unwrap();
            (result, step, captured)
        }
    };
    // Everywhere at once: the output is a Tool error naming the credential.
    let (result, step, captured) = call(json!(["stdout", "stderr", "log", "command", "content"]), 0).await;
    let StepResult::ToolError { message, .. } = &result else { panic!("{result:?}") };
    assert!(message.contains("withheld the Tool's output") && message.contains("credential `tracker`"), "{message}");
    assert_clean(message, "the model's text");
    assert_clean(&step.result, "the committed result");
    for stream in ["stdout", "stderr", "log"] {
        let text = captured[stream].as_str().unwrap();
        assert!(text.starts_with("[withheld by the host") && text.contains("`tracker`"), "{stream}: {text}");
    }
    let host: Vec<&str> = captured["host"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(host.iter().any(|r| r.contains("output was withheld") && r.contains("`tracker`")), "{host:?}");
    assert_clean(&step.captured, "the captured output");
    // The error text.
    let (result, step, _) = call(json!(["error"]), 0).await;
    let StepResult::ToolError { message, .. } = &result else { panic!("{result:?}") };
    assert!(message.contains("withheld by the host: the Tool's error text"), "{message}");
    assert_clean(&step.result, "the committed error");
    // A panic's message, which the host quotes cut short: checked before the
    // cut, so no first bytes of the secret are left at its end (padding moves
    // the secret across every place the cut could fall).
    for count in (150..480).step_by(7) {
        let (result, step, _) = call(json!(["panic"]), count).await;
        let StepResult::ToolError { message, .. } = &result else { panic!("{result:?}") };
        for text in [message.as_str(), &step.result] {
            assert!(!text.contains(&SECRET[..4]), "count {count}: {text}");
        }
    }
    // Encoded, in a call whose output is clean: only that stream goes.
    let (result, _, captured) = call(json!(["stdout-hex"]), 0).await;
    assert!(matches!(&result, StepResult::Output { .. }), "{result:?}");
    assert!(captured["stdout"].as_str().unwrap().starts_with("[withheld by the host"), "{captured}");
    assert_clean(&captured.to_string(), "the captured output");
    // Written across the capture's bound (64 KiB; `token ` comes first): no first bytes are left behind.
    let (_, _, captured) = call(json!(["stdout"]), (64 << 10) - 6 - 4).await;
    let stdout = captured["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("[withheld by the host"), "{}", &stdout[..80.min(stdout.len())]);
    // A clean call is untouched.
    let (result, _, captured) = call(json!([]), 0).await;
    assert!(matches!(&result, StepResult::Output { content: Content::Json(v), .. } if v == "done"), "{result:?}");
    assert!(captured.get("host").and_then(Value::as_array).is_none_or(|h| h.is_empty()), "{captured}");
    assert_no_secret_in(&w.host.dir.path().join("journal.db"));
}

/// A `[credentials]` table named `name` whose source is `source` (TOML).
fn credential_table(name: &str, source: &str) -> String {
    format!(
        "\n[credentials.{name}]\nsource = {source}\ndestinations = [\"https://github.example:443\"]\n\
         apply = {{ header = {{ name = \"Authorization\", format = \"Bearer {{}}\" }} }}\n"
    )
}

/// The call's result and its host records, whatever the result is.
async fn thief_step(host: &TestHost, args: Value) -> (StepResult, Vec<String>) {
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let result = run.call("hostile.thief", args).await.unwrap();
    (result, host_records(host).await)
}

/// Invariant 13 when a configured credential's source cannot be read and
/// this process never read it — `toolgate serve` started by an MCP client
/// that does not pass on the user's shell, so `GITHUB_TOKEN` is unset in
/// the host: there is nothing to look for, so the host cannot vouch for any
/// check. A granted `.env` holding the token is refused (`access`), so is
/// every other file, a request to a granted host is not sent (its response
/// could not be checked), each recorded naming the credential, its source
/// and the fix; a call that
/// received what it could not check (names from a listing) has its output
/// withheld. A call that uses none of that still works. Once the source can
/// be read, the normal check applies. (Each credential is named for this
/// test alone: the process's history of values is kept by name.)
#[tokio::test]
async fn a_credential_the_host_cannot_read_fails_closed_until_it_can() {
    let var = format!("TOOLGATE_BOUNDARY_UNSET_GITHUB_TOKEN_{}", std::process::id());
    let env_source = format!("{{ env = \"{var}\" }}");
    // A token each: the process keeps the values it read, and the second case would find the first's.
    let cases = [
        ("unset_env_github", env_source.as_str(), var.as_str(), "ghp_Unr3adable0Env0Cr3dential9Value"),
        ("missing_file_github", "{ file = \"github.secret\" }", "github.secret", "ghp_Unr3adable0File0Cr3dential9V"),
    ];
    for (name, source, names_source, token) in cases {
        let w = world_with_credentials("", "", &credential_table(name, source));
        let data = w.host.dir.path().join("data");
        std::fs::write(data.join(".env"), format!("GITHUB_TOKEN={token}\nDEBUG=1\n")).unwrap();
        let unvouched = |r: &str| r.contains(&format!("credential `{name}`, whose secret this host has never read"));
        // Files through the grant: the one holding the token, and a clean one — neither can be vouched for.
        for file in [".env", "a.txt"] {
            let seen = thief(&w.host, json!({"op": "read", "target": format!("/data/{file}")})).await;
            assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{name} {file}: {seen}");
            assert!(!seen.contains(token), "{seen}");
            let records = host_records(&w.host).await;
            assert!(
                records
                    .iter()
                    .any(|r| r.starts_with(&format!("file \"/data/{file}\" refused to the guest (`access`)"))
                        && unvouched(r)
                        && r.contains(names_source)),
                "{name} {file}: {records:?}"
            );
        }
        let records = host_records(&w.host).await;
        if name.starts_with("unset_env") {
            assert!(records.iter().any(|r| r.contains("MCP client")), "the fix is named: {records:?}");
        }
        // A request to a granted host is not sent (its response could not be checked).
        for headers in [json!([["x-relay", token]]), json!([])] {
            let args = json!({"op": "http", "target": w.api.url("/echo"), "headers": headers});
            let seen = thief(&w.host, args).await;
            assert!(seen.starts_with("err: ") && seen.contains("did not send the request"), "{name}: {seen}");
            assert!(seen.contains(&format!("`{name}`")) && !seen.contains(token), "{name}: {seen}");
            let records = host_records(&w.host).await;
            assert!(
                records
                    .iter()
                    .any(|r| r.starts_with("request to http://127.0.0.1:") && r.contains("not sent") && unvouched(r)),
                "{name}: {records:?}"
            );
        }
        assert!(w.api.requests().is_empty(), "{name}: nothing left the host");
        // Names from a listing pass (they are not a file's content), but the
        // call that received them cannot be vouched for: its output is withheld.
        let (result, records) = thief_step(&w.host, json!({"op": "list", "target": "/data"})).await;
        let StepResult::ToolError { message, .. } = &result else { panic!("{name}: {result:?}") };
        assert!(message.contains("withheld the Tool's output") && message.contains(&format!("`{name}`")), "{message}");
        assert!(records.iter().any(|r| r.contains("names from its directories") && unvouched(r)), "{records:?}");
        // A call that uses no file, no network and no state still works, and records nothing.
        let (result, records) = thief_step(&w.host, json!({"op": "leak", "target": "NOT_GRANTED"})).await;
        assert!(matches!(&result, StepResult::Output { content: Content::Json(v), .. } if v == "done"), "{result:?}");
        assert!(records.is_empty(), "{records:?}");
        // Once the source can be read, the normal check applies.
        if name.starts_with("unset_env") {
            // SAFETY (edition 2024): the variable is this test's own.
            unsafe { std::env::set_var(&var, token) };
        } else {
            let file = w.host.dir.path().join("github.secret");
            std::fs::write(&file, format!("{token}\n")).unwrap();
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let seen = thief(&w.host, json!({"op": "read", "target": "/data/.env"})).await;
        assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{seen}");
        let records = host_records(&w.host).await;
        assert!(
            records
                .iter()
                .any(|r| r.contains("\"/data/.env\" refused") && r.contains(&format!("credential `{name}` ("))),
            "{name}: {records:?}"
        );
        assert_eq!(thief(&w.host, json!({"op": "read", "target": "/data/a.txt"})).await, "ok: \"alpha\\n\"");
        let seen =
            thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": [["x-relay", token]]})).await;
        assert!(seen.contains("withheld") && !seen.contains(token), "{seen}");
        assert!(host_records(&w.host).await.iter().any(|r| r.contains(&format!("credential `{name}` ("))));
        let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo")})).await;
        assert!(seen.starts_with("ok: 200"), "{seen}");
        let (result, _) = thief_step(&w.host, json!({"op": "list", "target": "/data"})).await;
        assert!(matches!(&result, StepResult::Output { .. }), "{result:?}");
        assert_no_secret_in(&w.host.dir.path().join("journal.db"));
    }
    // SAFETY: as above.
    unsafe { std::env::remove_var(&var) };
}

/// What a call reads from its Tool's state was checked when it was
/// committed — but not for a credential the host could not read then. While
/// one is unreadable, a call that read state has its output withheld; one
/// that read none (the state is empty) keeps working; once the credential
/// can be read, state is read again.
#[tokio::test]
async fn a_call_that_read_state_is_withheld_while_a_credential_cannot_be_read() {
    let var = format!("TOOLGATE_BOUNDARY_UNSET_STATE_TOKEN_{}", std::process::id());
    let table = credential_table("unset_env_state", &format!("{{ env = \"{var}\" }}"));
    let config = format!("{table}\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n");
    let host = TestHost::new(&config, &[("notes.wasm", toolgate_tests::Lang::Rust.notes())]);
    let call = |args: Value| {
        let host = &host;
        async move {
            let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
            run.call("notes", args).await.unwrap()
        }
    };
    // Nothing in state yet: nothing read from it, the note is kept.
    let r = call(json!({"op": "add", "note": "first"})).await;
    assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
    let r = call(json!({"op": "list"})).await;
    let StepResult::ToolError { message, .. } = &r else { panic!("{r:?}") };
    assert!(message.contains("its committed state") && message.contains("`unset_env_state`"), "{message}");
    let records = host_records(&host).await;
    assert!(records.iter().any(|r| r.contains("whose secret this host has never read") && r.contains(&var)));
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, "st4te-t0ken-value-1234") };
    let r = call(json!({"op": "list"})).await;
    assert!(
        matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v["notes"] == json!(["first"])),
        "{r:?}"
    );
    unsafe { std::env::remove_var(&var) };
}

/// Invariant 13 for what the host keeps for a Tool: its committed state is
/// checked for secrets when the guest reads it, not only when it was
/// committed. State committed before a credential was configured — or
/// readable, as here — (or by a host with another config sharing the
/// journal) was never checked for it: a value holding the secret reads as
/// absent, a key holding it is left out of the keys, each recorded, and the
/// rest reads as it is. Before, the guest read both (handed back reversed, a
/// form no output check knows).
#[tokio::test]
async fn committed_state_holding_a_secret_is_withheld_from_the_guest_when_read() {
    let var = format!("TOOLGATE_BOUNDARY_LATER_STATE_{}", std::process::id());
    let w = world_with_credentials("", "", &credential_table("later", &format!("{{ env = \"{var}\" }}")));
    let later = format!("l4ter-t0ken-{}-value", std::process::id());
    let reversed = |s: &str| s.chars().rev().collect::<String>();
    // Committed while the host could not know it as a secret.
    for (key, value) in [("kept", later.as_str()), (later.as_str(), "x"), ("plain", "p")] {
        let seen = thief(&w.host, json!({"op": "remember", "target": key, "then": [value]})).await;
        assert_eq!(seen, "remembered");
    }
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, &later) };
    let (result, records) = thief_step(&w.host, json!({"op": "recall", "target": "kept"})).await;
    let StepResult::Output { content: Content::Json(Value::String(seen)), .. } = &result else { panic!("{result:?}") };
    assert!(!seen.contains(&reversed(&later)) && !seen.contains(&later), "the guest read the secret: {seen}");
    assert_eq!(seen, &format!("value: (none); keys: {},{}", reversed("kept"), reversed("plain")));
    for what in ["a value of the Tool's committed state", "a key of the Tool's committed state"] {
        assert!(
            records
                .iter()
                .any(|r| r.starts_with(&format!("{what} was withheld from the guest")) && r.contains("`later`")),
            "{what}: {records:?}"
        );
    }
    // What holds no secret reads as it is.
    let seen = thief(&w.host, json!({"op": "recall", "target": "plain"})).await;
    assert!(seen.starts_with("value: p;"), "{seen}");
    unsafe { std::env::remove_var(&var) };
}

/// Invariant 13 with its effects: while a configured credential cannot be
/// read, a request to a granted host is refused before anything leaves.
/// Before, it was sent and only its response withheld: a POST, a DELETE or
/// an MCP adapter's `tools/call` took effect upstream while the model read
/// a failure — and retried it, so it took effect again. The server sees
/// nothing until the credential can be read.
#[tokio::test]
async fn a_request_is_not_sent_while_a_credential_cannot_be_read() {
    let var = format!("TOOLGATE_BOUNDARY_UNSENT_{}", std::process::id());
    let w = world_with_credentials("", "", &credential_table("unsent_github", &format!("{{ env = \"{var}\" }}")));
    let post = json!({"op": "post", "target": w.api.url("/upload"), "count": 8});
    for args in [post.clone(), json!({"op": "http", "target": w.api.url("/echo"), "credential": true})] {
        let seen = thief(&w.host, args.clone()).await;
        assert!(w.api.requests().is_empty(), "{args}: the request reached the server ({seen})");
        assert!(seen.starts_with("err: "), "{args}: {seen}");
        let records = host_records(&w.host).await;
        assert!(
            records.iter().any(|r| r.starts_with(&format!("request to {} not sent", w.api.origin()))
                && r.contains("credential `unsent_github`, whose secret this host has never read")
                && r.contains(&var)),
            "{args}: {records:?}"
        );
    }
    let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo")})).await;
    assert!(seen.contains("did not send the request") && seen.contains("`unsent_github`"), "{seen}");
    assert!(w.api.requests().is_empty(), "nothing reached the server");
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, "uns3nt-t0ken-now-readable") };
    let seen = thief(&w.host, post).await;
    assert!(seen.starts_with("ok: 200"), "{seen}");
    assert_eq!(w.api.requests().len(), 1, "sent once it can be checked");
    unsafe { std::env::remove_var(&var) };
}

/// While a credential cannot be read, a Tool may still create a file to
/// write to: empty when opened, it holds nothing to keep from the guest
/// (before, it was refused `access` and left on disk, 0 bytes). A file with
/// bytes stays refused, also to a write-only open (its writes could cut a
/// secret down to what a later check would not recognize).
#[tokio::test]
async fn a_tool_may_create_a_file_to_write_while_a_credential_cannot_be_read() {
    let var = format!("TOOLGATE_BOUNDARY_CREATE_{}", std::process::id());
    let w = world_with_credentials("", "", &credential_table("create_github", &format!("{{ env = \"{var}\" }}")));
    let scratch = w.host.dir.path().join("scratch");
    assert_eq!(thief(&w.host, json!({"op": "write", "target": "/scratch/new.txt"})).await, "ok: ()");
    assert_eq!(std::fs::read(scratch.join("new.txt")).unwrap(), b"x");
    assert!(host_records(&w.host).await.is_empty());
    // Written again: truncated when opened, so empty when checked.
    assert_eq!(thief(&w.host, json!({"op": "write", "target": "/scratch/new.txt"})).await, "ok: ()");
    for op in ["read", "cut"] {
        let seen = thief(&w.host, json!({"op": op, "target": "/scratch/new.txt", "count": 0})).await;
        assert!(seen.starts_with("err: ") && seen.contains("ermission denied"), "{op}: {seen}");
        let records = host_records(&w.host).await;
        assert!(
            records.iter().any(|r| r.starts_with("file \"/scratch/new.txt\" refused to the guest (`access`)")
                && r.contains("`create_github`")),
            "{op}: {records:?}"
        );
    }
    assert_eq!(std::fs::read(scratch.join("new.txt")).unwrap(), b"x", "not cut");
}

/// While a credential cannot be read, a call that received what the host
/// could not check for it (its `env` grant's literal, its state) may hold
/// the secret, and write it into a host it asks for or a path it opens —
/// which the host's records quote, and the journal keeps for `toolgate
/// journal --json`. Before, its output was withheld but those records were
/// checked only for the secrets there are. Now they keep the host's words
/// (the setting, the credential) and leave the guest's text out. (The test
/// hands the guest the value's hex; a Tool would compute it.)
#[tokio::test]
async fn the_guests_text_is_left_out_of_the_host_records_while_a_credential_cannot_be_read() {
    let var = format!("TOOLGATE_BOUNDARY_RECORDS_{}", std::process::id());
    const TOKEN: &str = "ghp_Rec0rdedInAPathOrAHost000";
    let hex: String = TOKEN.bytes().map(|b| format!("{b:02x}")).collect();
    let w = world_with_credentials(
        "",
        &format!("env = {{ GITHUB_TOKEN = \"{TOKEN}\" }}"),
        &credential_table("records_github", &format!("{{ env = \"{var}\" }}")),
    );
    let left_out = "[the guest's text, left out]";
    let withheld = |result: &StepResult| {
        matches!(result, StepResult::ToolError { message, .. }
            if message.contains("withheld the Tool's output") && message.contains("`env` grant"))
    };
    // A host it asks for.
    let url = format!("http://{hex}.x/");
    let (result, records) = thief_step(&w.host, json!({"op": "http", "target": url})).await;
    assert!(withheld(&result), "{result:?}");
    assert!(
        records.iter().any(|r| *r == format!("outbound request denied: {left_out} is not granted to this Tool")),
        "{records:?}"
    );
    assert!(records.iter().any(|r| r.contains("the guest's text left out of these records")), "{records:?}");
    assert!(records.iter().all(|r| !r.contains(&hex)), "{records:?}");
    // A path it opens: created (empty, it is the guest's), then opened again with a byte in it.
    let path = format!("/scratch/{hex}");
    let (result, records) = thief_step(&w.host, json!({"op": "write", "target": path})).await;
    assert!(withheld(&result), "{result:?}");
    assert!(records.iter().all(|r| !r.contains(&hex)), "{records:?}");
    assert_eq!(std::fs::read(w.host.dir.path().join("scratch").join(&hex)).unwrap(), b"x");
    let (result, records) = thief_step(&w.host, json!({"op": "read", "target": path})).await;
    assert!(withheld(&result), "{result:?}");
    assert!(
        records.iter().any(|r| r.starts_with(&format!("file {left_out} refused to the guest (`access`)"))
            && r.contains("credential `records_github`, whose secret this host has never read")
            && r.contains(&var)),
        "{records:?}"
    );
    assert!(records.iter().all(|r| !r.contains(&hex)), "{records:?}");
    // Once the credential can be read, the records quote the guest again (checked for every secret).
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, "r3cords-t0ken-now-readable") };
    let (result, records) = thief_step(&w.host, json!({"op": "http", "target": url})).await;
    assert!(matches!(result, StepResult::Output { .. }), "{result:?}");
    assert!(records.iter().any(|r| r.contains(&format!("{hex}.x:80 is not granted"))), "{records:?}");
    unsafe { std::env::remove_var(&var) };
}

/// Pinned data (a Skill's content, an MCP adapter's pins) was checked when
/// packed — for the secrets the packer could read then, with its config if
/// it had one — never for a secret this host has not read. While one
/// cannot be read, a call that read pinned data has its output withheld
/// (a Skill's references are files from a folder, like a granted `.env`);
/// once it can be, the Skill works.
#[tokio::test]
async fn a_call_that_read_pinned_data_is_withheld_while_a_credential_cannot_be_read() {
    let var = format!("TOOLGATE_BOUNDARY_UNSET_PINNED_{}", std::process::id());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../example-tools/skills/release-notes");
    let skill = toolgate_author::skill::read(&dir).unwrap();
    let component = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(toolgate_author::skill::pack(&skill)).unwrap().0
    })
    .join()
    .unwrap();
    let table = credential_table("unset_env_pinned", &format!("{{ env = \"{var}\" }}"));
    let config = format!("{table}\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n");
    let host = TestHost::new(&config, &[("release-notes.wasm", component)]);
    let call = || async {
        let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
        run.call("skill.release-notes", json!({})).await.unwrap()
    };
    let r = call().await;
    let StepResult::ToolError { message, .. } = &r else { panic!("{r:?}") };
    assert!(message.contains("its pinned data") && message.contains("`unset_env_pinned`"), "{message}");
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, "p1nned-t0ken-now-readable") };
    let r = call().await;
    assert!(matches!(&r, StepResult::Output { .. }), "{r:?}");
    unsafe { std::env::remove_var(&var) };
}

/// Invariant 14, memory: the host allocates and fills what a guest asks of
/// `get-random-bytes` (and `get-insecure-random-bytes`) before copying it
/// into the guest — host memory outside `limits.memory_mib`. One request
/// is bounded by `executor::MAX_RANDOM_BYTES` (64 KiB); one for more traps.
/// (Before, wasmtime-wasi's 64 MiB default: the 1 MiB request passed.)
#[tokio::test]
async fn random_bytes_asked_of_the_host_are_bounded() {
    let w = world();
    for then in [json!([]), json!(["insecure"])] {
        let seen = thief(&w.host, json!({"op": "random", "count": 64, "then": then})).await;
        assert_eq!(seen, "ok: 65536 bytes", "{then}");
        let (r, _) = thief_step(&w.host, json!({"op": "random", "count": 1024, "then": then})).await;
        assert!(matches!(&r, StepResult::ToolError { message, .. } if message.contains("crashed")), "{then}: {r:?}");
    }
    assert_eq!(thief(&w.host, json!({"op": "random", "count": 1})).await, "ok: 1024 bytes");
}

/// Invariants 7 and 13 for the host's own secrets, with no `[credentials]`
/// at all: a `[[serve.auth]]` token (from the environment) and
/// `serve.state_key` (from a file) are secrets the config names by
/// reference, watched for in every check like a credential's. A granted
/// `.env` holding the token, or a copy of the key, is refused to the guest
/// (`files.read` would return it, to the journal and the model); the token
/// in a Tool's output is withheld; each record names the field, never the
/// value. Before, with no credential configured nothing was checked: the
/// token was read, returned, journaled and shown to the model, and with it
/// the agent could call `serve` as another agent.
#[tokio::test]
async fn the_hosts_own_secrets_are_kept_from_the_guest_without_any_credential() {
    const TOKEN: &str = "tg-adm1n/serve+t0ken=Xq9";
    const KEY: &str = "st4te-k3y/0f+the-serve=r3plicas-0123456789";
    let var = format!("TOOLGATE_BOUNDARY_ADMIN_TOKEN_{}", std::process::id());
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, TOKEN) };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["plugins", "data"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("data/a.txt"), "alpha\n").unwrap();
    std::fs::write(d.join("data/.env"), format!("TG_ADMIN_TOKEN={TOKEN}\n")).unwrap();
    std::fs::write(d.join("data/key.bak"), encode("b64", KEY)).unwrap();
    std::fs::write(d.join("state.key"), format!("{KEY}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(d.join("state.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(d.join("plugins/files.wasm"), toolgate_tests::Lang::Rust.files()).unwrap();
    std::fs::write(d.join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    let config = format!(
        r#"{preamble}
[limits]
timeout_ms = 5000

[serve]
auth = [{{ agent = "default", token = {{ env = "{var}" }} }}]
state_key = {{ file = "state.key" }}

[[grants]]
tools = "files.*"
directories = [{{ path = "/data", host = "data", access = "read" }}]

[[grants]]
tools = "hostile.snoop"
env = {{ LEAK = "{TOKEN}" }}

[agents.default]
visible = ["files.read", "hostile.snoop"]
default = "allow"
"#,
        preamble = toolgate_tests::PREAMBLE,
    );
    std::fs::write(d.join("toolgate.toml"), config).unwrap();
    let host = TestHost::open(dir, "default");
    let call = |tool: &'static str, args: Value| {
        let host = &host;
        async move {
            let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
            let result = run.call(tool, args).await.unwrap();
            (result, host_records(host).await)
        }
    };
    // Files holding them: refused, the record naming the field.
    for (file, field) in [(".env", "serve.auth[0].token"), ("key.bak", "serve.state_key")] {
        let (result, records) = call("files.read", json!({ "path": file })).await;
        let StepResult::ToolError { message, .. } = &result else { panic!("{file}: {result:?}") };
        assert!(message.contains("ermission denied"), "{file}: {message}");
        assert!(
            records
                .iter()
                .any(|r| r.contains(&format!("\"/data/{file}\" refused")) && r.contains(&format!("`{field}`"))),
            "{file}: {records:?}"
        );
    }
    let (result, _) = call("files.read", json!({ "path": "a.txt" })).await;
    assert!(matches!(&result, StepResult::Output { content: Content::Json(v), .. } if v == "alpha\n"), "{result:?}");
    // Returned in the output (here from an `env` grant an operator set to it): withheld.
    let (result, records) = call("hostile.snoop", json!({})).await;
    let StepResult::ToolError { message, .. } = &result else { panic!("{result:?}") };
    assert!(message.contains("withheld the Tool's output") && message.contains("`serve.auth[0].token`"), "{message}");
    assert!(!message.contains(TOKEN), "{message}");
    assert!(records.iter().all(|r| !r.contains(TOKEN)), "{records:?}");
    // The journal holds neither.
    let journal = host.dir.path().join("journal.db");
    for suffix in ["", "-wal"] {
        let mut p = journal.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(bytes) = std::fs::read(&p) {
            for secret in [TOKEN, KEY] {
                assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()), "{}", p.to_string_lossy());
            }
        }
    }
    // SAFETY: as above.
    unsafe { std::env::remove_var(&var) };
}

/// The host's own secrets are watched in names and link targets as the
/// configured credentials are (the same watch): a name holding the
/// `serve.state_key` (hex) is left out of a listing, a link whose target is
/// a `[[serve.auth]]` token is refused; each record names the field.
#[tokio::test]
async fn the_hosts_own_secrets_are_kept_out_of_listings_and_link_targets() {
    const TOKEN: &str = "tg-adm1n/l1nk+t0ken=Zr7";
    const KEY: &str = "st4te-k3y-in-a-f1le-name-0123456789";
    let var = format!("TOOLGATE_BOUNDARY_LINK_TOKEN_{}", std::process::id());
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, TOKEN) };
    let w = world_with(
        &format!(
            "\n[serve]\nauth = [{{ agent = \"default\", token = {{ env = \"{var}\" }} }}]\nstate_key = {{ file = \"state.key\" }}\n"
        ),
        "",
    );
    let d = w.host.dir.path();
    std::fs::write(d.join("state.key"), format!("{KEY}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(d.join("state.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(d.join("data").join(encode("hex", KEY)), "").unwrap();
    std::os::unix::fs::symlink(TOKEN, d.join("data/link")).unwrap();
    let seen = thief(&w.host, json!({"op": "list", "target": "/data"})).await;
    assert!(seen.starts_with("ok: ") && seen.contains("\"a.txt\"") && !seen.contains(&encode("hex", KEY)), "{seen}");
    let records = host_records(&w.host).await;
    assert!(
        records.iter().any(|r| r.contains("listing of \"/data\" was left out") && r.contains("`serve.state_key`")),
        "{records:?}"
    );
    let seen = thief(&w.host, json!({"op": "readlink", "target": "/data/link"})).await;
    assert!(seen.starts_with("err: ") && !seen.contains(TOKEN), "{seen}");
    let records = host_records(&w.host).await;
    assert!(
        records.iter().any(|r| r.contains("link \"/data/link\" was refused") && r.contains("`serve.auth[0].token`")),
        "{records:?}"
    );
    // SAFETY: as above.
    unsafe { std::env::remove_var(&var) };
}

/// One of the host's own secrets that this process cannot read (the
/// `[[serve.auth]]` token's variable is set only where `serve --http` runs;
/// a `toolgate call` or `toolgate approve` in another shell lacks it) is not
/// looked for here, and does not fail the process's Tools: they read their
/// files as before. (Briefly, it failed closed as an unreadable credential
/// does: every file refused, every request held back — and an approval made
/// in such a shell spent its single-use ticket on that failure.) The
/// process that reads the token watches it (the test above).
#[tokio::test]
async fn a_host_secret_this_process_cannot_read_does_not_fail_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["plugins", "data"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("data/a.txt"), "alpha\n").unwrap();
    std::fs::write(d.join("plugins/files.wasm"), toolgate_tests::Lang::Rust.files()).unwrap();
    let var = format!("TOOLGATE_BOUNDARY_NEVER_SET_{}", std::process::id());
    let config = format!(
        r#"{preamble}
[serve]
auth = [{{ agent = "default", token = {{ env = "{var}" }} }}]

[[grants]]
tools = "files.*"
directories = [{{ path = "/data", host = "data", access = "read" }}]

[agents.default]
visible = ["files.read"]
default = "allow"
"#,
        preamble = toolgate_tests::PREAMBLE,
    );
    std::fs::write(d.join("toolgate.toml"), config).unwrap();
    let host = TestHost::open(dir, "default");
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let result = run.call("files.read", json!({ "path": "a.txt" })).await.unwrap();
    assert!(matches!(&result, StepResult::Output { content: Content::Json(v), .. } if v == "alpha\n"), "{result:?}");
}

/// The host's own secrets beside credentials: a response holding a
/// `[[serve.auth]]` token is withheld, the guest told only that it held a
/// configured secret (the record names the field); a guest naming the
/// token's field as a credential gets nothing attached.
#[tokio::test]
async fn a_response_holding_a_serve_token_is_withheld_and_the_token_is_never_applied() {
    const TOKEN: &str = "tg-s3rve/t0ken+for=0ther-agent";
    let var = format!("TOOLGATE_BOUNDARY_SERVE_TOKEN_{}", std::process::id());
    // SAFETY (edition 2024): the variable is this test's own.
    unsafe { std::env::set_var(&var, TOKEN) };
    let serve = format!("\n[serve]\nauth = [{{ agent = \"default\", token = {{ env = \"{var}\" }} }}]\n");
    let w = world_with_credentials("", "", &serve);
    for form in ["raw", "hex", "b64"] {
        let headers = json!([["x-relay", encode(form, TOKEN)]]);
        let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
        assert!(seen.contains("withheld") && !seen.contains(&encode(form, TOKEN)), "{form}: {seen}");
        assert!(!seen.contains("serve.auth") && !seen.contains(form), "the guest learns no name or form: {seen}");
        let records = host_records(&w.host).await;
        assert!(records.iter().any(|r| r.contains("withheld") && r.contains("`serve.auth[0].token`")), "{records:?}");
    }
    let before = w.api.requests().len();
    let headers = json!([["toolgate-credential", "serve.auth[0].token"]]);
    let seen = thief(&w.host, json!({"op": "http", "target": w.api.url("/echo"), "headers": headers})).await;
    assert!(seen.starts_with("err: ") && seen.contains("denied"), "{seen}");
    assert_eq!(w.api.requests().len(), before, "nothing left the host");
    assert!(host_records(&w.host).await.iter().any(|r| r.contains("is not granted to this Tool")));
    // SAFETY: as above.
    unsafe { std::env::remove_var(&var) };
}
