//! A loopback reverse proxy between one Pilothouse and the API server that delays the *watch*
//! streams of chosen resources, for scenarios that need a stale cache ("Pod watch delayed 5 s:
//! no double create or delete", "EndpointSlice watch delayed: no write from an outdated cache").
//!
//! Every other request (lists, gets, writes, watches of other resources) passes at once. A
//! delayed watch is a delay line, not a throttle: each response chunk is released `delay` after
//! it came from the API server, in order, so events arrive late but complete.
//!
//! The proxy has to see HTTP requests, so it terminates the client's connection. It serves plain
//! HTTP on 127.0.0.1: kube-rs accepts an `http://` server (its connector is `https_or_http`) and
//! still sends a bearer token over it, and the proxy needs no certificate of its own in the
//! kubeconfig. Upstream it speaks TLS, trusting `<cluster dir>/pki/ca.crt`. A kubeconfig that
//! authenticates by bearer token gets the shared listener (the token is forwarded as is); one
//! that authenticates by client certificate gets a listener of its own whose upstream
//! connections present that certificate (the API server tries x509 before tokens, so a shared
//! listener presenting a certificate would turn every token user into that identity).
//!
//! Each client connection gets its own upstream connection, opened on first use, of the same
//! protocol (kube-rs speaks HTTP/1.1 only; HTTP/2 clients are handled too).
//!
//! Pilothouse's informers start with a streaming list (`sendInitialEvents=true`), which is a
//! watch: with a delay set, a delayed resource's cache also syncs `delay` late. Set the delay
//! once Pilothouse has started its controllers to delay only the events that follow.
//! Held chunks are buffered without bound, and the response head (status, headers) is never
//! held: only the body.

use anyhow::{Context as _, Result, bail};
use base64::Engine;
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::client::conn::{http1, http2};
use hyper::header::{self, HeaderMap, HeaderName};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::config::Kubeconfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// What the proxy did so far, for a test to assert the delay really applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests forwarded (all kinds).
    pub requests: u64,
    /// Watch streams of a delayed resource opened through the delay line.
    pub delayed_watches: u64,
    /// Watch streams of other resources passed through undelayed.
    pub other_watches: u64,
    /// Response chunks of delayed watches held for a non-zero delay.
    pub chunks_delayed: u64,
    /// Response chunks of delayed watches passed while the delay was zero.
    pub chunks_passed: u64,
    /// Requests answered 502 because the API server could not be reached.
    pub upstream_errors: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    delayed_watches: AtomicU64,
    other_watches: AtomicU64,
    chunks_delayed: AtomicU64,
    chunks_passed: AtomicU64,
    upstream_errors: AtomicU64,
}

struct Shared {
    resources: Vec<String>,
    delay_nanos: AtomicU64,
    counters: Counters,
    stop: CancellationToken,
}

impl Shared {
    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::SeqCst))
    }
}

/// The API server and how to reach it as one identity.
struct Upstream {
    port: u16,
    /// ALPN `http/1.1` and `h2`: the same protocol as the client's connection.
    h1: tokio_rustls::TlsConnector,
    h2: tokio_rustls::TlsConnector,
}

/// A client certificate and key, as PEM.
#[derive(Clone, PartialEq, Eq)]
struct Identity {
    cert: Vec<u8>,
    key: Vec<u8>,
}

pub struct WatchDelay {
    shared: Arc<Shared>,
    /// For kubeconfigs written next to the cluster's own.
    dir: PathBuf,
    ca: PathBuf,
    api_port: u16,
    /// Listener for token-authenticated clients (no client certificate upstream).
    port: u16,
    /// Listeners presenting a client certificate upstream, one per identity.
    identities: Mutex<Vec<(Identity, u16)>>,
    /// `kubeconfig` is synchronous but may have to start a listener.
    runtime: tokio::runtime::Handle,
}

