//! Where `toolgate serve`'s per-call time goes (BENCHMARKS.md, "The missed
//! target"): the same in-memory call awaited on the thread that drives the
//! runtime, a bare `tokio::spawn` + join, and the call inside a spawned task (as
//! rmcp runs each request), 5000 of each.
//!
//! `cargo run --release -p toolgate --example serve_probe -- target/scale/dir20/toolgate.toml`
//! (the directory the `scale` bench generates).

use std::sync::Arc;
use std::time::Instant;

use toolgate::{
    Config, ExecutableAgentSnapshot, Executor, ExecutorSettings, Runtime, SqliteJournal, ToolCapabilityNarrowing,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).ok_or_else(|| anyhow::anyhow!("usage: serve_probe CONFIG"))?;
    let config = Config::load(std::path::Path::new(&path))?;
    let catalog = Arc::new(toolgate::host::catalog(&config)?);
    let snapshot = ExecutableAgentSnapshot::build(&config, "default", catalog)?;
    let executor = Arc::new(Executor::new(ExecutorSettings::new(config.limits.clone(), Some(config.cache.clone())))?);
    let rt = Arc::new(Runtime::new(
        snapshot,
        executor,
        Arc::new(SqliteJournal::in_memory()?),
        toolgate::RuntimeSettings::default(),
    ));
    let call = |rt: Arc<Runtime>| async move {
        let run = rt.start_run(None, ToolCapabilityNarrowing::Configured).await?;
        run.call("text.upper", serde_json::json!({"text": "hello"})).await?;
        anyhow::Ok(())
    };
    call(rt.clone()).await?; // compile or load from the cache
    let n = 5000;
    for what in ["call awaited directly", "tokio::spawn + join of nothing", "call inside tokio::spawn"] {
        let t = Instant::now();
        for _ in 0..n {
            match what {
                "call awaited directly" => call(rt.clone()).await?,
                "tokio::spawn + join of nothing" => tokio::spawn(async { std::hint::black_box(()) }).await?,
                _ => tokio::spawn(call(rt.clone())).await??,
            };
        }
        println!("{what}: {:.1} µs", t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    Ok(())
}
