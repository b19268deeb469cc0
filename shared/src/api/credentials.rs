//! `--use-service-account-credentials`, as kube-controller-manager does it: each controller
//! talks to the API server as its own ServiceAccount in kube-system (upstream's name, so the
//! built-in `system:controller:*` roles and bindings apply), with tokens from the TokenRequest
//! API, requested for an hour and renewed at 80 % of their lifetime; the ServiceAccount is
//! created when missing. The shared caches and leader election keep the process's own identity.

use http::HeaderValue;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Where upstream's controllers' ServiceAccounts live.
pub const NAMESPACE: &str = "kube-system";
/// kcm's TokenRequest lifetime.
const EXPIRATION_SECONDS: i64 = 3600;
/// After a failed renewal, try again this soon (the current token is still valid for a while).
const RETRY: Duration = Duration::from_secs(10);

/// The ServiceAccount kube-controller-manager 1.37 runs a controller as (`NewClient("...")` in
/// cmd/kube-controller-manager/app); a controller kcm does not have runs as its own name.
pub fn service_account(controller: &str) -> &str {
    match controller {
        "node-lifecycle-controller" | "taint-eviction-controller" => "node-controller",
        "endpointslice-mirroring-controller" => "endpointslicemirroring-controller",
        other => other,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("ServiceAccount {NAMESPACE}/{name}: {source}")]
    ServiceAccount { name: String, source: kube::Error },
    #[error("TokenRequest for {NAMESPACE}/{name}: {source}")]
    Token { name: String, source: kube::Error },
    #[error("TokenRequest for {NAMESPACE}/{name} returned no usable token")]
    Empty { name: String },
}

/// A bearer token that a background task keeps fresh; clients read the current value per request.
#[derive(Debug)]
pub struct BearerToken {
    header: Mutex<HeaderValue>,
    /// Woken when the API server refused the token (401): it is renewed at once.
    refused: tokio::sync::Notify,
}

impl BearerToken {
    /// The `Authorization` header value to send now.
    pub fn header(&self) -> HeaderValue {
        crate::lock(&self.header).clone()
    }

    /// The API server answered 401 to this token (revoked, or its ServiceAccount recreated):
    /// renew it now rather than at its schedule.
    pub fn refused(&self) {
        self.refused.notify_one();
    }

    fn set(&self, token: &str) -> bool {
        match HeaderValue::from_str(&format!("Bearer {token}")) {
            Ok(mut v) => {
                v.set_sensitive(true);
                *crate::lock(&self.header) = v;
                true
            }
            Err(_) => false,
        }
    }
}

/// Requests tokens for controllers' ServiceAccounts with the process's own client.
#[derive(Clone)]
pub struct ServiceAccountTokens {
    client: kube::Client,
    stop: CancellationToken,
}

impl ServiceAccountTokens {
    pub fn new(client: kube::Client, stop: CancellationToken) -> ServiceAccountTokens {
        ServiceAccountTokens { client, stop }
    }

