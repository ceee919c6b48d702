//! The fleet's waves, as a repository declares them in `openmed-fleet.yaml`
//! at its root: the clusters in the order Flux applies them
//! (`examples/fleet`, docs/fleet.md), each with the folder it reads. Pure:
//! the text in, the waves or the first problem with its line out; the
//! shells (`render`) read the file and each wave's folder.

/// The file a fleet repository declares its waves in, at its root.
pub const FILE_NAME: &str = "openmed-fleet.yaml";

/// Its `kind`.
pub const KIND: &str = "OpenMedFleet";

/// One wave: the clusters Flux applies together, after every cluster of
/// the wave before has soaked. Most waves are one cluster (`path:`); a
/// wave of several (`clusters:`) runs them side by side, so they must ask
/// for the same versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// The wave's name; a one-cluster wave's cluster has the same name.
    pub name: String,
    /// Its clusters, in the file's order: at least one.
    pub clusters: Vec<Cluster>,
}

/// One cluster of a wave and the folder of the repository it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The cluster's name, as the management cluster's Kustomization
    /// names it (and `verify --status DIR` reads `DIR/<name>.yaml`).
    pub name: String,
    /// The folder, relative to the repository's root.
    pub path: String,
}

impl Wave {
    /// `hospital-a (clusters/hospital-a)`, or for a wave of several
    /// clusters `hospitals: cluster hospital-a (clusters/hospital-a)`.
    pub fn label(&self, cluster: &Cluster) -> String {
        if self.clusters.len() == 1 && cluster.name == self.name {
            format!("{} ({})", cluster.name, cluster.path)
        } else {
            format!("{}: cluster {} ({})", self.name, cluster.name, cluster.path)
        }
    }
}

/// Every cluster of the fleet in order, with the index of its wave.
pub fn clusters(waves: &[Wave]) -> impl Iterator<Item = (usize, &Wave, &Cluster)> {
    waves
        .iter()
        .enumerate()
        .flat_map(|(i, w)| w.clusters.iter().map(move |c| (i, w, c)))
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
    // Every name (waves' and clusters') and every path seen so far.
    let mut names: Vec<String> = Vec::new();
    let mut paths: Vec<(String, String)> = Vec::new();
    for (i, item) in raw.iter().enumerate() {
        let at = format!("waves[{i}]");
        let Some(fields) = item.as_object() else {
            return Err(error(
                &at,
                "a mapping with name and path (or clusters)".into(),
            ));
        };
        if let Some(key) = fields
            .keys()
            .find(|k| !["name", "path", "clusters"].contains(&k.as_str()))
        {
            return Err(error(
                &format!("{at}.{key}"),
                "unknown field (name, path and clusters are known)".into(),
            ));
        }
        let name = name_at(item, &at, &mut names, &error)?;
        let clusters = match (fields.get("path"), fields.get("clusters")) {
            (Some(_), Some(_)) => {
                return Err(error(
                    &format!("{at}.clusters"),
                    "a wave has either path (one cluster) or clusters, not both".into(),
                ));
            }
            (_, Some(list)) => {
                let Some(list) = list.as_array().filter(|l| !l.is_empty()) else {
                    return Err(error(
                        &format!("{at}.clusters"),
                        "a list of at least one cluster, each with name and path".into(),
                    ));
                };
                let mut clusters = Vec::new();
                for (j, cluster) in list.iter().enumerate() {
                    let at = format!("{at}.clusters[{j}]");
                    let Some(fields) = cluster.as_object() else {
                        return Err(error(&at, "a mapping with name and path".into()));
                    };
                    if let Some(key) = fields.keys().find(|k| *k != "name" && *k != "path") {
                        return Err(error(
                            &format!("{at}.{key}"),
                            "unknown field (name and path are known)".into(),
                        ));
                    }
                    let name = name_at(cluster, &at, &mut names, &error)?;
                    let path = path_at(cluster, &at, &mut paths, &name, &error)?;
                    clusters.push(Cluster { name, path });
                }
                clusters
            }
            _ => {
                let path = path_at(item, &at, &mut paths, &name, &error)?;
                vec![Cluster {
                    name: name.clone(),
                    path,
                }]
            }
        };
        waves.push(Wave { name, clusters });
    }
    Ok(waves)
}

