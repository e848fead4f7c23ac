//! The guest's `wasi:filesystem`, checked in front of wasmtime-wasi's own.
//!
//! Owns two checks: a FIFO, socket or device inside a grant is never opened
//! (opening one can block a host thread past any deadline), and what one
//! call holds open in the host is counted *live* against the call's limits:
//! files, directories and directory listings (each a descriptor of the host
//! process) against `limits.open_files`, file streams (each may hold a read
//! buffer of up to 64 KiB) against `limits.file_streams` — host resources
//! outside the guest's memory limit. A guest past a limit gets an error code,
//! as it would from a full descriptor table, and the host records which
//! limit it met.
//!
//! A directory listing is read as the guest asks for it, [`BATCH`] names at
//! a time ([`Listing`]): wasmtime-wasi's own reads the whole directory into
//! host memory at `read-directory`, which a Tool that filled a read-write
//! grant with millions of names could repeat for every listing it holds.
//!
//! It must never widen what wasmtime-wasi allows: every operation it lets
//! through is wasmtime-wasi's own, on the same sandboxed handles.

use std::collections::VecDeque;

use wasmtime::component::{Linker, Resource, ResourceTable, ResourceType};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self as fs, DescriptorFlags, ErrorCode, HostDescriptor, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, FsError};

use crate::config::Limits;

/// A call's state, as these checks need it.
pub(super) trait FilesystemCall: Send + 'static {
    /// The call's filesystem view and what the call holds open.
    fn filesystem_and_held(&mut self) -> (WasiFilesystemCtxView<'_>, &mut Held);
}

/// The kinds of host resource a call's filesystem use holds, each with its limit.
#[derive(Clone, Copy)]
enum Kind {
    /// Files, directories and listings: descriptors of the host process.
    Files,
    /// File streams: host read buffers.
    Streams,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::Files, Kind::Streams];

    /// The setting that bounds it, and what it counts (for the host's record).
    fn setting(self) -> (&'static str, &'static str) {
        match self {
            Kind::Files => ("limits.open_files", "files, directories and listings open"),
            Kind::Streams => ("limits.file_streams", "file streams"),
        }
    }

    /// Whether `rep` still names a live resource of this kind in `table`.
    /// (A handle number is reused after its resource is dropped; one reused
    /// by another kind is not this kind's any more.)
    fn live(self, table: &ResourceTable, rep: u32) -> bool {
        match self {
            Kind::Files => {
                table.get(&Resource::<Descriptor>::new_borrow(rep)).is_ok()
                    || table.get(&Resource::<Listing>::new_borrow(rep)).is_ok()
            }
            Kind::Streams => {
                table.get(&Resource::<DynInputStream>::new_borrow(rep)).is_ok()
                    || table.get(&Resource::<DynOutputStream>::new_borrow(rep)).is_ok()
            }
        }
    }
}

/// What one call holds open through its filesystem, counted live: the
/// handles it was given, pruned of those it dropped only when a kind reaches
/// its limit (so the common call, far below every limit, pays one push per
/// open). A handle number reused by a resource of the same kind that did not
/// come through here (a preopen, an HTTP body stream) still counts until it
/// is dropped: the count can only err towards the guest's own handles.
#[derive(Debug)]
pub(super) struct Held {
    kinds: [Counted; 2],
}

#[derive(Debug, Default)]
struct Counted {
    limit: usize,
    reps: Vec<u32>,
    refused: u64,
}

impl Held {
    /// Nothing held; the limits of `limits`.
    pub(super) fn new(limits: &Limits) -> Self {
        let at = |n: u64| Counted { limit: usize::try_from(n).unwrap_or(usize::MAX), ..Counted::default() };
        Held { kinds: [at(limits.open_files), at(limits.file_streams)] }
    }

    /// Whether the call may hold one more of `kind`.
    fn admit(&mut self, kind: Kind, table: &ResourceTable) -> bool {
        let c = &mut self.kinds[kind as usize];
        if c.reps.len() >= c.limit {
            c.reps.retain(|&rep| kind.live(table, rep));
        }
        if c.reps.len() >= c.limit {
            c.refused += 1;
            return false;
        }
        true
    }