impl WatchDelay {
    /// Starts the proxy in front of `cluster`'s API server, delaying watches of `resources`
    /// (plural resource names as in the URL, e.g. `pods`, `endpointslices`). The delay starts
    /// at zero: set it with [`WatchDelay::set_delay`].
    pub async fn start(cluster: &crate::Cluster, resources: &[&str]) -> Result<WatchDelay> {
        let shared = Arc::new(Shared {
            resources: resources.iter().map(|r| r.to_string()).collect(),
            delay_nanos: AtomicU64::new(0),
            counters: Counters::default(),
            stop: CancellationToken::new(),
        });
        let ca = cluster.dir.join("pki/ca.crt");
        let api_port = cluster.apiserver_port()?;
        let upstream = Arc::new(upstream(api_port, &ca, None)?);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        tokio::spawn(accept(listener, upstream, Arc::clone(&shared)));
        Ok(WatchDelay {
            shared,
            dir: cluster.dir.clone(),
            ca,
            api_port,
            port,
            identities: Mutex::new(Vec::new()),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// Delays chunks of the chosen watches arriving from now on by `delay` (`ZERO`: pass
    /// through). Chunks already held keep their release time, and order is kept: a chunk is
    /// never released before the one ahead of it.
    pub fn set_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay_nanos.store(nanos, Ordering::SeqCst);
    }

    pub fn delay(&self) -> Duration {
        self.shared.delay()
    }

    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
        Stats {
            requests: get(&c.requests),
            delayed_watches: get(&c.delayed_watches),
            other_watches: get(&c.other_watches),
            chunks_delayed: get(&c.chunks_delayed),
            chunks_passed: get(&c.chunks_passed),
            upstream_errors: get(&c.upstream_errors),
        }
    }

    /// The port of the listener for token-authenticated clients.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A copy of the kubeconfig `base` (e.g. the ServiceAccount one, or the cluster's admin
    /// one), written as `<cluster dir>/<name>.kubeconfig`, whose current context points at the
    /// proxy. A client-certificate identity is moved from the client to the proxy's upstream
    /// connections; a token stays with the client and is forwarded.
    pub fn kubeconfig(&self, base: &Path, name: &str) -> Result<PathBuf> {
        let mut kc = Kubeconfig::read_from(base)
            .with_context(|| format!("reading kubeconfig {}", base.display()))?;
        let current = kc
            .current_context
            .clone()
            .with_context(|| format!("{}: no current-context", base.display()))?;
        let context = kc
            .contexts
            .iter()
            .find(|c| c.name == current)
            .and_then(|c| c.context.clone())
            .with_context(|| format!("{}: no context {current}", base.display()))?;
        let mut port = self.port;
        if let Some(user) = &context.user
            && let Some(auth) = kc
                .auth_infos
                .iter_mut()
                .find(|a| a.name == *user)
                .and_then(|a| a.auth_info.as_mut())
            && let Some(identity) = client_identity(auth)?
        {
            port = self.identity_port(identity)?;
            auth.client_certificate = None;
            auth.client_certificate_data = None;
            auth.client_key = None;
            auth.client_key_data = None;
        }
        let cluster = kc
            .clusters
            .iter_mut()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_mut())
            .with_context(|| format!("{}: no cluster {}", base.display(), context.cluster))?;
        cluster.server = Some(format!("http://127.0.0.1:{port}"));
        cluster.certificate_authority = None;
        cluster.certificate_authority_data = None;
        cluster.tls_server_name = None;
        cluster.insecure_skip_tls_verify = None;
        // JSON is YAML: kube-rs and kubectl read it as a kubeconfig.
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, serde_json::to_vec_pretty(&kc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// The listener presenting `identity` upstream, started on first use.
    fn identity_port(&self, identity: Identity) -> Result<u16> {
        let mut ids = self.identities.lock().expect("watch delay lock");
        if let Some((_, port)) = ids.iter().find(|(i, _)| *i == identity) {
            return Ok(*port);
        }
        let upstream = Arc::new(upstream(self.api_port, &self.ca, Some(&identity))?);
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        std_listener.set_nonblocking(true)?;
        let port = std_listener.local_addr()?.port();
        let _guard = self.runtime.enter();
        let listener = TcpListener::from_std(std_listener)?;
        self.runtime
            .spawn(accept(listener, upstream, Arc::clone(&self.shared)));
        ids.push((identity, port));
        Ok(port)
    }
}

impl Drop for WatchDelay {
    fn drop(&mut self) {
        // Ends the listeners, every client and upstream connection and every delay line.
        self.shared.stop.cancel();
    }
}

/// The client certificate and key of a kubeconfig user, if it has them. Read through serde:
/// `client-key-data` is a `secrecy` string, whose crate this one does not name, and kube's
/// serializer writes it out.
fn client_identity(auth: &kube::config::AuthInfo) -> Result<Option<Identity>> {
    let fields = serde_json::to_value(auth)?;
    let read = |name: &str| -> Result<Option<Vec<u8>>> {
        if let Some(data) = fields[format!("{name}-data")].as_str() {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .with_context(|| format!("decoding {name}-data"))?;
            return Ok(Some(pem));
        }
        match fields[name].as_str() {
            Some(f) => Ok(Some(
                std::fs::read(f).with_context(|| format!("reading {name} {f}"))?,
            )),
            None => Ok(None),
        }
    };
    match (read("client-certificate")?, read("client-key")?) {
        (Some(cert), Some(key)) => Ok(Some(Identity { cert, key })),
        (None, None) => Ok(None),
        _ => bail!("a client certificate without its key, or a key without its certificate"),
    }
}

/// TLS to the API server on `port`, trusting `ca`, presenting `identity` if given.
fn upstream(port: u16, ca: &Path, identity: Option<&Identity>) -> Result<Upstream> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))?
    {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match identity {
        Some(id) => {
            let certs = CertificateDer::pem_slice_iter(&id.cert)
                .collect::<Result<Vec<_>, _>>()
                .context("parsing the client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(&id.key).context("parsing the client key")?;
            builder.with_client_auth_cert(certs, key)?
        }
        None => builder.with_no_client_auth(),
    };
    let with_alpn = |proto: &[u8]| {
        let mut c = config.clone();
        c.alpn_protocols = vec![proto.to_vec()];
        tokio_rustls::TlsConnector::from(Arc::new(c))
    };
    Ok(Upstream {
        port,
        h1: with_alpn(b"http/1.1"),
        h2: with_alpn(b"h2"),
    })
}

async fn accept(listener: TcpListener, upstream: Arc<Upstream>, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let _ = tcp.set_nodelay(true);
        let conn = Arc::new(Connection {
            upstream: Arc::clone(&upstream),
            sender: tokio::sync::Mutex::new(None),
            stop: shared.stop.child_token(),
        });
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let stop = shared.stop.clone();
            let c = Arc::clone(&conn);
            let service = hyper::service::service_fn(move |req| {
                forward(Arc::clone(&c), Arc::clone(&shared), req)
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let served = builder.serve_connection(TokioIo::new(tcp), service);
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = served => {}
            }
            // The client is gone: so are its upstream connections.
            conn.stop.cancel();
        });
    }
}

