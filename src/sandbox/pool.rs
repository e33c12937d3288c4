//! The worker side: fork servers started ahead (one per concurrent job), each running one job
//! at a time in a fresh job process.
//!
//! Per job, the worker writes one [`Request`] line to an idle server and reads its [`Frame`]s:
//! `Started`, the job's replies, `Ended` once the job process and all it started are gone. The
//! worker believes none of it beyond what it can check: every line is bounded (stdout and
//! stderr), an announced time limit is clamped to the job's ceiling, the outputs are opened
//! beneath the job's directory by the worker itself (`outputs`), and every wait and kill has a
//! deadline. At the job's time limit, at cancellation or on a violation, the job's process
//! group gets SIGKILL and the server reports its end; a server that does not within
//! [`GRACE`] is killed and reaped too, so the caller's pool permit and scratch outlive the work.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child as Process, ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

use crate::contract::{Failure, Stage};
use crate::media::{Event, MediaError, MediaFailure, MediaOutput};

use super::confine::{self, Limits};
use super::lines::{BoundedLines, Line};
use super::protocol::{Ended, Exit, Frame, MAX_LINE, Reply, Request};
use super::work::Work;
use super::{layers, outputs, stderr_tail};

/// How long a server may take to report a job process's end once it was killed (or answered),
/// to start, or to take a request, before it is killed itself.
const GRACE: Duration = Duration::from_secs(5);

/// How the pool starts servers.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The executable run as `<program> sandbox`.
    pub program: PathBuf,
    pub vips_threads: usize,
    pub limits: Limits,
    /// Layers an operator turned off (`MEDIA_SANDBOX_DISABLE`).
    pub disabled: Vec<String>,
    /// Counts job processes that died on their own (a signal, the memory cap, a panic) or
    /// broke the protocol.
    pub deaths: prometheus::IntCounter,
}

/// Fork servers, idle between jobs.
#[derive(Clone)]
pub struct Pool {
    config: Arc<PoolConfig>,
    idle: Arc<Mutex<Vec<Server>>>,
    /// Process groups alive: every server's and every running job process's (for
    /// [`Pool::kill_all`]).
    live: Arc<Mutex<BTreeSet<i32>>>,
}

struct Server {
    process: Process,
    pid: i32,
    stdin: ChildStdin,
    stdout: BoundedLines<BufReader<ChildStdout>>,
    /// Its stderr (its job processes'), relayed to the worker's log, the end kept to explain
    /// a death.
    stderr: stderr_tail::Tail,
    /// Whether it said `Ready`.
    ready: bool,
    /// Jobs sent to it.
    jobs: u64,
    /// The pool's set of live process groups, which this one leaves when dropped (reaped, or
    /// killed on drop if a job's future is dropped mid-run).
    live: Arc<Mutex<BTreeSet<i32>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.live.lock().unwrap().remove(&self.pid);
    }
}

/// How a job ended.
enum Outcome {
    /// The job process answered and is gone; the server may take the next job.
    Answered(Box<Result<MediaOutput, MediaFailure>>, Option<Box<Server>>),
    /// The job process died, broke the protocol, or its server did.
    Crashed(MediaFailure, Option<Box<Server>>),
    /// The worker stopped it (time limit or cancellation).
    Stopped(MediaFailure, Option<Box<Server>>),
}

impl Pool {
    pub fn new(config: PoolConfig) -> Pool {
        Pool {
            config: Arc::new(config),
            idle: Arc::default(),
            live: Arc::default(),
        }
    }

    /// Starts `n` servers now, so the first jobs do not wait for libvips to start.
    pub fn warm(&self, n: usize) -> std::io::Result<()> {
        for _ in 0..n {
            let server = self.spawn()?;
            self.idle.lock().unwrap().push(server);
        }
        Ok(())
    }

