//! Executables a test writes and then runs, safe from "Text file busy".
//!
//! The tests of one binary run on many threads. A file this process has
//! open for writing is inherited by every child another thread forks at
//! that moment, until that child execs; running the file then fails with
//! ETXTBSY (CI failed once that way). So the bytes go to a sibling file that
//! is never run, and `install`, a process of its own, makes the executable
//! from it: no thread here ever holds the executable open for writing.

use std::path::Path;
use std::process::Command;

/// Writes `text` to `path` as an executable (mode 755).
pub fn write_executable(path: &Path, text: &str) {
    let source = path.with_extension("source");
    std::fs::write(&source, text).unwrap();
    install_executable(&source, path);
    std::fs::remove_file(&source).unwrap();
}

/// Copies the executable `from` to `to` (mode 755).
pub fn install_executable(from: &Path, to: &Path) {
    let status = Command::new("install")
        .arg("-m")
        .arg("755")
        .arg(from)
        .arg(to)
        .status()
        .expect("install runs");
    assert!(
        status.success(),
        "install {} {}",
        from.display(),
        to.display()
    );
}
