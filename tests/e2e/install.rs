//! Installation artefacts (issue 18 §1): the Helm chart, the Kustomize base, the offline OCI
//! image, the alerts and the dashboard, against one local control plane.
//!
//! - The chart lints, refuses `*` in `--controllers`, renders exactly the Kustomize base (and
//!   manifests/rbac.yaml and rbac-controllers.yaml verbatim; with `useServiceAccountCredentials`
//!   rbac-service-account-credentials.yaml in place of the latter, and the flag), and passes the
//!   API server's dry run.
//! - The rendered manifests are applied for real: the Deployment's two pods land on two nodes
//!   (required anti-affinity) and the PodDisruptionBudget allows one disruption.
//! - The image built offline by tests/image/build runs as its user 65532 on a read-only root,
//!   with the chart's ServiceAccount token (TokenRequest) mounted where a kubelet mounts it and
//!   the chart's args: it becomes leader, serves /healthz and /metrics, and completes a Job.
//! - Every metric the alerts and the dashboard read is in that real scrape, and the alerts pass
//!   `promtool test rules` (tests/monitoring/alerts_test.yaml).

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::pilothouse::https_get;
use pilothouse_tests::webhook::{Match, Webhook};
use pilothouse_tests::{audit, repo_root, unique, wait};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

const MONITORING: &str =
    "podMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true";

