//! A small, owning FFI layer over the few libvips calls we use.
//!
//! The `libvips` crate is generated from libvips 8.18; against Debian's 8.14 its `*_with_opts`
//! calls fail at run time (unknown properties). The C API is variadic (`name, value, ..., NULL`),
//! which Rust can call directly, so we declare what we need here and wrap images in [`Image`],
//! whose `Drop` unrefs. Every failing call turns the libvips error buffer into a [`VipsError`].
//!
//! Conventions for variadic options: gint / gboolean / enums as `c_int`, gdouble as `c_double`,
//! strings as `*const c_char`, and the list always ends with a null pointer.

use std::ffi::{CStr, CString, c_char, c_double, c_int, c_void};
use std::path::Path;
use std::ptr;
use std::sync::Once;

use crate::contract::OutputFormat;

#[repr(C)]
struct RawImage {
    _private: [u8; 0],
}

type GLogFunc = extern "C" fn(*const c_char, c_int, *const c_char, *mut c_void);

unsafe extern "C" {
    fn vips_init(argv0: *const c_char) -> c_int;
    fn vips_concurrency_set(n: c_int);
    fn vips_cache_set_max(n: c_int);
    fn vips_block_untrusted_set(state: c_int);
    fn vips_operation_block_set(name: *const c_char, state: c_int);
    fn vips_error_buffer_copy() -> *mut c_char;
    fn g_free(p: *mut c_void);
    fn g_type_class_ref(t: usize) -> *mut c_void;
    fn vips_operation_get_type() -> usize;
    fn vips_type_map_all(
        base: usize,
        f: extern "C" fn(usize, *mut c_void) -> *mut c_void,
        a: *mut c_void,
    ) -> *mut c_void;
    fn g_object_unref(p: *mut c_void);
    fn g_log_set_handler(
        domain: *const c_char,
        levels: c_int,
        func: GLogFunc,
        data: *mut c_void,
    ) -> u32;

    fn vips_image_new_from_file(name: *const c_char, ...) -> *mut RawImage;
    fn vips_image_get_width(im: *const RawImage) -> c_int;
    fn vips_image_get_height(im: *const RawImage) -> c_int;
    fn vips_image_get_bands(im: *const RawImage) -> c_int;
    fn vips_image_get_format(im: *const RawImage) -> c_int;
    fn vips_image_get_interpretation(im: *const RawImage) -> c_int;
    fn vips_image_get_n_pages(im: *mut RawImage) -> c_int;
    fn vips_image_get_page_height(im: *mut RawImage) -> c_int;
    fn vips_image_get_array_int(
        im: *mut RawImage,
        name: *const c_char,
        out: *mut *mut c_int,
        n: *mut c_int,
    ) -> c_int;
    fn vips_image_hasalpha(im: *mut RawImage) -> c_int;
    fn vips_image_get_typeof(im: *const RawImage, name: *const c_char) -> usize;
    fn vips_image_get_int(im: *const RawImage, name: *const c_char, out: *mut c_int) -> c_int;
    fn vips_image_get_blob(
        im: *const RawImage,
        name: *const c_char,
        data: *mut *const c_void,
        len: *mut usize,
    ) -> c_int;
    fn vips_image_copy_memory(im: *mut RawImage) -> *mut RawImage;
    fn vips_image_get_fields(im: *mut RawImage) -> *mut *mut c_char;
    fn vips_image_remove(im: *mut RawImage, name: *const c_char) -> c_int;
    fn g_strfreev(v: *mut *mut c_char);
    fn vips_copy(input: *mut RawImage, out: *mut *mut RawImage, ...) -> c_int;
    fn vips_image_write_to_memory(im: *mut RawImage, size: *mut usize) -> *mut c_void;
    fn vips_image_get_data(im: *mut RawImage) -> *const c_void;
    fn vips_foreign_find_load(filename: *const c_char) -> *const c_char;

    fn vips_thumbnail(filename: *const c_char, out: *mut *mut RawImage, width: c_int, ...)
    -> c_int;
    fn vips_thumbnail_image(
        input: *mut RawImage,
        out: *mut *mut RawImage,
        width: c_int,
        ...
    ) -> c_int;
    fn vips_resize(input: *mut RawImage, out: *mut *mut RawImage, scale: c_double, ...) -> c_int;
    fn vips_colourspace(input: *mut RawImage, out: *mut *mut RawImage, space: c_int, ...) -> c_int;
    fn vips_cast(input: *mut RawImage, out: *mut *mut RawImage, format: c_int, ...) -> c_int;
    fn vips_icc_transform(
        input: *mut RawImage,
        out: *mut *mut RawImage,
        output_profile: *const c_char,
        ...
    ) -> c_int;
    fn vips_autorot(input: *mut RawImage, out: *mut *mut RawImage, ...) -> c_int;
    fn vips_flatten(input: *mut RawImage, out: *mut *mut RawImage, ...) -> c_int;
    fn vips_extract_area(
        input: *mut RawImage,
        out: *mut *mut RawImage,
        left: c_int,
        top: c_int,
        width: c_int,
        height: c_int,
        ...
    ) -> c_int;
    fn vips_embed(
        input: *mut RawImage,
        out: *mut *mut RawImage,
        x: c_int,
        y: c_int,
        width: c_int,
        height: c_int,
        ...
    ) -> c_int;
    fn vips_array_double_newv(n: c_int, ...) -> *mut c_void;
    fn vips_area_unref(area: *mut c_void);

    fn vips_image_new_from_buffer(
        buf: *const c_void,
        len: usize,
        option_string: *const c_char,
        ...
    ) -> *mut RawImage;
    fn vips_webpsave_buffer(
        input: *mut RawImage,
        buf: *mut *mut c_void,
        len: *mut usize,
        ...
    ) -> c_int;
    fn vips_heifsave_buffer(
        input: *mut RawImage,
        buf: *mut *mut c_void,
        len: *mut usize,
        ...
    ) -> c_int;
}

