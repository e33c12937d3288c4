//! Generated test inputs (also used by `benches/video.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A test-pattern video with a tone: `secs` long, `w`x`h`, H.264 + AAC in MP4 (ffmpeg's lavfi
/// sources, so tests can have inputs long enough to interrupt).
pub fn synthetic_video(dir: &Path, secs: u32, w: u32, h: u32) -> PathBuf {
    let out = dir.join(format!("synthetic-{secs}s-{w}x{h}.mp4"));
    lavfi_video(&out, secs, w, h, 25, &["-preset", "ultrafast"]);
    out
}

/// A test pattern encoded as a phone records: 30 fps, H.264 High with CABAC and B-frames at
/// 12 Mbit/s for 1080p (in proportion to the pixels below, at least 2 Mbit/s), AAC. Its decode
/// costs what a real upload's does (the `ultrafast` clips of [`synthetic_video`] decode several
/// times cheaper). Keyframes as x264 places them (at most 250 frames apart).
pub fn camera_like_video(dir: &Path, secs: u32, w: u32, h: u32) -> PathBuf {
    camera_like_video_keyed(dir, secs, w, h, None)
}

/// [`camera_like_video`] with a keyframe every `keyframe_secs` seconds, as phones and cameras
/// write them (every second, most of them), when given.
pub fn camera_like_video_keyed(
    dir: &Path,
    secs: u32,
    w: u32,
    h: u32,
    keyframe_secs: Option<u32>,
) -> PathBuf {
    let keyed = keyframe_secs.map_or(String::new(), |k| format!("-key{k}s"));
    let out = dir.join(format!("camera-like-{secs}s-{w}x{h}{keyed}.mp4"));
    let gop = keyframe_secs.map(|k| (k * 30).to_string());
    let gop: Vec<&str> = gop
        .iter()
        .flat_map(|g| ["-g", g, "-keyint_min", g])
        .collect();
    let h264 = [
        "-preset",
        "veryfast",
        "-profile:v",
        "high",
        "-pix_fmt",
        "yuv420p",
    ];
    let kbps = (12_000 * u64::from(w * h) / (1920 * 1080)).max(2_000);
    let rate = [
        format!("{kbps}k"),
        format!("{}k", kbps * 5 / 4),
        format!("{}k", kbps * 2),
    ];
    let rate = ["-b:v", &rate[0], "-maxrate", &rate[1], "-bufsize", &rate[2]];
    lavfi_video(
        &out,
        secs,
        w,
        h,
        30,
        &[&h264[..], &rate[..], &gop[..]].concat(),
    );
    out
}

fn lavfi_video(out: &Path, secs: u32, w: u32, h: u32, fps: u32, x264: &[&str]) {
    let status = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("testsrc2=size={w}x{h}:rate={fps}:duration={secs}"))
        .args(["-f", "lavfi", "-i"])
        .arg(format!("sine=duration={secs}"))
        .args(["-c:v", "libx264"])
        .args(x264)
        .args(["-c:a", "aac", "-shortest"])
        .arg(out)
        .status()
        .unwrap();
    assert!(status.success());
}
