//! JPEG through jpegli (libjxl's JPEG encoder, vendored and statically linked by `jpegli-sys`):
//! adaptive quantisation on libjpeg's quality scale, plain JPEG that every decoder reads.
//!
//! Measured in issue 57 on the corpus photos at the `variants` widths, from the same libvips
//! pixels, bytes at equal SSIMULACRA2 against libvips' libjpeg-turbo: 0.89x at 70 and 0.88x at
//! 80 (mozjpeg: 0.88x at 70, 0.95x at 80, for 4.5x jpegli's encoding CPU). Its output stays
//! baseline-compatible: Huffman coding (optimised), no arithmetic coding, YCbCr (no XYB), no
//! ICC or other metadata; progressive above [`BASELINE_JPEG_MAX_WIDTH`], sequential at or
//! below, as before.
//!
//! jpegli's API is libjpeg's with a `jpegli_` prefix, so it links beside the libjpeg-turbo that
//! libvips decodes with without a clash. Its errors go through `error_exit`, which must not
//! return: ours unwinds (a panic carrying the message) back to [`encode`], which catches it and
//! frees the encoder. The functions that may call it are declared here as `C-unwind`.

use std::ffi::{c_int, c_uint, c_ulong};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use jpegli_sys::{
    J_COLOR_SPACE, JPEG_LIB_VERSION, boolean, jpegli_common_struct, jpegli_compress_struct,
    jpegli_error_mgr,
};

/// Narrower JPEGs are baseline: progressive scans save about 4 % of bytes but cost about 15 %
/// more CPU per encode, and a small image gains nothing from drawing progressively.
pub const BASELINE_JPEG_MAX_WIDTH: u32 = 640;

/// A failure of the encoder (its message), or an image it does not take.
#[derive(Debug, Clone, thiserror::Error)]
#[error("jpegli: {0}")]
pub struct JpegliError(pub String);

/// jpegli's sequential scan (level 0) and its default progressive script (level 2).
const SEQUENTIAL: c_int = 0;
const PROGRESSIVE: c_int = 2;

unsafe extern "C-unwind" {
    fn jpegli_std_error(err: *mut jpegli_error_mgr) -> *mut jpegli_error_mgr;
    fn jpegli_CreateCompress(cinfo: *mut jpegli_compress_struct, version: c_int, size: usize);
    fn jpegli_mem_dest(
        cinfo: *mut jpegli_compress_struct,
        outbuffer: *mut *mut u8,
        outsize: *mut c_ulong,
    );
    fn jpegli_set_defaults(cinfo: *mut jpegli_compress_struct);
    fn jpegli_set_quality(cinfo: *mut jpegli_compress_struct, quality: c_int, baseline: boolean);
    fn jpegli_set_progressive_level(cinfo: *mut jpegli_compress_struct, level: c_int);
    fn jpegli_start_compress(cinfo: *mut jpegli_compress_struct, write_all_tables: boolean);
    fn jpegli_write_scanlines(
        cinfo: *mut jpegli_compress_struct,
        scanlines: *const *const u8,
        num_lines: c_uint,
    ) -> c_uint;
    fn jpegli_finish_compress(cinfo: *mut jpegli_compress_struct);
    fn jpegli_destroy_compress(cinfo: *mut jpegli_compress_struct);
}

/// The panic payload of [`error_exit`].
struct Failed(String);