// Enum values from libvips 8.14's headers.
const ACCESS_SEQUENTIAL: c_int = 1;
const FAIL_ON_TRUNCATED: c_int = 1;
const SIZE_DOWN: c_int = 2;
const INTENT_PERCEPTUAL: c_int = 0;
const INTERPRETATION_CMYK: c_int = 15;
const INTERPRETATION_SRGB: c_int = 22;
const FORMAT_UCHAR: c_int = 0;
const HEIF_COMPRESSION_AV1: c_int = 4;
const SUBSAMPLE_OFF: c_int = 2;
/// libwebp's `method`: 5 of 0-6. In `make bench-quality`, 4 (libvips' default) made 0.4 % more
/// bytes than sharp at a better score; 5 makes 1.8 % fewer for 13 % more encoding CPU; 6 costs
/// three times the CPU of 4.
pub const WEBP_EFFORT: u8 = 5;
/// libvips' largest coordinate: "no limit" for the height of a width-constrained thumbnail.
const MAX_COORD: c_int = 10_000_000;
const G_LOG_LEVEL_WARNING: c_int = 1 << 4;
const G_LOG_LEVEL_MESSAGE: c_int = 1 << 5;

const END: *const c_char = ptr::null();
const TRUE: c_int = 1;

/// A libvips failure, with the text of its error buffer.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct VipsError(pub String);

type Result<T> = std::result::Result<T, VipsError>;

/// Takes (and clears) the libvips error buffer. The buffer is process-wide, so under concurrency
/// it may also hold another job's text; the copy-and-clear keeps each message with one failure.
fn last_error(context: &str) -> VipsError {
    // SAFETY: vips_error_buffer_copy returns a newly allocated string (or null) that we free.
    let text = unsafe {
        let p = vips_error_buffer_copy();
        if p.is_null() {
            String::new()
        } else {
            let s = CStr::from_ptr(p).to_string_lossy().trim().to_owned();
            g_free(p.cast());
            s
        }
    };
    let text = text.lines().last().unwrap_or("").to_owned();
    VipsError(if text.is_empty() {
        context.to_owned()
    } else {
        format!("{context}: {text}")
    })
}

