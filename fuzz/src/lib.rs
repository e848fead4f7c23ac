//! The checks behind toolgate's fuzz targets, as a plain library.
//!
//! Each `fuzz_targets/*.rs` binary calls one function here; the stable regression
//! test (`tests/regressions.rs`) replays every seed and every saved finding through
//! the same functions. A function parses or evaluates its input with toolgate's
//! public API and asserts what must always hold; a panic (an assertion or a bug in
//! toolgate) is a finding. The return value says whether the input was accepted, so
//! the regression test can check that the `ok-*` seeds still reach the deep code.
//!
//! No libFuzzer here: the library builds on stable Rust.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use toolgate::config::ConfigError;
use toolgate::catalog::descriptor::{self, CheckedTool, DescriptorError};
use toolgate::policy::{Behavior, Decision, Policy, PolicyError, RuleSpec};
use toolgate_sdk::metadata::{ComponentMetadata, ToolMetadata};

pub mod seeds;

/// A target: its name (the directory under `corpus/` and `regressions/`) and check.
pub type Target = (&'static str, fn(&[u8]) -> bool);

/// Every fuzz target, by name.
pub const TARGETS: &[Target] =
    &[("metadata", metadata), ("policy", policy), ("config", config), ("arguments", arguments)];

// ---------------------------------------------------------------------------------
// metadata
// ---------------------------------------------------------------------------------

/// `descriptor::read_metadata` on arbitrary bytes.
///
/// Holds: no panic; an error is a `DescriptorError` with a message (non-wasm input
/// is `NotWasm`); `embed_metadata` never panics; an accepted component has 1 to 256
/// tools with valid, distinct ids, and re-embedding its tools then reading again
/// gives the same tools (and embedding the same document again is idempotent).
pub fn metadata(data: &[u8]) -> bool {
    let read = descriptor::read_metadata(data);
    let _ = descriptor::embed_metadata(data, &ComponentMetadata::new(vec![]));
    let tools = match read {
        Err(e) => {
            assert!(!e.to_string().is_empty(), "empty message for {e:?}");
            if data.len() < 8 || !data.starts_with(b"\0asm") {
                assert_eq!(e, DescriptorError::NotWasm);
            }
            return false;
        }
        Ok(tools) => tools,
    };
    assert!(!tools.is_empty() && tools.len() <= descriptor::MAX_TOOLS_PER_COMPONENT, "{} tools", tools.len());
    let mut ids = BTreeSet::new();
    for t in &tools {
        assert!(descriptor::check_id(t.id()).is_ok(), "accepted invalid id {:?}", t.id());
        assert!(ids.insert(t.id()), "accepted duplicate id {:?}", t.id());
    }
    let doc = ComponentMetadata::new(metadata_of(&tools));
    let packed = match descriptor::embed_metadata(data, &doc) {
        Ok(packed) => packed,
        // Re-serializing may add defaulted fields; only size may refuse it.
        Err(DescriptorError::MetadataTooLarge(_)) => return true,
        Err(e) => panic!("a component that reads cannot be re-embedded: {e:?}"),
    };
    let again = descriptor::read_metadata(&packed).unwrap_or_else(|e| panic!("re-embedded component refused: {e:?}"));
    assert_eq!(metadata_of(&again), doc.tools, "re-embedding changed the tools");
    let twice = descriptor::embed_metadata(&packed, &doc).unwrap_or_else(|e| panic!("second embed failed: {e:?}"));
    assert_eq!(twice, packed, "embedding the same document twice is not idempotent");
    true
}

fn metadata_of(tools: &[Arc<CheckedTool>]) -> Vec<ToolMetadata> {
    tools.iter().map(|t| t.metadata.clone()).collect()
}

// ---------------------------------------------------------------------------------
// policy
// ---------------------------------------------------------------------------------

/// Most rules read from one input (each is also evaluated alone).
pub const MAX_RULES: usize = 12;

/// The default behavior of fuzzed policies.
pub const POLICY_DEFAULT: Behavior = Behavior::Ask;

/// A policy input, split from text (lossy UTF-8):
///
/// ```text
/// allow fs.read(data/**)          one rule per line: `allow|ask|deny PATTERN`,
/// deny fs.write(path ~ "x/**")    a line without such a prefix is a deny rule
///                                 an empty line ends the rules
/// fs.read                         the call: tool id,
/// path                            primary argument name (empty line: none),
/// {"path": "data/a"}              arguments as JSON (not JSON: the text as a string)
/// ```
#[derive(Debug, Clone)]
pub struct PolicyInput {
    /// The rules, at most [`MAX_RULES`].
    pub rules: Vec<RuleSpec>,
    /// The called tool id.
    pub tool: String,
    /// The tool's primary argument, if any.
    pub primary: Option<String>,
    /// The call's arguments.
    pub arguments: Value,
}

impl PolicyInput {
    /// Split `data` as described on [`PolicyInput`].
    pub fn parse(data: &[u8]) -> PolicyInput {
        let text = String::from_utf8_lossy(data);
        let (rules_text, call) = text.split_once("\n\n").unwrap_or((&text, ""));
        let rules = rules_text
            .lines()
            .take(MAX_RULES)
            .map(|line| {
                let (behavior, pattern) = match line.split_once(' ') {
                    Some(("allow", p)) => (Behavior::Allow, p),
                    Some(("ask", p)) => (Behavior::Ask, p),
                    Some(("deny", p)) => (Behavior::Deny, p),
                    _ => (Behavior::Deny, line),
                };
                RuleSpec { pattern: pattern.to_owned(), behavior }
            })
            .collect();
        let mut parts = call.splitn(3, '\n');
        let tool = parts.next().unwrap_or_default().to_owned();
        let primary = parts.next().filter(|p| !p.is_empty()).map(str::to_owned);
        let args = parts.next().unwrap_or_default();
        let arguments = serde_json::from_str(args).unwrap_or_else(|_| Value::String(args.to_owned()));
        PolicyInput { rules, tool, primary, arguments }
    }
}

/// `Policy::new` and `Policy::evaluate` on fuzzed rules and a fuzzed call.
///
/// Holds: no panic; a parse error is an `Err` naming a rule that exists, by index
/// and pattern, and that rule alone is refused too; evaluation is deterministic
/// (twice, and on an independently built policy); the decision agrees with each
/// rule evaluated alone: a matching deny rule decides (the first in config order),
/// no matching rule leaves the default with no rule, otherwise the deciding rule is
/// one that matches alone with its own behavior.
pub fn policy(data: &[u8]) -> bool {
    let input = PolicyInput::parse(data);
    let PolicyInput { rules, tool, primary, arguments } = &input;
    let primary = primary.as_deref();
    let policy = match Policy::new(rules, POLICY_DEFAULT) {
        Ok(p) => p,
        Err(e) => {
            check_policy_error(rules, &e);
            return false;
        }
    };
    let decision = policy.evaluate(tool, primary, arguments);
    assert_eq!(policy.evaluate(tool, primary, arguments), decision, "evaluate is not deterministic");
    let rebuilt = Policy::new(rules, POLICY_DEFAULT).expect("the same rules parsed once");
    assert_eq!(rebuilt.evaluate(tool, primary, arguments), decision, "a rebuilt policy decides differently");

    // Each rule alone: does it match this call?
    let alone: Vec<bool> = rules
        .iter()
        .map(|r| {
            let single = Policy::new(std::slice::from_ref(r), POLICY_DEFAULT)
                .unwrap_or_else(|e| panic!("rule {:?} parses among others but not alone: {e}", r.pattern));
            let d = single.evaluate(tool, primary, arguments);
            match &d.rule {
                Some(p) => {
                    assert_eq!((p, d.behavior), (&r.pattern, r.behavior), "a single rule decided as another");
                    true
                }
                None => {
                    assert_eq!(d.behavior, POLICY_DEFAULT);
                    false
                }
            }
        })
        .collect();
    let matching = || rules.iter().zip(&alone).filter(|(_, m)| **m).map(|(r, _)| r);
    if let Some(first_deny) = matching().find(|r| r.behavior == Behavior::Deny) {
        let want = Decision { behavior: Behavior::Deny, rule: Some(first_deny.pattern.clone()) };
        assert_eq!(decision, want, "a matching deny rule does not decide");
    } else if matching().next().is_none() {
        assert_eq!(decision, Decision { behavior: POLICY_DEFAULT, rule: None }, "no rule matches alone");
    } else {
        let rule = decision.rule.as_deref().unwrap_or_else(|| panic!("rules match alone but none decided"));
        assert!(
            matching().any(|r| r.pattern == rule && r.behavior == decision.behavior),
            "decided by {rule:?} ({:?}), which does not match alone",
            decision.behavior
        );
    }
    true
}

fn check_policy_error(rules: &[RuleSpec], e: &PolicyError) {
    let (index, pattern) = match e {
        PolicyError::EmptyPattern { rule, pattern }
        | PolicyError::InvalidToolId { rule, pattern, .. }
        | PolicyError::UnclosedParenthesis { rule, pattern, .. }
        | PolicyError::TrailingText { rule, pattern, .. }
        | PolicyError::EmptyArguments { rule, pattern, .. }
        | PolicyError::InvalidGlob { rule, pattern, .. }
        | PolicyError::InvalidCondition { rule, pattern, .. }
        | PolicyError::NoPrimaryArgument { rule, pattern, .. } => (*rule, pattern),
    };
    let Some(spec) = rules.get(index) else { panic!("error names rule {index} of {}: {e}", rules.len()) };
    assert_eq!(&spec.pattern, pattern, "error names the wrong pattern: {e}");
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("rule {index} {pattern:?}: ")), "{msg}");
    let combining = matches!(e, PolicyError::InvalidGlob { reason, .. } if reason.contains("while combining"));
    if !combining {
        assert!(
            Policy::new(std::slice::from_ref(spec), POLICY_DEFAULT).is_err(),
            "rule {pattern:?} is refused among others but accepted alone: {e}"
        );
    }
}

