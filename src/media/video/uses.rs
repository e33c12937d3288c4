//! What the worker's ffmpeg runs name, derived from the argument builders: every profile of
//! config/default.toml (its storyboard in each format a profile may ask, its loudness measured
//! and normalised both ways), over an SDR source with audio and an HDR one without, as one run,
//! as a long video's unit and audio, with the sprite laid out and the loudness measured. The
//! encoders, filters and muxers they name are config/ffmpeg-components' `uses` lines exactly
//! (`components`), which the image's ffmpeg is built with and tests/container.rs checks.
//! (The stitch's and the opening's `-c copy -f mp4` runs are written in place, in `units` and
//! `audio`: they name the MP4 muxer, which the ladder's run names too.)

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::components::{self, Origin};
use super::ffprobe::VideoProbe;
use super::transcode::{self, Outputs, Span, Streaming};
use super::{loudness, storyboard};
use crate::contract::OutputFormat;
use crate::media::settings::{Profile, defaults};

/// (kind, name) of each component `args` names: `-c*` encoders, the filters of `-vf`, `-af`
/// and `-filter_complex` graphs, `-f` muxers (and the `f=` of each `tee` output); an `-f`
/// right before `-i` is a demuxer.
fn named(args: &[OsString]) -> BTreeSet<(&'static str, String)> {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut out = BTreeSet::new();
    for (i, a) in args.iter().enumerate() {
        let Some(value) = args.get(i + 1) else {
            break;
        };
        if a == "-c" || a.starts_with("-c:") {
            if value != "copy" {
                out.insert(("encoder", value.clone()));
            }
        } else if ["-vf", "-af", "-filter_complex"].contains(&a.as_str()) {
            out.extend(filters(value).into_iter().map(|f| ("filter", f)));
        } else if a == "-f" && args.get(i + 2).is_some_and(|n| n == "-i") {
            out.insert(("demuxer", value.clone()));
        } else if a == "-f" {
            out.insert(("muxer", value.clone()));
            if value == "tee" {
                // `[select=...:f=mp4:...]file|[...:f=hls:...]file`: the output after the options.
                let slaves = args[i + 2..].iter().find(|s| s.starts_with('[')).unwrap();
                for options in slaves.split('|').filter_map(|s| s.split(']').next()) {
                    let f = options.split(':').find_map(|o| o.strip_prefix("f="));
                    out.insert(("muxer", f.expect("each output names its muxer").to_owned()));
                }
            }
        }
    }
    out
}

/// The filters of a graph: its chains' filters, past their `[labels]`, up to their options.
fn filters(graph: &str) -> Vec<String> {
    let mut names = Vec::new();
    for chain in graph.split(';') {
        // Filters are separated by commas that no backslash escapes (`select`'s expressions).
        let mut start = 0;
        let bytes = chain.as_bytes();
        for end in (0..=bytes.len()).filter(|&k| {
            k == bytes.len() || (bytes[k] == b',' && (k == 0 || bytes[k - 1] != b'\\'))
        }) {
            let mut f = &chain[start..end];
            while let Some(rest) = f.strip_prefix('[') {
                f = rest.split_once(']').map_or("", |(_, r)| r);
            }
            let name: String = f
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.push(name);
            }
            start = end + 1;
        }
    }
    names
}

fn probe(w: u32, h: u32, hdr: bool, audio: bool) -> VideoProbe {
    VideoProbe {
        duration: Some(Duration::from_secs(60)),
        width: w,
        height: h,
        rotation: 0,
        fps: Some(30.0),
        video_codec: if hdr { "hevc" } else { "h264" }.into(),
        pix_fmt: if hdr { "yuv420p10le" } else { "yuv420p" }.into(),
        audio_codec: audio.then(|| "aac".to_owned()),
        bitrate: None,
        hdr,
        frames: Some(1800),
        streams: 1 + audio as u32,
        demuxer: "mov",
    }
}

