//! Descriptor & metadata: from component bytes to checked Tool descriptors.
//!
//! Owns reading (and, for `toolgate pack`, writing) the `toolgate-metadata`
//! custom section, and every check a descriptor must pass before a model may
//! see it: a real component, one well-formed metadata document, a compatible
//! WIT version, valid ids, an object-rooted valid JSON Schema.
//!
//! Architecture invariant: this module never compiles or instantiates a
//! component and does no IO; it parses bytes with wasmparser only. A descriptor
//! holds identity and schema, never a handle, grant or secret.

use std::sync::Arc;

use toolgate_sdk::metadata::{
    ComponentMetadata, METADATA_FORMAT, METADATA_SECTION, PINNED_SECTION, ToolMetadata, WIT_PACKAGE, WIT_VERSION,
};
use wasmparser::{Chunk, Encoding, Parser, Payload};

/// Largest metadata section accepted.
pub const MAX_METADATA_BYTES: usize = 1 << 20;
/// Largest pinned-data section accepted (a Skill's content, an MCP adapter's
/// pinned configuration): the host holds it in every catalog generation and
/// copies it to the component at every `pinned::data()` call, outside the
/// guest's memory limit (before, up to the 256 MiB component cap: 4 GB for
/// 16 concurrent calls). Twice a Skill's own cap, so a Skill of 4 MiB of
/// text fits as the JSON `toolgate skill pack` writes; an MCP adapter's
/// configuration is about the size of its metadata. `toolgate skill pack`
/// and `toolgate mcp import` refuse more, as a host does.
pub const MAX_PINNED_BYTES: usize = 8 << 20;
/// Most Tools one component may export.
pub const MAX_TOOLS_PER_COMPONENT: usize = 256;
/// Longest Tool id.
pub const MAX_ID_LEN: usize = 128;
/// Longest description.
pub const MAX_DESCRIPTION_LEN: usize = 8 * 1024;
/// Largest compiled size of one `pattern` (or `patternProperties` key) of a
/// schema. The regex engine matches in time linear in the text *and* in this
/// size: under it, the slowest patterns found took ~0.6 s per MiB
/// of text in a debug build; under the engine's default of 10 MiB, two
/// minutes per 100 KiB. Real-world patterns are far below it (an RFC 5322
/// address compiles to ~18 KiB).
pub const MAX_PATTERN_BYTES: usize = 256 << 10;
/// Most heap the compiled patterns of one metadata document may hold, in
/// every schema of every Tool together: each distinct `pattern` and
/// `patternProperties` key of a schema is compiled when the component is
/// loaded (on every `list`, `lock`, serve start and reload) and held as long
/// as it is. [`MAX_PATTERN_BYTES`] bounds one; before this, nothing bounded
/// how many: 3,000 near-limit patterns differing by one character each
/// (130 KB of metadata) took ~1 GB and 4 s at every load. Real schemas are
/// far below it: an RFC 5322 address pattern takes ~7 KiB, a date 3 KiB;
/// about thirty patterns at the bound of one fill it.
pub const MAX_PATTERNS_BYTES: usize = 8 << 20;
/// Most transitions, in bytes, the `regex` engine's lazy DFA may cache for
/// one compiled pattern on one thread matching it (the engine's default is
/// 2 MiB). The cache grows with what is matched, not with the pattern: a
/// Tool's own output (up to `limits.output_kib`) is matched against its
/// output schema's patterns, and each pattern keeps its caches while the
/// component is loaded. Past it the cache is cleared and refilled, or the
/// engine falls back to its NFA simulation: slower, still linear.
pub const MAX_PATTERN_CACHE_BYTES: usize = 64 << 10;
/// Most distinct patterns one metadata document may hold, in all its
/// schemas: with [`MAX_PATTERN_CACHE_BYTES`] it bounds what matching can
/// make their caches hold (64 MiB per thread matching at once), where
/// [`MAX_PATTERNS_BYTES`] bounds only what compiling them holds (1 KiB
/// patterns fit it 8,192 times). Real components hold a handful.
pub const MAX_PATTERNS: usize = 1024;
/// Most evaluations of subschemas that validating one value against a
/// schema may cost — one node of an argument or output (the whole value, a
/// member, an item) or one member name — summed over every subschema that
/// reaches it, whatever the value (see `work` below for the model). A
/// comparison counts as one evaluation: with each entry of an `enum` (other
/// than one of more than 10 strings, which is looked up at once) or a
/// `const`, each name of a `required` or `dependentRequired` list, and a
/// fractional `multipleOf` as 100. With it, validating costs at most this
/// many evaluations per node and member name of the value: linear in its
/// size, where a crafted schema was exponential (2^n for a definition
/// referenced twice from each of n nested `anyOf`s) or compared each of
/// 600,000 items with an `enum` of 120,000 numbers.
/// Real schemas are far below it: the example Tools' cost at most 5 per
/// value, schemars output with a definition used from 50 properties and
/// recursive types 6, a Rust enum of 200 documented variants ~400; a
/// `oneOf` of 1,000 variants that each `$ref` a
/// definition with an `anyOf` of two costs ~4,000. Above it: a definition
/// referenced twice from each of 12 nested levels, an `enum` of 10,000 numbers.
pub const MAX_SCHEMA_WORK: u64 = 10_000;
/// Most passes over one node of a value (its text, its member names, or
/// for `uniqueItems` its items) that validating it against a schema may
/// make, counted as [`MAX_SCHEMA_WORK`] is: a `pattern`, a
/// `patternProperties` pattern, `uniqueItems`, a `format`, and in drafts
/// 4 to 7 a `contentEncoding` or `contentMediaType` count 16 passes
/// (a regular expression or a format's parser: up to ~70 ns a byte in a
/// debug build), a `minLength` or `maxLength` over 64 or an `enum` of
/// more than 10 strings one. A pass costs time in proportion to the node's
/// size, so this bounds the time for the whole value by its size, whatever
/// the schema: 16 patterns at most on one string, where an `allOf` of 9,999
/// (within [`MAX_SCHEMA_WORK`]) read a 4 MiB argument 9,999 times. Real
/// schemas apply one or two patterns or formats to a value.
pub const MAX_SCHEMA_PASSES: u64 = 256;

/// Arguments or output larger than this (bytes of JSON) are held to their
/// schema on the blocking pool, not on an async worker: a check costs time
/// in proportion to their size times the schema's passes (up to
/// [`MAX_SCHEMA_PASSES`]), and on a worker it held every other call and
/// connection there — megabytes against a schema of slow patterns, seconds
/// per request.
pub const SCHEMA_CHECK_INLINE_BYTES: usize = 64 << 10;
/// Most steps bounding [`MAX_SCHEMA_WORK`] may take for one metadata document
/// (every schema of every Tool in it) before the document is refused as too
/// complex to check; a real schema takes a few steps per subschema (a
/// 1.2 MiB schema of 6,000 struct fields: 426,000). All of them take about a
/// quarter of a second in a debug build, so loading stays fast whatever a
/// component ships.
const MAX_CHECK_STEPS: u64 = 1 << 22;

/// Why a file is not a loadable Tool component. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// Empty or not WebAssembly at all.
    #[error(
        "not a WebAssembly file; build the Tool with `cargo build --target wasm32-wasip2` and pack it with `toolgate pack`"
    )]
    NotWasm,
    /// A core module, not a component.
    #[error(
        "a core WebAssembly module, not a component; build for `wasm32-wasip2` (which emits a component) and pack it with `toolgate pack`"
    )]
    CoreModule,
    /// Cut short or otherwise unparseable.
    #[error("malformed or truncated component ({0}); rebuild it")]
    Malformed(String),
    /// No metadata section.
    #[error("no `{METADATA_SECTION}` section; run `toolgate pack` on the built component to embed its descriptors")]
    MissingMetadata,
    /// More than one metadata section.
    #[error("{0} `{METADATA_SECTION}` sections; a component carries exactly one, re-run `toolgate pack`")]
    DuplicateMetadata(usize),
    /// More than one pinned-data section.
    #[error(
        "{0} `{PINNED_SECTION}` sections; a component carries at most one, re-run `toolgate skill pack` or `toolgate mcp import`"
    )]
    DuplicatePinned(usize),
    /// Pinned data too large.
    #[error(
        "`{PINNED_SECTION}` section is {0} bytes, more than the {mib} MiB allowed (it is copied to the component at every \
         call); re-run `toolgate skill pack` or `toolgate mcp import` with less: a smaller Skill, fewer remote tools",
        mib = MAX_PINNED_BYTES >> 20
    )]
    PinnedTooLarge(usize),
    /// Metadata too large.
    #[error("`{METADATA_SECTION}` section is {0} bytes, more than the {MAX_METADATA_BYTES} allowed")]
    MetadataTooLarge(usize),
    /// Metadata is not the expected JSON document.
    #[error(
        "`{METADATA_SECTION}` section is not valid metadata: {0}; re-run `toolgate pack` with a matching toolgate-sdk"
    )]
    BadMetadata(String),
    /// Another metadata layout version.
    #[error(
        "metadata format {found} is not supported (this host reads format {METADATA_FORMAT}); rebuild with a matching toolgate-sdk"
    )]
    UnsupportedFormat {
        /// The format the file declares.
        found: u32,
    },
    /// Built against an incompatible WIT package version.
    #[error(
        "built against `{found}`, but this host implements `{WIT_PACKAGE}@{WIT_VERSION}`; rebuild the Tool with a toolgate-sdk for {WIT_PACKAGE}@{WIT_VERSION}"
    )]
    IncompatibleWit {
        /// What the component targets.
        found: String,
    },
    /// The component does not export the `tool` interface.
    #[error("does not export `{WIT_PACKAGE}/tool@{WIT_VERSION}`; build it with toolgate-sdk's `export_tools!`")]
    MissingExport,
    /// A Tool descriptor fails a check.
    #[error("tool `{id}`: {problem}")]
    BadTool {
        /// The id as written (possibly invalid).
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// Exports no Tool at all.
    #[error("exports no Tools; list at least one in `export_tools!`")]
    NoTools,
}

/// A Tool's metadata after every check, with its compiled argument validator.
pub struct CheckedTool {
    /// Descriptor and declared capabilities as the component stated them.
    pub metadata: ToolMetadata,
    validator: jsonschema::Validator,
    output_validator: Option<jsonschema::Validator>,
    /// The input schema, shared, when it mirrors arguments into headers
    /// (`x-mcp-header`): what a front end checks such headers against.
    mcp_headers: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
}

impl std::fmt::Debug for CheckedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedTool").field("metadata", &self.metadata).finish_non_exhaustive()
    }
}

impl CheckedTool {
    /// The Tool's id.
    pub fn id(&self) -> &str {
        &self.metadata.descriptor.id
    }

    /// The input schema when it has `x-mcp-header` annotations (checked at
    /// load); `None` for every other Tool, at no cost.
    pub fn mcp_header_schema(&self) -> Option<&Arc<serde_json::Map<String, serde_json::Value>>> {
        self.mcp_headers.as_ref()
    }

    /// Validate JSON output against the declared output schema, if any: a
    /// Tool (or a remote behind an adapter) cannot hand the model or an MCP
    /// client structured content that breaks its own contract.
    pub fn validate_output(&self, output: &serde_json::Value) -> Result<(), String> {
        let Some(v) = &self.output_validator else { return Ok(()) };
        match problems(v, output) {
            None => Ok(()),
            Some(p) => {
                Err(format!("`{}` returned output that does not match its declared output schema: {p}", self.id()))
            }
        }
    }

    /// Validate `arguments` against the input schema. The error lists what is
    /// wrong in words the model can act on.
    pub fn validate_arguments(&self, arguments: &serde_json::Value) -> Result<(), String> {
        match problems(&self.validator, arguments) {
            None => Ok(()),
            Some(p) => Err(format!("invalid arguments for `{}`: {p}", self.id())),
        }
    }
}

/// Up to five validation errors, each with where it is, or `None`.
fn problems(validator: &jsonschema::Validator, instance: &serde_json::Value) -> Option<String> {
    // The common case first: `is_valid` stops at the first failure and builds
    // no error values (the full walk below collects them for the message).
    if validator.is_valid(instance) {
        return None;
    }
    {
        let problems: Vec<String> = validator
            .iter_errors(instance)
            .take(5)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() { e.to_string() } else { format!("at `{at}`: {e}") }
            })
            .collect();
        if problems.is_empty() { None } else { Some(problems.join("; ")) }
    }
}

/// Read and check the metadata of a component without compiling it.
pub fn read_metadata(bytes: &[u8]) -> Result<Vec<Arc<CheckedTool>>, DescriptorError> {
    tools_of(&scan(bytes)?)
}

/// What a host reads from a component file without running it, in one pass
/// over its top-level sections: its checked Tools ([`read_metadata`]) and its
/// pinned data ([`read_pinned`]).
pub fn read_component(bytes: &[u8]) -> Result<(Vec<Arc<CheckedTool>>, Vec<u8>), DescriptorError> {
    let scan = scan(bytes)?;
    // The pinned data's size first: refused before any schema is compiled.
    let pinned = pinned_of(&scan)?;
    Ok((tools_of(&scan)?, pinned))
}

fn tools_of(scan: &Scan<'_>) -> Result<Vec<Arc<CheckedTool>>, DescriptorError> {
    let raw = match scan.metadata.as_slice() {
        [] => return Err(DescriptorError::MissingMetadata),
        [one] => *one,
        many => return Err(DescriptorError::DuplicateMetadata(many.len())),
    };
    if raw.len() > MAX_METADATA_BYTES {
        return Err(DescriptorError::MetadataTooLarge(raw.len()));
    }
    let doc = parse_document(raw)?;
    if !scan.exports_tool {
        return Err(DescriptorError::MissingExport);
    }
    check_document(doc)
}

/// Parse the JSON document, checking only its envelope.
fn parse_document(raw: &[u8]) -> Result<ComponentMetadata, DescriptorError> {
    // Read the envelope first so a newer format or WIT version gets its own
    // message instead of an unknown-field error.
    #[derive(serde::Deserialize)]
    struct Envelope {
        format: u32,
        wit: String,
    }
    let env: Envelope = serde_json::from_slice(raw).map_err(|e| DescriptorError::BadMetadata(e.to_string()))?;
    if env.format != METADATA_FORMAT {
        return Err(DescriptorError::UnsupportedFormat { found: env.format });
    }
    if !wit_compatible(&env.wit) {
        return Err(DescriptorError::IncompatibleWit { found: env.wit });
    }
    serde_json::from_slice(raw).map_err(|e| DescriptorError::BadMetadata(e.to_string()))
}

/// Whether `wit` (e.g. `toolgate:plugin@0.1.3`) is on this host's compatibility line.
pub fn wit_compatible(wit: &str) -> bool {
    let Some((package, version)) = wit.split_once('@') else { return false };
    package == WIT_PACKAGE && same_line(version, WIT_VERSION)
}

/// Semver compatibility: same major, and same minor while major is 0.
fn same_line(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Option<(u64, u64)> {
        let mut it = v.split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        Some((major, minor))
    };
    match (parts(a), parts(b)) {
        (Some((0, ma)), Some((0, mb))) => ma == mb,
        (Some((a, _)), Some((b, _))) => a == b,
        _ => false,
    }
}

