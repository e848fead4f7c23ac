//! The cost of toolgate's call path against bare wasmtime, in one run.
//!
//! `cargo bench -p toolgate-tests --bench call_path` (or `scripts/bench`, which
//! also prints the table of BENCHMARKS.md).
//!
//! - `bare_wasmtime/instantiate_call`: the least a sandboxed host can do with
//!   the same engine settings as `toolgate::Executor` (pooling allocator, epoch
//!   interruption, component model, WASI p2 deny-by-default, `InstancePre`
//!   built once): per call a fresh `Store` with a memory limiter, an epoch
//!   deadline that traps (the cheapest deadline wasmtime offers; the host's
//!   yield-per-tick plus a tokio timeout is host overhead), instantiate,
//!   `call("text.upper", …)`.
//! - `toolgate/full_path_*`: `Run::call` through snapshot, filter, argument
//!   validation, gate, executor and the Step commit, on the same component;
//!   with the in-memory journal of `store = ":memory:"` (`MemoryJournal`),
//!   SQLite in memory (the same SQL as the file journal, no fsync) and the
//!   durable journal (WAL, `synchronous=FULL`).
//! - `gate/*`: the permission decision with 100 rules.
//! - `steps/*`: the sub-steps of the full path, to see where its time goes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use toolgate::config::AgentConfig;
use toolgate::policy::gate::{self, GateOutcome, ToolCall, ToolPermissionVerdict};
use toolgate::policy::{Behavior, Policy, RuleSpec};
use toolgate::store::{
    AskScope, AwaitingRecord, ClaimedTicket, CommitError, NewStep, OutcomeKind, PriorAsk, RunInfo, RunRecord,
    StateChange, StepRecord, StepStore, TicketError, Verdict,
};
use toolgate::{Catalog, ExecutableAgentSnapshot, SqliteJournal, ToolCapabilityNarrowing};
use toolgate_tests::{guests, packed};

mod common;

/// The allocator the `toolgate` binary ships with (`host/cli/src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use common::{ARGS, Bare, Host, TOOL, assert_upper, tokio_rt, wit_types};

/// A store that keeps nothing: `steps/full_path_null_store` measures the
/// runtime's own work (ids, filter, validation, gate, executor, result
/// handling) without SQLite.
struct NullStore(std::sync::atomic::AtomicI64);

#[async_trait::async_trait]
impl StepStore for NullStore {
    async fn begin_run(&self, _: &RunRecord<'_>) -> Result<(), CommitError> {
        Ok(())
    }
    async fn commit_step(
        &self,
        step: &NewStep<'_>,
        _: &[StateChange],
        _: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
        std::hint::black_box(step);
        Ok(self.0.fetch_add(1, Ordering::Relaxed))
    }
    async fn run(&self, _: &str) -> Result<Option<RunInfo>, CommitError> {
        Ok(None)
    }
    async fn claim_ticket(&self, id: &str, _: i64, _: &str) -> Result<Result<ClaimedTicket, TicketError>, CommitError> {
        Ok(Err(TicketError::Unknown(id.to_owned())))
    }
    async fn heartbeat(&self, _: &str, _: i64) -> Result<(), CommitError> {
        Ok(())
    }
    async fn resolve_ticket(
        &self,
        _: ClaimedTicket,
        _: &NewStep<'_>,
        _: &[StateChange],
        _: bool,
    ) -> Result<Result<i64, TicketError>, CommitError> {
        unreachable!("no tickets in this benchmark")
    }
    async fn take_over_stale_claims(
        &self,
        _: &str,
        _: i64,
        _: i64,
        _: Option<&str>,
    ) -> Result<Vec<ClaimedTicket>, CommitError> {
        Ok(Vec::new())
    }
    async fn prior_ask(&self, _: AskScope<'_>, _: &str, _: &str) -> Result<Option<PriorAsk>, CommitError> {
        Ok(None)
    }
    async fn deliver(&self, _: &str, _: &NewStep<'_>) -> Result<Option<i64>, CommitError> {
        Ok(None)
    }
    async fn tool_state(&self, _: &str, _: &str) -> Result<BTreeMap<String, String>, CommitError> {
        Ok(BTreeMap::new())
    }
    async fn steps(&self, _: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        Ok(Vec::new())
    }
    async fn awaiting(&self, _: &str) -> Result<Option<AwaitingRecord>, CommitError> {
        Ok(None)
    }
    async fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError> {
        Ok(Vec::new())
    }
}

