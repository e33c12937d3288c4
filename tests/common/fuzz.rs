//! Mutation fuzzing through the sandboxed path (also `benches/fuzz.rs`, `make fuzz`): seeded
//! mutants of every corpus file, run two at a time by a sandbox pool of the worker binary under
//! a 1 GiB memory cap (a 2 GiB pod at pool 2), then a report of what happened.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use media_worker::config::Settings;
use media_worker::error::JobError;
use media_worker::media::MediaError;
use media_worker::media::settings::{LoudnessSpec, StoryboardSpec, StreamingFormat};
use media_worker::sandbox::{Limits, Pool, PoolConfig, Work};
use media_worker::scratch::ScratchDir;
use tokio_util::sync::CancellationToken;

#[path = "mutate.rs"]
pub mod mutate;
use mutate::{MUTATIONS, Mutation, mutate};

/// What a fuzz run saw.
#[derive(Debug, Default)]
pub struct Report {
    pub tried: usize,
    pub answered: usize,
    /// Answers by outcome: `ok` or the error code.
    pub outcomes: BTreeMap<String, usize>,
    /// The first answer of each failing outcome: source file, mutation, message.
    pub examples: BTreeMap<String, String>,
    /// Mutants per kind of mutation.
    pub mutations: BTreeMap<String, usize>,
    /// Children that died on their own, including the ones whose retry then succeeded.
    pub child_deaths: u64,
    /// Jobs answered `media_crashed` (a crash, twice).
    pub crashes_answered: usize,
    /// Jobs answered with the memory limit.
    pub memory_cap: usize,
    /// Peak resident memory of this (the parent) process, MiB.
    pub peak_parent_rss_mib: u64,
    /// Processes left once the pool is closed: children, zombies, or anything still using
    /// the scratch directory (an orphaned ffmpeg).
    pub leftover_processes: usize,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "inputs tried       {}", self.tried)?;
        writeln!(f, "answered           {}", self.answered)?;
        for (k, n) in &self.outcomes {
            writeln!(f, "  {k:<24} {n}")?;
            if let Some(e) = self.examples.get(k) {
                writeln!(f, "    e.g. {e}")?;
            }
        }
        writeln!(f, "mutations          {:?}", self.mutations)?;
        writeln!(
            f,
            "crashes contained  {} child deaths, {} jobs answered media_crashed",
            self.child_deaths, self.crashes_answered
        )?;
        writeln!(f, "memory-cap kills   {}", self.memory_cap)?;
        writeln!(f, "peak parent RSS    {} MiB", self.peak_parent_rss_mib)?;
        write!(f, "leftover processes {}", self.leftover_processes)
    }
}

