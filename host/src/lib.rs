//! toolgate: a WebAssembly plugin host for AI-agent Tools — the core that an
//! agent runtime embeds.
//!
//! Third parties ship Tools as WebAssembly components. The host reads each
//! Tool's descriptor from the component's metadata without running it, shows
//! the model only what the agent may see, and runs a call only after the
//! permission gate said Allow, in a sandbox holding exactly the granted
//! authority. Every result goes through one Step commit.
//!
//! The path of one call ([`runtime`] has the code, top to bottom):
//!
//! 1. [`catalog`] loads a plugin directory; [`catalog::descriptor`] reads each
//!    component's metadata without compiling or running it.
//! 2. [`snapshot`] builds an agent's immutable view; its filter removes Tools
//!    that are invisible, not installed, ambiguous, unhealthy or not granted.
//! 3. Arguments are validated against the descriptor's JSON Schema.
//! 4. [`policy::gate`] decides Allow, Deny or RequireConfirmation on the exact
//!    call, using [`policy`] rules and the [`authority::narrowing`] in force.
//! 5. Only Allow reaches the [`sandbox`]; [`store`] publishes every result in
//!    one Step commit. RequireConfirmation commits an Awaiting record with a
//!    single-use ticket.
//!
//! # Embedding
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use toolgate::{Config, StepResult, ToolCapabilityNarrowing};
//!
//! let config = Config::load("toolgate.toml".as_ref())?;
//! let runtime = toolgate::host::open(&config, "default").await?;
//! for tool in runtime.list() {
//!     println!("{}: {}", tool.id, tool.description);
//! }
//! let run = runtime.start_run(None, ToolCapabilityNarrowing::Configured).await?;
//! match run.call("text.upper", serde_json::json!({ "text": "hi" })).await? {
//!     StepResult::Output { content, .. } => println!("{content:?}"),
//!     other => println!("{}", other.model_text()),
//! }
//! # Ok(()) }
//! ```
//!
//! `host/examples/embed.rs` shows the whole loop, approval included: an
//! Awaiting result carries a `correlation` id the model may read and a
//! `ticket` for the runtime's own approval UI only, decided with an
//! [`Approval`].
//!
//! # Layers
//!
//! Modules import only from layers below them (no cycles):
//! [`digest`], [`display`], [`keys`] → [`authority`], [`policy`] rules, [`catalog`],
//! [`store`] → [`approval`], [`config`] → [`snapshot`] → [`policy::gate`] →
//! [`sandbox`] → [`runtime`] → [`host`]. Front ends (the CLI, the MCP server, the author-side steps)
//! live in the `toolgate-cli` crate and only call this API.

#![deny(missing_docs)]

pub mod approval;
pub mod authority;
pub mod catalog;
pub mod config;
pub mod digest;
pub mod display;
pub mod files;
pub mod host;
pub mod keys;
pub mod policy;
pub mod runtime;
pub mod sandbox;
pub mod snapshot;
pub mod store;

pub use approval::Approval;
pub use authority::narrowing::ToolCapabilityNarrowing;
pub use catalog::Catalog;
pub use config::Config;
pub use digest::Digest;
pub use policy::gate::{AllowedCall, GateOutcome, ToolPermissionVerdict};
pub use runtime::{CallError, Run, Runtime, RuntimeSettings, StepResult};
pub use sandbox::executor::{Executor, ExecutorSettings};
pub use snapshot::ExecutableAgentSnapshot;
pub use store::{StepStore, memory::MemoryJournal, sqlite::SqliteJournal};
