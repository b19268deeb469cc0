//! Decoding what a watch delivers so that no object the API server accepts can fail the stream
//! for the others.
//!
//! The API server accepts timestamps up to 9999-12-31T23:59:59.999999Z; the time type
//! `k8s_openapi` decodes into (`jiff::Timestamp`) ends at 9999-12-30T22:00:00.999999999Z. A
//! time in that last stretch (a node whose clock is wrong renewing its Lease) would fail the
//! whole watch, which restarts and fails again, and the object would never reach the cache. So
//! an object that does not decode is decoded again with such times saturated at the library's
//! bound; one that still does not is [`Decoded::Undecodable`]: the informer skips it, counts it
//! and logs its key, and the stream goes on.

use crate::meta::late::{land_late_times, may_carry_late_times};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::borrow::Cow;

/// One object off the wire.
#[derive(Clone, Debug)]
pub enum Decoded<K> {
    Ok(K),
    /// Only what locates it (name, namespace, uid, resourceVersion) and why it failed.
    Undecodable {
        meta: Box<ObjectMeta>,
        error: String,
    },
}

/// What locates an object whose body did not decode.
fn locator(v: &Value) -> ObjectMeta {
    let field = |name: &str| {
        v.get("metadata")
            .and_then(|m| m.get(name))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        uid: field("uid"),
        resource_version: field("resourceVersion"),
        ..ObjectMeta::default()
    }
}

impl<K: DeserializeOwned> Decoded<K> {
    /// Decodes one object's JSON: as is, then with times saturated, then as undecodable.
    pub fn from_json(raw: &str) -> Result<Self, serde_json::Error> {
        // Late times are landed whether or not they would decode, so that all of an object's
        // times and every object's compare as the API server's do (see `meta::late`).
        let late = may_carry_late_times(raw.as_bytes());
        let error = if late {
            None
        } else {
            match serde_json::from_str::<K>(raw) {
                Ok(k) => return Ok(Decoded::Ok(k)),
                Err(e) => Some(e.to_string()),
            }
        };
        // Not even JSON: the stream itself is broken, as before.
        let mut value: Value = serde_json::from_str(raw)?;
        land_late_times(&mut value);
        match K::deserialize(&value) {
            Ok(k) => Ok(Decoded::Ok(k)),
            Err(e) => Ok(Decoded::Undecodable {
                meta: Box::new(locator(&value)),
                error: error.unwrap_or_else(|| e.to_string()),
            }),
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The raw text is kept for the rare second try; the common path parses once more than
        // the bytes it scans.
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        Decoded::from_json(raw.get()).map_err(serde::de::Error::custom)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Decoded<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Decoded::Ok(k) => k.meta(),
            Decoded::Undecodable { meta, .. } => meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Decoded::Ok(k) => k.meta_mut(),
            Decoded::Undecodable { meta, .. } => meta,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;

    fn lease(renew: &str) -> String {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "n1", "namespace": "kube-node-lease", "resourceVersion": "7",
                         "annotations": {"note": "9999-12-31T23:59:59Z"}},
            "spec": {"holderIdentity": "n1", "renewTime": renew}
        })
        .to_string()
    }

    fn renewed(renew: &str) -> k8s_openapi::jiff::Timestamp {
        let Decoded::Ok(l) = Decoded::<Lease>::from_json(&lease(renew)).unwrap() else {
            panic!("{renew}: not decoded");
        };
        assert_eq!(
            l.metadata.annotations.unwrap()["note"],
            "9999-12-31T23:59:59Z",
            "annotations are user data: untouched"
        );
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        spec.renew_time.unwrap().0
    }

    #[test]
    fn times_past_the_librarys_bound_land_within_it_in_their_order() {
        let times = [
            "9999-12-30T21:00:00Z",
            "9999-12-30T21:58:19.999999Z",
            "9999-12-30T21:58:20Z",
            "9999-12-30T21:59:59Z",
            "9999-12-30T22:00:00.999999Z",
            "9999-12-30T22:00:01Z",
            "9999-12-30T22:00:01.000001Z",
            "9999-12-31T00:00:00.5Z",
            "9999-12-31T23:59:59.999998Z",
            "9999-12-31T23:59:59.999999Z",
        ];
        let landed: Vec<_> = times.iter().map(|t| renewed(t)).collect();
        assert!(landed.windows(2).all(|w| w[0] < w[1]), "{landed:?}");
        assert_eq!(
            renewed("9999-12-30T21:58:19.999999Z").to_string(),
            "9999-12-30T21:58:19.999999Z",
            "before the landing: as it was"
        );
        let bound = k8s_openapi::jiff::Timestamp::MAX;
        assert!(landed.iter().all(|t| *t <= bound));
        assert!(
            crate::meta::late::landed("9999-12-31T23:59:59+01:00").is_none(),
            "only UTC, as the API server writes"
        );
        assert!(crate::meta::late::landed("9999-12-32T00:00:00Z").is_none());
    }

    #[test]
    fn an_ordinary_object_decodes_as_is() {
        let raw = lease("2026-12-03T10:00:00.123456Z");
        let Decoded::Ok(l) = Decoded::<Lease>::from_json(&raw).unwrap() else {
            panic!("not decoded");
        };
        assert_eq!(
            l.spec.unwrap().renew_time.unwrap().0.to_string(),
            "2026-12-03T10:00:00.123456Z"
        );
    }

    #[test]
    fn what_still_does_not_decode_is_kept_as_its_locator() {
        let raw = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "9"},
            "spec": {"containers": "not a list"}
        })
        .to_string();
        let Decoded::Undecodable { meta, error } = Decoded::<Pod>::from_json(&raw).unwrap() else {
            panic!("decoded");
        };
        assert_eq!(
            (meta.namespace.as_deref(), meta.name.as_deref()),
            (Some("ns"), Some("p"))
        );
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
        assert!(error.contains("invalid type"), "{error}");
        assert!(Decoded::<Pod>::from_json("{not json").is_err());
    }

    #[test]
    fn a_watch_line_and_a_list_decode_through_it() {
        let line = format!(
            r#"{{"type":"MODIFIED","object":{}}}"#,
            lease("9999-12-31T23:00:00Z")
        );
        let event: kube::core::WatchEvent<Decoded<Lease>> = serde_json::from_str(&line).unwrap();
        assert!(matches!(
            event,
            kube::core::WatchEvent::Modified(Decoded::Ok(_))
        ));
        let list = format!(
            r#"{{"metadata":{{"resourceVersion":"8"}},"items":[{},{}]}}"#,
            lease("9999-12-31T23:00:00Z"),
            r#"{"metadata":{"name":"x"},"spec":{"leaseDurationSeconds":"forty"}}"#
        );
        let list: kube::core::ObjectList<Decoded<Lease>> = serde_json::from_str(&list).unwrap();
        assert!(matches!(list.items[0], Decoded::Ok(_)));
        assert!(matches!(list.items[1], Decoded::Undecodable { .. }));
    }
}
