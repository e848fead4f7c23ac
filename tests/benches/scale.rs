//! Performance at scale, against the bare wasmtime baseline, in one run:
//! `cargo bench -p toolgate-tests --bench scale` (or `scripts/bench`).
//!
//! Prints a Markdown table (the one in BENCHMARKS.md), writes the figures to
//! `target/scale/results.json` and a plot of latency and throughput against
//! concurrency to `target/scale/concurrency.svg`, and leaves plugin
//! directories of 20 and 200 generated components under `target/scale/` for
//! the `toolgate serve` start-up measurement (`tests/mcp/bench_serve.py`).
//!
//! Not criterion: the figures here are throughput at a concurrency, tail
//! latency and resident memory, which criterion's per-iteration model does
//! not express; each is measured over many calls and reported with its
//! command. The per-call medians with confidence intervals are the
//! `call_path` criterion bench.

mod common;

/// The allocator the `toolgate` binary ships with (`host/cli/src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ARGS, Bare, Host, TOOL, assert_upper, median, ms, pct, rss_kib, us};
use serde_json::{Value, json};
use toolgate::catalog::descriptor::{embed_metadata, read_metadata};
use toolgate::store::StepStore;
use toolgate::{
    Config, ExecutableAgentSnapshot, Executor, ExecutorSettings, Runtime, SqliteJournal, ToolCapabilityNarrowing,
};
use toolgate_sdk::ComponentMetadata;
use toolgate_tests::{guests, packed};

const CONCURRENCY: [usize; 4] = [1, 2, 8, 64];

/// `n` distinct components in `dir/plugins`: the text component, and copies
/// with their Tool ids renamed `genN.*` (each file its own digest and ids; a
/// renamed copy lists but cannot be called), with an agent that sees and may
/// run all of them.
fn generate(dir: &Path, n: usize) -> PathBuf {
    let plugins = dir.join("plugins");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(&plugins).unwrap();
    let text = packed(guests::TEXT);
    let base: Vec<_> = read_metadata(&text).unwrap().iter().map(|t| t.metadata.clone()).collect();
    // One real `text` component (its Tools can be called), the rest renamed copies (listing only).
    std::fs::write(plugins.join("text.wasm"), &text).unwrap();
    for i in 1..n {
        let mut tools = base.clone();
        for t in &mut tools {
            t.descriptor.id = t.descriptor.id.replacen("text.", &format!("gen{i}."), 1);
        }
        let bytes = embed_metadata(&text, &ComponentMetadata::new(tools)).unwrap();
        std::fs::write(plugins.join(format!("gen{i}.wasm")), bytes).unwrap();
    }
    let config = dir.join("toolgate.toml");
    std::fs::write(
        &config,
        "plugins = \"plugins\"\nstore = \":memory:\"\ncache = \"cache\"\n[agents.default]\nvisible = [\"gen*\", \"text.*\"]\n\
         default = \"deny\"\nrules = [{ pattern = \"gen*\", behavior = \"allow\" }, { pattern = \"text.*\", behavior = \"allow\" }]\n",
    )
    .unwrap();
    config
}

struct Listing {
    cold: Duration,
    warm: Duration,
    tools: usize,
    rss_before_kib: u64,
    rss_after_kib: u64,
}

/// Load + filter + list a directory of `n` components (metadata only), then list again from the snapshot.
fn listing(dir: &Path, n: usize) -> Listing {
    let config = Config::load(&generate(dir, n)).unwrap();
    let rss_before_kib = rss_kib();
    let mut cold = Vec::new();
    let mut keep = None;
    for _ in 0..10 {
        let t = Instant::now();
        let catalog = Arc::new(toolgate::host::catalog(&config).unwrap());
        let snapshot = ExecutableAgentSnapshot::build(&config, "default", catalog).unwrap();
        let listed = snapshot.list(&|_| None);
        cold.push(t.elapsed());
        assert_eq!(listed.len(), n * 3);
        keep = Some(snapshot);
    }
    let snapshot = keep.unwrap();
    let rss_after_kib = rss_kib();
    let mut warm = Vec::new();
    let mut tools = 0;
    for _ in 0..100 {
        let t = Instant::now();
        tools = snapshot.list(&|_| None).len();
        warm.push(t.elapsed());
    }
    Listing { cold: median(cold), warm: median(warm), tools, rss_before_kib, rss_after_kib }
}

