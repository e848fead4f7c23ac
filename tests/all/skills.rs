//! Invariant 9: a Skill is packed into a component and takes the one path —
//! listed, gated, executed like any Tool; its allowed-tools only narrow.

use std::path::Path;

use serde_json::json;
use toolgate::StepResult;
use toolgate::sandbox::executor::Content;
use toolgate_tests::{TestHost, guests, packed};

fn skill_component() -> Vec<u8> {
    skill_component_allowing(None)
}

/// The example Skill, its allowed-tools replaced by `allowed` when given
/// (`Some(None)`: no allowed-tools at all, so it narrows nothing).
fn skill_component_allowing(allowed: Option<Option<Vec<String>>>) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../example-tools/skills/release-notes");
    let mut skill = toolgate_author::skill::read(&dir).unwrap();
    if let Some(allowed) = allowed {
        skill.allowed_tools = allowed;
    }
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(toolgate_author::skill::pack(&skill)).unwrap().0
    })
    .join()
    .unwrap()
}

/// The Skill beside a tool it allows (`text.*`) and one it does not (`hostile.*`).
fn with_text_and_hostile() -> [(&'static str, Vec<u8>); 3] {
    [
        ("release-notes.wasm", skill_component()),
        ("text.wasm", packed(guests::TEXT)),
        ("hostile.wasm", packed(guests::HOSTILE)),
    ]
}

fn text(r: &StepResult) -> String {
    match r {
        StepResult::Output { content: Content::Json(serde_json::Value::String(s)), .. } => s.clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_skill_packs_lists_activates_and_narrows_a_later_call() {
    let host = TestHost::new(
        r#"
[agents.default]
visible = ["*"]
default = "allow"
rules = [{ pattern = "text.repeat", behavior = "deny" }]
"#,
        &with_text_and_hostile(),
    );
    // Listed with name and description only: the instructions are not in the listing.
    let d = host.runtime.list().into_iter().find(|d| d.id == "skill.release-notes").unwrap();
    assert!(d.description.starts_with("Write release notes"));
    let listing = serde_json::to_string(&d).unwrap();
    assert!(!listing.contains("Group the items"), "{listing}");

    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    // Before activation the agent's own policy applies.
    assert!(matches!(run.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));

    // Activate: the instructions, with the resources named.
    let r = run.call("skill.release-notes", json!({})).await.unwrap();
    let instructions = text(&r);
    assert!(instructions.contains("Group the items") && instructions.contains("references/style.md"), "{instructions}");
    let r = run.call("skill.release-notes", json!({"resource": "references/style.md"})).await.unwrap();
    assert!(text(&r).contains("House style"));
    let r = run.call("skill.release-notes", json!({"resource": "../SKILL.md"})).await.unwrap();
    assert!(matches!(&r, StepResult::ToolError { message, .. } if message.contains("no resource")), "{r:?}");

    // Now the run is narrowed to allowed-tools (notes, text.*).
    let r = run.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(
        matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("allowed-tools of skill `skill.release-notes`")),
        "{r:?}"
    );
    assert!(matches!(run.call("text.count", json!({"text": "a"})).await.unwrap(), StepResult::Output { .. }));
    // …and never widened: text.* does not override the agent's deny.
    let r = run.call("text.repeat", json!({"text": "a", "times": 1})).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("rule `text.repeat`")), "{r:?}");
    // Another run is not narrowed.
    let other = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    assert!(matches!(other.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));

    // A host restarted on the same journal (`toolgate call --run ID` in another process)
    // re-derives the activation from the journal: the run stays narrowed.
    let run_id = run.id().to_owned();
    let other_id = other.id().to_owned();
    drop((run, other));
    let host = host.restart();
    let resumed = host.runtime.start_run(Some(run_id), toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let r = resumed.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("allowed-tools")), "{r:?}");
    assert!(matches!(resumed.call("text.count", json!({"text": "a"})).await.unwrap(), StepResult::Output { .. }));
    let other = host.runtime.start_run(Some(other_id), toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    assert!(matches!(other.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));
}

