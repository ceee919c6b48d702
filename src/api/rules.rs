//! The value rules of the `OpenMedModel` API, written once.
//!
//! The CRD schema embeds these patterns and bounds (see `types.rs`), and
//! `validate` enforces the same generated schema, so the API server and the
//! offline tools can never disagree about what is valid. The earlier Python
//! operator used the same rules; changing one is a breaking API change.

/// A model family: a letter, then letters, digits, `.`, `_` or `-`, at most 63 characters.
pub const FAMILY_PATTERN: &str = r"^[A-Za-z](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$";

/// A version pointer as the earlier operator accepted it, at most 253
/// characters: the CRD stores what it stored, so a cluster can move
/// between the two. The service loads only model ids (`OpenMed/pii-v2`) or
/// paths in its pod; [`version_refusal`] says which stored values
/// openmed-op will not roll out.
pub const VERSION_PATTERN: &str = r"^[A-Za-z0-9][A-Za-z0-9._:@/+~-]{0,252}$";

/// An RFC 1123 DNS subdomain (names of Deployments and ConfigMaps).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// Maximum length of a DNS subdomain.
pub const DNS_SUBDOMAIN_MAX: usize = 253;

/// An RFC 1123 DNS label (container names).
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// Maximum length of a DNS label.
pub const DNS_LABEL_MAX: usize = 63;

/// The percent form of `maxSurge` / `maxUnavailable`: `0%` to `100%`, no leading zeros.
pub const PERCENT_PATTERN: &str = r"^(100|[1-9]?[0-9])%$";

/// Bounds of `spec.replicas`.
pub const REPLICAS_MIN: i64 = 1;
/// Bounds of `spec.replicas`.
pub const REPLICAS_MAX: i64 = 1000;

/// The longest soak, `rolloutStrategy.soakSeconds`: a week. A longer wait
/// between fleet waves is a person's decision, not a timer's.
pub const SOAK_SECONDS_MAX: i64 = 7 * 24 * 3600;

/// The largest per-pod target of `spec.autoscaling` (`queueDepthPerPod`,
/// `inflightRequestsPerPod`): far above what one pod of the service holds.
pub const AUTOSCALING_TARGET_MAX: i64 = 100_000;

/// The CEL rule (and its message) that keeps an autoscaler's bounds in
/// order: the API server and the HorizontalPodAutoscaler refuse a minimum
/// above the maximum only once the operator writes it.
pub const AUTOSCALING_BOUNDS_RULE: &str = "self.minReplicas <= self.maxReplicas";
/// Message of [`AUTOSCALING_BOUNDS_RULE`].
pub const AUTOSCALING_BOUNDS_MESSAGE: &str = "minReplicas must not exceed maxReplicas";

/// A duration as Kubernetes tools write it: whole numbers with `ms`, `s`,
/// `m` or `h`, e.g. `30s`, `5m`, `1h30m`.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,9}(ms|s|m|h))+$";

/// The longest a webhook may take to answer. Checks are awaited by the
/// reconcile that asked for them, so this bounds how long one resource's
/// webhook can keep a worker from every other resource.
pub const WEBHOOK_TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// The CEL rule (and its message) that keeps a webhook's `timeout` within
/// [`WEBHOOK_TIMEOUT_MAX`].
pub const WEBHOOK_TIMEOUT_RULE: &str =
    "!has(self.timeout) || duration(self.timeout) <= duration('30s')";
/// Message of [`WEBHOOK_TIMEOUT_RULE`].
pub const WEBHOOK_TIMEOUT_MESSAGE: &str = "timeout must be at most 30s";

/// An `http://` or `https://` URL with a host.
pub const HTTP_URL_PATTERN: &str = r"^https?://[^\s/?#]+([/?#]\S*)?$";

/// The CEL rule (and its message) that orders canary steps: mirror steps
/// first (read as weight 0), then weights strictly increasing (sorted, and
/// no weight twice).
pub const STEPS_INCREASING_RULE: &str = "self.map(s, has(s.mirror) || !has(s.weight) ? 0 : s.weight).isSorted() && self.filter(s, has(s.weight)).all(a, self.filter(b, has(b.weight) && b.weight == a.weight).size() == 1)";
/// Message of [`STEPS_INCREASING_RULE`].
pub const STEPS_INCREASING_MESSAGE: &str =
    "mirror steps come first, then step weights strictly increasing";

/// Reads a [`DURATION_PATTERN`] duration; `None` when it does not match.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    if !regex(DURATION_PATTERN).is_match(text) {
        return None;
    }
    let mut millis: u64 = 0;
    let mut number: u64 = 0;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(d) = c.to_digit(10) {
            number = number * 10 + u64::from(d);
            continue;
        }
        let unit = match (c, chars.peek()) {
            ('m', Some('s')) => {
                chars.next();
                1
            }
            ('s', _) => 1_000,
            ('m', _) => 60_000,
            ('h', _) => 3_600_000,
            _ => return None,
        };
        millis = millis.saturating_add(number.saturating_mul(unit));
        number = 0;
    }
    Some(std::time::Duration::from_millis(millis))
}

