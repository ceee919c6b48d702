//! The quality gate, the pure part: which pods to probe, what their
//! answers score, and what the score means for the pod and the rollout.
//!
//! A pod whose template carries the readiness gate `openmed.ai/model-quality`
//! is never Ready, so never in a Service's endpoints, until the operator
//! sets that condition. Once its containers are ready (the model is warm)
//! the shell sends each text of the probe set once to the pod's own
//! `POST /pii/extract` ([`probes_due`]), hands the answers to [`score`],
//! and writes the condition [`mark`] gives: True when every label's recall
//! reaches its bound, False naming the label that missed. A False mark on
//! a pod of the template being rolled out fails the rollout
//! ([`failure`]), through the same rollback rules as any failure.
//!
//! No answer is never a pass: an error or an unreachable pod leaves the
//! pod unjudged (and not Ready), to be probed again next round.
//!
//! Matching, chosen for PHI: an expected entity is found when the model's
//! entities of the same label cover every one of its non-space characters
//! (a name tagged as two words counts; half a date does not). A tagged
//! entity is correct when it overlaps an expected one of its label.

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::{Value, json};

use super::pods::PodView;
use super::resource::ResourceView;
use crate::api::quality::{ProbeSet, QualityGate, Span};
use crate::api::{OpenMedModelSpec, validate_spec};
use crate::plan::{self, TargetOptions};

/// How long an unjudged pod waits before it is probed again after an
/// inconclusive round.
pub const RETRY_SECONDS: u64 = 5;

/// What one probe got back from a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The entities of a 200 answer.
    Found(Vec<Span>),
    /// No usable answer: an HTTP error, a timeout, a refused connection,
    /// an answer that is not the service's.
    Failed(String),
}

/// One label's figures over a probe set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelScore {
    /// The label.
    pub label: String,
    /// Entities of this label the probe set expects.
    pub expected: usize,
    /// Of those, how many the model found.
    pub found: usize,
    /// Entities the model tagged with this label.
    pub tagged: usize,
    /// Of those, how many overlap an expected entity of this label.
    pub correct: usize,
}

impl LabelScore {
    /// Found over expected; 1 when nothing was expected.
    pub fn recall(&self) -> f64 {
        if self.expected == 0 {
            1.0
        } else {
            self.found as f64 / self.expected as f64
        }
    }

    /// Correct over tagged; `None` when nothing was tagged.
    pub fn precision(&self) -> Option<f64> {
        (self.tagged > 0).then(|| self.correct as f64 / self.tagged as f64)
    }
}

/// The figures of every label, sorted by label.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scores(pub Vec<LabelScore>);

impl Scores {
    /// The figures of `label`.
    pub fn get(&self, label: &str) -> Option<&LabelScore> {
        self.0.iter().find(|s| s.label == label)
    }

