//! The guest's `wasi:filesystem`, checked in front of wasmtime-wasi's own.
//!
//! Owns three checks: a FIFO, socket or device inside a grant is never given
//! to the guest, and never waited on (a blocking open of one can hold a host
//! thread past any deadline, for good): `open-at` is the host's own, through
//! the same sandboxed directory handle, non-blocking, and decides on the
//! descriptor it opened ([`open_beneath`]), so a Tool renaming a FIFO over a
//! file between a check and the open gains nothing; with any
//! credential configured, a regular file opened for reading is checked for
//! every configured secret before the guest can read it, and refused
//! (`access`) if it holds one, and a name holding one is left out of a
//! listing ([`super::withhold`]); and what one
//! call holds open in the host is counted *live* against the call's limits:
//! descriptors of the host process — files and directories the guest opened,
//! also while only a stream of theirs keeps them open, and directory
//! listings — against `limits.open_files`; file streams (each may hold a read
//! buffer of up to 64 KiB) against `limits.file_streams`. Both are host
//! resources outside the guest's memory limit. A guest past a limit gets an
//! error code, as it would from a full descriptor table, and the host
//! records which limit it met. What one call writes to disk is bounded too
//! ([`DiskBudget`]): bytes written through any path (`write`, a write or
//! append stream, splices into one), or what a file grows by if more (a
//! write or stream past its end, `set-size`), against `limits.disk_write_mib`, and
//! names created (files opened with `create`, directories, links) against
//! `limits.files_created`; past either the guest gets `insufficient-space`,
//! as from a full disk, and the host records which limit it met.
//!
//! A directory listing is toolgate's own ([`Listing`]): one descriptor, read
//! [`BATCH`] names at a time as the guest asks. wasmtime-wasi's reads the
//! whole directory into host memory at `read-directory`, which a Tool that
//! filled a read-write grant with millions of names could repeat for every
//! listing it holds.
//!
//! It must never widen what wasmtime-wasi allows: `open-at` reads the
//! guest's flags as wasmtime-wasi 48 does ([`How`]: the same refusals, the
//! grant's permissions on what it opens), every other operation it lets
//! through is wasmtime-wasi's own, on the same sandboxed handles, and a
//! listing reads only the directory its descriptor already names.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;

use wasmtime::component::{Linker, Resource, ResourceTable, ResourceType};
use wasmtime_wasi::filesystem::{Descriptor, Dir, File, OpenMode, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self as fs, DescriptorFlags, ErrorCode, HostDescriptor, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, FsError, OutputStream, Pollable, StreamError, StreamResult};

use super::scan::SecretScanner;
use super::withhold::{CallSecrets, CancelOnDrop, named, shown};
use crate::config::Limits;

/// A call's state, as these checks need it.
pub(super) trait FilesystemCall: Send + 'static {
    /// The call's filesystem view and what the call holds open.
    fn filesystem_and_held(&mut self) -> (WasiFilesystemCtxView<'_>, &mut Held);
}

/// What keeps one host descriptor open: the guest's descriptor and every
/// stream or background read made from it share it (an `Arc` of the file),
/// a listing has one of its own. Held weakly: it is open while it lives.
type OpenFile = Weak<dyn Any + Send + Sync>;

/// What one call holds open through its filesystem, counted live, each kind
/// pruned of what the guest dropped only when it reaches its limit (so the
/// common call, far below every limit, pays one push per open).
#[derive(Debug)]
pub(super) struct Held {
    files: Counted<OpenFile>,
    /// File streams by handle number. A number reused by a stream that did
    /// not come through here (an HTTP body) still counts until it is
    /// dropped: the count can only err towards the guest's own handles.
    streams: Counted<u32>,
    /// The call's check for secrets; `None` when no credential is configured.
    secrets: Option<Arc<CallSecrets>>,
    /// What the call may still write; made at its first write (most calls
    /// write nothing and allocate nothing for it).
    disk: Option<Arc<DiskBudget>>,
    disk_limit: u64,
    /// Names the call created, the most it may, and the creates refused.
    created: (u64, u64, u64),
}

/// What one call may still write to disk, shared by the call's filesystem
/// hooks and every write stream it holds: a Tool with a read-write grant
/// could otherwise fill the filesystem the journal, the cache and every
/// other call write to, within one call.
#[derive(Debug)]
pub(super) struct DiskBudget {
    left: AtomicU64,
    refused: AtomicU64,
}

impl DiskBudget {
    /// Takes `n` bytes, if that many are left.
    fn take(&self, n: u64) -> bool {
        let taken = self.left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| left.checked_sub(n)).is_ok();
        if !taken {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Gives back `n` bytes taken for a write that did not write them.
    fn give_back(&self, n: u64) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }

    fn left(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }
}

/// The error a full disk gives: `insufficient-space` to the guest.
fn disk_full() -> std::io::Error {
    std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error())
}

/// A write or append stream of a file, each byte taken from the call's
/// [`DiskBudget`] before it goes to wasmtime-wasi's stream underneath.
struct Budgeted {
    inner: DynOutputStream,
    budget: Arc<DiskBudget>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for Budgeted {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Budgeted {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if !self.budget.take(bytes.len() as u64) {
            return Err(StreamError::LastOperationFailed(disk_full().into()));
        }
        self.inner.write(bytes)
    }
    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        let n = self.inner.check_write()?;
        // Room for what is left; with nothing left, the stream's own room,
        // and the next write fails as on a full disk. Never "ready for 0"
        // (a guest waiting for room would wait until its deadline, or trap)
        // and never an error here: a flush of what was written in budget
        // waits for this to be ready, and must succeed.
        match usize::try_from(self.budget.left()).unwrap_or(usize::MAX) {
            0 => Ok(n),
            left => Ok(n.min(left)),
        }
    }
    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[derive(Debug)]
struct Counted<T> {
    limit: usize,
    held: Vec<T>,
    refused: u64,
}

impl<T> Counted<T> {
    fn new(limit: u64) -> Self {
        Counted { limit: usize::try_from(limit).unwrap_or(usize::MAX), held: Vec::new(), refused: 0 }
    }

    /// Whether one more may be held, pruning what is no longer `live` at the limit.
    fn admit(&mut self, live: impl Fn(&T) -> bool) -> bool {
        if self.held.len() >= self.limit {
            self.held.retain(|t| live(t));
        }
        if self.held.len() >= self.limit {
            self.refused += 1;
            return false;
        }
        true
    }

