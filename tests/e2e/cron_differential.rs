//! Differential test of CronJob schedules (issue 4, CR-4..CR-16, JB-12), no cluster needed.
//!
//! A generated corpus of (schedule, time zone, start instant) cases, many of them invalid and
//! many starting near daylight-saving transitions, is answered by
//! - the real github.com/robfig/cron/v3 v3.0.1 (`tests/differential/cron`, a small Go program
//!   built from the Go module proxy and parsing exactly as kube-controller-manager does), and
//! - `pilothouse schedule --batch` in `--dst-policy upstream` and in the default `cron` policy.
//!
//! Both read the same IANA release: the Go program gets `ZONEINFO` pointing at the TZif files
//! bundled in Pilothouse (exported here), with `TZ=UTC` for its local zone.
//! Checks: upstream mode equals robfig on every case (validity, error text, next five times).
//! The cron policy parses identically, equals an independent evaluator that steps minute by
//! minute through local wall-clock time on every valid case, and differs from upstream only
//! where a DST transition lies between the start and the fifth run time.

use anyhow::{Context, Result, bail, ensure};
use cronjob::schedule::{Fields, Kind};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::tz::TimeZone;
use libtest_mimic::{Arguments, Failed, Trial};
use serde::Deserialize;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const CASES: usize = 12_000;
const COUNT: usize = 5;
/// Zones with DST (northern, southern, 30-minute, midnight, negative-DST, 2-hour), fixed ones
/// and invalid names; `None` = the local zone (UTC on both sides).
const ZONES: &[Option<&str>] = &[
    Some("America/New_York"),
    Some("Europe/London"),
    Some("Australia/Lord_Howe"),
    Some("Asia/Tokyo"),
    Some("America/Santiago"),
    Some("Europe/Dublin"),
    Some("Antarctica/Troll"),
    Some("Pacific/Chatham"),
    Some("America/St_Johns"),
    Some("Asia/Kolkata"),
    Some("Europe/Berlin"),
    Some("Australia/Sydney"),
    Some("UTC"),
    None,
    None,
    Some("Mars/Olympus"),
    Some("america/new_york"),
    Some(""),
    Some("Local"),
];

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
struct Answer {
    valid: bool,
    error: Option<String>,
    next: Vec<String>,
}

struct Case {
    schedule: String,
    zone: Option<&'static str>,
    from: Timestamp,
}

struct Run {
    cases: Vec<Case>,
    go: Vec<Answer>,
    upstream: Vec<Answer>,
    cron: Vec<Answer>,
}

/// splitmix64: a fixed seed gives the same corpus on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const MONTHS: &[&str] = &[
    "jan", "Feb", "MAR", "apr", "May", "jun", "JUL", "aug", "sep", "Oct", "nov", "DEC",
];
const DAYS: &[&str] = &["sun", "Mon", "TUE", "wed", "Thu", "fri", "SAT"];

fn item(rng: &mut Rng, min: i64, max: i64, names: &[&str]) -> String {
    let n = |rng: &mut Rng| rng.range(min, max);
    match rng.below(100) {
        0..=17 => "*".into(),
        18..=20 => "?".into(),
        21..=30 => format!("*/{}", rng.range(1, max.max(2))),
        31..=52 => n(rng).to_string(),
        53..=62 => {
            let a = n(rng);
            format!("{a}-{}", rng.range(a, max))
        }
        63..=67 => {
            let a = n(rng);
            format!("{a}-{}/{}", rng.range(a, max), rng.range(1, 10))
        }
        68..=71 => format!("{}/{}", n(rng), rng.range(1, 20)),
        72..=77 if !names.is_empty() => {
            let a = rng.below(names.len() as u64) as usize;
            if rng.chance(50) {
                names[a].to_string()
            } else {
                let b = rng.range(a as i64, names.len() as i64 - 1) as usize;
                format!("{}-{}", names[a], names[b])
            }
        }
        // Invalid or odd items: out of range, junk, signs, zeros, overflow, stray separators.
        78 => (max + 1).to_string(),
        79 => (min - 1).to_string(),
        80 => "x".into(),
        81 => "1-2-3".into(),
        82 => "*/0".into(),
        83 => "*/-1".into(),
        84 => format!("+{}", n(rng)),
        85 => format!("0{}", n(rng)),
        86 => "99999999999999999999".into(),
        87 => format!("{}-", n(rng)),
        88 => "*-3".into(),
        89 => "*/2/3".into(),
        90 => String::new(),
        91 => format!("{}/0", n(rng)),
        92 => "7".into(),
        93 => "é".into(),
        _ => n(rng).to_string(),
    }
}

