//! Invariants 4 and 7: a Tool gets exactly the granted authority — files,
//! outbound HTTP, environment — and credentials only as references. A hostile
//! component tries every way out; each attempt fails in the expected way.

use std::path::Path;

use serde_json::json;
use toolgate::StepResult;
use toolgate::sandbox::executor::Content;
use toolgate_tests::{Lang, TestHost, TestServer, guests, packed};

use super::call;

const SECRET: &str = "tg-s3cr3t-Zq8v";

struct World {
    host: TestHost,
    api: TestServer,
    other: TestServer,
}

/// The tracker API (bound to the credential), another granted server (not
/// bound), data and scratch directories, a secret outside every grant.
fn world() -> World {
    world_in(Lang::Rust)
}

/// The same world with the file and HTTP Tools written in `lang`.
fn world_in(lang: Lang) -> World {
    world_with_in(lang, r#"{ header = { name = "Authorization", format = "Bearer {}" } }"#)
}

/// The same world with the credential applied as `apply` (TOML inline table).
fn world_with(apply: &str) -> World {
    world_with_in(Lang::Rust, apply)
}

fn world_with_in(lang: Lang, apply: &str) -> World {
    let other = TestServer::start(SECRET, "http://127.0.0.1:1/");
    let api = TestServer::start(SECRET, &other.url("/echo"));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["plugins", "data/docs", "scratch", "outside"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("data/a.txt"), "alpha\nbeta needle\n").unwrap();
    std::fs::write(d.join("data/docs/b.md"), "gamma\nneedle again\n").unwrap();
    std::fs::write(d.join("outside/secret.txt"), SECRET).unwrap();
    std::os::unix::fs::symlink(d.join("outside/secret.txt"), d.join("data/abs-link")).unwrap();
    std::os::unix::fs::symlink("../outside/secret.txt", d.join("data/rel-link")).unwrap();
    let secret_file = d.join("tracker.secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    for (name, bytes) in
        [("hostile.wasm", packed(guests::HOSTILE)), ("files.wasm", lang.files()), ("tracker.wasm", lang.tracker())]
    {
        std::fs::write(d.join("plugins").join(name), bytes).unwrap();
    }
    let config = format!(
        r#"{preamble}
[limits]
http_response_kib = 16
http_timeout_ms = 500

[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = ["{api}"]
apply = {apply}

[[grants]]
tools = "*"
directories = [
  {{ path = "/data", host = "data", access = "read" }},
  {{ path = "/scratch", host = "scratch", access = "read-write" }},
]
hosts = ["{api}", "{other}", "http://localhost:{other_port}", "http://2130706433:{other_port}"]
credentials = ["tracker"]
env = {{ MODE = "test" }}

[agents.default]
visible = ["*"]
default = "allow"
"#,
        preamble = lang.preamble(),
        api = api.origin(),
        other = other.origin(),
        other_port = other.port,
        apply = apply,
    );
    std::fs::write(d.join("toolgate.toml"), config).unwrap();
    World { host: TestHost::open(dir, "default"), api, other }
}

async fn thief(host: &TestHost, op: &str, target: &str, credential: bool) -> String {
    match call(host, "hostile.thief", json!({"op": op, "target": target, "credential": credential})).await {
        StepResult::Output { content: Content::Json(serde_json::Value::String(s)), .. } => s,
        other => panic!("{op} {target}: {other:?}"),
    }
}

fn assert_err(observed: &str, contains: &str) {
    assert!(
        observed.starts_with("err: ") && observed.contains(contains),
        "expected err containing {contains:?}, got {observed}"
    );
}

each_lang! {
async fn the_http_tool_gets_its_data_with_the_credential_applied_at_the_boundary(lang: Lang) {
    let w = world_in(lang);
    let r = call(&w.host, "tracker.issues", json!({"base_url": w.api.origin()})).await;
    let StepResult::Output { content: Content::Json(v), .. } = &r else { panic!("{r:?}") };
    assert_eq!(
        v,
        &json!([{"id": 1, "title": "Crash on start", "state": "open"}, {"id": 3, "title": "Slow search", "state": "open"}])
    );
    let seen = w.api.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str()),
        "the server checks the header"
    );
    assert_eq!(seen[0].header("toolgate-credential"), None, "the reference never leaves the host");
}
}

#[tokio::test]
async fn a_response_that_reflects_the_secret_is_withheld_from_the_guest() {
    let w = world();
    let seen = thief(&w.host, "http", &w.api.url("/echo"), true).await;
    assert!(seen.starts_with("err: ") && seen.contains("withheld"), "{seen}");
    assert!(!seen.contains(SECRET), "the guest saw the secret: {seen}");
    assert_eq!(w.api.requests()[0].header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
}

#[tokio::test]
async fn the_credential_is_never_sent_to_an_unbound_destination() {
    let w = world();
    // `other` is a granted host, but the credential is not bound to it.
    let seen = thief(&w.host, "http", &w.other.url("/echo"), true).await;
    assert_err(&seen, "denied");
    assert!(w.other.requests().is_empty(), "refused before anything was sent");
    // Without the credential the same destination is fine.
    let seen = thief(&w.host, "http", &w.other.url("/echo"), false).await;
    assert!(seen.starts_with("ok: 200") && seen.contains(r#"("x-echo-authorization", "none")"#), "{seen}");
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let w = world();
    let seen = thief(&w.host, "http", &w.api.url("/redirect"), true).await;
    assert!(seen.starts_with("ok: 302"), "the guest gets the redirect itself: {seen}");
    assert!(w.other.requests().is_empty(), "nobody followed it to the other server");
}

/// A granted name over plain HTTP is only as good as its DNS: one whose
/// answer is a loopback (or private, link-local…) address would reach the
/// host's own services, so it is refused before anything leaves; `localhost`
/// names this machine and leads to its loopback address, and the request
/// goes to the address that was checked, its `Host` still the name.
#[tokio::test]
async fn a_granted_name_that_resolves_to_the_hosts_own_addresses_is_refused() {
    let w = world();
    let url = format!("http://2130706433:{}/echo", w.other.port);
    let seen = thief(&w.host, "http", &url, false).await;
    assert!(seen.starts_with("err: "), "{seen}");
    assert!(w.other.requests().is_empty(), "nothing reached the server behind the name");
    let last = w.host.runtime.store().steps(None).await.unwrap().pop().unwrap();
    assert!(
        last.captured.contains("resolved to 127.0.0.1, a loopback address"),
        "the host says why: {}",
        last.captured
    );
    let url = format!("http://localhost:{}/echo", w.other.port);
    let seen = thief(&w.host, "http", &url, false).await;
    assert!(seen.starts_with("ok: 200"), "{seen}");
    let got = w.other.requests();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("host"), Some(format!("localhost:{}", w.other.port).as_str()));
}

#[tokio::test]
async fn ungranted_hosts_ports_and_schemes_are_refused_naming_the_destination() {
    let w = world();
    let free_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for url in [
        format!("http://127.0.0.1:{free_port}/"),
        format!("https://127.0.0.1:{}/", w.api.port),
        format!("http://localhost:{}/", w.api.port),
        "http://example.com/".to_owned(),
    ] {
        let seen = thief(&w.host, "http", &url, false).await;
        assert_err(&seen, &format!("denied the request to {url}"));
    }
    assert!(w.api.requests().is_empty());
    // The step's log says which destination was refused.
    let steps = w.host.runtime.store().steps(None).await.unwrap();
    assert!(
        steps[0].captured.contains(&format!("http://127.0.0.1:{free_port} is not granted")),
        "{}",
        steps[0].captured
    );
}

#[tokio::test]
async fn sockets_and_name_lookup_are_off() {
    let w = world();
    assert_err(&thief(&w.host, "tcp", &format!("127.0.0.1:{}", w.api.port), false).await, "");
    assert_err(&thief(&w.host, "dns", "localhost", false).await, "");
    assert!(w.api.requests().is_empty());
}

#[tokio::test]
async fn the_environment_holds_only_granted_literals() {
    let w = world();
    let env = thief(&w.host, "env", "", false).await;
    assert_eq!(env, r#"[("MODE", "test")]"#);
}

#[tokio::test]
async fn files_stay_inside_their_grants() {
    let w = world();
    let h = &w.host;
    assert_eq!(thief(h, "read", "/data/a.txt", false).await, "ok: \"alpha\\nbeta needle\\n\"");
    for escape in
        ["/data/../outside/secret.txt", "/outside/secret.txt", "/data/abs-link", "/data/rel-link", "/etc/passwd"]
    {
        let seen = thief(h, "read", escape, false).await;
        assert!(seen.starts_with("err: ") && !seen.contains(SECRET), "{escape}: {seen}");
    }
    assert!(thief(h, "list", "/", false).await.starts_with("err: "));
    // Read-only grant.
    assert_err(&thief(h, "write", "/data/new.txt", false).await, "");
    assert!(!h.dir.path().join("data/new.txt").exists());
    // Read-write grant.
    assert!(thief(h, "write", "/scratch/new.txt", false).await.starts_with("ok"));
    assert!(h.dir.path().join("scratch/new.txt").exists());
    // A symlink the guest makes cannot point out.
    let made = thief(h, "symlink", "/scratch/link=>/etc/passwd", false).await;
    let read = thief(h, "read", "/scratch/link", false).await;
    assert!(made.starts_with("err: ") || read.starts_with("err: "), "{made} / {read}");
    let made = thief(h, "symlink", "/scratch/up=>../outside/secret.txt", false).await;
    let read = thief(h, "read", "/scratch/up", false).await;
    assert!((made.starts_with("err: ") || read.starts_with("err: ")) && !read.contains(SECRET), "{made} / {read}");
    // Hard links across grants.
    assert_err(&thief(h, "hardlink", "/scratch/h=>/data/a.txt", false).await, "");
}

/// A directory grant is bound to the directory found when the config is
/// loaded: the path swapped afterwards (the directory renamed away, a symlink to
/// elsewhere in its place — what a Tool with a writable grant above it could
/// do) changes nothing a Tool reaches.
#[tokio::test]
async fn a_grant_path_swapped_after_its_first_use_still_reaches_only_its_directory() {
    let w = world();
    let (h, d) = (&w.host, w.host.dir.path());
    assert_eq!(thief(h, "read", "/data/a.txt", false).await, "ok: \"alpha\\nbeta needle\\n\"");
    std::fs::rename(d.join("data"), d.join("data-old")).unwrap();
    std::os::unix::fs::symlink(d.join("outside"), d.join("data")).unwrap();
    let seen = thief(h, "read", "/data/secret.txt", false).await;
    assert!(seen.starts_with("err: ") && !seen.contains(SECRET), "{seen}");
    assert_eq!(thief(h, "read", "/data/a.txt", false).await, "ok: \"alpha\\nbeta needle\\n\"");
}

/// A grant whose directory does not exist at load is bound at its first
/// use, to the directory opened then — checked there, not where the config
/// path pointed at load: a symlink into the host's state put in its place
/// is refused, the Tool never runs with it.
#[tokio::test]
async fn a_grant_path_that_leads_into_the_hosts_state_at_first_use_is_refused() {
    // The world's host directory again, without `data` when the config is loaded.
    let w = world();
    let (from, dir) = (w.host.dir.path(), tempfile::tempdir().unwrap());
    let d = dir.path();
    for sub in ["plugins", "scratch"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    for f in ["toolgate.toml", "tracker.secret", "plugins/hostile.wasm", "plugins/files.wasm", "plugins/tracker.wasm"] {
        std::fs::copy(from.join(f), d.join(f)).unwrap();
    }
    let host = TestHost::open(dir, "default");
    let d = host.dir.path();
    std::os::unix::fs::symlink(d.join("plugins"), d.join("data")).unwrap();
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("hostile.thief", json!({"op": "list", "target": "/data", "credential": false})).await;
    let e = r.expect_err("the call must not run").to_string();
    assert!(e.contains("the plugin directory") && e.contains("refused"), "{e}");
}

/// The world's host directory copied to a new one (`plugins/` holding only
/// `hostile.wasm`), for a test to change before a host loads it.
fn world_copy(w: &World) -> tempfile::TempDir {
    let (from, dir) = (w.host.dir.path(), tempfile::tempdir().unwrap());
    let d = dir.path();
    for sub in ["plugins", "data", "scratch", "outside"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    for f in ["toolgate.toml", "tracker.secret", "plugins/hostile.wasm", "data/a.txt"] {
        std::fs::copy(from.join(f), d.join(f)).unwrap();
    }
    dir
}

/// A component a Tool could change is refused at load, naming the file, the
/// grant and what to do: one the plugin directory links to inside a
/// read-write grant, one reached through a link inside it (the file itself
/// elsewhere), one with a second link (which may be inside a grant). Else a
/// Tool rewrites a component, or points the link at its own, and the next
/// process loads it under that Tool's id, with its grants.
#[tokio::test]
async fn a_component_a_tool_could_rewrite_is_refused_at_load() {
    let w = world();
    let dir = world_copy(&w);
    let d = dir.path();
    std::fs::write(d.join("scratch/files.wasm"), Lang::Rust.files()).unwrap();
    std::os::unix::fs::symlink(d.join("scratch/files.wasm"), d.join("plugins/files.wasm")).unwrap();
    std::fs::write(d.join("outside/tracker.wasm"), Lang::Rust.tracker()).unwrap();
    std::os::unix::fs::symlink(d.join("outside/tracker.wasm"), d.join("scratch/tracker-link")).unwrap();
    std::os::unix::fs::symlink("../scratch/tracker-link", d.join("plugins/tracker.wasm")).unwrap();
    std::fs::write(d.join("plugins/notes.wasm"), Lang::Rust.notes()).unwrap();
    std::fs::hard_link(d.join("plugins/notes.wasm"), d.join("scratch/notes.wasm")).unwrap();
    // A link to a component outside every grant is the operator's choice.
    std::fs::write(d.join("outside/text.wasm"), Lang::Rust.text()).unwrap();
    std::os::unix::fs::symlink(d.join("outside/text.wasm"), d.join("plugins/text.wasm")).unwrap();
    let config = toolgate::Config::load(&d.join("toolgate.toml")).unwrap();
    let catalog = toolgate::host::catalog(&config).unwrap();
    let reason = |name: &str| {
        let r = catalog.refused().iter().find(|r| r.path.ends_with(name));
        r.unwrap_or_else(|| panic!("{name} must be refused: {:?}", catalog.refused())).reason.clone()
    };
    for name in ["files.wasm", "tracker.wasm"] {
        let r = reason(name);
        assert!(r.contains("grants[0].directories[1]") && r.contains("read-write") && r.contains("scratch"), "{r}");
    }
    let r = reason("notes.wasm");
    assert!(r.contains("2 links") && r.contains("samefile"), "{r}");
    assert_eq!(catalog.refused().len(), 3, "{:?}", catalog.refused());
    assert!(catalog.get("hostile.thief").is_some() && catalog.get("text.count").is_some());
    assert!(catalog.get("files.read").is_none() && catalog.get("tracker.issues").is_none());
}

/// A hard link to the host's own files put inside a grant (the config, a
/// credential's secret file, the journal) is refused at load, naming the
/// file and how to find the other link: the host cannot list every grant's
/// files to find it.
#[tokio::test]
async fn a_second_link_to_the_hosts_files_is_refused_at_load() {
    let w = world();
    let dir = world_copy(&w);
    let d = dir.path();
    std::fs::write(d.join("journal.db"), "").unwrap();
    let config = d.join("toolgate.toml");
    toolgate::Config::load(&config).unwrap();
    for (name, what) in
        [("toolgate.toml", "config"), ("tracker.secret", "credentials.tracker"), ("journal.db", "store")]
    {
        std::fs::hard_link(d.join(name), d.join("scratch/copy")).unwrap();
        let e = toolgate::Config::load(&config).expect_err(name).to_string();
        assert!(e.contains(what) && e.contains("2 links") && e.contains("samefile"), "{name}: {e}");
        std::fs::remove_file(d.join("scratch/copy")).unwrap();
    }
    toolgate::Config::load(&config).unwrap();
}

/// A bind mount for the length of a test, or `None` (with the reason
/// printed) where this process cannot mount (not root, no mount namespace
/// rights, no `mount` program).
struct BindMount(std::path::PathBuf);

impl BindMount {
    fn new(from: &Path, at: &Path) -> Option<BindMount> {
        std::fs::create_dir_all(at).unwrap();
        match std::process::Command::new("mount").arg("--bind").arg(from).arg(at).output() {
            Ok(out) if out.status.success() => Some(BindMount(at.to_owned())),
            Ok(out) => {
                eprintln!("skipped: cannot bind-mount here: {}", String::from_utf8_lossy(&out.stderr).trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run `mount`: {e}");
                None
            }
        }
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A grant is compared with the host's state by what it is, not by its
/// name: a second mount of the journal's directory, a directory holding a
/// mount of the cache, one inside a second mount of the plugin directory —
/// names no string comparison relates — are each refused at load, naming
/// the field and what they would reach; and a grant bound at its first use
/// to a second mount of the journal's directory refuses the call. Needs
/// mount rights: skipped (saying so) without them.
#[tokio::test]
async fn a_grant_on_a_second_mount_of_the_hosts_state_is_refused() {
    let w = world();
    let dir = world_copy(&w);
    let d = dir.path();
    std::fs::create_dir_all(d.join("state")).unwrap();
    std::fs::create_dir_all(d.join("cache")).unwrap();
    let text = std::fs::read_to_string(d.join("toolgate.toml"))
        .unwrap()
        .replace("store = \"journal.db\"", "store = \"state/journal.db\"");
    assert!(text.contains("state/journal.db"), "the preamble names the journal: {text}");
    let grant_at = |host: &str| {
        text.replace(
            "{ path = \"/data\", host = \"data\", access = \"read\" }",
            &format!("{{ path = \"/data\", host = \"{host}\", access = \"read\" }}"),
        )
    };
    let load = |text: String| {
        std::fs::write(d.join("toolgate.toml"), text).unwrap();
        toolgate::Config::load(&d.join("toolgate.toml"))
    };
    let Some(_state) = BindMount::new(&d.join("state"), &d.join("mnt/state")) else { return };
    let Some(_cache) = BindMount::new(&d.join("cache"), &d.join("vol/c")) else { return };
    let Some(_plugins) = BindMount::new(&d.join("plugins"), &d.join("p2")) else { return };
    std::fs::create_dir_all(d.join("plugins/inner")).unwrap();
    for (host, what) in [
        ("mnt/state", "the journal"),
        ("mnt", "the journal"),
        ("vol", "the compiled-code cache"),
        ("p2/inner", "the plugin directory"),
    ] {
        let e = load(grant_at(host)).expect_err(host).to_string();
        assert!(
            e.contains("grants[0].directories[0].host") && e.contains(what) && e.contains("another name"),
            "{host}: {e}"
        );
    }
    load(grant_at("data")).unwrap();
    drop((_state, _cache, _plugins));
    // Not there at load: bound at its first use — to a second mount of the journal's directory.
    load(grant_at("late")).unwrap();
    let host = TestHost::open(dir, "default");
    let d = host.dir.path();
    let Some(_late) = BindMount::new(&d.join("state"), &d.join("late")) else { return };
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = run.call("hostile.thief", json!({"op": "list", "target": "/data", "credential": false})).await;
    let e = r.expect_err("the call must not run").to_string();
    assert!(e.contains("the journal") && e.contains("another name") && e.contains("refused"), "{e}");
}

each_lang! {
/// A Tool written in either SDK whose response would carry the secret backeach_lang! {
/// A Tool written in either SDK whose response would carry the secret back
/// (a server reflecting the Authorization header) gets an error, never the
/// secret; the host applied it on the way out all the same.
async fn a_response_reflecting_the_secret_reaches_the_tool_as_an_error_without_it(lang: Lang) {
    let w = world_in(lang);
    let r = call(&w.host, "tracker.issues", json!({"base_url": w.api.url("/echo")})).await;
    let StepResult::ToolError { message, .. } = &r else { panic!("{r:?}") };
    assert!(message.contains("withheld") && !message.contains(SECRET), "{message}");
    assert_eq!(w.api.requests()[0].header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
}
}

each_lang! {
async fn the_file_tool_reads_and_searches_its_grant(lang: Lang) {
    let w = world_in(lang);
    let r = call(&w.host, "files.read", json!({"path": "docs/b.md"})).await;
    assert!(
        matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v == "gamma\nneedle again\n"),
        "{r:?}"
    );
    let r = call(&w.host, "files.search", json!({"query": "needle"})).await;
    let StepResult::Output { content: Content::Json(v), .. } = &r else { panic!("{r:?}") };
    assert_eq!(
        v,
        &json!([{"path": "a.txt", "line": 2, "text": "beta needle"}, {"path": "docs/b.md", "line": 2, "text": "needle again"}])
    );
    let r = call(&w.host, "files.read", json!({"path": "../outside/secret.txt"})).await;
    assert!(matches!(&r, StepResult::ToolError { message, .. } if !message.contains(SECRET)), "{r:?}");
}
}

each_lang! {
async fn the_secret_appears_nowhere_in_the_journal_or_captured_output(lang: Lang) {
    let w = world_in(lang);
    call(&w.host, "tracker.issues", json!({"base_url": w.api.origin()})).await;
    thief(&w.host, "http", &w.api.url("/echo"), true).await;
    thief(&w.host, "http", &w.other.url("/echo"), true).await;
    thief(&w.host, "read", "/data/abs-link", false).await;
    drop(w.host.runtime);
    let mut checked = 0;
    for entry in std::fs::read_dir(w.host.dir.path()).unwrap().flatten() {
        let p = entry.path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("journal.db") {
            let bytes = std::fs::read(&p).unwrap();
            assert!(!contains(&bytes, SECRET.as_bytes()), "{name} holds the secret");
            checked += 1;
        }
    }
    assert!(checked >= 1);
    assert_no_secret_in(lang.cache_dir(w.host.dir.path()).as_path());
}
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn assert_no_secret_in(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let bytes = std::fs::read(e.path()).unwrap_or_default();
        assert!(!contains(&bytes, SECRET.as_bytes()), "{} holds the secret", e.path().display());
    }
}

#[tokio::test]
async fn a_missing_secret_is_a_clear_error_that_names_only_the_reference() {
    let w = world();
    // Read once by this process (every call's output is checked for it),
    // then gone: its values stay watched, and using it is a clear error.
    // (Never read, nothing is sent and the output is withheld: `boundary`.
    // This test passed that way only while another test's `tracker` counted.)
    thief(&w.host, "env", "", false).await;
    std::fs::remove_file(w.host.dir.path().join("tracker.secret")).unwrap();
    let seen = thief(&w.host, "http", &w.api.url("/echo"), true).await;
    assert!(seen.starts_with("err: ") && seen.contains("tracker"), "{seen}");
    assert!(w.api.requests().is_empty());
}

async fn thief_in(run: &toolgate::Run<'_>, op: &str, target: &str, credential: bool) -> String {
    match run.call("hostile.thief", json!({"op": op, "target": target, "credential": credential})).await.unwrap() {
        StepResult::Output { content: Content::Json(serde_json::Value::String(s)), .. } => s,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_run_can_only_narrow_the_granted_authority() {
    use toolgate::config::Restriction;
    let w = world();
    let rt = &w.host.runtime;
    let configured = toolgate::ToolCapabilityNarrowing::Configured;
    // No hosts for this run.
    let run = rt
        .start_restricted_run(None, configured, Restriction { hosts: Some(vec![]), ..Default::default() })
        .await
        .unwrap();
    assert_err(&thief_in(&run, "http", &w.other.url("/echo"), false).await, "denied");
    // No credentials: the destination stays, the credential goes.
    let run = rt
        .start_restricted_run(None, configured, Restriction { credentials: Some(vec![]), ..Default::default() })
        .await
        .unwrap();
    assert_err(&thief_in(&run, "http", &w.api.url("/echo"), true).await, "denied");
    assert!(thief_in(&run, "http", &w.api.url("/echo"), false).await.starts_with("ok: 200"));
    // Only /scratch stays mounted.
    let run = rt
        .start_restricted_run(
            None,
            configured,
            Restriction { directories: Some(vec!["/scratch".into()]), ..Default::default() },
        )
        .await
        .unwrap();
    assert_err(&thief_in(&run, "read", "/data/a.txt", false).await, "");
    // A restriction naming authority that was never granted adds nothing.
    let run = rt
        .start_restricted_run(
            None,
            configured,
            Restriction {
                hosts: Some(vec!["http://127.0.0.1:*".into(), "https://example.com:443".into()]),
                directories: Some(vec!["/etc".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_err(&thief_in(&run, "http", "https://example.com/", false).await, "denied");
    assert!(thief_in(&run, "read", "/etc/passwd", false).await.starts_with("err: "));
    assert!(thief_in(&run, "http", &w.other.url("/echo"), false).await.starts_with("ok: 200"));
    assert!(w.api.requests().len() == 1 && w.other.requests().len() == 1);
}

/// The filter's result is kept per view: a restricted run's view is its
/// own, so neither what ran before it nor what runs after it changes what
/// it may do, and its restriction never reaches another run.
#[tokio::test]
async fn a_run_restriction_holds_whatever_ran_before_it_and_stays_with_its_run() {
    use toolgate::config::Restriction;
    let w = world();
    let rt = &w.host.runtime;
    let configured = toolgate::ToolCapabilityNarrowing::Configured;
    let open = rt.start_run(None, configured).await.unwrap();
    assert!(thief_in(&open, "http", &w.other.url("/echo"), false).await.starts_with("ok: 200"));
    let closed = rt
        .start_restricted_run(None, configured, Restriction { hosts: Some(vec![]), ..Default::default() })
        .await
        .unwrap();
    assert_err(&thief_in(&closed, "http", &w.other.url("/echo"), false).await, "denied");
    assert!(thief_in(&open, "http", &w.other.url("/echo"), false).await.starts_with("ok: 200"));
    let after = rt.start_run(None, configured).await.unwrap();
    assert!(thief_in(&after, "http", &w.other.url("/echo"), false).await.starts_with("ok: 200"));
    assert_err(&thief_in(&closed, "http", &w.other.url("/echo"), false).await, "denied");
    assert_eq!(w.other.requests().len(), 3);
}

#[tokio::test]
async fn an_agent_can_narrow_the_hosts_grants() {
    let w = world();
    let mut config = w.host.config.clone();
    config.agents.get_mut("default").unwrap().authority.hosts = Some(vec![w.other.origin()]);
    let rt = toolgate_tests::runtime_for(&config, "default");
    let run = rt.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    assert_err(&thief_in(&run, "http", &w.api.url("/echo"), false).await, "denied");
    assert!(thief_in(&run, "http", &w.other.url("/echo"), false).await.starts_with("ok: 200"));
}

#[tokio::test]
async fn responses_over_the_limit_are_refused() {
    let w = world();
    assert_err(&thief(&w.host, "http", &w.api.url("/big"), false).await, "HttpResponseBodySize");
}

#[tokio::test]
async fn basic_auth_is_applied_at_the_boundary_and_checked_on_the_way_back() {
    use base64::Engine as _;
    let w = world_with(r#"{ basic = { username = "bot" } }"#);
    let seen = thief(&w.host, "http", &w.api.url("/echo"), true).await;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("bot:{SECRET}"));
    assert_eq!(w.api.requests()[0].header("authorization"), Some(format!("Basic {token}").as_str()));
    assert!(seen.contains("withheld") && !seen.contains(&token) && !seen.contains(SECRET), "{seen}");
}

#[tokio::test]
async fn a_query_parameter_credential_is_applied_and_checked_on_the_way_back() {
    let w = world_with(r#"{ query = { param = "api_key" } }"#);
    let seen = thief(&w.host, "http", &w.api.url("/echo?x=1"), true).await;
    assert_eq!(w.api.requests()[0].line, format!("GET /echo?x=1&api_key={SECRET} HTTP/1.1"));
    assert!(seen.contains("withheld") && !seen.contains(SECRET), "{seen}");
}

#[tokio::test]
async fn a_server_that_never_answers_is_cut_off_at_the_http_timeout() {
    let w = world();
    let seen = thief(&w.host, "http", &w.api.url("/slow"), false).await;
    assert!(seen.starts_with("err: ") && seen.contains("Timeout"), "{seen}");
    // The host still serves.
    assert!(thief(&w.host, "http", &w.other.url("/echo"), false).await.starts_with("ok: 200"));
}

/// A recorded run keeps its restriction however it is continued: a
/// continuation without a restriction of its own does not stand in for the
/// run's record (the file journal answered from runs begun and not yet
/// written, so a second continuation before the first's step ran unrestricted).
#[tokio::test]
async fn a_restricted_run_continued_again_keeps_its_restriction() {
    use toolgate::config::Restriction;
    let w = world();
    let rt = &w.host.runtime;
    let configured = toolgate::ToolCapabilityNarrowing::Configured;
    let scratch_only = Restriction { directories: Some(vec!["/scratch".into()]), ..Default::default() };
    let first = rt.start_restricted_run(None, configured, scratch_only).await.unwrap();
    assert_err(&thief_in(&first, "read", "/data/a.txt", false).await, "");
    let id = first.id().to_owned();
    let once = rt.start_run(Some(id.clone()), configured).await.unwrap();
    let twice = rt.start_run(Some(id.clone()), configured).await.unwrap();
    for run in [&twice, &once] {
        assert_err(&thief_in(run, "read", "/data/a.txt", false).await, "");
    }
    // A fresh run reads it: the restriction is what keeps it out.
    let fresh = rt.start_run(None, configured).await.unwrap();
    assert_eq!(thief_in(&fresh, "read", "/data/a.txt", false).await, "ok: \"alpha\\nbeta needle\\n\"");
}

#[tokio::test]
async fn a_restricted_run_keeps_its_restriction_when_its_ask_is_approved() {
    use toolgate::config::Restriction;
    let w = world();
    // A second agent on the same host asks before every call.
    let cfg = w.host.dir.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&cfg).unwrap() + "\n[agents.asker]\nvisible = [\"*\"]\ndefault = \"ask\"\n";
    std::fs::write(&cfg, text).unwrap();
    let config = toolgate::Config::load(&cfg).unwrap();
    let asker = toolgate_tests::runtime_for(&config, "asker");
    let configured = toolgate::ToolCapabilityNarrowing::Configured;
    let read = json!({"op": "read", "target": "/data/a.txt", "credential": false});
    let mut results = Vec::new();
    let scratch_only = || Restriction { directories: Some(vec!["/scratch".into()]), ..Default::default() };
    // Each case: how the run began (its restriction, and whether a step was
    // written before it was continued), then the restriction it asks under.
    // The journal's run record keeps only the first begin: the ticket must
    // carry what the ask was made under.
    let cases = [
        (None, scratch_only()),
        (Some((Restriction::default(), true)), scratch_only()),
        (Some((scratch_only(), false)), Restriction::default()),
        (Some((scratch_only(), true)), Restriction::default()),
        (None, Restriction::default()),
    ];
    for (began, restriction) in cases {
        let mut id = None;
        if let Some((first, step)) = began {
            let first = asker.start_restricted_run(None, configured, first).await.unwrap();
            if step {
                // Invalid arguments: a step is written, nothing asks.
                let r = first.call("hostile.thief", json!({"op": 7})).await.unwrap();
                assert!(matches!(r, StepResult::ToolError { .. }), "{r:?}");
            }
            id = Some(first.id().to_owned());
            // Continued once more in between, without a restriction of its own.
            drop(asker.start_run(id.clone(), configured).await.unwrap());
        }
        let run = asker.start_restricted_run(id, configured, restriction).await.unwrap();
        let StepResult::Awaiting { ticket, .. } = run.call("hostile.thief", read.clone()).await.unwrap() else {
            panic!("the asker's call awaits approval")
        };
        // Approved by another runtime (as another process would be): it knows
        // the run only from the journal; and by the asking one, which also
        // knows the runs it began and has not written yet.
        let other = toolgate_tests::runtime_for(&config, "asker");
        let approver = if results.len() % 2 == 0 { &other } else { &asker };
        let shown = approver.store().awaiting(&ticket).await.unwrap().unwrap().call_digest();
        let approval = toolgate::Approval::by_embedder("test-approver", shown);
        match approver.approve(&ticket, &approval).await.unwrap() {
            StepResult::Output { content: Content::Json(serde_json::Value::String(s)), .. } => results.push(s),
            other => panic!("{other:?}"),
        }
    }
    assert!(results[0].starts_with("err: "), "the restricted run's approval ran without /data: {}", results[0]);
    assert!(
        results[1].starts_with("err: "),
        "a run continued restricted: its approval ran without /data: {}",
        results[1]
    );
    assert!(
        results[2].starts_with("err: "),
        "a restricted run continued: its approval ran without /data: {}",
        results[2]
    );
    assert!(
        results[3].starts_with("err: "),
        "a restricted run continued twice: its approval ran without /data: {}",
        results[3]
    );
    assert!(results[4].contains("needle"), "without the restriction the same approval reads it: {}", results[4]);
}
