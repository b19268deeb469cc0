//! `pilothouse schedule`: an operator's check of a schedule before applying it, on exactly the
//! controller's parser and evaluator.

use crate::schedule::DstPolicy;
use crate::{Zones, parse_for};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// One question: a schedule, its optional `spec.timeZone`, and the instant to count from.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Query {
    pub schedule: String,
    #[serde(default)]
    pub time_zone: Option<String>,
    /// RFC 3339; now when absent.
    #[serde(default)]
    pub from: Option<String>,
}

/// `{"valid": bool, "error": string|null, "next": [RFC 3339 with offset, ...]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub valid: bool,
    pub error: Option<String>,
    pub next: Vec<String>,
}

/// Validates `q` and lists up to `count` run times after `q.from`, in the schedule's zone.
pub fn answer(q: &Query, count: usize, policy: DstPolicy, zones: &Zones) -> Answer {
    let from = match q.from.as_deref().map(str::parse::<Timestamp>) {
        None => Timestamp::now(),
        Some(Ok(t)) => t,
        Some(Err(e)) => {
            return Answer {
                valid: false,
                error: Some(format!("from: {e}")),
                next: Vec::new(),
            };
        }
    };
    match parse_for(&q.schedule, q.time_zone.as_deref(), zones) {
        Err(e) => Answer {
            valid: false,
            error: Some(e),
            next: Vec::new(),
        },
        Ok(s) => {
            let mut next = Vec::with_capacity(count);
            let mut t = from;
            while next.len() < count {
                let Some(n) = s.next(t, policy) else { break };
                next.push(s.zone.rfc3339(n));
                t = n;
            }
            Answer {
                valid: true,
                error: None,
                next,
            }
        }
    }
}
