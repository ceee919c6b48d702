//! `render --canary`: what a version change of each resource with a
//! canary will do to its HTTPRoute, step by step, and how long it can take.
//!
//! Each step's JSON Patch is the exact one the operator sends, computed
//! from the route in the input (its weights in Git are where the canary
//! starts and ends).

use serde::Serialize;
use serde_json::Value;

use crate::api::Canary;
use crate::api::rules::parse_duration;
use crate::manifests::Model;
use crate::rollout::route;
use crate::source::Document;

/// One resource's canary, as `render --canary` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CanaryReport {
    /// `<namespace>/<name>` of the OpenMedModel.
    pub resource: String,
    /// The version a change to this spec tries.
    pub version: String,
    /// `<deployment>/<container>` of the canary.
    pub canary_deployment: String,
    /// The HTTPRoute.
    pub http_route: String,
    /// The steps, in order.
    pub steps: Vec<StepReport>,
    /// The patch that puts Git's weights back and removes the mirror after
    /// the last step (or an abort from it); absent when the route is not in
    /// the input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<Value>,
    /// How long the canary can take when every check answers, in seconds;
    /// absent when a step waits for a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_case_seconds: Option<u64>,
    /// The same, for a person, with what can hold it longer.
    pub worst_case: String,
}

/// One step of a canary.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepReport {
    /// The canary's share of the traffic, in percent (0 in a mirror step).
    pub weight: i32,
    /// In a mirror step, the percent of requests copied to the canary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror: Option<i32>,
    /// How long it holds, or `until promoted`.
    pub pause: String,
    /// The JSON Patch that moves the route to this step; absent when the
    /// route is not in the input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<Value>,
}

/// The report of one model with a canary.
pub fn report(model: &Model, docs: &[Document]) -> Option<CanaryReport> {
    let canary = model.canary.as_ref()?;
    let spec = &canary.spec;
    let traffic = &spec.traffic_ref;
    let git = canary.route_doc.map(|r| &docs[r].value);
    let slots = git.and_then(|r| route::locate(r, traffic, &model.id.namespace).ok());
    let restore = slots.as_ref().map_or(route::step_weights(0), |s| s.weights);
    let at_rest = route::at_rest(restore);
    let mut steps = Vec::new();
    // The route as each patch leaves it: the next patch is computed from it,
    // as the operator computes it from the route it reads.
    let mut current = git.cloned().zip(slots.clone());
    for step in &spec.steps {
        let next = route::step_shape(step, restore);
        let patch = current
            .as_ref()
            .map(|(_, from)| route::shape_patch(from, traffic, next));
        current = current
            .zip(patch.clone())
            .and_then(|((r, _), p)| patched(r, &p, traffic, &model.id.namespace));
        steps.push(StepReport {
            weight: step.weight(),
            mirror: step.mirror,
            pause: step
                .pause
                .clone()
                .unwrap_or_else(|| "until promoted".into()),
            patch,
        });
    }
    let restore = current.map(|(_, last)| route::shape_patch(&last, traffic, at_rest));
    let deadline = u64::try_from(
        model
            .plan
            .normalized
            .rollout_strategy
            .progress_deadline_seconds,
    )
    .unwrap_or(0);
    let (worst_case_seconds, worst_case) = worst_case(spec, deadline);
    Some(CanaryReport {
        resource: model.id.key(),
        version: model.plan.normalized.version.clone(),
        canary_deployment: format!(
            "{}/{}",
            canary.plan.deployment.name, canary.plan.deployment.container
        ),
        http_route: traffic.http_route.clone(),
        steps,
        restore,
        worst_case_seconds,
        worst_case,
    })
}

/// The route after a step's patch, and its rule found again.
fn patched(
    mut route: Value,
    patch: &Value,
    traffic: &crate::api::TrafficRef,
    namespace: &str,
) -> Option<(Value, route::Slots)> {
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).ok()?;
    json_patch::patch(&mut route, &patch).ok()?;
    let slots = route::locate(&route, traffic, namespace).ok()?;
    Some((route, slots))
}

/// Warm-up (at most the progress deadline), every step's pause and one
/// analysis interval after it (the passing round), then the stable
/// rollout (at most the deadline again).
fn worst_case(spec: &Canary, deadline: u64) -> (Option<u64>, String) {
    let interval = spec.analysis.as_ref().map_or(0, |a| {
        parse_duration(&a.interval).map_or(0, |d| d.as_secs())
    });
    let mut total = 2 * deadline;
    let mut manual = Vec::new();
    for (i, step) in spec.steps.iter().enumerate() {
        match step.pause.as_deref().and_then(parse_duration) {
            Some(p) => total += p.as_secs() + interval,
            None => manual.push((i + 1).to_string()),
        }
    }
    let mut text = format!(
        "{} when every check answers (warm-up and the stable rollout at most {deadline}s each)",
        human(total)
    );
    if spec.analysis.is_some() {
        text.push_str("; a check with no data holds its step until data comes or someone acts");
    }
    if manual.is_empty() {
        (Some(total), text)
    } else {
        let s = if manual.len() == 1 { "" } else { "s" };
        (
            None,
            format!(
                "no bound: step{s} {} wait{} for a promote; otherwise {text}",
                manual.join(", "),
                if manual.len() == 1 { "s" } else { "" }
            ),
        )
    }
}

/// `1h2m3s`, `5m`, `40s`.
fn human(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(human(0), "0s");
        assert_eq!(human(90), "1m30s");
        assert_eq!(human(3600), "1h");
        assert_eq!(human(3723), "1h2m3s");
    }
}
