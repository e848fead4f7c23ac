//! Invariants 1–3, 9, 10: visibility, availability and authorization happen
//! before any effect; only Allow executes; blocked calls are committed results.

use serde_json::json;
use toolgate::sandbox::executor::Content;
use toolgate::store::OutcomeKind;
use toolgate::{CallError, StepResult, ToolCapabilityNarrowing};
use toolgate_tests::{Lang, TestHost, TestServer, guests, packed};

use super::{call, steps, text_and_notes, text_and_notes_in};

each_lang! {
async fn visible_but_denied_is_blocked_committed_and_never_instantiated(lang: Lang) {
    let host = text_and_notes_in(lang, "");
    assert!(host.runtime.list().iter().any(|d| d.id == "text.repeat"), "the model may see a tool it may not run");
    let r = call(&host, "text.repeat", json!({"text": "a", "times": 2})).await;
    let StepResult::Blocked { reason, .. } = &r else { panic!("expected blocked, got {r:?}") };
    assert!(reason.contains("rule `text.repeat`"), "reason names the rule: {reason}");
    assert_eq!(host.instantiations(), 0, "a denied call instantiates nothing");
    assert_eq!(host.runtime.executor().compilations(), 0, "a denied call compiles nothing");
    let s = steps(&host).await;
    assert_eq!((s.len(), s[0].outcome, s[0].verdict.as_str()), (1, OutcomeKind::Blocked, "deny"));
}
}

each_lang! {
async fn installed_but_invisible_is_absent_and_refused_like_an_unknown_tool(lang: Lang) {
    // notes is installed but this agent only sees text.*.
    let host = TestHost::new_in(
        lang,
        "[agents.default]\nvisible = [\"text.*\"]\ndefault = \"allow\"\n",
        &[("text.wasm", lang.text()), ("notes.wasm", lang.notes())],
    );
    assert!(host.runtime.list().iter().all(|d| d.id != "notes"));
    let run = host.runtime.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let invisible = run.call("notes", json!({"op": "list"})).await.unwrap_err();
    let missing = run.call("no.such.tool", json!({})).await.unwrap_err();
    assert!(matches!(invisible, CallError::UnknownTool(ref id) if id == "notes"), "{invisible}");
    assert_eq!(
        invisible.to_string().replace("notes", "X"),
        missing.to_string().replace("no.such.tool", "X"),
        "an invisible tool is indistinguishable from a missing one"
    );
    assert_eq!(host.instantiations(), 0);
    assert!(steps(&host).await.is_empty(), "an unknown tool is a protocol error, not a step");
}
}

/// Invariants 10 and 14: arguments past the host's bounds — more JSON than
/// `limits.arguments_kib`, or nested deeper than a parser allows (a library
/// caller's `Value` has no parser's limit, and the schema check, the gate
/// and the journal recurse into them) — are a committed Tool error before
/// anything reads them; the journal keeps a note, not the arguments.
#[tokio::test]
async fn arguments_past_the_hosts_bounds_are_a_tool_error_before_anything_reads_them() {
    let host = text_and_notes("[limits]\narguments_kib = 4\n");
    // Built by hand: `json!` would serialize `deep` (recursively) at each level.
    let mut deep = serde_json::Value::String("x".into());
    for _ in 0..200_000 {
        deep = serde_json::Value::Array(vec![deep]);
    }
    let args = serde_json::Value::Object([("text".to_owned(), deep)].into_iter().collect());
    let r = call(&host, "text.upper", args).await;
    let StepResult::ToolError { message, .. } = &r else { panic!("{r:?}") };
    assert!(message.contains("nested deeper than 128 levels"), "{message}");
    let r = call(&host, "text.upper", json!({"text": "x".repeat(5000)})).await;
    let StepResult::ToolError { message, .. } = &r else { panic!("{r:?}") };
    assert!(message.contains("over 4 KiB") && message.contains("limits.arguments_kib"), "{message}");
    // Within the bounds, the call runs.
    let r = call(&host, "text.upper", json!({"text": "x".repeat(3000)})).await;
    assert!(matches!(r, StepResult::Output { .. }), "{r:?}");
    let s = steps(&host).await;
    assert_eq!(s.len(), 3);
    for step in &s[..2] {
        assert_eq!(step.outcome, OutcomeKind::ToolError);
        assert!(
            step.arguments.starts_with("\"(arguments not kept: ") && step.arguments.len() < 400,
            "{}",
            step.arguments
        );
    }
    assert_eq!(host.instantiations(), 1, "only the call within the bounds ran");
}

