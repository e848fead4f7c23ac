//! Skill: packing an Agent Skills folder into a Tool component.
//!
//! Owns reading `SKILL.md` (YAML frontmatter `name`, `description`, optional
//! `allowed-tools`, `license`, `compatibility`, `metadata`; Markdown body) and
//! its `references/` and `assets/`, refusing invalid frontmatter with the
//! field named, and producing a component: the generic Skill adapter shipped
//! in `toolgate` with the Skill's content as its pinned data — a Tool
//! `skill.<name>` whose call returns the instructions, or one resource
//! read-only. No code is generated and no toolchain runs; the component is
//! packed like any Tool, so a Skill is listed, gated and executed on the one
//! path. Its `allowed-tools` travel in the metadata; the runtime narrows a
//! run to them once the Skill is activated — never a grant.
//!
//! Architecture invariant: this is author-side tooling; a host never builds
//! or interprets a Skill folder, it loads the packed component.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use toolgate_sdk::skill::{Resource, SkillData};

/// Largest total size of a Skill's files.
pub const MAX_SKILL_BYTES: u64 = 4 << 20;

/// Why a Skill cannot be packed. Messages name the file and field.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// Reading the folder failed.
    #[error("{}: {message}", path.display())]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// SKILL.md is not valid.
    #[error("{}: field `{field}`: {message}", path.display())]
    Frontmatter {
        /// SKILL.md.
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Frontmatter {
    name: String,
    description: String,
    #[serde(default)]
    allowed_tools: Option<AllowedTools>,
    #[serde(default)]
    license: Option<String>,
    #[serde(default)]
    compatibility: Option<String>,
    #[serde(default)]
    metadata: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum AllowedTools {
    List(Vec<String>),
    Line(String),
}

/// A checked Skill folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillSource {
    /// `name` from the frontmatter.
    pub name: String,
    /// `description`.
    pub description: String,
    /// `allowed-tools`, if given.
    pub allowed_tools: Option<Vec<String>>,
    /// The Markdown body: the instructions.
    pub instructions: String,
    /// Resources by relative path (`references/…`, `assets/…`).
    pub resources: BTreeMap<String, Vec<u8>>,
}

impl SkillSource {
    /// The Tool id the Skill gets.
    pub fn tool_id(&self) -> String {
        format!("skill.{}", self.name)
    }
}

/// Read and check a Skill folder.
pub fn read(dir: &Path) -> Result<SkillSource, SkillError> {
    let md_path = dir.join("SKILL.md");
    let text = std::fs::read_to_string(&md_path)
        .map_err(|e| SkillError::Read { path: md_path.clone(), message: format!("cannot read: {e}") })?;
    let field = |field: &str, message: String| SkillError::Frontmatter {
        path: md_path.clone(),
        field: field.to_owned(),
        message,
    };
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or_else(|| field("frontmatter", "SKILL.md must start with a `---` YAML frontmatter block".into()))?;
    let end = rest
        .find("\n---")
        .ok_or_else(|| field("frontmatter", "the frontmatter block is not closed by `---`".into()))?;
    let (yaml, body) = (&rest[..end], &rest[end + 4..]);
    let body = body.trim_start_matches(['-', '\r', '\n']).to_owned();
    let fm: Frontmatter = serde_yaml_ng::from_str(yaml).map_err(|e| {
        let msg = e.to_string();
        // serde names the offending key in the message (unknown or missing field).
        let f = msg.split('`').nth(1).unwrap_or("frontmatter").to_owned();
        field(&f, msg)
    })?;
    let name_ok = !fm.name.is_empty()
        && fm.name.len() <= 64
        && fm.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !fm.name.starts_with('-')
        && !fm.name.ends_with('-')
        && !fm.name.contains("--");
    if !name_ok {
        return Err(field("name", "use 1 to 64 lowercase letters, digits and single hyphens".into()));
    }
    if let Some(folder) = dir.canonicalize().ok().and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        && folder != fm.name
    {
        return Err(field("name", format!("`{}` must match the folder name `{folder}`", fm.name)));
    }
    if fm.description.trim().is_empty() || fm.description.len() > 1024 {
        return Err(field("description", "say what the Skill does and when to use it, in 1 to 1024 characters".into()));
    }
    let _ = (&fm.license, &fm.compatibility, &fm.metadata);
    let allowed_tools = match fm.allowed_tools {
        None => None,
        Some(AllowedTools::List(v)) => Some(v),
        Some(AllowedTools::Line(l)) => Some(l.split([' ', ',']).filter(|s| !s.is_empty()).map(str::to_owned).collect()),
    };
    for t in allowed_tools.iter().flatten() {
        let id_like = t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '*' | '?'));
        if !id_like {
            return Err(field("allowed-tools", format!("`{t}` is not a tool id or glob (e.g. `text.*`)")));
        }
    }
    let mut resources = BTreeMap::new();
    let mut total = text.len() as u64;
    for sub in ["references", "assets"] {
        collect(&dir.join(sub), sub, &mut resources, &mut total)?;
    }
    Ok(SkillSource {
        name: fm.name,
        description: fm.description.trim().to_owned(),
        allowed_tools,
        instructions: body,
        resources,
    })
}

