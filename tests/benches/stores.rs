//! Durable stores side by side: calls per second, p50 and p99 of the full
//! path with the durable commit, at concurrency 1, 8 and 64, on
//!
//! - SQLite, one host (the embedded default: WAL, `synchronous = FULL`);
//! - PostgreSQL, one host;
//! - PostgreSQL, three hosts (three runtimes, each with its own executor,
//!   connection pool and committers, in this process; the concurrent runs
//!   are spread over them round-robin).
//!
//! and the writes per transaction (group commit). Every point makes the same
//! calls of `text.upper` on a 2-worker tokio runtime. Needs the server
//! `TOOLGATE_TEST_PG` names (`scripts/bench` starts one).
//!
//! `TOOLGATE_TEST_PG="host=… user=postgres" cargo bench -p toolgate-tests --bench stores`

mod common;

/// The allocator the `toolgate` binary ships with (`host/cli/src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Host, TOOL, assert_upper};
use serde_json::json;
use toolgate::store::postgres::PostgresJournal;
use toolgate::{Runtime, SqliteJournal, ToolCapabilityNarrowing};
use toolgate_tests::conformance::Postgres;

const CONCURRENCY: [usize; 3] = [1, 8, 64];
const CALLS: usize = 4096;

struct Point {
    calls_per_sec: f64,
    p50: Duration,
    p99: Duration,
    per_commit: f64,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `CALLS` calls by `c` concurrent runs spread over `hosts`.
async fn point(hosts: &[Arc<Runtime>], c: usize) -> (f64, Vec<Duration>) {
    let per_task = CALLS / c;
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..c {
        let r = hosts[i % hosts.len()].clone();
        set.spawn(async move {
            let run = r.start_run(None, ToolCapabilityNarrowing::Configured).await.unwrap();
            let mut lat = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let s = Instant::now();
                assert_upper(&run.call(TOOL, json!({"text": "hello"})).await.unwrap());
                lat.push(s.elapsed());
            }
            lat
        });
    }
    let mut all = Vec::with_capacity(CALLS);
    while let Some(l) = set.join_next().await {
        all.extend(l.unwrap());
    }
    let elapsed = t.elapsed();
    all.sort();
    (all.len() as f64 / elapsed.as_secs_f64(), all)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench --bench stores -- pg3-64`: only the legs whose key
    // (`sqlite1`, `pg1`, `pg3`, then `-CONCURRENCY`) contains the filter.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_default();
    let wanted = |store: &str, c: usize| format!("{store}-{c}").contains(&filter);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let host = Host::new(&common::tokio_rt());
    let mut rows: Vec<(String, usize, Point)> = Vec::new();
    rt.block_on(async {
        for c in CONCURRENCY {
            // SQLite, one host.
            if wanted("sqlite1", c) {
                let journal = Arc::new(SqliteJournal::open(&host.dir.path().join(format!("bench-{c}.db"))).unwrap());
                let r = Arc::new(host.runtime("default", journal.clone()));
                point(&[r.clone()], 8).await; // warm-up
                let before = journal.group_commits();
                let (cps, lat) = point(&[r], c).await;
                let after = journal.group_commits();
                let per_commit = (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64;
                rows.push((
                    "SQLite, 1 host".into(),
                    c,
                    Point { calls_per_sec: cps, p50: pct(&lat, 0.5), p99: pct(&lat, 0.99), per_commit },
                ));
            }

            // PostgreSQL, one and three hosts, each on a fresh database.
            for n in [1, 3] {
                if !wanted(&format!("pg{n}"), c) {
                    continue;
                }
                let Some((locator, _db)) = Postgres::fresh_database().await else {
                    eprintln!("PostgreSQL legs skipped: set TOOLGATE_TEST_PG");
                    break;
                };
                let mut journals = Vec::new();
                let mut hosts = Vec::new();
                for _ in 0..n {
                    let j = Arc::new(PostgresJournal::connect(&locator, None, 8, None).await.unwrap());
                    hosts.push(Arc::new(host.runtime("default", j.clone())));
                    journals.push(j);
                }
                point(&hosts, 8).await; // warm-up
                let before: Vec<_> = journals.iter().map(|j| j.group_commits()).collect();
                let (cps, lat) = point(&hosts, c).await;
                let (mut commits, mut writes) = (0, 0);
                for (j, b) in journals.iter().zip(before) {
                    let a = j.group_commits();
                    commits += a.0 - b.0;
                    writes += a.1 - b.1;
                }
                let per_commit = writes as f64 / commits.max(1) as f64;
                rows.push((
                    format!("PostgreSQL, {n} host{}", if n > 1 { "s" } else { "" }),
                    c,
                    Point { calls_per_sec: cps, p50: pct(&lat, 0.5), p99: pct(&lat, 0.99), per_commit },
                ));
            }
        }
    });
    println!("| store | concurrency | calls/s | p50 | p99 | writes per transaction |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (store, c, p) in &rows {
        println!(
            "| {store} | {c} | {:.0} | {:.0} µs | {:.0} µs | {:.1} |",
            p.calls_per_sec,
            p.p50.as_secs_f64() * 1e6,
            p.p99.as_secs_f64() * 1e6,
            p.per_commit
        );
    }
    let at =
        |store: &str, c: usize| rows.iter().find(|(s, cc, _)| s == store && *cc == c).map(|(_, _, p)| p.calls_per_sec);
    if let (Some(pg3), Some(sqlite)) = (at("PostgreSQL, 3 hosts", 64), at("SQLite, 1 host", 64)) {
        let r = pg3 / sqlite;
        println!(
            "\n3 hosts on PostgreSQL ÷ 1 host on SQLite at concurrency 64: {r:.2}× (target ≥ 2×: {})",
            if r >= 2.0 { "met" } else { "MISSED" }
        );
    }
}
