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

use crate::digest::Digest;
use crate::keys::{SecretKey, VerifyError};
pub use crate::keys::{TrustedKeys, keygen};

/// What a component signature signs, before the digest.
const DOMAIN: &[u8] = b"toolgate-component-v1\n";

/// Check the detached signature of the component at `path` with `digest`
/// against `keys`.
pub fn verify(keys: &TrustedKeys, path: &Path, digest: &Digest) -> Result<(), String> {
    let sig_path = sig_path(path);
    let shown = sig_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let text = crate::files::read_text(&sig_path, 4096).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("not signed: `{shown}` is missing; the host accepts only signed components (`toolgate sign`)")
        }
        _ => format!("`{shown}` cannot be read as a signature ({e}); sign the file again"),
    })?;
    match keys.verify(DOMAIN, &digest.0, &text) {
        Ok(_) => Ok(()),
        Err(VerifyError::Malformed) => {
            Err(format!("`{shown}` is not an `ed25519:<base64>` signature; sign the file again"))
        }
        Err(VerifyError::Untrusted) => Err(format!(
            "`{shown}` does not verify against any key in `[signing] keys` (the file changed after signing, \
             or its publisher is not trusted)"
        )),
    }
}

/// `FILE.wasm.sig` for `FILE.wasm`.
pub fn sig_path(component: &Path) -> PathBuf {
    let mut s = component.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// Sign the component bytes with the secret key text; returns the `.sig`
/// file's text and the public key it verifies with.
pub fn sign(component: &[u8], secret_key: &str) -> Result<(String, String), String> {
    let key = SecretKey::parse(secret_key)?;
    Ok((format!("{}\n", key.sign(DOMAIN, &Digest::of(component).0)), key.public()))
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
        assert_eq!(verify(&trusted, &p, &Digest::of(b"component bytes")), Ok(()));
        // Changed after signing.
        let e = verify(&trusted, &p, &Digest::of(b"component bytez")).unwrap_err();
        assert!(e.contains("a.wasm.sig") && e.contains("does not verify"), "{e}");
        // Signed by someone not trusted.
        let q = signed(dir.path(), "b.wasm", b"x", &other_secret);
        assert!(verify(&trusted, &q, &Digest::of(b"x")).is_err());
        let both = TrustedKeys::parse(&[public, other_public]).unwrap();
        assert_eq!(verify(&both, &q, &Digest::of(b"x")), Ok(()));
        // Not signed, or garbage.
        let e = verify(&trusted, &dir.path().join("none.wasm"), &Digest::of(b"x")).unwrap_err();
        assert!(e.contains("none.wasm.sig") && e.contains("toolgate sign"), "{e}");
        std::fs::write(sig_path(&q), "ed25519:!!!").unwrap();
        assert!(verify(&trusted, &q, &Digest::of(b"x")).unwrap_err().contains("not an `ed25519:<base64>` signature"));
    }
}
