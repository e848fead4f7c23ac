//! Descriptors from metadata (invariants 3, 5, 6) and availability (invariant 2):
//! every bad file is refused with a reason naming the fix; the rest still load.

use serde_json::json;
use toolgate::StepResult;
use toolgate::catalog::descriptor::{DescriptorError, embed_metadata, read_metadata};
use toolgate_sdk::ComponentMetadata;
use toolgate_tests::{TestHost, guests, packed, raw};

use super::approval::wasm_encoder_custom;
use super::call;

fn metadata_of(bytes: &[u8]) -> ComponentMetadata {
    let tools = read_metadata(bytes).unwrap();
    ComponentMetadata::new(tools.iter().map(|t| t.metadata.clone()).collect())
}

#[test]
fn each_bad_file_kind_is_refused_with_its_specific_reason() {
    let good = packed(guests::TEXT);
    let mut other_wit = metadata_of(&good);
    other_wit.wit = "toolgate:plugin@1.0.0".into();
    let mut object_schema_missing = metadata_of(&good);
    object_schema_missing.tools[0].descriptor.input_schema = json!({"type": "string"});
    let mut bad_schema = metadata_of(&good);
    bad_schema.tools[0].descriptor.input_schema = json!({"type": "object", "properties": {"a": {"type": 12}}});
    let mut bad_id = metadata_of(&good);
    bad_id.tools[0].descriptor.id = "../etc".into();
    let mut dup = good.clone();
    wasm_encoder_custom(&mut dup, "toolgate-metadata", b"{}");
    let mut not_json = raw(guests::TEXT);
    wasm_encoder_custom(&mut not_json, "toolgate-metadata", b"not json");

    let cases: Vec<(&str, Vec<u8>, fn(&DescriptorError) -> bool)> = vec![
        ("zero-byte", vec![], |e| matches!(e, DescriptorError::NotWasm)),
        ("random", b"\x7fELF and then some random bytes".to_vec(), |e| matches!(e, DescriptorError::NotWasm)),
        ("core module", b"\0asm\x01\0\0\0".to_vec(), |e| matches!(e, DescriptorError::CoreModule)),
        ("truncated", good[..good.len() / 2].to_vec(), |e| matches!(e, DescriptorError::Malformed(_))),
        ("unpacked", raw(guests::TEXT), |e| matches!(e, DescriptorError::MissingMetadata)),
        ("duplicated section", dup, |e| matches!(e, DescriptorError::DuplicateMetadata(2))),
        ("not JSON", not_json, |e| matches!(e, DescriptorError::BadMetadata(_))),
        ("other WIT major", embed_metadata(&good, &other_wit).unwrap(), |e| {
            matches!(e, DescriptorError::IncompatibleWit { .. })
        }),
        (
            "non-object schema",
            embed_metadata(&good, &object_schema_missing).unwrap(),
            |e| matches!(e, DescriptorError::BadTool { problem, .. } if problem.contains("type: object")),
        ),
        (
            "invalid schema",
            embed_metadata(&good, &bad_schema).unwrap(),
            |e| matches!(e, DescriptorError::BadTool { problem, .. } if problem.contains("input schema")),
        ),
        (
            "invalid id",
            embed_metadata(&good, &bad_id).unwrap(),
            |e| matches!(e, DescriptorError::BadTool { id, .. } if id == "../etc"),
        ),
    ];
    for (name, bytes, expected) in &cases {
        let err = read_metadata(bytes).expect_err(name);
        assert!(expected(&err), "{name}: unexpected error {err:?}");
    }

    // In a directory: each refused with the file named; the good one still loads.
    let mut files: Vec<(String, Vec<u8>)> =
        cases.iter().map(|(n, b, _)| (format!("{}.wasm", n.replace(' ', "_")), b.clone())).collect();
    files.push(("good.wasm".into(), good));
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let host = TestHost::new("[agents.default]\nvisible = [\"*\"]\n", &refs);
    let catalog = host.runtime.snapshot().catalog();
    assert_eq!(catalog.refused().len(), cases.len());
    for r in catalog.refused() {
        assert!(!r.reason.is_empty(), "{}", r.path.display());
    }
    assert_eq!(host.runtime.list().len(), 3, "the good component's three tools still load");
}

