//! Test-only (feature `attack-probe`, never in a release build): a job process whose input
//! starts with [`MARKER`] acts as a compromised decoder would, from inside its confinement,
//! with the attacks listed after the marker (JSON). Probes that an attacker would use to steal
//! or reach something report what they got in the job's error message (the attacker's way out:
//! the response); the misbehaviours (endless lines, a forged time limit, forged outputs) are
//! performed on the worker, which must contain them.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::contract::{Failure, MediaType, OutputFormat, Stage};
use crate::media::{Event, FileFormat, MediaError, MediaFailure, MediaOutput, ProducedFile, Role};

use super::protocol::{Reply, Request};

/// What a hostile input starts with.
pub const MARKER: &[u8] = b"MEDIA-WORKER-ATTACK-PROBE\n";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attack {
    /// Read another process's environment (the worker's S3 secret).
    ReadEnviron(i32),
    /// Open another process's memory (`/proc/<pid>/mem`): once open, every page of it reads.
    ReadMem(i32),
    /// Read a file outside the job's scratch (a secret, another job's source).
    ReadFile(PathBuf),
    /// Create a file outside the job's scratch.
    CreateFile(PathBuf),
    /// TCP connect (the S3 endpoint).
    Connect(String),
    /// Connect to a pathname UNIX socket that the job's uid may write (a daemon's).
    ConnectUnix(PathBuf),
    /// Run a program (`/bin/sh -c 'echo pwned'`).
    Exec(PathBuf),
    /// ptrace-attach to a process (the worker).
    Ptrace(i32),
    /// Signal a process outside the job (signal 0: the permission check alone).
    Signal(i32),
    /// Leave the job's session (or at least its process group) and leave a process behind
    /// that sleeps; its pid is reported.
    Sleeper,
    /// ffmpeg (started by this process, as the video pipeline does) reads a file outside the
    /// job's scratch.
    FfmpegRead(PathBuf),
    /// ffmpeg opens a URL (an HTTP server of the test's).
    FfmpegConnect(String),
    /// Write this many bytes to the reply pipe without a newline, then hang.
    FloodReplies(usize),
    /// Write this many bytes to stderr without a newline, then hang.
    FloodStderr(usize),
    /// Announce a time limit of u64::MAX seconds, then answer.
    ForgeTimeLimit,
    /// Answer `Ok` with an output at this path (outside the output directory).
    OutputOutside(PathBuf),
    /// Answer `Ok` with an output that is a symlink to this path.
    OutputSymlink(PathBuf),
}

/// The attacks of a hostile input, performed; `None` for any other input.
pub fn perform(req: &Request, out: &mut impl Write) -> Option<Result<MediaOutput, MediaFailure>> {
    let bytes = std::fs::read(&req.input).ok()?;
    let attacks: Vec<Attack> = serde_json::from_slice(bytes.strip_prefix(MARKER)?).ok()?;
    let mut report = Vec::new();
    for attack in attacks {
        let line = match attack {
            Attack::ReadEnviron(pid) => got("read_environ", read(format!("/proc/{pid}/environ"))),
            Attack::ReadMem(pid) => got(
                "read_mem",
                std::fs::File::open(format!("/proc/{pid}/mem")).map(|_| "opened".into()),
            ),
            Attack::ReadFile(p) => got("read_file", read(p)),
            Attack::CreateFile(p) => got(
                "create_file",
                std::fs::write(&p, "pwned").map(|_| "created".into()),
            ),
            Attack::Connect(addr) => got("connect", connect(&addr)),
            Attack::ConnectUnix(path) => got("connect_unix", connect_unix(&path)),
            Attack::Exec(p) => got(
                "exec",
                run(std::process::Command::new(p).args(["-c", "echo pwned"])),
            ),
            Attack::Ptrace(pid) => got("ptrace", ptrace(pid)),
            Attack::Signal(pid) => got("signal", signal(pid)),
            Attack::Sleeper => sleeper(),
            Attack::FfmpegRead(p) => got("ffmpeg_read", ffmpeg(&p.display().to_string())),
            Attack::FfmpegConnect(url) => got("ffmpeg_connect", ffmpeg(&url)),
            Attack::FloodReplies(n) => flood(out, n),
            Attack::FloodStderr(n) => flood(&mut std::io::stderr(), n),
            Attack::ForgeTimeLimit => {
                let forged = Reply::Event(Event::TimeLimit(Duration::from_secs(u64::MAX)));
                let mut line = serde_json::to_vec(&forged).expect("serialises");
                line.push(b'\n');
                let _ = out.write_all(&line).and_then(|_| out.flush());
                "forge_time_limit: sent".into()
            }
            Attack::OutputOutside(p) => return Some(Ok(forged_output(p))),
            Attack::OutputSymlink(target) => {
                let link = req.out_dir.join("640w.webp");
                let _ = std::os::unix::fs::symlink(&target, &link);
                return Some(Ok(forged_output(link)));
            }
        };
        report.push(line);
    }
    Some(Err(Failure {
        stage: Stage::Probe,
        error: MediaError::Unsupported(format!("attack probe: {}", report.join("; "))),
    }))
}

