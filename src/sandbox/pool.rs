//! The worker side: a pool of pre-started sandbox children, reused across jobs.
//!
//! Protocol, per job: the worker writes one [`Request`] line to an idle child's stdin; the
//! child answers with [`Reply::Event`] lines and one [`Reply::Done`]. A child that stops
//! answering is dead (a signal, the memory cap) or killed by the worker: at the job's time
//! limit or when the job is cancelled, its process group gets SIGKILL and it is reaped before
//! [`Pool::run`] returns, so the caller's pool permit and scratch outlive the work. A child is
//! returned to the pool after a successful job, and replaced after `recycle_jobs` jobs, above
//! `recycle_rss_bytes`, or after any failure (a decoder error may leave state behind).

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child as Process, ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

use crate::contract::{Failure, Stage};
use crate::media::{Event, MediaError, MediaFailure, MediaOutput};

use super::confine::{self, Limits};
use super::protocol::{Reply, Request};
use super::{Work, stderr_tail};

/// How the pool starts and replaces children.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The executable run as `<program> sandbox`.
    pub program: PathBuf,
    pub vips_threads: usize,
    pub limits: Limits,
    pub recycle_jobs: u32,
    pub recycle_rss_bytes: u64,
    /// `TMPDIR` of the children.
    pub tmp_dir: PathBuf,
    /// Counts children that died on their own (a signal, the memory cap, a panic).
    pub deaths: prometheus::IntCounter,
}

/// Pre-started children, reused across jobs.
#[derive(Clone)]
pub struct Pool {
    config: Arc<PoolConfig>,
    idle: Arc<Mutex<Vec<Child>>>,
    /// Process groups of every child alive, idle or busy (for [`Pool::kill_all`]).
    live: Arc<Mutex<BTreeSet<i32>>>,
}

struct Child {
    process: Process,
    pid: i32,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// The end of its stderr (also copied to the worker's), kept to explain a death.
    stderr: stderr_tail::Tail,
    /// Ends when its stderr closes.
    stderr_done: tokio::task::JoinHandle<()>,
    jobs: u32,
    /// The pool's set of live process groups, which this one leaves when dropped (reaped, or
    /// killed on drop if a job's future is dropped mid-run).
    live: Arc<Mutex<BTreeSet<i32>>>,
}

impl Drop for Child {
    fn drop(&mut self) {
        self.live.lock().unwrap().remove(&self.pid);
    }
}

/// How a job in one child ended.
enum Ended {
    /// The child answered; it may take the next job.
    Answered(Result<MediaOutput, MediaFailure>, Box<Child>),
    /// The child died (or panicked); it is reaped.
    Crashed(MediaFailure),
    /// The worker stopped it (time limit or cancellation); it is reaped.
    Stopped(MediaFailure),
}

impl Pool {
    pub fn new(config: PoolConfig) -> Pool {
        Pool {
            config: Arc::new(config),
            idle: Arc::default(),
            live: Arc::default(),
        }
    }

    /// Starts `n` children now, so the first jobs do not wait for libvips to start.
    pub fn warm(&self, n: usize) -> std::io::Result<()> {
        for _ in 0..n {
            let child = self.spawn()?;
            self.idle.lock().unwrap().push(child);
        }
        Ok(())
    }