extern "C" fn log_to_tracing(
    domain: *const c_char,
    _level: c_int,
    message: *const c_char,
    _data: *mut c_void,
) {
    let text = |p: *const c_char| {
        // SAFETY: GLib passes valid NUL-terminated strings (or null for the domain).
        if p.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    tracing::debug!(domain = %text(domain), "libvips: {}", text(message));
}

/// Starts libvips once per process. `threads` is libvips' own worker-thread count per pipeline:
/// the job pool already has one permit per core, so 1 avoids oversubscribing the CPU.
pub fn init(threads: usize) {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let name = CString::new("media-worker").unwrap();
        // SAFETY: plain libvips/GLib set-up calls with valid arguments, run once.
        unsafe {
            assert_eq!(vips_init(name.as_ptr()), 0, "vips_init failed");
            // Decoder warnings (truncation, nclx...) go to our logs instead of raw stderr.
            let domain = CString::new("VIPS").unwrap();
            g_log_set_handler(
                domain.as_ptr(),
                G_LOG_LEVEL_WARNING | G_LOG_LEVEL_MESSAGE,
                log_to_tracing,
                ptr::null_mut(),
            );
            // Every job reads a different file: the operation cache only holds memory.
            vips_cache_set_max(0);
            // Only the loaders of the formats we accept can run (`sniff` and `probe` pick the
            // format; this makes sure no other parser ever sees the bytes): no SVG, PDF,
            // ImageMagick, Matlab, FITS, raw or CSV, and nothing libvips marks untrusted.
            vips_block_untrusted_set(TRUE);
            vips_operation_block_set(c"VipsForeignLoad".as_ptr(), TRUE);
            for loader in ALLOWED_LOADERS {
                vips_operation_block_set(loader.as_ptr(), 0);
            }
        }
    });
    // SAFETY: sets a global integer.
    unsafe { vips_concurrency_set(threads.max(1) as c_int) };
}

/// Initialises every operation class now (GObject does it on first use, and a job process
/// forked from a fork server would otherwise do it again for each job). Runs nothing: no
/// thread starts, no file is read.
pub fn init_classes() {
    extern "C" fn class_ref(t: usize, _: *mut c_void) -> *mut c_void {
        // SAFETY: `t` is a registered GType; a class reference is never dropped, as GObject's
        // own classes are not.
        unsafe { g_type_class_ref(t) };
        ptr::null_mut()
    }
    // SAFETY: libvips is initialised (`init`); the callback only references classes.
    unsafe { vips_type_map_all(vips_operation_get_type(), class_ref, ptr::null_mut()) };
}

/// The loader classes that may run (and their file, buffer and source subclasses).
const ALLOWED_LOADERS: [&CStr; 6] = [
    c"VipsForeignLoadJpeg",
    c"VipsForeignLoadPng",
    c"VipsForeignLoadNsgif",
    c"VipsForeignLoadWebp",
    c"VipsForeignLoadTiff",
    c"VipsForeignLoadHeif",
];

fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| VipsError(format!("path contains NUL: {}", path.display())))
}

/// The loader libvips would pick for a file, by sniffing its bytes (e.g. `jpegload`).
pub fn find_loader(path: &Path) -> Result<String> {
    let c = cstring(path)?;
    // SAFETY: returns a static string owned by libvips, or null.
    let p = unsafe { vips_foreign_find_load(c.as_ptr()) };
    if p.is_null() {
        return Err(last_error("not a known file format"));
    }
    // SAFETY: non-null static NUL-terminated string.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// An owned libvips image reference.
pub struct Image(*mut RawImage);

// SAFETY: a VipsImage reference may move between threads; we never share one mutably.
unsafe impl Send for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: we own exactly one reference.
        unsafe { g_object_unref(self.0.cast()) }
    }
}

/// A libvips call's return code: 0, or the error it left.
/// A new image reference from libvips, or the error it left when there is none.
fn adopt(p: *mut RawImage, context: &str) -> Result<Image> {
    if p.is_null() {
        Err(last_error(context))
    } else {
        Ok(Image(p))
    }
}

/// Runs a libvips call that writes `*out`, wrapping the result.
fn produce(context: &str, f: impl FnOnce(*mut *mut RawImage) -> c_int) -> Result<Image> {
    let mut out: *mut RawImage = ptr::null_mut();
    if f(&mut out) != 0 || out.is_null() {
        return Err(last_error(context));
    }
    Ok(Image(out))
}

impl Image {
    /// Opens a file for its header only (pixels are not decoded until needed).
    pub fn open_header(path: &Path) -> Result<Image> {
        let c = cstring(path)?;
        // SAFETY: variadic call with a valid option list terminated by NULL.
        let p = unsafe {
            vips_image_new_from_file(c.as_ptr(), c"access".as_ptr(), ACCESS_SEQUENTIAL, END)
        };
        adopt(p, "cannot read header")
    }

