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
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use toolgate_sdk::skill::{Resource, SkillData};

use crate::mcp_import::ConfiguredSecrets;

/// Largest total size of a Skill's files. Packed as JSON, they must also fit
/// a host's [`MAX_PINNED_BYTES`](toolgate::catalog::descriptor::MAX_PINNED_BYTES),
/// twice this: text escapes to at most twice its bytes, but for control
/// characters (`\u0001`), which [`pack`] refuses past that cap.
pub const MAX_SKILL_BYTES: u64 = 4 << 20;

/// Why a Skill cannot be packed. Messages name the file and field; the
/// folder's text in them (a file's name, a frontmatter value) is shown on
/// one line ([`crate::one_line`]).
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// Reading the folder failed.
    #[error("{}: {}", crate::one_line(&path.to_string_lossy()), crate::one_line(.message))]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// SKILL.md is not valid.
    #[error(
        "{}: field `{}`: {}",
        crate::one_line(&path.to_string_lossy()),
        crate::one_line(.field),
        crate::one_line(.message)
    )]
    Frontmatter {
        /// SKILL.md.
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// SKILL.md's frontmatter, each field read on its own so an error names it.
#[derive(Debug)]
struct Frontmatter {
    name: String,
    description: String,
    allowed_tools: Option<Vec<String>>,
}

/// The fields a frontmatter may hold.
const FIELDS: &str = "name, description, allowed-tools, license, compatibility, metadata";

/// What `allowed-tools` takes.
const ALLOWED_TOOLS: &str = "must be a list or a space/comma-separated line of tool ids (e.g. \
                             `allowed-tools: text.upper notes` or `allowed-tools: [text.upper, notes]`)";

/// The YAML between the `---` lines, read field by field: `field` makes the
/// error for a field (the frontmatter as a whole is `frontmatter`).
fn frontmatter(yaml: &str, field: &dyn Fn(&str, String) -> SkillError) -> Result<Frontmatter, SkillError> {
    use serde_yaml_ng::Value;
    let value: Value = serde_yaml_ng::from_str(yaml)
        .map_err(|e| field("frontmatter", format!("is not valid YAML: {e}; write one `field: value` per line")))?;
    let map = match value {
        Value::Null => {
            return Err(field(
                "name",
                "is missing: the frontmatter is empty; give at least `name` and `description`".into(),
            ));
        }
        Value::Mapping(m) => m,
        _ => return Err(field("frontmatter", format!("must be `field: value` lines (fields: {FIELDS})"))),
    };
    let kind = |v: &Value| match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a true/false value",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    };
    let (mut name, mut description, mut allowed_tools) = (None, None, None);
    for (k, v) in &map {
        let Some(k) = k.as_str() else {
            return Err(field("frontmatter", format!("a key is {}, not a field name (fields: {FIELDS})", kind(k))));
        };
        let text = |v: &Value| match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(field(k, format!("must be text, not {}; quote it (`{k}: \"…\"`)", kind(other)))),
        };
        match k {
            "name" => name = Some(text(v)?),
            "description" => description = Some(text(v)?),
            "license" | "compatibility" => {
                text(v)?;
            }
            "metadata" => {}
            "allowed-tools" => {
                allowed_tools = Some(match v {
                    Value::String(line) => {
                        line.split([' ', ',']).filter(|s| !s.is_empty()).map(str::to_owned).collect()
                    }
                    Value::Sequence(items) => items
                        .iter()
                        .map(|i| i.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| field(k, format!("{ALLOWED_TOOLS}; an item of the list is not text")))?,
                    other => return Err(field(k, format!("{ALLOWED_TOOLS}, not {}", kind(other)))),
                });
            }
            _ => return Err(field(k, format!("unknown field; the fields are {FIELDS}"))),
        }
    }
    let missing = |f: &str, what: &str| field(f, format!("is missing; add `{f}: {what}` to the frontmatter"));
    Ok(Frontmatter {
        name: name.ok_or_else(|| missing("name", "the-folder-name"))?,
        description: description.ok_or_else(|| missing("description", "what the Skill does and when to use it"))?,
        allowed_tools,
    })
}