each_lang! {
async fn invalid_arguments_are_a_tool_error_before_the_gate_and_nothing_runs(lang: Lang) {
    let host = text_and_notes_in(lang, "");
    for args in [json!({"txt": "x"}), json!({"text": 5}), json!([1]), json!({"text": "a", "extra": 1})] {
        let r = call(&host, "text.upper", args.clone()).await;
        let StepResult::ToolError { message, .. } = &r else { panic!("{args}: expected tool error, got {r:?}") };
        assert!(message.starts_with("invalid arguments for `text.upper`"), "{message}");
    }
    // `null` means `{}`, which lacks the required `text`.
    let r = call(&host, "text.upper", json!(null)).await;
    assert!(
        matches!(&r, StepResult::ToolError { message, .. } if message.contains("\"text\" is a required property")),
        "{r:?}"
    );
    assert_eq!(host.instantiations(), 0);
    assert!(steps(&host).await.iter().all(|s| s.outcome == OutcomeKind::ToolError && s.verdict == "none"));
}
}

#[tokio::test]
async fn a_run_with_tools_disabled_blocks_every_call_with_a_reason() {
    let host = text_and_notes("");
    let run = host.runtime.start_run(None, ToolCapabilityNarrowing::DenyAll).await.unwrap();
    let r = run.call("text.upper", json!({"text": "x"})).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("tools are disabled")), "{r:?}");
    assert_eq!(host.instantiations(), 0);
}

#[tokio::test]
async fn a_tool_declaring_ungranted_authority_is_removed_with_the_fix_named() {
    let visible = "[agents.default]\nvisible = [\"hostile.needs_dir\"]\ndefault = \"allow\"\n";
    let host = TestHost::new(visible, &[("hostile.wasm", packed(guests::HOSTILE))]);
    assert!(host.runtime.list().is_empty(), "not granted → not listed");
    let r = call(&host, "hostile.needs_dir", json!({})).await;
    let StepResult::Blocked { reason, .. } = &r else { panic!("{r:?}") };
    assert!(reason.contains("declares directory /data") && reason.contains("[[grants]]"), "{reason}");
    assert_eq!(host.instantiations(), 0);

    let granted = format!(
        "[[grants]]\ntools = \"hostile.needs_dir\"\ndirectories = [{{ path = \"/data\", host = \"data\", access = \"read\" }}]\n{visible}"
    );
    let host = TestHost::new(&granted, &[("hostile.wasm", packed(guests::HOSTILE))]);
    std::fs::create_dir(host.dir.path().join("data")).unwrap();
    assert_eq!(host.runtime.list().len(), 1);
    assert!(matches!(call(&host, "hostile.needs_dir", json!({})).await, StepResult::Output { .. }));
}

#[tokio::test]
async fn components_compile_lazily_once_and_then_come_from_the_disk_cache() {
    let host = text_and_notes("");
    assert_eq!(host.runtime.executor().compilations(), 0, "loading compiles nothing");
    call(&host, "text.upper", json!({"text": "a"})).await;
    call(&host, "text.count", json!({"text": "a"})).await;
    let executor = host.runtime.executor();
    executor.settle().await;
    assert_eq!(executor.compilations(), 1, "one component, compiled once by Cranelift");
    assert_eq!(executor.baseline_counts().0, 1, "and once by Winch, for the first call");
    assert_eq!(host.instantiations(), 2, "a fresh instance per call");
    let host = host.restart();
    let r = call(&host, "text.upper", json!({"text": "b"})).await;
    assert!(matches!(r, StepResult::Output { .. }));
    let executor = host.runtime.executor();
    assert_eq!(executor.compilations(), 0, "a restarted host loads the cached artifact");
    assert_eq!(executor.baseline_counts(), (0, 0), "and runs Cranelift's code from the start");
}

