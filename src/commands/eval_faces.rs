//! `media-worker eval-faces [DIR]`: face detection over a corpus compared with the `faces=N`
//! (or `faces~N`) in its MANIFEST.tsv `expected` column.
//!
//! Goals: the exact count on at least 90 % of one- and two-face photos, no face on any no-face
//! photo (animals included), group photos (3+) within ±30 %.

use std::path::Path;

use crate::config::Settings;
use crate::media::{self, analyze, probe, sniff};

/// (file, expected faces) from a manifest.
pub fn expectations(manifest: &str) -> Vec<(String, u32)> {
    manifest
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            let (file, kind, expected) = (cols.first()?, cols.get(5)?, cols.get(6)?);
            if *kind == "video" {
                return None;
            }
            let at = expected
                .find("faces=")
                .or_else(|| expected.find("faces~"))?
                + 6;
            let digits: String = expected[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            Some((file.to_string(), digits.parse().ok()?))
        })
        .collect()
}

/// Faces found in one file, with the worker's own decode and analysis.
pub fn count_faces(settings: &Settings, path: &Path) -> Result<u32, String> {
    let format = match sniff::sniff_file(path).map_err(|e| e.to_string())? {
        sniff::Sniffed::Image(f) => f,
        other => return Err(format!("not an image: {other:?}")),
    };
    let probe = probe::run(path, format, &settings.limits).map_err(|e| e.to_string())?;
    let profile = &settings.profiles["default"];
    // What the worker's analysis reads.
    let (decoded, shared) =
        media::image::decode_image(path, &probe, profile, Some(&settings.analysis))
            .map_err(|f| f.error.to_string())?;
    let image = shared.as_ref().map_or(&decoded, |v| &v.image);
    let a = analyze::run(&probe, image, &settings.analysis)?;
    Ok(a.vision.map_or(0, |v| v.face_count))
}

/// Prints the table and the goals; returns whether every goal is met.
pub fn run(settings: &Settings, dir: &Path) -> anyhow::Result<bool> {
    media::init(settings.worker.vips_threads);
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv"))?;
    let (mut small_ok, mut small_n, mut none_ok, mut none_n, mut group_ok, mut group_n) =
        (0, 0, 0, 0, 0, 0);
    println!("{:<40} {:>8} {:>6}  ok", "file", "expected", "found");
    for (file, expected) in expectations(&manifest) {
        let found = match count_faces(settings, &dir.join(&file)) {
            Ok(n) => n,
            Err(e) => {
                println!("{file:<40} {expected:>8} {:>6}  error: {e}", "-");
                continue;
            }
        };
        let ok = match expected {
            0 => {
                none_n += 1;
                none_ok += (found == 0) as u32;
                found == 0
            }
            1 | 2 => {
                small_n += 1;
                small_ok += (found == expected) as u32;
                found == expected
            }
            _ => {
                group_n += 1;
                let within = (found as f64 - expected as f64).abs() <= 0.3 * expected as f64;
                group_ok += within as u32;
                within
            }
        };
        println!(
            "{file:<40} {expected:>8} {found:>6}  {}",
            if ok { "yes" } else { "NO" }
        );
    }
    let small_goal = small_ok as f64 >= 0.9 * small_n as f64;
    println!();
    println!(
        "one/two faces exact: {small_ok}/{small_n} (goal >= 90 %): {}",
        verdict(small_goal)
    );
    println!(
        "no-face photos with 0 faces: {none_ok}/{none_n} (goal all): {}",
        verdict(none_ok == none_n)
    );
    println!(
        "group photos within 30 %: {group_ok}/{group_n} (goal all): {}",
        verdict(group_ok == group_n)
    );
    Ok(small_goal && none_ok == none_n && group_ok == group_n)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_counts_from_the_expected_column() {
        let m = "file\tb\tc\td\te\tkind\texpected\n\
                 a.jpg\t1\tx\tr\tp\tfaces\tfaces=7 (family)\n\
                 b.jpg\t1\tx\tr\tp\tfaces\tfaces~24 (collage)\n\
                 c.png\t1\tx\tr\tp\tcolor\t16-bit; faces=1 small\n\
                 d.mp4\t1\tx\tr\tp\tvideo\tpeople/faces on stage\n\
                 e.jpg\t1\tx\tr\tp\tphoto\tno count here\n";
        let got = super::expectations(m);
        assert_eq!(
            got,
            vec![
                ("a.jpg".into(), 7),
                ("b.jpg".into(), 24),
                ("c.png".into(), 1)
            ]
        );
    }
}
