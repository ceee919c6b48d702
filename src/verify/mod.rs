//! `openmed-op verify`: judges a change to OpenMedModels in Git before it
//! merges.
//!
//! A pull request that edits OpenMedModels can be valid YAML and still be
//! wrong for the cluster: a rollback to a version the operator no longer
//! retains, a version bump mixed with a rollback, a retry of a version that
//! just failed. `verify` reads the revision under review (REV), the commit it
//! is compared with (BASE), BASE's history and, optionally, the cluster's
//! status, and reports findings in the shape every shell shares.
//!
//! The module is a shell: [`git`] reads objects, [`status`] reads `--status`,
//! [`history`] keeps the state of the one history walk, and [`rules`] decides
//! (pure, no I/O). [`output`] lays the report out as text, JSON or GitHub
//! annotations.

pub mod filter;
pub mod fixes;
pub mod git;
pub mod history;
pub mod output;
pub mod rules;
pub mod status;
pub mod waves;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use git2::{Oid, Repository};

use crate::findings::{Finding, Severity};
use crate::source::{self, Document, Location, ReadError};
use filter::PathFilter;
use git::{BaseChoice, WalkEnd};
use history::VersionHistory;
use rules::{ResourceKey, ResourceSummary, RetainedSource};

/// What to verify.
#[derive(Debug, Clone)]
pub struct Options {
    /// The repository, or a directory inside it.
    pub repo: PathBuf,
    /// The revision under review; `None` means `HEAD`.
    pub rev: Option<String>,
    /// The revision to compare with; `None` means the default BASE.
    pub base: Option<String>,
    /// Judge the files on disk instead of a revision.
    pub worktree: bool,
    /// `--status`: a file or directory of the cluster's OpenMedModels.
    pub status: Option<PathBuf>,
    /// Globs of paths to read (all YAML files when empty).
    pub include: Vec<String>,
    /// Globs of paths to skip.
    pub exclude: Vec<String>,
    /// Report hygiene warnings as errors.
    pub strict: bool,
    /// Namespace of documents that set none.
    pub namespace: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            repo: PathBuf::from("."),
            rev: None,
            base: None,
            worktree: false,
            status: None,
            include: Vec::new(),
            exclude: Vec::new(),
            strict: false,
            namespace: "default".to_owned(),
        }
    }
}

/// A problem with how `verify` was asked to run (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// `--repo` is not inside a Git repository.
    #[error("{path}: not a Git repository: {message}")]
    NotARepository {
        /// The path given.
        path: String,
        /// What libgit2 said.
        message: String,
    },
    /// `--rev` or `--base` names nothing.
    #[error("unknown revision {spec:?} ({flag}): {message}")]
    UnknownRevision {
        /// `--rev` or `--base`.
        flag: &'static str,
        /// The revision as given.
        spec: String,
        /// What libgit2 said.
        message: String,
    },
    /// A glob of `--include` or `--exclude` is malformed.
    #[error("bad glob: {0}")]
    Glob(#[from] globset::Error),
    /// `--status` cannot be used.
    #[error(transparent)]
    Status(#[from] status::StatusError),
    /// The working directory cannot be read (or there is none).
    #[error("--worktree: {0}")]
    Worktree(std::io::Error),
    /// Reading the repository failed (a corrupt or incomplete object store).
    #[error("reading the repository: {0}")]
    Git(#[from] git2::Error),
    /// `openmed-fleet.yaml` at the root is not a valid fleet file.
    #[error("{0}")]
    Fleet(crate::fleet::FleetError),
    /// `--status` in a fleet is a file, not a directory of one per cluster.
    #[error(
        "--status {0}: in a fleet (openmed-fleet.yaml), --status is a directory with one file per wave (per cluster in a wave of several), named after it (DIR/staging.yaml)"
    )]
    FleetStatus(String),
    /// `--status DIR` in a fleet lacks a cluster's file.
    #[error(
        "--status {dir}: no status for {clusters} ({expected}){holds}. In a fleet every cluster's status is read: without it, WaveNotSoaked cannot judge the wave after that cluster, WaveBehindRollback cannot see a rollback there, and the cluster's own rules judge without it. Give each cluster's `kubectl get openmedmodels -A -o yaml` as DIR/<cluster>.yaml (a List with no items for a cluster without OpenMedModels)"
    )]
    FleetStatusMissing {
        /// The directory given.
        dir: String,
        /// `cluster hospital-a` or `clusters hospital-a, hospital-b`.
        clusters: String,
        /// The files looked for.
        expected: String,
        /// The files of the directory that name no cluster, said.
        holds: String,
    },
    /// A fleet's BASE exists but is not in this (shallow) clone.
    #[error(
        "no BASE: REV's parent is not in this shallow clone, and in a fleet (openmed-fleet.yaml) the wave rules judge what the change moved since BASE: without it WaveAhead, WaveNotSoaked and WaveDisagrees would take every model as moved. Fetch more history (`git fetch --deepen=1`, or `git fetch --depth=<n> origin <branch>`; actions/checkout: `fetch-depth: 0`) or pass --base with a commit this clone has"
    )]
    FleetBaseNotFetched,
    /// `--include`/`--exclude` leave out every file of a cluster that
    /// holds an OpenMedModel.
    #[error(
        "--include/--exclude leave out every file of cluster {cluster} ({path}/) that holds an OpenMedModel: the wave rules judge each wave against the one before and would not see its models; narrow the files within each cluster's folder instead"
    )]
    FleetFilter {
        /// The cluster.
        cluster: String,
        /// Its folder.
        path: String,
    },
}

