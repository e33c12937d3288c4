//! The demo's gallery page: `index.html` in the demo's work directory, written from the
//! responses with the template this binary carries (`gallery.html`). One card per input: its
//! outputs as served (files of the local store, by relative paths), its analysis drawn (face
//! boxes and the focal point over the picture, the dominant colour, the BlurHash decoded, the
//! blur verdict, the pHash's bits), its stream in a player with the storyboard as scrub
//! previews, or its error; a summary on top.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::contract::{
    ErrorBody, ImageAnalysis, MediaType, OptimizeResponse, Output, Status, VideoAnalysis,
};

const TEMPLATE: &str = include_str!("gallery.html");
/// The picture of a card fits in this box (CSS pixels).
const STAGE: (u32, u32) = (320, 340);
/// Formats a browser's `<img>` shows (others, such as HEIF and TIFF, are linked).
const BROWSER_IMAGES: [&str; 6] = ["jpeg", "png", "gif", "webp", "avif", "svg"];

/// What the page is made from.
pub struct Gallery<'a> {
    pub responses: &'a [OptimizeResponse],
    /// Media id → the input file.
    pub inputs: &'a HashMap<String, PathBuf>,
    /// The folder the inputs came from.
    pub input_dir: &'a Path,
    /// The output bucket's folder, relative to the page.
    pub store: &'a str,
    pub profile: &'a str,
    pub blur_threshold: f64,
    pub pool: usize,
    pub wall: Duration,
    /// Whether `hls.min.js` lies beside the page.
    pub hls_js: bool,
}

/// Writes `index.html` (with `sources/` and `blurhash/` beside it) into `work`; returns its path.
pub fn write(g: &Gallery, work: &Path) -> anyhow::Result<PathBuf> {
    let sources = work.join("sources");
    std::fs::create_dir_all(&sources)?;
    for input in g.inputs.values() {
        let link = sources.join(input.file_name().unwrap_or_default());
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(input, &link)?;
        }
    }
    std::fs::create_dir_all(work.join("blurhash"))?;
    let mut cards = String::new();
    for r in g.responses {
        let id = r.media_id.as_deref().unwrap_or("media");
        if let Some(a) = r.analysis.as_ref().and_then(|a| a.image())
            && let Some(v) = &a.vision
        {
            // A hash the page cannot draw leaves the card without its placeholder.
            if let Ok(png) = blurhash_png(&v.blurhash, a.width, a.height) {
                std::fs::write(work.join(format!("blurhash/{id}.png")), png)?;
            }
        }
        card(g, r, work, &mut cards);
    }
    let stored = dir_bytes(&work.join(g.store));
    let html = TEMPLATE
        .replace("{{TITLE}}", &esc(&g.input_dir.display().to_string()))
        .replace("{{SUMMARY}}", &summary(g, stored))
        .replace("{{CARDS}}", &cards)
        .replace("{{VERSION}}", env!("CARGO_PKG_VERSION"))
        .replace(
            "{{HLS}}",
            if g.hls_js {
                r#"<script src="hls.min.js"></script>"#
            } else {
                ""
            },
        );
    let page = work.join("index.html");
    std::fs::write(&page, html)?;
    std::fs::write(
        work.join("responses.json"),
        serde_json::to_vec_pretty(g.responses)?,
    )?;
    Ok(page)
}