fn field(rng: &mut Rng, min: i64, max: i64, names: &[&str]) -> String {
    let items = match rng.below(10) {
        0..=6 => 1,
        7..=8 => 2,
        _ => 3,
    };
    (0..items)
        .map(|_| item(rng, min, max, names))
        .collect::<Vec<_>>()
        .join(",")
}

fn schedule(rng: &mut Rng) -> String {
    let body = match rng.below(100) {
        0..=11 => rng
            .pick(&[
                "@yearly",
                "@annually",
                "@monthly",
                "@weekly",
                "@daily",
                "@midnight",
                "@hourly",
                "@reboot",
                "@daily ",
                "@Daily",
                "@every",
                "@every ",
            ])
            .to_string(),
        12..=17 => format!(
            "@every {}",
            rng.pick(&[
                "1m",
                "90s",
                "1h30m",
                "1.5h",
                "500ms",
                "-1m",
                "0",
                "1d",
                "1",
                ".5m",
                "2h45m30.5s",
                "1µs",
                "3h",
                "25h",
                "1m0.9s",
                "+2m",
                "1e3s",
                "1h1h",
            ])
        ),
        // Fixed-time daily/weekly/monthly schedules, the DST policy's subject.
        18..=45 => {
            let minute = if rng.chance(80) {
                rng.range(0, 59).to_string()
            } else {
                format!("{},{}", rng.range(0, 29), rng.range(30, 59))
            };
            let hour = rng
                .pick(&["0", "1", "2", "3", "1,2", "2-3", "23", "0,12", "12"])
                .to_string();
            let dom = if rng.chance(80) {
                "*".to_string()
            } else {
                field(rng, 1, 31, &[])
            };
            let dow = if rng.chance(80) {
                "*".to_string()
            } else {
                field(rng, 0, 6, DAYS)
            };
            format!("{minute} {hour} {dom} * {dow}")
        }
        _ => {
            let mut fields = vec![
                field(rng, 0, 59, &[]),
                field(rng, 0, 23, &[]),
                field(rng, 1, 31, &[]),
                field(rng, 1, 12, MONTHS),
                field(rng, 0, 6, DAYS),
            ];
            match rng.below(40) {
                0 => {
                    fields.pop();
                }
                1 => fields.push("0".into()),
                _ => {}
            }
            let sep = if rng.chance(10) { "\t " } else { " " };
            fields.join(sep)
        }
    };
    match rng.below(100) {
        0 => format!("TZ=UTC {body}"),
        1 => format!("CRON_TZ=Asia/Tokyo {body}"),
        2 => format!("TZ=Bad/Zone {body}"),
        3 => "TZ=UTC".into(),
        4 => format!("  {body}  "),
        5 => String::new(),
        _ => body,
    }
}

/// Transitions of `zone` between 2024 and 2031.
fn transitions(zone: &str) -> Vec<Timestamp> {
    let Ok(tz) = bundled(zone) else {
        return Vec::new();
    };
    let start: Timestamp = "2024-01-01T00:00:00Z".parse().expect("time");
    let end: Timestamp = "2031-01-01T00:00:00Z".parse().expect("time");
    tz.following(start)
        .map(|t| t.timestamp())
        .take_while(|t| *t < end)
        .collect()
}

fn bundled(name: &str) -> Result<TimeZone> {
    let data = cronjob::zone::bundled_tzif(name).with_context(|| format!("no zone {name}"))?;
    Ok(TimeZone::tzif(name, data)?)
}

