//! Scaffold: `toolgate new` and `toolgate build`, from nothing to a gated call.
//!
//! `new` writes a Tool project in Rust or Python (one working Tool with a
//! test, the SDK dependency resolved, a `toolgate.toml` for local development:
//! the plugin directory, the Tool visible and allowed, an in-memory journal);
//! `build` compiles it into a component (cargo for `wasm32-wasip2`, or
//! componentize-py in the project's own virtual environment) and the caller
//! packs it into the project's plugin directory, where `toolgate call` finds it.
//!
//! Architecture invariant: author-side only; never overwrites a file.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a project cannot be made or built; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    /// The name cannot be a Tool id prefix and crate name.
    #[error(
        "`{0}` is not a usable name: use lowercase letters, digits and `_`, starting with a letter (it becomes the Tool id prefix and the crate name)"
    )]
    Name(String),
    /// Refusing to overwrite.
    #[error("{0} already exists; choose another name or remove it")]
    Exists(PathBuf),
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not in a project `toolgate new` made.
    #[error("{0}: no Cargo.toml or pyproject.toml; run `toolgate build` in a directory made by `toolgate new`")]
    NotAProject(PathBuf),
    /// The project's manifest does not say what `toolgate build` needs.
    #[error("{}: `{field}`: {problem}", path.display())]
    Manifest {
        /// Cargo.toml or pyproject.toml.
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong and what to write.
        problem: String,
    },
    /// cargo failed (its output was shown).
    #[error("cargo build failed (see above); fix the source and run `toolgate build` again")]
    Build,
    /// cargo could not be started.
    #[error("cannot run cargo: {0}; install Rust from https://rustup.rs and run `rustup target add wasm32-wasip2`")]
    Cargo(std::io::Error),
    /// A Python step failed (its output was shown).
    #[error("{0} failed (see above); fix it and run `toolgate build` again")]
    Python(String),
    /// Python could not be started.
    #[error("cannot run `{0}`: {1}; install Python 3.10 or newer with the venv module, or set TOOLGATE_PYTHON")]
    NoPython(String, std::io::Error),
}

/// The language of a Tool project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// A cargo crate built for `wasm32-wasip2` with `toolgate-sdk`.
    Rust,
    /// A Python module built with componentize-py and the Python `toolgate_sdk`.
    Python,
}

impl std::str::FromStr for Lang {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rust" => Ok(Lang::Rust),
            "python" => Ok(Lang::Python),
            other => Err(format!("--lang {other}: use `rust` or `python`")),
        }
    }
}

/// The componentize-py release Python projects build with (pinned: its
/// output is what the tests prove).
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ScaffoldError + '_ {
    move |source| ScaffoldError::Io { path: path.to_owned(), source }
}

/// The default SDK of `lang`: under `TOOLGATE_SDK` (a `guest-sdk`
/// directory), else in the checkout this binary was built from.
pub fn default_sdk(lang: Lang) -> PathBuf {
    let guest_sdk = std::env::var_os("TOOLGATE_SDK")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk"));
    match lang {
        Lang::Rust => guest_sdk,
        Lang::Python => guest_sdk.join("python"),
    }
}

