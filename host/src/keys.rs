//! Keys: the one ed25519 key format of toolgate, for publishers who sign
//! components and for approvers who sign decisions.
//!
//! Owns parsing public keys (`ed25519:<base64>`, as listed in `[signing]` and
//! `[approval]`) and secret key files (`ed25519-secret:<base64>`, written by
//! `toolgate keygen`), signing a message under a domain-separation prefix, and
//! verifying one against a set of trusted keys. Every signed message starts
//! with its domain, so a signature made for one purpose (a component) can
//! never be replayed for another (an approval).
//!
//! A leaf: it imports nothing of the crate. Secret keys are never logged:
//! [`SecretKey`]'s `Debug` shows only its public half.

use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};

const PUBLIC_PREFIX: &str = "ed25519:";
const SECRET_PREFIX: &str = "ed25519-secret:";

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Public keys a host trusts for one purpose.
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

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// These keys as `ed25519:…` text, in the order configured.
    pub fn publics(&self) -> Vec<String> {
        self.0.iter().map(public_text).collect()
    }

    /// Whether `public` (`ed25519:…`) is one of these keys.
    pub fn contains(&self, public: &str) -> bool {
        parse_public(public).is_ok_and(|k| self.0.contains(&k))
    }

    /// Verify `signature` (`ed25519:<base64 of 64 bytes>`) over `domain` +
    /// `message`; returns the public key (`ed25519:…`) that made it.
    pub fn verify(&self, domain: &[u8], message: &[u8], signature: &str) -> Result<String, VerifyError> {
        let raw = signature
            .trim()
            .strip_prefix(PUBLIC_PREFIX)
            .and_then(|s| b64().decode(s).ok())
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .ok_or(VerifyError::Malformed)?;
        let signature = Signature::from_bytes(&raw);
        let signed = [domain, message].concat();
        self.0
            .iter()
            .find(|k| k.verify_strict(&signed, &signature).is_ok())
            .map(public_text)
            .ok_or(VerifyError::Untrusted)
    }
}

/// Why a signature does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Not an `ed25519:<base64>` signature.
    #[error("not an `ed25519:<base64>` signature")]
    Malformed,
    /// No trusted key made it over this message.
    #[error("does not verify against any trusted key")]
    Untrusted,
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

fn public_text(k: &VerifyingKey) -> String {
    format!("{PUBLIC_PREFIX}{}", b64().encode(k.to_bytes()))
}

/// A secret key read from a key file.
pub struct SecretKey(SigningKey);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.public())
    }
}

impl SecretKey {
    /// Parse a key file's text (`ed25519-secret:<base64 of 32 bytes>`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let seed = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .and_then(|s| b64().decode(s).ok())
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| "not an `ed25519-secret:` key file from `toolgate keygen`".to_owned())?;
        Ok(SecretKey(SigningKey::from_bytes(&seed)))
    }

    /// The public key (`ed25519:…`) that verifies this key's signatures.
    pub fn public(&self) -> String {
        public_text(&self.0.verifying_key())
    }

    /// Sign `domain` + `message`: `ed25519:<base64 of 64 bytes>`.
    pub fn sign(&self, domain: &[u8], message: &[u8]) -> String {
        let signature = self.0.sign(&[domain, message].concat());
        format!("{PUBLIC_PREFIX}{}", b64().encode(signature.to_bytes()))
    }
}

/// A new key pair: the secret key file's text and its public key.
pub fn keygen() -> Result<(String, String), String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("no OS randomness: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    seed.fill(0);
    let secret = format!("{SECRET_PREFIX}{}\n", b64().encode(key.to_bytes()));
    Ok((secret, public_text(&key.verifying_key())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_for_its_domain_message_and_key_only() {
        let (secret, public) = keygen().unwrap();
        let (other_secret, _) = keygen().unwrap();
        let key = SecretKey::parse(&secret).unwrap();
        assert_eq!(key.public(), public);
        assert!(!format!("{key:?}").contains(secret.trim()), "Debug shows no secret");
        let trusted = TrustedKeys::parse(std::slice::from_ref(&public)).unwrap();
        assert!(trusted.contains(&public));
        let sig = key.sign(b"domain-a\n", b"message");
        assert_eq!(trusted.verify(b"domain-a\n", b"message", &sig), Ok(public));
        assert_eq!(trusted.verify(b"domain-b\n", b"message", &sig), Err(VerifyError::Untrusted));
        assert_eq!(trusted.verify(b"domain-a\n", b"messagf", &sig), Err(VerifyError::Untrusted));
        let foreign = SecretKey::parse(&other_secret).unwrap().sign(b"domain-a\n", b"message");
        assert_eq!(trusted.verify(b"domain-a\n", b"message", &foreign), Err(VerifyError::Untrusted));
        assert_eq!(trusted.verify(b"domain-a\n", b"message", "ed25519:!!"), Err(VerifyError::Malformed));
        assert!(SecretKey::parse("ed25519:notsecret").is_err());
    }

    #[test]
    fn bad_keys_are_named() {
        assert!(TrustedKeys::parse(&[]).unwrap().is_empty());
        let e = TrustedKeys::parse(&["ed25519:AAAA".into()]).unwrap_err();
        assert!(e.starts_with("keys[0]"), "{e}");
        let (_, good) = keygen().unwrap();
        let e = TrustedKeys::parse(&[good, "rsa:xyz".into()]).unwrap_err();
        assert!(e.starts_with("keys[1]"), "{e}");
    }
}
