//! Prometheus metrics, named in the style of controller-runtime so existing
//! dashboards and alerts apply. The operator's own counters have bounded
//! labels: results, outcomes and error categories, never object names. The
//! two state gauges (`openmed_model_phase`, `openmed_model_canary_state`)
//! are the exception an alert needs to name its model: read from the
//! watch cache at each scrape, one series per OpenMedModel (as
//! kube-state-metrics reports objects), gone with the resource.

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::rollout::{Event, reason};

const CONTROLLER: &str = "openmedmodel";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: &'static str,
    category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RollbackLabels {
    trigger: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    resource: &'static str,
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    namespace: String,
    name: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CanaryLabels {
    namespace: String,
    name: String,
    state: String,
}

/// One OpenMedModel as a scrape reports it: where it stands by its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelState {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `status.phase`, when set.
    pub phase: Option<String>,
    /// `status.canary.state`, when a canary ran or runs.
    pub canary: Option<String>,
}

type ModelSource = Box<dyn Fn() -> Vec<ModelState> + Send + Sync>;

/// The per-model state gauges, from a source the operator sets once its
/// cache exists.
#[derive(Clone, Default)]
struct ModelStates(Arc<OnceLock<ModelSource>>);

impl std::fmt::Debug for ModelStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelStates")
    }
}

impl Collector for ModelStates {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let states = self.0.get().map(|source| source()).unwrap_or_default();
        let one = ConstGauge::new(1i64);
        {
            let mut family = encoder.encode_descriptor(
                "openmed_model_phase",
                "1 for each OpenMedModel at its status.phase (Pending, RollingOut, Canary, Ready, RolledBack, Failed)",
                None,
                one.metric_type(),
            )?;
            for s in &states {
                if let Some(phase) = &s.phase {
                    let labels = ModelLabels {
                        namespace: s.namespace.clone(),
                        name: s.name.clone(),
                        phase: phase.clone(),
                    };
                    one.encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "openmed_model_canary_state",
            "1 for each OpenMedModel with a canary at its status.canary.state (Warming, Progressing, Paused, Promoting, Promoted, Aborted)",
            None,
            one.metric_type(),
        )?;
        for s in &states {
            if let Some(state) = &s.canary {
                let labels = CanaryLabels {
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    state: state.clone(),
                };
                one.encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Every metric the operator exports.
pub struct Metrics {
    models: ModelStates,
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Histogram,
    rollouts: Family<OutcomeLabels, Counter>,
    rollbacks: Family<RollbackLabels, Counter>,
    writes: Family<WriteLabels, Counter>,
    drift: Counter,
    skipped: Counter,
    canaries: Family<OutcomeLabels, Counter>,
    analysis_failures: Counter,
    route_drift: Counter,
    quality_probes: Family<OutcomeLabels, Counter>,
    quality_marks: Family<OutcomeLabels, Counter>,
    bodies_cut: Family<SourceLabels, Counter>,
    active: Gauge<i64, AtomicI64>,
    backoff: Gauge<i64, AtomicI64>,
    failing_watches: Gauge<i64, AtomicI64>,
    leader: Family<LeaseLabels, Gauge<i64, AtomicI64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let models = ModelStates::default();
        registry.register_collector(Box::new(models.clone()));
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        let rollouts = Family::<OutcomeLabels, Counter>::default();
        let rollbacks = Family::<RollbackLabels, Counter>::default();
        let writes = Family::<WriteLabels, Counter>::default();
        let drift = Counter::default();
        let skipped = Counter::default();
        let canaries = Family::<OutcomeLabels, Counter>::default();
        let analysis_failures = Counter::default();
        let route_drift = Counter::default();
        let quality_probes = Family::<OutcomeLabels, Counter>::default();
        let quality_marks = Family::<OutcomeLabels, Counter>::default();
        let bodies_cut = Family::<SourceLabels, Counter>::default();
        registry.register(
            "openmed_operator_response_bodies_cut",
            "Answers whose body the operator stopped reading, too long or too slow, and read as no data, by source (prometheus, pod)",
            bodies_cut.clone(),
        );
        registry.register(
            "openmed_quality_probe_requests",
            "Requests the quality gate sent to pods, by outcome (answered, failed)",
            quality_probes.clone(),
        );
        registry.register(
            "openmed_quality_gate_pods",
            "Pods the quality gate judged, by outcome (passed, failed, inconclusive)",
            quality_marks.clone(),
        );
        registry.register(
            "openmed_canaries",
            "Canaries, by outcome (started, promoted, aborted)",
            canaries.clone(),
        );
        registry.register(
            "openmed_canary_analysis_failures",
            "Canary analysis rounds with a failed check",
            analysis_failures.clone(),
        );
        registry.register(
            "openmed_canary_route_drift",
            "Times a canary paused because another writer changed its weights",
            route_drift.clone(),
        );
        let active = Gauge::<i64, AtomicI64>::default();
        let backoff = Gauge::<i64, AtomicI64>::default();
        let failing_watches = Gauge::<i64, AtomicI64>::default();
        let leader = Family::<LeaseLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "leader_election_master_status",
            "1 while this instance holds the leader Lease (or runs without leader election), else 0",
            leader.clone(),
        );
        registry.register(
            "openmed_operator_resources_in_backoff",
            "OpenMedModels whose last reconcile failed and that wait to be retried",
            backoff.clone(),
        );
        registry.register(
            "openmed_operator_failing_watches",
            "Watches whose last attempt failed (readiness fails when one fails for over 60 s)",
            failing_watches.clone(),
        );
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller, by result",
            reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller, by category",
            errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation",
            duration.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of reconciliations running now",
            active.clone(),
        );
        registry.register(
            "openmed_rollouts",
            "Model rollouts, by outcome",
            rollouts.clone(),
        );
        registry.register(
            "openmed_rollbacks",
            "Model rollbacks, by trigger (automatic, manual) and outcome",
            rollbacks.clone(),
        );
        registry.register(
            "openmed_operator_writes",
            "Write requests the operator sent, by resource and verb",
            writes.clone(),
        );
        registry.register(
            "openmed_drift_corrections",
            "Owned fields restored after another writer changed them",
            drift.clone(),
        );
        registry.register(
            "openmed_operator_resyncs_skipped",
            "Resyncs of a resource at rest that decided nothing again: no input changed since a decision that wrote nothing",
            skipped.clone(),
        );
        Metrics {
            models,
            registry,
            reconciles,
            errors,
            duration,
            rollouts,
            rollbacks,
            writes,
            drift,
            skipped,
            canaries,
            analysis_failures,
            route_drift,
            quality_probes,
            quality_marks,
            bodies_cut,
            active,
            backoff,
            failing_watches,
            leader,
        }
    }
}

impl Metrics {
    /// Sets how many resources wait in backoff after a failure.
    pub fn in_backoff(&self, n: usize) {
        self.backoff.set(n as i64);
    }

    /// Sets how many watches are failing now.
    pub fn watches_failing(&self, n: usize) {
        self.failing_watches.set(n as i64);
    }

    /// Whether this instance leads, for the Lease `name`.
    pub fn leading(&self, name: &str, leads: bool) {
        self.leader
            .get_or_create(&LeaseLabels {
                name: name.to_owned(),
            })
            .set(i64::from(leads));
    }

    /// Counts one finished reconcile.
    pub fn reconciled(&self, result: &'static str, took: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: CONTROLLER,
                result,
            })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Counts one resync skipped because its resource is at rest.
    pub fn resync_skipped(&self) {
        self.skipped.inc();
    }

    /// Counts one failed reconcile.
    pub fn failed(&self, category: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels {
                controller: CONTROLLER,
                category,
            })
            .inc();
    }

