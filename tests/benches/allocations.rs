//! Heap allocations per call, toolgate's full path against bare wasmtime, in
//! one run: `cargo bench -p toolgate-tests --bench allocations`.
//!
//! Not a timing: every allocation and free is counted by a wrapping global
//! allocator, over many calls after warm-up, so the figure is exact and
//! stable. Time per call is the `call_path` bench; this says where part of
//! the difference comes from (each allocation and its free costs ~20-40 ns).

mod common;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{ARGS, Bare, Host, TOOL, assert_upper, tokio_rt};
use serde_json::json;
use toolgate::ToolCapabilityNarrowing;
use toolgate_tests::{guests, packed};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to mimalloc (the `toolgate` binary's allocator); only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is the allocator's.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const CALLS: u64 = 10_000;

/// Allocations and bytes per call of `call`, after 1,000 warm-up calls.
fn per_call(rt: &tokio::runtime::Runtime, mut call: impl AsyncFnMut()) -> (f64, f64) {
    rt.block_on(async {
        for _ in 0..1_000 {
            call().await;
        }
        let (a, b) = (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
        for _ in 0..CALLS {
            call().await;
        }
        let (a2, b2) = (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
        ((a2 - a) as f64 / CALLS as f64, (b2 - b) as f64 / CALLS as f64)
    })
}

fn main() {
    // `cargo test --benches` runs bench targets with no arguments to check
    // they start; only `cargo bench` passes `--bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio_rt();
    let host = Host::new(&rt);
    let bare = Bare::new(&packed(guests::TEXT), host.dir.path());
    let (bare_allocs, bare_bytes) = per_call(&rt, async || {
        let out = bare.call(TOOL, ARGS).await;
        std::hint::black_box(out);
    });
    let runtime = host.runtime("default", Arc::new(toolgate::MemoryJournal::new()));
    let run = rt.block_on(runtime.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
    let (full_allocs, full_bytes) = per_call(&rt, async || {
        let r = run.call(TOOL, json!({"text": "hello"})).await.unwrap();
        assert_upper(&r);
    });
    println!("allocations per call (10,000 calls after 1,000 warm-up, text.upper):");
    println!("| path | allocations | bytes |");
    println!("|---|---:|---:|");
    println!("| bare wasmtime instantiate+call | {bare_allocs:.1} | {bare_bytes:.0} |");
    println!("| toolgate full path, in-memory journal | {full_allocs:.1} | {full_bytes:.0} |");
    println!("| difference | {:.1} | {:.0} |", full_allocs - bare_allocs, full_bytes - bare_bytes);
}
