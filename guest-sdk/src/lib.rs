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

pub use metadata::{Access, Annotations, ComponentMetadata, DeclaredCapabilities, ToolDescriptor, ToolMetadata};
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
            Some(raw) => serde_json::from_str(&raw)
                .map(Some)
                .map_err(|e| ToolError::failed(format!("state key `{key}` holds unreadable JSON: {e}"))),
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
    let value: serde_json::Value = serde_json::from_str(arguments)
        .map_err(|e| ToolError::InvalidArguments(format!("arguments for `{}` are not JSON: {e}", T::ID)))?;
    let value = match value {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        other => other,
    };
    let args: T::Args = serde_json::from_value(value)
        .map_err(|e| ToolError::InvalidArguments(format!("invalid arguments for `{}`: {e}", T::ID)))?;
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
        ToolEntry { id: T::ID, metadata: metadata_of::<T>, call: adapt::<T> }
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

#[cfg(feature = "guest")]
pub mod http;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::{Value, json};

    #[derive(Default)]
    struct MapState(BTreeMap<String, String>);

    impl StateView for MapState {
        fn get(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
        fn keys(&self) -> Vec<String> {
            self.0.keys().cloned().collect()
        }
    }

    /// Every field optional: `null` and `{}` must both work.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct OptArgs {
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        count: Option<u32>,
    }

    struct Optional;
    impl Tool for Optional {
        const ID: &'static str = "test.optional";
        const DESCRIPTION: &'static str = "Echo optional args.";
        type Args = OptArgs;
        type Output = Value;
        fn call(args: OptArgs, _cx: &mut Context<'_>) -> Result<Value, ToolError> {
            Ok(json!({ "text": args.text, "count": args.count }))
        }
    }

    /// Strict: one required string, unknown fields refused.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct StrictArgs {
        path: String,
    }

    struct Strict;
    impl Tool for Strict {
        const ID: &'static str = "test.strict";
        const DESCRIPTION: &'static str = "Strict args.";
        const PRIMARY_ARGUMENT: Option<&'static str> = Some("path");
        type Args = StrictArgs;
        type Output = String;
        fn call(args: StrictArgs, _cx: &mut Context<'_>) -> Result<String, ToolError> {
            Ok(args.path)
        }
        fn annotations() -> Annotations {
            Annotations { read_only: Some(true), ..Annotations::default() }
        }
    }

    /// Lenient: unknown fields ignored.
    #[derive(Deserialize, schemars::JsonSchema)]
    struct LenientArgs {
        path: String,
    }

    struct Lenient;
    impl Tool for Lenient {
        const ID: &'static str = "test.lenient";
        const DESCRIPTION: &'static str = "Lenient args.";
        type Args = LenientArgs;
        type Output = String;
        fn call(args: LenientArgs, _cx: &mut Context<'_>) -> Result<String, ToolError> {
            Ok(args.path)
        }
    }

    /// Changes state through the Context.
    #[derive(Deserialize, schemars::JsonSchema)]
    struct StateArgs {
        set: Option<String>,
        remove: Option<String>,
    }

    struct Stateful;
    impl Tool for Stateful {
        const ID: &'static str = "test.state";
        const DESCRIPTION: &'static str = "Set and remove keys.";
        type Args = StateArgs;
        type Output = Vec<String>;
        fn call(args: StateArgs, cx: &mut Context<'_>) -> Result<Vec<String>, ToolError> {
            if let Some(k) = &args.set {
                let old: Option<u32> = cx.get(k)?;
                cx.set(k, &(old.unwrap_or(0) + 1))?;
            }
            if let Some(k) = &args.remove {
                cx.remove(k);
            }
            Ok(cx.keys())
        }
    }

    fn invalid_message(r: Result<RawOutput, ToolError>) -> String {
        match r {
            Err(ToolError::InvalidArguments(m)) => m,
            other => panic!("expected InvalidArguments, got {other:?}"),
        }
    }

    fn json_content(r: Result<RawOutput, ToolError>) -> Value {
        match r {
            Ok(RawOutput { content: Content::Json(s), .. }) => serde_json::from_str(&s).unwrap(),
            other => panic!("expected JSON output, got {other:?}"),
        }
    }

    #[test]
    fn null_arguments_mean_empty_object() {
        let state = MapState::default();
        for args in ["null", " null ", "{}"] {
            let out = json_content(adapt::<Optional>(args, &state));
            assert_eq!(out, json!({ "text": null, "count": null }), "arguments {args}");
        }
        // ...but null is not a substitute for required fields.
        let m = invalid_message(adapt::<Strict>("null", &state));
        assert!(m.contains("test.strict") && m.contains("path"), "{m}");
    }

    #[test]
    fn unknown_fields_follow_deny_unknown_fields() {
        let state = MapState::default();
        let m = invalid_message(adapt::<Strict>(r#"{"path":"a","extra":1}"#, &state));
        assert!(m.contains("test.strict"), "{m}");
        assert!(m.contains("extra"), "{m}");
        let m = invalid_message(adapt::<Optional>(r#"{"surprise":true}"#, &state));
        assert!(m.contains("test.optional") && m.contains("surprise"), "{m}");

        let out = adapt::<Lenient>(r#"{"path":"a","extra":1}"#, &state).unwrap();
        assert_eq!(out.content, Content::Json("\"a\"".into()));
        assert!(out.commands.is_empty());
    }

    #[test]
    fn bad_arguments_name_tool_and_field() {
        let state = MapState::default();
        // (arguments, words the message must contain)
        let cases: &[(&str, &[&str])] = &[
            ("", &["test.strict", "not JSON"]),
            ("{", &["test.strict", "not JSON"]),
            ("{path: 1}", &["test.strict", "not JSON"]),
            ("{} trailing", &["test.strict", "not JSON"]),
            // serde_json's type errors name the types, not the field (the host's
            // schema validation, which runs first, names the field path).
            (r#"{"path": 42}"#, &["test.strict", "invalid arguments", "integer `42`", "expected a string"]),
            (r#"{"path": null}"#, &["test.strict", "invalid arguments"]),
            ("{}", &["test.strict", "missing field `path`"]),
            ("[]", &["test.strict", "invalid arguments"]),
            (r#""path""#, &["test.strict", "invalid arguments"]),
            ("42", &["test.strict", "invalid arguments"]),
        ];
        for (args, words) in cases {
            let m = invalid_message(adapt::<Strict>(args, &state));
            for w in *words {
                assert!(m.contains(w), "arguments {args:?}: message {m:?} lacks {w:?}");
            }
        }
        // Wrong type on a nested/optional field names that field.
        let m = invalid_message(adapt::<Optional>(r#"{"count": "many"}"#, &state));
        assert!(m.contains("test.optional") && m.contains("invalid type"), "{m}");
        let m = invalid_message(adapt::<Optional>(r#"{"count": -1}"#, &state));
        assert!(m.contains("test.optional"), "{m}");
    }

    #[test]
    fn for_tool_describes_identity_and_schemas() {
        let d = ToolDescriptor::for_tool::<Strict>();
        assert_eq!(d.id, "test.strict");
        assert_eq!(d.description, "Strict args.");
        assert_eq!(d.primary_argument.as_deref(), Some("path"));
        assert_eq!(d.annotations.read_only, Some(true));
        assert_eq!(d.input_schema["type"], "object");
        assert_eq!(d.input_schema["properties"]["path"]["type"], "string");
        assert_eq!(d.input_schema["required"], json!(["path"]));
        assert_eq!(d.input_schema["additionalProperties"], json!(false));
        let out = d.output_schema.as_ref().expect("output schema");
        assert_eq!(out["type"], "string");

        let d = ToolDescriptor::for_tool::<Lenient>();
        assert_eq!(d.input_schema["type"], "object");
        assert!(d.input_schema.get("additionalProperties").is_none(), "{}", d.input_schema);
        assert_eq!(d.primary_argument, None);
        assert_eq!(d.annotations, Annotations::default());

        let d = ToolDescriptor::for_tool::<Optional>();
        assert_eq!(d.input_schema["type"], "object");
        assert!(d.input_schema.get("required").is_none_or(|r| r == &json!([])), "{}", d.input_schema);
        let out = d.output_schema.as_ref().expect("output schema");
        // `Value` accepts anything: no `type` constraint.
        assert!(out.get("type").is_none(), "{out}");
    }

    #[test]
    fn descriptor_round_trips_through_metadata() {
        let doc = ComponentMetadata::new(vec![metadata_of::<Strict>(), metadata_of::<Stateful>()]);
        assert_eq!(doc.format, metadata::METADATA_FORMAT);
        assert_eq!(doc.wit, format!("{}@{}", metadata::WIT_PACKAGE, metadata::WIT_VERSION));
        let text = describe(&[ToolEntry::of::<Strict>(), ToolEntry::of::<Stateful>()]);
        let back: ComponentMetadata = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
        assert_eq!(back.tools[0].descriptor.id, Strict::ID);
        assert_eq!(back.tools[1].descriptor.id, Stateful::ID);
    }

    #[test]
    fn context_commands_are_scoped_to_the_tool() {
        let mut state = MapState::default();
        state.0.insert("n".into(), "41".into());
        state.0.insert("old".into(), "true".into());
        let out = adapt::<Stateful>(r#"{"set":"n","remove":"old"}"#, &state).unwrap();
        assert_eq!(
            out.commands,
            vec![
                Command { scope: "test.state".into(), key: "n".into(), value: Some("42".into()) },
                Command { scope: "test.state".into(), key: "old".into(), value: None },
            ]
        );
        // Output is the committed keys, as the view holds them (not yet changed).
        assert_eq!(out.content, Content::Json(r#"["n","old"]"#.into()));

        // Direct Context use: set serializes to JSON, remove carries None.
        let mut cx = Context::new(Strict::ID, &state);
        cx.set("k", &json!({"a": [1, 2]})).unwrap();
        cx.remove("gone");
        let cmds = cx.into_commands();
        assert_eq!(cmds.len(), 2);
        assert!(cmds.iter().all(|c| c.scope == Strict::ID));
        assert_eq!(cmds[0].value.as_deref(), Some(r#"{"a":[1,2]}"#));
        assert_eq!(cmds[1].value, None);
    }

    #[test]
    fn context_get_reports_unreadable_state() {
        let mut state = MapState::default();
        state.0.insert("n".into(), "not json".into());
        let cx = Context::new(Stateful::ID, &state);
        match cx.get::<u32>("n") {
            Err(ToolError::Failed(m)) => assert!(m.contains("`n`"), "{m}"),
            other => panic!("expected Failed, got {other:?}"),
        }
        assert_eq!(cx.get::<u32>("absent").unwrap(), None);
        // Through the adapter the failure is a Tool error, not invalid arguments.
        assert!(matches!(adapt::<Stateful>(r#"{"set":"n"}"#, &state), Err(ToolError::Failed(_))));
    }

    #[test]
    fn dispatch_routes_by_id_and_names_unknown_ids() {
        let entries = [ToolEntry::of::<Strict>(), ToolEntry::of::<Lenient>()];
        let state = MapState::default();
        let out = dispatch(&entries, "test.lenient", r#"{"path":"x","y":1}"#, &state).unwrap();
        assert_eq!(out.content, Content::Json("\"x\"".into()));
        // The strict entry gets its own adapter (unknown fields refused).
        let m = invalid_message(dispatch(&entries, "test.strict", r#"{"path":"x","y":1}"#, &state));
        assert!(m.contains("test.strict"), "{m}");
        for id in ["test.missing", "", "TEST.STRICT", "test.strict "] {
            match dispatch(&entries, id, "{}", &state) {
                Err(ToolError::Failed(m)) => assert!(m.contains(&format!("`{id}`")), "{m}"),
                other => panic!("id {id:?}: expected Failed, got {other:?}"),
            }
        }
        assert!(matches!(dispatch(&[], "test.strict", "{}", &state), Err(ToolError::Failed(_))));
    }
}
