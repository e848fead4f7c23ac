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
//! Owns, too, comparing a directory with the host's state by identity
//! (device and inode), not only by name: a second mount of a directory (a
//! bind mount, a volume mounted twice) is the same directory under a name
//! no string comparison relates, so a grant whose directory, or a mount
//! inside it, is a protected path or a directory above one is refused, as
//! is a grant lying inside a directory the host owns; and no name on the
//! way to a protected path (a link, a directory) may lie where Tools write.
//! The same reach keeps component files out of what Tools write
//! ([`Writable`]).
//!
//! Must never hand the sandbox a directory it has not checked.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The host's own state a grant must not reach: what it is, where, and
/// whether it is a directory the host owns (a grant may not lie inside it).
pub type Protected = Arc<[Guarded]>;

/// One thing of the host's that grants must not reach.
#[derive(Debug, Clone)]
pub struct Guarded {
    /// What it is, as a refusal names it ("the journal").
    pub what: String,
    /// Where it is, as configured.
    pub path: PathBuf,
    /// A directory the host owns: no grant may lie inside it either.
    pub owned_dir: bool,
    /// Kept from grants Tools may write only: reading it gives a Tool
    /// nothing (the host's own executable, the journal server's socket),
    /// replacing it gives the Tool the host.
    pub writes_only: bool,
}

impl Guarded {
    /// Kept from every grant.
    pub fn new(what: impl Into<String>, path: PathBuf, owned_dir: bool) -> Self {
        Guarded { what: what.into(), path, owned_dir, writes_only: false }
    }

    /// Kept from grants Tools may write.
    pub fn from_writes(what: impl Into<String>, path: PathBuf) -> Self {
        Guarded { what: what.into(), path, owned_dir: false, writes_only: true }
    }

    /// Whether a grant (`read_write` or not) must be kept from it.
    pub fn applies_to(&self, read_write: bool) -> bool {
        read_write || !self.writes_only
    }
}

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
    /// Whether the grant lets Tools write (then nothing on the way to the
    /// host's state may lie inside it either).
    read_write: bool,
    opened: OnceLock<File>,
}

/// Why a grant's directory is not handed out.
enum Unbound {
    /// It cannot be opened (it may not exist yet).
    Open(String),
    /// It reaches the host's own state.
    Refused(Refusal),
}

/// How a grant's directory reaches the host's own state.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Where the directory is, as the kernel names it.
    pub checked: PathBuf,
    /// Words that read "DIRECTORY {relation} WHAT (PATH)".
    pub relation: String,
    /// What it reaches.
    pub what: String,
    /// Where that is.
    pub path: PathBuf,
}

/// A binding is not configuration: two configs that say the same are equal.
impl PartialEq for GrantDir {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for GrantDir {}

impl GrantDir {
    /// A binding checked against `protected` when it is first opened;
    /// `read_write`: the grant lets Tools write.
    pub fn new(protected: Protected, read_write: bool) -> Self {
        GrantDir(Arc::new(Bound { protected: Some(protected), read_write, opened: OnceLock::new() }))
    }

    /// Bind to the directory at `configured` now, if it exists (else at its
    /// first use). An error only when the directory found reaches the
    /// host's own state: the message names it and what to do.
    pub(crate) fn bind(&self, configured: &Path) -> Result<(), Refusal> {
        match self.open_checked(configured) {
            Ok(_) | Err(Unbound::Open(_)) => Ok(()),
            Err(Unbound::Refused(e)) => Err(e),
        }
    }

    /// What the bound directory reaches, by identity — or, not bound, the
    /// directory at `configured` now; `None` if there is none.
    pub(crate) fn reach(&self, configured: &Path) -> Option<Reach> {
        match self.0.opened.get() {
            Some(f) => Some(Reach::of_opened(f, &real_path(f)?)),
            None => Reach::of_path(configured),
        }
    }

