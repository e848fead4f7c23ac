//! The generated seeds of `corpus/<target>/`, written by
//! `cargo test --manifest-path fuzz/Cargo.toml -- --ignored write_seeds`.
//!
//! A seed named `ok-*` must be accepted by its target (the regression test checks
//! it, so the seeds keep reaching the code past the first checks); any other seed
//! may be refused. Seeds not generated here (a real packed component, the demo
//! configuration) are copied into the corpus by hand.

use serde_json::{Value, json};
use toolgate_sdk::metadata::{METADATA_FORMAT, METADATA_SECTION, WIT_PACKAGE, WIT_VERSION};
use wasm_encoder::{
    Component, ComponentExportKind, ComponentExportSection, CustomSection, Module, ModuleSection,
    NestedComponentSection,
};

/// The export a Tool component carries.
pub const TOOL_EXPORT: &str = "toolgate:plugin/tool@0.1.0";

/// Every generated seed: target, file name, bytes.
pub fn all() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, bytes) in metadata() {
        out.push(("metadata", name, bytes));
    }
    for (name, text) in policy() {
        out.push(("policy", name, text.into_bytes()));
    }
    for (name, text) in config() {
        out.push(("config", name, text.into_bytes()));
    }
    for (name, value) in arguments() {
        out.push(("arguments", name, serde_json::to_vec_pretty(&value).expect("json")));
    }
    out
}

fn custom(name: &str, data: &[u8]) -> CustomSection<'static> {
    CustomSection { name: name.to_owned().into(), data: data.to_vec().into() }
}

/// A component with a nested core module and a nested component (each carrying a
/// decoy metadata section that the reader must skip), optionally exporting
/// `export`, with one top-level metadata section per entry of `metadata`.
pub fn component(metadata: &[&[u8]], export: Option<&str>) -> Vec<u8> {
    let mut module = Module::new();
    module.section(&custom(METADATA_SECTION, b"decoy: not the component's metadata"));
    let mut inner = Component::new();
    inner.section(&ModuleSection(&module));
    inner.section(&custom(METADATA_SECTION, b"decoy in a nested component"));
    let mut c = Component::new();
    c.section(&ModuleSection(&module));
    c.section(&NestedComponentSection(&inner));
    if let Some(name) = export {
        let mut exports = ComponentExportSection::new();
        exports.export(name, ComponentExportKind::Module, 0, None);
        c.section(&exports);
    }
    for m in metadata {
        c.section(&custom(METADATA_SECTION, m));
    }
    c.finish()
}

fn tool(id: &str) -> Value {
    json!({
        "descriptor": {
            "id": id,
            "description": "Upper-case a text.",
            "input_schema": {
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"],
                "additionalProperties": false
            },
            "output_schema": { "type": "string" },
            "primary_argument": "text"
        }
    })
}

fn doc(tools: Vec<Value>) -> Value {
    json!({ "format": METADATA_FORMAT, "wit": format!("{WIT_PACKAGE}@{WIT_VERSION}"), "sdk": "0.1.0", "tools": tools })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("json")
}

