//! Pods of the template being rolled out that keep crashing, and what they
//! said as they went.
//!
//! A model that cannot load ends the OpenMed service before it listens;
//! the kubelet restarts it with a growing back-off, and the Deployment
//! controller calls the rollout failed only when `progressDeadlineSeconds`
//! runs out (ten minutes by default). A pod of the new template that has
//! already restarted `restarts` times will not warm on the next try either,
//! so the rollout fails at once (fail-fast), through the same rollback
//! rules. Either way the failure quotes the container's own last words:
//! its termination message, which with `terminationMessagePolicy:
//! FallbackToLogsOnError` is the tail of its log.
//!
//! Pure: the shell passes the pods it watches (those with the snapshot
//! label) reduced to [`PodView`]s.

use super::pods::{ContainerView, PodView, of_template};

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

/// The first pod (by name) of template `snapshot` in `namespace` whose
/// `container` has restarted at least `restarts` times.
pub fn crash_loop(
    pods: &[PodView],
    namespace: &str,
    snapshot: &str,
    container: &str,
    restarts: i32,
) -> Option<Crash> {
    let mut crashing: Vec<(&PodView, &ContainerView)> = of_template(pods, namespace, snapshot)
        .filter_map(|p| {
            let c = p.containers.iter().find(|c| c.name == container)?;
            (c.restarts >= restarts).then_some((p, c))
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

/// What a failing pod of template `snapshot` said last (the first by
/// name that exited with an error), for a failure the Deployment
/// controller reported: "pod P: exit code 3: <its words>".
pub fn last_words(
    pods: &[PodView],
    namespace: &str,
    snapshot: &str,
    container: &str,
) -> Option<String> {
    let mut failing: Vec<(&PodView, String)> = of_template(pods, namespace, snapshot)
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

/// "exit code 3: <words>", from the container's last exit.
fn said(c: &ContainerView) -> Option<String> {
    let (code, reason, message) = c.last_exit.as_ref()?;
    let words = gist(message);
    Some(match (words.is_empty(), reason.is_empty()) {
        (false, _) => format!("exit code {code}: {words}"),
        (true, false) => format!("exit code {code} ({reason})"),
        (true, true) => format!("exit code {code}"),
    })
}

/// The gist of a termination message (often a log's tail): the last line
/// that names an error (a Python exception's `module.SomeError: ...`, or
/// any line with `Error`/`error:`/`Exception`), then the last line if it
/// is another; bounded.
pub fn gist(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let Some(last) = lines.last() else {
        return String::new();
    };
    let names_error = |l: &&&str| {
        l.contains("Error")
            || l.contains("error:")
            || l.contains("Exception")
            || l.contains("FATAL")
    };
    let text = match lines.iter().rev().find(names_error) {
        Some(error) if error != last => format!("{error} ({last})"),
        Some(error) => (*error).to_owned(),
        None => (*last).to_owned(),
    };
    bound(&text)
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
            }],
            ..PodView::default()
        }
    }

    const TRACEBACK: &str = "INFO loading OpenMed/missing\n\
        Traceback (most recent call last):\n  File \"x.py\", line 1\n\
        huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder\n\
        ERROR:    Application startup failed. Exiting.\n";

    #[test]
    fn a_pod_of_the_new_template_past_the_threshold_is_a_crash_loop() {
        let pods = vec![
            pod("old-a", "old", 9, Some((1, "old trouble"))),
            pod("new-b", "new", 1, Some((3, TRACEBACK))),
            pod("new-a", "new", 2, Some((3, TRACEBACK))),
        ];
        let crash = crash_loop(&pods, "ns", "new", "svc", 2).expect("new-a crash-loops");
        assert_eq!(crash.pod, "new-a");
        assert_eq!(
            crash.message("svc"),
            "pod new-a keeps crashing: container svc restarted 2 times, exit code 3: \
             huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder \
             (ERROR:    Application startup failed. Exiting.)"
        );
        assert_eq!(
            crash_loop(&pods, "ns", "new", "svc", 3),
            None,
            "below the threshold"
        );
        assert_eq!(
            crash_loop(&pods, "other", "new", "svc", 1),
            None,
            "another namespace"
        );
        assert_eq!(
            crash_loop(&pods, "ns", "new", "sidecar", 1),
            None,
            "another container"
        );
        let mut leaving = pods.clone();
        leaving[2].terminating = true;
        assert_eq!(
            crash_loop(&leaving, "ns", "new", "svc", 2),
            None,
            "a pod being deleted"
        );
    }

    #[test]
    fn last_words_come_from_a_pod_that_exited_with_an_error() {
        let pods = vec![
            pod("new-a", "new", 0, Some((0, "done"))),
            pod("new-b", "new", 1, Some((3, TRACEBACK))),
        ];
        assert_eq!(
            last_words(&pods, "ns", "new", "svc").unwrap(),
            "pod new-b: exit code 3: huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an \
             appropriate cached snapshot folder (ERROR:    Application startup failed. Exiting.)"
        );
        assert_eq!(
            last_words(&pods[..1], "ns", "new", "svc"),
            None,
            "exit 0 says nothing"
        );
        let silent = vec![pod("new-c", "new", 1, Some((137, "")))];
        assert_eq!(
            last_words(&silent, "ns", "new", "svc").unwrap(),
            "pod new-c: exit code 137 (Error)"
        );
    }

    #[test]
    fn a_pod_has_crashed_once_a_container_restarted_or_exited() {
        assert!(!pod("a", "new", 0, None).crashed());
        assert!(pod("a", "new", 1, None).crashed());
        assert!(pod("a", "new", 0, Some((0, "done"))).crashed());
    }

    #[test]
    fn the_gist_is_the_error_line_and_the_last_line_bounded() {
        assert_eq!(gist(""), "");
        assert_eq!(gist("one\ntwo\n"), "two");
        assert_eq!(gist("ValueError: bad\n"), "ValueError: bad");
        let long = "x".repeat(1000);
        assert_eq!(gist(&long).chars().count(), QUOTE_CHARS + 1);
    }
}
