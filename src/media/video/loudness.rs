//! Loudness (EBU R128). A measurement pass decodes the audio alone (cheap: no video is
//! decoded) through ffmpeg's `loudnorm`, which reports integrated loudness, true peak and
//! loudness range; a profile with a target then normalises in the ladder's one run, `loudnorm`
//! again given the measurement (linear gain whenever the true peak allows it).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::child::{self, ChildError};
use super::ffprobe::{self, VideoProbe};
use crate::contract::Loudness;
use crate::media::error::MediaError;
use crate::media::settings::{LoudnessSpec, VideoSettings};

/// What the measurement pass reports (`loudnorm` with `print_format=json`).
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub integrated: f64,
    pub true_peak: f64,
    pub range: f64,
    pub threshold: f64,
    pub offset: f64,
}

impl Measured {
    pub fn report(&self, spec: &LoudnessSpec) -> Loudness {
        Loudness {
            integrated_lufs: self.integrated,
            true_peak_dbtp: self.true_peak,
            range_lu: self.range,
            normalized_to_lufs: spec.target_lufs,
        }
    }
}

/// Measures the first audio stream. `Ok(None)`: the audio is silent (no loudness to bring
/// anywhere).
pub fn measure(
    settings: &VideoSettings,
    probe: &VideoProbe,
    input: &Path,
    log: &Path,
    limit: Duration,
    cancel: &CancellationToken,
) -> Result<Option<Measured>, MediaError> {
    let mut cmd = Command::new(&settings.ffmpeg);
    // loudnorm prints its report at the info level.
    cmd.args(["-hide_banner", "-nostdin", "-nostats", "-v", "info"])
        .args(ffprobe::input_args(probe.demuxer, input))
        .args(["-map", "0:a:0", "-vn", "-sn", "-dn"])
        .args(["-af", "loudnorm=print_format=json", "-f", "null", "-"])
        .current_dir(log.parent().unwrap_or(Path::new(".")));
    child::run(cmd, log, limit, cancel, &mut |_| {}).map_err(|e| match e {
        ChildError::TimedOut(d) => MediaError::Timeout(d),
        ChildError::Failed { stderr, .. } => {
            MediaError::Corrupt(format!("the audio cannot be measured: {stderr}"))
        }
        other => MediaError::Transform(other.to_string()),
    })?;
    parse(&std::fs::read_to_string(log)?)
}

#[derive(Deserialize)]
struct Report {
    input_i: String,
    input_tp: String,
    input_lra: String,
    input_thresh: String,
    target_offset: String,
}

/// The last JSON object of the log: `loudnorm`'s report.
fn parse(log: &str) -> Result<Option<Measured>, MediaError> {
    let bad = |why: &str| MediaError::Transform(format!("loudnorm's report: {why}"));
    let start = log.rfind('{').ok_or_else(|| bad("missing"))?;
    let end = log[start..].find('}').ok_or_else(|| bad("cut short"))? + start + 1;
    let r: Report = serde_json::from_str(&log[start..end]).map_err(|e| bad(&e.to_string()))?;
    let num = |s: &str| s.trim().parse::<f64>().ok().filter(|v| v.is_finite());
    // Silence measures -inf (or -70, the absolute gate).
    match (
        num(&r.input_i).filter(|i| *i > -70.0),
        num(&r.input_tp),
        num(&r.input_lra),
        num(&r.input_thresh),
        num(&r.target_offset),
    ) {
        (Some(integrated), Some(true_peak), Some(range), Some(threshold), Some(offset)) => {
            Ok(Some(Measured {
                integrated,
                true_peak,
                range,
                threshold,
                offset,
            }))
        }
        _ => Ok(None),
    }
}

/// The audio filter normalising `m` to the profile's target, if it has one. The range target
/// is the measured range (at least loudnorm's default 7 LU): normalising should not compress;
/// loudnorm applies a linear gain unless that would push the true peak over the limit.
pub fn normalise(m: &Measured, spec: &LoudnessSpec) -> Option<String> {
    let target = spec.target_lufs?;
    let lra = m.range.clamp(7.0, 50.0);
    Some(format!(
        "loudnorm=I={target}:TP={}:LRA={lra}:measured_I={}:measured_TP={}:measured_LRA={}:\
         measured_thresh={}:offset={}:linear=true",
        spec.max_true_peak_dbtp, m.integrated, m.true_peak, m.range, m.threshold, m.offset
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"size=N/A time=00:00:10.00 bitrate=N/A speed= 133x
[Parsed_loudnorm_0 @ 0x55ed752a8280]
{
	"input_i" : "-19.68",
	"input_tp" : "-6.45",
	"input_lra" : "2.70",
	"input_thresh" : "-29.68",
	"output_i" : "-23.46",
	"output_tp" : "-9.79",
	"output_lra" : "2.50",
	"output_thresh" : "-33.46",
	"normalization_type" : "dynamic",
	"target_offset" : "-0.54"
}
"#;

    #[test]
    fn the_report_is_read_and_silence_has_no_loudness() {
        let m = parse(LOG).unwrap().unwrap();
        assert_eq!((m.integrated, m.true_peak, m.range), (-19.68, -6.45, 2.70));
        let silent = LOG.replace("\"-19.68\"", "\"-inf\"");
        assert_eq!(parse(&silent).unwrap(), None);
        assert!(parse("no report").is_err());
    }

    #[test]
    fn normalising_passes_the_measurement_and_keeps_the_range() {
        let m = parse(LOG).unwrap().unwrap();
        let spec = LoudnessSpec {
            target_lufs: Some(-16.0),
            max_true_peak_dbtp: -1.0,
        };
        let f = normalise(&m, &spec).unwrap();
        assert!(
            f.starts_with("loudnorm=I=-16:TP=-1:LRA=7:measured_I=-19.68:"),
            "{f}"
        );
        assert!(f.ends_with("offset=-0.54:linear=true"), "{f}");
        let measure_only = LoudnessSpec {
            target_lufs: None,
            ..spec
        };
        assert_eq!(normalise(&m, &measure_only), None);
        assert_eq!(m.report(&spec).normalized_to_lufs, Some(-16.0));
    }
}