/// helm and promtool, built once by tests/tools/build (cached in ~/.cache/pilothouse).
fn tools() -> Result<PathBuf> {
    static TOOLS: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    TOOLS
        .get_or_init(|| {
            let script = repo_root().join("tests/tools/build");
            let out = Command::new(&script)
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("running {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!("{} failed ({})", script.display(), out.status));
            }
            let text = String::from_utf8_lossy(&out.stdout);
            Ok(PathBuf::from(
                text.lines().last().unwrap_or_default().trim(),
            ))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Runs `program args` (stdin from `input`): Ok(stdout) or Err(status, stderr).
fn run(program: &Path, args: &[&str], input: Option<&str>) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", program.display()))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.unwrap_or_default().to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let _ = writer.join();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} {} ({}): {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn helm(args: &[&str]) -> Result<String> {
    run(&tools()?.join("helm"), args, None).map_err(anyhow::Error::msg)
}

fn chart() -> String {
    repo_root().join("charts/pilothouse").display().to_string()
}

/// `helm template` of the chart as release `pilothouse` in kube-system, with `extra` flags.
fn template(extra: &[&str]) -> Result<String> {
    let chart = chart();
    let mut args = vec![
        "template",
        "pilothouse",
        &chart,
        "--namespace",
        "kube-system",
        // The chart's kubeVersion asks for 1.37 or 1.38; helm template assumes 1.20 otherwise.
        "--kube-version",
        "1.37.1",
    ];
    args.extend_from_slice(extra);
    helm(&args)
}

fn kubectl(args: &[&str], input: Option<&str>) -> Result<String> {
    let kubeconfig = format!("--kubeconfig={}", cluster().kubeconfig.display());
    let mut all = vec![kubeconfig.as_str()];
    all.extend_from_slice(args);
    run(&cluster().bin_dir()?.join("kubectl"), &all, input).map_err(anyhow::Error::msg)
}

/// Minimal CustomResourceDefinitions for the Prometheus Operator's PodMonitor and PrometheusRule
/// (group, version, kind and scope as the operator's; any content), so the chart's monitoring
/// objects can be applied and compared here. Their content is checked by promtool instead.
fn ensure_monitoring_crds() -> Result<()> {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().expect("crd lock");
    if *done {
        return Ok(());
    }
    let mut crds = String::new();
    for (kind, plural) in [
        ("PodMonitor", "podmonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        crds.push_str(&format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {plural}.monitoring.coreos.com\nspec:\n  group: monitoring.coreos.com\n  scope: Namespaced\n  names:\n    kind: {kind}\n    plural: {plural}\n    singular: {}\n    listKind: {kind}List\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n---\n",
            kind.to_lowercase()
        ));
    }
    kubectl(&["apply", "-f", "-"], Some(&crds))?;
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
        None,
    )?;
    // Discovery may trail Established: wait until kubectl maps the kinds.
    for _ in 0..100 {
        if kubectl(
            &["api-resources", "--api-group=monitoring.coreos.com"],
            None,
        )?
        .contains("prometheusrules")
        {
            *done = true;
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("the monitoring CRDs never appeared in discovery")
}

/// Objects of a multi-document YAML stream, as kubectl parses them (client side, no defaults),
/// keyed by kind/namespace/name.
fn objects(yaml: &str) -> Result<BTreeMap<String, Value>> {
    let out = kubectl(
        &[
            "create",
            "--dry-run=client",
            "--validate=false",
            "-o",
            "json",
            "-f",
            "-",
        ],
        Some(yaml),
    )?;
    // One JSON document per object (or one List).
    let mut items = vec![];
    for v in serde_json::Deserializer::from_str(&out).into_iter::<Value>() {
        let v = v?;
        match v["kind"].as_str() {
            Some("List") => items.extend(v["items"].as_array().cloned().unwrap_or_default()),
            _ => items.push(v),
        }
    }
    let mut map = BTreeMap::new();
    for o in items {
        let key = format!(
            "{}/{}/{}",
            o["kind"].as_str().unwrap_or_default(),
            o["metadata"]["namespace"].as_str().unwrap_or_default(),
            o["metadata"]["name"].as_str().unwrap_or_default()
        );
        ensure!(
            map.insert(key.clone(), o).is_none(),
            "{key} is rendered twice"
        );
    }
    Ok(map)
}

fn kustomize(dir: &str) -> Result<String> {
    kubectl(
        &["kustomize", &repo_root().join(dir).display().to_string()],
        None,
    )
}

fn diff(
    a_name: &str,
    a: &BTreeMap<String, Value>,
    b_name: &str,
    b: &BTreeMap<String, Value>,
) -> Result<()> {
    let ak: BTreeSet<_> = a.keys().collect();
    let bk: BTreeSet<_> = b.keys().collect();
    ensure!(
        ak == bk,
        "{a_name} and {b_name} render different objects: only in {a_name}: {:?}; only in {b_name}: {:?}",
        ak.difference(&bk).collect::<Vec<_>>(),
        bk.difference(&ak).collect::<Vec<_>>()
    );
    for (k, v) in a {
        ensure!(
            &b[k] == v,
            "{k} differs:\n{a_name}: {}\n{b_name}: {}",
            serde_json::to_string_pretty(v)?,
            serde_json::to_string_pretty(&b[k])?
        );
    }
    Ok(())
}

/// The chart lints (strictly, with and without monitoring) and refuses a wildcard or an
/// exclusion in the controllers list.
async fn chart_lints_and_refuses_wildcards() -> Result<()> {
    helm(&["lint", "--strict", &chart()])?;
    helm(&["lint", "--strict", &chart(), "--set", MONITORING])?;
    helm(&[
        "lint",
        "--strict",
        &chart(),
        "--set",
        "useServiceAccountCredentials=true",
    ])?;
    for bad in [
        "controllers={*}",
        "controllers={job-controller,-cronjob-controller}",
        "controllers=null",
    ] {
        match template(&["--set", bad]) {
            Ok(_) => bail!("the chart rendered with --set {bad}"),
            Err(e) => ensure!(
                format!("{e:#}").contains("controllers:"),
                "--set {bad} failed for another reason: {e:#}"
            ),
        }
    }
    let rendered = objects(&template(&[])?)?;
    let deploy = &rendered["Deployment/kube-system/pilothouse"];
    let args: Vec<&str> = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("no args")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let controllers: Vec<&str> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--controllers="))
        .collect();
    ensure!(controllers.len() == 1, "one --controllers flag: {args:?}");
    ensure!(
        !controllers[0].contains('*') && controllers[0].split(',').count() >= 7,
        "an explicit list of every built controller: {}",
        controllers[0]
    );
    ensure!(
        !controllers[0].contains("node-maintenance-controller"),
        "node-maintenance-controller is off by default: {}",
        controllers[0]
    );
    // Its CRD ships in the chart's crds/ (a link to crds/, so never a stale copy).
    let crd =
        std::fs::read_to_string(repo_root().join("crds/nodemaintenances.pilothouse.dev.yaml"))?;
    let key = "CustomResourceDefinition//nodemaintenances.pilothouse.dev";
    let with_crds = objects(&template(&["--include-crds"])?)?;
    ensure!(
        with_crds
            .get(key)
            .context("no NodeMaintenance CRD in the chart")?
            == objects(&crd)?.get(key).context("no CRD in crds/")?,
        "the chart's CRD is not crds/nodemaintenances.pilothouse.dev.yaml"
    );
    Ok(())
}

/// Default values render exactly manifests/ (the Kustomize base); monitoring values add exactly
/// manifests/monitoring, useServiceAccountCredentials exactly its flag and
/// manifests/rbac-service-account-credentials.yaml in place of rbac-controllers.yaml; the RBAC is
/// manifests/rbac.yaml's and rbac-controllers.yaml's. And the base has what an HA
/// kube-system component needs.
async fn chart_renders_the_kustomize_base() -> Result<()> {
    ensure_monitoring_crds()?;
    let base = objects(&kustomize("manifests")?)?;
    diff(
        "helm template (defaults)",
        &objects(&template(&[])?)?,
        "kubectl kustomize manifests",
        &base,
    )?;
    let mut with_monitoring = base.clone();
    with_monitoring.extend(objects(&kustomize("manifests/monitoring")?)?);
    diff(
        "helm template (monitoring on)",
        &objects(&template(&["--set", MONITORING])?)?,
        "kustomize manifests + manifests/monitoring",
        &with_monitoring,
    )?;
    // useServiceAccountCredentials adds exactly manifests/rbac-service-account-credentials.yaml
    // and the flag.
    let manifest = |file: &str| -> Result<BTreeMap<String, Value>> {
        objects(&std::fs::read_to_string(repo_root().join(file))?)
    };
    let controllers_rbac = manifest("manifests/rbac-controllers.yaml")?;
    let mut with_credentials = base.clone();
    with_credentials.retain(|k, _| !controllers_rbac.contains_key(k));
    with_credentials.extend(objects(&std::fs::read_to_string(
        repo_root().join("manifests/rbac-service-account-credentials.yaml"),
    )?)?);
    let args = &mut with_credentials
        .get_mut("Deployment/kube-system/pilothouse")
        .context("no Deployment in the base")?["spec"]["template"]["spec"]["containers"][0]["args"];
    let flags = args.as_array_mut().context("no args in the base")?;
    let at = flags
        .iter()
        .position(|a| a == "--logging-format=json")
        .context("no --logging-format in the base")?;
    flags.insert(at + 1, json!("--use-service-account-credentials"));
    diff(
        "helm template (useServiceAccountCredentials)",
        &objects(&template(&["--set", "useServiceAccountCredentials=true"])?)?,
        "kustomize manifests + manifests/rbac-service-account-credentials.yaml",
        &with_credentials,
    )?;
    let mut rbac = manifest("manifests/rbac.yaml")?;
    ensure!(
        rbac.len() >= 4 && controllers_rbac.len() >= 9,
        "manifests/rbac.yaml and rbac-controllers.yaml parsed to {} and {} objects",
        rbac.len(),
        controllers_rbac.len()
    );
    rbac.extend(controllers_rbac);
    for (k, v) in &rbac {
        ensure!(
            base.get(k) == Some(v),
            "{k} of manifests/rbac.yaml or rbac-controllers.yaml is not rendered as is"
        );
    }
    let rest: Vec<_> = base.keys().filter(|k| !rbac.contains_key(*k)).collect();
    ensure!(
        rest == [
            "Deployment/kube-system/pilothouse",
            "PodDisruptionBudget/kube-system/pilothouse"
        ],
        "besides RBAC the base renders {rest:?}"
    );

    let d = &base["Deployment/kube-system/pilothouse"]["spec"];
    let pod = &d["template"]["spec"];
    ensure!(
        d["replicas"].as_i64().unwrap_or(0) >= 2,
        "replicas: {}",
        d["replicas"]
    );
    ensure!(pod["priorityClassName"] == "system-cluster-critical");
    let anti =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    ensure!(
        anti[0]["topologyKey"] == "kubernetes.io/hostname"
            && anti[0]["labelSelector"]["matchLabels"] == d["selector"]["matchLabels"],
        "required anti-affinity across nodes: {anti}"
    );
    ensure!(
        pod["securityContext"]["runAsUser"] == 65532
            && pod["securityContext"]["runAsNonRoot"] == true
    );
    let c = &pod["containers"][0];
    ensure!(c["securityContext"]["readOnlyRootFilesystem"] == true);
    ensure!(
        c["resources"]["requests"]["memory"].is_string()
            && c["resources"]["limits"]["memory"].is_string(),
        "memory request and limit: {}",
        c["resources"]
    );
    let pdb = &base["PodDisruptionBudget/kube-system/pilothouse"]["spec"];
    ensure!(
        pdb["minAvailable"] == 1 && pdb["selector"] == d["selector"],
        "pdb: {pdb}"
    );
    Ok(())
}

/// Builds the image twice: the archives are identical, byte for byte.
async fn image_build_is_reproducible() -> Result<()> {
    let dir = log_dir().join(unique("image-repro"));
    std::fs::create_dir_all(&dir)?;
    let binary = pilothouse_tests::pilothouse::binary()?;
    let mut digests = vec![];
    for n in 0..2 {
        let out = dir.join(format!("pilothouse-{n}.tar"));
        build_image(&binary, &out)?;
        let sum = run(Path::new("sha256sum"), &[&out.display().to_string()], None)
            .map_err(anyhow::Error::msg)?;
        digests.push(
            sum.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string(),
        );
        std::fs::remove_file(&out)?;
    }
    ensure!(digests[0] == digests[1], "two builds differ: {digests:?}");
    Ok(())
}

fn build_image(binary: &Path, out: &Path) -> Result<()> {
    run(
        &repo_root().join("tests/image/build"),
        &[
            "--binary",
            &binary.display().to_string(),
            "--output",
            &out.display().to_string(),
        ],
        None,
    )
    .map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Metric names a PromQL expression reads: identifiers that are neither functions, keywords,
/// label names (in `{...}` or `by (...)`) nor durations.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
    ];
    let mut s = String::new();
    // Drop label matchers, ranges and strings.
    let mut depth = 0;
    let mut quote = false;
    for ch in expr.chars() {
        match ch {
            '"' if depth == 0 => quote = !quote,
            _ if quote => {}
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ if depth == 0 => s.push(ch),
            _ => {}
        }
    }
    // Drop label lists: `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`,
    // `group_left (...)`, `group_right (...)`.
    const LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = s.chars().collect();
    let mut cleaned = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut k = i;
            while k < chars.len() && chars[k].is_whitespace() {
                k += 1;
            }
            if LISTS.contains(&word.to_lowercase().as_str()) && chars.get(k) == Some(&'(') {
                while k < chars.len() && chars[k] != ')' {
                    k += 1;
                }
                i = k + 1;
                cleaned.push(' ');
            } else {
                cleaned.push_str(&word);
            }
        } else {
            cleaned.push(c);
            i += 1;
        }
    }
    let mut names = BTreeSet::new();
    let chars: Vec<char> = cleaned.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            let preceded_by_digit = start > 0 && chars[start - 1].is_ascii_digit();
            if next != Some(&'(')
                && !KEYWORDS.contains(&word.to_lowercase().as_str())
                && !preceded_by_digit
            {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every series name a scrape exposes (samples, and the families it declares).
fn exposed_names(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            let (Some(name), Some(kind)) = (w.next(), w.next()) else {
                continue;
            };
            names.insert(name.to_string());
            match kind {
                "counter" => {
                    names.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{s}"));
                    }
                }
                _ => {}
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// The alert and dashboard expressions of the monitoring manifests.
fn monitoring_expressions() -> Result<Vec<(String, String)>> {
    let rule = objects(&std::fs::read_to_string(
        repo_root().join("manifests/monitoring/prometheusrule.yaml"),
    )?)?;
    let rule = rule.values().next().context("no PrometheusRule")?;
    let mut exprs = vec![];
    for g in rule["spec"]["groups"].as_array().context("no groups")? {
        for r in g["rules"].as_array().context("no rules")? {
            exprs.push((
                format!("alert {}", r["alert"].as_str().unwrap_or("?")),
                r["expr"].as_str().context("no expr")?.to_string(),
            ));
        }
    }
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(
        repo_root().join("manifests/monitoring/pilothouse-dashboard.json"),
    )?)?;
    for p in dash["panels"].as_array().context("no panels")? {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push((
                format!("panel {:?}", p["title"].as_str().unwrap_or("?")),
                t["expr"].as_str().context("no expr")?.to_string(),
            ));
        }
    }
    Ok(exprs)
}

