//! Reading YAML streams: files, directories and stdin, into documents that
//! remember where they came from.
//!
//! `render` and `verify` both read Kubernetes manifests and both must name
//! the file, the document and the line of a problem, so this is written once
//! here. Nothing in this module knows about OpenMedModels.

pub mod edit;
mod positions;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::Deserialize;
use serde_json::Value;

pub use positions::Positions;

/// One YAML document of an input stream.
#[derive(Debug, Clone)]
pub struct Document {
    /// Where it came from: a path as given, or `<stdin>`.
    pub origin: Arc<str>,
    /// 0-based position in its stream, counting every document.
    pub index: usize,
    /// The document's content.
    pub value: Value,
    stream: Option<Arc<StreamIndex>>,
}

/// Line numbers of every document of one stream, indexed on first use: most
/// input is valid, and only a finding needs a line, so the second parse is
/// paid only then.
#[derive(Debug)]
struct StreamIndex {
    text: Arc<str>,
    documents: OnceLock<Vec<Positions>>,
}

impl StreamIndex {
    fn positions(&self, document: usize) -> Option<&Positions> {
        self.documents
            .get_or_init(|| positions::index_stream(&self.text).unwrap_or_default())
            .get(document)
    }
}

impl Document {
    /// A document that did not come from YAML text (a KRM function's
    /// `ResourceList` item): it has no line numbers.
    pub fn from_value(origin: &str, index: usize, value: Value) -> Self {
        Document {
            origin: Arc::from(origin),
            index,
            value,
            stream: None,
        }
    }

    /// 1-based line where `path` (`spec.rolloutStrategy.maxSurge`) starts, or
    /// its nearest ancestor's line.
    pub fn line_of(&self, path: &str) -> usize {
        self.stream
            .as_ref()
            .and_then(|s| s.positions(self.index))
            .map_or(0, |p| p.line_of(path))
    }

    /// `kind` of the document, if it is a string.
    pub fn kind(&self) -> Option<&str> {
        self.value.get("kind")?.as_str()
    }

    /// `apiVersion` of the document, if it is a string.
    pub fn api_version(&self) -> Option<&str> {
        self.value.get("apiVersion")?.as_str()
    }

    /// `metadata.name`, if it is a string.
    pub fn name(&self) -> Option<&str> {
        self.value.get("metadata")?.get("name")?.as_str()
    }

    /// `metadata.namespace`, if it is a string.
    pub fn namespace(&self) -> Option<&str> {
        self.value.get("metadata")?.get("namespace")?.as_str()
    }

    /// A place in this document, for messages.
    pub fn at(&self, path: &str) -> Location {
        let line = self.line_of(path);
        Location {
            origin: self.origin.clone(),
            document: self.index,
            line: (line > 0).then_some(line),
        }
    }
}

/// A place in the input: file, document and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// File path as given, or `<stdin>`.
    pub origin: Arc<str>,
    /// 0-based document index in the stream.
    pub document: usize,
    /// 1-based line, when known.
    pub line: Option<usize>,
}

impl fmt::Display for Location {
    /// `file:line: document N` (documents counted from 1, as people count).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: document {}", self.origin, self.document + 1),
            None => write!(f, "{}: document {}", self.origin, self.document + 1),
        }
    }
}

/// Input that cannot be read as YAML at all (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A file or directory could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A document is not valid YAML, or not a mapping of string keys.
    #[error("{origin}:{line}: document {document}: not valid YAML: {message}", document = .document + 1)]
    Yaml {
        /// The path as given, or `<stdin>`.
        origin: Arc<str>,
        /// 0-based document index.
        document: usize,
        /// 1-based line.
        line: usize,
        /// What the parser said.
        message: String,
    },
}

