//! A GIF's block structure, walked without decoding: libvips' GIF loader silently drops a
//! frame the file ends in the middle of (a 3 MB animation cut at 1.5 MB loads as 18 whole
//! frames of 35), so a truncated upload would ship as a shorter animation.

use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;

use super::error::MediaError;

/// Fails `Corrupt` when the GIF ends inside a block (a frame, an extension or the header). A
/// file that ends between blocks, without the trailer, is accepted, as decoders and browsers
/// accept it; so is anything after the trailer.
pub fn check_whole(path: &Path) -> Result<(), MediaError> {
    let file = std::fs::File::open(path)?;
    let mut frames = 0;
    match walk(BufReader::new(file), &mut frames) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(MediaError::Corrupt(format!(
            "the GIF is cut off after {frames} whole frames"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Reads blocks up to the trailer (or the end between two blocks), counting image blocks.
fn walk(mut r: impl Read, frames: &mut u32) -> std::io::Result<()> {
    // Header and logical screen descriptor; the global colour table when its flag is set.
    let mut head = [0u8; 13];
    r.read_exact(&mut head)?;
    skip_colour_table(&mut r, head[10])?;
    loop {
        let mut intro = [0u8; 1];
        if r.read(&mut intro)? == 0 {
            return Ok(());
        }
        match intro[0] {
            // Extension: a label, then data sub-blocks.
            0x21 => {
                r.read_exact(&mut [0u8; 1])?;
                skip_sub_blocks(&mut r)?;
            }
            // Image: descriptor, local colour table, LZW code size, data sub-blocks.
            0x2C => {
                let mut desc = [0u8; 9];
                r.read_exact(&mut desc)?;
                skip_colour_table(&mut r, desc[8])?;
                r.read_exact(&mut [0u8; 1])?;
                skip_sub_blocks(&mut r)?;
                *frames += 1;
            }
            // The trailer, or bytes no decoder reads past.
            _ => return Ok(()),
        }
    }
}

/// Skips the colour table a packed-fields byte announces (flag in bit 7, size in bits 0-2).
fn skip_colour_table(r: &mut impl Read, packed: u8) -> std::io::Result<()> {
    if packed & 0x80 != 0 {
        let mut table = [0u8; 3 << 8];
        r.read_exact(&mut table[..3 << ((packed & 7) + 1)])?;
    }
    Ok(())
}

/// Skips sub-blocks (a length byte, then that many bytes) up to the empty one.
fn skip_sub_blocks(r: &mut impl Read) -> std::io::Result<()> {
    let mut buf = [0u8; 256];
    loop {
        r.read_exact(&mut buf[..1])?;
        let len = buf[0] as usize;
        if len == 0 {
            return Ok(());
        }
        r.read_exact(&mut buf[..len])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1 x 1 GIF89a: header, screen with a 2-colour table, a graphic control extension, one
    /// image of 2 bytes of LZW data, the trailer.
    const GIF: [u8; 43] = [
        0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0xFF, 0xFF,
        0xFF, 0x00, 0x00, 0x00, 0x21, 0xF9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2C, 0x00, 0x00,
        0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3B,
    ];

    fn frames(bytes: &[u8]) -> Result<u32, ErrorKind> {
        let mut n = 0;
        walk(bytes, &mut n).map(|_| n).map_err(|e| e.kind())
    }

    #[test]
    fn a_gif_cut_inside_a_block_is_told_from_one_cut_between_blocks() {
        assert_eq!(frames(&GIF), Ok(1));
        // No trailer, or bytes after it: whole.
        assert_eq!(frames(&GIF[..42]), Ok(1));
        assert_eq!(frames(&[&GIF[..], b"junk"].concat()), Ok(1));
        // Cut between the extension and the image: whole, without frames.
        assert_eq!(frames(&GIF[..27]), Ok(0));
        // Cut in the image data, its descriptor, the extension, the colour table or the header.
        for cut in [41, 39, 30, 22, 15, 8] {
            assert_eq!(
                frames(&GIF[..cut]),
                Err(ErrorKind::UnexpectedEof),
                "cut at {cut}"
            );
        }
    }
}