/// The result of one verification.
#[derive(Debug, Clone)]
pub struct Report {
    /// The commit id of BASE, when there is one.
    pub base: Option<String>,
    /// The commit id of REV, or `worktree`.
    pub rev: String,
    /// Every finding: sorted by file, errors before warnings, then by line.
    pub findings: Vec<Finding>,
    /// Every OpenMedModel at REV.
    pub resources: Vec<ResourceSummary>,
    /// Commits of BASE's first-parent history looked at.
    pub history_commits: usize,
    /// Things the reader should know to trust the result (no BASE, shallow
    /// history, history-derived rollback targets).
    pub notes: Vec<String>,
}

impl Report {
    /// Number of findings of `severity`.
    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// True when a finding is an error (exit code 1).
    pub fn has_errors(&self) -> bool {
        self.count(Severity::Error) > 0
    }
}

/// The documents of one file, with the blob they came from.
struct Parsed {
    oid: Option<Oid>,
    docs: Vec<Document>,
}

/// Runs every rule on the revision (or files) and BASE that `options` name.
///
/// A repository whose REV holds `openmed-fleet.yaml` at its root is a
/// fleet (docs/fleet.md): each wave's folder is judged as its own cluster,
/// with `--status DIR/<cluster>.yaml` when given, and then the waves against
/// each other ([`waves`]). `--include` and `--exclude` narrow the files
/// read within each cluster's folder.
pub fn verify(options: &Options) -> Result<Report, UsageError> {
    match fleet_waves(options)? {
        Some(waves) => verify_fleet(options, &waves),
        None => verify_one(
            options,
            &PathFilter::new(&options.include, &options.exclude)?,
        ),
    }
}

/// The waves of `openmed-fleet.yaml` at REV's root (or on disk with
/// `--worktree`), if there is one.
fn fleet_waves(options: &Options) -> Result<Option<Vec<crate::fleet::Wave>>, UsageError> {
    use crate::fleet::FILE_NAME;
    let repo = open_repo(options)?;
    let text = if options.worktree {
        let Some(root) = repo.workdir() else {
            return Ok(None);
        };
        match std::fs::read(root.join(FILE_NAME)) {
            Ok(bytes) => bytes,
            Err(_) => return Ok(None),
        }
    } else {
        let spec = options.rev.as_deref().unwrap_or("HEAD");
        let rev = git::commit(&repo, spec).map_err(|e| unknown("--rev", spec, &e))?;
        let tree = rev.tree()?;
        let Ok(entry) = tree.get_path(std::path::Path::new(FILE_NAME)) else {
            return Ok(None);
        };
        git::blob(&repo, entry.id())?
    };
    let text = String::from_utf8_lossy(&text);
    crate::fleet::parse(FILE_NAME, &text)
        .map(Some)
        .map_err(UsageError::Fleet)
}

