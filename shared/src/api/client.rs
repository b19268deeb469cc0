//! API clients. As in kube-controller-manager, every controller gets its own client with its own
//! QPS/burst bucket and a user agent naming it, so one busy controller cannot starve another and
//! the API server's audit log attributes each request.
//!
//! Controller clients also carry the leader's *write fence*: a mutating request is refused locally
//! once this replica can no longer be sure it holds the Lease, so a partitioned leader stops
//! acting before any standby may take over.

use crate::api::apierr::NotLeading;
use crate::api::ratelimit::TokenBucket;
use crate::metrics::{Metrics, RequestLabels, RestClientMetrics};
use futures::future::BoxFuture;
use http::{HeaderValue, Method, Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant as StdInstant;
use tower::{Layer, Service};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Decides whether this replica may write. Implemented by the leader elector.
pub trait WriteFence: Send + Sync + std::fmt::Debug {
    fn may_write(&self) -> bool;
}

/// How long a low-priority request (an event) waits for a token its controller's object writes
/// leave free before it is given up.
pub const LOW_PRIORITY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);

/// After this long without a free token, a low-priority request queues among the object writes,
/// one at a time and at most [`LOW_PRIORITY_SHARE`] of the budget: events keep flowing under a
/// saturated budget instead of starving, while object writes keep the rest of it.
pub const LOW_PRIORITY_STARVED: std::time::Duration = std::time::Duration::from_secs(1);

/// The share of a saturated budget starved low-priority requests may take. Upstream's event
/// sink takes one turn in every round of its controller's writers (a sixth of the budget for
/// five workers, more for fewer); this bounds events to a tenth whatever the worker count, so
/// a saturated controller converges sooner than upstream's and drops (and counts) the events
/// that cannot wait, as upstream's recorder does beyond its queue of 1,000.
pub const LOW_PRIORITY_SHARE: f64 = 0.1;

/// Re-sends of one request the server asked to be retried later (client-go's default).
pub const MAX_RETRY_AFTER: u32 = 10;

/// The longest `Retry-After` honoured as given; a larger one waits this long (a worker is held
/// meanwhile).
pub const RETRY_AFTER_CAP: std::time::Duration = std::time::Duration::from_secs(60);

/// A low-priority request gave up: the controller's budget stayed taken by its object writes.
#[derive(Debug, thiserror::Error)]
#[error(
    "gave up {method} {path} after {LOW_PRIORITY_PATIENCE:?}: the controller's API budget stayed taken"
)]
pub struct BudgetExhausted {
    pub method: Method,
    pub path: String,
}

/// What a client is for: the name in its user agent and metrics, and its limits.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub controller: String,
    pub qps: f32,
    pub burst: u32,
    pub fence: Option<Arc<dyn WriteFence>>,
    /// A bucket shared with another client (a controller's events share its budget); `None`
    /// gives the client a bucket of its own from `qps` and `burst`.
    pub bucket: Option<Arc<TokenBucket>>,
    /// Served only from tokens nobody else has reserved (events yield to object writes).
    pub low_priority: bool,
    /// Sent as `Authorization` on every request (`--use-service-account-credentials`); the
    /// base configuration then carries no credentials of its own.
    pub bearer: Option<Arc<crate::api::credentials::BearerToken>>,
}

impl ClientSpec {
    /// A client with a bucket of its own, at normal priority.
    pub fn new(controller: impl Into<String>, qps: f32, burst: u32) -> Self {
        ClientSpec {
            controller: controller.into(),
            qps,
            burst,
            fence: None,
            bucket: None,
            low_priority: false,
            bearer: None,
        }
    }
}

pub fn user_agent(controller: &str) -> String {
    format!(
        "pilothouse/v{} ({}/{}) pilothouse/{}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
        controller
    )
}