/// One client connection and the upstream connection serving it.
struct Connection {
    upstream: Arc<Upstream>,
    sender: tokio::sync::Mutex<Option<Sender>>,
    /// Ends the upstream connection tasks with the client's connection.
    stop: CancellationToken,
}

enum Sender {
    H1(http1::SendRequest<Incoming>),
    H2(http2::SendRequest<Incoming>),
}

impl Connection {
    async fn connect(&self, h2: bool) -> Result<Sender> {
        let tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, self.upstream.port)).await?;
        let _ = tcp.set_nodelay(true);
        let tls = if h2 {
            &self.upstream.h2
        } else {
            &self.upstream.h1
        };
        let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        let io = TokioIo::new(tls.connect(name, tcp).await?);
        let stop = self.stop.clone();
        if h2 {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(async move {
                tokio::select! { _ = stop.cancelled() => {}, _ = conn => {} }
            });
            Ok(Sender::H2(sender))
        } else {
            let (sender, conn) = http1::handshake(io).await?;
            tokio::spawn(async move {
                tokio::select! { _ = stop.cancelled() => {}, _ = conn => {} }
            });
            Ok(Sender::H1(sender))
        }
    }

    /// Sends `req` upstream, on a fresh connection if the one held is closed (once more if the
    /// API server closed it just before the request went out: hyper hands the request back).
    async fn send(&self, mut req: Request<Incoming>) -> Result<Response<Incoming>> {
        let h2 = req.version() == Version::HTTP_2;
        for _ in 0..2 {
            let mut held = self.sender.lock().await;
            let open = match held.as_mut() {
                Some(Sender::H1(s)) => s.ready().await.is_ok(),
                Some(Sender::H2(s)) => s.ready().await.is_ok(),
                None => false,
            };
            if !open {
                *held = Some(self.connect(h2).await?);
            }
            // Released before the response comes: an HTTP/1.1 sender is ready again only once
            // the response body is done, an HTTP/2 one multiplexes.
            let sent = match held.as_mut().expect("just set") {
                Sender::H1(s) => futures::future::Either::Left(s.try_send_request(req)),
                Sender::H2(s) => futures::future::Either::Right(s.try_send_request(req)),
            };
            drop(held);
            match sent.await {
                Ok(res) => return Ok(res),
                Err(mut e) => match e.take_message() {
                    Some(back) => req = back,
                    None => return Err(e.into_error().into()),
                },
            }
        }
        bail!("the API server closed two connections in a row")
    }
}

