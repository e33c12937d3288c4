#!/usr/bin/env python3
"""Adds the Debian packages of the runtime image to the CycloneDX document of the binary's crates.

    scripts/sbom.py CRATES.cdx.json PACKAGES.tsv > media-worker.cdx.json

PACKAGES.tsv: `dpkg-query -W -f '${Package}\\t${Version}\\t${Architecture}\\n'` run in the image.
Each package becomes a component with its Debian package URL (pkg:deb/debian/...).
"""

import json
import sys
from urllib.parse import quote


def main():
    bom = json.load(open(sys.argv[1]))
    components = bom.setdefault("components", [])
    for line in open(sys.argv[2]):
        name, version, arch = line.rstrip("\n").split("\t")
        purl = f"pkg:deb/debian/{name}@{quote(version)}?arch={arch}&distro=debian-12"
        components.append(
            {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        )
    json.dump(bom, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
