//! Leader election on a `coordination.k8s.io/v1` Lease, with the meaning of
//! kube-controller-manager's `--leader-elect-*` flags, and the fence that
//! keeps a deposed leader from writing.
//!
//! Every instance watches and caches; only the holder of the Lease
//! reconciles. Expiry is judged on the local monotonic clock from when this
//! instance last saw the Lease change, that is from when the read that
//! showed the change was answered (as client-go does), never by comparing
//! the holder's `renewTime` with the local wall clock, so a skewed clock can
//! neither steal a live lease nor keep a dead one.
//!
//! The fence: the leader may send a write only while its last successful
//! renewal, timed from when that renewal was *sent*, is younger than the
//! renew deadline. A rival can take the Lease only once a full lease
//! duration has passed since it saw that renewal (its read answered, however
//! long the read took to reach the server), which is later still; the
//! difference (lease duration − renew deadline) is the margin for a write
//! already in flight. A write still waiting for its answer when the fence
//! closes is abandoned. Leadership, once lost, is never regained in the same
//! process: the operator stops and exits, so it restarts as a clean follower.

use std::sync::Mutex;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::client::Body;
use tokio::sync::watch;
use tracing::{info, warn};

/// The Lease's timing, as kube-controller-manager's flags set it.
#[derive(Debug, Clone)]
pub struct Timing {
    /// How long a follower waits after it last saw the Lease change before
    /// it may take it (`--leader-elect-lease-duration`).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops writing
    /// and steps down (`--leader-elect-renew-deadline`).
    pub renew_deadline: Duration,
    /// How long an instance waits between attempts to acquire or renew
    /// (`--leader-elect-retry-period`).
    pub retry_period: Duration,
}

impl Timing {
    /// The defaults of kube-controller-manager.
    pub const DEFAULT: Timing = Timing {
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    /// Refuses timings under which two leaders could overlap, with the
    /// rules of client-go.
    pub fn check(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be longer than --leader-elect-renew-deadline ({:?}): \
                 the difference is what keeps a deposed leader's last write from overlapping the next leader's",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * 1.2 {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be longer than 1.2 × --leader-elect-retry-period ({:?}): \
                 the leader needs more than one attempt to renew before it steps down",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.retry_period.is_zero() {
            return Err("--leader-elect-retry-period must be more than 0".into());
        }
        Ok(())
    }
}

/// What this instance may do: shared by the elector, the reconciles and
/// the client's write fence.
#[derive(Debug)]
pub struct Fence {
    /// When the fence closes: the send time of the last successful renewal
    /// plus the renew deadline. `None`: not (or no longer) the leader.
    until: Mutex<Option<Instant>>,
    leading: watch::Sender<bool>,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            until: Mutex::new(None),
            leading: watch::Sender::new(false),
        }
    }
}

impl Fence {
    /// A fence that is always open: leader election is off.
    pub fn always_open() -> Self {
        let fence = Fence::default();
        *fence.until.lock().expect("fence") =
            Some(Instant::now() + Duration::from_secs(u32::MAX.into()));
        fence.leading.send_replace(true);
        fence
    }

    /// Until when writes may be sent, if this instance leads.
    pub fn open_until(&self, now: Instant) -> Option<Instant> {
        let until = *self.until.lock().expect("fence");
        until.filter(|&t| now < t)
    }

    /// Whether this instance leads (and its lease is fresh) at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        self.open_until(now).is_some()
    }

    /// A change of leadership, as a stream of values (true: leads).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    fn renewed(&self, sent: Instant, deadline: Duration) {
        *self.until.lock().expect("fence") = Some(sent + deadline);
        self.leading
            .send_if_modified(|leading| !std::mem::replace(leading, true));
    }

    fn close(&self) {
        *self.until.lock().expect("fence") = None;
        self.leading.send_replace(false);
    }
}

/// A tower layer for the operator's request client: writes (POST, PUT,
/// PATCH, DELETE) go out only while the fence is open, and one still
/// waiting for its answer when it closes is abandoned.
#[derive(Clone)]
pub struct FenceLayer(pub std::sync::Arc<Fence>);

impl<S> tower::Layer<S> for FenceLayer {
    type Service = Fenced<S>;
    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// The service [`FenceLayer`] wraps.
#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: std::sync::Arc<Fence>,
}