    /// `DATE recall 0.00 (0/3), NAME recall 1.00 (4/4) precision 1.00`:
    /// numbers only, never a text or an entity.
    pub fn summary(&self) -> String {
        self.0
            .iter()
            .map(|s| {
                let mut line = s.label.clone();
                if s.expected > 0 {
                    line.push_str(&format!(
                        " recall {:.2} ({}/{})",
                        s.recall(),
                        s.found,
                        s.expected
                    ));
                }
                if let Some(p) = s.precision() {
                    line.push_str(&format!(" precision {p:.2}"));
                }
                line
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Scores a probe set's answers, one per probe in order. Any failed
/// answer makes the round inconclusive: its reason is returned.
pub fn score(set: &ProbeSet, answers: &[Answer]) -> Result<Scores, String> {
    if let Some(why) = answers.iter().find_map(|a| match a {
        Answer::Failed(why) => Some(why),
        Answer::Found(_) => None,
    }) {
        return Err(why.clone());
    }
    if answers.len() != set.probes.len() {
        return Err(format!(
            "{} answers to {} probes",
            answers.len(),
            set.probes.len()
        ));
    }
    // label -> [expected, found, tagged, correct]
    let mut counts: std::collections::BTreeMap<String, [usize; 4]> = Default::default();
    let mut add = |label: &str, n: [usize; 4]| {
        let c = counts.entry(label.to_owned()).or_default();
        for (total, more) in c.iter_mut().zip(n) {
            *total += more;
        }
    };
    for (probe, answer) in set.probes.iter().zip(answers) {
        let Answer::Found(found) = answer else {
            unreachable!("failed answers returned above")
        };
        let chars: Vec<char> = probe.text.chars().collect();
        for expected in &probe.entities {
            let covered = (expected.start..expected.end)
                .filter(|&i| !chars.get(i).is_some_and(|c| c.is_whitespace()))
                .all(|i| {
                    found
                        .iter()
                        .any(|f| f.label == expected.label && f.start <= i && i < f.end)
                });
            add(&expected.label, [1, usize::from(covered), 0, 0]);
        }
        for tag in found {
            let correct = probe
                .entities
                .iter()
                .any(|e| e.label == tag.label && e.start < tag.end && tag.start < e.end);
            add(&tag.label, [0, 0, 1, usize::from(correct)]);
        }
    }
    let labels = counts
        .into_iter()
        .map(|(label, [expected, found, tagged, correct])| LabelScore {
            label,
            expected,
            found,
            tagged,
            correct,
        })
        .collect();
    Ok(Scores(labels))
}

/// What a round says about a model.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every bound is met.
    Pass {
        /// The figures.
        summary: String,
    },
    /// A label's recall is below its bound (or below the stable model's).
    Fail {
        /// The first label that missed, by name.
        label: String,
        /// Its recall.
        recall: f64,
        /// What it had to reach.
        bound: f64,
        /// What set the bound: `minRecall`, or the stable model.
        by: &'static str,
        /// The figures.
        summary: String,
    },
}

impl Verdict {
    /// For a condition or an Event: the figures, and what missed first.
    pub fn message(&self) -> String {
        match self {
            Verdict::Pass { summary } => format!("passed: {summary}"),
            Verdict::Fail {
                label,
                recall,
                bound,
                by,
                summary,
            } => format!("{label} recall {recall:.2} is below {bound:.2} ({by}): {summary}"),
        }
    }
}

/// Judges `scores` against the gate's bounds and, with
/// `notWorseThanStable`, against the stable model's scores on the same
/// probes (when a stable pod was measured).
pub fn judge(
    gate: &QualityGate,
    set: &ProbeSet,
    scores: &Scores,
    stable: Option<&Scores>,
) -> Verdict {
    let summary = scores.summary();
    for label in set.labels() {
        let recall = scores.get(&label).map_or(0.0, LabelScore::recall);
        if let Some(bound) = gate.bound(&label)
            && recall + 1e-9 < bound
        {
            return Verdict::Fail {
                label,
                recall,
                bound,
                by: "minRecall",
                summary,
            };
        }
        if gate.not_worse_than_stable
            && let Some(stable) = stable.and_then(|s| s.get(&label))
            && recall + 1e-9 < stable.recall()
        {
            return Verdict::Fail {
                label,
                recall,
                bound: stable.recall(),
                by: "the stable model's recall",
                summary,
            };
        }
    }
    Verdict::Pass { summary }
}

/// The gate of a resource, when its spec (valid) asks for one, and the
/// container that serves the model.
pub fn gate_of(resource: &ResourceView) -> Option<(QualityGate, String)> {
    // Most resources have no gate: no validation for them on each resync.
    resource.spec.get("qualityGate")?;
    let spec = validate_spec(&resource.spec, None).ok()?;
    Some((spec.quality_gate?, spec.target_ref.container_name))
}

/// The container that serves the model, for a resource whose spec is
/// valid (`openmed-service` otherwise).
pub fn container_of(resource: &ResourceView) -> String {
    validate_spec(&resource.spec, None)
        .map(|s| s.target_ref.container_name)
        .unwrap_or_else(|_| crate::api::TargetRef::default().container_name)
}

/// The version a pod of template `snapshot` serves: the spec's, or a
/// retained one's (a rollback's pods), matched by the template's snapshot
/// label. The gate names it in each request, as a client that knows the
/// version would.
pub fn version_of(resource: &ResourceView, snapshot: &str) -> Option<String> {
    let spec: Option<OpenMedModelSpec> = validate_spec(&resource.spec, None).ok();
    let status = &resource.status;
    let id = resource.id();
    [
        spec.as_ref(),
        status.rollback_spec.as_ref(),
        status.last_successful_spec.as_ref(),
        status.previous_successful_spec.as_ref(),
    ]
    .into_iter()
    .flatten()
    .find(|s| {
        let placed = match &spec {
            Some(current) => plan::placed_as(s, current),
            None => (*s).clone(),
        };
        let planned = plan::plan(&id, &placed, TargetOptions::default());
        planned.deployment.snapshot_label.as_deref() == Some(snapshot)
    })
    .map(|s| s.version.clone())
}

/// The request body for one probe text.
pub fn request(set: &ProbeSet, text: &str, version: &str) -> Value {
    let mut body = Value::Object(set.request.clone());
    body["text"] = json!(text);
    body["model_name"] = json!(version);
    body
}

/// Reads the service's answer to `POST /pii/extract`: its `entities`
/// (`label`, `start`, `end`) on a 200, else why not.
pub fn answer(status: u16, body: &Value) -> Answer {
    if status != 200 {
        let code = body
            .pointer("/error/code")
            .and_then(Value::as_str)
            .map(|c| format!(" ({c})"))
            .unwrap_or_default();
        return Answer::Failed(format!("HTTP {status}{code}"));
    }
    let Some(entities) = body.get("entities").and_then(Value::as_array) else {
        return Answer::Failed("a 200 without entities: not the OpenMed service's answer".into());
    };
    let mut found = Vec::with_capacity(entities.len());
    for e in entities {
        let label = e.get("label").and_then(Value::as_str);
        let start = e.get("start").and_then(Value::as_u64);
        let end = e.get("end").and_then(Value::as_u64);
        match (label, start, end) {
            (Some(label), Some(start), Some(end)) => found.push(Span {
                label: label.to_owned(),
                start: start as usize,
                end: end as usize,
            }),
            _ => return Answer::Failed("an entity without label, start and end".into()),
        }
    }
    Answer::Found(found)
}

/// A pod to probe now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProbe {
    /// The pod's name.
    pub pod: String,
    /// Its service endpoint: `http://<podIP>:<port>/pii/extract`.
    pub url: String,
    /// A pod of the version being replaced, measured for
    /// `notWorseThanStable`; never marked.
    pub stable: bool,
}

/// The port the gate probes: the container's port named `http`, else its
/// first port.
pub fn service_port(target: &Deployment, container: &str) -> Option<i32> {
    let ports = target
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?
        .ports
        .as_ref()?;
    ports
        .iter()
        .find(|p| p.name.as_deref() == Some("http"))
        .or_else(|| ports.first())
        .map(|p| p.container_port)
}

/// The Host header the gate sends: the one the container's own readiness
/// (else startup, else liveness) probe sends, since a service that checks
/// the Host it is asked for (the OpenMed service does) trusts that one;
/// `None` sends the pod's address, as a kubelet's probe without the header.
pub fn service_host(target: &Deployment, container: &str) -> Option<String> {
    let c = target
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?;
    [&c.readiness_probe, &c.startup_probe, &c.liveness_probe]
        .into_iter()
        .flatten()
        .filter_map(|p| p.http_get.as_ref()?.http_headers.as_ref())
        .flatten()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| h.value.clone())
}

fn endpoint(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]:{port}/pii/extract")
    } else {
        format!("http://{ip}:{port}/pii/extract")
    }
}

