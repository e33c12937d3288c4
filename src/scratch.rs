//! Per-job scratch directories: `{TMP_DIR}/{job id}` (mode 0700), removed on every exit path
//! (the guard's `Drop` runs on success, error, panic unwinding and future cancellation alike).
//! It holds the source, `out/` and `tmp/` (the media work's, see `sandbox::layers::grant`) and
//! the worker's own records beside them, where the media work cannot write.
//!
//! The volume is shared by the pod's jobs, and three rules keep a full disk from being taken
//! for the wrong party's fault:
//! - [`Admission`]: a job reserves what it expects to need before its download, and waits
//!   while that does not fit beside the others; a source larger than the volume never runs.
//! - [`Meter`]: each attempt has a budget, what the volume can give one job ([`Space::budget`]),
//!   and its writes are measured against it while it runs: past it, the job is stopped at once,
//!   its outputs can never fit here (the request's answer, not the pod's).
//! - [`Meter::verdict`]: a failure within the budget met on a full volume is the pod's (another
//!   job or something else filled it): retried, and held while the space is not back.
//!
//! The volume is the file system's (`statvfs`), or less: a Kubernetes emptyDir on the node's
//! disk has the disk's `statvfs` but a size the kubelet enforces by evicting the pod (its
//! `sizeLimit`, the container's `ephemeral-storage` limit). With `worker.scratch_bytes` set
//! (`SCRATCH_BYTES`, the limit through the downward API), [`Space::of`] holds the volume to it,
//! what `tmp_dir` holds counting against it: every rule above then keeps within the limit, and
//! a job that would pass it is answered instead of the pod being evicted.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PREFIX: &str = "job-";

pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    pub fn create(root: &Path, job_id: &str) -> io::Result<ScratchDir> {
        debug_assert!(job_id.starts_with(PREFIX));
        use std::os::unix::fs::DirBuilderExt;
        std::fs::create_dir_all(root)?;
        let path = root.join(job_id);
        let mut dirs = std::fs::DirBuilder::new();
        dirs.mode(0o700);
        for dir in [&path, &path.join("out"), &path.join("tmp")] {
            dirs.create(dir)?;
        }
        Ok(ScratchDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Where the source is downloaded.
    pub fn source(&self) -> PathBuf {
        self.path.join("source")
    }
    /// Where outputs are written before upload.
    pub fn out_dir(&self) -> PathBuf {
        self.path.join("out")
    }
    /// The media work's temporary files (`TMPDIR`).
    pub fn tmp_dir(&self) -> PathBuf {
        self.path.join("tmp")
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove scratch dir");
        }
    }
}

/// Writes one of the worker's own records (`manifest.json`, `renditions.json`) into a job
/// directory: never through a symlink (`O_NOFOLLOW`), readable by the worker alone.
pub async fn write_record(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .await?;
    f.write_all(bytes).await?;
    f.flush().await
}

