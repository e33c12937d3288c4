#!/usr/bin/env bash
# Builds the runtime image of the Dockerfile with the local engine, from a binary built here:
#   scripts/image.sh BINARY TAG          the shipped image: BINARY must not carry the attack probe
#   scripts/image.sh BINARY TAG --probe  a test-only image: BINARY must carry it
#   scripts/image.sh --stages            only the base and the stages that need no binary (the
#                                        ffmpeg build, the runtime packages), into the engine's
#                                        cache: `make image` runs it beside the release build
#   scripts/image.sh --archive           prints the Debian archive's state as the build reads it
#                                        (SNAPSHOT FFMPEG_VERSION, see below)
# The base `debian:12-slim` of the packages stage is made once per machine with debootstrap
# (Docker Hub is not reachable here) and imported under the tag the Dockerfile names; that stage
# installs the runtime packages from Debian as it does anywhere, and the image keeps only what
# the worker runs (scripts/image-root.sh). The binary (Debian 12 here too) goes in stripped,
# through the Dockerfile's `prebuilt` stage; `docker build .` elsewhere compiles it. The image
# is labelled with the binary's build profile (target/PROFILE/) and source revision, and checked
# (scripts/check-image-libs.py) to hold every library its programs need.
# Security updates: before each build, apt (in a container of the base, with the image's
# sources) reads the archive's state: its snapshot, the time of the latest publication of
# bookworm, bookworm-updates and bookworm-security (the newest Date of their Release files, in
# snapshot.debian.org's notation), and the version of Debian's ffmpeg source. The snapshot is
# the runtime packages stage's cache key (it upgrades every package, the base's too) and the
# image's label `media-worker.debian-snapshot`; the ffmpeg version is the ffmpeg stage's (built
# again when Debian ships a new one). So the engine's cache and a base made long ago never keep
# a build from the archive's current packages.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=$1 tag=${2:-} probe=${3:-}
# Debian's client of the engine setup.sh installs: it builds with BuildKit itself (a newer client
# elsewhere on PATH may need the buildx plugin for that).
docker=${DOCKER:-/usr/bin/docker}
marker=MEDIA-WORKER-ATTACK-PROBE

if ! $docker image inspect debian:12-slim >/dev/null 2>&1; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  echo "image: debian:12-slim from debootstrap --variant=minbase bookworm (about 40 s)"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
  # As Debian's own slim image: later installs leave out documentation, man pages and
  # translations; the updates and security suites are in the sources; no package lists kept.
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
EOF
  cat >"$root/etc/apt/sources.list" <<'EOF'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  find "$root/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
  rm -rf "$root"/usr/share/{man,info,locale}/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
  tar -C "$root" --numeric-owner -c . | $docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - debian:12-slim >/dev/null
fi

archive() {
  $docker run --rm --network host debian:12-slim bash -c '
    sed -i "s/^deb /deb-src /" /etc/apt/sources.list
    apt-get update -qq >/dev/null
    for f in /var/lib/apt/lists/*Release; do sed -n "s/^Date: //p" "$f"; done |
      while read -r d; do date -u -d "$d" +%Y%m%dT%H%M%SZ; done | sort | tail -1
    apt-cache showsrc --only-source ffmpeg | sed -n "s/^Version: //p" | sort -V | tail -1' |
    paste -sd' '
}
if [ "$binary" = --archive ]; then archive; exit 0; fi
read -r snapshot ffmpeg_version <<<"$(archive)"
if [ -z "$ffmpeg_version" ]; then echo "image: cannot read the archive's state with apt"; exit 1; fi
archive_args=(--build-arg "DEBIAN_SNAPSHOT=$snapshot" --build-arg "FFMPEG_VERSION=$ffmpeg_version")

if [ "$binary" = --stages ]; then
  DOCKER_BUILDKIT=1 $docker build --quiet --network host "${archive_args[@]}" --target packages . \
    >/dev/null
  echo "image: stages built (Debian as of $snapshot, ffmpeg $ffmpeg_version)"
  exit 0
fi

if grep -q "$marker" "$binary"; then has_probe=yes; else has_probe=no; fi
if [ "$probe" = --probe ] && [ $has_probe = no ]; then
  echo "image: $binary has no attack probe (build it with --features attack-probe)"; exit 1
fi
if [ "$probe" != --probe ] && [ $has_probe = yes ]; then
  echo "image: $binary carries the attack probe: it may not ship"; exit 1
fi
# The profile from cargo's output directory; the revision as build.rs records it.
profile=$(basename "$(dirname "$(realpath "$binary")")")
revision=${MEDIA_WORKER_REVISION:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
mkdir -p target/image
strip -o target/image/media-worker "$binary"
old=$($docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
# The binary's label lets the tests check that an image holds the binary they were built with.
DOCKER_BUILDKIT=1 $docker build --quiet --network host --build-arg BINARY=prebuilt \
  "${archive_args[@]}" --label "media-worker.debian-snapshot=$snapshot" \
  --label "media-worker.binary-sha256=$(sha256sum <"$binary" | cut -d' ' -f1)" \
  --label "media-worker.profile=$profile" \
  --label "media-worker.revision=$revision" \
  --label "org.opencontainers.image.revision=$revision" \
  -t "$tag" . >/dev/null
if [ "$probe" != --probe ]; then
  cid=$($docker create "$tag")
  found=$($docker cp "$cid":/usr/local/bin/media-worker - | grep -c "$marker" || true)
  $docker rm "$cid" >/dev/null
  if [ "$found" != 0 ]; then echo "image: $tag carries the attack probe"; exit 1; fi
fi
python3 scripts/check-image-libs.py "$tag"
# The image this one replaces (a binary layer of tens of MB each build), unless still in use.
if [ -n "$old" ] && [ "$old" != "$($docker image inspect -f '{{.Id}}' "$tag")" ]; then
  $docker image rm "$old" >/dev/null 2>&1 || true
fi
echo "image: $tag ($profile build, revision $revision, Debian as of $snapshot)," \
  "$(($($docker image inspect -f '{{.Size}}' "$tag") / 1000000)) MB"