/// `rest` (SKILL.md after its opening `---` line) split at the closing
/// `---` line: the frontmatter and the body after it.
fn split_frontmatter(rest: &str) -> Option<(&str, &str)> {
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..at], &rest[at + line.len()..]));
        }
        at += line.len();
    }
    None
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
///
/// The folder is opened once (following the path the operator gave) and
/// everything packed — `SKILL.md`, `references/`, `assets/` and what is
/// below them — is opened relative to it without following a symlink, on
/// the folder's own file system. A symlink, a FIFO, socket or device, or a
/// mount point anywhere in what is packed is refused, naming its path: a
/// Skill folder comes from someone else, and a `references -> ~/.ssh` would
/// otherwise pack the operator's own files into the Tool the model reads.
pub fn read(dir: &Path) -> Result<SkillSource, SkillError> {
    let root = Folder::open(dir)?;
    let md_path = dir.join("SKILL.md");
    let text = match root.entry(&root.fd, "SKILL.md", &md_path)? {
        Some(Entry::File(file, _)) => read_file(file, &md_path, MAX_SKILL_BYTES)?,
        Some(Entry::Dir(_)) => return Err(refused(&md_path, "is a folder; SKILL.md must be a file")),
        None => return Err(refused(&md_path, "cannot read: there is no SKILL.md in the Skill folder")),
    };
    let text = String::from_utf8(text).map_err(|_| refused(&md_path, "is not UTF-8 text"))?;
    // Editors on Windows (Notepad, PowerShell) start a UTF-8 file with a byte order mark.
    let text = text.strip_prefix('\u{feff}').map(str::to_owned).unwrap_or(text);
    let field = |field: &str, message: String| SkillError::Frontmatter {
        path: md_path.clone(),
        field: field.to_owned(),
        message,
    };
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or_else(|| field("frontmatter", "SKILL.md must start with a `---` YAML frontmatter block".into()))?;
    let (yaml, body) = split_frontmatter(rest).ok_or_else(|| {
        field("frontmatter", "the frontmatter block is not closed: end it with a line of `---` before the body".into())
    })?;
    let body = body.trim_start_matches(['\r', '\n']).to_owned();
    let fm = frontmatter(yaml, &field)?;
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
    let chars = fm.description.chars().count();
    if fm.description.trim().is_empty() || chars > 1024 {
        let is = if chars > 1024 { format!("is {chars} characters") } else { "is blank".to_owned() };
        return Err(field(
            "description",
            format!("{is}; say what the Skill does and when to use it, in 1 to 1024 characters"),
        ));
    }
    let allowed_tools = fm.allowed_tools;
    for t in allowed_tools.iter().flatten() {
        let id_like = t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '*' | '?'));
        if !id_like {
            return Err(field("allowed-tools", format!("`{t}` is not a tool id or glob (e.g. `text.*`)")));
        }
    }
    let mut resources = BTreeMap::new();
    let mut total = text.len() as u64;
    for sub in ["references", "assets"] {
        let path = dir.join(sub);
        match root.entry(&root.fd, sub, &path)? {
            Some(Entry::Dir(fd)) => root.collect(&fd, &path, sub, 1, &mut resources, &mut total)?,
            Some(Entry::File(..)) => {
                return Err(refused(&path, &format!("is a file; `{sub}` must be a folder of the Skill's {sub}")));
            }
            None => {}
        }
    }
    Ok(SkillSource {
        name: fm.name,
        description: fm.description.trim().to_owned(),
        allowed_tools,
        instructions: body,
        resources,
    })
}

/// How deep folders may nest below `references/` or `assets/`.
const MAX_DEPTH: usize = 32;

fn refused(path: &Path, message: &str) -> SkillError {
    SkillError::Read { path: path.to_owned(), message: message.to_owned() }
}

/// What `read` refuses a symlink with: what it is and what to do.
const SYMLINK: &str = "is a symlink; a Skill is packed from its own files only, and a symlink can lead anywhere \
                       (`references -> ~/.ssh` would pack the operator's files into the Tool): replace the symlink \
                       with the file itself (for a folder, a copy of what it holds)";

/// The opened Skill folder: the descriptor everything packed is opened
/// relative to, and the file system it is on.
struct Folder {
    fd: rustix::fd::OwnedFd,
    dev: u64,
}

/// One name in a folder of the Skill, opened: a regular file (with its
/// size) or a folder, on the Skill folder's file system.
enum Entry {
    File(std::fs::File, u64),
    Dir(rustix::fd::OwnedFd),
}

