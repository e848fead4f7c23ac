//! Skill: an Agent Skill's content as pinned data, and the generic Skill
//! adapter that serves it.
//!
//! `toolgate skill pack` reads a Skill folder and writes a [`SkillData`] into
//! the `toolgate-pinned` section of the prebuilt Skill component shipped in
//! `toolgate`; no code is generated. The component describes itself from that
//! data (one descriptor source: the Skill's frontmatter) and returns the
//! instructions, or one resource, when called. It holds no authority.

use serde::{Deserialize, Serialize};

use crate::metadata::{Annotations, ComponentMetadata, SkillInfo, ToolDescriptor, ToolMetadata};
use crate::{Content, RawOutput, StateView, ToolError};

/// Everything a Skill component knows, pinned when it was packed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillData {
    /// The Tool id, `skill.<name>`.
    pub id: String,
    /// The Skill's `description`, for the model.
    pub description: String,
    /// The Markdown body of `SKILL.md`.
    pub instructions: String,
    /// `allowed-tools`; `None` when the Skill does not restrict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// Files of `references/` and `assets/`, by relative path.
    #[serde(default)]
    pub resources: Vec<Resource>,
}

/// One resource file of a Skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    /// Path relative to the Skill folder, e.g. `references/guide.md`.
    pub path: String,
    /// The text, when the file is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Size in bytes.
    pub bytes: u64,
}

impl SkillData {
    /// Read pinned bytes.
    pub fn from_pinned(data: &[u8]) -> Result<SkillData, ToolError> {
        serde_json::from_slice(data)
            .map_err(|e| ToolError::failed(format!("the Skill's pinned data is unreadable: {e}")))
    }

    /// The metadata document: one read-only Tool carrying `allowed-tools`.
    pub fn metadata(&self) -> ComponentMetadata {
        let input_schema = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Args",
            "description": "Arguments of a Skill.",
            "type": "object",
            "properties": {
                "resource": {
                    "description": "A resource to read (e.g. `references/guide.md`); omit it to get the Skill's instructions.",
                    "type": ["string", "null"],
                    "default": null
                }
            },
            "additionalProperties": false
        });
        let output_schema = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "String",
            "type": "string"
        });
        ComponentMetadata::new(vec![ToolMetadata {
            descriptor: ToolDescriptor {
                id: self.id.clone(),
                description: self.description.clone(),
                input_schema,
                output_schema: Some(output_schema),
                annotations: Annotations {
                    read_only: Some(true),
                    idempotent: Some(true),
                    open_world: Some(false),
                    ..Default::default()
                },
                primary_argument: None,
            },
            capabilities: Default::default(),
            skill: Some(SkillInfo { allowed_tools: self.allowed_tools.clone() }),
        }])
    }

    /// The instructions (with the list of resources), or one resource.
    pub fn call(&self, tool_id: &str, arguments: &str) -> Result<RawOutput, ToolError> {
        if tool_id != self.id {
            return Err(ToolError::failed(format!("this component does not export a Tool `{tool_id}`")));
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Args {
            #[serde(default)]
            resource: Option<String>,
        }
        let value: serde_json::Value = serde_json::from_str(arguments)
            .map_err(|e| ToolError::InvalidArguments(format!("arguments for `{tool_id}` are not JSON: {e}")))?;
        let value = if value.is_null() { serde_json::json!({}) } else { value };
        let args: Args = serde_json::from_value(value)
            .map_err(|e| ToolError::InvalidArguments(format!("invalid arguments for `{tool_id}`: {e}")))?;
        let names: Vec<&str> = self.resources.iter().map(|r| r.path.as_str()).collect();
        let text = match args.resource {
            None if names.is_empty() => self.instructions.clone(),
            None => format!("{}\n\nResources (read one with `resource`): {}", self.instructions, names.join(", ")),
            Some(r) => match self.resources.iter().find(|x| x.path == r) {
                Some(Resource { text: Some(t), .. }) => t.clone(),
                Some(Resource { bytes, .. }) => format!("(binary resource, {bytes} bytes)"),
                None => {
                    return Err(ToolError::InvalidArguments(format!(
                        "no resource `{r}`; available: {}",
                        names.join(", ")
                    )));
                }
            },
        };
        let json = serde_json::to_string(&text).map_err(|e| ToolError::failed(e.to_string()))?;
        Ok(RawOutput { content: Content::Json(json), commands: Vec::new() })
    }
}

/// The generic Skill adapter (`export_adapter!(toolgate_sdk::skill::SkillAdapter)`).
pub struct SkillAdapter;

impl crate::Adapter for SkillAdapter {
    fn metadata(pinned: &[u8]) -> Result<ComponentMetadata, ToolError> {
        Ok(SkillData::from_pinned(pinned)?.metadata())
    }
    fn call(pinned: &[u8], tool_id: &str, arguments: &str, _state: &dyn StateView) -> Result<RawOutput, ToolError> {
        SkillData::from_pinned(pinned)?.call(tool_id, arguments)
    }
}