// ---------------------------------------------------------------------------
// 100 permission rules, as an agent with file, HTTP, git, shell, notes and
// MCP tools might configure them.

fn hundred_rules() -> Vec<RuleSpec> {
    let mut rules: Vec<(String, Behavior)> = Vec::new();
    let mut add = |p: &str, b: Behavior| rules.push((p.to_owned(), b));
    use Behavior::{Allow, Ask, Deny};
    // Deny rules (checked first).
    add("fs.read(secrets/**)", Deny);
    add("fs.read(**/.env)", Deny);
    add("fs.read(**/*.pem)", Deny);
    add("fs.write(path ~ \"/etc/**\")", Deny);
    add("shell.exec(cmd ~ \"rm -rf*\")", Deny);
    add("shell.exec(argv[*] ~ \"--force*\")", Deny);
    add("http.fetch(url ~ \"http://**\")", Deny);
    add("git.push(force = true)", Deny);
    add("mcp__github__delete_*", Deny);
    add("text.repeat", Deny);
    // File tools: primary-argument globs.
    for d in ["data", "docs", "src", "tests", "examples", "notes", "reports", "assets"] {
        add(&format!("fs.read({d}/**)"), Allow);
        add(&format!("fs.list({d}/**)"), Allow);
        add(&format!("fs.write({d}/tmp/**)"), Ask);
    }
    add("fs.write(out/**)", Allow);
    add("fs.write(path ~ \"build/**\", mode = \"append\")", Allow);
    add("fs.delete", Ask);
    // HTTP: conditions on the URL and method.
    for host in ["api.github.com", "api.example.com", "pypi.org", "crates.io", "docs.rs", "registry.npmjs.org"] {
        add(&format!("http.fetch(url ~ \"https://{host}/**\", method = \"GET\")"), Allow);
        add(&format!("http.fetch(url ~ \"https://{host}/**\", method = \"POST\")"), Ask);
    }
    // An ask is a floor (invariant 12): a bare `http.fetch` ask would cover the
    // allows above, so the catch-all asks only for the methods that change state.
    add("http.fetch(method = \"PUT\")", Ask);
    add("http.fetch(method = \"DELETE\")", Ask);
    // git and shell.
    for op in ["status", "diff", "log", "show", "blame", "branch"] {
        add(&format!("git.{op}"), Allow);
    }
    add("git.commit", Ask);
    add("git.push", Ask);
    add("shell.exec(cmd ~ \"cargo *\")", Ask);
    add("shell.exec(cmd ~ \"ls*\")", Allow);
    add("shell.exec", Ask);
    // Notes and other state-changing tools.
    add("notes(op = \"list\")", Allow);
    add("notes(op = \"add\")", Ask);
    add("notes(op = \"clear\")", Ask);
    add("notes(op != \"list\", tags[*] ~ \"private*\")", Deny);
    add("calendar.read", Allow);
    add("calendar.create(attendees[*] ~ \"*@example.com\")", Allow);
    add("calendar.*", Ask);
    // MCP servers: id globs.
    for server in ["github", "slack", "linear", "jira", "sentry"] {
        add(&format!("mcp__{server}__get_*"), Allow);
        add(&format!("mcp__{server}__list_*"), Allow);
        add(&format!("mcp__{server}__*"), Ask);
    }
    // Pure tools and catch-alls.
    add("text.*", Allow);
    add("math.*", Allow);
    add("time.now", Allow);
    add("skill.?", Ask);
    while rules.len() < 100 {
        let i = rules.len();
        rules.push((format!("plugin{i}.tool(arg{i} ~ \"value{i}/**\")"), Behavior::Ask));
    }
    rules.truncate(100);
    rules.into_iter().map(|(pattern, behavior)| RuleSpec { pattern, behavior }).collect()
}

// ---------------------------------------------------------------------------

