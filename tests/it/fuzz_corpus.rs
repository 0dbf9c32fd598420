//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same entry points
//! the cargo-fuzz targets run (`fuzz/entry_points.rs`), on stable Rust and without cargo-fuzz,
//! so CI re-checks every input the fuzzer ever kept: no panic, no hang, one-line errors.

#[path = "../../fuzz/entry_points.rs"]
mod entry_points;

use std::path::Path;
use std::time::{Duration, Instant};

/// Far above what any input takes; a slower one is a hang in the making.
const PER_INPUT: Duration = Duration::from_secs(2);

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut total = 0;
    for (name, target) in entry_points::TARGETS {
        let dir = root.join(name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        inputs.sort();
        assert!(inputs.len() >= 5, "the {name} corpus is nearly empty");
        for input in &inputs {
            let data = std::fs::read(input).unwrap();
            let began = Instant::now();
            if let Err(panic) = std::panic::catch_unwind(|| target(&data)) {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{name}: {} fails: {what}", input.display());
            }
            assert!(began.elapsed() < PER_INPUT, "{name}: {} is slow", input.display());
        }
        total += inputs.len();
    }
    eprintln!("replayed {total} corpus inputs");
}
