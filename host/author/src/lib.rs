//! toolgate-author: the steps a Tool author (or an operator importing a
//! Tool) runs before a host ever loads the result.
//!
//! - [`pack`]: call a built component's `describe` export once, in a sandbox
//!   with no authority, and embed the descriptors in its metadata section.
//! - [`skill`]: turn an Agent Skills folder into a Tool component.
//! - [`mcp_import`]: list a remote MCP server's tools once and pin them into
//!   an adapter component whose calls leave through the host's boundary.
//! - [`adapters`]: the generic Skill and MCP components shipped in the
//!   binary, which the two above fill with pinned data (no toolchain).
//! - [`scaffold`]: `toolgate new` and `toolgate build` for a Tool project.
//!
//! Architecture invariant: nothing here is used by a host loading a plugin
//! directory; a host reads the metadata section and never runs `describe`,
//! builds, or lists a remote.

#![deny(missing_docs)]

pub mod adapters;
pub mod mcp_import;
pub mod pack;
pub mod scaffold;
pub mod skill;

/// Text of someone else's — a Skill folder's, a remote server's, a guest's
/// — as it is put into an error: on one line, with every character that is
/// not seen escaped ([`toolgate::display::escape_unseen`]), so the error a
/// front end prints cannot go on as a line that reads as the host's.
pub(crate) fn one_line(text: &str) -> String {
    toolgate::display::escape_unseen(text, toolgate::display::Lines::Escape).into_owned()
}
