//! Containers of the worker's image in this machine's Docker Engine, run as `deploy/k8s` runs the
//! pod (tests/container.rs, benches/container.rs): the pod's uid, every capability dropped, no
//! new privileges, a read-only root with a tmpfs at /scratch, the pod's memory and CPU limits,
//! tini as PID 1, the host's network (every connection stays on loopback).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::worker::{consuming, jobs, metric};
use super::*;

pub fn docker(args: &[&str]) -> Output {
    let bin = std::env::var("DOCKER").unwrap_or_else(|_| "docker".into());
    Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{bin} {args:?}: {e} (run `make setup-test image`)"))
}

/// `docker args`, which must succeed: its output, trimmed.
pub fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub fn manifest_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// What `deploy/k8s/base/deployment.yaml` gives the pod, checked to be what these tests run.
pub struct Pod {
    pub user: String,
    pub memory: String,
    pub cpus: String,
    pub grace: Duration,
}

pub fn pod() -> Pod {
    let text = std::fs::read_to_string(manifest_path("deploy/k8s/base/deployment.yaml")).unwrap();
    let d: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let spec = &d["spec"]["template"]["spec"];
    let (pod_sc, c) = (&spec["securityContext"], &spec["containers"][0]);
    let sc = &c["securityContext"];
    assert_eq!(pod_sc["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        pod_sc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    assert_eq!(c["volumeMounts"][0]["mountPath"].as_str(), Some("/scratch"));
    let limits = &c["resources"]["limits"];
    let memory = limits["memory"].as_str().unwrap();
    let id = |k: &str| pod_sc[k].as_u64().unwrap();
    Pod {
        user: format!("{}:{}", id("runAsUser"), id("runAsGroup")),
        // Kubernetes' Gi and Mi are docker's g and m (both binary).
        memory: memory.replace("Gi", "g").replace("Mi", "m"),
        cpus: limits["cpu"].as_str().unwrap().to_owned(),
        grace: Duration::from_secs(spec["terminationGracePeriodSeconds"].as_u64().unwrap()),
    }
}

/// One container of an image, started as the pod starts it; removed when dropped.
pub struct Container {
    pub id: String,
    pub http: SocketAddr,
}

impl Container {
    /// `image` with the worker's `env` and further `docker run` arguments (mounts). The
    /// deployment's worker.toml is mounted where the pod's ConfigMap is.
    pub fn run(image: &str, env: &HashMap<String, String>, extra: &[&str]) -> Container {
        remove_orphans();
        let pod = pod();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let config = format!(
            "{}:/etc/media-worker/worker.toml:ro",
            manifest_path("deploy/k8s/base/config/worker.toml").display()
        );
        let mut args: Vec<String> = [
            "run",
            "--detach",
            &format!("--label=media-worker-test={}", std::process::id()),
            "--user",
            &pod.user,
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--read-only",
            "--tmpfs=/scratch",
            "--memory",
            &pod.memory,
            "--cpus",
            &pod.cpus,
            "--network=host",
            "--volume",
            &config,
            "--env=MEDIA_WORKER_CONFIG=/etc/media-worker/worker.toml",
            "--env=MEDIA_SANDBOX_REQUIRE=true",
        ]
        .map(String::from)
        .into();
        args.push(format!("--env=HTTP_ADDR={http}"));
        args.extend(env.iter().map(|(k, v)| format!("--env={k}={v}")));
        args.extend(extra.iter().map(|a| a.to_string()));
        args.extend([image.to_owned(), "run".to_owned()]);
        let id = docker_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        Container { id, http }
    }

    pub fn inspect(&self, format: &str) -> String {
        docker_ok(&["inspect", "-f", format, &self.id])
    }

    pub fn running(&self) -> bool {
        self.inspect("{{.State.Running}}") == "true"
    }

    /// Waits until the worker consumes (ready, partitions assigned); fails at once if the
    /// container stops.
    pub fn wait_consuming(&self) {
        wait_for("the container's worker consuming", 2 * MINUTE, || {
            if consuming(self.http).is_some() {
                return Some(());
            }
            assert!(self.running(), "the container stopped:\n{}", self.logs());
            None
        });
    }

    pub fn logs(&self) -> String {
        let out = docker(&["logs", "--tail", "60", &self.id]);
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    pub fn metric(&self, line_start: &str) -> Option<f64> {
        metric(self.http, line_start)
    }

    pub fn layer(&self, name: &str) -> Option<f64> {
        self.metric(&format!("media_worker_sandbox_layers{{layer=\"{name}\"}}"))
    }

    /// A path of the container's filesystem (its mounts included: the /scratch tmpfs, its /proc),
    /// as the host reaches it: the image has no shell or tools to `docker exec`.
    pub fn path(&self, p: &str) -> PathBuf {
        let tini: i32 = self.inspect("{{.State.Pid}}").parse().unwrap();
        PathBuf::from(format!("/proc/{tini}/root{p}"))
    }

    /// The worker's pid as the host sees it: tini's only child.
    pub fn worker_host_pid(&self) -> i32 {
        let tini: i32 = self.inspect("{{.State.Pid}}").parse().unwrap();
        assert!(cmdline(tini).contains("tini"), "PID 1: {}", cmdline(tini));
        let children = children_of(tini);
        assert_eq!(children.len(), 1, "tini's children: {children:?}");
        children[0]
    }

    /// The worker's pid inside the container (what a job process would aim at): the last of its
    /// `NSpid` (the pid in each namespace, the host's first).
    pub fn worker_pid(&self) -> i32 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.worker_host_pid())).unwrap();
        let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
        nspid
            .and_then(|ids| ids.split_whitespace().last()?.parse().ok())
            .unwrap_or_else(|| panic!("NSpid: {nspid:?}"))
    }

    /// Waits until at least two jobs (the pool's) are in flight: how many are.
    pub fn jobs_running(&self) -> usize {
        wait_for("jobs in flight", MINUTE, || {
            let j = jobs(self.http).len();
            (j >= 2).then_some(j)
        })
    }

    /// `docker stop` (SIGTERM to tini, which forwards it; SIGKILL after `grace`): how long it
    /// took and the exit code.
    pub fn stop(&self, grace: Duration) -> (Duration, i32) {
        let t = Instant::now();
        docker_ok(&["stop", "-t", &grace.as_secs().to_string(), &self.id]);
        let took = t.elapsed();
        (took, self.inspect("{{.State.ExitCode}}").parse().unwrap())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- container log ----\n{}", self.logs());
        }
        let _ = docker(&["rm", "--force", &self.id]);
    }
}

