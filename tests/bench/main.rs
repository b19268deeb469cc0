//! `bench`: runs benchmark workloads against upstream kube-controller-manager and Pilothouse on
//! fresh local control planes and writes Markdown tables and SVG plots (issue 6).
//!
//!   cargo build --release -p pilothouse && \
//!   cargo run --release -p pilothouse-tests --bin bench -- [--workload NAME[,NAME..]|all]
//!       [--pairs N] [--scale F] [--qps Q --burst B] [--out DIR]
//!
//! Without `--qps`/`--burst` every workload runs at upstream's defaults (20/30) and `job-burst`
//! and `cronjob-minutely` also at 200/400. Without `--pairs`: 3 pairs for the Job workloads,
//! 1 for `cronjob-minutely` (each run lasts about seven minutes of real clock).

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
        a.pairs
            .unwrap_or(if w == "cronjob-minutely" { 1 } else { 3 })
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

fn main() -> Result<()> {
    let args = parse()?;
    let command: Vec<String> = std::env::args().collect();
    println!("command: {}", command.join(" "));
    let rt = tokio::runtime::Runtime::new()?;
    std::fs::create_dir_all(&args.out)?;
    let mut report = format!(
        "# Benchmark results\n\nCommand: `{}`\n\nMachine: {}\n\nKubernetes {} (kube-controller-manager running only the controllers under test, in a process of its own); Pilothouse release build. Both sides get the same `--kube-api-qps`/`--kube-api-burst`. Ratios are Pilothouse / upstream (lower is better), the median of per-pair ratios.\n\n",
        command.join(" "),
        machine(),
        std::fs::read_to_string(pilothouse_tests::repo_root().join("tests/cluster/versions.env"))?
            .lines()
            .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
            .unwrap_or("?")
    );
    for (name, profile, pairs) in plan(&args) {
        let w = Workload {
            name,
            scale: args.scale,
        };
        let runs = rt.block_on(bench::run_pairs(&w, profile, pairs, &mut |l| {
            println!("{l}")
        }))?;
        let table = bench::table(&w, profile, &runs);
        println!("\n{table}");
        let file = format!("{name}-qps{}.svg", profile.qps);
        bench::plot(&args.out.join(&file), &w, &runs)?;
        report.push_str(&table);
        report.push_str(&format!("\n![{name}]({file})\n\n"));
        // Written after every workload, so a long run that fails late keeps what it measured.
        std::fs::write(args.out.join("README.md"), &report)?;
    }
    let md = args.out.join("README.md");
    std::fs::write(&md, &report)?;
    println!("wrote {}", md.display());
    Ok(())
}
