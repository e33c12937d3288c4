# Build: Debian 12 with the -dev packages. Runtime: the worker, ffmpeg, ffprobe and tini with the
# libraries they load and the data they read, on no base (docs/operations.md, "The image").
# `docker build .` compiles in the build stage. `make image` builds the same runtime with
# BINARY=prebuilt: the release binary built on the host (Debian 12 too), from target/image/.
# (No `# syntax=` line: the engine's own Dockerfile frontend needs no registry.)
ARG BINARY=build

FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      pkg-config libssl-dev clang libclang-dev libvips-dev libopencv-dev \
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

# The runtime packages as Debian ships them, from which the closure stage takes what runs:
# libvips42 (its loaders and the vips-heif module), the OpenCV modules the binary links (contrib
# for img_hash), opencv-data (the cascades), ffmpeg, tini (reaps ffmpeg children and forwards
# SIGTERM). Most of what they pull in (OpenCV's and ffmpeg's optional stacks: Qt, Mesa, GDAL,
# flite voices' data, ...) never reaches the image.
FROM debian:12-slim AS packages
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libvips42 libopencv-core406 libopencv-imgproc406 libopencv-objdetect406 \
      libopencv-contrib406 libssl3 ffmpeg opencv-data ca-certificates tini \
 && rm -rf /var/lib/apt/lists/*

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
