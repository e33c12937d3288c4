//! WebP containers through libwebpmux (the WebP project's own container library, which libvips
//! uses to write them): metadata removal ([`strip`]), the rights fields a profile keeps
//! ([`set_metadata`]) and animation assembly ([`animate`]).
//!
//! libvips 8.14's webpsave ignores `strip`: its own `strip` field shadows the saver's and is
//! never set, so it always writes EXIF (rebuilt from the image's fields even when the image has
//! none), XMP and the ICC profile. We remove those chunks after encoding; libwebpmux rewrites the
//! VP8X flags to match.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

#[repr(C)]
struct WebPData {
    bytes: *const u8,
    size: usize,
}

#[repr(C)]
struct RawMux {
    _private: [u8; 0],
}

unsafe extern "C" {
    fn WebPMuxCreateInternal(
        data: *const WebPData,
        copy_data: c_int,
        version: c_int,
    ) -> *mut RawMux;
    fn WebPNewInternal(version: c_int) -> *mut RawMux;
    fn WebPMuxDeleteChunk(mux: *mut RawMux, fourcc: *const c_char) -> c_int;
    fn WebPMuxSetChunk(
        mux: *mut RawMux,
        fourcc: *const c_char,
        chunk: *const WebPData,
        copy_data: c_int,
    ) -> c_int;
    fn WebPMuxPushFrame(mux: *mut RawMux, frame: *const FrameInfo, copy_data: c_int) -> c_int;
    fn WebPMuxSetAnimationParams(mux: *mut RawMux, params: *const AnimParams) -> c_int;
    fn WebPMuxSetCanvasSize(mux: *mut RawMux, width: c_int, height: c_int) -> c_int;
    fn WebPMuxAssemble(mux: *mut RawMux, out: *mut WebPData) -> c_int;
    fn WebPMuxDelete(mux: *mut RawMux);
    fn WebPFree(p: *mut c_void);
}

/// `WebPMuxFrameInfo`.
#[repr(C)]
struct FrameInfo {
    bitstream: WebPData,
    x_offset: c_int,
    y_offset: c_int,
    duration: c_int,
    id: c_int,
    dispose_method: c_int,
    blend_method: c_int,
    pad: [u32; 1],
}

/// `WebPMuxAnimParams`.
#[repr(C)]
struct AnimParams {
    bgcolor: u32,
    loop_count: c_int,
}

const CHUNK_ANMF: c_int = 3;
const DISPOSE_NONE: c_int = 0;
const NO_BLEND: c_int = 1;

/// `WEBP_MUX_ABI_VERSION` of the libwebp we build against (1.2.x; checked by the library).
const MUX_ABI_VERSION: c_int = 0x0108;
const MUX_OK: c_int = 1;
const MUX_NOT_FOUND: c_int = 0;

/// The metadata chunks of a WebP file.
const METADATA: [&std::ffi::CStr; 3] = [c"EXIF", c"XMP ", c"ICCP"];

/// One animation frame: a still WebP file (its metadata chunks are not taken), where it goes on
/// the canvas (even offsets) and how long it shows, in milliseconds (0 included: the next frame
/// replaces it at once).
pub struct Frame {
    pub webp: Vec<u8>,
    pub x: u32,
    pub y: u32,
    pub duration_ms: u32,
}

