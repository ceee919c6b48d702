//! `verify --fix`: the findings' edits applied to the files on disk.
//!
//! Every file's new text is computed first; only when every edit of every
//! file applies exactly is anything written, each file replaced whole
//! through a temporary file and a rename, so a failure leaves the tree as
//! it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::findings::Finding;
use crate::source::edit::{self, Edit};

/// One file's text before and after its fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFix {
    /// The path as the findings name it (relative to the work tree).
    pub file: String,
    /// Where it is on disk.
    pub path: PathBuf,
    pub before: String,
    pub after: String,
    /// How many findings it fixes.
    pub fixes: usize,
}

/// The fixes of `findings` for the files under `root`. An edit that cannot
/// be applied exactly is an error naming the file; nothing is computed for
/// the others either.
pub fn plan(findings: &[Finding], root: &Path) -> Result<Vec<FileFix>, String> {
    let mut by_file: BTreeMap<&str, Vec<&Edit>> = BTreeMap::new();
    for finding in findings {
        if let Some(edit) = &finding.edit {
            by_file
                .entry(&finding.location.file)
                .or_default()
                .push(edit);
        }
    }
    let mut out = Vec::new();
    for (file, edits) in by_file {
        let path = root.join(file);
        let before = std::fs::read_to_string(&path)
            .map_err(|e| format!("{file}: cannot read it to fix it: {e}"))?;
        let mut unique: Vec<Edit> = Vec::new();
        for edit in edits {
            if !unique.contains(edit) {
                unique.push(edit.clone());
            }
        }
        let after = edit::apply(&before, &unique).map_err(|e| format!("{file}: {e}"))?;
        out.push(FileFix {
            file: file.to_owned(),
            path,
            before,
            after,
            fixes: unique.len(),
        });
    }
    Ok(out)
}

/// A unified diff of every fixed file, `a/` and `b/` prefixed as Git does.
pub fn diff(fixes: &[FileFix]) -> String {
    let mut out = String::new();
    for fix in fixes {
        let text = similar::TextDiff::from_lines(&fix.before, &fix.after);
        out.push_str(
            &text
                .unified_diff()
                .context_radius(3)
                .header(&format!("a/{}", fix.file), &format!("b/{}", fix.file))
                .to_string(),
        );
    }
    out
}

/// Writes every file or none: each new text goes first into a temporary
/// file beside its target (keeping the target's permissions); only when all
/// of them are written are they renamed over their targets. A failure
/// before that removes the temporary files and changes nothing.
pub fn write(fixes: &[FileFix]) -> Result<(), String> {
    let mut staged: Vec<(PathBuf, &FileFix)> = Vec::new();
    for fix in fixes {
        match stage(fix) {
            Ok(temporary) => staged.push((temporary, fix)),
            Err(e) => {
                for (temporary, _) in &staged {
                    let _ = std::fs::remove_file(temporary);
                }
                return Err(format!("{e}; nothing was changed"));
            }
        }
    }
    for (i, (temporary, fix)) in staged.iter().enumerate() {
        if let Err(e) = std::fs::rename(temporary, &fix.path) {
            for (temporary, _) in &staged[i..] {
                let _ = std::fs::remove_file(temporary);
            }
            let done: Vec<&str> = staged[..i].iter().map(|(_, f)| f.file.as_str()).collect();
            return Err(format!(
                "{}: cannot replace it: {e}; {}",
                fix.file,
                if done.is_empty() {
                    "nothing was changed".to_owned()
                } else {
                    format!("already fixed: {}", done.join(", "))
                }
            ));
        }
    }
    Ok(())
}

/// The new text of `fix` in a temporary file beside it. A read-only target
/// is refused: a rename would replace it all the same.
fn stage(fix: &FileFix) -> Result<PathBuf, String> {
    let dir = fix.path.parent().unwrap_or(Path::new("."));
    let name = fix
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = dir.join(format!(".{name}.openmed-op-fix"));
    let permissions = std::fs::metadata(&fix.path)
        .map_err(|e| format!("{}: {e}", fix.file))?
        .permissions();
    if permissions.readonly() {
        return Err(format!("{}: the file is read-only", fix.file));
    }
    std::fs::write(&temporary, &fix.after)
        .and_then(|()| std::fs::set_permissions(&temporary, permissions))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            format!("{}: cannot write the fix beside it: {e}", fix.file)
        })?;
    Ok(temporary)
}