    /// Runs one job in a fresh job process. A crash is tried once more (the first may have been
    /// memory pressure); a second is the job's answer. Each try has the whole time limit: a
    /// crash late in the first must not leave the second too little to finish (the job's total
    /// stays bounded by the two tries). The outputs of an answer are checked
    /// ([`outputs::check`]) before they are returned.
    pub async fn run(
        &self,
        work: &Work,
        cancel: &CancellationToken,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<MediaOutput, MediaFailure> {
        let mut crashed = false;
        layers::grant(&work.input, &[&work.out_dir, &work.tmp_dir]).map_err(|e| Failure {
            stage: Stage::Probe,
            error: MediaError::Io(format!("cannot prepare the sandbox's scratch: {e}")),
        })?;
        loop {
            let (started, mut limit) = (Instant::now(), work.limit);
            let server = self.checkout().map_err(|e| Failure {
                stage: Stage::Probe,
                error: MediaError::NotStarted(format!("cannot start a sandbox: {e}")),
            })?;
            let ended = self
                .run_in(server, work, started, &mut limit, cancel, on_event)
                .await;
            let (result, server) = match ended {
                Outcome::Answered(result, server) => {
                    ((*result).and_then(|o| outputs::check(work, o)), server)
                }
                Outcome::Crashed(f, server) => {
                    // A server that could not take the job is this pod's fault, not a death.
                    if !f.error.is_local() {
                        self.config.deaths.inc();
                    }
                    if crashed {
                        (Err(f), server)
                    } else {
                        tracing::warn!(stage = f.stage.as_str(), error = %f.error,
                            "sandbox job process died: trying once more in a fresh one");
                        crashed = true;
                        self.checkin(server);
                        continue;
                    }
                }
                Outcome::Stopped(f, server) => (Err(f), server),
            };
            self.checkin(server);
            return result;
        }
    }

    async fn run_in(
        &self,
        mut server: Server,
        work: &Work,
        started: Instant,
        limit: &mut Duration,
        cancel: &CancellationToken,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Outcome {
        let mut stage = Stage::Probe;
        let request = Request {
            job: work.job.clone(),
            input: work.input.clone(),
            out_dir: work.out_dir.clone(),
            tmp_dir: work.tmp_dir.clone(),
            cpu_secs: cpu_backstop(work.max_limit),
            nice: work.nice,
        };
        let mut line = serde_json::to_vec(&request).expect("requests serialise");
        line.push(b'\n');
        server.stderr.clear();
        let sent = async {
            if !server.ready {
                match server.frame().await {
                    Some(Frame::Ready(_)) => server.ready = true,
                    _ => return false,
                }
            }
            server.jobs += 1;
            server.stdin.write_all(&line).await.is_ok()
        };
        // A server that died while idle (or never started) is not this job's fault.
        match tokio::time::timeout(GRACE * 6, sent).await {
            Ok(true) => {}
            _ => {
                return self
                    .server_lost(server, stage, "the sandbox did not take the job", false)
                    .await;
            }
        }
        let stderr = server.stderr.clone();
        let mut job: Option<i32> = None;
        let mut done: Option<Result<MediaOutput, MediaFailure>> = None;
        // Set once the job must end: why, and by when its end must be reported.
        let mut stopping: Option<(Stopping, tokio::time::Instant)> = None;
        loop {
            let deadline = match &stopping {
                Some((_, by)) => *by,
                None => tokio::time::Instant::from(started) + *limit,
            };
            let stop = |why: Stopping, job: Option<i32>, live: &Mutex<BTreeSet<i32>>| {
                kill_job(job, live);
                Some((why, tokio::time::Instant::now() + GRACE))
            };
            tokio::select! {
                frame = server.frame() => match frame {
                    Some(Frame::Started(pid)) if job.is_none() && pid > 0 => {
                        job = Some(pid);
                        self.live.lock().unwrap().insert(pid);
                        // Told to stop before its pid was known (a flood read before this frame).
                        if stopping.is_some() {
                            kill_job(job, &self.live);
                        }
                    }
                    Some(Frame::Reply(Reply::Event(e))) if done.is_none() => {
                        match e {
                            Event::Stage(s) => stage = s,
                            // Never beyond what the worker computed for this job.
                            Event::TimeLimit(d) => *limit = d.min(work.max_limit),
                            _ => {}
                        }
                        on_event(e);
                    }
                    Some(Frame::Reply(Reply::Done(result))) if done.is_none() => {
                        done = Some(*result);
                        // It exits now; if it does not, it is made to.
                        if stopping.is_none() {
                            stopping = Some((Stopping::Answered, tokio::time::Instant::now() + GRACE));
                        }
                    }
                    Some(Frame::Ended(ended)) => {
                        if let Some(pid) = job.take() {
                            self.live.lock().unwrap().remove(&pid);
                        }
                        return self.ended(server, ended, done, stopping.map(|s| s.0), stage, *limit).await;
                    }
                    // Out of order or a second answer: the server is not to be trusted either.
                    _ => return self.server_lost(server, stage, "the sandbox broke the protocol", true).await,
                },
                _ = tokio::time::sleep_until(deadline) => match stopping {
                    // The limit may have been raised since this sleep began (a video's).
                    None if started.elapsed() < *limit => {}
                    None => stopping = stop(Stopping::Timeout, job, &self.live),
                    Some((Stopping::Answered, _)) => {
                        stopping = stop(Stopping::Lingered, job, &self.live)
                    }
                    // The server did not report the end in time.
                    Some(_) => return self.server_lost(server, stage, "the sandbox did not end the job", true).await,
                },
                _ = cancel.cancelled(), if stopping.is_none() => {
                    stopping = stop(Stopping::Cancelled, job, &self.live);
                }
                _ = stderr.overflowed(), if stopping.is_none() => {
                    stopping = stop(Stopping::StderrTooLong, job, &self.live);
                }
            }
        }
    }

    /// The job process is gone: what that means for the job.
    async fn ended(
        &self,
        server: Server,
        ended: Ended,
        done: Option<Result<MediaOutput, MediaFailure>>,
        why: Option<Stopping>,
        stage: Stage,
        limit: Duration,
    ) -> Outcome {
        if ended.strays > 0 {
            tracing::warn!(
                strays = ended.strays,
                "processes the job left running were killed"
            );
        }
        let fail = |error| Failure { stage, error };
        if let Exit::NotStarted(why) = ended.exit {
            // A server that cannot fork is replaced: a fresh one may be allowed what it is not.
            tracing::warn!(server = server.pid, error = %why, "sandbox could not start a job process");
            kill(server).await;
            return Outcome::Crashed(fail(MediaError::NotStarted(why)), None);
        }
        let stopped = matches!(why, Some(Stopping::Timeout | Stopping::Cancelled));
        if ended.refused > 0 && !stopped && !matches!(done, Some(Ok(_))) {
            // Whatever the library said (a decoder's "corrupt", OpenCV's thread error), the
            // work was refused threads or processes: the pod's limit, not the input.
            let why = format!(
                "the pod's process limit refused {} new processes or threads during the job",
                ended.refused
            );
            tracing::warn!(server = server.pid, error = %why, answered = ?done.map(|d| d.err()),
                "sandbox job failed under the pod's process limit");
            return Outcome::Crashed(fail(MediaError::NotStarted(why)), Some(Box::new(server)));
        }
        let error = match (why, ended.exit, done) {
            (Some(Stopping::Timeout), ..) => {
                return Outcome::Stopped(fail(MediaError::Timeout(limit)), Some(Box::new(server)));
            }
            (Some(Stopping::Cancelled), ..) => {
                return Outcome::Stopped(fail(MediaError::Cancelled), Some(Box::new(server)));
            }
            (Some(Stopping::StderrTooLong), ..) => MediaError::Crashed(format!(
                "broke the protocol: a line longer than {} bytes on stderr",
                stderr_tail::MAX_LINE
            )),
            (_, Exit::Violation(why), _) => {
                MediaError::Crashed(format!("broke the protocol: {why}"))
            }
            // A panic or the memory cap: tried once more.
            (_, _, Some(Err(f)))
                if matches!(f.error, MediaError::Crashed(_) | MediaError::MemoryLimit(_)) =>
            {
                return Outcome::Crashed(f, Some(Box::new(server)));
            }
            (_, _, Some(result)) => {
                return Outcome::Answered(Box::new(result), Some(Box::new(server)));
            }
            (_, exit, None) => {
                // Its last words, once the server's stderr has caught up with its end.
                server.stderr.caught_up(server.jobs, GRACE / 5).await;
                let tail = server.stderr.text();
                let error = match exit {
                    _ if confine::mentions_allocation_failure(&tail) => {
                        MediaError::MemoryLimit(self.config.limits.memory_bytes)
                    }
                    Exit::Signal(sig) => {
                        MediaError::Crashed(format!("killed by {}", confine::signal_name(sig)))
                    }
                    Exit::Code(c) => {
                        MediaError::Crashed(format!("exited with code {c} without an answer"))
                    }
                    Exit::Violation(v) => MediaError::Crashed(v),
                    // Answered above, before the outcome was looked at.
                    Exit::NotStarted(v) => MediaError::NotStarted(v),
                };
                tracing::warn!(server = server.pid, stage = stage.as_str(), error = %error, stderr = %tail,
                    "sandbox job process died");
                error
            }
        };
        Outcome::Crashed(fail(error), Some(Box::new(server)))
    }

    /// A server that broke the protocol, died or hung: killed and reaped (within a deadline).
    /// Before it `took` the job that is this pod's fault (`Io`: retried, and the pod steps
    /// aside while it lasts); once it had, the job counts as crashed.
    async fn server_lost(&self, server: Server, stage: Stage, why: &str, took: bool) -> Outcome {
        let tail = server.stderr.text();
        let status = kill(server).await;
        let why = match status.and_then(|s| s.signal()) {
            Some(sig) if sig != libc::SIGKILL => {
                format!("{why}: killed by {}", confine::signal_name(sig))
            }
            _ => why.to_owned(),
        };
        let error = if took {
            MediaError::Crashed(why)
        } else {
            MediaError::NotStarted(why)
        };
        tracing::warn!(stage = stage.as_str(), error = %error, stderr = %tail, "sandbox lost");
        Outcome::Crashed(Failure { stage, error }, None)
    }

    /// Whether work could start now: a fresh server started and said it is ready (then it is
    /// stopped: this is a probe of the pod, used while it steps aside for a sandbox that could
    /// not start).
    pub async fn check(&self) -> Result<(), String> {
        let mut server = self
            .spawn()
            .map_err(|e| format!("cannot start a sandbox: {e}"))?;
        let ready = tokio::time::timeout(GRACE, server.frame()).await;
        kill(server).await;
        match ready {
            Ok(Some(Frame::Ready(_))) => Ok(()),
            _ => Err("the sandbox did not start".into()),
        }
    }

    /// An idle server, or a new one.
    fn checkout(&self) -> std::io::Result<Server> {
        loop {
            let Some(mut server) = self.idle.lock().unwrap().pop() else {
                return self.spawn();
            };
            // One that died while idle is reaped and replaced.
            match server.process.try_wait() {
                Ok(None) => return Ok(server),
                status => tracing::warn!(pid = server.pid, ?status, "idle sandbox had died"),
            }
        }
    }

    fn checkin(&self, server: Option<Box<Server>>) {
        if let Some(s) = server {
            self.idle.lock().unwrap().push(*s);
        }
    }

    fn spawn(&self) -> std::io::Result<Server> {
        let c = &self.config;
        let mut cmd = tokio::process::Command::new(&c.program);
        cmd.arg("sandbox")
            .arg("--vips-threads")
            .arg(c.vips_threads.to_string())
            .arg("--memory-limit")
            .arg(c.limits.memory_bytes.to_string());
        for layer in &c.disabled {
            cmd.arg("--disable").arg(layer);
        }
        cmd.env_clear()
            .envs(confine::environment())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let limits = c.limits;
        // SAFETY: `apply` makes only async-signal-safe calls (setrlimit, prctl).
        unsafe { cmd.pre_exec(move || limits.apply()) };
        // Registered under the lock, so kill_all never misses a server that was just started.
        let mut live = self.live.lock().unwrap();
        let mut process = cmd.spawn()?;
        let pid = process.id().expect("running") as i32;
        live.insert(pid);
        drop(live);
        let stdin = process.stdin.take().expect("piped");
        let stdout = BoundedLines::new(
            BufReader::new(process.stdout.take().expect("piped")),
            // A frame wraps a job's reply line (at most MAX_LINE) in a few bytes of its own.
            MAX_LINE + 1024,
        );
        let stderr = stderr_tail::Tail::follow(pid, process.stderr.take().expect("piped"));
        Ok(Server {
            process,
            pid,
            stdin,
            stdout,
            stderr,
            ready: false,
            jobs: 0,
            live: self.live.clone(),
        })
    }

    /// Kills every server and job process now (shutdown past its deadline) and waits briefly
    /// for them to go.
    pub fn kill_all(&self) -> usize {
        let live: Vec<i32> = self.live.lock().unwrap().iter().copied().collect();
        for pgid in &live {
            // SAFETY: see `kill`.
            unsafe { libc::killpg(*pgid, libc::SIGKILL) };
        }
        for pid in &live {
            crate::media::video::exits_within(*pid, Duration::from_secs(2));
        }
        live.len()
    }

    /// Kills and reaps the idle servers (at exit; busy ones end with their jobs).
    pub async fn close(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap());
        for server in idle {
            kill(server).await;
        }
    }

    /// How many job processes died on their own so far (crashes, memory-cap kills, panics,
    /// protocol violations).
    pub fn deaths(&self) -> u64 {
        self.config.deaths.get()
    }

    /// Process ids of the servers and job processes alive (tests and the benchmarks).
    pub fn children(&self) -> Vec<i32> {
        self.live.lock().unwrap().iter().copied().collect()
    }
}

/// Why the worker ended a job early.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stopping {
    /// It answered, and must now exit...
    Answered,
    /// ...and did not: it was killed.
    Lingered,
    Timeout,
    Cancelled,
    StderrTooLong,
}