fn collect(dir: &Path, rel: &str, out: &mut BTreeMap<String, Vec<u8>>, total: &mut u64) -> Result<(), SkillError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in entries.flatten() {
        let path = e.path();
        let name = format!("{rel}/{}", e.file_name().to_string_lossy());
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|err| SkillError::Read { path: path.clone(), message: err.to_string() })?;
        if meta.is_dir() {
            collect(&path, &name, out, total)?;
        } else if meta.is_file() {
            *total += meta.len();
            if *total > MAX_SKILL_BYTES {
                return Err(SkillError::Read {
                    path,
                    message: format!("the Skill is larger than {MAX_SKILL_BYTES} bytes"),
                });
            }
            let bytes = std::fs::read(&path)
                .map_err(|err| SkillError::Read { path: path.clone(), message: err.to_string() })?;
            out.insert(name, bytes);
        }
        // Symlinks are skipped: a Skill ships its own files only.
    }
    Ok(())
}

impl SkillSource {
    /// The pinned data of the Skill's component: everything it serves.
    pub fn pinned(&self) -> SkillData {
        SkillData {
            id: self.tool_id(),
            description: self.description.clone(),
            instructions: self.instructions.clone(),
            allowed_tools: self.allowed_tools.clone(),
            resources: self
                .resources
                .iter()
                .map(|(path, bytes)| Resource {
                    path: path.clone(),
                    text: String::from_utf8(bytes.clone()).ok(),
                    bytes: bytes.len() as u64,
                })
                .collect(),
        }
    }
}

/// The Skill's component: the generic Skill adapter with the Skill's content
/// as its pinned data, packed. No toolchain involved.
pub async fn pack(
    skill: &SkillSource,
) -> Result<(Vec<u8>, Vec<std::sync::Arc<toolgate::catalog::descriptor::CheckedTool>>), crate::pack::PackError> {
    let data = serde_json::to_vec_pretty(&skill.pinned()).map_err(crate::pack::PackError::Malformed)?;
    crate::adapters::assemble(crate::adapters::SKILL, &data).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str, md: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("SKILL.md"), md).unwrap();
        (t, d)
    }

    #[test]
    fn a_valid_skill_reads_with_its_resources() {
        let (_t, d) = folder(
            "notes-style",
            "---\nname: notes-style\ndescription: How to write notes.\nallowed-tools: notes text.*\n---\n# Style\nBe brief.\n",
        );
        std::fs::create_dir(d.join("references")).unwrap();
        std::fs::write(d.join("references/guide.md"), "guide").unwrap();
        let s = read(&d).unwrap();
        assert_eq!(s.tool_id(), "skill.notes-style");
        assert_eq!(s.allowed_tools, Some(vec!["notes".to_owned(), "text.*".to_owned()]));
        assert_eq!(s.instructions, "# Style\nBe brief.\n");
        assert_eq!(s.resources.get("references/guide.md").map(Vec::as_slice), Some(&b"guide"[..]));
    }

    #[test]
    fn invalid_frontmatter_names_the_field() {
        let cases = [
            ("no frontmatter", "# Title\n", "frontmatter"),
            ("unclosed", "---\nname: x\n", "frontmatter"),
            ("missing description", "---\nname: x\n---\nbody", "description"),
            ("bad name", "---\nname: Bad_Name\ndescription: d\n---\n", "name"),
            ("name mismatch", "---\nname: other\ndescription: d\n---\n", "name"),
            ("unknown key", "---\nname: x\ndescription: d\ncolour: red\n---\n", "colour"),
            ("bad allowed-tools", "---\nname: x\ndescription: d\nallowed-tools: Bash(git:*)\n---\n", "allowed-tools"),
            ("empty description", "---\nname: x\ndescription: \"  \"\n---\n", "description"),
        ];
        for (what, md, f) in cases {
            let (_t, d) = folder("x", md);
            let e = read(&d).unwrap_err().to_string();
            assert!(e.contains("SKILL.md") && e.contains(&format!("field `{f}`")), "{what}: {e}");
        }
    }
}
