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
    /// MPEG transport stream: broadcast, camcorders' `.mts`/`.m2ts` (192-byte packets), screen
    /// recorders' `.ts`.
    MpegTs,
    /// MPEG program stream: `.mpg`, DVD's `.vob`.
    MpegPs,
    /// Flash Video.
    Flv,
    /// ASF: Windows Media's `.wmv`/`.asf`.
    Asf,
    /// MXF: broadcast and professional cameras.
    Mxf,
    /// Ogg (Theora video).
    Ogg,
    /// An animated GIF: sniffed as an image, and only made into MP4 on request
    /// (`Profile::animation_mp4`).
    Gif,
}

impl Container {
    /// Every container, one per line of config/ffmpeg-components (`video::components`).
    pub const ALL: [Container; 10] = [
        Self::IsoBmff,
        Self::Matroska,
        Self::Avi,
        Self::Gif,
        Self::MpegTs,
        Self::MpegPs,
        Self::Flv,
        Self::Asf,
        Self::Mxf,
        Self::Ogg,
    ];

    pub fn demuxer(self) -> &'static str {
        match self {
            Self::IsoBmff => "mov",
            Self::Matroska => "matroska",
            Self::Avi => "avi",
            Self::MpegTs => "mpegts",
            Self::MpegPs => "mpeg",
            Self::Flv => "flv",
            Self::Asf => "asf",
            Self::Mxf => "mxf",
            Self::Ogg => "ogg",
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

/// The bytes [`sniff`] looks at: enough for three MPEG-TS packets of 192 bytes.
const HEAD: usize = 600;

pub fn sniff_file(path: &Path) -> std::io::Result<Sniffed> {
    let mut head = [0u8; HEAD];
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
    if let Some(container) = sniff_stream(b) {
        return Sniffed::Video(container);
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

/// The containers known by a signature at the start (or, for MPEG-TS, by the sync byte of
/// three packets in a row: 188 bytes apart, or 192 with the 4-byte timestamp of `.m2ts`).
fn sniff_stream(b: &[u8]) -> Option<Container> {
    const ASF: [u8; 16] = [
        0x30, 0x26, 0xB2, 0x75, 0x8E, 0x66, 0xCF, 0x11, 0xA6, 0xD9, 0x00, 0xAA, 0x00, 0x62, 0xCE,
        0x6C,
    ];
    // SMPTE 377M's header partition pack: the key's first 13 bytes (then its kind and status).
    const MXF: [u8; 13] = [
        0x06, 0x0E, 0x2B, 0x34, 0x02, 0x05, 0x01, 0x01, 0x0D, 0x01, 0x02, 0x01, 0x01,
    ];
    let synced = |first: usize, size: usize| (0..3).all(|i| b.get(first + i * size) == Some(&0x47));
    if synced(0, 188) || synced(4, 192) {
        Some(Container::MpegTs)
    } else if b.starts_with(&[0x00, 0x00, 0x01, 0xBA]) {
        Some(Container::MpegPs)
    } else if b.starts_with(b"FLV\x01") {
        Some(Container::Flv)
    } else if b.starts_with(&ASF) {
        Some(Container::Asf)
    } else if b.starts_with(&MXF) {
        Some(Container::Mxf)
    } else if b.starts_with(b"OggS") {
        Some(Container::Ogg)
    } else {
        None
    }
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

    #[test]
    fn stream_containers_by_their_signatures() {
        let mut ts = vec![0u8; 600];
        let mut m2ts = ts.clone();
        for i in 0..3 {
            ts[i * 188] = 0x47;
            m2ts[4 + i * 192] = 0x47;
        }
        let mut one_packet = vec![0u8; 600];
        one_packet[0] = 0x47;
        let cases: [(&[u8], Sniffed); 8] = [
            (&ts, Sniffed::Video(Container::MpegTs)),
            (&m2ts, Sniffed::Video(Container::MpegTs)),
            (
                &[0, 0, 1, 0xBA, 0x44, 0, 4],
                Sniffed::Video(Container::MpegPs),
            ),
            (b"FLV\x01\x05\0\0\0\x09", Sniffed::Video(Container::Flv)),
            (
                &[
                    0x30, 0x26, 0xB2, 0x75, 0x8E, 0x66, 0xCF, 0x11, 0xA6, 0xD9, 0x00, 0xAA, 0x00,
                    0x62, 0xCE, 0x6C, 0,
                ],
                Sniffed::Video(Container::Asf),
            ),
            (
                &[
                    0x06, 0x0E, 0x2B, 0x34, 0x02, 0x05, 0x01, 0x01, 0x0D, 0x01, 0x02, 0x01, 0x01,
                    0x02, 0x04, 0x00,
                ],
                Sniffed::Video(Container::Mxf),
            ),
            (b"OggS\0\x02", Sniffed::Video(Container::Ogg)),
            // One sync byte is not a transport stream.
            (&one_packet, Sniffed::Unknown),
        ];
        for (bytes, want) in cases {
            assert_eq!(sniff(bytes), want, "{:02x?}", &bytes[..8.min(bytes.len())]);
        }
    }
}
