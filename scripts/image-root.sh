#!/usr/bin/env bash
# Builds the runtime image's root filesystem in ROOT, in the Dockerfile's `closure` stage (a
# Debian 12 with the runtime packages installed): the programs the worker runs, the shared
# libraries they load and nothing else, as Google's distroless images do.
#
#   scripts/image-root.sh ROOT
#
# - Programs: /usr/local/bin/media-worker, ffmpeg and ffprobe (which a job process runs), tini.
# - Their libraries: what the dynamic loader maps for each (ldd: the NEEDED closure), and what is
#   loaded by name at run time (strace of every profile's jobs over the corpus): the one module
#   of libvips' the worker uses (vips-heif: HEIF/AVIF; the others hold only loaders the worker
#   blocks: JPEG XL, ImageMagick, OpenSlide, PDF) and TBB's allocator (libtbb, which OpenCV links,
#   loads it at start). OpenCV also tries libOpenCL.so, absent in Debian's runtime packages as
#   here: no OpenCL. tests/container.rs lists the libraries mapped under every profile's jobs in
#   the container and compares them with the image's.
# - Data they read: the two default face cascades (config/default.toml), the CA certificates,
#   OpenSSL's configuration, an /etc/passwd and /etc/group with the pod's user, nsswitch.conf,
#   and a loader cache made for this tree (ldconfig -r).
# - For scanners and the SBOM (scripts/sbom.py): each Debian package a file came from, its
#   status stanza in /var/lib/dpkg/status.d/ (distroless' layout, which Trivy, Grype and Syft
#   read) and its copyright file. No dpkg, apt or shell: ROOT has nothing that runs a package
#   manager or a command line.
# Fails when a program needs a library that is not installed (ldd's "not found").
set -euo pipefail
root=$1
libdir=$(echo /usr/lib/*-linux-gnu)

programs=(/usr/local/bin/media-worker /usr/bin/ffmpeg /usr/bin/ffprobe /usr/bin/tini)
modules=("$libdir"/vips-modules-*/vips-heif.so "$libdir"/libtbbmalloc.so.2)
cascades=$(grep -o '"/usr/share/opencv4/[^"]*"' /etc/media-worker/default.toml | tr -d '"')
data=(
  $cascades
  /etc/ssl/certs/ca-certificates.crt /usr/lib/ssl/cert.pem
  /usr/lib/ssl/openssl.cnf /etc/ssl/openssl.cnf
  /etc/ld.so.conf /etc/ld.so.conf.d
  /etc/media-worker/default.toml
)

# Debian 12 merges /usr: /bin, /lib, /lib64 and /sbin are links into /usr, as in the root here.
mkdir -p "$root"/usr/{bin,sbin,lib,lib64} "$root"/etc "$root"/tmp
for top in /bin /sbin /lib /lib64; do
  if [ -L $top ]; then cp -a $top "$root"/; fi
done

# A path (and every link on the way to the file it names) into ROOT.
copied=()
copy() {
  local p=$1
  while :; do
    cp -a --parents "$p" "$root"
    copied+=("$p")
    [ -L "$p" ] || break
    local t
    t=$(readlink "$p")
    case $t in /*) p=$t ;; *) p=$(dirname "$p")/$t ;; esac
  done
}

libs=()
for elf in "${programs[@]}" "${modules[@]}"; do
  [ -e "$elf" ] || { echo "image-root: $elf is missing"; exit 1; }
  out=$(ldd "$elf")
  if grep -q 'not found' <<<"$out"; then
    echo "image-root: $elf needs libraries that are not installed:"; grep 'not found' <<<"$out"; exit 1
  fi
  copy "$elf"
  # The loader (its own line has no "=>") and each resolved library.
  libs+=($(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }' <<<"$out"))
done
for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do copy "$lib"; done
for d in "${data[@]}"; do copy "$d"; done

# The pod's user (runAsUser 10001) and nobody (a root worker's job processes); no shell.
cat >"$root"/etc/passwd <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
media:x:10001:10001:media-worker:/nonexistent:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat >"$root"/etc/group <<'EOF'
root:x:0:
media:x:10001:
nogroup:x:65534:
EOF
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root"/etc/nsswitch.conf
# OpenSSL's certificate directory holds the bundle alone (not the links to every CA's file).
ln -s /etc/ssl/certs "$root"/usr/lib/ssl/certs
chmod 1777 "$root"/tmp
ldconfig -r "$root"

# The packages the files came from (dpkg records some under /lib, some under /usr/lib).
paths=()
for p in "${copied[@]}"; do
  [ -f "$p" ] && [ ! -L "$p" ] || continue
  paths+=("$p")
  case $p in /usr/*) paths+=("${p#/usr}") ;; *) paths+=("/usr$p") ;; esac
done
mkdir -p "$root"/var/lib/dpkg/status.d
for pkg in $(dpkg -S "${paths[@]}" 2>/dev/null | cut -d: -f1 | tr ',' '\n' | tr -d ' ' | sort -u); do
  dpkg-query -s "$pkg" | grep -v '^Status:' >"$root/var/lib/dpkg/status.d/$pkg"
  name=${pkg%%:*}
  if [ -f "/usr/share/doc/$name/copyright" ]; then copy "/usr/share/doc/$name/copyright"; fi
done
# ffmpeg and ffprobe, built from Debian's source package in the Dockerfile's ffmpeg stage: the
# stanza and copyright file that stage wrote for them.
if [ -f /usr/share/doc/ffmpeg/status ] && ! dpkg -S /usr/bin/ffmpeg >/dev/null 2>&1; then
  cp /usr/share/doc/ffmpeg/status "$root"/var/lib/dpkg/status.d/ffmpeg
  copy /usr/share/doc/ffmpeg/copyright
fi
# Files no package owns: the worker, its configuration, and what this script wrote.
echo "image-root: $(find "$root" -type f | wc -l) files, $(du -sm "$root" | cut -f1) MB," \
  "$(ls "$root"/var/lib/dpkg/status.d | wc -l) Debian packages"