/// The pods of `owner` (`<namespace>/<name>`, the pods' ownership
/// annotation) to probe now: every gated pod whose model is warm and not
/// yet judged, by name; and, with `notWorseThanStable`, one judged or
/// ungated ready pod of another template to compare with.
pub fn probes_due(gate: &QualityGate, pods: &[PodView], owner: &str, port: i32) -> Vec<PodProbe> {
    let mine: Vec<&PodView> = pods
        .iter()
        .filter(|p| p.owner.as_deref() == Some(owner) && !p.terminating && p.ip.is_some())
        .collect();
    let mut due: Vec<PodProbe> = mine
        .iter()
        .filter(|p| p.awaits_judgement())
        .map(|p| PodProbe {
            pod: p.name.clone(),
            url: endpoint(p.ip.as_deref().unwrap_or_default(), port),
            stable: false,
        })
        .collect();
    due.sort_by(|a, b| a.pod.cmp(&b.pod));
    if gate.not_worse_than_stable && !due.is_empty() {
        let judged: Vec<&str> = due.iter().map(|d| d.pod.as_str()).collect();
        let new_templates: Vec<&Option<String>> = mine
            .iter()
            .filter(|p| judged.contains(&p.name.as_str()))
            .map(|p| &p.snapshot)
            .collect();
        let mut stable: Vec<&&PodView> = mine
            .iter()
            .filter(|p| {
                p.containers_ready
                    && !new_templates.contains(&&p.snapshot)
                    && p.quality.as_ref().is_none_or(|q| q.passed)
                    && (p.quality.is_some() || !p.gated)
            })
            .collect();
        stable.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(p) = stable.first() {
            due.push(PodProbe {
                pod: p.name.clone(),
                url: endpoint(p.ip.as_deref().unwrap_or_default(), port),
                stable: true,
            });
        }
    }
    due
}

