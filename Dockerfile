# Build: Debian 12 with the -dev packages. Runtime: debian:12-slim with runtime libraries only.
# `docker build .` compiles in the build stage. `make image` builds the same runtime stage
# with BINARY=prebuilt: the binary built on the host (Debian 12 too), from target/image/.
# (No `# syntax=` line: the engine's own Dockerfile frontend needs no registry.)
ARG BINARY=build

FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      pkg-config libssl-dev clang libclang-dev libvips-dev libopencv-dev cmake g++ \
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

FROM debian:12-slim
# libvips42 brings its loaders (jpeg, png, webp, gif, tiff, heif); the OpenCV runtime
# libraries are the modules we link (contrib for img_hash); opencv-data has the cascades; tini
# reaps ffmpeg children and forwards SIGTERM. `make test` checks with ldd that this list covers
# every library the binary links (scripts/check-image-libs.py).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libvips42 libopencv-core406 libopencv-imgproc406 libopencv-objdetect406 \
      libopencv-contrib406 libssl3 ffmpeg opencv-data ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin media
COPY --from=binary /src/target/release/media-worker /usr/local/bin/media-worker
COPY config/default.toml /etc/media-worker/default.toml
USER 10001:10001
# Two malloc arenas: measured 364 -> 222 MB peak RSS at equal throughput (make bench).
# TMPDIR: libraries' temporary files go to the scratch volume (the root filesystem is
# read-only in the pod).
ENV TMP_DIR=/scratch \
    TMPDIR=/scratch \
    HTTP_ADDR=0.0.0.0:8080 \
    RUST_LOG=info \
    MALLOC_ARENA_MAX=2
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/media-worker"]
CMD ["run"]
