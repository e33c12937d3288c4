#!/usr/bin/python3
"""Reads animations back with Pillow (an independent decoder).

Reads one path per line on stdin; writes one JSON line per file:
{"format", "size": [w, h], "frames", "durations": [ms per frame], "loop"} (loop: the file's own
field, null when absent), or {"error"}. Each frame is decoded, so a broken one is an error.
"""

import json
import sys

from PIL import Image

for line in sys.stdin:
    path = line.strip()
    try:
        with Image.open(path) as im:
            durations = []
            for i in range(getattr(im, "n_frames", 1)):
                im.seek(i)
                im.load()
                durations.append(im.info.get("duration", 0))
            print(json.dumps({
                "format": im.format,
                "size": list(im.size),
                "frames": len(durations),
                "durations": durations,
                "loop": im.info.get("loop"),
            }), flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(json.dumps({"error": f"{path}: {e}"}), flush=True)
