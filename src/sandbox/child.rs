//! A job process: forked by the fork server for one job, it confines itself (limits, an
//! unprivileged uid, Landlock, seccomp; see `layers`) before it opens the input, runs the job
//! and writes its [`Reply`] lines to its own pipe (fd 3). It never serves a second job.
//!
//! It dies with the server (`PR_SET_PDEATHSIG`); its ffmpeg, if any, dies with it.

use std::io::{BufWriter, Write};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;

use seccompiler::BpfProgram;

use crate::contract::{Failure, Stage};
use crate::media::{self, Control, Event, MediaError, MediaFailure};

use super::confine;
use super::layers::{self, Allowed, JobPaths, Layers};
use super::protocol::{Reply, Request};

/// The reply pipe's descriptor in a job process.
const REPLY_FD: i32 = 3;

/// Tasks a job process and what it starts may add to its uid (`RLIMIT_NPROC`; threads count):
/// room for ffmpeg's and libvips' threads, not for a fork bomb.
const TASKS: u64 = 1024;

/// What the fork server prepares once for every job process.
pub struct Plan {
    pub layers: Layers,
    allowed: Allowed,
    filters: Option<[BpfProgram; 2]>,
    /// The `RLIMIT_AS` the worker set (0 unknown), to name it when an allocation fails.
    memory_limit: u64,
}

impl Plan {
    pub fn new(layers: Layers, memory_limit: u64) -> std::io::Result<Plan> {
        Ok(Plan {
            layers,
            allowed: Allowed::resolve(&["ffmpeg", "ffprobe"]),
            filters: layers.seccomp.then(layers::seccomp_filters).transpose()?,
            memory_limit,
        })
    }
}

/// The job process's life, from fork to exit.
pub fn run(req: &Request, reply: OwnedFd, plan: &Plan) -> ! {
    let mut out = BufWriter::new(std::fs::File::from(setup_fds(reply)));
    crate::allocator::tune_job_process();
    let result = match confine_self(req, plan) {
        Ok(()) => job(req, plan.memory_limit, &mut out),
        Err(e) => Err(Failure {
            stage: Stage::Probe,
            error: MediaError::Io(format!("cannot confine the sandbox: {e}")),
        }),
    };
    send(&mut out, &Reply::Done(Box::new(result)));
    // SAFETY: ends the process now: nothing it holds needs cleaning up (the worker removes
    // scratch once the server has reaped this process).
    unsafe { libc::_exit(0) }
}

/// fd 0 is /dev/null, 1 and 2 the server's stderr, 3 the reply pipe (not inherited by ffmpeg);
/// nothing else stays open (the server's stdin and protocol above all).
fn setup_fds(reply: OwnedFd) -> OwnedFd {
    // SAFETY: descriptor calls in a freshly forked, single-threaded process.
    unsafe {
        libc::setpgid(0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        let fd = reply.into_raw_fd();
        if fd != REPLY_FD {
            libc::dup2(fd, REPLY_FD);
            libc::close(fd);
        }
        libc::fcntl(REPLY_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        libc::dup2(null, 0);
        libc::close_range(REPLY_FD as u32 + 1, u32::MAX, 0);
        OwnedFd::from_raw_fd(REPLY_FD)
    }
}

/// Every layer of the plan, in the order that lets each be set: limits and the OOM score
/// while allowed, then the uid, then Landlock and seccomp (which need no privilege).
fn confine_self(req: &Request, plan: &Plan) -> std::io::Result<()> {
    // SAFETY: setenv in a single-threaded process.
    unsafe { std::env::set_var("TMPDIR", &req.tmp_dir) };
    confine::job_limits(req.cpu_secs, TASKS, req.nice)?;
    // The OOM killer takes a decoder before the worker.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    if plan.layers.unprivileged {
        layers::drop_privileges()?;
    }
    confine::no_new_privileges()?;
    let cascades: Vec<&Path> = [
        Some(req.job.analysis.face_cascade.as_path()),
        req.job.analysis.profile_cascade.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let paths = JobPaths {
        input: &req.input,
        writable: &[&req.out_dir, &req.tmp_dir],
        read: cascades,
    };
    layers::landlock(plan.layers, &plan.allowed, &paths)?;
    if let Some(filters) = &plan.filters {
        layers::seccomp(filters)?;
    }
    Ok(())
}

fn send(out: &mut impl Write, reply: &Reply) {
    let mut line = serde_json::to_vec(reply).expect("replies serialise");
    line.push(b'\n');
    // The server is gone if this fails, and this process dies with it.
    let _ = out.write_all(&line).and_then(|_| out.flush());
}

/// One job, with a panic or an allocation failure reported as what it is.
fn job(
    req: &Request,
    memory_limit: u64,
    out: &mut impl Write,
) -> Result<media::MediaOutput, MediaFailure> {
    #[cfg(feature = "attack-probe")]
    if let Some(r) = super::attack::perform(req, out) {
        return r;
    }
    let mut stage = Stage::Probe;
    let mut on_event = |e: Event| {
        if let Event::Stage(s) = e {
            stage = s;
        }
        send(out, &Reply::Event(e))
    };
    let mut ctl = Control::new(&mut on_event);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        media::process(&req.job, &req.input, &req.out_dir, &mut ctl)
    }));
    drop(ctl);
    match result {
        Ok(Err(f)) if out_of_memory(&f.error, memory_limit) => Err(Failure {
            stage: f.stage,
            error: MediaError::MemoryLimit(memory_limit),
        }),
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("panic");
            Err(Failure {
                stage,
                error: MediaError::Crashed(format!("panicked: {what}")),
            })
        }
    }
}

/// A failure caused by the memory cap: an allocation failure, or an error with the address
/// space near the cap (a decoder's own wording varies).
fn out_of_memory(e: &MediaError, memory_limit: u64) -> bool {
    if memory_limit == 0 || matches!(e, MediaError::MemoryLimit(_)) {
        return false;
    }
    let near_cap = confine::own_peak_address_space().is_some_and(|p| p > memory_limit / 10 * 9);
    confine::mentions_allocation_failure(&e.to_string()) || near_cap
}
