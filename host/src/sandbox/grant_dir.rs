//! Grant directories: each directory grant bound to one directory object.
//!
//! Owns opening a grant's host directory once (when the config is loaded,
//! or at its first use if it did not exist then), checking that the
//! directory actually opened — not the path as written in the config — is
//! none of the host's own state (invariant 14), and handing every later call
//! that same directory. A path swapped after load (a directory renamed away and a
//! symlink put in its place, by another Tool with a writable grant above it or
//! by anyone else) never changes what a Tool reaches: the sandbox reopens the
//! bound directory through its descriptor, not through the path.
//!
//! Must never hand the sandbox a directory it has not checked.

use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The host's own state a grant must not reach: what it is, where, and
/// whether it is a directory the host owns (a grant may not lie inside it).
pub type Protected = Arc<[(String, PathBuf, bool)]>;

/// One directory grant's binding; clones share it. Made by the config for
/// each `[[grants]] directories` entry: bound for as long as that loaded
/// config is in use (the process, for `toolgate serve`).
#[derive(Debug, Clone, Default)]
pub struct GrantDir(Arc<Bound>);

#[derive(Debug, Default)]
struct Bound {
    /// `None`: not made by the config (a default, e.g. a grant built by
    /// hand): nothing to check against, so it is never opened.
    protected: Option<Protected>,
    opened: OnceLock<File>,
}

/// A binding is not configuration: two configs that say the same are equal.
impl PartialEq for GrantDir {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for GrantDir {}

impl GrantDir {
    /// A binding checked against `protected` when it is first opened.
    pub fn new(protected: Protected) -> Self {
        GrantDir(Arc::new(Bound { protected: Some(protected), opened: OnceLock::new() }))
    }

