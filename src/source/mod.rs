//! Reading YAML streams: files, directories and stdin, into documents that
//! remember where they came from.
//!
//! `render` and `verify` both read Kubernetes manifests and both must name
//! the file, the document and the line of a problem, so this is written once
//! here. Nothing in this module knows about OpenMedModels.

pub mod edit;
mod positions;
pub mod yaml;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

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
    /// An input larger than [`MAX_STREAM_BYTES`].
    #[error("{origin}: larger than {} MiB, the most one input may hold", .limit / (1024 * 1024))]
    TooLarge {
        /// The path as given, or `<stdin>`.
        origin: String,
        /// The limit in bytes.
        limit: u64,
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

/// The most one input (a file, a Git blob, stdin) may hold. Larger input
/// is refused before it is read, so `render - < /dev/zero` stops at once.
pub const MAX_STREAM_BYTES: u64 = 64 * 1024 * 1024;

/// The most one document may hold, as the JSON the API server receives:
/// its default request-body limit (3 MiB), so what passes here can be sent.
pub const MAX_DOCUMENT_BYTES: usize = 3 * 1024 * 1024;

/// Reads every input in order: a file, a directory (every `*.yaml`/`*.yml`
/// below it, sorted by path so output is stable), or `-` for stdin. A file
/// named twice (directly or through a directory) is read once, where it
/// first appears.
pub fn read_inputs(inputs: &[PathBuf]) -> Result<Vec<Document>, ReadError> {
    let mut docs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for input in inputs {
        if input.as_os_str() == "-" {
            let bytes = read_bounded("<stdin>", std::io::stdin().lock())?;
            docs.extend(parse_bytes("<stdin>", &bytes)?);
            continue;
        }
        for file in yaml_files(input)? {
            let identity = std::fs::canonicalize(&file).unwrap_or_else(|_| file.clone());
            if !seen.insert(identity) {
                continue;
            }
            let bytes = read_file(&file)?;
            docs.extend(parse_bytes(&file.display().to_string(), &bytes)?);
        }
    }
    Ok(docs)
}

/// A whole file, refused when it is larger than [`MAX_STREAM_BYTES`].
pub fn read_file(file: &Path) -> Result<Vec<u8>, ReadError> {
    let origin = file.display().to_string();
    let opened = std::fs::File::open(file).map_err(|source| ReadError::Io {
        path: origin.clone(),
        source,
    })?;
    read_bounded(&origin, opened)
}

/// Reads at most [`MAX_STREAM_BYTES`] and one more, to tell "too large".
fn read_bounded(origin: &str, reader: impl std::io::Read) -> Result<Vec<u8>, ReadError> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut reader.take(MAX_STREAM_BYTES + 1), &mut bytes).map_err(
        |source| ReadError::Io {
            path: origin.to_owned(),
            source,
        },
    )?;
    if bytes.len() as u64 > MAX_STREAM_BYTES {
        return Err(ReadError::TooLarge {
            origin: origin.to_owned(),
            limit: MAX_STREAM_BYTES,
        });
    }
    Ok(bytes)
}

/// The text of an input, as kubectl decodes a file: a UTF-8 byte-order
/// mark is dropped, a UTF-16 one (either byte order) decodes the rest as
/// UTF-16; anything else must be UTF-8.
pub fn decode_text(origin: &str, bytes: &[u8]) -> Result<String, ReadError> {
    let not_text = |message: String| ReadError::Yaml {
        origin: Arc::from(origin),
        document: 0,
        line: 1,
        message,
    };
    let utf16 = |big_endian: bool, body: &[u8]| {
        if !body.len().is_multiple_of(2) {
            return Err(not_text("UTF-16 text with an odd number of bytes".into()));
        }
        let units = body.chunks_exact(2).map(|pair| {
            let pair = [pair[0], pair[1]];
            if big_endian {
                u16::from_be_bytes(pair)
            } else {
                u16::from_le_bytes(pair)
            }
        });
        char::decode_utf16(units)
            .collect::<Result<String, _>>()
            .map_err(|e| not_text(format!("not valid UTF-16: {e}")))
    };
    match bytes {
        [0xEF, 0xBB, 0xBF, rest @ ..] => utf8(rest).map_err(not_text),
        [0xFE, 0xFF, rest @ ..] => utf16(true, rest),
        [0xFF, 0xFE, rest @ ..] => utf16(false, rest),
        _ => utf8(bytes).map_err(not_text),
    }
}

fn utf8(bytes: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "not UTF-8 text (byte {} is not UTF-8); save it as UTF-8",
            e.valid_up_to()
        )
    })?;
    if text.contains('\0') {
        return Err(
            "contains NUL bytes: UTF-16 without a byte-order mark? Save it as UTF-8".into(),
        );
    }
    Ok(text.to_owned())
}

/// [`decode_text`], then [`parse_stream`].
pub fn parse_bytes(origin: &str, bytes: &[u8]) -> Result<Vec<Document>, ReadError> {
    if bytes.len() as u64 > MAX_STREAM_BYTES {
        return Err(ReadError::TooLarge {
            origin: origin.to_owned(),
            limit: MAX_STREAM_BYTES,
        });
    }
    parse_stream(origin, &decode_text(origin, bytes)?)
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

/// Parses a multi-document stream as the API server reads YAML
/// ([`yaml::read`]). Empty documents are skipped (as kubectl does) but
/// still counted, so indices match what an editor shows. A document larger
/// than [`MAX_DOCUMENT_BYTES`] as JSON is refused.
pub fn parse_stream(origin: &str, text: &str) -> Result<Vec<Document>, ReadError> {
    let origin: Arc<str> = Arc::from(origin);
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    let stream = Arc::new(StreamIndex {
        text: Arc::from(text),
        documents: OnceLock::new(),
    });
    let values = yaml::read::read_stream(text).map_err(|e| ReadError::Yaml {
        origin: origin.clone(),
        document: e.document,
        line: e.line.max(1),
        message: e.message,
    })?;
    let mut docs = Vec::new();
    for (index, value) in values.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        let line = || stream.positions(index).map_or(1, |p| p.start_line().max(1));
        if !value.is_object() {
            return Err(ReadError::Yaml {
                origin: origin.clone(),
                document: index,
                line: line(),
                message: "a Kubernetes manifest must be a mapping".into(),
            });
        }
        let size = serde_json::to_vec(&value).map_or(0, |json| json.len());
        if size > MAX_DOCUMENT_BYTES {
            return Err(ReadError::Yaml {
                origin: origin.clone(),
                document: index,
                line: line(),
                message: format!(
                    "{} as JSON, more than the {} MiB the API server accepts in one request",
                    human_bytes(size as u64),
                    MAX_DOCUMENT_BYTES / (1024 * 1024)
                ),
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

/// `3.2 MiB`, `512 KiB`, `12 bytes`.
pub fn human_bytes(n: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if n >= MIB {
        format!("{:.1} MiB", n as f64 / MIB as f64)
    } else if n >= 1024 {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} bytes")
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
        assert!(err.to_string().contains("alias bomb"), "{err}");
    }
}
