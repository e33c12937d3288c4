//! ffmpeg and ffprobe as child processes that can always be stopped.
//!
//! Each child leads its own process group, so a kill reaches anything it started too; it gets
//! SIGKILL if the thread that started it dies (`PR_SET_PDEATHSIG`, i.e. if the worker is
//! killed); and it is listed in [`LIVE`] so that a shutdown past its deadline can kill every
//! one before the worker exits ([`kill_all`]). Every path reaps the child: no zombies.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Process groups of running children.
static LIVE: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Kills every running child's process group (shutdown past its deadline) and waits, briefly,
/// for the children to be gone: the worker exits after them.
pub fn kill_all() -> usize {
    let live: Vec<i32> = LIVE.lock().unwrap().iter().copied().collect();
    for pgid in &live {
        // SAFETY: plain syscall on a process group this process created.
        unsafe { libc::killpg(*pgid, libc::SIGKILL) };
    }
    for pid in &live {
        exits_within(*pid, Duration::from_secs(2));
    }
    live.len()
}

/// Whether process `pid` exits within `timeout` (a pidfd becomes readable when it does).
pub fn exits_within(pid: i32, timeout: Duration) -> bool {
    // SAFETY: plain syscalls on a descriptor this function owns.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        if fd < 0 {
            return true; // already gone
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let n = libc::poll(&mut p, 1, timeout.as_millis() as i32);
        libc::close(fd);
        n == 1
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("cannot start {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("killed after its {0:?} time limit")]
    TimedOut(Duration),
    #[error("cancelled")]
    Cancelled,
    /// Non-zero exit: the end of its stderr says why.
    #[error("{program} exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: ExitStatus,
        stderr: String,
    },
}

/// Runs `cmd` (stdout read line by line into `on_line`, stderr kept in `log`) until it exits,
/// `limit` passes or `cancel` fires.
pub fn run(
    mut cmd: Command,
    log: &Path,
    limit: Duration,
    cancel: &CancellationToken,
    on_line: &mut dyn FnMut(&str),
) -> Result<(), ChildError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let stderr = std::fs::File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(log)
        .map_err(|e| ChildError::Spawn(program.clone(), e))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(
            stderr
                .try_clone()
                .map_err(|e| ChildError::Spawn(program.clone(), e))?,
        )
        .process_group(0);
    // CPU time backstop behind `limit` (what every core could use in it): set per run, up to
    // the hard limit the sandbox's job process has (fixed there, so that nothing it starts can
    // raise it).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let budget = limit.as_secs().max(1) * cores + 5;
    // SAFETY: prctl, getrlimit and setrlimit are async-signal-safe; nothing else runs between
    // fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let mut cpu = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_CPU, &mut cpu);
            cpu.rlim_cur = budget.min(cpu.rlim_max);
            libc::setrlimit(libc::RLIMIT_CPU, &cpu);
            Ok(())
        });
    }
    let mut child = {
        // Registered under the lock, so kill_all never misses a child that was just started.
        let mut live = LIVE.lock().unwrap();
        let child = cmd
            .spawn()
            .map_err(|e| ChildError::Spawn(program.clone(), e))?;
        live.insert(child.id() as i32);
        child
    };
    let pgid = child.id() as i32;

    // stdout on its own thread, so the wait below can also watch the clock and `cancel`.
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let deadline = Instant::now() + limit;
    let stopped = loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => on_line(&line),
            Err(RecvTimeoutError::Disconnected) => break None,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if cancel.is_cancelled() {
            break Some(ChildError::Cancelled);
        }
        if Instant::now() >= deadline {
            break Some(ChildError::TimedOut(limit));
        }
    };
    if stopped.is_some() {
        // SAFETY: see kill_all.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    }
    let status = child.wait();
    LIVE.lock().unwrap().remove(&pgid);
    let _ = reader.join();
    if let Some(e) = stopped {
        return Err(e);
    }
    let status = status.map_err(|e| ChildError::Spawn(program.clone(), e))?;
    if status.success() {
        return Ok(());
    }
    Err(ChildError::Failed {
        program,
        status,
        stderr: tail(stderr, 600),
    })
}

/// The last `n` bytes of a log, on one line.
fn tail(mut f: std::fs::File, n: u64) -> String {
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(n)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn lines_and_exit_status_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = Vec::new();
        let never = CancellationToken::new();
        let log = dir.path().join("log");
        run(
            sh("echo a; echo b"),
            &log,
            Duration::from_secs(10),
            &never,
            &mut |l| lines.push(l.to_owned()),
        )
        .unwrap();
        assert_eq!(lines, ["a", "b"]);
        let e = run(
            sh("echo oops >&2; exit 3"),
            &log,
            Duration::from_secs(10),
            &never,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("oops"), "{e}");
    }

    #[test]
    fn a_timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild");
        // The grandchild would outlive a kill of `sh` alone.
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let e = run(
            sh(&script),
            &dir.path().join("log"),
            Duration::from_millis(300),
            &CancellationToken::new(),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(matches!(e, ChildError::TimedOut(_)), "{e}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The group kill reached the grandchild (SIGKILL lands asynchronously: await its exit).
        assert!(
            exits_within(pid, Duration::from_secs(2)),
            "grandchild {pid} still running"
        );
    }

    #[test]
    fn cancel_stops_a_child_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let t = std::thread::spawn(move || {
            run(
                sh("sleep 30"),
                &dir.path().join("log"),
                Duration::from_secs(60),
                &c,
                &mut |_| {},
            )
        });
        cancel.cancel();
        let r = t.join().unwrap();
        assert!(matches!(r, Err(ChildError::Cancelled)), "{r:?}");
    }
}