fn summary(g: &Gallery, stored: u64) -> String {
    let count = |s: Status| g.responses.iter().filter(|r| r.status == s).count();
    let kind = |t: MediaType| {
        g.responses
            .iter()
            .filter(|r| r.media_type == Some(t))
            .count()
    };
    let bytes_in: u64 = g
        .responses
        .iter()
        .filter_map(|r| r.source.as_ref()?.size_bytes)
        .sum();
    let outputs: usize = g.responses.iter().map(|r| r.outputs.len()).sum();
    let bytes_out: u64 = g
        .responses
        .iter()
        .flat_map(|r| &r.outputs)
        .map(|o| o.size_bytes)
        .sum();
    let job_ms: u64 = g.responses.iter().map(|r| r.duration_ms).sum();
    format!(
        r#"<header class="summary" id="summary">
<h1>media-worker demo</h1>
<p>{n} inputs from <code>{dir}</code> with profile <code>{profile}</code>: answered in <b>{wall:.1} s</b> ({pool} jobs at once; {job:.1} s of job time)</p>
<ul class="counts">
<li class="completed"><b data-count="completed">{completed}</b>completed</li>
<li class="degraded"><b data-count="degraded">{degraded}</b>degraded</li>
<li class="failed"><b data-count="failed">{failed}</b>failed</li>
<li><b>{images}</b>images · <b>{videos}</b>videos</li>
<li>in <b>{bytes_in}</b></li>
<li>out <b>{bytes_out}</b> in {outputs} outputs ({stored} stored with segments and playlists)</li>
</ul>
</header>"#,
        n = g.responses.len(),
        dir = esc(&g.input_dir.display().to_string()),
        profile = esc(g.profile),
        wall = g.wall.as_secs_f64(),
        pool = g.pool,
        job = job_ms as f64 / 1000.0,
        completed = count(Status::Completed),
        degraded = count(Status::Degraded),
        failed = count(Status::Failed),
        images = kind(MediaType::Image),
        videos = kind(MediaType::Video),
        bytes_in = human(bytes_in),
        bytes_out = human(bytes_out),
        stored = human(stored),
    )
}

