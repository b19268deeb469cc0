//! Schedules as robfig/cron v3.0.1 `ParseStandard` reads them (CR-4..CR-9): the parser the API
//! server validates with and kube-controller-manager evaluates with. Accepts, rejects and words
//! its errors the same way; `next` evaluates either exactly as upstream or under the DST policy
//! of JB-12 ([`DstPolicy`]).

use crate::zone::{Zone, Zones};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::CronJob;
use shared::meta::gocompat::{atoi, parse_duration};

const STAR: u64 = 1 << 63;

#[derive(Clone, Copy)]
struct Bounds {
    min: u32,
    max: u32,
    names: &'static [(&'static str, u32)],
}

const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("feb", 2),
        ("mar", 3),
        ("apr", 4),
        ("may", 5),
        ("jun", 6),
        ("jul", 7),
        ("aug", 8),
        ("sep", 9),
        ("oct", 10),
        ("nov", 11),
        ("dec", 12),
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &[
        ("sun", 0),
        ("mon", 1),
        ("tue", 2),
        ("wed", 3),
        ("thu", 4),
        ("fri", 5),
        ("sat", 6),
    ],
};

/// How daylight-saving changes treat schedule times (JB-12, `--cronjob-dst-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DstPolicy {
    /// Vixie cron's rule: fixed-time schedules run once for a time in a spring-forward gap (at the
    /// first instant after it) and once for a time in a repeated hour (its first occurrence).
    #[default]
    Cron,
    /// robfig/cron v3 exactly, as kube-controller-manager: gap times are skipped, repeated times
    /// run twice.
    Upstream,
}

/// The bit sets of a five-field schedule (bit n = value n; bit 63 = the field was `*`/`?`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fields {
    pub second: u64,
    pub minute: u64,
    pub hour: u64,
    pub dom: u64,
    pub month: u64,
    pub dow: u64,
    /// Neither the minute nor the hour field begins with `*` or `?` (JB-12's fixed-time rule).
    pub fixed_time: bool,
}

#[derive(Clone, Debug)]
pub enum Kind {
    Fields(Fields),
    /// `@every d`: whole seconds, at least one.
    Every(i64),
}

/// A parsed schedule with the zone it is evaluated in.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub kind: Kind,
    pub zone: Zone,
}

/// Resolves the zone named in a `TZ=`/`CRON_TZ=` prefix, as Go's `time.LoadLocation`:
/// `""` and `"UTC"` are UTC, `"Local"` the default zone.
pub trait ZoneSource {
    fn load(&self, name: &str) -> Result<Zone, String>;
    fn local(&self) -> Zone;
}

/// `cron.ParseStandard(spec)`, as kube-controller-manager calls it (with its panic recovery).
pub fn parse(spec: &str, zones: &dyn ZoneSource) -> Result<Schedule, String> {
    if spec.is_empty() {
        return Err("empty spec string".into());
    }
    let mut zone = zones.local();
    let mut rest = spec;
    if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
        // Go slices up to the first blank; without one it panics, which upstream reports so.
        let Some(blank) = spec.find(' ') else {
            return Err(
                "invalid schedule format: runtime error: slice bounds out of range [:-1]".into(),
            );
        };
        let eq = spec.find('=').unwrap_or(0);
        let name = &spec[eq + 1..blank];
        zone = zones
            .load(name)
            .map_err(|e| format!("provided bad location {name}: {e}"))?;
        rest = spec[blank..].trim();
    }
    if rest.starts_with('@') {
        return descriptor(rest).map(|kind| Schedule { kind, zone });
    }
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected exactly 5 fields, found {}: [{}]",
            fields.len(),
            fields.join(" ")
        ));
    }
    let minute = field(fields[0], MINUTES)?;
    let hour = field(fields[1], HOURS)?;
    let dom = field(fields[2], DOM)?;
    let month = field(fields[3], MONTHS)?;
    let dow = field(fields[4], DOW)?;
    let wild = |f: &str| f.starts_with('*') || f.starts_with('?');
    Ok(Schedule {
        kind: Kind::Fields(Fields {
            second: 1,
            minute,
            hour,
            dom,
            month,
            dow,
            fixed_time: !wild(fields[0]) && !wild(fields[1]),
        }),
        zone,
    })
}