/// The expression parser finds exactly the metric names (checked on known input).
async fn metric_names_are_parsed() -> Result<()> {
    let got = metric_names(
        r#"histogram_quantile(0.99, sum by (namespace, pod, name, le) (rate(workqueue_queue_duration_seconds_bucket{job="pilothouse", name=~"a|b"}[5m]))) > 5 and on (pod) up{job="x"} == 1 or absent(foo:bar) offset 5m"#,
    );
    let want: BTreeSet<String> = ["workqueue_queue_duration_seconds_bucket", "up", "foo:bar"]
        .into_iter()
        .map(String::from)
        .collect();
    ensure!(got == want, "{got:?}");
    let scrape = "# TYPE a counter\na_total{x=\"1\"} 3\n# TYPE h histogram\n# TYPE g gauge\ng 1\n";
    let names = exposed_names(scrape);
    for n in ["a_total", "h_bucket", "h_count", "g"] {
        ensure!(names.contains(n), "{n} in {names:?}");
    }
    ensure!(!names.contains("h_total"));
    Ok(())
}

/// The rules as a Prometheus rule file (the PrometheusRule's spec), next to the promtool tests.
fn promtool_dir() -> Result<PathBuf> {
    let rule = objects(&std::fs::read_to_string(
        repo_root().join("manifests/monitoring/prometheusrule.yaml"),
    )?)?;
    let rule = rule.values().next().context("no PrometheusRule")?;
    let dir = log_dir().join(unique("promtool"));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("rules.yaml"),
        serde_json::to_string_pretty(&rule["spec"])?,
    )?;
    std::fs::copy(
        repo_root().join("tests/monitoring/alerts_test.yaml"),
        dir.join("alerts_test.yaml"),
    )?;
    Ok(dir)
}

