//! Test harness: a real Apache Kafka cluster (`scripts/kafka.sh`) and a real S3 server (s3s-fs),
//! each on free loopback ports with its own data directory, plus the worker binary as a child
//! process. Every child gets PR_SET_PDEATHSIG and the cluster watches the test's pid, so nothing
//! outlives a crashed test; `Drop` stops them.
//! `broker` (Kafka, request and response clients), `storage` (s3s-fs), `stack` (both, with the
//! test's topics and buckets) and `worker` (the binary); here the process, port and wait helpers.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod broker;
pub mod clamd;
pub mod cluster;
pub mod container;
pub mod http;
pub mod inputs;
pub mod lines;
pub mod prometheus;
pub mod sandbox;
pub mod stack;
pub mod storage;
pub mod stream;
pub mod worker;

#[allow(unused_imports)]
pub use broker::{Broker, Received, Responses, answer_to, produce_all};
#[allow(unused_imports)]
pub use clamd::{Clamd, EICAR, EICAR_SIGNATURE};
#[allow(unused_imports)]
pub use sandbox::{
    busy_sandbox, clean_and_well, job_process, process_age, sandbox_ticks, stopped_until,
};
#[allow(unused_imports)]
pub use stack::{Stack, request};
#[allow(unused_imports)]
pub use storage::S3;
#[allow(unused_imports)]
pub use worker::{Worker, logged, logged_containing};

pub const ACCESS_KEY: &str = "test-access";
pub const SECRET_KEY: &str = "test-secret-key";
pub const SOURCE_BUCKET: &str = "uploads";
pub const OUTPUT_BUCKET: &str = "media";

pub fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/corpus")
        .join(name)
}

/// Where scripts/setup.sh installs playwright-core, hls.js and dash.js (`PLAYER_MODULES`), for
/// the tests that drive Chromium; panics when they are not there.
pub fn player_modules() -> PathBuf {
    let modules = media_worker::commands::demo::player_modules();
    assert!(
        modules.join("node_modules/playwright-core").is_dir(),
        "{} has no players: run `make setup-test`",
        modules.display()
    );
    modules
}

/// One line of the corpus's MANIFEST.tsv: a file, its kind (`photo`, `faces`, `large`, ...)
/// and what it is expected to be.
pub struct CorpusFile {
    pub name: String,
    pub kind: String,
    pub expected: String,
}

/// Every file of the corpus, as its MANIFEST.tsv lists them.
pub fn corpus_manifest() -> Vec<CorpusFile> {
    let manifest = std::fs::read_to_string(corpus("MANIFEST.tsv")).expect("../shared/corpus");
    manifest
        .lines()
        .skip(1)
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            let col = |i: usize| cols.get(i).copied().unwrap_or_default().to_owned();
            CorpusFile {
                name: col(0),
                kind: col(5),
                expected: col(6),
            }
        })
        .collect()
}

/// The corpus files of the manifest `kinds`.
pub fn corpus_of_kinds(kinds: &[&str]) -> Vec<CorpusFile> {
    corpus_manifest()
        .into_iter()
        .filter(|f| kinds.contains(&f.kind.as_str()))
        .collect()
}

/// A loopback port for a server a test starts: random, below the kernel's ephemeral range (so an
/// outgoing connection cannot take it before the server binds), free now, and never handed out
/// twice in one nextest run. Tests run side by side in processes of their own, and a test that
/// stops a server for an outage must find its port still free when the server comes back: each
/// port given is claimed by a file in a directory of the run's.
pub fn free_port() -> u16 {
    let claims = port_claims();
    std::fs::create_dir_all(&claims).unwrap();
    for _ in 0..1000 {
        let port = fastrand::u16(20_000..32_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::fs::File::create_new(claims.join(port.to_string())).is_ok()
        {
            return port;
        }
    }
    panic!("no free loopback port in 20000..32000");
}

/// The run's directory of claimed ports, shared with `scripts/kafka.sh` (`KAFKA_PORT_CLAIMS`).
pub fn port_claims() -> PathBuf {
    let run = std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| std::process::id().to_string());
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ports-{run}"))
}

/// The last lines of a child's log, for a failure message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A failing test prints the end of each server's log as the server is stopped.
fn report_if_panicking(what: &str, log: &Path) {
    if std::thread::panicking() {
        eprintln!("---- {what} log, last lines ----\n{}", log_tail(log));
    }
}

pub mod synthetic;
#[allow(unused_imports)]
pub use synthetic::synthetic_video;

