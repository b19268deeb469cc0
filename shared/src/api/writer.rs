//! The writer seam: every API request a controller makes (writes, and the few reads the caches
//! cannot serve) goes through [`Writer`], so the same controller code runs against the real
//! rate-limited, leadership-fenced client and against the test kit's recording writer.
//!
//! The seam itself is one object-safe call, [`Transport::call`], over a plain description of the
//! request ([`Call`]); [`Writer`] adds the typed methods controllers use.

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::Arc;

/// Which API resource a call is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub api_version: String,
    pub kind: String,
    /// The plural resource name, e.g. `pods`.
    pub plural: String,
    /// Empty for cluster-scoped resources.
    pub namespace: String,
    /// Empty for a create.
    pub name: String,
    /// E.g. `status`, `eviction`.
    pub subresource: Option<String>,
}

impl Target {
    pub fn of<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> Target {
        Target {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            subresource: None,
        }
    }

    pub fn subresource(mut self, sub: &str) -> Target {
        self.subresource = Some(sub.to_string());
        self
    }

    /// `namespace/name` (or `name`), as cache keys are written.
    pub fn key(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }

    fn url_path(&self) -> String {
        let (group, version) = match self.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", self.api_version.as_str()),
        };
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        if self.namespace.is_empty() {
            format!("{prefix}/{}", self.plural)
        } else {
            format!("{prefix}/namespaces/{}/{}", self.namespace, self.plural)
        }
    }
}

/// The kind of patch, as the Content-Type names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Strategic,
    Json,
}

/// One API request, described as data so a recording writer can keep it.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Get(Target),
    Create(Target, Value),
    /// A create whose body must reach the API server byte for byte: a `RawExtension` field is
    /// stored as the bytes received (a ControllerRevision's `data`, whose hash is of its bytes).
    CreateRaw(Target, Vec<u8>),
    /// A create with `dryRun=All`: the API server defaults, validates and admits the object and
    /// answers with it, persisting nothing (ST-15 asks it for a template's defaults).
    DryRunCreate(Target, Value),
    /// A PUT of the whole object (or subresource); its `metadata.resourceVersion` is the
    /// precondition.
    Replace(Target, Value),
    Patch(Target, PatchKind, Value),
    /// `preconditions` as the API's `DeleteOptions.preconditions`; `propagation` as
    /// `propagationPolicy`.
    Delete {
        target: Target,
        uid: Option<String>,
        resource_version: Option<String>,
        propagation: Option<String>,
    },
    /// A delete with an explicit `gracePeriodSeconds` (kept apart from [`Call::Delete`], whose
    /// shape callers build), with an optional UID precondition.
    DeleteGraceful {
        target: Target,
        uid: Option<String>,
        resource_version: Option<String>,
        propagation: Option<String>,
        grace_period_seconds: i64,
    },
}

impl Call {
    pub fn target(&self) -> &Target {
        match self {
            Call::Get(t)
            | Call::Create(t, _)
            | Call::CreateRaw(t, _)
            | Call::DryRunCreate(t, _)
            | Call::Replace(t, _)
            | Call::Patch(t, _, _) => t,
            Call::Delete { target, .. } | Call::DeleteGraceful { target, .. } => target,
        }
    }

    /// The HTTP verb, for logs and test assertions.
    pub fn verb(&self) -> &'static str {
        match self {
            Call::Get(_) => "get",
            Call::Create(..) | Call::CreateRaw(..) | Call::DryRunCreate(..) => "create",
            Call::Replace(..) => "update",
            Call::Patch(..) => "patch",
            Call::Delete { .. } | Call::DeleteGraceful { .. } => "delete",
        }
    }
}

/// Sends calls. Implemented by [`Client`] (the real, rate-limited and fenced client) and by the
/// test kit's recording writer.
pub trait Transport: Send + Sync + 'static {
    /// The response body: the object, or for a delete the object or a `Status`.
    fn call(&self, call: Call) -> BoxFuture<'_, Result<Value, kube::Error>>;
}

