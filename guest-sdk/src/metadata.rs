//! The metadata wire format: what a Tool component says about itself.
//!
//! This module owns the one definition of a Tool's model-visible identity
//! ([`ToolDescriptor`]) and of the capabilities it declares. The `toolgate pack`
//! step embeds a [`ComponentMetadata`] document in the component's
//! [`METADATA_SECTION`] custom section; the host reads it back without running
//! the component. It holds identity, schema and declared needs only: never an
//! executable handle, a grant or a secret.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Name of the custom section that carries the [`ComponentMetadata`] JSON.
pub const METADATA_SECTION: &str = "toolgate-metadata";
/// Name of the custom section holding a component's own pinned data (what
/// the `pinned` import returns): a Skill's content, an MCP adapter's pins.
pub const PINNED_SECTION: &str = "toolgate-pinned";
/// Version of the metadata document layout.
pub const METADATA_FORMAT: u32 = 1;
/// The WIT package every Tool component targets.
pub const WIT_PACKAGE: &str = "toolgate:plugin";
/// The WIT package version this SDK builds against.
pub const WIT_VERSION: &str = "0.1.0";

/// A Tool's model-visible identity and input contract.
///
/// Built by [`ToolDescriptor::for_tool`] for typed Tools; nobody writes one by
/// hand. It contains no handle, grant or secret (DESIGN.md invariant 6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDescriptor {
    /// Unique id across a plugin directory, e.g. `text.upper`.
    pub id: String,
    /// What the Tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments; the root is `type: object`.
    pub input_schema: serde_json::Value,
    /// JSON Schema of the output, where the Tool has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
    /// Behaviour hints for clients (MCP tool annotations).
    #[serde(default)]
    pub annotations: Annotations,
    /// The argument that permission rules such as `fs.read(data/**)` match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_argument: Option<String>,
}

impl ToolDescriptor {
    /// The descriptor of a typed Tool: `T::ID`, `T::DESCRIPTION` and the JSON
    /// Schema of `T::Args` (and `T::Output`), derived with schemars.
    pub fn for_tool<T: crate::Tool>() -> Self {
        ToolDescriptor {
            id: T::ID.to_owned(),
            description: T::DESCRIPTION.to_owned(),
            input_schema: schema_of::<T::Args>(),
            output_schema: Some(schema_of::<T::Output>()),
            annotations: T::annotations(),
            primary_argument: T::PRIMARY_ARGUMENT.map(str::to_owned),
        }
    }
}

fn schema_of<S: JsonSchema>() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with_transform(schemars::transform::RecursiveTransform(without_numeric_format))
        .into_generator();
    generator.into_root_schema_for::<S>().to_value()
}

/// schemars marks Rust's number types with formats of its own (`uint`,
/// `int64`, `double`, …) that JSON Schema does not define: clients warn about
/// them (the TypeScript SDK's validator logs `unknown format "uint" ignored`)
/// and some model APIs refuse a schema with a format they do not know. The
/// bounds that matter stay (`minimum: 0` of an unsigned type, `maximum` of a
/// small one).
fn without_numeric_format(schema: &mut schemars::Schema) {
    const NUMERIC: &[&str] = &[
        "int", "int8", "int16", "int32", "int64", "int128", "uint", "uint8", "uint16", "uint32", "uint64", "uint128",
        "float", "double",
    ];
    if schema.get("format").and_then(|f| f.as_str()).is_some_and(|f| NUMERIC.contains(&f)) {
        schema.remove("format");
    }
}

/// Behaviour hints (the MCP `ToolAnnotations` vocabulary). Hints, not grants:
/// the host's policy decides what runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Annotations {
    /// The Tool does not change its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// The Tool may perform destructive updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    /// Calling twice with the same arguments has no additional effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// The Tool interacts with an open world (e.g. the internet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

/// The authority a Tool says it needs. A declaration is a request: the host
/// grants at most this, intersected with its own configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredCapabilities {
    /// Directories, by the path the guest will see.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directories: Vec<DirectoryNeed>,
    /// Outbound HTTP destinations, `scheme://host:port` (host may be `*.domain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Credential references by name; never a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
}

impl DeclaredCapabilities {
    /// No authority at all: the default.
    pub fn none() -> Self {
        Self::default()
    }
    /// Add a directory the Tool needs at `guest_path`.
    pub fn directory(mut self, guest_path: &str, access: Access) -> Self {
        self.directories.push(DirectoryNeed { path: guest_path.to_owned(), access });
        self
    }
    /// Add an outbound HTTP destination.
    pub fn host(mut self, destination: &str) -> Self {
        self.hosts.push(destination.to_owned());
        self
    }
    /// Add a credential reference.
    pub fn credential(mut self, name: &str) -> Self {
        self.credentials.push(name.to_owned());
        self
    }
}

/// One directory a Tool needs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryNeed {
    /// Absolute path inside the guest, e.g. `/data`.
    pub path: String,
    /// Read or read-write.
    pub access: Access,
}

/// Access to a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Also create, write and remove.
    ReadWrite,
}

/// Everything the host knows about one Tool before running anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolMetadata {
    /// Identity and schema.
    pub descriptor: ToolDescriptor,
    /// Declared needs.
    #[serde(default)]
    pub capabilities: DeclaredCapabilities,
    /// Set when the Tool is an Agent Skill (packed by `toolgate skill pack`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<SkillInfo>,
}

/// What a Skill adds to its Tool: the tools it may use once activated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillInfo {
    /// Tool ids or globs (`allowed-tools` in SKILL.md). Once the Skill is
    /// activated in a run, other calls of that run are limited to these —
    /// a narrowing of what the agent may already do, never a grant. `None`
    /// when the Skill does not restrict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
}

/// The document in the [`METADATA_SECTION`] custom section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentMetadata {
    /// Layout version, [`METADATA_FORMAT`].
    pub format: u32,
    /// The WIT package the component was built against, e.g. `toolgate:plugin@0.1.0`.
    pub wit: String,
    /// The SDK version that produced the document.
    pub sdk: String,
    /// Every Tool the component exports.
    pub tools: Vec<ToolMetadata>,
}

impl ComponentMetadata {
    /// A document for `tools`, stamped with this SDK's versions.
    pub fn new(tools: Vec<ToolMetadata>) -> Self {
        ComponentMetadata {
            format: METADATA_FORMAT,
            wit: format!("{WIT_PACKAGE}@{WIT_VERSION}"),
            sdk: env!("CARGO_PKG_VERSION").to_owned(),
            tools,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No format JSON Schema does not define: schemars' own number formats
    /// (`uint`, `uint32`, `double`) are dropped, their bounds kept.
    #[test]
    fn number_fields_carry_no_format_json_schema_does_not_define() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Numbers {
            count: usize,
            small: u8,
            signed: Option<i64>,
            ratio: f64,
            nested: Vec<u32>,
        }
        let schema = schema_of::<Numbers>();
        let text = schema.to_string();
        for format in ["uint", "int64", "double", "uint8", "uint32"] {
            assert!(!text.contains(&format!("\"{format}\"")), "{format} in {text}");
        }
        assert_eq!(schema["properties"]["count"]["minimum"], 0, "{text}");
        assert_eq!(schema["properties"]["small"]["maximum"], 255, "{text}");
    }
}
