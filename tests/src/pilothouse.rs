//! A real `pilothouse` binary as a child process, its log in a file.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The `pilothouse` binary the tests run: `$PILOTHOUSE_BIN`, else the workspace's debug build.
pub fn binary() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("PILOTHOUSE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| crate::repo_root().join("target"));
    let p = target.join("debug/pilothouse");
    if !p.exists() {
        bail!(
            "{} is missing: build it with `cargo build -p pilothouse` (the README's test command does)",
            p.display()
        );
    }
    Ok(p)
}

pub struct Pilothouse {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Pilothouse {
    /// Starts `pilothouse --kubeconfig=<kubeconfig> <args>`, logging to `<log_dir>/<name>.log`.
    /// Health and metrics bind to a free loopback port over plain HTTP, and the secure port is
    /// off, unless `args` say otherwise.
    pub fn spawn(
        name: &str,
        kubeconfig: &Path,
        log_dir: &Path,
        args: &[String],
    ) -> Result<Pilothouse> {
        let log = log_dir.join(format!("{name}.log"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(binary()?);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()));
        if !args.iter().any(|a| a.starts_with("--metrics-bind-address")) {
            cmd.arg("--metrics-bind-address=127.0.0.1:0");
        }
        // kcm's secure port 10257 would clash between replicas on one host: off unless asked.
        if !args.iter().any(|a| a.starts_with("--secure-port")) {
            cmd.arg("--secure-port=0");
        }
        cmd.args(args)
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        let child = cmd.spawn().context("spawning pilothouse")?;
        Ok(Pilothouse {
            name: name.to_string(),
            child,
            log,
            exited: None,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log_text().contains(needle) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: no {needle:?} in the log within {timeout:?}; log tail:\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The health/metrics address, read from the start-up log line.
    pub async fn metrics_addr(&self) -> Result<String> {
        self.wait_log("serving /healthz /readyz /metrics", Duration::from_secs(30))
            .await?;
        let text = self.log_text();
        let line = text
            .lines()
            .find(|l| l.contains("serving /healthz /readyz /metrics"))
            .unwrap_or_default();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("address="))
            .with_context(|| format!("no address in {line:?}"))?;
        Ok(addr.trim_matches('"').to_string())
    }

    /// GETs `path` from the health server: (status, body).
    pub async fn http_get(&self, path: &str) -> Result<(u16, String)> {
        let addr = self.metrics_addr().await?;
        http_get(&addr, path).await
    }

    /// The value of a metric sample line starting with `series` (e.g. `foo{name="x"}`).
    pub async fn metric(&self, series: &str) -> Result<Option<f64>> {
        let (_, body) = self.http_get("/metrics").await?;
        Ok(body
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok()))
    }

    pub fn signal(&self, sig: i32) -> Result<()> {
        let pid = self.pid().context("process already reaped")?;
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let rc = unsafe { libc::kill(pid as i32, sig) };
        if rc != 0 {
            bail!(
                "kill({pid}, {sig}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    pub fn sigkill(&self) -> Result<()> {
        self.signal(libc::SIGKILL)
    }

    pub fn sigterm(&self) -> Result<()> {
        self.signal(libc::SIGTERM)
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if let Some(s) = self.exited {
            return Ok(s);
        }
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(s) => {
                let s = s?;
                self.exited = Some(s);
                Ok(s)
            }
            Err(_) => bail!(
                "{} did not exit within {timeout:?}; log tail:\n{}",
                self.name,
                self.log_tail(40)
            ),
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        if self.exited.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(s)) => {
                self.exited = Some(s);
                false
            }
            _ => true,
        }
    }
}

/// A minimal HTTP/1.1 GET over a fresh connection (health endpoints are plain HTTP on loopback).
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    get_over(s, addr, path, None).await
}

/// The same GET over TLS (the secure port), with an optional bearer token. `roots`: the
/// certificates to trust; `None` accepts any certificate (a self-signed serving pair).
pub async fn https_get(
    addr: &str,
    path: &str,
    bearer: Option<&str>,
    roots: Option<&[rustls::pki_types::CertificateDer<'static>]>,
) -> Result<(u16, String)> {
    get_over(tls_connect(addr, roots).await?, addr, path, bearer).await
}

/// A TLS connection to `addr`, trusting `roots` (any certificate when `None`).
pub async fn tls_connect(
    addr: &str,
    roots: Option<&[rustls::pki_types::CertificateDer<'static>]>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let mut config = match roots {
        Some(certs) => {
            let mut store = rustls::RootCertStore::empty();
            for c in certs {
                store.add(c.clone())?;
            }
            builder.with_root_certificates(store).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string();
    let name = rustls::pki_types::ServerName::try_from(host)?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .with_context(|| format!("TLS handshake with {addr}"))
}

/// One HTTP/1.1 keep-alive connection over TLS, for many requests (a scraper's, or a flood's).
pub struct HttpsConnection {
    send: hyper::client::conn::http1::SendRequest<http_body_util::Empty<hyper::body::Bytes>>,
    host: String,
}

impl HttpsConnection {
    pub async fn open(addr: &str) -> Result<HttpsConnection> {
        let tls = tls_connect(addr, None).await?;
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok(HttpsConnection {
            send,
            host: addr.to_string(),
        })
    }

    /// GET `path`: its status, the body read to the end.
    pub async fn get(&mut self, path: &str, bearer: Option<&str>) -> Result<u16> {
        use http_body_util::BodyExt;
        let mut req = hyper::Request::get(path).header("host", &self.host);
        if let Some(t) = bearer {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        self.send.ready().await?;
        let resp = self
            .send
            .send_request(req.body(http_body_util::Empty::new())?)
            .await?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await?;
        Ok(status)
    }
}

async fn get_over<S>(
    mut s: S,
    addr: &str,
    path: &str,
    bearer: Option<&str>,
) -> Result<(u16, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    // A TLS peer may close without close_notify after the response: keep what was read.
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await?;
    if let Err(e) = read
        && buf.is_empty()
    {
        return Err(e.into());
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Trusts any server certificate (still checking the handshake's signatures): for a serving
/// certificate generated at start, which nobody can know in advance.
#[derive(Debug)]
struct AnyCertificate(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