    /// Opens every frame of an animated file (GIF, WebP) as one tall strip of frames (see
    /// [`Image::page_height`]), with its `delay` and `loop` fields. Truncated input fails.
    pub fn open_frames(path: &Path) -> Result<Image> {
        let c = cstring(path)?;
        // SAFETY: variadic call with options of gifload and webpload, terminated by NULL.
        let p = unsafe {
            vips_image_new_from_file(
                c.as_ptr(),
                c"n".as_ptr(),
                -1 as c_int,
                c"fail_on".as_ptr(),
                FAIL_ON_TRUNCATED,
                END,
            )
        };
        adopt(p, "cannot decode image")
    }

    /// The height of one frame of a strip of frames ([`Image::open_frames`]).
    pub fn page_height(&self) -> u32 {
        // SAFETY: valid image pointer.
        unsafe { vips_image_get_page_height(self.0) as u32 }
    }

    /// The `delay` of each frame of an animation, in milliseconds (empty when absent).
    pub fn delays(&self) -> Vec<u32> {
        let (mut p, mut n): (*mut c_int, c_int) = (ptr::null_mut(), 0);
        // SAFETY: valid image; on success `p` points to `n` ints owned by the image.
        unsafe {
            if vips_image_get_typeof(self.0, c"delay".as_ptr()) == 0
                || vips_image_get_array_int(self.0, c"delay".as_ptr(), &mut p, &mut n) != 0
                || p.is_null()
            {
                return Vec::new();
            }
            std::slice::from_raw_parts(p, n.max(0) as usize)
                .iter()
                .map(|d| (*d).max(0) as u32)
                .collect()
        }
    }

    /// How many times an animation plays (0: forever; 0 when the file does not say).
    pub fn loop_count(&self) -> u32 {
        let mut v: c_int = 0;
        // SAFETY: valid pointer and NUL-terminated field name; `v` is only read on success.
        unsafe {
            if vips_image_get_typeof(self.0, c"loop".as_ptr()) != 0
                && vips_image_get_int(self.0, c"loop".as_ptr(), &mut v) == 0
            {
                return v.max(0) as u32;
            }
        }
        0
    }

    /// Opens a file for random access with full decoding (tests and small helpers).
    pub fn open(path: &Path) -> Result<Image> {
        let c = cstring(path)?;
        // SAFETY: variadic call terminated by NULL.
        let p = unsafe { vips_image_new_from_file(c.as_ptr(), END) };
        adopt(p, "cannot open image")
    }

    /// Decodes `path` once, shrunk on load to `width` (never upscaled) and upright per EXIF
    /// (HEIF's own `irot` is applied by libheif and its EXIF tag dropped, so never twice).
    ///
    /// A source with an embedded ICC profile (`tagged`) is converted to sRGB with perceptual
    /// intent (needed by XYB JPEGs; the same as relative for matrix profiles such as Adobe RGB
    /// or Display P3). An untagged source is sRGB by the web's convention and keeps its values:
    /// libvips' export from its own sRGB space through the built-in profile darkens shadows
    /// (mean luma about 10 % lower). Truncated input fails.
    ///
    /// A HEIF/AVIF file (`heif`) is decoded from its primary image: libvips' thumbnail from a
    /// file would take an embedded thumbnail instead when that is large enough, and a crafted
    /// file can embed a different picture there.
    pub fn thumbnail(path: &Path, width: u32, tagged: bool, heif: bool) -> Result<Image> {
        let c = cstring(path)?;
        let width = width.min(MAX_COORD as u32) as c_int;
        let primary = if heif {
            // SAFETY: variadic call with heifload's options, terminated by NULL.
            let p = unsafe {
                vips_image_new_from_file(
                    c.as_ptr(),
                    c"access".as_ptr(),
                    ACCESS_SEQUENTIAL,
                    c"fail_on".as_ptr(),
                    FAIL_ON_TRUNCATED,
                    c"thumbnail".as_ptr(),
                    0 as c_int,
                    END,
                )
            };
            if p.is_null() {
                return Err(last_error("cannot decode image"));
            }
            Some(Image(p))
        } else {
            None
        };
        produce("cannot decode image", |out| unsafe {
            // SAFETY: option names and value types match vips_thumbnail's (and
            // vips_thumbnail_image's) arguments; each list ends with NULL (a shorter list ends
            // early at the `export_profile` slot).
            let (profile_key, profile) = if tagged {
                (c"export_profile".as_ptr(), c"srgb".as_ptr())
            } else {
                (END, END)
            };
            match &primary {
                Some(img) => vips_thumbnail_image(
                    img.0,
                    out,
                    width,
                    c"height".as_ptr(),
                    MAX_COORD,
                    c"size".as_ptr(),
                    SIZE_DOWN,
                    c"intent".as_ptr(),
                    INTENT_PERCEPTUAL,
                    profile_key,
                    profile,
                    END,
                ),
                None => vips_thumbnail(
                    c.as_ptr(),
                    out,
                    width,
                    c"height".as_ptr(),
                    MAX_COORD,
                    c"size".as_ptr(),
                    SIZE_DOWN,
                    c"intent".as_ptr(),
                    INTENT_PERCEPTUAL,
                    c"fail_on".as_ptr(),
                    FAIL_ON_TRUNCATED,
                    profile_key,
                    profile,
                    END,
                ),
            }
        })
    }