/// Write a new Tool project `name` in `dir/name`, depending on the SDK at
/// `sdk` (`guest-sdk` for Rust, `guest-sdk/python` for Python).
pub fn new(dir: &Path, name: &str, lang: Lang, sdk: &Path) -> Result<PathBuf, ScaffoldError> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 64;
    if !ok {
        return Err(ScaffoldError::Name(name.to_owned()));
    }
    let root = dir.join(name);
    if root.exists() {
        return Err(ScaffoldError::Exists(root));
    }
    let toolgate_toml = ("toolgate.toml", TOOLGATE_TOML.replace("{name}", name));
    let files = match lang {
        Lang::Rust => vec![
            ("Cargo.toml", cargo_toml(name, sdk)),
            ("src/lib.rs", LIB_RS.replace("{name}", name)),
            toolgate_toml,
            (".gitignore", "/target\n/plugins\n/.toolgate\n".to_owned()),
        ],
        Lang::Python => vec![
            ("pyproject.toml", PYPROJECT_TOML.replace("{name}", name)),
            ("requirements.txt", requirements_txt(sdk)),
            ("app.py", APP_PY.replace("{name}", name)),
            ("test_app.py", TEST_APP_PY.replace("{name}", name)),
            toolgate_toml,
            (".gitignore", "/.venv\n/build\n/plugins\n/.toolgate\n__pycache__/\n".to_owned()),
        ],
    };
    let dirs = if lang == Lang::Rust { root.join("src") } else { root.clone() };
    std::fs::create_dir_all(&dirs).map_err(io(&root))?;
    for (file, text) in files {
        let path = root.join(file);
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    if lang == Lang::Python {
        return Ok(root);
    }
    // The checkout's lockfile pins the dependency versions the SDK is tested with.
    let lock = sdk.join("../Cargo.lock");
    if lock.is_file() {
        let to = root.join("Cargo.lock");
        std::fs::copy(&lock, &to).map_err(io(&to))?;
    }
    Ok(root)
}

fn cargo_toml(name: &str, sdk: &Path) -> String {
    format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
         [lib]\ncrate-type = [\"cdylib\"]\n\n\
         [dependencies]\n\
         # The toolgate SDK (`toolgate new --sdk` or TOOLGATE_SDK chose this path).\n\
         toolgate-sdk = {{ path = {:?} }}\n\
         serde = {{ version = \"1\", features = [\"derive\"] }}\nschemars = \"1\"\n\n\
         [profile.release]\nopt-level = \"s\"\nstrip = \"debuginfo\"\n\n\
         # A project of its own, not a member of an enclosing workspace.\n[workspace]\n",
        sdk.display().to_string()
    )
}

const LIB_RS: &str = r#"//! The `{name}` Tools. Build and pack with `toolgate build`, then call
//! `toolgate call {name}.hello --args '{"name":"world"}'`.

use schemars::JsonSchema;
use serde::Deserialize;
use toolgate_sdk::{Context, Tool, ToolError};

/// What `{name}.hello` takes: the JSON Schema the model sees is derived from
/// this type and its doc comments.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HelloArgs {
    /// Who to greet.
    pub name: String,
}

/// `{name}.hello`: greet someone.
pub struct Hello;

impl Tool for Hello {
    const ID: &'static str = "{name}.hello";
    const DESCRIPTION: &'static str = "Greet someone by name.";
    type Args = HelloArgs;
    type Output = String;
    fn call(args: HelloArgs, _cx: &mut Context<'_>) -> Result<String, ToolError> {
        if args.name.trim().is_empty() {
            return Err(ToolError::failed("give a name to greet"));
        }
        Ok(format!("Hello, {}!", args.name))
    }
}

toolgate_sdk::export_tools!(Hello);

#[cfg(test)]
mod tests {
    use super::*;

    struct NoState;
    impl toolgate_sdk::StateView for NoState {
        fn get(&self, _key: &str) -> Option<String> {
            None
        }
        fn keys(&self) -> Vec<String> {
            Vec::new()
        }
    }

    #[test]
    fn hello_greets_by_name() {
        let mut cx = Context::new(Hello::ID, &NoState);
        let out = Hello::call(HelloArgs { name: "world".into() }, &mut cx).unwrap();
        assert_eq!(out, "Hello, world!");
        assert!(Hello::call(HelloArgs { name: " ".into() }, &mut cx).is_err());
    }
}
"#;

const TOOLGATE_TOML: &str = r#"# Local development: `toolgate build` packs into plugins/, and `toolgate call`
# runs the Tool through the gate and the sandbox. Nothing is kept between calls
# (in-memory journal); point `store` at a file to keep the journal.
plugins = "plugins"
store = ":memory:"
cache = ".toolgate/cache"

