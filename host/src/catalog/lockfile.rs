//! Lockfile: `toolgate.lock` pins the digest of every plugin file.
//!
//! Owns reading and writing the lock. With a lock present, the catalog
//! refuses a component whose file is not in it or whose sha256 differs from
//! the pinned one, until an operator reviews the change and runs
//! `toolgate lock`. Without a lock, every component that checks is loaded.
//!
//! Architecture invariant: the lock only removes — it never makes a file
//! loadable that the descriptor checks would refuse.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;

/// Lockfile errors, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Cannot read or write it.
    #[error("lockfile {}: {source}", path.display())]
    Io {
        /// The lockfile.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a valid lockfile.
    #[error("lockfile {}: {message}; regenerate it with `toolgate lock`", path.display())]
    Invalid {
        /// The lockfile.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LockDoc {
    version: u32,
    plugins: BTreeMap<String, String>,
}

/// The pinned digests, by file name within the plugin directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockfile {
    path: PathBuf,
    pinned: BTreeMap<String, Digest>,
}

impl Lockfile {
    /// Read `path`; `Ok(None)` when there is no lock.
    pub fn read(path: &Path) -> Result<Option<Lockfile>, LockError> {
        let text = match crate::files::read_text(path, 4 << 20) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(LockError::Io { path: path.to_owned(), source }),
        };
        let invalid = |message: String| LockError::Invalid { path: path.to_owned(), message };
        let doc: LockDoc = toml::from_str(&text).map_err(|e| invalid(e.to_string().trim_end().to_owned()))?;
        if doc.version != 1 {
            return Err(invalid(format!("version {} is not supported", doc.version)));
        }
        let mut pinned = BTreeMap::new();
        for (file, digest) in doc.plugins {
            let d = digest
                .strip_prefix("sha256:")
                .and_then(Digest::from_hex)
                .ok_or_else(|| invalid(format!("`{file}` has an invalid digest `{digest}`")))?;
            pinned.insert(file, d);
        }
        Ok(Some(Lockfile { path: path.to_owned(), pinned }))
    }

    /// Pin exactly `files` (file name → digest) at `path`, atomically.
    pub fn write(path: &Path, files: &BTreeMap<String, Digest>) -> Result<(), LockError> {
        let doc = LockDoc { version: 1, plugins: files.iter().map(|(f, d)| (f.clone(), d.to_string())).collect() };
        let body =
            toml::to_string(&doc).map_err(|e| LockError::Invalid { path: path.to_owned(), message: e.to_string() })?;
        let text = format!("# Written by `toolgate lock`: the sha256 of every plugin this host may load.\n{body}");
        let tmp = path.with_extension("lock.tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| LockError::Io { path: path.to_owned(), source })
    }

    /// Whether `file` with `digest` may load; the error says why not and what to do.
    pub fn check(&self, file: &str, digest: &Digest) -> Result<(), String> {
        match self.pinned.get(file) {
            None => Err(format!("not in {}; review it, then run `toolgate lock` to accept it", self.path.display())),
            Some(pinned) if pinned != digest => Err(format!(
                "changed since {} was written (pinned {pinned}, now {digest}); review it, then run `toolgate lock` to accept it",
                self.path.display()
            )),
            Some(_) => Ok(()),
        }
    }

    /// Pinned files.
    pub fn files(&self) -> impl Iterator<Item = (&str, &Digest)> {
        self.pinned.iter().map(|(f, d)| (f.as_str(), d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolgate.lock");
        assert_eq!(Lockfile::read(&path).unwrap(), None);
        let a = Digest::of(b"a");
        Lockfile::write(&path, &BTreeMap::from([("a.wasm".to_owned(), a)])).unwrap();
        let lock = Lockfile::read(&path).unwrap().unwrap();
        assert_eq!(lock.check("a.wasm", &a), Ok(()));
        assert!(lock.check("a.wasm", &Digest::of(b"b")).unwrap_err().contains("changed since"));
        assert!(lock.check("b.wasm", &a).unwrap_err().contains("not in"));
    }

    #[test]
    fn invalid_lockfiles_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolgate.lock");
        for bad in ["version = 2\n[plugins]\n", "version = 1\n[plugins]\n\"a.wasm\" = \"md5:00\"\n", "nonsense"] {
            std::fs::write(&path, bad).unwrap();
            let e = Lockfile::read(&path).unwrap_err().to_string();
            assert!(e.contains("toolgate.lock") && e.contains("toolgate lock"), "{e}");
        }
    }
}
