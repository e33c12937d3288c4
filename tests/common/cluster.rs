//! The one-node Kubernetes cluster of `scripts/k8s.sh` (`make test-k8s`; nextest's setup script
//! starts it and names it in MEDIA_TEST_K8S_DIR and MEDIA_TEST_KUBECONFIG): `kubectl` against
//! it, the shipped deployment (`deploy/k8s/overlays/local-cluster`: the base and the clamav
//! component) applied in a namespace of the test's own with the run's Kafka, S3 and ports, and
//! what the cluster says about its pods (status, events, logs). Everything it reaches is on
//! 127.0.0.1: the pods use the host's network.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::container::manifest_path;
use super::*;

pub struct Cluster {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// The run's cluster.
    pub fn shared() -> Cluster {
        let var = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: the cluster tests run under `make test-k8s`")
            })
        };
        Cluster {
            dir: var("MEDIA_TEST_K8S_DIR").into(),
            kubeconfig: var("MEDIA_TEST_KUBECONFIG").into(),
        }
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.dir.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap()
    }

    /// `kubectl args`, which must succeed: its output.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get ARGS -o json`.
    pub fn get(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&a)).unwrap()
    }

    /// The kubelet's port on 127.0.0.1 (HTTPS, its cAdvisor metrics at /metrics/cadvisor).
    pub fn kubelet_port(&self) -> u16 {
        let config = std::fs::read_to_string(self.dir.join("kubelet.yaml")).unwrap();
        config
            .lines()
            .find_map(|l| l.strip_prefix("port: "))
            .and_then(|p| p.trim().parse().ok())
            .expect("the kubelet's port in kubelet.yaml")
    }

    /// The kinds deploy/k8s uses beside the core ones and KEDA's (tests/k8s/crds.yaml).
    pub fn install_crds(&self) {
        let crds = manifest_path("tests/k8s/crds.yaml");
        self.kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()]);
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "crd/scaledobjects.keda.sh",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ]);
    }
}

/// What a test changes over the local-cluster overlay, beside the run's addresses.
#[derive(Default)]
pub struct Options {
    /// Lines added to the worker's configuration file (base/config/worker.toml).
    pub config: String,
    /// Further variables of the worker's environment (the media-worker-env ConfigMap).
    pub env: Vec<(String, String)>,
    /// JSON patch operations on the Deployment (YAML list items).
    pub patch: String,
    /// JSON patch operations on the ScaledObject (YAML list items).
    pub scaling: String,
}

/// deploy/k8s as the local-cluster overlay renders it, in a namespace of its own, against the
/// test's stack; the namespace is deleted when dropped.
pub struct Deployment<'a> {
    pub cluster: &'a Cluster,
    pub ns: String,
    /// The worker's HTTP port (health, metrics) on 127.0.0.1.
    pub http_port: u16,
    dir: tempfile::TempDir,
}

impl<'a> Deployment<'a> {
    pub fn apply(cluster: &'a Cluster, stack: &Stack, group: &str, o: &Options) -> Deployment<'a> {
        cluster.install_crds();
        let ns = format!("mw-{:08x}", fastrand::u32(..));
        let http_port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let base =
            std::fs::read_to_string(manifest_path("deploy/k8s/base/config/worker.toml")).unwrap();
        std::fs::write(
            dir.path().join("worker.toml"),
            format!("{base}\n{}", o.config),
        )
        .unwrap();
        let mut env = stack.worker_env(group);
        env.insert("HTTP_ADDR".into(), format!("127.0.0.1:{http_port}"));
        env.insert("KAFKA_UNIT_TOPIC".into(), stack.own("media.optimize.units"));
        env.insert(
            "KAFKA_UNIT_GROUP_ID".into(),
            format!("{}.units", stack.own(group)),
        );
        for (k, v) in &o.env {
            env.insert(k.clone(), v.clone());
        }
        let secret = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];
        let literals = |pick: bool| {
            let mut lines: Vec<String> = env
                .iter()
                .filter(|(k, _)| secret.contains(&k.as_str()) == pick)
                .map(|(k, v)| format!("      - {k}={v}"))
                .collect();
            lines.sort();
            lines.join("\n")
        };
        // Kustomize takes a resource outside the kustomization's folder by a relative path only.
        let overlay = Path::new(&"../".repeat(dir.path().components().count() - 1)).join(
            manifest_path("deploy/k8s/overlays/local-cluster")
                .strip_prefix("/")
                .unwrap(),
        );
        let kustomization = [
            "apiVersion: kustomize.config.k8s.io/v1beta1".to_owned(),
            "kind: Kustomization".into(),
            format!("namespace: {ns}"),
            "resources:".into(),
            format!("  - {}", overlay.display()),
            "configMapGenerator:".into(),
            "  - name: media-worker-env".into(),
            "    behavior: merge".into(),
            "    literals:".into(),
            literals(false),
            "  - name: media-worker-config".into(),
            "    behavior: replace".into(),
            "    files:".into(),
            "      - worker.toml".into(),
            "secretGenerator:".into(),
            "  - name: media-worker-s3".into(),
            "    literals:".into(),
            literals(true),
            "patches:".into(),
            "  - target: { kind: Deployment, name: media-worker }".into(),
            "    patch: |".into(),
            "      - op: replace".into(),
            "        path: /spec/template/spec/containers/0/ports/0/containerPort".into(),
            format!("        value: {http_port}"),
            indent(&o.patch, 6),
            // A patch must have an operation: a `test` that holds, then the test's own.
            "  - target: { kind: ScaledObject, name: media-worker }".into(),
            "    patch: |".into(),
            "      - op: test".into(),
            "        path: /kind".into(),
            "        value: ScaledObject".into(),
            indent(&o.scaling, 6),
        ]
        .join("\n");
        std::fs::write(dir.path().join("kustomization.yaml"), kustomization).unwrap();
        cluster.kubectl_ok(&["create", "namespace", &ns]);
        cluster.kubectl_ok(&["apply", "-k", dir.path().to_str().unwrap()]);
        Deployment {
            cluster,
            ns,
            http_port,
            dir,
        }
    }

