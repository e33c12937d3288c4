#!/usr/bin/env python3
"""Proves that the runtime image cannot miss a shared library, and lists what it holds.

Reads the image's own files (`docker export` of a container created from it, never run): every
ELF file in it (the worker, ffmpeg, ffprobe, tini, every library and module) must find each
library it names (DT_NEEDED) and its program interpreter in the image, searched as the dynamic
loader searches (RUNPATH, the directories of the image's /etc/ld.so.conf, the default ones).
The programs the worker runs and the data it reads must be there; no shell and no package
manager may be. Prints the file count, the size and the ten largest files.

    scripts/check-image-libs.py IMAGE [--list]      (--list: every file with its size)
"""

import glob
import os
import subprocess
import sys
import tarfile
import tempfile

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
REQUIRED = [
    "/usr/local/bin/media-worker",
    "/usr/bin/ffmpeg",
    "/usr/bin/ffprobe",
    "/usr/bin/tini",
    "/usr/lib/x86_64-linux-gnu/vips-modules-8.14/vips-heif.so",
    "/usr/share/opencv4/haarcascades/haarcascade_frontalface_alt2.xml",
    "/usr/share/opencv4/haarcascades/haarcascade_profileface.xml",
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/ld.so.cache",
    "/etc/passwd",
]
ABSENT = ["/bin/sh", "/usr/bin/sh", "/usr/bin/bash", "/usr/bin/dash", "/usr/bin/dpkg",
          "/usr/bin/apt-get", "/usr/bin/busybox"]


def export(image, into):
    cid = subprocess.run([DOCKER, "create", image], capture_output=True, text=True, check=True)
    cid = cid.stdout.strip()
    try:
        with subprocess.Popen([DOCKER, "export", cid], stdout=subprocess.PIPE) as p:
            with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
                try:
                    tar.extractall(into, filter="tar")
                except TypeError:  # Python before 3.11.4: no filters
                    tar.extractall(into)
    finally:
        subprocess.run([DOCKER, "rm", cid], capture_output=True, check=False)


def inside(root, path, hops=40):
    """`path` of the image resolved within `root` (its links are the image's, not the host's)."""
    parts = [p for p in path.split("/") if p]
    real = []
    while parts and hops:
        real.append(parts.pop(0))
        full = os.path.join(root, *real)
        if os.path.islink(full):
            hops -= 1
            target = os.readlink(full)
            real.pop()
            if target.startswith("/"):
                real = []
            parts = [p for p in target.split("/") if p] + parts
            # `..` within the image
            norm = []
            for p in real + parts:
                if p == "..":
                    norm and norm.pop()
                elif p != ".":
                    norm.append(p)
            real, parts = [], norm
    return os.path.join(root, *real)


def elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def dynamic(path):
    """(NEEDED names, RUNPATH dirs, interpreter) of an ELF file, from readelf."""
    out = subprocess.run(["readelf", "-dl", "-W", path], capture_output=True, text=True).stdout
    needed, runpath, interp = [], [], None
    for line in out.splitlines():
        if "(NEEDED)" in line:
            needed.append(line.split("[", 1)[1].split("]", 1)[0])
        elif "(RUNPATH)" in line or "(RPATH)" in line:
            runpath += line.split("[", 1)[1].split("]", 1)[0].split(":")
        elif "Requesting program interpreter:" in line:
            interp = line.split(":", 1)[1].strip(" ]")
    return needed, runpath, interp


def conf_dirs(root):
    dirs = []
    for conf in [os.path.join(root, "etc/ld.so.conf")] + sorted(
        glob.glob(os.path.join(root, "etc/ld.so.conf.d/*.conf"))
    ):
        if os.path.exists(conf):
            for line in open(conf):
                line = line.split("#")[0].strip()
                if line.startswith("/"):
                    dirs.append(line)
    return dirs + ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"]


def main():
    image = sys.argv[1] if len(sys.argv) > 1 else "media-worker:latest"
    with tempfile.TemporaryDirectory() as root:
        export(image, root)
        files, elves = [], []
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                if os.path.isfile(p) and not os.path.islink(p):
                    rel = "/" + os.path.relpath(p, root)
                    files.append((os.path.getsize(p), rel))
                    if elf(p):
                        elves.append(rel)
        search = conf_dirs(root)
        problems = []
        for rel in elves:
            needed, runpath, interp = dynamic(os.path.join(root, rel.lstrip("/")))
            origin = os.path.dirname(rel)
            dirs = [r.replace("$ORIGIN", origin) for r in runpath] + search
            for name in needed:
                if not any(os.path.isfile(inside(root, os.path.join(d, name))) for d in dirs):
                    problems.append(f"{rel} needs {name}: not in the image")
            if interp and not os.path.isfile(inside(root, interp)):
                problems.append(f"{rel} needs its interpreter {interp}: not in the image")
        for p in REQUIRED:
            if not os.path.isfile(inside(root, p)):
                problems.append(f"{p}: missing")
        for p in ABSENT:
            if os.path.lexists(inside(root, p)):
                problems.append(f"{p}: in the image (it ships no shell or package manager)")
        total = sum(s for s, _ in files)
        print(
            f"check-image-libs: {image}: {len(files)} files, {total / 1e6:.1f} MB, "
            f"{len(elves)} ELF files, each library they need in the image"
            if not problems
            else f"check-image-libs: {image}:"
        )
        if "--list" in sys.argv:
            for s, rel in sorted(files):
                print(f"{s}\t{rel}")
        else:
            for s, rel in sorted(files)[-10:][::-1]:
                print(f"  {s / 1e6:6.1f} MB  {rel}")
        if problems:
            print("  " + "\n  ".join(problems))
            sys.exit(1)


if __name__ == "__main__":
    main()
