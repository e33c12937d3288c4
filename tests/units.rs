//! A long video encoded as units against the same video in one run, through the same
//! `media::process` the worker runs, read back with ffprobe, ffmpeg's `ssim`, Python's `m3u8`
//! and an XML parser.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::stream::{decodes, first_packet, hls, mpd_representations, playable, run};
use common::{logged, logged_containing};
use media_worker::config::Settings;
use media_worker::media::sniff::Container;
use media_worker::media::video::{ffprobe, units};
use media_worker::media::{self, Control, MediaJob, MediaOutput};

const SEGMENT_SECS: u32 = 4;
const UNIT_SEGMENTS: u32 = 3;
/// Frames per unit of the 30 fps source.
const UNIT_FRAMES: u64 = 30 * (SEGMENT_SECS * UNIT_SEGMENTS) as u64;

/// The streaming profile; in units past `units_after_secs`.
fn job(units_after_secs: u32) -> MediaJob {
    media::init(1);
    let settings = Settings::load_from(None, Vec::new()).unwrap();
    let mut job = settings.media_job("streaming", None);
    job.profile.units_after_secs = units_after_secs;
    job.profile.unit_segments = UNIT_SEGMENTS;
    job.profile.segment_secs = SEGMENT_SECS;
    // The 480p source's own rung and a low one (the 360p between changes nothing a unit does;
    // a 720p source made the ladders' time twice this for what these tests check).
    job.profile
        .renditions
        .retain(|r| matches!(r.height, 480 | 234));
    // Both cores for each ffmpeg (a pool of one): the two ladders are most of the test's time.
    job.ffmpeg_threads = 2;
    job
}

fn process(job: &MediaJob, input: &Path, out: &Path) -> MediaOutput {
    media::process(job, input, out, &mut Control::new(&mut |_| {}))
        .unwrap_or_else(|f| panic!("{}: {:?}", input.display(), f.error))
}

/// Every file under `dir`, relative to it (the work folder excluded).
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.retain(|f| !f.starts_with('.') && !f.ends_with("ffmpeg.m3u8"));
    out.sort();
    out
}

fn bytes(dir: &Path, names: &[String]) -> u64 {
    names
        .iter()
        .map(|n| std::fs::metadata(dir.join(n)).unwrap().len())
        .sum()
}

/// The presentation times of the packets of the first stream of `kind`, sorted (ffprobe,
/// nothing decoded).
fn presentation_times(path: &Path, kind: &str) -> Vec<f64> {
    let mut t: Vec<f64> = run(Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", kind])
        .args(["-show_entries", "packet=pts_time", "-of", "csv=p=0"])
        .arg(path))
    .lines()
    .map(str::trim)
    .filter(|l| !l.is_empty())
    .map(|l| l.trim_end_matches(',').parse().unwrap())
    .collect();
    t.sort_by(f64::total_cmp);
    t
}

/// Per-frame SSIM (luma) of `encoded` against `source` scaled to its size.
fn ssim_per_frame(encoded: &Path, source: &Path, scratch: &Path) -> Vec<f64> {
    let stats = scratch.join(format!(
        "ssim-{}.log",
        encoded.to_string_lossy().replace('/', "_")
    ));
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(encoded)
        .arg("-i")
        .arg(source)
        .arg("-lavfi")
        .arg(format!(
            "[1:v][0:v]scale2ref[s][e];[e][s]ssim=stats_file={}",
            stats.display()
        ))
        .args(["-f", "null", "-"]));
    std::fs::read_to_string(&stats)
        .unwrap()
        .lines()
        .map(|l| {
            let y = l.split_whitespace().find(|f| f.starts_with("Y:")).unwrap();
            y[2..].parse().unwrap()
        })
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// A 1-minute 480p camera-like source (B-frames, audio) as units of 3 segments, against the
/// same source in one run: the same files; every rung with the source's frames, timestamps
/// increasing across every unit edge, a keyframe at the start of every segment at the same time
/// in every rung; one continuous audio track; playlists and MPD that parse; every MP4 decoded
/// with `-xerror`; within 3 % of the one run's bytes, its mean SSIM within 0.002 and the frames
/// either side of each unit edge within 0.01.
#[test]
fn units_stitch_into_what_one_run_makes() {
    let dir = tempfile::tempdir().unwrap();
    let source = common::synthetic::camera_like_video(dir.path(), 60, 854, 480);
    let source_frames = decodes(&source);
    assert_eq!(source_frames, 1800);

    let (one, split) = (dir.path().join("one"), dir.path().join("units"));
    let units_job = job(30);
    let probe = ffprobe::run(
        &units_job.video,
        &source,
        Container::IsoBmff,
        &dir.path().join("ffprobe.log"),
        &Default::default(),
    )
    .unwrap();
    let plan = units::plan(&units_job, &probe).expect("planned as units");
    assert_eq!(plan.len(), 5, "{plan:?}");
    assert!(units::plan(&job(600), &probe).is_none());
    let out_units = process(&units_job, &source, &split);
    let out_one = process(&job(600), &source, &one);

    // The same files.
    let (names, names_one) = (files(&split), files(&one));
    assert_eq!(names, names_one);
    assert_eq!(
        out_units
            .files
            .iter()
            .map(|f| f.name.clone())
            .collect::<std::collections::BTreeSet<_>>(),
        out_one
            .files
            .iter()
            .map(|f| f.name.clone())
            .collect::<std::collections::BTreeSet<_>>()
    );

    // Every rung's MP4: the source's frames, presented in strictly increasing order, one
    // audio track without a gap.
    let rungs = ["480p", "234p"];
    for r in rungs {
        let mp4 = split.join(format!("mp4/{r}.mp4"));
        assert_eq!(decodes(&mp4), source_frames, "{r}");
        let t = presentation_times(&mp4, "v:0");
        assert!(t.windows(2).all(|w| w[1] > w[0]), "{r}: not increasing");
        let streams = run(Command::new("ffprobe")
            .args(["-v", "error", "-show_entries", "stream=codec_type"])
            .args(["-of", "csv=p=0"])
            .arg(&mp4));
        assert_eq!(streams.lines().filter(|l| *l == "audio").count(), 1);
        let a = presentation_times(&mp4, "a:0");
        let gap = a.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        assert!(gap < 0.03, "{r}: a {gap} s gap in the audio");
        assert!((a.last().unwrap() - t.last().unwrap()).abs() < 0.1);
    }

    // The segments: a keyframe first, at the same time in every rung, each segment's frames
    // after the last one's.
    let stream = split.join("hls");
    let master = hls(&stream.join("master.m3u8"));
    let variants = master["variants"].as_array().unwrap();
    assert_eq!(variants.len(), rungs.len());
    let mut starts: Vec<Vec<f64>> = Vec::new();
    for v in variants {
        let uri = v["uri"].as_str().unwrap();
        let rung = uri.split('/').next().unwrap();
        let segments = v["playlist"]["segments"].as_array().unwrap();
        assert_eq!(segments.len(), 15, "{uri}");
        let mut last = f64::MIN;
        let mut rung_starts = Vec::new();
        for s in segments {
            let seg = playable(
                &stream.join(rung),
                "init.mp4",
                s["uri"].as_str().unwrap(),
                dir.path(),
            );
            let (pts, key) = first_packet(&seg);
            assert!(key, "{uri} {s}: no keyframe first");
            let t = presentation_times(&seg, "v:0");
            assert!(
                t.windows(2).all(|w| w[1] > w[0]) && t[0] > last,
                "{uri} {s}"
            );
            last = *t.last().unwrap();
            rung_starts.push(pts);
        }
        starts.push(rung_starts);
    }
    assert!(starts.windows(2).all(|w| w[0] == w[1]), "{starts:?}");
    // The audio, encoded once over the whole video: as in the one run.
    let audio = |d: &Path| std::fs::read_to_string(d.join("hls/audio/index.m3u8")).unwrap();
    assert_eq!(audio(&split), audio(&one));
    let audio_segments = master["audio"][0]["playlist"]["segments"]
        .as_array()
        .unwrap()
        .len();

    // The MPD: XML with a timeline entry per segment for each representation, and ffprobe
    // opens it.
    let reps: Vec<String> = mpd_representations(&stream.join("manifest.mpd"))
        .iter()
        .map(|r| format!("{} {}", r[0], r[4]))
        .collect();
    let audio_rep = format!("audio {audio_segments}");
    assert_eq!(reps, ["480p 15", "234p 15", &audio_rep]);
    let streams = run(Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "stream=codec_type,height"])
        .args(["-of", "csv=p=0"])
        .arg(stream.join("manifest.mpd")));
    let heights: std::collections::BTreeSet<&str> = streams
        .lines()
        .filter_map(|l| l.strip_prefix("video,"))
        .collect();
    assert_eq!(heights.len(), rungs.len(), "{streams}");

    // Against the one run: bytes, SSIM over the video and at each unit edge.
    let (b, b_one) = (bytes(&split, &names), bytes(&one, &names));
    let ratio = b as f64 / b_one as f64;
    assert!((0.97..=1.03).contains(&ratio), "{b} vs {b_one} bytes");
    let top = |d: &PathBuf| d.join("mp4/480p.mp4");
    let s = ssim_per_frame(&top(&split), &source, dir.path());
    let s_one = ssim_per_frame(&top(&one), &source, dir.path());
    assert_eq!((s.len(), s_one.len()), (1800, 1800));
    let (m, m_one) = (mean(&s), mean(&s_one));
    assert!((m - m_one).abs() <= 0.002, "mean SSIM {m} vs {m_one}");
    for edge in (1..plan.len() as u64).map(|u| (u * UNIT_FRAMES) as usize) {
        for f in [edge - 1, edge] {
            assert!(
                (s[f] - s_one[f]).abs() <= 0.01,
                "frame {f}: SSIM {} vs {}",
                s[f],
                s_one[f]
            );
        }
    }
    eprintln!(
        "units: {b} bytes ({ratio:.4} of one run), mean SSIM {m:.5} vs {m_one:.5}, \
         poster {:?} vs {:?}",
        out_units
            .analysis
            .as_ref()
            .and_then(|a| a.video())
            .map(|v| v.poster_time_ms),
        out_one
            .analysis
            .as_ref()
            .and_then(|a| a.video())
            .map(|v| v.poster_time_ms),
    );
}