fn descriptor(d: &str) -> Result<Kind, String> {
    let all = |b: Bounds| bits(b.min, b.max, 1) | STAR;
    let fixed = |dom: u64, month: u64, dow: u64| {
        Kind::Fields(Fields {
            second: 1,
            minute: 1,
            hour: 1,
            dom,
            month,
            dow,
            fixed_time: true,
        })
    };
    match d {
        "@yearly" | "@annually" => Ok(fixed(1 << 1, 1 << 1, all(DOW))),
        "@monthly" => Ok(fixed(1 << 1, all(MONTHS), all(DOW))),
        "@weekly" => Ok(fixed(all(DOM), all(MONTHS), 1)),
        "@daily" | "@midnight" => Ok(fixed(all(DOM), all(MONTHS), all(DOW))),
        "@hourly" => Ok(Kind::Fields(Fields {
            second: 1,
            minute: 1,
            hour: all(HOURS),
            dom: all(DOM),
            month: all(MONTHS),
            dow: all(DOW),
            fixed_time: false,
        })),
        _ => {
            if let Some(text) = d.strip_prefix("@every ") {
                let nanos = parse_duration(text)
                    .map_err(|e| format!("failed to parse duration {d}: {e}"))?;
                // Every(): under a second becomes a second; fractions of a second are dropped.
                let nanos = nanos.max(1_000_000_000);
                Ok(Kind::Every(nanos / 1_000_000_000))
            } else {
                Err(format!("unrecognized descriptor: {d}"))
            }
        }
    }
}

fn field(text: &str, b: Bounds) -> Result<u64, String> {
    let mut out = 0;
    for expr in text.split(',').filter(|e| !e.is_empty()) {
        out |= range(expr, b)?;
    }
    Ok(out)
}

fn range(expr: &str, b: Bounds) -> Result<u64, String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_and_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_and_high.len() == 1;
    let (start, mut end, mut extra);
    if low_and_high[0] == "*" || low_and_high[0] == "?" {
        // Anything after a star's '-' is ignored, as upstream.
        (start, end, extra) = (u64::from(b.min), u64::from(b.max), STAR);
    } else {
        start = int_or_name(low_and_high[0], b)?;
        end = match low_and_high.len() {
            1 => start,
            2 => int_or_name(low_and_high[1], b)?,
            _ => return Err(format!("too many hyphens: {expr}")),
        };
        extra = 0;
    }
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = non_negative(range_and_step[1])?;
            if single {
                end = u64::from(b.max);
            }
            if step > 1 {
                extra = 0;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < u64::from(b.min) {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            b.min
        ));
    }
    if end > u64::from(b.max) {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            b.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    Ok(bits(start as u32, end as u32, step) | extra)
}

fn int_or_name(expr: &str, b: Bounds) -> Result<u64, String> {
    let lower = expr.to_lowercase();
    if let Some((_, v)) = b.names.iter().find(|(n, _)| *n == lower) {
        return Ok(u64::from(*v));
    }
    non_negative(expr)
}

fn non_negative(expr: &str) -> Result<u64, String> {
    let n = atoi(expr).map_err(|e| format!("failed to parse int from {expr}: {e}"))?;
    if n < 0 {
        return Err(format!("negative number ({n}) not allowed: {expr}"));
    }
    Ok(n as u64)
}

fn bits(min: u32, max: u32, step: u64) -> u64 {
    if step == 1 {
        return (!(u64::MAX << (max + 1))) & (u64::MAX << min);
    }
    let mut out = 0;
    let mut i = u64::from(min);
    while i <= u64::from(max) {
        out |= 1 << i;
        i += step;
    }
    out
}