    /// Counts the quality gate's requests to one pod: `answered` got a
    /// usable answer, `failed` did not.
    pub fn quality_probes(&self, answered: u64, failed: u64) {
        for (outcome, n) in [("answered", answered), ("failed", failed)] {
            if n > 0 {
                self.quality_probes
                    .get_or_create(&OutcomeLabels { outcome })
                    .inc_by(n);
            }
        }
    }

    /// Counts one pod judged (`passed`, `failed`) or not (`inconclusive`),
    /// as the gate's Events tell it.
    fn quality_judged(&self, outcome: &'static str) {
        self.quality_marks
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Counts one answer whose body was cut, by where it came from (a
    /// fixed name per kind of endpoint, so the label stays bounded).
    pub fn body_cut(&self, source: &'static str) {
        self.bodies_cut
            .get_or_create(&SourceLabels { source })
            .inc();
    }

    /// Counts one write request.
    pub fn wrote(&self, resource: &'static str, verb: &'static str) {
        self.writes
            .get_or_create(&WriteLabels { resource, verb })
            .inc();
    }

    /// A reconcile started; the guard marks its end.
    pub fn worker(&self) -> impl Drop + '_ {
        self.active.inc();
        WorkerGuard(&self.active)
    }

    /// Rollout and rollback counters follow the events `decide` emits, so
    /// metrics and events always tell the same story.
    pub fn observe_event(&self, event: &Event, rollback_request: Option<&str>) {
        let trigger = match rollback_request {
            Some(r) if r.starts_with("manual:") => "manual",
            _ => "automatic",
        };
        let rollout = |outcome| {
            self.rollouts
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
        };
        let rollback = |trigger, outcome| {
            self.rollbacks
                .get_or_create(&RollbackLabels { trigger, outcome })
                .inc();
        };
        match event.reason {
            reason::ROLLOUT_STARTED => rollout("started"),
            reason::ROLLOUT_SUCCEEDED => rollout("succeeded"),
            reason::ROLLOUT_FAILED => rollout("failed"),
            reason::ROLLBACK_STARTED => rollback(trigger, "started"),
            reason::ROLLBACK_SUCCEEDED => rollback(trigger, "succeeded"),
            reason::ROLLBACK_FAILED => rollback(trigger, "failed"),
            reason::ROLLBACK_REJECTED => rollback("manual", "rejected"),
            reason::DRIFT_CORRECTED => {
                self.drift.inc();
            }
            reason::CANARY_STARTED | reason::CANARY_PROMOTED | reason::CANARY_ABORTED => {
                let outcome = match event.reason {
                    reason::CANARY_STARTED => "started",
                    reason::CANARY_PROMOTED => "promoted",
                    _ => "aborted",
                };
                self.canaries
                    .get_or_create(&OutcomeLabels { outcome })
                    .inc();
            }
            reason::ANALYSIS_FAILED => {
                self.analysis_failures.inc();
            }
            reason::ROUTE_DRIFT => {
                self.route_drift.inc();
            }
            reason::QUALITY_GATE_PASSED => self.quality_judged("passed"),
            reason::QUALITY_GATE_FAILED => self.quality_judged("failed"),
            reason::QUALITY_GATE_INCONCLUSIVE => self.quality_judged("inconclusive"),
            _ => {}
        }
    }

    /// Where the per-model state gauges come from: called at each scrape.
    /// Set once; a second source is ignored.
    pub fn report_models(&self, source: impl Fn() -> Vec<ModelState> + Send + Sync + 'static) {
        let _ = self.models.0.set(Box::new(source));
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("metrics encode");
        out
    }
}

struct WorkerGuard<'a>(&'a Gauge<i64, AtomicI64>);