[agents.default]
visible = ["{name}.*"]
default = "deny"
rules = [{ pattern = "{name}.*", behavior = "allow" }]
"#;

fn requirements_txt(sdk: &Path) -> String {
    format!(
        "# What `toolgate build` installs into .venv (pinned: the versions toolgate is tested with).\n\
         {COMPONENTIZE_PY}\n\
         # The toolgate SDK (`toolgate new --sdk` or TOOLGATE_SDK chose this path).\n\
         toolgate-sdk @ file://{}\n",
        percent_encode_path(sdk)
    )
}

/// `path` as the path of a `file://` URL: every byte but RFC 3986's
/// unreserved characters and `/` percent-encoded, so a space, `#`, `;` or
/// `%` in it neither ends the requirement nor changes what pip (or
/// `local_sources`) decodes.
fn percent_encode_path(path: &Path) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

const PYPROJECT_TOML: &str = r#"[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["toolgate-sdk"]

# `toolgate build` imports this module (which calls `export_tools`) into the component.
[tool.toolgate]
module = "app"
"#;

const APP_PY: &str = r#""""The `{name}` Tools. Build and pack with `toolgate build`, then call
`toolgate call {name}.hello --args '{"name":"world"}'`."""

from dataclasses import dataclass

from toolgate_sdk import Context, Failed, Tool, export_tools


@dataclass
class HelloArgs:
    """What `{name}.hello` takes: the JSON Schema the model sees is derived
    from these type hints and this docstring.

    Attributes:
        name: Who to greet.
    """

    name: str


class Hello(Tool):
    ID = "{name}.hello"
    DESCRIPTION = "Greet someone by name."

    def call(self, args: HelloArgs, cx: Context) -> str:
        if not args.name.strip():
            raise Failed("give a name to greet")
        return f"Hello, {args.name}!"


export_tools(Hello)
"#;

const TEST_APP_PY: &str = r#""""Native tests of the `{name}` Tools: `.venv/bin/python -m unittest`."""

import json
import unittest

from toolgate_sdk import Failed, MemoryState, describe, dispatch

import app


class HelloTest(unittest.TestCase):
    def test_hello_greets_by_name(self):
        out = dispatch("{name}.hello", json.dumps({"name": "world"}), MemoryState(), tools=[app.Hello])
        self.assertEqual(json.loads(out.json), "Hello, world!")

    def test_a_blank_name_fails(self):
        with self.assertRaises(Failed):
            dispatch("{name}.hello", json.dumps({"name": " "}), MemoryState(), tools=[app.Hello])

    def test_the_schema_comes_from_the_type_hints(self):
        (tool,) = json.loads(describe([app.Hello]))["tools"]
        schema = tool["descriptor"]["input_schema"]
        self.assertEqual(schema["required"], ["name"])
        self.assertEqual(schema["properties"]["name"]["description"], "Who to greet.")


if __name__ == "__main__":
    unittest.main()
"#;

