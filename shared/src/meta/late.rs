//! Times the API server accepts and `k8s_openapi`'s time type (`jiff::Timestamp`) cannot hold:
//! the API takes RFC 3339 times up to 9999-12-31T23:59:59.999999Z, `jiff` ends at
//! 9999-12-30T22:00:00.999999999Z. An object carrying one would not decode at all (a watch
//! would fail for every object of its type, a GET or PATCH would fail after its write landed),
//! so such times are landed within the bound before the object is decoded: the last 100 s the
//! library holds take every time from there to the API's end, in order.

use serde_json::Value;

/// From here on times are landed: 100 s before the library's last second. Every time from
/// here to the API's last one (93,700 s, in microseconds as the API server writes them) maps to
/// one nanosecond apiece of the 100 s left, so the order of any two survives, across the bound
/// too (a node renewing its Lease at ever later times still renews). Times before it are kept.
const LANDING: i64 = 253_402_207_200 - 100;
/// LANDING's time of day on 9999-12-30, in seconds.
const LANDING_CLOCK: i64 = 21 * 3_600 + 58 * 60 + 20;

/// Lands every time at or past [`LANDING`] in `v` (see there). Only fields that hold times are
/// touched (`...Time`, `...Timestamp`, managedFields' `time`), and never inside labels,
/// annotations, data or a template's user strings: a value that only looks like a time is the
/// user's, and the controllers copy templates into the objects they create. Returns whether
/// anything changed.
pub fn land_late_times(v: &mut Value) -> bool {
    match v {
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, i| land_late_times(i) | changed),
        Value::Object(map) => map.iter_mut().fold(false, |changed, (k, i)| {
            let landed = match i {
                Value::String(s) if is_time_field(k) => match landed(s) {
                    Some(l) => {
                        *s = l;
                        true
                    }
                    None => false,
                },
                _ if is_user_data(k) => false,
                _ => land_late_times(i),
            };
            landed | changed
        }),
        _ => false,
    }
}

/// A field Kubernetes' types hold a `Time` or `MicroTime` in.
fn is_time_field(key: &str) -> bool {
    key == "time" || key.ends_with("Time") || key.ends_with("Timestamp")
}

/// Maps whose values are the user's own strings.
fn is_user_data(key: &str) -> bool {
    matches!(
        key,
        "labels"
            | "annotations"
            | "data"
            | "stringData"
            | "binaryData"
            | "env"
            | "args"
            | "command"
    )
}

/// For an RFC 3339 UTC time at or past [`LANDING`] (the API server writes every time in UTC):
/// where it lands, as RFC 3339 with nanoseconds. `None` for anything else (kept as is).
pub fn landed(s: &str) -> Option<String> {
    let rest = s.strip_prefix("9999-12-")?.strip_suffix('Z')?;
    let (clock, fraction) = rest.split_once('.').unwrap_or((rest, ""));
    let num = |t: &str| t.parse::<i64>().ok().filter(|_| t.len() == 2);
    let (day, clock) = clock.split_once('T')?;
    let mut hms = clock.split(':');
    let (h, m, sec) = (num(hms.next()?)?, num(hms.next()?)?, num(hms.next()?)?);
    let day = num(day)?;
    if !(30..=31).contains(&day) || h > 23 || m > 59 || sec > 59 || hms.next().is_some() {
        return None;
    }
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let micros: i64 = format!("{fraction:0<6}").get(..6)?.parse().ok()?;
    let secs = (day - 30) * 86_400 + h * 3_600 + m * 60 + sec - LANDING_CLOCK;
    if secs < 0 {
        return None;
    }
    let offset = secs.checked_mul(1_000_000)?.checked_add(micros)?;
    let landed = k8s_openapi::jiff::Timestamp::new(LANDING, 0)
        .ok()?
        .checked_add(k8s_openapi::jiff::SignedDuration::from_nanos(offset))
        .ok()?;
    Some(format!("{landed:.9}"))
}

/// Whether a body may carry a time at or past [`LANDING`] (a cheap scan before any parse).
pub fn may_carry_late_times(body: &[u8]) -> bool {
    body.windows(10).any(|w| w == b"\"9999-12-3")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_a_late_time_is_found_and_landed() {
        let body = br#"{"metadata":{"name":"p"},"status":{"conditions":[{"type":"Ready","status":"True","lastProbeTime":"9999-12-31T23:00:00Z"}]}}"#;
        assert!(may_carry_late_times(body));
        assert!(!may_carry_late_times(br#"{"t":"2026-12-31T23:00:00Z"}"#));
        let mut v: Value = serde_json::from_slice(body).unwrap();
        assert!(land_late_times(&mut v));
        // The user's strings are never touched, whatever they look like.
        let mut user = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
            "env": [{"name": "UNTIL", "value": "9999-12-31T23:00:00Z"}],
            "args": ["9999-12-31T23:00:00Z"]}]}}},
            "data": {"notAfterTime": "9999-12-31T23:00:00Z"},
            "metadata": {"annotations": {"x": "9999-12-31T23:00:00Z"}}});
        let before = user.clone();
        assert!(!land_late_times(&mut user));
        assert_eq!(user, before);
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(v).unwrap();
        let probed = pod.status.unwrap().conditions.unwrap()[0]
            .last_probe_time
            .clone();
        assert!(probed.is_some_and(|t| t.0 <= k8s_openapi::jiff::Timestamp::MAX));
    }
}