/// `DeleteOptions` with the preconditions and propagation policy of a delete.
fn delete_params(
    uid: &Option<String>,
    resource_version: &Option<String>,
    propagation: &Option<String>,
) -> DeleteParams {
    let mut dp = DeleteParams::default();
    if uid.is_some() || resource_version.is_some() {
        dp.preconditions = Some(kube::api::Preconditions {
            uid: uid.clone(),
            resource_version: resource_version.clone(),
        });
    }
    dp.propagation_policy = match propagation.as_deref() {
        Some("Background") => Some(kube::api::PropagationPolicy::Background),
        Some("Foreground") => Some(kube::api::PropagationPolicy::Foreground),
        Some("Orphan") => Some(kube::api::PropagationPolicy::Orphan),
        _ => None,
    };
    dp
}

fn build_request(call: &Call) -> Result<http::Request<Vec<u8>>, kube::Error> {
    let t = call.target();
    let req = Request::new(t.url_path());
    let body = |v: &Value| serde_json::to_vec(v).map_err(kube::Error::SerdeError);
    let built = match (call, t.subresource.as_deref()) {
        (Call::Get(_), None) => req.get(&t.name, &Default::default()),
        (Call::Get(_), Some(sub)) => req.get_subresource(sub, &t.name),
        (Call::Create(_, v), None) => req.create(&PostParams::default(), body(v)?),
        (Call::CreateRaw(_, bytes), None) => req.create(&PostParams::default(), bytes.clone()),
        (Call::CreateRaw(_, bytes), Some(sub)) => {
            req.create_subresource(sub, &t.name, &PostParams::default(), bytes.clone())
        }
        (Call::Create(_, v), Some(sub)) => {
            req.create_subresource(sub, &t.name, &PostParams::default(), body(v)?)
        }
        (Call::DryRunCreate(_, v), None) => {
            let pp = PostParams {
                dry_run: true,
                ..Default::default()
            };
            req.create(&pp, body(v)?)
        }
        (Call::DryRunCreate(_, v), Some(sub)) => {
            let pp = PostParams {
                dry_run: true,
                ..Default::default()
            };
            req.create_subresource(sub, &t.name, &pp, body(v)?)
        }
        (Call::Replace(_, v), None) => req.replace(&t.name, &PostParams::default(), body(v)?),
        (Call::Replace(_, v), Some(sub)) => {
            req.replace_subresource(sub, &t.name, &PostParams::default(), body(v)?)
        }
        (Call::Patch(_, kind, v), sub) => {
            let patch = match kind {
                PatchKind::Merge => Patch::Merge(v),
                PatchKind::Strategic => Patch::Strategic(v),
                PatchKind::Json => Patch::Json::<&Value>(
                    serde_json::from_value(v.clone()).map_err(kube::Error::SerdeError)?,
                ),
            };
            let pp = PatchParams::default();
            match sub {
                None => req.patch(&t.name, &pp, &patch),
                Some(sub) => req.patch_subresource(sub, &t.name, &pp, &patch),
            }
        }
        (
            Call::Delete {
                uid,
                resource_version,
                propagation,
                ..
            },
            _,
        ) => {
            let dp = delete_params(uid, resource_version, propagation);
            req.delete(&t.name, &dp)
        }
        (
            Call::DeleteGraceful {
                uid,
                resource_version,
                propagation,
                grace_period_seconds,
                ..
            },
            _,
        ) => {
            let mut dp = delete_params(uid, resource_version, propagation);
            // The API's int64, clamped into kube's u32 (the API validates >= 0).
            dp.grace_period_seconds =
                Some(u32::try_from((*grace_period_seconds).max(0)).unwrap_or(u32::MAX));
            req.delete(&t.name, &dp)
        }
    };
    built.map_err(kube::Error::BuildRequest)
}

impl Transport for Client {
    fn call(&self, call: Call) -> BoxFuture<'_, Result<Value, kube::Error>> {
        async move {
            let req = build_request(&call)?;
            self.request::<Value>(req).await
        }
        .boxed()
    }
}