fn benches(c: &mut Criterion) {
    let rt = tokio_rt();
    let host = Host::new(&rt);

    // Bare wasmtime.
    {
        let bare = Bare::new(&packed(guests::TEXT), host.dir.path());
        let out = rt.block_on(bare.call(TOOL, ARGS));
        assert!(matches!(&out.content, wit_types::Content::Json(s) if s == "\"HELLO\""));
        let mut g = c.benchmark_group("bare_wasmtime");
        g.bench_function("instantiate_call", |b| {
            b.to_async(&rt).iter(|| async { std::hint::black_box(bare.call(TOOL, ARGS).await) })
        });
        g.finish();
    }

    // The full toolgate path, with the in-memory journals and a durable one.
    {
        let mut g = c.benchmark_group("toolgate");
        for (name, store) in [
            ("full_path_in_memory_commit", Arc::new(toolgate::MemoryJournal::new()) as Arc<dyn StepStore>),
            ("full_path_sqlite_in_memory_commit", Arc::new(SqliteJournal::in_memory().unwrap())),
            ("full_path_durable_commit", host.durable_journal("durable.db")),
        ] {
            let runtime = host.runtime("default", store);
            let run = rt.block_on(runtime.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
            // Warm: loads the component from the cache into this executor.
            assert_upper(&rt.block_on(run.call(TOOL, json!({"text": "hello"}))).unwrap());
            assert_eq!(runtime.executor().compilations(), 0, "loaded from the cache, not compiled");
            g.bench_function(name, |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let run = &run;
                    async move {
                        // The arguments are made before the clock starts, as bare's are
                        // (a static string): what is timed is the call, not the bench's
                        // building of its input. The call consumes and drops them. Made
                        // 16 at a time, just before their calls: all of a sample's made
                        // at once would be cold in the cache when read.
                        let mut timed = Duration::ZERO;
                        let mut left = iters;
                        while left > 0 {
                            let n = left.min(16);
                            let args: Vec<_> = (0..n).map(|_| json!({"text": "hello"})).collect();
                            let t = std::time::Instant::now();
                            for a in args {
                                std::hint::black_box(run.call(TOOL, a).await.unwrap());
                            }
                            timed += t.elapsed();
                            left -= n;
                        }
                        timed
                    }
                })
            });
        }
        g.finish();
    }

    // Side by side with bare: the full path (and, to see where its time
    // goes, the executor alone and the path with a store that keeps
    // nothing), alternating with bare in blocks of 16 calls within every
    // sample, so both see the machine at the same moment. Criterion's
    // medians of the groups above come from runs seconds apart; on this VM
    // their ratio moves by ±0.1 between runs, more than what is being
    // measured. A paired ratio is each sample's time over its bare time;
    // criterion's figure here is the per-call time measured while interleaved.
    {
        let bare = Bare::new(&packed(guests::TEXT), host.dir.path());
        let runtime = host.runtime("default", Arc::new(toolgate::MemoryJournal::new()));
        let run = rt.block_on(runtime.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
        assert_upper(&rt.block_on(run.call(TOOL, json!({"text": "hello"}))).unwrap());
        let null = host.runtime("default", Arc::new(NullStore(Default::default())));
        let null_run = rt.block_on(null.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
        assert_upper(&rt.block_on(null_run.call(TOOL, json!({"text": "hello"}))).unwrap());
        let executor = runtime.executor().clone();
        let candidate = runtime.snapshot().candidate(TOOL, &|_| None).unwrap();
        let call = ToolCall { call_id: "call-1".into(), tool_id: TOOL.into(), arguments: json!({"text": "hello"}) };
        let GateOutcome::Execute(allowed) = GateOutcome::decide(runtime.snapshot(), &candidate, &call) else {
            unreachable!()
        };
        let mut g = c.benchmark_group("paired");
        let (run, null_run, allowed, executor) = (&run, &null_run, &allowed, &executor);
        paired(&mut g, &rt, &bare, "full path", "full_path_in_memory_commit_with_bare", move |a| async move {
            std::hint::black_box(run.call(TOOL, a).await.unwrap());
        });
        paired(&mut g, &rt, &bare, "executor alone", "executor_execute_with_bare", move |_| async move {
            std::hint::black_box(executor.execute(allowed, Default::default()).await.unwrap());
        });
        paired(&mut g, &rt, &bare, "full path, null store", "full_path_null_store_with_bare", move |a| async move {
            std::hint::black_box(null_run.call(TOOL, a).await.unwrap());
        });
        g.finish();
    }

    // The gate with 100 rules.
    {
        let rules = hundred_rules();
        let policy = Policy::new(&rules, Behavior::Deny).unwrap();
        let mut g = c.benchmark_group("gate");
        // A typical file read: deny rules with primary globs, then the allow on data/**.
        let args = json!({"path": "data/reports/2024/q1.csv"});
        assert_eq!(policy.evaluate("fs.read", Some("path"), &args).behavior, Behavior::Allow);
        g.bench_function("evaluate_100_rules", |b| {
            b.iter(|| policy.evaluate(std::hint::black_box("fs.read"), Some("path"), std::hint::black_box(&args)))
        });
        // An HTTP call decided by conditions on two fields.
        let http = json!({"url": "https://api.github.com/repos/o/r/issues", "method": "GET", "headers": {"accept": "application/json"}});
        assert_eq!(policy.evaluate("http.fetch", Some("url"), &http).behavior, Behavior::Allow);
        g.bench_function("evaluate_100_rules_conditions", |b| {
            b.iter(|| policy.evaluate(std::hint::black_box("http.fetch"), Some("url"), std::hint::black_box(&http)))
        });

        // gate::decide on text.upper through a snapshot whose agent has the 100 rules.
        let mut config = host.config.clone();
        let mut agent: AgentConfig = config.agents["default"].clone();
        agent.visible = vec!["*".into()];
        agent.rules = rules;
        config.agents.insert("rules100".into(), agent);
        let catalog = Arc::new(Catalog::load(&config.plugins).unwrap());
        let snapshot = ExecutableAgentSnapshot::build(&config, "rules100", catalog).unwrap();
        let candidate = snapshot.candidate(TOOL, &|_| None).unwrap();
        let call = ToolCall { call_id: "call-1".into(), tool_id: TOOL.into(), arguments: json!({"text": "hello"}) };
        assert_eq!(gate::decide(&snapshot, &candidate, &call), ToolPermissionVerdict::Allow);
        g.bench_function("decide_100_rules", |b| {
            b.iter(|| gate::decide(std::hint::black_box(&snapshot), &candidate, std::hint::black_box(&call)))
        });
        g.finish();
    }

    // Sub-steps of the full path.
    steps(c, &rt, &host);
}

/// Bench `call` (given its arguments, made before the clock starts, as
/// bare's are a static string) alternating with bare wasmtime in blocks of
/// 16 calls within every sample; prints the median of the samples' ratios
/// (`paired: WHAT / bare = …`, which `scripts/bench` reads).
fn paired<F, Fut>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    bare: &Bare,
    what: &str,
    name: &str,
    call: F,
) where
    F: Fn(serde_json::Value) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    const BLOCK: u64 = 16;
    let ratios = std::sync::Mutex::new(Vec::new());
    g.bench_function(name, |b| {
        b.to_async(rt).iter_custom(|iters| {
            let (call, ratios) = (&call, &ratios);
            async move {
                let (mut this_t, mut bare_t) = (Duration::ZERO, Duration::ZERO);
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BLOCK);
                    let t = std::time::Instant::now();
                    for _ in 0..n {
                        std::hint::black_box(bare.call(TOOL, ARGS).await);
                    }
                    bare_t += t.elapsed();
                    let args: Vec<_> = (0..n).map(|_| json!({"text": "hello"})).collect();
                    let t = std::time::Instant::now();
                    for a in args {
                        call(a).await;
                    }
                    this_t += t.elapsed();
                    left -= n;
                }
                if iters >= BLOCK {
                    ratios.lock().unwrap().push((this_t.as_secs_f64() / bare_t.as_secs_f64(), bare_t / iters as u32));
                }
                this_t
            }
        })
    });
    // The warm-up's samples are in too; criterion's are the last ones.
    let mut all = ratios.into_inner().unwrap();
    let samples = all.len().min(config_samples());
    let mut last: Vec<(f64, Duration)> = all.split_off(all.len() - samples);
    if !last.is_empty() {
        last.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (ratio, bare_per_call) = last[last.len() / 2];
        println!(
            "paired: {what} / bare = {ratio:.3}× (median of {} samples; quartiles {:.3}× – {:.3}×; bare {:.2} µs per call in the median sample)",
            last.len(),
            last[last.len() / 4].0,
            last[last.len() * 3 / 4].0,
            bare_per_call.as_secs_f64() * 1e6
        );
    }
}

