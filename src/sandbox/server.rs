//! The fork server, `media-worker sandbox`: started by the worker with an emptied environment,
//! it loads libvips, OpenCV and the cascades once, then waits. For each [`Request`] on its
//! stdin it forks one job process (`child`), which confines itself before it reads the input;
//! the server passes on that process's checked replies, and once it has ended, kills and reaps
//! whatever it left (the server is a subreaper: orphans of the job come back to it, whatever
//! process group or session they moved to) before it reports `Ended`. No job process ever
//! serves a second job, and the server itself never decodes anything.
//!
//! It stays single-threaded, so that a fork copies a consistent process.

use std::io::{BufRead, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::child::{self, Plan};
use super::layers::Layers;
use super::protocol::{Ended, Exit, Frame, MAX_LINE, Request};
use super::stderr_tail::JOB_END;

/// Runs jobs until stdin closes. `memory_limit` is the `RLIMIT_AS` the worker set (0 unknown);
/// `disabled` names layers an operator turned off.
pub fn main(vips_threads: usize, memory_limit: u64, disabled: &[String]) -> std::process::ExitCode {
    // SAFETY: descriptor, signal and prctl calls at start-up, before anything else runs.
    let protocol = unsafe {
        // Its stdout is the protocol; what a library prints goes to stderr instead.
        let fd = libc::dup(1);
        assert!(fd >= 0, "dup stdout");
        libc::dup2(2, 1);
        // A write past RLIMIT_FSIZE fails with EFBIG (an error of that job) instead of killing
        // the process; job processes and their ffmpeg inherit the ignored disposition.
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        // Rust's stack-overflow handler survives a SIGSEGV sent by `kill`: here any SIGSEGV or
        // SIGBUS ends the process, as a crash.
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        // Orphans of a job process come back here, to be killed with its job.
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        // A job process of the same uid cannot read this process's memory or trace it.
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
        std::fs::File::from_raw_fd(fd)
    };
    let mut out = std::io::BufWriter::new(protocol);
    crate::media::init(vips_threads);
    crate::media::vips::init_classes();
    let layers = Layers::available(disabled);
    let plan = match Plan::new(layers, memory_limit) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "sandbox: cannot prepare the confinement");
            return std::process::ExitCode::from(3);
        }
    };
    send(&mut out, &Frame::Ready(layers));

    let mut stdin = std::io::stdin().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        match stdin
            .by_ref()
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return std::process::ExitCode::SUCCESS,
            Ok(_) => {}
        }
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "sandbox: unreadable request");
                return std::process::ExitCode::from(2);
            }
        };
        if crate::media::vision::preload(&req.job.analysis) {
            crate::media::vision::warm(&req.job.analysis);
        }
        let ended = run(&req, &plan, &mut out);
        // Behind everything the job wrote to the shared stderr (see `stderr_tail`); the newline
        // ends a line it left unfinished.
        eprintln!("\n{JOB_END}");
        send(&mut out, &Frame::Ended(ended));
    }
}

fn send(out: &mut impl Write, frame: &Frame) {
    let mut line = serde_json::to_vec(frame).expect("frames serialise");
    line.push(b'\n');
    // The worker is gone if this fails: stdin's EOF ends the process.
    let _ = out.write_all(&line).and_then(|_| out.flush());
}

/// Forks the job process, relays its replies, reaps it and what it left.
fn run(req: &Request, plan: &Plan, out: &mut impl Write) -> Ended {
    let refused = pids_refused();
    let mut ended = run_job(req, plan, out);
    ended.refused = pids_refused().saturating_sub(refused);
    ended
}

