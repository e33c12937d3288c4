#!/usr/bin/python3
"""Decodes images with Pillow (not libvips) into raw 8-bit RGB.

Reads JSON lines {"input", "raw"}; writes `raw` and one JSON line each: {"width", "height"} or
{"error"}. With "frames": true, an animation: every frame as shown (composited by Pillow, which
reads animated WebP through libwebp's own animation decoder) as RGBA, one after another in
`raw`, and the line also has "durations" (ms per frame).
"""

import json
import sys

from PIL import Image

for line in sys.stdin:
    job = json.loads(line)
    try:
        with Image.open(job["input"]) as im:
            if job.get("frames"):
                durations = []
                with open(job["raw"], "wb") as f:
                    for i in range(getattr(im, "n_frames", 1)):
                        im.seek(i)
                        im.load()
                        f.write(im.convert("RGBA").tobytes())
                        durations.append(im.info.get("duration", 0))
                result = {"width": im.width, "height": im.height, "durations": durations}
            else:
                rgb = im.convert("RGB")
                with open(job["raw"], "wb") as f:
                    f.write(rgb.tobytes())
                result = {"width": rgb.width, "height": rgb.height}
        print(json.dumps(result), flush=True)
    except Exception as e:  # noqa: BLE001 - reported by the test
        print(json.dumps({"error": f"{job['input']}: {e}"}), flush=True)