impl Folder {
    /// The folder at `dir`: the path the operator gave, followed.
    fn open(dir: &Path) -> Result<Folder, SkillError> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| refused(dir, &format!("cannot open the Skill folder: {}", std::io::Error::from(e))))?;
        let stat = rustix::fs::fstat(&fd)
            .map_err(|e| refused(dir, &format!("cannot read the Skill folder: {}", std::io::Error::from(e))))?;
        Ok(Folder { fd, dev: stat.st_dev as u64 })
    }

    /// `name` in the folder `parent` (shown as `path`), opened without
    /// following a symlink; `None` when there is nothing of that name. A
    /// symlink, anything but a regular file or folder, or something on
    /// another file system is refused, naming `path`.
    fn entry(&self, parent: &rustix::fd::OwnedFd, name: &str, path: &Path) -> Result<Option<Entry>, SkillError> {
        use rustix::fs::{AtFlags, FileType, Mode, OFlags};
        let io = |e: rustix::io::Errno| refused(path, &format!("cannot read: {}", std::io::Error::from(e)));
        let before = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let kind = FileType::from_raw_mode(before.st_mode);
        let flags = match kind {
            FileType::RegularFile => OFlags::empty(),
            FileType::Directory => OFlags::DIRECTORY,
            FileType::Symlink => return Err(refused(path, SYMLINK)),
            other => {
                return Err(refused(
                    path,
                    &format!(
                        "is a {}, not a file or folder; a Skill is packed from its own regular files only: remove it",
                        match other {
                            FileType::Fifo => "FIFO",
                            FileType::Socket => "socket",
                            FileType::CharacterDevice | FileType::BlockDevice => "device",
                            _ => "special file",
                        }
                    ),
                ));
            }
        };
        if before.st_dev as u64 != self.dev {
            return Err(refused(
                path,
                "is on another file system than the Skill folder (a mount point); a Skill is packed from its own \
                 folder only: copy what it holds into the Skill folder",
            ));
        }
        // Opened without following, without blocking, and checked to be the
        // very object just looked at: a symlink or FIFO swapped in between
        // is refused, never read.
        let fd = rustix::fs::openat(
            parent,
            name,
            flags | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| if e == rustix::io::Errno::LOOP { refused(path, SYMLINK) } else { io(e) })?;
        let after = rustix::fs::fstat(&fd).map_err(io)?;
        if (after.st_dev, after.st_ino, FileType::from_raw_mode(after.st_mode)) != (before.st_dev, before.st_ino, kind)
        {
            return Err(refused(path, "changed while it was read; pack the Skill again once nothing is changing it"));
        }
        Ok(Some(match kind {
            FileType::Directory => Entry::Dir(fd),
            _ => Entry::File(std::fs::File::from(fd), after.st_size as u64),
        }))
    }

    /// Every file below the folder `dir` (shown as `path`, packed as `rel`),
    /// into `out`; `total` counts the bytes of the Skill so far, the names
    /// included.
    fn collect(
        &self,
        dir: &rustix::fd::OwnedFd,
        path: &Path,
        rel: &str,
        depth: usize,
        out: &mut BTreeMap<String, Vec<u8>>,
        total: &mut u64,
    ) -> Result<(), SkillError> {
        if depth > MAX_DEPTH {
            return Err(refused(path, &format!("folders nest more than {MAX_DEPTH} deep in a Skill")));
        }
        let io = |e: rustix::io::Errno| refused(path, &format!("cannot list: {}", std::io::Error::from(e)));
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let shown = path.join(std::ffi::OsStr::from_bytes(name));
            let name = std::str::from_utf8(name)
                .map_err(|_| refused(&shown, "has a name that is not UTF-8; rename it"))?
                .to_owned();
            names.push((name, shown));
        }
        names.sort();
        for (name, shown) in names {
            let packed = format!("{rel}/{name}");
            *total += packed.len() as u64;
            let left = MAX_SKILL_BYTES.checked_sub(*total).ok_or_else(|| too_large(&shown))?;
            match self.entry(dir, &name, &shown)? {
                Some(Entry::Dir(sub)) => self.collect(&sub, &shown, &packed, depth + 1, out, total)?,
                Some(Entry::File(file, size)) => {
                    if size > left {
                        return Err(too_large(&shown));
                    }
                    let bytes = read_file(file, &shown, left)?;
                    *total += bytes.len() as u64;
                    out.insert(packed, bytes);
                }
                // Gone since it was listed: nothing to pack.
                None => {}
            }
        }
        Ok(())
    }
}

