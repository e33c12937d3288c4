#!/usr/bin/python3
"""Decodes images with Pillow (not libvips) into raw 8-bit RGB.

Reads JSON lines {"input", "raw"}; writes `raw` and one JSON line each: {"width", "height"} or
{"error"}.
"""

import json
import sys

from PIL import Image

for line in sys.stdin:
    job = json.loads(line)
    try:
        with Image.open(job["input"]) as im:
            rgb = im.convert("RGB")
        with open(job["raw"], "wb") as f:
            f.write(rgb.tobytes())
        print(json.dumps({"width": rgb.width, "height": rgb.height}), flush=True)
    except Exception as e:  # noqa: BLE001 - reported by the test
        print(json.dumps({"error": f"{job['input']}: {e}"}), flush=True)