/// Removes job directories left by a crashed run. Only `job-*` entries are touched, so a
/// TMP_DIR shared with other programs is safe. Returns how many were removed.
pub fn sweep(root: &Path) -> io::Result<usize> {
    std::fs::create_dir_all(root)?;
    let mut removed = 0;
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(PREFIX) && entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Free bytes on the scratch volume (of at most `limit` bytes; 0: its file system's size), with
/// what `root` holds from `usage`'s last walk of it: what readiness and the intake gate ask on
/// every turn of each consumer's loop.
pub fn free_bytes(root: &Path, limit: u64, usage: &Arc<Usage>) -> Option<u64> {
    let fs = Space::file_system(root)?;
    if limit == 0 || limit >= fs.total {
        return Some(fs.free);
    }
    Some(fs.free.min(limit.saturating_sub(usage.bytes(root))))
}

/// What the scratch root holds, for the health checks: walked at most once per [`WALK_EVERY`],
/// on a thread of its own, the last count given meanwhile. The consumers' loops ask on every
/// turn, holding their state, and a walk of a long video's stitch (ten thousand files) takes
/// 50-70 ms (`benches/scratch_meter.rs`); the kubelet measures an emptyDir every 10 s or more,
/// so a count a second old misses nothing it would act on. The first count is walked there
/// and then. (A job's own budget, [`Space::of`], walks when it is asked: once per job.)
#[derive(Debug, Default)]
pub struct Usage {
    last: Mutex<Option<(Instant, u64)>>,
    walking: AtomicBool,
}

/// How old [`Usage`]'s count may get before a new walk starts.
pub const WALK_EVERY: Duration = Duration::from_secs(1);

impl Usage {
    pub fn bytes(self: &Arc<Self>, root: &Path) -> u64 {
        let last = *self.last.lock().expect("not poisoned");
        let Some((at, bytes)) = last else {
            let bytes = used_bytes(root);
            *self.last.lock().expect("not poisoned") = Some((Instant::now(), bytes));
            return bytes;
        };
        if at.elapsed() >= WALK_EVERY && !self.walking.swap(true, Ordering::AcqRel) {
            let (usage, root) = (self.clone(), root.to_owned());
            let walk = std::thread::Builder::new()
                .name("scratch-usage".into())
                .spawn(move || {
                    let bytes = used_bytes(&root);
                    *usage.last.lock().expect("not poisoned") = Some((Instant::now(), bytes));
                    usage.walking.store(false, Ordering::Release);
                });
            if walk.is_err() {
                self.walking.store(false, Ordering::Release);
            }
        }
        bytes
    }
}

/// The scratch volume's state: its file system's as `statvfs` gives it (what an unprivileged
/// writer may use), held to a limit when one is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// The size an unprivileged writer could ever fill (the blocks kept for root excluded).
    pub total: u64,
    pub free: u64,
    pub free_inodes: u64,
}

/// Below this many free inodes the file system is full whatever its bytes say.
const MIN_FREE_INODES: u64 = 64;

impl Space {
    /// The volume at `root`, of at most `limit` bytes (0: no limit) when that is less than its
    /// file system: then what `root` holds counts against the limit, as the kubelet counts an
    /// emptyDir's usage against its size.
    pub fn of(root: &Path, limit: u64) -> Option<Space> {
        let fs = Space::file_system(root)?;
        if limit == 0 || limit >= fs.total {
            return Some(fs);
        }
        Some(Space {
            total: limit,
            free: fs.free.min(limit.saturating_sub(used_bytes(root))),
            free_inodes: fs.free_inodes,
        })
    }

    /// The file system's state, as `statvfs` gives it.
    pub fn file_system(root: &Path) -> Option<Space> {
        let c = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()).ok()?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid NUL-terminated path and a zeroed out-struct.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return None;
        }
        let unit = st.f_frsize as u64;
        let kept_for_root = (st.f_bfree as u64).saturating_sub(st.f_bavail as u64);
        Some(Space {
            total: (st.f_blocks as u64).saturating_sub(kept_for_root) * unit,
            free: st.f_bavail as u64 * unit,
            free_inodes: st.f_favail as u64,
        })
    }

    /// What one job could have with the volume to itself.
    pub fn room(&self) -> u64 {
        self.total.saturating_sub(KEEP_FREE)
    }

    /// What one job could have once the jobs holding `ours` (their bytes on this volume) are
    /// done: whatever else the volume holds stays.
    pub fn reachable(&self, ours: u64) -> u64 {
        self.free
            .saturating_add(ours)
            .min(self.total)
            .saturating_sub(KEEP_FREE)
    }

    /// A job's scratch budget: what the volume can give one job ([`Space::room`]) less the
    /// reserve (the operator's readiness floor `min_free`, at least 1 MiB) and its `source`.
    /// Alone on the volume, a job within it leaves the pod ready; one past it can never run
    /// here, whatever else the volume holds or does not.
    pub fn budget(&self, min_free: u64, source: u64) -> u64 {
        self.room()
            .saturating_sub(min_free.max(RESERVE))
            .saturating_sub(source)
    }

    /// Too full for a job needing `needed` bytes: less free than that, than the operator's
    /// `min_free` or than 1 MiB, or almost no inode left. A job's native work, download or
    /// upload that failed with the file system in this state failed for the pod's reason,
    /// whatever words its library used. The floor is the job's own need, not a share of the
    /// volume: on a large shared disk a few GiB free is plenty, and an input's own fault must
    /// not be taken for the pod's there.
    pub fn near_full(&self, min_free: u64, needed: u64) -> bool {
        let floor = min_free.max(needed).max(1 << 20);
        self.free < floor || self.free_inodes < MIN_FREE_INODES
    }
}