    /// The path the sandbox opens for this grant: the directory found at
    /// `configured` the first time this is asked (the config asks at load),
    /// checked, then that same directory for every call (through
    /// `/proc/self/fd`). Where the process cannot name
    /// its descriptors (no `/proc`), the path as configured, checked each
    /// time (SECURITY.md lists the window that leaves).
    pub fn path(&self, configured: &Path) -> Result<PathBuf, String> {
        self.open_checked(configured).map_err(|e| match e {
            Unbound::Open(e) => e,
            Unbound::Refused(Refusal { checked, relation, what, path }) => format!(
                "granted directory {} is now {} — it {relation} {what} ({}); refused: a Tool must never \
                 reach the host's own state. Restore the directory (or change the [[grants]] entry) and reload",
                configured.display(),
                checked.display(),
                path.display()
            ),
        })
    }

    fn open_checked(&self, configured: &Path) -> Result<PathBuf, Unbound> {
        if let Some(f) = self.0.opened.get() {
            return Ok(fd_path(f));
        }
        let Some(protected) = &self.0.protected else {
            return Err(Unbound::Open(format!(
                "the directory grant of {} was not checked by a loaded config; build grants with \
                 `Config::load` / `Config::parse`",
                configured.display()
            )));
        };
        let dir = open_dir(configured).map_err(|e| {
            Unbound::Open(format!(
                "cannot open granted directory {}: {e}; check the [[grants]] entry",
                configured.display()
            ))
        })?;
        let real = real_path(&dir);
        let checked = real.clone().unwrap_or_else(|| configured.to_owned());
        let reach = Reach::of_opened(&dir, &checked);
        for g in protected.iter().filter(|g| g.applies_to(self.0.read_write)) {
            let relation = overlap(&checked, &g.path, g.owned_dir)
                .map(str::to_owned)
                .or_else(|| reach.reaches(&g.path, g.owned_dir, self.0.read_write));
            if let Some(relation) = relation {
                return Err(Unbound::Refused(Refusal {
                    checked,
                    relation,
                    what: g.what.clone(),
                    path: g.path.clone(),
                }));
            }
        }
        if real.is_none() {
            return Ok(configured.to_owned());
        }
        Ok(fd_path(self.0.opened.get_or_init(|| dir)))
    }
}

/// What a second name of a file or directory — a bind mount, a volume
/// mounted twice, a hard link — shares with the first: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Identity {
        Identity { dev: m.dev(), ino: m.ino() }
    }

    /// Of what `path` leads to (symlinks followed), if it exists.
    fn at(path: &Path) -> Option<Identity> {
        std::fs::metadata(path).ok().map(|m| Identity::of(&m))
    }
}

/// `path` — or, where it does not exist yet, the deepest ancestor that does
/// (where it will be created) — and every directory above it, as the kernel
/// finds them: each real path with its identity, nearest first.
fn chain(path: &Path) -> Vec<(PathBuf, Identity)> {
    let Some(real) = path.ancestors().find_map(|a| std::fs::canonicalize(a).ok()) else {
        return Vec::new();
    };
    real.ancestors().filter_map(|a| Some((a.to_owned(), Identity::at(a)?))).collect()
}

/// One step of a lookup.
enum Step {
    Root,
    Up,
    Name(OsString),
}

fn steps(path: &Path) -> impl DoubleEndedIterator<Item = Step> + '_ {
    path.components().filter_map(|c| match c {
        Component::RootDir | Component::Prefix(_) => Some(Step::Root),
        Component::CurDir => None,
        Component::ParentDir => Some(Step::Up),
        Component::Normal(n) => Some(Step::Name(n.to_owned())),
    })
}

