//! Secure serving as kube-controller-manager does it: HTTPS on `--bind-address:--secure-port`
//! (a self-signed certificate unless `--tls-cert-file`/`--tls-private-key-file` are given), with
//! authentication and authorization delegated to the API server (TokenReview, then
//! SubjectAccessReview for the request's path and verb). Paths in
//! `--authorization-always-allow-paths` (default `/healthz,/readyz,/livez`) skip both, as kcm's.
//! Plain HTTP exists only when `--metrics-bind-address` is set explicitly.

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
/// How long a TLS handshake may take: a stalled client must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on each cache; when full it is cleared (tokens are few in practice: scrapers).
const CACHE_MAX: usize = 1024;

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

/// A cache of answers with the time each was given.
type Answers<K, V> = Mutex<HashMap<K, (Instant, V)>>;

/// Delegated authentication and authorization through the API server, with kcm's caching.
pub struct Delegated {
    client: kube::Client,
    /// Bearer token -> user (`None`: not authenticated).
    tokens: Answers<String, Option<UserInfo>>,
    /// The whole review (user, uid, groups, extra, verb, path) -> allowed, as upstream's
    /// webhook authorizer keys its cache: two credentials of one name with other groups differ.
    decisions: Answers<String, bool>,
}

fn cached<K: std::hash::Hash + Eq, V: Clone>(cache: &Answers<K, V>, key: &K) -> Option<V> {
    let cache = crate::lock(cache);
    cache
        .get(key)
        .filter(|(at, _)| at.elapsed() < CACHE_TTL)
        .map(|(_, v)| v.clone())
}

fn remember<K: std::hash::Hash + Eq, V>(cache: &Answers<K, V>, key: K, v: V) {
    let mut cache = crate::lock(cache);
    if cache.len() >= CACHE_MAX {
        cache.clear();
    }
    cache.insert(key, (Instant::now(), v));
}

impl Delegated {
    pub fn new(client: kube::Client) -> Arc<Delegated> {
        Arc::new(Delegated {
            client,
            tokens: Mutex::new(HashMap::new()),
            decisions: Mutex::new(HashMap::new()),
        })
    }

    /// `Ok(None)`: the API server does not accept the token.
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, kube::Error> {
        if let Some(hit) = cached(&self.tokens, &token.to_string()) {
            return Ok(hit);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
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
        remember(&self.tokens, token.to_string(), user.clone());
        Ok(user)
    }

    async fn authorize(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<bool, kube::Error> {
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
        let key = serde_json::to_string(&review.spec).unwrap_or_default();
        if let Some(hit) = cached(&self.decisions, &key) {
            return Ok(hit);
        }
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        remember(&self.decisions, key, allowed);
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
            Err(e) => return Verdict::Failed(format!("authenticating the request: {e}")),
        },
    };
    match auth.authorize(&user, verb, path).await {
        Ok(true) => Verdict::Allow,
        Ok(false) => Verdict::Forbidden(format!(
            "forbidden: User \"{}\" cannot {verb} path \"{path}\"",
            user.username
        )),
        Err(e) => Verdict::Failed(format!("authorizing the request: {e}")),
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
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A client that never finishes its handshake holds nothing for long.
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                let Ok(Ok(tls)) = handshake.await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let app = app.clone();
                        async move {
                            use tower::ServiceExt;
                            app.oneshot(req.map(axum::body::Body::new)).await
                        }
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    });
    Ok(bound)
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
