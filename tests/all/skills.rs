//! Invariant 9: a Skill is packed into a component and takes the one path —
//! listed, gated, executed like any Tool; its allowed-tools only narrow.

use std::path::Path;

use serde_json::json;
use toolgate::StepResult;
use toolgate::sandbox::executor::Content;
use toolgate_tests::{TestHost, guests, packed};

fn skill_component() -> Vec<u8> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../example-tools/skills/release-notes");
    let skill = toolgate_author::skill::read(&dir).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(toolgate_author::skill::pack(&skill)).unwrap().0
    })
    .join()
    .unwrap()
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
        &[
            ("release-notes.wasm", skill_component()),
            ("text.wasm", packed(guests::TEXT)),
            ("hostile.wasm", packed(guests::HOSTILE)),
        ],
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
