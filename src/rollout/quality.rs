//! The quality gate, the pure part: which pods to probe, what their
//! answers score, and what the score means for the pod and the rollout.
//!
//! A pod whose template carries the readiness gate `openmed.ai/model-quality`
//! is never Ready, so never in a Service's endpoints, until the operator
//! sets that condition. Once its containers are ready (the model is warm)
//! [`probe_plan`] asks the shell to send each text of the probe set once
//! to the pod's own `POST /pii/extract`; the shell hands the scores back
//! as an observation ([`ProbeRound`]), and `decide` judges them
//! ([`judge_gate`]): the pod's mark, True when every label's recall
//! reaches its bound, False naming the label that missed, is a write of
//! the decision. A False mark on a pod of the template being rolled out
//! fails the rollout ([`failure`]), through the same rollback rules as any
//! failure. The canary's probes analysis is planned and judged the same
//! way, as one reading ([`canary_reading`]).
//!
//! No answer is never a pass: an error, an unreachable pod or an answer
//! that did not come in time leaves the pod unjudged (and not Ready), to
//! be probed again after [`RETRY_SECONDS`].
//!
//! Matching, chosen for PHI: an expected entity is found when the model's
//! entities of the same label cover every one of its non-space characters
//! (a name tagged as two words counts; half a date does not). A tagged
//! entity is correct when it overlaps an expected one of its label.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::Observed;
use super::analysis::{Check, Measurement, PROBES, Reading};
use super::pods::{PodView, ReplicaSetRef, current_replica_set};
use super::resource::ResourceView;
use crate::api::quality::{ANY_LABEL, ProbeSet, QualityGate, Span};
use crate::api::{OpenMedModelSpec, Outcome, validate_spec};
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
    spec.iter()
        .chain(status.known_specs())
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

/// What a probe round is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The quality gate (`spec.qualityGate`): each pod judged gets its
    /// mark.
    Gate,
    /// The canary's probes analysis (`spec.canary.analysis.probes`): one
    /// reading over the canary's ready pods.
    Canary,
}

/// A pod the shell is to send the probe set to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProbe {
    /// The pod's name.
    pub pod: String,
    /// Its service endpoint: `http://<podIP>:<port>/pii/extract`.
    pub url: String,
    /// The Host header to send; `None` sends the pod's address.
    pub host: Option<String>,
    /// The version its template serves, named in each request.
    pub version: String,
    /// A pod of the version being replaced, measured for
    /// `notWorseThanStable`; never marked.
    pub stable: bool,
}

/// A pod due for probing that cannot be asked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unasked {
    /// The pod's name.
    pub pod: String,
    /// Why it is not asked.
    pub why: String,
    /// A pod of the version being replaced (see [`PodProbe::stable`]).
    pub stable: bool,
}

/// One probe round the core asks of the shell: the probe set of `gate`,
/// sent to each pod of `requests`.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundPlan {
    /// What the answers are for.
    pub purpose: Purpose,
    /// The bounds the answers are judged by; its `configMapRef` names the
    /// probe set to read.
    pub gate: QualityGate,
    /// The pods to ask, by name.
    pub requests: Vec<PodProbe>,
    /// The pods due that cannot be asked.
    pub unasked: Vec<Unasked>,
    /// With `notWorseThanStable`: whether the version being replaced is
    /// measured too.
    pub stable: Stable,
}

/// Whether a round measures the version being replaced, to compare with
/// (`notWorseThanStable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stable {
    /// Not asked for, or nothing of that version runs (a first rollout,
    /// or the `Recreate` strategy): the bounds alone judge.
    NotAsked,
    /// A pod of it is among the requests (or the unasked).
    Asked,
    /// It runs, but no pod of it can be measured now, and why: no round
    /// is judged without it.
    Missing(String),
}

/// A round as the shell carried it out: what `decide` judges.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeRound {
    /// What was asked.
    pub plan: RoundPlan,
    /// The probe set as read, or why it could not be; without one nothing
    /// is sent.
    pub set: Result<ProbeSet, String>,
    /// For each request sent, in order: the pod's scores, or why there
    /// are none (an answer that did not come in time is none).
    pub answers: Vec<PodAnswer>,
}

/// What one pod's round got.
#[derive(Debug, Clone, PartialEq)]
pub struct PodAnswer {
    /// The pod's name.
    pub pod: String,
    /// Its scores, or why there are none.
    pub scores: Result<Scores, String>,
}