/// The keys of a response's outputs, relative to the media's folder.
fn output_names(
    r: &media_worker::contract::OptimizeResponse,
) -> std::collections::BTreeSet<String> {
    r.outputs
        .iter()
        .map(|o| o.key.splitn(4, '/').nth(3).unwrap().to_owned())
        .collect()
}

/// A stack with a unit topic (6 partitions), a progress topic, and a `secs`-long 640x360
/// camera-like video uploaded as `long.mp4` (the folder it was made in, and its path): the
/// workers' settings (progress events on), a pool of one each, in consumer group `group`.
async fn long_video_on_a_fleet(
    group: &str,
    secs: u32,
) -> (
    common::Stack,
    tempfile::TempDir,
    PathBuf,
    std::collections::HashMap<String, String>,
) {
    let stack = common::Stack::start(3).await;
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, 6);
    let progress_topic = stack.own("media.optimize.progress");
    stack.broker.create_topic(&progress_topic, 1);
    let dir = tempfile::tempdir().unwrap();
    let source = common::synthetic::camera_like_video(dir.path(), secs, 640, 360);
    stack.upload_file("long.mp4", &source).await;
    let mut env = stack.worker_env(group);
    env.insert("KAFKA_UNIT_TOPIC".into(), unit_topic);
    env.insert("KAFKA_PROGRESS_TOPIC".into(), progress_topic);
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    // What is tested is who encodes which unit, not how well: the fastest preset.
    env.insert("FFMPEG_PRESET".into(), "ultrafast".into());
    (stack, dir, source, env)
}

/// One worker (a pool of one) on [`long_video_on_a_fleet`]'s stack, videos past 20 s planned
/// as units, with `extra` settings; and the video's request under `streaming`, keyed `group`,
/// not sent yet.
async fn one_worker_on_a_long_video(
    group: &str,
    secs: u32,
    extra: &[(&str, &str)],
) -> (
    common::Stack,
    tempfile::TempDir,
    std::collections::HashMap<String, String>,
    common::Worker,
    media_worker::contract::OptimizeRequest,
) {
    let (stack, dir, _source, mut env) = long_video_on_a_fleet(group, secs).await;
    let units_after = ("MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS", "20");
    for (k, v) in std::iter::once(&units_after).chain(extra) {
        env.insert((*k).into(), (*v).into());
    }
    let worker = common::Worker::start(&env);
    worker.ready().await;
    let mut req = common::request(group, "long.mp4");
    req.profile = Some("streaming".into());
    (stack, dir, env, worker, req)
}

/// The source bytes the workers whose `logs` these are downloaded: whole sources and units'
/// parts of one.
fn source_bytes(logs: &[String]) -> u64 {
    logs.iter()
        .flat_map(|l| l.lines())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| {
            let f = &l["fields"];
            match f["message"].as_str()? {
                "part of the source downloaded" | "the source's header and index downloaded" => {
                    f["read"].as_u64()
                }
                "source downloaded" => f["bytes"].as_u64(),
                _ => None,
            }
        })
        .sum()
}

/// The next response (within 10 minutes), completed.
fn completed(responses: &common::broker::Responses) -> common::broker::Received {
    completed_within(responses, Duration::from_secs(600))
}

/// The next response, within `limit`, completed.
fn completed_within(
    responses: &common::broker::Responses,
    limit: Duration,
) -> common::broker::Received {
    let r = responses.next(limit).expect("a response");
    assert_eq!(
        r.body.status,
        media_worker::contract::Status::Completed,
        "{:?}",
        r.body.error
    );
    r
}

