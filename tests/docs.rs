//! The documents stay in step with the product: the field reference is
//! the one generated from the CRD, every Markdown file renders (no fence
//! left open), every relative link and anchor resolves, and the pictures
//! are what `docs/images/draw.py` draws, naming only phases, Event
//! reasons, weights and waves the code and the examples have.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_reference_is_the_one_generated_from_the_crd() {
    let path = root().join("docs/reference.md");
    let generated = openmed_op::api::reference::markdown();
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(&path, &generated).unwrap();
            return;
        }
        panic!(
            "docs/reference.md differs from `openmed-op crd --reference`; regenerate it with\n  cargo run -- crd --reference > docs/reference.md\n(or UPDATE_DOCS=1 cargo test --test docs)"
        );
    }
}

/// Every Markdown file of the project, relative to the root.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !["target", ".git", "corpus", "node_modules"].contains(&name.as_ref()) {
                    walk(&path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    for dir in ["docs", "deploy", "examples", "tests", "benches", "fuzz"] {
        walk(&root().join(dir), &mut out);
    }
    out.sort();
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The line (1-based) of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[test]
fn every_document_renders_with_its_fences_closed() {
    let mut problems = Vec::new();
    for path in documents() {
        let text = read(&path);
        for (event, range) in Parser::new_ext(&text, Options::all()).into_offset_iter() {
            let Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(_))) = event else {
                continue;
            };
            // A fence never closed runs to the end of the document: its
            // last line is then not a closing fence.
            let block = &text[range.clone()];
            let opening = block.lines().next().unwrap_or_default().trim_start();
            let fence_char = opening.chars().next().unwrap_or('`');
            let fence_len = opening.chars().take_while(|c| *c == fence_char).count();
            let last = block.trim_end().lines().last().unwrap_or_default().trim();
            let closed = block.trim_end().lines().count() > 1
                && last.chars().take_while(|c| *c == fence_char).count() >= fence_len
                && last.chars().all(|c| c == fence_char);
            if !closed {
                problems.push(format!(
                    "{}:{}: a code fence opened here is never closed (it runs to the end of the document)",
                    relative(&path),
                    line_of(&text, range.start)
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens; a repeated heading gets `-1`, `-2`.
fn slug(heading: &str, seen: &mut BTreeMap<String, usize>) -> String {
    let base: String = heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect();
    let n = seen.entry(base.clone()).or_insert(0);
    let slug = if *n == 0 {
        base.clone()
    } else {
        format!("{base}-{n}")
    };
    *n += 1;
    slug
}

/// The anchors of a document's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new_ext(text, Options::all()) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some(h) = heading.take() {
                    out.insert(slug(&h, &mut seen));
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut problems = Vec::new();
    for path in documents() {
        let text = read(&path);
        let dir = path.parent().unwrap().to_path_buf();
        for (event, range) in Parser::new_ext(&text, Options::all()).into_offset_iter() {
            let dest = match &event {
                Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                    dest_url.to_string()
                }
                _ => continue,
            };
            if dest.contains("://") || dest.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match dest.split_once('#') {
                Some((f, a)) => (f.to_owned(), Some(a.to_owned())),
                None => (dest.clone(), None),
            };
            let target = if file.is_empty() {
                path.clone()
            } else {
                dir.join(&file)
            };
            let at = format!("{}:{}", relative(&path), line_of(&text, range.start));
            if !target.exists() {
                problems.push(format!("{at}: {dest}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&target)).contains(&anchor)
            {
                problems.push(format!(
                    "{at}: {dest}: {} has no heading with that anchor",
                    relative(&target)
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_pictures_are_what_draw_py_draws() {
    let out = Command::new("python3")
        .arg(root().join("docs/images/draw.py"))
        .arg("--check")
        .output()
        .expect("python3 runs docs/images/draw.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The texts of a picture's `<text class="CLASS">` elements.
fn texts(svg: &str, class: &str) -> Vec<String> {
    let open = format!("<text class=\"{class}\"");
    svg.match_indices(&open)
        .filter_map(|(i, _)| {
            let rest = &svg[i..];
            let start = rest.find('>')? + 1;
            let end = rest.find("</text>")?;
            Some(
                rest[start..end]
                    .replace("&amp;", "&")
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&#x27;", "'")
                    .replace("&quot;", "\""),
            )
        })
        .collect()
}

fn picture(name: &str) -> String {
    read(&root().join("docs/images").join(name))
}

#[test]
fn the_phases_picture_has_every_phase_and_no_other() {
    let schema = openmed_op::api::openapi_schema();
    let phases: BTreeSet<String> = schema
        .pointer("/properties/status/properties/phase/enum")
        .and_then(|v| v.as_array())
        .expect("status.phase is an enum")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let drawn: BTreeSet<String> = texts(&picture("phases.svg"), "phase").into_iter().collect();
    assert_eq!(drawn, phases, "phases.svg's boxes against status.phase");
}

/// Every string literal of the sources, for the names a picture uses.
fn source_literals() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&read(&path));
            }
        }
    }
    let mut out = String::new();
    walk(&root().join("src"), &mut out);
    out
}

#[test]
fn every_event_reason_a_picture_names_is_one_the_operator_writes() {
    let sources = source_literals();
    let mut problems = Vec::new();
    for name in [
        "overview.svg",
        "phases.svg",
        "canary.svg",
        "soak.svg",
        "fleet.svg",
    ] {
        for text in texts(&picture(name), "reason") {
            for reason in text.split(" \u{b7} ") {
                // `Soaked=True` names the condition and its status.
                let reason = reason.split('=').next().unwrap_or_default();
                if !sources.contains(&format!("\"{reason}\"")) {
                    problems.push(format!("{name}: {reason:?} is no reason in src/"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_canary_picture_steps_as_the_canary_example_does() {
    let example: serde_yaml::Value =
        serde_yaml::from_str(&read(&root().join("examples/canary/openmedmodel.yaml"))).unwrap();
    let steps = example["spec"]["canary"]["steps"].as_sequence().unwrap();
    let drawn = texts(&picture("canary.svg"), "small");
    for step in steps {
        let weight = step["weight"]
            .as_u64()
            .expect("the example's steps are weights");
        let pause = step["pause"].as_str().unwrap();
        let label = format!("{weight} % for {pause}");
        assert!(drawn.contains(&label), "canary.svg has no step {label:?}");
        let share = format!("canary v2 \u{b7} {weight} %");
        assert!(drawn.contains(&share), "canary.svg has no bar {share:?}");
    }
    let failure_limit = example["spec"]["canary"]["analysis"]["failureLimit"]
        .as_u64()
        .unwrap();
    assert!(
        drawn
            .iter()
            .any(|t| t.starts_with(&format!("aborted: {failure_limit} failed"))),
        "canary.svg's abort says the example's failureLimit ({failure_limit})"
    );
}

#[test]
fn the_fleet_picture_has_the_fleet_examples_waves_in_order() {
    let fleet: serde_yaml::Value =
        serde_yaml::from_str(&read(&root().join("examples/fleet/openmed-fleet.yaml"))).unwrap();
    let waves: Vec<String> = fleet["waves"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    let drawn = texts(&picture("fleet.svg"), "phase");
    assert_eq!(drawn, waves, "fleet.svg's waves against examples/fleet");
}

#[test]
fn every_picture_is_shown_by_a_document() {
    let all: String = documents().iter().map(|p| read(p)).collect();
    for entry in std::fs::read_dir(root().join("docs/images"))
        .unwrap()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".svg") {
            assert!(
                all.contains(&format!("images/{name})")),
                "docs/images/{name} is shown by no document"
            );
        }
    }
}

#[test]
fn the_headings_of_a_document_are_one_title_then_sections() {
    // A document has one `#` title, first; a README of a test tool too.
    let mut problems = Vec::new();
    for path in documents() {
        let text = read(&path);
        let mut titles = 0;
        let mut first = None;
        for event in Parser::new_ext(&text, Options::all()) {
            if let Event::Start(Tag::Heading { level, .. }) = event {
                first.get_or_insert(level);
                if level == HeadingLevel::H1 {
                    titles += 1;
                }
            }
        }
        if titles != 1 || first != Some(HeadingLevel::H1) {
            problems.push(format!(
                "{}: {titles} top-level titles, the first heading {first:?}",
                relative(&path)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The values of `pub const NAME: &str = "Value";` inside the `pub mod
/// reason` of a source file.
fn reasons_in(file: &str) -> Vec<String> {
    let text = read(&root().join(file));
    let start = text.find("pub mod reason {").expect("a reason module");
    let end = start + text[start..].find("\n}").expect("its end");
    text[start..end]
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let value = l.strip_prefix("pub const ")?.split_once("= \"")?.1;
            Some(value.trim_end_matches("\";").to_owned())
        })
        .collect()
}

/// Reasons that report progress or success, not a problem to look into.
const NOT_A_PROBLEM: [&str; 32] = [
    "RolloutStarted",
    "RolloutSucceeded",
    "RollbackStarted",
    "RollbackSucceeded",
    "DriftCorrected",
    "TargetReleased",
    "RollingOut",
    "RollingBack",
    "RolledBack",
    "ManualRollback",
    "RolloutComplete",
    "RollbackComplete",
    "RollbackInProgress",
    "AsExpected",
    "Soaking",
    "Soaked",
    "NotServedYet",
    "CanaryStarted",
    "CanaryWarming",
    "CanaryProgressing",
    "CanaryScaling",
    "CanaryWeightChanged",
    "CanaryPaused",
    "CanaryPromotedByHand",
    "CanaryPromoting",
    "CanaryPromoted",
    "CanaryDrained",
    "DeletionWaiting",
    "ErrorResolved",
    "QualityGatePassed",
    "SoakAbortIgnored",
    "AutoscalerActive",
];

#[test]
fn troubleshooting_has_a_row_for_every_reason_that_reports_a_problem() {
    let operations = read(&root().join("docs/operations.md"));
    let start = operations
        .find("## Troubleshooting")
        .expect("docs/operations.md has a Troubleshooting section");
    let section = &operations[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut missing = Vec::new();
    for file in ["src/rollout/decision.rs", "src/rollout/autoscaling.rs"] {
        for reason in reasons_in(file) {
            if NOT_A_PROBLEM.contains(&reason.as_str()) {
                continue;
            }
            if !section.contains(&format!("\n| `{reason}`")) {
                missing.push(reason);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/operations.md's Troubleshooting has no row for {missing:?} (or list them in NOT_A_PROBLEM)"
    );
}