fn steps(c: &mut Criterion, rt: &tokio::runtime::Runtime, host: &Host) {
    let memory: Arc<dyn StepStore> = Arc::new(toolgate::MemoryJournal::new());
    let runtime = host.runtime("default", memory.clone());
    let snapshot = runtime.snapshot().clone();
    let executor = runtime.executor().clone();
    let args = json!({"text": "hello"});
    let mut g = c.benchmark_group("steps");

    g.bench_function("candidate", |b| {
        b.iter(|| snapshot.candidate(std::hint::black_box(TOOL), &|d| executor.unhealthy(d)).unwrap())
    });
    let candidate = snapshot.candidate(TOOL, &|_| None).unwrap();
    g.bench_function("validate_arguments", |b| {
        b.iter(|| candidate.installed.tool.validate_arguments(std::hint::black_box(&args)).unwrap())
    });
    g.bench_function("new_id", |b| b.iter(|| toolgate::runtime::new_id("call")));
    g.bench_function("tool_state_in_memory", |b| {
        b.to_async(rt).iter(|| async { memory.tool_state("default", TOOL).await.unwrap() })
    });

    // The executor alone (instantiate + call + output conversion).
    let call = ToolCall { call_id: "call-1".into(), tool_id: TOOL.into(), arguments: args.clone() };
    let one = match GateOutcome::decide(&snapshot, &candidate, &call) {
        GateOutcome::Execute(a) => a,
        _ => unreachable!(),
    };
    let exec = rt.block_on(executor.execute(&one, Default::default())).unwrap();
    assert!(exec.result.is_ok(), "{:?}", exec.result);
    g.bench_function("executor_execute", |b| {
        b.to_async(rt)
            .iter(|| async { std::hint::black_box(executor.execute(&one, Default::default()).await.unwrap()) })
    });

    // The whole path with a store that keeps nothing: the runtime without SQLite.
    let null = host.runtime("default", Arc::new(NullStore(Default::default())));
    let null_run = rt.block_on(null.start_run(None, ToolCapabilityNarrowing::Configured)).unwrap();
    assert_upper(&rt.block_on(null_run.call(TOOL, args.clone())).unwrap());
    g.bench_function("full_path_null_store", |b| {
        b.to_async(rt)
            .iter(|| async { std::hint::black_box(null_run.call(TOOL, json!({"text": "hello"})).await.unwrap()) })
    });

    // The Step commit alone, as `Run::call` makes it for an Output.
    let durable = host.durable_journal("steps.db");
    for (name, store) in [("commit_step_in_memory", &memory), ("commit_step_durable", &durable)] {
        rt.block_on(store.begin_run(&RunRecord {
            run_id: "run-bench",
            agent: "default",
            narrowing: "configured",
            restriction: None,
        }))
        .unwrap();
        g.bench_function(name, |b| {
            b.to_async(rt).iter(|| async {
                let call_id = toolgate::runtime::new_id("call");
                let arguments = args.to_string();
                let step = NewStep {
                    run_id: "run-bench",
                    agent: "default",
                    call_id: &call_id,
                    tool_id: TOOL,
                    arguments: &arguments,
                    verdict: Verdict::Allow,
                    outcome: OutcomeKind::Output,
                    result: "\"HELLO\"",
                    captured: r#"{"stdout":"","stderr":"","log":"","dropped":0}"#,
                    ticket: None,
                    structured: true,
                    approved_by: None,
                    state_read: None,
                    state_limit_kib: None,
                };
                store.commit_step(&step, &[], None).await.unwrap()
            })
        });
    }
    g.finish();
}

