//! What the benchmarks share (each uses a part).
#![allow(dead_code)]

/// The value after `name` on the command line (`--rounds 3`), or `default`.
pub fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_owned())
}

/// A memory figure of this process from /proc/self/status (`VmRSS:` now, `VmHWM:` peak), MiB.
pub fn status_mib(field: &str) -> f64 {
    proc_status_mib("self", field)
}

/// The same figure of process `pid` (0 once it is gone).
pub fn proc_status_mib(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Manifest kinds that are ordinary photos (not broken files, pixel bombs or videos).
const PHOTO_KINDS: &[&str] = &["photo", "faces", "orientation", "color", "alpha"];

/// The ordinary photos of the corpus in `dir` (file names, from its MANIFEST.tsv).
pub fn corpus_photos(dir: &std::path::Path) -> Vec<String> {
    corpus_files(dir, PHOTO_KINDS)
}

/// The corpus files in `dir` of the manifest `kinds`.
pub fn corpus_files(dir: &std::path::Path, kinds: &[&str]) -> Vec<String> {
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).expect("corpus manifest");
    manifest
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols.len() > 5 && kinds.contains(&cols[5])).then(|| cols[0].to_owned())
        })
        .collect()
}

/// User + system CPU seconds of this process and its waited-for children so far.
pub fn cpu_seconds() -> f64 {
    let secs = |who| {
        // SAFETY: a zeroed rusage is valid; getrusage writes into the struct we own.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(u.ru_utime) + t(u.ru_stime)
    };
    secs(libc::RUSAGE_SELF) + secs(libc::RUSAGE_CHILDREN)
}

/// CPU seconds of process `pid` from /proc: its own user and system time and what its reaped
/// children used (0 once it is gone).
pub fn proc_cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    // utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 of those after ')'.
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Runs an ffmpeg command whose filter graph ends in `ssim`, and returns its mean SSIM over all
/// planes (the "All:" figure of its last report); `what` names the output for a failure.
pub fn ffmpeg_ssim(cmd: &mut std::process::Command, what: &std::path::Path) -> f64 {
    let out = cmd.output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    log.rsplit("All:")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no SSIM for {}: {log}", what.display()))
}