/// `name: SUCCEEDED (what it got)` or `name: refused (why)`.
fn got(name: &str, r: std::io::Result<String>) -> String {
    match r {
        Ok(what) => format!("{name}: SUCCEEDED ({what})"),
        Err(e) => format!("{name}: refused ({e})"),
    }
}

fn read(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    let mut s = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut s)?;
    Ok(String::from_utf8_lossy(&s).replace('\0', " "))
}

fn connect(addr: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.write_all(b"pwned\n")?;
    Ok(format!("connected to {addr}"))
}

fn connect_unix(path: &std::path::Path) -> std::io::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.write_all(b"pwned\n")?;
    Ok(format!("connected to {}", path.display()))
}

fn run(cmd: &mut std::process::Command) -> std::io::Result<String> {
    let out = cmd.output()?;
    Ok(format!(
        "{}, stdout {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    ))
}

fn ffmpeg(input: &str) -> std::io::Result<String> {
    let out = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin", "-i", input, "-f", "null", "-"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(format!("read it: {}", err.trim()))
    } else {
        Err(std::io::Error::other(err.trim().to_owned()))
    }
}

fn errno(r: libc::c_long) -> std::io::Result<String> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(format!("returned {r}"))
    }
}

fn ptrace(pid: i32) -> std::io::Result<String> {
    // SAFETY: the attack itself; it only asks the kernel.
    errno(unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) })
}

fn signal(pid: i32) -> std::io::Result<String> {
    // SAFETY: signal 0: a permission check, nothing is delivered.
    errno(unsafe { libc::kill(pid, 0) } as libc::c_long)
}

/// setsid (refused by seccomp), else setpgid, in a child that then sleeps: `sleeper: <pid>`.
fn sleeper() -> String {
    // SAFETY: fork in the single-threaded job process; the child only makes syscalls.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            if libc::setsid() < 0 {
                libc::setpgid(0, 0);
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, 0);
            libc::sleep(600);
            libc::_exit(0);
        }
        // The child's setsid, seen from here.
        let setsid = errno(libc::setsid() as libc::c_long);
        format!("sleeper: {pid} ({})", got("setsid", setsid))
    }
}

/// Bytes without a newline, then a hang: only a kill ends this.
fn flood(out: &mut impl Write, n: usize) -> String {
    let chunk = vec![b'x'; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        if out.write_all(&chunk[..k]).is_err() {
            break;
        }
        left -= k;
    }
    let _ = out.flush();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn forged_output(path: PathBuf) -> MediaOutput {
    MediaOutput {
        media_type: MediaType::Image,
        files: vec![ProducedFile {
            name: "640w.webp".into(),
            path,
            role: Role::Variant,
            format: FileFormat::Image(OutputFormat::Webp),
            width: 640,
            height: 480,
            size_bytes: 1,
            duration_ms: None,
            frames: None,
            crop: None,
            quality: None,
        }],
        analysis: None,
        warnings: Vec::new(),
        tracks: Vec::new(),
        plan: None,
        reads: Vec::new(),
        opening: None,
    }
}
