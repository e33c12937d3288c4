#!/usr/bin/python3
"""Reference downscales and decoded outputs for a perceptual metric, made with Pillow.

Reads JSON lines {"source", "output", "ref", "out"} on stdin; writes `ref` (a PNG of the upright
source, converted to sRGB through its ICC profile with perceptual intent, alpha composited on
white, resized with Lanczos to the output's size) and `out` (the output decoded by Pillow and
composited on white), then one JSON line per pair: {"ok": true} or {"error"}.
The reference is the one tests/reference/colour.py compares colours with.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "reference"))
from colour import on_white, upright_srgb  # noqa: E402

from PIL import Image  # noqa: E402

cache = {}
for line in sys.stdin:
    job = json.loads(line)
    try:
        if job["source"] not in cache:
            cache.clear()
            cache[job["source"]] = upright_srgb(job["source"])
        src = cache[job["source"]]
        with Image.open(job["output"]) as im:
            out = on_white(im)
        src.resize(out.size, Image.LANCZOS).save(job["ref"])
        out.save(job["out"])
        print(json.dumps({"ok": True}), flush=True)
    except Exception as e:  # noqa: BLE001 - reported by the bench
        print(json.dumps({"error": f"{job['output']}: {e}"}), flush=True)