impl Fields {
    pub fn day_matches(&self, day: u32, weekday: u32) -> bool {
        let dom = self.dom & (1 << day) != 0;
        let dow = self.dow & (1 << weekday) != 0;
        if self.dom & STAR != 0 || self.dow & STAR != 0 {
            dom && dow
        } else {
            dom || dow
        }
    }
}

impl Schedule {
    /// The first run time strictly after `t`, or `None` when there is none within five years.
    pub fn next(&self, t: Timestamp, policy: DstPolicy) -> Option<Timestamp> {
        // Upstream drops sub-second parts before stepping.
        let from = t.as_nanosecond().div_euclid(1_000_000_000) as i64;
        let secs = match &self.kind {
            Kind::Every(d) => Some(from + d),
            Kind::Fields(f) => match policy {
                DstPolicy::Upstream => crate::zone::next_upstream(f, &self.zone, from),
                DstPolicy::Cron => crate::zone::next_wall_clock(f, &self.zone, from),
            },
        }?;
        Timestamp::from_second(secs).ok()
    }
}

/// The text upstream hands the parser (`formatSchedule`): a schedule mentioning `TZ` as it is,
/// otherwise prefixed with `TZ=<spec.timeZone> ` when the zone loads. The flag says the schedule
/// itself names a zone (grandfathered, CR-13).
pub fn format_schedule(cj: &CronJob, zones: &Zones) -> (String, bool) {
    let schedule = cj.spec.schedule.clone();
    if schedule.contains("TZ") {
        return (schedule, true);
    }
    match cj.spec.time_zone.as_deref() {
        Some(tz) if zones.load(tz).is_ok() => (format!("TZ={tz} {schedule}"), false),
        _ => (schedule, false),
    }
}

