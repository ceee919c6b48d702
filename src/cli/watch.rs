//! `--watch`: run a job again whenever its input files change.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_mini::new_debouncer;

/// Runs `job` once, then again after every burst of changes to `paths`
/// (bursts are collapsed, so an editor's save is one run). Returns only on a
/// watcher error.
///
/// A file is watched through its directory: editors that save by writing a
/// new file and renaming it over the old one would otherwise end the watch
/// after the first save.
pub fn watch(paths: &[PathBuf], mut job: impl FnMut()) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel();
    let mut debouncer =
        new_debouncer(Duration::from_millis(200), tx).map_err(std::io::Error::other)?;
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            return Err(std::io::Error::other(
                "--watch cannot watch stdin; name files or directories",
            ));
        }
        let absolute = std::path::absolute(path)?;
        let (root, mode) = if absolute.is_dir() {
            dirs.push(absolute.clone());
            (absolute, RecursiveMode::Recursive)
        } else {
            files.push(absolute.clone());
            let parent = absolute.parent().unwrap_or(Path::new("/")).to_path_buf();
            (parent, RecursiveMode::NonRecursive)
        };
        debouncer
            .watcher()
            .watch(&root, mode)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
    }
    let relevant = |p: &Path| {
        files.iter().any(|f| f == p)
            || (crate::source::is_yaml_name(p) && dirs.iter().any(|d| p.starts_with(d)))
    };
    job();
    for events in rx {
        match events {
            Ok(events) if events.iter().any(|e| relevant(&e.path)) => job(),
            Ok(_) => {}
            Err(e) => return Err(std::io::Error::other(e)),
        }
    }
    Ok(())
}
