//! The child side: `media-worker sandbox` runs jobs one at a time, read from stdin, and
//! answers on what was stdout (its own fd 1 then points at stderr, so that nothing a library
//! prints can corrupt the protocol).
//!
//! When stdin closes (the worker exited or was killed) the child exits at once, mid-job or
//! not; its ffmpeg, if any, dies with it (`PR_SET_PDEATHSIG`).

use std::io::{BufRead, BufWriter, Write};
use std::os::fd::FromRawFd;
use std::sync::mpsc;

use crate::contract::{Failure, Stage};
use crate::media::{self, Control, Event, MediaError, MediaFailure};

use super::confine;
use super::protocol::{Reply, Request};

/// Runs jobs until stdin closes. `memory_limit` is the `RLIMIT_AS` the worker set (0 unknown).
pub fn main(vips_threads: usize, memory_limit: u64) -> std::process::ExitCode {
    // SAFETY: plain descriptor and signal calls at start-up, before any other thread exists.
    let protocol = unsafe {
        let fd = libc::dup(1);
        assert!(fd >= 0, "dup stdout");
        libc::dup2(2, 1);
        // A write past RLIMIT_FSIZE fails with EFBIG (an error of that job) instead of killing
        // the child; ffmpeg inherits the ignored disposition.
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        // Rust's stack-overflow handler survives a SIGSEGV that is not a fault of its own (one
        // sent by `kill`); here every SIGSEGV or SIGBUS ends the child, as a crash.
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        std::fs::File::from_raw_fd(fd)
    };
    let mut out = BufWriter::new(protocol);
    media::init(vips_threads);

    let (tx, jobs) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
        // SAFETY: ends the process now; nothing it holds needs cleaning up (the worker removes
        // scratch once it has reaped this process).
        unsafe { libc::_exit(0) };
    });

    for line in jobs {
        let req: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "sandbox: unreadable request");
                return std::process::ExitCode::from(2);
            }
        };
        confine::cpu_budget(req.cpu_secs);
        let result = run(&req, memory_limit, &mut |e| {
            send(&mut out, &Reply::Event(e));
        });
        send(&mut out, &Reply::Done(result));
    }
    std::process::ExitCode::SUCCESS
}

fn send(out: &mut impl Write, reply: &Reply) {
    let mut line = serde_json::to_vec(reply).expect("replies serialise");
    line.push(b'\n');
    // The worker is gone if this fails: stdin's EOF ends the process.
    let _ = out.write_all(&line).and_then(|_| out.flush());
}

/// One job, with a panic or an allocation failure reported as what it is.
fn run(
    req: &Request,
    memory_limit: u64,
    emit: &mut dyn FnMut(Event),
) -> Result<media::MediaOutput, MediaFailure> {
    let mut stage = Stage::Probe;
    let mut on_event = |e: Event| {
        if let Event::Stage(s) = e {
            stage = s;
        }
        emit(e)
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