/// The probe rounds due now: the gate's, when a pod of the resource
/// awaits judgement, and the canary's, when its probes analysis is due
/// ([`super::analysis_checks`]). The shell reads each round's probe set,
/// sends the requests, and hands the answers to `decide`
/// ([`Observed::probes`], which this leaves unread).
///
/// Which pods are which is told by their ReplicaSets, never by the model
/// they run: a canary may serve the stable version on another tier, and
/// a change that keeps the model (adding the gate) makes a new template.
pub fn probe_plan(obs: &Observed) -> Vec<RoundPlan> {
    let resource = obs.resource;
    let gate = gate_of(resource);
    let canary: Vec<QualityGate> = super::analysis_checks(resource, &obs.settings, &obs.now)
        .into_iter()
        .filter_map(|check| match check {
            Check::Probes { gate } => Some(gate),
            _ => None,
        })
        .collect();
    if gate.is_none() && canary.is_empty() {
        // Most resources: nothing to probe, nothing more to look at.
        return Vec::new();
    }
    let key = resource.key();
    let deployments = Deployments::of(obs);
    let mut plans = Vec::new();
    if let Some((gate, _)) = gate {
        // A round per Deployment: each compares with its own version
        // being replaced (a promotion rolls the stable Deployment while
        // the canary's pods already serve the new version).
        for pods in deployments.each(obs.pods) {
            let due = gate_due(&gate, pods, &key);
            if !due.pods.is_empty() {
                plans.push(round(
                    resource,
                    Purpose::Gate,
                    gate.clone(),
                    due,
                    &deployments,
                ));
            }
        }
    }
    for gate in canary {
        let due = canary_due(&gate, obs.pods, &key, &deployments);
        plans.push(round(resource, Purpose::Canary, gate, due, &deployments));
    }
    plans
}

/// The stable and the canary Deployment, as the probes need them: which
/// ReplicaSets are theirs, and where their pods listen.
struct Deployments<'o> {
    replica_sets: Vec<ReplicaSetRef<'o>>,
    stable: Option<Side<'o>>,
    canary: Option<Side<'o>>,
}

/// One Deployment of the resource.
struct Side<'o> {
    deployment: &'o Deployment,
    /// Its current template's ReplicaSet, once its controller has seen
    /// its generation.
    current: Option<&'o str>,
    /// Where its pods are asked, or why they cannot be.
    address: Result<(i32, Option<String>), String>,
}

impl<'o> Deployments<'o> {
    fn of(obs: &'o Observed) -> Self {
        let replica_sets: Vec<ReplicaSetRef<'o>> = obs
            .snapshot_uses
            .iter()
            .map(|u| ReplicaSetRef {
                name: &u.replica_set,
                deployment: u.deployment.as_deref(),
                revision: u.revision.as_deref(),
            })
            .collect();
        let side = |deployment: &'o Deployment, container: String| Side {
            deployment,
            current: current_replica_set(
                deployment,
                deployment.metadata.generation,
                replica_sets.iter().copied(),
            ),
            address: service_address(deployment, &container),
        };
        let stable = obs.target.map(|t| side(t, container_of(obs.resource)));
        let canary = obs
            .canary_target
            .zip(canary_container(obs.resource))
            .map(|(c, container)| side(c, container));
        Deployments {
            replica_sets,
            stable,
            canary,
        }
    }

    /// Whether `pod` belongs to `side`'s Deployment (through its
    /// ReplicaSet).
    fn holds(&self, side: &Side, pod: &PodView) -> bool {
        let uid = side.deployment.metadata.uid.as_deref();
        let Some(replica_set) = pod.replica_set.as_deref() else {
            return false;
        };
        uid.is_some()
            && self
                .replica_sets
                .iter()
                .any(|rs| rs.name == replica_set && rs.deployment == uid)
    }

    /// `pods` split by Deployment: the stable one's, the canary one's,
    /// and those of neither (a ReplicaSet not cached yet).
    fn each<'p>(&self, pods: &'p [PodView]) -> [Vec<&'p PodView>; 3] {
        let mut split: [Vec<&PodView>; 3] = Default::default();
        for pod in pods {
            let side = [&self.stable, &self.canary]
                .into_iter()
                .position(|side| side.as_ref().is_some_and(|side| self.holds(side, pod)))
                .unwrap_or(2);
            split[side].push(pod);
        }
        split
    }

    /// Where `pod` is asked: at its own Deployment's port.
    fn address(&self, pod: &PodView) -> Result<(i32, Option<String>), String> {
        let side = [&self.canary, &self.stable]
            .into_iter()
            .flatten()
            .find(|side| self.holds(side, pod))
            .or(self.stable.as_ref());
        match side {
            Some(side) => side.address.clone(),
            None => Err("the target Deployment is not there".to_owned()),
        }
    }
}

