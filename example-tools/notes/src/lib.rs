//! A state tool: notes kept in the Tool's own committed state. It reads state
//! through the host's read-only view and changes it only by returning Commands,
//! which the host commits atomically with the call's result.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgate_sdk::{Annotations, Context, Tool, ToolError};

const KEY: &str = "notes";

/// What to do.
#[derive(Deserialize, JsonSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Keep `note`.
    Add,
    /// Return all notes.
    List,
    /// Forget all notes.
    Clear,
}

/// Arguments of `notes`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotesArgs {
    /// `add`, `list` or `clear`.
    pub op: Op,
    /// The note, for `add`.
    #[serde(default)]
    pub note: Option<String>,
}

/// What `notes` returns.
#[derive(Serialize, JsonSchema)]
pub struct NotesOutput {
    /// The notes after the operation.
    pub notes: Vec<String>,
}

/// `notes`: keep, list and clear notes.
pub struct Notes;
impl Tool for Notes {
    const ID: &'static str = "notes";
    const DESCRIPTION: &'static str = "Keep notes across runs: op=add with a note, op=list, or op=clear.";
    type Args = NotesArgs;
    type Output = NotesOutput;
    fn annotations() -> Annotations {
        Annotations { destructive: Some(false), open_world: Some(false), ..Default::default() }
    }
    fn call(args: NotesArgs, cx: &mut Context<'_>) -> Result<NotesOutput, ToolError> {
        let mut notes: Vec<String> = cx.get(KEY)?.unwrap_or_default();
        match args.op {
            Op::Add => {
                let Some(note) = args.note else {
                    return Err(ToolError::InvalidArguments("op=add needs `note`".into()));
                };
                notes.push(note);
                cx.set(KEY, &notes)?;
            }
            Op::List => {}
            Op::Clear => {
                notes.clear();
                cx.remove(KEY);
            }
        }
        Ok(NotesOutput { notes })
    }
}

toolgate_sdk::export_tools!(Notes);