fn too_large(path: &Path) -> SkillError {
    refused(path, &format!("the Skill is larger than {MAX_SKILL_BYTES} bytes"))
}

/// `file` whole, at most `max` bytes (it may grow after its size was read).
fn read_file(file: std::fs::File, path: &Path, max: u64) -> Result<Vec<u8>, SkillError> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| refused(path, &format!("cannot read: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(too_large(path));
    }
    Ok(bytes)
}

impl SkillSource {
    /// Refuse a Skill read from `dir` whose packed content — its
    /// frontmatter, instructions, resources' names and bytes — holds the
    /// secret of a configured credential, in any encoding the host's
    /// response check knows: everything packed is what every model that
    /// sees the Tool reads. The error names the file and the credential,
    /// never the value.
    pub fn refuse_secrets(&self, dir: &Path, secrets: &ConfiguredSecrets) -> Result<(), SkillError> {
        let scanner = secrets.scanner();
        if scanner.is_empty() {
            return Ok(());
        }
        let held = |path: PathBuf, f: toolgate::sandbox::scan::Finding| SkillError::Read {
            path,
            message: format!(
                "holds the secret of credential `{}` ({}); what a Skill packs is read by every model that sees its \
                 Tool, so nothing was written: remove it from the Skill (and if the Skill came from someone else, \
                 they know the secret: rotate it)",
                f.credential, f.form
            ),
        };
        let allowed = self.allowed_tools.iter().flatten().map(String::as_str).collect::<Vec<_>>().join(" ");
        for text in [&self.name, &self.description, &self.instructions, &allowed] {
            if let Some(f) = scanner.find(text.as_bytes()) {
                return Err(held(dir.join("SKILL.md"), f));
            }
        }
        for (name, bytes) in &self.resources {
            if let Some(f) = scanner.find(name.as_bytes()).or_else(|| scanner.find(bytes)) {
                return Err(held(dir.join(name), f));
            }
        }
        Ok(())
    }

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

    const MD: &str = "---\nname: x\ndescription: d\n---\nbody\n";

    /// A Skill at its own cap, of text with quotes and new lines (each
    /// escaped in the JSON it is packed as), fits a host's pinned-data cap.
    #[test]
    fn a_skill_at_its_cap_fits_the_hosts_pinned_data_cap() {
        let (_t, d) = folder("big", "---\nname: big\ndescription: A big one.\n---\n# Big\n");
        std::fs::create_dir(d.join("references")).unwrap();
        let line = "A \"quoted\" line\tof text.\n";
        let text = line.repeat((MAX_SKILL_BYTES as usize - 4096) / line.len());
        std::fs::write(d.join("references/text.md"), &text).unwrap();
        let json = serde_json::to_vec_pretty(&read(&d).unwrap().pinned()).unwrap();
        let cap = toolgate::catalog::descriptor::MAX_PINNED_BYTES;
        assert!(json.len() > text.len() && json.len() <= cap, "{} bytes of JSON", json.len());
    }

