//! The worker's check of the files a job process says it made: only names the worker gives
//! ([`expected_name`]), each opened by the worker beneath the job's output directory without
//! following a symlink (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), a regular file,
//! and bounded in count and in total bytes. Its size is what the worker sees, not what the
//! child said. The job process and everything it started are gone by then (`Frame::Ended`):
//! nothing can swap a file after the check.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::path::Path;

use crate::contract::{Failure, Stage};
use crate::media::output::expected_name;
use crate::media::{MediaError, MediaFailure, MediaOutput};

use super::work::Work;

/// More files than any profile makes besides a stream's pieces (every width × format,
/// thumbnails, renditions, poster, storyboard, entry points).
pub const MAX_FILES: usize = 256;

/// The most files `job` can make: [`MAX_FILES`], and for a streaming profile every track's
/// init segment, media segments and media playlist.
pub fn max_files(job: &crate::media::MediaJob) -> usize {
    let p = &job.profile;
    if p.streaming.is_empty() {
        return MAX_FILES;
    }
    let tracks = p.renditions.len() + 1;
    MAX_FILES + tracks * (crate::media::output::max_segments(job) as usize + 2)
}

/// More bytes than any job makes (the capped ladder of a four-hour video is under 20 GiB).
pub const MAX_TOTAL_BYTES: u64 = 64 << 30;

/// `output` as the worker will upload it, or the job's failure (`media_crashed`: a child that
/// names files it may not is not a decoder error of the input).
/// The most byte ranges one read of the source may take (a 4-hour video's audio, interleaved
/// every half second, is under 30 000).
const MAX_RANGES: usize = 200_000;

/// Whether `ranges` are `[start, end)` pairs within a file of `size` bytes, sorted and apart.
fn ranges_within(ranges: &[[u64; 2]], size: u64) -> bool {
    let mut end = 0;
    ranges.len() <= MAX_RANGES
        && ranges.iter().all(|&[a, b]| {
            let ok = a >= end && a < b && b <= size;
            end = b;
            ok
        })
}