/// The canary Deployment's container, for a valid spec with a canary.
fn canary_container(resource: &ResourceView) -> Option<String> {
    let spec = validate_spec(&resource.spec, None).ok()?;
    Some(spec.canary?.target_ref.container_name)
}

/// The port the gate asks at, and the Host it sends, for pods of
/// `target`'s template; else why the pods cannot be asked.
fn service_address(target: &Deployment, container: &str) -> Result<(i32, Option<String>), String> {
    let port = service_port(target, container).ok_or_else(|| port_unknown(target, container))?;
    Ok((port, service_host(target, container)))
}

/// Why the gate cannot ask the pods of `target` anything.
pub fn port_unknown(target: &Deployment, container: &str) -> String {
    format!(
        "the quality gate cannot reach the service: container {container} of Deployment {} declares no port, and no httpGet probe names one; declare its HTTP port (named http) or give it an httpGet readiness probe",
        target.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Each pod due, as a request or as why it cannot be one.
fn round(
    resource: &ResourceView,
    purpose: Purpose,
    gate: QualityGate,
    due: Due,
    deployments: &Deployments,
) -> RoundPlan {
    let mut requests = Vec::new();
    let mut unasked = Vec::new();
    for (pod, stable) in due.pods {
        let version = pod
            .snapshot
            .as_deref()
            .and_then(|s| version_of(resource, s));
        let asked = match (deployments.address(pod), version) {
            (Err(why), _) => Err(why),
            (_, None) => Err("its template's version is not one this resource knows".to_owned()),
            (Ok((port, host)), Some(version)) => Ok(PodProbe {
                pod: pod.name.clone(),
                url: endpoint(pod.ip.as_deref().unwrap_or_default(), port),
                host,
                version,
                stable,
            }),
        };
        match asked {
            Ok(probe) => requests.push(probe),
            Err(why) => unasked.push(Unasked {
                pod: pod.name.clone(),
                why,
                stable,
            }),
        }
    }
    RoundPlan {
        purpose,
        gate,
        requests,
        unasked,
        stable: due.stable,
    }
}

/// The port the gate probes: the container's port named `http`; else the
/// port its own readiness (else startup, else liveness) probe asks at
/// over HTTP, which the service serves on anyway (a name resolved against
/// the container's ports); else its first port. `None`: nothing says
/// where the service listens.
pub fn service_port(target: &Deployment, container: &str) -> Option<i32> {
    let c = target
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?;
    let ports = c.ports.as_deref().unwrap_or_default();
    let named = |name: &str| {
        ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
    };
    let probed = || {
        [&c.readiness_probe, &c.startup_probe, &c.liveness_probe]
            .into_iter()
            .flatten()
            .filter_map(|p| p.http_get.as_ref())
            .find_map(|get| match &get.port {
                IntOrString::Int(port) => Some(*port),
                IntOrString::String(name) => named(name),
            })
    };
    named("http")
        .or_else(probed)
        .or_else(|| ports.first().map(|p| p.container_port))
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

/// The pods a round asks, each marked `true` when it is of the version
/// being replaced, and whether that version is measured.
struct Due<'p> {
    pods: Vec<(&'p PodView, bool)>,
    stable: Stable,
}

/// A pod that may stand for the version being replaced: warm, reachable,
/// and not one the gate failed (it passed, or was never gated).
fn may_compare(pod: &PodView) -> bool {
    pod.containers_ready
        && pod.ip.is_some()
        && pod.quality.as_ref().is_none_or(|q| q.passed)
        && (pod.quality.is_some() || !pod.gated)
}

/// Of `pods` (one Deployment's), those of `owner` (`<namespace>/<name>`,
/// the pods' ownership annotation) the gate is to probe now, by name:
/// every gated pod whose model is warm and not yet judged. With
/// `notWorseThanStable`, the version being replaced is the pods of other
/// ReplicaSets (other templates) that the gate did not fail: one ready
/// pod of them is measured; when none is ready, the round has no reading
/// of it; when none runs, the bounds alone judge.
fn gate_due<'p>(
    gate: &QualityGate,
    pods: impl IntoIterator<Item = &'p PodView>,
    owner: &str,
) -> Due<'p> {
    let mine: Vec<&PodView> = pods
        .into_iter()
        .filter(|p| p.owner.as_deref() == Some(owner) && !p.terminating)
        .collect();
    let mut due: Vec<(&PodView, bool)> = mine
        .iter()
        .filter(|p| p.awaits_judgement() && p.ip.is_some())
        .map(|p| (*p, false))
        .collect();
    due.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    if !gate.not_worse_than_stable || due.is_empty() {
        return Due {
            pods: due,
            stable: Stable::NotAsked,
        };
    }
    let judged: Vec<&Option<String>> = due.iter().map(|(p, _)| &p.replica_set).collect();
    let mut others: Vec<&PodView> = mine
        .iter()
        .copied()
        .filter(|p| {
            p.replica_set.is_some()
                && !judged.contains(&&p.replica_set)
                && p.quality.as_ref().is_none_or(|q| q.passed)
        })
        .collect();
    others.sort_by(|a, b| a.name.cmp(&b.name));
    let stable = if others.is_empty() {
        Stable::NotAsked
    } else if let Some(p) = others.iter().find(|p| may_compare(p)) {
        due.push((p, true));
        Stable::Asked
    } else {
        Stable::Missing(format!(
            "no pod of another template is ready to compare with ({} not ready)",
            others.len()
        ))
    };
    Due { pods: due, stable }
}

/// A canary's pods to probe this round: every ready pod of the canary
/// Deployment's current template, by name; with `notWorseThanStable`,
/// one ready pod of the stable Deployment (its current template when
/// known), which always runs during a canary.
fn canary_due<'p>(
    gate: &QualityGate,
    pods: &'p [PodView],
    owner: &str,
    deployments: &Deployments,
) -> Due<'p> {
    let mut mine: Vec<&PodView> = pods
        .iter()
        .filter(|p| p.owner.as_deref() == Some(owner) && !p.terminating)
        .collect();
    mine.sort_by(|a, b| a.name.cmp(&b.name));
    let canary = deployments.canary.as_ref().and_then(|c| c.current);
    let mut due: Vec<(&PodView, bool)> = mine
        .iter()
        .filter(|p| {
            canary.is_some()
                && p.replica_set.as_deref() == canary
                && p.containers_ready
                && p.ip.is_some()
        })
        .map(|p| (*p, false))
        .collect();
    if !gate.not_worse_than_stable {
        return Due {
            pods: due,
            stable: Stable::NotAsked,
        };
    }
    let Some(side) = &deployments.stable else {
        return Due {
            pods: due,
            stable: Stable::Missing("the stable Deployment is not there".into()),
        };
    };
    let theirs: Vec<&PodView> = mine
        .iter()
        .copied()
        .filter(|p| deployments.holds(side, p) && may_compare(p))
        .collect();
    let current = theirs
        .iter()
        .find(|p| side.current.is_some() && p.replica_set.as_deref() == side.current);
    let stable = match current.or(theirs.first()) {
        Some(p) => {
            due.push((p, true));
            Stable::Asked
        }
        None => Stable::Missing(format!(
            "no pod of the stable Deployment {} is ready to compare with",
            side.deployment.metadata.name.as_deref().unwrap_or_default()
        )),
    };
    Due { pods: due, stable }
}

