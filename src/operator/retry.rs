//! Which failed requests the client repeats on its own, within the request.
//!
//! kube's `RetryPolicy` repeats 429, 503 and 504, the answers in which the
//! API server asks to be asked again. This policy does that too, and also
//! repeats a 500 answered to a read (GET without `watch`): a read changes
//! nothing, so asking again is always safe, and under a flaky API server
//! one failed read among the dozen of a reconcile would otherwise fail the
//! whole reconcile and start its backoff. A 500 to a write is not
//! repeated: it may have taken effect, and the reconcile decides again
//! from what is stored.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use tokio::time::Instant;
use tower::BoxError;
use tower::retry::Policy;
use tower::retry::backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::util::rng::HasherRng;

/// Repeats a request up to `max_retries` times, waiting from `min` and
/// doubling up to `max` (with jitter), or as long as a Retry-After asks.
#[derive(Clone)]
pub struct Retry {
    backoff: ExponentialBackoff,
    attempt: u32,
    max_retries: u32,
}

impl Retry {
    pub fn new(min: Duration, max: Duration, max_retries: u32) -> Self {
        let backoff = ExponentialBackoffMaker::new(min, max, 2.0, HasherRng::new())
            .expect("min below max, both finite")
            .make_backoff();
        Retry {
            backoff,
            attempt: 0,
            max_retries,
        }
    }
}

/// Whether an answer is worth asking again for this request.
pub fn repeatable(method: &Method, query: Option<&str>, status: StatusCode) -> bool {
    match status {
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => true,
        StatusCode::INTERNAL_SERVER_ERROR => method == Method::GET && !is_watch(query),
        _ => false,
    }
}

fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1" || pair == "watch")
    })
}

/// How long the server asked to wait, if it did (whole seconds only, the
/// form the API server uses).
fn retry_after<B>(response: &Response<B>) -> Option<Duration> {
    let value = response.headers().get(http::header::RETRY_AFTER)?;
    value
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for Retry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let Ok(response) = result else {
            return None;
        };
        if self.attempt >= self.max_retries
            || !repeatable(req.method(), req.uri().query(), response.status())
        {
            return None;
        }
        self.attempt += 1;
        let ours = self.backoff.next_backoff();
        // A Retry-After longer than our own wait wins; a huge one that does
        // not fit in an Instant is ignored rather than trusted.
        if let Some(asked) = retry_after(response)
            && Instant::now()
                .checked_add(asked)
                .is_some_and(|then| ours.deadline() < then)
        {
            return Some(tokio::time::sleep(asked));
        }
        Some(ours)
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        // A streamed body cannot be sent twice; such a request is not retried.
        let body = req.body().try_clone()?;
        let mut copy = Request::builder()
            .method(req.method().clone())
            .uri(req.uri().clone())
            .version(req.version())
            .body(body)
            .ok()?;
        *copy.headers_mut() = req.headers().clone();
        *copy.extensions_mut() = req.extensions().clone();
        Some(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_asked_again() {
        let get = Method::GET;
        // The API server's own "ask again" answers, for any request.
        for status in [
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::GATEWAY_TIMEOUT,
        ] {
            assert!(repeatable(&Method::PATCH, None, status));
            assert!(repeatable(&Method::POST, None, status));
            assert!(repeatable(&get, None, status));
        }
        // A 500: reads only, never a write that may have taken effect.
        let err = StatusCode::INTERNAL_SERVER_ERROR;
        assert!(repeatable(&get, None, err));
        assert!(repeatable(&get, Some("labelSelector=a%3Db"), err));
        assert!(!repeatable(&Method::PATCH, None, err));
        assert!(!repeatable(&Method::PUT, None, err));
        assert!(!repeatable(&Method::POST, None, err));
        assert!(!repeatable(&Method::DELETE, None, err));
        // A watch is not a read to repeat: the watcher restarts it itself.
        assert!(!repeatable(&get, Some("watch=true&resourceVersion=5"), err));
        assert!(!repeatable(&get, Some("resourceVersion=5&watch=1"), err));
        // Answers that will not change by asking again.
        for status in [
            StatusCode::OK,
            StatusCode::CONFLICT,
            StatusCode::NOT_FOUND,
            StatusCode::FORBIDDEN,
            StatusCode::UNPROCESSABLE_ENTITY,
            StatusCode::BAD_GATEWAY,
        ] {
            assert!(!repeatable(&get, None, status), "{status}");
        }
    }

    fn answer(status: StatusCode, retry_after: Option<&str>) -> Result<Response<()>, BoxError> {
        let mut builder = Response::builder().status(status);
        if let Some(value) = retry_after {
            builder = builder.header(http::header::RETRY_AFTER, value);
        }
        Ok(builder.body(()).unwrap())
    }

    fn get() -> Request<Body> {
        Request::get("/api/v1/namespaces/a/configmaps/b")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn stops_after_the_last_retry() {
        let mut policy = Retry::new(Duration::from_millis(100), Duration::from_secs(2), 3);
        let mut req = get();
        for _ in 0..3 {
            let mut res = answer(StatusCode::INTERNAL_SERVER_ERROR, None);
            assert!(policy.retry(&mut req, &mut res).is_some());
        }
        let mut res = answer(StatusCode::INTERNAL_SERVER_ERROR, None);
        assert!(policy.retry(&mut req, &mut res).is_none());
        // A transport error (no answer at all) is left to the reconcile.
        let mut policy = Retry::new(Duration::from_millis(100), Duration::from_secs(2), 3);
        let mut res: Result<Response<()>, BoxError> = Err("connection reset".into());
        assert!(policy.retry(&mut req, &mut res).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn waits_as_long_as_the_server_asks() {
        let now = Instant::now();
        let mut policy = Retry::new(Duration::from_millis(100), Duration::from_secs(2), 3);
        let mut req = get();
        let mut res = answer(StatusCode::TOO_MANY_REQUESTS, Some("7"));
        let wait = policy.retry(&mut req, &mut res).unwrap();
        assert_eq!(wait.deadline(), now + Duration::from_secs(7));
        // One that cannot be represented falls back to our own wait.
        let mut res = answer(StatusCode::TOO_MANY_REQUESTS, Some(&u64::MAX.to_string()));
        let wait = policy.retry(&mut req, &mut res).unwrap();
        assert!(wait.deadline() <= now + Duration::from_secs(2));
    }

    #[test]
    fn a_request_is_copied_whole() {
        let mut policy = Retry::new(Duration::from_millis(100), Duration::from_secs(2), 3);
        let mut req = Request::patch("/apis/apps/v1/namespaces/a/deployments/b?fieldManager=x")
            .header("content-type", "application/apply-patch+yaml")
            .body(Body::from(b"spec: {}".to_vec()))
            .unwrap();
        req.extensions_mut().insert(7u8);
        let copy = Policy::<_, Response<()>, BoxError>::clone_request(&mut policy, &req).unwrap();
        assert_eq!(copy.method(), Method::PATCH);
        assert_eq!(copy.uri(), req.uri());
        assert_eq!(copy.headers(), req.headers());
        assert_eq!(copy.extensions().get::<u8>(), Some(&7));
    }
}
