//! Files: how the host reads a file it was pointed at — config, lock file,
//! signatures, secret files, components.
//!
//! Owns refusing anything but a regular file, before reading it (the file is
//! opened without blocking, then checked on the open descriptor, so a FIFO,
//! socket or device swapped in cannot stall a host thread), and bounding
//! what is read, so a huge file cannot exhaust the host's memory; and
//! refusing one of the host's own files that has a second name (a hard
//! link) a Tool might reach.
//!
//! A leaf: it imports nothing of the crate.

use std::io::Read as _;
use std::path::Path;

/// Read `path` whole: a regular file of at most `max` bytes.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, rustix::fs::OFlags::NONBLOCK.bits() as i32);
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} bytes, more than the {max} allowed", meta.len()),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded again while reading: the file may grow after the check.
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("more than the {max} bytes allowed")));
    }
    Ok(bytes)
}

/// Refuse a regular file at `path` with more than one link: a hard link is
/// another name of the same file anywhere on its file system — inside a
/// directory granted to a Tool, say — and the host cannot list every
/// grant's files to find it. `secret` (its content must not be read):
/// always; otherwise only when this process could write the file (through
/// any of its names: the permission is the file's). Nothing there, or not a
/// regular file: nothing to refuse. The error names the file and what to do.
pub fn single_link(path: &Path, secret: bool) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
        if !meta.is_file() || meta.nlink() <= 1 {
            return Ok(());
        }
        let writable = || {
            rustix::fs::accessat(rustix::fs::CWD, path, rustix::fs::Access::WRITE_OK, rustix::fs::AtFlags::EACCESS)
                .is_ok()
        };
        if !secret && !writable() {
            return Ok(());
        }
        let path = &std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        Err(format!(
            "{} has {} links (hard links: other names of the same file, anywhere on its file system — one inside a \
             directory granted to a Tool would let it {} the file); remove the other links (`find / -xdev -samefile \
             {}` lists them) or replace the file with a copy of its own",
            path.display(),
            meta.nlink(),
            if secret { "read or rewrite" } else { "rewrite" },
            path.display()
        ))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, secret);
        Ok(())
    }
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, max)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bounded_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "hello").unwrap();
        assert_eq!(read_text(&f, 5).unwrap(), "hello");
        assert!(read_text(&f, 4).unwrap_err().to_string().contains("more than the 4"));
        assert!(read_text(dir.path(), 10).unwrap_err().to_string().contains("not a regular file"));
        assert!(read_text(&dir.path().join("absent"), 10).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        // No writer: a blocking open would hang this test forever.
        let e = read_text(&fifo, 10).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