/// Every directory in which the kernel looks a name up to open `path`
/// (relative to the working directory), following each symlink as it does
/// (at most 40): each as its real path, in order, without repeats. A
/// directory holding one of them — or a link on the way — can send the
/// lookup elsewhere. A name not found ends the walk: what follows will be
/// created inside the last directory listed.
pub(crate) fn lookups(path: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let Ok(mut cur) = (if path.is_absolute() { Ok(PathBuf::from("/")) } else { std::env::current_dir() }) else {
        return dirs;
    };
    let mut todo: Vec<Step> = steps(path).rev().collect();
    let mut links = 0;
    while let Some(step) = todo.pop() {
        if !matches!(step, Step::Root) && dirs.last() != Some(&cur) {
            dirs.push(cur.clone());
        }
        match step {
            Step::Root => cur = PathBuf::from("/"),
            Step::Up => {
                cur.pop();
            }
            Step::Name(name) => {
                let next = cur.join(&name);
                let Ok(meta) = std::fs::symlink_metadata(&next) else { break };
                if !meta.file_type().is_symlink() {
                    cur = next;
                    continue;
                }
                links += 1;
                let Ok(target) = std::fs::read_link(&next) else { break };
                if links > 40 {
                    break;
                }
                todo.extend(steps(&target).rev().collect::<Vec<_>>());
            }
        }
    }
    let mut seen = Vec::with_capacity(dirs.len());
    for d in dirs {
        if !seen.contains(&d) {
            seen.push(d);
        }
    }
    seen
}

/// Undo `/proc/self/mountinfo`'s octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt as _;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// The mounts at or below `dir` (a real path), from `/proc/self/mountinfo`
/// (none without it): each mount point, the identity of what is mounted
/// there, and whether it is a process filesystem (procfs).
fn mounts_under(dir: &Path) -> Vec<(PathBuf, Option<Identity>, bool)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(point) = fields.get(4).map(|f| unescape(f)) else { continue };
        if !point.starts_with(dir) {
            continue;
        }
        let fstype = fields.iter().skip(6).skip_while(|f| **f != "-").nth(1);
        out.push((point.clone(), Identity::at(&point), fstype == Some(&"proc")));
    }
    out
}

/// Whether the directory opened as `f` is on a process filesystem (procfs).
fn on_proc(f: &File) -> bool {
    #[cfg(target_os = "linux")]
    {
        rustix::fs::fstatfs(f).is_ok_and(|s| s.f_type == rustix::fs::PROC_SUPER_MAGIC)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = f;
        false
    }
}

/// What a directory grant reaches, by identity (not by name): the directory
/// itself and every mount inside it — another filesystem, or a second name
/// of a directory (or file) mounted elsewhere too — and the directories
/// above it.
#[derive(Debug)]
pub(crate) struct Reach {
    /// The directory, as the kernel names it.
    dir: PathBuf,
    /// The directory and the mounts inside it: each with its identity.
    roots: Vec<(PathBuf, Identity)>,
    /// The directory and those above it.
    above: Vec<(PathBuf, Identity)>,
    /// A process filesystem it is on, or mounted inside it.
    proc: Option<PathBuf>,
}

impl Reach {
    /// Of the directory opened as `f`, found at `real`.
    pub(crate) fn of_opened(f: &File, real: &Path) -> Reach {
        let own = f.metadata().ok().map(|m| (real.to_owned(), Identity::of(&m)));
        let mut proc = on_proc(f).then(|| real.to_owned());
        let mut roots: Vec<(PathBuf, Identity)> = own.into_iter().collect();
        for (point, id, is_proc) in mounts_under(real) {
            if is_proc && proc.is_none() {
                proc = Some(point.clone());
            }
            if let Some(id) = id
                && !roots.iter().any(|(_, r)| *r == id)
            {
                roots.push((point, id));
            }
        }
        Reach { dir: real.to_owned(), roots, above: chain(real), proc }
    }

    /// Of the directory at `path` now, if there is one.
    pub(crate) fn of_path(path: &Path) -> Option<Reach> {
        let f = open_dir(path).ok()?;
        let real = real_path(&f).or_else(|| std::fs::canonicalize(path).ok())?;
        Some(Reach::of_opened(&f, &real))
    }

    /// The directory's own identity.
    fn identity(&self) -> Option<Identity> {
        self.roots.first().filter(|(p, _)| *p == self.dir).map(|(_, i)| *i)
    }

