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

/// A map keyed by digests. A digest is already uniformly distributed, so
/// its first eight bytes are the hash: looked up on every call, it needs no
/// SipHash round over 32 bytes. (Keys are digests of files an operator
/// installed, few, so nobody can flood it with colliding keys.)
pub type DigestMap<V> = std::collections::HashMap<Digest, V, std::hash::BuildHasherDefault<DigestHasher>>;

/// The hasher of [`DigestMap`].
#[derive(Default)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        // A digest hashes as its length, then its 32 bytes.
        let mut first = [0u8; 8];
        let n = bytes.len().min(8);
        first[..n].copy_from_slice(&bytes[..n]);
        self.0 = self.0.rotate_left(17) ^ u64::from_le_bytes(first);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