/// The last MiB of the volume is never counted on: the file system needs it for itself.
const KEEP_FREE: u64 = 1 << 20;

/// The least a job's budget leaves free beside [`KEEP_FREE`]: room for the meter to see a
/// job's writes pass its budget before the volume is full (a MiB is 10 s of a 100 KB/s
/// encoder, 100 ms of a 10 MB/s one).
const RESERVE: u64 = 1 << 20;

/// Bytes of `file` as they are allocated on disk (0 when it is not there).
fn allocated(file: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file).map_or(0, |m| m.blocks() * 512)
}

/// Bytes under `dir` (a job's scratch), counted as they are allocated on disk.
pub fn used_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => used_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// Admission by need: a job reserves the scratch it expects to use before it starts, so that
/// jobs that would fill the disk together run one after the other instead of failing together.
/// A reservation fits when the free space, less what the other reservations may still write,
/// holds it; the space the running jobs already wrote counts against them twice, which errs on
/// the side of waiting.
#[derive(Debug)]
pub struct Admission {
    root: PathBuf,
    /// The readiness floor (`MIN_SCRATCH_FREE_BYTES`): a job's budget leaves it free.
    min_free: u64,
    /// The volume's size when less than its file system's (`SCRATCH_BYTES`; 0: none).
    limit: u64,
    reserved: std::sync::Mutex<u64>,
    released: tokio::sync::Notify,
}

/// Reserved scratch, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    admission: std::sync::Arc<Admission>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        *self.admission.reserved.lock().unwrap() -= self.bytes;
        self.admission.released.notify_waiters();
    }
}

/// How often a waiting job looks at the file system again (space freed by something else than
/// a job of this worker, or a volume that grew).
const SPACE_RECHECK: std::time::Duration = std::time::Duration::from_millis(500);

impl Admission {
    pub fn new(root: &Path, min_free: u64, limit: u64) -> Admission {
        Admission {
            root: root.to_owned(),
            min_free,
            limit,
            reserved: std::sync::Mutex::new(0),
            released: tokio::sync::Notify::new(),
        }
    }

    /// What a job whose source has `source_bytes` is expected to need here: the source and
    /// its outputs up to as much again (variants and renditions are smaller than their source;
    /// the rest is room for temporary files). A job's real outputs are not known before it is
    /// probed, so the estimate is held to what the volume could give one job alone: a large
    /// job runs alone, and what it writes is measured against its budget ([`Meter`]).
    /// `Err(total)` when the source alone could never be held: the request's failure.
    pub fn need_for(&self, source_bytes: u64) -> Result<u64, u64> {
        let Some(space) = Space::of(&self.root, self.limit) else {
            return Ok(source_bytes.saturating_mul(2));
        };
        let room = space.room();
        if source_bytes > room {
            return Err(space.total);
        }
        Ok(source_bytes.saturating_mul(2).min(room))
    }

