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
    let c = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and a zeroed out-struct.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

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