/// Builds a client for `spec` from a base configuration.
pub fn build(config: &Config, spec: ClientSpec, metrics: &Metrics) -> Result<Client, kube::Error> {
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let layer = ControllerLayer {
        shared: Arc::new(Shared {
            bucket: spec
                .bucket
                .unwrap_or_else(|| Arc::new(TokenBucket::new(f64::from(spec.qps), spec.burst))),
            low_priority: spec.low_priority,
            starved: tokio::sync::Mutex::new(None),
            user_agent: HeaderValue::from_str(&user_agent(&spec.controller))
                .unwrap_or_else(|_| HeaderValue::from_static("pilothouse")),
            controller: spec.controller,
            host,
            metrics: metrics.rest_client(),
            fence: spec.fence,
            bearer: spec.bearer,
        }),
    };
    // kube's default retry re-sends every 429, 503 and 504 up to 15 times with backoff up to
    // 1000 s, beneath this layer (outside the controller's token bucket and write fence) and
    // inside the sync: a PodDisruptionBudget's 429 on an eviction kept a worker for minutes.
    // Controllers classify every answer and retry through their queues' per-key backoff, as
    // client-go's controllers do.
    // What is retried instead is client-go's: an answer of 429 or 5xx with `Retry-After` (API
    // priority and fairness, a server shutting down) is sent again after that long, through
    // this layer (a token each time), at most MAX_RETRY_AFTER times. The buffer makes the
    // stack beneath cloneable, to send again from inside the response future.
    let mut config = config.clone();
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&layer)
        .with_layer(&tower::layer::layer_fn(|inner| LateTimes { inner }))
        .build())
}

/// Lands times past `jiff`'s bound (see [`crate::meta::late`]) in every answer but a watch's
/// before kube decodes it: a GET, a LIST or a write's returned object carrying one would
/// otherwise fail to decode (after the write landed). Watches decode through
/// [`crate::cache::decoded`] instead, object by object. Only a body that contains such a time
/// is parsed; the others are passed on as read.
#[derive(Clone)]
struct LateTimes<S> {
    inner: S,
}

type LateBody = http_body_util::combinators::UnsyncBoxBody<hyper::body::Bytes, BoxError>;

impl<S, B> Service<Request<Body>> for LateTimes<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = hyper::body::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<LateBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<LateBody>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        use http_body_util::BodyExt;
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await?;
            if watch {
                return Ok(res.map(|b| b.map_err(Into::into).boxed_unsync()));
            }
            let (parts, body) = res.into_parts();
            let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
            let bytes = if crate::meta::late::may_carry_late_times(&bytes) {
                landed(&bytes).map_or(bytes, hyper::body::Bytes::from)
            } else {
                bytes
            };
            let body = http_body_util::Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync();
            Ok(Response::from_parts(parts, body))
        })
    }
}

/// `body` re-serialized with its late times landed; `None` if it is not JSON or has none.
fn landed(body: &[u8]) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    crate::meta::late::land_late_times(&mut value)
        .then(|| serde_json::to_vec(&value).ok())
        .flatten()
}

struct Shared {
    bucket: Arc<TokenBucket>,
    low_priority: bool,
    /// Held by the one starved low-priority request taking its turn; when the next turn may
    /// start (spaced so that starved requests take at most [`LOW_PRIORITY_SHARE`] of the
    /// budget).
    starved: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    user_agent: HeaderValue,
    controller: String,
    host: String,
    metrics: Arc<RestClientMetrics>,
    fence: Option<Arc<dyn WriteFence>>,
    bearer: Option<Arc<crate::api::credentials::BearerToken>>,
}

#[derive(Clone)]
pub struct ControllerLayer {
    shared: Arc<Shared>,
}