/// jpegli's `error_exit`: unwinds to [`encode`] with the message (never returns). jpegli
/// formats every message into `msg_parm.s` (its message code is 0).
unsafe extern "C-unwind" fn error_exit(cinfo: &mut jpegli_common_struct) {
    // SAFETY: jpegli passes its live struct, whose `err` is ours; `s` is a C string of at most
    // 80 bytes (vsnprintf'd into it).
    let message = unsafe {
        let s = &(*cinfo.err).msg_parm.s;
        let bytes: Vec<u8> = s
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    std::panic::panic_any(Failed(message));
}

/// Encodes 8-bit interleaved RGB (`width` x `height`, rows packed) at `quality` (libjpeg's
/// 1-100 scale): 4:4:4 YCbCr, adaptive quantisation, optimised Huffman tables; progressive
/// when wider than [`BASELINE_JPEG_MAX_WIDTH`]. A size JPEG cannot hold (empty, or a side
/// past 65,500) is jpegli's to refuse, through its error exit.
pub fn encode(rgb: &[u8], width: u32, height: u32, quality: u8) -> Result<Vec<u8>, JpegliError> {
    let stride = width as usize * 3;
    if rgb.len() != stride * height as usize {
        return Err(JpegliError(format!(
            "{} bytes for {width}x{height} RGB",
            rgb.len()
        )));
    }
    // SAFETY: zeroed structs are what libjpeg-style APIs expect before jpegli_std_error and
    // jpegli_CreateCompress fill them; both live on this frame until jpegli_destroy_compress.
    let mut err: jpegli_error_mgr = unsafe { std::mem::zeroed() };
    let mut cinfo: jpegli_compress_struct = unsafe { std::mem::zeroed() };
    let mut buf: *mut u8 = std::ptr::null_mut();
    let mut len: c_ulong = 0;
    let run = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the error manager outlives the encoder; every call gets the struct that
        // jpegli_CreateCompress initialised; the rows handed to jpegli_write_scanlines lie in
        // `rgb` (checked above); jpegli only reads them (JSAMPARRAY is not const in C).
        unsafe {
            cinfo.common.err = jpegli_std_error(&mut err);
            err.error_exit = Some(error_exit);
            jpegli_CreateCompress(
                &mut cinfo,
                JPEG_LIB_VERSION,
                std::mem::size_of::<jpegli_compress_struct>(),
            );
            jpegli_mem_dest(&mut cinfo, &mut buf, &mut len);
            cinfo.image_width = width;
            cinfo.image_height = height;
            cinfo.input_components = 3;
            cinfo.in_color_space = J_COLOR_SPACE::JCS_RGB;
            jpegli_set_defaults(&mut cinfo);
            jpegli_set_quality(&mut cinfo, quality.clamp(1, 100) as c_int, 1);
            cinfo.optimize_coding = 1;
            let level = if width > BASELINE_JPEG_MAX_WIDTH {
                PROGRESSIVE
            } else {
                SEQUENTIAL
            };
            jpegli_set_progressive_level(&mut cinfo, level);
            jpegli_start_compress(&mut cinfo, 1);
            while (cinfo.next_scanline as usize) < height as usize {
                let row = rgb.as_ptr().add(cinfo.next_scanline as usize * stride);
                jpegli_write_scanlines(&mut cinfo, &row, 1);
            }
            jpegli_finish_compress(&mut cinfo);
        }
    }));
    // SAFETY: `buf` (malloc'd by jpegli's memory destination, or null) holds `len` bytes; the
    // encoder is destroyed once, whether it finished or unwound.
    let out = unsafe {
        let out = (run.is_ok() && !buf.is_null())
            .then(|| std::slice::from_raw_parts(buf, len as usize).to_vec());
        if !cinfo.common.mem.is_null() {
            jpegli_destroy_compress(&mut cinfo);
        }
        if !buf.is_null() {
            libc::free(buf.cast());
        }
        out
    };
    match run {
        Ok(()) => out.ok_or_else(|| JpegliError("no output".into())),
        Err(payload) => match payload.downcast::<Failed>() {
            Ok(failed) => Err(JpegliError(failed.0)),
            Err(other) => resume_unwind(other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes JPEG cannot hold reach jpegli, whose error exit unwinds to an error with its own
    /// message (not ours, and not the process's exit); the encoder works on after it.
    #[test]
    fn a_size_jpeg_cannot_hold_is_an_error_not_an_exit() {
        let too_wide = vec![0; 65_501 * 3];
        for (rgb, w, h, says) in [
            (&[][..], 0, 0, "Empty input image."),
            (&too_wide[..], 65_501, 1, "Input image too big."),
            (&too_wide[..], 1, 65_501, "Input image too big."),
        ] {
            let e = encode(rgb, w, h, 80).expect_err("not a JPEG size");
            // jpegli's `JPEGLI_ERROR`: "{source file}:{line}: {message}", in 80 bytes.
            assert!(e.0.contains("encode.cc:"), "{w}x{h}: {e}");
            assert!(e.0.ends_with(says), "{w}x{h}: {e}");
        }
        // Bytes that do not match the size are ours to refuse: jpegli would read past them.
        let e = encode(&[0; 3], 1, 2, 80).expect_err("short");
        assert_eq!(e.0, "3 bytes for 1x2 RGB");
        assert!(encode(&[0; 6], 1, 2, 80).is_ok(), "the encoder works on");
    }

    #[test]
    fn encodes_sequential_then_progressive_above_the_baseline_width() {
        let (w, h) = (BASELINE_JPEG_MAX_WIDTH + 8, 16);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
        let wide = encode(&rgb, w, h, 80).unwrap();
        let narrow = encode(&rgb[..(w - 8) as usize * 3 * h as usize], w - 8, h, 80).unwrap();
        // SOF2 (progressive, Huffman) and SOF0 (baseline); never arithmetic coding.
        assert_eq!(frame_marker(&wide), 0xC2);
        assert_eq!(frame_marker(&narrow), 0xC0);
    }

    /// The SOF marker of a JPEG, walking its segments from SOI.
    fn frame_marker(b: &[u8]) -> u8 {
        assert_eq!(&b[..2], &[0xFF, 0xD8]);
        let mut i = 2;
        loop {
            assert_eq!(b[i], 0xFF);
            let m = b[i + 1];
            if (0xC0..=0xCF).contains(&m) && ![0xC4, 0xC8, 0xCC].contains(&m) {
                return m;
            }
            assert_ne!(m, 0xDA, "scan before a frame header");
            i += 2 + u16::from_be_bytes([b[i + 2], b[i + 3]]) as usize;
        }
    }
}