    /// The first of `chain` (a path and the directories above it) that this
    /// grant reaches: the root (the directory or a mount inside it) that is
    /// it, and its name in `chain`.
    fn holding<'a>(&'a self, chain: &'a [(PathBuf, Identity)]) -> Option<(&'a Path, &'a Path)> {
        chain.iter().find_map(|(name, id)| {
            self.roots.iter().find(|(_, r)| r == id).map(|(root, _)| (root.as_path(), name.as_path()))
        })
    }

    /// How a grant of this directory reaches protected `path` by identity,
    /// as words that read "GRANT {relation} WHAT (PATH)"; `None` if it does
    /// not. `owned_dir`: a directory the host owns (no grant may lie inside
    /// it); `read_write`: Tools may write in the grant (then no name on the
    /// way to `path` may lie inside it).
    pub(crate) fn reaches(&self, path: &Path, owned_dir: bool, read_write: bool) -> Option<String> {
        let target = chain(path);
        let same = "another name (the same device and inode) for";
        if let Some((root, name)) = self.holding(&target) {
            let exact = target.first().is_some_and(|(n, _)| n == name) && std::fs::metadata(path).is_ok();
            let what = if exact { String::new() } else { format!(" {}, which holds", name.display()) };
            return Some(if root == self.dir {
                format!("is {same}{what}")
            } else {
                format!("holds {}, a mount that is {same}{what}", root.display())
            });
        }
        if owned_dir
            && let Some(id) = Identity::at(path)
            && let Some((above, _)) = self.above.iter().find(|(_, a)| *a == id)
        {
            return Some(format!("lies inside {}, {same}", above.display()));
        }
        if let Some(proc) = &self.proc
            && path_on_proc(path)
        {
            return Some(if *proc == self.dir {
                "is on a process filesystem (procfs), as are".to_owned()
            } else {
                format!("holds {}, a process filesystem (procfs) mount, as are", proc.display())
            });
        }
        if read_write {
            for dir in lookups(path) {
                if self.holding(&chain(&dir)).is_some() {
                    return Some(format!("holds a name a Tool could replace (in {}) on the way to", dir.display()));
                }
            }
        }
        None
    }

    /// Whether this grant (one Tools may write) holds `other`'s directory
    /// (not the same one) by identity, or a name on the way to it
    /// (`configured`): how, as words for "OTHER is inside THIS ({how})".
    pub(crate) fn holds_dir(&self, other: Option<&Reach>, configured: &Path) -> Option<String> {
        if let Some(other) = other {
            if other.identity().is_some() && other.identity() == self.identity() {
                return None;
            }
            if let Some((root, name)) = self.holding(&other.above) {
                return Some(if root == self.dir {
                    format!("{} is another name for it", name.display())
                } else {
                    format!("{} is a mount inside it of {}", root.display(), name.display())
                });
            }
        }
        lookups(configured)
            .into_iter()
            .find(|dir| self.holding(&chain(dir)).is_some())
            .map(|dir| format!("it is found through a name in {}, which a Tool could replace", dir.display()))
    }
}

/// Whether `path` is on a process filesystem (procfs).
fn path_on_proc(path: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        rustix::fs::statfs(path).is_ok_and(|s| s.f_type == rustix::fs::PROC_SUPER_MAGIC)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        false
    }
}

/// Where Tools may write — every read-write directory grant, by identity —
/// as the catalog keeps component files out of it: a component a Tool could
/// rewrite (or whose link it could point elsewhere) would be loaded by the
/// next process under that Tool's id, with its grants.
#[derive(Debug, Default)]
pub struct Writable(Vec<(String, PathBuf, Reach)>);

impl Writable {
    /// Of `grants`: each read-write grant's field (`grants[0].directories[1]`), its path and its reach.
    pub(crate) fn new(grants: Vec<(String, PathBuf, Option<Reach>)>) -> Writable {
        Writable(grants.into_iter().filter_map(|(at, host, reach)| Some((at, host, reach?))).collect())
    }