/// Seeds of the `metadata` target: small components built with wasm-encoder.
pub fn metadata() -> Vec<(String, Vec<u8>)> {
    let one = bytes(&doc(vec![tool("text.upper")]));
    let rich = bytes(&doc(vec![
        tool("text.upper"),
        json!({
            "descriptor": {
                "id": "files.read",
                "description": "Read a file.",
                "input_schema": {
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "properties": {"path": {"type": "string", "pattern": "^[^/]"}, "limit": {"type": ["integer", "null"], "minimum": 1}},
                    "required": ["path"]
                },
                "annotations": {"read_only": true, "idempotent": true, "open_world": false},
                "primary_argument": "path"
            },
            "capabilities": {"directories": [{"path": "/data", "access": "read"}, {"path": "/out", "access": "read-write"}]}
        }),
        json!({
            "descriptor": {
                "id": "tracker.create_issue",
                "description": "Create an issue.",
                "input_schema": {"type": "object", "$defs": {"t": {"type": "string", "maxLength": 200}},
                    "properties": {"title": {"$ref": "#/$defs/t"}, "labels": {"type": "array", "items": {"type": "string"}}}},
                "output_schema": {"type": "object", "properties": {"id": {"type": "integer"}}}
            },
            "capabilities": {"hosts": ["https://acme.tracker.example:443", "https://*.example.com:443", "http://127.0.0.1:*"], "credentials": ["tracker"]}
        }),
        json!({
            "descriptor": {"id": "skill.release-notes", "description": "Write release notes.", "input_schema": {"type": "object"}},
            "skill": {"allowed_tools": ["files.*", "text.upper"]}
        }),
    ]));
    let newer = bytes(&json!({"format": 2, "wit": format!("{WIT_PACKAGE}@{WIT_VERSION}"), "sdk": "9", "tools": []}));
    let bad_tool = bytes(&doc(vec![
        json!({"descriptor": {"id": "1bad", "description": "x", "input_schema": {"type": "object"}}}),
    ]));
    let valid = component(&[&one], Some(TOOL_EXPORT));
    vec![
        ("ok-one-tool.wasm".into(), valid.clone()),
        ("ok-four-tools.wasm".into(), component(&[&rich], Some(TOOL_EXPORT))),
        ("no-export.wasm".into(), component(&[&one], None)),
        ("two-sections.wasm".into(), component(&[&one, &one], Some(TOOL_EXPORT))),
        ("no-section.wasm".into(), component(&[], Some(TOOL_EXPORT))),
        ("not-json.wasm".into(), component(&[b"{not json"], Some(TOOL_EXPORT))),
        ("format-2.wasm".into(), component(&[&newer], Some(TOOL_EXPORT))),
        ("bad-tool.wasm".into(), component(&[&bad_tool], Some(TOOL_EXPORT))),
        ("export-0.2.wasm".into(), component(&[&one], Some("toolgate:plugin/tool@0.2.0"))),
        ("core-module.wasm".into(), Module::new().finish()),
        ("header-only.wasm".into(), Component::new().finish()),
        ("truncated.wasm".into(), valid[..valid.len() - 7].to_vec()),
    ]
}