/// Each cluster's folder judged as its own cluster, then the waves
/// against each other; one report. An input that would leave a wave rule
/// blind is refused before anything is judged: a cluster without its
/// status file, a BASE this clone does not have, filters that hide every
/// model of a cluster.
fn verify_fleet(options: &Options, waves: &[crate::fleet::Wave]) -> Result<Report, UsageError> {
    let statuses = fleet_statuses(options, waves)?;
    let filter = PathFilter::new(&options.include, &options.exclude)?;
    fleet_filter_hides_nothing(options, waves, &filter)?;
    let mut merged: Option<Report> = None;
    let mut members = Vec::new();
    let before = fleet_before(options, waves)?;
    for (((index, wave, cluster), status), before) in
        crate::fleet::clusters(waves).zip(statuses).zip(before)
    {
        let cluster_status = status
            .as_deref()
            .map(|file| status::read(file, &options.namespace))
            .transpose()?;
        let scoped = Options {
            status,
            ..options.clone()
        };
        let mut report = verify_one(&scoped, &filter.clone().within(&cluster.path))?;
        for note in &mut report.notes {
            *note = format!("cluster {}: {note}", cluster.name);
        }
        members.push(waves::Member {
            index,
            wave,
            cluster,
            models: report.resources.clone(),
            before,
            status: cluster_status,
        });
        merged = Some(match merged {
            None => report,
            Some(mut all) => {
                all.findings.extend(report.findings);
                all.resources.extend(report.resources);
                all.history_commits = all.history_commits.max(report.history_commits);
                all.notes.extend(report.notes);
                all
            }
        });
    }
    let mut report = merged.expect("a fleet has at least one cluster");
    let across = waves::judge(&members, &report.findings);
    report.findings.extend(across);
    sort(&mut report.findings);
    Ok(report)
}

/// Each cluster's status file, in the fleet's order, with `--status DIR`
/// (`DIR/<cluster>.yaml`): every one must be there.
fn fleet_statuses(
    options: &Options,
    waves: &[crate::fleet::Wave],
) -> Result<Vec<Option<PathBuf>>, UsageError> {
    let clusters = crate::fleet::clusters(waves);
    let Some(dir) = &options.status else {
        return Ok(clusters.map(|_| None).collect());
    };
    if !dir.is_dir() {
        return Err(UsageError::FleetStatus(dir.display().to_string()));
    }
    let files: Vec<(String, PathBuf)> = clusters
        .map(|(_, _, c)| (c.name.clone(), dir.join(format!("{}.yaml", c.name))))
        .collect();
    let missing: Vec<&(String, PathBuf)> =
        files.iter().filter(|(_, file)| !file.is_file()).collect();
    if missing.is_empty() {
        return Ok(files.into_iter().map(|(_, file)| Some(file)).collect());
    }
    let names: Vec<&str> = missing.iter().map(|(name, _)| name.as_str()).collect();
    let expected: Vec<String> = missing
        .iter()
        .map(|(_, file)| file.display().to_string())
        .collect();
    let mut others: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| !files.iter().any(|(c, _)| *name == format!("{c}.yaml")))
                .collect()
        })
        .unwrap_or_default();
    others.sort();
    Err(UsageError::FleetStatusMissing {
        dir: dir.display().to_string(),
        clusters: format!(
            "{} {}",
            if names.len() == 1 {
                "cluster"
            } else {
                "clusters"
            },
            names.join(", ")
        ),
        expected: expected.join(", "),
        holds: match others.as_slice() {
            [] => String::new(),
            [one] => format!(
                "; {} also holds {one}, which names no cluster of the fleet",
                dir.display()
            ),
            many => format!(
                "; {} also holds {}, which name no cluster of the fleet",
                dir.display(),
                many.join(", ")
            ),
        },
    })
}

