//! The fuzz corpus as a test on stable Rust: every committed input of every
//! fuzz target (`fuzz/corpus/<target>/`, seeds and what fuzzing found) runs
//! through the target's body again, so an input that once broke a parser
//! stays a regression test. Fuzzing itself: `fuzz/README.md`.

#[path = "../fuzz/src/targets.rs"]
mod targets;

use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no inputs", dir.display());
    for input in inputs {
        let data = std::fs::read(&input).unwrap();
        let outcome = std::panic::catch_unwind(|| body(&data));
        assert!(outcome.is_ok(), "{} panics", input.display());
    }
}

#[test]
fn render_stream_corpus() {
    replay("render_stream", targets::render_stream);
}

#[test]
fn render_krm_corpus() {
    replay("render_krm", targets::render_krm);
}

#[test]
fn verify_objects_corpus() {
    replay("verify_objects", targets::verify_objects);
}

#[test]
fn stored_object_corpus() {
    replay("stored_object", targets::stored_object);
}
