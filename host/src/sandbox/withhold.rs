//! Withhold: the secret of every configured credential kept out of what a
//! guest reads through its directory grants, and out of what a call hands
//! the model and the journal (DESIGN.md invariants 7 and 13).
//!
//! Owns the per-call check, [`CallSecrets`], that the filesystem layer and
//! the executor share. It watches what the outbound boundary watches (every
//! configured credential and each of the host's own secrets the config
//! names — `[[serve.auth]]` tokens, `serve.state_key`, `postgres.password`
//! ([`crate::config::Config::watched`]) —, each value the process has read
//! or sent: [`SecretWatch`]) with the same scanner and encodings as responses:
//!
//! - A regular file a guest opens with read access is checked before the
//!   guest can read a byte of it ([`CallSecrets::check_file`]), on the
//!   blocking pool, through the descriptor the guest will read (the inode
//!   it got, not the path). Up to [`WHOLE`] bytes it is read whole and
//!   checked as a response body is (gzip and zlib streams no header
//!   declared are inflated, within [`WHOLE_INFLATE`]); a larger one, up to
//!   `limits.file_check_mib`, is read in [`CHUNK`] pieces, each checked with
//!   the end of the one before it ([`overlap`]), so a secret across a
//!   boundary is found. A file over the limit, or that is not a regular
//!   file, is refused: the host cannot vouch for what it did not read. A
//!   call checks a file once per (device, inode, size, modification and
//!   change times) and the values it was checked for.
//! - Names in a directory listing are checked one by one
//!   ([`CallSecrets::listing_scanner`]); a name holding a secret is left out.
//! - What a call returns (content, Commands, error text) and captured
//!   (stdout, stderr, log, host records) is checked by the executor with
//!   [`CallSecrets::scanner`] before the Step commit; text the host cuts to a
//!   limit is checked with what follows the cut ([`find_in_kept`]), so a
//!   secret across the cut cannot leave its first bytes behind.
//!
//! While a configured credential has no value to look for (its source
//! unreadable and never read by the process: [`Watched::Unvouched`]), no
//! check can vouch for what it passes: every file with bytes is refused
//! (an empty one holds nothing: a Tool creating a file to write to gets
//! it), and the executor withholds the output of a call that received
//! anything unrefused from outside ([`CallSecrets::received`]), and the
//! guest's text in its host records.
//!
//! What it cannot catch (a file changed after its check, a secret split
//! across files or reads, compressed inside a large file) is in SECURITY.md,
//! "Known limits".
//!
//! Architecture invariant: nothing is built or read when the config names
//! no secret at all ([`CallSecrets::new`] is `None`); a refusal names the
//! credential, the form and the guest's path — never the secret.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::outbound::{HostRecords, Quote, Record, SecretWatch, Watched, check_compressed};
use super::scan::{Finding, SecretScanner};
use crate::authority::credentials::CredentialSpec;

/// Files up to this size are read whole and checked as a response body is
/// (the default `limits.http_response_kib`).
pub(super) const WHOLE: usize = 4 << 20;
/// What the compressed streams of a file checked whole may inflate to.
pub(super) const WHOLE_INFLATE: usize = 4 * WHOLE;
/// A larger file is read and checked this much at a time.
pub(super) const CHUNK: usize = 4 << 20;
/// The least that checked pieces overlap by, and the text the host checks
/// after a cut ([`find_in_kept`]).
pub(super) const LOOKAHEAD: usize = 64 << 10;
/// How much longer than its longest needle a secret may be as written and
/// still be found across a boundary: a view undoes escapes that write a
/// byte in up to six (`\u002F`, `&#x2F;`).
const STRETCH: usize = 8;

/// What pieces of data checked one after another must overlap by, so a
/// secret written across their boundary is whole in one of them.
pub(super) fn overlap(scanner: &SecretScanner) -> usize {
    scanner.longest().saturating_mul(STRETCH).max(LOOKAHEAD)
}

/// The first secret in the part of `text` a cut to `keep` bytes leaves, or
/// in any form that starts there and runs past the cut: `text` is checked
/// up to [`overlap`] bytes beyond `keep` (and no further, so a huge text
/// costs a bounded check).
pub(super) fn find_in_kept(scanner: &SecretScanner, text: &str, keep: usize) -> Option<Finding> {
    let end = text.floor_char_boundary(keep.saturating_add(overlap(scanner)));
    scanner.find(&text.as_bytes()[..end])
}

