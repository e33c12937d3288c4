//! Metadata removal for WebP files, through libwebpmux (the WebP project's own container
//! library, which libvips uses to write them).
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
    fn WebPMuxDeleteChunk(mux: *mut RawMux, fourcc: *const c_char) -> c_int;
    fn WebPMuxAssemble(mux: *mut RawMux, out: *mut WebPData) -> c_int;
    fn WebPMuxDelete(mux: *mut RawMux);
    fn WebPFree(p: *mut c_void);
}

/// `WEBP_MUX_ABI_VERSION` of the libwebp we build against (1.2.x; checked by the library).
const MUX_ABI_VERSION: c_int = 0x0108;
const MUX_OK: c_int = 1;
const MUX_NOT_FOUND: c_int = 0;

/// The metadata chunks of a WebP file.
const METADATA: [&std::ffi::CStr; 3] = [c"EXIF", c"XMP ", c"ICCP"];

/// `webp` without EXIF, XMP or ICC chunks (an untagged WebP is sRGB).
pub fn strip(webp: &[u8]) -> Result<Vec<u8>, String> {
    let input = WebPData {
        bytes: webp.as_ptr(),
        size: webp.len(),
    };
    // SAFETY: `input` borrows `webp` for the mux's lifetime (copy_data = 0 and the mux is
    // deleted before returning); the assembled buffer is copied, then freed with WebPFree.
    unsafe {
        let mux = WebPMuxCreateInternal(&input, 0, MUX_ABI_VERSION);
        if mux.is_null() {
            return Err("webpmux: cannot parse the encoded WebP".into());
        }
        let mut result = Ok(());
        for fourcc in METADATA {
            let rc = WebPMuxDeleteChunk(mux, fourcc.as_ptr());
            if rc != MUX_OK && rc != MUX_NOT_FOUND {
                result = Err(format!("webpmux: cannot remove {fourcc:?} ({rc})"));
            }
        }
        let mut out = WebPData {
            bytes: ptr::null(),
            size: 0,
        };
        if result.is_ok() && WebPMuxAssemble(mux, &mut out) != MUX_OK {
            result = Err("webpmux: cannot assemble".into());
        }
        WebPMuxDelete(mux);
        result?;
        let bytes = std::slice::from_raw_parts(out.bytes, out.size).to_vec();
        WebPFree(out.bytes as *mut c_void);
        Ok(bytes)
    }
}
