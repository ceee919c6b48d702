//! The one HTTPRoute rule a canary moves traffic on: finding its two
//! backends, reading their weights and the canary's mirror filter, and the
//! JSON Patch that changes them.
//!
//! The patch never rewrites the route. Its `test` operations pin the rule's
//! name, both backend names and the weights the decision was made on, so a
//! route that changed shape or weights since it was read is refused by the
//! API server as a whole (422) instead of being clobbered. A patch that
//! adds, changes or removes the mirror filter pins the whole rule as read:
//! filters are a list, and a position is only safe to write on the list it
//! was computed from.

use serde_json::{Value, json};

use crate::api::{BackendWeights, CanaryStep, StepKind, TrafficRef};

/// Where the two backends sit in the route, and their weights now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slots {
    /// Index of the rule in `spec.rules`.
    pub rule: usize,
    /// The rule's name, when it has one.
    pub rule_name: Option<String>,
    /// Index of the stable backend in the rule's `backendRefs`.
    pub stable: usize,
    /// Index of the canary backend in the rule's `backendRefs`.
    pub canary: usize,
    /// The weights as stored (an absent weight is 1, the API's default).
    pub weights: BackendWeights,
    /// Which of the two weights are written in the route (the API server
    /// always fills them in; a file from Git may leave them out).
    pub explicit: (bool, bool),
    /// The rule's `RequestMirror` filter to the canary backend, if any.
    pub mirror: Option<MirrorFilter>,
    /// The rule as read: a mirror change pins it whole.
    pub rule_value: Value,
}

/// A `RequestMirror` filter of the rule that copies requests to the canary
/// backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirrorFilter {
    /// Index of the filter in the rule's `filters`.
    pub index: usize,
    /// The percent of requests copied (an absent `percent` is 100; a
    /// `fraction` is read as the percent it rounds down to).
    pub percent: i32,
}

/// What the rule does with the traffic: the two weights, and the percent
/// copied to the canary backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The two backend weights.
    pub weights: BackendWeights,
    /// The percent of requests mirrored to the canary backend.
    pub mirror: Option<i32>,
}

impl Slots {
    /// The traffic shape the rule shows.
    pub fn shape(&self) -> Shape {
        Shape {
            weights: self.weights,
            mirror: self.mirror.map(|m| m.percent),
        }
    }
}

/// Finds the rule and the two backends `traffic` names in `route` (an
/// HTTPRoute as JSON, in `namespace`); the error says what is wrong.
pub fn locate(route: &Value, traffic: &TrafficRef, namespace: &str) -> Result<Slots, String> {
    let name = &traffic.http_route;
    let rules = route
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let holds_both = |rule: &Value| {
        backend(rule, &traffic.stable_backend, namespace).is_some()
            && backend(rule, &traffic.canary_backend, namespace).is_some()
    };
    let rule = match &traffic.rule_name {
        Some(wanted) => rules
            .iter()
            .position(|r| r.get("name").and_then(Value::as_str) == Some(wanted))
            .ok_or_else(|| format!("HTTPRoute {name} has no rule named {wanted}"))?,
        None => {
            let candidates: Vec<usize> = (0..rules.len())
                .filter(|&i| holds_both(&rules[i]))
                .collect();
            match candidates.as_slice() {
                [one] => *one,
                [] => {
                    return Err(format!(
                        "no rule of HTTPRoute {name} has both backends {} and {}",
                        traffic.stable_backend, traffic.canary_backend
                    ));
                }
                _ => {
                    return Err(format!(
                        "{} rules of HTTPRoute {name} hold both backends; set spec.canary.trafficRef.ruleName",
                        candidates.len()
                    ));
                }
            }
        }
    };
    let found = &rules[rule];
    let rule_name = found.get("name").and_then(Value::as_str).map(str::to_owned);
    let within = match &rule_name {
        Some(n) => format!("rule {n} of HTTPRoute {name}"),
        None => format!("rule {rule} of HTTPRoute {name}"),
    };
    let (stable, stable_weight) = backend(found, &traffic.stable_backend, namespace)
        .ok_or_else(|| format!("{within} has no backend {}", traffic.stable_backend))?;
    let (canary, canary_weight) = backend(found, &traffic.canary_backend, namespace)
        .ok_or_else(|| format!("{within} has no backend {}", traffic.canary_backend))?;
    let mirrors: Vec<MirrorFilter> = found
        .get("filters")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(index, f)| mirror_to(f, &traffic.canary_backend, namespace, index))
        .collect();
    if mirrors.len() > 1 {
        return Err(format!(
            "{within} has {} RequestMirror filters to {}; at most one",
            mirrors.len(),
            traffic.canary_backend
        ));
    }
    Ok(Slots {
        rule,
        rule_name,
        stable,
        canary,
        weights: BackendWeights {
            stable: stable_weight.unwrap_or(1),
            canary: canary_weight.unwrap_or(1),
        },
        explicit: (stable_weight.is_some(), canary_weight.is_some()),
        mirror: mirrors.first().copied(),
        rule_value: found.clone(),
    })
}