/// How a finding is named in a record or a note: the credential, the form
/// and the view — never the secret.
pub(super) fn named(f: &Finding) -> String {
    f.to_string()
}

/// The scanner of the values there are, vouched for or not: for what is
/// checked either way (names, and a call's output that received nothing
/// from outside).
pub(super) fn scanner_of(watched: &Watched) -> &Arc<SecretScanner> {
    match watched {
        Watched::Complete(scanner) | Watched::Unvouched { scanner, .. } => scanner,
    }
}

/// A path as the guest wrote it, for a record: quoted and cut short, so it
/// cannot pass for a record of its own.
pub(super) fn shown(path: &str) -> String {
    let short: String = path.chars().take(200).collect();
    format!("{short:?}")
}

/// Longest guest path kept for the records, in bytes.
const MAX_GUEST_PATH: usize = 1024;

/// `path`, or its last [`MAX_GUEST_PATH`] bytes (at a character boundary)
/// after `…`: a guest opening `././…/.` from each directory it opened grew
/// the kept path by kilobytes per open, copied whole each time, in host
/// memory outside its limit.
fn path_tail(path: String) -> String {
    if path.len() <= MAX_GUEST_PATH {
        return path;
    }
    let start = path.ceil_char_boundary(path.len() - MAX_GUEST_PATH);
    format!("…{}", &path[start..])
}

/// Which file, as the call's checks remember it: the same inode with the
/// same size and times holds the same bytes (a write changes the change
/// time, which no one can set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// The per-call check against every configured secret.
pub(super) struct CallSecrets {
    watch: SecretWatch,
    records: HostRecords,
    state: Mutex<State>,
    /// Largest file checked (`limits.file_check_mib`), bytes.
    file_limit: u64,
}

#[derive(Default)]
struct State {
    /// What the call last read the secrets into.
    scanner: Option<Watched>,
    /// What the guest received from outside that was not checked whole
    /// (names in its directories): its output cannot be vouched for while
    /// a credential is unreadable ([`CallSecrets::received`]).
    received: Vec<&'static str>,
    /// Files checked with that scanner: `Err(why)` for the refused ones.
    checked: HashMap<(u64, u64), (FileKey, Result<(), String>)>,
    /// Guest paths of the directories the guest holds (preopens and
    /// directories it opened), by the host file behind them, for records.
    dirs: Vec<(Weak<std::fs::File>, String)>,
}

impl std::fmt::Debug for CallSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSecrets").field("file_limit", &self.file_limit).finish_non_exhaustive()
    }
}

