//! What a sandbox process may use: resource limits, an emptied environment, no new privileges.
//! [`Limits`] are applied to the fork server between fork and exec, so its job processes and
//! everything they start (ffmpeg, ffprobe) inherit them; [`job_limits`] in each job process.

use std::ffi::OsString;
use std::io;

/// Variables a child keeps; everything else (AWS and Kafka credentials, tokens) is dropped.
const KEPT_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "RUST_LOG", "RUST_BACKTRACE"];

/// The limits of one child.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `RLIMIT_AS`: a decode past it fails its allocation and only this child dies.
    pub memory_bytes: u64,
    /// `RLIMIT_FSIZE`: the largest file it may write (writes beyond fail with EFBIG).
    pub file_bytes: u64,
    /// CPU priority (`nice`, 0-19): the job API's children yield the cores to Kafka's.
    pub nice: i32,
}

/// Open files a child may hold (libvips, OpenCV, an ffmpeg's pipes and outputs).
const MAX_OPEN_FILES: u64 = 512;

impl Limits {
    /// Sets the limits in the calling process. Only async-signal-safe calls: this runs between
    /// fork and exec.
    pub fn apply(&self) -> io::Result<()> {
        set(libc::RLIMIT_AS, self.memory_bytes)?;
        set(libc::RLIMIT_FSIZE, self.file_bytes)?;
        set(libc::RLIMIT_NOFILE, MAX_OPEN_FILES)?;
        set(libc::RLIMIT_CORE, 0)?;
        // SAFETY: plain setpriority and prctl calls on the calling process.
        unsafe {
            if self.nice != 0 && libc::setpriority(libc::PRIO_PROCESS, 0, self.nice) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Killed with the worker (also covered by the closed stdin, see `server`).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        no_new_privileges()
    }
}

fn set(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(resource, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The limits of one job process, fresh from the fork: `cpu_secs` of CPU (`SIGXCPU`, then
/// `SIGKILL` 5 s later: the hard limit too, so nothing it runs can raise it), and at most
/// `tasks` more tasks of its uid than exist now (`RLIMIT_NPROC`, counted per uid), and `nice`
/// more than its server's CPU priority (inherited by its threads and all it starts: it is
/// still the process's one thread).
pub fn job_limits(cpu_secs: u64, tasks: u64, nice: i32) -> io::Result<()> {
    let cpu = libc::rlimit {
        rlim_cur: cpu_secs,
        rlim_max: cpu_secs.saturating_add(5),
    };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_CPU, &cpu) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if nice != 0 {
        // SAFETY: getpriority and setpriority on the calling thread. getpriority may return
        // -1 as a value: errno is cleared first and checked.
        unsafe {
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, 0);
            if now == -1 && *libc::__errno_location() != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setpriority(libc::PRIO_PROCESS, 0, (now + nice).min(19)) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    set(libc::RLIMIT_NPROC, tasks + tasks_now())
}

/// Tasks (threads included) this process can see: an upper bound of its uid's. None for a
/// root worker's job process: its uid will be the sandbox's own, which only job processes use.
fn tasks_now() -> u64 {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return 0;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter(|e| e.file_name().as_encoded_bytes()[0].is_ascii_digit())
        .map(|e| std::fs::read_dir(e.path().join("task")).map_or(1, |t| t.count() as u64))
        .sum()
}

/// `PR_SET_NO_NEW_PRIVS`: no setuid program or file capability can give anything back (and
/// seccomp needs it to be installed without privilege).
pub fn no_new_privileges() -> io::Result<()> {
    // SAFETY: a plain prctl on the calling process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The environment of a fork server: the kept variables of this process and a small
/// allocator arena count for its ffmpeg (address space counts against `RLIMIT_AS`; the server
/// sets its own allocator up in code, see `allocator`). Each job process adds its `TMPDIR`.
pub fn environment() -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = KEPT_ENV
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| ((*k).into(), v)))
        .collect();
    env.push(("MALLOC_ARENA_MAX".into(), "2".into()));
    env
}

/// Resident memory of process `pid` in bytes (`VmRSS`).
pub fn rss(pid: u32) -> Option<u64> {
    status_kb(&format!("/proc/{pid}/status"), "VmRSS:").map(|kb| kb * 1024)
}

/// Peak address space of this process in bytes (`VmPeak`).
pub fn own_peak_address_space() -> Option<u64> {
    status_kb("/proc/self/status", "VmPeak:").map(|kb| kb * 1024)
}

fn status_kb(path: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Whether an error text is an allocation failure (libvips, GLib, C++ and Rust wording).
pub fn mentions_allocation_failure(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "out of memory",
        "memory allocation of",
        "failed to allocate",
        "bad_alloc",
        "insufficient memory",
        "cannot allocate memory",
    ]
    .iter()
    .any(|p| t.contains(p))
}

/// A signal's name (`SIGSEGV`), for messages.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGPIPE => "SIGPIPE",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_failures_are_recognised_in_every_wording() {
        for text in [
            "memory allocation of 123456 bytes failed",
            "GLib: failed to allocate 300000000 bytes",
            "terminate called after throwing an instance of 'std::bad_alloc'",
            "vips_tracked_malloc: out of memory --- size == 286MB",
            "OpenCV(4.6.0) error: (-4:Insufficient memory) Failed to allocate",
        ] {
            assert!(mentions_allocation_failure(text), "{text}");
        }
        assert!(!mentions_allocation_failure("Premature end of JPEG file"));
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(libc::SIGXCPU), "SIGXCPU");
        assert_eq!(signal_name(63), "signal 63");
    }
}
