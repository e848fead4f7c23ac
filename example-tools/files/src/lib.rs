//! A file tool over a granted directory: read a file, search for a text.
//! It declares `/data` read-only; the host decides which host directory (if
//! any) appears there. Paths are relative to `/data`; escapes fail.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgate_sdk::{Access, Annotations, Context, DeclaredCapabilities, Tool, ToolError};

const ROOT: &str = "/data";
const MAX_READ: u64 = 256 * 1024;

fn needs() -> DeclaredCapabilities {
    DeclaredCapabilities::none().directory(ROOT, Access::Read)
}

fn read_only() -> Annotations {
    Annotations { read_only: Some(true), idempotent: Some(true), open_world: Some(false), ..Default::default() }
}

fn resolve(path: &str) -> String {
    format!("{ROOT}/{}", path.trim_start_matches('/'))
}

/// Arguments of `files.read`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// Path relative to the data directory, e.g. `notes/today.md`.
    pub path: String,
}

/// `files.read`: read a text file.
pub struct Read;
impl Tool for Read {
    const ID: &'static str = "files.read";
    const DESCRIPTION: &'static str = "Read a UTF-8 text file (at most 256 KiB) from the data directory.";
    const PRIMARY_ARGUMENT: Option<&'static str> = Some("path");
    type Args = ReadArgs;
    type Output = String;
    fn capabilities() -> DeclaredCapabilities {
        needs()
    }
    fn annotations() -> Annotations {
        read_only()
    }
    fn call(args: ReadArgs, _cx: &mut Context<'_>) -> Result<String, ToolError> {
        let path = resolve(&args.path);
        let meta =
            std::fs::metadata(&path).map_err(|e| ToolError::failed(format!("cannot read `{}`: {e}", args.path)))?;
        if meta.len() > MAX_READ {
            return Err(ToolError::failed(format!("`{}` is {} bytes, more than {MAX_READ}", args.path, meta.len())));
        }
        std::fs::read_to_string(&path).map_err(|e| ToolError::failed(format!("cannot read `{}`: {e}", args.path)))
    }
}

/// Arguments of `files.search`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Text to look for (case-sensitive).
    pub query: String,
    /// Directory to search, relative to the data directory; default the whole of it.
    #[serde(default)]
    pub dir: Option<String>,
}

/// One match.
#[derive(Serialize, JsonSchema)]
pub struct Hit {
    /// File, relative to the data directory.
    pub path: String,
    /// 1-based line number.
    pub line: usize,
    /// The line.
    pub text: String,
}

/// `files.search`: find lines containing a text.
pub struct Search;
impl Tool for Search {
    const ID: &'static str = "files.search";
    const DESCRIPTION: &'static str =
        "Find lines containing a text in the files of the data directory (at most 100 hits).";
    const PRIMARY_ARGUMENT: Option<&'static str> = Some("query");
    type Args = SearchArgs;
    type Output = Vec<Hit>;
    fn capabilities() -> DeclaredCapabilities {
        needs()
    }
    fn annotations() -> Annotations {
        read_only()
    }
    fn call(args: SearchArgs, _cx: &mut Context<'_>) -> Result<Vec<Hit>, ToolError> {
        let start = args.dir.as_deref().unwrap_or("");
        let mut hits = Vec::new();
        let mut stack = vec![start.trim_matches('/').to_owned()];
        while let Some(rel) = stack.pop() {
            let entries =
                std::fs::read_dir(resolve(&rel)).map_err(|e| ToolError::failed(format!("cannot list `{rel}`: {e}")))?;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
                let Ok(ft) = entry.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(child);
                } else if ft.is_file() {
                    let Ok(text) = std::fs::read_to_string(resolve(&child)) else { continue };
                    for (i, line) in text.lines().enumerate() {
                        if line.contains(&args.query) {
                            hits.push(Hit { path: child.clone(), line: i + 1, text: line.to_owned() });
                            if hits.len() >= 100 {
                                return Ok(hits);
                            }
                        }
                    }
                }
            }
        }
        hits.sort_by(|a, b| (&a.path, a.line).cmp(&(&b.path, b.line)));
        Ok(hits)
    }
}

toolgate_sdk::export_tools!(Read, Search);