    /// KEDA (`scripts/k8s.sh keda`) watching this namespace, until dropped.
    pub fn keda(&self) -> Keda<'_> {
        let out = Command::new(manifest_path("scripts/k8s.sh"))
            .arg("keda")
            .arg(&self.cluster.dir)
            .arg(&self.ns)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "k8s.sh keda: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Keda { d: self }
    }

    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", self.ns.as_str()];
        a.extend_from_slice(args);
        self.cluster.kubectl_ok(&a)
    }

    pub fn get(&self, args: &[&str]) -> Value {
        let mut a = vec!["-n", self.ns.as_str()];
        a.extend_from_slice(args);
        self.cluster.get(&a)
    }

    /// The worker's pods (terminating ones included).
    pub fn pods(&self) -> Vec<Value> {
        self.get(&["pods", "-l", "app.kubernetes.io/name=media-worker"])["items"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// The namespace's events, oldest first: (reason, object name, message).
    pub fn events(&self) -> Vec<(String, String, String)> {
        let mut items = self.get(&["events"])["items"].as_array().unwrap().clone();
        items.sort_by_key(|e| e["lastTimestamp"].as_str().unwrap_or("").to_owned());
        items
            .iter()
            .map(|e| {
                let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
                (
                    s(&e["reason"]),
                    s(&e["involvedObject"]["name"]),
                    s(&e["message"]),
                )
            })
            .collect()
    }

    /// Each pod's phase and containers' states, and the events: what a failure message shows.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for p in self.pods() {
            out += &format!(
                "pod {} {} ready={}\n",
                p["metadata"]["name"].as_str().unwrap_or(""),
                p["status"]["phase"].as_str().unwrap_or(""),
                ready(&p)
            );
            for kind in ["initContainerStatuses", "containerStatuses"] {
                for c in p["status"][kind].as_array().into_iter().flatten() {
                    out += &format!(
                        "  {} ready={} started={} restarts={} state={} last={}\n",
                        c["name"].as_str().unwrap_or(""),
                        c["ready"],
                        c["started"],
                        c["restartCount"],
                        c["state"],
                        c["lastState"]
                    );
                }
            }
        }
        for (reason, name, message) in self.events() {
            out += &format!("event {reason} {name}: {message}\n");
        }
        out
    }

    /// Waits until `n` pods of the worker are Ready and no other is there; panics with the
    /// pods' states and the events otherwise.
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let pods = self.pods();
            if pods.len() == n && pods.iter().all(ready) {
                return pods;
            }
            assert!(
                Instant::now() < deadline,
                "{n} Ready pods not there within {timeout:?}:\n{}",
                self.describe()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// A container's log (every run of it) in a pod, from the kubelet's log directory.
    pub fn logs(&self, pod: &str, container: &str) -> String {
        let root = self.cluster.dir.join("pod-logs");
        let mut out = String::new();
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&format!("{}_{pod}_", self.ns)) {
                continue;
            }
            let mut runs: Vec<PathBuf> = std::fs::read_dir(e.path().join(container))
                .into_iter()
                .flatten()
                .flatten()
                .map(|f| f.path())
                .collect();
            runs.sort();
            for r in runs {
                out += &std::fs::read_to_string(&r).unwrap_or_default();
            }
        }
        out
    }

    /// The kustomization the test applied (for a test that applies it again, changed).
    pub fn kustomization_dir(&self) -> &Path {
        self.dir.path()
    }
}

/// KEDA's operator and metrics adapter, running against the cluster for one deployment's
/// namespace; stopped when dropped (their logs printed if the test is failing).
pub struct Keda<'a> {
    d: &'a Deployment<'a>,
}

impl Keda<'_> {
    /// The operator's log so far.
    pub fn operator_log(&self) -> String {
        std::fs::read_to_string(self.d.cluster.dir.join("keda-operator.log")).unwrap_or_default()
    }
}

