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
    ComponentMetadata, METADATA_FORMAT, METADATA_SECTION, ToolMetadata, WIT_PACKAGE, WIT_VERSION,
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

/// Why a file is not a loadable Tool component. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// Empty or not WebAssembly at all.
    #[error("not a WebAssembly file; build the Tool with `cargo build --target wasm32-wasip2` and pack it with `toolgate pack`")]
    NotWasm,
    /// A core module, not a component.
    #[error("a core WebAssembly module, not a component; build for `wasm32-wasip2` (which emits a component) and pack it with `toolgate pack`")]
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
    /// Metadata too large.
    #[error("`{METADATA_SECTION}` section is {0} bytes, more than the {MAX_METADATA_BYTES} allowed")]
    MetadataTooLarge(usize),
    /// Metadata is not the expected JSON document.
    #[error("`{METADATA_SECTION}` section is not valid metadata: {0}; re-run `toolgate pack` with a matching toolgate-sdk")]
    BadMetadata(String),
    /// Another metadata layout version.
    #[error("metadata format {found} is not supported (this host reads format {METADATA_FORMAT}); rebuild with a matching toolgate-sdk")]
    UnsupportedFormat {
        /// The format the file declares.
        found: u32,
    },
    /// Built against an incompatible WIT package version.
    #[error("built against `{found}`, but this host implements `{WIT_PACKAGE}@{WIT_VERSION}`; rebuild the Tool with a toolgate-sdk for {WIT_PACKAGE}@{WIT_VERSION}")]
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

    /// Validate `arguments` against the input schema. The error lists what is
    /// wrong in words the model can act on.
    pub fn validate_arguments(&self, arguments: &serde_json::Value) -> Result<(), String> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(arguments)
            .take(5)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() { e.to_string() } else { format!("at `{at}`: {e}") }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "invalid arguments for `{}`: {}",
                self.id(),
                problems.join("; ")
            ))
        }
    }
}

/// Read and check the metadata of a component without compiling it.
pub fn read_metadata(bytes: &[u8]) -> Result<Vec<Arc<CheckedTool>>, DescriptorError> {
    let scan = scan(bytes)?;
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
    let env: Envelope =
        serde_json::from_slice(raw).map_err(|e| DescriptorError::BadMetadata(e.to_string()))?;
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

fn check_document(doc: ComponentMetadata) -> Result<Vec<Arc<CheckedTool>>, DescriptorError> {
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
            return Err(bad(
                "input schema root is not `type: object`; make `Args` a struct".into(),
            ));
        }
        let validator = compile_schema(&d.input_schema).map_err(|e| bad(format!("input schema: {e}")))?;
        if let Some(out_schema) = &d.output_schema {
            compile_schema(out_schema).map_err(|e| bad(format!("output schema: {e}")))?;
        }
        if let Some(p) = &d.primary_argument {
            let declared = d.input_schema.get("properties").and_then(|ps| ps.get(p)).is_some();
            if !declared {
                return Err(bad(format!(
                    "primary argument `{p}` is not a property of the input schema"
                )));
            }
        }
        for dir in &tool.capabilities.directories {
            if !dir.path.starts_with('/') || dir.path.split('/').any(|c| c == "..") {
                return Err(bad(format!(
                    "declared directory `{}` must be an absolute guest path without `..`",
                    dir.path
                )));
            }
        }
        out.push(Arc::new(CheckedTool { metadata: tool, validator }));
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
    jsonschema::validator_for(schema).map_err(|e| e.to_string())
}

struct Scan<'a> {
    metadata: Vec<&'a [u8]>,
    exports_tool: bool,
}

/// Walk the component's top-level sections only.
fn scan(bytes: &[u8]) -> Result<Scan<'_>, DescriptorError> {
    if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
        return Err(DescriptorError::NotWasm);
    }
    let mut parser = Parser::new(0);
    let mut offset = 0usize;
    let mut out = Scan { metadata: Vec::new(), exports_tool: false };
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
            Payload::ModuleSection { unchecked_range, .. }
            | Payload::ComponentSection { unchecked_range, .. } => {
                // Nested modules are the guest's code: skip without parsing
                // (the outer parser resumes after the nested range).
                offset += unchecked_range.end - unchecked_range.start;
                if offset > bytes.len() {
                    return Err(DescriptorError::Malformed("unexpected end of file".into()));
                }
            }
            Payload::CustomSection(c) if c.name() == METADATA_SECTION => out.metadata.push(c.data()),
            Payload::ComponentExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(|e| DescriptorError::Malformed(e.message().to_owned()))?;
                    if let Some(version) = export.name.name.strip_prefix(&tool_export) {
                        if !same_line(version, WIT_VERSION) {
                            return Err(DescriptorError::IncompatibleWit {
                                found: format!("{WIT_PACKAGE}@{version}"),
                            });
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

/// The component bytes with `doc` as its one metadata section (replacing any
/// earlier one). Used by `toolgate pack`.
pub fn embed_metadata(component: &[u8], doc: &ComponentMetadata) -> Result<Vec<u8>, DescriptorError> {
    let json = serde_json::to_vec(doc).map_err(|e| DescriptorError::BadMetadata(e.to_string()))?;
    if json.len() > MAX_METADATA_BYTES {
        return Err(DescriptorError::MetadataTooLarge(json.len()));
    }
    // Copy every top-level section except an old metadata section, verbatim.
    let mut out = Vec::with_capacity(component.len() + json.len() + 32);
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
            Payload::ModuleSection { unchecked_range, .. }
            | Payload::ComponentSection { unchecked_range, .. } => {
                offset += unchecked_range.end - unchecked_range.start;
                out.extend_from_slice(slice(component, start, offset)?);
            }
            Payload::CustomSection(c) if c.name() == METADATA_SECTION => {}
            Payload::End(_) => break,
            _ => out.extend_from_slice(slice(component, start, offset)?),
        }
    }
    let section = wasm_encoder::CustomSection {
        name: METADATA_SECTION.into(),
        data: std::borrow::Cow::Borrowed(&json),
    };
    wasm_encoder::ComponentSection::append_to_component(&section, &mut out);
    Ok(out)
}

fn slice(bytes: &[u8], start: usize, end: usize) -> Result<&[u8], DescriptorError> {
    bytes.get(start..end).ok_or_else(|| DescriptorError::Malformed("section extends past the end of the file".into()))
}
