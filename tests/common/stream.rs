//! Streaming outputs read back with tools of their own: the playlists with Python's `m3u8`
//! package (`tests/streaming/hls.py`), segments and files with ffprobe and ffmpeg.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The master playlist and every playlist it names, as Python's `m3u8` reads them.
pub fn hls(master: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/streaming/hls.py");
    serde_json::from_str(&run(Command::new("python3").arg(script).arg(master))).unwrap()
}

/// `ffprobe -show_format` duration of a file, in seconds.
pub fn duration(path: &Path) -> f64 {
    let d = run(Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "format=duration",
            "-of",
            "csv=p=0",
        ])
        .arg(path));
    d.trim().parse().unwrap()
}

/// A segment as a player gets it: its init segment, then it.
pub fn playable(dir: &Path, init: &str, segment: &str, scratch: &Path) -> PathBuf {
    let mut bytes = std::fs::read(dir.join(init)).unwrap();
    bytes.extend(std::fs::read(dir.join(segment)).unwrap());
    let path = scratch.join(segment.replace('/', "_"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Decodes every frame with ffmpeg; the frames' count.
pub fn decodes(path: &Path) -> u64 {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-xerror", "-i"])
        .arg(path)
        .args(["-f", "null", "-"])
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let n = run(Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-select_streams", "0"])
        .args(["-show_entries", "stream=nb_read_frames", "-of", "csv=p=0"])
        .arg(path));
    n.trim().parse().unwrap()
}

/// The first video packet of a playable segment: its presentation time and whether it is a
/// keyframe.
pub fn first_packet(path: &Path) -> (f64, bool) {
    let csv = run(Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-read_intervals",
            "%+#1",
        ])
        .args(["-show_entries", "packet=pts_time,flags", "-of", "csv=p=0"])
        .arg(path));
    let line = csv.lines().next().expect("a packet");
    let (pts, flags) = line.split_once(',').unwrap();
    (pts.parse().unwrap(), flags.starts_with('K'))
}

/// An MPD's representations as an XML parser reads them: id, width, height, bandwidth and the
/// number of segments its timeline lists.
pub fn mpd_representations(mpd: &Path) -> Vec<Vec<String>> {
    run(Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, xml.etree.ElementTree as E
ns = {'d': 'urn:mpeg:dash:schema:mpd:2011'}
root = E.parse(sys.argv[1]).getroot()
for r in root.iterfind('.//d:Representation', ns):
    n = sum(1 + int(s.get('r', 0)) for s in r.iterfind('.//d:S', ns))
    print(r.get('id'), r.get('width'), r.get('height'), r.get('bandwidth'), n)",
        )
        .arg(mpd))
    .lines()
    .map(|l| l.split(' ').map(str::to_owned).collect())
    .collect()
}
