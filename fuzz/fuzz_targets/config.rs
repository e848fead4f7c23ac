//! Fuzz target `config`: see `toolgate_fuzz::config` for what it checks.
//!
//! Built by `cargo fuzz` (which sets `--cfg fuzzing`) it is a libFuzzer program;
//! built plainly on stable it replays the files given as arguments.
#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    toolgate_fuzz::config(data);
});

#[cfg(not(fuzzing))]
fn main() {
    for file in std::env::args_os().skip(1) {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.to_string_lossy()));
        let accepted = toolgate_fuzz::config(&data);
        println!("{}: {}", file.to_string_lossy(), if accepted { "accepted" } else { "refused" });
    }
}
