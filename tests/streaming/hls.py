"""Reads an HLS master playlist and every playlist it names with the `m3u8` package (an
independent parser) and prints what tests/streaming.rs checks, as JSON."""
import json
import os
import sys

import m3u8

master_path = sys.argv[1]
base = os.path.dirname(master_path)
master = m3u8.load(master_path)
assert master.is_variant, "not a master playlist"


def media(uri):
    p = m3u8.load(os.path.join(base, uri))
    assert not p.is_variant
    return {
        "uri": uri,
        "version": p.version,
        "target_duration": p.target_duration,
        "independent_segments": p.is_independent_segments,
        "endlist": p.is_endlist,
        "playlist_type": p.playlist_type,
        "init": p.segment_map[0].uri if p.segment_map else None,
        "segments": [{"uri": s.uri, "duration": s.duration} for s in p.segments],
    }


print(json.dumps({
    "independent_segments": master.is_independent_segments,
    "variants": [{
        "uri": v.uri,
        "bandwidth": v.stream_info.bandwidth,
        "average_bandwidth": v.stream_info.average_bandwidth,
        "codecs": v.stream_info.codecs,
        "resolution": v.stream_info.resolution,
        "frame_rate": v.stream_info.frame_rate,
        "audio": v.stream_info.audio,
        "playlist": media(v.uri),
    } for v in master.playlists],
    "audio": [{"group": m.group_id, "uri": m.uri, "playlist": media(m.uri)}
              for m in master.media if m.type == "AUDIO"],
}))