/// The filter at `index`, when it is a `RequestMirror` to the Service
/// `service` in this namespace.
fn mirror_to(filter: &Value, service: &str, namespace: &str, index: usize) -> Option<MirrorFilter> {
    if filter.get("type").and_then(Value::as_str) != Some("RequestMirror") {
        return None;
    }
    let mirror = filter.get("requestMirror")?;
    let target = mirror.get("backendRef")?;
    let field = |key: &str| target.get(key).and_then(Value::as_str);
    let ours = field("name") == Some(service)
        && field("group").is_none_or(str::is_empty)
        && field("kind").is_none_or(|k| k == "Service")
        && field("namespace").is_none_or(|n| n == namespace);
    if !ours {
        return None;
    }
    let percent = match (mirror.get("percent"), mirror.get("fraction")) {
        (Some(p), _) => p.as_i64().unwrap_or(100),
        (None, Some(f)) => {
            let numerator = f.get("numerator").and_then(Value::as_i64).unwrap_or(0);
            let denominator = f.get("denominator").and_then(Value::as_i64).unwrap_or(100);
            if denominator > 0 {
                numerator * 100 / denominator
            } else {
                0
            }
        }
        (None, None) => 100,
    };
    Some(MirrorFilter {
        index,
        percent: percent as i32,
    })
}

/// The index and weight (if written) of the one Service backend called
/// `service` in this namespace; `None` when there is none or more than one.
fn backend(rule: &Value, service: &str, namespace: &str) -> Option<(usize, Option<i32>)> {
    let refs = rule.get("backendRefs")?.as_array()?;
    let mut matching = refs.iter().enumerate().filter(|(_, b)| {
        let field = |key: &str| b.get(key).and_then(Value::as_str);
        field("name") == Some(service)
            && field("group").is_none_or(str::is_empty)
            && field("kind").is_none_or(|k| k == "Service")
            && field("namespace").is_none_or(|n| n == namespace)
    });
    let (index, found) = matching.next()?;
    if matching.next().is_some() {
        return None;
    }
    let weight = found
        .get("weight")
        .and_then(Value::as_i64)
        .map(|w| w as i32);
    Some((index, weight))
}

/// Whether any rule of `route` may still send requests, or copies of
/// them, to the Service `service`: a backend reference to it with a weight
/// other than 0 (absent is 1), or a `RequestMirror` filter to it. When a
/// canary's rule cannot be located any more, this is what says whether its
/// weights may still be on the route.
pub fn sends_to(route: &Value, service: &str, namespace: &str) -> bool {
    let rules = route
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    rules.iter().any(|rule| {
        let weighted = rule
            .get("backendRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|b| {
                let field = |key: &str| b.get(key).and_then(Value::as_str);
                field("name") == Some(service)
                    && field("group").is_none_or(str::is_empty)
                    && field("kind").is_none_or(|k| k == "Service")
                    && field("namespace").is_none_or(|n| n == namespace)
                    && b.get("weight").and_then(Value::as_i64) != Some(0)
            });
        let mirrored = rule
            .get("filters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
            .any(|(index, f)| mirror_to(f, service, namespace, index).is_some());
        weighted || mirrored
    })
}

