//! The worker binary as a child process, and what a test reads from it (HTTP, metrics, log).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use super::*;

/// The worker binary, running `run`.
pub struct Worker {
    child: Child,
    pub http: SocketAddr,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Worker {
    pub fn start(env: &HashMap<String, String>) -> Worker {
        let mut worker = Worker::spawn(env);
        wait_port(
            worker.http.port(),
            &mut worker.child,
            "worker http",
            &worker.log,
        );
        if let Some(api) = env.get("API_ADDR") {
            let port = api.rsplit(':').next().unwrap().parse().unwrap();
            wait_port(port, &mut worker.child, "worker API", &worker.log);
        }
        worker
    }

    /// [`Worker::start`] on one CPU (`taskset`), as a one-core pod: it and every process it
    /// starts run there, and it sizes itself for one core.
    /// `n` workers on `env`, each with a `WORKER_ID` of its own (`worker-{i}`), every one
    /// ready.
    pub async fn fleet(env: &HashMap<String, String>, n: usize) -> Vec<Worker> {
        let fleet: Vec<Worker> = (0..n)
            .map(|i| {
                let mut env = env.clone();
                env.insert("WORKER_ID".into(), format!("worker-{i}"));
                Worker::start(&env)
            })
            .collect();
        for w in &fleet {
            w.ready().await;
        }
        fleet
    }

    pub fn start_on_cpu(env: &HashMap<String, String>, cpu: usize) -> Worker {
        let mut worker = Worker::spawn_on(env, Some(cpu));
        wait_port(
            worker.http.port(),
            &mut worker.child,
            "worker http",
            &worker.log,
        );
        worker
    }

    /// The worker started, not awaited (it may refuse to start).
    pub fn spawn(env: &HashMap<String, String>) -> Worker {
        Worker::spawn_on(env, None)
    }

    fn spawn_on(env: &HashMap<String, String>, cpu: Option<usize>) -> Worker {
        let tmp = tempfile::tempdir().unwrap();
        // Job processes of a root worker run as nobody: the scratch must be reachable.
        std::fs::set_permissions(
            tmp.path(),
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o711),
        )
        .unwrap();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = tmp.path().join("worker.log");
        let bin = env!("CARGO_BIN_EXE_media-worker");
        let mut cmd = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu.to_string(), bin]);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TMP_DIR", tmp.path().join("scratch"))
            .env("HTTP_ADDR", http.to_string())
            .envs(env);
        let child = spawn(&mut cmd, &log);
        Worker {
            child,
            http,
            log,
            _tmp: tmp,
        }
    }

    /// One sample of a metric from /metrics: the first line starting with `line_start`.
    pub fn metric(&self, line_start: &str) -> Option<f64> {
        metric(self.http, line_start)
    }

    pub fn scratch_dir(&self) -> PathBuf {
        self._tmp.path().join("scratch")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET a path on the worker's HTTP server.
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http, path)
    }

    /// Waits until the worker is consuming (ready, with partitions assigned).
    pub fn wait_ready(&self) {
        wait_for("worker ready", Duration::from_secs(60), || self.is_ready());
    }

    /// As [`Worker::wait_ready`], waiting on the async runtime.
    pub async fn ready(&self) {
        wait_until("worker ready", Duration::from_secs(60), || self.is_ready()).await
    }

    /// Ready, with partitions assigned.
    fn is_ready(&self) -> Option<()> {
        consuming(self.http)
    }

    /// Active jobs per `/jobs`.
    pub fn jobs(&self) -> Vec<serde_json::Value> {
        jobs(self.http)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The worker's sandbox processes (`media-worker sandbox`: fork servers and their job
    /// processes), alive and not zombies.
    pub fn sandboxes(&self) -> Vec<i32> {
        descendants_of(self.pid())
            .into_iter()
            .filter(|p| cmdline(*p).contains("sandbox"))
            .collect()
    }

    /// Resident memory of the worker process itself, in bytes.
    pub fn rss(&self) -> u64 {
        proc_status_kb(self.pid(), "VmRSS:").expect("worker running") * 1024
    }

    pub fn sigterm(&mut self) {
        kill(&mut self.child, libc::SIGTERM);
    }

    pub fn kill9(&mut self) {
        kill(&mut self.child, libc::SIGKILL);
        let _ = self.child.wait();
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        wait_for("worker exit", timeout, || self.child.try_wait().unwrap())
    }

    /// As [`Worker::wait_exit`], waiting on the async runtime.
    pub async fn exited(&mut self, timeout: Duration) -> ExitStatus {
        wait_until("worker exit", timeout, || self.child.try_wait().unwrap()).await
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            kill(&mut self.child, libc::SIGKILL);
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- worker log ----\n{}", self.log());
        }
    }
}

/// GET a path on a worker's HTTP server at `addr` (plain HTTP/1.0, no client crate needed).
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// One sample of a metric from a worker's /metrics: the first line starting with `line_start`.
pub fn metric(addr: SocketAddr, line_start: &str) -> Option<f64> {
    let (_, text) = http_get(addr, "/metrics")?;
    text.lines()
        .find(|l| l.starts_with(line_start))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Whether a worker is consuming: ready, with partitions assigned.
pub fn consuming(addr: SocketAddr) -> Option<()> {
    let (status, _) = http_get(addr, "/health/ready")?;
    let assigned = metric(addr, "media_worker_kafka_assigned_partitions ")?;
    (status == 200 && assigned > 0.0).then_some(())
}

/// A worker's active jobs per `/jobs`.
pub fn jobs(addr: SocketAddr) -> Vec<serde_json::Value> {
    http_get(addr, "/jobs")
        .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| v["jobs"].as_array().cloned())
        .unwrap_or_default()
}

/// The fields of each line of a worker's JSON `log` whose message is `message`.
pub fn logged(log: &str, message: &str) -> Vec<serde_json::Value> {
    logged_where(log, |m| m == message)
}

/// The fields of each line of a worker's JSON `log` whose message contains `text`.
pub fn logged_containing(log: &str, text: &str) -> Vec<serde_json::Value> {
    logged_where(log, |m| m.contains(text))
}

fn logged_where(log: &str, keep: impl Fn(&str) -> bool) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|l| l["fields"].clone())
        .filter(|f| f["message"].as_str().is_some_and(&keep))
        .collect()
}
