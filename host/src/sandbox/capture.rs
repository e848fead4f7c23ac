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

/// A bounded capture buffer; clones share the buffer.
#[derive(Debug, Clone)]
pub struct Capture {
    cap: usize,
    inner: Arc<Mutex<Inner>>,
}

impl Capture {
    /// A capture keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Capture { cap, inner: Arc::default() }
    }

    /// Append, keeping what fits.
    pub fn write(&self, bytes: &[u8]) {
        let mut i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.cap.saturating_sub(i.buf.len());
        let take = room.min(bytes.len());
        i.buf.extend_from_slice(&bytes[..take]);
        i.dropped += (bytes.len() - take) as u64;
    }

    /// What was kept, as lossy UTF-8.
    pub fn text(&self) -> String {
        let i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&i.buf).into_owned()
    }

    /// Bytes dropped over the bound.
    pub fn dropped(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).dropped
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