impl CallSecrets {
    /// The check of one call, watching `watched`; `None` when the config
    /// names no secret (nothing to look for: nothing is read or built).
    pub(super) fn new(watched: &Arc<[Arc<CredentialSpec>]>, file_check_mib: u64) -> Option<Arc<Self>> {
        (!watched.is_empty()).then(|| {
            Arc::new(CallSecrets {
                watch: SecretWatch::new(watched.clone()),
                records: HostRecords::default(),
                state: Mutex::default(),
                file_limit: file_check_mib.saturating_mul(1 << 20),
            })
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The scanner for every watched secret as its source holds it now
    /// (blocking: it reads the sources), and every value the process saw
    /// before; [`Watched::Unvouched`] when some credential has none. New
    /// values forget which files were checked clean.
    pub(super) fn scanner(&self) -> Watched {
        let watched = self.watch.scanner(&self.records);
        let mut state = self.state();
        if !state.scanner.as_ref().is_some_and(|s| Arc::ptr_eq(scanner_of(s), scanner_of(&watched))) {
            state.checked.clear();
        }
        state.scanner = Some(watched.clone());
        watched
    }

    /// The scanner for the names of a listing or a link's target: the
    /// call's last complete one, or one read now (blocking). Names are not
    /// refused while a credential is unreadable (a listing of names is not
    /// a file's content), but the guest received them: the output check
    /// counts them ([`CallSecrets::received`]).
    pub(super) fn listing_scanner(&self) -> Arc<SecretScanner> {
        self.received_scanner("names from its directories")
    }

    /// Whether the guest may be handed `data` the host keeps for it — its
    /// committed state, its pinned data — (blocking): `Err(why)` when it
    /// holds a watched secret (also inside a compressed stream, as a file
    /// is checked) or is larger than `limits.file_check_mib`. Checked when
    /// the call starts, not only when committed or packed: state committed
    /// before a credential was configured, or by a host with another config
    /// sharing the journal, and data pinned under the packer's config were
    /// never checked for this host's secrets. With the watch unvouched, for
    /// the values there are (the output check then counts what the guest
    /// read: [`CallSecrets::received`]). `scanner`: of [`CallSecrets::scanner`].
    /// Stops once `cancel` is set.
    pub(super) fn check_kept(&self, scanner: &SecretScanner, data: &[u8], cancel: &AtomicBool) -> Result<(), String> {
        if data.len() as u64 > self.file_limit {
            return Err(self.too_large(data.len() as u64));
        }
        let found = if data.len() <= WHOLE {
            check_compressed(scanner, data, WHOLE_INFLATE, "16 MiB (4× the 4 MiB checked whole)")?
        } else {
            // In overlapping pieces, as a large file: a secret across a
            // boundary is whole in one of them.
            let (overlap, mut start) = (overlap(scanner), 0);
            loop {
                if cancel.load(Ordering::Relaxed) {
                    return Err("the call ended before the check did".into());
                }
                let end = (start + WHOLE).min(data.len());
                if let Some(f) = scanner.find(&data[start..end]) {
                    break Some(f);
                }
                if end == data.len() {
                    break None;
                }
                start = end.saturating_sub(overlap).max(start + 1);
            }
        };
        match found {
            Some(f) => Err(format!("it holds {}", named(&f))),
            None => Ok(()),
        }
    }

    /// Whether this call's checks were made for every configured secret
    /// (none unreadable): a verdict then holds for any call with the same
    /// scanner.
    pub(super) fn complete_scanner(&self) -> Option<Arc<SecretScanner>> {
        match self.state().scanner.as_ref()? {
            Watched::Complete(s) => Some(s.clone()),
            Watched::Unvouched { .. } => None,
        }
    }

    /// The call's last complete scanner, or one read now (blocking), for
    /// what the guest receives that is not refused while a credential is
    /// unreadable; `what` is counted as received.
    fn received_scanner(&self, what: &'static str) -> Arc<SecretScanner> {
        let last = self.state().scanner.clone();
        let watched = match last {
            Some(complete @ Watched::Complete(_)) => complete,
            // Read again: the source may be readable by now.
            _ => self.scanner(),
        };
        self.received(what);
        scanner_of(&watched).clone()
    }

    /// The guest received `what` from outside that the call did not refuse
    /// while it could not vouch for its checks (its state, its `env`
    /// grant, names from its directories).
    pub(super) fn received(&self, what: &'static str) {
        let mut state = self.state();
        if !state.received.contains(&what) {
            state.received.push(what);
        }
    }

    /// What [`CallSecrets::received`] was told, in order.
    pub(super) fn received_from_outside(&self) -> Vec<&'static str> {
        self.state().received.clone()
    }

    /// Record one line of the host's words in the call's host records.
    pub(super) fn record(&self, line: String) {
        self.records.add(line);
    }

    /// Record one line quoting the guest's text (a path, a name): see [`Record::quoting`].
    pub(super) fn record_quoting(&self, line: impl Fn(Quote<'_>) -> String) {
        self.records.quoting(line);
    }

    /// The call's records from these checks (taken), and how many more were dropped.
    pub(super) fn take_records(&self) -> (Vec<Record>, u64) {
        self.records.take()
    }

    /// The guest holds `dir` as `guest` (a preopen, or a directory it opened).
    pub(super) fn name_dir(&self, dir: &Arc<std::fs::File>, guest: String) {
        let mut state = self.state();
        state.dirs.retain(|(d, _)| d.strong_count() > 0);
        // Named once: a guest asking for its preopens again and again must
        // not grow the list (every lookup walks it).
        if !state.dirs.iter().any(|(d, _)| std::ptr::eq(d.as_ptr(), Arc::as_ptr(dir))) {
            state.dirs.push((Arc::downgrade(dir), guest));
        }
    }

    /// The guest's path of `path` under `dir`, as the guest named them.
    pub(super) fn guest_path(&self, dir: &Arc<std::fs::File>, path: &str) -> String {
        let state = self.state();
        // A live `Weak` keeps its allocation: no other directory has its address.
        let base = state.dirs.iter().find(|(d, _)| std::ptr::eq(d.as_ptr(), Arc::as_ptr(dir))).map(|(_, g)| g.as_str());
        let full = match base {
            Some(base) if path.is_empty() || path == "." => return base.to_owned(),
            Some(base) => format!("{}/{path}", base.trim_end_matches('/')),
            None => format!("…/{path}"),
        };
        path_tail(full)
    }

    /// Whether the guest may read `file` (blocking): `Err(why)` when it
    /// holds a secret, is larger than the host checks, is not a regular
    /// file, or the check could not finish. Stops early once `cancel` is
    /// set (the call is over).
    pub(super) fn check_file(&self, file: &std::fs::File, cancel: &AtomicBool) -> Result<(), String> {
        let meta = file.metadata().map_err(|e| format!("the host could not read what it is ({e})"))?;
        if !meta.is_file() {
            return Err("it is not a regular file, which the host cannot check for secrets".into());
        }
        if meta.len() > self.file_limit {
            return Err(self.too_large(meta.len()));
        }
        let key = FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        };
        // Checked before in this call (for the values read then): not again.
        if let Some((seen, verdict)) = self.state().checked.get(&(key.dev, key.ino))
            && *seen == key
        {
            return verdict.clone();
        }
        // The secrets as their sources hold them now (new values forget what was checked).
        let scanner = match self.scanner() {
            Watched::Complete(scanner) => scanner,
            // Empty, there is nothing in it to hold the secret: a file a
            // Tool creates (or truncates) to write to. Read, not taken from
            // its size (a procfs file says 0 and has bytes). A write-only
            // open of a file with bytes stays refused: its writes could cut
            // a secret down to what a later check would not recognize.
            Watched::Unvouched { .. } if is_empty(file) => return Ok(()),
            // Not remembered: once the source can be read, the file is checked.
            Watched::Unvouched { credentials, .. } => {
                return Err(format!("the host cannot check it for {}", credentials.why()));
            }
        };
        let verdict = match self.read_and_check(file, meta.len(), &scanner, cancel) {
            Ok(None) => Ok(()),
            Ok(Some(f)) => Err(format!("it holds {}", named(&f))),
            Err(Stopped::Why(why)) => Err(why),
            // Not remembered: the call is over.
            Err(Stopped::Cancelled) => return Err("the call ended before the check did".into()),
        };
        // The latest verdict per file only: a guest rewriting a file and
        // opening it again and again does not grow this.
        self.state().checked.insert((key.dev, key.ino), (key, verdict.clone()));
        verdict
    }

    fn too_large(&self, size: u64) -> String {
        format!(
            "it is {:.1} MiB, more than `limits.file_check_mib` = {} that the host checks for secrets before a guest \
             reads a file; raise the limit or keep the file out of the grant",
            size as f64 / f64::from(1 << 20),
            self.file_limit >> 20
        )
    }

    /// `file` read from its start and checked: whole up to [`WHOLE`] bytes,
    /// in overlapping pieces beyond.
    fn read_and_check(
        &self,
        file: &std::fs::File,
        size: u64,
        scanner: &SecretScanner,
        cancel: &AtomicBool,
    ) -> Result<Option<Finding>, Stopped> {
        let mut data = Vec::new();
        let hint = usize::try_from(size).unwrap_or(usize::MAX);
        read_at_most(file, 0, WHOLE + 1, hint, &mut data)?;
        if data.len() <= WHOLE {
            return check_compressed(
                scanner,
                &data,
                WHOLE_INFLATE,
                "16 MiB (4× the 4 MiB a file is checked whole up to)",
            )
            .map_err(|why| Stopped::Why(format!("{why}: refused")));
        }
        let overlap = overlap(scanner);
        let mut offset = data.len() as u64;
        loop {
            if let Some(f) = scanner.find(&data) {
                return Ok(Some(f));
            }
            if cancel.load(Ordering::Relaxed) {
                return Err(Stopped::Cancelled);
            }
            // Keep the end of this piece: a secret across the boundary is whole in the next.
            data.drain(..data.len().saturating_sub(overlap));
            let read = read_at_most(file, offset, CHUNK, CHUNK, &mut data)?;
            if read == 0 {
                return Ok(None);
            }
            offset += read as u64;
            if offset > self.file_limit {
                // It grew past the limit while being read.
                return Err(Stopped::Why(self.too_large(offset)));
            }
        }
    }
}

/// Whether `file` has no bytes now: a read at its start finds its end.
fn is_empty(file: &std::fs::File) -> bool {
    loop {
        match file.read_at(&mut [0], 0) {
            Ok(n) => return n == 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// Why a file check stopped without a verdict of clean or found.
enum Stopped {
    Why(String),
    Cancelled,
}

/// Append up to `max` bytes of `file` from `offset` to `buf` (fewer at its
/// end), reading in steps of about `hint` bytes (the size it said it has),
/// without moving the descriptor's position.
fn read_at_most(
    file: &std::fs::File,
    offset: u64,
    max: usize,
    hint: usize,
    buf: &mut Vec<u8>,
) -> Result<usize, Stopped> {
    let mut got = 0;
    while got < max {
        let start = buf.len();
        let step = (max - got).min(hint.saturating_sub(got).saturating_add(1).clamp(4 << 10, 1 << 20));
        buf.resize(start + step, 0);
        let read = loop {
            match file.read_at(&mut buf[start..], offset + got as u64) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    buf.truncate(start);
                    return Err(Stopped::Why(format!("the host could not read it to check it ({e})")));
                }
            }
        };
        buf.truncate(start + read);
        if read == 0 {
            break;
        }
        got += read;
    }
    Ok(got)
}

/// Sets its flag when dropped: a check on the blocking pool stops once the
/// call that waits for it is gone (its deadline passed, it was cancelled).
pub(super) struct CancelOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::credentials::{Apply, CredentialConfig, CredentialSpec, Source};

    const SECRET: &str = "tg/s3+cr=t Zq8v";

    fn secrets(limit_mib: u64) -> Arc<CallSecrets> {
        // A unique variable per test: tests run in parallel in one process.
        let var = format!("TOOLGATE_WITHHOLD_TEST_{limit_mib}_{}", std::process::id());
        // SAFETY (edition 2024): the variable is this test's own.
        unsafe { std::env::set_var(&var, SECRET) };
        let config = CredentialConfig {
            source: Source::Env(var),
            destinations: vec!["https://api.example:443".into()],
            apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
        };
        let spec = CredentialSpec::new("tracker", &config, std::path::Path::new("/")).unwrap();
        CallSecrets::new(&Arc::from([Arc::new(spec)]), limit_mib).unwrap()
    }

    /// What a call remembers of the files and directories it saw stays
    /// bounded by what it holds: one verdict per file, one name per directory.
    #[test]
    fn a_guest_path_is_kept_to_its_last_kibibyte() {
        let long = format!("/data/{}/é/end", "./".repeat(5000));
        let kept = path_tail(long.clone());
        assert!(kept.len() <= MAX_GUEST_PATH + 4 && kept.starts_with('…') && kept.ends_with("/é/end"), "{kept}");
        assert_eq!(path_tail("/data/a".into()), "/data/a");
    }

    #[test]
    fn a_call_remembers_one_verdict_per_file_and_one_name_per_directory() {
        let s = secrets(2);
        let mut f = tempfile::tempfile().unwrap();
        for i in 0..20u8 {
            // Rewritten (a new size each time), opened again.
            std::io::Write::write_all(&mut f, &[b'a' + i]).unwrap();
            assert_eq!(s.check_file(&f, &AtomicBool::new(false)), Ok(()));
        }
        assert_eq!(s.state().checked.len(), 1, "one verdict for the one file");
        let dir = Arc::new(std::fs::File::open(std::env::temp_dir()).unwrap());
        for _ in 0..20 {
            s.name_dir(&dir, "/tmp".into());
        }
        assert_eq!(s.state().dirs.len(), 1, "one name for the one directory");
        assert_eq!(s.guest_path(&dir, "x"), "/tmp/x");
    }

    fn check(s: &CallSecrets, bytes: &[u8]) -> Result<(), String> {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        s.check_file(&f, &AtomicBool::new(false))
    }

    #[test]
    fn no_credential_builds_nothing() {
        assert!(CallSecrets::new(&Arc::from([]), 64).is_none());
    }

    #[test]
    fn a_file_holding_a_secret_in_any_form_is_refused_naming_the_credential() {
        let s = secrets(64);
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
        let percent = SECRET.replace('/', "%2F").replace('+', "%2B").replace('=', "%3D").replace(' ', "%20");
        for content in [
            format!("GH_TOKEN={SECRET}\n"),
            format!("token: {b64}\n"),
            format!("[remote \"origin\"]\n\turl = https://x:{percent}@github.com/o/r\n"),
        ] {
            let why = check(&s, content.as_bytes()).unwrap_err();
            assert!(why.contains("credential `tracker`") && !why.contains(SECRET), "{why}");
        }
        // A loose Git object: zlib at the start, inflated for the check.
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        let object = format!("blob 900\0{}\nGH_TOKEN={SECRET}\n", "# settings\n".repeat(80));
        std::io::Write::write_all(&mut z, object.as_bytes()).unwrap();
        let compressed = z.finish().unwrap();
        assert!(!compressed.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "not stored as it is");
        let why = check(&s, &compressed).unwrap_err();
        assert!(why.contains("zlib"), "{why}");
        assert_eq!(check(&s, b"GH_TOKEN=${GH_TOKEN}\n"), Ok(()), "a clean file reads");
        assert_eq!(check(&s, b""), Ok(()));
    }

    /// Every secret the config names by reference is watched, with no
    /// `[credentials]` at all: each `[[serve.auth]]` token, `serve.state_key`
    /// and `postgres.password` (which no end-to-end test can configure: the
    /// host would connect to the server). A file holding one is refused,
    /// naming the field; none of them is ever applied to a request.
    #[test]
    fn every_secret_source_of_the_config_is_watched_and_none_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let var = |what: &str| format!("TOOLGATE_WITHHOLD_OWN_{what}_{}", std::process::id());
        let values = [
            ("serve.auth[0].token", "0wn-s3rve/t0ken+number=0ne"),
            ("serve.auth[1].token", "0wn-s3rve/t0ken+number=tw0"),
            ("serve.state_key", "0wn-st4te/k3y+0f=the-replicas-0123456789"),
            ("postgres.password", "0wn-pg/passw0rd+of=the-journal"),
        ];
        for (i, (_, value)) in values.iter().enumerate() {
            // SAFETY (edition 2024): the variables are this test's own.
            unsafe { std::env::set_var(var(&i.to_string()), value) };
        }
        std::fs::write(dir.path().join("key"), format!("{}\n", values[2].1)).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path().join("key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            "store = \"postgres://tg@db.example/toolgate\"\n[postgres]\npassword = {{ env = \"{}\" }}\n\
             [serve]\nstate_key = {{ file = \"key\" }}\nauth = [\n  {{ agent = \"a\", token = {{ env = \"{}\" }} }},\n  \
             {{ agent = \"b\", token = {{ env = \"{}\" }} }},\n]\n[agents.a]\n[agents.b]\n",
            var("3"),
            var("0"),
            var("1"),
        );
        let config = crate::config::Config::parse(&text, &dir.path().join("toolgate.toml"), dir.path()).unwrap();
        assert!(config.credentials.is_empty());
        let watched: Arc<[Arc<CredentialSpec>]> = config.watched().into();
        let mut names: Vec<&str> = watched.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["postgres.password", "serve.auth[0].token", "serve.auth[1].token", "serve.state_key"]);
        for spec in watched.iter() {
            assert!(spec.is_watch_only() && !spec.bound_to("https", "db.example", 443));
            let e = spec.materialize("https", "db.example", 443).unwrap_err().to_string();
            assert!(e.contains("never sent"), "{e}");
        }
        let s = CallSecrets::new(&watched, 64).expect("secrets to watch");
        for (field, value) in values {
            let why = check(&s, format!("export X={value}\n").as_bytes()).unwrap_err();
            assert!(why.contains(&format!("`{field}`")) && !why.contains(value), "{why}");
        }
        assert_eq!(check(&s, b"nothing secret\n"), Ok(()));
        // A config naming no secret at all watches nothing: no check is built.
        let plain = crate::config::Config::parse("", &dir.path().join("toolgate.toml"), dir.path()).unwrap();
        assert!(plain.watched().is_empty());
        for i in 0..4 {
            // SAFETY: as above.
            unsafe { std::env::remove_var(var(&i.to_string())) };
        }
    }