#[test]
fn refusal_messages_say_what_to_do() {
    let e = read_metadata(&raw(guests::TEXT)).unwrap_err().to_string();
    assert!(e.contains("toolgate pack"), "{e}");
    let e = read_metadata(b"\0asm\x01\0\0\0").unwrap_err().to_string();
    assert!(e.contains("wasm32-wasip2"), "{e}");
}

#[test]
fn descriptors_are_read_without_running_anything_and_match_the_typed_source() {
    // The metadata equals what ToolDescriptor::for_tool derives from the types.
    let tools = read_metadata(&packed(guests::TEXT)).unwrap();
    let upper = tools.iter().find(|t| t.id() == "text.upper").unwrap();
    let d = &upper.metadata.descriptor;
    assert_eq!(d.input_schema["type"], "object");
    assert_eq!(d.input_schema["required"], json!(["text"]));
    assert_eq!(d.input_schema["additionalProperties"], json!(false));
    assert_eq!(d.primary_argument.as_deref(), Some("text"));
    // Identity and schema only: the serialized descriptor has exactly these keys.
    let v = serde_json::to_value(d).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["annotations", "description", "id", "input_schema", "output_schema", "primary_argument"]);
}

#[tokio::test]
async fn two_components_claiming_one_id_make_it_ambiguous_and_both_are_refused() {
    let text = packed(guests::TEXT);
    let mut rebuilt = text.clone();
    wasm_encoder_custom(&mut rebuilt, "rebuilt", b"1");
    let host = TestHost::new(
        "[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
        &[("a.wasm", text), ("b.wasm", rebuilt), ("notes.wasm", packed(guests::NOTES))],
    );
    let listed: Vec<String> = host.runtime.list().into_iter().map(|d| d.id).collect();
    assert_eq!(listed, ["notes"], "no first-wins: neither claimant's tools are listed");
    let all = host.runtime.snapshot().list_all(&|_| None);
    let upper = all.iter().find(|l| l.id == "text.upper").unwrap();
    assert_eq!(upper.files.len(), 2);
    assert!(matches!(upper.removed, Some(toolgate::snapshot::Removal::Ambiguous(_))));
    let r = call(&host, "text.upper", json!({"text": "x"})).await;
    assert!(
        matches!(&r, StepResult::Blocked { reason, .. } if reason.contains("ambiguous") && reason.contains("2 components")),
        "{r:?}"
    );
    // The model reads no host path (`list --all` names the files).
    let StepResult::Blocked { reason, .. } = &r else { unreachable!() };
    assert!(!reason.contains(&*host.dir.path().to_string_lossy()) && !reason.contains("a.wasm"), "{reason}");
    assert_eq!(host.instantiations(), 0);
}

/// A primary-argument glob on a Tool that declares no primary argument
/// (`notes(op=clear)`, meant as `op = "clear"`) can never match: a deny
/// written that way does nothing. Building the agent's snapshot, where the
/// descriptors are known, refuses it, naming the rule and what to write.
#[test]
fn a_rule_that_can_never_match_its_tool_is_refused_when_the_snapshot_is_built() {
    let build = |rule: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        std::fs::write(dir.path().join("plugins/notes.wasm"), packed(guests::NOTES)).unwrap();
        let config = format!(
            "{}[agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\nrules = [{{ pattern = '{rule}', behavior = \"deny\" }}]\n",
            toolgate_tests::Lang::Rust.preamble()
        );
        std::fs::write(dir.path().join("toolgate.toml"), config).unwrap();
        let config = toolgate::config::Config::load(&dir.path().join("toolgate.toml")).unwrap();
        let catalog = std::sync::Arc::new(toolgate::host::catalog(&config).unwrap());
        toolgate::ExecutableAgentSnapshot::build(&config, "default", catalog).map(|_| ())
    };
    let e = build("notes(op=clear)").unwrap_err().to_string();
    assert!(
        e.contains("agents.default.rules")
            && e.contains("rule 0 \"notes(op=clear)\"")
            && e.contains("write `notes(op = \"clear\")`"),
        "{e}"
    );
    assert!(build(r#"notes(op = "clear")"#).is_ok());
    // An id glob may cover Tools with a primary argument: not refused.
    assert!(build("note*(op=clear)").is_ok());
}
