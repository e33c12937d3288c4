#!/usr/bin/python3
"""Reads animations back with Pillow (an independent decoder).

Reads one path per line on stdin, optionally followed by a tab and a reference animation; writes
one JSON line per file: {"format", "size": [w, h], "frames", "durations": [ms per frame], "loop"}
(loop: the file's own field, null when absent), with a reference also "worst_mae": the largest
mean absolute difference (0-255, RGB on white) between a frame and the reference's frame of the
same number resized to the file's size (Lanczos); or {"error"}. Every frame is decoded.
"""

import json
import sys

from PIL import Image, ImageChops, ImageStat


def on_white(frame):
    rgba = frame.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def frames(im):
    """Each frame as shown (composited by Pillow), with its duration."""
    for i in range(getattr(im, "n_frames", 1)):
        im.seek(i)
        im.load()
        yield on_white(im), im.info.get("duration", 0)


for line in sys.stdin:
    path, _, reference = line.rstrip("\n").partition("\t")
    try:
        with Image.open(path) as im:
            shown = list(frames(im))
            result = {
                "format": im.format,
                "size": list(im.size),
                "frames": len(shown),
                "durations": [d for _, d in shown],
                "loop": im.info.get("loop"),
            }
            if reference:
                with Image.open(reference) as ref:
                    want = [f.resize(im.size, Image.LANCZOS) for f, _ in frames(ref)]
                result["worst_mae"] = max(
                    sum(ImageStat.Stat(ImageChops.difference(f, w)).mean) / 3
                    for (f, _), w in zip(shown, want)
                )
            print(json.dumps(result), flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(json.dumps({"error": f"{path}: {e}"}), flush=True)