/// Check a metadata document exactly as [`read_metadata`] does after parsing it.
pub fn check_document(doc: ComponentMetadata) -> Result<Vec<Arc<CheckedTool>>, DescriptorError> {
    if doc.tools.is_empty() {
        return Err(DescriptorError::NoTools);
    }
    if doc.tools.len() > MAX_TOOLS_PER_COMPONENT {
        return Err(DescriptorError::BadMetadata(format!(
            "{} tools, more than the {MAX_TOOLS_PER_COMPONENT} allowed",
            doc.tools.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(doc.tools.len());
    let mut steps = work::Steps(MAX_CHECK_STEPS);
    let mut patterns = patterns::Budget::new();
    for tool in doc.tools {
        let id = tool.descriptor.id.clone();
        let bad = |problem: String| DescriptorError::BadTool { id: id.clone(), problem };
        check_id(&id).map_err(&bad)?;
        if !seen.insert(id.clone()) {
            return Err(bad("declared twice in this component".into()));
        }
        let d = &tool.descriptor;
        if d.description.trim().is_empty() {
            return Err(bad("empty description; say what the Tool does".into()));
        }
        if d.description.len() > MAX_DESCRIPTION_LEN {
            return Err(bad(format!("description longer than {MAX_DESCRIPTION_LEN} bytes")));
        }
        if d.input_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
            return Err(bad("input schema root is not `type: object`; make `Args` a struct".into()));
        }
        let validator = compile_schema(&d.input_schema, &mut steps, &mut patterns)
            .map_err(|e| bad(format!("input schema: {e}")))?;
        let mcp_headers = check_mcp_headers(&d.input_schema)
            .map_err(|e| bad(format!("input schema: {e}")))?
            .then(|| Arc::new(d.input_schema.as_object().cloned().unwrap_or_default()));
        let output_validator = match &d.output_schema {
            Some(out_schema) => Some(
                compile_schema(out_schema, &mut steps, &mut patterns)
                    .map_err(|e| bad(format!("output schema: {e}")))?,
            ),
            None => None,
        };
        if let Some(p) = &d.primary_argument {
            // Path globs in rules only match strings: a primary argument of
            // another type would make `tool(glob)` deny rules silently inert.
            let prop = d.input_schema.get("properties").and_then(|ps| ps.get(p));
            let is_string = prop.and_then(|p| p.get("type")).and_then(|t| t.as_str()) == Some("string");
            if !is_string {
                return Err(bad(format!("primary argument `{p}` must be a string property of the input schema")));
            }
        }
        for h in &tool.capabilities.hosts {
            crate::authority::destination::Destination::parse(h, true)
                .map_err(|e| bad(format!("declared host: {e}")))?;
        }
        for c in &tool.capabilities.credentials {
            check_id(c).map_err(|e| bad(format!("declared credential `{c}`: {e}")))?;
        }
        for dir in &tool.capabilities.directories {
            if !dir.path.starts_with('/') || dir.path.split('/').any(|c| c == "..") {
                return Err(bad(format!(
                    "declared directory `{}` must be an absolute guest path without `..`",
                    dir.path
                )));
            }
        }
        out.push(Arc::new(CheckedTool { metadata: tool, validator, output_validator, mcp_headers }));
    }
    Ok(out)
}

/// Tool ids: `[A-Za-z][A-Za-z0-9_.-]*`, at most [`MAX_ID_LEN`] bytes.
pub fn check_id(id: &str) -> Result<(), String> {
    let mut chars = id.chars();
    let starts_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if id.len() > MAX_ID_LEN {
        Err(format!("id longer than {MAX_ID_LEN} bytes"))
    } else if !(starts_ok && rest_ok) {
        Err("invalid id; use a letter followed by letters, digits, `_`, `-` or `.`".into())
    } else {
        Ok(())
    }
}

/// The MCP annotation that mirrors a primitive argument into an HTTP header
/// (`Mcp-Param-<token>`, MCP 2026-07-28), which clients and gateways read.
const MCP_HEADER: &str = "x-mcp-header";

/// The `x-mcp-header` annotations of an input schema held to MCP's rules, as
/// clients hold them (the Python SDK silently drops a tool whose annotation
/// breaks one, so the model would never see it): only on a property reached
/// from the root through `properties` alone, an RFC 9110 token, on an
/// `integer`, `string` or `boolean` property, unique in any letter case.
/// Whether it has any.
fn check_mcp_headers(schema: &serde_json::Value) -> Result<bool, String> {
    use serde_json::Value;
    /// Every schema position under `schema`; `path`: the property names from
    /// the root when it is reached through `properties` alone.
    fn walk<'a>(schema: &'a Value, path: Option<Vec<&'a str>>, found: &mut Vec<(Option<Vec<&'a str>>, &'a Value)>) {
        let Value::Object(m) = schema else { return };
        if m.contains_key(MCP_HEADER) {
            found.push((path.clone(), schema));
        }
        for (key, sub) in m {
            match (key.as_str(), sub) {
                ("properties", Value::Object(props)) => {
                    for (name, s) in props {
                        let at = path.as_ref().map(|p| p.iter().copied().chain([name.as_str()]).collect());
                        walk(s, at, found);
                    }
                }
                ("patternProperties" | "$defs" | "definitions" | "dependentSchemas", Value::Object(subs)) => {
                    subs.values().for_each(|s| walk(s, None, found));
                }
                ("prefixItems" | "allOf" | "anyOf" | "oneOf" | "items", Value::Array(subs)) => {
                    subs.iter().for_each(|s| walk(s, None, found));
                }
                (
                    "items"
                    | "additionalProperties"
                    | "unevaluatedProperties"
                    | "unevaluatedItems"
                    | "contains"
                    | "propertyNames"
                    | "if"
                    | "then"
                    | "else"
                    | "not"
                    | "contentSchema"
                    | "additionalItems",
                    s,
                ) => walk(s, None, found),
                _ => {}
            }
        }
    }
    let mut found = Vec::new();
    walk(schema, Some(Vec::new()), &mut found);
    let any = !found.is_empty();
    let mut seen: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for (path, at) in found {
        let Some(path) = path.filter(|p| !p.is_empty()) else {
            return Err(format!(
                "`{MCP_HEADER}` outside a property reached from the root through `properties` alone; MCP clients \
                 drop such a tool — its author (or the remote server it was imported from) must put it on a \
                 property reached that way, or remove it"
            ));
        };
        let where_ = path.join(".");
        let token = match at.get(MCP_HEADER) {
            Some(Value::String(t)) => t,
            _ => return Err(format!("property `{where_}`: `{MCP_HEADER}` must be a string")),
        };
        // RFC 9110 `token`: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if token.is_empty() || !token.bytes().all(tchar) {
            return Err(format!(
                "property `{where_}`: `{MCP_HEADER}` {} is not an HTTP header token (RFC 9110)",
                crate::display::quoted(token, 64)
            ));
        }
        if !matches!(at.get("type").and_then(Value::as_str), Some("integer" | "string" | "boolean")) {
            return Err(format!(
                "property `{where_}`: `{MCP_HEADER}` is only allowed on an `integer`, `string` or `boolean` property"
            ));
        }
        if let Some(other) = seen.insert(token.to_ascii_lowercase(), where_.clone()) {
            return Err(format!(
                "property `{where_}`: `{MCP_HEADER}` `{token}` is also on property `{other}` (header names ignore case)"
            ));
        }
    }
    Ok(any)
}

/// Compile `schema`, refusing one that is invalid, names a draft this host
/// does not bundle, has a pattern that is slow to match, or lets validating
/// one value cost more than [`MAX_SCHEMA_WORK`] (checked with `steps`, the
/// budget of its metadata document), or whose patterns would bring those of
/// its document past [`MAX_PATTERNS_BYTES`] compiled (charged to `patterns`
/// before anything is compiled).
fn compile_schema(
    schema: &serde_json::Value,
    steps: &mut work::Steps,
    patterns: &mut patterns::Budget,
) -> Result<jsonschema::Validator, String> {
    // Only the bundled drafts: a custom `$schema` would need a registry (and
    // jsonschema's meta helpers panic on unknown drafts).
    if let Some(s) = schema.get("$schema") {
        let known = s.as_str().is_some_and(|s| {
            [
                "https://json-schema.org/draft/2020-12/schema",
                "https://json-schema.org/draft/2019-09/schema",
                "http://json-schema.org/draft-07/schema",
                "http://json-schema.org/draft-06/schema",
                "http://json-schema.org/draft-04/schema",
            ]
            .iter()
            .any(|k| s.trim_end_matches('#') == *k)
        });
        if !known {
            return Err(format!("unsupported `$schema` {s}; use draft 2020-12"));
        }
    }
    patterns.charge(schema)?;
    // Build with schema validation on; no remote `$ref` resolution is compiled in.
    // Every `pattern` and `patternProperties` key runs on the linear-time
    // `regex` engine: the schema's author (for an MCP adapter, a remote
    // server) is untrusted, and the host runs it on arguments before the gate
    // and on output after the guest's deadline. jsonschema's default,
    // fancy-regex, backtracks on look-around and back-references (a crafted
    // pattern cost ~10^6 steps per string, times every string of a value).
    // Linear is in the compiled size too: bounded, see MAX_PATTERN_BYTES.
    // jsonschema translates a pattern to ECMA-262 meaning before either
    // engine compiles it, as Ajv matches it: `\d` is `[0-9]`, `\w`
    // `[A-Za-z0-9_]`, `\s` ECMA's white space, `.` no line terminator (so
    // `"٣"` fails `^\d$` here as in the client). Except `\b` and `\B`, left
    // as Rust's Unicode word boundary: beside a non-ASCII letter or digit
    // they differ (`é\b` matches `"éa"` in the client, not here).
    // The lazy DFA's cache bounded too: see MAX_PATTERN_CACHE_BYTES.
    let linear =
        jsonschema::PatternOptions::regex().size_limit(MAX_PATTERN_BYTES).dfa_size_limit(MAX_PATTERN_CACHE_BYTES);
    // `format` asserted in every draft, as the clients that receive the
    // listed schemas check it (the MCP TypeScript SDK: Ajv with
    // ajv-formats): jsonschema's default makes it an annotation from 2019-09
    // on, and a schema without `$schema` is 2020-12, so output that broke a
    // declared `date-time` was committed and sent as structured content the
    // client then threw on, after the call's effects ran. Each format is a
    // hand-written parser, linear in the string, except `regex`: see
    // [`regex_format`].
    let validator = jsonschema::options()
        .with_pattern_options(linear)
        .should_validate_formats(true)
        .with_format("regex", regex_format)
        .build(schema)
        .map_err(|e| refused_pattern(&e).unwrap_or_else(|| e.to_string()))?;
    // After compiling: the schema is valid and its references resolve.
    work::check(schema, steps)?;
    Ok(validator)
}

/// Longest string the `regex` format is checked on; a longer one passes
/// unchecked, as an annotation.
pub const MAX_REGEX_FORMAT_BYTES: usize = 4 << 10;

/// The `regex` format: jsonschema's ECMA-262 syntax check, on strings of at
/// most [`MAX_REGEX_FORMAT_BYTES`]. That check compares each group name with
/// every name declared before it (and each `\k<name>` with every declared
/// one): quadratic in the string, minutes on a few MiB of `(?<a0>)(?<a1>)…`
/// (measured in a debug build: 80 KiB 0.4 s, 340 KiB 7 s). Bounded, one
/// string costs at most ~130,000 comparisons (~500 groups): ~30 a byte; a
/// regular expression passed as an argument or returned is far shorter.
fn regex_format(s: &str) -> bool {
    s.len() > MAX_REGEX_FORMAT_BYTES || jsonschema_regex_is_valid(s)
}

/// jsonschema's own `regex` format check.
fn jsonschema_regex_is_valid(s: &str) -> bool {
    thread_local! {
        static CHECK: jsonschema::Validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&serde_json::json!({ "format": "regex" }))
            .expect("a constant schema compiles");
    }
    let s = serde_json::Value::String(s.to_owned());
    CHECK.with(|v| v.is_valid(&s))
}

/// Why a `pattern` (or `patternProperties` key) was refused, in words that
/// name it, where it is and what to do; `None` if `e` is about something else.
fn refused_pattern(e: &jsonschema::ValidationError<'_>) -> Option<String> {
    let jsonschema::error::ValidationErrorKind::Format { format } = e.kind() else { return None };
    let pattern = e.instance().as_str().filter(|_| format == "regex")?;
    let (written, at) = (shown(pattern), shown(e.schema_path().as_str()));
    // Compiling (never matching) without the bound, then with the
    // backtracking engine, only tells the reasons apart.
    let alone = serde_json::json!({ "pattern": pattern });
    let compiles = |options: jsonschema::ValidationOptions<'_>| options.build(&alone).is_ok();
    Some(if compiles(jsonschema::options().with_pattern_options(jsonschema::PatternOptions::regex())) {
        format!(
            "pattern `{written}` at `{at}` compiles to more than {} KiB, and matching costs time in proportion to \
             that on every byte; shorten it (a counted repetition such as `.{{1,500}}` is better written as `maxLength`)",
            MAX_PATTERN_BYTES >> 10
        )
    } else if compiles(jsonschema::options()) {
        format!(
            "pattern `{written}` at `{at}` uses look-around or a back-reference, which only a backtracking regex \
             engine runs (a crafted one can keep a host thread busy for minutes); this host matches patterns in \
             linear time: rewrite it without look-around and back-references, or remove it"
        )
    } else {
        format!("pattern `{written}` at `{at}` is not a valid regular expression; fix it or remove it")
    })
}

/// `s` for a message: control characters escaped, at most 200 characters.
fn shown(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == 200 {
            out.push('…');
            break;
        }
        if c.is_control() { out.extend(c.escape_default()) } else { out.push(c) }
    }
    out
}

/// The compiled size of a metadata document's patterns, charged before
/// jsonschema compiles any of them.
///
/// Building a validator, jsonschema (0.61) compiles every `pattern` and
/// `patternProperties` key of the schema it reaches, once per distinct text
/// (its cache is by exact text, for one build: an input and an output schema
/// each compile theirs), and the validator holds them for as long as the
/// component is loaded. So each distinct pattern of a schema is compiled here
/// alone, as jsonschema will compile it — its ECMA-262 translation, in the
/// search form it picks, by the `regex` engine's own builder with
/// [`MAX_PATTERN_BYTES`](super::MAX_PATTERN_BYTES) — its heap size read, the
/// regex dropped, and the size charged to the document's
/// [`MAX_PATTERNS_BYTES`](super::MAX_PATTERNS_BYTES); each counts at least
/// [`MIN_CHARGE`] (a regex's fixed parts; ~2 KiB for `^[a-z]+$`). The
/// first pattern over the budget refuses the schema: at most the budget's
/// worth is ever compiled. A pattern that does not compile here is charged
/// the minimum: jsonschema refuses it with its own message.
///
/// Every `pattern` string and every key of a `patternProperties` object
/// anywhere in the schema is charged, whether jsonschema compiles it or
/// not (under `enum`, `const` or `default`, in an unreferenced `$defs`, one
/// it matches without a regex, such as `^abc`): over-counting only makes the
/// bound stricter. Nothing else compiles a regular expression: the `regex`
/// format is a syntax check of each value (see
/// [`regex_format`](super::regex_format)).
mod patterns {
    use std::collections::HashSet;

    use jsonschema_regex::Search;
    use regex_automata::meta;
    use serde_json::Value;

    use super::{MAX_PATTERN_BYTES, MAX_PATTERNS, MAX_PATTERNS_BYTES};

    /// The least one distinct pattern counts for.
    pub(super) const MIN_CHARGE: usize = 1 << 10;

    /// What is left of one metadata document's budget.
    pub(super) struct Budget {
        left: usize,
        /// Distinct patterns charged so far (per schema, as each schema
        /// compiles its own), against [`MAX_PATTERNS`].
        patterns: usize,
    }

    /// A step from a value to one of its members, to name where a pattern is.
    enum Step<'v> {
        Root,
        Key(&'v str),
        Index(usize),
    }

    impl Budget {
        pub(super) fn new() -> Budget {
            Budget { left: MAX_PATTERNS_BYTES, patterns: 0 }
        }

        /// Charge every distinct pattern of `schema`, refusing the first
        /// that does not fit, naming it and where it is.
        pub(super) fn charge(&mut self, schema: &Value) -> Result<(), String> {
            let mut charged: HashSet<&str> = HashSet::new();
            // The path to each value, as (parent, step); the walk holds indices.
            let mut steps: Vec<(usize, Step<'_>)> = vec![(0, Step::Root)];
            let mut stack: Vec<(&Value, usize)> = vec![(schema, 0)];
            while let Some((value, at)) = stack.pop() {
                let first = stack.len();
                match value {
                    Value::Object(object) => {
                        for (key, v) in object {
                            // (pattern, whether it is a key of `key`'s object)
                            let patterns: Box<dyn Iterator<Item = (&str, bool)>> = match (key.as_str(), v) {
                                ("pattern", Value::String(p)) => Box::new(std::iter::once((p.as_str(), false))),
                                ("patternProperties", Value::Object(m)) => {
                                    Box::new(m.keys().map(|p| (p.as_str(), true)))
                                }
                                _ => Box::new(std::iter::empty()),
                            };
                            for (pattern, is_key) in patterns {
                                if !charged.insert(pattern) {
                                    continue;
                                }
                                // Counted before compiling: past the count,
                                // nothing more is compiled.
                                self.patterns += 1;
                                let size = match self.patterns > MAX_PATTERNS {
                                    true => usize::MAX,
                                    false => compiled_size(pattern),
                                };
                                if size > self.left {
                                    self.left = 0;
                                    let mut pointer = pointer(&steps, at);
                                    pointer.push('/');
                                    pointer.push_str(&escape(key));
                                    if is_key {
                                        pointer.push('/');
                                        pointer.push_str(&escape(pattern));
                                    }
                                    return Err(match self.patterns > MAX_PATTERNS {
                                        true => too_many(pattern, &pointer),
                                        false => refusal(pattern, &pointer, size),
                                    });
                                }
                                self.left -= size;
                            }
                            steps.push((at, Step::Key(key)));
                            stack.push((v, steps.len() - 1));
                        }
                        // In document order: the first over the budget is named.
                        stack[first..].reverse();
                    }
                    Value::Array(items) => {
                        for (i, v) in items.iter().enumerate() {
                            steps.push((at, Step::Index(i)));
                            stack.push((v, steps.len() - 1));
                        }
                        stack[first..].reverse();
                    }
                    _ => {}
                }
            }
            Ok(())
        }
    }

    /// The heap `pattern` takes compiled as jsonschema compiles it (see
    /// `build_standard_regex` there), at least [`MIN_CHARGE`].
    fn compiled_size(pattern: &str) -> usize {
        let Ok(translated) = jsonschema_regex::to_rust_regex(pattern) else { return MIN_CHARGE };
        let build = |p: &str| {
            meta::Regex::builder()
                .configure(meta::Config::new().nfa_size_limit(Some(MAX_PATTERN_BYTES)))
                .build(p)
                .map(|r| r.memory_usage())
                .unwrap_or(0)
        };
        let size = match jsonschema_regex::search_form(pattern, &translated) {
            Some(Search::RepeatedClass(_)) => 0,
            Some(Search::Collapsed(collapsed)) => build(&collapsed),
            None => build(&translated),
        };
        size.max(MIN_CHARGE)
    }

