#!/usr/bin/env python3
"""Adds the Debian packages of the runtime image to the CycloneDX document of the binary's crates.

    scripts/sbom.py CRATES.cdx.json IMAGE > media-worker.cdx.json

The packages are read from the image itself: /var/lib/dpkg/status.d/, one status stanza per
package a file of the image came from (scripts/image-root.sh writes them with the files; the
layout of Google's distroless images, which scanners read too). Each package becomes a component
with its Debian package URL (pkg:deb/debian/...).
"""

import io
import json
import os
import subprocess
import sys
import tarfile
from urllib.parse import quote

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
STATUS = "/var/lib/dpkg/status.d"


def stanzas(image):
    """The status stanzas of `image` (its files, read from a container created, never run)."""
    cid = subprocess.run([DOCKER, "create", image], capture_output=True, text=True, check=True)
    cid = cid.stdout.strip()
    try:
        tar = subprocess.run([DOCKER, "cp", f"{cid}:{STATUS}", "-"], capture_output=True, check=True)
    finally:
        subprocess.run([DOCKER, "rm", cid], capture_output=True, check=False)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        for m in t.getmembers():
            if m.isfile():
                yield t.extractfile(m).read().decode()


def fields(stanza):
    out = {}
    for line in stanza.splitlines():
        if line and not line[0].isspace() and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def main():
    bom = json.load(open(sys.argv[1]))
    components = bom.setdefault("components", [])
    packages = [fields(s) for s in stanzas(sys.argv[2])]
    if not packages:
        sys.exit(f"sbom: no {STATUS} in {sys.argv[2]}")
    for p in sorted(packages, key=lambda p: p["Package"]):
        name, version, arch = p["Package"], p["Version"], p["Architecture"]
        purl = f"pkg:deb/debian/{name}@{quote(version)}?arch={arch}&distro=debian-12"
        components.append(
            {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        )
    json.dump(bom, sys.stdout, indent=2)
    sys.stdout.write("\n")
    print(f"sbom: {len(packages)} Debian packages of {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    main()
