//! A fault-injecting proxy between an operator and kube-apiserver.
//!
//! It terminates TLS with the API server's own certificate (signed by the
//! test cluster's CA, valid for 127.0.0.1), so a kubeconfig that differs from
//! the operator's only in its server URL points the operator here. Each
//! request is parsed into verb, resource, namespace and name, matched
//! against the rules in order, and then forwarded with the admin client:
//! the operator's `Impersonate-User` header goes along, so the API server
//! authorizes the operator's own identity, exactly as without the proxy.
//!
//! Rules say which requests (verb, resource, name, namespace, the n-th match,
//! how many times, with what probability) get which fault: an error status
//! before forwarding, or after forwarding (the write committed, the client
//! hears an error); a delay; no answer at all; a watch cut after a while; a
//! watch answered with 410 Gone; or a hook (the crash-point sweep kills the
//! operator there). Every request is logged with the fault it got.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A request, as the rules see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Call {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// `configmaps`, `deployments`, `openmedmodels/status`, `leases`, …
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub user_agent: String,
}

impl Call {
    /// A request that changes something.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    fn parse<B>(request: &Request<B>) -> Call {
        let path = request.uri().path();
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        // /api/v1/... or /apis/group/version/...
        let rest: &[&str] = match parts.as_slice() {
            ["api", _version, rest @ ..] => rest,
            ["apis", _group, _version, rest @ ..] => rest,
            _ => &[],
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            _ => (None, rest),
        };
        let (resource, name, sub) = match rest {
            [resource] => (resource.to_string(), None, None),
            [resource, name] => (resource.to_string(), Some(name.to_string()), None),
            [resource, name, sub, ..] => (
                resource.to_string(),
                Some(name.to_string()),
                Some(sub.to_string()),
            ),
            [] => (String::new(), None, None),
        };
        let query = request.uri().query().unwrap_or_default();
        let watch = query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        let verb = match (request.method().as_str(), name.is_some()) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            (other, _) => other,
        };
        Call {
            verb: verb.to_owned(),
            resource: match sub {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource,
            },
            namespace,
            name,
            user_agent: request
                .headers()
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        }
    }
}

/// Which requests a rule applies to; `None` matches anything.
#[derive(Debug, Clone, Default)]
pub struct Match {
    pub verbs: Option<Vec<&'static str>>,
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Only writes (create, update, patch, delete).
    pub writes: bool,
    /// Only requests whose User-Agent contains this (with leader election
    /// it names the instance).
    pub user_agent: Option<String>,
}

impl Match {
    pub fn matches(&self, call: &Call) -> bool {
        self.verbs
            .as_ref()
            .is_none_or(|v| v.contains(&call.verb.as_str()))
            && self.resource.as_ref().is_none_or(|r| *r == call.resource)
            && self
                .namespace
                .as_ref()
                .is_none_or(|n| call.namespace.as_ref() == Some(n))
            && self
                .name
                .as_ref()
                .is_none_or(|n| call.name.as_ref() == Some(n))
            && (!self.writes || call.is_write())
            && self
                .user_agent
                .as_ref()
                .is_none_or(|ua| call.user_agent.contains(ua.as_str()))
    }
}

/// A hook run in place of (or after) forwarding, e.g. killing the operator.
pub type Hook = Arc<dyn Fn(&Call) + Send + Sync>;

/// What a matching request gets.
#[derive(Clone)]
pub enum Fault {
    /// This status, without forwarding.
    Fail(u16),
    /// Forwarded (it takes effect), then this status instead of the answer.
    FailAfter(u16),
    /// Forwarded after this long.
    Delay(Duration),
    /// Never answered.
    Blackhole,
    /// A watch forwarded, then cut after this long.
    CutWatch(Duration),
    /// A watch answered with an ERROR event, 410 Gone (expired).
    Gone,
    /// The hook runs before forwarding; the request is then dropped.
    HookBefore(Hook),
    /// Forwarded; the hook runs once it has taken effect, and the answer
    /// is dropped.
    HookAfter(Hook),
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Fail(s) => write!(f, "Fail({s})"),
            Fault::FailAfter(s) => write!(f, "FailAfter({s})"),
            Fault::Delay(d) => write!(f, "Delay({d:?})"),
            Fault::Blackhole => write!(f, "Blackhole"),
            Fault::CutWatch(d) => write!(f, "CutWatch({d:?})"),
            Fault::Gone => write!(f, "Gone"),
            Fault::HookBefore(_) => write!(f, "HookBefore"),
            Fault::HookAfter(_) => write!(f, "HookAfter"),
        }
    }
}

