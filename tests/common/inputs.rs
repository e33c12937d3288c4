//! Small files of every codec that config/ffmpeg-components accepts in each container, made with
//! the host's ffmpeg (Debian's): one second of a test pattern and a tone, each listed video
//! codec once and each listed audio codec once per container, two to a file where one muxer
//! takes both. The codecs come from the list itself (`components::list()`): a codec added there
//! without a way to make it here fails [`accepted`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use media_worker::media::video::components;

/// A file of the test: what it holds and where.
#[derive(Debug, Clone)]
pub struct Input {
    /// `{demuxer}-{video}-{audio}`, the request's media id.
    pub id: String,
    pub path: PathBuf,
    pub demuxer: String,
    pub video: String,
    pub audio: Option<String>,
}

/// How the host's ffmpeg writes a video codec: its encoder's arguments and the frame size it
/// takes (H.263's CIF sizes, DV's PAL frame, DNxHR's minimum).
fn video(codec: &str) -> (&'static [&'static str], &'static str) {
    let small = "176x144";
    match codec {
        "h264" => (
            &[
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                "-pix_fmt",
                "yuv420p",
            ],
            small,
        ),
        "hevc" => (
            &[
                "-c:v",
                "libx265",
                "-preset",
                "ultrafast",
                "-x265-params",
                "log-level=error",
            ],
            small,
        ),
        "av1" => (&["-c:v", "libsvtav1", "-preset", "12"], small),
        "vp8" => (&["-c:v", "libvpx", "-deadline", "realtime"], small),
        "vp9" => (
            &[
                "-c:v",
                "libvpx-vp9",
                "-deadline",
                "realtime",
                "-cpu-used",
                "8",
            ],
            small,
        ),
        "mpeg1video" | "mpeg2video" | "mpeg4" | "h263" | "msmpeg4v2" | "ffv1" | "wmv1" | "wmv2" => {
            (&[], small)
        }
        "flv1" => (&["-c:v", "flv"], small),
        "theora" => (&["-c:v", "libtheora"], small),
        "msmpeg4v3" => (&["-c:v", "msmpeg4"], small),
        "mjpeg" => (&["-c:v", "mjpeg", "-pix_fmt", "yuvj420p"], small),
        "dvvideo" => (&["-c:v", "dvvideo", "-pix_fmt", "yuv420p"], "720x576"),
        "prores" => (&["-c:v", "prores_ks"], small),
        "dnxhd" => (
            &[
                "-c:v",
                "dnxhd",
                "-profile:v",
                "dnxhr_lb",
                "-pix_fmt",
                "yuv422p",
            ],
            "256x144",
        ),
        "png" => (&["-c:v", "png", "-pix_fmt", "rgb24"], small),
        "rawvideo" => (&["-c:v", "rawvideo", "-pix_fmt", "yuv420p"], small),
        _ => panic!("no way to make {codec} video here (tests/common/inputs.rs)"),
    }
}

/// The host's encoder of an audio codec (None: AMR, which it cannot encode: made here as raw
/// frames, copied in).
fn audio(codec: &str) -> Option<&str> {
    match codec {
        "mp3" => Some("libmp3lame"),
        "opus" => Some("libopus"),
        "vorbis" => Some("libvorbis"),
        "dts" => Some("dca"),
        "amr_nb" | "amr_wb" => None,
        _ => Some(codec),
    }
}

/// The host's ffmpeg's codecs (`ffmpeg -codecs`, by ffprobe's names): whether each is audio,
/// for those it decodes.
fn host_decodes() -> BTreeMap<String, bool> {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-codecs"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = text.split_once("\n -------").expect("the legend").1;
    rows.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (flags, name) = (w.next()?, w.next()?);
            (flags.starts_with('D')).then(|| (name.to_owned(), flags.as_bytes()[2] == b'A'))
        })
        .collect()
}

/// The muxer of a QuickTime-family file: MP4 for what only MP4 carries (a pair whose other
/// stream MP4 cannot carry fails, see [`accepted`]), else QuickTime.
fn iso_muxer(video: &str, audio: Option<&str>) -> &'static str {
    let mp4_only = |c: &str| ["av1", "vp9", "opus", "flac", "truehd"].contains(&c);
    if std::iter::once(video).chain(audio).any(mp4_only) {
        "mp4"
    } else {
        "mov"
    }
}

/// Raw AMR: its magic and 50 frames (one second) of the highest mode, their bits random (any
/// bits decode: the codec's parameters have no invalid values).
fn amr(dir: &Path, codec: &str) -> PathBuf {
    let (magic, header, bytes) = match codec {
        "amr_nb" => (&b"#!AMR\n"[..], 7 << 3 | 4, 31),
        _ => (&b"#!AMR-WB\n"[..], 8 << 3 | 4, 60),
    };
    let mut data = magic.to_vec();
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..50 {
        data.push(header);
        data.extend((0..bytes).map(|_| rng.u8(..)));
    }
    let path = dir.join(format!("{codec}.amr"));
    std::fs::write(&path, data).unwrap();
    path
}

/// One file in `demuxer`'s container with `video` and `audio` (one second), by the host's
/// ffmpeg.
fn make(dir: &Path, demuxer: &str, video_codec: &str, audio_codec: Option<&str>) -> Input {
    try_make(dir, demuxer, video_codec, audio_codec).unwrap_or_else(|e| panic!("{e}"))
}

