//! `start`: creates the object and, with `--wait`, follows it until [`verdict`] decides.

use super::cluster::{Cluster, api_error};
use super::render::{blocker_lines, counts, phase_text, progress_line};
use super::verdict::{Verdict, verdict};
use super::{EXIT_CANCELLED, Outcome, error};
use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use node_maintenance::types::{NodeMaintenance, Stage};
use shared::api::apierr;
use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::time::Duration;

pub(super) async fn start(cluster: &Cluster, object: NodeMaintenance, wait: bool) -> Outcome {
    let name = object.metadata.name.clone().unwrap_or_default();
    let node = object.spec.node_name.clone();
    match cluster.writer.create("", &object).await {
        Ok(_) => println!("nodemaintenance/{name} created: cordoning and draining {node}"),
        Err(e) if apierr::is_already_exists(&e) => {
            let existing: NodeMaintenance =
                cluster.writer.get("", &name).await.map_err(api_error)?;
            let active = existing.spec.node_name == node
                && existing.spec.stage != Stage::Complete
                && existing.metadata.deletion_timestamp.is_none();
            if !(active && wait) {
                return Err(error(format!(
                    "nodemaintenance/{name} already exists (node {}, stage {}); follow it with \
                     `pilothouse maintenance status {}` or choose another --name",
                    existing.spec.node_name,
                    existing.spec.stage.as_str(),
                    existing.spec.node_name
                )));
            }
            println!("nodemaintenance/{name} already exists for {node}; following it as it is");
        }
        Err(e) => return Err(api_error(e)),
    }
    if !wait {
        return Ok(());
    }
    follow(cluster.maintenances.clone(), &name).await
}

/// Shows progress as the object changes, until `verdict` decides.
struct View {
    bar: Option<indicatif::ProgressBar>,
    last_line: String,
    blockers: BTreeSet<String>,
}

impl View {
    fn new(terminal: bool) -> View {
        let bar = terminal.then(|| {
            // On stdout, the stream checked for a terminal (indicatif's default is stderr, where
            // the blocked-pod lines printed through the bar would vanish if it were redirected).
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::stdout(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} evicted  {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        View {
            bar,
            last_line: String::new(),
            blockers: BTreeSet::new(),
        }
    }

    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    fn update(&mut self, nm: &NodeMaintenance) {
        // Each blocker once, when it appears or its reason or message changes.
        for line in blocker_lines(nm) {
            if self.blockers.insert(line.clone()) {
                self.println(&line);
            }
        }
        let line = progress_line(nm);
        match &self.bar {
            Some(bar) => {
                let (targeted, evicted, terminating, pending, blocked) = counts(nm);
                bar.set_prefix(format!("{} {}", nm.spec.node_name, phase_text(nm)));
                bar.set_length(u64::try_from(targeted).unwrap_or(0));
                bar.set_position(u64::try_from(evicted).unwrap_or(0));
                bar.set_message(format!(
                    "{terminating} terminating, {pending} pending, {blocked} blocked"
                ));
            }
            None if line != self.last_line => println!("{line}"),
            None => {}
        }
        self.last_line = line;
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

/// Watches the one object with kube's watcher on the command's client (see [`Cluster`]: the
/// shared caches are the process's, not a one-shot command's); its backoff re-lists after a
/// failed watch, each failure printed as a warning.
async fn follow(api: Api<NodeMaintenance>, name: &str) -> Outcome {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut view = View::new(std::io::stdout().is_terminal());
    let started = tokio::time::Instant::now();
    let mut seen = false;
    let mut acted_on = false;
    let mut warned = false;
    let result = loop {
        let next = match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            Ok(n) => n,
            Err(_) => {
                // Nothing has written a status yet: the controller is probably not running.
                if !acted_on && !warned && started.elapsed() >= Duration::from_secs(15) {
                    warned = true;
                    view.println(
                        "warning: no status after 15s: is node-maintenance-controller enabled \
                         (pilothouse --controllers=...,node-maintenance-controller)?",
                    );
                }
                continue;
            }
        };
        let event = match next {
            None => break Err(error("the watch ended")),
            Some(Err(e)) => {
                view.println(&format!("warning: watch: {e}; retrying"));
                continue;
            }
            Some(Ok(e)) => e,
        };
        let nm = match event {
            watcher::Event::Apply(nm) | watcher::Event::InitApply(nm) => nm,
            watcher::Event::Delete(_) => {
                break Err((
                    EXIT_CANCELLED,
                    format!("nodemaintenance/{name} was deleted before the node drained"),
                ));
            }
            watcher::Event::InitDone if !seen => {
                break Err(error(format!("nodemaintenance/{name} not found")));
            }
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        seen = true;
        acted_on |= nm.status.is_some();
        view.update(&nm);
        match verdict(&nm) {
            Verdict::Waiting => {}
            Verdict::Drained => {
                let (targeted, evicted, ..) = counts(&nm);
                break Ok((targeted, evicted, nm.spec.node_name.clone()));
            }
            Verdict::Fail { code, message } => break Err((code, message)),
        }
    };
    view.finish();
    let (targeted, evicted, node) = result?;
    println!("{node} drained: {evicted} of {targeted} targeted pods evicted");
    Ok(())
}