/// An animated WebP of `frames` on a `canvas`, played `loop_count` times (0: forever). Each
/// frame replaces the canvas pixels under it (no blending, so a transparent pixel stays
/// transparent) and leaves the rest as they were. Unlike libwebp's animation encoder, which libvips uses, the mux keeps every frame
/// as given: zero-duration frames are neither dropped nor lengthened, and identical frames are
/// not merged.
pub fn animate(frames: &[Frame], canvas: (u32, u32), loop_count: u32) -> Result<Vec<u8>, String> {
    // SAFETY: the frames' bytes outlive the mux (copy_data = 0, deleted before returning); the
    // assembled buffer is copied, then freed with WebPFree.
    unsafe {
        let mux = WebPNewInternal(MUX_ABI_VERSION);
        if mux.is_null() {
            return Err("webpmux: cannot create a mux".into());
        }
        let mut result = Ok(());
        let (w, h) = (canvas.0 as c_int, canvas.1 as c_int);
        if WebPMuxSetCanvasSize(mux, w, h) != MUX_OK {
            result = Err(format!("webpmux: invalid canvas {w}x{h}"));
        }
        let params = AnimParams {
            bgcolor: 0,
            loop_count: loop_count.min(u16::MAX as u32) as c_int,
        };
        if result.is_ok() && WebPMuxSetAnimationParams(mux, &params) != MUX_OK {
            result = Err("webpmux: cannot set the loop count".into());
        }
        for (i, f) in frames.iter().enumerate() {
            if result.is_err() {
                break;
            }
            let info = FrameInfo {
                bitstream: WebPData {
                    bytes: f.webp.as_ptr(),
                    size: f.webp.len(),
                },
                x_offset: f.x as c_int,
                y_offset: f.y as c_int,
                // ANMF holds 24 bits of duration.
                duration: f.duration_ms.min(0xFF_FFFF) as c_int,
                id: CHUNK_ANMF,
                dispose_method: DISPOSE_NONE,
                blend_method: NO_BLEND,
                pad: [0],
            };
            let rc = WebPMuxPushFrame(mux, &info, 0);
            if rc != MUX_OK {
                result = Err(format!("webpmux: cannot add frame {i} ({rc})"));
            }
        }
        assemble(mux, result)
    }
}

/// Assembles `mux` (unless `result` is already an error) and deletes it.
///
/// # Safety
/// `mux` is a live mux that nothing else deletes.
unsafe fn assemble(mux: *mut RawMux, result: Result<(), String>) -> Result<Vec<u8>, String> {
    let mut out = WebPData {
        bytes: ptr::null(),
        size: 0,
    };
    // SAFETY: per the function's contract; the assembled buffer is copied, then freed.
    unsafe {
        let result = match result {
            Ok(()) if WebPMuxAssemble(mux, &mut out) != MUX_OK => {
                Err("webpmux: cannot assemble".to_owned())
            }
            r => r,
        };
        WebPMuxDelete(mux);
        result?;
        let bytes = std::slice::from_raw_parts(out.bytes, out.size).to_vec();
        WebPFree(out.bytes as *mut c_void);
        Ok(bytes)
    }
}

/// `webp` without EXIF, XMP or ICC chunks (an untagged WebP is sRGB).
pub fn strip(webp: &[u8]) -> Result<Vec<u8>, String> {
    remux(webp, |mux| {
        let mut result = Ok(());
        for fourcc in METADATA {
            // SAFETY: a live mux and a NUL-terminated fourcc.
            let rc = unsafe { WebPMuxDeleteChunk(mux, fourcc.as_ptr()) };
            if rc != MUX_OK && rc != MUX_NOT_FOUND {
                result = Err(format!("webpmux: cannot remove {fourcc:?} ({rc})"));
            }
        }
        result
    })
}

/// `webp` (without metadata) with an EXIF chunk (a TIFF structure) and an XMP chunk.
pub fn set_metadata(
    webp: &[u8],
    exif: Option<&[u8]>,
    xmp: Option<&[u8]>,
) -> Result<Vec<u8>, String> {
    remux(webp, |mux| {
        for (fourcc, data) in [(c"EXIF", exif), (c"XMP ", xmp)] {
            let Some(data) = data else { continue };
            let chunk = WebPData {
                bytes: data.as_ptr(),
                size: data.len(),
            };
            // SAFETY: a live mux; the chunk borrows `data`, which outlives the mux (copy_data
            // = 0 and the mux is deleted before `remux` returns).
            if unsafe { WebPMuxSetChunk(mux, fourcc.as_ptr(), &chunk, 0) } != MUX_OK {
                return Err(format!("webpmux: cannot set {fourcc:?}"));
            }
        }
        Ok(())
    })
}

/// `webp` parsed into a mux, changed by `edit`, and assembled again.
fn remux(
    webp: &[u8],
    edit: impl FnOnce(*mut RawMux) -> Result<(), String>,
) -> Result<Vec<u8>, String> {
    let input = WebPData {
        bytes: webp.as_ptr(),
        size: webp.len(),
    };
    // SAFETY: `input` borrows `webp` for the mux's lifetime (copy_data = 0 and the mux is
    // deleted by `assemble` before returning).
    unsafe {
        let mux = WebPMuxCreateInternal(&input, 0, MUX_ABI_VERSION);
        if mux.is_null() {
            return Err("webpmux: cannot parse the encoded WebP".into());
        }
        let result = edit(mux);
        assemble(mux, result)
    }
}