/// The JSON Patch that moves the rule from the weights it was read with
/// (`slots.weights`) to `next`.
pub fn weight_patch(slots: &Slots, traffic: &TrafficRef, next: BackendWeights) -> Value {
    let rule = format!("/spec/rules/{}", slots.rule);
    let stable = format!("{rule}/backendRefs/{}", slots.stable);
    let canary = format!("{rule}/backendRefs/{}", slots.canary);
    let mut ops = Vec::new();
    if let Some(name) = &slots.rule_name {
        ops.push(json!({"op": "test", "path": format!("{rule}/name"), "value": name}));
    }
    ops.push(
        json!({"op": "test", "path": format!("{stable}/name"), "value": traffic.stable_backend}),
    );
    ops.push(
        json!({"op": "test", "path": format!("{canary}/name"), "value": traffic.canary_backend}),
    );
    if slots.explicit.0 {
        ops.push(json!({"op": "test", "path": format!("{stable}/weight"), "value": slots.weights.stable}));
    }
    if slots.explicit.1 {
        ops.push(json!({"op": "test", "path": format!("{canary}/weight"), "value": slots.weights.canary}));
    }
    // `add` sets a member whether or not it is there.
    ops.push(json!({"op": "add", "path": format!("{stable}/weight"), "value": next.stable}));
    ops.push(json!({"op": "add", "path": format!("{canary}/weight"), "value": next.canary}));
    Value::Array(ops)
}

/// The JSON Patch that moves the rule from the shape it was read with to
/// `next`: [`weight_patch`] when the mirror stays as it is; otherwise the
/// whole rule is pinned, the weights set and the canary's mirror filter
/// added, changed or removed, in one patch.
pub fn shape_patch(slots: &Slots, traffic: &TrafficRef, next: Shape) -> Value {
    if slots.mirror.map(|m| m.percent) == next.mirror {
        return weight_patch(slots, traffic, next.weights);
    }
    let rule = format!("/spec/rules/{}", slots.rule);
    let stable = format!("{rule}/backendRefs/{}", slots.stable);
    let canary = format!("{rule}/backendRefs/{}", slots.canary);
    let mut ops = vec![
        json!({"op": "test", "path": rule, "value": slots.rule_value}),
        json!({"op": "add", "path": format!("{stable}/weight"), "value": next.weights.stable}),
        json!({"op": "add", "path": format!("{canary}/weight"), "value": next.weights.canary}),
    ];
    let filters = format!("{rule}/filters");
    match (slots.mirror, next.mirror) {
        (Some(m), None) => {
            let only = slots.rule_value["filters"]
                .as_array()
                .is_some_and(|f| f.len() == 1);
            // The rule as Git wrote it: no empty list left behind.
            let path = if only {
                filters
            } else {
                format!("{filters}/{}", m.index)
            };
            ops.push(json!({"op": "remove", "path": path}));
        }
        (Some(m), Some(percent)) => {
            let filter = mirror_filter(slots, percent);
            ops.push(
                json!({"op": "replace", "path": format!("{filters}/{}", m.index), "value": filter}),
            );
        }
        (None, Some(percent)) => {
            let filter = mirror_filter(slots, percent);
            if slots.rule_value.get("filters").is_some() {
                ops.push(json!({"op": "add", "path": format!("{filters}/-"), "value": filter}));
            } else {
                ops.push(json!({"op": "add", "path": filters, "value": [filter]}));
            }
        }
        (None, None) => {}
    }
    Value::Array(ops)
}

