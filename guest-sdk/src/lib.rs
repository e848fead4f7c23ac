//! `toolgate-sdk`: write typed AI-agent Tools that toolgate hosts load as
//! WebAssembly components.
//!
//! ```ignore
//! use toolgate_sdk::{Tool, Context, ToolError};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! #[serde(deny_unknown_fields)]
//! struct Args { text: String }
//!
//! struct Upper;
//! impl Tool for Upper {
//!     const ID: &'static str = "text.upper";
//!     const DESCRIPTION: &'static str = "Upper-case a text.";
//!     type Args = Args;
//!     type Output = String;
//!     fn call(args: Args, _cx: &mut Context) -> Result<String, ToolError> {
//!         Ok(args.text.to_uppercase())
//!     }
//! }
//! toolgate_sdk::export_tools!(Upper);
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2`, then embed the
//! descriptors with `toolgate pack target/wasm32-wasip2/release/NAME.wasm -o NAME.wasm`.
//!
//! This crate owns the Tool side of the contract: the [`Tool`] trait, the one
//! descriptor source ([`ToolDescriptor::for_tool`]) and the one typed-to-raw
//! adapter ([`adapt`]). It never grants authority: a Tool only *declares* what
//! it needs; the host decides.

extern crate self as toolgate_sdk;

pub mod metadata;

pub use metadata::{
    Access, Annotations, ComponentMetadata, DeclaredCapabilities, ToolDescriptor, ToolMetadata,
};
pub use schemars;
pub use serde_json;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A typed Tool.
pub trait Tool {
    /// Unique id, e.g. `text.upper`: letters, digits, `_`, `-`, `.`; starts with a letter.
    const ID: &'static str;
    /// What the Tool does, written for the model.
    const DESCRIPTION: &'static str;
    /// The argument permission rules like `tool(glob)` match, if any.
    const PRIMARY_ARGUMENT: Option<&'static str> = None;
    /// Arguments. Its JSON Schema (root `type: object`) is what the model sees.
    /// Add `#[serde(deny_unknown_fields)]` to reject unknown fields.
    type Args: DeserializeOwned + schemars::JsonSchema;
    /// Output, returned to the model as JSON.
    type Output: Serialize + schemars::JsonSchema;

    /// Authority the Tool needs. Default: none.
    fn capabilities() -> DeclaredCapabilities {
        DeclaredCapabilities::none()
    }
    /// Behaviour hints for clients. Default: none.
    fn annotations() -> Annotations {
        Annotations::default()
    }
    /// Run the Tool.
    fn call(args: Self::Args, cx: &mut Context<'_>) -> Result<Self::Output, ToolError>;
}

/// A Tool error: committed as a result the model reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments do not fit; say which field and what is expected.
    InvalidArguments(String),
    /// The Tool ran and failed; say why.
    Failed(String),
}

impl ToolError {
    /// A failure with `message`.
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed(message.into())
    }
}

/// Content for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// A JSON document.
    Json(String),
    /// Plain text.
    Text(String),
}

/// A change to the Tool's own state, applied atomically with the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The Tool whose state changes (the SDK fills in the called Tool's id).
    pub scope: String,
    /// The key.
    pub key: String,
    /// `Some(json)` sets, `None` removes.
    pub value: Option<String>,
}

/// A successful raw call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawOutput {
    /// What the model reads.
    pub content: Content,
    /// State changes.
    pub commands: Vec<Command>,
}

/// Read access to the called Tool's committed state.
pub trait StateView {
    /// The JSON value under `key`.
    fn get(&self, key: &str) -> Option<String>;
    /// All keys, sorted.
    fn keys(&self) -> Vec<String>;
}

/// What a Tool sees of the host during one call.
pub struct Context<'a> {
    tool_id: &'static str,
    state: &'a dyn StateView,
    commands: Vec<Command>,
}

impl<'a> Context<'a> {
    /// A context for calling `tool_id` over `state`.
    pub fn new(tool_id: &'static str, state: &'a dyn StateView) -> Self {
        Context { tool_id, state, commands: Vec::new() }
    }

    /// The committed JSON value under `key`, deserialized.
    pub fn get<V: DeserializeOwned>(&self, key: &str) -> Result<Option<V>, ToolError> {
        match self.state.get(key) {
            None => Ok(None),
            Some(raw) => serde_json::from_str(&raw).map(Some).map_err(|e| {
                ToolError::failed(format!("state key `{key}` holds unreadable JSON: {e}"))
            }),
        }
    }

    /// All keys of the Tool's committed state.
    pub fn keys(&self) -> Vec<String> {
        self.state.keys()
    }

    /// Set `key` to `value` when the call's result commits.
    pub fn set(&mut self, key: &str, value: &impl Serialize) -> Result<(), ToolError> {
        let json = serde_json::to_string(value)
            .map_err(|e| ToolError::failed(format!("cannot serialize state `{key}`: {e}")))?;
        self.commands.push(Command { scope: self.tool_id.to_owned(), key: key.to_owned(), value: Some(json) });
        Ok(())
    }

