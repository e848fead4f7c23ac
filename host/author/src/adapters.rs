//! Adapters: the generic Skill and MCP adapter components shipped inside
//! `toolgate`, and turning one plus pinned data into a shippable component.
//!
//! The components are built from `guest-sdk/adapters/` by this crate's build
//! script. Assembling one writes the data into its `toolgate-pinned` section
//! (at most [`descriptor::MAX_PINNED_BYTES`], as a host loads it) and packs it like any component (`describe` runs once, without authority,
//! and derives the descriptors from that data), so the result is an ordinary
//! component on the one path: its digest covers the data, and locking and
//! signing work unchanged. No cargo, no code generation.
//!
//! Architecture invariant: author-side only; a host loads the result like any
//! other component.

use std::sync::Arc;

use toolgate::catalog::descriptor::{self, CheckedTool};

use crate::pack::PackError;

mod built {
    include!(concat!(env!("OUT_DIR"), "/adapters.rs"));
}

/// The generic Skill component (unpacked, no pinned data).
pub const SKILL: &[u8] = built::SKILL;
/// The generic MCP adapter component (unpacked, no pinned data).
pub const MCP: &[u8] = built::MCP;

/// `adapter` with `pinned` as its pinned data, packed: the shippable bytes and
/// its Tools. Pinned data over [`descriptor::MAX_PINNED_BYTES`] is refused,
/// as a host would refuse the component.
pub async fn assemble(adapter: &[u8], pinned: &[u8]) -> Result<(Vec<u8>, Vec<Arc<CheckedTool>>), PackError> {
    let with_data = descriptor::embed_pinned(adapter, pinned)?;
    crate::pack::pack(&with_data).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgate::catalog::descriptor::{DescriptorError, MAX_PINNED_BYTES};

    /// What no host would load is not packed: pinned data over the host's
    /// cap is refused before anything runs, naming the section and the cap.
    #[tokio::test]
    async fn pinned_data_over_the_hosts_cap_is_refused() {
        for adapter in [SKILL, MCP] {
            let Err(e) = assemble(adapter, &vec![b' '; MAX_PINNED_BYTES + 1]).await else { panic!("packed") };
            assert!(
                matches!(e, PackError::Descriptor(DescriptorError::PinnedTooLarge(n)) if n == MAX_PINNED_BYTES + 1),
                "{e}"
            );
            assert!(e.to_string().contains("more than the 8 MiB allowed"), "{e}");
        }
    }
}