pub fn check(work: &Work, mut output: MediaOutput) -> Result<MediaOutput, MediaFailure> {
    let refuse = |why: String| Failure {
        stage: Stage::Transform,
        error: MediaError::Crashed(format!("the sandbox reported an output it may not: {why}")),
    };
    let most = max_files(&work.job);
    if output.files.len() > most {
        return Err(refuse(format!(
            "{} files (at most {most})",
            output.files.len()
        )));
    }
    // Byte ranges of the source the worker will download (`Part::Index`'s, a plan's for its
    // audio and for each unit): within the file, in order, apart, and not a flood of requests.
    let size = std::fs::metadata(&work.input).map_or(0, |m| m.len());
    let units = output.plan.iter().flatten().map(|u| &u.reads);
    if let Some(bad) = std::iter::once(&output.reads)
        .chain(units)
        .find(|r| !ranges_within(r, size))
    {
        return Err(refuse(format!(
            "{} byte ranges not within a {size}-byte source, in order (at most {MAX_RANGES})",
            bad.len()
        )));
    }
    let dir = open_beneath(None, &work.out_dir, libc::O_DIRECTORY)
        .map_err(|e| refuse(format!("{}: {e}", work.out_dir.display())))?;
    let mut total = 0u64;
    for f in &mut output.files {
        let name = expected_name(&work.job, f).ok_or_else(|| {
            refuse(format!(
                "{:?} {} is not an output of this job",
                f.role, f.name
            ))
        })?;
        let file = open_beneath(Some(&dir), Path::new(&name), 0)
            .map_err(|e| refuse(format!("{name}: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| refuse(format!("{name}: {e}")))?;
        if !meta.is_file() {
            return Err(refuse(format!("{name} is not a regular file")));
        }
        total += meta.len();
        if total > MAX_TOTAL_BYTES {
            return Err(refuse(format!("more than {MAX_TOTAL_BYTES} bytes in all")));
        }
        f.path = work.out_dir.join(&name);
        f.name = name;
        f.size_bytes = meta.len();
    }
    Ok(output)
}

/// Opens `path` read-only: relative to `dir`, which it may not leave, with no symlink on the
/// way.
fn open_beneath(dir: Option<&File>, path: &Path, flags: i32) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a zeroed open_how is valid; its fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | flags) as u64;
    // The path to the output directory is the operator's (its last part is not a symlink);
    // what lies beneath it is the child's.
    how.resolve = libc::RESOLVE_NO_MAGICLINKS;
    let at = match dir {
        Some(d) => {
            how.resolve |= libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
            d.as_raw_fd()
        }
        None => libc::AT_FDCWD,
    };
    // SAFETY: openat2 with a NUL-terminated path and an open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            at,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor openat2 just returned, owned from here on.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{FileFormat, ProducedFile, Role};

    fn file(name: &str, path: &Path, width: u32) -> ProducedFile {
        ProducedFile {
            name: name.into(),
            path: path.to_owned(),
            role: Role::Variant,
            format: FileFormat::Image(crate::contract::OutputFormat::Webp),
            width,
            height: width / 2,
            size_bytes: 1,
            duration_ms: None,
            frames: None,
            crop: None,
            quality: None,
        }
    }

    #[test]
    fn forged_byte_ranges_are_refused() {
        use super::ranges_within;
        assert!(ranges_within(&[[0, 10], [20, 30]], 30));
        assert!(ranges_within(&[], 0));
        assert!(!ranges_within(&[[10, 5]], 30), "backwards");
        assert!(!ranges_within(&[[0, 10], [5, 20]], 30), "overlapping");
        assert!(!ranges_within(&[[0, 40]], 30), "past the end");
        assert!(
            !ranges_within(&vec![[0, 1]; super::MAX_RANGES + 1], 30),
            "a flood"
        );
    }

    #[test]
    fn only_regular_files_beneath_the_output_directory_under_the_workers_names() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = crate::scratch::ScratchDir::create(dir.path(), "job-t").unwrap();
        let work = Work::new(
            crate::media::settings::defaults::job("default"),
            &scratch,
            std::time::Duration::from_secs(5),
        );
        let out = |files| MediaOutput {
            media_type: crate::contract::MediaType::Image,
            files,
            analysis: None,
            warnings: Vec::new(),
            tracks: Vec::new(),
            plan: None,
            reads: Vec::new(),
            opening: None,
        };
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "secret").unwrap();
        std::fs::write(work.out_dir.join("320w.webp"), "riff").unwrap();

        // Named by the worker, sized by what it sees: the child's name and path are not used.
        let ok = check(&work, out(vec![file("../renditions.json", &secret, 320)])).unwrap();
        assert_eq!(ok.files[0].name, "320w.webp");
        assert_eq!(ok.files[0].path, work.out_dir.join("320w.webp"));
        assert_eq!(ok.files[0].size_bytes, 4);

        // A symlink, a directory, a file that is not there, a format the profile lacks.
        std::os::unix::fs::symlink(&secret, work.out_dir.join("600w.webp")).unwrap();
        std::fs::create_dir(work.out_dir.join("1200w.webp")).unwrap();
        let mut avif = file("x", &secret, 320);
        avif.format = FileFormat::Image(crate::contract::OutputFormat::Avif);
        for bad in [
            file("x", &secret, 600),
            file("x", &secret, 1200),
            file("x", &secret, 5),
            avif,
        ] {
            let e = check(&work, out(vec![bad])).unwrap_err();
            assert!(matches!(e.error, MediaError::Crashed(_)), "{e:?}");
        }
        // More files than any job makes.
        let many = (0..=MAX_FILES).map(|_| file("x", &secret, 320)).collect();
        assert!(check(&work, out(many)).is_err());
    }
}
