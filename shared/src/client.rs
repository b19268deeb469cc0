//! API clients. As in kube-controller-manager, every controller gets its own client with its own
//! QPS/burst bucket and a user agent naming it, so one busy controller cannot starve another and
//! the API server's audit log attributes each request.
//!
//! Controller clients also carry the leader's *write fence*: a mutating request is refused locally
//! once this replica can no longer be sure it holds the Lease, so a partitioned leader stops
//! acting before any standby may take over.

use crate::metrics::{Metrics, RequestLabels, RestClientMetrics};
use crate::ratelimit::TokenBucket;
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

/// After this long without a free token, a low-priority request queues like any other, at most
/// [`LOW_PRIORITY_QUEUED`] at a time: events keep flowing under a saturated budget instead of
/// starving (upstream's share the client first come, first served), while object writes keep
/// most of it.
pub const LOW_PRIORITY_STARVED: std::time::Duration = std::time::Duration::from_secs(1);

/// Starved low-priority requests queued among the object writes at once.
pub const LOW_PRIORITY_QUEUED: usize = 4;

/// A low-priority request gave up: the controller's budget stayed taken by its object writes.
#[derive(Debug, thiserror::Error)]
#[error(
    "gave up {method} {path} after {LOW_PRIORITY_PATIENCE:?}: the controller's API budget stayed taken"
)]
pub struct BudgetExhausted {
    pub method: Method,
    pub path: String,
}

#[derive(Debug, thiserror::Error)]
#[error("refused {method} {path}: this replica is not (or no longer surely) the leader")]
pub struct NotLeading {
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
    pub bearer: Option<Arc<crate::credentials::BearerToken>>,
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
            starved: tokio::sync::Semaphore::new(LOW_PRIORITY_QUEUED),
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
    let mut config = config.clone();
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

struct Shared {
    bucket: Arc<TokenBucket>,
    low_priority: bool,
    /// At most [`LOW_PRIORITY_QUEUED`] starved low-priority requests hold a reservation.
    starved: tokio::sync::Semaphore,
    user_agent: HeaderValue,
    controller: String,
    host: String,
    metrics: Arc<RestClientMetrics>,
    fence: Option<Arc<dyn WriteFence>>,
    bearer: Option<Arc<crate::credentials::BearerToken>>,
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

impl<S, B> Service<Request<Body>> for ControllerService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
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
        if is_write(&method) && shared.fence.as_ref().is_some_and(|f| !f.may_write()) {
            let path = req.uri().path().to_string();
            return Box::pin(async move { Err(Box::new(NotLeading { method, path }) as BoxError) });
        }
        req.headers_mut()
            .insert(http::header::USER_AGENT, shared.user_agent.clone());
        if let Some(b) = &shared.bearer {
            req.headers_mut()
                .insert(http::header::AUTHORIZATION, b.header());
        }
        let delay = if shared.low_priority {
            None
        } else {
            Some(shared.bucket.reserve())
        };
        let path = req.uri().path().to_string();
        // Futures are lazy: nothing is sent before the throttle delay has passed.
        let fut = self.inner.call(req);
        Box::pin(async move {
            let t = StdInstant::now();
            let waited = match delay {
                Some(d) => {
                    if !d.is_zero() {
                        tokio::time::sleep(d).await;
                    }
                    !d.is_zero()
                }
                None => {
                    let mut waited = false;
                    while let Err(d) = shared.bucket.take_if_free() {
                        waited = true;
                        let elapsed = t.elapsed();
                        if elapsed < LOW_PRIORITY_STARVED {
                            tokio::time::sleep(d.min(LOW_PRIORITY_STARVED.saturating_sub(elapsed)))
                                .await;
                            continue;
                        }
                        // Starved: queue behind the writes already reserved, a few at a time.
                        let patience = LOW_PRIORITY_PATIENCE.saturating_sub(elapsed);
                        let permit = tokio::time::timeout(patience, shared.starved.acquire()).await;
                        let Ok(Ok(_permit)) = permit else {
                            return Err(Box::new(BudgetExhausted { method, path }) as BoxError);
                        };
                        if shared.bucket.take_if_free().is_err() {
                            tokio::time::sleep(shared.bucket.reserve()).await;
                        }
                        break;
                    }
                    waited
                }
            };
            if waited {
                shared
                    .metrics
                    .rate_limiter_wait
                    .get_or_create(&crate::metrics::NameLabel {
                        name: shared.controller.clone(),
                    })
                    .observe(t.elapsed().as_secs_f64());
            }
            let sent = StdInstant::now();
            let res = fut.await.map_err(Into::into);
            shared
                .metrics
                .request_duration
                .get_or_create(&crate::metrics::VerbHostLabels {
                    verb: method.to_string(),
                    host: shared.host.clone(),
                })
                .observe(sent.elapsed().as_secs_f64());
            let code = match &res {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            shared
                .metrics
                .requests
                .get_or_create(&RequestLabels {
                    code,
                    method: method.to_string(),
                    host: shared.host.clone(),
                    controller: shared.controller.clone(),
                })
                .inc();
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A 429 reaches the caller after one request: no transparent re-sends beneath the
    /// controller's budget (a PodDisruptionBudget's refusal must be classified, not retried).
    #[tokio::test]
    async fn a_429_is_answered_once_not_retried() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&served);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let count = Arc::clone(&count);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    loop {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {
                                count.fetch_add(1, Ordering::SeqCst);
                                let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Cannot evict pod as it would violate the pod's disruption budget.","reason":"TooManyRequests","code":429}"#;
                                let resp = format!(
                                    "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
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
        let config = Config::new(format!("http://{addr}").parse().unwrap());
        let metrics = Metrics::new();
        let client = build(&config, ClientSpec::new("test", 100.0, 100), &metrics).unwrap();
        let writer = crate::writer::Writer::from_client(client);
        let err = writer.evict("ns", "p", None).await.unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 429),
            "{err:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }
}
