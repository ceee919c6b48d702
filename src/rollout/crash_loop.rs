//! Pods of the template being rolled out that keep crashing, and what they
//! said as they went.
//!
//! A model that cannot load ends the OpenMed service before it listens;
//! the kubelet restarts it with a growing back-off, and the Deployment
//! controller calls the rollout failed only when `progressDeadlineSeconds`
//! runs out (ten minutes by default). A pod of the new template that has
//! already restarted `restarts` times will not warm on the next try either,
//! so the rollout fails at once (fail-fast), through the same rollback
//! rules. Either way the failure says how the container last ended: its
//! exit code, and one line of its termination message (with
//! `terminationMessagePolicy: FallbackToLogsOnError`, its log's tail) only
//! when that line is one of the service's own start-up failures, in that
//! failure's fixed words ([`gist`]). Nothing else of the message is ever
//! repeated: status and Events are read by everyone who reads the
//! namespace, and a model that failed on a request may have printed the
//! request.
//!
//! Pure: the shell passes the pods it watches (those with the snapshot
//! label) reduced to [`PodView`]s.

use super::pods::{ContainerView, PodView};
use crate::api::rules::is_service_model_id;

/// The longest quote of a container's words in a condition or an Event.
const QUOTE_CHARS: usize = 400;

/// A container of the rolled-out template that keeps crashing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    /// The pod.
    pub pod: String,
    /// Its restarts so far.
    pub restarts: i32,
    /// Its last exit: code and the container's words.
    pub said: String,
}

impl Crash {
    /// The failure, in the words a condition and an Event carry.
    pub fn message(&self, container: &str) -> String {
        format!(
            "pod {} keeps crashing: container {container} restarted {} times, {}",
            self.pod, self.restarts, self.said
        )
    }
}

/// The first pod (by name) among `pods`, the rollout's own
/// ([`super::pods::of_rollout`]), whose `container` crashed `restarts`
/// times during the rollout that began at `since` (seconds, the API
/// server's clock; see [`ContainerView::crashed_since`]).
pub fn crash_loop<'a>(
    pods: impl IntoIterator<Item = &'a PodView>,
    container: &str,
    restarts: i32,
    since: Option<i64>,
) -> Option<Crash> {
    let mut crashing: Vec<(&PodView, &ContainerView)> = pods
        .into_iter()
        .filter_map(|p| {
            let c = p.containers.iter().find(|c| c.name == container)?;
            c.crashed_since(p.created, since, restarts)
                .then_some((p, c))
        })
        .collect();
    crashing.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let (pod, c) = crashing.first()?;
    Some(Crash {
        pod: pod.name.clone(),
        restarts: c.restarts,
        said: said(c).unwrap_or_else(|| "with no exit recorded".into()),
    })
}

/// What a failing pod among `pods` (the rollout's own) said last (the
/// first by name that exited with an error), for a failure the Deployment
/// controller reported: "pod P: exit code 3: <its words>".
pub fn last_words<'a>(
    pods: impl IntoIterator<Item = &'a PodView>,
    container: &str,
) -> Option<String> {
    let mut failing: Vec<(&PodView, String)> = pods
        .into_iter()
        .filter_map(|p| {
            let c = p.containers.iter().find(|c| c.name == container)?;
            let (code, _, _) = c.last_exit.as_ref()?;
            (*code != 0).then(|| (p, said(c).unwrap_or_default()))
        })
        .collect();
    failing.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    failing
        .first()
        .map(|(p, said)| format!("pod {}: {said}", p.name))
}

/// "exit code 3: <words>", from the container's last exit: its code, and
/// either the one line of its termination message that may be quoted
/// ([`gist`]) or the kubelet's reason, when that is one word.
pub(super) fn said(c: &ContainerView) -> Option<String> {
    let (code, reason, message) = c.last_exit.as_ref()?;
    Some(match gist(message) {
        Some(words) => format!("exit code {code}: {words}"),
        None if is_reason(reason) => format!("exit code {code} ({reason})"),
        None => format!("exit code {code}"),
    })
}

/// The kubelet's reasons are single CamelCase words (`Error`, `OOMKilled`,
/// `ContainerCannotRun`); anything else is not quoted.
fn is_reason(reason: &str) -> bool {
    (1..=63).contains(&reason.len())
        && reason
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic())
        && reason.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// What the OpenMed service (3.1, with its ONNX backend and launcher)
