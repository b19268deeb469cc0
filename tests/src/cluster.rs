//! A local control plane started by `tests/cluster/up` and stopped by `tests/cluster/down` when
//! the fixture is dropped (or explicitly with [`Cluster::down`]).

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Cluster {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub reference: bool,
    stopped: bool,
}

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub reference: bool,
    pub nodes: u32,
    pub zones: u32,
    /// The kube-controller-manager controllers to turn off (those the suite's Pilothouse runs);
    /// `None`: every controller Pilothouse has built.
    pub replace: Option<Vec<&'static str>>,
}

impl Cluster {
    /// A free loopback port reserved for this control plane until `down` (as `up` reserves
    /// its own): outside the ephemeral range, so no connection takes it before the bind.
    pub fn reserve_port(&self) -> Result<u16> {
        let script = crate::repo_root().join("tests/cluster/ports");
        let out = Command::new(&script)
            .arg(format!("--dir={}", self.dir.display()))
            .arg("1")
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        ensure!(
            out.status.success(),
            "tests/cluster/ports failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?.trim().parse()?)
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            reference: false,
            nodes: 3,
            zones: 3,
            replace: None,
        }
    }
}

impl Cluster {
    /// Starts (or reuses, if already up in that dir) a control plane in a temp dir named `name`.
    /// Fails with the build command if the control plane binaries cannot be built.
    pub fn up(name: &str, opts: ClusterOptions) -> Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("pilothouse-e2e-{name}"));
        let script = crate::repo_root().join("tests/cluster/up");
        let mut cmd = Command::new(&script);
        cmd.arg("--dir")
            .arg(&dir)
            .arg(format!("--nodes={}", opts.nodes))
            .arg(format!("--zones={}", opts.zones));
        if opts.reference {
            cmd.arg("--reference");
        }
        if let Some(list) = &opts.replace {
            cmd.arg(format!("--replace={}", list.join(",")));
        }
        let out = cmd
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!(
                "tests/cluster/up failed ({}). Build and start it by hand to see why: {} --dir {}\n{}",
                out.status,
                script.display(),
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        let kubeconfig = last
            .strip_prefix("KUBECONFIG=")
            .with_context(|| format!("tests/cluster/up printed no KUBECONFIG line: {stdout}"))?;
        Ok(Cluster {
            dir,
            kubeconfig: PathBuf::from(kubeconfig),
            reference: opts.reference,
            stopped: false,
        })
    }

    pub async fn client(&self) -> Result<Client> {
        client_for(&self.kubeconfig).await
    }

    /// The API server's port.
    pub fn apiserver_port(&self) -> Result<u16> {
        let p = std::fs::read_to_string(self.dir.join("ports/apiserver"))?;
        Ok(p.trim().parse()?)
    }

    /// A copy of the admin kubeconfig pointing at `127.0.0.1:port` (e.g. a proxy).
    pub fn kubeconfig_via(&self, port: u16, name: &str) -> Result<PathBuf> {
        let text = std::fs::read_to_string(&self.kubeconfig)?;
        let api = self.apiserver_port()?;
        let text = text.replace(
            &format!("https://127.0.0.1:{api}"),
            &format!("https://127.0.0.1:{port}"),
        );
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// The folder of the control plane's binaries (kubectl, ...).
    pub fn bin_dir(&self) -> Result<PathBuf> {
        Ok(PathBuf::from(
            std::fs::read_to_string(self.dir.join("bindir"))?.trim(),
        ))
    }

    /// Runs kubectl against this control plane as admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(self.bin_dir()?.join("kubectl"))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Applies manifests/rbac.yaml and rbac-controllers.yaml and returns a kubeconfig that authenticates as the
    /// `kube-system/pilothouse` ServiceAccount (a TokenRequest token), so a test run proves the
    /// shipped RBAC is enough.
    pub fn pilothouse_service_account_kubeconfig(&self) -> Result<PathBuf> {
        self.pilothouse_service_account_kubeconfig_with(&[
            "manifests/rbac.yaml",
            "manifests/rbac-controllers.yaml",
        ])
    }

    /// [`Cluster::pilothouse_service_account_kubeconfig`] with these RBAC files (relative to the
    /// repository root) applied in order.
    pub fn pilothouse_service_account_kubeconfig_with(&self, rbac: &[&str]) -> Result<PathBuf> {
        for file in rbac {
            let path = crate::repo_root().join(file);
            self.kubectl(&["apply", "-f", &path.to_string_lossy()])?;
        }
        let token = self.kubectl(&[
            "-n",
            "kube-system",
            "create",
            "token",
            "pilothouse",
            "--duration=24h",
        ])?;
        let api = self.apiserver_port()?;
        let ca = self.dir.join("pki/ca.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:{api}\n    certificate-authority: {}\nusers:\n- name: pilothouse\n  user:\n    token: {}\ncontexts:\n- name: local\n  context: {{cluster: local, user: pilothouse}}\ncurrent-context: local\n",
            ca.display(),
            token.trim()
        );
        let path = self.dir.join("pilothouse-sa.kubeconfig");
        std::fs::write(&path, text)?;
        Ok(path)
    }

    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// Creates a namespace for one test; delete it with [`Cluster::delete_namespace`].
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let name = crate::unique(prefix);
        let api: Api<Namespace> = Api::all(self.client().await?);
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &ns).await?;
        Ok(name)
    }

    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client().await?);
        api.delete(name, &DeleteParams::default()).await?;
        Ok(())
    }

    /// Restarts kube-controller-manager with `--controllers=<controllers>` and everything else
    /// as `tests/cluster/up` started it (the running process's own arguments and zone
    /// database), as an operator edits its static pod manifest; returns once it is healthy.
    pub async fn restart_kube_controller_manager(&self, controllers: &str) -> Result<()> {
        let port = std::fs::read_to_string(self.dir.join("ports/kube-controller-manager"))?;
        let url = format!("https://127.0.0.1:{}/healthz", port.trim());
        self.restart("kube-controller-manager", Self::DRAIN, |argv| {
            ensure!(
                argv.iter().any(|a| a.starts_with("--controllers=")),
                "kube-controller-manager has no --controllers: {argv:?}"
            );
            Ok(argv
                .into_iter()
                .map(|a| {
                    if a.starts_with("--controllers=") {
                        format!("--controllers={controllers}")
                    } else {
                        a
                    }
                })
                .collect())
        })
        .await?;
        self.wait_healthy(
            "kube-controller-manager",
            &["-skf", "--max-time", "2", &url],
        )
        .await
    }

    /// Restarts kube-apiserver (SIGTERM, SIGKILL after `grace` as a kubelet does at a pod's
    /// termination grace period, then the same command line; etcd keeps the data) and returns
    /// once it is ready; clients see refused connections meanwhile. (Left alone it drains open
    /// watches for its 60 s shutdown timeout.)
    pub async fn restart_kube_apiserver(&self, grace: std::time::Duration) -> Result<()> {
        self.restart("kube-apiserver", grace, Ok).await?;
        let pki = self.dir.join("pki");
        let url = format!("https://127.0.0.1:{}/readyz", self.apiserver_port()?);
        let (ca, cert, key) = (
            pki.join("ca.crt"),
            pki.join("admin.crt"),
            pki.join("admin.key"),
        );
        self.wait_healthy(
            "kube-apiserver",
            &[
                "-sf",
                "--max-time",
                "2",
                "--cacert",
                &ca.to_string_lossy(),
                "--cert",
                &cert.to_string_lossy(),
                "--key",
                &key.to_string_lossy(),
                &url,
            ],
        )
        .await
    }

    /// Restarts etcd (SIGTERM, then the same command line and data directory) and returns once
    /// it is healthy; the API server stays up and retries.
    pub async fn restart_etcd(&self) -> Result<()> {
        let mut url = String::new();
        self.restart("etcd", Self::DRAIN, |argv| {
            url = argv
                .iter()
                .find_map(|a| a.strip_prefix("--listen-client-urls="))
                .context("etcd has no --listen-client-urls")?
                .to_string();
            Ok(argv)
        })
        .await?;
        self.wait_healthy(
            "etcd",
            &["-sf", "--max-time", "2", &format!("{url}/health")],
        )
        .await
    }

    /// Stops the control-plane process `name` (its pid file under `pids/`) with SIGTERM and
    /// starts it again with `edit(its argv)` and its `ZONEINFO`, as `tests/cluster/up` starts it.
    /// How long a restarted process may take to stop before it is killed.
    const DRAIN: std::time::Duration = std::time::Duration::from_secs(70);

    async fn restart(
        &self,
        name: &str,
        grace: std::time::Duration,
        edit: impl FnOnce(Vec<String>) -> Result<Vec<String>>,
    ) -> Result<()> {
        let pid_file = self.dir.join(format!("pids/{name}"));
        let pid: i32 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
        let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))?
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let zoneinfo = std::fs::read(format!("/proc/{pid}/environ"))?
            .split(|b| *b == 0)
            .find_map(|v| {
                v.strip_prefix(b"ZONEINFO=")
                    .map(|z| String::from_utf8_lossy(z).into_owned())
            });
        let args = edit(argv)?;
        // SAFETY: kill(2) on the control plane's own child process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let soft = std::time::Instant::now() + grace;
        let hard = soft + std::time::Duration::from_secs(10);
        // A process this function started is our child: reap it (a zombie keeps its /proc entry).
        let running = || {
            // SAFETY: waitpid(2) with WNOHANG on a pid; it fails harmlessly if not our child.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit_once(')')
                    .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            })
        };
        while running() {
            let now = std::time::Instant::now();
            ensure!(now < hard, "{name} (pid {pid}) did not stop");
            if now >= soft {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let n = std::fs::read_dir(self.dir.join("logs"))?.count();
        let log = std::fs::File::create(self.dir.join(format!("logs/{name}-{n}.log")))?;
        let mut cmd = Command::new("setsid");
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(z) = zoneinfo {
            cmd.env("ZONEINFO", z);
        }
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        std::fs::write(&pid_file, format!("{}\n", child.id()))?;
        Ok(())
    }

    /// Polls `curl <args>` until it succeeds (90 s at most, as `tests/cluster/up` waits).
    async fn wait_healthy(&self, name: &str, curl: &[&str]) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        loop {
            let ok = Command::new("curl")
                .args(curl)
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "{name} did not become healthy after the restart"
            );
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }

    pub fn down(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let script = crate::repo_root().join("tests/cluster/down");
        let _ = Command::new(script).arg("--dir").arg(&self.dir).status();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}

pub async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}
