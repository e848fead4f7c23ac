//! `toolgate serve` against the official MCP Python SDK (tests/mcp/test_serve.py),
//! in the venv that `scripts/test` creates with the pinned SDK: stdio and
//! Streamable HTTP, the SDK's default mode (2026-07-28) and its legacy mode.

use std::path::PathBuf;
use std::process::Command;

use toolgate_tests::{guests, packed};

#[test]
fn the_official_python_mcp_client_drives_toolgate_serve() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test, which creates the venv with the pinned MCP SDK (tests/requirements.txt)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    for (name, path) in [("text", guests::TEXT), ("notes", guests::NOTES), ("hostile", guests::HOSTILE)] {
        std::fs::write(plugins.join(format!("{name}.wasm")), packed(path)).unwrap();
    }
    let extra = dir.path().join("files.wasm");
    std::fs::write(&extra, packed(guests::FILES)).unwrap();
    let config = dir.path().join("toolgate.toml");
    std::fs::write(
        &config,
        r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
[limits]
timeout_ms = 3000
[[grants]]
tools = "files.*"
directories = [{ path = "/data", host = "data", access = "read" }]
[serve]
auth = [
  { agent = "default", token = { env = "TOOLGATE_TEST_TOKEN" } },
  { agent = "reader", token = { env = "TOOLGATE_READER_TOKEN" } },
]
[agents.reader]
visible = ["text.*"]
default = "deny"
rules = [{ pattern = "text.*", behavior = "allow" }]
[agents.default]
visible = ["text.*", "notes", "hostile.chatter", "hostile.loop", "files.*"]
default = "deny"
rules = [
  { pattern = "text.*", behavior = "allow" },
  { pattern = "text.repeat", behavior = "deny" },
  { pattern = "files.*", behavior = "allow" },
  { pattern = "hostile.*", behavior = "allow" },
  { pattern = 'notes(op = "list")', behavior = "allow" },
  { pattern = 'notes(op = "add")', behavior = "ask" },
]
"#,
    )
    .unwrap();
    // The approver's key, trusted by `[approval] keys`.
    let key = dir.path().join("approver.key");
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["keygen", "--for", "approval", "-o"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    // Answers in the client's UI count as well (off by default with keys;
    // test_serve.py's keys-only config drops this line).
    text.push_str("mcp_elicitation = true\n");
    std::fs::write(&config, text).unwrap();
    // Fresh bearer tokens for this run; the server reads them by reference (env).
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let token = format!("tg-default-{nonce:x}-{}", std::process::id());
    let reader = format!("tg-reader-{nonce:x}-{}", std::process::id());
    let out = Command::new(&python)
        .current_dir(&root)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/mcp/test_serve.py"])
        .env("TOOLGATE_BIN", env!("CARGO_BIN_EXE_toolgate"))
        .env("TOOLGATE_CONFIG", &config)
        .env("TOOLGATE_EXTRA", &extra)
        .env("TOOLGATE_APPROVER_KEY", &key)
        .env("TOOLGATE_TEST_TOKEN", &token)
        .env("TOOLGATE_READER_TOKEN", &reader)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
    println!("{stdout}");
    assert!(stdout.contains("passed") && !stdout.contains("failed"), "{stdout}");
}
