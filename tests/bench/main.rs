//! `bench`: runs benchmark workloads against upstream kube-controller-manager and Pilothouse on
//! fresh local control planes and writes Markdown tables and SVG plots (issue 6).
//!
//!   cargo build --release -p pilothouse && \
//!   cargo run --release -p pilothouse-tests --bin bench -- [--workload NAME[,NAME..]|all]
//!       [--pairs N] [--scale F] [--qps Q --burst B] [--out DIR]
//!
//! Without `--qps`/`--burst` every workload runs at upstream's defaults (20/30) and `job-burst`
//! and `cronjob-minutely` also at 200/400. Without `--pairs`: 1 pair for `cronjob-minutely`,
//! `node-outage`, `idle-scale`, `sts-rollout`, `sts-scale` and the EndpointSlice workloads
//! (`es-rollout`, `es-rollout-adaptive`, `es-restart`, `es-flap`, `es-flap-1s`, `es-flap-adaptive`,
//! `es-flap-adaptive-vs-0s`) and `node-drain` (NodeMaintenance against `kubectl drain`; each run is minutes of real clock, most of it waiting for schedules,
//! grace periods, a fixed window or a 20-qps client), 3 for `job-burst` and `job-failures`. At
//! 20/30 the Job, CronJob and StatefulSet workloads run both sides of a pair at once
//! (`bench::side_by_side`). The es-flap and es-rollout variants differ only in the batch period each side gets
//! (`bench::extra_args`, named in each table).

use anyhow::{Context, Result, bail};
use pilothouse_tests::bench::{self, Profile, WORKLOADS, Workload};
use std::path::PathBuf;

struct Args {
    workloads: Vec<&'static str>,
    pairs: Option<usize>,
    scale: f64,
    profile: Option<Profile>,
    out: PathBuf,
}

const UPSTREAM_DEFAULTS: Profile = Profile { qps: 20, burst: 30 };
const HIGH: Profile = Profile {
    qps: 200,
    burst: 400,
};

/// The (workload, profile, pairs) runs `a` asks for.
fn plan(a: &Args) -> Vec<(&'static str, Profile, usize)> {
    let pairs = |w: &str| {
        // The long real-clock workloads run one pair unless told otherwise.
        a.pairs.unwrap_or(
            if matches!(
                w,
                "cronjob-minutely"
                    | "node-outage"
                    | "idle-scale"
                    | "sts-rollout"
                    | "sts-scale"
                    | "node-drain"
            ) || w.starts_with("es-")
            {
                1
            } else {
                3
            },
        )
    };
    let mut out = Vec::new();
    for &w in &a.workloads {
        out.push((w, a.profile.unwrap_or(UPSTREAM_DEFAULTS), pairs(w)));
        if a.profile.is_none() && matches!(w, "job-burst" | "cronjob-minutely") {
            out.push((w, HIGH, pairs(w)));
        }
    }
    out
}

fn parse() -> Result<Args> {
    let mut a = Args {
        workloads: WORKLOADS.to_vec(),
        pairs: None,
        scale: 1.0,
        profile: None,
        out: pilothouse_tests::repo_root().join("tests/bench/results"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .with_context(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--workload" => {
                let v = value()?;
                a.workloads = if v == "all" {
                    WORKLOADS.to_vec()
                } else {
                    let mut picked = Vec::new();
                    for name in v.split(',') {
                        picked.push(*WORKLOADS.iter().find(|w| **w == name).with_context(
                            || format!("unknown workload {name}; known: {WORKLOADS:?}"),
                        )?);
                    }
                    picked
                };
            }
            "--pairs" => a.pairs = Some(value()?.parse()?),
            "--scale" => a.scale = value()?.parse()?,
            "--qps" => a.profile.get_or_insert(UPSTREAM_DEFAULTS).qps = value()?.parse()?,
            "--burst" => a.profile.get_or_insert(UPSTREAM_DEFAULTS).burst = value()?.parse()?,
            "--out" => a.out = PathBuf::from(value()?),
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.trim_start_matches("MemTotal:").trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} CPU(s) ({cpu}), {mem} memory, Linux {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim()
    )
}

/// The results page: a header, then every section file present in `out`, in workload order,
/// then the hand-written notes (`NOTES.md`) if any. Each section is one workload at one profile,
/// written by the run that measured it, so a run of some workloads keeps the others' results.
fn assemble(out: &std::path::Path) -> Result<String> {
    let version =
        std::fs::read_to_string(pilothouse_tests::repo_root().join("tests/cluster/versions.env"))?;
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .unwrap_or("?");
    let mut page = format!(
        "# Benchmark results\n\nKubernetes {version} (kube-controller-manager running only the controllers under test, in a process of its own); Pilothouse release build. Both sides get the same `--kube-api-qps`/`--kube-api-burst`. Ratios are Pilothouse / upstream (lower is better), the median of per-pair ratios. Each section names the command and machine that produced it.\n\n"
    );
    for w in WORKLOADS {
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(out)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{w}-qps")) && n.ends_with(".md"))
            })
            .collect();
        // qps20 before qps200.
        files.sort_by_key(|p| p.to_string_lossy().len());
        for f in files {
            page.push_str(&std::fs::read_to_string(f)?);
            page.push('\n');
        }
    }
    if let Ok(notes) = std::fs::read_to_string(out.join("NOTES.md")) {
        page.push_str(&notes);
    }
    Ok(page)
}

fn main() -> Result<()> {
    let args = parse()?;
    let command: Vec<String> = std::env::args().collect();
    println!("command: {}", command.join(" "));
    let rt = tokio::runtime::Runtime::new()?;
    std::fs::create_dir_all(&args.out)?;
    let machine = machine();
    let begun = std::time::Instant::now();
    // Progress lines carry the minutes since the start, so a run's length shows as it goes.
    let log = |l: String| println!("[{:5.1} min] {l}", begun.elapsed().as_secs_f64() / 60.0);
    for (name, profile, pairs) in plan(&args) {
        let w = Workload {
            name,
            scale: args.scale,
        };
        let started = std::time::Instant::now();
        let runs = rt.block_on(bench::run_pairs(&w, profile, pairs, &mut |l| log(l)))?;
        let table = bench::table(&w, profile, &runs);
        println!("\n{table}");
        let stem = format!("{name}-qps{}", profile.qps);
        bench::plot(&args.out.join(format!("{stem}.svg")), &w, &runs)?;
        let section = format!(
            "{table}\n![{name}]({stem}.svg)\n\nCommand: `{}` ({:.0} min for this workload and profile). Machine: {machine}.\n",
            command.join(" "),
            started.elapsed().as_secs_f64() / 60.0
        );
        // Written after every workload, so a long run that fails late keeps what it measured.
        std::fs::write(args.out.join(format!("{stem}.md")), section)?;
        std::fs::write(args.out.join("README.md"), assemble(&args.out)?)?;
    }
    println!(
        "wrote {} ({:.1} min in all)",
        args.out.join("README.md").display(),
        begun.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}