impl Drop for WorkerGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The series names the operator exports: every `# TYPE` family, with
    /// the suffixes the exposition adds to counters and histograms.
    fn exported() -> BTreeSet<String> {
        // A labelled family shows in the exposition once it has a series:
        // give every one a series, as the operator's work does.
        let metrics = Metrics::default();
        metrics.leading("openmed-operator", true);
        metrics.reconciled("success", Duration::from_millis(3));
        metrics.failed("conflict");
        metrics.wrote("deployments", "patch");
        for why in [
            reason::ROLLOUT_STARTED,
            reason::ROLLBACK_STARTED,
            reason::CANARY_STARTED,
        ] {
            let event = Event {
                type_: crate::rollout::EventType::Normal,
                reason: why,
                message: String::new(),
            };
            metrics.observe_event(&event, None);
        }
        let text = metrics.encode();
        let mut names = BTreeSet::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    names.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_owned());
                }
            }
        }
        names
    }

    /// Metric names in PromQL text: identifiers directly followed by `{`
    /// (every query of the bundle selects by label).
    fn referenced(text: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let bytes = text.as_bytes();
        for (i, _) in text.match_indices('{') {
            let start = text[..i]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(0, |p| p + 1);
            let name = &text[start..i];
            if !name.is_empty() && bytes[start].is_ascii_alphabetic() {
                names.insert(name.to_owned());
            }
        }
        names
    }

    #[test]
    fn each_model_is_one_series_at_its_phase_and_canary_state_read_at_the_scrape() {
        let metrics = Metrics::default();
        let models = std::sync::Arc::new(std::sync::Mutex::new(vec![
            ModelState {
                namespace: "ward".into(),
                name: "deid".into(),
                phase: Some("RolledBack".into()),
                canary: Some("Aborted".into()),
            },
            ModelState {
                namespace: "lab".into(),
                name: "new".into(),
                phase: None,
                canary: None,
            },
        ]));
        metrics.report_models({
            let models = models.clone();
            move || models.lock().unwrap().clone()
        });
        let text = metrics.encode();
        let series = |prefix: &str| {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            series("openmed_model_phase{"),
            [r#"openmed_model_phase{namespace="ward",name="deid",phase="RolledBack"} 1"#],
            "{text}"
        );
        assert_eq!(
            series("openmed_model_canary_state{"),
            [r#"openmed_model_canary_state{namespace="ward",name="deid",state="Aborted"} 1"#]
        );
        // The next scrape reads the cache again: a resource gone is gone.
        models.lock().unwrap().clear();
        let text = metrics.encode();
        assert!(!text.contains("openmed_model_phase{"), "{text}");
        assert!(text.contains("# TYPE openmed_model_phase gauge"), "{text}");
    }

    #[test]
    fn the_monitoring_bundle_reads_only_exported_metrics() {
        let exported = exported();
        assert!(exported.contains("openmed_rollbacks_total"), "{exported:?}");
        assert!(exported.contains("controller_runtime_reconcile_time_seconds_bucket"));
        for (file, text) in [
            (
                "deploy/monitoring/prometheusrule.yaml",
                include_str!("../../deploy/monitoring/prometheusrule.yaml"),
            ),
            (
                "deploy/monitoring/dashboard.json",
                include_str!("../../deploy/monitoring/dashboard.json"),
            ),
        ] {
            let used = referenced(text);
            assert!(used.len() >= 5, "{file}: {used:?}");
            for name in used {
                // `up` is Prometheus's own; label maps in JSON and YAML
                // (exp_labels, matchLabels) are not queries.
                if name == "up" || !name.contains('_') {
                    continue;
                }
                assert!(
                    exported.contains(&name),
                    "{file} reads {name}, which the operator does not export"
                );
            }
        }
    }
}