    /// Refuse a component file at `path` that a Tool could change: found
    /// (the file, a directory or a link on the way) inside a read-write
    /// grant, or with a second link the host can write through. The reason
    /// names the grant and what to do.
    pub fn check_component(&self, path: &Path) -> Result<(), String> {
        let mut on_the_way = lookups(path);
        on_the_way.extend(std::fs::canonicalize(path).ok());
        for dir in &on_the_way {
            let above = chain(dir);
            for (at, host, reach) in &self.0 {
                if let Some((root, name)) = reach.holding(&above) {
                    let via = if root != reach.dir {
                        format!(", through {}, a mount inside it", root.display())
                    } else if !name.starts_with(&reach.dir) {
                        format!(", as {}, another name for it", name.display())
                    } else {
                        String::new()
                    };
                    return Err(format!(
                        "found through {}, which lies inside {at} ({}{via}), granted read-write: a Tool holding \
                         that grant could rewrite the component, or point a link on the way to it elsewhere, and \
                         the next process would load that under this component's Tool ids, with their grants. \
                         Put the component file itself in the plugin directory (a copy, not a link into the \
                         grant), or change the grant",
                        dir.display(),
                        host.display()
                    ));
                }
            }
        }
        crate::files::single_link(path, false).map_err(|e| format!("{e}; a Tool could rewrite the component"))
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
    fn every_directory_a_lookup_passes_through_is_listed() {
        let d = tempfile::tempdir().unwrap();
        let d = &std::fs::canonicalize(d.path()).unwrap();
        for sub in ["plugins", "work/deep", "real"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("real/x.wasm"), "").unwrap();
        // plugins/x.wasm -> ../work/deep/../link, work/link -> /…/real/x.wasm
        std::os::unix::fs::symlink("../work/deep/../link", d.join("plugins/x.wasm")).unwrap();
        std::os::unix::fs::symlink(d.join("real/x.wasm"), d.join("work/link")).unwrap();
        let seen = lookups(&d.join("plugins/x.wasm"));
        for dir in ["plugins", "work", "work/deep", "real"] {
            assert!(seen.contains(&d.join(dir)), "{dir}: {seen:?}");
        }
        assert!(seen.contains(&PathBuf::from("/")) && !seen.contains(&d.join("real/x.wasm")), "{seen:?}");
        // A name not found ends the walk where it would be created.
        let seen = lookups(&d.join("work/link-not-there/j.db"));
        assert_eq!(seen.last(), Some(&d.join("work")), "{seen:?}");
        // A loop of links ends.
        std::os::unix::fs::symlink("loop", d.join("loop")).unwrap();
        assert!(lookups(&d.join("loop")).contains(d));
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/mnt/a\\040b\\011c\\134d"), PathBuf::from("/mnt/a b\tc\\d"));
        assert_eq!(unescape("/x\\04"), PathBuf::from("/x\\04"));
        assert_eq!(unescape("/x\\999"), PathBuf::from("/x\\999"));
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
        let grant = GrantDir::new(vec![Guarded::new("the journal", host.join("journal.db"), false)].into(), false);
        let first = grant.path(&data).unwrap();
        assert_eq!(std::fs::read_to_string(first.join("a.txt")).unwrap(), "alpha");
        // The path is swapped for a symlink to the host's state.
        std::fs::rename(&data, d.path().join("data-old")).unwrap();
        std::os::unix::fs::symlink(&host, &data).unwrap();
        let again = grant.path(&data).unwrap();
        assert_eq!(std::fs::read_to_string(again.join("a.txt")).unwrap(), "alpha");
        assert!(!again.join("journal.db").exists());
        // A binding made after the swap refuses it, naming what it would reach.
        let fresh = GrantDir::new(vec![Guarded::new("the journal", host.join("journal.db"), false)].into(), false);
        let e = fresh.path(&data).unwrap_err();
        assert!(e.contains("the journal") && e.contains("refused"), "{e}");
        // One the config did not make (nothing to check against) is never opened.
        assert!(GrantDir::default().path(&d.path().join("data-old")).unwrap_err().contains("not checked"));
    }
}
