//! The operator running in the pods of an install (the Helm chart's, the
//! kustomize install's). The test kubelet runs the image the README's
//! install names as the operator's binary, with the pod's arguments, its
//! ServiceAccount's token and nothing else; these helpers read what those
//! pods do: which run and are Ready, who leads, what each logged last.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::support::*;

/// The image README's install names, without its tag.
pub const IMAGE: &str = "registry.example/openmed-op";

/// How long the operator's pods get to roll (two replicas, one at a time).
const POD_ROLLOUT: Duration = Duration::from_secs(120);

/// What the image runs: the binary under test, or with
/// `OPERATOR_IMAGE_BINARY=$(deploy/image/build-binary)` the static one the
/// image ships (a release build for musl, about 10 minutes from nothing,
/// so not in CI).
pub fn image_binary() -> String {
    std::env::var("OPERATOR_IMAGE_BINARY").unwrap_or_else(|_| binary().to_owned())
}

/// Maps [`IMAGE`], any tag, to [`image_binary`] in the test kubelet's image
/// map, under `owner`'s key: the image's entrypoint with `run` as its
/// default arguments, as `deploy/Dockerfile` builds it.
pub async fn map_operator_image(client: &Client, owner: &str) {
    set_image_map(
        client,
        owner,
        &json!({IMAGE: {"entrypoint": [image_binary()], "cmd": ["run"]}}),
    )
    .await;
}

/// The operator pods of one install: its Deployment (and Lease) `name` in
/// `namespace`, its pods found by `selector`.
pub struct OperatorPods {
    deployments: Api<Deployment>,
    pods: Api<Pod>,
    leases: Api<Lease>,
    namespace: String,
    name: String,
    selector: String,
}

impl OperatorPods {
    pub fn new(client: &Client, namespace: &str, name: &str, selector: &str) -> Self {
        OperatorPods {
            deployments: Api::namespaced(client.clone(), namespace),
            pods: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client.clone(), namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            selector: selector.to_owned(),
        }
    }

    /// The image the install's Deployment runs, as the API server holds it.
    pub async fn image(&self) -> String {
        let deployment = self.deployments.get(&self.name).await.unwrap();
        deployment.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap_or_default()
    }

    pub async fn list(&self) -> Vec<Pod> {
        self.pods
            .list(&ListParams::default().labels(&self.selector))
            .await
            .unwrap()
            .items
    }

    /// Waits until the pods are `count`, each running image tag `tag` and
    /// Ready (a pod of another tag still terminating counts against it);
    /// returns their names.
    pub async fn wait_ready(&self, tag: &str, count: usize) -> Vec<String> {
        let image = format!("{IMAGE}:{tag}");
        wait_until(
            &format!("{count} operator pods on {image}, Ready"),
            POD_ROLLOUT,
            || self.list(),
            |items| {
                items.len() == count
                    && items.iter().all(|p| {
                        let ready = p.status.as_ref().is_some_and(|s| {
                            s.conditions
                                .iter()
                                .flatten()
                                .any(|c| c.type_ == "Ready" && c.status == "True")
                        });
                        let spec_image =
                            p.spec.as_ref().and_then(|s| s.containers[0].image.clone());
                        ready && spec_image.as_deref() == Some(image.as_str())
                    })
            },
        )
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect()
    }

    /// Waits until no pod of the install is left.
    pub async fn wait_gone(&self) {
        wait_for("the operator's pods to be gone", POD_ROLLOUT, || async {
            self.list().await.is_empty().then_some(())
        })
        .await;
    }

    /// Waits until one of `pods` holds the Lease; returns the holder.
    pub async fn wait_led_by_one_of(&self, pods: &[String]) -> String {
        wait_for(
            &format!("one of {pods:?} to hold the Lease {}", self.name),
            POD_ROLLOUT,
            || async {
                let holder = self.leases.get_opt(&self.name).await.ok()??;
                let holder = holder.spec?.holder_identity?;
                pods.iter()
                    .any(|pod| holder.starts_with(pod.as_str()))
                    .then_some(holder)
            },
        )
        .await
    }

    /// Where the test kubelet keeps the pods' logs (for a timeout's
    /// message).
    pub fn log_hint(&self) -> String {
        format!(
            "{}/kubelet/pods/{}_{}-*/operator/",
            cluster_dir().display(),
            self.namespace,
            self.name
        )
    }

    /// The log of the last run of pod `pod`'s operator container.
    pub fn last_log(&self, pod: &str) -> String {
        let prefix = format!("{}_{pod}_", self.namespace);
        let pods = cluster_dir().join("kubelet/pods");
        let dir = std::fs::read_dir(&pods)
            .unwrap()
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .unwrap_or_else(|| panic!("no log folder {prefix}* in {}", pods.display()))
            .path()
            .join("operator");
        let last = (0..)
            .map(|restart| dir.join(format!("{restart}.log")))
            .take_while(|path| path.exists())
            .last()
            .unwrap_or_else(|| panic!("no log in {}", dir.display()));
        std::fs::read_to_string(last).unwrap()
    }

    /// Asserts that each of `pods` logged `stopped` last: a clean stop.
    pub fn assert_stopped_cleanly(&self, pods: &[String]) {
        for pod in pods {
            let log = self.last_log(pod);
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            assert!(
                log.contains("\"stopped\""),
                "operator pod {pod} stopped cleanly; its log ends:\n{tail}"
            );
        }
    }
}
