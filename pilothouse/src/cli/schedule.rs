//! `pilothouse schedule`: an operator's check of a schedule before applying it, on exactly the
//! controller's parser and evaluator.

use cronjob::schedule::DstPolicy;
use cronjob::{CronJobOptions, Zones, parse_for};
// The jiff cronjob's schedules compute in: cronjob depends on the one k8s-openapi re-exports.
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::process::ExitCode;

// `pilothouse schedule`'s arguments (no doc comment: clap would make it the subcommand's about).
#[derive(clap::Args, Debug)]
pub struct ScheduleArgs {
    /// The schedule, as in spec.schedule (quote it). Not with --batch.
    pub schedule: Option<String>,
    /// spec.timeZone (IANA name); unset means the default zone.
    #[arg(long)]
    pub time_zone: Option<String>,
    /// Count from this instant (RFC 3339); default now.
    #[arg(long)]
    pub from: Option<String>,
    /// How many run times to print.
    #[arg(long, default_value_t = 5)]
    pub count: usize,
    #[arg(long, value_enum, default_value_t = DstPolicy::Cron)]
    pub dst_policy: DstPolicy,
    /// `text` or `json` ({"valid", "error", "next"}).
    #[arg(long, default_value = "text")]
    pub output: String,
    /// Read JSON lines {"schedule", "timeZone", "from"} on stdin; write one JSON answer per line.
    #[arg(long)]
    pub batch: bool,
}

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

/// `pilothouse schedule`: exit 0 when every schedule is valid, 1 otherwise, 2 on bad usage.
pub fn run(opts: &CronJobOptions, args: &ScheduleArgs) -> ExitCode {
    let zones = match Zones::from_flag(&opts.cronjob_default_time_zone) {
        Ok(z) => z,
        Err(e) => {
            eprintln!("pilothouse: --cronjob-default-time-zone: {e}");
            return ExitCode::from(2);
        }
    };
    let json = args.output == "json" || args.batch;
    if args.batch {
        let stdin = std::io::stdin();
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let mut all_valid = true;
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            let answer = match serde_json::from_str::<Query>(&line) {
                Ok(q) => answer(&q, args.count, args.dst_policy, &zones),
                Err(e) => Answer {
                    valid: false,
                    error: Some(format!("input line: {e}")),
                    next: Vec::new(),
                },
            };
            all_valid &= answer.valid;
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string(&answer).unwrap_or_default()
            );
        }
        let _ = out.flush();
        return if all_valid {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }
    let Some(schedule) = args.schedule.clone() else {
        eprintln!("pilothouse schedule: give a schedule, or --batch");
        return ExitCode::from(2);
    };
    let q = Query {
        schedule,
        time_zone: args.time_zone.clone(),
        from: args.from.clone(),
    };
    let answer = answer(&q, args.count, args.dst_policy, &zones);
    if json {
        println!("{}", serde_json::to_string(&answer).unwrap_or_default());
    } else if let Some(e) = &answer.error {
        println!("invalid: {e}");
    } else {
        println!("valid; next {} run times:", answer.next.len());
        for t in &answer.next {
            println!("  {t}");
        }
    }
    if answer.valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
