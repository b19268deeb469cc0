//! The benchmark harness's smoke run for CI (issue 6): job-burst at 1 % size, node-outage at
//! 5 % (10 nodes with 10 pods each, one failing), es-flap with 5 pods and es-restart with 10
//! Services (4 s windows), node-drain with one node of 50 pods, one pair each, both sides,
//! against real control planes. Checks the harness measures something on both sides, that both
//! ended in the same state, and that the table and plot are produced. Numbers at this
//! size say nothing about performance and are not reported as results.

use anyhow::{Result, ensure};
use libtest_mimic::Arguments;
use pilothouse_tests::bench::{self, Profile, Side, Workload};
use pilothouse_tests::harness::trial;

async fn smoke() -> Result<()> {
    // The debug build the test command makes (the real runs use the release build).
    bench::use_binary(pilothouse_tests::pilothouse::binary()?);
    let w = Workload {
        name: "job-burst",
        scale: 0.01,
    };
    let p = Profile { qps: 20, burst: 30 };
    let runs = bench::run_pairs(&w, p, 1, &mut |l| println!("{l}")).await?;
    ensure!(runs.len() == 2, "{} runs", runs.len());
    for (side, r) in &runs {
        ensure!(
            r.converge_seconds > 0.0 && r.cpu_seconds > 0.0 && r.peak_rss_mib > 1.0,
            "{side:?}: {r:?}"
        );
        ensure!(
            r.requests.get("create").copied().unwrap_or(0) >= 6,
            "{side:?} pod creates not attributed: {:?}",
            r.requests
        );
        ensure!(
            r.requests.contains_key("update"),
            "{side:?} status updates not attributed: {:?}",
            r.requests
        );
        ensure!(
            r.state.len() == 6 && r.series.last().map(|s| s.1) == Some(6),
            "{side:?}: {:?}",
            r.state
        );
    }
    ensure!(
        runs.iter().any(|(s, _)| *s == Side::Upstream)
            && runs.iter().any(|(s, _)| *s == Side::Pilothouse)
    );
    let table = bench::table(&w, p, &runs);
    println!("{table}");
    ensure!(
        table.contains("| time to converge (s) |") && table.contains("| requests: create |"),
        "{table}"
    );
    let svg = std::env::temp_dir().join(format!("bench-smoke-{}.svg", std::process::id()));
    bench::plot(&svg, &w, &runs)?;
    let text = std::fs::read_to_string(&svg)?;
    ensure!(
        text.contains("<svg") && text.contains("job-burst"),
        "no plot"
    );
    let _ = std::fs::remove_file(svg);
    Ok(())
}

/// node-outage at 5 %: one zone of 10 nodes with 10 pods each; one node fails; its 10 pods are
/// deleted on both sides and the latencies from grace expiry are measured.
async fn smoke_node_outage() -> Result<()> {
    bench::use_binary(pilothouse_tests::pilothouse::binary()?);
    let w = Workload {
        name: "node-outage",
        scale: 0.05,
    };
    let p = Profile { qps: 20, burst: 30 };
    let runs = bench::run_pairs(&w, p, 1, &mut |l| println!("{l}")).await?;
    for (side, r) in &runs {
        let extra = |k: &str| r.extra.get(k).copied().unwrap_or(f64::NAN);
        ensure!(
            extra("evictions (pods deleted)") == 10.0 && extra("nodes tainted NoExecute") == 1.0,
            "{side:?}: {:?}",
            r.extra
        );
        // Measured from grace expiry: neither side can taint before it, nor (with a 5 s
        // monitor period at most) more than a few seconds after.
        let taint = extra("taint after grace expiry max (s)");
        ensure!((0.0..15.0).contains(&taint), "{side:?}: taint at {taint}");
        ensure!(
            r.requests.get("patch").copied().unwrap_or(0) >= 1,
            "{side:?} node or pod patches not attributed: {:?}",
            r.requests
        );
        // 10 nodes and their 100 pods.
        ensure!(r.state.len() == 110, "{side:?}: {} objects", r.state.len());
    }
    println!("{}", bench::table(&w, p, &runs));
    Ok(())
}

