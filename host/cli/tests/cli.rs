//! The `toolgate` binary: exit codes tell outcomes apart, data goes to stdout,
//! diagnostics to stderr, guest output never reaches the host's streams.

use std::path::Path;
use std::process::{Command, Output};

use toolgate_tests::{guests, packed};

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins/text.wasm"), packed(guests::TEXT)).unwrap();
    std::fs::write(dir.path().join("plugins/notes.wasm"), packed(guests::NOTES)).unwrap();
    std::fs::write(dir.path().join("plugins/hostile.wasm"), packed(guests::HOSTILE)).unwrap();
    std::fs::write(dir.path().join("plugins/broken.wasm"), b"not wasm").unwrap();
    std::fs::write(
        dir.path().join("toolgate.toml"),
        r#"
plugins = "plugins"
store = "journal.db"
cache = "cache"
[agents.default]
visible = ["text.*", "notes", "hostile.chatter"]
default = "deny"
rules = [
  { pattern = "text.*", behavior = "allow" },
  { pattern = "text.repeat", behavior = "deny" },
  { pattern = "hostile.chatter", behavior = "allow" },
  { pattern = 'notes(op = "add")', behavior = "ask" },
]
"#,
    )
    .unwrap();
    dir
}

fn tg(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolgate")).current_dir(dir).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exit_codes_tell_output_tool_error_blocked_awaiting_and_config_error_apart() {
    let dir = setup();
    let d = dir.path();
    let out = tg(d, &["call", "text.upper", "--args", r#"{"text":"hi"}"#]);
    assert_eq!((out.status.code(), text(&out.stdout).trim()), (Some(0), "\"HI\""));
    assert_eq!(tg(d, &["call", "text.upper", "--args", r#"{"x":1}"#]).status.code(), Some(10));
    assert_eq!(tg(d, &["call", "text.repeat", "--args", r#"{"text":"a","times":1}"#]).status.code(), Some(11));
    let out = tg(d, &["--json", "call", "notes", "--args", r#"{"op":"add","note":"n"}"#]);
    assert_eq!(out.status.code(), Some(12));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "awaiting");
    let ticket = v["ticket"].as_str().unwrap().to_owned();

    let out = tg(d, &["approve", &ticket]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = tg(d, &["approve", &ticket]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("already used"), "{}", text(&out.stderr));

    // Unknown tool: usage error, named.
    let out = tg(d, &["call", "nope", "--args", "{}"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown tool `nope`"));

    // Configuration error: names the file and field, with a hint.
    std::fs::write(d.join("bad.toml"), "plugins = \"plugins\"\n[limits]\ntimeout = 5\n").unwrap();
    let out = tg(d, &["--config", "bad.toml", "list"]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("timeout") && err.contains("hint:"), "{err}");
}

#[test]
fn list_all_reports_refused_files_and_hidden_tools_with_reasons() {
    let dir = setup();
    let out = tg(dir.path(), &["list", "--all"]);
    assert_eq!(out.status.code(), Some(0));
    let s = text(&out.stdout);
    assert!(s.contains("refused  plugins/broken.wasm") || s.contains("broken.wasm"), "{s}");
    assert!(s.contains("hidden   hostile.loop  (not visible to this agent)"), "{s}");
    assert!(s.contains("shown    text.upper"), "{s}");
    let out = tg(dir.path(), &["list"]);
    let s = text(&out.stdout);
    assert!(!s.contains("hostile.loop") && s.contains("text.upper"));
}

#[test]
fn guest_output_never_reaches_the_hosts_stdout_or_stderr() {
    let dir = setup();
    let out = tg(dir.path(), &["call", "hostile.chatter"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout).trim(), "\"chatted\"");
    assert!(!text(&out.stderr).contains("jsonrpc"), "{}", text(&out.stderr));
    let out = tg(dir.path(), &["--json", "journal"]);
    let line = text(&out.stdout);
    assert!(line.contains("injected"), "the guest output is in the journal, attached to the step");
}

#[test]
fn inspect_shows_descriptors_and_digest_without_running_anything() {
    let dir = setup();
    let out = tg(dir.path(), &["--json", "inspect", "plugins/text.wasm"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(v["tools"].as_array().unwrap().len(), 3);
    assert!(!dir.path().join("cache").exists(), "inspect compiles nothing");
    let out = tg(dir.path(), &["inspect", "plugins/broken.wasm"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("plugins/broken.wasm: not a WebAssembly file"));
}

#[test]
fn pack_turns_a_built_component_into_a_loadable_one() {
    let dir = setup();
    let out = tg(dir.path(), &["pack", guests::NOTES, "-o", "packed.wasm"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "notes");
    let out = tg(dir.path(), &["inspect", "packed.wasm"]);
    assert_eq!(out.status.code(), Some(0));
    let out = tg(dir.path(), &["pack", "plugins/broken.wasm", "-o", "x.wasm"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir.path().join("x.wasm").exists());
}

#[test]
fn a_lockfile_refuses_changed_and_unknown_components_until_relocked() {
    let dir = setup();
    let d = dir.path();
    let out = tg(d, &["lock"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("text.wasm  sha256:"));
    assert!(text(&out.stderr).contains("not pinned") && text(&out.stderr).contains("broken.wasm"));
    assert_eq!(tg(d, &["call", "text.upper", "--args", r#"{"text":"a"}"#]).status.code(), Some(0));

    // A changed build of text.wasm and a new file: both refused, with the fix named.
    let mut changed = std::fs::read(d.join("plugins/text.wasm")).unwrap();
    changed.extend_from_slice(&[0, 3, 1, b'x', 0]); // an extra custom section
    std::fs::write(d.join("plugins/text.wasm"), &changed).unwrap();
    std::fs::write(d.join("plugins/extra.wasm"), packed(guests::FILES)).unwrap();
    let out = tg(d, &["list", "--all"]);
    let s = text(&out.stdout);
    assert!(s.contains("text.wasm") && s.contains("changed since") && s.contains("toolgate lock"), "{s}");
    assert!(s.contains("extra.wasm") && s.contains("not in"), "{s}");
    let out = tg(d, &["call", "text.upper", "--args", r#"{"text":"a"}"#]);
    assert_eq!(out.status.code(), Some(2), "a refused component's tools are unknown");

    assert_eq!(tg(d, &["lock"]).status.code(), Some(0));
    assert_eq!(tg(d, &["call", "text.upper", "--args", r#"{"text":"a"}"#]).status.code(), Some(0));
}

#[test]
fn with_trusted_keys_only_components_signed_by_them_load() {
    let dir = setup();
    let d = dir.path();
    let out = tg(d, &["keygen", "-o", "publisher.key"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let signing = text(&out.stdout);
    assert!(signing.starts_with("[signing]\nkeys = [\"ed25519:"), "{signing}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.join("publisher.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the secret key is readable by its owner only");
    }
    assert_ne!(tg(d, &["keygen", "-o", "publisher.key"]).status.code(), Some(0), "never overwrites a key");
    assert_eq!(tg(d, &["keygen", "-o", "stranger.key"]).status.code(), Some(0));
    let config = std::fs::read_to_string(d.join("toolgate.toml")).unwrap();
    std::fs::write(d.join("toolgate.toml"), format!("{config}\n{signing}")).unwrap();

    // Signed by the trusted key: loads. Unsigned, or signed by a stranger: refused before anything is read.
    let out = tg(d, &["sign", "plugins/text.wasm", "--key", "publisher.key"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(d.join("plugins/text.wasm.sig").is_file());
    assert_eq!(tg(d, &["sign", "plugins/notes.wasm", "--key", "stranger.key"]).status.code(), Some(0));
    let out = tg(d, &["list", "--all"]);
    let s = text(&out.stdout);
    assert!(s.contains("text.upper"), "{s}");
    assert!(s.contains("notes.wasm") && s.contains("does not verify"), "{s}");
    assert!(s.contains("hostile.wasm") && s.contains("not signed") && s.contains("toolgate sign"), "{s}");
    assert_eq!(tg(d, &["call", "text.upper", "--args", r#"{"text":"a"}"#]).status.code(), Some(0));
    assert_eq!(tg(d, &["call", "notes", "--args", r#"{"op":"list"}"#]).status.code(), Some(2), "unknown: refused");

    // A signed file changed afterwards (one custom section appended) no longer loads.
    let mut changed = std::fs::read(d.join("plugins/text.wasm")).unwrap();
    changed.extend_from_slice(&[0, 3, 1, b'x', 0]);
    std::fs::write(d.join("plugins/text.wasm"), &changed).unwrap();
    let s = text(&tg(d, &["list", "--all"]).stdout);
    assert!(s.contains("text.wasm") && s.contains("does not verify"), "{s}");
    assert_eq!(tg(d, &["call", "text.upper", "--args", r#"{"text":"a"}"#]).status.code(), Some(2));

    // A bad key in the config is a config error naming the field.
    std::fs::write(d.join("toolgate.toml"), format!("{config}\n[signing]\nkeys = [\"ed25519:short\"]\n")).unwrap();
    let out = tg(d, &["list"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).contains("signing.keys"), "{}", text(&out.stderr));
}
