//! Which files `verify` reads: YAML files, narrowed by `--include` and
//! `--exclude`.
//!
//! The same filter applies to a revision's tree, to every commit of the
//! history walk and to the files on disk, so a path is in or out everywhere.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// Paths are relative to the repository root, `/`-separated, as Git names them.
#[derive(Debug, Clone)]
pub struct PathFilter {
    include: Option<GlobSet>,
    exclude: GlobSet,
    /// A folder every path read must be in (a fleet's cluster), on top of
    /// `include` and `exclude`.
    within: Option<String>,
}

impl PathFilter {
    /// A filter keeping `*.yaml`/`*.yml` files that match one of `include`
    /// (any, when empty) and none of `exclude`.
    ///
    /// Globs follow `.gitignore` habits: `*` stops at `/`, `**` crosses it; a
    /// glob without `/` matches a file or directory name at any depth
    /// (`vendor`, `*.tmpl.yaml`); a glob naming a directory covers all below it.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, globset::Error> {
        Ok(PathFilter {
            include: if include.is_empty() {
                None
            } else {
                Some(set(include)?)
            },
            exclude: set(exclude)?,
            within: None,
        })
    }

    /// The same filter, keeping only paths inside `folder` (relative to
    /// the root, no trailing `/`): both it and the globs must match.
    pub fn within(mut self, folder: &str) -> Self {
        self.within = Some(format!("{folder}/"));
        self
    }

    /// True when `path` is read.
    pub fn keeps(&self, path: &str) -> bool {
        crate::source::is_yaml_name(std::path::Path::new(path))
            && self.within.as_ref().is_none_or(|w| path.starts_with(w))
            && self.include.as_ref().is_none_or(|s| s.is_match(path))
            && !self.exclude.is_match(path)
    }
}

fn set(globs: &[String]) -> Result<GlobSet, globset::Error> {
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        let glob = glob.trim_start_matches("./").trim_end_matches('/');
        let anchored = if glob.contains('/') {
            glob.trim_start_matches('/').to_owned()
        } else {
            format!("**/{glob}")
        };
        for pattern in [anchored.clone(), format!("{anchored}/**")] {
            builder.add(GlobBuilder::new(&pattern).literal_separator(true).build()?);
        }
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(include: &[&str], exclude: &[&str]) -> PathFilter {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        PathFilter::new(&own(include), &own(exclude)).unwrap()
    }

    #[test]
    fn only_yaml_files_are_read() {
        let f = filter(&[], &[]);
        assert!(f.keeps("a.yaml"));
        assert!(f.keeps("deep/dir/b.yml"));
        assert!(!f.keeps("README.md"));
        assert!(!f.keeps("yaml"));
    }

    #[test]
    fn globs_match_like_gitignore() {
        let f = filter(
            &["models/*.yaml", "shared"],
            &["*.tmpl.yaml", "models/old/"],
        );
        assert!(f.keeps("models/a.yaml"));
        assert!(!f.keeps("models/sub/a.yaml"), "* stops at /");
        assert!(
            f.keeps("x/shared/a.yaml"),
            "a bare name matches at any depth"
        );
        assert!(!f.keeps("models/a.tmpl.yaml"));
        assert!(!f.keeps("other/a.yaml"));
        let f = filter(&["models/**"], &["models/old/"]);
        assert!(f.keeps("models/sub/a.yaml"));
        assert!(
            !f.keeps("models/old/a.yaml"),
            "a directory covers all below it"
        );
    }

    #[test]
    fn a_folder_narrows_the_globs_and_both_must_match() {
        let f = filter(&["svc.yaml"], &["old"]).within("clusters/staging");
        assert!(f.keeps("clusters/staging/svc.yaml"));
        assert!(
            !f.keeps("clusters/staging/other.yaml"),
            "the glob still applies"
        );
        assert!(
            !f.keeps("clusters/hospital-a/svc.yaml"),
            "outside the folder"
        );
        assert!(
            !f.keeps("clusters/staging-2/svc.yaml"),
            "a folder is not a prefix of a name"
        );
        assert!(
            !f.keeps("clusters/staging/old/svc.yaml"),
            "exclude still applies"
        );
        let f = filter(&[], &[]).within("clusters/[a]");
        assert!(f.keeps("clusters/[a]/svc.yaml"), "a folder is not a glob");
    }

    #[test]
    fn a_bad_glob_is_refused() {
        assert!(PathFilter::new(&["a[".into()], &[]).is_err());
    }
}