/// The keys under `prefix` in the output bucket once `done` says so of them (within a minute).
async fn keys_once(
    stack: &common::Stack,
    prefix: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = stack
            .s3c
            .list_objects_v2()
            .bucket(common::OUTPUT_BUCKET)
            .prefix(prefix)
            .send()
            .await
            .unwrap();
        let keys: Vec<String> = listed
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_owned))
            .collect();
        if done(&keys) {
            return keys;
        }
        assert!(std::time::Instant::now() < deadline, "{keys:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The first of `workers` whose log says `text`, once one does (within 5 minutes).
async fn first_to_log(workers: &[common::Worker], text: &str) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(i) = workers.iter().position(|w| w.log().contains(text)) {
            return i;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no worker logged {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Through the fleet: three workers on Apache Kafka and s3s-fs, a 2-minute video as units on
/// the unit topic; the worker that took the request killed (`kill -9`) once it planned.
/// Photos sent while the units are queued are answered before the video; its units are
/// encoded by both other workers (their logs say so), each once (the killed worker's unit at
/// most twice), each landing a progress event of the request; the request gets one response, completed, whose outputs are those
/// `media-worker process` makes of the same file, and its stream plays from S3 (every segment
/// fetched and decoded).
#[tokio::test(flavor = "multi_thread")]
async fn a_long_video_is_encoded_by_the_fleet_and_answered_once() {
    let (stack, dir, source, mut env) = long_video_on_a_fleet("units", 120).await;
    // Units past a minute (the default is two), so that a 2-minute video is one.
    env.insert(
        "MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS".into(),
        "60".into(),
    );
    let progress_topic = env["KAFKA_PROGRESS_TOPIC"].clone();
    let mut workers = common::Worker::fleet(&env, 3).await;
    let responses = stack.responses();
    let mut req = common::request("long", "long.mp4");
    req.profile = Some("streaming".into());
    stack.send(&req).await;
    // Once its units are queued, image requests: each answered before the video.
    let planner = first_to_log(&workers, "video planned as units").await;
    // The worker that took the request dies as it hands the plan on (its tasks sent or not,
    // its offset committed or not), and with whatever unit it has begun.
    workers[planner].kill9();
    stack.upload_corpus("pillow_flower.jpg").await;
    let images: Vec<_> = (0..6)
        .map(|i| common::request(&format!("photo-{i}"), "pillow_flower.jpg"))
        .collect();
    stack.send_all(&images).await;
    // A photo the killed worker answered may be answered again (replayed: at least once).
    let mut photos = std::collections::BTreeSet::new();
    let r = loop {
        let r = responses
            .next(Duration::from_secs(600))
            .expect("a response");
        if r.key == "long" {
            break r;
        }
        assert_eq!(r.body.status, media_worker::contract::Status::Completed);
        photos.insert(r.key);
    };
    // A photo on a partition of the killed worker waits for the group to notice it gone (the
    // session timeout), not for the video: it may come after, and comes.
    let dead = request_partitions(&workers[planner].log());
    for late in images.iter().filter(|i| !photos.contains(&i.media_id)) {
        let again = responses
            .next(Duration::from_secs(300))
            .expect("a late photo");
        assert_eq!(again.key, late.media_id, "after the video");
        let finished = workers
            .iter()
            .flat_map(|w| logged(&w.log(), "job finished"))
            .find(|f| f["media_id"] == late.media_id.as_str())
            .expect("answered by a worker");
        let partition = finished["partition"].as_i64().unwrap();
        assert!(
            dead.contains(&partition),
            "{} (partition {partition}) answered after the video; the killed worker had {dead:?}",
            late.media_id
        );
    }
    assert_eq!(
        r.body.status,
        media_worker::contract::Status::Completed,
        "{:?}",
        r.body.error
    );
    // Every task was taken: the plan's units and its stitch.
    let landed: Vec<usize> = workers
        .iter()
        .map(|w| w.log().matches("unit landed").count())
        .collect();
    // Each unit once, and at most the one the killed worker had begun (a pool of one) again.
    let plan_units = 120_u32.div_ceil(8) as usize;
    let encoded: usize = landed.iter().sum();
    assert!(
        (plan_units..=plan_units + 1).contains(&encoded),
        "{encoded} units encoded for {plan_units}: {landed:?}"
    );
    let alive = |i: &usize| *i != planner;
    assert!(
        (0..3).filter(alive).filter(|&i| landed[i] > 0).count() >= 2,
        "units encoded by one worker only: {landed:?}"
    );
    // One answer for the video (the photos' redeliveries aside).
    while let Some(again) = responses.next(Duration::from_secs(5)) {
        assert_ne!(again.key, "long", "a second response to the video");
    }
    // A progress event per landed unit, whichever worker landed it, up to every unit landed.
    let events: Vec<f64> = stack
        .records(&progress_topic)
        .into_iter()
        .filter(|(key, e, _)| key == "long" && e["stage"] == "transform")
        .map(|(_, e, _)| e["progress"].as_f64().unwrap())
        .collect();
    assert!(events.len() >= plan_units, "{events:?}");
    let top = events.iter().copied().fold(0.0, f64::max);
    assert!((top - 0.95).abs() < 1e-3, "{events:?}");

    // Once answered, the pieces beside the plan are deleted (the plan and records stay).
    let keys = keys_once(&stack, "user-1/videos/long/units/", |keys| {
        !keys.iter().any(|k| k.contains("/pieces/"))
    })
    .await;
    assert!(keys.iter().any(|k| k.ends_with("/plan.json")), "{keys:?}");

    // The same outputs as one run of `media-worker process` over the file.
    let local = dir.path().join("local");
    let out = Command::new(env!("CARGO_BIN_EXE_media-worker"))
        .args(["process", "--profile", "streaming", "--out"])
        .arg(&local)
        .arg(&source)
        .env("MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS", "600")
        .env("FFMPEG_PRESET", "ultrafast")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let one: media_worker::contract::OptimizeResponse =
        serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(output_names(&r.body), output_names(&one));

    // The stream as a player fetches it from S3: every playlist and segment there, decoded.
    let master = r
        .body
        .outputs
        .iter()
        .find(|o| o.key.ends_with("hls/master.m3u8"))
        .unwrap();
    let fetched = dir.path().join("fetched");
    let n = stack.fetch_hls(&master.key, &fetched).await;
    assert!(n > 3 * plan_units, "{n} objects");
    let playlist = hls(&fetched.join("master.m3u8"));
    for v in playlist["variants"].as_array().unwrap() {
        let uri = v["uri"].as_str().unwrap();
        let rung = uri.split('/').next().unwrap();
        for s in v["playlist"]["segments"].as_array().unwrap() {
            let seg = playable(
                &fetched.join(rung),
                "init.mp4",
                s["uri"].as_str().unwrap(),
                dir.path(),
            );
            assert!(decodes(&seg) > 0);
        }
    }
}

/// A container whose duration lies (an upload cut short, its header promising 150 s): the
/// units past the cut find no frame, and the video is answered `corrupt_input` with where it
/// ends, not encoded as a stream with a hole.
#[test]
fn a_video_shorter_than_its_header_says_is_answered_with_where_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.mp4");
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=320x180:rate=30:duration=150")
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-g", "60"])
        .args(["-movflags", "+faststart"])
        .arg(&whole));
    // The moov (first) says 150 s; the samples stop 40 % in.
    let bytes = std::fs::read(&whole).unwrap();
    let cut = dir.path().join("cut.mp4");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 5]).unwrap();
    let job = job(60);
    let f = media::process(
        &job,
        &cut,
        &dir.path().join("out"),
        &mut Control::new(&mut |_| {}),
    )
    .expect_err("a video with a hole");
    assert!(
        matches!(f.error, media::MediaError::Corrupt(_)),
        "{:?}",
        f.error
    );
    let message = f.error.to_string();
    assert!(message.contains("corrupt input: unit "), "{message}");
    let from: f64 = message
        .split("(from ")
        .nth(1)
        .unwrap()
        .split(" s)")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Where the samples stop, within a unit (8 s).
    assert!((48.0..=64.0).contains(&from), "{message}");
    eprintln!("{message}");
}

/// A rolling restart of the whole fleet while a 3-minute video's units are encoded: each
/// worker in turn stopped (SIGTERM: it finishes its unit within the drain) and replaced. The
/// request is answered once, completed, and no unit is encoded twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_mid_video_encodes_no_unit_twice() {
    let (stack, _dir, source, env) = long_video_on_a_fleet("rolling", 180).await;
    let start = |name: String| {
        let mut env = env.clone();
        env.insert("WORKER_ID".into(), name);
        common::Worker::start(&env)
    };
    let mut workers: Vec<common::Worker> = (0..3).map(|i| start(format!("worker-{i}"))).collect();
    for w in &workers {
        w.ready().await;
    }
    let responses = stack.responses();
    let mut req = common::request("long", "long.mp4");
    req.profile = Some("streaming".into());
    stack.send(&req).await;
    // The audio first: its task reads every audio packet (5144 ranged reads of this source,
    // about 40 s in a debug build), longer than the drain, which would abandon it to be made
    // again elsewhere, as any job longer than the drain. This test is about the units.
    first_to_log(&workers, "the video's audio landed").await;
    first_to_log(&workers, "unit landed").await;
    // The logs of the workers stopped, kept (a replaced worker's folder goes with it).
    let mut logs = Vec::new();
    for (i, w) in workers.iter_mut().enumerate() {
        w.sigterm();
        let status = w.exited(Duration::from_secs(40)).await;
        assert!(status.success(), "worker {i}: {status}");
        logs.push(w.log());
        *w = start(format!("worker-{i}-replaced"));
        w.ready().await;
    }
    let r = completed(&responses);
    assert_eq!(r.key, "long");
    assert!(
        responses.next(Duration::from_secs(5)).is_none(),
        "a second response"
    );
    logs.extend(workers.iter().map(|w| w.log()));
    let landed: Vec<usize> = logs
        .iter()
        .map(|l| l.matches("unit landed").count())
        .collect();
    assert_eq!(landed.iter().sum::<usize>(), 180 / 8 + 1, "{landed:?}");
    // What the fleet downloaded of the source: the request its header and index, then the
    // audio and the first half second; each unit its index, first half second and its video,
    // from the keyframe before its pre-roll (x264's default GOP here, 8.3 s, on 8 s units).
    // Every unit reading the whole file was 24x; the request reading it whole, 3.2x.
    let size = std::fs::metadata(&source).unwrap().len();
    let read = source_bytes(&logs);
    eprintln!(
        "the fleet read {read} bytes of a {size}-byte source ({:.2}x)",
        read as f64 / size as f64
    );
    assert!(
        read <= 2 * size,
        "{read} bytes read of a {size}-byte source"
    );
}

/// The source replaced (a new ETag) while its units are encoded: the request is answered
/// `source_not_found` ("replaced"), never with a stream of two versions; the worker stays
/// ready, and the same request sent again is done from the new version.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_replaced_mid_video_is_never_mixed() {
    let (stack, dir, _source, env) = long_video_on_a_fleet("replaced", 180).await;
    let worker = common::Worker::start(&env);
    worker.ready().await;
    let responses = stack.responses();
    let mut req = common::request("long", "long.mp4");
    req.profile = Some("streaming".into());
    stack.send(&req).await;
    first_to_log(std::slice::from_ref(&worker), "unit landed").await;
    // Shorter than the unit threshold: done in one run once sent again.
    let other = common::synthetic::camera_like_video(dir.path(), 20, 640, 360);
    stack.upload_file("long.mp4", &other).await;
    let r = responses
        .next(Duration::from_secs(600))
        .expect("a response");
    let e = r.body.error.expect("failed");
    assert_eq!(e.code, media_worker::contract::ErrorCode::SourceNotFound);
    assert!(e.message.contains("replaced"), "{}", e.message);
    // The early stream of the first version is no longer playable once it is answered (no
    // playlist left), and nothing was written where the finished video goes.
    keys_once(&stack, "user-1/videos/long/", |keys| {
        keys.iter()
            .all(|k| k.contains("/units/") && !(k.contains("/early/") && k.ends_with(".m3u8")))
    })
    .await;
    worker.ready().await;
    stack.send(&req).await;
    let r = completed(&responses);
    let a = r.body.analysis.as_ref().and_then(|a| a.video()).unwrap();
    let duration = a.duration_ms.unwrap();
    assert!(
        duration.abs_diff(20_000) < 100,
        "{duration} ms: not the new version's"
    );
}