fn corpus() -> Vec<Case> {
    let mut rng = Rng(0x5eed_c0de_2026_1122);
    let mut near: std::collections::HashMap<&str, Vec<Timestamp>> = Default::default();
    (0..CASES)
        .map(|_| {
            let zone = *rng.pick(ZONES);
            let list = near
                .entry(zone.unwrap_or("UTC"))
                .or_insert_with(|| transitions(zone.unwrap_or("UTC")));
            let base: i64 = if !list.is_empty() && rng.chance(70) {
                let t = rng.pick(list).as_second();
                if rng.chance(70) {
                    t + rng.range(-3 * 3600, 3 * 3600)
                } else {
                    t + rng.range(-3 * 86_400, 86_400)
                }
            } else {
                rng.range(1_704_067_200, 1_956_528_000) // 2024 .. 2032
            };
            let base = if rng.chance(60) {
                base - base.rem_euclid(60)
            } else {
                base
            };
            let nanos = if rng.chance(20) {
                rng.range(1, 999_999_999)
            } else {
                0
            };
            let from = Timestamp::new(base, nanos as i32).expect("time");
            Case {
                schedule: schedule(&mut rng),
                zone,
                from,
            }
        })
        .collect()
}

fn lines(cases: &[Case]) -> String {
    let mut out = String::new();
    for c in cases {
        let mut q = json!({"schedule": c.schedule, "from": c.from.to_string()});
        if let Some(z) = c.zone {
            q["timeZone"] = json!(z);
        }
        out.push_str(&q.to_string());
        out.push('\n');
    }
    out
}

fn answer_all(mut cmd: Command, input: &str, n: usize) -> Result<Vec<Answer>> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let input = input.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    let answers: Vec<Answer> = String::from_utf8(out.stdout)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(
        answers.len() == n,
        "{cmd:?} answered {} of {n} lines",
        answers.len()
    );
    Ok(answers)
}

/// Builds the Go program (cached by its sources' hash in ~/.cache/pilothouse).
fn go_binary() -> Result<PathBuf> {
    let src = pilothouse_tests::repo_root().join("tests/differential/cron");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for f in ["main.go", "go.mod", "go.sum"] {
        for b in std::fs::read(src.join(f))? {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    let home = std::env::var("HOME").context("HOME")?;
    let out = PathBuf::from(home).join(format!(".cache/pilothouse/crondiff-{hash:016x}"));
    if out.exists() {
        return Ok(out);
    }
    std::fs::create_dir_all(out.parent().context("parent")?)?;
    let status = Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "0")
        .status()
        .context("running go build (is Go installed? tests/cluster/build needs it too)")?;
    ensure!(
        status.success(),
        "go build of tests/differential/cron failed"
    );
    Ok(out)
}

/// The bundled TZif files as a ZONEINFO directory for Go.
fn zoneinfo_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "pilothouse-zoneinfo-{}-{}",
        cronjob::zone::tzdata_version(),
        std::process::id()
    ));
    for name in cronjob::zone::bundled_names() {
        let data = cronjob::zone::bundled_tzif(name).context("bundled zone")?;
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().context("parent")?)?;
        std::fs::write(path, data)?;
    }
    Ok(dir)
}

fn run() -> &'static Result<Run, String> {
    static RUN: OnceLock<Result<Run, String>> = OnceLock::new();
    RUN.get_or_init(|| {
        let go = go_binary().map_err(|e| format!("{e:#}"))?;
        let zoneinfo = zoneinfo_dir().map_err(|e| format!("{e:#}"))?;
        let cases = corpus();
        let input = lines(&cases);
        let mut cmd = Command::new(&go);
        cmd.arg(format!("-count={COUNT}"))
            .env("ZONEINFO", &zoneinfo)
            .env("TZ", "UTC");
        let go = answer_all(cmd, &input, cases.len()).map_err(|e| format!("{e:#}"))?;
        let ours = |policy: &str| -> Result<Vec<Answer>> {
            let mut cmd = Command::new(pilothouse_tests::pilothouse::binary()?);
            cmd.args([
                "--cronjob-default-time-zone=UTC",
                "schedule",
                "--batch",
                &format!("--count={COUNT}"),
                &format!("--dst-policy={policy}"),
            ]);
            answer_all(cmd, &input, cases.len())
        };
        let upstream = ours("upstream").map_err(|e| format!("{e:#}"))?;
        let cron = ours("cron").map_err(|e| format!("{e:#}"))?;
        let _ = std::fs::remove_dir_all(&zoneinfo);
        println!(
            "corpus: {} cases, {} valid per robfig, tzdata {} on both sides",
            cases.len(),
            go.iter().filter(|a| a.valid).count(),
            cronjob::zone::tzdata_version()
        );
        Ok(Run {
            cases,
            go,
            upstream,
            cron,
        })
    })
}