/// A component never compiled runs its first call on the baseline tier
/// (Winch) without waiting for Cranelift; Cranelift compiles it behind
/// that call, and once its code is ready the next calls run on it. Both
/// tiers run the same sandbox: the same grant, limits and deadline.
#[tokio::test]
async fn a_first_call_runs_on_the_baseline_tier_while_cranelift_compiles_behind_it() {
    let host = text_and_notes("");
    let r = call(&host, "text.upper", json!({"text": "tiered"})).await;
    assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v == "TIERED"), "{r:?}");
    let executor = host.runtime.executor();
    assert_eq!(executor.baseline_counts(), (1, 1), "compiled by Winch and run on its code");
    executor.settle().await;
    assert_eq!(executor.compilations(), 1, "Cranelift compiled it behind the call");
    let r = call(&host, "text.upper", json!({"text": "again"})).await;
    assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v == "AGAIN"), "{r:?}");
    assert_eq!(executor.baseline_counts(), (1, 1), "the next call ran on Cranelift's code");
    assert_eq!(host.instantiations(), 2);
    // The baseline tier's sandbox is the same sandbox: a guest that spins
    // still meets the deadline on Winch's code.
    let host = TestHost::new(
        "[limits]\ntimeout_ms = 200\n[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("hostile.wasm", packed(guests::HOSTILE))],
    );
    let r = call(&host, "hostile.loop", json!({})).await;
    assert!(matches!(&r, StepResult::ToolError { message, .. } if message.contains("200 ms deadline")), "{r:?}");
    assert_eq!(host.runtime.executor().baseline_counts(), (1, 1), "the loop ran on Winch's code");
}

/// A component the baseline compiler cannot compile (relaxed SIMD, which
/// Winch lacks and Cranelift has) is not failed or marked unhealthy: its
/// first call waits for Cranelift, and every call runs on Cranelift's code.
#[tokio::test]
async fn a_component_winch_cannot_compile_runs_on_cranelift_from_its_first_call() {
    let host = TestHost::new(
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("relaxed.wasm", packed(guests::RELAXED))],
    );
    let r = call(&host, "relaxed.madd", json!({"a": 2.0, "b": 3.0, "c": 1.0})).await;
    assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v == 7.0), "{r:?}");
    let executor = host.runtime.executor();
    assert_eq!(executor.baseline_counts(), (0, 0), "Winch compiled nothing and ran nothing");
    assert_eq!(executor.compilations(), 1, "Cranelift compiled it for the first call");
    let digest = host.runtime.snapshot().candidate("relaxed.madd", &|_| None).unwrap().installed.component.digest;
    assert_eq!(executor.unhealthy(&digest), None, "the baseline's refusal is not a load failure");
    let r = call(&host, "relaxed.madd", json!({"a": 1.5, "b": 2.0, "c": 0.5})).await;
    assert!(matches!(&r, StepResult::Output { content: Content::Json(v), .. } if v == 3.5), "{r:?}");
    assert_eq!((executor.baseline_counts(), executor.compilations()), ((0, 0), 1), "compiled once");
}

/// `toolgate lock`'s precompile compiles the pinned components into the
/// cache and instantiates nothing (invariant 3: no component runs before
/// Allow); a host started after it compiles nothing on a first call.
#[tokio::test]
async fn precompiling_pinned_components_compiles_but_never_instantiates() {
    let host = text_and_notes("");
    let catalog = toolgate::host::catalog(&host.config).unwrap();
    let executor = toolgate::host::executor(&host.config).unwrap();
    for c in catalog.components() {
        executor.precompile(&c.path, c.digest).await.unwrap();
    }
    assert_eq!((executor.compilations(), executor.instantiations()), (2, 0), "compiled, never instantiated");
    let again = toolgate::host::precompile(&host.config, &catalog).await.unwrap();
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|(_, r)| r == &Ok(false)), "already cached: {again:?}");
    let host = host.restart();
    assert!(matches!(call(&host, "text.upper", json!({"text": "a"})).await, StepResult::Output { .. }));
    assert_eq!(host.runtime.executor().compilations(), 0, "the first call loads the precompiled artifact");
}