/// prints when the model it is to preload cannot be found or loaded, and
/// the process ends with status 3 before it listens. These are the only
/// lines of a termination message ever quoted, and only in these words: a
/// termination message is a log's tail, and a model that failed on a
/// request may have printed the request. `{model}` stands for a model id,
/// kept only when it is one the service reads as such
/// ([`is_service_model_id`]); `{…}` for words never quoted. A line is
/// read by the first template it matches whole.
const STARTUP_FAILURES: &[&str] = &[
    // Not in the model cache, offline (huggingface_hub's snapshot_download).
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot \
     folder for the specified revision on the local disk and outgoing traffic has been \
     disabled. To enable repo look-ups and downloads online, set 'HF_HUB_OFFLINE=0' as \
     environment variable.",
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot \
     folder for the specified revision on the local disk and outgoing traffic has been \
     disabled. To enable repo look-ups and downloads online, pass 'local_files_only=False' as \
     input.",
    "huggingface_hub.errors.LocalEntryNotFoundError: {…}",
    // Online: no such repository or revision, or no access to it.
    "huggingface_hub.errors.RepositoryNotFoundError: {…}",
    "huggingface_hub.errors.RevisionNotFoundError: {…}",
    "huggingface_hub.errors.GatedRepoError: {…}",
    // A pointer its `validate_model_name` refuses.
    "openmed.core.errors.InputError: Model name must be a string. Pass a registry key, model ID, \
     or local model path.",
    "openmed.core.errors.InputError: Model name cannot be empty. Pass a registry key, model ID, \
     or local model path.",
    "openmed.core.errors.InputError: Invalid model name format. Use 'org/model', 'model', or an \
     existing local path.",
    "openmed.core.errors.InputError: Organization and model name cannot be empty. Use \
     'org/model' with both components populated.",
    "openmed.core.errors.InputError: Invalid characters in organization name. Use letters, \
     numbers, hyphens, underscores, or periods.",
    "openmed.core.errors.InputError: Invalid characters in model name. Use letters, numbers, \
     hyphens, underscores, or periods.",
    // Its model loader and its ONNX backend.
    "openmed.core.errors.ModelLoadError: Could not load model {model}. Verify the model ID or \
     local path, ensure required files are available, and retry.",
    "openmed.core.errors.ModelLoadError: {…}",
    "FileNotFoundError: No ONNX graph for variant {…} in {model}; expected {…}",
    "RuntimeError: Low-resource profile requires model_int8.onnx; got {…}",
    // Its launcher's (uvicorn's) last line, whatever failed at start.
    "Application startup failed. Exiting.",
];

/// The one line of a termination message that may be quoted: the first
/// that is one of the service's own start-up failures
/// ([`STARTUP_FAILURES`]), in that failure's words; bounded. Nothing else
/// of the message, ever.
pub fn gist(message: &str) -> Option<String> {
    message
        .lines()
        .find_map(startup_failure)
        .map(|words| bound(&words))
}

/// `line` in the words of the first start-up failure it is.
fn startup_failure(line: &str) -> Option<String> {
    let line = line.trim();
    // The launcher's own level prefix, when it logs with one.
    let line = line.strip_prefix("ERROR:").map_or(line, str::trim_start);
    STARTUP_FAILURES
        .iter()
        .find_map(|template| in_words_of(template, line))
}

/// A piece of a [`STARTUP_FAILURES`] template.
enum Piece<'a> {
    Words(&'a str),
    ModelId,
    Hidden,
}

fn pieces(template: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Words(&rest[..open]));
        }
        let close = open + rest[open..].find('}').expect("every slot is closed");
        pieces.push(match &rest[open + 1..close] {
            "model" => Piece::ModelId,
            _ => Piece::Hidden,
        });
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Words(rest));
    }
    pieces
}