    /// The path the sandbox opens for this grant: the directory found at
    /// `configured` the first time this is asked (the config asks at load),
    /// checked, then that same directory for every call (through
    /// `/proc/self/fd`). Where the process cannot name
    /// its descriptors (no `/proc`), the path as configured, checked each
    /// time (SECURITY.md lists the window that leaves).
    pub fn path(&self, configured: &Path) -> Result<PathBuf, String> {
        if let Some(f) = self.0.opened.get() {
            return Ok(fd_path(f));
        }
        let Some(protected) = &self.0.protected else {
            return Err(format!(
                "the directory grant of {} was not checked by a loaded config; build grants with \
                 `Config::load` / `Config::parse`",
                configured.display()
            ));
        };
        let dir = open_dir(configured).map_err(|e| {
            format!("cannot open granted directory {}: {e}; check the [[grants]] entry", configured.display())
        })?;
        let real = real_path(&dir);
        let checked = real.clone().unwrap_or_else(|| configured.to_owned());
        for (what, p, owned_dir) in protected.iter() {
            if let Some(relation) = overlap(&checked, p, *owned_dir) {
                return Err(format!(
                    "granted directory {} is now {} — it {relation} {what} ({}); refused: a Tool must never \
                     reach the host's own state. Restore the directory (or change the [[grants]] entry) and reload",
                    configured.display(),
                    checked.display(),
                    p.display()
                ));
            }
        }
        if real.is_none() {
            return Ok(configured.to_owned());
        }
        Ok(fd_path(self.0.opened.get_or_init(|| dir)))
    }
}

/// The directory itself, following symlinks as the sandbox's own open does;
/// a path-only descriptor where the OS has one (no read permission needed).
fn open_dir(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = rustix::fs::OFlags::DIRECTORY;
    #[cfg(target_os = "linux")]
    {
        flags |= rustix::fs::OFlags::PATH;
    }
    std::fs::OpenOptions::new().read(true).custom_flags(flags.bits() as i32).open(path)
}

fn fd_path(f: &File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Where `f` is now, as the kernel names it; `None` without `/proc`.
fn real_path(f: &File) -> Option<PathBuf> {
    std::fs::read_link(fd_path(f)).ok().filter(|p| p.is_absolute())
}

/// `path` with `.` and `..` removed lexically.
pub(crate) fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `path` with symlinks resolved as far as it exists, by the kernel's rules
/// (a `..` after a symlink leaves the symlink's target, not the link's
/// directory): the deepest existing ancestor canonicalized, the rest
/// appended — a journal not created yet under a symlinked directory still
/// has its real place.
fn resolved(path: &Path) -> Option<PathBuf> {
    path.ancestors().find_map(|a| {
        let real = std::fs::canonicalize(a).ok()?;
        Some(lexical(&real.join(path.strip_prefix(a).ok()?)))
    })
}

/// How directory grant `grant` overlaps protected `path`: it contains it,
/// or (`owned_dir`: a directory the host owns) lies inside it. Compared as
/// written and with symlinks resolved (as far as each path exists).
pub(crate) fn overlap(grant: &Path, path: &Path, owned_dir: bool) -> Option<&'static str> {
    let forms = |p: &Path| {
        let mut v = vec![lexical(p)];
        v.extend(resolved(p));
        v
    };
    for g in forms(grant) {
        for p in forms(path) {
            if p.starts_with(&g) {
                return Some(if p == g { "is" } else { "contains" });
            }
            if owned_dir && g.starts_with(&p) {
                return Some("is inside");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_protected_path_not_created_yet_is_found_through_a_symlinked_ancestor() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        // The journal will be created at link/state/journal.db: inside the grant `real`.
        assert_eq!(overlap(&real, &d.path().join("link/state/journal.db"), false), Some("contains"));
        assert_eq!(overlap(&d.path().join("link"), &real.join("j.db"), false), Some("contains"));
        assert_eq!(overlap(&real.join("sub"), &d.path().join("link"), true), Some("is inside"));
        assert_eq!(overlap(&d.path().join("other"), &d.path().join("link/j.db"), false), None);
        // `link/../cache` is where the kernel goes: beside `real`'s target, not beside `link`.
        let conf = d.path().join("opt/conf");
        std::fs::create_dir_all(conf.join("tg")).unwrap();
        std::os::unix::fs::symlink(conf.join("tg"), d.path().join("tg")).unwrap();
        let cache = conf.join("cache");
        assert_eq!(overlap(&cache, &d.path().join("tg/../cache"), true), Some("is"));
        std::fs::create_dir(&cache).unwrap();
        assert_eq!(overlap(&cache, &d.path().join("tg/../cache"), true), Some("is"));
    }

    #[test]
    fn a_grant_stays_bound_to_the_directory_it_first_opened() {
        let d = tempfile::tempdir().unwrap();
        let (data, host) = (d.path().join("data"), d.path().join("host"));
        for dir in [&data, &host] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(data.join("a.txt"), "alpha").unwrap();
        std::fs::write(host.join("journal.db"), "state").unwrap();
        let grant = GrantDir::new(vec![("the journal".to_owned(), host.join("journal.db"), false)].into());
        let first = grant.path(&data).unwrap();
        assert_eq!(std::fs::read_to_string(first.join("a.txt")).unwrap(), "alpha");
        // The path is swapped for a symlink to the host's state.
        std::fs::rename(&data, d.path().join("data-old")).unwrap();
        std::os::unix::fs::symlink(&host, &data).unwrap();
        let again = grant.path(&data).unwrap();
        assert_eq!(std::fs::read_to_string(again.join("a.txt")).unwrap(), "alpha");
        assert!(!again.join("journal.db").exists());
        // A binding made after the swap refuses it, naming what it would reach.
        let fresh = GrantDir::new(vec![("the journal".to_owned(), host.join("journal.db"), false)].into());
        let e = fresh.path(&data).unwrap_err();
        assert!(e.contains("the journal") && e.contains("refused"), "{e}");
        // One the config did not make (nothing to check against) is never opened.
        assert!(GrantDir::default().path(&d.path().join("data-old")).unwrap_err().contains("not checked"));
    }
}