    /// What a case is, what it makes in the Skill folder, the path it names.
    type Case<'a> = (&'a str, &'a dyn Fn(&Path), &'a str);

    /// A file of the operator's outside the Skill folder, as a hostile
    /// folder would point at it (`references -> ../../.ssh`).
    fn outside() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("secret.txt"), "the operator's own file").unwrap();
        std::fs::write(t.path().join("SKILL.md"), "---\nname: x\ndescription: d\n---\nthe operator's own file\n")
            .unwrap();
        let d = t.path().to_owned();
        (t, d)
    }

    /// The class: packing reads a file other than the Skill's own. Whatever
    /// leads out of the folder or is not a file of its own — a symlink at
    /// `references` or `assets` themselves, at `SKILL.md`, at a file or a
    /// folder inside them, a FIFO, a socket — is refused naming its path
    /// and what to do, never followed and never skipped in silence.
    #[test]
    fn a_symlink_or_special_file_anywhere_in_a_skill_is_refused_naming_it() {
        let (_o, out) = outside();
        let cases: [Case; 7] = [
            (
                "references -> outside",
                &|d| std::os::unix::fs::symlink(&out, d.join("references")).unwrap(),
                "references",
            ),
            ("assets -> outside", &|d| std::os::unix::fs::symlink(&out, d.join("assets")).unwrap(), "assets"),
            (
                "SKILL.md -> outside",
                &|d| {
                    std::fs::remove_file(d.join("SKILL.md")).unwrap();
                    std::os::unix::fs::symlink(out.join("SKILL.md"), d.join("SKILL.md")).unwrap();
                },
                "SKILL.md",
            ),
            (
                "a file in references -> outside",
                &|d| {
                    std::fs::create_dir(d.join("references")).unwrap();
                    std::os::unix::fs::symlink(out.join("secret.txt"), d.join("references/secret.txt")).unwrap();
                },
                "references/secret.txt",
            ),
            (
                "a file in references -> a file of the Skill",
                &|d| {
                    std::fs::create_dir(d.join("references")).unwrap();
                    std::fs::write(d.join("references/a.md"), "a").unwrap();
                    std::os::unix::fs::symlink("a.md", d.join("references/b.md")).unwrap();
                },
                "references/b.md",
            ),
            (
                "a nested folder -> outside",
                &|d| {
                    std::fs::create_dir_all(d.join("assets/deep")).unwrap();
                    std::os::unix::fs::symlink(&out, d.join("assets/deep/more")).unwrap();
                },
                "assets/deep/more",
            ),
            (
                "a FIFO in references",
                &|d| {
                    std::fs::create_dir(d.join("references")).unwrap();
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        d.join("references/pipe"),
                        rustix::fs::FileType::Fifo,
                        rustix::fs::Mode::from_raw_mode(0o600),
                        0,
                    )
                    .unwrap();
                },
                "references/pipe",
            ),
        ];
        let mut wrong = Vec::new();
        for (what, make, named) in cases {
            let (_t, d) = folder("x", MD);
            make(&d);
            let path = d.join(named).display().to_string();
            match read(&d) {
                Ok(s) => wrong.push(format!(
                    "{what}: packed, instructions {:?}, resources {:?}",
                    s.instructions,
                    s.resources.keys().collect::<Vec<_>>()
                )),
                Err(e) if !e.to_string().contains(&path) => wrong.push(format!("{what}: does not name {path}: {e}")),
                Err(e)
                    if what.contains("->") && !e.to_string().contains("replace the symlink with the file itself") =>
                {
                    wrong.push(format!("{what}: does not say what to do: {e}"))
                }
                Err(_) => {}
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// What a Skill packs is model-visible: content holding a configured
    /// credential's secret (raw or encoded, in SKILL.md or a resource) is
    /// refused naming the file and the credential, never the value.
    #[test]
    fn a_skill_holding_a_configured_secret_is_refused_naming_the_file_and_credential() {
        use toolgate::authority::credentials::{Apply, CredentialConfig, CredentialSpec, Source};
        let var = "TOOLGATE_TEST_SKILL_CONFIGURED";
        let secret = "skill-s3cr3t-value-41c9";
        // SAFETY: only this test uses this variable.
        unsafe { std::env::set_var(var, secret) };
        let config = CredentialConfig {
            source: Source::Env(var.into()),
            destinations: vec!["https://elsewhere.example".into()],
            apply: Apply::Header { name: "X-Key".into(), format: "{}".into() },
        };
        let spec = CredentialSpec::new("tracker", &config, Path::new("/")).unwrap();
        let secrets = ConfiguredSecrets::read([&spec]);
        let b64 = "c2tpbGwtczNjcjN0LXZhbHVlLTQxYzk="; // base64 of the secret
        let cases: [Case; 3] = [
            (
                "instructions, raw",
                &|d| {
                    std::fs::write(d.join("SKILL.md"), format!("---\nname: x\ndescription: d\n---\nkey {secret}\n"))
                        .unwrap()
                },
                "SKILL.md",
            ),
            (
                "description, base64",
                &|d| {
                    std::fs::write(d.join("SKILL.md"), format!("---\nname: x\ndescription: ref {b64}\n---\nb\n"))
                        .unwrap()
                },
                "SKILL.md",
            ),
            (
                "a reference, base64",
                &|d| {
                    std::fs::create_dir(d.join("references")).unwrap();
                    std::fs::write(d.join("references/env.md"), format!("TOKEN={b64}")).unwrap();
                },
                "references/env.md",
            ),
        ];
        for (what, make, named) in cases {
            let (_t, d) = folder("x", MD);
            make(&d);
            let e = read(&d).unwrap().refuse_secrets(&d, &secrets).expect_err(what).to_string();
            assert!(
                e.contains(&d.join(named).display().to_string()) && e.contains("credential `tracker`"),
                "{what}: {e}"
            );
            assert!(!e.contains(secret) && !e.contains(b64), "{what}: {e}");
        }
        let (_t, d) = folder("x", MD);
        read(&d).unwrap().refuse_secrets(&d, &secrets).unwrap();
    }

    /// A Skill's own text in an error — a file's name, a frontmatter value —
    /// stays on the error's line: it cannot print a line of its own that
    /// reads as the host's.
    #[test]
    fn an_error_quoting_the_skills_text_keeps_it_on_one_line() {
        let (_t, d) = folder("x", MD);
        std::fs::create_dir(d.join("references")).unwrap();
        std::os::unix::fs::symlink("elsewhere", d.join("references/a\npacked skill.x into x.wasm")).unwrap();
        let e = read(&d).unwrap_err().to_string();
        assert!(!e.contains('\n') && e.contains("a\\npacked skill.x"), "{e}");
        let (_t, d) = folder("x", "---\nname: x\ndescription: d\nallowed-tools: [\"a\\nhint: all fine\"]\n---\n");
        let e = read(&d).unwrap_err().to_string();
        assert!(!e.contains('\n') && e.contains("a\\nhint: all fine"), "{e}");
    }

    /// A folder that is its own, with nested folders, still packs whole.
    #[test]
    fn nested_folders_of_the_skill_pack_whole() {
        let (_t, d) = folder("x", MD);
        std::fs::create_dir_all(d.join("assets/img/small")).unwrap();
        std::fs::write(d.join("assets/img/small/dot.txt"), ".").unwrap();
        std::fs::create_dir(d.join("references")).unwrap();
        std::fs::write(d.join("references/r.md"), "r").unwrap();
        let s = read(&d).unwrap();
        let names: Vec<_> = s.resources.keys().map(String::as_str).collect();
        assert_eq!(names, ["assets/img/small/dot.txt", "references/r.md"]);
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
            ("empty frontmatter", "---\n---\nbody", "name"),
            ("allowed-tools a number", "---\nname: x\ndescription: d\nallowed-tools: 7\n---\n", "allowed-tools"),
            ("allowed-tools a mapping", "---\nname: x\ndescription: d\nallowed-tools: {a: 1}\n---\n", "allowed-tools"),
            ("license a list", "---\nname: x\ndescription: d\nlicense: [1]\n---\n", "license"),
            ("compatibility a number", "---\nname: x\ndescription: d\ncompatibility: 3\n---\n", "compatibility"),
            ("name a number", "---\nname: 12\ndescription: d\n---\n", "name"),
            ("too long", &format!("---\nname: x\ndescription: {}\n---\n", "d".repeat(1025)), "description"),
        ];
        for (what, md, f) in cases {
            let (_t, d) = folder("x", md);
            let e = read(&d).unwrap_err().to_string();
            assert!(e.contains("SKILL.md") && e.contains(&format!("field `{f}`")), "{what}: {e}");
        }
        let (_t, d) = folder("x", "---\nname: x\ndescription: d\nallowed-tools: 7\n---\n");
        let e = read(&d).unwrap_err().to_string();
        assert!(e.contains("a list or a space/comma-separated line of tool ids") && !e.contains("untagged"), "{e}");
        let (_t, d) = folder("x", "---\n---\nbody");
        let e = read(&d).unwrap_err().to_string();
        assert!(!e.contains("not closed"), "{e}");
    }

    /// The limit is 1024 characters, as the message says, not bytes; a
    /// byte order mark is no part of the file's text.
    #[test]
    fn a_description_is_counted_in_characters_and_a_bom_is_skipped() {
        let (_t, d) = folder("x", &format!("\u{feff}---\nname: x\ndescription: {}\n---\nbody", "é".repeat(1000)));
        let s = read(&d).unwrap();
        assert_eq!(s.description.chars().count(), 1000);
        assert_eq!(s.instructions, "body");
        let (_t, d) = folder("x", "---\nname: x\ndescription: d\n---\n---\nA rule above.\n");
        assert_eq!(read(&d).unwrap().instructions, "---\nA rule above.\n", "the body is kept whole");
    }
}