/// A `RequestMirror` filter copying `percent` of the rule's requests to the
/// canary backend, addressed exactly as the rule's own backendRef (so the
/// admission policy can tell it mirrors only to a backend the rule has).
fn mirror_filter(slots: &Slots, percent: i32) -> Value {
    let canary = &slots.rule_value["backendRefs"][slots.canary];
    let mut target = serde_json::Map::new();
    for key in ["group", "kind", "name", "namespace", "port"] {
        if let Some(v) = canary.get(key) {
            target.insert(key.to_owned(), v.clone());
        }
    }
    json!({"type": "RequestMirror",
           "requestMirror": {"backendRef": Value::Object(target), "percent": percent}})
}

/// The route's shape during `step`, from Git's weights `restore`: a
/// weight step moves the weights, a mirror step keeps Git's weights and
/// adds the mirror.
pub fn step_shape(step: &CanaryStep, restore: BackendWeights) -> Shape {
    match step.kind() {
        StepKind::Weight(w) => Shape {
            weights: step_weights(w),
            mirror: None,
        },
        StepKind::Mirror(p) => Shape {
            weights: restore,
            mirror: Some(p),
        },
    }
}

/// The route as Git has it: its weights, no mirror to the canary.
pub fn at_rest(restore: BackendWeights) -> Shape {
    Shape {
        weights: restore,
        mirror: None,
    }
}