    /// Takes `need` bytes now if they fit.
    pub fn try_reserve(self: &std::sync::Arc<Self>, need: u64) -> Option<Reservation> {
        let mut reserved = self.reserved.lock().unwrap();
        let free = Space::of(&self.root, self.limit).map_or(u64::MAX, |s| s.free);
        // Alone, a job takes what there is: nothing else of ours holds space.
        let fits = need <= free.saturating_sub(*reserved) || (*reserved == 0 && need <= free);
        fits.then(|| {
            *reserved += need;
            Reservation {
                admission: self.clone(),
                bytes: need,
            }
        })
    }

    /// Waits until `need` bytes fit, then takes them. `on_wait` hears that it waits, and
    /// again whenever that changes, whether anything of ours holds space (if nothing does,
    /// only a larger or emptier volume lets it run: the pod cannot serve it now).
    pub async fn reserve(
        self: &std::sync::Arc<Self>,
        need: u64,
        mut on_wait: impl FnMut(bool),
    ) -> Reservation {
        let mut told = None;
        loop {
            let released = self.released.notified();
            if let Some(r) = self.try_reserve(need) {
                return r;
            }
            let others = *self.reserved.lock().unwrap() > 0;
            if told != Some(others) {
                told = Some(others);
                on_wait(others);
            }
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep(SPACE_RECHECK) => {}
            }
        }
    }
}

/// How often a job's writes are measured (less often when a measurement takes more than a
/// tenth of that).
const METER_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// One attempt's writes (everything in its directory but the source), measured against its
/// budget ([`Space::budget`]) every [`METER_EVERY`] by a task of its own while the attempt
/// lasts (stopped on drop), on a blocking thread: a `stat` per file, and a stitch's directory
/// holds every segment of its program (`benches/scratch_meter.rs`: 10,919 files for two hours,
/// a walk of 50 ms on a loaded machine, which held a one-worker runtime a third of the time).
/// A measurement takes a tenth of the meter's time at most, so a directory that large is
/// measured every half second or so. Writes past the budget stop the attempt at once (`stop` is
/// cancelled): the volume has not even filled, so that does not depend on how the job's
/// encoder writes, or what it deletes when a write fails. The peak is kept for
/// [`Meter::verdict`].
#[derive(Debug)]
pub struct Meter {
    dir: PathBuf,
    root: PathBuf,
    min_free: u64,
    limit: u64,
    seen: std::sync::Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Seen {
    peak: std::sync::atomic::AtomicU64,
    overrun: std::sync::OnceLock<Overrun>,
}

/// A job past its budget: what it wrote, its budget, the volume's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overrun {
    pub written: u64,
    pub budget: u64,
    pub total: u64,
    /// Stopped by the meter (rather than found past it after it failed).
    pub stopped: bool,
}

/// What the scratch says of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Past its budget: its outputs can never fit here, the request's failure.
    Overrun(Overrun),
    /// Within its budget on a full volume: the pod's fault. `needed`: the space to wait for
    /// before it runs again (what it expected, or twice what it held at its peak; never more
    /// than the volume can give once this pod's jobs are done).
    Full { free: u64, needed: u64 },
    /// The volume has room: the failure is what it said.
    Room,
}

impl Admission {
    /// Meters an attempt in `dir` (its scratch directory), cancelling `stop` past its budget.
    pub fn meter(&self, dir: &Path, stop: tokio_util::sync::CancellationToken) -> Meter {
        let seen = std::sync::Arc::new(Seen::default());
        let (dir, root, min_free, limit) =
            (dir.to_owned(), self.root.clone(), self.min_free, self.limit);
        let task = {
            let (seen, dir, root) = (seen.clone(), dir.clone(), root.clone());
            tokio::spawn(async move {
                loop {
                    // A `stat` per file, and a stitch holds every segment of the program (a
                    // two-hour one, over 10,000): off the runtime's workers, one walk at a time,
                    // and a tenth of the meter's time at most.
                    let started = std::time::Instant::now();
                    let walk = {
                        let (seen, dir, root) = (seen.clone(), dir.clone(), root.clone());
                        tokio::task::spawn_blocking(move || {
                            seen.measure(&dir, &root, min_free, limit, true)
                        })
                    };
                    if let Ok(Some(o)) = walk.await {
                        tracing::warn!(dir = %dir.display(), written = o.written,
                            budget = o.budget, total = o.total, "writes past the job's scratch budget: stopped");
                        stop.cancel();
                        return;
                    }
                    tokio::time::sleep(METER_EVERY.max(started.elapsed() * 9)).await;
                }
            })
        };
        Meter {
            dir,
            root,
            min_free,
            limit,
            seen,
            task,
        }
    }
}