    /// Decodes a CMYK file with an embedded profile: whole, converted to sRGB through the
    /// profile with perceptual intent, then shrunk to `width` (never upscaled) and made upright.
    /// libvips 8.14's thumbnail converts CMYK with `colourspace` before shrinking and ignores
    /// the intent there (mean luma 2.7 below ImageCms on a SWOP photo).
    pub fn thumbnail_cmyk(path: &Path, width: u32) -> Result<Image> {
        let c = cstring(path)?;
        // SAFETY: variadic call terminated by NULL.
        let p = unsafe {
            vips_image_new_from_file(
                c.as_ptr(),
                c"access".as_ptr(),
                ACCESS_SEQUENTIAL,
                c"fail_on".as_ptr(),
                FAIL_ON_TRUNCATED,
                END,
            )
        };
        if p.is_null() {
            return Err(last_error("cannot decode image"));
        }
        let cmyk = Image(p);
        let orientation = cmyk.orientation();
        let srgb = produce("icc_transform", |out| unsafe {
            // SAFETY: valid image; option names and types match icc_transform's arguments.
            vips_icc_transform(
                cmyk.0,
                out,
                c"srgb".as_ptr(),
                c"intent".as_ptr(),
                INTENT_PERCEPTUAL,
                c"embedded".as_ptr(),
                TRUE,
                c"depth".as_ptr(),
                8 as c_int,
                END,
            )
        })?;
        // `width` is upright: the stored image is turned a quarter for orientations 5-8.
        let stored_width = if orientation >= 5 {
            srgb.height()
        } else {
            srgb.width()
        };
        let shrunk = if width < stored_width {
            srgb.resize(width as f64 / stored_width as f64)?
        } else {
            srgb
        };
        if orientation == 1 {
            return Ok(shrunk);
        }
        let whole = shrunk.into_memory()?;
        produce("autorot", |out| unsafe {
            // SAFETY: valid image (with its orientation tag); option list terminated.
            vips_autorot(whole.0, out, END)
        })
    }

    /// Whether the file's pixels are CMYK.
    pub fn is_cmyk(&self) -> bool {
        // SAFETY: valid image pointer.
        unsafe { vips_image_get_interpretation(self.0) == INTERPRETATION_CMYK }
    }

    /// A copy (sharing the pixels) with no metadata at all: no EXIF, XMP, IPTC, ICC profile,
    /// comments or orientation. Savers then have nothing of the uploader's to write; libvips
    /// 8.14's `strip` is not honoured by every saver (webpsave kept EXIF, XMP and ICC).
    pub fn without_metadata(&self) -> Result<Image> {
        let copy = produce("copy", |out| unsafe {
            // SAFETY: valid image; option list terminated.
            vips_copy(self.0, out, END)
        })?;
        for name in copy.fields() {
            let name = CString::new(name).expect("field names have no NUL");
            // SAFETY: valid image; removing a field that is not metadata (width...) is a no-op.
            unsafe { vips_image_remove(copy.0, name.as_ptr()) };
        }
        Ok(copy)
    }