#[tokio::test]
async fn a_component_that_fails_to_compile_is_an_executor_error_then_unhealthy() {
    // Valid metadata, corrupt code: loading succeeds (nothing is compiled),
    // the first allowed call finds out.
    let mut broken = packed(guests::TEXT);
    let mid = broken.len() / 2;
    broken[mid..mid + 256].fill(0xff);
    let host = TestHost::new(
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("broken.wasm", broken), ("notes.wasm", packed(guests::NOTES))],
    );
    assert_eq!(host.runtime.list().len(), 4, "descriptors load without compiling");
    let run = host.runtime.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let e = run.call("text.upper", json!({"text": "x"})).await.unwrap_err();
    assert!(matches!(e, CallError::Executor(_)), "{e}");
    assert!(e.to_string().contains("broken.wasm"), "names the file: {e}");
    assert_eq!(steps(&host).await.last().unwrap().outcome, OutcomeKind::ExecutorError, "and the journal says so");
    // Now unhealthy: removed by the filter, with the reason.
    assert!(host.runtime.list().iter().all(|d| !d.id.starts_with("text.")));
    let r = run.call("text.count", json!({"text": "x"})).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("unhealthy")), "{r:?}");
    // The reason the model reads holds no path of the host, nor the
    // loader's words; the journal's results neither (invariant 14).
    let root = host.dir.path().to_string_lossy().into_owned();
    let StepResult::Blocked { reason, .. } = &r else { unreachable!() };
    assert!(!reason.contains(&root) && !reason.contains("broken.wasm"), "{reason}");
    assert!(reason.contains("could not load its component") && reason.contains("operator"), "{reason}");
    for step in steps(&host).await {
        assert!(!step.result.contains(&root), "{}", step.result);
    }
    // The other component still serves.
    assert!(matches!(run.call("notes", json!({"op": "list"})).await.unwrap(), StepResult::Output { .. }));
}

/// A host with the Rust tracker, granted two servers (`http://127.0.0.1:PORT`)
/// with the `tracker` credential bound to both, and an agent with `default`
/// and `rules` (TOML array text).
fn tracker_host(servers: [&TestServer; 2], default: &str, rules: &str) -> TestHost {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("plugins")).unwrap();
    std::fs::write(d.join("plugins/tracker.wasm"), Lang::Rust.tracker()).unwrap();
    let secret = d.join("tracker.secret");
    std::fs::write(&secret, format!("{TRACKER_SECRET}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let hosts = servers.map(|s| format!("\"{}\"", s.origin())).join(", ");
    let config = format!(
        r#"{preamble}
[credentials.tracker]
source = {{ file = "tracker.secret" }}
destinations = [{hosts}]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}

[[grants]]
tools = "tracker.*"
hosts = [{hosts}]
credentials = ["tracker"]

[agents.default]
visible = ["*"]
default = "{default}"
rules = {rules}
"#,
        preamble = Lang::Rust.preamble(),
    );
    std::fs::write(d.join("toolgate.toml"), config).unwrap();
    TestHost::open(dir, "default")
}

const TRACKER_SECRET: &str = "tg-url-rule-s3cr3t";