async fn forward(
    conn: Arc<Connection>,
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let c = &shared.counters;
    c.requests.fetch_add(1, Ordering::Relaxed);
    let watch = watched_resource(req.uri()).map(str::to_string);
    let delayed = watch.as_ref().is_some_and(|r| shared.resources.contains(r));
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    // HTTP/1.1 upstream wants origin form (and a Host naming it); HTTP/2 needs scheme and
    // authority for its pseudo headers.
    let authority = format!("127.0.0.1:{}", conn.upstream.port);
    let uri = if parts.version == Version::HTTP_2 {
        format!("https://{authority}{path}")
    } else {
        parts.version = Version::HTTP_11;
        if let Ok(host) = authority.parse() {
            parts.headers.insert(header::HOST, host);
        }
        path
    };
    parts.uri = match uri.parse::<Uri>() {
        Ok(u) => u,
        Err(e) => return Ok(status(StatusCode::BAD_REQUEST, &e.to_string())),
    };
    let res = match conn.send(Request::from_parts(parts, body)).await {
        Ok(res) => res,
        Err(e) => {
            c.upstream_errors.fetch_add(1, Ordering::Relaxed);
            return Ok(status(
                StatusCode::BAD_GATEWAY,
                &format!("watch delay proxy: {e:#}"),
            ));
        }
    };
    let (mut parts, body) = res.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = if delayed {
        c.delayed_watches.fetch_add(1, Ordering::Relaxed);
        delay_line(body, Arc::clone(&shared), conn.stop.clone())
    } else {
        if watch.is_some() {
            c.other_watches.fetch_add(1, Ordering::Relaxed);
        }
        body.boxed()
    };
    Ok(Response::from_parts(parts, body))
}