/// [`make`], or why the host's muxer refused the pair.
fn try_make(
    dir: &Path,
    demuxer: &str,
    video_codec: &str,
    audio_codec: Option<&str>,
) -> Result<Input, String> {
    let id = format!("{demuxer}-{video_codec}-{}", audio_codec.unwrap_or("none"));
    let (muxer, ext) = match demuxer {
        "mov" => {
            let m = iso_muxer(video_codec, audio_codec);
            (m, m)
        }
        "matroska" => ("matroska", "mkv"),
        "avi" => ("avi", "avi"),
        "gif" => ("gif", "gif"),
        "mpegts" => ("mpegts", "ts"),
        "mpeg" => ("vob", "vob"),
        "flv" => ("flv", "flv"),
        "asf" => ("asf", "wmv"),
        "mxf" => ("mxf", "mxf"),
        "ogg" => ("ogg", "ogv"),
        other => panic!("no way to make a {other} file here (tests/common/inputs.rs)"),
    };
    let path = dir.join(format!("{id}.{ext}"));
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-v", "error", "-y"]);
    let size = if demuxer == "gif" {
        "96x64"
    } else {
        video(video_codec).1
    };
    let rate = if demuxer == "gif" { "10" } else { "25" };
    cmd.args(["-f", "lavfi", "-i"])
        .arg(format!("testsrc2=s={size}:r={rate}:d=1"));
    if let Some(a) = audio_codec {
        match audio(a) {
            Some(_) => {
                // Stereo at 48 kHz (8 kHz mono for the ADPCMs of cameras and phones).
                let tone = if a.starts_with("adpcm") {
                    "sine=f=440:r=8000:d=1"
                } else {
                    "sine=f=440:r=48000:d=1,pan=stereo|c0=c0|c1=c0"
                };
                cmd.args(["-f", "lavfi", "-i", tone]);
            }
            None => {
                cmd.args(["-f", "amr", "-i"]).arg(amr(dir, a));
            }
        }
    }
    if demuxer == "gif" {
        cmd.args(["-c:v", "gif"]);
    } else {
        let (args, _) = video(video_codec);
        if args.is_empty() {
            cmd.args(["-c:v", video_codec]);
        }
        cmd.args(args);
    }
    match audio_codec.map(|a| (a, audio(a))) {
        Some((_, Some(encoder))) => {
            cmd.args(["-c:a", encoder]);
        }
        Some((_, None)) => {
            cmd.args(["-c:a", "copy"]);
        }
        None => {}
    }
    cmd.args(["-strict", "-2", "-t", "1", "-f", muxer])
        .arg(&path);
    let out = cmd.output().unwrap();
    if !out.status.success() {
        return Err(format!("{id}: {cmd:?}: {out:?}"));
    }
    // Read back by the host's ffprobe as the codecs it was made with (MP4's MP2 reads as MP3):
    // the streams alone (an MPEG-TS lists them once more under its program).
    let read = Command::new("ffprobe")
        .args(["-v", "error", "-show_streams", "-of", "json"])
        .arg(&path)
        .output()
        .unwrap();
    let read: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    let streams = read["streams"].as_array().cloned().unwrap_or_default();
    let got: Vec<&str> = streams
        .iter()
        .filter_map(|s| s["codec_name"].as_str())
        .collect();
    let want: Vec<&str> = std::iter::once(video_codec).chain(audio_codec).collect();
    if got != want {
        return Err(format!("{id}: read back as {got:?}"));
    }
    Ok(Input {
        id,
        path,
        demuxer: demuxer.to_owned(),
        video: video_codec.to_owned(),
        audio: audio_codec.map(str::to_owned),
    })
}

/// Files holding every codec each container of the list accepts, in `dir`: a listed video
/// codec with a listed audio codec where the host's muxer takes both, else the video alone
/// and the audio with the container's first video codec. Each file is read back by the host's ffprobe as the codecs it was
/// made with.
pub fn accepted(dir: &Path) -> Vec<Input> {
    let host = host_decodes();
    let mut inputs = Vec::new();
    for (demuxer, codecs) in components::list().containers() {
        for c in codecs {
            assert!(
                host.contains_key(c),
                "the host's ffmpeg does not decode {c}"
            );
        }
        let (audios, videos): (Vec<&str>, Vec<&str>) =
            codecs.iter().map(String::as_str).partition(|c| host[*c]);
        if demuxer == "gif" {
            inputs.push(make(dir, demuxer, "gif", None));
            continue;
        }
        let mut a = audios.iter();
        for v in &videos {
            let Some(x) = a.next() else {
                inputs.push(make(dir, demuxer, v, None));
                continue;
            };
            match try_make(dir, demuxer, v, Some(x)) {
                Ok(both) => inputs.push(both),
                Err(_) => {
                    inputs.push(make(dir, demuxer, v, None));
                    inputs.push(make(dir, demuxer, videos[0], Some(x)));
                }
            }
        }
        for x in a {
            inputs.push(make(dir, demuxer, videos[0], Some(x)));
        }
    }
    inputs
}

/// A file the list does not accept: Cinepak video in AVI (the host's ffmpeg decodes it).
pub fn refused(dir: &Path) -> Input {
    let path = dir.join("avi-cinepak-none.avi");
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=s=176x144:r=25:d=1")
        .args(["-c:v", "cinepak", "-t", "1", "-f", "avi"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    Input {
        id: "avi-cinepak-none".into(),
        path,
        demuxer: "avi".into(),
        video: "cinepak".into(),
        audio: None,
    }
}