/// The weights of a canary step: the canary gets `weight` percent.
pub fn step_weights(weight: i32) -> BackendWeights {
    BackendWeights {
        stable: 100 - weight,
        canary: weight,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(rule: Option<&str>) -> TrafficRef {
        TrafficRef {
            http_route: "svc".into(),
            rule_name: rule.map(str::to_owned),
            stable_backend: "svc".into(),
            canary_backend: "svc-canary".into(),
        }
    }

    fn route(rules: Value) -> Value {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "svc", "namespace": "ns"}, "spec": {"rules": rules}})
    }

    #[test]
    fn the_rule_holding_both_backends_is_found_without_a_name() {
        let r = route(json!([
            {"backendRefs": [{"name": "docs", "port": 80}]},
            {"backendRefs": [{"name": "svc", "port": 80, "weight": 100},
                             {"name": "svc-canary", "port": 80, "weight": 0}]},
        ]));
        let slots = locate(&r, &traffic(None), "ns").unwrap();
        assert_eq!((slots.rule, slots.stable, slots.canary), (1, 0, 1));
        assert_eq!(
            slots.weights,
            BackendWeights {
                stable: 100,
                canary: 0
            }
        );
    }

    #[test]
    fn an_absent_weight_reads_as_the_apis_default_of_one() {
        let r = route(json!([{"name": "main", "backendRefs": [
            {"name": "svc-canary", "weight": 0}, {"name": "svc"}]}]));
        let slots = locate(&r, &traffic(Some("main")), "ns").unwrap();
        assert_eq!((slots.stable, slots.canary), (1, 0));
        assert_eq!(
            slots.weights,
            BackendWeights {
                stable: 1,
                canary: 0
            }
        );
    }

    #[test]
    fn ambiguous_or_missing_rules_and_backends_are_explained() {
        let both = json!({"backendRefs": [{"name": "svc"}, {"name": "svc-canary"}]});
        let r = route(json!([both, both]));
        let e = locate(&r, &traffic(None), "ns").unwrap_err();
        assert!(e.contains("2 rules") && e.contains("ruleName"), "{e}");
        let e = locate(&r, &traffic(Some("main")), "ns").unwrap_err();
        assert!(e.contains("no rule named main"), "{e}");
        let r = route(json!([{"name": "main", "backendRefs": [{"name": "svc"}]}]));
        let e = locate(&r, &traffic(Some("main")), "ns").unwrap_err();
        assert!(
            e.contains("rule main of HTTPRoute svc has no backend svc-canary"),
            "{e}"
        );
        // A backend in another namespace, or not a Service, is not ours.
        let r = route(json!([{"backendRefs": [
            {"name": "svc"}, {"name": "svc-canary", "namespace": "other"}]}]));
        assert!(locate(&r, &traffic(None), "ns").is_err());
        let r = route(json!([{"backendRefs": [
            {"name": "svc"}, {"name": "svc-canary", "group": "x.io", "kind": "Backend"}]}]));
        assert!(locate(&r, &traffic(None), "ns").is_err());
    }

    #[test]
    fn the_patch_pins_names_and_weights_then_sets_both_weights() {
        let r = route(json!([{"name": "main", "backendRefs": [
            {"name": "svc", "weight": 100}, {"name": "svc-canary", "weight": 0}]}]));
        let t = traffic(Some("main"));
        let slots = locate(&r, &t, "ns").unwrap();
        let patch = weight_patch(&slots, &t, step_weights(10));
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/rules/0/name", "value": "main"},
                {"op": "test", "path": "/spec/rules/0/backendRefs/0/name", "value": "svc"},
                {"op": "test", "path": "/spec/rules/0/backendRefs/1/name", "value": "svc-canary"},
                {"op": "test", "path": "/spec/rules/0/backendRefs/0/weight", "value": 100},
                {"op": "test", "path": "/spec/rules/0/backendRefs/1/weight", "value": 0},
                {"op": "add", "path": "/spec/rules/0/backendRefs/0/weight", "value": 90},
                {"op": "add", "path": "/spec/rules/0/backendRefs/1/weight", "value": 10},
            ])
        );
        // Applied to the route it was made from, it moves only the weights.
        let mut moved = r.clone();
        json_patch::patch(
            &mut moved,
            &serde_json::from_value::<json_patch::Patch>(patch.clone()).unwrap(),
        )
        .unwrap();
        let after = locate(&moved, &t, "ns").unwrap();
        assert_eq!(after.weights, step_weights(10));
        assert_eq!(moved["spec"]["rules"][0]["name"], "main");
        // Applied to a route someone changed meanwhile, it is refused whole.
        let mut changed = r.clone();
        changed["spec"]["rules"][0]["backendRefs"][0]["weight"] = json!(50);
        let before = changed.clone();
        assert!(
            json_patch::patch(
                &mut changed,
                &serde_json::from_value::<json_patch::Patch>(patch).unwrap()
            )
            .is_err()
        );
        assert_eq!(changed, before);
    }

    fn patched(route: &Value, patch: Value) -> Result<Value, String> {
        let mut out = route.clone();
        let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
        json_patch::patch(&mut out, &patch).map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn mirror_step(percent: i32) -> Shape {
        Shape {
            weights: BackendWeights {
                stable: 100,
                canary: 0,
            },
            mirror: Some(percent),
        }
    }

    #[test]
    fn a_mirror_is_added_to_the_canary_backend_and_removed_to_the_rule_as_in_git() {
        let git = route(json!([{"name": "main", "backendRefs": [
            {"name": "svc", "port": 8080, "weight": 100},
            {"name": "svc-canary", "port": 8080, "weight": 0}]}]));
        let t = traffic(Some("main"));
        let slots = locate(&git, &t, "ns").unwrap();
        assert_eq!(slots.mirror, None);
        let mirrored = patched(&git, shape_patch(&slots, &t, mirror_step(50))).unwrap();
        assert_eq!(
            mirrored["spec"]["rules"][0]["filters"],
            json!([{"type": "RequestMirror", "requestMirror": {
                "backendRef": {"name": "svc-canary", "port": 8080}, "percent": 50}}]),
            "addressed as the rule's own backend, with its port"
        );
        let seen = locate(&mirrored, &t, "ns").unwrap();
        assert_eq!(seen.shape(), mirror_step(50));

        // A change of percent, then the first weight step: one patch each.
        let more = patched(&mirrored, shape_patch(&seen, &t, mirror_step(100))).unwrap();
        let seen = locate(&more, &t, "ns").unwrap();
        assert_eq!(seen.mirror.map(|m| m.percent), Some(100));
        let weighted = Shape {
            weights: step_weights(10),
            mirror: None,
        };
        let stepped = patched(&more, shape_patch(&seen, &t, weighted)).unwrap();
        let seen = locate(&stepped, &t, "ns").unwrap();
        assert_eq!(seen.shape(), weighted);
        assert!(
            stepped["spec"]["rules"][0].get("filters").is_none(),
            "no empty list left: {stepped}"
        );
        // Back at rest the route is byte for byte what it was.
        let back = Shape {
            weights: step_weights(0),
            mirror: None,
        };
        assert_eq!(
            patched(&stepped, shape_patch(&seen, &t, back)).unwrap(),
            git
        );
    }

    #[test]
    fn a_mirror_joins_and_leaves_other_filters_untouched() {
        let header = json!({"type": "RequestHeaderModifier",
                            "requestHeaderModifier": {"set": [{"name": "x-a", "value": "1"}]}});
        let git = route(json!([{"name": "main", "filters": [header],
            "backendRefs": [{"name": "svc", "port": 80, "weight": 100},
                            {"name": "svc-canary", "port": 80, "weight": 0}]}]));
        let t = traffic(Some("main"));
        let slots = locate(&git, &t, "ns").unwrap();
        let mirrored = patched(&git, shape_patch(&slots, &t, mirror_step(20))).unwrap();
        let filters = mirrored["spec"]["rules"][0]["filters"].as_array().unwrap();
        assert_eq!((filters.len(), &filters[0]), (2, &header));
        let seen = locate(&mirrored, &t, "ns").unwrap();
        assert_eq!(
            seen.mirror,
            Some(MirrorFilter {
                index: 1,
                percent: 20
            })
        );
        let back = Shape {
            weights: step_weights(0),
            mirror: None,
        };
        assert_eq!(
            patched(&mirrored, shape_patch(&seen, &t, back)).unwrap(),
            git
        );

        // A rule changed since it was read refuses the patch whole: a
        // filter position is only right on the list it was read from.
        let mut changed = mirrored.clone();
        changed["spec"]["rules"][0]["filters"]
            .as_array_mut()
            .unwrap()
            .insert(
                0,
                json!({"type": "URLRewrite", "urlRewrite": {"hostname": "x"}}),
            );
        assert!(patched(&changed, shape_patch(&seen, &t, back)).is_err());
    }

    #[test]
    fn mirrors_elsewhere_are_not_ours_and_two_of_ours_are_refused() {
        let to = |name: &str| {
            json!({"type": "RequestMirror", "requestMirror": {
            "backendRef": {"name": name, "port": 80}, "fraction": {"numerator": 1, "denominator": 4}}})
        };
        let r = route(
            json!([{"name": "main", "filters": [to("audit")], "backendRefs": [
            {"name": "svc"}, {"name": "svc-canary", "weight": 0}]}]),
        );
        let t = traffic(Some("main"));
        assert_eq!(locate(&r, &t, "ns").unwrap().mirror, None);
        let r = route(
            json!([{"name": "main", "filters": [to("audit"), to("svc-canary")],
            "backendRefs": [{"name": "svc"}, {"name": "svc-canary", "weight": 0}]}]),
        );
        assert_eq!(
            locate(&r, &t, "ns").unwrap().mirror,
            Some(MirrorFilter {
                index: 1,
                percent: 25
            }),
            "a fraction reads as its percent"
        );
        let r = route(
            json!([{"name": "main", "filters": [to("svc-canary"), to("svc-canary")],
            "backendRefs": [{"name": "svc"}, {"name": "svc-canary", "weight": 0}]}]),
        );
        let e = locate(&r, &t, "ns").unwrap_err();
        assert!(e.contains("2 RequestMirror filters to svc-canary"), "{e}");
    }
}
