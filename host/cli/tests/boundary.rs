//! Invariant 14 from outside the process: one call cannot exhaust what the
//! host needs, and nothing a guest touches keeps `toolgate` from exiting.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use toolgate_tests::{PREAMBLE, TestServer, guests, packed};

fn setup(limits: &str, server: &TestServer) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("plugins")).unwrap();
    std::fs::create_dir_all(d.join("data")).unwrap();
    std::fs::create_dir_all(d.join("scratch")).unwrap();
    std::fs::write(d.join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    std::fs::write(
        d.join("toolgate.toml"),
        format!(
            r#"{PREAMBLE}
[limits]
{limits}
[credentials.tracker]
source = {{ env = "TOOLGATE_BOUNDARY_TEST_TOKEN" }}
destinations = ["{origin}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}
[[grants]]
tools = "hostile.*"
directories = [
  {{ path = "/data", host = "data", access = "read" }},
  {{ path = "/scratch", host = "scratch", access = "read-write" }},
]
hosts = ["{origin}"]
credentials = ["tracker"]
[agents.default]
visible = ["hostile.thief"]
default = "allow"
"#,
            origin = server.origin()
        ),
    )
    .unwrap();
    dir
}

/// Run `toolgate call hostile.thief ARGS`, sampling its peak resident memory
/// (`VmHWM`) while it runs: (stdout, exit code, wall time, peak KiB).
fn call_measured(dir: &Path, args: &str) -> (String, Option<i32>, Duration, u64) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir)
        // Readable: a credential the host cannot read refuses every response and file.
        .env("TOOLGATE_BOUNDARY_TEST_TOKEN", "b0undary-t3st-t0ken-value")
        .args(["call", "hostile.thief", "--args", args])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0;
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(&status)
            && let Some(v) = s.lines().find_map(|l| l.strip_prefix("VmHWM:"))
        {
            peak_kib = peak_kib.max(v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (text, out.status.code(), started.elapsed(), peak_kib)
}

#[test]
fn five_hundred_concurrent_4_mib_responses_keep_the_host_within_its_bound() {
    let server = TestServer::start("unused-token", "http://127.0.0.1:1/");
    // At most 8 requests of the call in flight, and 32 MiB of responses held
    // for it (and 32 KiB for their heads, which count too): the bound on
    // what one call can make the host buffer.
    let dir = setup(
        "timeout_ms = 120000\nhttp_requests_in_flight = 8\nhttp_response_kib = 4096\nhttp_response_total_kib = 32800",
        &server,
    );
    let args = serde_json::json!({"op": "flood", "target": server.url("/bytes?kib=4096"), "count": 512}).to_string();
    let (out, code, took, peak_kib) = call_measured(dir.path(), &args);
    assert_eq!(code, Some(0), "{out}");
    let counts = out.split("ok: (").nth(1).and_then(|r| r.split(')').next()).unwrap_or_else(|| panic!("{out}"));
    let n: Vec<u64> = counts.split(", ").map(|x| x.parse().unwrap()).collect();
    assert_eq!(n[0] + n[1], 512, "every request was answered or refused: {out}");
    assert!(n[0] >= 8, "the responses within the bound arrived: {out}");
    assert_eq!(n[2], n[0] * 4096 * 1024, "each arrived response was read in full: {out}");
    // Bound: the 32 MiB held plus up to 8 × 4 MiB in flight, plus the host
    // itself; far below 512 × 4 MiB = 2 GiB.
    let bound_kib = (32 + 8 * 4) * 1024 * 2 + 192 * 1024;
    println!(
        "512 concurrent 4 MiB responses: {} arrived, {} refused; peak RSS {} MiB (bound {} MiB), {:.1} s",
        n[0],
        n[1],
        peak_kib / 1024,
        bound_kib / 1024,
        took.as_secs_f64()
    );
    assert!(peak_kib > 0 && peak_kib < bound_kib, "peak RSS {peak_kib} KiB over the {bound_kib} KiB bound");
}

#[test]
fn a_fifo_in_a_grant_does_not_keep_toolgate_from_exiting() {
    let server = TestServer::start("unused-token", "http://127.0.0.1:1/");
    let dir = setup("timeout_ms = 2000", &server);
    let made = Command::new("mkfifo").arg(dir.path().join("data/pipe")).status().unwrap();
    assert!(made.success());
    for target in ["/data/pipe", "/scratch/../data/pipe"] {
        let args = serde_json::json!({"op": "read", "target": target}).to_string();
        let (out, code, took, _) = call_measured(dir.path(), &args);
        assert_eq!(code, Some(0), "{out}");
        // The guest's own error (not the deadline's) says it was refused; the
        // bound catches a process kept alive by a blocked thread, not speed.
        assert!(out.contains("err: "), "refused, not ended by the deadline: {out}");
        assert!(took < Duration::from_secs(30), "`toolgate call` exited: {took:?}");
    }
}

/// A credential the host cannot read where it runs (`toolgate serve` from an
/// MCP client that does not pass the user's shell) is named at start, one
/// warning line with the fix, and the host fails closed: a granted file is
/// refused, not handed over unchecked.
#[test]
fn a_credential_the_host_cannot_read_is_warned_about_at_start_and_fails_closed() {
    let server = TestServer::start("unused-token", "http://127.0.0.1:1/");
    let dir = setup("timeout_ms = 5000", &server);
    std::fs::write(dir.path().join("data/.env"), "TOKEN=b0undary-t3st-t0ken-value\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .current_dir(dir.path())
        .env_remove("TOOLGATE_BOUNDARY_TEST_TOKEN")
        .args(["call", "hostile.thief", "--args", r#"{"op": "read", "target": "/data/.env"}"#])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let warned: Vec<&str> = stderr.lines().filter(|l| l.contains("TOOLGATE_BOUNDARY_TEST_TOKEN")).collect();
    assert_eq!(warned.len(), 1, "one line: {stderr}");
    assert!(
        warned[0].contains("WARN")
            && warned[0].contains("credential `tracker`")
            && warned[0].contains("not set")
            && warned[0].contains("MCP client"),
        "{stderr}"
    );
    assert!(stdout.contains("err: ") && !stdout.contains("b0undary"), "refused: {stdout}");
}