    /// The host's record of this kind's refusals, if any.
    fn record(&self, setting: &str, what: &str) -> Option<String> {
        (self.refused > 0).then(|| {
            let refused = if self.refused == 1 { "1 open was".to_owned() } else { format!("{} opens were", self.refused) };
            format!(
                "{refused} refused: the call held {} {what} at once, its `{setting}`; raise it in [limits] if the Tool needs more",
                self.limit
            )
        })
    }
}

impl Held {
    /// The call's check for secrets; `None` when no credential is configured.
    pub(super) fn secrets(&self) -> Option<&Arc<CallSecrets>> {
        self.secrets.as_ref()
    }

    /// Nothing held; the limits of `limits`; files and names checked by `secrets`, if any.
    pub(super) fn new(limits: &Limits, secrets: Option<Arc<CallSecrets>>) -> Self {
        Held {
            files: Counted::new(limits.open_files),
            streams: Counted::new(limits.file_streams),
            secrets,
            disk: None,
            disk_limit: limits.disk_write_mib.saturating_mul(1 << 20),
            created: (0, limits.files_created, 0),
        }
    }

    /// The call's write budget, made at its first write.
    fn disk(&mut self) -> Arc<DiskBudget> {
        let limit = self.disk_limit;
        self.disk
            .get_or_insert_with(|| Arc::new(DiskBudget { left: AtomicU64::new(limit), refused: AtomicU64::new(0) }))
            .clone()
    }

    /// Whether the call may create one more name (a refusal is counted).
    fn may_create(&mut self) -> bool {
        let (created, limit, refused) = &mut self.created;
        if created < limit {
            return true;
        }
        *refused += 1;
        false
    }

    /// The call created a name. Names are not given back when deleted: a
    /// count, not a level (a Tool could otherwise create and delete without end
    /// while each create costs the filesystem a journal write).
    fn created_one(&mut self) {
        self.created.0 += 1;
    }

    fn admit_file(&mut self) -> bool {
        self.files.admit(|f| f.strong_count() > 0)
    }

    fn hold_file(&mut self, file: OpenFile) {
        self.files.held.push(file);
    }

    fn admit_stream(&mut self, table: &ResourceTable) -> bool {
        self.streams.admit(|&rep| {
            table.get(&Resource::<DynInputStream>::new_borrow(rep)).is_ok()
                || table.get(&Resource::<DynOutputStream>::new_borrow(rep)).is_ok()
        })
    }

    fn hold_stream(&mut self, rep: u32) {
        // A number freed and given out again is held once.
        if !self.streams.held.contains(&rep) {
            self.streams.held.push(rep);
        }
    }

    /// The host's records of the call's refusals: one line per limit met.
    pub(super) fn records(&self) -> impl Iterator<Item = String> {
        [
            self.files.record("limits.open_files", "files, directories and listings open"),
            self.streams.record("limits.file_streams", "file streams"),
            (self.created.2 > 0).then(|| {
                format!(
                    "{} create(s) refused (`insufficient-space`): the call created {} files, directories and \
                     links, its `limits.files_created`; raise it in [limits] if the Tool needs more",
                    self.created.2, self.created.1
                )
            }),
            self.disk.as_ref().and_then(|d| {
                let refused = d.refused.load(Ordering::Relaxed);
                (refused > 0).then(|| {
                    format!(
                        "{refused} write(s) refused (`insufficient-space`): the call wrote {} MiB, its \
                         `limits.disk_write_mib`; raise it in [limits] if the Tool needs to write more",
                        self.disk_limit >> 20
                    )
                })
            }),
        ]
        .into_iter()
        .flatten()
    }
}

/// What keeps the descriptor of `d` open.
fn open_file(d: &Descriptor) -> OpenFile {
    match d {
        Descriptor::File(f) => Arc::downgrade(&f.file) as OpenFile,
        Descriptor::Dir(d) => Arc::downgrade(&d.dir) as OpenFile,
    }
}

/// A guest past a limit gets the error a full descriptor table would give
/// it, as near as `wasi:filesystem` says it (it has no "too many open files").
const PAST_A_LIMIT: ErrorCode = ErrorCode::InsufficientMemory;

fn code(e: FsError) -> wasmtime::Result<ErrorCode> {
    e.downcast()
}

/// Names a listing reads from the directory at once, on the blocking pool.
pub(super) const BATCH: usize = 64;

type Batch = VecDeque<Result<fs::DirectoryEntry, ErrorCode>>;

/// A directory listing (`wasi:filesystem` `directory-entry-stream`): its own
/// descriptor of the directory, read [`BATCH`] names at a time as the guest
/// asks, so the host holds at most a batch of names per listing (and the
/// reader's buffer, under 64 KiB).
pub(super) struct Listing {
    /// `None` once the directory is read to its end (or failed).
    dir: Option<rustix::fs::Dir>,
    batch: Batch,
    /// Lives as long as the listing: what [`Held`] counts as its open file.
    open: Arc<()>,
    /// Names are checked for secrets: by this call's check, with this scanner.
    names: Option<NameCheck>,
}

/// What checks the names of a listing: the call's check (for its records),
/// its scanner, and the guest's path of the directory.
#[derive(Clone)]
struct NameCheck {
    secrets: Arc<CallSecrets>,
    scanner: Arc<SecretScanner>,
    dir: String,
}

impl Listing {
    /// A listing of `dir`, opened on the blocking pool (a directory on a
    /// network filesystem may take long to open); its names checked by
    /// `secrets`, if any.
    async fn open(dir: Arc<std::fs::File>, secrets: Option<Arc<CallSecrets>>) -> Result<Self, ErrorCode> {
        let opened = tokio::task::spawn_blocking(move || {
            use rustix::fs::{Mode, OFlags};
            // The directory itself, through the guest's descriptor: nothing else is named.
            let own =
                rustix::fs::openat(&*dir, c".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
            let names = secrets.map(|secrets| NameCheck {
                scanner: secrets.listing_scanner(),
                dir: secrets.guest_path(&dir, ""),
                secrets,
            });
            rustix::fs::Dir::new(own).map(|d| (d, names))
        })
        .await
        .map_err(|_| ErrorCode::Io)?;
        let (dir, names) = opened.map_err(|e| ErrorCode::from(std::io::Error::from(e)))?;
        Ok(Listing { dir: Some(dir), batch: VecDeque::new(), open: Arc::new(()), names })
    }

    /// The next entry; `None` at the end.
    async fn next(&mut self) -> Result<Option<fs::DirectoryEntry>, ErrorCode> {
        if self.batch.is_empty()
            && let Some(dir) = self.dir.take()
        {
            let names = self.names.clone();
            let (dir, batch) = tokio::task::spawn_blocking(move || read_batch(dir, names.as_ref()))
                .await
                .map_err(|_| ErrorCode::Io)?;
            self.dir = dir;
            self.batch = batch;
        }
        self.batch.pop_front().transpose()
    }

    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.batch.len()
    }
}

/// Up to [`BATCH`] entries of `dir` (without `.` and `..`), and the reader
/// if it goes on. As wasmtime-wasi lists them: a name that is not UTF-8 is
/// `illegal-byte-sequence` and the listing goes on; an error reading the
/// directory ends it. A name that holds a secret of `names` is left out,
/// and recorded.
fn read_batch(mut dir: rustix::fs::Dir, names: Option<&NameCheck>) -> (Option<rustix::fs::Dir>, Batch) {
    let mut batch = VecDeque::with_capacity(BATCH);
    while batch.len() < BATCH {
        let entry = match dir.read() {
            None => return (None, batch),
            Some(Err(e)) => {
                batch.push_back(Err(ErrorCode::from(std::io::Error::from(e))));
                return (None, batch);
            }
            Some(Ok(entry)) => entry,
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if let Some(check) = names
            && let Some(f) = check.scanner.find(name.to_bytes())
        {
            check.secrets.record_quoting(|q| {
                format!(
                    "a name in the listing of {} was left out: it held {}; keep secrets out of granted directories",
                    q(&shown(&check.dir)),
                    named(&f)
                )
            });
            continue;
        }
        let kind = match entry.file_type() {
            // The filesystem does not say (some do not): ask, without following a link.
            rustix::fs::FileType::Unknown => dir
                .fd()
                .and_then(|fd| rustix::fs::statat(fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW))
                .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode))
                .unwrap_or(rustix::fs::FileType::Unknown),
            known => known,
        };
        batch.push_back(match std::str::from_utf8(name.to_bytes()) {
            Ok(name) => Ok(fs::DirectoryEntry { type_: descriptor_type(kind), name: name.to_owned() }),
            Err(_) => Err(ErrorCode::IllegalByteSequence),
        });
    }
    (Some(dir), batch)
}