/// A canary's probes this round: every ready pod of the canary template
/// of `owner`, by name, and with `notWorseThanStable` one ready pod of
/// the stable template.
pub fn canary_probes(
    gate: &QualityGate,
    pods: &[PodView],
    owner: &str,
    canary: &str,
    stable: Option<&str>,
    port: i32,
) -> Vec<PodProbe> {
    let ready = |snapshot: &str| {
        let mut found: Vec<&PodView> = pods
            .iter()
            .filter(|p| {
                p.owner.as_deref() == Some(owner)
                    && p.snapshot.as_deref() == Some(snapshot)
                    && p.containers_ready
                    && !p.terminating
                    && p.ip.is_some()
            })
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found
    };
    let probe = |p: &PodView, stable: bool| PodProbe {
        pod: p.name.clone(),
        url: endpoint(p.ip.as_deref().unwrap_or_default(), port),
        stable,
    };
    let mut due: Vec<PodProbe> = ready(canary).into_iter().map(|p| probe(p, false)).collect();
    if gate.not_worse_than_stable
        && let Some(p) = stable.and_then(|s| ready(s).into_iter().next())
    {
        due.push(probe(p, true));
    }
    due
}

/// A canary round's outcome over its pods' scores: no ready canary pod or
/// a pod without a usable answer is inconclusive; any pod below a bound
/// fails; else it passes. Figures only.
pub fn judge_round(
    gate: &QualityGate,
    set: &ProbeSet,
    rounds: &[(PodProbe, Result<Scores, String>)],
) -> (crate::api::Outcome, String) {
    use crate::api::Outcome;
    let stable = rounds
        .iter()
        .find(|(p, _)| p.stable)
        .and_then(|(_, r)| r.as_ref().ok());
    let canary: Vec<&(PodProbe, Result<Scores, String>)> =
        rounds.iter().filter(|(p, _)| !p.stable).collect();
    if canary.is_empty() {
        return (Outcome::Inconclusive, "no ready canary pod to probe".into());
    }
    let mut passed = None;
    for (probe, scores) in &canary {
        match scores {
            Err(why) => {
                return (
                    Outcome::Inconclusive,
                    format!("pod {}: no judgement: {why}", probe.pod),
                );
            }
            Ok(scores) => match judge(gate, set, scores, stable) {
                fail @ Verdict::Fail { .. } => {
                    return (
                        Outcome::Fail,
                        format!("pod {}: {}", probe.pod, fail.message()),
                    );
                }
                Verdict::Pass { summary } => {
                    passed.get_or_insert(summary);
                }
            },
        }
    }
    let summary = passed.unwrap_or_default();
    (
        Outcome::Pass,
        format!("{} canary pod(s) passed: {summary}", canary.len()),
    )
}

