//! Signing: which publishers' components a host accepts.
//!
//! Owns ed25519 keys and detached signatures. A publisher signs a component
//! file (`toolgate sign FILE --key KEY` writes `FILE.sig`); a host whose
//! config lists trusted public keys (`[signing] keys`) loads only components
//! whose `.sig` verifies against one of them. The signed message is a
//! domain-separation prefix and the file's sha256 digest, so a signature
//! covers every byte of the file, metadata included.
//!
//! Architecture invariant: verification happens before a component's
//! metadata is read; a missing, malformed or foreign signature refuses the
//! file (with the fix named), never warns. Secret keys are read only by
//! `sign` and never logged.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};

use crate::digest::Digest;

/// What a signature signs, before the digest.
const DOMAIN: &[u8] = b"toolgate-component-v1\n";
const PUBLIC_PREFIX: &str = "ed25519:";
const SECRET_PREFIX: &str = "ed25519-secret:";

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Public keys a host trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedKeys(Vec<VerifyingKey>);

impl TrustedKeys {
    /// Parse `ed25519:<base64 of 32 bytes>` keys; the error names the bad one.
    pub fn parse(keys: &[String]) -> Result<Self, String> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| parse_public(k).map_err(|e| format!("keys[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()
            .map(TrustedKeys)
    }

    /// Whether no key is configured (then nothing is checked).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Check the detached signature of the component at `path` with `digest`.
    pub fn verify(&self, path: &Path, digest: &Digest) -> Result<(), String> {
        let sig_path = sig_path(path);
        let shown = sig_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let text = std::fs::read_to_string(&sig_path).map_err(|_| {
            format!("not signed: `{shown}` is missing; the host accepts only signed components (`toolgate sign`)")
        })?;
        let raw = text
            .trim()
            .strip_prefix(PUBLIC_PREFIX)
            .and_then(|s| b64().decode(s).ok())
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .ok_or_else(|| format!("`{shown}` is not an `ed25519:<base64>` signature; sign the file again"))?;
        let signature = Signature::from_bytes(&raw);
        let message = message(digest);
        if self.0.iter().any(|k| k.verify_strict(&message, &signature).is_ok()) {
            Ok(())
        } else {
            Err(format!(
                "`{shown}` does not verify against any key in `[signing] keys` (the file changed after signing, \
                 or its publisher is not trusted)"
            ))
        }
    }
}

fn parse_public(k: &str) -> Result<VerifyingKey, String> {
    let bytes = k
        .trim()
        .strip_prefix(PUBLIC_PREFIX)
        .and_then(|s| b64().decode(s).ok())
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| "not an `ed25519:<base64 of 32 bytes>` public key (from `toolgate keygen`)".to_owned())?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| "not a valid ed25519 public key".to_owned())
}

fn message(digest: &Digest) -> Vec<u8> {
    [DOMAIN, &digest.0[..]].concat()
}

/// `FILE.wasm.sig` for `FILE.wasm`.
pub fn sig_path(component: &Path) -> PathBuf {
    let mut s = component.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// A new key pair: the secret key file's text and the public key for `[signing] keys`.
pub fn keygen() -> Result<(String, String), String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("no OS randomness: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    seed.fill(0);
    let secret = format!("{SECRET_PREFIX}{}\n", b64().encode(key.to_bytes()));
    Ok((secret, public_of(&key)))
}

fn public_of(key: &SigningKey) -> String {
    format!("{PUBLIC_PREFIX}{}", b64().encode(key.verifying_key().to_bytes()))
}

/// Sign the component bytes with the secret key text; returns the `.sig`
/// file's text and the public key it verifies with.
pub fn sign(component: &[u8], secret_key: &str) -> Result<(String, String), String> {
    let seed = secret_key
        .trim()
        .strip_prefix(SECRET_PREFIX)
        .and_then(|s| b64().decode(s).ok())
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| "not an `ed25519-secret:` key file from `toolgate keygen`".to_owned())?;
    let key = SigningKey::from_bytes(&seed);
    let signature = key.sign(&message(&Digest::of(component)));
    Ok((format!("{PUBLIC_PREFIX}{}\n", b64().encode(signature.to_bytes())), public_of(&key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(dir: &Path, name: &str, bytes: &[u8], secret: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::write(sig_path(&p), sign(bytes, secret).unwrap().0).unwrap();
        p
    }

    #[test]
    fn a_signature_verifies_only_for_its_bytes_and_a_trusted_key() {
        let dir = tempfile::tempdir().unwrap();
        let (secret, public) = keygen().unwrap();
        let (other_secret, other_public) = keygen().unwrap();
        let trusted = TrustedKeys::parse(std::slice::from_ref(&public)).unwrap();
        let p = signed(dir.path(), "a.wasm", b"component bytes", &secret);
        assert_eq!(trusted.verify(&p, &Digest::of(b"component bytes")), Ok(()));
        // Changed after signing.
        let e = trusted.verify(&p, &Digest::of(b"component bytez")).unwrap_err();
        assert!(e.contains("a.wasm.sig") && e.contains("does not verify"), "{e}");
        // Signed by someone not trusted.
        let q = signed(dir.path(), "b.wasm", b"x", &other_secret);
        assert!(trusted.verify(&q, &Digest::of(b"x")).is_err());
        let both = TrustedKeys::parse(&[public, other_public]).unwrap();
        assert_eq!(both.verify(&q, &Digest::of(b"x")), Ok(()));
        // Not signed, or garbage.
        let e = trusted.verify(&dir.path().join("none.wasm"), &Digest::of(b"x")).unwrap_err();
        assert!(e.contains("none.wasm.sig") && e.contains("toolgate sign"), "{e}");
        std::fs::write(sig_path(&q), "ed25519:!!!").unwrap();
        assert!(trusted.verify(&q, &Digest::of(b"x")).unwrap_err().contains("not an `ed25519:<base64>` signature"));
    }

    #[test]
    fn bad_keys_are_named() {
        assert!(TrustedKeys::parse(&[]).unwrap().is_empty());
        let e = TrustedKeys::parse(&["ed25519:AAAA".into()]).unwrap_err();
        assert!(e.starts_with("keys[0]"), "{e}");
        let (_, good) = keygen().unwrap();
        let e = TrustedKeys::parse(&[good, "rsa:xyz".into()]).unwrap_err();
        assert!(e.starts_with("keys[1]"), "{e}");
        assert!(sign(b"x", "ed25519:notsecret").is_err());
    }
}