/// `line` quoted in `template`'s words, if it matches the template whole:
/// its fixed words as they are, a slot's text as `…` (or the model id it
/// holds).
fn in_words_of(template: &str, line: &str) -> Option<String> {
    let pieces = pieces(template);
    let mut quoted = String::new();
    let mut rest = line;
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Words(words) => {
                rest = rest.strip_prefix(words)?;
                quoted.push_str(words);
            }
            slot => {
                // A slot runs to the template's next words, or to the end.
                let end = match pieces.get(i + 1) {
                    Some(Piece::Words(next)) => rest.find(next)?,
                    _ => rest.len(),
                };
                let (filled, after) = rest.split_at(end);
                if filled.is_empty() {
                    return None;
                }
                quoted.push_str(match slot {
                    Piece::ModelId if is_service_model_id(filled) => filled,
                    _ => "…",
                });
                rest = after;
            }
        }
    }
    rest.is_empty().then_some(quoted)
}

fn bound(text: &str) -> String {
    if text.chars().count() <= QUOTE_CHARS {
        return text.to_owned();
    }
    let start: String = text.chars().take(QUOTE_CHARS).collect();
    format!("{start}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, snapshot: &str, restarts: i32, exit: Option<(i32, &str)>) -> PodView {
        PodView {
            namespace: "ns".into(),
            name: name.into(),
            snapshot: Some(snapshot.into()),
            containers: vec![ContainerView {
                name: "svc".into(),
                restarts,
                last_exit: exit.map(|(c, m)| (c, "Error".into(), m.into())),
                ..ContainerView::default()
            }],
            created: Some(0),
            ..PodView::default()
        }
    }

    /// The service's own line for a model not in its cache, offline.
    const NOT_CACHED: &str = "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an \
        appropriate cached snapshot folder for the specified revision on the local disk and \
        outgoing traffic has been disabled. To enable repo look-ups and downloads online, set \
        'HF_HUB_OFFLINE=0' as environment variable.";

    /// The tail of the service's log when its preload finds no model: the
    /// cause (whose message holds a URL), then the failure and the
    /// launcher's last line.
    const TRACEBACK: &str = "Traceback (most recent call last):\n  File \"x.py\", line 1\n\
        huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach \
        https://huggingface.co/api/models/OpenMed/missing/revision/main: offline mode is enabled.\n\
        \n\
        The above exception was the direct cause of the following exception:\n\
        \n\
        Traceback (most recent call last):\n  File \"x.py\", line 2\n\
        huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached \
        snapshot folder for the specified revision on the local disk and outgoing traffic has \
        been disabled. To enable repo look-ups and downloads online, set 'HF_HUB_OFFLINE=0' as \
        environment variable.\n\
        Application startup failed. Exiting.\n";

    #[test]
    fn a_pod_of_the_rollout_past_the_threshold_is_a_crash_loop() {
        let pods = vec![
            pod("new-b", "new", 1, Some((3, TRACEBACK))),
            pod("new-a", "new", 2, Some((3, TRACEBACK))),
        ];
        let crash = crash_loop(&pods, "svc", 2, Some(0)).expect("new-a crash-loops");
        assert_eq!(crash.pod, "new-a");
        assert_eq!(
            crash.message("svc"),
            format!(
                "pod new-a keeps crashing: container svc restarted 2 times, exit code 3: {NOT_CACHED}"
            )
        );
        assert_eq!(
            crash_loop(&pods, "svc", 3, Some(0)),
            None,
            "below the threshold"
        );
        assert_eq!(
            crash_loop(&pods, "sidecar", 1, Some(0)),
            None,
            "another container"
        );
    }

    #[test]
    fn restarts_from_before_the_rollout_are_no_crash_loop() {
        // A pod from before the rollout (same template: an edit of
        // replicas) that restarted twice last week, an OOM kill.
        let mut old = pod("old-a", "same", 2, Some((137, "OOMKilled")));
        old.created = Some(-7 * 86_400);
        old.containers[0].last_exit_at = Some(-6 * 86_400);
        assert_eq!(crash_loop([&old], "svc", 2, Some(100)), None);
        // Held back after a failed exit during this rollout, it is one.
        old.containers[0].last_exit_at = Some(150);
        old.containers[0].waiting = Some(crate::rollout::pods::CRASH_LOOP_BACK_OFF.into());
        assert_eq!(
            crash_loop([&old], "svc", 2, Some(100)).unwrap().pod,
            "old-a"
        );
        // Held back after an exit from before the rollout, it is not.
        old.containers[0].last_exit_at = Some(50);
        assert_eq!(crash_loop([&old], "svc", 2, Some(100)), None);
        // A pod the rollout made counts every restart.
        let mut new = pod("new-a", "same", 2, Some((3, TRACEBACK)));
        new.created = Some(120);
        assert_eq!(
            crash_loop([&new], "svc", 2, Some(100)).unwrap().pod,
            "new-a"
        );
    }

    #[test]
    fn last_words_come_from_a_pod_that_exited_with_an_error() {
        let pods = vec![
            pod("new-a", "new", 0, Some((0, "done"))),
            pod("new-b", "new", 1, Some((3, TRACEBACK))),
        ];
        assert_eq!(
            last_words(&pods, "svc").unwrap(),
            format!("pod new-b: exit code 3: {NOT_CACHED}")
        );
        assert_eq!(last_words(&pods[..1], "svc"), None, "exit 0 says nothing");
        let silent = vec![pod("new-c", "new", 1, Some((137, "")))];
        assert_eq!(
            last_words(&silent, "svc").unwrap(),
            "pod new-c: exit code 137 (Error)"
        );
    }

    #[test]
    fn a_pod_has_crashed_once_a_container_restarted_or_exited() {
        assert!(!pod("a", "new", 0, None).crashed());
        assert!(pod("a", "new", 1, None).crashed());
        assert!(pod("a", "new", 0, Some((0, "done"))).crashed());
    }

    /// A model that failed on a request and printed it, then a traceback
    /// whose exception quotes it again.
    const PATIENT_NOTE: &str = "Processing note: Patient John Smith, DOB 1961-03-14, MRN 448812\n\
        Traceback (most recent call last):\n  File \"/app/serve.py\", line 88, in extract\n\
        \x20   raise ValueError(f\"cannot parse {note}\")\n\
        ValueError: cannot parse Patient John Smith, DOB 1961-03-14\n\
        ERROR:    Exception in ASGI application: John Smith\n";

    fn exit(code: i32, reason: &str, message: &str) -> ContainerView {
        ContainerView {
            name: "svc".into(),
            restarts: 3,
            last_exit: Some((code, reason.into(), message.into())),
            ..ContainerView::default()
        }
    }

    #[test]
    fn a_termination_message_with_request_text_is_never_quoted() {
        let pods = vec![pod("new-a", "new", 3, Some((1, PATIENT_NOTE)))];
        let crash = crash_loop(&pods, "svc", 2, Some(0)).expect("a crash loop");
        let words = last_words(&pods, "svc").expect("an error exit");
        assert_eq!(
            crash.message("svc"),
            "pod new-a keeps crashing: container svc restarted 3 times, exit code 1 (Error)"
        );
        assert_eq!(words, "pod new-a: exit code 1 (Error)");
        // Request text before the service's own failure: only the failure.
        let mixed = format!("{PATIENT_NOTE}{TRACEBACK}");
        let pods = vec![pod("new-a", "new", 3, Some((3, &mixed)))];
        let crash = crash_loop(&pods, "svc", 2, Some(0)).expect("a crash loop");
        let words = last_words(&pods, "svc").expect("an error exit");
        for quoted in [crash.message("svc"), words, crash.said] {
            for private in [
                "John", "Smith", "1961", "03-14", "Patient", "448812", "note",
            ] {
                assert!(!quoted.contains(private), "{private} in {quoted:?}");
            }
            assert!(quoted.contains("LocalEntryNotFoundError"), "{quoted}");
        }
    }

    #[test]
    fn only_the_services_own_startup_failures_are_quoted_and_only_their_fixed_words() {
        const OFFLINE: &str = "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an \
            appropriate cached snapshot folder for the specified revision on the local disk and \
            outgoing traffic has been disabled. To enable repo look-ups and downloads online, set \
            'HF_HUB_OFFLINE=0' as environment variable.";
        const NOT_SERVED: &str = "openmed.core.errors.ModelLoadError: Could not load model \
            OpenMed/synthetic-pii-v2. Verify the model ID or local path, ensure required files \
            are available, and retry.";
        const REFUSED: &str = "openmed.core.errors.InputError: Invalid characters in model name. \
            Use letters, numbers, hyphens, underscores, or periods.";
        let cases: &[(&str, &str)] = &[
            (OFFLINE, OFFLINE),
            (NOT_SERVED, NOT_SERVED),
            (REFUSED, REFUSED),
            (
                "huggingface_hub.errors.LocalEntryNotFoundError: Got: HTTPError: 500 for \
                 https://hub.example/api?q=John+Smith",
                "huggingface_hub.errors.LocalEntryNotFoundError: …",
            ),
            (
                "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: \
                 Root=1-abc)",
                "huggingface_hub.errors.RepositoryNotFoundError: …",
            ),
            (
                "openmed.core.errors.ModelLoadError: Could not load model /notes/John Smith \
                 1961-03-14. Verify the model ID or local path, ensure required files are \
                 available, and retry.",
                "openmed.core.errors.ModelLoadError: Could not load model …. Verify the model \
                 ID or local path, ensure required files are available, and retry.",
            ),
            (
                "openmed.core.errors.ModelLoadError: Could not load model OpenMed/x. Verify \
                 the model ID or local path, ensure required files are available, and retry. \
                 Patient John Smith",
                "openmed.core.errors.ModelLoadError: …",
            ),
            (
                "FileNotFoundError: No ONNX graph for variant 'auto' in OpenMed/x; expected \
                 model_int8.onnx, model.onnx",
                "FileNotFoundError: No ONNX graph for variant … in OpenMed/x; expected …",
            ),
            (
                "ERROR:    Application startup failed. Exiting.",
                "Application startup failed. Exiting.",
            ),
            ("Application startup failed. Exiting. John Smith", ""),
            ("openmed.core.errors.InputError: John Smith, 1961-03-14", ""),
            ("ValueError: Could not load model John Smith", ""),
            (
                "Note: huggingface_hub.errors.LocalEntryNotFoundError: John",
                "",
            ),
        ];
        for (line, quoted) in cases {
            let said = said(&exit(3, "Error", line)).unwrap();
            let expected = if quoted.is_empty() {
                "exit code 3 (Error)".to_owned()
            } else {
                format!("exit code 3: {quoted}")
            };
            assert_eq!(said, expected, "{line}");
        }
        // The first of the service's lines, whatever follows.
        let two = format!("{REFUSED}\nApplication startup failed. Exiting.\n");
        assert_eq!(
            said(&exit(3, "Error", &two)).unwrap(),
            format!("exit code 3: {REFUSED}")
        );
        let long = format!(
            "openmed.core.errors.ModelLoadError: Could not load model {}. \
            Verify the model ID or local path, ensure required files are available, and retry.",
            "m".repeat(1000)
        );
        let said = said(&exit(3, "Error", &long)).unwrap();
        assert!(
            said.chars().count() <= "exit code 3: ".len() + QUOTE_CHARS + 1,
            "{said}"
        );
    }

    #[test]
    fn every_startup_failure_is_quoted_by_its_own_template() {
        // No template is hidden behind an earlier, looser one.
        for template in STARTUP_FAILURES {
            let line = template.replace("{model}", "OpenMed/x").replace("{…}", "x");
            let quoted = template.replace("{model}", "OpenMed/x").replace("{…}", "…");
            assert_eq!(gist(&line).as_deref(), Some(quoted.as_str()), "{template}");
        }
    }

    #[test]
    fn a_reason_is_quoted_only_as_the_kubelets_one_word() {
        assert_eq!(
            said(&exit(137, "OOMKilled", "")).unwrap(),
            "exit code 137 (OOMKilled)"
        );
        assert_eq!(
            said(&exit(1, "Error: Patient John Smith", "")).unwrap(),
            "exit code 1"
        );
    }

    #[test]
    fn the_gist_is_nothing_but_a_startup_failure() {
        assert_eq!(gist(""), None);
        assert_eq!(gist("one\ntwo\n"), None);
        assert_eq!(gist("ValueError: bad\n"), None);
        assert_eq!(gist(TRACEBACK).as_deref(), Some(NOT_CACHED));
        assert_eq!(
            gist("Application startup failed. Exiting.").as_deref(),
            Some("Application startup failed. Exiting.")
        );
    }
}