/// Review F1, end to end: URL rules were matched as file paths, so a deny on
/// a server missed it spelled with `..` after the host, with its scheme in
/// capitals, a port in leading zeros or no path — and an allow on one server let a
/// `..` reach another, credential and all. The gate now reads a URL as a
/// URL: each spelling of the denied server is blocked before the Tool runs
/// and the server sees nothing; the allowed server still serves. Fails on the
/// previous code (every spelling was allowed and reached the server).
#[tokio::test]
async fn a_url_rule_holds_against_every_spelling_of_the_url() {
    let internal = TestServer::start(TRACKER_SECRET, "http://127.0.0.1:1/");
    let acme = TestServer::start(TRACKER_SECRET, "http://127.0.0.1:1/");
    let (ip, ap) = (internal.port, acme.port);
    let deny =
        format!(r#"[{{ pattern = 'tracker.issues(base_url ~ "http://127.0.0.1:{ip}/**")', behavior = "deny" }}]"#);
    let host = tracker_host([&internal, &acme], "allow", &deny);
    for url in [
        format!("http://127.0.0.1:{ip}"),
        format!("http://127.0.0.1:{ip}/.."),
        format!("HTTP://127.0.0.1:{ip}/x"),
        format!("Http://127.0.0.1:0{ip}"),
        format!("http://127.0.0.1:{ip}/a/%2e%2e/.."),
    ] {
        let r = call(&host, "tracker.issues", json!({"base_url": url})).await;
        assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("base_url ~")), "{url}: {r:?}");
    }
    assert!(internal.requests().is_empty(), "the denied server saw nothing");
    let r = call(&host, "tracker.issues", json!({"base_url": format!("http://127.0.0.1:{ap}")})).await;
    assert!(matches!(&r, StepResult::Output { .. }), "another server is not denied: {r:?}");
    assert_eq!(acme.requests().len(), 1);

    let allow =
        format!(r#"[{{ pattern = 'tracker.issues(base_url ~ "http://127.0.0.1:{ap}/**")', behavior = "allow" }}]"#);
    let host = tracker_host([&internal, &acme], "deny", &allow);
    let sneaky = format!("http://127.0.0.1:{ip}/..//127.0.0.1:{ap}/x");
    let r = call(&host, "tracker.issues", json!({"base_url": sneaky})).await;
    assert!(
        matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("the agent's default")),
        "{sneaky}: {r:?}"
    );
    assert!(internal.requests().is_empty(), "the allow on one server is no way to the other");
    let r = call(&host, "tracker.issues", json!({"base_url": format!("HTTP://127.0.0.1:000{ap}/")})).await;
    assert!(matches!(&r, StepResult::Output { .. }), "the allowed server, in any spelling: {r:?}");
    assert_eq!(acme.requests().len(), 2);
}

/// Review (URL fragment and query), end to end: a deny on a subtree was
/// dodged by `#…` or `?` after its base — the rule compared the text with
/// them, while the client drops the fragment and the server routes the path
/// without the query, so the denied path was requested. Each spelling is now
/// blocked before the Tool runs and the server sees nothing. Fails on the
/// previous code (the server saw `GET /admin…`).
#[tokio::test]
async fn a_fragment_or_a_query_does_not_dodge_a_url_rule_end_to_end() {
    let server = TestServer::start(TRACKER_SECRET, "http://127.0.0.1:1/");
    let other = TestServer::start(TRACKER_SECRET, "http://127.0.0.1:1/");
    let port = server.port;
    let deny = format!(
        r#"[{{ pattern = 'tracker.issues(base_url ~ "http://127.0.0.1:{port}/admin/**")', behavior = "deny" }}]"#
    );
    let host = tracker_host([&server, &other], "allow", &deny);
    for url in [
        format!("http://127.0.0.1:{port}/admin#"),
        format!("http://127.0.0.1:{port}/admin#x"),
        format!("http://127.0.0.1:{port}/admin?"),
        format!("http://127.0.0.1:{port}/admin?#"),
        format!("http://127.0.0.1:{port}/x/../admin?x=1"),
    ] {
        let r = call(&host, "tracker.issues", json!({"base_url": url})).await;
        assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("base_url ~")), "{url}: {r:?}");
    }
    assert!(server.requests().is_empty(), "the denied path saw nothing: {:?}", server.requests());
    // Outside the subtree the call runs, and the client drops the fragment:
    // what the rule must read is what the server is asked for.
    let url = format!("http://127.0.0.1:{port}/public#/../admin");
    let r = call(&host, "tracker.issues", json!({"base_url": url})).await;
    assert!(!matches!(&r, StepResult::Blocked { .. }), "{r:?}");
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(requests[0].line.starts_with("GET /public "), "{}", requests[0].line);
}