impl Seen {
    /// The most the attempt had written when measured.
    fn peak(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Measures the writes in `dir` now, keeping the peak; an overrun once they pass the
    /// budget (recorded when `stops`).
    fn measure(
        &self,
        dir: &Path,
        root: &Path,
        min_free: u64,
        limit: u64,
        stops: bool,
    ) -> Option<Overrun> {
        use std::sync::atomic::Ordering;
        let space = Space::of(root, limit)?;
        let source = allocated(&dir.join("source"));
        let now = used_bytes(dir).saturating_sub(source);
        let written = self.peak.fetch_max(now, Ordering::Relaxed).max(now);
        let budget = space.budget(min_free, source);
        let o = Overrun {
            written,
            budget,
            total: space.total,
            stopped: stops,
        };
        (written > budget && (!stops || self.overrun.set(o).is_ok())).then_some(o)
    }
}

impl Meter {
    /// What the scratch says of the attempt's failure: stopped past its budget, the request's
    /// ([`Verdict::Overrun`]) whatever the failure was. Otherwise, for a failure a full
    /// scratch could explain (`could_be_scratch`): past its budget by its peak or by what it
    /// holds now, the request's; within it, on a volume too full for what it needs (`need`:
    /// what it reserved, or twice what it held at its peak), the pod's ([`Verdict::Full`]: another job or
    /// something else filled it); else [`Verdict::Room`]. Never on how full the volume looked
    /// after the last write (an encoder may delete what it wrote when a write fails).
    pub fn verdict(
        &self,
        need: u64,
        could_be_scratch: bool,
        cause: &dyn std::fmt::Display,
    ) -> Verdict {
        let overrun = match self.seen.overrun.get() {
            Some(o) => Some(*o),
            None if could_be_scratch => {
                self.seen
                    .measure(&self.dir, &self.root, self.min_free, self.limit, false)
            }
            None => return Verdict::Room,
        };
        if let Some(o) = overrun {
            tracing::warn!(error = %cause, written = o.written, budget = o.budget, total = o.total,
                stopped = o.stopped, "outputs larger than the job's scratch budget: the request's failure");
            return Verdict::Overrun(o);
        }
        let Some(space) = Space::of(&self.root, self.limit) else {
            return Verdict::Room;
        };
        // Twice what it held at its peak (its source and the most it had written): an
        // encoder may have deleted what it wrote when a write failed, and what it holds now
        // says nothing of what it needed. Each attempt that meets a full volume waits for
        // twice more room than the last had, so that one that can never fit is soon alone on
        // the volume and passes its budget (a job within it finishes meanwhile).
        let held = allocated(&self.dir.join("source")) + self.seen.peak();
        let needed = need.max(held.saturating_mul(2));
        if !space.near_full(self.min_free, needed) {
            return Verdict::Room;
        }
        // Never more than the volume can give once this pod's jobs are done (it may hold more
        // than ours), or the job would wait for space that never comes.
        let needed = needed.min(space.reachable(used_bytes(&self.root)));
        tracing::warn!(error = %cause, free = space.free, needed,
            "failed with the scratch file system full: a fault of this pod");
        Verdict::Full {
            free: space.free,
            needed,
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_full_by_the_jobs_need_the_operators_floor_or_inodes() {
        let space = |free, free_inodes| Space {
            total: 1000 << 20,
            free,
            free_inodes,
        };
        // Less free than the job needs.
        assert!(space(19 << 20, 1000).near_full(0, 20 << 20));
        assert!(!space(21 << 20, 1000).near_full(0, 20 << 20));
        // An operator's floor above that.
        assert!(space(21 << 20, 1000).near_full(30 << 20, 20 << 20));
        // Bytes to spare, but no inode.
        assert!(space(500 << 20, 10).near_full(0, 0));
        // Whatever the job needs, the last MiB is the file system's.
        assert!(space(900 << 10, 1000).near_full(0, 0));
        // A large shared disk, 1.3 GB free, a job of 600 KB: the disk is not the cause (CI
        // once answered every input error of a run `internal` for a 5 GB share rule).
        let shared = Space {
            total: 252 << 30,
            free: 1_331_355_648,
            free_inodes: 1 << 20,
        };
        assert!(!shared.near_full(512 << 20, 589_824));
    }

    #[tokio::test]
    async fn reservations_take_turns_for_the_space() {
        let root = tempfile::tempdir().unwrap();
        let adm = std::sync::Arc::new(Admission::new(root.path(), 0, 0));
        let free = Space::of(root.path(), 0).unwrap().free;
        let first = adm.try_reserve(free / 2 + 1).expect("alone, it fits");
        // A second that would not fit beside the first waits for it. (Three quarters: the
        // disk is shared, its free space may move by a quarter meanwhile either way.)
        let second = free / 4 * 3;
        assert!(adm.try_reserve(second).is_none());
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move {
                let mut waited = None;
                let r = adm.reserve(second, |others| waited = Some(others)).await;
                (r.bytes, waited)
            })
        };
        tokio::task::yield_now().await;
        drop(first);
        let (bytes, waited) = waiter.await.unwrap();
        assert_eq!(bytes, second);
        assert_eq!(waited, Some(true), "it waited, for another job");
    }

