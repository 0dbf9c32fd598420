//! What the benches in `bench/` share: where the built binaries are, their arguments, and one
//! line of latency figures.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A binary built next to the running bench (`target/release/<name>`: examples live one level
/// further down, in `target/release/examples/`).
pub fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the running bench has a path");
    let examples = exe.parent().expect("the bench lives in a directory");
    examples.parent().unwrap_or(examples).join(name)
}

/// The value after `--name` in `args`, else `default`.
pub fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// The `p` quantile (0..=1) of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Prints `what`, the count, median, p99 and min in milliseconds; returns the median.
pub fn report(what: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let median = percentile(&samples, 0.5);
    println!(
        "{what:<52} n={:<5} median {:>7.3} ms   p99 {:>7.3} ms   min {:>7.3} ms",
        samples.len(),
        median.as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples[0].as_secs_f64() * 1e3
    );
    median
}

/// The uuid of the benches' simulated GPU `i`.
pub fn gpu_uuid(i: usize) -> String {
    format!("GPU-bench-{i}")
}

/// A config of `gpus` static 80 GiB GPUs named by [`gpu_uuid`], with its state in `state_dir`.
pub fn static_config(state_dir: &Path, gpus: usize) -> String {
    let mut toml = format!(
        "state_dir = {:?}\n[inventory]\nbackend = \"static\"\n",
        state_dir.display().to_string()
    );
    for i in 0..gpus {
        toml += &format!(
            "[[inventory.gpus]]\nindex = {i}\nuuid = \"{}\"\ntotal = \"80Gi\"\n",
            gpu_uuid(i)
        );
    }
    toml
}