/// Reads every input in order: a file, a directory (every `*.yaml`/`*.yml`
/// below it, sorted by path so output is stable), or `-` for stdin.
pub fn read_inputs(inputs: &[PathBuf]) -> Result<Vec<Document>, ReadError> {
    let mut docs = Vec::new();
    for input in inputs {
        if input.as_os_str() == "-" {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|source| {
                ReadError::Io {
                    path: "<stdin>".into(),
                    source,
                }
            })?;
            docs.extend(parse_stream("<stdin>", &text)?);
            continue;
        }
        for file in yaml_files(input)? {
            let text = std::fs::read_to_string(&file).map_err(|source| ReadError::Io {
                path: file.display().to_string(),
                source,
            })?;
            docs.extend(parse_stream(&file.display().to_string(), &text)?);
        }
    }
    Ok(docs)
}

/// `path` itself if it is a file, else every YAML file below it, sorted.
pub fn yaml_files(path: &Path) -> Result<Vec<PathBuf>, ReadError> {
    files_below(path, is_yaml_name)
}

/// `path` itself if it is a file, else every file below it that `keep`
/// accepts, sorted by path so output never depends on the file system.
pub fn files_below(path: &Path, keep: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>, ReadError> {
    let io = |source: std::io::Error| ReadError::Io {
        path: path.display().to_string(),
        source,
    };
    if !std::fs::metadata(path).map_err(io)?.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(path).follow_links(true) {
        let entry = entry.map_err(|e| io(e.into()))?;
        if entry.file_type().is_file() && keep(entry.path()) {
            files.push(entry.into_path());
        }
    }
    files.sort();
    Ok(files)
}

/// True for `*.yaml` and `*.yml`.
pub fn is_yaml_name(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// Parses a multi-document stream. Empty documents are skipped (as kubectl
/// does) but still counted, so indices match what an editor shows.
///
/// Alias expansion is bounded by `serde_yaml`, which refuses a document whose
/// aliases expand to more than a hundred times its own size ("billion
/// laughs"), so a hostile file cannot exhaust memory.
pub fn parse_stream(origin: &str, text: &str) -> Result<Vec<Document>, ReadError> {
    let origin: Arc<str> = Arc::from(origin);
    let stream = Arc::new(StreamIndex {
        text: Arc::from(text),
        documents: OnceLock::new(),
    });
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).map_err(|e| ReadError::Yaml {
            origin: origin.clone(),
            document: index,
            line: e.location().map_or(1, |l| l.line()),
            message: strip_location(&e.to_string()),
        })?;
        if value.is_null() {
            continue;
        }
        if !value.is_object() {
            let line = stream.positions(index).map_or(1, |p| p.start_line().max(1));
            return Err(ReadError::Yaml {
                origin: origin.clone(),
                document: index,
                line,
                message: "a Kubernetes manifest must be a mapping".into(),
            });
        }
        docs.push(Document {
            origin: origin.clone(),
            index,
            value,
            stream: Some(stream.clone()),
        });
    }
    Ok(docs)
}

/// serde_yaml appends " at line L column C"; the location is printed separately.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(cut) => message[..cut].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_keep_their_index_and_empty_ones_are_skipped() {
        let docs = parse_stream("x.yaml", "a: 1\n---\n---\nb: 2\n").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].index, 0);
        assert_eq!(docs[1].index, 2);
        assert_eq!(docs[1].line_of("b"), 4);
    }

    #[test]
    fn malformed_yaml_names_document_and_line() {
        let err = parse_stream("x.yaml", "a: 1\n---\nb: [1, 2\n").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("x.yaml:"), "{text}");
        assert!(text.contains("document 2"), "{text}");
    }

    #[test]
    fn a_scalar_document_is_refused() {
        let err = parse_stream("x.yaml", "just text\n").unwrap_err();
        assert!(err.to_string().contains("must be a mapping"), "{err}");
    }

    #[test]
    fn exponential_alias_expansion_is_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let err = parse_stream("bomb.yaml", &text).unwrap_err();
        assert!(err.to_string().contains("repetition limit"), "{err}");
    }
}