/// es-flap with 5 pods flipping twice each (not ready, ready) over a 4 s window.
async fn smoke_es_flap() -> Result<()> {
    bench::use_binary(pilothouse_tests::pilothouse::binary()?);
    let w = Workload {
        name: "es-flap",
        scale: 0.01,
    };
    let p = Profile { qps: 20, burst: 30 };
    let runs = bench::run_pairs(&w, p, 1, &mut |l| println!("{l}")).await?;
    ensure!(runs.len() == 2, "{} runs", runs.len());
    for (side, r) in &runs {
        let extra = |k: &str| r.extra.get(k).copied().unwrap_or(f64::NAN);
        ensure!(
            extra("flips seen (pod Ready changes)") == 10.0,
            "{side:?}: {:?}",
            r.extra
        );
        // Every flip is a slice update at batch period 0 (ES-16), give or take coalescing.
        ensure!(
            r.requests.get("update").copied().unwrap_or(0) >= 1 && r.cpu_seconds > 0.0,
            "{side:?}: {:?}",
            r.requests
        );
        ensure!(
            extra("flip → shown p50 (s)").is_finite(),
            "{side:?}: {:?}",
            r.extra
        );
    }
    println!("{}", bench::table(&w, p, &runs));
    Ok(())
}

/// es-restart with 10 Services of 5 pods: each side restarts on the slices and is measured.
async fn smoke_es_restart() -> Result<()> {
    bench::use_binary(pilothouse_tests::pilothouse::binary()?);
    let w = Workload {
        name: "es-restart",
        scale: 0.001,
    };
    let p = Profile { qps: 20, burst: 30 };
    let runs = bench::run_pairs(&w, p, 1, &mut |l| println!("{l}")).await?;
    ensure!(runs.len() == 2, "{} runs", runs.len());
    for (side, r) in &runs {
        ensure!(
            r.state.len() == 10 && r.peak_rss_mib > 1.0,
            "{side:?}: {:?}",
            r.state
        );
        // Its (streaming) lists are attributed; the writes, which should be none, are reported
        // by the table, not judged here.
        ensure!(
            r.requests.get("watch").copied().unwrap_or(0) >= 4,
            "{side:?}: {:?}",
            r.requests
        );
    }
    println!("{}", bench::table(&w, p, &runs));
    Ok(())
}

/// node-drain at 10 %: one node of 50 pods (20 behind budgets) drained by a NodeMaintenance and
/// by `kubectl drain`: both empty the node, end in the same state, and their evictions (and the
/// refused ones) are attributed.
async fn smoke_node_drain() -> Result<()> {
    bench::use_binary(pilothouse_tests::pilothouse::binary()?);
    let w = Workload {
        name: "node-drain",
        scale: 0.1,
    };
    let p = Profile { qps: 20, burst: 30 };
    let runs = bench::run_pairs(&w, p, 1, &mut |l| println!("{l}")).await?;
    ensure!(runs.len() == 2, "{} runs", runs.len());
    for (side, r) in &runs {
        let extra = |k: &str| r.extra.get(k).copied().unwrap_or(f64::NAN);
        // 50 pods evicted at least once each; the budgets refuse some while replacements start.
        ensure!(
            extra("eviction requests") >= 50.0 && extra("evictions refused (429)").is_finite(),
            "{side:?}: {:?}",
            r.extra
        );
        ensure!(
            r.converge_seconds > 0.0 && r.series.last().map(|s| s.1) == Some(1),
            "{side:?}: {:?}",
            r.series
        );
        ensure!(
            r.state.get("node/drain-0").map(String::as_str) == Some("unschedulable=true pods=0"),
            "{side:?}: {:?}",
            r.state
        );
    }
    println!("{}", bench::table(&w, p, &runs));
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    libtest_mimic::run(
        &args,
        vec![
            trial("bench_smoke_job_burst", || Box::pin(smoke())),
            trial("bench_smoke_node_outage", || Box::pin(smoke_node_outage())),
            trial("bench_smoke_es_flap", || Box::pin(smoke_es_flap())),
            trial("bench_smoke_es_restart", || Box::pin(smoke_es_restart())),
            trial("bench_smoke_node_drain", || Box::pin(smoke_node_drain())),
        ],
    )
    .exit()
}