/// The round's reading of the version being replaced: none to compare
/// with, its scores, or why it has none (then nothing is judged).
fn stable_reading(round: &ProbeRound) -> Result<Option<&Scores>, String> {
    let missing = |why: String| Err(format!("no reading of the version being replaced: {why}"));
    match &round.plan.stable {
        Stable::NotAsked => Ok(None),
        Stable::Missing(why) => missing(why.clone()),
        Stable::Asked => {
            if let Some(u) = round.plan.unasked.iter().find(|u| u.stable) {
                return missing(format!("pod {}: {}", u.pod, u.why));
            }
            let Some(pod) = round.plan.requests.iter().find(|r| r.stable) else {
                return missing("no pod of it was asked".into());
            };
            match round.answers.iter().find(|a| a.pod == pod.pod) {
                Some(PodAnswer {
                    scores: Ok(scores), ..
                }) => Ok(Some(scores)),
                Some(PodAnswer {
                    scores: Err(why), ..
                }) => missing(format!("pod {}: {why}", pod.pod)),
                None => missing(format!("pod {}: no answer", pod.pod)),
            }
        }
    }
}

/// The answers of the pods a round judges (not the stable one).
fn judged_answers(round: &ProbeRound) -> impl Iterator<Item = &PodAnswer> {
    round.answers.iter().filter(|a| {
        round
            .plan
            .requests
            .iter()
            .any(|r| r.pod == a.pod && !r.stable)
    })
}