/// Seeds of the `policy` target, in the format of `PolicyInput`.
pub fn policy() -> Vec<(String, String)> {
    let seed = |rules: &[&str], tool: &str, primary: &str, args: Value| {
        format!("{}\n\n{tool}\n{primary}\n{args}", rules.join("\n"))
    };
    let mut out: Vec<(String, String)> = vec![
        (
            "ok-tool-ids".into(),
            seed(
                &[
                    "allow text.upper",
                    "allow text.*",
                    "ask *",
                    "allow mcp__github__*",
                    "allow text.?pper",
                    "deny   text.upper \t",
                ],
                "text.upper",
                "",
                json!({}),
            ),
        ),
        (
            "ok-primary-glob".into(),
            seed(
                &[
                    "allow fs.read(data/**)",
                    "allow fs.read(data/*)",
                    "allow fs.read ( data/** )",
                    "allow fs.read(year=2024/**)",
                    "ask fs.read(mode=append)",
                    "ask fs.read(year[=]2024)",
                ],
                "fs.read",
                "path",
                json!({"path": "data/a/b.txt"}),
            ),
        ),
        (
            "ok-conditions".into(),
            seed(
                &[
                    r#"allow fs.write(path ~ "out/**", mode = "append")"#,
                    r#"ask fs.write(path !~ "out/**")"#,
                    r#"ask fs.write(mode != "append")"#,
                    "allow t(n = 1, f = -0.5, b = true, c = false, z = null)",
                    r#"allow t(s = "say \"hi\" \\o/")"#,
                    r#"allow t(s = "a)b(c", x = 1)"#,
                    r#"allow t(a~"x*",b!~"y*",c=1,d!=2)"#,
                ],
                "fs.write",
                "path",
                json!({"path": "out/x", "mode": "append"}),
            ),
        ),
        (
            "ok-nested-paths".into(),
            seed(
                &[
                    r#"allow http.get(request.url ~ "https://api.github.com/**")"#,
                    r#"allow t(argv[0] = "git", argv[1] != "push")"#,
                    r#"allow t(files[*].meta.path ~ "out/*")"#,
                    r#"allow t(headers.content-type = "text/plain", _x = 1)"#,
                ],
                "t",
                "",
                json!({"argv": ["git", "status"], "files": [{"meta": {"path": "out/a"}}], "headers": {"content-type": "text/plain"}, "_x": 1.0}),
            ),
        ),
        (
            "ok-wildcards".into(),
            seed(
                &[
                    r#"allow fs.copy(paths[*] ~ "data/**")"#,
                    r#"deny fs.copy(paths[*] ~ "secret/**")"#,
                    r#"ask fs.copy(paths[*] ~ "secret/**")"#,
                    r#"allow fs.copy(paths[*] != "x")"#,
                    "allow t(a[*].b[*] = 1)",
                ],
                "fs.copy",
                "",
                json!({"paths": ["data/a", "secret/b", 3]}),
            ),
        ),
        (
            "ok-dot-segments".into(),
            seed(
                &[
                    "allow fs.read(data/**)",
                    "deny fs.read(secret/**)",
                    r#"deny fs.write(path ~ "secret/**")"#,
                    r#"allow fs.read(path !~ "secret/**")"#,
                    "allow *",
                ],
                "fs.read",
                "path",
                json!({"path": "data/../secret/k"}),
            ),
        ),
        (
            "ok-specificity".into(),
            seed(
                &[
                    "ask fs.write",
                    r#"allow fs.write(path ~ "out/**")"#,
                    r#"ask fs.write(path ~ "out/**", mode = "append")"#,
                    "ask *(out/**)",
                    "ask fs.*",
                    "allow f*",
                    "ask fs.w*",
                    "allow fs.wr*",
                    "allow fs.?????",
                    "deny fs.*(secret/**)",
                ],
                "fs.write",
                "path",
                json!({"path": "out/a", "mode": "append"}),
            ),
        ),
        (
            "ok-fixed-policy".into(),
            seed(
                &[
                    "allow fs.read(data/**)",
                    r#"allow fs.write(path ~ "out/**", mode = "append")"#,
                    r#"ask fs.write(paths[*] !~ "secret/**")"#,
                    r#"deny *(a[*].b[*].c != null, n = 1.5)"#,
                    r#"allow t(a[0][1].b = true, f = "x")"#,
                    "ask text.*",
                    "allow *",
                ],
                "t",
                "",
                json!({"a": [[0, {"b": true}], {"b": [{"c": 1}]}], "f": "x", "n": 1.5}),
            ),
        ),
        (
            "ok-numbers".into(),
            seed(
                &["allow t(n = 1, m != 18446744073709551615, k = -9223372036854775808, f = 1e300)"],
                "t",
                "",
                json!({"n": 1.0, "m": 1, "k": i64::MIN, "f": 1e300}),
            ),
        ),
        ("ok-no-rules".into(), seed(&[], "fs.read", "path", json!({"path": "x"}))),
    ];
    // Refused patterns (from the policy tests), one kind of error each.
    for (i, p) in [
        "   ",
        "fs read",
        "fs.réad",
        "(data/**)",
        "fs.read(data/**",
        "fs.read(data/**) x",
        "fs.read(   )",
        "fs.read({a,b)",
        r#"fs.write(path ~ "[z-a]")"#,
        "fs.write(path ~ out/**)",
        r#"fs.write(path ~ "x", a[99999999999999999999999] = 1)"#,
        "fs.write(n = 1e999x)",
        r#"fs.write(path = "a\nb")"#,
    ]
    .iter()
    .enumerate()
    {
        out.push((
            format!("err-{i:02}"),
            seed(&["allow text.upper", &format!("deny {p}")], "text.upper", "", json!({})),
        ));
    }
    out
}