impl Drop for Keda<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for piece in ["keda-operator", "keda-adapter"] {
                let log = std::fs::read_to_string(self.d.cluster.dir.join(format!("{piece}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- {piece}'s log, last lines:");
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        let _ = Command::new(manifest_path("scripts/k8s.sh"))
            .arg("keda-down")
            .arg(&self.d.cluster.dir)
            .output();
    }
}

impl Drop for Deployment<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- cluster state of {}:\n{}", self.ns, self.describe());
        }
        let _ = self.cluster.kubectl(&[
            "delete",
            "namespace",
            &self.ns,
            "--wait=true",
            "--timeout=120s",
        ]);
    }
}

/// The pod's Ready condition.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn indent(text: &str, n: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}", " ".repeat(n)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every worker pod's log, each read from its container's start to its end: a rollout deletes
/// the pods it replaces, and the kubelet their log files with them, so a scenario that counts
/// work over a rollout reads them as they grow. Each file (the kubelet's, in the cluster's
/// directory: nothing dials the node) is kept open once seen, so that what a pod wrote last is
/// still read after the kubelet unlinks it.
pub struct PodLogs {
    logs: Arc<Mutex<BTreeMap<String, Followed>>>,
    stop: Arc<AtomicBool>,
    /// The watcher's passes over the files so far.
    passes: Arc<std::sync::atomic::AtomicU64>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

/// One pod's worker log so far (the CRI lines' content, partial lines joined) and its files
/// still there.
#[derive(Default)]
struct Followed {
    text: String,
    partial: String,
    /// By inode.
    open: Vec<(u64, std::fs::File)>,
}

impl Followed {
    /// Reads what each open file has gained; closes the unlinked ones once read.
    fn read(&mut self) {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let mut gained = Vec::new();
        self.open.retain_mut(|(_, f)| {
            let gone = f.metadata().map_or(true, |m| m.nlink() == 0);
            let _ = f.read_to_end(&mut gained);
            !gone
        });
        // `{time} {stream} {P|F} {content}`: P, a partial line continued by the next.
        for line in String::from_utf8_lossy(&gained).lines() {
            let mut parts = line.splitn(4, ' ');
            let (_, _, tag, content) = (parts.next(), parts.next(), parts.next(), parts.next());
            self.partial.push_str(content.unwrap_or(""));
            if tag != Some("P") {
                self.text.push_str(&std::mem::take(&mut self.partial));
                self.text.push('\n');
            }
        }
    }
}

impl PodLogs {
    /// Follows the worker container of every pod the deployment has or will have.
    pub fn follow(d: &Deployment) -> PodLogs {
        let logs = Arc::new(Mutex::new(BTreeMap::<String, Followed>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let root = d.cluster.dir.join("pod-logs");
        let prefix = format!("{}_", d.ns);
        let watcher = {
            let (logs, stop, passes) = (logs.clone(), stop.clone(), passes.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut logs = logs.lock().unwrap();
                    // `{ns}_{pod}_{uid}/media-worker/{restart}.log`
                    for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let Some(pod) = name.strip_prefix(&prefix).and_then(|r| r.rsplit_once('_'))
                        else {
                            continue;
                        };
                        let followed = logs.entry(pod.0.to_owned()).or_default();
                        let dir = e.path().join("media-worker");
                        for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                            // By inode: a rotated log keeps its file under a new name, and a
                            // new file takes the old name.
                            use std::os::unix::fs::MetadataExt;
                            let Ok(ino) = f.metadata().map(|m| m.ino()) else {
                                continue;
                            };
                            if followed.open.iter().any(|(i, _)| *i == ino) {
                                continue;
                            }
                            if let Ok(file) = std::fs::File::open(f.path()) {
                                followed.open.push((ino, file));
                            }
                        }
                    }
                    for f in logs.values_mut() {
                        f.read();
                    }
                    drop(logs);
                    passes.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        PodLogs {
            logs,
            stop,
            passes,
            watcher: Some(watcher),
        }
    }

    /// Each pod's log so far, by pod name.
    pub fn snapshot(&self) -> Vec<(String, String)> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .map(|(pod, f)| (pod.clone(), f.text.clone()))
            .collect()
    }

    /// Every pod's whole log, once every pod but the deployment's current ones has gone from
    /// the API: a pod is deleted once its containers have stopped, so its log is whole after
    /// one more pass of the watcher.
    pub fn whole(&self, d: &Deployment) -> Vec<(String, String)> {
        let running: Vec<String> = d
            .pods()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        let passed = self.passes.load(Ordering::SeqCst);
        while self.passes.load(Ordering::SeqCst) < passed + 2 {
            std::thread::sleep(Duration::from_millis(50));
        }
        let logs = self.snapshot();
        assert!(
            running.iter().all(|p| logs.iter().any(|(q, _)| q == p)),
            "{running:?} unread"
        );
        logs
    }
}

impl Drop for PodLogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}
