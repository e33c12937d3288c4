//! Per-job scratch directories: `{TMP_DIR}/{job id}` (mode 0700), removed on every exit path
//! (the guard's `Drop` runs on success, error, panic unwinding and future cancellation alike).
//! It holds the source, `out/` and `tmp/` (the media work's, see `sandbox::layers::grant`) and
//! the worker's own records beside them, where the media work cannot write.

use std::io;
use std::path::{Path, PathBuf};

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

/// Free bytes on the scratch file system.
pub fn free_bytes(root: &Path) -> Option<u64> {
    Space::of(root).map(|s| s.free)
}

/// The scratch file system's state, as `statvfs` gives it (what an unprivileged writer may use).
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
    pub fn of(root: &Path) -> Option<Space> {
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
    pub fn new(root: &Path) -> Admission {
        Admission {
            root: root.to_owned(),
            reserved: std::sync::Mutex::new(0),
            released: tokio::sync::Notify::new(),
        }
    }

    /// What a job whose source has `source_bytes` is expected to need here: the source and
    /// its outputs up to as much again (variants and renditions are smaller than their source;
    /// the rest is room for temporary files). A job's real outputs are not known before it is
    /// probed, so the estimate is held to what the volume could give one job alone: a large
    /// job runs alone, and if it fills the disk what it needed shows (`JobError::ScratchFull`).
    /// `Err(total)` when the source alone could never be held: the request's failure.
    pub fn need_for(&self, source_bytes: u64) -> Result<u64, u64> {
        let Some(space) = Space::of(&self.root) else {
            return Ok(source_bytes.saturating_mul(2));
        };
        let room = space.room();
        if source_bytes > room {
            return Err(space.total);
        }
        Ok(source_bytes.saturating_mul(2).min(room))
    }

    /// Scratch reserved now by the jobs running.
    pub fn reserved(&self) -> u64 {
        *self.reserved.lock().unwrap()
    }

    /// Takes `need` bytes now if they fit.
    pub fn try_reserve(self: &std::sync::Arc<Self>, need: u64) -> Option<Reservation> {
        let mut reserved = self.reserved.lock().unwrap();
        let free = Space::of(&self.root).map_or(u64::MAX, |s| s.free);
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
        let adm = std::sync::Arc::new(Admission::new(root.path()));
        let free = Space::of(root.path()).unwrap().free;
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
        let adm = Admission::new(root.path());
        let total = Space::of(root.path()).unwrap().total;
        let room = total - KEEP_FREE;
        assert_eq!(adm.need_for(1000), Ok(2000));
        assert_eq!(adm.need_for(room / 2 + 1), Ok(room), "alone it may run");
        assert_eq!(adm.need_for(room), Ok(room));
        assert_eq!(adm.need_for(room + 1), Err(total), "never");
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
}