/// A canary round's outcome over its pods' scores: no ready canary pod or
/// a pod without a usable answer is inconclusive; any pod below a bound
/// fails; else it passes. Figures only.
fn judge_round(round: &ProbeRound, set: &ProbeSet) -> (Outcome, String) {
    let gate = &round.plan.gate;
    if let Some(u) = round.plan.unasked.iter().find(|u| !u.stable) {
        return (
            Outcome::Inconclusive,
            format!("pod {}: no judgement: {}", u.pod, u.why),
        );
    }
    let canary: Vec<&PodAnswer> = judged_answers(round).collect();
    if canary.is_empty() {
        return (Outcome::Inconclusive, "no ready canary pod to probe".into());
    }
    let stable = match stable_reading(round) {
        Ok(stable) => stable,
        Err(why) => return (Outcome::Inconclusive, why),
    };
    let mut passed = None;
    for answer in &canary {
        match &answer.scores {
            Err(why) => {
                return (
                    Outcome::Inconclusive,
                    format!("pod {}: no judgement: {why}", answer.pod),
                );
            }
            Ok(scores) => match judge(gate, set, scores, stable) {
                fail @ Verdict::Fail { .. } => {
                    return (
                        Outcome::Fail,
                        format!("pod {}: {}", answer.pod, fail.message()),
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

/// The canary's probes reading, when its round was carried out: it joins
/// the other analysis readings of the step.
pub fn canary_reading(rounds: &[ProbeRound]) -> Option<Measurement> {
    let round = rounds.iter().find(|r| r.plan.purpose == Purpose::Canary)?;
    let reading = match &round.set {
        Err(why) => Reading::Failed(format!("the probe set cannot be read: {why}")),
        Ok(set) => {
            let (outcome, message) = judge_round(round, set);
            Reading::Judged(outcome, message)
        }
    };
    Some(Measurement {
        name: PROBES.to_owned(),
        reading,
    })
}

/// What the gate's rounds decide: the marks to write on the pods judged,
/// and what to tell of each (figures only).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judgement {
    /// One per pod judged.
    pub marks: Vec<Mark>,
    /// The Events: one per mark, and one per pod or round that judged
    /// nothing.
    pub events: Vec<super::Event>,
}

/// Judges the gate's rounds for the pods of `owner` that still await
/// judgement: a pod with scores gets its mark; a pod without (no probe
/// set, not asked, no answer) stays unjudged, and is told of.
pub fn judge_gate(rounds: &[ProbeRound], pods: &[PodView], owner: &str) -> Judgement {
    let awaits = |name: &str| {
        pods.iter()
            .any(|p| p.name == name && p.owner.as_deref() == Some(owner) && p.awaits_judgement())
    };
    let mut judgement = Judgement::default();
    for round in rounds.iter().filter(|r| r.plan.purpose == Purpose::Gate) {
        let due = round
            .plan
            .requests
            .iter()
            .filter(|r| !r.stable)
            .map(|r| &r.pod);
        let unasked = round.plan.unasked.iter().filter(|u| !u.stable);
        if !due
            .chain(unasked.clone().map(|u| &u.pod))
            .any(|p| awaits(p))
        {
            continue;
        }
        let set = match &round.set {
            // A bound that matches no label refuses the spec
            // ([`unmatched_bounds`]): no pod is judged against it.
            Ok(set) if !unmatched_keys(&round.plan.gate, set).is_empty() => continue,
            Ok(set) => set,
            Err(why) => {
                judgement
                    .events
                    .push(inconclusive(format!("the probe set cannot be read: {why}")));
                continue;
            }
        };
        for u in unasked.filter(|u| awaits(&u.pod)) {
            judgement.events.push(inconclusive(format!(
                "pod {}: no judgement this round: {}",
                u.pod, u.why
            )));
        }
        let stable = stable_reading(round);
        for answer in judged_answers(round).filter(|a| awaits(&a.pod)) {
            let scores = answer
                .scores
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|scores| Ok((scores, stable.clone()?)));
            match scores {
                Err(why) => judgement.events.push(inconclusive(format!(
                    "pod {}: no judgement this round: {why}",
                    answer.pod
                ))),
                Ok((scores, stable)) => {
                    let mark = mark(&answer.pod, &judge(&round.plan.gate, set, scores, stable));
                    judgement.events.push(mark.event());
                    judgement.marks.push(mark);
                }
            }
        }
    }
    judgement
}

/// The `minRecall` keys of `gate` that match no label of `set`, the
/// wildcard aside: `DATES` beside probes labelled `DATE` bounds nothing,
/// and a model that never tags a date would pass.
pub fn unmatched_keys<'g>(gate: &'g QualityGate, set: &ProbeSet) -> Vec<&'g str> {
    let labels = set.labels();
    gate.min_recall
        .keys()
        .filter(|k| k.as_str() != ANY_LABEL && !labels.contains(k))
        .map(String::as_str)
        .collect()
}

/// Why `key` of the gate's `minRecall` bounds nothing in `set`, read from
/// ConfigMap `config_map`.
pub fn unmatched_message(config_map: &str, set: &ProbeSet) -> String {
    format!(
        "matches no label of the probe set (ConfigMap {config_map}: {}), so it bounds nothing; name one of them, or {ANY_LABEL} for every label not named",
        set.labels().join(", ")
    )
}

/// The bounds the rounds' probe sets show to match nothing, as the spec's
/// errors: the spec is refused once a probe set has been read, and no pod
/// is judged against it.
pub fn unmatched_bounds(rounds: &[ProbeRound]) -> Vec<crate::api::FieldError> {
    rounds
        .iter()
        .filter_map(|round| Some((round, round.set.as_ref().ok()?)))
        .flat_map(|(round, set)| {
            let field = match round.plan.purpose {
                Purpose::Gate => "spec.qualityGate.minRecall",
                Purpose::Canary => "spec.canary.analysis.probes.minRecall",
            };
            let config_map = &round.plan.gate.config_map_ref.name;
            unmatched_keys(&round.plan.gate, set)
                .into_iter()
                .map(move |key| crate::api::FieldError {
                    path: format!("{field}.{key}"),
                    message: unmatched_message(config_map, set),
                })
        })
        .collect()
}

fn inconclusive(message: String) -> super::Event {
    super::Event {
        type_: super::EventType::Warning,
        reason: super::reason::QUALITY_GATE_INCONCLUSIVE,
        message,
    }
}

/// Whether a pod of `owner` awaits the gate's judgement, other than
/// those in `judged`: the gate looks again after [`RETRY_SECONDS`].
pub fn awaiting(pods: &[PodView], owner: &str, judged: &[Mark]) -> bool {
    pods.iter().any(|p| {
        p.owner.as_deref() == Some(owner)
            && p.awaits_judgement()
            && !judged.iter().any(|m| m.pod == p.name)
    })
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
            replica_set: Some(format!("svc-{snapshot}")),
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
        let due = gate_due(&gate(&[], false), &pods, "ns/svc");
        let names: Vec<(&str, bool)> = due
            .pods
            .iter()
            .map(|(p, s)| (p.name.as_str(), *s))
            .collect();
        assert_eq!(names, [("new-a", false), ("new-b", false)]);
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
        let due = gate_due(&gate(&[], true), &pods, "ns/svc");
        assert_eq!(due.pods.len(), 2);
        assert_eq!(
            (due.pods[1].0.name.as_str(), due.pods[1].1),
            ("old-a", true)
        );
        assert_eq!(due.stable, Stable::Asked);
        // Nothing to judge: no stable pod either.
        assert!(
            gate_due(&gate(&[], true), &pods[1..], "ns/svc")
                .pods
                .is_empty()
        );
        // The version being replaced runs but no pod of it is ready: no
        // reading of it this round.
        let mut cold = pods[2].clone();
        cold.containers_ready = false;
        let warming = [pods[0].clone(), cold];
        let due = gate_due(&gate(&[], true), &warming, "ns/svc");
        assert_eq!(due.pods.len(), 1);
        assert!(matches!(due.stable, Stable::Missing(_)), "{:?}", due.stable);
        // Nothing of it runs (a first rollout): the bounds alone.
        let due = gate_due(&gate(&[], true), &pods[..1], "ns/svc");
        assert_eq!(due.stable, Stable::NotAsked);
    }

    #[test]
    fn the_version_being_replaced_is_found_by_template_not_by_model() {
        // Adding the gate to a template rolls the same model: the pods of
        // the template before it are the ones to compare with.
        let mut old = pod("old-a", "same", true, None);
        old.gated = false;
        old.replica_set = Some("svc-1".into());
        let mut new = pod("new-a", "same", true, None);
        new.replica_set = Some("svc-2".into());
        let pods = [new, old];
        let due = gate_due(&gate(&[], true), &pods, "ns/svc");
        let names: Vec<(&str, bool)> = due
            .pods
            .iter()
            .map(|(p, s)| (p.name.as_str(), *s))
            .collect();
        assert_eq!(names, [("new-a", false), ("old-a", true)]);
    }

    #[test]
    fn a_bound_on_a_label_the_probe_set_lacks_judges_no_pod() {
        // DATES beside probes labelled DATE bounds nothing: a model that
        // never tags a date would pass.
        let misspelled = gate(&[("DATES", 1.0), ("NAME", 1.0)], false);
        let no_dates = score(&set(), &no_dates()).unwrap();
        let pods = vec![pod("new-a", "new", true, None)];
        let round = round_of(Purpose::Gate, &misspelled, &[("new-a", Ok(no_dates))]);
        let judged = judge_gate(std::slice::from_ref(&round), &pods, "ns/svc");
        assert!(judged.marks.is_empty(), "no mark: {:?}", judged.marks);
        let refused = unmatched_bounds(&[round]);
        assert_eq!(
            refused.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.qualityGate.minRecall.DATES: matches no label of the probe set (ConfigMap probes: DATE, NAME), so it bounds nothing; name one of them, or * for every label not named"
            ]
        );
    }

    #[test]
    fn without_a_reading_of_the_stable_version_not_worse_than_stable_is_inconclusive() {
        let lenient = gate(&[("*", 0.0)], true);
        let bad = score(&set(), &no_dates()).unwrap();
        let pods = vec![pod("new-a", "new", true, None)];
        let no_stable_answer = [
            ("new-a", Ok(bad.clone())),
            ("stable-a", Err("HTTP 503".into())),
        ];
        let round = round_of(Purpose::Gate, &lenient, &no_stable_answer);
        let judged = judge_gate(&[round], &pods, "ns/svc");
        assert!(judged.marks.is_empty(), "no mark: {:?}", judged.marks);
        assert_eq!(
            judged.events[0].message,
            "pod new-a: no judgement this round: no reading of the version being replaced: pod stable-a: HTTP 503"
        );
        assert_eq!(
            judged.events[0].reason,
            super::super::reason::QUALITY_GATE_INCONCLUSIVE
        );
        let round = canary_round(&lenient, &no_stable_answer);
        let Some(Measurement {
            reading: Reading::Judged(outcome, message),
            ..
        }) = canary_reading(&[round])
        else {
            panic!("a judged reading")
        };
        assert_eq!(outcome, Outcome::Inconclusive, "{message}");
        assert_eq!(
            message,
            "no reading of the version being replaced: pod stable-a: HTTP 503"
        );
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
    fn without_an_http_port_the_gate_asks_at_the_port_the_pods_own_probe_uses() {
        let target: Deployment = serde_json::from_value(json!({
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                // No port declared: the readiness probe's.
                {"name": "bare", "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}}},
                // A named probe port, resolved against the container's
                // ports; the startup probe's when readiness is no httpGet.
                {"name": "named", "ports": [{"name": "metrics", "containerPort": 9090}, {"name": "web", "containerPort": 8000}],
                 "readinessProbe": {"exec": {"command": ["true"]}},
                 "startupProbe": {"httpGet": {"path": "/readyz", "port": "web"}}},
                // The liveness probe's, last.
                {"name": "live", "livenessProbe": {"httpGet": {"path": "/livez", "port": 7000}}},
                // A name that resolves to nothing is no port.
                {"name": "unresolved", "readinessProbe": {"httpGet": {"path": "/readyz", "port": "web"}}},
                {"name": "exec", "readinessProbe": {"exec": {"command": ["true"]}}},
            ]}}}
        }))
        .unwrap();
        assert_eq!(service_port(&target, "bare"), Some(8080));
        assert_eq!(service_port(&target, "named"), Some(8000));
        assert_eq!(service_port(&target, "live"), Some(7000));
        assert_eq!(service_port(&target, "unresolved"), None);
        assert_eq!(service_port(&target, "exec"), None);
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
    fn a_canary_round_fails_on_any_pod_that_misses_and_no_answer_is_never_a_pass() {
        let strict = gate(&[("*", 1.0)], false);
        let good = score(&set(), &everything()).unwrap();
        let bad = score(&set(), &no_dates()).unwrap();
        let reading = |answers: &[(&str, Result<Scores, String>)]| {
            let round = canary_round(&strict, answers);
            let Some(Measurement {
                reading: Reading::Judged(outcome, message),
                ..
            }) = canary_reading(&[round])
            else {
                panic!("a canary round is one judged reading")
            };
            (outcome, message)
        };
        let (outcome, message) = reading(&[("canary-a", Ok(good.clone())), ("canary-b", Ok(bad))]);
        assert_eq!(outcome, Outcome::Fail);
        assert!(
            message.starts_with("pod canary-b: DATE recall 0.00 is below 1.00"),
            "{message}"
        );
        let (outcome, message) = reading(&[("canary-a", Ok(good))]);
        assert_eq!(outcome, Outcome::Pass);
        assert!(
            message.starts_with("1 canary pod(s) passed: DATE recall 1.00 (2/2)"),
            "{message}"
        );
        let (outcome, _) = reading(&[("canary-a", Err("HTTP 503".into()))]);
        assert_eq!(outcome, Outcome::Inconclusive, "no answer is never a pass");
        assert_eq!(reading(&[]).0, Outcome::Inconclusive);
    }

    /// A request to `pod` in a round's plan.
    fn request_to(pod: &str, stable: bool) -> PodProbe {
        PodProbe {
            pod: pod.into(),
            url: format!("http://{pod}/pii/extract"),
            host: None,
            version: "OpenMed/v2".into(),
            stable,
        }
    }

    /// A round of `purpose` that asked each pod of `answers` (`stable-*`
    /// pods as the stable side) and got those answers.
    fn round_of(
        purpose: Purpose,
        gate: &QualityGate,
        answers: &[(&str, Result<Scores, String>)],
    ) -> ProbeRound {
        ProbeRound {
            plan: RoundPlan {
                purpose,
                gate: gate.clone(),
                requests: answers
                    .iter()
                    .map(|(pod, _)| request_to(pod, pod.starts_with("stable")))
                    .collect(),
                unasked: Vec::new(),
                stable: if answers.iter().any(|(pod, _)| pod.starts_with("stable")) {
                    Stable::Asked
                } else {
                    Stable::NotAsked
                },
            },
            set: Ok(set()),
            answers: answers
                .iter()
                .map(|(pod, scores)| PodAnswer {
                    pod: (*pod).into(),
                    scores: scores.clone(),
                })
                .collect(),
        }
    }

    fn canary_round(gate: &QualityGate, answers: &[(&str, Result<Scores, String>)]) -> ProbeRound {
        round_of(Purpose::Canary, gate, answers)
    }

    #[test]
    fn the_gates_round_marks_each_pod_that_awaits_judgement_and_tells_of_the_others() {
        let strict = gate(&[("*", 1.0)], false);
        let good = score(&set(), &everything()).unwrap();
        let bad = score(&set(), &no_dates()).unwrap();
        let pods = vec![
            pod("new-a", "new", true, None),
            pod("new-b", "new", true, None),
            pod("new-c", "new", true, None),
            pod("judged", "new", true, Some(true)),
        ];
        let round = round_of(
            Purpose::Gate,
            &strict,
            &[
                ("new-a", Ok(good.clone())),
                ("new-b", Ok(bad)),
                ("new-c", Err("HTTP 503".into())),
                // Judged since it was asked: not judged twice.
                ("judged", Ok(good)),
            ],
        );
        let judged = judge_gate(std::slice::from_ref(&round), &pods, "ns/svc");
        let marks: Vec<(&str, bool)> = judged
            .marks
            .iter()
            .map(|m| (m.pod.as_str(), m.passed))
            .collect();
        assert_eq!(marks, [("new-a", true), ("new-b", false)]);
        let told: Vec<(&str, &str)> = judged
            .events
            .iter()
            .map(|e| (e.reason, e.message.as_str()))
            .collect();
        assert_eq!(
            told,
            [
                (
                    super::super::reason::QUALITY_GATE_PASSED,
                    "pod new-a: passed: DATE recall 1.00 (2/2) precision 1.00, NAME recall 1.00 (2/2) precision 1.00"
                ),
                (
                    super::super::reason::QUALITY_GATE_FAILED,
                    "pod new-b: DATE recall 0.00 is below 1.00 (minRecall): DATE recall 0.00 (0/2), LOCATION precision 0.00, NAME recall 1.00 (2/2) precision 1.00"
                ),
                (
                    super::super::reason::QUALITY_GATE_INCONCLUSIVE,
                    "pod new-c: no judgement this round: HTTP 503"
                ),
            ]
        );
        assert!(awaiting(&pods, "ns/svc", &judged.marks), "new-c waits");
        // A probe set that cannot be read judges nothing, and says so once.
        let mut unread = round;
        unread.set = Err("ConfigMap probes does not exist".into());
        unread.answers.clear();
        let judged = judge_gate(&[unread], &pods, "ns/svc");
        assert!(judged.marks.is_empty());
        assert_eq!(
            judged.events[0].message,
            "the probe set cannot be read: ConfigMap probes does not exist"
        );
        assert_eq!(judged.events.len(), 1);
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
    }
}