fn config_samples() -> usize {
    50
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(config_samples())
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
}

/// The response check (invariant 13): a 4 MiB response searched for 10
/// configured secrets in every encoding, as JSON with no escapes (one view)
/// and as JSON full of `\u`, `&`, `%` and `+` (all five views).
fn response_check(c: &mut Criterion) {
    use toolgate::sandbox::scan::SecretScanner;
    let secrets: Vec<(String, Vec<u8>)> =
        (0..10).map(|i| (format!("cred{i}"), format!("s3cr3t-{i}/+=-{i:08}-token").into_bytes())).collect();
    let scanner = SecretScanner::new(&secrets);
    let plain: Vec<u8> =
        "{\"id\":12345,\"title\":\"an ordinary issue title\",\"state\":\"open\"},".repeat(4 << 20 >> 6).into_bytes();
    let escaped: Vec<u8> = "{\"t\":\"caf\\u00e9 \\/ a&amp;b 50%25 a+b\"},".repeat(4 << 20 >> 5).into_bytes();
    assert!(scanner.find(&plain).is_none() && scanner.find(&escaped).is_none());
    let mut g = c.benchmark_group("boundary");
    g.bench_function("build_scanner_10_secrets", |b| b.iter(|| SecretScanner::new(std::hint::black_box(&secrets))));
    g.throughput(criterion::Throughput::Bytes(plain.len() as u64));
    g.bench_function("scan_4mib_10_secrets_plain", |b| b.iter(|| scanner.find(std::hint::black_box(&plain))));
    g.throughput(criterion::Throughput::Bytes(escaped.len() as u64));
    g.bench_function("scan_4mib_10_secrets_escaped", |b| b.iter(|| scanner.find(std::hint::black_box(&escaped))));
    g.finish();
}

criterion_group! { name = call_path; config = config(); targets = benches, response_check }
criterion_main!(call_path);