    #[test]
    fn a_need_is_held_to_what_the_volume_could_give_one_job() {
        let root = tempfile::tempdir().unwrap();
        let adm = Admission::new(root.path(), 0, 0);
        let total = Space::of(root.path(), 0).unwrap().total;
        let room = total - KEEP_FREE;
        assert_eq!(adm.need_for(1000), Ok(2000));
        assert_eq!(adm.need_for(room / 2 + 1), Ok(room), "alone it may run");
        assert_eq!(adm.need_for(room), Ok(room));
        assert_eq!(adm.need_for(room + 1), Err(total), "never");
    }

    #[test]
    fn a_budget_is_the_volume_for_one_job_less_the_reserve_and_the_source() {
        // The issue's volume: 24 MiB, readiness floor 1 MiB, a 2.7 MB source.
        let space = Space {
            total: 24 << 20,
            free: 24 << 20,
            free_inodes: 1000,
        };
        assert_eq!(space.budget(1 << 20, 2_700_000), (22 << 20) - 2_700_000);
        // The reserve is the operator's floor when higher, never less than 1 MiB.
        assert_eq!(space.budget(4 << 20, 0), 19 << 20);
        assert_eq!(space.budget(0, 0), 22 << 20);
        // Nothing left for a source that takes it all.
        assert_eq!(space.budget(1 << 20, 23 << 20), 0);
    }

    /// A volume whose budget is `budget` bytes for a job without a source (the operator's
    /// floor takes the rest): writes are measured as on any volume.
    fn budgeted(root: &Path, budget: u64) -> Admission {
        let room = Space::of(root, 0).unwrap().room();
        Admission::new(root, room - budget, 0)
    }