/// A file type as wasmtime-wasi reports it (a FIFO or socket is `unknown`
/// there, in `stat` too; a listing says the same).
fn descriptor_type(t: rustix::fs::FileType) -> fs::DescriptorType {
    use rustix::fs::FileType as T;
    match t {
        T::Directory => fs::DescriptorType::Directory,
        T::Symlink => fs::DescriptorType::SymbolicLink,
        T::RegularFile => fs::DescriptorType::RegularFile,
        T::BlockDevice => fs::DescriptorType::BlockDevice,
        T::CharacterDevice => fs::DescriptorType::CharacterDevice,
        _ => fs::DescriptorType::Unknown,
    }
}

/// Replace wasmtime-wasi's `open-at` with the host's checked open, put the
/// checks in front of three file streams in `linker` (which already holds
/// wasmtime-wasi), and replace its directory listings with [`Listing`].
pub(super) fn add_to_linker<S: FilesystemCall>(linker: &mut Linker<S>) -> wasmtime::Result<()> {
    type OpenArgs = (Resource<fs::Descriptor>, PathFlags, String, OpenFlags, DescriptorFlags);
    linker.allow_shadowing(true);
    // The guest's paths of its preopens, for the records of the secret check.
    linker.instance("wasi:filesystem/preopens@0.2.12")?.func_wrap("get-directories", |mut store, (): ()| {
        use wasmtime_wasi::p2::bindings::filesystem::preopens::Host as _;
        let (mut view, held) = store.data_mut().filesystem_and_held();
        let dirs = view.get_directories()?;
        if let Some(secrets) = &held.secrets {
            for (fd, guest) in &dirs {
                if let Ok(Descriptor::Dir(d)) = view.table.get(fd) {
                    secrets.name_dir(&d.dir, guest.clone());
                }
            }
        }
        Ok((dirs,))
    })?;
    let mut types = linker.instance("wasi:filesystem/types@0.2.12")?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store, (fd, path_flags, path, oflags, flags): OpenArgs| {
            Box::new(async move {
                let (view, held) = store.data_mut().filesystem_and_held();
                // A handle not in the table traps; a file's is
                // `not-directory`: as in wasmtime-wasi.
                let (base, perms) = match view.table.get(&fd)? {
                    Descriptor::Dir(d) => (d.dir.clone(), d.perms),
                    Descriptor::File(_) => return Ok((Err(ErrorCode::NotDirectory),)),
                };
                if !held.admit_file() {
                    return Ok((Err(PAST_A_LIMIT),));
                }
                let creates = oflags.contains(OpenFlags::CREATE);
                if creates && !held.may_create() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let how = match How::new(path_flags, oflags, flags, perms) {
                    Ok(how) => how,
                    Err(code) => return Ok((Err(code),)),
                };
                // Only with a credential configured: the guest's path, for records.
                let guest = held.secrets.as_ref().map(|secrets| secrets.guest_path(&base, &path));
                // Opened by the host, on the blocking pool as wasmtime-wasi's
                // own open is, and never in a way that can block there.
                let (dir, p, mode) = (base.clone(), path.clone(), how.mode);
                let opened = match tokio::task::spawn_blocking(move || open_checked(&dir, &p, &how)).await {
                    Ok(Ok(opened)) => opened,
                    Ok(Err(Refused::Special(kind))) => {
                        tracing::debug!(
                            "refused to open {kind} `{}` inside a grant",
                            crate::display::escape_unseen(&path, crate::display::Lines::Escape)
                        );
                        return Ok((Err(ErrorCode::Access),));
                    }
                    Ok(Err(Refused::Code(code))) => return Ok((Err(code),)),
                    Err(_) => return Ok((Err(ErrorCode::Io),)),
                };
                if creates {
                    held.created_one();
                }
                // What wasmtime-wasi's `open-at` would make of it: the
                // grant's permissions, the mode the guest asked for. (Never
                // blocking the current thread: toolgate does not allow it.)
                let opened = view.table.push(match opened {
                    Opened::Dir(d) => Descriptor::Dir(Dir::new(d, perms, mode, false)),
                    Opened::File(f) => Descriptor::File(File::new(f, perms, mode, false)),
                })?;
                let descriptor = view.table.get(&opened)?;
                held.hold_file(open_file(descriptor));
                let (Some(secrets), Some(guest)) = (&held.secrets, guest) else { return Ok((Ok(opened),)) };
                let file = match descriptor {
                    Descriptor::Dir(d) => {
                        secrets.name_dir(&d.dir, guest);
                        return Ok((Ok(opened),));
                    }
                    // Checked whatever it was opened for: a guest that may only
                    // write a file can still cut a secret in it down to what
                    // it may read (or guess its last byte by the refusal).
                    Descriptor::File(f) => (f.file.clone(), f.open_mode.contains(OpenMode::READ)),
                };
                let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
                let (check, stop) = (secrets.clone(), cancel.0.clone());
                let verdict = tokio::task::spawn_blocking(move || match file {
                    (file, true) => check.check_file(&file, &stop),
                    (file, false) => check.check_file(&readable(&file)?, &stop),
                })
                .await
                .unwrap_or_else(|_| Err("the host's check of it failed".into()));
                drop(cancel);
                match verdict {
                    Ok(()) => Ok((Ok(opened),)),
                    Err(why) => {
                        // Closed before the guest could read a byte.
                        view.table.delete(opened)?;
                        secrets.record_quoting(|q| {
                            format!(
                                "file {} refused to the guest (`access`): {why}. Keep secrets out of granted \
                                 directories, or the file out of the grant",
                                q(&shown(&guest))
                            )
                        });
                        Ok((Err(ErrorCode::Access),))
                    }
                }
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.readlink-at",
        |mut store, (fd, path): (Resource<fs::Descriptor>, String)| {
            Box::new(async move {
                let (mut view, held) = store.data_mut().filesystem_and_held();
                let guest = match (&held.secrets, view.table.get(&fd)) {
                    (Some(_), Ok(Descriptor::Dir(d))) => held.secrets.as_ref().map(|s| s.guest_path(&d.dir, &path)),
                    _ => None,
                };
                let target = match HostDescriptor::readlink_at(&mut view, fd, path).await {
                    Ok(target) => target,
                    Err(e) => return Ok((Err(code(e)?),)),
                };
                let (Some(secrets), Some(guest)) = (held.secrets.clone(), guest) else { return Ok((Ok(target),)) };
                // A link's target is text the guest reads, like a name in a listing.
                let checked = tokio::task::spawn_blocking(move || {
                    let found = secrets.listing_scanner().find(target.as_bytes());
                    if let Some(f) = &found {
                        secrets.record_quoting(|q| {
                            format!(
                                "the target of link {} was refused to the guest (`access`): it held {}; keep \
                                 secrets out of granted directories",
                                q(&shown(&guest)),
                                named(f)
                            )
                        });
                    }
                    (found.is_none(), target)
                })
                .await;
                Ok((match checked {
                    Ok((true, target)) => Ok(target),
                    _ => Err(ErrorCode::Access),
                },))
            })
        },
    )?;
    types.resource("directory-entry-stream", ResourceType::host::<Listing>(), |mut store, rep| {
        let (view, _) = store.data_mut().filesystem_and_held();
        view.table.delete(Resource::<Listing>::new_own(rep))?;
        Ok(())
    })?;
    types.func_wrap_async("[method]descriptor.read-directory", |mut store, (fd,): (Resource<fs::Descriptor>,)| {
        Box::new(async move {
            let (view, held) = store.data_mut().filesystem_and_held();
            // A handle that is not in the table traps, as in wasmtime-wasi.
            let dir = match view.table.get(&fd)? {
                Descriptor::Dir(d) => d.dir.clone(),
                Descriptor::File(_) => return Ok((Err(ErrorCode::NotDirectory),)),
            };
            if !held.admit_file() {
                return Ok((Err(PAST_A_LIMIT),));
            }
            let listing = match Listing::open(dir, held.secrets.clone()).await {
                Ok(listing) => listing,
                Err(code) => return Ok((Err(code),)),
            };
            held.hold_file(Arc::downgrade(&listing.open) as OpenFile);
            Ok((Ok(view.table.push(listing)?),))
        })
    })?;
    types.func_wrap_async(
        "[method]directory-entry-stream.read-directory-entry",
        |mut store, (listing,): (Resource<Listing>,)| {
            Box::new(async move {
                let (view, _) = store.data_mut().filesystem_and_held();
                let listing = view.table.get_mut(&listing)?;
                Ok((listing.next().await,))
            })
        },
    )?;
    types.func_wrap(
        "[method]descriptor.read-via-stream",
        |mut store, (fd, offset): (Resource<fs::Descriptor>, u64)| {
            stream(&mut store, |view| HostDescriptor::read_via_stream(view, fd, offset))
        },
    )?;
    types.func_wrap(
        "[method]descriptor.write-via-stream",
        |mut store, (fd, offset): (Resource<fs::Descriptor>, u64)| {
            // A stream that starts past the end grows the file by the gap.
            let gap = {
                let (view, _) = store.data_mut().filesystem_and_held();
                offset.saturating_sub(file_size(&view, &fd))
            };
            write_stream(&mut store, gap, |view| HostDescriptor::write_via_stream(view, fd, offset))
        },
    )?;
    types.func_wrap("[method]descriptor.append-via-stream", |mut store, (fd,): (Resource<fs::Descriptor>,)| {
        write_stream(&mut store, 0, |view| HostDescriptor::append_via_stream(view, fd))
    })?;
    types.func_wrap_async(
        "[method]descriptor.set-size",
        |mut store, (fd, size): (Resource<fs::Descriptor>, u64)| {
            Box::new(async move {
                let (mut view, held) = store.data_mut().filesystem_and_held();
                // Growing counts as writing (zeroes, where the filesystem
                // cannot leave a hole); shrinking gives nothing back.
                let growth = size.saturating_sub(file_size(&view, &fd));
                let disk = (growth > 0).then(|| held.disk());
                if let Some(disk) = &disk
                    && !disk.take(growth)
                {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                match HostDescriptor::set_size(&mut view, fd, size).await {
                    Ok(()) => Ok((Ok(()),)),
                    Err(e) => {
                        if let Some(disk) = &disk {
                            disk.give_back(growth);
                        }
                        Ok((Err(code(e)?),))
                    }
                }
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.write",
        |mut store, (fd, buf, offset): (Resource<fs::Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                let (mut view, held) = store.data_mut().filesystem_and_held();
                let disk = held.disk();
                // What it writes, or what the file grows by if more: a
                // write far past the end makes a file of that size (filled
                // with zeroes where the filesystem cannot leave a hole).
                let size = file_size(&view, &fd);
                let charge = |n: u64| n.max(offset.saturating_add(n).saturating_sub(size));
                let asked = charge(buf.len() as u64);
                if !disk.take(asked) {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                match HostDescriptor::write(&mut view, fd, buf, offset).await {
                    Ok(written) => {
                        disk.give_back(asked.saturating_sub(charge(written)));
                        Ok((Ok(written),))
                    }
                    Err(e) => {
                        disk.give_back(asked);
                        Ok((Err(code(e)?),))
                    }
                }
            })
        },
    )?;
    // Each makes a name: counted against `limits.files_created`.
    types.func_wrap_async(
        "[method]descriptor.create-directory-at",
        |mut store, (fd, path): (Resource<fs::Descriptor>, String)| {
            Box::new(async move {
                let (mut view, held) = store.data_mut().filesystem_and_held();
                if !held.may_create() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                created(held, HostDescriptor::create_directory_at(&mut view, fd, path).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store, (fd, target, path): (Resource<fs::Descriptor>, String, String)| {
            Box::new(async move {
                let (mut view, held) = store.data_mut().filesystem_and_held();
                if !held.may_create() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                created(held, HostDescriptor::symlink_at(&mut view, fd, target, path).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store,
         (fd, flags, old, new_fd, new): (
            Resource<fs::Descriptor>,
            PathFlags,
            String,
            Resource<fs::Descriptor>,
            String,
        )| {
            Box::new(async move {
                let (mut view, held) = store.data_mut().filesystem_and_held();
                if !held.may_create() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                created(held, HostDescriptor::link_at(&mut view, fd, flags, old, new_fd, new).await)
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The size of the file `fd` names now (0 if it is not a file or cannot be
/// read: then all growth counts).
fn file_size(view: &WasiFilesystemCtxView<'_>, fd: &Resource<fs::Descriptor>) -> u64 {
    match view.table.get(fd) {
        Ok(Descriptor::File(f)) => f.file.metadata().map(|m| m.len()).unwrap_or(0),
        _ => 0,
    }
}

/// The result of an operation that makes a name, counted when it did.
fn created(held: &mut Held, r: Result<(), FsError>) -> wasmtime::Result<(Result<(), ErrorCode>,)> {
    match r {
        Ok(()) => {
            held.created_one();
            Ok((Ok(()),))
        }
        Err(e) => Ok((Err(code(e)?),)),
    }
}

/// A write or append stream of wasmtime-wasi's, made by `open` if the call
/// may hold one more stream, its bytes taken from the call's [`DiskBudget`].
fn write_stream<S: FilesystemCall>(
    store: &mut wasmtime::StoreContextMut<'_, S>,
    gap: u64,
    open: impl FnOnce(&mut WasiFilesystemCtxView<'_>) -> Result<Resource<DynOutputStream>, FsError>,
) -> wasmtime::Result<(Result<Resource<DynOutputStream>, ErrorCode>,)> {
    let budget = store.data_mut().filesystem_and_held().1.disk();
    if !budget.take(gap) {
        return Ok((Err(ErrorCode::InsufficientSpace),));
    }
    let made = stream(store, open)?;
    if made.0.is_err() {
        budget.give_back(gap);
    }
    if let (Ok(stream),) = &made {
        let (view, _) = store.data_mut().filesystem_and_held();
        // Wrapped in place: the guest's handle stays the one it was given.
        let slot = view.table.get_mut(stream)?;
        let inner = std::mem::replace(slot, Box::new(wasmtime_wasi::p2::pipe::SinkOutputStream));
        *slot = Box::new(Budgeted { inner, budget });
    }
    Ok(made)
}

/// One of wasmtime-wasi's file streams, made by `open` if the call may hold one more.
fn stream<S: FilesystemCall, T: 'static>(
    store: &mut wasmtime::StoreContextMut<'_, S>,
    open: impl FnOnce(&mut WasiFilesystemCtxView<'_>) -> Result<Resource<T>, FsError>,
) -> wasmtime::Result<(Result<Resource<T>, ErrorCode>,)> {
    let (mut view, held) = store.data_mut().filesystem_and_held();
    if !held.admit_stream(view.table) {
        return Ok((Err(PAST_A_LIMIT),));
    }
    match open(&mut view) {
        Ok(stream) => {
            held.hold_stream(stream.rep());
            Ok((Ok(stream),))
        }
        Err(e) => Ok((Err(code(e)?),)),
    }
}

/// Warn when the calls allowed at once could, each holding its
/// `limits.open_files`, open more files than this process may (then the
/// journal, outbound connections and other calls would fail to open theirs).
/// A warning, not a refusal: the limit is the process's, which an embedder
/// may raise after the host starts; the `toolgate` binary raises it first.
pub(super) fn check_open_file_limit(limits: &Limits) {
    #[cfg(unix)]
    {
        let Some(soft) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current else { return };
        // The host's own descriptors: journal, listeners, a margin, and one per outbound request.
        let need = limits
            .max_instances
            .saturating_mul(limits.open_files)
            .saturating_add(limits.http_requests_in_flight_host)
            .saturating_add(256);
        if soft < need {
            tracing::warn!(
                "this process may open {soft} files, but `limits.max_instances` ({}) calls each holding \
                 `limits.open_files` ({}) with the host's own need up to {need}; raise the process's limit \
                 (`ulimit -n`) or lower those limits",
                limits.max_instances,
                limits.open_files,
            );
        }
    }
}

/// How the guest asked `open-at` to open a path, as wasmtime-wasi 48's own
/// `open-at` reads the guest's flags (the same checks, in its order, with
/// its error codes), plus what keeps the open from blocking: `O_NONBLOCK`
/// (a FIFO opens at once instead of waiting for the other end) and
/// `O_NOCTTY` (a terminal is never made the host's controlling one).
struct How {
    options: cap_std::fs::OpenOptions,
    follow: bool,
    dir_required: bool,
    /// What wasmtime-wasi records on the descriptor it makes.
    mode: OpenMode,
}

impl How {
    fn new(
        path_flags: PathFlags,
        oflags: OpenFlags,
        flags: DescriptorFlags,
        perms: wasmtime_wasi::FsPerms,
    ) -> Result<Self, ErrorCode> {
        use cap_std::fs::OpenOptionsExt as _;
        use rustix::fs::OFlags;
        let mut options = cap_std::fs::OpenOptions::new();
        let mut mode = OpenMode::empty();
        let create = oflags.contains(OpenFlags::CREATE);
        if create {
            if oflags.contains(OpenFlags::EXCLUSIVE) {
                options.create_new(true);
            } else {
                options.create(true);
            }
            options.write(true);
            mode |= OpenMode::WRITE;
        }
        if oflags.contains(OpenFlags::TRUNCATE) {
            options.truncate(true).write(true);
            mode |= OpenMode::WRITE;
        }
        if flags.contains(DescriptorFlags::READ) {
            options.read(true);
            mode |= OpenMode::READ;
        }
        if flags.contains(DescriptorFlags::WRITE) {
            options.write(true);
            mode |= OpenMode::WRITE;
        } else {
            // Opened for reading, as wasmtime-wasi does: its permissions
            // refuse what the guest may not do with it.
            options.read(true);
            mode |= OpenMode::READ;
        }
        if flags.contains(DescriptorFlags::FILE_INTEGRITY_SYNC)
            || flags.contains(DescriptorFlags::DATA_INTEGRITY_SYNC)
            || flags.contains(DescriptorFlags::REQUESTED_WRITE_SYNC)
        {
            return Err(ErrorCode::Unsupported);
        }
        let dir_required = oflags.contains(OpenFlags::DIRECTORY);
        if dir_required && (create || oflags.contains(OpenFlags::EXCLUSIVE) || oflags.contains(OpenFlags::TRUNCATE)) {
            return Err(ErrorCode::Invalid);
        }
        if perms.write_not_permitted() && mode.contains(OpenMode::WRITE) {
            return Err(ErrorCode::NotPermitted);
        }
        let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
        // Not following a link in the last component: `O_NOFOLLOW`, which
        // openat2 (Linux 5.6+, what cap-std uses) honours exactly. cap-std's
        // own setting for it is not public; where cap-std falls back to
        // resolving the path itself it follows such a link (still inside
        // the grant, as the guest could ask it to anyway).
        let mut custom = OFlags::NONBLOCK | OFlags::NOCTTY;
        if !follow {
            custom |= OFlags::NOFOLLOW;
        }
        options.custom_flags(custom.bits() as i32);
        Ok(How { options, follow, dir_required, mode })
    }
}

/// What `open-at` opened: a directory or a regular file, never anything else.
#[derive(Debug)]
enum Opened {
    Dir(std::fs::File),
    File(std::fs::File),
}

/// Why `open-at` opened nothing.
#[derive(Debug)]
enum Refused {
    /// A special file (what kind): `access` to the guest.
    Special(&'static str),
    Code(ErrorCode),
}

impl From<std::io::Error> for Refused {
    fn from(e: std::io::Error) -> Self {
        Refused::Code(ErrorCode::from(e))
    }
}

/// Open `path` under `dir` as `how` says. A special file already there is
/// refused without being opened; the decision is then made on the
/// descriptor opened ([`open_beneath`]), so a file swapped for a FIFO
/// between the two is refused too, and never waited on.
fn open_checked(dir: &std::fs::File, path: &str, how: &How) -> Result<Opened, Refused> {
    let dir = cap_std::fs::Dir::from_std_file(dir.try_clone()?);
    if let Some(kind) = special_file(&dir, path, how.follow) {
        return Err(Refused::Special(kind));
    }
    open_beneath(&dir, path, how)
}

/// Open `path` under `dir` (cap-std: the path never leads out of it) as
/// `how` says, without blocking (`O_NONBLOCK`), and decide on the descriptor
/// opened: a directory or a regular file is returned, blocking again
/// (`O_NONBLOCK` cleared, as wasmtime-wasi's streams expect); anything else
/// is closed and refused.
fn open_beneath(dir: &cap_std::fs::Dir, path: &str, how: &How) -> Result<Opened, Refused> {
    let file = match dir.open_with(path, &how.options) {
        Ok(file) => file.into_std(),
        // What a non-blocking open of a FIFO for writing with no reader, a
        // socket, or a device without its driver fails with.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
            return Err(Refused::Special("a FIFO, socket or device"));
        }
        Err(e) => return Err(e.into()),
    };
    let kind = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&file).map_err(std::io::Error::from)?.st_mode);
    let opened = match kind {
        rustix::fs::FileType::Directory => Opened::Dir(file),
        rustix::fs::FileType::RegularFile if how.dir_required => return Err(Refused::Code(ErrorCode::NotDirectory)),
        rustix::fs::FileType::RegularFile => Opened::File(file),
        other => return Err(Refused::Special(special(other))),
    };
    let (Opened::Dir(f) | Opened::File(f)) = &opened;
    let flags = rustix::fs::fcntl_getfl(f).map_err(std::io::Error::from)?;
    rustix::fs::fcntl_setfl(f, flags - rustix::fs::OFlags::NONBLOCK).map_err(std::io::Error::from)?;
    Ok(opened)
}

/// What a file of type `t` that is neither a directory nor a regular file is,
/// in the refusal's words.
fn special(t: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType as T;
    match t {
        T::Fifo => "a FIFO",
        T::Socket => "a socket",
        T::CharacterDevice | T::BlockDevice => "a device",
        // A symlink (`O_PATH` is never asked for, so none is opened) or a type unknown here.
        _ => "a special file",
    }
}

/// What kind of special file `path` under `dir` is, if it is one, by a stat
/// through the same sandboxed directory handle (cap-std: no escape): a
/// special file already there is never opened. It decides nothing else —
/// the path may name something else by the open ([`open_beneath`] decides
/// on the descriptor).
fn special_file(dir: &cap_std::fs::Dir, path: &str, follow: bool) -> Option<&'static str> {
    use cap_std::fs::MetadataExt as _;
    let meta = if follow { dir.metadata(path) } else { dir.symlink_metadata(path) }.ok()?;
    match rustix::fs::FileType::from_raw_mode(meta.mode()) {
        rustix::fs::FileType::Directory | rustix::fs::FileType::RegularFile | rustix::fs::FileType::Symlink => None,
        other => Some(special(other)),
    }
}

/// The file behind a descriptor opened for writing only, opened again for
/// reading so the host can check it (`/proc/self/fd`: the same file, not
/// the path). An empty file needs no check; one the host cannot read is refused.
fn readable(file: &std::fs::File) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd as _;
    match std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(f) => Ok(f),
        Err(_) if file.metadata().is_ok_and(|m| m.len() == 0) => {
            // Nothing in it to check: the check of an empty file passes.
            file.try_clone().map_err(|e| format!("the host could not check it ({e})"))
        }
        Err(e) => {
            Err(format!("it was opened for writing only and the host cannot read it to check it for secrets ({e})"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime_wasi::p2::pipe::{ClosedInputStream, ClosedOutputStream};

    fn limits(n: u64) -> Limits {
        Limits { open_files: n, file_streams: n, ..Limits::default() }
    }

    /// Open one more stream the way the shadowed imports do, if admitted.
    fn open(table: &mut ResourceTable, held: &mut Held, input: bool) -> Option<u32> {
        if !held.admit_stream(table) {
            return None;
        }
        let rep = if input {
            table.push(Box::new(ClosedInputStream) as DynInputStream).ok()?.rep()
        } else {
            table.push(Box::new(ClosedOutputStream) as DynOutputStream).ok()?.rep()
        };
        held.hold_stream(rep);
        Some(rep)
    }

    #[test]
    fn streams_are_counted_live_not_cumulatively() {
        let mut table = ResourceTable::new();
        let mut held = Held::new(&limits(2), None);
        let a = open(&mut table, &mut held, true).unwrap();
        open(&mut table, &mut held, false).unwrap();
        assert_eq!(open(&mut table, &mut held, true), None, "a third held at once is refused");
        // The guest drops one: one more may be opened, and its reused number is held once.
        table.delete(Resource::<DynInputStream>::new_own(a)).unwrap();
        let c = open(&mut table, &mut held, true).unwrap();
        assert_eq!(c, a, "the table reuses the number");
        assert_eq!(held.streams.held.len(), 2);
        assert_eq!(open(&mut table, &mut held, false), None);
        // A thousand opened and dropped one after another: never refused.
        table.delete(Resource::<DynInputStream>::new_own(c)).unwrap();
        for _ in 0..1000 {
            let r = open(&mut table, &mut held, true).expect("one at a time is always admitted");
            table.delete(Resource::<DynInputStream>::new_own(r)).unwrap();
        }
    }

    #[test]
    fn a_number_reused_by_another_kind_is_not_counted() {
        let mut table = ResourceTable::new();
        let mut held = Held::new(&limits(1), None);
        let a = open(&mut table, &mut held, true).unwrap();
        table.delete(Resource::<DynInputStream>::new_own(a)).unwrap();
        // The number now holds something that is not a stream (an HTTP field set, say).
        let other = table.push(0u8).unwrap();
        assert_eq!(other.rep(), a);
        assert!(open(&mut table, &mut held, true).is_some());
    }

    #[test]
    fn a_file_counts_while_anything_keeps_its_descriptor_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut held = Held::new(&limits(2), None);
        let file = || Arc::new(std::fs::File::open(dir.path()).unwrap());
        let (a, b) = (file(), file());
        held.hold_file(Arc::downgrade(&a) as OpenFile);
        held.hold_file(Arc::downgrade(&b) as OpenFile);
        assert!(!held.admit_file(), "two open: a third is refused");
        // The guest drops its descriptor, but a stream made from it shares the file.
        let streams_copy = a.clone();
        drop(a);
        assert!(!held.admit_file(), "still open through the stream");
        drop(streams_copy);
        assert!(held.admit_file(), "closed: its place is free");
        assert_eq!(held.files.held.len(), 1);
    }

    #[tokio::test]
    async fn a_listing_holds_at_most_a_batch_of_names_and_yields_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let n = BATCH * 3 + 5;
        for i in 0..n {
            std::fs::write(dir.path().join(format!("f{i}")), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("f0", dir.path().join("link")).unwrap();
        let fifo = dir.path().join("pipe");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, rustix::fs::Mode::RUSR, 0).unwrap();
        let mut listing = Listing::open(Arc::new(std::fs::File::open(dir.path()).unwrap()), None).await.unwrap();
        assert_eq!(listing.buffered(), 0, "nothing is read before the guest asks");
        let mut names = std::collections::BTreeMap::new();
        while let Some(e) = listing.next().await.unwrap() {
            assert!(listing.buffered() < BATCH, "{} names held", listing.buffered());
            names.insert(e.name, e.type_);
        }
        assert_eq!(names.len(), n + 3, "every name once, without `.` and `..`");
        assert!(matches!(names["sub"], fs::DescriptorType::Directory));
        assert!(matches!(names["f0"], fs::DescriptorType::RegularFile));
        assert!(matches!(names["link"], fs::DescriptorType::SymbolicLink), "a link is not followed");
        assert!(matches!(names["pipe"], fs::DescriptorType::Unknown), "as wasmtime-wasi's stat says");
        assert!(listing.next().await.unwrap().is_none(), "and the end stays the end");
        assert!(listing.dir.is_none(), "its descriptor is closed at the end");
    }

    /// Runs `f` on a thread of its own, failing (not hanging) if it blocks.
    fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the open blocked")
    }

    fn how(follow: bool, oflags: OpenFlags, flags: DescriptorFlags) -> How {
        let path = if follow { PathFlags::SYMLINK_FOLLOW } else { PathFlags::empty() };
        How::new(path, oflags, flags, wasmtime_wasi::FsPerms::ReadWrite).unwrap()
    }

    fn grant() -> (tempfile::TempDir, Arc<cap_std::fs::Dir>) {
        let dir = tempfile::tempdir().unwrap();
        let cap = cap_std::fs::Dir::from_std_file(std::fs::File::open(dir.path()).unwrap());
        (dir, Arc::new(cap))
    }

    fn mkfifo(path: &std::path::Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
    }

    /// The race a Tool can run (a FIFO renamed over a file between the stat
    /// and the open), made deterministic: the open is given the FIFO with no
    /// stat before it. Whatever the guest asked for, it is refused on the
    /// descriptor, at once; with a blocking open (wasmtime-wasi's) the
    /// reading ones wait for a writer forever.
    #[test]
    fn a_fifo_at_the_open_is_refused_on_the_descriptor_without_blocking() {
        let (tmp, dir) = grant();
        mkfifo(&tmp.path().join("pipe"));
        std::os::unix::fs::symlink("pipe", tmp.path().join("link")).unwrap();
        let (r, w) = (DescriptorFlags::READ, DescriptorFlags::WRITE);
        let asked = [
            ("pipe", false, OpenFlags::empty(), r),
            ("pipe", true, OpenFlags::empty(), r),
            ("pipe", false, OpenFlags::empty(), w),
            ("pipe", false, OpenFlags::empty(), r | w),
            ("pipe", false, OpenFlags::CREATE, r),
            ("pipe", false, OpenFlags::CREATE | OpenFlags::TRUNCATE, w),
            ("pipe", false, OpenFlags::DIRECTORY, r),
            ("link", true, OpenFlags::empty(), r),
        ];
        for (path, follow, oflags, flags) in asked {
            let (dir, h) = (dir.clone(), how(follow, oflags, flags));
            let got = promptly(move || open_beneath(&dir, path, &h));
            assert!(matches!(got, Err(Refused::Special(_))), "{path} {oflags:?} {flags:?}: {got:?}");
        }
        // Not following the link: the link itself, never the FIFO.
        let (d, h) = (dir.clone(), how(false, OpenFlags::empty(), r));
        assert!(matches!(promptly(move || open_beneath(&d, "link", &h)), Err(Refused::Code(ErrorCode::Loop))));
        // With the stat before it (the FIFO there all along), not even opened.
        let std_dir = std::fs::File::open(tmp.path()).unwrap();
        let h = how(true, OpenFlags::empty(), r);
        assert!(matches!(promptly(move || open_checked(&std_dir, "pipe", &h)), Err(Refused::Special("a FIFO"))));
    }

    #[test]
    fn a_file_or_directory_opens_blocking_again_as_wasmtime_wasi_would() {
        let (tmp, dir) = grant();
        std::fs::write(tmp.path().join("f"), "x").unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::os::unix::fs::symlink("f", tmp.path().join("link")).unwrap();
        let (r, w) = (DescriptorFlags::READ, DescriptorFlags::WRITE);
        let nonblocking =
            |f: &std::fs::File| rustix::fs::fcntl_getfl(f).unwrap().contains(rustix::fs::OFlags::NONBLOCK);
        match open_beneath(&dir, "f", &how(false, OpenFlags::empty(), r | w)) {
            Ok(Opened::File(f)) => {
                assert!(!nonblocking(&f));
                assert_eq!(rustix::fs::fcntl_getfl(&f).unwrap() & rustix::fs::OFlags::RWMODE, rustix::fs::OFlags::RDWR);
            }
            other => panic!("{other:?}"),
        }
        match open_beneath(&dir, "d", &how(false, OpenFlags::DIRECTORY, r)) {
            Ok(Opened::Dir(d)) => assert!(!nonblocking(&d)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(open_beneath(&dir, "link", &how(true, OpenFlags::empty(), r)), Ok(Opened::File(_))));
        assert!(matches!(
            open_beneath(&dir, "f", &how(false, OpenFlags::DIRECTORY, r)),
            Err(Refused::Code(ErrorCode::NotDirectory))
        ));
        assert!(matches!(
            open_beneath(&dir, "d", &how(false, OpenFlags::empty(), w)),
            Err(Refused::Code(ErrorCode::IsDirectory))
        ));
        assert!(open_beneath(&dir, "../x", &how(false, OpenFlags::CREATE, w)).is_err(), "never out of the grant");
        assert!(!tmp.path().parent().unwrap().join("x").exists());
        // Created as wasmtime-wasi creates (mode 0666 less the umask), and the guest's checks as its.
        assert!(matches!(open_beneath(&dir, "new", &how(false, OpenFlags::CREATE, w)), Ok(Opened::File(_))));
        assert!(matches!(
            open_beneath(&dir, "new", &how(false, OpenFlags::CREATE | OpenFlags::EXCLUSIVE, w)),
            Err(Refused::Code(ErrorCode::Exist))
        ));
        let ro = |oflags, flags| How::new(PathFlags::empty(), oflags, flags, wasmtime_wasi::FsPerms::ReadOnly).err();
        assert!(matches!(ro(OpenFlags::empty(), w), Some(ErrorCode::NotPermitted)));
        assert!(matches!(ro(OpenFlags::CREATE, r), Some(ErrorCode::NotPermitted)));
        assert!(ro(OpenFlags::empty(), r).is_none());
        assert!(matches!(
            How::new(
                PathFlags::empty(),
                OpenFlags::DIRECTORY | OpenFlags::TRUNCATE,
                w,
                wasmtime_wasi::FsPerms::ReadWrite
            )
            .err(),
            Some(ErrorCode::Invalid)
        ));
    }

    #[test]
    fn each_limit_met_is_recorded_once_with_its_setting() {
        let mut table = ResourceTable::new();
        let mut held = Held::new(&limits(1), None);
        open(&mut table, &mut held, true).unwrap();
        assert_eq!(open(&mut table, &mut held, true), None);
        assert_eq!(open(&mut table, &mut held, false), None);
        let records: Vec<String> = held.records().collect();
        assert_eq!(records.len(), 1, "{records:?}");
        assert!(
            records[0].starts_with("2 opens were refused")
                && records[0].contains("1 file streams at once, its `limits.file_streams`"),
            "{records:?}"
        );
    }
}