/// Each frame of `body` is released `delay` (as it was when the frame arrived) after it arrived,
/// in order. A reader task takes frames as they come, so the API server never sees a slow
/// client and the delay does not grow with backpressure.
fn delay_line(mut body: Incoming, shared: Arc<Shared>, stop: CancellationToken) -> ProxyBody {
    type Held = (Instant, Result<Frame<Bytes>, hyper::Error>);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Held>();
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                // The client went away: stop reading, which drops the upstream stream.
                _ = tx.closed() => return,
                f = body.frame() => f,
            };
            // End of stream: dropping `tx` ends the delayed body after its last frame.
            let Some(frame) = next else { return };
            let delay = shared.delay();
            if frame.as_ref().is_ok_and(|f| f.is_data()) {
                let counter = if delay.is_zero() {
                    &shared.counters.chunks_passed
                } else {
                    &shared.counters.chunks_delayed
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            let failed = frame.is_err();
            if tx.send((Instant::now() + delay, frame)).is_err() || failed {
                return;
            }
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        let (release, frame) = rx.recv().await?;
        tokio::time::sleep_until(release).await;
        Some((frame, rx))
    });
    StreamBody::new(frames).boxed()
}

fn status(code: StatusCode, message: &str) -> Response<ProxyBody> {
    let body = http_body_util::Full::new(Bytes::from(message.to_string()))
        .map_err(|never| match never {})
        .boxed();
    let mut res = Response::new(body);
    *res.status_mut() = code;
    res
}

/// Headers that describe one hop's connection, not the message: never forwarded (HTTP/2
/// refuses them outright).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        header::TRAILER,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// The resource a request watches, if it is a watch: `watch=true` (or another true of Go's
/// `ParseBool`) in the query, streaming lists included, or the legacy `/watch/` path prefix.
/// `None` for everything else.
fn watched_resource(uri: &Uri) -> Option<&str> {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    let watch_query = uri.query().is_some_and(|q| {
        q.split('&').any(|pair| {
            matches!(
                pair.split_once('='),
                Some(("watch", "1" | "t" | "T" | "true" | "TRUE" | "True"))
            )
        })
    });
    if !legacy_watch && !watch_query {
        return None;
    }
    match rest {
        // namespaces/<ns>/<resource>[/<name>]
        ["namespaces", _ns, resource, ..] => Some(resource),
        // namespaces, namespaces/<name>, or a cluster-scoped <resource>[/<name>]
        [resource, ..] => Some(resource),
        [] => None,
    }
}

#[cfg(test)]
mod tests {
    use super::watched_resource;

    fn w(uri: &str) -> Option<String> {
        let uri: hyper::Uri = uri.parse().unwrap();
        watched_resource(&uri).map(str::to_string)
    }

    #[test]
    fn recognises_watches_by_resource() {
        assert_eq!(w("/api/v1/pods?watch=true"), Some("pods".into()));
        assert_eq!(
            w("/api/v1/namespaces/x/pods?labelSelector=a%3Db&watch=1&resourceVersion=5"),
            Some("pods".into())
        );
        assert_eq!(
            w(
                "/apis/discovery.k8s.io/v1/endpointslices?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
            ),
            Some("endpointslices".into())
        );
        assert_eq!(
            w("/apis/apps/v1/namespaces/x/statefulsets?watch=true"),
            Some("statefulsets".into())
        );
        assert_eq!(
            w("/api/v1/namespaces?watch=true"),
            Some("namespaces".into())
        );
        assert_eq!(
            w("/api/v1/namespaces/x?watch=true"),
            Some("namespaces".into())
        );
        assert_eq!(w("/api/v1/watch/namespaces/x/pods"), Some("pods".into()));
        assert_eq!(
            w("/api/v1/nodes?fieldSelector=metadata.name%3Dn&watch=true"),
            Some("nodes".into())
        );
    }

    #[test]
    fn everything_else_is_not_a_watch() {
        assert_eq!(w("/api/v1/pods"), None);
        assert_eq!(w("/api/v1/pods?watch=false"), None);
        assert_eq!(w("/api/v1/pods?limit=500"), None);
        assert_eq!(w("/api/v1/namespaces/x/pods/p"), None);
        assert_eq!(
            w("/apis/discovery.k8s.io/v1/namespaces/x/endpointslices?labelSelector=watch%3Dtrue"),
            None
        );
        assert_eq!(w("/version?watch=true"), None);
        assert_eq!(w("/apis?watch=true"), None);
    }
}
