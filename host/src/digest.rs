//! Digest: the sha256 identity of a component file, a call's arguments or a
//! host setting, shared by every layer.
//!
//! A leaf: it imports nothing of the crate, so any module may use it without
//! creating an import cycle.

use sha2::{Digest as _, Sha256};

/// A sha256 digest, shown as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }
    /// Lowercase hex.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
    /// Parse lowercase or uppercase hex.
    pub fn from_hex(s: &str) -> Option<Self> {
        let v = hex::decode(s).ok()?;
        Some(Digest(v.try_into().ok()?))
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}