/// Invariant 3 for embedders: `GateOutcome::decide` is the only public way
/// to an `AllowedCall`, and it takes only the snapshot's own candidate for
/// the call's Tool. A `Candidate` is `Clone` with public fields: a copy of
/// an allowed Tool's candidate with another Tool's component put in, or an
/// allowed Tool's candidate given for another Tool's call, is blocked.
/// Before, either became an `AllowedCall` the executor ran.
#[tokio::test]
async fn only_the_snapshots_own_candidate_becomes_an_allowed_call() {
    use toolgate::policy::gate::{GateOutcome, ToolCall};
    let host = text_and_notes("");
    let snapshot = host.runtime.snapshot().clone();
    let upper = snapshot.candidate("text.upper", &|_| None).unwrap();
    let notes = snapshot.candidate("notes", &|_| None).unwrap();
    let call = |tool: &str| ToolCall { call_id: "c-1".into(), tool_id: tool.into(), arguments: json!({"text": "x"}) };
    let upper_call = call("text.upper");
    assert!(matches!(GateOutcome::decide(&snapshot, &upper, &upper_call), GateOutcome::Execute(_)));
    // A copy with another component in it.
    let mut forged = (*upper).clone();
    forged.installed = notes.installed.clone();
    assert!(matches!(GateOutcome::decide(&snapshot, &forged, &upper_call), GateOutcome::Blocked { .. }));
    // A copy holding more authority than was granted: an `env` grant, an
    // outbound host, a credential, the watched secrets taken away.
    let widened: [fn(&mut toolgate::snapshot::Candidate); 4] = [
        |c| c.grant.env.push(("HOME".into(), "/root".into())),
        |c| {
            c.grant.hosts = std::sync::Arc::from(vec![
                toolgate::authority::destination::Destination::parse("https://evil.example:443", false).unwrap(),
            ])
        },
        |c| c.grant.credentials = c.grant.watched.clone(),
        |c| c.grant.watched = std::sync::Arc::from(Vec::new()),
    ];
    for widen in widened {
        let mut forged = (*upper).clone();
        widen(&mut forged);
        assert!(matches!(GateOutcome::decide(&snapshot, &forged, &upper_call), GateOutcome::Blocked { .. }));
    }
    // The allowed Tool's candidate for another Tool's call.
    let notes_call = call("notes");
    assert!(matches!(GateOutcome::decide(&snapshot, &upper, &notes_call), GateOutcome::Blocked { .. }));
}

/// An executor error (here the component changed on disk before its first
/// call) journals as its result what the model may read — what happened and
/// that the operator must act — never the host's paths; the whole text, with
/// the path, is in the step's host records for the operator (invariant 14).
/// Before, the result held the plugin's absolute path, and an approved
/// call's identical retry handed it to the model.
#[tokio::test]
async fn an_executor_error_reaches_the_model_without_the_hosts_paths() {
    let host = text_and_notes("");
    let plugins = host.dir.path().join("plugins");
    std::fs::write(plugins.join("text.wasm"), packed(guests::NOTES)).unwrap();
    let run = host.runtime.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let err = run.call("text.upper", json!({"text": "x"})).await.unwrap_err();
    assert!(err.to_string().contains("changed on disk"), "{err}");
    let CallError::Executor(e) = &err else { panic!("{err:?}") };
    let told = e.model_text("text.upper");
    assert!(told.contains("`text.upper` could not be run") && !told.contains("plugins"), "{told}");
    let last = steps(&host).await.pop().unwrap();
    assert_eq!(last.outcome, OutcomeKind::ExecutorError);
    assert_eq!(last.result, told, "the journal's result is the model's text");
    let root = host.dir.path().to_string_lossy().into_owned();
    assert!(!last.result.contains(&root), "{}", last.result);
    assert!(last.captured.contains("changed on disk") && last.captured.contains("text.wasm"), "{}", last.captured);
}
