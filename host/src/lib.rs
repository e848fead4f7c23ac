//! toolgate: a WebAssembly plugin host for AI-agent Tools.
//!
//! The path of one call (see `runtime` for the code, top to bottom):
//!
//! 1. [`catalog`] loads a plugin directory; [`descriptor`] reads each
//!    component's metadata without compiling or running it.
//! 2. [`snapshot`] builds an agent's immutable view; its filter removes Tools
//!    that are invisible, not installed, ambiguous, unhealthy or not granted.
//! 3. Arguments are validated against the descriptor's JSON Schema.
//! 4. [`gate`] decides Allow, Deny or RequireConfirmation on the exact call,
//!    using [`policy`] rules and the [`narrowing`] in force.
//! 5. Only Allow reaches the [`executor`], a wasmtime sandbox with exactly the
//!    granted authority; [`commit`] publishes every result in one Step commit.
//!    RequireConfirmation commits an Awaiting record with a single-use ticket.

#![deny(missing_docs)]

pub mod capture;
pub mod catalog;
pub mod commit;
pub mod config;
pub mod credentials;
pub mod descriptor;
pub mod destination;
pub mod executor;
pub mod gate;
pub mod generate;
pub mod lockfile;
pub mod mcp;
pub mod mcp_adapter;
pub mod narrowing;
pub mod outbound;
pub mod pack;
pub mod policy;
pub mod runtime;
pub mod signing;
pub mod skill;
pub mod snapshot;

pub use catalog::{Catalog, Digest};
pub use commit::{SqliteJournal, StepStore};
pub use config::Config;
pub use executor::{Executor, ExecutorSettings};
pub use gate::{AllowedCall, GateOutcome, ToolPermissionVerdict};
pub use narrowing::ToolCapabilityNarrowing;
pub use runtime::{CallError, Run, Runtime, StepResult};
pub use snapshot::ExecutableAgentSnapshot;
