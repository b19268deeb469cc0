//! Pod control (upstream `stateful_pod_control.go`, `StatefulPodControl`): the writes the
//! plan's actions make to pods and claims, each recorded for read-your-writes (ST-44) and
//! announced by its event (ST-43). What to write, and when, is the plan's; this layer only
//! writes it.

use crate::model::StatefulSet;
use crate::sync::{StatefulSetController, owners};
use crate::{Error, act, api, identity};
use serde_json::Value;

impl StatefulSetController {
    /// ST-19 (b), ST-43 (upstream `CreateStatefulPod`): claims, then the pod, then the claims'
    /// references to it.
    pub(crate) async fn create_pod(
        &self,
        key: &str,
        set: &StatefulSet,
        ordinal: i32,
        template: &Value,
        revision: &str,
    ) -> Result<(), Error> {
        let name = identity::pod_name(set.name(), ordinal);
        if let Err(e) = self.create_claims(key, set, ordinal).await {
            self.pod_event(set, "create", &name, Some(&claims_error_message(&e)));
            return Err(e);
        }
        let body = identity::new_pod(set, template, ordinal, revision);
        match act::create_pod(&self.writer, set.namespace(), body).await {
            Ok(created) => {
                self.written.wrote(
                    key,
                    &self.c.pods,
                    created.metadata.resource_version.as_deref(),
                );
                let uid = created.metadata.uid.clone().unwrap_or_default();
                if let Err(e) = self.fix_claim_refs(key, set, &name, &uid).await.map(|_| ()) {
                    if let Error::Api(f) = &e {
                        self.pod_event(
                            set,
                            "update",
                            &name,
                            Some(&shared::api::apierr::message(&f.source)),
                        );
                    }
                    return Err(e);
                }
                self.pod_event(set, "create", &name, None);
                Ok(())
            }
            // ST-43: an error without an event.
            Err(e) if shared::api::apierr::is_already_exists(&e) => {
                Err(api(format!("creating pod {name}"))(e))
            }
            Err(e) => {
                self.pod_event(
                    set,
                    "create",
                    &name,
                    Some(&shared::api::apierr::message(&e)),
                );
                Err(api(format!("creating pod {name}"))(e))
            }
        }
    }

    /// ST-32 then ST-34 (upstream `createMissingPersistentVolumeClaims`): a Pending pod's
    /// missing claims, then their references to it.
    pub(crate) async fn create_missing_claims(
        &self,
        key: &str,
        set: &StatefulSet,
        ordinal: i32,
    ) -> Result<(), Error> {
        self.create_claims(key, set, ordinal).await?;
        let name = identity::pod_name(set.name(), ordinal);
        self.fix_pod_claim_refs(key, set, &name).await
    }

    /// ST-10, ST-34 (upstream `UpdateStatefulPod`): the claims' references, then the pod's
    /// identity, and one "update" event about the pod when anything was changed or failed.
    pub(crate) async fn update_pod(
        &self,
        key: &str,
        set: &StatefulSet,
        name: &str,
    ) -> Result<(), Error> {
        let pod = self.c.pods.get(&format!("{}/{name}", set.namespace()));
        let identity_ok = pod.as_ref().is_some_and(|p| {
            identity::identity_matches(set, p) && identity::storage_matches(set, p)
        });
        let uid = pod.and_then(|p| p.metadata.uid.clone()).unwrap_or_default();
        let claims_changed = match self.fix_claim_refs(key, set, name, &uid).await {
            Ok(changed) => changed,
            Err(e) => {
                if let Error::Api(f) = &e {
                    self.pod_event(
                        set,
                        "update",
                        name,
                        Some(&shared::api::apierr::message(&f.source)),
                    );
                }
                return Err(e);
            }
        };
        if !identity_ok {
            self.repair_pod(key, set, name).await?;
        } else if claims_changed {
            self.pod_event(set, "update", name, None);
        }
        Ok(())
    }

    /// ST-34 for the cached pod `name`, without an event (upstream `processCondemned`). A pod
    /// not in the cache has no UID: its claims get no reference to it.
    pub(crate) async fn fix_pod_claim_refs(
        &self,
        key: &str,
        set: &StatefulSet,
        name: &str,
    ) -> Result<(), Error> {
        let uid = self
            .c
            .pods
            .get(&format!("{}/{name}", set.namespace()))
            .and_then(|p| p.metadata.uid.clone())
            .unwrap_or_default();
        self.fix_claim_refs(key, set, name, &uid).await.map(|_| ())
    }

    /// ST-23 (upstream `DeleteStatefulPod`): a plain delete; gone already is success.
    pub(crate) async fn delete_pod(
        &self,
        key: &str,
        set: &StatefulSet,
        name: &str,
    ) -> Result<(), Error> {
        match act::delete_pod(&self.writer, set.namespace(), name).await {
            // Read-your-writes for deletes too: a cache still showing the pod as running would
            // count it as available (ST-25).
            Ok(rv) => self.written.wrote(key, &self.c.pods, rv.as_deref()),
            Err(e) if shared::api::apierr::is_not_found(&e) => {}
            Err(e) => {
                self.pod_event(set, "delete", name, Some(&shared::api::apierr::message(&e)));
                return Err(api(format!("deleting pod {name}"))(e));
            }
        }
        self.pod_event(set, "delete", name, None);
        Ok(())
    }
}