/// The CEL rule (and its message) that forbids a rolling update that can make no progress.
///
/// `maxSurge` and `maxUnavailable` are int-or-string (`dyn` in CEL), so each is
/// compared with both zero forms; CEL's heterogeneous equality makes the
/// comparison with the other type false rather than an error.
pub const ZERO_ZERO_RULE: &str = "self.type != 'RollingUpdate' || !(has(self.maxSurge) && (self.maxSurge == 0 || self.maxSurge == '0%') && has(self.maxUnavailable) && (self.maxUnavailable == 0 || self.maxUnavailable == '0%'))";
/// Message of [`ZERO_ZERO_RULE`].
pub const ZERO_ZERO_MESSAGE: &str =
    "RollingUpdate cannot set both maxUnavailable and maxSurge to zero";

/// The CEL rule (and its message) that keeps `spec.qualityGate` to the
/// family it can judge.
pub const QUALITY_GATE_FAMILY_RULE: &str = "!has(self.qualityGate) || self.family == 'pii'";
/// Message of [`QUALITY_GATE_FAMILY_RULE`].
pub const QUALITY_GATE_FAMILY_MESSAGE: &str = "the quality gate judges PII models only: it posts its probes to the service's POST /pii/extract and scores the entities found, so it needs family pii";

/// The CEL rule (and its message) that keeps canary probes to the family
/// they can judge.
pub const CANARY_PROBES_FAMILY_RULE: &str = "!(has(self.canary) && has(self.canary.analysis) && has(self.canary.analysis.probes)) || self.family == 'pii'";
/// Message of [`CANARY_PROBES_FAMILY_RULE`].
pub const CANARY_PROBES_FAMILY_MESSAGE: &str = "canary probes judge PII models only: they post to the service's POST /pii/extract and score the entities found, so they need family pii";

/// True when `s` is an RFC 1123 DNS subdomain whose every label has at most 63 characters.
///
/// This is Kubernetes' own rule for object names (`IsDNS1123Subdomain`
/// checks the length and the pattern; the per-label limit is what the
/// earlier operator also required before using a derived ConfigMap name).
pub fn is_dns_subdomain_with_short_labels(s: &str) -> bool {
    is_dns_subdomain(s) && s.split('.').all(|label| label.len() <= DNS_LABEL_MAX)
}

/// True when the OpenMed service reads `version` as a model id: `model` or
/// `org/model`, each part of letters, digits, `.`, `_` and `-` (its own
/// `validate_model_name`). Anything else it accepts only as a path that
/// exists in the pod, and a pod whose pointer it refuses exits at start.
/// A test holds this to the service's function on the same inputs.
pub fn is_service_model_id(version: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    match version.split_once('/') {
        None => part(version),
        Some((org, model)) => part(org) && part(model),
    }
}

/// The characters the earlier operator's version pattern allowed that no
/// model id has (revisions, digests, tags): the service loads such a
/// pointer only as a path inside its pod, which these never are in practice.
pub const REFERENCE_ONLY_VERSION_CHARS: [char; 4] = [':', '@', '+', '~'];

/// Why openmed-op refuses to roll out `version`, when it does: a pointer
/// the earlier operator accepted (and the CRD still stores, for a move
/// between the two) but the OpenMed service would refuse, so every new pod
/// would exit at start. `None` for everything else.
pub fn version_refusal(version: &str) -> Option<String> {
    let found: String = version
        .chars()
        .filter(|c| REFERENCE_ONLY_VERSION_CHARS.contains(c))
        .fold(String::new(), |mut seen, c| {
            if !seen.contains(c) {
                seen.push(c);
            }
            seen
        });
    if found.is_empty() {
        return None;
    }
    let list: Vec<String> = found.chars().map(|c| format!("'{c}'")).collect();
    Some(format!(
        "spec.version {version:?} has {}, which the earlier operator accepted but the OpenMed service does not: it loads a model id `model` or `org/model` (letters, digits, '.', '_', '-'), or a path inside its pod, and every new pod would exit at start. Pin a version by giving it an id of its own (as OpenMed/pii-2026-12-01); nothing is rolled out until spec.version changes",
        list.join(", ")
    ))
}

/// An entity label of a probe set or of `minRecall`, as the service
/// reports labels: letters, digits, `_`, `.`, `-`, at most 63, starting
/// with a letter or digit.
pub fn is_probe_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// True when `s` is an RFC 1123 DNS label (at most 63 characters), the rule
/// for namespace names.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= DNS_LABEL_MAX
        && !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// True when `s` is an RFC 1123 DNS subdomain (at most 253 characters).
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= DNS_SUBDOMAIN_MAX && regex(DNS_SUBDOMAIN_PATTERN).is_match(s)
}

/// Compiled form of one of the patterns above, built once per process.
///
/// Patterns come from this module or from the generated CRD schema, a small
/// fixed set, so each is compiled once and kept for the life of the process.
pub fn regex(pattern: &str) -> &'static regex::Regex {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, &'static regex::Regex>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .expect("regex cache");
    if let Some(re) = cache.get(pattern) {
        return re;
    }
    let re: &'static regex::Regex = Box::leak(Box::new(
        regex::Regex::new(pattern).expect("the API's patterns are valid regular expressions"),
    ));
    cache.insert(pattern.to_owned(), re);
    re
}
