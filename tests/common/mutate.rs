//! Seeded mutants of real media files (also used by `benches/fuzz.rs`): bit flips,
//! truncations, spliced chunks and inflated header dimensions.

/// How a mutant was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mutation {
    BitFlips,
    Truncation,
    Splice,
    InflatedDimensions,
}

pub const MUTATIONS: [Mutation; 4] = [
    Mutation::BitFlips,
    Mutation::Truncation,
    Mutation::Splice,
    Mutation::InflatedDimensions,
];

/// A mutant of `data` made by `how` with `rng`; `other` is another file, for splices.
pub fn mutate(data: &[u8], other: &[u8], how: Mutation, rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut out = data.to_vec();
    if out.is_empty() {
        return out;
    }
    match how {
        Mutation::BitFlips => {
            // Mostly in the headers, where parsers make their decisions.
            let span = out.len().min(if rng.bool() { 4096 } else { usize::MAX });
            for _ in 0..rng.usize(1..=16) {
                let i = rng.usize(..span);
                out[i] ^= 1 << rng.u8(..8);
            }
        }
        Mutation::Truncation => out.truncate(rng.usize(1..out.len().max(2))),
        Mutation::Splice => {
            // A chunk of another file (or of this one) written over a part of this one.
            let from = if other.is_empty() || rng.bool() {
                data
            } else {
                other
            };
            let len = rng.usize(1..=from.len().min(4096));
            let src = rng.usize(..=from.len() - len);
            let dst = rng.usize(..out.len());
            let end = (dst + len).min(out.len());
            out[dst..end].copy_from_slice(&from[src..src + (end - dst)]);
        }
        Mutation::InflatedDimensions => inflate(&mut out, rng),
    }
    out
}

/// Sets the dimensions a header declares to large values (PNG IHDR with a valid CRC, JPEG SOF,
/// GIF screen and first frame, WebP VP8X canvas), or flips header bits for other formats.
fn inflate(b: &mut [u8], rng: &mut fastrand::Rng) {
    let big = |rng: &mut fastrand::Rng| [65_535u32, 60_000, 40_000, 30_001][rng.usize(..4)];
    if b.starts_with(b"\x89PNG\r\n\x1a\n") && b.len() >= 33 {
        b[16..20].copy_from_slice(&big(rng).to_be_bytes());
        b[20..24].copy_from_slice(&big(rng).to_be_bytes());
        let crc = crc32(&b[12..29]);
        b[29..33].copy_from_slice(&crc.to_be_bytes());
        return;
    }
    if b.starts_with(&[0xFF, 0xD8]) {
        // Walk the markers to the first SOFn: FFCx (not C4, C8, CC), then length, precision,
        // height, width.
        let mut i = 2;
        while i + 9 < b.len() && b[i] == 0xFF {
            let marker = b[i + 1];
            let len = u16::from_be_bytes([b[i + 2], b[i + 3]]) as usize;
            if (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker) {
                let (h, w) = (big(rng) as u16, big(rng) as u16);
                b[i + 5..i + 7].copy_from_slice(&h.to_be_bytes());
                b[i + 7..i + 9].copy_from_slice(&w.to_be_bytes());
                return;
            }
            i += 2 + len;
        }
    }
    if (b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a")) && b.len() >= 10 {
        let (w, h) = (big(rng) as u16, big(rng) as u16);
        b[6..8].copy_from_slice(&w.to_le_bytes());
        b[8..10].copy_from_slice(&h.to_le_bytes());
        return;
    }
    if b.len() >= 30 && &b[0..4] == b"RIFF" && &b[12..16] == b"VP8X" {
        // Canvas width - 1 and height - 1, 24 bits each: 16383 x 16383 is WebP's largest.
        b[24..27].copy_from_slice(&16_382u32.to_le_bytes()[..3]);
        b[27..30].copy_from_slice(&16_382u32.to_le_bytes()[..3]);
        return;
    }
    for _ in 0..4 {
        let i = rng.usize(..b.len().min(64));
        b[i] = 0xFF;
    }
}

/// CRC-32 (ISO-HDLC), as PNG chunks use it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
