//! Replays every target's committed corpus (`corpus/<target>/`), then a
//! burst of seeded random inputs, so that CI runs each target briefly on the
//! stable toolchain. A failing input is named.

use std::path::Path;

use udbtl_fuzz::TARGETS;

#[test]
fn every_target_passes_its_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, target) in TARGETS {
        let dir = root.join(name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("corpus entry").path())
            .collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "{name}: an empty corpus");
        for path in &inputs {
            let data = std::fs::read(path).expect("corpus file");
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                panic!("{name}: {} fails", path.display());
            }
        }
        println!("{name}: {} corpus inputs", inputs.len());
    }
}

#[test]
fn every_target_survives_random_inputs() {
    let mut rng = fastrand::Rng::with_seed(0x00d6_f022);
    for (name, target) in TARGETS {
        for round in 0..3000 {
            let len = rng.usize(0..=(round % 64) * 16);
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                panic!("{name}: fails on {data:02x?}");
            }
        }
    }
}
