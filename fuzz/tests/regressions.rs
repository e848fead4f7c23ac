//! Replays every seed (`corpus/<target>/`) and every saved finding
//! (`regressions/<target>/`) through the fuzz targets' checks, on stable Rust:
//!
//! ```text
//! cargo test --manifest-path fuzz/Cargo.toml
//! ```
//!
//! A seed named `ok-*` must also be accepted, so the seeds keep reaching the code
//! past the first checks. `scripts/fuzz` copies each new finding into
//! `regressions/<target>/`; once toolgate is fixed it runs here on every test run.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// Findings not fixed in toolgate yet, as `target/file`: skipped by the per-target
/// tests and replayed by the ignored `pending_regressions` (expected to fail until
/// fixed; then remove the entry). Empty: no open finding.
const PENDING: &[&str] = &[];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files of `dir`, sorted; dot files (`.gitkeep`) and README files are not inputs.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.expect("read_dir entry").path())
        .filter(|p| p.is_file())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            !name.starts_with('.') && !name.starts_with("README")
        })
        .collect();
    out.sort();
    out
}

fn check(target: &str) -> fn(&[u8]) -> bool {
    toolgate_fuzz::TARGETS.iter().find(|(name, _)| *name == target).map(|(_, f)| *f).expect("known target")
}

/// Run `target` on `data`; `Err` with the panic message when it panics.
fn run(target: &str, data: &[u8]) -> Result<bool, String> {
    let f = check(target);
    catch_unwind(AssertUnwindSafe(|| f(data))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    })
}

fn pending(target: &str, file: &Path) -> bool {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    PENDING.contains(&format!("{target}/{name}").as_str())
}

/// Replay the corpus and the regressions of `target`; panic listing every failure.
fn replay(target: &str) {
    let seeds = files(&root().join("corpus").join(target));
    assert!(seeds.len() >= 3, "corpus/{target} has {} seeds", seeds.len());
    let found = files(&root().join("regressions").join(target));
    let mut failures = Vec::new();
    for file in seeds.iter().chain(&found) {
        if pending(target, file) {
            continue;
        }
        let data = std::fs::read(file).expect("read input");
        let name = file.strip_prefix(root()).unwrap_or(file).display().to_string();
        match run(target, &data) {
            Err(msg) => failures.push(format!("{name}: panicked: {msg}")),
            Ok(false) if file.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("ok-")) => {
                failures.push(format!("{name}: an ok- seed was refused"));
            }
            Ok(_) => {}
        }
    }
    // The generated seeds, also when they are not written out.
    for (t, name, data) in toolgate_fuzz::seeds::all() {
        if t != target {
            continue;
        }
        match run(target, &data) {
            Err(msg) => failures.push(format!("generated {name}: panicked: {msg}")),
            Ok(false) if name.starts_with("ok-") => failures.push(format!("generated {name}: refused")),
            Ok(_) => {}
        }
        if !root().join("corpus").join(target).join(&name).is_file() {
            failures.push(format!("generated seed corpus/{target}/{name} is missing; run the ignored `write_seeds`"));
        }
    }
    assert!(failures.is_empty(), "{target}: {} failures:\n{}", failures.len(), failures.join("\n"));
    println!("{target}: {} seeds and {} regressions replayed", seeds.len(), found.len());
}

#[test]
fn metadata() {
    replay("metadata");
}

#[test]
fn policy() {
    replay("policy");
}

#[test]
fn config() {
    replay("config");
}

#[test]
fn arguments() {
    replay("arguments");
}

#[test]
fn every_target_has_corpus_and_regressions_dirs() {
    for (target, _) in toolgate_fuzz::TARGETS {
        for dir in ["corpus", "regressions"] {
            assert!(root().join(dir).join(target).is_dir(), "{dir}/{target} is missing");
        }
    }
}

/// The open findings: each must still fail until toolgate is fixed.
#[test]
#[ignore = "open findings in PENDING; expected to fail until fixed"]
fn pending_regressions() {
    let mut fixed = Vec::new();
    for entry in PENDING {
        let (target, name) = entry.split_once('/').expect("target/file");
        let data = std::fs::read(root().join("regressions").join(target).join(name)).expect("pending file exists");
        if run(target, &data).is_ok() {
            fixed.push(*entry);
        }
    }
    assert!(fixed.is_empty(), "fixed now, remove from PENDING: {fixed:?}");
}

/// Write `corpus/metadata/ok-demo-NAME.wasm` for every packed demo Tool in
/// `demo/plugins/` (made by `scripts/demo`): a small component carrying the real
/// metadata of that Tool (the packed files are ~200 KiB; the fuzzer caps inputs at
/// 64 KiB). Run by hand:
/// `cargo test --manifest-path fuzz/Cargo.toml -- --ignored write_demo_seeds`.
#[test]
#[ignore = "writes files from demo/plugins; run by hand"]
fn write_demo_seeds() {
    let plugins = root().join("../demo/plugins");
    let mut written = 0;
    for file in files(&plugins) {
        let Some(stem) = file.file_stem().and_then(|s| s.to_str()) else { continue };
        let bytes = std::fs::read(&file).expect("read plugin");
        let tools = toolgate::catalog::descriptor::read_metadata(&bytes).expect("a packed demo Tool");
        let doc = toolgate_sdk::metadata::ComponentMetadata::new(tools.iter().map(|t| t.metadata.clone()).collect());
        let bare = toolgate_fuzz::seeds::component(&[], Some(toolgate_fuzz::seeds::TOOL_EXPORT));
        let slim = toolgate::catalog::descriptor::embed_metadata(&bare, &doc).expect("embed");
        std::fs::write(root().join("corpus/metadata").join(format!("ok-demo-{stem}.wasm")), slim).expect("write");
        written += 1;
    }
    assert!(written > 0, "no packed Tools in {}; run scripts/demo first", plugins.display());
}

/// Write the generated seeds into `corpus/`:
/// `cargo test --manifest-path fuzz/Cargo.toml -- --ignored write_seeds`.
#[test]
#[ignore = "writes files; run by hand after changing src/seeds.rs"]
fn write_seeds() {
    for (target, name, data) in toolgate_fuzz::seeds::all() {
        let dir = root().join("corpus").join(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        std::fs::write(dir.join(name), data).expect("write seed");
    }
}
