//! Secure serving as kube-controller-manager does it: HTTPS on `--bind-address:--secure-port`
//! (a self-signed certificate unless `--tls-cert-file`/`--tls-private-key-file` are given), with
//! authentication and authorization delegated to the API server (TokenReview, then
//! SubjectAccessReview for the request's path and verb). Paths in
//! `--authorization-always-allow-paths` (default `/healthz,/readyz,/livez`) skip both, as kcm's.
//! Plain HTTP exists only when `--metrics-bind-address` is set explicitly.

use crate::serving::connections::{Conn, Connections, Limits};
use crate::serving::health::{self, Health};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// kcm's delegated authentication and authorization cache lifetimes (10 s each).
const CACHE_TTL: Duration = Duration::from_secs(10);
/// Bound on each cache; when full, expired answers go first, then the oldest.
const CACHE_MAX: usize = 1024;
/// A credential granted within this long is *known*: its next review skips the strangers' lane.
const KNOWN_FOR: Duration = Duration::from_secs(600);
/// Reviews of credentials never granted before, in flight at once; more wait at most
/// [`STRANGER_WAIT`], then get 429. A flood of random tokens or paths thus costs the API server
/// a bounded rate and never queues ahead of a known scraper's review.
const STRANGER_REVIEWS: usize = 8;
const STRANGER_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("TLS: {0}")]
    Tls(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[derive(Clone, Debug)]
pub struct SecureServing {
    pub bind_address: String,
    pub port: u16,
    pub cert_file: String,
    pub key_file: String,
    pub always_allow_paths: Vec<String>,
}

/// The requester, as the API server's TokenReview named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    fn anonymous() -> UserInfo {
        UserInfo {
            username: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

/// A credential or a review as a cache key: a SHA-256 digest, so no token is kept in memory.
type Key = [u8; 32];

fn key_of(text: &str) -> Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut key = [0; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// Answers of one kind of review with the time each was given. Grants and refusals are kept
/// apart, so a flood of refused junk never evicts a scraper's grant.
struct Answers<V> {
    granted: Mutex<HashMap<Key, (Instant, V)>>,
    refused: Mutex<HashMap<Key, (Instant, ())>>,
}

/// What the cache knows of a key.
enum Cached<V> {
    Granted(V),
    Refused,
    /// Not answered within the TTL; `known` when it was granted within [`KNOWN_FOR`].
    Ask {
        known: bool,
    },
}

fn bounded_insert<V>(map: &mut HashMap<Key, (Instant, V)>, key: Key, v: V, keep: Duration) {
    if map.len() >= CACHE_MAX && !map.contains_key(&key) {
        map.retain(|_, (at, _)| at.elapsed() < keep);
        if map.len() >= CACHE_MAX
            && let Some(oldest) = map.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
    }
    map.insert(key, (Instant::now(), v));
}

impl<V: Clone> Answers<V> {
    fn new() -> Self {
        Answers {
            granted: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &Key) -> Cached<V> {
        // A fresh refusal wins over an older grant (a revoked token, a binding removed).
        if let Some((at, ())) = crate::lock(&self.refused).get(key)
            && at.elapsed() < CACHE_TTL
        {
            return Cached::Refused;
        }
        if let Some((at, v)) = crate::lock(&self.granted).get(key) {
            return if at.elapsed() < CACHE_TTL {
                Cached::Granted(v.clone())
            } else {
                Cached::Ask {
                    known: at.elapsed() < KNOWN_FOR,
                }
            };
        }
        Cached::Ask { known: false }
    }

    fn remember(&self, key: Key, answer: Option<V>) {
        match answer {
            Some(v) => {
                crate::lock(&self.refused).remove(&key);
                bounded_insert(&mut crate::lock(&self.granted), key, v, KNOWN_FOR);
            }
            // Refused now: no longer known either, so its next review waits in the strangers'
            // lane like any junk.
            None => {
                crate::lock(&self.granted).remove(&key);
                bounded_insert(&mut crate::lock(&self.refused), key, (), CACHE_TTL);
            }
        }
    }
}

/// Why a review was not asked.
#[derive(Debug)]
enum ReviewError {
    Api(kube::Error),
    /// The strangers' lane is full: the caller is told to come back (429).
    Busy,
}

/// Delegated authentication and authorization through the API server, with kcm's caching.
pub struct Delegated {
    client: kube::Client,
    /// Bearer token -> user.
    tokens: Answers<UserInfo>,
    /// The whole review (user, uid, groups, extra, verb, path) -> allowed, as upstream's
    /// webhook authorizer keys its cache: two credentials of one name with other groups differ.
    decisions: Answers<()>,
    strangers: tokio::sync::Semaphore,
}

impl Delegated {
    pub fn new(client: kube::Client) -> Arc<Delegated> {
        Arc::new(Delegated {
            client,
            tokens: Answers::new(),
            decisions: Answers::new(),
            strangers: tokio::sync::Semaphore::new(STRANGER_REVIEWS),
        })
    }

    /// Runs `review` at once for a known credential, else through the strangers' lane.
    async fn ask<T>(
        &self,
        known: bool,
        review: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ReviewError> {
        let _permit = if known {
            None
        } else {
            match tokio::time::timeout(STRANGER_WAIT, self.strangers.acquire()).await {
                Ok(Ok(permit)) => Some(permit),
                _ => return Err(ReviewError::Busy),
            }
        };
        review.await.map_err(ReviewError::Api)
    }

    /// `Ok(None)`: the API server does not accept the token.
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let key = key_of(token);
        let known = match self.tokens.get(&key) {
            Cached::Granted(user) => return Ok(Some(user)),
            Cached::Refused => return Ok(None),
            Cached::Ask { known } => known,
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                ..Default::default()
            },
            ..Default::default()
        };
        let api = Api::<TokenReview>::all(self.client.clone());
        let answer = self
            .ask(known, api.create(&PostParams::default(), &review))
            .await?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .map(|u| UserInfo {
                username: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            });
        self.tokens.remember(key, user.clone());
        Ok(user)
    }

    async fn authorize(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<bool, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let key = key_of(&serde_json::to_string(&review.spec).unwrap_or_default());
        let known = match self.decisions.get(&key) {
            Cached::Granted(()) => return Ok(true),
            Cached::Refused => return Ok(false),
            Cached::Ask { known } => known,
        };
        let api = Api::<SubjectAccessReview>::all(self.client.clone());
        let answer = self
            .ask(known, api.create(&PostParams::default(), &review))
            .await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        self.decisions.remember(key, allowed.then_some(()));
        Ok(allowed)
    }
}

/// What the filter decided for one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// 401: a token the API server does not accept.
    Unauthorized,
    /// 403, with kcm's message.
    Forbidden(String),
    /// 429: too many reviews of unknown credentials in flight.
    Busy,
    /// 500: the API server could not be asked.
    Failed(String),
}

/// A bearer token from an `Authorization` header (`Bearer` case-insensitive, as Go's).
pub fn bearer_token(value: Option<&str>) -> Option<&str> {
    let v = value?.trim();
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The API server's verb for a non-resource request (kcm's request-info: the method, lowercase).
fn verb_of(method: &axum::http::Method) -> String {
    method.as_str().to_ascii_lowercase()
}

async fn verdict(auth: &Delegated, token: Option<&str>, verb: &str, path: &str) -> Verdict {
    let user = match token {
        None => UserInfo::anonymous(),
        Some(t) => match auth.authenticate(t).await {
            Ok(Some(u)) => u,
            Ok(None) => return Verdict::Unauthorized,
            Err(ReviewError::Busy) => return Verdict::Busy,
            Err(ReviewError::Api(e)) => {
                return Verdict::Failed(format!("authenticating the request: {e}"));
            }
        },
    };
    match auth.authorize(&user, verb, path).await {
        Ok(true) => Verdict::Allow,
        Ok(false) => Verdict::Forbidden(format!(
            "forbidden: User \"{}\" cannot {verb} path \"{path}\"",
            user.username
        )),
        Err(ReviewError::Busy) => Verdict::Busy,
        Err(ReviewError::Api(e)) => Verdict::Failed(format!("authorizing the request: {e}")),
    }
}

/// Whether `path` is in the always-allowed list (`/p` exactly, or `/p/*` as a prefix, as kcm's).
pub fn always_allowed(list: &[String], path: &str) -> bool {
    list.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => p == path,
    })
}