/// The `pinned` import hands each component its own pinned section: two
/// Skills on one host (the same adapter code, different data) each serve
/// their own instructions, and a component without pinned data reads none.
#[tokio::test]
async fn each_component_reads_only_its_own_pinned_data() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../example-tools/skills/release-notes");
    let mut other = toolgate_author::skill::read(&dir).unwrap();
    other.name = "other-notes".into();
    other.instructions = "Only the other Skill says this.".into();
    other.resources.clear();
    let other = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(toolgate_author::skill::pack(&other)).unwrap().0
    })
    .join()
    .unwrap();
    let host = TestHost::new(
        "[agents.default]\nvisible = [\"skill.*\"]\ndefault = \"allow\"\n",
        &[("release-notes.wasm", skill_component()), ("other.wasm", other)],
    );
    let mine = text(&super::call(&host, "skill.release-notes", json!({})).await);
    let theirs = text(&super::call(&host, "skill.other-notes", json!({})).await);
    assert!(mine.contains("Group the items") && !mine.contains("Only the other Skill"), "{mine}");
    assert_eq!(theirs, "Only the other Skill says this.");
    let plain = toolgate::catalog::descriptor::read_pinned(&packed(guests::TEXT)).unwrap();
    assert!(plain.is_empty(), "a component without pinned data reads none");
}

/// A Skill's narrowing belongs to its run, whatever path committed the
/// Skill's output: an approval (in the conversation, or out of band and
/// collected by the identical retry) and another `Run` of the same run (a
/// server session's requests each hold one, with the view they began on)
/// all narrow every later call of the run. Before, only the `Run` whose own
/// call ran the Skill was narrowed.
#[tokio::test]
async fn a_skill_narrows_its_run_whichever_path_committed_its_output() {
    let host = TestHost::new(
        r#"
[agents.default]
visible = ["*"]
default = "allow"
rules = [{ pattern = "skill.*", behavior = "ask" }]
"#,
        &with_text_and_hostile(),
    );
    let narrowed = |r: &StepResult| matches!(r, StepResult::Blocked { reason, .. } if reason.contains("allowed-tools of skill `skill.release-notes`"));
    let ticket = |r: StepResult| match r {
        StepResult::Awaiting { ticket, .. } => ticket,
        other => panic!("expected an ask: {other:?}"),
    };
    let rt = &host.runtime;
    let configured = toolgate::ToolCapabilityNarrowing::Configured;

    // 1. Approved in the conversation (MCP elicitation, an embedder's dialog):
    // the result goes to the approver's caller, not through the run.
    let run = rt.start_run(None, configured).await.unwrap();
    let before = run.snapshot();
    let t = ticket(run.call("skill.release-notes", json!({})).await.unwrap());
    let shown = rt.store().awaiting(&t).await.unwrap().unwrap().call_digest();
    let approved = rt.approve(&t, &toolgate::Approval::by_embedder("dialog", shown)).await.unwrap();
    assert!(text(&approved).contains("Group the items"));
    let r = run.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(narrowed(&r), "the run that asked: {r:?}");
    // A server session continues the run with the view it kept from before the approval.
    let session = rt.continue_run(run.id(), before);
    let r = session.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(narrowed(&r), "a Run continued on an older view: {r:?}");
    assert!(matches!(session.call("text.count", json!({"text": "a"})).await.unwrap(), StepResult::Output { .. }));

    // 2. Approved out of band (`toolgate approve`): the retry collects the result.
    let run = rt.start_run(None, configured).await.unwrap();
    let t = ticket(run.call("skill.release-notes", json!({})).await.unwrap());
    let shown = rt.store().awaiting(&t).await.unwrap().unwrap().call_digest();
    let left = rt.approve(&t, &toolgate::Approval::on_terminal("operator", shown)).await.unwrap();
    assert!(text(&left).contains("Group the items"));
    let collected = run.call("skill.release-notes", json!({})).await.unwrap();
    assert!(text(&collected).contains("Group the items"), "{collected:?}");
    let r = run.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(narrowed(&r), "after the retry collected the Skill's output: {r:?}");

    // 3. Two `Run`s of one run (two requests of a session): one runs the
    // Skill, the other — begun before — is narrowed too.
    let allow = TestHost::new("[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n", &with_text_and_hostile());
    let rt = &allow.runtime;
    let first = rt.start_run(None, configured).await.unwrap();
    let second = rt.continue_run(first.id(), first.snapshot());
    assert!(matches!(second.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));
    assert!(text(&first.call("skill.release-notes", json!({})).await.unwrap()).contains("Group the items"));
    let r = second.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(narrowed(&r), "the other Run of the run: {r:?}");
    // Another run is not narrowed.
    let other = rt.start_run(None, configured).await.unwrap();
    assert!(matches!(other.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));
}

