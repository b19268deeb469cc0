//! The benchmark harness's smoke run for CI (issue 6): job-burst at 1 % size, one pair, both
//! sides, against real control planes. Checks the harness measures something on both sides,
//! that both ended in the same state, and that the table and plot are produced. Numbers at this
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

fn main() {
    let args = Arguments::from_args();
    libtest_mimic::run(
        &args,
        vec![trial("bench_smoke_job_burst", || Box::pin(smoke()))],
    )
    .exit()
}