/// How many times a unit that reads its part of the source (`media::video::reads`) and whose
/// sandbox child crashes on every try is run before its failure is its answer: twice on its
/// part (a crashed try is tried once more in a fresh child, `sandbox::pool`), then, the part
/// suspected (`job::runner`), twice on the whole file.
const TRIES_OF_A_CRASHING_UNIT: usize = 4;

/// Whether unit `index` of the plan under `prefix` in the output bucket reads its part of the
/// source (byte ranges) rather than the whole file, per the stored plan.
async fn reads_its_part(stack: &common::Stack, prefix: &str, index: u64) -> bool {
    let keys = keys_once(stack, prefix, |keys| {
        keys.iter().any(|k| k.ends_with("/plan.json"))
    })
    .await;
    let key = keys.iter().find(|k| k.ends_with("/plan.json")).unwrap();
    let (bytes, _, _) = stack.get(common::OUTPUT_BUCKET, key).await;
    let plan: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let unit = &plan["units"][index as usize];
    assert_eq!(unit["index"].as_u64(), Some(index), "{plan}");
    unit["reads"].as_array().is_some_and(|r| !r.is_empty())
}

/// The index of the unit task `worker` has in hand (its key on `/jobs`: `{plan}/{index}`), its
/// only one.
fn unit_at_work(worker: &common::Worker) -> u64 {
    let jobs = worker.jobs();
    let units: Vec<u64> = jobs
        .iter()
        .filter_map(|j| j["request_id"].as_str()?.split_once('/')?.1.parse().ok())
        .collect();
    assert_eq!(units.len(), 1, "{jobs:?}");
    units[0]
}

/// A unit numbered `from` or more that `worker` (a pool of one: one part at a time, the last
/// it took) has in hand, with its job process at work (0.3 s of CPU, its ffmpeg's: well into
/// the unit, well before its end): the unit's index, that process, and the sandbox's CPU
/// before it.
async fn unit_in_hand(
    worker: &common::Worker,
    from: u64,
) -> (u64, i32, std::collections::BTreeMap<i32, u64>) {
    let mut seen = 0;
    let unit = loop {
        let taken = common::wait_until("a part taken", common::MINUTE, || {
            let taken = logged(&worker.log(), "part taken");
            (taken.len() > seen).then_some(taken)
        })
        .await;
        seen = taken.len();
        let part = taken.last().unwrap()["part"].as_str().unwrap().to_owned();
        if let Some(i) = part
            .strip_prefix("unit ")
            .map(|i| i.parse::<u64>().unwrap())
            && i >= from
        {
            break i;
        }
    };
    let idle = common::sandbox_ticks(worker);
    let pid = common::busy_sandbox(worker, &idle, 30);
    assert_eq!(unit_at_work(worker), unit);
    (unit, pid, idle)
}

/// The fields of each line of a worker's JSON `log` whose message is `message`.
/// The request topic's partitions a worker held last, from its log.
fn request_partitions(log: &str) -> std::collections::BTreeSet<i64> {
    let mut held = std::collections::BTreeSet::new();
    let on_requests = |f: &serde_json::Value| {
        f["topic"]
            .as_str()
            .is_some_and(|t| t.starts_with("media.optimize.request"))
    };
    for l in log.lines() {
        let Ok(l) = serde_json::from_str::<serde_json::Value>(l) else {
            continue;
        };
        let f = &l["fields"];
        let p = f["partition"].as_i64();
        match (f["message"].as_str(), p) {
            (Some("partition assigned"), Some(p)) if on_requests(f) => held.insert(p),
            (Some("partition revoked"), Some(p)) if on_requests(f) => held.remove(&p),
            _ => false,
        };
    }
    held
}

/// A unit whose sandbox child is killed (SIGSEGV) on every try, on a one-worker fleet: after
/// its tries ([`TRIES_OF_A_CRASHING_UNIT`]) the request is answered once, `media_crashed`,
/// naming the signal and where in the video the unit starts; the other units are skipped, not
/// encoded, and every task of the unit topic is taken (none left behind); nothing is written
/// where the finished video goes and no early playlist stays; the worker stays ready and clean,
/// and answers the next job. The request sent again is done, and keeps what landed.
#[tokio::test(flavor = "multi_thread")]
async fn a_unit_that_keeps_crashing_is_answered_after_its_retries() {
    use media_worker::contract::{ErrorCode, Stage, Status};
    let (stack, _dir, env, worker, req) = one_worker_on_a_long_video("crashing", 40, &[]).await;
    let unit_topic = env["KAFKA_UNIT_TOPIC"].clone();
    let responses = stack.responses();
    stack.send(&req).await;
    let fleet = std::slice::from_ref(&worker);
    first_to_log(fleet, "video planned as units").await;
    // Past unit 0, which starts at 0 s, which says little of where a unit is.
    let (unit, mut pid, idle) = unit_in_hand(&worker, 1).await;
    // Every unit of this source reads its part (ranges under 80 % of the file).
    let ranged = reads_its_part(&stack, "user-1/videos/crashing/units/", unit).await;
    assert!(ranged, "unit {unit} reads the whole file");
    for t in 0..TRIES_OF_A_CRASHING_UNIT {
        if t > 0 {
            pid = common::busy_sandbox(&worker, &idle, 30);
            assert_eq!(unit_at_work(&worker), unit, "try {t}");
        }
        // SAFETY: a signal to a process of this test's worker.
        unsafe { libc::kill(pid, libc::SIGSEGV) };
        assert!(
            common::exits_within(pid, Duration::from_secs(5)),
            "{pid} survived"
        );
    }
    let r = responses.next(2 * common::MINUTE).expect("a response");
    assert_eq!(r.key, "crashing");
    assert_eq!(r.body.status, Status::Failed, "{:?}", r.body);
    let e = r.body.error.expect("failed");
    assert_eq!(e.code, ErrorCode::MediaCrashed, "{}", e.message);
    assert!(e.message.contains("SIGSEGV") && !e.retryable, "{e:?}");
    assert!(matches!(e.stage, Stage::Probe | Stage::Transform), "{e:?}");

    // Every task of the unit topic (the units and the stitch) taken and committed: none is
    // left to be encoded or to answer again.
    common::wait_until("every unit task taken", common::MINUTE, || {
        (stack.uncommitted_units(&unit_topic, "crashing", 6) == 0).then_some(())
    })
    .await;
    // Each try died; the unit failed once, and no unit but those landed before it was
    // encoded.
    let log = worker.log();
    let planned = logged(&log, "video planned as units: sending them to the fleet");
    assert_eq!(planned.len(), 1, "{planned:?}");
    let units = planned[0]["units"].as_u64().unwrap() as usize;
    assert_eq!(units, 5, "{planned:?}");
    let died = logged(&log, "sandbox job process died").len();
    assert_eq!(died, TRIES_OF_A_CRASHING_UNIT);
    assert_eq!(
        worker.metric("media_worker_sandbox_deaths_total "),
        Some(TRIES_OF_A_CRASHING_UNIT as f64)
    );
    let whole = "the part failed on its bytes of the source: again on the whole file";
    assert_eq!(logged(&log, whole).len(), 1);
    let failed = logged(&log, "part failed for good");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["part"], format!("unit {unit}"), "{failed:?}");
    // Each unit is landed (taken before it), failed, or dropped (taken after the failure:
    // before the answer for it, or after it as answered).
    let landed = logged(&log, "unit landed").len();
    let of_units =
        |f: &serde_json::Value| f["part"].as_str().is_some_and(|p| p.starts_with("unit"));
    let skipped = logged(&log, "another part failed: not made")
        .iter()
        .filter(|f| of_units(f))
        .count()
        + logged(&log, "already answered")
            .iter()
            .filter(|f| {
                let task = f["task"].as_str().unwrap_or_default();
                task.rsplit_once('/')
                    .is_some_and(|(_, i)| i.parse::<u32>().is_ok())
            })
            .count();
    assert_eq!(
        landed + 1 + skipped,
        units,
        "{landed} landed, {skipped} dropped"
    );
    // Nothing where the finished video goes, and no early playlist left to play.
    keys_once(&stack, "user-1/videos/crashing/", |keys| {
        keys.iter()
            .all(|k| k.contains("/units/") && !(k.contains("/early/") && k.ends_with(".m3u8")))
    })
    .await;

    // The worker ready, and the next job answered: the next response (no second one for the
    // video before it).
    worker.ready().await;
    stack.upload_corpus("pillow_flower.jpg").await;
    stack
        .send(&common::request("after", "pillow_flower.jpg"))
        .await;
    assert_eq!(completed(&responses).key, "after");
    // The job leaves the worker's list once its scratch is gone, just after its response.
    common::wait_until("no job at work", common::MINUTE, || {
        worker.jobs().is_empty().then_some(())
    })
    .await;
    // Two idle children: the one permit's and the parts lane's.
    common::clean_and_well(&worker, 2);

    // Sent again (its unit no longer killed), the video is done: the failure forgotten, the
    // parts landed before it kept (each unit and the audio made once in all), the failed unit
    // and those skipped made now.
    stack.send(&req).await;
    assert_eq!(completed(&responses).key, "crashing");
    let log = worker.log();
    assert_eq!(logged(&log, "unit landed").len(), units);
    assert_eq!(logged(&log, "the video's audio landed").len(), 1);

    // Where in the video the failing unit starts (units of 2 segments of 4 s), as a unit's
    // other failures say it (`media::video::units`). Checked last: the rest holds without it.
    let at = format!("unit {unit} (from {:.1} s)", unit as f64 * 8.0);
    assert!(
        e.message.contains(&at),
        "{:?} does not say {at:?}",
        e.message
    );
}

