//! Generate: building the SDK crates that author-side commands write.
//!
//! `toolgate skill pack` and `toolgate mcp import` turn a Skill folder or a
//! remote MCP server's pinned tools into Rust source that uses toolgate-sdk;
//! this module builds that source for `wasm32-wasip2` with cargo, in a shared
//! target directory so later builds reuse the compiled SDK.
//!
//! Architecture invariant: author-side only. A host loading a plugin
//! directory never builds anything.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the generated crate finds toolgate-sdk and the workspace lockfile.
#[derive(Debug, Clone)]
pub struct BuildEnv {
    /// The `guest-sdk` directory.
    pub sdk: PathBuf,
    /// Cargo target directory for generated builds (shared, so later packs are fast).
    pub target_dir: PathBuf,
}

impl Default for BuildEnv {
    fn default() -> Self {
        let sdk = std::env::var_os("TOOLGATE_SDK")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk"));
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(|d| PathBuf::from(d).join("generated-build"))
            .unwrap_or_else(|| std::env::temp_dir().join("toolgate-generated-build"));
        BuildEnv { sdk, target_dir }
    }
}

/// Build the crate `krate` whose `src/lib.rs` is `lib_rs` for `wasm32-wasip2`;
/// returns the unpacked component bytes, or the end of cargo's error output.
pub fn build(krate: &str, lib_rs: &str, env: &BuildEnv) -> Result<Vec<u8>, String> {
    // The artifact path is per crate name in a shared target directory: name the
    // crate after its source, so concurrent builds of different sources never
    // read each other's output (and equal sources produce equal artifacts).
    use sha2::Digest as _;
    let krate = &format!("{krate}-{}", &hex::encode(sha2::Sha256::digest(lib_rs.as_bytes()))[..12]);
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = work.path();
    let io = |e: std::io::Error| e.to_string();
    std::fs::create_dir_all(root.join("src")).map_err(io)?;
    std::fs::write(
        root.join("Cargo.toml"),
        format!(
            "[package]\nname = {krate:?}\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n\
             [dependencies]\ntoolgate-sdk = {{ path = {:?} }}\nserde = {{ version = \"1\", features = [\"derive\"] }}\nschemars = \"1\"\n\n\
             [profile.release]\nopt-level = \"s\"\nstrip = \"debuginfo\"\n\n[workspace]\n",
            env.sdk.display().to_string()
        ),
    )
    .map_err(io)?;
    // The workspace's lockfile pins the same dependency versions the SDK is tested with.
    let lock = env.sdk.join("../Cargo.lock");
    if lock.is_file() {
        std::fs::copy(&lock, root.join("Cargo.lock")).map_err(io)?;
    }
    std::fs::write(root.join("src/lib.rs"), lib_rs).map_err(io)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
        .arg(&env.target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(15).collect();
        return Err(tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    }
    let artifact = env.target_dir.join("wasm32-wasip2/release").join(format!("{}.wasm", krate.replace('-', "_")));
    std::fs::read(&artifact).map_err(|e| format!("{}: {e}", artifact.display()))
}
