//! Adapters: the generic Skill and MCP adapter components shipped inside
//! `toolgate`, and turning one plus pinned data into a shippable component.
//!
//! The components are built from `guest-sdk/adapters/` by this crate's build
//! script. Assembling one writes the data into its `toolgate-pinned` section
//! and packs it like any component (`describe` runs once, without authority,
//! and derives the descriptors from that data), so the result is an ordinary
//! component on the one path: its digest covers the data, and locking and
//! signing work unchanged. No cargo, no code generation.
//!
//! Architecture invariant: author-side only; a host loads the result like any
//! other component.

use std::sync::Arc;

use toolgate::catalog::descriptor::{self, CheckedTool};
use toolgate_sdk::metadata::PINNED_SECTION;

use crate::pack::PackError;

mod built {
    include!(concat!(env!("OUT_DIR"), "/adapters.rs"));
}

/// The generic Skill component (unpacked, no pinned data).
pub const SKILL: &[u8] = built::SKILL;
/// The generic MCP adapter component (unpacked, no pinned data).
pub const MCP: &[u8] = built::MCP;

/// `adapter` with `pinned` as its pinned data, packed: the shippable bytes and its Tools.
pub async fn assemble(adapter: &[u8], pinned: &[u8]) -> Result<(Vec<u8>, Vec<Arc<CheckedTool>>), PackError> {
    let with_data = descriptor::embed_section(adapter, PINNED_SECTION, pinned)?;
    crate::pack::pack(&with_data).await
}
