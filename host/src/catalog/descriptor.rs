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
    Ok((tools_of(&scan)?, pinned_of(&scan)?))
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
        let validator = compile_schema(&d.input_schema).map_err(|e| bad(format!("input schema: {e}")))?;
        let output_validator = match &d.output_schema {
            Some(out_schema) => Some(compile_schema(out_schema).map_err(|e| bad(format!("output schema: {e}")))?),
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
        out.push(Arc::new(CheckedTool { metadata: tool, validator, output_validator }));
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

fn compile_schema(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
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
    // Build with schema validation on; no remote `$ref` resolution is compiled in.
    // Every `pattern` and `patternProperties` key runs on the linear-time
    // `regex` engine: the schema's author (for an MCP adapter, a remote
    // server) is untrusted, and the host runs it on arguments before the gate
    // and on output after the guest's deadline. jsonschema's default,
    // fancy-regex, backtracks on look-around and back-references (a crafted
    // pattern cost ~10^6 steps per string, times every string of a value).
    // Linear is in the compiled size too: bounded, see MAX_PATTERN_BYTES.
    let linear = jsonschema::PatternOptions::regex().size_limit(MAX_PATTERN_BYTES);
    jsonschema::options()
        .with_pattern_options(linear)
        .build(schema)
        .map_err(|e| refused_pattern(&e).unwrap_or_else(|| e.to_string()))
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
            if let Ok(v) = compile_schema(&s) {
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
}