fn runtime(config: &Config, store: Arc<dyn StepStore>, cache: &Path) -> Runtime {
    let catalog = Arc::new(toolgate::host::catalog(config).unwrap());
    let snapshot = ExecutableAgentSnapshot::build(config, "default", catalog).unwrap();
    let executor =
        Arc::new(Executor::new(ExecutorSettings::new(config.limits.clone(), Some(cache.to_owned()))).unwrap());
    Runtime::new(snapshot, executor, store, toolgate::RuntimeSettings::of(config))
}

struct FirstCalls {
    never_compiled: Duration,
    disk_cached: Duration,
    warm: Duration,
}

/// First call of a never-compiled component, of a disk-cached one (new
/// executor, cache present), and a warm call (same executor).
fn first_calls(rt: &tokio::runtime::Runtime, host: &Host) -> FirstCalls {
    let args = json!({"text": "hello"});
    let (mut never, mut cached, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..5 {
        let cache = host.dir.path().join(format!("fresh-cache-{i}"));
        let r = runtime(&host.config, Arc::new(toolgate::MemoryJournal::new()), &cache);
        let run = rt.block_on(r.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
        let t = Instant::now();
        assert_upper(&rt.block_on(run.call(TOOL, args.clone())).unwrap());
        never.push(t.elapsed());
        // The first call ran on Winch's code; Cranelift's, compiled behind it, fills the cache.
        rt.block_on(r.executor().settle());
        let r = runtime(&host.config, Arc::new(toolgate::MemoryJournal::new()), &cache);
        let run = rt.block_on(r.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
        let t = Instant::now();
        assert_upper(&rt.block_on(run.call(TOOL, args.clone())).unwrap());
        cached.push(t.elapsed());
        assert_eq!(r.executor().compilations(), 0, "loaded from the disk cache");
        for _ in 0..20 {
            let t = Instant::now();
            assert_upper(&rt.block_on(run.call(TOOL, args.clone())).unwrap());
            warm.push(t.elapsed());
        }
    }
    FirstCalls { never_compiled: median(never), disk_cached: median(cached), warm: median(warm) }
}

/// Per-call latencies of `n` sequential calls on a current-thread runtime, after a warm-up.
fn sequential(rt: &tokio::runtime::Runtime, n: usize, task: &Task) -> Vec<Duration> {
    rt.block_on(task(200));
    let mut out = rt.block_on(task(n));
    out.sort();
    out
}

#[derive(Clone, Copy)]
struct Point {
    concurrency: usize,
    calls_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

/// A task making `n` calls and returning their latencies.
type Task =
    Arc<dyn Fn(usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Duration>> + Send>> + Send + Sync>;

/// `total` calls by `c` concurrent tasks on a 2-worker runtime; per-call latencies and throughput.
fn concurrent(c: usize, total: usize, task: Task, rss_peak: Option<&std::sync::atomic::AtomicU64>) -> Point {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let per_task = total / c;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = rss_peak.map(|_| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib());
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        })
    });
    let (elapsed, mut lat) = rt.block_on(async {
        task(100).await; // warm-up
        let t = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..c {
            set.spawn(task(per_task));
        }
        let mut all = Vec::with_capacity(total);
        while let Some(l) = set.join_next().await {
            all.extend(l.unwrap());
        }
        (t.elapsed(), all)
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let (Some(s), Some(peak)) = (sampler, rss_peak) {
        peak.store(s.join().unwrap(), std::sync::atomic::Ordering::Relaxed);
    }
    lat.sort();
    Point {
        concurrency: c,
        calls_per_sec: lat.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
    }
}

/// `n` bare instantiate+calls.
fn bare_task(b: Arc<Bare>) -> Task {
    Arc::new(move |n| {
        let b = b.clone();
        Box::pin(async move {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let s = Instant::now();
                std::hint::black_box(b.call(TOOL, ARGS).await);
                lat.push(s.elapsed());
            }
            lat
        })
    })
}

/// One run making `n` calls through the full path (an agent run calls many times).
fn toolgate_task(r: Arc<Runtime>) -> Task {
    Arc::new(move |n| {
        let r = r.clone();
        Box::pin(async move {
            let run = r.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let s = Instant::now();
                assert_upper(&run.call(TOOL, json!({"text": "hello"})).await.unwrap());
                lat.push(s.elapsed());
            }
            lat
        })
    })
}

fn svg(series: &[(&str, &str, Vec<Point>)]) -> String {
    // Two panels, log2 x axis (concurrency); left: calls/s, right: p50 latency (µs).
    let (w, h, pad) = (420.0, 300.0, 50.0);
    let x = |c: usize| pad + (c as f64).log2() / 6.0 * (w - 2.0 * pad);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        2.0 * w,
        h + 40.0
    );
    type Panel = (&'static str, fn(&Point) -> f64);
    let panels: [Panel; 2] = [("calls per second", |p| p.calls_per_sec), ("p50 latency per call (µs)", |p| us(p.p50))];
    for (k, (title, value)) in panels.iter().enumerate() {
        let ox = k as f64 * w;
        let max = series.iter().flat_map(|s| s.2.iter().map(value)).fold(1.0, f64::max) * 1.1;
        let y = |v: f64| h - pad + 10.0 - v / max * (h - 2.0 * pad);
        out += &format!("<text x=\"{}\" y=\"20\" font-size=\"13\">{title}</text>\n", ox + pad);
        out += &format!(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/><line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{1}\" stroke=\"black\"/>\n",
            ox + pad,
            y(0.0),
            ox + w - pad,
            y(max)
        );
        for c in CONCURRENCY {
            out += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{c}</text>\n", ox + x(c), y(0.0) + 15.0);
        }
        out += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">concurrency</text>\n",
            ox + w / 2.0,
            y(0.0) + 30.0
        );
        for f in [0.0, 0.5, 1.0] {
            out += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}</text>\n",
                ox + pad - 4.0,
                y(max * f / 1.1) + 4.0,
                max * f / 1.1
            );
        }
        for (i, (name, color, points)) in series.iter().enumerate() {
            let pts: Vec<String> =
                points.iter().map(|p| format!("{:.1},{:.1}", ox + x(p.concurrency), y(value(p)))).collect();
            out += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
                pts.join(" ")
            );
            if k == 0 {
                out += &format!(
                    "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>\n",
                    ox + pad + 10.0,
                    40.0 + i as f64 * 14.0
                );
            }
        }
    }
    out + "</svg>\n"
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and friends: nothing to list here.
    }
    let target =
        PathBuf::from(std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "../target".into())).join("scale");
    std::fs::create_dir_all(&target).unwrap();

    // Listing first, while the process holds nothing else.
    let rss_start = rss_kib();
    let l200 = listing(&target.join("dir200"), 200);
    generate(&target.join("dir20"), 20);

    let rt = common::tokio_rt();
    let host = Host::new(&rt);
    let first = first_calls(&rt, &host);

    // Latency distribution, sequential, against bare wasmtime on the same component.
    let bare = Arc::new(Bare::new(&packed(guests::TEXT), host.dir.path()));
    let bare_lat = sequential(&rt, 5000, &bare_task(bare.clone()));
    let mem = Arc::new(host.runtime("default", Arc::new(toolgate::MemoryJournal::new())));
    let full_lat = sequential(&rt, 5000, &toolgate_task(mem));

    // Throughput against concurrency: bare, in-memory commit, durable commit.
    let mut series: Vec<(&str, &str, Vec<Point>)> = Vec::new();
    let rss_64 = std::sync::atomic::AtomicU64::new(0);
    let mut bare_points = Vec::new();
    let mut mem_points = Vec::new();
    let mut durable_points = Vec::new();
    let mut groups = Vec::new();
    for c in CONCURRENCY {
        bare_points.push(concurrent(c, 8192, bare_task(bare.clone()), None));
        let r = Arc::new(host.runtime("default", Arc::new(toolgate::MemoryJournal::new())));
        mem_points.push(concurrent(c, 8192, toolgate_task(r), (c == 64).then_some(&rss_64)));
        let journal = Arc::new(SqliteJournal::open(&host.dir.path().join(format!("durable-{c}.db"))).unwrap());
        let r = Arc::new(host.runtime("default", journal.clone()));
        durable_points.push(concurrent(c, 4096, toolgate_task(r), None));
        let (g, s) = journal.group_commits();
        groups.push(s as f64 / g.max(1) as f64);
    }
    series.push(("bare wasmtime", "#888888", bare_points.clone()));
    series.push(("toolgate, in-memory commit", "#1f77b4", mem_points.clone()));
    series.push(("toolgate, durable commit", "#d62728", durable_points.clone()));
    std::fs::write(target.join("concurrency.svg"), svg(&series)).unwrap();

    // The table.
    let (bp50, bp99) = (pct(&bare_lat, 0.5), pct(&bare_lat, 0.99));
    let (fp50, fp99) = (pct(&full_lat, 0.5), pct(&full_lat, 0.99));
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!("| measurement | value | target |");
    println!("|---|---:|---|");
    println!(
        "| list 200 components, cold (load + check + filter + list, metadata only; median of 10) | {:.1} ms | ≤ 50 ms: {} |",
        ms(l200.cold),
        verdict(ms(l200.cold) <= 50.0)
    );
    println!(
        "| list 200 components, warm (from the snapshot; median of 100) | {:.3} ms | ≤ 5 ms: {} |",
        ms(l200.warm),
        verdict(ms(l200.warm) <= 5.0)
    );
    println!("| tools listed / compilations while listing | {} / 0 | no compilation |", l200.tools);
    println!("| first call, never compiled (median of 5) | {:.1} ms | |", ms(first.never_compiled));
    println!(
        "| first call, disk-cached (new executor; median of 5) | {:.3} ms | ≤ 2 ms: {} |",
        ms(first.disk_cached),
        verdict(ms(first.disk_cached) <= 2.0)
    );
    println!("| warm call (median of 100) | {:.1} µs | |", us(first.warm));
    println!(
        "| bare wasmtime instantiate+call p50 / p99 (5000 sequential) | {:.1} / {:.1} µs | baseline |",
        us(bp50),
        us(bp99)
    );
    println!("| full path, in-memory commit p50 / p99 (5000 sequential) | {:.1} / {:.1} µs | |", us(fp50), us(fp99));
    println!(
        "| full path p50 ÷ bare p50 | {:.2}× | ≤ 1.1×: {} |",
        us(fp50) / us(bp50),
        verdict(us(fp50) / us(bp50) <= 1.1)
    );
    println!("| full path p99 ÷ bare p99 | {:.2}× | |", us(fp99) / us(bp99));
    for (i, c) in CONCURRENCY.iter().enumerate() {
        println!(
            "| calls/s at concurrency {c}: bare / in-memory / durable (avg steps per fsync) | {:.0} / {:.0} / {:.0} ({:.1}) | |",
            bare_points[i].calls_per_sec, mem_points[i].calls_per_sec, durable_points[i].calls_per_sec, groups[i]
        );
    }
    for (i, c) in CONCURRENCY.iter().enumerate() {
        if *c == 1 || *c == 64 {
            let ratio = bare_points[i].calls_per_sec / mem_points[i].calls_per_sec;
            println!(
                "| time per call at concurrency {c}, in-memory ÷ bare (calls/s inverted) | {ratio:.2}× | ≤ 1.1×: {} |",
                verdict(ratio <= 1.1)
            );
        }
    }
    let best_mem = mem_points.iter().map(|p| p.calls_per_sec).fold(0.0, f64::max);
    let best_durable = durable_points.iter().map(|p| p.calls_per_sec).fold(0.0, f64::max);
    println!("| best calls/s, in-memory commit | {best_mem:.0} | ≥ 10,000: {} |", verdict(best_mem >= 10_000.0));
    println!("| best calls/s, durable commit | {best_durable:.0} | ≥ 2,000: {} |", verdict(best_durable >= 2_000.0));
    let rss200 = l200.rss_after_kib as f64 / 1024.0;
    println!(
        "| host RSS with 200 components listed (process start {:.1} MiB) | {rss200:.1} MiB | ≤ 60 MB: {} |",
        rss_start as f64 / 1024.0,
        verdict(rss200 * 1.048_576 <= 60.0)
    );
    let rss64 = rss_64.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0;
    println!(
        "| host RSS peak with 64 calls in flight (bench process, baseline engine loaded too) | {rss64:.1} MiB | |"
    );

    let results = json!({
        "list200": {"cold_ms": ms(l200.cold), "warm_ms": ms(l200.warm), "tools": l200.tools,
                     "rss_before_mib": l200.rss_before_kib as f64 / 1024.0, "rss_after_mib": rss200},
        "first_call": {"never_compiled_ms": ms(first.never_compiled), "disk_cached_ms": ms(first.disk_cached), "warm_us": us(first.warm)},
        "latency_us": {"bare_p50": us(bp50), "bare_p99": us(bp99), "full_p50": us(fp50), "full_p99": us(fp99)},
        "concurrency": CONCURRENCY.iter().enumerate().map(|(i, c)| json!({
            "concurrency": c,
            "bare_calls_per_sec": bare_points[i].calls_per_sec,
            "memory_calls_per_sec": mem_points[i].calls_per_sec, "memory_p50_us": us(mem_points[i].p50), "memory_p99_us": us(mem_points[i].p99),
            "durable_calls_per_sec": durable_points[i].calls_per_sec, "durable_p50_us": us(durable_points[i].p50), "durable_p99_us": us(durable_points[i].p99),
            "durable_steps_per_commit": groups[i],
        })).collect::<Vec<Value>>(),
        "rss_64_in_flight_mib": rss64,
    });
    std::fs::write(target.join("results.json"), serde_json::to_string_pretty(&results).unwrap()).unwrap();
    eprintln!("wrote {}/results.json and concurrency.svg", target.display());
}