    #[test]
    fn a_secret_across_a_piece_boundary_of_a_large_file_is_found() {
        let s = secrets(64);
        for at in [CHUNK + 1 - 7, 2 * CHUNK + 1 - overlap(scanner_of(&s.scanner())) + 3, 3 * CHUNK] {
            let mut data = vec![b'.'; 3 * CHUNK + 100];
            data[at..at + SECRET.len()].copy_from_slice(SECRET.as_bytes());
            assert!(check(&s, &data).is_err(), "at {at}");
        }
        let clean = vec![b'.'; 2 * CHUNK + 5];
        assert_eq!(check(&s, &clean), Ok(()));
    }

    /// What the host keeps for a Tool (its state, its pinned data) is
    /// checked as a file is: whole or in overlapping pieces, inside
    /// compressed streams, bounded by `limits.file_check_mib`, and a
    /// cancelled check stops.
    #[test]
    fn kept_data_is_checked_as_a_file_is() {
        let s = secrets(16);
        let watched = s.scanner();
        let scanner = scanner_of(&watched);
        let no = AtomicBool::new(false);
        let kept = |data: &[u8]| s.check_kept(scanner, data, &no);
        assert_eq!(kept(b"nothing here"), Ok(()));
        assert!(kept(format!("x {SECRET} y").as_bytes()).unwrap_err().contains("`tracker`"));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, format!("packed: {SECRET}").as_bytes()).unwrap();
        assert!(kept(&gz.finish().unwrap()).is_err(), "inside a gzip stream");
        for at in [WHOLE - 5, 2 * WHOLE + 1] {
            let mut data = vec![b'.'; 3 * WHOLE];
            data[at..at + SECRET.len()].copy_from_slice(SECRET.as_bytes());
            assert!(kept(&data).is_err(), "at {at}");
        }
        let over = vec![b'.'; (16 << 20) + 1];
        assert!(kept(&over).unwrap_err().contains("limits.file_check_mib"));
        let mut late = vec![b'.'; 3 * WHOLE];
        late[3 * WHOLE - 40..3 * WHOLE - 40 + SECRET.len()].copy_from_slice(SECRET.as_bytes());
        assert!(s.check_kept(scanner, &late, &AtomicBool::new(true)).unwrap_err().contains("ended"));
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_the_setting_and_a_cancelled_check_stops() {
        let s = secrets(1);
        let why = check(&s, &vec![b'.'; (1 << 20) + 1]).unwrap_err();
        assert!(why.contains("`limits.file_check_mib` = 1"), "{why}");
        let s = secrets(64);
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &vec![b'.'; 3 * CHUNK]).unwrap();
        let why = s.check_file(&f, &AtomicBool::new(true)).unwrap_err();
        assert!(why.contains("ended"), "{why}");
        assert_eq!(s.check_file(&f, &AtomicBool::new(false)), Ok(()), "a cancelled check is not remembered");
    }

    /// A credential the host refuses to apply is still watched: a secret
    /// file readable by others (a Kubernetes secret volume's 0644, Docker
    /// swarm's 0444), a secret too short to apply, an environment value
    /// that is not UTF-8. Each as the only credential configured (nothing
    /// else would make the host read the file), each in a granted `.env`.
    #[test]
    fn a_secret_the_host_refuses_to_apply_is_still_kept_from_the_guest() {
        use std::os::unix::ffi::OsStrExt as _;
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let one = |source: Source| {
            let config = CredentialConfig {
                source,
                destinations: vec!["https://api.example:443".into()],
                apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
            };
            let spec = CredentialSpec::new("loose", &config, dir.path()).unwrap();
            assert!(spec.materialize("https", "api.example", 443).is_err(), "refused for use");
            CallSecrets::new(&Arc::from([Arc::new(spec)]), 64).unwrap()
        };
        for mode in [0o644, 0o640, 0o444] {
            let file = dir.path().join(format!("k8s-{mode:o}.secret"));
            std::fs::write(&file, format!("l00se-{mode:o}-s3cret-v4lue\n")).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let s = one(Source::File(file));
            let why = check(&s, format!("API_TOKEN=l00se-{mode:o}-s3cret-v4lue\n").as_bytes()).unwrap_err();
            assert!(why.contains("credential `loose`"), "{mode:o}: {why}");
            assert_eq!(check(&s, b"API_TOKEN=${API_TOKEN}\n"), Ok(()), "{mode:o}: a clean file reads");
        }
        let var = |tag: &str| format!("TOOLGATE_WITHHOLD_LOOSE_{tag}_{}", std::process::id());
        // Too short to apply (and to search for in its encodings): raw only.
        // SAFETY (edition 2024): the variables are this test's own.
        unsafe { std::env::set_var(var("SHORT"), "k7#Qz") };
        let s = one(Source::Env(var("SHORT")));
        assert!(check(&s, b"PIN=k7#Qz\n").is_err());
        // Not UTF-8: no header can carry it, but a file can hold it.
        let bytes = b"n0t-utf8-\xff\xfe-s3cret";
        unsafe { std::env::set_var(var("BYTES"), std::ffi::OsStr::from_bytes(bytes)) };
        let s = one(Source::Env(var("BYTES")));
        assert!(check(&s, &[&b"KEY="[..], bytes, b"\n"].concat()).is_err());
        assert!(check(&s, hex::encode(bytes).as_bytes()).is_err(), "in its encodings too");
    }

    /// A credential the host has never read (its variable unset where the
    /// host runs) leaves nothing to look for: every file with bytes is
    /// refused, clean or not, naming the credential, its source and the fix
    /// (an empty one holds nothing to keep) — until the variable is set,
    /// when the normal check applies (and, read once, its value stays
    /// watched after it is unset again).
    #[test]
    fn a_file_is_refused_while_a_credential_was_never_read() {
        let var = format!("TOOLGATE_WITHHOLD_NEVER_READ_{}", std::process::id());
        let config = CredentialConfig {
            source: Source::Env(var.clone()),
            destinations: vec!["https://api.example:443".into()],
            apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
        };
        let spec = CredentialSpec::new("withhold-never-read", &config, std::path::Path::new("/")).unwrap();
        let s = CallSecrets::new(&Arc::from([Arc::new(spec)]), 64).unwrap();
        const TOKEN: &str = "ghp_n3verR3adT0ken0000";
        for content in [format!("GITHUB_TOKEN={TOKEN}\n"), "alpha\n".to_owned()] {
            let why = check(&s, content.as_bytes()).unwrap_err();
            assert!(
                why.contains("credential `withhold-never-read`") && why.contains(&var) && why.contains("environment"),
                "{why}"
            );
        }
        assert!(s.state().checked.is_empty(), "an unvouched verdict is not remembered");
        // An empty file holds nothing to keep from the guest (one a Tool creates to write to).
        assert_eq!(check(&s, b""), Ok(()));
        // The listing's names pass (checked for what there is) but count as received.
        let _ = s.listing_scanner();
        assert_eq!(s.received_from_outside(), ["names from its directories"]);
        // SAFETY (edition 2024): the variable is this test's own.
        unsafe { std::env::set_var(&var, TOKEN) };
        let why = check(&s, format!("GITHUB_TOKEN={TOKEN}\n").as_bytes()).unwrap_err();
        assert!(why.contains("holds the secret of credential `withhold-never-read`"), "{why}");
        assert_eq!(check(&s, b"alpha\n"), Ok(()));
        unsafe { std::env::remove_var(&var) };
        assert!(check(&s, format!("GITHUB_TOKEN={TOKEN}\n").as_bytes()).unwrap_err().contains("holds the secret"));
        assert_eq!(check(&s, b"beta\n"), Ok(()));
    }

    #[test]
    fn a_secret_across_a_cut_is_found_in_what_follows_it() {
        let s = scanner_of(&secrets(64).scanner()).clone();
        let text = format!("{}{SECRET} and more", "x".repeat(100));
        assert!(find_in_kept(&s, &text, 104).is_some(), "the first 4 bytes would be kept");
        assert!(find_in_kept(&s, &"y".repeat(10_000_000), 1024).is_none());
    }
}