    /// A metadata blob of the image (`exif-data`, `xmp-data`, `iptc-data`), copied.
    pub fn blob(&self, name: &CStr) -> Option<Vec<u8>> {
        let (mut data, mut len) = (ptr::null::<c_void>(), 0usize);
        // SAFETY: valid image and NUL-terminated name; libvips checks the field's type first.
        unsafe {
            if vips_image_get_typeof(self.0, name.as_ptr()) == 0
                || vips_image_get_blob(self.0, name.as_ptr(), &mut data, &mut len) != 0
                || data.is_null()
            {
                return None;
            }
            // SAFETY: the image owns `len` bytes at `data` while it lives; copied now.
            Some(std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec())
        }
    }

    /// Whether the file embeds an ICC profile.
    pub fn has_icc_profile(&self) -> bool {
        // SAFETY: valid image pointer and NUL-terminated field name.
        unsafe { vips_image_get_typeof(self.0, c"icc-profile-data".as_ptr()) != 0 }
    }

    /// The names of the image's header and metadata fields (e.g. `exif-data`), for checks.
    pub fn fields(&self) -> Vec<String> {
        let mut names = Vec::new();
        // SAFETY: a NULL-terminated array of strings that we own and free with g_strfreev.
        unsafe {
            let fields = vips_image_get_fields(self.0);
            if !fields.is_null() {
                let mut i = 0;
                while !(*fields.add(i)).is_null() {
                    names.push(
                        CStr::from_ptr(*fields.add(i))
                            .to_string_lossy()
                            .into_owned(),
                    );
                    i += 1;
                }
                g_strfreev(fields);
            }
        }
        names
    }

    pub fn width(&self) -> u32 {
        // SAFETY: valid image pointer.
        unsafe { vips_image_get_width(self.0) as u32 }
    }
    pub fn height(&self) -> u32 {
        // SAFETY: valid image pointer.
        unsafe { vips_image_get_height(self.0) as u32 }
    }
    pub fn bands(&self) -> u32 {
        // SAFETY: valid image pointer.
        unsafe { vips_image_get_bands(self.0) as u32 }
    }
    pub fn has_alpha(&self) -> bool {
        // SAFETY: valid image pointer.
        unsafe { vips_image_hasalpha(self.0) != 0 }
    }
    /// Number of frames (pages) in the file; 1 for still images.
    pub fn pages(&self) -> u32 {
        // SAFETY: valid image pointer.
        unsafe { vips_image_get_n_pages(self.0).max(1) as u32 }
    }
    /// EXIF orientation 1-8 (1 when absent).
    pub fn orientation(&self) -> u8 {
        let mut v: c_int = 1;
        // SAFETY: valid pointer and NUL-terminated field name; `v` is only read on success.
        unsafe {
            if vips_image_get_typeof(self.0, c"orientation".as_ptr()) != 0
                && vips_image_get_int(self.0, c"orientation".as_ptr(), &mut v) == 0
            {
                return v.clamp(1, 8) as u8;
            }
        }
        1
    }

    /// Renders the image into memory, so that it can be read several times (encoding one
    /// sequential image twice fails with "out of order read").
    pub fn into_memory(self) -> Result<Image> {
        // SAFETY: returns a new reference or null.
        let p = unsafe { vips_image_copy_memory(self.0) };
        adopt(p, "cannot render image")
    }

    /// Converts to 8-bit sRGB (CMYK, Lab, grey and 16-bit inputs included).
    pub fn to_srgb8(&self) -> Result<Image> {
        let srgb = produce("colourspace", |out| unsafe {
            // SAFETY: valid image; option list terminated.
            vips_colourspace(self.0, out, INTERPRETATION_SRGB, END)
        })?;
        // SAFETY: valid image pointer.
        if unsafe { vips_image_get_format(srgb.0) } == FORMAT_UCHAR {
            return Ok(srgb);
        }
        produce("cast", |out| unsafe {
            // SAFETY: valid image; option list terminated.
            vips_cast(srgb.0, out, FORMAT_UCHAR, END)
        })
    }

    /// Composites alpha onto an opaque RGB background (for formats without alpha).
    pub fn flatten(&self, rgb: [f64; 3]) -> Result<Image> {
        // SAFETY: creates a VipsArrayDouble that we unref after use.
        let bg = unsafe { vips_array_double_newv(3, rgb[0], rgb[1], rgb[2]) };
        let r = produce("flatten", |out| unsafe {
            // SAFETY: valid image and array; option list terminated.
            vips_flatten(self.0, out, c"background".as_ptr(), bg, END)
        });
        // SAFETY: we own the array's reference.
        unsafe { vips_area_unref(bg) };
        r
    }