/// Seeds of the `config` target (the demo configuration is copied in by hand).
pub fn config() -> Vec<(String, String)> {
    vec![
        (
            "ok-readme.toml".into(),
            r#"plugins = "plugins"
store = ".toolgate/journal.db"
cache = ".toolgate/cache"
lock = "toolgate.lock"

[limits]
memory_mib = 64
timeout_ms = 10000
output_kib = 1024
capture_kib = 64
ticket_ttl_secs = 86400
http_request_kib = 1024
http_response_kib = 4096
http_timeout_ms = 30000
max_instances = 64
max_instances_per_tool = 16

[signing]
keys = ["ed25519:WGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY="]

[credentials.tracker]
source = { env = "TRACKER_TOKEN" }
destinations = ["https://acme.tracker.example:443"]
apply = { header = { name = "Authorization", format = "Bearer {}" } }

[credentials.files]
source = { file = "secrets/tracker" }
destinations = ["http://127.0.0.1:8080"]
apply = { basic = { username = "bot" } }

[credentials.q]
source = { env = "Q" }
destinations = ["https://q.example:443"]
apply = { query = { param = "api_key" } }

[[grants]]
tools = "files.*"
directories = [{ path = "/data", host = "./data", access = "read" }, { path = "/out", host = "/srv/out", access = "read-write" }]
hosts = ["https://acme.tracker.example:443"]
credentials = ["tracker"]
env = { LANG = "C" }

[agents.default]
visible = ["text.*", "notes"]
default = "deny"
narrowing = "configured"
authority = { hosts = ["https://acme.tracker.example:443"], directories = ["/data"], credentials = [] }
rules = [
  { pattern = "text.*", behavior = "allow" },
  { pattern = "text.repeat", behavior = "deny" },
  { pattern = "fs.read(data/**)", behavior = "allow" },
  { pattern = 'fs.write(path ~ "out/**", mode = "append")', behavior = "ask" },
]

[agents.locked]
narrowing = "deny-all"
default = "ask"

[[agents.locked.rules]]
pattern = "*"
behavior = "allow"
"#
            .into(),
        ),
        ("ok-empty.toml".into(), String::new()),
        (
            "ok-signing-memory.toml".into(),
            "store = \":memory:\"\n[signing]\nkeys = [\"ed25519:WGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY=\"]\n".into(),
        ),
        ("bad-signing-key.toml".into(), "[signing]\nkeys = [\"ed25519:AAAA\"]\n".into()),
        (
            "ok-limits-bounds.toml".into(),
            "[limits]\nmemory_mib = 4096\ntimeout_ms = 3600000\noutput_kib = 65536\ncapture_kib = 1\nticket_ttl_secs = 31536000\n".into(),
        ),
        ("limit-zero.toml".into(), "[limits]\nmemory_mib = 0\n".into()),
        ("unknown-key.toml".into(), "[agents.main]\nrules = [{ pattern = \"a\", behavior = \"allow\", when = \"now\" }]\n".into()),
        ("bad-rule.toml".into(), "[agents.bot]\nrules = [{ pattern = \"ok\", behavior = \"allow\" }, { pattern = \"x(\", behavior = \"deny\" }]\n".into()),
        ("bad-visible.toml".into(), "[agents.bot]\nvisible = [\"a\", \"[x\"]\n".into()),
        ("bad-grant-dir.toml".into(), "[[grants]]\ntools = \"a\"\n[[grants]]\ntools = \"b\"\ndirectories = [{ path = \"/d/../e\", host = \"d\", access = \"read\" }]\n".into()),
        ("undefined-credential.toml".into(), "[[grants]]\ntools = \"a\"\ncredentials = [\"nope\"]\n".into()),
        ("bad-host.toml".into(), "[[grants]]\ntools = \"a\"\nhosts = [\"https://x.example:*\"]\n".into()),
        ("syntax.toml".into(), "[limits\n".into()),
    ]
}