#[derive(Clone)]
struct Filter {
    auth: Arc<Delegated>,
    always_allow: Arc<Vec<String>>,
}

async fn filter(State(f): State<Filter>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if always_allowed(&f.always_allow, &path) {
        return next.run(req).await;
    }
    let token = bearer_token(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .map(str::to_string);
    match verdict(&f.auth, token.as_deref(), &verb_of(req.method()), &path).await {
        Verdict::Allow => next.run(req).await,
        Verdict::Unauthorized => (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response(),
        Verdict::Forbidden(m) => (StatusCode::FORBIDDEN, format!("{m}\n")).into_response(),
        Verdict::Busy => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "Too many requests, please try again later.\n",
        )
            .into_response(),
        Verdict::Failed(m) => {
            tracing::warn!(path, error = %m, "delegated authentication or authorization failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error\n").into_response()
        }
    }
}

fn tls_config(opts: &SecureServing) -> Result<rustls::ServerConfig, ServingError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls = |e: &dyn std::fmt::Display| ServingError::Tls(e.to_string());
    let (chain, key) = if opts.cert_file.is_empty() && opts.key_file.is_empty() {
        // kcm generates a self-signed pair for its bind address and `localhost`.
        let mut names = vec!["localhost".to_string()];
        if !opts.bind_address.is_empty() && opts.bind_address != "0.0.0.0" {
            names.push(opts.bind_address.clone());
        }
        let cert = rcgen::generate_simple_self_signed(names).map_err(|e| tls(&e))?;
        let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der()).map_err(|e| tls(&e))?;
        (vec![cert.cert.der().clone()], key)
    } else if opts.cert_file.is_empty() || opts.key_file.is_empty() {
        return Err(ServingError::Tls(
            "--tls-cert-file and --tls-private-key-file must be given together".into(),
        ));
    } else {
        let chain = CertificateDer::pem_file_iter(&opts.cert_file)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| ServingError::Tls(format!("{}: {e}", opts.cert_file)))?;
        let key = PrivateKeyDer::from_pem_file(&opts.key_file)
            .map_err(|e| ServingError::Tls(format!("{}: {e}", opts.key_file)))?;
        (chain, key)
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| tls(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Binds the secure port and serves /healthz, /livez, /readyz and /metrics behind the delegated
/// filter until `stop`. Returns the bound address.
pub async fn serve(
    opts: &SecureServing,
    health: Health,
    auth: Arc<Delegated>,
    stop: CancellationToken,
) -> Result<SocketAddr, ServingError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(opts)?));
    let host = if opts.bind_address.is_empty() {
        "0.0.0.0"
    } else {
        opts.bind_address.as_str()
    };
    let listener = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => tokio::net::TcpListener::bind(SocketAddr::new(ip, opts.port)).await?,
        Err(_) => tokio::net::TcpListener::bind((host, opts.port)).await?,
    };
    let bound = listener.local_addr()?;
    let app = health::router(health).layer(axum::middleware::from_fn_with_state(
        Filter {
            auth,
            always_allow: Arc::new(opts.always_allow_paths.clone()),
        },
        filter,
    ));
    let connections = Connections::new(Limits::default());
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: do not spin.
                    tracing::warn!(error = %e, "secure port: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            // At the cap the longest-idle connection makes way; refused only if all are busy.
            let Some(conn) = connections.admit() else {
                tracing::warn!(
                    open = connections.len(),
                    "secure port: every connection is serving a request; refusing a new one"
                );
                continue;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(serve_connection(acceptor, tcp, conn, app));
        }
    });
    Ok(bound)
}

