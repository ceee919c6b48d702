//! The fleet's waves, as a repository declares them in `openmed-fleet.yaml`
//! at its root: the clusters in the order Flux applies them
//! (`examples/fleet`, docs/fleet.md), each with the folder it reads. Pure:
//! the text in, the waves or the first problem with its line out; the
//! shells (`render`) read the file and each wave's folder.

/// The file a fleet repository declares its waves in, at its root.
pub const FILE_NAME: &str = "openmed-fleet.yaml";

/// Its `kind`.
pub const KIND: &str = "OpenMedFleet";

/// One wave: a cluster and the folder of the repository it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// The cluster's name, as the management cluster's Kustomization
    /// names it.
    pub name: String,
    /// The folder, relative to the repository's root.
    pub path: String,
}

/// What is wrong with a fleet file: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct FleetError {
    /// The file, as given.
    pub file: String,
    /// The line (1-based) the problem is on; 1 when the file as a whole.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// The waves `text` (the contents of `file`) declares, in order: at
/// least one, names unique DNS labels, paths relative folders inside the
/// repository, none inside another's. Read as every manifest is
/// (`source`), so each problem names its field's line.
pub fn parse(file: &str, text: &str) -> Result<Vec<Wave>, FleetError> {
    let docs = crate::source::parse_bytes(file, text.as_bytes()).map_err(|e| {
        let (line, message) = match &e {
            crate::source::ReadError::Yaml { line, message, .. } => (*line, message.clone()),
            other => (1, other.to_string()),
        };
        FleetError {
            file: file.to_owned(),
            line,
            message,
        }
    })?;
    let [doc] = docs.as_slice() else {
        return Err(FleetError {
            file: file.to_owned(),
            line: 1,
            message: format!("one document is expected, not {}", docs.len()),
        });
    };
    let error = |path: &str, message: String| FleetError {
        file: file.to_owned(),
        line: doc.line_of(path).max(1),
        message: format!("{path}: {message}"),
    };
    let value = &doc.value;
    let Some(fields) = value.as_object() else {
        return Err(error("", "must be a mapping".into()));
    };
    for key in fields.keys() {
        if !["apiVersion", "kind", "waves"].contains(&key.as_str()) {
            return Err(error(
                key,
                "unknown field (apiVersion, kind and waves are known)".into(),
            ));
        }
    }
    if value["apiVersion"] != crate::api::API_VERSION || value["kind"] != KIND {
        return Err(error(
            "kind",
            format!(
                "apiVersion and kind must be {} and {KIND}",
                crate::api::API_VERSION
            ),
        ));
    }
    let Some(raw) = value["waves"].as_array().filter(|w| !w.is_empty()) else {
        return Err(error("waves", "a list of at least one wave".into()));
    };
    let mut waves: Vec<Wave> = Vec::new();
    for (i, item) in raw.iter().enumerate() {
        let at = format!("waves[{i}]");
        let Some(item) = item.as_object() else {
            return Err(error(&at, "a mapping with name and path".into()));
        };
        if let Some(key) = item.keys().find(|k| *k != "name" && *k != "path") {
            return Err(error(
                &format!("{at}.{key}"),
                "unknown field (name and path are known)".into(),
            ));
        }
        let field = |key: &str| item.get(key).and_then(|v| v.as_str()).map(str::to_owned);
        let Some(name) = field("name") else {
            return Err(error(
                &format!("{at}.name"),
                "required: the cluster's name".into(),
            ));
        };
        if !crate::api::rules::is_dns_label(&name) {
            return Err(error(
                &format!("{at}.name"),
                format!("{name:?} is not a DNS label (a cluster's name)"),
            ));
        }
        if waves.iter().any(|w| w.name == name) {
            return Err(error(
                &format!("{at}.name"),
                format!("{name} is named twice"),
            ));
        }
        let Some(given) = field("path") else {
            return Err(error(
                &format!("{at}.path"),
                "required: the cluster's folder".into(),
            ));
        };
        let path = given
            .trim_end_matches('/')
            .trim_start_matches("./")
            .to_owned();
        let inside = !path.is_empty()
            && !path.starts_with('/')
            && path
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !inside {
            return Err(error(
                &format!("{at}.path"),
                format!("{given:?} must be a folder inside the repository, relative to its root"),
            ));
        }
        if let Some(other) = waves
            .iter()
            .find(|w| nested(&w.path, &path) || nested(&path, &w.path))
        {
            return Err(error(
                &format!("{at}.path"),
                format!(
                    "{path} and wave {}'s {} hold each other: each file belongs to one wave",
                    other.name, other.path
                ),
            ));
        }
        waves.push(Wave { name, path });
    }
    Ok(waves)
}

/// `inner` is `outer` or a folder inside it.
fn nested(outer: &str, inner: &str) -> bool {
    inner == outer || inner.starts_with(&format!("{outer}/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedFleet\nwaves:\n  - name: staging\n    path: clusters/staging\n  - name: hospital-a\n    path: ./clusters/hospital-a/\n";

    #[test]
    fn the_waves_come_in_their_order_with_their_paths_cleaned() {
        let waves = parse(FILE_NAME, GOOD).unwrap();
        assert_eq!(
            waves,
            [
                Wave {
                    name: "staging".into(),
                    path: "clusters/staging".into()
                },
                Wave {
                    name: "hospital-a".into(),
                    path: "clusters/hospital-a".into()
                },
            ]
        );
    }

    #[test]
    fn each_problem_names_its_line() {
        let bad = |text: &str| parse(FILE_NAME, text).unwrap_err();
        let e = bad(&GOOD.replace("path: clusters/staging", "path: ../staging"));
        assert_eq!(e.line, 5, "{e}");
        assert!(e.message.starts_with("waves[0].path: "), "{e}");
        assert!(e.message.contains("inside the repository"), "{e}");
        let e = bad(&GOOD.replace("hospital-a\n", "staging\n"));
        assert_eq!(e.line, 6, "the second wave of that name: {e}");
        assert!(e.message.contains("named twice"), "{e}");
        let e = bad(&GOOD.replace("./clusters/hospital-a/", "clusters/staging/a"));
        assert!(e.message.contains("hold each other"), "{e}");
        let e = bad(&GOOD.replace("kind: OpenMedFleet", "kind: Fleet"));
        assert_eq!(
            (
                e.line,
                e.to_string().starts_with("openmed-fleet.yaml:2: kind: ")
            ),
            (2, true),
            "{e}"
        );
        let e = bad(&format!("{GOOD}    cluster: x\n"));
        assert!(
            e.message.starts_with("waves[1].cluster: unknown field"),
            "{e}"
        );
        assert_eq!(e.line, 8, "{e}");
        let e = bad("apiVersion: openmed.ai/v1alpha1\nkind: OpenMedFleet\nwaves: []\n");
        assert!(e.message.contains("at least one wave"), "{e}");
        let e = bad(&GOOD.replace("name: staging", "name: Staging_1"));
        assert!(e.message.contains("DNS label"), "{e}");
        let e = bad("waves: [\n");
        assert_eq!(e.file, FILE_NAME);
        assert!(e.line >= 1, "{e}");
    }
}