/// With `--include` or `--exclude`: refused when they leave out every
/// file of a cluster's folder, at REV, and one of those holds an
/// OpenMedModel (the waves would judge that cluster as empty).
fn fleet_filter_hides_nothing(
    options: &Options,
    waves: &[crate::fleet::Wave],
    filter: &PathFilter,
) -> Result<(), UsageError> {
    if options.include.is_empty() && options.exclude.is_empty() {
        return Ok(());
    }
    let repo = open_repo(options)?;
    let yaml = |path: &str| source::is_yaml_name(std::path::Path::new(path));
    // (path, how to read it) of every YAML file at REV.
    let files: Vec<(String, Result<Oid, PathBuf>)> = if options.worktree {
        git::worktree_files(&repo, &yaml)
            .map_err(UsageError::Worktree)?
            .into_iter()
            .map(|(path, absolute)| (path, Err(absolute)))
            .collect()
    } else {
        let spec = options.rev.as_deref().unwrap_or("HEAD");
        let rev = git::commit(&repo, spec).map_err(|e| unknown("--rev", spec, &e))?;
        git::files(&repo, &rev.tree()?, &yaml)?
            .into_iter()
            .map(|(path, oid)| (path, Ok(oid)))
            .collect()
    };
    for (_, _, cluster) in crate::fleet::clusters(waves) {
        let scoped = filter.clone().within(&cluster.path);
        let prefix = format!("{}/", cluster.path);
        let folder = files.iter().filter(|(path, _)| path.starts_with(&prefix));
        if folder.clone().any(|(path, _)| scoped.keeps(path)) {
            continue;
        }
        for (path, at) in folder {
            let bytes = match at {
                Ok(oid) => git::blob(&repo, *oid)?,
                Err(absolute) => std::fs::read(absolute).map_err(UsageError::Worktree)?,
            };
            if mentions_model(path, &bytes) {
                return Err(UsageError::FleetFilter {
                    cluster: cluster.name.clone(),
                    path: cluster.path.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Each cluster's models before the change, in the fleet's order: their
/// versions at BASE, or none without a BASE (REV is a first commit). A
/// BASE that exists but is not in this shallow clone cannot be read, and
/// is refused: the wave rules could not tell what the change moved.
fn fleet_before(
    options: &Options,
    waves: &[crate::fleet::Wave],
) -> Result<Vec<waves::Before>, UsageError> {
    let repo = open_repo(options)?;
    let choice = match (&options.base, options.worktree) {
        (Some(spec), _) => BaseChoice::Given(resolve(&repo, "--base", spec)?),
        (None, true) => git::worktree_base(&repo),
        (None, false) => {
            let spec = options.rev.as_deref().unwrap_or("HEAD");
            let rev = git::commit(&repo, spec).map_err(|e| unknown("--rev", spec, &e))?;
            git::default_base(&repo, &rev)
        }
    };
    let base = match choice {
        BaseChoice::None { shallow: true } => return Err(UsageError::FleetBaseNotFetched),
        BaseChoice::None { shallow: false } => {
            let count = crate::fleet::clusters(waves).count();
            return Ok(vec![waves::Before::FirstCommit; count]);
        }
        found => found.oid().expect("a BASE that was found"),
    };
    let tree = repo.find_commit(base)?.tree()?;
    let ns = options.namespace.as_str();
    let mut all = Vec::new();
    for (_, _, cluster) in crate::fleet::clusters(waves) {
        let prefix = format!("{}/", cluster.path);
        let keep = |path: &str| path.starts_with(&prefix);
        let mut versions = HashMap::new();
        for (path, oid) in git::files(&repo, &tree, &keep)? {
            for doc in parse_file(&path, &git::blob(&repo, oid)?, None) {
                let (Some(key), Some(version)) = (
                    ResourceKey::of(&doc, ns),
                    doc.value.pointer("/spec/version").and_then(|v| v.as_str()),
                ) else {
                    continue;
                };
                versions.insert(
                    format!("{}/{}", key.namespace, key.name),
                    version.to_owned(),
                );
            }
        }
        all.push(waves::Before::Base(versions));
    }
    Ok(all)
}

/// [`verify`] of one cluster's files: those `filter` keeps.
fn verify_one(options: &Options, filter: &PathFilter) -> Result<Report, UsageError> {
    let keep = |path: &str| filter.keeps(path);
    let repo = open_repo(options)?;
    let cluster = options
        .status
        .as_deref()
        .map(|path| status::read(path, &options.namespace))
        .transpose()?;
    let ns = options.namespace.as_str();
    let mut findings = Vec::new();
    let mut notes = Vec::new();

    // REV: the files of a commit, or the files on disk.
    let (rev_label, rev_files, base_choice) = if options.worktree {
        let mut files = Vec::new();
        for (path, absolute) in git::worktree_files(&repo, &keep).map_err(UsageError::Worktree)? {
            let bytes = std::fs::read(&absolute).map_err(UsageError::Worktree)?;
            files.push((path, None, bytes));
        }
        let base = match &options.base {
            Some(spec) => BaseChoice::Given(resolve(&repo, "--base", spec)?),
            None => git::worktree_base(&repo),
        };
        ("worktree".to_owned(), files, base)
    } else {
        let spec = options.rev.as_deref().unwrap_or("HEAD");
        let rev = git::commit(&repo, spec).map_err(|e| unknown("--rev", spec, &e))?;
        let mut files = Vec::new();
        for (path, oid) in git::files(&repo, &rev.tree()?, &keep)? {
            files.push((path, Some(oid), git::blob(&repo, oid)?));
        }
        let base = match &options.base {
            Some(spec) => BaseChoice::Given(resolve(&repo, "--base", spec)?),
            None => git::default_base(&repo, &rev),
        };
        (rev.id().to_string(), files, base)
    };
    let mut parsed: HashMap<String, Parsed> = HashMap::new();
    let mut rev_docs = Vec::new();
    for (path, oid, bytes) in rev_files {
        let docs = parse_file(&path, &bytes, Some(&mut findings));
        rev_docs.extend(docs.iter().cloned());
        parsed.insert(path, Parsed { oid, docs });
    }

    // BASE: only its OpenMedModels matter.
    if let BaseChoice::None { shallow } = base_choice {
        notes.push(if shallow {
            "no BASE: REV's parent is not in this shallow clone, so every OpenMedModel is judged as new and no version is retained; fetch more history (actions/checkout: fetch-depth: 0) or pass --base".to_owned()
        } else {
            "no BASE: REV is a root commit, so every OpenMedModel is judged as new".to_owned()
        });
    }
    let base_commit = base_choice.oid().map(|o| repo.find_commit(o)).transpose()?;
    let mut base_files: Vec<(String, Vec<Document>)> = Vec::new();
    if let Some(base) = &base_commit {
        for (path, oid) in git::files(&repo, &base.tree()?, &keep)? {
            let docs = match parsed.get(&path) {
                Some(p) if p.oid == Some(oid) => p.docs.clone(),
                _ => parse_file(&path, &git::blob(&repo, oid)?, None),
            };
            let models: Vec<Document> = docs
                .into_iter()
                .filter(|d| ResourceKey::of(d, ns).is_some())
                .collect();
            if !models.is_empty() {
                base_files.push((path, models));
            }
        }
    }
    let base_docs: Vec<Document> = base_files
        .iter()
        .flat_map(|(_, docs)| docs.iter().cloned())
        .collect();

    // History: walked once, for every resource at REV without cluster status.
    let wanted: Vec<ResourceKey> = rev_docs
        .iter()
        .filter_map(|d| ResourceKey::of(d, ns))
        .filter(|k| cluster.as_ref().is_none_or(|c| !c.contains_key(k)))
        .collect();
    let mut history = VersionHistory::new(wanted.iter().cloned());
    if let Some(base) = &base_commit
        && !wanted.is_empty()
    {
        history.start(
            base_files
                .iter()
                .map(|(path, docs)| (path.clone(), Arc::new(history::entries(docs, ns)))),
        );
        let end = git::walk_first_parent(&repo, base, &keep, &mut history, |path, bytes| {
            history::entries(&parse_file(path, bytes, None), ns)
        })?;
        if end == WalkEnd::Shallow {
            notes.push(format!(
                "history is shallow: only {} commits of BASE's first-parent history are in this clone, so history-derived retained versions may be incomplete; fetch more history (actions/checkout: fetch-depth: 0)",
                history.commits()
            ));
        }
    }
    let history_commits = history.commits();
    let versions = history.finish();

    let outcome = rules::check(&rules::Input {
        rev: &rev_docs,
        base: base_commit.as_ref().map(|_| base_docs.as_slice()),
        history: &versions,
        status: cluster.as_ref(),
        default_namespace: ns,
        strict: options.strict,
    });
    findings.extend(outcome.findings);
    let derived = outcome
        .resources
        .iter()
        .filter(|r| {
            r.rollback_to.is_some() && r.retained_versions_source == RetainedSource::History
        })
        .count();
    if derived > 0 {
        notes.push(format!(
            "rollback targets of {derived} resource{} were checked against history-derived versions (the last two distinct spec.version values on BASE's first-parent history), not the cluster's; pass --status to use what the operator actually retains",
            if derived == 1 { "" } else { "s" }
        ));
    }
    sort(&mut findings);
    Ok(Report {
        base: base_commit.map(|c| c.id().to_string()),
        rev: rev_label,
        findings,
        resources: outcome.resources,
        history_commits,
        notes,
    })
}

/// The repository `--repo` is in.
fn open_repo(options: &Options) -> Result<Repository, UsageError> {
    git::open(&options.repo).map_err(|e| UsageError::NotARepository {
        path: options.repo.display().to_string(),
        message: e.message().to_owned(),
    })
}

fn resolve(repo: &Repository, flag: &'static str, spec: &str) -> Result<Oid, UsageError> {
    git::commit(repo, spec)
        .map(|c| c.id())
        .map_err(|e| unknown(flag, spec, &e))
}

fn unknown(flag: &'static str, spec: &str, e: &git2::Error) -> UsageError {
    UsageError::UnknownRevision {
        flag,
        spec: spec.to_owned(),
        message: e.message().to_owned(),
    }
}

/// The documents of a file. A file that is not YAML is skipped, unless it
/// mentions OpenMedModel: then it is a broken manifest, reported to
/// `findings` when given (REV), and skipped otherwise (BASE, history).
fn parse_file(path: &str, bytes: &[u8], findings: Option<&mut Vec<Finding>>) -> Vec<Document> {
    match source::parse_bytes(path, bytes) {
        Ok(docs) => docs,
        Err(error) => {
            if let (true, Some(findings)) = (mentions_model(path, bytes), findings) {
                let (document, line, message) = match &error {
                    ReadError::Yaml {
                        document,
                        line,
                        message,
                        ..
                    } => (*document, Some(*line), message.clone()),
                    ReadError::Io { .. } | ReadError::TooLarge { .. } => {
                        (0, None, error.to_string())
                    }
                };
                findings.push(Finding::error(
                    &Location {
                        origin: Arc::from(path),
                        document,
                        line,
                    },
                    rules::rule::INVALID_YAML,
                    format!("not valid YAML, so its OpenMedModels cannot be checked: {message}"),
                ));
            }
            Vec::new()
        }
    }
}

/// Whether a file mentions OpenMedModel, judged as `render` judges a
/// file: decoded the same way (a BOM, UTF-16), with the same limits.
fn mentions_model(path: &str, bytes: &[u8]) -> bool {
    match source::decode_text(path, bytes) {
        Ok(text) => text.contains(crate::api::KIND),
        Err(_) => {
            contains(bytes, crate::api::KIND.as_bytes())
                || contains(bytes, &utf16le(crate::api::KIND))
                || contains(bytes, &utf16be(crate::api::KIND))
        }
    }
}

fn utf16le(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn utf16be(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// File, then errors before warnings, then line and document.
fn sort(findings: &mut [Finding]) {
    fn key(f: &Finding) -> (&str, Severity, Option<usize>, usize) {
        (
            f.location.file.as_str(),
            f.severity,
            f.location.line,
            f.location.document,
        )
    }
    findings.sort_by(|a, b| key(a).cmp(&key(b)));
}
