//! Authority: what a Tool may be given, as values — destinations, credential
//! references and the narrowing algebra.
//!
//! Owns the vocabulary every layer above uses to speak about authority:
//! [`destination`] (`scheme://host:port` grants and exact matching),
//! [`credentials`] (credential specs and the redacted [`credentials::Secret`])
//! and [`narrowing`] (`ToolCapabilityNarrowing` and capability sets that only
//! intersect).
//!
//! Architecture invariant: nothing here grants anything by itself or does IO
//! beyond reading a secret at the moment [`credentials::CredentialSpec::materialize`]
//! is called by the outbound boundary; every operation returns at most what it
//! was given.

pub mod credentials;
pub mod destination;
pub mod narrowing;