    /// The call now holds `rep` of `kind`.
    fn hold(&mut self, kind: Kind, rep: u32) {
        let reps = &mut self.kinds[kind as usize].reps;
        // A number freed and given out again is held once.
        if !reps.contains(&rep) {
            reps.push(rep);
        }
    }

    /// The host's records of the call's refusals: one line per limit met.
    pub(super) fn records(&self) -> impl Iterator<Item = String> + '_ {
        Kind::ALL.into_iter().filter_map(|kind| {
            let c = &self.kinds[kind as usize];
            let (setting, what) = kind.setting();
            (c.refused > 0).then(|| {
                format!(
                    "{} refused: the call held {} {what} at once, its `{setting}`; raise it in [limits] if the Tool needs more",
                    plural(c.refused, "open was", "opens were"),
                    c.limit,
                )
            })
        })
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 { format!("1 {one}") } else { format!("{n} {many}") }
}

/// A guest past a limit gets the error a full descriptor table would give
/// it, as near as `wasi:filesystem` says it (it has no "too many open files").
const PAST_A_LIMIT: ErrorCode = ErrorCode::InsufficientMemory;

fn code(e: FsError) -> wasmtime::Result<ErrorCode> {
    e.downcast()
}

/// Names a listing reads from the directory at once, on the blocking pool.
pub(super) const BATCH: usize = 64;

/// A directory listing (`wasi:filesystem` `directory-entry-stream`): an
/// open iteration of the directory, read [`BATCH`] names at a time as the
/// guest asks, so the host holds at most a batch of names per listing.
pub(super) struct Listing {
    /// `None` once the directory is read to its end (or failed).
    entries: Option<cap_std::fs::ReadDir>,
    batch: VecDeque<Result<fs::DirectoryEntry, ErrorCode>>,
}

impl Listing {
    /// A listing of `dir` (its own descriptor: the guest's may be dropped first).
    fn open(dir: &std::fs::File) -> Result<Self, ErrorCode> {
        let entries =
            dir.try_clone().and_then(|d| cap_std::fs::Dir::from_std_file(d).entries()).map_err(ErrorCode::from)?;
        Ok(Listing { entries: Some(entries), batch: VecDeque::new() })
    }

    /// The next entry; `None` at the end.
    async fn next(&mut self) -> Result<Option<fs::DirectoryEntry>, ErrorCode> {
        if self.batch.is_empty()
            && let Some(entries) = self.entries.take()
        {
            let (entries, batch) =
                tokio::task::spawn_blocking(move || read_batch(entries)).await.map_err(|_| ErrorCode::Io)?;
            self.entries = entries;
            self.batch = batch;
        }
        self.batch.pop_front().transpose()
    }

    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.batch.len()
    }
}

type Batch = VecDeque<Result<fs::DirectoryEntry, ErrorCode>>;

/// Up to [`BATCH`] entries of `entries`, and the iteration if it goes on.
/// A name that is not UTF-8 is `illegal-byte-sequence`, as wasmtime-wasi
/// reports it; an error reading the directory ends the listing.
fn read_batch(mut entries: cap_std::fs::ReadDir) -> (Option<cap_std::fs::ReadDir>, Batch) {
    let mut batch = VecDeque::with_capacity(BATCH);
    while batch.len() < BATCH {
        let Some(entry) = entries.next() else { return (None, batch) };
        match entry.and_then(|e| Ok((e.file_type()?, e.file_name()))) {
            Ok((kind, name)) => batch.push_back(match name.into_string() {
                Ok(name) => Ok(fs::DirectoryEntry { type_: descriptor_type(kind), name }),
                Err(_) => Err(ErrorCode::IllegalByteSequence),
            }),
            Err(e) => {
                batch.push_back(Err(ErrorCode::from(e)));
                return (None, batch);
            }
        }
    }
    (Some(entries), batch)
}

