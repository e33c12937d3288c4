#!/usr/bin/python3
"""Compares the worker's image outputs with a Pillow reference of the same pixels.

Reads JSON lines {"source": path, "output": path} on stdin; writes one JSON line per pair:
{"luma_out", "luma_ref", "mean_out": [r, g, b], "mean_ref": [r, g, b], "mae": [r, g, b]} (mean
absolute error per channel), or {"error"} when Pillow cannot read the pair. The reference is the upright source (EXIF
orientation applied), converted to sRGB with ImageCms (perceptual intent) when it embeds an ICC
profile and taken as sRGB otherwise, composited on white, then resized to the output's size
with Lanczos. The output is decoded by Pillow and composited on white the same way.
"""

import io
import json
import sys

from PIL import Image, ImageChops, ImageCms, ImageOps, ImageStat

SRGB = ImageCms.createProfile("sRGB")


def on_white(img):
    """RGB, with any alpha composited on white."""
    if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def upright_srgb(path):
    img = ImageOps.exif_transpose(Image.open(path))
    icc = img.info.get("icc_profile")
    if icc:
        alpha = img.getchannel("A") if img.mode in ("RGBA", "LA") else None
        base = img.convert("RGB") if img.mode in ("RGBA", "P") else img
        if base.mode == "LA":
            base = base.convert("L")
        base = ImageCms.profileToProfile(
            base,
            ImageCms.ImageCmsProfile(io.BytesIO(icc)),
            SRGB,
            renderingIntent=ImageCms.Intent.PERCEPTUAL,
            outputMode="RGB",
        )
        if alpha is not None:
            base.putalpha(alpha)
        img = base
    return on_white(img)


def luma(img):
    return ImageStat.Stat(img.convert("L")).mean[0]


def compare(source, output):
    out = on_white(Image.open(output))
    ref = upright_srgb(source).resize(out.size, Image.Resampling.LANCZOS)
    return {
        "luma_out": luma(out),
        "luma_ref": luma(ref),
        "mean_out": ImageStat.Stat(out).mean,
        "mean_ref": ImageStat.Stat(ref).mean,
        "mae": ImageStat.Stat(ImageChops.difference(out, ref)).mean,
    }


def main():
    for line in sys.stdin:
        pair = json.loads(line)
        try:
            result = compare(pair["source"], pair["output"])
        except Exception as e:  # reported per pair: the test names the file
            result = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