fn instants(a: &Answer) -> Result<Vec<Timestamp>> {
    a.next
        .iter()
        .map(|t| t.parse::<Timestamp>().with_context(|| t.clone()))
        .collect()
}

fn describe(c: &Case) -> String {
    format!("{:?} zone {:?} from {}", c.schedule, c.zone, c.from)
}

fn upstream_mode_equals_robfig() -> Result<()> {
    let r = run().as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut bad = Vec::new();
    for ((c, go), ours) in r.cases.iter().zip(&r.go).zip(&r.upstream) {
        let same = go.valid == ours.valid
            && go.error == ours.error
            && if c.schedule.contains("TZ") {
                instants(go)? == instants(ours)?
            } else {
                go.next == ours.next
            };
        if !same {
            bad.push(format!("{}\n  go:   {go:?}\n  ours: {ours:?}", describe(c)));
        }
    }
    println!(
        "upstream mode: {} of {} cases differ from robfig/cron",
        bad.len(),
        r.cases.len()
    );
    if !bad.is_empty() {
        bail!(
            "{} cases differ; first ones:\n{}",
            bad.len(),
            bad[..bad.len().min(10)].join("\n")
        );
    }
    Ok(())
}

/// Wall-clock evaluator written without the controller's evaluators: it walks UTC minutes, reads
/// the local wall clock from the zone's offsets, and applies JB-12 to what it sees.
struct Walker<'a> {
    f: &'a Fields,
    tz: TimeZone,
}

impl Walker<'_> {
    fn offset(&self, u: i64) -> i64 {
        i64::from(
            self.tz
                .to_offset(Timestamp::from_second(u).expect("time"))
                .seconds(),
        )
    }

    fn next_transition(&self, u: i64) -> i64 {
        self.tz
            .following(Timestamp::from_second(u).expect("time"))
            .next()
            .map_or(i64::MAX, |t| t.timestamp().as_second())
    }

    /// (minute, hour, day, month, weekday, year) of a local wall time in seconds.
    fn fields_of(w: i64) -> (u32, u32, u32, u32, u32, i64) {
        let days = w.div_euclid(86_400);
        let secs = w.rem_euclid(86_400);
        let date = k8s_openapi::jiff::civil::Date::new(1970, 1, 1)
            .expect("date")
            .checked_add(k8s_openapi::jiff::Span::new().days(days))
            .expect("date");
        (
            (secs % 3600 / 60) as u32,
            (secs / 3600) as u32,
            date.day() as u32,
            date.month() as u32,
            date.weekday().to_sunday_zero_offset() as u32,
            i64::from(date.year()),
        )
    }

    fn date_matches(&self, w: i64) -> bool {
        let (_, _, day, month, weekday, _) = Self::fields_of(w);
        let bit = |bits: u64, n: u32| bits & (1 << n) != 0;
        let star = 1u64 << 63;
        let (dom, dow) = (bit(self.f.dom, day), bit(self.f.dow, weekday));
        let day_ok = if self.f.dom & star != 0 || self.f.dow & star != 0 {
            dom && dow
        } else {
            dom || dow
        };
        bit(self.f.month, month) && day_ok
    }

    fn matches(&self, w: i64) -> bool {
        let (minute, hour, ..) = Self::fields_of(w);
        let bit = |bits: u64, n: u32| bits & (1 << n) != 0;
        bit(self.f.minute, minute) && bit(self.f.hour, hour) && self.date_matches(w)
    }

    fn next(&self, from: i64, count: usize) -> Vec<i64> {
        let limit_year = Self::fields_of(from + 1 + self.offset(from + 1)).5 + 5;
        let mut u = from - from.rem_euclid(60) - 2 * 86_400;
        let mut off = self.offset(u);
        let mut change = self.next_transition(u);
        let mut prev = u + off;
        let mut seen = prev;
        let mut out = Vec::new();
        while out.len() < count {
            // Skip whole local days the date fields rule out, when no transition is near.
            if !self.date_matches(prev) && change > u + 3 * 86_400 {
                let to_midnight = 86_400 - prev.rem_euclid(86_400);
                u += to_midnight - 60;
                prev += to_midnight - 60;
                seen = seen.max(prev);
            }
            u += 60;
            if u >= change {
                off = self.offset(u);
                change = self.next_transition(u);
            }
            let w = u + off;
            if Self::fields_of(w).5 > limit_year {
                break;
            }
            let fire = if w > prev + 60 {
                // Spring forward: wall times prev+60 .. w-60 never happened.
                let skipped = (1..(w - prev) / 60).any(|k| self.matches(prev + 60 * k));
                (self.f.fixed_time && skipped) || self.matches(w)
            } else {
                // Normal or after a fall back: a repeated wall time runs again only if elapsed.
                self.matches(w) && (!self.f.fixed_time || w > seen)
            };
            if fire && u > from {
                out.push(u);
            }
            seen = seen.max(w);
            prev = w;
        }
        out
    }
}

