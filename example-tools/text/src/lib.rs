//! A pure multi-tool component: text transformations with no authority and no state.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgate_sdk::{Annotations, Context, Tool, ToolError};

/// Arguments shared by the text tools.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextArgs {
    /// The text to work on.
    pub text: String,
}

fn pure() -> Annotations {
    Annotations { read_only: Some(true), idempotent: Some(true), open_world: Some(false), ..Default::default() }
}

/// `text.upper`: upper-case a text.
pub struct Upper;
impl Tool for Upper {
    const ID: &'static str = "text.upper";
    const DESCRIPTION: &'static str = "Return the text in upper case.";
    const PRIMARY_ARGUMENT: Option<&'static str> = Some("text");
    type Args = TextArgs;
    type Output = String;
    fn annotations() -> Annotations {
        pure()
    }
    fn call(args: TextArgs, _cx: &mut Context<'_>) -> Result<String, ToolError> {
        Ok(args.text.to_uppercase())
    }
}

/// Counts of a text.
#[derive(Serialize, JsonSchema)]
pub struct Counts {
    /// Unicode scalar values.
    pub chars: usize,
    /// Whitespace-separated words.
    pub words: usize,
    /// Lines.
    pub lines: usize,
}

/// `text.count`: count characters, words and lines.
pub struct Count;
impl Tool for Count {
    const ID: &'static str = "text.count";
    const DESCRIPTION: &'static str = "Count the characters, words and lines of a text.";
    const PRIMARY_ARGUMENT: Option<&'static str> = Some("text");
    type Args = TextArgs;
    type Output = Counts;
    fn annotations() -> Annotations {
        pure()
    }
    fn call(args: TextArgs, _cx: &mut Context<'_>) -> Result<Counts, ToolError> {
        Ok(Counts {
            chars: args.text.chars().count(),
            words: args.text.split_whitespace().count(),
            lines: args.text.lines().count(),
        })
    }
}

/// Arguments of `text.repeat`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepeatArgs {
    /// The text to repeat.
    pub text: String,
    /// How many times (1 to 100).
    #[schemars(range(min = 1, max = 100))]
    pub times: u32,
    /// Put between repetitions; default none.
    #[serde(default)]
    pub separator: Option<String>,
}

/// `text.repeat`: repeat a text.
pub struct Repeat;
impl Tool for Repeat {
    const ID: &'static str = "text.repeat";
    const DESCRIPTION: &'static str = "Repeat a text a number of times, optionally with a separator.";
    type Args = RepeatArgs;
    type Output = String;
    fn annotations() -> Annotations {
        pure()
    }
    fn call(args: RepeatArgs, _cx: &mut Context<'_>) -> Result<String, ToolError> {
        if !(1..=100).contains(&args.times) {
            return Err(ToolError::InvalidArguments("`times` must be between 1 and 100".into()));
        }
        let parts = vec![args.text; args.times as usize];
        Ok(parts.join(args.separator.as_deref().unwrap_or("")))
    }
}

toolgate_sdk::export_tools!(Upper, Count, Repeat);
