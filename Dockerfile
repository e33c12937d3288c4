# Build: Debian 12 with the -dev packages. Runtime: the worker, ffmpeg, ffprobe and tini with the
# libraries they load and the data they read, on no base (docs/operations.md, "The image").
# `docker build .` compiles in the build stage. `make image` builds the same runtime with
# BINARY=prebuilt: the release binary built on the host (Debian 12 too), from target/image/.
# (No `# syntax=` line: the engine's own Dockerfile frontend needs no registry.)
ARG BINARY=build

FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      pkg-config libssl-dev libzstd-dev clang libclang-dev libvips-dev libopencv-dev cmake g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The source revision for media_worker_build_info (no .git in the build context):
#   docker build --build-arg MEDIA_WORKER_REVISION=$(git rev-parse --short=12 HEAD) .
ARG MEDIA_WORKER_REVISION=unknown
ENV MEDIA_WORKER_REVISION=${MEDIA_WORKER_REVISION}
COPY Cargo.toml Cargo.lock build.rs ./
COPY config ./config
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin media-worker \
 && strip target/release/media-worker

FROM scratch AS prebuilt
COPY target/image/media-worker /src/target/release/media-worker

# hadolint ignore=DL3006
FROM ${BINARY} AS binary

# ffmpeg and ffprobe from Debian 12's own source (its patches, its security updates), with the
# components the worker uses and the inputs it takes, and nothing else: Debian's build links
# about 200 libraries (libavdevice's back-ends, flite voices, codec2, libplacebo, x265, SVT-AV1,
# ...) that all load with it and none of which a job uses (docs/operations.md, "The image").
# The components are config/ffmpeg-components' (scripts/ffmpeg-configure.sh): each accepted
# container's demuxer, the decoders and parsers of the codecs it may carry, what the worker's
# runs use. Static libav*: one file each, linked to Debian's x264, dav1d, libwebp and zimg (not
# libxml2: no DASH demuxer, the worker reads no manifest). About 4 minutes on 2 cores, cached by
# the engine with the stage until FFMPEG_VERSION (Debian's source version, which
# scripts/image.sh reads with apt) or the list changes. tests/container.rs asks the image's
# ffmpeg for every listed component and has it answer a file of each accepted codec as the
# host's ffmpeg does.
FROM debian:12-slim AS ffmpeg
ARG FFMPEG_VERSION=
WORKDIR /build
RUN printf 'deb-src http://deb.debian.org/debian %s main\n' bookworm bookworm-updates \
      > /etc/apt/sources.list.d/bookworm-src.list \
 && echo 'deb-src http://deb.debian.org/debian-security bookworm-security main' \
      >> /etc/apt/sources.list.d/bookworm-src.list \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      dpkg-dev gcc make nasm pkg-config libx264-dev libdav1d-dev libwebp-dev libzimg-dev \
      zlib1g-dev \
 && apt-get source --only-source "ffmpeg${FFMPEG_VERSION:+=$FFMPEG_VERSION}" \
 && mv ffmpeg-*/ src \
 && rm -rf /var/lib/apt/lists/*
COPY config/ffmpeg-components scripts/ffmpeg-configure.sh /build/
WORKDIR /build/src
# $components is split on purpose: one ./configure flag per word.
# hadolint ignore=SC2086
RUN components=$(../ffmpeg-configure.sh ../ffmpeg-components) \
 && ./configure --prefix=/usr/local --disable-everything --disable-autodetect \
      --disable-doc --disable-debug --disable-ffplay --disable-avdevice --disable-postproc \
      --disable-network --disable-shared --enable-static --enable-gpl --enable-pthreads \
      --enable-zlib --enable-libx264 --enable-libdav1d --enable-libwebp \
      --enable-libzimg $components \
 && make -j"$(nproc)" \
 && make install \
 && mkdir -p /usr/local/share/doc/ffmpeg \
 && cp debian/copyright /usr/local/share/doc/ffmpeg/copyright \
 && { echo 'Package: ffmpeg'; echo 'Source: ffmpeg'; \
      echo "Version: $(dpkg-parsechangelog -S Version)"; \
      echo "Architecture: $(dpkg --print-architecture)"; \
      echo 'Maintainer: Debian Multimedia Maintainers <debian-multimedia@lists.debian.org>'; \
      echo 'Description: ffmpeg and ffprobe built from this Debian source package by the'; \
      echo ' media-worker Dockerfile with the components the worker uses (static libav*)'; \
    } > /usr/local/share/doc/ffmpeg/status

# The runtime packages as Debian ships them, from which the closure stage takes what runs:
# libvips42 (its loaders and the vips-heif module), the OpenCV modules the binary links (contrib
# for img_hash), opencv-data (the cascades), tini (reaps ffmpeg children and forwards SIGTERM),
# and the libraries the ffmpeg stage's programs link (copied in beside them). Most of what they
# pull in (OpenCV's optional stack: Qt, Mesa, GDAL, ...) never reaches the image. Every package
# at Debian's current version, the base's too (`upgrade`): DEBIAN_SNAPSHOT, the time of the
# archive's latest publication (scripts/image.sh reads it with apt, and labels the image with
# it), is this stage's cache key, so that a build after a security update takes it.
FROM debian:12-slim AS packages
ARG DEBIAN_SNAPSHOT=
RUN echo "Debian as of ${DEBIAN_SNAPSHOT:-now}" \
 && apt-get update \
 && apt-get upgrade -y --no-install-recommends \
 && apt-get install -y --no-install-recommends \
      libvips42 libopencv-core406 libopencv-imgproc406 libopencv-objdetect406 \
      libopencv-contrib406 libssl3 opencv-data ca-certificates tini \
      libx264-164 libdav1d6 libwebp7 libzimg2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=ffmpeg /usr/local/bin/ffmpeg /usr/local/bin/ffprobe /usr/bin/
COPY --from=ffmpeg /usr/local/share/doc/ffmpeg /usr/share/doc/ffmpeg

FROM packages AS closure
COPY --from=binary /src/target/release/media-worker /usr/local/bin/media-worker
COPY config/default.toml /etc/media-worker/default.toml
COPY scripts/image-root.sh /usr/local/sbin/image-root
RUN image-root /rootfs

FROM scratch
COPY --from=closure /rootfs /
USER 10001:10001
# Two malloc arenas: measured 364 -> 222 MB peak RSS at equal throughput (make bench).
# TMPDIR: libraries' temporary files go to the scratch volume (the root filesystem is
# read-only in the pod).
ENV PATH=/usr/local/bin:/usr/bin \
    TMP_DIR=/scratch \
    TMPDIR=/scratch \
    HTTP_ADDR=0.0.0.0:8080 \
    RUST_LOG=info \
    MALLOC_ARENA_MAX=2
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/media-worker"]
CMD ["run"]