fn cron_policy_differs_only_at_dst() -> Result<()> {
    let r = run().as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    let zones = cronjob::Zones::from_flag("UTC").map_err(anyhow::Error::msg)?;
    let (mut differing, mut checked, mut bad) = (0, 0, Vec::new());
    for ((c, up), cron) in r.cases.iter().zip(&r.upstream).zip(&r.cron) {
        if up.valid != cron.valid || up.error != cron.error {
            bad.push(format!(
                "{}: parse differs: {up:?} vs {cron:?}",
                describe(c)
            ));
            continue;
        }
        if !cron.valid {
            continue;
        }
        let sched = cronjob::parse_for(&c.schedule, c.zone, &zones).map_err(anyhow::Error::msg)?;
        let from = c.from.as_second() - i64::from(c.from.subsec_nanosecond() < 0);
        let got: Vec<i64> = instants(cron)?.iter().map(|t| t.as_second()).collect();
        if let Kind::Fields(f) = &sched.kind {
            let walker = Walker {
                f,
                tz: bundled(&sched.zone.name).or_else(|_| Ok::<_, anyhow::Error>(TimeZone::UTC))?,
            };
            let want = walker.next(from, COUNT);
            checked += 1;
            if want != got {
                bad.push(format!(
                    "{}: cron policy {got:?}, wall-clock walker {want:?}",
                    describe(c)
                ));
                continue;
            }
        }
        if up.next != cron.next {
            differing += 1;
            // Only a DST transition may explain it: one between the start and the last time
            // compared, or one just before the start when the start lies inside a repeated
            // hour (its first pass then precedes the start). No zone shifts by more than 3 h.
            let last = instants(up)?
                .into_iter()
                .chain(instants(cron)?)
                .max()
                .map_or(from, |t| t.as_second());
            let tz = bundled(&sched.zone.name).unwrap_or(TimeZone::UTC);
            let transition = tz
                .following(Timestamp::from_second(from - 3 * 3600)?)
                .next()
                .is_some_and(|t| t.timestamp().as_second() <= last);
            if !transition || matches!(sched.kind, Kind::Every(_)) {
                bad.push(format!(
                    "{}: differs from upstream without a DST change: {up:?} vs {cron:?}",
                    describe(c)
                ));
            }
        }
    }
    println!(
        "cron policy: {checked} cases checked against the wall-clock walker; {differing} differ from upstream, each across a DST transition"
    );
    ensure!(differing > 0, "the corpus never exercised a DST difference");
    if !bad.is_empty() {
        bail!(
            "{} problems; first ones:\n{}",
            bad.len(),
            bad[..bad.len().min(10)].join("\n")
        );
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let t = |name: &'static str, f: fn() -> Result<()>| {
        Trial::test(name, move || {
            f().map_err(|e| Failed::from(format!("{e:#}")))
        })
    };
    libtest_mimic::run(
        &args,
        vec![
            t("upstream_mode_equals_robfig", upstream_mode_equals_robfig),
            t(
                "cron_policy_differs_only_at_dst",
                cron_policy_differs_only_at_dst,
            ),
        ],
    )
    .exit();
}