/// A Skill approved in another process (`toolgate approve` in a shell, or
/// another host on a shared journal) narrows the run from the commit of its
/// output — before the agent's retry collects it here, as an approval in
/// this process does. Fails on the previous code (the run's next call of a
/// Tool outside the Skill's allowed-tools ran: only approvals in this
/// process were seen).
#[tokio::test]
async fn a_skill_approved_in_another_process_narrows_the_run_at_once() {
    let host = TestHost::new(
        r#"
[agents.default]
visible = ["*"]
default = "allow"
rules = [{ pattern = "skill.*", behavior = "ask" }]
"#,
        &with_text_and_hostile(),
    );
    let narrowed = |r: &StepResult| matches!(r, StepResult::Blocked { reason, .. } if reason.contains("allowed-tools of skill `skill.release-notes`"));
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let StepResult::Awaiting { ticket, .. } = run.call("skill.release-notes", json!({})).await.unwrap() else {
        panic!("the Skill asks")
    };
    // Still pending: nothing narrows yet.
    assert!(matches!(run.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));

    let elsewhere = toolgate_tests::runtime_for(&host.config, "default");
    let shown = elsewhere.store().awaiting(&ticket).await.unwrap().unwrap().call_digest();
    let approved = elsewhere.approve(&ticket, &toolgate::Approval::on_terminal("operator", shown)).await.unwrap();
    assert!(text(&approved).contains("Group the items"));

    let r = run.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(narrowed(&r), "the run, before its retry collected the Skill's output: {r:?}");
    // A server session's other `Run` of the run, on the view it kept.
    let session = host.runtime.continue_run(run.id(), run.snapshot());
    assert!(narrowed(&session.call("hostile.big", json!({"bytes": 1})).await.unwrap()));
    assert!(matches!(run.call("text.count", json!({"text": "a"})).await.unwrap(), StepResult::Output { .. }));
    // Another run is not narrowed.
    let other = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    assert!(matches!(other.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));
}

/// A run that activated a Skill stays narrowed when another plugin later
/// claims the Skill's id (it is ambiguous, so neither claimant's
/// allowed-tools can be trusted as the Skill's): narrowed to nothing rather
/// than widened. Before, an ambiguous id dropped out of the Skills a run is
/// rebuilt with, and the run could call everything again.
#[tokio::test]
async fn a_run_stays_narrowed_when_its_skill_becomes_ambiguous() {
    let host = TestHost::new("[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n", &with_text_and_hostile());
    let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    text(&run.call("skill.release-notes", json!({})).await.unwrap());
    let r = run.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(matches!(&r, StepResult::Blocked { .. }), "narrowed: {r:?}");
    let run_id = run.id().to_owned();
    drop(run);
    // Another plugin claims `skill.release-notes` (the same Skill, another file).
    let copy = toolgate::catalog::descriptor::embed_section(&skill_component(), "test-copy", b"2").unwrap();
    std::fs::write(host.plugins().join("release-notes-copy.wasm"), copy).unwrap();
    let host = host.restart();
    let resumed = host.runtime.start_run(Some(run_id), toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    for (tool, args) in [("hostile.big", json!({"bytes": 1})), ("text.count", json!({"text": "a"}))] {
        let r = resumed.call(tool, args).await.unwrap();
        assert!(
            matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("allowed-tools of skill `skill.release-notes`")),
            "{tool}: {r:?}"
        );
    }
    // A run that never activated it is not narrowed.
    let fresh = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    assert!(matches!(fresh.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));
}