    /// The JSON pointer of the value at `at`.
    fn pointer(steps: &[(usize, Step<'_>)], mut at: usize) -> String {
        let mut parts = Vec::new();
        while let Some((parent, step)) = steps.get(at) {
            match step {
                Step::Root => break,
                Step::Key(k) => parts.push(escape(k)),
                Step::Index(i) => parts.push(i.to_string()),
            }
            at = *parent;
        }
        parts.iter().rev().map(|p| format!("/{p}")).collect()
    }

    fn escape(key: &str) -> String {
        key.replace('~', "~0").replace('/', "~1")
    }

    fn too_many(pattern: &str, at: &str) -> String {
        format!(
            "pattern `{}` at `{}` is past the {MAX_PATTERNS} distinct patterns this component may hold in all its \
             schemas (each is compiled at every load and keeps a match cache while the component is loaded); use \
             fewer distinct patterns (a pattern that only bounds the length is better written as \
             `minLength`/`maxLength`, a list of words as an `enum`)",
            super::shown(pattern),
            super::shown(at),
        )
    }

    fn refusal(pattern: &str, at: &str, size: usize) -> String {
        format!(
            "pattern `{}` at `{}` ({} KiB compiled) brings the patterns of this component past the {} MiB they may \
             take compiled together, in all its schemas (each distinct one is compiled at every load and held while \
             the component is loaded); use fewer distinct patterns, or simpler ones (a pattern that only bounds the \
             length is better written as `minLength`/`maxLength`, a list of words as an `enum`)",
            super::shown(pattern),
            super::shown(at),
            size.div_ceil(1 << 10),
            MAX_PATTERNS_BYTES >> 20
        )
    }
}

/// How much work validating a value against a schema can cost, bounded when
/// the schema is loaded.
///
/// jsonschema (0.61) evaluates a subschema each time a path of applicators
/// reaches it: a `$ref` target is compiled once but evaluated at every use;
/// `anyOf`, `oneOf` and `allOf` evaluate every branch (`iter_errors`, which
/// writes the refusal, never stops early); `unevaluatedProperties` and
/// `unevaluatedItems` evaluate every branch below them once more to learn
/// what it evaluated. So a definition referenced twice from each of 60 nested
/// `anyOf`s costs 2^60 evaluations on one string, although the schema is a
/// few KiB and compiles at once (measured in a debug build: 20 levels,
/// 15 s). The host validates arguments before the gate and output after the
/// guest's deadline, synchronously, with no deadline of its own.
///
/// The model. The schema is a graph of subschemas, references resolved as
/// jsonschema resolves them (by the same `referencing` registry: no remote
/// document, the bundled meta-schemas). An *in-place* edge applies a
/// subschema to the same value (`$ref`, `$dynamicRef`, `$recursiveRef`,
/// `allOf`, `anyOf`, `oneOf`, `not`, `if`, `then`, `else`,
/// `dependentSchemas`, `dependencies`); a *member* edge applies it to a
/// member, an item or a member name (`properties`, `patternProperties`,
/// `additionalProperties`, `unevaluatedProperties`, `propertyNames`,
/// `prefixItems`, `items`, `additionalItems`, `contains`,
/// `unevaluatedItems`). A node with `unevaluated*` has one more in-place edge
/// per such keyword, to a *marking* copy of itself whose edges go to each
/// in-place child and to the child's marking copy (jsonschema's marking walk,
/// which validates each branch again). Every applicator counts whatever the
/// draft (a `$ref`'s siblings in draft 7 too), except `$dynamicRef`,
/// `$recursiveRef` and `unevaluated*`, counted in the drafts jsonschema
/// compiles them in; every dynamic reference counts every anchor it could
/// reach: over-counting only makes the bound stricter. (Too strict
/// for one real case: the draft 2020-12 meta-schema, whose `$dynamicRef`s
/// reach its eight anchors at every level, so a `$ref` to it is refused,
/// saying to declare an object-or-boolean instead. jsonschema resolves each
/// dynamic reference once, when compiling; following that choice exactly
/// would mean following its dynamic scope along every path.)
///
/// Per value: `work(s) = 1 + Σ work(in-place child)`, once per edge, computed
/// once per node in topological order, with saturating arithmetic: linear in
/// the graph. An in-place cycle is refused: it never reaches a member, JSON
/// Schema leaves its meaning undefined, and jsonschema's cycle guard makes it
/// cost one evaluation per simple path, factorial in the cycle's size.
///
/// Per value is not enough. A member edge can deliver one subschema to one
/// member several times (two `oneOf` branches that both declare `children`,
/// each an array of the same definition), and if that repeats at each level
/// of nesting the count multiplies per level although every level alone is
/// cheap (measured: 8 branches through `items`, 6 levels, 13 s). So the
/// check follows the multiset of subschemas that reach a value, level by
/// level, separately for every kind of member the schema tells apart (each
/// name in a `properties`, any other name, each tuple index, any other
/// index, a member name): a finite set of states, each explored once, with
/// no bound on nesting depth. Every state's work (`Σ count × work`) must be
/// at most [`MAX_SCHEMA_WORK`](super::MAX_SCHEMA_WORK); then validating any
/// value costs at most that many evaluations per node and member name of the
/// value: linear in its size, whatever its depth. Patterns are assumed to
/// match every name and `additionalProperties` every name its own
/// `properties` does not list: again only over-counting.
///
/// Nor is an evaluation of constant cost: some keywords cost in proportion
/// to the schema, others to the value (measured: an `enum` of 120,000
/// numbers, 10 s per 1,000 items; an `allOf` of 9,999 `pattern`s, 6 s per
/// 64 KiB string; both within the bound on evaluations). So each
/// subschema has its own *comparisons*, added to its evaluation:
/// `work(s) = 1 + comparisons(s) + Σ work(in-place child)`, under the same
/// bound. jsonschema compares a value with each entry of an `enum`
/// (`items.iter().any(equals)`; numbers too, for a value that is not an
/// integer), deeply with a `const`, and looks up each name of `required`
/// and `dependentRequired`/`dependencies`: one comparison per value and
/// member of the entries (and per 64 bytes of their text) and per name; a
/// fractional `multipleOf` divides exact fractions, 100. An `enum` of more
/// than 10 strings (and `null`) is a hash lookup instead: one pass, below.
/// And keywords that read the node's bytes cost in proportion to its size,
/// which no count of nodes bounds (a 4 MiB string is one node): each
/// subschema has its *passes* over the node, summed through the same
/// fan-out and bounded per node by
/// [`MAX_SCHEMA_PASSES`](super::MAX_SCHEMA_PASSES): 16 for a regular
/// expression or a parser — a `pattern` (one more per 16 alternatives: a
/// `^(a|b|…)$` is compared literal by literal), each `patternProperties`
/// pattern (matched against every member name, the object's bytes; again
/// for an `additionalProperties` beside it and in the marking walk),
/// `uniqueItems` (hashes every item whole), `format` (asserted in every
/// draft), and where jsonschema asserts them, drafts 4 to 7,
/// `contentEncoding`, `contentMediaType` —
/// and 1 for counting characters (a `minLength` or `maxLength` over 64:
/// jsonschema counts only when the byte length cannot tell, in a text of
/// at most 4 × the limit bytes) or hashing the text (an `enum` of strings).
/// Then validating a value of n bytes costs at most `MAX_SCHEMA_WORK`
/// evaluations per node and `MAX_SCHEMA_PASSES` passes per byte: linear in
/// n whatever the schema (`uniqueItems` on nested arrays reads an inner one
/// once per enclosing level: a factor of the depth, at most 128, the host's
/// bound on arguments and serde_json's on output). A `properties` of any
/// size costs one lookup per member of the value (by length and head, not
/// hashing the name), and `contains`, `minContains`/`maxContains`,
/// `prefixItems` one evaluation per item: counted as members already.
///
/// The walk itself is iterative (no recursion on the schema's shape), visits
/// each node once, and stops, refusing the schema, after
/// [`MAX_CHECK_STEPS`](super::MAX_CHECK_STEPS) steps per metadata document.
mod work {
    use std::collections::{HashMap, HashSet, VecDeque};

    use jsonschema::Draft;
    use serde_json::{Map, Value};

    use super::{MAX_SCHEMA_PASSES, MAX_SCHEMA_WORK};

    /// The passes one `pattern`, `format`, `patternProperties` pattern,
    /// `contentEncoding`, `contentMediaType` or `uniqueItems` counts for:
    /// a regular expression or a format's parser takes up to ~70 ns a byte
    /// in a debug build, `minLength` (one pass) ~5.
    const HEAVY: u64 = 16;

    /// The largest `minLength` or `maxLength` that counts no pass: it counts
    /// the characters of at most 4 × 64 + 3 bytes.
    const SHORT: u64 = 64;

    /// The comparisons a fractional `multipleOf` counts for: exact
    /// arithmetic on fractions of up to ~2,100 bits (5e-324 against
    /// 1.8e308) took the time of ~100 evaluations.
    const FRACTIONAL_MULTIPLE_OF: u64 = 100;

    /// The base URI jsonschema gives a schema without `$id`.
    const DEFAULT_BASE: &str = "json-schema:///";

    /// What is left of the check's step budget for one metadata document.
    pub(super) struct Steps(pub(super) u64);

    impl Steps {
        fn take(&mut self, n: usize) -> Result<(), String> {
            let n = u64::try_from(n).unwrap_or(u64::MAX);
            if self.0 < n {
                self.0 = 0;
                return Err(format!(
                    "bounding the work of validating against it took more than {} steps for this component; \
                     simplify the schemas (fewer branches referencing the same definitions, fewer `$dynamicRef`s)",
                    super::MAX_CHECK_STEPS
                ));
            }
            self.0 -= n;
            Ok(())
        }
    }

    /// The members of a value a member edge applies its subschema to.
    #[derive(Clone, Copy)]
    enum Member {
        /// The member with this (interned) name: `properties`.
        Name(u32),
        /// Every member: `patternProperties`, `unevaluatedProperties`.
        AnyName,
        /// Every member the `properties` of this node does not name: `additionalProperties`.
        NameNotIn(u32),
        /// The item at this index: `prefixItems`, `items` as an array.
        Index(u32),
        /// Every item from this index on: `items`, `additionalItems`, `contains`, `unevaluatedItems`.
        IndexFrom(u32),
        /// The name of every member, a string: `propertyNames`.
        KeyName,
    }

    #[derive(Clone, Copy)]
    enum Edge {
        InPlace,
        Member(Member),
        /// A member edge the marking walk of `unevaluated*` takes as well.
        Marked(Member),
    }

    #[derive(Default)]
    struct Node {
        /// The subschema's address, to name it in a message.
        at: usize,
        base: u32,
        /// Applied to the same value, once per edge.
        in_place: Vec<u32>,
        /// Applied to members.
        members: Vec<(Member, u32)>,
        /// The member edges of `contains` and `unevaluated*`.
        marked: Vec<(Member, u32)>,
        /// Interned names of its `properties`, sorted.
        names: Vec<u32>,
        /// How many of `unevaluatedProperties` and `unevaluatedItems` it has.
        unevaluated: usize,
        /// For a marking copy: the node it copies.
        copy_of: Option<u32>,
        /// What validating a value against it costs beyond evaluating it.
        own: Own,
    }

    /// The cost of a subschema's own keywords, beyond the one evaluation.
    #[derive(Clone, Copy, Default)]
    struct Own {
        /// Comparisons (`enum`, `const`, `required`, …), in evaluations.
        compares: u64,
        /// The keyword making most of them, with its entries or names.
        compares_by: Option<(&'static str, u64)>,
        /// Passes over the value's text, member names or items (see [`HEAVY`]).
        passes: u64,
        /// The keyword making most of them, with its count.
        passes_by: Option<(&'static str, u64)>,
        /// Its `patternProperties`: the passes of its patterns, which its
        /// marking copy makes again, and how many patterns.
        name_passes: (u64, u64),
    }

    struct Graph {
        nodes: Vec<Node>,
        names: Vec<String>,
        bases: Vec<String>,
        /// A dynamic reference could reach more than one anchor.
        dynamic: bool,
    }

    /// Refuse `schema` if validating some value against it could cost more
    /// than [`MAX_SCHEMA_WORK`] evaluations of subschemas at one node of the value.
    pub(super) fn check(schema: &Value, steps: &mut Steps) -> Result<(), String> {
        let mut graph = build(schema, steps)?;
        add_marking(&mut graph, steps)?;
        let order = match topological(&graph, steps)? {
            Ok(order) => order,
            Err(node) => {
                let at = where_is(schema, &graph, node);
                return Err(format!(
                    "{at} applies to the same value again through its own `$ref`/`allOf`/`anyOf`/`oneOf`/`not`/\
                     `if`/… without descending into a member: an infinite recursion whose meaning JSON Schema \
                     leaves undefined, and whose cost here grows with the factorial of the schemas in the loop; \
                     break the cycle"
                ));
            }
        };
        let cost = per_value(&graph, &order);
        explore(schema, &graph, &order, &cost, steps)
    }

    /// The graph of subschemas reachable from `schema`'s root.
    fn build(schema: &Value, steps: &mut Steps) -> Result<Graph, String> {
        let unfollowable = |what: &str, e: jsonschema::ReferencingError| {
            format!("cannot follow {what} to bound the work of validation ({e})")
        };
        let draft = Draft::default().detect(schema);
        let resource = draft.create_resource_ref(schema);
        let base = resource.id().unwrap_or(DEFAULT_BASE).to_owned();
        let registry = jsonschema::Registry::new()
            .draft(draft)
            .add(&base, resource)
            .and_then(|r| r.prepare())
            .map_err(|e| unfollowable("its references", e))?;
        let mut root_uri = jsonschema::uri::from_str(&base).map_err(|e| unfollowable("its `$id`", e))?;
        if !registry.contains_resource(root_uri.as_str()) {
            root_uri.set_fragment(None);
        }

        struct Item<'v, R> {
            value: &'v Value,
            resolver: R,
            draft: Draft,
            from: Option<(u32, Edge)>,
            /// The resolver is already in this subschema's resource (a reference's target).
            entered: bool,
        }
        let mut graph = Graph { nodes: Vec::new(), names: Vec::new(), bases: Vec::new(), dynamic: false };
        let mut name_ids: HashMap<String, u32> = HashMap::new();
        let mut base_ids: HashMap<String, u32> = HashMap::new();
        let mut base_uris = Vec::new();
        let mut index: HashMap<(usize, u32), u32> = HashMap::new();
        // Dynamic references: (node, anchor name or `None` for `$recursiveRef`,
        // bases tried, targets so far).
        let mut dynamic: Vec<(u32, Option<String>, usize, Vec<usize>)> = Vec::new();
        let mut children = Vec::new();
        let mut work =
            vec![Item { value: schema, resolver: registry.resolver(root_uri), draft, from: None, entered: false }];
        loop {
            while let Some(Item { value, resolver, draft, from, entered }) = work.pop() {
                steps.take(1)?;
                let resolver = match value {
                    Value::Object(_) if !entered => resolver
                        .in_subresource(draft.create_resource_ref(value))
                        .map_err(|e| unfollowable("an `$id`", e))?,
                    _ => resolver,
                };
                let base_uri = resolver.base_uri();
                let base = match base_ids.get(base_uri.as_str()) {
                    Some(&b) => b,
                    None => {
                        let b = id(base_uris.len());
                        base_ids.insert(base_uri.as_str().to_owned(), b);
                        graph.bases.push(base_uri.as_str().to_owned());
                        base_uris.push((*base_uri).clone());
                        b
                    }
                };
                let at = std::ptr::from_ref(value) as usize;
                let (node, new) = match index.get(&(at, base)) {
                    Some(&n) => (n, false),
                    None => {
                        let n = id(graph.nodes.len());
                        index.insert((at, base), n);
                        graph.nodes.push(Node { at, base, ..Node::default() });
                        (n, true)
                    }
                };
                if let Some((parent, edge)) = from {
                    let p = &mut graph.nodes[parent as usize];
                    match edge {
                        Edge::InPlace => p.in_place.push(node),
                        Edge::Member(m) => p.members.push((m, node)),
                        Edge::Marked(m) => {
                            p.members.push((m, node));
                            p.marked.push((m, node));
                        }
                    }
                }
                let Value::Object(object) = value else { continue };
                if !new {
                    continue;
                }
                // References, resolved as jsonschema resolves them; an empty
                // one and a `$ref`/`$dynamicRef` to the schema holding it are
                // skipped, as there.
                for keyword in ["$ref", "$dynamicRef", "$recursiveRef"] {
                    let Some(reference) = object.get(keyword).and_then(Value::as_str) else { continue };
                    // Keywords of one draft only, as jsonschema compiles them.
                    let compiled = match keyword {
                        "$recursiveRef" => draft == Draft::Draft201909,
                        "$dynamicRef" => matches!(draft, Draft::Draft202012 | Draft::Unknown),
                        _ => !reference.is_empty(),
                    };
                    if !compiled {
                        continue;
                    }
                    let resolved = if keyword == "$recursiveRef" {
                        resolver.lookup_recursive_ref()
                    } else {
                        resolver.lookup(reference)
                    };
                    let (target, target_resolver, target_draft) = resolved
                        .map_err(|e| unfollowable(&format!("`{keyword}` `{}`", super::shown(reference)), e))?
                        .into_inner();
                    let anchor = match keyword {
                        "$dynamicRef" => reference
                            .rsplit_once('#')
                            .map(|(_, name)| name)
                            .filter(|name| !name.is_empty() && !name.starts_with('/'))
                            .filter(|name| target.get("$dynamicAnchor").and_then(Value::as_str) == Some(*name))
                            .map(|name| Some(name.to_owned())),
                        "$recursiveRef" => (target.get("$recursiveAnchor") == Some(&Value::Bool(true))).then_some(None),
                        _ => None,
                    };
                    if let Some(anchor) = anchor {
                        dynamic.push((node, anchor, 0, vec![std::ptr::from_ref(target) as usize]));
                    }
                    if keyword != "$recursiveRef" && std::ptr::eq(target, value) {
                        continue;
                    }
                    work.push(Item {
                        value: target,
                        resolver: target_resolver,
                        draft: target_draft,
                        from: Some((node, Edge::InPlace)),
                        entered: true,
                    });
                }
                children.clear();
                let mut names = Vec::new();
                subschemas(object, draft, node, &mut children, &mut |name: &str| {
                    let n = match name_ids.get(name) {
                        Some(&n) => n,
                        None => {
                            let n = id(graph.names.len());
                            name_ids.insert(name.to_owned(), n);
                            graph.names.push(name.to_owned());
                            n
                        }
                    };
                    names.push(n);
                    n
                });
                names.sort_unstable();
                let own = own_cost(object, draft, steps)?;
                let n = &mut graph.nodes[node as usize];
                n.names = names;
                n.own = own;
                n.unevaluated = ["unevaluatedProperties", "unevaluatedItems"]
                    .iter()
                    .filter(|k| object.get(**k).is_some_and(|s| s.is_object() || s.is_boolean()))
                    .count()
                    * usize::from(matches!(draft, Draft::Draft201909 | Draft::Draft202012 | Draft::Unknown));
                for &(child, edge) in &children {
                    work.push(Item {
                        value: child,
                        resolver: resolver.clone(),
                        draft: draft.detect(child),
                        from: Some((node, edge)),
                        entered: false,
                    });
                }
            }
            // Every anchor a dynamic reference could reach, in any resource
            // seen (the dynamic scope only holds those): more resources may
            // appear as their targets are walked, so until none does.
            for (node, anchor, tried, targets) in &mut dynamic {
                while let Some(uri) = base_uris.get(*tried) {
                    *tried += 1;
                    steps.take(1)?;
                    let resolver = registry.resolver(uri.clone());
                    let (resolved, wanted) = match anchor {
                        Some(name) => {
                            (resolver.lookup(&format!("#{name}")), ("$dynamicAnchor", Value::from(name.as_str())))
                        }
                        None => (resolver.lookup("#"), ("$recursiveAnchor", Value::Bool(true))),
                    };
                    let Ok(resolved) = resolved else { continue };
                    let (target, target_resolver, target_draft) = resolved.into_inner();
                    let at = std::ptr::from_ref(target) as usize;
                    if target.get(wanted.0) != Some(&wanted.1) || targets.contains(&at) {
                        continue;
                    }
                    targets.push(at);
                    graph.dynamic = true;
                    work.push(Item {
                        value: target,
                        resolver: target_resolver,
                        draft: target_draft,
                        from: Some((*node, Edge::InPlace)),
                        entered: true,
                    });
                }
            }
            if work.is_empty() {
                return Ok(graph);
            }
        }
    }

    fn id(n: usize) -> u32 {
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The subschemas of `object` other than references, with how each
    /// applies; `name` interns a property name.
    fn subschemas<'v>(
        object: &'v Map<String, Value>,
        draft: Draft,
        node: u32,
        out: &mut Vec<(&'v Value, Edge)>,
        name: &mut dyn FnMut(&str) -> u32,
    ) {
        let is_schema = |v: &Value| v.is_object() || v.is_boolean();
        let len = |k: &str| object.get(k).and_then(Value::as_array).map_or(0, |a| id(a.len()));
        for (keyword, value) in object {
            let mut one = |edge: Edge| {
                if is_schema(value) {
                    out.push((value, edge));
                }
            };
            match keyword.as_str() {
                "allOf" | "anyOf" | "oneOf" => {
                    for v in value.as_array().into_iter().flatten().filter(|v| is_schema(v)) {
                        out.push((v, Edge::InPlace));
                    }
                }
                "not" | "if" | "then" | "else" => one(Edge::InPlace),
                "dependentSchemas" | "dependencies" => {
                    for v in value.as_object().into_iter().flat_map(Map::values).filter(|v| is_schema(v)) {
                        out.push((v, Edge::InPlace));
                    }
                }
                "properties" => {
                    for (k, v) in value.as_object().into_iter().flatten().filter(|(_, v)| is_schema(v)) {
                        out.push((v, Edge::Member(Member::Name(name(k)))));
                    }
                }
                "patternProperties" => {
                    for v in value.as_object().into_iter().flat_map(Map::values).filter(|v| is_schema(v)) {
                        out.push((v, Edge::Member(Member::AnyName)));
                    }
                }
                "additionalProperties" => one(Edge::Member(Member::NameNotIn(node))),
                "unevaluatedProperties" => one(Edge::Marked(Member::AnyName)),
                "propertyNames" => one(Edge::Member(Member::KeyName)),
                "prefixItems" => {
                    for (i, v) in value.as_array().into_iter().flatten().enumerate().filter(|(_, v)| is_schema(v)) {
                        out.push((v, Edge::Member(Member::Index(id(i)))));
                    }
                }
                "items" => match value {
                    Value::Array(items) => {
                        for (i, v) in items.iter().enumerate().filter(|(_, v)| is_schema(v)) {
                            out.push((v, Edge::Member(Member::Index(id(i)))));
                        }
                    }
                    // Only 2020-12 has `prefixItems`, and its `items` starts after them.
                    _ if draft == Draft::Draft202012 => one(Edge::Member(Member::IndexFrom(len("prefixItems")))),
                    _ => one(Edge::Member(Member::IndexFrom(0))),
                },
                "additionalItems" => one(Edge::Member(Member::IndexFrom(len("items")))),
                "contains" => one(Edge::Marked(Member::IndexFrom(0))),
                "unevaluatedItems" => one(Edge::Marked(Member::IndexFrom(0))),
                _ => {}
            }
        }
    }

    /// What validating one value against `object` costs besides evaluating
    /// it: its comparisons and its passes over the value, as jsonschema
    /// compiles its keywords in `draft`.
    fn own_cost(object: &Map<String, Value>, draft: Draft, steps: &mut Steps) -> Result<Own, String> {
        const KEYWORDS: [&str; 14] = [
            "enum",
            "const",
            "required",
            "dependentRequired",
            "dependencies",
            "multipleOf",
            "pattern",
            "format",
            "contentEncoding",
            "contentMediaType",
            "uniqueItems",
            "patternProperties",
            "minLength",
            "maxLength",
        ];
        let mut own = Own::default();
        let (mut most_compares, mut most_passes) = (0, 0);
        let list = |v: &Value| v.as_array().map_or(0, |a| a.len() as u64);
        for keyword in KEYWORDS {
            let Some(value) = object.get(keyword) else { continue };
            // (comparisons, passes, entries or names for a message)
            let (compares, passes, count) = match keyword {
                // More than 10 strings (and `null`): looked up in a hash
                // set, hashing the text once. Any other: compared entry by
                // entry (integers too, for a value that is not an integer).
                "enum" => {
                    let Some(entries) = value.as_array() else { continue };
                    let n = entries.len() as u64;
                    if entries.len() > 10 && entries.iter().all(|e| e.is_string() || e.is_null()) {
                        (0, 1, n)
                    } else {
                        (size(entries, steps)?, 0, n)
                    }
                }
                "const" => {
                    let n = size(std::slice::from_ref(value), steps)?;
                    (n, 0, n)
                }
                // Each name looked up in the object.
                "required" => (list(value), 0, list(value)),
                "dependentRequired" | "dependencies" => {
                    let n = value.as_object().into_iter().flat_map(Map::values).map(list).sum();
                    (n, 0, n)
                }
                // A fraction: exact arithmetic on big numbers.
                "multipleOf" if value.as_f64().is_some_and(|m| m.fract() != 0.0) => (FRACTIONAL_MULTIPLE_OF, 0, 1),
                "pattern" => (0, value.as_str().map_or(HEAVY, pattern_passes), 1),
                // Asserted in every draft (see `compile_schema`).
                "format" => (0, HEAVY, 1),
                "contentEncoding" | "contentMediaType" if matches!(draft, Draft::Draft6 | Draft::Draft7) => {
                    (0, HEAVY, 1)
                }
                // Hashes every item whole (compares them pairwise up to 15).
                "uniqueItems" if value == &Value::Bool(true) => (0, HEAVY, 1),
                // Counts characters when the byte length cannot tell: only
                // in a text of at most 4 × the limit bytes, so not a pass
                // for a small limit.
                "minLength" | "maxLength" if value.as_u64().is_none_or(|n| n > SHORT) => (0, 1, 1),
                // Every member name against every pattern, and again for
                // `additionalProperties` beside it.
                "patternProperties" => {
                    let Some(patterns) = value.as_object() else { continue };
                    let once = patterns.keys().fold(0u64, |s, p| s.saturating_add(pattern_passes(p)));
                    own.name_passes = (once, patterns.len() as u64);
                    let again = object.get("additionalProperties").is_some_and(|s| s.is_object() || s.is_boolean());
                    (0, once.saturating_mul(1 + u64::from(again)), patterns.len() as u64)
                }
                _ => continue,
            };
            own.compares = own.compares.saturating_add(compares);
            own.passes = own.passes.saturating_add(passes);
            if compares > most_compares {
                most_compares = compares;
                own.compares_by = Some((keyword, count));
            }
            if passes > most_passes {
                most_passes = passes;
                own.passes_by = Some((keyword, count));
            }
        }
        Ok(own)
    }

    /// The passes of one pattern: [`HEAVY`], and one more per 16
    /// alternatives, which jsonschema compares one by one for a pattern
    /// such as `^(a|b|c)$` instead of running a regular expression.
    fn pattern_passes(pattern: &str) -> u64 {
        HEAVY + pattern.bytes().filter(|&b| b == b'|').count() as u64 / 16
    }

    /// The comparisons one `enum` or `const` entry among `values` costs,
    /// summed: one per value and member, and one per 64 bytes of text.
    /// Stops counting past the bound: more is refused anyway.
    fn size(values: &[Value], steps: &mut Steps) -> Result<u64, String> {
        let (mut nodes, mut bytes) = (0u64, 0u64);
        let mut stack: Vec<&Value> = values.iter().collect();
        while let Some(v) = stack.pop() {
            steps.take(1)?;
            nodes += 1;
            match v {
                Value::String(s) => bytes += s.len() as u64,
                Value::Array(a) => stack.extend(a),
                Value::Object(m) => {
                    for (k, v) in m {
                        nodes += 1;
                        bytes += k.len() as u64;
                        stack.push(v);
                    }
                }
                _ => {}
            }
            if nodes + bytes / 64 > MAX_SCHEMA_WORK {
                break;
            }
        }
        Ok(nodes + bytes / 64)
    }

    /// Give every node with `unevaluated*` its marking walk: a copy of each
    /// node below it in place, whose edges go to the node's in-place children
    /// (validated again) and to their copies, and along its `contains` and
    /// `unevaluated*` edges.
    fn add_marking(graph: &mut Graph, steps: &mut Steps) -> Result<(), String> {
        let n = graph.nodes.len();
        let mut copy: Vec<Option<u32>> = vec![None; n];
        let mut stack: Vec<usize> = (0..n).filter(|&v| graph.nodes[v].unevaluated > 0).collect();
        let mut copied = Vec::new();
        while let Some(v) = stack.pop() {
            if copy[v].is_some() {
                continue;
            }
            steps.take(1)?;
            copy[v] = Some(id(n + copied.len()));
            copied.push(v);
            stack.extend(graph.nodes[v].in_place.iter().map(|&c| c as usize).filter(|&c| copy[c].is_none()));
        }
        for &v in &copied {
            let original = &graph.nodes[v];
            let mut in_place = Vec::with_capacity(2 * original.in_place.len());
            for &c in &original.in_place {
                in_place.push(c);
                in_place.extend(copy[c as usize]);
            }
            steps.take(in_place.len())?;
            // The marking walk matches every member name against the
            // node's `patternProperties` again.
            let (passes, patterns) = original.own.name_passes;
            let own =
                Own { passes, passes_by: (passes > 0).then_some(("patternProperties", patterns)), ..Own::default() };
            let node = Node {
                at: original.at,
                base: original.base,
                in_place,
                members: original.marked.clone(),
                copy_of: Some(id(v)),
                own,
                ..Node::default()
            };
            graph.nodes.push(node);
        }
        for v in 0..n {
            if let Some(c) = copy[v] {
                for _ in 0..graph.nodes[v].unevaluated {
                    graph.nodes[v].in_place.push(c);
                }
            }
        }
        Ok(())
    }

    /// The nodes with every in-place child before its parents, or a node on
    /// an in-place cycle.
    fn topological(graph: &Graph, steps: &mut Steps) -> Result<Result<Vec<u32>, u32>, String> {
        const NEW: u8 = 0;
        const OPEN: u8 = 1;
        const DONE: u8 = 2;
        let mut state = vec![NEW; graph.nodes.len()];
        let mut order = Vec::with_capacity(graph.nodes.len());
        let mut stack: Vec<(u32, usize)> = Vec::new();
        for start in 0..graph.nodes.len() {
            if state[start] != NEW {
                continue;
            }
            state[start] = OPEN;
            stack.push((id(start), 0));
            while let Some((v, next)) = stack.last_mut() {
                let v = *v;
                match graph.nodes[v as usize].in_place.get(*next) {
                    Some(&c) => {
                        *next += 1;
                        steps.take(1)?;
                        match state[c as usize] {
                            NEW => {
                                state[c as usize] = OPEN;
                                stack.push((c, 0));
                            }
                            OPEN => return Ok(Err(c)),
                            _ => {}
                        }
                    }
                    None => {
                        state[v as usize] = DONE;
                        order.push(v);
                        stack.pop();
                    }
                }
            }
        }
        Ok(Ok(order))
    }

    /// What validating one value against a node costs, its in-place
    /// children included; saturating.
    #[derive(Clone, Copy, Default)]
    struct Cost {
        /// Evaluations and comparisons: what [`MAX_SCHEMA_WORK`] bounds.
        work: u64,
        /// Evaluations of subschemas alone.
        evaluations: u64,
        /// Passes over the value: what [`MAX_SCHEMA_PASSES`] bounds.
        passes: u64,
    }

    impl Cost {
        fn plus(self, other: Cost, times: u64) -> Cost {
            Cost {
                work: self.work.saturating_add(other.work.saturating_mul(times)),
                evaluations: self.evaluations.saturating_add(other.evaluations.saturating_mul(times)),
                passes: self.passes.saturating_add(other.passes.saturating_mul(times)),
            }
        }

        fn over(self) -> bool {
            self.work > MAX_SCHEMA_WORK || self.passes > MAX_SCHEMA_PASSES
        }
    }

    /// For each node, what validating one value against it costs.
    fn per_value(graph: &Graph, order: &[u32]) -> Vec<Cost> {
        let mut cost = vec![Cost::default(); graph.nodes.len()];
        for &v in order {
            let node = &graph.nodes[v as usize];
            let own = Cost { work: node.own.compares.saturating_add(1), evaluations: 1, passes: node.own.passes };
            cost[v as usize] = node.in_place.iter().fold(own, |s, &c| s.plus(cost[c as usize], 1));
        }
        cost
    }

    /// How one value is reached from its parent, for a message.
    #[derive(Clone, Copy)]
    enum Step {
        Name(u32),
        OtherName,
        Index(u32),
        OtherIndex,
        KeyName,
    }

    /// Subschemas reaching one value, with how many paths reach each: sorted by node.
    type Reaching = Vec<(u32, u64)>;

    /// Follow what reaches a value, member by member, through every state
    /// once; refuse the first whose work is over the bound.
    fn explore(schema: &Value, graph: &Graph, order: &[u32], cost: &[Cost], steps: &mut Steps) -> Result<(), String> {
        let mut rank = vec![0u32; graph.nodes.len()];
        for (i, &v) in order.iter().enumerate() {
            rank[v as usize] = id(i);
        }
        // Each state: what reaches the value, whether it is a member name
        // (a string: no members), and how it was reached.
        let mut states: Vec<(Reaching, bool, Option<(usize, Step)>)> = vec![(vec![(0, 1)], false, None)];
        let mut seen: HashSet<(Reaching, bool)> = HashSet::from([(vec![(0, 1)], false)]);
        let mut queue = VecDeque::from([0usize]);
        let mut count = vec![0u64; graph.nodes.len()];
        let mut stamp = vec![0usize; graph.nodes.len()];
        while let Some(s) = queue.pop_front() {
            let (reaching, key_name, _) = &states[s];
            let total = reaching.iter().fold(Cost::default(), |t, &(v, c)| t.plus(cost[v as usize], c));
            if total.over() {
                return Err(too_much(schema, graph, cost, &states, s, total));
            }
            if *key_name {
                continue;
            }
            // Every node in place below, parents first, with how many paths reach it.
            let mut closure: Vec<u32> = Vec::new();
            let mut stack: Vec<u32> = Vec::new();
            for &(v, c) in reaching {
                if stamp[v as usize] != s + 1 {
                    stamp[v as usize] = s + 1;
                    count[v as usize] = 0;
                    stack.push(v);
                }
                count[v as usize] += c;
            }
            while let Some(v) = stack.pop() {
                closure.push(v);
                for &c in &graph.nodes[v as usize].in_place {
                    if stamp[c as usize] != s + 1 {
                        stamp[c as usize] = s + 1;
                        count[c as usize] = 0;
                        stack.push(c);
                    }
                }
            }
            steps.take(closure.len())?;
            closure.sort_unstable_by_key(|&v| std::cmp::Reverse(rank[v as usize]));
            // `total` bounds every count: no overflow.
            for &v in &closure {
                let c = count[v as usize];
                for &child in &graph.nodes[v as usize].in_place {
                    count[child as usize] += c;
                }
            }
            // What each kind of member receives.
            let (mut named, mut any_name, mut not_in, mut index, mut from, mut key_names) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for &v in &closure {
                let c = count[v as usize];
                steps.take(graph.nodes[v as usize].members.len())?;
                for &(member, target) in &graph.nodes[v as usize].members {
                    match member {
                        Member::Name(n) => named.push((n, target, c)),
                        Member::AnyName => any_name.push((target, c)),
                        Member::NameNotIn(owner) => not_in.push((owner, target, c)),
                        Member::Index(i) => index.push((i, target, c)),
                        Member::IndexFrom(i) => from.push((i, target, c)),
                        Member::KeyName => key_names.push((target, c)),
                    }
                }
            }
            let mut next: Vec<(Vec<(u32, u64)>, bool, Step)> = Vec::new();
            named.sort_unstable_by_key(|&(n, _, _)| n);
            for group in named.chunk_by(|a, b| a.0 == b.0) {
                let name = group[0].0;
                let listed = |owner: u32| graph.nodes[owner as usize].names.binary_search(&name).is_ok();
                steps.take(group.len() + any_name.len() + not_in.len())?;
                let mut r: Vec<(u32, u64)> = group.iter().map(|&(_, t, c)| (t, c)).collect();
                r.extend(&any_name);
                r.extend(not_in.iter().filter(|&&(owner, _, _)| !listed(owner)).map(|&(_, t, c)| (t, c)));
                next.push((r, false, Step::Name(name)));
            }
            let mut r: Vec<(u32, u64)> = any_name.clone();
            r.extend(not_in.iter().map(|&(_, t, c)| (t, c)));
            next.push((r, false, Step::OtherName));
            index.sort_unstable_by_key(|&(i, _, _)| i);
            for group in index.chunk_by(|a, b| a.0 == b.0) {
                let i = group[0].0;
                steps.take(group.len() + from.len())?;
                let mut r: Vec<(u32, u64)> = group.iter().map(|&(_, t, c)| (t, c)).collect();
                r.extend(from.iter().filter(|&&(f, _, _)| f <= i).map(|&(_, t, c)| (t, c)));
                next.push((r, false, Step::Index(i)));
            }
            next.push((from.iter().map(|&(_, t, c)| (t, c)).collect(), false, Step::OtherIndex));
            next.push((key_names, true, Step::KeyName));
            for (mut r, key_name, step) in next {
                if r.is_empty() {
                    continue;
                }
                r.sort_unstable_by_key(|&(t, _)| t);
                let mut merged: Reaching = Vec::with_capacity(r.len());
                for (t, c) in r {
                    match merged.last_mut() {
                        Some((last, total)) if *last == t => *total = total.saturating_add(c),
                        _ => merged.push((t, c)),
                    }
                }
                steps.take(merged.len())?;
                if seen.insert((merged.clone(), key_name)) {
                    states.push((merged, key_name, Some((s, step))));
                    queue.push_back(states.len() - 1);
                }
            }
        }
        Ok(())
    }

    /// Why the state `s` is refused: what validating one value costs is `total`.
    fn too_much(
        schema: &Value,
        graph: &Graph,
        cost: &[Cost],
        states: &[(Reaching, bool, Option<(usize, Step)>)],
        s: usize,
        total: Cost,
    ) -> String {
        let value = path(graph, states, s);
        let dynamic = if graph.dynamic {
            " (a `$dynamicRef` or `$recursiveRef` counts here as reaching every anchor it could resolve to, \
             which makes a reference to the draft 2020-12 meta-schema too costly: to accept any JSON Schema, \
             declare `{\"type\": [\"object\", \"boolean\"]}` instead)"
        } else {
            ""
        };
        let reaching = &states[s].0;
        let by_work = total.work > MAX_SCHEMA_WORK;
        let over = |c: &Cost| if by_work { c.work > MAX_SCHEMA_WORK } else { c.passes > MAX_SCHEMA_PASSES };
        // One subschema costs too much by itself: where, the lowest node over the bound.
        let alone = reaching.iter().find(|&&(v, _)| over(&cost[v as usize])).map(|&(entry, _)| {
            let mut v = entry;
            while let Some(&c) = graph.nodes[v as usize].in_place.iter().find(|&&c| over(&cost[c as usize])) {
                v = c;
            }
            (entry, v)
        });
        if !by_work {
            return too_many_passes(schema, graph, cost, reaching, alone, &value, total.passes, dynamic);
        }
        let comparisons = |c: Cost| {
            let compares = c.work - c.evaluations;
            if compares == 0 {
                String::new()
            } else {
                format!(
                    " and makes {} comparisons (`enum`, `const`, `required`…), {} in all,",
                    many(compares),
                    many(c.work)
                )
            }
        };
        let Some((entry, v)) = alone else {
            let (most, paths) = reaching.iter().copied().max_by_key(|&(_, c)| c).unwrap_or((0, 0));
            let most = graph.nodes[most as usize].copy_of.unwrap_or(most);
            return format!(
                "validating {value} evaluates {} subschemas{}, more than the {MAX_SCHEMA_WORK} allowed per value: \
                 {paths} paths through the levels above it reach {} (several branches of an `anyOf`/`oneOf`/`allOf` \
                 at a level declare the same member, and each evaluates it again, so the count multiplies with each \
                 level of nesting){dynamic}; let the branches share one declaration of what they have in common (move \
                 a property that several branches declare out of the `anyOf`/`oneOf`, into the schema around it) or \
                 merge them",
                many(total.evaluations),
                comparisons(total),
                where_is(schema, graph, most),
            );
        };
        let node = &graph.nodes[v as usize];
        let whole = if node.copy_of.unwrap_or(v) == entry {
            String::new()
        } else {
            format!(" (from {}: {})", where_is(schema, graph, entry), many(cost[entry as usize].work))
        };
        let at = where_is(schema, graph, node.copy_of.unwrap_or(v));
        let lists = "jsonschema looks up an `enum` of more than 10 strings (and `null`) at once, but compares the \
                     value with every entry of any other `enum` (numbers too) or `const`, and looks up every name \
                     of a `required` or `dependentRequired` list, each time the subschema applies";
        let fewer = "list fewer entries, or check the value another way (`type`, `minimum`/`maximum`, `pattern`, \
                     or an `enum` of strings only)";
        if node.own.compares >= MAX_SCHEMA_WORK {
            let what = match node.own.compares_by {
                Some(("enum", n)) => format!("the {n} entries of its `enum`"),
                Some(("const", n)) => {
                    let n = if n > MAX_SCHEMA_WORK { format!("more than {MAX_SCHEMA_WORK}") } else { n.to_string() };
                    format!("its `const`, of {n} values, members and 64-byte blocks of text")
                }
                Some((keyword, n)) => format!("the {n} names of its `{keyword}`"),
                None => "its lists".into(),
            };
            return format!(
                "validating {value} against {at} compares it with {what} one by one, more than the \
                 {MAX_SCHEMA_WORK} comparisons and evaluations allowed per value{whole}: {lists}; {fewer}"
            );
        }
        let (c, e) = (cost[v as usize].work - cost[v as usize].evaluations, cost[v as usize].evaluations);
        if c > e {
            return format!(
                "validating {value} against {at} makes {} comparisons with the entries of the `enum`, `const` and \
                 `required` lists of the subschemas below it and evaluates {} subschemas, more than the \
                 {MAX_SCHEMA_WORK} allowed per value{whole}: {lists}, and a list is compared again each time a branch \
                 or reference applies it{dynamic}; apply fewer lists to one value (merge the branches that repeat \
                 them), or {fewer}",
                many(c),
                many(e),
            );
        }
        format!(
            "validating {value} against {at} evaluates {} subschemas{}{whole}, more than the {MAX_SCHEMA_WORK} allowed \
             per value: a definition is referenced from several branches (`anyOf`, `oneOf`, `allOf`, \
             `if`/`then`/`else`, or below `unevaluatedProperties`/`unevaluatedItems`, which evaluate every \
             branch again) at many levels, and each reference evaluates it again, so the cost multiplies with \
             each level{dynamic}; reference it from fewer places (merge the branches that reference the same \
             definition) or inline a simpler schema",
            many(e),
            comparisons(cost[v as usize]),
        )
    }

    /// Why a value is refused for the passes over it, `total`; `alone` is
    /// the subschema reaching it that is over the bound by itself (and the
    /// lowest node below it that is), if any.
    #[allow(clippy::too_many_arguments)]
    fn too_many_passes(
        schema: &Value,
        graph: &Graph,
        cost: &[Cost],
        reaching: &Reaching,
        alone: Option<(u32, u32)>,
        value: &str,
        total: u64,
        dynamic: &str,
    ) -> String {
        let (at, why) = match alone {
            Some((entry, v)) => {
                let node = &graph.nodes[v as usize];
                let at = where_is(schema, graph, node.copy_of.unwrap_or(v));
                let whole = if node.copy_of.unwrap_or(v) == entry {
                    String::new()
                } else {
                    format!(", from {}: {}", where_is(schema, graph, entry), many(cost[entry as usize].passes))
                };
                let why = match node.own.passes_by {
                    Some(("patternProperties", n)) if node.own.passes.saturating_mul(2) >= cost[v as usize].passes => {
                        format!(
                            "its `patternProperties` matches every member name against each of its {n} patterns, \
                             and again for an `additionalProperties` or `unevaluatedProperties` beside it"
                        )
                    }
                    Some(("pattern", _)) if node.own.passes > MAX_SCHEMA_PASSES => {
                        "its `pattern` lists so many alternatives that each is compared in turn".into()
                    }
                    _ => format!("the subschemas below it apply {} passes", many(cost[v as usize].passes)),
                };
                (format!(" against {at}"), format!("{why}{whole}"))
            }
            None => {
                let (most, paths) =
                    reaching.iter().copied().max_by_key(|&(v, c)| (c, cost[v as usize].passes)).unwrap_or((0, 0));
                let most = graph.nodes[most as usize].copy_of.unwrap_or(most);
                let by = if paths > 1 { format!(" by {paths} paths") } else { String::new() };
                let why = format!(
                    "{} subschemas reach it, such as {}{by}: several branches of an `anyOf`/`oneOf`/`allOf` \
                     declare the same member, each with its own patterns, or reach it again at each level of nesting",
                    reaching.len(),
                    where_is(schema, graph, most)
                );
                (String::new(), why)
            }
        };
        format!(
            "validating {value}{at} reads its text, member names or items {} times over, more than the \
             {MAX_SCHEMA_PASSES} allowed per value ({why}{dynamic}): each `pattern`, `patternProperties` pattern, \
             `uniqueItems`, `format`, and in drafts 4 to 7 `contentEncoding` and `contentMediaType` counts {HEAVY} \
             (a regular expression or parser runs over the whole text, which can be megabytes), each `minLength` or \
             `maxLength` over 64 and `enum` of strings one; match one value against fewer patterns and formats (merge \
             patterns into one, such as `^(?:a|b)$`; keep them out of branches and definitions that apply to the \
             same value several times; write a long list of literals as an `enum` of strings)",
            many(total),
        )
    }

    /// `n` for a message; a saturated count is only a lower bound.
    fn many(n: u64) -> String {
        match n {
            u64::MAX => "more than 2^63".into(),
            n if n >= 1 << 40 => format!("about 2^{}", (n as f64).log2().round()),
            n => n.to_string(),
        }
    }

    /// The value state `s` stands for, as a path from the whole value.
    fn path(graph: &Graph, states: &[(Reaching, bool, Option<(usize, Step)>)], mut s: usize) -> String {
        let mut steps = Vec::new();
        while let Some((parent, step)) = states[s].2 {
            steps.push(step);
            s = parent;
        }
        if steps.is_empty() {
            return "one value".into();
        }
        let mut out = String::new();
        let mut name_of = false;
        for step in steps.iter().rev() {
            match step {
                Step::Name(n) => {
                    out.push('/');
                    out.push_str(&graph.names[*n as usize].replace('~', "~0").replace('/', "~1"));
                }
                Step::Index(i) => out.push_str(&format!("/{i}")),
                Step::OtherName | Step::OtherIndex => out.push_str("/*"),
                Step::KeyName => name_of = true,
            }
        }
        let out = super::shown(&out);
        match (name_of, out.is_empty()) {
            (true, true) => "the name of a member of the whole value".into(),
            (true, false) => format!("the name of a member of `{out}`"),
            (false, _) => format!("the value at `{out}`"),
        }
    }

    /// Where node `v` is: a JSON Pointer into `schema`, or the document it is in.
    fn where_is(schema: &Value, graph: &Graph, v: u32) -> String {
        let node = &graph.nodes[v as usize];
        // Each value seen: its parent's entry and its key; linear in the schema.
        let mut seen: Vec<(usize, String)> = vec![(usize::MAX, String::new())];
        let mut stack: Vec<(&Value, usize)> = vec![(schema, 0)];
        while let Some((value, entry)) = stack.pop() {
            if std::ptr::from_ref(value) as usize == node.at {
                let mut keys = Vec::new();
                let mut e = entry;
                while e != 0 {
                    keys.push(seen[e].1.replace('~', "~0").replace('/', "~1"));
                    e = seen[e].0;
                }
                if keys.is_empty() {
                    return "the schema's root".into();
                }
                let pointer: String = keys.iter().rev().map(|k| format!("/{k}")).collect();
                return format!("`{}`", super::shown(&pointer));
            }
            let mut child = |key: String, v| {
                seen.push((entry, key));
                stack.push((v, seen.len() - 1));
            };
            match value {
                Value::Object(m) => m.iter().for_each(|(k, v)| child(k.clone(), v)),
                Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| child(i.to_string(), v)),
                _ => {}
            }
        }
        format!("a subschema of `{}`", super::shown(graph.bases.get(node.base as usize).map_or("", String::as_str)))
    }
}

struct Scan<'a> {
    metadata: Vec<&'a [u8]>,
    pinned: Vec<&'a [u8]>,
    exports_tool: bool,
}

/// Walk the component's top-level sections only.
fn scan(bytes: &[u8]) -> Result<Scan<'_>, DescriptorError> {
    if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
        return Err(DescriptorError::NotWasm);
    }
    let mut parser = Parser::new(0);
    let mut offset = 0usize;
    let mut out = Scan { metadata: Vec::new(), pinned: Vec::new(), exports_tool: false };
    let tool_export = format!("{WIT_PACKAGE}/tool@");
    loop {
        let rest = bytes.get(offset..).unwrap_or_default();
        let (consumed, payload) = match parser.parse(rest, true) {
            Ok(Chunk::Parsed { consumed, payload }) => (consumed, payload),
            Ok(Chunk::NeedMoreData(_)) => {
                return Err(DescriptorError::Malformed("unexpected end of file".into()));
            }
            Err(e) => return Err(DescriptorError::Malformed(e.message().to_owned())),
        };
        offset += consumed;
        match payload {
            Payload::Version { encoding: Encoding::Module, .. } => {
                return Err(DescriptorError::CoreModule);
            }
            Payload::ModuleSection { unchecked_range, .. } | Payload::ComponentSection { unchecked_range, .. } => {
                // Nested modules are the guest's code: skip without parsing
                // (the outer parser resumes after the nested range).
                offset += unchecked_range.end - unchecked_range.start;
                if offset > bytes.len() {
                    return Err(DescriptorError::Malformed("unexpected end of file".into()));
                }
            }
            Payload::CustomSection(c) if c.name() == METADATA_SECTION => out.metadata.push(c.data()),
            Payload::CustomSection(c) if c.name() == PINNED_SECTION => out.pinned.push(c.data()),
            Payload::ComponentExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(|e| DescriptorError::Malformed(e.message().to_owned()))?;
                    if let Some(version) = export.name.name.strip_prefix(&tool_export) {
                        if !same_line(version, WIT_VERSION) {
                            return Err(DescriptorError::IncompatibleWit { found: format!("{WIT_PACKAGE}@{version}") });
                        }
                        out.exports_tool = true;
                    }
                }
            }
            Payload::End(_) => return Ok(out),
            _ => {}
        }
    }
}