/// A project's name and language (and for Python the module `toolgate build`
/// imports), from its `Cargo.toml` or `pyproject.toml`.
fn project(dir: &Path) -> Result<(String, Lang, Option<String>), ScaffoldError> {
    for (file, lang, section) in [("Cargo.toml", Lang::Rust, "package"), ("pyproject.toml", Lang::Python, "project")] {
        let manifest = dir.join(file);
        if !manifest.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&manifest).map_err(io(&manifest))?;
        let bad = |field: &str, problem: String| ScaffoldError::Manifest {
            path: manifest.clone(),
            field: field.into(),
            problem,
        };
        let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| bad("(syntax)", e.message().to_owned()))?;
        let field = format!("{section}.name");
        let name =
            doc.get(section).and_then(|t| t.get("name")).and_then(toml::Value::as_str).ok_or_else(|| {
                bad(&field, "missing; run `toolgate build` in a directory made by `toolgate new`".into())
            })?;
        // The name becomes a file name in the plugin directory.
        let usable = name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !name.starts_with('.')
            && !name.is_empty();
        if !usable {
            return Err(bad(
                &field,
                format!("`{name}` is not usable as a file name; use letters, digits, `-`, `_`, `.`"),
            ));
        }
        let module = match doc.get("tool").and_then(|t| t.get("toolgate")).and_then(|t| t.get("module")) {
            None => None,
            Some(m) => {
                let m = m.as_str().unwrap_or_default();
                let is_module = !m.is_empty()
                    && m.split('.').all(|p| {
                        p.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    });
                if !is_module {
                    return Err(bad("tool.toolgate.module", format!("`{m}` is not a Python module name, e.g. `app`")));
                }
                Some(m.to_owned())
            }
        };
        return Ok((name.to_owned(), lang, module));
    }
    Err(ScaffoldError::NotAProject(dir.to_owned()))
}