/// promtool checks the rules and runs their unit tests: each alert fires where it should and
/// stays silent where it should not.
async fn alerts_pass_promtool() -> Result<()> {
    ensure_monitoring_crds()?;
    let dir = promtool_dir()?;
    let promtool = tools()?.join("promtool");
    let check = run(
        &promtool,
        &[
            "check",
            "rules",
            &dir.join("rules.yaml").display().to_string(),
        ],
        None,
    )
    .map_err(anyhow::Error::msg)?;
    ensure!(
        check.contains("SUCCESS: 12 rules found"),
        "promtool check rules: {check}"
    );
    let test = run(
        &promtool,
        &[
            "test",
            "rules",
            &dir.join("alerts_test.yaml").display().to_string(),
        ],
        None,
    )
    .map_err(anyhow::Error::msg)?;
    ensure!(test.contains("SUCCESS"), "promtool test rules: {test}");
    Ok(())
}

/// The API server accepts every rendered object (server-side dry run, monitoring included),
/// before anything is applied for real (a dry-run create of an object that appears meanwhile
/// would fail).
fn chart_passes_server_dry_run() -> Result<()> {
    // Every object the chart can render: monitoring on, node-maintenance-controller added
    // (the default list plus it) and its CRD, the service-account-credentials RBAC.
    let defaults = template(&[])?;
    let list = defaults
        .lines()
        .find_map(|l| l.trim().strip_prefix("- --controllers="))
        .context("no --controllers in the default rendering")?;
    let all = format!("controllers={{{list},node-maintenance-controller}}");
    // Each RBAC mode once: the controllers' bindings, or the service-account-credentials file.
    for credentials in ["false", "true"] {
        let mode = format!("useServiceAccountCredentials={credentials}");
        let rendered = template(&[
            "--set",
            MONITORING,
            "--set",
            &all,
            "--set",
            &mode,
            "--include-crds",
        ])?;
        ensure!(
            rendered.contains("--controllers=")
                && rendered.contains(",node-maintenance-controller"),
            "node-maintenance-controller not in the rendered flags"
        );
        let want = objects(&rendered)?.len();
        // kubectl fails when the API server refuses any object; each accepted one is a line.
        let out = kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&rendered))?;
        let accepted = out
            .lines()
            .filter(|l| l.ends_with("(server dry run)"))
            .count();
        ensure!(
            accepted == want && want > 20,
            "{mode}: {accepted} of {want} objects accepted:\n{out}"
        );
    }
    Ok(())
}