/// The component's own pinned data: its one top-level `toolgate-pinned`
/// section, or nothing. Served back to it by the `pinned` import.
pub fn read_pinned(bytes: &[u8]) -> Result<Vec<u8>, DescriptorError> {
    pinned_of(&scan(bytes)?)
}

fn pinned_of(scan: &Scan<'_>) -> Result<Vec<u8>, DescriptorError> {
    match scan.pinned.as_slice() {
        [] => Ok(Vec::new()),
        [one] if one.len() > MAX_PINNED_BYTES => Err(DescriptorError::PinnedTooLarge(one.len())),
        [one] => Ok(one.to_vec()),
        many => Err(DescriptorError::DuplicatePinned(many.len())),
    }
}

/// The component bytes with `doc` as its one metadata section (replacing any
/// earlier one). Used by `toolgate pack`.
pub fn embed_metadata(component: &[u8], doc: &ComponentMetadata) -> Result<Vec<u8>, DescriptorError> {
    let json = serde_json::to_vec(doc).map_err(|e| DescriptorError::BadMetadata(e.to_string()))?;
    if json.len() > MAX_METADATA_BYTES {
        return Err(DescriptorError::MetadataTooLarge(json.len()));
    }
    embed_section(component, METADATA_SECTION, &json)
}

/// The component bytes with `data` as its one pinned-data section (replacing
/// any earlier one), refused over [`MAX_PINNED_BYTES`] as a host would refuse
/// it. Used by `toolgate skill pack` and `toolgate mcp import`.
pub fn embed_pinned(component: &[u8], data: &[u8]) -> Result<Vec<u8>, DescriptorError> {
    if data.len() > MAX_PINNED_BYTES {
        return Err(DescriptorError::PinnedTooLarge(data.len()));
    }
    embed_section(component, PINNED_SECTION, data)
}