// ---------------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------------

/// The path fuzzed configurations are parsed as.
pub const CONFIG_PATH: &str = "/fuzz/conf dir/toolgate.toml";
/// The base directory relative paths resolve against.
pub const CONFIG_BASE: &str = "/fuzz/conf dir";

/// `Config::parse` on arbitrary text (lossy UTF-8).
///
/// Holds: no panic, no IO (never a `Read` error); an error names the file, and a
/// field error a field; an accepted config has absolute paths (the store may be
/// `:memory:`), non-zero limits, grant credentials that exist, and
/// agent rules that `Policy::new` accepts; parsing is deterministic.
pub fn config(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let path = Path::new(CONFIG_PATH);
    let base = Path::new(CONFIG_BASE);
    let config = match toolgate::Config::parse(&text, path, base) {
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(CONFIG_PATH), "error does not name the file: {msg}");
            match &e {
                ConfigError::Parse { path: p, .. } => assert_eq!(p, path),
                ConfigError::Field { path: p, field, .. } => {
                    assert_eq!(p, path);
                    assert!(!field.is_empty(), "field error without a field: {msg}");
                }
                ConfigError::Unsafe { path: p, .. } => assert_eq!(p, path),
                ConfigError::Read { .. } => panic!("parse read a file: {msg}"),
            }
            return false;
        }
        Ok(c) => c,
    };
    assert_eq!(config.source.as_deref(), Some(path));
    // Only a SQLite journal is a path (`:memory:` and PostgreSQL are not).
    let store_file = config.store.file().map(|f| f.to_path_buf());
    for p in [&config.plugins, &config.cache, &config.lock].into_iter().chain(store_file.as_ref()) {
        assert!(p.is_absolute(), "relative path {p:?}");
    }
    let l = &config.limits;
    for v in [
        l.memory_mib,
        l.timeout_ms,
        l.output_kib,
        l.capture_kib,
        l.ticket_ttl_secs,
        l.http_request_kib,
        l.http_response_kib,
        l.http_timeout_ms,
        l.max_instances,
        l.max_instances_per_tool,
    ] {
        assert!(v > 0, "a zero limit was accepted: {l:?}");
    }
    for g in &config.grants {
        for d in &g.directories {
            assert!(d.host.is_absolute(), "relative grant directory {:?}", d.host);
            assert!(d.path.starts_with('/') && !d.path.split('/').any(|c| c == ".."), "guest path {:?}", d.path);
        }
        for c in &g.credentials {
            assert!(config.credentials.contains_key(c), "grant names undefined credential {c:?}");
        }
    }
    for (name, a) in &config.agents {
        if let Err(e) = Policy::new(&a.rules, a.default) {
            panic!("agent {name:?}: accepted config has rules that do not parse: {e}");
        }
    }
    let again = toolgate::Config::parse(&text, path, base).expect("the same text parsed once");
    assert_eq!(format!("{again:?}"), format!("{config:?}"), "parse is not deterministic");
    true
}