pin_project_lite::pin_project! {
    /// A response body that keeps its connection marked busy until it is dropped.
    struct Held {
        #[pin]
        body: axum::body::Body,
        _busy: crate::serving::connections::Busy,
    }
}

impl http_body::Body for Held {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// One connection: the TLS handshake, then HTTP/1.1 or HTTP/2 until the peer closes it, it has
/// been idle too long, or a newer connection took its place.
async fn serve_connection(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    conn: Conn,
    app: axum::Router,
) {
    let limits = conn.limits();
    let handshake = tokio::time::timeout(limits.handshake, acceptor.accept(tcp));
    let tls = tokio::select! {
        _ = conn.close.cancelled() => return,
        tls = handshake => match tls {
            Ok(Ok(tls)) => tls,
            _ => return,
        },
    };
    let conn = Arc::new(conn);
    let service = {
        let conn = Arc::clone(&conn);
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let (app, busy) = (app.clone(), conn.begin());
            async move {
                use tower::ServiceExt;
                // Busy until the body is written: a scrape being sent is not idle.
                let response = app.oneshot(req.map(axum::body::Body::new)).await;
                response.map(|r| r.map(|body| axum::body::Body::new(Held { body, _busy: busy })))
            }
        })
    };
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder.http2().timer(hyper_util::rt::TokioTimer::new());
    let served = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), service);
    tokio::select! {
        _ = served => {}
        // Dropping the connection closes it; nothing is in flight when it is idle or evicted.
        () = conn.idle_or_evicted() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_as_go_reads_them() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(None), None);
    }

    #[test]
    fn always_allowed_paths_exact_or_prefix() {
        let list: Vec<String> = ["/healthz", "/readyz", "/livez", "/debug/*"]
            .map(String::from)
            .to_vec();
        assert!(always_allowed(&list, "/healthz"));
        assert!(always_allowed(&list, "/debug/pprof"));
        assert!(!always_allowed(&list, "/metrics"));
        assert!(!always_allowed(&list, "/healthz/extra"));
    }

    #[test]
    fn certificate_files_must_come_together() {
        let opts = |c: &str, k: &str| SecureServing {
            bind_address: "127.0.0.1".into(),
            port: 0,
            cert_file: c.into(),
            key_file: k.into(),
            always_allow_paths: vec![],
        };
        assert!(tls_config(&opts("", "")).is_ok());
        assert!(matches!(
            tls_config(&opts("/x.crt", "")),
            Err(ServingError::Tls(_))
        ));
        let e = tls_config(&opts("/nonexistent.crt", "/nonexistent.key")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent.crt"), "{e}");
    }
}
