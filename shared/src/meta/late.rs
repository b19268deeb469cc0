//! Times the API server accepts and `k8s_openapi`'s time type (`jiff::Timestamp`) cannot hold:
//! the API takes RFC 3339 times up to 9999-12-31T23:59:59.999999Z, `jiff` ends at
//! 9999-12-30T22:00:00.999999999Z. An object carrying one would not decode at all (a watch
//! would fail for every object of its type, a GET or PATCH would fail after its write landed),
//! so such times are landed within the bound before the object is decoded.

use serde_json::Value;

/// Where times past the bound land: the 100 s before the library's last second, so that the
/// ~26 hours past it (93,600 s in microseconds, as the API server writes them) fit one
/// nanosecond apiece, and their order survives (a node renewing its Lease at ever later times
/// past the bound still renews).
const LANDING: i64 = 253_402_207_200 - 100;

/// Replaces every timestamp-shaped string past the bound by a time within it, keeping their
/// order (see [`LANDING`]), outside labels and annotations (user data that only looks like a
/// time). Returns whether anything changed.
pub fn land_late_times(v: &mut Value) -> bool {
    match v {
        Value::String(s) => match past_the_bound(s) {
            Some(landed) => {
                *s = landed;
                true
            }
            None => false,
        },
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, i| land_late_times(i) | changed),
        Value::Object(map) => map
            .iter_mut()
            .filter(|(k, _)| *k != "labels" && *k != "annotations")
            .fold(false, |changed, (_, i)| land_late_times(i) | changed),
        _ => false,
    }
}

/// For an RFC 3339 UTC time in the last two days of year 9999 that `jiff` refuses: where it
/// lands, as RFC 3339 with nanoseconds.
pub fn past_the_bound(s: &str) -> Option<String> {
    let rest = s.strip_prefix("9999-12-")?.strip_suffix('Z')?;
    if s.parse::<k8s_openapi::jiff::Timestamp>().is_ok() {
        return None;
    }
    let (clock, fraction) = rest.split_once('.').unwrap_or((rest, ""));
    let num = |t: &str| t.parse::<i64>().ok().filter(|_| t.len() == 2);
    let (day, clock) = clock.split_once('T')?;
    let mut hms = clock.split(':');
    let (h, m, sec) = (num(hms.next()?)?, num(hms.next()?)?, num(hms.next()?)?);
    let day = num(day)?;
    if !(30..=31).contains(&day) || h > 23 || m > 59 || sec > 59 {
        return None;
    }
    let micros: i64 = format!("{fraction:0<6}").get(..6)?.parse().ok()?;
    let over_secs = (day - 30) * 86_400 + h * 3_600 + m * 60 + sec - 22 * 3_600;
    let over = over_secs.checked_mul(1_000_000)?.checked_add(micros)?;
    if !(0..100_000_000_000).contains(&over) {
        return None;
    }
    let landed = k8s_openapi::jiff::Timestamp::new(LANDING, 0)
        .ok()?
        .checked_add(k8s_openapi::jiff::SignedDuration::from_nanos(over))
        .ok()?;
    Some(format!("{landed:.9}"))
}

/// Whether a response body may carry such a time (a cheap scan before any parse).
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
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(v).unwrap();
        let probed = pod.status.unwrap().conditions.unwrap()[0]
            .last_probe_time
            .clone();
        assert!(probed.is_some_and(|t| t.0 <= k8s_openapi::jiff::Timestamp::MAX));
    }
}