/// The component bytes with `data` as its one top-level custom section
/// `name` (replacing any earlier one); every other section verbatim.
pub fn embed_section(component: &[u8], name: &str, data: &[u8]) -> Result<Vec<u8>, DescriptorError> {
    let mut out = Vec::with_capacity(component.len() + data.len() + 32);
    let mut parser = Parser::new(0);
    let mut offset = 0usize;
    loop {
        let rest = component.get(offset..).unwrap_or_default();
        let (consumed, payload) = match parser.parse(rest, true) {
            Ok(Chunk::Parsed { consumed, payload }) => (consumed, payload),
            Ok(Chunk::NeedMoreData(_)) => {
                return Err(DescriptorError::Malformed("unexpected end of file".into()));
            }
            Err(e) => return Err(DescriptorError::Malformed(e.message().to_owned())),
        };
        let start = offset;
        offset += consumed;
        match payload {
            Payload::Version { encoding: Encoding::Module, .. } => return Err(DescriptorError::CoreModule),
            Payload::Version { .. } => out.extend_from_slice(slice(component, start, offset)?),
            Payload::ModuleSection { unchecked_range, .. } | Payload::ComponentSection { unchecked_range, .. } => {
                offset += unchecked_range.end - unchecked_range.start;
                out.extend_from_slice(slice(component, start, offset)?);
            }
            Payload::CustomSection(c) if c.name() == name => {}
            Payload::End(_) => break,
            _ => out.extend_from_slice(slice(component, start, offset)?),
        }
    }
    let section = wasm_encoder::CustomSection { name: name.into(), data: std::borrow::Cow::Borrowed(data) };
    wasm_encoder::ComponentSection::append_to_component(&section, &mut out);
    Ok(out)
}