/// The file `path` of `image`, copied out of a container created from it (never started) into
/// `dir`: where it is on the host.
pub fn image_file(image: &str, path: &str, dir: &Path) -> PathBuf {
    let id = docker_ok(&["create", image]);
    let out = docker(&["cp", &format!("{id}:{path}"), &dir.display().to_string()]);
    docker_ok(&["rm", &id]);
    assert!(out.status.success(), "docker cp {path}: {out:?}");
    dir.join(Path::new(path).file_name().unwrap())
}

/// The label `key` of `image` (empty when it has none).
pub fn image_label(image: &str, key: &str) -> String {
    let format = format!("{{{{index .Config.Labels \"{key}\"}}}}");
    docker_ok(&["image", "inspect", "-f", &format, image])
}

/// Removes the containers of test processes that are gone (killed at their time limit, say:
/// no `Drop` ran).
pub fn remove_orphans() {
    let listed = docker_ok(&[
        "ps",
        "--all",
        "--filter=label=media-worker-test",
        "--format={{.ID}} {{.Label \"media-worker-test\"}}",
    ]);
    for line in listed.lines() {
        if let Some((id, pid)) = line.split_once(' ')
            && !Path::new("/proc").join(pid).exists()
        {
            let _ = docker(&["rm", "--force", id]);
        }
    }
}
