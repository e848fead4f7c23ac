//! The cost of a big guest: a Python Tool (componentize-py bundles CPython,
//! ~18 MB) next to the same Tool in Rust (~100 KB), in one run:
//! `cargo bench -p toolgate-tests --bench python` (or `scripts/bench`).
//!
//! Prints a Markdown table (the one in BENCHMARKS.md): pack time, listing
//! (metadata only: nothing compiles), the first call of a never-compiled
//! component (on the baseline tier, Winch, as a host runs it; and waiting for
//! Cranelift, the tier turned off), the first call from the disk cache (a new
//! executor), warm call
//! median and p99, and resident memory with 10 Python components loaded.
//! Not criterion: first calls and resident memory are one-shot figures; each
//! is the median of several fresh hosts.

mod common;

/// The allocator the `toolgate` binary ships with (`host/cli/src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{median, ms, pct, rss_kib};
use serde_json::json;
use toolgate::catalog::descriptor::{embed_metadata, read_metadata};
use toolgate::{
    Config, ExecutableAgentSnapshot, Executor, ExecutorSettings, Runtime, StepResult, ToolCapabilityNarrowing,
};
use toolgate_sdk::ComponentMetadata;
use toolgate_tests::{guests, raw};

const WARM_CALLS: usize = 1000;
const LOADED: usize = 10;

struct Figures {
    size_mib: f64,
    pack: Duration,
    list: Duration,
    never_compiled: Duration,
    never_compiled_cranelift: Duration,
    disk_cached: Duration,
    warm_p50: Duration,
    warm_p99: Duration,
}

fn config(dir: &Path, plugins: &[(&str, &[u8])]) -> Config {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("plugins")).unwrap();
    for (name, bytes) in plugins {
        std::fs::write(dir.join("plugins").join(name), bytes).unwrap();
    }
    let file = dir.join("toolgate.toml");
    std::fs::write(
        &file,
        "plugins = \"plugins\"\nstore = \":memory:\"\ncache = \"cache\"\n\
         [agents.default]\nvisible = [\"*\"]\ndefault = \"allow\"\n",
    )
    .unwrap();
    Config::load(&file).unwrap()
}

fn runtime(config: &Config, cache: &Path) -> Runtime {
    runtime_tiered(config, cache, true)
}

fn runtime_tiered(config: &Config, cache: &Path, baseline_tier: bool) -> Runtime {
    let catalog = Arc::new(toolgate::host::catalog(config).unwrap());
    let snapshot = ExecutableAgentSnapshot::build(config, "default", catalog).unwrap();
    let mut settings = ExecutorSettings::new(config.limits.clone(), Some(cache.to_owned()));
    settings.baseline_tier = baseline_tier;
    Runtime::new(
        snapshot,
        Arc::new(Executor::new(settings).unwrap()),
        Arc::new(toolgate::MemoryJournal::new()),
        toolgate::RuntimeSettings::of(config),
    )
}

async fn upper(r: &Runtime) -> Duration {
    let run = r.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
    let t = Instant::now();
    let out = run.call("text.upper", json!({"text": "hello"})).await.unwrap();
    let took = t.elapsed();
    assert!(matches!(&out, StepResult::Output { .. }), "{out:?}");
    took
}

fn measure(rt: &tokio::runtime::Runtime, lang: &str, unpacked: &[u8], dir: &Path) -> Figures {
    let t = Instant::now();
    let (packed, _) = rt.block_on(toolgate_author::pack::pack(unpacked)).unwrap();
    let pack = t.elapsed();
    let config = config(dir, &[("text.wasm", &packed)]);
    let list = median(
        (0..10)
            .map(|_| {
                let t = Instant::now();
                let catalog = Arc::new(toolgate::host::catalog(&config).unwrap());
                let snapshot = ExecutableAgentSnapshot::build(&config, "default", catalog).unwrap();
                assert_eq!(snapshot.list(&|_| None).len(), 3);
                t.elapsed()
            })
            .collect(),
    );
    let (mut never, mut never_cranelift, mut cached, mut warm) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..3 {
        let cache = dir.join(format!("cranelift-{i}"));
        let r = runtime_tiered(&config, &cache, false);
        never_cranelift.push(rt.block_on(upper(&r)));
        assert_eq!((r.executor().compilations(), r.executor().baseline_counts()), (1, (0, 0)));
        let cache = dir.join(format!("cache-{i}"));
        let r = runtime(&config, &cache);
        never.push(rt.block_on(upper(&r)));
        assert_eq!(r.executor().baseline_counts(), (1, 1), "{lang}: the first call ran on Winch's code");
        // Cranelift's compile behind it fills the disk cache.
        rt.block_on(r.executor().settle());
        assert_eq!(r.executor().compilations(), 1);
        let r = runtime(&config, &cache);
        cached.push(rt.block_on(upper(&r)));
        assert_eq!(r.executor().compilations(), 0, "{lang}: loaded from the disk cache");
        if i == 0 {
            for _ in 0..WARM_CALLS {
                warm.push(rt.block_on(upper(&r)));
            }
        }
    }
    warm.sort();
    Figures {
        size_mib: unpacked.len() as f64 / (1024.0 * 1024.0),
        pack,
        list,
        never_compiled: median(never),
        never_compiled_cranelift: median(never_cranelift),
        disk_cached: median(cached),
        warm_p50: pct(&warm, 0.5),
        warm_p99: pct(&warm, 0.99),
    }
}