fn slice(bytes: &[u8], start: usize, end: usize) -> Result<&[u8], DescriptorError> {
    bytes.get(start..end).ok_or_else(|| DescriptorError::Malformed("section extends past the end of the file".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};
    use wasm_encoder::{
        Component, ComponentExportKind, ComponentExportSection, CustomSection, Module, ModuleSection,
        NestedComponentSection,
    };

    const TOOL_EXPORT: &str = "toolgate:plugin/tool@0.1.0";

    fn custom(name: &str, data: &[u8]) -> CustomSection<'static> {
        CustomSection { name: name.to_owned().into(), data: data.to_vec().into() }
    }

    /// A component with a nested core module and a nested component (each
    /// carrying a decoy metadata section that must be skipped), optionally
    /// exporting `export`, with one top-level custom section per entry of `metadata`.
    fn component_with(metadata: &[&[u8]], export: Option<&str>) -> Vec<u8> {
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

    fn valid_component() -> Vec<u8> {
        let meta = serde_json::to_vec(&doc(vec![tool("text.upper")])).unwrap();
        component_with(&[&meta], Some(TOOL_EXPORT))
    }

    /// An `x-mcp-header` annotation (MCP 2026-07-28) is held at load to the
    /// rules clients hold it to — the Python SDK drops a tool that breaks
    /// one from the list without a word, so the model would never see it:
    /// refused naming the tool and property. Valid ones load. Fails on the
    /// previous code (every one loaded).
    #[test]
    fn an_mcp_header_annotation_is_held_to_the_rules_clients_hold_it_to() {
        let with = |props: Value| {
            let mut t = tool("t.x");
            t["descriptor"]["input_schema"] = json!({ "type": "object", "properties": props });
            t["descriptor"]["primary_argument"] = Value::Null;
            check_document(serde_json::from_value(doc(vec![t])).unwrap())
        };
        let ok = json!({
            "region": { "type": "string", "x-mcp-header": "Region" },
            "opts": { "type": "object", "properties": { "dry": { "type": "boolean", "x-mcp-header": "Dry-Run" } } },
            "note": { "type": "string", "description": "mentions x-mcp-header", "examples": [{ "x-mcp-header": 1 }] }
        });
        assert!(with(ok).is_ok());
        for (props, words) in [
            (json!({ "a": { "type": "string", "x-mcp-header": "two words" } }), "not an HTTP header token"),
            (json!({ "a": { "type": "string", "x-mcp-header": "" } }), "not an HTTP header token"),
            (json!({ "a": { "type": "string", "x-mcp-header": 7 } }), "must be a string"),
            (json!({ "a": { "type": "array", "x-mcp-header": "A" } }), "only allowed on"),
            (json!({ "a": { "type": ["string", "null"], "x-mcp-header": "A" } }), "only allowed on"),
            (
                json!({ "a": { "type": "string", "x-mcp-header": "Tag" }, "b": { "type": "string", "x-mcp-header": "tag" } }),
                "also on property",
            ),
            (
                json!({ "a": { "type": "array", "items": { "type": "string", "x-mcp-header": "A" } } }),
                "outside a property",
            ),
            (json!({ "a": { "anyOf": [{ "type": "string", "x-mcp-header": "A" }] } }), "outside a property"),
        ] {
            let e = with(props.clone()).unwrap_err().to_string();
            assert!(e.contains("t.x") && e.contains(words), "{props}: {e}");
        }
        let mut root = tool("t.x");
        root["descriptor"]["input_schema"]["x-mcp-header"] = json!("Root");
        let e = check_document(serde_json::from_value(doc(vec![root])).unwrap()).unwrap_err().to_string();
        assert!(e.contains("outside a property"), "{e}");
    }

    /// Pinned data is the component's own top-level section only: a nested
    /// decoy is not it, a second one is refused, re-embedding replaces it, and
    /// none reads as empty.
    #[test]
    fn pinned_data_is_the_one_top_level_section() {
        let base = valid_component();
        assert_eq!(read_component(&base).unwrap().1, b"");
        let mut nested = Component::new();
        let mut module = Module::new();
        module.section(&custom(PINNED_SECTION, b"decoy"));
        nested.section(&ModuleSection(&module));
        let with_decoy = [base.clone(), nested.finish()[8..].to_vec()].concat();
        assert_eq!(read_pinned(&with_decoy).unwrap(), b"", "a nested section is the guest's code, not pinned data");
        let once = embed_section(&base, PINNED_SECTION, b"first").unwrap();
        let (tools, pinned) = read_component(&once).unwrap();
        assert_eq!((tools.len(), pinned.as_slice()), (1, &b"first"[..]));
        let replaced = embed_section(&once, PINNED_SECTION, b"second").unwrap();
        assert_eq!(read_pinned(&replaced).unwrap(), b"second");
        let mut twice = once.clone();
        wasm_encoder::ComponentSection::append_to_component(&custom(PINNED_SECTION, b"other"), &mut twice);
        assert_eq!(read_component(&twice).unwrap_err(), DescriptorError::DuplicatePinned(2));
        assert!(DescriptorError::DuplicatePinned(2).to_string().contains("toolgate skill pack"));
    }

    /// The pinned section is handed to the component whole at every call,
    /// a copy on the host outside the guest's memory limit, and held in every
    /// catalog generation: over the cap it is refused at load, naming the
    /// file and the cap, as oversized metadata is; at the cap it loads.
    #[test]
    fn a_pinned_section_over_the_cap_is_refused_at_load_naming_the_file_and_the_cap() {
        const CAP: usize = MAX_PINNED_BYTES;
        let dir = tempfile::tempdir().unwrap();
        let with = |id: &str, len: usize| {
            let meta = serde_json::to_vec(&doc(vec![tool(id)])).unwrap();
            embed_section(&component_with(&[&meta], Some(TOOL_EXPORT)), PINNED_SECTION, &vec![b'x'; len]).unwrap()
        };
        std::fs::write(dir.path().join("at-cap.wasm"), with("t.at", CAP)).unwrap();
        std::fs::write(dir.path().join("over.wasm"), with("t.over", CAP + 1)).unwrap();
        let catalog = crate::catalog::Catalog::load(dir.path()).unwrap();
        let [refused] = catalog.refused() else { panic!("{:?}", catalog.refused()) };
        assert!(refused.path.ends_with("over.wasm"), "{refused:?}");
        for words in [PINNED_SECTION, &format!("{} bytes", CAP + 1), "more than the 8 MiB", "toolgate skill pack"] {
            assert!(refused.reason.contains(words), "{:?} lacks {words:?}", refused.reason);
        }
        assert!(catalog.get("t.over").is_none());
        let Some(crate::catalog::Availability::Installed(at_cap)) = catalog.get("t.at") else { panic!("at the cap") };
        assert_eq!(at_cap.component.pinned.len(), CAP);
        // What packs it refuses the same.
        let base = valid_component();
        assert_eq!(read_pinned(&embed_pinned(&base, &vec![b'x'; CAP]).unwrap()).unwrap().len(), CAP);
        assert_eq!(embed_pinned(&base, &vec![b'x'; CAP + 1]).unwrap_err(), DescriptorError::PinnedTooLarge(CAP + 1));
    }

    fn read_doc(doc: &Value) -> Result<Vec<Arc<CheckedTool>>, DescriptorError> {
        read_metadata(&component_with(&[&serde_json::to_vec(doc).unwrap()], Some(TOOL_EXPORT)))
    }

    /// The error of a document whose single tool is `tool("t.x")` changed by `edit`.
    fn tool_error(edit: impl FnOnce(&mut Value)) -> DescriptorError {
        let mut t = tool("t.x");
        edit(&mut t);
        read_doc(&doc(vec![t])).expect_err("tool must be refused")
    }

    #[test]
    fn reads_a_valid_component() {
        let tools = read_metadata(&valid_component()).unwrap();
        assert_eq!(tools.len(), 1);
        let t = &tools[0];
        assert_eq!(t.id(), "text.upper");
        assert_eq!(t.metadata.descriptor.primary_argument.as_deref(), Some("text"));
        assert!(t.validate_arguments(&json!({ "text": "hi" })).is_ok());
        let e = t.validate_arguments(&json!({ "text": 5 })).unwrap_err();
        assert!(e.contains("text.upper") && e.contains("/text"), "{e}");
        let e = t.validate_arguments(&json!({ "text": "a", "x": 1 })).unwrap_err();
        assert!(e.contains("text.upper"), "{e}");
    }

    #[test]
    fn refuses_files_that_are_not_tool_components() {
        let meta = serde_json::to_vec(&doc(vec![tool("a.b")])).unwrap();
        let cases: Vec<(&str, Vec<u8>, fn(&DescriptorError) -> bool)> = vec![
            ("empty", vec![], |e| *e == DescriptorError::NotWasm),
            ("magic only", b"\0asm".to_vec(), |e| *e == DescriptorError::NotWasm),
            ("text", b"hello world, not wasm".to_vec(), |e| *e == DescriptorError::NotWasm),
            ("core module", Module::new().finish(), |e| *e == DescriptorError::CoreModule),
            ("bad version", b"\0asm\x02\0\0\0".to_vec(), |e| matches!(e, DescriptorError::Malformed(_))),
            ("header only", Component::new().finish(), |e| *e == DescriptorError::MissingMetadata),
            ("no metadata", component_with(&[], Some(TOOL_EXPORT)), |e| *e == DescriptorError::MissingMetadata),
            ("two metadata", component_with(&[&meta, &meta], Some(TOOL_EXPORT)), |e| {
                *e == DescriptorError::DuplicateMetadata(2)
            }),
            ("no export", component_with(&[&meta], None), |e| *e == DescriptorError::MissingExport),
            ("other export", component_with(&[&meta], Some("toolgate:plugin/other@0.1.0")), |e| {
                *e == DescriptorError::MissingExport
            }),
            (
                "export 0.2",
                component_with(&[&meta], Some("toolgate:plugin/tool@0.2.0")),
                |e| matches!(e, DescriptorError::IncompatibleWit { found } if found == "toolgate:plugin@0.2.0"),
            ),
            ("too large", component_with(&[&vec![b' '; MAX_METADATA_BYTES + 1]], Some(TOOL_EXPORT)), |e| {
                *e == DescriptorError::MetadataTooLarge(MAX_METADATA_BYTES + 1)
            }),
            ("not json", component_with(&[b"{not json"], Some(TOOL_EXPORT)), |e| {
                matches!(e, DescriptorError::BadMetadata(_))
            }),
            ("truncated", valid_component()[..20].to_vec(), |e| matches!(e, DescriptorError::Malformed(_))),
        ];
        for (name, bytes, ok) in cases {
            let err = read_metadata(&bytes).expect_err(name);
            assert!(ok(&err), "{name}: unexpected error {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn refuses_bad_documents() {
        let wit = format!("{WIT_PACKAGE}@{WIT_VERSION}");
        let cases: Vec<(&str, Value, fn(&DescriptorError) -> bool)> = vec![
            ("format 2", json!({"format": 2, "wit": wit, "sdk": "9", "tools": [], "new_field": 1}), |e| {
                *e == DescriptorError::UnsupportedFormat { found: 2 }
            }),
            (
                "wit 0.2",
                json!({"format": 1, "wit": "toolgate:plugin@0.2.0", "sdk": "0", "tools": []}),
                |e| matches!(e, DescriptorError::IncompatibleWit { found } if found == "toolgate:plugin@0.2.0"),
            ),
            (
                "unknown field",
                json!({"format": 1, "wit": wit, "sdk": "0", "tools": [], "x": 1}),
                |e| matches!(e, DescriptorError::BadMetadata(m) if m.contains("x")),
            ),
            ("no tools", doc(vec![]), |e| *e == DescriptorError::NoTools),
            (
                "too many tools",
                doc((0..=MAX_TOOLS_PER_COMPONENT).map(|i| tool(&format!("t{i}"))).collect()),
                |e| matches!(e, DescriptorError::BadMetadata(m) if m.contains("257 tools")),
            ),
            (
                "duplicate id",
                doc(vec![tool("a.b"), tool("a.b")]),
                |e| matches!(e, DescriptorError::BadTool { id, problem } if id == "a.b" && problem.contains("twice")),
            ),
            ("bad id", doc(vec![tool("1abc")]), |e| matches!(e, DescriptorError::BadTool { id, .. } if id == "1abc")),
        ];
        for (name, d, ok) in cases {
            let err = read_doc(&d).expect_err(name);
            assert!(ok(&err), "{name}: unexpected error {err:?}");
        }
    }

    #[test]
    fn refuses_bad_tools_naming_them() {
        let cases: Vec<(&str, fn(&mut Value), &str)> = vec![
            ("empty description", |t| t["descriptor"]["description"] = json!("  "), "empty description"),
            (
                "long description",
                |t| t["descriptor"]["description"] = json!("x".repeat(MAX_DESCRIPTION_LEN + 1)),
                "longer",
            ),
            ("array root", |t| t["descriptor"]["input_schema"] = json!({"type": "array"}), "type: object"),
            ("no type", |t| t["descriptor"]["input_schema"] = json!({}), "type: object"),
            ("bool schema", |t| t["descriptor"]["input_schema"] = json!(true), "type: object"),
            (
                "invalid schema",
                |t| t["descriptor"]["input_schema"]["properties"]["text"]["type"] = json!(42),
                "input schema",
            ),
            (
                "unknown $schema",
                |t| t["descriptor"]["input_schema"]["$schema"] = json!("https://example.com/s"),
                "$schema",
            ),
            ("non-string $schema", |t| t["descriptor"]["input_schema"]["$schema"] = json!(7), "$schema"),
            ("bad output", |t| t["descriptor"]["output_schema"] = json!({"type": "nope"}), "output schema"),
            ("primary missing", |t| t["descriptor"]["primary_argument"] = json!("path"), "primary argument `path`"),
            (
                "relative dir",
                |t| t["capabilities"] = json!({"directories": [{"path": "data", "access": "read"}]}),
                "absolute",
            ),
            (
                "dotdot dir",
                |t| t["capabilities"] = json!({"directories": [{"path": "/data/../etc", "access": "read"}]}),
                "absolute",
            ),
            (
                "bad regex",
                |t| t["descriptor"]["input_schema"]["properties"]["text"]["pattern"] = json!("(unclosed"),
                "input schema",
            ),
        ];
        for (name, edit, words) in cases {
            match tool_error(edit) {
                DescriptorError::BadTool { id, problem } => {
                    assert_eq!(id, "t.x", "{name}");
                    assert!(problem.contains(words), "{name}: {problem:?} lacks {words:?}");
                }
                other => panic!("{name}: expected BadTool, got {other:?}"),
            }
        }
    }

    #[test]
    fn hostile_schemas_are_refused_or_compiled_without_panicking() {
        // A remote `$ref` cannot be resolved (no network resolver compiled in):
        // it must be refused, not fetched.
        let err = tool_error(|t| {
            t["descriptor"]["input_schema"]["properties"]["text"] = json!({"$ref": "https://example.com/schema.json"})
        });
        assert!(matches!(err, DescriptorError::BadTool { .. }), "{err:?}");
        let err =
            tool_error(|t| t["descriptor"]["input_schema"]["properties"]["text"] = json!({"$ref": "#/$defs/missing"}));
        assert!(matches!(err, DescriptorError::BadTool { .. }), "{err:?}");
        // Self-reference and a decoy `$schema` in a subschema must not panic.
        for edit in [
            (|t: &mut Value| t["descriptor"]["input_schema"]["properties"]["text"] = json!({"$ref": "#"}))
                as fn(&mut Value),
            |t| t["descriptor"]["input_schema"]["$defs"] = json!({"x": {"$schema": "https://example.com/unknown"}}),
            |t| t["descriptor"]["input_schema"]["properties"]["text"] = json!({"$id": "urn:x", "$ref": "urn:x"}),
        ] {
            let mut t = tool("t.x");
            edit(&mut t);
            if let Ok(tools) = read_doc(&doc(vec![t])) {
                let _ = tools[0].validate_arguments(&json!({"text": {"deep": [1, 2, 3]}}));
            }
        }
    }

    /// The reported schema: a definition referenced twice from each of
    /// `levels` nested `anyOf`s, so validating one string evaluates it
    /// ~2^levels times (compiling stays linear: references are compiled once).
    fn fan_out(levels: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..levels {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            defs.insert(format!("d{i}"), json!({"anyOf": [next.clone(), next]}));
        }
        defs.insert(format!("d{levels}"), json!({"type": "string", "minLength": 1}));
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    /// An input schema with the object root the host requires, `text` given `schema`.
    fn text_is(schema: Value) -> impl FnOnce(&mut Value) {
        move |t: &mut Value| {
            let mut schema = schema;
            let defs = schema.as_object_mut().and_then(|m| m.remove("$defs"));
            let input = &mut t["descriptor"]["input_schema"];
            input["properties"]["text"] = schema;
            if let Some(defs) = defs {
                input["$defs"] = defs;
            }
            t["descriptor"]["primary_argument"] = Value::Null;
        }
    }

    fn refusal(edit: impl FnOnce(&mut Value)) -> String {
        match tool_error(edit) {
            DescriptorError::BadTool { id, problem } if id == "t.x" => problem,
            other => panic!("expected a refused tool `t.x`, got {other:?}"),
        }
    }

    /// A schema can make validating one value cost exponential time (in its
    /// size or in the value's nesting) although it is small and compiles at
    /// once; validation runs on the host's thread, on arguments before the
    /// gate and on output after the guest's deadline. Such a schema is
    /// refused at load, naming the Tool, which schema, where in it, and what
    /// to do — for every way found to multiply the work: references from
    /// several branches, the same through members at each level of nesting,
    /// `unevaluatedProperties` (which evaluates its branches again), and an
    /// in-place cycle. The catalog names the file.
    #[test]
    fn schemas_that_make_validation_exponential_are_refused_at_load_naming_the_schema() {
        // 18 levels: the code before this check loaded it, and then one
        // argument took seconds to validate (2^18 evaluations in a debug
        // build; 60 levels never end).
        let mut t = tool("t.x");
        text_is(fan_out(18))(&mut t);
        match read_doc(&doc(vec![t])) {
            Err(DescriptorError::BadTool { problem, .. }) => assert!(problem.contains("`/$defs/d6`"), "{problem}"),
            Err(other) => panic!("{other:?}"),
            Ok(tools) => {
                let started = std::time::Instant::now();
                let verdict = tools[0].validate_arguments(&json!({"text": ""}));
                panic!("loaded; validating one argument took {:?} ({verdict:?})", started.elapsed());
            }
        }
        // The report: 60 levels, 2^60 evaluations validating "".
        let problem = refusal(|t| t["descriptor"]["output_schema"] = fan_out(60));
        for words in [
            "output schema: validating one value against `/$defs/d48` evaluates 16381 subschemas \
             (from the schema's root: about 2^62), more than the 10000 allowed per value",
            "a definition is referenced from several branches",
            "reference it from fewer places",
        ] {
            assert!(problem.contains(words), "{problem:?} lacks {words:?}");
        }
        let problem = refusal(text_is(fan_out(60)));
        assert!(
            problem.starts_with("input schema: validating the value at `/text` against `/$defs/d48` evaluates 16381"),
            "{problem}"
        );

        // The bound is exact: 11 levels cost 8,190 evaluations, 12 levels 16,382.
        let tools = read_doc(&doc(vec![{
            let mut t = tool("t.x");
            t["descriptor"]["output_schema"] = fan_out(11);
            t
        }]))
        .expect("under the bound");
        assert!(tools[0].validate_output(&json!("x")).is_ok());
        assert!(tools[0].validate_output(&json!("")).is_err());
        assert!(refusal(|t| t["descriptor"]["output_schema"] = fan_out(12)).contains("16381 subschemas"));

        // Each level cheap, but 8 branches deliver the same definition to
        // each item, at every level of nesting: 8^depth (before: 6 levels, 13 s).
        let branches: Vec<Value> = (0..8).map(|_| json!({"$ref": "#/$defs/list"})).collect();
        let problem = refusal(text_is(json!({
            "$ref": "#/$defs/tree",
            "$defs": {"tree": {"anyOf": branches}, "list": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}
        })));
        for words in [
            "input schema: validating the value at `/text/*/*/*/*` evaluates 73728 subschemas",
            "4096 paths through the levels above it reach `/$defs/list/items`",
            "move a property that several branches declare out of the `anyOf`/`oneOf`",
        ] {
            assert!(problem.contains(words), "{problem:?} lacks {words:?}");
        }
        // The same with two variants of a tagged union that both declare
        // `children` (2^depth; before: 16 levels, 4 s).
        let variant = |tag: &str| {
            json!({"type": "object", "required": ["kind"], "properties": {
                "kind": {"const": tag}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }})
        };
        let problem = refusal(|t| {
            t["descriptor"]["output_schema"] =
                json!({"$ref": "#/$defs/node", "$defs": {"node": {"oneOf": [variant("a"), variant("b")]}}})
        });
        assert!(problem.contains("output schema: validating the value at `/children/*/children/*/"), "{problem}");
        assert!(problem.contains("paths through the levels above it reach `/$defs/node/oneOf/"), "{problem}");

        // `unevaluatedProperties` evaluates the branches below it again: 16
        // levels of one `anyOf` each (each level alone costs 3) took 4.7 s on a
        // valid value.
        let mut defs = serde_json::Map::new();
        for i in 0..16 {
            let next = json!({"$ref": format!("#/$defs/u{}", i + 1)});
            defs.insert(format!("u{i}"), json!({"anyOf": [next, {"type": "null"}], "unevaluatedProperties": false}));
        }
        defs.insert("u16".into(), json!({"properties": {"a": {"type": "string"}}}));
        let problem = refusal(|t| t["descriptor"]["output_schema"] = json!({"$ref": "#/$defs/u0", "$defs": defs}));
        assert!(problem.contains("below `unevaluatedProperties`/`unevaluatedItems`"), "{problem}");
        assert!(problem.contains("output schema: validating one value against `/$defs/u"), "{problem}");

        // Applying a schema to the same value again, in a loop: refused (a
        // 6-schema loop did not end in a minute).
        let problem = refusal(text_is(json!({
            "$ref": "#/$defs/a",
            "$defs": {"a": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}
        })));
        assert!(problem.starts_with("input schema: `/$defs/"), "{problem}");
        assert!(
            problem.contains("applies to the same value again") && problem.contains("break the cycle"),
            "{problem}"
        );

        // Through the catalog, the refusal names the file as well.
        let reason = refused_through_the_catalog(fan_out(60));
        assert!(reason.contains("tool `t.x`: output schema: validating one value against `/$defs/d48`"), "{reason}");
    }

    /// Why the catalog refuses `remote.wasm`, a component whose Tool `t.x`
    /// declares `output_schema` (it must be refused, and not be installed).
    fn refused_through_the_catalog(output_schema: Value) -> String {
        let dir = tempfile::tempdir().unwrap();
        let mut t = tool("t.x");
        t["descriptor"]["output_schema"] = output_schema;
        let meta = serde_json::to_vec(&doc(vec![t])).unwrap();
        std::fs::write(dir.path().join("remote.wasm"), component_with(&[&meta], Some(TOOL_EXPORT))).unwrap();
        let catalog = crate::catalog::Catalog::load(dir.path()).unwrap();
        let [refused] = catalog.refused() else { panic!("{:?}", catalog.refused()) };
        assert!(refused.path.ends_with("remote.wasm"), "{refused:?}");
        assert!(catalog.get("t.x").is_none());
        refused.reason.clone()
    }

    /// What real Tools ship is accepted and validates as before: schemars
    /// output whose definitions are used from many sibling properties (50
    /// uses of one definition cost one evaluation each, at different
    /// members: not a product), recursive types (a tree, an expression with
    /// two operands, a list), `anyOf` with `null` for options, deeply nested
    /// properties, tuples, `additionalProperties`, `unevaluatedProperties` on
    /// a small `allOf`, a reference to the schema's own root.
    #[test]
    fn ordinary_schemas_are_accepted_whatever_their_size() {
        #![allow(dead_code)]
        #[derive(schemars::JsonSchema)]
        enum Shape {
            Circle { r: f64 },
            Rect { w: f64, h: f64 },
        }
        #[derive(schemars::JsonSchema)]
        struct Tree {
            name: String,
            shape: Option<Shape>,
            children: Vec<Tree>,
        }
        #[derive(schemars::JsonSchema)]
        enum Expr {
            Num(f64),
            Add(Box<Expr>, Box<Expr>),
            Neg { of: Box<Expr> },
            Call { name: String, args: Vec<Expr> },
        }
        #[derive(schemars::JsonSchema)]
        #[serde(tag = "kind")]
        enum Tagged {
            A { tree: Tree },
            B { expr: Expr, pair: (String, u8) },
        }
        macro_rules! wide {
            ($($field:ident)*) => {
                #[derive(schemars::JsonSchema)]
                #[serde(deny_unknown_fields)]
                struct Wide { $($field: Option<Shape>,)* tree: Tree, expr: Expr, tagged: Vec<Tagged> }
            };
        }
        wide!(f0 f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 f11 f12 f13 f14 f15 f16 f17 f18 f19 f20 f21 f22 f23 f24
              f25 f26 f27 f28 f29 f30 f31 f32 f33 f34 f35 f36 f37 f38 f39 f40 f41 f42 f43 f44 f45 f46 f47 f48 f49);
        let wide = serde_json::to_value(schemars::schema_for!(Wide)).unwrap();
        assert_eq!(wide["properties"].as_object().map(|p| p.len()), Some(53), "{wide}");

        let mut nested = json!({"type": "string"});
        for _ in 0..40 {
            nested =
                json!({"type": "object", "properties": {"a": nested, "b": {"type": "integer"}}, "required": ["a"]});
        }
        let hand_written = json!({
            "type": "object",
            "properties": {
                "self": {"$ref": "#"},
                "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"$ref": "#/$defs/n"}], "items": false},
                "map": {"type": "object", "additionalProperties": {"$ref": "#/$defs/n"}},
                "merged": {
                    "allOf": [{"properties": {"a": {"$ref": "#/$defs/n"}}}, {"properties": {"b": {"$ref": "#/$defs/n"}}}],
                    "unevaluatedProperties": false
                }
            },
            "$defs": {"n": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}
        });
        let schemas = [
            ("schemars, 50 uses of one definition", wide),
            ("schemars, a recursive expression", serde_json::to_value(schemars::schema_for!(Expr)).unwrap()),
            ("40 levels of properties", nested.clone()),
            ("hand-written", hand_written),
        ];
        for (name, schema) in &schemas {
            let mut t = tool("t.x");
            t["descriptor"]["input_schema"] = schema.clone();
            t["descriptor"]["input_schema"]["type"] = json!("object");
            t["descriptor"]["output_schema"] = schema.clone();
            t["descriptor"]["primary_argument"] = Value::Null;
            let doc: ComponentMetadata = serde_json::from_value(doc(vec![t])).unwrap();
            if let Err(e) = check_document(doc) {
                panic!("{name}: {e}");
            }
        }

        // A reference to the draft-07 meta-schema is fine; one to the 2020-12
        // meta-schema is refused (see `work`), saying what to declare instead.
        for (meta, ok) in
            [("http://json-schema.org/draft-07/schema#", true), ("https://json-schema.org/draft/2020-12/schema", false)]
        {
            let mut t = tool("t.x");
            t["descriptor"]["input_schema"]["$schema"] = json!(meta);
            t["descriptor"]["input_schema"]["properties"]["schema"] = json!({"$ref": meta});
            match read_doc(&doc(vec![t])) {
                Ok(_) => assert!(ok, "{meta}"),
                Err(e) => assert!(!ok && e.to_string().contains(r#"declare `{"type": ["object", "boolean"]}`"#), "{e}"),
            }
        }

        // And they validate as before.
        let mut t = tool("t.x");
        t["descriptor"]["input_schema"] = schemas[0].1.clone();
        t["descriptor"]["output_schema"] = schemas[1].1.clone();
        t["descriptor"]["primary_argument"] = Value::Null;
        let tools = check_document(serde_json::from_value(doc(vec![t])).unwrap()).unwrap();
        let leaf = json!({"name": "leaf", "shape": {"Circle": {"r": 1.0}}, "children": []});
        let args = json!({
            "f0": null, "f7": {"Rect": {"w": 1.0, "h": 2.0}},
            "tree": {"name": "root", "shape": null, "children": [leaf.clone(), {"name": "x", "shape": null, "children": [leaf]}]},
            "expr": {"Add": [{"Num": 1.0}, {"Neg": {"of": {"Call": {"name": "f", "args": [{"Num": 2.0}]}}}}]},
            "tagged": [{"kind": "B", "expr": {"Num": 0.0}, "pair": ["x", 7]}]
        });
        assert_eq!(tools[0].validate_arguments(&args), Ok(()));
        let mut bad = args.clone();
        bad["tree"]["children"][1]["children"][0]["shape"] = json!({"Circle": {"r": "one"}});
        let e = tools[0].validate_arguments(&bad).unwrap_err();
        assert!(e.contains("/tree/children/1/children/0/shape"), "{e}");
        assert!(tools[0].validate_output(&json!({"Add": [{"Num": 1.0}, {"Num": 2.0}]})).is_ok());
        assert!(tools[0].validate_output(&json!({"Add": [{"Num": 1.0}]})).is_err());
    }

    /// An `enum` of `n` numbers, a fraction first: jsonschema's lookups (of
    /// strings, of integers) do not apply, so it compares every entry.
    fn numbers(n: usize) -> Value {
        let mut entries = vec![json!(0.5)];
        entries.extend((0..n - 1).map(|i| json!(i)));
        json!({"enum": entries})
    }

    /// `count` copies of `schema` in one `allOf`.
    fn all_of(count: usize, schema: Value) -> Value {
        json!({"allOf": vec![schema; count]})
    }

    /// The work bound counted one evaluation per subschema and value node,
    /// but some keywords cost in proportion to the schema (an `enum`,
    /// `const` or `required` compares or looks up every entry) or to the
    /// value's bytes (a `pattern`, `format`, `patternProperties` pattern or
    /// `uniqueItems` reads all of it): within the bound, one argument took
    /// hours. They are counted at load now, through the same fan-out, and a
    /// schema over a bound is refused, naming the Tool, the schema, the value,
    /// the subschema and what to do.
    #[test]
    fn keywords_that_cost_in_proportion_to_the_schema_or_the_value_are_bounded_at_load() {
        // The report: an `enum` of 120,001 numbers (~720 KiB, within the
        // metadata bound; 2 evaluations per item) compared with each of
        // ~600,000 items of a 4 MiB argument: ~7×10^10 comparisons before
        // the gate (1,000 items took 10 s in a debug build).
        let items = json!({"type": "array", "items": numbers(120_001)});
        let problem = refusal(text_is(items.clone()));
        for words in [
            "input schema: validating the value at `/text/*` against `/properties/text/items` compares it with the \
             120001 entries of its `enum` one by one, more than the 10000 comparisons and evaluations allowed per value",
            "compares the value with every entry of any other `enum` (numbers too)",
            "list fewer entries, or check the value another way",
        ] {
            assert!(problem.contains(words), "{problem:?} lacks {words:?}");
        }
        // The output case needs no fan-out: the guest returns the items.
        let problem = refusal(|t| t["descriptor"]["output_schema"] = items);
        assert!(
            problem.starts_with(
                "output schema: validating the value at `/*` against `/items` compares it with the 120001"
            ),
            "{problem}"
        );
        // Equally a `const` (compared deeply), a `required` list, and many
        // small `enum`s applied to one value.
        let problem = refusal(text_is(json!({"const": (0..20_000).collect::<Vec<_>>()})));
        assert!(
            problem.contains("against `/properties/text` compares it with its `const`, of more than 10000 values"),
            "{problem}"
        );
        let names: Vec<String> = (0..20_000).map(|i| format!("n{i}")).collect();
        let problem = refusal(text_is(json!({"type": "object", "required": names})));
        assert!(problem.contains("compares it with the 20000 names of its `required` one by one"), "{problem}");
        let problem = refusal(text_is(all_of(60, numbers(200))));
        assert!(
            problem.contains("against `/properties/text` makes 12000 comparisons with the entries of the `enum`, `const` and `required` lists of the subschemas below it and evaluates 61 subschemas"),
            "{problem}"
        );
        // Under the bound, an `enum` of numbers still validates as before.
        let mut t = tool("t.x");
        text_is(json!({"type": "array", "items": numbers(9_000)}))(&mut t);
        let tools = read_doc(&doc(vec![t])).expect("9,000 entries: under the bound");
        assert!(tools[0].validate_arguments(&json!({"text": [0.5, 8998]})).is_ok());
        assert!(tools[0].validate_arguments(&json!({"text": [8999]})).is_err());

        // The report's second form: 9,999 patterns in one `allOf` (10,000
        // evaluations: at the bound) run over the whole of a 4 MiB string
        // each (one 64 KiB string took 6 s in a debug build).
        let problem = refusal(text_is(all_of(9_999, json!({"pattern": "^a*$"}))));
        for words in [
            "input schema: validating the value at `/text` against `/properties/text` reads its text, member names \
             or items 159984 times over, more than the 256 allowed per value (the subschemas below it apply 159984 \
             passes)",
            "each `pattern`, `patternProperties` pattern, `uniqueItems`, `format`, and in drafts 4 to 7 `contentEncoding`",
            "match one value against fewer patterns and formats (merge patterns into one",
        ] {
            assert!(problem.contains(words), "{problem:?} lacks {words:?}");
        }
        // The bound is exact: 16 patterns pass, 17 do not.
        let mut t = tool("t.x");
        text_is(all_of(16, json!({"pattern": "^a*$"})))(&mut t);
        let tools = read_doc(&doc(vec![t])).expect("16 patterns: at the bound");
        assert!(tools[0].validate_arguments(&json!({"text": "aaa"})).is_ok());
        assert!(tools[0].validate_arguments(&json!({"text": "aab"})).is_err());
        assert!(refusal(text_is(all_of(17, json!({"pattern": "^a*$"})))).contains("272 times over"));
        // The same for the other keywords that read the whole value: every
        // member name against each `patternProperties` pattern (twice beside
        // `additionalProperties`), every item hashed for `uniqueItems`, a
        // format in any draft (asserted in each), and a pattern of 100,000
        // literals, compared one by one.
        let patterns: serde_json::Map<String, Value> = (0..9).map(|i| (format!("^x{i}"), json!(true))).collect();
        let problem = refusal(text_is(json!({"patternProperties": patterns, "additionalProperties": false})));
        assert!(problem.contains("reads its text, member names or items 288 times over"), "{problem}");
        assert!(
            problem.contains("its `patternProperties` matches every member name against each of its 9 patterns"),
            "{problem}"
        );
        let problem = refusal(text_is(all_of(17, json!({"uniqueItems": true}))));
        assert!(problem.contains("validating the value at `/text` against `/properties/text` reads its text, member names or items 272 times over"), "{problem}");
        let emails = all_of(17, json!({"format": "email"}));
        let problem = refusal(|t| {
            text_is(emails.clone())(t);
            t["descriptor"]["input_schema"]["$schema"] = json!("http://json-schema.org/draft-07/schema#");
        });
        assert!(problem.contains("272 times over"), "{problem}");
        assert!(refusal(text_is(emails)).contains("272 times over"), "asserted in draft 2020-12 too");
        let literals: Vec<String> = (0..100_000).map(|i| format!("a{i}")).collect();
        let problem = refusal(text_is(json!({"pattern": format!("^({})$", literals.join("|"))})));
        assert!(
            problem.contains("its `pattern` lists so many alternatives that each is compared in turn"),
            "{problem}"
        );
        // Several branches each applying a pattern to the same member.
        let variants: Vec<Value> =
            (0..17).map(|i| json!({"properties": {"kind": {"const": i}, "id": {"pattern": "^[a-z]+$"}}})).collect();
        let problem = refusal(|t| t["descriptor"]["output_schema"] = json!({"oneOf": variants}));
        assert!(
            problem.starts_with(
                "output schema: validating the value at `/id` reads its text, member names or items 272 times over"
            ),
            "{problem}"
        );
        assert!(problem.contains("17 subschemas reach it, such as `/oneOf/"), "{problem}");

        // Through the catalog, the refusal names the file as well.
        let reason = refused_through_the_catalog(all_of(9_999, json!({"pattern": "^a*$"})));
        assert!(
            reason.contains("tool `t.x`: output schema: validating one value against the schema's root reads its text"),
            "{reason}"
        );
    }

    /// What real Tools ship stays well within both bounds: schemars output
    /// for a Rust enum of 200 variants (an `enum` of strings, or with
    /// documented variants a `oneOf` of `const`s), as an `Option` and in
    /// lists, a tagged union; hand-written schemas with a few patterns and
    /// formats on one value, `patternProperties`, `uniqueItems`, small mixed
    /// `enum`s, a `const` object, a fractional `multipleOf`, long `required`
    /// lists. They validate as before.
    #[test]
    fn ordinary_enums_patterns_and_formats_are_accepted() {
        #![allow(dead_code)]
        macro_rules! big {
            ($($v:ident)*) => {
                #[derive(schemars::JsonSchema)]
                enum Plain { $($v,)* }
                #[derive(schemars::JsonSchema)]
                enum Documented { $(#[doc = "One of many."] $v,)* }
            };
        }
        big!(V0 V1 V2 V3 V4 V5 V6 V7 V8 V9 V10 V11 V12 V13 V14 V15 V16 V17 V18 V19 V20 V21 V22 V23 V24 V25 V26 V27
             V28 V29 V30 V31 V32 V33 V34 V35 V36 V37 V38 V39 V40 V41 V42 V43 V44 V45 V46 V47 V48 V49 V50 V51 V52 V53
             V54 V55 V56 V57 V58 V59 V60 V61 V62 V63 V64 V65 V66 V67 V68 V69 V70 V71 V72 V73 V74 V75 V76 V77 V78 V79
             V80 V81 V82 V83 V84 V85 V86 V87 V88 V89 V90 V91 V92 V93 V94 V95 V96 V97 V98 V99 V100 V101 V102 V103 V104
             V105 V106 V107 V108 V109 V110 V111 V112 V113 V114 V115 V116 V117 V118 V119 V120 V121 V122 V123 V124 V125
             V126 V127 V128 V129 V130 V131 V132 V133 V134 V135 V136 V137 V138 V139 V140 V141 V142 V143 V144 V145 V146
             V147 V148 V149 V150 V151 V152 V153 V154 V155 V156 V157 V158 V159 V160 V161 V162 V163 V164 V165 V166 V167
             V168 V169 V170 V171 V172 V173 V174 V175 V176 V177 V178 V179 V180 V181 V182 V183 V184 V185 V186 V187 V188
             V189 V190 V191 V192 V193 V194 V195 V196 V197 V198 V199);
        #[derive(schemars::JsonSchema)]
        #[serde(tag = "kind")]
        enum Tagged {
            A { name: String, n: u8 },
            B { plain: Plain },
            C,
        }
        #[derive(schemars::JsonSchema)]
        struct Args {
            plain: Plain,
            maybe: Option<Plain>,
            documented: Documented,
            list: Vec<Documented>,
            tagged: Vec<Tagged>,
            ratio: f64,
        }
        let schemars = serde_json::to_value(schemars::schema_for!(Args)).unwrap();
        let defs = &schemars["$defs"];
        assert_eq!(defs["Plain"]["enum"].as_array().map(Vec::len), Some(200), "{}", defs["Plain"]);
        assert_eq!(defs["Documented"]["oneOf"].as_array().map(Vec::len), Some(200), "{}", defs["Documented"]);

        let languages: Vec<String> = (0..200).map(|i| format!("l{i}")).collect();
        let codes = (0..50).map(|i| format!("c{i}")).collect::<Vec<_>>().join("|");
        let names: Vec<String> = (0..300).map(|i| format!("n{i}")).collect();
        let hand_written = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": "^[a-z0-9_./-]+$",
                    "format": "uri-reference", "not": {"pattern": "\\.\\."}},
                "mode": {"enum": ["append", "truncate", null, 1, 2.5]},
                "language": {"type": "string", "enum": languages},
                "code": {"type": "string", "pattern": format!("^({codes})$")},
                "ratio": {"type": "number", "multipleOf": 0.01, "minimum": 0},
                "env": {"type": "object", "patternProperties": {"^[A-Z_][A-Z0-9_]*$": {"type": "string"}, "^x-": {}},
                    "additionalProperties": false, "propertyNames": {"maxLength": 128, "pattern": "^[A-Za-z_-]+$"}},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "uniqueItems": true},
                "fixed": {"const": {"a": [1, {"b": null}]}},
                "id": {"anyOf": [{"type": "string", "format": "uuid", "pattern": "^[0-9a-f-]{36}$"},
                    {"type": "integer", "enum": [1, 2, 3]}]},
                "record": {"type": "object", "required": names, "dependentRequired": {"n0": ["n1", "n2"]}}
            },
            "required": ["path"]
        });
        let mut draft7 = hand_written.clone();
        draft7["$schema"] = json!("http://json-schema.org/draft-07/schema#");
        draft7["properties"]["when"] = json!({"type": "string", "format": "date-time", "pattern": "^2"});
        for (name, schema) in [("schemars", &schemars), ("hand-written", &hand_written), ("draft 7", &draft7)] {
            let mut t = tool("t.x");
            t["descriptor"]["input_schema"] = schema.clone();
            t["descriptor"]["input_schema"]["type"] = json!("object");
            t["descriptor"]["output_schema"] = schema.clone();
            t["descriptor"]["primary_argument"] = Value::Null;
            if let Err(e) = read_doc(&doc(vec![t])) {
                panic!("{name}: {e}");
            }
        }

        let mut t = tool("t.x");
        t["descriptor"]["input_schema"] = draft7;
        t["descriptor"]["output_schema"] = schemars;
        t["descriptor"]["primary_argument"] = Value::Null;
        let tools = read_doc(&doc(vec![t])).unwrap();
        let args = json!({
            "path": "a/b.txt", "mode": 2.5, "language": "l199", "code": "c49", "ratio": 0.25,
            "env": {"HOME": "/root", "x-y": 1}, "tags": ["a", "b"], "fixed": {"a": [1, {"b": null}]},
            "id": "123e4567-e89b-12d3-a456-426614174000", "when": "2024-01-01T00:00:00Z"
        });
        assert_eq!(tools[0].validate_arguments(&args), Ok(()));
        for (key, bad) in [
            ("path", json!("a/../b")),
            ("mode", json!(3)),
            ("language", json!("l200")),
            ("code", json!("c50")),
            ("env", json!({"lower": "x"})),
            ("tags", json!(["a", "a"])),
            ("when", json!("yesterday")),
        ] {
            let mut args = args.clone();
            args[key] = bad;
            let e = tools[0].validate_arguments(&args).unwrap_err();
            assert!(e.contains(&format!("/{key}")), "{key}: {e}");
        }
        let output = json!({
            "plain": "V7", "maybe": null, "documented": "V199", "list": ["V0"], "ratio": 1.5,
            "tagged": [{"kind": "A", "name": "x", "n": 1}, {"kind": "B", "plain": "V1"}, {"kind": "C"}]
        });
        assert_eq!(tools[0].validate_output(&output), Ok(()));
        let mut bad = output.clone();
        bad["tagged"][1]["plain"] = json!("V200");
        assert!(tools[0].validate_output(&bad).is_err());
    }

    /// Schemas come from whoever ships the component (for an MCP adapter, the
    /// remote server at import time) and run host-side on untrusted arguments
    /// and output. A `pattern` that needs a backtracking engine (look-around,
    /// back-references) could keep a host thread busy for minutes on long
    /// strings, so it is refused at load — in the input schema, the output
    /// schema, `patternProperties`, anywhere below — naming the file, the
    /// Tool, the schema, the pattern and what to do. Every other pattern
    /// runs on a linear-time engine and validates as before.
    #[test]
    fn backtracking_patterns_are_refused_at_load_naming_tool_and_pattern() {
        const LOOKAHEAD: &str = "^(?:a|a(?=a))+$";
        const BACKREF: &str = "^(a+)\\1$";
        const LOOKBEHIND: &str = "(?<!x)y";
        let pattern_properties = |p: &str| {
            let mut m = serde_json::Map::new();
            m.insert(p.to_owned(), json!({"type": "string"}));
            Value::Object(m)
        };
        let cases: Vec<(&str, Box<dyn Fn(&mut Value)>, &str, &str, &str)> = vec![
            (
                "input pattern",
                Box::new(|t| t["descriptor"]["input_schema"]["properties"]["text"]["pattern"] = json!(LOOKAHEAD)),
                "input schema",
                LOOKAHEAD,
                "/properties/text/pattern",
            ),
            (
                "output pattern",
                Box::new(|t| t["descriptor"]["output_schema"] = json!({"type": "string", "pattern": BACKREF})),
                "output schema",
                BACKREF,
                "/pattern",
            ),
            (
                "output patternProperties, nested",
                Box::new(move |t| {
                    t["descriptor"]["output_schema"] = json!({
                        "type": "object",
                        "properties": {"rows": {"type": "array", "items": {
                            "type": "object", "patternProperties": pattern_properties(LOOKAHEAD)
                        }}}
                    })
                }),
                "output schema",
                LOOKAHEAD,
                "/properties/rows/items/patternProperties",
            ),
            (
                "input $defs behind $ref",
                Box::new(|t| {
                    let s = &mut t["descriptor"]["input_schema"];
                    s["$defs"] = json!({"word": {"type": "string", "pattern": LOOKBEHIND}});
                    s["properties"]["text"] = json!({"$ref": "#/$defs/word"});
                }),
                "input schema",
                LOOKBEHIND,
                "/pattern",
            ),
        ];
        for (name, edit, schema, pattern, at) in cases {
            let DescriptorError::BadTool { id, problem } = tool_error(edit) else { panic!("{name}: expected BadTool") };
            assert_eq!(id, "t.x", "{name}");
            for words in [schema, &format!("`{pattern}`"), at, "look-around or a back-reference", "rewrite it"] {
                assert!(problem.contains(words), "{name}: {problem:?} lacks {words:?}");
            }
        }

        // Through the catalog, the refusal names the file as well.
        let dir = tempfile::tempdir().unwrap();
        let mut t = tool("t.x");
        t["descriptor"]["output_schema"] = json!({"type": "string", "pattern": LOOKAHEAD});
        let meta = serde_json::to_vec(&doc(vec![t])).unwrap();
        std::fs::write(dir.path().join("remote.wasm"), component_with(&[&meta], Some(TOOL_EXPORT))).unwrap();
        let catalog = crate::catalog::Catalog::load(dir.path()).unwrap();
        let [refused] = catalog.refused() else { panic!("{:?}", catalog.refused()) };
        assert!(refused.path.ends_with("remote.wasm"), "{refused:?}");
        assert!(refused.reason.contains("tool `t.x`: output schema: pattern `^(?:a|a(?=a))+$`"), "{}", refused.reason);
        assert!(catalog.get("t.x").is_none());

        // A malformed pattern is still refused, as malformed.
        let DescriptorError::BadTool { problem, .. } =
            tool_error(|t| t["descriptor"]["input_schema"]["properties"]["text"]["pattern"] = json!("(unclosed"))
        else {
            panic!("expected BadTool")
        };
        assert!(problem.contains("`(unclosed`") && problem.contains("not a valid regular expression"), "{problem}");
        // So is a pattern too large to match quickly (this one took two
        // minutes on a 100 KiB string), and a message shows a pattern's
        // control characters escaped, and a long one cut.
        let DescriptorError::BadTool { problem, .. } = tool_error(|t| {
            t["descriptor"]["input_schema"]["properties"]["text"]["pattern"] =
                json!(format!("\u{1b}[2J{}[\\w\\W]{{10000}}x", "z".repeat(300)))
        }) else {
            panic!("expected BadTool")
        };
        assert!(problem.contains("more than 256 KiB") && problem.contains("shorten it"), "{problem}");
        assert!(problem.contains("`\\u{1b}[2Jzzz") && problem.contains("zzz…` at") && !problem.contains('\u{1b}'));

        // Ordinary patterns still validate, in both directions, and a nested
        // quantifier (catastrophic for a backtracking engine) answers at once.
        let mut t = tool("t.x");
        t["descriptor"]["input_schema"]["properties"]["text"]["pattern"] = json!("^[a-z]+$");
        t["descriptor"]["output_schema"] = json!({"type": "string", "pattern": "^(a+)+$"});
        let tools = read_doc(&doc(vec![t])).unwrap();
        assert!(tools[0].validate_arguments(&json!({"text": "lower"})).is_ok());
        let e = tools[0].validate_arguments(&json!({"text": "Upper"})).unwrap_err();
        assert!(e.contains("/text") && e.contains("^[a-z]+$"), "{e}");
        assert!(tools[0].validate_output(&json!("a".repeat(64))).is_ok());
        let long = format!("{}b", "a".repeat(1 << 16));
        let started = std::time::Instant::now();
        assert!(tools[0].validate_output(&json!(long)).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "took {:?}", started.elapsed());
    }

    /// Each pattern is compiled when its schema is loaded and held as long
    /// as the component is; the near-limit ones differing by a character
    /// each compile on their own (3,000 took ~1 GB and 4 s at every load).
    /// Every distinct pattern of a metadata document, in all its schemas,
    /// counts toward one budget of compiled size, charged before jsonschema
    /// compiles any: one over it is refused naming the Tool, the schema,
    /// where, the budget and what to do, without compiling the rest.
    #[test]
    fn more_distinct_patterns_than_the_cap_are_refused_at_load_however_small() {
        // 1,100 tiny patterns: well inside the compiled budget.
        let many = |n: usize| {
            let properties: serde_json::Map<String, Value> =
                (0..n).map(|i| (format!("p{i}"), json!({"type": "string", "pattern": format!("^x{i}$")}))).collect();
            json!({"type": "object", "properties": properties})
        };
        let DescriptorError::BadTool { id, problem } = tool_error(|t| {
            t["descriptor"]["input_schema"] = many(MAX_PATTERNS + 76);
            t["descriptor"]["primary_argument"] = Value::Null;
        }) else {
            panic!("expected BadTool")
        };
        assert_eq!(id, "t.x");
        for words in ["input schema", "past the 1024 distinct patterns", "fewer distinct patterns", "at `/properties/p"]
        {
            assert!(problem.contains(words), "{problem:?} lacks {words:?}");
        }
        // At the cap, it loads.
        let mut t = tool("t.a");
        t["descriptor"]["input_schema"] = many(MAX_PATTERNS);
        t["descriptor"]["primary_argument"] = Value::Null;
        assert!(read_doc(&doc(vec![t])).is_ok());
    }

    #[test]
    fn many_patterns_in_one_document_are_refused_at_load_by_their_compiled_size() {
        // ~265 KB each compiled, under the 256 KiB bound of one pattern.
        let near_limit = |i: usize| format!("(?:[^x]y){{250}}{i}");
        let many = |n: usize, keyword: &str| {
            let mut properties = serde_json::Map::new();
            for i in 0..n {
                let schema = match keyword {
                    "pattern" => json!({"type": "string", "pattern": near_limit(i)}),
                    _ => json!({"type": "object", "patternProperties": {near_limit(i): {"type": "string"}}}),
                };
                properties.insert(format!("p{i}"), schema);
            }
            json!({"type": "object", "properties": properties})
        };
        let order: Vec<String> = many(400, "pattern")["properties"].as_object().unwrap().keys().cloned().collect();
        for (keyword, field) in [("pattern", "/pattern`"), ("patternProperties", "/patternProperties/")] {
            let started = std::time::Instant::now();
            let DescriptorError::BadTool { id, problem } = tool_error(|t| {
                t["descriptor"]["input_schema"] = many(400, keyword);
                t["descriptor"]["primary_argument"] = Value::Null;
            }) else {
                panic!("{keyword}: expected BadTool")
            };
            assert_eq!(id, "t.x");
            for words in ["input schema", "`(?:[^x]y){250}", field, "at `/properties/p", "8 MiB", "fewer"] {
                assert!(problem.contains(words), "{keyword}: {problem:?} lacks {words:?}");
            }
            // Refused at the pattern that crossed the budget, not after all 400.
            let at = problem.split("at `/properties/").nth(1).and_then(|r| r.split('/').next()).unwrap();
            let index = order.iter().position(|p| p == at).unwrap();
            assert!((20..60).contains(&index), "{keyword}: refused at the {index}th pattern: {problem}");
            assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}", started.elapsed());
        }
        // One budget for the whole document: two Tools' schemas, each under it alone.
        let mut a = tool("t.a");
        a["descriptor"]["input_schema"] = many(20, "pattern");
        a["descriptor"]["primary_argument"] = Value::Null;
        let mut b = tool("t.b");
        b["descriptor"]["output_schema"] = many(20, "pattern");
        assert!(read_doc(&doc(vec![a.clone()])).is_ok());
        let Err(DescriptorError::BadTool { id, problem }) = read_doc(&doc(vec![a, b])) else {
            panic!("two Tools' patterns together must be refused")
        };
        assert_eq!(id, "t.b");
        assert!(problem.contains("output schema") && problem.contains("8 MiB"), "{problem}");

        // Ordinary patterns load, and one pattern repeated everywhere is one.
        let mut t = tool("t.x");
        let mut properties = serde_json::Map::new();
        for (i, p) in
            ["^[a-z]+$", "^\\d{4}-\\d{2}-\\d{2}$", "^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$", "\\w{1,64}"]
                .iter()
                .enumerate()
        {
            properties.insert(format!("o{i}"), json!({"type": "string", "pattern": p}));
        }
        for i in 0..400 {
            properties.insert(format!("same{i}"), json!({"type": "string", "pattern": near_limit(0)}));
        }
        t["descriptor"]["input_schema"] = json!({"type": "object", "properties": properties});
        t["descriptor"]["primary_argument"] = Value::Null;
        let tools = read_doc(&doc(vec![t])).unwrap();
        assert!(tools[0].validate_arguments(&json!({"o0": "abc", "o1": "2024-01-02"})).is_ok());
        assert!(tools[0].validate_arguments(&json!({"o1": "x"})).is_err());
    }

    #[test]
    fn wit_compatibility() {
        let cases = [
            ("toolgate:plugin@0.1.0", true),
            ("toolgate:plugin@0.1.7", true),
            ("toolgate:plugin@0.1.0-rc.1", true),
            ("toolgate:plugin@0.2.0", false),
            ("toolgate:plugin@0.0.9", false),
            ("toolgate:plugin@1.0.0", false),
            ("toolgate:plugin@1.1.0", false),
            ("toolgate:plugin@0", false),
            ("toolgate:plugin@", false),
            ("toolgate:plugin", false),
            ("toolgate:other@0.1.0", false),
            ("Toolgate:plugin@0.1.0", false),
            ("toolgate:plugin@x.y.z", false),
            ("toolgate:plugin@-0.1.0", false),
            ("toolgate:plugin@0.-1.0", false),
            ("toolgate:plugin@99999999999999999999999.1.0", false),
            ("", false),
            ("@", false),
            ("@0.1.0", false),
        ];
        for (wit, want) in cases {
            assert_eq!(wit_compatible(wit), want, "{wit}");
        }
    }

    #[test]
    fn tool_ids() {
        let max = format!("a{}", "b".repeat(MAX_ID_LEN - 1));
        let over = format!("a{}", "b".repeat(MAX_ID_LEN));
        let cases: &[(&str, bool)] = &[
            ("a", true),
            ("text.upper", true),
            ("Text_Upper-2.v3", true),
            ("mcp__github__issue", true),
            (&max, true),
            (&over, false),
            ("", false),
            ("1abc", false),
            ("_abc", false),
            (".abc", false),
            ("-abc", false),
            ("a b", false),
            ("a/b", false),
            ("a*", false),
            ("a(b)", false),
            ("é", false),
            ("aé", false),
            ("a\u{0}", false),
            ("a\n", false),
        ];
        for (id, ok) in cases {
            let got = check_id(id);
            assert_eq!(got.is_ok(), *ok, "{id:?}: {got:?}");
        }
        assert!(check_id(&over).unwrap_err().contains("longer"));
        assert!(check_id("1abc").unwrap_err().contains("invalid id"));
    }

    #[test]
    fn embed_replaces_the_metadata_section() {
        let bare = component_with(&[], Some(TOOL_EXPORT));
        let first = ComponentMetadata::new(vec![serde_json::from_value(tool("one.tool")).unwrap()]);
        let second = ComponentMetadata::new(vec![serde_json::from_value(tool("two.tool")).unwrap()]);
        let once = embed_metadata(&bare, &first).unwrap();
        let twice = embed_metadata(&once, &second).unwrap();
        let s = scan(&twice).unwrap();
        assert_eq!(s.metadata.len(), 1, "exactly one metadata section after embedding twice");
        let stored: ComponentMetadata = serde_json::from_slice(s.metadata[0]).unwrap();
        assert_eq!(stored, second);
        assert!(s.exports_tool, "other sections are kept");
        let ids: Vec<String> = read_metadata(&twice).unwrap().iter().map(|t| t.id().to_owned()).collect();
        assert_eq!(ids, ["two.tool"]);
        // The nested module (with its decoy section) is copied verbatim.
        assert_eq!(
            twice.len(),
            once.len() - serde_json::to_vec(&first).unwrap().len() + serde_json::to_vec(&second).unwrap().len()
        );
        // Re-embedding the same document is idempotent.
        assert_eq!(embed_metadata(&twice, &second).unwrap(), twice);
        // Several stale sections all go.
        let messy = component_with(&[b"old", b"older"], Some(TOOL_EXPORT));
        assert_eq!(scan(&embed_metadata(&messy, &second).unwrap()).unwrap().metadata.len(), 1);
    }

    #[test]
    fn embed_refuses_non_components() {
        let d = ComponentMetadata::new(vec![serde_json::from_value(tool("a.b")).unwrap()]);
        assert_eq!(embed_metadata(&Module::new().finish(), &d), Err(DescriptorError::CoreModule));
        assert!(matches!(embed_metadata(b"garbage!", &d), Err(DescriptorError::Malformed(_))));
        let v = valid_component();
        assert!(matches!(embed_metadata(&v[..v.len() - 3], &d), Err(DescriptorError::Malformed(_))));
    }

    #[test]
    fn every_truncation_of_a_component_is_refused() {
        let v = valid_component();
        assert!(read_metadata(&v).is_ok());
        for cut in 0..v.len() {
            let r = read_metadata(&v[..cut]);
            assert!(r.is_err(), "a truncation to {cut} of {} bytes was accepted", v.len());
        }
    }

    proptest! {
        #[test]
        fn read_metadata_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = read_metadata(&bytes);
            let _ = embed_metadata(&bytes, &ComponentMetadata::new(vec![]));
        }

        #[test]
        fn read_metadata_never_panics_after_component_header(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
            bytes.extend_from_slice(&tail);
            // Without a tool export and one metadata section it cannot succeed.
            prop_assert!(read_metadata(&bytes).is_err());
            let _ = embed_metadata(&bytes, &ComponentMetadata::new(vec![]));
        }

        #[test]
        fn byte_flips_of_a_component_never_panic(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            meta in prop_oneof![Just(true), Just(false)],
        ) {
            // With and without the tool export (without it, it is always refused).
            let mut v = if meta {
                valid_component()
            } else {
                component_with(&[&serde_json::to_vec(&doc(vec![tool("a.b")])).unwrap()], None)
            };
            for (at, x) in flips {
                let i = at % v.len();
                v[i] ^= x | 1;
            }
            match read_metadata(&v) {
                Ok(tools) => prop_assert!(meta && !tools.is_empty()),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            let _ = embed_metadata(&v, &ComponentMetadata::new(vec![]));
        }

        #[test]
        fn arbitrary_metadata_text_never_panics(text in ".{0,300}") {
            let _ = read_metadata(&component_with(&[text.as_bytes()], Some(TOOL_EXPORT)));
        }
    }

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!(null)),
            Just(json!(true)),
            Just(json!(0)),
            Just(json!(-1)),
            Just(json!(0.5)),
            Just(json!(1e300)),
            Just(json!(-1e-300)),
            Just(json!(18446744073709551615u64)),
            Just(json!(i64::MIN)),
            Just(json!("")),
            Just(json!("string")),
            Just(json!("object")),
            Just(json!("(")),
            Just(json!("a{99999}")),
            Just(json!("#")),
            Just(json!("#/$defs/a")),
            Just(json!("#/properties/a")),
            Just(json!("urn:x")),
            Just(json!("http://json-schema.org/draft-07/schema")),
            Just(json!("email")),
            Just(json!("date-time")),
            Just(json!("regex")),
            Just(json!("uri")),
            Just(json!("ipv4")),
            Just(json!("duration")),
            Just(json!("base64")),
            Just(json!("application/json")),
            Just(json!("#a")),
            Just(json!("a")),
            Just(json!("%")),
            Just(json!("#/%zz")),
            Just(json!("\\p{Unknown}")),
            Just(json!("(?<n>a)\\k<n>")),
            Just(json!("^(a+)+$")),
            Just(json!(["string", "null"])),
            Just(json!([])),
            Just(json!({})),
            Just(json!(1.0)),
            Just(json!(1e-320)),
        ]
    }

    const KEYS: &[&str] = &[
        "type",
        "properties",
        "required",
        "items",
        "prefixItems",
        "additionalProperties",
        "pattern",
        "patternProperties",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "multipleOf",
        "minLength",
        "maxLength",
        "enum",
        "const",
        "$ref",
        "$defs",
        "definitions",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$dynamicAnchor",
        "$anchor",
        "$id",
        "$recursiveRef",
        "$recursiveAnchor",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "$vocabulary",
        "minProperties",
        "a",
        "text",
    ];

    fn schema() -> impl Strategy<Value = Value> {
        scalar().prop_recursive(5, 80, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((proptest::sample::select(KEYS), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]
        #[test]
        fn hostile_schemas_compile_and_validate_without_panicking(s in schema(), inst in schema(), root in any::<bool>()) {
            let mut s = s;
            if root {
                if let Value::Object(m) = &mut s { m.insert("type".into(), json!("object")); }
            }
            if let Ok(v) = compile_schema(&s, &mut work::Steps(MAX_CHECK_STEPS), &mut patterns::Budget::new()) {
                let errors: Vec<String> = v.iter_errors(&inst).take(5).map(|e| e.to_string()).collect();
                prop_assert_eq!(errors.is_empty(), v.is_valid(&inst));
            }
            // The same schema through the whole metadata path: a verdict, never a panic.
            let mut t = tool("t.x");
            t["descriptor"]["input_schema"] = s;
            t["descriptor"]["primary_argument"] = Value::Null;
            if let Ok(tools) = read_doc(&doc(vec![t])) {
                prop_assert_eq!(tools.len(), 1);
                let _ = tools[0].validate_arguments(&inst);
            }
        }
    }

    /// A tool whose arguments are `{"v": schema}` and whose output is that
    /// schema, in `draft` (`None`: no `$schema`, so 2020-12).
    fn checked_with(schema: Value, draft: Option<&str>) -> Arc<CheckedTool> {
        let mut t = tool("t.x");
        text_is(schema.clone())(&mut t);
        let mut output = schema;
        if let Some(d) = draft {
            t["descriptor"]["input_schema"]["$schema"] = json!(d);
            output["$schema"] = json!(d);
        }
        t["descriptor"]["output_schema"] = output;
        read_doc(&doc(vec![t])).expect("schema accepted").remove(0)
    }

    /// A declared `format` is asserted on arguments and on output in every
    /// draft, as the MCP clients that receive the listed schemas (Ajv with
    /// ajv-formats) assert it. Before, jsonschema's default made it an
    /// annotation in 2019-09 and 2020-12 (the draft of a schema without
    /// `$schema`): `{"at": "yesterday"}` for a `date-time` was committed as
    /// output and sent as structured content the client threw on.
    #[test]
    fn declared_formats_are_asserted_on_arguments_and_output_in_every_draft() {
        let cases = [
            ("date-time", "2024-05-01T12:30:00Z", "yesterday"),
            ("email", "ada@example.com", "ada at example"),
            ("uri", "https://example.com/a?b=c", "not a uri"),
            ("uuid", "67e55044-10b1-426f-9247-bb680e5fe0c8", "67e55044-10b1-426f-9247"),
            ("ipv4", "192.0.2.1", "192.0.2.256"),
        ];
        for draft in [
            None,
            Some("https://json-schema.org/draft/2020-12/schema"),
            Some("http://json-schema.org/draft-07/schema#"),
        ] {
            for (format, good, bad) in cases {
                // jsonschema knows `uuid` from 2019-09 on only (see the report).
                if format == "uuid" && draft.is_some_and(|d| d.contains("draft-07")) {
                    continue;
                }
                let t = checked_with(json!({"type": "string", "format": format}), draft);
                let case = format!("{format} in {draft:?}");
                assert!(t.validate_arguments(&json!({"text": good})).is_ok(), "{case}");
                assert!(t.validate_output(&json!(good)).is_ok(), "{case}");
                let e = t.validate_arguments(&json!({"text": bad})).expect_err(&case);
                assert!(e.contains("at `/text`") && e.contains(format), "{case}: {e}");
                let e = t.validate_output(&json!(bad)).expect_err(&case);
                assert!(e.contains("does not match its declared output schema") && e.contains(format), "{case}: {e}");
            }
        }
        // The reported object, formats nested in `properties`.
        let t = checked_with(
            json!({"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}, "required": ["at"]}),
            None,
        );
        assert!(t.validate_output(&json!({"at": "yesterday"})).unwrap_err().contains("at `/at`"));
        assert!(t.validate_output(&json!({"at": "2024-05-01T12:30:00+02:00"})).is_ok());
        // A format jsonschema does not know stays an annotation.
        let t = checked_with(json!({"type": "string", "format": "x-colour"}), None);
        assert!(t.validate_output(&json!("anything")).is_ok());
    }

    /// The `regex` format is jsonschema's ECMA-262 syntax check, quadratic in
    /// the number of group names: checked up to [`MAX_REGEX_FORMAT_BYTES`],
    /// a longer string passes unchecked, in time linear in its size.
    #[test]
    fn the_regex_format_is_checked_on_strings_of_bounded_length() {
        for draft in [None, Some("http://json-schema.org/draft-07/schema#")] {
            let t = checked_with(json!({"type": "string", "format": "regex"}), draft);
            assert!(t.validate_arguments(&json!({"text": "^[a-z]+(?<n>\\d)\\k<n>$"})).is_ok());
            assert!(t.validate_arguments(&json!({"text": "(unclosed"})).unwrap_err().contains("regex"));
            assert!(t.validate_output(&json!("a{2,1}")).is_err());
            // Adversarial: 460 distinct group names, under the bound.
            let names = |n: usize| (0..n).map(|i| format!("(?<a{i}>)")).collect::<String>();
            let under = names(460);
            assert!(under.len() <= MAX_REGEX_FORMAT_BYTES, "{}", under.len());
            let started = std::time::Instant::now();
            assert!(t.validate_arguments(&json!({"text": format!("{under}(")})).is_err(), "checked under the bound");
            // 4 MiB of them: unchecked (quadratic, it took minutes), so an
            // invalid one longer than the bound passes.
            let over = names(400_000) + "(";
            assert!(t.validate_arguments(&json!({"text": over})).is_ok());
            let took = started.elapsed();
            assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        }
    }

    /// `pattern` has ECMA-262 meaning, as in the clients (Ajv): `\d`, `\w`
    /// and `\s` are ASCII (ECMA white space for `\s`), `.` matches no line
    /// terminator. `\b` and `\B` are the one difference, documented at
    /// `compile_schema`: Unicode word boundaries here.
    #[test]
    fn patterns_have_ecma_262_classes() {
        for (pattern, value, matches) in [
            ("^\\d$", "3", true),
            ("^\\d$", "\u{663}", false),
            ("^[\\d]+$", "\u{663}\u{663}", false),
            ("^\\D$", "\u{663}", true),
            ("^\\w+$", "abc_9", true),
            ("^\\w+$", "caf\u{e9}", false),
            ("^\\s$", "\u{a0}", true),
            ("^\\s$", "\u{85}", false),
            ("^.$", "\u{2028}", false),
        ] {
            let t = checked_with(json!({"type": "string", "pattern": pattern}), None);
            assert_eq!(t.validate_arguments(&json!({"text": value})).is_ok(), matches, "{pattern} on {value:?}");
            assert_eq!(t.validate_output(&json!(value)).is_ok(), matches, "{pattern} on {value:?}");
        }
        // The difference, pinned so a change to it is seen: ECMA's `\b` is
        // between `é` (no word character) and `a`, so Ajv accepts these.
        let t = checked_with(json!({"type": "string", "pattern": "\u{e9}\\b"}), None);
        assert!(t.validate_output(&json!("\u{e9}a")).is_err());
    }
}