fn run_job(req: &Request, plan: &Plan, out: &mut impl Write) -> Ended {
    let (read, write) = match pipe() {
        Ok(p) => p,
        Err(e) => return not_started(format!("cannot make a pipe: {e}")),
    };
    let _ = out.flush();
    // SAFETY: this process is single-threaded; the child only runs `child::run`, which never
    // returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return not_started(format!("cannot fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(read);
        child::run(req, write, plan);
    }
    drop(write);
    // As the child does: its group exists whichever runs first.
    // SAFETY: setpgid on our own child.
    unsafe { libc::setpgid(pid, pid) };
    send(out, &Frame::Started(pid));
    let broke = relay(read, pid, out);
    let status = reap(pid);
    Ended {
        exit: broke.map_or(status, Exit::Violation),
        strays: kill_strays(pid),
        refused: 0,
    }
}

fn not_started(why: String) -> Ended {
    Ended {
        exit: Exit::NotStarted(why),
        strays: 0,
        refused: 0,
    }
}

/// How many new processes or threads the pids controller has refused this process's cgroup
/// (`max` in `pids.events`, cgroup v1 or v2); 0 without one. A job that fails while its
/// cgroup refused it a thread failed for the pod's reason, whatever its library said.
fn pids_refused() -> u64 {
    let Ok(cgroups) = std::fs::read_to_string("/proc/self/cgroup") else {
        return 0;
    };
    let events = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "pids") {
            Some(format!("/sys/fs/cgroup/pids{path}/pids.events"))
        } else if id == "0" && controllers.is_empty() {
            Some(format!("/sys/fs/cgroup{path}/pids.events"))
        } else {
            None
        }
    });
    events
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|e| {
            e.lines()
                .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, owned from here on.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Passes the job process's reply lines on, each parsed (so it cannot be a frame) and bounded,
/// until it exits. A line too long or unreadable kills its process group: the violation.
fn relay(read: OwnedFd, pid: i32, out: &mut impl Write) -> Option<String> {
    // SAFETY: pidfd_open on our own child, which is not reaped before this returns.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    let mut pipe = Some(std::fs::File::from(read));
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let kill = |why: String| {
        // SAFETY: a signal to the job's own process group.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        Some(why)
    };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: pipe.as_ref().map_or(-1, |p| p.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd structs (a negative fd is ignored).
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue; // EINTR
        }
        let exited = fds[1].revents != 0;
        if let Some(p) = pipe.as_mut().filter(|_| fds[0].revents != 0 || exited) {
            // After an exit, only what is already in the pipe (a stray may hold it open).
            if exited {
                set_nonblocking(p.as_raw_fd());
            }
            loop {
                let n = match p.read(&mut chunk) {
                    Ok(0) | Err(_) => {
                        pipe = None;
                        break;
                    }
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    match serde_json::from_slice(&line[..i]) {
                        Ok(reply) => send(out, &Frame::Reply(reply)),
                        Err(e) => return kill(format!("an unreadable reply ({e})")),
                    }
                }
                if buf.len() > MAX_LINE {
                    return kill(format!("a reply line longer than {MAX_LINE} bytes"));
                }
                if !exited {
                    break;
                }
            }
        }
        if exited {
            // SAFETY: closing the descriptor opened above.
            unsafe { libc::close(pidfd) };
            return None;
        }
    }
}

fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// Waits for the job process; how it ended.
fn reap(pid: i32) -> Exit {
    let mut status = 0;
    // SAFETY: waitpid on our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid {
        return Exit::Violation(format!("cannot reap: {}", std::io::Error::last_os_error()));
    }
    if libc::WIFSIGNALED(status) {
        Exit::Signal(libc::WTERMSIG(status))
    } else {
        Exit::Code(libc::WEXITSTATUS(status))
    }
}

/// Kills every process the job left (its process group, and every orphan that came back to
/// this subreaper, whatever group it moved to) and reaps them all. How many there were.
fn kill_strays(pgid: i32) -> u32 {
    let mut strays = 0;
    loop {
        // SAFETY: signals to the job's process group and to this process's own children.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        for pid in own_children() {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: waits for any child of this process; -1 (ECHILD) when none is left.
        if unsafe { libc::waitpid(-1, &mut status, 0) } < 0 {
            return strays;
        }
        strays += 1;
    }
}

/// This process's children (`/proc/self/task/<tid>/children`; the server has one thread).
fn own_children() -> Vec<i32> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