fn descriptor_type(t: cap_std::fs::FileType) -> fs::DescriptorType {
    #[cfg(unix)]
    {
        use cap_std::fs::FileTypeExt;
        if t.is_fifo() {
            return fs::DescriptorType::Fifo;
        }
        if t.is_socket() {
            return fs::DescriptorType::Socket;
        }
        if t.is_char_device() {
            return fs::DescriptorType::CharacterDevice;
        }
        if t.is_block_device() {
            return fs::DescriptorType::BlockDevice;
        }
    }
    if t.is_dir() {
        fs::DescriptorType::Directory
    } else if t.is_file() {
        fs::DescriptorType::RegularFile
    } else if t.is_symlink() {
        fs::DescriptorType::SymbolicLink
    } else {
        fs::DescriptorType::Unknown
    }
}

/// Put the checks in front of wasmtime-wasi's `open-at` and three file
/// streams in `linker` (which already holds wasmtime-wasi), and replace its
/// directory listings with [`Listing`].
pub(super) fn add_to_linker<S: FilesystemCall>(linker: &mut Linker<S>) -> wasmtime::Result<()> {
    type OpenArgs = (Resource<fs::Descriptor>, PathFlags, String, OpenFlags, DescriptorFlags);
    linker.allow_shadowing(true);
    let mut types = linker.instance("wasi:filesystem/types@0.2.12")?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store, (fd, path_flags, path, oflags, flags): OpenArgs| {
            Box::new(async move {
                let (mut view, held) = store.data_mut().filesystem_and_held();
                let special = match view.table.get(&fd) {
                    Ok(Descriptor::Dir(dir)) => {
                        special_file(&dir.dir, &path, path_flags.contains(PathFlags::SYMLINK_FOLLOW))
                    }
                    _ => None,
                };
                if let Some(kind) = special {
                    tracing::debug!("refused to open {kind} `{path}` inside a grant");
                    return Ok((Err(ErrorCode::Access),));
                }
                if !held.admit(Kind::Files, view.table) {
                    return Ok((Err(PAST_A_LIMIT),));
                }
                match HostDescriptor::open_at(&mut view, fd, path_flags, path, oflags, flags).await {
                    Ok(opened) => {
                        held.hold(Kind::Files, opened.rep());
                        Ok((Ok(opened),))
                    }
                    Err(e) => Ok((Err(code(e)?),)),
                }
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
            let listing = match view.table.get(&fd)? {
                Descriptor::Dir(d) => {
                    // A listing holds a descriptor of its own: an open file.
                    if !held.admit(Kind::Files, view.table) {
                        return Ok((Err(PAST_A_LIMIT),));
                    }
                    match Listing::open(&d.dir) {
                        Ok(listing) => listing,
                        Err(code) => return Ok((Err(code),)),
                    }
                }
                Descriptor::File(_) => return Ok((Err(ErrorCode::NotDirectory),)),
            };
            let listing = view.table.push(listing)?;
            held.hold(Kind::Files, listing.rep());
            Ok((Ok(listing),))
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
            let (mut view, held) = store.data_mut().filesystem_and_held();
            if !held.admit(Kind::Streams, view.table) {
                return Ok((Err(PAST_A_LIMIT),));
            }
            match HostDescriptor::read_via_stream(&mut view, fd, offset) {
                Ok(stream) => {
                    held.hold(Kind::Streams, stream.rep());
                    Ok((Ok(stream),))
                }
                Err(e) => Ok((Err(code(e)?),)),
            }
        },
    )?;
    types.func_wrap(
        "[method]descriptor.write-via-stream",
        |mut store, (fd, offset): (Resource<fs::Descriptor>, u64)| {
            let (mut view, held) = store.data_mut().filesystem_and_held();
            if !held.admit(Kind::Streams, view.table) {
                return Ok((Err(PAST_A_LIMIT),));
            }
            match HostDescriptor::write_via_stream(&mut view, fd, offset) {
                Ok(stream) => {
                    held.hold(Kind::Streams, stream.rep());
                    Ok((Ok(stream),))
                }
                Err(e) => Ok((Err(code(e)?),)),
            }
        },
    )?;
    types.func_wrap("[method]descriptor.append-via-stream", |mut store, (fd,): (Resource<fs::Descriptor>,)| {
        let (mut view, held) = store.data_mut().filesystem_and_held();
        if !held.admit(Kind::Streams, view.table) {
            return Ok((Err(PAST_A_LIMIT),));
        }
        match HostDescriptor::append_via_stream(&mut view, fd) {
            Ok(stream) => {
                held.hold(Kind::Streams, stream.rep());
                Ok((Ok(stream),))
            }
            Err(e) => Ok((Err(code(e)?),)),
        }
    })?;
    linker.allow_shadowing(false);
    Ok(())
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

/// What kind of special file `path` under `dir` is, if it is one. The check
/// stats the path through the same sandboxed directory handle (cap-std: no
/// escape), without opening it. (A file swapped for a FIFO between this
/// check and the open is outside it; SECURITY.md lists it.)
fn special_file(dir: &std::fs::File, path: &str, follow: bool) -> Option<&'static str> {
    let dir = cap_std::fs::Dir::from_std_file(dir.try_clone().ok()?);
    let meta = if follow { dir.metadata(path) } else { dir.symlink_metadata(path) }.ok()?;
    #[cfg(unix)]
    {
        use cap_std::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_socket() {
            return Some("a socket");
        }
        if t.is_char_device() || t.is_block_device() {
            return Some("a device");
        }
    }
    let _ = meta;
    None
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
        if !held.admit(Kind::Streams, table) {
            return None;
        }
        let rep = if input {
            table.push(Box::new(ClosedInputStream) as DynInputStream).ok()?.rep()
        } else {
            table.push(Box::new(ClosedOutputStream) as DynOutputStream).ok()?.rep()
        };
        held.hold(Kind::Streams, rep);
        Some(rep)
    }

    #[test]
    fn streams_are_counted_live_not_cumulatively() {
        let mut table = ResourceTable::new();
        let mut held = Held::new(&limits(2));
        let a = open(&mut table, &mut held, true).unwrap();
        open(&mut table, &mut held, false).unwrap();
        assert_eq!(open(&mut table, &mut held, true), None, "a third held at once is refused");
        // The guest drops one: one more may be opened, and its reused number is held once.
        table.delete(Resource::<DynInputStream>::new_own(a)).unwrap();
        let c = open(&mut table, &mut held, true).unwrap();
        assert_eq!(c, a, "the table reuses the number");
        assert_eq!(held.kinds[Kind::Streams as usize].reps.len(), 2);
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
        let mut held = Held::new(&limits(1));
        let a = open(&mut table, &mut held, true).unwrap();
        table.delete(Resource::<DynInputStream>::new_own(a)).unwrap();
        // The number now holds something that is not a stream (an HTTP field set, say).
        let other = table.push(0u8).unwrap();
        assert_eq!(other.rep(), a);
        assert!(open(&mut table, &mut held, true).is_some());
    }

    #[tokio::test]
    async fn a_listing_holds_at_most_a_batch_of_names_and_yields_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let n = BATCH * 3 + 5;
        for i in 0..n {
            std::fs::write(dir.path().join(format!("f{i}")), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut listing = Listing::open(&std::fs::File::open(dir.path()).unwrap()).unwrap();
        assert_eq!(listing.buffered(), 0, "nothing is read before the guest asks");
        let mut names = std::collections::BTreeMap::new();
        while let Some(e) = listing.next().await.unwrap() {
            assert!(listing.buffered() < BATCH, "{} names held", listing.buffered());
            names.insert(e.name, e.type_);
        }
        assert_eq!(names.len(), n + 1, "every name once, without `.` and `..`");
        assert!(matches!(names["sub"], fs::DescriptorType::Directory));
        assert!(matches!(names["f0"], fs::DescriptorType::RegularFile));
        assert!(listing.next().await.unwrap().is_none(), "and the end stays the end");
    }

    #[test]
    fn each_limit_met_is_recorded_once_with_its_setting() {
        let mut table = ResourceTable::new();
        let mut held = Held::new(&limits(1));
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