/// A kubelet-like run of the image: its archive unpacked to a read-only root, the chart's
/// ServiceAccount token at /var/run/secrets/kubernetes.io/serviceaccount, in-cluster environment,
/// user 65532, the Deployment's args (health and metrics moved to a free loopback port).
async fn installed_image_leads_and_completes_a_job() -> Result<()> {
    let c = cluster();
    let client = c.client().await?;

    // 1. The chart's manifests, applied for real (kwok nodes need one more toleration).
    let values = log_dir().join("kwok-values.json");
    std::fs::write(
        &values,
        json!({"tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
        ]})
        .to_string(),
    )?;
    ensure_monitoring_crds()?;
    chart_passes_server_dry_run()?;
    let rendered = template(&[
        "--values",
        &values.display().to_string(),
        "--set",
        MONITORING,
    ])?;
    kubectl(&["apply", "-f", "-"], Some(&rendered))?;
    let deploy = objects(&rendered)?
        .remove("Deployment/kube-system/pilothouse")
        .context("no Deployment rendered")?;

    // Two replicas on two different nodes; the budget allows exactly one disruption.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let nodes = wait::until(
        "two running Deployment pods",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=pilothouse"))
                .await?;
            let nodes: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            Ok((nodes.len() == 2).then_some(nodes))
        },
    )
    .await
    .with_context(|| {
        const SUMMARY: &str = "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} \
            {.status.phase} {.status.conditions}{\"\\n\"}{end}";
        let selector = "app.kubernetes.io/name=pilothouse";
        kubectl(
            &[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                selector,
                "-o",
                SUMMARY,
            ],
            None,
        )
        .unwrap_or_else(|e| format!("{e:#}"))
    })?;
    ensure!(nodes[0] != nodes[1], "both replicas on {}", nodes[0]);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "kube-system");
    wait::until(
        "the PodDisruptionBudget to allow one disruption",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let s = pdbs.get("pilothouse").await?.status.unwrap_or_default();
            Ok((s.current_healthy == Some(2) && s.disruptions_allowed == Some(1)).then_some(()))
        },
    )
    .await?;

    // 2. The chart's ServiceAccount token, mounted as a kubelet mounts it.
    let secrets = log_dir().join(unique("serviceaccount"));
    std::fs::create_dir_all(&secrets)?;
    let token = kubectl(
        &[
            "-n",
            "kube-system",
            "create",
            "token",
            "pilothouse",
            "--duration=2h",
        ],
        None,
    )?;
    std::fs::write(secrets.join("token"), token.trim())?;
    std::fs::copy(c.dir.join("pki/ca.crt"), secrets.join("ca.crt"))?;
    std::fs::write(secrets.join("namespace"), "kube-system")?;

    // 3. The image, built offline from the binary under test.
    let archive = log_dir().join("pilothouse-oci.tar");
    build_image(&pilothouse_tests::pilothouse::binary()?, &archive)?;

    let port = c.reserve_port()?;
    let metrics = format!("127.0.0.1:{port}");
    let mut args: Vec<String> = vec![];
    for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("no args")?
    {
        let a = a.as_str().context("arg not a string")?;
        // The pod's HTTPS port, moved to a free loopback port (the host's network is shared).
        args.push(if a.starts_with("--bind-address=") {
            "--bind-address=127.0.0.1".to_string()
        } else if a.starts_with("--secure-port=") {
            format!("--secure-port={port}")
        } else {
            a.to_string()
        });
    }
    ensure!(
        args.contains(&format!("--secure-port={port}"))
            && args.contains(&"--bind-address=127.0.0.1".to_string())
            && !args.iter().any(|a| a.starts_with("--metrics-bind-address")),
        "the Deployment serves HTTPS only: {args:?}"
    );
    let log = log_dir().join("image-pilothouse.log");
    let file = std::fs::File::create(&log)?;
    let root = log_dir().join("image-root");
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(repo_root().join("tests/image/oci.py"))
        .arg("run")
        .arg(format!("--archive={}", archive.display()))
        .arg(format!("--dir={}", root.display()))
        .arg(format!("--secrets={}", secrets.display()))
        .arg("--env=KUBERNETES_SERVICE_HOST=127.0.0.1")
        .arg(format!(
            "--env=KUBERNETES_SERVICE_PORT={}",
            c.apiserver_port()?
        ))
        .arg("--")
        .args(&args)
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("running the image")?;
    let pid = child.id().context("no pid")?;
    let result = async {
        let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
        // 4. It runs as the image's user and leads.
        wait::until(
            "the image's pilothouse to acquire the lease",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                Ok(log_text()
                    .contains("successfully acquired lease")
                    .then_some(()))
            },
        )
        .await?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap_or_default();
        ensure!(
            uid.split_whitespace().skip(1).all(|u| u == "65532"),
            "the process runs as {uid:?}"
        );
        let exe = std::fs::read_link(format!("/proc/{pid}/root"))?;
        ensure!(exe == root, "the process's root is {}", exe.display());
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
        let holder = leases
            .get("pilothouse")
            .await?
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        ensure!(
            !holder.is_empty() && log_text().contains(&holder),
            "lease kube-system/pilothouse is held by {holder:?}, not the image's process"
        );
        let (code, body) = https_get(&metrics, "/healthz", None, None).await?;
        ensure!(code == 200, "/healthz without a token: {code} {body}");
        // Ready once the leader's caches have synced, which may be after the lease: until then
        // the only answer allowed is that one.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (code, body) = https_get(&metrics, "/readyz", None, None).await?;
            let syncing = code == 503 && body.contains("[-]caches failed");
            if code == 200 {
                break;
            }
            ensure!(
                syncing && tokio::time::Instant::now() < deadline,
                "/readyz without a token: {code} {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (code, _) = https_get(&metrics, "/metrics", None, None).await?;
        ensure!(
            code == 401 || code == 403,
            "/metrics without a token: {code}"
        );

        // 5. Its controllers work: a Job's pods are created, counted and released.
        let ns = c.namespace("install").await?;
        let jobs = Jobs::new(client.clone(), &ns);
        jobs.create(&jobs::job(
            "two",
            json!({"completions": 2, "parallelism": 2}),
            jobs::template(Some(0), "1s"),
        )?)
        .await?;
        let done = jobs.wait_finished("two", Duration::from_secs(90)).await?;
        ensure!(
            jobs::condition(&done, "Complete").is_some()
                && done.status.as_ref().and_then(|s| s.succeeded) == Some(2),
            "job: {:?}",
            done.status
        );
        jobs.wait_no_finalizers("two", Duration::from_secs(30))
            .await?;
        let creators: BTreeSet<String> = audit::read(&c.audit_log())?
            .into_iter()
            .filter(|e| {
                e.stage == "ResponseComplete"
                    && e.verb == "create"
                    && e.object_ref
                        .as_ref()
                        .is_some_and(|o| o.resource == "pods" && o.namespace == ns)
                    // Not subresources (the scheduler's pods/binding).
                    && e.request_uri.split('?').next().is_some_and(|p| p.ends_with("/pods"))
            })
            .map(|e| e.user.username)
            .collect();
        ensure!(
            creators
                == BTreeSet::from(["system:serviceaccount:kube-system:pilothouse".to_string()]),
            "the Job's pods were created by {creators:?}"
        );

        // 6. The failures two alerts watch, made for real: a webhook refuses the job-controller's
        //    first two finalizer removals and the taint-eviction controller's first two marks of
        //    a pod on a NoExecute-tainted node; both go through on the third attempt.
        let free = (0..3)
            .map(|i| format!("kwok-node-{i}"))
            .find(|n| !nodes.contains(n))
            .context("no node free of Deployment pods")?;
        let hook =
            Webhook::start(client.clone(), &ns, &["pods", "pods/status"], &["UPDATE"]).await?;
        let failures = make_failures(&jobs, &hook, &free).await;
        let untaint = kubectl(
            &[
                "taint",
                "nodes",
                &free,
                "pilothouse.test/install:NoExecute-",
            ],
            None,
        );
        hook.remove().await?;
        failures?;
        ensure!(
            untaint.is_ok() || format!("{untaint:?}").contains("not found"),
            "removing the taint: {untaint:?}"
        );

        // 7. Every metric the alerts and the dashboard read is in this real scrape.
        //    Scraped as the PodMonitor scrapes: with the metrics reader's token.
        let reader = wait::until(
            "the metrics reader's token Secret to be filled",
            Duration::from_secs(60),
            Duration::from_millis(500),
            || async {
                let t = kubectl(
                    &[
                        "-n",
                        "kube-system",
                        "get",
                        "secret",
                        "pilothouse-metrics-reader-token",
                        "-o",
                        "jsonpath={.data.token}",
                    ],
                    None,
                )?;
                Ok((!t.trim().is_empty()).then(|| t.trim().to_string()))
            },
        )
        .await?;
        use base64::Engine;
        let reader = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(reader)?)?;
        let (code, scrape) = https_get(&metrics, "/metrics", Some(&reader), None).await?;
        ensure!(
            code == 200,
            "/metrics with the metrics reader's token: {code} {scrape}"
        );
        std::fs::write(log_dir().join("image-metrics.txt"), &scrape)?;
        ensure!(
            scrape
                .lines()
                .any(|l| l.starts_with("leader_election_master_status{name=\"pilothouse\"} 1")),
            "the scrape does not say this replica leads"
        );
        let exposed = exposed_names(&scrape);
        let mut missing = vec![];
        let mut used = BTreeSet::new();
        for (what, expr) in monitoring_expressions()? {
            for name in metric_names(&expr) {
                // `up` is written by Prometheus for every target, not by the target.
                if name != "up" && !exposed.contains(&name) {
                    missing.push(format!("{what}: {name}"));
                }
                used.insert(name);
            }
        }
        ensure!(
            missing.is_empty(),
            "metrics read but not exposed: {missing:#?}"
        );
        ensure!(used.len() >= 10, "only {used:?} read");
        c.delete_namespace(&ns).await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    kubectl(
        &["delete", "-f", "-", "--wait=false", "--ignore-not-found"],
        Some(&rendered),
    )?;
    result.map_err(|e| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        e.context(format!("image pilothouse log tail:\n{}", tail.join("\n")))
    })
}