/// Build the project at `dir` into a component (progress on stderr); the
/// unpacked component's bytes and the project's name.
pub fn build(dir: &Path) -> Result<(String, Vec<u8>), ScaffoldError> {
    let (name, lang, module) = project(dir)?;
    if lang == Lang::Python {
        let bytes = build_python(dir, &name, module.as_deref().unwrap_or("app"))?;
        return Ok((name, bytes));
    }
    eprintln!("building for wasm32-wasip2 (the first build compiles the SDK: a minute or so)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(dir)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .status()
        .map_err(ScaffoldError::Cargo)?;
    if !status.success() {
        return Err(ScaffoldError::Build);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| dir.join("target"));
    let target = if target.is_absolute() { target } else { dir.join(target) };
    let artifact = target.join("wasm32-wasip2/release").join(format!("{}.wasm", name.replace('-', "_")));
    let bytes = std::fs::read(&artifact).map_err(io(&artifact))?;
    Ok((name, bytes))
}

/// Build a Python project with componentize-py inside the project's `.venv`,
/// created and filled from `requirements.txt` when missing or out of date
/// (a changed SDK included: see [`prepare_venv`]).
fn build_python(dir: &Path, name: &str, module: &str) -> Result<Vec<u8>, ScaffoldError> {
    let dir = &std::path::absolute(dir).map_err(io(dir))?;
    let venv = dir.join(".venv");
    let bin = venv.join("bin");
    prepare_venv(dir)?;
    // The SDK knows where its WIT is; ask the venv's Python, not a guess.
    let out = Command::new(bin.join("python"))
        .args(["-c", "import toolgate_sdk; print(toolgate_sdk.wit_dir())"])
        .output()
        .map_err(|e| ScaffoldError::NoPython(bin.join("python").display().to_string(), e))?;
    if !out.status.success() {
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        return Err(ScaffoldError::Python("importing toolgate_sdk from .venv".into()));
    }
    let wit = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let build = dir.join("build");
    std::fs::create_dir_all(&build).map_err(io(&build))?;
    // The entry module componentize-py loads: the project's Tools register
    // themselves, then the SDK's `Tool` is the WIT export.
    let entry = build.join("toolgate_main.py");
    let text = format!(
        "# Generated by `toolgate build`.\nimport {module}  # noqa: F401  (registers the project's Tools)\n\
         from toolgate_sdk.component import Tool  # noqa: F401  (the WIT export)\n"
    );
    std::fs::write(&entry, text).map_err(io(&entry))?;
    let output = build.join(format!("{name}.wasm"));
    eprintln!("componentize-py: {module} -> {} (bundles CPython: ~10 s)", output.display());
    let status = Command::new(bin.join("componentize-py"))
        .current_dir(dir)
        // componentize-py finds installed packages through the venv.
        .env("VIRTUAL_ENV", &venv)
        // Its errors are the author's Python traceback; a Rust backtrace only hides it.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .args(["-q", "-d", &wit, "-w", "toolgate:python/plugin", "componentize", "-p", "."])
        .arg("-p")
        .arg(&build)
        .args(["toolgate_main", "-o"])
        .arg(&output)
        .status()
        .map_err(|e| ScaffoldError::NoPython(bin.join("componentize-py").display().to_string(), e))?;
    if !status.success() {
        return Err(ScaffoldError::Python("componentize-py".into()));
    }
    std::fs::read(&output).map_err(io(&output))
}

/// Create the project's `.venv` when missing and install what it lacks: all
/// of `requirements.txt` when that changed (or componentize-py is missing),
/// else only the local packages it names (`name @ file://…`, the toolgate SDK)
/// whose files changed, else nothing (no pip run).
///
/// `.venv/.toolgate-requirements` records what was installed: each local
/// package's digest and requirements.txt's text. It is removed before pip
/// runs and written only after pip succeeded, so an interrupted or failed
/// install never reads as complete.
fn prepare_venv(dir: &Path) -> Result<(), ScaffoldError> {
    let venv = dir.join(".venv");
    let bin = venv.join("bin");
    let requirements = dir.join("requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).map_err(io(&requirements))?;
    let sources: Vec<(PathBuf, String)> = local_sources(&wanted)
        .into_iter()
        .map(|path| {
            let digest = source_digest(&path);
            (path, digest)
        })
        .collect();
    let stamp = venv.join(".toolgate-requirements");
    let installed = std::fs::read_to_string(&stamp).unwrap_or_default();
    let install = match (bin.join("componentize-py").is_file(), bin.join("python").is_file()) {
        (true, true) => venv_plan(&installed, &wanted, &sources),
        _ => Install::All,
    };
    if install == Install::Nothing {
        return Ok(());
    }
    if !bin.join("python").is_file() {
        let python = std::env::var("TOOLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
        eprintln!("creating {} with {python}", venv.display());
        let status = Command::new(&python)
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .map_err(|e| ScaffoldError::NoPython(python.clone(), e))?;
        if !status.success() {
            return Err(ScaffoldError::Python(format!("`{python} -m venv .venv`")));
        }
    }
    match std::fs::remove_file(&stamp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&stamp)(e)),
        _ => {}
    }
    let mut pip = Command::new(bin.join("python"));
    pip.current_dir(dir).args(["-m", "pip", "install", "--disable-pip-version-check", "-q"]);
    let what = match &install {
        Install::All => {
            eprintln!("installing requirements.txt into .venv (componentize-py and the SDK)");
            pip.args(["-r", "requirements.txt"]);
            "`pip install -r requirements.txt`".to_owned()
        }
        Install::Changed(paths) => {
            for path in paths {
                eprintln!("reinstalling {} into .venv (its files changed)", path.display());
            }
            // Same version, new files: pip keeps an installed wheel unless forced.
            pip.arg("--force-reinstall").args(paths);
            "`pip install --force-reinstall` of the changed SDK".to_owned()
        }
        Install::Nothing => unreachable!(),
    };
    let status = pip.status().map_err(|e| ScaffoldError::NoPython(bin.join("python").display().to_string(), e))?;
    if !status.success() {
        return Err(ScaffoldError::Python(what));
    }
    std::fs::write(&stamp, stamp_text(&wanted, &sources)).map_err(io(&stamp))?;
    Ok(())
}

/// What `toolgate build` installs into a venv that exists.
#[derive(Debug, PartialEq)]
enum Install {
    /// The venv is current: no pip run.
    Nothing,
    /// requirements.txt is as installed; these local packages changed.
    Changed(Vec<PathBuf>),
    /// requirements.txt changed, or the stamp is unreadable.
    All,
}

const STAMP_HEADER: &str = "toolgate build: installed into this venv\n";
const STAMP_REQUIREMENTS: &str = "requirements.txt:\n";

/// The stamp of a venv holding `requirements` and the local packages with
/// these digests.
fn stamp_text(requirements: &str, sources: &[(PathBuf, String)]) -> String {
    let mut text = STAMP_HEADER.to_owned();
    for (path, digest) in sources {
        text.push_str(&format!("local {digest} {}\n", path.display()));
    }
    text + STAMP_REQUIREMENTS + requirements
}

/// Whether the venv stamped `installed` holds `requirements` and the local
/// packages `sources` (path, digest) it names. A stamp without digests (an
/// older toolgate's: requirements.txt alone) says nothing of the SDK in the
/// venv, so the local packages are reinstalled.
fn venv_plan(installed: &str, requirements: &str, sources: &[(PathBuf, String)]) -> Install {
    let (stamped, installed_requirements) = match installed.strip_prefix(STAMP_HEADER) {
        Some(rest) => {
            let line = rest.match_indices(STAMP_REQUIREMENTS).find(|&(at, _)| at == 0 || rest[..at].ends_with('\n'));
            let Some((at, _)) = line else {
                return Install::All;
            };
            let digests: Vec<&str> = rest[..at].lines().collect();
            (digests, &rest[at + STAMP_REQUIREMENTS.len()..])
        }
        None => (Vec::new(), installed),
    };
    if installed_requirements != requirements {
        return Install::All;
    }
    let changed: Vec<PathBuf> = sources
        .iter()
        .filter(|(path, digest)| !stamped.contains(&format!("local {digest} {}", path.display()).as_str()))
        .map(|(path, _)| path.clone())
        .collect();
    if changed.is_empty() { Install::Nothing } else { Install::Changed(changed) }
}

/// The local paths `requirements` installs from: `name @ file:///path` lines
/// (how `toolgate new` names the SDK).
fn local_sources(requirements: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for line in requirements.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some((_, url)) = line.split_once("@") else { continue };
        let Some(rest) = url.trim_start().strip_prefix("file://") else { continue };
        // An environment marker or a comment ends the URL.
        let end = [" ;", ";", " #"].iter().filter_map(|s| rest.find(s)).min().unwrap_or(rest.len());
        let path = percent_decode(rest[..end].trim());
        let path = path.strip_prefix("localhost").unwrap_or(&path);
        if !path.is_empty() && !paths.iter().any(|p: &PathBuf| p == Path::new(path)) {
            paths.push(PathBuf::from(path));
        }
    }
    paths
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A digest of what pip installs from the local package at `path`: every
/// file's relative path and bytes (a file: its bytes), leaving out what
/// building it writes into its tree (`build`, `dist`, `*.egg-info`),
/// bytecode, hidden entries and its `tests`. Unreadable parts are recorded as
/// such, so a later readable state differs.
fn source_digest(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    fn walk(dir: &Path, rel: &str, depth: usize, hash: &mut Sha256) {
        let mut entries: Vec<(String, PathBuf)> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect(),
            Err(e) => {
                hash.update(format!("unreadable {rel} {:?}\0", e.kind()));
                return;
            }
        };
        entries.sort();
        for (name, path) in entries {
            let skip = name.starts_with('.')
                || name == "__pycache__"
                || name.ends_with(".egg-info")
                || name.ends_with(".pyc")
                || (depth == 0 && matches!(name.as_str(), "build" | "dist" | "tests"));
            if skip {
                continue;
            }
            let rel = format!("{rel}/{name}");
            // Follows symlinks, as the build does.
            if path.is_dir() {
                if depth < 32 {
                    hash.update(format!("dir {rel}\0"));
                    walk(&path, &rel, depth + 1, hash);
                }
            } else {
                file(&path, &rel, hash);
            }
        }
    }
    fn file(path: &Path, rel: &str, hash: &mut Sha256) {
        match std::fs::read(path) {
            Ok(bytes) => {
                hash.update(format!("file {rel} {}\0", bytes.len()));
                hash.update(&bytes);
            }
            Err(e) => hash.update(format!("unreadable {rel} {:?}\0", e.kind())),
        }
    }
    let mut hash = Sha256::new();
    if path.is_dir() {
        walk(path, "", 0, &mut hash);
    } else {
        file(path, "", &mut hash);
    }
    format!("sha256:{}", hex::encode(hash.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(file: &str, text: &str) -> Result<(String, Lang, Option<String>), ScaffoldError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(file), text).unwrap();
        project(dir.path())
    }

    #[test]
    fn the_manifest_gives_name_language_and_module() {
        let rust = manifest("Cargo.toml", "[package]\nname = \"x\"\nversion = \"0.1.0\"\n").unwrap();
        assert_eq!(rust, ("x".into(), Lang::Rust, None));
        let py = manifest("pyproject.toml", &PYPROJECT_TOML.replace("{name}", "y")).unwrap();
        assert_eq!(py, ("y".into(), Lang::Python, Some("app".into())));
    }

    /// Every refusal names the file and the field; a name that would leave
    /// the plugin directory never becomes a path.
    #[test]
    fn unusable_manifests_are_refused_naming_the_field() {
        let cases = [
            ("pyproject.toml", "[project]\nname = \"../../etc/x\"\n", "project.name"),
            ("pyproject.toml", "[project]\nname = \"a/b\"\n", "project.name"),
            ("pyproject.toml", "[project]\nname = \".hidden\"\n", "project.name"),
            ("pyproject.toml", "[project]\nversion = \"1\"\n", "project.name"),
            (
                "pyproject.toml",
                "[project]\nname = \"x\"\n[tool.toolgate]\nmodule = \"os; rm\"\n",
                "tool.toolgate.module",
            ),
            ("pyproject.toml", "[project]\nname = \"x\"\n[tool.toolgate]\nmodule = \"1app\"\n", "tool.toolgate.module"),
            ("pyproject.toml", "[project]\nname = \"x\"\n[tool.toolgate]\nmodule = 3\n", "tool.toolgate.module"),
            ("Cargo.toml", "[package\nname = \"x\"\n", "(syntax)"),
        ];
        for (file, text, field) in cases {
            let e = manifest(file, text).unwrap_err().to_string();
            assert!(e.contains(file) && e.contains(&format!("`{field}`")), "{text:?}: {e}");
        }
        let empty = tempfile::tempdir().unwrap();
        let e = project(empty.path()).unwrap_err().to_string();
        assert!(e.contains("Cargo.toml or pyproject.toml") && e.contains("toolgate new"), "{e}");
    }

    /// `toolgate build`'s install step against a stand-in for the venv's
    /// Python that logs each pip run: an unchanged venv runs no pip, a changed
    /// SDK (same requirements.txt) is reinstalled, and only it, and a failed
    /// install leaves no stamp saying it is complete.
    #[cfg(unix)]
    #[test]
    fn a_changed_sdk_is_reinstalled_and_an_unchanged_venv_runs_no_pip() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let write = |path: &Path, text: &str| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        // A copy of an SDK, what the project's requirements.txt installs from.
        let sdk = tmp.path().join("sdk");
        write(&sdk.join("pyproject.toml"), "[project]\nname = \"toolgate-sdk\"\nversion = \"0.1.0\"\n");
        let init = sdk.join("toolgate_sdk/__init__.py");
        write(&init, "def dispatch(): ...\n");
        let project = tmp.path().join("p");
        write(&project.join("requirements.txt"), &requirements_txt(&sdk));
        let log = tmp.path().join("pip.log");
        let fail = tmp.path().join("fail");
        let python = project.join(".venv/bin/python");
        write(&python, &format!("#!/bin/sh\necho \"$*\" >> '{}'\ntest ! -e '{}'\n", log.display(), fail.display()));
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        write(&project.join(".venv/bin/componentize-py"), "");
        let runs = || std::fs::read_to_string(&log).unwrap_or_default().lines().map(str::to_owned).collect::<Vec<_>>();

        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 1);
        assert!(runs()[0].contains("-r requirements.txt"), "{:?}", runs());
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 1, "an unchanged venv runs no pip");
        // What building the SDK leaves in its tree, and bytecode, are not the SDK.
        write(&sdk.join("build/lib/toolgate_sdk/__init__.py"), "old\n");
        write(&sdk.join("toolgate_sdk.egg-info/PKG-INFO"), "x\n");
        write(&sdk.join("toolgate_sdk/__pycache__/__init__.cpython-311.pyc"), "x\n");
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 1, "build products changed nothing: {:?}", runs());

        // The SDK changed, requirements.txt did not: the SDK is reinstalled, only it.
        write(&init, "def dispatch(): fixed\n");
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 2, "a changed SDK is reinstalled");
        let last = runs()[1].clone();
        assert!(last.contains("--force-reinstall") && last.contains(&sdk.display().to_string()), "{last}");
        assert!(!last.contains("requirements.txt"), "only the SDK: {last}");
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 2);

        // A failed install (the venv half changed) leaves no stamp that says
        // it is complete, even once the SDK is back to what was stamped.
        write(&init, "def dispatch(): newer\n");
        write(&fail, "");
        assert!(prepare_venv(&project).is_err());
        assert_eq!(runs().len(), 3);
        std::fs::remove_file(&fail).unwrap();
        write(&init, "def dispatch(): fixed\n");
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 4, "after a failure the next build installs again");
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 4);

        // A stamp an older toolgate wrote (requirements.txt alone) says
        // nothing of the SDK: it is reinstalled.
        write(&project.join(".venv/.toolgate-requirements"), &requirements_txt(&sdk));
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 5);
        assert!(runs()[4].contains("--force-reinstall"), "{:?}", runs());
        prepare_venv(&project).unwrap();
        assert_eq!(runs().len(), 5);
    }

    /// The local packages a requirements.txt installs from, as pip reads
    /// their `file://` URLs.
    #[test]
    fn local_sources_are_the_file_urls_of_requirements() {
        let text = format!(
            "# toolgate-sdk @ file:///commented/out\n{COMPONENTIZE_PY}\n\
             toolgate-sdk @ file:///opt/guest-sdk/python\n\
             other @ file://localhost/a%20b ; python_version >= \"3.10\"\n\
             remote @ https://example.com/x.whl\n\
             again @ file:///opt/guest-sdk/python\n"
        );
        let want: Vec<PathBuf> = vec!["/opt/guest-sdk/python".into(), "/a b".into()];
        assert_eq!(local_sources(&text), want);
        assert_eq!(local_sources(&requirements_txt(Path::new("/x/python"))), vec![PathBuf::from("/x/python")]);
    }

    /// The SDK's path survives requirements.txt whatever it holds: written
    /// percent-encoded (no space for pip to split the line on), read back
    /// as the same path.
    #[test]
    fn an_sdk_path_with_spaces_and_url_characters_round_trips() {
        for path in ["/home/a user/guest-sdk/python", "/x/100% #1;v=2/é", "/plain/guest-sdk/python"] {
            let text = requirements_txt(Path::new(path));
            let line = text.lines().find(|l| l.starts_with("toolgate-sdk @ ")).unwrap();
            let url = line.strip_prefix("toolgate-sdk @ ").unwrap();
            assert!(!url.contains([' ', '#', ';']) && url.starts_with("file:///"), "{line}");
            assert_eq!(local_sources(&text), vec![PathBuf::from(path)], "{line}");
        }
        assert!(requirements_txt(Path::new("/a b")).contains("toolgate-sdk @ file:///a%20b\n"));
    }
}