/// Every run's arguments for `profile` over `probe`.
fn runs(profile: &Profile, probe: &VideoProbe) -> Vec<Vec<OsString>> {
    let job = defaults::job("default");
    let settings = &job.video;
    let input = Path::new("source");
    let rungs = transcode::plan(&profile.renditions, probe);
    let frames = if profile.poster {
        vec![Duration::from_secs(1), Duration::from_secs(30)]
    } else {
        Vec::new()
    };
    let stream =
        (!profile.streaming.is_empty()).then(|| Streaming::new(profile.segment_secs, probe));
    // The storyboard in each format a profile may ask for.
    let boards: Vec<Option<storyboard::Plan>> = match &profile.storyboard {
        Some(spec) => [OutputFormat::Webp, OutputFormat::Jpeg]
            .map(|format| {
                let mut spec = *spec;
                spec.format = format;
                storyboard::plan(&spec, probe)
            })
            .into(),
        None => vec![None],
    };
    // Normalised by a gain (peak well under the limit) and by loudnorm (it would clip).
    let mut filters = vec![None];
    if let Some(spec) = profile
        .loudness
        .as_ref()
        .filter(|_| probe.audio_codec.is_some())
    {
        for true_peak in [-20.0, -1.5] {
            let m = loudness::Measured {
                integrated: -30.0,
                true_peak,
                range: 5.0,
                threshold: -40.0,
            };
            filters.push(loudness::normalise(&m, spec));
        }
    }
    let span = Span {
        first_slot: 0,
        end_slot: Some(120),
        start_secs: 0.0,
        end_secs: Some(4.0),
        first_segment: 0,
        segments: 1,
        seek_secs: 0.0,
    };
    let mut all = Vec::new();
    for board in &boards {
        for audio_filter in &filters {
            let whole = Outputs {
                rungs: &rungs,
                progressive: profile.progressive,
                stream,
                storyboard: board.as_ref(),
                audio_filter: audio_filter.as_deref(),
                frames: &frames,
                frame_dir: Path::new("work"),
                span: None,
                first_candidate: 0,
            };
            let unit = Outputs {
                progressive: false,
                span: Some(span),
                ..whole
            };
            let audio = Outputs {
                rungs: &[],
                progressive: false,
                storyboard: None,
                frames: &[],
                ..whole
            };
            for outputs in [whole, unit, audio] {
                all.push(transcode::args(settings, 2, probe, input, &outputs));
            }
            if let Some(b) = board {
                all.push(b.sprite_args(Path::new("pieces")));
            }
        }
    }
    if profile.loudness.is_some() && probe.audio_codec.is_some() {
        all.push(loudness::measure_args(probe, input));
    }
    all
}

#[test]
fn the_lists_uses_lines_are_what_every_profile_names() {
    let profiles: std::collections::BTreeMap<String, Profile> = defaults::section("profiles");
    assert!(profiles.len() >= 5, "{:?}", profiles.keys());
    let mut derived = BTreeSet::new();
    for (name, profile) in &profiles {
        let mut animation = profile.clone();
        (animation.poster, animation.progressive) = (false, true);
        (animation.storyboard, animation.loudness) = (None, None);
        animation.streaming.clear();
        for p in [profile, &animation] {
            for probe in [
                probe(1920, 1080, false, true),
                probe(1080, 1920, true, false),
            ] {
                for args in runs(p, &probe) {
                    let found = named(&args);
                    assert!(!found.is_empty(), "{name}: {args:?}");
                    derived.extend(found);
                }
            }
        }
    }
    let list = components::list();
    let of = |kind: &str| -> BTreeSet<String> {
        derived
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, n)| n.clone())
            .collect()
    };
    for kind in ["encoder", "filter", "muxer"] {
        let listed: BTreeSet<String> = list.named(Origin::Uses, kind).iter().cloned().collect();
        assert_eq!(
            listed,
            of(kind),
            "`uses {kind}` in config/ffmpeg-components"
        );
    }
    // An input is opened with its container's demuxer.
    for d in of("demuxer") {
        assert!(list.codecs(&d).is_some(), "{d}");
    }
}

#[test]
fn the_parser_of_arguments_finds_what_they_name() {
    let args: Vec<OsString> = [
        "-f",
        "mov",
        "-i",
        "in",
        "-filter_complex",
        "[0:v:0]split=2[t][f];[t]scale=2:2,format=yuv420p[v0];\
         [f]select=gte(t\\,1)*lt(t\\,2),format=rgb24[c]",
        "-c:v:0",
        "libx264",
        "-c",
        "copy",
        "-af",
        "volume=1dB",
        "-f",
        "tee",
        "[select=\\'v:0,a\\':f=mp4:movflags=+faststart]a.mp4|[select=\\'a\\':f=hls:hls_time=4]b",
    ]
    .map(OsString::from)
    .into();
    let found: Vec<String> = named(&args)
        .into_iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    assert_eq!(
        found,
        [
            "demuxer mov",
            "encoder libx264",
            "filter format",
            "filter scale",
            "filter select",
            "filter split",
            "filter volume",
            "muxer hls",
            "muxer mp4",
            "muxer tee",
        ]
    );
}