fn card(g: &Gallery, r: &OptimizeResponse, work: &Path, out: &mut String) {
    let id = r.media_id.as_deref().unwrap_or("media");
    let input = g.inputs.get(id);
    let name = input
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| id.to_owned());
    let status = r.status.as_str();
    let source_bytes = r.source.as_ref().and_then(|s| s.size_bytes);
    let _ = write!(
        out,
        r#"<section class="card" id="m-{id}" data-media-id="{id}" data-status="{status}">
<header><h2>{name}</h2><span class="badge {status}">{status}</span>{replayed}<span class="meta">{kind}{bytes} · {ms} ms · {attempts} attempt{s}</span></header>
"#,
        id = esc(id),
        name = esc(&name),
        replayed = if r.replayed {
            r#"<span class="badge replayed">replayed</span>"#
        } else {
            ""
        },
        kind = r
            .media_type
            .map(|t| format!("{} · ", t.as_str()))
            .unwrap_or_default(),
        bytes = source_bytes.map(human).unwrap_or_else(|| "?".into()),
        ms = r.duration_ms,
        attempts = r.attempts,
        s = if r.attempts == 1 { "" } else { "s" },
    );
    let analysis = r.analysis.as_ref();
    if let Some(e) = &r.error {
        failure(e, out);
    } else if let Some(v) = analysis.and_then(|a| a.video()) {
        out.push_str(r#"<div class="body">"#);
        video_stage(g, r, v, out);
        video_facts(v, out);
        out.push_str("</div>\n");
    } else {
        let image = analysis.and_then(|a| a.image());
        out.push_str(r#"<div class="body">"#);
        image_stage(g, r, image, work, out);
        if let Some(a) = image {
            image_facts(g, id, a, work, out);
        }
        out.push_str("</div>\n");
    }
    if !r.warnings.is_empty() {
        out.push_str(r#"<ul class="warnings">"#);
        for w in &r.warnings {
            let _ = write!(
                out,
                "<li><code>{}</code> {}</li>",
                w.code.as_str(),
                esc(&w.message)
            );
        }
        out.push_str("</ul>\n");
    }
    out.push_str(r#"<div class="outputs">"#);
    if let Some(input) = input {
        source_tile(r, &name, input, out);
    }
    let mut outputs: Vec<&Output> = r.outputs.iter().collect();
    outputs.sort_by_key(|o| (role_order(&o.role), format_order(&o.format), o.width));
    for o in outputs {
        output_tile(g, o, out);
    }
    out.push_str("</div>\n</section>\n");
}

fn failure(e: &ErrorBody, out: &mut String) {
    let _ = writeln!(
        out,
        r#"<div class="failure"><p class="code">{code}</p><p>stage <b>{stage}</b> · {retry}</p><p class="message">{message}</p></div>"#,
        code = e.code.as_str(),
        stage = e.stage.as_str(),
        retry = if e.retryable {
            "retryable"
        } else {
            "not retryable"
        },
        message = esc(&e.message),
    );
}

/// The picture as a front end serves it (`<picture>` from the response's `srcset`), with the
/// faces and the focal point drawn over it and its BlurHash behind it.
fn image_stage(
    g: &Gallery,
    r: &OptimizeResponse,
    a: Option<&ImageAnalysis>,
    work: &Path,
    out: &mut String,
) {
    let widest = r
        .outputs
        .iter()
        .filter(|o| o.role == "variant")
        .max_by_key(|o| o.width);
    let Some((w, h)) = a
        .map(|a| (a.width, a.height))
        .or(widest.map(|o| (o.width, o.height)))
    else {
        return;
    };
    let (bw, bh) = fit(w, h, STAGE);
    let id = r.media_id.as_deref().unwrap_or("media");
    // The BlurHash waits behind the picture; a picture with alpha would show it through its
    // transparent parts, so it gets the checkerboard instead.
    let alpha = a.is_some_and(|a| a.has_alpha);
    let placeholder = if !alpha && work.join(format!("blurhash/{id}.png")).is_file() {
        format!("background-image:url('blurhash/{}.png');", url(id))
    } else {
        String::new()
    };
    let _ = write!(
        out,
        r#"<figure class="stage image{}" style="width:{bw}px;height:{bh}px;{placeholder}">"#,
        if alpha { " alpha" } else { "" }
    );
    // An animated source animates only in its WebP variants (the other formats hold its first
    // frame): that is the one to show.
    let animated = a.is_some_and(|a| a.animated);
    let sets: Vec<_> = r
        .srcset
        .iter()
        .filter(|s| !animated || s.format == "webp")
        .collect();
    if let Some((last, first)) = sets.split_last() {
        let list = |srcset: &str| {
            srcset
                .split(", ")
                .map(|c| {
                    let (key, width) = c.split_once(' ').unwrap_or((c, ""));
                    format!("{}/{} {width}", g.store, url(key))
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str("<picture>");
        for s in first {
            let _ = write!(
                out,
                r#"<source type="{}" srcset="{}" sizes="{bw}px">"#,
                esc(&s.content_type),
                esc(&list(&s.srcset))
            );
        }
        let src = last.srcset.split(' ').next().unwrap_or_default();
        let _ = write!(
            out,
            r#"<img src="{}/{}" srcset="{}" sizes="{bw}px" width="{bw}" height="{bh}" alt="{}"></picture>"#,
            g.store,
            url(src),
            esc(&list(&last.srcset)),
            esc(id)
        );
    }
    if let Some(v) = a.and_then(|a| a.vision.as_ref()) {
        out.push_str(r#"<div class="overlay">"#);
        let pct = |v: u32, of: u32| 100.0 * v as f64 / of.max(1) as f64;
        for f in &v.faces {
            let _ = write!(
                out,
                r#"<div class="face" data-face="{},{},{},{}" style="left:{:.4}%;top:{:.4}%;width:{:.4}%;height:{:.4}%"></div>"#,
                f.x,
                f.y,
                f.width,
                f.height,
                pct(f.x, w),
                pct(f.y, h),
                pct(f.width, w),
                pct(f.height, h)
            );
        }
        let p = v.focal_point;
        let _ = write!(
            out,
            r#"<div class="focal" title="focal point {},{}" style="left:{:.4}%;top:{:.4}%"></div></div>"#,
            p.x,
            p.y,
            pct(p.x, w),
            pct(p.y, h)
        );
    }
    out.push_str("</figure>");
}

fn image_facts(g: &Gallery, id: &str, a: &ImageAnalysis, work: &Path, out: &mut String) {
    let mut header = format!("{} {}×{}", esc(&a.format), a.width, a.height);
    if a.has_alpha {
        header.push_str(", alpha");
    }
    if a.animated {
        let _ = write!(header, ", animated ({} frames)", a.frames);
    }
    if a.orientation != 1 {
        let _ = write!(header, ", EXIF orientation {} (applied)", a.orientation);
    }
    let _ = write!(out, r#"<dl class="facts"><dt>source</dt><dd>{header}</dd>"#);
    let Some(v) = &a.vision else {
        out.push_str("<dt>analysis</dt><dd>failed (see the warnings)</dd></dl>");
        return;
    };
    let colour = if is_hex_colour(&v.dominant_color) {
        v.dominant_color.as_str()
    } else {
        "transparent"
    };
    let placeholder = if work.join(format!("blurhash/{id}.png")).is_file() {
        format!(
            r#"<img class="blurhash" src="blurhash/{}.png" alt="BlurHash">"#,
            url(id)
        )
    } else {
        String::new()
    };
    let blurry = if v.is_blurry { "blurry" } else { "sharp" };
    // The meter's scale: the threshold at a quarter, sharp photos (hundreds to thousands) full.
    let fill = (v.blur_score / (4.0 * g.blur_threshold)).clamp(0.0, 1.0) * 100.0;
    let _ = write!(
        out,
        r#"<dt>faces</dt><dd data-faces="{count}">{count} {boxes}</dd>
<dt>focal point</dt><dd>{fx}, {fy} <span style="color:var(--focal)">⊕</span></dd>
<dt>dominant colour</dt><dd><span class="swatch" style="background:{colour}"></span><code>{colour_text}</code></dd>
<dt>BlurHash</dt><dd>{placeholder}<code>{hash}</code></dd>
<dt>blur</dt><dd><span class="verdict {blurry}">{blurry}</span><span class="meter {blurry}"><i style="width:{fill:.1}%"></i></span>score {score:.1} (threshold {threshold})</dd>
<dt>pHash</dt><dd>{bits}<code>{phash}</code></dd></dl>"#,
        count = v.face_count,
        boxes = if v.faces.is_empty() {
            ""
        } else {
            "(boxed in yellow)"
        },
        fx = v.focal_point.x,
        fy = v.focal_point.y,
        colour_text = esc(&v.dominant_color),
        hash = esc(&v.blurhash),
        score = v.blur_score,
        threshold = g.blur_threshold,
        bits = phash_grid(&v.phash),
        phash = esc(&v.phash),
    );
}

/// The stream in a player (hls.js, see the template), its poster, and the storyboard's scrub bar.
fn video_stage(g: &Gallery, r: &OptimizeResponse, v: &VideoAnalysis, out: &mut String) {
    let find = |role: &str, format: &str| {
        r.outputs
            .iter()
            .filter(|o| o.role == role && o.format == format && o.crop.is_none())
            .max_by_key(|o| o.width)
    };
    let link = |o: &Output| format!("{}/{}", g.store, url(&o.key));
    let (bw, bh) = fit(v.width, v.height, STAGE);
    let poster = find("poster", "jpeg")
        .or(find("poster", "webp"))
        .map(|o| format!(r#" poster="{}""#, link(o)))
        .unwrap_or_default();
    let hls = find("stream", "hls")
        .map(|o| format!(r#" data-hls="{}""#, link(o)))
        .unwrap_or_default();
    // The smallest MP4: the fallback when no HLS player runs.
    let mp4 = r
        .outputs
        .iter()
        .filter(|o| o.role == "rendition")
        .min_by_key(|o| o.height)
        .map(&link);
    let src = match (hls.is_empty(), &mp4) {
        (true, Some(m)) => format!(r#" src="{m}""#),
        _ => String::new(),
    };
    let mp4 = mp4
        .map(|m| format!(r#" data-mp4="{m}""#))
        .unwrap_or_default();
    let _ = write!(
        out,
        r#"<figure class="stage video" style="width:{bw}px"><video class="player" controls muted playsinline preload="none" style="height:{bh}px"{poster}{hls}{mp4}{src}></video>"#
    );
    if let Some(vtt) = find("storyboard", "vtt") {
        let duration = v
            .duration_ms
            .or(vtt.duration_ms)
            .map(|d| format!(r#" data-duration="{}""#, d as f64 / 1000.0))
            .unwrap_or_default();
        let poster_at = v
            .poster_time_ms
            .map(|t| format!(r#" data-poster-at="{}""#, t as f64 / 1000.0))
            .unwrap_or_default();
        let _ = write!(
            out,
            r#"<div class="scrub" title="storyboard: hover to preview, click to seek" data-vtt="{}"{duration}{poster_at}></div><div class="tip"><span></span></div>"#,
            link(vtt)
        );
    }
    out.push_str("</figure>");
}

fn video_facts(v: &VideoAnalysis, out: &mut String) {
    let mut rows = vec![(
        "source",
        format!(
            "{} {}×{}{}{}",
            esc(&v.video_codec),
            v.width,
            v.height,
            v.fps.map(|f| format!(" @ {f:.3} fps")).unwrap_or_default(),
            if v.hdr { ", HDR (tone-mapped)" } else { "" }
        ),
    )];
    if let Some(d) = v.duration_ms {
        rows.push(("duration", format!("{:.2} s", d as f64 / 1000.0)));
    }
    rows.push((
        "audio",
        match (&v.audio_codec, v.has_audio) {
            (Some(c), true) => esc(c),
            _ => "none".into(),
        },
    ));
    if let Some(b) = v.bitrate {
        rows.push(("bitrate", format!("{} kbit/s", b / 1000)));
    }
    if v.rotation != 0 {
        rows.push(("rotation", format!("{}° (applied)", v.rotation)));
    }
    if let Some(t) = v.poster_time_ms {
        rows.push((
            "poster frame",
            format!(
                "at {:.2} s <span style=\"color:#b59a00\">●</span>",
                t as f64 / 1000.0
            ),
        ));
    }
    if let Some(l) = &v.loudness {
        let mut s = format!(
            "{:.1} LUFS, peak {:.1} dBTP, range {:.1} LU",
            l.integrated_lufs, l.true_peak_dbtp, l.range_lu
        );
        if let Some(n) = l.normalized_to_lufs {
            let _ = write!(s, " → normalised to {n:.1} LUFS");
        }
        rows.push(("loudness", s));
    }
    out.push_str(r#"<dl class="facts">"#);
    for (k, v) in rows {
        let _ = write!(out, "<dt>{k}</dt><dd>{v}</dd>");
    }
    out.push_str("</dl>");
}

/// The input itself, shown when a browser can (never a failed one: it may be a pixel bomb).
fn source_tile(r: &OptimizeResponse, name: &str, input: &Path, out: &mut String) {
    let href = format!(
        "sources/{}",
        url(&input.file_name().unwrap_or_default().to_string_lossy())
    );
    let bytes = r
        .source
        .as_ref()
        .and_then(|s| s.size_bytes)
        .map(human)
        .unwrap_or_default();
    let image = r.analysis.as_ref().and_then(|a| a.image());
    let shown = r.success
        && image.is_some_and(|a| BROWSER_IMAGES.contains(&a.format.as_str()))
        && r.media_type == Some(MediaType::Image);
    let what = match (image, r.analysis.as_ref().and_then(|a| a.video())) {
        (Some(a), _) => format!("{} {}×{}", esc(&a.format), a.width, a.height),
        (_, Some(v)) => format!("{} {}×{}", esc(&v.video_codec), v.width, v.height),
        _ => String::new(),
    };
    let preview = if shown {
        format!(r#"<img src="{href}" alt="{}">"#, esc(name))
    } else {
        format!(r#"<span class="file">{}</span>"#, esc(name))
    };
    let _ = write!(
        out,
        r#"<figure class="out source"><a href="{href}">{preview}</a><figcaption><b>source</b> {what}<br>{bytes}</figcaption></figure>"#
    );
}

fn output_tile(g: &Gallery, o: &Output, out: &mut String) {
    let href = format!("{}/{}", g.store, url(&o.key));
    let preview = match o.format.as_str() {
        "webp" | "jpeg" | "avif" => format!(
            r#"<img src="{href}" alt="{} {}">"#,
            esc(&o.role),
            esc(&o.key)
        ),
        "mp4" => {
            format!(r#"<video src="{href}" muted controls playsinline preload="metadata"></video>"#)
        }
        "hls" => r#"<span class="file">HLS master playlist</span>"#.to_owned(),
        "dash" => r#"<span class="file">DASH MPD</span>"#.to_owned(),
        "vtt" => r#"<span class="file">WebVTT storyboard cues</span>"#.to_owned(),
        other => format!(r#"<span class="file">{}</span>"#, esc(other)),
    };
    let preview = if o.format == "mp4" {
        preview
    } else {
        format!(r#"<a href="{href}">{preview}</a>"#)
    };
    let mut caption = format!(
        "<b>{}</b> {}<br>{}×{} · {}",
        esc(&o.role),
        esc(&o.format).to_uppercase(),
        o.width,
        o.height,
        human(o.size_bytes)
    );
    if let Some(q) = &o.quality {
        let _ = write!(caption, "<br>q{}", q.value);
        match (q.target, q.score) {
            (Some(t), Some(s)) => {
                let _ = write!(caption, " · SSIMULACRA2 {s:.1} (target {t})");
            }
            (Some(t), None) => {
                let _ = write!(caption, " · auto (target {t})");
            }
            _ => {}
        }
    }
    if let Some(f) = o.frames {
        let _ = write!(caption, " · {f} frames");
    }
    if let Some(d) = o.duration_ms {
        let _ = write!(caption, " · {:.1} s", d as f64 / 1000.0);
    }
    let _ = write!(
        out,
        r#"<figure class="out" data-role="{}"><div>{preview}</div><figcaption>{caption}</figcaption></figure>"#,
        esc(&o.role)
    );
}

fn role_order(role: &str) -> usize {
    [
        "variant",
        "thumbnail",
        "poster",
        "rendition",
        "stream",
        "storyboard",
    ]
    .iter()
    .position(|r| *r == role)
    .unwrap_or(9)
}

fn format_order(format: &str) -> usize {
    ["avif", "webp", "jpeg", "mp4", "hls", "dash", "vtt"]
        .iter()
        .position(|f| *f == format)
        .unwrap_or(9)
}

/// The pHash's 64 bits as an 8×8 grid, most significant first.
fn phash_grid(phash: &str) -> String {
    let Ok(bits) = u64::from_str_radix(phash, 16) else {
        return String::new();
    };
    let cells: String = (0..64)
        .map(|i| {
            if bits >> (63 - i) & 1 == 1 {
                r#"<i class="on"></i>"#
            } else {
                "<i></i>"
            }
        })
        .collect();
    format!(r#"<span class="phash" title="pHash bits">{cells}</span>"#)
}

/// The BlurHash decoded at most 32 px a side (the page stretches it), as a PNG.
fn blurhash_png(hash: &str, width: u32, height: u32) -> anyhow::Result<Vec<u8>> {
    let (w, h) = fit(width, height, (32, 32));
    let rgba =
        blurhash::decode(hash, w, h, 1.0).map_err(|e| anyhow::anyhow!("blurhash {hash}: {e:?}"))?;
    Ok(png_rgba(w, h, &rgba))
}

/// A PNG of 8-bit RGBA pixels, its image data stored (uncompressed deflate blocks): at most
/// 32×32 px here, 4 KiB.
fn png_rgba(width: u32, height: u32, rgba: &[u8]) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        !bytes.iter().fold(!0u32, |c, &b| {
            (0..8).fold(c ^ b as u32, |c, _| {
                (c >> 1) ^ (0xedb8_8320 & (c & 1).wrapping_neg())
            })
        })
    }
    fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        png.extend((data.len() as u32).to_be_bytes());
        let start = png.len();
        png.extend(kind);
        png.extend(data);
        let crc = crc32(&png[start..]);
        png.extend(crc.to_be_bytes());
    }
    // Each row behind its filter byte (0: none).
    let raw: Vec<u8> = rgba
        .chunks_exact(width as usize * 4)
        .flat_map(|row| std::iter::once(0).chain(row.iter().copied()))
        .collect();
    // zlib: header, stored blocks of at most 65535 bytes, Adler-32.
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(0xffff).collect();
    for (i, block) in blocks.iter().enumerate() {
        let len = block.len() as u16;
        z.push(u8::from(i + 1 == blocks.len()));
        z.extend(len.to_le_bytes());
        z.extend((!len).to_le_bytes());
        z.extend(*block);
    }
    let (a, b) = raw.iter().fold((1u32, 0u32), |(a, b), &x| {
        let a = (a + x as u32) % 65521;
        (a, (b + a) % 65521)
    });
    z.extend((b << 16 | a).to_be_bytes());
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = [width.to_be_bytes(), height.to_be_bytes()].concat();
    header.extend([8, 6, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &header);
    chunk(&mut png, b"IDAT", &z);
    chunk(&mut png, b"IEND", &[]);
    png
}

/// `width`×`height` scaled to fit `bound` (never enlarged), at least 1×1.
fn fit(width: u32, height: u32, bound: (u32, u32)) -> (u32, u32) {
    let scale = (bound.0 as f64 / width.max(1) as f64)
        .min(bound.1 as f64 / height.max(1) as f64)
        .min(1.0);
    (
        ((width as f64 * scale).round() as u32).max(1),
        ((height as f64 * scale).round() as u32).max(1),
    )
}

fn is_hex_colour(s: &str) -> bool {
    s.len() == 7 && s.starts_with('#') && s[1..].chars().all(|c| c.is_ascii_hexdigit())
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

/// HTML text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A relative URL of a path (`/` kept, everything outside RFC 3986's unreserved set escaped).
fn url(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_text_are_escaped() {
        assert_eq!(
            url("u/images/a b#1/320w.webp"),
            "u/images/a%20b%231/320w.webp"
        );
        assert_eq!(
            esc(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn a_box_fits_without_enlarging() {
        assert_eq!(fit(2048, 12288, (320, 340)), (57, 340));
        assert_eq!(fit(80, 80, (320, 340)), (80, 80));
        assert_eq!(fit(1126, 661, (32, 32)), (32, 19));
    }

    #[test]
    fn the_phash_grid_has_its_bits() {
        let grid = phash_grid("8000000000000001");
        assert_eq!(grid.matches("<i").count(), 64);
        assert_eq!(grid.matches(r#"class="on""#).count(), 2);
        assert!(grid.contains(r#"title="pHash bits"><i class="on"></i><i></i>"#));
    }

    #[test]
    fn a_failed_card_shows_the_code_stage_and_message_as_text() {
        let r: OptimizeResponse = serde_json::from_str(
            r#"{"schema_version": 1, "request_id": "r", "media_id": "bad-jpg", "user_id": "u",
                "success": false, "status": "failed", "media_type": null,
                "source": {"bucket": "b", "key": "bad.jpg", "size_bytes": 10, "etag": null},
                "outputs": [], "analysis": null, "warnings": [],
                "error": {"code": "corrupt_input", "message": "cannot <render>", "stage": "analyze",
                          "retryable": false},
                "attempts": 1, "duration_ms": 5, "worker": {"id": "w", "version": "0"},
                "completed_at": "2026-11-26T00:00:00Z"}"#,
        )
        .unwrap();
        let inputs = HashMap::from([("bad-jpg".to_owned(), PathBuf::from("/in/bad.jpg"))]);
        let g = Gallery {
            responses: std::slice::from_ref(&r),
            inputs: &inputs,
            input_dir: Path::new("/in"),
            store: "store/media-output",
            profile: "showcase",
            blur_threshold: 100.0,
            pool: 2,
            wall: Duration::from_secs(1),
            hls_js: false,
        };
        let mut html = String::new();
        card(&g, &r, Path::new("/nonexistent"), &mut html);
        assert!(
            html.contains(r#"<p class="code">corrupt_input</p>"#),
            "{html}"
        );
        assert!(html.contains("stage <b>analyze</b>"), "{html}");
        assert!(html.contains("cannot &lt;render&gt;"), "{html}");
        // A failed source is linked, never shown: it may be a pixel bomb.
        assert!(
            html.contains(r#"<a href="sources/bad.jpg"><span class="file">"#),
            "{html}"
        );
        assert!(!html.contains("<img"), "{html}");
    }

    #[test]
    fn a_blurhash_decodes_to_a_png() {
        let png = blurhash_png("LEHV6nWB2yk8pyo0adR*.7kCMdnj", 3024, 4032).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        // Read back by libvips' PNG loader (libspng): 24×32, opaque, the hash's colours.
        crate::media::init(1);
        let img = crate::media::vips::Image::from_buffer(&png).unwrap();
        assert_eq!((img.width(), img.height(), img.bands()), (24, 32, 4));
        let px = img.pixels().unwrap();
        assert!(px.chunks_exact(4).all(|p| p[3] == 255));
        assert!(
            px.chunks_exact(4).any(|p| p[..3] != px[..3]),
            "not one flat colour"
        );
    }
}
