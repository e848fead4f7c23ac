//! Scaffold: `toolgate new` and `toolgate build`, from nothing to a gated call.
//!
//! `new` writes a Tool project (one working Tool with a test, the SDK
//! dependency resolved, a `toolgate.toml` for local development: the plugin
//! directory, the Tool visible and allowed, an in-memory journal); `build`
//! compiles it for `wasm32-wasip2` and packs it into the project's plugin
//! directory, where `toolgate call` finds it.
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
    #[error("{0}: no `[package] name` found; run `toolgate build` in a directory made by `toolgate new`")]
    NotAProject(PathBuf),
    /// cargo failed (its output was shown).
    #[error("cargo build failed (see above); fix the source and run `toolgate build` again")]
    Build,
    /// cargo could not be started.
    #[error("cannot run cargo: {0}; install Rust from https://rustup.rs and run `rustup target add wasm32-wasip2`")]
    Cargo(std::io::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ScaffoldError + '_ {
    move |source| ScaffoldError::Io { path: path.to_owned(), source }
}

/// Write a new Rust Tool project `name` in `dir/name`, depending on the SDK at `sdk`.
pub fn new_rust(dir: &Path, name: &str, sdk: &Path) -> Result<PathBuf, ScaffoldError> {
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
    std::fs::create_dir_all(root.join("src")).map_err(io(&root))?;
    let files = [
        ("Cargo.toml", cargo_toml(name, sdk)),
        ("src/lib.rs", LIB_RS.replace("{name}", name)),
        ("toolgate.toml", TOOLGATE_TOML.replace("{name}", name)),
        (".gitignore", "/target\n/plugins\n/.toolgate\n".to_owned()),
    ];
    for (file, text) in files {
        let path = root.join(file);
        std::fs::write(&path, text).map_err(io(&path))?;
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

/// The crate name of the project at `dir` (its `Cargo.toml` `[package] name`).
fn package_name(dir: &Path) -> Result<String, ScaffoldError> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(io(&manifest))?;
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(v) = line.strip_prefix("name") {
            let v = v.trim_start().strip_prefix('=').map(str::trim).unwrap_or("");
            let v = v.trim_matches('"');
            if !v.is_empty() {
                return Ok(v.to_owned());
            }
        }
    }
    Err(ScaffoldError::NotAProject(manifest))
}

/// Build the project at `dir` for `wasm32-wasip2` (cargo's progress on
/// stderr); the unpacked component's bytes and the project's name.
pub fn build(dir: &Path) -> Result<(String, Vec<u8>), ScaffoldError> {
    let name = package_name(dir)?;
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