    #[tokio::test]
    async fn writes_past_the_budget_stop_the_attempt_and_are_kept_when_deleted() {
        let root = tempfile::tempdir().unwrap();
        let adm = budgeted(root.path(), 256 << 10);
        let d = ScratchDir::create(root.path(), "job-m").unwrap();
        // The source does not count as writes, and takes its bytes from the budget.
        std::fs::write(d.source(), vec![1u8; 64 << 10]).unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let meter = adm.meter(d.path(), stop.clone());
        let out = d.out_dir().join("segment.tmp");
        std::fs::write(&out, vec![1u8; 256 << 10]).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), stop.cancelled())
            .await
            .expect("stopped past its budget");
        // What the encoder deletes when it fails does not undo what it wrote.
        std::fs::remove_file(&out).unwrap();
        let Verdict::Overrun(o) = meter.verdict(0, false, &"cancelled") else {
            panic!("not an overrun");
        };
        assert!(o.stopped);
        assert!(o.written >= 256 << 10, "{o:?}");
        assert_eq!(o.budget, (256 << 10) - (64 << 10));
    }

    #[tokio::test]
    async fn a_failure_within_the_budget_on_a_volume_with_room_is_what_it_said() {
        let root = tempfile::tempdir().unwrap();
        let adm = Admission::new(root.path(), 0, 0);
        let d = ScratchDir::create(root.path(), "job-r").unwrap();
        let meter = adm.meter(d.path(), tokio_util::sync::CancellationToken::new());
        std::fs::write(d.out_dir().join("a.webp"), vec![1u8; 4096]).unwrap();
        // On CI's shared disk: room for a few KB.
        assert_eq!(meter.verdict(8192, true, &"corrupt"), Verdict::Room);
    }

    /// A job within its budget that needs more than the volume has free: a failure a full
    /// volume could explain is the pod's, one it could not (a corrupt input, a crash) is what
    /// it said, full volume or not.
    #[tokio::test]
    async fn a_failure_a_full_volume_cannot_explain_is_what_it_said() {
        let root = tempfile::tempdir().unwrap();
        let adm = Admission::new(root.path(), 0, 0);
        let d = ScratchDir::create(root.path(), "job-n").unwrap();
        let meter = adm.meter(d.path(), tokio_util::sync::CancellationToken::new());
        std::fs::write(d.out_dir().join("a.webp"), vec![1u8; 4096]).unwrap();
        // More than any disk here has free: the volume is full for this job.
        let need = Space::of(root.path(), 0).unwrap().total + 1;
        assert!(
            matches!(
                meter.verdict(need, true, &"write error"),
                Verdict::Full { .. }
            ),
            "the volume is full for it"
        );
        assert_eq!(meter.verdict(need, false, &"corrupt"), Verdict::Room);
    }

    /// A job that met a full volume within its budget waits for twice what it held at its
    /// peak, not for what its directory holds once the encoder deleted its work: else its
    /// next attempt, admitted beside the job that filled the volume, meets it full again.
    #[tokio::test]
    async fn a_full_volume_makes_a_job_wait_for_twice_its_peak() {
        let root = tempfile::tempdir().unwrap();
        // A floor above what the disk has free: full for any job, whose budget stays large.
        let space = Space::of(root.path(), 0).unwrap();
        let adm = Admission::new(root.path(), space.free + (1 << 30), 0);
        let d = ScratchDir::create(root.path(), "job-p").unwrap();
        std::fs::write(d.source(), vec![1u8; 64 << 10]).unwrap();
        let meter = adm.meter(d.path(), tokio_util::sync::CancellationToken::new());
        let out = d.out_dir().join("segment.m4s");
        std::fs::write(&out, vec![1u8; 256 << 10]).unwrap();
        // The meter's tick, now.
        assert_eq!(
            meter
                .seen
                .measure(d.path(), root.path(), adm.min_free, 0, false),
            None,
            "within its budget"
        );
        std::fs::remove_file(&out).unwrap();
        let Verdict::Full { needed, .. } = meter.verdict(0, true, &"write error") else {
            panic!("not the pod's");
        };
        assert!(needed >= 2 * ((256 + 64) << 10), "needed {needed}");
    }

    /// An emptyDir of 1 MiB on a large disk: the volume is 1 MiB, what it holds taken from
    /// it; a job's budget, its need and its meter all count within it.
    #[tokio::test]
    async fn a_limit_below_the_file_system_is_the_volume() {
        let root = tempfile::tempdir().unwrap();
        let limit = 1 << 20;
        let fs = Space::file_system(root.path()).unwrap();
        assert!(
            fs.total > 64 * limit,
            "a disk larger than the limit: {fs:?}"
        );
        assert_eq!(Space::of(root.path(), 0), Some(fs), "no limit");
        assert_eq!(
            Space::of(root.path(), fs.total + 1).map(|s| s.total),
            Some(fs.total),
            "a limit above the file system is the file system"
        );
        let empty = Space::of(root.path(), limit).unwrap();
        assert_eq!((empty.total, empty.free), (limit, limit));
        std::fs::write(root.path().join("held"), vec![1u8; 256 << 10]).unwrap();
        let held = Space::of(root.path(), limit).unwrap();
        assert_eq!(held.free, limit - (256 << 10));

        let adm = Admission::new(root.path(), 0, 4 << 20);
        assert_eq!(
            adm.need_for(5 << 20),
            Err(4 << 20),
            "larger than the volume"
        );
        let d = ScratchDir::create(root.path(), "job-l").unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let meter = adm.meter(d.path(), stop.clone());
        std::fs::write(d.out_dir().join("big.webp"), vec![1u8; 3 << 20]).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), stop.cancelled())
            .await
            .expect("stopped past a budget within the limit");
        let Verdict::Overrun(o) = meter.verdict(0, false, &"cancelled") else {
            panic!("not an overrun");
        };
        assert_eq!(o.total, 4 << 20, "{o:?}");
    }

    #[test]
    fn removed_on_drop_and_on_panic() {
        let root = tempfile::tempdir().unwrap();
        let d = ScratchDir::create(root.path(), "job-a").unwrap();
        std::fs::write(d.source(), b"x").unwrap();
        let p = d.path().to_owned();
        drop(d);
        assert!(!p.exists());

        let r = root.path().to_owned();
        let caught = std::panic::catch_unwind(move || {
            let _d = ScratchDir::create(&r, "job-b").unwrap();
            panic!("decoder blew up");
        });
        assert!(caught.is_err());
        assert!(!root.path().join("job-b").exists());
    }

    #[test]
    fn sweep_removes_only_job_dirs() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("job-old/out")).unwrap();
        std::fs::create_dir_all(root.path().join("keep-me")).unwrap();
        assert_eq!(sweep(root.path()).unwrap(), 1);
        assert!(root.path().join("keep-me").exists());
        assert!(!root.path().join("job-old").exists());
    }

    /// The health checks' count of the scratch root: walked where first asked, then the last
    /// count while a newer one is walked on a thread of its own, at most once per
    /// `WALK_EVERY`; what the root gains shows once a walk has counted it.
    #[test]
    fn the_health_checks_count_of_the_scratch_is_walked_off_their_thread() {
        let root = tempfile::tempdir().unwrap();
        let usage = Arc::new(Usage::default());
        let first = usage.bytes(root.path());
        std::fs::write(root.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        let asked = Instant::now();
        assert_eq!(
            usage.bytes(root.path()),
            first,
            "walked again within WALK_EVERY"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let grown = loop {
            let now = usage.bytes(root.path());
            if now > first {
                break now;
            }
            assert!(Instant::now() < deadline, "never counted again");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(asked.elapsed() >= WALK_EVERY);
        assert!(grown >= first + (1 << 20), "{grown}");
        // Held to a limit: the free bytes are the limit less the count.
        let limit = grown + 4096;
        assert_eq!(free_bytes(root.path(), limit, &usage), Some(4096));
    }
}