/// Seeds of the `arguments` target: argument values, and `[SCHEMA, ARGS]` pairs.
pub fn arguments() -> Vec<(String, Value)> {
    vec![
        ("ok-repeat.json".into(), json!({"text": "ab", "times": 3, "separator": ", "})),
        ("ok-notes.json".into(), json!({"op": "add", "note": "buy milk"})),
        ("ok-search.json".into(), json!({"query": "TODO", "dir": null})),
        (
            "ok-kitchen-sink.json".into(),
            json!({
                "path": "out/a.txt", "mode": "append", "count": 9, "ratio": 0.25,
                "when": "2024-02-29T12:00:00Z", "mail": "a@example.com", "addr": "::1", "url": "https://example.com/x?y#z",
                "tags": ["x", "y"], "pair": ["a", 1.5], "flag": true,
                "tree": {"name": "root", "children": [{"name": "a"}, {"name": "b", "children": []}]},
                "env": {"LANG": "C"}, "fixed": {"a": [1, {"b": null}]}, "choice": 7
            }),
        ),
        (
            "bad-kitchen-sink.json".into(),
            json!({"path": "../X", "mode": "append", "count": 10, "tags": ["x", "x"], "flag": true, "tree": {"name": "", "extra": 1}, "choice": 0}),
        ),
        ("bad-types.json".into(), json!({"text": 5, "times": 0, "op": "nope", "query": null})),
        ("not-an-object.json".into(), json!([1, "two", null])),
        (
            "ok-schema-pair.json".into(),
            json!([{"properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false}, {"text": "hi"}]),
        ),
        (
            "schema-self-ref.json".into(),
            json!([{"properties": {"text": {"$ref": "#"}}}, {"text": {"deep": [1, 2, 3]}}]),
        ),
        ("schema-decoy-draft.json".into(), json!([{"$defs": {"x": {"$schema": "https://example.com/unknown"}}}, {}])),
        (
            "schema-urn-ref.json".into(),
            json!([{"properties": {"text": {"$id": "urn:x", "$ref": "urn:x"}}}, {"text": 1}]),
        ),
        (
            "schema-remote-ref.json".into(),
            json!([{"properties": {"text": {"$ref": "https://example.com/schema.json"}}}, {}]),
        ),
        ("schema-missing-ref.json".into(), json!([{"properties": {"text": {"$ref": "#/$defs/missing"}}}, {}])),
        ("schema-bad-regex.json".into(), json!([{"properties": {"text": {"pattern": "(unclosed"}}}, {"text": "("}])),
        (
            "schema-regexes.json".into(),
            json!([{"patternProperties": {"^(a+)+$": {"type": "string", "pattern": "(?<n>a)\\k<n>"}}, "propertyNames": {"pattern": "\\p{L}"}}, {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab": "aa", "aaaa": "x"}]),
        ),
        (
            "schema-dynamic.json".into(),
            json!([{"$dynamicAnchor": "n", "properties": {"c": {"$dynamicRef": "#n"}}, "unevaluatedProperties": false, "$defs": {"d": {"$anchor": "a", "type": "integer"}}}, {"c": {"c": {}}, "x": 1}]),
        ),
        (
            "schema-formats.json".into(),
            json!([{"properties": {"d": {"format": "duration"}, "r": {"format": "regex"}, "b": {"contentEncoding": "base64", "contentMediaType": "application/json"}}}, {"d": "P1D", "r": "[", "b": "e30="}]),
        ),
        (
            "schema-draft7.json".into(),
            json!([{"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"]}, "items": [{"type": "string"}], "additionalItems": false}, {"a": 1}]),
        ),
        (
            "schema-numbers.json".into(),
            json!([{"properties": {"n": {"multipleOf": 1e-320, "maximum": 1e300, "minimum": -1e300}}}, {"n": 18446744073709551615u64}]),
        ),
    ]
}