/// A run stays narrowed to what its Skill allowed when activated, whatever
/// the catalog holds later: the Skill replaced by a broader version
/// (allowed-tools `*`), by one without allowed-tools, or removed (an
/// uninstall, a file refused at a reload — a half-copied upgrade, a stale
/// lock). The allowed-tools are journaled with the activation; the catalog's
/// list, while it holds the Skill, only narrows further. Before, a run was
/// narrowed by the catalog's list only: each of these widened it to the
/// agent's rules alone.
#[tokio::test]
async fn a_run_stays_narrowed_to_what_its_skill_allowed_when_activated() {
    let replacements: [(&str, Option<Vec<u8>>); 3] = [
        ("broader", Some(skill_component_allowing(Some(Some(vec!["*".into()]))))),
        ("without allowed-tools", Some(skill_component_allowing(Some(None)))),
        ("removed", None),
    ];
    for (what, replacement) in replacements {
        let host =
            TestHost::new("[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n", &with_text_and_hostile());
        let run = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
        text(&run.call("skill.release-notes", json!({})).await.unwrap());
        let run_id = run.id().to_owned();
        drop(run);
        match &replacement {
            Some(bytes) => std::fs::write(host.plugins().join("release-notes.wasm"), bytes).unwrap(),
            None => std::fs::remove_file(host.plugins().join("release-notes.wasm")).unwrap(),
        }
        let host = host.restart();
        let resumed =
            host.runtime.start_run(Some(run_id), toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
        let r = resumed.call("hostile.big", json!({"bytes": 1})).await.unwrap();
        assert!(
            matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("allowed-tools of skill `skill.release-notes`")),
            "{what}: {r:?}"
        );
        let r = resumed.call("text.count", json!({"text": "a"})).await.unwrap();
        assert!(matches!(r, StepResult::Output { .. }), "{what}: still allowed: {r:?}");
        // A run that never activated it is not narrowed.
        let fresh = host.runtime.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
        let r = fresh.call("hostile.big", json!({"bytes": 1})).await.unwrap();
        assert!(matches!(r, StepResult::Output { .. }), "{what}: {r:?}");
    }
}

/// A run's view held across a reload (a server session's) takes every list
/// the journal holds for a Skill, also one activated on the older catalog:
/// the Skill (v1: `notes text.*`) is asked on generation G, replaced by a
/// broader v2 (`*`) and reloaded, activated in the same run on G+1 (the
/// view holds v2's list), then the human approves the ask on G — v1's
/// output journals v1's list, and the run's next call on G+1 is held to it.
/// Before, the view skipped a Skill it already held, whatever its list.
#[tokio::test]
async fn a_view_held_across_a_reload_takes_a_list_approved_on_the_older_catalog() {
    let host = TestHost::new(
        r#"
[agents.default]
visible = ["*"]
default = "allow"
rules = [{ pattern = "skill.release-notes(resource = \"references/style.md\")", behavior = "ask" }]
"#,
        &with_text_and_hostile(),
    );
    let old = &host.runtime;
    // v1 compiled on G (another run), as a server that served it has.
    let other = old.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    text(&other.call("skill.release-notes", json!({})).await.unwrap());
    let run = old.start_run(None, toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    let asked = run.call("skill.release-notes", json!({"resource": "references/style.md"})).await.unwrap();
    let StepResult::Awaiting { ticket, .. } = asked else { panic!("{asked:?}") };
    let run_id = run.id().to_owned();
    drop(run);
    // Generation G+1: the Skill replaced by a broader version.
    std::fs::write(host.plugins().join("release-notes.wasm"), skill_component_allowing(Some(Some(vec!["*".into()]))))
        .unwrap();
    let catalog = std::sync::Arc::new(toolgate::host::catalog(&host.config).unwrap());
    let snapshot = toolgate::ExecutableAgentSnapshot::build(&host.config, "default", catalog).unwrap();
    let new = old.with_snapshot(snapshot);
    let run = new.start_run(Some(run_id), toolgate::ToolCapabilityNarrowing::Configured).await.unwrap();
    text(&run.call("skill.release-notes", json!({})).await.unwrap());
    assert!(matches!(run.call("hostile.big", json!({"bytes": 1})).await.unwrap(), StepResult::Output { .. }));
    // The human approves the ask made on G: v1 runs there and journals its list.
    let shown = old.store().awaiting(&ticket).await.unwrap().unwrap().call_digest();
    let approved = old.approve(&ticket, &toolgate::Approval::by_embedder("test-approver", shown)).await.unwrap();
    assert!(matches!(approved, StepResult::Output { .. }), "{approved:?}");
    // The same view on G+1 now holds v1's list too.
    let r = run.call("hostile.big", json!({"bytes": 1})).await.unwrap();
    assert!(
        matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("allowed-tools of skill `skill.release-notes`")),
        "{r:?}"
    );
}