/// Runs `count` mutants (seeded by `seed`) of the files in `corpus` with `scratch` as work
/// space. Files are taken round-robin, mutations in turn.
pub async fn run(corpus: &Path, count: usize, seed: u64, scratch: &Path) -> Report {
    let mut settings = Settings::load_from(None, Vec::new()).unwrap();
    // Light outputs: every decoder and the analysis run, little encoding.
    let fuzz = media_worker::media::settings::Profile {
        analysis: true,
        widths: vec![160],
        // Auto quality: the search (encode, decode, score) runs on every decodable mutant.
        formats: vec![media_worker::media::settings::FormatSpec {
            format: media_worker::contract::OutputFormat::Webp,
            quality: media_worker::media::settings::Quality::Auto(
                media_worker::media::settings::AutoQuality::Auto,
            ),
            target: None,
        }],
        thumbnail: None,
        renditions: vec![media_worker::media::settings::Rendition::new(144, 35)],
        poster: true,
        // Mutated videos reach the stream's muxers and playlists, the storyboard and the
        // loudness measurement too.
        progressive: true,
        streaming: vec![StreamingFormat::Hls, StreamingFormat::Dash],
        segment_secs: 2,
        // Videos past 4 s in units of 2 segments: mutants reach the units and the stitch.
        units_after_secs: 4,
        unit_segments: 2,
        early_playback: false,
        storyboard: Some(StoryboardSpec {
            interval_secs: 1.0,
            max_tiles: 20,
            tile_width: 64,
            columns: 5,
            format: media_worker::contract::OutputFormat::Webp,
            quality: 50,
        }),
        loudness: Some(LoudnessSpec {
            target_lufs: Some(-16.0),
            max_true_peak_dbtp: -1.0,
        }),
        // Mutated GIFs reach ffmpeg too.
        animation_mp4: true,
        cache_control: "no-cache".into(),
        scan: false,
        // The rights fields are parsed out of every mutant's EXIF, XMP and IPTC.
        keep_metadata: vec![media_worker::media::settings::KeptMetadata::Copyright],
    };
    settings.profiles.insert("fuzz".into(), fuzz);
    settings.limits.max_video_seconds = 30;
    let job = settings.media_job("fuzz", None);
    let pool = Pool::new(PoolConfig {
        program: PathBuf::from(env!("CARGO_BIN_EXE_media-worker")),
        vips_threads: 1,
        limits: Limits {
            nice: 0,
            memory_bytes: 1 << 30,
            file_bytes: 1 << 30,
        },
        disabled: Vec::new(),
        deaths: prometheus::IntCounter::new("deaths", "sandbox deaths").unwrap(),
    });

    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n != "MANIFEST.tsv"))
        .collect();
    files.sort();
    // Each mutant is made when its turn comes (from a seed of its own), so that the parent
    // holds two at a time, as a worker holds its in-flight sources.
    let mut report = Report {
        tried: count,
        ..Report::default()
    };
    let results: Vec<(String, Mutation, Result<(), MediaError>)> =
        futures_util::stream::iter(0..count)
            .map(|i| {
                let (pool, job) = (pool.clone(), job.clone());
                let id = format!("job-m{i}");
                let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(1_000_003) ^ i as u64);
                let file = &files[i % files.len()];
                let other = &files[rng.usize(..files.len())];
                // Each pass over the files starts one mutation further on: every kind on every
                // file.
                let how = MUTATIONS[(i + i / files.len()) % MUTATIONS.len()];
                let name = file.file_name().unwrap().to_string_lossy().into_owned();
                async move {
                    let bytes = mutate(
                        &std::fs::read(file).unwrap(),
                        &std::fs::read(other).unwrap(),
                        how,
                        &mut rng,
                    );
                    let dir = ScratchDir::create(scratch, &id).unwrap();
                    std::fs::write(dir.source(), &bytes).unwrap();
                    drop(bytes);
                    let work = Work::new(job, &dir, Duration::from_secs(60));
                    let r = pool
                        .run(&work, &CancellationToken::new(), &mut |_| {})
                        .await;
                    drop(dir);
                    (name, how, r.map(|_| ()).map_err(|f| f.error))
                }
            })
            .buffer_unordered(2)
            .collect()
            .await;
    for (name, how, r) in results {
        report.answered += 1;
        *report.mutations.entry(format!("{how:?}")).or_default() += 1;
        let outcome = match &r {
            Ok(()) => "ok".to_owned(),
            Err(MediaError::MemoryLimit(_)) => {
                report.memory_cap += 1;
                "limits_exceeded (memory)".to_owned()
            }
            Err(e) => {
                let code = JobError::Media(e.clone()).code().as_str();
                if matches!(e, MediaError::Crashed(_)) {
                    report.crashes_answered += 1;
                }
                code.to_owned()
            }
        };
        if let Err(e) = &r {
            let text: String = e.to_string().chars().take(160).collect();
            report
                .examples
                .entry(outcome.clone())
                .or_insert_with(|| format!("{name} ({how:?}): {text}"));
        }
        *report.outcomes.entry(outcome).or_default() += 1;
    }
    report.child_deaths = pool.deaths();
    pool.close().await;
    report.peak_parent_rss_mib = status_kb("VmHWM:") / 1024;
    report.leftover_processes = leftovers(scratch);
    report
}

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Children of this process (zombies too) and any process whose command line or working
/// directory is in `scratch`.
fn leftovers(scratch: &Path) -> usize {
    let me = std::process::id().to_string();
    let scratch = scratch.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_owned));
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cwd = std::fs::read_link(e.path().join("cwd")).unwrap_or_default();
            parent.as_deref() == Some(me.as_str())
                || String::from_utf8_lossy(&cmdline).contains(&scratch)
                || cwd.to_string_lossy().starts_with(&scratch)
        })
        .count()
}