    /// Turns the image upright per its `orientation` field (and removes the field).
    pub fn autorot(&self) -> Result<Image> {
        produce("autorot", |out| unsafe {
            // SAFETY: valid image; option list terminated.
            vips_autorot(self.0, out, END)
        })
    }

    /// Scales by `scale` (a reduce, with libvips' default lanczos3 kernel).
    pub fn resize(&self, scale: f64) -> Result<Image> {
        produce("resize", |out| unsafe {
            // SAFETY: valid image; option list terminated.
            vips_resize(self.0, out, scale, END)
        })
    }

    /// Scales to exactly `width` x `height` (a reduce with the default kernel, as [`resize`]).
    ///
    /// [`resize`]: Image::resize
    pub fn resize_to(&self, width: u32, height: u32) -> Result<Image> {
        let hscale = width as f64 / self.width() as f64;
        let vscale = height as f64 / self.height() as f64;
        produce("resize", |out| unsafe {
            // SAFETY: valid image; option names and types match resize's; list terminated.
            vips_resize(self.0, out, hscale, c"vscale".as_ptr(), vscale, END)
        })
    }

    /// Cuts out a rectangle.
    pub fn extract(&self, left: u32, top: u32, width: u32, height: u32) -> Result<Image> {
        produce("extract_area", |out| unsafe {
            // SAFETY: valid image; libvips checks the bounds.
            vips_extract_area(
                self.0,
                out,
                left as c_int,
                top as c_int,
                width as c_int,
                height as c_int,
                END,
            )
        })
    }

    /// Places the image at (x, y) on a black canvas of `width` x `height`.
    pub fn embed(&self, x: u32, y: u32, width: u32, height: u32) -> Result<Image> {
        produce("embed", |out| unsafe {
            // SAFETY: valid image; option list terminated.
            vips_embed(
                self.0,
                out,
                x as c_int,
                y as c_int,
                width as c_int,
                height as c_int,
                END,
            )
        })
    }

