//! Sandbox: where an allowed call runs, holding exactly its authority.
//!
//! Owns the wasmtime engine and per-call stores ([`executor`]), the only
//! network a guest has — `wasi:http` through the outbound boundary
//! ([`outbound`]), where a credential reference becomes a secret on the way
//! out and every response is checked on the way back — the bounded
//! capture of guest output ([`capture`]), each directory grant bound to
//! the directory checked when the config was loaded ([`grant_dir`]), and the epoch
//! [`ticker`] that interrupts running guests, and the checks in front of a
//! guest's filesystem (special files, what a call holds open: `filesystem`),
//! what a call holds through `wasi:http` before its requests leave
//! (`http_held`),
//! and the check that keeps every configured secret out of what a guest
//! reads from its files and out of what a call returns (`withhold`).
//!
//! Architecture invariant: the sandbox decides nothing. [`executor::Executor::execute`]
//! takes only a [`crate::policy::gate::AllowedCall`], and a guest reaches the
//! host only through the imports linked here.

pub mod capture;
pub mod executor;
mod filesystem;
pub mod grant_dir;
mod http_held;
pub mod outbound;
pub mod scan;
pub mod ticker;
mod withhold;