/// A one-permit worker runs a long video's unit on a lane of its own beside its permit
/// (`Settings::parts_lane`), at a lower CPU priority: a photo sent while its unit is stalled
/// (SIGSTOP, a unit as long as one likes) is answered. On the worker's one permit, the photo
/// would wait for the unit. Let go, the unit lands and the video completes.
#[tokio::test(flavor = "multi_thread")]
async fn a_photo_does_not_wait_for_a_one_permit_workers_unit() {
    let (stack, _dir, _env, worker, req) = one_worker_on_a_long_video("lane", 40, &[]).await;
    let responses = stack.responses();
    stack.send(&req).await;
    let fleet = std::slice::from_ref(&worker);
    let (unit, pid, _) = unit_in_hand(&worker, 0).await;
    let stalled: Vec<i32> = std::iter::once(pid)
        .chain(common::descendants_of(pid))
        .collect();
    // None once the process is gone (an ffprobe ends on its own).
    let nice = |p: i32| -> Option<i64> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let field = stat.rsplit(')').next()?.split_whitespace().nth(16)?;
        field.parse().ok()
    };
    let niced = Some((nice(worker.pid()).unwrap() + 10).min(19));
    assert_eq!(nice(pid), niced, "the unit's job process");
    for &p in &stalled {
        // The unit's job process and its ffmpeg yield: 10 more (`job::runner::PART_NICE`).
        if let Some(n) = nice(p) {
            assert_eq!(Some(n), niced, "{}", common::cmdline(p));
        }
        // SAFETY: a signal to a process of this test's worker.
        unsafe { libc::kill(p, libc::SIGSTOP) };
    }
    stack.upload_corpus("pillow_flower.jpg").await;
    stack
        .send(&common::request("photo", "pillow_flower.jpg"))
        .await;
    // Answered beside the stalled unit.
    let photo = completed_within(&responses, common::MINUTE);
    assert_eq!(photo.key, "photo");
    assert_eq!(unit_at_work(&worker), unit, "the unit still in hand");
    for &p in &stalled {
        // SAFETY: as above.
        unsafe { libc::kill(p, libc::SIGCONT) };
    }
    assert_eq!(completed(&responses).key, "lane");
    // After the response, the stitch marks the plan answered (through a file in the scratch)
    // and deletes the pieces, then ends.
    first_to_log(fleet, "pieces deleted").await;
    common::wait_for("the stitch's scratch removed", common::MINUTE, || {
        let left = std::fs::read_dir(worker.scratch_dir()).ok()?.count();
        (left == 0).then_some(())
    });
    common::clean_and_well(&worker, 2);
}