// ---------------------------------------------------------------------------------
// arguments
// ---------------------------------------------------------------------------------

/// The fixed tools argument values are validated against: real SDK-derived schemas
/// of the example Tools and one schema using most keywords.
pub fn fixed_tools() -> &'static [Arc<CheckedTool>] {
    static TOOLS: OnceLock<Vec<Arc<CheckedTool>>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let doc: ComponentMetadata = serde_json::from_value(fixed_document()).expect("fixed document");
        descriptor::check_document(doc).expect("fixed tools pass the checks")
    })
}

/// The metadata document of [`fixed_tools`].
pub fn fixed_document() -> Value {
    let draft = "https://json-schema.org/draft/2020-12/schema";
    let tool = |id: &str, schema: Value, primary: Option<&str>| json!({"descriptor": {"id": id, "description": format!("Fixed tool {id}."), "input_schema": schema, "primary_argument": primary}});
    json!({
        "format": toolgate_sdk::metadata::METADATA_FORMAT,
        "wit": format!("{}@{}", toolgate_sdk::metadata::WIT_PACKAGE, toolgate_sdk::metadata::WIT_VERSION),
        "sdk": "0.1.0",
        "tools": [
            tool("text.repeat", json!({
                "$schema": draft, "additionalProperties": false, "title": "RepeatArgs", "type": "object",
                "properties": {
                    "separator": {"default": null, "type": ["string", "null"]},
                    "text": {"type": "string"},
                    "times": {"format": "uint32", "maximum": 100, "minimum": 1, "type": "integer"}
                },
                "required": ["text", "times"]
            }), Some("text")),
            tool("notes", json!({
                "$schema": draft, "additionalProperties": false, "title": "NotesArgs", "type": "object",
                "$defs": {"Op": {"oneOf": [
                    {"const": "add", "type": "string"},
                    {"const": "list", "type": "string"},
                    {"const": "clear", "type": "string"}
                ]}},
                "properties": {"note": {"default": null, "type": ["string", "null"]}, "op": {"$ref": "#/$defs/Op"}},
                "required": ["op"]
            }), None),
            tool("files.search", json!({
                "$schema": draft, "additionalProperties": false, "title": "SearchArgs", "type": "object",
                "properties": {"dir": {"default": null, "type": ["string", "null"]}, "query": {"type": "string"}},
                "required": ["query"]
            }), Some("query")),
            tool("kitchen.sink", json!({
                "$schema": draft, "type": "object",
                "$defs": {
                    "node": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 8}},
                        "required": ["name"], "unevaluatedProperties": false}
                },
                "properties": {
                    "path": {"type": "string", "pattern": "^[a-z0-9_./-]{1,64}$", "maxLength": 64},
                    "mode": {"enum": ["append", "truncate", null, 1, 2.5]},
                    "count": {"type": "integer", "minimum": -10, "exclusiveMaximum": 1000, "multipleOf": 3},
                    "ratio": {"type": "number", "multipleOf": 0.01, "exclusiveMinimum": 0},
                    "when": {"type": "string", "format": "date-time"},
                    "mail": {"type": "string", "format": "email"},
                    "addr": {"anyOf": [{"format": "ipv4"}, {"format": "ipv6"}], "type": "string"},
                    "url": {"type": "string", "format": "uri"},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "uniqueItems": true,
                        "contains": {"const": "x"}, "minContains": 1, "maxContains": 2},
                    "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": false},
                    "tree": {"$ref": "#/$defs/node"},
                    "env": {"type": "object", "patternProperties": {"^[A-Z_][A-Z0-9_]*$": {"type": "string"}},
                        "additionalProperties": false, "propertyNames": {"maxLength": 32}, "maxProperties": 8},
                    "flag": {"type": "boolean"},
                    "fixed": {"const": {"a": [1, {"b": null}]}},
                    "choice": {"oneOf": [{"type": "string"}, {"type": "integer", "not": {"const": 0}}]}
                },
                "required": ["path"],
                "dependentRequired": {"mode": ["count"]},
                "if": {"properties": {"flag": {"const": true}}, "required": ["flag"]},
                "then": {"required": ["tags"]},
                "else": {"not": {"required": ["tags"]}},
                "minProperties": 1
            }), Some("path"))
        ]
    })
}