/// The error of a write the fence refused or abandoned.
#[derive(Debug, thiserror::Error)]
#[error(
    "not sent: this instance does not hold the leader lease (or its renew deadline has passed)"
)]
pub struct NotLeader;

impl<S> tower::Service<http::Request<Body>> for Fenced<S>
where
    S: tower::Service<http::Request<Body>>,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<S::Response, tower::BoxError>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let reads = matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if reads {
            let answer = self.inner.call(request);
            return Box::pin(async move { answer.await.map_err(Into::into) });
        }
        let Some(until) = self.fence.open_until(Instant::now()) else {
            return Box::pin(async { Err(NotLeader.into()) });
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout_at(until.into(), answer).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(NotLeader.into()),
            }
        })
    }
}

/// What this instance last saw of the Lease, and when (local clock).
#[derive(Debug, Clone)]
struct Seen {
    spec: LeaseSpec,
    at: Instant,
}

/// What to do with the Lease as last read.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// No Lease yet: create it, holding it.
    Create,
    /// Write it with this instance as the holder: a renewal when it already
    /// holds it, else a take-over (`acquireTime` and `leaseTransitions`
    /// move).
    Hold { renewal: bool },
    /// Another holder's lease is live: look again after this long.
    Wait(Duration),
}

/// Chooses the next step (pure: the clocks are arguments). `now` is when
/// the read of `lease` was answered; `seen` is updated to the Lease just
/// read, keeping its first sighting time when the record has not changed.
fn next_step(
    lease: Option<&LeaseSpec>,
    identity: &str,
    seen: &mut Option<Seen>,
    now: Instant,
    fallback_duration: Duration,
) -> Step {
    let Some(spec) = lease else {
        *seen = None;
        return Step::Create;
    };
    let changed = seen.as_ref().is_none_or(|s| &s.spec != spec);
    if changed {
        *seen = Some(Seen {
            spec: spec.clone(),
            at: now,
        });
    }
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder == identity {
        return Step::Hold { renewal: true };
    }
    if holder.is_empty() {
        return Step::Hold { renewal: false };
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(fallback_duration, Duration::from_secs);
    let since = seen.as_ref().map_or(now, |s| s.at);
    let expires = since + duration;
    if now >= expires {
        Step::Hold { renewal: false }
    } else {
        Step::Wait(expires - now)
    }
}

/// The Lease a step writes.
fn held(
    current: Option<&LeaseSpec>,
    identity: &str,
    renewal: bool,
    lease_duration: Duration,
    now: MicroTime,
) -> LeaseSpec {
    let created = current.is_none();
    let current = current.cloned().unwrap_or_default();
    let transitions = current.lease_transitions.unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(
            i32::try_from(lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
        ),
        acquire_time: if renewal {
            current.acquire_time.or(Some(now.clone()))
        } else {
            Some(now.clone())
        },
        renew_time: Some(now),
        lease_transitions: Some(if renewal || created {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..current
    }
}

/// The election's clock: tokio's, the monotonic clock, except in a test
/// that pauses time to drive an election through its timings (the waits
/// here are tokio's too, so both move together).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// How an election ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The leader could not renew within the renew deadline.
    Lost,
    /// Asked to stop.
    Stopped,
}

/// Campaigns for and holds the Lease until it is lost or `stop` completes;
/// `fence` says at every moment whether this instance may write. On a stop
/// while leading, the Lease is released so a follower need not wait for it
/// to expire.
pub async fn elect(
    leases: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    fence: std::sync::Arc<Fence>,
    stop: impl std::future::Future<Output = ()>,
) -> Ended {
    let mut stop = std::pin::pin!(stop);
    let mut seen: Option<Seen> = None;
    let mut last_renewal: Option<Instant> = None;
    info!(lease = %name, %identity, "leader election: campaigning");
    loop {
        let attempt_started = now();
        // While leading, an attempt may not outlast the fence: a renewal
        // that hangs must not keep a deposed leader believing it leads.
        let bound = match last_renewal {
            Some(at) => (at + timing.renew_deadline).saturating_duration_since(attempt_started),
            None => timing.renew_deadline,
        };
        let attempt = tokio::time::timeout(
            bound,
            try_hold(&leases, &name, &identity, &timing, &mut seen),
        );
        let outcome = tokio::select! {
            outcome = attempt => outcome.unwrap_or(Err(Attempt::Failed("timed out".into()))),
            () = &mut stop => break,
        };
        let wait = match outcome {
            Ok(()) => {
                if last_renewal.is_none() {
                    info!(lease = %name, %identity, "leader election: acquired the lease; leading");
                }
                last_renewal = Some(attempt_started);
                fence.renewed(attempt_started, timing.renew_deadline);
                timing.retry_period
            }
            Err(Attempt::HeldByOther { holder, wait }) => {
                if last_renewal.is_some() {
                    warn!(lease = %name, %holder, "leader election: another instance holds the lease");
                    fence.close();
                    return Ended::Lost;
                }
                // Look again when it would expire, or sooner.
                wait.min(timing.retry_period)
            }
            Err(Attempt::Failed(error)) => {
                warn!(lease = %name, %error, "leader election: could not acquire or renew the lease");
                timing.retry_period
            }
        };
        if let Some(at) = last_renewal
            && now() >= at + timing.renew_deadline
        {
            fence.close();
            warn!(
                lease = %name,
                deadline = ?timing.renew_deadline,
                "leader election: could not renew within the renew deadline; stopped writing"
            );
            return Ended::Lost;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut stop => break,
        }
    }
    if last_renewal.is_some() && fence.is_open(now()) {
        fence.close();
        release(&leases, &name, &identity).await;
    }
    fence.close();
    Ended::Stopped
}

enum Attempt {
    HeldByOther { holder: String, wait: Duration },
    Failed(String),
}

async fn try_hold(
    leases: &Api<Lease>,
    name: &str,
    identity: &str,
    timing: &Timing,
    seen: &mut Option<Seen>,
) -> Result<(), Attempt> {
    let failed = |e: kube::Error| Attempt::Failed(e.to_string());
    let current = leases.get_opt(name).await.map_err(failed)?;
    // A sighting dates from its answer (as client-go's observedTime): the
    // read may have reached the server long after it was sent, and seen a
    // renewal sent meanwhile. Dated from the send, a read slower than the
    // margin would let this instance take the Lease while that renewal's
    // fence is still open.
    let answered = now();
    let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
    match next_step(
        spec.as_ref(),
        identity,
        seen,
        answered,
        timing.lease_duration,
    ) {
        Step::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(held(
                    None,
                    identity,
                    false,
                    timing.lease_duration,
                    micro_now(),
                )),
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .map_err(failed)?;
            Ok(())
        }
        Step::Hold { renewal } => {
            let mut lease = current.expect("a lease to hold");
            lease.spec = Some(held(
                lease.spec.as_ref(),
                identity,
                renewal,
                timing.lease_duration,
                micro_now(),
            ));
            // The resourceVersion read above makes this a compare-and-swap:
            // of two instances taking an expired lease, one wins.
            leases
                .replace(name, &PostParams::default(), &lease)
                .await
                .map_err(failed)?;
            Ok(())
        }
        Step::Wait(wait) => Err(Attempt::HeldByOther {
            holder: spec.and_then(|s| s.holder_identity).unwrap_or_default(),
            wait,
        }),
    }
}

/// Gives the Lease up on a clean stop (as client-go's ReleaseOnCancel): no
/// holder and a one-second duration, so a follower takes over at its next
/// attempt.
async fn release(leases: &Api<Lease>, name: &str, identity: &str) {
    let result = async {
        let Some(mut lease) = leases.get_opt(name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(identity) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(micro_now());
        leases.replace(name, &PostParams::default(), &lease).await?;
        Ok::<_, kube::Error>(())
    }
    .await;
    match result {
        Ok(()) => info!(lease = %name, "leader election: released the lease"),
        Err(e) => warn!(lease = %name, error = %e, "leader election: could not release the lease"),
    }
}

/// A holder identity unique to this process: the pod's name (or the host's)
/// and a random suffix, so two processes on one host, or a restarted
/// container, never pass for each other.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| hostname::get().ok().and_then(|h| h.into_string().ok()))
        .unwrap_or_else(|| "openmed-operator".to_owned());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(renewed).unwrap(),
            )),
            ..LeaseSpec::default()
        }
    }

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn timing_refuses_overlapping_leaders() {
        assert!(Timing::DEFAULT.check().is_ok());
        let equal = Timing {
            lease_duration: Duration::from_secs(10),
            ..Timing::DEFAULT
        };
        assert!(equal.check().unwrap_err().contains("must be longer than"));
        let tight = Timing {
            retry_period: Duration::from_secs(9),
            ..Timing::DEFAULT
        };
        assert!(tight.check().unwrap_err().contains("1.2"));
    }

    #[test]
    fn no_lease_is_created_and_a_released_one_is_taken_at_once() {
        let mut seen = None;
        let t0 = Instant::now();
        assert_eq!(next_step(None, "me", &mut seen, t0, D), Step::Create);
        let released = spec(None, 100);
        assert_eq!(
            next_step(Some(&released), "me", &mut seen, t0, D),
            Step::Hold { renewal: false }
        );
    }

    #[test]
    fn a_live_lease_expires_a_lease_duration_after_it_was_last_seen_to_change() {
        let t0 = Instant::now();
        let mut seen = None;
        let theirs = spec(Some("other"), 100);
        assert_eq!(
            next_step(Some(&theirs), "me", &mut seen, t0, D),
            Step::Wait(D)
        );
        // Unchanged for 10 s: still theirs, 5 s to go.
        let t10 = t0 + Duration::from_secs(10);
        assert_eq!(
            next_step(Some(&theirs), "me", &mut seen, t10, D),
            Step::Wait(Duration::from_secs(5))
        );
        // Renewed at t10 (whatever its renewTime says: their clock may be
        // far off): the wait starts again from when it was seen to change.
        let renewed = spec(Some("other"), 50);
        assert_eq!(
            next_step(Some(&renewed), "me", &mut seen, t10, D),
            Step::Wait(D)
        );
        let t25 = t10 + D;
        assert_eq!(
            next_step(Some(&renewed), "me", &mut seen, t25, D),
            Step::Hold { renewal: false }
        );
    }

    #[test]
    fn the_holder_renews() {
        let mut seen = None;
        let mine = spec(Some("me"), 100);
        assert_eq!(
            next_step(Some(&mine), "me", &mut seen, Instant::now(), D),
            Step::Hold { renewal: true }
        );
    }

    #[test]
    fn a_take_over_counts_a_transition_and_a_renewal_keeps_the_acquire_time() {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::from_second(200).unwrap());
        let mut theirs = spec(Some("other"), 100);
        theirs.lease_transitions = Some(3);
        theirs.acquire_time = theirs.renew_time.clone();
        let taken = held(Some(&theirs), "me", false, D, now.clone());
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(now.clone()));
        let renewed = held(
            Some(&taken),
            "me",
            true,
            D,
            MicroTime(k8s_openapi::jiff::Timestamp::from_second(202).unwrap()),
        );
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(now));
        assert_eq!(renewed.lease_duration_seconds, Some(15));
    }

    #[test]
    fn the_fence_closes_at_the_renew_deadline_and_on_loss() {
        let fence = Fence::default();
        let t0 = Instant::now();
        assert!(!fence.is_open(t0));
        fence.renewed(t0, Duration::from_secs(10));
        assert!(fence.is_open(t0 + Duration::from_secs(9)));
        assert!(!fence.is_open(t0 + Duration::from_secs(10)));
        assert!(*fence.subscribe().borrow());
        fence.close();
        assert!(!fence.is_open(t0));
        assert!(!*fence.subscribe().borrow());
    }

    /// An API server that holds one Lease: a read can be slowed (it is
    /// answered from the Lease as it is when the delay ends, as a slow
    /// request reaches the server late), and every accepted write is kept
    /// with its time and holder.
    #[derive(Clone, Default)]
    struct FakeLeases(std::sync::Arc<Mutex<FakeState>>);

    #[derive(Default)]
    struct FakeState {
        lease: Option<Lease>,
        version: u64,
        read_delays: std::collections::VecDeque<Duration>,
        writes: Vec<(Instant, Option<String>)>,
    }

    const NAME: &str = "openmed-operator";

    impl FakeLeases {
        fn held_by(holder: &str, duration: Duration) -> Self {
            let fake = FakeLeases::default();
            let spec = held(None, holder, false, duration, micro_now());
            fake.store(Lease {
                metadata: ObjectMeta {
                    name: Some(NAME.into()),
                    namespace: Some("ns".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            });
            fake
        }

        fn store(&self, mut lease: Lease) -> Lease {
            let mut state = self.0.lock().unwrap();
            state.version += 1;
            lease.metadata.resource_version = Some(state.version.to_string());
            state.lease = Some(lease.clone());
            lease
        }

        /// A renewal by `holder`, written straight into the store.
        fn renew(&self, holder: &str) {
            let mut lease = self.0.lock().unwrap().lease.clone().unwrap();
            lease.spec = Some(held(lease.spec.as_ref(), holder, true, D, micro_now()));
            self.store(lease);
        }

        fn slow_next_read(&self, by: Duration) {
            self.0.lock().unwrap().read_delays.push_back(by);
        }

        fn first_write_by(&self, holder: &str) -> Option<Instant> {
            let state = self.0.lock().unwrap();
            state
                .writes
                .iter()
                .find(|(_, h)| h.as_deref() == Some(holder))
                .map(|(at, _)| *at)
        }

        fn api(&self) -> Api<Lease> {
            let fake = self.clone();
            let service = tower::service_fn(move |request: http::Request<Body>| {
                let fake = fake.clone();
                async move { Ok::<_, std::convert::Infallible>(fake.answer(request).await) }
            });
            Api::namespaced(kube::Client::new(service, "ns"), "ns")
        }

        async fn answer(&self, request: http::Request<Body>) -> http::Response<Body> {
            use http_body_util::BodyExt;
            let method = request.method().clone();
            let body = request.into_body().collect().await.unwrap().to_bytes();
            if method == http::Method::GET {
                let delay = self.0.lock().unwrap().read_delays.pop_front();
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
                let lease = self.0.lock().unwrap().lease.clone();
                return match lease {
                    Some(lease) => reply(200, &lease),
                    None => status(404, "NotFound"),
                };
            }
            let mut lease: Lease = serde_json::from_slice(&body).unwrap();
            {
                let state = self.0.lock().unwrap();
                let current = state.lease.as_ref();
                let conflict = match method {
                    http::Method::POST => current.is_some(),
                    _ => {
                        current.and_then(|l| l.metadata.resource_version.as_deref())
                            != lease.metadata.resource_version.as_deref()
                    }
                };
                if conflict {
                    return status(409, "Conflict");
                }
            }
            lease = self.store(lease);
            let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
            self.0.lock().unwrap().writes.push((now(), holder));
            reply(
                if method == http::Method::POST {
                    201
                } else {
                    200
                },
                &lease,
            )
        }
    }

    fn reply(code: u16, body: &impl serde::Serialize) -> http::Response<Body> {
        http::Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap()
    }

    fn status(code: u16, reason: &str) -> http::Response<Body> {
        reply(
            code,
            &serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "reason": reason, "code": code, "message": reason,
            }),
        )
    }

    /// A follower whose read of the Lease is slower than the margin
    /// (lease duration − renew deadline) sees a renewal that landed while
    /// the read was on its way. It must count the lease from when it had
    /// the answer: counted from when it sent the read, it would take the
    /// Lease while the old leader's fence is still open.
    #[tokio::test(start_paused = true)]
    async fn a_follower_counts_the_lease_from_when_its_read_was_answered() {
        let timing = Timing::DEFAULT;
        let margin = timing.lease_duration - timing.renew_deadline;
        // Slower than the margin, inside the bound of one attempt.
        let slow = margin + Duration::from_secs(3);
        assert!(slow < timing.renew_deadline);
        let fake = FakeLeases::held_by("old", timing.lease_duration);
        fake.slow_next_read(slow);
        let started = now();
        let answered = started + slow;
        // The old leader's last renewal, sent and landed while the read
        // waits: its fence stays open a renew deadline after it.
        let last_renewal = answered - Duration::from_secs(1);
        let renewer = {
            let fake = fake.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(last_renewal.into()).await;
                fake.renew("old");
            })
        };
        let fence = std::sync::Arc::new(Fence::default());
        let mut leading = fence.subscribe();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let election = tokio::spawn(elect(
            fake.api(),
            NAME.into(),
            "me".into(),
            timing.clone(),
            fence.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        tokio::time::timeout(Duration::from_secs(120), leading.wait_for(|l| *l))
            .await
            .expect("the follower takes the expired lease")
            .unwrap();
        let taken = fake.first_write_by("me").expect("the take-over");
        assert!(
            taken >= answered + timing.lease_duration,
            "taken {:?} after the answer that showed the renewal, under the lease duration {:?}",
            taken - answered,
            timing.lease_duration
        );
        assert!(taken >= last_renewal + timing.renew_deadline);
        stop.send(()).unwrap();
        assert_eq!(election.await.unwrap(), Ended::Stopped);
        renewer.await.unwrap();
    }
}
