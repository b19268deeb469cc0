//! `cronjob_controller_job_creation_skew_duration_seconds` (the skew sample of CR-20, named and
//! bucketed as upstream's) and the bundled tz database's release (CR-12) as
//! `pilothouse_cronjob_tzdata_info{version}`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: String,
}

pub struct Metrics {
    pub creation_skew: Histogram,
}

impl Metrics {
    pub fn register(r: &shared::metrics::Metrics) -> Metrics {
        // Upstream: ExponentialBuckets(1, 2, 10), 1 s to 512 s.
        let creation_skew = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        r.register(
            "cronjob_controller_job_creation_skew_duration_seconds",
            "Time between when a cronjob is scheduled to be run, and when the corresponding job is created",
            creation_skew.clone(),
        );
        let info: Family<VersionLabel, Gauge> = Family::default();
        info.get_or_create(&VersionLabel {
            version: crate::zone::tzdata_version().to_string(),
        })
        .set(1);
        r.register(
            "pilothouse_cronjob_tzdata_info",
            "The IANA time zone database release bundled with this controller",
            info,
        );
        Metrics { creation_skew }
    }
}