impl Server {
    /// The next frame; `None` when the server closed its stdout, wrote a line too long or one
    /// that is not a frame.
    async fn frame(&mut self) -> Option<Frame> {
        match self.stdout.next().await {
            Ok(Line::Text(t)) => serde_json::from_str(&t).ok(),
            _ => None,
        }
    }
}

/// SIGKILL to a job process's group (the server reports its end).
fn kill_job(job: Option<i32>, live: &Mutex<BTreeSet<i32>>) {
    if let Some(pid) = job {
        // SAFETY: a job process's group, registered while alive (its server has not reported
        // it reaped).
        if live.lock().unwrap().contains(&pid) {
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
    }
}

/// SIGKILL to a server's process group (its job processes die with it), then reaped within
/// [`GRACE`]; its exit status when it was.
async fn kill(mut server: Server) -> Option<std::process::ExitStatus> {
    // SAFETY: a process group this process created and has not reaped.
    unsafe { libc::killpg(server.pid, libc::SIGKILL) };
    match tokio::time::timeout(GRACE, server.process.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            tracing::error!(
                pid = server.pid,
                "a sandbox did not die within {GRACE:?} of SIGKILL"
            );
            None
        }
    }
}

/// CPU seconds a job may use: what all cores could spend in its wall-clock ceiling, so the
/// backstop never fires before the worker's own limit does.
fn cpu_backstop(limit: Duration) -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    limit
        .as_secs()
        .max(1)
        .saturating_mul(cores)
        .saturating_add(5)
}