    /// Runs one job in a child. A crash is tried once more in a fresh child (the first may
    /// have been memory pressure or a broken child); a second is the job's answer.
    pub async fn run(
        &self,
        work: &Work,
        cancel: &CancellationToken,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<MediaOutput, MediaFailure> {
        let started = Instant::now();
        let mut limit = work.limit;
        let mut crashed = false;
        loop {
            let child = self.checkout().map_err(|e| Failure {
                stage: Stage::Probe,
                error: MediaError::Io(format!("cannot start a sandbox: {e}")),
            })?;
            let ended = self
                .run_in(child, work, started, &mut limit, cancel, on_event)
                .await;
            match ended {
                Ended::Answered(result, child) => {
                    self.checkin(*child, &result).await;
                    return result;
                }
                Ended::Crashed(f) if !crashed => {
                    self.config.deaths.inc();
                    tracing::warn!(stage = f.stage.as_str(), error = %f.error,
                        "sandbox child died: trying once more in a fresh one");
                    crashed = true;
                }
                Ended::Crashed(f) => {
                    self.config.deaths.inc();
                    return Err(f);
                }
                Ended::Stopped(f) => return Err(f),
            }
        }
    }

    async fn run_in(
        &self,
        mut child: Child,
        work: &Work,
        started: Instant,
        limit: &mut Duration,
        cancel: &CancellationToken,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Ended {
        let mut stage = Stage::Probe;
        let request = Request {
            job: work.job.clone(),
            input: work.input.clone(),
            out_dir: work.out_dir.clone(),
            cpu_secs: cpu_backstop(work.limit),
        };
        let mut line = serde_json::to_vec(&request).expect("requests serialise");
        line.push(b'\n');
        child.stderr.clear();
        if child.stdin.write_all(&line).await.is_err() {
            // Died while idle (or killed by an operator): not this job's fault.
            return self.died(child, stage).await;
        }
        loop {
            let deadline = tokio::time::Instant::from(started + *limit);
            tokio::select! {
                next = child.stdout.next_line() => match next {
                    Ok(Some(text)) => match serde_json::from_str::<Reply>(&text) {
                        Ok(Reply::Event(e)) => {
                            match e {
                                Event::Stage(s) => stage = s,
                                Event::TimeLimit(d) => *limit = d,
                                _ => {}
                            }
                            on_event(e);
                        }
                        Ok(Reply::Done(Err(f)))
                            if matches!(f.error, MediaError::Crashed(_) | MediaError::MemoryLimit(_)) =>
                        {
                            // A panic or the memory cap: the child may be in a bad state.
                            self.kill(child).await;
                            return Ended::Crashed(f);
                        }
                        Ok(Reply::Done(result)) => return Ended::Answered(result, Box::new(child)),
                        Err(e) => {
                            tracing::error!(error = %e, "sandbox: unreadable reply");
                            self.kill(child).await;
                            return Ended::Crashed(Failure {
                                stage,
                                error: MediaError::Crashed(format!("unreadable reply: {e}")),
                            });
                        }
                    },
                    Ok(None) | Err(_) => return self.died(child, stage).await,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    // The limit may have been raised since this sleep began (a video's).
                    if started.elapsed() >= *limit {
                        self.kill(child).await;
                        return Ended::Stopped(Failure { stage, error: MediaError::Timeout(*limit) });
                    }
                }
                _ = cancel.cancelled() => {
                    self.kill(child).await;
                    return Ended::Stopped(Failure { stage, error: MediaError::Cancelled });
                }
            }
        }
    }

    /// A child whose stdout closed: reaped, and what killed it.
    async fn died(&self, mut child: Child, stage: Stage) -> Ended {
        let status = child.process.wait().await;
        // Its last words, if it had any time to say them.
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut child.stderr_done).await;
        let tail = child.stderr.text();
        let error = match status {
            Ok(_) if confine::mentions_allocation_failure(&tail) => {
                MediaError::MemoryLimit(self.config.limits.memory_bytes)
            }
            Ok(s) => match s.signal() {
                Some(sig) => {
                    MediaError::Crashed(format!("killed by {}", confine::signal_name(sig)))
                }
                None => MediaError::Crashed(format!("exited with {s}")),
            },
            Err(e) => MediaError::Crashed(format!("cannot reap the sandbox: {e}")),
        };
        tracing::warn!(pid = child.pid, stage = stage.as_str(), error = %error, stderr = %tail, "sandbox child died");
        Ended::Crashed(Failure { stage, error })
    }

    /// SIGKILL to the child's process group, then reaped.
    async fn kill(&self, mut child: Child) {
        // SAFETY: plain syscall on a process group this process created and has not reaped.
        unsafe { libc::killpg(child.pid, libc::SIGKILL) };
        let _ = child.process.wait().await;
    }

    /// An idle child, or a new one.
    fn checkout(&self) -> std::io::Result<Child> {
        loop {
            let Some(mut child) = self.idle.lock().unwrap().pop() else {
                return self.spawn();
            };
            // One that died while idle is reaped and replaced.
            match child.process.try_wait() {
                Ok(None) => return Ok(child),
                status => {
                    tracing::warn!(pid = child.pid, ?status, "idle sandbox child had died");
                    self.config.deaths.inc();
                }
            }
        }
    }

    /// Back to the pool, unless it is due for replacement (then killed and reaped now, so that
    /// no process outlives its job's permit).
    async fn checkin(&self, mut child: Child, result: &Result<MediaOutput, MediaFailure>) {
        child.jobs += 1;
        let (jobs, rss) = (child.jobs, confine::rss(child.pid as u32).unwrap_or(0));
        let spent = jobs >= self.config.recycle_jobs
            || rss > self.config.recycle_rss_bytes
            || result.is_err();
        if spent {
            tracing::debug!(pid = child.pid, jobs, rss, "sandbox child replaced");
            self.kill(child).await;
            return;
        }
        self.idle.lock().unwrap().push(child);
    }

    fn spawn(&self) -> std::io::Result<Child> {
        let c = &self.config;
        let mut cmd = tokio::process::Command::new(&c.program);
        cmd.arg("sandbox")
            .arg("--vips-threads")
            .arg(c.vips_threads.to_string())
            .arg("--memory-limit")
            .arg(c.limits.memory_bytes.to_string())
            .env_clear()
            .envs(confine::environment(&c.tmp_dir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let limits = c.limits;
        // SAFETY: `apply` makes only async-signal-safe calls (setrlimit, prctl).
        unsafe { cmd.pre_exec(move || limits.apply()) };
        // Registered under the lock, so kill_all never misses a child that was just started.
        let mut live = self.live.lock().unwrap();
        let mut process = cmd.spawn()?;
        let pid = process.id().expect("running") as i32;
        live.insert(pid);
        drop(live);
        let stdin = process.stdin.take().expect("piped");
        let stdout = BufReader::new(process.stdout.take().expect("piped")).lines();
        let (stderr, stderr_done) =
            stderr_tail::Tail::follow(process.stderr.take().expect("piped"));
        Ok(Child {
            process,
            pid,
            stdin,
            stdout,
            stderr,
            stderr_done,
            jobs: 0,
            live: self.live.clone(),
        })
    }

    /// Kills every child now (shutdown past its deadline) and waits briefly for them to go.
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

    /// Kills and reaps the idle children (at exit; busy ones end with their jobs).
    pub async fn close(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap());
        for child in idle {
            self.kill(child).await;
        }
    }

    /// How many children died on their own so far (crashes, memory-cap kills, panics).
    pub fn deaths(&self) -> u64 {
        self.config.deaths.get()
    }

    /// Process ids of the children alive (tests and the fuzz report).
    pub fn children(&self) -> Vec<i32> {
        self.live.lock().unwrap().iter().copied().collect()
    }
}

/// CPU seconds a job may use: what all cores could spend in its wall-clock limit, so the
/// backstop never fires before the worker's own limit does.
fn cpu_backstop(limit: Duration) -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    limit.as_secs().max(1) * cores + 5
}