/// Argument validation, `CheckedTool::validate_arguments`, on a fuzzed JSON value
/// (input that is not JSON is validated as a JSON string of its lossy text).
///
/// The value is validated against every [`fixed_tools`] schema. A value of the form
/// `[SCHEMA, ARGS]` also builds a tool with input schema `SCHEMA` (an object without
/// `type` gets `"type": "object"`) through `descriptor::check_document` and, if it is
/// accepted, validates `ARGS` against it.
///
/// Holds: no panic; validation is deterministic; a refusal names the tool
/// (`invalid arguments for `ID`: ...`). Returns whether any validation passed.
pub fn arguments(data: &[u8]) -> bool {
    let value: Value =
        serde_json::from_slice(data).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(data).into_owned()));
    let mut any_ok = false;
    for tool in fixed_tools() {
        any_ok |= validate(tool, &value);
    }
    if let Value::Array(pair) = &value
        && let [schema, args] = pair.as_slice()
    {
        let mut schema = schema.clone();
        if let Value::Object(m) = &mut schema {
            m.entry("type").or_insert_with(|| json!("object"));
        }
        let tool =
            json!({"descriptor": {"id": "fuzz.schema", "description": "A fuzzed schema.", "input_schema": schema}});
        let tool: ToolMetadata = serde_json::from_value(tool).expect("a descriptor around any schema deserializes");
        match descriptor::check_document(ComponentMetadata::new(vec![tool])) {
            Ok(tools) => {
                assert_eq!(tools.len(), 1);
                any_ok |= validate(&tools[0], args);
            }
            Err(e) => assert!(matches!(e, DescriptorError::BadTool { .. }), "unexpected refusal {e:?}"),
        }
    }
    any_ok
}

fn validate(tool: &CheckedTool, value: &Value) -> bool {
    let first = tool.validate_arguments(value);
    assert_eq!(tool.validate_arguments(value), first, "validation is not deterministic");
    match first {
        Ok(()) => true,
        Err(msg) => {
            let prefix = format!("invalid arguments for `{}`: ", tool.id());
            assert!(msg.starts_with(&prefix) && msg.len() > prefix.len(), "{msg}");
            false
        }
    }
}