impl<S> Layer<S> for ControllerLayer {
    type Service = ControllerService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ControllerService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

pub struct ControllerService<S> {
    inner: S,
    shared: Arc<Shared>,
}

fn is_write(m: &Method) -> bool {
    !matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The wait a response asks for before the same request is sent again (client-go's
/// `checkWait`): a 429 or 5xx with `Retry-After` in whole seconds, capped at
/// [`RETRY_AFTER_CAP`].
fn retry_after<B>(res: &Response<B>) -> Option<std::time::Duration> {
    let code = res.status().as_u16();
    if code != 429 && code < 500 {
        return None;
    }
    let secs: i64 = res
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(std::time::Duration::from_secs(secs.max(0).unsigned_abs()).min(RETRY_AFTER_CAP))
}

/// A copy of `req` to send again, when it may be: its body is in memory, and it is not an
/// eviction (a PodDisruptionBudget's 429 is the controller's to classify and back off from,
/// as kubectl drain does, not a worker's to wait out).
fn resendable(req: &Request<Body>) -> Option<Request<Body>> {
    if req.uri().path().ends_with("/eviction") {
        return None;
    }
    let mut copy = Request::new(req.body().try_clone()?);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

/// Reads what little a refused answer has (client-go reads up to 2 KiB), so the connection
/// carries the retry instead of being closed with the unread body.
async fn discard<B: http_body::Body>(res: Response<B>) {
    use http_body_util::BodyExt;
    let mut body = Box::pin(res.into_body());
    for _ in 0..4 {
        match tokio::time::timeout(std::time::Duration::from_secs(1), body.frame()).await {
            Ok(Some(Ok(_))) => {}
            _ => return,
        }
    }
}

impl Shared {
    /// Waits for a token: reserved in order for normal requests (`reserved`, taken when the
    /// request was made), or only a free one for low-priority requests. Whether it waited.
    async fn throttle(
        &self,
        reserved: Option<std::time::Duration>,
        method: &Method,
        path: &str,
    ) -> Result<bool, BoxError> {
        // The runtime's clock, so that tests can pause it.
        let t = tokio::time::Instant::now();
        let waited = match reserved {
            Some(d) => {
                if !d.is_zero() {
                    tokio::time::sleep(d).await;
                }
                !d.is_zero()
            }
            None => {
                let mut waited = false;
                while let Err(d) = self.bucket.take_if_free() {
                    waited = true;
                    let elapsed = t.elapsed();
                    if elapsed < LOW_PRIORITY_STARVED {
                        tokio::time::sleep(d.min(LOW_PRIORITY_STARVED.saturating_sub(elapsed)))
                            .await;
                        continue;
                    }
                    self.starved_turn(elapsed, method, path).await?;
                    break;
                }
                waited
            }
        };
        if waited {
            self.metrics
                .rate_limiter_wait
                .get_or_create(&crate::metrics::NameLabel {
                    name: self.controller.clone(),
                })
                .observe(t.elapsed().as_secs_f64());
        }
        Ok(waited)
    }

    /// A starved low-priority request's turn, `elapsed` into its wait: one such request at a
    /// time; a token that comes free meanwhile is taken at once (an idle budget drains the
    /// queue at its full rate), otherwise, once the previous turn is a spacing old, a token is
    /// reserved behind the object writes already waiting. Given up when the whole wait would
    /// exceed [`LOW_PRIORITY_PATIENCE`] (a token reserved by then is left unused).
    async fn starved_turn(
        &self,
        elapsed: std::time::Duration,
        method: &Method,
        path: &str,
    ) -> Result<(), BoxError> {
        let turn = async {
            let mut turn = self.starved.lock().await;
            loop {
                let free_in = match self.bucket.take_if_free() {
                    Ok(()) => return,
                    Err(d) => d,
                };
                let now = tokio::time::Instant::now();
                match *turn {
                    Some(at) if at > now => {
                        tokio::time::sleep(free_in.min(at.saturating_duration_since(now))).await;
                    }
                    _ => break,
                }
            }
            // Spaced from the start of this turn: a turn that waits its token longer than the
            // spacing delays the next by no more.
            *turn = Some(crate::meta::clock::far_or(
                tokio::time::Instant::now(),
                self.starved_spacing(),
            ));
            self.bucket.acquire().await;
        };
        let patience = LOW_PRIORITY_PATIENCE.saturating_sub(elapsed);
        tokio::time::timeout(patience, turn).await.map_err(|_| {
            Box::new(BudgetExhausted {
                method: method.clone(),
                path: path.to_string(),
            }) as BoxError
        })
    }

    /// The time between two starved low-priority turns: one token in every
    /// `1 / LOW_PRIORITY_SHARE` the budget gives out (bounded, for a tiny qps).
    fn starved_spacing(&self) -> std::time::Duration {
        let per_turn = 1.0 / (self.bucket.qps() * LOW_PRIORITY_SHARE);
        std::time::Duration::try_from_secs_f64(per_turn)
            .unwrap_or(LOW_PRIORITY_PATIENCE)
            .min(LOW_PRIORITY_PATIENCE)
    }

    fn reserve(&self) -> Option<std::time::Duration> {
        (!self.low_priority).then(|| self.bucket.reserve())
    }

    fn fenced(&self, method: &Method) -> bool {
        is_write(method) && self.fence.as_ref().is_some_and(|f| !f.may_write())
    }

    fn count<B>(&self, method: &Method, sent: StdInstant, res: &Result<Response<B>, BoxError>) {
        self.metrics
            .request_duration
            .get_or_create(&crate::metrics::VerbHostLabels {
                verb: method.to_string(),
                host: self.host.clone(),
            })
            .observe(sent.elapsed().as_secs_f64());
        let code = match res {
            Ok(r) => r.status().as_u16().to_string(),
            Err(_) => "<error>".to_string(),
        };
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                code,
                method: method.to_string(),
                host: self.host.clone(),
                controller: self.controller.clone(),
            })
            .inc();
    }
}

impl<S, B> Service<Request<Body>> for ControllerService<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        if shared.fenced(&method) {
            return Box::pin(async move { Err(Box::new(NotLeading { method, path }) as BoxError) });
        }
        req.headers_mut()
            .insert(http::header::USER_AGENT, shared.user_agent.clone());
        if let Some(b) = &shared.bearer {
            req.headers_mut()
                .insert(http::header::AUTHORIZATION, b.header());
        }
        // Reserved now, so that requests keep the order they were made in.
        let mut reserved = shared.reserve();
        // Events are not re-sent: under throttling they may wait or be dropped, and one must
        // not hold its task for an hour of patience and Retry-After.
        let mut again = if shared.low_priority {
            None
        } else {
            resendable(&req)
        };
        let mut inner = self.inner.clone();
        // Futures are lazy: nothing is sent before the throttle delay has passed.
        let mut fut = self.inner.call(req);
        Box::pin(async move {
            let mut retries = 0u32;
            loop {
                shared.throttle(reserved, &method, &path).await?;
                let sent = StdInstant::now();
                let res = fut.await.map_err(Into::into);
                shared.count(&method, sent, &res);
                if let (Ok(r), Some(b)) = (&res, &shared.bearer)
                    && r.status() == http::StatusCode::UNAUTHORIZED
                {
                    b.refused();
                }
                let wait = match &res {
                    Ok(r) if retries < MAX_RETRY_AFTER => retry_after(r),
                    _ => None,
                };
                let (Some(wait), Some(mut req)) = (wait, again.take()) else {
                    return res;
                };
                again = resendable(&req);
                retries = retries.saturating_add(1);
                if let Ok(r) = res {
                    shared
                        .metrics
                        .retries
                        .get_or_create(&crate::metrics::RetryLabels {
                            code: r.status().as_u16().to_string(),
                            method: method.to_string(),
                            host: shared.host.clone(),
                        })
                        .inc();
                    discard(r).await;
                }
                // A token renewed meanwhile is the one to send.
                if let Some(b) = &shared.bearer {
                    req.headers_mut()
                        .insert(http::header::AUTHORIZATION, b.header());
                }
                tracing::debug!(controller = %shared.controller, %method, %path, retries, ?wait, "the API server asked to retry later");
                tokio::time::sleep(wait).await;
                // A replica that stopped leading meanwhile sends no write.
                if shared.fenced(&method) {
                    return Err(Box::new(NotLeading { method, path }) as BoxError);
                }
                reserved = shared.reserve();
                fut = tower::ServiceExt::ready(&mut inner)
                    .await
                    .map_err(Into::into)?
                    .call(req);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server answering its n-th request with `script[n]` (the last entry from then on):
    /// (status, Retry-After). Returns its address and the instants requests arrived at.
    async fn scripted(
        script: Vec<(u16, Option<&'static str>)>,
    ) -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<StdInstant>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<std::sync::Mutex<Vec<StdInstant>>> = Arc::default();
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (log, script) = (Arc::clone(&log), script.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    loop {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {
                                let n = {
                                    let mut l = log.lock().unwrap();
                                    l.push(StdInstant::now());
                                    l.len() - 1
                                };
                                let (code, after) = script[n.min(script.len() - 1)];
                                let body = if code == 200 {
                                    r#"{"kind":"Status","apiVersion":"v1","status":"Success","code":200}"#.to_string()
                                } else {
                                    format!(
                                        r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","code":{code}}}"#
                                    )
                                };
                                let header = after
                                    .map(|a| format!("Retry-After: {a}\r\n"))
                                    .unwrap_or_default();
                                let resp = format!(
                                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\n{header}Content-Length: {}\r\n\r\n{body}",
                                    body.len()
                                );
                                if sock.write_all(resp.as_bytes()).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    fn client_for(addr: std::net::SocketAddr, qps: f32, burst: u32) -> (Client, Arc<Metrics>) {
        let config = Config::new(format!("http://{addr}").parse().unwrap());
        let metrics = Metrics::new();
        let client = build(&config, ClientSpec::new("test", qps, burst), &metrics).unwrap();
        (client, metrics)
    }

    async fn delete_pod(client: Client) -> Result<(), kube::Error> {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, "ns");
        pods.delete("p", &Default::default()).await.map(|_| ())
    }

    /// API priority and fairness' 429 with `Retry-After: 1`: the same request is sent again a
    /// second later, each time through the controller's budget, and the caller sees only the
    /// final answer.
    #[tokio::test]
    async fn retry_after_is_waited_out_then_resent() {
        let (addr, seen) = scripted(vec![(429, Some("1")), (503, Some("1")), (200, None)]).await;
        let (client, metrics) = client_for(addr, 100.0, 100);
        let t = StdInstant::now();
        delete_pod(client).await.unwrap();
        let at = seen.lock().unwrap().clone();
        assert_eq!(at.len(), 3);
        assert!(at[1].duration_since(at[0]) >= std::time::Duration::from_millis(990));
        assert!(at[2].duration_since(at[1]) >= std::time::Duration::from_millis(990));
        assert!(t.elapsed() < std::time::Duration::from_secs(4));
        let text = metrics.encode();
        assert!(
            text.contains("rest_client_request_retries_total{code=\"429\",method=\"DELETE\""),
            "{text}"
        );
        for code in ["429", "503", "200"] {
            assert!(
                text.contains(&format!(
                    "rest_client_requests_total{{code=\"{code}\",method=\"DELETE\""
                )),
                "{code}\n{text}"
            );
        }
    }

    /// At most MAX_RETRY_AFTER re-sends; then the 429 is the caller's. Without `Retry-After`
    /// nothing is re-sent, and evictions never are (a PodDisruptionBudget's refusal is the
    /// controller's to classify and back off from; kube's own retries held a worker for minutes).
    #[tokio::test]
    async fn retry_after_is_bounded_and_needs_the_header() {
        let (addr, seen) = scripted(vec![(429, Some("0"))]).await;
        let (client, _) = client_for(addr, 1000.0, 1000);
        let err = delete_pod(client).await.unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 429),
            "{err:?}"
        );
        assert_eq!(seen.lock().unwrap().len(), 1 + MAX_RETRY_AFTER as usize);

        let (addr, seen) = scripted(vec![(429, None)]).await;
        let (client, _) = client_for(addr, 1000.0, 1000);
        assert!(delete_pod(client).await.is_err());
        assert_eq!(seen.lock().unwrap().len(), 1);

        let (addr, seen) = scripted(vec![(429, Some("0"))]).await;
        let (client, _) = client_for(addr, 1000.0, 1000);
        let writer = crate::api::writer::Writer::from_client(client);
        assert!(writer.evict("ns", "p", None).await.is_err());
        assert_eq!(seen.lock().unwrap().len(), 1);

        // Events (low priority) are not re-sent either.
        let (addr, seen) = scripted(vec![(429, Some("0"))]).await;
        let config = Config::new(format!("http://{addr}").parse().unwrap());
        let spec = ClientSpec {
            low_priority: true,
            ..ClientSpec::new("test", 1000.0, 1000)
        };
        let client = build(&config, spec, &Metrics::new()).unwrap();
        assert!(delete_pod(client).await.is_err());
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    /// Each re-send takes a token: a 1 qps budget spaces them a second apart even when the
    /// server asks for no wait.
    #[tokio::test]
    async fn retries_take_tokens() {
        let (addr, seen) = scripted(vec![(429, Some("0")), (429, Some("0")), (200, None)]).await;
        let (client, _) = client_for(addr, 1.0, 1);
        delete_pod(client).await.unwrap();
        let at = seen.lock().unwrap().clone();
        assert_eq!(at.len(), 3);
        assert!(at[2].duration_since(at[0]) >= std::time::Duration::from_millis(1900));
    }

    fn shared_for(bucket: Arc<TokenBucket>, low_priority: bool) -> Arc<Shared> {
        Arc::new(Shared {
            bucket,
            low_priority,
            starved: tokio::sync::Mutex::new(None),
            user_agent: HeaderValue::from_static("test"),
            controller: "test".into(),
            host: "test".into(),
            metrics: Metrics::new().rest_client(),
            fence: None,
            bearer: None,
        })
    }

    /// Under a budget its object writes keep saturated, a controller's events wait a second,
    /// then take one turn at a time, at most LOW_PRIORITY_SHARE of the tokens; once the writes
    /// stop, the events left drain at the budget's full rate. Four writers and a hundred events
    /// at 20 qps: about 6 events in the first 4 s (four turns at once, as before, gave them
    /// about half), the other 94 within 5 s more (at a tenth they would take 47 s).
    #[tokio::test(start_paused = true)]
    async fn starved_events_take_their_share_then_drain_at_full_rate() {
        let bucket = Arc::new(TokenBucket::new(20.0, 1));
        let (writes, events) = (
            shared_for(Arc::clone(&bucket), false),
            shared_for(bucket, true),
        );
        let t = tokio::time::Instant::now();
        let busy = std::time::Duration::from_secs(4);
        let mut writers = Vec::new();
        for _ in 0..4 {
            let w = Arc::clone(&writes);
            writers.push(tokio::spawn(async move {
                let mut done = Vec::new();
                while t.elapsed() < busy {
                    w.throttle(w.reserve(), &Method::DELETE, "/p")
                        .await
                        .unwrap();
                    done.push(t.elapsed());
                }
                done
            }));
        }
        let mut senders = Vec::new();
        for _ in 0..100 {
            let e = Arc::clone(&events);
            senders.push(tokio::spawn(async move {
                e.throttle(e.reserve(), &Method::POST, "/events")
                    .await
                    .unwrap();
                t.elapsed()
            }));
        }
        let (mut w, mut e) = (Vec::new(), Vec::new());
        for task in writers {
            w.extend(task.await.unwrap());
        }
        for task in senders {
            e.push(task.await.unwrap());
        }
        let by = |times: &[std::time::Duration], secs: f64| {
            times.iter().filter(|d| d.as_secs_f64() <= secs).count()
        };
        assert_eq!(by(&e, 1.0), 0, "{e:?}");
        assert!((5..=7).contains(&by(&e, 4.0)), "{e:?}");
        assert!(by(&w, 4.0) >= 72, "{} writes by 4 s", by(&w, 4.0));
        assert!(by(&w, 4.0) + by(&e, 4.0) <= 81, "over the budget");
        assert_eq!(by(&e, 10.0), 100, "{e:?}");
    }

    #[test]
    fn retry_after_values() {
        let res = |code: u16, h: Option<&str>| {
            let mut b = Response::builder().status(code);
            if let Some(h) = h {
                b = b.header("Retry-After", h);
            }
            retry_after(&b.body(()).unwrap())
        };
        let s = std::time::Duration::from_secs;
        assert_eq!(res(429, Some("3")), Some(s(3)));
        assert_eq!(res(500, Some("1")), Some(s(1)));
        assert_eq!(res(429, Some("-5")), Some(s(0)));
        assert_eq!(res(429, Some("99999999999999999999")), None);
        assert_eq!(res(429, Some("9223372036854775807")), Some(RETRY_AFTER_CAP));
        assert_eq!(res(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(res(409, Some("1")), None);
        assert_eq!(res(429, None), None);
    }
}