/// The condition to write on a judged pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The pod.
    pub pod: String,
    /// `True` or `False`.
    pub passed: bool,
    /// `QualityGatePassed` or `QualityGateFailed`.
    pub reason: &'static str,
    /// The figures, and what missed.
    pub message: String,
}

impl Mark {
    /// `passed` or `failed`, the metric's outcome.
    pub fn outcome(&self) -> &'static str {
        if self.passed { "passed" } else { "failed" }
    }

    /// The Event on the OpenMedModel that tells of it: figures only.
    pub fn event(&self) -> super::Event {
        super::Event {
            type_: if self.passed {
                super::EventType::Normal
            } else {
                super::EventType::Warning
            },
            reason: self.reason,
            message: format!("pod {}: {}", self.pod, self.message),
        }
    }
}

/// The mark for `pod` after a conclusive round.
pub fn mark(pod: &str, verdict: &Verdict) -> Mark {
    Mark {
        pod: pod.to_owned(),
        passed: matches!(verdict, Verdict::Pass { .. }),
        reason: match verdict {
            Verdict::Pass { .. } => super::reason::QUALITY_GATE_PASSED,
            Verdict::Fail { .. } => super::reason::QUALITY_GATE_FAILED,
        },
        message: verdict.message(),
    }
}

/// A pod among `pods` (the rollout's own, [`super::pods::of_rollout`])
/// that failed the gate, first by name: the rollout has failed. "pod P
/// failed the quality gate: DATE recall 0.00 is below 0.95 (minRecall):
/// ..."
pub fn failure<'a>(pods: impl IntoIterator<Item = &'a PodView>) -> Option<String> {
    let mut failed: Vec<&PodView> = pods
        .into_iter()
        .filter(|p| p.quality.as_ref().is_some_and(|q| !q.passed))
        .collect();
    failed.sort_by(|a, b| a.name.cmp(&b.name));
    let pod = failed.first()?;
    let message = &pod.quality.as_ref()?.message;
    Some(format!(
        "pod {} failed the quality gate: {message}",
        pod.name
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::quality::{ConfigMapRef, Probe};
    use crate::rollout::pods::QualityMark;

    fn span(label: &str, start: usize, end: usize) -> Span {
        Span {
            label: label.into(),
            start,
            end,
        }
    }

    /// "Patient John Smith was seen on 2024-03-15." NAME 8..18, DATE 31..41.
    fn set() -> ProbeSet {
        ProbeSet {
            request: Default::default(),
            probes: vec![
                Probe {
                    text: "Patient John Smith was seen on 2024-03-15.".into(),
                    entities: vec![span("NAME", 8, 18), span("DATE", 31, 41)],
                },
                Probe {
                    text: "Mary Jones, 2025-01-20.".into(),
                    entities: vec![span("NAME", 0, 10), span("DATE", 12, 22)],
                },
            ],
        }
    }

    fn gate(bounds: &[(&str, f64)], stable: bool) -> QualityGate {
        QualityGate {
            config_map_ref: ConfigMapRef {
                name: "probes".into(),
            },
            min_recall: bounds
                .iter()
                .map(|(l, b)| ((*l).to_owned(), *b))
                .collect::<BTreeMap<_, _>>(),
            not_worse_than_stable: stable,
        }
    }

    fn everything() -> Vec<Answer> {
        vec![
            // The name as two words: the space between needs no tag.
            Answer::Found(vec![
                span("NAME", 8, 12),
                span("NAME", 13, 18),
                span("DATE", 31, 41),
            ]),
            Answer::Found(vec![span("NAME", 0, 10), span("DATE", 12, 22)]),
        ]
    }

    fn no_dates() -> Vec<Answer> {
        vec![
            Answer::Found(vec![span("NAME", 8, 18), span("LOCATION", 0, 7)]),
            Answer::Found(vec![span("NAME", 0, 10)]),
        ]
    }

    #[test]
    fn recall_counts_an_entity_found_when_its_label_covers_every_non_space_character() {
        let scores = score(&set(), &everything()).unwrap();
        assert_eq!(scores.get("NAME").unwrap().recall(), 1.0);
        assert_eq!(scores.get("DATE").unwrap().recall(), 1.0);
        assert_eq!(
            scores.summary(),
            "DATE recall 1.00 (2/2) precision 1.00, NAME recall 1.00 (2/2) precision 1.00"
        );
        // Half a date, or the right span with the wrong label, is a miss.
        let partial = vec![
            Answer::Found(vec![span("NAME", 8, 18), span("DATE", 31, 35)]),
            Answer::Found(vec![span("LOCATION", 0, 10), span("DATE", 12, 22)]),
        ];
        let scores = score(&set(), &partial).unwrap();
        assert_eq!(scores.get("DATE").unwrap().found, 1);
        assert_eq!(scores.get("NAME").unwrap().found, 1);
        assert_eq!(scores.get("LOCATION").unwrap().precision(), Some(0.0));
    }

    #[test]
    fn a_failed_answer_makes_the_round_inconclusive_never_a_pass() {
        let mut answers = everything();
        answers[1] = Answer::Failed("HTTP 503".into());
        assert_eq!(score(&set(), &answers), Err("HTTP 503".into()));
        assert!(score(&set(), &answers[..1]).is_err(), "an answer missing");
    }

    #[test]
    fn a_label_below_its_bound_fails_and_the_message_names_it_with_numbers_only() {
        let scores = score(&set(), &no_dates()).unwrap();
        let verdict = judge(
            &gate(&[("NAME", 1.0), ("DATE", 0.95)], false),
            &set(),
            &scores,
            None,
        );
        assert_eq!(
            verdict.message(),
            "DATE recall 0.00 is below 0.95 (minRecall): DATE recall 0.00 (0/2), \
             LOCATION precision 0.00, NAME recall 1.00 (2/2) precision 1.00"
        );
        assert!(!verdict.message().contains("John"), "no text");
        // The wildcard bounds every label not named; a label with no bound
        // is only reported.
        assert!(matches!(
            judge(&gate(&[("*", 0.5)], false), &set(), &scores, None),
            Verdict::Fail { ref label, .. } if label == "DATE"
        ));
        assert!(matches!(
            judge(&gate(&[("NAME", 1.0)], false), &set(), &scores, None),
            Verdict::Pass { .. }
        ));
    }

    #[test]
    fn not_worse_than_stable_compares_each_label_with_the_stable_models_recall() {
        let good = score(&set(), &everything()).unwrap();
        let bad = score(&set(), &no_dates()).unwrap();
        let lenient = gate(&[("*", 0.0)], true);
        let verdict = judge(&lenient, &set(), &bad, Some(&good));
        assert!(
            matches!(&verdict, Verdict::Fail { label, by, .. } if label == "DATE" && *by == "the stable model's recall"),
            "{verdict:?}"
        );
        assert!(matches!(
            judge(&lenient, &set(), &good, Some(&bad)),
            Verdict::Pass { .. }
        ));
        assert!(
            matches!(judge(&lenient, &set(), &bad, None), Verdict::Pass { .. }),
            "no stable pod measured: the bounds alone"
        );
    }

    fn pod(name: &str, snapshot: &str, ready: bool, quality: Option<bool>) -> PodView {
        PodView {
            namespace: "ns".into(),
            name: name.into(),
            owner: Some("ns/svc".into()),
            snapshot: Some(snapshot.into()),
            ip: Some(format!("10.0.0.{}", name.len())),
            containers_ready: ready,
            gated: true,
            quality: quality.map(|passed| QualityMark {
                passed,
                message: "m".into(),
            }),
            ..PodView::default()
        }
    }

    #[test]
    fn only_warm_unjudged_gated_pods_of_this_resource_are_probed() {
        let mut other = pod("theirs", "new", true, None);
        other.owner = Some("ns/other".into());
        let mut leaving = pod("leaving", "new", true, None);
        leaving.terminating = true;
        let mut ungated = pod("ungated", "new", true, None);
        ungated.gated = false;
        let pods = vec![
            pod("new-b", "new", true, None),
            pod("new-a", "new", true, None),
            pod("cold", "new", false, None),
            pod("judged", "new", true, Some(true)),
            other,
            leaving,
            ungated,
        ];
        let due = probes_due(&gate(&[], false), &pods, "ns/svc", 8080);
        let names: Vec<&str> = due.iter().map(|d| d.pod.as_str()).collect();
        assert_eq!(names, ["new-a", "new-b"]);
        assert_eq!(due[0].url, "http://10.0.0.5:8080/pii/extract");
    }

    #[test]
    fn not_worse_than_stable_adds_one_ready_pod_of_another_template() {
        let mut old = pod("old-a", "old", true, None);
        old.gated = false;
        let pods = vec![
            pod("new-a", "new", true, None),
            pod("old-b", "old", true, Some(false)),
            old,
        ];
        let due = probes_due(&gate(&[], true), &pods, "ns/svc", 80);
        assert_eq!(due.len(), 2);
        assert_eq!((due[1].pod.as_str(), due[1].stable), ("old-a", true));
        // Nothing to judge: no stable pod either.
        assert!(probes_due(&gate(&[], true), &pods[1..], "ns/svc", 80).is_empty());
    }

    #[test]
    fn the_services_answer_gives_the_entities_or_says_why_not() {
        let ok = json!({"entities": [{"label": "NAME", "start": 8, "end": 18, "text": "John Smith", "confidence": 0.9}],
                        "model_name": "OpenMed/v1"});
        assert_eq!(answer(200, &ok), Answer::Found(vec![span("NAME", 8, 18)]));
        assert_eq!(
            answer(503, &json!({"error": {"code": "circuit_breaker_open"}})),
            Answer::Failed("HTTP 503 (circuit_breaker_open)".into())
        );
        assert!(matches!(
            answer(200, &json!({"ok": true})),
            Answer::Failed(_)
        ));
        let mut set = set();
        set.request.insert("use_smart_merging".into(), json!(false));
        assert_eq!(
            request(&set, "t", "OpenMed/v2"),
            json!({"text": "t", "model_name": "OpenMed/v2", "use_smart_merging": false})
        );
    }

    #[test]
    fn the_gate_asks_at_the_http_port_with_the_host_the_pods_own_probe_sends() {
        let target: Deployment = serde_json::from_value(json!({
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "sidecar", "ports": [{"containerPort": 9000}]},
                {"name": "svc", "ports": [{"name": "metrics", "containerPort": 9090}, {"name": "http", "containerPort": 8080}],
                 "livenessProbe": {"httpGet": {"path": "/livez", "port": 8080, "httpHeaders": [{"name": "Host", "value": "live"}]}},
                 "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080, "httpHeaders": [{"name": "host", "value": "localhost"}]}}},
            ]}}}
        }))
        .unwrap();
        assert_eq!(service_port(&target, "svc"), Some(8080));
        assert_eq!(service_port(&target, "sidecar"), Some(9000));
        assert_eq!(service_host(&target, "svc").as_deref(), Some("localhost"));
        assert_eq!(service_host(&target, "sidecar"), None);
    }

    #[test]
    fn a_pods_version_is_found_by_its_templates_snapshot_label() {
        let mut resource = ResourceView::new(
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("svc".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                ..Default::default()
            },
            json!({"family": "pii", "tier": "Small", "version": "OpenMed/v2"}),
            None,
        );
        let old: OpenMedModelSpec = serde_json::from_value(
            json!({"family": "pii", "tier": "Small", "version": "OpenMed/v1"}),
        )
        .unwrap();
        resource.status.last_successful_spec = Some(old.clone());
        let label = |spec: &OpenMedModelSpec| {
            plan::plan(&resource.id(), spec, TargetOptions::default())
                .deployment
                .snapshot_label
                .unwrap()
        };
        let current: OpenMedModelSpec = serde_json::from_value(resource.spec.clone()).unwrap();
        assert_eq!(
            version_of(&resource, &label(&current)).as_deref(),
            Some("OpenMed/v2")
        );
        assert_eq!(
            version_of(&resource, &label(&old)).as_deref(),
            Some("OpenMed/v1")
        );
        assert_eq!(version_of(&resource, "0000000000"), None);
    }

    #[test]
    fn a_canary_round_probes_its_ready_pods_and_fails_on_any_that_misses() {
        use crate::api::Outcome;
        let mut cold = pod("canary-c", "new", false, None);
        cold.gated = false;
        let pods = vec![
            pod("canary-b", "new", true, None),
            pod("canary-a", "new", true, Some(true)),
            cold,
            pod("stable-a", "old", true, None),
        ];
        let due = canary_probes(&gate(&[], true), &pods, "ns/svc", "new", Some("old"), 80);
        let names: Vec<(&str, bool)> = due.iter().map(|d| (d.pod.as_str(), d.stable)).collect();
        assert_eq!(
            names,
            [("canary-a", false), ("canary-b", false), ("stable-a", true)]
        );

        let strict = gate(&[("*", 1.0)], false);
        let good = score(&set(), &everything()).unwrap();
        let bad = score(&set(), &no_dates()).unwrap();
        let (outcome, message) = judge_round(
            &strict,
            &set(),
            &[
                (due[0].clone(), Ok(good.clone())),
                (due[1].clone(), Ok(bad)),
            ],
        );
        assert_eq!(outcome, Outcome::Fail);
        assert!(
            message.starts_with("pod canary-b: DATE recall 0.00 is below 1.00"),
            "{message}"
        );
        let (outcome, message) = judge_round(&strict, &set(), &[(due[0].clone(), Ok(good))]);
        assert_eq!(outcome, Outcome::Pass);
        assert!(
            message.starts_with("1 canary pod(s) passed: DATE recall 1.00 (2/2)"),
            "{message}"
        );
        let (outcome, _) =
            judge_round(&strict, &set(), &[(due[0].clone(), Err("HTTP 503".into()))]);
        assert_eq!(outcome, Outcome::Inconclusive, "no answer is never a pass");
        assert_eq!(judge_round(&strict, &set(), &[]).0, Outcome::Inconclusive);
    }

    #[test]
    fn a_failed_pod_of_the_rollout_is_its_failure() {
        let pods = vec![
            pod("new-b", "new", true, Some(false)),
            pod("new-a", "new", true, Some(true)),
        ];
        assert_eq!(
            failure(&pods).unwrap(),
            "pod new-b failed the quality gate: m"
        );
        assert_eq!(failure(&pods[1..]), None);
        let verdict = Verdict::Pass {
            summary: "NAME recall 1.00 (1/1)".into(),
        };
        let passed = mark("p", &verdict);
        assert_eq!(
            passed,
            Mark {
                pod: "p".into(),
                passed: true,
                reason: crate::rollout::reason::QUALITY_GATE_PASSED,
                message: "passed: NAME recall 1.00 (1/1)".into()
            }
        );
        let event = passed.event();
        assert_eq!(event.type_, crate::rollout::EventType::Normal);
        assert_eq!(event.message, "pod p: passed: NAME recall 1.00 (1/1)");
        assert_eq!(passed.outcome(), "passed");
    }
}