/// The typed face of the seam, cheap to clone.
#[derive(Clone)]
pub struct Writer(Arc<dyn Transport>);

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer")
    }
}

fn to_value<T: Serialize>(obj: &T) -> Result<Value, kube::Error> {
    serde_json::to_value(obj).map_err(kube::Error::SerdeError)
}

fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, kube::Error> {
    serde_json::from_value(v).map_err(kube::Error::SerdeError)
}

/// The typed object K with its `apiVersion` and `kind` set, as the API server wants a body.
fn typed_body<K: Resource<DynamicType = ()> + Serialize>(obj: &K) -> Result<Value, kube::Error> {
    let mut v = to_value(obj)?;
    if let Some(map) = v.as_object_mut() {
        map.insert("apiVersion".into(), K::api_version(&()).into());
        map.insert("kind".into(), K::kind(&()).into());
    }
    Ok(v)
}

impl Writer {
    pub fn new(transport: Arc<dyn Transport>) -> Writer {
        Writer(transport)
    }

    pub fn from_client(client: Client) -> Writer {
        Writer(Arc::new(client))
    }

    /// The raw seam, for calls the typed methods do not cover.
    pub async fn call(&self, call: Call) -> Result<Value, kube::Error> {
        self.0.call(call).await
    }

    pub async fn get<K>(&self, namespace: &str, name: &str) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        from_value(
            self.call(Call::Get(Target::of::<K>(namespace, name)))
                .await?,
        )
    }

    pub async fn create<K>(&self, namespace: &str, obj: &K) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let body = typed_body(obj)?;
        from_value(
            self.call(Call::Create(Target::of::<K>(namespace, ""), body))
                .await?,
        )
    }

    /// Creates from a body sent byte for byte ([`Call::CreateRaw`]).
    pub async fn create_raw<K>(&self, namespace: &str, body: Vec<u8>) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        from_value(
            self.call(Call::CreateRaw(Target::of::<K>(namespace, ""), body))
                .await?,
        )
    }

    /// PUT of the whole object; `obj.metadata.resourceVersion`, if set, is the precondition
    /// (without it the API server replaces whatever is stored).
    pub async fn replace<K>(&self, obj: &K) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let meta = obj.meta();
        let target = Target::of::<K>(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        from_value(self.call(Call::Replace(target, typed_body(obj)?)).await?)
    }

    /// PUT of the status subresource; `obj.metadata.resourceVersion` is the precondition.
    pub async fn replace_status<K>(&self, obj: &K) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let meta = obj.meta();
        let target = Target::of::<K>(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
        .subresource("status");
        from_value(self.call(Call::Replace(target, typed_body(obj)?)).await?)
    }

    pub async fn patch<K>(
        &self,
        namespace: &str,
        name: &str,
        kind: PatchKind,
        patch: Value,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        from_value(
            self.call(Call::Patch(Target::of::<K>(namespace, name), kind, patch))
                .await?,
        )
    }

    pub async fn patch_status<K>(
        &self,
        namespace: &str,
        name: &str,
        kind: PatchKind,
        patch: Value,
    ) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let target = Target::of::<K>(namespace, name).subresource("status");
        from_value(self.call(Call::Patch(target, kind, patch)).await?)
    }

    /// Deletes with optional UID / resourceVersion preconditions and propagation policy.
    pub async fn delete<K>(
        &self,
        namespace: &str,
        name: &str,
        opts: Delete,
    ) -> Result<(), kube::Error>
    where
        K: Resource<DynamicType = ()>,
    {
        let target = Target::of::<K>(namespace, name);
        let call = match opts.grace_period_seconds {
            Some(grace_period_seconds) => Call::DeleteGraceful {
                target,
                uid: opts.uid,
                resource_version: opts.resource_version,
                propagation: opts.propagation.map(str::to_string),
                grace_period_seconds,
            },
            None => Call::Delete {
                target,
                uid: opts.uid,
                resource_version: opts.resource_version,
                propagation: opts.propagation.map(str::to_string),
            },
        };
        self.call(call).await.map(drop)
    }

    /// POSTs a `policy/v1` Eviction for the pod to `pods/<name>/eviction` and returns the raw
    /// answer: a 2xx body may still be a `Status` saying `Failure` (a pod under several
    /// PodDisruptionBudgets is answered so, with HTTP 201), which the caller must read.
    /// `delete_options` is the Eviction's `deleteOptions` (`gracePeriodSeconds`,
    /// `preconditions.uid`, ...), `None` for none.
    pub async fn evict(
        &self,
        namespace: &str,
        name: &str,
        delete_options: Option<Value>,
    ) -> Result<Value, kube::Error> {
        let mut body = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        });
        if let Some(opts) = delete_options {
            body["deleteOptions"] = opts;
        }
        let target =
            Target::of::<k8s_openapi::api::core::v1::Pod>(namespace, name).subresource("eviction");
        self.call(Call::Create(target, body)).await
    }
}