impl StatefulSetController {
    /// ST-32 (upstream `createPersistentVolumeClaims`): the missing claims of `ordinal`; an
    /// existing claim being deleted is an error (the pod must wait for it).
    async fn create_claims(&self, key: &str, set: &StatefulSet, ordinal: i32) -> Result<(), Error> {
        let pod = identity::pod_name(set.name(), ordinal);
        let mut first: Option<Error> = None;
        for (name, body) in identity::new_claims(set, ordinal) {
            match self.c.claims.get(&format!("{}/{name}", set.namespace())) {
                Some(c) if c.metadata.deletion_timestamp.is_some() => {
                    first.get_or_insert(Error::Claim(format!("pvc {name} is being deleted")));
                }
                Some(_) => {}
                None => match act::create_claim(&self.writer, set.namespace(), body).await {
                    Ok(created) => {
                        self.written.wrote(
                            key,
                            &self.c.claims,
                            created.metadata.resource_version.as_deref(),
                        );
                        self.claim_event(set, &name, &pod, None);
                    }
                    // Created meanwhile (by us, not yet cached, or by someone else): fine, but
                    // the sync fails as upstream's does, to retry on a fresher cache.
                    Err(e) if shared::api::apierr::is_already_exists(&e) => {
                        first.get_or_insert(api(format!("creating claim {name}"))(e));
                    }
                    Err(e) => {
                        self.claim_event(set, &name, &pod, Some(&e));
                        first.get_or_insert(api(format!("creating claim {name}"))(e));
                    }
                },
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// ST-34/ST-35 (upstream `UpdatePodClaimForRetentionPolicy`): each cached claim of the
    /// pod's ordinal gets the owner references its policy asks for. Whether any claim changed.
    async fn fix_claim_refs(
        &self,
        key: &str,
        set: &StatefulSet,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<bool, Error> {
        let mut changed = false;
        let ordinal = identity::ordinal(pod_name);
        for t in set.claim_template_names() {
            let name = identity::claim_name(t, set.name(), ordinal);
            let Some(claim) = self.c.claims.get(&format!("{}/{name}", set.namespace())) else {
                continue;
            };
            let o = owners(set, pod_name, pod_uid, ordinal);
            if identity::has_unexpected_controller(&claim, &o) {
                self.events.warning(
                    &shared::meta::refs::object_reference(set),
                    "ConflictingController",
                    "Update",
                    format!("PersistentVolumeClaim {name} has a conflicting OwnerReference that acts as a manging controller, the retention policy is ignored for this claim"),
                );
            }
            if identity::claim_refs_up_to_date(&claim, &o) {
                continue;
            }
            let updated = act::set_claim_refs(&self.writer, set.namespace(), &name, |live| {
                identity::claim_refs(live, &owners(set, pod_name, pod_uid, ordinal))
            })
            .await
            .map_err(api(format!(
                "updating the owner references of claim {name}"
            )))?;
            self.written.wrote(
                key,
                &self.c.claims,
                updated.metadata.resource_version.as_deref(),
            );
            changed = true;
        }
        Ok(changed)
    }

    /// ST-10 (upstream `UpdateStatefulPod`): identity and claim volumes repaired.
    async fn repair_pod(&self, key: &str, set: &StatefulSet, name: &str) -> Result<(), Error> {
        match act::repair_pod(&self.writer, set, name).await {
            Ok(p) => {
                self.written
                    .wrote(key, &self.c.pods, p.metadata.resource_version.as_deref());
                self.pod_event(set, "update", name, None);
                Ok(())
            }
            Err(e) => {
                self.pod_event(set, "update", name, Some(&shared::api::apierr::message(&e)));
                Err(api(format!("updating pod {name}"))(e))
            }
        }
    }
}

impl StatefulSetController {
    /// ST-43: `SuccessfulCreate` / `FailedCreate` (and update, delete) for a pod of the set.
    fn pod_event(&self, set: &StatefulSet, verb: &str, pod: &str, err: Option<&str>) {
        let subject = shared::meta::refs::object_reference(set);
        match err {
            None => self.events.normal(
                &subject,
                &format!("Successful{}", title(verb)),
                &title(verb),
                format!(
                    "{} Pod {pod} in StatefulSet {} successful",
                    title(verb),
                    set.name()
                ),
            ),
            Some(e) => self.events.warning(
                &subject,
                &format!("Failed{}", title(verb)),
                &title(verb),
                format!(
                    "{} Pod {pod} in StatefulSet {} failed error: {e}",
                    title(verb),
                    set.name()
                ),
            ),
        }
    }

    /// ST-43 for claims (created per ST-32).
    fn claim_event(&self, set: &StatefulSet, claim: &str, pod: &str, err: Option<&kube::Error>) {
        let subject = shared::meta::refs::object_reference(set);
        match err {
            None => self.events.normal(
                &subject,
                "SuccessfulCreate",
                "Create",
                format!(
                    "Create Claim {claim} Pod {pod} in StatefulSet {} success",
                    set.name()
                ),
            ),
            Some(e) => self.events.warning(
                &subject,
                "FailedCreate",
                "Create",
                format!(
                    "Create Claim {claim} for Pod {pod} in StatefulSet {} failed error: {}",
                    set.name(),
                    shared::api::apierr::message(e)
                ),
            ),
        }
    }
}

/// The text upstream's `createPersistentVolumeClaims` error carries into the pod event.
fn claims_error_message(e: &Error) -> String {
    match e {
        Error::Api(f) => match f.what.strip_prefix("creating claim ") {
            Some(claim) => format!(
                "failed to create PVC {claim}: {}",
                shared::api::apierr::message(&f.source)
            ),
            None => shared::api::apierr::message(&f.source),
        },
        other => other.to_string(),
    }
}

/// Upstream's event verbs, title-cased as 1.37 prints them (`cases.Title`).
fn title(verb: &str) -> String {
    let mut c = verb.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}
