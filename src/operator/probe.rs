//! Runs the canary checks `decide` asks for: PromQL instant queries against
//! the Prometheus HTTP API, and webhook POSTs. Every problem becomes a
//! reading (`Failed`), never an error of the reconcile: `decide` treats it
//! as no data, which holds the step.

use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;

use crate::rollout::analysis::{Check, Measurement, Reading};

/// How long a Prometheus query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP client for checks.
#[derive(Clone)]
pub struct Prober {
    client: reqwest::Client,
}

impl Prober {
    /// A client with the platform's trust roots and short timeouts.
    pub fn new() -> Self {
        // kube and this client share the process-wide rustls provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("openmed-operator/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client with the default settings builds");
        Prober { client }
    }

    /// Runs every check at once and returns their readings in order.
    pub async fn measure(&self, checks: &[Check]) -> Vec<Measurement> {
        join_all(checks.iter().map(|check| async move {
            let reading = match check {
                Check::Prometheus { address, query, .. } => self.query(address, query).await,
                Check::Webhook {
                    url, timeout, body, ..
                } => self.post(url, *timeout, body).await,
            };
            Measurement {
                name: check.name().to_owned(),
                reading,
            }
        }))
        .await
    }

    async fn query(&self, address: &str, query: &str) -> Reading {
        let url = format!("{}/api/v1/query", address.trim_end_matches('/'));
        let sent = self
            .client
            .get(&url)
            .query(&[("query", query)])
            .timeout(QUERY_TIMEOUT)
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(e) => return Reading::Failed(format!("Prometheus at {address}: {e}")),
        };
        let status = answer.status();
        match answer.json::<Value>().await {
            Ok(body) => prometheus_reading(&body),
            Err(_) => Reading::Failed(format!("Prometheus at {address} answered {status}")),
        }
    }

    async fn post(&self, url: &str, timeout: Duration, body: &Value) -> Reading {
        match self
            .client
            .post(url)
            .json(body)
            .timeout(timeout)
            .send()
            .await
        {
            Ok(answer) => Reading::Answer(answer.status().as_u16()),
            Err(e) if e.is_timeout() => Reading::Failed(format!("no answer within {timeout:?}")),
            Err(e) => Reading::Failed(e.to_string()),
        }
    }
}

impl Default for Prober {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads an instant query's answer: one sample, none, several, or why not.
pub fn prometheus_reading(body: &Value) -> Reading {
    if body.get("status").and_then(Value::as_str) != Some("success") {
        let kind = body
            .get("errorType")
            .and_then(Value::as_str)
            .unwrap_or("error");
        let error = body
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        return Reading::Failed(format!("Prometheus: {kind}: {error}"));
    }
    let data = body.get("data").cloned().unwrap_or_default();
    let result = data.get("result").cloned().unwrap_or_default();
    let sample = |pair: &Value| {
        pair.get(1)
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<f64>().ok())
    };
    match data.get("resultType").and_then(Value::as_str) {
        Some("scalar") => sample(&result).map_or_else(
            || Reading::Failed("Prometheus: a scalar without a value".into()),
            Reading::Sample,
        ),
        Some("vector") => match result.as_array().map(Vec::as_slice).unwrap_or_default() {
            [] => Reading::NoData,
            [one] => one.get("value").and_then(sample).map_or_else(
                || Reading::Failed("Prometheus: a sample without a value".into()),
                Reading::Sample,
            ),
            several => Reading::Several(several.len()),
        },
        other => Reading::Failed(format!(
            "Prometheus: a {} result; the query must return one sample",
            other.unwrap_or("missing")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vector(samples: &[&str]) -> Value {
        let result: Vec<Value> = samples
            .iter()
            .map(|v| json!({"metric": {}, "value": [1700000000.0, v]}))
            .collect();
        json!({"status": "success", "data": {"resultType": "vector", "result": result}})
    }

    #[test]
    fn answers_read_as_samples_no_data_or_failures() {
        assert_eq!(
            prometheus_reading(&vector(&["0.25"])),
            Reading::Sample(0.25)
        );
        assert_eq!(prometheus_reading(&vector(&[])), Reading::NoData);
        assert_eq!(
            prometheus_reading(&vector(&["1", "2"])),
            Reading::Several(2)
        );
        let Reading::Sample(nan) = prometheus_reading(&vector(&["NaN"])) else {
            panic!("NaN is a sample")
        };
        assert!(nan.is_nan());
        assert_eq!(
            prometheus_reading(&vector(&["+Inf"])),
            Reading::Sample(f64::INFINITY)
        );
        assert_eq!(
            prometheus_reading(
                &json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}})
            ),
            Reading::Sample(3.0)
        );
        let Reading::Failed(why) = prometheus_reading(
            &json!({"status": "error", "errorType": "bad_data", "error": "parse error"}),
        ) else {
            panic!("an error is a failed reading")
        };
        assert_eq!(why, "Prometheus: bad_data: parse error");
        assert!(matches!(
            prometheus_reading(
                &json!({"status": "success", "data": {"resultType": "matrix", "result": []}})
            ),
            Reading::Failed(_)
        ));
    }
}
