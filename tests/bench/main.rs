//! `bench`: runs benchmark workloads against upstream kube-controller-manager and Pilothouse on
//! fresh local control planes and writes Markdown tables and SVG plots (issue 6).
//!
//!   cargo build --release -p pilothouse && \
//!   cargo run --release -p pilothouse-tests --bin bench -- [--workload job-burst|job-failures|all]
//!       [--pairs N] [--scale F] [--qps Q] [--burst B] [--out DIR]

use anyhow::{Context, Result, bail};
use pilothouse_tests::bench::{self, Profile, WORKLOADS, Workload};
use std::path::PathBuf;

struct Args {
    workloads: Vec<&'static str>,
    pairs: usize,
    scale: f64,
    profile: Profile,
    out: PathBuf,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        workloads: WORKLOADS.to_vec(),
        pairs: 3,
        scale: 1.0,
        profile: Profile { qps: 20, burst: 30 },
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
                a.workloads =
                    if v == "all" {
                        WORKLOADS.to_vec()
                    } else {
                        vec![*WORKLOADS.iter().find(|w| **w == v).with_context(|| {
                            format!("unknown workload {v}; known: {WORKLOADS:?}")
                        })?]
                    };
            }
            "--pairs" => a.pairs = value()?.parse()?,
            "--scale" => a.scale = value()?.parse()?,
            "--qps" => a.profile.qps = value()?.parse()?,
            "--burst" => a.profile.burst = value()?.parse()?,
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
    for name in &args.workloads {
        let w = Workload {
            name,
            scale: args.scale,
        };
        let runs = rt.block_on(bench::run_pairs(&w, args.profile, args.pairs, &mut |l| {
            println!("{l}")
        }))?;
        let table = bench::table(&w, args.profile, &runs);
        println!("\n{table}");
        let svg = args.out.join(format!("{name}.svg"));
        bench::plot(&svg, &w, &runs)?;
        report.push_str(&table);
        report.push_str(&format!("\n![{name}]({name}.svg)\n\n"));
    }
    let md = args.out.join("README.md");
    std::fs::write(&md, &report)?;
    println!("wrote {}", md.display());
    Ok(())
}