    /// Remove `key` when the call's result commits.
    pub fn remove(&mut self, key: &str) {
        self.commands.push(Command { scope: self.tool_id.to_owned(), key: key.to_owned(), value: None });
    }

    /// Push a Command as-is (for raw adapters). The host refuses a Command
    /// whose scope is not the called Tool.
    pub fn push_command(&mut self, command: Command) {
        self.commands.push(command);
    }

    fn into_commands(self) -> Vec<Command> {
        self.commands
    }
}

/// The single typed-to-raw adapter: JSON arguments in, JSON content and
/// Commands out. JSON `null` means `{}`; a deserialization failure becomes
/// [`ToolError::InvalidArguments`] naming the Tool and the problem.
pub fn adapt<T: Tool>(arguments: &str, state: &dyn StateView) -> Result<RawOutput, ToolError> {
    let value: serde_json::Value = serde_json::from_str(arguments).map_err(|e| {
        ToolError::InvalidArguments(format!("arguments for `{}` are not JSON: {e}", T::ID))
    })?;
    let value = match value {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        other => other,
    };
    let args: T::Args = serde_json::from_value(value).map_err(|e| {
        ToolError::InvalidArguments(format!("invalid arguments for `{}`: {e}", T::ID))
    })?;
    let mut cx = Context::new(T::ID, state);
    let output = T::call(args, &mut cx)?;
    let json = serde_json::to_string(&output)
        .map_err(|e| ToolError::failed(format!("`{}` produced unserializable output: {e}", T::ID)))?;
    Ok(RawOutput { content: Content::Json(json), commands: cx.into_commands() })
}

/// One exported Tool, as the export macro registers it.
#[derive(Clone, Copy)]
pub struct ToolEntry {
    /// `T::ID`.
    pub id: &'static str,
    /// Descriptor and declared capabilities.
    pub metadata: fn() -> ToolMetadata,
    /// The typed-to-raw adapter instantiated for `T`.
    pub call: fn(&str, &dyn StateView) -> Result<RawOutput, ToolError>,
}

impl ToolEntry {
    /// The entry of typed Tool `T`: its descriptor comes from
    /// [`ToolDescriptor::for_tool`] and its call goes through [`adapt`], so the
    /// id the model sees and the id that dispatches are the same `T::ID`.
    pub const fn of<T: Tool>() -> Self {
        ToolEntry {
            id: T::ID,
            metadata: metadata_of::<T>,
            call: adapt::<T>,
        }
    }
}

/// Descriptor and declared capabilities of typed Tool `T`.
pub fn metadata_of<T: Tool>() -> ToolMetadata {
    ToolMetadata { descriptor: ToolDescriptor::for_tool::<T>(), capabilities: T::capabilities() }
}

/// The metadata document of a component exporting `entries`.
pub fn describe(entries: &[ToolEntry]) -> String {
    let doc = ComponentMetadata::new(entries.iter().map(|e| (e.metadata)()).collect());
    // Serializing plain data with string keys cannot fail.
    serde_json::to_string(&doc).unwrap_or_default()
}

/// Dispatch a raw call to the entry with `tool_id`.
pub fn dispatch(
    entries: &[ToolEntry],
    tool_id: &str,
    arguments: &str,
    state: &dyn StateView,
) -> Result<RawOutput, ToolError> {
    match entries.iter().find(|e| e.id == tool_id) {
        Some(entry) => (entry.call)(arguments, state),
        None => Err(ToolError::failed(format!("this component does not export a Tool `{tool_id}`"))),
    }
}

#[cfg(feature = "guest")]
#[doc(hidden)]
pub mod guest;

#[cfg(feature = "guest")]
#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

/// Export one or more Tools from this component.
///
/// ```ignore
/// toolgate_sdk::export_tools!(Upper, Lower);
/// ```
#[cfg(feature = "guest")]
#[macro_export]
macro_rules! export_tools {
    ($($tool:ty),+ $(,)?) => {
        const _: () = {
            struct __ToolgateComponent;
            const __ENTRIES: &[$crate::ToolEntry] = &[$($crate::ToolEntry::of::<$tool>()),+];
            impl $crate::guest::bindings::exports::toolgate::plugin::tool::Guest for __ToolgateComponent {
                fn describe() -> ::std::string::String {
                    $crate::describe(__ENTRIES)
                }
                fn call(
                    tool_id: ::std::string::String,
                    arguments: ::std::string::String,
                ) -> ::std::result::Result<
                    $crate::guest::bindings::toolgate::plugin::types::ToolOutput,
                    $crate::guest::bindings::toolgate::plugin::types::ToolError,
                > {
                    $crate::guest::call(__ENTRIES, &tool_id, &arguments)
                }
            }
            $crate::guest::bindings::export!(__ToolgateComponent with_types_in $crate::guest::bindings);
        };
    };
}
