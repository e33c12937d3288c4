//! A worker's sandbox children as a test sees them: which one is at work (to crash it), and
//! what a job left behind.

use std::collections::BTreeMap;

use super::*;

/// CPU ticks used so far by each sandbox child of `worker`: a job process's with the
/// processes it started (a video job's ffmpeg and ffprobe). A fork server's are its own: its
/// children are job processes, and for a moment the orphans of one that died (an ffmpeg, until
/// the server kills it), which are no work of the server's.
pub fn sandbox_ticks(worker: &Worker) -> BTreeMap<i32, u64> {
    let sandboxes = worker.sandboxes();
    sandboxes
        .iter()
        .filter_map(|&p| {
            let (_, parent, own) = proc_stat(p)?;
            let started: u64 = if sandboxes.contains(&parent) {
                descendants_of(p)
                    .into_iter()
                    .filter_map(|d| Some(proc_stat(d)?.2))
                    .sum()
            } else {
                0
            };
            Some((p, own + started))
        })
        .collect()
}

/// A sandbox child of `worker` that has used `ticks` of CPU more than it had in `before`
/// (then idle): it is in the middle of a job's decoding or encoding.
pub fn busy_sandbox(worker: &Worker, before: &BTreeMap<i32, u64>, ticks: u64) -> i32 {
    wait_for("a sandbox child at work", MINUTE, || {
        sandbox_ticks(worker).into_iter().find_map(|(p, used)| {
            (used >= before.get(&p).copied().unwrap_or(0) + ticks).then_some(p)
        })
    })
}

/// After a job: the worker up and ready, its scratch empty, no zombie and no process left but
/// the pool's idle children.
pub fn clean_and_well(worker: &Worker, pool: usize) {
    assert_eq!(worker.http_get("/health/ready").unwrap().0, 200);
    let scratch: Vec<_> = std::fs::read_dir(worker.scratch_dir())
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(scratch.is_empty(), "scratch left: {scratch:?}");
    assert_eq!(zombies_of(worker.pid()), Vec::<i32>::new(), "zombies");
    let children = children_of(worker.pid());
    assert!(
        children.len() <= pool && children.iter().all(|p| cmdline(*p).contains("sandbox")),
        "children: {:?}",
        children.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
    );
}

/// A job process of `worker` (a sandbox child whose parent is a fork server) other than
/// `except`, once one runs.
pub fn job_process(worker: &Worker, except: &[i32]) -> i32 {
    wait_for("a sandbox job process", MINUTE, || {
        let sandboxes = worker.sandboxes();
        sandboxes.iter().copied().find(|p| {
            !except.contains(p)
                && matches!(proc_stat(*p), Some((state, parent, _))
                    if state != 'Z' && sandboxes.contains(&parent))
        })
    })
}

/// How long process `pid` has existed (from its start time in `/proc/<pid>/stat` and the
/// system's uptime; to the clock tick).
pub fn process_age(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("process");
    // Field 22, the start time in clock ticks after boot; fields counted after the name.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let started: u64 = fields[19].parse().unwrap();
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let uptime: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: a plain sysconf query.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Duration::from_secs_f64((uptime - started as f64 / hz).max(0.0))
}

/// Holds process `pid` stopped until it is `age` old, then lets it go on (a job process that
/// makes no progress for that long, whatever the machine's load).
pub async fn stopped_until(pid: i32, age: Duration) {
    // SAFETY: signals to a process of this test's worker.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    tokio::time::sleep(age.saturating_sub(process_age(pid))).await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
}