/// A video's first unit goes before the units another video sent earlier to the same
/// partition (`kafka::ahead`): one worker (one permit), a unit topic of one partition, a
/// 160 s video (20 units) under way, then a 64 s one: the second's first unit (what makes it
/// playable) is taken while the first still has units waiting, rather than after all of them
/// (a partition is a queue: taken in order, it waited for the first video's last unit and its
/// stitch). Both are answered once, completed.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_videos_first_unit_goes_before_the_first_videos_queued_units() {
    let stack = common::Stack::start(1).await;
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, 1);
    let dir = tempfile::tempdir().unwrap();
    for (key, secs) in [("first.mp4", 160), ("second.mp4", 64)] {
        let source = common::synthetic::camera_like_video(dir.path(), secs, 320, 180);
        let named = dir.path().join(key);
        std::fs::rename(&source, &named).unwrap();
        stack.upload_file(key, &named).await;
    }
    let mut env = stack.worker_env("ahead");
    for (k, v) in [
        ("KAFKA_UNIT_TOPIC", unit_topic.as_str()),
        ("WORKER_POOL_SIZE", "1"),
        ("FFMPEG_PRESET", "ultrafast"),
        ("MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS", "20"),
    ] {
        env.insert(k.into(), v.into());
    }
    let worker = common::Worker::start(&env);
    worker.ready().await;
    let responses = stack.responses();
    let request = |id: &str, key: &str| {
        let mut r = common::request(id, key);
        r.profile = Some("streaming".into());
        r
    };
    stack.send(&request("first", "first.mp4")).await;
    // Every task of the first video is in the partition once its plan sent them: its second
    // unit taken.
    common::wait_until(
        "the first video's second unit taken",
        2 * common::MINUTE,
        || {
            logged(&worker.log(), "part taken")
                .iter()
                .any(|f| f["part"] == "unit 1")
                .then_some(())
        },
    )
    .await;
    stack.send(&request("second", "second.mp4")).await;
    let mut answered = vec![completed(&responses).key, completed(&responses).key];
    answered.sort();
    assert_eq!(answered, ["first", "second"]);
    assert!(
        responses.next(Duration::from_secs(3)).is_none(),
        "one answer each"
    );
    let taken: Vec<(String, String)> = logged(&worker.log(), "part taken")
        .iter()
        .map(|f| {
            (
                f["plan"].as_str().unwrap().to_owned(),
                f["part"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let first_plan = taken[0].0.clone();
    let second_zero = taken
        .iter()
        .position(|(plan, part)| *plan != first_plan && part == "unit 0")
        .unwrap_or_else(|| panic!("the second video's unit 0 never taken: {taken:?}"));
    let first_units_after = taken[second_zero..]
        .iter()
        .filter(|(plan, part)| *plan == first_plan && part.starts_with("unit "))
        .count();
    assert!(
        first_units_after >= 3,
        "the first video's units taken after the second's first: {first_units_after} ({taken:?})"
    );
}

/// Playable before it is done (`early_playback`): once the first unit lands, the master
/// playlist names the lowest rung and the audio, the rung's playlist is an EVENT playlist
/// without an end whose every segment is in S3 and decodes, and the unit's progress event
/// names the master; when the video is answered, the same playlist is VOD with every segment
/// and the master the whole ladder.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_video_plays_before_it_is_done() {
    let early = [("MEDIA_WORKER_PROFILES__STREAMING__EARLY_PLAYBACK", "true")];
    let (stack, dir, env, _worker, req) = one_worker_on_a_long_video("early", 64, &early).await;
    let progress_topic = env["KAFKA_PROGRESS_TOPIC"].clone();
    let responses = stack.responses();
    let sent = std::time::SystemTime::now();
    stack.send(&req).await;

    // The part that makes it playable (the first unit, or the audio when it lands after)
    // says so in its progress event: the early master.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let event = loop {
        let playable = stack
            .records(&progress_topic)
            .into_iter()
            .find(|(key, e, _)| key == "early" && !e["playable"].is_null());
        if let Some((_, e, _)) = playable {
            break e;
        }
        assert!(std::time::Instant::now() < deadline, "never playable");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let master_key = event["playable"].as_str().unwrap().to_owned();
    assert!(
        master_key.starts_with("user-1/videos/early/units/")
            && master_key.ends_with("/early/hls/master.m3u8"),
        "{master_key}: beside the plan, not where the finished video goes"
    );
    let early = dir.path().join("early");
    stack.fetch_hls(&master_key, &early).await;
    let master = hls(&early.join("master.m3u8"));
    let variants = master["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 1, "{master}");
    assert_eq!(variants[0]["uri"], "234p/index.m3u8");
    assert_eq!(master["audio"].as_array().unwrap().len(), 1, "{master}");
    let growing = &variants[0]["playlist"];
    assert_eq!(growing["playlist_type"], "event", "{growing}");
    assert_eq!(growing["endlist"], false, "{growing}");
    let segments = growing["segments"].as_array().unwrap();
    assert!(
        (2..16).contains(&segments.len()),
        "{} segments",
        segments.len()
    );
    for s in segments {
        let seg = playable(
            &early.join("234p"),
            "init.mp4",
            s["uri"].as_str().unwrap(),
            dir.path(),
        );
        assert!(decodes(&seg) > 0);
    }

    completed(&responses);
    // Closed once answered: the same EVENT playlist over every segment, with its end.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let ended = loop {
        let closed_early = dir.path().join("closed");
        let _ = std::fs::remove_dir_all(&closed_early);
        stack.fetch_hls(&master_key, &closed_early).await;
        let p = hls(&closed_early.join("master.m3u8"))["variants"][0]["playlist"].clone();
        if p["endlist"] == true {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "never closed: {p}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(ended["playlist_type"], "event", "{ended}");
    assert_eq!(ended["segments"].as_array().unwrap().len(), 16);
    // The finished stream where the response says: VOD, the whole ladder.
    let done = dir.path().join("done");
    stack
        .fetch_hls("user-1/videos/early/hls/master.m3u8", &done)
        .await;
    let master = hls(&done.join("master.m3u8"));
    let variants = master["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2, "{master}");
    let closed = &variants[1]["playlist"];
    assert_eq!(closed["uri"], "234p/index.m3u8");
    assert_eq!(closed["playlist_type"], "vod", "{closed}");
    assert_eq!(closed["endlist"], true);
    assert_eq!(closed["segments"].as_array().unwrap().len(), 16);

    // One event made it playable; when, measured from the request.
    let playable: Vec<serde_json::Value> = stack
        .records(&progress_topic)
        .into_iter()
        .filter(|(key, e, _)| key == "early" && !e["playable"].is_null())
        .map(|(_, e, _)| e)
        .collect();
    assert_eq!(playable.len(), 1, "{playable:?}");
    let at = humantime::parse_rfc3339(event["at"].as_str().unwrap()).unwrap();
    eprintln!(
        "playable {:.1} s after the request, answered after {:.1} s",
        at.duration_since(sent).unwrap().as_secs_f64(),
        sent.elapsed().unwrap().as_secs_f64()
    );
}

/// The early stream plays on the audio's opening (its first seconds, a task of its own) before
/// the whole program's audio is done: two workers, request and unit topics of 4 partitions, a
/// 64 s video (an opening of 8 s). The worker holding the audio's partition is stopped (every
/// process of it) once it takes the whole audio, after the opening; the other lands the first
/// unit, and the stream is playable: the master names the audio, whose playlist is the
/// opening's (EVENT, no end, two segments, each decoding). Resumed, the video is answered and
/// the early audio playlist is the whole program's, ended, every segment decoding; the
/// opening is in no finished output.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_video_plays_on_its_audios_opening_before_the_whole_audio_is_done() {
    let stack = common::Stack::start(4).await;
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, 4);
    let progress_topic = stack.own("media.optimize.progress");
    stack.broker.create_topic(&progress_topic, 1);
    let dir = tempfile::tempdir().unwrap();
    let source = common::synthetic::camera_like_video(dir.path(), 64, 640, 360);
    stack.upload_file("long.mp4", &source).await;
    let mut env = stack.worker_env("opening");
    env.insert("KAFKA_UNIT_TOPIC".into(), unit_topic);
    env.insert("KAFKA_PROGRESS_TOPIC".into(), progress_topic.clone());
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    env.insert("FFMPEG_PRESET".into(), "ultrafast".into());
    for (k, v) in [
        ("MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS", "20"),
        ("MEDIA_WORKER_PROFILES__STREAMING__EARLY_PLAYBACK", "true"),
    ] {
        env.insert(k.into(), v.into());
    }
    let fleet = common::Worker::fleet(&env, 2).await;
    // The unit partitions settled: the audio's (the last) and unit 0's on two members.
    let holder = |p: i64| {
        fleet.iter().position(|w| {
            let held = logged(&w.log(), "partition assigned");
            let revoked = logged(&w.log(), "partition revoked");
            let of = |l: &Vec<serde_json::Value>| {
                l.iter()
                    .filter(|f| f["lane"] == "units" && f["partition"] == p)
                    .count()
            };
            of(&held) > of(&revoked)
        })
    };
    // A plan's unit 0 goes to its first partition `f` and its audio across (`3 - f`): every
    // such pair held apart, whatever the plan's `f`.
    let split = common::wait_until("the unit partitions held", 2 * common::MINUTE, || {
        let holders = (0..4).map(holder).collect::<Option<Vec<_>>>()?;
        let settled = fleet.iter().all(|w| holds_unit_partitions(w) > 0);
        settled.then_some(holders)
    })
    .await;
    for f in 0..2 {
        assert_ne!(
            split[f],
            split[3 - f],
            "partitions {f} and {} on one member",
            3 - f
        );
    }
    let responses = stack.responses();
    let mut req = common::request("opening", "long.mp4");
    req.profile = Some("streaming".into());
    stack.send(&req).await;

    // Stopped as it takes the whole audio: its opening landed before.
    let last = common::wait_until("the audio taken", 2 * common::MINUTE, || {
        fleet.iter().position(|w| {
            logged(&w.log(), "part taken")
                .iter()
                .any(|f| f["part"] == "the audio")
        })
    })
    .await;
    let audio_worker = &fleet[last];
    let mut stopped = vec![audio_worker.pid()];
    stopped.extend(common::descendants_of(audio_worker.pid()));
    for &pid in &stopped {
        // SAFETY: a signal to a process of this test's worker.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    assert_eq!(
        logged(&audio_worker.log(), "the audio's opening landed").len(),
        1
    );
    let event = common::wait_until("playable", 2 * common::MINUTE, || {
        stack
            .records(&progress_topic)
            .into_iter()
            .find(|(key, e, _)| key == "opening" && !e["playable"].is_null())
            .map(|(_, e, _)| e)
    })
    .await;
    let master_key = event["playable"].as_str().unwrap().to_owned();
    let early = dir.path().join("early");
    stack.fetch_hls(&master_key, &early).await;
    let master = hls(&early.join("master.m3u8"));
    let audio = master["audio"].as_array().unwrap();
    assert_eq!(audio.len(), 1, "{master}");
    let opening = &audio[0]["playlist"];
    assert_eq!(opening["playlist_type"], "event", "{opening}");
    assert_eq!(opening["endlist"], false, "{opening}");
    let segments = opening["segments"].as_array().unwrap();
    assert_eq!(segments.len(), 2, "{opening}");
    let audio_dir = early
        .join(audio[0]["uri"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_owned();
    let init = opening["init"].as_str().unwrap();
    for s in segments {
        let seg = playable(&audio_dir, init, s["uri"].as_str().unwrap(), dir.path());
        assert!(decodes(&seg) > 0);
    }
    assert!(logged(&audio_worker.log(), "the video's audio landed").is_empty());

    for &pid in &stopped {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    assert_eq!(completed(&responses).key, "opening");
    // The early audio playlist, the whole program's now: ended, every segment decoding.
    let deadline = std::time::Instant::now() + common::MINUTE;
    let (at, p) = loop {
        let at = dir.path().join("whole");
        let _ = std::fs::remove_dir_all(&at);
        stack.fetch_hls(&master_key, &at).await;
        let p = hls(&at.join("master.m3u8"))["audio"][0]["playlist"].clone();
        if p["endlist"] == true {
            break (at, p);
        }
        assert!(std::time::Instant::now() < deadline, "never the whole: {p}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(p["playlist_type"], "event", "{p}");
    // As many as the finished stream's audio (16 of 4 s, and the encoder's last frames).
    let done = dir.path().join("done");
    stack
        .fetch_hls("user-1/videos/opening/hls/master.m3u8", &done)
        .await;
    let finished = hls(&done.join("master.m3u8"))["audio"][0]["playlist"].clone();
    let segments = p["segments"].as_array().unwrap();
    assert_eq!(segments, finished["segments"].as_array().unwrap(), "{p}");
    assert!(segments.len() >= 16, "{p}");
    let audio_dir = at
        .join(audio[0]["uri"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_owned();
    for s in segments {
        let seg = playable(&audio_dir, init, s["uri"].as_str().unwrap(), dir.path());
        assert!(decodes(&seg) > 0);
    }
    // One playable event; the opening made once, nowhere in the finished outputs.
    let playable_events = stack
        .records(&progress_topic)
        .into_iter()
        .filter(|(key, e, _)| key == "opening" && !e["playable"].is_null())
        .count();
    assert_eq!(playable_events, 1);
    let openings: usize = fleet
        .iter()
        .map(|w| logged(&w.log(), "the audio's opening landed").len())
        .sum();
    assert_eq!(openings, 1);
    keys_once(&stack, "user-1/videos/opening/", |keys| {
        keys.iter()
            .any(|k| k.ends_with("/hls/master.m3u8") && !k.contains("/units/"))
    })
    .await;
}

/// The audio's opening (`Part::Opening`): the plan names it (a tenth of the program, in whole
/// segments) and the bytes it reads; made from those bytes alone (every other byte of the
/// file zero), it is the program's first seconds in whole segments named as the whole
/// program's audio names them, as long as those, each decoding.
#[test]
fn the_audios_opening_is_its_first_seconds_as_the_whole_programs_segments() {
    use media_worker::media::part::Part;
    let dir = tempfile::tempdir().unwrap();
    let source = common::synthetic::camera_like_video(dir.path(), 80, 320, 180);
    let mut planning = job(20);
    planning.part = Part::Plan;
    let planned = process(&planning, &source, &dir.path().join("plan"));
    let opening = planned.opening.expect("an opening");
    assert_eq!(opening.secs, 8);
    let bytes = std::fs::read(&source).unwrap();
    let read: u64 = opening.reads.iter().map(|[a, b]| b - a).sum();
    assert!(read * 4 < bytes.len() as u64, "{read} of {}", bytes.len());
    let mut sparse = vec![0u8; bytes.len()];
    for [a, b] in &opening.reads {
        let (a, b) = (*a as usize, *b as usize);
        sparse[a..b].copy_from_slice(&bytes[a..b]);
    }
    let part_of_it = dir.path().join("sparse.mp4");
    std::fs::write(&part_of_it, sparse).unwrap();

    let mut making = job(20);
    making.part = Part::Opening(opening.secs);
    let out_dir = dir.path().join("opening");
    let made = process(&making, &part_of_it, &out_dir);
    let mut whole_job = job(20);
    whole_job.part = Part::Audio;
    let whole_dir = dir.path().join("whole");
    let whole = process(&whole_job, &source, &whole_dir);
    let (track, of_all) = (&made.tracks[0], &whole.tracks[0]);
    assert_eq!(track.segments.len(), 2, "{track:?}");
    for (s, w) in track.segments.iter().zip(&of_all.segments) {
        assert!((s.seconds - w.seconds).abs() < 0.03, "{s:?} against {w:?}");
    }
    let names = |files: &[media_worker::media::ProducedFile]| {
        let mut n: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
        n.sort();
        n
    };
    let ours = names(&made.files);
    assert_eq!(ours.len(), 3, "{ours:?}");
    assert!(
        ours.iter().all(|n| names(&whole.files).contains(n)),
        "{ours:?}"
    );
    let init = made
        .files
        .iter()
        .find(|f| f.name.ends_with("init.mp4"))
        .unwrap();
    for f in made.files.iter().filter(|f| f.name.ends_with(".m4s")) {
        let dir = f.path.parent().unwrap();
        let seg = playable(
            dir,
            init.path.file_name().unwrap().to_str().unwrap(),
            f.path.file_name().unwrap().to_str().unwrap(),
            out_dir.as_path(),
        );
        assert!(decodes(&seg) > 0, "{}", f.name);
    }
}

/// `args` to ffmpeg making `name` in `dir` (320x180 test patterns, fast).
fn made(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(name);
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-y"])
        .args(args)
        .arg(&out));
    out
}

/// The time of the first frame ffmpeg decodes of `source` when it seeks to `secs` (to the
/// keyframe at or before it, by its index) without trimming the frames before.
fn first_frame_after_seek(source: &Path, secs: f64) -> f64 {
    let out = run(Command::new("ffmpeg")
        .args([
            "-v",
            "error",
            "-copyts",
            "-start_at_zero",
            "-noaccurate_seek",
        ])
        .args(["-ss", &secs.to_string(), "-i"])
        .arg(source)
        .args(["-map", "0:v", "-frames:v", "1", "-f", "framemd5", "-"]));
    let line = out.lines().find(|l| !l.starts_with('#')).unwrap();
    let pts: f64 = line.split(',').nth(2).unwrap().trim().parse().unwrap();
    let tb = out.lines().find_map(|l| l.strip_prefix("#tb 0: ")).unwrap();
    let (num, den) = tb.split_once('/').unwrap();
    pts * num.parse::<f64>().unwrap() / den.parse::<f64>().unwrap()
}

/// `source` as units of 4 s (past 10 s) against one run: both complete, with the same files,
/// every MP4 rung with the same frames as the one run's (decoded with `-xerror`), presented in
/// increasing order, and the same audio playlist; the frames per rung.
fn units_match_one_run(dir: &Path, source: &Path) -> u64 {
    let mut units_job = job(10);
    units_job.profile.unit_segments = 1;
    units_job.ffmpeg_threads = 1;
    let mut one_job = job(600);
    one_job.ffmpeg_threads = 1;
    let (split, one) = (dir.join("units"), dir.join("one"));
    let out = process(&units_job, source, &split);
    process(&one_job, source, &one);
    assert_eq!(files(&split), files(&one));
    let mut frames = 0;
    for f in out.files.iter().filter(|f| f.name.starts_with("mp4/")) {
        let (a, b) = (split.join(&f.name), one.join(&f.name));
        frames = decodes(&a);
        assert_eq!(frames, decodes(&b), "{}", f.name);
        let t = presentation_times(&a, "v:0");
        assert!(t.windows(2).all(|w| w[1] > w[0]), "{}", f.name);
    }
    let audio = |d: &Path| std::fs::read_to_string(d.join("hls/audio/index.m3u8")).ok();
    assert_eq!(audio(&split), audio(&one));
    frames
}

/// Sources a camera or an editor makes that a unit must still cut right: 30 s between
/// keyframes (every unit decodes from far before it), open GOPs (B-frames across keyframes),
/// variable frame rate (the ladder's constant rate decides the frames), no audio, audio
/// longer than the video, and an MP4 whose seek lands past the keyframe a unit needs.
#[test]
fn awkward_sources_cut_into_units_as_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let video = |secs: u32| format!("testsrc2=size=320x180:rate=30:duration={secs}");
    let tone = |secs: u32| format!("sine=duration={secs}");
    let x264 = [
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv420p",
    ];
    let aac = ["-c:a", "aac"];

    let long_gop = made(
        d,
        "gop30.mp4",
        &[
            &["-f", "lavfi", "-i", &video(64)][..],
            &x264,
            &["-g", "900"],
        ]
        .concat(),
    );
    let open_gop = made(
        d,
        "open-gop.mp4",
        &[
            &[
                "-f",
                "lavfi",
                "-i",
                &video(40),
                "-c:v",
                "libx264",
                "-preset",
                "veryfast",
            ][..],
            &[
                "-bf",
                "3",
                "-g",
                "48",
                "-x264-params",
                "open-gop=1:scenecut=0",
            ],
        ]
        .concat(),
    );
    // Frames 1/30 s apart, then 1/15 s apart, alternating each second.
    let vfr = made(
        d,
        "vfr.mp4",
        &[
            &["-f", "lavfi", "-i", &video(40)][..],
            &[
                "-vf",
                "select='not(mod(n\\,2))+lt(mod(t\\,2)\\,1)'",
                "-fps_mode",
                "vfr",
            ],
            &x264,
        ]
        .concat(),
    );
    let no_audio = made(
        d,
        "silent.mp4",
        &[&["-f", "lavfi", "-i", &video(30)][..], &x264].concat(),
    );
    let longer_audio = made(
        d,
        "longer-audio.mp4",
        &[
            &[
                "-f",
                "lavfi",
                "-i",
                &video(24),
                "-f",
                "lavfi",
                "-i",
                &tone(30),
            ][..],
            &x264,
            &aac,
        ]
        .concat(),
    );
    // Every frame after the first shown a frame later: ffmpeg's seek in this MP4's index
    // lands on the keyframe after the one a unit needs (seen below), so each unit's first run
    // comes out a frame short and is made again from its pre-roll.
    let plain = made(
        d,
        "plain.mp4",
        &[
            &["-f", "lavfi", "-i", &video(24)][..],
            &x264,
            &["-bf", "2", "-g", "30"],
        ]
        .concat(),
    );
    let late_seek = made(
        d,
        "late-seek.mp4",
        &[
            "-i",
            plain.to_str().unwrap(),
            "-c",
            "copy",
            "-bsf:v",
            "setts=pts=if(eq(N\\,0)\\,PTS\\,PTS+DURATION)",
        ],
    );
    let landed = first_frame_after_seek(&late_seek, 8.0);
    assert!(
        (landed - (8.0 + 1.0 / 30.0)).abs() < 1e-3,
        "landed at {landed} s"
    );
    for (source, frames) in [
        (&late_seek, 24 * 30),
        (&long_gop, 64 * 30),
        (&open_gop, 40 * 30),
        (&no_audio, 30 * 30),
        (&longer_audio, 24 * 30),
    ] {
        let each = d.join(source.file_stem().unwrap());
        let n = units_match_one_run(&each, source);
        assert!(n.abs_diff(frames) <= 1, "{}: {n} frames", source.display());
    }
    let each = d.join("vfr");
    assert!(units_match_one_run(&each, &vfr) > 0);
}

/// A plan's stitch task twice on the unit topic, taken at once by a worker of four permits
/// (three unit-topic tasks at a time), as when two parts land at the same moment or a part's
/// task is redelivered after its record. Here the worker that has the first stitch in hand is
/// killed (`kill -9`) before it answers, and a copy of the task is sent meanwhile: the next
/// worker finds both. The request is answered once: a pod takes a plan's stitches one at a
/// time (`units::Stitches`), and the second finds the plan answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_stitch_sent_twice_answers_once() {
    use rdkafka::producer::FutureRecord;
    let (stack, _dir, mut env, mut first, req) = one_worker_on_a_long_video("twice", 30, &[]).await;
    let unit_topic = env["KAFKA_UNIT_TOPIC"].clone();
    let responses = stack.responses();
    stack.send(&req).await;
    let keys = keys_once(&stack, "", |k| k.iter().any(|k| k.ends_with("/plan.json"))).await;
    let prefix = keys
        .iter()
        .find_map(|k| k.strip_suffix("plan.json"))
        .unwrap();
    let plan = prefix.trim_end_matches('/').rsplit('/').next().unwrap();
    // The stitch at work (on `/jobs` under the plan's id): it downloads the pieces and runs
    // ffmpeg, seconds, and is killed well before it answers.
    common::wait_until("the stitch at work", 3 * common::MINUTE, || {
        let jobs = first.jobs();
        jobs.iter().any(|j| j["request_id"] == plan).then_some(())
    })
    .await;
    first.kill9();
    assert_eq!(stack.response_count(), 0, "answered before it was killed");
    let task = serde_json::json!({
        "plan": { "bucket": common::OUTPUT_BUCKET, "prefix": prefix },
        "unit": null,
    })
    .to_string();
    stack
        .producer()
        .send(
            FutureRecord::to(&unit_topic).key(plan).payload(&task),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    env.insert("WORKER_POOL_SIZE".into(), "4".into());
    let second = common::Worker::start(&env);
    second.ready().await;
    assert_eq!(
        completed_within(&responses, 3 * common::MINUTE).key,
        "twice"
    );
    // Every task of the unit topic done (a stitch is acknowledged once it answered, or found
    // the plan answered): one response, and the second stitch waited for the first.
    common::wait_until("the unit topic's tasks done", common::MINUTE, || {
        (stack.uncommitted_units(&unit_topic, "twice", 6) == 0).then_some(())
    })
    .await;
    assert_eq!(stack.response_count(), 1);
    let log = second.log();
    assert!(
        log.contains("a stitch of this plan is in hand here: taken after it"),
        "{log}"
    );
    assert!(!logged(&log, "already answered").is_empty(), "{log}");
}

/// Whether `worker`'s log says it was assigned a partition of the unit lane.
fn holds_unit_partitions(worker: &common::Worker) -> usize {
    logged(&worker.log(), "partition assigned")
        .iter()
        .filter(|f| f["lane"] == "units")
        .count()
}

/// Units landed by each of `workers`, by their logs.
fn units_landed(workers: &[common::Worker]) -> Vec<usize> {
    workers
        .iter()
        .map(|w| logged(&w.log(), "unit landed").len())
        .collect()
}

/// Every worker of a fleet encodes its even share of one video's units, whatever the group
/// protocol and its assignor: a request topic of 4 partitions and a unit topic of 6 (an even
/// share for two members and for three); two workers (pool of one), a 96 s video (12 units
/// and the audio); then a third worker, once it holds a unit partition, and a second video.
/// Each video is answered once, completed, and each worker's log counts units of each: within
/// one of the even share. With one group over both topics, KIP-848's `uniform` assignor gave
/// one of two members the four request partitions and the other the four unit partitions:
/// one encoded every unit.
async fn units_spread_over_every_worker(protocol: &str) {
    let mut stack = common::Stack::start(4).await;
    stack.group_protocol = protocol.to_owned();
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, 6);
    let dir = tempfile::tempdir().unwrap();
    let source = common::synthetic::camera_like_video(dir.path(), 96, 640, 360);
    stack.upload_file("long.mp4", &source).await;
    let mut env = stack.worker_env("spread");
    env.insert("KAFKA_UNIT_TOPIC".into(), unit_topic);
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    env.insert("FFMPEG_PRESET".into(), "ultrafast".into());
    env.insert(
        "MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS".into(),
        "20".into(),
    );
    let start = |i: usize| {
        let mut env = env.clone();
        env.insert("WORKER_ID".into(), format!("worker-{i}"));
        common::Worker::start(&env)
    };
    let mut workers: Vec<common::Worker> = (0..2).map(start).collect();
    for w in &workers {
        w.ready().await;
    }
    let responses = stack.responses();
    let mut before = vec![0; 2];
    for (round, media) in ["first", "second"].into_iter().enumerate() {
        if round == 1 {
            workers.push(start(2));
            workers[2].ready().await;
            // Its share (two of six) taken from the others (their revoke drained) before the
            // tasks exist.
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while holds_unit_partitions(&workers[2]) < 2 {
                assert!(std::time::Instant::now() < deadline, "no unit partition");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            before.push(0);
        }
        let mut req = common::request(media, "long.mp4");
        req.profile = Some("streaming".into());
        stack.send(&req).await;
        let r = completed(&responses);
        assert_eq!(r.key, media);
        let now = units_landed(&workers);
        let of_this: Vec<usize> = now.iter().zip(&before).map(|(n, b)| n - b).collect();
        assert_eq!(of_this.iter().sum::<usize>(), 12, "{media}: {of_this:?}");
        let even = 12.0 / workers.len() as f64;
        assert!(
            of_this.iter().all(|&n| (n as f64 - even).abs() <= 1.0),
            "{protocol}, {} workers: units of the {media} video by worker {of_this:?}, \
             {even:.1} each is even",
            workers.len()
        );
        before = now;
    }
    assert!(
        responses.next(Duration::from_secs(3)).is_none(),
        "one answer each"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn units_spread_over_every_worker_under_the_consumer_protocol() {
    units_spread_over_every_worker("consumer").await
}

#[tokio::test(flavor = "multi_thread")]
async fn units_spread_over_every_worker_under_the_classic_protocol() {
    units_spread_over_every_worker("classic").await
}

/// A worker configured with a unit topic that does not exist says so when it starts and in
/// `/health/ready` (`unit_topic: false`, still ready), and encodes a long video itself rather
/// than failing it; the topic is not created by asking for it (the broker would, with its
/// default partitions).
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_unit_topic_is_said_at_startup_and_long_videos_still_answered() {
    let (stack, _dir, _source, mut env) = long_video_on_a_fleet("missing", 30).await;
    let missing = stack.own("media.optimize.units-never-made");
    env.insert("KAFKA_UNIT_TOPIC".into(), missing.clone());
    env.insert(
        "MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS".into(),
        "20".into(),
    );
    let worker = common::Worker::start(&env);
    worker.ready().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let health = loop {
        let (_, body) = worker.http_get("/health/ready").expect("an answer");
        let health: serde_json::Value = serde_json::from_str(&body).unwrap();
        if !health["unit_topic"].is_null() {
            break health;
        }
        assert!(std::time::Instant::now() < deadline, "{health}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(health["unit_topic"], false, "{health}");
    assert_eq!(health["ready"], true, "{health}");
    let said = logged_containing(&worker.log(), "the unit topic does not exist");
    assert_eq!(said.len(), 1, "{}", worker.log());
    assert_eq!(said[0]["topic"], missing.as_str());
    // The video, past its units_after_secs, is answered by this worker alone.
    let responses = stack.responses();
    let mut req = common::request("missing-topic", "long.mp4");
    req.profile = Some("streaming".into());
    stack.send(&req).await;
    completed(&responses);
    assert!(
        !stack.broker.topics().contains(&missing),
        "the unit topic was created by asking for it"
    );
}
