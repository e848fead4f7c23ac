//! Glue between the WIT bindings and the SDK's plain types. Only compiled with
//! the `guest` feature; the export macro is its one user.

/// Generated WIT bindings of the `toolgate:plugin` `adapter` world (`plugin`
/// plus `pinned`; a component that never calls [`pinned`] does not import it).
pub mod bindings {
    wit_bindgen::generate!({
        world: "adapter",
        path: "../wit",
        pub_export_macro: true,
        default_bindings_module: "toolgate_sdk::guest::bindings",
        runtime_path: "toolgate_sdk::__wit_bindgen::rt",
    });
}

use bindings::toolgate::plugin::{log, pinned as wit_pinned, state, types};

/// The component's own pinned data (its `toolgate-pinned` section), for the
/// generic adapters; empty when it has none.
pub fn pinned() -> Vec<u8> {
    wit_pinned::data()
}

/// The state view backed by the host's read-only `state` import.
struct HostState;

impl crate::StateView for HostState {
    fn get(&self, key: &str) -> Option<String> {
        state::get(key)
    }
    fn keys(&self) -> Vec<String> {
        state::keys()
    }
}

/// Write a message to the step's captured log.
pub fn log_info(message: &str) {
    log::log(log::Level::Info, message);
}

/// Dispatch a WIT call to the registered entries and convert the result.
pub fn call(
    entries: &[crate::ToolEntry],
    tool_id: &str,
    arguments: &str,
) -> Result<types::ToolOutput, types::ToolError> {
    convert(crate::dispatch(entries, tool_id, arguments, &HostState))
}

/// A generic adapter's metadata document, derived from its pinned data
/// (empty when the data is unreadable: packing then refuses it).
pub fn describe_adapter<A: crate::Adapter>() -> String {
    A::metadata(&pinned()).ok().and_then(|doc| serde_json::to_string(&doc).ok()).unwrap_or_default()
}

/// Run a generic adapter's call over its pinned data and the host's state.
pub fn call_adapter<A: crate::Adapter>(tool_id: &str, arguments: &str) -> Result<crate::RawOutput, crate::ToolError> {
    A::call(&pinned(), tool_id, arguments, &HostState)
}

/// A raw result in WIT types.
pub fn convert(result: Result<crate::RawOutput, crate::ToolError>) -> Result<types::ToolOutput, types::ToolError> {
    match result {
        Ok(out) => Ok(types::ToolOutput {
            content: match out.content {
                crate::Content::Json(j) => types::Content::Json(j),
                crate::Content::Text(t) => types::Content::Text(t),
            },
            commands: out
                .commands
                .into_iter()
                .map(|c| types::Command {
                    scope: c.scope,
                    key: c.key,
                    op: match c.value {
                        Some(v) => types::CommandOp::Set(v),
                        None => types::CommandOp::Remove,
                    },
                })
                .collect(),
        }),
        Err(crate::ToolError::InvalidArguments(m)) => Err(types::ToolError::InvalidArguments(m)),
        Err(crate::ToolError::Failed(m)) => Err(types::ToolError::Failed(m)),
    }
}