    /// A token for `name`, kept fresh until the process stops.
    pub async fn acquire(&self, name: &str) -> Result<Arc<BearerToken>, CredentialsError> {
        self.ensure_service_account(name).await?;
        let (token, lifetime) = self.request(name).await?;
        let bearer = Arc::new(BearerToken {
            header: Mutex::new(HeaderValue::from_static("")),
            refused: tokio::sync::Notify::new(),
        });
        if !bearer.set(&token) {
            return Err(CredentialsError::Empty { name: name.into() });
        }
        let (this, held, name) = (self.clone(), Arc::clone(&bearer), name.to_string());
        tokio::spawn(async move {
            let mut wait = renew_after(lifetime);
            let mut renewed = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    _ = this.stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                    () = held.refused.notified() => {
                        // A burst of 401s renews once, and at most every RETRY.
                        let since = renewed.elapsed();
                        if since < RETRY {
                            tokio::select! {
                                _ = this.stop.cancelled() => return,
                                _ = tokio::time::sleep(RETRY.saturating_sub(since)) => {}
                            }
                        }
                        tracing::info!(service_account = %name, "the API server refused a controller's token; renewing it now");
                    }
                }
                renewed = tokio::time::Instant::now();
                wait = match this.renew(&name).await {
                    Ok((token, lifetime)) if held.set(&token) => {
                        tracing::debug!(service_account = %name, "service account token renewed");
                        renew_after(lifetime)
                    }
                    Ok(_) => RETRY,
                    Err(e) => {
                        tracing::warn!(error = %e, "renewing a controller's service account token failed; retrying");
                        RETRY
                    }
                };
            }
        });
        Ok(bearer)
    }

    /// A new token; if the ServiceAccount is gone (deleted by hand), it is created again first,
    /// as at start.
    async fn renew(&self, name: &str) -> Result<(String, Duration), CredentialsError> {
        match self.request(name).await {
            Err(CredentialsError::Token { source, .. })
                if crate::api::apierr::classify(&source)
                    == crate::api::apierr::ErrorKind::NotFound =>
            {
                tracing::warn!(service_account = %name, "the controller's ServiceAccount is gone; creating it again");
                self.ensure_service_account(name).await?;
                self.request(name).await
            }
            other => other,
        }
    }

    async fn ensure_service_account(&self, name: &str) -> Result<(), CredentialsError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), NAMESPACE);
        let err = |source| CredentialsError::ServiceAccount {
            name: name.into(),
            source,
        };
        if api.get_opt(name).await.map_err(err)?.is_some() {
            return Ok(());
        }
        let sa = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(NAMESPACE.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &sa).await {
            Ok(_) => Ok(()),
            Err(e) if crate::api::apierr::is_already_exists(&e) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// A new token and the lifetime the API server granted.
    async fn request(&self, name: &str) -> Result<(String, Duration), CredentialsError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), NAMESPACE);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(EXPIRATION_SECONDS),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer: TokenRequest = api
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .map_err(|source| CredentialsError::Token {
                name: name.into(),
                source,
            })?;
        let status = answer
            .status
            .ok_or_else(|| CredentialsError::Empty { name: name.into() })?;
        let token = status
            .token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| CredentialsError::Empty { name: name.into() })?;
        // The lifetime granted is the status's expiry (kcm renews from it); the API server may
        // cap the one asked for. Never more than asked for: with this host's clock behind the
        // API server's, the expiry read on it would last too long.
        let asked = answer
            .spec
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(EXPIRATION_SECONDS);
        let asked = Duration::from_secs(u64::try_from(asked).unwrap_or(0));
        let lifetime = match status.expiration_timestamp {
            Some(t) => {
                let left =
                    t.0.as_second()
                        .saturating_sub(crate::meta::clock::unix_now());
                Duration::from_secs(u64::try_from(left).unwrap_or(0)).min(asked)
            }
            None => asked,
        };
        Ok((token, lifetime))
    }
}

/// Renew at 80 % of the lifetime (kcm's DynamicControllerClientBuilder), at least a second on.
fn renew_after(lifetime: Duration) -> Duration {
    lifetime.mul_f64(0.8).max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_service_account_names() {
        assert_eq!(service_account("job-controller"), "job-controller");
        assert_eq!(service_account("cronjob-controller"), "cronjob-controller");
        assert_eq!(
            service_account("statefulset-controller"),
            "statefulset-controller"
        );
        assert_eq!(
            service_account("endpointslice-controller"),
            "endpointslice-controller"
        );
        assert_eq!(
            service_account("endpointslice-mirroring-controller"),
            "endpointslicemirroring-controller"
        );
        assert_eq!(
            service_account("node-lifecycle-controller"),
            "node-controller"
        );
        assert_eq!(
            service_account("taint-eviction-controller"),
            "node-controller"
        );
        assert_eq!(
            service_account("node-maintenance-controller"),
            "node-maintenance-controller"
        );
    }

    #[test]
    fn renewal_at_four_fifths() {
        assert_eq!(
            renew_after(Duration::from_secs(3600)),
            Duration::from_secs(2880)
        );
        assert_eq!(renew_after(Duration::ZERO), Duration::from_secs(1));
    }
}