/// The `name` of the wave or cluster at `at`: a DNS label (a cluster's
/// name is its Kustomization's and its status file's) no other wave or
/// cluster has.
fn name_at(
    item: &serde_json::Value,
    at: &str,
    names: &mut Vec<String>,
    error: &impl Fn(&str, String) -> FleetError,
) -> Result<String, FleetError> {
    let Some(name) = item.get("name").and_then(|v| v.as_str()).map(str::to_owned) else {
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
    if names.contains(&name) {
        return Err(error(
            &format!("{at}.name"),
            format!("{name} is named twice"),
        ));
    }
    names.push(name.clone());
    Ok(name)
}

/// The `path` of the cluster at `at`, cleaned: a folder inside the
/// repository that holds no other cluster's folder and is in none.
fn path_at(
    item: &serde_json::Value,
    at: &str,
    paths: &mut Vec<(String, String)>,
    cluster: &str,
    error: &impl Fn(&str, String) -> FleetError,
) -> Result<String, FleetError> {
    let Some(given) = item.get("path").and_then(|v| v.as_str()) else {
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
    if let Some((other, other_path)) = paths
        .iter()
        .find(|(_, p)| nested(p, &path) || nested(&path, p))
    {
        return Err(error(
            &format!("{at}.path"),
            format!(
                "{path} and cluster {other}'s {other_path} hold each other: each file belongs to one cluster"
            ),
        ));
    }
    paths.push((cluster.to_owned(), path.clone()));
    Ok(path)
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
        let one = |name: &str, path: &str| Wave {
            name: name.into(),
            clusters: vec![Cluster {
                name: name.into(),
                path: path.into(),
            }],
        };
        assert_eq!(
            waves,
            [
                one("staging", "clusters/staging"),
                one("hospital-a", "clusters/hospital-a")
            ]
        );
        assert_eq!(
            waves[1].label(&waves[1].clusters[0]),
            "hospital-a (clusters/hospital-a)"
        );
    }

    #[test]
    fn a_wave_of_several_clusters_lists_each_with_its_folder() {
        let text = "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedFleet\nwaves:\n  - name: staging\n    path: clusters/staging\n  - name: hospitals\n    clusters:\n      - name: hospital-a\n        path: clusters/hospital-a\n      - name: hospital-b\n        path: clusters/hospital-b/\n";
        let waves = parse(FILE_NAME, text).unwrap();
        assert_eq!(waves.len(), 2);
        assert_eq!(waves[1].name, "hospitals");
        let all: Vec<(usize, &str, &str)> = clusters(&waves)
            .map(|(i, _, c)| (i, c.name.as_str(), c.path.as_str()))
            .collect();
        assert_eq!(
            all,
            [
                (0, "staging", "clusters/staging"),
                (1, "hospital-a", "clusters/hospital-a"),
                (1, "hospital-b", "clusters/hospital-b")
            ]
        );
        assert_eq!(
            waves[1].label(&waves[1].clusters[1]),
            "hospitals: cluster hospital-b (clusters/hospital-b)"
        );
        let bad = |text: String| parse(FILE_NAME, &text).unwrap_err();
        let e = bad(text.replace("name: hospital-b", "name: staging"));
        assert!(e.message.starts_with("waves[1].clusters[1].name: "), "{e}");
        assert!(e.message.contains("named twice"), "{e}");
        assert_eq!(e.line, 10, "{e}");
        let e = bad(text.replace("clusters/hospital-b/", "clusters/staging/b"));
        assert!(
            e.message
                .contains("cluster staging's clusters/staging hold each other"),
            "{e}"
        );
        let e = bad(text.replace("    clusters:\n", "    path: x\n    clusters:\n"));
        assert!(
            e.message.contains("either path (one cluster) or clusters"),
            "{e}"
        );
        let e = bad(text.replace("        path: clusters/hospital-a\n", ""));
        assert!(
            e.message.starts_with("waves[1].clusters[0].path: required"),
            "{e}"
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