/// What `pilothouse schedule` and the controller both run: parse as the controller would for a
/// CronJob with this schedule and `spec.timeZone`.
pub fn parse_for(
    schedule: &str,
    time_zone: Option<&str>,
    zones: &Zones,
) -> Result<Schedule, String> {
    let cj = CronJob {
        spec: k8s_openapi::api::batch::v1::CronJobSpec {
            schedule: schedule.to_string(),
            time_zone: time_zone.map(str::to_string),
            ..Default::default()
        },
        ..Default::default()
    };
    if let Some(tz) = time_zone {
        zones.load(tz).map_err(|e| {
            format!(
                "invalid timeZone: {}: {e}",
                shared::meta::gocompat::strconv_quote(tz)
            )
        })?;
    }
    let (text, _) = format_schedule(&cj, zones);
    parse(&text, zones)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Utc;
    impl ZoneSource for Utc {
        fn load(&self, name: &str) -> Result<Zone, String> {
            match name {
                "" | "UTC" => Ok(Zone::utc()),
                "Local" => Ok(Zone::utc()),
                _ => Zone::bundled(name).map_err(|_| format!("unknown time zone {name}")),
            }
        }
        fn local(&self) -> Zone {
            Zone::utc()
        }
    }

    fn fields(s: &str) -> Fields {
        match parse(s, &Utc).unwrap().kind {
            Kind::Fields(f) => f,
            Kind::Every(_) => panic!("{s} is @every"),
        }
    }

    fn err(s: &str) -> String {
        parse(s, &Utc).unwrap_err()
    }

    #[test]
    fn accepts_what_robfig_accepts() {
        let table: &[(&str, u64, u64)] = &[
            // (schedule, minute bits, hour bits)
            (
                "*/15 * * * *",
                1 | 1 << 15 | 1 << 30 | 1 << 45,
                bits(0, 23, 1) | STAR,
            ),
            ("5 */1 * * *", 1 << 5, bits(0, 23, 1) | STAR),
            ("5-10/2 3 * * *", 1 << 5 | 1 << 7 | 1 << 9, 1 << 3),
            ("10/20 0 * * *", 1 << 10 | 1 << 30 | 1 << 50, 1),
            ("+05,,007 0 * * *", 1 << 5 | 1 << 7, 1),
            ("*-3 0 * * *", bits(0, 59, 1) | STAR, 1),
            ("?/30 0 * * *", 1 | 1 << 30, 1),
            (",,, 0 * * *", 0, 1),
        ];
        for (s, minute, hour) in table {
            let f = fields(s);
            assert_eq!((f.minute, f.hour), (*minute, *hour), "{s}");
        }
        assert_eq!(fields("0 0 * JAN-mar *").month, bits(1, 3, 1));
        assert_eq!(fields("0 0 * * Sun,SAT").dow, 1 | 1 << 6);
        assert!(fields("30 2 * * *").fixed_time);
        assert!(fields("@daily").fixed_time);
        assert!(!fields("@hourly").fixed_time);
        assert!(!fields("*/15 2 * * *").fixed_time);
        assert!(!fields("30 ? * * *").fixed_time);
        assert!(matches!(
            parse("@every 1m30.5s", &Utc).unwrap().kind,
            Kind::Every(90)
        ));
        assert!(matches!(
            parse("@every 10ms", &Utc).unwrap().kind,
            Kind::Every(1)
        ));
        assert!(matches!(
            parse("@every -5m", &Utc).unwrap().kind,
            Kind::Every(1)
        ));
        assert!(parse("TZ=Asia/Tokyo  0 9 * * *", &Utc).is_ok());
        assert!(parse("CRON_TZ=UTC @daily", &Utc).is_ok());
    }

    #[test]
    fn rejects_with_robfig_words() {
        let table: &[(&str, &str)] = &[
            ("", "empty spec string"),
            ("* * * *", "expected exactly 5 fields, found 4: [* * * *]"),
            (
                "0 0 0 * * *",
                "expected exactly 5 fields, found 6: [0 0 0 * * *]",
            ),
            ("* * * * 7", "end of range (7) above maximum (6): 7"),
            ("60 * * * *", "end of range (60) above maximum (59): 60"),
            ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
            (
                "5-1 * * * *",
                "beginning of range (5) beyond end of range (1): 5-1",
            ),
            ("1-2-3 * * * *", "too many hyphens: 1-2-3"),
            ("*/2/3 * * * *", "too many slashes: */2/3"),
            (
                "*/0 * * * *",
                "step of range should be a positive number: */0",
            ),
            ("*/-1 * * * *", "negative number (-1) not allowed: -1"),
            (
                "x * * * *",
                r#"failed to parse int from x: strconv.Atoi: parsing "x": invalid syntax"#,
            ),
            (
                "5- * * * *",
                r#"failed to parse int from : strconv.Atoi: parsing "": invalid syntax"#,
            ),
            ("@reboot", "unrecognized descriptor: @reboot"),
            ("@daily ", "unrecognized descriptor: @daily "),
            (
                "@every 1d",
                r#"failed to parse duration @every 1d: time: unknown unit "d" in duration "1d""#,
            ),
            (
                "TZ=Mars/Olympus * * * * *",
                "provided bad location Mars/Olympus: unknown time zone Mars/Olympus",
            ),
        ];
        for (s, want) in table {
            assert_eq!(err(s), *want, "{s:?}");
        }
        assert!(err("TZ=UTC").starts_with("invalid schedule format"));
    }

    #[test]
    fn day_of_month_and_week_combine_as_robfig() {
        // CR-8: a star on either side means both must match; otherwise either.
        let f = fields("0 0 1,15 * MON");
        assert!(f.day_matches(1, 3) && f.day_matches(2, 1) && !f.day_matches(2, 2));
        let f = fields("0 0 */1 * MON");
        assert!(f.day_matches(2, 1) && !f.day_matches(1, 3));
        let f = fields("0 0 */2 * MON");
        assert!(f.day_matches(3, 4) && f.day_matches(4, 1) && !f.day_matches(4, 2));
    }
}