/// A rule: which requests, which fault, how often.
#[derive(Debug, Clone)]
pub struct Rule {
    pub matching: Match,
    pub fault: Fault,
    /// Matching requests let through unharmed before the first fault.
    pub skip: u32,
    /// At most this many faults (`None`: every match).
    pub times: Option<u32>,
    /// The chance that a match gets the fault (1.0: always).
    pub probability: f64,
    seen: u32,
    applied: u32,
}

impl Rule {
    pub fn new(matching: Match, fault: Fault) -> Self {
        Rule {
            matching,
            fault,
            skip: 0,
            times: None,
            probability: 1.0,
            seen: 0,
            applied: 0,
        }
    }

    pub fn skip(mut self, n: u32) -> Self {
        self.skip = n;
        self
    }

    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    pub fn probability(mut self, p: f64) -> Self {
        self.probability = p;
        self
    }
}

/// One request through the proxy, and what it got.
#[derive(Debug, Clone)]
pub struct Logged {
    pub call: Call,
    pub at: Instant,
    pub fault: Option<String>,
}

struct State {
    rules: Vec<Rule>,
    log: Vec<Logged>,
    rng: fastrand::Rng,
}

/// The running proxy.
pub struct Proxy {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    state: Arc<Mutex<State>>,
    cut: tokio::sync::watch::Sender<u64>,
    partitioned: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy in front of the API server that `upstream` talks to,
    /// serving TLS with `cert`/`key` (PEM). `seed` drives every random
    /// choice (probabilistic rules).
    pub async fn start(
        upstream: kube::Client,
        cert: &std::path::Path,
        key: &std::path::Path,
        seed: u64,
    ) -> Proxy {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("the API server certificate")
            .collect::<Result<_, _>>()
            .expect("PEM certificates");
        let key = PrivateKeyDer::from_pem_file(key).expect("the API server key");
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("a TLS configuration");
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            rules: Vec::new(),
            log: Vec::new(),
            rng: fastrand::Rng::with_seed(seed),
        }));
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let (partitioned, _) = tokio::sync::watch::channel(false);
        let shared = Shared {
            upstream,
            state: state.clone(),
            cut: cut.clone(),
            partitioned: partitioned.clone(),
        };
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, shared) = (acceptor.clone(), shared.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |request| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(shared.handle(request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Proxy {
            url,
            state,
            cut,
            partitioned,
            task,
        }
    }

    /// Adds a rule (after the existing ones); returns its index.
    pub fn add(&self, rule: Rule) -> usize {
        let mut state = self.state.lock().unwrap();
        state.rules.push(rule);
        state.rules.len() - 1
    }

    /// Removes every rule: requests pass unharmed from now on.
    pub fn clear(&self) {
        self.state.lock().unwrap().rules.clear();
    }

    /// How many times each rule has applied its fault.
    pub fn applied(&self) -> Vec<u32> {
        self.state
            .lock()
            .unwrap()
            .rules
            .iter()
            .map(|r| r.applied)
            .collect()
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    /// A network partition between the operator and the API server, as
    /// TCP sees one: while it lasts nothing gets through in either
    /// direction (new requests wait, open watches deliver nothing); when it
    /// heals, what waited is delivered late.
    pub fn partition(&self, on: bool) {
        self.partitioned.send_replace(on);
    }

    /// A handle that ends every watch open at the moment it is used (the
    /// client sees its stream break), for a task of its own.
    pub fn resetter(&self) -> Resetter {
        Resetter(self.cut.clone())
    }

    /// A kubeconfig like `base` (a path) but pointing at the proxy.
    pub fn kubeconfig(&self, base: &std::path::Path, out: &std::path::Path) {
        let text = std::fs::read_to_string(base).unwrap();
        let mut config: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        for cluster in config["clusters"].as_array_mut().unwrap() {
            cluster["cluster"]["server"] = serde_json::Value::String(self.url.clone());
        }
        std::fs::write(out, serde_yaml::to_string(&config).unwrap()).unwrap();
    }
}

/// See [`Proxy::resetter`].
pub struct Resetter(tokio::sync::watch::Sender<u64>);

impl Resetter {
    pub fn cut_watches(&self) {
        self.0.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Shared {
    upstream: kube::Client,
    state: Arc<Mutex<State>>,
    cut: tokio::sync::watch::Sender<u64>,
    partitioned: tokio::sync::watch::Sender<bool>,
}

/// Waits while the partition lasts.
async fn through(partitioned: &tokio::sync::watch::Sender<bool>) {
    let mut rx = partitioned.subscribe();
    let _ = rx.wait_for(|on| !*on).await;
}

impl Shared {
    /// The first rule that matches and fires, if any (counting matches).
    fn fault_for(&self, call: &Call) -> Option<Fault> {
        let mut state = self.state.lock().unwrap();
        let State { rules, log, rng } = &mut *state;
        let mut chosen = None;
        for rule in rules.iter_mut() {
            if !rule.matching.matches(call) {
                continue;
            }
            rule.seen += 1;
            if rule.seen <= rule.skip || rule.times.is_some_and(|t| rule.applied >= t) {
                continue;
            }
            if rule.probability < 1.0 && rng.f64() >= rule.probability {
                continue;
            }
            rule.applied += 1;
            chosen = Some(rule.fault.clone());
            break;
        }
        log.push(Logged {
            call: call.clone(),
            at: Instant::now(),
            fault: chosen.as_ref().map(|f| format!("{f:?}")),
        });
        chosen
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        through(&self.partitioned).await;
        let call = Call::parse(&request);
        let fault = self.fault_for(&call);
        match &fault {
            Some(Fault::Fail(status)) => return status_response(*status),
            Some(Fault::Blackhole) => futures::future::pending::<()>().await,
            Some(Fault::Gone) if call.verb == "watch" => return gone(),
            Some(Fault::Delay(d)) => tokio::time::sleep(*d).await,
            Some(Fault::HookBefore(hook)) => {
                hook(&call);
                return status_response(503);
            }
            _ => {}
        }
        let answer = match self.forward(request).await {
            Ok(answer) => answer,
            Err(e) => {
                eprintln!("chaos proxy: forwarding {call:?} failed: {e}");
                return status_response(502);
            }
        };
        match fault {
            Some(Fault::FailAfter(status)) => {
                // Read the answer to the end, so the write has taken effect.
                let _ = answer.into_body().collect().await;
                status_response(status)
            }
            Some(Fault::HookAfter(hook)) => {
                let _ = answer.into_body().collect().await;
                hook(&call);
                status_response(503)
            }
            Some(Fault::CutWatch(after)) => self.streamed(answer, Some(after)),
            _ if call.verb == "watch" => self.streamed(answer, None),
            _ => answer.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()),
        }
    }

    async fn forward(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<kube::client::Body>, BoxError> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect().await?.to_bytes();
        let mut upstream = Request::from_parts(parts, kube::client::Body::from(bytes.to_vec()));
        // The admin client authenticates; the operator's identity rides in
        // its impersonation headers. Hop-by-hop headers stay here.
        upstream.headers_mut().remove(http::header::HOST);
        upstream.headers_mut().remove(http::header::CONNECTION);
        Ok(self.upstream.send(upstream).await?)
    }

    /// A streamed answer (a watch), cut after `after` or on `cut_watches`.
    fn streamed(
        &self,
        answer: Response<kube::client::Body>,
        after: Option<Duration>,
    ) -> Response<Body> {
        let (parts, body) = answer.into_parts();
        let cut = self.cut.subscribe();
        let partitioned = self.partitioned.clone();
        let deadline = after.map(|d| tokio::time::Instant::now() + d);
        let stream = futures::stream::unfold((body, false), move |(mut body, done)| {
            let mut cut = cut.clone();
            let partitioned = partitioned.clone();
            async move {
                if done {
                    return None;
                }
                through(&partitioned).await;
                let cut_now = async {
                    match deadline {
                        Some(at) => tokio::select! {
                            () = tokio::time::sleep_until(at) => {},
                            _ = cut.changed() => {},
                        },
                        None => {
                            let _ = cut.changed().await;
                        }
                    }
                };
                tokio::select! {
                    frame = body.frame() => match frame {
                        Some(Ok(frame)) => Some((Ok::<_, BoxError>(frame), (body, false))),
                        Some(Err(e)) => Some((Err(Box::new(e) as BoxError), (body, true))),
                        None => None,
                    },
                    () = cut_now => Some((Err("watch cut by the chaos proxy".into()), (body, true))),
                }
            }
        });
        Response::from_parts(parts, StreamBody::new(stream).boxed_unsync())
    }
}

fn full(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(
            Full::new(Bytes::from(body))
                .map_err(|e: Infallible| match e {})
                .boxed_unsync(),
        )
        .unwrap()
}

/// A Kubernetes `Status` with this code, as the API server would send it.
fn status_response(code: u16) -> Response<Body> {
    let reason = match code {
        409 => "Conflict",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    };
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": format!("injected by the chaos proxy ({code})"),
        "reason": reason, "code": code,
    });
    let mut response = full(
        StatusCode::from_u16(code).unwrap(),
        "application/json",
        body.to_string(),
    );
    if code == 429 {
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
    }
    response
}

/// A watch that ends at once with an expired resource version.
fn gone() -> Response<Body> {
    let event = serde_json::json!({
        "type": "ERROR",
        "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "too old resource version (injected by the chaos proxy)",
            "reason": "Expired", "code": 410,
        },
    });
    full(StatusCode::OK, "application/json", format!("{event}\n"))
}