/// Resident memory before and after compiling, loading and calling `LOADED`
/// Python components (the text component under `LOADED` digests: renamed
/// copies list as `genN.*`; calling one runs the interpreter, which answers
/// that it does not export the id).
fn loaded(rt: &tokio::runtime::Runtime, packed: &[u8], dir: &Path) -> (u64, u64) {
    let base: Vec<_> = read_metadata(packed).unwrap().iter().map(|t| t.metadata.clone()).collect();
    let copies: Vec<(String, Vec<u8>)> = (0..LOADED)
        .map(|i| {
            let mut tools = base.clone();
            for t in &mut tools {
                t.descriptor.id = t.descriptor.id.replacen("text.", &format!("gen{i}."), 1);
            }
            (format!("gen{i}.wasm"), embed_metadata(packed, &ComponentMetadata::new(tools)).unwrap())
        })
        .collect();
    let plugins: Vec<(&str, &[u8])> = copies.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    let config = config(dir, &plugins);
    // The compiled code is kept across bench runs: the figure is memory, not compile time.
    let cache = dir.parent().unwrap().join("loaded-cache");
    let r = runtime(&config, &cache);
    let before = rss_kib();
    for i in 0..LOADED {
        let run = rt.block_on(r.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
        let out = rt.block_on(run.call(&format!("gen{i}.upper"), json!({"text": "x"}))).unwrap();
        assert!(
            matches!(&out, StepResult::ToolError { message, .. } if message.contains("does not export")),
            "{out:?}"
        );
    }
    (before, rss_kib())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` (criterion's convention): nothing to list
    }
    let rt = common::tokio_rt();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/python-bench");
    // Memory first, while the process holds nothing else.
    let (packed, _) = rt.block_on(toolgate_author::pack::pack(&raw(guests::PY_TEXT))).unwrap();
    let (before, after) = loaded(&rt, &packed, &root.join("loaded"));
    let rust = measure(&rt, "rust", &raw(guests::TEXT), &root.join("rust"));
    let python = measure(&rt, "python", &raw(guests::PY_TEXT), &root.join("python"));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\n## A Python Tool next to the same Tool in Rust (`text.upper`)\n");
    println!("Load average at the end: {}\n", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!("| | Rust | Python | Python / Rust |");
    println!("|---|---:|---:|---:|");
    let row = |name: &str, r: f64, p: f64, unit: &str| {
        println!("| {name} | {r:.3} {unit} | {p:.3} {unit} | {:.1}× |", p / r);
    };
    row("component size (unpacked)", rust.size_mib, python.size_mib, "MiB");
    row("pack (`describe`, compiles once)", ms(rust.pack), ms(python.pack), "ms");
    row("list (catalog + snapshot, metadata only)", ms(rust.list), ms(python.list), "ms");
    row("first call, never compiled (baseline tier: Winch)", ms(rust.never_compiled), ms(python.never_compiled), "ms");
    row(
        "first call, never compiled, waiting for Cranelift (tier off)",
        ms(rust.never_compiled_cranelift),
        ms(python.never_compiled_cranelift),
        "ms",
    );
    row("first call from the disk cache", ms(rust.disk_cached), ms(python.disk_cached), "ms");
    row("warm call, median", ms(rust.warm_p50), ms(python.warm_p50), "ms");
    row("warm call, p99", ms(rust.warm_p99), ms(python.warm_p99), "ms");
    println!(
        "\nResident memory with {LOADED} Python components compiled, loaded and called once: {:.1} MiB before, {:.1} MiB after (+{:.1} MiB, {:.1} MiB each).",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        (after - before) as f64 / 1024.0,
        (after - before) as f64 / 1024.0 / LOADED as f64
    );
    println!(
        "Warm calls: {WARM_CALLS} sequential, one fresh instance each. Command: `cargo bench -p toolgate-tests --bench python`."
    );
}
