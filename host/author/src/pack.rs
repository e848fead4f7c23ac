//! Pack: the author-side step that turns a built component into a shippable one.
//!
//! Owns calling the component's `describe` export once, in a sandbox with no
//! authority, and embedding the returned metadata in the `toolgate-metadata`
//! custom section, checked exactly as a host will read it.
//!
//! Architecture invariant: packing is the only place guest code runs to learn
//! descriptors, and it runs on the author's side; a host loading a plugin
//! directory reads the section and never calls `describe`.

use std::sync::Arc;

use toolgate::catalog::descriptor::{self, CheckedTool, DescriptorError};
use toolgate::config::Limits;
use toolgate::sandbox::executor::{Executor, ExecutorError, ExecutorSettings};

/// Why packing failed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The component could not be run to describe itself.
    #[error(
        "cannot read its descriptors ({}); is it built with toolgate-sdk's `export_tools!`?",
        crate::one_line(&.0.to_string())
    )]
    Describe(#[from] ExecutorError),
    /// `describe` returned something that is not metadata.
    #[error("`describe` returned malformed metadata: {}", crate::one_line(&.0.to_string()))]
    Malformed(serde_json::Error),
    /// The metadata does not pass the host's checks (its text quotes the
    /// guest's: kept on the error's one line).
    #[error("{}", crate::one_line(&.0.to_string()))]
    Descriptor(#[from] DescriptorError),
}

/// Pack `bytes` (a component built with toolgate-sdk): returns the shippable
/// component and its checked Tools.
pub async fn pack(bytes: &[u8]) -> Result<(Vec<u8>, Vec<Arc<CheckedTool>>), PackError> {
    let executor = Executor::new(ExecutorSettings::new(Limits::default(), None))?;
    let doc = executor.describe(bytes).await?;
    let doc: toolgate_sdk::ComponentMetadata = serde_json::from_str(&doc).map_err(PackError::Malformed)?;
    let packed = descriptor::embed_metadata(bytes, &doc)?;
    // Check the result the way a host will read it, before anyone ships it.
    let tools = descriptor::read_metadata(&packed)?;
    Ok((packed, tools))
}