    /// Raw interleaved pixels (band-format as stored), e.g. for analysis or comparison.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: returns a g_malloc'd buffer of `size` bytes that we copy and free.
        unsafe {
            let p = vips_image_write_to_memory(self.0, &mut size);
            if p.is_null() {
                return Err(last_error("write_to_memory"));
            }
            let v = std::slice::from_raw_parts(p.cast::<u8>(), size).to_vec();
            g_free(p);
            Ok(v)
        }
    }

    /// The interleaved 8-bit pixels of an image in memory ([`Image::into_memory`]), without a
    /// copy. Any other image is computed into memory first.
    pub fn pixels(&self) -> Result<&[u8]> {
        // SAFETY: valid image pointer.
        if unsafe { vips_image_get_format(self.0) } != FORMAT_UCHAR {
            return Err(VipsError("pixels: not an 8-bit image".into()));
        }
        // SAFETY: valid image; the data is owned by the image and lives as long as `self`.
        let p = unsafe { vips_image_get_data(self.0) };
        if p.is_null() {
            return Err(last_error("get_data"));
        }
        let len = self.width() as usize * self.height() as usize * self.bands() as usize;
        // SAFETY: an 8-bit image in memory holds `len` packed bytes.
        Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
    }

    /// Decodes an encoded image held in memory (an encoder's output read back for scoring).
    pub fn from_buffer(bytes: &[u8]) -> Result<Image> {
        // SAFETY: libvips reads `len` bytes, which outlive the image: it is rendered into
        // memory before they are dropped.
        let p = unsafe {
            vips_image_new_from_buffer(bytes.as_ptr().cast(), bytes.len(), c"".as_ptr(), END)
        };
        adopt(p, "cannot decode buffer")?.into_memory()
    }

    /// Encodes as `format` at `quality` and `effort` (libvips' scale: WebP 0-6, AVIF 0-9;
    /// JPEG has none), without metadata.
    pub fn encode(&self, format: OutputFormat, quality: u8, effort: u8) -> Result<Vec<u8>> {
        match format {
            OutputFormat::Jpeg => self.encode_jpeg(quality),
            OutputFormat::Webp => self.encode_webp(quality, effort, super::webpmux::strip),
            OutputFormat::Avif => self.encode_avif(quality, effort),
        }
    }

    /// Encodes (as [`Image::encode`], AVIF at a middling effort) into the file `path`.
    pub fn save(&self, path: &Path, format: OutputFormat, quality: u8) -> Result<()> {
        let bytes = self.encode(format, quality, 4)?;
        std::fs::write(path, bytes).map_err(|e| VipsError(format!("{}: {e}", path.display())))
    }

    /// JPEG through jpegli ([`super::jpegli`]): progressive above
    /// [`super::jpegli::BASELINE_JPEG_MAX_WIDTH`].
    /// The pixels are libvips' 8-bit sRGB; any other image is converted first (alpha composited
    /// on white, as JPEG outputs are).
    fn encode_jpeg(&self, quality: u8) -> Result<Vec<u8>> {
        let converted;
        // SAFETY: valid image pointer.
        let rgb8 = self.bands() == 3 && unsafe { vips_image_get_format(self.0) } == FORMAT_UCHAR;
        let src = if rgb8 {
            self
        } else {
            let srgb = self.to_srgb8()?;
            let opaque = if srgb.has_alpha() {
                srgb.flatten([255.0; 3])?.to_srgb8()?
            } else {
                srgb
            };
            converted = opaque.into_memory()?;
            &converted
        };
        super::jpegli::encode(src.pixels()?, src.width(), src.height(), quality)
            .map_err(|e| VipsError(e.to_string()))
    }

    /// Encodes as lossy WebP in memory; `then` reads libvips' buffer (which may hold metadata
    /// chunks: libvips 8.14 writes them whatever `strip` says) before it is freed.
    pub fn encode_webp<T>(
        &self,
        quality: u8,
        effort: u8,
        then: impl FnOnce(&[u8]) -> std::result::Result<T, String>,
    ) -> Result<T> {
        let bytes = buffer("webpsave", |buf, len| unsafe {
            // SAFETY: option names and types match webpsave's arguments.
            vips_webpsave_buffer(
                self.0,
                buf,
                len,
                c"Q".as_ptr(),
                quality as c_int,
                c"effort".as_ptr(),
                effort.min(6) as c_int,
                c"strip".as_ptr(),
                TRUE,
                END,
            )
        })?;
        then(&bytes).map_err(VipsError)
    }

    /// 8-bit AVIF (AV1 in HEIF), 4:4:4 as sharp's; `effort` 0-9 is libaom's speed 9 - effort.
    /// At sharp's mean SSIMULACRA2, libvips' 4:2:0 took 6 % more bytes than 4:4:4 on 29
    /// corpus outputs (320-1920 px), for 0.8x its CPU.
    fn encode_avif(&self, quality: u8, effort: u8) -> Result<Vec<u8>> {
        buffer("heifsave", |buf, len| unsafe {
            // SAFETY: option names and types match heifsave's arguments.
            vips_heifsave_buffer(
                self.0,
                buf,
                len,
                c"Q".as_ptr(),
                quality as c_int,
                c"compression".as_ptr(),
                HEIF_COMPRESSION_AV1,
                c"bitdepth".as_ptr(),
                8 as c_int,
                c"effort".as_ptr(),
                effort.min(9) as c_int,
                c"subsample_mode".as_ptr(),
                SUBSAMPLE_OFF,
                c"strip".as_ptr(),
                TRUE,
                END,
            )
        })
        .map(|b| b.to_vec())
    }
}

/// A buffer libvips allocated for an encoder's output, freed on drop.
struct Buffer(*mut c_void, usize);

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: libvips handed us `len` bytes at this (non-null) address.
        unsafe { std::slice::from_raw_parts(self.0.cast::<u8>(), self.1) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: a g_malloc'd buffer nothing else refers to.
        unsafe { g_free(self.0) };
    }
}

/// Runs a `*save_buffer` call; its output.
fn buffer(context: &str, f: impl FnOnce(*mut *mut c_void, *mut usize) -> c_int) -> Result<Buffer> {
    let (mut buf, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    if f(&mut buf, &mut len) != 0 || buf.is_null() {
        return Err(last_error(context));
    }
    Ok(Buffer(buf, len))
}
