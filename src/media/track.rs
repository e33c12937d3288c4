//! The tracks of an adaptive stream, as its playlists describe them: made by the ladder's run
//! (`video::stream`), kept in the resume record for the rungs that landed, and listed again
//! from there when a later attempt writes the playlists.

use serde::{Deserialize, Serialize};

/// One track of a stream: a video rung (by its height, the shorter displayed side) or the
/// audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TrackId {
    Video(u32),
    Audio,
}

impl std::fmt::Display for TrackId {
    /// Its folder under `hls/`, also its representation id in the MPD.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Self::Video(h) => write!(f, "{h}p"),
            Self::Audio => f.write_str("audio"),
        }
    }
}

/// What the playlists say of one track.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Track {
    pub id: TrackId,
    /// RFC 6381 (`avc1.64001f`, `mp4a.40.2`).
    pub codecs: String,
    /// Frame size (0 x 0 for audio).
    pub width: u32,
    pub height: u32,
    /// Frames per second (a constant rate: see `video::transcode`); none for audio.
    pub frame_rate: Option<f64>,
    /// The media segments in order: number `i` is `names::segment(id, i)`.
    pub segments: Vec<Segment>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub seconds: f64,
    pub bytes: u64,
}

impl Track {
    pub fn seconds(&self) -> f64 {
        self.segments.iter().map(|s| s.seconds).sum()
    }

    /// Bits per second of its most demanding segment (HLS `BANDWIDTH`, DASH `bandwidth`: a
    /// player that has it never stalls on this track).
    pub fn peak_bps(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| bits_per_second(s.bytes, s.seconds))
            .max()
            .unwrap_or(0)
    }

    /// Bits per second over the whole track (HLS `AVERAGE-BANDWIDTH`).
    pub fn average_bps(&self) -> u64 {
        let bytes = self.segments.iter().map(|s| s.bytes).sum();
        bits_per_second(bytes, self.seconds())
    }
}

/// Rounded up, so that a bandwidth is never below what it describes.
fn bits_per_second(bytes: u64, seconds: f64) -> u64 {
    if seconds <= 0.0 {
        return 0;
    }
    (bytes as f64 * 8.0 / seconds).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_come_from_the_segments() {
        let t = Track {
            id: TrackId::Video(720),
            codecs: "avc1.64001f".into(),
            width: 1280,
            height: 720,
            frame_rate: Some(30.0),
            segments: vec![
                Segment {
                    seconds: 4.0,
                    bytes: 1_000_000,
                },
                Segment {
                    seconds: 2.0,
                    bytes: 1_000_000,
                },
            ],
        };
        assert_eq!(t.peak_bps(), 4_000_000, "the 2 s segment");
        assert_eq!(t.average_bps(), 2_666_667, "rounded up");
        assert_eq!(t.seconds(), 6.0);
        assert_eq!(TrackId::Video(720).to_string(), "720p");
        assert_eq!(TrackId::Audio.to_string(), "audio");
    }
}