/// Options of a delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delete {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `Background`, `Foreground` or `Orphan`.
    pub propagation: Option<&'static str>,
    /// `gracePeriodSeconds`; `None` leaves the object's own.
    pub grace_period_seconds: Option<i64>,
}

impl Delete {
    pub fn with_uid(uid: &str) -> Delete {
        Delete {
            uid: Some(uid.to_string()),
            ..Delete::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Node, Pod};

    #[test]
    fn paths_for_core_grouped_and_cluster_scoped() {
        assert_eq!(
            Target::of::<Pod>("ns", "p").url_path(),
            "/api/v1/namespaces/ns/pods"
        );
        assert_eq!(
            Target::of::<Job>("ns", "j").url_path(),
            "/apis/batch/v1/namespaces/ns/jobs"
        );
        assert_eq!(Target::of::<Node>("", "n").url_path(), "/api/v1/nodes");
    }

    #[test]
    fn requests_carry_verb_subresource_and_preconditions() {
        let status = Call::Replace(
            Target::of::<Job>("ns", "j").subresource("status"),
            serde_json::json!({}),
        );
        let r = build_request(&status).unwrap();
        assert_eq!(r.method(), http::Method::PUT);
        assert_eq!(r.uri().path(), "/apis/batch/v1/namespaces/ns/jobs/j/status");
        let del = Call::Delete {
            target: Target::of::<Pod>("ns", "p"),
            uid: Some("u1".into()),
            resource_version: None,
            propagation: Some("Background".into()),
        };
        let r = build_request(&del).unwrap();
        assert_eq!(r.method(), http::Method::DELETE);
        let body: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["preconditions"]["uid"], "u1");
        assert_eq!(body["propagationPolicy"], "Background");
        let graceful = Call::DeleteGraceful {
            target: Target::of::<Pod>("ns", "p"),
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            propagation: Some("Foreground".into()),
            grace_period_seconds: i64::MAX,
        };
        let r = build_request(&graceful).unwrap();
        let body: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["preconditions"]["uid"], "u1");
        assert_eq!(body["gracePeriodSeconds"], u32::MAX);
        assert_eq!(body["preconditions"]["resourceVersion"], "7");
        assert_eq!(body["propagationPolicy"], "Foreground");
        let evict = Call::Create(
            Target::of::<k8s_openapi::api::core::v1::Pod>("ns", "p").subresource("eviction"),
            serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction"}),
        );
        let r = build_request(&evict).unwrap();
        assert_eq!(r.method(), http::Method::POST);
        assert_eq!(r.uri().path(), "/api/v1/namespaces/ns/pods/p/eviction");
        let patch = Call::Patch(
            Target::of::<Node>("", "n").subresource("status"),
            PatchKind::Strategic,
            serde_json::json!({"status": {}}),
        );
        let r = build_request(&patch).unwrap();
        assert_eq!(r.method(), http::Method::PATCH);
        assert_eq!(
            r.headers()["content-type"],
            "application/strategic-merge-patch+json"
        );
    }
}
