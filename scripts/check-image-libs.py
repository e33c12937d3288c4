#!/usr/bin/env python3
"""Proves that the runtime image cannot miss a shared library.

Every library the binary links (ldd) must belong (dpkg -S) to a package that the Dockerfile's
runtime stage installs, directly or as a dependency (apt-cache depends --recurse). Both sides
are Debian 12 packages, so this machine answers for the image.

    scripts/check-image-libs.py [BINARY] [DOCKERFILE]
"""

import os
import re
import subprocess
import sys


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout


def runtime_packages(dockerfile):
    """Packages of `apt-get install` lines in the last stage."""
    text = open(dockerfile).read().replace("\\\n", " ")
    last = text.rsplit("\nFROM ", 1)[-1]
    pkgs = set()
    for m in re.finditer(r"apt-get install ([^&\n]*)", last):
        pkgs |= {w for w in m.group(1).split() if not w.startswith("-")}
    return pkgs


def closure(pkgs):
    """The packages and everything they depend on (Depends and PreDepends)."""
    out = run(
        "apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
        "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *sorted(pkgs),
    )
    names = set(pkgs)
    for line in out.splitlines():
        line = line.strip()
        if line.startswith(("Depends:", "PreDepends:", "|Depends:", "|PreDepends:")):
            line = line.split(":", 1)[1].strip()
        if line and not line.startswith("<") and " " not in line:
            names.add(line.split(":")[0])
    return names


def owner(path):
    """The package that ships a library (ldd may name it under /lib or /usr/lib)."""
    for p in (path, os.path.realpath(path), "/usr" + path, path.replace("/usr/lib/", "/lib/")):
        out = run("dpkg", "-S", p)
        if out:
            return out.split(":")[0].split(",")[0].strip()
    return None


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/media-worker"
    dockerfile = sys.argv[2] if len(sys.argv) > 2 else "Dockerfile"
    installs = runtime_packages(dockerfile)
    available = closure(installs)
    libs = [
        parts[2]
        for parts in (line.split() for line in run("ldd", binary).splitlines())
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/")
    ]
    if not libs:
        sys.exit(f"ldd found no libraries in {binary}")
    missing = []
    for lib in libs:
        pkg = owner(lib)
        if pkg is None or pkg not in available:
            missing.append(f"{lib} ({pkg or 'no package'})")
    print(
        f"{len(libs)} libraries of {binary}; runtime stage installs {len(installs)} packages, "
        f"{len(available)} with dependencies"
    )
    if missing:
        print("not provided by the runtime stage:\n  " + "\n  ".join(missing))
        sys.exit(1)
    print("every linked library is provided by the runtime stage")


if __name__ == "__main__":
    main()