/// A Job whose pods' finalizer removals are refused twice, and a pod whose marking for eviction
/// (a pods/status write) is refused twice after its node gets a NoExecute taint: both complete.
async fn make_failures(jobs: &Jobs, hook: &Webhook, node: &str) -> Result<()> {
    let ours = Some("serviceaccount:kube-system:pilothouse".to_string());
    hook.reject(
        Match {
            resource: Some("pods".into()),
            sub_resource: Some(String::new()),
            operation: Some("UPDATE".into()),
            user: ours.clone(),
            ..Default::default()
        },
        2,
        "finalizer removal refused by the install test",
    );
    jobs.create(&jobs::job(
        "held",
        json!({"completions": 1}),
        jobs::template(Some(0), "1s"),
    )?)
    .await?;
    jobs.wait_finished("held", Duration::from_secs(90)).await?;
    jobs.wait_no_finalizers("held", Duration::from_secs(60))
        .await?;

    hook.reject(
        Match {
            resource: Some("pods".into()),
            sub_resource: Some("status".into()),
            name: Some("victim".into()),
            user: ours,
            ..Default::default()
        },
        2,
        "eviction mark refused by the install test",
    );
    let victim: Pod = serde_json::from_value(json!({
        "metadata": {"name": "victim"},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "busybox"}]
        }
    }))?;
    jobs.pods.create(&Default::default(), &victim).await?;
    wait::until(
        "victim running",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let p = jobs.pods.get("victim").await?;
            Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
        },
    )
    .await?;
    kubectl(
        &[
            "taint",
            "nodes",
            node,
            "pilothouse.test/install=evict:NoExecute",
        ],
        None,
    )?;
    wait::until(
        "victim deleted by the taint-eviction controller",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            Ok(match jobs.pods.get_opt("victim").await? {
                None => Some(()),
                Some(p) => p.metadata.deletion_timestamp.map(|_| ()),
            })
        },
    )
    .await?;
    let refused = hook.seen().iter().filter(|s| !s.allowed).count();
    ensure!(
        refused == 4,
        "the webhook refused {refused} requests, not 4"
    );
    Ok(())
}

fn main() -> ! {
    pilothouse_tests::harness::main(
        "install",
        ClusterOptions::default(),
        None,
        vec![
            trial(
                "chart_lints_and_refuses_wildcards",
                chart_lints_and_refuses_wildcards,
            ),
            trial(
                "chart_renders_the_kustomize_base",
                chart_renders_the_kustomize_base,
            ),
            trial("image_build_is_reproducible", image_build_is_reproducible),
            trial("metric_names_are_parsed", metric_names_are_parsed),
            trial("alerts_pass_promtool", alerts_pass_promtool),
            trial(
                "dry_run_then_installed_image_leads_and_completes_a_job",
                installed_image_leads_and_completes_a_job,
            ),
        ],
    )
}
