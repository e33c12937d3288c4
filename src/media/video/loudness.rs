//! Loudness (EBU R128). A measurement pass decodes the audio alone (cheap: no video is
//! decoded) through ffmpeg's `ebur128` meter (true peak on), which reports integrated
//! loudness, its gate, true peak and loudness range: what `loudnorm`'s own measuring pass
//! reports (within 0.1 dB here), in a quarter of its time (`loudnorm` resamples to 192 kHz:
//! 7.3 s against 1.9 s for 10 minutes of audio), which a long video's first playable waits
//! for. A profile with a target then normalises in the ladder's run: a gain alone (`volume`)
//! whenever the true peak allows it, which is `loudnorm`'s linear mode without its 192 kHz
//! round trip; `loudnorm`'s dynamic mode only when a gain would push the peak over the limit.
//! Left to `loudnorm`, a steady program (range 0 LU as `ebur128` measures it) fell to the
//! dynamic mode (`loudnorm` takes a measured range of 0 for none), which compressed what a
//! gain would have kept and took twice as long as the encode: 16.5 s against 7.6 s for
//! 10 minutes, the critical path of a long video's first playable.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::child::{self, ChildError};
use super::ffprobe::{self, VideoProbe};
use crate::contract::Loudness;
use crate::media::error::MediaError;
use crate::media::settings::{LoudnessSpec, VideoSettings};

/// What the measurement pass reports (`ebur128`'s summary).
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub integrated: f64,
    pub true_peak: f64,
    pub range: f64,
    /// The integrated loudness's relative gate.
    pub threshold: f64,
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
    cmd.args(measure_args(probe, input))
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

/// ffmpeg's arguments of the measurement. ebur128 prints its summary at the info level, and
/// each 100 ms at the level `framelog` says (info by default without video: 144 000 lines for
/// 4 hours), here verbose: not printed.
pub fn measure_args(probe: &VideoProbe, input: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = ["-hide_banner", "-nostdin", "-nostats", "-v", "info"]
        .map(OsString::from)
        .into();
    a.extend(ffprobe::input_args(probe.demuxer, input));
    a.extend(
        [
            "-map",
            "0:a:0",
            "-vn",
            "-sn",
            "-dn",
            "-af",
            "ebur128=peak=true:framelog=verbose",
            "-f",
            "null",
            "-",
        ]
        .map(OsString::from),
    );
    a
}

/// The last summary of the log: `ebur128`'s.
fn parse(log: &str) -> Result<Option<Measured>, MediaError> {
    let bad = |why: &str| MediaError::Transform(format!("ebur128's summary: {why}"));
    let start = log.rfind("Summary:").ok_or_else(|| bad("missing"))?;
    // `  I:  -21.8 LUFS`: the first value after `key:` in the summary (the integrated
    // loudness's gate is the first `Threshold:`, before the range's).
    let value = |key: &str| -> Option<f64> {
        let at = log[start..].find(&format!("{key}:"))? + start + key.len() + 1;
        let v: f64 = log[at..].split_whitespace().next()?.parse().ok()?;
        v.is_finite().then_some(v)
    };
    let (integrated, threshold, range) = match (value("I"), value("Threshold"), value("LRA")) {
        (Some(i), Some(t), Some(r)) => (i, t, r),
        _ => return Err(bad("cut short")),
    };
    // Silence measures the absolute gate, -70, and a peak of -inf.
    match (integrated > -70.0, value("Peak")) {
        (true, Some(true_peak)) => Ok(Some(Measured {
            integrated,
            true_peak,
            range,
            threshold,
        })),
        _ => Ok(None),
    }
}

/// The audio filter normalising `m` to the profile's target, if it has one: the gain to the
/// target when the true peak stays under the limit with it, else `loudnorm` (dynamic) given the
/// measurement, its range target the measured range (at least loudnorm's default 7 LU, so it
/// does not compress more than it must).
pub fn normalise(m: &Measured, spec: &LoudnessSpec) -> Option<String> {
    let target = spec.target_lufs?;
    let gain = target - m.integrated;
    if m.true_peak + gain <= spec.max_true_peak_dbtp {
        return Some(format!("volume={gain:.2}dB"));
    }
    let lra = m.range.clamp(7.0, 50.0);
    Some(format!(
        "loudnorm=I={target}:TP={}:LRA={lra}:measured_I={}:measured_TP={}:measured_LRA={}:\
         measured_thresh={}",
        spec.max_true_peak_dbtp, m.integrated, m.true_peak, m.range, m.threshold
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"size=N/A time=00:01:04.00 bitrate=N/A speed= 133x
[Parsed_ebur128_0 @ 0x5562b056d1c0] Summary:

  Integrated loudness:
    I:         -19.7 LUFS
    Threshold: -29.7 LUFS

  Loudness range:
    LRA:         2.7 LU
    Threshold: -39.7 LUFS
    LRA low:   -21.0 LUFS
    LRA high:  -18.3 LUFS

  True peak:
    Peak:       -6.4 dBFS
"#;

    #[test]
    fn the_report_is_read_and_silence_has_no_loudness() {
        let m = parse(LOG).unwrap().unwrap();
        assert_eq!(
            (m.integrated, m.true_peak, m.range, m.threshold),
            (-19.7, -6.4, 2.7, -29.7)
        );
        let silent = LOG
            .replace("-19.7 LUFS", "-70.0 LUFS")
            .replace("-6.4 dBFS", "-inf dBFS");
        assert_eq!(parse(&silent).unwrap(), None);
        assert!(parse("no report").is_err());
        assert!(parse(&LOG[..LOG.find("Loudness range").unwrap()]).is_err());
    }

    #[test]
    fn a_gain_normalises_unless_the_peak_would_clip() {
        let m = parse(LOG).unwrap().unwrap();
        let spec = LoudnessSpec {
            target_lufs: Some(-16.0),
            max_true_peak_dbtp: -1.0,
        };
        // -19.7 LUFS to -16: 3.7 dB, the peak -6.4 + 3.7 = -2.7 dBTP under -1.
        assert_eq!(normalise(&m, &spec).as_deref(), Some("volume=3.70dB"));
        // A steady program (range 0) is still a gain, not loudnorm's dynamic mode.
        let steady = Measured {
            range: 0.0,
            ..m.clone()
        };
        assert_eq!(normalise(&steady, &spec).as_deref(), Some("volume=3.70dB"));
        // -3.0 dBTP + 3.7 dB would clip: loudnorm, given the measurement.
        let peaky = Measured {
            true_peak: -3.0,
            ..m.clone()
        };
        let f = normalise(&peaky, &spec).unwrap();
        assert!(
            f.starts_with("loudnorm=I=-16:TP=-1:LRA=7:measured_I=-19.7:measured_TP=-3:"),
            "{f}"
        );
        assert!(f.ends_with("measured_thresh=-29.7"), "{f}");
        let measure_only = LoudnessSpec {
            target_lufs: None,
            ..spec
        };
        assert_eq!(normalise(&m, &measure_only), None);
        assert_eq!(m.report(&spec).normalized_to_lufs, Some(-16.0));
    }
}