/// What a compromised decoder's probes report (`sandbox::attack`): each of `probes` refused,
/// none succeeded, and nothing an attacker was after in the report (the S3 secret, the tests'
/// planted secrets, a shell's output).
pub fn assert_all_refused(report: &str, probes: &[&str]) {
    for probe in probes {
        assert!(
            report.contains(&format!("{probe}: refused")),
            "{probe}: {report}"
        );
    }
    assert!(!report.contains("SUCCEEDED"), "{report}");
    for leaked in [
        SECRET_KEY,
        "the-secret-in-a-file",
        "another-tenants-upload",
        "pwned",
    ] {
        assert!(!report.contains(leaked), "{leaked} in {report}");
    }
}

/// The probes both sandbox attack tests make, by the names they report under.
pub const PROBES: [&str; 11] = [
    "read_environ",
    "read_file",
    "connect",
    "connect_unix",
    "create_file",
    "exec",
    "ptrace",
    "signal",
    "setsid",
    "ffmpeg_read",
    "ffmpeg_connect",
];

/// The pid of the process the `sleeper` probe left behind, from its report.
pub fn sleeper_pid(report: &str) -> i32 {
    report
        .split("sleeper: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no sleeper pid in {report}"))
}

#[allow(unused_imports)]
pub use media_worker::media::video::exits_within;

/// Pids of running (not zombie) processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim()
            .starts_with('Z');
        if !zombie && String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// The command line of process `pid`, arguments joined by spaces ("" once it is gone).
pub fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw).replace('\0', " ")
}

/// The environment of process `pid` as `NAME=value` entries.
pub fn environ(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .collect()
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`).
pub fn proc_status_kb(pid: i32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// (state, parent pid, CPU ticks used) of process `pid`, from `/proc/<pid>/stat`.
pub fn proc_stat(pid: i32) -> Option<(char, i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((f[0].chars().next()?, f[1].parse().ok()?, ticks))
}

/// Live (not zombie) children of process `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(
            |p| matches!(proc_stat(*p), Some((state, parent, _)) if parent == pid && state != 'Z'),
        )
        .collect()
}

/// Live descendants of process `pid`, parents before children.
pub fn descendants_of(pid: i32) -> Vec<i32> {
    let mut found = children_of(pid);
    let mut i = 0;
    while i < found.len() {
        let below = children_of(found[i]);
        found.extend(below);
        i += 1;
    }
    found
}

/// Zombie children of process `pid` (exited, not reaped).
pub fn zombies_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|p| matches!(proc_stat(*p), Some(('Z', parent, _)) if parent == pid))
        .collect()
}

/// How often the waits below poll.
const POLL: Duration = Duration::from_millis(50);

/// A wait's bound: `check` panics, naming what was awaited, once `timeout` has passed.
struct Waiting<'a> {
    what: &'a str,
    timeout: Duration,
    deadline: Instant,
}

impl<'a> Waiting<'a> {
    fn new(what: &'a str, timeout: Duration) -> Self {
        Waiting {
            what,
            timeout,
            deadline: Instant::now() + timeout,
        }
    }

    fn check<T>(&self, f: &mut impl FnMut() -> Option<T>) -> Option<T> {
        let v = f();
        let (what, timeout) = (self.what, self.timeout);
        assert!(
            v.is_some() || Instant::now() < self.deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        v
    }
}

/// The unit of the tests' time limits.
pub const MINUTE: Duration = Duration::from_secs(60);

/// Polls `f` every 50 ms until it returns Some, or panics after `timeout`. (For an async test
/// on a current-thread runtime, see [`wait_until`].)
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let w = Waiting::new(what, timeout);
    loop {
        match w.check(&mut f) {
            Some(v) => return v,
            None => std::thread::sleep(POLL),
        }
    }
}

/// As [`wait_for`], sleeping on the async runtime between polls (the awaited event may come
/// from a task on the same thread).
pub async fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let w = Waiting::new(what, timeout);
    loop {
        match w.check(&mut f) {
            Some(v) => return v,
            None => tokio::time::sleep(POLL).await,
        }
    }
}

fn wait_port(port: u16, child: &mut Child, what: &str, log: &Path) {
    wait_for(what, Duration::from_secs(60), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited early: {status}\n{}", log_tail(log));
        }
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
}

/// Starts a server (output to `log`) and waits until it listens on `port`.
pub fn start_server(cmd: &mut Command, log: &Path, port: u16, what: &str) -> Child {
    let mut child = spawn(cmd, log);
    wait_port(port, &mut child, what, log);
    child
}

fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    cmd.stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe; the child dies with the thread that spawned it.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e} (run `make setup-test`)"))
}

fn kill(child: &mut Child, signal: i32) {
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
}

/// Kills and reaps a server, if running.
fn stop_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        kill(&mut c, libc::SIGKILL);
        let _ = c.wait();
    }
}
