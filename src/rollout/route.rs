//! The one HTTPRoute rule a canary moves traffic on: finding its two
//! backends, reading their weights, and the JSON Patch that changes them.
//!
//! The patch never rewrites the route. Its `test` operations pin the rule's
//! name, both backend names and the weights the decision was made on, so a
//! route that changed shape or weights since it was read is refused by the
//! API server as a whole (422) instead of being clobbered.

use serde_json::{Value, json};

use crate::api::{BackendWeights, TrafficRef};

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
}
