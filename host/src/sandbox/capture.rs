//! Capture: bounded in-memory sinks for a guest's stdout, stderr and log.
//!
//! Owns keeping at most a fixed number of bytes per stream and counting what
//! it dropped. Unlike wasmtime's `MemoryOutputPipe`, a full capture does not
//! trap the guest: a chatty Tool keeps running, its excess output is dropped.
//! Guest output never reaches the host's own stdout or stderr.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

#[derive(Debug, Default)]
struct Inner {
    buf: Vec<u8>,
    dropped: u64,
}

/// A call's three streams (stdout, stderr, log) behind one allocation.
#[derive(Debug)]
struct Streams {
    /// Bytes kept per stream: the bound, plus the lookahead.
    cap: usize,
    streams: Mutex<[Inner; 3]>,
}

/// A bounded capture buffer; clones share the buffer.
#[derive(Debug, Clone)]
pub struct Capture {
    streams: Arc<Streams>,
    which: usize,
}

/// What a call's captures kept, and the bytes they dropped over their bound, all streams.
#[derive(Debug, Default)]
pub struct Kept {
    /// stdout, as lossy UTF-8.
    pub stdout: String,
    /// stderr, as lossy UTF-8.
    pub stderr: String,
    /// log, as lossy UTF-8.
    pub log: String,
    /// Bytes dropped over the bound.
    pub dropped: u64,
}

impl Capture {
    /// A capture keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Capture::three(cap).0
    }

    /// A call's stdout, stderr and log captures, each keeping at most `cap` bytes.
    pub fn three(cap: usize) -> (Capture, Capture, Capture) {
        Capture::three_with_lookahead(cap, 0)
    }

    /// [`Capture::three`], each keeping `lookahead` bytes more: what
    /// follows the bound, to be checked with what comes before it and then
    /// cut ([`Kept::cut_to`]), so a secret written across the bound cannot
    /// leave its first bytes in what is kept.
    pub fn three_with_lookahead(cap: usize, lookahead: usize) -> (Capture, Capture, Capture) {
        let streams = Arc::new(Streams { cap: cap.saturating_add(lookahead), streams: Mutex::default() });
        let at = |which| Capture { streams: streams.clone(), which };
        (at(0), at(1), at(2))
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner, usize) -> R) -> R {
        let mut all = self.streams.streams.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut all[self.which], self.streams.cap)
    }

    /// Append, keeping what fits.
    pub fn write(&self, bytes: &[u8]) {
        self.with(|i, cap| {
            let room = cap.saturating_sub(i.buf.len());
            let take = room.min(bytes.len());
            i.buf.extend_from_slice(&bytes[..take]);
            i.dropped += (bytes.len() - take) as u64;
        })
    }

    /// Everything the three captures of [`Capture::three`] kept, taken at once.
    pub fn take_all(&self) -> Kept {
        let mut all = self.streams.streams.lock().unwrap_or_else(|p| p.into_inner());
        let text = |i: &mut Inner| match String::from_utf8(std::mem::take(&mut i.buf)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        let dropped = all.iter().map(|i| i.dropped).sum();
        let [out, err, log] = &mut *all;
        Kept { stdout: text(out), stderr: text(err), log: text(log), dropped }
    }
}

impl Kept {
    /// Each stream cut (at a character boundary) to at most `cap` bytes,
    /// what was cut counted as dropped: the lookahead of
    /// [`Capture::three_with_lookahead`] goes once it has been checked.
    pub fn cut_to(mut self, cap: usize) -> Self {
        for text in [&mut self.stdout, &mut self.stderr, &mut self.log] {
            if text.len() > cap {
                let end = text.floor_char_boundary(cap);
                self.dropped += (text.len() - end) as u64;
                text.truncate(end);
            }
        }
        self
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.write(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        Capture::write(self, &bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        // Always accept: excess is dropped, never a trap or a stall.
        Ok(64 * 1024)
    }
}
