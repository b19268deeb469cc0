//! An in-test validating admission webhook: TLS on loopback, registered for one namespace, that
//! can delay chosen requests or reject them a set number of times, for scenarios that need a
//! misbehaving webhook (e.g. pod finalizer removal rejected for a while).

use anyhow::{Context, Result};
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Which requests a rule applies to. `None` fields match anything.
#[derive(Clone, Debug, Default)]
pub struct Match {
    /// Plural resource, e.g. `pods`.
    pub resource: Option<String>,
    /// e.g. `status`; `Some("")` matches only the main resource.
    pub sub_resource: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE`.
    pub operation: Option<String>,
    pub name: Option<String>,
    /// Substring of the requesting user's name (e.g. a controller's service account).
    pub user: Option<String>,
}

impl Match {
    /// Requests of `user` (a substring of its name) on `resource`/`sub_resource` (`""` for the
    /// main resource) with `operation`.
    pub fn by(resource: &str, sub_resource: &str, operation: &str, user: &str) -> Match {
        Match {
            resource: Some(resource.into()),
            sub_resource: Some(sub_resource.into()),
            operation: Some(operation.into()),
            user: Some(user.into()),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug)]
pub enum Action {
    /// Deny the next `times` matching requests with `message`.
    Reject { times: u32, message: String },
    /// Answer matching requests only after this long.
    Delay(Duration),
}

#[derive(Clone, Debug)]
struct Rule {
    on: Match,
    action: Action,
}

/// What the webhook saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub resource: String,
    pub sub_resource: String,
    pub operation: String,
    pub name: String,
    pub user: String,
    pub allowed: bool,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    seen: Vec<Seen>,
}

pub struct Webhook {
    name: String,
    client: Client,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

const PROBE_LABEL: &str = "pilothouse.test/webhook-probe";

impl Webhook {
    /// Starts the server and registers it for `namespace` on `resources` (plural names, with
    /// `/status`-style subresources as needed) and `operations`. Returns once the API server is
    /// seen calling it.
    pub async fn start(
        client: Client,
        namespace: &str,
        resources: &[&str],
        operations: &[&str],
    ) -> Result<Webhook> {
        Self::start_with_timeout(client, namespace, resources, operations, 30).await
    }

    /// [`Webhook::start`], with the API server waiting at most `timeout_seconds` (1-30) for an
    /// answer: a longer [`Webhook::delay`] then fails the request (failure policy `Fail`), as a
    /// webhook that times out does.
    pub async fn start_with_timeout(
        client: Client,
        namespace: &str,
        resources: &[&str],
        operations: &[&str],
        timeout_seconds: i32,
    ) -> Result<Webhook> {
        let cert = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])?;
        let cert_pem = cert.cert.pem();
        let key_der = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key_der)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = CancellationToken::new();
        let (st, s) = (Arc::clone(&state), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = s.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((tcp, _)) = accepted else { continue };
                let (acceptor, st) = (acceptor.clone(), Arc::clone(&st));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |req| handle(Arc::clone(&st), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                });
            }
        });

        let name = crate::unique("pilothouse-test-webhook");
        let mut resources: Vec<&str> = resources.to_vec();
        resources.push("configmaps");
        let mut operations: Vec<&str> = operations.to_vec();
        if !operations.contains(&"CREATE") {
            operations.push("CREATE");
        }
        let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": format!("{name}.pilothouse.test"),
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"), "caBundle": base64::engine::general_purpose::STANDARD.encode(cert_pem.as_bytes())},
                "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": operations, "resources": resources, "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": timeout_seconds
            }]
        }))?;
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        api.create(&PostParams::default(), &config)
            .await
            .context("registering the webhook")?;
        let hook = Webhook {
            name,
            client,
            state,
            stop,
        };
        hook.wait_active(namespace).await?;
        Ok(hook)
    }

    /// The API server picks up webhook configurations asynchronously: probe until it calls us.
    async fn wait_active(&self, namespace: &str) -> Result<()> {
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        crate::wait::until(
            "the webhook to be called",
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async {
                let probe: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"generateName": "webhook-probe-", "labels": {PROBE_LABEL: "true"}}
                }))?;
                match cms.create(&PostParams::default(), &probe).await {
                    Err(kube::Error::Api(s))
                        if s.message.contains("pilothouse test webhook probe") =>
                    {
                        Ok(Some(()))
                    }
                    Ok(created) => {
                        // Not active yet: the probe went through; clean it up.
                        let name = created.metadata.name.unwrap_or_default();
                        let _ = cms.delete(&name, &DeleteParams::default()).await;
                        Ok(None)
                    }
                    Err(e) => Err(e.into()),
                }
            },
        )
        .await
    }

    pub fn reject(&self, on: Match, times: u32, message: &str) {
        self.state.lock().expect("webhook lock").rules.push(Rule {
            on,
            action: Action::Reject {
                times,
                message: message.into(),
            },
        });
    }

    pub fn delay(&self, on: Match, by: Duration) {
        self.state.lock().expect("webhook lock").rules.push(Rule {
            on,
            action: Action::Delay(by),
        });
    }

    pub fn clear(&self) {
        self.state.lock().expect("webhook lock").rules.clear();
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().expect("webhook lock").seen.clone()
    }

    /// Unregisters the webhook (and stops serving).
    pub async fn remove(self) -> Result<()> {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        api.delete(&self.name, &DeleteParams::default()).await?;
        self.stop.cancel();
        Ok(())
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn matches(m: &Match, s: &Seen) -> bool {
    m.resource.as_ref().is_none_or(|r| *r == s.resource)
        && m.sub_resource.as_ref().is_none_or(|r| *r == s.sub_resource)
        && m.operation.as_ref().is_none_or(|o| *o == s.operation)
        && m.name.as_ref().is_none_or(|n| *n == s.name)
        && m.user.as_ref().is_none_or(|u| s.user.contains(u.as_str()))
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let r = &review["request"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut seen = Seen {
        resource: text(&r["resource"]["resource"]),
        sub_resource: text(&r["subResource"]),
        operation: text(&r["operation"]),
        name: text(&r["name"]),
        user: text(&r["userInfo"]["username"]),
        allowed: true,
    };
    let probe =
        seen.resource == "configmaps" && r["object"]["metadata"]["labels"][PROBE_LABEL] == "true";
    let (delay, denial) = if probe {
        (None, Some("pilothouse test webhook probe".to_string()))
    } else {
        let mut st = state.lock().expect("webhook lock");
        let mut delay = None;
        let mut denial = None;
        for rule in st.rules.iter_mut().filter(|rule| matches(&rule.on, &seen)) {
            match &mut rule.action {
                Action::Delay(d) => delay = Some(*d),
                Action::Reject { times, message } if *times > 0 && denial.is_none() => {
                    *times -= 1;
                    denial = Some(message.clone());
                }
                Action::Reject { .. } => {}
            }
        }
        (delay, denial)
    };
    seen.allowed = denial.is_none();
    // Recorded on arrival: the API server gives up on a delayed answer and drops the
    // connection, and this future with it.
    if !probe {
        state.lock().expect("webhook lock").seen.push(seen);
    }
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let mut response = json!({"uid": r["uid"], "allowed": denial.is_none()});
    if let Some(message) = denial {
        response["status"] = json!({"code": 403, "message": message});
    }
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(out.to_string())))
        .expect("static response parts"))
}
