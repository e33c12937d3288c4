//! Detects the media type from the first bytes of a file, never from its name.

use std::io::Read;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Jpeg,
    Png,
    Gif,
    Webp,
    Tiff,
    Heif,
    Avif,
}

impl ImageFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::Jpeg => "jpeg",
            Self::Png => "png",
            Self::Gif => "gif",
            Self::Webp => "webp",
            Self::Tiff => "tiff",
            Self::Heif => "heif",
            Self::Avif => "avif",
        }
    }

    /// Whether a libvips loader (`VipsForeignLoadJpegFile`, `jpegload`, ...) agrees with
    /// this detection.
    pub fn matches_vips_loader(self, loader: &str) -> bool {
        let family = match self {
            Self::Jpeg => "jpeg",
            Self::Png => "png",
            Self::Gif => "gif",
            Self::Webp => "webp",
            Self::Tiff => "tiff",
            Self::Heif | Self::Avif => "heif",
        };
        loader.to_ascii_lowercase().contains(family)
    }
}

/// A video container, and the one ffmpeg demuxer its input is opened with (`-f`): a file
/// that looks like one container never reaches another demuxer's parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Container {
    /// ISO BMFF (MP4) and QuickTime.
    IsoBmff,
    /// Matroska and WebM.
    Matroska,
    Avi,
    /// An animated GIF: sniffed as an image, and only made into MP4 on request
    /// (`Profile::animation_mp4`).
    Gif,
}

impl Container {
    /// Every container, one per line of config/ffmpeg-components (`video::components`).
    pub const ALL: [Container; 4] = [Self::IsoBmff, Self::Matroska, Self::Avi, Self::Gif];

    pub fn demuxer(self) -> &'static str {
        match self {
            Self::IsoBmff => "mov",
            Self::Matroska => "matroska",
            Self::Avi => "avi",
            Self::Gif => "gif",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    Image(ImageFormat),
    Video(Container),
    /// Vector input: not accepted (it would be rasterised at an arbitrary size, and SVG can
    /// reference external resources).
    Svg,
    Empty,
    Unknown,
}

pub fn sniff_file(path: &Path) -> std::io::Result<Sniffed> {
    let mut head = [0u8; 256];
    let mut f = std::fs::File::open(path)?;
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(sniff(&head[..n]))
}

pub fn sniff(b: &[u8]) -> Sniffed {
    use ImageFormat::*;
    if b.is_empty() {
        return Sniffed::Empty;
    }
    if b.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Sniffed::Image(Jpeg);
    }
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Sniffed::Image(Png);
    }
    if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        return Sniffed::Image(Gif);
    }
    if b.len() >= 12 && &b[0..4] == b"RIFF" {
        return match &b[8..12] {
            b"WEBP" => Sniffed::Image(Webp),
            b"AVI " => Sniffed::Video(Container::Avi),
            _ => Sniffed::Unknown,
        };
    }
    if b.starts_with(b"II*\0") || b.starts_with(b"MM\0*") {
        return Sniffed::Image(Tiff);
    }
    if b.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]) {
        return Sniffed::Video(Container::Matroska);
    }
    if b.len() >= 12 && &b[4..8] == b"ftyp" {
        return sniff_ftyp(b);
    }
    // QuickTime files without ftyp start with another top-level atom.
    if b.len() >= 8 && matches!(&b[4..8], b"moov" | b"mdat" | b"wide" | b"free") {
        return Sniffed::Video(Container::IsoBmff);
    }
    let text = String::from_utf8_lossy(&b[..b.len().min(256)]);
    let t = text.trim_start_matches('\u{feff}').trim_start();
    if t.starts_with("<svg") || (t.starts_with("<?xml") && t.contains("<svg")) {
        return Sniffed::Svg;
    }
    Sniffed::Unknown
}

/// ISO base media: the major brand and the compatible brands tell HEIF/AVIF from video.
fn sniff_ftyp(b: &[u8]) -> Sniffed {
    let size = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let end = size.clamp(16, b.len());
    let mut brands = vec![&b[8..12]];
    brands.extend(b[16.min(end)..end].chunks_exact(4));
    let has = |names: &[&[u8; 4]]| brands.iter().any(|br| names.iter().any(|n| *br == &n[..]));
    if has(&[b"avif", b"avis"]) {
        Sniffed::Image(ImageFormat::Avif)
    } else if has(&[
        b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1",
    ]) {
        Sniffed::Image(ImageFormat::Heif)
    } else {
        Sniffed::Video(Container::IsoBmff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/corpus")
            .join(name)
    }

    #[test]
    fn detects_by_content_not_name() {
        use ImageFormat::*;
        let cases = [
            ("sharp_Landscape_1.jpg", Sniffed::Image(Jpeg)),
            ("imageio_coffee.png", Sniffed::Image(Png)),
            ("sharp_rotating-squares.gif", Sniffed::Image(Gif)),
            ("libvips_looks-like-svg.webp", Sniffed::Image(Webp)),
            ("sharp_cielab-dagams.tiff", Sniffed::Image(Tiff)),
            ("libheif_example.heic", Sniffed::Image(Heif)),
            ("pillow_heif_arrow.heic", Sniffed::Image(Heif)),
            ("libheif_example.avif", Sniffed::Image(Avif)),
            ("rails_video.webm", Sniffed::Video(Container::Matroska)),
            (
                "rails_rotated_hdr_video.mov",
                Sniffed::Video(Container::IsoBmff),
            ),
            ("moviepy_chaplin.mp4", Sniffed::Video(Container::IsoBmff)),
            ("sharp_check.svg", Sniffed::Svg),
            ("chorus_not_an_image.jpg", Sniffed::Unknown),
            ("pillow_heif_empty.heic", Sniffed::Empty),
        ];
        for (name, want) in cases {
            assert_eq!(sniff_file(&corpus(name)).unwrap(), want, "{name}");
        }
    }
}
