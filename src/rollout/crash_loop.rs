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

use super::pods::{ContainerView, PodView};

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
                ..ContainerView::default()
            }],
            created: Some(0),
            ..PodView::default()
        }
    }

    const TRACEBACK: &str = "INFO loading OpenMed/missing\n\
        Traceback (most recent call last):\n  File \"x.py\", line 1\n\
        huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder\n\
        ERROR:    Application startup failed. Exiting.\n";

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
            "pod new-a keeps crashing: container svc restarted 2 times, exit code 3: \
             huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder \
             (ERROR:    Application startup failed. Exiting.)"
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
            "pod new-b: exit code 3: huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an \
             appropriate cached snapshot folder (ERROR:    Application startup failed. Exiting.)"
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

    #[test]
    fn the_gist_is_the_error_line_and_the_last_line_bounded() {
        assert_eq!(gist(""), "");
        assert_eq!(gist("one\ntwo\n"), "two");
        assert_eq!(gist("ValueError: bad\n"), "ValueError: bad");
        let long = "x".repeat(1000);
        assert_eq!(gist(&long).chars().count(), QUOTE_CHARS + 1);
    }
}
